/* Dispatch: the public collectives' entry points, the all-reduce's algorithm choice, running
 * one request (sequence, fingerprint, algorithm, error decoration) and failing loudly. */
#include "config.h"
#include <stdio.h>
#include <string.h>
#include "distlab.h"
#include "runtime/fault.h"
#include "runtime/internal.h"
#include "coll/prims.h"
#include "coll/algo.h"

/* A failed call aborts the world (collectives cannot continue with one rank out), then waits
 * until no peer reads a buffer this rank lent it, so the caller may free its buffers. */
void dl__drain_links(dl_comm *c)
{
    dl_comm_shared *sh = c->sh;
    for (int j = 0; j < sh->n; j++) {
        dl_link *l = atomic_load_explicit(&sh->links[(size_t)c->rank * (size_t)sh->n + (size_t)j],
                                          memory_order_acquire);
        if (l)
            l->ops->drain(l);
    }
}

void dl__fail_and_drain(dl_comm *c)
{
    dl__world_abort(c->ctx->w);
    dl__drain_links(c);
    dl__hier_drain(c);
}

static int decorate(dl_comm *c, int rc, int op)
{
    char prev[768];
    snprintf(prev, sizeof prev, "%s", dl_errmsg());
    return dl_error(rc, "%s #%llu on communicator %llu (%d ranks): %s", dl__opname(op),
                    (unsigned long long)c->seq, (unsigned long long)c->sh->uid, c->sh->n, prev);
}

dl_algo dl__choose_allreduce(dl_comm *c, size_t bytes)
{
    int n = c->sh->n;
    size_t eager = c->ctx->w->opts.eager_bytes;
    int pow2 = (n & (n - 1)) == 0;
    int small = bytes <= eager && bytes <= 64 * 1024;
    switch (c->algo) {
    case DL_ALGO_RING: return DL_ALGO_RING;
    case DL_ALGO_ONESHOT: return small && n <= 64 ? DL_ALGO_ONESHOT : DL_ALGO_RING;
    case DL_ALGO_RD: return small && pow2 ? DL_ALGO_RD : DL_ALGO_RING;
    default:
        if (!small || n == 1)
            return DL_ALGO_RING;
        if (n == 2 || (!pow2 && n <= 8))
            return DL_ALGO_ONESHOT;
        return pow2 ? DL_ALGO_RD : DL_ALGO_RING;
    }
}

int dl__flat_allreduce(dl_call *k, dl_algo a, const void *sbuf, void *rbuf, size_t count,
                       dl_dtype t, dl_redop op)
{
    switch (a) {
    case DL_ALGO_ONESHOT: return dl__oneshot_allreduce(k, sbuf, rbuf, count, t, op);
    case DL_ALGO_RD: return dl__rd_allreduce(k, sbuf, rbuf, count, t, op);
    default: return dl__ring_allreduce(k, sbuf, rbuf, count, t, op);
    }
}

/* The test hook's skipped reduction: this rank's own input, no communication. */
static int skip_op(const dl_request *q)
{
    size_t es = dl_dtype_size(q->t), off = 0, len = q->count;
    if (q->kind == OP_REDUCE_SCATTER)
        dl_block(q->count, q->c->sh->n, q->c->rank, &off, &len);
    if ((const char *)q->rbuf != (const char *)q->sbuf + off * es)
        memmove(q->rbuf, (const char *)q->sbuf + off * es, len * es);
    return DL_OK;
}

/* One member: the result is the input (avg of one is the input too). */
static int run_alone(const dl_request *q)
{
    if (q->rbuf != q->sbuf)
        memmove(q->rbuf, q->sbuf, q->count * dl_dtype_size(q->t));
    return DL_OK;
}

/* The all-reduce: `auto` picks by size and members; the hierarchical one takes over the ring
 * where it fits (forced `hier` runs it wherever it fits, the ring elsewhere), so its test is
 * asked only where the ring was chosen (not on the small all-reduces' path). */
static int run_allreduce(dl_call *k, const dl_request *q, dl_algo *algo)
{
    dl_comm *c = q->c;
    *algo = c->algo == DL_ALGO_HIER ? DL_ALGO_RING
                                    : dl__choose_allreduce(c, q->count * dl__dtype_size(q->t));
    if (*algo == DL_ALGO_RING && (c->algo == DL_ALGO_AUTO || c->algo == DL_ALGO_HIER) &&
        dl__hier_fits(c)) {
        *algo = DL_ALGO_HIER;
        return dl__hier_allreduce(k, q->sbuf, q->rbuf, q->count, q->t, q->op);
    }
    return dl__flat_allreduce(k, *algo, q->sbuf, q->rbuf, q->count, q->t, q->op);
}

static int run_algorithm(dl_call *k, dl_request *q, dl_algo *algo)
{
    *algo = DL_ALGO_RING;
    if (q->c->sh->n == 1 && q->kind != OP_ALLTOALL && q->kind != OP_ALLTOALLV &&
        q->kind != OP_BARRIER)
        return run_alone(q);
    switch (q->kind) {
    case OP_ALLREDUCE: return run_allreduce(k, q, algo);
    case OP_REDUCE_SCATTER:
        return dl__ring_reduce_scatter(k, q->sbuf, q->rbuf, q->count, q->t, q->op);
    case OP_ALLGATHER: return dl__ring_allgather(k, q->sbuf, q->rbuf, q->count, q->t);
    case OP_BROADCAST: return dl__chain_broadcast(k, q->sbuf, q->rbuf, q->count, q->t, q->root);
    case OP_REDUCE: return dl__chain_reduce(k, q->sbuf, q->rbuf, q->count, q->t, q->op, q->root);
    case OP_ALLTOALL: return dl__alltoall(k, q->sbuf, q->rbuf, q->count, q->t);
    case OP_ALLTOALLV: return dl__alltoallv(k, q);
    case OP_BARRIER: return dl__barrier(k);
    default: return dl_error(DL_EINVAL, "unknown operation %d", q->kind);
    }
}

int dl__run_op(dl_request *q)
{
    dl_comm *c = q->c;
    if (q->kind == OP_SEND || q->kind == OP_RECV)
        return dl__run_p2p(q);
    if (q->skip)
        return skip_op(q);
    int frc = dl__fault_op(c, q->kind);
    if (frc) { /* an injected fault: this rank fails the operation before it begins */
        dl__fail_and_drain(c);
        return frc;
    }
    dl__op_begin(c, q->kind, q->count, (int)q->t, q->root);
    dl_call k = dl__call(c, q->kind, c->seq, q->t, q->op, q->count, q->root, q->p);
    dl_algo algo;
    int rc = run_algorithm(&k, q, &algo);
    c->last_algo = algo;
    if (rc == DL_OK) {
        c->st.algo_ops[algo]++;
    } else {
        rc = decorate(c, rc, q->kind);
        if (!q->agreed)
            dl__fail_and_drain(c);
    }
    dl__op_end(c, rc);
    return rc;
}

#define BLOCKING(KIND, C, S, R, N, T, OP, ROOT, P)                                                 \
    do {                                                                                           \
        dl_request q_;                                                                             \
        int rc_ = dl__prepare(&q_, KIND, C, S, R, N, T, OP, ROOT, P);                              \
        return rc_ ? rc_ : dl__submit_blocking(&q_);                                               \
    } while (0)

#define ASYNC(KIND, C, S, R, N, T, OP, ROOT, P, REQ)                                               \
    do {                                                                                           \
        dl_request q_;                                                                             \
        int rc_ = dl__prepare(&q_, KIND, C, S, R, N, T, OP, ROOT, P);                              \
        return rc_ ? rc_ : dl__submit_async(&q_, REQ);                                             \
    } while (0)

int dl_allreduce(dl_comm *c, const void *s, void *r, size_t n, dl_dtype t, dl_redop op,
                 dl_purpose p)
{
    BLOCKING(OP_ALLREDUCE, c, s, r, n, t, op, -1, p);
}
int dl_reduce_scatter(dl_comm *c, const void *s, void *r, size_t n, dl_dtype t, dl_redop op,
                      dl_purpose p)
{
    BLOCKING(OP_REDUCE_SCATTER, c, s, r, n, t, op, -1, p);
}
int dl_allgather(dl_comm *c, const void *s, void *r, size_t n, dl_dtype t, dl_purpose p)
{
    BLOCKING(OP_ALLGATHER, c, s, r, n, t, DL_SUM, -1, p);
}
int dl_broadcast(dl_comm *c, const void *s, void *r, size_t n, dl_dtype t, int root, dl_purpose p)
{
    BLOCKING(OP_BROADCAST, c, s, r, n, t, DL_SUM, root, p);
}
int dl_reduce(dl_comm *c, const void *s, void *r, size_t n, dl_dtype t, dl_redop op, int root,
              dl_purpose p)
{
    BLOCKING(OP_REDUCE, c, s, r, n, t, op, root, p);
}
int dl_alltoall(dl_comm *c, const void *s, void *r, size_t n, dl_dtype t, dl_purpose p)
{
    BLOCKING(OP_ALLTOALL, c, s, r, n, t, DL_SUM, -1, p);
}
int dl_barrier(dl_comm *c)
{
    if (!c)
        return dl_error(DL_EINVAL, "barrier: null communicator");
    dl_request q = {.kind = OP_BARRIER, .c = c, .t = DL_F32, .root = -1, .p = DL_PURPOSE_OTHER};
    return dl__submit_blocking(&q);
}

int dl_iallreduce(dl_comm *c, const void *s, void *r, size_t n, dl_dtype t, dl_redop op,
                  dl_purpose p, dl_request **req)
{
    ASYNC(OP_ALLREDUCE, c, s, r, n, t, op, -1, p, req);
}
int dl_ireduce_scatter(dl_comm *c, const void *s, void *r, size_t n, dl_dtype t, dl_redop op,
                       dl_purpose p, dl_request **req)
{
    ASYNC(OP_REDUCE_SCATTER, c, s, r, n, t, op, -1, p, req);
}
int dl_iallgather(dl_comm *c, const void *s, void *r, size_t n, dl_dtype t, dl_purpose p,
                  dl_request **req)
{
    ASYNC(OP_ALLGATHER, c, s, r, n, t, DL_SUM, -1, p, req);
}
int dl_ibroadcast(dl_comm *c, const void *s, void *r, size_t n, dl_dtype t, int root, dl_purpose p,
                  dl_request **req)
{
    ASYNC(OP_BROADCAST, c, s, r, n, t, DL_SUM, root, p, req);
}
