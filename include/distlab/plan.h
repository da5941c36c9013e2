/* distlab: the planner's analytic models (lecture 17 §1, §4, §5.2, §6.4 and its exercises).
 *
 * Memory, communication, pipeline bubble, ZeRO tables, balanced layer partitions and the 3-D
 * (t, p, d) search of Megatron-style training, as plain functions of a model shape, a hardware
 * description and a set of assumptions. Every assumption lives in dl_plan_opts, and its default
 * reproduces the lecture's numbers; docs/PLANNER.md derives each formula.
 *
 * Units: bytes, seconds, FLOP/s and bytes/s, decimal (1 GB = 1e9 B, as the lecture counts).
 * Functions that can fail return a dl_status code and leave a message (dl_errmsg). */
#ifndef DISTLAB_PLAN_H
#define DISTLAB_PLAN_H

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------- */
/* Models                                                                                    */

typedef struct dl_plan_model {
    char name[32];
    int layers;    /* transformer layers (0: a bare parameter count, no shape) */
    int hidden;    /* h */
    int heads;     /* a: attention (query) heads */
    int kv_heads;  /* key/value heads (= heads without GQA) */
    int ffn;       /* MLP inner size */
    int vocab;     /* vocabulary (input embedding; an untied output matrix if gated_mlp) */
    int seq;       /* default sequence length s */
    int gated_mlp; /* 1: SwiGLU (3 MLP matrices, untied output embedding, Llama); 0: GPT (2, tied) */
    double params; /* > 0: the parameter count Psi to use (pins a preset to the lecture's
                     * figure); 0: computed from the shape */
    /* Mixture of experts (experts 0: every MLP dense). The MLP of every moe_every-th layer (0 or
     * 1: every layer) becomes `experts` expert MLPs of width expert_ffn (0: ffn), of the model's
     * MLP form (gated_mlp: SwiGLU, 3 matrices, as Mixtral's; else 2), behind a router (h x E);
     * each token goes to top_k of them; capacity: the capacity factor (0: no limit). */
    int experts, top_k, expert_ffn, moe_every;
    double capacity;
} dl_plan_model;

/* Fill *m with a preset: "gpt3-175b", "llama3-405b", "dense-7.5b" (also "7.5b"), "dense-70b"
 * (also "70b"), "maverick-400b" (bare count), "mixtral-8x7b" (8 SwiGLU experts of 4096 x 14336,
 * top-2, every layer). DL_EINVAL for an unknown name. */
int dl_plan_model_preset(const char *name, dl_plan_model *m);
/* Name of preset i (0, 1, ...), NULL after the last. */
const char *dl_plan_model_preset_name(int i);
/* Parameter count Psi: m->params if > 0, else from the shape: per layer
 * 2h^2 + 2h*kv*(h/a) (Q, O; K, V) + (3 if gated else 2)*h*ffn, times layers, plus the
 * embedding vocab*h (twice if gated: untied output). Biases and norms are ignored. */
double dl_plan_model_params(const dl_plan_model *m);
/* The expert parameters of a mixture of experts (0 for a dense model): MoE layers x experts x
 * (3 if gated else 2) x h x expert_ffn. The router (h x E per MoE layer) counts as dense. */
double dl_plan_expert_params(const dl_plan_model *m);
/* MoE layers: layers 0, N, 2N, ... (N = moe_every): ceil(layers / N); 0 for a dense model. */
int dl_plan_moe_layers(const dl_plan_model *m);
/* Parameters one token uses: Psi less the experts it is not routed to (Psi - Psi_E + Psi_E k/E);
 * Psi for a dense model. The compute model counts these (flops_per_token each). */
double dl_plan_model_active_params(const dl_plan_model *m);
/* 1 when the model has a shape (layers, hidden, heads, ...), 0 for a bare count. */
int dl_plan_model_has_shape(const dl_plan_model *m);
/* Check sizes (positive, heads divide hidden, kv_heads divide heads). need_shape: also fail for a
 * bare parameter count, naming the calculation `what` that needs the shape. */
int dl_plan_model_check(const dl_plan_model *m, int need_shape, const char *what);

/* ---------------------------------------------------------------------------------------- */
/* Hardware                                                                                  */

typedef struct dl_plan_hw {
    char name[32];
    double flops;     /* dense BF16 FLOP/s per GPU (peak, or measured GEMM rate) */
    double mfu;       /* fraction of `flops` a training step achieves (model FLOPs) */
    double mem_bytes; /* memory per GPU */
    double hbm_bw;    /* memory bandwidth, bytes/s */
    double intra_bw;  /* NVLink: bytes/s per GPU per direction (inside a node) */
    double inter_bw;  /* InfiniBand: bytes/s per GPU per direction (between nodes) */
    double intra_lat; /* seconds per message hop inside a node (alpha; 0 in the presets) */
    double inter_lat; /* seconds per message hop between nodes */
    int gpus_per_node;
    /* optional profile keys written by `distlab-plan calibrate` (0 = not measured) */
    int ranks;            /* ranks that ran at once while measuring `flops` (contention included) */
    double flops_alone;   /* GEMM FLOP/s of one rank running alone */
    double p2p_bw;        /* point-to-point bytes/s (dl_send / dl_recv, one direction) */
    double p2p_lat;       /* point-to-point seconds per message */
    double nongemm_ratio; /* seconds of non-GEMM work per second of GEMM in a training step */
    double
        sync_cost; /* seconds per blocking collective in a step beyond its bytes (rendezvous of busy ranks) */
    double nongemm_contention; /* non-GEMM time with `ranks` ranks at once / alone */
} dl_plan_hw;

/* "a100", "h100", "b200" (case-insensitive). DL_EINVAL for an unknown name. */
int dl_plan_hw_preset(const char *name, dl_plan_hw *hw);
const char *dl_plan_hw_preset_name(int i);
int dl_plan_hw_check(const dl_plan_hw *hw);

/* Hardware profile file (written by `distlab-plan calibrate`, read by --hardware FILE):
 *
 *   # comment lines and blank lines are ignored; '#' also starts a trailing comment
 *   distlab-hw-profile = 1          (format version; optional, must be 1 when present)
 *   name = h100
 *   flops = 989e12                  (FLOP/s)
 *   mfu = 0.4                       (optional, default 1: the file's flops is what a step gets)
 *   mem_bytes = 80e9
 *   hbm_bw = 3.35e12                (optional, default 0 = unknown)
 *   intra_bw = 450e9                (bytes/s per direction)
 *   inter_bw = 50e9
 *   intra_lat = 0                   (optional, seconds)
 *   inter_lat = 0                   (optional)
 *   gpus_per_node = 8
 *   ranks = 2                       (optional, calibrate: ranks measured at once)
 *   flops_alone = 30e9              (optional: GEMM FLOP/s of one rank alone)
 *   p2p_bw = 5e9                    (optional: dl_send/dl_recv bytes/s)
 *   p2p_lat = 5e-6                  (optional: seconds per message)
 *   nongemm_ratio = 0.8             (optional: non-GEMM s per GEMM s of a training step)
 *   sync_cost = 2e-4                (optional: seconds per blocking collective beyond its bytes)
 *   nongemm_contention = 1.5        (optional: non-GEMM time with `ranks` at once / alone)
 *
 * one `key = value` per line, numbers as strtod reads them. Unknown keys, repeated keys, missing
 * required keys (flops, mem_bytes, intra_bw, inter_bw, gpus_per_node) and bad numbers are
 * DL_EINVAL with the file name and line. */
int dl_plan_hw_load(const char *path, dl_plan_hw *hw);
/* Parse the same format from a string (`origin` names it in messages). */
int dl_plan_hw_parse(const char *text, const char *origin, dl_plan_hw *hw);
/* Write *hw in that format (every key; the optional calibration keys only when non-zero). DL_ESYS if the write fails. */
int dl_plan_hw_write(FILE *f, const dl_plan_hw *hw);
/* BF16 operations per byte moved over NVLink in both directions: flops / (2 * intra_bw)
 * (H100: 989e12 / 900e9 = 1099, the lecture's "about 1100"). */
double dl_plan_ops_per_byte(const dl_plan_hw *hw);

/* ---------------------------------------------------------------------------------------- */
/* Assumptions                                                                               */

typedef enum dl_plan_link {
    DL_PLAN_LINK_AUTO =
        0, /* NVLink if the group lies inside a node (Megatron rank order), else IB */
    DL_PLAN_LINK_INTRA = 1,
    DL_PLAN_LINK_INTER = 2
} dl_plan_link;

typedef enum dl_plan_schedule { DL_PLAN_1F1B = 0, DL_PLAN_GPIPE = 1 } dl_plan_schedule;

typedef struct dl_plan_opts {
    double flops_per_token;    /* model FLOPs per token per parameter: 6 (2 forward + 4 backward).
                             * MFU counts model FLOPs, so recomputation hides inside the MFU */
    double mfu;                /* > 0 overrides the hardware's MFU (the presets carry 0.40) */
    double weight_bytes;       /* 2: BF16 weights */
    double grad_bytes;         /* 2: BF16 gradients */
    double optim_bytes;        /* K = 12: FP32 master weights + Adam m and v */
    double grad_comm_bytes;    /* 2: gradients travel in BF16 */
    double act_bytes;          /* 2: bytes per stored / sent activation value (BF16) */
    int recompute;             /* 1: full recomputation, a layer stores only its input (s*b*h) */
    int seq_parallel;          /* 1: stored activations are split over t (Korthikanti's sequence
                             * parallelism); 0: the layer input is replicated on the t GPUs */
    dl_plan_schedule schedule; /* 1F1B: the first stage holds min(p, m) micro-batches; GPipe m */
    int tp_allreduces;    /* all-reduces per layer per micro-batch: 4 (2 forward, 2 backward) */
    int zero_stage;       /* 0..3; the search's default 1 (optimizer states split over d) */
    dl_plan_link tp_link; /* INTRA (NVLink) */
    dl_plan_link pp_link; /* INTER (InfiniBand) */
    dl_plan_link dp_link; /* INTER */
    double mem_limit;     /* > 0: fit against this instead of the hardware's memory */
    dl_plan_link ep_link; /* INTER: the all-to-alls of expert parallelism cross nodes (the
                           * lecture's "cross-node" 0.32) */
} dl_plan_opts;

/* The defaults written beside each field (BF16 mixed precision, K = 12, 1F1B, ZeRO 1). */
void dl_plan_opts_init(dl_plan_opts *o);

/* A parallel layout. */
typedef struct dl_plan_layout {
    int t, p, d;       /* tensor, pipeline, data parallel sizes */
    int v;             /* interleaved virtual stages per GPU (1 = plain 1F1B) */
    int micro_batch;   /* sequences per micro-batch */
    long global_batch; /* sequences per step (all of d) */
    int seq;           /* tokens per sequence (0: the model's) */
    int e;             /* expert parallelism (0 or 1: none): each MoE layer's experts spread over
                        * e GPUs of the d data-parallel ones (Megatron, DeepSpeed); the experts'
                        * states shard over the d / e GPUs holding the same experts */
} dl_plan_layout;

/* Check the layout against the model (t divides heads and kv_heads, p <= layers, v >= 1 and
 * p * v <= layers when v > 1, seq >= 0, global batch a multiple of d * micro_batch; e > 1 only
 * with experts, dividing d and the experts) and, if hw is given, t <= GPUs per node and dividing
 * it. */
int dl_plan_layout_check(const dl_plan_model *m, const dl_plan_hw *hw, const dl_plan_layout *l);

/* ---------------------------------------------------------------------------------------- */
/* Memory                                                                                    */

/* weight + grad + optimizer bytes per parameter (16 by default). */
double dl_plan_bytes_per_param(const dl_plan_opts *o);

/* Activation bytes one layer stores for a micro-batch of b sequences of s tokens on one of t
 * tensor-parallel GPUs. Without recomputation, Korthikanti et al. (2022):
 * s*b*h*(34 + 5*a*s/h) / t with sequence parallelism, s*b*h*(10 + 24/t + 5*a*s/(h*t)) without
 * (both assume 2-byte values; t = 1 gives the lecture's 2.87 GB per GPT-3 layer). With full
 * recomputation only the layer input: s*b*h*act_bytes, divided by t if seq_parallel. */
double dl_plan_act_layer_bytes(const dl_plan_model *m, const dl_plan_opts *o, int s, int b, int t,
                               int recompute);

/* Model states (weights, grads, optimizer) per GPU for Psi parameters split over `shards`
 * model-parallel GPUs (t*p) with ZeRO `stage` over nd data-parallel GPUs:
 * stage 0 (w+g+K)Psi', 1 (w+g)Psi' + K Psi'/nd, 2 w Psi' + (g+K)Psi'/nd, 3 (w+g+K)Psi'/nd,
 * Psi' = Psi/shards. Returns bytes, or a negative value for bad arguments. */
double dl_plan_state_bytes(double psi, const dl_plan_opts *o, int shards, int stage, int nd);

typedef struct dl_plan_mem {
    double params;                /* Psi */
    double weights, grads, optim; /* bytes per GPU */
    double states;                /* weights + grads + optim */
    double act_layer;             /* bytes one layer stores per micro-batch on one GPU */
    int stage_layers;             /* layers on the first stage: ceil(layers / p) */
    int inflight;                 /* micro-batches whose activations the first stage holds */
    double act;                   /* act_layer * stage_layers * inflight */
    double total;
    double capacity;      /* the memory it must fit in */
    int fits;             /* total <= capacity */
    int micro_batches;    /* m = global_batch / (d * micro_batch) */
    double expert_params; /* Psi_E (0 for a dense model) */
    double expert_states; /* of `states`, the experts': Psi_E / (t p e) per GPU, ZeRO over d / e */
} dl_plan_mem;

/* Memory per GPU of the first pipeline stage (the fullest) for a layout. A bare parameter count
 * gives model states only (act = 0). With experts: the dense Psi - Psi_E over t p GPUs and ZeRO
 * over d (dl_plan_state_bytes), the experts' Psi_E over t p e GPUs (each of the e GPUs holds E/e
 * experts; experts split over t like the dense MLP) and ZeRO over the d / e GPUs holding the
 * same experts. Activations are the dense model's (with full recomputation a layer's input). */
int dl_plan_memory(const dl_plan_model *m, const dl_plan_hw *hw, const dl_plan_opts *o,
                   const dl_plan_layout *l, dl_plan_mem *out);

/* GPUs of `capacity` bytes needed to hold `bytes`: ceil(bytes / capacity). */
long dl_plan_gpus_needed(double bytes, double capacity);

/* ---------------------------------------------------------------------------------------- */
/* Communication                                                                             */

/* Bytes one rank sends in a ring all-reduce of `bytes` on n ranks: 2(n-1)/n * bytes
 * (reduce-scatter and all-gather are half of it each). */
double dl_plan_allreduce_sent(int n, double bytes);
/* Time of that all-reduce on a link of `bw` bytes/s and `lat` s per hop: 2(n-1)(lat + bytes/(n bw)). */
double dl_plan_allreduce_time(int n, double bytes, double bw, double lat);
/* Bandwidth and latency of the link a group uses (resolving AUTO from the layout). kind: 0 tp,
 * 1 pp, 2 dp, 3 ep. */
void dl_plan_link_of(const dl_plan_hw *hw, const dl_plan_opts *o, const dl_plan_layout *l, int kind,
                     double *bw, double *lat, int *inter);

/* The all-to-alls of one MoE layer for one micro-batch on one GPU, expert parallelism e, uniform
 * routing (every expert receives k n / E of the n tokens' choices: none dropped for a capacity
 * factor >= 1, a fraction 1 - C dropped below). */
typedef struct dl_plan_a2a {
    double tokens;       /* n: tokens a GPU routes: s b, / t with sequence parallelism */
    double kept;         /* choices admitted: min(1, C) (1 without a limit) */
    double payload;      /* one dispatch's bytes, own block included: n k kept h act_bytes (what
                          * distlab-train counts: 4 payloads per layer per micro-batch) */
    double sent;         /* of which leave the GPU: payload (e-1)/e */
    double fwd_sent;     /* forward, dispatch + combine: 2 sent (the lecture's 235 MB) */
    double step_sent;    /* forward and backward: 4 sent */
    double fwd_time;     /* 2 (sent / bw + (e-1) lat) on the ep link */
    double expert_flops; /* forward FLOPs of a GPU's experts: n k kept 2 (3 if gated else 2) h F */
    double fwd_compute;  /* expert_flops / (flops x MFU) */
    double ratio;        /* fwd_time / fwd_compute (the lecture's 0.32) */
    int inter;           /* the ep link is InfiniBand */
} dl_plan_a2a;

/* The all-to-alls of one MoE layer of layout l (l->e GPUs; e = 1 moves nothing off the GPU). */
int dl_plan_moe_a2a(const dl_plan_model *m, const dl_plan_hw *hw, const dl_plan_opts *o,
                    const dl_plan_layout *l, dl_plan_a2a *out);

typedef struct dl_plan_comm_report {
    double params;     /* Psi */
    long tokens;       /* tokens per step (all GPUs) */
    int micro_batches; /* m */
    double compute;    /* seconds of compute per step (no bubble) */
    /* data parallelism: gradient all-reduce of Psi/(t p) parameters over d GPUs */
    double dp_grad_bytes; /* gradient bytes each GPU contributes */
    double dp_sent;       /* bytes each GPU sends per step (ZeRO-3: 3/2 of the all-reduce) */
    double dp_time_intra, dp_time_inter;
    int dp_inter; /* 1 if the layout's DP link is InfiniBand */
    /* tensor parallelism, per layer per micro-batch */
    double tp_msg_bytes;     /* one all-reduce: s*b*h*act_bytes */
    double tp_layer_sent;    /* bytes each GPU sends per layer: tp_allreduces * 2(t-1)/t * msg */
    double tp_layer_time;    /* on the TP link */
    double tp_layer_compute; /* compute of one layer for one micro-batch on one GPU */
    double tp_step_time;     /* all layers of the stage, all micro-batches */
    /* pipeline: activation forward, gradient backward between neighbouring stages */
    double pp_msg_bytes; /* s*b*h*act_bytes per micro-batch per direction */
    double pp_step_time; /* 2 m messages on the PP link */
    /* ZeRO: elements each GPU sends per step, in units of Psi' (N-1)/N: 2 for stages 0-2, 3 */
    double zero_factor[4];
    /* mixture of experts: dp_grad_bytes are then the dense gradients; the experts' reduce over
     * the d / e GPUs holding the same experts (expert-data-parallel), on the dp link */
    double edp_grad_bytes; /* Psi_E / (t p e) x grad_comm_bytes */
    double edp_sent, edp_time;
    int moe_layers;       /* on the first stage: the MoE layers among its ceil(layers / p) */
    dl_plan_a2a a2a;      /* one MoE layer, one micro-batch */
    double a2a_step_sent; /* a2a.step_sent x moe_layers x m */
    double a2a_step_time; /* 2 a2a.fwd_time x moe_layers x m (backward as forward) */
} dl_plan_comm_report;

/* Communication of layout l per training step: the report's fields, for model m on hardware hw. */
int dl_plan_comm(const dl_plan_model *m, const dl_plan_hw *hw, const dl_plan_opts *o,
                 const dl_plan_layout *l, dl_plan_comm_report *out);

/* ---------------------------------------------------------------------------------------- */
/* ZeRO (Rajbhandari et al. 2020, Figure 1)                                                  */

typedef struct dl_plan_zero_row {
    int stage;           /* 0 baseline, 1 P_os, 2 P_os+g, 3 P_os+g+p */
    const char *name;    /* "baseline", "P_os", "P_os+g", "P_os+g+p" */
    const char *formula; /* "(2+2+K)Psi", ... */
    double bytes;        /* per GPU */
    double comm_factor;  /* per-GPU traffic in units of Psi (N-1)/N: 2, 2, 2, 3 */
} dl_plan_zero_row;

/* The four rows for psi parameters, K bytes of optimizer state, nd GPUs (2-byte weights and grads
 * from the paper; opts NULL) or the weight/grad bytes of *o. */
int dl_plan_zero_table(double psi, double K, int nd, const dl_plan_opts *o,
                       dl_plan_zero_row rows[4]);

/* ---------------------------------------------------------------------------------------- */
/* Pipeline                                                                                  */

/* Bubble fraction (p-1)/(v*m + p-1); p = 1 gives 0. Negative for bad arguments. */
double dl_plan_bubble(int p, long m, int v);
/* Smallest m with bubble < target (0 < target < 1); -1 for bad arguments. */
long dl_plan_min_microbatches(int p, int v, double target);
/* Micro-batches whose activations stage s (1..p) holds at most: GPipe m; 1F1B min(p-s+1, m). */
long dl_plan_inflight(dl_plan_schedule sch, int p, long m, int s);
/* Weight updates between a micro-batch's forward and backward on stage s (1..p) in steady 1F1B
 * without flushes (PipeDream): p - s. */
int dl_plan_staleness(int p, int s);

/* Split n layers with costs[0..n-1] (>= 0) into k contiguous non-empty stages minimising the
 * slowest stage (dynamic programming, O(k n^2)). first[0..k] receives the stage boundaries
 * (stage j = layers first[j] .. first[j+1]-1; first[0] = 0, first[k] = n); ties go to the
 * earliest boundary, which gives the lecture's 0-1, 2-5, 6-9, 10-11. *max_cost may be NULL. */
int dl_plan_partition(const double *costs, int n, int k, int *first, double *max_cost);
/* The even split (n/k layers each, the first n mod k stages one more) for comparison. */
int dl_plan_partition_even(const double *costs, int n, int k, int *first, double *max_cost);

/* ---------------------------------------------------------------------------------------- */
/* Step time and the 3-D search (lecture §6.4, code 05)                                      */

typedef struct dl_plan_step {
    dl_plan_layout layout;
    dl_plan_mem mem;
    int micro_batches;
    double bubble;
    double compute;    /* compute / (1 - bubble), on the slowest stage (ceil(layers/p) layers) */
    double tp, pp, dp; /* communication seconds, not overlapped (dp: with the experts' edp) */
    double ep;         /* the MoE layers' all-to-alls */
    double total;
} dl_plan_step;

/* Step time of layout l: compute stretched by the bubble plus the tp, pp, dp and ep communication
 * (not overlapped), and its memory; the model needs its shape (layers, hidden size). */
int dl_plan_step_time(const dl_plan_model *m, const dl_plan_hw *hw, const dl_plan_opts *o,
                      const dl_plan_layout *l, dl_plan_step *out);

/* Enumerate t * p * d = gpus: t divides the GPUs per node and the (kv) heads, micro-batch as given
 * in `base` (the lecture: 1 sequence), p <= layers, d * micro_batch divides the global batch;
 * with experts, every e dividing d and the experts (base->e ignored), else e = 1.
 * gpus must be a multiple of the GPUs per node. Results sorted by total time (ties: t, p, d, e),
 * at most `cap` written to out; *n receives how many there are. */
int dl_plan_search(const dl_plan_model *m, const dl_plan_hw *hw, const dl_plan_opts *o, int gpus,
                   const dl_plan_layout *base, dl_plan_step *out, int cap, int *n);

#ifdef __cplusplus
}
#endif
#endif
