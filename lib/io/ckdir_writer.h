/* distlab (private): a rank's checkpoint writer, the thread that runs a save's file I/O while
 * the rank trains on (docs/CHECKPOINTS.md, "Saving without stalling").
 *
 * One job at a time: post one, poll or wait for its end, post the next. A job is plain I/O on
 * data it owns (a snapshot): it makes no collective call, since a rank's communicators have one
 * owner at a time, the rank's thread. Its error message (thread-local on the writer) is handed
 * back by dl__ckd_writer_wait. A synchronous writer runs each job inline on the caller's thread
 * (--ckpt-sync): the same code, measured the same way. No fork(): it is unsafe with rank threads
 * and MPI. */
#ifndef DISTLAB_IO_CKDIR_WRITER_H
#define DISTLAB_IO_CKDIR_WRITER_H

#include <stdint.h>

typedef struct dl__ckd_writer dl__ckd_writer;

/* A job: DL_OK or an error code with the message set (dl_error) on the thread that runs it. */
typedef int (*dl__ckd_job)(void *arg);

/* What the last finished job took. */
typedef struct dl__ckd_job_time {
    double wall_ms; /* from the post to the job's end */
    double cpu_ms;  /* the running thread's CPU time (CLOCK_THREAD_CPUTIME_ID) */
} dl__ckd_job_time;

/* A writer with its thread started (sync: none, jobs run inline). DL_ENOMEM / DL_ESYS. */
int dl__ckd_writer_create(int sync, dl__ckd_writer **out);
/* Run job(arg): on the thread, or inline (then it has ended on return). The writer must be idle
 * (the previous job waited for). */
void dl__ckd_writer_post(dl__ckd_writer *w, dl__ckd_job job, void *arg);
/* 1 while a posted job has not been waited for and is still running, else 0 (never blocks). */
int dl__ckd_writer_busy(dl__ckd_writer *w);
/* Wait for the posted job (none: DL_OK): its status, its message set again on this thread, and
 * its times into *t (may be NULL). The writer is idle after. */
int dl__ckd_writer_wait(dl__ckd_writer *w, dl__ckd_job_time *t);
/* Wait for a posted job, stop the thread and free (NULL is ignored). */
void dl__ckd_writer_destroy(dl__ckd_writer *w);

#endif
