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

/* Per step t and stage s of the simulated window: the step's span (from the end of the stage's
 * previous step, or 0, to the end of its last OPT) and busy time; the step's total bubble is
 * 1 - sum busy / (p x the longest span), as the trainer measures it. */
static void step_bubbles(const dl_sched *s, const dl_sched_sim *sim, int m, int n, double *x)
{
    int p = s->p;
    for (int t = 0; t < n; t++) x[t] = 0;
    double *wall = calloc((size_t)n, sizeof *wall);
    if (!wall) {
        for (int t = 0; t < n; t++) x[t] = NAN;
        return;
    }
    for (int q = 0; q < p; q++) {
        double from = 0;
        int t = 0;
        for (int i = 0; i < s->len[q]; i++) {
            const dl_sched_action *a = &s->act[q][i];
            x[t] += sim->end[q][i] - sim->start[q][i]; /* busy, summed over the stages */
            if (a->op == DL_SCHED_OPT && a->mb == (t + 1) * m - 1) {
                if (sim->end[q][i] - from > wall[t])
                    wall[t] = sim->end[q][i] - from;
                from = sim->end[q][i];
                t++;
            }
        }
    }
    for (int t = 0; t < n; t++) x[t] = wall[t] > 0 ? 1.0 - x[t] / (p * wall[t]) : NAN;
    free(wall);
}

/* Stage q's steps in the simulated window: 1 - busy / span each (x[0 .. n-1]). */
static void stage_steps(const dl_sched *s, const dl_sched_sim *sim, int m, int q, double *x)
{
    double from = 0, busy = 0;
    int t = 0;
    for (int i = 0; i < s->len[q]; i++) {
        const dl_sched_action *a = &s->act[q][i];
        busy += sim->end[q][i] - sim->start[q][i];
        if (a->op == DL_SCHED_OPT && a->mb == (t + 1) * m - 1) {
            double span = sim->end[q][i] - from;
            x[t++] = span > 0 ? 1.0 - busy / span : NAN;
            from = sim->end[q][i];
            busy = 0;
        }
    }
}

/* The window of n steps simulated: its schedule and simulation, and n doubles of scratch. */
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
    if (st == DL_OK && !(*x = malloc(sizeof **x * (size_t)n)))
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
        stage_steps(s, sim, m, q, x);
        stage[q] = dl__median(x + (n > 1), (size_t)(n - (n > 1)));
    }
    free(x);
    dl_sched_sim_free(sim);
    dl_sched_free(s);
    return st;
}
