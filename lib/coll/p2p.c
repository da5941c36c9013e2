/* Point-to-point: blocking sends and receives, and tagged non-blocking sends completed by
 * ticket (the link's released count), as requests on the collectives' machinery: each runs at
 * once on the caller's thread, or queued behind the rank's pending non-blocking collectives on
 * its communication thread (the caller waits for its turn), so each link end has one owner. */
#include "config.h"
#include <stdio.h>
#include <string.h>
#include "distlab.h"
#include "transport/chan.h"
#include "runtime/internal.h"
#include "coll/prims.h"
#include "coll/algo.h"

static const char *p2p_name(const dl_request *q)
{
    return q->kind == OP_RECV ? "recv" : q->ticket ? "isend" : "send";
}

/* Validate on the caller's thread; the request then runs like a collective's (dl__run_op):
 * at once, or behind this rank's pending requests. */
static int p2p(dl_comm *c, int kind, void *buf, size_t count, dl_dtype t, int peer, int tag,
               dl_purpose p, uint64_t *ticket)
{
    dl_request q; /* not zeroed whole: its 512-byte message is written only on failure, and
                   * clearing it made point-to-point's 8-byte latency ~10% slower */
    q.kind = kind, q.c = c, q.count = count, q.t = t, q.op = DL_SUM, q.root = peer, q.p = p;
    q.tag = tag, q.ticket = ticket, q.skip = 0;
    const char *what = p2p_name(&q);
    int rc = dl__check_common(c, what, t, 0, DL_SUM);
    if (rc || (rc = dl__check_purpose(what, p)))
        return rc;
    int n = c->sh->n, r = c->rank;
    if (peer < 0 || peer >= n || peer == r)
        return dl_error(DL_EINVAL, "%s: peer %d invalid for rank %d of %d", what, peer, r, n);
    if (count && !buf)
        return dl_error(DL_EINVAL, "%s: null buffer for %zu elements", what, count);
    q.sbuf = q.rbuf = buf;
    return dl__submit_blocking(&q);
}

int dl__run_p2p(dl_request *q)
{
    dl_comm *c = q->c;
    int send = q->kind == OP_SEND, peer = q->root, r = c->rank, rc;
    const char *what = p2p_name(q);
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
            if (q->ticket)
                *q->ticket = l->stats.msgs_sent;
            else
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
    if (rc) {
        char prev[768];
        snprintf(prev, sizeof prev, "%s", dl_errmsg());
        rc = dl_error(rc, "%s %s rank %d on communicator %llu: %s", what, send ? "to" : "from",
                      peer, (unsigned long long)c->sh->uid, prev);
        dl__fail_and_drain(c);
    }
    dl__op_end(c, rc);
    return rc;
}

int dl_send(dl_comm *c, const void *buf, size_t count, dl_dtype t, int peer, dl_purpose p)
{
    return p2p(c, OP_SEND, (void *)buf, count, t, peer, 0, p, NULL);
}

int dl_isend(dl_comm *c, const void *buf, size_t count, dl_dtype t, int peer, int tag, dl_purpose p,
             uint64_t *ticket)
{
    uint64_t dummy;
    return p2p(c, OP_SEND, (void *)buf, count, t, peer, tag, p, ticket ? ticket : &dummy);
}

int dl_recv_tag(dl_comm *c, void *buf, size_t count, dl_dtype t, int peer, int tag, dl_purpose p)
{
    return p2p(c, OP_RECV, buf, count, t, peer, tag, p, NULL);
}

static int send_link(dl_comm *c, int peer, const char *what, dl_link **l)
{
    if (!c || peer < 0 || peer >= c->sh->n || peer == c->rank)
        return dl_error(DL_EINVAL, "%s: peer %d invalid", what, peer);
    *l = atomic_load_explicit(&c->sh->links[(size_t)c->rank * (size_t)c->sh->n + (size_t)peer],
                              memory_order_acquire);
    if (!*l)
        return dl_error(DL_EINVAL, "%s: nothing was sent to rank %d", what, peer);
    return DL_OK;
}

int dl_send_test(dl_comm *c, int peer, uint64_t ticket, int *done)
{
    dl_link *l;
    int rc = send_link(c, peer, "send test", &l);
    if (rc)
        return rc;
    *done = dl_link_released(l) >= ticket;
    return DL_OK;
}

int dl_send_wait(dl_comm *c, int peer, uint64_t ticket)
{
    dl_link *l;
    int rc = send_link(c, peer, "send wait", &l);
    if (rc)
        return rc;
    if (dl_link_released(l) >= ticket)
        return DL_OK;
    uint64_t w0 = l->stats.send_wait_ns, s0 = l->stats.send_sleeps;
    rc = dl_link_wait_released(l, ticket, &c->ctx->waiter);
    c->st.wait_ns += l->stats.send_wait_ns - w0;
    c->st.sleeps += l->stats.send_sleeps - s0;
    if (rc) {
        char prev[768];
        snprintf(prev, sizeof prev, "%s", dl_errmsg());
        rc = dl_error(rc, "waiting for rank %d to take a send on communicator %llu: %s", peer,
                      (unsigned long long)c->sh->uid, prev);
        dl__fail_and_drain(c);
    }
    return rc;
}

void dl_comm_fail(dl_comm *c)
{
    if (c)
        dl__fail_and_drain(c);
}

int dl_recv(dl_comm *c, void *buf, size_t count, dl_dtype t, int peer, dl_purpose p)
{
    return p2p(c, OP_RECV, buf, count, t, peer, 0, p, NULL);
}
