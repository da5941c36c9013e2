/* distlab (private): acting on an injected fault (core/fault_spec.h) in the rank that it names:
 * the trainer asks at the start of every step, the collectives before each one begins
 * (lib/coll/dispatch.c, on whichever thread runs it: the sequence it counts is the
 * communicator's, the same on every member whatever thread runs it). */
#ifndef DISTLAB_RUNTIME_FAULT_H
#define DISTLAB_RUNTIME_FAULT_H

#include "distlab.h"
#include "core/fault_spec.h"

/* The process's fault (copied; NULL: none). Set before the world runs, cleared after. */
void dl__fault_install(const dl__fault *f);
/* Label a communicator (dp, tp, pp) for at=coll; the world's is its own. */
void dl__comm_set_label(dl_comm *c, dl__comm_label label);
/* World rank `rank` of ctx x starts training step `step`: DL_OK, or the fault's error. */
int dl__fault_step(dl_ctx *x, int step);
/* c is about to begin a collective: DL_OK, or the fault's error. */
int dl__fault_op(dl_comm *c, int op);

#endif
