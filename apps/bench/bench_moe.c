/* distlab-bench moe: the lecture's capacity-factor trade-off (§6.3), measured. A sweep of the
 * capacity factor (0.5 ... 2.0 and no limit) trains the same MoE model at dp x ep and reports
 * per factor the drop rate, the load imbalance (most loaded expert over the mean), the step
 * time, the all-to-all bytes per rank and the time each rank waited at the combines (the
 * under-loaded experts' idle time); --plot draws them against the factor and a heat map of the
 * tokens routed to each expert over the steps. Then the MoE layer's forward at the same layout
 * by phase: router, dispatch, experts, combine, and the experts' GEMM rate against the dense
 * MLP's kernels on the same shapes, run the same way on the same ranks. */
#define _GNU_SOURCE
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "distlab.h"
#include "cli.h"
#include "bench_util.h"
#include "moe_sweep.h"
#include "core/arena.h"
#include "core/strbuf.h"
#include "model/gpt_priv.h"
#include "model/ops.h"

typedef struct mcfg {
    ms_cfg m; /* the sweep's model, layout and run (apps/common/moe_sweep.h) */
    bu_common o;
} mcfg;

static void usage(FILE *f)
{
    /* clang-format off */
    fprintf(f,
"Usage: distlab-bench moe [OPTIONS]\n"
"\n"
"Trains a mixture-of-experts model at dp x ep for each capacity factor C in 0.5, 0.75, 1, 1.25,\n"
"1.5, 2 and 0 (no limit) and prints the drop rate (choices over capacity, skipping their\n"
"expert), the load imbalance (max/mean tokens per expert, mean over steps and layers), the\n"
"median step time, the all-to-all bytes per rank per step and the wait at the combines per rank\n"
"and step (the under-loaded experts' idle time). Then the MoE layer's forward by phase at the\n"
"same layout (C 1): router, dispatch, experts, combine, and the experts' GEMM rate against the\n"
"dense MLP's kernels on the same shapes on the same ranks.\n"
"\n"
"Options:\n"
"  --dp N --ep N    the layout (default 2, 2)\n"
"  --experts E --top-k K   (default 8, 2)\n"
"  --steps N        per factor (default 6; --quick 3)\n"
"  --layers N --d-model N --seq N --batch N   the model and global batch (default 2, 128,\n"
"                   128, 16; --quick 2, 32, 32, 8)\n"
"  --quick          the small model and fewer steps\n"
"  --plot FILE      FILE.svg or FILE.png: drop rate, imbalance and idle time against C, and\n"
"                   FILE-heat.svg: tokens per expert over the steps at C 1 (gnuplot)\n"
"  -h, --help       this help\n");
    /* clang-format on */
}

/* the heat map's data: tokens routed per expert (rows) over the steps (columns), layer 0 */
static void heat_data(const dl_train_result *r, dl__strbuf *d)
{
    const dl_train_moe_result *m = &r->moe;
    for (int e = 0; e < m->experts; e++) {
        for (int s = 0; s < r->nsteps; s++)
            dl__sb_printf(d, "%s%lld", s ? " " : "",
                          (long long)m->routed[(size_t)s * m->layers * m->experts + e]);
        dl__sb_printf(d, "\n");
    }
}

#define SWEEP_SCRIPT                                                                               \
    "set title 'distlab-bench moe: the capacity factor (C 0 = no limit drawn at 2.5)'\n"           \
    "set xlabel 'capacity factor C'\nset ylabel 'drop rate, imbalance - 1'\nset y2label "          \
    "'combine wait ms / step'\nset y2tics\nset ytics nomirror\nset key top center\n"               \
    "plot datafile using ($1 > 0 ? $1 : 2.5):2 with linespoints lw 2 pt 7 title 'drop rate', "     \
    "datafile using ($1 > 0 ? $1 : 2.5):($3 - 1) with linespoints lw 2 pt 5 title "                \
    "'imbalance - 1', datafile using ($1 > 0 ? $1 : 2.5):6 axes x1y2 with linespoints lw 2 pt 9 "  \
    "title 'idle at the combine (ms)'\n"
#define HEAT_SCRIPT                                                                                \
    "set title 'distlab-bench moe: tokens routed per expert over the steps (layer 0, C 1)'\n"      \
    "set xlabel 'step - 1'\nset ylabel 'expert'\nset cblabel 'tokens'\nset view map\n"             \
    "plot datafile matrix with image notitle\n"

static int plots(const mcfg *c, const ms_row *rows, const dl_train_result *heat)
{

    char *dat = NULL, *hd = NULL, file[4096];
    dl__strbuf d = {0}, h = {0};
    for (int i = 0; i < MS_NF; i++)
        dl__sb_printf(&d, "%g %.6f %.4f %.3f %.0f %.4f\n", rows[i].cap, rows[i].drop, rows[i].imb,
                      rows[i].ms, rows[i].bytes, rows[i].wait_ms);
    heat_data(heat, &h);
    if (dl__sb_finish(&d, &dat, "--plot") || dl__sb_finish(&h, &hd, "--plot"))
        return -1;
    const char *dot = strrchr(c->o.plot, '.');
    snprintf(file, sizeof file, "%.*s-heat%s", (int)(dot - c->o.plot), c->o.plot, dot);
    int bad = bu_plot_to(c->o.plot, dat, SWEEP_SCRIPT, stdout) != 0 ||
              bu_plot_to(file, hd, HEAT_SCRIPT, stdout) != 0;
    free(dat), free(hd);
    return bad ? -1 : 0;
}

/* ---- the MoE layer's forward by phase, and the dense MLP's kernels on the same shapes ---- */

typedef struct phase_run {
    const ms_cfg *c;
    double norm, router, dispatch, expert, combine, flop, a2a, wait; /* over ranks, layers */
    double dense_s, dense_flop;
} phase_run;

/* the dense MLP's kernels (linear, GeLU, linear) on `rows` rows of the experts' shapes */
static double dense_seconds(int rows, int C, int F, int reps)
{
    size_t n = (size_t)(rows ? rows : 1);
    float *x = calloc(n * C, 4), *h = calloc(n * F, 4), *a = calloc(n * F, 4),
          *y = calloc(n * C, 4);
    float *w1 = calloc((size_t)F * C, 4), *w2 = calloc((size_t)F * C, 4), *b1 = calloc(F, 4),
          *b2 = calloc(C, 4);
    double t = 0;
    if (x && h && a && y && w1 && w2 && b1 && b2) {
        for (size_t i = 0; i < n * C; i++) x[i] = (float)((i % 17) * 0.01);
        for (size_t i = 0; i < (size_t)F * C; i++) w1[i] = w2[i] = (float)((i % 13) * 0.001);
        uint64_t t0 = 0;
        for (int r = -1; r < reps; r++) { /* one untimed pass first: pages touched, caches warm */
            if (r == 0)
                t0 = dl_now_ns();
            dl_linear_fwd_f32(h, x, w1, b1, rows, C, F);
            dl_gelu_fwd_deriv_f32(a, h, h, n * F);
            dl_linear_fwd_f32(y, a, w2, b2, rows, F, C);
        }
        t = (double)(dl_now_ns() - t0) / 1e9;
    }
    free(x), free(h), free(a), free(y), free(w1), free(w2), free(b1), free(b2);
    return t;
}

static int phase_rank(dl_ctx *x, void *arg)
{
    phase_run *p = arg;
    const ms_cfg *c = p->c;
    dl_gpt_config cfg = {.vocab = 256,
                         .seq = c->seq,
                         .layers = c->layers,
                         .d_model = c->d_model,
                         .heads = 4,
                         .experts = c->experts,
                         .top_k = c->top_k,
                         .moe_every = 1,
                         .capacity = 1.0,
                         .aux_loss = 0.01};
    int B = c->batch / c->dp, T = c->seq, rc, reps = 8;
    dl_gpt_opts o = {.cfg = cfg,
                     .dtype = DL_F32,
                     .micro_batch = B,
                     .tp = 1,
                     .seed = 1,
                     .arena = dl_ctx_arena(x),
                     .ep = c->ep,
                     .ep_comm = dl_ctx_comm(x)};
    dl_gpt *g;
    if ((rc = dl_gpt_create(&o, &g)))
        return rc;
    int *in = malloc(sizeof(int) * (size_t)B * T);
    for (int i = 0; in && i < B * T; i++) in[i] = (i * 131 + dl_ctx_rank(x) * 7) % 256;
    double loss;
    for (int i = 0; i < dl_gpt_moe_layers(g); i++) /* the wait for the other ranks timed apart */
        dl_gpt_moe_stats(g, i)->split_wait = 1;
    for (int r = 0; in && r <= reps && rc == DL_OK; r++) {
        if (r == 1)
            dl_gpt_moe_reset(g); /* the first forward warms up */
        rc = dl_gpt_forward(g, in, in, B, &loss);
    }
    double rows = 0;
    for (int i = 0; rc == DL_OK && i < dl_gpt_moe_layers(g); i++) {
        const dl_moe_stats *s = dl_gpt_moe_stats(g, i);
        double me[8] = {s->router_ns / 1e9,    s->dispatch_ns / 1e9, s->expert_ns / 1e9,
                        s->combine_ns / 1e9,   s->expert_flop,       s->a2a_ns / 1e9,
                        s->peer_wait_ns / 1e9, s->norm_ns / 1e9};
        rows += s->expert_flop / (4.0 * c->d_model * 4 * c->d_model) / reps;
        if ((rc = dl_allreduce(dl_ctx_comm(x), me, me, 8, DL_F64, DL_SUM, DL_PURPOSE_OTHER)))
            break;
        if (dl_ctx_rank(x) == 0)
            p->router += me[0], p->dispatch += me[1], p->expert += me[2], p->combine += me[3],
                p->flop += me[4], p->a2a += me[5], p->wait += me[6], p->norm += me[7];
    }
    /* the dense kernels on this rank's expert rows, all ranks at once as the experts ran */
    double d[2] = {0, 0};
    if (rc == DL_OK && (rc = dl_barrier(dl_ctx_comm(x))) == DL_OK) {
        int per = (int)(rows / dl_gpt_moe_layers(g) / (c->experts / c->ep) + 0.5);
        for (int i = 0; i < dl_gpt_moe_layers(g) * (c->experts / c->ep); i++)
            d[0] += dense_seconds(per, c->d_model, 4 * c->d_model, reps);
        d[1] = 4.0 * per * c->d_model * 4 * c->d_model * reps * dl_gpt_moe_layers(g) *
               (c->experts / c->ep);
        rc = dl_allreduce(dl_ctx_comm(x), d, d, 2, DL_F64, DL_SUM, DL_PURPOSE_OTHER);
    }
    if (rc == DL_OK && dl_ctx_rank(x) == 0)
        p->dense_s = d[0], p->dense_flop = d[1];
    free(in);
    dl_gpt_destroy(g);
    return rc;
}

static int phases(const ms_cfg *c)
{
    phase_run p = {.c = c};
    dl_world_opts w;
    dl_world_opts_init(&w);
    w.nranks = c->dp; /* the ep group is the whole world here (dp = ep) or its first part */
    if (c->dp != c->ep) {
        printf("(phases: measured at dp = ep = %d only)\n", c->dp);
        return 0;
    }
    if (dl_world_run(&w, phase_rank, &p) != DL_OK) {
        cli_error("moe: %s", dl_errmsg());
        return -1;
    }
    double rdc = p.router + p.dispatch + p.combine, all = p.norm + rdc + p.expert + p.wait;
    double er = p.flop / p.expert / 1e9, dr = p.dense_flop / p.dense_s / 1e9;
    printf("MoE layer forward at dp %d x ep %d (f32, C 1, summed over ranks and layers): ln_2 "
           "%.1f%% (as the dense MLP's), router %.1f%%, dispatch %.1f%%, experts %.1f%%, combine "
           "%.1f%% (of which the all-to-alls' "
           "transfers %.1f%%), waiting for the other ranks at the all-to-alls %.1f%% (the ranks' "
           "load imbalance: a barrier before each all-to-all times it apart)\n",
           c->dp, c->ep, 100 * p.norm / all, 100 * p.router / all, 100 * p.dispatch / all,
           100 * p.expert / all, 100 * p.combine / all, 100 * p.a2a / all, 100 * p.wait / all);
    printf("router+dispatch+combine: %.1f%% of the layer (goal < 10%%), %.1f%% with the waits for "
           "the other ranks\n",
           100 * rdc / all, 100 * (rdc + p.wait) / all);
    printf("expert GEMMs %.2f GFLOP/s per rank vs the dense MLP's kernels on the same shapes "
           "%.2f GFLOP/s: %.0f%%\n",
           er / c->dp, dr / c->dp, 100 * er / dr);
    return 0;
}

int bench_moe_main(int argc, char **argv)
{
    mcfg mc = {.m = {.dp = 2, .ep = 2, .experts = 8, .top_k = 2}};
    ms_cfg *c = &mc.m;
    int quick = 0, opt;
    enum { O_DP = 256, O_EP, O_E, O_K, O_STEPS, O_LAYERS, O_DMODEL, O_SEQ, O_BATCH };
    static const struct option lo[] = {{"dp", required_argument, NULL, O_DP},
                                       {"ep", required_argument, NULL, O_EP},
                                       {"experts", required_argument, NULL, O_E},
                                       {"top-k", required_argument, NULL, O_K},
                                       {"steps", required_argument, NULL, O_STEPS},
                                       {"layers", required_argument, NULL, O_LAYERS},
                                       {"d-model", required_argument, NULL, O_DMODEL},
                                       {"seq", required_argument, NULL, O_SEQ},
                                       {"batch", required_argument, NULL, O_BATCH},
                                       BU_LONGOPTS_END};
    int *dst[] = {&c->dp,     &c->ep,      &c->experts, &c->top_k, &c->steps,
                  &c->layers, &c->d_model, &c->seq,     &c->batch};
    const char *names[] = {"--dp",     "--ep",      "--experts", "--top-k", "--steps",
                           "--layers", "--d-model", "--seq",     "--batch"};
    BU_FOR_EACH_OPT(opt, "moe", argc, argv, lo, &mc.o, usage)
    {
        if (opt >= O_DP && opt <= O_BATCH &&
            cli_parse_int(names[opt - O_DP], optarg, 1, 1 << 16, dst[opt - O_DP]))
            return CLI_EXIT_USAGE;
    }
    if (opt < 0 || (mc.o.plot && bu_plot_check(mc.o.plot)))
        return CLI_EXIT_USAGE;
    quick = mc.o.quick;
    c->steps = c->steps ? c->steps : quick ? 3 : 6;
    c->layers = c->layers ? c->layers : 2;
    c->d_model = c->d_model ? c->d_model : quick ? 32 : 128;
    c->seq = c->seq ? c->seq : quick ? 32 : 128;
    c->batch = c->batch ? c->batch : quick ? 8 : 16;
    dl_train_opts probe = ms_train_opts(c, 1.0);
    if (dl_train_resolve(&probe, c->dp)) {
        cli_error("moe: %s", dl_errmsg());
        return CLI_EXIT_USAGE;
    }
    printf("distlab-bench moe: dp %d x ep %d, %d experts, top-%d, %d layers of d-model %d, seq "
           "%d, global batch %d, %d steps per factor, f32 (a shared, loaded machine: timings "
           "are indicative)\n",
           c->dp, c->ep, c->experts, c->top_k, c->layers, c->d_model, c->seq, c->batch, c->steps);
    printf("%8s %10s %10s %10s %14s %16s\n", "C", "drop rate", "imbalance", "ms/step",
           "a2a MiB/rank", "idle ms/rank");
    ms_row rows[MS_NF];
    dl_train_result heat;
    int have_heat = 0, status = CLI_EXIT_OK;
    for (int i = 0; i < MS_NF && status == CLI_EXIT_OK; i++) {
        dl_train_result r;
        if (ms_run(c, ms_factors[i], &rows[i], &r) != DL_OK) {
            cli_error("moe: C %g: %s", ms_factors[i], dl_errmsg());
            status = CLI_EXIT_FAIL;
            break;
        }
        char lab[16];
        ms_label(ms_factors[i], lab, sizeof lab);
        printf("%8s %10.4f %10.3f %10.2f %14.4f %16.3f\n", lab, rows[i].drop, rows[i].imb,
               rows[i].ms, rows[i].bytes / 1048576.0, rows[i].wait_ms);
        if (ms_factors[i] == 1.0)
            heat = r, have_heat = 1;
        else
            dl_train_result_free(&r);
    }
    if (status == CLI_EXIT_OK && mc.o.plot && have_heat && plots(&mc, rows, &heat))
        status = CLI_EXIT_FAIL;
    if (have_heat)
        dl_train_result_free(&heat);
    if (status == CLI_EXIT_OK && phases(c))
        status = CLI_EXIT_FAIL;
    return status;
}
