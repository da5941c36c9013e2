# DL_ARG_SANITIZERS: --enable-sanitizers=LIST. Sets enable_sanitizers (no, or the list passed
# to -fsanitize=); DL_SET_CFLAGS acts on it.
AC_DEFUN([DL_ARG_SANITIZERS], [
AC_ARG_ENABLE([sanitizers],
  [AS_HELP_STRING([--enable-sanitizers=LIST], [build with -fsanitize=LIST (thread, or address,undefined)])],
  [], [enable_sanitizers=no])
])
