/* Precision and recomputation: the dtype (bf16: mixed precision) and what backward recomputes. */
#include <string.h>
#include "group.h"
#include "cli.h"

static int p_dtype(tg_run *r, const char *a)
{
    if (!strcmp(a, "f32"))
        r->o.precision.dtype = DL_F32;
    else if (!strcmp(a, "f64"))
        r->o.precision.dtype = DL_F64;
    else if (!strcmp(a, "bf16"))
        r->o.precision.dtype = DL_BF16;
    else {
        cli_error("--dtype: '%s' is not f32, f64 or bf16", a);
        return -1;
    }
    return 0;
}

static int p_recompute(tg_run *r, const char *a)
{
    if (!strcmp(a, "none"))
        r->o.precision.recompute = DL_RECOMPUTE_NONE;
    else if (!strcmp(a, "full"))
        r->o.precision.recompute = DL_RECOMPUTE_FULL;
    else {
        cli_error("--recompute: '%s' is not none or full", a);
        return -1;
    }
    return 0;
}

static void j_dtype(FILE *f, const tg_run *r)
{
    fprintf(f, "\"%s\"", dl_dtype_name(r->o.precision.dtype));
}
static void j_recompute(FILE *f, const tg_run *r)
{
    fputs(r->o.precision.recompute ? "\"full\"" : "\"none\"", f);
}

/* clang-format off */
static const tg_opt opts[] = {
    {"dtype", 1, p_dtype,
"  --dtype f32|f64|bf16  precision of parameters, activations and optimizer state (default f32);\n"
"                        bf16: mixed precision (bf16 parameters and gradients, f32 compute,\n"
"                        fp32 master weights and AdamW moments; non-finite steps skipped)\n"},
    {"recompute", 1, p_recompute,
"  --recompute none|full full: keep only each layer's input, recompute the rest in backward\n"},
    {0},
};
/* clang-format on */
static const tg_field config[] = {{"dtype", j_dtype, NULL}, {"recompute", j_recompute, NULL}, {0}};

/* under the model's heading */
const tg_group tg_precision = {
    .opts = opts,

    .config = config,
};
