#!/bin/sh
# Short libFuzzer runs (clang -fsanitize=fuzzer,address,undefined) of the size parser, the apps'
# list and number parsers, the safetensors reader, the checkpoint manifest's reader, the
# pipeline schedule file reader and --inject-fault's parser, each for SECONDS (default 20), starting
# from the committed corpus in tests/fuzz/corpus/. A crash stops with the reproducer written to
# tests/fuzz/corpus/TARGET/ (commit it: `make check` replays the corpus, so it stays a test).
# Usage: tests/fuzz/run.sh BUILD_DIR [SECONDS]   (BUILD_DIR: a configured build, for config.h
# and the compiler flags of hwloc and OpenBLAS). Needs clang with libFuzzer (libclang-rt-14-dev).
set -eu
src=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
secs=${2:-20}
command -v clang >/dev/null || { echo "fuzz: clang not found"; exit 1; }
var() { sed -n "s/^$1 = //p" "$build/Makefile"; }
out=$(mktemp -d "${TMPDIR:-/tmp}/distlab-fuzz.XXXXXX")
trap 'rm -rf "$out"' EXIT
FLAGS="-g -O1 -std=c11 -fsanitize=address,undefined -fno-sanitize-recover=undefined"
INC="-D_GNU_SOURCE= -I$src/include -I$build -I$src/lib -I$src/apps/common $(var HWLOC_CFLAGS) $(var OPENBLAS_CFLAGS) $(var JANSSON_CFLAGS) $(var MPI_CFLAGS)"
LIBS="$(var HWLOC_LIBS) $(var OPENBLAS_LIBS) $(var JANSSON_LIBS) $(var MPI_LIBS) -lpthread -lm"
echo "fuzz: building the library with clang (coverage instrumented) in $out"
i=0
for f in "$src"/lib/*/*.c "$src"/apps/common/cli.c; do
  clang $FLAGS -fsanitize=fuzzer-no-link -DHAVE_CONFIG_H $INC -c "$f" -o "$out/$(basename "$f" .c).o" &
  i=$((i + 1))
  [ $((i % 2)) -ne 0 ] || wait
done
wait
status=0
for t in size list ckpt manifest schedcsv fault; do
  clang $FLAGS -fsanitize=fuzzer $INC "$src/tests/fuzz/fuzz_$t.c" "$out"/*.o $LIBS -o "$out/fuzz_$t"
  mkdir -p "$out/work_$t"
  echo "fuzz: $t for $secs s"
  # new inputs go to a scratch corpus; a crash reproducer goes to the committed one
  # (-close_fd_mask=2: the parsers' refusals on stderr are not wanted; libFuzzer's report stays)
  if (cd "$out" && ./"fuzz_$t" -max_total_time="$secs" -max_len=8192 -print_final_stats=1 -close_fd_mask=2 \
        -artifact_prefix="$src/tests/fuzz/corpus/$t/crash-" "work_$t" "$src/tests/fuzz/corpus/$t" \
        >"$out/log_$t" 2>&1); then
    grep -E "^(#[0-9]+.*DONE|stat::number_of_executed_units|Done )" "$out/log_$t" | tail -n 3
  else
    tail -n 40 "$out/log_$t"
    echo "fuzz: $t FAILED: reproducer in tests/fuzz/corpus/$t/crash-*"
    status=1
  fi
done
exit $status
