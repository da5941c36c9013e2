/* distlab-bench pipeline: measured pipeline bubbles (issue 4, "Measured bubbles"; issue 8).
 *
 * Sweeps schedules (gpipe, 1f1b, interleaved, async), stages p and micro-batches m. Each
 * configuration runs a few steps of the pipeline engine (lib/parallel/pipe.c) on a world of p rank threads
 * with real hand-offs of --handoff-kb through the channels, and work inside the forward and
 * backward callbacks that is either emulated (sleep: clock_nanosleep to an absolute deadline
 * computed from the callback's start; spin: busy-waiting on the clock) or the real GPT stages of
 * the trainer (model: dl_train_run with pp > 1). Reported per configuration: the measured bubble
 * per stage and in total (from dl_pipe_stats: 1 - busy / wall; and from the trace,
 * dl_trace_bubble), the lecture's (p-1)/(v m + p-1), the simulator's (dl_sched_simulate with costs
 * f = fwd, b = bwd), the engine's own overhead per action (median of engine_ns / actions), the
 * simulator's peak activation slots per stage; ranks exceeding the cores are flagged.
 *
 * A separate microbenchmark measures the engine's overhead per action with nothing to compute:
 * 1F1B on p <= cores stages, 64 KiB hand-offs (--handoff-kb), the receiver waiting actively
 * (wait mode spin): per step and stage the step's wall time / actions (dispatch + staging copy +
 * posting + receiving), the median over steps of the slowest stage; goal under 20 us.
 *
 * The bubble arithmetic is in small pure functions (pb_*), checked on synthetic timings by the
 * hidden `distlab-bench pipeline --selftest` (tests/apps/test_bench_harness.sh). */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/prctl.h>
#include "distlab.h"
#include "core/topo.h"
#include "transport/chan.h"
#include "distlab/pipe.h"
#include "distlab/trace.h"
#include "cli.h"
#include "bench_util.h"
#include "trace_plot.h"
#include "bench_pipeline.h"
#include "tera_fit.h"
#include "core/stats.h"

enum { WORK_SLEEP = 0, WORK_SPIN = 1, WORK_MODEL = 2 };
static const char *const work_name[] = {"sleep", "spin", "model"};
enum { MAXL = 16, MAXP = 64 };

typedef struct pcfg {
    int sched[MAXL], nsched;
    int stages[MAXL], nstages;
    int mbs[MAXL], nmbs;
    int v, work, steps, handoff_kb;
    int wait_mode;                   /* the sweep's worlds: -1 auto, DL_WAIT_SPIN, DL_WAIT_YIELD */
    double fwd_ms, bwd_ms, wgrad_ms; /* wgrad_ms < 0: half the backward */
    long timer_slack_ns;    /* per rank thread (prctl); 0: leave the system's default (50 us) */
    long sleep_tail_ns;     /* sleep work: the last part of an action spun, not slept (0: none) */
    int ov, ov_steps, ov_m; /* the overhead microbenchmark: on/off, steps, micro-batches */
    int layers, d_model, seq, micro_batch;  /* --work model */
    int chunks[MAXL], nchunks, chunk_flops; /* TeraPipe: token chunks per sequence, their costs */
    const char *trace, *plot_bubbles, *show, *write_sched;
    int show_sched, show_p, show_m;
    int selftest;
    bu_common o;
} pcfg;

/* ==== the arithmetic (pure; --selftest) ==================================================== */

/* Bubble of one stage: 1 - busy / wall (0 for an empty wall; busy is clamped to wall). */
static double pb_bubble_stage(double busy_ns, double wall_ns)
{
    if (!(wall_ns > 0))
        return 0;
    double b = 1.0 - busy_ns / wall_ns;
    return b < 0 ? 0 : b;
}

/* Total bubble of a step over p stages that ran from t0[s] to t1[s] (absolute ns) with busy[s]:
 * 1 - sum(busy) / (p x span), span = max t1 - min t0 — the lecture's (and the simulator's)
 * definition: every stage is charged the whole step. */
static double pb_bubble_total(const double *busy_ns, const double *t0, const double *t1, int p)
{
    if (p < 1)
        return NAN;
    double lo = t0[0], hi = t1[0], sum = 0;
    for (int s = 0; s < p; s++) {
        lo = fmin(lo, t0[s]);
        hi = fmax(hi, t1[s]);
        sum += busy_ns[s];
    }
    return pb_bubble_stage(sum, (double)p * (hi - lo));
}

/* A comma-separated list of integers in [lo, hi] (at most MAXL); 0 or -1 (message printed). */
static int parse_int_list(const char *what, const char *s, int lo, int hi, int *out, int *n)
{
    char buf[256], *items[MAXL];
    if (cli_split_list(what, s, buf, sizeof buf, items, MAXL, n))
        return -1;
    for (int i = 0; i < *n; i++)
        if (cli_parse_int(what, items[i], lo, hi, &out[i]))
            return -1;
    return 0;
}

/* --token-chunks: counts, or auto (0: TeraPipe's dynamic program chooses) */
static int parse_chunks(const char *s, int *out, int *n)
{
    char buf[256], *items[MAXL];
    if (cli_split_list("--token-chunks", s, buf, sizeof buf, items, MAXL, n))
        return -1;
    for (int i = 0; i < *n; i++)
        if (strcmp(items[i], "auto") == 0)
            out[i] = 0;
        else if (cli_parse_int("--token-chunks", items[i], 1, 4096, &out[i]))
            return -1;
    return 0;
}

static int parse_sched_list(const char *s, int *out, int *n)
{
    char buf[256], *items[MAXL];
    if (cli_split_list("--schedules", s, buf, sizeof buf, items, MAXL, n))
        return -1;
    for (int i = 0; i < *n; i++) {
        const char *tok = items[i];
        dl_sched_kind k;
        if (dl_sched_kind_parse(tok, &k) != DL_OK || k == DL_SCHED_NAIVE ||
            k == DL_SCHED_TERAPIPE) {
            cli_error("--schedules: unknown schedule '%s' (gpipe, 1f1b, interleaved, async, "
                      "1f1b-split, zb-h1, zb-h2, zb-v, dualpipev)",
                      tok);
            return -1;
        }
        out[i] = (int)k;
    }
    return 0;
}

static int selftest(FILE *f)
{
    int ok = 1;
#define CHECK(cond) bu_check(f, "pipeline selftest", (cond) != 0, #cond, __LINE__, &ok)
    /* GPipe p = 4, m = 8, f = 2, b = 4 (ms): busy 48 of a 66 ms step on every stage: 18/66 */
    double busy[4] = {48e6, 48e6, 48e6, 48e6}, t0[4] = {0, 0, 0, 0},
           t1[4] = {66e6, 66e6, 66e6, 66e6};
    CHECK(fabs(pb_bubble_stage(48e6, 66e6) - 3.0 / 11.0) < 1e-12);
    CHECK(fabs(pb_bubble_total(busy, t0, t1, 4) - 3.0 / 11.0) < 1e-12);
    /* stages entering late and leaving early are still charged the whole span */
    double t0b[4] = {1e6, 0, 0.5e6, 0}, t1b[4] = {66e6, 65e6, 67e6, 66e6};
    CHECK(fabs(pb_bubble_total(busy, t0b, t1b, 4) - (1 - 192.0 / (4 * 67))) < 1e-12);
    /* one stage, all busy: no bubble; nothing: none either; busy > wall (clock noise): 0 */
    CHECK(pb_bubble_total(busy, t0, busy, 1) == 0);
    CHECK(pb_bubble_stage(0, 0) == 0);
    CHECK(pb_bubble_stage(2, 1) == 0);
    CHECK(pb_bubble_stage(0, 5) == 1);
    CHECK(isnan(pb_bubble_total(busy, t0, t1, 0)));
    /* deadlines carry into seconds */
    struct timespec ts = bu_deadline(1999999999ull, 2);
    CHECK(ts.tv_sec == 2 && ts.tv_nsec == 1);
    ts = bu_deadline(5000000000ull, 4000000);
    CHECK(ts.tv_sec == 5 && ts.tv_nsec == 4000000);
    /* the lecture's numbers through the schedules' own formula and simulator */
    dl_sched *s = NULL;
    dl_sched_sim *sim = NULL;
    dl_sched_costs k = {2, 4, 0, -1};
    CHECK(dl_sched_gpipe(4, 8, &s) == DL_OK && dl_sched_simulate(s, &k, &sim) == DL_OK);
    if (sim) {
        CHECK(fabs(dl_sched_bubble_formula(s) - 3.0 / 11.0) < 1e-12);
        CHECK(fabs(sim->bubble_total - 3.0 / 11.0) < 1e-12 && sim->makespan == 66);
        CHECK(sim->peak_act[0] == 8);
    }
    dl_sched_sim_free(sim);
    dl_sched_free(s);
    s = NULL;
    sim = NULL;
    CHECK(dl_sched_1f1b(4, 8, &s) == DL_OK && dl_sched_simulate(s, &k, &sim) == DL_OK);
    if (sim)
        CHECK(sim->peak_act[0] == 4 && sim->peak_act[3] == 1);
    dl_sched_sim_free(sim);
    dl_sched_free(s);
    int l[MAXL], n = 0;
    CHECK(parse_int_list("x", "2,4", 1, 64, l, &n) == 0 && n == 2 && l[0] == 2 && l[1] == 4);
#undef CHECK
    fprintf(f, ok ? "pipeline selftest: ok\n" : "pipeline selftest: FAILED\n");
    return ok;
}

/* ==== options ============================================================================== */

static void usage(FILE *f)
{
    /* clang-format off */
    fprintf(f,
"Usage: distlab-bench pipeline [OPTIONS]\n"
"\n"
"Measured pipeline bubbles: each configuration (schedule x stages p x micro-batches m) runs\n"
"--steps steps of the pipeline engine on p rank threads with real hand-offs between stages, and\n"
"reports the measured bubble (1 - busy / wall, busy = time inside forward and backward work,\n"
"wall = the step from the first stage's start to the last stage's end, as the simulator\n"
"charges every stage; median over the steps after the first) per stage and in total\n"
"(1 - sum busy / (p x step)), the same from the trace (union of its forward and backward events),\n"
"the lecture's (p-1)/(v m + p-1), the simulator's (costs fwd, bwd) in total and per stage,\n"
"the engine's own time per action, and the peak activation slots each stage holds (simulator;\n"
"the arena's activation bytes with --work model). Ranks exceeding the cores are flagged.\n"
"async runs as one continuous pipeline over the --steps steps (no barrier or flush between\n"
"them; the trainer's async does the same): a stage's step spans from the end of its previous\n"
"step, the total charges every stage the longest span, and the simulator's figure is the\n"
"continuous pipeline's steady state; a line after its row adds the whole run's bubble (one\n"
"warm-up and drain), measured and simulated, 1F1B's simulated for the same p and m, and (sleep\n"
"and spin) the steady state replayed in the simulator with the run's own action times: the\n"
"measured figure less the replay's is what the hand-offs add (JSON run_bubble_pct, run_sim_pct,\n"
"sim_1f1b_pct, replay_pct; the lecture gives no figure for async: lecture_pct null).\n"
"Then an engine overhead microbenchmark: 1F1B on p <= cores stages, forward and backward doing\n"
"nothing, --handoff-kb hand-offs, receivers waiting actively (wait mode spin): per step and\n"
"stage, wall / actions; the median over steps of the slowest stage (goal: under 20 us).\n"
"\n"
"Options:\n"
"  --schedules LIST     of gpipe, 1f1b, interleaved, async, and the split-backward 1f1b-split,\n"
"                       zb-h1, zb-h2, zb-v, dualpipev (m >= 2p) (default: the first four)\n"
"  --stages LIST        pipeline stages p (default 2,4)\n"
"  --microbatches LIST  micro-batches per step m (default 1,4,8; interleaved needs m a\n"
"                       multiple of p, other configurations are skipped)\n"
"  --virtual-stages V   model chunks per stage of interleaved (default 2); each chunk's\n"
"                       forward and backward take fwd/V and bwd/V\n"
"  --work KIND          sleep (default): forward and backward sleep to an absolute deadline\n"
"                       (more stages than cores still measure honestly); spin: busy-wait on\n"
"                       the clock (ranks must fit the cores); model: the trainer's real GPT\n"
"                       stages (distlab-train --pp), sizes below\n"
"  --fwd-ms MS          forward time per micro-batch and stage (default 2)\n"
"  --bwd-ms MS          a whole backward's time (default 4); split schedules run it as the\n"
"                       input gradient I (bwd - wgrad) and the weight gradient W (wgrad)\n"
"  --wgrad-ms MS        the weight gradient W's part of --bwd-ms (default: half of it)\n"
"  --handoff-kb KB      activation / gradient hand-off size (default 64)\n"
"  --token-chunks LIST  TeraPipe instead of --schedules: each of m sequences (--microbatches,\n"
"                       default 2; --stages default 4: the lecture's §6.2) cut into c token\n"
"                       chunks for each c listed, a chunk's forward and backward taking 1/c of\n"
"                       --fwd-ms and --bwd-ms (sleep or spin work). auto: TeraPipe's dynamic\n"
"                       program chooses unequal slices from a latency model t(l, ctx) of one\n"
"                       layer (--seq tokens, --d-model, --micro-batch sequences) timed here\n"
"                       (fit and error printed); each slice sleeps its share of the model's\n"
"                       time of the whole sequence (slices' fixed costs included)\n"
"  --chunk-costs KIND   equal (default: the lecture's approximation) or flops: each chunk its\n"
"                       FLOPs share of a --seq-token sequence at width --d-model (later chunks\n"
"                       attend to more keys; the sequence's total unchanged)\n"
"  --steps N            steps per configuration (default 5; --quick 3); the first is a warm-up\n"
"  --wait-mode MODE     how ranks wait for hand-offs in the sweep: auto (default: yield when\n"
"                       ranks exceed the cores), spin (pause, then futex) or yield\n"
"  --timer-slack-ns NS  rank threads' timer slack (prctl; default 1; 0 keeps the system's 50 us)\n"
"  --sleep-tail-us US   sleep work: sleep to US before each action's end and spin the rest\n"
"                       (default 0: sleep it all). A virtual CPU that idles wakes late, now and\n"
"                       then by milliseconds; the spun tail keeps the action's length exact\n"
"                       (docs/PERFORMANCE.md), at the price of US of a core per action\n"
"  --overhead-steps N   steps of the overhead microbenchmark (default 50; --quick 5; 0: skip it)\n"
"  --overhead-m M       its micro-batches per step (default 32; --quick 8)\n"
"  --layers N, --d-model N, --seq N, --micro-batch N\n"
"                       --work model: the GPT (default 8 layers, width 64, 4 heads, context 32,\n"
"                       2 sequences per micro-batch)\n"
"  --show SCHED:P:M     the configuration --trace and --plot show (default: 1f1b, or the first\n"
"                       schedule, with the largest p and m swept)\n"
"  --trace FILE         Chrome trace JSON (Perfetto) of that configuration's steps\n"
"  --write-schedule FILE\n"
"                       that configuration's schedule in torch.distributed.pipelining's CSV\n"
"                       form (a row per rank; distlab-train --schedule-file reads it)\n"
"  --plot FILE          FILE.svg or FILE.png: that configuration's last step as a measured\n"
"                       Gantt chart, one row per stage (sleep and spin; gnuplot)\n"
"  --plot-bubbles FILE  FILE.svg or FILE.png: measured, simulated and lecture bubble per\n"
"                       configuration as bars (gnuplot)\n"
"  --quick              one small configuration (1f1b, p = 2, m = 4, 3 steps) and a short\n"
"                       microbenchmark\n"
"  --csv                CSV rows (row_kind config or overhead; machine facts as '#' lines)\n"
"  --json               JSON Lines: config, a row per configuration and the overhead row,\n"
"                       summary (schema distlab/1)\n"
"  -h, --help           this help\n");
    /* clang-format on */
}

static int parse(int argc, char **argv, pcfg *c)
{
    enum {
        O_SCHED = 256,
        O_STAGES,
        O_MB,
        O_V,
        O_WORK,
        O_FWD,
        O_BWD,
        O_HANDOFF,
        O_STEPS,
        O_SLACK,
        O_TAIL,
        O_OVSTEPS,
        O_OVM,
        O_LAYERS,
        O_DMODEL,
        O_SEQ,
        O_MICRO,
        O_SHOW,
        O_TRACE,
        O_PLOTB,
        O_SELF,
        O_WAIT,
        O_WGRAD,
        O_WSCHED,
        O_CHUNKS,
        O_CCOSTS
    };
    static const struct option lo[] = {{"schedules", required_argument, NULL, O_SCHED},
                                       {"stages", required_argument, NULL, O_STAGES},
                                       {"microbatches", required_argument, NULL, O_MB},
                                       {"virtual-stages", required_argument, NULL, O_V},
                                       {"work", required_argument, NULL, O_WORK},
                                       {"fwd-ms", required_argument, NULL, O_FWD},
                                       {"bwd-ms", required_argument, NULL, O_BWD},
                                       {"handoff-kb", required_argument, NULL, O_HANDOFF},
                                       {"steps", required_argument, NULL, O_STEPS},
                                       {"timer-slack-ns", required_argument, NULL, O_SLACK},
                                       {"sleep-tail-us", required_argument, NULL, O_TAIL},
                                       {"overhead-steps", required_argument, NULL, O_OVSTEPS},
                                       {"overhead-m", required_argument, NULL, O_OVM},
                                       {"layers", required_argument, NULL, O_LAYERS},
                                       {"d-model", required_argument, NULL, O_DMODEL},
                                       {"seq", required_argument, NULL, O_SEQ},
                                       {"micro-batch", required_argument, NULL, O_MICRO},
                                       {"show", required_argument, NULL, O_SHOW},
                                       {"trace", required_argument, NULL, O_TRACE},
                                       {"plot-bubbles", required_argument, NULL, O_PLOTB},
                                       {"selftest", no_argument, NULL, O_SELF},
                                       {"wait-mode", required_argument, NULL, O_WAIT},
                                       {"wgrad-ms", required_argument, NULL, O_WGRAD},
                                       {"write-schedule", required_argument, NULL, O_WSCHED},
                                       {"token-chunks", required_argument, NULL, O_CHUNKS},
                                       {"chunk-costs", required_argument, NULL, O_CCOSTS},
                                       BU_LONGOPTS_END};
    int opt, tail = 0, slack = -1, sched_set = 0, stages_set = 0, mb_set = 0, ovs = -1;
    opterr = 0;
    optind = 1;
    c->v = 2;
    c->fwd_ms = 2;
    c->bwd_ms = 4;
    c->wgrad_ms = -1;
    c->handoff_kb = 64;
    c->wait_mode = -1;
    while ((opt = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (opt) {
        case O_SCHED:
            if (parse_sched_list(optarg, c->sched, &c->nsched))
                return -1;
            sched_set = 1;
            break;
        case O_STAGES:
            if (parse_int_list("--stages", optarg, 1, MAXP, c->stages, &c->nstages))
                return -1;
            stages_set = 1;
            break;
        case O_MB:
            if (parse_int_list("--microbatches", optarg, 1, 4096, c->mbs, &c->nmbs))
                return -1;
            mb_set = 1;
            break;
        case O_V:
            if (cli_parse_int("--virtual-stages", optarg, 1, 64, &c->v))
                return -1;
            break;
        case O_WORK:
            if (strcmp(optarg, "sleep") == 0)
                c->work = WORK_SLEEP;
            else if (strcmp(optarg, "spin") == 0)
                c->work = WORK_SPIN;
            else if (strcmp(optarg, "model") == 0)
                c->work = WORK_MODEL;
            else {
                cli_error("--work: '%s' is not sleep, spin or model", optarg);
                return -1;
            }
            break;
        case O_FWD:
            if (cli_parse_double("--fwd-ms", optarg, 0, 1e5, &c->fwd_ms))
                return -1;
            break;
        case O_BWD:
            if (cli_parse_double("--bwd-ms", optarg, 0, 1e5, &c->bwd_ms))
                return -1;
            break;
        case O_WSCHED:
            c->write_sched = optarg;
            if (cli_check_output("--write-schedule", optarg))
                return -1;
            break;
        case O_WGRAD:
            if (cli_parse_double("--wgrad-ms", optarg, 0, 1e5, &c->wgrad_ms))
                return -1;
            break;
        case O_CHUNKS:
            if (parse_chunks(optarg, c->chunks, &c->nchunks))
                return -1;
            break;
        case O_CCOSTS:
            if (strcmp(optarg, "equal") && strcmp(optarg, "flops")) {
                cli_error("--chunk-costs: '%s' is not equal or flops", optarg);
                return -1;
            }
            c->chunk_flops = strcmp(optarg, "flops") == 0;
            break;
        case O_HANDOFF:
            if (cli_parse_int("--handoff-kb", optarg, 1, 1 << 20, &c->handoff_kb))
                return -1;
            break;
        case O_STEPS:
            if (cli_parse_int("--steps", optarg, 1, 100000, &c->steps))
                return -1;
            break;
        case O_SLACK:
            if (cli_parse_int("--timer-slack-ns", optarg, 0, 1000000000, &slack))
                return -1;
            break;
        case O_TAIL:
            if (cli_parse_int("--sleep-tail-us", optarg, 0, 1000000, &tail))
                return -1;
            break;
        case O_OVSTEPS:
            if (cli_parse_int("--overhead-steps", optarg, 0, 1000000, &ovs))
                return -1;
            break;
        case O_OVM:
            if (cli_parse_int("--overhead-m", optarg, 1, 100000, &c->ov_m))
                return -1;
            break;
        case O_LAYERS:
            if (cli_parse_int("--layers", optarg, 1, 4096, &c->layers))
                return -1;
            break;
        case O_DMODEL:
            if (cli_parse_int("--d-model", optarg, 4, 65536, &c->d_model))
                return -1;
            break;
        case O_SEQ:
            if (cli_parse_int("--seq", optarg, 1, 65536, &c->seq))
                return -1;
            break;
        case O_MICRO:
            if (cli_parse_int("--micro-batch", optarg, 1, 65536, &c->micro_batch))
                return -1;
            break;
        case O_SHOW: c->show = optarg; break;
        case O_TRACE:
            c->trace = optarg;
            if (cli_check_output("--trace", optarg))
                return -1;
            cli_remove_tmp_on_signal(optarg);
            break;
        case O_PLOTB:
            c->plot_bubbles = optarg;
            if (bu_plot_check(optarg))
                return -1;
            break;
        case O_SELF: c->selftest = 1; break;
        case O_WAIT:
            if (strcmp(optarg, "auto") == 0)
                c->wait_mode = -1;
            else if (strcmp(optarg, "spin") == 0)
                c->wait_mode = DL_WAIT_SPIN;
            else if (strcmp(optarg, "yield") == 0)
                c->wait_mode = DL_WAIT_YIELD;
            else {
                cli_error("--wait-mode: '%s' is not auto, spin or yield", optarg);
                return -1;
            }
            break;
        default:
            if (bu_common_opt("pipeline", opt, argv, lo, &c->o, usage))
                return -1;
        }
    }
    if (bu_common_done("pipeline", argc, argv, &c->o))
        return -1;
    if (c->o.quick) {
        if (!sched_set) {
            c->sched[0] = DL_SCHED_1F1B;
            c->nsched = 1;
        }
        if (!stages_set) {
            c->stages[0] = 2;
            c->nstages = 1;
        }
        if (!mb_set) {
            c->mbs[0] = 4;
            c->nmbs = 1;
        }
    }
    if (c->chunk_flops && !c->nchunks) {
        cli_error("--chunk-costs: the chunks' costs need --token-chunks");
        return -1;
    }
    if (c->nchunks && (sched_set || c->work == WORK_MODEL)) {
        cli_error("--token-chunks sweeps TeraPipe's schedule with --work sleep or spin (%s)",
                  sched_set
                      ? "leave out --schedules"
                      : "the real model's token slices: distlab-train --pp P --token-chunks C");
        return -1;
    }
    if (c->nchunks) { /* the lecture's §6.2 unless told: 2 sequences, 4 stages */
        c->sched[0] = DL_SCHED_TERAPIPE;
        c->nsched = 1;
        if (!stages_set)
            c->stages[0] = 4, c->nstages = 1;
        if (!mb_set)
            c->mbs[0] = 2, c->nmbs = 1;
    } else
        c->chunks[0] = 1, c->nchunks = 1;
    if (!c->nsched) {
        c->sched[0] = DL_SCHED_GPIPE;
        c->sched[1] = DL_SCHED_1F1B;
        c->sched[2] = DL_SCHED_INTERLEAVED;
        c->sched[3] = DL_SCHED_ASYNC;
        c->nsched = 4;
    }
    if (!c->nstages) {
        c->stages[0] = 2;
        c->stages[1] = 4;
        c->nstages = 2;
    }
    if (!c->nmbs) {
        c->mbs[0] = 1;
        c->mbs[1] = 4;
        c->mbs[2] = 8;
        c->nmbs = 3;
    }
    if (!c->steps)
        c->steps = c->o.quick ? 3 : 5;
    c->timer_slack_ns = slack < 0 ? 1 : slack;
    c->sleep_tail_ns = 1000L * tail;
    c->ov_steps = ovs >= 0 ? ovs : c->o.quick ? 5 : 50;
    if (!c->ov_m)
        c->ov_m = c->o.quick ? 8 : 32;
    if (!c->layers)
        c->layers = 8;
    if (!c->d_model)
        c->d_model = 64;
    if (!c->seq)
        c->seq = 32;
    if (!c->micro_batch)
        c->micro_batch = 2;
    if (c->wgrad_ms > c->bwd_ms) {
        cli_error("--wgrad-ms %g: the weight gradient is part of the backward (--bwd-ms %g)",
                  c->wgrad_ms, c->bwd_ms);
        return -1;
    }
    if (c->d_model % 4) {
        cli_error("--d-model: %d is not a multiple of the 4 heads", c->d_model);
        return -1;
    }
    if (c->o.plot && bu_plot_check(c->o.plot))
        return -1;
    if (c->o.plot && c->work == WORK_MODEL) {
        cli_error("--plot draws the engine's trace of --work sleep or spin; with --work model use "
                  "--trace (Perfetto) or --plot-bubbles");
        return -1;
    }
    /* the configuration shown: given, or 1f1b (else the first schedule) at the largest p and m */
    int maxp = 0, maxm = 0;
    for (int i = 0; i < c->nstages; i++) maxp = c->stages[i] > maxp ? c->stages[i] : maxp;
    for (int i = 0; i < c->nmbs; i++) maxm = c->mbs[i] > maxm ? c->mbs[i] : maxm;
    c->show_sched = c->sched[0];
    for (int i = 0; i < c->nsched; i++)
        if (c->sched[i] == DL_SCHED_1F1B)
            c->show_sched = DL_SCHED_1F1B;
    c->show_p = maxp;
    c->show_m = maxm;
    if (c->show) {
        char name[32];
        dl_sched_kind k;
        if (sscanf(c->show, "%31[^:]:%d:%d", name, &c->show_p, &c->show_m) != 3 ||
            dl_sched_kind_parse(name, &k) != DL_OK) {
            cli_error("--show: '%s' is not SCHED:P:M (e.g. 1f1b:4:8)", c->show);
            return -1;
        }
        c->show_sched = (int)k;
        int found = 0;
        for (int i = 0; i < c->nsched; i++) found |= c->sched[i] == (int)k;
        int fp = 0, fm = 0;
        for (int i = 0; i < c->nstages; i++) fp |= c->stages[i] == c->show_p;
        for (int i = 0; i < c->nmbs; i++) fm |= c->mbs[i] == c->show_m;
        if (!found || !fp || !fm) {
            cli_error("--show: %s is not among the configurations swept", c->show);
            return -1;
        }
    }
    return 0;
}

/* ==== one configuration on the engine (sleep / spin / nothing) ============================= */

typedef struct prun {
    const dl_sched *s;
    int work;            /* WORK_SLEEP, WORK_SPIN, or -1: nothing (the microbenchmark) */
    uint64_t f_ns, b_ns; /* per action (per chunk when interleaved) */
    uint64_t w_ns;       /* of b_ns, a split backward's W (its I takes the rest) */
    const double *scale; /* per micro-batch factor of its work (TeraPipe's chunks), NULL: 1 */
    size_t count;        /* hand-off elements (f32) */
    int steps;
    int cont; /* async: one continuous pipeline over the steps (dl_sched_async_step slices) */
    long slack_ns;
    uint64_t tail_ns; /* sleep work: spun, not slept, at each action's end */
    dl_trace *tr;
    /* out, [step * p + stage] */
    dl_pipe_stats *st;
    double *t0, *t1;
    int peak_slots[MAXP]; /* the arena's peak of activation slots per stage (all steps) */
    double *times[MAXP];  /* cont: each stage's F and B callbacks' own times (ns), in order */
    int ntimes[MAXP], captimes;
} prun;

/* A (micro-batch, chunk)'s activation slot: a page from the arena, held from its F to its B or
 * W, so that the arena's peak counts the slots a schedule holds (against its limit). */
enum { SLOT_BYTES = 4096 };

typedef struct pstage {
    prun *r;
    int stage;
    float *in, *out;
    dl_arena *arena;
    void **slot; /* [mb * v + chunk] */
} pstage;

/* Sleep work sleeps to tail_ns before the action's end and spins the rest: the spin keeps a
 * late wake-up of an idle virtual CPU out of the action's length. */
static void do_work(const prun *r, uint64_t start, uint64_t ns)
{
    if (ns == 0 || r->work < 0)
        return;
    if (r->work == WORK_SLEEP && ns > r->tail_ns)
        bu_sleep_until(start, ns - r->tail_ns);
    if (r->work != WORK_SLEEP || r->tail_ns > 0)
        bu_spin_until(start, ns);
}

/* cont: the action that started at t0 took this long (for the replay, summarise_replay) */
static void note_time(pstage *x, uint64_t t0)
{
    prun *r = x->r;
    if (r->times[x->stage] && r->ntimes[x->stage] < r->captimes)
        r->times[x->stage][r->ntimes[x->stage]++] = (double)(dl_now_ns() - t0);
}

/* micro-batch mb's share of ns */
static uint64_t scaled(const prun *r, int mb, uint64_t ns)
{
    return r->scale ? (uint64_t)llround((double)ns * r->scale[mb]) : ns;
}

static void *cb_fwd_in(void *arg, int mb, int chunk)
{
    (void)mb;
    (void)chunk;
    return ((pstage *)arg)->in;
}
static void *cb_bwd_in(void *arg, int mb, int chunk)
{
    (void)mb;
    (void)chunk;
    return ((pstage *)arg)->in;
}
static void slot_free(pstage *x, int mb, int chunk)
{
    void **sl = &x->slot[mb * x->r->s->v + chunk];
    dl_arena_free(x->arena, *sl);
    *sl = NULL;
}

static int cb_fwd(void *arg, int mb, int chunk, const void **out)
{
    pstage *x = arg;
    uint64_t t = dl_now_ns();
    int rc =
        dl_arena_alloc(x->arena, DL_MEM_ACTIVATIONS, SLOT_BYTES, &x->slot[mb * x->r->s->v + chunk]);
    if (rc)
        return rc;
    do_work(x->r, t, scaled(x->r, mb, x->r->f_ns));
    x->out[0] = (float)mb + (float)chunk;
    note_time(x, t);
    *out = x->out;
    return DL_OK;
}
/* B (split = 0: the whole backward, the slot spent) or its input part I (the slot kept) */
static int bwd_part(pstage *x, int mb, int chunk, const void **din, int split)
{
    uint64_t t = dl_now_ns();
    do_work(x->r, t, scaled(x->r, mb, split ? x->r->b_ns - x->r->w_ns : x->r->b_ns));
    if (!split)
        slot_free(x, mb, chunk);
    x->out[0] = (float)mb - (float)chunk;
    note_time(x, t);
    *din = x->out;
    return DL_OK;
}
static int cb_bwd(void *arg, int mb, int chunk, const void **din)
{
    return bwd_part(arg, mb, chunk, din, 0);
}
static int cb_bwd_input(void *arg, int mb, int chunk, const void **din)
{
    return bwd_part(arg, mb, chunk, din, 1);
}
static int cb_wgrad(void *arg, int mb, int chunk)
{
    pstage *x = arg;
    do_work(x->r, dl_now_ns(), scaled(x->r, mb, x->r->w_ns));
    slot_free(x, mb, chunk);
    return DL_OK;
}

static int stage_fn(dl_ctx *ctx, void *arg)
{
    prun *r = arg;
    int s = dl_ctx_rank(ctx), p = dl_ctx_size(ctx);
    if (r->slack_ns > 0)
        prctl(PR_SET_TIMERSLACK, (unsigned long)r->slack_ns, 0, 0, 0);
    dl_comm *c = dl_ctx_comm(ctx);
    dl_arena *a = dl_ctx_arena(ctx);
    /* continuous: the micro-batches are numbered on over the steps */
    int nmb = r->s->m * r->s->v * (r->cont ? r->steps : 1);
    pstage x = {r, s, NULL, NULL, a, calloc((size_t)nmb, sizeof(void *))};
    dl_pipe *e = NULL;
    if (!x.slot)
        return dl_error(DL_ENOMEM, "out of memory");
    int rc = dl_arena_alloc(a, DL_MEM_ACTIVATIONS, r->count * 4, (void **)&x.in);
    if (rc == DL_OK)
        rc = dl_arena_alloc(a, DL_MEM_ACTIVATIONS, r->count * 4, (void **)&x.out);
    if (rc == DL_OK)
        rc = dl_pipe_create(c, r->count, DL_F32, a, &e);
    if (rc) {
        free(x.slot);
        return rc;
    }
    dl_pipe_ops ops = {cb_fwd_in, cb_fwd, cb_bwd_in, cb_bwd, NULL};
    static const dl_pipe_split_ops split = {cb_bwd_input, cb_wgrad};
    dl_pipe_set_split(e, &split);
    dl_arena_stats as;
    dl_arena_reset_peaks(a);
    dl_arena_get_stats(a, &as);
    uint64_t base = as.current[DL_MEM_ACTIVATIONS];
    for (int k = 0; k < r->steps && rc == DL_OK; k++) {
        /* continuous: no barrier between steps, a step's span from the previous one's end */
        if ((k == 0 || !r->cont) && (rc = dl_barrier(c)))
            break;
        uint64_t t0 = dl_now_ns();
        dl_sched *sl = NULL;
        if (r->cont && (rc = dl_sched_async_step(p, r->s->m, r->steps, k, 0, &sl)))
            break;
        dl_pipe_set_open(e, r->cont && k < r->steps - 1);
        rc = dl_pipe_run(e, sl ? sl : r->s, &ops, &x, k, r->tr, s, &r->st[k * p + s]);
        dl_sched_free(sl);
        uint64_t t1 = dl_now_ns();
        r->t0[k * p + s] = r->cont && k > 0 ? r->t1[(k - 1) * p + s] : (double)t0;
        r->t1[k * p + s] = (double)t1;
    }
    if (rc == DL_OK)
        rc = dl_barrier(c);
    dl_arena_get_stats(a, &as);
    r->peak_slots[s] = (int)((as.peak[DL_MEM_ACTIVATIONS] - base) / SLOT_BYTES);
    dl_pipe_destroy(e);
    dl_arena_free(a, x.in);
    dl_arena_free(a, x.out);
    for (int i = 0; i < nmb; i++) dl_arena_free(a, x.slot[i]);
    free(x.slot);
    return rc;
}

static int run_engine(prun *r, int wait_mode)
{
    int p = r->s->p;
    r->st = calloc((size_t)(r->steps * p), sizeof *r->st);
    r->t0 = calloc((size_t)(r->steps * p), sizeof *r->t0);
    r->t1 = calloc((size_t)(r->steps * p), sizeof *r->t1);
    if (!r->st || !r->t0 || !r->t1)
        return dl_error(DL_ENOMEM, "out of memory");
    r->captimes = r->cont ? 2 * r->s->m * r->steps : 0; /* a forward and a backward each */
    for (int s = 0; s < p && r->cont; s++)
        if (!(r->times[s] = malloc(sizeof(double) * (size_t)r->captimes)))
            return dl_error(DL_ENOMEM, "out of memory");
    dl_world_opts w;
    dl_world_opts_init(&w);
    w.nranks = p;
    w.wait_mode = wait_mode;
    w.quiet = 1;
    return dl_world_run(&w, stage_fn, r);
}

static void prun_free(prun *r)
{
    for (int s = 0; s < MAXP; s++) free(r->times[s]);
    free(r->st);
    free(r->t0);
    free(r->t1);
}

/* ==== results ============================================================================== */

typedef struct pres {
    int sched, p, v, m, c, over, skipped; /* c: TeraPipe's token chunks per sequence (m of them) */
    int autoc; /* TeraPipe's chunks chosen by its dynamic program (--token-chunks auto) */
    double lens[32], fit[5]; /* auto: the lengths (up to 32) and the fit: a, b, c, rms, worst */
    char why[160];
    double step_ms, bubble, bubble_trace, formula, sim, engine_us;
    /* async's continuous pipeline: the whole run's bubble measured and simulated (warm-up and
     * drain once), and 1F1B's simulated for the same p and m */
    int cont;
    double run_bubble, run_sim, sim_1f1b;
    double replay; /* the steady state simulated with the run's own action times (NaN: none) */
    double theory; /* the zero-bubble paper's (dl_sched_bubble_theory), NaN for other kinds */
    double stage_bubble[MAXP], sim_stage[MAXP];
    int peak_act[MAXP], arena_slots[MAXP], limit[MAXP]; /* slots: arena -1 unmeasured; limit 0 */
    double act_mib[MAXP]; /* --work model: the arena's activation peak per stage */
} pres;

/* The steps measured: all but the first when there are several. */
static int first_step(int steps) { return steps > 1 ? 1 : 0; }

/* The span of step k in the trace: earliest STEP start to latest STEP end over the ranks. */
static int trace_span(const dl_trace *t, int p, int k, double *lo, double *hi)
{
    *lo = INFINITY;
    *hi = 0;
    for (int s = 0; s < p; s++) {
        const dl_trace_event *e = dl_trace_events(t, s);
        for (size_t i = 0; i < dl_trace_count(t, s); i++)
            if (e[i].kind == DL_TR_STEP && e[i].step == k) {
                *lo = fmin(*lo, (double)e[i].t0);
                *hi = fmax(*hi, (double)e[i].t1);
                break;
            }
    }
    return *hi > *lo;
}

/* Per step: each stage's busy time from the engine's stats against the step's span (first
 * stage's start to the last stage's end), as the simulator charges every stage the makespan; the
 * total likewise; the trace's busy (union of FWD and BWD events) against the trace's span as a
 * cross-check. Medians over the measured steps. */
static void summarise_engine(const prun *r, pres *o)
{
    int p = r->s->p, k0 = first_step(r->steps), n = r->steps - k0;
    double *tot = malloc(sizeof(double) * (size_t)n), *trt = malloc(sizeof(double) * (size_t)n);
    double *span = malloc(sizeof(double) * (size_t)n),
           *eng = malloc(sizeof(double) * (size_t)(n * p));
    double *stg = malloc(sizeof(double) * (size_t)(n * p));
    double busy[MAXP], tbusy[MAXP], tlo[MAXP], thi[MAXP];
    int ne = 0;
    for (int k = k0; k < r->steps; k++) {
        double lo = INFINITY, hi = 0, a = 0, z = 0;
        int tok = r->tr && trace_span(r->tr, p, k, &a, &z);
        for (int s = 0; s < p; s++) {
            const dl_pipe_stats *st = &r->st[k * p + s];
            busy[s] = (double)st->busy_ns;
            lo = fmin(lo, r->t0[k * p + s]);
            hi = fmax(hi, r->t1[k * p + s]);
            if (st->actions > 0)
                eng[ne++] = (double)st->engine_ns / st->actions / 1e3;
            tbusy[s] = 0;
            tlo[s] = a;
            thi[s] = z;
            if (tok && dl_trace_bubble(r->tr, s, k, NULL, &tbusy[s], NULL) != DL_OK)
                tok = 0;
        }
        /* continuous: steps overlap across stages; a stage's step spans from its previous
         * step's end, and the step's total charges every stage the longest such span */
        double most = 0, sum = 0, tsum = 0;
        for (int s = 0; s < p; s++) {
            double w = r->cont ? r->t1[k * p + s] - r->t0[k * p + s] : hi - lo;
            stg[s * n + (k - k0)] = pb_bubble_stage(busy[s], w);
            most = fmax(most, w), sum += busy[s], tsum += tbusy[s];
        }
        tot[k - k0] = r->cont ? pb_bubble_stage(sum, p * most)
                              : pb_bubble_total(busy, r->t0 + k * p, r->t1 + k * p, p);
        trt[k - k0] = !tok      ? NAN
                      : r->cont ? pb_bubble_stage(tsum, p * most)
                                : pb_bubble_total(tbusy, tlo, thi, p);
        span[k - k0] = most / 1e6;
    }
    for (int s = 0; s < p; s++) o->stage_bubble[s] = dl__median_copy(stg + s * n, (size_t)n);
    o->bubble = dl__median_copy(tot, (size_t)n);
    o->bubble_trace = r->tr ? dl__median_copy(trt, (size_t)n) : NAN;
    o->step_ms = dl__median_copy(span, (size_t)n);
    o->engine_us = ne > 0 ? dl__median_copy(eng, (size_t)ne) : NAN;
    if (r->cont) { /* the whole run: every step's busy against the run's span */
        double sum = 0, lo = INFINITY, hi = 0;
        for (int k = 0; k < r->steps; k++)
            for (int s = 0; s < p; s++) {
                sum += (double)r->st[k * p + s].busy_ns;
                lo = fmin(lo, r->t0[k * p + s]), hi = fmax(hi, r->t1[k * p + s]);
            }
        o->run_bubble = pb_bubble_stage(sum, p * (hi - lo));
    }
    free(tot);
    free(trt);
    free(span);
    free(eng);
    free(stg);
}

/* cont: the window replayed with each action's measured time (the schedule's OPTs 0, as the
 * simulator's), so the measured steady state splits into what the actions' own times explain
 * (a late wake-up lengthens one and idles the stages waiting on it) and what the hand-offs add. */
static void summarise_replay(const prun *r, pres *o)
{
    int p = r->s->p, m = r->s->m, n = r->steps, ok = 1;
    double *dur[MAXP] = {0};
    dl_sched *w = NULL;
    o->replay = NAN;
    if (!r->cont || dl_sched_async(p, n * m, 0, &w) != DL_OK)
        return;
    for (int q = 0; q < p && ok; q++) {
        int j = 0;
        ok = (dur[q] = malloc(sizeof(double) * (size_t)(w->len[q] + 1))) != NULL;
        for (int i = 0; ok && i < w->len[q]; i++)
            if (w->act[q][i].op == DL_SCHED_OPT)
                dur[q][i] = 0;
            else if (j < r->ntimes[q])
                dur[q][i] = r->times[q][j++];
            else
                ok = 0;
        ok = ok && j == r->ntimes[q];
    }
    if (ok && dl_sched_async_continuous_replay(p, m, n, (const double *const *)dur, &o->replay))
        o->replay = NAN;
    for (int q = 0; q < p; q++) free(dur[q]);
    dl_sched_free(w);
}

static int make_sched(int kind, int p, int m, int v, int c, dl_sched **s)
{
    switch (kind) {
    case DL_SCHED_TERAPIPE: return dl_sched_terapipe(p, m, c, s);
    case DL_SCHED_GPIPE: return dl_sched_gpipe(p, m, s);
    case DL_SCHED_1F1B: return dl_sched_1f1b(p, m, s);
    case DL_SCHED_INTERLEAVED: return dl_sched_interleaved(p, m, v, s);
    case DL_SCHED_1F1B_SPLIT: return dl_sched_1f1b_split(p, m, s);
    case DL_SCHED_ZB_H1: return dl_sched_zb_h1(p, m, s);
    case DL_SCHED_ZB_H2: return dl_sched_zb_h2(p, m, s);
    case DL_SCHED_ZB_V: return dl_sched_zb_v(p, m, s);
    case DL_SCHED_DUALPIPEV: return dl_sched_dualpipev(p, m, s);
    default: return dl_sched_async(p, m, 0, s);
    }
}

/* --chunk-costs flops: each of the o->c equal token chunks of a --seq sequence costs its FLOPs
 * at width --d-model (the total unchanged: include/distlab/tera.h) */
static int chunk_scale(const pcfg *c, const pres *o, double **scale)
{
    if (c->seq % o->c)
        return dl_error(DL_EINVAL, "%d tokens (--seq) do not split into %d equal chunks", c->seq,
                        o->c);
    int *lens = malloc(sizeof(int) * (size_t)o->c);
    *scale = malloc(sizeof(double) * (size_t)o->m * o->c);
    int rc = lens && *scale ? DL_OK : dl_error(DL_ENOMEM, "out of memory");
    for (int k = 0; rc == DL_OK && k < o->c; k++) lens[k] = c->seq / o->c;
    if (rc == DL_OK)
        rc = dl_tera_chunk_scale(o->m, o->c, lens, c->d_model, *scale);
    free(lens);
    return rc;
}

/* --token-chunks auto: the latency model measured once (tera->fitted), TeraPipe's slices for
 * this row's stages; o->c becomes their number. The '#' lines go to stderr under --json / --csv. */
typedef struct tera_state {
    int fitted;
    dl_tera_latency model;
    double err[2];
} tera_state;

static int chunks_auto(const pcfg *c, pres *o, tera_state *t, FILE *f, double **scale)
{
    FILE *note = c->o.json || c->o.csv ? stderr : f;
    int rc = DL_OK, *lens = malloc(sizeof(int) * (size_t)c->seq);
    if (!lens)
        return dl_error(DL_ENOMEM, "out of memory");
    if (!t->fitted && (rc = tera_fit_latency(c->seq, c->d_model, c->micro_batch, note, &t->model,
                                             t->err)) == DL_OK)
        t->fitted = 1;
    if (rc == DL_OK)
        rc = tera_fit_plan(&t->model, c->seq, o->p, o->m, note, lens, &o->c, scale);
    o->autoc = 1;
    for (int k = 0; rc == DL_OK && k < o->c && k < 32; k++) o->lens[k] = lens[k];
    double fit[5] = {t->model.a, t->model.b, t->model.c, t->err[0], t->err[1]};
    memcpy(o->fit, fit, sizeof fit);
    free(lens);
    return rc;
}

/* --work model: the trainer's real stages. */
static int run_model(const pcfg *c, pres *o, const char *trace_path)
{
    dl_train_opts t;
    dl_train_opts_init(&t);
    t.model.layers = c->layers;
    t.model.d_model = c->d_model;
    t.model.heads = 4;
    t.model.seq = c->seq;
    t.layout.pp = o->p;
    t.pipeline.schedule = o->sched;
    t.pipeline.virtual_stages = o->v;
    t.batch.micro = c->micro_batch;
    t.batch.microbatches = o->m;
    t.batch.global = c->micro_batch * o->m;
    t.optim.steps = c->steps;
    t.optim.warmup = 1;
    t.eval.windows = 1;
    t.output.log_every = 0;
    t.output.log = NULL;
    t.trace.path = trace_path;
    int rc = dl_train_resolve(&t, o->p);
    dl_train_result r;
    memset(&r, 0, sizeof r);
    if (rc == DL_OK)
        rc = dl_train_run(&t, &r);
    if (rc == DL_OK) {
        o->bubble = r.pipeline.bubble_total;
        o->bubble_trace = NAN;
        o->step_ms = r.speed.ms_per_step;
        o->engine_us = r.pipeline.engine_us;
        for (int s = 0; s < o->p; s++) {
            o->stage_bubble[s] = r.pipeline.bubble ? r.pipeline.bubble[s] : NAN;
            o->act_mib[s] =
                r.memory.peak
                    ? (double)r.memory.peak[(size_t)s * DL_MEM_NCATEGORIES + DL_MEM_ACTIVATIONS] /
                          1048576.0
                    : NAN;
        }
    }
    dl_train_result_free(&r);
    return rc;
}

/* async: the continuous pipeline simulated over the steps (its steady state the row's simulated
 * figure), and 1F1B's for the same p and m at the same costs */
static int cont_figures(pres *o, const dl_sched_costs *k, int steps)
{
    dl_sched *one = NULL;
    dl_sched_sim *sim = NULL;
    int rc = dl_sched_async_continuous(o->p, o->m, steps, k, &o->run_sim, &o->sim);
    if (rc == DL_OK)
        rc = dl_sched_async_continuous_stages(o->p, o->m, steps, k, o->sim_stage);
    o->formula = NAN; /* the lecture gives no bubble for a pipeline that never flushes */
    if (rc == DL_OK && (rc = dl_sched_1f1b(o->p, o->m, &one)) == DL_OK &&
        (rc = dl_sched_simulate(one, k, &sim)) == DL_OK)
        o->sim_1f1b = sim->bubble_total;
    dl_sched_sim_free(sim);
    dl_sched_free(one);
    return rc;
}

/* ==== output =============================================================================== */

static void join(char *buf, size_t cap, const double *v, int n, double scale, const char *fmt)
{
    size_t k = 0;
    buf[0] = 0;
    for (int i = 0; i < n && k < cap; i++) {
        if (i)
            k += (size_t)snprintf(buf + k, cap - k, "/");
        if (k < cap) /* '-': not measured, or no limit */
            k += isfinite(v[i]) ? (size_t)snprintf(buf + k, cap - k, fmt, v[i] * scale)
                                : (size_t)snprintf(buf + k, cap - k, "-");
    }
}

static void json_array(FILE *f, const char *key, const double *v, int n, double scale)
{
    fprintf(f, ",\"%s\":[", key);
    for (int i = 0; i < n; i++) {
        if (isfinite(v[i]))
            fprintf(f, "%s%.6g", i ? "," : "", v[i] * scale);
        else
            fprintf(f, "%snull", i ? "," : "");
    }
    fputc(']', f);
}

/* the schedule's name, TeraPipe's with its chunks ("terapipe/c4") */
static void pres_name(const pres *o, char *buf, size_t cap)
{
    const char *k = dl_sched_kind_name((dl_sched_kind)o->sched);
    if (o->sched == DL_SCHED_TERAPIPE)
        snprintf(buf, cap, "%s/%s%d", k, o->autoc ? "auto" : "c", o->c);
    else
        snprintf(buf, cap, "%s", k);
}

static void pct_or_dash(char *buf, size_t cap, const char *fmt, double v)
{
    if (isfinite(v))
        snprintf(buf, cap, fmt, v);
    else
        snprintf(buf, cap, "-");
}

static void print_row(FILE *f, const pcfg *c, const pres *o)
{
    double pk[MAXP], ar[MAXP], li[MAXP];
    for (int s = 0; s < o->p; s++) {
        pk[s] = o->peak_act[s];
        ar[s] = o->arena_slots[s] >= 0 ? o->arena_slots[s] : NAN;
        li[s] = o->limit[s] > 0 ? o->limit[s] : NAN;
    }
    char name[32];
    pres_name(o, name, sizeof name);
    char sb[MAXP * 8], ss[MAXP * 8], pa[MAXP * 6], am[MAXP * 10], as[MAXP * 6], ls[MAXP * 6];
    join(sb, sizeof sb, o->stage_bubble, o->p, 100, "%.1f");
    join(ss, sizeof ss, o->sim_stage, o->p, 100, "%.1f");
    join(pa, sizeof pa, pk, o->p, 1, "%.0f");
    join(am, sizeof am, o->act_mib, o->p, 1, "%.2f");
    join(as, sizeof as, ar, o->p, 1, "%.0f");
    join(ls, sizeof ls, li, o->p, 1, "%.0f");
    double dpp = 100 * (o->bubble - o->formula);
    /* '-': the trace's bubble with --work model, the lecture's and the paper's figures where
     * they give none */
    char tr[16], fo[16], th[16], dp[16];
    pct_or_dash(tr, sizeof tr, "%.1f", 100 * o->bubble_trace);
    pct_or_dash(fo, sizeof fo, "%.1f", 100 * o->formula);
    pct_or_dash(th, sizeof th, "%.1f", 100 * o->theory);
    pct_or_dash(dp, sizeof dp, "%+.1f", dpp);
    if (c->o.json) {
        bu_json_begin(f, "pipeline", "row");
        bu_json_str(f, "row_kind", "config");
        bu_json_str(f, "schedule", name);
        bu_json_int(f, "p", o->p);
        bu_json_int(f, "v", o->v);
        bu_json_int(f, "m", o->m);
        if (o->sched == DL_SCHED_TERAPIPE) {
            bu_json_int(f, "token_chunks", o->c);
            bu_json_str(f, "chunk_costs",
                        o->autoc         ? "measured"
                        : c->chunk_flops ? "flops"
                                         : "equal");
            if (o->autoc && o->c <= 32) { /* what the '#' lines print (stderr under --json) */
                json_array(f, "token_lens", o->lens, o->c, 1);
                json_array(f, "fit_abc_rms_max", o->fit, 5, 1);
            }
        }
        bu_json_str(f, "work", work_name[c->work]);
        bu_json_bool(f, "oversubscribed", o->over);
        bu_json_num(f, "step_ms", o->step_ms);
        bu_json_num(f, "bubble_pct", 100 * o->bubble);
        bu_json_num(f, "bubble_trace_pct", 100 * o->bubble_trace);
        bu_json_num(f, "lecture_pct", 100 * o->formula);
        bu_json_num(f, "sim_pct", 100 * o->sim);
        bu_json_num(f, "theory_pct", 100 * o->theory);
        bu_json_num(f, "delta_pp", dpp);
        bu_json_num(f, "engine_us_per_action", o->engine_us);
        json_array(f, "stage_bubble_pct", o->stage_bubble, o->p, 100);
        json_array(f, "sim_stage_bubble_pct", o->sim_stage, o->p, 100);
        json_array(f, "peak_act_slots", pk, o->p, 1);
        json_array(f, "arena_act_slots", ar, o->p, 1);
        json_array(f, "act_slot_limit", li, o->p, 1);
        if (c->work == WORK_MODEL)
            json_array(f, "act_peak_mib", o->act_mib, o->p, 1);
        if (o->cont) {
            bu_json_num(f, "run_bubble_pct", 100 * o->run_bubble);
            bu_json_num(f, "run_sim_pct", 100 * o->run_sim);
            bu_json_num(f, "sim_1f1b_pct", 100 * o->sim_1f1b);
            bu_json_num(f, "replay_pct", 100 * o->replay);
        }
        bu_json_end(f);
    } else if (c->o.csv) {
        fprintf(f,
                "config,%s,%d,%d,%d,%s,%d,%.3f,%.2f,%.2f,%.2f,%.2f,%.2f,%.3f,%s,%s,%s,,,%.2f,%s,%"
                "s\n",
                name, o->p, o->v, o->m, work_name[c->work], o->over, o->step_ms, 100 * o->bubble,
                100 * o->bubble_trace, 100 * o->formula, 100 * o->sim, dpp, o->engine_us, sb, pa,
                c->work == WORK_MODEL ? am : "", 100 * o->theory, as, ls);
    } else {
        fprintf(f,
                "  %-11s %3d %2d %4d %9.2f %7.1f %7s %8s %7s %6.1f %6s %9.2f  %-20s %-20s "
                "%-12s %-12s %s%s%s%s\n",
                name, o->p, o->v, o->m, o->step_ms, 100 * o->bubble, tr, fo, th, 100 * o->sim, dp,
                o->engine_us, sb, ss, pa, as, ls, c->work == WORK_MODEL ? "  act MiB " : "",
                c->work == WORK_MODEL ? am : "", o->over ? "  (oversubscribed)" : "");
        if (o->cont) {
            char run[48] = ""; /* the trainer (--work model) does not give the whole run's */
            if (isfinite(o->run_bubble))
                snprintf(run, sizeof run, "%.1f%% measured, ", 100 * o->run_bubble);
            char rep[160] = ""; /* nor the replay */
            if (isfinite(o->replay))
                snprintf(rep, sizeof rep,
                         "; replaying this run's own action times, the simulator gives %.1f%% "
                         "(the hand-offs add the other %+.1f points)",
                         100 * o->replay, 100 * (o->bubble - o->replay));
            fprintf(f,
                    "    async runs one continuous pipeline over the %d steps (no flush between "
                    "them): steady-state bubble %.1f%% measured, %.1f%% simulated (median step "
                    "after the first)%s; the whole run with its one warm-up and drain %s%.1f%% "
                    "simulated; 1F1B flushes every step: %.1f%% simulated\n",
                    c->steps, 100 * o->bubble, 100 * o->sim, rep, run, 100 * o->run_sim,
                    100 * o->sim_1f1b);
        }
    }
    fflush(f);
}

/* ==== the overhead microbenchmark ========================================================== */

typedef struct pover {
    int p, m, steps, ran;
    double per_action_us, per_action_min_us, dispatch_us;
    char why[128];
} pover;

static int overhead_bench(const pcfg *c, int pus, pover *ov)
{
    memset(ov, 0, sizeof *ov);
    ov->p = pus < 2 ? pus : 2;
    ov->m = c->ov_m;
    ov->steps = c->ov_steps;
    if (ov->p < 2) {
        snprintf(ov->why, sizeof ov->why,
                 "one core: no stage to hand off to without oversubscribing");
        return DL_OK;
    }
    dl_sched *s = NULL;
    int rc = dl_sched_1f1b(ov->p, ov->m, &s);
    if (rc)
        return rc;
    prun r;
    memset(&r, 0, sizeof r);
    r.s = s;
    r.work = -1;
    r.count = (size_t)c->handoff_kb * 1024 / 4;
    r.steps = ov->steps + 1; /* one warm-up step */
    r.slack_ns = c->timer_slack_ns;
    rc = run_engine(&r, DL_WAIT_SPIN);
    if (rc == DL_OK) {
        int n = ov->steps, p = ov->p;
        double *pa = malloc(sizeof(double) * (size_t)n),
               *d = malloc(sizeof(double) * (size_t)(n * p));
        double mn = INFINITY;
        for (int k = 1; k <= n; k++) {
            double worst = 0;
            for (int q = 0; q < p; q++) {
                const dl_pipe_stats *st = &r.st[k * p + q];
                double a = st->actions ? (double)st->wall_ns / st->actions / 1e3 : 0;
                worst = fmax(worst, a);
                d[(k - 1) * p + q] = st->actions ? (double)st->engine_ns / st->actions / 1e3 : 0;
            }
            pa[k - 1] = worst;
            mn = fmin(mn, worst);
        }
        ov->per_action_us = dl__median_copy(pa, (size_t)n);
        ov->per_action_min_us = mn;
        ov->dispatch_us = dl__median_copy(d, (size_t)(n * p));
        ov->ran = 1;
        free(pa);
        free(d);
    }
    prun_free(&r);
    dl_sched_free(s);
    return rc;
}

/* ==== main ================================================================================= */

int bench_pipeline_main(int argc, char **argv)
{
    pcfg c;
    memset(&c, 0, sizeof c);
    if (parse(argc, argv, &c))
        return CLI_EXIT_USAGE;
    if (c.selftest)
        return selftest(stdout) ? CLI_EXIT_OK : CLI_EXIT_FAIL;
    dl_topo *topo = bu_topo_load("pipeline");
    if (topo == NULL)
        return CLI_EXIT_FAIL;
    int pus = dl_topo_real_pus(topo);
    FILE *f = stdout;
    if (c.o.json) {
        bu_json_begin(f, "pipeline", "config");
        bu_machine_json(f, topo);
        bu_json_str(f, "work", work_name[c.work]);
        bu_json_num(f, "fwd_ms", c.work == WORK_MODEL ? NAN : c.fwd_ms);
        bu_json_num(f, "bwd_ms", c.work == WORK_MODEL ? NAN : c.bwd_ms);
        bu_json_int(f, "handoff_kb", c.handoff_kb);
        bu_json_int(f, "virtual_stages", c.v);
        bu_json_int(f, "steps", c.steps);
        bu_json_int(f, "timer_slack_ns", c.timer_slack_ns);
        bu_json_int(f, "sleep_tail_us", c.sleep_tail_ns / 1000);
        bu_json_str(f, "wait_mode",
                    c.wait_mode < 0               ? "auto"
                    : c.wait_mode == DL_WAIT_SPIN ? "spin"
                                                  : "yield");
        bu_json_bool(f, "quick", c.o.quick);
        if (c.work == WORK_MODEL) {
            bu_json_int(f, "layers", c.layers);
            bu_json_int(f, "d_model", c.d_model);
            bu_json_int(f, "seq", c.seq);
            bu_json_int(f, "micro_batch", c.micro_batch);
        }
        bu_json_end(f);
    } else {
        bu_machine_text(f, topo);
        if (c.work == WORK_MODEL)
            fprintf(f,
                    "# pipeline: work model (GPT %d layers, width %d, context %d, %d sequences per "
                    "micro-batch; distlab-train --pp), %d steps, the trainer's medians; simulator "
                    "costs f = 1, b = 2\n",
                    c.layers, c.d_model, c.seq, c.micro_batch, c.steps);
        else
            fprintf(
                f,
                "# pipeline: work %s (fwd %g ms, bwd %g ms per micro-batch and stage; per chunk "
                "/v when interleaved), hand-off %d KiB, %d steps (median of steps 2..%d), timer "
                "slack %ld ns, sleep tail %ld us, wait mode %s\n",
                work_name[c.work], c.fwd_ms, c.bwd_ms, c.handoff_kb, c.steps, c.steps,
                c.timer_slack_ns, c.sleep_tail_ns / 1000,
                c.wait_mode < 0               ? "auto"
                : c.wait_mode == DL_WAIT_SPIN ? "spin"
                                              : "yield");
        if (c.o.csv)
            fprintf(f, "row_kind,schedule,p,v,m,work,oversubscribed,step_ms,bubble_pct,bubble_"
                       "trace_pct,"
                       "lecture_pct,sim_pct,delta_pp,engine_us_per_action,stage_bubble_pct,"
                       "peak_act_slots,act_peak_mib,per_action_us,dispatch_us,theory_pct,"
                       "arena_act_slots,act_slot_limit\n");
        else
            fprintf(f,
                    "# %-11s %3s %2s %4s %9s %7s %7s %8s %7s %6s %6s %9s  %-20s %-20s %-12s %-12s "
                    "%s\n",
                    "schedule", "p", "v", "m", "step ms", "bubble%", "trace%", "lecture%",
                    "theory%", "sim%", "d(pp)", "engine us", "stage bubble%", "(sim)",
                    "slots (sim)", "(arena)", "(limit)");
    }
    int status = CLI_EXIT_OK, rows = 0, skipped = 0, warned = 0;
    tera_state tera = {0, {0, 0, 0}, {0, 0}};
    double worst_dpp = 0;
    char *dat = NULL;
    size_t datlen = 0;
    FILE *df = c.plot_bubbles ? open_memstream(&dat, &datlen) : NULL;
    if (df)
        fprintf(df, "# label measured_pct simulated_pct lecture_pct\n");
    for (int is = 0; is < c.nsched && status == CLI_EXIT_OK; is++)
        for (int ip = 0; ip < c.nstages && status == CLI_EXIT_OK; ip++)
            for (int im = 0; im < c.nmbs * c.nchunks && status == CLI_EXIT_OK; im++) {
                pres o;
                memset(&o, 0, sizeof o);
                o.sched = c.sched[is];
                o.p = c.stages[ip];
                o.m = c.mbs[im / c.nchunks];
                o.c = c.chunks[im % c.nchunks];
                o.v = o.sched == DL_SCHED_INTERLEAVED                             ? c.v
                      : o.sched == DL_SCHED_ZB_V || o.sched == DL_SCHED_DUALPIPEV ? 2
                                                                                  : 1;
                o.over = o.p > pus;
                for (int s = 0; s < MAXP; s++) o.act_mib[s] = NAN, o.arena_slots[s] = -1;
                int shown = o.sched == c.show_sched && o.p == c.show_p && o.m == c.show_m;
                dl_sched *s = NULL;
                dl_sched_sim *sim = NULL;
                double *scale = NULL; /* TeraPipe's chunks each at its FLOPs or measured time */
                int rc = DL_OK;
                if (o.sched == DL_SCHED_TERAPIPE && o.c == 0)
                    rc = chunks_auto(&c, &o, &tera, f, &scale);
                if (rc == DL_OK)
                    rc = make_sched(o.sched, o.p, o.m, o.v, o.c, &s);
                if (rc == DL_OK && o.sched == DL_SCHED_TERAPIPE && c.chunk_flops && !o.autoc)
                    rc = chunk_scale(&c, &o, &scale);
                if (rc == DL_OK && o.sched == DL_SCHED_INTERLEAVED && o.p == 1) {
                    rc = DL_EINVAL;
                    dl_error(DL_EINVAL, "interleaving needs at least 2 stages");
                }
                if (rc == DL_OK && c.work == WORK_MODEL && c.layers % (o.p * o.v)) {
                    rc = DL_EINVAL;
                    dl_error(DL_EINVAL, "%d layers do not split into %d x %d chunks", c.layers, o.p,
                             o.v);
                }
                if (rc != DL_OK) {
                    /* a configuration the schedule does not allow (interleaved: m % p) */
                    if (!c.o.json && !c.o.csv)
                        fprintf(f, "# skipped %s p=%d m=%d: %s\n",
                                dl_sched_kind_name((dl_sched_kind)o.sched), o.p, o.m, dl_errmsg());
                    skipped++;
                    dl_sched_free(s);
                    free(scale);
                    continue;
                }
                double wg = c.wgrad_ms < 0 ? c.bwd_ms / 2 : c.wgrad_ms;
                double per = o.v * o.c; /* an action's share of a micro-batch's work */
                dl_sched_costs k = {c.work == WORK_MODEL ? 1 : c.fwd_ms / per,
                                    c.work == WORK_MODEL ? 2 : c.bwd_ms / per, 0,
                                    c.work == WORK_MODEL ? -1 : wg / per};
                if (!(k.f > 0 || k.b > 0))
                    k = (dl_sched_costs){1, 2, 0, -1};
                if (o.sched == DL_SCHED_ZB_V && c.work != WORK_MODEL) {
                    /* ZB-V's order found at the bench's own costs (the trainer's is F = I = W) */
                    dl_sched_free(s);
                    s = NULL;
                    if ((rc = dl_sched_zb_v_costs(o.p, o.m, &k, &s)) != DL_OK) {
                        cli_error("pipeline: %s", dl_errmsg());
                        status = CLI_EXIT_FAIL;
                        break;
                    }
                }
                double kw = k.w < 0 ? k.b / 2 : k.w;
                o.theory = dl_sched_bubble_theory(s, k.f, k.b - kw, kw);
                if (o.theory < 0)
                    o.theory = NAN;
                rc = dl_sched_simulate_scaled(s, &k, scale, &sim);
                if (rc != DL_OK) {
                    cli_error("pipeline: %s", dl_errmsg());
                    dl_sched_free(s);
                    free(scale);
                    status = CLI_EXIT_FAIL;
                    break;
                }
                o.formula = dl_sched_bubble_formula(s);
                o.sim = sim->bubble_total;
                o.cont = o.sched == DL_SCHED_ASYNC; /* the trainer's async is continuous too */
                o.run_bubble = o.replay = NAN;      /* measured on the engine only */
                if (o.cont && (rc = cont_figures(&o, &k, c.steps)) != DL_OK) {
                    cli_error("pipeline: %s", dl_errmsg());
                    dl_sched_free(s);
                    dl_sched_sim_free(sim);
                    status = CLI_EXIT_FAIL;
                    break;
                }
                for (int q = 0; q < o.p; q++) {
                    if (!o.cont)
                        o.sim_stage[q] = sim->bubble[q];
                    o.peak_act[q] = sim->peak_act[q];
                    o.limit[q] = s->mem_limit[q];
                }
                if (o.over && !warned) {
                    bu_warn_oversub(o.p, pus);
                    if (c.work == WORK_SPIN)
                        cli_error(
                            "WARNING: --work spin with more stages than cores measures the cores' "
                            "sharing, not the schedule; use --work sleep");
                    warned = 1;
                }
                if (shown && c.write_sched && dl_sched_save_csv(s, c.write_sched) != DL_OK) {
                    cli_error("pipeline: --write-schedule: %s", dl_errmsg());
                    status = CLI_EXIT_FAIL;
                }
                if (c.work == WORK_MODEL) {
                    rc = run_model(&c, &o, shown ? c.trace : NULL);
                } else {
                    prun r;
                    memset(&r, 0, sizeof r);
                    r.s = s;
                    r.work = c.work;
                    r.f_ns = (uint64_t)llround(c.fwd_ms / per * 1e6);
                    r.b_ns = (uint64_t)llround(c.bwd_ms / per * 1e6);
                    r.w_ns = (uint64_t)llround(wg / per * 1e6);
                    r.scale = scale;
                    r.count = (size_t)c.handoff_kb * 1024 / 4;
                    r.steps = c.steps;
                    r.cont = o.cont && c.work != WORK_MODEL;
                    r.slack_ns = c.timer_slack_ns;
                    r.tail_ns = (uint64_t)c.sleep_tail_ns;
                    size_t cap = 0;
                    for (int q = 0; q < o.p; q++)
                        cap = (size_t)s->len[q] > cap ? (size_t)s->len[q] : cap;
                    rc = dl_trace_create(o.p, (size_t)c.steps * (3 * cap + 2), &r.tr);
                    if (rc == DL_OK) {
                        dl_trace_set_chunks(r.tr, o.v);
                        rc = run_engine(&r, c.wait_mode);
                    }
                    if (rc == DL_OK) {
                        summarise_engine(&r, &o);
                        summarise_replay(&r, &o);
                        memcpy(o.arena_slots, r.peak_slots, sizeof(int) * (size_t)o.p);
                    }
                    if (rc == DL_OK && shown && c.trace &&
                        dl_trace_write_chrome(r.tr, c.trace, NULL) != DL_OK) {
                        cli_error("pipeline: --trace: %s", dl_errmsg());
                        status = CLI_EXIT_FAIL;
                    }
                    if (rc == DL_OK && shown && c.o.plot &&
                        trace_plot_gantt(r.tr, c.steps - 1, c.o.plot) != 0)
                        status = CLI_EXIT_FAIL;
                    dl_trace_destroy(r.tr);
                    prun_free(&r);
                }
                if (rc != DL_OK) {
                    cli_error("pipeline: %s p=%d m=%d: %s",
                              dl_sched_kind_name((dl_sched_kind)o.sched), o.p, o.m, dl_errmsg());
                    status = CLI_EXIT_FAIL;
                } else {
                    print_row(f, &c, &o);
                    rows++;
                    if (fabs(o.bubble - o.formula) > fabs(worst_dpp) / 100)
                        worst_dpp = 100 * (o.bubble - o.formula);
                    char nm[32];
                    pres_name(&o, nm, sizeof nm);
                    if (df)
                        fprintf(df, "\"%s p%d m%d%s\" %.4f %.4f %.4f\n", nm, o.p, o.m,
                                o.over ? "*" : "", 100 * o.bubble, 100 * o.sim, 100 * o.formula);
                }
                dl_sched_sim_free(sim);
                dl_sched_free(s);
                free(scale);
            }

    pover ov;
    memset(&ov, 0, sizeof ov);
    if (status == CLI_EXIT_OK && c.ov_steps > 0) {
        if (overhead_bench(&c, pus, &ov) != DL_OK) {
            cli_error("pipeline: overhead microbenchmark: %s", dl_errmsg());
            status = CLI_EXIT_FAIL;
        } else if (ov.ran) {
            int pass = ov.per_action_us < 20;
            if (c.o.json) {
                bu_json_begin(f, "pipeline", "row");
                bu_json_str(f, "row_kind", "overhead");
                bu_json_str(f, "schedule", "1f1b");
                bu_json_int(f, "p", ov.p);
                bu_json_int(f, "m", ov.m);
                bu_json_int(f, "steps", ov.steps);
                bu_json_int(f, "handoff_kb", c.handoff_kb);
                bu_json_str(f, "wait_mode", "spin");
                bu_json_num(f, "per_action_us", ov.per_action_us);
                bu_json_num(f, "per_action_min_us", ov.per_action_min_us);
                bu_json_num(f, "dispatch_us", ov.dispatch_us);
                bu_json_num(f, "goal_us", 20);
                bu_json_bool(f, "pass", pass);
                bu_json_end(f);
            } else if (c.o.csv) {
                fprintf(f, "overhead,1f1b,%d,1,%d,none,0,,,,,,,,,,,%.3f,%.3f,,,\n", ov.p, ov.m,
                        ov.per_action_us, ov.dispatch_us);
            } else {
                fprintf(f,
                        "# engine overhead (1f1b, p = %d, m = %d, nothing to compute, %d KiB "
                        "hand-offs, "
                        "wait mode spin, %d steps):\n",
                        ov.p, ov.m, c.handoff_kb, ov.steps);
                fprintf(f,
                        "  per action %.2f us median (best step %.2f us), of which dispatch and "
                        "bookkeeping %.2f us; goal < 20 us: %s\n",
                        ov.per_action_us, ov.per_action_min_us, ov.dispatch_us,
                        pass ? "PASS" : "FAIL");
            }
        } else if (!c.o.json && !c.o.csv) {
            fprintf(f, "# engine overhead microbenchmark skipped: %s\n", ov.why);
        }
    }
    if (c.o.json) {
        bu_json_begin(f, "pipeline", "summary");
        bu_json_int(f, "rows", rows);
        bu_json_int(f, "skipped", skipped);
        bu_json_num(f, "worst_delta_pp", worst_dpp);
        if (ov.ran)
            bu_json_num(f, "overhead_per_action_us", ov.per_action_us);
        bu_json_str(f, "status", status == CLI_EXIT_OK ? "ok" : "failed");
        bu_json_end(f);
    } else if (!c.o.csv && rows > 0) {
        fprintf(f, "# largest gap between measured and lecture bubble: %+.1f percentage points\n",
                worst_dpp);
    }
    if (df) {
        fclose(df);
        if (status == CLI_EXIT_OK && rows > 0 &&
            bu_plot(c.plot_bubbles, dat,
                    "set title 'distlab-bench pipeline: bubble per configuration (* "
                    "oversubscribed)'\n"
                    "set ylabel 'bubble (% of the step)'\nset yrange [0:100]\n"
                    "set style data histograms\nset style histogram clustered gap 1\n"
                    "set style fill solid 0.85 border lc rgb '#303030'\nset boxwidth 0.9\n"
                    "set xtics rotate by -45 font ',9'\nunset grid\nset grid ytics\n"
                    "plot datafile using 2:xtic(1) lc rgb '#c44e52' title 'measured', \\\n"
                    "     '' using 3 lc rgb '#4c72b0' title 'simulated', \\\n"
                    "     '' using 4 lc rgb '#55a868' title 'lecture (p-1)/(vm+p-1)'\n") != 0)
            status = CLI_EXIT_FAIL;
        free(dat);
    }
    dl_topo_destroy(topo);
    return status;
}
