/* --check: the same configuration trained on one rank, and a verdict per compared quantity
 * against the library's rounding bounds (lib/train/compare.h, the bounds the tests use): every
 * step's loss, step 1's gradients and parameters (from a one-step run of both, when the run is
 * longer), and the final parameters' drift printed without a verdict (its bound catches gross
 * errors only). Async pipelines are not meant to equal one rank: step 1 only. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "group.h"
#include "cli.h"
#include "mpi_app.h"
#include "train/compare.h"
#include "core/testhook.h"

static int check, ran, pass;
static double loss_diff, param_diff;
static char worst_tensor[48];
static dl__eq_report full, first; /* the whole run (several steps); step 1 */

static int p_check(tg_run *r, const char *a)
{
    (void)r, (void)a;
    check = 1;
    return 0;
}

static int is_async(const dl_train_opts *o)
{
    return o->layout.pp > 1 && o->pipeline.schedule == DL_SCHED_ASYNC;
}

static int setup_check(tg_run *r)
{
    if (r->nprocs > 1 && check) {
        if (app_mpi_rank() == 0) /* every process refuses; one says why */
            cli_error("--check trains on one rank in this process: not available under mpirun "
                      "(compare with a single-process run of the same world instead)");
        return tg_stop(r, CLI_EXIT_USAGE);
    }
    r->o.output.want_params = check;
    r->o.output.want_grads = check && r->o.optim.steps == 1; /* step 1 is the run */
    return TG_NEXT;
}

/* o without the run's outputs (files, progress callbacks, sampling), for a check run */
static dl_train_opts quiet(const dl_train_opts *o)
{
    dl_train_opts q = *o;
    q.trace.path = NULL;
    q.trace.timeline = 0;
    q.trace.first = q.trace.last = 0;
    q.ckpt.save = NULL;
    q.output.log = o->output.log ? stderr : NULL; /* its progress: a second run as long */
    q.output.dump_grads = NULL;
    q.output.sample = 0;
    q.output.on_step = NULL;
    return q;
}

/* the configuration on one rank, the same global batch */
static dl_train_opts one_rank(const dl_train_opts *o)
{
    dl_train_opts one = quiet(o);
    one.layout.dp = one.layout.tp = one.layout.pp = one.layout.ep = 1;
    one.pipeline.schedule = 0;
    one.pipeline.virtual_stages = 0;
    one.pipeline.weight_stashing = 0;
    one.pipeline.layer_costs = NULL;
    one.pipeline.schedule_file = NULL;
    one.pipeline.schedule_letters = one.pipeline.schedule_mem_limit = 0;
    one.pipeline.token_chunks = 0;
    one.pipeline.token_lens = NULL;
    one.batch.microbatches = o->layout.dp * o->batch.microbatches;
    one.batch.global = o->batch.global;
    return one;
}

/* train o for --check: 0, or -1 with the failure printed (r freed) */
static int train(const char *what, const dl_train_opts *o, dl_train_result *r)
{
    printf("\n== --check: %s ...\n", what);
    fflush(stdout);
    if (dl_train_run(o, r) == DL_OK)
        return 0;
    cli_error("check run (%s): %s", what, dl_errmsg());
    dl_train_result_free(r);
    return -1;
}

/* step 1 of this layout and of one rank, with their gradients, compared into `first`. Async:
 * step 1 of one micro-batch per rank, whose forward and backward run on the initial weights */
static int compare_first_step(const tg_run *run)
{
    dl_train_opts a = quiet(&run->o), b;
    a.optim.steps = 1;
    if (is_async(&a)) {
        a.batch.microbatches = 1;
        a.batch.global = a.layout.dp * a.batch.micro;
    }
    b = one_rank(&a);
    a.output.want_params = b.output.want_params = a.output.want_grads = b.output.want_grads = 1;
    dl_train_result ra, rb;
    /* Test hook (tests/apps/test_train_cli.sh): DISTLAB_CHECK_TEST_SKIP=1 skips this layout's
     * first gradient reduction (lib/core/testhook.h), a wrong layout the verdict must fail */
    const char *skip = getenv("DISTLAB_CHECK_TEST_SKIP");
    dl__test_hook h = {.skip_nth = 1, .skip_purpose = DL_PURPOSE_GRADS};
    if (skip && strcmp(skip, "1") == 0)
        dl__test_hook_set(&h);
    int bad =
        train(is_async(&a) ? "step 1 of one micro-batch, this layout" : "step 1 alone, this layout",
              &a, &ra);
    dl__test_hook_set(NULL);
    if (bad)
        return -1;
    if (train("step 1 alone, one rank", &b, &rb)) {
        dl_train_result_free(&ra);
        return -1;
    }
    dl__train_compare(&a, &ra, &rb, &first);
    dl_train_result_free(&ra);
    dl_train_result_free(&rb);
    return 0;
}

/* the whole run against one rank: `full`, the summary's figures */
static int compare_whole_run(const tg_run *run)
{
    const dl_train_result *r = run->r;
    dl_train_opts one = one_rank(&run->o);
    one.output.want_grads = run->o.optim.steps == 1;
    dl_train_result r1;
    if (train("training the same configuration on one rank", &one, &r1))
        return -1;
    for (int i = 0; i < r->nsteps && i < r1.nsteps; i++)
        loss_diff =
            fmax(loss_diff, fabs(r->steps[i].loss - r1.steps[i].loss) / fabs(r1.steps[i].loss));
    param_diff =
        dl__eq_worst_tensor(&run->o.model, r->output.params, r1.output.params, worst_tensor);
    dl__train_compare(&run->o, r, &r1, &full);
    dl_train_result_free(&r1);
    return 0;
}

/* one quantity's line; 1 when it failed its bound */
static int put_item(const dl__eq_report *rep, dl__eq_kind k, const char *label)
{
    static const char *const unit[DL__EQ_N] =
        {"relative", "per tensor max|a-b|/max|b|",
         "per element |a-b| beyond Adam's image of the gradients' difference", ""};
    const dl__eq_item *it = &rep->item[k];
    if (!it->present)
        return 0;
    printf("  %-20s %-4s  %-9.3g <= %-9.3g %s, worst: %s\n", label, it->pass ? "PASS" : "FAIL",
           it->measured, it->bound, unit[k], it->where);
    return !it->pass;
}

static void put_verdicts(const tg_run *run)
{
    const dl_train_opts *o = &run->o;
    int T = o->optim.steps, fails = 0, n = 0;
    char label[32];
    printf("\n--check against one rank: bounds for %s at dp %d x tp %d x pp %d, ZeRO %d "
           "(rounding analysis: lib/train/compare.h)\n",
           dl_dtype_name(o->precision.dtype), o->layout.dp, o->layout.tp,
           o->layout.pp > 1 ? o->layout.pp : 1, o->layout.dp > 1 ? o->zero.stage : 0);
    if (is_async(o)) { /* step 1 of one micro-batch: its loss is the one quantity with a bound */
        printf("  async (PipeDream) is not meant to equal one rank: after each micro-batch's "
               "backward its stage updates\n  the weights the next micro-batches use, with its "
               "own gradient norm, and clears the gradients.\n  Compared: the loss of step 1 "
               "with one micro-batch per rank (initial weights in both)\n");
        fails += put_item(&first, DL__EQ_LOSSES, "step 1 loss"), n++;
    } else {
        const dl__eq_report *one = T == 1 ? &full : &first;
        if (T > 1) {
            snprintf(label, sizeof label, "losses (%d steps)", T);
            fails += put_item(&full, DL__EQ_LOSSES, label), n++;
        } else
            fails += put_item(one, DL__EQ_LOSSES, "step 1 loss"), n++;
        fails += put_item(one, DL__EQ_GRADS, "step 1 gradients"), n++;
        fails += put_item(one, DL__EQ_PARAMS, "step 1 parameters"), n++;
    }
    if (T > 1 && !is_async(o))
        printf("  %-20s %-4s  %-9.3g %12s per tensor max|a-b|/max|b|, worst: %s (no verdict: "
               "after %d steps Adam's bound catches gross errors only)\n",
               "final parameters", "-", param_diff, "", worst_tensor, T);
    pass = fails == 0;
    printf("verdict: %s (%d of %d compared quantities %s: %s)\n", pass ? "PASS" : "FAIL",
           pass ? n : fails, n, pass ? "within their bounds" : "beyond their bounds",
           is_async(o) ? (pass ? "async's first micro-batch is one rank's; later steps differ by "
                                 "design"
                               : "async's first micro-batch is not one rank's")
           : pass      ? "this layout trains the model one rank trains"
                       : "this layout does not train the model one rank trains");
}

static int run_check(tg_run *run)
{
    if (!check)
        return TG_NEXT;
    int async = is_async(&run->o), T = run->o.optim.steps;
    if (((!async || T == 1) && compare_whole_run(run)) || (T > 1 && compare_first_step(run))) {
        run->status = CLI_EXIT_FAIL; /* the summary is still written, without a check */
        return TG_NEXT;
    }
    ran = 1;
    put_verdicts(run);
    if (!pass)
        run->status = CLI_EXIT_FAIL;
    return TG_NEXT;
}

static int has_check(const tg_run *r) { return (void)r, ran; }
static void j_check(FILE *f, const tg_run *r)
{
    fputc('{', f);
    if (!is_async(&r->o)) {
        tg_put_keynum(f, "max_loss_rel_diff", loss_diff, 1);
        tg_put_keynum(f, "max_param_rel_diff", param_diff, 1);
        fprintf(f, "\"worst_tensor\":\"%s\",", worst_tensor);
    }
    /* the verdict lines' figures: the quantity that decided each line, and its bound */
    static const char *const keys[DL__EQ_N] = {"losses", "step1_grads", "step1_params", NULL};
    int T = r->o.optim.steps, async = is_async(&r->o);
    for (int k = 0; k < DL__EQ_N; k++) {
        /* the whole run's losses; step 1 from the run itself (one step) or its own pair */
        const dl__eq_report *rep = !async && (T == 1 || k == DL__EQ_LOSSES) ? &full : &first;
        const dl__eq_item *it = &rep->item[k];
        if (!keys[k] || !it->present || (async && k != DL__EQ_LOSSES))
            continue;
        char key[48];
        snprintf(key, sizeof key, "%s_measured", keys[k]);
        tg_put_keynum(f, key, it->measured, 1);
        snprintf(key, sizeof key, "%s_bound", keys[k]);
        tg_put_keynum(f, key, it->bound, 1);
    }
    fputs("\"verdict\":", f);
    tg_put_str(f, pass ? "PASS" : "FAIL");
    fputc('}', f);
}

/* clang-format off */
static const tg_opt opts[] = {
    {"check", 0, p_check,
"  --check               also train the same configuration on one rank and give a verdict\n"
"                        (PASS/FAIL) per compared quantity against the rounding bounds for the\n"
"                        dtype and layout: the losses, step 1's gradients and parameters; exit\n"
"                        status 1 on FAIL\n"},
    {0},
};
/* clang-format on */
static const tg_hook hooks[] = {{TG_CHECK, setup_check}, {TG_VERIFY, run_check}, {0}};
static const tg_field summary[] = {{"check", j_check, has_check}, {0}};

/* under the output heading */
const tg_group tg_check = {.opts = opts, .hooks = hooks, .summary = summary};
