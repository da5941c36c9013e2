# DL_ARG_NATIVE: --enable-native. -march=native only on request, so that a default build runs
# on any x86-64. Sets enable_native (yes/no); DL_SET_CFLAGS acts on it.
AC_DEFUN([DL_ARG_NATIVE], [
AC_ARG_ENABLE([native],
  [AS_HELP_STRING([--enable-native], [optimise for this CPU (-march=native)])],
  [], [enable_native=no])
])
