/* distlab: the pipeline engine — runs a schedule's action lists (include/distlab/sched.h) on the
 * stages of a pipeline group, with real hand-offs through the channels.
 *
 * Each rank of the pp group is one stage; it walks its own action list in order. Before F(j, c)
 * it receives the input activation from the previous virtual stage, after it sends the output to
 * the next one; before B(j, c) it receives the gradient of that output from the next virtual
 * stage, after it sends the gradient of the input back. A split backward's I(j, c) moves what
 * B(j, c) moves; its W(j, c) moves nothing. Hand-offs follow the schedule's placement table
 * (dl_sched_peers): with the loop placement chunk c of stage s is virtual stage c·p + s
 * (Megatron's interleaving: stage p-1's chunk c hands on to stage 0's chunk c+1); with ZB-V's V
 * placement the turn from virtual stage p-1 to p stays on stage p-1, copied within the stage.
 *
 * What moves and what is computed is the caller's (dl_pipe_ops): the trainer plugs in the GPT
 * stage, the harness sleeps or spins. Sends never block on the receiver (dl_isend of a staging
 * copy), so no order of actions that the schedule validator accepts can deadlock; activations
 * and gradients travel on two communicators (duplicates of the pp group), so each link carries
 * one kind in one order, and every message is tagged with (kind, micro-batch, chunk) so that a
 * receiver expecting another is an error (DL_EMISMATCH), not a silent mix-up.
 *
 * Every action is timed; with a trace (include/distlab/trace.h) each becomes an event of the
 * rank's track, with the step's span, so the measured bubble is 1 - busy / wall of that span. */
#ifndef DISTLAB_PIPE_H
#define DISTLAB_PIPE_H

#include <stddef.h>
#include <stdint.h>
#include "distlab/comm.h"
#include "distlab/sched.h"

#ifdef __cplusplus
extern "C" {
#endif

struct dl_trace;

typedef struct dl_pipe_ops {
    /* Where F(mb, chunk)'s input activation is received (count elements); called only when
     * that input comes from another stage. */
    void *(*fwd_in)(void *arg, int mb, int chunk);
    /* Run F(mb, chunk); *out = its output activation, to be sent on (count elements; left
     * NULL at the last virtual stage). The engine copies it before the next callback. */
    int (*fwd)(void *arg, int mb, int chunk, const void **out);
    /* Where B(mb, chunk)'s output gradient is received; not called at the last virtual
     * stage (its backward starts from the loss). */
    void *(*bwd_in)(void *arg, int mb, int chunk);
    /* Run B(mb, chunk); *din = the gradient of its input, to be sent back (left NULL at
     * virtual stage 0). Copied before the next callback. */
    int (*bwd)(void *arg, int mb, int chunk, const void **din);
    /* The optimizer step (mb as in the action: -1 for a flush). May be NULL (no-op). */
    int (*opt)(void *arg, int mb);
} dl_pipe_ops;

/* A split backward (schedules with I and W actions): I(mb, chunk) as bwd (its output gradient
 * received at bwd_in, *din sent back), computing the input gradient only; W(mb, chunk) the
 * weight gradients, with no hand-off. Same arg as dl_pipe_ops. */
typedef struct dl_pipe_split_ops {
    int (*bwd_input)(void *arg, int mb, int chunk, const void **din);
    int (*bwd_weight)(void *arg, int mb, int chunk);
} dl_pipe_split_ops;

typedef struct dl_pipe dl_pipe;

/* Collective over pp (every member calls it): a stage's engine for hand-offs of `count`
 * elements of type t; staging buffers come from `arena` (category comm; NULL: malloc).
 * pp may have one rank (then schedules must have p = 1 and v = 1). */
int dl_pipe_create(dl_comm *pp, size_t count, dl_dtype t, dl_arena *arena, dl_pipe **out);
/* Collective too: every stage must have finished its steps. */
void dl_pipe_destroy(dl_pipe *e);
/* The callbacks of I and W actions (kept by pointer; NULL: none, and a schedule with I or W
 * actions on this stage is refused by dl_pipe_run). */
void dl_pipe_set_split(dl_pipe *e, const dl_pipe_split_ops *split);
/* open = 1: the next dl_pipe_run continues this one's schedule (the continuous async pipeline's
 * per-step slices, dl_sched_async_step): a run then returns after its last action, leaving its
 * last sends in flight for the neighbours' next runs to take. open = 0 (the default): a run
 * waits for them (a quiet point). dl_pipe_destroy still waits for any left in flight. */
void dl_pipe_set_open(dl_pipe *e, int open);

typedef struct dl_pipe_stats {
    uint64_t wall_ns;      /* the step on this stage: first action's start to last action's end */
    uint64_t busy_ns;      /* inside fwd and bwd callbacks */
    uint64_t recv_ns;      /* waiting for and copying received hand-offs */
    uint64_t send_ns;      /* staging copies and posting sends (and waiting for staging) */
    uint64_t opt_ns;       /* inside opt */
    uint64_t engine_ns;    /* the rest: dispatch and bookkeeping (wall - busy - recv - send -
                             * opt - drain) */
    int actions;           /* actions run */
    int fwd, bwd;          /* of which forwards, backwards */
    size_t staging_bytes;  /* staging buffers held (their peak so far) */
    uint64_t bytes_sent;   /* hand-off bytes this stage sent in the step */
    uint64_t chan_wait_ns; /* of the hand-offs' time, waiting on the channels (the channel
                             * counters: a peer not there yet), the rest being copies */
    uint64_t sleeps;       /* waits that slept on a futex rather than spinning or yielding */
    uint64_t drain_ns;     /* after the last action, waiting for this stage's last sends to be
                             * received (a neighbour still busy): waiting, not overhead */
} dl_pipe_stats;

/* Run this stage's actions of s (s->p must equal the pp group's size; validate schedules
 * first: dl_sched_validate) and wait until every send of the step was received (unless the
 * engine is open: dl_pipe_set_open). `step` labels
 * the trace events. With trace != NULL, events go to track trace_rank. On failure the world is
 * aborted and the error names the stage, the action and what failed. st may be NULL. */
int dl_pipe_run(dl_pipe *e, const dl_sched *s, const dl_pipe_ops *ops, void *arg, int step,
                struct dl_trace *trace, int trace_rank, dl_pipe_stats *st);

/* The peers of stage `stage` for an action under the loop placement (c·p + s): the rank F(j, c)
 * receives from (-1: none) and sends to (-1: none); B the reverse. For users that move data
 * themselves and for tests; dl_sched_peers follows any schedule's placement. */
void dl_pipe_peers(int p, int v, int stage, int chunk, int *prev, int *next);

#ifdef __cplusplus
}
#endif
#endif
