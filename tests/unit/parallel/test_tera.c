/* TeraPipe's slice lengths (include/distlab/tera.h): the dynamic program against brute force
 * over every cut of small sequences (several stage counts, granularities and cost models,
 * including costs unrelated to the token counts); the objective of its answer recomputed; the
 * latency fit recovering a known model exactly and reporting the error of a perturbed one; the
 * slice FLOPs against their sum written out; bad arguments refused. */
#include "../testutil.h"
#include <check.h>
#include <float.h>
#include <math.h>

/* a model whose later slices cost more: t = 1 + 0.05 l + 0.002 l (ctx + (l+1)/2) */
static double model_cost(void *arg, int l, int ctx)
{
    const dl_tera_latency *m = arg;
    return dl_tera_latency_eval(m, l, ctx);
}

/* arbitrary positive costs of (l, ctx): the program must not rely on any shape */
static double hash_cost(void *arg, int l, int ctx)
{
    (void)arg;
    return 0.1 + (double)(tu_splitmix64((uint64_t)l * 1000003u + (uint64_t)ctx) % 1000) / 100.0;
}

/* the least objective over all 2^(u-1) cuts of u units of gran tokens */
static double brute(int T, int K, int gran, dl_tera_cost_fn cost, void *arg)
{
    int u = T / gran, lens[64];
    double best = DBL_MAX;
    for (uint32_t mask = 0; mask < (1u << (u - 1)); mask++) {
        int n = 0, start = 0;
        for (int k = 1; k <= u; k++)
            if (k == u || (mask >> (k - 1) & 1u))
                lens[n++] = (k - start) * gran, start = k;
        double o = dl_tera_objective(lens, n, K, cost, arg);
        best = o < best ? o : best;
    }
    return best;
}

static void check_dp(int T, int K, int gran, dl_tera_cost_fn cost, void *arg)
{
    int lens[64], n = 0, sum = 0;
    double obj = 0;
    ck_assert_int_eq(dl_tera_slices(T, K, gran, cost, arg, lens, &n, &obj), DL_OK);
    for (int i = 0; i < n; i++) {
        ck_assert_int_eq(lens[i] % gran, 0);
        sum += lens[i];
    }
    ck_assert_int_eq(sum, T);
    /* the same additions in another order: a few ulps of the objective (< 1e-12 relative) */
    double again = dl_tera_objective(lens, n, K, cost, arg), b = brute(T, K, gran, cost, arg);
    ck_assert_msg(fabs(again - obj) <= 1e-12 * obj, "T %d K %d: reported %.17g, slices give %.17g",
                  T, K, obj, again);
    ck_assert_msg(fabs(obj - b) <= 1e-12 * b, "T %d K %d gran %d: program %.17g, brute force %.17g",
                  T, K, gran, obj, b);
}

START_TEST(dp_equals_brute_force)
{
    dl_tera_latency m = {1.0, 0.05, 0.002};
    static const int Ks[] = {1, 2, 4, 8};
    for (int i = 0; i < 4; i++) {
        for (int T = 1; T <= 14; T++) {
            check_dp(T, Ks[i], 1, model_cost, &m);
            check_dp(T, Ks[i], 1, hash_cost, NULL);
        }
        check_dp(48, Ks[i], 4, model_cost, &m); /* 12 units of 4 tokens */
        check_dp(36, Ks[i], 3, hash_cost, NULL);
    }
}
END_TEST

/* With a growing attention cost and many stages the later slices come out shorter. */
START_TEST(dp_shortens_later_slices)
{
    dl_tera_latency m = {0.01, 1.0, 0.05};
    int lens[64], n = 0;
    ck_assert_int_eq(dl_tera_slices(64, 8, 4, model_cost, &m, lens, &n, NULL), DL_OK);
    ck_assert_int_gt(n, 2);
    ck_assert_int_gt(lens[0], lens[n - 1]);
}
END_TEST

START_TEST(fit_recovers_model)
{
    dl_tera_latency m = {3e-4, 2e-5, 7e-8}, f;
    int l[12], ctx[12], n = 0;
    double t[12], rms = 1, mx = 1;
    for (int a = 1; a <= 64; a *= 4)
        for (int c = 0; c <= 128; c += 64)
            l[n] = a, ctx[n] = c, t[n] = dl_tera_latency_eval(&m, a, c), n++;
    ck_assert_int_eq(dl_tera_latency_fit(l, ctx, t, n, &f, &rms, &mx), DL_OK);
    /* exact data: the normal equations' rounding only (condition number of the scaled system
     * below 1e8 here, so about 1e8 · eps ≈ 2e-8 relative at worst) */
    ck_assert_double_le(fabs(f.a - m.a) / m.a, 1e-6);
    ck_assert_double_le(fabs(f.b - m.b) / m.b, 1e-6);
    ck_assert_double_le(fabs(f.c - m.c) / m.c, 1e-6);
    ck_assert_double_le(mx, 1e-6);
    /* one point 10% off: the fit's largest error is visible (between 1% and 10%) */
    t[5] *= 1.1;
    ck_assert_int_eq(dl_tera_latency_fit(l, ctx, t, n, &f, &rms, &mx), DL_OK);
    ck_assert_double_gt(mx, 0.01);
    ck_assert_double_lt(mx, 0.1);
    ck_assert_double_gt(rms, 0);
    /* one shape only: the model is not determined */
    int l1[3] = {8, 8, 8}, c1[3] = {0, 0, 0};
    double t1[3] = {1, 1, 1};
    ck_assert_int_eq(dl_tera_latency_fit(l1, c1, t1, 3, &f, NULL, NULL), DL_EINVAL);
    ck_assert_int_eq(dl_tera_latency_fit(l, ctx, t, 2, &f, NULL, NULL), DL_EINVAL);
}
END_TEST

/* The FLOPs against the sum of the per-query attention work written out: query i of the slice
 * reads ctx + i + 1 keys, 4 C flops each (Q·K and P·V), plus the linears' 24 l C², times 3. */
START_TEST(slice_flops)
{
    int C = 16;
    for (int l = 1; l <= 9; l += 4)
        for (int ctx = 0; ctx <= 20; ctx += 10) {
            double att = 0;
            for (int i = 0; i < l; i++) att += 4.0 * C * (ctx + i + 1);
            double want = 3 * (24.0 * l * C * C + att);
            ck_assert_double_eq_tol(dl_tera_slice_flops(l, ctx, C), want, 1e-9 * want);
        }
}
END_TEST

/* The simulator with TeraPipe's growing chunk costs: factors of mean 1, increasing over equal
 * slices; forwards alone (b = 0) through p stages take Σ a_j + (p−1)·max a_j when every stage
 * spends a_j on job j (a permutation flow shop with stage-independent times), which the
 * simulation must reproduce; and factors all 1 give the lecture's (p−1)/(m+p−1). */
START_TEST(sim_chunk_costs)
{
    enum { P = 4, NSEQ = 2, CH = 4 };
    int lens[CH] = {8, 8, 8, 8};
    double scale[NSEQ * CH], mean = 0;
    ck_assert_int_eq(dl_tera_chunk_scale(NSEQ, CH, lens, 16, scale), DL_OK);
    for (int j = 0; j < NSEQ * CH; j++) mean += scale[j] / (NSEQ * CH);
    ck_assert_double_eq_tol(mean, 1.0, 1e-12);
    for (int k = 1; k < CH; k++) ck_assert_double_gt(scale[k], scale[k - 1]);
    ck_assert_double_eq(scale[CH], scale[0]);
    dl_sched *s = NULL;
    dl_sched_sim *sim = NULL;
    ck_assert_int_eq(dl_sched_terapipe(P, NSEQ, CH, &s), DL_OK);
    dl_sched_costs c;
    dl_sched_costs_init(&c);
    c.b = 0;
    ck_assert_int_eq(dl_sched_simulate_scaled(s, &c, scale, &sim), DL_OK);
    double sum = 0, mx = 0;
    for (int j = 0; j < NSEQ * CH; j++) sum += scale[j], mx = fmax(mx, scale[j]);
    ck_assert_double_eq_tol(sim->makespan, sum + (P - 1) * mx, 1e-12 * sum);
    dl_sched_sim_free(sim);
    double ones[NSEQ * CH];
    for (int j = 0; j < NSEQ * CH; j++) ones[j] = 1;
    c.b = 2;
    ck_assert_int_eq(dl_sched_simulate_scaled(s, &c, ones, &sim), DL_OK);
    ck_assert_double_eq_tol(sim->bubble_total, 3.0 / 11.0, 1e-12);
    dl_sched_sim_free(sim);
    ones[3] = -1; /* refused */
    ck_assert_int_eq(dl_sched_simulate_scaled(s, &c, ones, &sim), DL_EINVAL);
    dl_sched_free(s);
}
END_TEST

START_TEST(bad_arguments)
{
    int lens[8], n;
    dl_tera_latency m = {1, 1, 1};
    ck_assert_int_eq(dl_tera_slices(10, 2, 3, model_cost, &m, lens, &n, NULL), DL_EINVAL);
    ck_assert_int_eq(dl_tera_slices(0, 2, 1, model_cost, &m, lens, &n, NULL), DL_EINVAL);
    ck_assert_int_eq(dl_tera_slices(8, 0, 1, model_cost, &m, lens, &n, NULL), DL_EINVAL);
    ck_assert_ptr_nonnull(strstr(dl_errmsg(), "K >= 1"));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("tera");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, dp_equals_brute_force);
    tcase_add_test(tc, dp_shortens_later_slices);
    tcase_add_test(tc, fit_recovers_model);
    tcase_add_test(tc, slice_flops);
    tcase_add_test(tc, sim_chunk_costs);
    tcase_add_test(tc, bad_arguments);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
