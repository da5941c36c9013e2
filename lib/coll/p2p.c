/* Point-to-point: sends and receives as requests on the collectives' machinery, so that one
 * owner at a time drives a rank's link ends. With nothing pending on the rank they run on the
 * caller's thread: a blocking call at once, dl_isend posts at once and the caller polls the
 * link's released count, dl_irecv waits in the caller's list (dl_test polls its link, dl_wait
 * receives; a blocking call made meanwhile, or a wait on an isend not yet released, hands the
 * list to the communication thread). Otherwise
 * they queue on the rank's communication thread (progress.c), which never waits on one: it posts
 * sends, keeps the unfinished ones in its poll list (a receive until its link has a message, a
 * send until its link released it) and polls them between collectives; a collective first
 * finishes the receives its communicator's links owe (FIFO per link). */
#include "config.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "distlab.h"
#include "transport/chan.h"
#include "runtime/internal.h"
#include "coll/prims.h"
#include "coll/algo.h"

static const char *p2p_name(const dl_request *q)
{
    if (q->kind == OP_RECV)
        return q->nb ? "irecv" : "recv";
    return q->nb ? "isend" : "send";
}

/* Fill and validate on the caller's thread. */
static int p2p_fill(dl_request *q, dl_comm *c, int kind, void *buf, size_t count, dl_dtype t,
                    int peer, int tag, dl_purpose p, int nb)
{
    /* not zeroed whole: its 512-byte message is written only on failure, and clearing it made
     * point-to-point's 8-byte latency ~10% slower */
    q->kind = kind, q->c = c, q->count = count, q->t = t, q->op = DL_SUM, q->root = peer, q->p = p;
    q->tag = tag, q->nb = nb, q->posted = q->own = q->skip = q->agreed = 0, q->link = NULL;
    q->status = DL_OK, q->sbuf = q->rbuf = buf;
    atomic_init(&q->wait0, 0);
    const char *what = p2p_name(q);
    int rc = dl__check_common(c, what, t, 0, DL_SUM);
    if (rc || (rc = dl__check_purpose(what, p)))
        return rc;
    int n = c->sh->n, r = c->rank;
    if (peer < 0 || peer >= n || peer == r)
        return dl_error(DL_EINVAL, "%s: peer %d invalid for rank %d of %d", what, peer, r, n);
    if (count && !buf)
        return dl_error(DL_EINVAL, "%s: null buffer for %zu elements", what, count);
    return DL_OK;
}

/* Name the call in a failure, abort the world and drain this rank's lent buffers. */
static int p2p_fail(dl_request *q, int rc)
{
    char prev[768];
    snprintf(prev, sizeof prev, "%s", dl_errmsg());
    rc = dl_error(rc, "%s %s rank %d (tag %d) on communicator %llu: %s", p2p_name(q),
                  q->kind == OP_SEND ? "to" : "from", q->root, q->tag,
                  (unsigned long long)q->c->sh->uid, prev);
    dl__fail_and_drain(q->c);
    return rc;
}

/* A send posts its message (and with `flush` waits until no lent buffer is read); a receive
 * takes its message. */
static int run_p2p(dl_request *q, int flush)
{
    dl_comm *c = q->c;
    int send = q->kind == OP_SEND, peer = q->root, r = c->rank, rc;
    size_t bytes = q->count * dl_dtype_size(q->t);
    /* point-to-point does not advance the collective sequence; the fingerprint is the type and
     * the tag (in the sequence's place) */
    dl_call k = dl__call(c, OP_SEND, (uint64_t)(int64_t)q->tag, q->t, DL_SUM, 0, -1, q->p);
    k.opcode = q->kind;
    dl__op_begin(c, k.opcode, q->count, (int)q->t, peer);
    dl_link *l;
    if (send) {
        if ((rc = dl__xfer_link(&k, r, peer, &l)) == DL_OK &&
            (rc = dl__xfer_post(&k, l, q->sbuf, bytes)) == DL_OK) {
            q->posted = 1, q->link = l, q->until = l->stats.msgs_sent;
            if (flush)
                rc = dl__xfer_flush(&k, l);
        }
    } else {
        const void *up;
        if ((rc = dl__xfer_link(&k, peer, r, &l)) == DL_OK &&
            (rc = dl__xfer_acquire(&k, l, bytes, &up)) == DL_OK) {
            memcpy(q->rbuf, up, bytes);
            rc = dl__xfer_release(&k, l);
        }
    }
    if (rc)
        rc = p2p_fail(q, rc);
    dl__op_end(c, rc);
    return rc;
}

int dl__run_p2p(dl_request *q) { return run_p2p(q, !q->nb); }

static int p2p(dl_comm *c, int kind, void *buf, size_t count, dl_dtype t, int peer, int tag,
               dl_purpose p)
{
    dl_request q;
    int rc = p2p_fill(&q, c, kind, buf, count, t, peer, tag, p, 0);
    q.next = NULL;
    return rc ? rc : dl__submit_blocking(&q);
}

int dl_send(dl_comm *c, const void *buf, size_t count, dl_dtype t, int peer, dl_purpose p)
{
    return p2p(c, OP_SEND, (void *)buf, count, t, peer, 0, p);
}

int dl_recv(dl_comm *c, void *buf, size_t count, dl_dtype t, int peer, dl_purpose p)
{
    return p2p(c, OP_RECV, buf, count, t, peer, 0, p);
}

int dl_recv_tag(dl_comm *c, void *buf, size_t count, dl_dtype t, int peer, int tag, dl_purpose p)
{
    return p2p(c, OP_RECV, buf, count, t, peer, tag, p);
}

/* ---- non-blocking: dl_isend, dl_irecv ---- */

/* Whether a post to peer would find a free slot (posts wait only for one). */
static int ring_room(dl_comm *c, int peer, int *rc)
{
    dl_link *l;
    if ((*rc = dl__link(c, c->rank, peer, &l)))
        return 0;
    return l->stats.msgs_sent - dl_link_released(l) < (uint64_t)c->ctx->w->opts.nslots;
}

/* Whether the rank's own thread drives its links now (nothing queued, running or polled). */
static int caller_owns(const dl_comm *c)
{
    return atomic_load_explicit(&c->ctx->prog.pending, memory_order_acquire) == 0;
}

static void unlink_mine(dl_progress *p, const dl_request *q)
{
    for (dl_request **pp = &p->mine; *pp; pp = &(*pp)->next)
        if (*pp == q) {
            *pp = q->next;
            return;
        }
}

/* Run an own receive on the caller's thread: it leaves the caller's list complete (dl_wait and
 * dl_test then find it done). */
static int own_recv_run(dl_progress *p, dl_request *q)
{
    unlink_mine(p, q);
    q->own = 0;
    int rc = dl__run_p2p(q);
    q->status = rc;
    if (rc)
        snprintf(q->errmsg, sizeof q->errmsg, "%s", dl_errmsg());
    atomic_store_explicit(&q->done, 1, memory_order_release);
    return rc;
}

/* Run the own receives of q's link up to q, oldest first (mine is newest first); with
 * `only_ready`, only while their messages are there (or the world aborted). 1: q is complete. */
static int own_recv_finish(dl_progress *p, dl_request *q, int only_ready)
{
    for (;;) {
        dl_request *old = NULL;
        for (dl_request *e = p->mine; e; e = e->next)
            if (e->kind == OP_RECV && e->c == q->c && e->root == q->root)
                old = e;
        if (!old) /* q already ran */
            return 1;
        dl_link *l;
        atomic_int *af = q->c->ctx->waiter.abort_flag;
        if (only_ready && dl__link(q->c, q->root, q->c->rank, &l) == DL_OK && !dl_link_ready(l) &&
            !(af && atomic_load_explicit(af, memory_order_relaxed)))
            return 0;
        own_recv_run(p, old);
        if (old == q)
            return 1;
    }
}

/* Run at once on the caller's thread, or queue. The caller keeps what it ran (an isend until its
 * link released it, an irecv until its message came) in its own list, polled by dl_test and
 * completed by dl_wait on this thread, and hands the list to the communication thread when it
 * next queues something. */
static int nb_start(dl_request *q, int now, dl_request **req)
{
    atomic_init(&q->done, 0);
    q->next = NULL;
    int rc = !now ? dl__progress_enqueue(q) : q->kind == OP_SEND ? dl__run_p2p(q) : DL_OK;
    if (rc) {
        free(q);
        return rc;
    }
    if (now) {
        dl_progress *p = &q->c->ctx->prog;
        q->own = 1, q->next = p->mine, p->mine = q;
        if (q->kind == OP_RECV) /* at once when its message is already there */
            own_recv_finish(p, q, 1);
    }
    *req = q;
    return DL_OK;
}

static int nb_p2p(dl_comm *c, int kind, void *buf, size_t count, dl_dtype t, int peer, int tag,
                  dl_purpose p, dl_request **req)
{
    const char *what = kind == OP_SEND ? "isend" : "irecv";
    if (!req)
        return dl_error(DL_EINVAL, "%s: null request pointer", what);
    *req = NULL;
    dl_request *q = malloc(sizeof *q);
    if (!q)
        return dl_error(DL_ENOMEM, "%s: out of memory for a request", what);
    int rc = p2p_fill(q, c, kind, buf, count, t, peer, tag, p, 1);
    if (rc) {
        free(q);
        return rc;
    }
    /* the caller may not wait for a slot while it keeps receives the peer may need first */
    int now = caller_owns(c);
    if (now && kind == OP_SEND && dl__p2p_own_recvs(&c->ctx->prog) && !ring_room(c, peer, &rc)) {
        if (rc) {
            rc = p2p_fail(q, rc);
            free(q);
            return rc;
        }
        now = 0;
    }
    return nb_start(q, now, req);
}

int dl_isend(dl_comm *c, const void *buf, size_t count, dl_dtype t, int peer, int tag, dl_purpose p,
             dl_request **req)
{
    return nb_p2p(c, OP_SEND, (void *)buf, count, t, peer, tag, p, req);
}

int dl_irecv(dl_comm *c, void *buf, size_t count, dl_dtype t, int peer, int tag, dl_purpose p,
             dl_request **req)
{
    return nb_p2p(c, OP_RECV, buf, count, t, peer, tag, p, req);
}

/* ---- what the caller polls (dl_wait / dl_test come here for it) ---- */

int dl__p2p_own_recvs(const dl_progress *p)
{
    for (const dl_request *e = p->mine; e; e = e->next)
        if (e->kind == OP_RECV)
            return 1;
    return 0;
}

int dl__p2p_own_test(dl_request *q)
{
    if (q->kind == OP_RECV)
        return own_recv_finish(&q->c->ctx->prog, q, 1);
    return dl_link_released(q->link) >= q->until;
}

int dl__p2p_own_wait(dl_request *q)
{
    dl_progress *p = &q->c->ctx->prog;
    if (q->kind == OP_RECV) {
        own_recv_finish(p, q, 0);
        int rc = q->status;
        return rc ? dl_error(rc, "%s", q->errmsg) : DL_OK;
    }
    dl_link *l = q->link;
    if (dl_link_released(l) < q->until && dl__p2p_own_recvs(p)) {
        /* The peer may release this send only after one of the caller's own receives ran: it
         * may be waiting on its own send just so, each rank's look for the other's message
         * having come before that message was visible (the store-buffer reordering of two
         * posts and two looks). Never block one for the other: the communication thread polls
         * them all from now on, and the caller waits for this one there. */
        int rc = dl__progress_adopt(q->c->ctx);
        return rc ? rc : dl__progress_wait(q);
    }
    unlink_mine(p, q);
    if (dl_link_released(l) >= q->until)
        return DL_OK;
    dl_comm *c = q->c;
    uint64_t w0 = l->stats.send_wait_ns, s0 = l->stats.send_sleeps;
    int rc = dl_link_wait_released(l, q->until, &c->ctx->waiter);
    c->st.wait_ns += l->stats.send_wait_ns - w0;
    c->st.sleeps += l->stats.send_sleeps - s0;
    return rc ? p2p_fail(q, rc) : DL_OK;
}

/* The caller's own requests go to the communication thread ahead of what it queues next. */
int dl__p2p_hand_over(dl_progress *p, dl_request **head, dl_request **tail)
{
    int n = 0;
    dl_request *rev = NULL;
    while (p->mine) { /* mine is newest first */
        dl_request *q = p->mine;
        p->mine = q->next;
        q->next = rev, rev = q;
    }
    *head = rev;
    for (dl_request *q = rev; q; q = q->next, n++) {
        q->own = 0;
        *tail = q;
    }
    return n;
}

/* ---- the communication thread's side ---- */

/* Whether an earlier request of the list waits on q's link end: a receive not yet run, or a
 * send not yet posted (each link end's messages go in the order started). */
static int earlier_on_link(const dl_request *list, const dl_request *q)
{
    for (const dl_request *e = list; e && e != q; e = e->next)
        if (e->kind == q->kind && e->c == q->c && e->root == q->root &&
            (e->kind == OP_RECV || !e->posted))
            return 1;
    return 0;
}

/* Post q unless its link's ring is full (the thread never waits for a slot); 1 when posted. */
static int try_post(dl_request *q, int *rc)
{
    int room = ring_room(q->c, q->root, rc);
    if (!room && !*rc)
        return 0;
    if (!*rc)
        *rc = run_p2p(q, 0);
    return 1;
}

/* A posted send is done once released; a blocking one whose message cannot have been lent (at
 * most the eager size) is done when posted, as dl_send's flush would find. */
static int send_done(const dl_request *q)
{
    size_t bytes = q->count * dl_dtype_size(q->t);
    if (!q->nb && bytes <= q->c->ctx->w->opts.eager_bytes)
        return 1;
    return dl_link_released(q->link) >= q->until;
}

/* A queued request reaches the thread: 1 when it must be polled, 0 when complete (*rc). */
int dl__p2p_start(dl_request *q, dl_request *list, int *rc)
{
    *rc = DL_OK;
    if (q->kind == OP_RECV || earlier_on_link(list, q))
        return 1;
    if (!q->posted && !try_post(q, rc))
        return 1;
    return !*rc && !send_done(q);
}

/* One poll of q: 1 when complete (*rc). A receive runs once its link has a message, a send
 * posts once its ring has room, each after the earlier ones of its link end; the world's abort,
 * or its timeout while the caller waits, ends a waiting one. */
static int p2p_try(dl_request *list, dl_request *q, int *rc)
{
    dl_comm *c = q->c;
    const dl_world *w = c->ctx->w;
    atomic_int *af = c->ctx->waiter.abort_flag;
    int aborted = af && atomic_load_explicit(af, memory_order_relaxed);
    /* the world's timeout counts while the caller waits for the request (the watchdog's rule:
     * a rank stuck that long in one call); a request merely outstanding never times out */
    uint64_t w0 = atomic_load_explicit(&q->wait0, memory_order_relaxed);
    uint64_t waited = w0 ? dl_now_ns() - w0 : 0;
    int late = w->opts.timeout_s > 0 && (double)waited > w->opts.timeout_s * 1e9;
    *rc = DL_OK;
    if (q->kind == OP_SEND && q->posted) {
        if (send_done(q))
            return 1;
    } else if (!earlier_on_link(list, q)) {
        dl_link *l;
        if (q->kind == OP_SEND) {
            if (try_post(q, rc) && (*rc || send_done(q)))
                return 1;
        } else if ((*rc = dl__link(c, q->root, c->rank, &l)) || dl_link_ready(l) || aborted) {
            *rc = *rc ? p2p_fail(q, *rc) : dl__run_p2p(q);
            return 1;
        }
    }
    if (!aborted && !late)
        return 0;
    dl_error(aborted ? DL_EABORT : DL_ETIMEOUT, "%s after %.1f s waiting for rank %d",
             aborted ? "aborted" : "timed out (the world's timeout)", (double)waited / 1e9,
             q->root);
    *rc = p2p_fail(q, aborted ? DL_EABORT : DL_ETIMEOUT);
    return 1;
}

/* Poll every request of the thread's list once; completed ones leave it. Returns how many. */
int dl__p2p_poll(dl_progress *p)
{
    int n = 0, rc;
    for (dl_request **pp = &p->poll; *pp;) {
        dl_request *q = *pp;
        if (p2p_try(p->poll, q, &rc)) {
            *pp = q->next;
            dl__progress_complete(q, rc);
            n++;
        } else {
            pp = &q->next;
        }
    }
    return n;
}

/* Before a collective on c: the receives c's links owe and the sends not yet posted, in order
 * (a receive waits for its message, which its sender posted before entering the collective; a
 * send waits for a slot, which its receiver frees the same way). */
void dl__p2p_settle(dl_progress *p, dl_comm *c)
{
    for (dl_request **pp = &p->poll; *pp;) {
        dl_request *q = *pp;
        int rc = DL_OK;
        if (q->c == c && (q->kind == OP_RECV || !q->posted)) {
            rc = q->kind == OP_RECV ? dl__run_p2p(q) : run_p2p(q, 0);
            if (rc || q->kind == OP_RECV || send_done(q)) {
                *pp = q->next;
                dl__progress_complete(q, rc);
                continue;
            }
        }
        pp = &q->next;
    }
}

void dl_comm_fail(dl_comm *c)
{
    if (c)
        dl__fail_and_drain(c);
}
