/* distlab (private): bf16 conversions, the one rounding every bf16 path uses. */
#ifndef DISTLAB_BF16_H
#define DISTLAB_BF16_H

#include <stdint.h>

/* Round to nearest even (NaN stays NaN), and widen (exact). */
uint16_t dl_f32_to_bf16(float x);
float dl_bf16_to_f32(uint16_t b);

#endif
