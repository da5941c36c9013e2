/* Kernels of the GPT trainer (see lib/model/ops.h for shapes and conventions).
 *
 * The kernels are written once, as a template on the element type: this file includes itself
 * twice with DL_OPS_BODY defined, once with `real` = float (suffix _f32) and once with
 * `real` = double (_f64), so both variants are real exported functions compiled from the same
 * text. Type-specific pieces (GEMM, exp, erf, sqrt, log) are small static inline functions
 * named x_f32 / x_f64 that the body reaches through FN(x).
 *
 * Speed: GEMMs are OpenBLAS; the elementwise loops are written so that gcc -O3 vectorises them
 * (no calls, no aliasing surprises); reductions use several partial sums (gcc may not reorder a
 * floating-point sum on its own). The f32 exp and the f32 normal CDF of the GeLU are call-free
 * polynomial versions (within a few ulp, tested against expl / erfl): glibc's erff alone cost
 * about 12 ns per element on typical activations. The f64 variants use libm's exp and erf: they
 * are the reference the tests check against. */
#ifndef DL_OPS_BODY
#include "config.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <time.h>

#include <cblas.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "model/ops.h"
#include "core/bf16.h"

#define DL_CAT2(a, b) a##b
#define DL_CAT(a, b) DL_CAT2(a, b)
#define FN(name) DL_CAT(name, SFX)

/* The f32 GeLU is compute-bound (polynomial + exp per element): build it also for AVX2 and let
 * the loader pick (ifunc), so a portable build runs it 4-5x faster where AVX2 exists. Without
 * FMA contraction (-std=c11 implies -ffp-contract=off) both clones give bitwise equal results.
 * The other elementwise and row kernels (LayerNorm, softmax glue of the attention, bias,
 * residual, cross-entropy, AdamW) are cloned too: gcc vectorises only what keeps the scalar
 * order of every floating-point operation, so each clone computes bitwise the same values. */
/* Not under the sanitizers: their runtimes are not initialised when the loader runs the ifunc
 * resolvers of an instrumented library (TSan crashed at start-up in every test). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__has_attribute) && \
    !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
#if __has_attribute(target_clones)
#define DL_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#endif
#ifndef DL_CLONES
#define DL_CLONES
#endif

/* Contract a * b + c into one FMA where the target has it (the AVX2 and AVX-512 clones): the
 * polynomials of exp, erf and the row kernels run about a third faster, and each FMA rounds once
 * instead of twice. (gcc's ISO C modes default to -ffp-contract=off.) */
#pragma GCC optimize("fp-contract=fast")

/* ---- which kernel runs the attention's small products (see small_mm) ---- */

#if defined(__GNUC__) && defined(__x86_64__)
#define MM_KERNELS 1
#endif

/* the level in use: resolved once (the CPU, capped by DISTLAB_SMALL_MM), then read per call */
static _Atomic int mm_active = -1;

static int mm_hw_level(void)
{
#ifdef MM_KERNELS
    if (__builtin_cpu_supports("avx512f"))
        return 2;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return 1;
#endif
    return 0;
}

int dl_ops_small_mm_cap(int cap)
{
    int hw = mm_hw_level(), l = cap >= 0 && cap < hw ? cap : hw;
    atomic_store_explicit(&mm_active, l, memory_order_relaxed);
    return l;
}

static int mm_level(void)
{
    int l = atomic_load_explicit(&mm_active, memory_order_relaxed);
    if (l < 0) {
        const char *e = getenv("DISTLAB_SMALL_MM");
        l = dl_ops_small_mm_cap(!e ? -1 : !strcmp(e, "blas") ? 0 : !strcmp(e, "avx2") ? 1 : -1);
    }
    return l;
}

/* ---- GEMM shape log (for the trainer's GEMM-utilisation figure) ---- */

static _Thread_local dl_gemm_log *gemm_log;

void dl_ops_gemm_log(dl_gemm_log *log) { gemm_log = log; }

static void log_gemm(dl_gemm_shape key)
{
    dl_gemm_log *l = gemm_log;
    key.count = 0;
    for (int i = 0; i < l->n; i++) {
        dl_gemm_shape *s = &l->s[i];
        if (s->ta == key.ta && s->tb == key.tb && s->M == key.M && s->N == key.N && s->K == key.K &&
            s->kernel == key.kernel && s->lda == key.lda && s->ldb == key.ldb &&
            s->ldc == key.ldc && s->zero_beta == key.zero_beta) {
            s->count++;
            return;
        }
    }
    key.count = 1;
    if (l->n < DL_GEMM_LOG_MAX)
        l->s[l->n++] = key;
    else
        l->dropped++;
}

#define LOG_GEMM(kern, ta, tb, M, N, K, lda, ldb, ldc, beta)                                       \
    do {                                                                                           \
        if (gemm_log)                                                                              \
            log_gemm((dl_gemm_shape){ta, tb, M, N, K, 0, kern, lda, ldb, ldc, (beta) == 0});       \
    } while (0)

/* ---- type-specific helpers ---- */

static inline void gemm_f32(int ta, int tb, int M, int N, int K, float alpha, const float *A,
                            int lda, const float *Bm, int ldb, float beta, float *Cm, int ldc)
{
    LOG_GEMM(DL_GEMM_BLAS, ta, tb, M, N, K, lda, ldb, ldc, beta);
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
                K, alpha, A, lda, Bm, ldb, beta, Cm, ldc);
}

static inline void gemm_f64(int ta, int tb, int M, int N, int K, double alpha, const double *A,
                            int lda, const double *Bm, int ldb, double beta, double *Cm, int ldc)
{
    LOG_GEMM(DL_GEMM_BLAS, ta, tb, M, N, K, lda, ldb, ldc, beta);
    cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
                K, alpha, A, lda, Bm, ldb, beta, Cm, ldc);
}

/* f32 exp without a call, so that the loops around it vectorise (softmax, cross-entropy, GeLU).
 * Cody-Waite reduction x = n ln2 + r (ln2 in two parts, the first exact in 9 bits), Cephes'
 * degree-7 polynomial for e^r on |r| <= ln2/2 (about 1 ulp), 2^n built in the exponent bits.
 * Inputs are clamped to [-87, 88] (e^-87 ~ 1.6e-38 stands in for smaller results). */
static inline float exp_f32(float x)
{
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    float n = x * 1.44269504088896341f;
    n = (n + 12582912.0f) - 12582912.0f; /* round to nearest: 1.5 * 2^23 */
    n = n == n ? n : 0.0f; /* NaN passes the clamps: keep the shift below defined; r carries it */
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union {
        int32_t i;
        float f;
    } e = {.i = ((int32_t)n + 127) << 23};
    return p * e.f;
}
static inline double exp_f64(double x) { return exp(x); }

/* Φ(x), the standard normal CDF, in f32 without calls (the exact-erf GeLU's hot part), and
 * *e = exp(-x²/2) for the derivative. erfc(|z|) = exp(-z²) R(t), z = x/√2, t = 1/(1 + 0.4|z|),
 * R = erfcx a degree-10 polynomial in u = t - 0.647... (Chebyshev fit on |z| <= 6, relative
 * error 5e-10, so float rounding dominates); Φ = 1 - erfc/2 for x >= 0, erfc/2 for x < 0, which
 * keeps relative accuracy in the left tail. Checked against erfl in tests/unit/model/test_ops.c. */
static inline float phi_f32(float x, float *e)
{
    float z = (x < 0 ? -x : x) * 0.70710678118654752f;
    z = z < 6.0f ? z : 6.0f;
    float u = 1.0f / (1.0f + 0.4f * z) - 0.647058823529411765f;
    float R = -0.0415353664288f;
    R = R * u + -0.001873117687f;
    R = R * u + 0.0988768073748f;
    R = R * u + -0.00989820693462f;
    R = R * u + -0.235782290861f;
    R = R * u + -0.0587503366432f;
    R = R * u + 0.667786813221f;
    R = R * u + 1.39132533836f;
    R = R * u + 1.53376585065f;
    R = R * u + 1.11285052802f;
    R = R * u + 0.345402047656f;
    float ex = exp_f32(-0.5f * x * x);
    float h = 0.5f * ex * R; /* erfc(|z|) / 2 */
    *e = ex;
    return x >= 0 ? 1.0f - h : h;
}
static inline float log_f32(float x) { return logf(x); }
static inline double log_f64(double x) { return log(x); }
static inline float sqrt_f32(float x) { return sqrtf(x); }
static inline double sqrt_f64(double x) { return sqrt(x); }

/* y[i] = sqrt(x[i]) for i < n, vectorised. gcc does not vectorise sqrtf/sqrt under the default
 * -fmath-errno (the errno path is a call), and the optimize attribute does not change that, so
 * x86-64 uses SSE2's sqrtps/sqrtpd (IEEE correctly rounded: bitwise sqrtf / sqrt). */
static inline void vsqrt_f32(float *restrict y, const float *restrict x, int n)
{
    int i = 0;
#if defined(__SSE2__)
    for (; i + 4 <= n; i += 4) _mm_storeu_ps(y + i, _mm_sqrt_ps(_mm_loadu_ps(x + i)));
#endif
    for (; i < n; i++) y[i] = sqrtf(x[i]);
}
static inline void vsqrt_f64(double *restrict y, const double *restrict x, int n)
{
    int i = 0;
#if defined(__SSE2__)
    for (; i + 2 <= n; i += 2) _mm_storeu_pd(y + i, _mm_sqrt_pd(_mm_loadu_pd(x + i)));
#endif
    for (; i < n; i++) y[i] = sqrt(x[i]);
}

#define DL_OPS_BODY 1
#define real float
#define SFX _f32
#define DL_OPS_F32 1
#include "ops.c"
#undef real
#undef SFX
#undef DL_OPS_F32
#define real double
#define SFX _f64
#define DL_OPS_F32 0
#include "ops.c"
#undef real
#undef SFX
#undef DL_OPS_F32

/* ---- replaying a GEMM log (the trainer's GEMM-utilisation reference) ---- */

/* elements a row-major rows x cols operand spans at stride ld (0: packed) */
static size_t span(int rows, int cols, int ld)
{
    return rows > 0 ? (size_t)(rows - 1) * (size_t)(ld > 0 ? ld : cols) + (size_t)cols : 0;
}

double dl_ops_gemm_replay(const dl_gemm_log *log, int dsize, int reps)
{
    size_t amax = 1, bmax = 1, cmax = 1;
    for (int i = 0; i < log->n; i++) {
        const dl_gemm_shape *s = &log->s[i];
        size_t a = s->ta ? span(s->K, s->M, s->lda) : span(s->M, s->K, s->lda);
        size_t b = s->tb ? span(s->N, s->K, s->ldb) : span(s->K, s->N, s->ldb);
        size_t c = span(s->M, s->N, s->ldc);
        amax = a > amax ? a : amax, bmax = b > bmax ? b : bmax, cmax = c > cmax ? c : cmax;
    }
    size_t es = dsize == 8 ? 8 : 4;
    void *A = calloc(amax, es), *B = calloc(bmax, es), *C = calloc(cmax, es);
    double best = 0;
    for (int r = 0; A && B && C && r < (reps < 1 ? 1 : reps); r++) {
        struct timespec t0, t1;
        double flops = 0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (int i = 0; i < log->n; i++) {
            const dl_gemm_shape *s = &log->s[i];
            if (dsize == 8)
                replay_shape_f64(s, A, B, C);
            else
                replay_shape_f32(s, A, B, C);
            flops += 2.0 * s->M * s->N * s->K * (double)s->count;
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double sec = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        double g = sec > 0 ? flops / sec / 1e9 : 0;
        best = g > best ? g : best;
    }
    free(A), free(B), free(C);
    return best;
}

/* ---- bf16 arrays (mixed precision): the rounding of core/bf16.h (nearest even, NaN kept) ---- */

void dl_bf16_from_f32(uint16_t *restrict dst, const float *restrict src, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = dl__bf16_round(src[i]);
}

void dl_bf16_widen(float *restrict dst, const uint16_t *restrict src, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = dl__bf16_widen(src[i]);
}

void dl_bf16_acc_f32(uint16_t *restrict dst, const float *restrict src, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] = dl__bf16_round(dl__bf16_widen(dst[i]) + src[i]);
}

void dl_bf16_acc(uint16_t *dst, const uint16_t *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = dl__bf16_round(dl__bf16_widen(dst[i]) + dl__bf16_widen(src[i]));
}

double dl_sumsq_bf16(const uint16_t *x, size_t n)
{
    double s[4] = {0, 0, 0, 0};
    size_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int l = 0; l < 4; l++) {
            double v = dl__bf16_widen(x[i + l]);
            s[l] += v * v;
        }
    double r = (s[0] + s[1]) + (s[2] + s[3]);
    for (; i < n; i++) {
        double v = dl__bf16_widen(x[i]);
        r += v * v;
    }
    return r;
}

void dl_adamw_bf16(float *master, const uint16_t *grad, float *m, float *v, size_t n, float lr,
                   float beta1, float beta2, float eps, float wd, float grad_scale, long step,
                   uint16_t *param)
{
    float g[512];
    for (size_t i0 = 0; i0 < n; i0 += 512) {
        size_t len = n - i0 < 512 ? n - i0 : 512;
        dl_bf16_widen(g, grad + i0, len);
        /* element by element the f32 AdamW's arithmetic: the master weights of a bf16 run are
         * those an f32 AdamW computes from the same (bf16-valued) gradients */
        dl_adamw_f32(master + i0, g, m + i0, v + i0, len, lr, beta1, beta2, eps, wd, grad_scale,
                     step);
        if (param)
            dl_bf16_from_f32(param + i0, master + i0, len);
    }
}

#else /* DL_OPS_BODY: everything below is compiled once per type */

/* ---- reductions with 8 partial sums (vectorisable, and a little more accurate) ---- */

static inline real FN(vsum)(const real *x, int n)
{
    real s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) s[l] += x[i + l];
    real r = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; i < n; i++) r += x[i];
    return r;
}

/* Σ (x - m)² */
static inline real FN(vsumsqdev)(const real *x, real m, int n)
{
    real s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) {
            real d = x[i + l] - m;
            s[l] += d * d;
        }
    real r = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; i < n; i++) r += (x[i] - m) * (x[i] - m);
    return r;
}

static inline real FN(vdot)(const real *x, const real *y, int n)
{
    real s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) s[l] += x[i + l] * y[i + l];
    real r = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; i < n; i++) r += x[i] * y[i];
    return r;
}

/* 8 partial maxima, so that it vectorises (a max is exact: the same result in any order) */
static inline real FN(vmax)(const real *x, int n)
{
    real s[8] = {x[0], x[0], x[0], x[0], x[0], x[0], x[0], x[0]};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) s[l] = x[i + l] > s[l] ? x[i + l] : s[l];
    real m = s[0];
    for (int l = 1; l < 8; l++) m = s[l] > m ? s[l] : m;
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

/* x[i] = exp(x[i] - m) for i < n; returns the sum. In place so the caller's row is reused. */
static inline real FN(vexp_sum)(real *x, real m, int n)
{
    for (int i = 0; i < n; i++) x[i] = FN(exp)(x[i] - m);
    return FN(vsum)(x, n);
}

/* ---- encoder ---- */

void FN(dl_encoder_fwd)(real *out, const int *tokens, const real *wte, const real *wpe, int B,
                        int T, int C)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            real *o = out + ((size_t)b * T + t) * C;
            const real *we = wte + (size_t)tokens[b * T + t] * C, *pe = wpe + (size_t)t * C;
            for (int c = 0; c < C; c++) o[c] = we[c] + pe[c];
        }
}

DL_CLONES
void FN(dl_encoder_bwd)(real *dwte, real *dwpe, const real *dout, const int *tokens, int B, int T,
                        int C)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const real *d = dout + ((size_t)b * T + t) * C;
            real *we = dwte + (size_t)tokens[b * T + t] * C, *pe = dwpe + (size_t)t * C;
            for (int c = 0; c < C; c++) {
                we[c] += d[c];
                pe[c] += d[c];
            }
        }
}

/* ---- layernorm ---- */

/* not cloned: its AVX-512 clone ran slower (1.05 vs 0.66 ms for 9 calls of 1024 x 256) */
void FN(dl_layernorm_fwd)(real *restrict out, real *restrict mean, real *restrict rstd,
                          const real *restrict inp, const real *restrict w, const real *restrict b,
                          int N, int C)
{
    for (int n = 0; n < N; n++) {
        const real *x = inp + (size_t)n * C;
        real *o = out + (size_t)n * C;
        /* two passes: the variance of the centred values, not E[x²] - m², which cancels */
        real m = FN(vsum)(x, C) / (real)C;
        real var = FN(vsumsqdev)(x, m, C) / (real)C;
        real s = (real)1 / FN(sqrt)(var + (real)DL_LN_EPS);
        for (int c = 0; c < C; c++) o[c] = (x[c] - m) * s * w[c] + b[c];
        mean[n] = m;
        rstd[n] = s;
    }
}

DL_CLONES
void FN(dl_layernorm_bwd)(real *restrict dinp, real *restrict dw, real *restrict db,
                          const real *restrict dout, const real *restrict inp,
                          const real *restrict w, const real *mean, const real *rstd, int N, int C)
{
    for (int n = 0; n < N; n++) {
        const real *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
        real *dx = dinp + (size_t)n * C;
        real m = mean[n], s = rstd[n];
        /* y = w * xhat + b; dL/dx = s * (g - mean(g) - xhat * mean(g * xhat)), g = w * dout */
        real sg[8] = {0, 0, 0, 0, 0, 0, 0, 0}, sgx[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int c = 0;
        for (; c + 8 <= C; c += 8)
            for (int l = 0; l < 8; l++) {
                real g = w[c + l] * d[c + l];
                sg[l] += g;
                sgx[l] += g * ((x[c + l] - m) * s);
            }
        real g_mean = ((sg[0] + sg[1]) + (sg[2] + sg[3])) + ((sg[4] + sg[5]) + (sg[6] + sg[7]));
        real gx_mean =
            ((sgx[0] + sgx[1]) + (sgx[2] + sgx[3])) + ((sgx[4] + sgx[5]) + (sgx[6] + sgx[7]));
        for (; c < C; c++) {
            real g = w[c] * d[c];
            g_mean += g;
            gx_mean += g * ((x[c] - m) * s);
        }
        g_mean /= (real)C;
        gx_mean /= (real)C;
        for (c = 0; c < C; c++) {
            real xh = (x[c] - m) * s;
            db[c] += d[c];
            dw[c] += xh * d[c];
            dx[c] += (w[c] * d[c] - g_mean - xh * gx_mean) * s;
        }
    }
}

/* ---- linear ---- */

void FN(dl_linear_fwd)(real *out, const real *inp, const real *W, const real *bias, int N, int IC,
                       int OC)
{
    /* bias first, then the GEMM accumulates onto it (beta = 1): no second pass over out */
    if (bias) {
        for (int n = 0; n < N; n++) memcpy(out + (size_t)n * OC, bias, (size_t)OC * sizeof(real));
    }
    FN(gemm)(0, 1, N, OC, IC, (real)1, inp, IC, W, IC, bias ? (real)1 : (real)0, out, OC);
}

/* beta_inp: 1 accumulates into dinp, 0 writes it */
DL_CLONES
static void FN(linear_bwd)(real *dinp, real beta_inp, real *dW, real *dbias, const real *dout,
                           const real *inp, const real *W, int N, int IC, int OC)
{
    if (dinp)
        FN(gemm)(0, 0, N, IC, OC, (real)1, dout, OC, W, IC, beta_inp, dinp, IC);
    if (dW)
        FN(gemm)(1, 0, OC, IC, N, (real)1, dout, OC, inp, IC, (real)1, dW, IC);
    if (dbias) {
        for (int n = 0; n < N; n++) {
            const real *d = dout + (size_t)n * OC;
            for (int o = 0; o < OC; o++) dbias[o] += d[o];
        }
    }
}

void FN(dl_linear_bwd)(real *dinp, real *dW, real *dbias, const real *dout, const real *inp,
                       const real *W, int N, int IC, int OC)
{
    FN(linear_bwd)(dinp, (real)1, dW, dbias, dout, inp, W, N, IC, OC);
}

/* With beta = 0 the GEMM writes dinp: OpenBLAS clears C itself before accumulating (its own
 * pass, so this saves the caller's memset but not the traffic), and 0 + x == x exactly. */
void FN(dl_linear_bwd_write)(real *dinp, real *dW, real *dbias, const real *dout, const real *inp,
                             const real *W, int N, int IC, int OC)
{
    FN(linear_bwd)(dinp, (real)0, dW, dbias, dout, inp, W, N, IC, OC);
}

/* ---- GeLU (exact, erf) ---- */

#if DL_OPS_F32
DL_CLONES
#endif
void FN(dl_gelu_fwd)(real *out, const real *inp, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        real x = inp[i];
#if DL_OPS_F32
        float e;
        out[i] = x * phi_f32(x, &e);
#else
        out[i] = 0.5 * x * (1.0 + erf(x * 0.70710678118654752440));
#endif
    }
}

#if DL_OPS_F32
DL_CLONES
#endif
void FN(dl_gelu_bwd)(real *restrict dinp, const real *restrict inp, const real *restrict dout,
                     size_t n)
{
    const real rpi = (real)0.39894228040143267794; /* 1/√(2π) */
    for (size_t i = 0; i < n; i++) {
        real x = inp[i];
#if DL_OPS_F32
        float e;
        float cdf = phi_f32(x, &e);
#else
        double cdf = 0.5 * (1.0 + erf(x * 0.70710678118654752440));
        double e = exp(-0.5 * x * x);
#endif
        dinp[i] += (cdf + x * rpi * e) * dout[i];
    }
}

/* The derivative is stored where the pre-activation was (deriv may alias inp): ivdep tells gcc
 * that the in-place case has no loop-carried dependence, so it vectorises without an alias
 * check that would fail for equal pointers. */
#if DL_OPS_F32
DL_CLONES
#endif
void FN(dl_gelu_fwd_deriv)(real *out, real *deriv, const real *inp, size_t n)
{
    const real rpi = (real)0.39894228040143267794; /* 1/√(2π) */
#pragma GCC ivdep
    for (size_t i = 0; i < n; i++) {
        real x = inp[i];
#if DL_OPS_F32
        float e;
        float cdf = phi_f32(x, &e);
        out[i] = x * cdf;
#else
        /* the expressions of dl_gelu_fwd and dl_gelu_bwd, so the results are bitwise theirs */
        double E = erf(x * 0.70710678118654752440);
        out[i] = 0.5 * x * (1.0 + E);
        double cdf = 0.5 * (1.0 + E);
        double e = exp(-0.5 * x * x);
#endif
        deriv[i] = cdf + x * rpi * e;
    }
}

DL_CLONES
void FN(dl_gelu_bwd_deriv)(real *dinp, real *dbias, const real *deriv, const real *dout, int N,
                           int C)
{
    for (int n = 0; n < N; n++) {
        real *d = dinp + (size_t)n * C;
        const real *g = deriv + (size_t)n * C, *u = dout + (size_t)n * C;
#pragma GCC ivdep
        for (int c = 0; c < C; c++) d[c] = g[c] * u[c];
        if (dbias) {
            for (int c = 0; c < C; c++) dbias[c] += d[c];
        }
    }
}

/* ---- residual ---- */

DL_CLONES
void FN(dl_residual_fwd)(real *out, const real *a, const real *b, size_t n)
{
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

DL_CLONES
void FN(dl_residual_bias_fwd)(real *out, const real *a, const real *bias, const real *res, int N,
                              int C)
{
    for (int n = 0; n < N; n++) {
        real *o = out + (size_t)n * C;
        const real *x = a + (size_t)n * C, *r = res + (size_t)n * C;
#pragma GCC ivdep
        for (int c = 0; c < C; c++) o[c] = (x[c] + bias[c]) + r[c];
    }
}

DL_CLONES
void FN(dl_residual_bwd)(real *da, real *db, const real *dout, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        da[i] += dout[i];
        db[i] += dout[i];
    }
}

/* ---- the attention's small matrix products ---- */

/* The attention's per-head products are small (a block of 32 query rows by up to T keys by the
 * head size): cblas_sgemm spends about as long there in per-call set-up and packing as in its
 * kernel (100-110 GFLOP/s hot on this host, against 125 on the linear layers' shapes). So on
 * x86-64 they run here: a tile of C in registers (AVX-512: 4 rows by 4 vectors of 16 floats;
 * AVX2: 6 rows by 2 vectors of 8, Haswell's register budget), B's rows streamed once per tile,
 * op(A)'s elements broadcast. Measured alone on the benchmark model's shapes: 204-268 GFLOP/s
 * (AVX-512) and 106-128 (AVX2) against 99-110 for cblas_sgemm. Every element of C sums its K
 * products in order k = 0, 1, ... by the same operations (one FMA each in optimised builds) in
 * whichever lane or tile holds it, so the two kernels give bitwise the same results. Other CPUs
 * use the BLAS. */
#ifdef MM_KERNELS

/* C[0:ROWS, 0:NV·VL] = alpha · op(A) B + beta · C (beta 0: C is not read) */
#define MM_TILE(VT, VL, TA, ROWS, NV)                                                              \
    do {                                                                                           \
        VT acc[ROWS][NV], bv[NV];                                                                  \
        for (int r = 0; r < ROWS; r++)                                                             \
            for (int v = 0; v < NV; v++) acc[r][v] = (VT){0};                                      \
        for (int k = 0; k < K; k++) {                                                              \
            const real *b = B + (size_t)k * ldb;                                                   \
            for (int v = 0; v < NV; v++) bv[v] = *(const VT *)(b + v * VL);                        \
            for (int r = 0; r < ROWS; r++) {                                                       \
                real a = TA ? A[(size_t)k * lda + r] : A[(size_t)r * lda + k];                     \
                for (int v = 0; v < NV; v++) acc[r][v] += a * bv[v];                               \
            }                                                                                      \
        }                                                                                          \
        for (int r = 0; r < ROWS; r++)                                                             \
            for (int v = 0; v < NV; v++) {                                                         \
                VT *cp = (VT *)(C + (size_t)r * ldc + v * VL), x = alpha * acc[r][v];              \
                if (beta != 0)                                                                     \
                    x += beta * *cp;                                                               \
                *cp = x;                                                                           \
            }                                                                                      \
    } while (0)

/* columns [j, j + NV·VL) of every row: tiles of RT rows, then single rows */
#define MM_COLS(VT, VL, TA, RT, NV)                                                                \
    do {                                                                                           \
        int i = 0;                                                                                 \
        for (; i + RT <= M; i += RT) {                                                             \
            const real *A = A0 + (TA ? (size_t)i : (size_t)i * lda), *B = B0 + j;                  \
            real *C = C0 + (size_t)i * ldc + j;                                                    \
            MM_TILE(VT, VL, TA, RT, NV);                                                           \
        }                                                                                          \
        for (; i < M; i++) {                                                                       \
            const real *A = A0 + (TA ? (size_t)i : (size_t)i * lda), *B = B0 + j;                  \
            real *C = C0 + (size_t)i * ldc + j;                                                    \
            MM_TILE(VT, VL, TA, 1, NV);                                                            \
        }                                                                                          \
        j += NV * VL;                                                                              \
    } while (0)

/* the last N mod VL columns, row by row, in one vector whose unused lanes are zero: each element
 * is the same chain of operations as in a tile, so the kernels agree bitwise whatever the
 * compiler fuses (gcc contracts a * b + c into FMA at -O2, not at -O1, and left a scalar tail
 * loop unfused at -O2 once it vectorised it with masks) */
#define MM_TAIL(VT, VL)                                                                            \
    for (int i = 0, w = N - j; i < M && w > 0; i++) {                                              \
        VT acc = (VT){0}, bv;                                                                      \
        for (int k = 0; k < K; k++) {                                                              \
            real a = ta ? A0[(size_t)k * lda + i] : A0[(size_t)i * lda + k];                       \
            bv = (VT){0};                                                                          \
            memcpy(&bv, B0 + (size_t)k * ldb + j, (size_t)w * sizeof(real));                       \
            acc += a * bv;                                                                         \
        }                                                                                          \
        VT x = alpha * acc, cv = (VT){0};                                                          \
        real *c = C0 + (size_t)i * ldc + j;                                                        \
        if (beta != 0) {                                                                           \
            memcpy(&cv, c, (size_t)w * sizeof(real));                                              \
            x += beta * cv;                                                                        \
        }                                                                                          \
        memcpy(c, &x, (size_t)w * sizeof(real));                                                   \
    }

#define MM_ARGS                                                                                    \
    int ta, int M, int N, int K, real alpha, const real *A0, int lda, const real *B0, int ldb,     \
        real beta, real *C0, int ldc

typedef real FN(v64) __attribute__((vector_size(64), aligned(sizeof(real)), may_alias));
typedef real FN(v32) __attribute__((vector_size(32), aligned(sizeof(real)), may_alias));
#define VL64 ((int)(64 / sizeof(real)))
#define VL32 ((int)(32 / sizeof(real)))

__attribute__((target("avx512f"))) static void FN(small_mm_512)(MM_ARGS)
{
    int j = 0;
    if (ta) {
        for (; j + 4 * VL64 <= N;) MM_COLS(FN(v64), VL64, 1, 4, 4);
        if (j + 2 * VL64 <= N)
            MM_COLS(FN(v64), VL64, 1, 4, 2);
        if (j + VL64 <= N)
            MM_COLS(FN(v64), VL64, 1, 4, 1);
    } else {
        for (; j + 4 * VL64 <= N;) MM_COLS(FN(v64), VL64, 0, 4, 4);
        if (j + 2 * VL64 <= N)
            MM_COLS(FN(v64), VL64, 0, 4, 2);
        if (j + VL64 <= N)
            MM_COLS(FN(v64), VL64, 0, 4, 1);
    }
    MM_TAIL(FN(v64), VL64)
}

__attribute__((target("avx2,fma"))) static void FN(small_mm_256)(MM_ARGS)
{
    int j = 0;
    if (ta) {
        for (; j + 2 * VL32 <= N;) MM_COLS(FN(v32), VL32, 1, 6, 2);
        if (j + VL32 <= N)
            MM_COLS(FN(v32), VL32, 1, 6, 1);
    } else {
        for (; j + 2 * VL32 <= N;) MM_COLS(FN(v32), VL32, 0, 6, 2);
        if (j + VL32 <= N)
            MM_COLS(FN(v32), VL32, 0, 6, 1);
    }
    MM_TAIL(FN(v32), VL32)
}
#undef VL64
#undef VL32
#undef MM_ARGS
#undef MM_TILE
#undef MM_COLS
#undef MM_TAIL
#endif

/* C (M x N, ldc) = alpha · op(A) · B + beta · C; op(A) = A (M x K, lda) or, with ta, Aᵀ of an
 * A stored K x M; B is K x N (ldb). beta 0 writes C without reading it. */
static void FN(small_mm)(int ta, int M, int N, int K, real alpha, const real *A, int lda,
                         const real *B, int ldb, real beta, real *C, int ldc)
{
#ifdef MM_KERNELS
    int level = mm_level();
    if (level > 0) {
        LOG_GEMM(level, ta, 0, M, N, K, lda, ldb, ldc, beta); /* replayed through it */
        if (level == 2)
            FN(small_mm_512)(ta, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        else
            FN(small_mm_256)(ta, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
#endif
    FN(gemm)(ta, 0, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* Run logged product s (s->count times) through the kernel the step ran it in, on buffers
 * A, B, C large enough for its strides (dl_ops_gemm_replay). */
static void FN(replay_shape)(const dl_gemm_shape *s, const real *A, const real *B, real *C)
{
    int lda = s->lda > 0 ? s->lda : s->ta ? s->M : s->K;
    int ldb = s->ldb > 0 ? s->ldb : s->tb ? s->K : s->N, ldc = s->ldc > 0 ? s->ldc : s->N;
    real beta = s->zero_beta ? (real)0 : (real)1;
    for (long k = 0; k < s->count; k++) {
#ifdef MM_KERNELS
        if (s->kernel == DL_GEMM_SMALL_AVX512) {
            FN(small_mm_512)(s->ta, s->M, s->N, s->K, (real)1, A, lda, B, ldb, beta, C, ldc);
            continue;
        }
        if (s->kernel == DL_GEMM_SMALL_AVX2) {
            FN(small_mm_256)(s->ta, s->M, s->N, s->K, (real)1, A, lda, B, ldb, beta, C, ldc);
            continue;
        }
#endif
        FN(gemm)(s->ta, s->tb, s->M, s->N, s->K, (real)1, A, lda, B, ldb, beta, C, ldc);
    }
}

/* keys transposed a chunk at a time into a stack buffer of this many elements (32 KiB in f32) */
#define KT_ELEMS 8192

/* Causal S = alpha · A Bᵀ for one head (A, B: T rows of HS at strides lda, ldb; S: T x T at
 * stride T): row block [i0, i1) of DL_ATT_BLOCK rows gets keys [0, i1) only, as in the GEMM
 * formulation. B is transposed in chunks of keys (each once) so that small_mm streams rows. */
DL_CLONES
static void FN(causal_abt)(real *S, const real *A, int lda, const real *B, int ldb, int T, int HS,
                           real alpha)
{
    int kc = (KT_ELEMS / (HS > 0 ? HS : 1)) / 16 * 16;
    kc = kc > 64 ? 64 : kc;
    if (kc < 16) { /* a head too wide for the buffer: the GEMMs */
        for (int i0 = 0; i0 < T; i0 += DL_ATT_BLOCK) {
            int i1 = i0 + DL_ATT_BLOCK < T ? i0 + DL_ATT_BLOCK : T;
            FN(gemm)
            (0, 1, i1 - i0, i1, HS, alpha, A + (size_t)i0 * lda, lda, B, ldb, (real)0,
             S + (size_t)i0 * T, T);
        }
        return;
    }
    real bt[KT_ELEMS];
    for (int c0 = 0; c0 < T; c0 += kc) {
        int w = T - c0 < kc ? T - c0 : kc;
        /* bt[d][c] = B[c0 + c][d], in 16 x 16 blocks (both sides stay in a few cache lines) */
        for (int cb = 0; cb < w; cb += 16)
            for (int db = 0; db < HS; db += 16) {
                int ce = cb + 16 < w ? cb + 16 : w, de = db + 16 < HS ? db + 16 : HS;
                for (int d = db; d < de; d++)
                    for (int c = cb; c < ce; c++)
                        bt[(size_t)d * w + c] = B[(size_t)(c0 + c) * ldb + d];
            }
        for (int i0 = c0 / DL_ATT_BLOCK * DL_ATT_BLOCK; i0 < T; i0 += DL_ATT_BLOCK) {
            int i1 = i0 + DL_ATT_BLOCK < T ? i0 + DL_ATT_BLOCK : T;
            int we = (i1 < c0 + w ? i1 : c0 + w) - c0;
            FN(small_mm)
            (0, i1 - i0, we, HS, alpha, A + (size_t)i0 * lda, lda, bt, w, (real)0,
             S + (size_t)i0 * T + c0, T);
        }
    }
}
#undef KT_ELEMS

/* ---- causal multi-head attention ---- */

DL_CLONES
void FN(dl_attention_fwd)(real *out, int ldout, real *att, const real *q, const real *k,
                          const real *v, int ldqkv, int B, int T, int NH, int HS)
{
    const real scale = (real)1 / FN(sqrt)((real)HS);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            size_t row0 = (size_t)b * T, hoff = (size_t)h * HS;
            const real *qb = q + row0 * ldqkv + hoff, *kb = k + row0 * ldqkv + hoff,
                       *vb = v + row0 * ldqkv + hoff;
            real *ob = out + row0 * ldout + hoff;
            real *P = att + ((size_t)b * NH + h) * T * T;
            /* S = scale · Q Kᵀ, by row blocks: rows [i0, i1) need keys [0, i1) only */
            FN(causal_abt)(P, qb, ldqkv, kb, ldqkv, T, HS, scale);
            /* causal softmax row by row; zero above the diagonal so P·V may use whole blocks */
            for (int i = 0; i < T; i++) {
                real *p = P + (size_t)i * T;
                real mx = FN(vmax)(p, i + 1);
                real inv = (real)1 / FN(vexp_sum)(p, mx, i + 1);
                for (int j = 0; j <= i; j++) p[j] *= inv;
                for (int j = i + 1; j < T; j++) p[j] = 0;
            }
            /* O = P V, same row blocks */
            for (int i0 = 0; i0 < T; i0 += DL_ATT_BLOCK) {
                int i1 = i0 + DL_ATT_BLOCK < T ? i0 + DL_ATT_BLOCK : T;
                FN(small_mm)
                (0, i1 - i0, HS, i1, (real)1, P + (size_t)i0 * T, T, vb, ldqkv, (real)0,
                 ob + (size_t)i0 * ldout, ldout);
            }
        }
}

/* beta 1: dq, dk, dv +=; beta 0: written (each block of rows gets exactly one product per head) */
DL_CLONES
static void FN(attention_bwd)(real *dq, real *dk, real *dv, real beta, real *scratch,
                              const real *dout, int ldout, const real *q, const real *k,
                              const real *v, int ldqkv, const real *att, int B, int T, int NH,
                              int HS)
{
    const real scale = (real)1 / FN(sqrt)((real)HS);
    real *D = scratch; /* dP, then dS in place: (T, T) */
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            size_t row0 = (size_t)b * T, hoff = (size_t)h * HS, o = row0 * ldqkv + hoff;
            const real *qb = q + o, *kb = k + o, *vb = v + o;
            real *dqb = dq + o, *dkb = dk + o, *dvb = dv + o;
            const real *dob = dout + row0 * ldout + hoff;
            const real *P = att + ((size_t)b * NH + h) * T * T;
            /* dP[i0:i1, 0:i1] = dO Vᵀ for every row block */
            FN(causal_abt)(D, dob, ldout, vb, ldqkv, T, HS, (real)1);
            for (int i0 = 0; i0 < T; i0 += DL_ATT_BLOCK) {
                int i1 = i0 + DL_ATT_BLOCK < T ? i0 + DL_ATT_BLOCK : T;
                /* softmax backward: dS = P ⊙ (dP - Σ_j P dP), zero above the diagonal */
                for (int i = i0; i < i1; i++) {
                    const real *p = P + (size_t)i * T;
                    real *d = D + (size_t)i * T;
                    real s = FN(vdot)(p, d, i + 1);
                    for (int j = 0; j <= i; j++) d[j] = p[j] * (d[j] - s);
                    for (int j = i + 1; j < i1; j++) d[j] = 0;
                }
                /* dQ[i0:i1] += scale · dS[i0:i1, 0:i1] K[0:i1] */
                FN(small_mm)
                (0, i1 - i0, HS, i1, scale, D + (size_t)i0 * T, T, kb, ldqkv, beta,
                 dqb + (size_t)i0 * ldqkv, ldqkv);
            }
            /* keys/values [j0, j1) receive from query rows [j0, T) only */
            for (int j0 = 0; j0 < T; j0 += DL_ATT_BLOCK) {
                int j1 = j0 + DL_ATT_BLOCK < T ? j0 + DL_ATT_BLOCK : T;
                /* dK[j0:j1] += scale · dS[j0:T, j0:j1]ᵀ Q[j0:T] */
                FN(small_mm)
                (1, j1 - j0, HS, T - j0, scale, D + (size_t)j0 * T + j0, T, qb + (size_t)j0 * ldqkv,
                 ldqkv, beta, dkb + (size_t)j0 * ldqkv, ldqkv);
                /* dV[j0:j1] += P[j0:T, j0:j1]ᵀ dO[j0:T] */
                FN(small_mm)
                (1, j1 - j0, HS, T - j0, (real)1, P + (size_t)j0 * T + j0, T,
                 dob + (size_t)j0 * ldout, ldout, beta, dvb + (size_t)j0 * ldqkv, ldqkv);
            }
        }
}

void FN(dl_attention_bwd)(real *dq, real *dk, real *dv, real *scratch, const real *dout, int ldout,
                          const real *q, const real *k, const real *v, int ldqkv, const real *att,
                          int B, int T, int NH, int HS)
{
    FN(attention_bwd)(dq, dk, dv, (real)1, scratch, dout, ldout, q, k, v, ldqkv, att, B, T, NH, HS);
}

void FN(dl_attention_bwd_write)(real *dq, real *dk, real *dv, real *scratch, const real *dout,
                                int ldout, const real *q, const real *k, const real *v, int ldqkv,
                                const real *att, int B, int T, int NH, int HS)
{
    FN(attention_bwd)(dq, dk, dv, (real)0, scratch, dout, ldout, q, k, v, ldqkv, att, B, T, NH, HS);
}

/* ---- softmax + cross-entropy ---- */

DL_CLONES
double FN(dl_crossentropy_fwd)(real *probs, real *losses, const real *logits, const int *targets,
                               int N, int V)
{
    double total = 0;
    for (int n = 0; n < N; n++) {
        const real *l = logits + (size_t)n * V;
        real *p = probs + (size_t)n * V;
        real mx = FN(vmax)(l, V);
        real lt = l[targets[n]]; /* read before p (which may alias l) is overwritten */
        if (p != l)
            memcpy(p, l, (size_t)V * sizeof(real));
        real sum = FN(vexp_sum)(p, mx, V);
        real inv = (real)1 / sum;
        for (int j = 0; j < V; j++) p[j] *= inv;
        /* -log softmax[target] = log Σ exp(l - max) + max - l[target], exact for large logits */
        real loss = FN(log)(sum) + mx - lt;
        if (losses)
            losses[n] = loss;
        total += (double)loss;
    }
    return N > 0 ? total / N : 0.0;
}

DL_CLONES
void FN(dl_crossentropy_bwd)(real *dlogits, const real *probs, const int *targets, real dloss,
                             int N, int V)
{
    for (int n = 0; n < N; n++) {
        const real *p = probs + (size_t)n * V;
        real *d = dlogits + (size_t)n * V;
        real pt = p[targets[n]]; /* before d (which may alias p) is written */
        for (int j = 0; j < V; j++) d[j] = p[j] * dloss;
        d[targets[n]] = (pt - (real)1) * dloss;
    }
}

/* ---- AdamW ---- */

/* Elements per chunk of the AdamW pass: its sqrt runs as a separate vector loop over the chunk's
 * v (still in L1), so the other two loops vectorise (the scalar loop with a sqrtf per element
 * ran at about a quarter of memory bandwidth: 8.3 ms of a 13 MB model, now 1.6 ms). */
#define DL_ADAMW_CHUNK 512

DL_CLONES
void FN(dl_adamw)(real *restrict param, const real *restrict grad, real *restrict m,
                  real *restrict v, size_t n, real lr, real beta1, real beta2, real eps, real wd,
                  real grad_scale, long step)
{
    /* bias corrections in double (pow of a number close to 1); the arithmetic order is
     * PyTorch's: decay, moments, then param -= step_size * m / (sqrt(v) / sqrt(bc2) + eps) */
    double bc1 = 1.0 - pow((double)beta1, (double)step),
           bc2 = 1.0 - pow((double)beta2, (double)step);
    const real step_size = (real)((double)lr / bc1);
    const real sqrt_bc2 = (real)sqrt(bc2);
    const real decay = (real)1 - lr * wd, a1 = (real)1 - beta1, a2 = (real)1 - beta2;
    real sq[DL_ADAMW_CHUNK];
    for (size_t i0 = 0; i0 < n; i0 += DL_ADAMW_CHUNK) {
        int len = n - i0 < DL_ADAMW_CHUNK ? (int)(n - i0) : DL_ADAMW_CHUNK;
        real *restrict p = param + i0, *restrict mc = m + i0, *restrict vc = v + i0;
        const real *restrict gc = grad + i0;
        for (int i = 0; i < len; i++) {
            real g = gc[i] * grad_scale;
            mc[i] = beta1 * mc[i] + a1 * g;
            vc[i] = beta2 * vc[i] + a2 * g * g;
        }
        FN(vsqrt)(sq, vc, len);
        for (int i = 0; i < len; i++)
            p[i] = p[i] * decay - step_size * mc[i] / (sq[i] / sqrt_bc2 + eps);
    }
}

DL_CLONES
double FN(dl_sumsq)(const real *x, size_t n)
{
    double s[4] = {0, 0, 0, 0};
    size_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int l = 0; l < 4; l++) s[l] += (double)x[i + l] * (double)x[i + l];
    double r = (s[0] + s[1]) + (s[2] + s[3]);
    for (; i < n; i++) r += (double)x[i] * (double)x[i];
    return r;
}

#endif /* DL_OPS_BODY */
