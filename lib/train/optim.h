/* The optimizer module: AdamW over the shards the sharding module hands it (parallel/module.h,
 * tr_shards), its state (m, v of the shard's size, the Adam step), the learning-rate schedule
 * (linear warm-up, cosine decay to min_lr) and global-norm clipping. It knows nothing of the
 * communicators: the norm's partial sum is reduced by the modules' reduce_norm hooks. */
#ifndef DISTLAB_TRAIN_OPTIM_H
#define DISTLAB_TRAIN_OPTIM_H
#include <stddef.h>
#include "distlab.h"
#include "parallel/module.h"

typedef struct tr_optim {
    const tr_shards *sh;
    const tr_prec *pr;
    tr_adam_hp hp;
    dl_arena *arena;
    void *m, *v; /* compute type, the shard's size (zu->shard) */
    int t;       /* Adam steps taken (bias correction) */
} tr_optim;

/* The learning rate of step `step` (1-based): lr * step / warmup during the warm-up, then cosine
 * from lr down to min_lr at step `steps` (lr throughout when nothing is left to decay). */
double tr_lr_at(double lr, double min_lr, int warmup, int steps, int step);
/* The clipping factor: clip / norm when clip > 0 and the norm exceeds it, else 1. */
double tr_clip_scale(double clip, double norm);
/* This rank's part of the squared gradient norm: every shard block's elements of the tensors
 * this rank counts (tr_tensor_counted), each tensor's run of the block summed on its own. */
double tr_grad_sumsq(const tr_shards *sh, const tr_prec *pr, const dl_gpt_layout *l);

/* m and v (zeros) in the arena's optimizer category; arena NULL: host memory (tests). */
int tr_optim_init(tr_optim *op, const tr_shards *sh, const tr_prec *pr, const tr_adam_hp *hp,
                  dl_arena *arena);
/* One AdamW step over every block: the gradient times scale, learning rate lr. */
void tr_optim_step(tr_optim *op, double scale, double lr);
void tr_optim_free(tr_optim *op);
#endif
