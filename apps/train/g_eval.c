/* Evaluation: the validation loss, how often and over how many windows. */
#include "group.h"
#include "cli.h"

static int p_every(tg_run *r, const char *a)
{
    return cli_parse_int("--eval-every", a, 0, 1 << 30, &r->o.eval.every);
}
static int p_windows(tg_run *r, const char *a)
{
    return cli_parse_int("--eval-windows", a, 0, 1 << 30, &r->o.eval.windows);
}

static void init(tg_run *r) { r->o.eval.every = 250; }

static void j_val(FILE *f, const tg_run *r) { tg_put_num(f, r->step->val_loss); }
static void j_final(FILE *f, const tg_run *r) { tg_put_num(f, r->r->eval.final_val_loss); }

/* clang-format off */
static const tg_opt opts[] = {
    {"eval-every", 1, p_every,
"  --eval-every N        validation loss every N steps (default 250; 0: at the end only)\n"},
    {"eval-windows", 1, p_windows,
"  --eval-windows N      validation windows per evaluation (default 64; 0: all)\n"},
    {0},
};
/* clang-format on */
static const tg_field step[] = {{"val_loss", j_val, NULL}, {0}};
static const tg_field summary[] = {{"final_val_loss", j_final, NULL}, {0}};

/* under the data's heading: the validation split is the data's */
const tg_group tg_eval = {.opts = opts, .init = init, .step = step, .summary = summary};
