/* The continuous asynchronous pipeline (PipeDream without a flush between steps):
 *  - the per-step slices (dl_sched_async_step) concatenate to the window's async schedule;
 *  - the engine running them open across steps computes, step by step, exactly what a serial
 *    reference computes executing the window's schedule in one thread with the same weight
 *    versions (a toy model of one weight a stage; with and without weight stashing), and a
 *    negative control (the reference flushed every step) differs from it;
 *  - its simulated bubble: (p-1)/(n m + p-1) over the window at uniform costs, none in the
 *    steady state;
 *  - the trainer: a window's steps do not depend on later ones, step 1 is a flushed run's, and
 *    step 2 is not (the pipeline did not drain); a stop request ends the window a step later. */
#include "../testutil.h"
#include "parallel/pipe_train.h"
#include <check.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

/* ---- the slices are the window's schedule, cut at the step's last OPT -------------------- */

START_TEST(slices_concatenate)
{
    const int cases[][3] = {{2, 4, 3}, {4, 8, 5}, {4, 2, 4}, {5, 1, 6}, {3, 3, 1}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int p = cases[c][0], m = cases[c][1], n = cases[c][2];
        dl_sched *w;
        ck_assert_int_eq(dl_sched_async(p, n * m, 0, &w), DL_OK);
        int *at = calloc((size_t)p, sizeof *at);
        for (int t = 0; t < n; t++) {
            dl_sched *sl;
            ck_assert_msg(dl_sched_async_step(p, m, n, t, 0, &sl) == DL_OK, "%s", dl_errmsg());
            for (int s = 0; s < p; s++) {
                for (int i = 0; i < sl->len[s]; i++, at[s]++) {
                    const dl_sched_action *a = &sl->act[s][i], *b = &w->act[s][at[s]];
                    ck_assert_msg(at[s] < w->len[s] && a->op == b->op && a->mb == b->mb,
                                  "p %d m %d n %d step %d stage %d action %d", p, m, n, t, s, i);
                }
                /* a step ends with the OPT of its last micro-batch */
                const dl_sched_action *z = &sl->act[s][sl->len[s] - 1];
                ck_assert(z->op == DL_SCHED_OPT && z->mb == (t + 1) * m - 1);
            }
            dl_sched_free(sl);
        }
        for (int s = 0; s < p; s++) ck_assert_int_eq(at[s], w->len[s]);
        free(at);
        dl_sched_free(w);
    }
    dl_sched *sl;
    ck_assert_int_eq(dl_sched_async_step(2, 4, 3, 3, 0, &sl), DL_EINVAL);
}
END_TEST

/* ---- the toy model: stage s holds one weight; y = tanh(w x); the loss 0.5 (y - target)^2 ---- */

enum { TP = 4, TM = 3, TN = 4, TMAX = TN * TM };
static const double LR = 0.3;

typedef struct toy_stage {
    double w, grad;
    double x[TMAX], y[TMAX], wf[TMAX]; /* per micro-batch: input, output, forward's weight */
    double in, gin, out, gout;         /* hand-off buffers */
    int stash, stage, p;
    double after[TN]; /* the weight after each step */
} toy_stage;

static double toy_data(int g) { return 0.5 + 0.25 * sin(1.7 * g); }
static double toy_target(int g) { return 0.1 * cos(0.9 * g); }

static void toy_forward(toy_stage *t, int g, double x)
{
    t->x[g] = x;
    t->wf[g] = t->w;
    t->y[g] = tanh(t->w * x);
}

/* the backward with the weight the semantics give (stashing: the forward's), dx returned */
static double toy_backward(toy_stage *t, int g, double gy)
{
    double d = gy * (1 - t->y[g] * t->y[g]);
    t->grad += d * t->x[g];
    return d * (t->stash ? t->wf[g] : t->w);
}

static void toy_opt(toy_stage *t)
{
    t->w -= LR * t->grad;
    t->grad = 0;
}

static void toy_init(toy_stage *t, int s, int p, int stash)
{
    memset(t, 0, sizeof *t);
    t->w = 0.8 + 0.1 * s;
    t->stage = s, t->p = p, t->stash = stash;
}

/* engine callbacks */
static void *c_fwd_in(void *arg, int mb, int ch)
{
    (void)mb, (void)ch;
    return &((toy_stage *)arg)->in;
}
static void *c_bwd_in(void *arg, int mb, int ch)
{
    (void)mb, (void)ch;
    return &((toy_stage *)arg)->gin;
}
static int c_fwd(void *arg, int mb, int ch, const void **out)
{
    toy_stage *t = arg;
    (void)ch;
    toy_forward(t, mb, t->stage == 0 ? toy_data(mb) : t->in);
    t->out = t->y[mb];
    *out = t->stage == t->p - 1 ? NULL : &t->out;
    return DL_OK;
}
static int c_bwd(void *arg, int mb, int ch, const void **din)
{
    toy_stage *t = arg;
    (void)ch;
    double gy = t->stage == t->p - 1 ? t->y[mb] - toy_target(mb) : t->gin;
    t->gout = toy_backward(t, mb, gy);
    *din = t->stage == 0 ? NULL : &t->gout;
    return DL_OK;
}
static int c_opt(void *arg, int mb)
{
    (void)mb;
    toy_opt(arg);
    return DL_OK;
}

typedef struct toy_world {
    toy_stage st[TP];
    int p, cut; /* cut: a quiet point after this many steps (0: one window of TN) */
} toy_world;

/* Each rank runs its slices; the engine stays open inside a window, drains at its end. */
static int toy_rank(dl_ctx *ctx, void *arg)
{
    toy_world *W = arg;
    int s = dl_ctx_rank(ctx);
    toy_stage *t = &W->st[s];
    dl_pipe *e;
    int rc = dl_pipe_create(dl_ctx_comm(ctx), 1, DL_F64, NULL, &e);
    dl_pipe_ops ops = {c_fwd_in, c_fwd, c_bwd_in, c_bwd, c_opt};
    for (int k = 0; rc == DL_OK && k < TN; k++) {
        /* the window holding step k: [0, TN), or [0, cut) and [cut, TN) */
        int first = W->cut && k >= W->cut ? W->cut : 0;
        int n = !W->cut ? TN : k < W->cut ? W->cut : TN - W->cut;
        dl_sched *sl = NULL;
        if ((rc = dl_sched_async_step(W->p, TM, n, k - first, t->stash, &sl)))
            break;
        /* the window numbers micro-batches from its start: the toy's from the run's */
        for (int q = 0; q < sl->p; q++)
            for (int i = 0; i < sl->len[q]; i++) sl->act[q][i].mb += first * TM;
        dl_pipe_set_open(e, k - first < n - 1);
        rc = dl_pipe_run(e, sl, &ops, t, k + 1, NULL, 0, NULL);
        dl_sched_free(sl);
        t->after[k] = t->w;
    }
    dl_pipe_destroy(e);
    return rc;
}

/* The serial reference: every stage's list of each window's schedule executed in one thread,
 * an action as soon as its input exists (the order across stages cannot change a stage's
 * numbers: only its own list orders its weight's updates). */
static void toy_serial(toy_stage *st, int p, int stash, const int *windows, int nw)
{
    double act[TP][TMAX], grd[TP][TMAX];
    int have_a[TP][TMAX] = {{0}}, have_g[TP][TMAX] = {{0}};
    for (int s = 0; s < p; s++) toy_init(&st[s], s, p, stash);
    for (int wi = 0, base = 0; wi < nw; base += windows[wi] * TM, wi++) {
        dl_sched *w;
        ck_assert_int_eq(dl_sched_async(p, windows[wi] * TM, stash, &w), DL_OK);
        int at[TP] = {0}, left = 1;
        while (left) {
            left = 0;
            for (int s = 0; s < p; s++) {
                if (at[s] == w->len[s])
                    continue;
                left = 1;
                const dl_sched_action *a = &w->act[s][at[s]];
                int g = a->mb + base;
                toy_stage *t = &st[s];
                if (a->op == DL_SCHED_F) {
                    if (s > 0 && !have_a[s - 1][g])
                        continue;
                    toy_forward(t, g, s == 0 ? toy_data(g) : act[s - 1][g]);
                    act[s][g] = t->y[g], have_a[s][g] = 1;
                } else if (a->op == DL_SCHED_B) {
                    if (s < p - 1 && !have_g[s + 1][g])
                        continue;
                    grd[s][g] =
                        toy_backward(t, g, s == p - 1 ? t->y[g] - toy_target(g) : grd[s + 1][g]);
                    have_g[s][g] = 1;
                } else {
                    toy_opt(t);
                    if ((g + 1) % TM == 0)
                        t->after[g / TM] = t->w;
                }
                at[s]++;
            }
        }
        dl_sched_free(w);
    }
}

START_TEST(toy_equals_serial)
{
    for (int stash = 0; stash <= 1; stash++)
        for (int cut = 0; cut <= 2; cut += 2) {
            toy_world W;
            W.p = TP, W.cut = cut;
            for (int s = 0; s < TP; s++) toy_init(&W.st[s], s, TP, stash);
            ck_assert_msg(tu_run_world(TP, toy_rank, &W) == DL_OK, "%s", dl_errmsg());
            toy_stage ref[TP], flushed[TP];
            int one[] = {TN}, two[] = {cut, TN - cut}, each[TN];
            for (int k = 0; k < TN; k++) each[k] = 1;
            toy_serial(ref, TP, stash, cut ? two : one, cut ? 2 : 1);
            toy_serial(flushed, TP, stash, each, TN);
            int differs = 0;
            for (int k = 0; k < TN; k++)
                for (int s = 0; s < TP; s++) {
                    /* the same operations in the same order on each stage: the same bits */
                    ck_assert_msg(W.st[s].after[k] == ref[s].after[k],
                                  "stash %d cut %d step %d stage %d: %.17g, the serial "
                                  "reference %.17g",
                                  stash, cut, k + 1, s, W.st[s].after[k], ref[s].after[k]);
                    differs |= flushed[s].after[k] != ref[s].after[k];
                    if (k == 0) /* the first step is a flushed one's */
                        ck_assert(flushed[s].after[0] == ref[s].after[0]);
                }
            ck_assert_msg(differs, "negative control: a flushed pipeline gave the same weights");
        }
}
END_TEST

/* ---- the simulator's continuous figure ------------------------------------------------------ */

START_TEST(continuous_figure)
{
    const int cases[][3] = {{4, 8, 20}, {2, 4, 5}, {4, 4, 4}, {4, 4, 3}, {3, 8, 1}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int p = cases[c][0], m = cases[c][1], n = cases[c][2];
        double run, steady;
        ck_assert_int_eq(dl_sched_async_continuous(p, m, n, NULL, &run, &steady), DL_OK);
        /* 1F1B's fill and drain once over the window's n m micro-batches */
        double want = (double)(p - 1) / (n * m + p - 1);
        ck_assert_msg(fabs(run - want) < 1e-12, "p %d m %d n %d: %.6f, want %.6f", p, m, n, run,
                      want);
        /* most steps after the warm-up keep every stage busy (F and B alike on all): the median
         * over them (the last one drains) from 4 steps on */
        if (n >= 4)
            ck_assert_msg(fabs(steady) < 1e-12, "p %d m %d: steady %.6f", p, m, steady);
    }
    double run, steady;
    ck_assert_int_eq(dl_sched_async_continuous(4, 8, 0, NULL, &run, &steady), DL_EINVAL);
}
END_TEST

/* Per stage, worked by hand for p 2, m 1, n 2 (f 1, b 2, opt 0): stage 1 runs F0 B0 | F1 B1 back to
 * back from t = 1 (its step 1 spans 4..7, busy 3); stage 0 runs F0 F1, waits for B0 (4..6), then
 * for B1 (7..9): step 1 spans 6..9 with 2 busy, a third idle. The steps after the first are just
 * step 1 here. At p 4, m 8, 20 steps every stage's steady state is busy throughout. */
START_TEST(continuous_stages)
{
    double st[4];
    ck_assert_int_eq(dl_sched_async_continuous_stages(2, 1, 2, NULL, st), DL_OK);
    ck_assert_msg(fabs(st[0] - 1.0 / 3) < 1e-12 && fabs(st[1]) < 1e-12, "%.6f %.6f", st[0], st[1]);
    ck_assert_int_eq(dl_sched_async_continuous_stages(4, 8, 20, NULL, st), DL_OK);
    for (int q = 0; q < 4; q++) ck_assert_msg(fabs(st[q]) < 1e-12, "stage %d: %.6f", q, st[q]);
    ck_assert_int_eq(dl_sched_async_continuous_stages(4, 8, 0, NULL, st), DL_EINVAL);
}
END_TEST

/* Times for dl_sched_async(p, M)'s actions at f 1, b 2, opt 0, stage 1's backward of micro-batch
 * `late` taking 3 (late < 0: none). */
static void window_times(const dl_sched *w, int late, double **dur)
{
    for (int q = 0; q < w->p; q++)
        for (int i = 0; i < w->len[q]; i++) {
            const dl_sched_action *a = &w->act[q][i];
            dur[q][i] = a->op == DL_SCHED_F ? 1 : a->op == DL_SCHED_B ? 2 : 0;
            if (q == 1 && a->op == DL_SCHED_B && a->mb == late)
                dur[q][i] = 3;
        }
}

/* The replay with a run's own times: the costs themselves give the simulator's figure; one late
 * backward, worked by hand for p 2, m 1, n 2: stage 1's B1 takes 3 (5..8), stage 0 waits for it
 * (its B1 8..10): step 1 spans 6..10 on stage 0 (busy 2) and 4..8 on stage 1 (busy 4), so the
 * bubble is 1 - 6 / (2 x 4) = 1/4, against 1/6 on time. */
START_TEST(replay_times)
{
    dl_sched *w = NULL;
    ck_assert_int_eq(dl_sched_async(2, 2, 0, &w), DL_OK);
    double a[16], b[16], *dur[2] = {a, b}, steady, want, run;
    ck_assert(w->len[0] <= 16 && w->len[1] <= 16);
    window_times(w, -1, dur);
    ck_assert_int_eq(dl_sched_async_continuous_replay(2, 1, 2, (const double *const *)dur, &steady),
                     DL_OK);
    ck_assert_int_eq(dl_sched_async_continuous(2, 1, 2, NULL, &run, &want), DL_OK);
    ck_assert_msg(fabs(steady - want) < 1e-12 && fabs(want - 1.0 / 6) < 1e-12, "%.6f %.6f", steady,
                  want);
    window_times(w, 1, dur);
    ck_assert_int_eq(dl_sched_async_continuous_replay(2, 1, 2, (const double *const *)dur, &steady),
                     DL_OK);
    ck_assert_msg(fabs(steady - 0.25) < 1e-12, "late backward: %.6f, want 0.25", steady);
    dur[0][0] = -1;
    dl_sched_sim *sim = NULL;
    ck_assert_int_eq(dl_sched_simulate_times(w, (const double *const *)dur, &sim), DL_EINVAL);
    ck_assert_ptr_null(sim);
    ck_assert_int_eq(dl_sched_async_continuous_replay(2, 1, 2, NULL, &steady), DL_EINVAL);
    dl_sched_free(w);
}
END_TEST

/* ---- the windows' quiet points -------------------------------------------------------------- */

START_TEST(window_ends)
{
    dl_train_opts o;
    dl_train_opts_init(&o);
    o.optim.steps = 20;
    ck_assert_int_eq(tr_async_window_end(&o, 1), 20);
    o.eval.every = 6;
    ck_assert_int_eq(tr_async_window_end(&o, 1), 6);
    ck_assert_int_eq(tr_async_window_end(&o, 7), 12);
    o.ckpt.save_every = 4; /* without a directory no checkpoint is due */
    ck_assert_int_eq(tr_async_window_end(&o, 7), 12);
    o.ckpt.dir = "x";
    ck_assert_int_eq(tr_async_window_end(&o, 7), 8);
    ck_assert_int_eq(tr_async_window_end(&o, 17), 18);
    /* a stop after step 3 of [1, 12]: the next step when m >= p - 1, later when not */
    ck_assert_int_eq(tr_async_window_cut(4, 8, 1, 12, 3), 4);
    ck_assert_int_eq(tr_async_window_cut(4, 2, 1, 12, 3), 5);
    ck_assert_int_eq(tr_async_window_cut(4, 8, 1, 3, 3), 3);
}
END_TEST

/* ---- the trainer ---------------------------------------------------------------------------- */

static dl_train_opts tiny_async(int steps, int every, int stash)
{
    dl_train_opts o;
    dl_train_opts_init(&o);
    o.model.layers = 2, o.model.d_model = 16, o.model.heads = 2, o.model.seq = 8;
    o.batch.micro = 1, o.batch.microbatches = 4, o.batch.global = 4;
    o.layout.pp = 2;
    o.pipeline.schedule = DL_SCHED_ASYNC;
    o.pipeline.weight_stashing = stash;
    o.precision.dtype = DL_F64;
    o.optim.steps = steps;
    o.optim.warmup = 0;
    o.optim.lr = o.optim.min_lr = 1e-2; /* constant: runs of other lengths share it */
    o.machine.timeout_s = 120;
    o.eval.every = every;
    o.eval.windows = 2;
    o.output.log_every = 0;
    return o;
}

/* A window's steps are what they are whatever comes after its quiet point; its first step is a
 * flushed one's (the quiet point every step), its second is not: the pipeline did not drain. */
START_TEST(trainer_windows)
{
    dl_train_result a, b, c;
    dl_train_opts oa = tiny_async(4, 2, 1), ob = tiny_async(2, 0, 1), oc = tiny_async(2, 1, 1);
    ck_assert_msg(dl_train_run(&oa, &a) == DL_OK, "%s", dl_errmsg());
    ck_assert_msg(dl_train_run(&ob, &b) == DL_OK, "%s", dl_errmsg());
    ck_assert_msg(dl_train_run(&oc, &c) == DL_OK, "%s", dl_errmsg());
    for (int i = 0; i < 2; i++)
        ck_assert_msg(a.steps[i].loss == b.steps[i].loss, "step %d: %.17g vs %.17g", i + 1,
                      a.steps[i].loss, b.steps[i].loss);
    ck_assert(a.steps[1].val_loss == b.steps[1].val_loss &&
              isfinite(a.steps[1].val_loss)); /* the evaluation at the quiet point */
    ck_assert(c.steps[0].loss == b.steps[0].loss);
    ck_assert_msg(c.steps[1].loss != b.steps[1].loss,
                  "step 2 equals the flushed pipeline's: no overlap across the step boundary");
    ck_assert_int_eq(a.pipeline.slots[0], 2);
    dl_train_result_free(&a), dl_train_result_free(&b), dl_train_result_free(&c);
}
END_TEST

/* A stop request inside a window: the pipeline runs on to its earliest quiet point (a step after
 * the ranks agreed, m >= p - 1 here), drains there, saves and stops; resumed, the rest equals,
 * bit for bit, an uninterrupted run whose window ends at the same step. */
START_TEST(trainer_stop)
{
    char root[] = "/tmp/distlab-pipe-cont-XXXXXX", why[256];
    ck_assert_ptr_nonnull(mkdtemp(root));
    dl_train_opts o = tiny_async(6, 0, 0);
    o.output.want_params = 1;
    o.ckpt.dir = root;
    static const int stop_step = 2;
    dl_train_result a, b, u;
    tu_run_stopped(&o, &stop_step, &a);
    /* on_step runs once every rank finished the step: the ranks agree after step 2 or 3 */
    ck_assert_msg(a.nsteps == 3 || a.nsteps == 4, "stopped after step %d", a.nsteps);
    int k = a.nsteps;
    dl_train_opts r = o;
    r.ckpt.resume = root;
    r.eval.every = k; /* the windows [1, k], [k + 1, ...] of both runs */
    ck_assert_msg(dl_train_run(&r, &b) == DL_OK, "%s", dl_errmsg());
    dl_train_opts p = r;
    p.ckpt.resume = p.ckpt.dir = NULL;
    ck_assert_msg(dl_train_run(&p, &u) == DL_OK, "%s", dl_errmsg());
    ck_assert_int_eq(b.ckpt.resumed_from, k);
    ck_assert_msg(tu_same_bits(&u, &b, why, sizeof why), "%s", why);
    dl_train_result_free(&a), dl_train_result_free(&b), dl_train_result_free(&u);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("pipe_cont");
    TCase *tc = tcase_create("pipe_cont");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, slices_concatenate);
    tcase_add_test(tc, toy_equals_serial);
    tcase_add_test(tc, continuous_figure);
    tcase_add_test(tc, continuous_stages);
    tcase_add_test(tc, replay_times);
    tcase_add_test(tc, window_ends);
    tcase_add_test(tc, trainer_windows);
    tcase_add_test(tc, trainer_stop);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
