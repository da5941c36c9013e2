/* Kernels of the optimizer (model/ops_tmpl.h explains the file's form): AdamW, the squared norm
 * of the gradient clipping, and the bf16 arrays of mixed precision (rounding, widening,
 * accumulation, the bf16 AdamW over f32 master weights). */
#ifndef DL_OPS_BODY
#include "config.h"
#include "core/bf16.h"
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include "model/ops_tmpl.h"

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

#define DL_OPS_SELF "model/ops_adamw.c"
#include "model/ops_twice.h"

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

#include "model/ops_vec.h"

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
