#!/bin/bash
# A/B of the trainer's ZeRO stages and bf16 mixed precision on 2 ranks, the benchmark model, alternated
# (docs/PERFORMANCE.md, "ZeRO and mixed precision"). Usage: docs/zero-bench.sh BUILD_DIR [BASELINE_BINARY]
base=${2:-}
cd "${1:-.}" || exit 2
M="--dp 2 --layers 4 --d-model 256 --heads 4 --seq 128 --micro-batch 8 --steps 8 --log-every 0 --eval-windows 1"
export OPENBLAS_NUM_THREADS=1
for round in 1 2 3; do
  [ -n "$base" ] && echo "base $($base $M | awk '/throughput/{print $2}')"
  for cfg in "f32 0" "f32 1" "f32 2" "f32 3" "bf16 0" "bf16 3"; do
    set -- $cfg # dtype, stage
    echo "$1 z$2 $(./apps/distlab-train $M --dtype "$1" --zero "$2" | awk '/throughput/{print $2}')"
  done
done
