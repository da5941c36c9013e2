/* distlab: the training engine: data and tensor parallelism over rank threads.
 *
 * World = dp x tp ranks (tp fastest, Megatron's order). Each rank holds its tp shard of the model
 * (dl_gpt), takes its contiguous share of every global batch by global sample index, accumulates
 * gradients over its micro-batches, all-reduces them over the dp group in buckets launched as soon
 * as their gradients are final (on the rank's communication thread with `overlap`), clips by the
 * global norm (reduced over the tp group, which holds the sharded parts), and takes an AdamW step
 * with linear warm-up and cosine decay. Every layout trains the model one rank trains.
 * With ZeRO (`zero`) each unit (embeddings, layer, head) is padded to a multiple of dp and cut
 * into dp blocks; stage 1 reduce-scatters each unit's gradient as soon as it is final, each dp
 * rank updates its blocks with AdamW state for them only and the updated parameters are
 * all-gathered; stage 2 reduce-scatters each unit's gradient during every backward into a
 * shard-sized gradient (the full gradient is never held); stage 3 also keeps only the
 * parameter blocks and all-gathers each unit before its forward and its backward
 * (lib/parallel/zero.h; docs/ARCHITECTURE.md, "The trainer"). DL_BF16 trains in mixed
 * precision; a step whose gradient norm is not finite is skipped (step.skipped). */
#ifndef DISTLAB_TRAIN_H
#define DISTLAB_TRAIN_H

#include <stdint.h>
#include <stdio.h>
#include "distlab/gpt.h"

#ifdef __cplusplus
extern "C" {
#endif

struct dl_train_step;

typedef struct dl_train_opts {
    dl_gpt_config model;
    dl_dtype dtype;   /* DL_F32 (default), DL_F64, or DL_BF16: mixed precision (bf16
                              * parameters and gradients, f32 compute, fp32 master weights and
                              * AdamW moments: K = 12) */
    int dp, tp;       /* world = dp * tp */
    int global_batch; /* G = dp * microbatches * micro_batch (see dl_train_resolve) */
    int micro_batch;
    int microbatches;
    int steps;
    double lr, min_lr;                            /* peak and final learning rate (cosine decay) */
    int warmup;                                   /* linear warm-up steps */
    double beta1, beta2, eps, weight_decay, clip; /* clip <= 0: no clipping */
    uint64_t seed;                                /* parameters */
    dl_recompute recompute;
    double bucket_mb;      /* gradient bucket size in MiB (0: one bucket per layer boundary) */
    int overlap;           /* all-reduce buckets on the communication thread */
    dl_algo algo;          /* collective algorithm for every communicator */
    const char *data_path; /* NULL: the synthetic corpus */
    uint64_t data_seed;
    int eval_every;       /* steps between validation evaluations (0: only at the end) */
    int eval_windows;     /* validation windows per evaluation (0: all) */
    int log_every;        /* progress line every N steps (0: none) */
    uint64_t gpu_mem;     /* arena capacity per rank (0: unlimited) */
    double timeout_s;     /* watchdog */
    const char *topology; /* synthetic topology for grouping, or NULL */
    const char *save_path, *load_path;
    int eval_only;          /* with load_path: evaluate, don't train */
    int sample;             /* bytes to generate after training (0: none) */
    int want_params;        /* gather the final parameters (f64, unsharded) into the result */
    int want_grads;         /* gather the last step's gradients (f64, unsharded, before clipping) */
    const char *dump_grads; /* write step 1's gradients (reduced, before clipping) to this file in
                              * the safetensors layout of --save, and its global batch to
                              * FILE.tokens (int32, host byte order = little-endian on x86-64:
                              * G*T inputs, then G*T targets) */
    FILE *log;              /* progress lines (NULL: quiet) */
    int zero;               /* ZeRO stage over the dp group: 0 none, 1 optimizer state sharded,
                              * 2 gradients too, 3 parameters too; no-op with dp = 1 */
    /* pipeline parallelism (world = dp * tp * pp; include/distlab/pipe.h) */
    int pp;                    /* stages (0 or 1: none) */
    int schedule;              /* dl_sched_kind: GPIPE (default when 0), 1F1B, INTERLEAVED, ASYNC */
    int virtual_stages;        /* interleaved: model chunks per stage (0: 2) */
    int weight_stashing;       /* async: each backward uses the weights its forward used */
    const double *layer_costs; /* [layers]: split layers to stages minimising the slowest stage
                              * (the lecture's dynamic program); NULL: evenly by layer count */
    const char *trace_path;    /* write every rank's events as Chrome trace JSON (Perfetto) */
    int timeline; /* keep the measured ASCII timeline of the last step (res->timeline) */
    int trace_first, trace_last; /* trace only steps trace_first..trace_last (1-based; 0, 0: all):
                              * the trace file is written, and the timeline (of trace_last) made,
                              * as soon as every rank is past trace_last, not at the run's end */
    struct dl_trace *trace;      /* record into this trace (dp x tp x pp tracks; the caller creates
                              * and frees it) instead of one of the run's own */
    int nan_step;                /* test hook: dp rank 0's first micro-batch of this step has a NaN
                              * loss gradient (0: never; not with pp) */
    uint64_t data_max;           /* a data_path file larger than this is refused (0: 1 GiB,
                              * DL_DATA_DEFAULT_MAX; dl_data_opts.max_bytes) */
    /* Called once per completed step, in order, with the record res->steps will hold (ms: the
     * slowest rank), as soon as every rank of this process has finished that step: on rank 0's
     * thread while training (under MPI: after the run, when every process's figures are in),
     * and for the steps still owed when the run ends, on the caller's thread, also after a
     * failure. Return DL_OK to go on; another status (its message set with dl_error) stops the
     * run with it. NULL: none. */
    int (*on_step)(const struct dl_train_step *step, void *arg);
    void *on_step_arg;
} dl_train_opts;

/* Defaults: a 2-layer model (d_model 128, 4 heads, 64 positions), f32, dp = tp = 1, 200 AdamW
 * steps (lr 3e-3 decaying to 3e-4, 20 warm-up steps, clip 1), the synthetic corpus. */
void dl_train_opts_init(dl_train_opts *o);

/* Complete the batch sizes from any two of global_batch, micro_batch and microbatches (0 means
 * unset; global_batch alone gives micro_batch = global_batch / dp and microbatches = 1; otherwise
 * a missing micro_batch defaults to 8 and microbatches to 1) and check the whole configuration. DL_EINVAL with one line saying what is wrong and what would fit. */
int dl_train_resolve(dl_train_opts *o, int nranks);

typedef struct dl_train_step {
    int step;        /* 1-based */
    double loss;     /* mean training loss of the global batch */
    double val_loss; /* NAN when not evaluated at this step */
    double lr, grad_norm;
    double ms; /* wall time of the step (slowest rank) */
    double tokens_per_s;
    int skipped; /* the gradient was not finite: no update (mixed-precision guard) */
} dl_train_step;

typedef struct dl_train_result {
    int nranks, nsteps;
    dl_train_step *steps; /* [nsteps] */
    double floor;         /* entropy rate of the synthetic corpus (NAN for a file) */
    double final_loss, final_val_loss;
    double tokens_per_s; /* median over steps after the first */
    double ms_per_step;  /* median */
    double gemm_gflops;  /* GFLOP/s of replaying rank 0's GEMMs of one step alone on one thread */
    double model_gflops_per_rank; /* model FLOP/s per rank (median step) */
    /* bytes each rank sent per step by group and purpose (rank 0; dp replicas are symmetric) */
    double dp_grad_bytes_per_step, tp_act_bytes_per_step, loss_bytes_per_step;
    uint64_t grad_bytes; /* one rank's gradient buffer */
    uint64_t *peak;      /* [nranks * DL_MEM_NCATEGORIES] peak bytes per rank and category */
    int64_t nparams;
    double *params; /* want_params: [nparams] unsharded, layout order of tp = 1 */
    double *grads;  /* want_grads: same */
    char *sample;   /* generated text (sample > 0), NUL-terminated */
    int eval_windows_used;
    /* ZeRO (the stage that ran: 0 when o->zero is 0 or dp is 1): each rank's flat buffer of
     * grad_bytes / dtype-size = P elements padded to zero_padded = dp x zero_shard */
    int zero;
    int64_t zero_padded, zero_padding, zero_shard;
    double dp_param_bytes_per_step; /* parameter all-gather over the dp group (rank 0) */
    /* pipeline (pp > 1): per stage s (measured on its first rank) */
    int pp, pp_v;
    int *pp_bounds;    /* [pp * v + 1]: virtual stage k holds layers bounds[k] .. bounds[k+1]-1 */
    double *pp_bubble; /* [pp] 1 - busy / wall of the pipeline part of a step, median over
                              * steps after the first */
    double pp_bubble_total;   /* 1 - sum(busy) / (pp x max wall), median over steps */
    double pp_bubble_theory;  /* the lecture's (p - 1) / (v m + p - 1) */
    int *pp_slots;            /* [pp] activation slots (micro-batch chunks held at once) */
    int *pp_max_gap;          /* [pp] async: most weight updates between a micro-batch's forward
                              * and the weights its backward used (0 with stashing) */
    double pp_bytes_per_step; /* activations and gradients rank 0 sent over the pipeline */
    double pp_engine_us;      /* median engine overhead per action (dispatch, hand-off staging) */
    double pp_engine_p90_us;  /* its 90th percentile over the steps and ranks (its spread) */
    char *timeline; /* opts.timeline: the last step's grid, legend, every stage's actions */
    /* ZeRO and mixed precision, measured on rank 0 (model state = the params, grads and
     * optimizer peaks of `peak`; the unit buffers are comm/other) */
    int zero_units;           /* units of rank 0's buffer (each padded to a multiple of dp) */
    double dp_elems_per_step; /* elements rank 0 sent over the dp group per step (gradients and
                              * parameters: dp_grad + dp_param bytes / storage size) */
    uint64_t unit_bytes;      /* the model's unit buffers (gathered parameters, bf16 working
                              * copies, gradients handed to the reduce-scatter) */
    uint64_t gathered_bytes;  /* of which gathered parameters (stage 3: the largest unit's) */
    int skipped_steps;        /* steps skipped for a non-finite gradient */
} dl_train_result;

/* Train (or evaluate) with o->dp * o->tp * o->pp rank threads. The result is filled even when the run
 * fails part-way (steps done so far); free it with dl_train_result_free. */
int dl_train_run(const dl_train_opts *o, dl_train_result *res);
void dl_train_result_free(dl_train_result *r);

/* Model FLOPs of one training step of G sequences (forward + backward, attention included,
 * causal half): what "model FLOP/s" and GEMM utilisation count. */
double dl_train_step_flops(const dl_gpt_config *c, int G);

#ifdef __cplusplus
}
#endif
#endif
