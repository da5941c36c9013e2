/* The pipeline adapter's pieces the report needs (parallel/pipe_train.c). */
#ifndef DL_PARALLEL_PIPE_TRAIN_H
#define DL_PARALLEL_PIPE_TRAIN_H
#include "distlab.h"
#include "distlab/train.h"

/* The schedule the options name (after dl_train_resolve). */
int tr_pipe_make_sched(const dl_train_opts *o, dl_sched **out);
#endif
