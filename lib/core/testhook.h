/* Private test hook: the negative controls of the equivalence tests (tests/unit/train/test_train.c,
 * test_zero.c, test_pipe.c, test_gpt.c) make a run deliberately wrong, in a known way, to prove
 * that the comparisons fail when a layout is wrong. Compiled into the library but not installed
 * and not in the public headers (tests include it as "core/testhook.h"); off unless a test
 * sets it, and then read at five places only: the collectives' argument check (lib/coll/check.c),
 * the parameters after initialisation (lib/parallel/zero_module.c), the plain runner's loss
 * gradient (lib/train/plain.c; the mixed-precision guard's test), rd's transport
 * (lib/coll/small.c; the collective tests force each of its two transports) and the channel's
 * fallbacks (lib/transport/chan.c, at configuration only; tests/unit/transport/test_chan_fallback.c).
 *
 * Set it from the test's thread before dl_world_run / dl_train_run and clear it (NULL) after:
 * the rank threads read it after they start, and only count into it (atomically). */
#ifndef DISTLAB_CORE_TESTHOOK_H
#define DISTLAB_CORE_TESTHOOK_H

#include <stdatomic.h>
#include <stddef.h>
#include "distlab/comm.h"
#include "distlab/coll.h"

typedef struct dl__test_hook {
    /* Skip the skip_nth (1-based; 0: off) reduction (all-reduce or reduce-scatter, blocking or
     * not) of purpose skip_purpose that each rank starts: the receive buffer gets the rank's own
     * input (its block of it for a reduce-scatter) and nothing is sent. Every member of a group
     * starts the same sequence of collectives, so all of them skip the same one and the run goes
     * on, with a partial sum where the layout should have reduced. */
    int skip_nth;
    dl_purpose skip_purpose;
    /* Multiply element perturb_index of world rank perturb_rank's parameters (its local layout;
     * at ZeRO stage 3 the element is perturbed in the shard, where this rank owns it) by
     * (1 + perturb_rel) once, after initialisation (0: off; f32 and f64 only). */
    double perturb_rel;
    int perturb_rank;
    size_t perturb_index;
    /* dp rank 0's first micro-batch of step nan_step (1-based; 0: off) has a NaN loss gradient:
     * the step's gradient is not finite (the plain runner only: not with pp). */
    int nan_step;
    /* rd's transport (lib/coll/small.c): 0 as the world chooses, DL__RD_EXCHANGES its log2 n
     * exchanges, DL__RD_ONE_ROUND every input in one round and rd's tree folded locally. */
    int rd_transport;
    /* The channel's fallbacks to force (DL__CHAN_*, or-ed; 0: as the machine allows), read by
     * lib/transport/chan.c when its first channel is created and by dl__chan_test_configure
     * (transport/chan.h), which tests call after setting and after clearing the hook. */
    int chan_fallbacks;
    /* out: how often each fired, summed over ranks (a control asserts it did) */
    atomic_int skipped, perturbed;
} dl__test_hook;

enum { DL__RD_EXCHANGES = 1, DL__RD_ONE_ROUND = 2 };
/* DL__CHAN_SEQ_CST: no membarrier, a full fence on both sides of the futex Dekker pair;
 * DL__CHAN_MB_FAILS: publishers without a fence and every sleeper's membarrier failing, so it
 * sleeps 50 us at a time; DL__CHAN_NO_TSC: waits timed with dl_now_ns instead of the TSC. */
enum { DL__CHAN_SEQ_CST = 1, DL__CHAN_MB_FAILS = 2, DL__CHAN_NO_TSC = 4 };

/* Install h (NULL: off); its counters are reset. */
void dl__test_hook_set(dl__test_hook *h);
/* The hook in force, or NULL. */
dl__test_hook *dl__test_hook_get(void);
/* The collectives' side: 1 when this reduction is the one to skip. *seen is the rank's count of
 * reductions of the hooked purpose so far (one counter per rank, in its context). */
int dl__test_skip_reduction(dl_purpose p, unsigned long *seen);

#endif
