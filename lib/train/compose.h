/* The composition of the strategy modules (train/compose.c, the list in train/modules.def). */
#ifndef DISTLAB_TRAIN_COMPOSE_H
#define DISTLAB_TRAIN_COMPOSE_H
#include "parallel/module.h"
#include "train/optim.h"

#define TR_MAX_MODULES 16

struct tr_comp {
    tr_env *e;
    tr_module m[TR_MAX_MODULES];
    int n;
    const tr_shards *sh; /* the sharding module's blocks */
    tr_optim opt;
};

/* The fan-outs for the train layer's own modules (the others reach them through tr_env.call) */
int tr_grads_ready(size_t first, void *comp); /* a dl_grad_ready_fn */
int tr_has_ready(const tr_comp *c);
int tr_grad_norm(tr_comp *c, double *norm);
int tr_update(tr_comp *c, double scale, double lr); /* AdamW, then after_update */
int tr_forward(tr_comp *c, const int *in, const int *tg, int B, double *loss);
int tr_from_head(tr_comp *c, double *v, int n);
int tr_export(tr_comp *c, int which, void *out);
void tr_import(tr_comp *c, const void *full);
void *tr_whole_params(tr_comp *c);
/* The modules' counter a checkpoint keeps (0 when none keeps one): read (set 0) or restore. */
void tr_counter(tr_comp *c, int64_t *v, int set);

/* Every constructor of modules.def in order; *out is freed by tr_teardown even on error. */
int tr_compose(tr_env *e, tr_comp **out);
/* The modules' model_opts hooks, in order. */
int tr_model_opts(tr_comp *c, dl_gpt_opts *go);
/* After the model: the modules' setup hooks, then the optimizer on the sharding's blocks. */
int tr_setup(tr_comp *c);
/* The step's phases: every module's hook, in order. */
int tr_begin(tr_comp *c);
int tr_fwd_bwd(tr_comp *c, double *loss);
int tr_reduce(tr_comp *c);
int tr_reduce_loss(tr_comp *c, double *loss);
void tr_report(tr_comp *c, dl_train_result *res);
void tr_teardown(tr_comp *c);
#endif
