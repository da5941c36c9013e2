/* distlab-plan calibrate / validate (apps/plan/plan_calib.c). */
#ifndef DISTLAB_APPS_PLAN_CALIB_H
#define DISTLAB_APPS_PLAN_CALIB_H

#include <stddef.h>
#include "distlab.h"

/* argv[0] is the subcommand; the exit status (0 ok, 1 failed / goals not met, 2 usage). */
int plan_calibrate_main(int argc, char **argv);
int plan_validate_main(int argc, char **argv);
/* Model-state bytes per rank the trainer allocates in f32/f64 (rank 0; every rank alike):
 * bytes[0] params (ZeRO-3: the shard), [1] grads (ZeRO-2/3: the shard), [2] AdamW m and v (ZeRO
 * 1-3: the shard), the shard being the trainer's per-unit padded blocks. *numel: P per rank. */
void pc_state_predict(const dl_gpt_config *c, int dp, int tp, int zero, int dsize, double bytes[3],
                      size_t *numel);

/* distlab-plan search with a calibrated profile: every local layout of distlab-train's model on
 * 1 .. ranks ranks (dp x tp x pp, ZeRO 0-3 when dp > 1; pipelines run 1F1B with 2p
 * micro-batches), its predicted step time, tokens/s and largest model-state bytes per rank,
 * sorted by predicted tokens/s (the global batch differs between layouts). tier: 1, 2, ... for
 * the tie groups, a group being the rows within PC_TIE of its first row's tokens/s (predictions
 * that close do not order the layouts: validate's goal error). */
#define PC_TIE 0.15
typedef struct pc_local_row {
    int dp, tp, pp, zero, m, ranks, oversub, tier;
    double pred_ms, tokens_per_s, state_bytes;
} pc_local_row;
int pc_local_search(const dl_plan_hw *hw, const dl_gpt_config *cfg, int micro_batch, int ranks,
                    pc_local_row *rows, int cap, int *n);

#endif
