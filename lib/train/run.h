/* The run's tables, shared between dl_train_run and the rank threads (each rank writes its own
 * rows; rank 0 the per-step records). */
#ifndef DISTLAB_TRAIN_RUN_H
#define DISTLAB_TRAIN_RUN_H
#include <stdatomic.h>
#include <stdint.h>
#include "distlab.h"
#include "distlab/train.h"
#include "distlab/data.h"
#include "model/ops.h"
#include "parallel/pipe_train.h"

struct tr_run {
    const dl_train_opts *o;
    dl_train_result *res;
    dl_data *data;
    int nranks;
    double *step_ms; /* [steps * nranks] */
    double *loss;    /* [steps] */
    double *val;     /* [steps] */
    double *norm;    /* [steps] */
    double *lr;      /* [steps] */
    int *skip;       /* [steps] skipped: non-finite gradient */
    int steps_done;
    atomic_int *finished;     /* [steps] ranks of this process that finished the step */
    int local_ranks;          /* ranks of this process */
    int emitted;              /* steps handed to o->output.on_step */
    dl_gemm_log *gemm;        /* rank 0's GEMMs of one step (the second: the first warms up) */
    dl_trace *trace;          /* NULL unless a trace or timeline was asked for */
    tr_pp_rows pp;            /* the pipeline's per-step rows (parallel/pipe_train.h) */
    int trace_done, trace_rc; /* the trace file and timeline written (rank 0), its status */
    /* --resume (train/state.c): the checkpoint's manifest (NULL: a fresh run), its directory,
     * the steps it had done (this run starts after them) and how many of them were skipped */
    struct json_t *resume;
    char resume_dir[4096];
    int start, skipped0;
};
typedef struct tr_run tr_run;

/* The corpus and the tables for o (resolved) on n ranks, the result's arrays (zeroed), the
 * trace when one is asked for. tr_run_close frees what it made, also after an error. */
int tr_run_open(tr_run *R, const dl_train_opts *o, dl_train_result *res, int n);
void tr_run_close(tr_run *R);
#endif
