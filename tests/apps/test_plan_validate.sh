#!/bin/sh
# distlab-plan calibrate --quick writes a profile the planner reads back; validate --quick runs
# the local layouts and its model-state memory predictions are exact (0.00% on every rank).
# Step times are not asserted here (a shared, noisy host); docs/PLANNER.md reports them.
# DISTLAB_TEST_SCALE=small: the smaller model (--small).

SELF=test_plan_validate
. "$(dirname "$0")/lib.sh"
PLAN=$(app_bin distlab-plan) || exit 1
SMALL=
[ "$DISTLAB_TEST_SCALE" = small ] && SMALL=--small

# ---- the plausibility checks on fabricated figures (--figures: no measuring) ----
# plausible: GEMMs 30 ms of a 36 ms step, 2 ranks at once 10% slower per rank, noise 5%; the
# default model's linear-layer GEMMs are F = 6 BT C (12 C L + 256) = 2516582400 FLOP a step
# (BT 512, C 128, L 4), so flops_alone = F / 30 ms and nongemm_ratio = (36 - 30) / 30 = 0.2
GOOD="gemm1=30,gemmR=33,step1=36,stepR=45,steptp=40,noise=5,bw=10,lat=1,p2p_bw=10,p2p_lat=1"
if "$PLAN" calibrate --ranks 2 --figures "$GOOD" --out "$TMP/fab.hw" >"$TMP/fab" 2>"$TMP/err"; then
  awk '$1 == "flops_alone" { f = $3 } $1 == "nongemm_ratio" { r = $3 } $1 == "sync_cost" { s = $3 }
       END { d = f / 83886080000 - 1; e = r / 0.2 - 1
             exit !(d < 1e-5 && d > -1e-5 && e < 1e-5 && e > -1e-5 && s > 0) }' "$TMP/fab.hw" ||
    fail "figures: fitted profile wrong: $(cat "$TMP/fab.hw")"
else
  fail "figures: plausible figures refused: $(cat "$TMP/err")"
fi
# refused ones: exit 1, one line naming the failed check, no profile written
refuse() { # refuse NAME PATTERN FIGURES
  rm -f "$TMP/bad.hw"
  "$PLAN" calibrate --ranks 2 --figures "$3" --out "$TMP/bad.hw" >"$TMP/out" 2>"$TMP/err"
  st=$?
  [ "$st" -eq 1 ] || fail "$1: status $st, want 1 (refused)"
  grep -q -- "$2" "$TMP/err" || fail "$1: stderr lacks '$2': $(cat "$TMP/err")"
  grep -q "no profile written" "$TMP/err" || fail "$1: does not say no profile was written"
  [ -e "$TMP/bad.hw" ] && fail "$1: wrote a profile from implausible figures"
}
# the issue's figures: the GEMMs alone 199.96 ms of a 107.20 ms step
refuse "GEMMs exceed the step" "a part exceeds its whole" \
  "gemm1=199.96,gemmR=210,step1=107.2,stepR=200,steptp=150,noise=5,bw=10,lat=1,p2p_bw=10,p2p_lat=1"
refuse "2 ranks beat one" "beats one rank alone" \
  "gemm1=30,gemmR=27,step1=36,stepR=45,steptp=40,noise=5,bw=10,lat=1,p2p_bw=10,p2p_lat=1"
refuse "dp part exceeds whole" "dp 2 step" \
  "gemm1=30,gemmR=33,step1=36,stepR=33.2,steptp=40,noise=5,bw=10,lat=1,p2p_bw=10,p2p_lat=1"
refuse "tp faster than without sync" "beats the model of it without" \
  "gemm1=30,gemmR=33,step1=36,stepR=45,steptp=15,noise=5,bw=10,lat=1,p2p_bw=10,p2p_lat=1"
refuse "zero latency" "non-positive latency" \
  "gemm1=30,gemmR=33,step1=36,stepR=45,steptp=40,noise=5,bw=10,lat=0,p2p_bw=10,p2p_lat=1"
# negative control of the noise tolerance: 3% faster with noise 5% passes (the same figures as
# "2 ranks beat one" but gemmR 29.1)
"$PLAN" calibrate --ranks 2 --out "$TMP/tol.hw" --figures \
  "gemm1=30,gemmR=29.1,step1=36,stepR=45,steptp=40,noise=5,bw=10,lat=1,p2p_bw=10,p2p_lat=1" \
  >/dev/null 2>"$TMP/err" || fail "figures within the noise refused: $(cat "$TMP/err")"
# a CI host's figures (default model): tp 2 at 15.64 ms against 15.66 ms modelled without its
# synchronisation, 10% noise: accepted, the rendezvous unresolved (no sync_cost key); the same
# with tp 2 at 13.64 ms (13% below the model, beyond the noise) is refused
CI="gemm1=23.26,gemmR=23.98,step1=28.68,stepR=29.86,steptp=15.64,noise=10,bw=29,lat=4.66,p2p_bw=21.2,p2p_lat=2.37"
if "$PLAN" calibrate --ranks 2 --out "$TMP/ci.hw" --figures "$CI" >"$TMP/out" 2>"$TMP/err"; then
  grep -q "^sync_cost" "$TMP/ci.hw" && fail "tp within the noise: sync_cost written: $(cat "$TMP/ci.hw")"
  grep -q "not resolved" "$TMP/out" || fail "tp within the noise: the report does not say so"
else
  fail "tp within the noise refused: $(cat "$TMP/err")"
fi
refuse "tp beyond the noise" "beats the model of it without" "$(echo "$CI" | sed 's/steptp=15.64/steptp=13.64/')"

# ---- a measured calibration: plausible, or refused with the reason (a busy host) ----
"$PLAN" calibrate --quick $SMALL --ranks 2 --out "$TMP/hw" >"$TMP/cal" 2>"$TMP/err"
st=$?
if [ "$st" -eq 1 ] && grep -q "implausible after .* rounds.*no profile written" "$TMP/err" &&
   [ ! -e "$TMP/hw" ]; then
  echo "calibrate refused its figures on this host (tolerated): $(tail -1 "$TMP/err")"
  "$PLAN" calibrate --ranks 2 $SMALL --figures "$GOOD" --out "$TMP/hw" >"$TMP/cal" 2>"$TMP/err" ||
    fail "calibrate --figures: $(cat "$TMP/err")"
  grep -q "pipeline hand-offs" "$TMP/cal" || fail "calibrate does not say how pipelines are predicted"
else
  [ "$st" -eq 0 ] || fail "calibrate: status $st ($(head -c 300 "$TMP/err"))"
  grep -q "pipeline hand-offs" "$TMP/cal" || fail "calibrate does not say how pipelines are predicted"
  grep -q "^calibrate: round 1 " "$TMP/err" || fail "calibrate: no progress on stderr"
  # the communication figures say how they were taken: after warm-ups (issue 29: the first size
  # read 10x slower than the next with two)
  grep -q "^# all-reduce on 2 ranks (median after 20 warm-ups): 1024 B " "$TMP/cal" ||
    fail "calibrate: the all-reduce line does not give its warm-ups"
  grep -q "^# point-to-point (ping-pong, one way, median after 20 warm-ups): 1024 B " "$TMP/cal" ||
    fail "calibrate: the ping-pong line does not give its warm-ups"
  # what it accepted passes the same checks: every part below its whole, costs positive
  # (sync_cost is written only when resolved above the noise: a tp step within the noise of the
  # model without synchronisation leaves it 0, and the key out)
  awk '$1 == "nongemm_ratio" || $1 == "sync_cost" || $1 == "nongemm_contention" { if (!($3 > 0)) bad = 1 }
       $1 == "nongemm_ratio" || $1 == "nongemm_contention" { n++ }
       END { exit bad || n != 2 }' "$TMP/hw" || fail "calibrate: a non-positive figure: $(cat "$TMP/hw")"
fi
for k in flops flops_alone intra_bw intra_lat p2p_bw ranks nongemm_ratio gpus_per_node; do
  grep -q "^$k = " "$TMP/hw" || fail "profile lacks $k"
done
# the profile is a valid --hardware file for the analytic subcommands
"$PLAN" memory --hardware "$TMP/hw" --model 7.5b >/dev/null 2>"$TMP/err" ||
  fail "profile not readable: $(cat "$TMP/err")"

"$PLAN" validate --quick $SMALL --ranks 4 --steps 4 --hardware "$TMP/hw" >"$TMP/val" 2>"$TMP/err"
st=$?
[ "$st" -eq 0 ] || [ "$st" -eq 1 ] || fail "validate: status $st ($(head -c 300 "$TMP/err"))"
rows=$(grep -c '^dp' "$TMP/val")
[ "$rows" -ge 6 ] || fail "validate: $rows layouts, want >= 6"
grep -q '^dp1 tp1 pp2 1f1b' "$TMP/val" || fail "validate: no pipeline layout"
# columns: layout(6 words) ranks over sample pred meas err states_pred states_meas states_err ...
# (pipeline stages differ: states_err is the worst rank's, exact too)
awk '/^dp/ { if ($15 != "+0.00" || $13 != $14) { print "memory: " $0; bad = 1 } } END { exit bad }' \
  "$TMP/val" || fail "validate: model-state memory not exact"
grep -q "yes" "$TMP/val" || fail "validate: no oversubscribed layout marked"
grep -q "^# largest step-time error within the cores: [+-][0-9.]*% (" "$TMP/val" ||
  fail "validate: no largest-error line"
# progress: one line per run as it ends, with its error (rows x 3 rounds of --quick)
np=$(grep -c '^validate: round [1-3]/3 .*predicted .* ms: *[+-][0-9.]*%' "$TMP/err")
[ "$np" -eq $((rows * 3)) ] || fail "validate: $np progress lines, want $((rows * 3))"
"$PLAN" validate --quick $SMALL --ranks 1 --steps 2 --hardware "$TMP/hw" --quiet >/dev/null 2>"$TMP/err"
[ -s "$TMP/err" ] && fail "validate --quiet wrote to stderr: $(head -c 200 "$TMP/err")"

# a mixture of experts at dp x ep: the trainer's model states and the mean all-to-all bytes per
# rank are predicted exactly (nothing dropped: 4 x tokens x k x C x 4 B per MoE layer)
"$PLAN" validate --quick $SMALL --moe --ranks 2 --steps 2 --hardware "$TMP/hw" --quiet >"$TMP/moe" 2>"$TMP/err"
st=$?
[ "$st" -eq 0 ] || [ "$st" -eq 1 ] || fail "validate --moe: status $st ($(head -c 300 "$TMP/err"))"
[ "$(grep -c '^dp [12] ep [12] zero 0 ' "$TMP/moe")" -eq 3 ] || fail "validate --moe: not 3 layouts: $(cat "$TMP/moe")"
awk '/^dp/ { if ($15 != "+0.00" || $13 != $14 || $NF == "MEM" || $NF == "A2A") { print "moe: " $0; bad = 1 } } END { exit bad }' \
  "$TMP/moe" || fail "validate --moe: model states or all-to-all bytes not exact"
[ "$(grep -c '^#   dp . ep . zero 0: all-to-all bytes per rank per step planner \([0-9]*\), measured \1 (+0.00%)' "$TMP/moe")" -eq 3 ] ||
  fail "validate --moe: all-to-all bytes: $(grep all-to-all "$TMP/moe")"

# search with a calibrated profile predicts distlab-train's local layouts
"$PLAN" search --hardware "$TMP/hw" --gpus 4 --csv >"$TMP/search" 2>"$TMP/err" ||
  fail "search --hardware profile: status $? ($(head -c 300 "$TMP/err"))"
head -1 "$TMP/search" | grep -q 'tier,dp,tp,pp,zero,m,ranks,oversubscribed,step_ms,tokens_per_s,state_mib' ||
  fail "search --hardware profile: header $(head -1 "$TMP/search")"
n=$(($(wc -l <"$TMP/search") - 1))
[ "$n" -eq 27 ] || fail "search --hardware profile: $n layouts on 1..4 ranks, want 27"
# sorted by tokens/s; tiers 1, 2, ...: a tier is the rows within 15% of its fastest (first) row,
# the next tier starts at the first row below 85% of it
awk -F, 'NR > 1 { n++
           if (n > 1 && $10 > prev) { print "row " n " out of order"; bad = 1 }
           if (n == 1 || $10 < 0.85 * lead) { tier++; lead = $10 }
           if ($1 != tier) { print "row " n ": tier " $1 ", want " tier; bad = 1 }
           prev = $10 }
         END { exit bad }' "$TMP/search" || fail "search: tiers are not the 15% tie groups"
"$PLAN" search --hardware "$TMP/hw" --gpus 4 >"$TMP/human" 2>&1
if [ "$(awk -F, 'NR > 1 { c[$1]++ } END { for (k in c) if (c[k] > 1) n++; print n + 0 }' "$TMP/search")" -gt 0 ]; then
  grep -q "layouts within 15% of each other .* the predictions do not order them" "$TMP/human" ||
    fail "search: ties not reported"
fi
# the recommendation: a layout of tier 1, its predicted tokens/s, the command, and why
grep -q "^recommended: dp [0-9]* x tp [0-9]* x pp [0-9]*, ZeRO [0-3].*: [0-9]* tokens/s predicted.*(distlab-train --dp" \
  "$TMP/human" || fail "search: no recommendation line"
grep -q "^  why: the fastest prediction of tier 1" "$TMP/human" || fail "search: the recommendation without why"
grep -q "states MiB/rank" "$TMP/human" || fail "search: the state column's unit is not MiB"


[ "$fails" -ne 0 ] && cat "$TMP/cal" "$TMP/val"
finish
