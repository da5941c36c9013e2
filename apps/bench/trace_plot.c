/* Gantt charts of traces with gnuplot (bu_plot writes the data and the script and runs gnuplot
 * when it is installed), and the hidden `distlab-bench gantt-demo` that draws a simulated
 * schedule through the same path. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "distlab.h"
#include "cli.h"
#include "bench_util.h"
#include "trace_plot.h"

/* The kinds drawn, in the data file's block order, with their colours and legend titles. */
static const struct {
    int kind;
    const char *colour, *title;
} drawn[] = {
    {DL_TR_FWD, "#4c72b0", "forward"},
    {DL_TR_BWD, "#dd8452", "backward (input gradient when split)"},
    {DL_TR_WGT, "#937860", "weight gradient"},
    {DL_TR_OPT, "#55a868", "optimizer"},
    {DL_TR_COMM, "#8172b3", "collective"},
};
enum { NDRAWN = sizeof drawn / sizeof drawn[0] };

int trace_plot_gantt(const dl_trace *t, int step, const char *svg_path)
{
    if (t == NULL || bu_plot_check(svg_path)) {
        if (t == NULL)
            cli_error("gantt: no trace");
        return -1;
    }
    int n = dl_trace_nranks(t);
    uint64_t w0 = UINT64_MAX, w1 = 0;
    double bub_sum = 0;
    int bub_n = 0;
    for (int r = 0; r < n; r++) {
        const dl_trace_event *e = dl_trace_events(t, r);
        for (size_t i = 0; i < dl_trace_count(t, r); i++) {
            if (e[i].kind != DL_TR_STEP || e[i].step != step)
                continue;
            if (e[i].t0 < w0)
                w0 = e[i].t0;
            if (e[i].t1 > w1)
                w1 = e[i].t1;
            break;
        }
        double b;
        if (dl_trace_bubble(t, r, step, &b, NULL, NULL) == DL_OK) {
            bub_sum += b;
            bub_n++;
        }
    }
    if (w0 == UINT64_MAX) {
        cli_error("gantt: no rank has a step event of step %d", step);
        return -1;
    }
    char *dat = NULL;
    size_t datlen = 0;
    FILE *df = open_memstream(&dat, &datlen);
    if (df == NULL) {
        cli_error("gantt: out of memory");
        return -1;
    }
    int present[NDRAWN] = {0}, total = 0;
    fprintf(df, "# distlab trace, step %d: x_mid_ms half_width_ms rank label\n", step);
    for (int d = 0, block = 0; d < NDRAWN; d++) {
        int k = 0;
        for (int r = 0; r < n; r++) {
            const dl_trace_event *e = dl_trace_events(t, r);
            for (size_t i = 0; i < dl_trace_count(t, r); i++) {
                if (e[i].kind != drawn[d].kind)
                    continue;
                uint64_t a = e[i].t0 > w0 ? e[i].t0 : w0, z = e[i].t1 < w1 ? e[i].t1 : w1;
                if (z <= a)
                    continue;
                if (k == 0)
                    fprintf(df, "%s# %s\n", block ? "\n\n" : "", drawn[d].title);
                double x0 = (double)(a - w0) / 1e6, x1 = (double)(z - w0) / 1e6;
                char label[32] = "";
                /* a label only where it fits: boxes of at least 2.5% of the step */
                if (drawn[d].kind != DL_TR_OPT && drawn[d].kind != DL_TR_COMM &&
                    (z - a) * 40 >= w1 - w0) {
                    if (e[i].chunk > 0)
                        snprintf(label, sizeof label, "%d.%d", (int)e[i].mb, (int)e[i].chunk);
                    else
                        snprintf(label, sizeof label, "%d", (int)e[i].mb);
                }
                fprintf(df, "%.6f %.6f %d \"%s\"\n", (x0 + x1) / 2, (x1 - x0) / 2, r, label);
                k++;
            }
        }
        if (k) {
            present[d] = ++block;
            total += k;
        }
    }
    fclose(df);

    char *gp = NULL;
    size_t gplen = 0;
    FILE *g = open_memstream(&gp, &gplen);
    if (g == NULL) {
        free(dat);
        cli_error("gantt: out of memory");
        return -1;
    }
    fprintf(g, "set title 'distlab trace: step %d", step);
    if (bub_n)
        fprintf(g, " (bubble %.1f%%, mean of %d ranks)", 100.0 * bub_sum / bub_n, bub_n);
    fprintf(g, "'\nset xlabel 'ms from the step start'\nset xrange [0:%.6f]\n",
            (double)(w1 - w0) / 1e6);
    fprintf(g, "set yrange [%g:-0.5]\nset ytics (", n - 0.5);
    for (int r = 0; r < n; r++) fprintf(g, "%s'rank %d' %d", r ? ", " : "", r, r);
    fprintf(g,
            ")\nunset grid\nset grid xtics\nset style fill solid 0.85 border lc rgb '#303030'\n");
    if (total == 0) {
        /* nothing to draw but the empty rows: one invisible point keeps gnuplot happy */
        fprintf(g, "plot '+' using (0):(0) with points pt -1 notitle\n");
    } else {
        const char *sep = "plot ";
        for (int d = 0; d < NDRAWN; d++) {
            if (!present[d])
                continue;
            fprintf(g,
                    "%sdatafile index %d using 1:3:2:(0.38) with boxxyerror lc rgb '%s' title '%s'",
                    sep, present[d] - 1, drawn[d].colour, drawn[d].title);
            sep = ", \\\n     ";
        }
        if (total <= 600) /* labels stay readable only for so many boxes */
            for (int d = 0; d < 2; d++)
                if (present[d])
                    fprintf(g,
                            "%sdatafile index %d using 1:3:4 with labels font ',8' tc rgb 'white' "
                            "notitle",
                            sep, present[d] - 1);
        fputc('\n', g);
    }
    fclose(g);
    int rc = bu_plot(svg_path, dat, gp);
    free(dat);
    free(gp);
    return rc;
}

int trace_plot_demo_main(int argc, char **argv)
{
    if (argc < 2 || argc > 5) {
        cli_error("gantt-demo: usage: distlab-bench gantt-demo FILE.svg [SCHED [P [M]]]");
        return CLI_EXIT_USAGE;
    }
    int p = 4, m = 8;
    dl_sched_kind kind = DL_SCHED_1F1B;
    if (argc > 2 && dl_sched_kind_parse(argv[2], &kind) != DL_OK) {
        cli_error("gantt-demo: %s", dl_errmsg());
        return CLI_EXIT_USAGE;
    }
    if ((argc > 3 && cli_parse_int("P", argv[3], 1, 64, &p)) ||
        (argc > 4 && cli_parse_int("M", argv[4], 1, 64, &m)))
        return CLI_EXIT_USAGE;
    if (bu_plot_check(argv[1]))
        return CLI_EXIT_USAGE;
    dl_sched *s = NULL;
    int rc;
    switch (kind) {
    case DL_SCHED_NAIVE: rc = dl_sched_naive(p, &s); break;
    case DL_SCHED_GPIPE: rc = dl_sched_gpipe(p, m, &s); break;
    case DL_SCHED_INTERLEAVED: rc = dl_sched_interleaved(p, m, 2, &s); break;
    case DL_SCHED_ASYNC: rc = dl_sched_async(p, m, 1, &s); break;
    default: rc = dl_sched_1f1b(p, m, &s); break;
    }
    dl_sched_sim *sim = NULL;
    if (rc == DL_OK)
        rc = dl_sched_simulate(s, NULL, &sim);
    if (rc != DL_OK) {
        cli_error("gantt-demo: %s", dl_errmsg());
        dl_sched_free(s);
        return CLI_EXIT_USAGE;
    }
    dl_trace *t = NULL;
    int status = CLI_EXIT_FAIL;
    const uint64_t ms = 1000000;
    if (dl_trace_create(p, 4096, &t) == DL_OK) {
        dl_trace_set_chunks(t, s->v);
        for (int q = 0; q < p; q++) {
            dl_trace_add(t, q, DL_TR_STEP, 0, -1, -1, 0, (uint64_t)(sim->makespan + 0.5) * ms);
            for (int i = 0; i < s->len[q]; i++) {
                const dl_sched_action *a = &s->act[q][i];
                int k = a->op == DL_SCHED_F                          ? DL_TR_FWD
                        : a->op == DL_SCHED_B || a->op == DL_SCHED_I ? DL_TR_BWD
                        : a->op == DL_SCHED_W                        ? DL_TR_WGT
                                                                     : DL_TR_OPT;
                dl_trace_add(t, q, k, 0, a->mb, a->chunk, (uint64_t)(sim->start[q][i] + 0.5) * ms,
                             (uint64_t)(sim->end[q][i] + 0.5) * ms);
            }
        }
        char *grid = NULL;
        if (dl_trace_grid(t, 0, ms, &grid) == DL_OK) {
            cli_put_ranked(stdout, grid);
            free(grid);
        }
        if (trace_plot_gantt(t, 0, argv[1]) == 0)
            status = CLI_EXIT_OK;
        dl_trace_destroy(t);
    } else {
        cli_error("gantt-demo: %s", dl_errmsg());
    }
    dl_sched_sim_free(sim);
    dl_sched_free(s);
    return status;
}
