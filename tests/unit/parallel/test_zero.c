/* ZeRO stages 1, 2 and 3 (f32, f64, bf16 mixed precision) over the dp group: the sharding
 * arithmetic (padding; contiguous shards and columns, kept for the planner; per-unit blocks, what
 * the trainer uses); stages 1-3 train exactly the model stage 0 of the same layout trains (dp 4,
 * dp 2 x tp 2; f64 and f32 within the rounding bounds of lib/train/compare.h, and negative controls
 * that fail them); bf16: bitwise
 * the same reduced gradients and master weights at every stage (one micro-batch); parameter
 * counts not divisible by dp (padding); dp 1 (a no-op); overlap and bucket sizes change nothing;
 * the arena's params / grads / optimizer peaks and the bytes each rank sends per step are
 * asserted exactly (check_figures: bf16's 16 / 4+12/N / 2+14/N / 16/N bytes per element, and
 * 2 or 3 Psi(d-1)/d elements sent with one micro-batch); a non-finite gradient skips its step;
 * --gpu-mem: a model too big for stage 0 trains at stage 3; stages outside 0..3 are refused. */
#include "../testutil.h"
#include <check.h>
#include <math.h>
#include "parallel/zero.h"

/* ---- the arithmetic ---- */

START_TEST(shard_arithmetic)
{
    dl_zero_shard z;
    size_t owned[4] = {3, 3, 3, 1};
    for (int r = 0; r < 4; r++) {
        dl_zero_shard_init(&z, 10, 4, r);
        ck_assert_uint_eq(z.shard, 3);
        ck_assert_uint_eq(z.padded, 12);
        ck_assert_uint_eq(z.padding, 2);
        ck_assert_uint_eq(z.begin, 3 * (size_t)r);
        ck_assert_uint_eq(z.owned, owned[r]);
    }
    dl_zero_shard_init(&z, 5, 4, 3); /* S = 2: the last shard is all padding */
    ck_assert_uint_eq(z.owned, 0);
    dl_zero_shard_init(&z, 12, 4, 1);
    ck_assert_uint_eq(z.padding, 0);
    dl_zero_shard_init(&z, 7, 1, 0);
    ck_assert_uint_eq(z.shard, 7);
    ck_assert_uint_eq(z.owned, 7);
    ck_assert_uint_eq(z.padding, 0);
    /* final columns: row 0 comes first, so [first, S) once first < S */
    dl_zero_shard_init(&z, 10, 4, 0);
    ck_assert_uint_eq(dl_zero_final_column(&z, 9), 3);
    ck_assert_uint_eq(dl_zero_final_column(&z, 3), 3);
    ck_assert_uint_eq(dl_zero_final_column(&z, 2), 2);
    ck_assert_uint_eq(dl_zero_final_column(&z, 0), 0);
}
END_TEST

START_TEST(pack_unpack)
{
    /* P = 10, d = 4, S = 3: rows [0 1 2] [3 4 5] [6 7 8] [9 p p] */
    double full[10], back[10], packed[12];
    for (int i = 0; i < 10; i++) full[i] = i + 1;
    dl_zero_shard z;
    dl_zero_shard_init(&z, 10, 4, 3);
    dl_zero_pack(&z, full, 1, 2, 8, packed); /* columns 1..2 */
    double want[8] = {2, 3, 5, 6, 8, 9, 0, 0};
    for (int i = 0; i < 8; i++) ck_assert(packed[i] == want[i]);
    dl_zero_pack(&z, full, 0, 1, 8, packed); /* column 0 */
    double want0[4] = {1, 4, 7, 10};
    for (int i = 0; i < 4; i++) ck_assert(packed[i] == want0[i]);
    /* round trip over rounds of 2 columns, never writing past P */
    for (int i = 0; i < 10; i++) back[i] = -1;
    for (size_t lo = 0; lo < 3; lo += 2) {
        size_t k = 3 - lo < 2 ? 3 - lo : 2;
        dl_zero_pack(&z, full, lo, k, 8, packed);
        dl_zero_unpack(&z, back, lo, k, 8, packed, -1);
    }
    for (int i = 0; i < 10; i++) ck_assert(back[i] == full[i]);
    /* skip: the rank's own row is left alone; pack_row fills one block, padding as 0 */
    for (int i = 0; i < 10; i++) back[i] = -1;
    dl_zero_pack(&z, full, 0, 3, 8, packed);
    float f[12];
    dl_zero_unpack(&z, back, 0, 3, 8, packed, 1);
    for (int i = 0; i < 10; i++) ck_assert(back[i] == (i >= 3 && i < 6 ? -1 : full[i]));
    for (int i = 0; i < 12; i++) f[i] = 7;
    float src[3] = {1, 2, 3};
    dl_zero_pack_row(&z, 3, src, 0, 3, 4, f);
    ck_assert(f[9] == 1 && f[10] == 0 && f[11] == 0 && f[8] == 7);
}
END_TEST

/* ---- training ---- */

static dl_train_opts base(int dp, int tp, dl_dtype dt, int zero)
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
    o.zero.stage = zero;
    o.batch.micro = 2;
    o.batch.microbatches = 2;
    o.optim.steps = DL_TEST_SMALL ? 3 : 5;
    o.optim.warmup = 2;
    o.optim.lr =
        dt == DL_F32 ? 1e-3 : 1e-2; /* f32: as tests/unit/train/test_train.c (see stages_equal) */
    o.optim.min_lr = o.optim.lr / 10;
    o.eval.windows = 4;
    o.output.log_every = 0;
    o.comm.bucket_mb = 0.01; /* several rounds */
    o.output.want_params = 1;
    o.output.want_grads = 1;
    o.comm.algo = DL_ALGO_RING;
    o.machine.timeout_s = 120;
    return o;
}


static void run(dl_train_opts *o, dl_train_result *r)
{
    ck_assert_msg(dl_train_run(o, r) == DL_OK, "dp %d tp %d zero %d: %s", o->layout.dp,
                  o->layout.tp, o->zero.stage, dl_errmsg());
    ck_assert_int_eq(r->nsteps, o->optim.steps);
}

/* The memory and byte figures of a run, exactly, from the arena's peaks and the dp counters:
 * with storage size ss (2 bf16, 4, 8), compute size cs, P elements per rank and shard S (stage 0:
 * S = P), params P ss (stage 3: S ss), grads P ss (stages 2-3: S ss), optimizer 2 S cs (+ 4 S
 * for bf16's master weights); so in bf16 (2+2+12) P, 2P + 2P + 12S, 2P + 14S, 16S. Per step,
 * ring reduce-scatters and all-gathers of d S_u per unit send (d-1) S elements each: stages 1-2
 * one of each (the gradients of stage 2 once per micro-batch), stage 3 the gradients once and
 * the parameters twice per micro-batch. */
static void check_figures(const dl_train_opts *o, const dl_train_result *r)
{
    int d = o->layout.dp, ss = (int)dl_dtype_size(o->precision.dtype),
        cs = o->precision.dtype == DL_F64 ? 8 : 4;
    int bf = o->precision.dtype == DL_BF16;
    uint64_t P = r->memory.grad_bytes / (uint64_t)ss;
    int stage = d > 1 ? o->zero.stage : 0, m = o->batch.microbatches;
    ck_assert_int_eq(r->zero.stage, stage);
    uint64_t S = (uint64_t)r->zero.shard;
    if (stage == 0)
        ck_assert_uint_eq(S, P);
    else
        ck_assert_uint_ge(S * (uint64_t)d, P);
    ck_assert_int_eq(r->zero.padded, (int64_t)(stage ? S * (uint64_t)d : P));
    ck_assert_int_eq(r->zero.padding, r->zero.padded - (int64_t)P);
    /* padding: fewer than d elements per unit */
    ck_assert_int_lt(r->zero.padding, (int64_t)d * r->zero.units);
    for (int k = 0; k < r->nranks; k++) {
        const uint64_t *pk = &r->memory.peak[(size_t)k * DL_MEM_NCATEGORIES];
        uint64_t want_o = 2 * S * (uint64_t)cs + (bf ? 4 * S : 0);
        uint64_t want_p = (stage == 3 ? S : P) * (uint64_t)ss;
        uint64_t want_g = (stage >= 2 ? S : P) * (uint64_t)ss;
        ck_assert_msg(pk[DL_MEM_OPTIMIZER] == want_o,
                      "rank %d stage %d: optimizer peak %llu, want %llu", k, stage,
                      (unsigned long long)pk[DL_MEM_OPTIMIZER], (unsigned long long)want_o);
        ck_assert_msg(pk[DL_MEM_PARAMS] == want_p, "rank %d stage %d: params peak %llu, want %llu",
                      k, stage, (unsigned long long)pk[DL_MEM_PARAMS], (unsigned long long)want_p);
        ck_assert_msg(pk[DL_MEM_GRADS] == want_g, "rank %d stage %d: grads peak %llu, want %llu", k,
                      stage, (unsigned long long)pk[DL_MEM_GRADS], (unsigned long long)want_g);
        if (bf) {
            uint64_t state = pk[DL_MEM_PARAMS] + pk[DL_MEM_GRADS] + pk[DL_MEM_OPTIMIZER];
            uint64_t want[4] = {16 * P, 4 * P + 12 * S, 2 * P + 14 * S, 16 * S};
            ck_assert_uint_eq(state, want[stage]);
        }
    }
    if (stage) {
        double each = (double)(d - 1) * (double)S * ss;
        double g = each * (stage >= 2 ? m : 1), p = each * (stage == 3 ? 2 * m : 1);
        ck_assert_msg(r->comm.dp_grads == g, "stage %d: %.1f grad bytes, want %.0f", stage,
                      r->comm.dp_grads, g);
        ck_assert_msg(r->comm.dp_params == p, "stage %d: %.1f param bytes, want %.0f", stage,
                      r->comm.dp_params, p);
        ck_assert(r->comm.dp_elems == (g + p) / ss);
        if (m == 1) /* the paper's 2 Psi (d-1)/d and 3 Psi (d-1)/d, Psi padded */
            ck_assert(r->comm.dp_elems ==
                      (stage == 3 ? 3.0 : 2.0) * (d - 1) / d * (double)r->zero.padded);
    } else {
        ck_assert(r->comm.dp_params == 0);
    }
}

/* Train `o` at stage 0 and at stages 1, 2 and 3 (same layout): each stage trains the model stage
 * 0 trains, within the rounding bounds of lib/train/compare.h (tu_compare_runs: every step's loss,
 * the first step's gradients and parameters tightly, the last step's parameters within Adam's
 * amplification of rounding; stage 0 and stages 1-2 sum each element in another order once d >
 * 2, stages 2-3 reduce every micro-batch's gradient before adding them), then the same for one
 * step; the arena's and the counters' figures of every run exactly (check_figures). hook: the
 * private test hook in force for stages 1-3, or NULL; returns how many stages differed. */
static int stages_differ(dl_train_opts o, dl__test_hook *hook)
{
    int differ = 0;
    for (int pass = 0; pass < (o.optim.steps > 1 ? 2 : 1); pass++, o.optim.steps = 1) {
        dl_train_result r0, rz;
        o.zero.stage = 0;
        run(&o, &r0);
        check_figures(&o, &r0);
        dl_train_opts res = o;
        dl_train_resolve(&res, o.layout.dp * o.layout.tp);
        for (int z = 1; z <= 3; z++) {
            dl_train_opts oz = o;
            oz.zero.stage = z;
            dl__test_hook_set(hook);
            run(&oz, &rz);
            dl__test_hook_set(NULL);
            if (!hook)
                check_figures(&oz, &rz);
            char why[512];
            int same = tu_compare_runs(&res, &rz, &r0, why, sizeof why);
            ck_assert_msg(same || hook, "dp %d tp %d %s stage %d, %d steps: %s", o.layout.dp,
                          o.layout.tp, dl_dtype_name(o.precision.dtype), z, o.optim.steps, why);
            if (!same)
                fprintf(stderr, "control zero dp %d tp %d %s stage %d: differs (%s)\n", o.layout.dp,
                        o.layout.tp, dl_dtype_name(o.precision.dtype), z, why);
            differ += !same;
            dl_train_result_free(&rz);
        }
        dl_train_result_free(&r0);
    }
    return differ;
}

static void stages_equal(dl_train_opts o) { stages_differ(o, NULL); }

START_TEST(dp4_f64) { stages_equal(base(4, 1, DL_F64, 0)); }
END_TEST
START_TEST(dp2tp2_f64) { stages_equal(base(2, 2, DL_F64, 0)); }
END_TEST
START_TEST(dp4_f32) { stages_equal(base(4, 1, DL_F32, 0)); }
END_TEST
START_TEST(dp2tp2_f32) { stages_equal(base(2, 2, DL_F32, 0)); }
END_TEST
START_TEST(dp2_f32) { stages_equal(base(2, 1, DL_F32, 0)); }
END_TEST

/* The bounds are tight: at every stage, a run whose first gradient reduction (the first bucket's
 * reduce-scatter) is skipped, or whose rank 0 has one parameter element (in its shard)
 * perturbed by 1e-6 (f64) or 1e-3 (f32) relative, differs from stage 0. */
START_TEST(controls)
{
    for (int f = 0; f < 2; f++) {
        dl_train_opts o = base(2, 1, f ? DL_F32 : DL_F64, 0);
        o.optim.steps = 1;
        dl__test_hook h = tu_skip_hook(DL_PURPOSE_GRADS, 1);
        ck_assert_int_eq(stages_differ(o, &h), 3);
        h = tu_perturb_hook(&o);
        ck_assert_int_eq(stages_differ(o, &h), 3);
        ck_assert_int_eq(atomic_load(&h.perturbed), 1); /* the last run's */
    }
}
END_TEST

/* C = 30: every tensor is a multiple of 30 elements (15 per tp rank for the split Q/K/V bias),
 * so P is not a multiple of 4 (dp 4) nor, with an odd count of layers, of 2 (dp 2 x tp 2). */
START_TEST(padding_dp4)
{
    dl_train_opts o = base(4, 1, DL_F64, 0);
    o.model.layers = 1;
    o.model.d_model = 30;
    o.model.heads = 3;
    dl_gpt_layout *l;
    ck_assert_int_eq(dl_gpt_layout_create(&o.model, 1, 0, &l), DL_OK);
    ck_assert_uint_ne(l->numel % 4, 0);
    dl_gpt_layout_destroy(l);
    stages_equal(o);
    o.precision.dtype = DL_F32;
    o.optim.lr = 1e-3;
    o.optim.min_lr = 1e-4;
    stages_equal(o);
}
END_TEST

START_TEST(padding_dp2tp2)
{
    dl_train_opts o = base(2, 2, DL_F64, 0);
    o.model.layers = 1;
    o.model.d_model = 30;
    o.model.heads = 2;
    dl_gpt_layout *l;
    ck_assert_int_eq(dl_gpt_layout_create(&o.model, 2, 0, &l), DL_OK);
    ck_assert_uint_ne(l->numel % 2, 0);
    dl_gpt_layout_destroy(l);
    stages_equal(o);
}
END_TEST

/* dp 1: the one shard is the whole buffer; every stage runs stage 0 (bitwise the same run). */
START_TEST(dp1_noop)
{
    for (int tp = 1; tp <= 2; tp++) {
        dl_train_opts o = base(1, tp, DL_F64, 0);
        dl_train_result r0, rz;
        run(&o, &r0);
        for (int z = 1; z <= 3; z++) {
            dl_train_opts oz = o;
            oz.zero.stage = z;
            run(&oz, &rz);
            check_figures(&oz, &rz);
            ck_assert_int_eq(rz.zero.stage, 0);
            ck_assert_int_eq(rz.zero.padding, 0);
            ck_assert(memcmp(rz.output.params, r0.output.params,
                             sizeof(double) * (size_t)r0.nparams) == 0);
            dl_train_result_free(&rz);
        }
        dl_train_result_free(&r0);
    }
}
END_TEST

/* Overlap (rounds on the communication thread, up to 4 in flight) and per-layer rounds
 * (--bucket-mb 0) change no arithmetic: bitwise the same parameters. */
START_TEST(overlap_and_rounds_same)
{
    for (int z = 1; z <= 3; z++) {
        dl_train_opts a = base(4, 1, DL_F64, z), b = a, c = a;
        b.comm.overlap = 1;
        c.comm.bucket_mb = 0;
        c.comm.overlap = 1;
        dl_train_result ra, rb, rc;
        run(&a, &ra);
        run(&b, &rb);
        run(&c, &rc);
        check_figures(&b, &rb);
        check_figures(&c, &rc);
        size_t n = sizeof(double) * (size_t)ra.nparams;
        ck_assert(memcmp(ra.output.params, rb.output.params, n) == 0);
        ck_assert(memcmp(ra.output.params, rc.output.params, n) == 0);
        ck_assert(memcmp(ra.output.grads, rc.output.grads, n) == 0);
        dl_train_result_free(&ra);
        dl_train_result_free(&rb);
        dl_train_result_free(&rc);
    }
}
END_TEST

/* Stage 0's all-reduce sends 2(d-1)/d of the buffer under GRADS (up to each bucket's block
 * remainders); stages 1-2 send the same volume, split between GRADS and PARAMS. */
START_TEST(same_volume_as_stage0)
{
    dl_train_opts o = base(4, 1, DL_F32, 0);
    o.output.want_params = o.output.want_grads = 0;
    dl_train_result r0, r1;
    run(&o, &r0);
    o.zero.stage = 1;
    run(&o, &r1);
    double padded = (double)r1.zero.padded * 4, full = (double)r0.memory.grad_bytes;
    ck_assert(fabs(r0.comm.dp_grads - 1.5 * full) <= 2.0 * 4 * 4 * 64);
    ck_assert(r1.comm.dp_grads + r1.comm.dp_params == 1.5 * padded);
    dl_train_result_free(&r0);
    dl_train_result_free(&r1);
}
END_TEST

START_TEST(bad_stage)
{
    dl_train_opts o = base(2, 1, DL_F32, 4);
    ck_assert_int_eq(dl_train_resolve(&o, 2), DL_EINVAL);
    ck_assert_ptr_nonnull(strstr(dl_errmsg(), "0, 1, 2 or 3"));
    o.zero.stage = -1;
    ck_assert_int_eq(dl_train_resolve(&o, 2), DL_EINVAL);
    for (int z = 0; z <= 3; z++) {
        o.zero.stage = z;
        ck_assert_int_eq(dl_train_resolve(&o, 2), DL_OK);
    }
    o.precision.dtype = (dl_dtype)7;
    ck_assert_int_eq(dl_train_resolve(&o, 2), DL_EINVAL);
    ck_assert_ptr_nonnull(strstr(dl_errmsg(), "f32, f64 or bf16"));
}
END_TEST

/* ---- per-unit sharding ---- */

START_TEST(units_arithmetic)
{
    size_t b[4] = {0, 10, 13, 21}; /* units of 10, 3, 8 */
    dl_zero_units z;
    size_t owned[4][3] = {{3, 1, 2}, {3, 1, 2}, {3, 1, 2}, {1, 0, 2}};
    for (int r = 0; r < 4; r++) {
        ck_assert_int_eq(dl_zero_units_init(&z, b, 3, 4, r), DL_OK);
        ck_assert_uint_eq(z.shard, 3 + 1 + 2);
        ck_assert_uint_eq(z.padded, 24);
        ck_assert_uint_eq(z.padding, 3);
        ck_assert_uint_eq(z.max_padded, 12);
        ck_assert_uint_eq(z.u[1].begin, 10 + (size_t)r);
        ck_assert_uint_eq(z.u[2].sbase, 4);
        for (int u = 0; u < 3; u++) ck_assert_uint_eq(z.u[u].owned, owned[r][u]);
        dl_zero_units_free(&z);
    }
    ck_assert_int_eq(dl_zero_units_init(&z, b, 3, 1, 0), DL_OK); /* d = 1: the units */
    ck_assert_uint_eq(z.shard, 21);
    ck_assert_uint_eq(z.padding, 0);
    ck_assert_uint_eq(z.u[2].begin, 13);
    ck_assert_uint_eq(z.u[2].sbase, 13);
    dl_zero_units_free(&z);
}
END_TEST

/* ---- bf16 mixed precision ---- */

/* bf16 on 4 ranks, one micro-batch: stage 0 reduces each unit as reduce-scatter + all-gather
 * (ZeRO's ring order), so every stage reduces bitwise the same bf16 gradient. Stages 1-3 then
 * compute the same norm (the same shard sums) and end with bitwise the same master weights;
 * stage 0 sums the squared norm in another order (the whole gradient, no dp all-reduce), so its
 * clipping factor differs in the last bits: master weights within f32 rounding. The model
 * state is exactly 16 / 2+2+12/N / 2+14/N / 16/N bytes per element. */
static void bf16_stages(dl_train_opts o, int bitwise_all)
{
    dl_train_result r[4];
    for (int z = 0; z <= 3; z++) {
        dl_train_opts oz = o;
        oz.zero.stage = z;
        run(&oz, &r[z]);
        check_figures(&oz, &r[z]);
    }
    size_t n = sizeof(double) * (size_t)r[0].nparams;
    for (int z = 1; z <= 3; z++) {
        char name[48];
        double w = dl__eq_worst_tensor(&o.model, r[z].output.params, r[0].output.params, name);
        fprintf(stderr,
                "bf16 dp %d tp %d stage %d: master weights vs stage 0 %.3g (%s), grads "
                "%s\n",
                o.layout.dp, o.layout.tp, z, w, name,
                memcmp(r[z].output.grads, r[0].output.grads, n) ? "differ" : "bitwise equal");
        ck_assert_msg(w <= 1e-6, "bf16 stage %d: master weights differ from stage 0 by %.3g (%s)",
                      z, w, name);
        if (bitwise_all || z > 1)
            ck_assert(memcmp(r[z].output.params, r[bitwise_all ? 0 : 1].output.params, n) == 0);
        ck_assert(memcmp(r[z].output.grads, r[0].output.grads, n) == 0);
        for (int i = 0; i < r[z].nsteps; i++) ck_assert(!r[z].steps[i].skipped);
    }
    uint64_t P = r[0].memory.grad_bytes / 2;
    const uint64_t *p0 = r[0].memory.peak, *p3 = r[3].memory.peak;
    double b0 = (double)(p0[0] + p0[1] + p0[2]) / (double)P;
    double b3 = (double)(p3[0] + p3[1] + p3[2]) / (double)P;
    fprintf(stderr, "bf16 dp %d: %.4f / %.4f bytes per parameter at stages 0 / 3 (padding %lld)\n",
            o.layout.dp, b0, b3, (long long)r[3].zero.padding);
    ck_assert(b0 == 16.0);
    for (int z = 0; z <= 3; z++) dl_train_result_free(&r[z]);
}

START_TEST(bf16_dp4)
{
    dl_train_opts o = base(4, 1, DL_BF16, 0);
    o.batch.microbatches = 1;
    bf16_stages(o, 0);
}
END_TEST

START_TEST(bf16_dp2tp2_padding)
{
    dl_train_opts o = base(2, 2, DL_BF16, 0);
    o.batch.microbatches = 1;
    o.model.layers = 1;
    o.model.d_model = 30;
    o.model.heads = 2;
    bf16_stages(o, 0);
}
END_TEST

/* bf16 stage 0 on one rank vs f32 on one rank: the same model within bf16's precision; and
 * a step with a non-finite gradient is skipped and reported: two steps, the second poisoned,
 * end with bitwise the parameters of one step. */
START_TEST(bf16_nonfinite_skipped)
{
    for (int z = 0; z <= 3; z += 3) {
        dl_train_opts o = base(2, 1, DL_BF16, z), one = o;
        o.batch.microbatches = 1;
        o.optim.steps = 2;
        one = o;
        one.optim.steps = 1;
        dl__test_hook nan = {.nan_step = 2}; /* only the two-step run's step 2 */
        dl_train_result r, r1;
        dl__test_hook_set(&nan);
        run(&o, &r);
        dl__test_hook_set(NULL);
        run(&one, &r1);
        ck_assert_int_eq(r.optim.skipped_steps, 1);
        ck_assert(!r.steps[0].skipped && r.steps[1].skipped);
        ck_assert(!isfinite(r.steps[1].grad_norm));
        ck_assert(isfinite(r.optim.final_loss));
        ck_assert(memcmp(r.output.params, r1.output.params, sizeof(double) * (size_t)r.nparams) ==
                  0);
        dl_train_result_free(&r);
        dl_train_result_free(&r1);
    }
}
END_TEST

/* --gpu-mem: a model whose state does not fit a rank at stage 0 trains at stage 3 on 4 ranks;
 * too small for stage 3 too, the error names the rank, the category and the bytes. */
START_TEST(gpu_mem_stage3)
{
    dl_train_opts o = base(4, 1, DL_BF16, 0);
    o.model.layers = 2;
    o.model.d_model = 128;
    o.model.seq = 8;
    o.batch.micro = 1;
    o.batch.microbatches = 1;
    o.optim.steps = 2;
    o.eval.windows = 2;
    o.output.want_params = o.output.want_grads = 0;
    int64_t P = dl_gpt_num_params(&o.model);
    o.machine.gpu_mem = (uint64_t)(P * 16 * 3 / 4); /* stage 0's model state alone is 16 P */
    dl_train_result r;
    ck_assert_int_eq(dl_train_run(&o, &r), DL_ENOMEM);
    ck_assert_ptr_nonnull(strstr(dl_errmsg(), "rank"));
    fprintf(stderr, "gpu-mem %llu, stage 0: %s\n", (unsigned long long)o.machine.gpu_mem,
            dl_errmsg());
    dl_train_result_free(&r);
    o.zero.stage = 3;
    run(&o, &r);
    uint64_t top = 0;
    for (int c = 0; c < DL_MEM_NCATEGORIES; c++) top += r.memory.peak[c];
    fprintf(stderr, "gpu-mem %llu, stage 3: trains, rank 0 peaks sum to %llu\n",
            (unsigned long long)o.machine.gpu_mem, (unsigned long long)top);
    dl_train_result_free(&r);
    o.machine.gpu_mem = (uint64_t)P; /* 1 byte per parameter: not even stage 3 */
    ck_assert_int_eq(dl_train_run(&o, &r), DL_ENOMEM);
    dl_train_result_free(&r);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("zero");
    TCase *tc = tcase_create("zero");
    tcase_set_timeout(tc, 900);
    tcase_add_test(tc, shard_arithmetic);
    tcase_add_test(tc, pack_unpack);
    tcase_add_test(tc, bad_stage);
    tcase_add_test(tc, units_arithmetic);
    tcase_add_test(tc, bf16_dp4);
    tcase_add_test(tc, bf16_nonfinite_skipped);
    tcase_add_test(tc, gpu_mem_stage3);
    tcase_add_test(tc, dp4_f64);
    tcase_add_test(tc, dp2tp2_f64);
    tcase_add_test(tc, dp4_f32);
    tcase_add_test(tc, controls);
    tcase_add_test(tc, padding_dp4);
    tcase_add_test(tc, dp1_noop);
    tcase_add_test(tc, same_volume_as_stage0);
    if (!DL_TEST_SMALL) {
        tcase_add_test(tc, dp2tp2_f32);
        tcase_add_test(tc, dp2_f32);
        tcase_add_test(tc, padding_dp2tp2);
        tcase_add_test(tc, overlap_and_rounds_same);
        tcase_add_test(tc, bf16_dp2tp2_padding);
    }
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
