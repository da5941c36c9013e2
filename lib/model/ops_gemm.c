/* Kernels of the GPT trainer over matrix products (model/ops_tmpl.h explains the file's form):
 * the linear layers (OpenBLAS), the causal attention with its own small products (AVX-512 /
 * AVX2 register tiles), the GEMM shape log and its replay. */
#ifndef DL_OPS_BODY
#include "config.h"
#include <stdatomic.h>
#include <time.h>

#include <cblas.h>
#include "model/ops_tmpl.h"
#include "model/ops_attn_kv.h"

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

#define DL_OPS_SELF "model/ops_gemm.c"
#include "model/ops_twice.h"

/* the GEMM for the other kernel files (model/ops_attn_kv.h), counted in the same shape log */
void dl__ops_gemm_f32(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                      const float *B, int ldb, float beta, float *C, int ldc)
{
    gemm_f32(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
void dl__ops_gemm_f64(int ta, int tb, int M, int N, int K, double alpha, const double *A, int lda,
                      const double *B, int ldb, double beta, double *C, int ldc)
{
    gemm_f64(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

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

#else /* DL_OPS_BODY: everything below is compiled once per type */

#include "model/ops_vec.h"

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

#endif /* DL_OPS_BODY */
