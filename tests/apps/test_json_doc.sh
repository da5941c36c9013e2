#!/bin/sh
# docs/JSON.md against the records the apps really write: tests/ref/json_doc.py compares every
# record table's documented keys with the keys of real records (distlab-train's config, step,
# summary and --eval-only summary; distlab-lecture's figure and summary), both ways.
# To document a new field, add its row to JSON.md; if it appears only in a configuration that
# RUNS below lacks, add that configuration here. Negative controls: a JSON.md with a row
# removed, and a record with an undocumented key, must both fail the comparison.
# Skipped (77) without python3. Run by `make check` from the build directory.
# $TINY and the RUNS lines are option lists, split into words on purpose.
# shellcheck disable=SC2086

PY=$(command -v python3) || { echo "test_json_doc: SKIPPED: no python3"; exit 77; }
B=${abs_top_builddir:-.}/apps
SRC=${srcdir:-$(dirname "$0")/../..}
DOC=$SRC/docs/JSON.md
for a in distlab-train distlab-lecture; do
  [ -x "$B/$a" ] || { echo "test_json_doc: $B/$a not found (run from the build directory)"; exit 1; }
done
SELF=test_json_doc
. "$SRC/tests/apps/lib.sh"

TINY="--layers 2 --d-model 32 --heads 4 --seq 16 --micro-batch 2 --log-every 0 --eval-windows 2"
# the training runs: every field of config, step and summary must occur in one of them
RUNS="--dp 2 --steps 3 --check
--dp 2 --zero 2 --dtype bf16 --steps 2
--dp 1 --tp 2 --steps 2 --dtype f64 --tie-embeddings --recompute full
--pp 2 --microbatches 2 --schedule 1f1b --steps 2
--pp 2 --microbatches 2 --schedule async --weight-stashing --steps 2
--pp 2 --microbatches 2 --token-chunks auto --steps 2
--dp 2 --ep 2 --experts 4 --top-k 2 --steps 2
--dp 2 --zero 1 --steps 2 --ckpt-dir $TMP/ck --save-every 1"
args=
n=0
echo "$RUNS" | while IFS= read -r run; do
  n=$((n + 1))
  OPENBLAS_NUM_THREADS=1 "$B/distlab-train" $TINY $run --json "$TMP/train$n.jsonl" >"$TMP/out" 2>&1 ||
    { echo "FAIL: distlab-train $run: exit $?"; tail -5 "$TMP/out"; echo x >> "$TMP/failed"; }
done
[ -f "$TMP/failed" ] && fails=$((fails + $(wc -l <"$TMP/failed")))
for f in "$TMP"/train*.jsonl; do args="$args train=$f"; done
OPENBLAS_NUM_THREADS=1 "$B/distlab-train" $TINY --dp 1 --steps 1 --save "$TMP/m.st" >/dev/null 2>&1 &&
  OPENBLAS_NUM_THREADS=1 "$B/distlab-train" $TINY --tp 2 --load "$TMP/m.st" --eval-only \
    --json "$TMP/eval.jsonl" >/dev/null 2>&1 || fail "the --eval-only run"
"$B/distlab-lecture" all --json >"$TMP/lecture.jsonl" 2>"$TMP/err" || fail "distlab-lecture all --json"

if "$PY" "$SRC/tests/ref/json_doc.py" "$DOC" $args eval="$TMP/eval.jsonl" lecture="$TMP/lecture.jsonl"; then
  echo "ok: JSON.md matches the records"
else
  fail "JSON.md and the records differ (above)"
fi

# JSON.md says numbers are written with 17 significant digits: some loss must have more than 10
grep -q '"loss":[0-9]\.[0-9]\{11,\}' "$TMP/train1.jsonl" ||
  fail "no step loss with more than 10 significant digits (JSON.md says 17)"

# negative controls: one documented row gone, one undocumented key added
grep -v '^| `grad_norm` ' "$DOC" > "$TMP/JSON-less.md"
"$PY" "$SRC/tests/ref/json_doc.py" "$TMP/JSON-less.md" $args eval="$TMP/eval.jsonl" \
  lecture="$TMP/lecture.jsonl" >"$TMP/neg1" 2>&1 && fail "negative control: a JSON.md without grad_norm passed"
grep -q "grad_norm" "$TMP/neg1" || fail "negative control 1 did not name grad_norm: $(cat "$TMP/neg1")"
sed 's/"type":"figure",/"type":"figure","undocumented_key":1,/' "$TMP/lecture.jsonl" > "$TMP/lecture-more.jsonl"
"$PY" "$SRC/tests/ref/json_doc.py" "$DOC" $args eval="$TMP/eval.jsonl" \
  lecture="$TMP/lecture-more.jsonl" >"$TMP/neg2" 2>&1 && fail "negative control: an undocumented key passed"
grep -q "undocumented_key" "$TMP/neg2" || fail "negative control 2 did not name the key: $(cat "$TMP/neg2")"

finish
