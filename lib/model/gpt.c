/* A rank's GPT shard: allocation in the rank's arena and forward/backward with tensor
 * parallelism (the kernels are in ops*.c; the f32 and f64 paths come from gpt_impl.h). */
#include "config.h"
#include <stdlib.h>
#include <string.h>
#include "distlab.h"
#include "model/gpt_priv.h"
#include "model/layer.h"
#include "model/ops.h"
#include "model/sublayer.h"
#include "core/testhook.h"

/* One sublayer of one local layer: its kind, its first tensor, its unit, where its activations
 * sit in the layer's activation set and its stash in the layer's stash set (elements). */
typedef struct dl_sub_inst {
    const dl_sublayer_kind *kind;
    int k, unit;
    size_t act_off, stash_off;
} dl_sub_inst;

struct dl_gpt {
    dl_gpt_opts o;
    dl_gpt_layout *lay;
    int tp, dsize;    /* dsize: bytes of the compute type (activations, unit buffers) */
    int store, ssize; /* the storage type of params/grads (DL_F32, DL_F64, DL_BF16), its bytes */
    int V, T, C, L, H, HS, Cl, Fl, NHl, MB; /* L: the layers this rank holds (all chunks) */
    size_t N;                               /* MB * T: rows of the largest batch */
    /* token slices (opts.token_slice): T is the longest slice's length (the buffers' rows per
     * sequence), Tseq the sequence's; per slot the slice's first position, its length and its
     * sequences' key/value cache; the caches (kv_seqs of them, each L layers of kv_elems) and
     * their gradients */
    int Tseq, *slot_t0, *slot_len, *slot_kv;
    size_t kv_elems;
    void *kv_base, *dkv_base;
    size_t set_elems;                        /* one layer's activations (the largest) */
    size_t stash_elems;                      /* one layer's deferred weight-gradient stash */
    int k_wte, k_wpe, k_lnf, k_lnfb, k_head; /* tensor indices */
    int *k_layer;                            /* k_layer[local layer]: its first tensor */
    dl_sub_inst *sub; /* sub[l * DL_SUB_MAX + j]: local layer l's sublayer j */
    int *nsub;        /* nsub[l]: local layer l's sublayers */
    int embed, head;  /* holds virtual stage 0's embeddings / the last virtual stage's head */
    int cbeg[DL_GPT_MAX_CHUNKS]; /* local index of each chunk's first layer */
    int maxc;                    /* layers of the largest chunk */
    int slots;                   /* activation slots (micro-batches in flight) */
    void *params, *grads;
    /* per slot: activation sets (maxc of them, or one shared with full recompute), the residual
     * stream (maxc + 1 buffers of N x C), the head's buffers and the tokens */
    void *act_base, *xres_base, *lnf_base, *lnf_mean_base, *lnf_rstd_base, *probs_base,
        *losses_base;
    int *inputs_base, *targets_base, *lastB;
    /* the current slot and chunk, and that slot's buffers */
    int cur_slot, cur_chunk;
    void *cur_act, *xres, *lnf, *lnf_mean, *lnf_rstd, *probs, *losses;
    int *inputs, *targets;
    /* deferred weight gradients (opts.defer_w): per slot, a stash set per layer of the largest
     * chunk, then the head's (ln_f's output gradient) and the embeddings' (their output
     * gradient); wpend[slot]: chunk + 1 while that chunk's weight part is pending */
    void *stash_base, *cur_stash, *cur_stash_head, *cur_stash_emb;
    size_t stash_slot;
    int *wpend;
    void *dx, *dln, *dqkv, *datty, *dfchg, *dlnf, *att_scratch;
    int *zero_targets;
    void *blocks[32];
    int nblocks;
    /* units (include/distlab/gpt.h): unit u is [ubound[u], ubound[u+1]), tensors ufirst[u] ..
     * ufirst[u+1]-1; pw[k], gw[k]: where the kernels find tensor k's parameters and gradient */
    int nunits, u_head, *ufirst;
    size_t *ubound, umax;
    void **pw, **gw;
    int pdirect, gdirect; /* pw / gw point into the flat buffers (no unit buffers) */
    int ep;               /* expert parallelism's degree (1: none) */
    dl_moe_stats *moe;    /* per local MoE layer, in layer order (nmoe of them) */
    int nmoe, *moe_of;    /* moe_of[l]: local layer l's index in moe, -1: dense */
    double cur_dloss;     /* the running backward's dloss (the MoE auxiliary losses' weight) */
    int keep0;            /* tied embeddings on this rank: unit 0 kept in the second buffers */
    void *pwork[2], *gwork[2], *gath[2];
    size_t unit_bytes, gath_bytes;
};

static size_t unit_padded(const dl_gpt *g, size_t n)
{
    size_t p = g->o.unit_pad > 1 ? (size_t)g->o.unit_pad : 1;
    return (n + p - 1) / p * p;
}

static void point_unit(dl_gpt *g, void **tab, int u, char *base)
{
    for (int k = g->ufirst[u]; k < g->ufirst[u + 1]; k++)
        tab[k] = base + (g->lay->t[k].offset - g->ubound[u]) * (size_t)g->dsize;
}

static void point_direct(dl_gpt *g)
{
    for (int u = 0; u < g->nunits; u++) {
        if (g->pdirect)
            point_unit(g, g->pw, u, (char *)g->params + g->ubound[u] * (size_t)g->dsize);
        if (g->gdirect)
            point_unit(g, g->gw, u, (char *)g->grads + g->ubound[u] * (size_t)g->dsize);
    }
}

/* Before unit u's forward (grads 0) or backward (grads 1): its parameters where the kernels read
 * them, and a zeroed gradient buffer. */
static int unit_begin(dl_gpt *g, int u, int grads)
{
    int sl = g->keep0 && u == 0, rc;
    size_t lo = g->ubound[u], n = g->ubound[u + 1] - lo;
    if (grads >= 0 && !g->pdirect) {
        char *src = g->params ? (char *)g->params + lo * (size_t)g->ssize : g->gath[sl];
        if (g->o.gather && (rc = g->o.gather(g->o.hook_arg, u, g->gath[sl])))
            return rc;
        if (g->store == DL_BF16) {
            dl_bf16_widen(g->pwork[sl], (const uint16_t *)src, n);
            src = g->pwork[sl];
        }
        point_unit(g, g->pw, u, src);
    }
    if (grads && !g->gdirect) { /* -1: the gradient buffer only */
        memset(g->gwork[sl], 0, unit_padded(g, n) * (size_t)g->dsize);
        point_unit(g, g->gw, u, g->gwork[sl]);
    }
    return DL_OK;
}

/* Before unit u's part of a backward: the whole backward needs both, the input part the
 * parameters only, the weight part the gradient buffer only (no weight-gradient kernel reads a
 * parameter). */
static int unit_begin_part(dl_gpt *g, int u, dl_bwd_part part)
{
    return unit_begin(g, u, part == DL_BWD_WHOLE ? 1 : part == DL_BWD_INPUT ? 0 : -1);
}

/* After unit u's backward: its gradient to the reduce hook, or added into the bf16 buffer. */
static int unit_end(dl_gpt *g, int u)
{
    if (g->gdirect)
        return DL_OK;
    int sl = g->keep0 && u == 0;
    size_t lo = g->ubound[u], n = g->ubound[u + 1] - lo;
    if (g->o.reduce)
        return g->o.reduce(g->o.hook_arg, u, g->gwork[sl]);
    dl_bf16_acc_f32((uint16_t *)g->grads + lo, g->gwork[sl], n);
    return DL_OK;
}

/* Point the current-slot buffers at slot s, chunk ch. */
static void select_slot(dl_gpt *g, int s, int ch)
{
    size_t ds = (size_t)g->dsize, N = g->N, C = g->C, V = g->V;
    g->cur_slot = s;
    g->cur_chunk = ch;
    g->cur_act =
        (char *)g->act_base +
        (g->o.recompute == DL_RECOMPUTE_FULL ? 0 : (size_t)s * g->maxc * g->set_elems * ds);
    g->xres = (char *)g->xres_base + (size_t)s * (g->maxc + 1) * N * C * ds;
    if (g->stash_base) {
        g->cur_stash = (char *)g->stash_base + (size_t)s * g->stash_slot * ds;
        g->cur_stash_head = (char *)g->cur_stash + (size_t)g->maxc * g->stash_elems * ds;
        g->cur_stash_emb = (char *)g->cur_stash_head + (g->head ? N * C * ds : 0);
    }
    g->inputs = g->inputs_base + (size_t)s * N;
    g->targets = g->targets_base + (size_t)s * N;
    if (g->head) {
        g->lnf = (char *)g->lnf_base + (size_t)s * N * C * ds;
        g->lnf_mean = (char *)g->lnf_mean_base + (size_t)s * N * ds;
        g->lnf_rstd = (char *)g->lnf_rstd_base + (size_t)s * N * ds;
        g->probs = (char *)g->probs_base + (size_t)s * N * V * ds;
        g->losses = (char *)g->losses_base + (size_t)s * N * ds;
    }
}

/* A sublayer's sizes for a batch of B sequences of T positions. */
static dl_sub_dims sub_dims(const dl_gpt *g, int B, int T)
{
    const dl_gpt_config *c = &g->o.cfg;
    int E = c->experts, Fe = c->expert_ffn ? c->expert_ffn : 4 * g->C;
    return (dl_sub_dims){g->MB,    B,      T,         g->C,  g->Cl,
                         g->Fl,    g->NHl, g->HS,     g->tp, E,
                         c->top_k, Fe,     E / g->ep, g->ep, g->kv_elems ? g->Tseq : 0};
}

/* The current slot's positions per sequence: its slice's, or the buffers' T. */
static int rows_T(const dl_gpt *g) { return g->kv_elems ? g->slot_len[g->cur_slot] : g->T; }

/* The current slot's first position (0 without token slices). */
static size_t slice_t0(const dl_gpt *g)
{
    return g->kv_elems ? (size_t)g->slot_t0[g->cur_slot] : 0;
}

/* The context of local layer l's sublayer j for a batch of B sequences in the current slot and
 * chunk: its parameters, activations and stash; its input is the layer's input or the previous
 * sublayer's output, kept in the activation set after that sublayer's own activations, and the
 * last one's output is the layer's. */
static void sub_ctx(dl_gpt *g, int l, int j, int B, dl_sub_ctx *c)
{
    const dl_sub_inst *s = &g->sub[l * DL_SUB_MAX + j];
    size_t ds = (size_t)g->dsize, NC = g->N * (size_t)g->C;
    int r = l - g->cbeg[g->cur_chunk], last = j == g->nsub[l] - 1;
    char *set = (char *)g->cur_act + (g->o.recompute ? 0 : (size_t)r) * g->set_elems * ds;
    char *xres = (char *)g->xres + (size_t)r * NC * ds;
    memset(c, 0, sizeof *c);
    c->d = sub_dims(g, B, rows_T(g));
    c->tp_comm = g->o.tp_comm;
    c->cfg = &g->o.cfg;
    c->ep_comm = g->ep > 1 ? g->o.ep_comm : NULL;
    c->moe = g->moe_of[l] >= 0 ? &g->moe[g->moe_of[l]] : NULL;
    c->dloss = g->cur_dloss;
    c->w = g->pw + s->k;
    c->dw = g->gw + s->k;
    c->act = set + s->act_off * ds;
    c->x = j ? set + (s[-1].act_off + s[-1].kind->act_elems(&c->d)) * ds : xres;
    c->y = last ? xres + NC * ds : set + (s->act_off + s->kind->act_elems(&c->d)) * ds;
    if (g->stash_base)
        c->stash = (char *)g->cur_stash + ((size_t)r * g->stash_elems + s->stash_off) * ds;
    c->dx = g->dx;
    c->ws_dln = g->dln, c->ws_datty = g->datty, c->ws_dqkv = g->dqkv, c->ws_dfc = g->dfchg;
    c->ws_scratch = g->att_scratch;
    if (g->kv_elems && g->slot_kv[g->cur_slot] >= 0) { /* local layer l's cache of the slot's
                                                         * sequences */
        size_t at = ((size_t)g->slot_kv[g->cur_slot] * g->L + (size_t)l) * g->kv_elems * ds;
        c->kv = (char *)g->kv_base + at;
        c->dkv = (char *)g->dkv_base + at;
        c->kv_ctx = g->slot_t0[g->cur_slot];
    }
}

#define REAL float
#define SFX f32
#define IS64 0
#include "model/gpt_impl.h"
#undef REAL
#undef SFX
#undef IS64
#define REAL double
#define SFX f64
#define IS64 1
#include "model/gpt_impl.h"
#undef REAL
#undef SFX
#undef IS64

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
    for (int i = 0; i < g->nblocks; i++) dl_arena_free(g->o.arena, g->blocks[i]);
    free(g->k_layer);
    free(g->sub), free(g->nsub), free(g->wpend);
    free(g->inputs_base);
    free(g->targets_base);
    free(g->lastB);
    free(g->slot_t0), free(g->slot_len), free(g->slot_kv);
    free(g->zero_targets);
    free(g->ufirst), free(g->ubound), free(g->pw), free(g->gw);
    for (int i = 0; i < g->nmoe; i++) free(g->moe[i].routed), free(g->moe[i].dropped);
    free(g->moe), free(g->moe_of);
    dl_gpt_layout_destroy(g->lay);
    free(g);
}

static int check_opts(const dl_gpt_opts *o)
{
    if (o->dtype != DL_F32 && o->dtype != DL_F64 && o->dtype != DL_BF16)
        return dl_error(DL_EINVAL, "model: dtype must be f32, f64 or bf16");
    if (o->micro_batch < 1)
        return dl_error(DL_EINVAL, "model: micro-batch must be >= 1 (got %d)", o->micro_batch);
    if (!o->arena)
        return dl_error(DL_EINVAL, "model: no arena");
    int tp = o->tp < 1 ? 1 : o->tp;
    if (tp > 1 && (!o->tp_comm || dl_comm_size(o->tp_comm) != tp))
        return dl_error(DL_EINVAL, "model: tp %d needs a tp communicator of that size", tp);
    if (o->act_slots < 0)
        return dl_error(DL_EINVAL, "model: activation slots must be >= 0 (got %d)", o->act_slots);
    int ep = o->ep < 1 ? 1 : o->ep;
    if (ep > 1 && (!o->ep_comm || dl_comm_size(o->ep_comm) != ep || ep > dl__moe_max_ep()))
        return dl_error(DL_EINVAL,
                        "model: ep %d needs an ep communicator of that size (at most %d)", ep,
                        dl__moe_max_ep());
    if (o->cfg.experts > 0 && (o->recompute || (o->part && o->part->nchunks != 1)))
        return dl_error(DL_EINVAL, "model: a mixture of experts with full recomputation or "
                                   "several chunks a stage is not supported yet");
    if (o->token_slice < 0 || o->token_slice > o->cfg.seq ||
        (o->token_slice && (o->kv_seqs < 1 || o->cfg.experts > 0)))
        return dl_error(DL_EINVAL,
                        "model: token slices of %d positions (sequence %d) need 1..sequence "
                        "positions, key/value caches >= 1 (got %d) and no mixture of experts",
                        o->token_slice, o->cfg.seq, o->kv_seqs);
    if (o->defer_w && o->recompute == DL_RECOMPUTE_FULL)
        return dl_error(DL_EINVAL, "model: deferred weight gradients with full recomputation are "
                                   "not supported (the weight part would recompute the layer)");
    return DL_OK;
}

/* The sizes: types, the shard's dimensions, the layers of each chunk, one layer's activations. */
static void set_dims(dl_gpt *g)
{
    const dl_gpt_opts *o = &g->o;
    const dl_gpt_config *c = &o->cfg;
    const dl_gpt_part *part = &g->lay->part;
    int tp = g->tp;
    g->dsize = o->dtype == DL_F64 ? 8 : 4;
    g->store = o->dtype;
    g->ssize = (int)dl_dtype_size(o->dtype);
    g->V = c->vocab, g->Tseq = c->seq, g->C = c->d_model, g->H = c->heads;
    g->T = o->token_slice > 0 ? o->token_slice : c->seq;
    g->L = 0;
    for (int ch = 0; ch < part->nchunks; ch++) {
        g->cbeg[ch] = g->L;
        g->L += part->count[ch];
        if (part->count[ch] > g->maxc)
            g->maxc = part->count[ch];
    }
    g->embed = part->embed;
    g->head = part->head;
    g->HS = g->C / g->H;
    g->Cl = g->C / tp;
    g->Fl = 4 * g->C / tp;
    g->NHl = g->H / tp;
    g->MB = o->micro_batch;
    g->N = (size_t)g->MB * g->T;
    g->ep = o->ep < 1 ? 1 : o->ep;
    g->kv_elems = o->token_slice > 0 ? (size_t)g->MB * g->Tseq * 2 * g->Cl : 0;
}

/* The measurements of each local MoE layer (model/sublayer.h). */
static int alloc_moe(dl_gpt *g, int l, int layer)
{
    if (!dl__moe_layer(&g->o.cfg, layer))
        return DL_OK;
    int E = g->o.cfg.experts;
    dl_moe_stats *s = &g->moe[g->nmoe];
    s->layer = layer, s->E = E;
    s->routed = calloc((size_t)E, sizeof(int64_t));
    s->dropped = calloc((size_t)E, sizeof(int64_t));
    if (!s->routed || !s->dropped)
        return dl_error(DL_ENOMEM, "model: out of memory");
    g->moe_of[l] = g->nmoe++;
    return DL_OK;
}

/* Each local layer's sublayers (the model variant's choice): their first tensors and where their
 * activations and stashes sit in the layer's sets (a sublayer's activations, then its output
 * when another sublayer follows); the sets are sized for the largest layer. */
static int plan_sublayers(dl_gpt *g)
{
    const dl_gpt_part *part = &g->lay->part;
    size_t L1 = (size_t)(g->L ? g->L : 1), NC = g->N * (size_t)g->C;
    g->sub = calloc(L1 * DL_SUB_MAX, sizeof *g->sub);
    g->nsub = calloc(L1, sizeof *g->nsub);
    g->moe = calloc(L1, sizeof *g->moe);
    g->moe_of = calloc(L1, sizeof *g->moe_of);
    if (!g->sub || !g->nsub || !g->moe || !g->moe_of)
        return dl_error(DL_ENOMEM, "model: out of memory");
    dl_sub_dims d = sub_dims(g, g->MB, g->T);
    for (int ch = 0, l = 0; ch < part->nchunks; ch++)
        for (int i = 0; i < part->count[ch]; i++, l++) {
            const dl_sublayer_kind *kinds[DL_SUB_MAX];
            int ns = dl__layer_sublayers(&g->o.cfg, part->first[ch] + i, kinds), k = g->k_layer[l];
            size_t act = 0, stash = 0;
            g->nsub[l] = ns;
            g->moe_of[l] = -1;
            int rc = alloc_moe(g, l, part->first[ch] + i);
            if (rc)
                return rc;
            for (int j = 0; j < ns; j++) {
                dl_sub_inst *s = &g->sub[(size_t)l * DL_SUB_MAX + j];
                s->kind = kinds[j];
                s->k = k;
                s->act_off = act;
                s->stash_off = stash;
                k += dl__sub_nheld(kinds[j], g->lay, part->first[ch] + i);
                act += kinds[j]->act_elems(&d) + (j < ns - 1 ? NC : 0);
                stash += kinds[j]->stash_elems(&d);
            }
            g->set_elems = act > g->set_elems ? act : g->set_elems;
            g->stash_elems = stash > g->stash_elems ? stash : g->stash_elems;
        }
    return DL_OK;
}

/* The tensors the kernels name (embeddings, head, each layer's first) and the host arrays. */
static int find_tensors(dl_gpt *g)
{
    const dl_gpt_config *c = &g->o.cfg;
    const dl_gpt_part *part = &g->lay->part;
    size_t N = g->N, S = (size_t)g->slots;
    g->k_wte = g->embed ? dl_gpt_find(g->lay, "wte.weight") : -1;
    g->k_wpe = g->embed ? dl_gpt_find(g->lay, "wpe.weight") : -1;
    g->k_lnf = g->head ? dl_gpt_find(g->lay, "ln_f.weight") : -1;
    g->k_lnfb = g->head ? dl_gpt_find(g->lay, "ln_f.bias") : -1;
    /* the head: lm_head, or with tying wte (the stage's own copy when it lacks the embeddings,
     * which the layout puts last) */
    g->k_head = !g->head   ? -1
                : !c->tie  ? dl_gpt_find(g->lay, "lm_head.weight")
                : g->embed ? g->k_wte
                           : g->lay->ntensors - 1;
    g->k_layer = malloc(sizeof(int) * (size_t)(g->L ? g->L : 1));
    g->inputs_base = malloc(sizeof(int) * N * S);
    g->targets_base = malloc(sizeof(int) * N * S);
    g->lastB = calloc(S, sizeof(int));
    g->slot_t0 = calloc(S, sizeof(int));
    g->slot_len = calloc(S, sizeof(int));
    g->slot_kv = calloc(S, sizeof(int));
    g->wpend = calloc(S, sizeof(int));
    g->zero_targets = calloc(N, sizeof(int));
    int nt = g->lay->ntensors;
    g->ufirst = calloc((size_t)g->L * DL_SUB_MAX + 3, sizeof(int));
    g->ubound = calloc((size_t)g->L * DL_SUB_MAX + 3, sizeof(size_t));
    g->pw = calloc((size_t)nt, sizeof(void *));
    g->gw = calloc((size_t)nt, sizeof(void *));
    if (!g->k_layer || !g->inputs_base || !g->targets_base || !g->lastB || !g->slot_t0 ||
        !g->slot_len || !g->slot_kv || !g->wpend || !g->zero_targets || !g->ufirst || !g->ubound ||
        !g->pw || !g->gw)
        return dl_error(DL_ENOMEM, "model: out of memory");
    for (size_t i = 0; i < S; i++) g->slot_len[i] = g->T;
    for (int ch = 0, l = 0; ch < part->nchunks; ch++)
        for (int i = 0; i < part->count[ch]; i++, l++) {
            char name[48];
            snprintf(name, sizeof name, "h.%d.ln_1.weight", part->first[ch] + i);
            g->k_layer[l] = dl_gpt_find(g->lay, name);
        }
    return DL_OK;
}

/* units: [embeddings], each layer, [head]; the tensors are in offset order */
static int build_units(dl_gpt *g)
{
    const dl_gpt_opts *o = &g->o;
    int nt = g->lay->ntensors;
    g->nunits = 0;
    if (g->embed)
        g->ubound[g->nunits++] = 0;
    /* a layer's first sublayer starts a unit; each other one starts one or joins its
     * predecessor's, as its kind chooses */
    for (int l = 0; l < g->L; l++)
        for (int j = 0; j < g->nsub[l]; j++) {
            dl_sub_inst *s = &g->sub[(size_t)l * DL_SUB_MAX + j];
            if (j == 0 || s->kind->unit == DL_SUB_UNIT_NEW)
                g->ubound[g->nunits++] = g->lay->t[s->k].offset;
            s->unit = g->nunits - 1;
        }
    g->u_head = g->head ? g->nunits : -1;
    if (g->head)
        g->ubound[g->nunits++] = g->lay->t[g->k_lnf].offset;
    g->ubound[g->nunits] = g->lay->numel;
    for (int u = 0, k = 0; u <= g->nunits; u++) {
        while (k < nt && g->lay->t[k].offset < g->ubound[u]) k++;
        g->ufirst[u] = k;
    }
    g->ufirst[g->nunits] = nt;
    for (int u = 0; u < g->nunits; u++)
        if (g->ubound[u + 1] - g->ubound[u] > g->umax)
            g->umax = g->ubound[u + 1] - g->ubound[u];
    g->pdirect = o->dtype != DL_BF16 && !o->gather;
    g->gdirect = o->dtype != DL_BF16 && !o->reduce;
    g->keep0 = !g->pdirect && o->cfg.tie && g->embed && g->head;
    /* full recomputation re-runs a whole layer's forward, with one materialised unit */
    for (int l = 0; l < g->L && !g->pdirect && o->recompute; l++)
        if (g->sub[(size_t)l * DL_SUB_MAX + g->nsub[l] - 1].unit !=
            g->sub[(size_t)l * DL_SUB_MAX].unit)
            return dl_error(DL_EINVAL, "model: full recomputation of a layer of several units "
                                       "needs f32/f64 parameters without ZeRO-3");
    if (g->keep0 && g->lay->part.nchunks != 1)
        return dl_error(DL_EINVAL, "model: tied embeddings and head in different chunks of one "
                                   "stage need f32/f64 parameters without ZeRO-3");
    return DL_OK;
}

/* Every buffer from the rank's arena, by memory category. */
static int alloc_buffers(dl_gpt *g)
{
    const dl_gpt_opts *o = &g->o;
    size_t N = g->N, C = g->C, S = (size_t)g->slots;
    size_t ds = (size_t)g->dsize, P = g->lay->numel, ss = (size_t)g->ssize;
    /* unit buffers: [0] any unit, [1] the embeddings' unit when kept (tied) */
    size_t u0 = g->embed ? g->ubound[1] : 0;
    size_t ucap[2] = {unit_padded(g, g->umax), g->keep0 ? unit_padded(g, u0) : 0};
    int wantp = g->store == DL_BF16, wantg = !g->gdirect, wanta = o->gather != NULL;
    size_t sets = o->recompute == DL_RECOMPUTE_FULL ? 1 : S * (size_t)g->maxc;
    size_t Fl = (size_t)g->Fl, Cl = (size_t)g->Cl, V = (size_t)g->V, T = (size_t)g->T;
    /* the keys a query may see: the sequence's with token slices (the attention's scratch) */
    size_t keys = g->kv_elems ? (size_t)g->Tseq : T;
    size_t kv = g->kv_elems * (size_t)o->kv_seqs * (size_t)g->L;
    size_t H = g->head ? S : 0;
    /* deferred weight gradients: per slot, the layers' stashes, the head's and the embeddings' */
    g->stash_slot = (size_t)g->maxc * g->stash_elems + ((size_t)g->head + (size_t)g->embed) * N * C;
    /* activations: what is kept from a forward for its backward (per slot); the backward's
     * workspace, shared by all slots, counts as other */
    struct {
        dl_mem_category cat;
        size_t elems;
        void **p;
        size_t esize; /* 0: the compute type's */
    } plan[] = {
        {DL_MEM_PARAMS, o->gather ? 0 : P, &g->params, ss},
        {DL_MEM_GRADS, o->reduce ? 0 : P, &g->grads, ss},
        {DL_MEM_COMM, wanta ? ucap[0] : 0, &g->gath[0], ss},
        {DL_MEM_COMM, wanta ? ucap[1] : 0, &g->gath[1], ss},
        {DL_MEM_OTHER, wantp ? g->umax : 0, &g->pwork[0], 4},
        {DL_MEM_OTHER, wantp ? u0 * (size_t)g->keep0 : 0, &g->pwork[1], 4},
        {o->reduce ? DL_MEM_COMM : DL_MEM_OTHER, wantg ? ucap[0] : 0, &g->gwork[0], 0},
        {o->reduce ? DL_MEM_COMM : DL_MEM_OTHER, wantg ? ucap[1] : 0, &g->gwork[1], 0},
        {DL_MEM_ACTIVATIONS, sets * g->set_elems, &g->act_base, 0},
        {DL_MEM_ACTIVATIONS, S * (size_t)(g->maxc + 1) * N * C, &g->xres_base, 0},
        {DL_MEM_ACTIVATIONS, H * N * C, &g->lnf_base, 0},
        {DL_MEM_ACTIVATIONS, H * N, &g->lnf_mean_base, 0},
        {DL_MEM_ACTIVATIONS, H * N, &g->lnf_rstd_base, 0},
        {DL_MEM_ACTIVATIONS, H * N * V, &g->probs_base, 0},
        {DL_MEM_ACTIVATIONS, H * N, &g->losses_base, 0},
        {DL_MEM_ACTIVATIONS, o->defer_w ? S * g->stash_slot : 0, &g->stash_base, 0},
        {DL_MEM_OTHER, N * C, &g->dx, 0},
        {DL_MEM_OTHER, N * C, &g->dln, 0},
        {DL_MEM_OTHER, N * 3 * Cl, &g->dqkv, 0},
        {DL_MEM_OTHER, N * Cl, &g->datty, 0},
        {DL_MEM_OTHER, N * Fl, &g->dfchg, 0},
        {DL_MEM_OTHER, g->head ? N * C : 0, &g->dlnf, 0},
        {DL_MEM_OTHER, T * keys, &g->att_scratch, 0},
        {DL_MEM_KVCACHE, kv, &g->kv_base, 0},
        {DL_MEM_KVCACHE, kv, &g->dkv_base, 0},
    };
    for (size_t i = 0; i < sizeof plan / sizeof plan[0]; i++) {
        if (!plan[i].elems)
            continue;
        size_t es = plan[i].esize ? plan[i].esize : ds;
        int rc = grab(g, plan[i].cat, plan[i].elems * es, plan[i].p);
        if (rc)
            return rc;
        if (plan[i].p == &g->gath[0] || plan[i].p == &g->gath[1])
            g->gath_bytes += plan[i].elems * es;
        if (i >= 2 && i < 8)
            g->unit_bytes += plan[i].elems * es;
    }
    return DL_OK;
}

/* The initial parameters (dl_gpt_init; bf16 storage rounds the f32 values). */
static int init_params(dl_gpt *g)
{
    size_t P = g->lay->numel;
    if (g->store == DL_BF16 && g->params) {
        float *tmp = malloc(sizeof(float) * (P ? P : 1));
        if (!tmp)
            return dl_error(DL_ENOMEM, "model: out of memory");
        dl_gpt_init(g->lay, tmp, 4, g->o.seed);
        dl_bf16_from_f32(g->params, tmp, P);
        free(tmp);
    } else if (g->params) {
        dl_gpt_init(g->lay, g->params, g->dsize, g->o.seed);
    }
    return DL_OK;
}

int dl_gpt_create(const dl_gpt_opts *o, dl_gpt **out)
{
    *out = NULL;
    int rc = check_opts(o);
    if (rc)
        return rc;
    dl_gpt *g = calloc(1, sizeof *g);
    if (!g)
        return dl_error(DL_ENOMEM, "model: out of memory");
    g->o = *o;
    g->tp = o->tp < 1 ? 1 : o->tp;
    g->slots = o->act_slots < 1 ? 1 : o->act_slots;
    int ep = o->ep > 1 ? o->ep : 1;
    rc = dl_gpt_layout_create_ep(&o->cfg, g->tp, g->tp > 1 ? dl_comm_rank(o->tp_comm) : 0, ep,
                                 ep > 1 ? dl_comm_rank(o->ep_comm) : 0, o->part, &g->lay);
    if (rc) {
        free(g);
        return rc;
    }
    set_dims(g);
    if ((rc = find_tensors(g)) || (rc = plan_sublayers(g)) || (rc = build_units(g)) ||
        (rc = alloc_buffers(g)) || (rc = init_params(g))) {
        dl_gpt_destroy(g);
        return rc;
    }
    point_direct(g);
    select_slot(g, 0, 0);
    *out = g;
    return DL_OK;
}

const dl_gpt_layout *dl_gpt_get_layout(const dl_gpt *g) { return g->lay; }

int dl_gpt_moe_layers(const dl_gpt *g) { return g->nmoe; }
dl_moe_stats *dl_gpt_moe_stats(dl_gpt *g, int i)
{
    return i >= 0 && i < g->nmoe ? &g->moe[i] : NULL;
}
void dl_gpt_moe_reset(dl_gpt *g)
{
    for (int i = 0; i < g->nmoe; i++) {
        dl_moe_stats *s = &g->moe[i];
        memset(s->routed, 0, sizeof(int64_t) * (size_t)s->E);
        memset(s->dropped, 0, sizeof(int64_t) * (size_t)s->E);
        s->seqs = 0, s->aux = s->z = 0, s->hash = 0, s->a2a_bytes = 0, s->combine_wait_ns = 0;
        s->norm_ns = s->router_ns = s->dispatch_ns = s->expert_ns = s->combine_ns = s->a2a_ns = 0;
        s->expert_flop = 0, s->peer_wait_ns = 0;
    }
}
void *dl_gpt_params(dl_gpt *g) { return g->params; }
void *dl_gpt_grads(dl_gpt *g) { return g->grads; }
size_t dl_gpt_numel(const dl_gpt *g) { return g->lay->numel; }
void dl_gpt_zero_grads(dl_gpt *g)
{
    if (g->grads)
        memset(g->grads, 0, g->lay->numel * (size_t)g->ssize);
}

int dl_gpt_num_units(const dl_gpt *g) { return g->nunits; }
size_t dl_gpt_unit_offset(const dl_gpt *g, int u)
{
    return u <= 0 ? 0 : u >= g->nunits ? g->lay->numel : g->ubound[u];
}
size_t dl_gpt_unit_bytes(const dl_gpt *g, size_t *gathered)
{
    if (gathered)
        *gathered = g->gath_bytes;
    return g->unit_bytes;
}

size_t dl_gpt_layer_offset(const dl_gpt *g, int l)
{
    if (l < g->L)
        return g->lay->t[g->k_layer[l]].offset;
    return g->head ? g->lay->t[g->k_lnf].offset : g->lay->numel;
}

static int check_tokens(const dl_gpt *g, const int *toks, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++)
        if (toks[i] < 0 || toks[i] >= g->V)
            return dl_error(DL_EINVAL, "model forward: %s token out of range at position %zu", what,
                            i);
    return DL_OK;
}

static int check_slot(const dl_gpt *g, int slot, int chunk, const char *what)
{
    if (slot < 0 || slot >= g->slots || chunk < 0 || chunk >= g->lay->part.nchunks)
        return dl_error(DL_EINVAL, "model %s: slot %d / chunk %d outside 0..%d / 0..%d", what, slot,
                        chunk, g->slots - 1, g->lay->part.nchunks - 1);
    return DL_OK;
}

int dl_gpt_slot_slice(dl_gpt *g, int slot, int cache, int t0, int len)
{
    int rc = check_slot(g, slot, 0, "token slice");
    if (rc)
        return rc;
    if (!g->kv_base || cache < 0 || cache >= g->o.kv_seqs || t0 < 0 || len < 1 || len > g->T ||
        t0 + len > g->Tseq)
        return dl_error(DL_EINVAL,
                        "model token slice: cache %d, positions %d..%d (%s; caches 0..%d, "
                        "slices of at most %d positions, sequence %d)",
                        cache, t0, t0 + len - 1,
                        g->kv_base ? "out of range" : "the model has no token slices",
                        g->o.kv_seqs - 1, g->T, g->Tseq);
    g->slot_t0[slot] = t0;
    g->slot_len[slot] = len;
    g->slot_kv[slot] = cache;
    dl__test_hook *h = dl__test_hook_get(); /* the negative control: a slice without its cache */
    if (h && h->tera_skip_cache) {
        g->slot_kv[slot] = -1;
        atomic_fetch_add(&h->skipped, 1);
    }
    return DL_OK;
}

int dl_gpt_stage_forward(dl_gpt *g, int slot, int chunk, const int *inputs, const int *targets,
                         int B, double *loss)
{
    int rc = check_slot(g, slot, chunk, "forward");
    if (rc)
        return rc;
    if (g->wpend[slot])
        return dl_error(DL_EINVAL, "model forward: slot %d's weight gradient (chunk %d) is pending",
                        slot, g->wpend[slot] - 1);
    if (B < 1 || B > g->MB)
        return dl_error(DL_EINVAL, "model forward: batch %d outside 1..%d", B, g->MB);
    select_slot(g, slot, chunk);
    size_t n = (size_t)B * rows_T(g);
    int first = g->embed && chunk == 0, last = g->head && chunk == g->lay->part.nchunks - 1;
    if (first) {
        if (!inputs)
            return dl_error(DL_EINVAL, "model forward: the first stage needs the input tokens");
        if ((rc = check_tokens(g, inputs, n, "input")))
            return rc;
        memcpy(g->inputs, inputs, n * sizeof(int));
    }
    if (last) {
        if (targets && (rc = check_tokens(g, targets, n, "target")))
            return rc;
        memcpy(g->targets, targets ? targets : g->zero_targets, n * sizeof(int));
    }
    g->lastB[slot] = B;
    return g->dsize == 8 ? forward_f64(g, g->inputs, g->targets, B, loss)
                         : forward_f32(g, g->inputs, g->targets, B, loss);
}

/* One part of the backward of (slot, chunk), in the order the parts allow: a whole backward or
 * an input part after the forward, the weight part after its input part. */
static int backward_part(dl_gpt *g, int slot, int chunk, double dloss, dl_bwd_part part,
                         dl_grad_ready_fn ready, void *arg)
{
    static const char *const what[] = {"backward", "input gradient", "weight gradient"};
    int rc = check_slot(g, slot, chunk, what[part]);
    if (rc)
        return rc;
    if (part != DL_BWD_WHOLE && !g->stash_base)
        return dl_error(DL_EINVAL, "model %s: the backward split needs opts.defer_w", what[part]);
    if (part == DL_BWD_WEIGHT && g->wpend[slot] != chunk + 1)
        return dl_error(DL_EINVAL,
                        "model weight gradient: no input gradient of slot %d chunk %d "
                        "before it",
                        slot, chunk);
    if (part != DL_BWD_WEIGHT && g->wpend[slot])
        return dl_error(DL_EINVAL, "model %s: slot %d's weight gradient (chunk %d) is pending",
                        what[part], slot, g->wpend[slot] - 1);
    if (!g->lastB[slot])
        return dl_error(DL_EINVAL, "model %s: no forward in slot %d to differentiate", what[part],
                        slot);
    select_slot(g, slot, chunk);
    rc = g->dsize == 8 ? backward_f64(g, dloss, part, ready, arg)
                       : backward_f32(g, dloss, part, ready, arg);
    g->wpend[slot] = part == DL_BWD_INPUT ? chunk + 1 : 0;
    /* a slot's head outputs were overwritten by their gradient; the chunk's forward is spent once
     * the weight gradient is done */
    if (g->head && chunk == g->lay->part.nchunks - 1 && part != DL_BWD_INPUT)
        g->lastB[slot] = 0;
    return rc;
}

int dl_gpt_stage_backward(dl_gpt *g, int slot, int chunk, double dloss, dl_grad_ready_fn ready,
                          void *arg)
{
    return backward_part(g, slot, chunk, dloss, DL_BWD_WHOLE, ready, arg);
}

int dl_gpt_stage_backward_input(dl_gpt *g, int slot, int chunk, double dloss)
{
    return backward_part(g, slot, chunk, dloss, DL_BWD_INPUT, NULL, NULL);
}

int dl_gpt_stage_backward_weight(dl_gpt *g, int slot, int chunk, dl_grad_ready_fn ready, void *arg)
{
    return backward_part(g, slot, chunk, 0.0, DL_BWD_WEIGHT, ready, arg);
}

void *dl_gpt_stage_input(dl_gpt *g, int slot, int chunk)
{
    if (check_slot(g, slot, chunk, "input"))
        return NULL;
    select_slot(g, slot, chunk);
    return g->xres;
}

const void *dl_gpt_stage_output(dl_gpt *g, int slot, int chunk)
{
    if (check_slot(g, slot, chunk, "output"))
        return NULL;
    select_slot(g, slot, chunk);
    return (const char *)g->xres +
           (size_t)g->lay->part.count[chunk] * g->N * (size_t)g->C * (size_t)g->dsize;
}

void *dl_gpt_stage_grad(dl_gpt *g) { return g->dx; }

void *dl_gpt_use_params(dl_gpt *g, void *params)
{
    void *old = g->params;
    g->params = params;
    point_direct(g);
    return old;
}

int dl_gpt_forward(dl_gpt *g, const int *inputs, const int *targets, int B, double *loss)
{
    if (g->lay->part.nchunks != 1 || !g->embed || !g->head)
        return dl_error(DL_EINVAL, "model forward: this rank holds a pipeline stage; use "
                                   "dl_gpt_stage_forward");
    return dl_gpt_stage_forward(g, 0, 0, inputs, targets, B, loss);
}

int dl_gpt_backward(dl_gpt *g, double dloss, dl_grad_ready_fn ready, void *arg)
{
    if (!g->lastB[0])
        return dl_error(DL_EINVAL, "model backward: no forward to differentiate");
    return dl_gpt_stage_backward(g, 0, 0, dloss, ready, arg);
}

const void *dl_gpt_probs(const dl_gpt *g, int b, int t)
{
    return (const char *)g->probs +
           ((size_t)b * g->T + (size_t)t) * (size_t)g->V * (size_t)g->dsize;
}
