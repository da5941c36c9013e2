/* --plot FILE.svg|FILE.png: the loss curve (training and validation loss against step, the
 * corpus's floor as a line) through the harness's gnuplot driver (apps/common/bench_util.h):
 * FILE.dat and FILE.gp are written beside it, and rendered when gnuplot is installed. */
#include <math.h>
#include <stdlib.h>
#include "group.h"
#include "cli.h"
#include "mpi_app.h"
#include "bench_util.h"
#include "core/strbuf.h"

static const char *plot;

static int p_plot(tg_run *r, const char *a)
{
    (void)r;
    plot = a;
    return bu_plot_check(a) ? -1 : 0;
}

/* the rule: an option that would have no effect in the configuration given is refused */
static int idle(tg_run *r)
{
    if (plot && r->o.eval.only)
        return tg_refuse(r, "--plot draws the training's loss curve: --eval-only trains no step");
    return TG_NEXT;
}

/* two gnuplot data blocks: every step's training loss; the validation losses where evaluated */
static int data(const dl_train_result *r, dl__strbuf *b)
{
    dl__sb_printf(b, "# step  training loss\n");
    for (int i = 0; i < r->nsteps; i++)
        dl__sb_printf(b, "%d %.9g\n", r->steps[i].step, r->steps[i].loss);
    dl__sb_printf(b, "\n\n# step  validation loss\n");
    for (int i = 0; i < r->nsteps; i++)
        if (!isnan(r->steps[i].val_loss))
            dl__sb_printf(b, "%d %.9g\n", r->steps[i].step, r->steps[i].val_loss);
    return b->oom ? -1 : 0;
}

static int draw(tg_run *run)
{
    const dl_train_result *r = run->r;
    const dl_train_opts *o = &run->o;
    if (!plot || (run->nprocs > 1 && app_mpi_rank() != 0))
        return TG_NEXT;
    dl__strbuf d = {0}, s = {0};
    char *dat = NULL, *gp = NULL;
    data(r, &d);
    dl__sb_printf(&s,
                  "set title \"distlab-train: loss against step (dp %d x tp %d x pp %d, %s, %d "
                  "steps)\"\nset key inside top right\nset xlabel 'step'\nset ylabel 'loss (nats "
                  "per byte)'\n"
                  "plot datafile index 0 using 1:2 with lines lw 2 title 'training loss', \\\n"
                  "     datafile index 1 using 1:2 with linespoints pt 7 title 'validation loss'",
                  o->layout.dp, o->layout.tp, o->layout.pp > 1 ? o->layout.pp : 1,
                  dl_dtype_name(o->precision.dtype), r->nsteps);
    if (!isnan(r->data.floor))
        dl__sb_printf(&s,
                      ", \\\n     %.9g with lines dt 2 title \"the corpus's entropy rate (the "
                      "floor)\"",
                      r->data.floor);
    dl__sb_printf(&s, "\n");
    int bad = dl__sb_finish(&d, &dat, "--plot") || dl__sb_finish(&s, &gp, "--plot");
    if (bad)
        cli_error("%s", dl_errmsg());
    else
        bad = bu_plot_to(plot, dat, gp, stdout) != 0;
    free(dat);
    free(gp);
    if (bad)
        run->status = CLI_EXIT_FAIL;
    return TG_NEXT;
}

/* clang-format off */
static const tg_opt opts[] = {
    {"plot", 1, p_plot,
"  --plot FILE.svg       the loss curve: training and validation loss against step, the\n"
"                        corpus's floor as a line (or FILE.png); FILE.dat and FILE.gp beside\n"
"                        it, rendered by gnuplot when it is installed\n"},
    {0},
};
/* clang-format on */
static const tg_hook hooks[] = {{TG_CHECK, idle}, {TG_CLOSE, draw}, {0}};

/* under the output heading */
const tg_group tg_plot = {.opts = opts, .hooks = hooks};
