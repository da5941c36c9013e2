/* The trainer's dumps and saved parameters (train/dump.c). */
#ifndef DISTLAB_TRAIN_DUMP_H
#define DISTLAB_TRAIN_DUMP_H
#include "parallel/module.h"

/* At the step that wants it: the reduced gradient, whole, into the result (--want-grads, the
 * last step) and as a safetensors file with its global batch (--dump-grads, step 1). */
int tr_dump_grads(tr_env *e);
/* After training: the whole parameters into the result and the checkpoint, when asked for. */
int tr_save_params(tr_env *e);
#endif
