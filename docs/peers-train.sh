#!/bin/bash
# Reproduce the trainer comparison of docs/PERFORMANCE.md: distlab-train and PyTorch 1.13
# (../shared/peers/torch_gpt.py, Debian's python3-torch) on the same model, alternated A B A B.
# Usage (from a build directory): ../docs/peers-train.sh [pairs=3] [peers-dir] [extra distlab flags]
set -euo pipefail
pairs=${1:-3}
peers=${2:-$(dirname "$0")/../../shared/peers}
shift $(( $# > 2 ? 2 : $# )) || true
T=./apps/distlab-train
[ -x "$T" ] || { echo "run from a build directory (./apps/distlab-train not found)" >&2; exit 2; }
model="--layers 4 --d-model 256 --heads 4 --seq 128 --micro-batch 8 --steps 25 --log-every 0 --eval-windows 1"
for p in $(seq "$pairs"); do
  $T --dp 1 $model "$@" | awk '/throughput/{print "distlab dp=1", $2, "tok/s"} /GEMM utilisation/{print "distlab dp=1 gemm", $3}'
  /usr/bin/python3 "$peers/torch_gpt.py" 1 1 20 5 | sed -n 's/.*tokens\/s=\([0-9]*\).*/pytorch 1x1 \1 tok\/s/p'
  $T --dp 2 $model "$@" | awk '/throughput/{print "distlab dp=2", $2, "tok/s"} /GEMM utilisation/{print "distlab dp=2 gemm", $3}'
  /usr/bin/python3 "$peers/torch_gpt.py" 2 1 20 5 | sed -n 's/.*tokens\/s=\([0-9]*\).*/pytorch ddp2x1 \1 tok\/s/p'
done
