/* The small-message all-reduces, latency-optimal for payloads that fit the slots.
 *
 * One-shot: every member sends its input to every other and folds the n inputs in rank order,
 * so every member computes bitwise the same value. Recursive doubling (powers of two): log2 n
 * exchanges with the partner r ^ d, each adding the partner's partial in place; a (op) b is
 * commutative, so both partners compute bitwise the same value. Its value is a fixed tree over
 * the inputs, so where one round is cheaper than log2 n (oversubscribed worlds: every exchange
 * waits for the scheduler) rd gathers every input one-shot's way and folds that tree locally:
 * the same reductions, operand for operand, in one round. */
#include "config.h"
#include <stdalign.h>
#include <string.h>
#include "distlab.h"
#include "core/testhook.h"
#include "coll/prims.h"
#include "coll/algo.h"

#define ONESHOT_MAX 64      /* members (the sources' table below) */
#define RD_FOLD_BYTES 32768 /* rd's one-round partials, on the stack */

/* Every member's input in src[] (src[r] = sbuf; the others held in in[] until gather_done). */
static inline int gather(dl_call *k, const void *sbuf, size_t count, dl_dtype t, dl_redop op,
                         const void **src, dl_prims *in)
{
    int n = k->c->sh->n, r = k->c->rank, rc;
    for (int d = 1; d < n; d++) {
        dl_prims out;
        if ((rc = dl__prims_open(&out, k, -1, dl__mod(r + d, n), t, op)) ||
            (rc = dl__send(&out, sbuf, count)))
            return rc;
    }
    src[r] = sbuf;
    for (int d = 1; d < n; d++) { /* every input held at once: the fold reads them together */
        int from = dl__mod(r - d, n);
        if ((rc = dl__prims_open(&in[from], k, from, -1, t, op)) ||
            (rc = dl__recv_hold(&in[from], count, &src[from])))
            return rc;
    }
    return DL_OK;
}

static inline int gather_done(dl_call *k, dl_prims *in)
{
    int n = k->c->sh->n, r = k->c->rank, rc;
    for (int d = 1; d < n; d++)
        if ((rc = dl__recv_done(&in[dl__mod(r - d, n)])))
            return rc;
    return DL_OK;
}

int dl__oneshot_allreduce(dl_call *k, const void *sbuf, void *rbuf, size_t count, dl_dtype t,
                          dl_redop op)
{
    int n = k->c->sh->n, rc;
    const void *src[ONESHOT_MAX];
    dl_prims in[ONESHOT_MAX];
    if ((rc = gather(k, sbuf, count, t, op, src, in)))
        return rc;
    if (n == 2 && op != DL_AVG && t != DL_BF16)
        dl__reduce(t, rbuf, src[0], src[1], count, op, 1.0);
    else
        dl__fold(t, rbuf, src, n, count, op, n);
    return gather_done(k, in);
}

/* rd's fold: the inputs, this member r, the partials' buffers (two per level above the first). */
typedef struct rd_tree {
    const void *const *src;
    int r;
    dl_dtype t;
    dl_redop op;
    size_t count, stride;
    unsigned char *tmp;
} rd_tree;

/* What member r ^ m (m a multiple of 2^lv) holds after its first lv exchanges: its partial
 * before the last one (operand a) reduced with its partner's (b), as dl__recv_reduce_copy does
 * it. Written to dst (level 0: the input itself, not copied). */
static const void *rd_node(const rd_tree *T, int m, int lv, void *dst)
{
    if (lv == 0)
        return T->src[T->r ^ m];
    /* two partials of level lv - 1 >= 1 live at once; level 0 needs no buffer */
    unsigned char *lo = lv > 1 ? T->tmp + (size_t)(2 * (lv - 2)) * T->stride : NULL;
    const void *a = rd_node(T, m, lv - 1, lo);
    const void *b = rd_node(T, m + (1 << (lv - 1)), lv - 1, lo ? lo + T->stride : NULL);
    dl__reduce(T->t, dst, a, b, T->count, T->op, 1.0);
    return dst;
}

/* 1 when rd takes one round here; the same answer on every member (the world's flag, the
 * payload, the test hook). */
static int rd_one_round(const dl_call *k, int levels, size_t stride)
{
    const dl__test_hook *h = dl__test_hook_get();
    if (k->c->sh->n > ONESHOT_MAX || (size_t)(2 * (levels - 1)) * stride > RD_FOLD_BYTES)
        return 0;
    if (h && h->rd_transport)
        return h->rd_transport == DL__RD_ONE_ROUND;
    return k->c->sh->w->rd_one_round;
}

int dl__rd_allreduce(dl_call *k, const void *sbuf, void *rbuf, size_t count, dl_dtype t,
                     dl_redop op)
{
    int n = k->c->sh->n, r = k->c->rank, levels = 0, rc;
    dl_redop sop = op == DL_AVG ? DL_SUM : op; /* avg sums and divides once at the end */
    while ((1 << levels) < n) levels++;
    size_t stride = (count * dl_dtype_size(t) + 63) & ~(size_t)63;
    if (rd_one_round(k, levels, stride)) {
        const void *src[ONESHOT_MAX];
        dl_prims in[ONESHOT_MAX];
        alignas(64) unsigned char tmp[RD_FOLD_BYTES];
        rd_tree T = {src, r, t, sop, count, stride, tmp};
        if ((rc = gather(k, sbuf, count, t, sop, src, in)))
            return rc;
        rd_node(&T, 0, levels, rbuf);
        if ((rc = gather_done(k, in)))
            return rc;
    } else {
        if (rbuf != sbuf)
            memcpy(rbuf, sbuf, count * dl_dtype_size(t));
        for (int d = 1; d < n; d <<= 1) {
            dl_prims p;
            if ((rc = dl__prims_open(&p, k, r ^ d, r ^ d, t, sop)) ||
                (rc = dl__send(&p, rbuf, count)) ||
                (rc = dl__recv_reduce_copy(&p, rbuf, rbuf, count, 1.0)))
                return rc;
        }
    }
    if (op == DL_AVG)
        dl__scale(t, rbuf, rbuf, count, (double)n);
    return DL_OK;
}
