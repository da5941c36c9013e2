/* The training engine: data, tensor and combined parallelism train exactly the model one rank
 * trains (within the rounding bounds of lib/train/compare.h, f64 and f32), gradient bytes per
 * step are the ring's 2(d-1)/d, overlap changes nothing, loss goes down, bad configurations are
 * refused. */
#include "../testutil.h"
#include <check.h>
#include <math.h>

static dl_train_opts base(int dp, int tp, dl_dtype dt)
{
    dl_train_opts o;
    dl_train_opts_init(&o);
    o.model.layers = 2;
    o.model.d_model = 32;
    o.model.heads = 4;
    o.model.seq = 16;
    o.precision.dtype = dt;
    o.layout.dp = dp;
    o.layout.tp = tp;
    o.batch.micro = 2;
    o.batch.microbatches = 2;
    o.optim.steps = DL_TEST_SMALL ? 3 : 5;
    o.optim.warmup = 2;
    o.optim.lr = 1e-2;
    o.optim.min_lr = 1e-3;
    o.eval.windows = 4;
    o.output.log_every = 0;
    o.comm.bucket_mb = 0.01; /* several buckets */
    o.output.want_params = 1;
    o.machine.timeout_s = 120;
    return o;
}


/* Train `o` and the same configuration on one rank (microbatches scaled so the global batch is
 * the same): the same model within the bounds of lib/train/compare.h (tu_compare_runs: every step's
 * loss, the first step's gradients and parameters tightly, the last step's parameters within
 * Adam's amplification of rounding). Returns tu_same_model's verdict. */
static int vs_one_rank(dl_train_opts o, dl__test_hook *hook, char *why, size_t wn)
{
    dl_train_opts one = o;
    one.layout.dp = 1;
    one.layout.tp = 1;
    one.batch.microbatches = o.layout.dp * o.batch.microbatches;
    one.batch.micro = o.batch.micro;
    one.batch.global = 0;
    return tu_same_model(o, hook, one, why, wn);
}

static void equals_one_rank(dl_train_opts o)
{
    char why[512];
    int same = vs_one_rank(o, NULL, why, sizeof why);
    ck_assert_msg(same == 1, "dp %d tp %d %s: %s", o.layout.dp, o.layout.tp,
                  dl_dtype_name(o.precision.dtype), why);
}

/* A negative control: the layout made wrong by the hook must fail the same comparison. */
static void control_differs(dl_train_opts o, dl__test_hook h, const char *what)
{
    char why[512];
    int same = vs_one_rank(o, &h, why, sizeof why);
    ck_assert_msg(same != -1, "%s: %s", what, why);
    ck_assert_msg(atomic_load(&h.skipped) + atomic_load(&h.perturbed) > 0,
                  "%s: the hook never fired", what);
    ck_assert_msg(same == 0, "dp %d tp %d %s, %s: passed as the same model", o.layout.dp,
                  o.layout.tp, dl_dtype_name(o.precision.dtype), what);
    fprintf(stderr, "control dp %d tp %d %s, %s: differs (%s)\n", o.layout.dp, o.layout.tp,
            dl_dtype_name(o.precision.dtype), what, why);
}

/* The bounds are tight: a layout that skips one gradient all-reduce (dp: the first bucket;
 * tp: the first all-reduce of the backward, after the forward's 2 per layer) and one parameter
 * element of one rank perturbed by 1e-6 (f64) or 1e-3 (f32) relative fail them. */
START_TEST(controls)
{
    for (int f = 0; f < 2; f++) {
        dl_dtype dt = f ? DL_F32 : DL_F64;
        dl_train_opts o = base(2, 1, dt);
        control_differs(o, tu_skip_hook(DL_PURPOSE_GRADS, 1), "first gradient bucket not reduced");
        control_differs(o, tu_perturb_hook(&o), "one element perturbed");
        o = base(1, 2, dt);
        control_differs(o, tu_skip_hook(DL_PURPOSE_ACTIVATIONS, 2 * o.model.layers + 1),
                        "first backward all-reduce skipped");
        control_differs(o, tu_perturb_hook(&o), "one element perturbed");
        o = base(2, 2, dt);
        control_differs(o, tu_perturb_hook(&o), "one element perturbed");
    }
}
END_TEST

START_TEST(dp2_f64) { equals_one_rank(base(2, 1, DL_F64)); }
END_TEST
START_TEST(dp4_f64) { equals_one_rank(base(4, 1, DL_F64)); }
END_TEST
START_TEST(tp2_f64) { equals_one_rank(base(1, 2, DL_F64)); }
END_TEST
START_TEST(tp4_f64) { equals_one_rank(base(1, 4, DL_F64)); }
END_TEST
START_TEST(tp8_f64)
{
    dl_train_opts o = base(1, 8, DL_F64);
    o.model.heads = 8;
    equals_one_rank(o);
}
END_TEST
START_TEST(dp2tp2_f64) { equals_one_rank(base(2, 2, DL_F64)); }
END_TEST
START_TEST(dp2_f32) { equals_one_rank(base(2, 1, DL_F32)); }
END_TEST
START_TEST(dp2tp2_f32) { equals_one_rank(base(2, 2, DL_F32)); }
END_TEST

START_TEST(recompute_f64)
{
    dl_train_opts o = base(1, 2, DL_F64);
    o.precision.recompute = DL_RECOMPUTE_FULL;
    equals_one_rank(o);
}
END_TEST

/* With the ring, each rank sends exactly 2(d-1)/d of the gradient bytes per step under the
 * gradient tag (up to the remainder of each bucket's split into d blocks). */
START_TEST(gradient_bytes)
{
    for (int d = 2; d <= 4; d += 2) {
        dl_train_opts o = base(d, 1, DL_F32);
        o.comm.algo = DL_ALGO_RING;
        o.output.want_params = 0;
        dl_train_result r;
        ck_assert_msg(dl_train_run(&o, &r) == DL_OK, "%s", dl_errmsg());
        double expect = 2.0 * (d - 1) / d * (double)r.memory.grad_bytes;
        /* each bucket's blocks differ by at most one element of 4 bytes */
        ck_assert_msg(fabs(r.comm.dp_grads - expect) <= 2.0 * d * 4 * 64,
                      "d %d: %.0f bytes per step, ring formula %.0f", d, r.comm.dp_grads, expect);
        ck_assert(r.comm.tp_activations == 0);
        dl_train_result_free(&r);
    }
}
END_TEST

/* tp: 2 all-reduces of N*C elements forward and 2 backward per layer, per micro-batch; each
 * rank sends 2(t-1)/t of each. */
START_TEST(tp_activation_bytes)
{
    dl_train_opts o = base(1, 2, DL_F32);
    o.comm.algo = DL_ALGO_RING;
    o.output.want_params = 0;
    dl_train_result r;
    ck_assert_msg(dl_train_run(&o, &r) == DL_OK, "%s", dl_errmsg());
    double N = o.batch.micro * o.model.seq, C = o.model.d_model, t = o.layout.tp;
    double per_ar = 2.0 * (t - 1) / t * N * C * 4;
    double expect = 4.0 * o.model.layers * o.batch.microbatches * per_ar;
    ck_assert_msg(fabs(r.comm.tp_activations - expect) < 1, "%.0f vs %.0f", r.comm.tp_activations,
                  expect);
    dl_train_result_free(&r);
}
END_TEST

START_TEST(overlap_same)
{
    dl_train_opts a = base(2, 1, DL_F64), b = a;
    b.comm.overlap = 1;
    dl_train_result ra, rb;
    ck_assert_msg(dl_train_run(&a, &ra) == DL_OK, "%s", dl_errmsg());
    ck_assert_msg(dl_train_run(&b, &rb) == DL_OK, "%s", dl_errmsg());
    char name[48];
    ck_assert(dl__eq_worst_tensor(&a.model, ra.output.params, rb.output.params, name) == 0.0);
    dl_train_result_free(&ra);
    dl_train_result_free(&rb);
}
END_TEST

/* A real training assertion: the loss on the built-in corpus drops well below ln 256. */
START_TEST(loss_decreases)
{
    dl_train_opts o = base(2, 1, DL_F32);
    o.model.d_model = 64;
    o.model.seq = 32;
    o.batch.micro = 8;
    o.batch.microbatches = 1;
    o.optim.steps = DL_TEST_SMALL ? 60 : 150;
    o.optim.warmup = 10;
    o.optim.lr = 3e-3;
    o.optim.min_lr = 3e-4;
    o.output.want_params = 0;
    dl_train_result r;
    ck_assert_msg(dl_train_run(&o, &r) == DL_OK, "%s", dl_errmsg());
    double first = r.steps[0].loss, last = r.optim.final_loss;
    ck_assert_msg(first > 5.3 && first < 5.8, "initial loss %.3f (ln 256 = 5.545)", first);
    ck_assert_msg(last < first - 1.0, "loss %.3f -> %.3f: not learning", first, last);
    ck_assert(r.eval.final_val_loss < first - 1.0);
    ck_assert(r.data.floor > 1.2 && r.data.floor < 1.22);
    dl_train_result_free(&r);
}
END_TEST

START_TEST(bad_configs)
{
    dl_train_opts o = base(2, 2, DL_F32);
    o.model.heads = 3;
    o.model.d_model = 33;
    ck_assert_int_eq(dl_train_resolve(&o, 4), DL_EINVAL);
    o = base(2, 3, DL_F32);
    ck_assert_int_eq(dl_train_resolve(&o, 6), DL_EINVAL);
    ck_assert_ptr_nonnull(strstr(dl_errmsg(), "tp 2 fits"));
    o = base(2, 1, DL_F32);
    ck_assert_int_eq(dl_train_resolve(&o, 3), DL_EINVAL);
    ck_assert_ptr_nonnull(strstr(dl_errmsg(), "rank count"));
    o = base(2, 1, DL_F32);
    o.batch.micro = 0;
    o.batch.microbatches = 0;
    o.batch.global = 7;
    ck_assert_int_eq(dl_train_resolve(&o, 2), DL_EINVAL);
    ck_assert_ptr_nonnull(strstr(dl_errmsg(), "try --global-batch 8"));
    o = base(2, 1, DL_F32);
    o.batch.global = 9; /* with micro 2, microbatches 2: 2*2*2 = 8 */
    ck_assert_int_eq(dl_train_resolve(&o, 2), DL_EINVAL);
    o = base(1, 1, DL_F32);
    o.data.path = "/nonexistent/file";
    dl_train_result r;
    ck_assert_int_ne(dl_train_run(&o, &r), DL_OK);
    ck_assert_ptr_nonnull(strstr(dl_errmsg(), "/nonexistent/file"));
    dl_train_result_free(&r);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("train");
    TCase *tc = tcase_create("train");
    tcase_set_timeout(tc, 900);
    tcase_add_test(tc, bad_configs);
    tcase_add_test(tc, dp2_f64);
    tcase_add_test(tc, tp2_f64);
    tcase_add_test(tc, dp2tp2_f64);
    tcase_add_test(tc, dp2_f32);
    tcase_add_test(tc, controls);
    tcase_add_test(tc, gradient_bytes);
    tcase_add_test(tc, tp_activation_bytes);
    tcase_add_test(tc, overlap_same);
    tcase_add_test(tc, loss_decreases);
    if (!DL_TEST_SMALL) {
        tcase_add_test(tc, dp4_f64);
        tcase_add_test(tc, tp4_f64);
        tcase_add_test(tc, tp8_f64);
        tcase_add_test(tc, dp2tp2_f32);
        tcase_add_test(tc, recompute_f64);
    }
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
