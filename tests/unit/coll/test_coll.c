/* Collectives against serial references computed in the test thread.
 *
 * Every collective (allreduce, reduce_scatter, allgather, broadcast, reduce, alltoall, barrier,
 * send/recv) for n = 1..8 and 16 ranks, counts 0, 1, 7, n-1, n, 1000, a multi-slice size and
 * 1,000,003, every type and op, in-place and out-of-place, algorithms ring and auto.
 *
 * Rank threads never assert: each rank writes its output into buffers the test thread allocated
 * before dl_world_run (and records statuses, stats and flags there); the test thread computes
 * the reference and asserts afterwards.
 *
 * Accuracy contract checked (x_r the inputs, S = sum_r |x_r[i]| per element):
 *   max: exact.  sum: |got - sum| <= n * eps * S.  avg: |got - sum/n| <= (n + 2) * eps * S / n.
 *   eps = 2^-52 (f64), 2^-23 (f32), 2^-8 (bf16: inputs exact bf16, each hop rounds to bf16).
 *   The reference is accumulated in long double (64-bit mantissa), so its own error is
 *   negligible against these bounds.
 * Results are bitwise identical on every rank (allreduce; allgather, broadcast are exact) and
 * run to run (every case is run twice in two worlds and compared with memcmp).
 *
 * Byte counts (algorithm ring; dl_comm_reset_stats before each collective), per rank r, S bytes,
 * blocks len(k) from dl_block:
 *   allreduce: in reduce-scatter step s (0..n-2) rank r sends chunk (r - s) mod n, in all-gather
 *     step s chunk (r + 1 - s) mod n; so it sends every chunk but (r+1) mod n in the first half
 *     and every chunk but (r+2) mod n in the second: bytes = size * (2 count - len(r+1) - len(r+2)).
 *     Also asserted: the sum over ranks is 2 (n-1) S exactly, and each rank is within 2 elements
 *     of 2(n-1)/n S (the remainder of S/n).
 *   reduce_scatter: size * (count - len(r))   (rank r ends with block r, so never sends it)
 *   allgather:      size * (count - len(r+1)) (the last block rank r receives comes from r+1)
 *   broadcast:      S, except 0 on the last rank of the ring from the root, (root - 1) mod n
 *   reduce:         S, except 0 on the root
 *   alltoall:       (n - 1) * count * size
 *   other purposes 0; bytes received summed over ranks = bytes sent summed over ranks. */
#define _GNU_SOURCE
#include <check.h>
#include <math.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <unistd.h>
#include "core/bf16.h"
#include "../testutil.h"

#define NMAX 16
#define GUARD 64
#define FILLB 0xA5
#define BIG_COUNT 1000003u

/* ------------------------------------------------------------------------------------------ */
/* failure collection (test thread)                                                             */

typedef struct errs {
    int n;
    char first[1024];
} errs;

static void efail(errs *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void efail(errs *e, const char *fmt, ...)
{
    if (e->n++ == 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->first, sizeof e->first, fmt, ap);
        va_end(ap);
    }
}

#define ASSERT_NO_ERRS(e) ck_assert_msg((e).n == 0, "%d failure(s); first: %s", (e).n, (e).first)

/* ------------------------------------------------------------------------------------------ */
/* cases                                                                                        */

enum { K_ALLREDUCE, K_REDUCE_SCATTER, K_ALLGATHER, K_BROADCAST, K_REDUCE, K_ALLTOALL, K_NKINDS };
static const char *kind_name[K_NKINDS] = {"allreduce", "reduce_scatter", "allgather",
                                          "broadcast", "reduce",         "alltoall"};
static const char *tname(dl_dtype t) { return t == DL_F32 ? "f32" : t == DL_F64 ? "f64" : "bf16"; }
static const char *oname(dl_redop o) { return o == DL_SUM ? "sum" : o == DL_AVG ? "avg" : "max"; }
static const char *aname(dl_algo a)
{
    return a == DL_ALGO_RING      ? "ring"
           : a == DL_ALGO_AUTO    ? "auto"
           : a == DL_ALGO_ONESHOT ? "oneshot"
                                  : "rd";
}

typedef struct ccase {
    int kind;
    dl_dtype t;
    dl_redop op;
    size_t count;
    int inplace;
    int root;
    dl_purpose purpose;
    uint64_t seed;
    /* per rank, allocated by the test thread */
    unsigned char *out[NMAX]; /* output buffer (with GUARD bytes of FILLB after it) */
    size_t out_elems[NMAX];   /* elements in out[r] before the guard */
    int status[NMAX];
    int send_changed[NMAX]; /* out-of-place: the send buffer was modified */
    int last_algo[NMAX];
    dl_comm_stats stats[NMAX];
} ccase;

typedef struct batch {
    int n;
    dl_algo algo;
    size_t slice_bytes; /* 0: default */
    int nslots;         /* 0: default */
    int ncases, cap;
    ccase *cases;
    int get_algo[NMAX];
    int fail_case[NMAX];
    char errmsg[NMAX][512];
} batch;

static size_t out_elems_for(int kind, size_t count, int n, int r, int inplace)
{
    size_t off, len;
    dl_block(count, n, r, &off, &len);
    switch (kind) {
    case K_REDUCE_SCATTER: return inplace ? count : len;
    case K_ALLTOALL: return count * (size_t)n;
    default: return count;
    }
}

static void batch_init(batch *b, int n, dl_algo algo)
{
    memset(b, 0, sizeof *b);
    b->n = n;
    b->algo = algo;
    for (int r = 0; r < NMAX; r++) b->fail_case[r] = -1;
}

static ccase *batch_add(batch *b, int kind, dl_dtype t, dl_redop op, size_t count, int inplace,
                        int root, dl_purpose p, uint64_t seed)
{
    if (b->ncases == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 64;
        b->cases = realloc(b->cases, (size_t)b->cap * sizeof *b->cases);
        ck_assert_ptr_nonnull(b->cases);
    }
    ccase *c = &b->cases[b->ncases++];
    memset(c, 0, sizeof *c);
    c->kind = kind;
    c->t = t;
    c->op = op;
    c->count = count;
    c->inplace = inplace;
    c->root = root;
    c->purpose = p;
    c->seed = seed;
    size_t es = tu_tsize(t);
    for (int r = 0; r < b->n; r++) {
        c->out_elems[r] = out_elems_for(kind, count, b->n, r, inplace);
        size_t bytes = c->out_elems[r] * es + GUARD;
        c->out[r] = tu_alloc(bytes);
        ck_assert_ptr_nonnull(c->out[r]);
        memset(c->out[r], FILLB, bytes);
        c->status[r] = -1;
        c->last_algo[r] = -1;
    }
    return c;
}

static void batch_free(batch *b)
{
    for (int i = 0; i < b->ncases; i++)
        for (int r = 0; r < b->n; r++) free(b->cases[i].out[r]);
    free(b->cases);
    b->cases = NULL;
    b->ncases = b->cap = 0;
}

/* ------------------------------------------------------------------------------------------ */
/* rank side                                                                                    */

#define JUNK_SEED 0x5EEDBADull

/* Allocate and fill n elements (seed, rank, first..). */
static void *make_input(dl_dtype t, size_t n, uint64_t seed, int rank, uint64_t first)
{
    void *p = tu_alloc(n * tu_tsize(t));
    if (p)
        tu_fill(t, p, n, seed, rank, first);
    return p;
}

/* 1 if p differs from the generated input. */
static int input_changed(dl_dtype t, const void *p, size_t n, uint64_t seed, int rank,
                         uint64_t first)
{
    void *q = make_input(t, n, seed, rank, first);
    if (!q)
        return 1;
    int d = memcmp(p, q, n * tu_tsize(t)) != 0;
    free(q);
    return d;
}

static int run_case(dl_comm *c, ccase *tc)
{
    const int r = dl_comm_rank(c), n = dl_comm_size(c);
    const dl_dtype t = tc->t;
    const size_t es = tu_tsize(t), count = tc->count;
    unsigned char *out = tc->out[r];
    size_t off, len;
    dl_block(count, n, r, &off, &len);

    void *send = NULL; /* own send buffer (out-of-place) */
    size_t send_n = 0; /* its elements */
    uint64_t send_seed = tc->seed, send_first = 0;
    const void *sbuf = NULL;
    void *rbuf = NULL;

    switch (tc->kind) {
    case K_ALLREDUCE:
    case K_REDUCE_SCATTER:
    case K_ALLTOALL: {
        size_t in_n = tc->kind == K_ALLTOALL ? count * (size_t)n : count;
        if (tc->inplace) {
            tu_fill(t, out, in_n, tc->seed, r, 0);
            sbuf = out;
            rbuf = tc->kind == K_REDUCE_SCATTER ? out + off * es : out;
        } else {
            send_n = in_n;
            sbuf = send = make_input(t, in_n, tc->seed, r, 0);
            rbuf = out;
        }
        break;
    }
    case K_ALLGATHER:
        if (tc->inplace) {
            tu_fill(t, out + off * es, len, tc->seed, r, off);
            sbuf = out + off * es;
            rbuf = out;
        } else {
            send_n = len;
            send_first = off;
            sbuf = send = make_input(t, len, tc->seed, r, off);
            rbuf = out;
        }
        break;
    case K_BROADCAST:
        if (tc->inplace) {
            if (r == tc->root)
                tu_fill(t, out, count, tc->seed, r, 0);
            sbuf = out;
            rbuf = out;
        } else {
            /* non-roots pass a buffer of junk: sendbuf is read at the root only */
            send_seed = r == tc->root ? tc->seed : JUNK_SEED ^ tc->seed;
            send_n = count;
            sbuf = send = make_input(t, count, send_seed, r, 0);
            rbuf = out;
        }
        break;
    case K_REDUCE:
        if (tc->inplace && r == tc->root) {
            tu_fill(t, out, count, tc->seed, r, 0);
            sbuf = out;
            rbuf = out;
        } else {
            send_n = count;
            sbuf = send = make_input(t, count, tc->seed, r, 0);
            /* in-place mode: non-roots pass recvbuf NULL (allowed); out-of-place: a buffer that
             * must stay untouched */
            rbuf = tc->inplace ? NULL : out;
        }
        break;
    }
    if (send_n && !send)
        return dl_error(DL_ENOMEM, "test: out of host memory");

    dl_comm_reset_stats(c);
    int st;
    switch (tc->kind) {
    case K_ALLREDUCE: st = dl_allreduce(c, sbuf, rbuf, count, t, tc->op, tc->purpose); break;
    case K_REDUCE_SCATTER:
        st = dl_reduce_scatter(c, sbuf, rbuf, count, t, tc->op, tc->purpose);
        break;
    case K_ALLGATHER: st = dl_allgather(c, sbuf, rbuf, count, t, tc->purpose); break;
    case K_BROADCAST: st = dl_broadcast(c, sbuf, rbuf, count, t, tc->root, tc->purpose); break;
    case K_REDUCE: st = dl_reduce(c, sbuf, rbuf, count, t, tc->op, tc->root, tc->purpose); break;
    default: st = dl_alltoall(c, sbuf, rbuf, count, t, tc->purpose); break;
    }
    tc->status[r] = st;
    dl_comm_get_stats(c, &tc->stats[r]);
    tc->last_algo[r] = (int)dl_comm_last_algo(c);
    if (send) {
        tc->send_changed[r] = input_changed(t, send, send_n, send_seed, r, send_first);
        free(send);
    }
    return st;
}

static int batch_rank(dl_ctx *ctx, void *arg)
{
    batch *b = arg;
    dl_comm *w = dl_ctx_comm(ctx);
    int r = dl_ctx_rank(ctx);
    dl_comm_set_algo(w, b->algo);
    b->get_algo[r] = (int)dl_comm_get_algo(w);
    for (int i = 0; i < b->ncases; i++) {
        int st = run_case(w, &b->cases[i]);
        if (st != DL_OK) {
            b->fail_case[r] = i;
            snprintf(b->errmsg[r], sizeof b->errmsg[r], "%s", dl_errmsg());
            return st;
        }
    }
    return DL_OK;
}

static void batch_run(batch *b)
{
    dl_world_opts o;
    tu_world_opts(&o, b->n);
    if (b->slice_bytes)
        o.slice_bytes = b->slice_bytes;
    if (b->nslots)
        o.nslots = b->nslots;
    int st = dl_world_run(&o, batch_rank, b);
    if (st != DL_OK) {
        int fr = -1;
        for (int r = 0; r < b->n; r++)
            if (b->fail_case[r] >= 0 &&
                (fr < 0 || b->cases[b->fail_case[r]].status[r] != DL_EABORT))
                fr = r;
        const ccase *c = fr >= 0 ? &b->cases[b->fail_case[fr]] : NULL;
        ck_abort_msg("world n=%d algo=%s failed: %s (%s); first failing rank %d in case %s %s %s "
                     "count=%zu inplace=%d root=%d: %s",
                     b->n, aname(b->algo), dl_strstatus(st), dl_errmsg(), fr,
                     c ? kind_name[c->kind] : "-", c ? tname(c->t) : "-", c ? oname(c->op) : "-",
                     c ? c->count : 0, c ? c->inplace : -1, c ? c->root : -1,
                     fr >= 0 ? b->errmsg[fr] : "");
    }
}

/* ------------------------------------------------------------------------------------------ */
/* test side: references                                                                       */

static double eps_of(dl_dtype t)
{
    return t == DL_F64 ? ldexp(1.0, -52) : t == DL_F32 ? ldexp(1.0, -23) : ldexp(1.0, -8);
}

/* Reference reduction over n ranks of the inputs (seed, r, 0..count-1). */
static void ref_reduce(dl_dtype t, dl_redop op, uint64_t seed, int n, size_t count,
                       long double *ref, double *S)
{
    for (size_t i = 0; i < count; i++) {
        ref[i] = op == DL_MAX ? -INFINITY : 0.0L;
        S[i] = 0.0;
    }
    for (int r = 0; r < n; r++) {
        uint64_t key = tu_rng_key(seed, r);
        for (size_t i = 0; i < count; i++) {
            double v = tu_value_keyed(t, key, i);
            if (op == DL_MAX) {
                if (v > ref[i])
                    ref[i] = v;
            } else {
                ref[i] += v;
                S[i] += fabs(v);
            }
        }
    }
    if (op == DL_AVG)
        for (size_t i = 0; i < count; i++) ref[i] /= n;
}

/* Check `len` elements of got (elements ref[first..first+len)). Returns failures. */
static int check_reduced(errs *e, const char *what, dl_dtype t, dl_redop op, int n, const void *got,
                         size_t first, size_t len, const long double *ref, const double *S)
{
    int bad = 0;
    double eps = eps_of(t);
    for (size_t i = 0; i < len; i++) {
        double g = tu_get(t, got, i);
        long double want = ref[first + i];
        if (op == DL_MAX) {
            if (!((long double)g == want)) {
                if (!bad)
                    efail(e, "%s: element %zu = %.17g, want max %.17Lg (exact)", what, first + i, g,
                          want);
                bad++;
            }
        } else {
            double bound = op == DL_SUM ? n * eps * S[first + i] : (n + 2) * eps * S[first + i] / n;
            long double err = fabsl((long double)g - want);
            if (!(err <= bound)) {
                if (!bad)
                    efail(e, "%s: element %zu = %.17g, want %.17Lg +- %.3g (err %.3Lg)", what,
                          first + i, g, want, bound, err);
                bad++;
            }
        }
    }
    return bad;
}

static int guard_ok(const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != FILLB)
            return 0;
    return 1;
}

/* Expected bytes sent (elements) by rank r under the ring, for kinds other than allreduce. */
static uint64_t ring_elems_sent(const ccase *c, int n, int r)
{
    size_t off, len;
    if (n == 1)
        return 0;
    switch (c->kind) {
    case K_REDUCE_SCATTER: dl_block(c->count, n, r, &off, &len); return c->count - len;
    case K_ALLGATHER: dl_block(c->count, n, (r + 1) % n, &off, &len); return c->count - len;
    case K_BROADCAST: return r == (c->root - 1 + n) % n ? 0 : c->count;
    case K_REDUCE: return r == c->root ? 0 : c->count;
    case K_ALLTOALL: return (uint64_t)(n - 1) * c->count;
    default: return 0;
    }
}

/* All-reduce on the ring: rank r skips chunk (r+c) mod n in the reduce-scatter (the chunk it
 * ends up reducing) and chunk (r+c+1) mod n in the all-gather (the chunk it receives last).
 * The schedule "RS step s sends chunk (r - s) mod n, AG step s sends (r + 1 - s) mod n" is c = 1. */
static uint64_t ring_allreduce_bytes(size_t count, int n, int r, int c, size_t es)
{
    size_t o1, l1, o2, l2;
    if (n == 1)
        return 0;
    dl_block(count, n, (r + c) % n, &o1, &l1);
    dl_block(count, n, (r + c + 1) % n, &o2, &l2);
    return (uint64_t)(2 * count - l1 - l2) * es;
}

static void check_bytes(errs *e, const char *what, const ccase *c, int n)
{
    const size_t es = tu_tsize(c->t);
    uint64_t sent[NMAX], tot_sent[DL_NPURPOSES] = {0}, tot_recv[DL_NPURPOSES] = {0};
    for (int r = 0; r < n; r++) {
        for (int p = 0; p < DL_NPURPOSES; p++) {
            tot_sent[p] += c->stats[r].bytes_sent[p];
            tot_recv[p] += c->stats[r].bytes_recv[p];
            if (p != (int)c->purpose && (c->stats[r].bytes_sent[p] || c->stats[r].bytes_recv[p]))
                efail(e,
                      "%s: rank %d counted %llu/%llu bytes sent/recv under purpose %s, expected "
                      "everything under %s",
                      what, r, (unsigned long long)c->stats[r].bytes_sent[p],
                      (unsigned long long)c->stats[r].bytes_recv[p], dl_purpose_name((dl_purpose)p),
                      dl_purpose_name(c->purpose));
        }
        sent[r] = c->stats[r].bytes_sent[c->purpose];
    }
    for (int p = 0; p < DL_NPURPOSES; p++)
        if (tot_sent[p] != tot_recv[p])
            efail(e, "%s: purpose %d: ranks sent %llu bytes in total but received %llu", what, p,
                  (unsigned long long)tot_sent[p], (unsigned long long)tot_recv[p]);

    if (c->kind != K_ALLREDUCE) {
        for (int r = 0; r < n; r++) {
            uint64_t want = ring_elems_sent(c, n, r) * es;
            if (sent[r] != want)
                efail(e, "%s: ring: rank %d sent %llu bytes, expected %llu", what, r,
                      (unsigned long long)sent[r], (unsigned long long)want);
        }
        if (c->kind == K_REDUCE_SCATTER || c->kind == K_ALLGATHER) {
            /* (n-1)/n S within the remainder: |sent - (n-1)/n S| < 1 element */
            double S = (double)c->count * es;
            for (int r = 0; r < n; r++)
                if (fabs((double)sent[r] - (n - 1) * S / n) >= (double)es)
                    efail(e,
                          "%s: rank %d sent %llu bytes, not (n-1)/n*S = %.1f within the remainder",
                          what, r, (unsigned long long)sent[r], (n - 1) * S / n);
        }
        return;
    }
    /* all-reduce: the exact ring figure with a consistent chunk shift */
    const size_t count = c->count;
    const double S = (double)count * es;
    uint64_t total = 0;
    for (int r = 0; r < n; r++) {
        total += sent[r];
        if (fabs((double)sent[r] - 2.0 * (n - 1) * S / n) >= 2.0 * es)
            efail(e, "%s: rank %d sent %llu bytes, not 2(n-1)/n*S = %.1f within the remainder",
                  what, r, (unsigned long long)sent[r], 2.0 * (n - 1) * S / n);
    }
    if (total != 2ull * (uint64_t)(n - 1) * count * es)
        efail(e, "%s: ranks sent %llu bytes in total, expected 2(n-1)S = %llu", what,
              (unsigned long long)total,
              (unsigned long long)(2ull * (uint64_t)(n - 1) * count * es));
    /* the exact ring schedule: rank r skips chunk (r+1) mod n in the reduce-scatter and chunk
     * (r+2) mod n in the all-gather */
    int exact = 1;
    for (int r = 0; r < n; r++)
        if (sent[r] != ring_allreduce_bytes(count, n, r, 1, es))
            exact = 0;
    if (!exact) {
        int found = -1; /* for the message: a consistent but shifted ownership? */
        for (int sh = 0; sh < n && found < 0; sh++) {
            int ok = 1;
            for (int r = 0; r < n && ok; r++)
                if (sent[r] != ring_allreduce_bytes(count, n, r, sh, es))
                    ok = 0;
            if (ok)
                found = sh;
        }
        for (int r = 0; r < n; r++)
            if (sent[r] != ring_allreduce_bytes(count, n, r, 1, es)) {
                efail(e, "%s: ring: rank %d sent %llu bytes, the ring schedule gives %llu%s", what,
                      r, (unsigned long long)sent[r],
                      (unsigned long long)ring_allreduce_bytes(count, n, r, 1, es),
                      found >= 0 ? " (the counts fit a ring whose chunk ownership is shifted)"
                                 : "");
                break;
            }
    }
}

static void case_label(char *buf, size_t len, const batch *b, const ccase *c)
{
    snprintf(buf, len, "%s n=%d algo=%s %s %s count=%zu %s root=%d", kind_name[c->kind], b->n,
             aname(b->algo), tname(c->t), oname(c->op), c->count,
             c->inplace ? "in-place" : "out-of-place", c->root);
}

/* Start of the result region in out[r] and its element count. */
static void result_region(const ccase *c, int n, int r, size_t *start, size_t *len)
{
    size_t off, bl;
    dl_block(c->count, n, r, &off, &bl);
    if (c->kind == K_REDUCE_SCATTER) {
        *start = c->inplace ? off : 0;
        *len = bl;
    } else if (c->kind == K_REDUCE && r != c->root) {
        *start = 0;
        *len = 0;
    } else {
        *start = 0;
        *len = c->out_elems[r];
    }
}

static void verify_case(errs *e, const batch *b, const ccase *c, int check_byte_counts)
{
    const int n = b->n;
    const size_t es = tu_tsize(c->t), count = c->count;
    char what[200];
    case_label(what, sizeof what, b, c);

    for (int r = 0; r < n; r++) {
        if (c->status[r] != DL_OK)
            efail(e, "%s: rank %d status %s", what, r, dl_strstatus(c->status[r]));
        if (c->send_changed[r])
            efail(e, "%s: rank %d: out-of-place send buffer was modified", what, r);
        if (!guard_ok(c->out[r] + c->out_elems[r] * es, GUARD))
            efail(e, "%s: rank %d: bytes written past the end of the receive buffer", what, r);
    }

    switch (c->kind) {
    case K_ALLREDUCE:
    case K_REDUCE_SCATTER:
    case K_REDUCE: {
        long double *ref = malloc((count ? count : 1) * sizeof *ref);
        double *S = malloc((count ? count : 1) * sizeof *S);
        ck_assert(ref && S);
        ref_reduce(c->t, c->op, c->seed, n, count, ref, S);
        for (int r = 0; r < n; r++) {
            char w2[260];
            snprintf(w2, sizeof w2, "%s rank %d", what, r);
            if (c->kind == K_ALLREDUCE) {
                check_reduced(e, w2, c->t, c->op, n, c->out[r], 0, count, ref, S);
            } else if (c->kind == K_REDUCE_SCATTER) {
                size_t off, len;
                dl_block(count, n, r, &off, &len);
                size_t start = c->inplace ? off : 0;
                check_reduced(e, w2, c->t, c->op, n, c->out[r] + start * es, off, len, ref, S);
            } else if (r == c->root) {
                check_reduced(e, w2, c->t, c->op, n, c->out[r], 0, count, ref, S);
            } else if (!guard_ok(c->out[r], count * es)) {
                efail(e, "%s: non-root rank %d: recvbuf was written", what, r);
            }
        }
        free(ref);
        free(S);
        if (c->kind == K_ALLREDUCE)
            for (int r = 1; r < n; r++)
                if (memcmp(c->out[r], c->out[0], count * es) != 0)
                    efail(e, "%s: rank %d's result differs bitwise from rank 0's", what, r);
        break;
    }
    case K_ALLGATHER: {
        for (int j = 0; j < n; j++) {
            size_t off, len;
            dl_block(count, n, j, &off, &len);
            void *want = make_input(c->t, len, c->seed, j, off);
            ck_assert_ptr_nonnull(want);
            for (int r = 0; r < n; r++)
                if (memcmp(c->out[r] + off * es, want, len * es) != 0)
                    efail(e,
                          "%s: rank %d: block %d (offset %zu, %zu elements) is not rank %d's input",
                          what, r, j, off, len, j);
            free(want);
        }
        break;
    }
    case K_BROADCAST: {
        void *want = make_input(c->t, count, c->seed, c->root, 0);
        ck_assert_ptr_nonnull(want);
        for (int r = 0; r < n; r++)
            if (memcmp(c->out[r], want, count * es) != 0)
                efail(e, "%s: rank %d did not receive the root's buffer", what, r);
        free(want);
        break;
    }
    case K_ALLTOALL: {
        for (int j = 0; j < n; j++)
            for (int r = 0; r < n; r++) {
                /* rank r's block j is rank j's send block r */
                void *want = make_input(c->t, count, c->seed, j, (uint64_t)r * count);
                ck_assert_ptr_nonnull(want);
                if (memcmp(c->out[r] + (size_t)j * count * es, want, count * es) != 0)
                    efail(e, "%s: rank %d: block %d is not rank %d's block %d", what, r, j, j, r);
                free(want);
            }
        break;
    }
    }

    /* algorithm reporting: what ran is a concrete algorithm, the same on every rank */
    if (c->kind == K_ALLREDUCE && n > 1 && count > 0) {
        for (int r = 0; r < n; r++) {
            int a = c->last_algo[r];
            if (b->algo == DL_ALGO_RING && a != DL_ALGO_RING)
                efail(e, "%s: rank %d: dl_comm_last_algo = %d, expected ring", what, r, a);
            if (a <= DL_ALGO_AUTO || a >= DL_NALGOS)
                efail(e, "%s: rank %d: dl_comm_last_algo = %d is not a concrete algorithm", what, r,
                      a);
            if (a != c->last_algo[0])
                efail(e, "%s: ranks disagree on the algorithm that ran (%d vs %d)", what, a,
                      c->last_algo[0]);
        }
    }
    if (check_byte_counts)
        check_bytes(e, what, c, n);
}

static void verify_batch(errs *e, const batch *b)
{
    for (int r = 0; r < b->n; r++)
        if (b->get_algo[r] != (int)b->algo)
            efail(e, "rank %d: dl_comm_get_algo = %d after dl_comm_set_algo(%d)", r, b->get_algo[r],
                  b->algo);
    for (int i = 0; i < b->ncases; i++) verify_case(e, b, &b->cases[i], b->algo == DL_ALGO_RING);
}

/* The second run must give the same bytes. */
static void compare_runs(errs *e, const batch *a, const batch *b)
{
    for (int i = 0; i < a->ncases; i++) {
        const ccase *c = &a->cases[i], *d = &b->cases[i];
        for (int r = 0; r < a->n; r++) {
            size_t start, len;
            result_region(c, a->n, r, &start, &len);
            size_t es = tu_tsize(c->t);
            if (memcmp(c->out[r] + start * es, d->out[r] + start * es, len * es) != 0) {
                char what[200];
                case_label(what, sizeof what, a, c);
                efail(e, "%s: rank %d: result differs bitwise between two runs", what, r);
            }
        }
    }
}

/* Build the same cases into two batches, run both, verify the first, compare the second. */
typedef void (*build_fn)(batch *b, const void *arg);

static void run_twice(int n, dl_algo algo, size_t slice_bytes, int nslots, build_fn build,
                      const void *arg, int rerun)
{
    batch a, b;
    batch_init(&a, n, algo);
    a.slice_bytes = slice_bytes;
    a.nslots = nslots;
    build(&a, arg);
    batch_run(&a);
    errs e = {0};
    verify_batch(&e, &a);
    ASSERT_NO_ERRS(e);
    if (rerun) {
        batch_init(&b, n, algo);
        b.slice_bytes = slice_bytes;
        b.nslots = nslots;
        build(&b, arg);
        batch_run(&b);
        compare_runs(&e, &a, &b);
        batch_free(&b);
        ASSERT_NO_ERRS(e);
    }
    batch_free(&a);
}

/* ------------------------------------------------------------------------------------------ */
/* the matrix: every type, op, count, in-place or not, for one collective, n and algorithm      */

static const int full_ns[] = {1, 2, 3, 4, 5, 6, 7, 8, 16};
static const int small_ns[] = {1, 2, 3, 4};
#define NFULL ((int)(sizeof full_ns / sizeof full_ns[0]))
#define NSMALL ((int)(sizeof small_ns / sizeof small_ns[0]))

static int ns_count(void) { return DL_TEST_SMALL ? NSMALL : NFULL; }
static int ns_at(int i) { return DL_TEST_SMALL ? small_ns[i] : full_ns[i]; }

static int counts_for(int kind, int n, size_t *out)
{
    size_t mid = DL_TEST_SMALL ? 5003 : 70001; /* 70001 f64 = 547 KiB: several 256 KiB slices */
    if (kind == K_ALLTOALL)
        mid = (DL_TEST_SMALL ? 2003 : 20011) / (size_t)n;
    size_t cand[] = {0, 1, 7, (size_t)(n - 1), (size_t)n, (size_t)(3 * n + 1), 1000, mid};
    int k = 0;
    for (size_t i = 0; i < sizeof cand / sizeof cand[0]; i++) {
        int dup = 0;
        for (int j = 0; j < k; j++) dup |= out[j] == cand[i];
        if (!dup)
            out[k++] = cand[i];
    }
    return k;
}

typedef struct matrix_arg {
    int kind;
} matrix_arg;

static void build_matrix(batch *b, const void *argp)
{
    const matrix_arg *m = argp;
    const int n = b->n, kind = m->kind;
    const int has_op = kind == K_ALLREDUCE || kind == K_REDUCE_SCATTER || kind == K_REDUCE;
    const int has_root = kind == K_BROADCAST || kind == K_REDUCE;
    int roots[3] = {0, n - 1, n / 2};
    size_t counts[16];
    int nc = counts_for(kind, n, counts);
    int idx = 0;
    for (int t = 0; t < DL_NDTYPES; t++)
        for (int op = 0; op < (has_op ? DL_NREDOPS : 1); op++)
            for (int ci = 0; ci < nc; ci++)
                for (int ip = 0; ip < 2; ip++, idx++) {
                    uint64_t seed = tu_splitmix64(((uint64_t)kind << 48) ^ ((uint64_t)n << 40) ^
                                                  ((uint64_t)b->algo << 32) ^ (uint64_t)idx);
                    int root = has_root ? roots[idx % 3] : 0;
                    batch_add(b, kind, (dl_dtype)t, (dl_redop)op, counts[ci], ip, root,
                              (dl_purpose)(idx % DL_NPURPOSES), seed);
                }
}

/* Loop index i: n = ns[i / 2], algorithm ring (even) or auto (odd). The ring runs with small
 * slices and few slots (many slices per chunk, ring wrap-around), auto with the defaults. */
static void matrix_test(int kind, int i)
{
    int n = ns_at(i / 2);
    dl_algo algo = i % 2 ? DL_ALGO_AUTO : DL_ALGO_RING;
    matrix_arg m = {kind};
    run_twice(n, algo, algo == DL_ALGO_RING ? 16384 : 0, algo == DL_ALGO_RING ? 4 : 0, build_matrix,
              &m, 1);
}

START_TEST(t_allreduce) { matrix_test(K_ALLREDUCE, _i); }
END_TEST
START_TEST(t_reduce_scatter) { matrix_test(K_REDUCE_SCATTER, _i); }
END_TEST
START_TEST(t_allgather) { matrix_test(K_ALLGATHER, _i); }
END_TEST
START_TEST(t_broadcast) { matrix_test(K_BROADCAST, _i); }
END_TEST
START_TEST(t_reduce) { matrix_test(K_REDUCE, _i); }
END_TEST
START_TEST(t_alltoall) { matrix_test(K_ALLTOALL, _i); }
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* large counts                                                                                 */

typedef struct bigspec {
    int kind, n;
    dl_dtype t;
    dl_redop op;
    int inplace, root;
    dl_algo algo;
    int rerun;
} bigspec;

static const bigspec big_full[] = {
    {K_ALLREDUCE, 2, DL_F32, DL_SUM, 0, 0, DL_ALGO_RING, 1},
    {K_ALLREDUCE, 3, DL_F32, DL_SUM, 1, 0, DL_ALGO_AUTO, 1},
    {K_ALLREDUCE, 5, DL_F32, DL_SUM, 0, 0, DL_ALGO_AUTO, 0},
    {K_ALLREDUCE, 8, DL_F32, DL_SUM, 1, 0, DL_ALGO_RING, 0},
    {K_ALLREDUCE, 16, DL_F32, DL_SUM, 0, 0, DL_ALGO_RING, 0},
    {K_ALLREDUCE, 4, DL_F64, DL_AVG, 0, 0, DL_ALGO_RING, 0},
    {K_ALLREDUCE, 1, DL_F32, DL_SUM, 1, 0, DL_ALGO_RING, 0},
    {K_ALLREDUCE, 6, DL_F64, DL_SUM, 0, 0, DL_ALGO_RING, 0},
    {K_ALLREDUCE, 3, DL_BF16, DL_SUM, 1, 0, DL_ALGO_AUTO, 0},
    {K_ALLREDUCE, 7, DL_F32, DL_MAX, 0, 0, DL_ALGO_AUTO, 0},
    {K_REDUCE_SCATTER, 5, DL_F32, DL_SUM, 1, 0, DL_ALGO_RING, 0},
    {K_REDUCE_SCATTER, 4, DL_BF16, DL_AVG, 0, 0, DL_ALGO_AUTO, 0},
    {K_ALLGATHER, 3, DL_F64, DL_SUM, 1, 0, DL_ALGO_RING, 0},
    {K_ALLGATHER, 6, DL_F32, DL_SUM, 0, 0, DL_ALGO_AUTO, 0},
    {K_BROADCAST, 4, DL_BF16, DL_SUM, 0, 3, DL_ALGO_RING, 0},
    {K_BROADCAST, 5, DL_F32, DL_SUM, 1, 2, DL_ALGO_AUTO, 0},
    {K_REDUCE, 6, DL_F32, DL_AVG, 0, 2, DL_ALGO_RING, 0},
    {K_REDUCE, 3, DL_F64, DL_MAX, 1, 1, DL_ALGO_AUTO, 0},
    {K_ALLTOALL, 2, DL_F32, DL_SUM, 0, 0, DL_ALGO_RING, 0},
    {K_ALLTOALL, 3, DL_BF16, DL_SUM, 1, 0, DL_ALGO_AUTO, 0},
};
static const bigspec big_small[] = {
    {K_ALLREDUCE, 3, DL_F32, DL_SUM, 0, 0, DL_ALGO_RING, 1},
    {K_ALLREDUCE, 4, DL_BF16, DL_AVG, 1, 0, DL_ALGO_AUTO, 0},
    {K_REDUCE_SCATTER, 3, DL_F64, DL_SUM, 1, 0, DL_ALGO_RING, 0},
    {K_ALLGATHER, 3, DL_F32, DL_SUM, 0, 0, DL_ALGO_RING, 0},
    {K_BROADCAST, 3, DL_F32, DL_SUM, 0, 2, DL_ALGO_RING, 0},
    {K_REDUCE, 3, DL_F32, DL_MAX, 0, 1, DL_ALGO_RING, 0},
    {K_ALLTOALL, 2, DL_F32, DL_SUM, 1, 0, DL_ALGO_RING, 0},
};
#define NBIG_FULL ((int)(sizeof big_full / sizeof big_full[0]))
#define NBIG_SMALL ((int)(sizeof big_small / sizeof big_small[0]))

typedef struct one_arg {
    int kind;
    dl_dtype t;
    dl_redop op;
    size_t count;
    int inplace, root;
    uint64_t seed;
} one_arg;

static void build_one(batch *b, const void *argp)
{
    const one_arg *a = argp;
    batch_add(b, a->kind, a->t, a->op, a->count, a->inplace, a->root, DL_PURPOSE_GRADS, a->seed);
}

START_TEST(t_big)
{
    const bigspec *s = DL_TEST_SMALL ? &big_small[_i] : &big_full[_i];
    one_arg a = {s->kind,
                 s->t,
                 s->op,
                 DL_TEST_SMALL ? 100003 : BIG_COUNT,
                 s->inplace,
                 s->root,
                 0xB16B16ull + (uint64_t)_i};
    run_twice(s->n, s->algo, 0, 0, build_one, &a, s->rerun);
}
END_TEST

/* 16 ranks (oversubscribed 8x here) all-reduce 1 MiB of f32 correctly, ring and auto. */
START_TEST(t_16ranks_1mib)
{
    dl_algo algo = _i ? DL_ALGO_AUTO : DL_ALGO_RING;
    one_arg a = {K_ALLREDUCE, DL_F32, DL_SUM, (1u << 20) / 4, 0, 0, 0x16161616ull + (uint64_t)_i};
    run_twice(16, algo, 0, 0, build_one, &a, 1);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* bf16 conversion helpers of the library against the test's own                                */

START_TEST(t_bf16_convert)
{
    int bad = 0;
    uint32_t first_bad = 0;
    for (uint64_t i = 0; i < 2000000; i++) {
        uint32_t u = (uint32_t)tu_rand_u64(77, 0, i);
        if (i < 65536)
            u = ((uint32_t)i << 16) | 0x8000u; /* exact ties for every bf16 value */
        float f;
        memcpy(&f, &u, 4);
        uint16_t got = dl_f32_to_bf16(f), want = tu_f32_to_bf16(f);
        if (isnan(f)) {
            if (!isnan(dl_bf16_to_f32(got)))
                bad++;
        } else if (got != want) {
            if (!bad)
                first_bad = u;
            bad++;
        }
    }
    ck_assert_msg(bad == 0,
                  "dl_f32_to_bf16: %d mismatches with round-to-nearest-even, first input bits "
                  "0x%08x",
                  bad, first_bad);
    for (uint32_t b = 0; b < 65536; b++) {
        float f = dl_bf16_to_f32((uint16_t)b);
        uint32_t u;
        memcpy(&u, &f, 4);
        ck_assert_uint_eq(u, b << 16);
    }
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* barrier                                                                                      */

typedef struct barrier_arg {
    int rounds;
    atomic_int *arrived; /* [rounds] */
    atomic_int errors;   /* a rank left barrier k before everyone arrived */
    int status[NMAX];
} barrier_arg;

static int barrier_rank(dl_ctx *ctx, void *argp)
{
    barrier_arg *a = argp;
    int r = dl_ctx_rank(ctx), n = dl_ctx_size(ctx);
    for (int k = 0; k < a->rounds; k++) {
        /* a different rank is late in each round: it arrives once the others have (they count
         * themselves in just before their barrier; the first rounds give them 20 ms more to be
         * inside it, which the verdict does not depend on) */
        if (r == k % n) {
            while (atomic_load(&a->arrived[k]) < n - 1) sched_yield();
            if (k < 4)
                tu_sleep_ms(20);
        }
        atomic_fetch_add(&a->arrived[k], 1);
        int st = dl_barrier(dl_ctx_comm(ctx));
        if (st != DL_OK) {
            a->status[r] = st;
            return st;
        }
        if (atomic_load(&a->arrived[k]) != n)
            atomic_fetch_add(&a->errors, 1);
    }
    a->status[r] = DL_OK;
    return DL_OK;
}

START_TEST(t_barrier)
{
    int n = ns_at(_i);
    barrier_arg a;
    memset(&a, 0, sizeof a);
    a.rounds = DL_TEST_SMALL ? 10 : 40;
    a.arrived = calloc((size_t)a.rounds, sizeof *a.arrived);
    for (int k = 0; k < a.rounds; k++) atomic_init(&a.arrived[k], 0);
    atomic_init(&a.errors, 0);
    int st = tu_run_world(n, barrier_rank, &a);
    ck_assert_msg(st == DL_OK, "n=%d: %s: %s", n, dl_strstatus(st), dl_errmsg());
    ck_assert_msg(atomic_load(&a.errors) == 0,
                  "n=%d: %d rank-rounds left a barrier before all ranks arrived", n,
                  atomic_load(&a.errors));
    for (int k = 0; k < a.rounds; k++) ck_assert_int_eq(atomic_load(&a.arrived[k]), n);
    free(a.arrived);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* send / recv: every rank sends to r+1 and receives from r-1, sizes 1 element .. 1 MiB          */

static const size_t sr_counts[] = {1, 7, 10, 11, 1024, 1025, 65537, 262144};
#define NSR ((int)(sizeof sr_counts / sizeof sr_counts[0]))

typedef struct sr_arg {
    int n;
    unsigned char
        *got[NMAX][NSR]; /* received by rank r, message k (f32 for k even, bf16 odd, f64 k%3==0) */
    int status[NMAX];
    uint64_t sent_bytes[NMAX][NSR], recv_bytes[NMAX][NSR];
    uint64_t other_purpose[NMAX];
} sr_arg;

static dl_dtype sr_type(int k) { return k % 3 == 0 ? DL_F64 : k % 3 == 1 ? DL_F32 : DL_BF16; }
static uint64_t sr_seed(int k) { return 0x5E4D0000ull + (uint64_t)k; }

static int sr_rank(dl_ctx *ctx, void *argp)
{
    sr_arg *a = argp;
    dl_comm *c = dl_ctx_comm(ctx);
    int r = dl_ctx_rank(ctx), n = dl_ctx_size(ctx);
    int to = (r + 1) % n, from = (r - 1 + n) % n;
    for (int k = 0; k < NSR; k++) {
        dl_dtype t = sr_type(k);
        size_t cnt = sr_counts[k];
        void *buf = make_input(t, cnt, sr_seed(k), r, 0);
        if (!buf)
            return dl_error(DL_ENOMEM, "test: no memory");
        dl_comm_reset_stats(c);
        int st;
        /* even ranks send first, odd ranks receive first: no cycle of blocked senders */
        if (r % 2 == 0) {
            st = dl_send(c, buf, cnt, t, to, DL_PURPOSE_ACTIVATIONS);
            if (st == DL_OK)
                st = dl_recv(c, a->got[r][k], cnt, t, from, DL_PURPOSE_ACTIVATIONS);
        } else {
            st = dl_recv(c, a->got[r][k], cnt, t, from, DL_PURPOSE_ACTIVATIONS);
            if (st == DL_OK)
                st = dl_send(c, buf, cnt, t, to, DL_PURPOSE_ACTIVATIONS);
        }
        free(buf);
        dl_comm_stats s;
        dl_comm_get_stats(c, &s);
        a->sent_bytes[r][k] = s.bytes_sent[DL_PURPOSE_ACTIVATIONS];
        a->recv_bytes[r][k] = s.bytes_recv[DL_PURPOSE_ACTIVATIONS];
        for (int p = 0; p < DL_NPURPOSES; p++)
            if (p != DL_PURPOSE_ACTIVATIONS)
                a->other_purpose[r] += s.bytes_sent[p] + s.bytes_recv[p];
        if (st != DL_OK) {
            a->status[r] = st;
            return st;
        }
    }
    return DL_OK;
}

START_TEST(t_sendrecv)
{
    static const int nss[] = {2, 3, 5, 8};
    int n = nss[_i];
    sr_arg *a = calloc(1, sizeof *a);
    a->n = n;
    for (int r = 0; r < n; r++)
        for (int k = 0; k < NSR; k++) a->got[r][k] = tu_alloc(sr_counts[k] * tu_tsize(sr_type(k)));
    int st = tu_run_world(n, sr_rank, a);
    ck_assert_msg(st == DL_OK, "n=%d: %s: %s", n, dl_strstatus(st), dl_errmsg());
    for (int r = 0; r < n; r++) {
        int from = (r - 1 + n) % n;
        ck_assert_msg(a->other_purpose[r] == 0, "rank %d counted bytes under another purpose", r);
        for (int k = 0; k < NSR; k++) {
            dl_dtype t = sr_type(k);
            size_t bytes = sr_counts[k] * tu_tsize(t);
            void *want = make_input(t, sr_counts[k], sr_seed(k), from, 0);
            ck_assert_msg(memcmp(a->got[r][k], want, bytes) == 0,
                          "n=%d: rank %d message %d (%zu %s) from rank %d: wrong data", n, r, k,
                          sr_counts[k], tname(t), from);
            free(want);
            if (n > 1) {
                ck_assert_msg(a->sent_bytes[r][k] == bytes,
                              "rank %d message %d: %llu bytes sent counted, expected %zu", r, k,
                              (unsigned long long)a->sent_bytes[r][k], bytes);
                ck_assert_msg(a->recv_bytes[r][k] == bytes,
                              "rank %d message %d: %llu bytes received counted, expected %zu", r, k,
                              (unsigned long long)a->recv_bytes[r][k], bytes);
            }
        }
        for (int k = 0; k < NSR; k++) free(a->got[r][k]);
    }
    free(a);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* non-blocking                                                                                 */

#define NB_COUNT 100003
#define NB_SEED 0x1B10CCull

typedef struct nb_arg {
    int n;
    float *blocking[NMAX], *nonblocking[NMAX]; /* A: iallreduce + wait vs allreduce */
    float *multi_ar[NMAX], *multi_rs[NMAX], *multi_ag[NMAX], *multi_bc[NMAX]; /* B */
    int multi_done_early[NMAX][3]; /* B: dl_test after waiting the last one */
    float *polled[NMAX];           /* C */
    long polls[NMAX];
    int poll_done[NMAX];
    float *pend_nb[NMAX], *pend_b[NMAX]; /* D: blocking call while a request is pending */
    float *p2p_nb[NMAX], *p2p_tag[NMAX], *p2p_blk[NMAX]; /* E: point-to-point while pending */
    int status[NMAX];
    char where[NMAX][64];
} nb_arg;

#define NBCHK(expr, label)                                                                         \
    do {                                                                                           \
        int st_ = (expr);                                                                          \
        if (st_ != DL_OK) {                                                                        \
            a->status[r] = st_;                                                                    \
            snprintf(a->where[r], sizeof a->where[r], "%s", label);                                \
            return st_;                                                                            \
        }                                                                                          \
    } while (0)

static int nb_rank(dl_ctx *ctx, void *argp)
{
    nb_arg *a = argp;
    dl_comm *c = dl_ctx_comm(ctx);
    int r = dl_ctx_rank(ctx), n = dl_ctx_size(ctx);
    size_t off, len;
    dl_block(NB_COUNT, n, r, &off, &len);
    float *x = make_input(DL_F32, NB_COUNT, NB_SEED, r, 0);
    float *x2 = make_input(DL_F32, NB_COUNT, NB_SEED + 1, r, 0);
    float *x3 = make_input(DL_F32, NB_COUNT, NB_SEED + 2, r, 0);
    if (!x || !x2 || !x3)
        return dl_error(DL_ENOMEM, "test: no memory");

    /* A */
    dl_request *req = NULL;
    NBCHK(dl_iallreduce(c, x, a->nonblocking[r], NB_COUNT, DL_F32, DL_SUM, DL_PURPOSE_GRADS, &req),
          "A: iallreduce");
    NBCHK(dl_wait(req), "A: wait");
    NBCHK(dl_allreduce(c, x, a->blocking[r], NB_COUNT, DL_F32, DL_SUM, DL_PURPOSE_GRADS),
          "A: allreduce");

    /* B: four outstanding requests; wait for the last, the others must be complete */
    dl_request *q[4] = {NULL, NULL, NULL, NULL};
    NBCHK(dl_iallreduce(c, x, a->multi_ar[r], NB_COUNT, DL_F32, DL_MAX, DL_PURPOSE_GRADS, &q[0]),
          "B: iallreduce");
    NBCHK(dl_ireduce_scatter(c, x2, a->multi_rs[r], NB_COUNT, DL_F32, DL_SUM, DL_PURPOSE_GRADS,
                             &q[1]),
          "B: ireduce_scatter");
    NBCHK(dl_iallgather(c, x3 + off, a->multi_ag[r], NB_COUNT, DL_F32, DL_PURPOSE_PARAMS, &q[2]),
          "B: iallgather");
    /* the broadcast root sends its x; others pass x too (ignored) */
    NBCHK(dl_ibroadcast(c, x, a->multi_bc[r], NB_COUNT, DL_F32, n - 1, DL_PURPOSE_PARAMS, &q[3]),
          "B: ibroadcast");
    NBCHK(dl_wait(q[3]), "B: wait last");
    for (int k = 0; k < 3; k++) {
        int done = 0;
        NBCHK(dl_test(q[k], &done), "B: test");
        a->multi_done_early[r][k] = done;
    }
    for (int k = 0; k < 3; k++) NBCHK(dl_wait(q[k]), "B: wait");

    /* C: poll with dl_test until done */
    NBCHK(dl_iallreduce(c, x2, a->polled[r], NB_COUNT, DL_F32, DL_AVG, DL_PURPOSE_GRADS, &req),
          "C: iallreduce");
    double t0 = tu_now_s();
    int done = 0;
    while (!done && tu_now_s() - t0 < 60) { /* a bound on failure detection, not a speed */
        NBCHK(dl_test(req, &done), "C: test");
        a->polls[r]++;
        if (!done)
            sched_yield();
    }
    a->poll_done[r] = done;
    NBCHK(dl_wait(req), "C: wait");

    /* D: a blocking call made while a request is pending runs after it */
    NBCHK(dl_iallreduce(c, x3, a->pend_nb[r], NB_COUNT, DL_F32, DL_SUM, DL_PURPOSE_GRADS, &req),
          "D: iallreduce");
    NBCHK(dl_allreduce(c, x3, a->pend_b[r], NB_COUNT, DL_F32, DL_SUM, DL_PURPOSE_GRADS),
          "D: allreduce");
    NBCHK(dl_wait(req), "D: wait");
    NBCHK(dl_wait(NULL), "wait(NULL)");

    /* E: point-to-point while a request is pending queues behind it (a ring shift: a tagged
     * isend to r + 1 and a receive from r - 1, then blocking ones, even ranks sending first) */
    if (n > 1) {
        int to = (r + 1) % n, from = (r + n - 1) % n;
        dl_request *sreq = NULL;
        NBCHK(dl_iallreduce(c, x, a->p2p_nb[r], NB_COUNT, DL_F32, DL_SUM, DL_PURPOSE_GRADS, &req),
              "E: iallreduce");
        NBCHK(dl_isend(c, x2, NB_COUNT, DL_F32, to, 7, DL_PURPOSE_ACTIVATIONS, &sreq), "E: isend");
        NBCHK(dl_recv_tag(c, a->p2p_tag[r], NB_COUNT, DL_F32, from, 7, DL_PURPOSE_ACTIVATIONS),
              "E: recv_tag");
        NBCHK(dl_wait(sreq), "E: wait for the isend");
        NBCHK(dl_iallreduce(c, x, a->p2p_nb[r], NB_COUNT, DL_F32, DL_SUM, DL_PURPOSE_GRADS, &q[0]),
              "E: iallreduce 2");
        if (r % 2 == 0)
            NBCHK(dl_send(c, x3, NB_COUNT, DL_F32, to, DL_PURPOSE_ACTIVATIONS), "E: send");
        NBCHK(dl_recv(c, a->p2p_blk[r], NB_COUNT, DL_F32, from, DL_PURPOSE_ACTIVATIONS), "E: recv");
        if (r % 2 == 1)
            NBCHK(dl_send(c, x3, NB_COUNT, DL_F32, to, DL_PURPOSE_ACTIVATIONS), "E: send");
        NBCHK(dl_wait(req), "E: wait");
        NBCHK(dl_wait(q[0]), "E: wait 2");
    }

    free(x);
    free(x2);
    free(x3);
    a->status[r] = DL_OK;
    return DL_OK;
}

static void check_f32_reduced(errs *e, const char *what, dl_redop op, int n, const float *got,
                              uint64_t seed, size_t first, size_t len)
{
    long double *ref = malloc(NB_COUNT * sizeof *ref);
    double *S = malloc(NB_COUNT * sizeof *S);
    ck_assert(ref && S);
    ref_reduce(DL_F32, op, seed, n, NB_COUNT, ref, S);
    check_reduced(e, what, DL_F32, op, n, got, first, len, ref, S);
    free(ref);
    free(S);
}

START_TEST(t_nonblocking)
{
    static const int nss[] = {2, 3, 4, 1};
    int n = nss[_i];
    nb_arg *a = calloc(1, sizeof *a);
    a->n = n;
    float **bufs[] = {a->blocking, a->nonblocking, a->multi_ar, a->multi_rs,
                      a->multi_ag, a->multi_bc,    a->polled,   a->pend_nb,
                      a->pend_b,   a->p2p_nb,      a->p2p_tag,  a->p2p_blk};
    for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++)
        for (int r = 0; r < n; r++) {
            bufs[k][r] = tu_alloc(NB_COUNT * sizeof(float));
            memset(bufs[k][r], FILLB, NB_COUNT * sizeof(float));
        }
    int st = tu_run_world(n, nb_rank, a);
    int fr = 0;
    for (int r = 0; r < n; r++)
        if (a->status[r] != DL_OK)
            fr = r;
    ck_assert_msg(st == DL_OK, "n=%d: %s: %s (rank %d at %s)", n, dl_strstatus(st), dl_errmsg(), fr,
                  a->where[fr]);

    errs e = {0};
    for (int r = 0; r < n; r++) {
        char w[100];
        snprintf(w, sizeof w, "A: iallreduce+wait rank %d", r);
        check_f32_reduced(&e, w, DL_SUM, n, a->nonblocking[r], NB_SEED, 0, NB_COUNT);
        if (memcmp(a->nonblocking[r], a->blocking[r], NB_COUNT * sizeof(float)) != 0)
            efail(&e, "A: rank %d: iallreduce+wait differs bitwise from allreduce", r);
        snprintf(w, sizeof w, "B: iallreduce max rank %d", r);
        check_f32_reduced(&e, w, DL_MAX, n, a->multi_ar[r], NB_SEED, 0, NB_COUNT);
        size_t off, len;
        dl_block(NB_COUNT, n, r, &off, &len);
        snprintf(w, sizeof w, "B: ireduce_scatter rank %d", r);
        check_f32_reduced(&e, w, DL_SUM, n, a->multi_rs[r], NB_SEED + 1, off, len);
        for (int j = 0; j < n; j++) {
            size_t oj, lj;
            dl_block(NB_COUNT, n, j, &oj, &lj);
            float *want = make_input(DL_F32, lj, NB_SEED + 2, j, oj);
            if (memcmp(a->multi_ag[r] + oj, want, lj * sizeof(float)) != 0)
                efail(&e, "B: iallgather rank %d block %d wrong", r, j);
            free(want);
        }
        float *want = make_input(DL_F32, NB_COUNT, NB_SEED, n - 1, 0);
        if (memcmp(a->multi_bc[r], want, NB_COUNT * sizeof(float)) != 0)
            efail(&e, "B: ibroadcast rank %d wrong", r);
        free(want);
        for (int k = 0; k < 3; k++)
            if (!a->multi_done_early[r][k])
                efail(&e,
                      "B: rank %d: request %d not complete after request 3 completed (requests "
                      "must complete in the order started)",
                      r, k);
        snprintf(w, sizeof w, "C: polled iallreduce avg rank %d", r);
        if (!a->poll_done[r])
            efail(&e, "C: rank %d: dl_test never reported done (%ld polls)", r, a->polls[r]);
        check_f32_reduced(&e, w, DL_AVG, n, a->polled[r], NB_SEED + 1, 0, NB_COUNT);
        snprintf(w, sizeof w, "D: pending iallreduce rank %d", r);
        check_f32_reduced(&e, w, DL_SUM, n, a->pend_nb[r], NB_SEED + 2, 0, NB_COUNT);
        if (memcmp(a->pend_nb[r], a->pend_b[r], NB_COUNT * sizeof(float)) != 0)
            efail(&e, "D: rank %d: blocking allreduce after a pending one differs", r);
        if (memcmp(a->nonblocking[r], a->nonblocking[0], NB_COUNT * sizeof(float)) != 0)
            efail(&e, "A: rank %d's result differs bitwise from rank 0's", r);
        if (n > 1) {
            if (memcmp(a->p2p_nb[r], a->nonblocking[r], NB_COUNT * sizeof(float)) != 0)
                efail(&e, "E: rank %d: iallreduce around point-to-point differs", r);
            float *w1 = make_input(DL_F32, NB_COUNT, NB_SEED + 1, (r + n - 1) % n, 0);
            float *w2 = make_input(DL_F32, NB_COUNT, NB_SEED + 2, (r + n - 1) % n, 0);
            if (memcmp(a->p2p_tag[r], w1, NB_COUNT * sizeof(float)) != 0)
                efail(&e, "E: rank %d: isend / recv_tag behind a pending request wrong", r);
            if (memcmp(a->p2p_blk[r], w2, NB_COUNT * sizeof(float)) != 0)
                efail(&e, "E: rank %d: send / recv behind a pending request wrong", r);
            free(w1);
            free(w2);
        }
    }
    for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++)
        for (int r = 0; r < n; r++) free(bufs[k][r]);
    free(a);
    ASSERT_NO_ERRS(e);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* abort: one rank fails while the others are in (or about to start) all-reduces               */

#define ABORT_N 4
#define ABORT_RANK 2
#define ABORT_ITERS 2000

typedef struct abort_arg {
    int fail_after; /* the failing rank does this many all-reduces first */
    dl_algo algo;
    int first_bad[NMAX];
    int bad_status[NMAX];
} abort_arg;

static int abort_rank(dl_ctx *ctx, void *argp)
{
    abort_arg *a = argp;
    dl_comm *c = dl_ctx_comm(ctx);
    int r = dl_ctx_rank(ctx);
    dl_comm_set_algo(c, a->algo);
    size_t count = 100003;
    float *x = make_input(DL_F32, count, 5, r, 0);
    float *y = tu_alloc(count * sizeof(float));
    a->first_bad[r] = -1;
    if (!x || !y)
        return dl_error(DL_ENOMEM, "test: no memory");
    for (int k = 0; k < ABORT_ITERS; k++) {
        if (r == ABORT_RANK && k == a->fail_after) {
            free(x);
            free(y);
            return dl_error(DL_EUSER, "deliberate failure after %d all-reduces", a->fail_after);
        }
        int st = dl_allreduce(c, x, y, count, DL_F32, DL_SUM, DL_PURPOSE_GRADS);
        if (st != DL_OK) {
            a->first_bad[r] = k;
            a->bad_status[r] = st;
            free(x);
            free(y);
            return st;
        }
    }
    free(x);
    free(y);
    return DL_OK;
}

/* The failing rank's peers free their buffers as soon as their all-reduce returns DL_EABORT (the
 * caller owns its buffers once a call returns); each variant runs 3 worlds, so that a library
 * still reading a returned rank's buffer (rendezvous) shows up as a crash. */
START_TEST(t_abort)
{
    static const int after[] = {0, 3, 0, 3};
    for (int rep = 0; rep < 3; rep++) {
        abort_arg a;
        memset(&a, 0, sizeof a);
        a.fail_after = after[_i];
        a.algo = _i < 2 ? DL_ALGO_RING : DL_ALGO_AUTO;
        dl_world_opts o;
        tu_world_opts(&o, ABORT_N);
        o.timeout_s = 60;
        o.quiet = 1;
        FILE *logf = tmpfile();
        o.log = logf;
        dl_world *w = NULL;
        double t0 = tu_now_s();
        int st = dl_world_run_keep(&o, abort_rank, &a, &w);
        double dt = tu_now_s() - t0;
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", dl_errmsg());
        int erank = w ? dl_world_error_rank(w) : -2;
        if (w)
            dl_world_destroy(w);
        if (logf)
            fclose(logf);
        ck_assert_msg(st == DL_EUSER,
                      "world returned %s (%s), expected the failing rank's DL_EUSER",
                      dl_strstatus(st), msg);
        ck_assert_msg(strstr(msg, "deliberate failure") != NULL,
                      "errmsg lacks the rank's message: \"%s\"", msg);
        ck_assert_msg(strcasestr(msg, "rank") != NULL && tu_has_int_token(msg, ABORT_RANK),
                      "errmsg does not name rank %d: \"%s\"", ABORT_RANK, msg);
        ck_assert_msg(erank == ABORT_RANK, "dl_world_error_rank = %d, expected %d", erank,
                      ABORT_RANK);
        for (int r = 0; r < ABORT_N; r++) {
            if (r == ABORT_RANK)
                continue;
            /* rank 2 finished all-reduce k-1 only after everyone entered it, so every other rank
             * fails in k-1 (it may see the abort before its last message arrives) or in k (it
             * cannot complete without rank 2) */
            ck_assert_msg(a.first_bad[r] == a.fail_after ||
                              (a.fail_after > 0 && a.first_bad[r] == a.fail_after - 1),
                          "rank %d: first failing all-reduce %d, expected %d (no all-reduce can "
                          "complete without rank %d)",
                          r, a.first_bad[r], a.fail_after, ABORT_RANK);
            ck_assert_msg(a.bad_status[r] == DL_EABORT, "rank %d returned %s, expected DL_EABORT",
                          r, dl_strstatus(a.bad_status[r]));
        }
        /* an upper bound on failure detection: the others leave their waits at the abort's
         * wake-up or at worst their 20 ms long sleep, 500x below this bound; a world that
         * waited for its 60 s watchdog instead fails it */
        ck_assert_msg(dt < 10.0,
                      "abort took %.1f s (watchdog 60 s): the others must leave their waits at "
                      "once",
                      dt);
    }
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* watchdog: one rank never joins                                                               */

#define WD_N 5
#define WD_STUCK 3

typedef struct wd_arg {
    int before; /* all-reduces everyone completes first */
    int saw_abort;
    int status[NMAX];
} wd_arg;

static int wd_rank(dl_ctx *ctx, void *argp)
{
    wd_arg *a = argp;
    dl_comm *c = dl_ctx_comm(ctx);
    int r = dl_ctx_rank(ctx);
    float x[64], y[64];
    for (int i = 0; i < 64; i++) x[i] = (float)r;
    for (int k = 0; k < a->before; k++) {
        int st = dl_allreduce(c, x, y, 64, DL_F32, DL_SUM, DL_PURPOSE_OTHER);
        if (st != DL_OK) {
            a->status[r] = st;
            return st;
        }
    }
    if (r == WD_STUCK) {
        /* alive, but never joins the next all-reduce */
        double t0 = tu_now_s();
        while (!dl_ctx_aborted(ctx) && tu_now_s() - t0 < 10) tu_sleep_ms(5);
        a->saw_abort = dl_ctx_aborted(ctx);
        a->status[r] = DL_OK;
        return DL_OK;
    }
    int st = dl_allreduce(c, x, y, 64, DL_F32, DL_SUM, DL_PURPOSE_OTHER);
    a->status[r] = st;
    return st;
}

START_TEST(t_watchdog)
{
    wd_arg a;
    memset(&a, 0, sizeof a);
    a.before = _i ? 2 : 0;
    dl_world_opts o;
    tu_world_opts(&o, WD_N);
    o.timeout_s = 1;
    o.quiet = 1;
    FILE *logf = tmpfile();
    o.log = logf;
    double t0 = tu_now_s();
    int st = dl_world_run(&o, wd_rank, &a);
    double dt = tu_now_s() - t0;
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", dl_errmsg());
    if (logf)
        fclose(logf);
    ck_assert_msg(st == DL_ETIMEOUT, "world returned %s (%s), expected DL_ETIMEOUT",
                  dl_strstatus(st), msg);
    ck_assert_msg(strstr(msg, "allreduce") != NULL,
                  "errmsg does not name the stuck operation: \"%s\"", msg);
    ck_assert_msg(strstr(msg, "never arrived") != NULL,
                  "errmsg does not say who never arrived: \"%s\"", msg);
    ck_assert_msg(tu_has_int_token(msg, WD_STUCK), "errmsg does not name rank %d: \"%s\"", WD_STUCK,
                  msg);
    ck_assert_msg(a.saw_abort, "the stuck rank never saw dl_ctx_aborted()");
    for (int r = 0; r < WD_N; r++)
        if (r != WD_STUCK)
            ck_assert_msg(a.status[r] == DL_ETIMEOUT || a.status[r] == DL_EABORT,
                          "rank %d: all-reduce returned %s, expected DL_ETIMEOUT or DL_EABORT", r,
                          dl_strstatus(a.status[r]));
    /* an upper bound on failure detection, 10x the watchdog's configured 1 s */
    ck_assert_msg(dt < 10.0, "watchdog (1 s) took %.1f s", dt);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* bad input                                                                                    */

static atomic_int calls;
static int count_rank(dl_ctx *ctx, void *arg)
{
    (void)ctx;
    (void)arg;
    atomic_fetch_add(&calls, 1);
    return DL_OK;
}

START_TEST(t_bad_nranks)
{
    static const int bad[] = {0, -1, -100};
    for (int i = 0; i < 3; i++) {
        atomic_store(&calls, 0);
        dl_world_opts o;
        tu_world_opts(&o, bad[i]);
        o.quiet = 1;
        int st = dl_world_run(&o, count_rank, NULL);
        ck_assert_msg(st == DL_EINVAL, "nranks %d: %s, expected DL_EINVAL", bad[i],
                      dl_strstatus(st));
        ck_assert_msg(strlen(dl_errmsg()) > 0, "nranks %d: no error message", bad[i]);
        ck_assert_int_eq(atomic_load(&calls), 0);
    }
}
END_TEST

enum {
    B_AR_NULL_SEND,
    B_AR_NULL_RECV,
    B_RS_NULL_SEND,
    B_RS_NULL_RECV,
    B_AG_NULL_SEND,
    B_AG_NULL_RECV,
    B_BC_NULL_RECV,
    B_RD_NULL_SEND,
    B_RD_ROOT_NULL_RECV,
    B_A2A_NULL_SEND,
    B_A2A_NULL_RECV,
    B_AR_DTYPE,
    B_AR_OP,
    B_AR_NDTYPES,
    B_RS_OP,
    B_AG_DTYPE,
    B_BC_DTYPE,
    B_RD_OP,
    B_A2A_DTYPE,
    B_BC_ROOT_HIGH,
    B_BC_ROOT_NEG,
    B_RD_ROOT_HIGH,
    B_RD_ROOT_NEG,
    B_AR_PURPOSE,
    B_IAR_NULL,
    B_SEND_NULL,
    B_RECV_NULL,
    B_SEND_PEER,
    B_RECV_PEER,
    B_NCHECKS
};
static const char *bad_name[B_NCHECKS] = {"allreduce NULL sendbuf",
                                          "allreduce NULL recvbuf",
                                          "reduce_scatter NULL sendbuf",
                                          "reduce_scatter NULL recvbuf",
                                          "allgather NULL sendbuf",
                                          "allgather NULL recvbuf",
                                          "broadcast NULL recvbuf",
                                          "reduce NULL sendbuf",
                                          "reduce NULL recvbuf at the root",
                                          "alltoall NULL sendbuf",
                                          "alltoall NULL recvbuf",
                                          "allreduce dtype 99",
                                          "allreduce op 99",
                                          "allreduce dtype DL_NDTYPES",
                                          "reduce_scatter op DL_NREDOPS",
                                          "allgather dtype 99",
                                          "broadcast dtype 99",
                                          "reduce op 99",
                                          "alltoall dtype 99",
                                          "broadcast root n",
                                          "broadcast root -1",
                                          "reduce root n",
                                          "reduce root -7",
                                          "allreduce purpose 99",
                                          "iallreduce NULL sendbuf",
                                          "send NULL buffer",
                                          "recv NULL buffer",
                                          "send to peer n",
                                          "recv from peer -1"};

typedef struct bad_arg {
    int st[NMAX][B_NCHECKS];
    int after_status[NMAX];
    float after[NMAX][8];
} bad_arg;

static int bad_rank(dl_ctx *ctx, void *argp)
{
    bad_arg *a = argp;
    dl_comm *c = dl_ctx_comm(ctx);
    int r = dl_ctx_rank(ctx), n = dl_ctx_size(ctx);
    float x[64], y[64];
    for (int i = 0; i < 64; i++) x[i] = (float)(r + 1);
    const size_t cnt = 6;
    int *s = a->st[r];
    s[B_AR_NULL_SEND] = dl_allreduce(c, NULL, y, cnt, DL_F32, DL_SUM, DL_PURPOSE_GRADS);
    s[B_AR_NULL_RECV] = dl_allreduce(c, x, NULL, cnt, DL_F32, DL_SUM, DL_PURPOSE_GRADS);
    s[B_RS_NULL_SEND] = dl_reduce_scatter(c, NULL, y, cnt, DL_F32, DL_SUM, DL_PURPOSE_GRADS);
    s[B_RS_NULL_RECV] = dl_reduce_scatter(c, x, NULL, cnt, DL_F32, DL_SUM, DL_PURPOSE_GRADS);
    s[B_AG_NULL_SEND] = dl_allgather(c, NULL, y, cnt, DL_F32, DL_PURPOSE_GRADS);
    s[B_AG_NULL_RECV] = dl_allgather(c, x, NULL, cnt, DL_F32, DL_PURPOSE_GRADS);
    s[B_BC_NULL_RECV] = dl_broadcast(c, x, NULL, cnt, DL_F32, 0, DL_PURPOSE_GRADS);
    s[B_RD_NULL_SEND] = dl_reduce(c, NULL, y, cnt, DL_F32, DL_SUM, 0, DL_PURPOSE_GRADS);
    /* recvbuf may be NULL off the root only. With n > 1 the other ranks would legitimately
     * wait for the failed root, so this check runs on one rank only. */
    s[B_RD_ROOT_NULL_RECV] =
        n == 1 ? dl_reduce(c, x, NULL, cnt, DL_F32, DL_SUM, 0, DL_PURPOSE_GRADS) : DL_EINVAL;
    s[B_A2A_NULL_SEND] = dl_alltoall(c, NULL, y, 2, DL_F32, DL_PURPOSE_GRADS);
    s[B_A2A_NULL_RECV] = dl_alltoall(c, x, NULL, 2, DL_F32, DL_PURPOSE_GRADS);
    s[B_AR_DTYPE] = dl_allreduce(c, x, y, cnt, (dl_dtype)99, DL_SUM, DL_PURPOSE_GRADS);
    s[B_AR_OP] = dl_allreduce(c, x, y, cnt, DL_F32, (dl_redop)99, DL_PURPOSE_GRADS);
    s[B_AR_NDTYPES] = dl_allreduce(c, x, y, cnt, DL_NDTYPES, DL_SUM, DL_PURPOSE_GRADS);
    s[B_RS_OP] = dl_reduce_scatter(c, x, y, cnt, DL_F32, DL_NREDOPS, DL_PURPOSE_GRADS);
    s[B_AG_DTYPE] = dl_allgather(c, x, y, cnt, (dl_dtype)99, DL_PURPOSE_GRADS);
    s[B_BC_DTYPE] = dl_broadcast(c, x, y, cnt, (dl_dtype)99, 0, DL_PURPOSE_GRADS);
    s[B_RD_OP] = dl_reduce(c, x, y, cnt, DL_F32, (dl_redop)99, 0, DL_PURPOSE_GRADS);
    s[B_A2A_DTYPE] = dl_alltoall(c, x, y, 2, (dl_dtype)99, DL_PURPOSE_GRADS);
    s[B_BC_ROOT_HIGH] = dl_broadcast(c, x, y, cnt, DL_F32, n, DL_PURPOSE_GRADS);
    s[B_BC_ROOT_NEG] = dl_broadcast(c, x, y, cnt, DL_F32, -1, DL_PURPOSE_GRADS);
    s[B_RD_ROOT_HIGH] = dl_reduce(c, x, y, cnt, DL_F32, DL_SUM, n, DL_PURPOSE_GRADS);
    s[B_RD_ROOT_NEG] = dl_reduce(c, x, y, cnt, DL_F32, DL_SUM, -7, DL_PURPOSE_GRADS);
    s[B_AR_PURPOSE] = dl_allreduce(c, x, y, cnt, DL_F32, DL_SUM, (dl_purpose)99);
    {
        dl_request *req = NULL;
        int st = dl_iallreduce(c, NULL, y, cnt, DL_F32, DL_SUM, DL_PURPOSE_GRADS, &req);
        if (st == DL_OK)
            st = dl_wait(req); /* the error may come with the completion */
        s[B_IAR_NULL] = st;
    }
    s[B_SEND_NULL] = dl_send(c, NULL, 3, DL_F32, (r + 1) % n, DL_PURPOSE_OTHER);
    s[B_RECV_NULL] = dl_recv(c, NULL, 3, DL_F32, (r + n - 1) % n, DL_PURPOSE_OTHER);
    s[B_SEND_PEER] = dl_send(c, x, 3, DL_F32, n, DL_PURPOSE_OTHER);
    s[B_RECV_PEER] = dl_recv(c, y, 3, DL_F32, -1, DL_PURPOSE_OTHER);
    /* the communicator is still usable */
    a->after_status[r] = dl_allreduce(c, x, a->after[r], 8, DL_F32, DL_SUM, DL_PURPOSE_GRADS);
    return DL_OK;
}

START_TEST(t_bad_args)
{
    static const int nss[] = {3, 1};
    int n = nss[_i];
    bad_arg *a = calloc(1, sizeof *a);
    dl_world_opts o;
    tu_world_opts(&o, n);
    o.timeout_s = 30; /* a rejected call that hung would end as DL_ETIMEOUT, not DL_OK */
    int st = dl_world_run(&o, bad_rank, a);
    ck_assert_msg(st == DL_OK, "n=%d: %s: %s", n, dl_strstatus(st), dl_errmsg());
    errs e = {0};
    for (int r = 0; r < n; r++)
        for (int k = 0; k < B_NCHECKS; k++)
            if (a->st[r][k] != DL_EINVAL)
                efail(&e, "n=%d rank %d: %s returned %s, expected DL_EINVAL", n, r, bad_name[k],
                      dl_strstatus(a->st[r][k]));
    for (int r = 0; r < n; r++) {
        if (a->after_status[r] != DL_OK)
            efail(&e, "rank %d: a valid allreduce after the rejected calls returned %s", r,
                  dl_strstatus(a->after_status[r]));
        else
            for (int i = 0; i < 8; i++)
                if (a->after[r][i] != (float)(n * (n + 1) / 2))
                    efail(&e,
                          "rank %d: allreduce after the rejected calls: element %d = %g, want %d",
                          r, i, a->after[r][i], n * (n + 1) / 2);
    }
    free(a);
    ASSERT_NO_ERRS(e);
}
END_TEST

/* Mismatched arguments across ranks: an error (not a hang, not a silent success). */
typedef struct mm_arg {
    int variant;
    int status[NMAX];
} mm_arg;

static const struct {
    int n;
    dl_algo algo;
    int what; /* 0: counts 10 vs 20; 1: f32 vs f64 */
} mm_cases[] = {
    {4, DL_ALGO_RING, 0}, {4, DL_ALGO_AUTO, 0}, {2, DL_ALGO_AUTO, 0},
    {3, DL_ALGO_RING, 1}, {8, DL_ALGO_RING, 0},
};

static int mm_rank(dl_ctx *ctx, void *argp)
{
    mm_arg *a = argp;
    dl_comm *c = dl_ctx_comm(ctx);
    int r = dl_ctx_rank(ctx);
    dl_comm_set_algo(c, mm_cases[a->variant].algo);
    double x[40], y[40];
    for (int i = 0; i < 40; i++) x[i] = r + i;
    size_t count = 20;
    dl_dtype t = DL_F32;
    if (mm_cases[a->variant].what == 0 && r == 0)
        count = 10;
    if (mm_cases[a->variant].what == 1 && r == 0)
        t = DL_F64;
    int st = dl_allreduce(c, x, y, count, t, DL_SUM, DL_PURPOSE_GRADS);
    a->status[r] = st;
    return st;
}

START_TEST(t_mismatch)
{
    mm_arg a;
    memset(&a, 0, sizeof a);
    a.variant = _i;
    dl_world_opts o;
    tu_world_opts(&o, mm_cases[_i].n);
    o.timeout_s = 20;
    o.quiet = 1;
    FILE *logf = tmpfile();
    o.log = logf;
    int st = dl_world_run(&o, mm_rank, &a); /* a hang: the watchdog's DL_ETIMEOUT */
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", dl_errmsg());
    if (logf)
        fclose(logf);
    ck_assert_msg(st == DL_EMISMATCH || st == DL_EABORT,
                  "n=%d algo=%s %s mismatch: world returned %s (%s), expected DL_EMISMATCH or "
                  "DL_EABORT",
                  mm_cases[_i].n, aname(mm_cases[_i].algo), mm_cases[_i].what ? "dtype" : "count",
                  dl_strstatus(st), msg);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */

static Suite *coll_suite(void)
{
    Suite *s = suite_create("coll");
    int nn = ns_count();

    TCase *tc = tcase_create("matrix");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, t_allreduce, 0, 2 * nn);
    tcase_add_loop_test(tc, t_reduce_scatter, 0, 2 * nn);
    tcase_add_loop_test(tc, t_allgather, 0, 2 * nn);
    tcase_add_loop_test(tc, t_broadcast, 0, 2 * nn);
    tcase_add_loop_test(tc, t_reduce, 0, 2 * nn);
    tcase_add_loop_test(tc, t_alltoall, 0, 2 * nn);
    tcase_add_loop_test(tc, t_barrier, 0, nn);
    tcase_add_loop_test(tc, t_sendrecv, 0, DL_TEST_SMALL ? 2 : 4);
    tcase_add_test(tc, t_bf16_convert);
    suite_add_tcase(s, tc);

    tc = tcase_create("large");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, t_big, 0, DL_TEST_SMALL ? NBIG_SMALL : NBIG_FULL);
    tcase_add_loop_test(tc, t_16ranks_1mib, 0, DL_TEST_SMALL ? 1 : 2);
    suite_add_tcase(s, tc);

    tc = tcase_create("nonblocking");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, t_nonblocking, 0, DL_TEST_SMALL ? 2 : 4);
    suite_add_tcase(s, tc);

    tc = tcase_create("failure");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, t_abort, 0, DL_TEST_SMALL ? 2 : 4);
    tcase_add_loop_test(tc, t_watchdog, 0, DL_TEST_SMALL ? 1 : 2);
    tcase_add_test(tc, t_bad_nranks);
    tcase_add_loop_test(tc, t_bad_args, 0, 2);
    tcase_add_loop_test(tc, t_mismatch, 0,
                        DL_TEST_SMALL ? 2 : (int)(sizeof mm_cases / sizeof mm_cases[0]));
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(coll_suite());
    srunner_run_all(sr, CK_ENV);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
