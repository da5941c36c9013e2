/* Collectives, written once over link "prims" (post / acquire / release / flush).
 *
 * Ring schedule (NCCL's): the buffer is cut into n blocks (dl_block); rank r at step s of the
 * ring handles block (r - s) mod n for all-reduce. Every block is further cut into R slices and
 * the schedule runs R rounds, one slice of every block per round, so consecutive hops overlap and
 * each link holds at most a couple of messages per round (no deadlock whatever the slot count).
 * Large slices travel by rendezvous: the receiver reduces straight from the sender's buffer into
 * its own output (one pass: read two, write one) and releases the slot as acknowledgement; the
 * sender only rewrites a lent region after the data has provably gone round the ring, and flushes
 * its outgoing link before returning. */
#define _GNU_SOURCE
#include "config.h"
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include "distlab.h"
#include "core/bf16.h"
#include "core/topo.h"
#include "transport/chan.h"
#include "runtime/internal.h"
#include "core/testhook.h"

/* ---- bf16: the public names of the one rounding (core/bf16.h) ---- */

uint16_t dl_f32_to_bf16(float x) { return dl__bf16_round(x); }

float dl_bf16_to_f32(uint16_t b) { return dl__bf16_widen(b); }

/* ---- reduction kernels: out = a (op) b; `div` > 1 divides the result (final step of avg) ---- */

/* Two loops per case: in place (out == a, the common in-place collective) and out of place,
 * each with restrict pointers, because a runtime overlap check would send out == a to a
 * scalar fallback (3x slower at in-cache sizes). */
#define DEF_REDUCE(NAME, T)                                                                        \
    static void NAME##_oop(T *restrict out, const T *restrict a, const T *restrict b, size_t n,    \
                           dl_redop op, T d)                                                       \
    {                                                                                              \
        if (op == DL_MAX)                                                                          \
            for (size_t i = 0; i < n; i++) out[i] = a[i] > b[i] ? a[i] : b[i];                     \
        else if (d != (T)1)                                                                        \
            for (size_t i = 0; i < n; i++) out[i] = (a[i] + b[i]) / d;                             \
        else                                                                                       \
            for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];                                   \
    }                                                                                              \
    static void NAME##_ip(T *restrict out, const T *restrict b, size_t n, dl_redop op, T d)        \
    {                                                                                              \
        if (op == DL_MAX)                                                                          \
            for (size_t i = 0; i < n; i++) out[i] = out[i] > b[i] ? out[i] : b[i];                 \
        else if (d != (T)1)                                                                        \
            for (size_t i = 0; i < n; i++) out[i] = (out[i] + b[i]) / d;                           \
        else                                                                                       \
            for (size_t i = 0; i < n; i++) out[i] = out[i] + b[i];                                 \
    }                                                                                              \
    static void NAME(T *out, const T *a, const T *b, size_t n, dl_redop op, double div)            \
    {                                                                                              \
        if (out == a)                                                                              \
            NAME##_ip(out, b, n, op, (T)div);                                                      \
        else                                                                                       \
            NAME##_oop(out, a, b, n, op, (T)div);                                                  \
    }
DEF_REDUCE(reduce_f32, float)
DEF_REDUCE(reduce_f64, double)

static void reduce_bf16(uint16_t *out, const uint16_t *a, const uint16_t *restrict b, size_t n,
                        dl_redop op, double div)
{
    const float d = (float)div;
    for (size_t i = 0; i < n; i++) {
        float x = dl__bf16_widen(a[i]), y = dl__bf16_widen(b[i]);
        float z = op == DL_MAX ? (x > y ? x : y) : (div > 1.0 ? (x + y) / d : x + y);
        out[i] = dl__bf16_round(z);
    }
}

static void reduce_any(dl_dtype t, void *out, const void *a, const void *b, size_t n, dl_redop op,
                       double div)
{
    switch (t) {
    case DL_F32: reduce_f32(out, a, b, n, op, div); break;
    case DL_F64: reduce_f64(out, a, b, n, op, div); break;
    default: reduce_bf16(out, a, b, n, op, div); break;
    }
}

/* out = in / div (avg on one rank, or after recursive doubling) */
static void scale_any(dl_dtype t, void *out, const void *in, size_t n, double div)
{
    if (t == DL_F32) {
        float *o = out;
        const float *x = in, d = (float)div;
        for (size_t i = 0; i < n; i++) o[i] = x[i] / d;
    } else if (t == DL_F64) {
        double *o = out;
        const double *x = in;
        for (size_t i = 0; i < n; i++) o[i] = x[i] / div;
    } else {
        uint16_t *o = out;
        const uint16_t *x = in;
        for (size_t i = 0; i < n; i++) o[i] = dl__bf16_round(dl__bf16_widen(x[i]) / (float)div);
    }
}

/* Fold n sources in rank order, element by element (one-shot all-reduce): identical on every rank,
 * and in-place safe because each element is read from every source before it is written. */
static void fold_any(dl_dtype t, void *out, const void *const *src, int nsrc, size_t count,
                     dl_redop op, int avg_n)
{
    for (size_t i = 0; i < count; i++) {
        double acc = 0;
        for (int k = 0; k < nsrc; k++) {
            double v = t == DL_F32   ? (double)((const float *)src[k])[i]
                       : t == DL_F64 ? ((const double *)src[k])[i]
                                     : (double)dl__bf16_widen(((const uint16_t *)src[k])[i]);
            if (k == 0)
                acc = v;
            else if (op == DL_MAX)
                acc = v > acc ? v : acc;
            else if (t == DL_F32 || t == DL_BF16)
                acc = (double)((float)acc + (float)v); /* f32 arithmetic, as on the ring */
            else
                acc += v;
        }
        if (op == DL_AVG)
            acc = t == DL_F64 ? acc / avg_n : (double)((float)acc / (float)avg_n);
        if (t == DL_F32)
            ((float *)out)[i] = (float)acc;
        else if (t == DL_F64)
            ((double *)out)[i] = acc;
        else
            ((uint16_t *)out)[i] = dl__bf16_round((float)acc);
    }
}

/* Copy for data nobody reads soon (a rank's final output): non-temporal stores skip the
 * read-for-ownership of the destination, a third of a DRAM-bound copy's traffic. */
static void copy_final(void *dst, const void *src, size_t bytes)
{
#if defined(__SSE2__)
    if (bytes >= 64 * 1024 && ((uintptr_t)dst & 15) == 0) {
        __m128i *d = dst;
        const __m128i *s = src;
        size_t n = bytes / 16;
        for (size_t i = 0; i < n; i++) _mm_stream_si128(d + i, _mm_loadu_si128(s + i));
        _mm_sfence();
        memcpy((char *)dst + n * 16, (const char *)src + n * 16, bytes - n * 16);
        return;
    }
#endif
    memcpy(dst, src, bytes);
}

/* ---- prims: post / acquire with accounting and call fingerprints ---- */

typedef struct call {
    dl_comm *c;
    const dl_waiter *w;
    int opcode;
    uint32_t check;
    dl_purpose p;
} call;

static uint32_t fingerprint(int op, uint64_t seq, dl_dtype t, dl_redop rop, size_t count, int root)
{
    uint64_t h = 0x9e3779b97f4a7c15ull;
    uint64_t v[6] = {(uint64_t)op,           seq, (uint64_t)t, (uint64_t)rop, (uint64_t)count,
                     (uint64_t)(int64_t)root};
    for (int i = 0; i < 6; i++) {
        h ^= v[i] + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
        h *= 0xff51afd7ed558ccdull;
    }
    return (uint32_t)(h ^ (h >> 32));
}

static int get_link(call *k, int src, int dst, dl_link **l) { return dl__link(k->c, src, dst, l); }

static int post(call *k, dl_link *l, const void *data, size_t bytes)
{
    dl_msg m = {data, bytes, k->check};
    uint64_t w0 = l->stats.send_wait_ns, c0 = l->stats.copy_ns, s0 = l->stats.send_sleeps;
    int rc = dl_link_post(l, &m, k->w);
    k->c->st.wait_ns += l->stats.send_wait_ns - w0;
    k->c->st.copy_ns += l->stats.copy_ns - c0;
    k->c->st.sleeps += l->stats.send_sleeps - s0;
    if (rc)
        return rc;
    k->c->st.bytes_sent[k->p] += bytes;
    k->c->st.msgs_sent++;
    const int *node = k->c->ctx->w->place->node;
    if (node[l->src] != node[l->dst])
        k->c->st.bytes_sent_inter += bytes;
    return DL_OK;
}

static int acquire(call *k, dl_link *l, size_t bytes, const void **data)
{
    dl_msg m;
    uint64_t w0 = l->stats.recv_wait_ns, s0 = l->stats.recv_sleeps;
    int rc = dl_link_acquire(l, &m, k->w);
    k->c->st.wait_ns += l->stats.recv_wait_ns - w0;
    k->c->st.sleeps += l->stats.recv_sleeps - s0;
    if (rc)
        return rc;
    if (m.check != k->check || m.bytes != bytes) {
        dl_link_release(l);
        return dl_error(DL_EMISMATCH,
                        "message from rank %d does not match this call (%zu bytes, expected "
                        "%zu%s): "
                        "ranks disagree on the operation, count, type, op or root",
                        l->src, m.bytes, bytes, m.check != k->check ? ", different call" : "");
    }
    k->c->st.bytes_recv[k->p] += bytes;
    k->c->st.msgs_recv++;
    const int *node = k->c->ctx->w->place->node;
    if (node[l->src] != node[l->dst])
        k->c->st.bytes_recv_inter += bytes;
    *data = m.data;
    return DL_OK;
}

static int flush(call *k, dl_link *l)
{
    uint64_t w0 = l->stats.send_wait_ns, s0 = l->stats.send_sleeps;
    int rc = dl_link_flush(l, k->w);
    k->c->st.wait_ns += l->stats.send_wait_ns - w0;
    k->c->st.sleeps += l->stats.send_sleeps - s0;
    return rc;
}

static inline int mod(int a, int n) { return ((a % n) + n) % n; }

/* ---- ring reduce-scatter / all-gather / all-reduce ---- */

enum { RING_AR, RING_RS, RING_AG };

/* Slice of c's collectives: the world's, or in a world spanning MPI processes, for a
 * communicator whose members live in several processes, the MPI slice (every member computes the
 * same, from the members' ranks). */
static size_t slice_of(dl_comm *c)
{
    dl_world *w = c->ctx->w;
    size_t s = w->opts.slice_bytes;
    if (w->mpi && w->opts.mpi_slice_bytes) {
        int T = w->hi - w->lo, p0 = c->sh->world_ranks[0] / T;
        for (int m = 1; m < c->sh->n; m++)
            if (c->sh->world_ranks[m] / T != p0)
                return w->opts.mpi_slice_bytes;
    }
    return s;
}

static size_t nrounds(size_t count, int n, size_t es, size_t slice_bytes)
{
    size_t maxblock = (count + (size_t)n - 1) / (size_t)n;
    size_t r = (maxblock * es + slice_bytes - 1) / slice_bytes;
    return r ? r : 1;
}

static int ring(call *k, int mode, const char *sbuf, char *rbuf, size_t count, dl_dtype t,
                dl_redop op)
{
    dl_comm *c = k->c;
    int n = c->sh->n, r = c->rank;
    size_t es = dl_dtype_size(t);
    double div = op == DL_AVG ? (double)n : 1.0;
    dl_link *out, *in;
    int rc;
    if ((rc = get_link(k, r, mod(r + 1, n), &out)) || (rc = get_link(k, mod(r - 1, n), r, &in)))
        return rc;
    char *scratch = NULL;
    if (mode == RING_RS && n > 2) {
        if ((rc = dl__scratch(c, count * es, (void **)&scratch)))
            return rc;
    }
    size_t R = nrounds(count, n, es, slice_of(c));
    int nsteps = mode == RING_AR ? 2 * n - 1 : n;
    /* non-temporal stores only pay off when the output does not fit the caches anyway */
    int nt_final = count * es >= ((size_t)32 << 20);
    size_t own_off, own_len;
    dl_block(count, n, r, &own_off, &own_len);
    if (mode == RING_AG && sbuf != rbuf + own_off * es)
        memcpy(rbuf + own_off * es, sbuf, own_len * es);

    for (size_t q = 0; q < R; q++) {
        for (int s = 0; s < nsteps; s++) {
            int blk = mode == RING_RS ? mod(r - s - 1, n) : mod(r - s, n);
            size_t off, len;
            dl_block(count, n, blk, &off, &len);
            size_t lo = len * q / R, hi = len * (q + 1) / R, m = hi - lo;
            size_t e0 = off + lo, bytes = m * es;
            const void *up;
            if (s == 0) {
                /* first send: the rank's own input (all-gather: its block of sendbuf) */
                const char *src = mode == RING_AG ? sbuf + lo * es : sbuf + e0 * es;
                if ((rc = post(k, out, src, bytes)))
                    return rc;
                continue;
            }
            if ((rc = acquire(k, in, bytes, &up)))
                return rc;
            char *dst;
            int last = s == nsteps - 1;
            if (mode == RING_AG || (mode == RING_AR && s >= n)) {
                dst = rbuf + e0 * es; /* all-gather phase: copy */
                if (last && nt_final)
                    copy_final(dst, up, bytes);
                else
                    memcpy(dst, up, bytes);
            } else if (mode == RING_RS && last) {
                dst = rbuf + lo * es; /* this rank's own block, final */
                reduce_any(t, dst, sbuf + e0 * es, up, m, op, div);
            } else if (mode == RING_RS) {
                dst = scratch + e0 * es; /* partial sum in scratch (recvbuf holds one block) */
                reduce_any(t, dst, sbuf + e0 * es, up, m, op, 1.0);
            } else {
                dst = rbuf + e0 * es; /* all-reduce: partial, or final at s == n - 1 */
                reduce_any(t, dst, sbuf + e0 * es, up, m, op, s == n - 1 ? div : 1.0);
            }
            if ((rc = dl_link_release(in)))
                return rc;
            if (!last && (rc = post(k, out, dst, bytes)))
                return rc;
        }
    }
    return flush(k, out);
}

/* ---- latency-optimal all-reduce for small messages (payload copied into slots) ---- */

static int oneshot(call *k, const void *sbuf, void *rbuf, size_t count, dl_dtype t, dl_redop op)
{
    dl_comm *c = k->c;
    int n = c->sh->n, r = c->rank, rc;
    size_t bytes = count * dl_dtype_size(t);
    const void *src[64];
    dl_link *inl[64];
    for (int d = 1; d < n; d++) {
        dl_link *l;
        if ((rc = get_link(k, r, mod(r + d, n), &l)) || (rc = post(k, l, sbuf, bytes)))
            return rc;
    }
    src[r] = sbuf;
    for (int d = 1; d < n; d++) {
        int from = mod(r - d, n);
        if ((rc = get_link(k, from, r, &inl[from])) ||
            (rc = acquire(k, inl[from], bytes, &src[from])))
            return rc;
    }
    if (n == 2 && op != DL_AVG && t != DL_BF16)
        reduce_any(t, rbuf, src[0], src[1], count, op, 1.0);
    else
        fold_any(t, rbuf, src, n, count, op, n);
    for (int d = 1; d < n; d++)
        if ((rc = dl_link_release(inl[mod(r - d, n)])))
            return rc;
    return DL_OK;
}

static int recursive_doubling(call *k, const void *sbuf, void *rbuf, size_t count, dl_dtype t,
                              dl_redop op)
{
    dl_comm *c = k->c;
    int n = c->sh->n, r = c->rank, rc;
    size_t bytes = count * dl_dtype_size(t);
    if (rbuf != sbuf)
        memcpy(rbuf, sbuf, bytes);
    for (int d = 1; d < n; d <<= 1) {
        int peer = r ^ d;
        dl_link *o, *i;
        const void *up;
        if ((rc = get_link(k, r, peer, &o)) || (rc = get_link(k, peer, r, &i)))
            return rc;
        if ((rc = post(k, o, rbuf, bytes)) || (rc = acquire(k, i, bytes, &up)))
            return rc;
        /* a (op) b is commutative, so both partners compute bitwise the same value */
        reduce_any(t, rbuf, rbuf, up, count, op == DL_AVG ? DL_SUM : op, 1.0);
        if ((rc = dl_link_release(i)))
            return rc;
    }
    if (op == DL_AVG)
        scale_any(t, rbuf, rbuf, count, (double)n);
    return DL_OK;
}

/* ---- chains: broadcast and reduce ---- */

static int bcast_chain(call *k, const char *sbuf, char *rbuf, size_t count, dl_dtype t, int root)
{
    dl_comm *c = k->c;
    int n = c->sh->n, r = c->rank, rc;
    int pos = mod(r - root, n);
    size_t es = dl_dtype_size(t);
    size_t R = nrounds(count, 1, es, slice_of(c));
    dl_link *out = NULL, *in = NULL;
    if (pos < n - 1 && (rc = get_link(k, r, mod(r + 1, n), &out)))
        return rc;
    if (pos > 0 && (rc = get_link(k, mod(r - 1, n), r, &in)))
        return rc;
    for (size_t q = 0; q < R; q++) {
        size_t lo = count * q / R, hi = count * (q + 1) / R, bytes = (hi - lo) * es;
        if (pos == 0) {
            if (rbuf != sbuf)
                memcpy(rbuf + lo * es, sbuf + lo * es, bytes);
            if ((rc = post(k, out, rbuf + lo * es, bytes)))
                return rc;
            continue;
        }
        const void *up;
        if ((rc = acquire(k, in, bytes, &up)))
            return rc;
        memcpy(rbuf + lo * es, up, bytes);
        if ((rc = dl_link_release(in)))
            return rc;
        if (out && (rc = post(k, out, rbuf + lo * es, bytes)))
            return rc;
    }
    return out ? flush(k, out) : DL_OK;
}

static int reduce_chain(call *k, const char *sbuf, char *rbuf, size_t count, dl_dtype t,
                        dl_redop op, int root)
{
    dl_comm *c = k->c;
    int n = c->sh->n, r = c->rank, rc;
    int pos = mod(r - root - 1, n); /* root + 1 starts, the root ends */
    size_t es = dl_dtype_size(t);
    size_t R = nrounds(count, 1, es, slice_of(c));
    dl_link *out = NULL, *in = NULL;
    char *part = NULL;
    if (pos < n - 1 && (rc = get_link(k, r, mod(r + 1, n), &out)))
        return rc;
    if (pos > 0 && (rc = get_link(k, mod(r - 1, n), r, &in)))
        return rc;
    if (pos > 0 && pos < n - 1 && (rc = dl__scratch(c, count * es, (void **)&part)))
        return rc;
    double div = op == DL_AVG ? (double)n : 1.0;
    for (size_t q = 0; q < R; q++) {
        size_t lo = count * q / R, hi = count * (q + 1) / R, m = hi - lo, bytes = m * es;
        if (pos == 0) {
            if ((rc = post(k, out, sbuf + lo * es, bytes)))
                return rc;
            continue;
        }
        const void *up;
        if ((rc = acquire(k, in, bytes, &up)))
            return rc;
        char *dst = out ? part + lo * es : rbuf + lo * es;
        reduce_any(t, dst, sbuf + lo * es, up, m, op, out ? 1.0 : div);
        if ((rc = dl_link_release(in)))
            return rc;
        if (out && (rc = post(k, out, dst, bytes)))
            return rc;
    }
    return out ? flush(k, out) : DL_OK;
}

/* ---- all-to-all, barrier, point-to-point ---- */

static int alltoall(call *k, const char *sbuf, char *rbuf, size_t count, dl_dtype t)
{
    dl_comm *c = k->c;
    int n = c->sh->n, r = c->rank, rc;
    size_t bytes = count * dl_dtype_size(t);
    if (sbuf == rbuf && n > 1 && bytes) {
        /* in place: peers read our blocks while we overwrite them, so lend a copy instead */
        void *tmp;
        if ((rc = dl__scratch(c, bytes * (size_t)n, &tmp)))
            return rc;
        memcpy(tmp, sbuf, bytes * (size_t)n);
        sbuf = tmp;
    }
    /* one message per peer (never more than one per link), so posting all first cannot block */
    for (int d = 1; d < n; d++) {
        dl_link *l;
        int to = mod(r + d, n);
        if ((rc = get_link(k, r, to, &l)) || (rc = post(k, l, sbuf + (size_t)to * bytes, bytes)))
            return rc;
    }
    if (sbuf != rbuf)
        memcpy(rbuf + (size_t)r * bytes, sbuf + (size_t)r * bytes, bytes);
    for (int d = 1; d < n; d++) {
        dl_link *l;
        const void *up;
        int from = mod(r - d, n);
        if ((rc = get_link(k, from, r, &l)) || (rc = acquire(k, l, bytes, &up)))
            return rc;
        memcpy(rbuf + (size_t)from * bytes, up, bytes);
        if ((rc = dl_link_release(l)))
            return rc;
    }
    for (int d = 1; d < n; d++) {
        dl_link *l;
        if ((rc = get_link(k, r, mod(r + d, n), &l)) || (rc = flush(k, l)))
            return rc;
    }
    return DL_OK;
}

static int barrier(call *k)
{
    dl_comm *c = k->c;
    int n = c->sh->n, r = c->rank, rc;
    for (int d = 1; d < n; d <<= 1) { /* dissemination: log2(n) rounds */
        dl_link *o, *i;
        const void *up;
        if ((rc = get_link(k, r, mod(r + d, n), &o)) || (rc = get_link(k, mod(r - d, n), r, &i)))
            return rc;
        if ((rc = post(k, o, NULL, 0)) || (rc = acquire(k, i, 0, &up)) || (rc = dl_link_release(i)))
            return rc;
    }
    return DL_OK;
}

/* ---- entry points: validation, sequencing, error decoration ---- */

static int check_common(dl_comm *c, const char *what, dl_dtype t, int need_op, dl_redop op)
{
    if (!c)
        return dl_error(DL_EINVAL, "%s: null communicator", what);
    if ((unsigned)t >= DL_NDTYPES)
        return dl_error(DL_EINVAL, "%s: unknown data type %d", what, (int)t);
    if (need_op && (unsigned)op >= DL_NREDOPS)
        return dl_error(DL_EINVAL, "%s: unknown reduction op %d", what, (int)op);
    return DL_OK;
}

static int check_purpose(const char *what, dl_purpose p)
{
    if ((unsigned)p >= DL_NPURPOSES)
        return dl_error(DL_EINVAL, "%s: unknown purpose %d", what, (int)p);
    return DL_OK;
}

/* A failed call aborts the world (collectives cannot continue with one rank out), then waits
 * until no peer reads a buffer this rank lent it, so the caller may free its buffers. */
static void drain_links(dl_comm *c)
{
    dl_comm_shared *sh = c->sh;
    for (int j = 0; j < sh->n; j++) {
        dl_link *l = atomic_load_explicit(&sh->links[(size_t)c->rank * (size_t)sh->n + (size_t)j],
                                          memory_order_acquire);
        if (l)
            l->ops->drain(l);
    }
}

static void fail_and_drain(dl_comm *c)
{
    dl__world_abort(c->ctx->w);
    drain_links(c);
    if (c->h_intra) /* the hierarchical all-reduce's groups (MPI worlds) */
        drain_links(c->h_intra);
    if (c->h_inter)
        drain_links(c->h_inter);
}

static int decorate(dl_comm *c, int rc, int op)
{
    char prev[768];
    snprintf(prev, sizeof prev, "%s", dl_errmsg());
    return dl_error(rc, "%s #%llu on communicator %llu (%d ranks): %s", dl__opname(op),
                    (unsigned long long)c->seq, (unsigned long long)c->sh->uid, c->sh->n, prev);
}

static dl_algo choose_allreduce(dl_comm *c, size_t bytes)
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

/* ---- hierarchical all-reduce (worlds spanning MPI processes) ---- */

/* Whether c has the same number k >= 2 of members in each of np >= 2 processes; then *j is this
 * member's index among its process's members (comm order) and *pi its process's position among
 * the processes (order of first appearance in the communicator). */
static int hier_shape(dl_comm *c, int *kout, int *npout, int *j, int *pi)
{
    dl_world *w = c->ctx->w;
    dl_comm_shared *sh = c->sh;
    int n = sh->n, T = w->hi - w->lo, np = 0, k = -1, fm = -1;
    *j = *pi = 0;
    for (int m = 0; m < n; m++) {
        int pm = sh->world_ranks[m] / T, cnt = 0, first = 1;
        for (int q = 0; q < n; q++)
            if (sh->world_ranks[q] / T == pm) {
                cnt++;
                first = first && q >= m;
            }
        if (k < 0)
            k = cnt;
        if (cnt != k)
            return 0;
        if (first) {
            np++;
            if (pm == w->proc)
                fm = m;
            else if (fm < 0)
                ++*pi; /* a process that appears before this one */
        }
        if (pm == w->proc && m < c->rank)
            ++*j;
    }
    *kout = k;
    *npout = np;
    return k >= 2 && np >= 2;
}

/* This member's views of the two groups: its process's members, and the j-th member of every
 * process. The groups' records live in c's record of this process (created once, under the
 * world's hier_mu); the cross-process group's MPI tags use the id dl__mpi_sub_cid(c's id, j). */
static int hier_views(dl_comm *c, int k, int np, int j, int pi)
{
    if (c->h_intra && c->h_inter)
        return DL_OK;
    dl_world *w = c->ctx->w;
    dl_comm_shared *sh = c->sh;
    int n = sh->n, T = w->hi - w->lo, rc = DL_OK;
    int *intra = malloc(sizeof(int) * (size_t)k), *inter = malloc(sizeof(int) * (size_t)np);
    int *seen = calloc((size_t)w->nprocs, sizeof(int));
    if (!intra || !inter || !seen) {
        free(intra), free(inter), free(seen);
        return dl_error(DL_ENOMEM, "hierarchical all-reduce: out of memory");
    }
    int ni = 0, ne = 0;
    for (int m = 0; m < n; m++) {
        int wr = sh->world_ranks[m], pm = wr / T;
        if (pm == w->proc)
            intra[ni++] = wr;
        if (seen[pm]++ == j) /* the j-th member of process pm, in process order of appearance */
            inter[ne++] = wr;
    }
    /* inter[] is in order of each process's j-th member; reorder by first appearance */
    int *order = seen; /* reuse: position of each process by first appearance */
    for (int p = 0; p < w->nprocs; p++) order[p] = -1;
    int pos = 0;
    for (int m = 0; m < n; m++) {
        int pm = sh->world_ranks[m] / T;
        if (order[pm] < 0)
            order[pm] = pos++;
    }
    int *sorted = malloc(sizeof(int) * (size_t)np);
    if (!sorted) {
        free(intra), free(inter), free(seen);
        return dl_error(DL_ENOMEM, "hierarchical all-reduce: out of memory");
    }
    for (int e = 0; e < ne; e++) sorted[order[inter[e] / T]] = inter[e];
    pthread_mutex_lock(&w->hier_mu);
    if (!sh->hier && !(sh->hier = calloc((size_t)k + 1, sizeof *sh->hier)))
        rc = dl_error(DL_ENOMEM, "hierarchical all-reduce: out of memory");
    if (rc == DL_OK && !sh->hier[0])
        rc = dl__shared_create(w, k, intra, &sh->hier[0]);
    if (rc == DL_OK && !sh->hier[1 + j])
        rc = dl__shared_create(w, np, sorted, &sh->hier[1 + j]);
    pthread_mutex_unlock(&w->hier_mu);
    if (rc == DL_OK && !c->h_intra)
        rc = dl__comm_create(sh->hier[0], j, c->ctx, &c->h_intra);
    if (rc == DL_OK && !c->h_inter &&
        (rc = dl__comm_create(sh->hier[1 + j], pi, c->ctx, &c->h_inter)) == DL_OK)
        c->h_inter->cid = dl__mpi_sub_cid(c->cid, j);
    free(intra), free(inter), free(seen), free(sorted);
    return rc;
}

static void stats_add(dl_comm_stats *to, const dl_comm_stats *now, const dl_comm_stats *before)
{
    for (int p = 0; p < DL_NPURPOSES; p++) {
        to->bytes_sent[p] += now->bytes_sent[p] - before->bytes_sent[p];
        to->bytes_recv[p] += now->bytes_recv[p] - before->bytes_recv[p];
    }
    to->msgs_sent += now->msgs_sent - before->msgs_sent;
    to->msgs_recv += now->msgs_recv - before->msgs_recv;
    to->wait_ns += now->wait_ns - before->wait_ns;
    to->copy_ns += now->copy_ns - before->copy_ns;
    to->sleeps += now->sleeps - before->sleeps;
    to->bytes_sent_inter += now->bytes_sent_inter - before->bytes_sent_inter;
    to->bytes_recv_inter += now->bytes_recv_inter - before->bytes_recv_inter;
}

static dl_algo choose_allreduce(dl_comm *c, size_t bytes);

/* One step of the hierarchical all-reduce on a group: the group's own sequence number and
 * fingerprint; its bytes are counted on the caller's communicator. */
static int sub_op(call *k, dl_comm *sub, int opcode, int mode, const char *s, char *r, size_t count,
                  dl_dtype t, dl_redop op)
{
    sub->seq++;
    call ks = {sub, k->w, opcode, fingerprint(opcode, sub->seq, t, op, count, -1), k->p};
    dl_comm_stats before = sub->st;
    int rc;
    if (opcode == OP_ALLREDUCE) {
        dl_algo a = choose_allreduce(sub, count * dl_dtype_size(t));
        rc = a == DL_ALGO_ONESHOT ? oneshot(&ks, s, r, count, t, op)
             : a == DL_ALGO_RD    ? recursive_doubling(&ks, s, r, count, t, op)
                                  : ring(&ks, RING_AR, s, r, count, t, op);
    } else {
        rc = ring(&ks, mode, s, r, count, t, op);
    }
    stats_add(&k->c->st, &sub->st, &before);
    return rc;
}

/* Reduce-scatter inside the process (member j gets block j of k), all-reduce of that shard with
 * the j-th members of the other processes, all-gather inside. avg sums and divides the shard
 * once, so every rank gets bitwise the same result. */
static int hierarchical(call *k, const char *sbuf, char *rbuf, size_t count, dl_dtype t,
                        dl_redop op, int kk, int np, int j, int pi)
{
    dl_comm *c = k->c;
    int rc = hier_views(c, kk, np, j, pi);
    if (rc)
        return rc;
    size_t es = dl_dtype_size(t), off, len;
    dl_block(count, kk, j, &off, &len);
    dl_redop sop = op == DL_AVG ? DL_SUM : op;
    char *shard = rbuf + off * es;
    if ((rc = sub_op(k, c->h_intra, OP_REDUCE_SCATTER, RING_RS, sbuf, shard, count, t, sop)) ||
        (rc = sub_op(k, c->h_inter, OP_ALLREDUCE, RING_AR, shard, shard, len, t, sop)))
        return rc;
    if (op == DL_AVG)
        scale_any(t, shard, shard, len, (double)c->sh->n);
    return sub_op(k, c->h_intra, OP_ALLGATHER, RING_AG, shard, rbuf, count, t, sop);
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

static int run_op(dl_request *q)
{
    dl_comm *c = q->c;
    int n = c->sh->n;
    size_t es = dl_dtype_size(q->t);
    if (q->skip)
        return skip_op(q);
    call k = {c, &c->ctx->waiter, q->kind, 0, q->p};
    dl__op_begin(c, q->kind, q->count, (int)q->t, q->root);
    k.check = fingerprint(q->kind, c->seq, q->t, q->op, q->count, q->root);
    int rc = DL_OK;
    dl_algo algo = DL_ALGO_RING;
    const char *s = q->sbuf;
    char *rb = q->rbuf;
    switch (q->kind) {
    case OP_ALLREDUCE:
        if (n == 1) {
            if (q->op == DL_AVG || rb != s)
                memmove(rb, s, q->count * es);
        } else {
            int hk = 0, hnp = 0, hj = 0, hpi = 0;
            int hier = c->ctx->w->mpi && (c->algo == DL_ALGO_AUTO || c->algo == DL_ALGO_HIER) &&
                       hier_shape(c, &hk, &hnp, &hj, &hpi);
            algo = c->algo == DL_ALGO_HIER ? DL_ALGO_RING : choose_allreduce(c, q->count * es);
            if (hier && algo == DL_ALGO_RING)
                algo = DL_ALGO_HIER;
            rc = algo == DL_ALGO_HIER
                     ? hierarchical(&k, s, rb, q->count, q->t, q->op, hk, hnp, hj, hpi)
                 : algo == DL_ALGO_ONESHOT ? oneshot(&k, s, rb, q->count, q->t, q->op)
                 : algo == DL_ALGO_RD      ? recursive_doubling(&k, s, rb, q->count, q->t, q->op)
                                           : ring(&k, RING_AR, s, rb, q->count, q->t, q->op);
        }
        break;
    case OP_REDUCE_SCATTER:
    case OP_ALLGATHER:
        if (n == 1) {
            if (rb != s)
                memmove(rb, s, q->count * es);
        } else {
            rc = ring(&k, q->kind == OP_REDUCE_SCATTER ? RING_RS : RING_AG, s, rb, q->count, q->t,
                      q->op);
        }
        break;
    case OP_BROADCAST:
        if (n == 1) {
            if (rb != s)
                memmove(rb, s, q->count * es);
        } else {
            rc = bcast_chain(&k, s, rb, q->count, q->t, q->root);
        }
        break;
    case OP_REDUCE:
        if (n == 1) {
            if (rb != s)
                memmove(rb, s, q->count * es);
        } else {
            rc = reduce_chain(&k, s, rb, q->count, q->t, q->op, q->root);
        }
        break;
    case OP_ALLTOALL: rc = alltoall(&k, s, rb, q->count, q->t); break;
    case OP_BARRIER: rc = barrier(&k); break;
    default: rc = dl_error(DL_EINVAL, "unknown operation %d", q->kind); break;
    }
    c->last_algo = algo;
    if (rc == DL_OK) {
        c->st.algo_ops[algo]++;
    } else {
        rc = decorate(c, rc, q->kind);
        fail_and_drain(c);
    }
    dl__op_end(c, rc);
    return rc;
}

/* ---- the rank's communication thread (non-blocking forms) ---- */

static void *progress_main(void *arg)
{
    dl_ctx *x = arg;
    dl_progress *p = &x->prog;
    if (x->cpu >= 0)
        dl_topo_bind_self(x->w->topo, x->cpu, &(int){0});
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->head && !p->stop) pthread_cond_wait(&p->cv, &p->mu);
        if (!p->head)
            break;
        dl_request *q = p->head;
        pthread_mutex_unlock(&p->mu);
        dl_error_clear();
        int rc = run_op(q);
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
static int submit_blocking(dl_request *q)
{
    if (atomic_load_explicit(&q->c->ctx->prog.pending, memory_order_acquire) == 0)
        return run_op(q);
    int rc = enqueue(q);
    return rc ? rc : wait_req(q);
}

static int submit_async(const dl_request *proto, dl_request **req)
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

/* Validate a collective's arguments; fill the request. */
static int prepare(dl_request *q, int kind, dl_comm *c, const void *sbuf, void *rbuf, size_t count,
                   dl_dtype t, dl_redop op, int root, dl_purpose p)
{
    const char *what = dl__opname(kind);
    int need_op = kind == OP_ALLREDUCE || kind == OP_REDUCE_SCATTER || kind == OP_REDUCE;
    int rc = check_common(c, what, t, need_op, op);
    if (rc || (rc = check_purpose(what, p)))
        return rc;
    int n = c->sh->n, r = c->rank;
    size_t es = dl_dtype_size(t);
    if (count > (SIZE_MAX / 4) / es / (size_t)n)
        return dl_error(DL_EINVAL, "%s: count %zu too large", what, count);
    size_t off, len;
    dl_block(count, n, r, &off, &len);
    size_t sneed = count, rneed = count; /* elements each buffer must hold */
    if (kind == OP_REDUCE_SCATTER)
        rneed = len;
    else if (kind == OP_ALLGATHER)
        sneed = len;
    else if (kind == OP_ALLTOALL)
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
    *q = (dl_request){.kind = kind,
                      .c = c,
                      .sbuf = sbuf,
                      .rbuf = rbuf,
                      .count = count,
                      .t = t,
                      .op = op,
                      .root = root,
                      .p = p};
    /* counted here, on the rank's thread, in the order the rank starts its collectives */
    if (kind == OP_ALLREDUCE || kind == OP_REDUCE_SCATTER)
        q->skip = dl__test_skip_reduction(p, &c->ctx->test_reductions);
    return DL_OK;
}

#define BLOCKING(KIND, C, S, R, N, T, OP, ROOT, P)                                                 \
    do {                                                                                           \
        dl_request q_;                                                                             \
        int rc_ = prepare(&q_, KIND, C, S, R, N, T, OP, ROOT, P);                                  \
        return rc_ ? rc_ : submit_blocking(&q_);                                                   \
    } while (0)

#define ASYNC(KIND, C, S, R, N, T, OP, ROOT, P, REQ)                                               \
    do {                                                                                           \
        dl_request q_;                                                                             \
        int rc_ = prepare(&q_, KIND, C, S, R, N, T, OP, ROOT, P);                                  \
        return rc_ ? rc_ : submit_async(&q_, REQ);                                                 \
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
    return submit_blocking(&q);
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

/* ---- point-to-point ---- */

static int p2p(dl_comm *c, int send, void *buf, size_t count, dl_dtype t, int peer, int tag,
               dl_purpose p, uint64_t *ticket)
{
    const char *what = send ? (ticket ? "isend" : "send") : "recv";
    int rc = check_common(c, what, t, 0, DL_SUM);
    if (rc || (rc = check_purpose(what, p)))
        return rc;
    int n = c->sh->n, r = c->rank;
    if (peer < 0 || peer >= n || peer == r)
        return dl_error(DL_EINVAL, "%s: peer %d invalid for rank %d of %d", what, peer, r, n);
    size_t bytes = count * dl_dtype_size(t);
    if (count && !buf)
        return dl_error(DL_EINVAL, "%s: null buffer for %zu elements", what, count);
    if (atomic_load_explicit(&c->ctx->prog.pending, memory_order_acquire))
        return dl_error(DL_EINVAL, "%s: rank %d has non-blocking collectives pending; wait first",
                        what, r);
    /* point-to-point does not advance the collective sequence; the fingerprint is the type and
     * the tag (in the sequence's place) */
    call k = {c, &c->ctx->waiter, send ? OP_SEND : OP_RECV,
              fingerprint(OP_SEND, (uint64_t)(int64_t)tag, t, DL_SUM, 0, -1), p};
    dl__op_begin(c, k.opcode, count, (int)t, peer);
    dl_link *l;
    if (send) {
        if ((rc = get_link(&k, r, peer, &l)) == DL_OK && (rc = post(&k, l, buf, bytes)) == DL_OK) {
            if (ticket)
                *ticket = l->stats.msgs_sent;
            else
                rc = flush(&k, l);
        }
    } else {
        const void *up;
        if ((rc = get_link(&k, peer, r, &l)) == DL_OK &&
            (rc = acquire(&k, l, bytes, &up)) == DL_OK) {
            memcpy(buf, up, bytes);
            rc = dl_link_release(l);
        }
    }
    if (rc) {
        char prev[768];
        snprintf(prev, sizeof prev, "%s", dl_errmsg());
        rc = dl_error(rc, "%s %s rank %d on communicator %llu: %s", what, send ? "to" : "from",
                      peer, (unsigned long long)c->sh->uid, prev);
        fail_and_drain(c);
    }
    dl__op_end(c, rc);
    return rc;
}

int dl_send(dl_comm *c, const void *buf, size_t count, dl_dtype t, int peer, dl_purpose p)
{
    return p2p(c, 1, (void *)buf, count, t, peer, 0, p, NULL);
}

int dl_isend(dl_comm *c, const void *buf, size_t count, dl_dtype t, int peer, int tag, dl_purpose p,
             uint64_t *ticket)
{
    uint64_t dummy;
    return p2p(c, 1, (void *)buf, count, t, peer, tag, p, ticket ? ticket : &dummy);
}

int dl_recv_tag(dl_comm *c, void *buf, size_t count, dl_dtype t, int peer, int tag, dl_purpose p)
{
    return p2p(c, 0, buf, count, t, peer, tag, p, NULL);
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
        fail_and_drain(c);
    }
    return rc;
}

void dl_comm_fail(dl_comm *c)
{
    if (c)
        fail_and_drain(c);
}

int dl_recv(dl_comm *c, void *buf, size_t count, dl_dtype t, int peer, dl_purpose p)
{
    return p2p(c, 0, buf, count, t, peer, 0, p, NULL);
}
