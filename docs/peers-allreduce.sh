#!/bin/bash
# Reproduce the all-reduce comparison of docs/PERFORMANCE.md: distlab-bench coll and plain MPI
# (peers/mpi_coll.c: MPI_Allreduce of the MPI that mpicc and mpirun belong to) alternated A B A B
# in one session, then medians.
# Usage (from a build directory): SRC/docs/peers-allreduce.sh [pairs=4]
# Needs an MPI (apt-get install openmpi-bin libopenmpi-dev); MPICC and MPIRUN choose another one.
# Takes about 2 minutes per pair on 2 cores.
set -euo pipefail
pairs=${1:-4}
peers=$(cd "$(dirname "$0")/../peers" && pwd)
B=./apps/distlab-bench
[ -x "$B" ] || { echo "run from a build directory (./apps/distlab-bench not found)" >&2; exit 2; }
command -v "${MPICC:-mpicc}" >/dev/null || { echo "no ${MPICC:-mpicc}: apt-get install openmpi-bin libopenmpi-dev" >&2; exit 2; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"${MPICC:-mpicc}" -O2 "$peers/mpi_coll.c" -o "$tmp/mpi_coll"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
M="${MPIRUN:-mpirun}"
"$M" --version 2>&1 | grep -qi hydra || M="$M --oversubscribe"
mpi() { $M -n "$1" "$tmp/mpi_coll" allreduce "$2" "$3" 4 2>/dev/null |
        awk -v n="$1" '/^ +[0-9]/{print "mpi n=" n, $1, "B", $2, $4}'; }
out=$tmp/raw
for p in $(seq "$pairs"); do
  echo "pair $p of $pairs ..." >&2
  $B coll --ranks 2 -b 8 -e 64M -f 64 -n 20 > "$tmp/d2"
  awk '/STREAM copy: B =/{for(i=1;i<=NF;i++) if($i=="=") b=$(i+1)}
       /^ +[0-9]/{print "distlab n=2", $1, "B", $7, $9, "%lim", $10, "stream", b}' "$tmp/d2" >> "$out"
  for s in 8 1048576 67108864; do mpi 2 $s $s >> "$out"; done
  $B coll --ranks 4 -b 64M -e 64M -n 10 --stream 0 | awk '/^ +[0-9]/{print "distlab n=4", $1, "B", $7, $9}' >> "$out"
  mpi 4 67108864 67108864 >> "$out"
  $B coll --ranks 8 -b 8 -e 8 -n 20 --stream 0 | awk '/^ +[0-9]/{print "distlab n=8", $1, "B", $7, $9}' >> "$out"
  mpi 8 8 8 >> "$out"
  $B coll --ranks 16 -b 1M -e 1M -n 5 --stream 0 | awk '/^ +[0-9]/{print "distlab n=16", $1, "B", $7, $9, "wrong", $11}' >> "$out"
done
echo "# raw rows (tool, ranks, size, time us, busbw GB/s ...), $pairs alternating pairs"
cat "$out"
echo "# medians: tool ranks size | time_us busbw_GBs"
sort -k1,3 -s "$out" | awk '
  function med(a, n,   i, j, t) { for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
                                   return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
  { k = $1 " " $2 " " $3; if (k != prev && prev != "") { printf "%-24s | %10.2f %8.2f\n", prev, med(T, n), med(W, n); n = 0 }
    prev = k; n++; T[n] = $5; W[n] = $6 }
  END { if (n) printf "%-24s | %10.2f %8.2f\n", prev, med(T, n), med(W, n) }'
