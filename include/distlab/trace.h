/* distlab: per-rank event traces: what the pipeline engine and the trainer did,
 * when, on which rank — the measured counterpart of lib/parallel/sched.c's simulated schedules.
 *
 * Each rank records into its own buffer, allocated once at creation (page-aligned, padded to
 * whole cache lines, with its counters on a cache line of their own), so that recording is an
 * index check and a store: no locks, no atomics, no sharing between ranks. When a rank's buffer is
 * full, further events of that rank are dropped and counted (dl_trace_dropped).
 *
 * Times are nanoseconds of dl_now_ns() (CLOCK_MONOTONIC). The analyses work per step: a rank's
 * DL_TR_STEP event of step k is the window; every event of that rank overlapping the window counts
 * (clipped to it), whatever its own `step` field says.
 *
 * Functions that can fail return a dl_status code and leave a message (dl_errmsg). */
#ifndef DISTLAB_TRACE_H
#define DISTLAB_TRACE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Monotonic clock in nanoseconds (CLOCK_MONOTONIC): the clock of every trace event. */
uint64_t dl_now_ns(void);

typedef enum dl_trace_kind {
    DL_TR_FWD = 0,       /* forward of (mb, chunk) */
    DL_TR_BWD = 1,       /* backward of (mb, chunk) */
    DL_TR_SEND = 2,      /* posting a point-to-point send */
    DL_TR_RECV_WAIT = 3, /* waiting for / copying a received activation or gradient */
    DL_TR_OPT = 4,       /* optimizer step */
    DL_TR_COMM = 5,      /* a collective (gradient all-reduce etc.) */
    DL_TR_STEP = 6,      /* one whole training step (the span the bubble is measured over) */
    DL_TR_OTHER = 7,
    DL_TR_WGT = 8, /* a split backward's weight gradient W of (mb, chunk); its input part I
                          * is a DL_TR_BWD. Counted busy as forwards and backwards are */
    /* a mixture-of-experts layer's forward all-to-alls (chunk: the model layer), the wait for
     * the other ranks included: the combine's is each rank's idle time while the busiest
     * experts finish (dl_train_step's combine_wait_ms sums these very intervals) */
    DL_TR_MOE_DISPATCH = 9,
    DL_TR_MOE_COMBINE = 10,
    DL_TR_NKINDS
} dl_trace_kind;

typedef struct dl_trace_event {
    uint64_t t0, t1; /* ns, dl_now_ns() clock; t1 >= t0 is the caller's business (a reversed
                      * event counts as empty) */
    int32_t step, mb;
    int16_t chunk, kind;
} dl_trace_event;

typedef struct dl_trace dl_trace;

/* A trace for ranks 0 .. nranks-1 with room for events_per_rank events each (>= 1). */
int dl_trace_create(int nranks, size_t events_per_rank, dl_trace **out);
void dl_trace_destroy(dl_trace *t);

/* Record one event for `rank`; called only by that rank's thread (no locks, no atomics on the hot
 * path; each rank's buffer on its own cache lines). When the buffer is full the event is dropped
 * and counted. t may be NULL (then nothing happens); a rank out of range is ignored. */
void dl_trace_add(dl_trace *t, int rank, int kind, int step, int mb, int chunk, uint64_t t0,
                  uint64_t t1);

/* Events recorded by `rank` (0 for a NULL trace or a rank out of range), in recording order. */
size_t dl_trace_count(const dl_trace *t, int rank);
const dl_trace_event *dl_trace_events(const dl_trace *t, int rank);
uint64_t dl_trace_dropped(const dl_trace *t, int rank);
int dl_trace_nranks(const dl_trace *t);
size_t dl_trace_capacity(const dl_trace *t); /* events per rank */

/* Forget every rank's events and drop counts; between runs, by one thread while ranks are quiet. */
void dl_trace_clear(dl_trace *t);

/* Model chunks per stage of the run being traced (default 1): with v > 1 the Chrome event names
 * carry the chunk ("F3.0"), as dl_sched_action_str writes them. */
void dl_trace_set_chunks(dl_trace *t, int v);

/* ---- timing a region (the caller's thread must be `rank`'s) ---------------------------------
 *
 *     uint64_t t0 = dl_trace_begin(tr);
 *     ... forward of micro-batch j ...
 *     dl_trace_end(tr, rank, DL_TR_FWD, step, j, 0, t0);
 *
 * With a NULL trace neither reads the clock. */
static inline uint64_t dl_trace_begin(const dl_trace *t) { return t ? dl_now_ns() : 0; }
static inline void dl_trace_end(dl_trace *t, int rank, int kind, int step, int mb, int chunk,
                                uint64_t t0)
{
    if (t)
        dl_trace_add(t, rank, kind, step, mb, chunk, t0, dl_now_ns());
}

/* ---- analyses ---------------------------------------------------------------------------- */

/* Measured bubble of `rank` over step `step`: wall = the rank's DL_TR_STEP event of that step
 * (DL_EINVAL if absent; the first one if recorded twice), busy = total length of the union of its
 * FWD and BWD events inside it (overlaps counted once, parts outside the window clipped),
 * bubble = 1 - busy / wall (0 for an empty window). Any output pointer may be NULL. */
int dl_trace_bubble(const dl_trace *t, int rank, int step, double *bubble, double *busy_ns,
                    double *wall_ns);

/* Where the time of `rank` in step `step` went: ns[k] = length of the union of its events of kind
 * k inside the step's window (so ns[DL_TR_STEP] = the wall time). Kinds may overlap one another
 * (a collective recorded inside a backward counts in both). DL_EINVAL without a STEP event. */
int dl_trace_breakdown(const dl_trace *t, int rank, int step, double ns[DL_TR_NKINDS]);

/* ---- output ------------------------------------------------------------------------------ */

/* Chrome trace JSON: {"traceEvents":[...]} of "X" complete events, ts/dur in microseconds with 3
 * decimals from the earliest recorded event, pid 0, tid = rank, "M" thread_name metadata
 * "rank R" (or names[rank] when names != NULL), args {step, mb, chunk}; opens in Perfetto and
 * chrome://tracing. Event names: "F3", "B3" (with ".c" when chunk > 0 or dl_trace_set_chunks
 * gave v > 1), "send", "recv-wait", "opt", "comm", "step", "other". Written atomically (a
 * temporary file next to `path`, then rename); DL_ESYS naming the path on failure. */
int dl_trace_write_chrome(const dl_trace *t, const char *path, const char *const *names);

/* The measured timeline as the lecture's ASCII grid for step `step` (dl_sched_grid's
 * conventions): one line per rank, "GPU 1  " for rank 0 (the number padded to the width of the
 * largest), then one character per unit_ns of time from the earliest STEP start of that step to
 * the latest STEP end (rounded up to whole cells). A cell shows what covers most of it: a
 * forward's micro-batch digit ('0'..'9', 'A'..'Z', then '+'), a backward's letter ('a'..'z', then
 * '-'), '*' for an optimizer step, '=' for a collective, or U+00B7 '·' for idle — time not
 * covered by those four kinds (sends, receive waits and other events are not drawn: waiting is
 * the bubble). Ties go to the lower kind, then the earlier event; an event ties with idle and
 * wins. DL_EINVAL when no rank has a STEP event of that step, unit_ns is 0, or the grid would be
 * wider than 1e6 cells. *out is malloc'd, each line ending in '\n'. */
int dl_trace_grid(const dl_trace *t, int step, uint64_t unit_ns, char **out);
/* dl_trace_grid, and *hidden (when not NULL): how many of the step's forwards, backwards and
 * optimizer steps no cell shows (shorter than the unit next to longer ones, they lose every cell
 * they touch): 0 means every action is in the grid. */
int dl_trace_grid_hidden(const dl_trace *t, int step, uint64_t unit_ns, char **out, int *hidden);
/* Every forward, backward and optimizer step of step `step`, per rank in start order, as the
 * grid's symbols separated by spaces ("GPU 1  0 1 a 2 b c *"): the order the grid shows when its
 * cells do not merge actions. DL_EINVAL when no rank recorded one. *out is malloc'd. */
int dl_trace_actions(const dl_trace *t, int step, char **out);

/* Short name of a kind ("fwd", "bwd", "send", "recv-wait", "opt", "comm", "step", "other"). */
const char *dl_trace_kind_name(int kind);

#ifdef __cplusplus
}
#endif
#endif
