/* The pipeline engine and pipelined training:
 *  - the engine hands every activation and gradient to the right virtual stage, in every
 *    schedule (values encode their origin and are checked at the receiver);
 *  - pipelined training (p = 2, 4; m = 1, 4, 8; GPipe, 1F1B, interleaved, 1F1B-split, ZB-H1,
 *    ZB-H2, ZB-V; with dp and tp, ZeRO; tied embeddings) trains exactly the model one rank trains, within the rounding bounds of
 *    lib/train/compare.h (f64 and f32), and negative controls fail them;
 *  - asynchronous PipeDream: with weight stashing every backward uses its forward's weights,
 *    without the gap is p - s (1-based s);
 *  - 1F1B's peak activation memory on the first stage is p/m of GPipe's (arena, m >= p);
 *  - bad configurations are refused with a message. */
#include "../testutil.h"
#include "parallel/pipe_train.h"
#include <time.h>
#include <check.h>
#include <math.h>

/* ---- the engine alone: hand-offs carry (micro-batch, virtual stage) ------------------------ */

#define HCOUNT 6000 /* elements per hand-off: rendezvous-sized */

typedef struct hand_rank {
    int p, v, stage, wrong, fwd, bwd, wgt, sleep_ms;
    const dl_sched *s;    /* its placement names each chunk's virtual stage */
    dl__test_hook *watch; /* with sleep_ms: sleep only once a sender sleeps on a channel */
    dl_pipe_stats st;
    double in[HCOUNT], out[HCOUNT], gin[HCOUNT], gout[HCOUNT];
} hand_rank;

typedef struct hand_arg {
    const dl_sched *s;
    hand_rank r[8];
    int status[8];
} hand_arg;

static double code(int mb, int vstage, int grad, int i)
{
    return grad * 1e7 + mb * 1e5 + vstage * 1e3 + i % 100;
}

static void *h_fwd_in(void *arg, int mb, int ch)
{
    (void)mb, (void)ch;
    return ((hand_rank *)arg)->in;
}
static void *h_bwd_in(void *arg, int mb, int ch)
{
    (void)mb, (void)ch;
    return ((hand_rank *)arg)->gin;
}

static int h_fwd(void *arg, int mb, int ch, const void **out)
{
    hand_rank *h = arg;
    int vs = h->s->vstage[h->stage * h->v + ch];
    if (vs > 0 && (h->in[0] != code(mb, vs - 1, 0, 0) ||
                   h->in[HCOUNT - 1] != code(mb, vs - 1, 0, HCOUNT - 1)))
        h->wrong++;
    for (int i = 0; i < HCOUNT; i++) h->out[i] = code(mb, vs, 0, i);
    h->fwd++;
    *out = h->out;
    return DL_OK;
}

static int h_bwd(void *arg, int mb, int ch, const void **din)
{
    hand_rank *h = arg;
    int vs = h->s->vstage[h->stage * h->v + ch], last = h->p * h->v - 1;
    if (vs < last && (h->gin[0] != code(mb, vs + 1, 1, 0) ||
                      h->gin[HCOUNT - 1] != code(mb, vs + 1, 1, HCOUNT - 1)))
        h->wrong++;
    for (int i = 0; i < HCOUNT; i++) h->gout[i] = code(mb, vs, 1, i);
    if (h->sleep_ms && h->bwd == 0) {
        if (h->watch)
            tu_wait_asleep(h->watch, DL__CHAN_SENDER, 1);
        struct timespec ts = {0, h->sleep_ms * 1000000L};
        nanosleep(&ts, NULL);
    }
    h->bwd++;
    *din = h->gout;
    return DL_OK;
}

/* W: no hand-off, only counted (after its I: the validator's order, checked again here) */
static int h_wgt(void *arg, int mb, int ch)
{
    hand_rank *h = arg;
    (void)mb, (void)ch;
    h->wgt++;
    if (h->wgt > h->bwd)
        h->wrong++;
    return DL_OK;
}

static int hand_fn(dl_ctx *ctx, void *argp)
{
    hand_arg *a = argp;
    int r = dl_ctx_rank(ctx);
    hand_rank *h = &a->r[r];
    h->p = a->s->p, h->v = a->s->v, h->stage = r, h->s = a->s;
    dl_pipe *e;
    int rc = dl_pipe_create(dl_ctx_comm(ctx), HCOUNT, DL_F64, dl_ctx_arena(ctx), &e);
    dl_pipe_ops ops = {h_fwd_in, h_fwd, h_bwd_in, h_bwd, NULL};
    dl_pipe_split_ops split = {h_bwd, h_wgt};
    if (rc == DL_OK)
        dl_pipe_set_split(e, &split);
    for (int step = 1; rc == DL_OK && step <= 2; step++)
        rc = dl_pipe_run(e, a->s, &ops, h, step, NULL, 0, &h->st);
    dl_pipe_destroy(e);
    a->status[r] = rc;
    return rc;
}

static void check_handoffs(dl_sched *s)
{
    ck_assert_msg(dl_sched_validate(s) == DL_OK, "%s", dl_errmsg());
    hand_arg *a = calloc(1, sizeof *a);
    a->s = s;
    int rc = tu_run_world(s->p, hand_fn, a);
    ck_assert_msg(rc == DL_OK, "%s p %d m %d v %d: %s", dl_sched_kind_name(s->kind), s->p, s->m,
                  s->v, dl_errmsg());
    for (int r = 0; r < s->p; r++) {
        ck_assert_msg(a->r[r].wrong == 0, "stage %d received %d wrong hand-offs", r, a->r[r].wrong);
        ck_assert_int_eq(a->r[r].fwd, 2 * s->m * s->v);
        ck_assert_int_eq(a->r[r].bwd, 2 * s->m * s->v);
        ck_assert_int_eq(a->r[r].wgt, dl_sched_splits(s, r) ? 2 * s->m * s->v : 0);
    }
    free(a);
    dl_sched_free(s);
}

/* The engine's overhead is what is left of the wall time: every part is accounted for (the
 * parts are disjoint intervals of the step, so they sum to the wall exactly), and waiting for a
 * busy neighbour to take the last hand-off is drain time, not overhead. Stage 0, in its first
 * backward, waits until the channels' watch (core/testhook.h) shows stage 1 asleep waiting for
 * its last gradient to be taken (its drain: it sent both), then sleeps 200 ms before taking it:
 * stage 1's drain holds those 200 ms, a lower bound the test forces on any schedule. */
START_TEST(engine_accounting)
{
    dl_sched *s;
    ck_assert(dl_sched_gpipe(2, 2, &s) == DL_OK);
    hand_arg *a = calloc(1, sizeof *a);
    dl__test_hook hook = {0};
    tu_chan_watch(&hook, 0);
    a->s = s;
    a->r[0].sleep_ms = 200;
    a->r[0].watch = &hook;
    a->r[0].bwd = -2; /* the first backward of step 2 (the step whose stats hand_fn keeps) */
    ck_assert_msg(tu_run_world(2, hand_fn, a) == DL_OK, "%s", dl_errmsg());
    tu_chan_unwatch();
    for (int r = 0; r < 2; r++) {
        const dl_pipe_stats *st = &a->r[r].st;
        uint64_t sum =
            st->busy_ns + st->recv_ns + st->send_ns + st->opt_ns + st->drain_ns + st->engine_ns;
        ck_assert_msg(sum == st->wall_ns, "stage %d: parts %llu, wall %llu", r,
                      (unsigned long long)sum, (unsigned long long)st->wall_ns);
    }
    const dl_pipe_stats *last = &a->r[1].st;
    ck_assert_msg(last->drain_ns >= 200000000ull,
                  "stage 1 waited %llu ns to drain, want >= the 200 ms stage 0 slept",
                  (unsigned long long)last->drain_ns);
    free(a);
    dl_sched_free(s);
}
END_TEST

START_TEST(engine_handoffs)
{
    dl_sched *s;
    ck_assert(dl_sched_gpipe(4, 6, &s) == DL_OK);
    check_handoffs(s);
    ck_assert(dl_sched_1f1b(4, 6, &s) == DL_OK);
    check_handoffs(s);
    ck_assert(dl_sched_1f1b(3, 2, &s) == DL_OK);
    check_handoffs(s);
    /* p = 2: the wrap-around link 1 -> 0 carries activations (chunk c -> c+1) while 0 -> 1
     * carries both activations and the wrap's gradients */
    ck_assert(dl_sched_interleaved(2, 4, 3, &s) == DL_OK);
    check_handoffs(s);
    ck_assert(dl_sched_interleaved(4, 8, 2, &s) == DL_OK);
    check_handoffs(s);
    ck_assert(dl_sched_async(4, 8, 1, &s) == DL_OK);
    check_handoffs(s);
    /* split backwards; ZB-V's and DualPipeV's V placement, whose turn (virtual stage p-1 to p) stays on the
     * last stage and whose first and last virtual stages share stage 0 */
    ck_assert(dl_sched_1f1b_split(4, 6, &s) == DL_OK);
    check_handoffs(s);
    ck_assert(dl_sched_zb_h1(4, 8, &s) == DL_OK);
    check_handoffs(s);
    ck_assert(dl_sched_zb_h2(3, 5, &s) == DL_OK);
    check_handoffs(s);
    ck_assert(dl_sched_zb_v(4, 8, &s) == DL_OK);
    check_handoffs(s);
    ck_assert(dl_sched_zb_v(2, 3, &s) == DL_OK);
    check_handoffs(s);
    ck_assert(dl_sched_dualpipev(3, 7, &s) == DL_OK);
    check_handoffs(s);
}
END_TEST

START_TEST(engine_peers)
{
    int prev, next;
    dl_pipe_peers(4, 1, 0, 0, &prev, &next);
    ck_assert(prev == -1 && next == 1);
    dl_pipe_peers(4, 1, 3, 0, &prev, &next);
    ck_assert(prev == 2 && next == -1);
    dl_pipe_peers(4, 2, 3, 0, &prev, &next); /* virtual stage 3 -> 4 = stage 0 chunk 1 */
    ck_assert(prev == 2 && next == 0);
    dl_pipe_peers(4, 2, 0, 1, &prev, &next);
    ck_assert(prev == 3 && next == 1);
    dl_pipe_peers(4, 2, 3, 1, &prev, &next);
    ck_assert(prev == 2 && next == -1);
}
END_TEST

/* ---- pipelined training equals one rank --------------------------------------------------- */

static dl_train_opts base(int pp, int m, int sched, dl_dtype dt)
{
    return tu_pipe_opts(pp, m, sched, dt);
}

static int vs_one_rank(dl_train_opts o, dl__test_hook *hook, char *why, size_t wn)
{
    int same = tu_pipe_vs_one_rank(o, hook, why, wn);
    ck_assert_msg(same >= 0, "%s", why);
    return same;
}

static void equals_one_rank(dl_train_opts o)
{
    char why[512];
    int same = vs_one_rank(o, NULL, why, sizeof why);
    ck_assert_msg(same == 1, "%s dp %d tp %d pp %d m %d %s: %s",
                  dl_sched_kind_name((dl_sched_kind)o.pipeline.schedule), o.layout.dp, o.layout.tp,
                  o.layout.pp, o.batch.microbatches, dl_dtype_name(o.precision.dtype), why);
}

/* The bounds are tight: pp 2 x dp 2 with the first gradient all-reduce skipped, and pp 2 with one
 * element of stage 1's parameters perturbed by 1e-6 (f64) or 1e-3 (f32) relative, fail them. */
START_TEST(controls)
{
    for (int f = 0; f < 2; f++) {
        dl_train_opts o = base(2, 2, DL_SCHED_1F1B, f ? DL_F32 : DL_F64);
        o.layout.dp = 2;
        dl__test_hook h[2] = {tu_skip_hook(DL_PURPOSE_GRADS, 1), tu_perturb_hook(&o)};
        for (int k = 0; k < 2; k++) {
            if (k == 1)
                o.layout.dp = 1;
            char why[512];
            int same = vs_one_rank(o, &h[k], why, sizeof why);
            ck_assert_msg(same == 0 && atomic_load(&h[k].skipped) + atomic_load(&h[k].perturbed),
                          "pp 2 dp %d %s control %d: %s", o.layout.dp,
                          dl_dtype_name(o.precision.dtype), k,
                          same ? "passed as the same model" : why);
            fprintf(stderr, "control pp 2 dp %d %s %s: differs (%s)\n", o.layout.dp,
                    dl_dtype_name(o.precision.dtype),
                    k ? "one element perturbed" : "first gradient all-reduce skipped", why);
        }
    }
}
END_TEST

/* loop index -> (p, m, schedule) */
static const struct {
    int p, m, sched;
} CASES[] = {
    {2, 4, DL_SCHED_GPIPE}, {2, 4, DL_SCHED_1F1B},        {2, 4, DL_SCHED_INTERLEAVED},
    {4, 8, DL_SCHED_1F1B},  {2, 1, DL_SCHED_GPIPE},       {4, 4, DL_SCHED_GPIPE},
    {4, 1, DL_SCHED_1F1B},  {2, 8, DL_SCHED_INTERLEAVED}, {4, 8, DL_SCHED_GPIPE},
};
#define NCASES (int)(sizeof CASES / sizeof CASES[0])

START_TEST(pp_f64) { equals_one_rank(base(CASES[_i].p, CASES[_i].m, CASES[_i].sched, DL_F64)); }
END_TEST

START_TEST(pp_f32) { equals_one_rank(base(CASES[_i].p, CASES[_i].m, CASES[_i].sched, DL_F32)); }
END_TEST

/* the zero-bubble schedules: split backward, W deferred, ZB-V's V placement (the embeddings
 * and the head both on stage 0) */
static const struct {
    int p, m, sched, layers;
} ZB_CASES[] = {
    {2, 4, DL_SCHED_ZB_V, 4}, {4, 8, DL_SCHED_ZB_H1, 4},      {2, 4, DL_SCHED_ZB_H2, 4},
    {4, 8, DL_SCHED_ZB_V, 8}, {2, 4, DL_SCHED_1F1B_SPLIT, 4}, {4, 8, DL_SCHED_ZB_H2, 4},
    {3, 5, DL_SCHED_ZB_V, 6},
};
#define NZB (int)(sizeof ZB_CASES / sizeof ZB_CASES[0])

START_TEST(zb_f64)
{
    dl_train_opts o = base(ZB_CASES[_i].p, ZB_CASES[_i].m, ZB_CASES[_i].sched, DL_F64);
    o.model.layers = ZB_CASES[_i].layers;
    equals_one_rank(o);
}
END_TEST

/* with dp x tp, ZeRO 1-3 (the gradients reduced after the engine, so after every W) and tied
 * embeddings (ZB-V: both ends on one stage, nothing to exchange; ZB-H1: the two stages') */
START_TEST(zb_compose_f64)
{
    dl_train_opts o = base(2, 4, DL_SCHED_ZB_H1, DL_F64);
    o.layout.dp = 2;
    o.layout.tp = 2;
    o.model.layers = 2;
    equals_one_rank(o);
    for (int z = 1; z <= 3; z++) {
        if (DL_TEST_SMALL && z != 3)
            continue;
        o = base(2, 2, z == 2 ? DL_SCHED_ZB_H2 : DL_SCHED_ZB_V, DL_F64);
        o.layout.dp = 2;
        o.zero.stage = z;
        equals_one_rank(o);
    }
    int tied[] = {DL_SCHED_ZB_V, DL_SCHED_ZB_H1};
    for (int k = 0; k < 2; k++) {
        o = base(2, 4, tied[k], DL_F64);
        o.model.tie = 1;
        equals_one_rank(o);
    }
}
END_TEST

/* DualPipeV (the V of ZB-V, m >= 2p): pp 2 with dp 2 and with ZeRO-1, pp 4 (8 layers) */
START_TEST(dualpipev_f64)
{
    dl_train_opts o = base(2, 4, DL_SCHED_DUALPIPEV, DL_F64);
    o.layout.dp = 2;
    equals_one_rank(o);
    o.zero.stage = 1;
    equals_one_rank(o);
    o = base(4, 8, DL_SCHED_DUALPIPEV, DL_F64);
    o.model.layers = 8;
    equals_one_rank(o);
}
END_TEST

START_TEST(pp_interleaved4_f64)
{
    dl_train_opts o = base(4, 4, DL_SCHED_INTERLEAVED, DL_F64);
    o.model.layers = 8;
    o.pipeline.virtual_stages = 2;
    equals_one_rank(o);
}
END_TEST

START_TEST(pp_dp_tp_f64)
{
    dl_train_opts o = base(2, 4, DL_SCHED_1F1B, DL_F64);
    o.layout.dp = 2;
    o.layout.tp = 2;
    equals_one_rank(o);
}
END_TEST

START_TEST(pp_dp_tp_f32)
{
    dl_train_opts o = base(2, 4, DL_SCHED_GPIPE, DL_F32);
    o.layout.dp = 2;
    o.layout.tp = 2;
    o.model.layers = 2; /* one layer per stage: the 8-rank run stays short */
    equals_one_rank(o);
}
END_TEST

START_TEST(pp_tied_f64)
{
    dl_train_opts o = base(2, 4, DL_SCHED_1F1B, DL_F64);
    o.model.tie = 1;
    equals_one_rank(o);
    o = base(4, 4, DL_SCHED_GPIPE, DL_F64);
    o.model.tie = 1;
    o.layout.dp = 2;
    equals_one_rank(o);
}
END_TEST

START_TEST(pp_zero_f64)
{
    dl_train_opts o = base(2, 2, DL_SCHED_1F1B, DL_F64);
    o.layout.dp = 2;
    o.zero.stage = 2;
    equals_one_rank(o);
}
END_TEST

START_TEST(pp_zero3_f64)
{
    dl_train_opts o = base(2, 2, DL_SCHED_1F1B, DL_F64);
    o.layout.dp = 2;
    o.zero.stage = 3;
    equals_one_rank(o);
}
END_TEST

/* bf16 mixed precision: a pipeline changes nothing but where the layers run, so pp 2 x dp 2
 * ends with the same master weights as dp 2 alone (the dp reductions add the same values in the
 * same order), at ZeRO stages 0 and 3 */
START_TEST(pp_bf16_same_as_dp)
{
    for (int zero = 0; zero <= 3; zero += 3) {
        dl_train_opts a = base(2, 2, DL_SCHED_1F1B, DL_BF16), b;
        a.layout.dp = 2;
        a.zero.stage = zero;
        b = a;
        b.layout.pp = 1;
        b.pipeline.schedule = 0;
        dl_train_result ra, rb;
        ck_assert_msg(dl_train_run(&a, &ra) == DL_OK, "%s", dl_errmsg());
        ck_assert_msg(dl_train_run(&b, &rb) == DL_OK, "%s", dl_errmsg());
        for (int i = 0; i < ra.nsteps; i++)
            ck_assert_msg(ra.steps[i].loss == rb.steps[i].loss,
                          "bf16 zero %d step %d: loss %.17g "
                          "with pp 2, %.17g without",
                          zero, i + 1, ra.steps[i].loss, rb.steps[i].loss);
        char name[48];
        double w = dl__eq_worst_tensor(&a.model, ra.output.params, rb.output.params, name);
        ck_assert_msg(w == 0, "bf16 zero %d: pp 2 x dp 2 differs from dp 2 by %.3g (%s)", zero, w,
                      name);
        dl_train_result_free(&ra);
        dl_train_result_free(&rb);
    }
}
END_TEST

/* ---- asynchronous PipeDream: weight versions ---------------------------------------------- */

START_TEST(async_versions)
{
    for (int stash = 0; stash <= 1; stash++) {
        dl_train_opts o = base(4, 8, DL_SCHED_ASYNC, DL_F64);
        o.pipeline.weight_stashing = stash;
        dl_train_result r;
        ck_assert_msg(dl_train_run(&o, &r) == DL_OK, "%s", dl_errmsg());
        for (int s = 0; s < 4; s++)
            ck_assert_msg(r.pipeline.max_gap[s] == (stash ? 0 : 4 - (s + 1)),
                          "async %s stage %d: gap %d, expected %d", stash ? "stashing" : "plain",
                          s + 1, r.pipeline.max_gap[s], stash ? 0 : 4 - (s + 1));
        ck_assert(isfinite(r.optim.final_loss));
        dl_train_result_free(&r);
    }
}
END_TEST

/* ---- activation memory: 1F1B holds p micro-batches where GPipe holds m ---------------------- */

START_TEST(activation_memory)
{
    uint64_t act[2];
    int sched[2] = {DL_SCHED_GPIPE, DL_SCHED_1F1B};
    for (int k = 0; k < 2; k++) {
        dl_train_opts o = base(4, 8, sched[k], DL_F64);
        o.output.want_params = 0;
        o.optim.steps = 1;
        dl_train_result r;
        ck_assert_msg(dl_train_run(&o, &r) == DL_OK, "%s", dl_errmsg());
        act[k] = r.memory.peak[DL_MEM_ACTIVATIONS]; /* rank 0 = stage 1 */
        ck_assert_int_eq(r.pipeline.slots[0], k == 0 ? 8 : 4);
        dl_train_result_free(&r);
    }
    ck_assert_msg(act[1] * 8 <= act[0] * 4,
                  "1F1B stage 1 holds %llu activation bytes, GPipe %llu: "
                  "more than p/m = 4/8",
                  (unsigned long long)act[1], (unsigned long long)act[0]);
    ck_assert(act[1] > 0);
}
END_TEST

/* ---- the schedule's own bubble: each schedule's simulation, not one formula for all (the
 * pipeline module's figures, no run needed) ------------------------------------------------- */

START_TEST(own_bubble)
{
    const int kinds[] = {DL_SCHED_GPIPE, DL_SCHED_1F1B, DL_SCHED_INTERLEAVED, DL_SCHED_ASYNC,
                         DL_SCHED_NAIVE};
    for (int k = 0; k < 5; k++) {
        int m = kinds[k] == DL_SCHED_NAIVE ? 1 : 4, v = kinds[k] == DL_SCHED_INTERLEAVED ? 2 : 1;
        dl_train_opts o = base(2, m, kinds[k], DL_F64);
        ck_assert_int_eq(dl_train_resolve(&o, 2), DL_OK);
        tr_pp_rows rows;
        dl_train_pipeline_result r = {0};
        ck_assert_int_eq(tr_pipe_figures_open(&rows, &o, 1, 2, &r), DL_OK);
        dl_sched *sc;
        dl_sched_sim *sim;
        ck_assert_int_eq(kinds[k] == DL_SCHED_GPIPE         ? dl_sched_gpipe(2, m, &sc)
                         : kinds[k] == DL_SCHED_1F1B        ? dl_sched_1f1b(2, m, &sc)
                         : kinds[k] == DL_SCHED_INTERLEAVED ? dl_sched_interleaved(2, m, v, &sc)
                         : kinds[k] == DL_SCHED_ASYNC       ? dl_sched_async(2, m, 0, &sc)
                                                            : dl_sched_naive(2, &sc),
                         DL_OK);
        ck_assert_int_eq(dl_sched_simulate(sc, NULL, &sim), DL_OK);
        if (kinds[k] == DL_SCHED_ASYNC) {
            /* async runs as one continuous pipeline over its window (test_pipe_cont): its own
             * figure is that steady state's; 1F1B's flushed step is shown beside it */
            double run, steady;
            ck_assert_int_eq(dl_sched_async_continuous(2, m, r.window, NULL, &run, &steady), DL_OK);
            ck_assert(r.bubble_theory == steady && r.bubble_window == run);
            ck_assert(fabs(r.bubble_1f1b - 1.0 / (m + 1)) < 1e-12);
        } else {
            ck_assert(r.bubble_theory == sim->bubble_total);
        }
        if (kinds[k] == DL_SCHED_GPIPE || kinds[k] == DL_SCHED_1F1B)
            ck_assert(fabs(r.bubble_theory - 1.0 / (m + 1)) < 1e-12);
        dl_sched_sim_free(sim);
        dl_sched_free(sc);
        tr_pipe_rows_close(&rows);
        tr_pipe_result_free(&r);
    }
}
END_TEST

/* ---- bad input ---------------------------------------------------------------------------- */

START_TEST(bad_configs)
{
    dl_train_opts o = base(5, 4, DL_SCHED_GPIPE, DL_F32);
    ck_assert_int_eq(dl_train_resolve(&o, 5), DL_EINVAL);
    ck_assert_ptr_nonnull(strstr(dl_errmsg(), "larger than the layers"));
    o = base(2, 4, DL_SCHED_INTERLEAVED, DL_F32);
    o.model.layers = 6;
    o.pipeline.virtual_stages = 2;
    ck_assert_int_eq(dl_train_resolve(&o, 2), DL_EINVAL);
    ck_assert_ptr_nonnull(strstr(dl_errmsg(), "not divisible by pp 2 x virtual stages 2"));
    o = base(2, 3, DL_SCHED_INTERLEAVED, DL_F32);
    ck_assert_int_eq(dl_train_resolve(&o, 2), DL_EINVAL);
    ck_assert_ptr_nonnull(strstr(dl_errmsg(), "multiple of pp"));
    o = base(2, 4, DL_SCHED_TERAPIPE, DL_F32);
    ck_assert_int_eq(dl_train_resolve(&o, 2), DL_EINVAL);
    o = base(2, 4, DL_SCHED_1F1B, DL_F32);
    o.pipeline.weight_stashing = 1;
    ck_assert_int_eq(dl_train_resolve(&o, 2), DL_EINVAL);
    o = base(2, 4, DL_SCHED_GPIPE, DL_F32);
    ck_assert_int_eq(dl_train_resolve(&o, 4), DL_EINVAL);
    ck_assert_ptr_nonnull(strstr(dl_errmsg(), "rank count"));
    /* split backwards refuse full recomputation by name; ZB-V needs two layers a stage */
    o = base(2, 4, DL_SCHED_ZB_H1, DL_F32);
    o.precision.recompute = DL_RECOMPUTE_FULL;
    ck_assert_int_eq(dl_train_resolve(&o, 2), DL_EINVAL);
    ck_assert_ptr_nonnull(strstr(dl_errmsg(), "--recompute full does not combine with --schedule "
                                              "zb-h1"));
    o = base(4, 4, DL_SCHED_ZB_V, DL_F32);
    ck_assert_int_eq(dl_train_resolve(&o, 4), DL_EINVAL);
    ck_assert_ptr_nonnull(strstr(dl_errmsg(), "needs at least 8 layers"));
    o = base(2, 4, DL_SCHED_ZB_V, DL_F32);
    o.pipeline.virtual_stages = 3;
    ck_assert_int_eq(dl_train_resolve(&o, 2), DL_EINVAL);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("pipe");
    TCase *tc = tcase_create("pipe");
    tcase_set_timeout(tc, 900);
    tcase_add_test(tc, engine_peers);
    tcase_add_test(tc, engine_handoffs);
    tcase_add_test(tc, engine_accounting);
    tcase_add_test(tc, bad_configs);
    tcase_add_loop_test(tc, pp_f64, 0, DL_TEST_SMALL ? 3 : NCASES);
    tcase_add_loop_test(tc, pp_f32, 0, DL_TEST_SMALL ? 1 : 4);
    tcase_add_test(tc, pp_tied_f64);
    tcase_add_loop_test(tc, zb_f64, 0, DL_TEST_SMALL ? 3 : NZB);
    tcase_add_test(tc, zb_compose_f64);
    tcase_add_test(tc, dualpipev_f64);
    tcase_add_test(tc, controls);
    tcase_add_test(tc, pp_zero3_f64);
    tcase_add_test(tc, pp_bf16_same_as_dp);
    tcase_add_test(tc, async_versions);
    tcase_add_test(tc, activation_memory);
    tcase_add_test(tc, own_bubble);
    if (!DL_TEST_SMALL) {
        tcase_add_test(tc, pp_interleaved4_f64);
        tcase_add_test(tc, pp_dp_tp_f64);
        tcase_add_test(tc, pp_dp_tp_f32);
        tcase_add_test(tc, pp_zero_f64);
    }
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
