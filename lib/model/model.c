#define _GNU_SOURCE
/* GPT parameter layout, tensor-parallel sharding and counter-based initialisation. */
#include "config.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "distlab.h"
#include "model/layer.h"
#include "model/sublayer.h"

void dl_gpt_config_default(dl_gpt_config *c)
{
    memset(c, 0, sizeof *c); /* no mixture of experts */
    c->vocab = 256;
    c->seq = 128;
    c->layers = 4;
    c->d_model = 256;
    c->heads = 4;
    c->tie = 0;
}

/* the mixture-of-experts fields (model.h) */
static int moe_check(const dl_gpt_config *c)
{
    if (c->experts < 0)
        return dl_error(DL_EINVAL, "experts must be >= 0 (got %d)", c->experts);
    if (!c->experts)
        return DL_OK;
    if (c->experts > 1000)
        return dl_error(DL_EINVAL, "experts %d: at most 1000", c->experts);
    if (c->top_k < 1 || c->top_k > c->experts)
        return dl_error(DL_EINVAL, "top-k %d must be in 1 .. experts %d", c->top_k, c->experts);
    if (!(c->capacity >= 0) || !(c->aux_loss >= 0) || !(c->z_loss >= 0))
        return dl_error(DL_EINVAL,
                        "capacity factor %g, aux-loss %g and z-loss %g must be >= 0 (capacity "
                        "0: no limit)",
                        c->capacity, c->aux_loss, c->z_loss);
    if (c->moe_every < 1 || c->moe_every > c->layers)
        return dl_error(DL_EINVAL, "moe-every %d must be in 1 .. layers %d", c->moe_every,
                        c->layers);
    if (c->expert_ffn < 0)
        return dl_error(DL_EINVAL, "expert-ffn must be >= 1 (got %d)", c->expert_ffn);
    return DL_OK;
}

int dl_gpt_config_check(const dl_gpt_config *c, int tp)
{
    if (c->vocab < 1 || c->seq < 1 || c->layers < 1 || c->d_model < 1 || c->heads < 1)
        return dl_error(DL_EINVAL,
                        "model sizes must be positive (vocab %d, seq %d, layers %d, "
                        "d-model %d, heads %d)",
                        c->vocab, c->seq, c->layers, c->d_model, c->heads);
    if (c->d_model % c->heads)
        return dl_error(DL_EINVAL, "d-model %d is not divisible by heads %d (try d-model %d)",
                        c->d_model, c->heads, (c->d_model / c->heads + 1) * c->heads);
    if (tp < 1)
        return dl_error(DL_EINVAL, "tp must be >= 1 (got %d)", tp);
    int rc = moe_check(c);
    if (rc)
        return rc;
    if (c->heads % tp) {
        int fit = 1;
        for (int d = 1; d <= c->heads; d++)
            if (c->heads % d == 0 && d <= tp)
                fit = d;
        return dl_error(DL_EINVAL,
                        "heads %d are not divisible by tp %d (tp %d fits, or use a "
                        "head count divisible by %d)",
                        c->heads, tp, fit, tp);
    }
    return DL_OK;
}

int64_t dl_gpt_num_params(const dl_gpt_config *c)
{
    int64_t V = c->vocab, T = c->seq, C = c->d_model, L = c->layers;
    int64_t block =
        2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + 4 * C * C + 4 * C + 4 * C * C + C;
    int64_t n = V * C + T * C + L * block + 2 * C + (c->tie ? 0 : V * C);
    /* an MoE layer: the router and E experts instead of the dense MLP's two linears */
    int64_t E = c->experts, F = c->expert_ffn ? c->expert_ffn : 4 * C;
    for (int l = 0; E && l < L; l++)
        if (l % c->moe_every == 0)
            n += E * C + E * (2 * F * C + F + C) - (8 * C * C + 5 * C);
    return n;
}

static void add(dl_gpt_layout *l, int *k, size_t *off, int id, const char *name, int layer,
                int64_t rows, int64_t cols, int ndim, dl_shard_kind sh)
{
    dl_tensor_info *t = &l->t[*k];
    memset(t, 0, sizeof *t);
    if (layer >= 0)
        snprintf(t->name, sizeof t->name, "h.%d.%s", layer, name);
    else
        snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim;
    t->shape[0] = rows;
    t->shape[1] = cols;
    t->local[0] = rows;
    t->local[1] = cols;
    int tp = l->tp;
    switch (sh) {
    case DL_SHARD_ROWS:
    case DL_SHARD_QKV: t->local[0] = rows / tp; break;
    case DL_SHARD_COLS: t->local[1] = cols / tp; break;
    default: break;
    }
    if (tp == 1)
        sh = DL_SHARD_NONE;
    t->shard = sh;
    t->offset = *off;
    t->numel = (size_t)(t->local[0] * t->local[1]);
    t->layer = layer;
    t->id = id;
    *off += t->numel;
    (*k)++;
}

void dl_gpt_part_whole(const dl_gpt_config *c, dl_gpt_part *out)
{
    memset(out, 0, sizeof *out);
    out->nchunks = 1;
    out->count[0] = c->layers;
    out->embed = out->head = 1;
}

int dl_gpt_part_stage(const dl_gpt_config *c, int p, int v, int stage, const int *bounds,
                      dl_gpt_part *out)
{
    memset(out, 0, sizeof *out);
    if (p < 1 || v < 1 || v > DL_GPT_MAX_CHUNKS || stage < 0 || stage >= p)
        return dl_error(DL_EINVAL,
                        "model part: stage %d of %d with %d chunks is out of range "
                        "(at most %d chunks)",
                        stage, p, v, DL_GPT_MAX_CHUNKS);
    if (bounds[0] != 0 || bounds[p * v] != c->layers)
        return dl_error(DL_EINVAL, "model part: layer bounds must run from 0 to %d", c->layers);
    for (int k = 0; k < p * v; k++)
        if (bounds[k + 1] <= bounds[k])
            return dl_error(DL_EINVAL, "model part: virtual stage %d would hold no layer", k);
    out->nchunks = v;
    for (int ch = 0; ch < v; ch++) {
        int k = ch * p + stage;
        out->first[ch] = bounds[k];
        out->count[ch] = bounds[k + 1] - bounds[k];
    }
    out->embed = stage == 0;
    out->head = stage == p - 1;
    return DL_OK;
}

static int layer_tensors(const dl_gpt_config *c, int layer)
{
    const dl_sublayer_kind *kinds[DL_SUB_MAX];
    int ns = dl__layer_sublayers(c, layer, kinds), n = 0;
    for (int j = 0; j < ns; j++) n += kinds[j]->nparams(c, layer);
    return n;
}

/* Single-rank tensor ids (the initialiser's key, and the index in the whole single-rank
 * layout): wte 0, wpe 1, then each layer's tensors in order (a dense layer's j-th is
 * 2 + 12 i + j, model/layer.h's order), then ln_f, its bias and lm_head. */
static int layer_tensor_id(const dl_gpt_config *c, int i, int j)
{
    int id = 2;
    if (!c->experts)
        return id + DL_LT_COUNT * i + j;
    for (int l = 0; l < i; l++) id += layer_tensors(c, l);
    return id + j;
}

/* whether this rank holds a parameter: every one but the experts of other ep ranks */
static int holds(const dl_gpt_layout *l, const dl_sub_param *pr)
{
    return pr->expert < 0 || pr->expert / (l->cfg.experts / l->ep) == l->ep_rank;
}

int dl__sub_nheld(const dl_sublayer_kind *k, const dl_gpt_layout *l, int layer)
{
    int n = 0;
    for (int q = 0; q < k->nparams(&l->cfg, layer); q++) {
        dl_sub_param pr;
        k->param(&l->cfg, layer, q, &pr);
        n += holds(l, &pr);
    }
    return n;
}

/* (the init key j counts every tensor of the layer, held or not: any ep rank draws its experts'
 * single-rank values) */
static void add_layer(dl_gpt_layout *l, int *k, size_t *off, int i)
{
    const dl_sublayer_kind *kinds[DL_SUB_MAX];
    int ns = dl__layer_sublayers(&l->cfg, i, kinds), j = 0;
    for (int s = 0; s < ns; s++)
        for (int q = 0; q < kinds[s]->nparams(&l->cfg, i); q++, j++) {
            dl_sub_param pr;
            kinds[s]->param(&l->cfg, i, q, &pr);
            if (holds(l, &pr))
                add(l, k, off, layer_tensor_id(&l->cfg, i, j), pr.name, i, pr.rows, pr.cols,
                    pr.ndim, pr.sh);
        }
}

int dl_gpt_layout_create_part(const dl_gpt_config *c, int tp, int tp_rank, const dl_gpt_part *part,
                              dl_gpt_layout **out)
{
    return dl_gpt_layout_create_ep(c, tp, tp_rank, 1, 0, part, out);
}

int dl_gpt_layout_create_ep(const dl_gpt_config *c, int tp, int tp_rank, int ep, int ep_rank,
                            const dl_gpt_part *part, dl_gpt_layout **out)
{
    *out = NULL;
    int rc = dl_gpt_config_check(c, tp);
    if (rc)
        return rc;
    if (tp_rank < 0 || tp_rank >= tp)
        return dl_error(DL_EINVAL, "tp rank %d out of range (tp %d)", tp_rank, tp);
    if (ep < 1 || ep_rank < 0 || ep_rank >= ep || (ep > 1 && c->experts % ep))
        return dl_error(DL_EINVAL, "ep rank %d of ep %d: ep must divide the experts %d", ep_rank,
                        ep, c->experts);
    dl_gpt_part whole;
    if (!part) {
        dl_gpt_part_whole(c, &whole);
        part = &whole;
    }
    if (part->nchunks < 1 || part->nchunks > DL_GPT_MAX_CHUNKS)
        return dl_error(DL_EINVAL, "model part: %d chunks (1 .. %d)", part->nchunks,
                        DL_GPT_MAX_CHUNKS);
    for (int ch = 0; ch < part->nchunks; ch++) {
        if (part->count[ch] < 1 || part->first[ch] < 0 ||
            part->first[ch] + part->count[ch] > c->layers)
            return dl_error(DL_EINVAL, "model part: chunk %d's layers %d .. %d outside 0 .. %d", ch,
                            part->first[ch], part->first[ch] + part->count[ch] - 1, c->layers - 1);
    }
    dl_gpt_layout *l = calloc(1, sizeof *l);
    int n = 2 + 3;
    for (int ch = 0; ch < part->nchunks; ch++)
        for (int i = part->first[ch]; i < part->first[ch] + part->count[ch]; i++)
            n += layer_tensors(c, i);
    if (!l || !(l->t = calloc((size_t)n, sizeof *l->t))) {
        free(l);
        return dl_error(DL_ENOMEM, "model layout: out of memory");
    }
    l->cfg = *c;
    l->tp = tp;
    l->tp_rank = tp_rank;
    l->ep = ep;
    l->ep_rank = ep_rank;
    l->part = *part;
    int64_t V = c->vocab, T = c->seq, C = c->d_model;
    int k = 0, L = c->layers;
    size_t off = 0;
    if (part->embed) {
        add(l, &k, &off, 0, "wte.weight", -1, V, C, 2, DL_SHARD_NONE);
        add(l, &k, &off, 1, "wpe.weight", -1, T, C, 2, DL_SHARD_NONE);
    }
    /* each layer's tensors: its sublayers' parameter tables in order (model/sublayer.h) */
    for (int ch = 0; ch < part->nchunks; ch++)
        for (int i = part->first[ch]; i < part->first[ch] + part->count[ch]; i++)
            add_layer(l, &k, &off, i);
    if (part->head) {
        int h = layer_tensor_id(c, L, 0);
        add(l, &k, &off, h, "ln_f.weight", -1, C, 1, 1, DL_SHARD_NONE);
        add(l, &k, &off, h + 1, "ln_f.bias", -1, C, 1, 1, DL_SHARD_NONE);
        if (!c->tie)
            add(l, &k, &off, h + 2, "lm_head.weight", -1, V, C, 2, DL_SHARD_NONE);
        else if (!part->embed)
            add(l, &k, &off, 0, "wte.weight", -1, V, C, 2, DL_SHARD_NONE);
    }
    l->ntensors = k;
    l->numel = off;
    *out = l;
    return DL_OK;
}

int dl_gpt_layout_create(const dl_gpt_config *c, int tp, int tp_rank, dl_gpt_layout **out)
{
    return dl_gpt_layout_create_part(c, tp, tp_rank, NULL, out);
}

void dl_gpt_layout_destroy(dl_gpt_layout *l)
{
    if (l) {
        free(l->t);
        free(l);
    }
}

int dl_gpt_find(const dl_gpt_layout *l, const char *name)
{
    for (int k = 0; k < l->ntensors; k++)
        if (!strcmp(l->t[k].name, name))
            return k;
    return -1;
}

int64_t dl_gpt_global_index(const dl_gpt_layout *l, int k, size_t i)
{
    const dl_tensor_info *t = &l->t[k];
    int64_t lr = (int64_t)i / t->local[1], lc = (int64_t)i % t->local[1];
    int r = l->tp_rank;
    switch (t->shard) {
    case DL_SHARD_ROWS: return (r * t->local[0] + lr) * t->shape[1] + lc;
    case DL_SHARD_COLS: return lr * t->shape[1] + r * t->local[1] + lc;
    case DL_SHARD_QKV: {
        int64_t third = t->shape[0] / 3, per = third / l->tp; /* rows of one part on one rank */
        int64_t part = lr / per, row = part * third + r * per + lr % per;
        return row * t->shape[1] + lc;
    }
    default: return (int64_t)i;
    }
}

/* splitmix64: the counter-based generator's mixing function */
static uint64_t mix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* The normal deviate for (seed, tensor id, global index): a function of those only, so that any
 * shard draws exactly its slice of the single-rank weights. */
static double init_normal(uint64_t seed, int id, int64_t g)
{
    uint64_t key = mix(mix(seed) ^ (0xD1B54A32D192ED03ull * (uint64_t)(id + 1)));
    uint64_t a = mix(key + 2 * (uint64_t)g), b = mix(key + 2 * (uint64_t)g + 1);
    double u1 = ((double)(a >> 11) + 1.0) * (1.0 / 9007199254740993.0); /* (0, 1] */
    double u2 = (double)(b >> 11) * (1.0 / 9007199254740992.0);
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2); /* Box-Muller */
}

void dl_gpt_init(const dl_gpt_layout *l, void *params, int dsize, uint64_t seed)
{
    double proj_std = 0.02 / sqrt(2.0 * l->cfg.layers);
    for (int k = 0; k < l->ntensors; k++) {
        const dl_tensor_info *t = &l->t[k];
        const char *base = strrchr(t->name, '.');
        int is_bias = base && !strcmp(base, ".bias");
        int is_ln = strstr(t->name, "ln_") != NULL;
        int is_proj = strstr(t->name, "c_proj.weight") != NULL;
        for (size_t i = 0; i < t->numel; i++) {
            double v;
            if (is_bias)
                v = 0.0;
            else if (is_ln)
                v = 1.0;
            else
                v = (is_proj ? proj_std : 0.02) *
                    init_normal(seed, t->id, dl_gpt_global_index(l, k, i));
            if (dsize == 8)
                ((double *)params)[t->offset + i] = v;
            else
                ((float *)params)[t->offset + i] = (float)v;
        }
    }
}
