/* distlab-bench gemm: GEMM FLOP/s per rank for the benchmark model's linear-layer shapes with
 * 1, 2, ... N pinned ranks running at once, so that the slowdown each rank suffers from shared
 * caches and memory bandwidth is a number: contention factor = alone / together.
 *
 * Every rank replays the same GEMM pass (the forward and both backward GEMMs of every linear
 * layer of one training step, bu_model_gemms); passes start together after a barrier so that
 * the ranks really run at the same time, and each rank's pass time is the median over passes. */
#define _GNU_SOURCE
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "distlab.h"
#include "core/topo.h"
#include "model/ops.h"
#include "cli.h"
#include "bench_util.h"
#include "core/stats.h"

typedef struct gcfg {
    int ranks, iters;
    bu_model m;
    bu_common o;
} gcfg;

typedef struct gshared {
    const dl_gemm_log *log;
    int iters;
    double *t; /* [rank][iters] seconds */
} gshared;

static int rank_fn(dl_ctx *ctx, void *arg)
{
    gshared *g = arg;
    int r = dl_ctx_rank(ctx), rc = DL_OK;
    dl_comm *comm = dl_ctx_comm(ctx);
    bu_gemm_bufs b;
    if (bu_gemm_alloc(g->log, &b) != 0)
        return DL_ENOMEM;
    bu_gemm_run(g->log, &b); /* warm-up: page faults, OpenBLAS buffers */
    for (int it = 0; it < g->iters && rc == DL_OK; it++) {
        rc = dl_barrier(comm); /* all ranks compute at once: that is the contention measured */
        uint64_t t0 = dl_now_ns();
        bu_gemm_run(g->log, &b);
        g->t[(size_t)r * g->iters + it] = (double)(dl_now_ns() - t0) * 1e-9;
    }
    bu_gemm_free(&b);
    return rc;
}

static void usage(FILE *f)
{
    /* clang-format off */
    fprintf(f,
"Usage: distlab-bench gemm [OPTIONS]\n"
"\n"
"GEMM FLOP/s per rank for the benchmark model's linear-layer shapes (the forward and both\n"
"backward GEMMs of qkv, attention projection, MLP fc and projection per layer, and the LM head:\n"
"what dl_linear_* runs in one training step; attention's per-head GEMMs are not included),\n"
"with 1, 2, ... N pinned ranks running the same pass at once. contention = per-rank time\n"
"together / time alone (= FLOP/s alone / FLOP/s together); efficiency = 1 / contention.\n"
"\n"
"Options:\n"
"  --ranks N        largest number of ranks (default: the machine's PUs); beyond the PUs\n"
"                   rows are marked oversubscribed\n"
"  --layers L       model layers (default 4)\n"
"  --d-model C      model width (default 256)\n"
"  --heads H        attention heads (default 4; must divide C; does not change the shapes)\n"
"  --seq T          sequence length (default 128)\n"
"  --micro-batch B  sequences per rank (default 8)\n"
"  --iters N        timed passes per rank (default 7; median)\n"
"  --quick          1 layer, 3 passes, at most 2 ranks (unless --ranks)\n"
"  --csv            CSV rows (machine facts as leading '#' lines)\n"
"  --json           JSON Lines: config, one row per rank count, summary (schema distlab/1)\n"
"  --plot FILE      FILE.svg or FILE.png: GFLOP/s per rank and contention vs ranks (gnuplot)\n"
"  -h, --help       this help\n");
    /* clang-format on */
}

static int parse(int argc, char **argv, gcfg *c)
{
    enum { O_RANKS = 256, O_LAYERS, O_DMODEL, O_HEADS, O_SEQ, O_MB, O_ITERS };
    static const struct option lo[] = {{"ranks", required_argument, NULL, O_RANKS},
                                       {"layers", required_argument, NULL, O_LAYERS},
                                       {"d-model", required_argument, NULL, O_DMODEL},
                                       {"heads", required_argument, NULL, O_HEADS},
                                       {"seq", required_argument, NULL, O_SEQ},
                                       {"micro-batch", required_argument, NULL, O_MB},
                                       {"iters", required_argument, NULL, O_ITERS},
                                       BU_LONGOPTS_END};
    int iters = 0, layers = 0;
    int opt;
    BU_FOR_EACH_OPT(opt, "gemm", argc, argv, lo, &c->o, usage)
    {
        switch (opt) {
        case O_RANKS:
            if (cli_parse_int("--ranks", optarg, 1, 1024, &c->ranks))
                return -1;
            break;
        case O_LAYERS:
            if (cli_parse_int("--layers", optarg, 1, 1024, &layers))
                return -1;
            break;
        case O_DMODEL:
            if (cli_parse_int("--d-model", optarg, 1, 16384, &c->m.d_model))
                return -1;
            break;
        case O_HEADS:
            if (cli_parse_int("--heads", optarg, 1, 1024, &c->m.heads))
                return -1;
            break;
        case O_SEQ:
            if (cli_parse_int("--seq", optarg, 1, 65536, &c->m.seq))
                return -1;
            break;
        case O_MB:
            if (cli_parse_int("--micro-batch", optarg, 1, 4096, &c->m.micro_batch))
                return -1;
            break;
        case O_ITERS:
            if (cli_parse_int("--iters", optarg, 1, 100000, &iters))
                return -1;
            break;
        }
    }
    if (opt < 0)
        return -1;
    if (c->m.d_model % c->m.heads != 0) {
        cli_error("gemm: --heads %d must divide --d-model %d", c->m.heads, c->m.d_model);
        return -1;
    }
    if ((double)c->m.seq * c->m.micro_batch * 4.0 * c->m.d_model * 4 > (double)(1ull << 34)) {
        cli_error("gemm: the model's activations exceed 16 GiB per rank; choose smaller sizes");
        return -1;
    }
    c->iters = iters ? iters : c->o.quick ? 3 : 7;
    c->m.layers = layers ? layers : c->o.quick ? 1 : c->m.layers;
    return 0;
}

int bench_gemm_main(int argc, char **argv)
{
    gcfg c;
    memset(&c, 0, sizeof c);
    bu_model_default(&c.m);
    if (parse(argc, argv, &c))
        return CLI_EXIT_USAGE;

    dl_topo *topo = bu_topo_load("gemm");
    if (topo == NULL)
        return CLI_EXIT_FAIL;
    int pus = dl_topo_real_pus(topo);
    if (c.ranks == 0)
        c.ranks = c.o.quick && pus > 2 ? 2 : pus;
    int nmax = c.ranks;
    bu_warn_oversub(nmax, pus);

    dl_gemm_log log;
    bu_model_gemms(&c.m, &log);
    double flops = bu_gemm_log_flops(&log);
    long ngemm = 0;
    for (int i = 0; i < log.n; i++) ngemm += log.s[i].count;

    FILE *f = stdout;
    if (c.o.json) {
        bu_json_begin(f, "gemm", "config");
        bu_machine_json(f, topo);
        bu_json_int(f, "ranks", nmax);
        bu_json_int(f, "layers", c.m.layers);
        bu_json_int(f, "d_model", c.m.d_model);
        bu_json_int(f, "heads", c.m.heads);
        bu_json_int(f, "seq", c.m.seq);
        bu_json_int(f, "micro_batch", c.m.micro_batch);
        bu_json_int(f, "iters", c.iters);
        bu_json_int(f, "gemms_per_pass", ngemm);
        bu_json_int(f, "shapes", log.n);
        bu_json_num(f, "flop_per_pass", flops);
        bu_json_str(f, "dtype", "f32");
        bu_json_bool(f, "quick", c.o.quick);
        bu_json_end(f);
    } else {
        bu_machine_text(f, topo);
        fprintf(f,
                "# gemm: linear-layer GEMMs of one training step, L=%d C=%d H=%d T=%d B=%d: "
                "%ld sgemm calls (%d shapes), %.3f GFLOP per pass; %d timed passes per rank, "
                "median\n",
                c.m.layers, c.m.d_model, c.m.heads, c.m.seq, c.m.micro_batch, ngemm, log.n,
                flops * 1e-9, c.iters);
        if (c.o.csv)
            fprintf(f, "ranks,oversubscribed,pass_ms,gflops_per_rank,gflops_min,gflops_max,"
                       "gflops_total,contention,efficiency\n");
        else
            fprintf(f, "# %5s %9s %12s %10s %10s %11s %11s %10s\n", "ranks", "pass_ms",
                    "GFLOP/s/rank", "min", "max", "total", "contention", "efficiency");
    }
    fflush(f);

    double t_alone = NAN, worst = NAN;
    int status = CLI_EXIT_OK, done = 0;
    char *dat = NULL;
    size_t datlen = 0;
    FILE *df = c.o.plot ? open_memstream(&dat, &datlen) : NULL;
    if (df)
        fprintf(df, "# ranks gflops_per_rank contention\n");
    for (int n = 1; n <= nmax; n++) {
        gshared g = {.log = &log, .iters = c.iters};
        g.t = calloc((size_t)n * c.iters, sizeof *g.t);
        double *med = calloc((size_t)n, sizeof *med);
        if (!g.t || !med) {
            cli_error("gemm: out of memory");
            free(g.t);
            free(med);
            status = CLI_EXIT_FAIL;
            break;
        }
        dl_world_opts wo;
        dl_world_opts_init(&wo);
        wo.nranks = n;
        wo.topology = ""; /* pin on the real machine whatever DISTLAB_TOPOLOGY says */
        wo.timeout_s = 0; /* a long pass on an oversubscribed core is not a hang */
        if (dl_world_run(&wo, rank_fn, &g) != DL_OK) {
            cli_error("gemm: %d ranks: %s", n, dl_errmsg());
            free(g.t);
            free(med);
            status = CLI_EXIT_FAIL;
            break;
        }
        double mean = 0, gmin = INFINITY, gmax = 0, total = 0;
        for (int r = 0; r < n; r++) {
            med[r] = dl__median_copy(g.t + (size_t)r * c.iters, (size_t)c.iters);
            double gf = flops / med[r] * 1e-9;
            mean += med[r] / n;
            total += gf;
            if (gf < gmin)
                gmin = gf;
            if (gf > gmax)
                gmax = gf;
        }
        if (n == 1)
            t_alone = mean;
        double cont = bu_contention(t_alone, mean), per = flops / mean * 1e-9;
        if (n <= pus && isfinite(cont))
            worst = cont;
        int over = n > pus;
        if (c.o.json) {
            bu_json_begin(f, "gemm", "row");
            bu_json_int(f, "ranks", n);
            bu_json_bool(f, "oversubscribed", over);
            bu_json_num(f, "pass_ms", mean * 1e3);
            bu_json_num(f, "gflops_per_rank", per);
            bu_json_num(f, "gflops_min", gmin);
            bu_json_num(f, "gflops_max", gmax);
            bu_json_num(f, "gflops_total", total);
            bu_json_num(f, "contention", cont);
            bu_json_num(f, "efficiency", 1.0 / cont);
            bu_json_end(f);
        } else if (c.o.csv) {
            fprintf(f, "%d,%d,%.4f,%.3f,%.3f,%.3f,%.3f,%.4f,%.4f\n", n, over, mean * 1e3, per, gmin,
                    gmax, total, cont, 1.0 / cont);
        } else {
            fprintf(f, "  %5d %9.2f %12.2f %10.2f %10.2f %11.2f %10.3fx %9.0f%%%s\n", n, mean * 1e3,
                    per, gmin, gmax, total, cont, 100.0 / cont, over ? "  (oversubscribed)" : "");
        }
        fflush(f);
        if (df)
            fprintf(df, "%d %.6g %.6g\n", n, per, cont);
        free(g.t);
        free(med);
        done++;
    }
    if (c.o.json) {
        bu_json_begin(f, "gemm", "summary");
        bu_json_num(f, "gflops_alone", flops / t_alone * 1e-9);
        bu_json_num(f, "contention_at_pus", worst);
        bu_json_int(f, "rows", done);
        bu_json_str(f, "status", status == CLI_EXIT_OK ? "ok" : "failed");
        bu_json_end(f);
    } else if (!c.o.csv && done > 0) {
        fprintf(f, "# alone: %.2f GFLOP/s; contention with every PU busy: %.3fx\n",
                flops / t_alone * 1e-9, worst);
    }
    if (df) {
        fclose(df);
        if (status == CLI_EXIT_OK && done > 0 &&
            bu_plot(c.o.plot, dat,
                    "set title 'distlab-bench gemm: per-rank GEMM throughput'\n"
                    "set xlabel 'ranks running at once'\nset ylabel 'GFLOP/s per rank'\n"
                    "set y2label 'contention (alone / together)'\nset y2tics\nset ytics nomirror\n"
                    "set yrange [0:*]\nset y2range [0:*]\nset xtics 1\n"
                    "plot datafile using 1:2 with linespoints title 'GFLOP/s per rank', \\\n"
                    "     datafile using 1:3 axes x1y2 with linespoints title 'contention'\n") != 0)
            status = CLI_EXIT_FAIL;
        free(dat);
    }
    dl_topo_destroy(topo);
    return status;
}
