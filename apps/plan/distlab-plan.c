/* distlab-plan: the planner and calculators of lecture 17 (memory, communication, ZeRO table,
 * pipeline bubble and partition, the 3-D search). The models live in lib/plan/plan.c; this file
 * parses flags and prints aligned tables for people, or CSV / JSON for scripts.
 * docs/PLANNER.md explains every formula and default. */
#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "distlab.h"
#include "cli.h"
#include "plan_calib.h"
#include "core/json.h"

/* ---------------------------------------------------------------------------------------- */
/* Tables: one set of rows printed three ways                                               */

enum { C_TEXT, C_NUM, C_INT, C_BOOL };
typedef struct cell {
    char txt[64]; /* what people see (with units) */
    double num;   /* what scripts get (SI base units: bytes, seconds) */
    int kind;
} cell;

#define MAXCOL 14
typedef struct table {
    const char *id;  /* JSON key / CSV section */
    char title[256]; /* printed above the human table ("" for none) */
    int ncol;
    const char *key[MAXCOL];   /* machine column names */
    const char *label[MAXCOL]; /* human headers */
    cell *cells;
    int nrow, cap;
} table;

static table tables[8];
static int ntables;

static table *tbl_new(const char *id, const char *title, int ncol, ...)
{
    table *t = &tables[ntables++];
    memset(t, 0, sizeof *t);
    t->id = id;
    snprintf(t->title, sizeof t->title, "%s", title ? title : "");
    t->ncol = ncol;
    va_list ap;
    va_start(ap, ncol);
    for (int i = 0; i < ncol; i++) {
        t->key[i] = va_arg(ap, const char *);
        t->label[i] = va_arg(ap, const char *);
    }
    va_end(ap);
    return t;
}

static cell *tbl_next(table *t)
{
    int need = (t->nrow + 1) * t->ncol;
    if (need > t->cap) {
        int cap = t->cap ? 2 * t->cap : 64 * t->ncol;
        while (cap < need) cap *= 2;
        cell *c = realloc(t->cells, (size_t)cap * sizeof *c);
        if (c == NULL) {
            cli_error("out of memory");
            exit(CLI_EXIT_FAIL);
        }
        t->cells = c;
        t->cap = cap;
    }
    return t->cells; /* rows are filled through tbl_set */
}

static int cur_col;
static table *cur_tbl;
static void tbl_row(table *t)
{
    tbl_next(t);
    t->nrow++;
    cur_tbl = t;
    cur_col = 0;
    memset(&t->cells[(t->nrow - 1) * t->ncol], 0, (size_t)t->ncol * sizeof(cell));
}
static cell *tbl_cell(void)
{
    return &cur_tbl->cells[(cur_tbl->nrow - 1) * cur_tbl->ncol + cur_col++];
}

static void c_text(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void c_text(const char *fmt, ...)
{
    cell *c = tbl_cell();
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->txt, sizeof c->txt, fmt, ap);
    va_end(ap);
    c->kind = C_TEXT;
}
static void c_num(double v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void c_num(double v, const char *fmt, ...)
{
    cell *c = tbl_cell();
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->txt, sizeof c->txt, fmt, ap);
    va_end(ap);
    c->num = v;
    c->kind = C_NUM;
}
static void c_int(long v)
{
    cell *c = tbl_cell();
    snprintf(c->txt, sizeof c->txt, "%ld", v);
    c->num = (double)v;
    c->kind = C_INT;
}
static void c_bool(int v)
{
    cell *c = tbl_cell();
    snprintf(c->txt, sizeof c->txt, "%s", v ? "yes" : "no");
    c->num = v;
    c->kind = C_BOOL;
}

/* Human byte counts in binary units, three significant digits (the lecture's decimal 2.87 GB is
 * 2.67 GiB here; distlab-lecture keeps the lecture's units, --csv and --json raw bytes). */
static const char *fmt_bytes(double b, char *buf, size_t n)
{
    static const char *const u[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int i = 0;
    while (fabs(b) >= 1023.5 && i < 5) {
        b /= 1024;
        i++;
    }
    if (i == 0)
        snprintf(buf, n, "%.0f B", b);
    else
        snprintf(buf, n, "%.3g %s", b, u[i]);
    return buf;
}
/* A byte cell of a table: GiB, the unit named in the column's heading. */
static void c_bytes(double b)
{
    double g = cli_gib(b);
    if (fabs(g) >= 999.5)
        c_num(b, "%.0f", g); /* 1950, not 1.95e+03 */
    else
        c_num(b, "%.3g", g);
}
static void c_secs(double s)
{
    if (s == 0)
        c_num(0, "0 s");
    else if (s < 1e-3)
        c_num(s, "%.3g us", s * 1e6);
    else if (s < 1)
        c_num(s, "%.3g ms", s * 1e3);
    else
        c_num(s, "%.3g s", s);
}

enum { OUT_HUMAN, OUT_CSV, OUT_JSON };

static void print_tables(int mode, FILE *f)
{
    if (mode == OUT_JSON)
        fprintf(f, "{");
    for (int ti = 0; ti < ntables; ti++) {
        table *t = &tables[ti];
        if (mode == OUT_HUMAN) {
            int w[MAXCOL];
            for (int c = 0; c < t->ncol; c++) {
                w[c] = (int)strlen(t->label[c]);
                for (int r = 0; r < t->nrow; r++) {
                    int l = (int)strlen(t->cells[r * t->ncol + c].txt);
                    if (l > w[c])
                        w[c] = l;
                }
            }
            if (ti > 0)
                fputc('\n', f);
            if (t->title[0])
                fprintf(f, "%s\n", t->title);
            for (int c = 0; c < t->ncol; c++)
                fprintf(f, c == 0 ? "  %-*s" : "  %*s", w[c], t->label[c]);
            fputc('\n', f);
            for (int r = 0; r < t->nrow; r++) {
                for (int c = 0; c < t->ncol; c++) {
                    const cell *x = &t->cells[r * t->ncol + c];
                    /* text left-aligned, numbers right-aligned so that units line up */
                    if (x->kind == C_TEXT && c == t->ncol - 1)
                        fprintf(f, "  %s", x->txt); /* no trailing blanks */
                    else
                        fprintf(f, x->kind == C_TEXT ? "  %-*s" : "  %*s", w[c], x->txt);
                }
                fputc('\n', f);
            }
        } else if (mode == OUT_CSV) {
            if (ntables > 1)
                fprintf(f, "%s# %s\n", ti ? "\n" : "", t->id);
            for (int c = 0; c < t->ncol; c++) fprintf(f, "%s%s", c ? "," : "", t->key[c]);
            fputc('\n', f);
            for (int r = 0; r < t->nrow; r++) {
                for (int c = 0; c < t->ncol; c++) {
                    const cell *x = &t->cells[r * t->ncol + c];
                    if (c)
                        fputc(',', f);
                    if (x->kind == C_TEXT)
                        fprintf(f, "%s", x->txt);
                    else if (x->kind == C_NUM)
                        fprintf(f, "%.6g", x->num);
                    else
                        fprintf(f, "%ld", (long)x->num);
                }
                fputc('\n', f);
            }
        } else {
            fprintf(f, "%s\n  ", ti ? "," : "");
            dl__json_fputs(f, t->id, DL__JSON_CTRL_U);
            fprintf(f, ": [");
            for (int r = 0; r < t->nrow; r++) {
                fprintf(f, "%s\n    {", r ? "," : "");
                for (int c = 0; c < t->ncol; c++) {
                    const cell *x = &t->cells[r * t->ncol + c];
                    fprintf(f, "%s", c ? ", " : "");
                    dl__json_fputs(f, t->key[c], DL__JSON_CTRL_U);
                    fputs(": ", f);
                    if (x->kind == C_TEXT)
                        dl__json_fputs(f, x->txt, DL__JSON_CTRL_U);
                    else if (x->kind == C_NUM)
                        fprintf(f, "%.6g", x->num);
                    else if (x->kind == C_BOOL)
                        fputs(x->num ? "true" : "false", f);
                    else
                        fprintf(f, "%ld", (long)x->num);
                }
                fputc('}', f);
            }
            fprintf(f, "\n  ]");
        }
    }
    if (mode == OUT_JSON)
        fprintf(f, "\n}\n");
    for (int ti = 0; ti < ntables; ti++) free(tables[ti].cells);
    ntables = 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Options common to the subcommands                                                         */

typedef struct args {
    const char *sub;
    dl_plan_model model;
    int have_model; /* a preset or a custom shape / count was given */
    dl_plan_hw hw;
    dl_plan_opts o;
    dl_plan_layout l;
    int gpus; /* 0: t*p*d */
    int gbatch_given, zero_given, d_given;
    double tokens_per_gpu; /* comm: > 0 sets the global batch */
    /* zero */
    double zero_params;
    int zero_nd;
    /* pipeline */
    long m;
    int slices;
    double target;
    char *costs;
    int mode;
} args;

/* Flags each subcommand accepts (a bit per group). */
enum {
    G_MODEL = 1,
    G_HW = 2,
    G_LAYOUT = 4,
    G_ASSUME = 8,
    G_GPUS = 16,
    G_ZERO = 32,
    G_PIPE = 64,
    G_TOKENS = 128
};

typedef struct flag {
    const char *name;
    int group;
    int id;
} flag;

enum {
    F_MODEL,
    F_LAYERS,
    F_HIDDEN,
    F_HEADS,
    F_KV,
    F_FFN,
    F_VOCAB,
    F_PARAMS,
    F_GATED,
    F_SEQ,
    F_HARDWARE,
    F_TFLOPS,
    F_MFU,
    F_MEMGB,
    F_NVLINK,
    F_IB,
    F_GPN,
    F_T,
    F_P,
    F_D,
    F_V,
    F_ZERO,
    F_MB,
    F_GB,
    F_GPUS,
    F_TOKENS,
    F_FPT,
    F_WB,
    F_GRB,
    F_K,
    F_GCB,
    F_AB,
    F_RECOMP,
    F_SP,
    F_SCHED,
    F_TPAR,
    F_TPLINK,
    F_PPLINK,
    F_DPLINK,
    F_MEMLIMIT,
    F_ZPARAMS,
    F_ZK,
    F_ND,
    F_M,
    F_SLICES,
    F_TARGET,
    F_COSTS,
    F_EXPERTS,
    F_TOPK,
    F_EFFN,
    F_MOE_EVERY,
    F_CAPACITY,
    F_EP,
    F_EPLINK
};

static const flag flags[] = {
    {"model", G_MODEL, F_MODEL},
    {"layers", G_MODEL, F_LAYERS},
    {"hidden", G_MODEL, F_HIDDEN},
    {"heads", G_MODEL, F_HEADS},
    {"kv-heads", G_MODEL, F_KV},
    {"ffn", G_MODEL, F_FFN},
    {"vocab", G_MODEL, F_VOCAB},
    {"params", G_MODEL | G_ZERO, F_PARAMS},
    {"gated", G_MODEL, F_GATED},
    {"seq", G_MODEL, F_SEQ},
    {"hardware", G_HW, F_HARDWARE},
    {"tflops", G_HW, F_TFLOPS},
    {"mfu", G_HW, F_MFU},
    {"mem-gb", G_HW, F_MEMGB},
    {"nvlink-gbs", G_HW, F_NVLINK},
    {"ib-gbs", G_HW, F_IB},
    {"gpus-per-node", G_HW, F_GPN},
    {"t", G_LAYOUT, F_T},
    {"p", G_LAYOUT | G_PIPE, F_P},
    {"d", G_LAYOUT | G_PIPE, F_D},
    {"v", G_LAYOUT | G_PIPE, F_V},
    {"zero", G_LAYOUT | G_ASSUME, F_ZERO},
    {"micro-batch", G_LAYOUT | G_PIPE, F_MB},
    {"global-batch", G_LAYOUT | G_PIPE, F_GB},
    {"gpus", G_GPUS, F_GPUS},
    {"tokens-per-gpu", G_TOKENS, F_TOKENS},
    {"flops-per-token", G_ASSUME, F_FPT},
    {"weight-bytes", G_ASSUME, F_WB},
    {"grad-bytes", G_ASSUME, F_GRB},
    {"K", G_ASSUME | G_ZERO, F_K},
    {"grad-comm-bytes", G_ASSUME, F_GCB},
    {"act-bytes", G_ASSUME, F_AB},
    {"recompute", G_ASSUME, F_RECOMP},
    {"seq-parallel", G_ASSUME, F_SP},
    {"schedule", G_ASSUME, F_SCHED},
    {"tp-allreduces", G_ASSUME, F_TPAR},
    {"tp-link", G_ASSUME, F_TPLINK},
    {"pp-link", G_ASSUME, F_PPLINK},
    {"dp-link", G_ASSUME, F_DPLINK},
    {"mem-limit-gb", G_ASSUME, F_MEMLIMIT},
    {"nd", G_ZERO, F_ND},
    {"m", G_PIPE, F_M},
    {"slices", G_PIPE, F_SLICES},
    {"target", G_PIPE, F_TARGET},
    {"costs", G_PIPE, F_COSTS},
    {"experts", G_MODEL, F_EXPERTS},
    {"top-k", G_MODEL, F_TOPK},
    {"expert-ffn", G_MODEL, F_EFFN},
    {"moe-every", G_MODEL, F_MOE_EVERY},
    {"capacity-factor", G_MODEL, F_CAPACITY},
    {"ep", G_LAYOUT, F_EP},
    {"ep-link", G_ASSUME, F_EPLINK},
};

static const char *const help_model =
    "Model:\n"
    "  --model PRESET        gpt3-175b, llama3-405b, dense-7.5b, dense-70b, maverick-400b,\n"
    "                        mixtral-8x7b\n"
    "  --layers N --hidden N --heads N --kv-heads N --ffn N --vocab N --gated 0|1\n"
    "                        a custom shape (or override a preset's; ffn defaults to 4 x hidden,\n"
    "                        kv-heads to heads, vocab to 50257, gated 0 = GPT MLP)\n"
    "  --params N            a bare parameter count (e.g. 400e9); pins Psi for a shape\n"
    "  --seq N               tokens per sequence (default: the model's, 2048)\n"
    "  --experts E --top-k K --expert-ffn F --moe-every N --capacity-factor C\n"
    "                        a mixture of experts: the MLP of every N-th layer (1) becomes E\n"
    "                        experts of width F (the model's ffn) in the model's MLP form, K per\n"
    "                        token (2), capacity factor C (0: no limit)\n";
static const char *const help_hw =
    "Hardware:\n"
    "  --hardware PRESET|FILE  a100, h100 (default), b200, or a profile file (key = value;\n"
    "                        see docs/PLANNER.md)\n"
    "  --tflops X --mfu X --mem-gb X --nvlink-gbs X --ib-gbs X --gpus-per-node N\n"
    "                        override values (dense BF16 TFLOP/s, fraction, GB per GPU,\n"
    "                        GB/s per GPU per direction)\n";
static const char *const help_assume =
    "Assumptions (defaults reproduce the lecture):\n"
    "  --flops-per-token X   model FLOPs per token per parameter (6)\n"
    "  --weight-bytes X --grad-bytes X --K X   bytes per parameter (2, 2, 12)\n"
    "  --grad-comm-bytes X   bytes per gradient value on the wire (2: BF16)\n"
    "  --act-bytes X         bytes per activation value stored or sent (2)\n"
    "  --recompute 0|1       full activation recomputation (1)\n"
    "  --seq-parallel 0|1    stored activations split over t (1)\n"
    "  --schedule 1f1b|gpipe micro-batches the first stage holds: min(p, m) or m (1f1b)\n"
    "  --tp-allreduces N     all-reduces per layer per micro-batch (4: 2 forward, 2 backward)\n"
    "  --zero 0-3            ZeRO stage over the d data-parallel GPUs (1)\n"
    "  --tp-link L --pp-link L --dp-link L   nvlink, ib or auto (nvlink, ib, ib)\n"
    "  --ep-link L           the experts' all-to-alls: nvlink, ib or auto (ib: across nodes)\n"
    "  --mem-limit-gb X      fit against X GB instead of the GPU's memory\n";
static const char *const help_out =
    "Output:\n"
    "  --csv, --json         machine-readable rows (bytes and seconds) instead of tables\n"
    "  -h, --help            this help\n";

static void usage_main(FILE *f)
{
    fprintf(f,
            "Usage: distlab-plan SUBCOMMAND [OPTIONS]\n"
            "\n"
            "The lecture's accounting of distributed training as a tool (docs/PLANNER.md).\n"
            "\n"
            "Subcommands:\n"
            "  memory     bytes per parameter, activations, memory per GPU for (t, p, d, ZeRO)\n"
            "  comm       per-step communication of DP, TP, PP and ZeRO, and comm / compute\n"
            "  zero       the ZeRO table for Psi, K, N_d\n"
            "  pipeline   bubble, micro-batches in flight, balanced layer partition\n"
            "  search     the 3-D (t, p, d) enumeration sorted by step time\n"
            "  calibrate, validate   measure this machine; check predictions against trainer runs\n"
            "\n"
            "  -h, --help       this help; `distlab-plan SUBCOMMAND --help` for a subcommand's\n"
            "  -V, --version    print the version\n");
}

static void usage_sub(const char *sub, FILE *f)
{
    if (strcmp(sub, "memory") == 0) {
        fprintf(f,
                "Usage: distlab-plan memory [OPTIONS]\n\n"
                "Bytes per parameter (weights, gradients, optimizer K), activations per layer\n"
                "(Korthikanti et al.: s*b*h*(34 + 5as/h), with and without full recompute), the\n"
                "GPUs needed for the model states, and memory per GPU of the first pipeline stage\n"
                "for --t, --p, --d and --zero. Default: gpt3-175b on one H100.\n\n"
                "Layout:\n  --t N --p N --d N --zero S --micro-batch N --global-batch N\n"
                "  --ep N                expert parallelism: N of the d GPUs share the experts\n"
                "                        (global batch default: d x micro-batch x p, so m = "
                "p)\n\n");
        fputs(help_model, f);
        fputs(help_hw, f);
        fputs(help_assume, f);
        fputs(help_out, f);
    } else if (strcmp(sub, "comm") == 0) {
        fprintf(f,
                "Usage: distlab-plan comm [OPTIONS]\n\n"
                "Per-step communication: data-parallel ring all-reduce of the gradients (on "
                "NVLink\n"
                "and on InfiniBand), tensor-parallel all-reduces per layer, pipeline sends, ZeRO\n"
                "traffic (2 Psi vs 3 Psi), each against the compute. Default: the lecture's 7.5B\n"
                "model on 64 H100 of data parallelism, 16,384 tokens per GPU.\n\n"
                "Layout:\n  --t N --p N --d N --zero S --micro-batch N --global-batch N\n"
                "  --ep N                expert parallelism: N of the d GPUs share the experts\n"
                "  --tokens-per-gpu N    sets the global batch to N x GPUs / seq\n\n");
        fputs(help_model, f);
        fputs(help_hw, f);
        fputs(help_assume, f);
        fputs(help_out, f);
    } else if (strcmp(sub, "zero") == 0) {
        fprintf(f, "Usage: distlab-plan zero [OPTIONS]\n\n"
                   "Memory per GPU of the ZeRO stages (Rajbhandari et al. 2020, Figure 1) and the\n"
                   "traffic per GPU per step. Default: Psi = 7.5e9, K = 12, N_d = 64.\n\n"
                   "  --params N | --model PRESET   Psi\n"
                   "  --K X                 optimizer bytes per parameter (12)\n"
                   "  --nd N                data-parallel GPUs (64)\n\n");
        fputs(help_out, f);
    } else if (strcmp(sub, "pipeline") == 0) {
        fprintf(f,
                "Usage: distlab-plan pipeline [OPTIONS]\n\n"
                "Bubble (p-1)/(v*m + p-1), micro-batches needed for a target bubble,\n"
                "micro-batches each stage holds with GPipe and 1F1B, weight versions between a\n"
                "micro-batch's forward and backward (PipeDream), and with --costs the balanced\n"
                "layer partition (minimise the slowest stage) next to the even split.\n\n"
                "  --p N                 stages (4)\n"
                "  --m N                 micro-batches (8); or --global-batch B --d D "
                "--micro-batch b\n"
                "  --v N                 interleaved virtual stages per GPU (1)\n"
                "  --slices C            token slices per sequence (TeraPipe: m becomes m x C)\n"
                "  --target F            bubble target for the micro-batch count (0.10)\n"
                "  --costs LIST          per-layer costs, e.g. 3,1x10,4 (VALUExCOUNT repeats)\n\n");
        fputs(help_out, f);
    } else if (strcmp(sub, "search") == 0) {
        fprintf(f,
                "Usage: distlab-plan search [OPTIONS]\n\n"
                "Enumerate t x p x d = GPUs (t divides a node and the heads, p <= layers, d x\n"
                "micro-batch divides the global batch) with memory per GPU, fit, bubble and step\n"
                "time = compute / (1 - bubble) + TP + PP + DP communication; sorted by time.\n"
                "Default: gpt3-175b, 1024 H100 (8 per node), 1536 sequences of 2048 tokens.\n\n"
                "  --gpus N              GPUs (1024; a multiple of --gpus-per-node)\n"
                "  --global-batch N      sequences per step (1536)\n"
                "  --micro-batch N       sequences per micro-batch (1)\n"
                "  --v N                 interleaved stages (1)\n"
                "With experts (--experts or a MoE preset) every ep dividing d and the experts "
                "too.\n\n");
        fputs(help_model, f);
        fputs(help_hw, f);
        fputs(help_assume, f);
        fputs(help_out, f);
    }
}

static int sub_groups(const char *sub)
{
    if (strcmp(sub, "memory") == 0)
        return G_MODEL | G_HW | G_LAYOUT | G_ASSUME;
    if (strcmp(sub, "comm") == 0)
        return G_MODEL | G_HW | G_LAYOUT | G_ASSUME | G_TOKENS;
    if (strcmp(sub, "zero") == 0)
        return G_ZERO;
    if (strcmp(sub, "pipeline") == 0)
        return G_PIPE;
    return G_MODEL | G_HW | G_ASSUME | G_GPUS | G_LAYOUT;
}

static int parse_link(const char *what, const char *s, dl_plan_link *out)
{
    if (strcmp(s, "nvlink") == 0 || strcmp(s, "intra") == 0)
        *out = DL_PLAN_LINK_INTRA;
    else if (strcmp(s, "ib") == 0 || strcmp(s, "inter") == 0)
        *out = DL_PLAN_LINK_INTER;
    else if (strcmp(s, "auto") == 0)
        *out = DL_PLAN_LINK_AUTO;
    else {
        cli_error("%s: '%s' is not nvlink, ib or auto", what, s);
        return -1;
    }
    return 0;
}

/* Positive integer within [1, max]. */
static int pint(const char *what, const char *s, long max, int *out)
{
    return cli_parse_int(what, s, 1, max, out);
}

/* `arg` is none of subcommand sub's flags (groups): the one line, with the nearest of them */
static void unknown_flag(const char *sub, int groups, const char *arg)
{
    const char *names[sizeof flags / sizeof flags[0] + 3] = {"help", "csv", "json"};
    size_t n = 3;
    for (size_t k = 0; k < sizeof flags / sizeof flags[0]; k++)
        if ((flags[k].group & groups) || (strcmp(sub, "zero") == 0 && flags[k].id == F_MODEL))
            names[n++] = flags[k].name;
    char prefix[32], help[64];
    snprintf(prefix, sizeof prefix, "%s: ", sub);
    snprintf(help, sizeof help, "distlab-plan %s --help", sub);
    cli_unknown_option(prefix, arg, names, sizeof names[0], n, 0, help);
}

/* The MoE flags on top of the model (-1: not given): --experts on a dense model defaults top-k
 * to 2 (Mixtral's); the flags without --experts on a dense model are refused by the check. */
static int set_moe(dl_plan_model *m, const int moe[4], double cap)
{
    if (moe[0] > 0 && m->experts == 0 && moe[1] < 0)
        m->top_k = moe[0] < 2 ? 1 : 2;
    if (moe[0] > 0)
        m->experts = moe[0];
    if (moe[1] > 0)
        m->top_k = moe[1];
    if (moe[2] > 0)
        m->expert_ffn = moe[2];
    if (moe[3] > 0)
        m->moe_every = moe[3];
    if (cap >= 0)
        m->capacity = cap;
    if (m->experts > 0 && m->params > 0) {
        cli_error("a mixture of experts needs its shape counted: --params pins Psi");
        return -1;
    }
    if (dl_plan_model_check(m, 0, NULL) != DL_OK) {
        cli_error("%s", dl_errmsg());
        return -1;
    }
    return 0;
}

static int parse_args(args *a, int argc, char **argv)
{
    const char *hw_name = "h100", *model_name = NULL;
    int shape[F_SEQ + 1];
    int shape_set[F_SEQ + 1];
    double params = -1, tflops = -1, mfu = -1, memgb = -1, nvl = -1, ib = -1, cap = -1;
    int gpn = -1, moe[4] = {-1, -1, -1, -1}; /* experts, top-k, expert ffn, moe-every */
    memset(shape_set, 0, sizeof shape_set);
    int groups = sub_groups(a->sub);

    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            usage_sub(a->sub, stdout);
            exit(CLI_EXIT_OK);
        }
        if (strcmp(arg, "--csv") == 0) {
            a->mode = OUT_CSV;
            continue;
        }
        if (strcmp(arg, "--json") == 0) {
            a->mode = OUT_JSON;
            continue;
        }
        if (strncmp(arg, "--", 2) != 0) {
            cli_error("%s: unexpected argument '%s' (see distlab-plan %s --help)", a->sub, arg,
                      a->sub);
            return -1;
        }
        const char *name = arg + 2, *val = NULL;
        char namebuf[64];
        const char *eq = strchr(name, '=');
        if (eq) {
            size_t n = (size_t)(eq - name);
            if (n >= sizeof namebuf)
                n = sizeof namebuf - 1;
            memcpy(namebuf, name, n);
            namebuf[n] = '\0';
            name = namebuf;
            val = eq + 1;
        }
        const flag *fl = NULL;
        for (size_t k = 0; k < sizeof flags / sizeof flags[0]; k++)
            if (strcmp(flags[k].name, name) == 0)
                fl = &flags[k];
        int ok_model_for_zero = strcmp(a->sub, "zero") == 0 && fl && fl->id == F_MODEL;
        if (fl == NULL || (!(fl->group & groups) && !ok_model_for_zero)) {
            unknown_flag(a->sub, groups, arg);
            return -1;
        }
        if (val == NULL) {
            if (i + 1 >= argc) {
                cli_error("%s: option '--%s' needs a value", a->sub, name);
                return -1;
            }
            val = argv[++i];
        }
        char what[80];
        snprintf(what, sizeof what, "--%s", name);
        int r = 0, iv;
        double dv;
        switch (fl->id) {
        case F_MODEL: model_name = val; break;
        case F_LAYERS:
        case F_HIDDEN:
        case F_HEADS:
        case F_KV:
        case F_FFN:
        case F_VOCAB:
        case F_SEQ:
            r = pint(what, val, 100000000L, &shape[fl->id]);
            shape_set[fl->id] = 1;
            break;
        case F_GATED:
            r = cli_parse_bool(what, val, &shape[F_GATED]);
            shape_set[F_GATED] = 1;
            break;
        case F_PARAMS: r = cli_parse_double(what, val, 1, 1e16, &params); break;
        case F_HARDWARE: hw_name = val; break;
        case F_TFLOPS: r = cli_parse_double(what, val, 1e-6, 1e9, &tflops); break;
        case F_MFU: r = cli_parse_double(what, val, 1e-6, 1, &mfu); break;
        case F_MEMGB: r = cli_parse_double(what, val, 1e-6, 1e9, &memgb); break;
        case F_NVLINK: r = cli_parse_double(what, val, 1e-9, 1e9, &nvl); break;
        case F_IB: r = cli_parse_double(what, val, 1e-9, 1e9, &ib); break;
        case F_GPN: r = pint(what, val, 1000000, &gpn); break;
        case F_T: r = pint(what, val, 1 << 20, &a->l.t); break;
        case F_P: r = pint(what, val, 1 << 20, &a->l.p); break;
        case F_D:
            r = pint(what, val, 1 << 24, &a->l.d);
            a->d_given = 1;
            break;
        case F_V: r = pint(what, val, 1 << 20, &a->l.v); break;
        case F_ZERO:
            r = cli_parse_int(what, val, 0, 3, &a->o.zero_stage);
            a->zero_given = 1;
            break;
        case F_MB: r = pint(what, val, 1 << 24, &a->l.micro_batch); break;
        case F_GB:
            r = pint(what, val, 1L << 30, &iv);
            a->l.global_batch = iv;
            a->gbatch_given = 1;
            break;
        case F_GPUS: r = pint(what, val, 1 << 24, &a->gpus); break;
        case F_TOKENS: r = cli_parse_double(what, val, 1, 1e15, &a->tokens_per_gpu); break;
        case F_FPT: r = cli_parse_double(what, val, 1e-6, 1e6, &a->o.flops_per_token); break;
        case F_WB: r = cli_parse_double(what, val, 0, 1e3, &a->o.weight_bytes); break;
        case F_GRB: r = cli_parse_double(what, val, 0, 1e3, &a->o.grad_bytes); break;
        case F_K: r = cli_parse_double(what, val, 0, 1e3, &a->o.optim_bytes); break;
        case F_GCB: r = cli_parse_double(what, val, 0, 1e3, &a->o.grad_comm_bytes); break;
        case F_AB: r = cli_parse_double(what, val, 1e-6, 1e3, &a->o.act_bytes); break;
        case F_RECOMP: r = cli_parse_bool(what, val, &a->o.recompute); break;
        case F_SP: r = cli_parse_bool(what, val, &a->o.seq_parallel); break;
        case F_SCHED:
            if (strcmp(val, "1f1b") == 0)
                a->o.schedule = DL_PLAN_1F1B;
            else if (strcmp(val, "gpipe") == 0)
                a->o.schedule = DL_PLAN_GPIPE;
            else {
                cli_error("%s: '%s' is not 1f1b or gpipe", what, val);
                r = -1;
            }
            break;
        case F_TPAR: r = cli_parse_int(what, val, 0, 1000, &a->o.tp_allreduces); break;
        case F_TPLINK: r = parse_link(what, val, &a->o.tp_link); break;
        case F_PPLINK: r = parse_link(what, val, &a->o.pp_link); break;
        case F_DPLINK: r = parse_link(what, val, &a->o.dp_link); break;
        case F_MEMLIMIT:
            r = cli_parse_double(what, val, 1e-9, 1e9, &dv);
            a->o.mem_limit = dv * 1e9;
            break;
        case F_ND: r = pint(what, val, 1 << 30, &a->zero_nd); break;
        case F_M:
            r = pint(what, val, 1L << 30, &iv);
            a->m = iv;
            break;
        case F_SLICES: r = pint(what, val, 1 << 20, &a->slices); break;
        case F_TARGET: r = cli_parse_double(what, val, 1e-9, 1 - 1e-9, &a->target); break;
        case F_COSTS: a->costs = (char *)val; break;
        case F_EXPERTS:
        case F_TOPK:
        case F_EFFN:
        case F_MOE_EVERY: r = pint(what, val, 100000000L, &moe[fl->id - F_EXPERTS]); break;
        case F_CAPACITY: r = cli_parse_double(what, val, 0, 1e6, &cap); break;
        case F_EP: r = pint(what, val, 1 << 24, &a->l.e); break;
        case F_EPLINK: r = parse_link(what, val, &a->o.ep_link); break;
        default: break;
        }
        if (r)
            return -1;
    }

    /* model: preset, then shape flags on top; shape flags alone build a custom model */
    int any_shape = 0;
    for (int k = F_LAYERS; k <= F_GATED; k++) any_shape |= shape_set[k];
    if (model_name) {
        if (dl_plan_model_preset(model_name, &a->model) != DL_OK) {
            cli_error("%s", dl_errmsg());
            return -1;
        }
        a->have_model = 1;
    } else if (any_shape || params > 0) {
        memset(&a->model, 0, sizeof a->model);
        snprintf(a->model.name, sizeof a->model.name, "custom");
        a->model.seq = 2048;
        if (any_shape) {
            if (!shape_set[F_LAYERS] || !shape_set[F_HIDDEN] || !shape_set[F_HEADS]) {
                cli_error("%s: a custom shape needs --layers, --hidden and --heads", a->sub);
                return -1;
            }
            a->model.ffn = 4 * shape[F_HIDDEN];
            a->model.vocab = 50257;
        }
        a->have_model = 1;
    }
    if (a->have_model) {
        dl_plan_model *m = &a->model;
        if (any_shape && model_name && !dl_plan_model_has_shape(m)) {
            cli_error("%s: model %s is a bare parameter count; give a full custom shape instead",
                      a->sub, m->name);
            return -1;
        }
        if (shape_set[F_LAYERS])
            m->layers = shape[F_LAYERS];
        if (shape_set[F_HIDDEN])
            m->hidden = shape[F_HIDDEN];
        if (shape_set[F_HEADS])
            m->heads = shape[F_HEADS];
        if (shape_set[F_KV])
            m->kv_heads = shape[F_KV];
        else if (!model_name && any_shape)
            m->kv_heads = m->heads;
        if (shape_set[F_FFN])
            m->ffn = shape[F_FFN];
        if (shape_set[F_VOCAB])
            m->vocab = shape[F_VOCAB];
        if (shape_set[F_GATED])
            m->gated_mlp = shape[F_GATED];
        /* a changed shape changes Psi, unless --params pins it */
        if (any_shape && shape_set[F_LAYERS] + shape_set[F_HIDDEN] + shape_set[F_HEADS] +
                                 shape_set[F_KV] + shape_set[F_FFN] + shape_set[F_VOCAB] +
                                 shape_set[F_GATED] >
                             0)
            m->params = 0;
        if (params > 0)
            m->params = params;
        if (dl_plan_model_check(m, 0, NULL) != DL_OK) {
            cli_error("%s", dl_errmsg());
            return -1;
        }
    }
    if (set_moe(&a->model, moe, cap))
        return -1;
    if (shape_set[F_SEQ]) {
        a->model.seq = shape[F_SEQ];
        a->l.seq = shape[F_SEQ];
    }
    if (strcmp(a->sub, "zero") == 0 && params > 0)
        a->zero_params = params;

    /* hardware: preset or file, then overrides */
    if (groups & G_HW) {
        if (dl_plan_hw_preset(hw_name, &a->hw) != DL_OK) {
            int is_preset_like = strchr(hw_name, '/') == NULL && strchr(hw_name, '.') == NULL;
            if (access(hw_name, F_OK) != 0 && is_preset_like) {
                cli_error("unknown hardware preset '%s' (presets: a100, h100, b200, or a profile "
                          "file)",
                          hw_name);
                return -1;
            }
            if (dl_plan_hw_load(hw_name, &a->hw) != DL_OK) {
                cli_error("%s", dl_errmsg());
                return -1;
            }
        }
        if (tflops > 0)
            a->hw.flops = tflops * 1e12;
        if (mfu > 0)
            a->hw.mfu = mfu;
        if (memgb > 0)
            a->hw.mem_bytes = memgb * 1e9;
        if (nvl > 0)
            a->hw.intra_bw = nvl * 1e9;
        if (ib > 0)
            a->hw.inter_bw = ib * 1e9;
        if (gpn > 0)
            a->hw.gpus_per_node = gpn;
        if (dl_plan_hw_check(&a->hw) != DL_OK) {
            cli_error("%s", dl_errmsg());
            return -1;
        }
    }
    return 0;
}

static void describe_model(const dl_plan_model *m, char *buf, size_t n)
{
    double psi = dl_plan_model_params(m);
    char moe[160] = "";
    if (m->experts > 0)
        snprintf(moe, sizeof moe,
                 "; %d MoE layers of %d experts (FFN %d), top-%d, capacity factor %g%s: %.4g "
                 "billion in experts, %.4g billion active per token",
                 dl_plan_moe_layers(m), m->experts, m->expert_ffn > 0 ? m->expert_ffn : m->ffn,
                 m->top_k, m->capacity, m->capacity > 0 ? "" : " (no limit)",
                 dl_plan_expert_params(m) / 1e9, dl_plan_model_active_params(m) / 1e9);
    if (dl_plan_model_has_shape(m))
        snprintf(buf, n,
                 "%s: %.4g billion parameters (%d layers, h %d, %d heads, %d kv heads, FFN %d, "
                 "vocab %d%s%s)",
                 m->name, psi / 1e9, m->layers, m->hidden, m->heads,
                 m->kv_heads ? m->kv_heads : m->heads, m->ffn, m->vocab,
                 m->gated_mlp ? ", SwiGLU" : "", moe);
    else
        snprintf(buf, n, "%s: %.4g billion parameters (a bare count: no shape)", m->name,
                 psi / 1e9);
}

static void describe_hw(const dl_plan_hw *hw, double mfu_override)
{
    char b1[32];
    printf("hardware %s: %.4g TFLOP/s dense BF16 at %.0f%% MFU, %s per GPU, NVLink %.4g GB/s and "
           "InfiniBand %.4g GB/s per direction, %d GPUs per node\n",
           hw->name, hw->flops / 1e12, 100 * (mfu_override > 0 ? mfu_override : hw->mfu),
           fmt_bytes(hw->mem_bytes, b1, sizeof b1), hw->intra_bw / 1e9, hw->inter_bw / 1e9,
           hw->gpus_per_node);
    printf("  %.0f BF16 operations per byte sent over NVLink: %.4g TFLOP/s / %.4g GB/s (both "
           "directions; the lecture's \"about 1100\")\n",
           dl_plan_ops_per_byte(hw), hw->flops / 1e12, 2 * hw->intra_bw / 1e9);
}

static int fail_lib(void)
{
    cli_error("%s", dl_errmsg());
    return CLI_EXIT_USAGE;
}

/* ---------------------------------------------------------------------------------------- */
/* memory                                                                                    */

static int cmd_memory(args *a)
{
    if (!a->have_model)
        dl_plan_model_preset("gpt3-175b", &a->model);
    dl_plan_model *m = &a->model;
    dl_plan_opts *o = &a->o;
    if (!a->gbatch_given)
        a->l.global_batch = (long)a->l.d * a->l.micro_batch * a->l.p;
    if (dl_plan_layout_check(m, &a->hw, &a->l) != DL_OK)
        return fail_lib();
    dl_plan_mem mem;
    if (dl_plan_memory(m, &a->hw, o, &a->l, &mem) != DL_OK)
        return fail_lib();
    double psi = mem.params, bpp = dl_plan_bytes_per_param(o);

    char title[256];
    table *t = tbl_new("model_states", "Model states, one full copy (mixed-precision Adam)", 3,
                       "item", "item", "bytes_per_param", "bytes/param", "bytes", "total GiB");
    tbl_row(t);
    c_text("weights");
    c_num(o->weight_bytes, "%g", o->weight_bytes);
    c_bytes(o->weight_bytes * psi);
    tbl_row(t);
    c_text("gradients");
    c_num(o->grad_bytes, "%g", o->grad_bytes);
    c_bytes(o->grad_bytes * psi);
    tbl_row(t);
    c_text("optimizer (K)");
    c_num(o->optim_bytes, "%g", o->optim_bytes);
    c_bytes(o->optim_bytes * psi);
    tbl_row(t);
    c_text("total");
    c_num(bpp, "%g", bpp);
    c_bytes(bpp * psi);
    char cap[32];
    long need = dl_plan_gpus_needed(bpp * psi, a->hw.mem_bytes);
    tbl_row(t);
    c_text("GPUs of %s needed", fmt_bytes(a->hw.mem_bytes, cap, sizeof cap));
    c_text("%s", "");
    c_int(need);

    if (dl_plan_model_has_shape(m)) {
        int s = a->l.seq > 0 ? a->l.seq : m->seq, b = a->l.micro_batch;
        snprintf(title, sizeof title,
                 "Activations per layer (s = %d, b = %d, t = 1; Korthikanti: s*b*h*(34 + 5as/h))",
                 s, b);
        t = tbl_new("activations", title, 3, "mode", "mode", "per_layer_bytes", "per layer GiB",
                    "all_layers_bytes", "all layers GiB");
        dl_plan_opts o1 = *o;
        double no = dl_plan_act_layer_bytes(m, &o1, s, b, 1, 0),
               re = dl_plan_act_layer_bytes(m, &o1, s, b, 1, 1);
        tbl_row(t);
        c_text("no recompute");
        c_bytes(no);
        c_bytes(no * m->layers);
        tbl_row(t);
        c_text("full recompute (layer input)");
        c_bytes(re);
        c_bytes(re * m->layers);
    }

    snprintf(title, sizeof title,
             "Per GPU (first pipeline stage): t = %d, p = %d, d = %d, ep = %d, ZeRO-%d, %s, m = %d "
             "micro-batches of %d",
             a->l.t, a->l.p, a->l.d, a->l.e > 1 ? a->l.e : 1, o->zero_stage,
             o->schedule == DL_PLAN_GPIPE ? "GPipe" : "1F1B", mem.micro_batches, a->l.micro_batch);
    t = tbl_new("per_gpu", title, 2, "item", "item", "bytes", "GiB");
    tbl_row(t);
    c_text("weights");
    c_bytes(mem.weights);
    tbl_row(t);
    c_text("gradients");
    c_bytes(mem.grads);
    tbl_row(t);
    c_text("optimizer");
    c_bytes(mem.optim);
    tbl_row(t);
    c_text("model states");
    c_bytes(mem.states);
    if (m->experts > 0) {
        tbl_row(t);
        c_text("of which experts (%d of %d per layer, ZeRO over d / ep = %d)",
               m->experts / (a->l.e > 1 ? a->l.e : 1), m->experts,
               a->l.d / (a->l.e > 1 ? a->l.e : 1));
        c_bytes(mem.expert_states);
    }
    tbl_row(t);
    if (dl_plan_model_has_shape(m))
        c_text("activations (%d layers x %d micro-batches)", mem.stage_layers, mem.inflight);
    else
        c_text("activations (bare parameter count: not estimated)");
    c_bytes(mem.act);
    tbl_row(t);
    c_text("total");
    c_bytes(mem.total);
    tbl_row(t);
    c_text("capacity");
    c_bytes(mem.capacity);
    tbl_row(t);
    c_text("fits");
    c_bool(mem.fits);

    if (a->mode == OUT_HUMAN) {
        char d[512];
        describe_model(m, d, sizeof d);
        printf("model %s\n", d);
        describe_hw(&a->hw, o->mfu);
        printf("\n");
    }
    print_tables(a->mode, stdout);
    return CLI_EXIT_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* comm                                                                                      */

/* The mixture of experts' rows of the comm table: one MoE layer's all-to-alls against its
 * experts' compute (the lecture's 235 MB and 0.32), the step's, the experts' gradients. */
static void comm_moe_rows(const args *a, const dl_plan_comm_report *c)
{
    const dl_plan_a2a *x = &c->a2a;
    int e = a->l.e > 1 ? a->l.e : 1;
    tbl_row(cur_tbl);
    c_text("EP all-to-alls, one MoE layer fwd");
    c_text(x->inter ? "ib" : "nvlink");
    c_bytes(x->fwd_sent);
    c_secs(x->fwd_time);
    c_num(x->ratio, "%.1f%%", 100 * x->ratio);
    c_text("2 x %.6g tok x k %d x h x %d/%d vs experts' fwd", x->tokens, a->model.top_k, e - 1, e);
    tbl_row(cur_tbl);
    c_text("EP all-to-alls, step");
    c_text(x->inter ? "ib" : "nvlink");
    c_bytes(c->a2a_step_sent);
    c_secs(c->a2a_step_time);
    c_num(c->a2a_step_time / c->compute, "%.1f%%", 100 * c->a2a_step_time / c->compute);
    c_text("4 per layer x %d MoE layers x %d micro-batches", c->moe_layers, c->micro_batches);
    tbl_row(cur_tbl);
    c_text("EDP expert gradient all-reduce");
    c_text(c->dp_inter ? "ib" : "nvlink");
    c_bytes(c->edp_sent);
    c_secs(c->edp_time);
    c_num(c->edp_time / c->compute, "%.1f%%", 100 * c->edp_time / c->compute);
    c_text("over the d / ep = %d GPUs with the same experts", a->l.d / e);
}

static int cmd_comm(args *a)
{
    if (!a->have_model) {
        dl_plan_model_preset("dense-7.5b", &a->model);
        if (!a->d_given)
            a->l.d = 64;
        if (!a->gbatch_given && a->tokens_per_gpu <= 0)
            a->tokens_per_gpu = 16384;
    }
    dl_plan_model *m = &a->model;
    int s = a->l.seq > 0 ? a->l.seq : m->seq;
    long n = (long)a->l.t * a->l.p * a->l.d;
    if (a->tokens_per_gpu > 0) {
        double gb = a->tokens_per_gpu * n / s;
        if (gb != floor(gb) || gb < 1) {
            cli_error("comm: %g tokens per GPU x %ld GPUs is not a whole number of %d-token "
                      "sequences",
                      a->tokens_per_gpu, n, s);
            return CLI_EXIT_USAGE;
        }
        a->l.global_batch = (long)gb;
    } else if (!a->gbatch_given) {
        a->l.global_batch = (long)a->l.d * a->l.micro_batch * a->l.p;
    }
    dl_plan_comm_report c;
    if (dl_plan_comm(m, &a->hw, &a->o, &a->l, &c) != DL_OK)
        return fail_lib();
    double bw_tp = 0, bw_pp = 0;
    int inter_tp = 0, inter_pp = 0;
    dl_plan_link_of(&a->hw, &a->o, &a->l, 0, &bw_tp, NULL, &inter_tp);
    dl_plan_link_of(&a->hw, &a->o, &a->l, 1, &bw_pp, NULL, &inter_pp);

    char title[300];
    snprintf(title, sizeof title,
             "Per step: t = %d, p = %d, d = %d (%ld GPUs), %ld sequences of %d tokens (%.6g tokens "
             "per GPU), "
             "m = %d; compute %.3g s",
             a->l.t, a->l.p, a->l.d, n, a->l.global_batch, s, (double)c.tokens / n, c.micro_batches,
             c.compute);
    table *t = tbl_new("comm", title, 6, "traffic", "traffic", "link", "link", "bytes_sent_per_gpu",
                       "sent per GPU GiB", "time_s", "time", "comm_over_compute", "comm/compute",
                       "note", "note");
    char gtxt[32];
    fmt_bytes(c.dp_grad_bytes, gtxt, sizeof gtxt);
    tbl_row(t);
    c_text("DP gradient all-reduce");
    c_text("nvlink");
    c_bytes(c.dp_sent);
    c_secs(c.dp_time_intra);
    c_num(c.dp_time_intra / c.compute, "%.1f%%", 100 * c.dp_time_intra / c.compute);
    c_text("%sring of %s gradients%s", a->o.zero_stage >= 3 ? "ZeRO-3: 3/2 x " : "", gtxt,
           c.dp_inter ? "" : " (layout's link)");
    tbl_row(t);
    c_text("DP gradient all-reduce");
    c_text("ib");
    c_bytes(c.dp_sent);
    c_secs(c.dp_time_inter);
    c_num(c.dp_time_inter / c.compute, "%.1f%%", 100 * c.dp_time_inter / c.compute);
    c_text("%sring of %s gradients%s", a->o.zero_stage >= 3 ? "ZeRO-3: 3/2 x " : "", gtxt,
           c.dp_inter ? " (layout's link)" : "");
    if (dl_plan_model_has_shape(m)) {
        tbl_row(t);
        c_text("TP all-reduces, one layer");
        c_text(inter_tp ? "ib" : "nvlink");
        c_bytes(a->l.t > 1 ? c.tp_layer_sent : 0);
        c_secs(a->l.t > 1 ? c.tp_layer_time : 0);
        c_num(a->l.t > 1 ? c.tp_layer_time / c.tp_layer_compute : 0, "%.1f%%",
              a->l.t > 1 ? 100 * c.tp_layer_time / c.tp_layer_compute : 0.0);
        c_text("%d x s*b*h per micro-batch, vs layer compute", a->o.tp_allreduces);
        tbl_row(t);
        c_text("TP all-reduces, step");
        c_text(inter_tp ? "ib" : "nvlink");
        double layers = (m->layers + a->l.p - 1) / a->l.p;
        c_bytes(a->l.t > 1 ? c.tp_layer_sent * layers * c.micro_batches : 0);
        c_secs(a->l.t > 1 ? c.tp_step_time : 0);
        c_num(a->l.t > 1 ? c.tp_step_time / c.compute : 0, "%.1f%%",
              a->l.t > 1 ? 100 * c.tp_step_time / c.compute : 0.0);
        c_text("%.0f layers x %d micro-batches", layers, c.micro_batches);
        tbl_row(t);
        c_text("PP sends, step");
        c_text(inter_pp ? "ib" : "nvlink");
        c_bytes(a->l.p > 1 ? 2.0 * c.micro_batches * c.pp_msg_bytes : 0);
        c_secs(c.pp_step_time);
        c_num(c.pp_step_time / c.compute, "%.1f%%", 100 * c.pp_step_time / c.compute);
        c_text("activation + gradient per micro-batch");
    }
    if (m->experts > 0)
        comm_moe_rows(a, &c);

    snprintf(title, sizeof title,
             "ZeRO traffic per GPU per step over d = %d (Psi' = %.4g billion %sparameters per GPU)",
             a->l.d, (c.params - dl_plan_expert_params(m)) / a->l.t / a->l.p / 1e9,
             m->experts > 0 ? "dense " : "");
    table *z = tbl_new("zero_comm", title, 4, "stage", "stage", "traffic", "traffic", "factor",
                       "x Psi'(N-1)/N", "bytes_sent_per_gpu", "sent per GPU GiB");
    static const char *const how[4] = {"all-reduce (reduce-scatter + all-gather)",
                                       "reduce-scatter grads + all-gather params",
                                       "reduce-scatter grads + all-gather params",
                                       "all-gather fwd + all-gather bwd + reduce-scatter"};
    for (int k = 0; k < 4; k++) {
        tbl_row(z);
        c_int(k);
        c_text("%s", how[k]);
        c_num(c.zero_factor[k], "%g", c.zero_factor[k]);
        c_bytes(c.zero_factor[k] / 2 * dl_plan_allreduce_sent(a->l.d, c.dp_grad_bytes));
    }

    if (a->mode == OUT_HUMAN) {
        char d[512];
        describe_model(m, d, sizeof d);
        printf("model %s\n", d);
        describe_hw(&a->hw, a->o.mfu);
        printf("\n");
    }
    print_tables(a->mode, stdout);
    return CLI_EXIT_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* zero                                                                                      */

static int cmd_zero(args *a)
{
    double psi = a->zero_params > 0 ? a->zero_params
                 : a->have_model    ? dl_plan_model_params(&a->model)
                                    : 7.5e9;
    double K = a->o.optim_bytes; /* --K, default 12 */
    int nd = a->zero_nd > 0 ? a->zero_nd : 64;
    dl_plan_zero_row r[4];
    if (dl_plan_zero_table(psi, K, nd, NULL, r) != DL_OK)
        return fail_lib();
    char title[200];
    snprintf(title, sizeof title,
             "ZeRO-DP per GPU (Psi = %.4g billion, K = %g, N_d = %d; no activations)", psi / 1e9, K,
             nd);
    table *t = tbl_new("zero", title, 6, "stage", "stage", "name", "name", "formula", "memory",
                       "bytes_per_gpu", "per GPU GiB", "comm_factor", "traffic x Psi(N-1)/N",
                       "bytes_sent_per_gpu", "sent per GPU GiB (BF16)");
    for (int k = 0; k < 4; k++) {
        tbl_row(t);
        c_int(r[k].stage);
        c_text("%s", r[k].name);
        c_text("%s", r[k].formula);
        c_bytes(r[k].bytes);
        c_num(r[k].comm_factor, "%g", r[k].comm_factor);
        c_bytes(r[k].comm_factor * 2.0 * psi * (nd - 1) / nd);
    }
    print_tables(a->mode, stdout);
    return CLI_EXIT_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* pipeline                                                                                  */

/* "3,1x10,4" -> costs; returns the count or -1 (message printed). */
static int parse_costs(const char *s, double **out)
{
    int cap = 16, n = 0;
    double *c = malloc((size_t)cap * sizeof *c);
    const char *p = s;
    while (c && *p) {
        char *end;
        double v = strtod(p, &end);
        if (end == p || !isfinite(v) || v < 0 || cli_is_hex(p))
            goto bad;
        long rep = 1;
        p = end;
        if (*p == 'x' || *p == '*') {
            rep = strtol(p + 1, &end, 10);
            if (end == p + 1 || rep < 1 || rep > 100000)
                goto bad;
            p = end;
        }
        if (*p == ',' && p[1] != '\0')
            p++; /* "1,2," and "1,,2": an empty element */
        else if (*p != '\0')
            goto bad;
        for (long k = 0; k < rep; k++) {
            if (n == cap) {
                double *b = realloc(c, (size_t)(cap *= 2) * sizeof *c);
                if (!b) {
                    free(c);
                    c = NULL;
                    break;
                }
                c = b;
            }
            if (c)
                c[n++] = v;
        }
    }
    if (c == NULL || n == 0)
        goto bad;
    *out = c;
    return n;
bad:
    free(c);
    cli_error("pipeline: --costs '%s' is not a list of non-negative numbers (e.g. 3,1x10,4)", s);
    return -1;
}

static int cmd_pipeline(args *a)
{
    int p = a->l.p, v = a->l.v;
    long m = a->m;
    if (m == 0) {
        if (a->gbatch_given) {
            if (a->l.global_batch % ((long)a->l.d * a->l.micro_batch) != 0) {
                cli_error("pipeline: global batch %ld is not a multiple of d x micro-batch = %d x "
                          "%d",
                          a->l.global_batch, a->l.d, a->l.micro_batch);
                return CLI_EXIT_USAGE;
            }
            m = a->l.global_batch / ((long)a->l.d * a->l.micro_batch);
        } else {
            m = 8;
        }
    }
    long me = m * (a->slices > 0 ? a->slices : 1);
    double target = a->target > 0 ? a->target : 0.10;
    double bub = dl_plan_bubble(p, me, v);
    long need = dl_plan_min_microbatches(p, v, target);

    char title[200];
    snprintf(title, sizeof title, "Bubble: p = %d stages, m = %ld micro-batches%s, v = %d", p, m,
             a->slices > 1 ? " (x token slices)" : "", v);
    table *t = tbl_new("bubble", title, 5, "p", "p", "m", "m", "v", "v", "bubble",
                       "bubble (p-1)/(vm+p-1)", "min_m_for_target", "");
    static char lab[64];
    snprintf(lab, sizeof lab, "m for bubble < %g%%", 100 * target);
    t->label[4] = lab;
    tbl_row(t);
    c_int(p);
    c_int(me);
    c_int(v);
    c_num(bub, "%.1f%% (%d/%ld)", 100 * bub, p - 1, v * me + p - 1);
    c_int(need);

    snprintf(title, sizeof title,
             "Micro-batches whose activations each stage holds; weight updates "
             "between a micro-batch's forward and backward without flushes (bubble < %g%% needs m "
             ">= %ld)",
             100 * target, need);
    t = tbl_new("stages", title, 4, "stage", "stage", "gpipe", "GPipe", "one_f_one_b", "1F1B",
                "weight_versions", "PipeDream versions");
    for (int s = 1; s <= p && s <= 1024; s++) {
        tbl_row(t);
        c_int(s);
        c_int(dl_plan_inflight(DL_PLAN_GPIPE, p, me, s));
        c_int(dl_plan_inflight(DL_PLAN_1F1B, p, me, s));
        c_int(dl_plan_staleness(p, s));
    }

    if (a->costs) {
        double *costs = NULL;
        int n = parse_costs(a->costs, &costs);
        if (n < 0)
            return CLI_EXIT_USAGE;
        if (p > n) {
            cli_error("pipeline: %d stages for %d layers (need p <= layers)", p, n);
            free(costs);
            return CLI_EXIT_USAGE;
        }
        int *fb = malloc((size_t)(p + 1) * sizeof *fb), *fe = malloc((size_t)(p + 1) * sizeof *fe);
        double mb = 0, me_ = 0;
        if (!fb || !fe || dl_plan_partition(costs, n, p, fb, &mb) != DL_OK ||
            dl_plan_partition_even(costs, n, p, fe, &me_) != DL_OK) {
            free(fb);
            free(fe);
            free(costs);
            return fail_lib();
        }
        snprintf(title, sizeof title,
                 "Layer partition of %d layers into %d stages: balanced (slowest %g) vs even "
                 "(slowest %g)",
                 n, p, mb, me_);
        t = tbl_new("partition", title, 5, "stage", "stage", "balanced_layers", "balanced layers",
                    "balanced_cost", "cost", "even_layers", "even layers", "even_cost", "cost");
        for (int j = 0; j < p; j++) {
            double cb = 0, ce = 0;
            for (int i = fb[j]; i < fb[j + 1]; i++) cb += costs[i];
            for (int i = fe[j]; i < fe[j + 1]; i++) ce += costs[i];
            tbl_row(t);
            c_int(j + 1);
            c_text("%d-%d", fb[j], fb[j + 1] - 1);
            c_num(cb, "%g", cb);
            c_text("%d-%d", fe[j], fe[j + 1] - 1);
            c_num(ce, "%g", ce);
        }
        free(fb);
        free(fe);
        free(costs);
    }
    print_tables(a->mode, stdout);
    return CLI_EXIT_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* search                                                                                    */

/* A profile from `distlab-plan calibrate` describes this machine's ranks: predict distlab-train
 * (its byte-level GPT, the shape from --layers/--hidden/--heads/--seq or distlab-train's
 * defaults) for every local layout instead of a cluster's 3-D search. */
/* After the table: which rows tie (a tier: within PC_TIE of its first, not ordered by the
 * predictions) and how many of them are oversubscribed (predicted CPU-bound: all stages' work
 * over the cores, the same for every layout of the same total work). */
static void search_local_ties(const pc_local_row *r, int n)
{
    for (int i = 0; i < n;) {
        int j = i, over = 0;
        while (j < n && r[j].tier == r[i].tier) over += r[j++].oversub;
        if (j - i > 1)
            printf("\ntier %d: %d layouts within %.0f%% of each other (%.0f .. %.0f tokens/s): the "
                   "predictions do not order them; %d of them oversubscribed (more ranks than "
                   "cores: predicted as the total work over the cores, contention not modelled "
                   "beyond that); measure them (distlab-plan validate, distlab-train)\n",
                   r[i].tier, j - i, 100 * PC_TIE, r[j - 1].tokens_per_s, r[i].tokens_per_s, over);
        i = j;
    }
}

/* The recommendation: in the first tier, the fastest prediction among the layouts that fit the
 * cores (an oversubscribed one's contention is not modelled), then the least model state. */
static void search_local_recommend(const pc_local_row *r, int n)
{
    int best = -1, fits = 0, size = 0;
    for (int i = 0; i < n && r[i].tier == 1; i++, size++) fits += !r[i].oversub;
    for (int i = 0; i < size; i++) {
        if (fits && r[i].oversub)
            continue;
        if (best < 0 || r[i].tokens_per_s > r[best].tokens_per_s ||
            (r[i].tokens_per_s == r[best].tokens_per_s && r[i].state_bytes < r[best].state_bytes))
            best = i;
    }
    if (best < 0)
        return;
    const pc_local_row *x = &r[best];
    printf("\nrecommended: dp %d x tp %d x pp %d, ZeRO %d%s: %.0f tokens/s predicted, %.2f MiB of "
           "model state per rank (distlab-train --dp %d --tp %d --pp %d",
           x->dp, x->tp, x->pp, x->zero, x->pp > 1 ? ", 1F1B" : "", x->tokens_per_s,
           x->state_bytes / 1048576.0, x->dp, x->tp, x->pp);
    if (x->zero)
        printf(" --zero %d", x->zero);
    if (x->pp > 1)
        printf(" --schedule 1f1b --microbatches %d", x->m);
    printf(")\n  why: the fastest prediction of tier 1 %s", fits ? "that fits the cores" : "");
    if (fits && fits < size)
        printf(" (%d of the tier's %d are oversubscribed: their contention is not modelled)",
               size - fits, size);
    else if (!fits)
        printf("(every layout of it is oversubscribed: contention not modelled)");
    if (size > 1)
        printf("; the tier's %d layouts are within %.0f%%, so confirm by measuring (distlab-plan "
               "validate)",
               size, 100 * PC_TIE);
    printf("\n");
}

static int cmd_search_local(args *a)
{
    dl_gpt_config c;
    dl_gpt_config_default(&c);
    c.layers = 4, c.d_model = 128, c.heads = 4, c.seq = 64; /* distlab-train's defaults */
    if (a->have_model) {
        if (a->model.layers <= 0 || a->model.hidden <= 0) {
            cli_error(
                "search: a calibrated profile predicts distlab-train's byte-level GPT; give "
                "its shape with --layers, --hidden, --heads, --seq (not a bare parameter count)");
            return CLI_EXIT_USAGE;
        }
        c.layers = a->model.layers, c.d_model = a->model.hidden;
        c.heads = a->model.heads, c.seq = a->model.seq > 0 ? a->model.seq : c.seq;
        if (dl_gpt_config_check(&c, 1) != DL_OK)
            return fail_lib();
    }
    int ranks = a->gpus > 0 ? a->gpus : (a->hw.ranks > 0 ? a->hw.ranks : 2);
    int mb = a->l.micro_batch > 1 ? a->l.micro_batch : 8;
    int cap = 4096, n = 0;
    pc_local_row *r = malloc((size_t)cap * sizeof *r);
    if (!r) {
        cli_error("out of memory");
        return CLI_EXIT_FAIL;
    }
    if (pc_local_search(&a->hw, &c, mb, ranks, r, cap, &n) != DL_OK) {
        free(r);
        return fail_lib();
    }
    char title[300];
    snprintf(title, sizeof title,
             "distlab-train on this machine (%s): %d layouts on 1..%d ranks, L %d C %d H %d T %d, "
             "micro-batch %d; sorted by predicted tokens/s; tier: the layouts within %.0f%% of the "
             "tier's fastest",
             a->hw.name, n, ranks, c.layers, c.d_model, c.heads, c.seq, mb, 100 * PC_TIE);
    table *t =
        tbl_new("search_local", title, 11, "tier", "tier", "dp", "dp", "tp", "tp", "pp", "pp",
                "zero", "ZeRO", "m", "m", "ranks", "ranks", "oversubscribed", "oversub", "step_ms",
                "step ms", "tokens_per_s", "tokens/s", "state_mib", "states MiB/rank");
    for (int i = 0; i < n; i++) {
        const pc_local_row *x = &r[i];
        tbl_row(t);
        c_int(x->tier);
        c_int(x->dp);
        c_int(x->tp);
        c_int(x->pp);
        c_int(x->zero);
        c_int(x->m);
        c_int(x->ranks);
        c_bool(x->oversub);
        c_num(x->pred_ms, "%.2f", x->pred_ms);
        c_num(x->tokens_per_s, "%.0f", x->tokens_per_s);
        c_num(x->state_bytes / 1048576.0, "%.3f", x->state_bytes / 1048576.0);
    }
    if (a->mode == OUT_HUMAN)
        printf("predicted from the calibrated profile as `distlab-plan validate` does (pipelines: "
               "1F1B, "
               "m = 2p; states: params + grads + AdamW per rank, the largest stage); check a "
               "layout with `distlab-train` or all with `distlab-plan validate`\n\n");
    print_tables(a->mode, stdout);
    if (a->mode == OUT_HUMAN) {
        search_local_ties(r, n);
        search_local_recommend(r, n);
    }
    free(r);
    return CLI_EXIT_OK;
}

static int cmd_search(args *a)
{
    if (a->hw.nongemm_ratio > 0 || a->hw.flops_alone > 0)
        return cmd_search_local(a);
    if (!a->have_model)
        dl_plan_model_preset("gpt3-175b", &a->model);
    int gpus = a->gpus > 0 ? a->gpus : 1024;
    if (!a->gbatch_given)
        a->l.global_batch = 1536;
    int cap = 4096, n = 0;
    dl_plan_step *r = malloc((size_t)cap * sizeof *r);
    if (r == NULL) {
        cli_error("out of memory");
        return CLI_EXIT_FAIL;
    }
    if (dl_plan_search(&a->model, &a->hw, &a->o, gpus, &a->l, r, cap, &n) != DL_OK) {
        free(r);
        return fail_lib();
    }
    int fit = 0;
    for (int i = 0; i < n && i < cap; i++) fit += r[i].mem.fits;
    int s = a->l.seq > 0 ? a->l.seq : a->model.seq;
    char title[300];
    snprintf(title, sizeof title,
             "%d combinations, %d fit in %.4g GB; %d GPUs (%d per node), %ld sequences of %d "
             "tokens, "
             "micro-batch %d, ZeRO-%d; sorted by step time",
             n, fit, (a->o.mem_limit > 0 ? a->o.mem_limit : a->hw.mem_bytes) / 1e9, gpus,
             a->hw.gpus_per_node, a->l.global_batch, s, a->l.micro_batch, a->o.zero_stage);
    int moe = a->model.experts > 0; /* an ep column and its all-to-all time */
    table *t =
        moe ? tbl_new("search", title, 14, "t", "t", "p", "p", "d", "d", "ep", "ep", "m", "m",
                      "mem_gb", "GiB/GPU", "fits", "fits", "bubble", "bubble", "step_s", "step s",
                      "compute_s", "compute s", "tp_s", "TP s", "pp_s", "PP s", "dp_s", "DP s",
                      "ep_s", "EP s")
            : tbl_new("search", title, 12, "t", "t", "p", "p", "d", "d", "m", "m", "mem_gb",
                      "GiB/GPU", "fits", "fits", "bubble", "bubble", "step_s", "step s",
                      "compute_s", "compute s", "tp_s", "TP s", "pp_s", "PP s", "dp_s", "DP s");
    for (int i = 0; i < n && i < cap; i++) {
        const dl_plan_step *x = &r[i];
        tbl_row(t);
        c_int(x->layout.t);
        c_int(x->layout.p);
        c_int(x->layout.d);
        if (moe)
            c_int(x->layout.e);
        c_int(x->micro_batches);
        c_num(x->mem.total / 1e9, "%.1f", cli_gib(x->mem.total)); /* --csv: GB as mem_gb says */
        c_bool(x->mem.fits);
        c_num(x->bubble, "%.1f%%", 100 * x->bubble);
        c_num(x->total, "%.2f", x->total);
        c_num(x->compute, "%.2f", x->compute);
        c_num(x->tp, "%.2f", x->tp);
        c_num(x->pp, "%.2f", x->pp);
        c_num(x->dp, "%.2f", x->dp);
        if (moe)
            c_num(x->ep, "%.2f", x->ep);
    }
    if (a->mode == OUT_HUMAN) {
        char d[512];
        describe_model(&a->model, d, sizeof d);
        printf("model %s\n", d);
        describe_hw(&a->hw, a->o.mfu);
        printf("step = compute / (1 - bubble) + TP (%s) + PP (%s) + DP (%s)%s, no overlap, no "
               "latency "
               "unless the hardware gives one\n\n",
               a->o.tp_link == DL_PLAN_LINK_INTER  ? "ib"
               : a->o.tp_link == DL_PLAN_LINK_AUTO ? "auto"
                                                   : "nvlink",
               a->o.pp_link == DL_PLAN_LINK_INTRA  ? "nvlink"
               : a->o.pp_link == DL_PLAN_LINK_AUTO ? "auto"
                                                   : "ib",
               a->o.dp_link == DL_PLAN_LINK_INTRA  ? "nvlink"
               : a->o.dp_link == DL_PLAN_LINK_AUTO ? "auto"
                                                   : "ib",
               moe ? " + EP all-to-alls (4 per MoE layer per micro-batch)" : "");
    }
    print_tables(a->mode, stdout);
    free(r);
    return CLI_EXIT_OK;
}

/* ---------------------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
    cli_progname = "distlab-plan";
    cli_ignore_sigxfsz();
    if (argc < 2) {
        cli_error("missing subcommand (memory, comm, zero, pipeline, search, calibrate, validate; "
                  "see --help)");
        return CLI_EXIT_USAGE;
    }
    const char *sub = argv[1];
    if (strcmp(sub, "-h") == 0 || strcmp(sub, "--help") == 0 || strcmp(sub, "help") == 0) {
        if (strcmp(sub, "help") == 0 && argc > 2) {
            const char *s2 = argv[2];
            if (!strcmp(s2, "memory") || !strcmp(s2, "comm") || !strcmp(s2, "zero") ||
                !strcmp(s2, "pipeline") || !strcmp(s2, "search")) {
                usage_sub(s2, stdout);
                return CLI_EXIT_OK;
            }
            if (!strcmp(s2, "calibrate") || !strcmp(s2, "validate")) {
                char *hv[] = {(char *)s2, (char *)"--help", NULL};
                return s2[0] == 'c' ? plan_calibrate_main(2, hv) : plan_validate_main(2, hv);
            }
            cli_error("unknown subcommand '%s' (see --help)", s2);
            return CLI_EXIT_USAGE;
        }
        usage_main(stdout);
        return CLI_EXIT_OK;
    }
    if (strcmp(sub, "-V") == 0 || strcmp(sub, "--version") == 0) {
        cli_print_version(stdout);
        return CLI_EXIT_OK;
    }
    if (strcmp(sub, "calibrate") == 0 || strcmp(sub, "validate") == 0) {
        cli_blas_setup(argv); /* one OpenBLAS thread per rank, the CPU's kernel (may re-exec) */
        return sub[0] == 'c' ? plan_calibrate_main(argc - 1, argv + 1)
                             : plan_validate_main(argc - 1, argv + 1);
    }
    int (*fn)(args *) = NULL;
    if (strcmp(sub, "memory") == 0)
        fn = cmd_memory;
    else if (strcmp(sub, "comm") == 0)
        fn = cmd_comm;
    else if (strcmp(sub, "zero") == 0)
        fn = cmd_zero;
    else if (strcmp(sub, "pipeline") == 0)
        fn = cmd_pipeline;
    else if (strcmp(sub, "search") == 0)
        fn = cmd_search;
    if (fn == NULL) {
        cli_error("unknown subcommand '%s' (subcommands: memory, comm, zero, pipeline, search, "
                  "calibrate, validate; see --help)",
                  sub);
        return CLI_EXIT_USAGE;
    }
    args a;
    memset(&a, 0, sizeof a);
    a.sub = sub;
    dl_plan_opts_init(&a.o);
    dl_plan_model_preset("gpt3-175b", &a.model);
    dl_plan_hw_preset("h100", &a.hw);
    a.l.t = a.l.p = a.l.d = a.l.v = a.l.micro_batch = 1;
    a.l.global_batch = 1;
    if (strcmp(sub, "pipeline") == 0)
        a.l.p = 4;
    if (parse_args(&a, argc - 1, argv + 1) != 0)
        return CLI_EXIT_USAGE;
    return fn(&a);
}
