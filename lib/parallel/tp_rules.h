/* Tensor parallelism's rules for the trainer (the model's own part, the f and g collectives and
 * the shard kinds, is lib/model/): which tensors a rank counts in sums over the whole model. */
#ifndef DISTLAB_PARALLEL_TP_RULES_H
#define DISTLAB_PARALLEL_TP_RULES_H
#include "model/gpt_priv.h"

/* Whether tensor k of this rank's layout counts in a whole-model sum (the gradient norm, the
 * gathered parameters): sharded tensors on every tp rank, replicated ones on tp rank 0 only, and
 * the head stage's copy of tied wte never (the embedding stage holds the same values). */
int tr_tensor_counted(const dl_gpt_layout *l, int k);
#endif
