/* Private test hook: the negative controls of the equivalence tests (tests/unit/train/test_train.c,
 * test_zero.c, test_pipe.c, test_gpt.c) make a run deliberately wrong, in a known way, to prove
 * that the comparisons fail when a layout is wrong; the transport's tests force its fallbacks and
 * watch its sleeps, so that a test can force a wait to sleep instead of hoping a delay does.
 * Compiled into the library but not installed and not in the public headers (tests include it as
 * "core/testhook.h"); off unless a test sets it, and then read at these places only: the
 * collectives' argument check (lib/coll/check.c), the parameters after initialisation
 * (lib/parallel/zero_module.c), the plain runner's loss gradient (lib/train/plain.c; the
 * mixed-precision guard's test), rd's transport (lib/coll/small.c; the collective tests force each
 * of its two transports) and the channel's fallbacks and sleep watch (lib/transport/chan.c, at
 * configuration only; tests/unit/transport/, and the tests that force a rank asleep through
 * tests/unit/testutil.h's tu_chan_watch), and the full-state checkpoints' saves and resume
 * (lib/io/ckdir_save.c: a crash mid-save, the crash points, a full disk; lib/train/state.c),
 * and the model's token slices (lib/model/gpt.c: slices without their key/value cache).
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
    /* The channels' sleeps watched (lib/transport/chan.c, read at configuration like the
     * fallbacks): with chan_watch set, chan_asleep[DL__CHAN_RECEIVER] and [DL__CHAN_SENDER] count
     * the threads now asleep on a channel's futex ([DL__CHAN_EITHER] both together), from past their re-check of the word to their
     * wake-up (a test that waits for one and then publishes has forced that wait to sleep), and
     * chan_timeouts the sleeps that ended by their long timeout (20 ms, or chan_sleep_ms if > 0)
     * instead of a wake-up: where the Dekker pair holds (not DL__CHAN_MB_FAILS), a lost wake-up
     * or a peer that stalled that long. Clear the hook and reconfigure before it goes out of
     * scope: the channels keep a pointer to it. */
    int chan_watch, chan_sleep_ms;
    atomic_int chan_asleep[3], chan_timeouts;
    /* Full-state checkpoints: the save of step ckpt_die_at_step (0: off) has rank 0 call
     * _exit(99) once every file is written, before the manifest (lib/io/ckdir_save.c): a process
     * killed during a save, its temporary directory left behind. ckpt_skip_moments: a resume
     * leaves AdamW's moments and step at zero (lib/train/state.c), the negative control of the
     * bitwise resume. */
    int ckpt_die_at_step, ckpt_skip_moments;
    /* Crash points: in the save of step ckpt_crash_step (0: off), every boundary of its I/O
     * (before and after the temporary's mkdir, each file's write and fsync, the manifest's
     * write and fsync, the directory's fsync, the rename, the parent's fsync) counts into
     * ckpt_points (over the process's ranks), and the ckpt_crash_at-th (1-based; 0: count only)
     * calls _exit(99) (lib/io/ckdir_save.c). A full disk: the file write of world rank
     * ckpt_enospc_rank in the save of step ckpt_enospc_step (0: off) fails with ENOSPC after
     * its header, the file left short. */
    int ckpt_crash_step, ckpt_crash_at;
    atomic_int ckpt_points;
    int ckpt_enospc_step, ckpt_enospc_rank;
    /* Token slices (lib/model/gpt.c, dl_gpt_slot_slice): every slice placed runs without the
     * key/value cache, its attention seeing its own positions only (counted in skipped) */
    int tera_skip_cache;
    /* out: how often each fired, summed over ranks (a control asserts it did) */
    atomic_int skipped, perturbed;
} dl__test_hook;

enum { DL__RD_EXCHANGES = 1, DL__RD_ONE_ROUND = 2 };
/* DL__CHAN_SEQ_CST: no membarrier, a full fence on both sides of the futex Dekker pair;
 * DL__CHAN_MB_FAILS: publishers without a fence and every sleeper's membarrier failing, so it
 * sleeps 50 us at a time; DL__CHAN_NO_TSC: waits timed with dl_now_ns instead of the TSC. */
enum { DL__CHAN_SEQ_CST = 1, DL__CHAN_MB_FAILS = 2, DL__CHAN_NO_TSC = 4, DL__CHAN_NO_WAKE = 8 };
/* DL__CHAN_NO_WAKE: publishers never wake a sleeper (an abort still does), so every sleep ends
 * by its timeout: the negative control of the lost-wake-up checks. The sides of chan_asleep: */
enum { DL__CHAN_RECEIVER = 0, DL__CHAN_SENDER = 1, DL__CHAN_EITHER = 2 };

/* Install h (NULL: off); its counters are reset. */
void dl__test_hook_set(dl__test_hook *h);
/* The hook in force, or NULL. */
dl__test_hook *dl__test_hook_get(void);
/* The collectives' side: 1 when this reduction is the one to skip. *seen is the rank's count of
 * reductions of the hooked purpose so far (one counter per rank, in its context). */
int dl__test_skip_reduction(dl_purpose p, unsigned long *seen);

#endif
