/* Token-level pipelining's attention (model/ops_attn_kv.h, f64): a sequence cut into slices,
 * each slice's attention reading the keys and values its earlier slices left in a cache, and the
 * backward run in reverse slice order accumulating the cached keys' and values' gradients,
 * equals the attention of the whole sequence (dl_attention_fwd / _bwd_write) for several splits,
 * equal and unequal, with one-token slices and slices across the kernels' row blocks; the
 * accumulated key/value gradient of an early slice agrees with finite differences of a loss
 * taken over later slices only; a slice that skips the cache fails the comparison (negative
 * control). At the sublayer: the attention sublayer run slice by slice with a cache (whole
 * backward, and input then weight parts) equals the whole sequence's, output, input gradient and
 * every parameter gradient, at tp 1 and 2; the cache allocated from the arena is accounted as
 * its own category. */
#include "../testutil.h"
#include <check.h>
#include <math.h>
#include "core/arena.h"
#include "model/ops.h"
#include "model/ops_attn_kv.h"
#include "model/sublayer.h"

/* two sequences of 45 positions (a slice may span the kernels' 32-row blocks), 2 heads of 4 */
enum { B = 2, T = 45, NH = 2, HS = 4, C = NH * HS };

/* The whole-sequence and the sliced attention compute the same sums in other orders (the row
 * blocks of the GEMMs differ): each output element is a sum of at most T = 45 products of O(1)
 * factors (|q|, |k|, |v| < 1, probabilities in [0, 1], |dout| < 1), so each differs by at most
 * about T·eps·Σ|terms| ≈ 45 · 2.2e-16 · 45 ≈ 5e-13 in the forward, and the backward's chains
 * (dP, dS, their products with K, Q, P, dO) a few times that. 1e-11 leaves a margin of ten while
 * a missing or doubled term (a key left out, a slice's gradient not accumulated) is O(1e-2). */
#define TOL 1e-11

static const int splits[][8] = {
    {45},             /* one slice: the cache with ctx 0 */
    {15, 15, 15},     /* equal */
    {1, 44},          /* a slice of one token first */
    {44, 1},          /* ... and last */
    {7, 1, 30, 7},    /* unequal, one across a block boundary */
    {33, 12},         /* the first slice spans two row blocks */
    {5, 5, 5, 5, 25}, /* many */
};
#define NSPLITS ((int)(sizeof splits / sizeof splits[0]))

static int nslices(const int *s)
{
    int n = 0;
    while (n < 8 && s[n]) n++;
    return n;
}

typedef struct {
    double qkv[B * T * 3 * C], dout[B * T * C];   /* inputs: packed Q/K/V and dL/d(out) */
    double out[B * T * C], dqkv[B * T * 3 * C];   /* results, in whole-sequence layout */
    double kv[B * T * 2 * C], dkv[B * T * 2 * C]; /* the cache and its gradient */
} bufs;

static void inputs(bufs *b)
{
    tu_fill_f64(b->qkv, (size_t)B * T * 3 * C, 11, 0, 0);
    tu_fill_f64(b->dout, (size_t)B * T * C, 12, 0, 0);
}

/* rows [t0, t0 + L) of every sequence of a (B, T, w) buffer to or from a (B, L, w) slice */
static void rows_copy(double *dst, const double *src, int t0, int L, int w, int to_slice)
{
    for (int b = 0; b < B; b++)
        for (int i = 0; i < L; i++) {
            size_t whole = ((size_t)b * T + t0 + i) * w, part = ((size_t)b * L + i) * w;
            if (to_slice)
                memcpy(dst + part, src + whole, sizeof(double) * w);
            else
                memcpy(dst + whole, src + part, sizeof(double) * w);
        }
}

/* The reference: the whole sequence at once. */
static void whole(bufs *b)
{
    double *att = malloc(sizeof(double) * B * NH * T * T), *scr = malloc(sizeof(double) * T * T);
    dl_attention_fwd_f64(b->out, C, att, b->qkv, b->qkv + C, b->qkv + 2 * C, 3 * C, B, T, NH, HS);
    dl_attention_bwd_write_f64(b->dqkv, b->dqkv + C, b->dqkv + 2 * C, scr, b->dout, C, b->qkv,
                               b->qkv + C, b->qkv + 2 * C, 3 * C, att, B, T, NH, HS);
    free(att), free(scr);
}

/* Slice by slice: forwards in order, backwards in reverse. skip_cache: every slice attends to
 * its own keys alone (the negative control). Each slice has its own buffers, as a pipeline's
 * activation slots would. */
static void sliced(bufs *b, const int *split, int skip_cache)
{
    int n = nslices(split), ctx[8];
    double *qkv[8], *att[8], *out[8];
    for (int s = 0, c0 = 0; s < n; c0 += split[s], s++) {
        int L = split[s];
        ctx[s] = c0;
        qkv[s] = malloc(sizeof(double) * B * L * 3 * C);
        att[s] = malloc(sizeof(double) * B * NH * L * (c0 + L));
        out[s] = malloc(sizeof(double) * B * L * C);
        rows_copy(qkv[s], b->qkv, c0, L, 3 * C, 1);
        dl_kv_store_f64(b->kv, qkv[s], T, c0, B, L, C);
        int c = skip_cache ? 0 : c0; /* skipping: a cache view that starts at the slice */
        const double *k = b->kv + (size_t)(c0 - c) * 2 * C;
        dl_attention_kv_fwd_f64(out[s], C, att[s], qkv[s], 3 * C, k, k + C, 2 * C, T, c, B, L, NH,
                                HS);
        rows_copy(b->out, out[s], c0, L, C, 0);
    }
    double *scr = malloc(sizeof(double) * T * T);
    for (int s = n - 1; s >= 0; s--) {
        int L = split[s], c = skip_cache ? 0 : ctx[s];
        double *dout = malloc(sizeof(double) * B * L * C),
               *dq = malloc(sizeof(double) * B * L * 3 * C);
        const double *k = b->kv + (size_t)(ctx[s] - c) * 2 * C;
        double *dk = b->dkv + (size_t)(ctx[s] - c) * 2 * C;
        rows_copy(dout, b->dout, ctx[s], L, C, 1);
        double beta = s == n - 1 || skip_cache ? 0 : 1; /* the last slice writes */
        dl_attention_kv_bwd_f64(dq, 3 * C, dk, dk + C, beta, scr, dout, C, qkv[s], k, k + C, 2 * C,
                                T, c, att[s], B, L, NH, HS);
        dl_kv_load_grad_f64(dq, b->dkv, T, ctx[s], B, L, C);
        rows_copy(b->dqkv, dq, ctx[s], L, 3 * C, 0);
        free(dout), free(dq);
    }
    for (int s = 0; s < n; s++) free(qkv[s]), free(att[s]), free(out[s]);
    free(scr);
}

static double max_diff(const double *a, const double *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(a[i] - b[i]));
    return m;
}

START_TEST(splits_equal_whole)
{
    bufs *ref = calloc(1, sizeof *ref), *got = calloc(1, sizeof *got);
    inputs(ref), inputs(got);
    whole(ref);
    for (int i = 0; i < NSPLITS; i++) {
        sliced(got, splits[i], 0);
        double eo = max_diff(ref->out, got->out, (size_t)B * T * C);
        double eg = max_diff(ref->dqkv, got->dqkv, (size_t)B * T * 3 * C);
        ck_assert_msg(eo <= TOL && eg <= TOL, "split %d: output off by %.3g, gradient by %.3g", i,
                      eo, eg);
    }
    free(ref), free(got);
}
END_TEST

/* Negative control: slices that attend to their own keys only differ from the whole sequence
 * (by O(0.1) here), so the comparison above can fail. */
START_TEST(skipping_the_cache_fails)
{
    bufs *ref = calloc(1, sizeof *ref), *got = calloc(1, sizeof *got);
    inputs(ref), inputs(got);
    whole(ref);
    sliced(got, splits[1], 1);
    ck_assert_double_gt(max_diff(ref->out, got->out, (size_t)B * T * C), 1000 * TOL);
    ck_assert_double_gt(max_diff(ref->dqkv, got->dqkv, (size_t)B * T * 3 * C), 1000 * TOL);
    free(ref), free(got);
}
END_TEST

/* L = Σ dout · out over the slices from `first` on, the earlier slices run for their cache */
static double later_loss(bufs *b, const int *split, int first)
{
    sliced(b, split, 0);
    double L = 0;
    for (int s = 0, c0 = 0; split[s] && s < 8; c0 += split[s], s++)
        for (int bb = 0; bb < B && s >= first; bb++)
            for (size_t i = 0; i < (size_t)split[s] * C; i++) {
                size_t at = ((size_t)bb * T + c0) * C + i;
                L += b->dout[at] * b->out[at];
            }
    return L;
}

/* The accumulated gradient of slice 0's keys and values, from later slices alone (their dout;
 * slice 0's own dout zero), against central differences. Truncation h²/6·|L'''| < 1e-11 at
 * h = 1e-5 (third derivatives O(1)); rounding ≈ eps·Σ|dout·out|/h ≈ 2.2e-16·400/1e-5 ≈ 1e-8, so
 * |fd − g| ≤ 1e-7 + 1e-6·|g| holds with margin while a lost slice's contribution is O(|g|). */
START_TEST(kv_grad_accumulates)
{
    static const int split[] = {6, 10, 29, 0};
    bufs *b = calloc(1, sizeof *b);
    inputs(b);
    for (int bb = 0; bb < B; bb++) /* slice 0 contributes no loss of its own */
        memset(b->dout + (size_t)bb * T * C, 0, sizeof(double) * 6 * C);
    sliced(b, split, 0);
    double *g = malloc(sizeof b->dqkv);
    memcpy(g, b->dqkv, sizeof b->dqkv);
    double worst = 0, gmax = 0;
    for (int t = 0; t < 24; t++) {
        int bb = t % B, pos = (t / 2) % 6, ch = C + (int)(tu_splitmix64((uint64_t)t) % (2 * C));
        size_t i = ((size_t)bb * T + pos) * 3 * C + (size_t)ch; /* a key or a value of slice 0 */
        double h = 1e-5, save = b->qkv[i];
        b->qkv[i] = save + h;
        double lp = later_loss(b, split, 1);
        b->qkv[i] = save - h;
        double lm = later_loss(b, split, 1);
        b->qkv[i] = save;
        double fd = (lp - lm) / (2 * h);
        worst = fmax(worst, fabs(fd - g[i]) / (1e-7 + 1e-6 * fabs(g[i])));
        gmax = fmax(gmax, fabs(g[i]));
    }
    ck_assert_msg(worst <= 1, "key/value gradient: %.3g of the tolerance", worst);
    ck_assert_double_gt(gmax, 1e-3); /* the later slices' gradient is there to check */
    free(g), free(b);
}
END_TEST

/* ---- the attention sublayer with a cache ------------------------------------------------- */

typedef struct {
    int tp, input_weight; /* backward as input then weight parts */
    double err_y, err_dx, err_dw;
} sub_run;

static double *vals(size_t n, uint64_t seed, int rank, double scale)
{
    double *p = malloc(sizeof(double) * (n ? n : 1));
    tu_fill_f64(p, n, seed, rank, 0);
    for (size_t i = 0; i < n; i++) p[i] *= scale;
    return p;
}

typedef struct {
    const dl_sublayer_kind *k;
    int np, tp;
    size_t pn[8];
    double *w[8], *dw[8];
} sub_params;

static void sub_params_init(sub_params *p, int tp, int rank)
{
    dl_gpt_config cfg = {.vocab = 64, .seq = T, .layers = 1, .d_model = C, .heads = NH};
    p->k = dl__sublayer_kinds[DL_SUB_ATTENTION];
    p->np = p->k->nparams(&cfg, 0), p->tp = tp;
    for (int q = 0; q < p->np; q++) {
        dl_sub_param pr;
        p->k->param(&cfg, 0, q, &pr);
        p->pn[q] = (size_t)pr.rows * pr.cols / (pr.sh == DL_SHARD_NONE ? 1 : tp);
        int ln_w = strstr(pr.name, "ln_") && strstr(pr.name, "weight");
        p->w[q] = vals(p->pn[q], 20 + q, pr.sh == DL_SHARD_NONE ? 0 : rank + 1, 0.5);
        for (size_t i = 0; i < p->pn[q] && ln_w; i++) p->w[q][i] += 1;
        p->dw[q] = calloc(p->pn[q], sizeof(double));
    }
}

/* One call's context over the tokens [t0, t0 + L) of the B sequences (x, y, dx in (B, L, C)). */
static void sub_ctx_init(dl_sub_ctx *c, sub_params *p, dl_comm *tp_comm, int L, int Tkv)
{
    int tp = p->tp, Cl = C / tp;
    *c = (dl_sub_ctx){0};
    c->d = (dl_sub_dims){.MB = B,
                         .B = B,
                         .T = L,
                         .C = C,
                         .Cl = Cl,
                         .Fl = 4 * Cl,
                         .NHl = NH / tp,
                         .HS = HS,
                         .tp = tp,
                         .Tkv = Tkv};
    c->tp_comm = tp_comm;
    c->w = (void *const *)p->w, c->dw = (void *const *)p->dw;
    size_t N = (size_t)B * L, keys = Tkv ? (size_t)Tkv : (size_t)L;
    c->act = calloc(p->k->act_elems(&c->d), sizeof(double));
    c->stash = calloc(p->k->stash_elems(&c->d), sizeof(double));
    c->y = calloc(N * C, sizeof(double));
    c->dx = calloc(N * C, sizeof(double));
    c->ws_dln = calloc(N * C, sizeof(double));
    c->ws_datty = calloc(N * Cl, sizeof(double));
    c->ws_dqkv = calloc(N * 3 * Cl, sizeof(double));
    c->ws_scratch = calloc((size_t)L * keys, sizeof(double));
}

static void sub_ctx_free(dl_sub_ctx *c)
{
    free(c->act), free(c->stash), free(c->y), free(c->dx), free(c->ws_dln), free(c->ws_datty);
    free(c->ws_dqkv), free(c->ws_scratch), free((void *)c->x);
}

static int sub_bwd(dl_sub_ctx *c, const sub_params *p, int input_weight)
{
    if (!input_weight)
        return p->k->bwd[1](c, DL_BWD_WHOLE);
    int rc = p->k->bwd[1](c, DL_BWD_INPUT);
    return rc ? rc : p->k->bwd[1](c, DL_BWD_WEIGHT);
}

static int sub_rank(dl_ctx *x, void *arg)
{
    sub_run *r = arg;
    int rank = dl_ctx_rank(x), tp = r->tp, rc = DL_OK;
    dl_comm *comm = tp > 1 ? dl_ctx_comm(x) : NULL;
    double *xin = vals((size_t)B * T * C, 30, 0, 1.0), *dy = vals((size_t)B * T * C, 31, 0, 1.0);
    sub_params ref, got;
    sub_params_init(&ref, tp, rank), sub_params_init(&got, tp, rank);
    /* the whole sequence */
    dl_sub_ctx w;
    sub_ctx_init(&w, &ref, comm, T, 0);
    w.x = vals((size_t)B * T * C, 30, 0, 1.0);
    rc = rc ? rc : ref.k->fwd[1](&w);
    memcpy(w.dx, dy, sizeof(double) * B * T * C);
    rc = rc ? rc : sub_bwd(&w, &ref, r->input_weight);
    /* slices of 9, 1, 20 and 15 tokens over one cache from the arena */
    static const int split[] = {9, 1, 20, 15};
    enum { NS = 4 };
    int Cl = C / tp;
    dl_arena *ar = NULL;
    void *kv = NULL, *dkv = NULL;
    size_t kvb = sizeof(double) * B * T * 2 * Cl;
    rc = rc ? rc : dl_arena_create(&ar, rank, 0);
    rc = rc ? rc : dl_arena_alloc(ar, DL_MEM_KVCACHE, kvb, &kv);
    rc = rc ? rc : dl_arena_alloc(ar, DL_MEM_KVCACHE, kvb, &dkv);
    dl_sub_ctx s[NS];
    for (int i = 0, t0 = 0; i < NS; t0 += split[i], i++) {
        sub_ctx_init(&s[i], &got, comm, split[i], T);
        double *xs = malloc(sizeof(double) * B * split[i] * C);
        rows_copy(xs, xin, t0, split[i], C, 1);
        s[i].x = xs, s[i].kv = kv, s[i].dkv = dkv, s[i].kv_ctx = t0;
        rc = rc ? rc : got.k->fwd[1](&s[i]);
    }
    for (int i = NS - 1, t0 = T; i >= 0; i--) {
        t0 -= split[i];
        rows_copy(s[i].dx, dy, t0, split[i], C, 1);
        rc = rc ? rc : sub_bwd(&s[i], &got, r->input_weight);
    }
    if (rank == 0 && rc == DL_OK) { /* rank 0 alone writes the result */
        double *y = malloc(sizeof(double) * B * T * C), *dx = malloc(sizeof(double) * B * T * C);
        for (int i = 0, t0 = 0; i < NS; t0 += split[i], i++) {
            rows_copy(y, s[i].y, t0, split[i], C, 0);
            rows_copy(dx, s[i].dx, t0, split[i], C, 0);
        }
        r->err_y = max_diff(y, w.y, (size_t)B * T * C);
        r->err_dx = max_diff(dx, w.dx, (size_t)B * T * C);
        for (int q = 0; q < ref.np; q++)
            r->err_dw = fmax(r->err_dw, max_diff(ref.dw[q], got.dw[q], ref.pn[q]));
        dl_arena_stats st;
        dl_arena_get_stats(ar, &st);
        if (st.current[DL_MEM_KVCACHE] != 2 * kvb) /* the arena counts the bytes asked */
            r->err_y = INFINITY;
        free(y), free(dx);
    }
    for (int i = 0; i < NS; i++) sub_ctx_free(&s[i]);
    sub_ctx_free(&w);
    for (int q = 0; q < ref.np; q++)
        free(ref.w[q]), free(ref.dw[q]), free(got.w[q]), free(got.dw[q]);
    if (ar)
        dl_arena_free(ar, kv), dl_arena_free(ar, dkv), dl_arena_destroy(ar);
    free(xin), free(dy);
    return rc;
}

/* The sublayer adds LayerNorm and the two linears around the kernel: its gradients sum over the
 * B·T rows (90 here) products of the O(1) values above, so the orders of the sums differ by
 * about 90·eps·Σ|terms| ≈ 90 · 2.2e-16 · 90 ≈ 2e-12 per element; 1e-10 leaves a margin while a
 * slice's missing key gradient is O(0.1). */
START_TEST(sublayer_slices_equal_whole)
{
    for (int tp = 1; tp <= 2; tp++)
        for (int iw = 0; iw <= 1; iw++) {
            sub_run r = {.tp = tp, .input_weight = iw};
            ck_assert_msg(tu_run_world(tp, sub_rank, &r) == DL_OK, "%s", dl_errmsg());
            ck_assert_msg(r.err_y <= 1e-10 && r.err_dx <= 1e-10 && r.err_dw <= 1e-10,
                          "tp %d, %s backward: y %.3g, dx %.3g, dw %.3g", tp,
                          iw ? "split" : "whole", r.err_y, r.err_dx, r.err_dw);
        }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("attn_kv");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, splits_equal_whole);
    tcase_add_test(tc, skipping_the_cache_fails);
    tcase_add_test(tc, kv_grad_accumulates);
    tcase_add_test(tc, sublayer_slices_equal_whole);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
