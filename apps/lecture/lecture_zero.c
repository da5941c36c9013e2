/* distlab-lecture 04: lecture 17 §5 (ZeRO, its code 04) run for real on rank threads.
 *
 * Part 1: the four variants (plain data parallelism, P_os, P_os+g, P_os+g+p) of the lecture's
 * 1633-parameter MLP (apps/lecture/lecture_mlp.c) on the library's ZeRO engine
 * (lib/parallel/zero_engine.c), 4 rank threads, 5 Adam steps in mixed precision. Bytes per
 * parameter come from each rank's arena (peak params + grads + optimizer), the elements each rank
 * sends from its communicator's counters (dl_comm_get_stats), the difference from the single-rank
 * Adam from the master weights. The same four variants with f32 parameters and gradients give the
 * comparison at float32 rounding that the lecture quotes.
 * Part 2: the paper's Figure 1 for Psi = 7.5B, K = 12, N_d = 64, from the planner
 * (dl_plan_zero_table), which also gives the expected bytes of part 1 at its padded Psi. */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "distlab.h"
#include "lecture.h"
#include "lecture_mlp.h"

#define ZN 4 /* ranks, the lecture's 4 "GPUs" */

static const char *const VARIANT[4] = {"baseline (DP)", "P_os (ZeRO-1)", "P_os+g (ZeRO-2)",
                                       "P_os+g+p (ZeRO-3)"};
static const char *const LEC_BPP[4] = {"16", "7", "5.5", "4"};
static const double LEC_BPP_V[4] = {16, 7, 5.5, 4};

/* |Adam's step| <= lr * c_t for any gradients (Cauchy-Schwarz on m-hat over sqrt(v-hat)):
 * c_t = sqrt(sum_k a_k^2 / b_k), a_k, b_k the bias-corrected weights of g_k in m-hat and v-hat. */
static double adam_step_bound(int t, double b1, double b2)
{
    double s = 0;
    for (int k = 1; k <= t; k++) {
        double a = (1 - b1) * pow(b1, t - k) / (1 - pow(b1, t));
        double b = (1 - b2) * pow(b2, t - k) / (1 - pow(b2, t));
        s += a * a / b;
    }
    return sqrt(s);
}

/* all ranks of r measured the same peaks in every category and sent the same gradient and
 * parameter bytes (the loss, one element, goes to one rank's block of the ring) */
static int ranks_agree(const zm_result *r)
{
    for (int k = 1; k < r->L.n; k++)
        if (memcmp(r->peak[k], r->peak[0], sizeof r->peak[0]) ||
            r->sent[k][DL_PURPOSE_GRADS] != r->sent[0][DL_PURPOSE_GRADS] ||
            r->sent[k][DL_PURPOSE_PARAMS] != r->sent[0][DL_PURPOSE_PARAMS])
            return 0;
    return 1;
}

static int run_all(dl_dtype t, zm_result *ref, zm_result v[4])
{
    zm_opts o;
    zm_opts_init(&o);
    o.dtype = t;
    o.nranks = 1;
    if (zm_run(&o, ref))
        return lec_fail("ZeRO MLP, single rank");
    o.nranks = ZN;
    for (int s = 0; s < 4; s++) {
        o.stage = s;
        if (zm_run(&o, &v[s])) {
            for (int k = 0; k < s; k++) zm_result_free(&v[k]);
            zm_result_free(ref);
            return lec_fail("ZeRO MLP, 4 ranks");
        }
    }
    return 0;
}

static void free_all(zm_result *ref, zm_result v[4])
{
    zm_result_free(ref);
    for (int s = 0; s < 4; s++) zm_result_free(&v[s]);
}

static int part1(void)
{
    zm_result ref, v[4], ref32, v32[4];
    if (run_all(DL_BF16, &ref, v))
        return -1;
    if (run_all(DL_F32, &ref32, v32)) {
        free_all(&ref, v);
        return -1;
    }
    const zm_layout *L = &v[0].L;
    const zm_opts *o = &v[0].opts;
    const double psi = (double)L->psi, psip = (double)L->ppad, frac = (ZN - 1.0) / ZN;
    char shown[160], label[160], lec[160], id[64];

    lec_text("§5.2 code 04 part 1: an MLP %d -> %d -> %d -> %d (GeLU, squared error; the lecture's "
             "shape did\n"
             "   not survive in the text, this one has its %zu parameters) on %d rank threads, %d "
             "Adam steps\n"
             "   (lr %g, betas 0.9 / 0.999), global batch %d (%d per rank), weights and data from "
             "counter-based\n"
             "   generators. Mixed precision: bf16 parameters and gradients (round to nearest "
             "even; the ring\n"
             "   carries bf16 and adds in f32, rounding once per hop), fp32 master + Adam m and v "
             "(K = 12).\n"
             "   One flat buffer per layer padded to a multiple of %d (FSDP's flat parameter, "
             "DDP's bucket):\n"
             "   %zu + %zu + %zu = %zu elements (%zu padding), shard %zu per rank; every stage "
             "reduces layer by\n"
             "   layer as the backward produces it. Bytes: each rank's arena, peak per category.\n",
             L->in[0], L->out[0], L->out[1], L->out[2], L->psi, ZN, o->steps, (double)o->lr,
             o->batch, o->batch / ZN, ZN, L->pad[0], L->pad[1], L->pad[2], L->ppad,
             L->ppad - L->psi, L->shard);
    lec_text("\n   %-18s %7s %7s %9s %8s %11s %8s %8s  %s\n", "variant (bf16)", "params", "grads",
             "optimizer", "B/param", "comm peak", "RS+AG", "AR", "elements sent per rank per step");
    for (int s = 0; s < 4; s++) {
        const uint64_t *p = v[s].peak[0], *sn = v[s].sent[0];
        double steps = o->steps;
        lec_text("   %-18s %6lluB %6lluB %8lluB %8.3f %10lluB %8.0f %8.0f\n", VARIANT[s],
                 (unsigned long long)p[DL_MEM_PARAMS], (unsigned long long)p[DL_MEM_GRADS],
                 (unsigned long long)p[DL_MEM_OPTIMIZER], (double)zm_state_bytes(&v[s], 0) / psi,
                 (unsigned long long)p[DL_MEM_COMM],
                 s == 0 ? 0.0 : (double)(sn[DL_PURPOSE_GRADS] + sn[DL_PURPOSE_PARAMS]) / 2 / steps,
                 s == 0 ? (double)sn[DL_PURPOSE_GRADS] / 2 / steps : 0.0);
    }
    lec_text("   (comm peak: transient buffers, not model state: the ring reduce-scatter's partial "
             "sums (one\n"
             "   layer), ZeRO-2's layer gradient in f32 before the engine rounds it to bf16 for "
             "its "
             "reduce-scatter,\n"
             "   ZeRO-3's gathered layer; largest layer %zu elements = %zu B in bf16)\n\n",
             L->pad[1], L->pad[1] * 2);

    /* the planner's bytes at the padded Psi' on 4 ranks: what the arena must measure exactly */
    dl_plan_zero_row pr[4];
    if (dl_plan_zero_table(psip, 12, ZN, NULL, pr)) {
        free_all(&ref, v);
        free_all(&ref32, v32);
        return lec_fail("planner ZeRO table (N = 4)");
    }
    for (int s = 0; s < 4; s++) {
        double bytes = (double)zm_state_bytes(&v[s], 0), bpp = bytes / psi;
        int agree = ranks_agree(&v[s]);
        snprintf(label, sizeof label, "%s: bytes per parameter (arena: params + grads + optimizer)",
                 VARIANT[s]);
        snprintf(shown, sizeof shown, "%.3f (%.0f B%s)", bpp, bytes, agree ? "" : "; ranks differ");
        snprintf(lec, sizeof lec, "%s + padding; = planner %s at Psi' = %.0f, within 0.05",
                 LEC_BPP[s], pr[s].formula, psip);
        snprintf(id, sizeof id, "zero%d_bytes_per_param", s);
        lec_fig("§5.2", id, label, bpp, shown, lec,
                agree && bytes == pr[s].bytes && lec_near(bpp, LEC_BPP_V[s], 0.05) == LEC_MATCH
                    ? LEC_MATCH
                    : LEC_DIFF);
    }
    double sent[4];
    for (int s = 0; s < 4; s++) {
        const uint64_t *sn = v[s].sent[0];
        double rs = s == 0 ? 0 : (double)sn[DL_PURPOSE_GRADS] / 2 / o->steps;
        double ag = (double)sn[DL_PURPOSE_PARAMS] / 2 / o->steps;
        double ar = s == 0 ? (double)sn[DL_PURPOSE_GRADS] / 2 / o->steps : 0;
        sent[s] = rs + ag + ar;
        double f = pr[s].comm_factor, want = f * psip * frac;
        snprintf(label, sizeof label, "%s: bf16 elements sent per rank per step (counters)",
                 VARIANT[s]);
        if (s == 0)
            snprintf(shown, sizeof shown, "%.0f (all-reduce)", sent[s]);
        else if (s < 3)
            snprintf(shown, sizeof shown, "%.0f = RS %.0f + AG %.0f", sent[s], rs, ag);
        else
            snprintf(shown, sizeof shown, "%.0f = RS %.0f + 2 AG %.0f", sent[s], rs, ag);
        snprintf(lec, sizeof lec, "%.0fPsi(N-1)/N = %.1f; %.0f at Psi' = %.0f", f, f * psi * frac,
                 want, psip);
        snprintf(id, sizeof id, "zero%d_elements_sent", s);
        lec_fig("§5.2", id, label, sent[s], shown, lec,
                ranks_agree(&v[s]) && sent[s] == want &&
                        fabs(sent[s] - f * psi * frac) <= f * (psip - psi) * frac
                    ? LEC_MATCH
                    : LEC_DIFF);
    }
    double ratio = sent[3] / sent[0];
    snprintf(shown, sizeof shown, "%.3f x (%.0f / %.0f)", ratio, sent[3], sent[0]);
    lec_fig("§5.2", "zero3_traffic_ratio", "P_os+g+p traffic over plain DP (P_os, P_os+g: 1)",
            ratio, shown, "3Psi vs 2Psi: 50% more; P_os, P_os+g no more",
            ratio == 1.5 && sent[1] == sent[0] && sent[2] == sent[0] ? LEC_MATCH : LEC_DIFF);

    /* the same computation: ZeRO changes who stores and updates what */
    double d12 = zm_maxdiff(&v[1], &v[2]), d13 = zm_maxdiff(&v[1], &v[3]);
    snprintf(shown, sizeof shown, "%.1e, %.1e", d12, d13);
    lec_fig("§5.2", "zero123_identical", "bf16: P_os+g and P_os+g+p vs P_os, max |master diff|",
            fmax(d12, d13), shown, "ZeRO changes no step of Adam: 0 (bitwise)",
            d12 == 0 && d13 == 0 ? LEC_MATCH : LEC_DIFF);

    double bound = 0;
    for (int k = 1; k <= o->steps; k++) bound += 2 * o->lr * adam_step_bound(k, 0.9, 0.999);
    for (int s = 0; s < 4; s++) {
        double d = zm_maxdiff(&v[s], &ref);
        snprintf(label, sizeof label, "bf16 %s vs the single-rank Adam, max |master diff|",
                 VARIANT[s]);
        size_t nbig = zm_count_above(&v[s], &ref, 0.1 * o->lr);
        snprintf(shown, sizeof shown, "%.1e = %.2f lr (%zu > lr/10)", d, d / o->lr, nbig);
        snprintf(id, sizeof id, "zero%d_bf16_vs_single", s);
        lec_fig("§5.2", id, label, d, shown, "", LEC_INFO);
    }
    double d01 = zm_maxdiff(&v[0], &v[1]);
    lec_text("         (x > lr/10: weights that differ by more than a tenth of a step.) In bf16 "
             "each ring hop\n"
             "         rounds the partial sum while the single rank rounds the whole batch's sum "
             "once, and\n"
             "         Adam scales every step to about lr: a weight whose gradient cancels to "
             "nearly zero can\n"
             "         get the other sign and move 2 lr apart (Adam's bound for any two runs after "
             "%d steps:\n"
             "         %.1e). The ring all-reduce starts each block's sum one rank earlier than "
             "the\n"
             "         reduce-scatter does, so the baseline rounds differently from P_os (%.1e "
             "apart). The\n"
             "         loss agrees: %.5f -> %.5f on one rank, %.5f -> %.5f on 4 (P_os+g+p).\n",
             o->steps, bound, d01, ref.loss[0], ref.loss[o->steps - 1], v[3].loss[0],
             v[3].loss[o->steps - 1]);
    double worst = 0;
    for (int s = 0; s < 4; s++) worst = fmax(worst, zm_maxdiff(&v[s], &ref));
    snprintf(shown, sizeof shown, "%.1e <= %.1e", worst, bound);
    lec_fig("§5.2", "zero_bf16_bound", "bf16, all four vs single rank: within Adam's step bound",
            worst, shown, "", LEC_INFO);

    for (int s = 0; s < 4; s++) {
        double d = zm_maxdiff(&v32[s], &ref32);
        snprintf(label, sizeof label, "f32 params and grads, %s vs single rank, max |diff|",
                 VARIANT[s]);
        snprintf(shown, sizeof shown, "%.1e (%.3f B/param)", d,
                 (double)zm_state_bytes(&v32[s], 0) / psi);
        snprintf(id, sizeof id, "zero%d_f32_vs_single", s);
        lec_fig("§5.2", id, label, d, shown, "1e-07 (float32 round-off); bound 1e-6",
                lec_le(d, 1e-6));
    }
    free_all(&ref, v);
    free_all(&ref32, v32);
    return 0;
}

/* Figure 1 of the paper: Psi = 7.5B, K = 12, N_d = 64 */
static int part2(void)
{
    dl_plan_zero_row rows[4];
    if (dl_plan_zero_table(7.5e9, 12, 64, NULL, rows))
        return lec_fail("planner ZeRO table");
    static const double want[4] = {120, 31.4, 16.6, 1.9};
    static const char *const wants[4] = {"120 GB", "31.4 GB", "16.6 GB", "1.9 GB"};
    char shown[160], label[160], id[64];
    lec_text("\n§5.2 code 04 part 2: the paper's Figure 1, Psi = 7.5B, K = 12, N_d = 64, per GPU, "
             "without\n"
             "   activations (the planner, dl_plan_zero_table; lecture rounds to 0.1 GB)\n");
    for (int s = 0; s < 4; s++) {
        snprintf(label, sizeof label, "Figure 1: %s, %s", rows[s].name, rows[s].formula);
        snprintf(shown, sizeof shown, "%.2f GB, traffic %gPsi", rows[s].bytes / 1e9,
                 rows[s].comm_factor);
        snprintf(id, sizeof id, "fig1_%s",
                 s == 0   ? "baseline"
                 : s == 1 ? "pos"
                 : s == 2 ? "posg"
                          : "posgp");
        char lec[64];
        snprintf(lec, sizeof lec, "%s, %dPsi; within 0.05 GB", wants[s], s == 3 ? 3 : 2);
        lec_fig("§5.2", id, label, rows[s].bytes, shown, lec,
                lec_near(rows[s].bytes / 1e9, want[s], 0.05) == LEC_MATCH &&
                        rows[s].comm_factor == (s == 3 ? 3 : 2)
                    ? LEC_MATCH
                    : LEC_DIFF);
    }
    return 0;
}

int lecture_04(void)
{
    if (part1())
        return -1;
    return part2();
}
