/* The trainer's modules alone, without a world or a model (lib/parallel/module.h):
 * - the optimizer (lib/train/optim.c): AdamW over ZeRO's shard blocks against the formula
 *   (Loshchilov & Hutter, PyTorch's AdamW) evaluated here in long double, in f64 and f32, on one
 *   rank's blocks of a dp 3 sharding (only the owned elements move, each with its own state); the
 *   learning-rate schedule against its closed form; the clipping factor;
 * - the dp bucket planner (lib/parallel/dp_buckets.c): the buckets of a backward that reports
 *   equal tensors one by one, against ceil(B / s) tensors a bucket from the end, the rest last;
 * - mixed precision's table (lib/train/precision.c): the types and sizes per storage type.
 * Negative controls: a learning rate 1e-6 off fails the AdamW comparison; a planner fed one
 * bucket size is checked against another's boundaries and must disagree. */
#include "../testutil.h"
#include <check.h>
#include <math.h>
#include "train/optim.h"
#include "parallel/dp_buckets.h"

/* ---- AdamW over shards ---- */

typedef struct host_shards {
    char *p, *g; /* whole flat buffers; the blocks are at each unit's begin */
    int es;
} host_shards;

static const dl_zero_units *g_zu; /* the units the callbacks index */
static char *cb_grad(void *arg, int u)
{
    host_shards *h = arg;
    return h->g + g_zu->u[u].begin * (size_t)h->es;
}
static char *cb_param(void *arg, int u)
{
    host_shards *h = arg;
    return h->p + g_zu->u[u].begin * (size_t)h->es;
}

/* The reference: AdamW's formula on one element, long double, state carried by the caller. */
static long double ref_adamw(long double p, long double g, long double *m, long double *v,
                             const tr_adam_hp *hp, long double lr, long double scale, int t)
{
    g *= scale;
    *m = hp->beta1 * *m + (1 - hp->beta1) * g;
    *v = hp->beta2 * *v + (1 - hp->beta2) * g * g;
    long double mh = *m / (1 - powl(hp->beta1, t)), vh = *v / (1 - powl(hp->beta2, t));
    return p - lr * (mh / (sqrtl(vh) + hp->eps) + hp->wd * p);
}

/* Three steps over rank 1's blocks of a dp 3 sharding of units of 7, 10 and 5 elements; every
 * element against the reference. Tolerance: each step's update is ~12 roundings of the storage
 * type (u = 2^-53 or 2^-24), relative to |p| + lr (the update's size); m̂/(sqrt(v̂)+eps) is
 * well conditioned with eps = 1e-8 and |g| >= 0.1, so the error stays below 3 steps x 12 u x 4
 * (the amplification through sqrt and the division): tol = 150 u. Returns the largest error
 * relative to tol (pass: <= 1). lr_skew perturbs the optimizer's learning rate (negative
 * control). */
static double adamw_case(dl_dtype dt, double lr_skew)
{
    const size_t bounds[4] = {0, 7, 17, 22};
    dl_zero_units zu;
    ck_assert_int_eq(dl_zero_units_init(&zu, bounds, 3, 3, 1), DL_OK);
    g_zu = &zu;
    tr_prec pr;
    tr_prec_init(&pr, dt);
    int es = pr.dsize;
    size_t P = 22;
    host_shards h = {calloc(P, (size_t)es), calloc(P, (size_t)es), es};
    long double rp[22], rm[22] = {0}, rv[22] = {0};
    for (size_t i = 0; i < P; i++) {
        double p0 = 0.5 - 0.037 * (double)i;
        if (es == 8)
            ((double *)h.p)[i] = p0;
        else
            ((float *)h.p)[i] = (float)p0;
        rp[i] = es == 8 ? ((double *)h.p)[i] : ((float *)h.p)[i];
    }
    tr_shards sh = {&zu, cb_grad, cb_param, NULL, &h};
    tr_adam_hp hp = {0.9, 0.999, 1e-8, 0.01};
    tr_optim op;
    ck_assert_int_eq(tr_optim_init(&op, &sh, &pr, &hp, NULL), DL_OK);
    double lr = 3e-3, scale = 0.75, worst = 0, u = es == 8 ? 0x1p-53 : 0x1p-24;
    for (int t = 1; t <= 3; t++) {
        for (size_t i = 0; i < P; i++) {
            double gi = (i % 2 ? 1 : -1) * (0.1 + 0.05 * (double)((i * 7 + (size_t)t) % 11));
            if (es == 8)
                ((double *)h.g)[i] = gi;
            else
                ((float *)h.g)[i] = (float)gi;
        }
        tr_optim_step(&op, scale, lr * (1 + lr_skew));
        for (int k = 0; k < zu.n; k++)
            for (size_t i = zu.u[k].begin; i < zu.u[k].begin + zu.u[k].owned; i++) {
                long double g = es == 8 ? ((double *)h.g)[i] : ((float *)h.g)[i];
                rp[i] = ref_adamw(rp[i], g, &rm[i], &rv[i], &hp, lr, scale, t);
            }
        for (size_t i = 0; i < P; i++) {
            double got = es == 8 ? ((double *)h.p)[i] : ((float *)h.p)[i];
            double err = fabs(got - (double)rp[i]) / ((fabs((double)rp[i]) + lr) * 150 * u);
            worst = err > worst ? err : worst;
        }
    }
    ck_assert_int_eq(op.t, 3);
    tr_optim_free(&op);
    dl_zero_units_free(&zu);
    free(h.p), free(h.g);
    return worst;
}

START_TEST(adamw_over_shards)
{
    double e64 = adamw_case(DL_F64, 0), e32 = adamw_case(DL_F32, 0);
    fprintf(stderr, "AdamW vs formula: f64 %.3g, f32 %.3g of the tolerance\n", e64, e32);
    ck_assert(e64 <= 1);
    ck_assert(e32 <= 1);
    /* negative control: the learning rate 1e-6 off moves every owned element by ~1e-9 relative,
     * far past f64's tolerance (150 u ~ 1.7e-14) */
    ck_assert(adamw_case(DL_F64, 1e-6) > 1);
}
END_TEST

/* Elements outside rank 1's blocks keep their values (adamw_case's reference never moves them:
 * an update there would show as an error); checked here directly as well. */
START_TEST(only_owned_move)
{
    const size_t bounds[3] = {0, 9, 13};
    dl_zero_units zu;
    ck_assert_int_eq(dl_zero_units_init(&zu, bounds, 2, 2, 0), DL_OK);
    g_zu = &zu;
    tr_prec pr;
    tr_prec_init(&pr, DL_F64);
    double p[13], g[13];
    for (int i = 0; i < 13; i++) p[i] = 1, g[i] = 1;
    host_shards h = {(char *)p, (char *)g, 8};
    tr_shards sh = {&zu, cb_grad, cb_param, NULL, &h};
    tr_adam_hp hp = {0.9, 0.999, 1e-8, 0};
    tr_optim op;
    ck_assert_int_eq(tr_optim_init(&op, &sh, &pr, &hp, NULL), DL_OK);
    tr_optim_step(&op, 1, 0.1);
    int moved = 0;
    for (int i = 0; i < 13; i++) {
        int owned = i < 5 || (i >= 9 && i < 11); /* rank 0: ceil(9/2) = 5 of unit 0, 2 of unit 1 */
        ck_assert_msg((p[i] != 1) == owned, "element %d", i);
        moved += p[i] != 1;
    }
    ck_assert_int_eq(moved, 7);
    tr_optim_free(&op);
    dl_zero_units_free(&zu);
}
END_TEST

START_TEST(lr_schedule)
{
    double lr = 3e-3, mn = 3e-4;
    /* warm-up: linear from lr / warmup at step 1 to lr at step warmup */
    ck_assert(fabs(tr_lr_at(lr, mn, 20, 200, 1) - lr / 20) <= 1e-18);
    ck_assert(fabs(tr_lr_at(lr, mn, 20, 200, 10) - lr / 2) <= 1e-18);
    ck_assert(tr_lr_at(lr, mn, 20, 200, 20) == lr);
    /* cosine: halfway between lr and min_lr half-way through the decay, min_lr at its end and
     * after it (cos(pi/2) = 6e-17: within 1e-18 of the sum) */
    ck_assert(fabs(tr_lr_at(lr, mn, 20, 200, 110) - (lr + mn) / 2) <= 1e-18);
    ck_assert(fabs(tr_lr_at(lr, mn, 20, 200, 200) - mn) <= 1e-18);
    ck_assert(fabs(tr_lr_at(lr, mn, 20, 200, 250) - mn) <= 1e-18);
    /* a quarter: min + (lr - min)(1 + cos(pi/4)) / 2 */
    double q = mn + (lr - mn) * (1 + sqrt(0.5)) / 2;
    ck_assert(fabs(tr_lr_at(lr, mn, 20, 200, 65) - q) <= 1e-15 * lr);
    /* no decay left: lr throughout; no warm-up: the cosine from step 1 */
    ck_assert(tr_lr_at(lr, mn, 20, 20, 20) == lr);
    ck_assert(tr_lr_at(lr, mn, 0, 100, 100) == mn);
    ck_assert(tr_clip_scale(1.0, 4.0) == 0.25);
    ck_assert(tr_clip_scale(1.0, 0.5) == 1.0);
    ck_assert(tr_clip_scale(0.0, 4.0) == 1.0);
}
END_TEST

/* ---- the bucket planner ---- */

/* The backward of N tensors of s elements reports each as final, last first (first = k s for
 * k = N-1 .. 0), then once more 0 (the runner's final call). Returns the buckets' count and
 * their [lo, lo + n) in lo[], n[]. */
static int plan(int N, size_t s, size_t B, size_t *lo, size_t *n)
{
    size_t launched = (size_t)N * s;
    int nb = 0;
    for (int k = N - 1; k >= -1; k--) {
        size_t first = k < 0 ? 0 : (size_t)k * s;
        if (tr_bucket_next(&launched, first, B, &lo[nb], &n[nb]))
            nb++;
    }
    return nb;
}

/* The formula: c = max(1, ceil(B / s)) tensors a bucket, from the end; the first tensors' rest
 * (N mod c of them) are the last bucket. */
static int formula(int N, size_t s, size_t B, size_t *lo, size_t *n)
{
    int c = B == 0 ? 1 : (int)((B + s - 1) / s), nb = 0;
    for (int hi = N; hi > 0; hi -= c) {
        int a = hi - c > 0 ? hi - c : 0;
        lo[nb] = (size_t)a * s, n[nb] = (size_t)(hi - a) * s, nb++;
    }
    return nb;
}

START_TEST(bucket_boundaries)
{
    size_t lo[64], n[64], flo[64], fn[64];
    const size_t Bs[] = {0, 1, 100, 250, 300, 301, 1000, 1 << 20};
    for (int N = 1; N <= 13; N++)
        for (size_t b = 0; b < sizeof Bs / sizeof Bs[0]; b++) {
            int k = plan(N, 100, Bs[b], lo, n), f = formula(N, 100, Bs[b], flo, fn);
            ck_assert_msg(k == f, "N %d, B %zu: %d buckets, the formula %d", N, Bs[b], k, f);
            size_t covered = 0;
            for (int i = 0; i < k; i++) {
                ck_assert_msg(lo[i] == flo[i] && n[i] == fn[i], "N %d B %zu bucket %d", N, Bs[b],
                              i);
                covered += n[i];
            }
            ck_assert(covered == (size_t)N * 100); /* every gradient exactly once */
        }
    /* negative control: 13 tensors, bucket 250 (3 a bucket) against the formula for 350 (4) */
    int k = plan(13, 100, 250, lo, n), f = formula(13, 100, 350, flo, fn);
    ck_assert(k != f || lo[0] != flo[0]);
}
END_TEST

START_TEST(precision_table)
{
    tr_prec p;
    tr_prec_init(&p, DL_BF16);
    ck_assert(p.bf16 && p.dsize == 2 && p.ct == DL_F32 && p.csize == 4);
    tr_prec_init(&p, DL_F64);
    ck_assert(!p.bf16 && p.dsize == 8 && p.ct == DL_F64 && p.csize == 8);
    double a[3] = {1, 2, 3}, b[3] = {0.5, 0.25, 0.125};
    p.acc(a, b, 3);
    ck_assert(a[0] == 1.5 && a[1] == 2.25 && a[2] == 3.125);
    ck_assert(p.sumsq(b, 3) == 0.25 + 0.0625 + 0.015625);
    tr_prec_init(&p, DL_F32);
    ck_assert(!p.bf16 && p.dsize == 4 && p.ct == DL_F32);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("train_modules");
    TCase *tc = tcase_create("train_modules");
    tcase_add_test(tc, adamw_over_shards);
    tcase_add_test(tc, only_owned_move);
    tcase_add_test(tc, lr_schedule);
    tcase_add_test(tc, bucket_boundaries);
    tcase_add_test(tc, precision_table);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
