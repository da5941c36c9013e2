/* distlab: files the library reads and writes, kept from hanging or destroying anything.
 *
 * Inputs (corpora, checkpoints) are read only from regular files: a FIFO with no writer would
 * block open() forever and a device such as /dev/zero never ends, so the type is checked before
 * any blocking open. Outputs (checkpoints, traces, the apps' JSON, plots) are written by
 * truncation or by an atomic rename, and either would destroy what PATH names; so an existing
 * PATH must be a regular file, not a symlink (a rename replaces the link itself rather than
 * following it, so the rule is the same for both ways of writing), and the directory must let us
 * create files. The checks are made up front, so that a long run cannot end in "cannot write". */
#ifndef DISTLAB_IO_PATH_H
#define DISTLAB_IO_PATH_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Open `path` for reading if it is a regular file: *fd set (O_CLOEXEC, blocking reads). `what`
 * names the file in the message ("checkpoint", "data"). The type is checked with stat before
 * open and again with fstat on a non-blocking open (the name may change in between). DL_EINVAL
 * for a missing path or one that is not a regular file, DL_ESYS for other system errors. */
int dl_path_open_input(const char *path, const char *what, int *fd);

/* DL_OK if `path` may be written by truncation or by renaming a temporary file over it: it does
 * not exist, or it is a regular file (not a symlink) that we may write; and its directory exists
 * and we may create files in it. Otherwise DL_EINVAL (not a regular file, or a symlink) or
 * DL_ESYS (no such directory, no permission) naming `what`, the path and the reason. Nothing is
 * created. */
int dl_path_check_output(const char *path, const char *what);

/* Files are replaced by writing PATH.tmp.PID (PID: the writing process) and renaming it over
 * PATH. Remove the PATH.tmp.PID files of processes that no longer exist (a writer killed with
 * SIGKILL leaves its temporary behind): those whose PID is not alive on this host (kill(pid, 0)
 * fails with ESRCH). Those of live processes, this one included, are kept. Returns the number
 * removed (0 also when the directory cannot be read). */
int dl_path_remove_stale_tmp(const char *path);

#ifdef __cplusplus
}
#endif

#endif
