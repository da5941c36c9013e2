/* CRC32C (lib/core/crc32c.h): a byte table built once, or the CPU's crc32 instruction on three
 * interleaved streams; the combination of two CRCs by polynomial arithmetic modulo the
 * generator. */
#include "config.h"
#include <pthread.h>
#include <string.h>
#include "core/crc32c.h"

static uint32_t table[256];
static int have_hw; /* the CPU has SSE4.2's crc32 */
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

/* The hardware path's stream length, and the shifts by one and two of them (table_init). */
enum { STREAM = 8192 };
static uint32_t shift_1, shift_2;

static uint32_t mul_mod(uint32_t a, uint32_t b);
static uint32_t x8n_mod(uint64_t n);

static void table_init(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    have_hw = __builtin_cpu_supports("sse4.2") ? 1 : 0;
#endif
    shift_1 = x8n_mod(STREAM), shift_2 = x8n_mod(2 * STREAM);
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        table[i] = c;
    }
}

static uint32_t crc_table(uint32_t c, const unsigned char *b, size_t n)
{
    for (size_t i = 0; i < n; i++) c = table[(c ^ b[i]) & 0xff] ^ (c >> 8);
    return c;
}

#if defined(__x86_64__) && defined(__GNUC__)
static inline uint64_t load8(const unsigned char *b)
{
    uint64_t w;
    memcpy(&w, b, 8);
    return w;
}

/* The crc32 instruction takes 3 cycles and starts one a cycle: three independent streams of
 * STREAM bytes keep it busy (one chain alone runs at a third of that), joined by linearity:
 * the register after A B C is shift(reg(A), |B C|) ^ shift(reg_0(B), |C|) ^ reg_0(C). */
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t c, const unsigned char *b,
                                                         size_t n)
{
    uint64_t c64 = c;
    for (; n >= 3 * STREAM; n -= 3 * STREAM, b += 3 * STREAM) {
        uint64_t c1 = 0, c2 = 0;
        for (size_t i = 0; i < STREAM; i += 8) {
            c64 = __builtin_ia32_crc32di(c64, load8(b + i));
            c1 = __builtin_ia32_crc32di(c1, load8(b + STREAM + i));
            c2 = __builtin_ia32_crc32di(c2, load8(b + 2 * STREAM + i));
        }
        c64 = mul_mod(shift_2, (uint32_t)c64) ^ mul_mod(shift_1, (uint32_t)c1) ^ (uint32_t)c2;
    }
    for (; n >= 8; n -= 8, b += 8) {
        c64 = __builtin_ia32_crc32di(c64, load8(b));
    }
    c = (uint32_t)c64;
    for (; n; n--, b++) c = __builtin_ia32_crc32qi(c, *b);
    return c;
}
#endif

uint32_t dl__crc32c(uint32_t crc, const void *p, size_t n)
{
    uint32_t c = ~crc;
    pthread_once(&table_once, table_init);
#if defined(__x86_64__) && defined(__GNUC__)
    if (have_hw)
        return ~crc_hw(c, p, n);
#endif
    return ~crc_table(c, p, n);
}

/* Polynomials over GF(2) modulo P, in the CRC's reflected order: bit 31 is x^0, bit 0 x^31. */
static uint32_t mul_mod(uint32_t a, uint32_t b)
{
    uint32_t p = 0;
    for (uint32_t bit = 1u << 31; bit; bit >>= 1) { /* a's coefficients from x^0 up */
        if (a & bit)
            p ^= b;
        b = b & 1 ? (b >> 1) ^ 0x82F63B78u : b >> 1; /* b *= x */
    }
    return p;
}

/* x^(8 n) mod P by squaring */
static uint32_t x8n_mod(uint64_t n)
{
    uint32_t r = 1u << 31, sq = 1u << 23; /* x^0, x^8 */
    for (; n; n >>= 1, sq = mul_mod(sq, sq))
        if (n & 1)
            r = mul_mod(r, sq);
    return r;
}

uint32_t dl__crc32c_shift(uint32_t crc, uint64_t n) { return mul_mod(x8n_mod(n), crc); }

uint32_t dl__crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b)
{
    return dl__crc32c_shift(crc_a, len_b) ^ crc_b;
}
