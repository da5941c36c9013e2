/* Optimisation: steps, AdamW and its learning-rate schedule, clipping, the initialisation. */
#include <stdint.h>
#include "group.h"
#include "cli.h"

static int have_min_lr;

static int p_steps(tg_run *r, const char *a)
{
    return cli_parse_int("--steps", a, 1, 1 << 30, &r->o.steps);
}
static int p_lr(tg_run *r, const char *a)
{
    return cli_parse_double("--lr", a, 1e-12, 10, &r->o.lr);
}
static int p_min_lr(tg_run *r, const char *a)
{
    have_min_lr = 1;
    return cli_parse_double("--min-lr", a, 0, 10, &r->o.min_lr);
}
static int p_warmup(tg_run *r, const char *a)
{
    return cli_parse_int("--warmup", a, 0, 1 << 30, &r->o.warmup);
}
static int p_wd(tg_run *r, const char *a)
{
    return cli_parse_double("--weight-decay", a, 0, 10, &r->o.weight_decay);
}
static int p_clip(tg_run *r, const char *a)
{
    return cli_parse_double("--clip", a, 0, 1e30, &r->o.clip);
}
static int p_seed(tg_run *r, const char *a)
{
    return cli_parse_size("--seed", a, 0, UINT64_MAX, &r->o.seed);
}

static void init(tg_run *r) { r->o.steps = 1500; }

static int min_lr(tg_run *r)
{
    if (!have_min_lr)
        r->o.min_lr = r->o.lr / 10;
    return TG_NEXT;
}

static void j_steps(FILE *f, const tg_run *r) { fprintf(f, "%d", r->o.steps); }
static void j_lr(FILE *f, const tg_run *r) { tg_put_num(f, r->o.lr); }
static void j_min_lr(FILE *f, const tg_run *r) { tg_put_num(f, r->o.min_lr); }
static void j_warmup(FILE *f, const tg_run *r) { fprintf(f, "%d", r->o.warmup); }
static void j_seed(FILE *f, const tg_run *r) { fprintf(f, "%llu", (unsigned long long)r->o.seed); }
static void j_step_lr(FILE *f, const tg_run *r) { tg_put_num(f, r->step->lr); }
static void j_norm(FILE *f, const tg_run *r) { tg_put_num(f, r->step->grad_norm); }

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
static const tg_hook setup[] = {{20, min_lr}, {0}};
static const tg_field config[] = {{180, "steps", j_steps, NULL},   {200, "lr", j_lr, NULL},
                                  {210, "min_lr", j_min_lr, NULL}, {220, "warmup", j_warmup, NULL},
                                  {270, "seed", j_seed, NULL},     {0}};
static const tg_field step[] = {{40, "lr", j_step_lr, NULL}, {50, "grad_norm", j_norm, NULL}, {0}};

const tg_group tg_optim = {.heading = "Optimisation:\n",
                           .opts = opts,
                           .init = init,
                           .setup = setup,
                           .config = config,
                           .step = step};
