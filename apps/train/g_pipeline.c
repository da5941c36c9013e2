/* Pipeline: the schedule, its virtual stages and weight stashing, the layers' split to stages
 * (--layer-costs), token-level pipelining (--token-chunks, auto: TeraPipe's slices from a latency
 * model measured here), and the pipeline's summary lines. */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "group.h"
#include "cli.h"
#include "layer_costs.h"
#include "tera_fit.h"
#include "parallel/pipe_train.h"

enum { MAX_LAYERS = 4096 };
static int have_sched, have_virt, measure, ncosts;
static const char *write_path; /* --write-schedule */
static double costs[MAX_LAYERS];
static int tokens_auto, *auto_lens; /* --token-chunks auto: the slices chosen here */
static char *auto_note;             /* its fit and slices, printed after the banner */
static dl_tera_latency auto_fit;    /* the fit and its relative error (rms, worst), for JSON */
static double auto_err[2];
static size_t auto_note_len;

static int p_sched(tg_run *r, const char *a)
{
    dl_sched_kind k;
    if (dl_sched_kind_parse(a, &k) || !tr_pipe_trains((int)k)) {
        char list[128];
        tr_pipe_kind_list(list, sizeof list);
        cli_error("--schedule: '%s' is not %s", a, list);
        return -1;
    }
    r->o.pipeline.schedule = (int)k;
    have_sched = 1;
    return 0;
}

static int p_virt(tg_run *r, const char *a)
{
    have_virt = 1;
    return cli_parse_int("--virtual-stages", a, 1, DL_GPT_MAX_CHUNKS,
                         &r->o.pipeline.virtual_stages);
}

static int p_stash(tg_run *r, const char *a)
{
    (void)a;
    r->o.pipeline.weight_stashing = 1;
    return 0;
}

static int p_file(tg_run *r, const char *a)
{
    r->o.pipeline.schedule_file = a;
    return 0;
}

static int p_letters(tg_run *r, const char *a)
{
    static const char *const names[] = {"auto", "new", "old"};
    for (int k = 0; k < 3; k++)
        if (!strcmp(a, names[k])) {
            r->o.pipeline.schedule_letters = k;
            return 0;
        }
    cli_error("--schedule-letters: '%s' is not auto, new or old", a);
    return -1;
}

static int p_limit(tg_run *r, const char *a)
{
    return cli_parse_int("--schedule-mem-limit", a, 1, 1 << 20, &r->o.pipeline.schedule_mem_limit);
}

/* --token-chunks c, or auto (the slices chosen before the run: plan_auto) */
static int p_tokens(tg_run *r, const char *a)
{
    tokens_auto = !strcmp(a, "auto");
    if (tokens_auto) {
        r->o.pipeline.token_chunks = 2; /* until measured: any cut, for the refusals */
        return 0;
    }
    return cli_parse_int("--token-chunks", a, 1, 1 << 20, &r->o.pipeline.token_chunks);
}

/* auto: what the latency fit needs, and a placeholder cut of the sequence (1 | T - 1) that
 * lets the library's resolution refuse what token slices cannot run with */
static int auto_check(tg_run *r)
{
    const dl_gpt_config *m = &r->o.model;
    if (!tokens_auto || r->o.layout.pp < 2)
        return TG_NEXT;
    if (m->seq < 4 || m->d_model % 4)
        return tg_refuse(r, "--token-chunks auto needs --seq >= 4 and --d-model a multiple of 4 "
                            "(the latency fit times slices of a 4-head layer)");
    if (!(auto_lens = malloc(sizeof(int) * (size_t)m->seq)))
        return tg_refuse(r, "--token-chunks auto: out of memory");
    auto_lens[0] = 1, auto_lens[1] = m->seq - 1;
    r->o.pipeline.token_lens = auto_lens;
    return TG_NEXT;
}

/* auto, after the library's resolution: one layer timed on token slices here, the latency model
 * t(l, ctx) fitted, TeraPipe's dynamic program for pp stages (one slice: none) */
static int plan_auto(tg_run *r)
{
    dl_train_opts *o = &r->o;
    if (!tokens_auto || o->layout.pp < 2)
        return TG_NEXT;
    double *scale = NULL;
    int n = 0, rc;
    FILE *f = open_memstream(&auto_note, &auto_note_len);
    if (!f)
        return tg_refuse(r, "--token-chunks auto: out of memory");
    rc = tera_fit_latency(o->model.seq, o->model.d_model, o->batch.micro, f, &auto_fit, auto_err);
    if (rc == DL_OK)
        rc = tera_fit_plan(&auto_fit, o->model.seq, o->layout.pp, o->batch.microbatches, f,
                           auto_lens, &n, &scale);
    fclose(f);
    free(scale);
    o->pipeline.token_chunks = n > 1 ? n : 1;
    o->pipeline.token_lens = n > 1 ? auto_lens : NULL;
    if (rc || (rc = dl_train_resolve(o, o->layout.dp * o->layout.tp * o->layout.pp)))
        return tg_refuse(r, "--token-chunks auto: %s", dl_errmsg());
    return TG_NEXT;
}

static int print_auto(tg_run *r)
{
    (void)r;
    if (auto_note)
        fputs(auto_note, stdout);
    return TG_NEXT;
}

static int p_write(tg_run *r, const char *a)
{
    (void)r;
    write_path = a;
    return cli_check_output("--write-schedule", a);
}

/* a list of costs, one per layer, or "measure" (timed before the run) */
static int p_costs(tg_run *r, const char *a)
{
    static char buf[65536];
    static char *items[MAX_LAYERS];
    int bad = 0;
    r->o.pipeline.layer_costs = costs;
    if (!strcmp(a, "measure")) {
        measure = 1;
        return 0;
    }
    ncosts = 0;
    bad = cli_split_list("--layer-costs", a, buf, sizeof buf, items, MAX_LAYERS, &ncosts);
    for (int i = 0; i < ncosts && !bad; i++)
        bad = cli_parse_double("--layer-costs", items[i], 0, 1e30, &costs[i]);
    return bad;
}

/* the rule: an option that would have no effect in the configuration given is refused */
static int idle(tg_run *r)
{
    const dl_train_pipeline *pl = &r->o.pipeline;
    const char *opt = have_sched               ? "--schedule"
                      : have_virt              ? "--virtual-stages"
                      : pl->layer_costs        ? "--layer-costs"
                      : pl->schedule_file      ? "--schedule-file"
                      : write_path             ? "--write-schedule"
                      : pl->schedule_letters   ? "--schedule-letters"
                      : pl->schedule_mem_limit ? "--schedule-mem-limit"
                      : pl->token_chunks       ? "--token-chunks"
                                               : NULL;
    if (r->o.layout.pp == 1 && opt)
        return tg_refuse(r, "%s needs a pipeline (--pp N, N >= 2): with one stage it has no effect",
                         opt);
    if (pl->schedule_file && (have_sched || have_virt))
        return tg_refuse(r, "--schedule-file gives the schedule and its chunks: %s has no effect",
                         have_sched ? "--schedule" : "--virtual-stages");
    if (!pl->schedule_file && (pl->schedule_letters || pl->schedule_mem_limit))
        return tg_refuse(r, "%s reads a --schedule-file",
                         pl->schedule_letters ? "--schedule-letters" : "--schedule-mem-limit");
    return TG_NEXT;
}

static int count_costs(tg_run *r)
{
    if (r->o.pipeline.layer_costs && !measure && ncosts != r->o.model.layers)
        return tg_refuse(r, "--layer-costs: %d costs for %d layers", ncosts, r->o.model.layers);
    return TG_NEXT;
}

/* --layer-costs measure: on this thread before the ranks start, so they do not compete for the
 * cores */
static int measure_costs(tg_run *r)
{
    char desc[300];
    if (!measure)
        return TG_NEXT;
    if (measure_layer_costs(&r->o.model, r->o.precision.dtype, r->o.batch.micro, 5, costs, desc,
                            sizeof desc)) {
        cli_error("--layer-costs measure: %s", dl_errmsg());
        r->status = CLI_EXIT_FAIL;
        return TG_STOP;
    }
    printf("layer costs measured here: %s\n", desc);
    return TG_NEXT;
}

static void print_gap(const tg_run *run)
{
    const dl_train_result *r = run->r;
    printf("  weight updates between a micro-batch's forward and the weights its backward "
           "used, per stage:");
    for (int st = 0; st < r->pipeline.stages; st++) printf(" %d", r->pipeline.max_gap[st]);
    printf("%s\n", run->o.pipeline.weight_stashing ? " (stashing)" : " (no stashing: p - s)");
}

/* async: the continuous pipeline's steady state beside the simulator's and 1F1B's */
static void print_continuous(const tg_run *run)
{
    const dl_train_pipeline_result *p = &run->r->pipeline;
    printf("  continuous pipeline (no flush between steps; it drains before evaluations, "
           "checkpoints and the end): steady-state bubble %.1f%% measured (median step after "
           "the first), %.1f%% simulated; over a %d-step window with its warm-up and drain "
           "%.1f%% simulated; 1F1B flushes every step: %.1f%% (simulated, same p and m)\n",
           100 * p->bubble_total, 100 * p->bubble_theory, p->window, 100 * p->bubble_window,
           100 * p->bubble_1f1b);
}

/* The schedule file's note (communication actions ignored), and --write-schedule: the schedule
 * this run uses in the CSV form. */
static int sched_files(tg_run *r)
{
    const dl_train_opts *o = &r->o;
    if (o->layout.pp < 2)
        return TG_NEXT;
    char note[256] = "";
    dl_sched *s = NULL;
    int rc = o->pipeline.schedule_file
                 ? dl_sched_load_csv(o->pipeline.schedule_file, o->pipeline.schedule_letters,
                                     o->pipeline.schedule_mem_limit, &s, note, sizeof note)
                 : tr_pipe_make_sched(o, &s);
    if (rc == DL_OK && note[0])
        printf("%s\n", note);
    if (rc == DL_OK && write_path && (rc = dl_sched_save_csv(s, write_path)) == DL_OK)
        printf("wrote the schedule (%s, %d ranks, %d micro-batches) to %s\n",
               dl_sched_kind_name(s->kind), s->p, s->m, write_path);
    dl_sched_free(s);
    if (rc)
        return tg_refuse(r, "%s", dl_errmsg());
    return TG_NEXT;
}

static int summary(tg_run *run)
{
    const dl_train_result *r = run->r;
    const dl_train_opts *o = &run->o;
    if (r->pipeline.stages <= 1)
        return TG_NEXT;
    printf("pipeline: %d stages x %d chunk%s, %s, %d micro-batch%s", r->pipeline.stages,
           r->pipeline.v, tg_plural(r->pipeline.v, "s"),
           dl_sched_kind_name((dl_sched_kind)o->pipeline.schedule), o->batch.microbatches,
           tg_plural(o->batch.microbatches, "es"));
    for (int k = 0; k < o->pipeline.token_chunks && o->pipeline.token_chunks > 1; k++)
        printf("%s%d", k ? "/" : " x token slices of ",
               o->pipeline.token_lens ? o->pipeline.token_lens[k]
                                      : o->model.seq / o->pipeline.token_chunks);
    printf("; layers per virtual stage:");
    for (int i = 0; i < r->pipeline.stages * r->pipeline.v; i++)
        printf(" %d-%d", r->pipeline.bounds[i], r->pipeline.bounds[i + 1] - 1);
    printf("\n  measured bubble per stage (1 - busy/wall, median step):");
    for (int st = 0; st < r->pipeline.stages; st++) printf(" %.1f%%", 100 * r->pipeline.bubble[st]);
    printf("\n  total %.1f%% vs the schedule's own %.1f%% (simulated, a backward twice a "
           "forward%s",
           100 * r->pipeline.bubble_total, 100 * r->pipeline.bubble_theory,
           o->pipeline.token_chunks > 1 ? ", each token slice at its FLOPs" : "");
    if (!isnan(r->pipeline.bubble_paper))
        printf("; the paper's formula at F = B = W: %.1f%%", 100 * r->pipeline.bubble_paper);
    printf("); activation slots per stage:");
    for (int st = 0; st < r->pipeline.stages; st++) printf(" %d", r->pipeline.slots[st]);
    printf("\n  hand-offs %.3f MiB sent by rank 0 per step; engine overhead per action (the "
           "step's wall time less its work, hand-offs and waits, over its actions) %.1f us, "
           "90th percentile %.1f us over the steps and ranks\n",
           cli_mib(r->pipeline.bytes_per_step), r->pipeline.engine_us, r->pipeline.engine_p90_us);
    if (o->pipeline.schedule == DL_SCHED_ASYNC && !o->pipeline.schedule_file)
        print_continuous(run);
    if (o->pipeline.schedule == DL_SCHED_ASYNC)
        print_gap(run);
    return TG_NEXT;
}

static void j_sched(FILE *f, const tg_run *r)
{
    fprintf(f, "\"%s\"",
            r->o.layout.pp > 1 ? dl_sched_kind_name((dl_sched_kind)r->o.pipeline.schedule)
                               : "none");
}
static void j_tokens(FILE *f, const tg_run *r)
{
    int c = r->o.pipeline.token_chunks;
    fprintf(f, "%d", r->o.layout.pp > 1 && c > 1 ? c : 1);
}
static void j_virt(FILE *f, const tg_run *r)
{
    fprintf(f, "%d", r->o.layout.pp > 1 ? r->o.pipeline.virtual_stages : 1);
}
static void j_stash(FILE *f, const tg_run *r)
{
    tg_put_bool(f, r->o.layout.pp > 1 && r->o.pipeline.weight_stashing);
}

/* "key":[v0,v1,...] of n ints, then a comma */
static void put_ints(FILE *f, const char *key, const int *v, int n)
{
    fprintf(f, "\"%s\":[", key);
    for (int i = 0; i < n; i++) fprintf(f, "%s%d", i ? "," : "", v[i]);
    fputs("],", f);
}

/* --token-chunks: the slices' lengths, and auto's latency fit with its error */
static void put_tokens(FILE *f, const dl_train_opts *o)
{
    int c = o->pipeline.token_chunks;
    if (c <= 1)
        return;
    fputs("\"token_lens\":[", f);
    for (int k = 0; k < c; k++)
        fprintf(f, "%s%d", k ? "," : "",
                o->pipeline.token_lens ? o->pipeline.token_lens[k] : o->model.seq / c);
    fputs("],", f);
    if (!tokens_auto)
        return;
    fputs("\"token_fit\":{", f);
    tg_put_keynum(f, "a_s", auto_fit.a, 1);
    tg_put_keynum(f, "b_s_per_token", auto_fit.b, 1);
    tg_put_keynum(f, "c_s_per_token_pair", auto_fit.c, 1);
    tg_put_keynum(f, "rel_rms", auto_err[0], 1);
    tg_put_keynum(f, "rel_max", auto_err[1], 0);
    fputs("},", f);
}

/* every figure of the text summary's pipeline lines */
static int has_pipe(const tg_run *r) { return r->r->pipeline.stages > 1; }
static void j_pipe(FILE *f, const tg_run *run)
{
    const dl_train_pipeline_result *p = &run->r->pipeline;
    fprintf(f, "{\"stages\":%d,\"chunks\":%d,", p->stages, p->v);
    put_ints(f, "layer_bounds", p->bounds, p->stages * p->v + 1);
    fputs("\"bubble_per_stage\":[", f);
    for (int st = 0; st < p->stages; st++) {
        if (st)
            fputc(',', f);
        tg_put_num(f, p->bubble[st]);
    }
    fputs("],", f);
    tg_put_keynum(f, "bubble_total", p->bubble_total, 1);
    tg_put_keynum(f, "bubble_schedule", p->bubble_theory, 1);
    tg_put_keynum(f, "bubble_paper", p->bubble_paper, 1);
    put_ints(f, "activation_slots", p->slots, p->stages);
    if (run->o.pipeline.schedule == DL_SCHED_ASYNC)
        put_ints(f, "weight_version_gaps", p->max_gap, p->stages);
    if (run->o.pipeline.schedule == DL_SCHED_ASYNC && !run->o.pipeline.schedule_file) {
        fprintf(f, "\"window_steps\":%d,", p->window);
        tg_put_keynum(f, "bubble_window", p->bubble_window, 1);
        tg_put_keynum(f, "bubble_1f1b", p->bubble_1f1b, 1);
    }
    put_tokens(f, &run->o);
    tg_put_keynum(f, "handoff_bytes_per_step", p->bytes_per_step, 1);
    tg_put_keynum(f, "engine_us_per_action", p->engine_us, 1);
    tg_put_keynum(f, "engine_us_p90", p->engine_p90_us, 0);
    fputc('}', f);
}

/* clang-format off */
static const tg_opt opts[] = {
    {"schedule", 1, p_sched,
"  --schedule NAME       gpipe (default), 1f1b, interleaved (--virtual-stages v chunks per\n"
"                        stage; layers divisible by pp x v, m a multiple of pp), async\n"
"                        (PipeDream: each stage updates after every backward, no flush: one\n"
"                        continuous pipeline across steps, a step being m micro-batches'\n"
"                        updates; it drains only before an evaluation, a checkpoint and the\n"
"                        end, and a step's time on a stage runs from the end of its previous\n"
"                        step), or\n"
"                        naive (one micro-batch at a time: F, B, update); split backward\n"
"                        (input gradient I, weight gradient W later): 1f1b-split, zb-h1\n"
"                        (Zero Bubble H1, 1F1B's memory), zb-h2 (about twice the\n"
"                        activations), zb-v (two chunks a stage in a V, layers >= 2 pp),\n"
"                        dualpipev (DeepSeek's DualPipeV: zb-v's V, a forward paired with\n"
"                        the other chunk's backward; micro-batches >= 2 pp); these refuse\n"
"                        --recompute full\n"},
    {"schedule-file", 1, p_file,
"  --schedule-file FILE  run the schedule in FILE, torch.distributed.pipelining's CSV form:\n"
"                        a row per rank, each cell an action [stage][F|I|W|B][micro-batch]\n"
"                        (2F0, 1I3, 0W5; B a full backward), stages of a row its chunks;\n"
"                        communication actions ignored; pp = rows, --microbatches = m\n"},
    {"schedule-letters", 1, p_letters,
"  --schedule-letters L  auto (default), new (I input gradient, B full backward) or old\n"
"                        (B input gradient, BW full backward): the file's letters\n"},
    {"schedule-mem-limit", 1, p_limit,
"  --schedule-mem-limit N  refuse a --schedule-file in which a rank holds more than N\n"
"                        activation slots (a micro-batch's chunk from its F to its W)\n"},
    {"write-schedule", 1, p_write,
"  --write-schedule FILE write the schedule this run uses in that CSV form\n"},
    {"token-chunks", 1, p_tokens,
"  --token-chunks C|auto token-level pipelining (TeraPipe): each sequence of a micro-batch\n"
"                        cut into C equal slices (C divides --seq), a slice the unit the\n"
"                        schedule moves; each stage keeps the earlier slices' keys and values\n"
"                        (memory: kvcache). auto: one layer timed on slices here, the latency\n"
"                        t(l, ctx) fitted (printed with its error), TeraPipe's dynamic program\n"
"                        picks unequal slices for the stages (hand-offs sized for the longest).\n"
"                        --schedule gpipe (all forwards, then each sequence's slices backward\n"
"                        last to first) or 1f1b (Seq1F1B: C - 1 more warm-up forwards);\n"
"                        refused with other schedules, MoE layers, --sample\n"},
    {"virtual-stages", 1, p_virt,
"  --virtual-stages N    interleaved: model chunks per stage (default 2)\n"},
    {"weight-stashing", 0, p_stash,
"  --weight-stashing     async: each backward uses the weights its forward used\n"},
    {"layer-costs", 1, p_costs,
"  --layer-costs LIST    comma-separated cost per layer: split layers to stages minimising the\n"
"                        slowest stage (the lecture's dynamic program); default: evenly;\n"
"                        'measure': time the first, a middle and the last layer here first\n"},
    {0},
};
/* clang-format on */
static const tg_hook hooks[] =
    {{TG_CHECK, idle},          {TG_CHECK, count_costs},  {TG_CHECK, auto_check},
     {TG_RESOLVE, plan_auto},   {TG_PREPARE, print_auto}, {TG_PREPARE, measure_costs},
     {TG_PREPARE, sched_files}, {TG_REPORT, summary},     {0}};
static const tg_field config[] = {{"schedule", j_sched, NULL},
                                  {"virtual_stages", j_virt, NULL},
                                  {"weight_stashing", j_stash, NULL},
                                  {"token_chunks", j_tokens, NULL},
                                  {0}};

static const tg_field summary_fields[] = {{"pipeline", j_pipe, has_pipe}, {0}};

const tg_group tg_pipeline =
    {.heading =
         "Pipeline (with --pp N >= 2, refused without; --microbatches is the pipeline's m):\n",
     .opts = opts,
     .hooks = hooks,
     .config = config,
     .summary = summary_fields};
