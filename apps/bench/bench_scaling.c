/* distlab-bench scaling: the trainer's strong scaling (fixed global batch) and weak scaling
 * (fixed batch per data-parallel rank) for data, tensor and pipeline parallelism, from 1 rank up
 * to the machine's PUs and beyond (marked oversubscribed): tokens/s, speed-up over one rank,
 * efficiency, the bytes each rank sends per step, and where rank 0's step went (from the trace:
 * compute, communication, waiting for hand-offs, the rest idle or bubble). */
#define _GNU_SOURCE
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "distlab.h"
#include "core/topo.h"
#include "cli.h"
#include "bench_util.h"
#include "core/stats.h"

typedef struct scfg {
    int ranks, steps, seqs, oversub;
    bu_model m;
    bu_common o;
} scfg;

static void usage(FILE *f)
{
    /* clang-format off */
    fprintf(f,
"Usage: distlab-bench scaling [OPTIONS]\n"
"\n"
"Trains the benchmark model for a few steps in each layout and reports tokens/s, speed-up over\n"
"one rank and efficiency (speed-up / ranks):\n"
"  strong dp: a fixed global batch (--seqs x the most ranks) split over 1, 2, 4 ... ranks;\n"
"  weak dp:   --seqs sequences per rank, so the global batch grows with the ranks;\n"
"  strong tp: the --seqs x the most ranks sequences on a model split over 1, 2, 4 ... ranks\n"
"             (up to the head count). Weak scaling of tp would grow the model: not measured.\n"
"  strong pp: the same batch as micro-batches of --seqs through 1, 2, 4 ... stages (1F1B,\n"
"             up to the layer count). Weak pp would grow the model too: not measured.\n"
"Ranks beyond the machine's PUs (--oversubscribe) are marked; their timings include\n"
"contention by construction. The bytes are what each rank sends per step (dp gradients, tp\n"
"activations, pp hand-offs). Where rank 0's step went comes from the trace (median step):\n"
"compute (inside forward and backward), comm (collectives and posting hand-offs), wait\n"
"(receiving hand-offs), idle (the rest: the pipeline's bubble, the optimizer, dispatch); a\n"
"pipeline's step is the engine's span (its gradient reduction and optimizer come after it).\n"
"\n"
"Options:\n"
"  --ranks N        most ranks that fit (default: the machine's PUs)\n"
"  --oversubscribe  also run 2N ranks\n"
"  --all            the standard set (docs/SCALING.md): every series from 1 rank to the\n"
"                   machine's PUs and then 2x, as --oversubscribe; the same command on a\n"
"                   many-core server gives the same tables\n"
"  --steps N        steps per layout, median step after the first (default 8; --quick 4)\n"
"  --seqs N         sequences per rank (default 8; --quick 2)\n"
"  --layers N --d-model N --heads N --seq N   the model (default 4, 256, 4, 128; --quick 2, 64,\n"
"                   4, 32)\n"
"  --quick          the small model and fewer steps\n"
"  --csv            CSV rows (machine facts as leading '#' lines)\n"
"  --json           JSON Lines: config, one row per layout, summary (schema distlab/1)\n"
"  --plot FILE      FILE.svg or FILE.png: speed-up and efficiency against ranks (gnuplot)\n"
"  -h, --help       this help\n");
    /* clang-format on */
}

/* Two panels, speed-up and efficiency, one colour per series in both (the key in the second);
 * the ideal as a grey line; an open circle around every oversubscribed point (column 4). */
#define SERIES(i, name, colour)                                                                    \
    "datafile index " #i " using 1:(column(COL)) with linespoints lw 2 pt 7 lc rgb '" colour       \
    "' title '" name "'"
#define SERIES_ALL(more)                                                                           \
    SERIES(0, "strong dp", "#1f77b4")                                                              \
    ", " SERIES(1, "weak dp", "#2ca02c") ", " SERIES(2, "strong tp", "#d62728") ", " SERIES(       \
        3, "strong pp", "#9467bd") ", "                                                            \
                                   "for [i=0:3] datafile index i using 1:($4 > 0 ? column(COL) : " \
                                   "1/0) with points pt 6 ps 2.2 "                                 \
                                   "lc rgb 'black' title (i == 0 ? 'oversubscribed' : '')" more
#define PLOT_SCRIPT                                                                                \
    "set multiplot layout 1,2 title 'distlab-bench scaling: the trainer (rank threads on this "    \
    "machine)'\n"                                                                                  \
    "set logscale x 2\nset xrange [0.9:*]\nset offsets 0, graph 0.05, 0, 0\nset xlabel 'ranks'\n"  \
    "set ylabel 'speed-up over one rank'\nset yrange [0:*]\nCOL = 2\nunset key\n"                  \
    "plot " SERIES_ALL(                                                                            \
        ", x with lines dt 2 lc rgb 'grey50' notitle") "\n"                                        \
                                                       "set ylabel 'efficiency (speed-up / "       \
                                                       "ranks)'\nset yrange [0:1.1]\nCOL = 3\n"    \
                                                       "set key inside bottom left box opaque "    \
                                                       "font ',10'\n"                              \
                                                       "plot " SERIES_ALL(                         \
                                                           ", 1 with lines dt 2 lc rgb 'grey50' "  \
                                                           "title 'ideal'") "\n"                   \
                                                                            "unset multiplot\n"


static int parse(int argc, char **argv, scfg *c)
{
    enum { O_RANKS = 256, O_OVER, O_STEPS, O_SEQS, O_LAYERS, O_DMODEL, O_HEADS, O_SEQ };
    static const struct option lo[] = {{"ranks", required_argument, NULL, O_RANKS},
                                       {"oversubscribe", no_argument, NULL, O_OVER},
                                       {"all", no_argument, NULL, O_OVER},
                                       {"steps", required_argument, NULL, O_STEPS},
                                       {"seqs", required_argument, NULL, O_SEQS},
                                       {"layers", required_argument, NULL, O_LAYERS},
                                       {"d-model", required_argument, NULL, O_DMODEL},
                                       {"heads", required_argument, NULL, O_HEADS},
                                       {"seq", required_argument, NULL, O_SEQ},
                                       BU_LONGOPTS_END};
    int layers = 0, dmodel = 0, heads = 0, seq = 0;
    int opt;
    BU_FOR_EACH_OPT(opt, "scaling", argc, argv, lo, &c->o, usage)
    {
        switch (opt) {
        case O_RANKS:
            if (cli_parse_int("--ranks", optarg, 1, 256, &c->ranks))
                return -1;
            break;
        case O_OVER: c->oversub = 1; break;
        case O_STEPS:
            if (cli_parse_int("--steps", optarg, 2, 100000, &c->steps))
                return -1;
            break;
        case O_SEQS:
            if (cli_parse_int("--seqs", optarg, 1, 1 << 16, &c->seqs))
                return -1;
            break;
        case O_LAYERS:
            if (cli_parse_int("--layers", optarg, 1, 4096, &layers))
                return -1;
            break;
        case O_DMODEL:
            if (cli_parse_int("--d-model", optarg, 1, 1 << 16, &dmodel))
                return -1;
            break;
        case O_HEADS:
            if (cli_parse_int("--heads", optarg, 1, 4096, &heads))
                return -1;
            break;
        case O_SEQ:
            if (cli_parse_int("--seq", optarg, 1, 1 << 16, &seq))
                return -1;
            break;
        }
    }
    if (opt < 0)
        return -1;
    c->m.layers = layers ? layers : c->o.quick ? 2 : 4;
    c->m.d_model = dmodel ? dmodel : c->o.quick ? 64 : 256;
    c->m.heads = heads ? heads : 4;
    c->m.seq = seq ? seq : c->o.quick ? 32 : 128;
    if (!c->steps)
        c->steps = c->o.quick ? 4 : 8;
    if (!c->seqs)
        c->seqs = c->o.quick ? 2 : 8;
    dl_gpt_config g;
    dl_gpt_config_default(&g);
    g.layers = c->m.layers, g.d_model = c->m.d_model, g.heads = c->m.heads, g.seq = c->m.seq;
    if (dl_gpt_config_check(&g, 1)) {
        cli_error("scaling: %s", dl_errmsg());
        return -1;
    }
    return 0;
}

typedef struct point {
    const char *mode, *par;
    int ranks, dp, tp, pp, global, over;
    double tps, ms, speedup, eff, grad_bytes, act_bytes;
    double compute, comm, wait, idle; /* fractions of rank 0's median traced step */
    double bubble;                    /* pp: measured total bubble */
} point;


/* Each instant of a step's window goes to one class, the most specific event covering it:
 * communication (a collective, posting a hand-off) over waiting for a hand-off over compute
 * (forward, backward) over idle. (A blocking gradient all-reduce runs inside the backward: it
 * counts as communication, not compute.) */
enum { C_COMPUTE, C_COMM, C_WAIT, C_IDLE };

static int class_of(int kind)
{
    switch (kind) {
    case DL_TR_COMM:
    case DL_TR_SEND: return 3;
    case DL_TR_RECV_WAIT: return 2;
    case DL_TR_FWD:
    case DL_TR_BWD:
    case DL_TR_WGT: return 1;
    default: return 0;
    }
}

static int step_fractions(const dl_trace *t, int rank, int step, double frac[4])
{
    const dl_trace_event *ev = dl_trace_events(t, rank);
    size_t n = dl_trace_count(t, rank);
    uint64_t w0 = 0, w1 = 0;
    for (size_t i = 0; i < n; i++)
        if (ev[i].kind == DL_TR_STEP && ev[i].step == step)
            w0 = ev[i].t0, w1 = ev[i].t1;
    if (w1 <= w0)
        return -1;
    /* the window's boundaries: its ends and every event end inside it */
    uint64_t *b = malloc(sizeof(uint64_t) * (2 * n + 2));
    if (!b)
        return -1;
    size_t nb = 0;
    b[nb++] = w0, b[nb++] = w1;
    for (size_t i = 0; i < n; i++) {
        if (ev[i].t0 > w0 && ev[i].t0 < w1)
            b[nb++] = ev[i].t0;
        if (ev[i].t1 > w0 && ev[i].t1 < w1)
            b[nb++] = ev[i].t1;
    }
    for (size_t i = 1; i < nb; i++) /* insertion sort: a step has few events */
        for (size_t j = i; j > 0 && b[j - 1] > b[j]; j--) {
            uint64_t x = b[j];
            b[j] = b[j - 1], b[j - 1] = x;
        }
    double acc[4] = {0, 0, 0, 0};
    for (size_t k = 0; k + 1 < nb; k++) {
        uint64_t a = b[k], e = b[k + 1];
        if (e <= a)
            continue;
        int best = 0;
        for (size_t i = 0; i < n; i++)
            if (ev[i].kind != DL_TR_STEP && ev[i].t0 <= a && ev[i].t1 >= e) {
                int c = class_of(ev[i].kind);
                if (c > best)
                    best = c;
            }
        static const int to[4] = {C_IDLE, C_COMPUTE, C_WAIT, C_COMM};
        acc[to[best]] += (double)(e - a);
    }
    free(b);
    for (int k = 0; k < 4; k++) frac[k] = acc[k] / (double)(w1 - w0);
    return 0;
}

/* Rank 0's step, median over the steps after the first. */
static void breakdown(const dl_trace *t, int steps, point *p)
{
    double f[4][64];
    int n = 0;
    for (int st = 2; st <= steps && n < 64; st++) {
        double fr[4];
        if (step_fractions(t, 0, st, fr) != 0)
            continue;
        for (int k = 0; k < 4; k++) f[k][n] = fr[k];
        n++;
    }
    double *out[4] = {&p->compute, &p->comm, &p->wait, &p->idle};
    for (int k = 0; k < 4; k++) {
        if (!n) {
            *out[k] = NAN;
            continue;
        }
        *out[k] = dl__median(f[k], (size_t)n);
    }
}

static int run_point(const scfg *c, point *p)
{
    dl_train_opts o;
    dl_train_opts_init(&o);
    o.model.layers = c->m.layers;
    o.model.d_model = c->m.d_model;
    o.model.heads = c->m.heads;
    o.model.seq = c->m.seq;
    o.layout.dp = p->dp;
    o.layout.tp = p->tp;
    o.layout.pp = p->pp;
    o.batch.global = p->global;
    if (p->pp > 1) { /* micro-batches of --seqs sequences through the stages */
        o.pipeline.schedule = DL_SCHED_1F1B;
        o.batch.micro = c->seqs;
        o.batch.microbatches = p->global / (p->dp * c->seqs);
    } else {
        o.batch.micro = p->global / p->dp;
        o.batch.microbatches = 1;
    }
    o.optim.steps = c->steps;
    o.optim.warmup = 1;
    o.eval.windows = 1;
    o.output.log_every = 0;
    dl_trace *t = NULL;
    int n = p->dp * p->tp * p->pp;
    int rc =
        dl_trace_create(n, (size_t)(c->steps + 1) * ((size_t)o.batch.microbatches * 8 + 16), &t);
    if (rc)
        return rc;
    o.trace.into = t;
    dl_train_result r;
    rc = dl_train_run(&o, &r);
    if (rc == DL_OK) {
        p->tps = r.speed.tokens_per_s;
        p->ms = r.speed.ms_per_step;
        p->grad_bytes = r.comm.dp_grads;
        p->act_bytes = r.comm.tp_activations + r.pipeline.bytes_per_step;
        p->bubble = p->pp > 1 ? r.pipeline.bubble_total : NAN;
        breakdown(t, r.nsteps, p);
    }
    dl_train_result_free(&r);
    dl_trace_destroy(t);
    return rc;
}

static void print_point(FILE *f, const scfg *c, const point *p)
{
    if (c->o.json) {
        bu_json_begin(f, "scaling", "row");
        bu_json_str(f, "mode", p->mode);
        bu_json_str(f, "par", p->par);
        bu_json_int(f, "ranks", p->ranks);
        bu_json_int(f, "dp", p->dp);
        bu_json_int(f, "tp", p->tp);
        bu_json_int(f, "pp", p->pp);
        bu_json_bool(f, "oversubscribed", p->over);
        bu_json_int(f, "global_batch", p->global);
        bu_json_num(f, "tokens_per_s", p->tps);
        bu_json_num(f, "ms_per_step", p->ms);
        bu_json_num(f, "speedup", p->speedup);
        bu_json_num(f, "efficiency", p->eff);
        bu_json_num(f, "dp_grad_bytes_per_rank_per_step", p->grad_bytes);
        bu_json_num(f, "tp_act_bytes_per_rank_per_step", p->act_bytes);
        bu_json_num(f, "compute_fraction", p->compute);
        bu_json_num(f, "comm_fraction", p->comm);
        bu_json_num(f, "wait_fraction", p->wait);
        bu_json_num(f, "idle_fraction", p->idle);
        bu_json_num(f, "pp_bubble", p->bubble);
        bu_json_end(f);
    } else if (c->o.csv) {
        fprintf(f, "%s,%s,%d,%d,%d,%d,%d,%d,%.1f,%.3f,%.4f,%.4f,%.0f,%.0f,%.4f,%.4f,%.4f,%.4f\n",
                p->mode, p->par, p->ranks, p->dp, p->tp, p->pp, p->over, p->global, p->tps, p->ms,
                p->speedup, p->eff, p->grad_bytes, p->act_bytes, p->compute, p->comm, p->wait,
                p->idle);
    } else {
        fprintf(f,
                "  %-6s %-3s %5d %7d %10.0f %9.1f %8.2fx %6.0f%% %10.2f %10.2f %5.0f%% %5.0f%% "
                "%5.0f%% %5.0f%%%s\n",
                p->mode, p->par, p->ranks, p->global, p->tps, p->ms, p->speedup, 100 * p->eff,
                p->grad_bytes / 1e6, p->act_bytes / 1e6, 100 * p->compute, 100 * p->comm,
                100 * p->wait, 100 * p->idle, p->over ? "  (oversubscribed)" : "");
    }
    fflush(f);
}

int bench_scaling_main(int argc, char **argv)
{
    scfg c;
    memset(&c, 0, sizeof c);
    if (parse(argc, argv, &c))
        return CLI_EXIT_USAGE;
    dl_topo *topo = bu_topo_load("scaling");
    if (topo == NULL)
        return CLI_EXIT_FAIL;
    int pus = dl_topo_real_pus(topo);
    if (!c.ranks)
        c.ranks = pus;
    int most = c.oversub ? 2 * c.ranks : c.ranks;
    FILE *f = stdout;
    if (c.o.json) {
        bu_json_begin(f, "scaling", "config");
        bu_machine_json(f, topo);
        bu_json_int(f, "ranks", c.ranks);
        bu_json_bool(f, "oversubscribe", c.oversub);
        bu_json_int(f, "steps", c.steps);
        bu_json_int(f, "seqs_per_rank", c.seqs);
        bu_json_int(f, "layers", c.m.layers);
        bu_json_int(f, "d_model", c.m.d_model);
        bu_json_int(f, "heads", c.m.heads);
        bu_json_int(f, "seq", c.m.seq);
        bu_json_end(f);
    } else {
        bu_machine_text(f, topo);
        fprintf(f,
                "# scaling: model %d layers, d-model %d, %d heads, seq %d, f32; %d steps per "
                "layout (median after the first); %d sequences per rank\n",
                c.m.layers, c.m.d_model, c.m.heads, c.m.seq, c.steps, c.seqs);
        if (c.o.csv)
            fprintf(f,
                    "mode,par,ranks,dp,tp,pp,oversubscribed,global_batch,tokens_per_s,ms_per_step,"
                    "speedup,efficiency,dp_grad_bytes,act_bytes,compute,comm,wait,idle\n");
        else
            fprintf(f, "# %-6s %-3s %5s %7s %10s %9s %9s %7s %10s %10s %6s %6s %6s %6s\n", "mode",
                    "par", "ranks", "batch", "tokens/s", "ms/step", "speed-up", "effic.",
                    "dp MB/step", "act MB/step", "comp", "comm", "wait", "idle");
    }
    int status = CLI_EXIT_OK, rows = 0;
    double best_eff_fit = 0;
    char *dat = NULL;
    size_t datlen = 0;
    FILE *df = c.o.plot ? open_memstream(&dat, &datlen) : NULL;
    /* strong dp, weak dp, strong tp, strong pp: ranks 1, 2, 4, ... up to `most` */
    static const char *const mode[4] = {"strong", "weak", "strong", "strong"};
    static const char *const par[4] = {"dp", "dp", "tp", "pp"};
    for (int kind = 0; kind < 4 && status == CLI_EXIT_OK; kind++) {
        double base = 0;
        if (df)
            fprintf(df, "%s# %s %s: ranks speedup efficiency oversubscribed\n", kind ? "\n\n" : "",
                    mode[kind], par[kind]);
        for (int n = 1; n <= most && status == CLI_EXIT_OK; n *= 2) {
            point p = {.mode = mode[kind], .par = par[kind], .ranks = n, .over = n > pus};
            p.dp = kind < 2 ? n : 1;
            p.tp = kind == 2 ? n : 1;
            p.pp = kind == 3 ? n : 1;
            if (kind == 2 && c.m.heads % n)
                break; /* tp must divide the heads */
            if (kind == 3 && n > c.m.layers)
                break; /* a stage needs a layer */
            p.global = kind == 1 ? c.seqs * n : c.seqs * most;
            if (kind < 2 && p.global % n)
                continue;
            if (run_point(&c, &p) != DL_OK) {
                cli_error("scaling: %s %s on %d ranks: %s", p.mode, p.par, n, dl_errmsg());
                status = CLI_EXIT_FAIL;
                break;
            }
            if (n == 1)
                base = p.tps;
            p.speedup = base > 0 ? p.tps / base : NAN;
            p.eff = p.speedup / n;
            if (!p.over && n > 1 && p.eff > best_eff_fit)
                best_eff_fit = p.eff;
            print_point(f, &c, &p);
            if (df)
                fprintf(df, "%d %.6g %.6g %d\n", n, p.speedup, p.eff, p.over);
            rows++;
        }
    }
    if (c.o.json) {
        bu_json_begin(f, "scaling", "summary");
        bu_json_int(f, "rows", rows);
        bu_json_num(f, "best_efficiency_fitting", best_eff_fit);
        bu_json_str(f, "status", status == CLI_EXIT_OK ? "ok" : "failed");
        bu_json_end(f);
    }
    if (df) {
        fclose(df);
        if (status == CLI_EXIT_OK && bu_plot(c.o.plot, dat, PLOT_SCRIPT) != 0)
            status = CLI_EXIT_FAIL;
        free(dat);
    }
    dl_topo_destroy(topo);
    return status;
}
