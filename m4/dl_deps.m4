# DL_CHECK_DEPS: the libraries distlab builds on. POSIX threads, hwloc, OpenBLAS and jansson are
# required; Check only for `make check` (HAVE_CHECK), so a plain build works without it.
AC_DEFUN([DL_CHECK_DEPS], [
AX_PTHREAD([], [AC_MSG_ERROR([distlab needs POSIX threads])])
PKG_PROG_PKG_CONFIG
PKG_CHECK_MODULES([HWLOC], [hwloc >= 2.0])
PKG_CHECK_MODULES([OPENBLAS], [openblas])
# checkpoint manifests and safetensors headers (jansson keeps integers in 64 bits)
PKG_CHECK_MODULES([JANSSON], [jansson >= 2.14])
PKG_CHECK_MODULES([CHECK], [check >= 0.11], [have_check=yes],
  [have_check=no; AC_MSG_WARN([Check not found: make check will fail])])
AM_CONDITIONAL([HAVE_CHECK], [test "x$have_check" = xyes])
AC_SEARCH_LIBS([sqrt], [m])
AC_SEARCH_LIBS([clock_gettime], [rt])
])
