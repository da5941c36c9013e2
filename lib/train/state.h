/* The trainer's full state in checkpoints (train/state.c; the directory format: io/ckdir.h,
 * docs/CHECKPOINTS.md): what a rank saves (its parameters' pieces, AdamW's moments of its shard,
 * its counters), the manifest's fields, the resume, the stop request. */
#ifndef DISTLAB_TRAIN_STATE_H
#define DISTLAB_TRAIN_STATE_H
#include <jansson.h>
#include "parallel/module.h"
#include "train/compose.h"

/* The caller's thread, before the ranks start: with ckpt.resume, find the checkpoint, read and
 * verify its manifest and files (checksums), check the options against it (refusing, naming
 * the field); R->resume, R->resume_dir and R->start set. */
int tr_ckpt_prepare(tr_run *R);
void tr_ckpt_close(tr_run *R);

/* Each rank after tr_setup, when resuming, under any layout (train/state_reshard.c): its
 * parameters and moments from the byte ranges of the checkpoint's files that hold them, Adam's
 * step and the counters; then the state hash of what every rank loaded against the manifest's
 * (collective over the world: DL_EINVAL naming the tensor when it differs). */
int tr_ckpt_restore(tr_env *e, tr_comp *c);
/* Collective over comm: the layout-independent state hash of the ranks' parameters (params: the
 * rank's flat buffer in the export type) and moments; st, this rank's status so far, goes round
 * with it (any rank's failure: every rank returns one). Rank 0 of comm: *out, the manifest's
 * "state_hash" (docs/CHECKPOINTS.md); others NULL. */
int tr_state_hash(tr_env *e, tr_comp *c, dl_comm *comm, const void *params, int st, json_t **out);

/* The stop request (dl_train_request_stop's signal, 0: none); train/saver.c agrees on it. */
int tr_ckpt_stop_requested(void);
/* Each rank: the checkpoint of the state after `step` steps (skipped of them skipped), handed
 * to the rank's saver (train/saver.h). */
struct tr_saver;
int tr_ckpt_save(tr_env *e, tr_comp *c, struct tr_saver *sv, int step, int skipped);
#endif
