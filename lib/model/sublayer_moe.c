/* The mixture-of-experts MLP (model/sublayer.h), the MLP of the config's MoE layers:
 *   y = x + Σ_c admitted gate_c · expert_{e_c}(ln_2(x))
 * with a router (a linear layer to E logits, no bias), softmax probabilities p, the top-k
 * experts by p (ties to the lower index), gates p (k = 1) or the k chosen p's renormalised to sum
 * 1 (k >= 2, once, before drops). Routing group = one sequence: each expert admits at most
 * ceil(capacity · T · k / E) choices of a sequence (capacity 0: no limit), in position order and
 * within a position by choice rank, so a token's admission depends on earlier tokens only; a
 * dropped choice contributes 0 and gets no gradient, and gates are not renormalised after drops.
 * The objective adds, per sequence and MoE layer, α · E · Σ_i f_i P_i (f_i: the fraction of the
 * sequence's k·T choices that selected i before drops; P_i: the mean of p_i over its T tokens)
 * and β · the mean over its tokens of logsumexp(logits)², both averaged over the global batch's
 * sequences and the MoE layers.
 *
 * Expert parallelism (ep > 1, ctx->ep_comm): rank q of the ep group holds experts
 * [q E/ep, (q+1) E/ep). Each rank routes its own tokens; the admitted choices go, grouped by
 * expert (so by destination), to the expert's rank in one all-to-all-v (the dispatch) after the
 * per-expert counts have been exchanged in another; the expert outputs come back in a third (the
 * combine). The backward sends the output gradients to the experts and their input gradients
 * back: two more. A rank with no token for another sends it nothing, and the counts each side
 * derives are checked by the all-to-all-v (a disagreement is DL_EMISMATCH). At ep 1 the same code
 * runs with the exchanges as copies.
 *
 * Everything the backward and the deferred weight part need stays in the activation set (no
 * stash): the weight part reads the expert rows' output and pre-activation gradients, the router
 * logits' gradient and ln_2's output gradient the input part left there. */
#include "config.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "distlab.h"
#include "model/ops.h"
#include "model/sublayer.h"

/* the parameters: ln_2, the router, then per expert its four (layout order) */
enum { MO_LN_W, MO_LN_B, MO_ROUTER, MO_FIXED };
enum { EX_FC_W, EX_FC_B, EX_PROJ_W, EX_PROJ_B, EX_N };

static int moe_ffn(const dl_gpt_config *c)
{
    return c->expert_ffn ? c->expert_ffn : 4 * c->d_model;
}

static int moe_nparams(const dl_gpt_config *c, int layer)
{
    (void)layer;
    return MO_FIXED + EX_N * c->experts;
}

static void moe_param(const dl_gpt_config *c, int layer, int q, dl_sub_param *out)
{
    static const char *const ex[EX_N] = {"c_fc.weight", "c_fc.bias", "c_proj.weight",
                                         "c_proj.bias"};
    int64_t C = c->d_model, F = moe_ffn(c);
    (void)layer;
    memset(out, 0, sizeof *out);
    out->sh = DL_SHARD_NONE;
    out->expert = -1;
    out->cols = 1;
    out->ndim = 1;
    if (q < MO_FIXED) {
        snprintf(out->name, sizeof out->name, "%s",
                 q == MO_LN_W   ? "ln_2.weight"
                 : q == MO_LN_B ? "ln_2.bias"
                                : "mlp.router.weight");
        out->rows = q == MO_ROUTER ? c->experts : C;
        out->cols = q == MO_ROUTER ? C : 1;
        out->ndim = q == MO_ROUTER ? 2 : 1;
        return;
    }
    int e = (q - MO_FIXED) / EX_N, p = (q - MO_FIXED) % EX_N;
    snprintf(out->name, sizeof out->name, "mlp.experts.%d.%s", e, ex[p]);
    out->expert = e;
    out->rows = p == EX_FC_W || p == EX_FC_B ? F : C;
    if (p == EX_FC_W || p == EX_PROJ_W) {
        out->cols = p == EX_FC_W ? C : F;
        out->ndim = 2;
    }
}

/* rows: N tokens of the largest micro-batch; Ns choices sent at most; R rows received at most
 * (each of the ep ranks sends each of this rank's El experts at most one choice per token) */
static size_t moe_rows_sent(const dl_sub_dims *d) { return (size_t)d->MB * d->T * d->K; }
static size_t moe_rows_recv(const dl_sub_dims *d)
{
    size_t k = (size_t)(d->K < d->El ? d->K : d->El);
    return (size_t)d->ep * d->MB * d->T * k;
}

/* the activation set, in this order (model/moe_impl.h names the views) */
static size_t moe_act_elems(const dl_sub_dims *d)
{
    size_t N = (size_t)d->MB * d->T, C = d->C, E = d->E, K = d->K, F = d->Fe;
    size_t Ns = moe_rows_sent(d), R = moe_rows_recv(d);
    return N * C + 2 * N   /* ln, mean, rstd */
           + 2 * N * E + N /* p, the logits' gradient, lse */
           + 4 * N * K     /* choice, gate, row, gate gradient */
           + 2 * (size_t)E /* counts sent, received */
           + N * C         /* ln's output gradient */
           + Ns * C        /* the rows sent and received back */
           + 4 * R * C     /* expert inputs, two exchange buffers, output gradients */
           + 3 * R * F;    /* GeLU derivative and output, pre-activation gradients */
}
static size_t moe_stash_elems(const dl_sub_dims *d) { return (void)d, 0; }

enum { MOE_MAX_EP = 256, MOE_MAX_EXPERTS = 1000 }; /* model.c refuses more experts */

int dl__moe_max_ep(void) { return MOE_MAX_EP; }

/* The capacity per expert per sequence of T tokens, -1: no limit. */
int64_t dl__moe_capacity(const dl_gpt_config *c, int T)
{
    return c->capacity > 0 ? (int64_t)ceil(c->capacity * T * c->top_k / c->experts) : -1;
}

/* the routing hash's step (splitmix64's finaliser) */
static uint64_t moe_mix(uint64_t h, uint64_t v)
{
    uint64_t x = h ^ (v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2));
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static void moe_count(dl_moe_stats *s, int e, int admitted)
{
    if (s) {
        s->routed[e]++;
        s->dropped[e] += !admitted;
    }
}

static void moe_seq(dl_moe_stats *s, double aux, double z, uint64_t h)
{
    if (s) {
        s->seqs++;
        s->aux += aux;
        s->z += z;
        s->hash += h;
    }
}

#define REAL float
#define SFX f32
#define IS64 0
#define DT DL_F32
#include "model/moe_impl.h"
#undef REAL
#undef SFX
#undef IS64
#undef DT
#define REAL double
#define SFX f64
#define IS64 1
#define DT DL_F64
#include "model/moe_impl.h"
#undef REAL
#undef SFX
#undef IS64
#undef DT

/* the MoE MLP starts its own unit (gradient buckets cut at the sublayer) */
const dl_sublayer_kind dl__moe_kind = {.name = "moe",
                                       .nparams = moe_nparams,
                                       .param = moe_param,
                                       .unit = DL_SUB_UNIT_NEW,
                                       .act_elems = moe_act_elems,
                                       .stash_elems = moe_stash_elems,
                                       .fwd = {moe_fwd_tp_f32, moe_fwd_tp_f64},
                                       .bwd = {moe_bwd_f32, moe_bwd_f64}};
