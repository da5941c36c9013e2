/* The pipeline module's interface to the layers above it (parallel/pipe_train.c,
 * parallel/pipe_figures.c): the schedules the trainer runs, and the pipeline's own figures. */
#ifndef DISTLAB_PARALLEL_PIPE_TRAIN_H
#define DISTLAB_PARALLEL_PIPE_TRAIN_H
#include <stddef.h>
#include <stdint.h>
#include "distlab.h"
#include "distlab/train.h"

/* ---- the schedules: one list, read by distlab-train's --schedule, dl_train_resolve and the
 * module ---------------------------------------------------------------------------------- */

/* 1 when the trainer runs schedule kind k (a dl_sched_kind). */
int tr_pipe_trains(int k);
/* The kinds it runs, in --help's order, as English: "gpipe, 1f1b, interleaved, async or naive"
 * (truncated to n bytes). */
void tr_pipe_kind_list(char *buf, size_t n);
/* The schedule the options name (after dl_train_resolve). */
int tr_pipe_make_sched(const dl_train_opts *o, dl_sched **out);

/* ---- the continuous async pipeline (parallel/pipe_cont.c) --------------------------------- */

/* The last step (1-based) of the window that starts at step `first`: the first evaluation,
 * scheduled checkpoint (with a checkpoint directory) or the run's last step at or after it. */
int tr_async_window_end(const dl_train_opts *o, int first);
/* The earliest end of the window [first, end] after step `done` ran (a stop request): the first
 * step whose slices keep those up to `done` unchanged (usually done + 1), at most end. */
int tr_async_window_cut(int p, int m, int first, int end, int done);
/* The step's loss from the head stage to the others over pp, without a collective (the head
 * finishes a step first and must not wait for the others to). */
int tr_async_loss(dl_comm *pp, int head, double *x);

/* ---- the figures ------------------------------------------------------------------------- */

/* The pipeline's rows of every step and rank ([step * nranks + rank]; each rank writes its own,
 * the module's runner), the run's for the module to summarise after it. */
typedef struct tr_pp_rows {
    int nranks;
    double *busy, *wall, *engine; /* ns; engine: per action */
    int *gap;                     /* the largest weight-version gap */
    uint64_t bytes;               /* rank 0: the hand-offs' bytes, all steps */
} tr_pp_rows;

/* Rank `rank`'s row of step i (0-based) as TR_PP_ROW doubles and back: under MPI the ranks'
 * rows travel between processes (train/report.c). */
enum { TR_PP_ROW = 4 };
void tr_pipe_row_get(const tr_pp_rows *t, int i, int rank, double *v);
void tr_pipe_row_set(tr_pp_rows *t, int i, int rank, const double *v);

/* The rows for `steps` steps of n ranks and the result's arrays (zeroed), with the schedule's
 * own theoretical bubble when o has a pipeline. tr_pipe_rows_close frees the rows, also after an
 * error; the result's arrays are the result's (tr_pipe_result_free). */
int tr_pipe_figures_open(tr_pp_rows *t, const dl_train_opts *o, int steps, int n,
                         dl_train_pipeline_result *r);
void tr_pipe_rows_close(tr_pp_rows *t);
void tr_pipe_result_free(dl_train_pipeline_result *r);
/* After the run (o->layout.pp > 1, steps_done > 0): the measured bubbles, slots, engine
 * overhead, version gaps and hand-off bytes into r. */
void tr_pipe_summarise(const tr_pp_rows *t, const dl_train_opts *o, int steps_done,
                       dl_train_pipeline_result *r);
#endif
