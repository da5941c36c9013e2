/* Which OpenBLAS kernel class suits this CPU (see lib/core/blas.h). */
#include "config.h"
#include <stddef.h>
#include <string.h>
#include <strings.h>
#include <cblas.h>
#include "core/blas.h"

#if defined(__GNUC__) && defined(__x86_64__)
#include <cpuid.h>
#define DL_X86_64 1
#endif

/* OpenBLAS 0.3.21's x86-64 core names (driver/others/dynamic.c) by the ISA their kernels need.
 * The 32-bit-era and SSE2 names sit at the baseline; AMD's Bulldozer family is AVX here (its
 * FMA4 is outside this scale); Excavator and Zen have AVX2 and FMA3, Steamroller not yet.
 * Cooperlake and SapphireRapids add bf16 / AMX for sbgemm only: their sgemm is SkylakeX's. */
static const struct {
    const char *name;
    dl_isa_level level;
} KERNELS[] = {
    {"Katmai", DL_ISA_BASE},       {"Coppermine", DL_ISA_BASE},
    {"Northwood", DL_ISA_BASE},    {"Banias", DL_ISA_BASE},
    {"Athlon", DL_ISA_BASE},       {"Opteron", DL_ISA_BASE},
    {"Prescott", DL_ISA_SSE3},     {"Atom", DL_ISA_SSE3},
    {"Core2", DL_ISA_SSE3},        {"Penryn", DL_ISA_SSE3},
    {"Dunnington", DL_ISA_SSE3},   {"Nehalem", DL_ISA_SSE3},
    {"Opteron_SSE3", DL_ISA_SSE3}, {"Barcelona", DL_ISA_SSE3},
    {"Nano", DL_ISA_SSE3},         {"Bobcat", DL_ISA_SSE3},
    {"Sandybridge", DL_ISA_AVX},   {"Bulldozer", DL_ISA_AVX},
    {"Piledriver", DL_ISA_AVX},    {"Steamroller", DL_ISA_AVX},
    {"Haswell", DL_ISA_AVX2},      {"Excavator", DL_ISA_AVX2},
    {"Zen", DL_ISA_AVX2},          {"SkylakeX", DL_ISA_AVX512},
    {"Cooperlake", DL_ISA_AVX512}, {"SapphireRapids", DL_ISA_AVX512},
};

/* the class asked for at each CPU level (index: dl_isa_level); none below SSE3 */
static const char *const BEST[] = {NULL, "Prescott", "Sandybridge", "Haswell", "SkylakeX"};

#ifdef DL_X86_64
static unsigned long long xcr0(void)
{
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}
#endif

void dl_cpu_features_detect(dl_cpu_features *f)
{
    memset(f, 0, sizeof *f);
#ifdef DL_X86_64
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return;
    f->sse3 = !!(c & bit_SSE3);
    f->fma = !!(c & bit_FMA);
    f->avx = !!(c & bit_AVX);
    /* XGETBV faults unless the OS enabled it (OSXSAVE): without it no AVX state is saved */
    if (c & bit_OSXSAVE) {
        unsigned long long x = xcr0();
        f->os_ymm = (x & 0x6) == 0x6;
        f->os_zmm = f->os_ymm && (x & 0xe0) == 0xe0;
    }
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
        f->avx2 = !!(b & bit_AVX2);
        f->avx512f = !!(b & bit_AVX512F);
        f->avx512dq = !!(b & bit_AVX512DQ);
        f->avx512bw = !!(b & bit_AVX512BW);
        f->avx512vl = !!(b & bit_AVX512VL);
    }
#endif
}

dl_isa_level dl_cpu_isa_level(const dl_cpu_features *f)
{
    if (!f->sse3)
        return DL_ISA_BASE;
    if (!f->avx || !f->os_ymm)
        return DL_ISA_SSE3;
    if (!f->avx2 || !f->fma)
        return DL_ISA_AVX;
    if (!(f->avx512f && f->avx512bw && f->avx512dq && f->avx512vl) || !f->os_zmm)
        return DL_ISA_AVX2;
    return DL_ISA_AVX512;
}

dl_isa_level dl_blas_kernel_level(const char *corename)
{
    for (size_t i = 0; corename && i < sizeof KERNELS / sizeof KERNELS[0]; i++)
        if (strcasecmp(corename, KERNELS[i].name) == 0)
            return KERNELS[i].level;
    return DL_ISA_UNKNOWN;
}

const char *dl_blas_coretype_for(const char *loaded, const dl_cpu_features *cpu)
{
    dl_isa_level have = dl_blas_kernel_level(loaded), can = dl_cpu_isa_level(cpu);
    if (have == DL_ISA_UNKNOWN || have >= can)
        return NULL;
    return BEST[can];
}

const char *dl_blas_loaded_kernel(void)
{
    const char *s = openblas_get_corename();
    return s && *s ? s : "unknown";
}

const char *dl_isa_level_name(dl_isa_level l)
{
    switch (l) {
    case DL_ISA_BASE: return "x86-64 baseline";
    case DL_ISA_SSE3: return "SSE3";
    case DL_ISA_AVX: return "AVX";
    case DL_ISA_AVX2: return "AVX2+FMA";
    case DL_ISA_AVX512: return "AVX-512";
    default: return "unknown";
    }
}
