/* The planner's analytic models: lecture 17's memory, communication, bubble, ZeRO and 3-D search
 * accounting. Pure functions of (model, hardware, assumptions, layout); docs/PLANNER.md derives
 * every formula and says where each default comes from. The hardware profiles are in
 * plan_hw.c. */
#define _GNU_SOURCE
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "distlab/error.h"
#include "distlab/plan.h"

/* ---------------------------------------------------------------------------------------- */
/* Models                                                                                    */

typedef struct model_preset {
    const char *name;
    const char *alias;
    dl_plan_model m;
} model_preset;

/* Shapes: GPT-3 (Brown et al. 2020, table 2.1); Llama-3.1 405B and Llama-3 70B (their configs);
 * the 7.5B model is the ZeRO paper's Psi with a Megatron-style shape (36 x 4096 gives 7.46e9),
 * pinned to 7.5e9 so the lecture's figures come out exactly; 70B is pinned to the exercise's
 * 70e9 (the Llama-3 shape alone gives 70.6e9). Maverick: only the slide's 400e9 total. */
static const model_preset model_presets[] = {
    {"gpt3-175b",
     NULL,
     {"gpt3-175b", 96, 12288, 96, 96, 49152, 50257, 2048, 0, 0.0, 0, 0, 0, 0, 0}},
    {"llama3-405b",
     NULL,
     {"llama3-405b", 126, 16384, 128, 8, 53248, 128256, 2048, 1, 0.0, 0, 0, 0, 0, 0}},
    {"dense-7.5b",
     "7.5b",
     {"dense-7.5b", 36, 4096, 32, 32, 16384, 51200, 2048, 0, 7.5e9, 0, 0, 0, 0, 0}},
    {"dense-70b",
     "70b",
     {"dense-70b", 80, 8192, 64, 8, 28672, 128256, 2048, 1, 70e9, 0, 0, 0, 0, 0}},
    {"maverick-400b", NULL, {"maverick-400b", 0, 0, 0, 0, 0, 0, 2048, 0, 400e9, 0, 0, 0, 0, 0}},
    /* Mixtral 8x7B (Jiang et al. 2024, table 1): 46.7e9 parameters, 12.9e9 active; dropless */
    {"mixtral-8x7b",
     NULL,
     {"mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, 4096, 1, 0.0, 8, 2, 14336, 1, 0}},
};
#define N_MODEL_PRESETS ((int)(sizeof model_presets / sizeof model_presets[0]))

const char *dl_plan_model_preset_name(int i)
{
    return (i >= 0 && i < N_MODEL_PRESETS) ? model_presets[i].name : NULL;
}

int dl_plan_model_preset(const char *name, dl_plan_model *m)
{
    if (name == NULL || m == NULL)
        return dl_error(DL_EINVAL, "model preset: null argument");
    for (int i = 0; i < N_MODEL_PRESETS; i++) {
        if (strcmp(name, model_presets[i].name) == 0 ||
            (model_presets[i].alias && strcmp(name, model_presets[i].alias) == 0)) {
            *m = model_presets[i].m;
            return DL_OK;
        }
    }
    return dl_error(DL_EINVAL,
                    "unknown model preset '%s' (presets: gpt3-175b, llama3-405b, dense-7.5b, "
                    "dense-70b, maverick-400b, mixtral-8x7b)",
                    name);
}

int dl_plan_model_has_shape(const dl_plan_model *m)
{
    return m != NULL && m->layers > 0 && m->hidden > 0 && m->heads > 0;
}

/* Parameters of one transformer layer (attention with GQA, MLP). */
static double attn_params(const dl_plan_model *m)
{
    double h = m->hidden, hd = (double)m->hidden / m->heads;
    double kv = m->kv_heads > 0 ? m->kv_heads : m->heads;
    return 2.0 * h * h + 2.0 * h * kv * hd;
}

static double mlp_params(const dl_plan_model *m, int ffn)
{
    return (m->gated_mlp ? 3.0 : 2.0) * m->hidden * ffn;
}

static double layer_params(const dl_plan_model *m)
{
    return attn_params(m) + mlp_params(m, m->ffn);
}

int dl_plan_moe_layers(const dl_plan_model *m)
{
    if (m == NULL || m->experts <= 0 || m->layers <= 0)
        return 0;
    int every = m->moe_every > 1 ? m->moe_every : 1;
    return (m->layers + every - 1) / every;
}

static int expert_ffn(const dl_plan_model *m) { return m->expert_ffn > 0 ? m->expert_ffn : m->ffn; }

double dl_plan_expert_params(const dl_plan_model *m)
{
    if (!dl_plan_model_has_shape(m))
        return 0.0;
    return (double)dl_plan_moe_layers(m) * m->experts * mlp_params(m, expert_ffn(m));
}

double dl_plan_model_params(const dl_plan_model *m)
{
    if (m == NULL)
        return 0.0;
    if (m->params > 0)
        return m->params;
    if (!dl_plan_model_has_shape(m))
        return 0.0;
    double emb = (double)m->vocab * m->hidden * (m->gated_mlp ? 2.0 : 1.0);
    int nmoe = dl_plan_moe_layers(m);
    /* a MoE layer: attention, the router (h x E) and the experts instead of the dense MLP */
    double moe = nmoe * (attn_params(m) + (double)m->hidden * m->experts);
    return (m->layers - nmoe) * layer_params(m) + moe + dl_plan_expert_params(m) + emb;
}

double dl_plan_model_active_params(const dl_plan_model *m)
{
    double psi = dl_plan_model_params(m), pe = dl_plan_expert_params(m);
    return pe > 0 ? psi - pe + pe * m->top_k / m->experts : psi;
}

static int moe_check(const dl_plan_model *m)
{
    if (m->experts == 0 && m->top_k == 0 && m->expert_ffn == 0 && m->moe_every == 0 &&
        m->capacity == 0)
        return DL_OK;
    if (m->experts <= 0)
        return dl_error(DL_EINVAL,
                        "model %s: top-k, expert FFN, MoE interval or capacity factor "
                        "without experts",
                        m->name);
    if (!dl_plan_model_has_shape(m))
        return dl_error(DL_EINVAL, "model %s: experts need the model's shape", m->name);
    if (m->top_k < 1 || m->top_k > m->experts)
        return dl_error(DL_EINVAL, "model %s: top-k %d is not in 1 .. %d experts", m->name,
                        m->top_k, m->experts);
    if (m->expert_ffn < 0 || m->moe_every < 0 || m->moe_every > m->layers || !(m->capacity >= 0) ||
        !isfinite(m->capacity))
        return dl_error(DL_EINVAL,
                        "model %s: expert FFN >= 0, MoE interval in 0 .. %d layers and capacity "
                        "factor >= 0 (0: no limit)",
                        m->name, m->layers);
    return DL_OK;
}

int dl_plan_model_check(const dl_plan_model *m, int need_shape, const char *what)
{
    if (m == NULL)
        return dl_error(DL_EINVAL, "model: null");
    if (!(m->params >= 0) || !isfinite(m->params))
        return dl_error(DL_EINVAL, "model %s: parameter count must be positive", m->name);
    if (m->seq <= 0)
        return dl_error(DL_EINVAL, "model %s: sequence length must be positive", m->name);
    int any_shape = m->layers || m->hidden || m->heads || m->ffn || m->vocab;
    if (!any_shape) {
        if (need_shape)
            return dl_error(DL_EINVAL,
                            "model %s is a bare parameter count: %s needs its shape (layers, "
                            "hidden, heads, ffn, vocab)",
                            m->name, what ? what : "this calculation");
        if (!(m->params > 0))
            return dl_error(DL_EINVAL, "model %s: parameter count must be positive", m->name);
        return moe_check(m);
    }
    if (m->layers <= 0 || m->hidden <= 0 || m->heads <= 0 || m->ffn <= 0 || m->vocab <= 0 ||
        m->kv_heads < 0)
        return dl_error(DL_EINVAL,
                        "model %s: layers, hidden, heads, ffn and vocab must all be positive "
                        "(got %d, %d, %d, %d, %d)",
                        m->name, m->layers, m->hidden, m->heads, m->ffn, m->vocab);
    if (m->hidden % m->heads != 0)
        return dl_error(DL_EINVAL, "model %s: %d heads do not divide hidden size %d", m->name,
                        m->heads, m->hidden);
    if (m->kv_heads > 0 && m->heads % m->kv_heads != 0)
        return dl_error(DL_EINVAL, "model %s: %d kv heads do not divide %d heads", m->name,
                        m->kv_heads, m->heads);
    return moe_check(m);
}

/* ---------------------------------------------------------------------------------------- */
/* Assumptions and layouts                                                                   */

void dl_plan_opts_init(dl_plan_opts *o)
{
    memset(o, 0, sizeof *o);
    o->flops_per_token = 6.0;
    o->mfu = 0.0;
    o->weight_bytes = 2.0;
    o->grad_bytes = 2.0;
    o->optim_bytes = 12.0;
    o->grad_comm_bytes = 2.0;
    o->act_bytes = 2.0;
    o->recompute = 1;
    o->seq_parallel = 1;
    o->schedule = DL_PLAN_1F1B;
    o->tp_allreduces = 4;
    o->zero_stage = 1;
    o->tp_link = DL_PLAN_LINK_INTRA;
    o->pp_link = DL_PLAN_LINK_INTER;
    o->dp_link = DL_PLAN_LINK_INTER;
    o->mem_limit = 0.0;
    o->ep_link = DL_PLAN_LINK_INTER;
}

static int opts_check(const dl_plan_opts *o)
{
    if (o == NULL)
        return dl_error(DL_EINVAL, "planner options: null");
    if (!(o->flops_per_token > 0) || o->mfu < 0 || o->mfu > 1 || o->weight_bytes < 0 ||
        o->grad_bytes < 0 || o->optim_bytes < 0 || o->grad_comm_bytes < 0 || !(o->act_bytes > 0) ||
        o->tp_allreduces < 0 || o->zero_stage < 0 || o->zero_stage > 3 || o->mem_limit < 0)
        return dl_error(DL_EINVAL,
                        "planner options out of range (FLOPs per token > 0, mfu in [0, 1], byte "
                        "counts >= 0, ZeRO stage 0-3)");
    return DL_OK;
}

static int seq_of(const dl_plan_model *m, const dl_plan_layout *l)
{
    return (l && l->seq > 0) ? l->seq : m->seq;
}

int dl_plan_layout_check(const dl_plan_model *m, const dl_plan_hw *hw, const dl_plan_layout *l)
{
    if (m == NULL || l == NULL)
        return dl_error(DL_EINVAL, "layout: null argument");
    if (l->t <= 0 || l->p <= 0 || l->d <= 0 || l->v <= 0 || l->micro_batch <= 0 ||
        l->global_batch <= 0 || l->seq < 0)
        return dl_error(DL_EINVAL,
                        "layout: t, p, d, v, micro-batch and global batch must be positive "
                        "(t=%d p=%d d=%d v=%d micro-batch=%d global batch=%ld)",
                        l->t, l->p, l->d, l->v, l->micro_batch, l->global_batch);
    if (dl_plan_model_has_shape(m)) {
        if (m->heads % l->t != 0)
            return dl_error(DL_EINVAL, "t = %d does not divide the %d attention heads of %s", l->t,
                            m->heads, m->name);
        if (m->kv_heads > 0 && m->kv_heads % l->t != 0)
            return dl_error(DL_EINVAL, "t = %d does not divide the %d key/value heads of %s", l->t,
                            m->kv_heads, m->name);
        if (l->p > m->layers)
            return dl_error(DL_EINVAL, "p = %d exceeds the %d layers of %s", l->p, m->layers,
                            m->name);
        if (l->v > 1 && (long)l->p * l->v > m->layers)
            return dl_error(DL_EINVAL, "p * v = %d exceeds the %d layers of %s", l->p * l->v,
                            m->layers, m->name);
    }
    if (l->e < 0)
        return dl_error(DL_EINVAL, "layout: e = %d must be positive", l->e);
    if (l->e > 1 && m->experts <= 0)
        return dl_error(DL_EINVAL, "e = %d: expert parallelism needs a model with experts", l->e);
    if (l->e > 1 && (l->d % l->e != 0 || m->experts % l->e != 0))
        return dl_error(DL_EINVAL,
                        "e = %d must divide d = %d (the experts spread inside the data-parallel "
                        "group) and the %d experts",
                        l->e, l->d, m->experts);
    if (l->global_batch % ((long)l->d * l->micro_batch) != 0)
        return dl_error(DL_EINVAL,
                        "global batch %ld is not a multiple of d * micro-batch = %d * %d",
                        l->global_batch, l->d, l->micro_batch);
    if (hw != NULL && (l->t > hw->gpus_per_node || hw->gpus_per_node % l->t != 0))
        return dl_error(DL_EINVAL,
                        "t = %d must divide the %d GPUs of a node (tensor parallelism stays inside "
                        "a node)",
                        l->t, hw->gpus_per_node);
    return DL_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Memory                                                                                    */

double dl_plan_bytes_per_param(const dl_plan_opts *o)
{
    return o->weight_bytes + o->grad_bytes + o->optim_bytes;
}

double dl_plan_act_layer_bytes(const dl_plan_model *m, const dl_plan_opts *o, int s, int b, int t,
                               int recompute)
{
    if (!dl_plan_model_has_shape(m) || s <= 0 || b <= 0 || t <= 0)
        return 0.0;
    double sbh = (double)s * b * m->hidden, a = m->heads, h = m->hidden;
    if (recompute)
        return sbh * o->act_bytes / (o->seq_parallel ? t : 1);
    /* Korthikanti et al. 2022, eq. (1)-(3): 34 = 10 replicated + 24 split over t (bytes at
     * 2-byte values, plus 1-byte dropout masks); 5as/h the attention scores and softmax. */
    if (o->seq_parallel)
        return sbh * (34.0 + 5.0 * a * s / h) / t;
    return sbh * (10.0 + 24.0 / t + 5.0 * a * s / (h * t));
}

double dl_plan_state_bytes(double psi, const dl_plan_opts *o, int shards, int stage, int nd)
{
    if (o == NULL || !(psi >= 0) || shards <= 0 || nd <= 0 || stage < 0 || stage > 3)
        return -1.0;
    double q = psi / shards, w = o->weight_bytes, g = o->grad_bytes, k = o->optim_bytes;
    switch (stage) {
    case 0: return (w + g + k) * q;
    case 1: return (w + g) * q + k * q / nd;
    case 2: return w * q + (g + k) * q / nd;
    default: return (w + g + k) * q / nd;
    }
}

static double capacity_of(const dl_plan_hw *hw, const dl_plan_opts *o)
{
    return o->mem_limit > 0 ? o->mem_limit : (hw ? hw->mem_bytes : 0.0);
}

static int ceil_div(int a, int b) { return (a + b - 1) / b; }

static int ep_of(const dl_plan_layout *l) { return l->e > 1 ? l->e : 1; }

/* What the analytic entry points check first, in this order: the output, the model, the
 * hardware (hw_check; NULL where only its memory is read), the options, the layout. */
static int check_inputs(const char *what, const void *out, const dl_plan_model *m,
                        const dl_plan_hw *hw_check, const dl_plan_opts *o, const dl_plan_hw *hw,
                        const dl_plan_layout *l)
{
    int st;
    if (out == NULL)
        return dl_error(DL_EINVAL, "%s: null output", what);
    if ((st = dl_plan_model_check(m, 0, NULL)) != DL_OK)
        return st;
    if (hw_check && (st = dl_plan_hw_check(hw_check)) != DL_OK)
        return st;
    if ((st = opts_check(o)) != DL_OK)
        return st;
    return dl_plan_layout_check(m, hw, l);
}

int dl_plan_memory(const dl_plan_model *m, const dl_plan_hw *hw, const dl_plan_opts *o,
                   const dl_plan_layout *l, dl_plan_mem *out)
{
    int st;
    if ((st = check_inputs("memory", out, m, NULL, o, hw, l)) != DL_OK)
        return st;
    memset(out, 0, sizeof *out);
    double psi = dl_plan_model_params(m), pe = dl_plan_expert_params(m);
    int e = ep_of(l), z = o->zero_stage;
    /* the dense parameters over t p GPUs, ZeRO over d; the experts over t p e, ZeRO over d / e */
    const double q[2] = {(psi - pe) / ((double)l->t * l->p), pe / ((double)l->t * l->p * e)};
    const int nd[2] = {l->d, l->d / e};
    out->params = psi;
    out->expert_params = pe;
    for (int k = 0; k < 2; k++) {
        double w = o->weight_bytes * q[k] / (z >= 3 ? nd[k] : 1);
        double g = o->grad_bytes * q[k] / (z >= 2 ? nd[k] : 1);
        double os = o->optim_bytes * q[k] / (z >= 1 ? nd[k] : 1);
        out->weights += w, out->grads += g, out->optim += os;
        if (k == 1)
            out->expert_states = w + g + os;
    }
    out->states = out->weights + out->grads + out->optim;
    long m_ = l->global_batch / ((long)l->d * l->micro_batch);
    out->micro_batches = (int)m_;
    if (dl_plan_model_has_shape(m)) {
        int s = seq_of(m, l);
        out->act_layer = dl_plan_act_layer_bytes(m, o, s, l->micro_batch, l->t, o->recompute);
        out->stage_layers = ceil_div(m->layers, l->p);
        out->inflight = (int)dl_plan_inflight(o->schedule, l->p, m_, 1);
        out->act = out->act_layer * out->stage_layers * out->inflight;
    }
    out->total = out->states + out->act;
    out->capacity = capacity_of(hw, o);
    out->fits = out->capacity > 0 && out->total <= out->capacity;
    return DL_OK;
}

long dl_plan_gpus_needed(double bytes, double capacity)
{
    if (!(capacity > 0) || !(bytes >= 0))
        return -1;
    /* Relative slack: 1120e9 / 80e9 must be 14, not 15 after rounding. */
    return (long)ceil(bytes / capacity * (1.0 - 1e-12));
}

/* ---------------------------------------------------------------------------------------- */
/* Communication                                                                             */

double dl_plan_allreduce_sent(int n, double bytes)
{
    return n > 1 ? 2.0 * (n - 1) / n * bytes : 0.0;
}

double dl_plan_allreduce_time(int n, double bytes, double bw, double lat)
{
    if (n <= 1 || !(bw > 0))
        return 0.0;
    return 2.0 * (n - 1) * (lat + bytes / ((double)n * bw));
}

void dl_plan_link_of(const dl_plan_hw *hw, const dl_plan_opts *o, const dl_plan_layout *l, int kind,
                     double *bw, double *lat, int *inter)
{
    dl_plan_link k = kind == 0   ? o->tp_link
                     : kind == 1 ? o->pp_link
                     : kind == 2 ? o->dp_link
                                 : o->ep_link;
    int is_inter;
    if (k == DL_PLAN_LINK_AUTO) {
        /* Megatron order: rank = (pp * d + dp) * t + tp, so a TP group spans t consecutive ranks,
         * a DP group t*d, a PP group all t*d*p, an EP group (e consecutive dp ranks) t*e; a group
         * is inside a node iff its span fits one. */
        long span = kind == 0   ? l->t
                    : kind == 2 ? (long)l->t * l->d
                    : kind == 3 ? (long)l->t * ep_of(l)
                                : (long)l->t * l->d * l->p;
        is_inter = span > hw->gpus_per_node;
    } else {
        is_inter = k == DL_PLAN_LINK_INTER;
    }
    if (bw)
        *bw = is_inter ? hw->inter_bw : hw->intra_bw;
    if (lat)
        *lat = is_inter ? hw->inter_lat : hw->intra_lat;
    if (inter)
        *inter = is_inter;
}

static double eff_mfu(const dl_plan_hw *hw, const dl_plan_opts *o)
{
    return o->mfu > 0 ? o->mfu : hw->mfu;
}

int dl_plan_comm(const dl_plan_model *m, const dl_plan_hw *hw, const dl_plan_opts *o,
                 const dl_plan_layout *l, dl_plan_comm_report *out)
{
    int st;
    if ((st = check_inputs("comm", out, m, hw, o, hw, l)) != DL_OK)
        return st;
    memset(out, 0, sizeof *out);
    int s = seq_of(m, l), b = l->micro_batch;
    long n = (long)l->t * l->p * l->d;
    double psi = dl_plan_model_params(m), rate = hw->flops * eff_mfu(hw, o);
    double pe = dl_plan_expert_params(m);
    out->params = psi;
    out->tokens = l->global_batch * s;
    out->micro_batches = (int)(l->global_batch / ((long)l->d * b));
    out->compute = o->flops_per_token * dl_plan_model_active_params(m) * (double)out->tokens /
                   ((double)n * rate);

    double zf = o->zero_stage >= 3 ? 1.5 : 1.0; /* ZeRO-3: 3 Psi instead of 2 Psi (lecture §5.2) */
    out->dp_grad_bytes = (psi - pe) / ((double)l->t * l->p) * o->grad_comm_bytes;
    out->dp_sent = zf * dl_plan_allreduce_sent(l->d, out->dp_grad_bytes);
    out->dp_time_intra =
        zf * dl_plan_allreduce_time(l->d, out->dp_grad_bytes, hw->intra_bw, hw->intra_lat);
    out->dp_time_inter =
        zf * dl_plan_allreduce_time(l->d, out->dp_grad_bytes, hw->inter_bw, hw->inter_lat);
    if (pe > 0) {
        int e = ep_of(l);
        double bw, lat;
        dl_plan_link_of(hw, o, l, 2, &bw, &lat, NULL);
        out->edp_grad_bytes = pe / ((double)l->t * l->p * e) * o->grad_comm_bytes;
        out->edp_sent = zf * dl_plan_allreduce_sent(l->d / e, out->edp_grad_bytes);
        out->edp_time = zf * dl_plan_allreduce_time(l->d / e, out->edp_grad_bytes, bw, lat);
    }
    dl_plan_link_of(hw, o, l, 2, NULL, NULL, &out->dp_inter);
    for (int z = 0; z < 4; z++) out->zero_factor[z] = z == 3 ? 3.0 : 2.0;

    if (dl_plan_model_has_shape(m)) {
        double bw, lat;
        double act = (double)s * b * m->hidden * o->act_bytes;
        out->tp_msg_bytes = act;
        out->tp_layer_sent = o->tp_allreduces * dl_plan_allreduce_sent(l->t, act);
        dl_plan_link_of(hw, o, l, 0, &bw, &lat, NULL);
        out->tp_layer_time = o->tp_allreduces * dl_plan_allreduce_time(l->t, act, bw, lat);
        out->tp_layer_compute =
            o->flops_per_token * layer_params(m) * (double)s * b / ((double)l->t * rate);
        out->tp_step_time = out->tp_layer_time * ceil_div(m->layers, l->p) * out->micro_batches;
        out->pp_msg_bytes = act;
        if (l->p > 1) {
            dl_plan_link_of(hw, o, l, 1, &bw, &lat, NULL);
            out->pp_step_time = 2.0 * out->micro_batches * (lat + act / bw);
        }
    }
    if (m->experts > 0 && (st = dl_plan_moe_a2a(m, hw, o, l, &out->a2a)) != DL_OK)
        return st;
    if (m->experts > 0) {
        int every = m->moe_every > 1 ? m->moe_every : 1;
        out->moe_layers = ceil_div(ceil_div(m->layers, l->p), every);
        out->a2a_step_sent = out->a2a.step_sent * out->moe_layers * out->micro_batches;
        out->a2a_step_time = 2.0 * out->a2a.fwd_time * out->moe_layers * out->micro_batches;
    }
    return DL_OK;
}

int dl_plan_moe_a2a(const dl_plan_model *m, const dl_plan_hw *hw, const dl_plan_opts *o,
                    const dl_plan_layout *l, dl_plan_a2a *out)
{
    int st;
    if ((st = check_inputs("all-to-all", out, m, hw, o, hw, l)) != DL_OK)
        return st;
    if (m->experts <= 0)
        return dl_error(DL_EINVAL, "all-to-all: model %s has no experts", m->name);
    memset(out, 0, sizeof *out);
    int e = ep_of(l);
    double bw, lat;
    dl_plan_link_of(hw, o, l, 3, &bw, &lat, &out->inter);
    out->tokens = (double)seq_of(m, l) * l->micro_batch / (o->seq_parallel ? l->t : 1);
    out->kept = m->capacity > 0 && m->capacity < 1 ? m->capacity : 1.0;
    double choices = out->tokens * m->top_k * out->kept;
    out->payload = choices * m->hidden * o->act_bytes;
    out->sent = out->payload * (e - 1) / e;
    out->fwd_sent = 2.0 * out->sent;
    out->step_sent = 4.0 * out->sent;
    out->fwd_time = e > 1 ? 2.0 * (out->sent / bw + (e - 1) * lat) : 0.0;
    /* uniform routing: each GPU's experts receive as many choices as it sends; split over t */
    out->expert_flops = choices * 2.0 * mlp_params(m, expert_ffn(m)) / (o->seq_parallel ? 1 : l->t);
    out->fwd_compute = out->expert_flops / (hw->flops * eff_mfu(hw, o));
    out->ratio = out->fwd_compute > 0 ? out->fwd_time / out->fwd_compute : 0.0;
    return DL_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* ZeRO                                                                                      */

int dl_plan_zero_table(double psi, double K, int nd, const dl_plan_opts *o,
                       dl_plan_zero_row rows[4])
{
    if (!(psi > 0) || !(K >= 0) || nd <= 0 || rows == NULL)
        return dl_error(DL_EINVAL,
                        "zero table: parameters and N_d must be positive, K >= 0 "
                        "(got Psi=%g, K=%g, N_d=%d)",
                        psi, K, nd);
    dl_plan_opts d;
    dl_plan_opts_init(&d);
    if (o)
        d = *o;
    d.optim_bytes = K;
    static const char *const names[4] = {"baseline", "P_os", "P_os+g", "P_os+g+p"};
    static const char *const formulas[4] = {"(2+2+K)Psi", "4Psi + K Psi/N_d", "2Psi + (2+K)Psi/N_d",
                                            "(2+2+K)Psi/N_d"};
    for (int z = 0; z < 4; z++) {
        rows[z].stage = z;
        rows[z].name = names[z];
        rows[z].formula = formulas[z];
        rows[z].bytes = dl_plan_state_bytes(psi, &d, 1, z, nd);
        rows[z].comm_factor = z == 3 ? 3.0 : 2.0;
    }
    return DL_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Pipeline                                                                                  */

double dl_plan_bubble(int p, long m, int v)
{
    if (p <= 0 || m <= 0 || v <= 0)
        return -1.0;
    return (double)(p - 1) / ((double)v * m + (p - 1));
}

long dl_plan_min_microbatches(int p, int v, double target)
{
    if (p <= 0 || v <= 0 || !(target > 0) || !(target < 1))
        return -1;
    if (p == 1)
        return 1;
    /* Start from the algebraic bound m > (p-1)(1-f)/(f v) and step so that the answer agrees
     * with dl_plan_bubble's own rounding (p = 8, f = 0.1: 63 gives exactly 0.1, so 64). */
    double est = (p - 1) * (1.0 - target) / (target * v);
    long m = est > 2 ? (long)est - 1 : 1;
    while (m > 1 && dl_plan_bubble(p, m - 1, v) < target) m--;
    while (!(dl_plan_bubble(p, m, v) < target)) m++;
    return m;
}

long dl_plan_inflight(dl_plan_schedule sch, int p, long m, int s)
{
    if (p <= 0 || m <= 0 || s < 1 || s > p)
        return -1;
    if (sch == DL_PLAN_GPIPE)
        return m;
    long k = p - s + 1;
    return k < m ? k : m;
}

int dl_plan_staleness(int p, int s) { return (p <= 0 || s < 1 || s > p) ? -1 : p - s; }

int dl_plan_partition(const double *costs, int n, int k, int *first, double *max_cost)
{
    if (costs == NULL || first == NULL || n <= 0 || k <= 0 || k > n)
        return dl_error(DL_EINVAL, "partition: need 1 <= stages (%d) <= layers (%d)", k, n);
    for (int i = 0; i < n; i++)
        if (!(costs[i] >= 0) || !isfinite(costs[i]))
            return dl_error(DL_EINVAL, "partition: cost of layer %d is not a non-negative number",
                            i);
    /* best[j][i]: min over splits of layers 0..i-1 into j stages of the slowest stage;
     * from[j][i]: where the last of those stages starts. */
    size_t cells = (size_t)(k + 1) * (n + 1);
    double *best = malloc(cells * sizeof *best), *pre = malloc((size_t)(n + 1) * sizeof *pre);
    int *from = malloc(cells * sizeof *from);
    if (!best || !pre || !from) {
        free(best);
        free(pre);
        free(from);
        return dl_error(DL_ENOMEM, "partition: out of memory");
    }
#define B(j, i) best[(size_t)(j) * (n + 1) + (i)]
#define F(j, i) from[(size_t)(j) * (n + 1) + (i)]
    pre[0] = 0;
    for (int i = 0; i < n; i++) pre[i + 1] = pre[i] + costs[i];
    for (int i = 1; i <= n; i++) {
        B(1, i) = pre[i];
        F(1, i) = 0;
    }
    for (int j = 2; j <= k; j++) {
        for (int i = j; i <= n; i++) {
            double bv = INFINITY;
            int bf = j - 1;
            for (int x = j - 1; x < i; x++) { /* last stage = layers x .. i-1 */
                double c = fmax(B(j - 1, x), pre[i] - pre[x]);
                if (c < bv) {
                    bv = c;
                    bf = x;
                } /* strict: earliest boundary wins ties */
            }
            B(j, i) = bv;
            F(j, i) = bf;
        }
    }
    first[k] = n;
    for (int j = k, i = n; j >= 1; j--) {
        first[j - 1] = F(j, i);
        i = F(j, i);
    }
    if (max_cost)
        *max_cost = B(k, n);
#undef B
#undef F
    free(best);
    free(pre);
    free(from);
    return DL_OK;
}

int dl_plan_partition_even(const double *costs, int n, int k, int *first, double *max_cost)
{
    if (costs == NULL || first == NULL || n <= 0 || k <= 0 || k > n)
        return dl_error(DL_EINVAL, "partition: need 1 <= stages (%d) <= layers (%d)", k, n);
    double mx = 0;
    first[0] = 0;
    for (int j = 0; j < k; j++) {
        first[j + 1] = first[j] + n / k + (j < n % k ? 1 : 0);
        double c = 0;
        for (int i = first[j]; i < first[j + 1]; i++) c += costs[i];
        if (c > mx)
            mx = c;
    }
    if (max_cost)
        *max_cost = mx;
    return DL_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Step time and search                                                                      */

int dl_plan_step_time(const dl_plan_model *m, const dl_plan_hw *hw, const dl_plan_opts *o,
                      const dl_plan_layout *l, dl_plan_step *out)
{
    int st;
    if (out == NULL)
        return dl_error(DL_EINVAL, "step: null output");
    if ((st = dl_plan_model_check(m, 1, "the step-time model")) != DL_OK)
        return st;
    dl_plan_comm_report c;
    if ((st = dl_plan_comm(m, hw, o, l, &c)) != DL_OK)
        return st;
    memset(out, 0, sizeof *out);
    out->layout = *l;
    if ((st = dl_plan_memory(m, hw, o, l, &out->mem)) != DL_OK)
        return st;
    out->micro_batches = c.micro_batches;
    out->bubble = dl_plan_bubble(l->p, c.micro_batches, l->v);
    /* The pipeline runs at the pace of its slowest stage: ceil(L/p) layers, not L/p. */
    double slow = (double)l->p * ceil_div(m->layers, l->p) / m->layers;
    out->compute = c.compute * slow / (1.0 - out->bubble);
    out->tp = l->t > 1 ? c.tp_step_time : 0.0;
    out->pp = c.pp_step_time;
    if (l->d > 1) {
        double bw, lat;
        dl_plan_link_of(hw, o, l, 2, &bw, &lat, NULL);
        out->dp = (o->zero_stage >= 3 ? 1.5 : 1.0) *
                      dl_plan_allreduce_time(l->d, c.dp_grad_bytes, bw, lat) +
                  c.edp_time;
    }
    out->ep = c.a2a_step_time;
    out->total = out->compute + out->tp + out->pp + out->dp + out->ep;
    return DL_OK;
}

static int cmp_step(const void *a, const void *b)
{
    const dl_plan_step *x = a, *y = b;
    if (x->total != y->total)
        return x->total < y->total ? -1 : 1;
    if (x->layout.t != y->layout.t)
        return x->layout.t - y->layout.t;
    if (x->layout.p != y->layout.p)
        return x->layout.p - y->layout.p;
    if (x->layout.d != y->layout.d)
        return x->layout.d - y->layout.d;
    return x->layout.e - y->layout.e;
}

/* One candidate into the growing array (*all, *room). */
static int search_add(const dl_plan_model *m, const dl_plan_hw *hw, const dl_plan_opts *o,
                      const dl_plan_layout *l, dl_plan_step **all, int *total, int *room)
{
    if (*total == *room) {
        dl_plan_step *bigger = realloc(*all, (size_t)*room * 2 * sizeof **all);
        if (bigger == NULL)
            return dl_error(DL_ENOMEM, "search: out of memory");
        *all = bigger;
        *room *= 2;
    }
    int st = dl_plan_step_time(m, hw, o, l, &(*all)[*total]);
    if (st == DL_OK)
        (*total)++;
    return st;
}

int dl_plan_search(const dl_plan_model *m, const dl_plan_hw *hw, const dl_plan_opts *o, int gpus,
                   const dl_plan_layout *base, dl_plan_step *out, int cap, int *n)
{
    int st;
    if (n == NULL || base == NULL || (cap > 0 && out == NULL))
        return dl_error(DL_EINVAL, "search: null argument");
    if ((st = dl_plan_model_check(m, 1, "the 3-D search")) != DL_OK)
        return st;
    if ((st = dl_plan_hw_check(hw)) != DL_OK)
        return st;
    if ((st = opts_check(o)) != DL_OK)
        return st;
    if (gpus <= 0)
        return dl_error(DL_EINVAL, "search: the GPU count must be positive (got %d)", gpus);
    if (gpus % hw->gpus_per_node != 0)
        return dl_error(DL_EINVAL, "search: %d GPUs is not a multiple of %d GPUs per node", gpus,
                        hw->gpus_per_node);
    if (base->micro_batch <= 0 || base->global_batch <= 0 || base->v <= 0 || base->seq < 0)
        return dl_error(DL_EINVAL, "search: micro-batch, global batch and v must be positive");
    /* Every candidate is collected, then sorted; the count is small (divisor triples). */
    int total = 0, room = 64;
    dl_plan_step *all = malloc((size_t)room * sizeof *all);
    if (all == NULL)
        return dl_error(DL_ENOMEM, "search: out of memory");
    for (int t = 1; t <= hw->gpus_per_node; t++) {
        if (hw->gpus_per_node % t || gpus % t || m->heads % t)
            continue;
        if (m->kv_heads > 0 && m->kv_heads % t)
            continue;
        for (int p = 1; p <= m->layers && p <= gpus / t; p++) {
            if ((gpus / t) % p)
                continue;
            int d = gpus / t / p;
            if (base->global_batch % ((long)d * base->micro_batch))
                continue;
            if (base->v > 1 && (long)p * base->v > m->layers)
                continue;
            for (int e = 1; e <= d; e++) {
                if (d % e || (e > 1 && (m->experts <= 0 || m->experts % e)))
                    continue;
                dl_plan_layout l = *base;
                l.t = t, l.p = p, l.d = d, l.e = e;
                if ((st = search_add(m, hw, o, &l, &all, &total, &room)) != DL_OK) {
                    free(all);
                    return st;
                }
            }
        }
    }
    qsort(all, (size_t)total, sizeof *all, cmp_step);
    for (int i = 0; i < total && i < cap; i++) out[i] = all[i];
    *n = total;
    free(all);
    return DL_OK;
}
