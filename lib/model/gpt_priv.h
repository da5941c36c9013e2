/* distlab (private): what the trainer does to a GPT instance beyond the public API. */
#ifndef DISTLAB_MODEL_GPT_PRIV_H
#define DISTLAB_MODEL_GPT_PRIV_H

#include "distlab/gpt.h"

/* Compute with another copy of the parameters (same layout) until called again with the
 * previous pointer, which it returns: weight stashing runs a backward with the weights its
 * forward used. */
void *dl_gpt_use_params(dl_gpt *g, void *params);

#endif
