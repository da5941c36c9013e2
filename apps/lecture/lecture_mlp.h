/* distlab-lecture 04: the lecture's ZeRO experiment (§5, code 04) on rank threads: a small MLP
 * (its forward, backward and data here, apps/lecture/lecture_mlp.c) on the library's ZeRO engine
 * (lib/parallel/zero_engine.c, the trainer's too) and the trainer's AdamW over the engine's blocks
 * (lib/train/optim.c); the section's printing is apps/lecture/lecture_zero.c.
 *
 * The model is an MLP 16 -> 32 -> 32 -> 1 (GeLU between layers, mean squared error), 1633
 * parameters: the lecture's count (its code did not survive in the text; this is the plain
 * three-layer shape that has exactly 1633). Parameters live in a flat buffer, layer after
 * layer (W (out, in) row-major, then the bias), each layer padded with zeros to a multiple of
 * the number of ranks N (FSDP's flat parameter per layer; DDP's bucket per layer); rank r's
 * shard is block r of every layer (the block a ring reduce-scatter hands it), so a stage may
 * reduce-scatter or all-gather layer by layer.
 *
 * The engine's units are the padded layers (so it adds no padding of its own).
 *
 * Mixed precision (dtype DL_BF16): parameters and gradients in bf16 (2 + 2 bytes), an fp32
 * master copy and Adam's m and v (K = 12 bytes), round to nearest even; the kernels widen bf16
 * to f32 and accumulate in f32. dtype DL_F32 keeps parameters and gradients in f32 and no master
 * copy (16 bytes: AdamW updates the parameters), for a comparison at float32 rounding. Every
 * buffer is allocated from the rank's arena under
 * its category, so the bytes per parameter are measured by the arena:
 *   stage 0  params, grads, master/m/v replicated; per-layer all-reduce of the gradients;
 *   stage 1  master/m/v for the shard only; per-layer reduce-scatter (in place) of the full
 *            gradient, Adam on the shard, per-layer all-gather of the updated parameters;
 *   stage 2  also the gradients as a shard only: each layer's full gradient exists only as a
 *            transient comm buffer (f32) between its backward and the engine's reduce hook;
 *   stage 3  also the parameters as a shard: each layer's are all-gathered into a transient
 *            comm buffer before its forward and again before its backward, freed after use.
 * With nranks = 1 every stage is the single-rank run (the reference). */
#ifndef DISTLAB_APPS_LECTURE_MLP_H
#define DISTLAB_APPS_LECTURE_MLP_H

#include <stddef.h>
#include <stdint.h>
#include "distlab.h"

#define ZM_LAYERS 3
#define ZM_MAX_RANKS 16
#define ZM_MAX_STEPS 64

typedef struct zm_opts {
    int nranks;     /* 1..ZM_MAX_RANKS (default 4) */
    int stage;      /* 0..3 (default 0) */
    int steps;      /* Adam steps, 1..ZM_MAX_STEPS (default 5) */
    int batch;      /* global batch, a multiple of nranks (default 64) */
    dl_dtype dtype; /* DL_BF16 (default) or DL_F32: parameters and gradients */
    float lr;       /* Adam (default 1e-3; betas 0.9, 0.999, eps 1e-8, no weight decay) */
    uint64_t seed;  /* initialisation and data (default 17) */
} zm_opts;

void zm_opts_init(zm_opts *o);

/* The flat layout for n ranks. */
typedef struct zm_layout {
    int n;
    int in[ZM_LAYERS], out[ZM_LAYERS];
    size_t numel[ZM_LAYERS]; /* out*in + out */
    size_t pad[ZM_LAYERS];   /* numel rounded up to a multiple of n */
    size_t off[ZM_LAYERS];   /* layer's offset in the padded flat buffer */
    size_t blk[ZM_LAYERS];   /* pad / n: a rank's block of the layer */
    size_t soff[ZM_LAYERS];  /* the block's offset in the rank's shard */
    size_t psi;              /* real parameters (1633) */
    size_t ppad;             /* padded flat buffer (1636 for n = 4) */
    size_t shard;            /* elements per shard: ppad / n */
} zm_layout;

int zm_layout_init(zm_layout *L, int n);

typedef struct zm_result {
    zm_opts opts;
    zm_layout L;
    float *master;                                   /* ppad fp32 master weights after the run */
    double loss[ZM_MAX_STEPS];                       /* global-batch loss at each step's forward */
    uint64_t peak[ZM_MAX_RANKS][DL_MEM_NCATEGORIES]; /* arena peak bytes per rank and category */
    uint64_t sent[ZM_MAX_RANKS][DL_NPURPOSES];       /* bytes each rank sent over the steps */
    uint64_t ops[ZM_MAX_RANKS];                      /* collectives over the steps */
} zm_result;

/* Run the experiment on o->nranks rank threads. DL_OK, or the world's first error (dl_errmsg).
 * On success free the result with zm_result_free. */
int zm_run(const zm_opts *o, zm_result *r);
void zm_result_free(zm_result *r);

/* Largest |a - b| over the real parameters of two results (any rank counts, same shape). */
double zm_maxdiff(const zm_result *a, const zm_result *b);
/* How many real parameters differ by more than tol. */
size_t zm_count_above(const zm_result *a, const zm_result *b, double tol);
/* Largest |master| over the real parameters. */
double zm_maxabs(const zm_result *a);
/* Model-state bytes of a rank: peak params + grads + optimizer. */
uint64_t zm_state_bytes(const zm_result *r, int rank);

#endif
