/* Argument validation: every check runs on the caller's thread and returns DL_EINVAL before
 * this rank waits for anyone (the others learn of it through the abort). */
#include "config.h"
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "distlab.h"
#include "runtime/internal.h"
#include "core/testhook.h"
#include "coll/algo.h"

int dl__check_common(dl_comm *c, const char *what, dl_dtype t, int need_op, dl_redop op)
{
    if (!c)
        return dl_error(DL_EINVAL, "%s: null communicator", what);
    if ((unsigned)t >= DL_NDTYPES)
        return dl_error(DL_EINVAL, "%s: unknown data type %d", what, (int)t);
    if (need_op && (unsigned)op >= DL_NREDOPS)
        return dl_error(DL_EINVAL, "%s: unknown reduction op %d", what, (int)op);
    return DL_OK;
}

int dl__check_purpose(const char *what, dl_purpose p)
{
    if ((unsigned)p >= DL_NPURPOSES)
        return dl_error(DL_EINVAL, "%s: unknown purpose %d", what, (int)p);
    return DL_OK;
}

/* Validate a collective's arguments; fill the request. */
int dl__prepare(dl_request *q, int kind, dl_comm *c, const void *sbuf, void *rbuf, size_t count,
                dl_dtype t, dl_redop op, int root, dl_purpose p)
{
    const char *what = dl__opname(kind);
    int need_op = kind == OP_ALLREDUCE || kind == OP_REDUCE_SCATTER || kind == OP_REDUCE;
    int rc = dl__check_common(c, what, t, need_op, op);
    if (rc || (rc = dl__check_purpose(what, p)))
        return rc;
    int n = c->sh->n, r = c->rank;
    size_t es = dl__dtype_size(t), bytes;
    /* count > (SIZE_MAX / 4) / (es * n) without the division (a 64-bit one on every call): for
     * integers count > floor(M / k) exactly when count * k > M */
    if (__builtin_mul_overflow(count, es * (size_t)n, &bytes) || bytes > SIZE_MAX / 4)
        return dl_error(DL_EINVAL, "%s: count %zu too large", what, count);
    size_t sneed = count, rneed = count; /* elements each buffer must hold */
    if (kind == OP_REDUCE_SCATTER || kind == OP_ALLGATHER) {
        size_t off, len;
        dl_block(count, n, r, &off, &len);
        *(kind == OP_REDUCE_SCATTER ? &rneed : &sneed) = len;
    } else if (kind == OP_ALLTOALL)
        sneed = rneed = count * (size_t)n;
    if (kind == OP_BROADCAST || kind == OP_REDUCE) {
        if (root < 0 || root >= n)
            return dl_error(DL_EINVAL, "%s: root %d out of range (communicator of %d ranks)", what,
                            root, n);
        if (kind == OP_BROADCAST && r != root)
            sneed = 0;
        if (kind == OP_REDUCE && r != root)
            rneed = 0;
    }
    if ((sneed && !sbuf) || (rneed && !rbuf))
        return dl_error(DL_EINVAL, "%s: null %s buffer for %zu elements on rank %d", what,
                        (sneed && !sbuf) ? "send" : "receive", sneed && !sbuf ? sneed : rneed, r);
    /* a null send buffer where none is read: point it at the receive buffer so paths stay simple */
    if (!sbuf)
        sbuf = rbuf;
    /* every field zeroed but the 512-byte message, written only on failure: clearing it too cost
     * the 8-byte all-reduce ~8 ns a call (a rep stos). The fields after it are cleared in two
     * halves: gcc writes a memset above 64 bytes as a rep stos too (its start-up was the hottest
     * spot of this function), one of at most 64 as a few vector stores. */
    enum { MSG_END = offsetof(dl_request, errmsg) + sizeof q->errmsg };
    enum { TAIL = sizeof(dl_request) - MSG_END, HALF = TAIL / 2 };
    _Static_assert(offsetof(dl_request, errmsg) <= 64 && TAIL - HALF <= 64,
                   "dl_request: the pieces dl__prepare clears exceed 64 bytes");
    memset(q, 0, offsetof(dl_request, errmsg));
    memset((char *)q + MSG_END, 0, HALF);
    memset((char *)q + MSG_END + HALF, 0, TAIL - HALF);
    q->kind = kind, q->c = c, q->sbuf = sbuf, q->rbuf = rbuf, q->count = count;
    q->t = t, q->op = op, q->root = root, q->p = p;
    /* counted here, on the rank's thread, in the order the rank starts its collectives */
    if (kind == OP_ALLREDUCE || kind == OP_REDUCE_SCATTER)
        q->skip = dl__test_skip_reduction(p, &c->ctx->test_reductions);
    return DL_OK;
}
