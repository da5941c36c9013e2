/* distlab (private to lib/coll/): what a collective algorithm is written with.
 *
 * Three levels, each over the one below:
 *   - the reduce kernels (reduce.c): out = a (op) b for f32 / f64 / bf16, the scale for avg, the
 *     rank-order fold of the small-message algorithms, and the non-temporal final copy;
 *   - the transport verbs (xfer.c): post / acquire / release / flush on a link, each counting
 *     bytes, messages and waiting time on the call's communicator and checking the call's
 *     fingerprint on every message received;
 *   - the named prims (prims.c), in the spirit of NCCL's: one line each in an algorithm, over a
 *     dl_prims that knows where data comes from (`in`) and goes to (`out`). Every receiving prim
 *     acquires one message of n elements, uses it and releases it before it sends anything, so an
 *     algorithm that alternates one send and one receive per link cannot deadlock.
 * An algorithm takes a dl_call (the communicator, the waiter, the fingerprint, the purpose) and
 * is written as a sequence of prims; it never tests which collective it is serving. */
#ifndef DISTLAB_COLL_PRIMS_H
#define DISTLAB_COLL_PRIMS_H

#include <stddef.h>
#include <stdint.h>
#include "distlab.h"
#include "transport/chan.h"
#include "runtime/internal.h"

/* ---- reduce kernels (reduce.c); `div` > 1 divides the result (the last step of avg) ---- */

void dl__reduce(dl_dtype t, void *out, const void *a, const void *b, size_t n, dl_redop op,
                double div);
/* out = in / div */
void dl__scale(dl_dtype t, void *out, const void *in, size_t n, double div);
/* out = the nsrc sources folded in rank order, element by element (f32 arithmetic for f32 and
 * bf16, as on the ring; avg divides by avg_n); in-place safe */
void dl__fold(dl_dtype t, void *out, const void *const *src, int nsrc, size_t count, dl_redop op,
              int avg_n);
/* a copy for data nobody reads soon: non-temporal stores from 64 KiB up */
void dl__copy_final(void *dst, const void *src, size_t bytes);

/* ---- transport verbs (xfer.c) ---- */

/* One collective or point-to-point call as the verbs see it. */
typedef struct dl_call {
    dl_comm *c;
    const dl_waiter *w;
    int opcode;     /* dl_opcode */
    uint32_t check; /* fingerprint carried by every message of the call */
    dl_purpose p;   /* the byte counters' purpose */
} dl_call;

static inline uint64_t dl__rotl64(uint64_t x, int k) { return x << k | x >> (64 - k); }

/* The call's fields mixed into 64 bits, folded to 32. Each field's product with an odd constant
 * is a bijection of it, so calls differing in one field differ in the xor of the three; the
 * final xorshift-multiply is a bijection too. The three products are independent: one
 * multiply's latency on every call instead of a chain of six (docs/PERFORMANCE.md, the 8-byte
 * path). */
static inline uint32_t dl__fingerprint(int op, uint64_t seq, dl_dtype t, dl_redop rop, size_t count,
                                       int root)
{
    uint64_t small = (uint64_t)(uint32_t)root << 32 | (uint64_t)(op & 0xff) << 16 |
                     (uint64_t)(t & 0xff) << 8 | (uint64_t)(rop & 0xff);
    uint64_t h = seq * 0x9e3779b97f4a7c15ull ^
                 dl__rotl64((uint64_t)count * 0xff51afd7ed558ccdull, 21) ^
                 dl__rotl64(small * 0xc4ceb9fe1a85ec53ull, 42);
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return (uint32_t)(h ^ (h >> 32));
}

/* the call for operation `opcode` number `seq` on c (inline, like the fingerprint: both are on
 * every call's path before its first post) */
static inline dl_call dl__call(dl_comm *c, int opcode, uint64_t seq, dl_dtype t, dl_redop op,
                               size_t count, int root, dl_purpose p)
{
    return (dl_call){c, &c->ctx->waiter, opcode, dl__fingerprint(opcode, seq, t, op, count, root),
                     p};
}

/* the link from member src to member dst of the call's communicator */
static inline int dl__xfer_link(dl_call *k, int src, int dst, dl_link **l)
{
    return dl__link(k->c, src, dst, l);
}
int dl__xfer_post(dl_call *k, dl_link *l, const void *data, size_t bytes);
/* the next message; DL_EMISMATCH unless it carries the call's fingerprint and `bytes` bytes */
int dl__xfer_acquire(dl_call *k, dl_link *l, size_t bytes, const void **data);
int dl__xfer_release(dl_call *k, dl_link *l);
int dl__xfer_flush(dl_call *k, dl_link *l);

/* a mod n in [0, n). The callers' a (a member plus or minus a distance below n) lie in [-n, 2n),
 * where one compare does it, keeping the general case's two divisions off the 8-byte
 * all-reduce's path (docs/PERFORMANCE.md, the 8-byte path). */
static inline int dl__mod(int a, int n)
{
    int m = a < 0 ? a + n : a >= n ? a - n : a;
    return m >= 0 && m < n ? m : ((a % n) + n) % n;
}

/* ---- named prims (prims.c); counts in elements ---- */

typedef struct dl_prims {
    dl_call *k;
    dl_link *in, *out; /* from the upstream member, to the downstream one (NULL: none) */
    dl_dtype t;
    dl_redop op;
    size_t es;
    int nt; /* dl__recv writes with dl__copy_final (outputs larger than the caches) */
} dl_prims;

/* prims receiving from member `from` and sending to member `to` (-1: none) */
int dl__prims_open(dl_prims *p, dl_call *k, int from, int to, dl_dtype t, dl_redop op);
/* the ring's: from the previous member, to the next */
int dl__prims_ring(dl_prims *p, dl_call *k, dl_dtype t, dl_redop op);

/* send n elements of src downstream (lent until dl__prims_flush when large) */
int dl__send(dl_prims *p, const void *src, size_t n);
/* receive n elements into dst */
int dl__recv(dl_prims *p, void *dst, size_t n);
/* receive into dst and send dst on */
int dl__recv_copy_send(dl_prims *p, void *dst, size_t n);
/* part = mine (op) received, sent on: a partial result */
int dl__recv_reduce_send(dl_prims *p, const void *mine, void *part, size_t n);
/* dst = (mine (op) received) / div: a final result, kept */
int dl__recv_reduce_copy(dl_prims *p, const void *mine, void *dst, size_t n, double div);
/* dst = (mine (op) received) / div, kept and sent on */
int dl__recv_reduce_copy_send(dl_prims *p, const void *mine, void *dst, size_t n, double div);
/* receive n elements and hold them in place (*data, read-only) until dl__recv_done: for
 * algorithms that read several inputs at once */
int dl__recv_hold(dl_prims *p, size_t n, const void **data);
int dl__recv_done(dl_prims *p);
/* wait until downstream released everything lent to it */
int dl__prims_flush(dl_prims *p);

#endif
