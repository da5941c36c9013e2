#!/bin/bash
# Reproduce issue 18's goals table of docs/PERFORMANCE.md: distlab-bench coll (with the limits it
# measures itself) and Open MPI (peers/mpi_coll.c) alternated in one session, ROUNDS rounds, then
# the median per figure with its range. Each round: 2 ranks at 8 B and 1 MiB, the --dram sizes,
# 8 ranks at 8 B, and 3 ranks at 8 B and 1 MiB while one external CPU-bound process spins.
# Usage (from a build directory): SRC/docs/peers-goals.sh [rounds=6]
# PEERS_GOALS_KEEP=DIR keeps every run's raw output in DIR. Besides the medians it prints each
# round's hop and key figures: hosts that switch cache-transfer modes show it there.
# Needs an MPI (apt-get install openmpi-bin libopenmpi-dev) and python3; MPICC and MPIRUN choose
# another MPI. About 40 s per round on an idle 2-core machine (minutes when it is loaded).
set -euo pipefail
rounds=${1:-6}
peers=$(cd "$(dirname "$0")/../peers" && pwd)
B=./apps/distlab-bench
[ -x "$B" ] || { echo "run from a build directory (./apps/distlab-bench not found)" >&2; exit 2; }
command -v "${MPICC:-mpicc}" >/dev/null || { echo "no ${MPICC:-mpicc}: apt-get install openmpi-bin libopenmpi-dev" >&2; exit 2; }
command -v python3 >/dev/null || { echo "no python3" >&2; exit 2; }
if [ -n "${PEERS_GOALS_KEEP:-}" ]; then tmp=$PEERS_GOALS_KEEP; mkdir -p "$tmp"
else tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT; fi
"${MPICC:-mpicc}" -O2 "$peers/mpi_coll.c" -o "$tmp/mpi_coll"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
M="${MPIRUN:-mpirun}"
"$M" --version 2>&1 | grep -qi hydra || M="$M --oversubscribe"
mpi() { $M -n "$1" "$tmp/mpi_coll" allreduce "$2" "$2" 2 2>/dev/null | awk '/^ +[0-9]/{print $1, $2, $4}'; }
C=(--inplace 0 -n 20 -w 5 --json)
for r in $(seq "$rounds"); do
  echo "round $r of $rounds, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
  $B coll --ranks 2 -b 8 -e 1M -f 131072 "${C[@]}" >"$tmp/d2.$r"
  { mpi 2 8; mpi 2 1048576; } >"$tmp/m2.$r"
  $B coll --ranks 2 --dram --inplace 0 -n 5 -w 2 --json >"$tmp/dram.$r"
  s=$(python3 -c 'import json,sys; print(" ".join(str(x["size"]) for x in json.load(open(sys.argv[1]))["rows"]))' "$tmp/dram.$r")
  for x in $s; do mpi 2 "$x"; done >"$tmp/mdram.$r"
  $B coll --ranks 8 -b 8 -e 8 "${C[@]}" >"$tmp/d8.$r"
  mpi 8 8 >"$tmp/m8.$r"
  sh -c 'while :; do :; done' & hog=$!
  $B coll --ranks 3 -b 8 -e 1M -f 131072 "${C[@]}" >"$tmp/d3.$r"
  { mpi 3 8; mpi 3 1048576; } >"$tmp/m3.$r"
  kill "$hog"; wait "$hog" 2>/dev/null || true
done
python3 - "$tmp" "$rounds" <<'PY'
import json, statistics, sys
d, R = sys.argv[1], int(sys.argv[2])
def dl(f, s):
    j = json.load(open(f"{d}/{f}"))
    return [r for r in j["rows"] if r["size"] == s][0]["out_of_place"], j
def mp(f, s):
    return [float(l.split()[k]) for l in open(f"{d}/{f}") if int(l.split()[0]) == s for k in (1, 2)]
rows = {}
def add(k, v): rows.setdefault(k, []).append(v)
for r in range(1, R + 1):
    a, j = dl(f"d2.{r}", 8); L = j["limits"]
    add("hop_ns", L["hop_ns"]); add("2r 8B dl us", a["time_us"]); add("2r 8B dl hops", a["hops"])
    t = mp(f"m2.{r}", 8)[0]; add("2r 8B mpi us", t); add("2r 8B dl/mpi", a["time_us"] / t)
    a, _ = dl(f"d2.{r}", 1048576)
    add("2r 1M copy bound GB/s", [c["gbs"] for c in L["copy"] if c["size"] == 1048576][0])
    add("2r 1M dl busbw", a["busbw_gbs"]); add("2r 1M dl % copy", a["lim_pct"])
    b = mp(f"m2.{r}", 1048576)[1]; add("2r 1M mpi busbw", b); add("2r 1M dl/mpi busbw", a["busbw_gbs"] / b)
    j = json.load(open(f"{d}/dram.{r}")); add("STREAM copy GB/s", j["limits"]["stream"]["copy_gbs"])
    for x in j["rows"]:
        s, c = x["size"], x["out_of_place"]
        add(f"2r {s >> 20}M dl busbw", c["busbw_gbs"]); add(f"2r {s >> 20}M dl % dram", c["lim_pct"])
        add(f"2r {s >> 20}M mpi busbw", mp(f"mdram.{r}", s)[1])
    a, _ = dl(f"d8.{r}", 8); t = mp(f"m8.{r}", 8)[0]
    add("8r 8B dl us", a["time_us"]); add("8r 8B mpi us", t); add("8r 8B dl/mpi", a["time_us"] / t)
    for s in (8, 1048576):
        a, _ = dl(f"d3.{r}", s); t = mp(f"m3.{r}", s)[0]
        add(f"3r+spinner {s} B dl us", a["time_us"]); add(f"3r+spinner {s} B mpi us", t)
        add(f"3r+spinner {s} B dl/mpi", a["time_us"] / t)
keys = ["hop_ns", "2r 8B dl hops", "2r 8B dl/mpi", "2r 1M dl % copy", "2r 128M dl % dram",
        "8r 8B dl/mpi", "3r+spinner 8 B dl/mpi"]
print("# per round: " + " | ".join(k for k in keys if k in rows))
for r in range(R):
    print(f"round {r + 1:2d}: " + " | ".join(f"{rows[k][r]:.4g}" for k in keys if k in rows))
print(f"# medians over {R} rounds (min - max); ratios per round, then their median")
for k, v in rows.items():
    print(f"{k:28s} {statistics.median(v):10.4g}   ({min(v):.4g} - {max(v):.4g})")
PY
