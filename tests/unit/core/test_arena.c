/* Unit tests of the per-rank memory arena and of size parsing. */
#define _POSIX_C_SOURCE 200809L
#include <check.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "distlab.h"
#include "core/arena.h"

/* Expected per-category currents, written out by hand for each checkpoint. */
static void expect_current(const dl_arena *a, uint64_t params, uint64_t grads, uint64_t opt,
                           uint64_t act, uint64_t comm, uint64_t other)
{
    dl_arena_stats st;
    dl_arena_get_stats(a, &st);
    ck_assert_uint_eq(st.current[DL_MEM_PARAMS], params);
    ck_assert_uint_eq(st.current[DL_MEM_GRADS], grads);
    ck_assert_uint_eq(st.current[DL_MEM_OPTIMIZER], opt);
    ck_assert_uint_eq(st.current[DL_MEM_ACTIVATIONS], act);
    ck_assert_uint_eq(st.current[DL_MEM_COMM], comm);
    ck_assert_uint_eq(st.current[DL_MEM_OTHER], other);
    ck_assert_uint_eq(st.current_total, params + grads + opt + act + comm + other);
}

static void *xalloc(dl_arena *a, dl_mem_category c, size_t n)
{
    void *p = NULL;
    int rc = dl_arena_alloc(a, c, n, &p);
    ck_assert_msg(rc == DL_OK, "alloc %zu: %s %s", n, dl_strstatus(rc), dl_errmsg());
    ck_assert_ptr_nonnull(p);
    return p;
}

START_TEST(test_category_names)
{
    ck_assert_str_eq(dl_mem_category_name(DL_MEM_PARAMS), "params");
    ck_assert_str_eq(dl_mem_category_name(DL_MEM_GRADS), "grads");
    ck_assert_str_eq(dl_mem_category_name(DL_MEM_OPTIMIZER), "optimizer");
    ck_assert_str_eq(dl_mem_category_name(DL_MEM_ACTIVATIONS), "activations");
    ck_assert_str_eq(dl_mem_category_name(DL_MEM_COMM), "comm");
    ck_assert_str_eq(dl_mem_category_name(DL_MEM_OTHER), "other");
    ck_assert_ptr_nonnull(dl_mem_category_name(DL_MEM_NCATEGORIES));
    ck_assert_ptr_nonnull(dl_mem_category_name((dl_mem_category)-1));
}
END_TEST

/* A scripted sequence; every current and peak below was computed by hand. */
START_TEST(test_scripted_stats)
{
    dl_arena *a;
    ck_assert_int_eq(dl_arena_create(&a, 0, 0), DL_OK);
    dl_arena_stats st;
    dl_arena_get_stats(a, &st);
    ck_assert_uint_eq(st.capacity, 0);
    ck_assert_uint_eq(st.allocations, 0);
    expect_current(a, 0, 0, 0, 0, 0, 0);

    void *pa = xalloc(a, DL_MEM_PARAMS, 1000);
    expect_current(a, 1000, 0, 0, 0, 0, 0);
    void *pb = xalloc(a, DL_MEM_GRADS, 2000);
    expect_current(a, 1000, 2000, 0, 0, 0, 0);
    void *pc = xalloc(a, DL_MEM_PARAMS, 500);
    expect_current(a, 1500, 2000, 0, 0, 0, 0);
    dl_arena_free(a, pa);
    expect_current(a, 500, 2000, 0, 0, 0, 0);
    void *pd = xalloc(a, DL_MEM_OPTIMIZER, 4000);
    expect_current(a, 500, 2000, 4000, 0, 0, 0);
    dl_arena_free(a, pb);
    expect_current(a, 500, 0, 4000, 0, 0, 0);

    dl_arena_get_stats(a, &st);
    ck_assert_uint_eq(st.peak[DL_MEM_PARAMS], 1500);
    ck_assert_uint_eq(st.peak[DL_MEM_GRADS], 2000);
    ck_assert_uint_eq(st.peak[DL_MEM_OPTIMIZER], 4000);
    ck_assert_uint_eq(st.peak[DL_MEM_ACTIVATIONS], 0);
    ck_assert_uint_eq(st.peak_total, 6500); /* 500 + 2000 + 4000 just before freeing pb */
    ck_assert_uint_eq(st.allocations, 4);

    /* Peaks restart from the current values. */
    dl_arena_reset_peaks(a);
    dl_arena_get_stats(a, &st);
    ck_assert_uint_eq(st.peak[DL_MEM_PARAMS], 500);
    ck_assert_uint_eq(st.peak[DL_MEM_GRADS], 0);
    ck_assert_uint_eq(st.peak[DL_MEM_OPTIMIZER], 4000);
    ck_assert_uint_eq(st.peak_total, 4500);

    void *pe = xalloc(a, DL_MEM_ACTIVATIONS, 3000);
    void *pf = xalloc(a, DL_MEM_COMM, 100);
    void *pg = xalloc(a, DL_MEM_OTHER, 7);
    expect_current(a, 500, 0, 4000, 3000, 100, 7);
    dl_arena_free(a, pe);
    dl_arena_free(a, pd);
    expect_current(a, 500, 0, 0, 0, 100, 7);
    dl_arena_free(a, NULL); /* ignored */
    expect_current(a, 500, 0, 0, 0, 100, 7);

    dl_arena_get_stats(a, &st);
    ck_assert_uint_eq(st.peak[DL_MEM_PARAMS], 500);
    ck_assert_uint_eq(st.peak[DL_MEM_GRADS], 0);
    ck_assert_uint_eq(st.peak[DL_MEM_OPTIMIZER], 4000);
    ck_assert_uint_eq(st.peak[DL_MEM_ACTIVATIONS], 3000);
    ck_assert_uint_eq(st.peak[DL_MEM_COMM], 100);
    ck_assert_uint_eq(st.peak[DL_MEM_OTHER], 7);
    ck_assert_uint_eq(st.peak_total, 7607);
    ck_assert_uint_eq(st.allocations, 7);

    dl_arena_free(a, pc);
    dl_arena_free(a, pf);
    dl_arena_free(a, pg);
    expect_current(a, 0, 0, 0, 0, 0, 0);
    dl_arena_destroy(a);
}
END_TEST

/* Freed bytes go back to the category they were allocated under, whatever else is live. */
START_TEST(test_free_returns_to_category)
{
    dl_arena *a;
    ck_assert_int_eq(dl_arena_create(&a, 1, 0), DL_OK);
    void *g = xalloc(a, DL_MEM_GRADS, 12345);
    void *o1 = xalloc(a, DL_MEM_OPTIMIZER, 4096);
    void *o2 = xalloc(a, DL_MEM_OPTIMIZER, 1);
    expect_current(a, 0, 12345, 4097, 0, 0, 0);
    dl_arena_free(a, o1);
    expect_current(a, 0, 12345, 1, 0, 0, 0);
    dl_arena_free(a, g);
    expect_current(a, 0, 0, 1, 0, 0, 0);
    dl_arena_free(a, o2);
    expect_current(a, 0, 0, 0, 0, 0, 0);
    dl_arena_destroy(a);
}
END_TEST

START_TEST(test_alignment_and_zero)
{
    static const size_t sizes[] = {0, 1, 63, 64, 4095, 4096, 4097, 100000, 1u << 20};
    dl_arena *a;
    ck_assert_int_eq(dl_arena_create(&a, 0, 0), DL_OK);
    for (int round = 0; round < 2; round++) {
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
            unsigned char *p = xalloc(a, DL_MEM_ACTIVATIONS, sizes[i]);
            ck_assert_uint_eq((uintptr_t)p % 4096, 0);
            for (size_t k = 0; k < sizes[i]; k++)
                ck_assert_msg(p[k] == 0, "size %zu: byte %zu is %u, not 0", sizes[i], k, p[k]);
            /* Dirty it: the second round likely gets the same host block back and must still
             * see zeros. */
            memset(p, 0xA5, sizes[i]);
            dl_arena_free(a, p);
        }
    }
    dl_arena_destroy(a);
}
END_TEST

START_TEST(test_zero_bytes)
{
    dl_arena *a;
    ck_assert_int_eq(dl_arena_create(&a, 2, 4096), DL_OK);
    void *fill = xalloc(a, DL_MEM_PARAMS, 4096); /* arena now full */
    void *z1 = xalloc(a, DL_MEM_COMM, 0);
    void *z2 = xalloc(a, DL_MEM_COMM, 0);
    ck_assert_ptr_ne(z1, z2);
    ck_assert_ptr_ne(z1, fill);
    ck_assert_uint_eq((uintptr_t)z1 % 4096, 0);
    dl_arena_stats st;
    dl_arena_get_stats(a, &st);
    ck_assert_uint_eq(st.allocations, 3);
    ck_assert_uint_eq(st.current[DL_MEM_COMM], 0);
    ck_assert_uint_eq(st.current_total, 4096);
    dl_arena_free(a, z1);
    dl_arena_free(a, z2);
    dl_arena_free(a, fill);
    dl_arena_destroy(a);
}
END_TEST

static void fill_pattern(unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(seed * 131u + i * 7u);
}

static int check_pattern(const unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != (unsigned char)(seed * 131u + i * 7u))
            return 0;
    return 1;
}

START_TEST(test_capacity_exceeded)
{
    const uint64_t cap = 1048576;
    dl_arena *a;
    ck_assert_int_eq(dl_arena_create(&a, 3, cap), DL_OK);
    unsigned char *pp = xalloc(a, DL_MEM_PARAMS, 400000);
    unsigned char *po = xalloc(a, DL_MEM_OPTIMIZER, 600000);
    fill_pattern(pp, 400000, 1);
    fill_pattern(po, 600000, 2);

    dl_arena_stats before, after;
    dl_arena_get_stats(a, &before);
    ck_assert_uint_eq(before.capacity, cap);
    void *q = (void *)0x1;
    dl_error_clear();
    int rc = dl_arena_alloc(a, DL_MEM_OPTIMIZER, 100000, &q);
    ck_assert_int_eq(rc, DL_ENOMEM);
    ck_assert_ptr_null(q);
    const char *msg = dl_errmsg();
    /* In MiB: asked 100000 B = 0.095, capacity 1.000, in use 1000000 B = 0.954 of which the
     * optimizer's 600000 B = 0.572, left 48576 B = 0.046 (and the bytes asked exactly). */
    ck_assert_msg(strstr(msg, "rank 3") != NULL, "no rank in: %s", msg);
    ck_assert_msg(strstr(msg, "0.095 MiB (100000 bytes) of optimizer") != NULL,
                  "no bytes asked in: %s", msg);
    ck_assert_msg(strstr(msg, "capacity 1.000 MiB") != NULL, "no capacity in: %s", msg);
    ck_assert_msg(strstr(msg, "in use 0.954 MiB (optimizer 0.572 MiB)") != NULL,
                  "no use (of the category) in: %s", msg);
    ck_assert_msg(strstr(msg, "left 0.046 MiB") != NULL, "no bytes left in: %s", msg);

    /* The failed allocation changed nothing. */
    dl_arena_get_stats(a, &after);
    ck_assert_int_eq(memcmp(&before, &after, sizeof before), 0);
    ck_assert(check_pattern(pp, 400000, 1));
    ck_assert(check_pattern(po, 600000, 2));

    /* Exactly what is left still fits; then one more byte does not. */
    unsigned char *rest = xalloc(a, DL_MEM_ACTIVATIONS, 48576);
    dl_arena_get_stats(a, &after);
    ck_assert_uint_eq(after.current_total, cap);
    ck_assert_uint_eq(after.peak_total, cap);
    rc = dl_arena_alloc(a, DL_MEM_GRADS, 1, &q);
    ck_assert_int_eq(rc, DL_ENOMEM);
    ck_assert_msg(strstr(dl_errmsg(), "grads") != NULL, "%s", dl_errmsg());
    ck_assert_msg(strstr(dl_errmsg(), "left 0") != NULL, "%s", dl_errmsg());

    /* Freeing makes room again. */
    dl_arena_free(a, po);
    void *again = xalloc(a, DL_MEM_OPTIMIZER, 600000);
    ck_assert(check_pattern(pp, 400000, 1));
    dl_arena_free(a, again);
    dl_arena_free(a, rest);
    dl_arena_free(a, pp);
    expect_current(a, 0, 0, 0, 0, 0, 0);
    dl_arena_destroy(a);
}
END_TEST

START_TEST(test_bad_args)
{
    dl_arena *a;
    void *p;
    ck_assert_int_eq(dl_arena_create(NULL, 0, 0), DL_EINVAL);
    ck_assert_int_eq(dl_arena_create(&a, 0, 0), DL_OK);
    ck_assert_int_eq(dl_arena_alloc(a, DL_MEM_NCATEGORIES, 16, &p), DL_EINVAL);
    ck_assert_int_eq(dl_arena_alloc(a, DL_MEM_PARAMS, 16, NULL), DL_EINVAL);
    ck_assert_int_eq(dl_arena_alloc(NULL, DL_MEM_PARAMS, 16, &p), DL_EINVAL);
    /* A size no host can give (and no header arithmetic may wrap) is DL_ENOMEM, not a crash. */
    ck_assert_int_eq(dl_arena_alloc(a, DL_MEM_PARAMS, SIZE_MAX, &p), DL_ENOMEM);
    ck_assert_ptr_null(p);
    dl_arena_stats st;
    dl_arena_get_stats(a, &st);
    ck_assert_uint_eq(st.allocations, 0);
    ck_assert_uint_eq(st.current_total, 0);
    dl_arena_destroy(a);
    dl_arena_destroy(NULL);
}
END_TEST

/* Destroy releases blocks still live (LeakSanitizer checks this in sanitizer builds). */
START_TEST(test_destroy_releases_live)
{
    dl_arena *a;
    ck_assert_int_eq(dl_arena_create(&a, 0, 0), DL_OK);
    for (int i = 0; i < 10; i++)
        (void)xalloc(a, (dl_mem_category)(i % DL_MEM_NCATEGORIES), 1000u * (unsigned)i);
    dl_arena_destroy(a);
}
END_TEST

/* ---- threads ---- */

enum { NTHREADS = 4, ITERS = 300, KEEP = 5 };

typedef struct worker {
    dl_arena *a;
    int id;
    int failures;                            /* alloc errors or corrupted patterns seen */
    uint64_t live_bytes[DL_MEM_NCATEGORIES]; /* what this thread leaves allocated */
    int live_count;
    void *live[KEEP];
    size_t live_size[KEEP];
} worker;

static size_t worker_size(int id, int i) { return (size_t)(id + 1) * 1000u + (size_t)i * 13u; }

static dl_mem_category worker_cat(int id) { return (dl_mem_category)(id % DL_MEM_NCATEGORIES); }

/* Keep a sliding window of KEEP live blocks, verifying each block's pattern before freeing. */
static void *worker_main(void *arg)
{
    worker *w = arg;
    unsigned seeds[KEEP] = {0};
    for (int i = 0; i < ITERS; i++) {
        int slot = i % KEEP;
        if (w->live[slot]) {
            if (!check_pattern(w->live[slot], w->live_size[slot], seeds[slot]))
                w->failures++;
            dl_arena_free(w->a, w->live[slot]);
            w->live[slot] = NULL;
        }
        size_t n = worker_size(w->id, i);
        void *p = NULL;
        if (dl_arena_alloc(w->a, worker_cat(w->id), n, &p) != DL_OK || !p) {
            w->failures++;
            continue;
        }
        seeds[slot] = (unsigned)(w->id * 1000 + i);
        fill_pattern(p, n, seeds[slot]);
        w->live[slot] = p;
        w->live_size[slot] = n;
    }
    for (int s = 0; s < KEEP; s++)
        if (w->live[s]) {
            if (!check_pattern(w->live[s], w->live_size[s], seeds[s]))
                w->failures++;
            w->live_bytes[worker_cat(w->id)] += w->live_size[s];
            w->live_count++;
        }
    return NULL;
}

START_TEST(test_threads_consistent)
{
    dl_arena *a;
    ck_assert_int_eq(dl_arena_create(&a, 5, 0), DL_OK);
    worker w[NTHREADS];
    pthread_t th[NTHREADS];
    memset(w, 0, sizeof w);
    for (int i = 0; i < NTHREADS; i++) {
        w[i].a = a;
        w[i].id = i;
        ck_assert_int_eq(pthread_create(&th[i], NULL, worker_main, &w[i]), 0);
    }
    for (int i = 0; i < NTHREADS; i++) pthread_join(th[i], NULL);

    uint64_t expect[DL_MEM_NCATEGORIES] = {0}, total = 0;
    for (int i = 0; i < NTHREADS; i++) {
        ck_assert_int_eq(w[i].failures, 0);
        for (int c = 0; c < DL_MEM_NCATEGORIES; c++) {
            expect[c] += w[i].live_bytes[c];
            total += w[i].live_bytes[c];
        }
    }
    dl_arena_stats st;
    dl_arena_get_stats(a, &st);
    for (int c = 0; c < DL_MEM_NCATEGORIES; c++) ck_assert_uint_eq(st.current[c], expect[c]);
    ck_assert_uint_eq(st.current_total, total);
    ck_assert_uint_eq(st.allocations, (uint64_t)NTHREADS * ITERS);
    /* Each thread alone holds at most KEEP blocks, the largest KEEP of its sizes. */
    uint64_t bound = 0;
    for (int i = 0; i < NTHREADS; i++)
        for (int k = 0; k < KEEP; k++) bound += worker_size(i, ITERS - 1 - k);
    ck_assert_uint_le(st.peak_total, bound);
    ck_assert_uint_ge(st.peak_total, total);

    for (int i = 0; i < NTHREADS; i++)
        for (int s = 0; s < KEEP; s++) dl_arena_free(a, w[i].live[s]);
    expect_current(a, 0, 0, 0, 0, 0, 0);
    dl_arena_destroy(a);
}
END_TEST

typedef struct racer {
    dl_arena *a;
    int ok, enomem, other;
    void *got[64];
} racer;

static void *racer_main(void *arg)
{
    racer *r = arg;
    for (int i = 0; i < 64; i++) {
        void *p = NULL;
        int rc = dl_arena_alloc(r->a, DL_MEM_ACTIVATIONS, 10000, &p);
        if (rc == DL_OK)
            r->got[r->ok++] = p;
        else if (rc == DL_ENOMEM)
            r->enomem++;
        else
            r->other++;
    }
    return NULL;
}

/* Threads racing for the last bytes never overshoot the capacity together. */
START_TEST(test_threads_capacity)
{
    dl_arena *a;
    ck_assert_int_eq(dl_arena_create(&a, 6, 105000), DL_OK); /* room for 10 blocks of 10000 */
    racer r[NTHREADS];
    pthread_t th[NTHREADS];
    memset(r, 0, sizeof r);
    for (int i = 0; i < NTHREADS; i++) {
        r[i].a = a;
        ck_assert_int_eq(pthread_create(&th[i], NULL, racer_main, &r[i]), 0);
    }
    int ok = 0, enomem = 0;
    for (int i = 0; i < NTHREADS; i++) {
        pthread_join(th[i], NULL);
        ok += r[i].ok;
        enomem += r[i].enomem;
        ck_assert_int_eq(r[i].other, 0);
    }
    ck_assert_int_eq(ok, 10);
    ck_assert_int_eq(enomem, NTHREADS * 64 - 10);
    dl_arena_stats st;
    dl_arena_get_stats(a, &st);
    ck_assert_uint_eq(st.current_total, 100000);
    ck_assert_uint_eq(st.peak_total, 100000);
    ck_assert_uint_eq(st.allocations, 10);
    for (int i = 0; i < NTHREADS; i++)
        for (int k = 0; k < r[i].ok; k++) dl_arena_free(a, r[i].got[k]);
    expect_current(a, 0, 0, 0, 0, 0, 0);
    dl_arena_destroy(a);
}
END_TEST

/* ---- sizes ---- */

START_TEST(test_parse_size_good)
{
    static const struct {
        const char *s;
        uint64_t v;
    } cases[] = {
        {"0", 0},
        {"4096", 4096},
        {"64k", 65536},
        {"64K", 65536},
        {"64KB", 65536},
        {"64kib", 65536},
        {"64KiB", 65536},
        {"512M", 536870912ULL},
        {"512MiB", 536870912ULL},
        {"512mb", 536870912ULL},
        {"2G", 2147483648ULL},
        {"1.5GiB", 1610612736ULL},
        {"1.5g", 1610612736ULL},
        {"0.5k", 512},
        {"1.25M", 1310720ULL},
        {"1.1K", 1126}, /* 1126.4 rounds down */
        {"1T", 1099511627776ULL},
        {"100B", 100},
        {"100b", 100},
        {"007", 7},
        {"18446744073709551615", UINT64_MAX},
        {"16777215T", 16777215ULL << 40},
        {"15.9999999999999999999T", 17592186044415ULL}, /* 2^44 - 1: floor of just under 16T */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint64_t v = 12345;
        int rc = dl_parse_size(cases[i].s, &v);
        ck_assert_msg(rc == DL_OK, "\"%s\": %s %s", cases[i].s, dl_strstatus(rc), dl_errmsg());
        ck_assert_msg(v == cases[i].v, "\"%s\" gave %llu, expected %llu", cases[i].s,
                      (unsigned long long)v, (unsigned long long)cases[i].v);
    }
}
END_TEST

START_TEST(test_parse_size_bad)
{
    static const char *const bad[] = {
        "",          "abc",
        "-1",        "-1k",
        "+1",        " 1",
        "1 ",        "1 M",
        "12x",       "1.2.3",
        "M",         "k",
        ".",         ".5k",
        "1.",        "1.k",
        "1.5",       "0x10",
        "1iB",       "1KiBB",
        "1Ki",       "1kbb",
        "1E",        "1P",
        "5e3",       "18446744073709551616",
        "16777216T", "99999999999999999999999",
        "1e",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t v = 777;
        dl_error_clear();
        int rc = dl_parse_size(bad[i], &v);
        ck_assert_msg(rc == DL_EINVAL, "\"%s\" accepted as %llu", bad[i], (unsigned long long)v);
        ck_assert_uint_eq(v, 777);
        ck_assert_msg(dl_errmsg()[0] != '\0', "\"%s\": no message", bad[i]);
    }
    uint64_t v;
    ck_assert_int_eq(dl_parse_size(NULL, &v), DL_EINVAL);
    ck_assert_int_eq(dl_parse_size("1k", NULL), DL_EINVAL);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("arena");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_category_names);
    tcase_add_test(tc, test_scripted_stats);
    tcase_add_test(tc, test_free_returns_to_category);
    tcase_add_test(tc, test_alignment_and_zero);
    tcase_add_test(tc, test_zero_bytes);
    tcase_add_test(tc, test_capacity_exceeded);
    tcase_add_test(tc, test_bad_args);
    tcase_add_test(tc, test_destroy_releases_live);
    tcase_add_test(tc, test_threads_consistent);
    tcase_add_test(tc, test_threads_capacity);
    tcase_add_test(tc, test_parse_size_good);
    tcase_add_test(tc, test_parse_size_bad);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_ENV);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
