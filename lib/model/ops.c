/* Kernels of the GPT trainer (lib/model/ops.h: shapes and conventions; model/ops_tmpl.h: how
 * the kernel files are written, once for f32 and f64). This file: the embedding, LayerNorm, GeLU,
 * residual and softmax + cross-entropy kernels; ops_gemm.c the linear layers and the attention,
 * ops_adamw.c the optimizer's. */
#ifndef DL_OPS_BODY
#include "config.h"
#include "model/ops_tmpl.h"

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

#define DL_OPS_SELF "model/ops.c"
#include "model/ops_twice.h"

#else /* DL_OPS_BODY: everything below is compiled once per type */

#include "model/ops_vec.h"

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

/* One row's mean(g) and mean(g * xhat), g = w * dout, xhat = (x - m) * s: eight partial sums */
static inline void FN(ln_bwd_row_means)(const real *restrict w, const real *restrict d,
                                        const real *restrict x, real m, real s, int C,
                                        real *g_mean_out, real *gx_mean_out)
{
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
    *g_mean_out = g_mean / (real)C;
    *gx_mean_out = gx_mean / (real)C;
}

DL_CLONES
void FN(dl_layernorm_bwd)(real *restrict dinp, real *restrict dw, real *restrict db,
                          const real *restrict dout, const real *restrict inp,
                          const real *restrict w, const real *mean, const real *rstd, int N, int C)
{
    for (int n = 0; n < N; n++) {
        const real *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
        real *dx = dinp + (size_t)n * C;
        real m = mean[n], s = rstd[n], g_mean, gx_mean;
        /* y = w * xhat + b; dL/dx = s * (g - mean(g) - xhat * mean(g * xhat)), g = w * dout */
        FN(ln_bwd_row_means)(w, d, x, m, s, C, &g_mean, &gx_mean);
        for (int c = 0; c < C; c++) {
            real xh = (x[c] - m) * s;
            db[c] += d[c];
            dw[c] += xh * d[c];
            dx[c] += (w[c] * d[c] - g_mean - xh * gx_mean) * s;
        }
    }
}

/* The two halves of dl_layernorm_bwd for a backward split into its input-gradient and its
 * weight-gradient part (model/sublayer.h): each element's expressions are the fused kernel's
 * (the same operations in the same order, so the same FMA contractions), so input then weight
 * gives bitwise the fused results. */
DL_CLONES
void FN(dl_layernorm_bwd_input)(real *restrict dinp, const real *restrict dout,
                                const real *restrict inp, const real *restrict w, const real *mean,
                                const real *rstd, int N, int C)
{
    for (int n = 0; n < N; n++) {
        const real *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
        real *dx = dinp + (size_t)n * C;
        real m = mean[n], s = rstd[n], g_mean, gx_mean;
        FN(ln_bwd_row_means)(w, d, x, m, s, C, &g_mean, &gx_mean);
        for (int c = 0; c < C; c++) {
            real xh = (x[c] - m) * s;
            dx[c] += (w[c] * d[c] - g_mean - xh * gx_mean) * s;
        }
    }
}

DL_CLONES
void FN(dl_layernorm_bwd_weight)(real *restrict dw, real *restrict db, const real *restrict dout,
                                 const real *restrict inp, const real *mean, const real *rstd,
                                 int N, int C)
{
    for (int n = 0; n < N; n++) {
        const real *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
        real m = mean[n], s = rstd[n];
        for (int c = 0; c < C; c++) {
            real xh = (x[c] - m) * s;
            db[c] += d[c];
            dw[c] += xh * d[c];
        }
    }
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

#endif /* DL_OPS_BODY */
