/* The run's tables (train/run.h). */
#include <stdlib.h>
#include <string.h>
#include "train/run.h"
#include "distlab/mpi.h"

int tr_run_open(tr_run *R, const dl_train_opts *o, dl_train_result *res, int n)
{
    dl_data_opts dopt;
    dl_data_opts_init(&dopt);
    dopt.path = o->data_path;
    dopt.seq = o->model.seq;
    dopt.seed = o->data_seed;
    dopt.max_bytes = o->data_max;
    memset(R, 0, sizeof *R);
    R->o = o, R->res = res, R->nranks = n;
    int rc = dl_data_open(&dopt, &R->data);
    if (rc)
        return rc;
    int steps = o->eval_only ? 0 : o->steps;
    res->nranks = n;
    res->floor = dl_data_floor(R->data);
    res->nparams = dl_gpt_num_params(&o->model);
    res->peak = calloc((size_t)n * DL_MEM_NCATEGORIES, sizeof *res->peak);
    R->step_ms = calloc((size_t)(steps + 1) * (size_t)n, sizeof(double));
    R->loss = calloc((size_t)steps + 1, sizeof(double));
    R->val = calloc((size_t)steps + 1, sizeof(double));
    R->norm = calloc((size_t)steps + 1, sizeof(double));
    R->lr = calloc((size_t)steps + 1, sizeof(double));
    R->skip = calloc((size_t)steps + 1, sizeof(int));
    R->finished = calloc((size_t)steps + 1, sizeof *R->finished);
    R->local_ranks = n / (dl_mpi_size() > 1 ? dl_mpi_size() : 1);
    if (o->want_params)
        res->params = calloc((size_t)res->nparams, sizeof(double));
    if (o->want_grads)
        res->grads = calloc((size_t)res->nparams, sizeof(double));
    res->pp = o->pp;
    res->pp_v = o->virtual_stages;
    res->pp_bubble_theory =
        (double)(o->pp - 1) / ((double)o->virtual_stages * o->microbatches + o->pp - 1);
    size_t sn = (size_t)(steps + 1) * (size_t)n;
    R->pp_busy = calloc(sn, sizeof(double));
    R->pp_wall = calloc(sn, sizeof(double));
    R->pp_engine = calloc(sn, sizeof(double));
    R->pp_gap = calloc(sn, sizeof(int));
    res->pp_bounds = calloc((size_t)o->pp * o->virtual_stages + 1, sizeof(int));
    res->pp_bubble = calloc((size_t)o->pp, sizeof(double));
    res->pp_slots = calloc((size_t)o->pp, sizeof(int));
    res->pp_max_gap = calloc((size_t)o->pp, sizeof(int));
    int traced = o->trace_last ? o->trace_last - o->trace_first + 1 : steps;
    if (o->trace)
        R->trace = o->trace;
    else if ((o->trace_path || o->timeline) &&
             (rc = dl_trace_create(n,
                                   (size_t)(traced + 1) *
                                       ((size_t)o->microbatches * o->virtual_stages * 6 + 16),
                                   &R->trace)))
        return rc;
    if (!res->peak || !R->step_ms || !R->loss || !R->val || !R->norm || !R->lr || !R->skip ||
        !R->finished || !R->pp_busy || !R->pp_wall || !R->pp_engine || !R->pp_gap ||
        !res->pp_bounds || !res->pp_bubble || !res->pp_slots || !res->pp_max_gap ||
        (o->want_params && !res->params) || (o->want_grads && !res->grads)) {
        return dl_error(DL_ENOMEM, "training: out of memory");
    }
    return DL_OK;
}

void tr_run_close(tr_run *R)
{
    if (R->trace != R->o->trace)
        dl_trace_destroy(R->trace);
    free(R->pp_busy), free(R->pp_wall), free(R->pp_engine), free(R->pp_gap);
    free(R->step_ms), free(R->loss), free(R->val), free(R->norm), free(R->lr), free(R->skip);
    free(R->finished);
    dl_data_free(R->data);
}
