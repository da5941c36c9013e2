# DL_SET_CFLAGS: the project's compiler flags in DL_CFLAGS / DL_LDFLAGS (AM_CFLAGS uses them,
# so a user's CFLAGS still comes last). -O3 by default; a sanitizer build uses -O1 -g with frame
# pointers for readable reports.
# Defines DL_SANITIZERS in config.h ("none" or the list) for the programs' build line.
AC_DEFUN([DL_SET_CFLAGS], [
AC_REQUIRE([DL_ARG_NATIVE])
AC_REQUIRE([DL_ARG_SANITIZERS])
DL_CFLAGS="-std=c11 -Wall -Wextra -fno-trapping-math"
AS_IF([test "x$enable_sanitizers" != xno && test "x$enable_sanitizers" != x],
  [DL_CFLAGS="$DL_CFLAGS -O1 -g -fno-omit-frame-pointer -fsanitize=$enable_sanitizers"
   DL_LDFLAGS="-fsanitize=$enable_sanitizers"
   DL_SANITIZERS="$enable_sanitizers"],
  [DL_CFLAGS="$DL_CFLAGS -O3"; DL_SANITIZERS=none])
AS_IF([test "x$enable_native" = xyes], [DL_CFLAGS="$DL_CFLAGS -march=native"])
AC_SUBST([DL_CFLAGS])
AC_SUBST([DL_LDFLAGS])
AC_DEFINE_UNQUOTED([DL_SANITIZERS], ["$DL_SANITIZERS"], [sanitizers this build uses])
])
