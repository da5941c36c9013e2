#!/bin/sh
# distlab-train's full-state checkpoints from the outside (docs/CHECKPOINTS.md): Ctrl-C (SIGINT)
# and SIGTERM during training finish the step, write a checkpoint and exit 130 / 143; --resume
# continues to the same last loss as the uninterrupted run; a second signal exits at once and
# leaves only complete checkpoints (the next save removes the temporary); --load takes the
# file's shape when none is given; --resume under another layout; distlab-ckpt converts, lists,
# verifies (checksums and the state hash); the options refused
# without --ckpt-dir or against the checkpoint exit 2 with one line.
# A signal is sent once the run has printed a step (the event, not a delay, orders the test); a
# run that ended before it would fail on its exit status (20000 steps take a minute).
# Run by `make check` from the build directory. $M is an option list, split on purpose.
# shellcheck disable=SC2086

SELF=test_ckpt_cli
. "$(dirname "$0")/lib.sh"
APP=$(app_bin distlab-train) || exit 1
# a constant learning rate: the interrupted run (20000 steps) and the short ones share it
M="--dp 2 --layers 2 --d-model 32 --heads 2 --seq 16 --log-every 1 --warmup 0 --lr 3e-3 --min-lr 3e-3"

# start_run DIR STEPS: the app in the background on $TMP/DIR, its pid in $pid, once it printed a
# step line
start_run() {
  # a script's background job starts with SIGINT ignored, and the app keeps an ignored signal
  # ignored (as under nohup): restore the default first
  env --default-signal=INT "$APP" $M --steps "$2" --ckpt-dir "$TMP/$1" >"$TMP/$1.out" 2>&1 &
  pid=$!
  i=0
  until grep -q '^step ' "$TMP/$1.out" 2>/dev/null; do
    i=$((i + 1))
    [ "$i" -lt 6000 ] || { fail "$1: no step line in 60 s"; break; }
    sleep 0.01
  done
}

# signal SIG STATUS: the run stops after its step with a checkpoint, exit STATUS
signal() {
  start_run "$1" 20000
  kill "-$1" "$pid"
  wait "$pid"
  st=$?
  [ "$st" -eq "$2" ] || fail "$1: exit status $st, want $2: $(tail -3 "$TMP/$1.out")"
  grep -q "stopped by SIG$1 after step" "$TMP/$1.out" || fail "$1: no 'stopped by' line"
  n=$(find "$TMP/$1" -name manifest.json | wc -l)
  [ "$n" -eq 1 ] || fail "$1: $n checkpoints, want 1"
  [ -z "$(find "$TMP/$1" -name '.tmp*')" ] || fail "$1: a temporary was left"
}
signal INT 130
signal TERM 143

# the stopped run resumed (its options from the manifest) to the uninterrupted run's last loss
saved=$(sed -n 's/.*checkpoint.* the last .*step-0*\([0-9]*\)$/\1/p' "$TMP/INT.out")
total=$((saved + 3))
run "resume" 0 --resume "$TMP/INT" --steps "$total" --log-every 1
has "resume" "resumed from step $saved"
grep "^step *$total/" "$TMP/out" | sed 's/ *[0-9]* tok.*//' >"$TMP/resumed"
run "uninterrupted" 0 $M --steps "$total"
grep "^step *$total/" "$TMP/out" | sed 's/ *[0-9]* tok.*//' >"$TMP/straight"
[ -s "$TMP/straight" ] && cmp -s "$TMP/resumed" "$TMP/straight" ||
  fail "resume: '$(cat "$TMP/resumed")' against the uninterrupted '$(cat "$TMP/straight")'"

# a second signal: at once, only complete checkpoints, the next save removes any temporary
start_run twice 20000
kill -INT "$pid"
kill -INT "$pid"
wait "$pid"
st=$?
[ "$st" -eq 130 ] || fail "twice: exit status $st, want 130"
for d in "$TMP"/twice/step-*; do
  [ -e "$d" ] || continue
  [ -f "$d/manifest.json" ] || fail "twice: $d is not complete"
done
run "after twice" 0 $M --steps 2 --ckpt-dir "$TMP/twice" --save-at-end
[ -z "$(find "$TMP/twice" -name '.tmp*')" ] || fail "after twice: a temporary was left"

# --load without a shape takes the file's; with another shape it is refused
run "save" 0 --layers 2 --d-model 32 --heads 2 --seq 16 --steps 2 --save "$TMP/m.st"
run "load, the file's shape" 0 --load "$TMP/m.st" --eval-only
has "load, the file's shape" "validation loss"
refused "load, another shape" "holds a model with --layers 2" --load "$TMP/m.st" --eval-only --layers 3

# distlab-ckpt: a dp 2 x tp 2 ZeRO-1 checkpoint converted is the --save file of the same step,
# byte for byte; list and verify; a flipped byte fails verify (exit 1, one line)
CKPT=$(app_bin distlab-ckpt) || exit 1
run "save both" 0 $M --tp 2 --zero 1 --steps 3 --ckpt-dir "$TMP/conv" --save-at-end \
  --save "$TMP/p.st"
run_cmd "convert" 0 "$CKPT" convert "$TMP/conv" "$TMP/c.st"
cmp -s "$TMP/c.st" "$TMP/p.st" || fail "convert: differs from --save's file"
run_cmd "list" 0 "$CKPT" list "$TMP/conv"
has "list" "layout: dp 2 x tp 2 x pp 1, ZeRO stage 1"
has "list" "file rank-00003.safetensors"
run_cmd "verify" 0 "$CKPT" verify "$TMP/conv"
has "verify" "state hash"
# resharded: the dp 2 x tp 2 ZeRO-1 checkpoint continues on tp 2 alone (the hash checked on load)
run "resume resharded" 0 --resume "$TMP/conv" --dp 1 --steps 4 --ckpt-dir "$TMP/resh"
has "resume resharded" "resumed from step 3"
f=$(find "$TMP/conv" -name rank-00001.safetensors)
printf 'X' | dd of="$f" bs=1 seek=200 conv=notrunc 2>/dev/null
run_cmd "verify damaged" 1 "$CKPT" verify "$TMP/conv"
grep -q "rank-00001.safetensors: checksum mismatch" "$TMP/err" ||
  fail "verify damaged: $(cat "$TMP/err")"
run_cmd "ckpt usage" 2 "$CKPT" frobnicate
run_cmd "ckpt did-you-mean" 2 "$CKPT" --hlep
grep -q "did you mean '--help'" "$TMP/err" || fail "ckpt did-you-mean: $(cat "$TMP/err")"

# refusals: one line, exit 2
refused "save-every alone" "need --ckpt-dir" --save-every 5
refused "resume and load" "not with --load" --resume "$TMP/INT" --load x
refused "resume other model" "--d-model was 32" --resume "$TMP/INT" --d-model 64
refused "resume other batch" "--global-batch was" --resume "$TMP/INT" --global-batch 64
refused "resume nothing" "no complete checkpoint" --resume "$TMP"
finish
