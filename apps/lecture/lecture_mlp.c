/* The lecture's ZeRO experiment on rank threads: see lecture_mlp.h. */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "distlab.h"
#include "core/bf16.h"
#include "model/ops.h"
#include "parallel/zero_engine.h"
#include "train/optim.h"
#include "lecture_mlp.h"

static const int DIMS[ZM_LAYERS + 1] = {16, 32, 32, 1};

void zm_opts_init(zm_opts *o)
{
    memset(o, 0, sizeof *o);
    o->nranks = 4;
    o->stage = 0;
    o->steps = 5;
    o->batch = 64;
    o->dtype = DL_BF16;
    o->lr = 1e-3f;
    o->seed = 17;
}

int zm_layout_init(zm_layout *L, int n)
{
    if (n < 1 || n > ZM_MAX_RANKS)
        return dl_error(DL_EINVAL, "zero MLP: %d ranks (1..%d)", n, ZM_MAX_RANKS);
    memset(L, 0, sizeof *L);
    L->n = n;
    size_t off = 0, soff = 0;
    for (int l = 0; l < ZM_LAYERS; l++) {
        L->in[l] = DIMS[l];
        L->out[l] = DIMS[l + 1];
        L->numel[l] = (size_t)L->out[l] * L->in[l] + L->out[l];
        L->pad[l] = (L->numel[l] + n - 1) / n * n;
        L->off[l] = off;
        L->blk[l] = L->pad[l] / n;
        L->soff[l] = soff;
        off += L->pad[l];
        soff += L->blk[l];
        L->psi += L->numel[l];
    }
    L->ppad = off;
    L->shard = soff;
    return DL_OK;
}

/* ---- counter-based generators: the same value for (seed, key) on every rank -------------- */

static uint64_t mix(uint64_t z)
{
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* uniform in [-1, 1) from (seed, a, b) */
static float unif(uint64_t seed, uint64_t a, uint64_t b)
{
    uint64_t z = mix(mix(mix(seed) ^ a) ^ b);
    return (float)(2.0 * (double)(z >> 40) / 16777216.0 - 1.0);
}

/* initial value of element e of layer l (PyTorch's nn.Linear range, +-1/sqrt(in)); padding 0 */
static float init_value(const zm_layout *L, uint64_t seed, int l, size_t e)
{
    if (e >= L->numel[l])
        return 0.0f;
    return unif(seed, 1000 + (uint64_t)l, e) / sqrtf((float)L->in[l]);
}

/* sample s: x in [-1, 1)^16, y = sin(x . c) + x0 x1 / 2, c_i = (-1)^i (i + 1) / 16 */
static void sample(uint64_t seed, uint64_t s, float *x, float *y)
{
    float dot = 0;
    for (int i = 0; i < DIMS[0]; i++) {
        x[i] = unif(seed, 7, s * (uint64_t)DIMS[0] + (uint64_t)i);
        dot += x[i] * (float)((i % 2 ? -1 : 1) * (i + 1)) / 16.0f;
    }
    *y = sinf(dot) + 0.5f * x[0] * x[1];
}

/* ---- parameters and gradients in bf16 or f32 ---------------------------------------------- */

static inline float ld(const void *p, dl_dtype t, size_t i)
{
    return t == DL_BF16 ? dl_bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

static inline void st(void *p, dl_dtype t, size_t i, float v)
{
    if (t == DL_BF16)
        ((uint16_t *)p)[i] = dl_f32_to_bf16(v);
    else
        ((float *)p)[i] = v;
}

/* z (B, out) = x (B, in) · Wᵀ + bias; W and the bias from the layer's stored elements */
static void lin_fwd(float *z, const float *x, const void *W, dl_dtype t, int B, int in, int out)
{
    for (int b = 0; b < B; b++)
        for (int o = 0; o < out; o++) {
            float acc = ld(W, t, (size_t)out * in + o);
            for (int i = 0; i < in; i++)
                acc += ld(W, t, (size_t)o * in + i) * x[(size_t)b * in + i];
            z[(size_t)b * out + o] = acc;
        }
}

/* dW, dbias (written, rounded to gt, the gradient's type) and, when dx != NULL, dx = dz · W
 * (written); W in type t */
static void lin_bwd(void *dW, dl_dtype gt, float *dx, const float *dz, const float *x,
                    const void *W, dl_dtype t, int B, int in, int out)
{
    for (int o = 0; o < out; o++) {
        for (int i = 0; i < in; i++) {
            float acc = 0;
            for (int b = 0; b < B; b++) acc += dz[(size_t)b * out + o] * x[(size_t)b * in + i];
            st(dW, gt, (size_t)o * in + i, acc);
        }
        float acc = 0;
        for (int b = 0; b < B; b++) acc += dz[(size_t)b * out + o];
        st(dW, gt, (size_t)out * in + o, acc);
    }
    if (dx == NULL)
        return;
    for (int b = 0; b < B; b++)
        for (int i = 0; i < in; i++) {
            float acc = 0;
            for (int o = 0; o < out; o++)
                acc += dz[(size_t)b * out + o] * ld(W, t, (size_t)o * in + i);
            dx[(size_t)b * in + i] = acc;
        }
}

/* ---- one rank: the MLP's forward and backward on the ZeRO engine --------------------------- */

typedef struct zm_job {
    const zm_opts *o;
    zm_result *r;
} zm_job;

static char *shard_grad(void *arg, int u) { return dl_zero_grad_block(arg, u); }
static char *shard_param(void *arg, int u) { return dl_zero_param_block(arg, u); }

/* One rank's model: its flat buffers (the engine's units are the padded layers), the engine, the
 * optimizer over the engine's blocks, activations. */
typedef struct zm_rank_state {
    const zm_opts *o;
    const zm_layout *L;
    dl_arena *A;
    dl_comm *c;
    int n, r, stage, Bl;
    dl_dtype t;
    size_t es;
    void *params, *grads; /* params NULL at stage 3, grads NULL at stages 2-3 */
    dl_zero_engine z;
    tr_prec pr;
    tr_shards sh;
    tr_optim op;
    float *act;
    size_t aoff[ZM_LAYERS + 1], zoff[ZM_LAYERS], dz_off, dx_off;
} zm_rank_state;

/* activations: each layer's input x_l and pre-activation z_l, targets, and two gradient rows */
static size_t act_layout(zm_rank_state *s)
{
    size_t na = 0, gmax = 0;
    for (int l = 0; l < ZM_LAYERS; l++) {
        s->aoff[l] = na;
        na += (size_t)s->Bl * s->L->in[l];
        s->zoff[l] = na;
        na += (size_t)s->Bl * s->L->out[l];
    }
    s->aoff[ZM_LAYERS] = na; /* targets */
    na += (size_t)s->Bl;
    for (int l = 0; l <= ZM_LAYERS; l++) gmax = (size_t)DIMS[l] > gmax ? (size_t)DIMS[l] : gmax;
    s->dz_off = na;
    s->dx_off = na + (size_t)s->Bl * gmax;
    return na + 2 * (size_t)s->Bl * gmax;
}

/* The model's buffers (the sizes the stage keeps), the engine, the optimizer, the initial
 * weights (the engine keeps this rank's part of them). */
static int zm_setup(zm_rank_state *s)
{
    const zm_layout *L = s->L;
    size_t bounds[ZM_LAYERS + 1];
    for (int l = 0; l < ZM_LAYERS; l++) bounds[l] = L->off[l];
    bounds[ZM_LAYERS] = L->ppad;
    size_t na = act_layout(s);
    int rc;
    dl_zero_engine_init(&s->z, s->stage, s->t, s->c);
    tr_prec_init(&s->pr, s->t);
    if ((s->stage < 3 && (rc = dl_arena_alloc(s->A, DL_MEM_PARAMS, L->ppad * s->es, &s->params))) ||
        (s->stage < 2 && (rc = dl_arena_alloc(s->A, DL_MEM_GRADS, L->ppad * s->es, &s->grads))) ||
        (rc =
             dl_zero_engine_setup(&s->z, bounds, ZM_LAYERS, s->n, s->r, s->params, s->grads, s->A)))
        return rc;
    s->sh = (tr_shards){&s->z.zu, shard_grad, shard_param, (float *)s->z.master, &s->z};
    tr_adam_hp hp = {0.9, 0.999, 1e-8, 0.0};
    if ((rc = tr_optim_init(&s->op, &s->sh, &s->pr, &hp, s->A)) ||
        (rc = dl_arena_alloc(s->A, DL_MEM_ACTIVATIONS, na * sizeof(float), (void **)&s->act)))
        return rc;
    float *full = calloc(L->ppad, sizeof(float));
    if (!full)
        return dl_error(DL_ENOMEM, "zero MLP: out of memory");
    for (int l = 0; l < ZM_LAYERS; l++)
        for (size_t e = 0; e < L->pad[l]; e++)
            full[L->off[l] + e] = init_value(L, s->o->seed, l, e);
    dl_zero_import(&s->z, full);
    free(full);
    return DL_OK;
}

/* Layer l's weights: in the model's buffer, or (stage 3) gathered by the engine's hook into a
 * transient comm buffer *tmp, which the caller frees after the layer. */
static int layer_weights(zm_rank_state *s, int l, const void **W, void **tmp)
{
    *W = (const char *)s->params + s->L->off[l] * s->es;
    if (s->stage != 3)
        return DL_OK;
    int rc = dl_arena_alloc(s->A, DL_MEM_COMM, s->L->pad[l] * s->es, tmp);
    if (rc == DL_OK)
        rc = dl_zero_gather_hook(&s->z, l, *tmp);
    *W = *tmp;
    return rc;
}

/* One step's forward on this rank's share of the global batch; the loss over all ranks. */
static int zm_forward(zm_rank_state *s, int step, float *loss)
{
    const zm_layout *L = s->L;
    float *act = s->act;
    int rc = DL_OK, B = s->o->batch;
    /* this rank's contiguous share of the global batch (global sample index) */
    uint64_t s0 = (uint64_t)(step - 1) * (uint64_t)B + (uint64_t)s->r * (uint64_t)s->Bl;
    for (int b = 0; b < s->Bl; b++)
        sample(s->o->seed, s0 + (uint64_t)b, act + s->aoff[0] + (size_t)b * DIMS[0],
               act + s->aoff[ZM_LAYERS] + b);
    for (int l = 0; l < ZM_LAYERS && rc == DL_OK; l++) {
        const void *W;
        void *tmp = NULL;
        if ((rc = layer_weights(s, l, &W, &tmp)) == DL_OK) {
            lin_fwd(act + s->zoff[l], act + s->aoff[l], W, s->t, s->Bl, L->in[l], L->out[l]);
            if (l + 1 < ZM_LAYERS)
                dl_gelu_fwd_f32(act + s->aoff[l + 1], act + s->zoff[l], (size_t)s->Bl * L->out[l]);
        }
        dl_arena_free(s->A, tmp);
    }
    if (rc)
        return rc;
    /* loss = 1/(2G) sum (yhat - y)^2 over the global batch G; dz = (yhat - y)/G */
    const float *yhat = act + s->zoff[ZM_LAYERS - 1], *y = act + s->aoff[ZM_LAYERS];
    float *dz = act + s->dz_off, lsum = 0;
    for (int b = 0; b < s->Bl; b++) {
        float d = yhat[b] - y[b];
        lsum += d * d / (2.0f * (float)B);
        dz[b] = d / (float)B;
    }
    if (s->n > 1 && (rc = dl_allreduce(s->c, &lsum, &lsum, 1, DL_F32, DL_SUM, DL_PURPOSE_LOSS)))
        return rc;
    *loss = lsum;
    return DL_OK;
}

/* The backward, layer by layer from the last; each layer's gradient goes as soon as it exists:
 * stage 0 all-reduces it (plain data parallelism), stage 1 hands it to the engine's
 * reduce-scatter in place, stages 2-3 compute it into a transient comm buffer (the compute type,
 * zeroed: the padding stays 0) for the engine's reduce hook. */
static int zm_backward(zm_rank_state *s)
{
    const zm_layout *L = s->L;
    float *act = s->act, *dz = act + s->dz_off, *dx = act + s->dx_off;
    int rc = DL_OK;
    for (int l = ZM_LAYERS - 1; l >= 0 && rc == DL_OK; l--) {
        const void *W;
        void *tmp = NULL, *G = (char *)s->grads + L->off[l] * s->es;
        if ((rc = layer_weights(s, l, &W, &tmp)) == DL_OK && s->stage >= 2)
            rc = dl_arena_alloc(s->A, DL_MEM_COMM, L->pad[l] * s->pr.csize, &G);
        if (rc == DL_OK) {
            lin_bwd(G, s->stage >= 2 ? s->pr.ct : s->t, l > 0 ? dx : NULL, dz, act + s->aoff[l], W,
                    s->t, s->Bl, L->in[l], L->out[l]);
            if (l > 0) { /* through the GeLU: dz_{l-1} = gelu'(z_{l-1}) dx */
                memset(dz, 0, sizeof(float) * (size_t)s->Bl * L->in[l]);
                dl_gelu_bwd_f32(dz, act + s->zoff[l - 1], dx, (size_t)s->Bl * L->in[l]);
            }
        }
        dl_arena_free(s->A, tmp);
        if (rc == DL_OK && s->stage >= 2)
            rc = dl_zero_reduce_hook(&s->z, l, G);
        else if (rc == DL_OK && s->stage == 1)
            rc = dl_zero_ready(&s->z, L->off[l]);
        else if (rc == DL_OK && s->n > 1)
            rc = dl_allreduce(s->c, G, G, L->pad[l], s->t, DL_SUM, DL_PURPOSE_GRADS);
        if (s->stage >= 2)
            dl_arena_free(s->A, G);
    }
    return rc;
}

static void zm_free(zm_rank_state *s)
{
    dl_arena_free(s->A, s->act);
    tr_optim_free(&s->op);
    dl_zero_engine_free(&s->z);
    dl_arena_free(s->A, s->grads);
    dl_arena_free(s->A, s->params);
}

static int zm_rank(dl_ctx *x, void *arg)
{
    zm_job *job = arg;
    const zm_opts *o = job->o;
    zm_result *res = job->r;
    int n = dl_ctx_size(x), r = dl_ctx_rank(x);
    zm_rank_state S = {.o = o,
                       .L = &res->L,
                       .A = dl_ctx_arena(x),
                       .c = dl_ctx_comm(x),
                       .n = n,
                       .r = r,
                       .stage = n == 1 ? 0 : o->stage,
                       .Bl = o->batch / n,
                       .t = o->dtype,
                       .es = dl_dtype_size(o->dtype)};
    zm_rank_state *s = &S;
    dl_comm_set_algo(s->c, DL_ALGO_RING); /* the lecture's ring accounting, one summation order */
    int rc = zm_setup(s);
    if (rc == DL_OK)
        dl_comm_reset_stats(s->c);
    for (int step = 1; step <= o->steps && rc == DL_OK; step++) {
        float loss;
        dl_zero_begin_step(&s->z);
        if ((rc = zm_forward(s, step, &loss)) || (rc = zm_backward(s)))
            break;
        if (r == 0)
            res->loss[step - 1] = loss;
        /* Adam on this rank's blocks (bf16: the fp32 master), then stages 1-2 all-gather */
        tr_optim_step(&s->op, 1.0, o->lr);
        if (s->stage == 1 || s->stage == 2)
            rc = dl_zero_gather_params(&s->z);
    }
    if (rc == DL_OK) {
        /* results: counters, arena peaks, then the whole fp32 weights (the export's traffic is
         * purpose OTHER and after the counters) */
        dl_comm_stats cs;
        dl_comm_get_stats(s->c, &cs);
        memcpy(res->sent[r], cs.bytes_sent, sizeof res->sent[r]);
        res->ops[r] = cs.ops;
        dl_arena_stats as;
        dl_arena_get_stats(s->A, &as);
        memcpy(res->peak[r], as.peak, sizeof res->peak[r]);
        float *full = malloc(res->L.ppad * sizeof(float) + 64);
        rc = full ? dl_zero_export(&s->z, 0, full) : dl_error(DL_ENOMEM, "zero MLP: out of memory");
        if (rc == DL_OK && r == 0)
            memcpy(res->master, full, res->L.ppad * sizeof(float));
        free(full);
    }
    zm_free(s);
    return rc;
}

int zm_run(const zm_opts *o, zm_result *r)
{
    if (o == NULL || r == NULL)
        return dl_error(DL_EINVAL, "zero MLP: NULL argument");
    memset(r, 0, sizeof *r);
    if (o->stage < 0 || o->stage > 3 || o->steps < 1 || o->steps > ZM_MAX_STEPS || o->nranks < 1 ||
        o->nranks > ZM_MAX_RANKS || o->batch < o->nranks || o->batch % o->nranks != 0 ||
        (o->dtype != DL_BF16 && o->dtype != DL_F32) || !(o->lr > 0))
        return dl_error(DL_EINVAL,
                        "zero MLP: bad options (stage %d, steps %d, %d ranks, batch %d, dtype %s, "
                        "lr %g)",
                        o->stage, o->steps, o->nranks, o->batch, dl_dtype_name(o->dtype),
                        (double)o->lr);
    int rc = zm_layout_init(&r->L, o->nranks);
    if (rc)
        return rc;
    r->opts = *o;
    r->master = calloc(r->L.ppad, sizeof(float));
    if (r->master == NULL)
        return dl_error(DL_ENOMEM, "zero MLP: out of memory");
    dl_world_opts wo;
    dl_world_opts_init(&wo);
    wo.nranks = o->nranks;
    wo.timeout_s = 60;
    zm_job job = {o, r};
    rc = dl_world_run(&wo, zm_rank, &job);
    if (rc)
        zm_result_free(r);
    return rc;
}

void zm_result_free(zm_result *r)
{
    if (r == NULL)
        return;
    free(r->master);
    r->master = NULL;
}

double zm_maxdiff(const zm_result *a, const zm_result *b)
{
    double d = 0;
    for (int l = 0; l < ZM_LAYERS; l++)
        for (size_t e = 0; e < a->L.numel[l]; e++) {
            double x =
                fabs((double)a->master[a->L.off[l] + e] - (double)b->master[b->L.off[l] + e]);
            if (!(x <= d))
                d = x; /* NaN propagates */
        }
    return d;
}

size_t zm_count_above(const zm_result *a, const zm_result *b, double tol)
{
    size_t k = 0;
    for (int l = 0; l < ZM_LAYERS; l++)
        for (size_t e = 0; e < a->L.numel[l]; e++)
            k += !(fabs((double)a->master[a->L.off[l] + e] - (double)b->master[b->L.off[l] + e]) <=
                   tol);
    return k;
}

double zm_maxabs(const zm_result *a)
{
    double d = 0;
    for (int l = 0; l < ZM_LAYERS; l++)
        for (size_t e = 0; e < a->L.numel[l]; e++)
            if (fabs((double)a->master[a->L.off[l] + e]) > d)
                d = fabs((double)a->master[a->L.off[l] + e]);
    return d;
}

uint64_t zm_state_bytes(const zm_result *r, int rank)
{
    return r->peak[rank][DL_MEM_PARAMS] + r->peak[rank][DL_MEM_GRADS] +
           r->peak[rank][DL_MEM_OPTIMIZER];
}
