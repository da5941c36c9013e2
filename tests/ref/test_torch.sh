#!/bin/sh
# distlab against PyTorch, which nobody here wrote (issue 3, Tests): for a few layouts,
#   distlab-train ... --steps 1 --save init.st                      (a model)
#   distlab-train ... --load init.st --steps 1 --dump-grads g.st --json step.jsonl
#   tests/ref/torch_compare.py: the same model in Debian's python3-torch, loaded from init.st, one
#   forward/backward on g.st.tokens; the loss and EVERY gradient must match distlab's
#   (f32 within 1e-5 relative per tensor, f64 within 1e-12).
# Plus two negative controls: a wrong loss and a corrupted gradient must make the script fail.
# Skipped (exit 77) when /usr/bin/python3 cannot import torch. Run by `make check` from the build
# directory (the binary is ./apps/distlab-train). DISTLAB_TEST_SCALE=small: the two f32 cases and
# the controls only.

PY=/usr/bin/python3
if ! [ -x "$PY" ] || ! "$PY" -c 'import torch' >/dev/null 2>&1; then
  echo "test_torch: SKIPPED: python3-torch is not installed (apt-get install python3-torch)"
  exit 77
fi

if [ -n "$abs_top_builddir" ] && [ -x "$abs_top_builddir/apps/distlab-train" ]; then
  TRAIN="$abs_top_builddir/apps/distlab-train"
else
  TRAIN="./apps/distlab-train"
fi
if [ ! -x "$TRAIN" ]; then
  echo "test_torch: $TRAIN not found (run from the build directory)"
  exit 1
fi
SRC="${srcdir:-$(dirname "$0")/../..}"
SCRIPT="$SRC/tests/ref/torch_compare.py"
if [ ! -f "$SCRIPT" ]; then
  SCRIPT="$(dirname "$0")/torch_compare.py"
fi

TMP=$(mktemp -d "${TMPDIR:-/tmp}/test_torch.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT INT TERM
fails=0
fail() {
  echo "FAIL: $*"
  fails=$((fails + 1))
}

MODEL="--layers 2 --d-model 64 --heads 4 --seq 32 --steps 1 --log-every 0"

# case NAME SAVE_OPTS -- DUMP_OPTS: save a model with SAVE_OPTS (after its one step), then dump
# step 1's gradients from it with DUMP_OPTS (any layout), then compare with PyTorch.
case_() {
  name=$1; save=$2; dump=$3; shift 3
  d="$TMP/$name"
  mkdir -p "$d"
  # shellcheck disable=SC2086
  if ! "$TRAIN" $MODEL $save --save "$d/init.st" >"$d/save.out" 2>&1; then
    fail "$name: saving run failed: $(tail -n 3 "$d/save.out")"
    return
  fi
  # shellcheck disable=SC2086
  if ! "$TRAIN" $MODEL $dump --load "$d/init.st" --dump-grads "$d/g.st" --json "$d/step.jsonl" \
       >"$d/dump.out" 2>&1; then
    fail "$name: --dump-grads run failed: $(tail -n 3 "$d/dump.out")"
    return
  fi
  echo "== $name: save with '$save', dump with '$dump'"
  "$PY" "$SCRIPT" --model "$d/init.st" --grads "$d/g.st" --json "$d/step.jsonl" "$@"
  rc=$?
  [ "$rc" -eq 0 ] || fail "$name: torch_compare.py exit status $rc"
}

case_ dp2_f32 "--dp 2 --micro-batch 4" "--dp 2 --micro-batch 4"

# negative controls: the comparison must be able to fail
d="$TMP/dp2_f32"
if [ -f "$d/g.st" ]; then
  "$PY" "$SCRIPT" --model "$d/init.st" --grads "$d/g.st" --loss 5.0 --quiet >"$TMP/neg.out" 2>&1
  [ $? -eq 1 ] || fail "control: a wrong loss was not detected: $(tail -n 2 "$TMP/neg.out")"
  cp "$d/g.st" "$TMP/bad.st" && cp "$d/g.st.tokens" "$TMP/bad.st.tokens"
  size=$(wc -c <"$TMP/bad.st")
  # the last element is lm_head.weight[255][63]: make it 1.0f (gradients are ~1e-2)
  printf '\000\000\200\077' | dd of="$TMP/bad.st" bs=1 seek=$((size - 4)) conv=notrunc 2>/dev/null
  "$PY" "$SCRIPT" --model "$d/init.st" --grads "$TMP/bad.st" --json "$d/step.jsonl" --quiet \
    >"$TMP/neg.out" 2>&1
  rc=$?
  if [ "$rc" -ne 1 ] || ! grep -q 'lm_head.weight.*FAIL' "$TMP/neg.out"; then
    fail "control: a corrupted lm_head.weight gradient was not detected (status $rc)"
  fi
fi

# a trained model (60 steps: attention no longer near-uniform), its gradients under tensor
# parallelism with gradient accumulation
case_ trained_tp2_accum "--dp 2 --micro-batch 4 --steps 60 --lr 1e-2 --warmup 5" \
  "--dp 1 --tp 2 --micro-batch 4 --microbatches 2" --quiet

if [ "${DISTLAB_TEST_SCALE:-}" != small ]; then
  # f64 (tolerance 1e-12)
  case_ dp2_f64 "--dp 2 --micro-batch 4 --dtype f64" "--dp 2 --micro-batch 4 --dtype f64" --quiet
  # tied embeddings, full recompute, dp x tp
  case_ tied_dp2tp2 "--dp 2 --micro-batch 2 --tie-embeddings --recompute full" \
    "--dp 2 --tp 2 --micro-batch 2 --tie-embeddings --recompute full" --quiet
fi

if [ "$fails" -ne 0 ]; then
  echo "test_torch: $fails failure(s)"
  exit 1
fi
echo "test_torch: all passed"
exit 0
