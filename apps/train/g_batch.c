/* Batch: global = dp x microbatches x micro-batch (any two given; the library resolves). */
#include "group.h"
#include "cli.h"

static int p_global(tg_run *r, const char *a)
{
    return cli_parse_int("--global-batch", a, 1, 1 << 24, &r->o.batch.global);
}
static int p_micro(tg_run *r, const char *a)
{
    return cli_parse_int("--micro-batch", a, 1, 1 << 20, &r->o.batch.micro);
}
static int p_count(tg_run *r, const char *a)
{
    return cli_parse_int("--microbatches", a, 1, 1 << 20, &r->o.batch.microbatches);
}

static void j_global(FILE *f, const tg_run *r) { fprintf(f, "%d", r->o.batch.global); }
static void j_micro(FILE *f, const tg_run *r) { fprintf(f, "%d", r->o.batch.micro); }
static void j_count(FILE *f, const tg_run *r) { fprintf(f, "%d", r->o.batch.microbatches); }

/* clang-format off */
static const tg_opt opts[] = {
    {"global-batch", 1, p_global,
"  --global-batch N      sequences per step (default dp x 8)\n"},
    {"micro-batch", 1, p_micro,
"  --micro-batch N       sequences per forward/backward (default 8)\n"},
    {"microbatches", 1, p_count,
"  --microbatches N      gradient-accumulation steps per optimizer step (default 1)\n"},
    {0},
};
/* clang-format on */
static const tg_field config[] = {{"global_batch", j_global, NULL},
                                  {"micro_batch", j_micro, NULL},
                                  {"microbatches", j_count, NULL},
                                  {0}};

const tg_group tg_batch = {.heading = "Batch (give any two; global = dp x microbatches x "
                                      "micro-batch):\n",
                           .opts = opts,
                           .config = config};
