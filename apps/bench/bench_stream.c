/* distlab-bench stream: STREAM copy and triad bandwidth with 1 ... N pinned threads, placed
 * compact (neighbours share caches) and scatter (spread over packages, L3s, cores), so that
 * what the rank threads share (memory bandwidth per socket, per L3) shows as a curve. The kernel
 * is the one `distlab-bench coll` uses for its DRAM bound (bench_util.c, bench_limits.c). */
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

typedef struct scfg {
    int ranks, mib, trials;
    bu_common o;
} scfg;

static void usage(FILE *f)
{
    /* clang-format off */
    fprintf(f,
"Usage: distlab-bench stream [OPTIONS]\n"
"\n"
"STREAM bandwidth of 1 ... N threads pinned as rank threads are, placed compact and scatter.\n"
"Each thread has its own page-aligned arrays (first touched by itself). copy = memcpy, counted\n"
"read + write (2 x array bytes); triad a = b + 3c on doubles, counted 3 x array bytes. Per trial\n"
"the slowest thread's time; median over trials. GB/s = 10^9 bytes per second, all threads.\n"
"\n"
"Options:\n"
"  --ranks N     most threads (default: the machine's PUs; more are marked oversubscribed)\n"
"  --mib N       MiB per array per thread (default 64; --quick 16)\n"
"  --trials N    trials per point (default 7; --quick 3)\n"
"  --quick       smaller arrays, fewer trials, at most 2 threads (unless --ranks)\n"
"  --csv         CSV rows (machine facts as leading '#' lines)\n"
"  --json        JSON Lines: config, one row per (policy, threads), summary (schema distlab/1)\n"
"  --plot FILE   FILE.svg or FILE.png: bandwidth vs threads per policy and kernel (gnuplot)\n"
"  -h, --help    this help\n");
    /* clang-format on */
}

static int parse(int argc, char **argv, scfg *c)
{
    enum { O_RANKS = 256, O_MIB, O_TRIALS };
    static const struct option lo[] = {{"ranks", required_argument, NULL, O_RANKS},
                                       {"mib", required_argument, NULL, O_MIB},
                                       {"trials", required_argument, NULL, O_TRIALS},
                                       BU_LONGOPTS_END};
    int opt;
    BU_FOR_EACH_OPT(opt, "stream", argc, argv, lo, &c->o, usage)
    {
        switch (opt) {
        case O_RANKS:
            if (cli_parse_int("--ranks", optarg, 1, 1024, &c->ranks))
                return -1;
            break;
        case O_MIB:
            if (cli_parse_int("--mib", optarg, 1, 1 << 16, &c->mib))
                return -1;
            break;
        case O_TRIALS:
            if (cli_parse_int("--trials", optarg, 1, 1000, &c->trials))
                return -1;
            break;
        }
    }
    if (opt < 0)
        return -1;
    if (!c->mib)
        c->mib = c->o.quick ? 16 : 64;
    if (!c->trials)
        c->trials = c->o.quick ? 3 : 7;
    return 0;
}

/* The OS cpus the first n threads get under `pol`, as "0,1,..." (for the table). */
static void cpus_of(const dl_topo *topo, dl_place_policy pol, int n, char *buf, size_t len)
{
    dl_placement *pl = NULL;
    buf[0] = 0;
    if (dl_place(topo, n, pol, DL_NODE_PACKAGE, 1, &pl) != DL_OK) {
        snprintf(buf, len, "?");
        return;
    }
    size_t at = 0;
    for (int i = 0; i < n && at + 8 < len; i++)
        at += (size_t)snprintf(buf + at, len - at, i ? " %d" : "%d", pl->os_pu[i]);
    if (n > 0 && at + 8 >= len)
        snprintf(buf + len - 5, 5, "...");
    dl_placement_destroy(pl);
}

int bench_stream_main(int argc, char **argv)
{
    scfg c;
    memset(&c, 0, sizeof c);
    if (parse(argc, argv, &c))
        return CLI_EXIT_USAGE;
    dl_topo *topo = bu_topo_load("stream");
    if (topo == NULL)
        return CLI_EXIT_FAIL;
    int pus = dl_topo_real_pus(topo);
    if (!c.ranks)
        c.ranks = c.o.quick && pus > 2 ? 2 : pus;
    bu_warn_oversub(c.ranks, pus);
    size_t bytes = (size_t)c.mib << 20;

    FILE *f = stdout;
    if (c.o.json) {
        bu_json_begin(f, "stream", "config");
        bu_machine_json(f, topo);
        bu_json_int(f, "ranks", c.ranks);
        bu_json_int(f, "array_bytes", (long long)bytes);
        bu_json_int(f, "trials", c.trials);
        bu_json_bool(f, "quick", c.o.quick);
        bu_json_end(f);
    } else {
        bu_machine_text(f, topo);
        fprintf(f,
                "# stream: %d MiB per array per thread, median of %d trials; copy counts 2x, "
                "triad 3x the array bytes\n",
                c.mib, c.trials);
        if (c.o.csv)
            fprintf(f, "policy,threads,oversubscribed,cpus,copy_gbs,triad_gbs,copy_gbs_per_thread,"
                       "triad_gbs_per_thread\n");
        else
            fprintf(f, "# %-8s %7s %-16s %10s %10s %12s %12s\n", "policy", "threads", "cpus",
                    "copy GB/s", "triad GB/s", "copy/thread", "triad/thread");
    }
    fflush(f);

    static const dl_place_policy pols[2] = {DL_PLACE_COMPACT, DL_PLACE_SCATTER};
    double best_copy = 0, best_triad = 0, one_copy = NAN;
    int status = CLI_EXIT_OK, rows = 0;
    char *dat = NULL;
    size_t datlen = 0;
    FILE *df = c.o.plot ? open_memstream(&dat, &datlen) : NULL;
    for (int p = 0; p < 2 && status == CLI_EXIT_OK; p++) {
        const char *pname = dl_place_policy_name(pols[p]);
        if (df)
            fprintf(df, "%s# %s: threads copy_gbs triad_gbs\n", p ? "\n\n" : "", pname);
        for (int n = 1; n <= c.ranks; n++) {
            double cp = bu_stream(topo, pols[p], DL_NODE_PACKAGE, 1, n, bytes, BU_COPY, c.trials,
                                  BU_MEDIAN);
            double tr = bu_stream(topo, pols[p], DL_NODE_PACKAGE, 1, n, bytes, BU_TRIAD, c.trials,
                                  BU_MEDIAN);
            if (cp <= 0 || tr <= 0) {
                cli_error("stream: %d threads: the measurement failed (out of memory?)", n);
                status = CLI_EXIT_FAIL;
                break;
            }
            char cpus[64];
            cpus_of(topo, pols[p], n, cpus, sizeof cpus);
            int over = n > pus;
            if (n == 1 && p == 0)
                one_copy = cp;
            if (cp > best_copy)
                best_copy = cp;
            if (tr > best_triad)
                best_triad = tr;
            if (c.o.json) {
                bu_json_begin(f, "stream", "row");
                bu_json_str(f, "policy", pname);
                bu_json_int(f, "threads", n);
                bu_json_bool(f, "oversubscribed", over);
                bu_json_str(f, "cpus", cpus);
                bu_json_num(f, "copy_gbs", cp);
                bu_json_num(f, "triad_gbs", tr);
                bu_json_num(f, "copy_gbs_per_thread", cp / n);
                bu_json_num(f, "triad_gbs_per_thread", tr / n);
                bu_json_end(f);
            } else if (c.o.csv) {
                fprintf(f, "%s,%d,%d,%s,%.3f,%.3f,%.3f,%.3f\n", pname, n, over, cpus, cp, tr,
                        cp / n, tr / n);
            } else {
                fprintf(f, "  %-8s %7d %-16s %10.2f %10.2f %12.2f %12.2f%s\n", pname, n, cpus, cp,
                        tr, cp / n, tr / n, over ? "  (oversubscribed)" : "");
            }
            fflush(f);
            if (df)
                fprintf(df, "%d %.6g %.6g\n", n, cp, tr);
            rows++;
        }
    }
    if (c.o.json) {
        bu_json_begin(f, "stream", "summary");
        bu_json_num(f, "copy_gbs_one_thread", one_copy);
        bu_json_num(f, "copy_gbs_best", best_copy);
        bu_json_num(f, "triad_gbs_best", best_triad);
        bu_json_int(f, "rows", rows);
        bu_json_str(f, "status", status == CLI_EXIT_OK ? "ok" : "failed");
        bu_json_end(f);
    } else if (!c.o.csv && rows > 0) {
        fprintf(f, "# best: copy %.2f GB/s, triad %.2f GB/s (one thread copy %.2f GB/s)\n",
                best_copy, best_triad, one_copy);
    }
    if (df) {
        fclose(df);
        if (status == CLI_EXIT_OK &&
            bu_plot(c.o.plot, dat,
                    "set title 'distlab-bench stream: memory bandwidth'\n"
                    "set xlabel 'threads'\nset ylabel 'GB/s (all threads)'\nset yrange [0:*]\n"
                    "set xtics 1\n"
                    "plot datafile index 0 using 1:2 with linespoints title 'copy, compact', \\\n"
                    "     datafile index 0 using 1:3 with linespoints title 'triad, compact', \\\n"
                    "     datafile index 1 using 1:2 with linespoints title 'copy, scatter', \\\n"
                    "     datafile index 1 using 1:3 with linespoints title 'triad, scatter'\n") !=
                0)
            status = CLI_EXIT_FAIL;
        free(dat);
    }
    dl_topo_destroy(topo);
    return status;
}
