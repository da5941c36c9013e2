/* distlab: which OpenBLAS kernel class suits this CPU.
 *
 * OpenBLAS built with DYNAMIC_ARCH picks its kernels ("core type") from the CPU when it loads.
 * A CPU newer than the OpenBLAS release is not in its table, and OpenBLAS falls back to its
 * generic Prescott (SSE3) kernels: sgemm then runs 2-3x slower than the CPU allows, silently.
 * OPENBLAS_CORETYPE, read when the library loads, overrides the choice. This module ranks the
 * kernels and the CPU on one scale of x86-64 ISA levels and says which core type to ask for:
 * the decision is a pure function of (the kernel OpenBLAS reports, the CPU's features), so it can
 * be tested on any machine; detecting the features is separate. The apps use it to restart
 * themselves once with OPENBLAS_CORETYPE set (apps/common/cli.c; docs/API.md, "BLAS kernel"). */
#ifndef DISTLAB_CORE_BLAS_H
#define DISTLAB_CORE_BLAS_H

#ifdef __cplusplus
extern "C" {
#endif

/* ISA levels, ordered: a kernel of level L runs on a CPU of level >= L. */
typedef enum dl_isa_level {
    DL_ISA_UNKNOWN = -1, /* a kernel name this module does not know */
    DL_ISA_BASE = 0,     /* x86-64 baseline (SSE2), or not an x86-64 CPU */
    DL_ISA_SSE3 = 1,
    DL_ISA_AVX = 2,
    DL_ISA_AVX2 = 3,  /* AVX2 and FMA3 */
    DL_ISA_AVX512 = 4 /* AVX-512 F, BW, DQ and VL */
} dl_isa_level;

/* What the CPU reports (CPUID) and what the OS saves on a context switch (XCR0 via XGETBV):
 * an instruction set whose registers the OS does not save cannot be used. 1 = present. */
typedef struct dl_cpu_features {
    int sse3, avx, avx2, fma; /* CPUID leaf 1 / leaf 7 */
    int avx512f, avx512bw, avx512dq, avx512vl;
    int os_ymm; /* OSXSAVE set and XCR0 has the SSE and AVX state (bits 1, 2) */
    int os_zmm; /* XCR0 also has the opmask and both ZMM states (bits 5, 6, 7) */
} dl_cpu_features;

/* This CPU's features (CPUID and XGETBV); all zero on a CPU that is not x86-64. */
void dl_cpu_features_detect(dl_cpu_features *f);

/* The highest level all of whose features (and OS state) are present. Pure. */
dl_isa_level dl_cpu_isa_level(const dl_cpu_features *f);

/* The level an OpenBLAS 0.3.21 x86-64 core name (as openblas_get_corename() reports it, or as
 * OPENBLAS_CORETYPE spells it; case-insensitive) needs: "Prescott" SSE3, "Sandybridge" AVX,
 * "Haswell" and "Zen" AVX2, "SkylakeX" AVX-512, ... DL_ISA_UNKNOWN for other names. Pure. */
dl_isa_level dl_blas_kernel_level(const char *corename);

/* The OPENBLAS_CORETYPE to ask for when OpenBLAS runs the kernel `loaded` on a CPU with
 * features `cpu`: the best class the CPU runs ("SkylakeX" for AVX-512, "Haswell" for AVX2+FMA,
 * "Sandybridge" for AVX, "Prescott" for SSE3) when the loaded kernel's level is below the
 * CPU's; NULL when it is not, or when `loaded` is NULL or a name of unknown level (nothing
 * known to be gained). Pure: the caller decides whether the user's own OPENBLAS_CORETYPE
 * (always to be respected) rules it out. */
const char *dl_blas_coretype_for(const char *loaded, const dl_cpu_features *cpu);

/* The kernel the loaded OpenBLAS runs (openblas_get_corename()), "unknown" when it says none. */
const char *dl_blas_loaded_kernel(void);

/* "SSE3", "AVX", "AVX2+FMA", "AVX-512", "x86-64 baseline", "unknown". */
const char *dl_isa_level_name(dl_isa_level l);

#ifdef __cplusplus
}
#endif
#endif
