#!/bin/sh
# docs/API.md's worked examples: every ```c block is a whole program; each is built against the
# shared library of this build (as a user builds it: the public headers, -ldistlab, an rpath) and
# run, and must exit 0 (each checks its own results). Negative control: example 6.1 with its
# expected sum off by one must exit 1, so a run that "passes" cannot be a program that checks
# nothing. Every "### 6.N" section must hold a block. Skipped (77) without a shared library.
# Run by `make check` from the build directory (CC, DL_CFLAGS, DL_LDFLAGS from the Makefile).
SRC=${srcdir:-$(dirname "$0")/../..}
LIB=${abs_top_builddir:-.}/lib/.libs
DOC=$SRC/docs/API.md
[ -e "$LIB/libdistlab.so" ] || { echo "test_api_examples: SKIPPED: no $LIB/libdistlab.so"; exit 77; }
LIB=$(cd "$LIB" && pwd) || exit 1 # the examples run elsewhere: an absolute rpath
SELF=test_api_examples
. "$SRC/tests/apps/lib.sh"

awk -v d="$TMP" '/^```c$/ { n++; f = sprintf("%s/ex%d.c", d, n); on = 1; next }
                 /^```$/ { on = 0 } on { print > f }' "$DOC"
blocks=$(find "$TMP" -name 'ex*.c' | wc -l)
sections=$(grep -c '^### 6\.' "$DOC")
if [ "$blocks" -lt 1 ] || [ "$blocks" -ne "$sections" ]; then
  fail "$blocks C blocks for $sections worked examples in $DOC"
fi

# shellcheck disable=SC2086 # DL_CFLAGS and DL_LDFLAGS are flag lists
build() {
  ${CC:-cc} -std=c11 $DL_CFLAGS -Wall -Wextra -Werror -I"$SRC/include" "$1" -o "$2" \
    -L"$LIB" -ldistlab -Wl,-rpath,"$LIB" $DL_LDFLAGS
}
for c in "$TMP"/ex*.c; do
  [ -e "$c" ] || continue
  x=${c%.c}
  if ! build "$c" "$x" 2>"$x.err"; then
    fail "$(basename "$c"): does not build: $(head -5 "$x.err")"
    continue
  fi
  if (cd "$TMP" && OPENBLAS_NUM_THREADS=1 "$x") >"$x.out" 2>&1; then
    echo "ok $(basename "$c"): $(tail -1 "$x.out")"
  else
    fail "$(basename "$c") exits $?: $(tail -3 "$x.out")"
  fi
done

# negative control: example 6.1 (the first block) expecting the wrong sum
sed 's|n \* (n - 1) / 2 + n \* (i % 5)|n * (n - 1) / 2 + n * (i % 5) + 1|' "$TMP/ex1.c" >"$TMP/neg.c"
if cmp -s "$TMP/ex1.c" "$TMP/neg.c"; then
  fail "negative control: example 6.1's expected sum not found"
elif build "$TMP/neg.c" "$TMP/neg" && (cd "$TMP" && OPENBLAS_NUM_THREADS=1 "$TMP/neg") >"$TMP/neg.out" 2>&1; then
  fail "negative control: example 6.1 with a wrong expected sum exits 0"
elif ! grep -q 'DL_EUSER: rank .*: x\[0\]' "$TMP/neg.out"; then
  fail "negative control: unexpected output: $(cat "$TMP/neg.out")"
fi
finish "$blocks examples built and run; the negative control fails as it must"
