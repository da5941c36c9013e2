/* distlab: the ZeRO engine (stages 0-3) over any model cut into units of flat parameters: the
 * trainer's GPT (its module: lib/parallel/zero_module.c) and the lecture's MLP
 * (apps/lecture/lecture_mlp.c) both run on it.
 *
 * The model keeps one flat buffer of numel parameters (and, at stages 0-1, one of gradients), cut
 * into units at bounds[0] = 0 < ... < bounds[n] = numel (lib/parallel/zero.h, "per-unit
 * sharding": each unit padded to a multiple of d in communication only). The engine owns what
 * ZeRO shards besides the optimizer's m and v (AdamW over the blocks: lib/train/optim.c): bf16's
 * fp32 master weights of this rank's blocks (stage 0: of everything), the reduced gradient's
 * blocks (stages 2-3) and the parameters' blocks (stage 3), from the rank's arena under their
 * categories (optimizer, grads, params), plus one staging unit (comm) where a padded unit or a
 * bf16 rounding needs it. The model calls back:
 *   stage 1   dl_zero_ready(first) once the gradients at [first, numel) are final (the last
 *             micro-batch): each complete unit is reduce-scattered in place in the model's buffer;
 *   stage 2-3 dl_zero_reduce_hook after each unit's backward with its gradient (compute type,
 *             padded to d S_u, the padding zero): reduce-scattered at once, this rank's block
 *             added into the gradient shard;
 *   stage 3   dl_zero_gather_hook before each unit's forward and backward: the unit's parameters
 *             all-gathered from every rank's block into the model's unit buffer.
 * After the optimizer has updated this rank's blocks (dl_zero_grad_block, dl_zero_param_block,
 * z->master), stages 1-2 all-gather the parameters (dl_zero_gather_params). Storage f32, f64 or
 * bf16 (compute f32). */
#ifndef DISTLAB_PARALLEL_ZERO_ENGINE_H
#define DISTLAB_PARALLEL_ZERO_ENGINE_H

#include "distlab.h"
#include "parallel/zero.h"

typedef struct dl_zero_engine {
    int stage;      /* 0..3 (0: nothing sharded; the caller reduces the gradients) */
    dl_comm *comm;  /* the dp group */
    dl_comm *xcomm; /* the expert-data-parallel group (expert units; NULL: none) */
    dl_dtype dt;    /* storage of parameters and gradients */
    int dsize;      /* its element size */
    int bf16;       /* dt == DL_BF16: compute f32, fp32 master weights */
    size_t numel;   /* P */
    void *params;   /* the model's flat parameters (NULL at stage 3) */
    void *grads;    /* the model's flat gradients (NULL at stages 2-3) */
    dl_arena *arena;
    dl_zero_units zu; /* per-unit shards (stage 0: d = 1, the blocks are the units) */
    char *master;     /* bf16: fp32 master weights of the shard (optimizer category) */
    char *gshard;     /* stages 2-3: the reduced gradient of the shard */
    char *pshard;     /* stage 3: the parameters of the shard */
    char *stg;        /* one padded unit in the storage type (comm), when needed */
    int next_unit;    /* stage 1: units >= next_unit are reduce-scattered (this step) */
    /* with expert units (dl_zero_engine_setup_ep) the model's unit m is the engine's units
     * first[m] .. first[m + 1] - 1 (its dense and its expert segments); NULL: the same units */
    int *first;
    int nmodel;
} dl_zero_engine;

/* Expert parallelism's second group: the engine's units (segments of the model's units) that
 * are expert tensors are sharded over the expert-data-parallel group (edp ranks, this rank's
 * edp_rank) instead of dp, as Megatron shards expert parameters ("parallel folding"). */
typedef struct dl_zero_experts {
    const unsigned char *expert; /* [n]: the engine unit is expert tensors */
    const int *first;            /* [nmodel + 1]: the model's units as engine units */
    int nmodel;
    dl_comm *comm; /* the expert-data-parallel group */
    int edp, edp_rank;
} dl_zero_experts;

/* Before the model exists (its hooks take the engine as their argument): stage 0..3 (0 when
 * dp = 1), the storage type, the dp group. */
void dl_zero_engine_init(dl_zero_engine *z, int stage, dl_dtype dt, dl_comm *comm);

/* Once the model exists: its n units (bounds[0..n]), the dp size and rank, its flat buffers (as
 * above). Allocates the engine's buffers from `arena`. */
int dl_zero_engine_setup(dl_zero_engine *z, const size_t *bounds, int n, int dp, int dp_rank,
                         void *params, void *grads, dl_arena *arena);
/* The same with expert units (x; NULL: dl_zero_engine_setup). */
int dl_zero_engine_setup_ep(dl_zero_engine *z, const size_t *bounds, int n, int dp, int dp_rank,
                            const dl_zero_experts *x, void *params, void *grads, dl_arena *arena);
void dl_zero_engine_free(dl_zero_engine *z);

/* A step begins: the gradient shard zeroed, every unit waiting for its reduction. */
void dl_zero_begin_step(dl_zero_engine *z);

/* This rank's block of unit u (storage type): its reduced gradient (in the model's buffer at
 * stages 0-1, in the shard at 2-3) and its parameters (the shard at stage 3). */
char *dl_zero_grad_block(dl_zero_engine *z, int u);
char *dl_zero_param_block(dl_zero_engine *z, int u);

/* The model's hooks (arg: the engine; u: the model's unit); see above. */
int dl_zero_reduce_hook(void *arg, int u, void *grad);
int dl_zero_gather_hook(void *arg, int u, void *dst);

/* Gradients at [first, numel) are final: stage 1 reduce-scatters every unit that is complete
 * (other stages: nothing). */
int dl_zero_ready(dl_zero_engine *z, size_t first);

/* Unit u of the flat gradient buffer `grads` (storage type dt) reduce-scattered in place over
 * comm (the unit's group): this rank's block of the sum lands in its place (through stg, one padded unit, when the
 * unit is padded); with whole, all-gathered back too: the whole sum in place, the ring
 * all-reduce's two halves (bf16 data parallelism at stage 0, parallel/dp_bf16.c). */
int dl_zero_unit_reduce(const dl_zero_units *zu, int u, dl_comm *comm, dl_dtype dt, void *grads,
                        char *stg, int whole);

/* Stages 1-2, after the optimizer: every unit's updated parameters all-gathered into the model's
 * buffer, unit by unit. */
int dl_zero_gather_params(dl_zero_engine *z);

/* The whole buffer (numel elements) in the export type (f64 for f64, f32 otherwise: a bf16 run
 * exports its fp32 master weights and its gradients widened): the parameters (which = 0) or the
 * reduced gradients (1). Collective over the dp group when sharded (purpose OTHER). */
int dl_zero_export(dl_zero_engine *z, int which, void *out);
/* Set the parameters (and bf16's master weights) from a whole buffer in the export type. */
void dl_zero_import(dl_zero_engine *z, const void *full);

#endif
