#!/bin/sh
# Command-line contract of distlab-train (issue 3): --version and --help; every refused
# configuration exits 2 with ONE line on stderr naming the problem, before any thread starts
# (nothing on stdout); a tiny run exits 0 and its JSON Lines (docs/JSON.md) parse with the right
# record types; --save then --load under another layout with --eval-only reproduces the saving
# run's validation loss; --check reports small differences from one rank.
# Run by `make check` from the build directory (the binary is ./apps/distlab-train).
# DISTLAB_TEST_SCALE=small: fewer layouts (sanitizer builds).
# $M, $TINY and $lay are option lists, split into words on purpose.
# shellcheck disable=SC2086

SELF=test_train_cli
. "$(dirname "$0")/lib.sh"
TRAIN=$(app_bin distlab-train) || exit 1
APP=$TRAIN
SMALL=0
[ "${DISTLAB_TEST_SCALE:-}" = small ] && SMALL=1
PY=
if command -v python3 >/dev/null 2>&1; then PY=python3; fi

# refused NAME PATTERN ARGS... (lib.sh's): status 2, exactly one line on stderr that matches
# PATTERN (a grep -E regular expression) and starts "distlab-train: ", nothing on stdout (no
# thread started, no banner)
REFUSED_PREFIX='distlab-train: '


# ---- version and help ----
if run version 0 --version; then
  grep -q '^distlab-train (distlab) [0-9]' "$TMP/out" || fail "version: $(cat "$TMP/out")"
fi
run version-short 0 -V
if run help 0 --help; then
  has help "Usage: distlab-train"
  for f in --dp --tp --layers --d-model --heads --seq --tie-embeddings --dtype --recompute \
           --global-batch --micro-batch --microbatches --steps --lr --warmup --seed --bucket-mb \
           --overlap --algo --data --eval-every --eval-windows --log-every --json --check \
           --sample --save --dump-grads --load --eval-only --gpu-mem --timeout --zero --pp \
           --schedule --token-chunks --virtual-stages --weight-stashing --layer-costs --trace --timeline --trace-steps --quiet --plot --prompt --temperature; do
    grep -qE -- "^ +$f( |$)" "$TMP/out" || fail "--help does not document $f"
  done
  has help "Exit status"
  has help "needs --dp 2 or more"
  [ -s "$TMP/err" ] && fail "help: wrote to stderr"
fi
run help-short 0 -h

# ---- refused configurations: exit 2, one line ----
M="--layers 1 --d-model 32 --heads 4 --seq 16 --steps 1 --log-every 0"
# heads not divisible by tp, with what fits
refused "heads % tp" 'heads 4.*not divisible by tp 3.*tp 2 fits' $M --dp 1 --tp 3
refused "d-model % heads" 'd-model 32.*not divisible by heads 3' --layers 1 --d-model 32 --heads 3 --dp 1
# batch sizes (dp x tp always equals the rank count here: the app derives the world from them)
refused "global batch % dp" 'global batch 7 is not divisible by dp 2.*--global-batch 8' \
  $M --dp 2 --global-batch 7
refused "global batch % (dp x micro-batch)" \
  'global batch 8 is not divisible by dp 2 x micro-batch 3.*--global-batch 12' \
  $M --dp 2 --global-batch 8 --micro-batch 3
refused "global batch % (dp x microbatches)" \
  'global batch 6 is not divisible by dp 2 x microbatches 2.*--global-batch 8' \
  $M --dp 2 --global-batch 6 --microbatches 2
refused "three batch sizes disagree" 'global batch 8 != dp 2 x microbatches 3 x micro-batch 2' \
  $M --dp 2 --global-batch 8 --micro-batch 2 --microbatches 3
# data files
refused "missing data file" "--data: cannot read '$TMP/nonexistent'" $M --dp 1 --data "$TMP/nonexistent"
: >"$TMP/empty.bin"
refused "empty data file" "'$TMP/empty.bin' is empty; need at least 34 bytes" $M --dp 1 --data "$TMP/empty.bin"
printf '%050d' 0 >"$TMP/short.bin"
refused "data file too short" "'$TMP/short.bin' has 50 bytes; need at least [0-9]+" \
  $M --dp 1 --seq 32 --data "$TMP/short.bin"
refused "data is a directory" "'$TMP' is a directory" $M --dp 1 --data "$TMP"
# zero or negative sizes
refused "--layers 0" '--layers: 0 is out of range' $M --dp 1 --layers 0
refused "--d-model -1" '--d-model: -1 is out of range' $M --dp 1 --d-model -1
refused "--heads 0" '--heads: 0 is out of range' $M --dp 1 --heads 0
refused "--seq 0" '--seq: 0 is out of range' $M --dp 1 --seq 0
refused "--steps 0" '--steps: 0 is out of range' $M --dp 1 --steps 0
refused "--steps -3" '--steps: -3 is out of range' $M --dp 1 --steps -3
refused "--dp 0" '--dp: 0 is out of range' $M --dp 0
refused "--tp -2" '--tp: -2 is out of range' $M --dp 1 --tp -2
refused "--micro-batch 0" '--micro-batch: 0 is out of range' $M --dp 1 --micro-batch 0
refused "--global-batch -4" '--global-batch: -4 is out of range' $M --dp 1 --global-batch -4
refused "--microbatches 0" '--microbatches: 0 is out of range' $M --dp 1 --microbatches 0
refused "--layers abc" '--layers' $M --dp 1 --layers abc
# other options
refused "--eval-only without --load" '--eval-only needs --load' $M --dp 1 --eval-only
refused "--load missing file" "--load: cannot read '$TMP/none.st'" $M --dp 1 --load "$TMP/none.st"
refused "--dtype f16" "--dtype: 'f16' is not f32, f64 or bf16" $M --dp 1 --dtype f16
refused "--zero 4" '--zero: 4 is out of range \[0, 3\]' $M --dp 2 --zero 4
refused "--zero -1" '--zero: -1 is out of range' $M --dp 2 --zero -1
refused "--recompute some" "--recompute: 'some' is not none or full" $M --dp 1 --recompute some
refused "--json unwritable" "--json: cannot write '$TMP/no/dir.json'" $M --dp 1 --json "$TMP/no/dir.json"
refused "unknown option" "unknown option.*--bogus" $M --dp 1 --bogus
refused "unknown short option" "unknown option '-x'" $M --dp 1 -x
# did you mean: the nearest option by edit distance; a prefix of several; a missing value
refused "did you mean" "unknown option '--micro-batches' \\(did you mean '--microbatches'\\?" \
  $M --dp 1 --micro-batches 4
refused "ambiguous prefix" "ambiguous option '--micro' \\(--micro-batch, --microbatches" \
  $M --dp 1 --micro 4
refused "missing value" "option '--dp' needs a value" $M --dp
refused "value of a flag" "option '--check' takes no value" $M --dp 1 --check=1
# an option without effect is refused, as --help says: --zero with dp 1 (its --help line says so)
refused "zero with dp 1" "--zero 3 needs data parallelism.*with dp 1 it has no effect" \
  $M --dp 1 --zero 3
refused "missing value alone" "option .--dp. needs a value" --dp
# the pipeline (issue 4): p larger than the layers, m < 1, interleaving that does not divide,
# an unknown schedule
refused "pp > layers" 'pp 5 is larger than the layers 4' $M --layers 4 --dp 1 --pp 5
refused "pp microbatches 0" '--microbatches: 0 is out of range' $M --layers 2 --dp 1 --pp 2 --microbatches 0
refused "interleaved layers % (pp x v)" 'layers 6 are not divisible by pp 2 x virtual stages 2' \
  $M --layers 6 --dp 1 --pp 2 --microbatches 2 --schedule interleaved --virtual-stages 2
refused "interleaved m % pp" 'micro-batches 3 must be a multiple of pp 2.*--microbatches 4' \
  $M --layers 4 --dp 1 --pp 2 --microbatches 3 --schedule interleaved
refused "unknown schedule" "--schedule: 'zigzag' is not gpipe, 1f1b, interleaved, async, naive, 1f1b-split, zb-h1, zb-h2, zb-v or dualpipev" \
  $M --layers 2 --dp 1 --pp 2 --schedule zigzag
refused "dualpipev m < 2 pp" 'the dualpipev schedule needs micro-batches >= 2 pp .pp 2: at least 4, got 3.' \
  $M --layers 4 --dp 1 --pp 2 --microbatches 3 --schedule dualpipev
refused "stashing without async" '--weight-stashing needs --schedule async' \
  $M --layers 2 --dp 1 --pp 2 --weight-stashing
refused "layer costs count" '--layer-costs: 2 costs for 4 layers' $M --layers 4 --dp 1 --pp 2 --layer-costs 1,2
# token-level pipelining (issue 34): equal slices dividing the sequence, a pipeline, a schedule
# that carries slices, no MoE layers; auto times slices, so a sequence of at least 4
refused "token chunks % seq" '--token-chunks 3 does not divide the sequence.s 16 tokens' \
  $M --layers 2 --dp 1 --pp 2 --token-chunks 3
refused "token chunks > seq" '--token-chunks 32 is more than the sequence.s 16 tokens' \
  $M --layers 2 --dp 1 --pp 2 --token-chunks 32
refused "token chunks without pp" '--token-chunks needs a pipeline' $M --dp 1 --token-chunks 2
refused "token chunks interleaved" '--token-chunks needs --schedule gpipe or 1f1b .interleaved' \
  $M --layers 4 --dp 1 --pp 2 --microbatches 2 --schedule interleaved --token-chunks 2
refused "token chunks zb-h1" '--token-chunks needs --schedule gpipe or 1f1b .zb-h1' \
  $M --layers 2 --dp 1 --pp 2 --microbatches 2 --schedule zb-h1 --token-chunks 2
refused "token chunks moe" '--token-chunks does not combine with MoE layers' \
  $M --layers 2 --dp 1 --pp 2 --experts 4 --token-chunks 2
refused "token chunks auto short seq" '--token-chunks auto needs --seq >= 4' \
  $M --layers 2 --dp 1 --pp 2 --seq 2 --token-chunks auto
refused "token chunks 0" '--token-chunks: 0 is out of range' $M --layers 2 --dp 1 --pp 2 --token-chunks 0
refused "stray argument" "unexpected argument 'extra'" $M --dp 1 extra

# ---- a tiny successful run and its JSON Lines ----
TINY="--layers 1 --d-model 32 --heads 4 --seq 16 --micro-batch 2"
if run tiny 0 --dp 2 $TINY --steps 3 --log-every 1 --eval-windows 16 --json "$TMP/run.jsonl" \
       --save "$TMP/m.st"; then
  has tiny "step     3/3"
  has tiny "== summary: 3 steps, 2 ranks (dp 2 x tp 1 x pp 1)"
  [ -s "$TMP/err" ] && fail "tiny: wrote to stderr: $(head -c 300 "$TMP/err")"
  [ -s "$TMP/m.st" ] || fail "tiny: --save wrote no file"
  n=$(wc -l <"$TMP/run.jsonl")
  [ "$n" -eq 5 ] || fail "tiny: $n JSON lines, want 5 (config, 3 steps, summary)"
  if [ -n "$PY" ]; then
    $PY - "$TMP/run.jsonl" <<'EOF' || fail "tiny: JSON Lines check failed"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
types = [r.get("type") for r in recs]
assert types == ["config", "step", "step", "step", "summary"], types
c = recs[0]
assert c["schema"] == "distlab/1" and c["app"] == "distlab-train", c
for k, v in (("dp", 2), ("tp", 1), ("pp", 1), ("schedule", "none"), ("virtual_stages", 1),
             ("weight_stashing", False), ("layers", 1), ("d_model", 32), ("heads", 4), ("seq", 16),
             ("vocab", 256), ("global_batch", 4), ("micro_batch", 2), ("microbatches", 1),
             ("steps", 3), ("dtype", "f32"), ("recompute", "none"), ("data", "synthetic"),
             ("tie_embeddings", False)):
    assert c[k] == v, (k, c[k], v)
for i, s in enumerate(recs[1:4]):
    assert s["step"] == i + 1, s
    for k in ("loss", "lr", "grad_norm", "ms", "tokens_per_s"):
        assert isinstance(s[k], (int, float)), (k, s)
    assert 0 < s["loss"] < 10, s
assert recs[1]["val_loss"] is None and recs[2]["val_loss"] is None
assert isinstance(recs[3]["val_loss"], float), recs[3]
m = recs[4]
for k in ("loss_floor", "final_loss", "final_val_loss", "tokens_per_s", "ms_per_step",
          "params", "grad_bytes_per_rank", "bytes_sent_per_rank_per_step",
          "peak_bytes_per_rank"):
    assert k in m, k
assert m["final_loss"] == recs[3]["loss"] and m["final_val_loss"] == recs[3]["val_loss"], m
assert abs(m["loss_floor"] - 1.75 * 0.6931471805599453) < 1e-8, m["loss_floor"]
assert m["params"] == 29664, m["params"]
b = m["bytes_sent_per_rank_per_step"]
assert set(b) == {"dp_grads", "tp_activations", "loss_and_norm", "dp_params"}, b
assert b["dp_grads"] == m["grad_bytes_per_rank"], b  # ring 2(d-1)/d = 1 at d = 2
assert b["dp_params"] == 0 and b["loss_and_norm"] == 8, b  # no ZeRO; one f64 loss per step
assert m["zero"] == {"stage": 0, "padded_elements": 29664, "padding": 0,
                     "shard_elements": 29664}, m["zero"]
p = m["peak_bytes_per_rank"]
assert [r["rank"] for r in p] == [0, 1], p
for r in p:
    assert set(r) == {"rank", "params", "grads", "optimizer", "activations", "comm", "other", "ckpt", "kvcache"}, r
    assert r["params"] == 4 * 29664, r
assert "check" not in m
EOF
  fi
fi

# ---- --save, then --load under other layouts with --eval-only: the same validation loss ----
val_of() { # the "final_val_loss" of the summary record in $1
  sed -n 's/.*"type":"summary".*"final_val_loss":\([^,}]*\).*/\1/p' "$1"
}
close() { # close A B: |A - B| <= 1e-6 |B|
  awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; m = b < 0 ? -b : b;
                                  exit !(a != "" && b != "" && d <= 1e-6 * m) }'
}
if [ -s "$TMP/m.st" ]; then
  ref=$(val_of "$TMP/run.jsonl")
  layouts="--dp 1 --tp 2 |--dp 1 "
  [ "$SMALL" -eq 1 ] || layouts="$layouts|--dp 2 --tp 2 |--dp 2 --micro-batch 3 "
  IFS='|'
  for lay in $layouts; do # the list splits at '|' once; the body splits at spaces
    unset IFS
    # shellcheck disable=SC2086
    if run "eval-only $lay" 0 $TINY $lay --eval-windows 16 --load "$TMP/m.st" --eval-only \
           --json "$TMP/ev.jsonl"; then
      has "eval-only $lay" "over 16 windows of 16 bytes"
      has "eval-only $lay" "wrote $TMP/ev.jsonl (JSON Lines"
      got=$(val_of "$TMP/ev.jsonl")
      grep -q '"eval_windows":16' "$TMP/ev.jsonl" || fail "eval-only $lay: eval_windows is not 16"
      if close "$got" "$ref"; then
        echo "ok: eval-only $lay: validation loss $got (saving run $ref)"
      else
        fail "eval-only $lay: validation loss $got, the saving run's $ref"
      fi
    fi
  done
fi

# --layer-costs measure: the first, a middle and the last layer timed here feed the partition
if run "layer costs measure" 0 --dp 1 --pp 2 --microbatches 2 --layers 3 --d-model 32 --heads 4 \
       --seq 16 --micro-batch 2 --steps 1 --log-every 0 --layer-costs measure; then
  grep -qE '^layer costs measured here: first layer \(with the embeddings\) [0-9.]+ ms, a middle layer [0-9.]+ ms, last layer' "$TMP/out" ||
    fail "layer costs measure: no measured line: $(grep -i 'layer costs' "$TMP/out")"
  has "layer costs measure" "layers per virtual stage:"
fi

# a pipeline saves the whole model (each stage its part; tied embeddings once): pp 2 saves,
# tp 2 and pp 2 x tp 2 load it and evaluate to the saving run's validation loss
PPM="--layers 2 --d-model 32 --heads 4 --seq 16 --micro-batch 2 --tie-embeddings"
if run "pp save" 0 --dp 1 --pp 2 --microbatches 2 $PPM --steps 2 --log-every 0 \
       --eval-windows 16 --json "$TMP/pp.jsonl" --save "$TMP/pp.st"; then
  ref=$(val_of "$TMP/pp.jsonl")
  has "pp save" "== summary: 2 steps, 2 ranks (dp 1 x tp 1 x pp 2; schedule gpipe)"
  grep -q '^{"type":"config",.*"dp":1,"tp":1,"pp":2,"schedule":"gpipe","virtual_stages":1,' \
    "$TMP/pp.jsonl" || fail "pp save: config record lacks pp 2 / gpipe: $(head -1 "$TMP/pp.jsonl")"
  for lay in "--dp 1 --tp 2" "--dp 1 --pp 2 --tp 2"; do
    # shellcheck disable=SC2086
    if run "pp eval-only $lay" 0 $PPM $lay --eval-windows 16 --load "$TMP/pp.st" --eval-only \
           --json "$TMP/ev.jsonl"; then
      got=$(val_of "$TMP/ev.jsonl")
      if close "$got" "$ref"; then
        echo "ok: pp eval-only $lay: validation loss $got (saving run $ref)"
      else
        fail "pp eval-only $lay: validation loss $got, the saving run's $ref"
      fi
    fi
  done
fi

# progress lines of a pipeline: the bytes include the hand-offs (at least the summary's, per step),
if run "pp progress" 0 --dp 1 --pp 2 --microbatches 4 --layers 2 --d-model 64 --heads 4 --seq 32 \
       --micro-batch 8 --steps 4 --log-every 2 --eval-windows 2; then
  ho=$(sed -n 's/.*hand-offs \([0-9.]*\) MiB sent by rank 0 per step.*/\1/p' "$TMP/out")
  mb=$(sed -n 's|^step     4/4 .* \([0-9.]*\) MiB sent/rank/step$|\1|p' "$TMP/out")
  awk -v h="$ho" -v m="$mb" 'BEGIN { exit !(h > 0.1 && m + 0.005 >= h) }' ||
    fail "pp progress: $mb MiB sent/rank/step on the progress line, hand-offs $ho MiB per step"
  # between evaluations the line shows the latest validation loss and its step
  grep -q '^step     2/4 .* | val    none yet   |' "$TMP/out" || fail "pp progress: no 'none yet'"
  grep -q '^step     4/4 .* | val [0-9.]* @    4 |' "$TMP/out" || fail "pp progress: no 'val ... @ 4'"
fi
# --sample as text: a corpus of newlines, near-greedy, prints newlines as newlines; the prompt
# quoted with its newline escaped; --temperature without --sample is refused
printf '%8192s' '' | tr ' ' '\n' >"$TMP/nl.txt"
if run "sample text" 0 --dp 1 $TINY --steps 40 --lr 1e-2 --log-every 0 --eval-windows 2 \
       --data "$TMP/nl.txt" --sample 8 --prompt 'a
b' --temperature 0.05; then
  has "sample text" 'sample (8 bytes at temperature 0.05, after the prompt "a\nb"):'
  n=$(sed -n '/^sample (8 bytes/,$p' "$TMP/out" | sed 1d | grep -c '^$')
  [ "$n" -eq 9 ] || fail "sample text: $n empty lines after the header, want 9 (8 newlines, then the end)"
fi
refused "temperature alone" "--temperature shapes the sample: it needs --sample N" $M --dp 1 \
  --temperature 0.5
# one line per file written; --plot: the loss curve's data (training, then validation losses), its
# script (the floor as a line), and the image when gnuplot is installed
if run "wrote" 0 --dp 2 $TINY --steps 4 --eval-every 2 --log-every 0 --eval-windows 2 \
       --save "$TMP/w.st" --trace "$TMP/w.json" --json "$TMP/w.jsonl" --plot "$TMP/loss.svg"; then
  for f in w.st w.json w.jsonl loss.svg; do
    [ "$(grep -c "^wrote $TMP/$f (" "$TMP/out")" -eq 1 ] || fail "wrote: no one line for $f"
  done
  awk 'BEGIN { b = 0 } /^$/ { blank++ } /^[0-9]/ { n[blank > 0]++ }
       END { exit !(n[0] == 4 && n[1] == 2) }' "$TMP/loss.dat" ||
    fail "plot: loss.dat is not 4 training and 2 validation losses: $(cat "$TMP/loss.dat")"
  grep -q "with lines dt 2 title \"the corpus's entropy rate" "$TMP/loss.gp" || fail "plot: no floor"
  if [ -x /usr/bin/gnuplot ]; then
    grep -q '<svg' "$TMP/loss.svg" || fail "plot: loss.svg is not an SVG"
  fi
fi
refused "plot extension" "--plot: FILE must end in .svg or .png" $M --dp 1 --plot "$TMP/loss.pdf"
# units and names: MiB in every heading of the memory table, each rank's (dp,tp,pp), ZeRO's shard
if run "mesh table" 0 --dp 2 --tp 2 --pp 2 --microbatches 2 $TINY --layers 2 --steps 1 \
       --log-every 0 --eval-windows 2 --zero 1; then
  has "mesh table" "  rank  (dp,tp,pp)      params MiB       grads MiB   optimizer MiB activations MiB"
  has_re "mesh table" '^     6  (1,0,1)  '
  has_re "mesh table" '^     1  (0,1,0)  '
  has_re "mesh table" 'per step dp gradients (reduce-scatter) [0-9.]* MiB'
  shard=$(sed -n 's/.*each rank holds a shard of \([0-9]*\) elements: .* is \([0-9]*\) (+[0-9]*) = 2 shards.*/\1 \2/p' "$TMP/out")
  echo "$shard" | awk 'NF == 2 && $1 * 2 == $2 { ok = 1 } END { exit !ok }' || fail "mesh table: ZeRO's shard: $(grep ZeRO "$TMP/out")"
  grep -q " MB\b" "$TMP/out" && fail "mesh table: MB (10^6) printed: $(grep ' MB' "$TMP/out")"
fi
# the out-of-memory message: MiB, with the category's use
if run "gpu-mem" 1 --dp 1 $TINY --steps 1 --log-every 0 --gpu-mem 64K; then
  grep -q "out of GPU memory allocating [0-9.]* MiB ([0-9]* bytes) of [a-z]*: capacity 0.062 MiB, in use [0-9.]* MiB ([a-z]* [0-9.]* MiB), left" "$TMP/err" ||
    fail "gpu-mem: $(cat "$TMP/err")"
fi
# tok/s and ms/step of a progress line are over the steps since the last line (rank 0's step
# times: on one rank the step records' own, from which they are recomputed here)
if run "progress smoothed" 0 --dp 1 $TINY --steps 4 --log-every 2 --eval-windows 2 \
       --json "$TMP/pg.jsonl"; then
  if [ -n "$PY" ]; then
    $PY - "$TMP/pg.jsonl" "$TMP/out" <<'EOF' || fail "progress smoothed: tok/s is not over the steps since the last line"
import json, re, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
c = recs[0]
ms = {r["step"]: r["ms"] for r in recs if r["type"] == "step"}
lines = {int(m.group(1)): (float(m.group(2)), float(m.group(3))) for m in
         re.finditer(r"^step +(\d+)/4 .*\| +(\d+) tok/s \| +([0-9.]+) ms/step", open(sys.argv[2]).read(), re.M)}
assert sorted(lines) == [1, 2, 4], lines
for step, last in ((2, 1), (4, 2)):
    tot = sum(ms[k] for k in range(last + 1, step + 1))
    want = c["global_batch"] * c["seq"] * (step - last) / (tot / 1e3)
    got, gms = lines[step]
    assert abs(got - want) <= 0.5 + 1e-3 * want, (step, got, want)
    assert abs(gms - tot / (step - last)) <= 0.05 + 1e-3 * gms, (step, gms, tot)
EOF
  fi
fi

# --trace-steps: only the window is traced, the timeline is its last step's; --quiet: no progress
refused "trace-steps backwards" '--trace-steps: 3:2 ends before it starts' $M --dp 1 --trace-steps 3:2 --timeline
refused "trace-steps alone" '--trace-steps needs --trace FILE or --timeline' $M --dp 1 --trace-steps 2
refused "trace-steps past the run" '--trace-steps: step 9 is past --steps 4' $M --dp 1 --steps 4 --trace-steps 9 --timeline
if run "trace-steps" 0 --dp 1 --pp 2 --microbatches 2 $TINY --layers 2 --steps 4 --log-every 0 \
       --eval-windows 2 --trace-steps 2:3 --trace "$TMP/win.json" --timeline; then
  has "trace-steps" "measured timeline of step 3: "
  if [ -n "$PY" ]; then
    $PY -c 'import json,sys; d=json.load(open(sys.argv[1])); s={e["args"]["step"] for e in d["traceEvents"] if e.get("ph") == "X"}; assert s == {2, 3}, s' \
      "$TMP/win.json" || fail "trace-steps: the trace holds steps other than 2 and 3"
  fi
fi
if run "check progress on stderr" 0 --dp 2 $TINY --steps 2 --log-every 1 --check; then
  grep -q '^step     2/2 ' "$TMP/err" || fail "check progress: the --check run's progress is not on stderr"
fi
if run "quiet" 0 --dp 2 $TINY --steps 2 --log-every 1 --check --quiet; then
  grep -q '^step ' "$TMP/out" "$TMP/err" && fail "quiet: progress lines printed"
  [ -s "$TMP/err" ] && fail "quiet: stderr not empty: $(head -c 200 "$TMP/err")"
fi

# every axis in use reaches the header and the config record: interleaved's virtual stages, ZeRO
if run "pp interleaved header" 0 --dp 2 --pp 2 --schedule interleaved --virtual-stages 2 \
       --microbatches 2 --layers 4 --d-model 32 --heads 4 --seq 16 --micro-batch 2 --steps 1 \
       --zero 1 --log-every 0 --eval-windows 4 --json "$TMP/il.jsonl"; then
  has "pp interleaved header" \
    "4 ranks (dp 2 x tp 1 x pp 2; schedule interleaved, 2 virtual stages; ZeRO 1)"
  grep -q '"pp":2,"schedule":"interleaved","virtual_stages":2,' "$TMP/il.jsonl" ||
    fail "pp interleaved header: config record: $(head -1 "$TMP/il.jsonl")"
fi

# ---- a data file: the window rule of docs (window i starts at byte i*seq of the split) ----
awk 'BEGIN { for (i = 0; i < 600; i++) printf "line %d: the quick brown fox %d\n", i, i * i % 97 }' \
  >"$TMP/corpus.txt"
n=$(wc -c <"$TMP/corpus.txt")
# val_len = max(seq + 1, floor(0.1 n)); windows = floor((val_len - 1) / seq)
nwin=$(awk -v n="$n" 'BEGIN { v = int(n * 0.1); if (v < 17) v = 17; print int((v - 1) / 16) }')
if run "data save" 0 --dp 2 $TINY --steps 2 --log-every 0 --data "$TMP/corpus.txt" \
       --eval-windows 0 --json "$TMP/d.jsonl" --save "$TMP/d.st"; then
  ref=$(val_of "$TMP/d.jsonl")
  if run "data eval-only" 0 --dp 1 --tp 2 $TINY --data "$TMP/corpus.txt" --eval-windows 0 \
         --load "$TMP/d.st" --eval-only --json "$TMP/dev.jsonl"; then
    has "data eval-only" "over $nwin windows of 16 bytes"
    grep -q "\"eval_windows\":$nwin}" "$TMP/dev.jsonl" ||
      fail "data eval-only: eval_windows is not $nwin: $(cat "$TMP/dev.jsonl")"
    got=$(val_of "$TMP/dev.jsonl")
    if close "$got" "$ref"; then
      echo "ok: data eval-only: $nwin windows, validation loss $got (saving run $ref)"
    else
      fail "data eval-only: validation loss $got, the saving run's $ref"
    fi
  fi
fi

# ---- --check: a verdict per compared quantity against the library's rounding bounds ----
# check_run NAME STATUS VERDICT ARGS...: the run's exit status, a verdict line for each compared
# quantity, the final "verdict: VERDICT" line and the JSON summary's verdict
check_run() {
  name=$1; want=$2; verdict=$3; shift 3
  if run "$name" "$want" "$@" --json "$TMP/chk.jsonl"; then
    grep -E '^  (losses|step 1) .* (PASS|FAIL) ' "$TMP/out" >/dev/null ||
      fail "$name: no verdict line per compared quantity"
    line=$(grep "^verdict: $verdict " "$TMP/out")
    [ -n "$line" ] || fail "$name: no 'verdict: $verdict' line: $(grep '^verdict' "$TMP/out")"
    echo "ok: $name: $line"
    grep -q "\"check\":{.*\"verdict\":\"$verdict\"}" "$TMP/chk.jsonl" ||
      fail "$name: the JSON summary lacks the check object with verdict $verdict"
  fi
}
check_run "check dp 2 f32" 0 PASS --dp 2 $TINY --steps 3 --log-every 0 --check
has "check dp 2 f32" "step 1 gradients     PASS"
has "check dp 2 f32" "final parameters     -"
# the negative control: the layout's first gradient reduction skipped (a test hook) fails
export DISTLAB_CHECK_TEST_SKIP=1
check_run "check dp 2, a reduction skipped" 1 FAIL --dp 2 $TINY --steps 2 --log-every 0 --check
unset DISTLAB_CHECK_TEST_SKIP
has "check dp 2, a reduction skipped" "step 1 gradients     FAIL"
# one step: the run itself is step 1
check_run "check dp 2 one step" 0 PASS --dp 2 $TINY --steps 1 --log-every 0 --check
has "check dp 2 one step" "step 1 parameters    PASS"
# async is not meant to equal one rank: said, and step 1's loss (one micro-batch) only
check_run "check async" 0 PASS --pp 2 --layers 2 --d-model 32 --heads 4 --seq 16 --micro-batch 2 \
  --microbatches 2 --schedule async --weight-stashing --steps 2 --log-every 0 --check
has "check async" "async (PipeDream) is not meant to equal one rank"
grep -q "step 1 gradients" "$TMP/out" && fail "check async: a gradient verdict"
# ZeRO: the same model as one rank; the summary names the stage, the padding and the shards
check_run "check dp 2 zero 2 f32" 0 PASS --dp 2 $TINY --steps 3 --log-every 0 --zero 2 --check
has "check dp 2 zero 2 f32" "ZeRO stage 2 over dp 2"
check_run "check dp 2 zero 3 f32" 0 PASS --dp 2 $TINY --steps 3 --log-every 0 --zero 3 --check
has "check dp 2 zero 3 f32" "ZeRO stage 3 over dp 2"
# bf16 mixed precision at stage 3: the model state per rank, measured
if run "bf16 zero 3" 0 --dp 2 $TINY --steps 2 --log-every 0 --zero 3 --dtype bf16 \
       --json "$TMP/bf.jsonl"; then
  has "bf16 zero 3" "model state per rank"
  has "bf16 zero 3" "8.00 bytes per parameter"
  if [ -n "$PY" ]; then
    $PY - "$TMP/bf.jsonl" <<'EOF' || fail "bf16 zero 3: JSON check failed"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
c, m = recs[0], recs[-1]
assert c["dtype"] == "bf16" and c["zero"] == 3, c
z = m["zero"]
assert z["stage"] == 3 and z["padded_elements"] == 29664, z
ms = m["model_state"]
assert ms["bytes_per_rank"] == 16 * 29664 // 2 and ms["bytes_per_param"] == 8.0, ms
assert ms["elements_sent_per_step"] == 3 * 29664 // 2, ms
assert all(s["skipped"] is False for s in recs[1:-1]), recs
EOF
  fi
fi
# the pipeline: stages, schedules, tied embeddings across stages; the trace opens as JSON
check_run "check pp 2 1f1b f64" 0 PASS --dp 1 --pp 2 --schedule 1f1b --microbatches 4 $TINY \
  --layers 2 --steps 2 --log-every 0 --dtype f64 --tie-embeddings --check --trace "$TMP/trace.json" --timeline
has "check pp 2 1f1b f64" "measured bubble per stage"
has "check pp 2 1f1b f64" "measured timeline of step 2: "
if [ -n "$PY" ]; then
  $PY -c 'import json,sys; d=json.load(open(sys.argv[1])); assert len(d["traceEvents"]) > 10' \
    "$TMP/trace.json" || fail "pp 2: the Chrome trace does not parse"
fi
# token slices (TeraPipe) in 1F1B's order with dp 2: the model one rank trains
check_run "check pp 2 token chunks 4 f64" 0 PASS --dp 2 --pp 2 --schedule 1f1b --token-chunks 4 \
  --microbatches 2 $TINY --layers 2 --steps 2 --log-every 0 --dtype f64 --check
has "check pp 2 token chunks 4 f64" "kvcache MiB"
# auto: the latency fit and TeraPipe's unequal slices (whichever the timings here choose)
check_run "check pp 2 token chunks auto f64" 0 PASS --dp 1 --pp 2 --token-chunks auto \
  --microbatches 2 $TINY --layers 2 --seq 32 --steps 2 --log-every 0 --dtype f64 --check
has "check pp 2 token chunks auto f64" "# token-chunks auto, 2 stages: "
# the JSON summary holds what the text prints: the slices (adding up to --seq) and the fit
if [ -s "$TMP/chk.jsonl" ] && command -v python3 >/dev/null; then
  python3 - "$TMP/chk.jsonl" <<'PY' || fail "token chunks auto: JSON lacks the slices or the fit"
import json, sys
s = [json.loads(l) for l in open(sys.argv[1])][-1]["pipeline"]
assert sum(s["token_lens"]) == 32 and len(s["token_lens"]) >= 1, s
f = s["token_fit"]
assert set(f) == {"a_s", "b_s_per_token", "c_s_per_token_pair", "rel_rms", "rel_max"}, f
assert 0 <= f["rel_rms"] <= f["rel_max"], f
PY
fi
# the timeline shows every action of every stage: pp 4 1F1B with 8 micro-batches, each stage's
# forwards 0-7 and backwards a-h in its grid row or (cells merged) in its list row; the legend
if run "timeline pp 4" 0 --dp 1 --pp 4 --schedule 1f1b --microbatches 8 $TINY --layers 4 \
       --steps 2 --log-every 0 --eval-windows 2 --timeline; then
  has "timeline pp 4" "legend: a digit is a forward of that micro-batch"
  sed -n '/^measured timeline/,/^peak memory/p' "$TMP/out" | awk '
    /^GPU / { print "a timeline row says GPU, not rank: " $0; bad = 1 }
    /^rank [0-9]/ { g = $2; row = $0; sub(/^rank [0-9]+ +/, "", row); seen[g] = seen[g] row }
    / hidden by merged cells/ { listed = 1 }
    /^one cell|^measured timeline/ { if (/some actions are shorter/) hid = 1 }
    END { if (hid != listed) { print "hidden actions said " hid ", list given " listed; bad = 1 }
          for (g = 0; g < 4; g++) { n = 0
            for (i = 0; i < 8; i++) { if (index(seen[g], i) == 0) { print "rank " g " lacks forward " i; bad = 1 }
              if (index(seen[g], substr("abcdefgh", i + 1, 1)) == 0) { print "rank " g " lacks backward " i; bad = 1 } } }
          exit bad }' || fail "timeline pp 4: an action is missing: $(sed -n '/^measured timeline/,/^peak/p' "$TMP/out")"
fi
if [ "$SMALL" -eq 0 ]; then
  check_run "check pp 4 interleaved x dp 2 f64" 0 PASS --dp 2 --pp 2 --schedule interleaved \
    --microbatches 4 $TINY --layers 4 --steps 2 --log-every 0 --dtype f64 --check
  check_run "check dp 2 x tp 2 f64" 0 PASS --dp 2 --tp 2 $TINY --steps 3 --log-every 0 --check \
    --dtype f64
  check_run "check tp 2 microbatches f32" 0 PASS --dp 1 --tp 2 $TINY --microbatches 2 --steps 3 \
    --log-every 0 --check
fi

# --write-corpus: the file holds the built-in corpus's bytes, so training on it with --data gives
# the synthetic run's losses exactly; another --data-seed gives another corpus (negative control)
if run "write corpus" 0 --write-corpus "$TMP/corpus.bin" && run "write corpus seed 2" 0 \
    --write-corpus "$TMP/corpus2.bin" --data-seed 2; then
  [ "$(wc -c <"$TMP/corpus.bin")" -eq 4194304 ] || fail "write corpus: not 4 MiB"
  cmp -s "$TMP/corpus.bin" "$TMP/corpus2.bin" && fail "write corpus: seed 2 gave the same bytes"
  for src in synthetic file; do
    if [ $src = file ]; then set -- --data "$TMP/corpus.bin"; else set --; fi
    run "corpus $src" 0 --dp 1 $TINY --steps 2 --log-every 0 --eval-every 0 "$@" \
      --json "$TMP/$src.jsonl"
    grep '"type":"step"' "$TMP/$src.jsonl" | sed 's/"ms".*//' > "$TMP/$src.loss"
  done
  [ -s "$TMP/file.loss" ] && cmp -s "$TMP/synthetic.loss" "$TMP/file.loss" ||
    fail "corpus: --data of the written corpus trains differently: $(cat "$TMP/synthetic.loss" "$TMP/file.loss")"
fi
refused "write corpus unwritable" "cannot write" --write-corpus "$TMP/no/such/dir/c.bin"

finish
