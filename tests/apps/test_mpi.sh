#!/bin/sh
# The MPI transport under mpirun --oversubscribe (loopback): every collective against the serial
# reference for P x T = 2x1, 2x2, 3x2; a failing rank and a hung rank end every process's world
# with the error within the watchdog timeout; MPI_Abort from the app ends the job; the trainer
# with dp and tp spanning processes equals the single-process run; a process crashed by
# --inject-fault ends the job with its exit status and the run resumes.
set -u
MPIRUN=${MPIRUN:-mpirun}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
# loopback only; no warnings about the missing high-speed fabrics
export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
export OMPI_MCA_btl_base_warn_component_unused=0 OMPI_MCA_pml=ob1
# Open MPI needs to be told that more processes than cores is fine and not to bind; MPICH's
# hydra launcher takes neither option (and does neither by default)
if "$MPIRUN" --version 2>&1 | grep -qi hydra; then
  run() { timeout 300 "$MPIRUN" -n "$@"; }
else
  run() { timeout 300 "$MPIRUN" --oversubscribe --bind-to none -np "$@"; }
fi
fails=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }
T=tests/test_mpi_coll
[ -x "$T" ] || T=./test_mpi_coll

for pt in "2 1" "2 2" "3 2"; do
  set -- $pt
  out=$(run "$1" "$T" coll "$2" 2>&1); rc=$?
  echo "$out"
  if [ $rc -eq 0 ] && [ "$(echo "$out" | grep -c ', 0 wrong')" -eq "$1" ]; then
    ok "collectives $1 x $2"; else bad "collectives $1 x $2 (exit $rc)"; fi
  # with 2 threads per process the world's large all-reduces are hierarchical
  if [ "$2" -ge 2 ] && [ "$(echo "$out" | grep -c ' 0 hierarchical')" -ne 0 ]; then
    bad "no hierarchical all-reduce ran ($1 x $2)"; fi
done

out=$(run 2 "$T" fail 2 2>&1); rc=$?
echo "$out"
if [ $rc -eq 0 ] && [ "$(echo "$out" | grep -c 'DL_EUSER after .*rank 3: deliberate failure')" -eq 2 ]; then
  ok "a failing rank ends every process's world with its error"; else bad "failure propagation (exit $rc)"; fi

out=$(run 2 "$T" hang 2 2>&1); rc=$?
echo "$out"
if [ $rc -eq 0 ] && [ "$(echo "$out" | grep -c 'DL_ETIMEOUT after .*watchdog')" -eq 2 ]; then
  ok "a hung rank ends every process's world through the watchdog"; else bad "hang (exit $rc)"; fi

t0=$(date +%s)
out=$(run 3 "$T" abort 1 2>&1); rc=$?
dt=$(( $(date +%s) - t0 ))
echo "$out"
if [ $rc -ne 0 ] && echo "$out" | grep -q 'deliberate failure' && [ $dt -lt 60 ]; then
  ok "MPI_Abort after the world's error ends the job (exit $rc, ${dt} s)"; else bad "abort (exit $rc, ${dt} s)"; fi

# The trainer: dp, tp and pp spanning processes equal the single-process run of the same world
# (the step losses of the JSON records; f64 within 1e-12, f32 within 1e-5).
TRAIN=apps/distlab-train
small="--layers 2 --d-model 32 --heads 4 --seq 16 --micro-batch 2 --steps 3 --eval-every 0 --log-every 0"
cmp_losses() { # a.json b.json tolerance
  python3 - "$1" "$2" "$3" <<'PY'
import json, sys
def losses(p):
    return [r["loss"] for r in map(json.loads, open(p)) if r.get("type") == "step"]
a, b, tol = losses(sys.argv[1]), losses(sys.argv[2]), float(sys.argv[3])
d = max(abs(x - y) / abs(y) for x, y in zip(a, b)) if a and len(a) == len(b) else float("inf")
print("max relative loss difference %.3g over %d steps (tolerance %g)" % (d, len(a), tol))
sys.exit(0 if d <= tol else 1)
PY
}
if [ -x "$TRAIN" ] && command -v python3 >/dev/null; then
  tmp=$(mktemp -d)
  for cfg in "2 1 f64 --dp 2" "2 2 f64 --dp 2 --tp 2" "2 2 f32 --dp 2 --tp 2" "2 2 f64 --tp 4" \
             "2 2 f64 --pp 2 --tp 2 --microbatches 2" "2 2 f32 --pp 2 --dp 2 --microbatches 2"; do
    set -- $cfg
    P=$1 T=$2 dt=$3; shift 3
    tol=1e-12; [ "$dt" = f32 ] && tol=1e-5
    name="$P x $T, $dt $*"
    if ! "$TRAIN" $small --dtype "$dt" "$@" --json "$tmp/one.json" >"$tmp/one.log" 2>&1; then
      cat "$tmp/one.log"; bad "trainer, one process ($name)"; continue; fi
    if ! run "$P" "$TRAIN" $small --dtype "$dt" "$@" --threads "$T" --json "$tmp/mpi.json" >"$tmp/mpi.log" 2>&1; then
      cat "$tmp/mpi.log"; bad "trainer under mpirun ($name)"; continue; fi
    if cmp_losses "$tmp/mpi.json" "$tmp/one.json" "$tol"; then ok "trainer $name equals one process"
    else bad "trainer $name differs from one process"; fi
    # the summary covers every rank, those of the other processes too: each rank's peak
    # parameter bytes equal the single-process run's
    if python3 - "$tmp/mpi.json" "$tmp/one.json" <<'PY'; then ok "trainer $name: every rank's peak memory in the summary"
import json, sys
def peaks(p):
    s = [r for r in map(json.loads, open(p)) if r.get("type") == "summary"][-1]
    return [(r["rank"], r["params"]) for r in s["peak_bytes_per_rank"]]
a, b = peaks(sys.argv[1]), peaks(sys.argv[2])
sys.exit(0 if a == b and all(v > 0 for _, v in a) else 1)
PY
    else bad "trainer $name: the summary's per-rank peaks differ from one process's"; fi
  done
  rm -rf "$tmp"
else
  echo "skip: trainer comparison (no apps/distlab-train or python3)"
fi

# distlab-bench coll under mpirun: the JSON and CSV carry the intra/inter-node link bandwidth and
# plain MPI's figures next to distlab's
BENCH=apps/distlab-bench
if [ -x "$BENCH" ] && command -v python3 >/dev/null; then
  bt=$(mktemp -d)
  if run 2 "$BENCH" coll --threads 2 -b 64K -e 256K -f 4 -n 3 -w 1 --vs-mpi --json >"$bt/c.json" 2>/dev/null &&
     python3 - "$bt/c.json" <<'PY'; then ok "bench coll --vs-mpi --json under mpirun"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["processes"] == 2 and d["threads_per_process"] == 2 and d["ranks"] == 4, d
for r in d["rows"]:
    assert r["link_gbs"]["intra"] > 0 and r["link_gbs"]["inter"] > 0, r
    assert r["mpi"]["time_us"] > 0 and r["mpi"]["busbw_gbs"] > 0 and r["mpi"]["dl_over_mpi"] > 0, r
    assert r["out_of_place"]["wrong"] == 0, r
PY
  else bad "bench coll --vs-mpi --json under mpirun"; fi
  if run 2 "$BENCH" coll --threads 1 -b 64K -e 64K -n 3 -w 1 --vs-mpi --csv >"$bt/c.csv" 2>/dev/null &&
     head -1 "$bt/c.csv" | grep -q ',intra_gbs,inter_gbs,mpi_time_us,mpi_busbw_gbs,dl_over_mpi$'; then
    ok "bench coll --vs-mpi --csv under mpirun"
  else bad "bench coll --vs-mpi --csv under mpirun"; fi
  # alltoallv against MPI_Alltoallv with the same arguments (one rank thread per process): the
  # skew pattern, in which rank 1 receives nothing; MPI's result is checked as distlab's
  if run 2 "$BENCH" coll --op alltoallv --counts skew --threads 1 -b 64K -e 256K -n 3 -w 1 --vs-mpi --json >"$bt/v.json" 2>/dev/null &&
     python3 - "$bt/v.json" <<'PY'; then ok "bench coll --op alltoallv --vs-mpi: MPI_Alltoallv, checked"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["counts"] == "skew" and d["ranks"] == 2 and d["wrong_total"] == 0 and d["rows"], d
for r in d["rows"]:
    assert r["op"] == "alltoallv" and r["out_of_place"]["wrong"] == 0, r
    assert r["mpi"]["time_us"] > 0 and r["mpi"]["busbw_gbs"] > 0 and r["mpi"]["wrong"] == 0, r
PY
  else bad "bench coll --op alltoallv --vs-mpi under mpirun"; fi
  rm -rf "$bt"
fi

# --inject-fault kind=crash under mpirun: rank 1's process dies at step 6 with exit status 3 and
# its message, mpirun reports the exit and ends the job (the peer does not hang), and the newest
# complete checkpoint (step 4: the saves are synchronous here) resumes to the end
if [ -x "$TRAIN" ]; then
  ft=$(mktemp -d)
  run 2 "$TRAIN" --threads 1 --dp 2 --layers 1 --d-model 32 --seq 16 --steps 8 --log-every 0 \
    --ckpt-dir "$ft/ck" --save-every 2 --ckpt-sync --inject-fault rank=1,at=step:6,kind=crash \
    >"$ft/crash.log" 2>&1
  rc=$?
  if [ $rc -eq 3 ] && grep -q 'injected fault rank=1,at=step:6,kind=crash' "$ft/crash.log" &&
     grep -q 'exited with non-zero status\|returned a non-zero exit code' "$ft/crash.log" &&
     [ -d "$ft/ck/step-0000004" ] && [ ! -d "$ft/ck/step-0000006" ]; then
    ok "a crashed process under mpirun: exit 3, its message and mpirun's report"
  else cat "$ft/crash.log"; bad "crash under mpirun (exit $rc)"; fi
  if run 2 "$TRAIN" --threads 1 --resume "$ft/ck" --log-every 0 >"$ft/resume.log" 2>&1 &&
     grep -q 'resumed from step 4' "$ft/resume.log"; then ok "the crashed run resumes under mpirun"
  else cat "$ft/resume.log"; bad "resume after a crash under mpirun"; fi
  rm -rf "$ft"
fi

[ $fails -eq 0 ] && echo "all MPI tests passed" || echo "$fails MPI tests failed"
[ $fails -eq 0 ]
