/* Mixture of experts in the trainer (parallel/ep.c, model/sublayer_moe.c):
 * - dp 2 x ep 2, dp 4 x ep 4 and dp 4 x ep 2 train the model one rank holding every expert
 *   trains, f64: at every step the same routing (each MoE layer's per-expert routed and dropped
 *   counts and the hash of every sequence's choices and admissions, asserted), the losses and
 *   parameters within lib/train/compare.h's bounds (one step with its gradients, and three);
 *   f32 at dp 2 x ep 2: step 1 within the f32 bounds, the routing flips reported;
 * - the all-to-all bytes against their formula: each forward and backward's dispatch sends the
 *   admitted choices' rows and each combine sends them back, so over the ranks a step sends
 *   exactly 4 x (G T k - dropped) x C x dtype bytes per MoE layer (each rank's own block
 *   included), and at ep 1 the one rank sends all of it;
 * - a rank receiving zero tokens (its experts chosen by no one) and sending none to itself, in
 *   the dispatch and the combine: the model (2 ranks, ep 2, the same batch on both) equals one
 *   rank holding every expert: losses and dense gradients within f64 rounding, the used
 *   experts' gradients twice the one rank's (both ranks' tokens), the idle rank's zero;
 * - refusals by name: --ep without experts, ep not dividing dp or the experts, tp / pp / ZeRO /
 *   bf16 / recomputation with a mixture of experts. */
#include "../testutil.h"
#include <check.h>
#include <math.h>
#include "core/arena.h"
#include "model/gpt_priv.h"

static dl_train_opts moe_opts(int dp, int ep, dl_dtype dt, int steps)
{
    dl_train_opts o;
    dl_train_opts_init(&o);
    o.model.layers = 2, o.model.d_model = 32, o.model.heads = 4, o.model.seq = 16;
    o.model.experts = 4, o.model.top_k = 2, o.model.moe_every = 1, o.model.capacity = 1.0;
    o.model.aux_loss = 0.01, o.model.z_loss = 0.001;
    o.layout.dp = dp, o.layout.ep = ep;
    o.precision.dtype = dt;
    o.batch.global = 8;
    o.optim.steps = steps;
    o.optim.warmup = 1;
    o.eval.windows = 2;
    o.output.log_every = 0;
    return o;
}

/* the routing of every step and layer alike; returns the count of differing (step, layer,
 * expert) counts and hashes */
static int routing_diffs(const dl_train_result *a, const dl_train_result *b, int steps)
{
    const dl_train_moe_result *x = &a->moe, *y = &b->moe;
    ck_assert_int_eq(x->layers, y->layers);
    ck_assert_int_eq(x->experts, y->experts);
    int d = 0;
    size_t le = (size_t)x->layers * x->experts;
    for (size_t i = 0; i < (size_t)steps * le; i++)
        d += (x->routed[i] != y->routed[i]) + (x->dropped[i] != y->dropped[i]);
    for (size_t i = 0; i < (size_t)steps * x->layers; i++) d += x->hash[i] != y->hash[i];
    return d;
}

static void run(dl_train_opts *o, dl_train_result *r)
{
    o->output.want_params = o->output.want_grads = 1;
    ck_assert_msg(dl_train_run(o, r) == DL_OK, "dp %d ep %d: %s", o->layout.dp, o->layout.ep,
                  dl_errmsg());
}

/* The byte formula (see the header), per step and in all. */
static void check_bytes(const dl_train_opts *o, const dl_train_result *r)
{
    const dl_train_moe_result *m = &r->moe;
    int E = m->experts, ds = o->precision.dtype == DL_F64 ? 8 : 4;
    for (int s = 0; s < r->nsteps; s++) {
        double sent = 0, want = 0;
        for (int q = 0; q < r->nranks; q++) sent += m->a2a_bytes[(size_t)s * r->nranks + q];
        for (int i = 0; i < m->layers; i++) {
            int64_t kept = (int64_t)o->batch.global * o->model.seq * o->model.top_k;
            for (int e = 0; e < E; e++) kept -= m->dropped[((size_t)s * m->layers + i) * E + e];
            want += 4.0 * (double)kept * o->model.d_model * ds;
        }
        ck_assert_msg(sent == want, "step %d: %.0f bytes sent, the formula %.0f", s + 1, sent,
                      want);
    }
}

/* The layout oa (f64) against one rank, `steps` steps: routing identical at every step, capacity
 * drops present, losses, parameters and gradients within compare.h's bounds, the byte formula. */
static void layout_vs_one_rank(dl_train_opts oa, int steps)
{
    char why[512];
    dl_train_opts ob = moe_opts(1, 1, DL_F64, steps);
    ob.model.layers = oa.model.layers, ob.model.moe_every = oa.model.moe_every;
    oa.optim.steps = steps;
    dl_train_result a, b;
    run(&oa, &a);
    run(&ob, &b);
    const dl_train_layout *L = &oa.layout;
    ck_assert_msg(routing_diffs(&a, &b, steps) == 0,
                  "dp %d ep %d tp %d pp %d zero %d: the routing "
                  "differs",
                  L->dp, L->ep, L->tp, L->pp, oa.zero.stage);
    int64_t dropped = 0;
    for (size_t i = 0; i < (size_t)steps * a.moe.layers * a.moe.experts; i++)
        dropped += a.moe.dropped[i];
    ck_assert(dropped > 0); /* capacity drops are part of what is compared */
    ck_assert_msg(tu_compare_runs(&oa, &a, &b, why, sizeof why),
                  "dp %d ep %d tp %d pp %d zero %d, %d steps: %s", L->dp, L->ep, L->tp, L->pp,
                  oa.zero.stage, steps, why);
    check_bytes(&oa, &a);
    check_bytes(&ob, &b);
    dl_train_result_free(&a);
    dl_train_result_free(&b);
}

static void same_as_one_rank(int dp, int ep)
{
    for (int steps = 1; steps <= 3; steps += 2)
        layout_vs_one_rank(moe_opts(dp, ep, DL_F64, 1), steps);
}

/* a composed layout: one step (its gradients compared per tensor) and two (the second step uses
 * the parameters the first updated: gathered, or at ZeRO-3 sharded) */
static void composed_vs_one_rank(dl_train_opts o)
{
    layout_vs_one_rank(o, 1);
    layout_vs_one_rank(o, 2);
}

START_TEST(dp2_ep2) { same_as_one_rank(2, 2); }
END_TEST
START_TEST(dp4_ep4) { same_as_one_rank(4, 4); }
END_TEST
START_TEST(dp4_ep2) { same_as_one_rank(4, 2); }
END_TEST

/* ZeRO 1-3 at dp 4 x ep 2: the dense pieces of the units sharded over dp 4, the expert pieces
 * over the expert-data-parallel group (2 ranks) */
START_TEST(zero_dp4_ep2)
{
    for (int stage = 1; stage <= 3; stage++) {
        dl_train_opts o = moe_opts(4, 2, DL_F64, 2);
        o.zero.stage = stage;
        composed_vs_one_rank(o);
    }
}
END_TEST

/* pp 2 x dp 2 x ep 2: one MoE layer on each stage, its all-to-alls on that stage's ep group,
 * with 1F1B, GPipe and ZB-H1 (the split backward: the MoE weight part deferred); ZeRO-1 beside
 * 1F1B (the expert pieces over each stage's edp group). */
START_TEST(pp2_dp2_ep2)
{
    static const int sched[] = {DL_SCHED_1F1B, DL_SCHED_GPIPE, DL_SCHED_ZB_H1};
    for (int i = 0; i < 4; i++) {
        dl_train_opts o = moe_opts(2, 2, DL_F64, 2);
        o.layout.pp = 2, o.batch.microbatches = 2;
        o.pipeline.schedule = sched[i % 3];
        o.zero.stage = i == 3;
        composed_vs_one_rank(o);
    }
}
END_TEST

/* Negative control: a perturbed routing is seen (the comparison of the tables can fail). */
START_TEST(routing_negative_control)
{
    dl_train_opts oa = moe_opts(2, 2, DL_F64, 1), ob = moe_opts(1, 1, DL_F64, 1);
    ob.model.capacity = 0.75; /* other drops */
    dl_train_result a, b;
    run(&oa, &a);
    run(&ob, &b);
    ck_assert_int_gt(routing_diffs(&a, &b, 1), 0);
    dl_train_result_free(&a);
    dl_train_result_free(&b);
}
END_TEST

/* Each rank's wait at the combine, as the trace shows it: the sum of its DL_TR_MOE_COMBINE events
 * in a step is the step record's combine_wait_ms (the same clock reads: summed in integer ns there,
 * a union of disjoint intervals here, so equal up to the ms conversion's rounding, 1e-15
 * relative). Controls: the waits are not zero, and the dispatch's events, other intervals, differ. */
START_TEST(combine_wait_from_trace)
{
    dl_train_opts o = moe_opts(2, 2, DL_F64, 2);
    dl_trace *t;
    ck_assert_int_eq(dl_trace_create(2, 4096, &t), DL_OK);
    o.trace.into = t;
    dl_train_result r;
    run(&o, &r);
    for (int s = 1; s <= 2; s++)
        for (int q = 0; q < 2; q++) {
            double ns[DL_TR_NKINDS];
            ck_assert_int_eq(dl_trace_breakdown(t, q, s, ns), DL_OK);
            double want = r.moe.combine_wait_ms[(size_t)(s - 1) * r.nranks + q] * 1e6;
            double got = ns[DL_TR_MOE_COMBINE];
            ck_assert_msg(got > 0 && fabs(got - want) <= 1e-12 * want,
                          "step %d rank %d: the trace's combines %.0f ns, the record %.0f ns", s, q,
                          got, want);
            ck_assert(ns[DL_TR_MOE_DISPATCH] > 0 && ns[DL_TR_MOE_DISPATCH] != want);
        }
    dl_train_result_free(&r);
    dl_trace_destroy(t);
}
END_TEST

/* f32: step 1 within the f32 bounds; routing flips (near-ties rounded the other way) counted and
 * reported, not asserted. */
START_TEST(f32_step1)
{
    char why[512];
    dl_train_opts oa = moe_opts(2, 2, DL_F32, 1), ob = moe_opts(1, 1, DL_F32, 1);
    dl_train_result a, b;
    run(&oa, &a);
    run(&ob, &b);
    int flips = routing_diffs(&a, &b, 1);
    fprintf(stderr, "moe f32 dp 2 x ep 2 vs one rank, step 1: %d routing count/hash flips\n",
            flips);
    if (!flips)
        ck_assert_msg(tu_compare_runs(&oa, &a, &b, why, sizeof why), "f32: %s", why);
    dl_train_result_free(&a);
    dl_train_result_free(&b);
}
END_TEST

/* tp 2 x dp 2 x ep 2: the MoE layers' parameters replicated over tp, each micro-batch's
 * sequences split over it (each tp rank routes and dispatches its share on its own ep group),
 * the shares' gradients summed over tp; with ZeRO-1 too (expert pieces over edp) */
START_TEST(tp2_dp2_ep2)
{
    for (int stage = 0; stage <= 1; stage++) {
        dl_train_opts o = moe_opts(2, 2, DL_F64, 1);
        o.layout.tp = 2, o.batch.micro = 2, o.zero.stage = stage;
        composed_vs_one_rank(o);
    }
}
END_TEST

/* bf16 mixed precision at dp 4 x ep 2, one step, ZeRO 0-3, as test_zero's bf16_stages: stage 0
 * (the dp-bf16 module) reduces each unit's dense piece over dp and its expert piece over edp in
 * ZeRO's ring order, so every stage reduces bitwise the same bf16 gradient and the routing is
 * the same; the master weights within 1e-6 of stage 0's (the clipping factor's norm is summed
 * in another order: f32 rounding of the update, lr 3e-4 x 2^-24 relative, far below). Against
 * one rank in bf16 (each hop of the ring rounds the gradient to bf16): step 1 within compare.h's
 * bf16 bounds; routing flips (from the router's f32 GEMM over other batch shapes) reported. */
START_TEST(bf16_dp4_ep2)
{
    char why[512];
    dl_train_result r[4], one;
    dl_train_opts ob = moe_opts(1, 1, DL_BF16, 1);
    run(&ob, &one);
    size_t n = sizeof(double) * (size_t)one.nparams;
    for (int z = 0; z <= 3; z++) {
        dl_train_opts o = moe_opts(4, 2, DL_BF16, 1);
        o.zero.stage = z;
        run(&o, &r[z]);
        if (z == 0) {
            int flips = routing_diffs(&r[0], &one, 1);
            fprintf(stderr, "moe bf16 dp 4 x ep 2 vs one rank, step 1: %d routing flips\n", flips);
            if (!flips)
                ck_assert_msg(tu_compare_runs(&o, &r[0], &one, why, sizeof why), "bf16: %s", why);
            continue;
        }
        char name[48];
        double w = dl__eq_worst_tensor(&o.model, r[z].output.params, r[0].output.params, name);
        fprintf(stderr, "moe bf16 dp 4 x ep 2 stage %d: master weights vs stage 0 %.3g (%s)\n", z,
                w, name);
        ck_assert_int_eq(routing_diffs(&r[z], &r[0], 1), 0);
        ck_assert_msg(w <= 1e-6, "bf16 stage %d: master weights off by %.3g (%s)", z, w, name);
        ck_assert_msg(memcmp(r[z].output.grads, r[0].output.grads, n) == 0,
                      "bf16 stage %d: the reduced gradient is not stage 0's", z);
    }
    for (int z = 0; z <= 3; z++) dl_train_result_free(&r[z]);
    dl_train_result_free(&one);
}
END_TEST

/* ---- a rank that receives zero tokens ------------------------------------------------------ */

enum { ZB = 2, ZT = 8, ZC = 16 };

typedef struct {
    double loss[2], ref_loss[2];
    double dense_err[2], expert_err[2], idle_max[2]; /* relative errors, idle gradient */
    int64_t recv_rank1;
} zero_run;

static dl_gpt_config zero_cfg(void)
{
    return (dl_gpt_config){.vocab = 256,
                           .seq = ZT,
                           .layers = 1,
                           .d_model = ZC,
                           .heads = 2,
                           .experts = 4,
                           .top_k = 1,
                           .moe_every = 1,
                           .capacity = 0,
                           .aux_loss = 0.01,
                           .z_loss = 0.01};
}

/* experts 2 and 3 never win: router rows 2, 3 zero, row 1 = -row 0 (one of l0, l1 > 0) */
static void steer(dl_gpt *g)
{
    const dl_gpt_layout *l = dl_gpt_get_layout(g);
    int k = dl_gpt_find(l, "h.0.mlp.router.weight");
    double *w = (double *)dl_gpt_params(g) + l->t[k].offset;
    for (int j = 0; j < ZC; j++) w[ZC + j] = -w[j], w[2 * ZC + j] = w[3 * ZC + j] = 0;
}

static dl_gpt *zero_model(dl_arena *a, int ep, dl_comm *c)
{
    dl_gpt_opts o = {.cfg = zero_cfg(),
                     .dtype = DL_F64,
                     .micro_batch = ZB,
                     .tp = 1,
                     .seed = 3,
                     .arena = a,
                     .ep = ep,
                     .ep_comm = c};
    dl_gpt *g = NULL;
    if (dl_gpt_create(&o, &g) == DL_OK)
        steer(g);
    return g;
}

static int zero_rank(dl_ctx *x, void *arg)
{
    zero_run *z = arg;
    int r = dl_ctx_rank(x), in[ZB * ZT], tg[ZB * ZT], rc;
    for (int i = 0; i < ZB * ZT; i++) in[i] = (i * 37) % 256, tg[i] = (i * 11 + 3) % 256;
    dl_arena *a;
    if ((rc = dl_arena_create(&a, 0, 0)))
        return rc;
    dl_gpt *g = zero_model(a, 2, dl_ctx_comm(x)), *ref = zero_model(a, 1, NULL);
    if (!g || !ref)
        return DL_EINVAL;
    double dl = 1.0 / (ZB * ZT);
    dl_gpt_moe_reset(g);
    if ((rc = dl_gpt_forward(g, in, tg, ZB, &z->loss[r])) ||
        (rc = dl_gpt_backward(g, dl, NULL, NULL)) ||
        (rc = dl_gpt_forward(ref, in, tg, ZB, &z->ref_loss[r])) ||
        (rc = dl_gpt_backward(ref, dl, NULL, NULL)))
        return rc;
    if (r == 1) { /* what rank 1 received: the rows its combine sent back, over 2 passes */
        const dl_moe_stats *s = dl_gpt_moe_stats(g, 0);
        int64_t sent_own = 0;
        for (int e = 0; e < 4; e++) sent_own += s->routed[e] - s->dropped[e];
        z->recv_rank1 = (int64_t)(s->a2a_bytes / (8.0 * ZC)) - 2 * sent_own;
    }
    const dl_gpt_layout *l = dl_gpt_get_layout(g), *lr = dl_gpt_get_layout(ref);
    const double *gg = dl_gpt_grads(g), *gr = dl_gpt_grads(ref);
    for (int k = 0; k < l->ntensors; k++) {
        const dl_tensor_info *t = &l->t[k];
        const dl_tensor_info *u = &lr->t[dl_gpt_find(lr, t->name)];
        int e = -1, expert = sscanf(t->name, "h.0.mlp.experts.%d", &e) == 1;
        double mx = 0, d = 0;
        for (size_t i = 0; i < t->numel; i++) {
            double want = (expert ? 2.0 : 1.0) * gr[u->offset + i], got = gg[t->offset + i];
            mx = fmax(mx, fabs(want)), d = fmax(d, fabs(got - want));
            if (expert && e >= 2)
                z->idle_max[r] = fmax(z->idle_max[r], fabs(got));
        }
        double rel = mx > 0 ? d / mx : d;
        double *slot = expert ? &z->expert_err[r] : &z->dense_err[r];
        *slot = fmax(*slot, rel);
    }
    dl_gpt_destroy(g), dl_gpt_destroy(ref);
    dl_arena_destroy(a);
    return DL_OK;
}

/* f64, the same arithmetic in another order (the experts' rows of both ranks in one GEMM):
 * per tensor relative differences within compare.h's gtol for this size (L 1, n = 256:
 * 8 x 3 x 8 x 16 x 2^-53 = 3.4e-13); 1e-11 leaves margin, while a lost or doubled rank's
 * contribution is off by 0.5 or more. */
START_TEST(zero_tokens)
{
    zero_run z;
    memset(&z, 0, sizeof z);
    ck_assert_msg(tu_run_world(2, zero_rank, &z) == DL_OK, "%s", dl_errmsg());
    ck_assert_int_eq(z.recv_rank1, 0);
    for (int r = 0; r < 2; r++) {
        ck_assert_msg(fabs(z.loss[r] - z.ref_loss[r]) <= 1e-12 * z.ref_loss[r], "rank %d loss", r);
        ck_assert_msg(z.dense_err[r] < 1e-11, "rank %d dense gradient %g", r, z.dense_err[r]);
        ck_assert_msg(z.expert_err[r] < 1e-11, "rank %d expert gradient %g", r, z.expert_err[r]);
        ck_assert(z.idle_max[r] == 0);
    }
}
END_TEST

/* ---- refusals ------------------------------------------------------------------------------ */

static void refused(dl_train_opts o, const char *needle)
{
    int rc = dl_train_resolve(&o, o.layout.dp * o.layout.tp * (o.layout.pp > 1 ? o.layout.pp : 1));
    ck_assert_int_eq(rc, DL_EINVAL);
    ck_assert_msg(strstr(dl_errmsg(), needle), "'%s' lacks '%s'", dl_errmsg(), needle);
}

START_TEST(refusals)
{
    dl_train_opts o = moe_opts(2, 2, DL_F64, 1);
    o.model.experts = 0;
    refused(o, "needs a mixture of experts");
    o = moe_opts(4, 3, DL_F64, 1);
    refused(o, "does not divide dp");
    o = moe_opts(4, 4, DL_F64, 1), o.model.experts = 6;
    refused(o, "not divisible by --ep");
    o = moe_opts(1, 1, DL_F64, 1), o.model.top_k = 5;
    refused(o, "top-k 5");
    o = moe_opts(1, 1, DL_F64, 1), o.model.top_k = 0;
    refused(o, "top-k 0");
    o = moe_opts(1, 1, DL_F64, 1), o.model.capacity = -1;
    refused(o, "capacity factor");
    o = moe_opts(1, 1, DL_F64, 1), o.model.moe_every = 3;
    refused(o, "moe-every 3");
    o = moe_opts(2, 2, DL_F64, 1), o.layout.tp = 2, o.batch.micro = 1;
    refused(o, "not a multiple of 2");
    o = moe_opts(2, 2, DL_F64, 1), o.layout.tp = 2, o.batch.micro = 2, o.zero.stage = 2;
    refused(o, "tp > 1 and ZeRO 2-3");
    o = moe_opts(1, 1, DL_BF16, 1), o.layout.tp = 2, o.batch.micro = 2;
    refused(o, "tp > 1 and bf16");
    o = moe_opts(1, 1, DL_F64, 1), o.layout.pp = 2, o.pipeline.schedule = DL_SCHED_INTERLEAVED;
    o.model.layers = 4, o.batch.microbatches = 2;
    refused(o, "--schedule interleaved");
    o = moe_opts(1, 1, DL_F64, 1), o.layout.pp = 2, o.pipeline.schedule = DL_SCHED_ASYNC;
    refused(o, "--schedule async");
    o = moe_opts(1, 1, DL_F32, 1), o.precision.recompute = DL_RECOMPUTE_FULL;
    refused(o, "--recompute");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("moe_train");
    TCase *tc = tcase_create("moe_train");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, dp2_ep2);
    tcase_add_test(tc, dp4_ep4);
    tcase_add_test(tc, dp4_ep2);
    tcase_add_test(tc, zero_dp4_ep2);
    tcase_add_test(tc, pp2_dp2_ep2);
    tcase_add_test(tc, bf16_dp4_ep2);
    tcase_add_test(tc, tp2_dp2_ep2);
    tcase_add_test(tc, routing_negative_control);
    tcase_add_test(tc, f32_step1);
    tcase_add_test(tc, combine_wait_from_trace);
    tcase_add_test(tc, zero_tokens);
    tcase_add_test(tc, refusals);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
