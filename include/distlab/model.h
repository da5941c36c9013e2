/* distlab: the GPT-style byte-level decoder, its parameter layout and its sharding.
 *
 * The model is peers/torch_gpt.py's: learned token and position embeddings, pre-LayerNorm
 * blocks (causal multi-head attention with biased Q/K/V and output projections; MLP
 * Z = GeLU(X·A + a)·B + b with 4x width and the exact erf GeLU), residuals, a final LayerNorm and
 * an untied LM head without bias (or tied to the token embedding).
 *
 * Parameters live in ONE flat buffer per rank; each tensor is a named view at an offset. Names are
 * GPT-2-like and weights use nn.Linear's (out, in) layout (see docs/API.md for the mapping to
 * torch_gpt.py's names):
 *   wte.weight (V,C)  wpe.weight (T,C)
 *   h.L.ln_1.weight (C)  h.L.ln_1.bias (C)
 *   h.L.attn.c_attn.weight (3C,C)  h.L.attn.c_attn.bias (3C)     [Q rows, then K, then V]
 *   h.L.attn.c_proj.weight (C,C)   h.L.attn.c_proj.bias (C)
 *   h.L.ln_2.weight (C)  h.L.ln_2.bias (C)
 *   h.L.mlp.c_fc.weight (4C,C)     h.L.mlp.c_fc.bias (4C)
 *   h.L.mlp.c_proj.weight (C,4C)   h.L.mlp.c_proj.bias (C)
 *   ln_f.weight (C)  ln_f.bias (C)  lm_head.weight (V,C) (absent when tied)
 * A mixture-of-experts layer (cfg.experts > 0) has, instead of its mlp.* tensors (F = expert
 * width):
 *   h.L.mlp.router.weight (E,C)
 *   h.L.mlp.experts.e.c_fc.weight (F,C)  .c_fc.bias (F)  .c_proj.weight (C,F)  .c_proj.bias (C)
 *
 * Tensor parallelism over t ranks (Megatron): c_attn and c_fc are column-parallel (rank r holds a
 * contiguous block of output rows: for c_attn the rows of heads [r·H/t, (r+1)·H/t) in each of the
 * Q, K and V thirds); attn.c_proj and mlp.c_proj are row-parallel (rank r holds the input columns
 * [r·K/t, (r+1)·K/t) of every row). Their biases follow the rows (column-parallel) or stay whole
 * (row-parallel: added once, after the all-reduce). Everything else is replicated.
 *
 * Initialisation is counter-based: element g (global row-major index) of tensor k is a function of
 * (seed, k, g) only, so any shard generates exactly its slice of the single-rank weights. */
#ifndef DISTLAB_MODEL_H
#define DISTLAB_MODEL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dl_gpt_config {
    int vocab;   /* 256 for bytes */
    int seq;     /* context length T (positions) */
    int layers;  /* L */
    int d_model; /* C */
    int heads;   /* H; C % H == 0 */
    int tie;     /* 1: the LM head is wte */
    /* Mixture of experts (0 experts: every MLP dense). The MLP of every moe_every-th layer
     * (layers 0, moe_every, 2 moe_every, ...: Megatron's pattern, the first layer included)
     * becomes `experts` GeLU MLPs of width expert_ffn (0: 4 C) behind a router (model/
     * sublayer_moe.c has the rules: top-k, gates, per-sequence capacity ceil(capacity · T · k /
     * E) or none at capacity 0, the auxiliary and z losses with weights aux_loss, z_loss). */
    int experts, top_k, moe_every, expert_ffn;
    double capacity, aux_loss, z_loss;
} dl_gpt_config;

/* torch_gpt.py's benchmark model: V 256, T 128, L 4, C 256, H 4, untied. */
void dl_gpt_config_default(dl_gpt_config *c);

typedef enum dl_shard_kind {
    DL_SHARD_NONE = 0, /* replicated */
    DL_SHARD_ROWS,     /* contiguous block of rows (or of a vector's elements) */
    DL_SHARD_COLS,     /* the same block of columns in every row */
    DL_SHARD_QKV       /* one contiguous row block in each of three equal thirds */
} dl_shard_kind;

typedef struct dl_tensor_info {
    char name[48];
    int ndim;         /* 1 or 2 */
    int64_t shape[2]; /* global shape (rows, cols); cols = 1 for vectors */
    int64_t local[2]; /* this rank's shape */
    dl_shard_kind shard;
    size_t offset; /* start in the rank's flat buffer (elements) */
    size_t numel;  /* local elements */
    int layer;     /* block index, -1 outside the blocks */
    int id;        /* tensor index in the single-rank layout (init key) */
} dl_tensor_info;

/* A pipeline stage's part of the model: chunk c holds layers first[c] .. first[c] + count[c] - 1
 * (chunks in order; with interleaving, chunk c of stage s is virtual stage c·p + s); `embed`: the
 * stage holds wte and wpe (virtual stage 0); `head`: ln_f and the LM head (the last virtual
 * stage). With tied embeddings a head stage without the embeddings holds its own copy of
 * wte.weight (same name, same initial values), kept in sync by reducing its gradient with the
 * first stage's, as Megatron does. */
#define DL_GPT_MAX_CHUNKS 16
typedef struct dl_gpt_part {
    int nchunks;
    int first[DL_GPT_MAX_CHUNKS], count[DL_GPT_MAX_CHUNKS];
    int embed, head;
} dl_gpt_part;

/* The whole model as one part (one chunk of every layer, embeddings and head). */
void dl_gpt_part_whole(const dl_gpt_config *c, dl_gpt_part *out);
/* Stage `stage` of p with v chunks each, virtual stage k = c·p + stage holding layers
 * bounds[k] .. bounds[k+1]-1 (bounds[0] = 0, bounds[p·v] = layers, strictly increasing). */
int dl_gpt_part_stage(const dl_gpt_config *c, int p, int v, int stage, const int *bounds,
                      dl_gpt_part *out);

/* Which tensors a rank holds and where. Tensor order is the forward order (wte, wpe, blocks,
 * ln_f, lm_head), so gradients become final from the end of the buffer towards its start. */
typedef struct dl_gpt_layout {
    dl_gpt_config cfg;
    int tp, tp_rank;
    int ep, ep_rank; /* expert parallelism: this rank holds experts [ep_rank E/ep, ...) */
    int ntensors;
    dl_tensor_info *t;
    size_t numel;     /* local elements in all */
    dl_gpt_part part; /* the pipeline part held (the whole model without pp) */
} dl_gpt_layout;

/* Check a configuration and a tp degree (heads % tp, C % heads, sizes > 0, 4C % tp ...).
 * DL_EINVAL with a message saying what is wrong and what would fit. */
int dl_gpt_config_check(const dl_gpt_config *c, int tp);

/* The tensors tp rank `tp_rank` of `tp` holds of the whole model; free with
 * dl_gpt_layout_destroy. */
int dl_gpt_layout_create(const dl_gpt_config *c, int tp, int tp_rank, dl_gpt_layout **out);
/* The tensors of one pipeline part only (part NULL: the whole model), in forward order:
 * [wte, wpe], the layers of each chunk, [ln_f, lm_head or the tied wte copy]. */
int dl_gpt_layout_create_part(const dl_gpt_config *c, int tp, int tp_rank, const dl_gpt_part *part,
                              dl_gpt_layout **out);
/* Expert parallelism over ep ranks (experts % ep == 0): rank ep_rank holds the tensors of its
 * E / ep experts, whole, under their global names (h.L.mlp.experts.E.*) and every other tensor
 * as create_part does (ep 1: create_part). */
int dl_gpt_layout_create_ep(const dl_gpt_config *c, int tp, int tp_rank, int ep, int ep_rank,
                            const dl_gpt_part *part, dl_gpt_layout **out);
void dl_gpt_layout_destroy(dl_gpt_layout *l);
/* Index of a tensor by name, or -1. */
int dl_gpt_find(const dl_gpt_layout *l, const char *name);
/* Global row-major index (in the unsharded tensor) of local element i of tensor k. */
int64_t dl_gpt_global_index(const dl_gpt_layout *l, int k, size_t i);
/* Parameter count of the whole (unsharded) model. */
int64_t dl_gpt_num_params(const dl_gpt_config *c);

/* Fill a rank's flat parameter buffer (f32 or f64, `dsize` 4 or 8) from the counter-based
 * initialiser: weights N(0, 0.02), the two residual projections N(0, 0.02/sqrt(2L)), biases 0,
 * LayerNorm weights 1. */
void dl_gpt_init(const dl_gpt_layout *l, void *params, int dsize, uint64_t seed);

#ifdef __cplusplus
}
#endif
#endif
