/* The kernel layer (lib/model/ops.c) against finite differences, formulas and itself.
 *
 * - Gradient checks in f64 for every op: the scalar L = Σ out ⊙ R (R random) or the loss itself;
 *   analytic gradients from the backward with dout = R, numeric ones by central differences
 *   (h = 1e-5). Gradient buffers start from random values and the start is subtracted, so the
 *   accumulate (+=) contract is checked too. Error per tensor: max|analytic - numeric| over the
 *   checked elements / max(max|analytic|, max|numeric|), which fails when a gradient is missing.
 * - A whole tiny model (embed -> 2 blocks -> final LN -> head -> CE), composed here from the
 *   ops, checked the same way on a sample of every parameter tensor; the same model run by two
 *   rank threads at once gives bitwise the serial result (the kernels share no state).
 * - f32 against f64 on the same (f32-representable) inputs, forward and backward of each op.
 * - GeLU against erf and its derivative formula; attention split into 2 head groups against
 *   the full attention; cross-entropy against log-sum-exp; AdamW one step against the formula.
 * - The `_write` and fused kernels (linear, attention, GeLU with a stored derivative, bias +
 *   residual) against the plain ones with zeroed outputs: bitwise equal, in place too.
 *
 * DISTLAB_TEST_SCALE=small shrinks shapes and samples fewer elements (sanitizer builds);
 * DISTLAB_TEST_VERBOSE=1 prints every measured error next to its bound's name. */
#define _GNU_SOURCE
#include <check.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "model/ops.h"
#include "../testutil.h"

#define FD_H 1e-5
#define FD_TOL 1e-7    /* f64 gradient checks */
#define AGREE_TOL 1e-5 /* f32 vs f64 */

/* ------------------------------------------------------------------------------------------ */
/* helpers                                                                                      */

/* Every buffer comes from xalloc and is freed by the fixture after each test (LeakSanitizer
 * runs in the sanitizer builds). Rank threads allocate too, hence the lock. Allocation failure
 * cannot be asserted from a rank thread: abort (it does not happen at these sizes). */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static void **g_ptrs;
static size_t g_nptrs, g_cap;

static void *xalloc(size_t bytes)
{
    void *p = tu_alloc(bytes);
    pthread_mutex_lock(&g_mu);
    if (p && g_nptrs == g_cap) {
        size_t cap = g_cap ? 2 * g_cap : 256;
        void **np = realloc(g_ptrs, cap * sizeof(void *));
        if (np)
            g_ptrs = np, g_cap = cap;
    }
    int ok = p && g_nptrs < g_cap;
    if (ok)
        g_ptrs[g_nptrs++] = p;
    pthread_mutex_unlock(&g_mu);
    if (!ok) {
        fprintf(stderr, "test_ops: out of memory\n");
        abort();
    }
    memset(p, 0, bytes);
    return p;
}

static void free_all(void)
{
    for (size_t i = 0; i < g_nptrs; i++) free(g_ptrs[i]);
    free(g_ptrs);
    g_ptrs = NULL, g_nptrs = 0, g_cap = 0;
}

static double *dalloc(size_t n) { return xalloc(n * sizeof(double)); }
static float *falloc(size_t n) { return xalloc(n * sizeof(float)); }

/* uniform in [lo, hi); *seed advances, so each call draws a fresh deterministic stream */
static double *drand_s(size_t n, double lo, double hi, uint64_t *seed)
{
    double *p = dalloc(n);
    tu_fill_f64(p, n, (*seed)++, 0, 0);
    for (size_t i = 0; i < n; i++) p[i] = lo + (hi - lo) * 0.5 * (p[i] + 1.0);
    return p;
}

static uint64_t g_seed = 1; /* test thread only */

static double *drand(size_t n, double lo, double hi) { return drand_s(n, lo, hi, &g_seed); }

static double *dcopy(const double *x, size_t n)
{
    double *p = dalloc(n);
    memcpy(p, x, n * sizeof(double));
    return p;
}

/* Round to f32 in place, so the f64 run sees exactly the f32 run's inputs. */
static void round32(double *x, size_t n)
{
    for (size_t i = 0; i < n; i++) x[i] = (double)(float)x[i];
}

static float *to32(const double *x, size_t n)
{
    float *p = falloc(n);
    for (size_t i = 0; i < n; i++) p[i] = (float)x[i];
    return p;
}

/* max|a - b| / max|b| */
static double rel64(const double *a, const double *b, size_t n)
{
    double e = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        e = fmax(e, fabs(a[i] - b[i]));
        m = fmax(m, fabs(b[i]));
    }
    return m > 0 ? e / m : e;
}

static double rel32(const float *a, const double *b, size_t n)
{
    double e = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        e = fmax(e, fabs((double)a[i] - b[i]));
        m = fmax(m, fabs(b[i]));
    }
    return m > 0 ? e / m : e;
}

static void sub(double *g, const double *g0, size_t n)
{
    for (size_t i = 0; i < n; i++) g[i] -= g0[i];
}

static double dotR(const double *x, const double *R, size_t n)
{
    long double s = 0;
    for (size_t i = 0; i < n; i++) s += (long double)x[i] * R[i];
    return (double)s;
}

typedef double (*loss_fn)(void *ctx);

/* Central differences of f with respect to x[i] for every `step`-th i (and the last);
 * returns max|ga - gn| / max(max|ga|, max|gn|). */
static double fd_err(loss_fn f, void *ctx, double *x, const double *ga, size_t n, size_t step)
{
    double amax = 0, nmax = 0, emax = 0;
    for (size_t i = 0; i < n; i++) amax = fmax(amax, fabs(ga[i]));
    if (step == 0)
        step = 1;
    for (size_t i = 0; i < n; i = (i + step < n || i == n - 1) ? i + step : n - 1) {
        double x0 = x[i];
        x[i] = x0 + FD_H;
        double lp = f(ctx);
        x[i] = x0 - FD_H;
        double lm = f(ctx);
        x[i] = x0;
        double gn = (lp - lm) / (2 * FD_H);
        nmax = fmax(nmax, fabs(gn));
        emax = fmax(emax, fabs(gn - ga[i]));
        if (i == n - 1)
            break;
    }
    double d = fmax(amax, nmax);
    return d > 0 ? emax / d : 0.0;
}

/* DISTLAB_TEST_VERBOSE=1 prints every measured error. */
static void report(const char *what, const char *name, double e)
{
    if (getenv("DISTLAB_TEST_VERBOSE"))
        printf("  %-8s %-28s %.3g\n", what, name, e);
}

#define CHECK_FD(name, err)                                                                        \
    do {                                                                                           \
        double e_ = (err);                                                                         \
        report("fd", name, e_);                                                                    \
        ck_assert_msg(e_ <= FD_TOL, "%s: finite-difference error %.3g > %.1g", name, e_, FD_TOL);  \
    } while (0)

#define CHECK_AGREE(name, err)                                                                     \
    do {                                                                                           \
        double e_ = (err);                                                                         \
        report("f32/f64", name, e_);                                                               \
        ck_assert_msg(e_ <= AGREE_TOL, "%s: f32 vs f64 %.3g > %.1g", name, e_, AGREE_TOL);         \
    } while (0)

static size_t fd_step(size_t n, size_t samples)
{
    if (DL_TEST_SMALL)
        samples = samples / 3 + 1;
    return n / samples > 0 ? n / samples : 1;
}

/* ------------------------------------------------------------------------------------------ */
/* encoder                                                                                      */

typedef struct enc_ctx {
    int B, T, C, V;
    int *tok;
    double *wte, *wpe, *R, *out;
} enc_ctx;

static double enc_loss(void *p)
{
    enc_ctx *c = p;
    dl_encoder_fwd_f64(c->out, c->tok, c->wte, c->wpe, c->B, c->T, c->C);
    return dotR(c->out, c->R, (size_t)c->B * c->T * c->C);
}

static void enc_setup(enc_ctx *c)
{
    c->B = 2, c->T = 5, c->C = 11, c->V = 6;
    size_t N = (size_t)c->B * c->T;
    c->tok = xalloc(N * sizeof(int));
    for (size_t i = 0; i < N; i++) c->tok[i] = (int)((i * 7 + 3) % (size_t)c->V); /* repeats */
    c->wte = drand((size_t)c->V * c->C, -1, 1);
    c->wpe = drand((size_t)(c->T + 2) * c->C, -1, 1); /* more positions than used */
    c->R = drand(N * c->C, -1, 1);
    c->out = dalloc(N * c->C);
}

START_TEST(t_fd_encoder)
{
    enc_ctx c;
    enc_setup(&c);
    size_t nte = (size_t)c.V * c.C, npe = (size_t)(c.T + 2) * c.C;
    double *dwte = drand(nte, -1, 1), *dwpe = drand(npe, -1, 1);
    double *g0te = dcopy(dwte, nte), *g0pe = dcopy(dwpe, npe);
    dl_encoder_bwd_f64(dwte, dwpe, c.R, c.tok, c.B, c.T, c.C);
    sub(dwte, g0te, nte);
    sub(dwpe, g0pe, npe);
    CHECK_FD("encoder wte", fd_err(enc_loss, &c, c.wte, dwte, nte, 1));
    CHECK_FD("encoder wpe", fd_err(enc_loss, &c, c.wpe, dwpe, npe, 1));
    for (size_t i = (size_t)c.T * c.C; i < npe; i++) ck_assert(dwpe[i] == 0.0);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* layernorm                                                                                    */

typedef struct ln_ctx {
    int N, C;
    double *inp, *w, *b, *R, *out, *mean, *rstd;
} ln_ctx;

static double ln_loss(void *p)
{
    ln_ctx *c = p;
    dl_layernorm_fwd_f64(c->out, c->mean, c->rstd, c->inp, c->w, c->b, c->N, c->C);
    return dotR(c->out, c->R, (size_t)c->N * c->C);
}

START_TEST(t_fd_layernorm)
{
    /* C = 19: two 8-wide partial-sum blocks and a tail; C = 5: tail only */
    int Cs[2] = {19, 5};
    ln_ctx c;
    c.N = 6, c.C = Cs[_i];
    size_t n = (size_t)c.N * c.C;
    c.inp = drand(n, -1.5, 2.5); /* non-zero mean */
    c.w = drand(c.C, 0.5, 1.5);
    c.b = drand(c.C, -0.5, 0.5);
    c.R = drand(n, -1, 1);
    c.out = dalloc(n), c.mean = dalloc(c.N), c.rstd = dalloc(c.N);
    ln_loss(&c);
    double *dinp = drand(n, -1, 1), *dw = drand(c.C, -1, 1), *db = drand(c.C, -1, 1);
    double *g0 = dcopy(dinp, n), *g0w = dcopy(dw, c.C), *g0b = dcopy(db, c.C);
    dl_layernorm_bwd_f64(dinp, dw, db, c.R, c.inp, c.w, c.mean, c.rstd, c.N, c.C);
    sub(dinp, g0, n), sub(dw, g0w, c.C), sub(db, g0b, c.C);
    CHECK_FD("layernorm inp", fd_err(ln_loss, &c, c.inp, dinp, n, 1));
    CHECK_FD("layernorm w", fd_err(ln_loss, &c, c.w, dw, c.C, 1));
    CHECK_FD("layernorm b", fd_err(ln_loss, &c, c.b, db, c.C, 1));
    /* mean and rstd are what they claim */
    for (int r = 0; r < c.N; r++) {
        long double m = 0, v = 0;
        for (int j = 0; j < c.C; j++) m += c.inp[r * c.C + j];
        m /= c.C;
        for (int j = 0; j < c.C; j++) v += (c.inp[r * c.C + j] - m) * (c.inp[r * c.C + j] - m);
        v /= c.C;
        ck_assert(fabs(c.mean[r] - (double)m) <= 1e-15 * (1 + fabs((double)m)));
        ck_assert(fabs(c.rstd[r] - (double)(1 / sqrtl(v + 1e-5L))) <= 1e-14 * c.rstd[r]);
    }
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* linear                                                                                       */

typedef struct lin_ctx {
    int N, IC, OC;
    double *inp, *W, *bias, *R, *out;
} lin_ctx;

static double lin_loss(void *p)
{
    lin_ctx *c = p;
    dl_linear_fwd_f64(c->out, c->inp, c->W, c->bias, c->N, c->IC, c->OC);
    return dotR(c->out, c->R, (size_t)c->N * c->OC);
}

START_TEST(t_fd_linear)
{
    int with_bias = _i == 0;
    lin_ctx c;
    c.N = 5, c.IC = 7, c.OC = 9;
    size_t ni = (size_t)c.N * c.IC, nw = (size_t)c.OC * c.IC, no = (size_t)c.N * c.OC;
    c.inp = drand(ni, -1, 1), c.W = drand(nw, -1, 1);
    c.bias = with_bias ? drand(c.OC, -1, 1) : NULL;
    c.R = drand(no, -1, 1), c.out = drand(no, -9, 9); /* garbage: fwd must overwrite */
    lin_loss(&c);
    /* out = inp Wᵀ + bias, by hand */
    for (int n = 0; n < c.N; n++)
        for (int o = 0; o < c.OC; o++) {
            long double s = with_bias ? c.bias[o] : 0;
            for (int i = 0; i < c.IC; i++)
                s += (long double)c.inp[n * c.IC + i] * c.W[o * c.IC + i];
            ck_assert(fabs(c.out[n * c.OC + o] - (double)s) <= 1e-14 * (1 + fabs((double)s)));
        }
    double *dinp = drand(ni, -1, 1), *dW = drand(nw, -1, 1), *db = drand(c.OC, -1, 1);
    double *g0 = dcopy(dinp, ni), *g0w = dcopy(dW, nw), *g0b = dcopy(db, c.OC);
    dl_linear_bwd_f64(dinp, dW, with_bias ? db : NULL, c.R, c.inp, c.W, c.N, c.IC, c.OC);
    sub(dinp, g0, ni), sub(dW, g0w, nw), sub(db, g0b, c.OC);
    CHECK_FD("linear inp", fd_err(lin_loss, &c, c.inp, dinp, ni, 1));
    CHECK_FD("linear W", fd_err(lin_loss, &c, c.W, dW, nw, 1));
    if (with_bias)
        CHECK_FD("linear bias", fd_err(lin_loss, &c, c.bias, db, c.OC, 1));
    else
        for (int o = 0; o < c.OC; o++) ck_assert(db[o] == 0.0); /* NULL dbias: untouched */
    /* NULL dinp and dW are skipped */
    double *dW2 = dcopy(g0w, nw);
    dl_linear_bwd_f64(NULL, dW2, NULL, c.R, c.inp, c.W, c.N, c.IC, c.OC);
    sub(dW2, g0w, nw);
    ck_assert(rel64(dW2, dW, nw) <= 1e-15);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* GeLU and residual                                                                            */

typedef struct ew_ctx {
    size_t n;
    double *a, *b, *R, *out;
    int op; /* 0 gelu, 1 residual */
} ew_ctx;

static double ew_loss(void *p)
{
    ew_ctx *c = p;
    if (c->op == 0)
        dl_gelu_fwd_f64(c->out, c->a, c->n);
    else
        dl_residual_fwd_f64(c->out, c->a, c->b, c->n);
    return dotR(c->out, c->R, c->n);
}

START_TEST(t_fd_gelu)
{
    ew_ctx c = {.n = 67, .op = 0};
    c.a = drand(c.n, -5, 5), c.R = drand(c.n, -1, 1), c.out = dalloc(c.n);
    double *d = drand(c.n, -1, 1), *g0 = dcopy(d, c.n);
    dl_gelu_bwd_f64(d, c.a, c.R, c.n);
    sub(d, g0, c.n);
    CHECK_FD("gelu", fd_err(ew_loss, &c, c.a, d, c.n, 1));
}
END_TEST

START_TEST(t_fd_residual)
{
    ew_ctx c = {.n = 29, .op = 1};
    c.a = drand(c.n, -1, 1), c.b = drand(c.n, -1, 1), c.R = drand(c.n, -1, 1);
    c.out = dalloc(c.n);
    double *da = drand(c.n, -1, 1), *db = drand(c.n, -1, 1);
    double *g0a = dcopy(da, c.n), *g0b = dcopy(db, c.n);
    dl_residual_bwd_f64(da, db, c.R, c.n);
    sub(da, g0a, c.n), sub(db, g0b, c.n);
    CHECK_FD("residual a", fd_err(ew_loss, &c, c.a, da, c.n, 1));
    CHECK_FD("residual b", fd_err(ew_loss, &c, c.b, db, c.n, 1));
    /* in place: out aliases a */
    double *x = dcopy(c.a, c.n);
    dl_residual_fwd_f64(x, x, c.b, c.n);
    for (size_t i = 0; i < c.n; i++) ck_assert(x[i] == c.a[i] + c.b[i]);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* attention                                                                                    */

/* Packed qkv (N, 3C) and an output with padded rows (ldout = C + 3): strides are exercised. */
typedef struct att_ctx {
    int B, T, NH, HS, C, ldout;
    double *qkv, *R, *out, *att;
} att_ctx;

static double att_loss(void *p)
{
    att_ctx *c = p;
    dl_attention_fwd_f64(c->out, c->ldout, c->att, c->qkv, c->qkv + c->C, c->qkv + 2 * c->C,
                         3 * c->C, c->B, c->T, c->NH, c->HS);
    long double s = 0;
    for (int r = 0; r < c->B * c->T; r++)
        for (int j = 0; j < c->C; j++)
            s += (long double)c->out[r * c->ldout + j] * c->R[r * c->ldout + j];
    return (double)s;
}

static void att_setup(att_ctx *c, int B, int T, int NH, int HS)
{
    c->B = B, c->T = T, c->NH = NH, c->HS = HS, c->C = NH * HS, c->ldout = c->C + 3;
    size_t N = (size_t)B * T;
    c->qkv = drand(N * 3 * c->C, -1.5, 1.5);
    c->R = drand(N * c->ldout, -1, 1);
    c->out = dalloc(N * c->ldout);
    c->att = dalloc((size_t)B * NH * T * T);
}

START_TEST(t_fd_attention)
{
    /* T = 7: one GEMM block; T = 70 (> DL_ATT_BLOCK): the causal block structure */
    att_ctx c;
    if (_i == 0)
        att_setup(&c, 2, 7, 2, 3);
    else
        att_setup(&c, 1, DL_TEST_SMALL ? DL_ATT_BLOCK + 3 : DL_ATT_BLOCK + 6, 2, 4);
    size_t N = (size_t)c.B * c.T, nq = N * 3 * c.C;
    att_loss(&c);
    /* probabilities: rows sum to 1, zero above the diagonal */
    for (int bh = 0; bh < c.B * c.NH; bh++)
        for (int i = 0; i < c.T; i++) {
            double s = 0;
            for (int j = 0; j < c.T; j++) {
                double p = c.att[((size_t)bh * c.T + i) * c.T + j];
                if (j > i)
                    ck_assert(p == 0.0);
                s += p;
            }
            ck_assert(fabs(s - 1) < 1e-14);
        }
    double *dqkv = drand(nq, -1, 1), *g0 = dcopy(dqkv, nq), *scratch = dalloc((size_t)c.T * c.T);
    dl_attention_bwd_f64(dqkv, dqkv + c.C, dqkv + 2 * c.C, scratch, c.R, c.ldout, c.qkv,
                         c.qkv + c.C, c.qkv + 2 * c.C, 3 * c.C, c.att, c.B, c.T, c.NH, c.HS);
    sub(dqkv, g0, nq);
    /* split the check by q, k, v columns so each gets its own error */
    static const char *nm[3] = {"attention q", "attention k", "attention v"};
    for (int part = 0; part < 3; part++) {
        double *ga = dalloc(nq);
        for (size_t r = 0; r < N; r++)
            for (int j = 0; j < c.C; j++) {
                size_t idx = r * 3 * c.C + (size_t)part * c.C + j;
                ga[idx] = dqkv[idx];
            }
        /* numeric over this part only: zero analytic elsewhere and perturb only this part */
        double amax = 0, nmax = 0, emax = 0;
        size_t step = fd_step(N * c.C, 150), cnt = 0;
        for (size_t e = 0; e < N * c.C; e += step, cnt++) {
            size_t r = e / c.C, j = e % c.C, idx = r * 3 * c.C + (size_t)part * c.C + j;
            double x0 = c.qkv[idx];
            c.qkv[idx] = x0 + FD_H;
            double lp = att_loss(&c);
            c.qkv[idx] = x0 - FD_H;
            double lm = att_loss(&c);
            c.qkv[idx] = x0;
            double gn = (lp - lm) / (2 * FD_H);
            nmax = fmax(nmax, fabs(gn));
            emax = fmax(emax, fabs(gn - ga[idx]));
        }
        for (size_t i = 0; i < nq; i++) amax = fmax(amax, fabs(ga[i]));
        ck_assert(cnt > 0);
        CHECK_FD(nm[part], emax / fmax(amax, nmax));
    }
}
END_TEST

/* Heads [0, NH) at once == heads [0, NH/2) and [NH/2, NH) in two calls (what TP ranks run). */
START_TEST(t_attention_split)
{
    att_ctx c;
    att_setup(&c, 2, DL_TEST_SMALL ? 20 : DL_ATT_BLOCK + 9, 4, 5);
    size_t N = (size_t)c.B * c.T, nq = N * 3 * c.C, natt = (size_t)c.B * c.NH * c.T * c.T;
    int hh = c.NH / 2, HC = hh * c.HS, ld = 3 * c.C;
    att_loss(&c);
    double *out2 = dalloc(N * c.ldout), *att2[2] = {dalloc(natt / 2), dalloc(natt / 2)};
    for (int g = 0; g < 2; g++)
        dl_attention_fwd_f64(out2 + g * HC, c.ldout, att2[g], c.qkv + g * HC, c.qkv + c.C + g * HC,
                             c.qkv + 2 * c.C + g * HC, ld, c.B, c.T, hh, c.HS);
    double eo = 0, ea = 0;
    for (size_t r = 0; r < N; r++)
        for (int j = 0; j < c.C; j++)
            eo = fmax(eo, fabs(out2[r * c.ldout + j] - c.out[r * c.ldout + j]));
    for (int b = 0; b < c.B; b++)
        for (int h = 0; h < c.NH; h++) {
            const double *full = c.att + ((size_t)b * c.NH + h) * c.T * c.T;
            const double *part = att2[h / hh] + ((size_t)b * hh + h % hh) * c.T * c.T;
            for (int i = 0; i < c.T * c.T; i++) ea = fmax(ea, fabs(full[i] - part[i]));
        }
    report("split", "attention out", eo), report("split", "attention probs", ea);
    ck_assert_msg(eo <= 1e-13 && ea <= 1e-13, "split forward differs: out %.3g att %.3g", eo, ea);
    double *d1 = dalloc(nq), *d2 = dalloc(nq), *scratch = dalloc((size_t)c.T * c.T);
    dl_attention_bwd_f64(d1, d1 + c.C, d1 + 2 * c.C, scratch, c.R, c.ldout, c.qkv, c.qkv + c.C,
                         c.qkv + 2 * c.C, ld, c.att, c.B, c.T, c.NH, c.HS);
    for (int g = 0; g < 2; g++)
        dl_attention_bwd_f64(d2 + g * HC, d2 + c.C + g * HC, d2 + 2 * c.C + g * HC, scratch,
                             c.R + g * HC, c.ldout, c.qkv + g * HC, c.qkv + c.C + g * HC,
                             c.qkv + 2 * c.C + g * HC, ld, att2[g], c.B, c.T, hh, c.HS);
    double ed = 0;
    for (size_t i = 0; i < nq; i++) ed = fmax(ed, fabs(d1[i] - d2[i]));
    report("split", "attention dqkv", ed);
    ck_assert_msg(ed <= 1e-13, "split backward differs by %.3g", ed);
}
END_TEST

/* The attention's small products at every kernel level the CPU has (2 AVX-512, 1 AVX2 + FMA,
 * 0 the BLAS), on shapes that use every tile and tail (_i = 0: HS = 44, vectors of 16 and 8
 * floats plus a remainder; T = 2 blocks + 6; ldout padded) and a head too wide for the
 * transposed-key buffer (_i = 1: HS = 520, Q·Kᵀ through the BLAS): levels 1 and 2 bitwise equal,
 * every level against an f64 run of the same inputs (f32) or the BLAS level (f64). */
static void att_run_f32(int cap, const att_ctx *c, float *out, float *att, float *dqkv)
{
    size_t N = (size_t)c->B * c->T, nq = N * 3 * c->C;
    float *qkv = falloc(nq), *R = falloc(N * c->ldout), *sc = falloc((size_t)c->T * c->T);
    for (size_t i = 0; i < nq; i++) qkv[i] = (float)c->qkv[i];
    for (size_t i = 0; i < N * c->ldout; i++) R[i] = (float)c->R[i];
    dl_ops_small_mm_cap(cap);
    dl_attention_fwd_f32(out, c->ldout, att, qkv, qkv + c->C, qkv + 2 * c->C, 3 * c->C, c->B, c->T,
                         c->NH, c->HS);
    dl_attention_bwd_write_f32(dqkv, dqkv + c->C, dqkv + 2 * c->C, sc, R, c->ldout, qkv, qkv + c->C,
                               qkv + 2 * c->C, 3 * c->C, att, c->B, c->T, c->NH, c->HS);
}

static void att_run_f64(int cap, const att_ctx *c, double *out, double *att, double *dqkv)
{
    dl_ops_small_mm_cap(cap);
    dl_attention_fwd_f64(out, c->ldout, att, c->qkv, c->qkv + c->C, c->qkv + 2 * c->C, 3 * c->C,
                         c->B, c->T, c->NH, c->HS);
    dl_attention_bwd_write_f64(dqkv, dqkv + c->C, dqkv + 2 * c->C, dalloc((size_t)c->T * c->T),
                               c->R, c->ldout, c->qkv, c->qkv + c->C, c->qkv + 2 * c->C, 3 * c->C,
                               att, c->B, c->T, c->NH, c->HS);
}

static double rel_err_f32(const float *a, const double *b, size_t n)
{
    double e = 0, m = 0;
    for (size_t i = 0; i < n; i++) e = fmax(e, fabs(a[i] - b[i])), m = fmax(m, fabs(b[i]));
    return m > 0 ? e / m : e;
}

static double rel_err_f64(const double *a, const double *b, size_t n)
{
    double e = 0, m = 0;
    for (size_t i = 0; i < n; i++) e = fmax(e, fabs(a[i] - b[i])), m = fmax(m, fabs(b[i]));
    return m > 0 ? e / m : e;
}

/* The GEMM log (the trainer's utilisation reference) records what the attention ran: at every
 * kernel level, each product under the kernel that ran it (the small-product level, or the BLAS
 * for the wide head's Q.K^T), with its strides, and FLOPs that add up to the causal row blocks'
 * 2 x 2 HS sum (i1 - i0) i1 per (batch, head), counted here independently; the replay runs them. */
START_TEST(t_gemm_log_attention)
{
    att_ctx c;
    if (_i == 0)
        att_setup(&c, 2, 2 * DL_ATT_BLOCK + 6, 2, 44);
    else
        att_setup(&c, 1, DL_ATT_BLOCK + 5, 1, 520);
    double want = 0;
    for (int i0 = 0; i0 < c.T; i0 += DL_ATT_BLOCK) {
        int i1 = i0 + DL_ATT_BLOCK < c.T ? i0 + DL_ATT_BLOCK : c.T;
        want += 2.0 * 2.0 * c.HS * (double)(i1 - i0) * i1 * c.B * c.NH;
    }
    int top = dl_ops_small_mm_cap(-1);
    static dl_gemm_log lg;
    for (int l = 0; l <= top; l++) {
        memset(&lg, 0, sizeof lg);
        dl_ops_small_mm_cap(l);
        dl_ops_gemm_log(&lg);
        dl_attention_fwd_f64(c.out, c.ldout, c.att, c.qkv, c.qkv + c.C, c.qkv + 2 * c.C, 3 * c.C,
                             c.B, c.T, c.NH, c.HS);
        dl_ops_gemm_log(NULL);
        double got = 0;
        for (int i = 0; i < lg.n; i++) {
            const dl_gemm_shape *g = &lg.s[i];
            int kern = g->tb ? DL_GEMM_BLAS : l; /* only the wide head's Q.K^T is a BLAS A.B^T */
            ck_assert_msg(g->kernel == kern, "level %d: %dx%dx%d logged under kernel %d", l, g->M,
                          g->N, g->K, g->kernel);
            ck_assert(g->lda > 0 && g->ldb > 0 && g->ldc > 0 && g->zero_beta == 1);
            got += 2.0 * g->M * g->N * g->K * (double)g->count;
        }
        ck_assert_int_eq(lg.dropped, 0);
        ck_assert_msg(got == want, "level %d: logged %.0f FLOPs, the causal blocks %.0f", l, got,
                      want);
        ck_assert(dl_ops_gemm_replay(&lg, 8, 1) > 0 && dl_ops_gemm_replay(&lg, 4, 1) > 0);
    }
    dl_ops_small_mm_cap(-1);
}
END_TEST

START_TEST(t_small_mm_levels)
{
    att_ctx c;
    if (_i == 0)
        att_setup(&c, 2, 2 * DL_ATT_BLOCK + 6, 2, 44);
    else
        att_setup(&c, 1, DL_ATT_BLOCK + 5, 1, 520);
    size_t N = (size_t)c.B * c.T, nq = N * 3 * c.C, no = N * c.ldout;
    size_t na = (size_t)c.B * c.NH * c.T * c.T;
    round32(c.qkv, nq), round32(c.R, no);
    int top = dl_ops_small_mm_cap(-1);
    double *o64[3], *a64[3], *d64[3];
    float *o32[3], *a32[3], *d32[3];
    for (int l = 0; l <= top; l++) {
        o64[l] = dalloc(no), a64[l] = dalloc(na), d64[l] = dalloc(nq);
        o32[l] = falloc(no), a32[l] = falloc(na), d32[l] = falloc(nq);
        memset(o64[l], 0, no * sizeof(double)), memset(o32[l], 0, no * sizeof(float));
        att_run_f64(l, &c, o64[l], a64[l], d64[l]);
        att_run_f32(l, &c, o32[l], a32[l], d32[l]);
    }
    dl_ops_small_mm_cap(-1);
    for (int l = 0; l <= top; l++) {
        double e[6] = {rel_err_f32(o32[l], o64[0], no), rel_err_f32(a32[l], a64[0], na),
                       rel_err_f32(d32[l], d64[0], nq), rel_err_f64(o64[l], o64[0], no),
                       rel_err_f64(a64[l], a64[0], na), rel_err_f64(d64[l], d64[0], nq)};
        if (getenv("DISTLAB_TEST_VERBOSE"))
            printf("  level %d: f32 vs f64 out %.3g att %.3g dqkv %.3g; f64 vs BLAS %.3g %.3g "
                   "%.3g\n",
                   l, e[0], e[1], e[2], e[3], e[4], e[5]);
        for (int k = 0; k < 3; k++) {
            ck_assert_msg(e[k] <= 1e-5, "level %d: f32 attention differs from f64 by %.3g", l,
                          e[k]);
            ck_assert_msg(e[3 + k] <= 1e-13,
                          "level %d: f64 attention differs from the BLAS by %.3g", l, e[3 + k]);
        }
    }
    if (top == 2) {
        ck_assert(memcmp(o32[1], o32[2], no * sizeof(float)) == 0);
        ck_assert(memcmp(a32[1], a32[2], na * sizeof(float)) == 0);
        ck_assert(memcmp(d32[1], d32[2], nq * sizeof(float)) == 0);
        ck_assert(memcmp(d64[1], d64[2], nq * sizeof(double)) == 0);
    }
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* cross-entropy                                                                                */

typedef struct ce_ctx {
    int N, V;
    int *tgt;
    double *logits, *probs, *losses;
} ce_ctx;

static double ce_loss(void *p)
{
    ce_ctx *c = p;
    return dl_crossentropy_fwd_f64(c->probs, c->losses, c->logits, c->tgt, c->N, c->V);
}

static void ce_setup(ce_ctx *c, int N, int V, double spread)
{
    c->N = N, c->V = V;
    c->tgt = xalloc((size_t)N * sizeof(int));
    for (int i = 0; i < N; i++) c->tgt[i] = (i * 5 + 2) % V;
    c->logits = drand((size_t)N * V, -spread, spread);
    c->probs = dalloc((size_t)N * V), c->losses = dalloc(N);
}

START_TEST(t_fd_crossentropy)
{
    ce_ctx c;
    ce_setup(&c, 6, 11, 3);
    size_t n = (size_t)c.N * c.V;
    ce_loss(&c);
    double *d = dalloc(n);
    dl_crossentropy_bwd_f64(d, c.probs, c.tgt, 1.0 / c.N, c.N, c.V);
    CHECK_FD("crossentropy logits", fd_err(ce_loss, &c, c.logits, d, n, 1));
    /* in place: probs aliasing logits, dlogits aliasing probs */
    double *x = dcopy(c.logits, n);
    double m1 = dl_crossentropy_fwd_f64(x, NULL, x, c.tgt, c.N, c.V);
    ck_assert(m1 == ce_loss(&c));
    dl_crossentropy_bwd_f64(x, x, c.tgt, 1.0 / c.N, c.N, c.V);
    ck_assert(rel64(x, d, n) == 0.0);
}
END_TEST

/* Against log Σ exp computed directly (long double, no shift), and shift invariance. */
START_TEST(t_crossentropy_lse)
{
    ce_ctx c;
    ce_setup(&c, 9, 256, 6);
    double mean = ce_loss(&c);
    long double tot = 0;
    double emax = 0;
    for (int r = 0; r < c.N; r++) {
        long double s = 0;
        for (int j = 0; j < c.V; j++) s += expl((long double)c.logits[r * c.V + j]);
        long double ref = logl(s) - c.logits[r * c.V + c.tgt[r]];
        tot += ref;
        emax = fmax(emax, fabs(c.losses[r] - (double)ref) / (double)ref);
        for (int j = 0; j < c.V; j++) {
            double pr = (double)(expl((long double)c.logits[r * c.V + j]) / s);
            ck_assert(fabs(c.probs[r * c.V + j] - pr) <= 1e-14 * pr + 1e-300);
        }
    }
    report("lse", "crossentropy f64", emax);
    ck_assert_msg(emax <= 1e-14, "f64 loss vs log-sum-exp %.3g", emax);
    ck_assert(fabs(mean - (double)(tot / c.N)) <= 1e-14 * fabs(mean));
    /* f32 against the same reference */
    float *l32 = to32(c.logits, (size_t)c.N * c.V), *p32 = falloc((size_t)c.N * c.V);
    float *ls32 = falloc(c.N);
    round32(c.logits, (size_t)c.N * c.V);
    double mean64 = ce_loss(&c);
    double mean32 = dl_crossentropy_fwd_f32(p32, ls32, l32, c.tgt, c.N, c.V);
    ck_assert_msg(fabs(mean32 - mean64) <= 1e-6 * mean64, "f32 mean %.9g vs %.9g", mean32, mean64);
    /* logits + 1000: same losses (the max is subtracted before exp) */
    double *sh = dcopy(c.logits, (size_t)c.N * c.V);
    for (size_t i = 0; i < (size_t)c.N * c.V; i++) sh[i] += 1000;
    double *ls2 = dalloc(c.N), *p2 = dalloc((size_t)c.N * c.V);
    double mean_sh = dl_crossentropy_fwd_f64(p2, ls2, sh, c.tgt, c.N, c.V);
    ck_assert_msg(isfinite(mean_sh) && fabs(mean_sh - mean64) <= 1e-11 * mean64,
                  "shifted logits: %.17g vs %.17g", mean_sh, mean64);
}
END_TEST

/* The f32 softmax's exp over its whole range: rows (x, 0) give p0 = e^x / (e^x + 1), so for
 * x from -87 to 0 p0 follows e^x (the only arguments the kernels pass to exp are <= 0). */
START_TEST(t_softmax_exp_range)
{
    int n = 8701;
    int *tgt = xalloc((size_t)n * sizeof(int));
    float *l = falloc(2 * (size_t)n), *p = falloc(2 * (size_t)n);
    for (int i = 0; i < n; i++) l[2 * i] = (float)(-87.0 + 87.0 * i / (n - 1)), l[2 * i + 1] = 0;
    dl_crossentropy_fwd_f32(p, NULL, l, tgt, n, 2);
    double e = 0;
    for (int i = 0; i < n; i++) {
        long double ex = expl((long double)l[2 * i]);
        long double p0 = ex / (ex + 1), p1 = 1 / (ex + 1);
        e = fmax(e, (double)(fabsl(p[2 * i] - p0) / p0));
        e = fmax(e, (double)(fabsl(p[2 * i + 1] - p1) / p1));
    }
    e /= FLT_EPSILON / 2;
    report("exp", "softmax f32 (u)", e);
    ck_assert_msg(e <= 6, "f32 softmax vs expl: %.3g u", e);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* write variants and fused kernels: bitwise the unfused, zero-then-accumulate results          */

/* One body for f32 and f64: T is the type, S the suffix. Output buffers start as garbage, so a
 * variant that reads what it should overwrite fails; in-place calls check the aliasing cases. */
#define WRITE_VARIANTS(T, S)                                                                       \
    static void write_variants_##S(void)                                                           \
    {                                                                                              \
        int N = 37, IC = 21, OC = 45, B = 2, TT = DL_TEST_SMALL ? 9 : DL_ATT_BLOCK + 7, NH = 2,    \
            HS = 5, C = NH * HS;                                                                   \
        size_t ni = (size_t)N * IC, no = (size_t)N * OC, nw = (size_t)OC * IC;                     \
        T *inp = xalloc(ni * sizeof(T)), *W = xalloc(nw * sizeof(T)), *d = xalloc(no * sizeof(T)); \
        T *b = xalloc(OC * sizeof(T));                                                             \
        double *r = drand(ni + nw + no + OC, -1, 1);                                               \
        for (size_t i = 0; i < ni; i++) inp[i] = (T)r[i];                                          \
        for (size_t i = 0; i < nw; i++) W[i] = (T)r[ni + i];                                       \
        for (size_t i = 0; i < no; i++) d[i] = (T)(4 * r[ni + nw + i]);                            \
        for (int i = 0; i < OC; i++) b[i] = (T)r[ni + nw + no + i];                                \
        /* linear: dinp written == zeroed + accumulated; dW, dbias still accumulate */             \
        T *x1 = xalloc(ni * sizeof(T)), *x2 = xalloc(ni * sizeof(T));                              \
        T *w1 = xalloc(nw * sizeof(T)), *w2 = xalloc(nw * sizeof(T));                              \
        T *b1 = xalloc(OC * sizeof(T)), *b2 = xalloc(OC * sizeof(T));                              \
        for (size_t i = 0; i < ni; i++) x2[i] = (T)99;                                             \
        for (size_t i = 0; i < nw; i++) w1[i] = w2[i] = (T)r[i % ni];                              \
        for (int i = 0; i < OC; i++) b1[i] = b2[i] = (T)i;                                         \
        dl_linear_bwd_##S(x1, w1, b1, d, inp, W, N, IC, OC);                                       \
        dl_linear_bwd_write_##S(x2, w2, b2, d, inp, W, N, IC, OC);                                 \
        ck_assert(memcmp(x1, x2, ni * sizeof(T)) == 0);                                            \
        ck_assert(memcmp(w1, w2, nw * sizeof(T)) == 0 && memcmp(b1, b2, OC * sizeof(T)) == 0);     \
        /* GeLU: fwd_deriv's out is dl_gelu_fwd's, in place over the input too; bwd_deriv ==   \
         * dl_gelu_bwd into zeros + the column sums, also in place over dout */   \
        T *y1 = xalloc(no * sizeof(T)), *y2 = xalloc(no * sizeof(T)), *g = xalloc(no * sizeof(T)); \
        T *dd = xalloc(no * sizeof(T)), *e1 = xalloc(no * sizeof(T)),                              \
          *e2 = xalloc(no * sizeof(T));                                                            \
        for (size_t i = 0; i < no; i++) g[i] = d[i], dd[i] = (T)r[i % ni], e2[i] = (T)-7;          \
        dl_gelu_fwd_##S(y1, d, no);                                                                \
        dl_gelu_fwd_deriv_##S(y2, g, g, no);                                                       \
        ck_assert(memcmp(y1, y2, no * sizeof(T)) == 0);                                            \
        dl_gelu_bwd_##S(e1, d, dd, no);                                                            \
        for (int i = 0; i < OC; i++) b1[i] = b2[i] = (T)i;                                         \
        for (int n = 0; n < N; n++)                                                                \
            for (int o = 0; o < OC; o++) b1[o] += e1[(size_t)n * OC + o];                          \
        dl_gelu_bwd_deriv_##S(e2, b2, g, dd, N, OC);                                               \
        ck_assert(memcmp(e1, e2, no * sizeof(T)) == 0 && memcmp(b1, b2, OC * sizeof(T)) == 0);     \
        dl_gelu_bwd_deriv_##S(dd, NULL, g, dd, N, OC);                                             \
        ck_assert(memcmp(e1, dd, no * sizeof(T)) == 0);                                            \
        /* bias + residual in one pass == bias, then residual; out aliasing a and res */           \
        T *a1 = xalloc(no * sizeof(T)), *a2 = xalloc(no * sizeof(T)),                              \
          *a3 = xalloc(no * sizeof(T));                                                            \
        for (size_t i = 0; i < no; i++) a1[i] = a2[i] = y1[i], a3[i] = (T)5;                       \
        for (int n = 0; n < N; n++)                                                                \
            for (int o = 0; o < OC; o++) a1[(size_t)n * OC + o] += b[o];                           \
        dl_residual_fwd_##S(a1, a1, d, no);                                                        \
        dl_residual_bias_fwd_##S(a3, a2, b, d, N, OC);                                             \
        ck_assert(memcmp(a1, a3, no * sizeof(T)) == 0);                                            \
        dl_residual_bias_fwd_##S(a2, a2, b, d, N, OC);                                             \
        ck_assert(memcmp(a1, a2, no * sizeof(T)) == 0);                                            \
        for (size_t i = 0; i < no; i++) a2[i] = d[i];                                              \
        dl_residual_bias_fwd_##S(a2, y1, b, a2, N, OC);                                            \
        ck_assert(memcmp(a1, a2, no * sizeof(T)) == 0);                                            \
        /* attention: dq, dk, dv written == zeroed + accumulated (packed, several blocks) */       \
        size_t nr = (size_t)B * TT, nq = nr * 3 * C;                                               \
        T *qkv = xalloc(nq * sizeof(T)), *dout = xalloc(nr * C * sizeof(T));                       \
        T *att = xalloc((size_t)B * NH * TT * TT * sizeof(T)), *o = xalloc(nr * C * sizeof(T));    \
        T *sc = xalloc((size_t)TT * TT * sizeof(T));                                               \
        T *q1 = xalloc(nq * sizeof(T)), *q2 = xalloc(nq * sizeof(T));                              \
        double *ra = drand(nq + nr * C, -1.5, 1.5);                                                \
        for (size_t i = 0; i < nq; i++) qkv[i] = (T)ra[i], q2[i] = (T)3;                           \
        for (size_t i = 0; i < nr * C; i++) dout[i] = (T)ra[nq + i];                               \
        dl_attention_fwd_##S(o, C, att, qkv, qkv + C, qkv + 2 * C, 3 * C, B, TT, NH, HS);          \
        dl_attention_bwd_##S(q1, q1 + C, q1 + 2 * C, sc, dout, C, qkv, qkv + C, qkv + 2 * C,       \
                             3 * C, att, B, TT, NH, HS);                                           \
        dl_attention_bwd_write_##S(q2, q2 + C, q2 + 2 * C, sc, dout, C, qkv, qkv + C, qkv + 2 * C, \
                                   3 * C, att, B, TT, NH, HS);                                     \
        ck_assert(memcmp(q1, q2, nq * sizeof(T)) == 0);                                            \
    }
WRITE_VARIANTS(float, f32)
WRITE_VARIANTS(double, f64)

START_TEST(t_write_variants)
{
    write_variants_f32();
    write_variants_f64();
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* GeLU against erf                                                                             */

START_TEST(t_gelu_erf)
{
    size_t n = 4001;
    double *x = dalloc(n), *y = dalloc(n), *d = dalloc(n), *one = dalloc(n);
    for (size_t i = 0; i < n; i++) x[i] = -10.0 + 20.0 * (double)i / (double)(n - 1), one[i] = 1;
    round32(x, n);
    dl_gelu_fwd_f64(y, x, n);
    dl_gelu_bwd_f64(d, x, one, n);
    float *x32 = to32(x, n), *y32 = falloc(n), *d32 = falloc(n), *one32 = to32(one, n);
    dl_gelu_fwd_f32(y32, x32, n);
    dl_gelu_bwd_f32(d32, x32, one32, n);
    double e64 = 0, e32 = 0, ed64 = 0, ed32 = 0;
    for (size_t i = 0; i < n; i++) {
        long double xl = x[i];
        long double cdf = 0.5L * (1 + erfl(xl / sqrtl(2.0L)));
        long double ref = xl * cdf;
        long double dref = cdf + xl * expl(-0.5L * xl * xl) / sqrtl(2 * 3.14159265358979323846264L);
        /* in units of the type's rounding: relative to the value, plus an absolute part
         * |x| u for where 1 + erf cancels (x << 0), as it does in any erf-based GeLU */
        double u64 = DBL_EPSILON / 2, u32 = FLT_EPSILON / 2;
        double a = fabs((double)ref), ax = fabs(x[i]), ad = fabs((double)dref);
        e64 = fmax(e64, fabs(y[i] - (double)ref) / (u64 * (a + ax)));
        e32 = fmax(e32, fabs((double)y32[i] - (double)ref) / (u32 * (a + ax)));
        ed64 = fmax(ed64, fabs(d[i] - (double)dref) / (u64 * (ad + 1 + ax)));
        ed32 = fmax(ed32, fabs((double)d32[i] - (double)dref) / (u32 * (ad + 1 + ax)));
    }
    report("erf", "gelu f64 (u)", e64), report("erf", "gelu' f64 (u)", ed64);
    report("erf", "gelu f32 (u)", e32), report("erf", "gelu' f32 (u)", ed32);
    ck_assert_msg(e64 <= 4 && ed64 <= 4, "f64 gelu vs erf %.3g u, derivative %.3g u", e64, ed64);
    ck_assert_msg(e32 <= 4 && ed32 <= 4, "f32 gelu vs erf %.3g u, derivative %.3g u", e32, ed32);
    ck_assert(y[0] == y[0] && fabs(y[0]) < 1e-20 && y[n - 1] == 10.0); /* tails */
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* AdamW against the formula                                                                    */

START_TEST(t_adamw)
{
    size_t n = 1003;
    double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, gs = _i ? 0.5 : 1.0;
    long step = 3;
    double *p = drand(n, -1, 1), *g = drand(n, -1, 1), *m = drand(n, -0.1, 0.1),
           *v = drand(n, 0, 0.01);
    for (size_t i = 0; i < 5; i++) v[i] = 0, m[i] = 0, g[i] = i == 0 ? 0 : g[i]; /* v = 0 edge */
    round32(p, n), round32(g, n), round32(m, n), round32(v, n);
    float *p32 = to32(p, n), *g32 = to32(g, n), *m32 = to32(m, n), *v32 = to32(v, n);
    double *p0 = dcopy(p, n), *m0 = dcopy(m, n), *v0 = dcopy(v, n);
    dl_adamw_f64(p, g, m, v, n, lr, b1, b2, eps, wd, gs, step);
    dl_adamw_f32(p32, g32, m32, v32, n, (float)lr, (float)b1, (float)b2, (float)eps, (float)wd,
                 (float)gs, step);
    double ep = 0, em = 0, ev = 0, ep32 = 0;
    /* the reference in long double, once with the f64 hyperparameters and once with the f32
     * ones (1 - (float)0.9 is 2.4e-7 away from 0.1: that is the f32 run's input, not its error) */
    for (int prec = 0; prec < 2; prec++) {
        long double hlr = prec ? (float)lr : lr, hb1 = prec ? (float)b1 : b1,
                    hb2 = prec ? (float)b2 : b2, heps = prec ? (float)eps : eps,
                    hwd = prec ? (float)wd : wd, hgs = prec ? (float)gs : gs;
        for (size_t i = 0; i < n; i++) {
            long double gg = (long double)g[i] * hgs;
            long double mi = hb1 * (long double)m0[i] + (1 - hb1) * gg;
            long double vi = hb2 * (long double)v0[i] + (1 - hb2) * gg * gg;
            long double mh = mi / (1 - powl(hb1, step)), vh = vi / (1 - powl(hb2, step));
            long double pi = p0[i] - hlr * (mh / (sqrtl(vh) + heps) + hwd * p0[i]);
            /* errors in units of the magnitudes that enter each result (cancellation-proof) */
            long double ms = hb1 * fabsl(m0[i]) + (1 - hb1) * fabsl(gg) + 1e-300L;
            long double ps =
                fabsl(p0[i]) + hlr * (fabsl(mh) / (sqrtl(vh) + heps) + hwd * fabsl(p0[i]));
            if (prec) {
                ep32 = fmax(ep32, (double)(fabsl(p32[i] - pi) / ps));
                continue;
            }
            ep = fmax(ep, (double)(fabsl(p[i] - pi) / ps));
            em = fmax(em, (double)(fabsl(m[i] - mi) / ms));
            ev = fmax(ev, (double)(fabsl(v[i] - vi) / (fabsl(vi) + 1e-300L)));
        }
    }
    report("formula", "adamw f64 p", ep), report("formula", "adamw f64 m", em);
    report("formula", "adamw f64 v", ev), report("formula", "adamw f32 p", ep32);
    ck_assert_msg(ep <= 1e-15 && em <= 1e-15 && ev <= 1e-15, "f64 adamw: p %.3g m %.3g v %.3g", ep,
                  em, ev);
    ck_assert_msg(ep32 <= 3e-7, "f32 adamw: p %.3g", ep32);
    ck_assert(m[0] == m0[0] * b1 && v[0] == 0.0 && fabs(p[0] - p0[0] * (1 - lr * wd)) < 1e-16);
}
END_TEST

START_TEST(t_sumsq)
{
    size_t n = 1001;
    double *x = drand(n, -1, 1);
    long double s = 0;
    for (size_t i = 0; i < n; i++) s += (long double)x[i] * x[i];
    ck_assert(fabs(dl_sumsq_f64(x, n) - (double)s) <= 1e-14 * (double)s);
    float *x32 = to32(x, n);
    s = 0;
    for (size_t i = 0; i < n; i++) s += (long double)x32[i] * x32[i];
    ck_assert(fabs(dl_sumsq_f32(x32, n) - (double)s) <= 1e-14 * (double)s);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* f32 vs f64: forward and backward of every op on identical inputs                             */

START_TEST(t_f32_vs_f64)
{
    int B = 2, T = DL_TEST_SMALL ? 9 : DL_ATT_BLOCK + 5, NH = 2, HS = 8, C = NH * HS, V = 37;
    size_t N = (size_t)B * T, nc = N * C;
    /* encoder */
    {
        int *tok = xalloc(N * sizeof(int));
        for (size_t i = 0; i < N; i++) tok[i] = (int)((i * 11) % (size_t)V);
        double *wte = drand((size_t)V * C, -1, 1), *wpe = drand((size_t)T * C, -1, 1),
               *d = drand(nc, -1, 1);
        round32(wte, (size_t)V * C), round32(wpe, (size_t)T * C), round32(d, nc);
        float *wte32 = to32(wte, (size_t)V * C), *wpe32 = to32(wpe, (size_t)T * C),
              *d32 = to32(d, nc);
        double *o = dalloc(nc), *dte = dalloc((size_t)V * C), *dpe = dalloc((size_t)T * C);
        float *o32 = falloc(nc), *dte32 = falloc((size_t)V * C), *dpe32 = falloc((size_t)T * C);
        dl_encoder_fwd_f64(o, tok, wte, wpe, B, T, C);
        dl_encoder_fwd_f32(o32, tok, wte32, wpe32, B, T, C);
        dl_encoder_bwd_f64(dte, dpe, d, tok, B, T, C);
        dl_encoder_bwd_f32(dte32, dpe32, d32, tok, B, T, C);
        CHECK_AGREE("encoder fwd", rel32(o32, o, nc));
        CHECK_AGREE("encoder bwd wte", rel32(dte32, dte, (size_t)V * C));
        CHECK_AGREE("encoder bwd wpe", rel32(dpe32, dpe, (size_t)T * C));
    }
    /* layernorm */
    {
        double *x = drand(nc, -2, 3), *w = drand(C, 0.5, 1.5), *b = drand(C, -1, 1),
               *d = drand(nc, -1, 1);
        round32(x, nc), round32(w, C), round32(b, C), round32(d, nc);
        float *x32 = to32(x, nc), *w32 = to32(w, C), *b32 = to32(b, C), *d32 = to32(d, nc);
        double *o = dalloc(nc), *mu = dalloc(N), *rs = dalloc(N), *dx = dalloc(nc), *dw = dalloc(C),
               *db = dalloc(C);
        float *o32 = falloc(nc), *mu32 = falloc(N), *rs32 = falloc(N), *dx32 = falloc(nc),
              *dw32 = falloc(C), *db32 = falloc(C);
        dl_layernorm_fwd_f64(o, mu, rs, x, w, b, (int)N, C);
        dl_layernorm_fwd_f32(o32, mu32, rs32, x32, w32, b32, (int)N, C);
        dl_layernorm_bwd_f64(dx, dw, db, d, x, w, mu, rs, (int)N, C);
        dl_layernorm_bwd_f32(dx32, dw32, db32, d32, x32, w32, mu32, rs32, (int)N, C);
        CHECK_AGREE("layernorm fwd", rel32(o32, o, nc));
        CHECK_AGREE("layernorm mean", rel32(mu32, mu, N));
        CHECK_AGREE("layernorm rstd", rel32(rs32, rs, N));
        CHECK_AGREE("layernorm bwd inp", rel32(dx32, dx, nc));
        CHECK_AGREE("layernorm bwd w", rel32(dw32, dw, C));
        CHECK_AGREE("layernorm bwd b", rel32(db32, db, C));
    }
    /* linear, OC = 4C */
    {
        int OC = 4 * C;
        size_t no = N * OC, nw = (size_t)OC * C;
        double *x = drand(nc, -1, 1), *W = drand(nw, -0.5, 0.5), *bias = drand(OC, -1, 1),
               *d = drand(no, -1, 1);
        round32(x, nc), round32(W, nw), round32(bias, OC), round32(d, no);
        float *x32 = to32(x, nc), *W32 = to32(W, nw), *bias32 = to32(bias, OC), *d32 = to32(d, no);
        double *o = dalloc(no), *dx = dalloc(nc), *dW = dalloc(nw), *db = dalloc(OC);
        float *o32 = falloc(no), *dx32 = falloc(nc), *dW32 = falloc(nw), *db32 = falloc(OC);
        dl_linear_fwd_f64(o, x, W, bias, (int)N, C, OC);
        dl_linear_fwd_f32(o32, x32, W32, bias32, (int)N, C, OC);
        dl_linear_bwd_f64(dx, dW, db, d, x, W, (int)N, C, OC);
        dl_linear_bwd_f32(dx32, dW32, db32, d32, x32, W32, (int)N, C, OC);
        CHECK_AGREE("linear fwd", rel32(o32, o, no));
        CHECK_AGREE("linear bwd inp", rel32(dx32, dx, nc));
        CHECK_AGREE("linear bwd W", rel32(dW32, dW, nw));
        CHECK_AGREE("linear bwd bias", rel32(db32, db, OC));
    }
    /* gelu and residual */
    {
        double *x = drand(nc, -6, 6), *y = drand(nc, -1, 1), *d = drand(nc, -1, 1);
        round32(x, nc), round32(y, nc), round32(d, nc);
        float *x32 = to32(x, nc), *y32 = to32(y, nc), *d32 = to32(d, nc);
        double *o = dalloc(nc), *dx = dalloc(nc), *dy = dalloc(nc);
        float *o32 = falloc(nc), *dx32 = falloc(nc), *dy32 = falloc(nc);
        dl_gelu_fwd_f64(o, x, nc);
        dl_gelu_fwd_f32(o32, x32, nc);
        dl_gelu_bwd_f64(dx, x, d, nc);
        dl_gelu_bwd_f32(dx32, x32, d32, nc);
        CHECK_AGREE("gelu fwd", rel32(o32, o, nc));
        CHECK_AGREE("gelu bwd", rel32(dx32, dx, nc));
        memset(dx, 0, nc * sizeof(double)), memset(dx32, 0, nc * sizeof(float));
        dl_residual_fwd_f64(o, x, y, nc);
        dl_residual_fwd_f32(o32, x32, y32, nc);
        dl_residual_bwd_f64(dx, dy, d, nc);
        dl_residual_bwd_f32(dx32, dy32, d32, nc);
        CHECK_AGREE("residual fwd", rel32(o32, o, nc));
        CHECK_AGREE("residual bwd a", rel32(dx32, dx, nc));
        CHECK_AGREE("residual bwd b", rel32(dy32, dy, nc));
    }
    /* attention (packed qkv) */
    {
        size_t nq = N * 3 * C, na = (size_t)B * NH * T * T;
        double *qkv = drand(nq, -1.5, 1.5), *d = drand(nc, -1, 1);
        round32(qkv, nq), round32(d, nc);
        float *qkv32 = to32(qkv, nq), *d32 = to32(d, nc);
        double *o = dalloc(nc), *att = dalloc(na), *dq = dalloc(nq), *sc = dalloc((size_t)T * T);
        float *o32 = falloc(nc), *att32 = falloc(na), *dq32 = falloc(nq),
              *sc32 = falloc((size_t)T * T);
        dl_attention_fwd_f64(o, C, att, qkv, qkv + C, qkv + 2 * C, 3 * C, B, T, NH, HS);
        dl_attention_fwd_f32(o32, C, att32, qkv32, qkv32 + C, qkv32 + 2 * C, 3 * C, B, T, NH, HS);
        dl_attention_bwd_f64(dq, dq + C, dq + 2 * C, sc, d, C, qkv, qkv + C, qkv + 2 * C, 3 * C,
                             att, B, T, NH, HS);
        dl_attention_bwd_f32(dq32, dq32 + C, dq32 + 2 * C, sc32, d32, C, qkv32, qkv32 + C,
                             qkv32 + 2 * C, 3 * C, att32, B, T, NH, HS);
        CHECK_AGREE("attention fwd", rel32(o32, o, nc));
        CHECK_AGREE("attention probabilities", rel32(att32, att, na));
        CHECK_AGREE("attention bwd", rel32(dq32, dq, nq));
    }
    /* cross-entropy */
    {
        size_t nl = N * V;
        int *tgt = xalloc(N * sizeof(int));
        for (size_t i = 0; i < N; i++) tgt[i] = (int)((i * 3 + 1) % (size_t)V);
        double *l = drand(nl, -4, 4);
        round32(l, nl);
        float *l32 = to32(l, nl);
        double *p = dalloc(nl), *ls = dalloc(N), *d = dalloc(nl);
        float *p32 = falloc(nl), *ls32 = falloc(N), *d32 = falloc(nl);
        double m = dl_crossentropy_fwd_f64(p, ls, l, tgt, (int)N, V);
        double m32 = dl_crossentropy_fwd_f32(p32, ls32, l32, tgt, (int)N, V);
        dl_crossentropy_bwd_f64(d, p, tgt, 1.0 / N, (int)N, V);
        dl_crossentropy_bwd_f32(d32, p32, tgt, 1.0f / N, (int)N, V);
        CHECK_AGREE("crossentropy mean", fabs(m32 - m) / m);
        CHECK_AGREE("crossentropy losses", rel32(ls32, ls, N));
        CHECK_AGREE("crossentropy probs", rel32(p32, p, nl));
        CHECK_AGREE("crossentropy bwd", rel32(d32, d, nl));
    }
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* a tiny GPT composed from the ops (f64)                                                       */

enum {
    K_LN1W,
    K_LN1B,
    K_QKVW,
    K_QKVB,
    K_PROJW,
    K_PROJB,
    K_LN2W,
    K_LN2B,
    K_FCW,
    K_FCB,
    K_FC2W,
    K_FC2B,
    K_PER_LAYER
};
#define TM_MAXT 64

typedef struct tiny {
    int V, maxT, C, NH, L, B, T;
    int nt; /* tensors: wte, wpe, L x K_PER_LAYER, lnfw, lnfb, head */
    size_t off[TM_MAXT], len[TM_MAXT], np;
    double *params, *grads;
    int *tok, *tgt;
    /* activations */
    double **x; /* L + 1 residual-stream tensors (N, C) */
    double **ln1, **m1, **r1, **qkv, **att, **atty, **xmid, **ln2, **m2, **r2, **h, **hg;
    double *lnf, *mf, *rf, *logits;
    /* activation gradients and scratch */
    double *dlogits, *dlnf, *dres, *dh, *dhg, *dln, *datty, *dqkv, *scratch;
} tiny;

static double *tp(tiny *m, int t) { return m->params + m->off[t]; }
static double *tg(tiny *m, int t) { return m->grads + m->off[t]; }
static int tl(int l, int k) { return 2 + l * K_PER_LAYER + k; }

static void tiny_init(tiny *m, uint64_t seed, int V, int C, int NH, int L, int B, int T)
{
    memset(m, 0, sizeof *m);
    m->V = V, m->maxT = T + 1, m->C = C, m->NH = NH, m->L = L, m->B = B, m->T = T;
    size_t per[K_PER_LAYER] = {C, C, 3 * C * C, 3 * C, C * C,     C,
                               C, C, 4 * C * C, 4 * C, 4 * C * C, C};
    int t = 0;
    m->len[t++] = (size_t)V * C;
    m->len[t++] = (size_t)m->maxT * C;
    for (int l = 0; l < L; l++)
        for (int k = 0; k < K_PER_LAYER; k++) m->len[t++] = per[k];
    m->len[t++] = C;
    m->len[t++] = C;
    m->len[t++] = (size_t)V * C;
    m->nt = t;
    for (int i = 0; i < t; i++) m->off[i] = m->np, m->np += m->len[i];
    m->params = drand_s(m->np, -0.4, 0.4, &seed);
    m->grads = dalloc(m->np);
    /* LayerNorm weights near 1 */
    int lnw[2] = {K_LN1W, K_LN2W};
    for (int l = 0; l < L; l++)
        for (int j = 0; j < 2; j++)
            for (int c = 0; c < C; c++) tp(m, tl(l, lnw[j]))[c] += 1.0;
    for (int c = 0; c < C; c++) tp(m, m->nt - 3)[c] += 1.0;
    size_t N = (size_t)B * T;
    m->tok = xalloc(N * sizeof(int)), m->tgt = xalloc(N * sizeof(int));
    for (size_t i = 0; i < N; i++) {
        m->tok[i] = (int)(tu_rand_u64(seed, 1, i) % (uint64_t)V);
        m->tgt[i] = (int)(tu_rand_u64(seed, 2, i) % (uint64_t)V);
    }
    double ***acts[] = {&m->ln1,  &m->m1,  &m->r1, &m->qkv, &m->att, &m->atty,
                        &m->xmid, &m->ln2, &m->m2, &m->r2,  &m->h,   &m->hg};
    size_t sz[] = {N * C, N, N,         N * 3 * C, (size_t)B * NH * T * T, N * C, N * C, N * C,
                   N,     N, N * 4 * C, N * 4 * C};
    m->x = xalloc((size_t)(L + 1) * sizeof(double *));
    for (int l = 0; l <= L; l++) m->x[l] = dalloc(N * C);
    for (size_t a = 0; a < sizeof sz / sizeof sz[0]; a++) {
        *acts[a] = xalloc((size_t)L * sizeof(double *));
        for (int l = 0; l < L; l++) (*acts[a])[l] = dalloc(sz[a]);
    }
    m->lnf = dalloc(N * C), m->mf = dalloc(N), m->rf = dalloc(N), m->logits = dalloc(N * V);
    m->dlogits = dalloc(N * V), m->dlnf = dalloc(N * C), m->dres = dalloc(N * C);
    m->dh = dalloc(N * 4 * C), m->dhg = dalloc(N * 4 * C), m->dln = dalloc(N * C);
    m->datty = dalloc(N * C), m->dqkv = dalloc(N * 3 * C), m->scratch = dalloc((size_t)T * T);
}

static double tiny_forward(tiny *m)
{
    int B = m->B, T = m->T, C = m->C, N = B * T, NH = m->NH, HS = C / NH;
    dl_encoder_fwd_f64(m->x[0], m->tok, tp(m, 0), tp(m, 1), B, T, C);
    for (int l = 0; l < m->L; l++) {
        dl_layernorm_fwd_f64(m->ln1[l], m->m1[l], m->r1[l], m->x[l], tp(m, tl(l, K_LN1W)),
                             tp(m, tl(l, K_LN1B)), N, C);
        dl_linear_fwd_f64(m->qkv[l], m->ln1[l], tp(m, tl(l, K_QKVW)), tp(m, tl(l, K_QKVB)), N, C,
                          3 * C);
        dl_attention_fwd_f64(m->atty[l], C, m->att[l], m->qkv[l], m->qkv[l] + C, m->qkv[l] + 2 * C,
                             3 * C, B, T, NH, HS);
        dl_linear_fwd_f64(m->xmid[l], m->atty[l], tp(m, tl(l, K_PROJW)), tp(m, tl(l, K_PROJB)), N,
                          C, C);
        dl_residual_fwd_f64(m->xmid[l], m->xmid[l], m->x[l], (size_t)N * C);
        dl_layernorm_fwd_f64(m->ln2[l], m->m2[l], m->r2[l], m->xmid[l], tp(m, tl(l, K_LN2W)),
                             tp(m, tl(l, K_LN2B)), N, C);
        dl_linear_fwd_f64(m->h[l], m->ln2[l], tp(m, tl(l, K_FCW)), tp(m, tl(l, K_FCB)), N, C,
                          4 * C);
        dl_gelu_fwd_f64(m->hg[l], m->h[l], (size_t)N * 4 * C);
        dl_linear_fwd_f64(m->x[l + 1], m->hg[l], tp(m, tl(l, K_FC2W)), tp(m, tl(l, K_FC2B)), N,
                          4 * C, C);
        dl_residual_fwd_f64(m->x[l + 1], m->x[l + 1], m->xmid[l], (size_t)N * C);
    }
    dl_layernorm_fwd_f64(m->lnf, m->mf, m->rf, m->x[m->L], tp(m, m->nt - 3), tp(m, m->nt - 2), N,
                         C);
    dl_linear_fwd_f64(m->logits, m->lnf, tp(m, m->nt - 1), NULL, N, C, m->V);
    return dl_crossentropy_fwd_f64(m->logits, NULL, m->logits, m->tgt, N, m->V); /* in place */
}

static double tiny_loss(void *p) { return tiny_forward(p); }

/* Backward of the mean loss; parameter gradients accumulate into m->grads. llm.c's residual
 * trick: dres holds d(residual stream); each LayerNorm backward adds its branch into it. */
static void tiny_backward(tiny *m)
{
    int B = m->B, T = m->T, C = m->C, N = B * T, NH = m->NH, HS = C / NH;
    size_t nc = (size_t)N * C, n4 = nc * 4;
    dl_crossentropy_bwd_f64(m->dlogits, m->logits, m->tgt, 1.0 / N, N, m->V);
    memset(m->dlnf, 0, nc * sizeof(double));
    dl_linear_bwd_f64(m->dlnf, tg(m, m->nt - 1), NULL, m->dlogits, m->lnf, tp(m, m->nt - 1), N, C,
                      m->V);
    memset(m->dres, 0, nc * sizeof(double));
    dl_layernorm_bwd_f64(m->dres, tg(m, m->nt - 3), tg(m, m->nt - 2), m->dlnf, m->x[m->L],
                         tp(m, m->nt - 3), m->mf, m->rf, N, C);
    for (int l = m->L - 1; l >= 0; l--) {
        memset(m->dhg, 0, n4 * sizeof(double));
        dl_linear_bwd_f64(m->dhg, tg(m, tl(l, K_FC2W)), tg(m, tl(l, K_FC2B)), m->dres, m->hg[l],
                          tp(m, tl(l, K_FC2W)), N, 4 * C, C);
        memset(m->dh, 0, n4 * sizeof(double));
        dl_gelu_bwd_f64(m->dh, m->h[l], m->dhg, n4);
        memset(m->dln, 0, nc * sizeof(double));
        dl_linear_bwd_f64(m->dln, tg(m, tl(l, K_FCW)), tg(m, tl(l, K_FCB)), m->dh, m->ln2[l],
                          tp(m, tl(l, K_FCW)), N, C, 4 * C);
        dl_layernorm_bwd_f64(m->dres, tg(m, tl(l, K_LN2W)), tg(m, tl(l, K_LN2B)), m->dln,
                             m->xmid[l], tp(m, tl(l, K_LN2W)), m->m2[l], m->r2[l], N, C);
        memset(m->datty, 0, nc * sizeof(double));
        dl_linear_bwd_f64(m->datty, tg(m, tl(l, K_PROJW)), tg(m, tl(l, K_PROJB)), m->dres,
                          m->atty[l], tp(m, tl(l, K_PROJW)), N, C, C);
        memset(m->dqkv, 0, 3 * nc * sizeof(double));
        dl_attention_bwd_f64(m->dqkv, m->dqkv + C, m->dqkv + 2 * C, m->scratch, m->datty, C,
                             m->qkv[l], m->qkv[l] + C, m->qkv[l] + 2 * C, 3 * C, m->att[l], B, T,
                             NH, HS);
        memset(m->dln, 0, nc * sizeof(double));
        dl_linear_bwd_f64(m->dln, tg(m, tl(l, K_QKVW)), tg(m, tl(l, K_QKVB)), m->dqkv, m->ln1[l],
                          tp(m, tl(l, K_QKVW)), N, C, 3 * C);
        dl_layernorm_bwd_f64(m->dres, tg(m, tl(l, K_LN1W)), tg(m, tl(l, K_LN1B)), m->dln, m->x[l],
                             tp(m, tl(l, K_LN1W)), m->m1[l], m->r1[l], N, C);
    }
    dl_encoder_bwd_f64(tg(m, 0), tg(m, 1), m->dres, m->tok, B, T, C);
}

START_TEST(t_fd_tiny_model)
{
    tiny m;
    tiny_init(&m, 42, 32, 16, 2, 2, 2, DL_TEST_SMALL ? 6 : 11);
    double loss = tiny_forward(&m);
    ck_assert(isfinite(loss) && loss > 0);
    tiny_backward(&m);
    /* a second micro-batch on the same data doubles every gradient (accumulation) */
    double *g1 = dcopy(m.grads, m.np);
    tiny_forward(&m);
    tiny_backward(&m);
    double *g2 = dcopy(g1, m.np);
    for (size_t i = 0; i < m.np; i++) g2[i] *= 2;
    ck_assert_msg(rel64(m.grads, g2, m.np) <= 1e-14, "two micro-batches: %.3g",
                  rel64(m.grads, g2, m.np));
    double worst = 0;
    int worst_t = -1;
    for (int t = 0; t < m.nt; t++) {
        double e = fd_err(tiny_loss, &m, tp(&m, t), g1 + m.off[t], m.len[t], fd_step(m.len[t], 24));
        if (e > worst)
            worst = e, worst_t = t;
    }
    report("fd", "tiny model (worst tensor)", worst);
    ck_assert_msg(worst <= FD_TOL, "tiny model: tensor %d finite-difference error %.3g", worst_t,
                  worst);
    /* the unused position rows (t >= T) get no gradient */
    for (size_t i = (size_t)m.T * m.C; i < m.len[1]; i++) ck_assert(g1[m.off[1] + i] == 0.0);
}
END_TEST

/* Two rank threads run the same model at once, each on its own buffers: bitwise the serial
 * result (no shared state in the kernels; OpenBLAS with one thread per caller). */
#define THR_SEED 1000

typedef struct thr_arg {
    double loss[2];
    double *grads[2];
} thr_arg;

static void tiny_run3(tiny *m, double *loss)
{
    for (int it = 0; it < 3; it++) {
        memset(m->grads, 0, m->np * sizeof(double));
        *loss = tiny_forward(m);
        tiny_backward(m);
    }
}

static int thr_rank(dl_ctx *ctx, void *p)
{
    thr_arg *a = p;
    int r = dl_ctx_rank(ctx);
    tiny m;
    tiny_init(&m, THR_SEED, 32, 16, 2, 2, 2, DL_TEST_SMALL ? 6 : 11);
    tiny_run3(&m, &a->loss[r]);
    memcpy(a->grads[r], m.grads, m.np * sizeof(double));
    return DL_OK;
}

START_TEST(t_threads)
{
    tiny ref;
    double loss;
    tiny_init(&ref, THR_SEED, 32, 16, 2, 2, 2, DL_TEST_SMALL ? 6 : 11);
    tiny_run3(&ref, &loss);
    thr_arg a;
    a.grads[0] = dalloc(ref.np), a.grads[1] = dalloc(ref.np);
    int st = tu_run_world(2, thr_rank, &a);
    ck_assert_msg(st == DL_OK, "%s", dl_errmsg());
    for (int r = 0; r < 2; r++) {
        ck_assert_msg(a.loss[r] == loss, "rank %d loss %.17g vs serial %.17g", r, a.loss[r], loss);
        ck_assert_msg(memcmp(a.grads[r], ref.grads, ref.np * sizeof(double)) == 0,
                      "rank %d gradients differ from the serial run", r);
    }
}
END_TEST

/* ------------------------------------------------------------------------------------------ */

static Suite *ops_suite(void)
{
    Suite *s = suite_create("ops");
    TCase *tc = tcase_create("ops");
    tcase_set_timeout(tc, 120);
    tcase_add_checked_fixture(tc, NULL, free_all);
    tcase_add_test(tc, t_fd_encoder);
    tcase_add_loop_test(tc, t_fd_layernorm, 0, 2);
    tcase_add_loop_test(tc, t_fd_linear, 0, 2);
    tcase_add_test(tc, t_fd_gelu);
    tcase_add_test(tc, t_fd_residual);
    tcase_add_loop_test(tc, t_fd_attention, 0, 2);
    tcase_add_test(tc, t_fd_crossentropy);
    tcase_add_test(tc, t_attention_split);
    tcase_add_loop_test(tc, t_small_mm_levels, 0, 2);
    tcase_add_loop_test(tc, t_gemm_log_attention, 0, 2);
    tcase_add_test(tc, t_crossentropy_lse);
    tcase_add_test(tc, t_gelu_erf);
    tcase_add_test(tc, t_write_variants);
    tcase_add_test(tc, t_softmax_exp_range);
    tcase_add_loop_test(tc, t_adamw, 0, 2);
    tcase_add_test(tc, t_sumsq);
    tcase_add_test(tc, t_f32_vs_f64);
    tcase_add_test(tc, t_fd_tiny_model);
    tcase_add_test(tc, t_threads);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(ops_suite());
    srunner_run_all(sr, CK_ENV);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
