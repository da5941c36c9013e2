/* Mixture of experts: the MoE layers' options (--experts and the rules they follow,
 * lib/model/sublayer_moe.c), expert parallelism (--ep), and the figures: per step the auxiliary
 * and z losses, per MoE layer and expert the choices routed and dropped, each rank's
 * all-to-all bytes and its wait at the combines. */
#include <math.h>
#include "group.h"
#include "cli.h"

static int p_experts(tg_run *r, const char *a)
{
    return cli_parse_int("--experts", a, 1, 1000, &r->o.model.experts);
}
static int p_topk(tg_run *r, const char *a)
{
    return cli_parse_int("--top-k", a, 0, 1000, &r->o.model.top_k);
}
static int p_cap(tg_run *r, const char *a)
{
    return cli_parse_double("--capacity-factor", a, 0, 1e6, &r->o.model.capacity);
}
static int p_every(tg_run *r, const char *a)
{
    return cli_parse_int("--moe-every", a, 1, 4096, &r->o.model.moe_every);
}
static int p_ffn(tg_run *r, const char *a)
{
    return cli_parse_int("--expert-ffn", a, 1, 1 << 20, &r->o.model.expert_ffn);
}
static int p_aux(tg_run *r, const char *a)
{
    return cli_parse_double("--aux-loss", a, 0, 1e6, &r->o.model.aux_loss);
}
static int p_z(tg_run *r, const char *a)
{
    return cli_parse_double("--z-loss", a, 0, 1e6, &r->o.model.z_loss);
}
static int p_ep(tg_run *r, const char *a)
{
    return cli_parse_int("--ep", a, 1, 4096, &r->o.layout.ep);
}

static void init(tg_run *r)
{
    dl_gpt_config *c = &r->o.model;
    c->experts = 0, c->top_k = 1, c->moe_every = 1, c->expert_ffn = 0;
    c->capacity = 1.0, c->aux_loss = 0.01, c->z_loss = 0;
    r->o.layout.ep = 1;
}

/* the options that mean nothing without --experts, and the MoE layer count */
static int check(tg_run *r)
{
    static const char *const need[] = {"ep",         "top-k",    "capacity-factor", "moe-every",
                                       "expert-ffn", "aux-loss", "z-loss"};
    if (r->o.model.experts)
        return r->o.model.moe_every > r->o.model.layers
                   ? tg_refuse(r, "--moe-every %d is more than --layers %d (no MoE layer)",
                               r->o.model.moe_every, r->o.model.layers)
                   : TG_NEXT;
    /* (a resume takes the mixture of experts from the checkpoint later: --ep may change) */
    for (size_t i = 0; i < sizeof need / sizeof need[0] && !tg_given(r, "resume"); i++)
        if (tg_given(r, need[i]))
            return tg_refuse(r, "--%s needs a mixture of experts: give --experts E", need[i]);
    return TG_NEXT;
}

static int on(const tg_run *r) { return r->o.model.experts > 0; }
static int step_on(const tg_run *r) { return r->step && r->step->moe_layers > 0; }

/* the step's figures per MoE layer: the most loaded expert over the mean (1: balanced) */
static double imbalance(const int64_t *routed, int E)
{
    double mx = 0, sum = 0;
    for (int e = 0; e < E; e++) mx = fmax(mx, (double)routed[e]), sum += (double)routed[e];
    return sum > 0 ? mx / (sum / E) : 1.0;
}

static int64_t total(const int64_t *v, int n)
{
    int64_t s = 0;
    for (int i = 0; i < n; i++) s += v[i];
    return s;
}

static int summary_lines(tg_run *run)
{
    const dl_train_result *r = run->r;
    const dl_train_moe_result *m = &r->moe;
    if (!m->layers || r->nsteps < 1)
        return TG_NEXT;
    const dl_train_step *s = &r->steps[r->nsteps - 1];
    int E = m->experts, ep = run->o.layout.ep;
    printf("mixture of experts: %d MoE layer%s of %d experts, top-%d, capacity factor %g%s; ep "
           "%d (each rank %d experts; expert-data-parallel groups of %d ranks)\n",
           m->layers, tg_plural(m->layers, "s"), E, run->o.model.top_k, run->o.model.capacity,
           run->o.model.capacity > 0 ? "" : " (no limit)", ep, E / ep, run->o.layout.dp / ep);
    printf("  last step: aux loss %.6f, z loss %.6f (beside the cross-entropy %.4f)\n", s->aux_loss,
           s->z_loss, s->loss);
    for (int i = 0; i < m->layers; i++) {
        const int64_t *ro = s->routed + (size_t)i * E, *dr = s->dropped + (size_t)i * E;
        int64_t n = total(ro, E), d = total(dr, E);
        printf("  layer %d: routed per expert", m->layer[i]);
        for (int e = 0; e < E; e++) printf(" %lld", (long long)ro[e]);
        printf("; dropped %lld of %lld (%.1f%%); imbalance max/mean %.2f\n", (long long)d,
               (long long)n, n ? 100.0 * (double)d / (double)n : 0.0, imbalance(ro, E));
    }
    double wmax = 0, wmin = INFINITY, bytes = 0;
    for (int q = 0; q < s->nranks; q++) {
        wmax = fmax(wmax, s->combine_wait_ms[q]), wmin = fmin(wmin, s->combine_wait_ms[q]);
        bytes = fmax(bytes, s->a2a_bytes[q]);
    }
    printf("  all-to-all: at most %.3f MiB per rank per step; wait at the combine %.3f .. %.3f ms "
           "over the ranks\n",
           bytes / 1048576.0, wmin, wmax);
    return TG_NEXT;
}

static void j_experts(FILE *f, const tg_run *r) { fprintf(f, "%d", r->o.model.experts); }
static void j_topk(FILE *f, const tg_run *r) { fprintf(f, "%d", r->o.model.top_k); }
static void j_cap(FILE *f, const tg_run *r) { tg_put_num(f, r->o.model.capacity); }
static void j_every(FILE *f, const tg_run *r) { fprintf(f, "%d", r->o.model.moe_every); }
static void j_ffn(FILE *f, const tg_run *r)
{
    fprintf(f, "%d", r->o.model.expert_ffn ? r->o.model.expert_ffn : 4 * r->o.model.d_model);
}
static void j_aux_w(FILE *f, const tg_run *r) { tg_put_num(f, r->o.model.aux_loss); }
static void j_z_w(FILE *f, const tg_run *r) { tg_put_num(f, r->o.model.z_loss); }
static void j_ep(FILE *f, const tg_run *r) { fprintf(f, "%d", r->o.layout.ep); }

static void j_aux(FILE *f, const tg_run *r) { tg_put_num(f, r->step->aux_loss); }
static void j_z(FILE *f, const tg_run *r) { tg_put_num(f, r->step->z_loss); }

static void put_ints(FILE *f, const int64_t *v, int n)
{
    fputc('[', f);
    for (int i = 0; i < n; i++) fprintf(f, i ? ",%lld" : "%lld", (long long)v[i]);
    fputc(']', f);
}
static void put_nums(FILE *f, const double *v, int n)
{
    fputc('[', f);
    for (int i = 0; i < n; i++) {
        if (i)
            fputc(',', f);
        tg_put_num(f, v[i]);
    }
    fputc(']', f);
}

/* [{"layer":L,"routed":[...],"dropped":[...],"imbalance":x}, ...] */
static void j_layers(FILE *f, const tg_run *r)
{
    const dl_train_step *s = r->step;
    int E = s->experts;
    fputc('[', f);
    for (int i = 0; i < s->moe_layers; i++) {
        fprintf(f, "%s{\"layer\":%d,\"routed\":", i ? "," : "", i * r->o.model.moe_every);
        put_ints(f, s->routed + (size_t)i * E, E);
        fputs(",\"dropped\":", f);
        put_ints(f, s->dropped + (size_t)i * E, E);
        fputs(",\"imbalance\":", f);
        tg_put_num(f, imbalance(s->routed + (size_t)i * E, E));
        fputc('}', f);
    }
    fputc(']', f);
}
static void j_a2a(FILE *f, const tg_run *r) { put_nums(f, r->step->a2a_bytes, r->step->nranks); }
static void j_wait(FILE *f, const tg_run *r)
{
    put_nums(f, r->step->combine_wait_ms, r->step->nranks);
}

/* clang-format off */
static const tg_opt opts[] = {
    {"experts", 1, p_experts,
"  --experts E           a mixture of experts: the MLP of the MoE layers (--moe-every)\n"
"                        becomes E expert MLPs behind a router (default: none, dense MLPs)\n"},
    {"top-k", 1, p_topk,
"  --top-k K             experts per token, 1 .. E (default 1: gate p; K >= 2: the K chosen\n"
"                        probabilities renormalised to sum 1)\n"},
    {"capacity-factor", 1, p_cap,
"  --capacity-factor C   each expert admits ceil(C T K / E) choices per sequence, in position\n"
"                        order; the rest are dropped (the residual carries the token); 0: no\n"
"                        limit (default 1)\n"},
    {"moe-every", 1, p_every,
"  --moe-every N         MoE layers 0, N, 2N, ... (default 1: every layer)\n"},
    {"expert-ffn", 1, p_ffn,
"  --expert-ffn F        each expert's hidden width (default 4 x --d-model)\n"},
    {"aux-loss", 1, p_aux,
"  --aux-loss A          load-balancing loss weight: A E sum_i f_i P_i per sequence and layer\n"
"                        (default 0.01)\n"},
    {"z-loss", 1, p_z,
"  --z-loss B            router z-loss weight: B mean logsumexp(logits)^2 (default 0)\n"},
    {"ep", 1, p_ep,
"  --ep N                expert parallelism: the experts spread over N ranks of each dp group\n"
"                        (N divides --dp and E; default 1)\n"},
    {0},
};
/* clang-format on */
static const tg_hook hooks[] = {{TG_CHECK, check}, {TG_REPORT, summary_lines}, {0}};
static const tg_field config[] =
    {{"experts", j_experts, on},   {"top_k", j_topk, on},     {"capacity_factor", j_cap, on},
     {"moe_every", j_every, on},   {"expert_ffn", j_ffn, on}, {"aux_loss_weight", j_aux_w, on},
     {"z_loss_weight", j_z_w, on}, {"ep", j_ep, on},          {0}};
static const tg_field step[] = {{"aux_loss", j_aux, step_on},         {"z_loss", j_z, step_on},
                                {"moe", j_layers, step_on},           {"a2a_bytes", j_a2a, step_on},
                                {"combine_wait_ms", j_wait, step_on}, {0}};

const tg_group tg_moe = {.heading = "Mixture of experts:\n",
                         .opts = opts,
                         .init = init,
                         .hooks = hooks,
                         .config = config,
                         .step = step};
