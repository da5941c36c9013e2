/* distlab-train: train a GPT-style byte model on rank threads with data and tensor parallelism. */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "distlab.h"
#include "core/blas.h"
#include "core/topo.h"
#include "cli.h"
#include "layer_costs.h"
#include "mpi_app.h"
#include "core/json.h"

static void usage(FILE *f)
{
    /* clang-format off */
    fprintf(f,
"Usage: distlab-train [options]\n"
"\n"
"Trains a GPT-style decoder over bytes on dp x tp x pp rank threads (data, Megatron tensor\n"
"and pipeline parallelism). Every layout trains exactly the model one rank trains (--check shows it).\n"
"With no options: a small model on the built-in corpus with dp = the number of cores.\n"
"\n"
"Layout:\n"
"  --dp N                data-parallel ranks (default: number of cores / (tp x pp))\n"
"  --tp N                tensor-parallel ranks; must divide --heads (default 1)\n"
"  --pp N                pipeline stages; at most --layers (default 1)\n"
"Pipeline (with --pp N >= 2, refused without; --microbatches is the pipeline's m):\n"
"  --schedule NAME       gpipe (default), 1f1b, interleaved (--virtual-stages v chunks per\n"
"                        stage; layers divisible by pp x v, m a multiple of pp), async\n"
"                        (PipeDream: each stage updates after every backward, no flush), or\n"
"                        naive (one micro-batch at a time: F, B, update)\n"
"  --virtual-stages N    interleaved: model chunks per stage (default 2)\n"
"  --weight-stashing     async: each backward uses the weights its forward used\n"
"  --layer-costs LIST    comma-separated cost per layer: split layers to stages minimising the\n"
"                        slowest stage (the lecture's dynamic program); default: evenly;\n"
"                        'measure': time the first, a middle and the last layer here first\n"
"  --trace FILE          write every rank's timeline as Chrome trace JSON (open in Perfetto)\n"
"  --timeline            print the last step's measured timeline as the lecture's grid, with\n"
"                        its legend (every stage's actions listed too when cells merge them)\n"
"  --trace-steps A:B     trace (--trace, --timeline) only steps A..B (or A alone): the trace\n"
"                        file is written as soon as step B+1 ends, not at the run's end, and\n"
"                        the timeline is step B's\n"
"Model:\n"
"  --layers N            transformer blocks (default 4)\n"
"  --d-model N           width C (default 128)\n"
"  --heads N             attention heads; must divide --d-model (default 4)\n"
"  --seq N               context length T (default 64)\n"
"  --tie-embeddings      share the token embedding with the LM head\n"
"  --dtype f32|f64|bf16  precision of parameters, activations and optimizer state (default f32);\n"
"                        bf16: mixed precision (bf16 parameters and gradients, f32 compute,\n"
"                        fp32 master weights and AdamW moments; non-finite steps skipped)\n"
"  --recompute none|full full: keep only each layer's input, recompute the rest in backward\n"
"Batch (give any two; global = dp x microbatches x micro-batch):\n"
"  --global-batch N      sequences per step (default dp x 8)\n"
"  --micro-batch N       sequences per forward/backward (default 8)\n"
"  --microbatches N      gradient-accumulation steps per optimizer step (default 1)\n"
"Optimisation:\n"
"  --steps N             optimizer steps (default 1500: about a minute on 2 cores)\n"
"  --lr X                peak learning rate (default 3e-3); --min-lr X final (default lr/10)\n"
"  --warmup N            linear warm-up steps (default 20), then cosine decay\n"
"  --weight-decay X      AdamW decoupled weight decay (default 0.01)\n"
"  --clip X              clip the global gradient norm to X (default 1; 0: off)\n"
"  --seed N              parameter initialisation (default 1)\n"
"Communication:\n"
"  --bucket-mb X         gradient all-reduce bucket size in MiB (default 1; 0: per layer)\n"
"  --overlap             run the bucket all-reduces on each rank's communication thread\n"
"                        (f32/f64 without ZeRO and pipeline; those reduce after each unit\n"
"                        or after the pipeline)\n"
"  --algo auto|ring      collective algorithm (ring: the lecture's byte counts exactly)\n"
"  --zero 0|1|2|3        ZeRO stage over the dp group (default 0): 1 shards AdamW's state\n"
"                        (reduce-scatter, update the shard, all-gather the parameters),\n"
"                        2 also the gradients (reduce-scattered layer by layer during\n"
"                        backward), 3 also the parameters (each layer all-gathered before its\n"
"                        forward and its backward); a no-op with dp 1\n"
"Data:\n"
"  --data FILE           train on FILE's bytes (last 10%% held out); default: a synthetic\n"
"                        order-2 Markov corpus whose entropy rate (the loss floor) is known\n"
"  --data-max SIZE       refuse a --data file larger than SIZE (default 1G; the whole file\n"
"                        is held in memory); --data reads regular files only\n"
"  --data-seed N         seed of the synthetic corpus (default 1)\n"
"  --write-corpus FILE   write the synthetic corpus (4 MiB; --data-seed) to FILE and exit:\n"
"                        --data FILE then trains on the same bytes\n"
"  --eval-every N        validation loss every N steps (default 250; 0: at the end only)\n"
"  --eval-windows N      validation windows per evaluation (default 64; 0: all)\n"
"Output (an existing output FILE must be a regular file, not a symlink: nothing else is\n"
"replaced; checked with its directory before the run, exit 2):\n"
"  --log-every N         progress line every N steps (default 100; 0: none): loss, tok/s and\n"
"                        ms/step over the steps since the last line, MB sent per step\n"
"  --quiet               no progress lines (nor the --check run's, which go to stderr)\n"
"  --json FILE           JSON Lines: a config record, one record per step, a summary\n"
"                        (docs/JSON.md)\n"
"  --check               also train the same configuration on one rank and print the largest\n"
"                        differences of the losses and of the final parameters\n"
"  --sample N            print N bytes generated by the trained model\n"
"  --save FILE           write the parameters (safetensors, unsharded, GPT-2-like names)\n"
"  --dump-grads FILE     write step 1's gradients (same layout) and FILE.tokens (its batch)\n"
"  --load FILE           start from such a file (any layout)\n"
"  --eval-only           with --load: print the mean validation loss and exit\n"
"Machine:\n"
"  --gpu-mem SIZE        memory per rank (\"GPU memory\"), e.g. 512M; exceeding it is an error\n"
"  --timeout SEC         watchdog: a rank stuck this long is an error (default 120)\n"
"  --topology STR        synthetic topology for grouping ranks into nodes\n"
"  --threads N           rank threads per process: under mpirun -np P the world is P x N\n"
"                        ranks (= dp x tp x pp; default: dp x tp x pp / P), process k hosting\n"
"                        ranks kN ... kN+N-1; without mpirun N is the world (README: Running on\n"
"                        several machines)\n"
"  -h, --help            this help;  -V, --version  the version\n"
"\n"
"An option that would have no effect in the configuration given is refused (exit 2), as are\n"
"empty list elements (1,,2) and hexadecimal numbers.\n"
"OpenBLAS runs one thread per rank: distlab-train sets OPENBLAS_NUM_THREADS=1 and restarts\n"
"itself when needed, also to pick the CPU's kernel class when OpenBLAS picked a lower one and\n"
"OPENBLAS_CORETYPE is unset. Exit status: 0 ok, 1 a failed run, 2 bad options.\n");
    /* clang-format on */
}

enum {
    O_DP = 256,
    O_TP,
    O_LAYERS,
    O_DMODEL,
    O_HEADS,
    O_SEQ,
    O_TIE,
    O_DTYPE,
    O_RECOMP,
    O_GB,
    O_MB,
    O_MICRO,
    O_STEPS,
    O_LR,
    O_MINLR,
    O_WARMUP,
    O_WD,
    O_CLIP,
    O_SEED,
    O_BUCKET,
    O_OVERLAP,
    O_ALGO,
    O_DATA,
    O_DSEED,
    O_EVERY,
    O_EWIN,
    O_LOGE,
    O_JSON,
    O_CHECK,
    O_SAMPLE,
    O_SAVE,
    O_LOAD,
    O_EONLY,
    O_GPUMEM,
    O_TIMEOUT,
    O_TOPO,
    O_DUMP,
    O_ZERO,
    O_PP,
    O_SCHED,
    O_VIRT,
    O_STASH,
    O_LCOSTS,
    O_TRACE,
    O_TIMELINE,
    O_THREADS,
    O_TSTEPS,
    O_QUIET,
    O_DMAX,
    O_WCORPUS
};

static const struct option longopts[] = {
    {"dp", 1, 0, O_DP},
    {"tp", 1, 0, O_TP},
    {"layers", 1, 0, O_LAYERS},
    {"d-model", 1, 0, O_DMODEL},
    {"heads", 1, 0, O_HEADS},
    {"seq", 1, 0, O_SEQ},
    {"tie-embeddings", 0, 0, O_TIE},
    {"dtype", 1, 0, O_DTYPE},
    {"recompute", 1, 0, O_RECOMP},
    {"global-batch", 1, 0, O_GB},
    {"micro-batch", 1, 0, O_MB},
    {"microbatches", 1, 0, O_MICRO},
    {"steps", 1, 0, O_STEPS},
    {"lr", 1, 0, O_LR},
    {"min-lr", 1, 0, O_MINLR},
    {"warmup", 1, 0, O_WARMUP},
    {"weight-decay", 1, 0, O_WD},
    {"clip", 1, 0, O_CLIP},
    {"seed", 1, 0, O_SEED},
    {"bucket-mb", 1, 0, O_BUCKET},
    {"overlap", 0, 0, O_OVERLAP},
    {"algo", 1, 0, O_ALGO},
    {"data", 1, 0, O_DATA},
    {"data-seed", 1, 0, O_DSEED},
    {"eval-every", 1, 0, O_EVERY},
    {"eval-windows", 1, 0, O_EWIN},
    {"log-every", 1, 0, O_LOGE},
    {"json", 1, 0, O_JSON},
    {"check", 0, 0, O_CHECK},
    {"sample", 1, 0, O_SAMPLE},
    {"save", 1, 0, O_SAVE},
    {"load", 1, 0, O_LOAD},
    {"eval-only", 0, 0, O_EONLY},
    {"dump-grads", 1, 0, O_DUMP},
    {"gpu-mem", 1, 0, O_GPUMEM},
    {"timeout", 1, 0, O_TIMEOUT},
    {"topology", 1, 0, O_TOPO},
    {"zero", 1, 0, O_ZERO},
    {"pp", 1, 0, O_PP},
    {"schedule", 1, 0, O_SCHED},
    {"virtual-stages", 1, 0, O_VIRT},
    {"weight-stashing", 0, 0, O_STASH},
    {"layer-costs", 1, 0, O_LCOSTS},
    {"trace", 1, 0, O_TRACE},
    {"timeline", 0, 0, O_TIMELINE},
    {"threads", 1, 0, O_THREADS},
    {"trace-steps", 1, 0, O_TSTEPS},
    {"quiet", 0, 0, O_QUIET},
    {"data-max", 1, 0, O_DMAX},
    {"write-corpus", 1, 0, O_WCORPUS},
    {"help", 0, 0, 'h'},
    {"version", 0, 0, 'V'},
    {0, 0, 0, 0},
};

static const char *cat_names[DL_MEM_NCATEGORIES] = {"params",      "grads", "optimizer",
                                                    "activations", "comm",  "other"};

static void json_num(FILE *f, const char *key, double v, int comma)
{
    if (isnan(v) || isinf(v))
        fprintf(f, "\"%s\":null%s", key, comma ? "," : "");
    else
        fprintf(f, "\"%s\":%.17g%s", key, v, comma ? "," : "");
}

/* Every axis in use: "dp 2 x tp 2 x pp 2; schedule 1f1b" (also the virtual stages when
 * interleaved, and ZeRO's stage), for the banner and the summary header alike. */
static void layout_desc(const dl_train_opts *o, char *buf, size_t n)
{
    int k = snprintf(buf, n, "dp %d x tp %d x pp %d", o->dp, o->tp, o->pp);
    if (o->pp > 1 && k >= 0 && (size_t)k < n)
        k += snprintf(buf + k, n - (size_t)k, "; schedule %s%s",
                      dl_sched_kind_name((dl_sched_kind)o->schedule),
                      o->weight_stashing ? " with weight stashing" : "");
    if (o->pp > 1 && o->virtual_stages > 1 && k >= 0 && (size_t)k < n)
        k += snprintf(buf + k, n - (size_t)k, ", %d virtual stages", o->virtual_stages);
    if (o->zero && o->dp > 1 && k >= 0 && (size_t)k < n)
        snprintf(buf + k, n - (size_t)k, "; ZeRO %d", o->zero);
}

static void json_config(FILE *f, const dl_train_opts *o)
{
    fprintf(f,
            "{\"type\":\"config\",\"schema\":\"distlab/1\",\"app\":\"distlab-train\","
            "\"version\":\"%s\",\"dp\":%d,\"tp\":%d,\"pp\":%d,\"schedule\":\"%s\","
            "\"virtual_stages\":%d,\"weight_stashing\":%s,\"layers\":%d,\"d_model\":%d,\"heads\":%"
            "d,"
            "\"seq\":%d,\"vocab\":%d,\"tie_embeddings\":%s,\"dtype\":\"%s\",\"recompute\":\"%s\","
            "\"global_batch\":%d,\"micro_batch\":%d,\"microbatches\":%d,\"steps\":%d,\"zero\":%d,",
            dl_version(), o->dp, o->tp, o->pp,
            o->pp > 1 ? dl_sched_kind_name((dl_sched_kind)o->schedule) : "none",
            o->pp > 1 ? o->virtual_stages : 1, o->pp > 1 && o->weight_stashing ? "true" : "false",
            o->model.layers, o->model.d_model, o->model.heads, o->model.seq, o->model.vocab,
            o->model.tie ? "true" : "false", dl_dtype_name(o->dtype),
            o->recompute ? "full" : "none", o->global_batch, o->micro_batch, o->microbatches,
            o->steps, o->zero);
    json_num(f, "lr", o->lr, 1);
    json_num(f, "min_lr", o->min_lr, 1);
    fprintf(f, "\"warmup\":%d,", o->warmup);
    json_num(f, "bucket_mb", o->bucket_mb, 1);
    fprintf(f, "\"overlap\":%s,\"algo\":\"%s\",\"data\":", o->overlap ? "true" : "false",
            dl_algo_name(o->algo));
    if (o->data_path) {
        dl__json_fputs(f, o->data_path, DL__JSON_CTRL_DROP);
    } else {
        fputs("\"synthetic\"", f);
    }
    fprintf(f, ",\"seed\":%llu,\"blas_kernel\":\"%s\"}\n", (unsigned long long)o->seed,
            dl_blas_loaded_kernel());
}

/* --json is streamed: each record is flushed as it is written and every write is checked, so
 * that a signal or a crash leaves every completed record on disk and a full disk is an error. */
typedef struct json_out {
    FILE *f;
    const char *path;
} json_out;

/* After a record: flush and check. DL_OK, or DL_ESYS with the message set. */
static int json_flush(json_out *j)
{
    if (fflush(j->f) == 0 && !ferror(j->f))
        return DL_OK;
    return dl_error(DL_ESYS, "--json: writing '%s' failed: %s", j->path, strerror(errno));
}

/* Close, reporting a failed write (message printed) unless the run already failed (quiet);
 * 0 or -1. */
static int json_close(json_out *j, int quiet)
{
    int bad = json_flush(j) != DL_OK;
    if (bad && !quiet)
        cli_error("%s", dl_errmsg());
    if (fclose(j->f) != 0 && !bad && !quiet) {
        cli_error("--json: closing '%s' failed: %s", j->path, strerror(errno));
        bad = 1;
    }
    j->f = NULL;
    return bad ? -1 : 0;
}

/* dl_train_opts.on_step: one step record. */
static int json_step(const dl_train_step *s, void *arg)
{
    json_out *j = arg;
    FILE *f = j->f;
    {
        fprintf(f, "{\"type\":\"step\",\"step\":%d,", s->step);
        json_num(f, "loss", s->loss, 1);
        json_num(f, "val_loss", s->val_loss, 1);
        json_num(f, "lr", s->lr, 1);
        json_num(f, "grad_norm", s->grad_norm, 1);
        json_num(f, "ms", s->ms, 1);
        json_num(f, "tokens_per_s", s->tokens_per_s, 1);
        fprintf(f, "\"skipped\":%s", s->skipped ? "true" : "false");
        fputs("}\n", f);
    }
    return json_flush(j);
}

typedef struct check_t {
    double loss_diff, param_diff;
    char worst_tensor[48];
} check_t;

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
    int ss = (int)dl_dtype_size(o->dtype), cs = o->dtype == DL_F64 ? 8 : 4, st = r->zero;
    int N = st ? o->dp : 1;
    m->bytes = r->peak[DL_MEM_PARAMS] + r->peak[DL_MEM_GRADS] + r->peak[DL_MEM_OPTIMIZER];
    m->P = (int64_t)(r->grad_bytes / (uint64_t)ss);
    m->K = 2 * cs + (o->dtype == DL_BF16 ? 4 : 0);
    m->per_param = m->P ? (double)m->bytes / (double)m->P : 0;
    double P = (double)m->P, Pp = st ? (double)r->zero_padded : P, K = m->K;
    static const char *f[4] = {"(2+2+K) Psi", "2 Psi + 2 Psi + K Psi/N", "2 Psi + (2+K) Psi/N",
                               "(2+2+K) Psi/N"};
    m->formula = f[st];
    double b[4] = {(2.0 * ss + K) * P, 2.0 * ss * P + K * Pp / N, ss * P + (ss + K) * Pp / N,
                   (2.0 * ss + K) * Pp / N};
    m->formula_bytes = b[st];
    m->formula_elems = o->dp > 1 ? (st == 3 ? 3.0 : 2.0) * Pp * (o->dp - 1) / o->dp : 0;
}

static void json_summary(FILE *f, const dl_train_opts *o, const dl_train_result *r,
                         const check_t *chk)
{
    fprintf(f, "{\"type\":\"summary\",");
    json_num(f, "loss_floor", r->floor, 1);
    json_num(f, "final_loss", r->final_loss, 1);
    json_num(f, "final_val_loss", r->final_val_loss, 1);
    json_num(f, "tokens_per_s", r->tokens_per_s, 1);
    json_num(f, "ms_per_step", r->ms_per_step, 1);
    json_num(f, "gemm_gflops", r->gemm_gflops, 1);
    json_num(f, "model_gflops_per_rank", r->model_gflops_per_rank, 1);
    json_num(f, "gemm_utilisation",
             r->gemm_gflops > 0 ? r->model_gflops_per_rank / r->gemm_gflops : NAN, 1);
    fprintf(f, "\"params\":%lld,\"grad_bytes_per_rank\":%llu,", (long long)r->nparams,
            (unsigned long long)r->grad_bytes);
    fprintf(f, "\"bytes_sent_per_rank_per_step\":{");
    json_num(f, "dp_grads", r->dp_grad_bytes_per_step, 1);
    json_num(f, "tp_activations", r->tp_act_bytes_per_step, 1);
    json_num(f, "loss_and_norm", r->loss_bytes_per_step, 1);
    json_num(f, "dp_params", r->dp_param_bytes_per_step, 0);
    fprintf(f,
            "},\"zero\":{\"stage\":%d,\"padded_elements\":%lld,\"padding\":%lld,"
            "\"shard_elements\":%lld}",
            r->zero, (long long)r->zero_padded, (long long)r->zero_padding,
            (long long)r->zero_shard);
    model_state_t ms;
    model_state(o, r, &ms);
    fprintf(f, ",\"model_state\":{\"bytes_per_rank\":%llu,", (unsigned long long)ms.bytes);
    json_num(f, "bytes_per_param", ms.per_param, 1);
    fprintf(f, "\"K\":%d,", ms.K);
    json_num(f, "formula_bytes", ms.formula_bytes, 1);
    json_num(f, "elements_sent_per_step", r->dp_elems_per_step, 1);
    json_num(f, "formula_elements", ms.formula_elems, 1);
    fprintf(f, "\"unit_buffer_bytes\":%llu,\"gathered_param_bytes\":%llu},\"skipped_steps\":%d",
            (unsigned long long)r->unit_bytes, (unsigned long long)r->gathered_bytes,
            r->skipped_steps);
    fprintf(f, ",\"peak_bytes_per_rank\":[");
    for (int k = 0; k < r->nranks; k++) {
        fprintf(f, "%s{\"rank\":%d", k ? "," : "", k);
        for (int c = 0; c < DL_MEM_NCATEGORIES; c++)
            fprintf(f, ",\"%s\":%llu", cat_names[c],
                    (unsigned long long)r->peak[(size_t)k * DL_MEM_NCATEGORIES + c]);
        fputc('}', f);
    }
    fputs("]", f);
    if (chk) {
        fputs(",\"check\":{", f);
        json_num(f, "max_loss_rel_diff", chk->loss_diff, 1);
        json_num(f, "max_param_rel_diff", chk->param_diff, 1);
        fprintf(f, "\"worst_tensor\":\"%s\"", chk->worst_tensor);
        fputc('}', f);
    }
    fputs("}\n", f);
}

/* "1 rank", "2 ranks": the noun as counted (plural: the noun + "s" or + "es"). */
static const char *plural(int n, const char *es) { return n == 1 ? "" : es; }

static void print_summary(const dl_train_opts *o, const dl_train_result *r)
{
    char lay[160];
    layout_desc(o, lay, sizeof lay);
    printf("\n== summary: %d step%s, %d rank%s (%s), %lld parameters, %s\n", r->nsteps,
           plural(r->nsteps, "s"), r->nranks, plural(r->nranks, "s"), lay, (long long)r->nparams,
           dl_dtype_name(o->dtype));
    if (!isnan(r->floor))
        printf("final loss %.4f (validation %.4f) vs the corpus's entropy rate %.4f nats: %.4f "
               "above "
               "the floor\n",
               r->final_loss, r->final_val_loss, r->floor, r->final_val_loss - r->floor);
    else
        printf("final loss %.4f (validation %.4f)\n", r->final_loss, r->final_val_loss);
    printf("throughput %.0f tokens/s, %.1f ms/step (median)\n", r->tokens_per_s, r->ms_per_step);
    if (r->gemm_gflops > 0)
        printf("GEMM utilisation %.0f%%: model %.1f GFLOP/s per rank vs %.1f GFLOP/s single-thread "
               "GEMM on the model's shapes\n",
               100 * r->model_gflops_per_rank / r->gemm_gflops, r->model_gflops_per_rank,
               r->gemm_gflops);
    printf("bytes sent per rank per step: dp gradients %.3f MB (gradient buffer %.3f MB; ring "
           "2(d-1)/d = %.3f MB), tp activations %.3f MB, loss/norm %.0f B\n",
           r->dp_grad_bytes_per_step / 1e6, (double)r->grad_bytes / 1e6,
           o->dp > 1 ? 2.0 * (o->dp - 1) / o->dp * (double)r->grad_bytes / 1e6 : 0.0,
           r->tp_act_bytes_per_step / 1e6, r->loss_bytes_per_step);
    if (r->zero)
        printf("ZeRO stage %d over dp %d: %lld elements per rank in %d units, each padded to a "
               "multiple of %d: %lld (+%lld) = %d shards of %lld; per step dp gradients "
               "(reduce-scatter) %.3f MB + parameters (all-gather) %.3f MB\n",
               r->zero, o->dp, (long long)(r->zero_padded - r->zero_padding), r->zero_units, o->dp,
               (long long)r->zero_padded, (long long)r->zero_padding, o->dp,
               (long long)r->zero_shard, r->dp_grad_bytes_per_step / 1e6,
               r->dp_param_bytes_per_step / 1e6);
    model_state_t ms;
    model_state(o, r, &ms);
    if (r->zero || o->dtype == DL_BF16) {
        printf("model state per rank (rank 0's arena peaks): params %llu + grads %llu + optimizer "
               "%llu = %llu bytes = %.2f bytes per parameter (P = %lld, K = %d; the paper's %s = "
               "%.0f)\n",
               (unsigned long long)r->peak[DL_MEM_PARAMS],
               (unsigned long long)r->peak[DL_MEM_GRADS],
               (unsigned long long)r->peak[DL_MEM_OPTIMIZER], (unsigned long long)ms.bytes,
               ms.per_param, (long long)ms.P, ms.K, ms.formula, ms.formula_bytes);
        printf("  unit buffers (comm/other, outside the model state): %llu bytes, of which "
               "gathered parameters %llu\n",
               (unsigned long long)r->unit_bytes, (unsigned long long)r->gathered_bytes);
        printf("  dp elements sent per rank per step: %.0f (the paper's %s = %.0f with one "
               "micro-batch%s)\n",
               r->dp_elems_per_step, r->zero == 3 ? "3 Psi (N-1)/N" : "2 Psi (N-1)/N",
               ms.formula_elems,
               o->microbatches > 1 && r->zero >= 2 ? "; stages 2-3 reduce (and stage 3 gathers) "
                                                     "once per micro-batch"
                                                   : "");
    }
    if (r->skipped_steps)
        printf("%d step(s) skipped: non-finite gradient\n", r->skipped_steps);
    if (r->pp > 1) {
        int k = r->pp * r->pp_v;
        printf("pipeline: %d stages x %d chunk%s, %s, %d micro-batch%s; layers per virtual stage:",
               r->pp, r->pp_v, plural(r->pp_v, "s"), dl_sched_kind_name((dl_sched_kind)o->schedule),
               o->microbatches, plural(o->microbatches, "es"));
        for (int i = 0; i < k; i++) printf(" %d-%d", r->pp_bounds[i], r->pp_bounds[i + 1] - 1);
        printf("\n  measured bubble per stage (1 - busy/wall, median step):");
        for (int st = 0; st < r->pp; st++) printf(" %.1f%%", 100 * r->pp_bubble[st]);
        printf("\n  total %.1f%% vs the lecture's (p-1)/(vm+p-1) = %.1f%%; activation slots per "
               "stage:",
               100 * r->pp_bubble_total, 100 * r->pp_bubble_theory);
        for (int st = 0; st < r->pp; st++) printf(" %d", r->pp_slots[st]);
        printf("\n  hand-offs %.3f MB sent by rank 0 per step; engine overhead per action (the "
               "step's wall time less its work, hand-offs and waits, over its actions) %.1f us, "
               "90th percentile %.1f us over the steps and ranks\n",
               r->pp_bytes_per_step / 1e6, r->pp_engine_us, r->pp_engine_p90_us);
        if (o->schedule == DL_SCHED_ASYNC) {
            printf("  weight updates between a micro-batch's forward and the weights its backward "
                   "used, per stage:");
            for (int st = 0; st < r->pp; st++) printf(" %d", r->pp_max_gap[st]);
            printf("%s\n", o->weight_stashing ? " (stashing)" : " (no stashing: p - s)");
        }
    }
    if (r->timeline)
        printf("measured timeline of step %d: %s", o->trace_last ? o->trace_last : r->nsteps,
               r->timeline);
    printf("peak memory per rank (MB):   ");
    for (int c = 0; c < DL_MEM_NCATEGORIES; c++) printf(" %11s", cat_names[c]);
    printf("\n");
    for (int k = 0; k < r->nranks; k++) {
        printf("  rank %3d                   ", k);
        for (int c = 0; c < DL_MEM_NCATEGORIES; c++)
            printf(" %11.3f", (double)r->peak[(size_t)k * DL_MEM_NCATEGORIES + c] / 1e6);
        printf("\n");
    }
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

static int train_main(int argc, char **argv, int nprocs);

/* --write-corpus: the built-in corpus as a file, so that the --data examples have a file to read. */
static int write_corpus(const char *path, uint64_t seed)
{
    dl_data_opts dop;
    dl_data *d;
    dl_data_opts_init(&dop);
    dop.seed = seed;
    if (dl_data_open(&dop, &d)) {
        cli_error("--write-corpus: %s", dl_errmsg());
        return CLI_EXIT_FAIL;
    }
    FILE *f = fopen(path, "wb");
    size_t n = dl_data_len(d), w = f ? fwrite(dl_data_bytes(d), 1, n, f) : 0;
    int bad = !f || w != n || fclose(f) != 0;
    dl_data_free(d);
    if (bad) {
        cli_error("--write-corpus: cannot write '%s'", path);
        return CLI_EXIT_USAGE;
    }
    printf("wrote the synthetic corpus (data seed %llu, %zu bytes, entropy rate %.4f nats/byte) "
           "to %s\n",
           (unsigned long long)seed, n, dl_data_entropy_rate(dop.p, dop.K), path);
    return CLI_EXIT_OK;
}

/* Under mpirun: MPI first (the world spans the processes), MPI_Abort when the run failed. */
int main(int argc, char **argv)
{
    cli_progname = "distlab-train";
    cli_ignore_sigxfsz();
    cli_blas_setup(argv);
    int nprocs = app_mpi_start(&argc, &argv);
    if (nprocs < 0)
        return CLI_EXIT_FAIL;
    return app_mpi_end(train_main(argc, argv, nprocs));
}

static int train_main(int argc, char **argv, int nprocs)
{
    dl_train_opts o;
    dl_train_opts_init(&o);
    o.steps = 1500;
    o.model.layers = 4;
    o.log_every = 100;
    o.eval_every = 250;
    o.log = stdout;
    int dp = 0, check = 0, gb = 0, mb = 0, micro = 0, have_minlr = 0, layer_costs_n = 0;
    int measure_costs = 0, quiet = 0, have_sched = 0, have_virt = 0;
    int threads = 0;
    const char *json = NULL, *corpus = NULL;
    double d;
    uint64_t u;
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "hV", longopts, NULL)) != -1) {
        int bad = 0;
        switch (c) {
        case 'h': usage(stdout); return CLI_EXIT_OK;
        case 'V': cli_print_version(stdout); return CLI_EXIT_OK;
        case O_DP: bad = cli_parse_int("--dp", optarg, 1, 4096, &dp); break;
        case O_TP: bad = cli_parse_int("--tp", optarg, 1, 4096, &o.tp); break;
        case O_LAYERS: bad = cli_parse_int("--layers", optarg, 1, 4096, &o.model.layers); break;
        case O_DMODEL:
            bad = cli_parse_int("--d-model", optarg, 1, 1 << 16, &o.model.d_model);
            break;
        case O_HEADS: bad = cli_parse_int("--heads", optarg, 1, 4096, &o.model.heads); break;
        case O_SEQ: bad = cli_parse_int("--seq", optarg, 1, 1 << 16, &o.model.seq); break;
        case O_TIE: o.model.tie = 1; break;
        case O_DTYPE:
            if (!strcmp(optarg, "f32"))
                o.dtype = DL_F32;
            else if (!strcmp(optarg, "f64"))
                o.dtype = DL_F64;
            else if (!strcmp(optarg, "bf16"))
                o.dtype = DL_BF16;
            else {
                cli_error("--dtype: '%s' is not f32, f64 or bf16", optarg);
                bad = 1;
            }
            break;
        case O_RECOMP:
            if (!strcmp(optarg, "none"))
                o.recompute = DL_RECOMPUTE_NONE;
            else if (!strcmp(optarg, "full"))
                o.recompute = DL_RECOMPUTE_FULL;
            else {
                cli_error("--recompute: '%s' is not none or full", optarg);
                bad = 1;
            }
            break;
        case O_GB: bad = cli_parse_int("--global-batch", optarg, 1, 1 << 24, &gb); break;
        case O_MB: bad = cli_parse_int("--micro-batch", optarg, 1, 1 << 20, &mb); break;
        case O_MICRO: bad = cli_parse_int("--microbatches", optarg, 1, 1 << 20, &micro); break;
        case O_STEPS: bad = cli_parse_int("--steps", optarg, 1, 1 << 30, &o.steps); break;
        case O_LR: bad = cli_parse_double("--lr", optarg, 1e-12, 10, &o.lr); break;
        case O_MINLR:
            bad = cli_parse_double("--min-lr", optarg, 0, 10, &o.min_lr);
            have_minlr = 1;
            break;
        case O_WARMUP: bad = cli_parse_int("--warmup", optarg, 0, 1 << 30, &o.warmup); break;
        case O_WD: bad = cli_parse_double("--weight-decay", optarg, 0, 10, &o.weight_decay); break;
        case O_CLIP: bad = cli_parse_double("--clip", optarg, 0, 1e30, &o.clip); break;
        case O_SEED: bad = cli_parse_size("--seed", optarg, 0, UINT64_MAX, &o.seed); break;
        case O_BUCKET:
            bad = cli_parse_double("--bucket-mb", optarg, 0, 1 << 20, &o.bucket_mb);
            break;
        case O_OVERLAP: o.overlap = 1; break;
        case O_ALGO:
            if (dl_algo_parse(optarg, &o.algo)) {
                cli_error("--algo: %s", dl_errmsg());
                bad = 1;
            }
            break;
        case O_DATA: o.data_path = optarg; break;
        case O_DMAX: bad = cli_parse_size("--data-max", optarg, 1, UINT64_MAX, &o.data_max); break;
        case O_DSEED:
            bad = cli_parse_size("--data-seed", optarg, 0, UINT64_MAX, &o.data_seed);
            break;
        case O_EVERY: bad = cli_parse_int("--eval-every", optarg, 0, 1 << 30, &o.eval_every); break;
        case O_EWIN:
            bad = cli_parse_int("--eval-windows", optarg, 0, 1 << 30, &o.eval_windows);
            break;
        case O_LOGE: bad = cli_parse_int("--log-every", optarg, 0, 1 << 30, &o.log_every); break;
        case O_JSON: json = optarg; break;
        case O_CHECK: check = 1; break;
        case O_SAMPLE: bad = cli_parse_int("--sample", optarg, 0, 1 << 20, &o.sample); break;
        case O_SAVE: o.save_path = optarg; break;
        case O_DUMP: o.dump_grads = optarg; break;
        case O_LOAD: o.load_path = optarg; break;
        case O_EONLY: o.eval_only = 1; break;
        case O_GPUMEM:
            bad = cli_parse_size("--gpu-mem", optarg, 1, UINT64_MAX, &u);
            o.gpu_mem = u;
            break;
        case O_TIMEOUT:
            bad = cli_parse_double("--timeout", optarg, 0, 1e9, &d);
            o.timeout_s = d;
            break;
        case O_TOPO: o.topology = optarg; break;
        case O_PP: bad = cli_parse_int("--pp", optarg, 1, 4096, &o.pp); break;
        case O_THREADS: bad = cli_parse_int("--threads", optarg, 1, 4096, &threads); break;
        case O_SCHED: {
            dl_sched_kind k;
            if (dl_sched_kind_parse(optarg, &k) || k == DL_SCHED_TERAPIPE) {
                cli_error("--schedule: '%s' is not gpipe, 1f1b, interleaved, async or naive",
                          optarg);
                bad = 1;
            } else
                o.schedule = (int)k, have_sched = 1;
            break;
        }
        case O_VIRT:
            have_virt = 1;
            bad =
                cli_parse_int("--virtual-stages", optarg, 1, DL_GPT_MAX_CHUNKS, &o.virtual_stages);
            break;
        case O_STASH: o.weight_stashing = 1; break;
        case O_LCOSTS: {
            static double costs[4096];
            int nc = 0;
            if (!strcmp(optarg, "measure")) {
                measure_costs = 1;
                o.layer_costs = costs;
                break;
            }
            static char buf[65536];
            static char *items[4096];
            bad = cli_split_list("--layer-costs", optarg, buf, sizeof buf, items, 4096, &nc);
            for (int i = 0; i < nc && !bad; i++)
                bad = cli_parse_double("--layer-costs", items[i], 0, 1e30, &costs[i]);
            layer_costs_n = nc;
            o.layer_costs = costs;
            break;
        }
        case O_TRACE: o.trace_path = optarg; break;
        case O_WCORPUS: corpus = optarg; break;
        case O_TIMELINE: o.timeline = 1; break;
        case O_QUIET: quiet = 1; break;
        case O_TSTEPS: {
            char *colon = strchr(optarg, ':'), a[32];
            size_t la = colon ? (size_t)(colon - optarg) : strlen(optarg);
            snprintf(a, sizeof a, "%.*s", (int)(la < sizeof a ? la : sizeof a - 1), optarg);
            bad = cli_parse_int("--trace-steps", a, 1, 1 << 30, &o.trace_first) ||
                  cli_parse_int("--trace-steps", colon ? colon + 1 : a, 1, 1 << 30, &o.trace_last);
            if (!bad && o.trace_last < o.trace_first) {
                cli_error("--trace-steps: %d:%d ends before it starts", o.trace_first,
                          o.trace_last);
                bad = 1;
            }
            break;
        }
        case O_ZERO:
            bad = cli_parse_int("--zero", optarg, INT_MIN, INT_MAX, &o.zero);
            if (!bad && (o.zero < 0 || o.zero > 3)) {
                cli_error("--zero: %d is out of range [0, 3]", o.zero);
                bad = 1;
            }
            break;
        default:
            if (optopt && optopt < 256)
                cli_error("unknown option '-%c' (see --help)", optopt);
            else
                cli_error("unknown option or missing value: '%s' (see --help)", argv[optind - 1]);
            return CLI_EXIT_USAGE;
        }
        if (bad)
            return CLI_EXIT_USAGE;
    }
    if (optind < argc) {
        cli_error("unexpected argument '%s' (see --help)", argv[optind]);
        return CLI_EXIT_USAGE;
    }
    if (corpus)
        return write_corpus(corpus, o.data_seed);
    if (!have_minlr)
        o.min_lr = o.lr / 10;
    if (quiet)
        o.log = NULL;
    if (o.trace_first && !o.trace_path && !o.timeline) {
        cli_error("--trace-steps needs --trace FILE or --timeline");
        return CLI_EXIT_USAGE;
    }
    if (o.trace_last > o.steps) {
        cli_error("--trace-steps: step %d is past --steps %d", o.trace_last, o.steps);
        return CLI_EXIT_USAGE;
    }
    if (o.pp == 0)
        o.pp = 1;
    /* the rule: an option that would have no effect in the configuration given is refused */
    const char *idle = have_sched      ? "--schedule"
                       : have_virt     ? "--virtual-stages"
                       : o.layer_costs ? "--layer-costs"
                                       : NULL;
    if (o.pp == 1 && idle) {
        cli_error("%s needs a pipeline (--pp N, N >= 2): with one stage it has no effect", idle);
        return CLI_EXIT_USAGE;
    }
    if (dp == 0 && threads > 0 && (long)nprocs * threads % (o.tp * o.pp) == 0)
        dp = (int)((long)nprocs * threads / (o.tp * o.pp));
    if (dp == 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        dp = cores / (o.tp * o.pp) > 0 ? (int)(cores / (o.tp * o.pp)) : 1;
    }
    if (threads > 0 && (long)dp * o.tp * o.pp != (long)nprocs * threads) {
        cli_error("--threads %d: dp %d x tp %d x pp %d = %ld ranks is not %d process%s x %d "
                  "threads",
                  threads, dp, o.tp, o.pp, (long)dp * o.tp * o.pp, nprocs, nprocs > 1 ? "es" : "",
                  threads);
        return CLI_EXIT_USAGE;
    }
    if (nprocs > 1 && (long)dp * o.tp * o.pp % nprocs) {
        cli_error("dp %d x tp %d x pp %d = %ld ranks do not divide over %d processes", dp, o.tp,
                  o.pp, (long)dp * o.tp * o.pp, nprocs);
        return CLI_EXIT_USAGE;
    }
    if (nprocs > 1 && check) {
        if (app_mpi_rank() == 0) /* every process refuses; one says why */
            cli_error("--check trains on one rank in this process: not available under mpirun "
                      "(compare with a single-process run of the same world instead)");
        return CLI_EXIT_USAGE;
    }
    if (o.layer_costs && !measure_costs && layer_costs_n != o.model.layers) {
        cli_error("--layer-costs: %d costs for %d layers", layer_costs_n, o.model.layers);
        return CLI_EXIT_USAGE;
    }
    o.dp = dp;
    o.global_batch = gb;
    o.micro_batch = mb;
    o.microbatches = micro;
    /* outputs: nothing that is not a regular file is replaced, and none fails after the run */
    const char *outs[][2] = {{"--save", o.save_path},
                             {"--trace", o.trace_path},
                             {"--json", json},
                             {"--dump-grads", o.dump_grads}};
    for (size_t i = 0; i < sizeof outs / sizeof outs[0]; i++)
        if (outs[i][1] && cli_check_output(outs[i][0], outs[i][1]))
            return CLI_EXIT_USAGE;
    cli_remove_tmp_on_signal(o.save_path);
    cli_remove_tmp_on_signal(o.trace_path);
    cli_remove_tmp_on_signal(o.dump_grads);
    if (o.dump_grads) {
        char tok[4096];
        snprintf(tok, sizeof tok, "%s.tokens", o.dump_grads);
        if (cli_check_output("--dump-grads", tok))
            return CLI_EXIT_USAGE;
    }
    if (o.eval_only && !o.load_path) {
        cli_error("--eval-only needs --load FILE");
        return CLI_EXIT_USAGE;
    }
    if (o.data_path && access(o.data_path, R_OK) != 0) {
        cli_error("--data: cannot read '%s'", o.data_path);
        return CLI_EXIT_USAGE;
    }
    if (o.load_path && access(o.load_path, R_OK) != 0) {
        cli_error("--load: cannot read '%s'", o.load_path);
        return CLI_EXIT_USAGE;
    }
    if (o.load_path) {
        /* refuse a file that is not a checkpoint of this model before any thread starts */
        dl_ckpt_info info;
        if (dl_ckpt_inspect(o.load_path, &info)) {
            cli_error("--load: %s", dl_errmsg());
            return CLI_EXIT_USAGE;
        }
        const dl_gpt_config *f = &info.cfg, *m = &o.model;
        if (info.has_config && (f->layers != m->layers || f->d_model != m->d_model ||
                                f->heads != m->heads || f->seq != m->seq || f->tie != m->tie)) {
            cli_error("--load: '%s' holds a model with --layers %d --d-model %d --heads %d --seq "
                      "%d%s;"
                      " give the same shape",
                      o.load_path, f->layers, f->d_model, f->heads, f->seq,
                      f->tie ? " --tie-embeddings" : "");
            return CLI_EXIT_USAGE;
        }
    }
    {
        /* a bad or oversized synthetic topology (--topology or DISTLAB_TOPOLOGY) is a usage error */
        dl_topo *t;
        if (dl_topo_load(&t, o.topology)) {
            cli_error("--topology: %s", dl_errmsg());
            return CLI_EXIT_USAGE;
        }
        dl_topo_destroy(t);
    }
    if (dl_train_resolve(&o, o.dp * o.tp * o.pp)) {
        cli_error("%s", dl_errmsg());
        return CLI_EXIT_USAGE;
    }
    /* a data file too short or empty is a configuration error too: check before any thread */
    {
        dl_data_opts dop;
        dl_data *dd;
        dl_data_opts_init(&dop);
        dop.path = o.data_path;
        dop.seq = o.model.seq;
        dop.seed = o.data_seed;
        dop.max_bytes = o.data_max;
        if (dl_data_open(&dop, &dd)) {
            cli_error("%s", dl_errmsg());
            return CLI_EXIT_USAGE;
        }
        dl_data_free(dd);
    }
    json_out jo = {NULL, json};
    if (nprocs > 1 && app_mpi_rank() != 0)
        json = NULL; /* under mpirun process 0 writes the records */
    if (json && !(jo.f = fopen(json, "w"))) {
        cli_error("--json: cannot write '%s': %s", json, strerror(errno));
        return CLI_EXIT_USAGE;
    }
    FILE *jf = jo.f;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    char lay[160];
    layout_desc(&o, lay, sizeof lay);
    printf("distlab-train %s: %d rank%s (%s) on %ld cores%s; model: %d layer%s, "
           "d-model %d, %d head%s, seq %d, %lld parameters, %s%s\n",
           dl_version(), o.dp * o.tp * o.pp, plural(o.dp * o.tp * o.pp, "s"), lay, cores,
           o.dp * o.tp * o.pp > cores ? " (oversubscribed: timings include contention)" : "",
           o.model.layers, plural(o.model.layers, "s"), o.model.d_model, o.model.heads,
           plural(o.model.heads, "s"), o.model.seq, (long long)dl_gpt_num_params(&o.model),
           dl_dtype_name(o.dtype), o.recompute ? ", full recompute" : "");
    if (nprocs > 1)
        printf("MPI: %d processes x %d rank threads (process k hosts ranks %dk ... %dk+%d; each "
               "process is one node)\n",
               nprocs, o.dp * o.tp * o.pp / nprocs, o.dp * o.tp * o.pp / nprocs,
               o.dp * o.tp * o.pp / nprocs, o.dp * o.tp * o.pp / nprocs - 1);
    if (o.eval_only)
        printf("evaluating '%s' on the validation split of %s\n", o.load_path,
               o.data_path ? o.data_path : "the synthetic corpus");
    else
        printf("batch: global %d = dp %d x %d micro-batch%s x %d sequence%s of %d bytes; %d "
               "step%s, "
               "lr %g (warm-up %d, cosine to %g); data: %s\n",
               o.global_batch, o.dp, o.microbatches, plural(o.microbatches, "es"), o.micro_batch,
               plural(o.micro_batch, "s"), o.model.seq, o.steps, plural(o.steps, "s"), o.lr,
               o.warmup, o.min_lr, o.data_path ? o.data_path : "synthetic order-2 Markov corpus");
    if (measure_costs) {
        /* measured on this thread before the ranks start, so they do not compete for the cores */
        char desc[300];
        if (measure_layer_costs(&o.model, o.dtype, o.micro_batch, 5, (double *)o.layer_costs, desc,
                                sizeof desc)) {
            cli_error("--layer-costs measure: %s", dl_errmsg());
            if (jf)
                json_close(&jo, 1);
            return CLI_EXIT_FAIL;
        }
        printf("layer costs measured here: %s\n", desc);
    }
    fflush(stdout);
    if (jf) {
        json_config(jf, &o);
        if (json_flush(&jo)) {
            cli_error("%s", dl_errmsg());
            json_close(&jo, 1);
            return CLI_EXIT_FAIL;
        }
        o.on_step = json_step;
        o.on_step_arg = &jo;
    }
    o.want_params = check;
    dl_train_result r;
    int rc = dl_train_run(&o, &r);
    if (rc) {
        cli_error("%s", dl_errmsg());
        if (jf)
            json_close(&jo, 1);
        dl_train_result_free(&r);
        return CLI_EXIT_FAIL;
    }
    if (o.eval_only && !isfinite(r.final_val_loss)) {
        cli_error("--eval-only: the validation loss of '%s' is %g, not finite", o.load_path,
                  r.final_val_loss);
        if (jf)
            json_close(&jo, 1);
        dl_train_result_free(&r);
        return CLI_EXIT_FAIL;
    }
    if (o.eval_only) {
        printf("validation loss %.6f over %d windows of %d bytes (window i starts at byte i*%d of "
               "the validation split)\n",
               r.final_val_loss, r.eval_windows_used, o.model.seq, o.model.seq);
        if (jf) {
            fprintf(jf, "{\"type\":\"summary\",");
            json_num(jf, "final_val_loss", r.final_val_loss, 1);
            fprintf(jf, "\"eval_windows\":%d}\n", r.eval_windows_used);
            if (json_close(&jo, 0)) {
                dl_train_result_free(&r);
                return CLI_EXIT_FAIL;
            }
        }
        dl_train_result_free(&r);
        return CLI_EXIT_OK;
    }
    print_summary(&o, &r);
    if (r.sample) {
        printf("sample (%d bytes): \"", o.sample);
        for (int i = 0; i < o.sample; i++) {
            unsigned char ch = (unsigned char)r.sample[i];
            if (ch >= 0x20 && ch < 0x7f && ch != '"' && ch != '\\')
                putchar(ch);
            else
                printf("\\x%02x", ch);
        }
        printf("\"\n");
    }
    check_t chk = {0};
    int status = CLI_EXIT_OK, check_ran = 0;
    if (check) {
        dl_train_opts one = o;
        one.dp = 1;
        one.tp = 1;
        one.pp = 1;
        one.schedule = 0;
        one.virtual_stages = 0;
        one.trace_path = NULL;
        one.timeline = 0;
        one.microbatches = o.dp * o.microbatches;
        one.global_batch = o.global_batch;
        one.log = quiet ? NULL : stderr; /* its progress: a second run as long as the first */
        one.trace_first = one.trace_last = 0;
        one.save_path = NULL;
        one.dump_grads = NULL;
        one.sample = 0;
        one.on_step = NULL;
        dl_train_result r1;
        printf("\n== --check: training the same configuration on one rank ...\n");
        fflush(stdout);
        if (dl_train_run(&one, &r1)) {
            cli_error("check run: %s", dl_errmsg());
            status = CLI_EXIT_FAIL;
        } else {
            for (int i = 0; i < r.nsteps && i < r1.nsteps; i++)
                chk.loss_diff = fmax(chk.loss_diff, fabs(r.steps[i].loss - r1.steps[i].loss) /
                                                        fabs(r1.steps[i].loss));
            chk.param_diff = compare_params(&o.model, r.params, r1.params, chk.worst_tensor);
            check_ran = 1;
            printf("largest relative difference vs one rank: losses %.3g, parameters %.3g (%s; "
                   "per tensor max|a-b|/max|b|)\n",
                   chk.loss_diff, chk.param_diff, chk.worst_tensor);
        }
        dl_train_result_free(&r1);
    }
    if (jf) {
        json_summary(jf, &o, &r, check_ran ? &chk : NULL);
        if (json_close(&jo, 0))
            status = CLI_EXIT_FAIL;
    }
    dl_train_result_free(&r);
    return status;
}
