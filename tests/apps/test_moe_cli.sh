#!/bin/sh
# distlab-train's mixture of experts from the outside: each bad input refused with one line and
# exit status 2 (E not divisible by ep, ep not dividing dp, k > E, k = 0, C < 0, --moe-every >
# layers, --ep or --top-k without --experts; a micro-batch tp does not divide, tp with ZeRO 2-3 or
# bf16, --recompute full and the schedules of several chunks a stage or no flush named); a
# composed run (pp 2 x dp 2 x ep 2, ZeRO 1, bf16) trains and
# reports both ZeRO groups; tp 2 x pp 2 x dp 2 x ep 2 (ZeRO 0 and 1), ZB-H2 and 1F1B-split with
# experts pass --check against one rank; --help lists the
# options; a dp 2 x ep 2 run reports its drops and imbalance and writes the per-step figures to
# --json; --save at ep 2 loads at ep 1 (and back) to the same validation loss; a full-state
# checkpoint at dp 2 x ep 2 resumes to the uninterrupted run's last loss, exactly (f64, the same
# layout and arithmetic), and resharded to dp 1 x ep 1 within rounding; --sample works at ep 2;
# distlab-bench topo --ep shows the ep and the expert-data-parallel groups; distlab-ckpt
# converts an ep checkpoint and verifies its state hash.
# Run by `make check` from the build directory. $M is an option list, split on purpose.
# shellcheck disable=SC2086

SELF=test_moe_cli
. "$(dirname "$0")/lib.sh"
APP=$(app_bin distlab-train) || exit 1
M="--layers 2 --d-model 32 --heads 2 --seq 16 --global-batch 4 --log-every 0 --dtype f64"
X="--experts 4 --top-k 2"

refused ep-no-experts 'needs a mixture of experts' $M --dp 2 --ep 2 --steps 1
refused topk-no-experts 'needs a mixture of experts' $M --top-k 2 --steps 1
refused e-not-div-ep 'not divisible by --ep' $M --experts 6 --dp 4 --ep 4 --steps 1
refused ep-not-div-dp 'does not divide dp' $M $X --dp 2 --ep 4 --steps 1
refused k-gt-e 'top-k 5 must be' $M --experts 4 --top-k 5 --steps 1
refused k-zero 'top-k 0 must be' $M --experts 4 --top-k 0 --steps 1
refused c-negative 'capacity-factor' $M $X --capacity-factor -0.5 --steps 1
refused moe-every 'moe-every 3 is more than --layers 2' $M $X --moe-every 3 --steps 1
refused tp-micro 'micro-batch 1 is not a multiple of 2' $M $X --dp 1 --tp 2 --micro-batch 1 --steps 1
refused tp-zero2 'with tp > 1 and ZeRO 2-3 is not supported' $M $X --dp 2 --tp 2 --zero 2 --steps 1
refused tp-bf16 'with tp > 1 and bf16 is not supported' --layers 2 --d-model 32 $X --tp 2 \
  --micro-batch 2 --dtype bf16 --steps 1
refused recompute 'with --recompute is not supported' $M $X --recompute full --steps 1
refused interleaved 'with --schedule interleaved is not supported' $M $X --layers 4 --pp 2 \
  --schedule interleaved --microbatches 2 --steps 1
refused async 'with --schedule async is not supported' $M $X --pp 2 --schedule async --steps 1

run composed 0 --layers 2 --d-model 32 --heads 2 --seq 16 --global-batch 8 --log-every 0 $X \
  --dp 2 --ep 2 --pp 2 --zero 1 --schedule 1f1b --microbatches 2 --dtype bf16 --steps 2
has composed "ZeRO stage 1 over dp 2, the experts over the expert-data-parallel group of 1"
has composed "mixture of experts: 2 MoE layers of 4 experts, top-2"

# the combinations test_moe_train does not train, checked against one rank by --check (f64: the
# losses, step 1's gradients and parameters within the kernel-independent bounds): tp with pp,
# with and without ZeRO-1, and the split-backward schedules other than ZB-H1
MC="--layers 2 --d-model 32 --heads 4 --seq 16 --micro-batch 2 --dtype f64 --steps 2 --log-every 0 $X --check"
run tp-pp 0 $MC --tp 2 --pp 2 --dp 2 --ep 2 --microbatches 2
has tp-pp "verdict: PASS"
run tp-pp-z1 0 $MC --tp 2 --pp 2 --dp 2 --ep 2 --microbatches 2 --zero 1
has tp-pp-z1 "verdict: PASS"
for s in zb-h2 1f1b-split; do
  run "$s" 0 $MC --pp 2 --dp 2 --ep 2 --microbatches 4 --schedule "$s"
  has "$s" "verdict: PASS"
done

run help 0 --help
for o in --experts --top-k --capacity-factor --moe-every --expert-ffn --aux-loss --z-loss --ep; do
  has "help $o" "  $o "
done

run ep2 0 $M $X --dp 2 --ep 2 --steps 3 --capacity-factor 0.75 --json "$TMP/run.json"
has_re ep2 '^  layer 0: routed per expert [0-9 ]*; dropped [0-9]* of 128 ([0-9.]*%); imbalance max/mean [0-9.]*$'
has ep2 "mixture of experts: 2 MoE layers of 4 experts, top-2, capacity factor 0.75; ep 2"
grep -q '"type":"step".*"aux_loss":.*"moe":\[{"layer":0,"routed":\[' "$TMP/run.json" ||
  fail "ep2: --json's step records lack the MoE figures"
grep -q '"combine_wait_ms":\[[-0-9.e]*,[-0-9.e]*\]' "$TMP/run.json" ||
  fail "ep2: --json's step records lack each rank's combine wait"

# the parameters at ep 2, loaded at ep 1 and at ep 2: one model
run save 0 $M $X --dp 2 --ep 2 --steps 2 --save "$TMP/p.safetensors"
run load1 0 $M $X --dp 1 --load "$TMP/p.safetensors" --eval-only
v1=$(grep '^validation loss' "$TMP/out")
run load2 0 $M $X --dp 2 --ep 2 --load "$TMP/p.safetensors" --eval-only
v2=$(grep '^validation loss' "$TMP/out")
[ -n "$v1" ] && [ "$v1" = "$v2" ] || fail "load: ep 1 '$v1', ep 2 '$v2'"

# a full-state checkpoint at dp 2 x ep 2 resumes to the same last loss (17 digits in --json)
last_loss() { grep '"type":"step"' "$1" | tail -1 | sed 's/.*"loss":\([^,]*\),.*/\1/'; }
run whole 0 $M $X --dp 2 --ep 2 --steps 4 --json "$TMP/whole.json"
run first 0 $M $X --dp 2 --ep 2 --steps 4 --ckpt-dir "$TMP/ck" --save-every 2
run resume 0 $M --steps 4 --resume "$TMP/ck/step-0000002" --json "$TMP/res.json"
a=$(last_loss "$TMP/whole.json")
b=$(last_loss "$TMP/res.json")
[ -n "$a" ] && [ "$a" = "$b" ] || fail "resume: last loss $b, uninterrupted $a"
# resharded to ep 1 (one rank reads both ep ranks' experts): the state hash checked on load;
# the losses differ from the uninterrupted run's by the changed reduction order's rounding only
# (f64; test_reshard asserts compare.h's bounds), far below 1e-9 relative
run reshard 0 $M --dp 1 --ep 1 --steps 4 --resume "$TMP/ck/step-0000002" --json "$TMP/rs.json"
has reshard "(ZeRO 0, ep 2) loads into dp 1 x tp 1 x pp 1 (ZeRO 0, ep 1)"
b=$(last_loss "$TMP/rs.json")
awk -v a="$a" -v b="$b" 'BEGIN { d = (a - b) / a; exit !(b != "" && d < 1e-9 && d > -1e-9) }' ||
  fail "reshard: last loss $b, uninterrupted $a"

# distlab-ckpt converts it (every expert, from both ep ranks' files) to the parameter file
CKPT=$(app_bin distlab-ckpt) || exit 1
run_cmd convert 0 "$CKPT" convert "$TMP/ck/step-0000004" "$TMP/conv.safetensors"
run_cmd verify 0 "$CKPT" verify "$TMP/ck/step-0000004"
has verify "state hash"
run convload 0 $M $X --dp 1 --load "$TMP/conv.safetensors" --eval-only
grep -q '^validation loss' "$TMP/out" || fail "convert: the converted file does not evaluate"

BENCH=$(app_bin distlab-bench) || exit 1
run_cmd topo 0 "$BENCH" topo --ranks 16 --topology "pack:2 l3:2 core:4 pu:1" --tp 2 --ep 2
has topo "  ep groups (experts spread, the all-to-alls): 8 of 2 ranks each"
has topo "  expert-data-parallel groups (experts' gradients): 4 of 4 ranks each"
run_cmd topo-bad 2 "$BENCH" topo --ranks 6 --ep 4

run sample 0 $M $X --dp 2 --ep 2 --steps 2 --sample 16
has sample "sample (16 bytes"
finish
