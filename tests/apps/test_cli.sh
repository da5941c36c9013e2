#!/bin/sh
# Command-line contract of distlab-bench: version, help, usage errors (exit 2, one line on
# stderr), the collective benchmark's correctness column, CSV and JSON output, and the
# synthetic-topology report. Run by `make check` from the build directory.
# DISTLAB_TEST_SCALE=small: smaller sizes (sanitizer builds).

SELF=test_cli
. "$(dirname "$0")/lib.sh"
APP=$(app_bin distlab-bench) || exit 1
: "${OPENBLAS_NUM_THREADS:=1}"
export OPENBLAS_NUM_THREADS

if [ "$DISTLAB_TEST_SCALE" = small ]; then
  MAX3=4K; MAXALL=1K; ITERS=2
else
  MAX3=64K; MAXALL=4K; ITERS=3
fi
# a small STREAM array keeps the test fast; the measurement itself is still exercised
STREAM="--stream-mib 4"

# after a wrong status: the command, stderr and the tail of stdout; after a right one, "ok:"
run_failed() {
  shift
  echo "  command: $*"
  sed 's/^/  stderr: /' "$TMP/err" | head -20
  sed 's/^/  stdout: /' "$TMP/out" | tail -10
}
run_passed() { echo "ok: $1"; }

# bad_usage NAME ARGS...: status 2 and exactly one line on stderr (any words)
bad_usage() {
  name=$1; shift
  if run "$name" 2 "$@"; then
    n=$(wc -l <"$TMP/err")
    [ "$n" -eq 1 ] || fail "$name: $n lines on stderr, expected 1: $(cat "$TMP/err")"
  fi
}

if run "--version" 0 --version; then
  grep -q '^distlab-bench (distlab) [0-9][0-9.]*' "$TMP/out" || fail "--version printed: $(cat "$TMP/out")"
fi
if run "--help" 0 --help; then
  grep -q 'coll' "$TMP/out" && grep -q 'topo' "$TMP/out" || fail "--help does not list coll and topo"
fi
run "coll --help" 0 coll --help
bad_usage "bad option" --no-such-option
bad_usage "bad coll option" coll --no-such-option
run "help scaling" 0 --help && has "help scaling" "scaling over dp and tp, strong over pp"
# did you mean, in each option parser: coll's, topo's, the subcommands' shared one
for sub in coll topo gemm; do
  usage_error "$sub did you mean" "unknown option '--rnks' (did you mean '--ranks'?" $sub --rnks 2
done
bad_usage "unknown subcommand" no-such-subcommand
bad_usage "coll --ranks 0" coll --ranks 0
bad_usage "coll --ranks x" coll --ranks x
bad_usage "coll -b without a value" coll -b
bad_usage "coll --dtype f16" coll --dtype f16
bad_usage "coll --root 2 --ranks 2" coll --root 2 --ranks 2

# CSV: every data row checked and right (3 ranks: uneven blocks, odd ring).
if run "coll --ranks 3 --csv" 0 coll --ranks 3 -b 8 -e "$MAX3" -n "$ITERS" -w 1 --csv $STREAM; then
  awk -F, '
    NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i
              if (!("oop_wrong" in col) || !("ip_wrong" in col)) { print "no #wrong columns"; bad = 1 }
              next }
    { rows++
      if ($col["oop_wrong"] != "0" || $col["ip_wrong"] != "0") { print "wrong values: " $0; bad = 1 } }
    END { if (rows < 2) { print "only " rows + 0 " data rows"; bad = 1 }
          exit bad }' "$TMP/out" >"$TMP/awk" || fail "coll --ranks 3 --csv: $(cat "$TMP/awk")"
fi

# Every op, two ranks.
if run "coll --op all" 0 coll --op all --ranks 2 -b 8 -e "$MAXALL" -n 2 -w 1 $STREAM; then
  for op in allreduce reducescatter allgather broadcast reduce alltoall sendrecv alltoallv; do
    grep -q "^# $op:" "$TMP/out" || fail "coll --op all: no $op section"
  done
  grep -q '^# Out of bounds values : 0 OK' "$TMP/out" || fail "coll --op all: no 'Out of bounds values : 0 OK' line"
  grep -q '^# Avg bus bandwidth' "$TMP/out" || fail "coll --op all: no 'Avg bus bandwidth' line"
  grep -q '^# [0-9]* rows, 0 wrong' "$TMP/out" || fail "coll --op all: no 'rows, 0 wrong' line"
fi

# alltoallv's --counts patterns, each exact on 3 ranks (skew: rank 2 receives nothing, rank 0
# about twice the mean); the JSON names the pattern, busbw = algbw x 2/3 (uniform and skew: the
# part that crosses ranks) and skew's copy limit carries that factor (C x 2 threads / 3 ranks x
# 2/3; the limits measured for that run only, to keep the test fast); an unknown pattern is bad
# usage.
for pat in uniform uneven skew; do
  lim="--limits 0"; [ $pat = skew ] && lim=$STREAM
  if run "coll alltoallv --counts $pat" 0 coll --op alltoallv --counts $pat --ranks 3 -b 8 -e 64K -f 8 -n 2 -w 1 --json $lim &&
     command -v python3 >/dev/null 2>&1; then
    python3 - "$pat" "$TMP/out" <<'PY' 2>"$TMP/py" || fail "coll alltoallv --counts $pat: $(tail -1 "$TMP/py")"
import json, sys
pat, d = sys.argv[1], json.load(open(sys.argv[2]))
assert d["counts"] == pat and d["wrong_total"] == 0 and len(d["rows"]) >= 2, d["counts"]
L = d["limits"] or {"copy": [], "threads": 0}
gbs = {c["size"]: c["gbs"] for c in L["copy"]}
k, ncopy = min(1.0, L["threads"] / 3), 0
for r in d["rows"]:
    o = r["out_of_place"]
    if pat != "uneven" and r["size"] > 0:  # size 0: under one element per peer, nothing moves
        # JSON numbers have 6 significant digits (%.6g): 1e-5 relative
        assert abs(o["busbw_gbs"] - o["algbw_gbs"] * 2 / 3) <= 1e-5 * o["algbw_gbs"], r
        if r.get("limit") == "copy":
            want = gbs[r["size"]] * k * 2 / 3
            assert abs(r["limit_value"] - want) <= 1e-5 * want, (r, want)
            ncopy += 1
assert pat != "skew" or ncopy >= 1, "no copy row checked"
PY
  fi
done
bad_usage "coll --counts bogus" coll --op alltoallv --counts bogus

# bf16 average and f64 max on 4 ranks (exact inputs; avg within one rounding).
run "coll bf16 avg" 0 coll --op allreduce,reducescatter,reduce --ranks 4 -d bf16 -o avg -b 8 -e "$MAXALL" -n 2 -w 1 --stream 0
run "coll f64 max" 0 coll --op allreduce,allgather --ranks 4 -d f64 -o max -b 8 -e "$MAXALL" -n 2 -w 1 --stream 0

# JSON parses (when python3 is there) and has rows.
if run "coll --json" 0 coll --ranks 2 -b 8 -e "$MAXALL" -n 2 -w 1 --json $STREAM; then
  if command -v python3 >/dev/null 2>&1; then
    python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["rows"], "no rows"
assert all(r["out_of_place"]["wrong"] == 0 for r in d["rows"]), "wrong values"
assert d["ranks"] == 2
' <"$TMP/out" 2>"$TMP/py" || fail "coll --json: $(tail -1 "$TMP/py")"
  else
    grep -q '"rows"' "$TMP/out" || fail "coll --json: no rows"
  fi
fi

# The synthetic topology is reported as such.
if run "topo synthetic" 0 topo --ranks 4 --topology "pack:2 l3:2 core:4 pu:1"; then
  grep -q synthetic "$TMP/out" || fail "topo --topology: output does not say 'synthetic'"
fi
# Where the trainer's mesh lands: 16 ranks on 2 packages of 2 L3s of 4 cores; tp 4 groups fill
# one L3 each, dp 2 pairs sit in one package (node), pp 2's stage boundaries cross packages.
if run "topo mesh" 0 topo --ranks 16 --topology "pack:2 l3:2 core:4 pu:1" --tp 4 --pp 2; then
  grep -q 'tp groups: 4 of 4 ranks each; inside one L3 4, one NUMA node 4, one node 4' "$TMP/out" ||
    fail "topo mesh: tp groups line: $(grep 'tp groups' "$TMP/out")"
  grep -q 'dp groups: 8 of 2 ranks each; inside one L3 0, one NUMA node .*, one node 8' "$TMP/out" ||
    fail "topo mesh: dp groups line: $(grep 'dp groups' "$TMP/out")"
  grep -q 'pp hand-offs (8 stage boundaries): crossing an L3 8, .* a node 8' "$TMP/out" ||
    fail "topo mesh: pp line: $(grep 'pp hand-offs' "$TMP/out")"
fi
run "topo mesh that does not divide" 2 topo --ranks 6 --tp 4

finish "all checks passed"
