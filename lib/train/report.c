/* The trainer's reporting (train/report.h): per-step records, the progress line, the callers'
 * on_step records, the run's summary (medians; the pipeline module makes its own figures), the
 * trace and timeline, and, under MPI, the ranks' figures shared across processes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "train/report.h"
#include "train/run.h"
#include "parallel/pipe_train.h"
#include "core/stats.h"
#include "distlab/mpi.h"

/* Under MPI the world spans processes and each process has its own copy of the run's tables,
 * filled by its own ranks: every rank shares its peaks and per-step figures (its step time and
 * the pipeline module's row) with all (an all-gather over the world), and each process's first
 * rank fills the other processes' rows, so that every process's summary covers every rank. */
int tr_share_rank_stats(tr_run *R, int rank, dl_comm *world, const uint64_t *peak)
{
    int n = R->nranks, S = R->o->eval.only ? 0 : R->o->optim.steps;
    int P = dl_mpi_size();
    size_t row = 1 + TR_PP_ROW, per = DL_MEM_NCATEGORIES + row * (size_t)S;
    double *all = calloc(per * (size_t)n, sizeof(double)), *mine;
    if (!all)
        return dl_error(DL_ENOMEM, "training: out of memory sharing the ranks' figures");
    mine = all + per * (size_t)rank;
    for (int c = 0; c < DL_MEM_NCATEGORIES; c++) mine[c] = (double)peak[c];
    for (int i = 0; i < S; i++) {
        double *v = mine + DL_MEM_NCATEGORIES + row * (size_t)i;
        v[0] = R->step_ms[(size_t)i * n + rank];
        tr_pipe_row_get(&R->pp, i, rank, v + 1);
    }
    int rc = dl_allgather(world, mine, all, per * (size_t)n, DL_F64, DL_PURPOSE_OTHER);
    int local = n / P, first = dl_mpi_rank() * local;
    if (rc == DL_OK && rank == first)
        for (int r = 0; r < n; r++) {
            if (r >= first && r < first + local)
                continue; /* this process's own ranks wrote theirs */
            const double *v = all + per * (size_t)r;
            for (int c = 0; c < DL_MEM_NCATEGORIES; c++)
                R->res->memory.peak[(size_t)r * DL_MEM_NCATEGORIES + c] = (uint64_t)v[c];
            for (int i = 0; i < S; i++) {
                const double *w = v + DL_MEM_NCATEGORIES + row * (size_t)i;
                R->step_ms[(size_t)i * n + r] = w[0];
                tr_pipe_row_set(&R->pp, i, r, w + 1);
            }
        }
    free(all);
    return rc;
}

/* Step i's record (0-based) from the run's tables: ms is the slowest rank's. */
void tr_fill_step(const tr_run *R, int i, dl_train_step *st)
{
    const dl_train_opts *o = R->o;
    double mx = 0;
    for (int r = 0; r < R->nranks; r++) mx = fmax(mx, R->step_ms[(size_t)i * R->nranks + r]);
    st->step = i + 1;
    st->loss = R->loss[i];
    st->val_loss = R->val[i];
    st->lr = R->lr[i];
    st->grad_norm = R->norm[i];
    st->skipped = R->skip[i];
    st->ms = mx;
    st->tokens_per_s = (double)o->batch.global * o->model.seq / (mx / 1e3);
    const dl_train_moe_result *m = &R->res->moe;
    st->aux_loss = st->z_loss = NAN;
    if (m->layers) {
        size_t le = (size_t)m->layers * m->experts;
        st->aux_loss = m->aux[i], st->z_loss = m->z[i];
        st->moe_layers = m->layers, st->experts = m->experts, st->nranks = R->nranks;
        st->routed = m->routed + (size_t)i * le, st->dropped = m->dropped + (size_t)i * le;
        st->a2a_bytes = m->a2a_bytes + (size_t)i * R->nranks;
        st->combine_wait_ms = m->combine_wait_ms + (size_t)i * R->nranks;
    }
}

/* Hand the completed steps not yet handed to o->output.on_step: while training (all = 0) those every
 * rank of this process has finished (the acquire pairs with each rank's release after its
 * step time), after the run (all = 1) every step rank 0 recorded. */
int tr_emit_steps(tr_run *R, int all)
{
    const dl_train_opts *o = R->o;
    if (!o->output.on_step)
        return DL_OK;
    while (R->emitted < R->steps_done &&
           (all || atomic_load_explicit(&R->finished[R->emitted], memory_order_acquire) ==
                       R->local_ranks)) {
        dl_train_step st = {0};
        tr_fill_step(R, R->emitted, &st);
        R->emitted++;
        int rc = o->output.on_step(&st, o->output.on_step_arg);
        if (rc != DL_OK)
            return rc;
    }
    return DL_OK;
}

static char *trace_timeline(const dl_trace *t, int step, int nranks);

/* Once, on rank 0 (or after the run): the trace file and the timeline of step `step`. */
void tr_finish_trace(tr_run *R, int step)
{
    const dl_train_opts *o = R->o;
    if (!R->trace || R->trace_done)
        return;
    R->trace_done = 1;
    if (o->trace.path)
        R->trace_rc = dl_trace_write_chrome(R->trace, o->trace.path, NULL);
    if (o->trace.timeline)
        R->res->output.timeline = trace_timeline(R->trace, step, R->nranks);
}

/* Rank 0's progress line: loss, tokens/s and ms/step over the steps since the last line (one
 * step alone is noisy: 2,285 tok/s printed against 4,831 in a summary), and the bytes this rank
 * sent per step so far, its pipeline hand-offs included (they go through the engine's own
 * communicators, not the world, dp or tp ones: 0.00 MB was printed for a pipeline), in MiB.
 * Validation runs every --eval-every steps: between evaluations the line shows the latest one and
 * its step ("@ 20"), before the first one "none yet". */
static void log_progress(tr_env *e, int step, int last, double loss, double val)
{
    const tr_run *R = e->R;
    const dl_train_opts *o = R->o;
    dl_comm *c[3] = {dl_ctx_comm(e->ctx), e->mesh->dp_comm, e->mesh->tp_comm};
    uint64_t sent = R->pp.bytes;
    for (int i = 0; i < 3; i++) {
        dl_comm_stats st;
        dl_comm_get_stats(c[i], &st);
        for (int p = 0; p < DL_NPURPOSES; p++) sent += st.bytes_sent[p];
    }
    double ms = 0;
    for (int k = last; k < step; k++) ms += R->step_ms[(size_t)k * R->nranks];
    int n = step - last;
    char vbuf[32] = "   none yet  ";
    int at = step;
    while (isnan(val) && at > 1) /* the latest evaluation before this step */
        val = R->val[--at - 1];
    if (!isnan(val))
        snprintf(vbuf, sizeof vbuf, "%6.4f @%5d", val, at);
    fprintf(o->output.log,
            "step %5d/%d | loss %6.4f | val %s | %8.0f tok/s | %7.1f ms/step | "
            "%7.3f MiB sent/rank/step\n",
            step, o->optim.steps, loss, vbuf,
            (double)o->batch.global * o->model.seq * n / (ms / 1e3), ms / n,
            (double)sent / 1048576.0 / (step - R->start));
    fflush(o->output.log);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The grid's widest: past it the per-stage list carries what the cells merge. */
#define TIMELINE_MAX_CELLS 200
#define DL_STR_(x) #x
#define DL_STR(x) DL_STR_(x)

/* The step's measured grid with its legend: one cell per the step's shortest forward or
 * backward (so that every action can fill a cell), but at most TIMELINE_MAX_CELLS cells; when
 * some action still shows in no cell, every stage's actions in start order follow. */
static char *trace_timeline(const dl_trace *t, int step, int nranks)
{
    uint64_t unit = UINT64_MAX, w0 = UINT64_MAX, w1 = 0;
    for (int r = 0; r < nranks; r++) {
        size_t cnt = dl_trace_count(t, r);
        const dl_trace_event *ev = dl_trace_events(t, r);
        for (size_t i = 0; i < cnt; i++) {
            const dl_trace_event *e = &ev[i];
            if (e->step != step)
                continue;
            if (e->kind == DL_TR_STEP) {
                w0 = e->t0 < w0 ? e->t0 : w0;
                w1 = e->t1 > w1 ? e->t1 : w1;
            }
            if ((e->kind == DL_TR_FWD || e->kind == DL_TR_BWD || e->kind == DL_TR_WGT) &&
                e->t1 > e->t0 && e->t1 - e->t0 < unit)
                unit = e->t1 - e->t0;
        }
    }
    if (unit == UINT64_MAX || w1 <= w0)
        return NULL;
    uint64_t floor_unit = (w1 - w0 + TIMELINE_MAX_CELLS - 1) / TIMELINE_MAX_CELLS;
    unit = unit > floor_unit ? unit : floor_unit;
    char *grid = NULL, *list = NULL;
    int hidden = 0;
    if (dl_trace_grid_hidden(t, step, unit, &grid, &hidden) != DL_OK)
        return NULL;
    if (hidden && dl_trace_actions(t, step, &list) != DL_OK)
        list = NULL;
    const char *legend =
        "legend: a digit is a forward of that micro-batch (0-9, then A-Z), a letter its backward "
        "(a = micro-batch 0; split: its input gradient B, and a capital its weight gradient W), * "
        "an optimizer step, = a collective, \xC2\xB7 idle (waiting: the "
        "bubble); a cell shows the one action covering most of it (ties: forward, then backward, "
        "then the earlier one)\n";
    size_t n = strlen(grid) + strlen(legend) + (list ? strlen(list) : 0) + 400;
    char *out = malloc(n);
    if (out) {
        int k = snprintf(out, n, "one cell = %.1f us (%s); %s\n%s%s", (double)unit / 1e3,
                         unit > floor_unit ? "the shortest forward or backward"
                                           : "the step over " DL_STR(TIMELINE_MAX_CELLS) " cells",
                         hidden ? "some actions are shorter than a cell next to longer ones"
                                : "every forward and backward of every stage fills a cell",
                         grid, legend);
        if (list && k > 0 && (size_t)k < n)
            snprintf(out + k, n - (size_t)k,
                     "%d action(s) hidden by merged cells; every stage's "
                     "actions in start order:\n%s",
                     hidden, list);
    }
    free(grid);
    free(list);
    return out;
}


void tr_record_step(tr_env *e, const tr_step_rec *r, int *last_logged, int *rc)
{
    tr_run *R = e->R;
    const dl_train_opts *o = e->o;
    int step = e->step;
    R->loss[step - 1] = r->loss;
    R->val[step - 1] = r->val;
    R->norm[step - 1] = r->norm;
    R->lr[step - 1] = r->lr;
    R->skip[step - 1] = r->skip;
    R->steps_done = step;
    if (dl_mpi_size() <= 1 && (*rc = tr_emit_steps(R, 0)))
        return;
    R->res->eval.windows = r->used ? r->used : R->res->eval.windows;
    if (o->output.log && o->output.log_every > 0 &&
        (step % o->output.log_every == 0 || step == 1 || step == o->optim.steps)) {
        log_progress(e, step, *last_logged, r->loss, r->val);
        *last_logged = step;
    }
    /* every rank is past the window now (each synchronised with rank 0, directly or through a
     * peer, in this step's collectives, after its last traced event) */
    if (o->trace.last && step == o->trace.last + 1)
        tr_finish_trace(R, o->trace.last);
}

void tr_report_traffic(tr_env *e, const tr_eval_bytes *eb, int skipped)
{
    dl_train_result *res = e->R->res;
    dl_comm_stats a, b, w;
    dl_comm_get_stats(e->mesh->dp_comm, &a);
    dl_comm_get_stats(e->mesh->tp_comm, &b);
    dl_comm_get_stats(dl_ctx_comm(e->ctx), &w);
    double n = e->R->steps_done > e->R->start ? e->R->steps_done - e->R->start : 1; /* run here */
    int ds = e->pr.dsize;
    res->comm.dp_grads = (double)a.bytes_sent[DL_PURPOSE_GRADS] / n;
    res->comm.dp_params = (double)(a.bytes_sent[DL_PURPOSE_PARAMS] - eb->param) / n;
    res->comm.dp_elems = (res->comm.dp_grads + res->comm.dp_params) / ds;
    size_t gathered = 0;
    res->memory.unit_bytes = dl_gpt_unit_bytes(e->g, &gathered);
    res->memory.gathered_bytes = gathered;
    res->optim.skipped_steps = skipped;
    res->comm.tp_activations = (double)(b.bytes_sent[DL_PURPOSE_ACTIVATIONS] - eb->tp) / n;
    res->comm.loss_and_norm =
        (double)(a.bytes_sent[DL_PURPOSE_LOSS] + b.bytes_sent[DL_PURPOSE_LOSS] +
                 w.bytes_sent[DL_PURPOSE_LOSS] - eb->loss) /
        n;
    res->memory.grad_bytes = (uint64_t)e->numel * (uint64_t)ds;
}

void tr_summarise(tr_run *R, dl_train_result *res)
{
    const dl_train_opts *o = R->o;
    int S = R->steps_done, n = R->nranks;
    res->nsteps = S;
    res->steps = calloc((size_t)S + 1, sizeof *res->steps);
    double *med = calloc((size_t)S + 1, sizeof(double));
    for (int i = 0; res->steps && med && i < S; i++) {
        tr_fill_step(R, i, &res->steps[i]);
        med[i] = res->steps[i].ms;
    }
    if (S > 0 && med) {
        res->optim.final_loss = R->loss[S - 1];
        if (!isnan(R->val[S - 1]))
            res->eval.final_val_loss = R->val[S - 1];
        /* the first step pays for page faults and thread start: leave it out when there are more
         * (a resumed run's first is the one after the checkpoint's) */
        int skip = R->start + (S - R->start > 1 ? 1 : 0);
        qsort(med + skip, (size_t)(S - skip), sizeof(double), cmp_double);
        res->speed.ms_per_step = med[skip + (S - skip) / 2];
        res->speed.tokens_per_s =
            (double)o->batch.global * o->model.seq / (res->speed.ms_per_step / 1e3);
        res->speed.model_gflops_per_rank = dl_train_step_flops(&o->model, o->batch.global) /
                                           (res->speed.ms_per_step / 1e3) / n / 1e9;
    }
    free(med);
    if (o->layout.pp > 1 && S > 0)
        tr_pipe_summarise(&R->pp, o, S, &res->pipeline);
}
