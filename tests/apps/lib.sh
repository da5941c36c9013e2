# What the app scripts share (sourced; set SELF, the script's name, first): the app binary's
# path, a scratch directory removed at exit, fail and its count, run, run_cmd, has,
# has_re, usage_error, refused and finish.

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

# run_failed NAME CMD...: called after a wrong status's FAIL line, run_passed NAME after a right
# one; no-ops here, a script redefines them after sourcing to print more (its DIFF lines, the
# tail of stdout, an "ok:" line)
run_failed() { :; }
run_passed() { :; }

# run_cmd NAME EXPECTED_STATUS CMD...: CMD, output in $TMP/out, $TMP/err; 1 (counted as a
# failure) when the status is not the expected one
run_cmd() {
  name=$1; want=$2; shift 2
  "$@" >"$TMP/out" 2>"$TMP/err"
  got=$?
  if [ "$got" -ne "$want" ]; then
    fail "$name: exit status $got, want $want (stderr: $(head -c 400 "$TMP/err"))"
    run_failed "$name" "$@"
    return 1
  fi
  run_passed "$name"
  return 0
}

# run NAME EXPECTED_STATUS ARGS...: run_cmd of "$APP" ARGS
run() {
  run_name=$1; run_want=$2; shift 2
  run_cmd "$run_name" "$run_want" "$APP" "$@"
}

# has NAME STRING: $TMP/out contains the fixed string
has() {
  grep -qF -- "$2" "$TMP/out" || fail "$1: output lacks '$2'"
}

# has_re NAME REGEX: $TMP/out has a line matching the (grep basic) regular expression
has_re() {
  grep -q -- "$2" "$TMP/out" || fail "$1: no line matching '$2'"
}

# one_error_line NAME GREP_OPTION PATTERN: after a status-2 run, exactly one line on stderr, that
# matches PATTERN (GREP_OPTION -G: a basic regular expression, -E: an extended one), and nothing
# on stdout
one_error_line() {
  lines=$(wc -l <"$TMP/err")
  [ "$lines" -eq 1 ] || fail "$1: $lines lines on stderr, want 1: $(cat "$TMP/err")"
  grep -q "$2" -- "$3" "$TMP/err" || fail "$1: stderr lacks '$3': $(cat "$TMP/err")"
  [ -s "$TMP/out" ] && fail "$1: wrote to stdout: $(head -c 200 "$TMP/out")"
}

# usage_error NAME PATTERN ARGS...: run ARGS with status 2 and one_error_line (basic PATTERN)
usage_error() {
  ue_name=$1; ue_pattern=$2; shift 2
  run "$ue_name" 2 "$@" && one_error_line "$ue_name" -G "$ue_pattern"
}

# refused NAME PATTERN ARGS...: run ARGS with status 2 and one_error_line (extended PATTERN), the
# line starting with $REFUSED_PREFIX where a script sets it; the line is echoed
refused() {
  rf_name=$1; rf_pattern=$2; shift 2
  if run "$rf_name" 2 "$@"; then
    one_error_line "$rf_name" -E "$rf_pattern"
    rf_prefix=${REFUSED_PREFIX:-}
    [ -z "$rf_prefix" ] || grep -q "^$rf_prefix" "$TMP/err" ||
      fail "$rf_name: message not prefixed '$rf_prefix'"
  fi
  echo "refused $rf_name: $(head -c 300 "$TMP/err")"
}

# finish [WHAT]: exit 1 after "SELF: N failure(s)" when a check failed, else exit 0 after
# "SELF: WHAT" (default "all passed")
finish() {
  if [ "$fails" -ne 0 ]; then
    echo "$SELF: $fails failure(s)"
    exit 1
  fi
  echo "$SELF: ${1:-all passed}"
  exit 0
}
