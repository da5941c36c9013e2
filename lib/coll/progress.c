/* The rank's communication thread: non-blocking requests run on it in the order started (started
 * on first use, bound as its rank is); a blocking call made while requests are pending queues
 * behind them, so each link end has one owner at a time. Collectives run to completion there;
 * point-to-point requests are started in order and then polled (p2p.c), so a receive waiting
 * for its message holds up nothing queued after it. */
#include "config.h"
#include <pthread.h>
#include <stdio.h>
#include <sched.h>
#include <stdlib.h>
#include <time.h>
#include "distlab.h"
#include "core/topo.h"
#include "runtime/internal.h"
#include "coll/algo.h"

/* Complete q with status rc and wake its waiters (q may vanish once done is seen). */
void dl__progress_complete(dl_request *q, int rc)
{
    dl_progress *p = &q->c->ctx->prog;
    pthread_mutex_lock(&p->mu);
    q->status = rc;
    if (rc)
        snprintf(q->errmsg, sizeof q->errmsg, "%s", dl_errmsg());
    atomic_store_explicit(&q->done, 1, memory_order_release);
    atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel);
    pthread_cond_broadcast(&p->done_cv);
    pthread_mutex_unlock(&p->mu);
}

/* A collective runs to completion; a point-to-point request is started and, unless that
 * completed it, joins the poll list (in order: receives of one link match in posting order). */
static void run_one(dl_progress *p, dl_request *q)
{
    int rc;
    dl_error_clear();
    if (q->kind == OP_SEND || q->kind == OP_RECV) {
        if (dl__p2p_start(q, p->poll, &rc)) {
            dl_request **pp = &p->poll;
            while (*pp) pp = &(*pp)->next;
            q->next = NULL;
            *pp = q;
            return;
        }
    } else {
        dl__p2p_settle(p, q->c);
        rc = dl__run_op(q);
    }
    dl__progress_complete(q, rc);
}

/* Nothing queued, something polled and nothing progressed: yield a while, then nap on the
 * queue's condition (50 us; new work wakes it at once). Called with the mutex held. */
static void idle_wait(dl_progress *p, int idle)
{
    if (idle < 200) {
        pthread_mutex_unlock(&p->mu);
        sched_yield();
        pthread_mutex_lock(&p->mu);
        return;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 50000;
    if (ts.tv_nsec >= 1000000000L)
        ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    if (!p->head && !p->stop)
        pthread_cond_timedwait(&p->cv, &p->mu, &ts);
}

static void *progress_main(void *arg)
{
    dl_ctx *x = arg;
    dl_progress *p = &x->prog;
    dl__bind_thread(x, 0); /* where its rank runs */
    int idle = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->head && !p->poll && !p->stop) pthread_cond_wait(&p->cv, &p->mu);
        dl_request *q = p->head;
        if (!q && !p->poll)
            break;
        if (q) {
            p->head = q->next;
            if (!p->head)
                p->tail = NULL;
            pthread_mutex_unlock(&p->mu);
            run_one(p, q);
            idle = 0;
            pthread_mutex_lock(&p->mu);
            continue;
        }
        pthread_mutex_unlock(&p->mu);
        dl_error_clear();
        idle = dl__p2p_poll(p) ? 0 : idle + 1;
        pthread_mutex_lock(&p->mu);
        if (idle)
            idle_wait(p, idle);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

void dl__progress_stop(dl_ctx *x)
{
    dl_progress *p = &x->prog;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->th, NULL);
    p->started = 0;
}

/* Append first .. last (n requests, chained) to the thread's queue, starting it if needed. */
static int queue_chain(dl_ctx *x, dl_request *first, dl_request *last, int n)
{
    dl_progress *p = &x->prog;
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->pending, n, memory_order_acq_rel);
    if (p->tail)
        p->tail->next = first;
    else
        p->head = first;
    p->tail = last;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return DL_OK;
}

static int start_thread(dl_ctx *x)
{
    dl_progress *p = &x->prog;
    if (p->started)
        return DL_OK;
    p->stop = 0;
    if (pthread_create(&p->th, NULL, progress_main, x) != 0)
        return dl_error(DL_ESYS, "rank %d: cannot start its communication thread", x->rank);
    p->started = 1;
    return DL_OK;
}

/* Queue q (after the caller's own requests, which the thread polls from now on). */
int dl__progress_enqueue(dl_request *q)
{
    dl_ctx *x = q->c->ctx;
    int rc = start_thread(x);
    if (rc)
        return rc;
    atomic_init(&q->done, 0);
    q->next = NULL;
    dl_request *first = q, *last = NULL;
    int n = dl__p2p_hand_over(&x->prog, &first, &last);
    if (n)
        last->next = q;
    else
        first = q;
    return queue_chain(x, first, q, 1 + n);
}

int dl__progress_adopt(dl_ctx *x)
{
    int rc = start_thread(x);
    if (rc)
        return rc;
    dl_request *first = NULL, *last = NULL;
    int n = dl__p2p_hand_over(&x->prog, &first, &last);
    return n ? queue_chain(x, first, last, n) : DL_OK;
}

int dl__progress_wait(dl_request *q)
{
    dl_progress *p = &q->c->ctx->prog;
    if (q->kind == OP_SEND || q->kind == OP_RECV) /* the timeout of a polled request (p2p.c) */
        atomic_store_explicit(&q->wait0, dl_now_ns(), memory_order_relaxed);
    pthread_mutex_lock(&p->mu);
    while (!atomic_load_explicit(&q->done, memory_order_acquire))
        pthread_cond_wait(&p->done_cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
    int rc = q->status;
    if (rc)
        dl_error(rc, "%s", q->errmsg);
    return rc;
}

/* Run now on this thread, or behind the pending non-blocking requests of this rank (the caller's
 * own receives looked for only where it keeps own requests at all). */
int dl__submit_blocking(dl_request *q)
{
    dl_progress *p = &q->c->ctx->prog;
    if (atomic_load_explicit(&p->pending, memory_order_acquire) == 0 &&
        (!p->mine || !dl__p2p_own_recvs(p)))
        return dl__run_op(q);
    int rc = dl__progress_enqueue(q);
    return rc ? rc : dl__progress_wait(q);
}

int dl__submit_async(const dl_request *proto, dl_request **req)
{
    if (!req)
        return dl_error(DL_EINVAL, "%s: null request pointer", dl__opname(proto->kind));
    *req = NULL;
    dl_request *q = malloc(sizeof *q);
    if (!q)
        return dl_error(DL_ENOMEM, "%s: out of memory for a request", dl__opname(proto->kind));
    *q = *proto;
    q->nb = q->own = 0;
    int rc = dl__progress_enqueue(q);
    if (rc) {
        free(q);
        return rc;
    }
    *req = q;
    return DL_OK;
}

int dl_wait(dl_request *req)
{
    if (!req)
        return DL_OK;
    int rc = req->own ? dl__p2p_own_wait(req) : dl__progress_wait(req);
    free(req);
    return rc;
}

int dl_test(dl_request *req, int *done)
{
    if (!done)
        return dl_error(DL_EINVAL, "dl_test: null result pointer");
    if (req && req->own)
        *done = dl__p2p_own_test(req);
    else
        *done = !req || atomic_load_explicit(&req->done, memory_order_acquire);
    return DL_OK;
}
