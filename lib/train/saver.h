/* A rank's full-state saves over the run (train/saver.c): the save begun at a step boundary
 * from a snapshot, its file written by the rank's writer thread (io/ckdir_writer.h) while
 * training goes on, its collective phases (io/ckdir.h) run at later step boundaries once every
 * rank's writer is done, as the boundary's agreement finds. ckpt.sync: the whole save at its
 * boundary. Every rank makes the same calls at the same boundaries. */
#ifndef DISTLAB_TRAIN_SAVER_H
#define DISTLAB_TRAIN_SAVER_H
#include "io/ckdir.h"
#include "train/compose.h"

typedef struct tr_saver tr_saver;

/* The saver of rank e on ck, its checkpoint communicator. */
int tr_saver_create(tr_env *e, dl_comm *ck, tr_saver **out);
/* its checkpoint communicator (the state hash's all-reduce runs on it too) */
dl_comm *tr_saver_comm(const tr_saver *s);
/* Every step boundary: the agreed stop request (*sig, 0: none) and, with a save in flight whose
 * writers are all done, its next phase; one all-reduce. */
int tr_saver_boundary(tr_saver *s, int *sig);
/* Save the state after `step` steps: a's shard (taken over: the saver frees it) and manifest
 * (rank 0). The previous save is finished first; then the shard is copied into the snapshot
 * (ckpt.sync: not) and its file posted to the writer. */
int tr_saver_start(tr_saver *s, dl__ckd_save_args *a);
/* Finish the save in flight, if any: before the next one, or (end) at the run's end or a stop,
 * where the wait holds no training up and is not counted as the save's stall. */
int tr_saver_drain(tr_saver *s, int end);
/* Wait for the writer (no collective: after a failure the peers may be gone), free. */
void tr_saver_destroy(tr_saver *s);
#endif
