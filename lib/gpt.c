/* A rank's GPT shard: allocation in the rank's arena and forward/backward with tensor
 * parallelism (the kernels are in ops.c; the f32 and f64 paths come from gpt_impl.h). */
#include "config.h"
#include <stdlib.h>
#include <string.h>
#include "distlab.h"

struct dl_gpt {
    dl_gpt_opts o;
    dl_gpt_layout *lay;
    int tp, dsize;
    int V, T, C, L, H, HS, Cl, Fl, NHl, MB;
    size_t N;         /* MB * T: rows of the largest batch */
    size_t set_elems; /* one layer's activations */
    int k_wte, k_wpe, k_lnf, k_head, *k_layer;
    void *params, *grads;
    void *act;        /* L layer sets (one with full recompute) */
    void *xres;       /* residual stream: L + 1 buffers of N x C */
    void *lnf, *lnf_mean, *lnf_rstd, *probs, *losses;
    void *dx, *dln, *dqkv, *datty, *dfchg, *dlnf, *att_scratch;
    int *inputs, *targets, *zero_targets;
    int lastB;
    void *blocks[24];
    int nblocks;
};

#define REAL float
#define SFX f32
#define DT DL_F32
#include "gpt_impl.h"
#undef REAL
#undef SFX
#undef DT
#define REAL double
#define SFX f64
#define DT DL_F64
#include "gpt_impl.h"
#undef REAL
#undef SFX
#undef DT

static int grab(dl_gpt *g, dl_mem_category cat, size_t bytes, void **out)
{
    int rc = dl_arena_alloc(g->o.arena, cat, bytes, out);
    if (rc == DL_OK)
        g->blocks[g->nblocks++] = *out;
    return rc;
}

void dl_gpt_destroy(dl_gpt *g)
{
    if (!g)
        return;
    for (int i = 0; i < g->nblocks; i++)
        dl_arena_free(g->o.arena, g->blocks[i]);
    free(g->k_layer);
    free(g->inputs);
    free(g->targets);
    free(g->zero_targets);
    dl_gpt_layout_destroy(g->lay);
    free(g);
}

int dl_gpt_create(const dl_gpt_opts *o, dl_gpt **out)
{
    *out = NULL;
    if (o->dtype != DL_F32 && o->dtype != DL_F64)
        return dl_error(DL_EINVAL, "model: dtype must be f32 or f64");
    if (o->micro_batch < 1)
        return dl_error(DL_EINVAL, "model: micro-batch must be >= 1 (got %d)", o->micro_batch);
    if (!o->arena)
        return dl_error(DL_EINVAL, "model: no arena");
    int tp = o->tp < 1 ? 1 : o->tp;
    if (tp > 1 && (!o->tp_comm || dl_comm_size(o->tp_comm) != tp))
        return dl_error(DL_EINVAL, "model: tp %d needs a tp communicator of that size", tp);
    dl_gpt *g = calloc(1, sizeof *g);
    if (!g)
        return dl_error(DL_ENOMEM, "model: out of memory");
    g->o = *o;
    g->tp = tp;
    int rc = dl_gpt_layout_create(&o->cfg, tp, tp > 1 ? dl_comm_rank(o->tp_comm) : 0, &g->lay);
    if (rc) {
        free(g);
        return rc;
    }
    const dl_gpt_config *c = &o->cfg;
    g->dsize = o->dtype == DL_F64 ? 8 : 4;
    g->V = c->vocab, g->T = c->seq, g->C = c->d_model, g->L = c->layers, g->H = c->heads;
    g->HS = g->C / g->H;
    g->Cl = g->C / tp;
    g->Fl = 4 * g->C / tp;
    g->NHl = g->H / tp;
    g->MB = o->micro_batch;
    g->N = (size_t)g->MB * g->T;
    size_t N = g->N, C = g->C;
    g->set_elems = N * C * 3 + 4 * N + N * 3 * g->Cl + (size_t)g->MB * g->NHl * g->T * g->T +
                   N * g->Cl + 2 * N * g->Fl;
    g->k_wte = dl_gpt_find(g->lay, "wte.weight");
    g->k_wpe = dl_gpt_find(g->lay, "wpe.weight");
    g->k_lnf = dl_gpt_find(g->lay, "ln_f.weight");
    g->k_head = c->tie ? g->k_wte : dl_gpt_find(g->lay, "lm_head.weight");
    g->k_layer = malloc(sizeof(int) * (size_t)g->L);
    g->inputs = malloc(sizeof(int) * N);
    g->targets = malloc(sizeof(int) * N);
    g->zero_targets = calloc(N, sizeof(int));
    if (!g->k_layer || !g->inputs || !g->targets || !g->zero_targets) {
        dl_gpt_destroy(g);
        return dl_error(DL_ENOMEM, "model: out of memory");
    }
    for (int l = 0; l < g->L; l++) {
        char name[48];
        snprintf(name, sizeof name, "h.%d.ln_1.weight", l);
        g->k_layer[l] = dl_gpt_find(g->lay, name);
    }
    size_t ds = (size_t)g->dsize, P = g->lay->numel;
    size_t sets = o->recompute == DL_RECOMPUTE_FULL ? 1 : (size_t)g->L;
    size_t Fl = (size_t)g->Fl, Cl = (size_t)g->Cl, V = (size_t)g->V, T = (size_t)g->T;
    struct {
        dl_mem_category cat;
        size_t elems;
        void **p;
    } plan[] = {
        {DL_MEM_PARAMS, P, &g->params},
        {DL_MEM_GRADS, P, &g->grads},
        {DL_MEM_ACTIVATIONS, sets * g->set_elems, &g->act},
        {DL_MEM_ACTIVATIONS, (size_t)(g->L + 1) * N * C, &g->xres},
        {DL_MEM_ACTIVATIONS, N * C, &g->lnf},
        {DL_MEM_ACTIVATIONS, N, &g->lnf_mean},
        {DL_MEM_ACTIVATIONS, N, &g->lnf_rstd},
        {DL_MEM_ACTIVATIONS, N * V, &g->probs},
        {DL_MEM_ACTIVATIONS, N, &g->losses},
        {DL_MEM_ACTIVATIONS, N * C, &g->dx},
        {DL_MEM_ACTIVATIONS, N * C, &g->dln},
        {DL_MEM_ACTIVATIONS, N * 3 * Cl, &g->dqkv},
        {DL_MEM_ACTIVATIONS, N * Cl, &g->datty},
        {DL_MEM_ACTIVATIONS, N * Fl, &g->dfchg},
        {DL_MEM_ACTIVATIONS, N * C, &g->dlnf},
        {DL_MEM_ACTIVATIONS, T * T, &g->att_scratch},
    };
    for (size_t i = 0; i < sizeof plan / sizeof plan[0]; i++)
        if ((rc = grab(g, plan[i].cat, plan[i].elems * ds, plan[i].p))) {
            dl_gpt_destroy(g);
            return rc;
        }
    dl_gpt_init(g->lay, g->params, g->dsize, o->seed);
    *out = g;
    return DL_OK;
}

const dl_gpt_layout *dl_gpt_get_layout(const dl_gpt *g) { return g->lay; }
void *dl_gpt_params(dl_gpt *g) { return g->params; }
void *dl_gpt_grads(dl_gpt *g) { return g->grads; }
size_t dl_gpt_numel(const dl_gpt *g) { return g->lay->numel; }
void dl_gpt_zero_grads(dl_gpt *g) { memset(g->grads, 0, g->lay->numel * (size_t)g->dsize); }

size_t dl_gpt_layer_offset(const dl_gpt *g, int l)
{
    return l < g->L ? g->lay->t[g->k_layer[l]].offset : g->lay->t[g->k_lnf].offset;
}

int dl_gpt_forward(dl_gpt *g, const int *inputs, const int *targets, int B, double *loss)
{
    if (B < 1 || B > g->MB)
        return dl_error(DL_EINVAL, "model forward: batch %d outside 1..%d", B, g->MB);
    size_t n = (size_t)B * g->T;
    for (size_t i = 0; i < n; i++)
        if (inputs[i] < 0 || inputs[i] >= g->V || (targets && (targets[i] < 0 || targets[i] >= g->V)))
            return dl_error(DL_EINVAL, "model forward: token out of range at position %zu", i);
    memcpy(g->inputs, inputs, n * sizeof(int));
    memcpy(g->targets, targets ? targets : g->zero_targets, n * sizeof(int));
    g->lastB = B;
    return g->dsize == 8 ? forward_f64(g, g->inputs, g->targets, B, loss)
                         : forward_f32(g, g->inputs, g->targets, B, loss);
}

int dl_gpt_backward(dl_gpt *g, double dloss, dl_grad_ready_fn ready, void *arg)
{
    if (!g->lastB)
        return dl_error(DL_EINVAL, "model backward: no forward to differentiate");
    int rc = g->dsize == 8 ? backward_f64(g, dloss, ready, arg) : backward_f32(g, dloss, ready, arg);
    g->lastB = 0; /* the probabilities were overwritten by their gradient */
    return rc;
}

const void *dl_gpt_probs(const dl_gpt *g, int b, int t)
{
    return (const char *)g->probs + ((size_t)b * g->T + (size_t)t) * (size_t)g->V * (size_t)g->dsize;
}
