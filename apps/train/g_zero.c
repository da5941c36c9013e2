/* ZeRO over the dp group: its stage, its shards and the model state per rank against the
 * paper's formulas (also shown for bf16's mixed precision, whose K it changes). */
#include <limits.h>
#include <stdint.h>
#include "group.h"
#include "cli.h"

static int given; /* --zero on the command line (a checkpoint's manifest is exempt) */

static int p_zero(tg_run *r, const char *a)
{
    given = 1;
    int bad = cli_parse_int("--zero", a, INT_MIN, INT_MAX, &r->o.zero.stage);
    if (!bad && (r->o.zero.stage < 0 || r->o.zero.stage > 3)) {
        cli_error("--zero: %d is out of range [0, 3]", r->o.zero.stage);
        bad = 1;
    }
    return bad ? -1 : 0;
}

/* the rule: an option that would have no effect in the configuration given is refused (the
 * world is known: dp may come from the cores) */
static int idle(tg_run *r)
{
    if (given && r->o.zero.stage > 0 && r->o.layout.dp == 1)
        return tg_refuse(r,
                         "--zero %d needs data parallelism (--dp N, N >= 2): ZeRO shards over the "
                         "dp group, so with dp 1 it has no effect",
                         r->o.zero.stage);
    return TG_NEXT;
}

/* Model state per rank from rank 0's arena peaks, against the ZeRO paper's formula (Psi: the
 * rank's elements, padded per unit when sharded; K: the optimizer's bytes per element). */
typedef struct model_state_t {
    uint64_t bytes;
    int64_t P;
    int K;
    double per_param, formula_bytes, formula_elems;
    const char *formula;
} model_state_t;

static void model_state(const dl_train_opts *o, const dl_train_result *r, model_state_t *m)
{
    int ss = (int)dl_dtype_size(o->precision.dtype), cs = o->precision.dtype == DL_F64 ? 8 : 4,
        st = r->zero.stage;
    int N = st ? o->layout.dp : 1;
    m->bytes = r->memory.peak[DL_MEM_PARAMS] + r->memory.peak[DL_MEM_GRADS] +
               r->memory.peak[DL_MEM_OPTIMIZER];
    m->P = (int64_t)(r->memory.grad_bytes / (uint64_t)ss);
    m->K = 2 * cs + (o->precision.dtype == DL_BF16 ? 4 : 0);
    m->per_param = m->P ? (double)m->bytes / (double)m->P : 0;
    double P = (double)m->P, Pp = st ? (double)r->zero.padded : P, K = m->K;
    static const char *f[4] = {"(2+2+K) Psi", "2 Psi + 2 Psi + K Psi/N", "2 Psi + (2+K) Psi/N",
                               "(2+2+K) Psi/N"};
    m->formula = f[st];
    double b[4] = {(2.0 * ss + K) * P, 2.0 * ss * P + K * Pp / N, ss * P + (ss + K) * Pp / N,
                   (2.0 * ss + K) * Pp / N};
    m->formula_bytes = b[st];
    m->formula_elems =
        o->layout.dp > 1 ? (st == 3 ? 3.0 : 2.0) * Pp * (o->layout.dp - 1) / o->layout.dp : 0;
}

static int shards(tg_run *run)
{
    const dl_train_result *r = run->r;
    int dp = run->o.layout.dp;
    int ep = run->o.layout.ep > 1 ? run->o.layout.ep : 1;
    if (r->zero.stage && ep > 1) /* the expert pieces have the other group: no one multiple */
        printf("ZeRO stage %d over dp %d, the experts over the expert-data-parallel group of %d: "
               "each rank holds a shard of %lld elements of its tp/pp/ep part of the model, %lld "
               "elements in %d units (dense and expert pieces), padded to %lld (+%lld); per step "
               "dp gradients (reduce-scatter) %.3f MiB + parameters (all-gather) %.3f MiB\n",
               r->zero.stage, dp, dp / ep, (long long)r->zero.shard,
               (long long)(r->zero.padded - r->zero.padding), r->zero.units,
               (long long)r->zero.padded, (long long)r->zero.padding, cli_mib(r->comm.dp_grads),
               cli_mib(r->comm.dp_params));
    else if (r->zero.stage)
        printf("ZeRO stage %d over dp %d: each rank holds a shard of %lld elements: its tp/pp part "
               "of the model, %lld elements in %d units, each padded to a multiple of %d, is %lld "
               "(+%lld) = %d shards; per step dp gradients (reduce-scatter) %.3f MiB + "
               "parameters (all-gather) %.3f MiB\n",
               r->zero.stage, dp, (long long)r->zero.shard,
               (long long)(r->zero.padded - r->zero.padding), r->zero.units, dp,
               (long long)r->zero.padded, (long long)r->zero.padding, dp, cli_mib(r->comm.dp_grads),
               cli_mib(r->comm.dp_params));
    return TG_NEXT;
}

static int state_lines(tg_run *run)
{
    const dl_train_result *r = run->r;
    const dl_train_opts *o = &run->o;
    model_state_t ms;
    model_state(o, r, &ms);
    if (!r->zero.stage && o->precision.dtype != DL_BF16)
        return TG_NEXT;
    printf("model state per rank (rank 0's arena peaks): params %llu + grads %llu + optimizer "
           "%llu = %llu bytes = %.2f bytes per parameter (P = %lld, K = %d; the paper's %s = "
           "%.0f)\n",
           (unsigned long long)r->memory.peak[DL_MEM_PARAMS],
           (unsigned long long)r->memory.peak[DL_MEM_GRADS],
           (unsigned long long)r->memory.peak[DL_MEM_OPTIMIZER], (unsigned long long)ms.bytes,
           ms.per_param, (long long)ms.P, ms.K, ms.formula, ms.formula_bytes);
    printf("  unit buffers (comm/other, outside the model state): %llu bytes, of which "
           "gathered parameters %llu\n",
           (unsigned long long)r->memory.unit_bytes, (unsigned long long)r->memory.gathered_bytes);
    printf("  dp elements sent per rank per step: %.0f (the paper's %s = %.0f with one "
           "micro-batch%s)\n",
           r->comm.dp_elems, r->zero.stage == 3 ? "3 Psi (N-1)/N" : "2 Psi (N-1)/N",
           ms.formula_elems,
           o->batch.microbatches > 1 && r->zero.stage >= 2
               ? "; stages 2-3 reduce (and stage 3 gathers) "
                 "once per micro-batch"
               : "");
    return TG_NEXT;
}

static void j_zero(FILE *f, const tg_run *r) { fprintf(f, "%d", r->o.zero.stage); }

static void j_shards(FILE *f, const tg_run *run)
{
    const dl_train_result *r = run->r;
    fprintf(f, "{\"stage\":%d,\"padded_elements\":%lld,\"padding\":%lld,\"shard_elements\":%lld}",
            r->zero.stage, (long long)r->zero.padded, (long long)r->zero.padding,
            (long long)r->zero.shard);
}

static void j_state(FILE *f, const tg_run *run)
{
    const dl_train_result *r = run->r;
    model_state_t ms;
    model_state(&run->o, r, &ms);
    fprintf(f, "{\"bytes_per_rank\":%llu,", (unsigned long long)ms.bytes);
    tg_put_keynum(f, "bytes_per_param", ms.per_param, 1);
    fprintf(f, "\"K\":%d,", ms.K);
    tg_put_keynum(f, "formula_bytes", ms.formula_bytes, 1);
    tg_put_keynum(f, "elements_sent_per_step", r->comm.dp_elems, 1);
    tg_put_keynum(f, "formula_elements", ms.formula_elems, 1);
    fprintf(f, "\"unit_buffer_bytes\":%llu,\"gathered_param_bytes\":%llu}",
            (unsigned long long)r->memory.unit_bytes, (unsigned long long)r->memory.gathered_bytes);
}

/* clang-format off */
static const tg_opt opts[] = {
    {"zero", 1, p_zero,
"  --zero 0|1|2|3        ZeRO stage over the dp group (default 0): 1 shards AdamW's state\n"
"                        (reduce-scatter, update the shard, all-gather the parameters),\n"
"                        2 also the gradients (reduce-scattered layer by layer during\n"
"                        backward), 3 also the parameters (each layer all-gathered before its\n"
"                        forward and its backward); needs --dp 2 or more\n"},
    {0},
};
/* clang-format on */
static const tg_hook hooks[] = {{TG_RESOLVE, idle},
                                {TG_REPORT, shards},
                                {TG_REPORT, state_lines},
                                {0}};
static const tg_field config[] = {{"zero", j_zero, NULL}, {0}};
static const tg_field summary[] = {{"zero", j_shards, NULL}, {"model_state", j_state, NULL}, {0}};

/* under the communication heading: ZeRO changes what the dp group sends */
const tg_group tg_zero = {.opts = opts, .hooks = hooks, .config = config, .summary = summary};
