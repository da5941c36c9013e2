/* distlab (private): the model's extension points. A transformer layer is a short list of
 * sublayers (today: attention, then the dense MLP), each a kind described once by a const table:
 * its parameters for a config and a layer (names, shapes, tensor-parallel split), what its
 * forward keeps for the backward, what a deferred weight-gradient part keeps beyond that, the
 * ZeRO/bucket unit it belongs to, and its functions — the forward and a backward in three
 * entry points:
 *   DL_BWD_WHOLE  the whole backward, today's fused kernels on the shared workspaces;
 *   DL_BWD_INPUT  the input gradient only (what the previous sublayer needs): no parameter
 *                 gradient is written, LayerNorm and biases included; what the weight part
 *                 needs is left in the sublayer's stash (ctx->stash);
 *   DL_BWD_WEIGHT every parameter gradient of the sublayer, accumulated, from the stash and the
 *                 forward's activations (any time later, before the optimizer step).
 * INPUT then WEIGHT gives bitwise the WHOLE results: every element's arithmetic is the same
 * (the split kernels keep the fused ones' expressions). The functions see only the context
 * below (no model internals), so a new sublayer is new files plus one line in the registry
 * (sublayer.c: dl__sublayer_kinds). Tensor parallelism is the sublayer's own: the tp split of
 * each parameter is declared in its table, and Megatron's f and g sit at its edges. */
#ifndef DISTLAB_MODEL_SUBLAYER_H
#define DISTLAB_MODEL_SUBLAYER_H

#include <stddef.h>
#include <string.h>
#include "distlab.h"

typedef enum dl_bwd_part { DL_BWD_WHOLE = 0, DL_BWD_INPUT = 1, DL_BWD_WEIGHT = 2 } dl_bwd_part;

/* The sizes a sublayer's buffers depend on: the shard's (Cl = C / tp, Fl = 4C / tp, NHl heads
 * of HS channels on this rank), MB the largest micro-batch, B the current one; a mixture of
 * experts': E experts of width Fe, top-k K, El = E / ep of them on this rank. With a key/value
 * cache (Tkv > 0) the attention's probabilities span T x Tkv per head, and ws_scratch as much. */
typedef struct dl_sub_dims {
    int MB, B, T, C, Cl, Fl, NHl, HS, tp;
    int E, K, Fe, El, ep;
    int Tkv; /* a key/value cache's rows per sequence (0: none); T is then a slice's length */
} dl_sub_dims;

/* What an MoE sublayer measures in its forwards since the last reset, for this rank's tokens
 * (the trainer sums them over the dp group): per expert the choices that selected it (before
 * drops) and of them the dropped ones; the sums over sequences of the auxiliary and z losses
 * (with their weights α, β) and of a hash of each sequence's routing (choices and admissions in
 * order: a sum, so any split of the sequences over ranks gives the same total); the bytes this
 * rank sent in the dispatch and combine all-to-alls, forward and backward. */
typedef struct dl_moe_stats {
    int layer, E;
    int64_t *routed, *dropped; /* [E] */
    int64_t seqs;
    double aux, z;
    uint64_t hash;
    double a2a_bytes;
    uint64_t combine_wait_ns; /* time in the combine's all-to-all (waiting for the experts) */
    /* the forwards' time by phase: ln_2 (the norm the dense MLP has too); the router and
     * routing; dispatch (rows, counts, exchange,
     * permutation); the experts (GEMMs and GeLU; expert_flop their GEMMs' flops); combine
     * (permutation, exchange, gated sum) */
    uint64_t norm_ns, router_ns, dispatch_ns, expert_ns, combine_ns;
    uint64_t a2a_ns; /* of dispatch and combine, the time inside the all-to-alls (the transfer
                      * and the wait for the other ranks) */
    double expert_flop;
    /* split_wait (set by a benchmark; kept by dl_gpt_moe_reset): each forward all-to-all is
     * preceded by a barrier of the ep group, timed into peer_wait_ns and kept out of the phases
     * and a2a_ns, which are then the exchanges' own transfer: the wait for the other ranks
     * (the load imbalance) apart from what dispatch and combine cost */
    int split_wait;
    uint64_t peer_wait_ns;
    /* the trace of a traced step (NULL: none; set by the trainer each step, kept by
     * dl_gpt_moe_reset): the forward's all-to-alls as DL_TR_MOE_DISPATCH / _COMBINE events of
     * rank tr_rank, step tr_step, timed by the clock reads the fields above sum */
    struct dl_trace *tr;
    int tr_rank, tr_step;
} dl_moe_stats;

/* One call of one sublayer of one layer, for one micro-batch. Pointers are to the compute type
 * (float or double by the function's variant). */
typedef struct dl_sub_ctx {
    dl_sub_dims d;
    dl_comm *tp_comm; /* the tp group (NULL at tp 1) */
    void *const *w;   /* w[i]: parameter i of the sublayer (its table's order) */
    void *const *dw;  /* dw[i]: its gradient (accumulated into) */
    void *act;        /* what the forward keeps for the backward (act_elems) */
    void *stash;      /* what the weight part needs (stash_elems); unused by WHOLE */
    const void *x;    /* the input on the residual stream (N x C), kept until the weight part */
    void *y;          /* the output (N x C) */
    void *dx;         /* backward: dL/dy on entry, dL/dx on return (INPUT and WHOLE) */
    /* the backward's workspaces, shared by every sublayer: N x C, N x Cl, N x 3Cl, N x Fl, T x T */
    void *ws_dln, *ws_datty, *ws_dqkv, *ws_dfc, *ws_scratch;
    /* attention with a key/value cache (token-level pipelining, model/ops_attn_kv.h): this call
     * is the slice of positions [kv_ctx, kv_ctx + T) of its sequences. kv (MB sequences of
     * d.Tkv rows of 2 Cl: this rank's heads' keys, then values) holds the earlier slices' keys
     * and values; the forward appends its own. The backward adds the gradient of every key and
     * value the slice read into dkv (same layout): the slices' backwards run in reverse order,
     * the sequence's last slice (kv_ctx + T == d.Tkv) writes it, so each slice finds its own
     * keys' and values' gradient complete there. NULL: the whole sequence, no cache. */
    void *kv, *dkv;
    int kv_ctx;
    /* a mixture of experts: the model's config, the ep group (NULL at ep 1), what the forward
     * measures, and the backward's d(objective)/d(loss of one position) (the auxiliary losses'
     * weight: 1 / (positions of the global batch)) */
    const dl_gpt_config *cfg;
    dl_comm *ep_comm;
    dl_moe_stats *moe;
    double dloss;
} dl_sub_ctx;

typedef struct dl_sub_param {
    char name[32];      /* after "h.<layer>." (the safetensors names) */
    int64_t rows, cols; /* the global shape (cols 1: a vector) */
    int ndim;           /* 1 or 2 */
    dl_shard_kind sh;   /* tensor parallelism: how tp ranks split it */
    int expert;         /* the expert it belongs to (held by one ep rank), -1: none */
} dl_sub_param;

/* unit: where the ZeRO / gradient-bucket units are cut (include/distlab/gpt.h, "Units") */
enum { DL_SUB_UNIT_JOIN = 0, DL_SUB_UNIT_NEW = 1 };

typedef struct dl_sublayer_kind {
    const char *name;
    /* its parameters in layout order, for the model's config and a layer (a kind whose count
     * or shapes depend on the config, as experts do, computes them here) */
    int (*nparams)(const dl_gpt_config *c, int layer);
    void (*param)(const dl_gpt_config *c, int layer, int q, dl_sub_param *out);
    int unit; /* DL_SUB_UNIT_NEW: its parameters start a unit; JOIN: they extend the previous */
    size_t (*act_elems)(const dl_sub_dims *d);   /* kept from the forward for the backward */
    size_t (*stash_elems)(const dl_sub_dims *d); /* kept by the input part for the weight part */
    int (*fwd[2])(dl_sub_ctx *c);                /* [0] f32, [1] f64 */
    int (*bwd[2])(dl_sub_ctx *c, dl_bwd_part part);
} dl_sublayer_kind;

/* The registry: every kind, by index (a model variant names kinds by these indices). */
enum { DL_SUB_ATTENTION = 0, DL_SUB_MLP_DENSE = 1, DL_SUB_MLP_MOE = 2, DL_SUB_NKINDS };
extern const dl_sublayer_kind *const dl__sublayer_kinds[DL_SUB_NKINDS];
extern const dl_sublayer_kind dl__moe_kind; /* model/sublayer_moe.c */

/* Whether a tensor (by its name) is an expert's: held by one ep rank, reduced over the
 * expert-data-parallel group. */
static inline int dl__is_expert(const char *name) { return strstr(name, ".mlp.experts.") != NULL; }

/* The parameters of a kind's layer that a layout holds (its experts only, under ep). */
int dl__sub_nheld(const dl_sublayer_kind *k, const dl_gpt_layout *l, int layer);
/* Whether layer `layer`'s MLP is a mixture of experts, and how many of the layers' are. */
int dl__moe_layer(const dl_gpt_config *c, int layer);
int dl__moe_nlayers(const dl_gpt_config *c);
/* An expert's capacity per sequence of T tokens (-1: no limit), and the largest ep supported. */
int64_t dl__moe_capacity(const dl_gpt_config *c, int T);
int dl__moe_max_ep(void);

/* The model variant: the sublayers of layer `layer`, in order (at most DL_SUB_MAX): attention,
 * then the dense MLP or, on the config's MoE layers, the mixture of experts. */
#define DL_SUB_MAX 4
int dl__layer_sublayers(const dl_gpt_config *c, int layer, const dl_sublayer_kind **out);

/* Megatron's f (before a column-parallel linear) and g (after a row-parallel one), over the tp
 * group: all-reduce of n elements of the sublayer's compute type (8: f64, 4: f32). */
int dl__sub_tp_allreduce(const dl_sub_ctx *c, void *buf, size_t n, int f64);

#endif
