/* distlab (private): bf16 <-> f32, the one rounding every bf16 path uses (collectives, kernels, apps).
 * bf16 is the top half of an f32. Rounding is to nearest, ties to even, done on the bit pattern:
 * adding 0x7fff plus the kept half's lowest bit carries into bit 16 exactly when the dropped
 * half is above the midpoint, or at it with an odd kept half; a carry out of the largest finite
 * exponent gives infinity, as IEEE rounding does. A NaN is kept a quiet NaN (its payload's top
 * bits and the sign kept), never rounded to infinity. static inline: the hot loops of
 * lib/coll/coll.c and lib/model/ops.c vectorise through it. */
#ifndef DISTLAB_CORE_BF16_H
#define DISTLAB_CORE_BF16_H

#include <stdint.h>
#include <string.h>

static inline uint16_t dl__bf16_round(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it a (quiet) NaN */
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest, ties to even */
    return (uint16_t)(u >> 16);
}

/* Exact. */
static inline float dl__bf16_widen(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* The same as functions (lib/coll/coll.c), for callers that take their address or prefer a call. */
uint16_t dl_f32_to_bf16(float x);
float dl_bf16_to_f32(uint16_t b);

#endif
