/* Model: the GPT's shape. */
#include "group.h"
#include "cli.h"

static int p_layers(tg_run *r, const char *a)
{
    return cli_parse_int("--layers", a, 1, 4096, &r->o.model.layers);
}
static int p_dmodel(tg_run *r, const char *a)
{
    return cli_parse_int("--d-model", a, 1, 1 << 16, &r->o.model.d_model);
}
static int p_heads(tg_run *r, const char *a)
{
    return cli_parse_int("--heads", a, 1, 4096, &r->o.model.heads);
}
static int p_seq(tg_run *r, const char *a)
{
    return cli_parse_int("--seq", a, 1, 1 << 16, &r->o.model.seq);
}
static int p_tie(tg_run *r, const char *a)
{
    (void)a;
    r->o.model.tie = 1;
    return 0;
}

static void init(tg_run *r) { r->o.model.layers = 4; }

static void j_layers(FILE *f, const tg_run *r) { fprintf(f, "%d", r->o.model.layers); }
static void j_dmodel(FILE *f, const tg_run *r) { fprintf(f, "%d", r->o.model.d_model); }
static void j_heads(FILE *f, const tg_run *r) { fprintf(f, "%d", r->o.model.heads); }
static void j_seq(FILE *f, const tg_run *r) { fprintf(f, "%d", r->o.model.seq); }
static void j_vocab(FILE *f, const tg_run *r) { fprintf(f, "%d", r->o.model.vocab); }
static void j_tie(FILE *f, const tg_run *r) { tg_put_bool(f, r->o.model.tie); }
static void j_params(FILE *f, const tg_run *r) { fprintf(f, "%lld", (long long)r->r->nparams); }

/* clang-format off */
static const tg_opt opts[] = {
    {"layers", 1, p_layers,
"  --layers N            transformer blocks (default 4)\n"},
    {"d-model", 1, p_dmodel,
"  --d-model N           width C (default 128)\n"},
    {"heads", 1, p_heads,
"  --heads N             attention heads; must divide --d-model (default 4)\n"},
    {"seq", 1, p_seq,
"  --seq N               context length T (default 64)\n"},
    {"tie-embeddings", 0, p_tie,
"  --tie-embeddings      share the token embedding with the LM head\n"},
    {0},
};
/* clang-format on */
static const tg_field config[] = {{"layers", j_layers, NULL},
                                  {"d_model", j_dmodel, NULL},
                                  {"heads", j_heads, NULL},
                                  {"seq", j_seq, NULL},
                                  {"vocab", j_vocab, NULL},
                                  {"tie_embeddings", j_tie, NULL},
                                  {0}};
static const tg_field summary[] = {{"params", j_params, NULL}, {0}};

const tg_group tg_model = {.heading = "Model:\n",
                           .opts = opts,
                           .init = init,
                           .config = config,
                           .summary = summary};
