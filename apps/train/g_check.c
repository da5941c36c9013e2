/* --check: the same configuration trained on one rank, and the largest differences of the
 * losses and of the final parameters. */
#include <math.h>
#include "group.h"
#include "cli.h"
#include "mpi_app.h"

static int check, ran;
static double loss_diff, param_diff;
static char worst_tensor[48];

static int p_check(tg_run *r, const char *a)
{
    (void)r, (void)a;
    check = 1;
    return 0;
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
    return TG_NEXT;
}

/* max |a-b| / max |b| per tensor of the unsharded layout, worst over tensors */
static double compare_params(const dl_gpt_config *c, const double *a, const double *b, char *worst)
{
    dl_gpt_layout *l;
    if (dl_gpt_layout_create(c, 1, 0, &l))
        return NAN;
    double w = 0;
    for (int k = 0; k < l->ntensors; k++) {
        double md = 0, mb = 0;
        for (size_t i = 0; i < l->t[k].numel; i++) {
            size_t j = l->t[k].offset + i;
            md = fmax(md, fabs(a[j] - b[j]));
            mb = fmax(mb, fabs(b[j]));
        }
        double rel = mb > 0 ? md / mb : md;
        if (rel >= w) {
            w = rel;
            snprintf(worst, 48, "%s", l->t[k].name);
        }
    }
    dl_gpt_layout_destroy(l);
    return w;
}

/* the configuration on one rank, without the outputs */
static void one_rank(const tg_run *run, dl_train_opts *one)
{
    const dl_train_opts *o = &run->o;
    *one = *o;
    one->layout.dp = one->layout.tp = one->layout.pp = 1;
    one->pipeline.schedule = 0;
    one->pipeline.virtual_stages = 0;
    one->trace.path = NULL;
    one->trace.timeline = 0;
    one->batch.microbatches = o->layout.dp * o->batch.microbatches;
    one->batch.global = o->batch.global;
    /* its progress: a second run as long as the first */
    one->output.log = o->output.log ? stderr : NULL;
    one->trace.first = one->trace.last = 0;
    one->ckpt.save = NULL;
    one->output.dump_grads = NULL;
    one->output.sample = 0;
    one->output.on_step = NULL;
}

static int run_check(tg_run *run)
{
    const dl_train_result *r = run->r;
    dl_train_opts one;
    dl_train_result r1;
    if (!check)
        return TG_NEXT;
    one_rank(run, &one);
    printf("\n== --check: training the same configuration on one rank ...\n");
    fflush(stdout);
    if (dl_train_run(&one, &r1)) {
        cli_error("check run: %s", dl_errmsg());
        run->status = CLI_EXIT_FAIL;
    } else {
        for (int i = 0; i < r->nsteps && i < r1.nsteps; i++)
            loss_diff =
                fmax(loss_diff, fabs(r->steps[i].loss - r1.steps[i].loss) / fabs(r1.steps[i].loss));
        param_diff =
            compare_params(&run->o.model, r->output.params, r1.output.params, worst_tensor);
        ran = 1;
        printf("largest relative difference vs one rank: losses %.3g, parameters %.3g (%s; "
               "per tensor max|a-b|/max|b|)\n",
               loss_diff, param_diff, worst_tensor);
    }
    dl_train_result_free(&r1);
    return TG_NEXT;
}

static int has_check(const tg_run *r) { return (void)r, ran; }
static void j_check(FILE *f, const tg_run *r)
{
    (void)r;
    fputc('{', f);
    tg_put_keynum(f, "max_loss_rel_diff", loss_diff, 1);
    tg_put_keynum(f, "max_param_rel_diff", param_diff, 1);
    fprintf(f, "\"worst_tensor\":\"%s\"}", worst_tensor);
}

/* clang-format off */
static const tg_opt opts[] = {
    {"check", 0, p_check,
"  --check               also train the same configuration on one rank and print the largest\n"
"                        differences of the losses and of the final parameters\n"},
    {0},
};
/* clang-format on */
static const tg_hook hooks[] = {{TG_CHECK, setup_check}, {TG_VERIFY, run_check}, {0}};
static const tg_field summary[] = {{"check", j_check, has_check}, {0}};

/* under the output heading */
const tg_group tg_check = {.opts = opts, .hooks = hooks, .summary = summary};
