/* distlab: a rank's GPT instance: parameters, gradients and activations in the rank's arena,
 * forward and backward with Megatron tensor parallelism.
 *
 * Per transformer layer the tp group does exactly two all-reduces forward (the g operator after
 * the attention and MLP output projections) and two backward (the f operator before the Q/K/V
 * and first MLP projections), each of N·C elements (N = B·T rows); with full recomputation the
 * backward re-runs the forward too (four). With tp = 1 there are none.
 * Backward accumulates into the gradient buffer (micro-batches add up); the caller zeroes it.
 * Storage f32, f64 or bf16 (mixed precision: f32 compute from bf16 parameters; see "Units").
 * Exception: the key third of each c_attn.bias gradient is set to exactly 0 (softmax ignores a
 * per-row shift, so that is its exact value; the GEMM would leave rounding noise there). */
#ifndef DISTLAB_GPT_H
#define DISTLAB_GPT_H

#include <stddef.h>
#include "distlab/model.h"
#include "distlab/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dl_gpt dl_gpt;

typedef enum dl_recompute { DL_RECOMPUTE_NONE = 0, DL_RECOMPUTE_FULL = 1 } dl_recompute;

/* ZeRO's hooks (see "Units" below): fill `dst` with unit `unit`'s parameters in the storage type
 * (room for the unit padded to a multiple of unit_pad); receive unit `unit`'s gradient of one
 * backward in the compute type (`grad` has room for the padded unit, the padding zero; the hook
 * may use the whole buffer as scratch). */
typedef int (*dl_gpt_gather_fn)(void *arg, int unit, void *dst);
typedef int (*dl_gpt_reduce_fn)(void *arg, int unit, void *grad);

typedef struct dl_gpt_opts {
    dl_gpt_config cfg;
    dl_dtype dtype;         /* DL_F32, DL_F64, or DL_BF16: mixed precision (bf16 parameters and
                             * gradients, f32 activations and arithmetic) */
    int micro_batch;        /* largest B a forward will see */
    int tp;                 /* tensor-parallel degree (1: none) */
    dl_comm *tp_comm;       /* the tp group (NULL when tp == 1); its rank is the tp rank */
    dl_recompute recompute; /* FULL: keep only each layer's input, recompute the rest */
    uint64_t seed;          /* parameter initialisation */
    dl_arena *arena;        /* where everything is allocated (params, grads, activations) */
    /* pipeline (zero keeps the whole-model behaviour) */
    const dl_gpt_part *part; /* pipeline: the part this rank holds (NULL: the whole model) */
    int act_slots;           /* pipeline: micro-batches whose activations are held at once
                             * (0 or 1: one) */
    /* ZeRO (all zero: the model holds its whole flat buffers) */
    int unit_pad;            /* gathered and gradient unit buffers padded to a multiple (dp) */
    dl_gpt_gather_fn gather; /* non-NULL: no parameter buffer (stage 3); called before each unit's
                             * forward and again before its backward */
    dl_gpt_reduce_fn reduce; /* non-NULL: no gradient buffer (stages 2, 3); called after each
                             * unit's backward, every micro-batch */
    void *hook_arg;
    /* split backward: non-zero keeps, per activation slot and layer, what a deferred weight
     * gradient needs (activations category), so dl_gpt_stage_backward_input / _weight work */
    int defer_w;
    /* expert parallelism (cfg.experts > 0): the ep group holding the experts between them
     * (0 or 1: this rank holds every expert) */
    int ep;
    dl_comm *ep_comm; /* its rank is the ep rank (NULL when ep <= 1) */
    /* token-level pipelining (TeraPipe; 0: whole sequences): each forward is a slice of at most
     * token_slice positions of its sequences (its buffers and hand-offs that long), placed by
     * dl_gpt_slot_slice; the keys and values of kv_seqs micro-batches' sequences are kept per
     * layer (category kvcache) for their later slices, with their gradients */
    int token_slice;
    int kv_seqs;
} dl_gpt_opts;

/* Called during backward whenever the gradients of every tensor at flat offsets >= `first` are
 * final (tensors become final from the end of the buffer towards offset 0). */
typedef int (*dl_grad_ready_fn)(size_t first, void *arg);

/* Build this rank's instance in o->arena: its layout, its parameters initialised from o->seed
 * (each shard its slice of the single-rank values; none held with a gather hook), gradient
 * and activation buffers. */
int dl_gpt_create(const dl_gpt_opts *o, dl_gpt **out);
void dl_gpt_destroy(dl_gpt *g);

/* The tensors this rank holds and where (include/distlab/model.h). */
const dl_gpt_layout *dl_gpt_get_layout(const dl_gpt *g);
void *dl_gpt_params(dl_gpt *g); /* flat, layout order, in the storage type (f32, f64, bf16);
                                    * NULL with a gather hook */
void *dl_gpt_grads(dl_gpt *g);  /* same shape; NULL with a reduce hook */
size_t dl_gpt_numel(const dl_gpt *g);
void dl_gpt_zero_grads(dl_gpt *g);

/* Forward of B <= micro_batch sequences (inputs, targets: B·T bytes each, row-major).
 * *loss = mean cross-entropy over the B·T positions. targets may be NULL: the probabilities are
 * computed (dl_gpt_probs) and a loss, if asked for, is against all-zero targets. */
int dl_gpt_forward(dl_gpt *g, const int *inputs, const int *targets, int B, double *loss);

/* Backward of the last forward: d(total loss)/d(loss of one position) = dloss (1/(B·T) for this
 * batch's mean; 1/(positions in the global batch) with micro-batches and data parallelism).
 * `ready` (may be NULL) is called as gradients become final. */
int dl_gpt_backward(dl_gpt *g, double dloss, dl_grad_ready_fn ready, void *arg);

/* Probabilities over the vocabulary at position t of sequence b after the last forward
 * (V values, in the run's precision). */
const void *dl_gpt_probs(const dl_gpt *g, int b, int t);

/* Units: the flat buffer cut where the embeddings (wte, wpe), each layer and the head (ln_f,
 * lm_head or the tied copy) start; unit u is [offset(u), offset(u + 1)), offset(nunits) = numel.
 * Forward and backward work unit by unit. With f32/f64 storage and no hooks the kernels read the
 * flat buffers in place. Otherwise each unit's parameters are materialised before its forward
 * and again before its backward (bf16 widened to f32 into a unit buffer, category other; with a
 * gather hook, gathered into a unit buffer, category comm) and its gradient is computed into a
 * zeroed unit buffer (comm with a reduce hook, other for bf16), then handed to the hook or added
 * into the bf16 gradient buffer (one rounding per micro-batch), before `ready`. With tied
 * embeddings on one rank the embeddings' unit stays materialised from the encoder to the head
 * (forward) and from the head to the encoder (backward): a second unit buffer. */
int dl_gpt_num_units(const dl_gpt *g);
size_t dl_gpt_unit_offset(const dl_gpt *g, int u);
/* Bytes of the unit buffers: gathered parameters (comm), and all of them. */
size_t dl_gpt_unit_bytes(const dl_gpt *g, size_t *gathered);

/* Flat offset where local layer l's tensors start (l == the layers held: where ln_f starts, or
 * the end of the buffer on a stage without the head). */
size_t dl_gpt_layer_offset(const dl_gpt *g, int l);

/* ---- pipeline stages (include/distlab/pipe.h drives them) --------------------------------
 * A rank holding a part (opts.part) runs the forward and backward of one chunk of one
 * micro-batch at a time; `slot` (0 .. act_slots-1) says which activation buffers keep that
 * micro-batch's activations until its backward. The chunk that is virtual stage 0 starts from
 * the tokens; any other starts from its input buffer (dl_gpt_stage_input, MB x T x C values,
 * filled by the caller before the forward). The last virtual stage ends with the loss; any other
 * leaves its output in dl_gpt_stage_output. Backward of a chunk that is not the last starts from
 * the output gradient the caller put in dl_gpt_stage_grad, and every backward leaves the gradient
 * of the chunk's input there. The whole-model dl_gpt_forward/backward are slot 0, chunk 0. */
int dl_gpt_stage_forward(dl_gpt *g, int slot, int chunk, const int *inputs, const int *targets,
                         int B, double *loss);
/* Token-level pipelining (opts.token_slice > 0): the next forwards of `slot` (and so their
 * backwards) are the slice of positions [t0, t0 + len) (len <= token_slice) of the sequences
 * whose keys and values cache `cache` (0 .. kv_seqs-1) holds: its attention reads the cache's
 * rows [0, t0) (the earlier slices, forwarded before) and adds its own. Its inputs, targets and
 * loss are the slice's (B x len positions; the hand-off buffers hold B x token_slice). The
 * backwards of a sequence's slices must run last slice first: each adds its keys' and values'
 * gradient to the cache's, which the earlier slices' backwards then complete and use. DL_EINVAL
 * outside the ranges. */
int dl_gpt_slot_slice(dl_gpt *g, int slot, int cache, int t0, int len);
int dl_gpt_stage_backward(dl_gpt *g, int slot, int chunk, double dloss, dl_grad_ready_fn ready,
                          void *arg);
/* The backward in two parts (zero-bubble schedules; needs opts.defer_w, refused with full
 * recomputation): the input gradient leaves the chunk's input gradient in dl_gpt_stage_grad as
 * dl_gpt_stage_backward does, writes no parameter gradient and keeps in the slot what the weight
 * part needs; the weight gradient (any time later, before the optimizer step; weight parts of
 * several slots in increasing micro-batch order give the whole backward's sums bitwise)
 * accumulates every parameter gradient of the chunk, unit by unit in the whole backward's order,
 * calling `ready` as each unit completes. Input then weight equals dl_gpt_stage_backward
 * bitwise. A weight part without its input part, a second input part or a forward into the slot
 * while its weight part is pending are refused (DL_EINVAL). */
int dl_gpt_stage_backward_input(dl_gpt *g, int slot, int chunk, double dloss);
int dl_gpt_stage_backward_weight(dl_gpt *g, int slot, int chunk, dl_grad_ready_fn ready, void *arg);
void *dl_gpt_stage_input(dl_gpt *g, int slot, int chunk);
const void *dl_gpt_stage_output(dl_gpt *g, int slot, int chunk);
void *dl_gpt_stage_grad(dl_gpt *g);

#ifdef __cplusplus
}
#endif
#endif
