#!/bin/sh
# The fuzz targets (tests/fuzz/fuzz_*.c) replayed over their committed corpus, crash
# reproducers included, with the normal build: what a libFuzzer run once found stays tested.
# The fuzzing itself (clang's libFuzzer, bounded time) is tests/fuzz/run.sh, run by .ci/run.
B=${abs_top_builddir:-.}
S=${srcdir:-.}
fails=0
# the replay's output goes to a scratch file outside the build tree (distcheck's distclean
# check refuses files a test leaves there)
out=$(mktemp "${TMPDIR:-/tmp}/test_fuzz_corpus.XXXXXX") || exit 1
trap 'rm -f "$out"' EXIT
for t in size list ckpt manifest schedcsv fault; do
  r="$B/tests/fuzz/replay_$t"
  [ -x "$r" ] || { echo "test_fuzz_corpus: $r not found"; exit 1; }
  n=$(ls "$S/tests/fuzz/corpus/$t" | wc -l)
  [ "$n" -gt 0 ] || { echo "FAIL: corpus $t is empty"; fails=$((fails + 1)); continue; }
  if "$r" "$S/tests/fuzz/corpus/$t"/* >"$out" 2>&1; then
    echo "replay $t: $n inputs ok"
  else
    echo "FAIL: replay $t: $(tail -n 5 "$out")"
    fails=$((fails + 1))
  fi
done
[ "$fails" -eq 0 ] || { echo "test_fuzz_corpus: $fails failure(s)"; exit 1; }
echo "test_fuzz_corpus: all passed"
