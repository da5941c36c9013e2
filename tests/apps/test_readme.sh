#!/usr/bin/env bash
# Runs every command of README.md's ```sh blocks, in order, on a build, and checks that each
# exits as the README says (0, or N where its comment says "(exit status N)", one of N and M
# for "(exit status N, or M ...)") within a time
# limit (README_LIMIT_S, default 180 s: "about two minutes" with room for a loaded machine).
# Usage: tests/apps/test_readme.sh [BUILD_DIR]   (default: the current directory, which holds apps/)
#
# How the commands are run, and the few rewrites (each printed as it happens):
#  - in a scratch directory holding links to BUILD_DIR/apps and README.md, with HOME there too,
#    so the files the commands write (corpus.bin, model.st, ..., $HOME/.local) go there;
#  - the Quick start block is skipped: .ci/run runs those two lines itself;
#  - the ```c block is saved as prog.c (the README says to);
#  - `make ...` runs in BUILD_DIR (make -C); `export VAR=...` lines set VAR for the lines after;
#  - mpirun lines run only when mpirun exists and the build has MPI (else a "skip" line), on
#    loopback: `--hostfile hosts` becomes `--oversubscribe` (Open MPI; MPICH needs neither).
set -u
src=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-.}" && pwd)
limit=${README_LIMIT_S:-180}
[ -x "$build/apps/distlab-train" ] || { echo "test_readme: $build/apps/distlab-train not found" >&2; exit 2; }
work=$(mktemp -d "${TMPDIR:-/tmp}/test_readme.XXXXXX") || exit 2
trap 'rm -rf "$work"' EXIT
ln -s "$build/apps" "$work/apps"
ln -s "$src/README.md" "$work/README.md"
mkdir "$work/home"
export HOME=$work/home OPENBLAS_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
export OMPI_MCA_btl_base_warn_component_unused=0 OMPI_MCA_pml=ob1
cd "$work" || exit 2

# The commands, one per line as "KIND<TAB>TEXT": sh lines outside the Quick start, and the C code.
awk '/^## /{quick = ($0 ~ /^## Quick start/)}
     /^```sh$/{ if (!quick) sh = 1; next }
     /^```c$/{ c = 1; next }
     /^```/{ sh = 0; c = 0; next }
     sh && $0 !~ /^[ \t]*(#|$)/ { print "sh\t" $0 }
     c { print "c\t" $0 }' "$src/README.md" > cmds || exit 2

mpi=
if command -v mpirun >/dev/null 2>&1 && grep -q '^#define DL_HAVE_MPI 1' "$build/config.h" 2>/dev/null; then
  if mpirun --version 2>&1 | grep -qi hydra; then mpi=hydra; else mpi=openmpi; fi
fi

n=0; fails=0; skipped=0; t_all=$(date +%s)
while IFS=$'\t' read -r kind line; do
  if [ "$kind" = c ]; then printf '%s\n' "$line" >> prog.c; continue; fi
  want=0
  if [[ $line =~ \(exit\ status\ ([0-9]+)(,\ or\ ([0-9]+))? ]]; then
    want=${BASH_REMATCH[1]}${BASH_REMATCH[3]:+ ${BASH_REMATCH[3]}}
  fi
  cmd=$line
  case $cmd in
    export\ *) eval "$cmd"; echo "readme: $cmd"; continue ;;
    make\ *) cmd="make -C '$build' ${cmd#make }" ;;
    mpirun\ *)
      if [ -z "$mpi" ]; then
        echo "skip (no mpirun, or a build without MPI): $line"; skipped=$((skipped + 1)); continue
      fi
      if [ "$mpi" = openmpi ]; then cmd=${cmd/--hostfile hosts/--oversubscribe}
      else cmd=${cmd/--hostfile hosts --bind-to none/}; fi ;;
  esac
  n=$((n + 1))
  t0=$(date +%s)
  timeout "$limit" bash -c "$cmd" < /dev/null > out.txt 2>&1
  rc=$?
  dt=$(( $(date +%s) - t0 ))
  if [[ " $want " == *" $rc "* ]]; then
    echo "ok   ${dt}s exit $rc: $line"
  else
    fails=$((fails + 1))
    [ "$rc" -eq 124 ] && why="killed after ${limit}s" || why="exit $rc, the README says ${want// / or }"
    echo "FAIL ${dt}s ($why): $line"
    [ "$cmd" != "$line" ] && echo "     (ran: $cmd)"
    tail -n 15 out.txt | sed 's/^/     | /'
  fi
done < cmds
echo "test_readme: $n commands, $fails failed, $skipped skipped, $(( $(date +%s) - t_all ))s"
[ "$fails" -eq 0 ]
