/* Evaluation and sampling in the trainer (train/eval.c). */
#ifndef DISTLAB_TRAIN_EVAL_H
#define DISTLAB_TRAIN_EVAL_H
#include <stdint.h>
#include "parallel/module.h"

/* bytes evaluations sent (tp activations, dp losses, ZeRO 3's parameter gathers) */
typedef struct tr_eval_bytes {
    uint64_t tp, loss, param;
} tr_eval_bytes;

/* Mean validation loss over the first eval_windows windows, split over the dp ranks. */
int tr_evaluate(tr_env *e, double *out, int *used);
/* tr_evaluate, adding what it sent to *b. */
int tr_evaluate_counted(tr_env *e, tr_eval_bytes *b, double *val, int *used);
/* Scatter this rank's shard (f32 or f64, es bytes an element) into an unsharded f64 buffer (the
 * tp = 1 layout's order); dp rank 0 only. */
void tr_gather_into(tr_env *e, const void *src, int es, double *dst);
/* o->output.sample bytes sampled from the model after the start of the validation split (rank 0 keeps
 * them in the result). */
int tr_sample_text(tr_env *e);
#endif
