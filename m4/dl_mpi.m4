# DL_CHECK_MPI: --with-mpi (default: check). The compile and link flags of the installed mpicc
# (Open MPI's --showme, MPICH's -compile_info / -link_info), checked by linking a program that
# calls MPI_Init_thread. Substitutes MPICC, MPIRUN, MPI_CFLAGS, MPI_LIBS (empty without MPI),
# defines DL_HAVE_MPI and the automake conditional HAVE_MPI. --with-mpi without a working
# mpicc is an error; a missing mpirun only a warning (the MPI tests skip).
AC_DEFUN([DL_CHECK_MPI], [
AC_ARG_WITH([mpi],
  [AS_HELP_STRING([--with-mpi], [build the MPI transport for many machines (default: when mpicc is found; --without-mpi: never)])],
  [], [with_mpi=check])
have_mpi=no
MPI_CFLAGS=
MPI_LIBS=
AS_IF([test "x$with_mpi" != xno], [
  AC_PATH_PROGS([MPICC], [mpicc mpicc.openmpi mpicc.mpich])
  AC_PATH_PROGS([MPIRUN], [mpirun mpiexec mpirun.openmpi mpiexec.mpich])
  AS_IF([test -n "$MPICC"], [
    AS_IF([MPI_CFLAGS=`$MPICC --showme:compile 2>/dev/null` && MPI_LIBS=`$MPICC --showme:link 2>/dev/null`], [],
      [MPI_CFLAGS=`$MPICC -compile_info 2>/dev/null | cut -d' ' -f2- | tr ' ' '\n' | grep -E '^-(I|D|pthread)' | tr '\n' ' '`
       MPI_LIBS=`$MPICC -link_info 2>/dev/null | cut -d' ' -f2- | tr ' ' '\n' | grep -E '^-(L|l|Wl|pthread)' | tr '\n' ' '`])
    dl_save_CFLAGS=$CFLAGS; dl_save_LIBS=$LIBS
    CFLAGS="$CFLAGS $MPI_CFLAGS"; LIBS="$MPI_LIBS $LIBS"
    AC_MSG_CHECKING([whether MPI programs link ($MPICC)])
    AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <mpi.h>]],
        [[int p; MPI_Init_thread(0, 0, MPI_THREAD_MULTIPLE, &p); MPI_Finalize();]])],
      [have_mpi=yes], [have_mpi=no])
    AC_MSG_RESULT([$have_mpi])
    CFLAGS=$dl_save_CFLAGS; LIBS=$dl_save_LIBS])
  AS_IF([test "x$have_mpi" = xno && test "x$with_mpi" = xyes],
    [AC_MSG_ERROR([--with-mpi: no working mpicc (install openmpi-bin libopenmpi-dev, or MPICH)])])
  AS_IF([test "x$have_mpi" = xyes && test -z "$MPIRUN"],
    [AC_MSG_WARN([MPI found but no mpirun: the MPI tests will be skipped])])
])
AS_IF([test "x$have_mpi" = xyes],
  [AC_DEFINE([DL_HAVE_MPI], [1], [the MPI transport is built])],
  [MPI_CFLAGS=; MPI_LIBS=])
AM_CONDITIONAL([HAVE_MPI], [test "x$have_mpi" = xyes])
AC_SUBST([MPI_CFLAGS])
AC_SUBST([MPI_LIBS])
AC_SUBST([MPIRUN])
])
