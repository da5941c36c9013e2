#!/usr/bin/env bash
# A/B speed check of two git revisions (issues 16 and 17: "no speed change"). Builds OLD and NEW in a
# temporary directory, then runs them alternately and prints, for each metric, the median over
# the rounds of the NEW/OLD ratio beside an A/A figure (a second OLD run against the first: the
# noise of this machine at this moment) and the goal. A measurement, not a test: exit status 0
# whatever the numbers, 1 when a build fails, 2 on bad usage. docs/PERFORMANCE.md has the table.
set -uo pipefail

usage() {
  cat <<'EOF'
Usage: docs/ab-bench.sh [OPTIONS] OLD NEW

Builds the git revisions OLD and NEW (any rev: main, HEAD~3, a hash) of this repository with
./bootstrap && ./configure -q && make -j2, then runs N rounds; each round runs OLD, NEW and OLD
again (the order rotating from round to round) on:
  train 1 rank   distlab-train tokens/s, the benchmark model (--layers 4 --d-model 256
                 --heads 4 --seq 128 --micro-batch 8), the JSON summary's tokens_per_s
  train dp 2     the same on 2 data-parallel ranks
  train zero 3   the same on 2 data-parallel ranks with --zero 3
  train pp 2     the same as a 2-stage pipeline (--pp 2 --microbatches 4, GPipe)
  busbw 1 MiB    distlab-bench coll all-reduce, 2 ranks, f32, out of place: busbw
  busbw 64 MiB   the same at 64 MiB
  latency 8 B    the same at 8 bytes: time per call
and prints per metric the median of OLD and NEW, the median over rounds of NEW/OLD
(latency: OLD time / NEW time, so that higher is better everywhere), the A/A median
(OLD second run / OLD first run) and the goal: >= 0.97 (latency >= 0.95).

Options:
  --pairs N       rounds (default 5; the issue asks for at least 5)
  --steps N       trainer steps per run (default 30: about 5 s per run on a quiet 2-core host)
  --quick         a smoke test of the script: 3 trainer steps, short collective runs
                  (use with --pairs 1; the figures mean nothing)
  --coretype X    OPENBLAS_CORETYPE for every run of both builds (default: the
                  environment's; unset: OpenBLAS's own choice, the same for both)
  --workdir DIR   build in DIR (kept afterwards) instead of a temporary directory
  -h, --help      this help
EOF
}

die() { echo "ab-bench.sh: $*" >&2; exit 2; }

pairs=5 steps=30 quick=0 workdir="" keep=0
coretype_set=0 coretype=""
while [ $# -gt 0 ]; do
  case $1 in
    -h|--help) usage; exit 0 ;;
    --pairs) [ $# -ge 2 ] || die "--pairs needs a value"; pairs=$2; shift 2 ;;
    --steps) [ $# -ge 2 ] || die "--steps needs a value"; steps=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    --coretype) [ $# -ge 2 ] || die "--coretype needs a value"; coretype=$2; coretype_set=1; shift 2 ;;
    --workdir) [ $# -ge 2 ] || die "--workdir needs a value"; workdir=$2; keep=1; shift 2 ;;
    -*) die "unknown option $1 (--help lists them)" ;;
    *) break ;;
  esac
done
[ $# -eq 2 ] || die "need two revisions, OLD and NEW (--help)"
case $pairs in ''|*[!0-9]*|0) die "--pairs: a positive integer, not '$pairs'" ;; esac
case $steps in ''|*[!0-9]*|0) die "--steps: a positive integer, not '$steps'" ;; esac

repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel) || die "not inside a git checkout"
old=$(git -C "$repo" rev-parse --verify -q "$1^{commit}") || die "OLD: no such revision '$1'"
new=$(git -C "$repo" rev-parse --verify -q "$2^{commit}") || die "NEW: no such revision '$2'"

if [ "$coretype_set" = 1 ]; then
  if [ -n "$coretype" ]; then export OPENBLAS_CORETYPE=$coretype; else unset OPENBLAS_CORETYPE; fi
fi
export OPENBLAS_NUM_THREADS=1

if [ -z "$workdir" ]; then
  workdir=$(mktemp -d "${TMPDIR:-/tmp}/ab-bench.XXXXXX") || die "mktemp failed"
else
  mkdir -p "$workdir" || die "cannot create $workdir"
fi
[ "$keep" = 1 ] || trap 'rm -rf "$workdir"' EXIT

# build REV DIR: a clean export of REV (git archive: no worktree to unregister), built as a
# user builds it. The build's output goes to DIR.build.log (its end is shown when it fails).
build() {
  local rev=$1 dir=$2
  echo "building ${rev:0:12} in $dir"
  if ! { rm -rf "$dir" && mkdir -p "$dir" && git -C "$repo" archive "$rev" | tar -x -C "$dir" &&
         (cd "$dir" && ./bootstrap && ./configure -q && make -j2) >"$dir.build.log" 2>&1; }; then
    echo "ab-bench.sh: building ${rev:0:12} failed; the end of its log:" >&2
    tail -n 20 "$dir.build.log" >&2
    exit 1
  fi
}
build "$old" "$workdir/old"
if [ "$new" = "$old" ]; then
  echo "NEW is OLD (${old:0:12}): one build serves both"
  newdir=$workdir/old
else
  build "$new" "$workdir/new"
  newdir=$workdir/new
fi
olddir=$workdir/old

# ---- the measurements; each prints one number (empty when the run failed) ----

MODEL="--layers 4 --d-model 256 --heads 4 --seq 128 --micro-batch 8"
if [ "$quick" = 1 ]; then steps=3; COLL_ITERS="-n 3 -w 1"; else COLL_ITERS="-n 20 -w 5"; fi
scratch=$workdir/run.json

# train DIR OPTIONS...: tokens/s of the summary record (tokens_per_s = global batch x seq /
# median ms) of the benchmark model trained with OPTIONS (the layout)
train() {
  local dir=$1
  shift
  rm -f "$scratch"
  # shellcheck disable=SC2086 # MODEL is a list of options
  "$dir/apps/distlab-train" "$@" $MODEL --steps "$steps" --log-every 0 --eval-every 0 \
    --eval-windows 1 --json "$scratch" >/dev/null 2>"$workdir/run.err" || return 0
  sed -n 's/.*"type":"summary".*"tokens_per_s":\([-0-9.eE+]*\).*/\1/p' "$scratch"
}

# coll DIR: "latency_us busbw_1M busbw_64M" of one distlab-bench coll run (2 ranks, f32 sum,
# out of place, sizes 64M, 1M, 16K, 256, 8; CSV columns size, oop_time_us, oop_busbw_gbs)
coll() {
  # shellcheck disable=SC2086 # COLL_ITERS is a list of options
  "$1/apps/distlab-bench" coll --ranks 2 -b 8 -e 64M -f 64 --inplace 0 --stream 0 $COLL_ITERS \
    --csv 2>"$workdir/run.err" |
    awk -F, '$3 == 8 { lat = $9 } $3 == 1048576 { m1 = $11 } $3 == 67108864 { m64 = $11 }
             function v(x) { return x == "" ? "nan" : x }
             END { print v(lat), v(m1), v(m64) }'
}

# run_all DIR: one line "train1 train2 trainz3 trainpp2 latency busbw1M busbw64M"
run_all() {
  local t1 t2 t3 t4
  t1=$(train "$1" --dp 1)
  t2=$(train "$1" --dp 2)
  t3=$(train "$1" --dp 2 --zero 3)
  t4=$(train "$1" --pp 2 --microbatches 4)
  echo "${t1:-nan} ${t2:-nan} ${t3:-nan} ${t4:-nan} $(coll "$1")"
}

# ---- the machine ----

cpuinfo() { sed -n "s/^$1[[:space:]]*: //p" /proc/cpuinfo | head -1; }
echo "machine: $(cpuinfo 'model name') (family $(cpuinfo 'cpu family'), model $(cpuinfo model))," \
  "$(nproc) CPUs; kernel $(uname -r)"
echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE-(unset)} for both builds; OPENBLAS_NUM_THREADS=1"
"$olddir/apps/distlab-bench" gemm --quick --ranks 1 --csv 2>/dev/null | grep -E '^# (OpenBLAS|blas_kernel)'
echo "OLD ${old:0:12} ($1), NEW ${new:0:12} ($2); $pairs rounds, $steps trainer steps per run"
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"

# ---- the rounds: OLD (a), NEW (b) and OLD again (c), the order rotating ----

raw=$workdir/raw.txt
: >"$raw"
printf '%5s %-4s %12s %12s %12s %12s %7s %12s %13s\n' round run train1_tok/s train2_tok/s \
  zero3_tok/s pp2_tok/s lat8_us busbw1M_GB/s busbw64M_GB/s
for ((i = 0; i < pairs; i++)); do
  case $((i % 3)) in
    0) order="a b c" ;;
    1) order="b c a" ;;
    *) order="c a b" ;;
  esac
  for slot in $order; do
    case $slot in b) dir=$newdir ;; *) dir=$olddir ;; esac
    line=$(run_all "$dir")
    echo "$i $slot $line" >>"$raw"
    case $slot in a) label=OLD ;; b) label=NEW ;; *) label=OLD2 ;; esac
    echo "$((i + 1)) $label $line" |
      awk '{ printf "%5d %-4s %12.1f %12.1f %12.1f %12.1f %7.3f %12.3f %13.3f\n", $1, $2, $3, $4, $5,
             $6, $7, $8, $9 }'
  done
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"

# ---- the report: per metric, medians of the values and of the per-round ratios ----

echo
awk '
function median(v, n,   i, j, t) {
  if (n == 0) return "nan"
  for (i = 2; i <= n; i++) { t = v[i]; for (j = i - 1; j >= 1 && v[j] > t; j--) v[j + 1] = v[j]; v[j + 1] = t }
  return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
}
function ok(x) { return x != "nan" && x + 0 > 0 }
{ for (m = 1; m <= 7; m++) val[$1, $2, m] = $(m + 2)
  if ($1 + 1 > rounds) rounds = $1 + 1 }
END {
  split("train 1 rank (tokens/s)|train dp 2 (tokens/s)|train dp 2 zero 3 (tok/s)|train pp 2 (tokens/s)|latency 8 B (us)|busbw 1 MiB (GB/s)|busbw 64 MiB (GB/s)", name, "|")
  printf "%-24s %12s %12s %10s %8s %8s  %s\n", "metric", "OLD median", "NEW median", "NEW/OLD", "A/A", "goal", "verdict"
  lat = 5 # the latency column: a time
  for (m = 1; m <= 7; m++) {
    goal = m == lat ? 0.95 : 0.97
    na = nb = nr = nq = 0
    for (r = 0; r < rounds; r++) {
      a = val[r, "a", m]; b = val[r, "b", m]; c = val[r, "c", m]
      if (ok(a)) A[++na] = a
      if (ok(b)) B[++nb] = b
      # latency is a time: OLD/NEW, so that a ratio above 1 is faster everywhere
      if (ok(a) && ok(b)) R[++nr] = m == lat ? a / b : b / a
      if (ok(a) && ok(c)) Q[++nq] = m == lat ? a / c : c / a
    }
    ratio = median(R, nr); aa = median(Q, nq)
    verdict = ratio == "nan" ? "no data" : ratio >= goal ? "PASS" : "BELOW GOAL"
    if (ratio != "nan" && aa != "nan" && (aa < goal || aa > 2 - goal)) verdict = verdict " (A/A outside the goal: too noisy to decide)"
    printf "%-24s %12.4g %12.4g %10s %8s %8s  %s\n", name[m], median(A, na), median(B, nb),
      ratio == "nan" ? ratio : sprintf("%.3f", ratio), aa == "nan" ? aa : sprintf("%.3f", aa), ">= " goal, verdict
    delete A; delete B; delete R; delete Q
  }
  print "(median over " rounds " rounds of the per-round ratio; A/A: the second OLD run over the first)"
}' "$raw"
exit 0
