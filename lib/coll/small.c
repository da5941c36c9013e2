/* The small-message all-reduces, latency-optimal for payloads that fit the slots.
 *
 * One-shot: every member sends its input to every other and folds the n inputs in rank order,
 * so every member computes bitwise the same value. Recursive doubling (powers of two): log2 n
 * exchanges with the partner r ^ d, each adding the partner's partial in place; a (op) b is
 * commutative, so both partners compute bitwise the same value. */
#include "config.h"
#include <string.h>
#include "distlab.h"
#include "coll/prims.h"
#include "coll/algo.h"

#define ONESHOT_MAX 64 /* members (the sources' table below) */

int dl__oneshot_allreduce(dl_call *k, const void *sbuf, void *rbuf, size_t count, dl_dtype t,
                          dl_redop op)
{
    int n = k->c->sh->n, r = k->c->rank, rc;
    const void *src[ONESHOT_MAX];
    dl_prims in[ONESHOT_MAX];
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
    if (n == 2 && op != DL_AVG && t != DL_BF16)
        dl__reduce(t, rbuf, src[0], src[1], count, op, 1.0);
    else
        dl__fold(t, rbuf, src, n, count, op, n);
    for (int d = 1; d < n; d++)
        if ((rc = dl__recv_done(&in[dl__mod(r - d, n)])))
            return rc;
    return DL_OK;
}

int dl__rd_allreduce(dl_call *k, const void *sbuf, void *rbuf, size_t count, dl_dtype t,
                     dl_redop op)
{
    int n = k->c->sh->n, r = k->c->rank, rc;
    if (rbuf != sbuf)
        memcpy(rbuf, sbuf, count * dl_dtype_size(t));
    for (int d = 1; d < n; d <<= 1) {
        dl_prims p; /* avg sums here and divides once at the end */
        if ((rc = dl__prims_open(&p, k, r ^ d, r ^ d, t, op == DL_AVG ? DL_SUM : op)) ||
            (rc = dl__send(&p, rbuf, count)) ||
            (rc = dl__recv_reduce_copy(&p, rbuf, rbuf, count, 1.0)))
            return rc;
    }
    if (op == DL_AVG)
        dl__scale(t, rbuf, rbuf, count, (double)n);
    return DL_OK;
}
