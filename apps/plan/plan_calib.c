/* distlab-plan calibrate / validate: the planner measured against this machine.
 *
 * calibrate measures, with the runtime itself, what the planner's step-time model needs for the
 * trainer's model: GEMM FLOP/s per rank on the model's shapes (alone and with --ranks ranks at
 * once), ring all-reduce and point-to-point bandwidth and latency, and the non-GEMM share of a
 * training step (dl_train_run on one rank vs its GEMM time); it writes a hardware profile
 * (dl_plan_hw_write, the optional calibration keys included).
 *
 * validate predicts distlab-train's step time and model-state memory per rank for local layouts
 * (dp, tp, pp with GPipe and 1F1B, ZeRO 0-3; --moe: a mixture of experts at dp x ep, with its
 * all-to-all bytes), runs each through dl_train_run
 * for a few steps, and prints predicted vs measured with the error (docs/PLANNER.md,
 * "Calibrated against this machine"). */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "distlab.h"
#include "core/topo.h"
#include "model/ops.h"
#include "parallel/zero.h"
#include "cli.h"
#include "bench_util.h"
#include "plan_calib.h"
#include "core/stats.h"

/* ---------------------------------------------------------------------------------------- */
/* The model and batch both subcommands use: distlab-train's defaults                         */

typedef struct pc_model {
    dl_gpt_config cfg;
    int micro_batch; /* sequences per micro-batch per dp rank (distlab-train: 8) */
} pc_model;

static void pc_model_init(pc_model *m, int small)
{
    dl_gpt_config_default(&m->cfg);
    m->cfg.layers = small ? 2 : 4;
    m->cfg.d_model = small ? 64 : 128;
    m->cfg.heads = 4;
    m->cfg.seq = small ? 32 : 64;
    m->micro_batch = 8;
}

/* GEMM FLOPs of one micro-batch: the blocks' (split over tp) and the LM head's (replicated). */
static void pc_gemm_flops(const pc_model *m, double *blocks, double *head)
{
    static dl_gemm_log lg;
    bu_model b = {m->cfg.layers, m->cfg.d_model, m->cfg.heads, m->cfg.seq, m->micro_batch};
    bu_model_gemms(&b, &lg);
    double all = bu_gemm_log_flops(&lg);
    b.layers = 0;
    bu_model_gemms(&b, &lg);
    *head = bu_gemm_log_flops(&lg);
    *blocks = all - *head;
}

static int pc_cores(void)
{
    dl_topo *topo = NULL;
    int n = 0;
    if (dl_topo_load(&topo, "") == DL_OK)
        n = dl_topo_real_pus(topo);
    dl_topo_destroy(topo);
    if (n < 1)
        n = (int)sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n;
}

/* ---------------------------------------------------------------------------------------- */
/* Measurements                                                                               */

typedef struct gemm_job {
    const dl_gemm_log *log;
    int iters;
    double *t; /* [rank][iters] */
} gemm_job;

static int gemm_rank(dl_ctx *ctx, void *arg)
{
    gemm_job *g = arg;
    int r = dl_ctx_rank(ctx), rc = DL_OK;
    bu_gemm_bufs b;
    if (bu_gemm_alloc(g->log, &b) != 0)
        return DL_ENOMEM;
    bu_gemm_run(g->log, &b);
    for (int it = 0; it < g->iters && rc == DL_OK; it++) {
        rc = dl_barrier(dl_ctx_comm(ctx)); /* all ranks at once: contention included */
        uint64_t t0 = dl_now_ns();
        bu_gemm_run(g->log, &b);
        g->t[(size_t)r * g->iters + it] = (double)(dl_now_ns() - t0) * 1e-9;
    }
    bu_gemm_free(&b);
    return rc;
}

/* Seconds of one pass over log per rank with n ranks at once (mean over ranks of each one's best). */
static double measure_gemm(const dl_gemm_log *log, int n, int iters)
{
    gemm_job g = {log, iters, calloc((size_t)n * iters, sizeof(double))};
    if (!g.t)
        return NAN;
    dl_world_opts wo;
    dl_world_opts_init(&wo);
    wo.nranks = n;
    wo.topology = "";
    wo.timeout_s = 0;
    double mean = NAN;
    if (dl_world_run(&wo, gemm_rank, &g) == DL_OK) {
        mean = 0;
        for (int r = 0; r < n; r++) { /* each rank's best pass (noise only adds time) */
            double best = INFINITY;
            for (int it = 0; it < iters; it++)
                if (g.t[(size_t)r * iters + it] < best)
                    best = g.t[(size_t)r * iters + it];
            mean += best / n;
        }
    }
    free(g.t);
    return mean;
}

/* Warm-up calls per size. With 2, the first size (1 KiB, right after the world starts) read
 * 6-15 us one way where 64 KiB read 1 us: its first calls pay start-up costs (issue 29); with 20
 * both all-reduce and ping-pong at 1 KiB read 0.5-0.8 us, as distlab-bench coll does. */
enum { NSIZES = 4, WARMUPS = 20 };
typedef struct comm_job {
    int p2p; /* 0: all-reduce over all ranks; 1: ping-pong between ranks 0 and 1 */
    int nsizes, iters;
    size_t count[NSIZES];
    double t[NSIZES]; /* rank 0's median seconds (one-way for p2p) */
} comm_job;

static int comm_rank(dl_ctx *ctx, void *arg)
{
    comm_job *j = arg;
    dl_comm *c = dl_ctx_comm(ctx);
    int r = dl_ctx_rank(ctx), rc = DL_OK;
    size_t maxc = 0;
    for (int s = 0; s < j->nsizes; s++)
        if (j->count[s] > maxc)
            maxc = j->count[s];
    /* written before use, page-aligned, as distlab-bench coll's buffers: calloc's untouched
     * pages made the 4 MiB all-reduce 3-4x slower (the ring fitted at 2.6-3.6 GB/s where coll
     * measured ~10; written, 13-15 GB/s: issue 29, docs/PERFORMANCE.md) */
    float *a = NULL, *b = NULL;
    double *t = calloc((size_t)j->iters, sizeof *t);
    if (posix_memalign((void **)&a, 4096, maxc * sizeof *a) != 0)
        a = NULL;
    if (posix_memalign((void **)&b, 4096, maxc * sizeof *b) != 0)
        b = NULL;
    if (!a || !b || !t)
        rc = DL_ENOMEM;
    else
        memset(a, 0, maxc * sizeof *a), memset(b, 0, maxc * sizeof *b);
    for (int s = 0; s < j->nsizes && rc == DL_OK; s++) {
        size_t n = j->count[s];
        for (int it = -WARMUPS; it < j->iters && rc == DL_OK; it++) {
            if ((rc = dl_barrier(c)))
                break;
            uint64_t t0 = dl_now_ns();
            if (!j->p2p) {
                rc = dl_allreduce(c, a, b, n, DL_F32, DL_SUM, DL_PURPOSE_OTHER);
            } else if (r == 0) {
                if (!(rc = dl_send(c, a, n, DL_F32, 1, DL_PURPOSE_OTHER)))
                    rc = dl_recv(c, b, n, DL_F32, 1, DL_PURPOSE_OTHER);
            } else if (r == 1) {
                if (!(rc = dl_recv(c, b, n, DL_F32, 0, DL_PURPOSE_OTHER)))
                    rc = dl_send(c, a, n, DL_F32, 0, DL_PURPOSE_OTHER);
            }
            double dt = (double)(dl_now_ns() - t0) * 1e-9;
            if (it >= 0)
                t[it] = j->p2p ? dt / 2 : dt;
        }
        if (r == 0 && rc == DL_OK)
            j->t[s] = dl__median_copy(t, (size_t)j->iters);
    }
    free(a), free(b), free(t);
    return rc;
}

/* Least-squares line t = a + b*S through the (S, t) points. */
static void fit_line(const double *S, const double *t, int n, double *a, double *b)
{
    double ms = 0, mt = 0, sxx = 0, sxy = 0;
    for (int i = 0; i < n; i++) ms += S[i] / n, mt += t[i] / n;
    for (int i = 0; i < n; i++) sxx += (S[i] - ms) * (S[i] - ms), sxy += (S[i] - ms) * (t[i] - mt);
    *b = sxx > 0 ? sxy / sxx : 0;
    *a = mt - *b * ms;
}

static int measure_comm(int n, int p2p, int quick, double *bw, double *lat, comm_job *out)
{
    comm_job j;
    memset(&j, 0, sizeof j);
    j.p2p = p2p;
    j.nsizes = NSIZES;
    j.iters = quick ? 7 : 21;
    static const size_t counts[NSIZES] = {256, 16384, 262144, 1048576}; /* 1 KiB .. 4 MiB of f32 */
    memcpy(j.count, counts, sizeof counts);
    dl_world_opts wo;
    dl_world_opts_init(&wo);
    wo.nranks = n;
    wo.topology = "";
    wo.timeout_s = 0;
    if (dl_world_run(&wo, comm_rank, &j) != DL_OK)
        return -1;
    double S[NSIZES], t[NSIZES], a, b;
    for (int s = 0; s < NSIZES; s++) S[s] = (double)j.count[s] * 4, t[s] = j.t[s];
    fit_line(S, t, NSIZES, &a, &b);
    if (!(b > 0))
        b = t[NSIZES - 1] / S[NSIZES - 1];
    if (!(a > 0))
        a = t[0] - S[0] * b; /* the line passes below zero: the smallest message's excess */
    if (!(a > 0))
        a = 1e-9;
    if (!p2p) { /* ring: t = 2(n-1) alpha + 2(n-1)/n S / beta */
        *lat = a / (2.0 * (n - 1));
        *bw = 2.0 * (n - 1) / (n * b);
    } else {
        *lat = a;
        *bw = 1.0 / b;
    }
    if (out)
        *out = j;
    return 0;
}

/* A local layout: dp x tp x pp ranks, ZeRO stage, and with pp > 1 the pipeline's micro-batches
 * (of micro_batch sequences each) and schedule. */
typedef struct pc_layout {
    int dp, tp, zero, pp, m, sched;
    int ep; /* expert parallelism (a mixture of experts, validate --moe; 1: none) */
} pc_layout;

/* One dl_train_run of the layout; fills ms (median step) and the result (caller frees). */
static int run_layout(const pc_model *m, const pc_layout *L, int steps, dl_train_result *res)
{
    dl_train_opts o;
    dl_train_opts_init(&o);
    o.model = m->cfg;
    o.layout.dp = L->dp;
    o.layout.tp = L->tp;
    o.layout.pp = L->pp > 1 ? L->pp : 1;
    o.layout.ep = L->ep;
    o.pipeline.schedule = L->sched;
    o.zero.stage = L->zero;
    o.batch.micro = m->micro_batch;
    o.batch.microbatches = L->pp > 1 ? L->m : 1;
    o.batch.global = L->dp * o.batch.microbatches * m->micro_batch;
    o.optim.steps = steps;
    o.optim.warmup = 1;
    o.eval.every = 0;
    o.eval.windows = 1;
    o.output.log_every = 0;
    o.output.log = NULL;
    o.machine.timeout_s = 0;
    memset(res, 0, sizeof *res);
    if (dl_train_resolve(&o, L->dp * L->tp * o.layout.pp) != DL_OK)
        return -1;
    return dl_train_run(&o, res) == DL_OK ? 0 : -1;
}

/* The best (fastest) step after the first of `reps` runs, in ms: the host is shared and noisy,
 * and background load only ever adds time, so the fastest step is the machine's own figure
 * (calibrate and validate both use it). *res keeps the last run's result (memory peaks are the
 * same every run). */
static double run_best(const pc_model *m, int dp, int tp, int zero, int steps, int reps,
                       dl_train_result *res)
{
    pc_layout L = {dp, tp, zero, 1, 1, 0, 1};
    double best = INFINITY;
    for (int i = 0; i < reps; i++) {
        if (i > 0)
            dl_train_result_free(res);
        if (run_layout(m, &L, steps, res) != 0)
            return NAN;
        for (int k = 1; k < res->nsteps; k++)
            if (res->steps[k].ms < best)
                best = res->steps[k].ms;
    }
    return best;
}

/* One run of a layout: its fastest step after the first (ms), or NAN. */
static double run_once(const pc_model *m, const pc_layout *L, int steps, dl_train_result *res)
{
    if (run_layout(m, L, steps, res) != 0)
        return NAN;
    double best = INFINITY;
    for (int k = 1; k < res->nsteps; k++)
        if (res->steps[k].ms < best)
            best = res->steps[k].ms;
    return best;
}

/* ---------------------------------------------------------------------------------------- */
/* Predictions                                                                                */

/* The trainer's ZeRO shard per rank: units (the embeddings, each layer, the head) each padded to
 * a multiple of dp, rank r owning block r of every unit (lib/parallel/zero.h); the sum of the
 * blocks. */
static size_t pc_zero_shard(const dl_gpt_layout *lay, int dp)
{
    size_t *b = malloc(sizeof(size_t) * (size_t)(lay->ntensors + 2));
    int n = 0;
    if (!b)
        return lay->numel;
    if (lay->part.embed)
        b[n++] = 0;
    for (int k = 0; k < lay->ntensors; k++) {
        const char *nm = lay->t[k].name;
        size_t len = strlen(nm);
        if ((len > 12 && !strcmp(nm + len - 12, ".ln_1.weight")) || !strcmp(nm, "ln_f.weight"))
            if (n == 0 || b[n - 1] != lay->t[k].offset)
                b[n++] = lay->t[k].offset;
    }
    b[n] = lay->numel;
    dl_zero_units z;
    size_t S = lay->numel;
    if (n > 0 && dl_zero_units_init(&z, b, n, dp, 0) == DL_OK) {
        S = z.shard;
        dl_zero_units_free(&z);
    }
    free(b);
    return S;
}

/* Model-state bytes of a rank holding `lay` (f32/f64): params, grads, AdamW m and v, sharded as
 * the trainer shards them: stage 1 the optimizer state, 2 also the gradient (the full buffer is
 * never held), 3 also the parameters. */
static void pc_state_of(const dl_gpt_layout *lay, int dp, int zero, int dsize, double bytes[3])
{
    int st = dp > 1 ? zero : 0;
    double P = (double)lay->numel, S = st ? (double)pc_zero_shard(lay, dp) : P;
    bytes[0] = (st == 3 ? S : P) * dsize;
    bytes[1] = (st >= 2 ? S : P) * dsize;
    bytes[2] = 2.0 * S * dsize;
}

void pc_state_predict(const dl_gpt_config *c, int dp, int tp, int zero, int dsize, double bytes[3],
                      size_t *numel_out)
{
    /* every tp rank holds the same number of elements (the shards are equal blocks) */
    dl_gpt_layout *lay = NULL;
    bytes[0] = bytes[1] = bytes[2] = 0;
    if (numel_out)
        *numel_out = 0;
    if (dl_gpt_layout_create(c, tp, 0, &lay) != DL_OK)
        return;
    pc_state_of(lay, dp, zero, dsize, bytes);
    if (numel_out)
        *numel_out = lay->numel;
    dl_gpt_layout_destroy(lay);
}

typedef struct pc_pred {
    double gemm, nongemm, dp_comm, tp_comm, small_comm, sync, total; /* seconds */
    double a2a;       /* the MoE layers' all-to-alls (s) */
    double a2a_bytes; /* bytes a rank's all-to-alls carry per step, its own block included */
    int ncoll;        /* blocking collectives per step on the critical path */
    int oversub;
} pc_pred;

/* Blocking collectives of one training step per rank (distlab-train's defaults: 1 MiB gradient
 * buckets, no overlap): dp gradient buckets, or with ZeRO per unit (the embeddings, each layer,
 * the head) a reduce-scatter and an all-gather (stages 1, 2) or two all-gathers and a
 * reduce-scatter (stage 3), tp's 4 all-reduces per layer (2 forward, 2 backward) per
 * micro-batch, and the loss and gradient-norm scalars. */
static int pc_collectives(const pc_model *m, int dp, int tp, int zero, size_t P)
{
    size_t bucket = (size_t)(1.0 * 1048576.0 / 4);
    int n = 0;
    if (dp > 1) {
        int rounds = (int)((P + bucket - 1) / bucket), units = m->cfg.layers + 2;
        n += zero == 3 ? 3 * units : zero ? 2 * units : rounds;
    }
    if (tp > 1)
        n += 4 * m->cfg.layers;
    if (dp * tp > 1)
        n += 2;
    return n;
}

static void pc_predict_time(const dl_plan_hw *hw, const pc_model *m, int dp, int tp, int zero,
                            int cores, pc_pred *p)
{
    /* ZeRO 1/2: reduce-scatter + all-gather = the all-reduce's bytes; 3: one more all-gather */
    memset(p, 0, sizeof *p);
    double blocks, head;
    pc_gemm_flops(m, &blocks, &head);
    int n = dp * tp, R = hw->ranks > 0 ? hw->ranks : 1;
    double rate1 = hw->flops_alone > 0 ? hw->flops_alone : hw->flops;
    double cfR = hw->flops_alone > 0 ? hw->flops_alone / hw->flops : 1.0;
    int k = n < cores ? n : cores;
    double cf = k <= 1 ? 1.0 : (R > 1 ? 1.0 + (cfR - 1.0) * (k - 1) / (R - 1) : cfR);
    p->gemm = (blocks / tp + head) / rate1 * cf;
    double ncR = hw->nongemm_contention > 0 ? hw->nongemm_contention : cfR;
    double ncf = k <= 1 ? 1.0 : (R > 1 ? 1.0 + (ncR - 1.0) * (k - 1) / (R - 1) : ncR);
    p->nongemm = hw->nongemm_ratio * (blocks + head) / rate1 / tp * ncf;
    double alpha = hw->intra_lat, beta = hw->intra_bw;
    double pb[3];
    size_t P;
    pc_state_predict(&m->cfg, dp, tp, zero, 4, pb, &P);
    if (dp > 1)
        p->dp_comm = (dp > 1 && zero == 3 ? 1.5 : 1.0) * 2.0 * (dp - 1) *
                     (alpha + (double)P * 4 / (dp * beta));
    if (tp > 1) {
        double msg = (double)m->micro_batch * m->cfg.seq * m->cfg.d_model * 4;
        p->tp_comm = 4.0 * m->cfg.layers * 2.0 * (tp - 1) * (alpha + msg / (tp * beta));
    }
    if (n > 1)
        p->small_comm = 2 * 2.0 * (n - 1) * alpha; /* loss and gradient-norm scalars */
    p->ncoll = pc_collectives(m, dp, tp, zero, P);
    p->sync = p->ncoll * hw->sync_cost;
    p->oversub = n > cores;
    double comp = p->gemm + p->nongemm + p->sync;
    if (p->oversub)
        comp *= (double)n / cores;
    p->total = comp + p->dp_comm + p->tp_comm + p->small_comm;
}

/* Pipeline layouts: what stage `stage` holds (the trainer's even split of the layers) and
 * its model-state bytes. The trainer's stage s holds layers bounds[s] .. bounds[s+1]-1, stage 0
 * the embeddings, the last stage ln_f and the head. */
static dl_gpt_layout *pc_stage_layout(const dl_gpt_config *c, int tp, int pp, int stage,
                                      int *nlayers)
{
    int bounds[65];
    double cost[64];
    dl_gpt_part part;
    dl_gpt_layout *lay = NULL;
    if (pp > 64 || c->layers > 64 || pp > c->layers)
        return NULL;
    for (int i = 0; i < c->layers; i++) cost[i] = 1;
    if (dl_sched_partition(cost, c->layers, pp, 0, bounds, NULL, NULL) != DL_OK ||
        dl_gpt_part_stage(c, pp, 1, stage, bounds, &part) != DL_OK ||
        dl_gpt_layout_create_part(c, tp, 0, &part, &lay) != DL_OK)
        return NULL;
    if (nlayers)
        *nlayers = part.count[0];
    return lay;
}

static void pc_state_predict_stage(const dl_gpt_config *c, const pc_layout *L, int stage, int dsize,
                                   double bytes[3], size_t *numel_out)
{
    dl_gpt_layout *lay = pc_stage_layout(c, L->tp, L->pp, stage, NULL);
    bytes[0] = bytes[1] = bytes[2] = 0;
    if (numel_out)
        *numel_out = 0;
    if (!lay)
        return;
    pc_state_of(lay, L->dp, L->zero, dsize, bytes);
    if (numel_out)
        *numel_out = lay->numel;
    dl_gpt_layout_destroy(lay);
}

/* A pipelined step: each micro-batch's forward and backward through the slowest stage, (m + p -
 * 1) times (GPipe and 1F1B without interleaving alike), plus two hand-offs per micro-batch per
 * boundary on the critical path (an activation and a gradient, alpha + bytes / beta each, and a
 * rendezvous of busy ranks each) and the dp reduction of the largest stage's gradients. With more
 * ranks than cores the CPU time of all stages bounds it from below. */
static void pc_predict_time_pp(const dl_plan_hw *hw, const pc_model *m, const pc_layout *L,
                               int cores, pc_pred *p)
{
    memset(p, 0, sizeof *p);
    double blocks, head;
    pc_gemm_flops(m, &blocks, &head);
    int n = L->dp * L->tp * L->pp, R = hw->ranks > 0 ? hw->ranks : 1;
    double rate1 = hw->flops_alone > 0 ? hw->flops_alone : hw->flops;
    double cfR = hw->flops_alone > 0 ? hw->flops_alone / hw->flops : 1.0;
    int k = n < cores ? n : cores;
    double cf = k <= 1 ? 1.0 : (R > 1 ? 1.0 + (cfR - 1.0) * (k - 1) / (R - 1) : cfR);
    double ncR = hw->nongemm_contention > 0 ? hw->nongemm_contention : cfR;
    double ncf = k <= 1 ? 1.0 : (R > 1 ? 1.0 + (ncR - 1.0) * (k - 1) / (R - 1) : ncR);
    double per_layer = blocks / m->cfg.layers, slowest = 0, work = 0, slowest_gemm = 0;
    size_t Pmax = 0;
    for (int st = 0; st < L->pp; st++) {
        int nl = 0;
        dl_gpt_layout *lay = pc_stage_layout(&m->cfg, L->tp, L->pp, st, &nl);
        if (!lay)
            continue;
        size_t P = lay->numel;
        dl_gpt_layout_destroy(lay);
        double f = per_layer * nl / L->tp + (st == L->pp - 1 ? head : 0);
        double g = f / rate1 * cf, ng = hw->nongemm_ratio * f / rate1 * ncf;
        if (g + ng > slowest)
            slowest = g + ng, slowest_gemm = g;
        work += (g + ng) * L->m * L->dp * L->tp;
        if (P > Pmax)
            Pmax = P;
    }
    int steps = L->m + L->pp - 1;
    p->gemm = slowest_gemm * steps;
    p->nongemm = (slowest - slowest_gemm) * steps;
    double msg = (double)m->micro_batch * m->cfg.seq * m->cfg.d_model * 4;
    double hop = hw->p2p_lat + (hw->p2p_bw > 0 ? msg / hw->p2p_bw : 0);
    double pipe_comm = L->pp > 1 ? 2.0 * steps * hop : 0;
    double alpha = hw->intra_lat, beta = hw->intra_bw;
    if (L->dp > 1)
        p->dp_comm = (L->zero == 3 ? 1.5 : 1.0) * 2.0 * (L->dp - 1) *
                     (alpha + (double)Pmax * 4 / (L->dp * beta));
    if (L->tp > 1)
        p->tp_comm =
            4.0 * m->cfg.layers / L->pp * L->m * 2.0 * (L->tp - 1) * (alpha + msg / (L->tp * beta));
    p->small_comm = 3 * 2.0 * (n - 1) * alpha + pipe_comm; /* loss (dp, pp) and norm scalars */
    p->ncoll = 2 * steps + (L->tp > 1 ? 4 * m->cfg.layers / L->pp * L->m : 0) + 3;
    p->sync = p->ncoll * hw->sync_cost;
    p->oversub = n > cores;
    double path = p->gemm + p->nongemm + p->sync;
    if (p->oversub && work / cores > path)
        path = work / cores;
    p->total = path + p->dp_comm + p->tp_comm + p->small_comm;
}

/* ---------------------------------------------------------------------------------------- */
/* A mixture of experts (validate --moe)                                                      */

/* The MoE model validate --moe runs: every MLP 4 experts of the dense width behind a top-2
 * router, no capacity limit (nothing dropped, so the all-to-all bytes are the planner's formula
 * exactly; the time is the balanced load's, which routing imbalance can only exceed). */
static void pc_model_moe(pc_model *m)
{
    m->cfg.experts = 4, m->cfg.top_k = 2, m->cfg.moe_every = 1, m->cfg.capacity = 0;
    m->cfg.aux_loss = 0.01;
}

/* The trainer's model as the planner describes it: GPT MLPs, the byte vocabulary; Psi pinned to
 * the trainer's count (biases, norms and positions included), so that only the split between
 * dense and expert parameters is the planner's formula's. f32 everywhere: 4-byte weights,
 * gradients and values on the wire, AdamW's m and v (K = 8), ZeRO 0. */
static void pc_plan_of(const pc_model *m, const pc_layout *L, dl_plan_model *pm, dl_plan_opts *po,
                       dl_plan_layout *pl)
{
    const dl_gpt_config *c = &m->cfg;
    memset(pm, 0, sizeof *pm);
    snprintf(pm->name, sizeof pm->name, "distlab-train");
    pm->layers = c->layers, pm->hidden = c->d_model, pm->heads = c->heads;
    pm->kv_heads = c->heads, pm->ffn = 4 * c->d_model, pm->vocab = c->vocab, pm->seq = c->seq;
    pm->experts = c->experts, pm->top_k = c->top_k, pm->expert_ffn = c->expert_ffn;
    pm->moe_every = c->moe_every, pm->capacity = c->capacity;
    pm->params = (double)dl_gpt_num_params(c);
    dl_plan_opts_init(po);
    po->weight_bytes = po->grad_bytes = po->grad_comm_bytes = po->act_bytes = 4;
    po->optim_bytes = 8, po->zero_stage = 0;
    po->ep_link = DL_PLAN_LINK_INTRA; /* rank threads: the profile's point-to-point link */
    *pl = (dl_plan_layout){1,      1,    L->dp, 1, m->micro_batch, (long)L->dp * m->micro_batch,
                           c->seq, L->ep};
}

/* Model-state bytes of rank 0 of dp x ep (its E / ep experts whole, every dense tensor), and the
 * elements it holds: the trainer's layout, as pc_state_predict (ZeRO 0: the only stage the trainer
 * composes with experts on this branch). */
static void pc_state_predict_ep(const dl_gpt_config *c, int dp, int ep, double bytes[3],
                                size_t *numel)
{
    dl_gpt_layout *lay = NULL;
    bytes[0] = bytes[1] = bytes[2] = 0, *numel = 0;
    if (dl_gpt_layout_create_ep(c, 1, 0, ep, 0, NULL, &lay) != DL_OK)
        return;
    pc_state_of(lay, dp, 0, 4, bytes);
    *numel = lay->numel;
    dl_gpt_layout_destroy(lay);
}

/* A dp x ep step: the dense step's model (pc_predict_time) with, per MoE layer, the dense MLP's
 * GEMMs 6 BT C 8C replaced by the router's 6 BT C E and the experts' 6 BT k 2 C F (uniform
 * routing: a rank's experts get as many choices as its tokens make), the non-GEMM work scaled
 * alike; the gradients of the dense parameters reduced over dp, the experts' over dp / ep; the
 * all-to-alls (the planner's dl_plan_moe_a2a on the point-to-point link: 2 forward, 2 backward
 * per MoE layer) and a rendezvous for each of them and the counts' exchange. */
static void pc_predict_time_moe(const dl_plan_hw *hw, const pc_model *m, const pc_layout *L,
                                int cores, pc_pred *p)
{
    const dl_gpt_config *c = &m->cfg;
    pc_predict_time(hw, m, L->dp, 1, 0, cores, p);
    dl_plan_model pm;
    dl_plan_opts po;
    dl_plan_layout pl;
    pc_plan_of(m, L, &pm, &po, &pl);
    int nmoe = dl_plan_moe_layers(&pm), ep = L->ep > 1 ? L->ep : 1, edp = L->dp / ep;
    double blocks, head, bt = (double)m->micro_batch * c->seq, C = c->d_model;
    double F = c->expert_ffn > 0 ? c->expert_ffn : 4 * C;
    pc_gemm_flops(m, &blocks, &head);
    double delta = nmoe * 6.0 * bt * C * (c->experts + 2.0 * c->top_k * F - 8.0 * C);
    double scale = (blocks + head + delta) / (blocks + head);
    p->gemm *= scale, p->nongemm *= scale;
    double pb[3];
    size_t P;
    pc_state_predict_ep(c, L->dp, ep, pb, &P);
    double Pe = (double)nmoe * (c->experts / ep) * (2.0 * C * F + F + C), Pd = (double)P - Pe;
    double alpha = hw->intra_lat, beta = hw->intra_bw;
    p->dp_comm = (L->dp > 1 ? 2.0 * (L->dp - 1) * (alpha + Pd * 4 / (L->dp * beta)) : 0) +
                 (edp > 1 ? 2.0 * (edp - 1) * (alpha + Pe * 4 / (edp * beta)) : 0);
    dl_plan_hw ph = *hw;
    ph.intra_bw = hw->p2p_bw > 0 ? hw->p2p_bw : hw->intra_bw;
    ph.intra_lat = hw->p2p_bw > 0 ? hw->p2p_lat : hw->intra_lat;
    dl_plan_a2a a;
    if (dl_plan_moe_a2a(&pm, &ph, &po, &pl, &a) == DL_OK) {
        p->a2a = 2.0 * a.fwd_time * nmoe;
        p->a2a_bytes = 4.0 * a.payload * nmoe;
    }
    if (ep > 1)
        p->ncoll += 5 * nmoe;
    p->sync = p->ncoll * hw->sync_cost;
    double comp = p->gemm + p->nongemm + p->sync;
    if (p->oversub)
        comp *= (double)L->dp / cores;
    p->total = comp + p->dp_comm + p->small_comm + p->a2a;
}

/* ---------------------------------------------------------------------------------------- */
/* calibrate                                                                                  */

/* The measured figures of a calibration, each the fastest over interleaved rounds (seconds), and
 * the noise: the largest (median - fastest) / fastest of a figure over the rounds. Every figure
 * comes from the same rounds, so a burst of background load, or the host's slow mode, lands in
 * one round of each figure rather than in all rounds of one (the cause of "GEMMs alone 199.96 ms,
 * step 107.20 ms": the GEMM passes ran back to back in one second, the steps over a minute). */
typedef struct pc_figs {
    double gemm1, gemmR;         /* one pass of the step's GEMMs: alone; per rank, R at once */
    double step1, stepR, steptp; /* fastest step: 1 rank; dp R; tp R */
    double noise;
} pc_figs;

enum { PC_NFIG = 5, PC_MAXROUNDS = 16 };

/* What the figures give: the profile's compute keys (the communication keys already in hw). */
static void pc_fit(const pc_model *m, int ranks, const pc_figs *x, dl_plan_hw *hw, double *arR,
                   pc_pred *tp_model)
{
    double blocks, head;
    pc_gemm_flops(m, &blocks, &head);
    double F = blocks + head;
    hw->flops_alone = F / x->gemm1;
    hw->flops = F / x->gemmR;
    hw->nongemm_ratio = (x->step1 - x->gemm1) / x->gemm1;
    /* the same per-rank work on R ranks at once (dp = R), less its gradient all-reduce */
    double pb[3];
    size_t numel;
    pc_state_predict(&m->cfg, ranks, 1, 0, 4, pb, &numel);
    *arR = 2.0 * (ranks - 1) * (hw->intra_lat + (double)numel * 4 / (ranks * hw->intra_bw));
    hw->nongemm_contention = (x->stepR - x->gemmR - *arR) / (x->step1 - x->gemm1);
    /* tp = R: what the compute and byte model leave unexplained, per blocking collective (the
     * cost of a rendezvous of busy ranks) */
    int tpR = m->cfg.heads % ranks == 0 ? ranks : 2;
    hw->sync_cost = 0;
    pc_predict_time(hw, m, 1, tpR, 0, ranks, tp_model);
    /* Below the model (within the noise, pc_check_figures refuses beyond it) the rendezvous is
     * not resolved: the model's own inputs carry that noise (a CI host measured tp 2 at 15.64 ms
     * against 15.66 ms modelled, another round 5.5% below with 15.7% noise). Taken as 0 beyond
     * the transfers, which the model charges alpha + bytes / beta each. */
    double resid = x->steptp - tp_model->total;
    hw->sync_cost = resid > 0 ? resid / tp_model->ncoll : 0;
}

/* 0 when the figures are plausible, else -1 and why (one line): a part never exceeds its whole,
 * R ranks at once are not faster per rank than one alone beyond the noise, a synchronised run is
 * not faster than the model of it without its synchronisation, and every cost is positive. */
static int pc_check_figures(const pc_model *m, int ranks, const pc_figs *x, const dl_plan_hw *comm,
                            char *why, size_t n)
{
    dl_plan_hw hw = *comm;
    double arR;
    pc_pred tpm;
    double tol = x->noise;
    int tpR = m->cfg.heads % ranks == 0 ? ranks : 2;
    if (!(comm->intra_bw > 0) || !(comm->intra_lat > 0) || !(comm->p2p_bw > 0) ||
        !(comm->p2p_lat > 0)) {
        snprintf(why, n,
                 "the communication fit has a non-positive latency or bandwidth (ring "
                 "%.3g GB/s, %.3g us; point-to-point %.3g GB/s, %.3g us)",
                 comm->intra_bw / 1e9, comm->intra_lat * 1e6, comm->p2p_bw / 1e9,
                 comm->p2p_lat * 1e6);
        return -1;
    }
    if (!(x->gemm1 > 0) || !(x->gemmR > 0) || !(x->step1 > 0) || !(x->stepR > 0) ||
        !(x->steptp > 0)) {
        snprintf(why, n, "a measured time is not positive");
        return -1;
    }
    if (x->gemm1 >= x->step1) {
        snprintf(why, n,
                 "the step's GEMMs alone (%.2f ms) take no less than the whole 1-rank "
                 "step (%.2f ms): a part exceeds its whole",
                 x->gemm1 * 1e3, x->step1 * 1e3);
        return -1;
    }
    if (x->gemmR < x->gemm1 * (1 - tol)) {
        snprintf(why, n,
                 "a GEMM pass with %d ranks at once (%.2f ms per rank) beats one rank "
                 "alone (%.2f ms) by more than the noise (%.1f%%)",
                 ranks, x->gemmR * 1e3, x->gemm1 * 1e3, 100 * tol);
        return -1;
    }
    pc_fit(m, ranks, x, &hw, &arR, &tpm);
    if (x->stepR <= x->gemmR + arR) {
        snprintf(why, n,
                 "the dp %d step (%.2f ms) is no longer than its GEMMs (%.2f ms) and "
                 "all-reduce (%.2f ms): a part exceeds its whole",
                 ranks, x->stepR * 1e3, x->gemmR * 1e3, arR * 1e3);
        return -1;
    }
    if (x->steptp < tpm.total * (1 - tol)) {
        snprintf(why, n,
                 "tp %d with its synchronisation (%.2f ms) beats the model of it without "
                 "(%.2f ms) by more than the noise (%.1f%%): its %d blocking collectives would "
                 "cost %.1f us each",
                 tpR, x->steptp * 1e3, tpm.total * 1e3, 100 * tol, tpm.ncoll,
                 (x->steptp - tpm.total) / tpm.ncoll * 1e6);
        return -1;
    }
    return 0;
}

/* The communication figures: ring all-reduce and ping-pong fits; measured again (at most three
 * times) when a fit gives a non-positive latency or bandwidth (the timer's view of the smallest
 * message is a few hundred ns: a burst of load on the largest one tilts the line). */
static int measure_comm_checked(int ranks, int quick, dl_plan_hw *hw, comm_job *ar, comm_job *pp,
                                int quiet)
{
    for (int tries = 0; tries < 3; tries++) {
        if (measure_comm(ranks, 0, quick, &hw->intra_bw, &hw->intra_lat, ar) ||
            measure_comm(ranks, 1, quick, &hw->p2p_bw, &hw->p2p_lat, pp)) {
            cli_error("calibrate: communication measurement failed: %s", dl_errmsg());
            return -1;
        }
        if (hw->intra_bw > 0 && hw->intra_lat > 0 && hw->p2p_bw > 0 && hw->p2p_lat > 0) {
            if (!quiet)
                fprintf(stderr,
                        "calibrate: communication: ring %.3g GB/s, %.3g us; "
                        "point-to-point %.3g GB/s, %.3g us\n",
                        hw->intra_bw / 1e9, hw->intra_lat * 1e6, hw->p2p_bw / 1e9,
                        hw->p2p_lat * 1e6);
            return 0;
        }
        if (!quiet)
            fprintf(stderr,
                    "calibrate: communication fit not positive (ring %.3g us, point-to-point "
                    "%.3g us): measuring again\n",
                    hw->intra_lat * 1e6, hw->p2p_lat * 1e6);
    }
    cli_error("calibrate: the communication fit stayed non-positive after 3 measurements "
              "(the host is too noisy); no profile written");
    return -1;
}

/* One round: each figure once (GEMM passes: the fastest of `iters`; steps: the fastest after the
 * first of `steps`), into v[figure]. */
static int pc_round(const pc_model *m, int ranks, const dl_gemm_log *lg, int iters, int steps,
                    double v[PC_NFIG])
{
    dl_train_result res;
    int tpR = m->cfg.heads % ranks == 0 ? ranks : 2;
    v[0] = measure_gemm(lg, 1, iters);
    v[1] = measure_gemm(lg, ranks, iters);
    v[2] = run_best(m, 1, 1, 0, steps, 1, &res) / 1e3, dl_train_result_free(&res);
    v[3] = run_best(m, ranks, 1, 0, steps, 1, &res) / 1e3, dl_train_result_free(&res);
    v[4] = run_best(m, 1, tpR, 0, steps, 1, &res) / 1e3, dl_train_result_free(&res);
    for (int i = 0; i < PC_NFIG; i++)
        if (!(v[i] > 0) || !isfinite(v[i]))
            return -1;
    return 0;
}

/* The figures of rounds 0..n-1 (v[figure][round]): the fastest of each and the noise. */
static void pc_figs_of(double v[PC_NFIG][PC_MAXROUNDS], int n, pc_figs *x)
{
    double f[PC_NFIG];
    x->noise = 0;
    for (int i = 0; i < PC_NFIG; i++) {
        f[i] = INFINITY;
        for (int r = 0; r < n; r++) f[i] = v[i][r] < f[i] ? v[i][r] : f[i];
        double med = dl__median_copy(v[i], (size_t)n), d = (med - f[i]) / f[i];
        x->noise = d > x->noise ? d : x->noise;
    }
    x->gemm1 = f[0], x->gemmR = f[1], x->step1 = f[2], x->stepR = f[3], x->steptp = f[4];
}

static void pc_report(const pc_model *m, int ranks, int rounds, int steps, const pc_figs *x,
                      const dl_plan_hw *hw, const comm_job *ar, const comm_job *pp, FILE *f)
{
    double arR;
    pc_pred p;
    dl_plan_hw h = *hw;
    pc_fit(m, ranks, x, &h, &arR, &p);
    int tpR = m->cfg.heads % ranks == 0 ? ranks : 2;
    fprintf(f,
            "# calibrate: %d cores, %d ranks at once; model L %d C %d H %d T %d, micro-batch %d\n",
            pc_cores(), ranks, m->cfg.layers, m->cfg.d_model, m->cfg.heads, m->cfg.seq,
            m->micro_batch);
    fprintf(f,
            "# every figure: the fastest of %d interleaved rounds; noise (largest median/fastest "
            "- 1 of a figure) %.1f%%\n",
            rounds, 100 * x->noise);
    fprintf(f,
            "# GEMM (the step's linear-layer shapes, %.3g GFLOP a pass): %.2f ms = %.2f GFLOP/s "
            "alone, %.2f ms = %.2f GFLOP/s per rank with %d at once (contention %.2fx)\n",
            hw->flops_alone * x->gemm1 / 1e9, x->gemm1 * 1e3, hw->flops_alone / 1e9, x->gemmR * 1e3,
            hw->flops / 1e9, ranks, x->gemmR / x->gemm1);
    if (ar) {
        fprintf(f, "# all-reduce on %d ranks (median after %d warm-ups):", ranks, WARMUPS);
        for (int s = 0; s < ar->nsizes; s++)
            fprintf(f, " %zu B %.1f us;", ar->count[s] * 4, ar->t[s] * 1e6);
        fprintf(f, "\n");
    }
    fprintf(f, "#   ring fit 2(n-1)(alpha + S/(n beta)): beta %.3g GB/s, alpha %.3g us\n",
            hw->intra_bw / 1e9, hw->intra_lat * 1e6);
    if (pp) {
        fprintf(f, "# point-to-point (ping-pong, one way, median after %d warm-ups):", WARMUPS);
        for (int s = 0; s < pp->nsizes; s++)
            fprintf(f, " %zu B %.1f us;", pp->count[s] * 4, pp->t[s] * 1e6);
        fprintf(f, "\n");
    }
    fprintf(f, "#   fit alpha + S/beta: beta %.3g GB/s, alpha %.3g us\n", hw->p2p_bw / 1e9,
            hw->p2p_lat * 1e6);
    fprintf(f,
            "# training step on 1 rank (dl_train_run, fastest after the first of %d steps): "
            "%.2f ms; its GEMMs %.2f ms, the rest %.2f ms: non-GEMM ratio %.3f\n",
            steps, x->step1 * 1e3, x->gemm1 * 1e3, (x->step1 - x->gemm1) * 1e3, hw->nongemm_ratio);
    fprintf(f,
            "# the same per rank on %d ranks at once (dp %d): %.2f ms; GEMMs %.2f ms, all-reduce "
            "%.2f ms, the rest %.2f ms: non-GEMM contention %.2fx\n",
            ranks, ranks, x->stepR * 1e3, x->gemmR * 1e3, arR * 1e3,
            (x->stepR - x->gemmR - arR) * 1e3, hw->nongemm_contention);
    double xfer = (p.tp_comm + p.small_comm) / p.ncoll;
    if (hw->sync_cost > 0)
        fprintf(f,
                "# tp %d on 1 x %d ranks: %.2f ms, the model without sync %.2f ms; %d blocking "
                "collectives a step: %.1f us each beyond their transfers (%.1f us)\n",
                tpR, tpR, x->steptp * 1e3, p.total * 1e3, p.ncoll, hw->sync_cost * 1e6, xfer * 1e6);
    else
        fprintf(f,
                "# tp %d on 1 x %d ranks: %.2f ms, the model without sync %.2f ms (%.1f%% above, "
                "within the noise): the rendezvous of its %d blocking collectives is not "
                "resolved, taken as 0 beyond their transfers (%.1f us each)\n",
                tpR, tpR, x->steptp * 1e3, p.total * 1e3, 100 * (p.total / x->steptp - 1), p.ncoll,
                xfer * 1e6);
    fprintf(f,
            "# figures (distlab-plan calibrate --figures): gemm1=%.4f,gemmR=%.4f,step1=%.4f,"
            "stepR=%.4f,steptp=%.4f,noise=%.2f,bw=%.4g,lat=%.4g,p2p_bw=%.4g,p2p_lat=%.4g\n",
            x->gemm1 * 1e3, x->gemmR * 1e3, x->step1 * 1e3, x->stepR * 1e3, x->steptp * 1e3,
            100 * x->noise, hw->intra_bw / 1e9, hw->intra_lat * 1e6, hw->p2p_bw / 1e9,
            hw->p2p_lat * 1e6);
    fprintf(f, "# pipeline hand-offs use the point-to-point figures above; no separate term\n");
}

static void pc_hw_base(int ranks, dl_plan_hw *hw)
{
    memset(hw, 0, sizeof *hw);
    snprintf(hw->name, sizeof hw->name, "this-machine");
    hw->mfu = 1.0;
    hw->ranks = ranks;
    hw->gpus_per_node = ranks;
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    hw->mem_bytes = pages > 0 && psz > 0 ? (double)pages * psz / ranks : 1e9;
}

/* Measures (rounds until the figures pass pc_check_figures: at least 3 / 5, at most twice that)
 * and fits the profile; -1 with a message when a measurement fails or the figures stay
 * implausible. Progress on stderr unless quiet; the report on f. */
static int calibrate(const pc_model *m, int ranks, int quick, int quiet, dl_plan_hw *hw, FILE *f)
{
    pc_hw_base(ranks, hw);
    uint64_t t0 = dl_now_ns();
    static dl_gemm_log lg;
    bu_model b = {m->cfg.layers, m->cfg.d_model, m->cfg.heads, m->cfg.seq, m->micro_batch};
    bu_model_gemms(&b, &lg);
    if (!quiet)
        fprintf(stderr,
                "calibrate: %d ranks; communication, then rounds of GEMM passes and "
                "training runs (1 rank, dp %d, tp %d)\n",
                ranks, ranks, m->cfg.heads % ranks == 0 ? ranks : 2);
    comm_job ar, pp;
    if (measure_comm_checked(ranks, quick, hw, &ar, &pp, quiet))
        return -1;
    hw->inter_bw = hw->intra_bw; /* one node: no second link */
    hw->inter_lat = hw->intra_lat;
    int iters = quick ? 5 : 9, steps = quick ? 10 : 30, reps = quick ? 3 : 5;
    static double v[PC_NFIG][PC_MAXROUNDS];
    double one[PC_NFIG];
    pc_figs x;
    char why[400] = "";
    int n = 0, ok = 0;
    while (n < 2 * reps && !ok) {
        if (pc_round(m, ranks, &lg, iters, steps, one)) {
            cli_error("calibrate: a measurement run failed: %s", dl_errmsg());
            return -1;
        }
        for (int i = 0; i < PC_NFIG; i++) v[i][n] = one[i];
        n++;
        if (!quiet)
            fprintf(stderr,
                    "calibrate: round %d (%d to %d): GEMM pass %.2f ms alone, %.2f ms "
                    "x%d; steps %.2f ms (1 rank), %.2f ms (dp %d), %.2f ms (tp) [%.0f s]\n",
                    n, reps, 2 * reps, one[0] * 1e3, one[1] * 1e3, ranks, one[2] * 1e3,
                    one[3] * 1e3, ranks, one[4] * 1e3, (double)(dl_now_ns() - t0) / 1e9);
        if (n < reps)
            continue;
        pc_figs_of(v, n, &x);
        ok = pc_check_figures(m, ranks, &x, hw, why, sizeof why) == 0;
        if (!ok && !quiet && n < 2 * reps)
            fprintf(stderr, "calibrate: implausible: %s; measuring another round\n", why);
    }
    if (!ok) {
        cli_error("calibrate: implausible after %d rounds: %s (the host is too noisy or busy to "
                  "calibrate now); no profile written",
                  n, why);
        return -1;
    }
    double arR;
    pc_pred p;
    pc_fit(m, ranks, &x, hw, &arR, &p);
    if (f)
        pc_report(m, ranks, n, steps, &x, hw, &ar, &pp, f);
    return 0;
}

/* --figures LIST: the figures of an earlier calibration (its report's "# figures" line: ms,
 * GB/s, us, noise in %) instead of measuring: checked and fitted alike (tests feed it
 * fabricated figures). */
static int pc_parse_figures(const char *list, pc_figs *x, dl_plan_hw *hw)
{
    static const char *const key[] = {"gemm1", "gemmR", "step1", "stepR",  "steptp",
                                      "noise", "bw",    "lat",   "p2p_bw", "p2p_lat"};
    static const double scale[] = {1e-3, 1e-3, 1e-3, 1e-3, 1e-3, 1e-2, 1e9, 1e-6, 1e9, 1e-6};
    enum { NK = sizeof key / sizeof key[0] };
    double val[NK];
    int seen[NK] = {0};
    char buf[1024], *items[64];
    int nitems, bad = cli_split_list("--figures", list, buf, sizeof buf, items, 64, &nitems);
    for (int i = 0; i < nitems && !bad; i++) {
        char *t = items[i];
        char *eq = strchr(t, '=');
        int k = -1;
        if (eq) {
            *eq = '\0';
            for (int i = 0; i < NK; i++)
                if (!strcmp(t, key[i]))
                    k = i;
        }
        if (k < 0) {
            cli_error("--figures: '%s' is not one of gemm1, gemmR, step1, stepR, steptp, noise, "
                      "bw, "
                      "lat, p2p_bw, p2p_lat =VALUE",
                      t);
            bad = 1;
        } else if (cli_parse_double("--figures", eq + 1, -1e30, 1e30, &val[k])) {
            bad = 1;
        } else {
            val[k] *= scale[k];
            seen[k] = 1;
        }
    }
    for (int i = 0; i < NK && !bad; i++)
        if (!seen[i]) {
            cli_error("--figures: %s= missing", key[i]);
            bad = 1;
        }
    if (bad)
        return -1;
    x->gemm1 = val[0], x->gemmR = val[1], x->step1 = val[2], x->stepR = val[3], x->steptp = val[4];
    x->noise = val[5];
    hw->intra_bw = hw->inter_bw = val[6], hw->intra_lat = hw->inter_lat = val[7];
    hw->p2p_bw = val[8], hw->p2p_lat = val[9];
    return 0;
}

static const char *const cal_help =
    "Usage: distlab-plan calibrate [--out FILE] [--ranks N] [--quick] [--small] [--quiet]\n"
    "                              [--figures LIST]\n"
    "\n"
    "Measures this machine with the runtime itself and writes a hardware profile\n"
    "(docs/PLANNER.md): GEMM FLOP/s per rank on the trainer's model shapes (alone and with N "
    "ranks\n"
    "at once), ring all-reduce and point-to-point bandwidth and latency on N ranks, and the\n"
    "non-GEMM share of a training step (dl_train_run on one rank). Pipelines are predicted from\n"
    "these figures and the point-to-point ones (no separate measurement). Every figure is the\n"
    "fastest of interleaved rounds (5, --quick 3) and is checked: a part never exceeds its whole,\n"
    "N ranks at once are not faster per rank than one beyond the noise, tp with its\n"
    "synchronisation does not beat the model of it without beyond the noise, every latency and\n"
    "bandwidth is positive. Implausible\n"
    "figures are measured again (up to twice the rounds), then refused: exit 1, no profile.\n"
    "Takes about 10 s a round for the default model on 2 cores; progress on stderr.\n"
    "  --out FILE      the profile (default distlab.hw; '-' for stdout)\n"
    "  --ranks N       ranks at once (default: the cores, at least 2)\n"
    "  --quick         fewer repetitions (seconds)\n"
    "  --small         a smaller model (L 2, C 64, T 32; what DISTLAB_TEST_SCALE=small tests use)\n"
    "  --quiet         no progress on stderr\n"
    "  --figures LIST  check and fit these figures instead of measuring (the report's\n"
    "                  '# figures' line: gemm1=MS,gemmR=MS,step1=MS,stepR=MS,steptp=MS,\n"
    "                  noise=PCT,bw=GBPS,lat=US,p2p_bw=GBPS,p2p_lat=US)\n";

static const char *const val_help =
    "Usage: distlab-plan validate [--hardware FILE] [--ranks N] [--quick] [--small] [--steps N]\n"
    "                             [--moe] [--quiet]\n"
    "\n"
    "Predicts distlab-train's step time and model-state memory per rank (params + grads +\n"
    "AdamW state, from the tp sharding, the pipeline stage and the ZeRO shard) for local layouts\n"
    "(dp, tp, pp with GPipe and 1F1B, ZeRO 1-3), runs them through the trainer for a few steps "
    "and\n"
    "prints predicted vs measured. Layouts with more ranks than cores are marked oversubscribed:\n"
    "the time goal (within 25%) applies to the others, the memory goal (within 2%) to all.\n"
    "Each run is reported on stderr as it ends (its step time and the error so far); each\n"
    "layout's row is printed when its last round ends. About 2 minutes for --ranks 2 on 2 cores.\n"
    "Exit status 0 when the goals hold, 1 otherwise.\n"
    "  --hardware FILE  a profile from `distlab-plan calibrate` (default: calibrate now)\n"
    "  --ranks N        largest layout (default 8; --quick 4)\n"
    "  --quick          fewer layouts and steps\n"
    "  --small          a smaller model (L 2, C 64, T 32); use the same for calibrate\n"
    "  --steps N        training steps per layout (default 30; --quick 10)\n"
    "  --moe            a mixture of experts instead (every MLP 4 experts, top-2, no capacity\n"
    "                   limit) at dp x ep (1 x 1, 2 x 1, 2 x 2, 4 x 2, 4 x 4): the planner's\n"
    "                   expert memory and all-to-all bytes (exact: nothing dropped) and time\n"
    "  --quiet          no progress on stderr\n";

typedef struct pc_args {
    const char *out, *hardware, *figures;
    int ranks, quick, small, steps, quiet, moe;
} pc_args;

static int pc_parse(int argc, char **argv, int validate, pc_args *a)
{
    memset(a, 0, sizeof *a);
    a->out = "distlab.hw";
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) {
            fputs(validate ? val_help : cal_help, stdout);
            return 1;
        } else if (!strcmp(s, "--quick"))
            a->quick = 1;
        else if (!strcmp(s, "--small"))
            a->small = 1;
        else if (!strcmp(s, "--quiet"))
            a->quiet = 1;
        else if (validate && !strcmp(s, "--moe"))
            a->moe = 1;
        else if (!strcmp(s, "--ranks") && v) {
            if (cli_parse_int("--ranks", v, 1, 64, &a->ranks))
                return -1;
            i++;
        } else if (validate && !strcmp(s, "--steps") && v) {
            if (cli_parse_int("--steps", v, 2, 100000, &a->steps))
                return -1;
            i++;
        } else if (!validate && !strcmp(s, "--out") && v)
            a->out = v, i++;
        else if (!validate && !strcmp(s, "--figures") && v)
            a->figures = v, i++;
        else if (validate && !strcmp(s, "--hardware") && v)
            a->hardware = v, i++;
        else {
            cli_error("%s: unknown or incomplete option '%s' (see --help)",
                      validate ? "validate" : "calibrate", s);
            return -1;
        }
    }
    return 0;
}

/* --figures: check and fit given figures; -1 (a message) when they are implausible */
static int calibrate_given(const pc_model *m, int ranks, const pc_figs *x, dl_plan_hw *hw, FILE *f)
{
    char why[400];
    if (pc_check_figures(m, ranks, x, hw, why, sizeof why)) {
        cli_error("calibrate: implausible figures: %s; no profile written", why);
        return -1;
    }
    double arR;
    pc_pred p;
    pc_fit(m, ranks, x, hw, &arR, &p);
    pc_report(m, ranks, 0, 0, x, hw, NULL, NULL, f);
    return 0;
}

int plan_calibrate_main(int argc, char **argv)
{
    pc_args a;
    int r = pc_parse(argc, argv, 0, &a);
    if (r)
        return r > 0 ? CLI_EXIT_OK : CLI_EXIT_USAGE;
    int cores = pc_cores();
    if (a.ranks == 0)
        a.ranks = cores < 2 ? 2 : cores;
    if (a.ranks < 2) {
        cli_error("calibrate: --ranks must be at least 2 (communication needs two ranks)");
        return CLI_EXIT_USAGE;
    }
    /* before the measurements: a minute of them must not end in "cannot write" */
    if (strcmp(a.out, "-") && cli_check_output("calibrate: --out", a.out))
        return CLI_EXIT_USAGE;
    pc_model m;
    pc_model_init(&m, a.small);
    dl_plan_hw hw;
    pc_figs given;
    pc_hw_base(a.ranks, &hw);
    if (a.figures && pc_parse_figures(a.figures, &given, &hw))
        return CLI_EXIT_USAGE;
    FILE *rep = strcmp(a.out, "-") ? stdout : stderr; /* the report stays off a profile on stdout */
    if (a.figures ? calibrate_given(&m, a.ranks, &given, &hw, rep)
                  : calibrate(&m, a.ranks, a.quick, a.quiet, &hw, rep))
        return CLI_EXIT_FAIL;
    FILE *f = strcmp(a.out, "-") ? fopen(a.out, "w") : stdout;
    if (!f) {
        cli_error("calibrate: cannot write %s", a.out);
        return CLI_EXIT_FAIL;
    }
    int st = dl_plan_hw_write(f, &hw);
    if (f != stdout && fclose(f) != 0)
        st = DL_ESYS;
    if (st != DL_OK) {
        cli_error("calibrate: writing %s failed", a.out);
        return CLI_EXIT_FAIL;
    }
    if (f != stdout)
        printf("wrote %s\n", a.out);
    return CLI_EXIT_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* validate                                                                                   */

/* One layout of validate: its prediction, and what its runs measured. */
typedef struct pc_vrow {
    pc_layout L;
    int n, failed, insample;
    pc_pred p;
    double spred, paper, best, worst, smeas0, peak0, terr;
    double a2a_meas; /* MoE: all-to-all bytes per rank per step, measured (mean of the ranks) */
    char name[40];
} pc_vrow;

/* A dp x ep layout's prediction: pc_predict_time_moe, the trainer's layout's states, and as the
 * paper column the planner's own MoE memory model (dl_plan_memory: the dense parameters on every
 * rank, E / ep experts' on each). */
static void pc_vrow_predict_moe(const dl_plan_hw *hw, const pc_model *m, int cores, pc_vrow *v)
{
    double pb[3];
    size_t P;
    pc_predict_time_moe(hw, m, &v->L, cores, &v->p);
    pc_state_predict_ep(&m->cfg, v->L.dp, v->L.ep, pb, &P);
    v->spred = pb[0] + pb[1] + pb[2];
    dl_plan_model pm;
    dl_plan_opts po;
    dl_plan_layout pl;
    dl_plan_mem mem;
    pc_plan_of(m, &v->L, &pm, &po, &pl);
    v->paper = dl_plan_memory(&pm, NULL, &po, &pl, &mem) == DL_OK ? mem.states : NAN;
    snprintf(v->name, sizeof v->name, "dp %d ep %d zero 0", v->L.dp, v->L.ep);
}

static void pc_vrow_predict(const dl_plan_hw *hw, const pc_model *m, int cores, pc_vrow *v)
{
    const pc_layout *L = &v->L;
    double pb[3];
    size_t P;
    v->n = L->dp * L->tp * L->pp;
    if (m->cfg.experts > 0) {
        pc_vrow_predict_moe(hw, m, cores, v);
    } else {
        if (L->pp > 1) {
            pc_predict_time_pp(hw, m, L, cores, &v->p);
            pc_state_predict_stage(&m->cfg, L, 0, 4, pb, &P);
        } else {
            pc_predict_time(hw, m, L->dp, L->tp, L->zero, cores, &v->p);
            pc_state_predict(&m->cfg, L->dp, L->tp, L->zero, 4, pb, &P);
        }
        v->spred = pb[0] + pb[1] + pb[2];
        /* the ZeRO paper's formula with 4-byte weights and grads and K = 8 (f32 m, v) */
        dl_plan_opts po;
        dl_plan_opts_init(&po);
        po.weight_bytes = 4, po.grad_bytes = 4, po.optim_bytes = 8;
        v->paper = dl_plan_state_bytes((double)P, &po, 1, L->dp > 1 ? L->zero : 0, L->dp);
        if (L->pp > 1) /* six words like the others: "dp1 tp1 pp2 1f1b m4 z0" */
            snprintf(v->name, sizeof v->name, "dp%d tp%d pp%d %s m%d z%d", L->dp, L->tp, L->pp,
                     L->sched == DL_SCHED_GPIPE ? "gpipe" : "1f1b", L->m, L->zero);
        else
            snprintf(v->name, sizeof v->name, "dp %d tp %d zero %d", L->dp, L->tp, L->zero);
    }
    int R = hw->ranks > 0 ? hw->ranks : 2;
    v->insample = L->zero == 0 && L->pp == 1 &&
                  ((L->dp == 1 && L->tp == 1) || (L->dp == R && L->tp == 1) ||
                   (L->dp == 1 && L->tp == (m->cfg.heads % R == 0 ? R : 2))) &&
                  m->cfg.experts == 0;
    v->best = INFINITY, v->worst = 0, v->failed = 0;
}

/* The model states of every rank of a run against the prediction (the worst error kept), and
 * rank 0's states and peak. */
static void pc_vrow_memory(const pc_model *m, const dl_train_result *res, pc_vrow *v)
{
    const pc_layout *L = &v->L;
    int per_stage = L->dp * L->tp;
    v->peak0 = 0;
    for (int rk = 0; rk < res->nranks; rk++) {
        double pb[3];
        size_t P;
        if (m->cfg.experts > 0)
            pc_state_predict_ep(&m->cfg, L->dp, L->ep, pb, &P);
        else if (L->pp > 1)
            pc_state_predict_stage(&m->cfg, L, rk / per_stage, 4, pb, NULL);
        else
            pc_state_predict(&m->cfg, L->dp, L->tp, L->zero, 4, pb, NULL);
        double spred = pb[0] + pb[1] + pb[2];
        const uint64_t *pk = res->memory.peak + (size_t)rk * DL_MEM_NCATEGORIES;
        double sm =
            (double)pk[DL_MEM_PARAMS] + (double)pk[DL_MEM_GRADS] + (double)pk[DL_MEM_OPTIMIZER];
        double e = 100.0 * (sm - spred) / spred;
        if (fabs(e) > fabs(v->worst))
            v->worst = e;
        if (rk == 0) {
            v->smeas0 = sm;
            for (int c = 0; c < DL_MEM_NCATEGORIES; c++) v->peak0 += (double)pk[c];
        }
    }
    double bytes = 0;
    for (size_t i = 0; res->moe.a2a_bytes && i < (size_t)res->nsteps * res->nranks; i++)
        bytes += res->moe.a2a_bytes[i];
    v->a2a_meas = bytes / ((double)res->nsteps * res->nranks);
}

/* The row of a finished layout; 1 when its goals hold. A MoE layout's all-to-all bytes are a
 * goal too: nothing is dropped, so the planner's formula is exact (the mean over the ranks; a
 * rank's own share varies with its routing). */
static int pc_vrow_print(pc_vrow *v)
{
    v->terr = 100.0 * (v->best - v->p.total * 1e3) / (v->p.total * 1e3);
    int tgoal = v->p.oversub || fabs(v->terr) <= 25.0, mgoal = fabs(v->worst) <= 2.0;
    double berr = v->p.a2a_bytes > 0 ? 100.0 * (v->a2a_meas - v->p.a2a_bytes) / v->p.a2a_bytes : 0;
    int bgoal = fabs(berr) <= 1e-9;
    printf("%-22s %5d %7s %6s %9.2f %9.2f %+7.1f %11.0f %11.0f %+7.2f %11.0f %11.0f %s\n", v->name,
           v->n, v->p.oversub ? "yes" : "no", v->insample ? "calib" : "new", v->p.total * 1e3,
           v->best, v->terr, v->spred, v->smeas0, v->worst, v->paper, v->peak0,
           tgoal && mgoal && bgoal ? "ok"
                                   : (!mgoal   ? "MEM"
                                      : !bgoal ? "A2A"
                                               : "TIME"));
    if (v->p.a2a_bytes > 0)
        printf("#   %s: all-to-all bytes per rank per step planner %.0f, measured %.0f (%+.2f%%); "
               "all-to-alls %.2f ms of the predicted step\n",
               v->name, v->p.a2a_bytes, v->a2a_meas, berr, v->p.a2a * 1e3);
    fflush(stdout);
    return tgoal && mgoal && bgoal;
}

static const pc_layout pc_val_layouts[] =
    {/* dp, tp, zero, pp, micro-batches (pp > 1), schedule, ep */
     {1, 1, 0, 1, 1, 0, 1},
     {2, 1, 0, 1, 1, 0, 1},
     {1, 2, 0, 1, 1, 0, 1},
     {2, 1, 1, 1, 1, 0, 1},
     {2, 1, 2, 1, 1, 0, 1},
     {2, 2, 0, 1, 1, 0, 1},
     {4, 1, 0, 1, 1, 0, 1},
     {1, 4, 0, 1, 1, 0, 1},
     {4, 1, 2, 1, 1, 0, 1},
     {2, 2, 1, 1, 1, 0, 1},
     {8, 1, 0, 1, 1, 0, 1},
     {2, 4, 0, 1, 1, 0, 1},
     {2, 1, 3, 1, 1, 0, 1},
     {4, 1, 3, 1, 1, 0, 1},
     {2, 2, 3, 1, 1, 0, 1},
     {1, 1, 0, 2, 4, DL_SCHED_1F1B, 1},
     {1, 1, 0, 2, 4, DL_SCHED_GPIPE, 1},
     {2, 1, 1, 2, 4, DL_SCHED_1F1B, 1},
     {1, 2, 0, 2, 4, DL_SCHED_1F1B, 1},
     {1, 1, 0, 4, 8, DL_SCHED_1F1B, 1},
     {2, 2, 0, 2, 4, DL_SCHED_1F1B, 1},
     {2, 1, 3, 2, 4, DL_SCHED_1F1B, 1}};
enum { PC_NVAL = sizeof pc_val_layouts / sizeof pc_val_layouts[0] };
/* validate --moe: dp x ep, ZeRO 0 (what the trainer composes with experts on this branch) */
static const pc_layout pc_moe_layouts[] = {{1, 1, 0, 1, 1, 0, 1},
                                           {2, 1, 0, 1, 1, 0, 1},
                                           {2, 1, 0, 1, 1, 0, 2},
                                           {4, 1, 0, 1, 1, 0, 2},
                                           {4, 1, 0, 1, 1, 0, 4}};
enum { PC_NMOE = sizeof pc_moe_layouts / sizeof pc_moe_layouts[0] };

int plan_validate_main(int argc, char **argv)
{
    pc_args a;
    int r = pc_parse(argc, argv, 1, &a);
    if (r)
        return r > 0 ? CLI_EXIT_OK : CLI_EXIT_USAGE;
    if (a.ranks == 0)
        a.ranks = a.quick ? 4 : 8;
    if (a.steps == 0)
        a.steps = a.quick ? 10 : 30;
    pc_model m;
    pc_model_init(&m, a.small);
    int cores = pc_cores();
    dl_plan_hw hw;
    if (a.hardware) {
        if (dl_plan_hw_load(a.hardware, &hw) != DL_OK) {
            cli_error("validate: %s", dl_errmsg());
            return CLI_EXIT_USAGE;
        }
        printf("# hardware profile %s (%s): GEMM %.2f GFLOP/s per rank (%.2f alone), ring %.3g "
               "GB/s "
               "alpha %.3g us, non-GEMM ratio %.3f\n",
               a.hardware, hw.name, hw.flops / 1e9, hw.flops_alone / 1e9, hw.intra_bw / 1e9,
               hw.intra_lat * 1e6, hw.nongemm_ratio);
    } else if (calibrate(&m, cores < 2 ? 2 : cores, a.quick, a.quiet, &hw, stdout) != 0) {
        return CLI_EXIT_FAIL;
    }
    static pc_vrow v[PC_NVAL + PC_NMOE];
    int nv = 0, nlay = a.moe ? PC_NMOE : PC_NVAL;
    if (a.moe)
        pc_model_moe(&m); /* after calibrate: the profile is the dense model's */
    for (int i = 0; i < nlay; i++) {
        const pc_layout *L = a.moe ? &pc_moe_layouts[i] : &pc_val_layouts[i];
        if (L->dp * L->tp * L->pp > a.ranks || m.cfg.heads % L->tp || L->pp > m.cfg.layers)
            continue;
        v[nv].L = *L;
        pc_vrow_predict(&hw, &m, cores, &v[nv++]);
    }
    /* interleaved rounds: a burst of background load hits one run of several layouts, not every
     * run of one layout; each layout keeps its fastest step over the rounds */
    int reps = a.quick ? 3 : 5;
    printf("# model L %d C %d H %d T %d, micro-batch %d per dp rank (global batch dp x %d), f32, "
           "%d steps per layout, fastest step of %d interleaved rounds; %d cores\n",
           m.cfg.layers, m.cfg.d_model, m.cfg.heads, m.cfg.seq, m.micro_batch, m.micro_batch,
           a.steps, reps, cores);
    if (a.moe)
        printf("# mixture of experts: every MLP %d experts (FFN %d), top-%d, no capacity limit; "
               "states_pred the trainer's layout, paper_zero the planner's MoE memory model "
               "(dense on every rank, E / ep experts on each)\n",
               m.cfg.experts, 4 * m.cfg.d_model, m.cfg.top_k);
    else
        printf("# pipeline layouts: m micro-batches of %d sequences per dp rank (global batch dp x "
               "m x %d)\n",
               m.micro_batch, m.micro_batch);
    fflush(stdout);
    if (!a.quiet)
        fprintf(stderr,
                "validate: %d layouts x %d rounds of %d steps; the table after the last round\n",
                nv, reps, a.steps);
    int tty = !a.quiet && isatty(STDERR_FILENO); /* progress redrawn in place on a terminal */
    int ok_all = 1, nrun = 0, ntime = 0;
    uint64_t t0 = dl_now_ns();
    for (int round = 0; round < reps; round++) {
        for (int i = 0; i < nv; i++) {
            pc_vrow *x = &v[i];
            if (x->failed)
                continue;
            dl_train_result res;
            double ms = run_once(&m, &x->L, a.steps, &res);
            if (!(ms > 0)) {
                printf("# %s: run failed: %s\n", x->name, dl_errmsg());
                x->failed = 1;
                ok_all = 0;
                dl_train_result_free(&res);
                continue;
            }
            if (ms < x->best)
                x->best = ms;
            if (round == 0)
                pc_vrow_memory(&m, &res, x);
            dl_train_result_free(&res);
            double e = 100.0 * (x->best - x->p.total * 1e3) / (x->p.total * 1e3);
            if (!a.quiet)
                fprintf(stderr,
                        "%svalidate: round %d/%d %-22s %2d ranks%s: %8.2f ms (fastest %.2f), "
                        "predicted %.2f ms: %+6.1f%% [%.0f s]%s",
                        tty ? "\r" : "", round + 1, reps, x->name, x->n,
                        x->p.oversub ? " (oversubscribed)" : "", ms, x->best, x->p.total * 1e3, e,
                        (double)(dl_now_ns() - t0) / 1e9, tty ? "\033[K" : "\n");
        }
    }
    if (tty)
        fputc('\n', stderr);
    printf("%-22s %5s %7s %6s %9s %9s %7s %11s %11s %7s %11s %11s %s\n", "layout", "ranks",
           "oversub", "sample", "pred_ms", "meas_ms", "err%", "states_pred", "states_meas", "err%",
           "paper_zero", "peak_meas", "ok");
    for (int i = 0; i < nv; i++)
        if (!v[i].failed) {
            ok_all &= pc_vrow_print(&v[i]);
            nrun++;
            ntime += !v[i].p.oversub;
        }
    double worst = 0;
    const char *wname = "-";
    for (int i = 0; i < nv; i++)
        if (!v[i].failed && !v[i].p.oversub && fabs(v[i].terr) > fabs(worst))
            worst = v[i].terr, wname = v[i].name;
    printf("# step time = GEMM (model shapes / GEMM rate x contention) + non-GEMM (ratio x GEMM) + "
           "ring all-reduces (dp gradients; tp 4 per layer) + sync_cost per blocking collective; "
           "pipelines: (m + p - 1) "
           "x the slowest stage's micro-batch + 2 hand-offs per slot; states and peaks in bytes "
           "per rank "
           "(rank 0; states err%% is the worst rank); sample: calib = calibrate ran this layout "
           "to fit the profile (in-sample), new = not seen by calibrate\n");
    printf("# largest step-time error within the cores: %+.1f%% (%s); within +-15%%: %s\n", worst,
           wname, fabs(worst) <= 15.0 ? "yes" : "no");
    int enough = nrun >= (a.moe ? 2 : 6);
    printf("# %d layouts, %d within the cores; goals (time +-25%% within the cores, model states "
           "+-2%% for all%s): %s\n",
           nrun, ntime, a.moe ? ", all-to-all bytes exact" : "",
           ok_all && enough ? "met" : "NOT met");
    return ok_all && enough ? CLI_EXIT_OK : CLI_EXIT_FAIL;
}

/* ---------------------------------------------------------------------------------------- */
/* search --hardware FILE (a calibrated profile): distlab-train's local layouts                */

static int pc_row_cmp(const void *a, const void *b)
{
    double x = ((const pc_local_row *)a)->tokens_per_s, y = ((const pc_local_row *)b)->tokens_per_s;
    return x > y ? -1 : x < y;
}

int pc_local_search(const dl_plan_hw *hw, const dl_gpt_config *cfg, int micro_batch, int ranks,
                    pc_local_row *rows, int cap, int *n)
{
    pc_model m = {*cfg, micro_batch};
    int cores = pc_cores(), k = 0;
    if (cores < 1)
        cores = 1;
    for (int nr = 1; nr <= ranks; nr++)
        for (int tp = 1; tp <= nr; tp++) {
            if (nr % tp || cfg->heads % tp)
                continue;
            for (int pp = 1; pp <= nr / tp; pp++) {
                if ((nr / tp) % pp || pp > cfg->layers)
                    continue;
                int dp = nr / tp / pp;
                for (int zero = 0; zero <= (dp > 1 ? 3 : 0); zero++) {
                    if (k == cap)
                        return dl_error(DL_EINVAL, "search: more than %d layouts", cap);
                    pc_layout L =
                        {dp, tp, zero, pp, pp > 1 ? 2 * pp : 1, pp > 1 ? DL_SCHED_1F1B : 0, 1};
                    pc_pred p;
                    double pb[3] = {0, 0, 0}, worst = 0;
                    if (pp > 1) {
                        pc_predict_time_pp(hw, &m, &L, cores, &p);
                        for (int st = 0; st < pp; st++) {
                            pc_state_predict_stage(cfg, &L, st, 4, pb, NULL);
                            if (pb[0] + pb[1] + pb[2] > worst)
                                worst = pb[0] + pb[1] + pb[2];
                        }
                    } else {
                        pc_predict_time(hw, &m, dp, tp, zero, cores, &p);
                        pc_state_predict(cfg, dp, tp, zero, 4, pb, NULL);
                        worst = pb[0] + pb[1] + pb[2];
                    }
                    pc_local_row *r = &rows[k++];
                    r->dp = dp, r->tp = tp, r->pp = pp, r->zero = zero, r->m = L.m;
                    r->ranks = nr;
                    r->oversub = p.oversub;
                    r->pred_ms = p.total * 1e3;
                    r->tokens_per_s = (double)dp * L.m * micro_batch * cfg->seq / p.total;
                    r->state_bytes = worst;
                }
            }
        }
    /* the batch differs between layouts (dp x m x micro-batch): order them by throughput */
    qsort(rows, (size_t)k, sizeof *rows, pc_row_cmp);
    for (int i = 0, lead = 0, tier = 0; i < k; i++) {
        if (i == 0 || rows[i].tokens_per_s < rows[lead].tokens_per_s * (1 - PC_TIE))
            lead = i, tier++;
        rows[i].tier = tier;
    }
    *n = k;
    return DL_OK;
}
