/* distlab-plan calibrate / validate (apps/plan_calib.c). */
#ifndef DISTLAB_APPS_PLAN_CALIB_H
#define DISTLAB_APPS_PLAN_CALIB_H

#include <stddef.h>
#include "distlab.h"

/* argv[0] is the subcommand; the exit status (0 ok, 1 failed / goals not met, 2 usage). */
int plan_calibrate_main(int argc, char **argv);
int plan_validate_main(int argc, char **argv);
/* Model-state bytes per rank the trainer allocates (rank 0; every rank alike up to the padding):
 * bytes[0] params, [1] grads (the full buffer, plus ZeRO-2's reduced shard), [2] AdamW m and v
 * (the whole buffer, or the padded shard with ZeRO 1/2 and dp > 1). *numel: P per rank. */
void pc_state_predict(const dl_gpt_config *c, int dp, int tp, int zero, int dsize,
                      double bytes[3], size_t *numel);

#endif
