# What the app scripts share (sourced; set SELF, the script's name, first): the app binary's
# path, a scratch directory removed at exit, fail and its count, run and has.

# app_bin NAME: the path of apps/NAME in the build tree; 1 (and a line) when it is not built
app_bin() {
  if [ -n "$abs_top_builddir" ] && [ -x "$abs_top_builddir/apps/$1" ]; then
    echo "$abs_top_builddir/apps/$1"
  elif [ -x "./apps/$1" ]; then
    echo "./apps/$1"
  else
    echo "$SELF: ./apps/$1 not found (run from the build directory)" >&2
    return 1
  fi
}

TMP=$(mktemp -d "${TMPDIR:-/tmp}/$SELF.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT INT TERM
fails=0
fail() {
  echo "FAIL: $*"
  fails=$((fails + 1))
}

# run NAME EXPECTED_STATUS ARGS...: "$APP" ARGS, output in $TMP/out, $TMP/err; 1 (counted as a
# failure) when the status is not the expected one
run() {
  name=$1; want=$2; shift 2
  "$APP" "$@" >"$TMP/out" 2>"$TMP/err"
  got=$?
  if [ "$got" -ne "$want" ]; then
    fail "$name: exit status $got, want $want (stderr: $(head -c 400 "$TMP/err"))"
    return 1
  fi
  return 0
}

# has NAME STRING: $TMP/out contains the fixed string
has() {
  grep -qF -- "$2" "$TMP/out" || fail "$1: output lacks '$2'"
}
