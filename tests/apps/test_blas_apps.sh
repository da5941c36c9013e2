#!/bin/sh
# The apps' BLAS kernel choice (apps/common/cli.c, cli_blas_setup; the rule itself: tests/unit/core/test_blas.c).
# A CPU that OpenBLAS does not recognise (it loads Prescott) is emulated with the test hook
# DISTLAB_BLAS_TEST_LOADED=Prescott: with OPENBLAS_CORETYPE unset or empty the one restart sets
# the CPU's best class, with or without OPENBLAS_NUM_THREADS=1 already set, and `# blas_kernel:`
# in the bench header, "blas_kernel" in bench's and the trainer's --json say so; a user's
# OPENBLAS_CORETYPE is kept (Haswell, Prescott), with a warning only when the CPU cannot run it;
# "static:Prescott" (an OpenBLAS without DYNAMIC_ARCH: the restart changes nothing) warns once,
# on stderr (--csv stays clean), and under mpirun from process 0 only.

SELF=test_blas_apps
. "$(dirname "$0")/lib.sh"
BENCH=$(app_bin distlab-bench) || exit 1
TRAIN=$(app_bin distlab-train) || exit 1
G="gemm --quick --ranks 1 --d-model 32 --seq 16 --micro-batch 2 --iters 1"

# gemm_run NAME ENV...: distlab-bench gemm under `env ENV`, stdout in $TMP/out, stderr in
# $TMP/err; sets $kernel and $cpu from the header's "# blas_kernel: K (L kernel; CPU C)"
gemm_run() {
  name=$1; shift
  env "$@" "$BENCH" $G >"$TMP/out" 2>"$TMP/err" || fail "$name: exit status $?"
  line=$(grep '^# blas_kernel: ' "$TMP/out")
  [ -n "$line" ] || fail "$name: no '# blas_kernel:' line in the header"
  kernel=$(echo "$line" | sed 's/^# blas_kernel: \([^ ]*\) .*/\1/')
  cpu=$(echo "$line" | sed 's/.*; CPU \(.*\))$/\1/')
}
no_stderr() {
  [ -s "$TMP/err" ] && fail "$1: stderr not empty: $(head -c 300 "$TMP/err")"
}

# this CPU's level and the class the apps should pick for it
gemm_run plain -u OPENBLAS_CORETYPE
default_kernel=$kernel
case "$cpu" in
  AVX-512) best=SkylakeX ;;
  AVX2+FMA) best=Haswell ;;
  AVX) best=Sandybridge ;;
  SSE3) best=Prescott ;;
  *) best= ;;
esac
echo "CPU $cpu; OpenBLAS picks $default_kernel; best class $best"

# the trainer's --json config record names the kernel the header names
if command -v python3 >/dev/null 2>&1; then
  json_kernel() { # FILE: blas_kernel of the config record
    python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["blas_kernel"])' "$1"
  }
  env -u OPENBLAS_CORETYPE "$TRAIN" --layers 1 --d-model 32 --heads 4 --seq 16 --steps 1 \
    --log-every 0 --json "$TMP/t.json" >/dev/null 2>"$TMP/err" || fail "train: exit status $?"
  k=$(json_kernel "$TMP/t.json")
  [ "$k" = "$default_kernel" ] || fail "train --json: blas_kernel '$k', the bench header says '$default_kernel'"
  env -u OPENBLAS_CORETYPE "$BENCH" $G --json >"$TMP/b.json" 2>"$TMP/err" || fail "bench --json: exit $?"
  k=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["machine"]["blas_kernel"])' "$TMP/b.json")
  [ "$k" = "$default_kernel" ] || fail "bench --json: machine.blas_kernel '$k', want '$default_kernel'"
fi

# a user's class is kept
gemm_run haswell OPENBLAS_CORETYPE=Haswell
[ "$kernel" = Haswell ] || fail "OPENBLAS_CORETYPE=Haswell: kernel $kernel"
case "$cpu" in AVX-512|AVX2+FMA) no_stderr "OPENBLAS_CORETYPE=Haswell" ;; esac
gemm_run prescott OPENBLAS_CORETYPE=Prescott DISTLAB_BLAS_TEST_LOADED=Prescott
[ "$kernel" = Prescott ] || fail "OPENBLAS_CORETYPE=Prescott (the user's) was not kept: kernel $kernel"
no_stderr "OPENBLAS_CORETYPE=Prescott"

if [ -z "$best" ] || [ "$best" = Prescott ]; then
  echo "skip: CPU level '$cpu' has no class above Prescott: no restart to test"
else
  # OpenBLAS "does not know the CPU": unset, empty, with and without OPENBLAS_NUM_THREADS=1
  # (env's -u options come before its assignments)
  for a in "-u OPENBLAS_NUM_THREADS -u OPENBLAS_CORETYPE" "-u OPENBLAS_NUM_THREADS OPENBLAS_CORETYPE=" \
           "-u OPENBLAS_CORETYPE OPENBLAS_NUM_THREADS=1" "OPENBLAS_NUM_THREADS=1 OPENBLAS_CORETYPE="; do
    gemm_run "$a" $a DISTLAB_BLAS_TEST_LOADED=Prescott
    [ "$kernel" = "$best" ] || fail "loaded Prescott, $a: kernel $kernel, want $best"
    no_stderr "loaded Prescott, $a"
  done
  # the restart changes nothing (no DYNAMIC_ARCH): one warning, on stderr only
  env OPENBLAS_CORETYPE= DISTLAB_BLAS_TEST_LOADED=static:Prescott "$BENCH" $G --csv \
    >"$TMP/out" 2>"$TMP/err" || fail "static: exit status $?"
  n=$(grep -c "warning: OpenBLAS still runs its Prescott kernel after restarting with OPENBLAS_CORETYPE=$best" "$TMP/err")
  [ "$n" -eq 1 ] || fail "static: $n warnings, want 1 (stderr: $(head -c 300 "$TMP/err"))"
  grep -q warning "$TMP/out" && fail "static: a warning on stdout (--csv)"
  # negative control: with DYNAMIC_ARCH (the kernel changed) the same run does not warn
  env OPENBLAS_CORETYPE= DISTLAB_BLAS_TEST_LOADED=Prescott "$BENCH" $G --csv >"$TMP/out" 2>"$TMP/err"
  no_stderr "dynamic: "
  if [ -n "$MPIRUN" ]; then # two processes decide alike; process 0 alone warns
    if "$MPIRUN" --version 2>&1 | grep -qi hydra; then mo="-n 2"; else mo="--oversubscribe --bind-to none -np 2"; fi
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 300 "$MPIRUN" $mo \
      env OPENBLAS_CORETYPE= DISTLAB_BLAS_TEST_LOADED=static:Prescott "$BENCH" $G \
      >"$TMP/out" 2>"$TMP/err" || fail "mpirun: exit status $? ($(head -c 300 "$TMP/err"))"
    n=$(grep -c "warning: OpenBLAS still runs" "$TMP/err")
    [ "$n" -eq 1 ] || fail "mpirun -np 2: $n warnings, want 1"
  fi
fi

# a class the CPU cannot run: kept, with a warning (--version runs nothing but the check)
if [ "$cpu" = AVX-512 ]; then
  echo "skip: the CPU runs every class (AVX-512): the cannot-run warning needs a CPU without it"
  env OPENBLAS_CORETYPE=SkylakeX "$BENCH" --version >/dev/null 2>"$TMP/err"
  no_stderr "OPENBLAS_CORETYPE=SkylakeX on AVX-512"
else
  env OPENBLAS_CORETYPE=SkylakeX "$BENCH" --version >/dev/null 2>"$TMP/err"
  grep -q "warning: OPENBLAS_CORETYPE=SkylakeX needs AVX-512" "$TMP/err" ||
    fail "OPENBLAS_CORETYPE=SkylakeX on $cpu: no warning (stderr: $(head -c 300 "$TMP/err"))"
fi

finish "all checks passed"
