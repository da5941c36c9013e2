/* distlab-lecture: lecture 17 (distributed training) reproduced with the library.
 *
 * Each section prints the lecture's quantities as computed or measured here, each labelled with
 * the lecture's section; --check marks every figure the lecture states MATCH or DIFF (round-off
 * figures against a stated bound) and exits 1 on any DIFF. Nothing is re-implemented: the
 * accounting comes from the planner (lib/plan/plan.c), the schedules from lib/parallel/sched.c, the real runs
 * (section 02, apps/lecture/lecture_par.c; section 03's pipeline, apps/lecture/lecture_pipe.c; section 04,
 * apps/lecture/lecture_zero.c and apps/lecture/lecture_mlp.c; section 06, apps/lecture/lecture_moe.c) from the runtime, the pipeline engine, the arenas, the
 * collectives and the kernels. */
#define _GNU_SOURCE
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "distlab.h"
#include "model/ops.h"
#include "parallel/sched_priv.h"
#include "cli.h"
#include "lecture.h"
#include "core/json.h"

/* ---------------------------------------------------------------------------------------- */
/* Output                                                                                    */

static int opt_check, opt_json;
static const char *cur_section = "";
static int n_figs, n_checked, n_match, n_diff, n_failed;

void lec_text(const char *fmt, ...)
{
    if (opt_json)
        return;
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
}

/* The lecture's JSON writes a newline as \n (control characters are \u00XX otherwise). */
static void json_str(const char *s) { dl__json_fputs(stdout, s, DL__JSON_CTRL_NL); }

/* pad a UTF-8 string with spaces to `cols` display columns */
static void put_padded(const char *s, int cols)
{
    fputs(s, stdout);
    for (int w = dl_sched_display_width(s); w < cols; w++) putchar(' ');
}

void lec_fig(const char *ref, const char *id, const char *label, double value, const char *shown,
             const char *lecture, int status)
{
    if (lecture == NULL || lecture[0] == '\0')
        status = LEC_INFO;
    n_figs++;
    if (status != LEC_INFO) {
        n_checked++;
        if (status == LEC_MATCH)
            n_match++;
        else
            n_diff++;
    }
    const char *mark = status == LEC_MATCH ? "MATCH" : status == LEC_DIFF ? "DIFF" : NULL;
    if (opt_json) {
        printf("{\"type\":\"figure\",\"schema\":\"distlab/"
               "1\",\"app\":\"distlab-lecture\",\"section\":");
        json_str(cur_section);
        printf(",\"ref\":");
        json_str(ref);
        printf(",\"id\":");
        json_str(id);
        printf(",\"label\":");
        json_str(label);
        if (isfinite(value))
            printf(",\"value\":%.10g", value);
        else
            printf(",\"value\":null");
        printf(",\"shown\":");
        json_str(shown);
        printf(",\"lecture\":");
        if (lecture && lecture[0])
            json_str(lecture);
        else
            printf("null");
        printf(",\"check\":");
        if (mark)
            json_str(mark);
        else
            printf("null");
        printf("}\n");
        return;
    }
    if (opt_check)
        printf("%-6s", mark ? mark : "");
    printf("  ");
    put_padded(ref, 7);
    put_padded(label, 66);
    printf(" ");
    put_padded(shown, 26);
    if (lecture && lecture[0])
        printf("  lecture: %s", lecture);
    putchar('\n');
}

int lec_near(double v, double want, double tol)
{
    return fabs(v - want) <= tol ? LEC_MATCH : LEC_DIFF;
}

int lec_le(double v, double bound) { return v <= bound ? LEC_MATCH : LEC_DIFF; }

int lec_fail(const char *what)
{
    n_failed++;
    cli_error("%s: %s", what, dl_errmsg());
    return -1;
}

static void section_header(const char *name, const char *title)
{
    cur_section = name;
    lec_text("\n== %s: %s ==\n", name, title);
}

/* ---------------------------------------------------------------------------------------- */
/* 01: memory and communication accounting (§1, code 01)                                     */

static int presets(dl_plan_model *m, const char *mname, dl_plan_hw *hw, const char *hname)
{
    if (m && dl_plan_model_preset(mname, m) != DL_OK)
        return lec_fail("planner model preset");
    if (hw && dl_plan_hw_preset(hname, hw) != DL_OK)
        return lec_fail("planner hardware preset");
    return 0;
}

static int lecture_01(void)
{
    section_header("01",
                   "§1 why distribute: memory and communication accounting (code 01; the planner, "
                   "lib/plan/plan.c)");
    char shown[160], label[160];
    dl_plan_opts o;
    dl_plan_opts_init(&o);

    /* §1.1 the hardware (dense BF16 is half the slides' sparse figures) */
    static const char *const hwn[3] = {"a100", "h100", "b200"};
    static const double dense[3] = {312, 989, 2250};
    for (int i = 0; i < 3; i++) {
        dl_plan_hw hw;
        if (presets(NULL, NULL, &hw, hwn[i]))
            return -1;
        snprintf(label, sizeof label, "%s dense BF16", hw.name);
        snprintf(shown, sizeof shown, "%.0f TFLOP/s", hw.flops / 1e12);
        char lec[32], id[32];
        snprintf(lec, sizeof lec, "%s%.0f TFLOP/s", i == 2 ? "about " : "", dense[i]);
        snprintf(id, sizeof id, "%s_tflops", hwn[i]);
        lec_fig("§1.1", id, label, hw.flops, shown, lec, lec_near(hw.flops / 1e12, dense[i], 0.5));
    }
    dl_plan_hw hw;
    if (presets(NULL, NULL, &hw, "b200"))
        return -1;
    snprintf(shown, sizeof shown, "%.0f GB", hw.mem_bytes / 1e9);
    lec_fig("§1.2", "b200_mem", "B200 memory per GPU", hw.mem_bytes, shown, "192 GB",
            lec_near(hw.mem_bytes / 1e9, 192, 0.5));
    if (presets(NULL, NULL, &hw, "h100"))
        return -1;
    snprintf(shown, sizeof shown, "%.2f TB/s", hw.hbm_bw / 1e12);
    lec_fig("§1.1", "h100_hbm", "H100 SXM memory bandwidth (code 01)", hw.hbm_bw, shown,
            "3.35 TB/s", lec_near(hw.hbm_bw / 1e12, 3.35, 0.005));
    double opb = dl_plan_ops_per_byte(&hw);
    snprintf(shown, sizeof shown, "%.0f (both directions, 2 x 450)", opb);
    lec_fig("§1.1", "ops_per_byte", "H100 BF16 ops per NVLink byte: 989 TFLOP/s / 900 GB/s", opb,
            shown, "about 1100", lec_near(opb, 1100, 50));

    /* §1.2 memory */
    double bpp = dl_plan_bytes_per_param(&o);
    snprintf(shown, sizeof shown, "%.0f B = %.0f + %.0f + %.0f", bpp, o.weight_bytes, o.grad_bytes,
             o.optim_bytes);
    lec_fig("§1.2", "bytes_per_param", "bytes per parameter, mixed-precision Adam (w + g + K)", bpp,
            shown, "16 = 2 + 2 + 12", lec_near(bpp, 16, 0));
    dl_plan_model m;
    if (presets(&m, "maverick-400b", &hw, "b200"))
        return -1;
    dl_plan_layout one =
        {.t = 1, .p = 1, .d = 1, .v = 1, .micro_batch = 1, .global_batch = 1, .seq = 0};
    dl_plan_mem mem;
    if (dl_plan_memory(&m, &hw, &o, &one, &mem))
        return lec_fail("planner memory (Maverick)");
    snprintf(shown, sizeof shown, "%.0f GB (fits in 192 GB: %s)", mem.weights / 1e9,
             mem.weights <= hw.mem_bytes ? "yes" : "no");
    lec_fig("§1.2", "maverick_weights", "Maverick 400B, BF16 weights alone", mem.weights, shown,
            "800 GB, does not fit 192 GB",
            lec_near(mem.weights / 1e9, 800, 0.5) == LEC_MATCH && mem.weights > hw.mem_bytes
                ? LEC_MATCH
                : LEC_DIFF);
    if (presets(&m, "gpt3-175b", &hw, "h100"))
        return -1;
    double layer = dl_plan_act_layer_bytes(&m, &o, 2048, 1, 1, 0);
    snprintf(shown, sizeof shown, "%.2f GB", layer / 1e9);
    lec_fig("§1.2", "gpt3_act_layer",
            "GPT-3 activations per layer, s = 2048, b = 1 (sbh(34 + 5as/h))", layer, shown,
            "2.87 GB", lec_near(layer / 1e9, 2.87, 0.005));
    snprintf(shown, sizeof shown, "%.0f GB", layer * m.layers / 1e9);
    lec_fig("§1.2", "gpt3_act_model", "GPT-3 activations, 96 layers, no recomputation",
            layer * m.layers, shown, "275 GB", lec_near(layer * m.layers / 1e9, 275, 0.5));
    double rec = dl_plan_act_layer_bytes(&m, &o, 2048, 1, 1, 1);
    snprintf(shown, sizeof shown, "%.1f MB", rec / 1e6);
    lec_fig("§1.2", "gpt3_act_layer_recompute", "same, full recomputation (only the layer input)",
            rec, shown, "", LEC_INFO);

    /* §1.3 communication: 7.5B on 64 H100, 16,384 tokens per GPU */
    if (presets(&m, "dense-7.5b", &hw, "h100"))
        return -1;
    dl_plan_layout l =
        {.t = 1, .p = 1, .d = 64, .v = 1, .micro_batch = 1, .global_batch = 512, .seq = 2048};
    dl_plan_comm_report c;
    if (dl_plan_comm(&m, &hw, &o, &l, &c))
        return lec_fail("planner communication (7.5B)");
    lec_text("  §1.3 the 7.5B model on 64 H100 (data parallelism), %d sequences of %d tokens per "
             "step:\n",
             (int)l.global_batch, l.seq);
    snprintf(shown, sizeof shown, "%ld", c.tokens / 64);
    lec_fig("§1.3", "dp_tokens_per_gpu", "tokens per GPU per step", (double)(c.tokens / 64), shown,
            "16,384", lec_near((double)(c.tokens / 64), 16384, 0));
    snprintf(shown, sizeof shown, "%.3f s", c.compute);
    lec_fig("§1.3", "dp_compute", "compute per step (6 FLOPs/param/token, 40% MFU)", c.compute,
            shown, "1.86 s", lec_near(c.compute, 1.86, 0.005));
    snprintf(shown, sizeof shown, "%.1f GB", c.dp_grad_bytes / 1e9);
    lec_fig("§1.3", "dp_grad_bytes", "BF16 gradients", c.dp_grad_bytes, shown, "15 GB",
            lec_near(c.dp_grad_bytes / 1e9, 15, 0.05));
    snprintf(shown, sizeof shown, "%.4f s", c.dp_time_intra);
    lec_fig("§1.3", "dp_ar_nvlink", "ring all-reduce on NVLink (450 GB/s)", c.dp_time_intra, shown,
            "0.07 s", lec_near(c.dp_time_intra, 0.07, 0.005));
    snprintf(shown, sizeof shown, "%.1f%%", 100 * c.dp_time_intra / c.compute);
    lec_fig("§1.3", "dp_ar_nvlink_pct", "  as a share of compute", c.dp_time_intra / c.compute,
            shown, "4%", lec_near(100 * c.dp_time_intra / c.compute, 4, 0.5));
    snprintf(shown, sizeof shown, "%.4f s", c.dp_time_inter);
    lec_fig("§1.3", "dp_ar_ib", "ring all-reduce across nodes (InfiniBand 50 GB/s)",
            c.dp_time_inter, shown, "0.59 s", lec_near(c.dp_time_inter, 0.59, 0.005));
    snprintf(shown, sizeof shown, "%.1f%%", 100 * c.dp_time_inter / c.compute);
    lec_fig("§1.3", "dp_ar_ib_pct", "  as a share of compute", c.dp_time_inter / c.compute, shown,
            "32%", lec_near(100 * c.dp_time_inter / c.compute, 32, 0.5));
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* 03: pipeline parallelism (§4, §6.2, code 03)                                              */

/* The lecture's §4.1 grids, byte for byte, under its captions in English (the numbers are the
 * lecture's): the naive and GPipe blocks side by side at display column 42, then the 1F1B block. */
static const char LECTURE_NAIVE_GPIPE[] =
    "naive (1 micro-batch): bubble 75%         GPipe (4 micro-batches): bubble 42.9%\n"
    "GPU 1  0·········aa                       GPU 1  0123·········aabbccdd\n"
    "GPU 2  ·0······aa··                       GPU 2  ·0123······aabbccdd··\n"
    "GPU 3  ··0···aa····                       GPU 3  ··0123···aabbccdd····\n"
    "GPU 4  ···0aa······                       GPU 4  ···0123aabbccdd······\n";
static const char LECTURE_1F1B[] =
    "1F1B (8 micro-batches): bubble 27.3%, activations held per stage 4 / 3 / 2 / 1\n"
    "GPU 1  0123······aa4bb5cc6dd7ee·ff·gg·hh\n"
    "GPU 2  ·012····aa3bb4cc5dd6ee7ff·gg·hh··\n"
    "GPU 3  ··01··aa2bb3cc4dd5ee6ff7gg·hh····\n"
    "GPU 4  ···0aa1bb2cc3dd4ee5ff6gg7hh······\n";

typedef struct simd {
    dl_sched *s;
    dl_sched_sim *sim;
    char *text;
} simd;

static int simulate(dl_sched *s, int with_act, simd *out, const char *what)
{
    out->s = s;
    out->sim = NULL;
    out->text = NULL;
    if (dl_sched_simulate(s, NULL, &out->sim) != DL_OK)
        return lec_fail(what);
    if (with_act >= 0 && dl_sched_render(s, out->sim, with_act, &out->text) != DL_OK)
        return lec_fail(what);
    return 0;
}

static void simd_free(simd *x)
{
    dl_sched_sim_free(x->sim);
    dl_sched_free(x->s);
    free(x->text);
}

/* Beyond the lecture's approximation (§6.2 treats every token chunk as 1/c of a sequence's
 * work): a later chunk's queries read every earlier key, so with each chunk costing its FLOPs
 * (include/distlab/tera.h; a GPT of width 768 at 2048 tokens, the total work unchanged) the
 * later chunks are slower and the bubble is larger than the lecture's. */
static int terapipe_corrected(const dl_sched *s, int c)
{
    enum { TOK = 2048, WIDTH = 768 };
    int lens[8];
    double scale[16];
    dl_sched_sim *sim = NULL;
    for (int k = 0; k < c; k++) lens[k] = TOK / c;
    if (dl_tera_chunk_scale(2, c, lens, WIDTH, scale) ||
        dl_sched_simulate_scaled(s, NULL, scale, &sim))
        return lec_fail("simulate TeraPipe with each chunk's FLOPs");
    char id[32], shown[64];
    snprintf(id, sizeof id, "terapipe_c%d_flops", c);
    snprintf(shown, sizeof shown, "%.1f%% (last chunk %.2fx the first)", 100 * sim->bubble_total,
             scale[c - 1] / scale[0]);
    lec_fig("§6.2", id, "  each chunk costing its FLOPs (width 768, 2048 tokens)",
            sim->bubble_total, shown, "", LEC_INFO);
    /* measured: the engine on 4 rank threads, each chunk sleeping its FLOPs' share */
    double meas;
    int rc = lecture_03_tera_measure(s, scale, &meas);
    if (rc == DL_OK) {
        snprintf(id, sizeof id, "terapipe_c%d_measured", c);
        snprintf(shown, sizeof shown, "%.1f%% (simulated %.1f%%)", 100 * meas,
                 100 * sim->bubble_total);
        lec_fig("§6.2", id, "  measured: the engine, sleep work at those costs", meas, shown, "",
                LEC_INFO);
    }
    dl_sched_sim_free(sim);
    return rc ? lec_fail("run TeraPipe with sleep work") : 0;
}

static void list_ints(char *buf, size_t cap, const int *v, int n, const char *sep)
{
    size_t k = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%d", i ? sep : "", v[i]);
}

/* Beyond the lecture: the zero-bubble schedules (Qi et al. 2024) on the same grid, the backward
 * split into its input gradient I (a letter, on the critical path) and weight gradient W (the
 * capital, free to move), F = I = W = 1 unit (the lecture's backward of 2), with each paper's
 * bubble formula beside the simulated one. */
static int zero_bubble_grids(void)
{
    static const struct {
        int (*make)(int p, int m, dl_sched **out);
        const char *id, *formula;
        double paper; /* the formula's bubble time, in units, at p 4, F = B = W = 1 */
        int bound;    /* the formula is an upper bound, not the schedule's bubble */
    } zb[] = {{dl_sched_1f1b_split, "bubble_1f1b_split", "(p-1)(F+B)", 6, 0},
              {dl_sched_zb_h1, "bubble_zb_h1", "(p-1)(F+B-W)", 3, 0},
              {dl_sched_zb_h2, "bubble_zb_h2", "(p-1)(F+B-2W)", 0, 0},
              {dl_sched_zb_v, "bubble_zb_v", "(p-1)(F+B-2W)", 0, 0},
              /* DeepSeek-V3's (PP/2-1)(F&B+B-3W) with the overlapped F&B pair run one after
               * the other here: a bound the Ws beat */
              {dl_sched_dualpipev, "bubble_dualpipev", "(p-1)(F+2B-W), a bound", 6, 1}};
    lec_text("  beyond the lecture, the backward split into input gradient I (letter) and weight "
             "gradient W (capital), F = I = W = 1 (Zero Bubble, Qi et al. 2024; ZB-V: two chunks "
             "a stage in a V, each half a stage, chunk actions 1 unit; DualPipeV, DeepSeek-V3's "
             "V: micro-batches fed from both ends of the V, m >= 2p):\n\n");
    for (size_t i = 0; i < sizeof zb / sizeof zb[0]; i++) {
        dl_sched *s;
        simd x;
        if (zb[i].make(4, 8, &s) || simulate(s, 1, &x, zb[i].id))
            return lec_fail(zb[i].id);
        lec_text("%s\n", x.text);
        char shown[96], lec[96], label[96];
        double bub = 100 * x.sim->bubble_total, work = 3.0 * 8 * s->v;
        double paper = 100 * zb[i].paper / (work + zb[i].paper);
        snprintf(label, sizeof label, "%s (m = 8), simulated", dl_sched_kind_name(s->kind));
        snprintf(shown, sizeof shown, "%.1f%%", bub);
        snprintf(lec, sizeof lec, "paper %s: %.1f%%", zb[i].formula, paper);
        /* ZB-H2 and ZB-V reach 0 only across steps (no flush): within one the last stage
         * still waits (p-1) F for its first forward */
        lec_fig("ZB", zb[i].id, label, bub / 100, shown, lec,
                zb[i].paper > 0 && !zb[i].bound ? lec_near(bub, paper, 0.05) : LEC_INFO);
        simd_free(&x);
    }
    return 0;
}

static int lecture_03(void)
{
    section_header("03", "§4 pipeline parallelism (code 03; schedules and simulator: "
                         "lib/parallel/sched.c, engine: lib/parallel/pipe.c)");
    char shown[160], label[160], lec[64];
    dl_sched *a, *b, *c;
    if (dl_sched_naive(4, &a) || dl_sched_gpipe(4, 4, &b) || dl_sched_1f1b(4, 8, &c))
        return lec_fail("schedule generators");
    simd na, gp, fb;
    int rc = simulate(a, 0, &na, "simulate naive");
    rc = rc ? rc : simulate(b, 0, &gp, "simulate GPipe");
    rc = rc ? rc : simulate(c, 1, &fb, "simulate 1F1B");
    if (rc)
        return -1;
    char *both = NULL;
    if (dl_sched_side_by_side(na.text, gp.text, 42, &both))
        return lec_fail("side by side");
    lec_text("  code 03 part 1 (4 stages, forward 1 unit, backward 2; digit = forward, letter = "
             "backward,"
             " · = idle):\n\n%s\n%s\n",
             both, fb.text);
    int same = strcmp(both, LECTURE_NAIVE_GPIPE) == 0;
    lec_fig("§4.1", "grid_naive_gpipe", "naive and GPipe grids with captions, as printed above",
            NAN, same ? "byte-identical" : "differ", "the grids in §4.1",
            same ? LEC_MATCH : LEC_DIFF);
    same = strcmp(fb.text, LECTURE_1F1B) == 0;
    lec_fig("§4.1", "grid_1f1b", "1F1B grid with caption, as printed above", NAN,
            same ? "byte-identical" : "differ", "the grid in §4.1", same ? LEC_MATCH : LEC_DIFF);
    free(both);
    const simd *all[3] = {&na, &gp, &fb};
    static const char *const names[3] = {"naive (m = 1)", "GPipe (m = 4)", "1F1B (m = 8)"};
    static const char *const ids[3] = {"bubble_naive", "bubble_gpipe", "bubble_1f1b"};
    static const double want[3] = {75.0, 42.9, 27.3};
    for (int i = 0; i < 3; i++) {
        double bub = 100 * all[i]->sim->bubble_total;
        snprintf(label, sizeof label, "bubble, %s, simulated", names[i]);
        snprintf(shown, sizeof shown, "%.1f%% (formula %.1f%%)", bub,
                 100 * dl_sched_bubble_formula(all[i]->s));
        snprintf(lec, sizeof lec, "%g%%", want[i]);
        lec_fig("§4.1", ids[i], label, bub / 100, shown, lec, lec_near(bub, want[i], 0.05));
    }
    list_ints(shown, sizeof shown, fb.sim->peak_act, 4, " / ");
    lec_fig("§4.2", "act_1f1b", "1F1B: activations each stage holds at its peak", NAN, shown,
            "4 / 3 / 2 / 1", strcmp(shown, "4 / 3 / 2 / 1") == 0 ? LEC_MATCH : LEC_DIFF);
    list_ints(shown, sizeof shown, gp.sim->peak_act, 4, " / ");
    lec_fig("§4.2", "act_gpipe", "GPipe (m = 4): activations each stage holds at its peak", NAN,
            shown, "m each (4 / 4 / 4 / 4)",
            strcmp(shown, "4 / 4 / 4 / 4") == 0 ? LEC_MATCH : LEC_DIFF);
    simd_free(&na);
    simd_free(&gp);
    simd_free(&fb);
    if (zero_bubble_grids())
        return -1;

    /* code 03 part 2: the 8-layer MLP through the pipeline engine (apps/lecture/lecture_pipe.c) */
    if (lecture_03_pipe())
        return -1;

    /* §4.3 weight versions in asynchronous 1F1B (PipeDream), without and with stashing */
    for (int stash = 0; stash <= 1; stash++) {
        dl_sched *s;
        dl_sched_versions *v;
        if (dl_sched_async(4, 8, stash, &s))
            return lec_fail("async schedule");
        if (dl_sched_versions_get(s, &v)) {
            dl_sched_free(s);
            return lec_fail("weight versions");
        }
        int mism = 0;
        for (int i = 0; i < 4 * 8; i++) mism += v->bwd[i] != v->fwd[i];
        if (!stash) {
            list_ints(shown, sizeof shown, v->max_gap, 4, " / ");
            lec_fig("§4.3", "version_gaps",
                    "async 1F1B: weight updates between a micro-batch's F and B", NAN, shown,
                    "3 / 2 / 1 / 0 (p - s)",
                    strcmp(shown, "3 / 2 / 1 / 0") == 0 ? LEC_MATCH : LEC_DIFF);
            snprintf(shown, sizeof shown, "%d of 32", mism);
            lec_fig("§4.3", "version_mismatch_nostash",
                    "  without stashing: backwards on another version", mism, shown, "", LEC_INFO);
        } else {
            char pv[64];
            list_ints(pv, sizeof pv, v->peak_versions, 4, "/");
            snprintf(shown, sizeof shown, "%d of 32 (versions kept %s)", mism, pv);
            lec_fig("§4.3", "version_mismatch_stash",
                    "  with weight stashing: backwards on another version", mism, shown,
                    "0 (each B uses its F's weights)", lec_near(mism, 0, 0));
        }
        dl_sched_versions_free(v);
        dl_sched_free(s);
    }

    /* §4.3 the asynchronous pipeline never drains between steps: distlab-train's async runs
     * one continuous pipeline, warm-up once (issue 35); against 1F1B flushing every step */
    double run, steady;
    dl_sched *ff;
    dl_sched_sim *fs;
    if (dl_sched_async_continuous(4, 8, 20, NULL, &run, &steady))
        return lec_fail("continuous pipeline");
    if (dl_sched_1f1b(4, 8, &ff) || dl_sched_simulate(ff, NULL, &fs))
        return lec_fail("1F1B schedule");
    snprintf(shown, sizeof shown, "%.1f%% a step, %.1f%% over 20 steps (1F1B with flush %.1f%%)",
             100 * steady, 100 * run, 100 * fs->bubble_total);
    lec_fig("§4.3", "async_continuous_bubble",
            "  no flush (p 4, m 8): after the warm-up every stage stays busy", 100 * steady, shown,
            "no flush: every stage busy after the warm-up", lec_near(steady, 0, 1e-9));
    dl_sched_sim_free(fs);
    dl_sched_free(ff);
    if (lecture_03_async()) /* the same measured on the trainer (apps/lecture/lecture_async.c) */
        return -1;

    /* §4.4 partition: 12 layers, embedding 3, output 4, others 1, 4 stages */
    double costs[12] = {3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 4}, sc[4], mx;
    int first[5];
    for (int bal = 0; bal <= 1; bal++) {
        if (dl_sched_partition(costs, 12, 4, bal, first, sc, &mx))
            return lec_fail("partition");
        int ci[4];
        for (int i = 0; i < 4; i++) ci[i] = (int)sc[i];
        char costs_s[64];
        list_ints(costs_s, sizeof costs_s, ci, 4, " / ");
        if (!bal) {
            snprintf(shown, sizeof shown, "%s, max %.0f", costs_s, mx);
            lec_fig("§4.4", "partition_even",
                    "12 layers (3, 1 x 10, 4) on 4 stages, evenly by count", mx, shown,
                    "5 / 3 / 3 / 6, max 6",
                    strcmp(shown, "5 / 3 / 3 / 6, max 6") == 0 ? LEC_MATCH : LEC_DIFF);
        } else {
            snprintf(shown, sizeof shown, "%d-%d, %d-%d, %d-%d, %d-%d: %s, max %.0f", first[0],
                     first[1] - 1, first[1], first[2] - 1, first[2], first[3] - 1, first[3],
                     first[4] - 1, costs_s, mx);
            const char *w = "0-1, 2-5, 6-9, 10-11: 4 / 4 / 4 / 5, max 5";
            lec_fig("§4.4", "partition_dp", "same, dynamic program (minimise the slowest stage)",
                    mx, shown, "0-1, 2-5, 6-9, 10-11: 4 / 4 / 4 / 5, max 5",
                    strcmp(shown, w) == 0 ? LEC_MATCH : LEC_DIFF);
        }
    }

    /* §6.2 TeraPipe: 2 sequences, 4 stages, c token chunks each */
    static const int cs[4] = {1, 2, 4, 8};
    static const double tw[4] = {60.0, 42.9, 27.3, 15.8};
    for (int i = 0; i < 4; i++) {
        dl_sched *s;
        simd t;
        if (dl_sched_terapipe(4, 2, cs[i], &s))
            return lec_fail("TeraPipe schedule");
        if (simulate(s, -1, &t, "simulate TeraPipe"))
            return -1;
        double bub = 100 * t.sim->bubble_total;
        snprintf(label, sizeof label, "TeraPipe, 2 sequences, 4 stages, %d token chunk%s each",
                 cs[i], cs[i] > 1 ? "s" : "");
        snprintf(shown, sizeof shown, "%.1f%%", bub);
        snprintf(lec, sizeof lec, "%.1f%%", tw[i]);
        char id[32];
        snprintf(id, sizeof id, "terapipe_c%d", cs[i]);
        lec_fig("§6.2", id, label, bub / 100, shown, lec, lec_near(bub, tw[i], 0.05));
        if (terapipe_corrected(t.s, cs[i]))
            return -1;
        simd_free(&t);
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* 05: 3-D parallelism, the search (§6.4, code 05)                                           */

static int search_one(const char *preset, int want_n, int want_fit, int is405)
{
    dl_plan_model m;
    dl_plan_hw hw;
    dl_plan_opts o;
    if (presets(&m, preset, &hw, "h100"))
        return -1;
    dl_plan_opts_init(&o);
    dl_plan_layout base =
        {.t = 1, .p = 1, .d = 1, .v = 1, .micro_batch = 1, .global_batch = 1536, .seq = 2048};
    dl_plan_step r[128];
    int n = 0;
    if (dl_plan_search(&m, &hw, &o, 1024, &base, r, 128, &n))
        return lec_fail("planner search");
    int fit = 0;
    for (int i = 0; i < n && i < 128; i++) fit += r[i].mem.fits;
    lec_text("\n  %s (%.1f billion parameters) on 1024 H100, 8 per node, 1536 x 2048 tokens per "
             "step; "
             "the fastest 6:\n",
             m.name, dl_plan_model_params(&m) / 1e9);
    lec_text("     %3s %3s %4s %10s %5s %8s %9s %9s %8s %8s %8s\n", "t", "p", "d", "GB/GPU", "fits",
             "bubble", "step s", "compute", "TP", "PP", "DP");
    for (int i = 0; i < n && i < 6; i++)
        lec_text("     %3d %3d %4d %10.1f %5s %7.1f%% %9.2f %9.2f %8.2f %8.2f %8.2f\n",
                 r[i].layout.t, r[i].layout.p, r[i].layout.d, r[i].mem.total / 1e9,
                 r[i].mem.fits ? "yes" : "no", 100 * r[i].bubble, r[i].total, r[i].compute, r[i].tp,
                 r[i].pp, r[i].dp);
    char shown[96], lec[64], id[48], label[128];
    const char *tag = is405 ? "405b" : "gpt3";
    const char *nm = is405 ? "405B" : "GPT-3 175B";
    snprintf(shown, sizeof shown, "%d, %d fit", n, fit);
    snprintf(lec, sizeof lec, "%d, %d fit", want_n, want_fit);
    snprintf(id, sizeof id, "search_%s_count", tag);
    snprintf(label, sizeof label, "%s: (t, p, d) combinations, and how many fit 80 GB", nm);
    lec_fig("§6.4", id, label, n, shown, lec,
            n == want_n && fit == want_fit ? LEC_MATCH : LEC_DIFF);
    /* the fastest that fits */
    int best = -1;
    for (int i = 0; i < n && best < 0; i++)
        if (r[i].mem.fits)
            best = i;
    if (best < 0) {
        lec_fig("§6.4", "search_none", "no layout fits", NAN, "none", "8 x 8 x 16", LEC_DIFF);
        return 0;
    }
    dl_plan_step *b = &r[best];
    snprintf(shown, sizeof shown, "%d x %d x %d", b->layout.t, b->layout.p, b->layout.d);
    snprintf(id, sizeof id, "search_%s_fastest", tag);
    snprintf(label, sizeof label, "%s: fastest layout that fits, t x p x d", nm);
    lec_fig("§6.4", id, label, NAN, shown, "8 x 8 x 16",
            b->layout.t == 8 && b->layout.p == 8 && b->layout.d == 16 ? LEC_MATCH : LEC_DIFF);
    snprintf(shown, sizeof shown, "%.1f GB", b->mem.total / 1e9);
    snprintf(id, sizeof id, "search_%s_mem", tag);
    snprintf(label, sizeof label, "%s: its memory per GPU", nm);
    if (is405)
        lec_fig("§6.4", id, label, b->mem.total, shown, "32 GB (about; band 30-34)",
                b->mem.total / 1e9 >= 30 && b->mem.total / 1e9 <= 34 ? LEC_MATCH : LEC_DIFF);
    else
        lec_fig("§6.4", id, label, b->mem.total, shown, "", LEC_INFO);
    snprintf(shown, sizeof shown, "%.2f s", b->total);
    snprintf(id, sizeof id, "search_%s_step", tag);
    snprintf(label, sizeof label, "%s: its step time (comparison only, says the lecture)", nm);
    if (is405)
        lec_fig("§6.4", id, label, b->total, shown, "about 24 s (band 22-26)",
                b->total >= 22 && b->total <= 26 ? LEC_MATCH : LEC_DIFF);
    else
        lec_fig("§6.4", id, label, b->total, shown, "", LEC_INFO);
    return 0;
}

static int lecture_05(void)
{
    section_header("05", "§6.4 3-D parallelism: the (t, p, d) search (code 05; the planner, "
                         "dl_plan_search)");
    lec_text("  memory = 4Psi/(tp) + 12Psi/(tpd) (ZeRO-1) + first-stage layer inputs (1F1B, full "
             "recompute, /t);\n"
             "  time = compute/(1 - bubble) + TP all-reduces (NVLink) + PP sends + DP gradients "
             "(InfiniBand)\n");
    if (search_one("gpt3-175b", 27, 18, 0))
        return -1;
    if (search_one("llama3-405b", 27, 14, 1))
        return -1;
    lec_text(
        "  (the 405B figures are the planner's model; code 05 did not ship with the lecture, see "
        "docs/PLANNER.md)\n");
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* exercises (§9)                                                                            */

static uint64_t splitmix_u(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

typedef struct ex5_run {
    uint64_t ar, rs, ag;
} ex5_run;

/* Exercise 5 measured: a ring all-reduce vs reduce-scatter + all-gather of the same buffer. */
static int ex5_rank(dl_ctx *x, void *arg)
{
    ex5_run *r = arg;
    enum { N = 4096 };
    float *g = calloc(N, sizeof(float)), *blk = calloc(N, sizeof(float));
    if (!g || !blk) {
        free(g);
        free(blk);
        return dl_error(DL_ENOMEM, "exercise 5: out of memory");
    }
    dl_comm *c = dl_ctx_comm(x);
    dl_comm_set_algo(c, DL_ALGO_RING);
    dl_comm_stats st;
    int rc;
    dl_comm_reset_stats(c);
    rc = dl_allreduce(c, g, g, N, DL_F32, DL_SUM, DL_PURPOSE_GRADS);
    dl_comm_get_stats(c, &st);
    uint64_t ar = st.bytes_sent[DL_PURPOSE_GRADS];
    dl_comm_reset_stats(c);
    size_t off, len;
    dl_block(N, dl_ctx_size(x), dl_ctx_rank(x), &off, &len);
    if (rc == 0)
        rc = dl_reduce_scatter(c, g, blk, N, DL_F32, DL_SUM, DL_PURPOSE_GRADS);
    dl_comm_get_stats(c, &st);
    uint64_t rs = st.bytes_sent[DL_PURPOSE_GRADS];
    dl_comm_reset_stats(c);
    if (rc == 0)
        rc = dl_allgather(c, blk, g, N, DL_F32, DL_PURPOSE_PARAMS);
    dl_comm_get_stats(c, &st);
    if (dl_ctx_rank(x) == 0) {
        r->ar = ar;
        r->rs = rs;
        r->ag = st.bytes_sent[DL_PURPOSE_PARAMS];
    }
    free(g);
    free(blk);
    return rc;
}

static int lecture_exercises(void)
{
    section_header("exercises", "§9 the six exercises, answered by the planner (and the runtime)");
    char shown[160];
    dl_plan_opts o;
    dl_plan_opts_init(&o);
    dl_plan_model m;
    dl_plan_hw hw;

    /* 1: a 70B dense model */
    if (presets(&m, "dense-70b", &hw, "h100"))
        return -1;
    double psi = dl_plan_model_params(&m);
    double all = dl_plan_state_bytes(psi, &o, 1, 0, 1);
    long gpus = dl_plan_gpus_needed(all, 80e9);
    snprintf(shown, sizeof shown, "%.0f GB, %ld GPUs of 80 GB", all / 1e9, gpus);
    lec_fig("ex. 1a", "ex1a", "70B, mixed-precision Adam, no activations", all, shown,
            "1120 GB, 14 GPUs",
            lec_near(all / 1e9, 1120, 0.5) == LEC_MATCH && gpus == 14 ? LEC_MATCH : LEC_DIFF);
    double z3 = dl_plan_state_bytes(psi, &o, 1, 3, 64);
    snprintf(shown, sizeof shown, "%.1f GB", z3 / 1e9);
    lec_fig("ex. 1b", "ex1b", "ZeRO-3 on 64 GPUs, per GPU", z3, shown, "17.5 GB",
            lec_near(z3 / 1e9, 17.5, 0.05));
    dl_plan_layout l =
        {.t = 8, .p = 8, .d = 16, .v = 1, .micro_batch = 1, .global_batch = 16, .seq = 0};
    dl_plan_mem mem;
    o.zero_stage = 1;
    if (dl_plan_memory(&m, &hw, &o, &l, &mem))
        return lec_fail("planner memory (exercise 1c)");
    snprintf(shown, sizeof shown, "%.1f + %.1f = %.1f GB", (mem.weights + mem.grads) / 1e9,
             mem.optim / 1e9, mem.states / 1e9);
    lec_fig("ex. 1c", "ex1c", "t 8 x p 8 x d 16, ZeRO-1: weights+grads + optimizer", mem.states,
            shown, "4.4 + 0.8 = 5.2 GB",
            lec_near((mem.weights + mem.grads) / 1e9, 4.4, 0.05) == LEC_MATCH &&
                    lec_near(mem.optim / 1e9, 0.8, 0.05) == LEC_MATCH &&
                    lec_near(mem.states / 1e9, 5.2, 0.05) == LEC_MATCH
                ? LEC_MATCH
                : LEC_DIFF);
    snprintf(shown, sizeof shown, "%.2f GB", mem.total / 1e9);
    char lab[128];
    snprintf(lab, sizeof lab, "  plus activations (m = %d micro-batch of 1 x %d tokens, recompute)",
             mem.micro_batches, m.seq);
    lec_fig("ex. 1c", "ex1c_act", lab, mem.total, shown, "", LEC_INFO);

    /* 2: the column-parallel backward, numerically (library kernels) */
    {
        enum { N = 6, K = 8, NO = 12, H = NO / 2 };
        double X[N * K], W[NO * K], G[N * NO], dX[N * K] = {0}, dW[NO * K] = {0};
        double G1[N * H], G2[N * H], dX1[N * K] = {0}, dX2[N * K] = {0}, dW1[H * K] = {0},
                                             dW2[H * K] = {0};
        uint64_t s = 5;
        for (int i = 0; i < N * K; i++) X[i] = (double)(int)(splitmix_u(&s) % 2001) / 1000 - 1;
        for (int i = 0; i < NO * K; i++) W[i] = (double)(int)(splitmix_u(&s) % 2001) / 1000 - 1;
        for (int i = 0; i < N * NO; i++) G[i] = (double)(int)(splitmix_u(&s) % 2001) / 1000 - 1;
        for (int i = 0; i < N; i++)
            for (int j = 0; j < H; j++) {
                G1[i * H + j] = G[i * NO + j];
                G2[i * H + j] = G[i * NO + H + j];
            }
        /* Y = X W (the lecture's W is k x n; nn.Linear's layout holds W1's columns as rows 0..H-1) */
        dl_linear_bwd_f64(dX, dW, NULL, G, X, W, N, K, NO);
        dl_linear_bwd_f64(dX1, dW1, NULL, G1, X, W, N, K, H);
        dl_linear_bwd_f64(dX2, dW2, NULL, G2, X, W + H * K, N, K, H);
        double ex = 0, ew = 0, ref = 0;
        for (int i = 0; i < N * K; i++) {
            ex = fmax(ex, fabs(dX1[i] + dX2[i] - dX[i]));
            ref = fmax(ref, fabs(dX[i]));
        }
        for (int i = 0; i < H * K; i++) {
            ew = fmax(ew, fabs(dW1[i] - dW[i]));
            ew = fmax(ew, fabs(dW2[i] - dW[H * K + i]));
        }
        snprintf(shown, sizeof shown, "max diff %.1e (rel %.1e)", ex, ex / ref);
        lec_fig("ex. 2", "ex2_dx", "dl/dX = G1 W1^T + G2 W2^T (two local terms, one all-reduce)",
                ex / ref, shown, "equal (round-off; bound rel 1e-13)", lec_le(ex / ref, 1e-13));
        snprintf(shown, sizeof shown, "max diff %.1e", ew);
        lec_fig("ex. 2", "ex2_dw", "dl/dW_i = X^T G_i from rank i's own data (no communication)",
                ew, shown, "equal (bound 1e-13)", lec_le(ew, 1e-13));
    }

    /* 3: row-parallel first: GeLU of a sum is not the sum of GeLUs */
    {
        double p[2] = {0.7, -1.3}, sum = p[0] + p[1], g[3];
        double in[3] = {p[0], p[1], sum};
        dl_gelu_fwd_f64(g, in, 3);
        double gap = fabs(g[2] - (g[0] + g[1]));
        snprintf(shown, sizeof shown, "|GeLU(P1+P2) - GeLU(P1) - GeLU(P2)| = %.3f", gap);
        lec_fig("ex. 3", "ex3_gelu", "row-then-column: partial sums cannot pass GeLU separately",
                gap, shown, "not equal", gap > 1e-3 ? LEC_MATCH : LEC_DIFF);
        lec_text("         so A row-parallel needs an all-reduce before GeLU and B column-parallel "
                 "an all-gather"
                 " after:\n         2 communications forward instead of 1 (measured for "
                 "column-then-row in 02: 1)\n");
    }

    /* 4: bubbles with p = 8 */
    long m4 = dl_plan_min_microbatches(8, 1, 0.10);
    snprintf(shown, sizeof shown, "m >= %ld (63 gives %.1f%%)", m4, 100 * dl_plan_bubble(8, 63, 1));
    lec_fig("ex. 4a", "ex4a", "p = 8: micro-batches for a bubble below 10%", (double)m4, shown,
            "at least 64", lec_near((double)m4, 64, 0));
    long gi = dl_plan_inflight(DL_PLAN_GPIPE, 8, 64, 1),
         fi = dl_plan_inflight(DL_PLAN_1F1B, 8, 64, 1);
    snprintf(shown, sizeof shown, "GPipe %ld, 1F1B %ld", gi, fi);
    lec_fig("ex. 4b", "ex4b", "micro-batches the first stage holds (m = 64)", NAN, shown,
            "GPipe 64, 1F1B 8", gi == 64 && fi == 8 ? LEC_MATCH : LEC_DIFF);
    double b4 = dl_plan_bubble(8, 512 / 16, 1);
    snprintf(shown, sizeof shown, "m = %d, bubble 7/39 = %.1f%%", 512 / 16, 100 * b4);
    lec_fig("ex. 4c", "ex4c", "512 sequences, d = 16, micro-batch 1", b4, shown,
            "m = 32, 7/39 about 18%",
            lec_near(100 * b4, 18, 0.5) == LEC_MATCH && fabs(b4 - 7.0 / 39) < 1e-12 ? LEC_MATCH
                                                                                    : LEC_DIFF);

    /* 5: ZeRO traffic */
    dl_plan_zero_row rows[4];
    if (dl_plan_zero_table(7.5e9, 12, 64, NULL, rows))
        return lec_fail("planner ZeRO table");
    snprintf(shown, sizeof shown, "%g / %g / %g / %g", rows[0].comm_factor, rows[1].comm_factor,
             rows[2].comm_factor, rows[3].comm_factor);
    lec_fig("ex. 5", "ex5_factors", "traffic in Psi(N-1)/N: DP, ZeRO-1, ZeRO-2, ZeRO-3 (planner)",
            NAN, shown, "2 / 2 / 2 / 3",
            rows[0].comm_factor == 2 && rows[1].comm_factor == 2 && rows[2].comm_factor == 2 &&
                    rows[3].comm_factor == 3
                ? LEC_MATCH
                : LEC_DIFF);
    ex5_run er = {0};
    dl_world_opts wo;
    dl_world_opts_init(&wo);
    wo.nranks = 4;
    if (dl_world_run(&wo, ex5_rank, &er) != DL_OK)
        return lec_fail("exercise 5 run");
    snprintf(shown, sizeof shown, "%llu + %llu = %llu B", (unsigned long long)er.rs,
             (unsigned long long)er.ag, (unsigned long long)er.ar);
    lec_fig("ex. 5", "ex5_measured",
            "measured, 4 ranks, 16 KiB: reduce-scatter + all-gather = all-reduce",
            (double)(er.rs + er.ag), shown, "Psi(N-1)/N + Psi(N-1)/N = 2Psi(N-1)/N",
            er.rs + er.ag == er.ar && er.rs == er.ag &&
                    lec_near((double)er.ar, dl_plan_allreduce_sent(4, 4096 * 4.0), 0) == LEC_MATCH
                ? LEC_MATCH
                : LEC_DIFF);

    /* 6: version gaps p - s, the planner's formula against the simulator */
    int gaps[4];
    for (int s = 1; s <= 4; s++) gaps[s - 1] = dl_plan_staleness(4, s);
    dl_sched *as;
    dl_sched_versions *v;
    if (dl_sched_async(4, 8, 0, &as))
        return lec_fail("async schedule");
    if (dl_sched_versions_get(as, &v)) {
        dl_sched_free(as);
        return lec_fail("weight versions");
    }
    int agree = memcmp(gaps, v->max_gap, sizeof gaps) == 0;
    list_ints(shown, sizeof shown, gaps, 4, " / ");
    strncat(shown, agree ? " (= simulator)" : " (simulator differs)",
            sizeof shown - strlen(shown) - 1);
    lec_fig("ex. 6", "ex6", "p = 4: updates between F and B on stage s, p - s", NAN, shown,
            "3 / 2 / 1 / 0",
            agree && gaps[0] == 3 && gaps[1] == 2 && gaps[2] == 1 && gaps[3] == 0 ? LEC_MATCH
                                                                                  : LEC_DIFF);
    dl_sched_versions_free(v);
    dl_sched_free(as);
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* main                                                                                      */

static void usage(FILE *f)
{
    /* clang-format off */
    fprintf(f,
"Usage: distlab-lecture SECTION [--check] [--json]\n"
"\n"
"Reproduces Lecture 17, Distributed Training, of CMU 10-423/623/723 Generative AI with distlab:\n"
"each section prints the lecture's quantities as measured or computed here, labelled with the\n"
"lecture's section.\n"
"\n"
"Sections:\n"
"  01         §1: bytes per parameter, GPT-3 activations, the 7.5B model's compute and gradient\n"
"             all-reduce on NVLink and InfiniBand, BF16 operations per byte (the planner)\n"
"  02         §2 and §3, run for real on rank threads: data parallelism on 4 ranks vs the full\n"
"             batch (f64 and f32) and the bytes each rank sent; the handwritten Megatron MLP vs the\n"
"             library's kernels; tensor parallelism 2 and 4 vs one rank; attention split by heads\n"
"             2 / 4 / 8 ways; all-reduces per layer; the GPT-3 layer at t = 8 (352 MB, comm/compute)\n"
"  03         §4 and §6.2: the naive / GPipe / 1F1B grids as the lecture prints them, bubbles,\n"
"             activations, weight versions, the layer partition, TeraPipe (the simulator); an 8-layer\n"
"             MLP in 4 stages on 4 rank threads through the pipeline engine (GPipe m = 1 / 4 / 8,\n"
"             1F1B m = 4 / 8) vs the full batch: gradients within round-off (f32 and f64)\n"
"  04         §5 ZeRO, run on 4 rank threads: the lecture's 1633-parameter MLP, 5 Adam steps in\n"
"             mixed precision (bf16 params and grads, fp32 master and Adam state) as plain DP, P_os,\n"
"             P_os+g and P_os+g+p: bytes per parameter from the arena (16 / 7 / 5.5 / 4 plus padding),\n"
"             elements sent per step from the counters (2Psi and 3Psi (N-1)/N), the difference to\n"
"             the single-rank Adam (bf16, and f32); the paper's Figure 1 for 7.5B, K = 12, N_d = 64\n"
"  05         §6.4: the (t, p, d) search for GPT-3 175B and the 405B shape on 1024 H100\n"
"  06         §6.3, run on rank threads: the capacity factor's drops and idle experts (dp 4 x ep 4,\n"
"             one expert per rank, top-2, the factors 0.5 .. 2 and no limit), two all-to-alls per\n"
"             MoE layer; the Mixtral-sized layer from the planner (235 MB per GPU, comm/compute)\n"
"  exercises  §9: the six exercises' answers\n"
"  all        every section in order\n"
"\n"
"Options:\n"
"  --check          mark every figure the lecture states MATCH or DIFF (round-off figures against\n"
"                   a stated bound) and exit with status 1 if any is DIFF\n"
"  --json           JSON Lines on stdout instead of text: one {\"type\":\"figure\"} record per figure\n"
"                   (section, ref, id, label, value, shown, lecture, check; value in bytes, seconds,\n"
"                   FLOP/s, counts or fractions, percentages as fractions; null when not a number),\n"
"                   then a summary record\n"
"  -h, --help       this help\n"
"  -V, --version    the version\n"
"\n"
"OpenBLAS runs one thread per rank (the program sets OPENBLAS_NUM_THREADS=1 and restarts itself\n"
"when needed, also to pick the CPU's kernel class when OpenBLAS picked a lower one and\n"
"OPENBLAS_CORETYPE is unset). Exit status: 0 ok, 1 a DIFF under --check or a failed run, 2 bad usage.\n");
    /* clang-format on */
}

typedef struct section {
    const char *name;
    int (*fn)(void);
} section;

static int lecture_02_wrap(void)
{
    section_header("02",
                   "§2 data parallelism and §3 tensor parallelism, run on rank threads (code 02)");
    return lecture_02();
}

static int lecture_04_wrap(void)
{
    section_header("04", "§5 ZeRO on rank threads (code 04): the four variants, and the paper's "
                         "Figure 1");
    return lecture_04();
}

static int lecture_06_wrap(void)
{
    section_header("06", "§6.3 expert parallelism: the capacity factor on rank threads, the "
                         "Mixtral-sized layer from the planner");
    return lecture_06();
}

static const section SECTIONS[] = {
    {"01", lecture_01},
    {"02", lecture_02_wrap},
    {"03", lecture_03},
    {"04", lecture_04_wrap},
    {"05", lecture_05},
    {"06", lecture_06_wrap},
    {"exercises", lecture_exercises},
};
#define NSECTIONS (int)(sizeof SECTIONS / sizeof SECTIONS[0])

int main(int argc, char **argv)
{
    cli_ignore_sigxfsz();
    cli_progname = "distlab-lecture";
    cli_blas_setup(argv);
    static const struct option longopts[] = {{"check", 0, 0, 'c'},
                                             {"json", 0, 0, 'j'},
                                             {"help", 0, 0, 'h'},
                                             {"version", 0, 0, 'V'},
                                             {0, 0, 0, 0}};
    int ch;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, "hV", longopts, NULL)) != -1) {
        switch (ch) {
        case 'c': opt_check = 1; break;
        case 'j': opt_json = 1; break;
        case 'h': usage(stdout); return CLI_EXIT_OK;
        case 'V': cli_print_version(stdout); return CLI_EXIT_OK;
        default:
            cli_unknown_option("", argv[optind - 1], longopts, sizeof longopts[0], 0, 1, "--help");
            return CLI_EXIT_USAGE;
        }
    }
    if (optind >= argc) {
        cli_error("missing SECTION: 01, 02, 03, 04, 05, 06, exercises or all (try --help)");
        return CLI_EXIT_USAGE;
    }
    if (argc - optind > 1) {
        cli_error("one SECTION only, got '%s' and '%s' (try --help)", argv[optind],
                  argv[optind + 1]);
        return CLI_EXIT_USAGE;
    }
    const char *want = argv[optind];
    int all = strcmp(want, "all") == 0, found = all;
    for (int i = 0; i < NSECTIONS && !found; i++) found = strcmp(want, SECTIONS[i].name) == 0;
    if (!found) {
        cli_error("unknown section '%s' (01, 02, 03, 04, 05, 06, exercises or all)", want);
        return CLI_EXIT_USAGE;
    }
    if (!opt_json) {
        printf("distlab-lecture %s: lecture 17 (distributed training) reproduced%s\n", want,
               opt_check ? "; MATCH / DIFF against the lecture's stated figures" : "");
    }
    for (int i = 0; i < NSECTIONS; i++) {
        if (!all && strcmp(want, SECTIONS[i].name) != 0)
            continue;
        SECTIONS[i].fn();
        fflush(stdout);
    }
    int ok = n_failed == 0 && (!opt_check || n_diff == 0);
    if (opt_json) {
        printf("{\"type\":\"summary\",\"schema\":\"distlab/"
               "1\",\"app\":\"distlab-lecture\",\"version\":\"%s\","
               "\"section\":\"%s\",\"figures\":%d,\"checked\":%d,\"match\":%d,\"diff\":%d,"
               "\"failed\":%d,"
               "\"ok\":%s}\n",
               dl_version(), want, n_figs, n_checked, n_match, n_diff, n_failed,
               ok ? "true" : "false");
    } else {
        printf("\n%d figures, %d stated by the lecture", n_figs, n_checked);
        if (opt_check)
            printf(": %d MATCH, %d DIFF", n_match, n_diff);
        if (n_failed)
            printf("; %d failed run%s", n_failed, n_failed > 1 ? "s" : "");
        printf("\n");
    }
    return ok ? CLI_EXIT_OK : CLI_EXIT_FAIL;
}
