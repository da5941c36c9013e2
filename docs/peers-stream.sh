#!/bin/bash
# distlab-bench stream against an independent STREAM (peers/stream.c, OpenMP), alternated A B:
# copy and triad GB/s at 1 .. N threads (default: the machine's PUs), the same bytes per thread.
# Usage (from a build directory): SRC/docs/peers-stream.sh [pairs=3] [MiB per array per thread=64]
# Needs a C compiler with OpenMP (gcc). About 10 s per pair and thread count on 2 cores.
set -euo pipefail
pairs=${1:-3}; mib=${2:-64}
peers=$(cd "$(dirname "$0")/../peers" && pwd)
B=./apps/distlab-bench
[ -x "$B" ] || { echo "run from a build directory (./apps/distlab-bench not found)" >&2; exit 2; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"${CC:-cc}" -O2 -fopenmp "$peers/stream.c" -o "$tmp/stream"
n=$(nproc)
for p in $(seq "$pairs"); do
  for t in $(seq "$n"); do
    $B stream --ranks "$t" --mib "$mib" --csv |
      awk -F, -v t="$t" '$1 == "compact" && $2 == t {print "distlab threads=" t, "copy", $5, "triad", $6}'
    OMP_NUM_THREADS=$t OMP_PROC_BIND=close "$tmp/stream" 7 $((mib * t)) |
      awk -v t="$t" '/^  copy/{c = $3} /^  triad/{print "peer    threads=" t, "copy", c, "triad", $3}'
  done
done | sort -s -k1,2 | awk '{print} END {print "# GB/s (10^9 B/s), medians of 7 trials each; distlab: compact placement"}'
