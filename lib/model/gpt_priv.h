/* distlab (private): what the trainer does to a GPT instance beyond the public API. */
#ifndef DISTLAB_MODEL_GPT_PRIV_H
#define DISTLAB_MODEL_GPT_PRIV_H

#include "distlab/gpt.h"
#include "model/sublayer.h"

/* Compute with another copy of the parameters (same layout) until called again with the
 * previous pointer, which it returns: weight stashing runs a backward with the weights its
 * forward used. */
void *dl_gpt_use_params(dl_gpt *g, void *params);

/* The mixture-of-experts layers this rank holds, and what the forwards since the last reset
 * measured in the i-th of them (model/sublayer.h); reset zeroes every one. */
int dl_gpt_moe_layers(const dl_gpt *g);
dl_moe_stats *dl_gpt_moe_stats(dl_gpt *g, int i);
void dl_gpt_moe_reset(dl_gpt *g);

#endif
