/* Communication: the gradient all-reduce's buckets and overlap, the collectives' algorithm,
 * and the bytes each rank sends. */
#include "group.h"
#include "cli.h"

static int p_bucket(tg_run *r, const char *a)
{
    return cli_parse_double("--bucket-mb", a, 0, 1 << 20, &r->o.comm.bucket_mb);
}
static int p_overlap(tg_run *r, const char *a)
{
    (void)a;
    r->o.comm.overlap = 1;
    return 0;
}
static int p_algo(tg_run *r, const char *a)
{
    if (dl_algo_parse(a, &r->o.comm.algo)) {
        cli_error("--algo: %s", dl_errmsg());
        return -1;
    }
    return 0;
}

static int bytes_sent(tg_run *run)
{
    const dl_train_result *r = run->r;
    int dp = run->o.layout.dp;
    printf("bytes sent per rank per step: dp gradients %.3f MiB (gradient buffer %.3f MiB; ring "
           "2(d-1)/d = %.3f MiB), tp activations %.3f MiB, loss/norm %.0f B\n",
           cli_mib(r->comm.dp_grads), cli_mib((double)r->memory.grad_bytes),
           dp > 1 ? 2.0 * (dp - 1) / dp * cli_mib((double)r->memory.grad_bytes) : 0.0,
           cli_mib(r->comm.tp_activations), r->comm.loss_and_norm);
    return TG_NEXT;
}

static void j_bucket(FILE *f, const tg_run *r) { tg_put_num(f, r->o.comm.bucket_mb); }
static void j_overlap(FILE *f, const tg_run *r) { tg_put_bool(f, r->o.comm.overlap); }
static void j_algo(FILE *f, const tg_run *r) { fprintf(f, "\"%s\"", dl_algo_name(r->o.comm.algo)); }
static void j_grad_bytes(FILE *f, const tg_run *r)
{
    fprintf(f, "%llu", (unsigned long long)r->r->memory.grad_bytes);
}
static void j_sent(FILE *f, const tg_run *run)
{
    const dl_train_result *r = run->r;
    fputc('{', f);
    tg_put_keynum(f, "dp_grads", r->comm.dp_grads, 1);
    tg_put_keynum(f, "tp_activations", r->comm.tp_activations, 1);
    tg_put_keynum(f, "loss_and_norm", r->comm.loss_and_norm, 1);
    tg_put_keynum(f, "dp_params", r->comm.dp_params, 0);
    fputc('}', f);
}

/* clang-format off */
static const tg_opt opts[] = {
    {"bucket-mb", 1, p_bucket,
"  --bucket-mb X         gradient all-reduce bucket size in MiB (default 1; 0: per layer)\n"},
    {"overlap", 0, p_overlap,
"  --overlap             run the bucket all-reduces on each rank's communication thread\n"
"                        (f32/f64 without ZeRO and pipeline; those reduce after each unit\n"
"                        or after the pipeline)\n"},
    {"algo", 1, p_algo,
"  --algo auto|ring      collective algorithm (ring: the lecture's byte counts exactly)\n"},
    {0},
};
/* clang-format on */
static const tg_hook hooks[] = {{TG_REPORT, bytes_sent}, {0}};
static const tg_field config[] = {{"bucket_mb", j_bucket, NULL},
                                  {"overlap", j_overlap, NULL},
                                  {"algo", j_algo, NULL},
                                  {0}};
static const tg_field summary[] = {{"grad_bytes_per_rank", j_grad_bytes, NULL},
                                   {"bytes_sent_per_rank_per_step", j_sent, NULL},
                                   {0}};

const tg_group tg_comm = {.heading = "Communication:\n",
                          .opts = opts,
                          .hooks = hooks,
                          .config = config,
                          .summary = summary};
