/* The trainer's reporting (train/report.c). */
#ifndef DISTLAB_TRAIN_REPORT_H
#define DISTLAB_TRAIN_REPORT_H
#include "parallel/module.h"
#include "train/eval.h"

/* one step's figures, rank 0's */
typedef struct tr_step_rec {
    double loss, val, norm, lr;
    int skip, used; /* skipped (non-finite gradient); validation windows used (0: none) */
} tr_step_rec;

/* Rank 0 after each step: the record into the run's tables, the records owed to on_step, the
 * progress line (*last_logged: the last step logged), the trace once past its window. *rc: the
 * caller's on_step error. */
void tr_record_step(tr_env *e, const tr_step_rec *r, int *last_logged, int *rc);
/* Rank 0 after training: the bytes per step by purpose (evaluations' excluded). */
void tr_report_traffic(tr_env *e, const tr_eval_bytes *eb, int skipped);
/* Step i's record (0-based) from the run's tables: ms is the slowest rank's. */
void tr_fill_step(const tr_run *R, int i, dl_train_step *st);
/* Hand on_step the completed steps not handed yet (all = 0: those every local rank finished). */
int tr_emit_steps(tr_run *R, int all);
/* Once: the trace file and the timeline of step `step`. */
void tr_finish_trace(tr_run *R, int step);
/* Under MPI: every rank's peaks and per-step figures into every process's tables. */
int tr_share_rank_stats(tr_run *R, int rank, dl_comm *world, const uint64_t *peak);
/* After the run: the step records, medians, final losses and the pipeline's figures. */
void tr_summarise(tr_run *R, dl_train_result *res);
#endif
