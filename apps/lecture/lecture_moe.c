/* distlab-lecture 06: lecture 17 §6.3, expert parallelism, run on rank threads and planned.
 *
 * Part 1: the capacity trade-off measured. The trainer's mixture of experts (4 experts, one per
 * rank of dp 4 x ep 4, as the slides put each expert on its own GPU; top-2 as Mixtral) trains for
 * each capacity factor of distlab-bench moe's sweep (apps/common/moe_sweep.c, the same runs).
 * From step 1's counts, identical routing at every factor (the same initialisation and batch):
 * the drop rate (choices over capacity, which skip their expert through the residual) and the
 * idle share of the experts' work (1 - mean / max over the ranks of the choices their experts
 * processed: the under-loaded ranks' wait at the combine when every choice costs the same), both
 * deterministic; and over all steps the measured wait at the combines (wall time: indicative on a
 * loaded host, never checked). The all-to-all bytes against the admitted choices give the number
 * of all-to-alls per MoE layer.
 * Part 2: the lecture's Mixtral-sized layer from the planner (dl_plan_moe_a2a): the bytes a GPU
 * sends per layer (235 MB) and cross-node communication over compute (0.32, from lecture 16's
 * code, not in the seed: the planner's assumptions are printed with it). */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "distlab.h"
#include "lecture.h"
#include "moe_sweep.h"

/* the run: small enough for CI, 4 ranks on any core count (oversubscribed is fine: nothing here
 * is timed that a check depends on) */
static const ms_cfg RUN = {.dp = 4,
                           .ep = 4,
                           .experts = 4,
                           .top_k = 2,
                           .steps = 2,
                           .layers = 2,
                           .d_model = 32,
                           .seq = 32,
                           .batch = 8};

typedef struct factor_fig {
    double drop1, idle1;  /* step 1, from the counts */
    ms_row row;           /* all steps (measured) */
    double a2a_per_layer; /* step 1: all-to-alls per MoE layer (forward and backward) */
} factor_fig;

/* all-to-alls per MoE layer in step 1: the bytes all ranks sent over one all-to-all's payload,
 * the admitted choices' rows (routed - dropped, summed over the layers) of d_model f32 values */
static double a2a_count(const dl_train_result *r)
{
    const dl_train_moe_result *m = &r->moe;
    double sent = 0, kept = 0;
    for (int q = 0; q < r->nranks; q++) sent += m->a2a_bytes[q];
    for (int i = 0; i < m->layers * m->experts; i++) kept += (double)(m->routed[i] - m->dropped[i]);
    return kept > 0 ? sent / (kept * RUN.d_model * sizeof(float)) : 0;
}

static int sweep(factor_fig f[MS_NF])
{
    for (int i = 0; i < MS_NF; i++) {
        dl_train_result r;
        if (ms_run(&RUN, ms_factors[i], &f[i].row, &r) != DL_OK)
            return lec_fail("mixture of experts, capacity sweep");
        ms_step_load(&r, 0, RUN.ep, &f[i].drop1, &f[i].idle1);
        f[i].a2a_per_layer = a2a_count(&r);
        dl_train_result_free(&r);
    }
    return 0;
}

static void part1_figures(const factor_fig f[MS_NF])
{
    char id[48], label[96], shown[64], lab[16];
    for (int i = 0; i < MS_NF; i++) {
        ms_label(ms_factors[i], lab, sizeof lab);
        snprintf(id, sizeof id, "moe_c%g_drop", ms_factors[i]);
        snprintf(label, sizeof label, "C %s: choices dropped, step 1", lab);
        snprintf(shown, sizeof shown, "%.1f%%", 100 * f[i].drop1);
        lec_fig("§6.3", id, label, f[i].drop1, shown, "", LEC_INFO);
        snprintf(id, sizeof id, "moe_c%g_idle", ms_factors[i]);
        snprintf(label, sizeof label, "C %s: idle share of the experts' work, step 1", lab);
        snprintf(shown, sizeof shown, "%.1f%%", 100 * f[i].idle1);
        lec_fig("§6.3", id, label, f[i].idle1, shown, "", LEC_INFO);
        snprintf(id, sizeof id, "moe_c%g_wait", ms_factors[i]);
        snprintf(label, sizeof label, "C %s: wait at the combines per rank and step (measured)",
                 lab);
        snprintf(shown, sizeof shown, "%.2f ms", f[i].row.wait_ms);
        lec_fig("§6.3", id, label, f[i].row.wait_ms / 1e3, shown, "", LEC_INFO);
    }
    /* the lecture's two claims and its count, on step 1's exact counts */
    int falls = 1;
    for (int i = 1; i < MS_NF; i++) falls &= f[i].drop1 <= f[i - 1].drop1;
    snprintf(shown, sizeof shown, "%.1f%% at C 0.5 .. 0 without limit", 100 * f[0].drop1);
    lec_fig("§6.3", "moe_small_c_drops", "too small a capacity factor: tokens overflow (dropped)",
            f[0].drop1, shown, "too small a capacity factor over-assigns",
            falls && f[0].drop1 > 0 && f[MS_NF - 1].drop1 == 0 ? LEC_MATCH : LEC_DIFF);
    snprintf(shown, sizeof shown, "%.1f%% without limit vs %.1f%% at C 0.5",
             100 * f[MS_NF - 1].idle1, 100 * f[0].idle1);
    lec_fig("§6.3", "moe_large_c_idle", "too large a capacity factor: some GPUs idle",
            f[MS_NF - 1].idle1, shown, "too large leaves some GPUs idle",
            f[MS_NF - 1].idle1 > f[0].idle1 ? LEC_MATCH : LEC_DIFF);
    double n = f[2].a2a_per_layer / 2; /* C 1; forward and backward alike */
    snprintf(shown, sizeof shown, "%g (dispatch + combine)", n);
    lec_fig("§6.3", "moe_a2a_per_layer", "all-to-alls per MoE layer in the forward (bytes counted)",
            n, shown, "two", lec_near(n, 2, 0));
}

static int part2(void)
{
    dl_plan_model m;
    dl_plan_hw hw;
    dl_plan_opts o;
    if (dl_plan_model_preset("mixtral-8x7b", &m) != DL_OK || dl_plan_hw_preset("h100", &hw))
        return lec_fail("planner presets");
    dl_plan_opts_init(&o); /* ep link: InfiniBand (cross-node), BF16 values */
    /* 8 GPUs, 8192 tokens each: 2 sequences of 4096 */
    dl_plan_layout l = {1, 1, 8, 1, 2, 16, 4096, 8};
    dl_plan_a2a a;
    if (dl_plan_moe_a2a(&m, &hw, &o, &l, &a) != DL_OK)
        return lec_fail("planner all-to-all");
    lec_text("  the planner's Mixtral-sized layer (dl_plan_moe_a2a): %d GPUs (ep %d), %.0f tokens "
             "per GPU, top-%d, d-model %d, BF16;\n"
             "  sent = 2 (dispatch + combine) x tokens x k x d x 2 B x (ep-1)/ep (the GPU's own "
             "share stays)\n",
             l.d, l.e, a.tokens, m.top_k, m.hidden);
    char shown[64];
    snprintf(shown, sizeof shown, "%.1f MB", a.fwd_sent / 1e6);
    lec_fig("§6.3", "moe_mixtral_a2a_bytes", "Mixtral-sized layer: bytes a GPU sends, forward",
            a.fwd_sent, shown, "about 235 MB", lec_near(a.fwd_sent / 1e6, 235, 0.5));
    lec_text("  assumptions (the 0.32 comes from lecture 16's code, not in the seed): H100 %.0f "
             "TFLOP/s dense BF16 at %.0f%% MFU, InfiniBand %.0f GB/s per GPU per direction,\n"
             "  experts SwiGLU (3 matrices %d x %d, Mixtral's), uniform routing, the forward only "
             "(the backward doubles both), compute = the experts' GEMMs\n",
             hw.flops / 1e12, 100 * hw.mfu, hw.inter_bw / 1e9, m.hidden, m.expert_ffn);
    snprintf(shown, sizeof shown, "%.2f ms", a.fwd_time * 1e3);
    lec_fig("§6.3", "moe_mixtral_a2a_time",
            "Mixtral-sized layer: the two all-to-alls on InfiniBand", a.fwd_time, shown, "",
            LEC_INFO);
    snprintf(shown, sizeof shown, "%.2f ms (%.3g TFLOP)", a.fwd_compute * 1e3,
             a.expert_flops / 1e12);
    lec_fig("§6.3", "moe_mixtral_expert_time", "Mixtral-sized layer: the experts' forward GEMMs",
            a.fwd_compute, shown, "", LEC_INFO);
    snprintf(shown, sizeof shown, "%.3f", a.ratio);
    lec_fig("§6.3", "moe_mixtral_comm_compute",
            "Mixtral-sized layer: cross-node communication / compute", a.ratio, shown, "≈ 0.32",
            lec_near(a.ratio, 0.32, 0.005));
    return 0;
}

int lecture_06(void)
{
    factor_fig f[MS_NF];
    lec_text("  dp %d x ep %d rank threads, %d experts (one per rank), top-%d, %d MoE layers of "
             "d-model %d, seq %d, global batch %d, %d steps per factor, f32;\n"
             "  step 1 routes alike at every factor (same initialisation, same batch): its drop "
             "rate and idle share are exact counts\n",
             RUN.dp, RUN.ep, RUN.experts, RUN.top_k, RUN.layers, RUN.d_model, RUN.seq, RUN.batch,
             RUN.steps);
    if (sweep(f))
        return -1;
    part1_figures(f);
    return part2();
}
