#!/bin/bash
# Reproduce the trainer comparison of docs/PERFORMANCE.md: distlab-train and PyTorch
# (peers/torch_gpt.py, Debian's python3-torch) on the same model, alternated A B A B.
# Usage (from a build directory): SRC/docs/peers-train.sh [pairs=3] [extra distlab-train flags]
# Needs python3-torch (apt-get install python3-torch). About 1 minute per pair on 2 cores.
set -euo pipefail
pairs=${1:-3}
shift $(( $# > 0 ? 1 : 0 ))
peers=$(cd "$(dirname "$0")/../peers" && pwd)
T=./apps/distlab-train
PY=${PYTHON:-/usr/bin/python3}
[ -x "$T" ] || { echo "run from a build directory (./apps/distlab-train not found)" >&2; exit 2; }
"$PY" -c 'import torch' 2>/dev/null || { echo "$PY cannot import torch: apt-get install python3-torch" >&2; exit 2; }
model="--layers 4 --d-model 256 --heads 4 --seq 128 --micro-batch 8 --steps 25 --log-every 0 --eval-windows 1"
torch() { "$PY" "$peers/torch_gpt.py" --procs "$1" --threads 1 --steps 20 --warmup 5 |
          sed -n "s/.*tokens\/s=\([0-9]*\).*/pytorch $2 \1 tok\/s/p"; }
for p in $(seq "$pairs"); do
  echo "pair $p of $pairs ..." >&2
  $T --dp 1 $model "$@" | awk '/throughput/{print "distlab dp=1", $2, "tok/s"} /GEMM utilisation/{print "distlab dp=1 gemm", $3}'
  torch 1 1x1
  $T --dp 2 $model "$@" | awk '/throughput/{print "distlab dp=2", $2, "tok/s"} /GEMM utilisation/{print "distlab dp=2 gemm", $3}'
  torch 2 ddp2x1
done
