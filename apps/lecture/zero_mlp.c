/* The lecture's ZeRO experiment on rank threads: see zero_mlp.h. */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "distlab.h"
#include "core/bf16.h"
#include "model/ops.h"
#include "zero_mlp.h"

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

/* dW, dbias (written, rounded to the stored type) and, when dx != NULL, dx = dz · W (written) */
static void lin_bwd(void *dW, float *dx, const float *dz, const float *x, const void *W, dl_dtype t,
                    int B, int in, int out)
{
    for (int o = 0; o < out; o++) {
        for (int i = 0; i < in; i++) {
            float acc = 0;
            for (int b = 0; b < B; b++) acc += dz[(size_t)b * out + o] * x[(size_t)b * in + i];
            st(dW, t, (size_t)o * in + i, acc);
        }
        float acc = 0;
        for (int b = 0; b < B; b++) acc += dz[(size_t)b * out + o];
        st(dW, t, (size_t)out * in + o, acc);
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

/* ---- one rank ------------------------------------------------------------------------------ */

typedef struct zm_job {
    const zm_opts *o;
    zm_result *r;
} zm_job;

typedef struct zm_rank_state {
    dl_arena *A;
    void *comm_tmp
        [2]; /* transient layer buffers (stage 2: gradient; stage 3: parameters, gradient) */
} zm_rank_state;

static int tmp_alloc(zm_rank_state *s, int k, size_t bytes)
{
    return dl_arena_alloc(s->A, DL_MEM_COMM, bytes, &s->comm_tmp[k]);
}

static void tmp_free(zm_rank_state *s, int k)
{
    dl_arena_free(s->A, s->comm_tmp[k]);
    s->comm_tmp[k] = NULL;
}

/* Layer l's weights: in params, or (stage 3) gathered from every rank's shard into comm_tmp[0],
 * which the caller frees after the layer. */
static int layer_weights(zm_rank_state *s, dl_comm *c, const zm_layout *L, int l, int stage,
                         const void *params, dl_dtype t, const void **W)
{
    size_t es = dl_dtype_size(t);
    *W = (const char *)params + L->off[l] * es;
    if (stage != 3)
        return DL_OK;
    int rc = tmp_alloc(s, 0, L->pad[l] * es);
    if (rc == DL_OK)
        rc = dl_allgather(c, (const char *)params + L->soff[l] * es, s->comm_tmp[0], L->pad[l], t,
                          DL_PURPOSE_PARAMS);
    *W = s->comm_tmp[0];
    return rc;
}

static int zm_rank(dl_ctx *x, void *arg)
{
    zm_job *job = arg;
    const zm_opts *o = job->o;
    zm_result *res = job->r;
    const zm_layout *L = &res->L;
    const int n = dl_ctx_size(x), r = dl_ctx_rank(x), stage = n == 1 ? 0 : o->stage;
    const dl_dtype t = o->dtype;
    const size_t es = dl_dtype_size(t);
    const int Bl = o->batch / n;
    dl_comm *c = dl_ctx_comm(x);
    dl_comm_set_algo(c, DL_ALGO_RING); /* the lecture's ring accounting, and one summation order */
    zm_rank_state S = {.A = dl_ctx_arena(x)};
    dl_arena *A = S.A;

    /* model states (the sizes the stage keeps), activations, and per-layer optimizer ranges */
    size_t nparams = stage == 3 ? L->shard : L->ppad, ngrads = stage >= 2 ? L->shard : L->ppad;
    size_t nopt = stage == 0 ? L->ppad : L->shard;
    void *params = NULL, *grads = NULL;
    float *master = NULL, *m = NULL, *v = NULL, *act = NULL;
    size_t obase[ZM_LAYERS], e0[ZM_LAYERS], cnt[ZM_LAYERS];
    for (int l = 0; l < ZM_LAYERS; l++) {
        obase[l] = stage == 0 ? L->off[l] : L->soff[l];
        e0[l] = stage == 0 ? 0 : (size_t)r * L->blk[l];
        cnt[l] = stage == 0 ? L->pad[l] : L->blk[l];
    }
    /* activations: each layer's input x_l and pre-activation z_l, targets, and two gradient rows */
    size_t aoff[ZM_LAYERS + 1], zoff[ZM_LAYERS], na = 0;
    for (int l = 0; l < ZM_LAYERS; l++) {
        aoff[l] = na;
        na += (size_t)Bl * L->in[l];
        zoff[l] = na;
        na += (size_t)Bl * L->out[l];
    }
    aoff[ZM_LAYERS] = na; /* targets */
    na += (size_t)Bl;
    size_t gmax = 0;
    for (int l = 0; l <= ZM_LAYERS; l++) gmax = (size_t)DIMS[l] > gmax ? (size_t)DIMS[l] : gmax;
    size_t dz_off = na, dx_off = na + (size_t)Bl * gmax;
    na += 2 * (size_t)Bl * gmax;

    int rc;
    if ((rc = dl_arena_alloc(A, DL_MEM_PARAMS, nparams * es, &params)) ||
        (rc = dl_arena_alloc(A, DL_MEM_GRADS, ngrads * es, &grads)) ||
        (rc = dl_arena_alloc(A, DL_MEM_OPTIMIZER, nopt * sizeof(float), (void **)&master)) ||
        (rc = dl_arena_alloc(A, DL_MEM_OPTIMIZER, nopt * sizeof(float), (void **)&m)) ||
        (rc = dl_arena_alloc(A, DL_MEM_OPTIMIZER, nopt * sizeof(float), (void **)&v)) ||
        (rc = dl_arena_alloc(A, DL_MEM_ACTIVATIONS, na * sizeof(float), (void **)&act)))
        goto out;

    /* initialise: the master copy of this rank's range, the parameters this rank stores */
    for (int l = 0; l < ZM_LAYERS; l++) {
        for (size_t k = 0; k < cnt[l]; k++)
            master[obase[l] + k] = init_value(L, o->seed, l, e0[l] + k);
        if (stage == 3) {
            for (size_t k = 0; k < L->blk[l]; k++)
                st(params, t, L->soff[l] + k, master[obase[l] + k]);
        } else {
            for (size_t e = 0; e < L->pad[l]; e++)
                st(params, t, L->off[l] + e, init_value(L, o->seed, l, e));
        }
    }

    dl_comm_reset_stats(c);
    for (int step = 1; step <= o->steps && rc == 0; step++) {
        /* this rank's contiguous share of the global batch (global sample index) */
        uint64_t s0 = (uint64_t)(step - 1) * (uint64_t)o->batch + (uint64_t)r * (uint64_t)Bl;
        for (int b = 0; b < Bl; b++)
            sample(o->seed, s0 + (uint64_t)b, act + aoff[0] + (size_t)b * DIMS[0],
                   act + aoff[ZM_LAYERS] + b);

        /* forward */
        for (int l = 0; l < ZM_LAYERS && rc == 0; l++) {
            const void *W;
            if ((rc = layer_weights(&S, c, L, l, stage, params, t, &W)))
                break;
            lin_fwd(act + zoff[l], act + aoff[l], W, t, Bl, L->in[l], L->out[l]);
            if (l + 1 < ZM_LAYERS)
                dl_gelu_fwd_f32(act + aoff[l + 1], act + zoff[l], (size_t)Bl * L->out[l]);
            if (stage == 3)
                tmp_free(&S, 0);
        }
        if (rc)
            break;

        /* loss = 1/(2G) sum (yhat - y)^2 over the global batch G; dz = (yhat - y)/G */
        const float *yhat = act + zoff[ZM_LAYERS - 1], *y = act + aoff[ZM_LAYERS];
        float *dz = act + dz_off, *dx = act + dx_off;
        float lsum = 0;
        for (int b = 0; b < Bl; b++) {
            float d = yhat[b] - y[b];
            lsum += d * d / (2.0f * (float)o->batch);
            dz[b] = d / (float)o->batch;
        }
        if (n > 1 && (rc = dl_allreduce(c, &lsum, &lsum, 1, DL_F32, DL_SUM, DL_PURPOSE_LOSS)))
            break;
        if (r == 0)
            res->loss[step - 1] = lsum;

        /* backward, layer by layer from the last; each layer's gradient goes as soon as it exists */
        for (int l = ZM_LAYERS - 1; l >= 0 && rc == 0; l--) {
            const void *W;
            if ((rc = layer_weights(&S, c, L, l, stage, params, t, &W)))
                break;
            void *G = (char *)grads + L->off[l] * es;
            if (stage >= 2) {
                if ((rc = tmp_alloc(&S, 1, L->pad[l] * es)))
                    break; /* zeroed: the padding stays 0 */
                G = S.comm_tmp[1];
            }
            lin_bwd(G, l > 0 ? dx : NULL, dz, act + aoff[l], W, t, Bl, L->in[l], L->out[l]);
            if (l > 0) { /* through the GeLU: dz_{l-1} = gelu'(z_{l-1}) dx */
                memset(dz, 0, sizeof(float) * (size_t)Bl * L->in[l]);
                dl_gelu_bwd_f32(dz, act + zoff[l - 1], dx, (size_t)Bl * L->in[l]);
            }
            if (stage == 3)
                tmp_free(&S, 0);
            if (n > 1) {
                if (stage == 0)
                    rc = dl_allreduce(c, G, G, L->pad[l], t, DL_SUM, DL_PURPOSE_GRADS);
                else if (stage == 1) /* in place: this rank's block of the full gradient */
                    rc = dl_reduce_scatter(c, G, (char *)G + e0[l] * es, L->pad[l], t, DL_SUM,
                                           DL_PURPOSE_GRADS);
                else
                    rc = dl_reduce_scatter(c, G, (char *)grads + L->soff[l] * es, L->pad[l], t,
                                           DL_SUM, DL_PURPOSE_GRADS);
            }
            if (stage >= 2)
                tmp_free(&S, 1);
        }
        if (rc)
            break;

        /* Adam on this rank's range (fp32 master, m, v), then the stored parameters */
        for (int l = 0; l < ZM_LAYERS; l++) {
            const char *g = stage >= 2 ? (const char *)grads + L->soff[l] * es
                                       : (const char *)grads + (L->off[l] + e0[l]) * es;
            char *p = stage == 3 ? (char *)params + L->soff[l] * es
                                 : (char *)params + (L->off[l] + e0[l]) * es;
            float gbuf[256];
            for (size_t k0 = 0; k0 < cnt[l]; k0 += 256) {
                size_t k1 = k0 + 256 < cnt[l] ? k0 + 256 : cnt[l];
                for (size_t k = k0; k < k1; k++) gbuf[k - k0] = ld(g, t, k);
                float *mw = master + obase[l];
                dl_adamw_f32(mw + k0, gbuf, m + obase[l] + k0, v + obase[l] + k0, k1 - k0, o->lr,
                             0.9f, 0.999f, 1e-8f, 0.0f, 1.0f, step);
                for (size_t k = k0; k < k1; k++) st(p, t, k, mw[k]);
            }
        }
        if (n > 1 && (stage == 1 || stage == 2))
            for (int l = 0; l < ZM_LAYERS && rc == 0; l++) /* in place: this rank's block */
                rc = dl_allgather(c, (char *)params + (L->off[l] + e0[l]) * es,
                                  (char *)params + L->off[l] * es, L->pad[l], t, DL_PURPOSE_PARAMS);
    }
    if (rc)
        goto out;

    /* results: counters, arena peaks, this rank's master range (stage 0: rank 0's full copy) */
    dl_comm_stats cs;
    dl_comm_get_stats(c, &cs);
    memcpy(res->sent[r], cs.bytes_sent, sizeof res->sent[r]);
    res->ops[r] = cs.ops;
    dl_arena_stats as;
    dl_arena_get_stats(A, &as);
    memcpy(res->peak[r], as.peak, sizeof res->peak[r]);
    if (stage != 0 || r == 0)
        for (int l = 0; l < ZM_LAYERS; l++)
            memcpy(res->master + L->off[l] + e0[l], master + obase[l], cnt[l] * sizeof(float));
out:
    tmp_free(&S, 0);
    tmp_free(&S, 1);
    dl_arena_free(A, act);
    dl_arena_free(A, v);
    dl_arena_free(A, m);
    dl_arena_free(A, master);
    dl_arena_free(A, grads);
    dl_arena_free(A, params);
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
