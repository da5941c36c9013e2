/* distlab (private): what every kernel file of lib/model/ shares (ops.c: embedding, LayerNorm,
 * GeLU, residual, cross-entropy; ops_gemm.c: the linear layers and the attention, over the GEMM
 * and the attention's own small products; ops_adamw.c: AdamW, squared norms, bf16 arrays).
 *
 * The kernels are written once, as a template on the element type: each file includes itself
 * twice through ops_twice.h with DL_OPS_BODY defined, once with `real` = float (suffix _f32) and
 * once with `real` = double (_f64), so both variants are real exported functions compiled from
 * the same text. Type-specific pieces (GEMM, exp, erf, sqrt, log) are small static inline
 * functions named x_f32 / x_f64 that the body reaches through FN(x); the ones several families
 * use are here, the per-type reductions in ops_vec.h. Each family is one translation unit, so
 * every helper a kernel calls is inlined as before the split (the only calls between the files
 * are to exported kernels).
 *
 * Speed: GEMMs are OpenBLAS; the elementwise loops are written so that gcc -O3 vectorises them
 * (no calls, no aliasing surprises); reductions use several partial sums (gcc may not reorder a
 * floating-point sum on its own). The f32 exp and the f32 normal CDF of the GeLU are call-free
 * polynomial versions (within a few ulp, tested against expl / erfl): glibc's erff alone cost
 * about 12 ns per element on typical activations. The f64 variants use libm's exp and erf: they
 * are the reference the tests check against. */
#ifndef DISTLAB_MODEL_OPS_TMPL_H
#define DISTLAB_MODEL_OPS_TMPL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <stdlib.h>

#include "model/ops.h"

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

/* ---- type-specific helpers several families use ---- */

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

static inline float sqrt_f32(float x) { return sqrtf(x); }
static inline double sqrt_f64(double x) { return sqrt(x); }

#endif
