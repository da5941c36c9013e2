#define _GNU_SOURCE
/* A rank's checkpoint writer thread (io/ckdir_writer.h): one job at a time under a mutex and a
 * condition variable; the job's times and message are handed back to the waiter. */
#include "config.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "distlab.h"
#include "io/ckdir_writer.h"

struct dl__ckd_writer {
    int sync;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* a job posted, a job done, or stop */
    dl__ckd_job job;   /* posted and not yet taken by the thread */
    void *arg;
    int posted, running, stop; /* posted: until waited for */
    int status;
    char msg[1024];
    uint64_t t_post;
    dl__ckd_job_time time;
};

static double thread_cpu_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Run the job on this thread and keep its results (caller holds no lock). */
static void run_job(dl__ckd_writer *w, dl__ckd_job job, void *arg, int *status, char *msg,
                    dl__ckd_job_time *t)
{
    double c0 = thread_cpu_ms();
    dl_error_clear();
    *status = job(arg);
    snprintf(msg, sizeof w->msg, "%s", *status ? dl_errmsg() : "");
    t->cpu_ms = thread_cpu_ms() - c0;
    t->wall_ms = (double)(dl_now_ns() - w->t_post) / 1e6;
}

static void *writer_main(void *p)
{
    dl__ckd_writer *w = p;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->job && !w->stop) pthread_cond_wait(&w->cv, &w->mu);
        if (!w->job)
            break;
        dl__ckd_job job = w->job;
        void *arg = w->arg;
        w->job = NULL;
        pthread_mutex_unlock(&w->mu);
        int status;
        char msg[sizeof w->msg];
        dl__ckd_job_time t;
        run_job(w, job, arg, &status, msg, &t);
        pthread_mutex_lock(&w->mu);
        w->status = status;
        memcpy(w->msg, msg, sizeof msg);
        w->time = t;
        w->running = 0;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

int dl__ckd_writer_create(int sync, dl__ckd_writer **out)
{
    dl__ckd_writer *w = calloc(1, sizeof *w);
    *out = NULL;
    if (!w)
        return dl_error(DL_ENOMEM, "checkpoint writer: out of memory");
    w->sync = sync;
    if (pthread_mutex_init(&w->mu, NULL) || pthread_cond_init(&w->cv, NULL)) {
        free(w);
        return dl_error(DL_ESYS, "checkpoint writer: cannot initialise its lock");
    }
    if (!sync && pthread_create(&w->th, NULL, writer_main, w)) {
        pthread_cond_destroy(&w->cv);
        pthread_mutex_destroy(&w->mu);
        free(w);
        return dl_error(DL_ESYS, "checkpoint writer: cannot start its thread");
    }
    *out = w;
    return DL_OK;
}

void dl__ckd_writer_post(dl__ckd_writer *w, dl__ckd_job job, void *arg)
{
    w->t_post = dl_now_ns();
    if (w->sync) {
        w->posted = 1;
        run_job(w, job, arg, &w->status, w->msg, &w->time);
        return;
    }
    pthread_mutex_lock(&w->mu);
    w->job = job;
    w->arg = arg;
    w->posted = w->running = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

int dl__ckd_writer_busy(dl__ckd_writer *w)
{
    if (w->sync)
        return 0;
    pthread_mutex_lock(&w->mu);
    int busy = w->posted && w->running;
    pthread_mutex_unlock(&w->mu);
    return busy;
}

/* wait for the posted job: its status (the writer idle after) */
static int settle(dl__ckd_writer *w, dl__ckd_job_time *t)
{
    pthread_mutex_lock(&w->mu);
    while (w->posted && w->running) pthread_cond_wait(&w->cv, &w->mu);
    int was = w->posted, st = was ? w->status : DL_OK;
    if (t)
        *t = was ? w->time : (dl__ckd_job_time){0, 0};
    w->posted = 0;
    pthread_mutex_unlock(&w->mu);
    return st;
}

int dl__ckd_writer_wait(dl__ckd_writer *w, dl__ckd_job_time *t)
{
    int st = settle(w, t);
    return st ? dl_error(st, "%s", w->msg) : DL_OK;
}

void dl__ckd_writer_destroy(dl__ckd_writer *w)
{
    if (!w)
        return;
    settle(w, NULL); /* a failure is the waiter's to report: the caller's message stays */
    if (!w->sync) {
        pthread_mutex_lock(&w->mu);
        w->stop = 1;
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->mu);
        pthread_join(w->th, NULL);
    }
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w);
}
