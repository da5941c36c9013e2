#!/usr/bin/env bash
# tests/stress.sh: run test suites many times in a row, alone and beside one CPU-bound process
# per core, and print each test's pass count: a flaky test shows up here before it blocks CI.
#
#   tests/stress.sh [-n N] [--alone | --loaded] [--small] SUITE...   (from the build directory)
#   tests/stress.sh --quick                                           (what .ci/run runs)
#
# SUITE is a test program (tests/test_chan) or script (tests/apps/test_cli.sh); `make check` or
# `make SUITE` builds it. Under load CK_TIMEOUT_MULTIPLIER is raised (4 unless set) since Check's
# timeouts are the only time bounds the unit tests keep besides the forced and watchdog ones.
# --quick: the transport, runtime and collective suites, reduced tier, twice under load (about 2.5 min on 2 cores).
# Exit status 0 when every run of every test passed, 1 otherwise, 2 for bad usage.
set -u

usage() {
  sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
}

QUICK_SUITES="tests/test_chan tests/test_chan_fallback tests/test_world tests/test_comm \
  tests/test_coll tests/test_p2p tests/test_rd tests/test_alltoallv"
n=20 modes="alone loaded" small=0 suites=()
while [ $# -gt 0 ]; do
  case "$1" in
  -n)
    [ $# -ge 2 ] && [ "$2" -ge 1 ] 2>/dev/null || { echo "stress.sh: -n needs a count >= 1" >&2; exit 2; }
    n=$2; shift ;;
  --alone) modes=alone ;;
  --loaded) modes=loaded ;;
  --small) small=1 ;;
  --quick) n=2 modes=loaded small=1; read -r -a suites <<<"$QUICK_SUITES" ;;
  -h | --help) usage; exit 0 ;;
  -*) echo "stress.sh: unknown option '$1' (--help lists them)" >&2; exit 2 ;;
  *) suites+=("$1") ;;
  esac
  shift
done
[ ${#suites[@]} -gt 0 ] || { echo "stress.sh: no suite named (--help)" >&2; exit 2; }

# build what is missing (the programs; scripts are run as they are)
missing=()
for s in "${suites[@]}"; do
  case "$s" in *.sh) ;; *) [ -x "$s" ] || missing+=("$s") ;; esac
done
if [ ${#missing[@]} -gt 0 ]; then
  make -s "${missing[@]}" >/dev/null || { echo "stress.sh: cannot build ${missing[*]}" >&2; exit 2; }
fi

export OPENBLAS_NUM_THREADS=1 CK_VERBOSITY=verbose CK_DEFAULT_TIMEOUT=300
[ "$small" = 1 ] && export DISTLAB_TEST_SCALE=small
tmp=$(mktemp -d)
hogs=()
stop_hogs() {
  [ ${#hogs[@]} -gt 0 ] && kill "${hogs[@]}" 2>/dev/null
  wait "${hogs[@]}" 2>/dev/null
  hogs=()
}
trap 'stop_hogs; rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM

# one run of a suite: Check's verbose lines give each test's verdict ("file:line:P:tcase:test:i:
# Passed"); a script counts as one test, passed when it exits 0 (77: skipped)
run_one() { # run_one SUITE MODE LOG
  local out=$tmp/out rc
  "$1" >"$out" 2>&1
  rc=$?
  if grep -q '^Running suite' "$out"; then
    awk -F: -v m="$2" -v s="$1" '$3 ~ /^[PFE]$/ && NF >= 6 {
        k = s " " $5 ":" $6; v = ($3 == "P") ? "pass" : "fail"; print m, k, v }' "$out" >>"$3"
    [ "$rc" -eq 0 ] || grep -q ':[FE]:' "$out" || echo "$2 $1 (exit $rc) fail" >>"$3"
  else
    case $rc in 0) v=pass ;; 77) v=skip ;; *) v=fail ;; esac
    echo "$2 $1 $v" >>"$3"
  fi
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ]; then
    echo "  $1 ($2): exit $rc; its failures:"
    grep -E ':[FE]:|FAIL|fail' "$out" | head -5 | sed 's/^/    /'
  fi
}

log=$tmp/log
: >"$log"
t0=$(date +%s)
for mode in $modes; do
  if [ "$mode" = loaded ]; then
    for _ in $(seq "$(nproc)"); do sh -c 'while :; do :; done' & hogs+=($!); done
    export CK_TIMEOUT_MULTIPLIER=${CK_TIMEOUT_MULTIPLIER:-4}
  fi
  for i in $(seq "$n"); do
    echo "stress: $mode, run $i/$n ($(( $(date +%s) - t0 )) s)"
    for s in "${suites[@]}"; do run_one "$s" "$mode" "$log"; done
  done
  stop_hogs
done

echo "stress: pass counts ($n runs each, $(nproc) cores, $(( $(date +%s) - t0 )) s in all)"
awk '{ v = $NF; $NF = ""; k = $0; runs[k]++; if (v == "pass") p[k]++; if (v == "skip") sk[k]++ }
     END { for (k in runs) printf "%s%d/%d%s\n", k, p[k], runs[k] - sk[k], sk[k] ? " (" sk[k] " skipped)" : "" }' \
  "$log" | sort >"$tmp/counts"
cat "$tmp/counts"
bad=$(awk '{ split($NF, a, "/"); if (a[1] != a[2]) n++ } END { print n + 0 }' "$tmp/counts")
if [ "$bad" -eq 0 ]; then
  echo "stress: every test passed every run ($(wc -l <"$tmp/counts") tests and modes)"
  exit 0
fi
awk '{ split($NF, a, "/"); if (a[1] != a[2]) print "  FLAKY " $0 }' "$tmp/counts"
echo "stress: $bad tests failed at least once"
exit 1
