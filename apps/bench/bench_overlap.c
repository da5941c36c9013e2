/* distlab-bench overlap: does communication hide behind computation on these cores?
 *
 * For each size S, on the same pinned ranks: an all-reduce of S bytes alone, a GEMM loop alone
 * (as many GEMMs as take about as long as the all-reduce, so that there is the most to hide),
 * and both at once in two ways:
 *   thread       the all-reduce runs on the rank's communication thread (dl_iallreduce) while
 *                the rank thread runs the GEMMs, polling dl_test between GEMMs;
 *   alternating  no communication thread: half the GEMMs, the blocking all-reduce, the rest
 *                (what a trainer without --overlap does: nothing is hidden by construction,
 *                the baseline the thread is measured against).
 * Each time is the slowest rank's, median over trials. hidden = (comm + gemm − both) / comm
 * (bu_overlap_calc), slowdown = time inside the pair / time alone. */
#define _GNU_SOURCE
#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "distlab.h"
#include "core/topo.h"
#include "model/ops.h"
#include "cli.h"
#include "bench_util.h"
#include "core/stats.h"

/* M_C: the all-reduce alone through the communication thread (the baseline of 'thread');
 * M_CB: alone, blocking on the rank thread (the baseline of 'alternating', which calls it so) */
enum { M_C, M_CB, M_G, M_TC, M_TG, M_TT, M_AC, M_AG, M_AT, NM };

typedef struct ocfg {
    int ranks, trials, gemm_dim;
    uint64_t minb, maxb;
    bu_common o;
} ocfg;

typedef struct oshared {
    const ocfg *c;
    int nsizes, n;
    uint64_t *sizes;
    int *reps; /* [size] GEMMs in the loop */
    double *t; /* [size][NM][rank][trial] seconds */
} oshared;

static double *slot(oshared *s, int si, int m, int r)
{
    return s->t + (((size_t)si * NM + m) * s->n + r) * s->c->trials;
}

static double now_s(void) { return (double)dl_now_ns() * 1e-9; }

static int rank_fn(dl_ctx *ctx, void *arg)
{
    oshared *s = arg;
    const ocfg *c = s->c;
    int r = dl_ctx_rank(ctx), rc = DL_OK;
    dl_comm *comm = dl_ctx_comm(ctx);
    size_t maxcount = (size_t)(s->sizes[s->nsizes - 1] / sizeof(float));
    float *snd = NULL, *rcv = NULL;
    /* page-aligned, first touched by this rank (its NUMA node) */
    if (posix_memalign((void **)&snd, 4096, maxcount * sizeof(float)) ||
        posix_memalign((void **)&rcv, 4096, maxcount * sizeof(float))) {
        free(snd);
        return DL_ENOMEM;
    }
    for (size_t i = 0; i < maxcount; i++) snd[i] = rcv[i] = 1.0f;
    dl_gemm_log lg;
    memset(&lg, 0, sizeof lg);
    lg.n = 1;
    int d = c->gemm_dim;
    lg.s[0] = (dl_gemm_shape){.tb = 1, .M = d, .N = d, .K = d, .count = 1};
    bu_gemm_bufs gb;
    if (bu_gemm_alloc(&lg, &gb)) {
        free(snd);
        free(rcv);
        return DL_ENOMEM;
    }
    double g1[5];
    for (int k = 0; k < 6; k++) { /* one untimed, then the time of one GEMM */
        double t0 = now_s();
        bu_gemm_one(&lg.s[0], &gb);
        if (k)
            g1[k - 1] = now_s() - t0;
    }
    double tgemm = dl__median_copy(g1, 5);

    for (int si = 0; si < s->nsizes && rc == DL_OK; si++) {
        size_t count = (size_t)(s->sizes[si] / sizeof(float));
        dl_request *rq = NULL;
        /* warm-up, then the all-reduce alone (through the communication thread, as below) */
        rc = dl_allreduce(comm, snd, rcv, count, DL_F32, DL_SUM, DL_PURPOSE_GRADS);
        for (int k = 0; k < c->trials && rc == DL_OK; k++) {
            if ((rc = dl_barrier(comm)) != DL_OK)
                break;
            double t0 = now_s();
            rc = dl_iallreduce(comm, snd, rcv, count, DL_F32, DL_SUM, DL_PURPOSE_GRADS, &rq);
            if (rc == DL_OK)
                rc = dl_wait(rq);
            slot(s, si, M_C, r)[k] = now_s() - t0;
        }
        for (int k = 0; k < c->trials && rc == DL_OK; k++) {
            if ((rc = dl_barrier(comm)) != DL_OK)
                break;
            double t0 = now_s();
            rc = dl_allreduce(comm, snd, rcv, count, DL_F32, DL_SUM, DL_PURPOSE_GRADS);
            slot(s, si, M_CB, r)[k] = now_s() - t0;
        }
        if (rc != DL_OK)
            break;
        /* as many GEMMs as one all-reduce takes, the same on every rank (max over ranks) */
        double want = ceil(dl__median_copy(slot(s, si, M_C, r), (size_t)c->trials) / tgemm);
        if (want < 1)
            want = 1;
        if (want > 1e6)
            want = 1e6;
        if ((rc = dl_allreduce(comm, &want, &want, 1, DL_F64, DL_MAX, DL_PURPOSE_OTHER)) != DL_OK)
            break;
        int reps = (int)want;
        if (r == 0)
            s->reps[si] = reps;
        for (int k = 0; k < c->trials && rc == DL_OK; k++) {
            if ((rc = dl_barrier(comm)) != DL_OK)
                break;
            double t0 = now_s();
            for (int i = 0; i < reps; i++) bu_gemm_one(&lg.s[0], &gb);
            slot(s, si, M_G, r)[k] = now_s() - t0;
        }
        /* both, all-reduce on the communication thread */
        for (int k = 0; k < c->trials && rc == DL_OK; k++) {
            if ((rc = dl_barrier(comm)) != DL_OK)
                break;
            double t0 = now_s(), tc = -1;
            int done = 0;
            rc = dl_iallreduce(comm, snd, rcv, count, DL_F32, DL_SUM, DL_PURPOSE_GRADS, &rq);
            if (rc != DL_OK)
                break;
            for (int i = 0; i < reps; i++) {
                bu_gemm_one(&lg.s[0], &gb);
                /* completion is seen between GEMMs: the comm time is exact to one GEMM */
                if (!done && dl_test(rq, &done) == DL_OK && done)
                    tc = now_s() - t0;
            }
            double tg = now_s() - t0;
            rc = dl_wait(rq);
            if (tc < 0)
                tc = now_s() - t0;
            slot(s, si, M_TC, r)[k] = tc;
            slot(s, si, M_TG, r)[k] = tg;
            slot(s, si, M_TT, r)[k] = tc > tg ? tc : tg;
        }
        /* both, alternating on the rank thread */
        for (int k = 0; k < c->trials && rc == DL_OK; k++) {
            if ((rc = dl_barrier(comm)) != DL_OK)
                break;
            double t0 = now_s();
            for (int i = 0; i < reps / 2; i++) bu_gemm_one(&lg.s[0], &gb);
            double t1 = now_s();
            rc = dl_allreduce(comm, snd, rcv, count, DL_F32, DL_SUM, DL_PURPOSE_GRADS);
            double t2 = now_s();
            for (int i = reps / 2; i < reps; i++) bu_gemm_one(&lg.s[0], &gb);
            double t3 = now_s();
            slot(s, si, M_AC, r)[k] = t2 - t1;
            slot(s, si, M_AG, r)[k] = (t1 - t0) + (t3 - t2);
            slot(s, si, M_AT, r)[k] = t3 - t0;
        }
    }
    bu_gemm_free(&gb);
    free(snd);
    free(rcv);
    return rc;
}

/* slowest rank per trial, median over trials */
static double agg(oshared *s, int si, int m)
{
    int T = s->c->trials;
    double *per = calloc((size_t)T, sizeof *per), v;
    if (!per)
        return NAN;
    for (int k = 0; k < T; k++)
        for (int r = 0; r < s->n; r++)
            if (slot(s, si, m, r)[k] > per[k])
                per[k] = slot(s, si, m, r)[k];
    v = dl__median_copy(per, (size_t)T);
    free(per);
    return v;
}

static void usage(FILE *f)
{
    /* clang-format off */
    fprintf(f,
"Usage: distlab-bench overlap [OPTIONS]\n"
"\n"
"For each size S (64 KiB ... 256 MiB, x4): an f32 sum all-reduce of S bytes alone, a loop of\n"
"DxD sgemms alone (as many as take the all-reduce's time), and both at once: 'thread' = the\n"
"all-reduce on each rank's communication thread (dl_iallreduce) while the rank thread runs\n"
"the GEMMs; 'alternating' = no thread, half the GEMMs, the blocking all-reduce, the rest.\n"
"Times: the slowest rank, median over trials. slowdown = time in the pair / time alone;\n"
"hidden = (comm + gemm - both) / comm, clipped to [0, 1]. comm alone is measured the way the\n"
"mode calls it: through the thread (dl_iallreduce + dl_wait) for 'thread', blocking for\n"
"'alternating'. With the thread, the all-reduce's completion is seen between GEMMs, so its\n"
"time is exact to one GEMM.\n"
"\n"
"Options:\n"
"  --ranks N     ranks (default: the machine's PUs, at least 2)\n"
"  --min SIZE    smallest size (default 64K)\n"
"  --max SIZE    largest size (default 256M; --quick 4M)\n"
"  --gemm-dim D  GEMM size of the compute loop (default 64: a few µs, so that\n"
"                the comm completion is seen to within a few µs)\n"
"  --trials N    trials per point (default 5; --quick 3)\n"
"  --quick       sizes 64K ... 4M, 3 trials\n"
"  --csv         CSV rows (machine facts as leading '#' lines)\n"
"  --json        JSON Lines: config, one row per (size, mode), summary (schema distlab/1)\n"
"  --plot FILE   FILE.svg or FILE.png: hidden fraction and slowdowns vs size (gnuplot)\n"
"  -h, --help    this help\n");
    /* clang-format on */
}

static int parse(int argc, char **argv, ocfg *c)
{
    enum { O_RANKS = 256, O_MIN, O_MAX, O_DIM, O_TRIALS };
    static const struct option lo[] = {{"ranks", required_argument, NULL, O_RANKS},
                                       {"min", required_argument, NULL, O_MIN},
                                       {"max", required_argument, NULL, O_MAX},
                                       {"gemm-dim", required_argument, NULL, O_DIM},
                                       {"trials", required_argument, NULL, O_TRIALS},
                                       BU_LONGOPTS_END};
    int opt;
    BU_FOR_EACH_OPT(opt, "overlap", argc, argv, lo, &c->o, usage)
    {
        switch (opt) {
        case O_RANKS:
            if (cli_parse_int("--ranks", optarg, 1, 1024, &c->ranks))
                return -1;
            break;
        case O_MIN:
            if (cli_parse_size("--min", optarg, 4, 1ull << 32, &c->minb))
                return -1;
            break;
        case O_MAX:
            if (cli_parse_size("--max", optarg, 4, 1ull << 32, &c->maxb))
                return -1;
            break;
        case O_DIM:
            if (cli_parse_int("--gemm-dim", optarg, 1, 8192, &c->gemm_dim))
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
    if (!c->minb)
        c->minb = 64 << 10;
    if (!c->maxb)
        c->maxb = c->o.quick ? 4u << 20 : 256u << 20;
    if (c->minb > c->maxb) {
        cli_error("overlap: --min %llu exceeds --max %llu", (unsigned long long)c->minb,
                  (unsigned long long)c->maxb);
        return -1;
    }
    if (!c->trials)
        c->trials = c->o.quick ? 3 : 5;
    if (!c->gemm_dim)
        c->gemm_dim = 64;
    return 0;
}

int bench_overlap_main(int argc, char **argv)
{
    ocfg c;
    memset(&c, 0, sizeof c);
    if (parse(argc, argv, &c))
        return CLI_EXIT_USAGE;
    dl_topo *topo = bu_topo_load("overlap");
    if (topo == NULL)
        return CLI_EXIT_FAIL;
    int pus = dl_topo_real_pus(topo);
    if (!c.ranks)
        c.ranks = pus < 2 ? 2 : pus;
    int over = bu_warn_oversub(c.ranks, pus);

    oshared s = {.c = &c, .n = c.ranks};
    uint64_t sz[40];
    for (uint64_t b = c.minb & ~(uint64_t)3; b <= c.maxb && s.nsizes < 40; b *= 4)
        sz[s.nsizes++] = b;
    s.sizes = sz;
    s.reps = calloc((size_t)s.nsizes, sizeof *s.reps);
    s.t = calloc((size_t)s.nsizes * NM * c.ranks * c.trials, sizeof *s.t);
    if (!s.reps || !s.t) {
        cli_error("overlap: out of memory");
        return CLI_EXIT_FAIL;
    }

    FILE *f = stdout;
    if (c.o.json) {
        bu_json_begin(f, "overlap", "config");
        bu_machine_json(f, topo);
        bu_json_int(f, "ranks", c.ranks);
        bu_json_bool(f, "oversubscribed", over);
        bu_json_int(f, "min_bytes", (long long)s.sizes[0]);
        bu_json_int(f, "max_bytes", (long long)s.sizes[s.nsizes - 1]);
        bu_json_int(f, "gemm_dim", c.gemm_dim);
        bu_json_int(f, "trials", c.trials);
        bu_json_str(f, "dtype", "f32");
        bu_json_bool(f, "quick", c.o.quick);
        bu_json_end(f);
    } else {
        bu_machine_text(f, topo);
        fprintf(f,
                "# overlap: %d ranks%s, f32 sum all-reduce vs a loop of %dx%d sgemms; slowest "
                "rank, median of %d trials\n",
                c.ranks, over ? " (oversubscribed)" : "", c.gemm_dim, c.gemm_dim, c.trials);
    }
    fflush(f);

    dl_world_opts wo;
    dl_world_opts_init(&wo);
    wo.nranks = c.ranks;
    wo.topology = ""; /* pin on the real machine whatever DISTLAB_TOPOLOGY says */
    wo.timeout_s = 0; /* a long GEMM loop on a shared core is not a hang */
    int status = CLI_EXIT_OK;
    if (dl_world_run(&wo, rank_fn, &s) != DL_OK) {
        cli_error("overlap: %s", dl_errmsg());
        status = CLI_EXIT_FAIL;
    }

    if (status == CLI_EXIT_OK && c.o.csv)
        fprintf(f, "size,mode,reps,comm_alone_ms,gemm_alone_ms,comm_ms,gemm_ms,total_ms,"
                   "comm_slowdown,gemm_slowdown,hidden\n");
    else if (status == CLI_EXIT_OK && !c.o.json)
        fprintf(f, "# %10s %-11s %6s %10s %10s %10s %10s %10s %9s %9s %7s\n", "size", "mode",
                "gemms", "comm_ms", "gemm_ms", "comm_both", "gemm_both", "both_ms", "comm_x",
                "gemm_x", "hidden");
    char *dat = NULL;
    size_t datlen = 0;
    FILE *df = c.o.plot && status == CLI_EXIT_OK ? open_memstream(&dat, &datlen) : NULL;
    if (df)
        fprintf(df, "# bytes hidden_thread comm_x_thread gemm_x_thread hidden_alt\n");
    double hid_sum = 0;
    int hid_n = 0;
    for (int si = 0; si < s.nsizes && status == CLI_EXIT_OK; si++) {
        double tcs[2] = {agg(&s, si, M_C), agg(&s, si, M_CB)}, tg = agg(&s, si, M_G);
        double hid[2] = {NAN, NAN};
        bu_overlap ov[2];
        for (int mode = 0; mode < 2; mode++) {
            int b = mode == 0 ? M_TC : M_AC;
            double tc = tcs[mode];
            double c2 = agg(&s, si, b), g2 = agg(&s, si, b + 1), tt = agg(&s, si, b + 2);
            bu_overlap o = bu_overlap_calc(tc, tg, c2, g2, tt);
            ov[mode] = o;
            hid[mode] = o.hidden;
            const char *mname = mode == 0 ? "thread" : "alternating";
            if (c.o.json) {
                bu_json_begin(f, "overlap", "row");
                bu_json_int(f, "size_bytes", (long long)s.sizes[si]);
                bu_json_str(f, "mode", mname);
                bu_json_int(f, "gemms", s.reps[si]);
                bu_json_num(f, "comm_alone_ms", tc * 1e3);
                bu_json_num(f, "gemm_alone_ms", tg * 1e3);
                bu_json_num(f, "comm_ms", c2 * 1e3);
                bu_json_num(f, "gemm_ms", g2 * 1e3);
                bu_json_num(f, "total_ms", tt * 1e3);
                bu_json_num(f, "comm_slowdown", o.comm_slowdown);
                bu_json_num(f, "gemm_slowdown", o.comp_slowdown);
                bu_json_num(f, "hidden", o.hidden);
                bu_json_end(f);
            } else if (c.o.csv) {
                fprintf(f, "%llu,%s,%d,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f\n",
                        (unsigned long long)s.sizes[si], mname, s.reps[si], tc * 1e3, tg * 1e3,
                        c2 * 1e3, g2 * 1e3, tt * 1e3, o.comm_slowdown, o.comp_slowdown, o.hidden);
            } else {
                fprintf(f,
                        "  %10llu %-11s %6d %10.3f %10.3f %10.3f %10.3f %10.3f %8.2fx %8.2fx "
                        "%6.0f%%\n",
                        (unsigned long long)s.sizes[si], mname, s.reps[si], tc * 1e3, tg * 1e3,
                        c2 * 1e3, g2 * 1e3, tt * 1e3, o.comm_slowdown, o.comp_slowdown,
                        100 * o.hidden);
            }
        }
        if (isfinite(hid[0])) {
            hid_sum += hid[0];
            hid_n++;
        }
        if (df)
            fprintf(df, "%llu %.6g %.6g %.6g %.6g\n", (unsigned long long)s.sizes[si], hid[0],
                    ov[0].comm_slowdown, ov[0].comp_slowdown, hid[1]);
    }
    fflush(f);
    if (c.o.json) {
        bu_json_begin(f, "overlap", "summary");
        bu_json_num(f, "mean_hidden_thread", hid_n ? hid_sum / hid_n : NAN);
        bu_json_int(f, "sizes", s.nsizes);
        bu_json_str(f, "status", status == CLI_EXIT_OK ? "ok" : "failed");
        bu_json_end(f);
    } else if (!c.o.csv && status == CLI_EXIT_OK) {
        fprintf(f, "# communication hidden with the thread, mean over sizes: %.0f%%\n",
                hid_n ? 100 * hid_sum / hid_n : NAN);
    }
    if (df) {
        fclose(df);
        if (bu_plot(c.o.plot, dat,
                    "set title 'distlab-bench overlap: all-reduce vs GEMMs'\n"
                    "set logscale x 2\nset xlabel 'all-reduce bytes'\nset format x '%.0b%B'\n"
                    "set ylabel 'fraction hidden'\nset yrange [0:1.05]\n"
                    "set y2label 'slowdown (x)'\nset y2tics\nset ytics nomirror\nset y2range "
                    "[0:*]\n"
                    "plot datafile using 1:2 with linespoints title 'hidden (thread)', \\\n"
                    "     datafile using 1:5 with linespoints title 'hidden (alternating)', \\\n"
                    "     datafile using 1:3 axes x1y2 with linespoints title 'comm slowdown', \\\n"
                    "     datafile using 1:4 axes x1y2 with linespoints title 'GEMM slowdown'\n") !=
            0)
            status = CLI_EXIT_FAIL;
        free(dat);
    }
    free(s.reps);
    free(s.t);
    dl_topo_destroy(topo);
    return status;
}
