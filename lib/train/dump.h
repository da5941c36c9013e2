/* The trainer's dumps and saved parameters (train/dump.c). */
#ifndef DISTLAB_TRAIN_DUMP_H
#define DISTLAB_TRAIN_DUMP_H
#include "parallel/module.h"

/* At the step that wants it: the reduced gradient, whole, into the result (--want-grads, the
 * last step) and as a safetensors file with its global batch (--dump-grads, step 1). */
int tr_dump_grads(tr_env *e);
/* This rank's whole parameters in the export type (f64 for f64, else f32: bf16's fp32 master
 * weights): in place (*owned 0) or gathered into a buffer to free (*owned 1; collective over dp
 * when sharded). */
int tr_params_whole(tr_env *e, void **full, int *owned);
/* After training: the whole parameters into the result and the checkpoint, when asked for. */
int tr_save_params(tr_env *e);
#endif
