/* The trainer's strategy modules and the interface the step composes them by (docs/ARCHITECTURE.md,
 * "The trainer's step"). Each strategy (ZeRO's sharding, data-parallel buckets, tensor
 * parallelism's rules, the pipeline, ...) is one file with its own small state and a constructor
 * listed once in train/modules.def (the composition, lib/train/compose.c). The interface lives in
 * the parallel layer so that the modules there see nothing of the train layer above it: what they
 * need of the run and of the other modules comes through tr_env; the constructor looks at the options and either adds a
 * module (fills a tr_module) or leaves it empty. The step then calls each phase's hooks over the
 * added modules in the list's order, so the order of modules.def is the order of every sum the
 * hooks extend (the loss: dp, then pp; the gradient norm: dp, tp, pp). */
#ifndef DISTLAB_PARALLEL_MODULE_H
#define DISTLAB_PARALLEL_MODULE_H
#include <stddef.h>
#include <stdint.h>
#include "distlab.h"
#include "distlab/train.h"
#include "distlab/data.h"
#include "parallel/zero.h"
#include "parallel/precision.h"

typedef struct tr_run tr_run; /* the run's tables, shared by the ranks (train/run.h) */
typedef struct tr_comp tr_comp;

/* The composition's fan-outs (train/compose.c), for modules that drive other phases (the plain
 * runner's backward, the pipeline's flush and its async updates): every module's hook in order,
 * stopping at the first error. */
typedef struct tr_calls {
    int (*grads_ready)(size_t first, void *comp); /* a dl_grad_ready_fn */
    int (*has_ready)(const tr_comp *c);           /* some module wants grads_ready */
    /* the gradient's norm, clipping and AdamW at this step's learning rate, after_update */
    int (*norm_update)(tr_comp *c);
} tr_calls;

typedef struct tr_pp_rows tr_pp_rows; /* the pipeline's rows (parallel/pipe_train.h) */

/* What every module reads: fixed at set-up (g and numel from the model's creation on), except
 * step and tr, which the step loop sets. */
typedef struct tr_env {
    const dl_train_opts *o;
    tr_run *R;            /* the train layer's own (opaque here) */
    dl_data *data;        /* the corpus */
    dl_train_result *res; /* the caller's result (rank 0 writes its figures) */
    tr_pp_rows *pp;       /* the pipeline's per-step rows (its runner writes this rank's) */
    dl_ctx *ctx;
    int rank; /* world rank */
    dl_mesh *mesh;
    dl_gpt *g;
    size_t numel;
    tr_prec pr;    /* storage and compute types (parallel/precision.h) */
    int step;      /* 1-based: the step running */
    dl_trace *tr;  /* the trace during the traced steps, else NULL */
    tr_comp *comp; /* the composition, for hooks that call the others (call) */
    tr_calls call;
    /* set by modules at set-up, read by the step */
    int head;         /* this rank holds the head's output (pipeline: the last stage only) */
    int self_update;  /* the runner updates inside the step (the async pipeline) */
    int runner_span;  /* the runner records the step's span in the trace itself */
    int lockstep_fwd; /* every forward is collective over dp (ZeRO 3): evaluations keep step */
    int open;         /* set by the runner each step: work in flight after it (the continuous async
                    * pipeline inside its window), so this step is no quiet point */
    int stop_soon;    /* set by the step: a stop was requested while open; the runner ends its
                    * window as soon as it can (tr_async_window_cut) */
    /* [lo, hi) pairs of the flat buffer that a module reduces over another group than dp (the
     * experts, over the expert-data-parallel group): the dp reduction leaves them */
    const size_t *excl;
    int nexcl;
} tr_env;

/* The blocks of the flat buffers this rank's optimizer updates: ZeRO's units (stage 0: the units
 * themselves, d = 1), with the block's gradient and parameters where the sharding keeps them. */
typedef struct tr_shards {
    const dl_zero_units *zu;
    char *(*grad)(void *arg, int u);
    char *(*param)(void *arg, int u);
    float *master; /* bf16: fp32 master weights of the shard (at sbase), else NULL */
    void *arg;
} tr_shards;

/* One strategy module: its state and its hooks, each NULL when it has nothing to do then. */
typedef struct tr_module {
    const char *name;
    void *st;
    /* before the model: what the module asks of it (its part, unit padding, hooks) */
    int (*model_opts)(void *st, dl_gpt_opts *go);
    int (*setup)(void *st);                     /* after the model: buffers, initial state */
    int (*begin)(void *st);                     /* every step, before the forward */
    int (*grads_ready)(void *st, size_t first); /* gradients [first, numel) are final */
    int (*reduce)(void *st);                    /* after the backward: finish the reduction */
    int (*reduce_loss)(void *st, double *loss); /* the step's loss over the module's group */
    int (*reduce_norm)(void *st, double *sq);   /* the squared gradient norm, likewise */
    int (*after_update)(void *st);              /* after the optimizer (ZeRO 1-2: all-gather) */
    /* a runner: one step's forwards and backwards (its mean loss), and a forward alone */
    int (*fwd_bwd)(void *st, double *loss);
    int (*forward)(void *st, const int *in, const int *tg, int B, double *loss);
    int (*from_head)(void *st, double *v, int n); /* the head's values to every rank */
    /* the sharding: the blocks, and the whole buffers for checkpoints and the caller (which 0:
     * parameters, 1: reduced gradients, in the export type; collective over dp) */
    const tr_shards *shards;
    int (*export_state)(void *st, int which, void *out);
    void (*import_state)(void *st, const void *full);
    void *(*whole_params)(void *st); /* the whole parameters in place, or NULL: export them */
    /* a counter a full-state checkpoint keeps beyond the shards (the async pipeline's weight
     * version): read into *v (set 0) or restored from it (set 1) */
    void (*counter)(void *st, int64_t *v, int set);
    void (*report)(void *st, dl_train_result *res); /* rank 0, after training */
    void (*teardown)(void *st);
} tr_module;

/* The model's units as ZeRO cuts them (parallel/zero.h): *bounds = [0 = offset of unit 0, ...,
 * numel], *n + 1 of them (malloc'd: the caller frees). DL_ENOMEM only. (zero_module.c) */
int tr_unit_bounds(const tr_env *e, size_t **bounds, int *n);
/* Expert parallelism: the units (bounds ub[0..nu]) cut where expert tensors begin and end, each
 * piece marked expert (sharded and reduced over the expert-data-parallel group) or dense (over
 * dp); unit u is pieces first[u] .. first[u + 1] - 1. DL_ENOMEM only. (zero_module.c) */
typedef struct tr_pieces {
    size_t *bounds;        /* [n + 1] */
    unsigned char *expert; /* [n] */
    int *first;            /* [nu + 1] */
    int n;
} tr_pieces;
int tr_unit_pieces(const tr_env *e, const size_t *ub, int nu, tr_pieces *c);
void tr_pieces_free(tr_pieces *c);
/* The ZeRO stage the sharding module runs (0 with dp 1 or an evaluation only). (zero_module.c) */
int tr_zero_stage(const dl_train_opts *o);

/* A module's constructor: adds the module to *m (m->name set) when the options ask for it. */
typedef int (*tr_make_fn)(tr_env *e, tr_module *m);

#endif
