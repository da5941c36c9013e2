/* Optimisation: steps, AdamW and its learning-rate schedule, clipping, the initialisation; the
 * loss each step, and the steps not taken. */
#include <stdint.h>
#include "group.h"
#include "cli.h"

static int have_min_lr;

static int p_steps(tg_run *r, const char *a)
{
    return cli_parse_int("--steps", a, 1, 1 << 30, &r->o.optim.steps);
}
static int p_lr(tg_run *r, const char *a)
{
    return cli_parse_double("--lr", a, 1e-12, 10, &r->o.optim.lr);
}
static int p_min_lr(tg_run *r, const char *a)
{
    have_min_lr = 1;
    return cli_parse_double("--min-lr", a, 0, 10, &r->o.optim.min_lr);
}
static int p_warmup(tg_run *r, const char *a)
{
    return cli_parse_int("--warmup", a, 0, 1 << 30, &r->o.optim.warmup);
}
static int p_wd(tg_run *r, const char *a)
{
    return cli_parse_double("--weight-decay", a, 0, 10, &r->o.optim.weight_decay);
}
static int p_clip(tg_run *r, const char *a)
{
    return cli_parse_double("--clip", a, 0, 1e30, &r->o.optim.clip);
}
static int p_seed(tg_run *r, const char *a)
{
    return cli_parse_size("--seed", a, 0, UINT64_MAX, &r->o.optim.seed);
}

static void init(tg_run *r) { r->o.optim.steps = 1500; }

static int min_lr(tg_run *r)
{
    if (!have_min_lr)
        r->o.optim.min_lr = r->o.optim.lr / 10;
    return TG_NEXT;
}

/* a step whose gradient is not finite is not taken (bf16's guard; any dtype's NaN) */
static int skipped(tg_run *run)
{
    if (run->r->optim.skipped_steps)
        printf("%d step(s) skipped: non-finite gradient\n", run->r->optim.skipped_steps);
    return TG_NEXT;
}

static void j_steps(FILE *f, const tg_run *r) { fprintf(f, "%d", r->o.optim.steps); }
static void j_lr(FILE *f, const tg_run *r) { tg_put_num(f, r->o.optim.lr); }
static void j_min_lr(FILE *f, const tg_run *r) { tg_put_num(f, r->o.optim.min_lr); }
static void j_warmup(FILE *f, const tg_run *r) { fprintf(f, "%d", r->o.optim.warmup); }
static void j_seed(FILE *f, const tg_run *r)
{
    fprintf(f, "%llu", (unsigned long long)r->o.optim.seed);
}
static void j_loss(FILE *f, const tg_run *r) { tg_put_num(f, r->step->loss); }
static void j_step_lr(FILE *f, const tg_run *r) { tg_put_num(f, r->step->lr); }
static void j_norm(FILE *f, const tg_run *r) { tg_put_num(f, r->step->grad_norm); }
static void j_skipped(FILE *f, const tg_run *r) { tg_put_bool(f, r->step->skipped); }
static void j_final(FILE *f, const tg_run *r) { tg_put_num(f, r->r->optim.final_loss); }
static void j_nskipped(FILE *f, const tg_run *r) { fprintf(f, "%d", r->r->optim.skipped_steps); }

/* clang-format off */
static const tg_opt opts[] = {
    {"steps", 1, p_steps,
"  --steps N             optimizer steps (default 1500: about a minute on 2 cores)\n"},
    {"lr", 1, p_lr,
"  --lr X                peak learning rate (default 3e-3); --min-lr X final (default lr/10)\n"},
    {"min-lr", 1, p_min_lr, NULL},
    {"warmup", 1, p_warmup,
"  --warmup N            linear warm-up steps (default 20), then cosine decay\n"},
    {"weight-decay", 1, p_wd,
"  --weight-decay X      AdamW decoupled weight decay (default 0.01)\n"},
    {"clip", 1, p_clip,
"  --clip X              clip the global gradient norm to X (default 1; 0: off)\n"},
    {"seed", 1, p_seed,
"  --seed N              parameter initialisation (default 1)\n"},
    {0},
};
/* clang-format on */
static const tg_hook hooks[] = {{TG_CHECK, min_lr}, {TG_REPORT, skipped}, {0}};
static const tg_field config[] = {{"steps", j_steps, NULL},   {"lr", j_lr, NULL},
                                  {"min_lr", j_min_lr, NULL}, {"warmup", j_warmup, NULL},
                                  {"seed", j_seed, NULL},     {0}};
static const tg_field step[] = {{"loss", j_loss, NULL},
                                {"lr", j_step_lr, NULL},
                                {"grad_norm", j_norm, NULL},
                                {"skipped", j_skipped, NULL},
                                {0}};
static const tg_field summary[] = {{"final_loss", j_final, NULL},
                                   {"skipped_steps", j_nskipped, NULL},
                                   {0}};

const tg_group tg_optim = {.heading = "Optimisation:\n",
                           .opts = opts,
                           .hooks = hooks,
                           .init = init,
                           .config = config,
                           .step = step,
                           .summary = summary};
