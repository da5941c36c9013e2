/* distlab: error codes and the per-thread error message.
 *
 * Every library function that can fail returns one of these codes (DL_OK on success) and leaves
 * a message naming what failed, readable with dl_errmsg() from the same thread. */
#ifndef DISTLAB_ERROR_H
#define DISTLAB_ERROR_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dl_status {
    DL_OK = 0,
    DL_EINVAL = 1,    /* invalid argument (null buffer, bad count, unknown type or op, ...) */
    DL_ENOMEM = 2,    /* out of memory: host allocation or a rank's arena capacity */
    DL_EABORT = 3,    /* the world was aborted because another rank failed */
    DL_ETIMEOUT = 4,  /* the watchdog found a rank stuck longer than the timeout */
    DL_EMISMATCH = 5, /* ranks disagree on a collective's arguments (count, type, op, root) */
    DL_ESYS = 6,      /* a system call or library (hwloc, pthreads) failed */
    DL_EUSER = 7      /* a rank function returned an error of its own */
} dl_status;

/* Short constant name of a status code ("DL_EINVAL"). */
const char *dl_strstatus(int status);

/* Message of the last error set on this thread ("" if none). Valid until the next error. */
const char *dl_errmsg(void);

/* Set this thread's message (printf-style) and return `status`, so that a failing path reads
 * `return dl_error(DL_EINVAL, "allreduce: null buffer");`. */
int dl_error(int status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Clear this thread's message. */
void dl_error_clear(void);

#ifdef __cplusplus
}
#endif
#endif
