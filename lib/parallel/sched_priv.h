/* distlab (private): what the schedule files share (lib/parallel/sched*.c). */
#ifndef DISTLAB_PARALLEL_SCHED_PRIV_H
#define DISTLAB_PARALLEL_SCHED_PRIV_H

#include "distlab/sched.h"

/* Display width of a UTF-8 string (East Asian wide characters count 2). */
int dl_sched_display_width(const char *utf8);

/* A generator emits stage by stage through dl_sched_push; the first failure is kept and returned
 * by dl__gen_finish (which frees the schedule then). */
typedef struct dl__gen {
    dl_sched *s;
    int st;
} dl__gen;
int dl__gen_start(dl__gen *g, dl_sched_kind kind, int p, int m, int v, dl_sched **out);
void dl__gen_emit(dl__gen *g, int stage, int op, int mb, int chunk);
int dl__gen_finish(dl__gen *g, dl_sched **out);

/* DL_OK when vstage (p v entries) is a placement: a permutation of 0 .. p v - 1, each stage's
 * chunks in increasing order; DL_EINVAL naming the first fault otherwise. */
int dl__sched_placement_check(int p, int v, const int *vstage);

#endif
