/* CRC32C (lib/core/crc32c.h): a byte table built once, or the CPU's crc32 instruction. */
#include "config.h"
#include <pthread.h>
#include <string.h>
#include "core/crc32c.h"

static uint32_t table[256];
static int have_hw; /* the CPU has SSE4.2's crc32 */
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void table_init(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    have_hw = __builtin_cpu_supports("sse4.2") ? 1 : 0;
#endif
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
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t c, const unsigned char *b,
                                                         size_t n)
{
    uint64_t c64 = c;
    for (; n >= 8; n -= 8, b += 8) {
        uint64_t w;
        memcpy(&w, b, 8);
        c64 = __builtin_ia32_crc32di(c64, w);
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
