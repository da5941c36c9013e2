/* distlab-bench overhead: the harness's own cost (issue 8: "under 1% of a training step, measured
 * as events per step x the cost of one event"). Measures, on one thread, with many repetitions
 * (median of batches): dl_now_ns(), dl_trace_add with given timestamps, one traced event as the
 * engine records it (dl_trace_begin + dl_trace_end: two clock reads and an add), and the channels'
 * counter-update pattern (a clock read pair and three adds). Counts the events one rank records
 * per step of the trainer's default model, as the trainer runs it (one stage) and as a pipeline
 * stage would (F, B, two sends, two receive waits per micro-batch; optimizer step, gradient
 * buckets, the step itself), and relates them to the step's time: measured with one rank and a
 * couple of steps of dl_train_run, or given with --step-ms. */
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

typedef struct ocfg {
    double step_ms; /* 0: measure */
    int pp, m, batches, reps;
    bu_common o;
} ocfg;

static void usage(FILE *f)
{
    /* clang-format off */
    fprintf(f,
"Usage: distlab-bench overhead [OPTIONS]\n"
"\n"
"The harness's own overhead per training step: events per step x the cost of one event.\n"
"Costs (one thread, median of batches of repetitions): dl_now_ns(); dl_trace_add with given\n"
"timestamps; one traced event (dl_trace_begin + dl_trace_end: two clock reads and an add); a\n"
"channel counter update (clock pair, three adds). Events per step of one rank, for the trainer's\n"
"default model: as it runs now (one stage: F and B per micro-batch, optimizer step, gradient\n"
"buckets, step) and as a pipeline stage (F, B, 2 sends, 2 receive waits per micro-batch), with\n"
"one counter update charged per event. The step time is measured with one rank over 2 steps of\n"
"the default trainer (or --step-ms); a pipeline stage's step is estimated as step x (m+p-1)/(m p).\n"
"PASS when every scenario's overhead is under 1%% of its step.\n"
"\n"
"Options:\n"
"  --step-ms MS      one-rank step time in ms (default: measure it)\n"
"  --pp P            pipeline stages of the pipeline scenario (default 4)\n"
"  --microbatches M  micro-batches of the pipeline scenario (default 8)\n"
"  --batches N       batches per cost (default 11; --quick 5); the median is reported\n"
"  --reps N          repetitions per batch (default 200000; --quick 20000)\n"
"  --quick           fewer batches and repetitions\n"
"  --csv             CSV rows, one per scenario (machine facts as leading '#' lines)\n"
"  --json            JSON Lines: config, a row per cost and per scenario, summary (schema distlab/1)\n"
"  -h, --help        this help\n");
    /* clang-format on */
}

static int parse(int argc, char **argv, ocfg *c)
{
    enum { O_STEP = 256, O_PP, O_M, O_BATCHES, O_REPS };
    static const struct option lo[] = {{"step-ms", required_argument, NULL, O_STEP},
                                       {"pp", required_argument, NULL, O_PP},
                                       {"microbatches", required_argument, NULL, O_M},
                                       {"batches", required_argument, NULL, O_BATCHES},
                                       {"reps", required_argument, NULL, O_REPS},
                                       BU_LONGOPTS_END_NOPLOT};
    int opt;
    BU_FOR_EACH_OPT(opt, "overhead", argc, argv, lo, &c->o, usage)
    {
        switch (opt) {
        case O_STEP:
            if (cli_parse_double("--step-ms", optarg, 1e-6, 1e9, &c->step_ms))
                return -1;
            break;
        case O_PP:
            if (cli_parse_int("--pp", optarg, 1, 1024, &c->pp))
                return -1;
            break;
        case O_M:
            if (cli_parse_int("--microbatches", optarg, 1, 1 << 20, &c->m))
                return -1;
            break;
        case O_BATCHES:
            if (cli_parse_int("--batches", optarg, 1, 1000, &c->batches))
                return -1;
            break;
        case O_REPS:
            if (cli_parse_int("--reps", optarg, 1, 100000000, &c->reps))
                return -1;
            break;
        }
    }
    if (opt < 0)
        return -1;
    if (!c->pp)
        c->pp = 4;
    if (!c->m)
        c->m = 8;
    if (!c->batches)
        c->batches = c->o.quick ? 5 : 11;
    if (!c->reps)
        c->reps = c->o.quick ? 20000 : 200000;
    return 0;
}

/* ---- the costs ---- */

enum { OP_NOW, OP_ADD, OP_EVENT, OP_COUNTER, NOPS };
static const char *const op_name[NOPS] = {"dl_now_ns", "dl_trace_add", "event", "counter"};
static const char *const op_desc[NOPS] = {"dl_now_ns()", "dl_trace_add (given times)",
                                          "event (begin + end: 2 clocks + add)",
                                          "channel counter update"};

typedef struct cost {
    double med, min, max; /* ns per operation over batches */
} cost;

/* The counters a link keeps (lib/transport/chan.c updates them this way around each copy). */
typedef struct fake_stats {
    uint64_t bytes_sent, msgs_sent, copy_ns;
} fake_stats;

static volatile uint64_t sink;

/* One batch of `reps` operations of kind `op`; ns per operation. */
static double batch(int op, int reps, dl_trace *t)
{
    uint64_t s = 0;
    fake_stats st = {0, 0, 0};
    dl_trace_clear(t);
    uint64_t t0 = dl_now_ns();
    switch (op) {
    case OP_NOW:
        for (int i = 0; i < reps; i++) s += dl_now_ns();
        break;
    case OP_ADD:
        for (int i = 0; i < reps; i++)
            dl_trace_add(t, 0, i & 1, 1, i, 0, (uint64_t)i, (uint64_t)i + 1);
        break;
    case OP_EVENT:
        for (int i = 0; i < reps; i++) {
            uint64_t a = dl_trace_begin(t);
            dl_trace_end(t, 0, DL_TR_FWD, 1, i, 0, a);
        }
        break;
    default:
        for (int i = 0; i < reps; i++) {
            uint64_t a = dl_now_ns();
            st.copy_ns += dl_now_ns() - a;
            st.bytes_sent += 64;
            st.msgs_sent++;
            /* keep the struct in memory, as the link's is */
            __asm__ __volatile__("" : : "r"(&st) : "memory");
        }
        s += st.copy_ns + st.bytes_sent + st.msgs_sent;
        break;
    }
    uint64_t t1 = dl_now_ns();
    sink += s;
    return (double)(t1 - t0) / reps;
}

static void measure(const ocfg *c, dl_trace *t, cost out[NOPS])
{
    double *v = malloc((size_t)c->batches * sizeof *v);
    for (int op = 0; op < NOPS; op++) {
        batch(op, c->reps, t); /* warm up (and first-touch the trace's pages) */
        double mn = INFINITY, mx = 0;
        for (int b = 0; b < c->batches; b++) {
            v[b] = batch(op, c->reps, t);
            mn = fmin(mn, v[b]);
            mx = fmax(mx, v[b]);
        }
        out[op].med = dl__median_copy(v, (size_t)c->batches);
        out[op].min = mn;
        out[op].max = mx;
    }
    free(v);
}

/* ---- the step ---- */

typedef struct scen {
    const char *name;
    int pp, m;
    long events, counters;
    double step_ms, overhead_us, overhead_pct;
} scen;

/* One-rank step of the default trainer: median of the steps after the first (2 steps: the 2nd). */
static int measure_step(const dl_train_opts *base, double *ms)
{
    dl_train_opts o = *base;
    o.optim.steps = 2;
    o.optim.warmup = 1;
    o.eval.windows = 1;
    o.output.log_every = 0;
    o.output.log = NULL;
    dl_train_result r;
    int rc = dl_train_run(&o, &r);
    if (rc == DL_OK) {
        double v[16];
        int n = 0;
        for (int i = 1; i < r.nsteps && n < 16; i++) v[n++] = r.steps[i].ms;
        *ms = n ? dl__median_copy(v, (size_t)n) : r.speed.ms_per_step;
    }
    dl_train_result_free(&r);
    return rc;
}

int bench_overhead_main(int argc, char **argv)
{
    ocfg c;
    memset(&c, 0, sizeof c);
    if (parse(argc, argv, &c))
        return CLI_EXIT_USAGE;
    dl_topo *topo = bu_topo_load("overhead");
    if (topo == NULL)
        return CLI_EXIT_FAIL;
    /* the trainer's defaults, resolved as distlab-train would on one rank */
    dl_train_opts to;
    dl_train_opts_init(&to);
    if (dl_train_resolve(&to, 1) != DL_OK) {
        cli_error("overhead: the trainer's defaults do not resolve: %s", dl_errmsg());
        dl_topo_destroy(topo);
        return CLI_EXIT_FAIL;
    }
    dl_gpt_layout *lay = NULL;
    if (dl_gpt_layout_create(&to.model, 1, 0, &lay) != DL_OK) {
        cli_error("overhead: %s", dl_errmsg());
        dl_topo_destroy(topo);
        return CLI_EXIT_FAIL;
    }
    size_t nparams = lay->numel;
    dl_gpt_layout_destroy(lay);
    size_t bucket_elems = (size_t)(to.comm.bucket_mb * 1048576.0 / 4.0);
    long buckets =
        bucket_elems ? (long)((nparams + bucket_elems - 1) / bucket_elems) : to.model.layers + 1;

    dl_trace *t = NULL;
    if (dl_trace_create(1, (size_t)c.reps, &t) != DL_OK) {
        cli_error("overhead: %s", dl_errmsg());
        dl_topo_destroy(topo);
        return CLI_EXIT_FAIL;
    }
    cost k[NOPS];
    measure(&c, t, k);
    dl_trace_destroy(t);

    const char *step_src = "given";
    double step_ms = c.step_ms;
    if (step_ms <= 0) {
        step_src = "measured";
        if (measure_step(&to, &step_ms) != DL_OK) {
            cli_error("overhead: measuring a step of the default trainer failed: %s (give "
                      "--step-ms)",
                      dl_errmsg());
            dl_topo_destroy(topo);
            return CLI_EXIT_FAIL;
        }
    }

    /* the scenarios: events one rank records per step */
    scen sc[2];
    sc[0] = (scen){.name = "trainer", .pp = 1, .m = to.batch.microbatches};
    sc[0].events = 2L * sc[0].m + 1 + buckets + 1;
    sc[0].step_ms = step_ms;
    sc[1] = (scen){.name = "pipeline", .pp = c.pp, .m = c.m};
    sc[1].events = (c.pp > 1 ? 6L : 2L) * c.m + 1 + buckets + 1;
    sc[1].step_ms = step_ms * (double)(c.m + c.pp - 1) / ((double)c.m * c.pp);
    double per_event = k[OP_EVENT].med + k[OP_COUNTER].med, worst = 0;
    for (int i = 0; i < 2; i++) {
        sc[i].counters = sc[i].events;
        sc[i].overhead_us = (double)sc[i].events * per_event / 1e3;
        sc[i].overhead_pct = 100.0 * sc[i].overhead_us / (sc[i].step_ms * 1e3);
        worst = fmax(worst, sc[i].overhead_pct);
    }
    int pass = worst < 1.0;

    FILE *f = stdout;
    if (c.o.json) {
        bu_json_begin(f, "overhead", "config");
        bu_machine_json(f, topo);
        bu_json_int(f, "batches", c.batches);
        bu_json_int(f, "reps", c.reps);
        bu_json_bool(f, "quick", c.o.quick);
        bu_json_int(f, "layers", to.model.layers);
        bu_json_int(f, "d_model", to.model.d_model);
        bu_json_int(f, "heads", to.model.heads);
        bu_json_int(f, "seq", to.model.seq);
        bu_json_int(f, "global_batch", to.batch.global);
        bu_json_int(f, "params", (long long)nparams);
        bu_json_int(f, "grad_buckets", buckets);
        bu_json_end(f);
        for (int op = 0; op < NOPS; op++) {
            bu_json_begin(f, "overhead", "row");
            bu_json_str(f, "row_kind", "cost");
            bu_json_str(f, "op", op_name[op]);
            bu_json_num(f, "ns_median", k[op].med);
            bu_json_num(f, "ns_min", k[op].min);
            bu_json_num(f, "ns_max", k[op].max);
            bu_json_end(f);
        }
        for (int i = 0; i < 2; i++) {
            bu_json_begin(f, "overhead", "row");
            bu_json_str(f, "row_kind", "scenario");
            bu_json_str(f, "scenario", sc[i].name);
            bu_json_int(f, "pp", sc[i].pp);
            bu_json_int(f, "microbatches", sc[i].m);
            bu_json_int(f, "events_per_step", sc[i].events);
            bu_json_int(f, "counter_updates_per_step", sc[i].counters);
            bu_json_num(f, "step_ms", sc[i].step_ms);
            bu_json_num(f, "overhead_us", sc[i].overhead_us);
            bu_json_num(f, "overhead_pct", sc[i].overhead_pct);
            bu_json_end(f);
        }
        bu_json_begin(f, "overhead", "summary");
        bu_json_num(f, "event_ns", k[OP_EVENT].med);
        bu_json_num(f, "counter_ns", k[OP_COUNTER].med);
        bu_json_num(f, "step_ms", step_ms);
        bu_json_str(f, "step_source", step_src);
        bu_json_num(f, "worst_overhead_pct", worst);
        bu_json_num(f, "goal_pct", 1.0);
        bu_json_bool(f, "pass", pass);
        bu_json_str(f, "status", "ok");
        bu_json_end(f);
    } else if (c.o.csv) {
        bu_machine_text(f, topo);
        fprintf(f, "scenario,pp,microbatches,events_per_step,counter_updates_per_step,step_ms,"
                   "now_ns,add_ns,event_ns,counter_ns,overhead_us,overhead_pct,pass\n");
        for (int i = 0; i < 2; i++)
            fprintf(f, "%s,%d,%d,%ld,%ld,%.4f,%.2f,%.2f,%.2f,%.2f,%.3f,%.5f,%d\n", sc[i].name,
                    sc[i].pp, sc[i].m, sc[i].events, sc[i].counters, sc[i].step_ms, k[OP_NOW].med,
                    k[OP_ADD].med, k[OP_EVENT].med, k[OP_COUNTER].med, sc[i].overhead_us,
                    sc[i].overhead_pct, sc[i].overhead_pct < 1.0);
    } else {
        bu_machine_text(f, topo);
        fprintf(f, "# overhead: one thread, median of %d batches of %d repetitions\n", c.batches,
                c.reps);
        fprintf(f, "# %-38s %9s %9s %9s\n", "cost", "ns (med)", "min", "max");
        for (int op = 0; op < NOPS; op++)
            fprintf(f, "  %-38s %9.2f %9.2f %9.2f\n", op_desc[op], k[op].med, k[op].min, k[op].max);
        fprintf(f,
                "# step: %.3f ms (%s; default trainer: %d layers, d-model %d, %d heads, seq %d, "
                "batch %d, 1 rank), %zu parameters, %ld gradient bucket%s of %.3g MiB\n",
                step_ms, step_src, to.model.layers, to.model.d_model, to.model.heads, to.model.seq,
                to.batch.global, nparams, buckets, buckets == 1 ? "" : "s", to.comm.bucket_mb);
        fprintf(f, "# %-9s %3s %4s %12s %9s %12s %11s\n", "scenario", "pp", "m", "events/step",
                "step ms", "overhead us", "overhead %");
        for (int i = 0; i < 2; i++)
            fprintf(f, "  %-9s %3d %4d %12ld %9.3f %12.3f %10.4f%%\n", sc[i].name, sc[i].pp,
                    sc[i].m, sc[i].events, sc[i].step_ms, sc[i].overhead_us, sc[i].overhead_pct);
        fprintf(f,
                "# harness overhead goal < 1%% of a step (events x (event + counter update)): %s "
                "(worst %.4f%%)\n",
                pass ? "PASS" : "FAIL", worst);
    }
    dl_topo_destroy(topo);
    return CLI_EXIT_OK;
}
