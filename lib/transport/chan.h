/* distlab (private): channels and links.
 *
 * A link is one direction of a connection between two ranks: one sending end, one receiving
 * end. Collectives touch links only through dl_link_ops, so that a transport for many machines
 * (MPI) adds a link type without touching the algorithms.
 *
 * The shared-memory link is a channel: a single-producer single-consumer ring of fixed-size
 * slots (power-of-two count). The consumer polls each slot's own 32-bit sequence word (one cache
 * line carries sequence, header and inline payload); the consumer's release counter lives on a
 * separate cache line and the producer keeps a private cached copy of it, reloaded only when the
 * ring looks full; release on publish, acquire on observe. A message travels
 *   - inline in the header when it has at most DL_CHAN_INLINE bytes;
 *   - eagerly, copied into the slot's payload area, when it fits in `eager_bytes`;
 *   - by rendezvous otherwise: the header carries a pointer to the sender's buffer, the
 *     receiver reads it in place (single copy) and releases the slot, which is the
 *     acknowledgement. The sender must not modify a lent buffer until dl_link_flush() returns.
 * Either way the same bytes cross the link and are counted.
 *
 * Waiting spins (with pause) and then sleeps on a futex when ranks fit the cores; when ranks
 * exceed the cores it yields instead of spinning, then sleeps. Every wait polls the abort flag. */
#ifndef DISTLAB_TRANSPORT_CHAN_H
#define DISTLAB_TRANSPORT_CHAN_H

#include <stddef.h>
#include <stdint.h>
#include <stdatomic.h>
#include "distlab/trace.h" /* dl_now_ns */
#include "distlab/world.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DL_CHAN_INLINE 40

typedef enum dl_wait_mode {
    DL_WAIT_SPIN = 0, /* spin with pause, then futex (ranks fit the cores) */
    DL_WAIT_YIELD = 1 /* sched_yield, then futex (ranks exceed the cores) */
} dl_wait_mode;

/* How a rank waits: shared by all the links a rank's thread uses. */
typedef struct dl_waiter {
    dl_wait_mode mode;
    int spins;              /* pause iterations (SPIN) or yields (YIELD) before sleeping */
    atomic_int *abort_flag; /* non-zero: leave every wait with DL_EABORT (may be NULL) */
} dl_waiter;

/* One message as seen by either end. */
typedef struct dl_msg {
    const void *data; /* sender: bytes to send; receiver: where they can be read */
    size_t bytes;
    uint32_t check; /* caller's fingerprint (collective, sequence, type); compared by receivers */
} dl_msg;

typedef struct dl_link_stats {
    /* The sender's counters and the receiver's each on a cache line of their own: both sides
     * write theirs on every message, and sharing a line cost about a hop per exchange. */
    _Alignas(64) uint64_t bytes_sent, msgs_sent;
    uint64_t send_wait_ns; /* sender: time waiting for a free slot or for the receiver (flush) */
    uint64_t copy_ns;      /* sender: time copying payload into slots (eager) */
    uint64_t send_sleeps;  /* sender: waits that went to sleep on the futex (the rest spun or
                            * yielded their way through) */
    _Alignas(64) uint64_t bytes_recv, msgs_recv;
    uint64_t recv_wait_ns; /* receiver: time waiting for a message */
    uint64_t recv_sleeps;  /* receiver: the same */
} dl_link_stats;

typedef struct dl_link dl_link;

typedef struct dl_link_ops {
    /* Sender: post one message. Inline and eager messages are copied before return; larger
     * ones are lent (rendezvous) until flush. Blocks while the ring is full. */
    int (*post)(dl_link *l, const dl_msg *m, const dl_waiter *w);
    /* Receiver: wait for the next message not yet acquired; m->data points at its bytes,
     * valid until the matching release. Several may be acquired before releasing (FIFO). */
    int (*acquire)(dl_link *l, dl_msg *m, const dl_waiter *w);
    /* Receiver: nonzero when the next message not yet acquired has arrived, so that acquire
     * will not wait for it (never waits itself; what the point-to-point requests poll). */
    int (*ready)(dl_link *l);
    /* Receiver: release the oldest acquired message (its slot returns to the sender). */
    int (*release)(dl_link *l);
    /* Sender: wait until the receiver released every lent (rendezvous) message, so the sender may
     * reuse its buffers; inline and eager messages were copied and are not waited for. */
    int (*flush)(dl_link *l, const dl_waiter *w);
    /* Sender, after an abort or a failed call: wait (ignoring the abort flag) until the
     * receiver no longer reads any buffer lent to it, so the caller may free its buffers
     * (DL_ETIMEOUT after 30 s). */
    int (*drain)(dl_link *l);
    /* Wake any thread sleeping on this link (used on abort). */
    void (*wake)(dl_link *l);
    void (*destroy)(dl_link *l);
    /* Sender: messages of this link (all kinds) the receiver has released so far; message k
     * (0-based, in posting order) is done with once released > k. */
    uint64_t (*released)(dl_link *l);
    /* Sender: wait until released >= n (n no larger than the messages posted). */
    int (*wait_released)(dl_link *l, uint64_t n, const dl_waiter *w);
} dl_link_ops;

struct dl_link {
    const dl_link_ops *ops;
    dl_link_stats stats; /* sender fields written by the sender, receiver fields by the receiver;
                          * 64-byte aligned: allocate links with posix_memalign */
    int src, dst;        /* world ranks */
    int inter;           /* src and dst on different nodes (set by the communicator that
                          * creates the link, before it is shared): the inter-node counters */
};

static inline int dl_link_post(dl_link *l, const dl_msg *m, const dl_waiter *w)
{
    return l->ops->post(l, m, w);
}
static inline int dl_link_acquire(dl_link *l, dl_msg *m, const dl_waiter *w)
{
    return l->ops->acquire(l, m, w);
}
static inline int dl_link_ready(dl_link *l) { return l->ops->ready(l); }
static inline int dl_link_release(dl_link *l) { return l->ops->release(l); }
static inline int dl_link_flush(dl_link *l, const dl_waiter *w) { return l->ops->flush(l, w); }
static inline uint64_t dl_link_released(dl_link *l) { return l->ops->released(l); }
static inline int dl_link_wait_released(dl_link *l, uint64_t n, const dl_waiter *w)
{
    return l->ops->wait_released(l, n, w);
}

/* Create a shared-memory channel link from world rank `src` to `dst` with `nslots` slots (a power
 * of two, >= 2) of `eager_bytes` payload each (0: inline or rendezvous only). */
int dl_chan_create(dl_link **out, int src, int dst, int nslots, size_t eager_bytes);
void dl_link_destroy(dl_link *l);

/* Tests only: re-read the private test hook's channel fallbacks (core/testhook.h) from the
 * test's thread while no channel is in use, and return the DL__CHAN_* fallbacks now in force
 * (those forced, and those the machine imposes). */
int dl__chan_test_configure(void);

/* How a rank's threads wait (lib/runtime/world.c). */
const dl_waiter *dl_ctx_waiter(const dl_ctx *c);

#ifdef __cplusplus
}
#endif
#endif
