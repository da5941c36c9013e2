#!/bin/sh
# Command-line contract of distlab-plan: version, help, usage errors (exit 2, one line on stderr),
# and the lecture's numbers in human, CSV and JSON output. Run by `make check` from the build
# directory (the binary is ./apps/distlab-plan).

SELF=test_plan_cli
. "$(dirname "$0")/lib.sh"
PLAN=$(app_bin distlab-plan) || exit 1
APP=$PLAN

# ---- version and help ----
if run version 0 --version; then
  grep -q '^distlab-plan (distlab) [0-9]' "$TMP/out" || fail "version: $(cat "$TMP/out")"
fi
run help 0 --help && has help "search"
for sub in memory comm zero pipeline search; do
  run "$sub --help" 0 "$sub" --help && has "$sub --help" "Usage: distlab-plan $sub"
done

# ---- usage errors ----
usage_error "no subcommand" "missing subcommand"
usage_error "unknown subcommand" "unknown subcommand" frobnicate
usage_error "unknown flag" "unknown option" memory --frob 1
usage_error "flag of another subcommand" "unknown option" zero --gpus 8
usage_error "did you mean" "unknown option '--gpu' (did you mean '--gpus'?" search --gpu 4
usage_error "unknown model" "unknown model preset" memory --model gpt-9
usage_error "unknown hardware" "unknown hardware preset" search --hardware tpu9
usage_error "zero layers" "layers" memory --layers 0 --hidden 1024 --heads 8
usage_error "negative hidden" "hidden" memory --layers 4 --hidden -1024 --heads 8
usage_error "t not dividing heads" "heads" memory --t 5
usage_error "gpus not a multiple" "multiple" search --gpus 1020
usage_error "zero gpus" "gpus" search --gpus 0
usage_error "missing value" "needs a value" search --gpus
usage_error "bad number" "not an integer" search --gpus many
usage_error "bare count search" "bare parameter count" search --model maverick-400b
usage_error "bad costs" "costs" pipeline --costs 1,,x
usage_error "calibrate bad flag" "unknown or incomplete option" calibrate --bogus
usage_error "validate bad flag" "unknown or incomplete option" validate --out x
usage_error "calibrate one rank" "at least 2" calibrate --ranks 1
usage_error "figures missing key" "--figures: gemmR= missing" calibrate --figures gemm1=1
usage_error "figures unknown key" "is not one of" calibrate --figures gemm1=1,speed=2
usage_error "figures not a number" "--figures" calibrate --figures gemm1=fast

# ---- the lecture's numbers ----
if run "memory gpt3" 0 memory --model gpt3-175b; then
  # the lecture's 2.87 GB and 275 GB per layer and for all layers, in GiB as every byte column
  grep -Eq '^  no recompute +2\.67 +256$' "$TMP/out" || fail "memory gpt3: activations 2.67 / 256 GiB"
  has "memory gpt3" "per layer GiB  all layers GiB"
  has "memory gpt3" "total GiB"
  ! grep -Eq '[0-9] (kB|MB|GB|TB)( |$)' "$TMP/out" || fail "memory gpt3: decimal bytes: $(grep -E '[0-9] (kB|MB|GB|TB)( |$)' "$TMP/out")"
  has "memory gpt3" "about 1100"
  has "memory gpt3" "989 TFLOP/s / 900 GB/s"
fi
if run "memory 70b" 0 memory --model dense-70b --csv; then
  grep -q '^total,16,1.12e+12$' "$TMP/out" || fail "memory 70b: 16 B/param, 1120 GB: $(grep total "$TMP/out")"
  grep -q '^GPUs of 74.5 GiB needed,,14$' "$TMP/out" || fail "memory 70b: 14 GPUs of 80e9 B"
fi
if run "comm 7.5b" 0 comm; then
  has "comm 7.5b" "compute 1.86 s"
  has "comm 7.5b" "65.6 ms"
  has "comm 7.5b" "591 ms"
fi
if run "comm tp" 0 comm --model gpt3-175b --t 8; then # 352e6 B a layer: 0.328 GiB
  grep -Eq '^  TP all-reduces, one layer +nvlink +0\.328 ' "$TMP/out" || fail "comm tp: 0.328 GiB a layer"
  has "comm tp" "sent per GPU GiB"
  has "comm tp" "ring of 40.6 GiB gradients"
  ! grep -Eq '[0-9] (kB|MB|GB|TB)( |$)' "$TMP/out" || fail "comm tp: decimal bytes: $(grep -E '[0-9] (kB|MB|GB|TB)( |$)' "$TMP/out")"
fi
if run "zero GiB" 0 zero; then
  has "zero GiB" "per GPU GiB"
  has "zero GiB" "sent per GPU GiB"
fi
if run "zero" 0 zero --csv; then
  for v in 1.2e+11 3.14062e+10 1.66406e+10 1.875e+09; do
    grep -q ",$v," "$TMP/out" || fail "zero: no $v in $(cat "$TMP/out")"
  done
fi
if run "pipeline" 0 pipeline --p 4 --m 8 --costs 3,1x10,4; then
  has pipeline "27.3% (3/11)"
  has pipeline "10-11"
  grep -q 'slowest 5) vs even (slowest 6)' "$TMP/out" || fail "pipeline: partition maxima"
fi
run "exercise 4" 0 pipeline --p 8 --global-batch 512 --d 16 --csv &&
  { grep -q '^8,32,1,0.179487,64$' "$TMP/out" || fail "exercise 4: $(cat "$TMP/out")"; }

if run "search gpt3" 0 search --csv; then
  n=$(tail -n +2 "$TMP/out" | wc -l)
  fit=$(tail -n +2 "$TMP/out" | awk -F, '$6 == 1' | wc -l)
  [ "$n" -eq 27 ] && [ "$fit" -eq 18 ] || fail "search gpt3: $n combinations, $fit fit (want 27, 18)"
  head -1 "$TMP/out" | grep -q '^t,p,d,m,mem_gb,fits,bubble,step_s,compute_s,tp_s,pp_s,dp_s$' ||
    fail "search csv header: $(head -1 "$TMP/out")"
  sed -n 2p "$TMP/out" | grep -q '^8,8,16,' || fail "search gpt3 fastest: $(sed -n 2p "$TMP/out")"
fi
if run "search 405b" 0 search --model llama3-405b --gpus 1024 --gpus-per-node 8 --global-batch 1536 --seq 2048 --json; then
  fit=$(grep -c '"fits": true' "$TMP/out")
  [ "$fit" -eq 14 ] || fail "search 405b: $fit fit, want 14"
  first=$(grep -m1 '"t":' "$TMP/out")
  echo "$first" | grep -q '"t": 8, "p": 8, "d": 16' || fail "search 405b fastest: $first"
  echo "$first" | awk -F'"mem_gb": ' '{split($2, a, ","); exit !(a[1] >= 30 && a[1] <= 34)}' ||
    fail "search 405b memory: $first"
  echo "$first" | awk -F'"step_s": ' '{split($2, a, ","); exit !(a[1] >= 22 && a[1] <= 26)}' ||
    fail "search 405b step: $first"
fi

# ---- a mixture of experts (lecture §6.3): 234881024 B = 0.219 GiB a layer forward, 32.2% ----
if run "comm moe" 0 comm --model mixtral-8x7b --d 8 --ep 8 --micro-batch 2 --tokens-per-gpu 8192; then
  grep -Eq '^  EP all-to-alls, one MoE layer fwd +ib +0\.219 +4\.7 ms +32\.2% ' "$TMP/out" ||
    fail "comm moe: 0.219 GiB, 4.7 ms, 32.2% a layer: $(grep 'EP all' "$TMP/out")"
  has "comm moe" "12.88 billion active"
fi
if run "search moe" 0 search --model mixtral-8x7b --gpus 16 --global-batch 64 --csv; then
  head -1 "$TMP/out" | grep -q '^t,p,d,ep,m,mem_gb,fits,bubble,step_s,compute_s,tp_s,pp_s,dp_s,ep_s$' ||
    fail "search moe csv header: $(head -1 "$TMP/out")"
  tail -n +2 "$TMP/out" | awk -F, '$3 % $4 || 8 % $4 { bad = 1 } $4 > 1 { ep = 1 } END { exit bad || !ep }' ||
    fail "search moe: an ep not dividing d or the experts, or none above 1"
fi
usage_error "ep not dividing d" "e = 3 must divide" memory --model mixtral-8x7b --d 4 --ep 3
usage_error "ep without experts" "needs a model with experts" memory --d 4 --ep 2
usage_error "top-k above experts" "top-k 9" memory --model mixtral-8x7b --top-k 9
usage_error "top-k without experts" "without experts" memory --top-k 2

# ---- a hardware profile file ----
cat >"$TMP/hw.txt" <<'PROFILE'
# a profile as calibrate writes it
distlab-hw-profile = 1
name = h100-file
flops = 989e12
mfu = 0.4
mem_bytes = 80e9
intra_bw = 450e9
inter_bw = 50e9
gpus_per_node = 8
PROFILE
run "profile" 0 search --hardware "$TMP/hw.txt" --csv &&
  { sed -n 2p "$TMP/out" | grep -q '^8,8,16,' || fail "profile: fastest $(sed -n 2p "$TMP/out")"; }
echo "bogus = 1" >>"$TMP/hw.txt"
usage_error "bad profile" "unknown key" search --hardware "$TMP/hw.txt"

finish
