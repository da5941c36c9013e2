/* The shared-memory channel: an SPSC ring of slots between two ranks (see chan.h).
 *
 * Layout: the producer's published counter `head` and the consumer's `tail` live on separate
 * cache lines; each side also keeps a private cached copy of the other's counter so that the
 * common case touches no shared line but the slot itself. Counters are free-running 32-bit
 * values (nslots is a power of two, so wrap-around is harmless) and double as futex words. */
#define _GNU_SOURCE
#include "config.h"
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include "distlab.h"
#include "internal.h"

enum { KIND_INLINE = 0, KIND_EAGER = 1, KIND_RDV = 2 };

/* One slot header: exactly one cache line. */
typedef struct slot_hdr {
    uint32_t check;
    uint32_t kind;
    uint64_t bytes;
    const void *ptr;
    unsigned char inl[DL_CHAN_INLINE];
} slot_hdr;
_Static_assert(sizeof(slot_hdr) == 64, "slot header must be one cache line");

typedef struct chan {
    dl_link base;
    uint32_t nslots, mask;
    size_t eager;
    slot_hdr *hdr;          /* [nslots], page-aligned */
    unsigned char *payload; /* [nslots * eager], page-aligned */

    _Alignas(64) atomic_uint head; /* messages published (producer) */
    atomic_int head_sleep;         /* consumer sleeps on head */
    _Alignas(64) atomic_uint tail; /* messages released (consumer) */
    atomic_int tail_sleep;         /* producer sleeps on tail */

    /* producer-private */
    _Alignas(64) uint32_t p_head, p_tail_cache, p_rdv_end;
    /* consumer-private */
    _Alignas(64) uint32_t c_acq, c_tail, c_head_cache;
} chan;

uint64_t dl_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static void futex_wait(atomic_uint *word, uint32_t val, long timeout_ns)
{
    struct timespec ts = {timeout_ns / 1000000000L, timeout_ns % 1000000000L};
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, val, &ts, NULL, 0);
}

static void futex_wake(atomic_uint *word)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* Wait while *word == v. Spins (or yields) first, then sleeps on the futex with a bounded
 * timeout so that an abort is seen even if a wake-up were missed. The sleep flag and the
 * re-check form a Dekker pair with the peer's store-then-check (both seq_cst). */
static int wait_ne(atomic_uint *word, uint32_t v, atomic_int *sleep_flag, const dl_waiter *w,
                   uint64_t *wait_ns)
{
    uint64_t t0 = dl_now_ns();
    int spins = w ? w->spins : 1000;
    int mode = w ? (int)w->mode : DL_WAIT_SPIN;
    atomic_int *abort_flag = w ? w->abort_flag : NULL;
    for (int i = 0;; i++) {
        if (atomic_load_explicit(word, memory_order_acquire) != v)
            break;
        if (abort_flag && atomic_load_explicit(abort_flag, memory_order_relaxed)) {
            *wait_ns += dl_now_ns() - t0;
            return dl_error(DL_EABORT, "aborted while waiting on a channel");
        }
        if (i < spins) {
            if (mode == DL_WAIT_SPIN)
                cpu_relax();
            else
                sched_yield();
            continue;
        }
        atomic_store(sleep_flag, 1);
        if (atomic_load(word) == v)
            futex_wait(word, v, 20 * 1000 * 1000);
        atomic_store_explicit(sleep_flag, 0, memory_order_relaxed);
    }
    *wait_ns += dl_now_ns() - t0;
    return DL_OK;
}

static inline void publish(atomic_uint *word, uint32_t val, atomic_int *sleep_flag)
{
    atomic_store(word, val); /* seq_cst: ordered before the sleep-flag load below */
    if (atomic_load(sleep_flag))
        futex_wake(word);
}

static int chan_post(dl_link *l, const dl_msg *m, const dl_waiter *w)
{
    chan *c = (chan *)l;
    uint32_t h = c->p_head;
    if (h - c->p_tail_cache >= c->nslots) {
        c->p_tail_cache = atomic_load_explicit(&c->tail, memory_order_acquire);
        while (h - c->p_tail_cache >= c->nslots) {
            int rc = wait_ne(&c->tail, c->p_tail_cache, &c->tail_sleep, w, &l->stats.send_wait_ns);
            if (rc)
                return rc;
            c->p_tail_cache = atomic_load_explicit(&c->tail, memory_order_acquire);
        }
    }
    slot_hdr *s = &c->hdr[h & c->mask];
    s->check = m->check;
    s->bytes = m->bytes;
    if (m->bytes <= DL_CHAN_INLINE) {
        s->kind = KIND_INLINE;
        if (m->bytes)
            memcpy(s->inl, m->data, m->bytes);
    } else if (m->bytes <= c->eager) {
        uint64_t t0 = dl_now_ns();
        s->kind = KIND_EAGER;
        memcpy(c->payload + (size_t)(h & c->mask) * c->eager, m->data, m->bytes);
        l->stats.copy_ns += dl_now_ns() - t0;
    } else {
        s->kind = KIND_RDV;
        s->ptr = m->data;
        c->p_rdv_end = h + 1;
    }
    c->p_head = h + 1;
    l->stats.bytes_sent += m->bytes;
    l->stats.msgs_sent++;
    publish(&c->head, h + 1, &c->head_sleep);
    return DL_OK;
}

static int chan_acquire(dl_link *l, dl_msg *m, const dl_waiter *w)
{
    chan *c = (chan *)l;
    uint32_t a = c->c_acq;
    if (a == c->c_head_cache) {
        c->c_head_cache = atomic_load_explicit(&c->head, memory_order_acquire);
        while (a == c->c_head_cache) {
            int rc = wait_ne(&c->head, a, &c->head_sleep, w, &l->stats.recv_wait_ns);
            if (rc)
                return rc;
            c->c_head_cache = atomic_load_explicit(&c->head, memory_order_acquire);
        }
    }
    const slot_hdr *s = &c->hdr[a & c->mask];
    m->check = s->check;
    m->bytes = s->bytes;
    switch (s->kind) {
    case KIND_INLINE: m->data = s->inl; break;
    case KIND_EAGER: m->data = c->payload + (size_t)(a & c->mask) * c->eager; break;
    default: m->data = s->ptr; break;
    }
    c->c_acq = a + 1;
    l->stats.bytes_recv += m->bytes;
    l->stats.msgs_recv++;
    return DL_OK;
}

static int chan_release(dl_link *l)
{
    chan *c = (chan *)l;
    if (c->c_tail == c->c_acq)
        return dl_error(DL_EINVAL, "channel %d->%d: release without an acquired message",
                        l->src, l->dst);
    c->c_tail++;
    publish(&c->tail, c->c_tail, &c->tail_sleep);
    return DL_OK;
}

/* Only lent (rendezvous) buffers need the receiver's acknowledgement: inline and eager
 * messages were copied, so flush waits for the last rendezvous message only. */
static int chan_flush(dl_link *l, const dl_waiter *w)
{
    chan *c = (chan *)l;
    uint32_t need = c->p_rdv_end;
    for (;;) {
        uint32_t t = atomic_load_explicit(&c->tail, memory_order_acquire);
        c->p_tail_cache = t;
        if ((int32_t)(t - need) >= 0)
            return DL_OK;
        int rc = wait_ne(&c->tail, t, &c->tail_sleep, w, &l->stats.send_wait_ns);
        if (rc)
            return rc;
    }
}

static void chan_wake(dl_link *l)
{
    chan *c = (chan *)l;
    futex_wake(&c->head);
    futex_wake(&c->tail);
}

static void chan_destroy(dl_link *l)
{
    chan *c = (chan *)l;
    free(c->hdr);
    free(c->payload);
    free(c);
}

static const dl_link_ops chan_ops = {
    .post = chan_post,
    .acquire = chan_acquire,
    .release = chan_release,
    .flush = chan_flush,
    .wake = chan_wake,
    .destroy = chan_destroy,
};

int dl_chan_create(dl_link **out, int src, int dst, int nslots, size_t eager_bytes)
{
    *out = NULL;
    if (nslots < 2 || (nslots & (nslots - 1)))
        return dl_error(DL_EINVAL, "channel %d->%d: slot count %d is not a power of two >= 2",
                        src, dst, nslots);
    chan *c;
    if (posix_memalign((void **)&c, 64, sizeof *c))
        return dl_error(DL_ENOMEM, "channel %d->%d: out of memory", src, dst);
    memset(c, 0, sizeof *c);
    c->base.ops = &chan_ops;
    c->base.src = src;
    c->base.dst = dst;
    c->nslots = (uint32_t)nslots;
    c->mask = (uint32_t)nslots - 1;
    /* eager payloads rounded to whole pages so that each starts page-aligned (memcpy trap) */
    c->eager = eager_bytes ? (eager_bytes + 4095) & ~(size_t)4095 : 0;
    if (posix_memalign((void **)&c->hdr, 4096, sizeof(slot_hdr) * (size_t)nslots) ||
        (c->eager && posix_memalign((void **)&c->payload, 4096, c->eager * (size_t)nslots))) {
        free(c->hdr);
        free(c);
        return dl_error(DL_ENOMEM, "channel %d->%d: out of memory for %d slots", src, dst, nslots);
    }
    memset(c->hdr, 0, sizeof(slot_hdr) * (size_t)nslots);
    atomic_init(&c->head, 0);
    atomic_init(&c->tail, 0);
    atomic_init(&c->head_sleep, 0);
    atomic_init(&c->tail_sleep, 0);
    *out = &c->base;
    return DL_OK;
}

void dl_link_destroy(dl_link *l)
{
    if (l)
        l->ops->destroy(l);
}
