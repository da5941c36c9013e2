/* The shared-memory channel: an SPSC ring of slots between two ranks (see chan.h).
 *
 * Layout: the consumer polls each slot's own sequence word (one cache line carries sequence,
 * header and inline payload); the consumer's release counter `tail` lives on a separate line,
 * and the producer keeps a private cached copy of it, reloaded only when the ring looks full.
 * Counters are free-running 32-bit values (nslots is a power of two, so wrap-around is
 * harmless) and double as futex words. */
#define _GNU_SOURCE
#include "config.h"
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <linux/membarrier.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <cpuid.h>
#include <x86intrin.h>
#endif
#include "distlab.h"
#include "core/testhook.h"
#include "transport/chan.h"

/* One slot header: exactly one cache line. The consumer polls the slot's own sequence word,
 * so a message costs one cache-line transfer (header, inline payload and sequence together). The
 * payload's kind follows from its size: inline (<= DL_CHAN_INLINE), eager (<= eager), else
 * rendezvous. */
typedef struct slot_hdr {
    atomic_uint seq; /* message number + 1 once published */
    uint32_t check;
    uint64_t bytes;
    const void *ptr;
    unsigned char inl[DL_CHAN_INLINE];
} slot_hdr;
_Static_assert(sizeof(slot_hdr) == 64, "slot header must be one cache line");

typedef struct chan {
    dl_link base;
    _Alignas(64) uint32_t nslots, mask; /* read-mostly: off the counters' lines */
    size_t eager;
    slot_hdr *hdr;          /* [nslots], page-aligned */
    unsigned char *payload; /* [nslots * eager], page-aligned */

    _Alignas(64) atomic_int head_sleep; /* consumer sleeps on a slot's sequence word */
    _Alignas(64) atomic_uint tail;      /* messages released (consumer) */
    atomic_uint acq_pub;                /* rendezvous messages announced as being read */
    atomic_int tail_sleep;              /* producer sleeps on tail */

    /* producer-private */
    _Alignas(64) uint32_t p_head, p_tail_cache, p_rdv_end;
    /* consumer-private */
    _Alignas(64) uint32_t c_acq, c_tail;
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

/* The waits' clock. A wait that does not find its message at once reads a clock before and after
 * (its time goes to the link's wait counters, in ns). clock_gettime costs ~22 ns here (KVM guest,
 * vDSO over the TSC) against ~9 for rdtsc, and the read after a wait is on the exchange's critical
 * path; so on x86-64 with an invariant TSC the waits count TSC ticks, scaled to ns by a factor
 * calibrated once against CLOCK_MONOTONIC (over >= 1 ms, each end a tick read bracketed by two
 * clock reads at most 1 us apart: error <= 0.2%). Elsewhere, or if calibration fails, dl_now_ns. */
static double ns_per_tick; /* 0: the waits read dl_now_ns */

#if defined(__x86_64__)
static int tick_stamp(uint64_t *ns, uint64_t *tick)
{
    for (int i = 0; i < 100; i++) {
        uint64_t a = dl_now_ns(), t = __rdtsc(), b = dl_now_ns();
        if (b - a <= 1000) {
            *ns = a + (b - a) / 2;
            *tick = t;
            return 1;
        }
    }
    return 0;
}

static void tick_calibrate(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(0x80000007u, &a, &b, &c, &d) || !(d & (1u << 8)))
        return; /* no invariant TSC: its rate may change with the core's clock */
    uint64_t n0, t0, n1, t1;
    if (!tick_stamp(&n0, &t0))
        return;
    while (dl_now_ns() - n0 < 1000000) cpu_relax();
    if (tick_stamp(&n1, &t1) && t1 > t0 && n1 > n0)
        ns_per_tick = (double)(n1 - n0) / (double)(t1 - t0);
}
#else
static void tick_calibrate(void) {}
#endif

static inline uint64_t wait_clock(void)
{
#if defined(__x86_64__)
    if (ns_per_tick > 0)
        return __rdtsc();
#endif
    return dl_now_ns();
}

/* ns between two wait_clock() readings (0 if a migration made the ticks run backwards) */
static inline uint64_t wait_elapsed(uint64_t t0)
{
    uint64_t t1 = wait_clock();
    if (t1 <= t0)
        return 0;
    return ns_per_tick > 0 ? (uint64_t)((double)(t1 - t0) * ns_per_tick) : t1 - t0;
}

/* The publisher's store-then-check and the sleeper's flag-then-re-check form a Dekker pair, so
 * that a wake-up cannot be missed. Both sides used seq_cst (a full fence each); the publisher's
 * fence sits on every message's path and drains its store buffer there. With membarrier's
 * private expedited command (Linux >= 4.14) the pair becomes asymmetric: the publisher orders its
 * store and its check by the compiler only, and a sleeper, before its re-check, has the kernel run
 * a full barrier on every running thread of the process (membarrier(2): a compiler barrier on the
 * fast side and membarrier on the slow side give the guarantee of a fence on both), so at least
 * one of the two loads sees the other's store. Without it, seq_cst on both sides as before. */
static int asym_fence; /* 1: membarrier registered, publishers use no fence */
/* The sleepers' membarrier command; the test hook's DL__CHAN_MB_FAILS makes it one the kernel
 * rejects (EINVAL), the path of a sleeper whose membarrier fails. */
static int sleep_cmd = MEMBARRIER_CMD_PRIVATE_EXPEDITED;
/* A sleep's timeout where the wake-up is guaranteed (the Dekker pair holds): it bounds only what
 * an abort costs if a wake-up were lost. */
#define LONG_SLEEP_NS (20L * 1000 * 1000)
static long long_sleep_ns = LONG_SLEEP_NS;
/* Tests only (core/testhook.h's chan_watch): the hook whose counters watch every sleep, and
 * DL__CHAN_NO_WAKE, publishers that never wake a sleeper (a negative control). */
static dl__test_hook *watch;
static int no_wake;

/* The clock and the fence, as the machine allows, less the fallbacks the private test hook
 * (core/testhook.h) forces; read here only, when no channel is in use. */
static void chan_configure(void)
{
    dl__test_hook *h = dl__test_hook_get();
    int force = h ? h->chan_fallbacks : 0;
    watch = h && h->chan_watch ? h : NULL;
    long_sleep_ns = watch && h->chan_sleep_ms > 0 ? h->chan_sleep_ms * 1000000L : LONG_SLEEP_NS;
    no_wake = (force & DL__CHAN_NO_WAKE) != 0;
    ns_per_tick = 0;
    if (!(force & DL__CHAN_NO_TSC))
        tick_calibrate();
    asym_fence = 0;
    sleep_cmd = MEMBARRIER_CMD_PRIVATE_EXPEDITED;
    if (force & DL__CHAN_MB_FAILS) {
        asym_fence = 1;
        sleep_cmd = 1 << 30; /* no such command */
        return;
    }
    long cmds = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
    if (!(force & DL__CHAN_SEQ_CST) && cmds > 0 && (cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
        syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0)
        asym_fence = 1;
}
static pthread_once_t chan_once = PTHREAD_ONCE_INIT;

int dl__chan_test_configure(void)
{
    pthread_once(&chan_once, chan_configure);
    chan_configure();
    return (asym_fence ? 0 : DL__CHAN_SEQ_CST) |
           (sleep_cmd != MEMBARRIER_CMD_PRIVATE_EXPEDITED ? DL__CHAN_MB_FAILS : 0) |
           (ns_per_tick > 0 ? 0 : DL__CHAN_NO_TSC) | (no_wake ? DL__CHAN_NO_WAKE : 0);
}

/* Publisher: store v to *word, then tell whether the other side sleeps on it. */
static inline int publish(atomic_uint *word, uint32_t v, atomic_int *sleep_flag)
{
    if (!asym_fence) {
        atomic_store(word, v);
        return atomic_load(sleep_flag);
    }
    atomic_store_explicit(word, v, memory_order_release);
    atomic_signal_fence(memory_order_seq_cst);
    return atomic_load_explicit(sleep_flag, memory_order_relaxed);
}

/* Sleeper: raise the flag, then order it before the re-check of the word, on both sides. 0 if that
 * ordering is not guaranteed (membarrier failed, say in a child forked after registering): the
 * caller then sleeps briefly only, so a missed wake-up costs at most that. */
static inline int announce_sleep(atomic_int *sleep_flag)
{
    atomic_store(sleep_flag, 1);
    return !asym_fence || syscall(SYS_membarrier, sleep_cmd, 0, 0) == 0;
}

/* 1 if the sleep ended by its timeout */
static int futex_wait(atomic_uint *word, uint32_t val, long timeout_ns)
{
    struct timespec ts = {timeout_ns / 1000000000L, timeout_ns % 1000000000L};
    return syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, val, &ts, NULL, 0) != 0 &&
           errno == ETIMEDOUT;
}

static void futex_wake(atomic_uint *word)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* Sleep on *word while it holds v. The watch (tests) counts the sleepers of each side, from
 * past the re-check to the wake-up, and the long sleeps that ended by their timeout: where the
 * wake-up is guaranteed, a lost one. */
static void sleep_on(atomic_uint *word, uint32_t v, long timeout_ns, int side)
{
    dl__test_hook *h = watch;
    if (h) {
        atomic_fetch_add(&h->chan_asleep[side], 1);
        atomic_fetch_add(&h->chan_asleep[DL__CHAN_EITHER], 1);
    }
    int timed_out = futex_wait(word, v, timeout_ns);
    if (h) {
        if (timed_out && timeout_ns == long_sleep_ns)
            atomic_fetch_add(&h->chan_timeouts, 1);
        atomic_fetch_sub(&h->chan_asleep[DL__CHAN_EITHER], 1);
        atomic_fetch_sub(&h->chan_asleep[side], 1);
    }
}

/* A publisher found the other side asleep: wake it (never, under the test hook's
 * DL__CHAN_NO_WAKE). */
static inline void wake_sleeper(atomic_uint *word)
{
    if (!no_wake)
        futex_wake(word);
}

/* Wait until *word has reached `target` (free-running counters: (int32)(word - target) >= 0).
 * Spins (or yields) first, then sleeps on the futex with a bounded timeout so that an abort is
 * seen even if a wake-up were missed. The sleep flag and the re-check form a Dekker pair with
 * the publisher's store-then-check (publish / announce_sleep). */
static int wait_reach(atomic_uint *word, uint32_t target, atomic_int *sleep_flag,
                      const dl_waiter *w, uint64_t *wait_ns, uint64_t *sleeps, int side)
{
    int spins = w ? w->spins : 1000;
    int mode = w ? (int)w->mode : DL_WAIT_SPIN;
    int slept = 0;
    uint64_t t0 = wait_clock();
    atomic_int *abort_flag = w ? w->abort_flag : NULL;
    for (int i = 0;; i++) {
        uint32_t v = atomic_load_explicit(word, memory_order_acquire);
        if ((int32_t)(v - target) >= 0)
            break;
        if (abort_flag && atomic_load_explicit(abort_flag, memory_order_relaxed)) {
            *wait_ns += wait_elapsed(t0);
            return dl_error(DL_EABORT, "aborted while waiting on a channel");
        }
        if (i < spins) {
            if (mode == DL_WAIT_SPIN)
                cpu_relax();
            else
                sched_yield();
            continue;
        }
        long sleep_ns = announce_sleep(sleep_flag) ? long_sleep_ns : 50 * 1000;
        if (atomic_load(word) == v) {
            sleep_on(word, v, sleep_ns, side);
            slept = 1;
        }
        atomic_store_explicit(sleep_flag, 0, memory_order_relaxed);
    }
    *wait_ns += wait_elapsed(t0);
    if (slept) /* written only when it changes: the other side's line stays clean */
        (*sleeps)++;
    return DL_OK;
}

static int chan_post(dl_link *l, const dl_msg *m, const dl_waiter *w)
{
    chan *c = (chan *)l;
    uint32_t h = c->p_head;
    if (h - c->p_tail_cache >= c->nslots) {
        /* the ring looks full: slot h is free once message h - nslots was released */
        int rc = wait_reach(&c->tail, h - c->nslots + 1, &c->tail_sleep, w, &l->stats.send_wait_ns,
                            &l->stats.send_sleeps, DL__CHAN_SENDER);
        if (rc)
            return rc;
        c->p_tail_cache = atomic_load_explicit(&c->tail, memory_order_acquire);
    }
    slot_hdr *s = &c->hdr[h & c->mask];
    s->check = m->check;
    s->bytes = m->bytes;
    if (m->bytes <= DL_CHAN_INLINE) {
        if (m->bytes)
            memcpy(s->inl, m->data, m->bytes);
    } else if (m->bytes <= c->eager) {
        uint64_t t0 = dl_now_ns();
        memcpy(c->payload + (size_t)(h & c->mask) * c->eager, m->data, m->bytes);
        l->stats.copy_ns += dl_now_ns() - t0;
    } else {
        s->ptr = m->data;
        c->p_rdv_end = h + 1;
    }
    c->p_head = h + 1;
    l->stats.bytes_sent += m->bytes;
    l->stats.msgs_sent++;
    if (publish(&s->seq, h + 1, &c->head_sleep))
        wake_sleeper(&s->seq);
    return DL_OK;
}

static int chan_acquire(dl_link *l, dl_msg *m, const dl_waiter *w)
{
    chan *c = (chan *)l;
    uint32_t a = c->c_acq;
    slot_hdr *s = &c->hdr[a & c->mask];
    if (atomic_load_explicit(&s->seq, memory_order_acquire) != a + 1) {
        int rc = wait_reach(&s->seq, a + 1, &c->head_sleep, w, &l->stats.recv_wait_ns,
                            &l->stats.recv_sleeps, DL__CHAN_RECEIVER);
        if (rc)
            return rc;
    }
    m->check = s->check;
    m->bytes = s->bytes;
    if (s->bytes <= DL_CHAN_INLINE) {
        m->data = s->inl;
    } else if (s->bytes <= c->eager) {
        m->data = c->payload + (size_t)(a & c->mask) * c->eager;
    } else {
        /* Reading a lent buffer: announce it, then re-check the abort flag (a Dekker pair with
         * chan_drain). After an abort the sender only waits for announced reads, so a read that
         * is not announced in time must not happen: acknowledge everything and leave. */
        atomic_store(&c->acq_pub, a + 1);
        if (w && w->abort_flag && atomic_load(w->abort_flag)) {
            c->c_acq = c->c_tail = a + 1;
            atomic_store(&c->tail, a + 1);
            if (atomic_load(&c->tail_sleep))
                futex_wake(&c->tail);
            return dl_error(DL_EABORT, "aborted while waiting on a channel");
        }
        m->data = s->ptr;
    }
    c->c_acq = a + 1;
    l->stats.bytes_recv += m->bytes;
    l->stats.msgs_recv++;
    return DL_OK;
}

static int chan_ready(dl_link *l)
{
    chan *c = (chan *)l;
    slot_hdr *s = &c->hdr[c->c_acq & c->mask];
    return atomic_load_explicit(&s->seq, memory_order_acquire) == c->c_acq + 1;
}

static int chan_release(dl_link *l)
{
    chan *c = (chan *)l;
    if (c->c_tail == c->c_acq)
        return dl_error(DL_EINVAL, "channel %d->%d: release without an acquired message", l->src,
                        l->dst);
    c->c_tail++;
    if (publish(&c->tail, c->c_tail, &c->tail_sleep))
        wake_sleeper(&c->tail);
    return DL_OK;
}

/* Only lent (rendezvous) buffers need the receiver's acknowledgement: inline and eager
 * messages were copied, so flush waits for the last rendezvous message only. */
static int chan_flush(dl_link *l, const dl_waiter *w)
{
    chan *c = (chan *)l;
    int rc = wait_reach(&c->tail, c->p_rdv_end, &c->tail_sleep, w, &l->stats.send_wait_ns,
                        &l->stats.send_sleeps, DL__CHAN_SENDER);
    if (rc == DL_OK)
        c->p_tail_cache = atomic_load_explicit(&c->tail, memory_order_acquire);
    return rc;
}

/* After an abort: wait, ignoring the abort flag, until the receiver has released every lent
 * message it announced reading, so that the sender's caller may free its buffers. Receivers
 * release what they read without waiting on anything, so this is short; it is bounded anyway. */
static int chan_drain(dl_link *l)
{
    chan *c = (chan *)l;
    uint64_t t0 = dl_now_ns();
    for (;;) {
        uint32_t announced = atomic_load(&c->acq_pub);
        uint32_t need = (int32_t)(announced - c->p_rdv_end) < 0 ? announced : c->p_rdv_end;
        uint32_t t = atomic_load(&c->tail);
        if ((int32_t)(t - need) >= 0)
            return DL_OK;
        if (dl_now_ns() - t0 > 30ull * 1000000000ull)
            return dl_error(DL_ETIMEOUT,
                            "channel %d->%d: receiver still reading a lent buffer "
                            "30 s after an abort",
                            l->src, l->dst);
        sched_yield();
    }
}

/* The producer's posted count is 64-bit (stats) and the ring counters are 32-bit free-running:
 * released = posted - messages still in flight (at most nslots). */
static uint64_t chan_released(dl_link *l)
{
    chan *c = (chan *)l;
    uint32_t t = atomic_load_explicit(&c->tail, memory_order_acquire);
    return l->stats.msgs_sent - (uint64_t)(uint32_t)(c->p_head - t);
}

static int chan_wait_released(dl_link *l, uint64_t n, const dl_waiter *w)
{
    chan *c = (chan *)l;
    if (n > l->stats.msgs_sent)
        return dl_error(DL_EINVAL,
                        "channel %d->%d: waiting for %llu released messages of %llu "
                        "posted",
                        l->src, l->dst, (unsigned long long)n,
                        (unsigned long long)l->stats.msgs_sent);
    if (chan_released(l) >= n)
        return DL_OK;
    uint32_t target = c->p_head - (uint32_t)(l->stats.msgs_sent - n);
    return wait_reach(&c->tail, target, &c->tail_sleep, w, &l->stats.send_wait_ns,
                      &l->stats.send_sleeps, DL__CHAN_SENDER);
}

static void chan_wake(dl_link *l)
{
    chan *c = (chan *)l;
    for (uint32_t i = 0; i < c->nslots; i++) futex_wake(&c->hdr[i].seq);
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
    .ready = chan_ready,
    .release = chan_release,
    .flush = chan_flush,
    .drain = chan_drain,
    .wake = chan_wake,
    .destroy = chan_destroy,
    .released = chan_released,
    .wait_released = chan_wait_released,
};

int dl_chan_create(dl_link **out, int src, int dst, int nslots, size_t eager_bytes)
{
    *out = NULL;
    pthread_once(&chan_once, chan_configure);
    if (nslots < 2 || (nslots & (nslots - 1)))
        return dl_error(DL_EINVAL, "channel %d->%d: slot count %d is not a power of two >= 2", src,
                        dst, nslots);
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
    for (int i = 0; i < nslots; i++) atomic_init(&c->hdr[i].seq, 0);
    atomic_init(&c->tail, 0);
    atomic_init(&c->acq_pub, 0);
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
