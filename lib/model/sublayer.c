/* The sublayer kinds (model/sublayer.h): their tables, the registry and the model variant. */
#include "config.h"
#include <stdio.h>
#include <string.h>
#include "distlab.h"
#include "model/ops.h"
#include "model/ops_attn_kv.h"
#include "model/sublayer.h"

int dl__sub_tp_allreduce(const dl_sub_ctx *c, void *buf, size_t n, int f64)
{
    if (c->d.tp == 1)
        return DL_OK;
    return dl_allreduce(c->tp_comm, buf, buf, n, f64 ? DL_F64 : DL_F32, DL_SUM,
                        DL_PURPOSE_ACTIVATIONS);
}

/* the sublayers' parameters by name, in their tables' order (below) */
enum { AT_LN_W, AT_LN_B, AT_QKV_W, AT_QKV_B, AT_PROJ_W, AT_PROJ_B };
enum { ML_LN_W, ML_LN_B, ML_FC_W, ML_FC_B, ML_PROJ_W, ML_PROJ_B };

#define REAL float
#define SFX f32
#define IS64 0
#include "model/sublayer_impl.h"
#undef REAL
#undef SFX
#undef IS64
#define REAL double
#define SFX f64
#define IS64 1
#include "model/sublayer_impl.h"
#undef REAL
#undef SFX
#undef IS64

/* rows of the largest micro-batch */
static size_t rows(const dl_sub_dims *d) { return (size_t)d->MB * d->T; }

static size_t att_act_elems(const dl_sub_dims *d)
{
    size_t N = rows(d), C = d->C, Cl = d->Cl;
    size_t keys = d->Tkv > 0 ? (size_t)d->Tkv : (size_t)d->T; /* the keys a query may see */
    return N * C + 2 * N + N * 3 * Cl + (size_t)d->MB * d->NHl * d->T * keys + N * Cl;
}
static size_t att_stash_elems(const dl_sub_dims *d)
{
    size_t N = rows(d);
    return N * d->C + N * 3 * (size_t)d->Cl + N * d->C;
}
static size_t mlp_act_elems(const dl_sub_dims *d)
{
    size_t N = rows(d);
    return N * d->C + 2 * N + 2 * N * d->Fl;
}
static size_t mlp_stash_elems(const dl_sub_dims *d)
{
    size_t N = rows(d);
    return N * d->C + N * d->Fl + N * d->C;
}

/* Parameter tables in layout order (the safetensors names; shapes in units of C, cols 0: a
 * vector). Column parallel: Q/K/V by heads and the first MLP linear (rows of W); row parallel:
 * the output projections (columns of W), their biases whole. */
typedef struct {
    const char *name;
    int rows, cols, ndim;
    dl_shard_kind sh;
} unit_param;

static void from_table(const unit_param *t, const dl_gpt_config *c, int q, dl_sub_param *out)
{
    snprintf(out->name, sizeof out->name, "%s", t[q].name);
    out->rows = (int64_t)t[q].rows * c->d_model;
    out->cols = t[q].cols ? (int64_t)t[q].cols * c->d_model : 1;
    out->ndim = t[q].ndim;
    out->sh = t[q].sh;
    out->expert = -1;
}

static const unit_param att_params[] = {
    {"ln_1.weight", 1, 0, 1, DL_SHARD_NONE},        {"ln_1.bias", 1, 0, 1, DL_SHARD_NONE},
    {"attn.c_attn.weight", 3, 1, 2, DL_SHARD_QKV},  {"attn.c_attn.bias", 3, 0, 1, DL_SHARD_QKV},
    {"attn.c_proj.weight", 1, 1, 2, DL_SHARD_COLS}, {"attn.c_proj.bias", 1, 0, 1, DL_SHARD_NONE},
};
static const unit_param mlp_params[] = {
    {"ln_2.weight", 1, 0, 1, DL_SHARD_NONE},       {"ln_2.bias", 1, 0, 1, DL_SHARD_NONE},
    {"mlp.c_fc.weight", 4, 1, 2, DL_SHARD_ROWS},   {"mlp.c_fc.bias", 4, 0, 1, DL_SHARD_ROWS},
    {"mlp.c_proj.weight", 1, 4, 2, DL_SHARD_COLS}, {"mlp.c_proj.bias", 1, 0, 1, DL_SHARD_NONE},
};

static int six(const dl_gpt_config *c, int layer)
{
    (void)c, (void)layer;
    return 6;
}
static void att_param(const dl_gpt_config *c, int layer, int q, dl_sub_param *out)
{
    (void)layer;
    from_table(att_params, c, q, out);
}
static void mlp_param(const dl_gpt_config *c, int layer, int q, dl_sub_param *out)
{
    (void)layer;
    from_table(mlp_params, c, q, out);
}

/* attention starts each layer's unit and the MLP joins it: today's unit per layer */
static const dl_sublayer_kind att_kind = {.name = "attention",
                                          .nparams = six,
                                          .param = att_param,
                                          .unit = DL_SUB_UNIT_NEW,
                                          .act_elems = att_act_elems,
                                          .stash_elems = att_stash_elems,
                                          .fwd = {att_fwd_f32, att_fwd_f64},
                                          .bwd = {att_bwd_f32, att_bwd_f64}};
static const dl_sublayer_kind mlp_kind = {.name = "mlp",
                                          .nparams = six,
                                          .param = mlp_param,
                                          .unit = DL_SUB_UNIT_JOIN,
                                          .act_elems = mlp_act_elems,
                                          .stash_elems = mlp_stash_elems,
                                          .fwd = {mlp_fwd_f32, mlp_fwd_f64},
                                          .bwd = {mlp_bwd_f32, mlp_bwd_f64}};

const dl_sublayer_kind *const dl__sublayer_kinds[DL_SUB_NKINDS] = {
    [DL_SUB_ATTENTION] = &att_kind,
    [DL_SUB_MLP_DENSE] = &mlp_kind,
    [DL_SUB_MLP_MOE] = &dl__moe_kind,
};

int dl__moe_layer(const dl_gpt_config *c, int layer)
{
    return c->experts > 0 && layer % c->moe_every == 0;
}

int dl__moe_nlayers(const dl_gpt_config *c)
{
    return c->experts > 0 ? (c->layers + c->moe_every - 1) / c->moe_every : 0;
}

int dl__layer_sublayers(const dl_gpt_config *c, int layer, const dl_sublayer_kind **out)
{
    out[0] = dl__sublayer_kinds[DL_SUB_ATTENTION];
    out[1] = dl__sublayer_kinds[dl__moe_layer(c, layer) ? DL_SUB_MLP_MOE : DL_SUB_MLP_DENSE];
    return 2;
}
