/* Two training runs are the same model: what is compared, and its bound. The one copy of the
 * bounds, used by the tests (tests/unit/testutil.h) and by distlab-train --check.
 *
 * Two layouts (dp, tp, pp, ZeRO stages, one rank) run the same arithmetic in other orders: the
 * collectives and tp's partial products sum in other orders, the GEMMs block differently, and
 * each BLAS kernel class (Prescott, Haswell, SkylakeX...) sums a dot product in its own order.
 * So the runs agree to rounding only, and the bounds follow from an error analysis of that
 * rounding, not from the differences one machine happened to show.
 *
 * Rounding. u = 2^-53 (f64) or 2^-24 (f32, and bf16's f32 compute and master weights). A sum
 * of n terms in any order errs by at most n·u·Σ|terms| and, with rounding errors that behave as
 * independent mean-zero variables, by λ·√n·u·Σ|terms| except with probability about
 * 2·exp(-λ²/2) (Higham and Mary, "A new approach to probabilistic rounding error analysis",
 * SIAM J. Sci. Comput. 41, 2019); λ = 8: 3e-14 per sum, so not once over every element of every
 * test. A loss or a gradient element passes through D = L + 2 such reductions one after the
 * other (embedding, L blocks, head), the longest of n = max(4C, V, G·T) terms (the MLP's inner
 * products, the softmax's normaliser, the weight gradients' sum over the global batch's G·T
 * tokens). So
 *     R = D·λ·√n·u
 * bounds the relative difference of two layouts' losses (a mean of positive terms: no
 * cancellation) and, with a cancellation factor κ = 8 for a tensor's worst element against the
 * tensor's largest (Σ|terms| over |sum|), of their gradients: gtol = κ·R (per tensor
 * max|a-b| / max|b|). f64, L = 2, C = 32, V = 256: R = 4·8·16·2^-53 = 5.7e-14, gtol 4.5e-13;
 * f32: R = 3.1e-5, gtol 2.4e-4.
 * bf16 (mixed precision) also rounds each gradient element to bf16 (u16 = 2^-8) after every
 * micro-batch's accumulation, every ring hop and the tied embeddings' sum across stages; each
 * rounding errs by at most u16·Σ|terms| (every partial sum is at most Σ|terms|). The one-rank
 * run rounds dp·m times (m micro-batches per dp rank), the layout m·c + (dp - 1) + (tp - 1) + 1
 * times (c token slices a micro-batch, --token-chunks: one accumulation each), so
 * gtol = κ·(R + (dp·m + m·c + dp + tp - 1)·u16): a worst case (dp 4, m 1: 0.28), loose
 * because bf16 rounds gradients coarsely; step 1's parameters are checked against the
 * gradients each run had, so they stay tight.
 *
 * What is compared (dl__train_compare):
 * - every step's loss, within R plus the first-order effect of the parameters' differences below:
 *   |ΔL| <= Σ_i |g_i|·|Δp_i| and, since AdamW's first-step update of element i is
 *   lr·φ(g_i) with φ(g) = g / (|g| + ε), |g|·|Δ(lr·φ)| <= lr·|g|·ε·δg / (|g| + ε)² <= lr·δg / 4:
 *   the elements whose difference Adam amplifies (|g| ~ ε) are those the loss barely depends
 *   on. So step t's loss may also differ by P·Σ_{s<t} lr_s·gtol·G_s / 4 (P parameters, G_s =
 *   min(gradient norm, clip) >= every scaled gradient element);
 * - one step (steps == 1, with the gradients): the gradients within gtol, per tensor; and every
 *   parameter element, from the same initial value, within
 *       lr_1·|φ(s_a·g_a) - φ(s_b·g_b)| + 4u·|p| + 24u·lr_1
 *   (s: each run's clipping factor; the decay p·(1 - lr·wd) rounds alike in both runs; the
 *   final subtraction rounds once in each (2u|p|, doubled for the compiler's choice of FMA
 *   contraction), the update about 12 times in each (g·s, the two moments, the square root, the
 *   bias corrections, + ε, the division: 12u·lr_1 per run)): the parameters differ by exactly
 *   what Adam makes of the gradients' difference, and by no more than rounding. A near-zero
 *   gradient element (|g| ~ ε) may legitimately differ by up to 2·lr_1;
 * - several steps: every parameter element within Σ_t lr_t·min(2√t, 2·gtol·G_t / ε) +
 *   T·(4u·|p| + 24u·lr) (the rounding of each step as above): Adam's direction m̂/(√v̂+ε) moves
 *   by at most 2/ε per unit of gradient difference (δg <= gtol·G_t) and is at most √t in size
 *   (Cauchy-Schwarz over the bias-corrected averages), hence at most 2√t apart. In f32
 *   (gtol·G / ε ~ 1e4) this is Adam's step bound 2√t·lr per step: later steps are checked for
 *   gross errors only (`loose`), the first step tightly.
 * The negative controls (tests/unit/train/test_train.c, test_zero.c, test_pipe.c) show these
 * comparisons fail for a run that skips one gradient reduction or perturbs one parameter element
 * by 1e-6 (f64) or 1e-3 (f32) relative. */
#ifndef DISTLAB_TRAIN_COMPARE_H
#define DISTLAB_TRAIN_COMPARE_H

#include <stddef.h>
#include "distlab.h"

/* The compared quantities, in the order they are reported. */
typedef enum {
    DL__EQ_LOSSES, /* every step's loss */
    DL__EQ_GRADS,  /* step 1's gradients (one step) */
    DL__EQ_PARAMS, /* step 1's parameters (one step): the difference beyond Adam's image of the
                    * gradients' difference, against rounding */
    DL__EQ_DRIFT,  /* the last step's parameters (several steps): gross errors only */
    DL__EQ_N
} dl__eq_kind;

/* One compared quantity: its worst case (measured <= bound: pass) and where it was. */
typedef struct dl__eq_item {
    int present;     /* compared in this comparison */
    int pass;        /* measured <= bound */
    int loose;       /* the bound catches gross errors only (no verdict for people) */
    double measured; /* the worst case's difference: relative for losses, per tensor relative
                         * for gradients, beyond Adam's share for step 1's parameters */
    double bound;    /* its bound */
    char where[96];  /* the worst case: "step 3", "h.0.attn.c_proj.weight", "element 17" */
} dl__eq_item;

typedef struct dl__eq_report {
    dl__eq_item item[DL__EQ_N];
    char why[512]; /* the first failed check with its figures ("" when the same model) */
} dl__eq_report;

/* The name of a compared quantity ("losses", "step 1 gradients", ...). */
const char *dl__eq_name(dl__eq_kind k);
/* u of the run's arithmetic: 2^-53 for f64, 2^-24 for f32 and bf16 (f32 compute and masters). */
double dl__eq_unit_roundoff(dl_dtype t);
/* R above for configuration o (resolved: batch.global set). */
double dl__eq_round(const dl_train_opts *o);
/* gtol above: the per-tensor relative bound of two layouts' gradients. */
double dl__eq_grad_tol(const dl_train_opts *o);
/* Compare run a of configuration o (resolved) with run b, the reference (o's model, batch and
 * optimiser on one rank), as described above. Needs output.params, and output.grads when one
 * step was trained. 1: the same model within the bounds; 0: not (rep->why); -1: not comparable
 * (different step or parameter counts, no parameters or gradients: rep->why). */
int dl__train_compare(const dl_train_opts *o, const dl_train_result *a, const dl_train_result *b,
                      dl__eq_report *rep);
/* Per tensor max|a - b| / max|b| over two unsharded f64 buffers in the single-rank layout order
 * of c (max|a - b| itself for an all-zero tensor): the worst tensor's value, and its name in
 * `name` (48 bytes) when not NULL. -1 on a bad config. */
double dl__eq_worst_tensor(const dl_gpt_config *c, const double *a, const double *b, char *name);

#endif
