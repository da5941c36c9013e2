/* distlab: the training engine: data, tensor and pipeline parallelism over rank threads.
 *
 * World = dp x tp x pp ranks (tp fastest, Megatron's order; include/distlab/pipe.h for the
 * pipeline). Each rank holds its tp shard of its stage's layers (dl_gpt), takes its contiguous
 * share of every global batch by global sample index, accumulates gradients over its
 * micro-batches, all-reduces them over the dp group in buckets launched as soon as their
 * gradients are final (on the rank's communication thread with `overlap`), clips by the global
 * norm (reduced over the tp and pp groups, which hold the sharded parts), and takes an AdamW step
 * with linear warm-up and cosine decay. Every layout trains the model one rank trains.
 * With ZeRO (`zero.stage`) each unit (embeddings, layer, head) is padded to a multiple of dp and
 * cut into dp blocks; stage 1 reduce-scatters each unit's gradient as soon as it is final, each
 * dp rank updates its blocks with AdamW state for them only and the updated parameters are
 * all-gathered; stage 2 reduce-scatters each unit's gradient during every backward into a
 * shard-sized gradient (the full gradient is never held); stage 3 also keeps only the
 * parameter blocks and all-gathers each unit before its forward and its backward
 * (lib/parallel/zero.h; docs/ARCHITECTURE.md, "The trainer"). DL_BF16 trains in mixed
 * precision; a step whose gradient norm is not finite is skipped (step.skipped).
 *
 * The options and the result are grouped by concern, one struct each: a feature adds its own
 * group. */
#ifndef DISTLAB_TRAIN_H
#define DISTLAB_TRAIN_H

#include <stdint.h>
#include <stdio.h>
#include "distlab/gpt.h"

#ifdef __cplusplus
extern "C" {
#endif

struct dl_train_step;

/* Precision and recomputation. */
typedef struct dl_train_precision {
    dl_dtype dtype; /* DL_F32 (default), DL_F64, or DL_BF16: mixed precision (bf16 parameters and
                     * gradients, f32 compute, fp32 master weights and AdamW moments: K = 12) */
    dl_recompute recompute;
} dl_train_precision;

/* The mesh: world = dp * tp * pp. */
typedef struct dl_train_layout {
    int dp, tp;
    int pp; /* pipeline stages (0 or 1: none) */
    int ep; /* expert parallelism inside dp (0 or 1: none; needs model.experts; divides dp) */
} dl_train_layout;

/* G = dp * microbatches * micro sequences per step (see dl_train_resolve). */
typedef struct dl_train_batch {
    int global, micro, microbatches;
} dl_train_batch;

/* AdamW, its learning-rate schedule and the initialisation. */
typedef struct dl_train_optim {
    int steps;
    double lr, min_lr;                            /* peak and final learning rate (cosine decay) */
    int warmup;                                   /* linear warm-up steps */
    double beta1, beta2, eps, weight_decay, clip; /* clip <= 0: no clipping */
    uint64_t seed;                                /* parameters */
} dl_train_optim;

/* The collectives. */
typedef struct dl_train_comm {
    double bucket_mb; /* gradient bucket size in MiB (0: one bucket per layer boundary) */
    int overlap;      /* all-reduce buckets on the communication thread */
    dl_algo algo;     /* collective algorithm for every communicator */
} dl_train_comm;

/* ZeRO over the dp group. */
typedef struct dl_train_zero {
    int stage; /* 0 none, 1 optimizer state sharded, 2 gradients too, 3 parameters too; no-op with
                * dp = 1 */
} dl_train_zero;

/* The pipeline (layout.pp > 1; include/distlab/pipe.h). */
typedef struct dl_train_pipeline {
    int schedule;              /* dl_sched_kind: GPIPE (default when 0), 1F1B, INTERLEAVED, ASYNC,
                                * NAIVE */
    int virtual_stages;        /* interleaved: model chunks per stage (0: 2) */
    int weight_stashing;       /* async: each backward uses the weights its forward used */
    const double *layer_costs; /* [layers]: split layers to stages minimising the slowest stage
                                * (the lecture's dynamic program); NULL: evenly by layer count */
    const char *schedule_file; /* a schedule in torch.distributed.pipelining's CSV form
                                * (dl_sched_load_csv) instead of `schedule`: its rows must be pp,
                                * its micro-batches m; NULL: none */
    int schedule_letters;      /* its letters: DL_SCHED_LETTERS_AUTO, _NEW or _OLD */
    int schedule_mem_limit;    /* > 0: the activation slots a stage may hold; a schedule file
                                * that breaks it is refused */
    int token_chunks;          /* token-level pipelining (TeraPipe): each sequence cut into this
                                * many slices (equal: dividing model.seq), a slice of a
                                * micro-batch the unit the schedule moves, GPipe's order
                                * (dl_sched_terapipe) or 1F1B's (dl_sched_1f1b_tokens); each
                                * stage keeps the earlier slices' keys and values (memory
                                * category kvcache). 0 or 1: whole sequences */
    const int *token_lens;     /* [token_chunks]: the slices' lengths, unequal (summing to
                                * model.seq: TeraPipe's dynamic program, distlab-train
                                * --token-chunks auto); NULL: equal */
} dl_train_pipeline;

/* The corpus. */
typedef struct dl_train_data {
    const char *path;   /* NULL: the synthetic corpus */
    uint64_t seed;      /* of the synthetic corpus */
    uint64_t max_bytes; /* a file larger than this is refused (0: 1 GiB, DL_DATA_DEFAULT_MAX;
                         * dl_data_opts.max_bytes) */
} dl_train_data;

/* Validation. */
typedef struct dl_train_eval {
    int every;   /* steps between validation evaluations (0: only at the end) */
    int windows; /* validation windows per evaluation (0: all) */
    int only;    /* with ckpt.load: evaluate, don't train */
} dl_train_eval;

/* Checkpoints: the parameters (save, load: safetensors, unsharded, any layout) and the full
 * training state (dir, resume: docs/CHECKPOINTS.md). */
typedef struct dl_train_ckpt {
    const char *save, *load; /* NULL: none */
    const char *dir;         /* full-state checkpoints dir/step-NNNNNNN (NULL: none) */
    int save_every;          /* with dir: a checkpoint every N steps (0: none on a schedule) */
    int keep;                /* with dir: complete checkpoints kept, the newest (0: all) */
    int save_at_end;         /* with dir: one after the last step */
    const char *resume;      /* continue from this checkpoint directory, or the newest complete
                              * one under it: the same model, dtype and global batch, any layout
                              * (resharded on load; the steps before it are not run;
                              * optim.steps stays the total) */
    int sync;                /* with dir: write each checkpoint at its step boundary (0: a
                              * snapshot there, written by a thread per rank while training goes
                              * on; docs/CHECKPOINTS.md) */
    int on_save_error;       /* with dir: a failed save (a full disk, an unwritable directory)
                              * stops the run with its error (DL_SAVE_ERROR_STOP, the default)
                              * or is reported and training goes on (DL_SAVE_ERROR_CONTINUE) */
} dl_train_ckpt;

enum { DL_SAVE_ERROR_STOP = 0, DL_SAVE_ERROR_CONTINUE = 1 };

/* The trace of every rank's events. */
typedef struct dl_train_trace {
    const char *path;      /* write every rank's events as Chrome trace JSON (Perfetto) */
    int timeline;          /* keep the measured ASCII timeline of the last step (output.timeline) */
    int first, last;       /* trace only steps first..last (1-based; 0, 0: all): the trace file is
                           * written, and the timeline (of last) made, as soon as every rank is
                           * past last, not at the run's end */
    struct dl_trace *into; /* record into this trace (dp x tp x pp tracks; the caller creates and
                            * frees it) instead of one of the run's own */
} dl_train_trace;

/* What the run hands back beyond the losses, and its progress. */
typedef struct dl_train_output {
    FILE *log;              /* progress lines (NULL: quiet) */
    int log_every;          /* progress line every N steps (0: none) */
    int sample;             /* bytes to generate after training (0: none) */
    const char *prompt;     /* the sample's first bytes (NULL: the validation split's first 16;
                             * its last seq bytes when longer) */
    double temperature;     /* the sample's: each byte drawn with probability p^(1/temperature),
                             * normalised (0: 1, the model's own distribution; smaller: surer) */
    int want_params;        /* gather the final parameters (f64, unsharded) into the result */
    int want_grads;         /* gather the last step's gradients (f64, unsharded, before clipping) */
    const char *dump_grads; /* write step 1's gradients (reduced, before clipping) to this file in
                             * the safetensors layout of ckpt.save, and its global batch to
                             * FILE.tokens (int32, host byte order = little-endian on x86-64:
                             * G*T inputs, then G*T targets) */
    /* Called once per completed step, in order, with the record res->steps will hold (ms: the
     * slowest rank), as soon as every rank of this process has finished that step: on rank 0's
     * thread while training (under MPI: after the run, when every process's figures are in),
     * and for the steps still owed when the run ends, on the caller's thread, also after a
     * failure. Return DL_OK to go on; another status (its message set with dl_error) stops the
     * run with it. NULL: none. */
    int (*on_step)(const struct dl_train_step *step, void *arg);
    void *on_step_arg;
} dl_train_output;

/* The simulated machine. */
typedef struct dl_train_machine {
    uint64_t gpu_mem;         /* arena capacity per rank (0: unlimited) */
    double timeout_s;         /* watchdog */
    const char *topology;     /* synthetic topology for grouping, or NULL */
    const char *inject_fault; /* a fault to inject (NULL: none), distlab-train's --inject-fault:
                               * "rank=R,at=step:N|coll:dp|tp|pp|world:N,kind=error|hang|
                               * slow:MS|crash" (docs/CHECKPOINTS.md); a crash exits the
                               * process with status 3 */
} dl_train_machine;

/* The options, one group per concern (dl_train_opts_init: the defaults). */
typedef struct dl_train_opts {
    dl_gpt_config model; /* the model's shape */
    dl_train_precision precision;
    dl_train_layout layout;
    dl_train_batch batch;
    dl_train_optim optim;
    dl_train_comm comm;
    dl_train_zero zero;
    dl_train_pipeline pipeline;
    dl_train_data data;
    dl_train_eval eval;
    dl_train_ckpt ckpt;
    dl_train_trace trace;
    dl_train_output output;
    dl_train_machine machine;
} dl_train_opts;

/* Defaults: a 2-layer model (d_model 128, 4 heads, 64 positions), f32, dp = tp = 1, 200 AdamW
 * steps (lr 3e-3 decaying to 3e-4, 20 warm-up steps, clip 1), the synthetic corpus. */
void dl_train_opts_init(dl_train_opts *o);

/* Complete the batch sizes from any two of batch.global, batch.micro and batch.microbatches (0
 * means unset; global alone gives micro = global / dp and microbatches = 1; otherwise a missing
 * micro defaults to 8 and microbatches to 1) and check the whole configuration: the common
 * checks, then each strategy's own. DL_EINVAL with one line saying what is wrong and what would
 * fit. */
int dl_train_resolve(dl_train_opts *o, int nranks);

typedef struct dl_train_step {
    int step;        /* 1-based */
    double loss;     /* mean training loss of the global batch */
    double val_loss; /* NAN when not evaluated at this step */
    double lr, grad_norm;
    double ms; /* wall time of the step (slowest rank) */
    double tokens_per_s;
    int skipped; /* the gradient was not finite: no update (mixed-precision guard) */
    /* a mixture of experts (moe_layers 0: none; NAN losses): the step's auxiliary and z losses
     * (as the objective has them: averaged over the global batch's sequences and the MoE
     * layers), per MoE layer and expert the global batch's choices routed to it and of them
     * dropped ([moe_layers * experts]), per rank the bytes it sent in the all-to-alls and its
     * time in the combines ([nranks]) */
    double aux_loss, z_loss;
    int moe_layers, experts, nranks;
    const int64_t *routed, *dropped;
    const double *a2a_bytes, *combine_wait_ms;
} dl_train_step;

/* The optimisation: the last step's loss and the steps not taken. */
typedef struct dl_train_optim_result {
    double final_loss;
    int skipped_steps; /* steps skipped for a non-finite gradient */
} dl_train_optim_result;

/* Validation. */
typedef struct dl_train_eval_result {
    double final_val_loss;
    int windows; /* validation windows of the last evaluation */
} dl_train_eval_result;

/* The corpus. */
typedef struct dl_train_data_result {
    double floor; /* entropy rate of the synthetic corpus (NAN for a file) */
} dl_train_data_result;

/* Throughput. */
typedef struct dl_train_speed {
    double tokens_per_s;          /* median over steps after the first */
    double ms_per_step;           /* median */
    double gemm_gflops;           /* GFLOP/s of replaying rank 0's GEMMs of one step alone on one
                                   * thread */
    double model_gflops_per_rank; /* model FLOP/s per rank (median step) */
} dl_train_speed;

/* Bytes rank 0 sent per step by group and purpose (dp replicas are symmetric). */
typedef struct dl_train_comm_result {
    double dp_grads, tp_activations, loss_and_norm;
    double dp_params; /* parameter all-gathers over the dp group (ZeRO) */
    double dp_elems;  /* elements sent over the dp group (gradients and parameters: dp_grads +
                       * dp_params bytes / storage size) */
} dl_train_comm_result;

/* Memory, measured on rank 0 unless said (model state = the params, grads and optimizer peaks of
 * `peak`; the unit buffers are comm/other). */
typedef struct dl_train_memory {
    uint64_t *peak;          /* [nranks * DL_MEM_NCATEGORIES] peak bytes per rank and category */
    uint64_t grad_bytes;     /* one rank's gradient buffer */
    uint64_t unit_bytes;     /* the model's unit buffers (gathered parameters, bf16 working
                              * copies, gradients handed to the reduce-scatter) */
    uint64_t gathered_bytes; /* of which gathered parameters (stage 3: the largest unit's) */
} dl_train_memory;

/* ZeRO's shards (the stage that ran: 0 when zero.stage is 0 or dp is 1): each rank's flat buffer
 * of memory.grad_bytes / dtype-size = P elements padded to padded = dp x shard. */
typedef struct dl_train_zero_result {
    int stage;
    int64_t padded, padding, shard;
    int units; /* units of rank 0's buffer (each padded to a multiple of dp) */
} dl_train_zero_result;

/* The pipeline (layout.pp > 1), its figures the pipeline's own: per stage s (measured on its
 * first rank). */
typedef struct dl_train_pipeline_result {
    int stages, v;
    int *bounds;           /* [stages * v + 1]: virtual stage k holds layers bounds[k] ..
                          * bounds[k+1]-1 */
    double *bubble;        /* [stages] 1 - busy / wall of the pipeline part of a step, median over
                          * steps after the first */
    double bubble_total;   /* 1 - sum(busy) / (stages x max wall), median over steps */
    double bubble_theory;  /* the schedule's own: dl_sched_bubble, its simulation with every
                           * forward 1 and every backward 2 (async: the continuous pipeline's
                           * steady state, dl_sched_async_continuous over the first window) */
    double bubble_window;  /* async: that simulation's bubble over the whole first window
                           * (warm-up and drain once); NaN otherwise */
    int window;            /* async: the first window's steps (to the first quiet point) */
    double bubble_1f1b;    /* async: 1F1B's own for the same p and m (a flushed step); NaN
                           * otherwise */
    double bubble_paper;   /* the pipeline papers' formula at F = B = W (dl_sched_bubble_theory):
                           * 1F1B (p-1)(F+B+W), ZB-H1 (p-1)(F+B-W), ZB-H2 and ZB-V about 0;
                           * NaN for schedules without one */
    int *slots;            /* [stages] activation slots (micro-batch chunks held at once) */
    int *max_gap;          /* [stages] async: most weight updates between a micro-batch's forward
                           * and the weights its backward used (0 with stashing) */
    double bytes_per_step; /* activations and gradients rank 0 sent over the pipeline */
    double engine_us;      /* median engine overhead per action (dispatch, hand-off staging) */
    double engine_p90_us;  /* its 90th percentile over the steps and ranks (its spread) */
} dl_train_pipeline_result;

/* What output asked for. */
typedef struct dl_train_output_result {
    double *params; /* output.want_params: [nparams] unsharded, layout order of tp = 1 */
    double *grads;  /* output.want_grads: same */
    char *sample;   /* generated text (output.sample > 0), NUL-terminated */
    char *timeline; /* trace.timeline: the last step's grid, legend, every stage's actions */
} dl_train_output_result;

/* One full-state save, as it went. */
typedef struct dl_train_save {
    int step;             /* the steps it holds */
    int ok;               /* 1: complete; 0: failed (ckpt.on_save_error continue went on) */
    double stall_ms;      /* the step boundaries' extra time for it (the snapshot, the waits for
                           * the writers, the save's agreements; a sync save: all of it; not the
                           * run's end's wait for it), the slowest rank's */
    double write_ms;      /* the writing: the slowest rank's file, then rank 0's manifest and
                           * commit */
    double writer_cpu_ms; /* CPU time of the threads that wrote it, summed over the ranks */
    uint64_t bytes;       /* the files' bytes (the manifest not counted) */
} dl_train_save;

/* Full-state checkpoints. */
typedef struct dl_train_ckpt_result {
    int resumed_from;    /* steps done by the checkpoint resumed (0: a fresh run) */
    int saves;           /* checkpoints written */
    int last_saved;      /* the step of the last one (0: none) */
    int stopped;         /* the signal whose stop request ended the run early (0: none) */
    int failed;          /* saves that failed (with on_save_error continue) */
    int nrecords;        /* every save tried, in order: */
    dl_train_save *save; /* [nrecords] */
} dl_train_ckpt_result;

/* The run's figures, grouped as the options are. */
/* A mixture of experts' figures per step (layers 0: none), rank 0's tables: per step s, MoE
 * layer i and expert e, [(s * layers + i) * experts + e]; per rank r, [s * nranks + r]; hash:
 * per step and layer the sum over the global batch's sequences of a hash of their routing
 * (choices and admissions: equal on every layout that routes alike). */
typedef struct dl_train_moe_result {
    int layers, experts;
    int *layer; /* [layers] the model layer of each */
    int64_t *routed, *dropped;
    double *aux, *z; /* [steps] */
    uint64_t *hash;  /* [steps * layers] */
    double *a2a_bytes, *combine_wait_ms;
} dl_train_moe_result;

typedef struct dl_train_result {
    int nranks, nsteps;
    dl_train_step *steps; /* [nsteps] */
    int64_t nparams;
    dl_train_optim_result optim;
    dl_train_eval_result eval;
    dl_train_data_result data;
    dl_train_speed speed;
    dl_train_comm_result comm;
    dl_train_memory memory;
    dl_train_zero_result zero;
    dl_train_pipeline_result pipeline;
    dl_train_output_result output;
    dl_train_ckpt_result ckpt;
    dl_train_moe_result moe;
} dl_train_result;

/* Train (or evaluate) with o->layout.dp * tp * pp rank threads. The result is filled even when the run
 * fails part-way (steps done so far); free it with dl_train_result_free. */
int dl_train_run(const dl_train_opts *o, dl_train_result *res);
void dl_train_result_free(dl_train_result *r);

/* Ask the running (or next) dl_train_run to stop: every rank finishes its step, a checkpoint is
 * written when ckpt.dir is set, and the run returns DL_OK with ckpt.stopped = sig (the ranks
 * agree at the step boundary, so all stop after the same step). Without ckpt.dir the request
 * is ignored. Async-signal-safe (a signal handler's call); sig 0 withdraws a request. */
void dl_train_request_stop(int sig);

/* Options from a full-state checkpoint (path: a checkpoint, or a directory of them: the newest).
 * For each option the checkpoint records (the model, dtype, layout, batch, optimizer, data,
 * seed, the checkpoint schedule), named as distlab-train's option ("--d-model"; "beta1" for one it lacks): where
 * given(name, arg) is 0 it takes the checkpoint's value (the micro-batch split only under the
 * checkpoint's dp); where it is 1 and the values differ, a model, dtype, global batch or data
 * option is refused (DL_EINVAL, one line naming the option and both values) and the others (the
 * layout, which reshards, except the async pipeline's outside its --pp, --microbatches and
 * --weight-stashing; the learning-rate schedule, --steps) keep the given value.
 * given NULL: every option counts as given (dl_train_run's check). With given, unless
 * given("--ckpt-dir"), ckpt.dir becomes the directory holding the checkpoint: the continued run
 * saves where the first one did. */
int dl_train_resume_opts(const char *path, dl_train_opts *o,
                         int (*given)(const char *option, void *arg), void *arg);

/* Model FLOPs of one training step of G sequences (forward + backward, attention included,
 * causal half): what "model FLOP/s" and GEMM utilisation count. */
double dl_train_step_flops(const dl_gpt_config *c, int G);

#ifdef __cplusplus
}
#endif
#endif
