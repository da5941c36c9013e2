/* The run's tables (train/run.h). */
#include <stdlib.h>
#include <string.h>
#include "train/run.h"
#include "train/state.h"
#include "distlab/mpi.h"

int tr_run_open(tr_run *R, const dl_train_opts *o, dl_train_result *res, int n)
{
    dl_data_opts dopt;
    dl_data_opts_init(&dopt);
    dopt.path = o->data.path;
    dopt.seq = o->model.seq;
    dopt.seed = o->data.seed;
    dopt.max_bytes = o->data.max_bytes;
    memset(R, 0, sizeof *R);
    R->o = o, R->res = res, R->nranks = n;
    int rc = dl_data_open(&dopt, &R->data);
    if (rc)
        return rc;
    int steps = o->eval.only ? 0 : o->optim.steps;
    res->nranks = n;
    res->data.floor = dl_data_floor(R->data);
    res->nparams = dl_gpt_num_params(&o->model);
    res->memory.peak = calloc((size_t)n * DL_MEM_NCATEGORIES, sizeof *res->memory.peak);
    R->step_ms = calloc((size_t)(steps + 1) * (size_t)n, sizeof(double));
    R->loss = calloc((size_t)steps + 1, sizeof(double));
    R->val = calloc((size_t)steps + 1, sizeof(double));
    R->norm = calloc((size_t)steps + 1, sizeof(double));
    R->lr = calloc((size_t)steps + 1, sizeof(double));
    R->skip = calloc((size_t)steps + 1, sizeof(int));
    R->finished = calloc((size_t)steps + 1, sizeof *R->finished);
    R->local_ranks = n / (dl_mpi_size() > 1 ? dl_mpi_size() : 1);
    if (o->output.want_params)
        res->output.params = calloc((size_t)res->nparams, sizeof(double));
    if (o->output.want_grads)
        res->output.grads = calloc((size_t)res->nparams, sizeof(double));
    if ((rc = tr_pipe_figures_open(&R->pp, o, steps, n, &res->pipeline)))
        return rc;
    int traced = o->trace.last ? o->trace.last - o->trace.first + 1 : steps;
    if (o->trace.into)
        R->trace = o->trace.into;
    else if ((o->trace.path || o->trace.timeline) &&
             (rc = dl_trace_create(n,
                                   (size_t)(traced + 1) * ((size_t)o->batch.microbatches *
                                                               o->pipeline.virtual_stages * 6 +
                                                           16),
                                   &R->trace)))
        return rc;
    if (!res->memory.peak || !R->step_ms || !R->loss || !R->val || !R->norm || !R->lr || !R->skip ||
        !R->finished || (o->output.want_params && !res->output.params) ||
        (o->output.want_grads && !res->output.grads)) {
        return dl_error(DL_ENOMEM, "training: out of memory");
    }
    return DL_OK;
}

void tr_run_close(tr_run *R)
{
    tr_ckpt_close(R);
    if (R->trace != R->o->trace.into)
        dl_trace_destroy(R->trace);
    tr_pipe_rows_close(&R->pp);
    free(R->step_ms), free(R->loss), free(R->val), free(R->norm), free(R->lr), free(R->skip);
    free(R->finished);
    dl_data_free(R->data);
}
