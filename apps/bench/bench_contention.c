/* distlab-bench contention: where the time of a collective goes on each rank, from the channel
 * counters: waiting for a peer (and how often that wait went to sleep on a futex) against doing
 * the work (copying, reducing), for ranks that fit the cores and for twice as many (the
 * oversubscribed case, where ranks yield instead of spinning); then the same split for the
 * pipeline engine (1F1B with fixed spinning work per action), where waiting for a hand-off is
 * the bubble plus whatever the contention for cores adds to it. */
#define _GNU_SOURCE
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "distlab.h"
#include "core/topo.h"
#include "transport/chan.h"
#include "cli.h"
#include "bench_util.h"

typedef struct ccfg {
    int ranks, iters, fwd_us;
    bu_common o;
} ccfg;

enum { MAXR = 256 };

/* What one world run measures, per rank. */
typedef struct crun {
    size_t bytes;
    int iters;
    double op_ns[MAXR];   /* time inside the all-reduces */
    double wait_ns[MAXR]; /* of which waiting for peers (channel counters) */
    double sleeps[MAXR];  /* waits that slept on a futex */
    int mode;             /* the wait mode the world chose */
    int algo;
} crun;

static void usage(FILE *f)
{
    /* clang-format off */
    fprintf(f,
"Usage: distlab-bench contention [OPTIONS]\n"
"\n"
"For all-reduces of 8 B, 64 KiB, 1 MiB and 16 MiB (f32, auto algorithm) on N ranks and on 2N\n"
"ranks (oversubscribed), the time each rank spends inside the collective split into waiting for\n"
"its peers and working (copying and reducing), from the channels' counters, and how many waits\n"
"slept on a futex rather than spinning (N fit the cores) or yielding (2N do not).\n"
"wait%% = waiting / time in the collective, averaged over ranks; sleeps/op per rank.\n"
"Then the pipeline engine on N and 2N stages (1F1B, m = 2 x stages, 64 KiB hand-offs, each\n"
"forward spinning --fwd-us, each backward twice that): per stage the share of the step spent\n"
"in the work, waiting on the channels for hand-offs, and the rest (copies, dispatch), with\n"
"sleeps per action; the lecture's bubble (p-1)/(m+p-1) is printed next to it.\n"
"\n"
"Options:\n"
"  --ranks N     ranks that fit (default: the machine's PUs); 2N are run too\n"
"  --iters N     all-reduces per size (default 200; --quick 50)\n"
"  --fwd-us N    pipeline: microseconds of spinning per forward (default 500; --quick 200)\n"
"  --quick       fewer iterations, sizes up to 1 MiB\n"
"  --csv         CSV rows (machine facts as leading '#' lines)\n"
"  --json        JSON Lines: config, one row per (ranks, size), summary (schema distlab/1)\n"
"  --plot FILE   FILE.svg or FILE.png: each rank's waiting and working share of its time in\n"
"                the all-reduces, one bar per rank, grouped by (ranks, size) (gnuplot)\n"
"  -h, --help    this help\n");
    /* clang-format on */
}

static int parse(int argc, char **argv, ccfg *c)
{
    enum { O_RANKS = 256, O_ITERS, O_FWD };
    static const struct option lo[] = {{"ranks", required_argument, NULL, O_RANKS},
                                       {"iters", required_argument, NULL, O_ITERS},
                                       {"fwd-us", required_argument, NULL, O_FWD},
                                       BU_LONGOPTS_END};
    int opt;
    BU_FOR_EACH_OPT(opt, "contention", argc, argv, lo, &c->o, usage)
    {
        switch (opt) {
        case O_RANKS:
            if (cli_parse_int("--ranks", optarg, 1, MAXR / 2, &c->ranks))
                return -1;
            break;
        case O_ITERS:
            if (cli_parse_int("--iters", optarg, 1, 1000000, &c->iters))
                return -1;
            break;
        case O_FWD:
            if (cli_parse_int("--fwd-us", optarg, 0, 10000000, &c->fwd_us))
                return -1;
            break;
        }
    }
    if (opt < 0)
        return -1;
    if (!c->iters)
        c->iters = c->o.quick ? 50 : 200;
    if (!c->fwd_us)
        c->fwd_us = c->o.quick ? 200 : 500;
    return 0;
}

/* ---- the pipeline engine: 1F1B with spinning work ---- */

#define PIPE_STEPS 5
#define PIPE_COUNT (64 * 1024 / 4)

typedef struct prun {
    int p, m, fwd_us;
    double wall[MAXR], busy[MAXR], wait[MAXR], sleeps[MAXR], actions[MAXR];
    int mode;
} prun;

typedef struct pstage {
    prun *r;
    float in[PIPE_COUNT], out[PIPE_COUNT];
} pstage;

static void *p_in(void *arg, int mb, int ch)
{
    (void)mb, (void)ch;
    return ((pstage *)arg)->in;
}
static int p_fwd(void *arg, int mb, int ch, const void **out)
{
    pstage *s = arg;
    (void)mb, (void)ch;
    bu_spin_until(dl_now_ns(), (uint64_t)s->r->fwd_us * 1000u);
    *out = s->out;
    return DL_OK;
}
static int p_bwd(void *arg, int mb, int ch, const void **din)
{
    pstage *s = arg;
    (void)mb, (void)ch;
    bu_spin_until(dl_now_ns(), 2u * (uint64_t)s->r->fwd_us * 1000u);
    *din = s->out;
    return DL_OK;
}

static int pipe_fn(dl_ctx *x, void *arg)
{
    prun *r = arg;
    int k = dl_ctx_rank(x), rc;
    pstage *st = calloc(1, sizeof *st);
    dl_sched *sc = NULL;
    dl_pipe *e = NULL;
    if (!st)
        return dl_error(DL_ENOMEM, "contention: out of memory");
    st->r = r;
    if ((rc = dl_sched_1f1b(r->p, r->m, &sc)) == DL_OK &&
        (rc = dl_pipe_create(dl_ctx_comm(x), PIPE_COUNT, DL_F32, dl_ctx_arena(x), &e)) == DL_OK) {
        dl_pipe_ops ops = {p_in, p_fwd, p_in, p_bwd, NULL};
        for (int step = 0; step <= PIPE_STEPS && rc == DL_OK; step++) { /* step 0 warms up */
            dl_pipe_stats ps;
            if ((rc = dl_barrier(dl_ctx_comm(x))) ||
                (rc = dl_pipe_run(e, sc, &ops, st, step, NULL, 0, &ps)))
                break;
            if (step == 0)
                continue;
            r->wall[k] += (double)ps.wall_ns;
            r->busy[k] += (double)ps.busy_ns;
            r->wait[k] += (double)ps.chan_wait_ns;
            r->sleeps[k] += (double)ps.sleeps;
            r->actions[k] += ps.actions;
        }
    }
    if (k == 0)
        r->mode = (int)dl_ctx_waiter(x)->mode;
    dl_pipe_destroy(e);
    dl_sched_free(sc);
    free(st);
    return rc;
}

static int rank_fn(dl_ctx *x, void *arg)
{
    crun *r = arg;
    int k = dl_ctx_rank(x);
    dl_comm *c = dl_ctx_comm(x);
    size_t n = r->bytes / 4 ? r->bytes / 4 : 1;
    float *buf;
    int rc = dl_arena_alloc(dl_ctx_arena(x), DL_MEM_COMM, n * 4, (void **)&buf);
    if (rc)
        return rc;
    for (size_t i = 0; i < n; i++) buf[i] = (float)(i % 7);
    for (int w = 0; w < 5 && rc == DL_OK; w++)
        rc = dl_allreduce(c, buf, buf, n, DL_F32, DL_MAX, DL_PURPOSE_OTHER);
    if (rc == DL_OK)
        rc = dl_barrier(c);
    dl_comm_reset_stats(c);
    uint64_t inside = 0;
    for (int i = 0; i < r->iters && rc == DL_OK; i++) {
        uint64_t t0 = dl_now_ns();
        rc = dl_allreduce(c, buf, buf, n, DL_F32, DL_MAX, DL_PURPOSE_OTHER);
        inside += dl_now_ns() - t0;
    }
    dl_comm_stats st;
    dl_comm_get_stats(c, &st);
    r->op_ns[k] = (double)inside;
    r->wait_ns[k] = (double)st.wait_ns;
    r->sleeps[k] = (double)st.sleeps;
    if (k == 0) {
        r->mode = (int)dl_ctx_waiter(x)->mode;
        r->algo = (int)dl_comm_last_algo(c);
    }
    dl_arena_free(dl_ctx_arena(x), buf);
    return rc;
}

int bench_contention_main(int argc, char **argv)
{
    ccfg c;
    memset(&c, 0, sizeof c);
    if (parse(argc, argv, &c))
        return CLI_EXIT_USAGE;
    dl_topo *topo = bu_topo_load("contention");
    if (topo == NULL)
        return CLI_EXIT_FAIL;
    int pus = dl_topo_real_pus(topo);
    if (!c.ranks)
        c.ranks = pus;
    static const size_t sizes[] = {8, 64 << 10, 1 << 20, 16 << 20};
    int nsizes = c.o.quick ? 3 : 4;
    FILE *f = stdout;
    if (c.o.json) {
        bu_json_begin(f, "contention", "config");
        bu_machine_json(f, topo);
        bu_json_int(f, "ranks", c.ranks);
        bu_json_int(f, "iters", c.iters);
        bu_json_bool(f, "quick", c.o.quick);
        bu_json_end(f);
    } else {
        bu_machine_text(f, topo);
        fprintf(f,
                "# contention: all-reduce (f32, auto), %d per size; time inside split from the "
                "channel counters\n",
                c.iters);
        if (c.o.csv)
            fprintf(f, "ranks,oversubscribed,wait_mode,bytes,algo,us_per_op,wait_pct,work_pct,"
                       "sleeps_per_op\n");
        else
            fprintf(f, "# %5s %-5s %10s %-8s %10s %7s %7s %13s\n", "ranks", "wait", "bytes", "algo",
                    "us/op", "wait%", "work%", "sleeps/op/rank");
    }
    int status = CLI_EXIT_OK, rows = 0;
    double worst_over = 0, worst_fit = 0;
    char *dat = NULL;
    size_t datlen = 0;
    FILE *df = c.o.plot ? open_memstream(&dat, &datlen) : NULL;
    if (df)
        fprintf(df, "# label wait_pct work_pct (one bar per rank, a gap between rows)\n");
    for (int pass = 0; pass < 2 && status == CLI_EXIT_OK; pass++) {
        int n = pass ? 2 * c.ranks : c.ranks;
        if (n > MAXR)
            break;
        int over = n > pus;
        for (int s = 0; s < nsizes; s++) {
            crun *r = calloc(1, sizeof *r);
            if (!r) {
                status = CLI_EXIT_FAIL;
                break;
            }
            r->bytes = sizes[s];
            r->iters = c.iters;
            dl_world_opts w;
            dl_world_opts_init(&w);
            w.nranks = n;
            if (dl_world_run(&w, rank_fn, r) != DL_OK) {
                cli_error("contention: %d ranks, %zu B: %s", n, sizes[s], dl_errmsg());
                free(r);
                status = CLI_EXIT_FAIL;
                break;
            }
            double op = 0, wait = 0, sl = 0, mx = 0;
            for (int k = 0; k < n; k++) {
                op += r->op_ns[k];
                wait += r->wait_ns[k];
                sl += r->sleeps[k];
                mx = fmax(mx, r->op_ns[k]);
            }
            double wait_pct = op > 0 ? 100.0 * wait / op : 0, us = mx / r->iters / 1e3;
            double sleeps = sl / n / r->iters;
            const char *mode = r->mode == DL_WAIT_YIELD ? "yield" : "spin";
            const char *algo = dl_algo_name((dl_algo)r->algo);
            if (over)
                worst_over = fmax(worst_over, wait_pct);
            else
                worst_fit = fmax(worst_fit, wait_pct);
            if (c.o.json) {
                bu_json_begin(f, "contention", "row");
                bu_json_int(f, "ranks", n);
                bu_json_bool(f, "oversubscribed", over);
                bu_json_str(f, "wait_mode", mode);
                bu_json_int(f, "bytes", (long long)sizes[s]);
                bu_json_str(f, "algo", algo);
                bu_json_num(f, "us_per_op", us);
                bu_json_num(f, "wait_pct", wait_pct);
                bu_json_num(f, "work_pct", 100.0 - wait_pct);
                bu_json_num(f, "sleeps_per_op", sleeps);
                bu_json_end(f);
            } else if (c.o.csv) {
                fprintf(f, "%d,%d,%s,%zu,%s,%.3f,%.1f,%.1f,%.4f\n", n, over, mode, sizes[s], algo,
                        us, wait_pct, 100.0 - wait_pct, sleeps);
            } else {
                fprintf(f, "  %5d %-5s %10zu %-8s %10.2f %6.1f%% %6.1f%% %13.4f%s\n", n, mode,
                        sizes[s], algo, us, wait_pct, 100.0 - wait_pct, sleeps,
                        over ? "  (oversubscribed)" : "");
            }
            fflush(f);
            if (df) {
                /* one bar per rank, the row's first labelled with ranks and size */
                char sz[16];
                if (sizes[s] >= (1u << 20))
                    snprintf(sz, sizeof sz, "%zuM", sizes[s] >> 20);
                else if (sizes[s] >= 1024)
                    snprintf(sz, sizeof sz, "%zuK", sizes[s] >> 10);
                else
                    snprintf(sz, sizeof sz, "%zuB", sizes[s]);
                for (int k = 0; k < n; k++) {
                    double w =
                        r->op_ns[k] > 0 ? fmin(100.0, 100.0 * r->wait_ns[k] / r->op_ns[k]) : 0;
                    if (k == 0)
                        fprintf(df, "\"%d%s %s\" %.4f %.4f\n", n, over ? "*" : "", sz, w, 100 - w);
                    else
                        fprintf(df, "\"\" %.4f %.4f\n", w, 100 - w);
                }
                fprintf(df, "\"\" 0 0\n");
            }
            rows++;
            free(r);
        }
    }
    /* the pipeline engine on N and 2N stages */
    if (!c.o.json && !c.o.csv && status == CLI_EXIT_OK)
        fprintf(f,
                "# pipeline engine: 1F1B, m = 2 x stages, forward %d us / backward %d us of "
                "spinning, 64 KiB hand-offs, %d steps; shares of the step, mean over stages\n"
                "# %5s %-5s %9s %7s %7s %7s %8s %13s\n",
                c.fwd_us, 2 * c.fwd_us, PIPE_STEPS, "stages", "wait", "ms/step", "work%", "wait%",
                "other%", "lecture", "sleeps/action");
    for (int pass = 0; pass < 2 && status == CLI_EXIT_OK; pass++) {
        int n = pass ? 2 * c.ranks : c.ranks;
        if (n < 2 || n > MAXR)
            continue;
        int over = n > pus;
        prun *r = calloc(1, sizeof *r);
        if (!r) {
            status = CLI_EXIT_FAIL;
            break;
        }
        r->p = n, r->m = 2 * n, r->fwd_us = c.fwd_us;
        dl_world_opts w;
        dl_world_opts_init(&w);
        w.nranks = n;
        if (dl_world_run(&w, pipe_fn, r) != DL_OK) {
            cli_error("contention: pipeline on %d stages: %s", n, dl_errmsg());
            free(r);
            status = CLI_EXIT_FAIL;
            break;
        }
        double work = 0, wait = 0, sl = 0, acts = 0, wall = 0;
        for (int k = 0; k < n; k++) {
            work += r->wall[k] > 0 ? r->busy[k] / r->wall[k] : 0;
            wait += r->wall[k] > 0 ? fmin(1.0, r->wait[k] / r->wall[k]) : 0;
            sl += r->sleeps[k];
            acts += r->actions[k];
            wall = fmax(wall, r->wall[k]);
        }
        work = 100 * work / n, wait = 100 * wait / n;
        double other = fmax(0.0, 100 - work - wait), ms = wall / PIPE_STEPS / 1e6;
        double lecture = 100.0 * (n - 1) / (r->m + n - 1), spa = acts > 0 ? sl / acts : 0;
        const char *mode = r->mode == DL_WAIT_YIELD ? "yield" : "spin";
        if (over)
            worst_over = fmax(worst_over, wait);
        else
            worst_fit = fmax(worst_fit, wait);
        if (c.o.json) {
            bu_json_begin(f, "contention", "pipeline");
            bu_json_int(f, "stages", n);
            bu_json_int(f, "microbatches", r->m);
            bu_json_bool(f, "oversubscribed", over);
            bu_json_str(f, "wait_mode", mode);
            bu_json_num(f, "ms_per_step", ms);
            bu_json_num(f, "work_pct", work);
            bu_json_num(f, "wait_pct", wait);
            bu_json_num(f, "other_pct", other);
            bu_json_num(f, "lecture_bubble_pct", lecture);
            bu_json_num(f, "sleeps_per_action", spa);
            bu_json_end(f);
        } else if (c.o.csv) {
            fprintf(f, "# pipeline,%d,%d,%s,%.3f,%.1f,%.1f,%.1f,%.1f,%.4f\n", n, over, mode, ms,
                    work, wait, other, lecture, spa);
        } else {
            fprintf(f, "  %5d %-5s %9.2f %6.1f%% %6.1f%% %6.1f%% %7.1f%% %13.4f%s\n", n, mode, ms,
                    work, wait, other, lecture, spa, over ? "  (oversubscribed)" : "");
        }
        if (df) {
            for (int k = 0; k < n; k++) {
                double wt = r->wall[k] > 0 ? fmin(100.0, 100.0 * r->wait[k] / r->wall[k]) : 0;
                if (k == 0)
                    fprintf(df, "\"pipe %d%s\" %.4f %.4f\n", n, over ? "*" : "", wt, 100 - wt);
                else
                    fprintf(df, "\"\" %.4f %.4f\n", wt, 100 - wt);
            }
            fprintf(df, "\"\" 0 0\n");
        }
        fflush(f);
        rows++;
        free(r);
    }
    if (c.o.json) {
        bu_json_begin(f, "contention", "summary");
        bu_json_int(f, "rows", rows);
        bu_json_num(f, "max_wait_pct_fitting", worst_fit);
        bu_json_num(f, "max_wait_pct_oversubscribed", worst_over);
        bu_json_str(f, "status", status == CLI_EXIT_OK ? "ok" : "failed");
        bu_json_end(f);
    } else if (!c.o.csv && rows > 0) {
        fprintf(f,
                "# waiting, largest share: %.1f%% with ranks fitting the cores, %.1f%% "
                "oversubscribed\n",
                worst_fit, worst_over);
    }
    if (df) {
        fclose(df);
        if (status == CLI_EXIT_OK &&
            bu_plot(c.o.plot, dat,
                    "set title 'distlab-bench contention: each rank''s time in all-reduces and "
                    "pipeline steps (* oversubscribed)'\n"
                    "set ylabel '% of the time inside the all-reduce / step'\nset yrange [0:100]\n"
                    "set style data histograms\nset style histogram rowstacked\n"
                    "set style fill solid 0.85 border lc rgb '#303030'\nset boxwidth 0.8\n"
                    "set xtics rotate by -45 font ',9'\nunset grid\nset grid ytics\n"
                    "plot datafile using 2:xtic(1) lc rgb '#c44e52' title 'waiting', \\\n"
                    "     '' using 3 lc rgb '#4c72b0' title 'working (copy, reduce; pipeline: work "
                    "and copies)'\n") != 0)
            status = CLI_EXIT_FAIL;
        free(dat);
    }
    dl_topo_destroy(topo);
    return status;
}
