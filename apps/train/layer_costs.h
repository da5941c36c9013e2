/* Per-layer costs measured on this machine (apps/train/layer_costs.c). */
#ifndef DISTLAB_APPS_TRAIN_LAYER_COSTS_H
#define DISTLAB_APPS_TRAIN_LAYER_COSTS_H

#include <stddef.h>
#include "distlab.h"

/* Time the forward and backward of the model's first (with the embeddings), a middle and the
 * last layer (with the head and the loss) on this thread for one micro-batch, median of `reps`
 * passes after a warm-up, and fill costs[0 .. layers-1] in milliseconds (the blocks in between
 * all cost the middle one). `desc` (may be NULL) receives one line describing the figures. */
int measure_layer_costs(const dl_gpt_config *cfg, dl_dtype dt, int micro_batch, int reps,
                        double *costs, char *desc, size_t desc_len);

#endif
