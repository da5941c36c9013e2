/* The reduce kernels every collective uses (declared in prims.h), and the public names of the
 * one bf16 rounding. */
#include "config.h"
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include "distlab.h"
#include "core/bf16.h"
#include "coll/prims.h"

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

void dl__reduce(dl_dtype t, void *out, const void *a, const void *b, size_t n, dl_redop op,
                double div)
{
    switch (t) {
    case DL_F32: reduce_f32(out, a, b, n, op, div); break;
    case DL_F64: reduce_f64(out, a, b, n, op, div); break;
    default: reduce_bf16(out, a, b, n, op, div); break;
    }
}

/* out = in / div (avg on one rank, or after recursive doubling) */
void dl__scale(dl_dtype t, void *out, const void *in, size_t n, double div)
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
void dl__fold(dl_dtype t, void *out, const void *const *src, int nsrc, size_t count, dl_redop op,
              int avg_n)
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
void dl__copy_final(void *dst, const void *src, size_t bytes)
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
