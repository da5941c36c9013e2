/* The channel's fallbacks, forced through the private test hook (core/testhook.h), since the fast
 * paths work on the machines we run on: a full fence on both sides of the futex Dekker pair (no
 * membarrier), publishers without a fence and sleepers whose membarrier fails (50 us sleeps), and
 * waits timed with dl_now_ns instead of the TSC. Each test runs in every configuration: a
 * ping-pong where nearly every wait sleeps on the futex (content checked; a lost wake-up costs the
 * 20 ms sleep timeout a wait, so the tcase timeout catches one), aborts waking sleepers on both
 * ends, the wait counters against a clock_gettime bracket, and collectives with a late rank and
 * an aborting one. */
#include "../testutil.h"
#include <check.h>
#include <pthread.h>
#include "transport/chan.h"

static const int configs[] = {DL__CHAN_SEQ_CST, DL__CHAN_MB_FAILS, DL__CHAN_NO_TSC,
                              DL__CHAN_SEQ_CST | DL__CHAN_NO_TSC};
#define NCONFIGS ((int)(sizeof configs / sizeof configs[0]))

static dl__test_hook hook;

/* Force configuration i (from the test's thread, before any channel exists) and check it holds. */
static void force(int i)
{
    memset(&hook, 0, sizeof hook);
    hook.chan_fallbacks = configs[i];
    dl__test_hook_set(&hook);
    int got = dl__chan_test_configure();
    ck_assert_msg((got & configs[i]) == configs[i], "fallbacks %d forced, %d in force", configs[i],
                  got);
}

static void unforce(void)
{
    dl__test_hook_set(NULL);
    dl__chan_test_configure();
}

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- ping-pong: one spin before each sleep, so (almost) every wait sleeps ---- */

#define PP_MAX 6000 /* > 4096 eager bytes: rendezvous */

typedef struct {
    dl_link *out, *in;
    dl_waiter w;
    long n;
    int echo; /* 1: the replier (sends back what it got) */
    long bad;
    int rc;
} pp_arg;

static size_t pp_size(long j) { return j % 3 == 0 ? 8 : j % 3 == 1 ? 1000 : PP_MAX; }

static unsigned char pp_byte(long j, size_t i) { return (unsigned char)(j * 13 + (long)i * 5 + 3); }

static int pp_send(pp_arg *a, unsigned char *buf, long j)
{
    dl_msg m = {buf, pp_size(j), (uint32_t)j};
    int rc = dl_link_post(a->out, &m, &a->w);
    return rc ? rc : dl_link_flush(a->out, &a->w); /* rendezvous: wait for the release */
}

static int pp_recv(pp_arg *a, unsigned char *buf, long j)
{
    dl_msg m;
    int rc = dl_link_acquire(a->in, &m, &a->w);
    if (rc)
        return rc;
    int ok = m.bytes == pp_size(j) && m.check == (uint32_t)j;
    if (ok)
        memcpy(buf, m.data, m.bytes);
    for (size_t i = 0; ok && i < m.bytes; i++) ok = buf[i] == pp_byte(j, i);
    a->bad += !ok;
    return dl_link_release(a->in);
}

static void *pp_thread(void *p)
{
    pp_arg *a = p;
    unsigned char *buf = malloc(PP_MAX);
    for (long j = 0; buf && !a->rc && j < a->n; j++) {
        if (!a->echo)
            for (size_t i = 0; i < pp_size(j); i++) buf[i] = pp_byte(j, i);
        a->rc = a->echo ? pp_recv(a, buf, j) : pp_send(a, buf, j);
        if (!a->rc)
            a->rc = a->echo ? pp_send(a, buf, j) : pp_recv(a, buf, j);
    }
    free(buf);
    return NULL;
}

START_TEST(pingpong_sleeps)
{
    force(_i);
    dl_link *ab, *ba;
    ck_assert_int_eq(dl_chan_create(&ab, 0, 1, 4, 4096), DL_OK);
    ck_assert_int_eq(dl_chan_create(&ba, 1, 0, 4, 4096), DL_OK);
    long n = DL_TEST_SMALL ? 3000 : 6000;
    pp_arg a = {ab, ba, {DL_WAIT_SPIN, 1, NULL}, n, 0, 0, 0};
    pp_arg b = {ba, ab, {DL_WAIT_SPIN, 1, NULL}, n, 1, 0, 0};
    pthread_t ta, tb;
    pthread_create(&tb, NULL, pp_thread, &b);
    pthread_create(&ta, NULL, pp_thread, &a);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    ck_assert_int_eq(a.rc, DL_OK);
    ck_assert_int_eq(b.rc, DL_OK);
    ck_assert_int_eq(a.bad + b.bad, 0);
    /* every round trip has two receive waits; the peer is asleep or busy each time, so with one
     * spin nearly all of them sleep (a quarter leaves room for the scheduler's luck) */
    uint64_t sleeps = ab->stats.recv_sleeps + ba->stats.recv_sleeps;
    ck_assert_msg(sleeps >= (uint64_t)n / 2, "%llu sleeps in %ld round trips",
                  (unsigned long long)sleeps, n);
    /* a third of the messages are lent: their flushes wait for the release, and some sleep */
    ck_assert_uint_ge(ab->stats.send_sleeps + ba->stats.send_sleeps, 1);
    dl_link_destroy(ab);
    dl_link_destroy(ba);
    unforce();
}
END_TEST

/* ---- abort: a receiver asleep on an empty ring and a sender asleep on a full one ---- */

typedef struct {
    dl_link *l;
    dl_waiter w;
    int send; /* 1: post into the full ring, 0: acquire from the empty one */
    atomic_int started;
    int rc;
} ab_arg;

static void *ab_thread(void *p)
{
    ab_arg *a = p;
    char x = 0;
    dl_msg m = {&x, 1, 0};
    atomic_store(&a->started, 1);
    a->rc = a->send ? dl_link_post(a->l, &m, &a->w) : dl_link_acquire(a->l, &m, &a->w);
    return NULL;
}

START_TEST(abort_wakes_sleepers)
{
    force(_i);
    atomic_int flag;
    atomic_init(&flag, 0);
    dl_link *full, *empty;
    ck_assert_int_eq(dl_chan_create(&full, 0, 1, 2, 0), DL_OK);
    ck_assert_int_eq(dl_chan_create(&empty, 1, 0, 2, 0), DL_OK);
    dl_waiter w = {DL_WAIT_SPIN, 1, &flag};
    char x = 0;
    for (int i = 0; i < 2; i++) {
        dl_msg m = {&x, 1, (uint32_t)i};
        ck_assert_int_eq(dl_link_post(full, &m, &w), DL_OK);
    }
    ab_arg s = {full, w, 1, 0, -1}, r = {empty, w, 0, 0, -1};
    atomic_init(&s.started, 0);
    atomic_init(&r.started, 0);
    pthread_t ts, tr;
    pthread_create(&ts, NULL, ab_thread, &s);
    pthread_create(&tr, NULL, ab_thread, &r);
    while (!atomic_load(&s.started) || !atomic_load(&r.started)) tu_sleep_ms(1);
    tu_sleep_ms(100); /* one spin: both are asleep long before */
    atomic_store(&flag, 1);
    full->ops->wake(full);
    empty->ops->wake(empty);
    pthread_join(ts, NULL);
    pthread_join(tr, NULL);
    ck_assert_int_eq(s.rc, DL_EABORT);
    ck_assert_int_eq(r.rc, DL_EABORT);
    ck_assert_uint_eq(full->stats.msgs_sent, 2);
    dl_link_destroy(full);
    dl_link_destroy(empty);
    unforce();
}
END_TEST

/* ---- the wait counters are in ns ---- */

typedef struct {
    dl_link *l;
    dl_waiter w;
    atomic_int started;
    uint64_t a, b; /* clock_gettime just before and after the acquire */
    int rc;
} late_arg;

static void *late_consumer(void *p)
{
    late_arg *a = p;
    dl_msg m;
    atomic_store(&a->started, 1);
    a->a = mono_ns();
    a->rc = dl_link_acquire(a->l, &m, &a->w);
    a->b = mono_ns();
    if (a->rc == DL_OK)
        a->rc = dl_link_release(a->l);
    return NULL;
}

/* The acquire waits for a post made 30 ms after the consumer's start; its counted wait lies in
 * the acquire's bracket [a, b] and covers [a + G, p], p read by the sender before posting, G the
 * consumer's time from its clock read to the wait's (~100 ns; 1 ms allowed for preemption). The
 * TSC's scale factor errs by <= 0.2% (chan.c), dl_now_ns is this same clock: counted <= (b - a)
 * (1 + 0.002) + 1 us and >= (p - a)(1 - 0.002) - 1 ms. In us or unscaled ticks (>= 1 GHz) it
 * would fail one side by a factor of 1000 or >= 1.5. */
START_TEST(wait_counted_in_ns)
{
    force(_i);
    dl_link *l;
    ck_assert_int_eq(dl_chan_create(&l, 0, 1, 4, 0), DL_OK);
    late_arg a = {l, {DL_WAIT_SPIN, 1, NULL}, 0, 0, 0, -1};
    atomic_init(&a.started, 0);
    pthread_t t;
    pthread_create(&t, NULL, late_consumer, &a);
    while (!atomic_load(&a.started)) tu_sleep_ms(1);
    tu_sleep_ms(30);
    char x = 1;
    dl_msg m = {&x, 1, 0};
    uint64_t p = mono_ns();
    ck_assert_int_eq(dl_link_post(l, &m, &a.w), DL_OK);
    pthread_join(t, NULL);
    ck_assert_int_eq(a.rc, DL_OK);
    uint64_t got = l->stats.recv_wait_ns, span = a.b - a.a, lead = p - a.a;
    ck_assert_uint_ge(l->stats.recv_sleeps, 1);
    ck_assert_msg(got <= span + span / 500 + 1000, "counted %llu ns in a %llu ns acquire",
                  (unsigned long long)got, (unsigned long long)span);
    ck_assert_msg(got + lead / 500 + 1000000 >= lead, "counted %llu ns, the post came %llu ns in",
                  (unsigned long long)got, (unsigned long long)lead);
    dl_link_destroy(l);
    unforce();
}
END_TEST

/* ---- collectives: a late rank each round (the others sleep), then an aborting rank ---- */

#define NRANKS 3
#define ROUNDS 48
#define BIG 3000 /* floats: 12 KB, rendezvous */

typedef struct {
    long bad[NRANKS];
    uint64_t sleeps[NRANKS];
    int rc[NRANKS];
} coll_arg;

static int late_rank_fn(dl_ctx *ctx, void *p)
{
    coll_arg *A = p;
    int r = dl_ctx_rank(ctx);
    dl_comm *c = dl_ctx_comm(ctx);
    float *x = malloc(BIG * sizeof *x), *y = malloc(BIG * sizeof *y);
    int rc = x && y ? DL_OK : DL_ENOMEM;
    for (int k = 0; rc == DL_OK && k < ROUNDS; k++) {
        size_t n = k % 2 ? BIG : 2;
        for (size_t i = 0; i < n; i++) x[i] = (float)((r + 1) * (k + (int)i % 7));
        if (k % NRANKS == r)
            tu_sleep_ms(2); /* > the 4000 spins: the others sleep */
        rc = dl_allreduce(c, x, y, n, DL_F32, DL_SUM, DL_PURPOSE_GRADS);
        for (size_t i = 0; rc == DL_OK && i < n; i++) /* 1 + 2 + 3 = 6, exact in f32 */
            A->bad[r] += y[i] != (float)(6 * (k + (int)i % 7));
    }
    dl_comm_stats st;
    dl_comm_get_stats(c, &st);
    A->sleeps[r] = st.sleeps;
    free(x);
    free(y);
    return rc;
}

static int abort_rank_fn(dl_ctx *ctx, void *p)
{
    coll_arg *A = p;
    int r = dl_ctx_rank(ctx);
    float x[2] = {1, 2}, y[2];
    if (r == NRANKS - 1) {
        tu_sleep_ms(50); /* the others are asleep in the all-reduce by then */
        return dl_error(DL_EINVAL, "rank %d gives up", r);
    }
    A->rc[r] = dl_allreduce(dl_ctx_comm(ctx), x, y, 2, DL_F32, DL_SUM, DL_PURPOSE_GRADS);
    return A->rc[r];
}

START_TEST(collectives_sleep_and_abort)
{
    force(_i);
    dl_world_opts o;
    tu_world_opts(&o, NRANKS);
    o.wait_mode = 0; /* spin (4000), then sleep: fixed whatever the core count */
    coll_arg A;
    memset(&A, 0, sizeof A);
    ck_assert_msg(dl_world_run(&o, late_rank_fn, &A) == DL_OK, "%s", dl_errmsg());
    uint64_t sleeps = 0;
    for (int r = 0; r < NRANKS; r++) {
        ck_assert_int_eq(A.bad[r], 0);
        sleeps += A.sleeps[r];
    }
    /* each round two ranks wait 2 ms for the late one: far past their spins */
    ck_assert_msg(sleeps >= ROUNDS, "%llu sleeps in %d rounds", (unsigned long long)sleeps, ROUNDS);
    o.quiet = 1;
    o.log = NULL;
    ck_assert_int_eq(dl_world_run(&o, abort_rank_fn, &A), DL_EINVAL);
    ck_assert_ptr_nonnull(strstr(dl_errmsg(), "gives up"));
    for (int r = 0; r < NRANKS - 1; r++) ck_assert_int_eq(A.rc[r], DL_EABORT);
    unforce();
}
END_TEST

int main(void)
{
    Suite *s = suite_create("chan_fallback");
    TCase *tc = tcase_create("chan_fallback");
    /* a lost wake-up costs a ping-pong 20 ms a wait (minutes in all): caught here */
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, pingpong_sleeps, 0, NCONFIGS);
    tcase_add_loop_test(tc, abort_wakes_sleepers, 0, NCONFIGS);
    tcase_add_loop_test(tc, wait_counted_in_ns, 0, NCONFIGS);
    tcase_add_loop_test(tc, collectives_sleep_and_abort, 0, NCONFIGS);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
