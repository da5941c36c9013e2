#!/bin/sh
# distlab-bench gemm / stream / overlap / contention (and scaling, overhead, pipeline, ckpt load below): each runs in --quick mode and exits 0, its --csv and
# --json output parse (python3 when present), bad options exit 2 with one line on stderr, --plot
# writes its data and script, and the harness's arithmetic (contention factor, hidden fraction)
# holds on synthetic timings (`distlab-bench selftest`, which exits 1 on any mismatch).
# DISTLAB_TEST_SCALE=small: even smaller sizes (sanitizer builds).

SELF=test_bench_harness
. "$(dirname "$0")/lib.sh"
APP=$(app_bin distlab-bench) || exit 1
: "${OPENBLAS_NUM_THREADS:=1}"
export OPENBLAS_NUM_THREADS

# Keep every run short: two ranks, tiny model and arrays (the code paths are what is tested).
if [ "$DISTLAB_TEST_SCALE" = small ]; then
  GEMM="--quick --ranks 2 --d-model 32 --seq 16 --micro-batch 2 --iters 2"
  STREAM="--quick --ranks 2 --mib 1 --trials 2"
  OVERLAP="--quick --ranks 2 --max 256K --trials 2 --gemm-dim 32"
  CONTENTION="--quick --ranks 1 --iters 10"
else
  GEMM="--quick --ranks 2 --d-model 64 --seq 32 --micro-batch 4"
  STREAM="--quick --ranks 2 --mib 4"
  OVERLAP="--quick --ranks 2 --max 1M --gemm-dim 64"
  CONTENTION="--quick --ranks 2 --iters 20"
fi

# after a wrong status: the first lines of stderr
run_failed() { sed 's/^/  | /' "$TMP/err" | head -5; }
HAVE_PY=0
command -v python3 >/dev/null 2>&1 && HAVE_PY=1

# the arithmetic on synthetic timings
run selftest 0 selftest
grep -q '^selftest: ok$' "$TMP/out" || fail "selftest: no 'selftest: ok'"

for sub in gemm stream overlap contention; do
  eval "args=\$$(echo $sub | tr a-z A-Z)"
  # shellcheck disable=SC2086
  run "$sub text" 0 $sub $args
  grep -q '^# OpenBLAS: ' "$TMP/out" || fail "$sub: no OpenBLAS line in the machine facts"
  grep -q '^# machine: ' "$TMP/out" || fail "$sub: no machine line"
  # shellcheck disable=SC2086
  run "$sub csv" 0 $sub $args --csv
  cp "$TMP/out" "$TMP/$sub.csv"
  # shellcheck disable=SC2086
  run "$sub json" 0 $sub $args --json
  cp "$TMP/out" "$TMP/$sub.jsonl"
  if [ $HAVE_PY = 1 ]; then
    python3 - "$TMP/$sub.csv" "$TMP/$sub.jsonl" "$sub" <<'PY' || fail "$sub: CSV/JSON do not parse or disagree"
import csv, json, math, sys
csvf, jsonf, sub = sys.argv[1:]
rows = list(csv.DictReader(l for l in open(csvf) if not l.startswith('#')))
assert rows, "no CSV rows"
recs = [json.loads(l) for l in open(jsonf)]
kinds = [r["type"] for r in recs]
assert kinds[0] == "config" and kinds[-1] == "summary", kinds
assert set(kinds[1:-1]) == ({"row", "pipeline"} if sub == "contention" else {"row"}), kinds
for r in recs:
    assert r["schema"] == "distlab/1" and r["app"] == "distlab-bench" and r["subcommand"] == sub
assert "openblas" in recs[0]["machine"] and recs[0]["machine"]["pus"] >= 1
assert recs[-1]["status"] == "ok"
body = [r for r in recs if r["type"] == "row"]
assert len(body) == len(rows), (len(body), len(rows))
if sub == "gemm":
    assert [int(r["ranks"]) for r in rows] == [1, 2]
    assert abs(float(rows[0]["contention"]) - 1) < 1e-9
    for r in body: assert r["gflops_per_rank"] > 0 and r["contention"] > 0
elif sub == "stream":
    assert {r["policy"] for r in rows} == {"compact", "scatter"}
    for r in body: assert r["copy_gbs"] > 0 and r["triad_gbs"] > 0
elif sub == "contention":
    # two passes: ranks that fit and twice as many, three sizes each in --quick
    assert len({int(r["ranks"]) for r in rows}) == 2 and len(rows) == 6, rows
    for r in body:
        assert 0 <= r["wait_pct"] <= 100 and abs(r["wait_pct"] + r["work_pct"] - 100) < 1e-9
        assert r["us_per_op"] > 0 and r["sleeps_per_op"] >= 0
        assert r["wait_mode"] == ("yield" if r["oversubscribed"] else "spin")
    # the pipeline engine on the stage counts that are at least 2: work + wait + other = 100
    pipe = [r for r in recs if r["type"] == "pipeline"]
    assert pipe, "no pipeline records"
    for r in pipe:
        assert r["stages"] >= 2 and r["microbatches"] == 2 * r["stages"] and r["ms_per_step"] > 0
        assert abs(r["work_pct"] + r["wait_pct"] + r["other_pct"] - 100) < 1e-6, r
        assert 0 < r["work_pct"] <= 100 and 0 <= r["wait_pct"] <= 100
        assert abs(r["lecture_bubble_pct"] - 100 * (r["stages"] - 1) / (3 * r["stages"] - 1)) < 1e-9
else:
    assert {r["mode"] for r in rows} == {"thread", "alternating"}
    for r in body:
        assert r["hidden"] is None or 0 <= r["hidden"] <= 1
        assert r["comm_alone_ms"] > 0 and r["gemm_alone_ms"] > 0
PY
  fi
  run "$sub --help" 0 $sub --help
  grep -q "^Usage: distlab-bench $sub" "$TMP/out" || fail "$sub --help: no usage"
  # bad input: exit 2, one line on stderr, nothing on stdout
  for bad in "--bogus" "--ranks 0" "--ranks x" "--plot out.pdf" "--csv --json" "extra"; do
    # shellcheck disable=SC2086
    run "$sub $bad" 2 $sub $bad
    [ "$(wc -l <"$TMP/err")" -eq 1 ] || fail "$sub $bad: $(wc -l <"$TMP/err") lines on stderr, want 1"
    [ -s "$TMP/out" ] && fail "$sub $bad: wrote to stdout"
  done
done
run "overlap --min > --max" 2 overlap --min 1M --max 64K
run "gemm --heads 3" 2 gemm --heads 3 --d-model 32

# --plot: the data and the script are written; the picture when gnuplot is installed
# shellcheck disable=SC2086
run "stream --plot" 0 stream $STREAM --plot "$TMP/bw.svg"
[ -s "$TMP/bw.dat" ] && [ -s "$TMP/bw.gp" ] || fail "stream --plot: no data or script"
if [ -x /usr/bin/gnuplot ]; then
  grep -q '<svg' "$TMP/bw.svg" 2>/dev/null || fail "stream --plot: no SVG although gnuplot is installed"
fi

# scaling: a tiny model, its JSON parses and speed-ups are relative to one rank
run "scaling" 0 scaling --quick --ranks 2 --steps 3 --layers 2 --d-model 32 --seq 16 --json
if [ $HAVE_PY = 1 ]; then
  python3 - "$TMP/out" <<'PY' || fail "scaling: JSON does not parse or is inconsistent"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
assert recs[0]["type"] == "config" and recs[-1]["type"] == "summary" and recs[-1]["status"] == "ok"
rows = [r for r in recs if r["type"] == "row"]
assert {(r["mode"], r["par"]) for r in rows} == {("strong", "dp"), ("weak", "dp"), ("strong", "tp"), ("strong", "pp")}
assert any(r["par"] == "pp" and r["ranks"] == 2 for r in rows)
for r in rows:
    assert r["ranks"] == r["dp"] * r["tp"] * r["pp"] and r["tokens_per_s"] > 0
    # where rank 0's step went: the four classes partition the step
    s = r["compute_fraction"] + r["comm_fraction"] + r["wait_fraction"] + r["idle_fraction"]
    assert abs(s - 1) < 1e-6 and r["compute_fraction"] > 0, r
    assert abs(r["efficiency"] * r["ranks"] - r["speedup"]) < 1e-9
    if r["ranks"] == 1: assert r["speedup"] == 1
    if r["par"] == "dp" and r["ranks"] > 1: assert r["dp_grad_bytes_per_rank_per_step"] > 0
PY
fi
run "scaling --bogus" 2 scaling --bogus
run "scaling --heads 3" 2 scaling --heads 3 --d-model 32

# overhead: the harness's own cost per step; its JSON parses and the arithmetic holds
OVERHEAD="--quick"
[ "$DISTLAB_TEST_SCALE" = small ] && OVERHEAD="--quick --reps 2000 --batches 3"
# shellcheck disable=SC2086
run "overhead json" 0 overhead $OVERHEAD --json
if [ $HAVE_PY = 1 ]; then
  python3 - "$TMP/out" <<'PY' || fail "overhead: JSON does not parse or is inconsistent"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
assert recs[0]["type"] == "config" and recs[-1]["type"] == "summary" and recs[-1]["status"] == "ok"
for r in recs:
    assert r["schema"] == "distlab/1" and r["app"] == "distlab-bench" and r["subcommand"] == "overhead"
costs = {r["op"]: r for r in recs if r["type"] == "row" and r["row_kind"] == "cost"}
scen = [r for r in recs if r["type"] == "row" and r["row_kind"] == "scenario"]
assert set(costs) == {"dl_now_ns", "dl_trace_add", "event", "counter"}, costs
for r in costs.values(): assert 0 < r["ns_min"] <= r["ns_median"] <= r["ns_max"]
s = recs[-1]
assert s["step_source"] == "measured" and s["step_ms"] > 0
assert [r["scenario"] for r in scen] == ["trainer", "pipeline"]
for r in scen:
    per = costs["event"]["ns_median"] + costs["counter"]["ns_median"]
    assert r["events_per_step"] >= 3 and abs(r["overhead_us"] - r["events_per_step"] * per / 1e3) < 1e-6 * r["overhead_us"] + 1e-9
    assert abs(r["overhead_pct"] - 100 * r["overhead_us"] / (r["step_ms"] * 1e3)) < 1e-9 * r["overhead_pct"] + 1e-12
# pipeline default p = 4, m = 8: 6 events per micro-batch, the stage's step (m+p-1)/(m p) of one rank's
assert scen[1]["pp"] == 4 and scen[1]["microbatches"] == 8
assert scen[1]["events_per_step"] - scen[0]["events_per_step"] == 6 * 8 - 2 * scen[0]["microbatches"]
assert abs(scen[1]["step_ms"] - s["step_ms"] * 11 / 32) < 1e-9 * s["step_ms"]
assert s["pass"] == (s["worst_overhead_pct"] < 1)
PY
fi
run "overhead text" 0 overhead $OVERHEAD --step-ms 10
grep -Eq '^# harness overhead goal .*: (PASS|FAIL)' "$TMP/out" || fail "overhead: no PASS/FAIL line"
grep -q '(given;' "$TMP/out" || fail "overhead --step-ms: the step is not marked as given"
run "overhead csv" 0 overhead $OVERHEAD --step-ms 10 --csv
[ "$(grep -vc '^#' "$TMP/out")" -eq 3 ] || fail "overhead --csv: want a header and 2 rows"
run "overhead --step-ms 0" 2 overhead --step-ms 0
run "overhead --bogus" 2 overhead --bogus

# contention --plot, and the trace's Gantt chart (a simulated 1F1B drawn through apps/bench/trace_plot.c;
# its grid is the trace module's, which must be the schedule's)
# shellcheck disable=SC2086
run "contention --plot" 0 contention $CONTENTION --plot "$TMP/ct.svg"
[ -s "$TMP/ct.dat" ] && [ -s "$TMP/ct.gp" ] || fail "contention --plot: no data or script"
run "gantt-demo" 0 gantt-demo "$TMP/gantt.svg" 1f1b 4 8
[ -s "$TMP/gantt.dat" ] && [ -s "$TMP/gantt.gp" ] || fail "gantt-demo: no data or script"
cat >"$TMP/want" <<'EOF'
rank 0  0123······aa4bb5cc6dd7ee·ff·gg·hh
rank 1  ·012····aa3bb4cc5dd6ee7ff·gg·hh··
rank 2  ··01··aa2bb3cc4dd5ee6ff7gg·hh····
rank 3  ···0aa1bb2cc3dd4ee5ff6gg7hh······
EOF
cmp -s "$TMP/out" "$TMP/want" || fail "gantt-demo: the trace's grid is not the lecture's 1F1B grid"
# the chart's rows are named as the grid's: rank 0.., never the lecture's "GPU 1" (issue 29)
grep -q "ytics ('rank 0' 0, 'rank 1' 1, 'rank 2' 2, 'rank 3' 3)" "$TMP/gantt.gp" ||
  fail "gantt-demo: the chart's rows are not named rank 0..3: $(grep ytics "$TMP/gantt.gp")"
[ "$(grep -c '^[0-9]' "$TMP/gantt.dat")" -eq 64 ] || fail "gantt-demo: want 64 boxes (8 F + 8 B on 4 stages)"
if [ -x /usr/bin/gnuplot ]; then
  grep -q '<svg' "$TMP/ct.svg" 2>/dev/null || fail "contention --plot: no SVG although gnuplot is installed"
  grep -q '<svg' "$TMP/gantt.svg" 2>/dev/null || fail "gantt-demo: no SVG although gnuplot is installed"
fi
run "gantt-demo bad extension" 2 gantt-demo "$TMP/g.pdf"

# pipeline: measured bubbles on the engine (one small configuration), its JSON parses and the
# bubble arithmetic holds on synthetic timings (pipeline --selftest); no timing assertions
PIPE="--quick --fwd-ms 1 --bwd-ms 2"
[ "$DISTLAB_TEST_SCALE" = small ] && PIPE="--quick --fwd-ms 0.2 --bwd-ms 0.4 --overhead-steps 2"
run "pipeline selftest" 0 pipeline --selftest
grep -q '^pipeline selftest: ok$' "$TMP/out" || fail "pipeline --selftest: no 'pipeline selftest: ok'"
# shellcheck disable=SC2086
run "pipeline json" 0 pipeline $PIPE --json --trace "$TMP/pipe.json"
if [ $HAVE_PY = 1 ]; then
  python3 - "$TMP/out" "$TMP/pipe.json" <<'PY' || fail "pipeline: JSON does not parse or is inconsistent"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
assert recs[0]["type"] == "config" and recs[-1]["type"] == "summary" and recs[-1]["status"] == "ok"
for r in recs:
    assert r["schema"] == "distlab/1" and r["app"] == "distlab-bench" and r["subcommand"] == "pipeline"
assert recs[0]["work"] == "sleep" and recs[0]["handoff_kb"] == 64
rows = [r for r in recs if r["type"] == "row" and r["row_kind"] == "config"]
ov = [r for r in recs if r["type"] == "row" and r["row_kind"] == "overhead"]
assert len(rows) == 1, rows
r = rows[0]
assert (r["schedule"], r["p"], r["m"], r["v"]) == ("1f1b", 2, 4, 1)
# the lecture's (p-1)/(m+p-1) = 1/5 and the simulator agree; measured numbers are fractions
assert abs(r["lecture_pct"] - 20) < 1e-9 and abs(r["sim_pct"] - 20) < 1e-9
assert abs(r["delta_pp"] - (r["bubble_pct"] - r["lecture_pct"])) < 1e-9
for k in ("bubble_pct", "bubble_trace_pct"): assert 0 <= r[k] <= 100, (k, r[k])
assert len(r["stage_bubble_pct"]) == 2 and all(0 <= b <= 100 for b in r["stage_bubble_pct"])
assert r["peak_act_slots"] == [2, 1] and r["step_ms"] > 0 and r["engine_us_per_action"] >= 0
if recs[0]["machine"]["real_pus"] >= 2:
    assert len(ov) == 1 and ov[0]["p"] == 2 and ov[0]["per_action_us"] > 0
    assert ov[0]["pass"] == (ov[0]["per_action_us"] < 20)
t = json.load(open(sys.argv[2]))
names = {e["name"] for e in t["traceEvents"] if e.get("ph") == "X"}
assert {"F0", "F3", "B0", "B3", "step"} <= names, names
PY
fi
# shellcheck disable=SC2086
run "pipeline csv" 0 pipeline $PIPE --overhead-steps 0 --csv
[ "$(grep -vc '^#' "$TMP/out")" -eq 2 ] || fail "pipeline --csv: want a header and 1 row"
# shellcheck disable=SC2086
run "pipeline --plot" 0 pipeline $PIPE --overhead-steps 0 --plot "$TMP/pg.svg" --plot-bubbles "$TMP/pb.svg"
[ -s "$TMP/pg.dat" ] && [ -s "$TMP/pg.gp" ] && [ -s "$TMP/pb.dat" ] || fail "pipeline --plot: no data or script"
[ "$(awk '/^# (optimizer|collective)/ { stop = 1 } /^[0-9]/ && !stop' "$TMP/pg.dat" | wc -l)" -eq 16 ] ||
  fail "pipeline --plot: want 16 forward and backward boxes (4 F + 4 B on 2 stages)"
# shellcheck disable=SC2086
run "pipeline text" 0 pipeline $PIPE --overhead-steps 0 --schedules gpipe,interleaved --microbatches 1
grep -q '^# skipped interleaved p=2 m=1' "$TMP/out" || fail "pipeline: interleaved with m < p not reported as skipped"
# TeraPipe (--token-chunks): equal chunks simulate to the lecture's (p-1)/(m c+p-1), chunks at
# their FLOPs (later ones attend to more keys) to more; no timing assertions
TERA="--token-chunks 1,2 --stages 2 --microbatches 2 --fwd-ms 0.5 --bwd-ms 1 --steps 2 --overhead-steps 0 --json"
# shellcheck disable=SC2086
run "pipeline token chunks" 0 pipeline $TERA
cp "$TMP/out" "$TMP/tera_equal"
# shellcheck disable=SC2086
run "pipeline token chunks, flops" 0 pipeline $TERA --chunk-costs flops --seq 32 --d-model 16
if [ $HAVE_PY = 1 ]; then
  python3 - "$TMP/tera_equal" "$TMP/out" <<'PY' || fail "pipeline --token-chunks: rows inconsistent"
import json, sys
def rows(path):
    return [r for r in map(json.loads, open(path)) if r["type"] == "row" and r["row_kind"] == "config"]
eq, fl = rows(sys.argv[1]), rows(sys.argv[2])
assert [r["schedule"] for r in eq] == ["terapipe/c1", "terapipe/c2"], eq
assert [r["token_chunks"] for r in eq] == [1, 2] and eq[0]["chunk_costs"] == "equal"
for r, want in zip(eq, (100 / 3, 20)):  # (p-1)/(m c + p-1) at p = m = 2
    assert abs(r["lecture_pct"] - want) < 1e-9 and abs(r["sim_pct"] - want) < 1e-9, r
assert fl[1]["chunk_costs"] == "flops" and abs(fl[0]["sim_pct"] - 100 / 3) < 1e-9
assert fl[1]["sim_pct"] > fl[1]["lecture_pct"] + 0.1, fl[1]
PY
fi
# auto: a latency model timed here, its fit printed, TeraPipe's slices run (no timing assertions)
run "pipeline token chunks auto" 0 pipeline --token-chunks auto --stages 2 --microbatches 1 \
  --seq 32 --d-model 16 --micro-batch 1 --fwd-ms 0.5 --bwd-ms 1 --steps 2 --overhead-steps 0 --json
grep -q '^# token-chunks auto: one layer.*fit error' "$TMP/err" || fail "token-chunks auto: no fit printed"
grep -q '^# token-chunks auto, 2 stages: [0-9]* slices of' "$TMP/err" || fail "token-chunks auto: no slices printed"
if [ $HAVE_PY = 1 ]; then
  python3 - "$TMP/out" <<'PY' || fail "pipeline --token-chunks auto: row inconsistent"
import json, sys
r = [r for r in map(json.loads, open(sys.argv[1])) if r["type"] == "row"][0]
assert r["schedule"] == "terapipe/auto%d" % r["token_chunks"] and r["chunk_costs"] == "measured", r
assert len(r["token_lens"]) == r["token_chunks"] and sum(r["token_lens"]) == 32, r  # the '#' lines' figures
assert len(r["fit_abc_rms_max"]) == 5 and 0 <= r["fit_abc_rms_max"][3] <= r["fit_abc_rms_max"][4], r
assert 1 <= r["token_chunks"] <= 32 and 0 <= r["sim_pct"] <= 100, r
PY
fi
# async is one continuous pipeline: its per-stage simulated figures are the continuous steady
# state (0 at uniform costs), the lecture gives no figure for it (null); the spun sleep tail is
# in the config record; no timing assertions
run "pipeline async" 0 pipeline --schedules async --stages 2 --microbatches 2 --fwd-ms 0.5 \
  --bwd-ms 1 --steps 5 --overhead-steps 0 --sleep-tail-us 100 --json
if [ $HAVE_PY = 1 ]; then
  python3 - "$TMP/out" <<'PY' || fail "pipeline async: JSON inconsistent"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
assert recs[0]["sleep_tail_us"] == 100, recs[0]
r = [r for r in recs if r["type"] == "row"][0]
assert r["schedule"] == "async" and r["sim_stage_bubble_pct"] == [0, 0] and r["sim_pct"] == 0, r
assert r["lecture_pct"] is None and r["delta_pp"] is None and r["sim_1f1b_pct"] > 0, r
assert 0 <= r["replay_pct"] <= 100, r  # the window replayed with the run's own action times
PY
fi
run "pipeline --help" 0 pipeline --help
grep -q "^Usage: distlab-bench pipeline" "$TMP/out" || fail "pipeline --help: no usage"
for bad in "--bogus" "--stages 0" "--schedules naive" "--work gpu" "--microbatches 4,x" "--plot out.pdf" \
           "--show 1f1b:3:4" "--csv --json" "--work model --plot g.svg" "extra" \
           "--token-chunks 2 --schedules gpipe" "--token-chunks 2 --work model" "--token-chunks 0" \
           "--chunk-costs cubic" "--chunk-costs flops" "--sleep-tail-us -1"; do
  # shellcheck disable=SC2086
  run "pipeline $bad" 2 pipeline $bad
  [ "$(wc -l <"$TMP/err")" -eq 1 ] || fail "pipeline $bad: $(wc -l <"$TMP/err") lines on stderr, want 1"
  [ -s "$TMP/out" ] && fail "pipeline $bad: wrote to stdout"
done

# ckpt load: a 1 MiB checkpoint read whole and by tp 2's ranks against dd; its JSON parses, the
# bytes are the state's (one rank: 3 x 4 bytes a parameter); no timing assertions
run "ckpt load json" 0 ckpt load --mib 1 --trials 1 --json --dir "$TMP"
if [ $HAVE_PY = 1 ]; then
  python3 - "$TMP/out" <<'PY' || fail "ckpt load: JSON does not parse or is inconsistent"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
assert [r["type"] for r in recs] == ["config"] + ["row"] * 4 + ["summary"], recs
assert recs[-1]["status"] == "ok" and all(r["subcommand"] == "ckpt" for r in recs)
rows = recs[1:-1]
assert [(r["reader"], r["cache"]) for r in rows] == [("one rank (whole model)", "cold"),
    ("tp 2 (rank by rank)", "cold"), ("one rank (whole model)", "warm"), ("tp 2 (rank by rank)", "warm")]
assert rows[0]["bytes"] % 12 == 0 and rows[1]["bytes"] > rows[0]["bytes"]  # tp replicas read twice
for r in rows: assert r["seconds"] > 0 and r["gbs"] > 0 and r["dd_gbs"] > 0
PY
fi
[ -z "$(find "$TMP" -name 'distlab-bench-ckpt.*')" ] || fail "ckpt load: its checkpoint was left"
for bad in "--bogus" "--mib 0" "--csv --json"; do
  # shellcheck disable=SC2086
  run "ckpt load $bad" 2 ckpt load $bad
done
run "ckpt no side" 2 ckpt

# the help lists the new subcommands
run "help" 0 --help
for sub in gemm stream overlap contention scaling overhead pipeline ckpt; do
  grep -q "^  $sub " "$TMP/out" || fail "--help does not list $sub"
done

finish "ok"
