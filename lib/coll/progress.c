/* The rank's communication thread: non-blocking requests run on it in the order started (started
 * on first use, bound as its rank is); a blocking call made while requests are pending queues
 * behind them, so each link end has one owner at a time. */
#include "config.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include "distlab.h"
#include "core/topo.h"
#include "runtime/internal.h"
#include "coll/algo.h"

static void *progress_main(void *arg)
{
    dl_ctx *x = arg;
    dl_progress *p = &x->prog;
    dl__bind_thread(x, 0); /* where its rank runs */
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->head && !p->stop) pthread_cond_wait(&p->cv, &p->mu);
        if (!p->head)
            break;
        dl_request *q = p->head;
        pthread_mutex_unlock(&p->mu);
        dl_error_clear();
        int rc = dl__run_op(q);
        pthread_mutex_lock(&p->mu);
        q->status = rc;
        if (rc)
            snprintf(q->errmsg, sizeof q->errmsg, "%s", dl_errmsg());
        p->head = q->next;
        if (!p->head)
            p->tail = NULL;
        atomic_store_explicit(&q->done, 1, memory_order_release);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel);
        pthread_cond_broadcast(&p->done_cv);
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

static int enqueue(dl_request *q)
{
    dl_ctx *x = q->c->ctx;
    dl_progress *p = &x->prog;
    if (!p->started) {
        p->stop = 0;
        if (pthread_create(&p->th, NULL, progress_main, x) != 0)
            return dl_error(DL_ESYS, "rank %d: cannot start its communication thread", x->rank);
        p->started = 1;
    }
    atomic_init(&q->done, 0);
    q->next = NULL;
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->pending, 1, memory_order_acq_rel);
    if (p->tail)
        p->tail->next = q;
    else
        p->head = q;
    p->tail = q;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return DL_OK;
}

static int wait_req(dl_request *q)
{
    dl_progress *p = &q->c->ctx->prog;
    pthread_mutex_lock(&p->mu);
    while (!atomic_load_explicit(&q->done, memory_order_acquire))
        pthread_cond_wait(&p->done_cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
    int rc = q->status;
    if (rc)
        dl_error(rc, "%s", q->errmsg);
    return rc;
}

/* Run now on this thread, or behind the pending non-blocking requests of this rank. */
int dl__submit_blocking(dl_request *q)
{
    if (atomic_load_explicit(&q->c->ctx->prog.pending, memory_order_acquire) == 0)
        return dl__run_op(q);
    int rc = enqueue(q);
    return rc ? rc : wait_req(q);
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
    int rc = enqueue(q);
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
    int rc = wait_req(req);
    free(req);
    return rc;
}

int dl_test(dl_request *req, int *done)
{
    if (!done)
        return dl_error(DL_EINVAL, "dl_test: null result pointer");
    *done = !req || atomic_load_explicit(&req->done, memory_order_acquire);
    return DL_OK;
}
