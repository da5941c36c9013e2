/* The named prims (prims.h): each receiving prim is acquire -> copy or reduce -> release, then
 * the send if it has one, so the slot returns upstream before anything more goes downstream. */
#include "config.h"
#include <string.h>
#include "distlab.h"
#include "coll/prims.h"

int dl__prims_open(dl_prims *p, dl_call *k, int from, int to, dl_dtype t, dl_redop op)
{
    int r = k->c->rank, rc;
    *p = (dl_prims){.k = k, .t = t, .op = op, .es = dl__dtype_size(t)};
    if (to >= 0 && (rc = dl__xfer_link(k, r, to, &p->out)))
        return rc;
    if (from >= 0 && (rc = dl__xfer_link(k, from, r, &p->in)))
        return rc;
    return DL_OK;
}

int dl__prims_ring(dl_prims *p, dl_call *k, dl_dtype t, dl_redop op)
{
    int n = k->c->sh->n, r = k->c->rank;
    return dl__prims_open(p, k, dl__mod(r - 1, n), dl__mod(r + 1, n), t, op);
}

int dl__send(dl_prims *p, const void *src, size_t n)
{
    return dl__xfer_post(p->k, p->out, src, n * p->es);
}

/* The received message's bytes: valid until the release. */
static int take(dl_prims *p, size_t n, const void **up)
{
    return dl__xfer_acquire(p->k, p->in, n * p->es, up);
}

int dl__recv(dl_prims *p, void *dst, size_t n)
{
    const void *up;
    int rc = take(p, n, &up);
    if (rc)
        return rc;
    if (p->nt)
        dl__copy_final(dst, up, n * p->es);
    else if (n)
        memcpy(dst, up, n * p->es);
    return dl__xfer_release(p->k, p->in);
}

int dl__recv_copy_send(dl_prims *p, void *dst, size_t n)
{
    const void *up;
    int rc = take(p, n, &up);
    if (rc)
        return rc;
    memcpy(dst, up, n * p->es);
    if ((rc = dl__xfer_release(p->k, p->in)))
        return rc;
    return dl__send(p, dst, n);
}

int dl__recv_reduce_copy(dl_prims *p, const void *mine, void *dst, size_t n, double div)
{
    const void *up;
    int rc = take(p, n, &up);
    if (rc)
        return rc;
    dl__reduce(p->t, dst, mine, up, n, p->op, div);
    return dl__xfer_release(p->k, p->in);
}

int dl__recv_reduce_copy_send(dl_prims *p, const void *mine, void *dst, size_t n, double div)
{
    int rc = dl__recv_reduce_copy(p, mine, dst, n, div);
    return rc ? rc : dl__send(p, dst, n);
}

int dl__recv_reduce_send(dl_prims *p, const void *mine, void *part, size_t n)
{
    return dl__recv_reduce_copy_send(p, mine, part, n, 1.0);
}

int dl__recv_hold(dl_prims *p, size_t n, const void **data) { return take(p, n, data); }

int dl__recv_done(dl_prims *p) { return dl__xfer_release(p->k, p->in); }

int dl__prims_flush(dl_prims *p) { return p->out ? dl__xfer_flush(p->k, p->out) : DL_OK; }
