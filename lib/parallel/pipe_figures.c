/* The pipeline's figures (parallel/pipe_train.h): its per-step rows, and what the summary makes
 * of them; the schedule's own theoretical bubble and its slots come from its simulation. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "parallel/pipe_train.h"
#include "core/stats.h"
#include "distlab/tera.h"

/* Token slices (--token-chunks c): each unit's cost factor from its FLOPs, a later slice's
 * attention reading every earlier key (include/distlab/tera.h); *scale NULL without slices. */
static int tera_scale(const dl_train_opts *o, double **scale)
{
    int c = o->pipeline.token_chunks, m = o->batch.microbatches;
    *scale = NULL;
    if (c <= 1)
        return DL_OK;
    int *lens = malloc(sizeof(int) * (size_t)c);
    *scale = malloc(sizeof(double) * (size_t)m * c);
    if (!lens || !*scale) {
        free(lens);
        return dl_error(DL_ENOMEM, "pipeline: out of memory");
    }
    for (int k = 0; k < c; k++)
        lens[k] = o->pipeline.token_lens ? o->pipeline.token_lens[k] : o->model.seq / c;
    int rc = dl_tera_chunk_scale(m, c, lens, o->model.d_model, *scale);
    free(lens);
    return rc;
}

/* The schedule simulated with the lecture's costs (a forward 1, a backward 2): its bubble is the
 * schedule's own (GPipe and 1F1B: (p-1)/(m+p-1); interleaving and async their own; token
 * slices at their FLOPs' costs), its peak activations per stage the slots. NULL when it cannot
 * be built (out of memory). */
static dl_sched_sim *simulate(const dl_train_opts *o, double *paper)
{
    dl_sched *sc = NULL;
    dl_sched_sim *sim = NULL;
    double *scale = NULL;
    if (tr_pipe_make_sched(o, &sc) != DL_OK || tera_scale(o, &scale) != DL_OK ||
        dl_sched_simulate_scaled(sc, NULL, scale, &sim) != DL_OK)
        sim = NULL;
    free(scale);
    /* the same costs as the paper's F = B = W (a backward, I + W, twice a forward) */
    *paper = sc ? dl_sched_bubble_theory(sc, 1, 1, 1) : -1;
    if (*paper < 0)
        *paper = NAN;
    dl_sched_free(sc);
    return sim;
}

/* async: the continuous pipeline simulated over the first window (at most 1024 steps: its steady
 * state is there long before), and 1F1B's flushed step for the same p and m. */
static int async_figures(const dl_train_opts *o, dl_train_pipeline_result *r)
{
    int p = o->layout.pp, m = o->batch.microbatches, n = tr_async_window_end(o, 1);
    r->window = n;
    dl_sched *one = NULL;
    dl_sched_sim *sim = NULL;
    int rc = dl_sched_async_continuous(p, m, n < 1024 ? n : 1024, NULL, &r->bubble_window,
                                       &r->bubble_theory);
    if (rc == DL_OK && (rc = dl_sched_1f1b(p, m, &one)) == DL_OK &&
        (rc = dl_sched_simulate(one, NULL, &sim)) == DL_OK)
        r->bubble_1f1b = sim->bubble_total;
    dl_sched_sim_free(sim);
    dl_sched_free(one);
    return rc;
}

int tr_pipe_figures_open(tr_pp_rows *t, const dl_train_opts *o, int steps, int n,
                         dl_train_pipeline_result *r)
{
    int p = o->layout.pp, v = o->pipeline.virtual_stages;
    size_t sn = (size_t)(steps + 1) * (size_t)n;
    memset(t, 0, sizeof *t);
    t->nranks = n;
    t->busy = calloc(sn, sizeof(double));
    t->wall = calloc(sn, sizeof(double));
    t->engine = calloc(sn, sizeof(double));
    t->gap = calloc(sn, sizeof(int));
    r->stages = p;
    r->v = v;
    r->bounds = calloc((size_t)p * v + 1, sizeof(int));
    r->bubble = calloc((size_t)p, sizeof(double));
    r->slots = calloc((size_t)p, sizeof(int));
    r->max_gap = calloc((size_t)p, sizeof(int));
    if (!t->busy || !t->wall || !t->engine || !t->gap || !r->bounds || !r->bubble || !r->slots ||
        !r->max_gap)
        return dl_error(DL_ENOMEM, "training: out of memory");
    r->bubble_paper = NAN;
    if (p > 1) {
        dl_sched_sim *sim = simulate(o, &r->bubble_paper);
        if (!sim)
            return dl_error(DL_ENOMEM, "pipeline: simulating the schedule: %s", dl_errmsg());
        r->bubble_theory = sim->bubble_total;
        dl_sched_sim_free(sim);
    }
    r->bubble_window = r->bubble_1f1b = NAN;
    if (p > 1 && o->pipeline.schedule == DL_SCHED_ASYNC && !o->pipeline.schedule_file)
        return async_figures(o, r);
    return DL_OK;
}

void tr_pipe_rows_close(tr_pp_rows *t)
{
    free(t->busy), free(t->wall), free(t->engine), free(t->gap);
    memset(t, 0, sizeof *t);
}

void tr_pipe_result_free(dl_train_pipeline_result *r)
{
    free(r->bounds), free(r->bubble), free(r->slots), free(r->max_gap);
    memset(r, 0, sizeof *r);
}

void tr_pipe_row_get(const tr_pp_rows *t, int i, int rank, double *v)
{
    size_t at = (size_t)i * t->nranks + rank;
    v[0] = t->busy[at], v[1] = t->wall[at], v[2] = t->engine[at], v[3] = t->gap[at];
}

void tr_pipe_row_set(tr_pp_rows *t, int i, int rank, const double *v)
{
    size_t at = (size_t)i * t->nranks + rank;
    t->busy[at] = v[0], t->wall[at] = v[1], t->engine[at] = v[2], t->gap[at] = (int)v[3];
}

/* Per stage (its first rank: world rank stage x dp x tp): the measured bubble, median over the
 * steps after the first (x: k of them, from step skip), and the largest version gap. */
static void per_stage(const tr_pp_rows *t, int p, int per, int S, int skip, double *x,
                      dl_train_pipeline_result *r)
{
    int n = t->nranks, k = S - skip;
    for (int st = 0; st < p; st++) {
        int rk = st * per;
        for (int i = 0; i < k; i++) {
            size_t at = (size_t)(i + skip) * n + rk;
            x[i] = t->wall[at] > 0 ? 1.0 - t->busy[at] / t->wall[at] : NAN;
        }
        r->bubble[st] = dl__median(x, (size_t)k);
        int gap = 0;
        for (int i = 0; i < S; i++)
            if (t->gap[(size_t)i * n + rk] > gap)
                gap = t->gap[(size_t)i * n + rk];
        r->max_gap[st] = gap;
    }
}

void tr_pipe_summarise(const tr_pp_rows *t, const dl_train_opts *o, int S,
                       dl_train_pipeline_result *r)
{
    int n = t->nranks, p = o->layout.pp, per = o->layout.dp * o->layout.tp;
    int skip = S > 1 ? 1 : 0, k = S - skip;
    /* per step: a stage's figure, or every rank's engine overhead (n >= p) */
    double *x = malloc(sizeof(double) * (size_t)(k > 0 ? k : 1) * (size_t)n);
    if (!x)
        return;
    per_stage(t, p, per, S, skip, x, r);
    for (int i = 0; i < k; i++) {
        double busy = 0, wall = 0;
        for (int st = 0; st < p; st++) {
            size_t at = (size_t)(i + skip) * n + (size_t)st * per;
            busy += t->busy[at];
            if (t->wall[at] > wall)
                wall = t->wall[at];
        }
        x[i] = wall > 0 ? 1.0 - busy / (p * wall) : NAN;
    }
    r->bubble_total = dl__median(x, (size_t)k);
    for (int i = 0; i < k; i++)
        for (int rk = 0; rk < n; rk++)
            x[(size_t)i * n + rk] = t->engine[(size_t)(i + skip) * n + rk] / 1e3;
    r->engine_us = dl__median(x, (size_t)(k * n)); /* sorted x: the 90th percentile is an index */
    r->engine_p90_us = k * n > 0 ? x[(size_t)((k * n - 1) * 0.9 + 0.5)] : NAN;
    r->bytes_per_step = (double)t->bytes / S;
    free(x);
    double paper;
    dl_sched_sim *sim = simulate(o, &paper);
    int cont = o->pipeline.schedule == DL_SCHED_ASYNC && !o->pipeline.schedule_file;
    for (int st = 0; sim && st < p; st++) /* continuous: p - s in flight whatever m */
        r->slots[st] = cont && sim->peak_act[st] < p - st ? p - st : sim->peak_act[st];
    dl_sched_sim_free(sim);
}
