#!/bin/sh
# distlab-bench coll measures the machine's limits in the same run and states each row against
# the one that applies (issue 18): the one-way hop (latency rows: hops = time / hop), the
# single-copy bandwidth at the row's size (rows whose buffers fit the L3: % of it, x threads / ranks
# when ranks share cores), STREAM copy at
# >= 4 x L3 (larger rows: % of B x the op's DRAM factor, (n-1)/n^2 for all-reduce). Checked: the
# limits are printed and positive, every row's limit kind follows the rule from the reported L3,
# its limit value is the printed limit, and its percentage or hop count is recomputed from the
# printed time and busbw; --dram sizes and the STREAM size are >= 4 x L3; --limits 0 prints none.
# Negative control: the same checker must reject a JSON whose percentage was doubled. No timings
# are asserted beyond "positive". Skips the JSON checks (77) without python3.
# shellcheck disable=SC2086 # $SMALL is an option list
SELF=test_bench_limits
. "${srcdir:-$(dirname "$0")/../..}/tests/apps/lib.sh"
APP=$(app_bin distlab-bench) || exit 1
: "${OPENBLAS_NUM_THREADS:=1}"
export OPENBLAS_NUM_THREADS
command -v python3 >/dev/null 2>&1 || { echo "$SELF: SKIPPED: no python3"; exit 77; }
SMALL="--stream-mib 4" # runs that check no DRAM figure: a small STREAM keeps them fast

# the checker: every figure of one coll --json against the others (rel. 2e-5: %.6g both sides)
cat >"$TMP/check.py" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
want_dram = len(sys.argv) > 2
L, n = d["limits"], d["ranks"]
assert L is not None, "no limits object"
def close(a, b, what):
    assert a is not None and b is not None and abs(a - b) <= 2e-5 * max(abs(a), abs(b)), (what, a, b)
assert L["hop_ns"] > 0 and L["hop_ns_after"] > 0, ("hop", L["hop_ns"], L["hop_ns_after"])
assert L["hop_cpus"][0] != L["hop_cpus"][1], L["hop_cpus"]
l3, st = L["l3_bytes"], L["stream"]
assert l3 > 0 and st["copy_gbs"] > 0 and st["copy_gbs_after"] > 0, st
assert st["dram_bytes"] == st["bytes_per_thread"] * L["threads"], st
assert st["dram_bytes"] >= 4 * l3 and st["dram_resident"], ("STREAM below 4 x L3", st, l3)
copy = {c["size"]: c["gbs"] for c in L["copy"]}
assert all(g > 0 for g in copy.values()), copy
kinds = set()
for r in d["rows"]:
    s = r["size"]
    kind = "hop" if s <= L["latency_max_bytes"] else "copy" if 2 * n * s <= l3 else "dram"
    assert r["limit"] == kind, ("limit kind", s, r["limit"], kind)
    kinds.add(kind)
    # copy: C x threads / ranks when the ranks share the threads' cores (issue 29)
    cl = copy.get(s, 0) * min(1.0, L["threads"] / n)
    lim = {"hop": L["hop_ns"], "copy": cl, "dram": st["copy_gbs"] * (n - 1) / n ** 2}[kind]
    close(r["limit_value"], lim, ("limit value", s))
    if want_dram:
        assert s >= 4 * l3 and kind == "dram", ("--dram row not DRAM-resident", s, l3)
    for mode in ("out_of_place", "in_place"):
        c = r[mode]
        if c is None:
            continue
        assert c["time_us"] > 0 and c["busbw_gbs"] > 0 and c["wrong"] in (0, None), c
        if kind == "hop":
            assert c["lim_pct"] is None, c
            close(c["hops"], c["time_us"] * 1e3 / lim, ("hops", s, mode))
        else:
            assert c["hops"] is None, c
            close(c["lim_pct"], 100 * c["busbw_gbs"] / lim, ("lim_pct", s, mode))
print(" ".join(sorted(kinds)))
PY

# 2 ranks, latency (8, 256 B) and cache-resident rows (16 KiB, 1 MiB where the L3 holds them)
if run "coll --json" 0 coll --ranks 2 -b 8 -e 1M -f 64 -n 2 -w 1 --json; then
  cp "$TMP/out" "$TMP/c.json"
  python3 "$TMP/check.py" "$TMP/c.json" >"$TMP/kinds" 2>"$TMP/py" ||
    fail "coll --json: limits inconsistent: $(tail -1 "$TMP/py")"
  grep -q hop "$TMP/kinds" || fail "coll --json: no latency row ($(cat "$TMP/kinds"))"
  # negative control: one percentage doubled must be caught
  python3 - "$TMP/c.json" "$TMP/bad.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    c = r["out_of_place"]
    if c["lim_pct"] is not None:
        c["lim_pct"] *= 2
        break
    c["hops"] *= 2
    break
json.dump(d, open(sys.argv[2], "w"))
PY
  python3 "$TMP/check.py" "$TMP/bad.json" >/dev/null 2>&1 &&
    fail "negative control: a doubled percentage passed the checker"
fi

# more ranks than PUs (threads = min(ranks, PUs) < ranks where PUs < 4): the copy limit scales
if run "coll --json 4 ranks" 0 coll --ranks 4 -b 16K -e 64K -f 4 -n 2 -w 1 --json; then
  python3 "$TMP/check.py" "$TMP/out" >/dev/null 2>"$TMP/py" ||
    fail "coll --json 4 ranks: limits inconsistent: $(tail -1 "$TMP/py")"
fi

# 3 ranks, text: the limits are printed, rows carry hops and percentages
if run "coll text" 0 coll --ranks 3 -b 8 -e 64K -f 8192 -n 2 -w 1 $SMALL; then
  has "coll text" "# limits, measured now"
  # the copy limit names what it copies: the unchanged buffers coll resends (issue 29)
  grep -Eq "^#   single-copy C \([0-9]+ threads, each memcpy's the previous one's unchanged buffer\)" \
    "$TMP/out" || fail "coll text: the single-copy line does not say it copies unchanged buffers"
  has "coll text" "C x threads / ranks when the ranks share cores"
  grep -Eq '^#   one-way hop \(cpus [0-9]+ <-> [0-9]+.*: [0-9.]+ ns$' "$TMP/out" ||
    fail "coll text: no one-way hop line"
  grep -Eq '^#   STREAM copy B = [0-9.]+ GB/s' "$TMP/out" || fail "coll text: no STREAM line"
  grep -Eq '^ +8 .* [0-9.]+h .* hop +[0-9.]+$' "$TMP/out" || fail "coll text: 8 B row without hops"
  grep -Eq '^ +65536 .* [0-9]+% .* (copy|dram) +[0-9.]+$' "$TMP/out" ||
    fail "coll text: 64 KiB row without a percentage"
  grep -q 'memory-bound limit\|limit B(n-1)' "$TMP/out" && fail "coll text: the old memory-bound limit is printed"
  has "coll text" "# limits after the run"
fi

# CSV: the limit columns, hops recomputed from the time
if run "coll --csv" 0 coll --ranks 2 -b 8 -e 8 -n 2 -w 1 --csv $SMALL; then
  awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
    { h = $col["oop_time_us"] * 1000 / $col["limit_value"]
      if ($col["limit"] != "hop" || $col["limit_value"] <= 0 || (h - $col["oop_hops"]) ^ 2 > 0.01 + 1e-4 * h * h) {
        print "bad row: " $0; bad = 1 } }
    END { exit bad + 0 }' "$TMP/out" >"$TMP/awk" || fail "coll --csv: $(cat "$TMP/awk")"
fi

# --dram: sizes >= 4 x L3, compared with STREAM (n-1)/n^2; skipped where the L3 makes that heavy
L3=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["limits"]["l3_bytes"])' "$TMP/c.json" 2>/dev/null)
if [ -n "$L3" ] && [ "$L3" -le $((64 << 20)) ]; then
  if run "coll --dram" 0 coll --ranks 2 --dram -n 1 -w 0 --inplace 0 --check 0 --json; then
    python3 "$TMP/check.py" "$TMP/out" dram >/dev/null 2>"$TMP/py" ||
      fail "coll --dram: $(tail -1 "$TMP/py")"
  fi
else
  echo "$SELF: --dram skipped (L3 ${L3:-unknown} > 64 MiB: its rows would need gigabytes)"
fi

# a small --stream-mib is said to be not DRAM-resident; --limits 0 measures nothing
if run "coll --stream-mib 1" 0 coll --ranks 2 -b 8 -e 8 -n 1 -w 0 --stream-mib 1; then
  has "--stream-mib 1" "NOT DRAM-resident"
fi
if run "coll --limits 0" 0 coll --ranks 2 -b 8 -e 8 -n 1 -w 0 --limits 0 --json; then
  python3 -c 'import json,sys; d = json.load(open(sys.argv[1])); assert d["limits"] is None
assert "limit" not in d["rows"][0] and d["rows"][0]["out_of_place"]["hops"] is None' "$TMP/out" ||
    fail "coll --limits 0: limits reported"
fi
run "coll --limits 2" 2 coll --limits 2
[ "$(wc -l <"$TMP/err")" -eq 1 ] || fail "coll --limits 2: not one line on stderr"
if run "coll --help" 0 coll --help; then
  for s in "vs lim" "one-way hop" "single-copy" "--dram" "4 x L3" "B(n-1)/n^2" "C x k / ranks" \
    "unchanged buffer" "fastest of their trials"; do has "--help" "$s"; done
fi

[ "$fails" -eq 0 ] && echo "$SELF: ok"
[ "$fails" -eq 0 ]
