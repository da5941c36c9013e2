/* Reporting: the progress lines, the banner, and the summary's header, losses, throughput,
 * GEMM utilisation and peak memory. */
#include <math.h>
#include <unistd.h>
#include "group.h"
#include "cli.h"

static int quiet;
static const char *cat_names[DL_MEM_NCATEGORIES] = {"params", "grads", "optimizer", "activations",
                                                    "comm",   "other", "ckpt",      "kvcache"};

static int p_every(tg_run *r, const char *a)
{
    return cli_parse_int("--log-every", a, 0, 1 << 30, &r->o.output.log_every);
}
static int p_quiet(tg_run *r, const char *a)
{
    (void)r, (void)a;
    quiet = 1;
    return 0;
}

static void init(tg_run *r)
{
    r->o.output.log_every = 100;
    r->o.output.log = stdout;
}

static int set_quiet(tg_run *r)
{
    if (quiet)
        r->o.output.log = NULL;
    return TG_NEXT;
}

/* Every axis in use: "dp 2 x tp 2 x pp 2; schedule 1f1b" (also the virtual stages when
 * interleaved, and ZeRO's stage), for the banner and the summary header alike. */
static void layout_desc(const dl_train_opts *o, char *buf, size_t n)
{
    int k = snprintf(buf, n, "dp %d x tp %d x pp %d", o->layout.dp, o->layout.tp, o->layout.pp);
    if (o->layout.pp > 1 && k >= 0 && (size_t)k < n)
        k += snprintf(buf + k, n - (size_t)k, "; schedule %s%s",
                      dl_sched_kind_name((dl_sched_kind)o->pipeline.schedule),
                      o->pipeline.weight_stashing ? " with weight stashing" : "");
    if (o->layout.pp > 1 && o->pipeline.virtual_stages > 1 && k >= 0 && (size_t)k < n)
        k += snprintf(buf + k, n - (size_t)k, ", %d virtual stages", o->pipeline.virtual_stages);
    if (o->zero.stage && o->layout.dp > 1 && k >= 0 && (size_t)k < n)
        snprintf(buf + k, n - (size_t)k, "; ZeRO %d", o->zero.stage);
}

static int banner(tg_run *r)
{
    const dl_train_opts *o = &r->o;
    int n = o->layout.dp * o->layout.tp * o->layout.pp, np = r->nprocs;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    char lay[160];
    layout_desc(o, lay, sizeof lay);
    printf("distlab-train %s: %d rank%s (%s) on %ld cores%s; model: %d layer%s, "
           "d-model %d, %d head%s, seq %d, %lld parameters%s, %s%s\n",
           dl_version(), n, tg_plural(n, "s"), lay, cores,
           n > cores ? " (oversubscribed: timings include contention)" : "", o->model.layers,
           tg_plural(o->model.layers, "s"), o->model.d_model, o->model.heads,
           tg_plural(o->model.heads, "s"), o->model.seq, (long long)dl_gpt_num_params(&o->model),
           o->model.tie ? " (tied embeddings)" : "", dl_dtype_name(o->precision.dtype),
           o->precision.recompute ? ", full recompute" : "");
    if (np > 1)
        printf("MPI: %d processes x %d rank threads (process k hosts ranks %dk ... %dk+%d; each "
               "process is one node)\n",
               np, n / np, n / np, n / np, n / np - 1);
    if (o->eval.only)
        printf("evaluating '%s' on the validation split of %s\n", o->ckpt.load,
               o->data.path ? o->data.path : "the synthetic corpus");
    else
        printf("batch: global %d = dp %d x %d micro-batch%s x %d sequence%s of %d bytes; %d "
               "step%s, lr %g (warm-up %d, cosine to %g); data: %s\n",
               o->batch.global, o->layout.dp, o->batch.microbatches,
               tg_plural(o->batch.microbatches, "es"), o->batch.micro,
               tg_plural(o->batch.micro, "s"), o->model.seq, o->optim.steps,
               tg_plural(o->optim.steps, "s"), o->optim.lr, o->optim.warmup, o->optim.min_lr,
               o->data.path ? o->data.path : "synthetic order-2 Markov corpus");
    return TG_NEXT;
}

/* the banner is on stdout before any rank prints */
static int flush(tg_run *r)
{
    (void)r;
    fflush(stdout);
    return TG_NEXT;
}

static int header(tg_run *run)
{
    const dl_train_result *r = run->r;
    char lay[160];
    layout_desc(&run->o, lay, sizeof lay);
    printf("\n== summary: %d step%s, %d rank%s (%s), %lld parameters, %s\n", r->nsteps,
           tg_plural(r->nsteps, "s"), r->nranks, tg_plural(r->nranks, "s"), lay,
           (long long)r->nparams, dl_dtype_name(run->o.precision.dtype));
    if (!isnan(r->data.floor))
        printf("final loss %.4f (validation %.4f) vs the corpus's entropy rate %.4f nats: %.4f "
               "above the floor\n",
               r->optim.final_loss, r->eval.final_val_loss, r->data.floor,
               r->eval.final_val_loss - r->data.floor);
    else
        printf("final loss %.4f (validation %.4f)\n", r->optim.final_loss, r->eval.final_val_loss);
    printf("throughput %.0f tokens/s, %.1f ms/step (median)\n", r->speed.tokens_per_s,
           r->speed.ms_per_step);
    if (r->speed.gemm_gflops > 0)
        printf("GEMM utilisation %.0f%%: model %.1f GFLOP/s per rank vs %.1f GFLOP/s single-thread "
               "GEMM on the model's shapes\n",
               100 * r->speed.model_gflops_per_rank / r->speed.gemm_gflops,
               r->speed.model_gflops_per_rank, r->speed.gemm_gflops);
    return TG_NEXT;
}

static int peak_memory(tg_run *run)
{
    const dl_train_result *r = run->r;
    const dl_train_layout *l = &run->o.layout;
    int tp = l->tp, dp = l->dp;
    printf("peak memory per rank (each category's own peak over the run):\n  rank  (dp,tp,pp)");
    for (int c = 0; c < DL_MEM_NCATEGORIES; c++) {
        char h[32];
        snprintf(h, sizeof h, "%s MiB", cat_names[c]);
        printf(" %15s", h);
    }
    printf("\n");
    for (int k = 0; k < r->nranks; k++) { /* world rank = (pp index x dp + dp index) x tp + tp */
        char at[48];
        snprintf(at, sizeof at, "(%d,%d,%d)", k / tp % dp, k % tp, k / (tp * dp));
        printf("  %4d  %-10s", k, at);
        for (int c = 0; c < DL_MEM_NCATEGORIES; c++)
            printf(" %15.3f", cli_mib((double)r->memory.peak[(size_t)k * DL_MEM_NCATEGORIES + c]));
        printf("\n");
    }
    return TG_NEXT;
}

static void j_ms(FILE *f, const tg_run *r) { tg_put_num(f, r->step->ms); }
static void j_tps(FILE *f, const tg_run *r) { tg_put_num(f, r->step->tokens_per_s); }
static void j_rtps(FILE *f, const tg_run *r) { tg_put_num(f, r->r->speed.tokens_per_s); }
static void j_msps(FILE *f, const tg_run *r) { tg_put_num(f, r->r->speed.ms_per_step); }
static void j_gemm(FILE *f, const tg_run *r) { tg_put_num(f, r->r->speed.gemm_gflops); }
static void j_model(FILE *f, const tg_run *r) { tg_put_num(f, r->r->speed.model_gflops_per_rank); }
static void j_util(FILE *f, const tg_run *run)
{
    const dl_train_result *r = run->r;
    tg_put_num(f, r->speed.gemm_gflops > 0 ? r->speed.model_gflops_per_rank / r->speed.gemm_gflops
                                           : NAN);
}
static void j_peak(FILE *f, const tg_run *run)
{
    const dl_train_result *r = run->r;
    fputc('[', f);
    for (int k = 0; k < r->nranks; k++) {
        fprintf(f, "%s{\"rank\":%d", k ? "," : "", k);
        for (int c = 0; c < DL_MEM_NCATEGORIES; c++)
            fprintf(f, ",\"%s\":%llu", cat_names[c],
                    (unsigned long long)r->memory.peak[(size_t)k * DL_MEM_NCATEGORIES + c]);
        fputc('}', f);
    }
    fputc(']', f);
}

/* clang-format off */
static const tg_opt opts[] = {
    {"log-every", 1, p_every,
"  --log-every N         progress line every N steps (default 100; 0: none): loss, tok/s and\n"
"                        ms/step over the steps since the last line, MiB sent per step\n"},
    {"quiet", 0, p_quiet,
"  --quiet               no progress lines (nor the --check run's, which go to stderr)\n"},
    {0},
};
/* clang-format on */
static const tg_hook hooks[] = {{TG_CHECK, set_quiet},    {TG_ANNOUNCE, banner},
                                {TG_PREPARE, flush},      {TG_HEAD, header},
                                {TG_REPORT, peak_memory}, {0}};
static const tg_field step[] = {{"ms", j_ms, NULL}, {"tokens_per_s", j_tps, NULL}, {0}};
static const tg_field summary[] = {{"tokens_per_s", j_rtps, NULL},
                                   {"ms_per_step", j_msps, NULL},
                                   {"gemm_gflops", j_gemm, NULL},
                                   {"model_gflops_per_rank", j_model, NULL},
                                   {"gemm_utilisation", j_util, NULL},
                                   {"peak_bytes_per_rank", j_peak, NULL},
                                   {0}};

const tg_group tg_report =
    {.heading = "Output (an existing output FILE must be a regular file, not a symlink: nothing "
                "else is\nreplaced; checked with its directory before the run, exit 2):\n",
     .opts = opts,
     .hooks = hooks,
     .init = init,
     .step = step,
     .summary = summary};
