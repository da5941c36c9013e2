/* The capacity-factor sweep of a mixture of experts (lecture 17 §6.3), shared by distlab-bench moe
 * and distlab-lecture 06: one training run per capacity factor at dp x ep, and what each run
 * measured (drops, imbalance, step time, all-to-all bytes, the waits at the combines). */
#ifndef DISTLAB_APPS_MOE_SWEEP_H
#define DISTLAB_APPS_MOE_SWEEP_H

#include <stddef.h>
#include "distlab.h"

/* The model, layout and run: every MLP `experts` experts (4 C wide) behind a top-k router. */
typedef struct ms_cfg {
    int dp, ep, experts, top_k, steps, layers, d_model, seq, batch;
} ms_cfg;

/* The swept capacity factors: 0.5 ... 2 and 0 (no limit), in that order. */
extern const double ms_factors[];
enum { MS_NF = 7 };

/* One factor's figures: drop = dropped / routed choices; imb = the most loaded expert over the
 * mean (routed, before drops), the mean over steps and MoE layers; ms the median step; bytes and
 * wait_ms per rank per step (the all-to-alls' bytes, the wait at the combines). */
typedef struct ms_row {
    double cap, drop, imb, ms, bytes, wait_ms;
} ms_row;

/* distlab-train's options for factor cap (f32, aux-loss 0.01, no evaluation or log). */
dl_train_opts ms_train_opts(const ms_cfg *c, double cap);
/* The figures of run r at factor cap. */
void ms_summarise(const dl_train_result *r, double cap, ms_row *w);
/* Train at factor cap into *r (the caller frees it) and summarise it into *w; a dl_status (on
 * failure *r is freed). */
int ms_run(const ms_cfg *c, double cap, ms_row *w, dl_train_result *r);
/* "0.5", ..., or "no limit" for 0. */
void ms_label(double cap, char *buf, size_t n);
/* Step s (0-based) from the admitted counts (routed - dropped) alone, deterministic: its drop
 * rate, and the idle share of the ep ranks' expert work, 1 - mean / max over the ranks of the
 * choices their experts processed (the time an under-loaded rank waits at the combine when every
 * choice costs the same), the mean over the MoE layers. */
void ms_step_load(const dl_train_result *r, int s, int ep, double *drop, double *idle);

#endif
