/* The BLAS kernel decision (lib/core/blas.c): the CPU's ISA level from its features, OS state
 * included (AVX-512 the CPU has but the OS does not save is AVX2); each OpenBLAS 0.3.21 x86-64
 * core name's level; the core type asked for over a table of (loaded kernel, CPU) cases, so a
 * machine whose CPU OpenBLAS recognises still tests the rule for one it does not (Prescott
 * loaded on an AVX-512 CPU -> SkylakeX); no change when the loaded kernel is at the CPU's level,
 * above it, or unknown. On this machine: the detected level against gcc's own CPU tests
 * (__builtin_cpu_supports, which also reads XGETBV), and the kernel OpenBLAS reports. */
#include "../testutil.h"
#include <check.h>
#include <strings.h>
#include <cblas.h>
#include "core/blas.h"

/* feature sets by name: the cases read as "a CPU like this" */
static const dl_cpu_features NONE = {0};
static const dl_cpu_features SSE3 = {.sse3 = 1};
static const dl_cpu_features AVX = {.sse3 = 1, .avx = 1, .os_ymm = 1};
static const dl_cpu_features AVX_NO_OS = {.sse3 = 1, .avx = 1};
static const dl_cpu_features AVX2_NO_FMA = {.sse3 = 1, .avx = 1, .avx2 = 1, .os_ymm = 1};
static const dl_cpu_features AVX2 = {.sse3 = 1, .avx = 1, .avx2 = 1, .fma = 1, .os_ymm = 1};
static const dl_cpu_features AVX512 = {.sse3 = 1,
                                       .avx = 1,
                                       .avx2 = 1,
                                       .fma = 1,
                                       .avx512f = 1,
                                       .avx512bw = 1,
                                       .avx512dq = 1,
                                       .avx512vl = 1,
                                       .os_ymm = 1,
                                       .os_zmm = 1};
/* the same CPU under an OS that saves only the YMM state */
static const dl_cpu_features AVX512_NO_OS = {.sse3 = 1,
                                             .avx = 1,
                                             .avx2 = 1,
                                             .fma = 1,
                                             .avx512f = 1,
                                             .avx512bw = 1,
                                             .avx512dq = 1,
                                             .avx512vl = 1,
                                             .os_ymm = 1};
/* Knights Landing: AVX-512 F without BW / DQ / VL */
static const dl_cpu_features AVX512F_ONLY =
    {.sse3 = 1, .avx = 1, .avx2 = 1, .fma = 1, .avx512f = 1, .os_ymm = 1, .os_zmm = 1};

START_TEST(cpu_levels)
{
    static const struct {
        const dl_cpu_features *f;
        dl_isa_level l;
    } T[] = {
        {&NONE, DL_ISA_BASE},      {&SSE3, DL_ISA_SSE3},         {&AVX, DL_ISA_AVX},
        {&AVX_NO_OS, DL_ISA_SSE3}, {&AVX2_NO_FMA, DL_ISA_AVX},   {&AVX2, DL_ISA_AVX2},
        {&AVX512, DL_ISA_AVX512},  {&AVX512_NO_OS, DL_ISA_AVX2}, {&AVX512F_ONLY, DL_ISA_AVX2},
    };
    for (size_t i = 0; i < sizeof T / sizeof T[0]; i++)
        ck_assert_msg(dl_cpu_isa_level(T[i].f) == T[i].l, "case %zu: level %s, expected %s", i,
                      dl_isa_level_name(dl_cpu_isa_level(T[i].f)), dl_isa_level_name(T[i].l));
    /* each missing AVX-512 part alone drops the level */
    for (int k = 0; k < 5; k++) {
        dl_cpu_features f = AVX512;
        int *part[] = {&f.avx512f, &f.avx512bw, &f.avx512dq, &f.avx512vl, &f.os_zmm};
        *part[k] = 0;
        ck_assert_int_eq(dl_cpu_isa_level(&f), DL_ISA_AVX2);
    }
}
END_TEST

START_TEST(kernel_levels)
{
    static const struct {
        const char *name;
        dl_isa_level l;
    } T[] = {
        {"Prescott", DL_ISA_SSE3},
        {"prescott", DL_ISA_SSE3},
        {"Core2", DL_ISA_SSE3},
        {"Nehalem", DL_ISA_SSE3},
        {"Barcelona", DL_ISA_SSE3},
        {"Bobcat", DL_ISA_SSE3},
        {"Atom", DL_ISA_SSE3},
        {"Opteron_SSE3", DL_ISA_SSE3},
        {"Opteron", DL_ISA_BASE},
        {"Athlon", DL_ISA_BASE},
        {"Sandybridge", DL_ISA_AVX},
        {"Bulldozer", DL_ISA_AVX},
        {"Piledriver", DL_ISA_AVX},
        {"Steamroller", DL_ISA_AVX},
        {"Haswell", DL_ISA_AVX2},
        {"HASWELL", DL_ISA_AVX2},
        {"Zen", DL_ISA_AVX2},
        {"Excavator", DL_ISA_AVX2},
        {"SkylakeX", DL_ISA_AVX512},
        {"Cooperlake", DL_ISA_AVX512},
        {"SapphireRapids", DL_ISA_AVX512},
        {"armv8", DL_ISA_UNKNOWN},
        {"Unknown", DL_ISA_UNKNOWN},
        {"", DL_ISA_UNKNOWN},
        {"Haswell2", DL_ISA_UNKNOWN},
        {NULL, DL_ISA_UNKNOWN},
    };
    for (size_t i = 0; i < sizeof T / sizeof T[0]; i++)
        ck_assert_msg(dl_blas_kernel_level(T[i].name) == T[i].l, "'%s': level %s, expected %s",
                      T[i].name ? T[i].name : "(null)",
                      dl_isa_level_name(dl_blas_kernel_level(T[i].name)),
                      dl_isa_level_name(T[i].l));
}
END_TEST

START_TEST(coretype_decision)
{
    static const struct {
        const char *loaded;
        const dl_cpu_features *cpu;
        const char *want;
    } T[] = {
        /* OpenBLAS 0.3.21 does not know the CPU: generic Prescott on AVX-512 / AVX2 / AVX */
        {"Prescott", &AVX512, "SkylakeX"},
        {"Prescott", &AVX2, "Haswell"},
        {"Prescott", &AVX, "Sandybridge"},
        {"prescott", &AVX512, "SkylakeX"},
        {"Prescott", &AVX512_NO_OS, "Haswell"}, /* the OS does not save ZMM */
        {"Prescott", &AVX512F_ONLY, "Haswell"},
        {"Nehalem", &AVX2, "Haswell"},
        {"Sandybridge", &AVX2, "Haswell"},
        {"Steamroller", &AVX2, "Haswell"},
        {"Haswell", &AVX512, "SkylakeX"},
        {"Athlon", &SSE3, "Prescott"},
        /* already at the CPU's level: keep what OpenBLAS chose */
        {"Cooperlake", &AVX512, NULL},
        {"SkylakeX", &AVX512, NULL},
        {"Zen", &AVX2, NULL},
        {"Excavator", &AVX2, NULL},
        {"Haswell", &AVX512_NO_OS, NULL},
        {"Sandybridge", &AVX, NULL},
        {"Prescott", &SSE3, NULL},
        {"Prescott", &AVX_NO_OS, NULL},
        {"Opteron", &NONE, NULL},
        /* above the CPU (a forced kernel): not this rule's business */
        {"SkylakeX", &AVX2, NULL},
        /* a name of unknown level: nothing known to be gained */
        {"armv8", &AVX512, NULL},
        {"Unknown", &AVX512, NULL},
        {NULL, &AVX512, NULL},
    };
    for (size_t i = 0; i < sizeof T / sizeof T[0]; i++) {
        const char *got = dl_blas_coretype_for(T[i].loaded, T[i].cpu);
        int same = got && T[i].want ? strcmp(got, T[i].want) == 0 : got == T[i].want;
        ck_assert_msg(same, "case %zu ('%s' on %s): got %s, expected %s", i,
                      T[i].loaded ? T[i].loaded : "(null)",
                      dl_isa_level_name(dl_cpu_isa_level(T[i].cpu)), got ? got : "none",
                      T[i].want ? T[i].want : "none");
        /* what is asked for is known, at the CPU's level, and not asked for again */
        if (got) {
            ck_assert_int_eq(dl_blas_kernel_level(got), dl_cpu_isa_level(T[i].cpu));
            ck_assert_ptr_null(dl_blas_coretype_for(got, T[i].cpu));
        }
    }
}
END_TEST

/* this machine: our CPUID + XGETBV against gcc's independent implementation of the same tests */
START_TEST(detect_this_cpu)
{
    dl_cpu_features f;
    dl_cpu_features_detect(&f);
    dl_isa_level l = dl_cpu_isa_level(&f), ref = DL_ISA_BASE;
#if defined(__GNUC__) && defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse3"))
        ref = DL_ISA_SSE3;
    if (ref == DL_ISA_SSE3 && __builtin_cpu_supports("avx"))
        ref = DL_ISA_AVX;
    if (ref == DL_ISA_AVX && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        ref = DL_ISA_AVX2;
    if (ref == DL_ISA_AVX2 && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl"))
        ref = DL_ISA_AVX512;
#endif
    printf("this CPU: %s (gcc's tests: %s); OpenBLAS runs %s\n", dl_isa_level_name(l),
           dl_isa_level_name(ref), dl_blas_loaded_kernel());
    ck_assert_msg(l == ref, "detected %s, gcc's tests say %s", dl_isa_level_name(l),
                  dl_isa_level_name(ref));
}
END_TEST

/* the kernel OpenBLAS reports: an OPENBLAS_CORETYPE in the environment that names a known
 * class this CPU runs is what a DYNAMIC_ARCH build runs (the test sets none itself) */
START_TEST(loaded_kernel)
{
    const char *k = dl_blas_loaded_kernel(), *env = getenv("OPENBLAS_CORETYPE");
    const char *cfg = openblas_get_config();
    ck_assert(k != NULL && *k != '\0');
    dl_cpu_features f;
    dl_cpu_features_detect(&f);
    dl_isa_level el = dl_blas_kernel_level(env);
    if (el != DL_ISA_UNKNOWN && el <= dl_cpu_isa_level(&f) && cfg && strstr(cfg, "DYNAMIC_ARCH"))
        ck_assert_msg(strcasecmp(k, env) == 0, "OPENBLAS_CORETYPE=%s but OpenBLAS runs %s", env, k);
    else
        printf("loaded_kernel: OPENBLAS_CORETYPE %s, OpenBLAS '%s': kernel %s not compared\n",
               env ? env : "unset", cfg ? cfg : "?", k);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("blas");
    TCase *tc = tcase_create("blas");
    tcase_add_test(tc, cpu_levels);
    tcase_add_test(tc, kernel_levels);
    tcase_add_test(tc, coretype_decision);
    tcase_add_test(tc, detect_this_cpu);
    tcase_add_test(tc, loaded_kernel);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
