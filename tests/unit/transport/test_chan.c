/* Channel tests: a two-thread stress test (millions of messages in the full tier, random sizes
 * across inline, eager and rendezvous, wrap-around of the 32-bit counters' slot index), FIFO
 * order and content checked against a formula, both wait modes, and abort while waiting. */
#include "../testutil.h"
#include <check.h>
#include <pthread.h>
#include <unistd.h>
#include "transport/chan.h"

#define NBUF 64 /* > 2 x slots: a lent buffer is reused only after its slot came back */
#define MAXB (3 * 4096)

typedef struct {
    dl_link *l;
    dl_waiter w;
    long nmsg;
    long bad;   /* consumer: wrong size, check or content */
    long bytes; /* consumer: bytes received */
    int rc;
} stress_arg;

static size_t msg_size(long j)
{
    uint64_t r = tu_splitmix64((uint64_t)j);
    switch (r % 4) {
    case 0: return (size_t)(r >> 8) % (DL_CHAN_INLINE + 1); /* inline, 0 included */
    case 1: return (size_t)(r >> 8) % 4096 + 1;             /* eager */
    default: return (size_t)(r >> 8) % MAXB + 1;            /* mostly rendezvous */
    }
}

static unsigned char byte_of(long j, size_t i) { return (unsigned char)(j * 31 + (long)i * 7 + 1); }

static void *producer(void *p)
{
    stress_arg *a = p;
    unsigned char *bufs;
    if (posix_memalign((void **)&bufs, 4096, (size_t)NBUF * MAXB)) {
        a->rc = DL_ENOMEM;
        return NULL;
    }
    for (long j = 0; j < a->nmsg; j++) {
        unsigned char *b = bufs + (size_t)(j % NBUF) * MAXB;
        size_t n = msg_size(j);
        for (size_t i = 0; i < n; i++) b[i] = byte_of(j, i);
        dl_msg m = {b, n, (uint32_t)j};
        if ((a->rc = dl_link_post(a->l, &m, &a->w)))
            break;
    }
    if (!a->rc)
        a->rc = dl_link_flush(a->l, &a->w);
    free(bufs);
    return NULL;
}

static void *consumer(void *p)
{
    stress_arg *a = p;
    for (long j = 0; j < a->nmsg; j++) {
        dl_msg m;
        if ((a->rc = dl_link_acquire(a->l, &m, &a->w)))
            break;
        size_t n = msg_size(j);
        int ok = m.bytes == n && m.check == (uint32_t)j;
        const unsigned char *d = m.data;
        for (size_t i = 0; ok && i < n; i++) ok = d[i] == byte_of(j, i);
        a->bad += !ok;
        a->bytes += (long)m.bytes;
        if ((a->rc = dl_link_release(a->l)))
            break;
    }
    return NULL;
}

static void run_stress(dl_wait_mode mode, long nmsg)
{
    dl_link *l;
    ck_assert_int_eq(dl_chan_create(&l, 0, 1, 16, 4096), DL_OK);
    stress_arg pa = {l, {mode, mode == DL_WAIT_SPIN ? 2000 : 100, NULL}, nmsg, 0, 0, 0};
    stress_arg ca = pa;
    pthread_t tp, tc;
    pthread_create(&tc, NULL, consumer, &ca);
    pthread_create(&tp, NULL, producer, &pa);
    pthread_join(tp, NULL);
    pthread_join(tc, NULL);
    ck_assert_int_eq(pa.rc, DL_OK);
    ck_assert_int_eq(ca.rc, DL_OK);
    ck_assert_int_eq(ca.bad, 0);
    long expect = 0;
    for (long j = 0; j < nmsg; j++) expect += (long)msg_size(j);
    ck_assert_int_eq(ca.bytes, expect);
    ck_assert_uint_eq(l->stats.bytes_sent, (uint64_t)expect);
    ck_assert_uint_eq(l->stats.bytes_recv, (uint64_t)expect);
    ck_assert_uint_eq(l->stats.msgs_sent, (uint64_t)nmsg);
    ck_assert_uint_eq(l->stats.msgs_recv, (uint64_t)nmsg);
    dl_link_destroy(l);
}

START_TEST(stress_spin) { run_stress(DL_WAIT_SPIN, DL_TEST_SMALL ? 100000 : 2000000); }
END_TEST

START_TEST(stress_yield) { run_stress(DL_WAIT_YIELD, DL_TEST_SMALL ? 50000 : 500000); }
END_TEST

START_TEST(bad_create)
{
    dl_link *l = (dl_link *)1;
    ck_assert_int_eq(dl_chan_create(&l, 0, 1, 12, 0), DL_EINVAL);
    ck_assert_ptr_null(l);
    ck_assert_ptr_nonnull(strstr(dl_errmsg(), "power of two"));
    ck_assert_int_eq(dl_chan_create(&l, 0, 1, 1, 0), DL_EINVAL);
}
END_TEST

START_TEST(release_without_acquire)
{
    dl_link *l;
    ck_assert_int_eq(dl_chan_create(&l, 3, 4, 4, 0), DL_OK);
    ck_assert_int_eq(dl_link_release(l), DL_EINVAL);
    ck_assert_ptr_nonnull(strstr(dl_errmsg(), "3->4"));
    dl_link_destroy(l);
}
END_TEST

typedef struct {
    dl_link *l;
    dl_waiter w;
    int rc;
    double secs;
} abort_arg;

static void *blocked_consumer(void *p)
{
    abort_arg *a = p;
    dl_msg m;
    uint64_t t0 = dl_now_ns();
    a->rc = dl_link_acquire(a->l, &m, &a->w);
    a->secs = (double)(dl_now_ns() - t0) / 1e9;
    return NULL;
}

/* A consumer asleep on an empty channel (the watch shows it asleep: core/testhook.h) leaves with
 * DL_EABORT once the flag is set and the channel woken. Its wait lasts at least the 200 ms the
 * test waits after seeing it asleep (a lower bound the test forces), and less than 5 s (an upper
 * bound on failure detection: the abort costs at most a wake-up or the 20 ms long sleep, 250x
 * less). */
START_TEST(abort_wakes_waiter)
{
    for (int mode = 0; mode < 2; mode++) {
        dl__test_hook hook = {0};
        tu_chan_watch(&hook, 0);
        atomic_int flag;
        atomic_init(&flag, 0);
        dl_link *l;
        ck_assert_int_eq(dl_chan_create(&l, 0, 1, 8, 0), DL_OK);
        abort_arg a = {l, {(dl_wait_mode)mode, 100, &flag}, -1, 0};
        pthread_t t;
        pthread_create(&t, NULL, blocked_consumer, &a);
        tu_wait_asleep(&hook, DL__CHAN_RECEIVER, 1);
        usleep(200000);
        atomic_store(&flag, 1);
        l->ops->wake(l);
        pthread_join(t, NULL);
        ck_assert_int_eq(a.rc, DL_EABORT);
        ck_assert_msg(a.secs >= 0.2 && a.secs < 5.0, "the aborted wait took %.3f s", a.secs);
        dl_link_destroy(l);
        tu_chan_unwatch();
    }
}
END_TEST

/* A full ring blocks the producer until the consumer releases; a sleeping producer wakes. */
START_TEST(full_ring_blocks)
{
    dl_link *l;
    ck_assert_int_eq(dl_chan_create(&l, 0, 1, 4, 0), DL_OK);
    dl_waiter w = {DL_WAIT_SPIN, 10, NULL};
    char x = 'x';
    for (int i = 0; i < 4; i++) {
        dl_msg m = {&x, 1, (uint32_t)i};
        ck_assert_int_eq(dl_link_post(l, &m, &w), DL_OK);
    }
    /* a fifth post must wait: check with an abort flag already set */
    atomic_int flag;
    atomic_init(&flag, 1);
    dl_waiter wa = {DL_WAIT_SPIN, 10, &flag};
    dl_msg m5 = {&x, 1, 4};
    ck_assert_int_eq(dl_link_post(l, &m5, &wa), DL_EABORT);
    dl_msg got;
    ck_assert_int_eq(dl_link_acquire(l, &got, &w), DL_OK);
    ck_assert_uint_eq(got.check, 0);
    ck_assert_int_eq(dl_link_release(l), DL_OK);
    ck_assert_int_eq(dl_link_post(l, &m5, &wa), DL_OK);
    dl_link_destroy(l);
}
END_TEST

typedef struct {
    dl_link *l;
    dl_waiter w;
    int rc;
    uint64_t acquire_ns; /* the acquire's own duration, by dl_now_ns around it */
} sleepy_arg;

static void *late_consumer(void *p)
{
    sleepy_arg *a = p;
    dl_msg m;
    uint64_t t0 = dl_now_ns();
    a->rc = dl_link_acquire(a->l, &m, &a->w);
    a->acquire_ns = dl_now_ns() - t0;
    if (a->rc == DL_OK)
        a->rc = dl_link_release(a->l);
    return NULL;
}

/* A long wait goes to sleep on the futex and is counted, with its time; a message already
 * there costs no wait at all. The post comes 150 ms after the watch (core/testhook.h) shows the
 * consumer asleep, so exactly one sleep and at least 150 ms of wait are forced by the test, not
 * hoped for from the scheduler. */
START_TEST(sleep_counters)
{
    dl__test_hook hook = {0};
    tu_chan_watch(&hook, 0);
    dl_link *l;
    ck_assert_int_eq(dl_chan_create(&l, 0, 1, 4, 0), DL_OK);
    sleepy_arg a = {l, {DL_WAIT_SPIN, 100, NULL}, -1, 0};
    pthread_t t;
    pthread_create(&t, NULL, late_consumer, &a);
    tu_wait_asleep(&hook, DL__CHAN_RECEIVER, 1);
    uint64_t p0 = dl_now_ns();
    usleep(150000);
    char x = 1;
    dl_msg m = {&x, 1, 0};
    uint64_t lead = dl_now_ns() - p0;
    ck_assert_int_eq(dl_link_post(l, &m, &a.w), DL_OK);
    pthread_join(t, NULL);
    ck_assert_int_eq(a.rc, DL_OK);
    ck_assert_uint_eq(l->stats.recv_sleeps, 1);
    /* the wait is counted in ns whatever clock it reads (TSC ticks are scaled, error <= 0.2%:
     * chan.c): at least the forced lead and never more than the acquire took, allowing 1% */
    ck_assert_uint_ge(l->stats.recv_wait_ns + lead / 100, lead);
    ck_assert_uint_le(l->stats.recv_wait_ns, a.acquire_ns + a.acquire_ns / 100);
    ck_assert_uint_eq(l->stats.send_sleeps, 0);
    /* already there: no wait, no sleep */
    uint64_t s0 = l->stats.recv_sleeps, w0 = l->stats.recv_wait_ns;
    ck_assert_int_eq(dl_link_post(l, &m, &a.w), DL_OK);
    dl_msg got;
    ck_assert_int_eq(dl_link_acquire(l, &got, &a.w), DL_OK);
    ck_assert_int_eq(dl_link_release(l), DL_OK);
    ck_assert_uint_eq(l->stats.recv_sleeps, s0);
    ck_assert_uint_eq(l->stats.recv_wait_ns, w0);
    dl_link_destroy(l);
    tu_chan_unwatch();
}
END_TEST

int main(void)
{
    Suite *s = suite_create("chan");
    TCase *tc = tcase_create("chan");
    tcase_set_timeout(tc, 900);
    tcase_add_test(tc, bad_create);
    tcase_add_test(tc, release_without_acquire);
    tcase_add_test(tc, full_ring_blocks);
    tcase_add_test(tc, abort_wakes_waiter);
    tcase_add_test(tc, sleep_counters);
    tcase_add_test(tc, stress_spin);
    tcase_add_test(tc, stress_yield);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
