/* The continuous asynchronous pipeline (PipeDream without a flush between steps): a window of
 * n steps between two quiet points runs as one async 1F1B schedule of n m micro-batches
 * (dl_sched_async(p, n m)), cut into per-step slices, and its simulated figures
 * (include/distlab/sched.h, "continuous pipeline"). */
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "distlab/error.h"
#include "distlab/sched.h"
#include "parallel/sched_priv.h"
#include "core/stats.h"

/* Stage s's part of step t: dl_sched_async's order for M = n m micro-batches (warm-up forwards,
 * then F(k + w), B(k), OPT per micro-batch k), the part holding step t's updates. */
static void emit_slice(dl__gen *g, int s, int p, int m, int n, int t)
{
    int M = n * m, w = p - s - 1 < M ? p - s - 1 : M;
    if (t == 0)
        for (int j = 0; j < w; j++) dl__gen_emit(g, s, DL_SCHED_F, j, 0);
    for (int k = t * m; k < (t + 1) * m; k++) {
        if (k + w < M)
            dl__gen_emit(g, s, DL_SCHED_F, k + w, 0);
        dl__gen_emit(g, s, DL_SCHED_B, k, 0);
        dl__gen_emit(g, s, DL_SCHED_OPT, k, -1);
    }
}

int dl_sched_async_step(int p, int m, int n, int t, int stash, dl_sched **out)
{
    if (n < 1 || t < 0 || t >= n)
        return dl_error(DL_EINVAL, "async step: step %d of a window of %d steps", t, n);
    if (m > 0 && n > (1 << 30) / m)
        return dl_error(DL_EINVAL,
                        "async step: a window of %d steps of %d micro-batches is too "
                        "long",
                        n, m);
    dl__gen g;
    int st = dl__gen_start(&g, DL_SCHED_ASYNC, p, m > 0 ? n * m : m, 1, out);
    if (st != DL_OK)
        return st;
    g.s->flush = 0;
    g.s->stash = stash ? 1 : 0;
    for (int s = 0; s < p; s++) emit_slice(&g, s, p, m, n, t);
    return dl__gen_finish(&g, out);
}

/* Stage q's steps in the simulated window: each one's busy time and span (from the end of the
 * stage's previous step, or 0, to the end of its last OPT), busy[0 .. n-1] and span[0 .. n-1]. */
static void stage_spans(const dl_sched *s, const dl_sched_sim *sim, int m, int q, double *busy,
                        double *span)
{
    double from = 0, b = 0;
    int t = 0;
    for (int i = 0; i < s->len[q]; i++) {
        const dl_sched_action *a = &s->act[q][i];
        b += sim->end[q][i] - sim->start[q][i];
        if (a->op == DL_SCHED_OPT && a->mb == (t + 1) * m - 1) {
            busy[t] = b, span[t] = sim->end[q][i] - from;
            from = sim->end[q][i], b = 0;
            t++;
        }
    }
}

/* Each step's total bubble, 1 - sum busy / (p x the longest span), as the trainer measures it,
 * into x[0 .. n-1]; x[n .. 4n-1] is scratch. */
static void step_bubbles(const dl_sched *s, const dl_sched_sim *sim, int m, int n, double *x)
{
    double *busy = x + n, *span = x + 2 * n, *longest = x + 3 * n;
    for (int t = 0; t < n; t++) x[t] = longest[t] = 0;
    for (int q = 0; q < s->p; q++) {
        stage_spans(s, sim, m, q, busy, span);
        for (int t = 0; t < n; t++) {
            x[t] += busy[t];
            longest[t] = span[t] > longest[t] ? span[t] : longest[t];
        }
    }
    for (int t = 0; t < n; t++) x[t] = longest[t] > 0 ? 1.0 - x[t] / (s->p * longest[t]) : NAN;
}

/* Stage q's steps: 1 - busy / span each, into x[0 .. n-1]; x[n .. 4n-1] is scratch. */
static void stage_steps(const dl_sched *s, const dl_sched_sim *sim, int m, int n, int q, double *x)
{
    stage_spans(s, sim, m, q, x + n, x + 2 * n);
    for (int t = 0; t < n; t++) x[t] = x[2 * n + t] > 0 ? 1.0 - x[n + t] / x[2 * n + t] : NAN;
}

/* The window of n steps simulated: its schedule and simulation, and 4n doubles (a step figure
 * each, and the scratch step_bubbles and stage_steps use). */
static int window(int p, int m, int n, const dl_sched_costs *c, const double *const *dur,
                  dl_sched **s, dl_sched_sim **sim, double **x)
{
    if (n < 1)
        return dl_error(DL_EINVAL, "continuous pipeline: need at least 1 step (got %d)", n);
    if (m > 0 && n > (1 << 20) / m)
        return dl_error(DL_EINVAL,
                        "continuous pipeline: %d steps of %d micro-batches is too "
                        "long to simulate",
                        n, m);
    int st = dl_sched_async(p, m > 0 ? n * m : m, 0, s);
    if (st == DL_OK)
        st = dur ? dl_sched_simulate_times(*s, dur, sim) : dl_sched_simulate(*s, c, sim);
    if (st == DL_OK && !(*x = malloc(sizeof **x * 4 * (size_t)n)))
        st = dl_error(DL_ENOMEM, "continuous pipeline: out of memory");
    return st;
}

/* The window's whole-run and steady-state figures, at costs c or replaying the times dur. */
static int figures(int p, int m, int n, const dl_sched_costs *c, const double *const *dur,
                   double *run, double *steady)
{
    dl_sched *s = NULL;
    dl_sched_sim *sim = NULL;
    double *x = NULL;
    int st = window(p, m, n, c, dur, &s, &sim, &x);
    if (st == DL_OK) {
        if (run)
            *run = sim->bubble_total;
        step_bubbles(s, sim, m, n, x);
        /* the steady state: the steps after the first (the warm-up), as the trainer's median */
        *steady = dl__median(x + (n > 1), (size_t)(n - (n > 1)));
    }
    free(x);
    dl_sched_sim_free(sim);
    dl_sched_free(s);
    return st;
}

int dl_sched_async_continuous(int p, int m, int n, const dl_sched_costs *c, double *run,
                              double *steady)
{
    return figures(p, m, n, c, NULL, run, steady);
}

int dl_sched_async_continuous_replay(int p, int m, int n, const double *const *dur, double *steady)
{
    if (!dur)
        return dl_error(DL_EINVAL, "continuous pipeline: no action times to replay");
    return figures(p, m, n, NULL, dur, NULL, steady);
}

int dl_sched_async_continuous_stages(int p, int m, int n, const dl_sched_costs *c, double *stage)
{
    dl_sched *s = NULL;
    dl_sched_sim *sim = NULL;
    double *x = NULL;
    int st = window(p, m, n, c, NULL, &s, &sim, &x);
    for (int q = 0; st == DL_OK && q < p; q++) {
        stage_steps(s, sim, m, n, q, x);
        stage[q] = dl__median(x + (n > 1), (size_t)(n - (n > 1)));
    }
    free(x);
    dl_sched_sim_free(sim);
    dl_sched_free(s);
    return st;
}
