/* The channel's fallbacks, forced through the private test hook (core/testhook.h), since the fast
 * paths work on the machines we run on: a full fence on both sides of the futex Dekker pair (no
 * membarrier), publishers without a fence and sleepers whose membarrier fails (50 us sleeps), and
 * waits timed with dl_now_ns instead of the TSC. Each test runs in every configuration, with the
 * hook's sleep watch on (a test forces a wait to sleep by publishing only once the watch counts
 * the waiter asleep; a sleep that ends by its timeout where the wake-up is guaranteed is a lost
 * wake-up): a free-running ping-pong (content checked, no lost wake-up), forced sleeps on both
 * ends (every one counted, woken and intact) and their negative control (publishers that never
 * wake: every forced sleep times out), aborts waking sleepers on both ends, the wait counters
 * against a clock_gettime bracket, and collectives with a late rank and an aborting one. No
 * assertion depends on how the host schedules the threads. */
#include "../testutil.h"
#include <check.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "transport/chan.h"

static const int configs[] = {DL__CHAN_SEQ_CST, DL__CHAN_MB_FAILS, DL__CHAN_NO_TSC,
                              DL__CHAN_SEQ_CST | DL__CHAN_NO_TSC};
#define NCONFIGS ((int)(sizeof configs / sizeof configs[0]))

static dl__test_hook hook;

/* A lost wake-up costs a waiter this long (the long sleep's timeout, 20 ms in use): far beyond
 * any peer's delay on a loaded host, so that a timed-out sleep is a lost wake-up, not a slow
 * peer (an upper bound on failure detection); the watch counts it. */
#define LOST_MS 10000

/* Force configuration i plus `extra` fallbacks (from the test's thread, before any channel
 * exists) with the sleep watch on, and check they hold. */
static void force_with(int i, int extra, int sleep_ms)
{
    memset(&hook, 0, sizeof hook);
    hook.chan_fallbacks = configs[i] | extra;
    tu_chan_watch(&hook, sleep_ms);
    int got = dl__chan_test_configure();
    ck_assert_msg((got & hook.chan_fallbacks) == hook.chan_fallbacks,
                  "fallbacks %d forced, %d in force", hook.chan_fallbacks, got);
}

static void force(int i) { force_with(i, 0, LOST_MS); }

static void unforce(void) { tu_chan_unwatch(); }

/* The wake-up is guaranteed (the Dekker pair holds) unless membarrier fails: then a sleeper
 * sleeps 50 us at a time and a missed wake-up costs that, by design. */
static int wake_guaranteed(int i) { return !(configs[i] & DL__CHAN_MB_FAILS); }

static void assert_no_lost_wakeup(int i)
{
    if (wake_guaranteed(i))
        ck_assert_msg(atomic_load(&hook.chan_timeouts) == 0,
                      "%d sleeps ended by the %d ms timeout: a lost wake-up",
                      atomic_load(&hook.chan_timeouts), LOST_MS);
}

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- ping-pong: one spin before each sleep, running free (the Dekker pair's races) ---- */

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

/* Whether each wait sleeps is the scheduler's choice here: what must hold on any schedule is
 * that every message arrives intact and no sleep waits for its timeout (forced_sleeps below
 * forces and counts the sleeps). */
START_TEST(pingpong)
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
    ck_assert_uint_eq(ab->stats.msgs_recv + ba->stats.msgs_recv, 2 * (uint64_t)n);
    assert_no_lost_wakeup(_i);
    dl_link_destroy(ab);
    dl_link_destroy(ba);
    unforce();
}
END_TEST

/* ---- forced sleeps: the sender publishes only once the receiver sleeps, and the receiver
 * releases a lent buffer only once the sender sleeps in its flush ---- */

typedef struct {
    dl_link *l;
    dl_waiter w;
    long n, bad;
    int rc;              /* the receiver's, read after the join */
    atomic_int failed;   /* rc != 0, for the sender's loop to stop waiting */
    int in_kernel;       /* wait for the peer's thread to be in the kernel's sleep too */
    atomic_int recv_tid; /* the receiver's thread id, once it runs */
    int send_tid;        /* the sender's (the test's thread) */
} fs_arg;

/* 1 when thread tid of this process is in an interruptible sleep (its state in /proc). The
 * watch counts a sleeper from just before its futex call, and a publish that lands in between
 * makes the call return at once: the negative control needs the sleeper in the kernel, where
 * only a wake-up or the timeout ends the sleep. A waiter's thread blocks nowhere else. */
static int in_kernel_sleep(int tid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/self/task/%d/stat", tid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *e = strrchr(buf, ')'); /* the name may hold spaces and parentheses */
    return e && e[1] == ' ' && e[2] == 'S';
}

static void wait_asleep(fs_arg *a, int side, int tid)
{
    tu_wait_asleep(&hook, side, 1);
    while (a->in_kernel && !in_kernel_sleep(tid)) sched_yield();
}

static void *fs_receiver(void *p)
{
    fs_arg *a = p;
    atomic_store(&a->recv_tid, (int)syscall(SYS_gettid));
    for (long j = 0; !a->rc && j < a->n; j++) {
        dl_msg m;
        if ((a->rc = dl_link_acquire(a->l, &m, &a->w)))
            break;
        int ok = m.bytes == pp_size(j) && m.check == (uint32_t)j;
        for (size_t i = 0; ok && i < m.bytes; i++)
            ok = ((const unsigned char *)m.data)[i] == pp_byte(j, i);
        a->bad += !ok;
        if (m.bytes > 4096) /* lent: the sender waits in its flush; release once it sleeps */
            wait_asleep(a, DL__CHAN_SENDER, a->send_tid);
        a->rc = dl_link_release(a->l);
    }
    atomic_store(&a->failed, a->rc != 0);
    return NULL;
}

/* Message j is posted once the receiver's release of j - 1 is seen (its wait for j - 1 is over)
 * and the watch counts it asleep again (in its wait for j): every receive wait sleeps, and so
 * does every flush of a lent message (counted in *lent). */
static void run_forced(dl_link *l, fs_arg *r, long *lent)
{
    dl_waiter w = {DL_WAIT_SPIN, 1, NULL};
    unsigned char *buf = malloc(PP_MAX);
    ck_assert_ptr_nonnull(buf);
    *lent = 0;
    r->send_tid = (int)syscall(SYS_gettid);
    atomic_init(&r->recv_tid, 0);
    atomic_init(&r->failed, 0);
    pthread_t t;
    pthread_create(&t, NULL, fs_receiver, r);
    while (!atomic_load(&r->recv_tid)) sched_yield();
    for (long j = 0; j < r->n; j++) {
        while (dl_link_released(l) < (uint64_t)j && !atomic_load(&r->failed)) sched_yield();
        if (atomic_load(&r->failed))
            break;
        wait_asleep(r, DL__CHAN_RECEIVER, atomic_load(&r->recv_tid));
        for (size_t i = 0; i < pp_size(j); i++) buf[i] = pp_byte(j, i);
        dl_msg m = {buf, pp_size(j), (uint32_t)j};
        ck_assert_int_eq(dl_link_post(l, &m, &w), DL_OK);
        if (pp_size(j) > 4096) {
            ck_assert_int_eq(dl_link_flush(l, &w), DL_OK);
            ++*lent;
        }
    }
    pthread_join(t, NULL);
    free(buf);
    ck_assert_int_eq(r->rc, DL_OK);
    ck_assert_int_eq(r->bad, 0);
    ck_assert_uint_eq(l->stats.msgs_recv, (uint64_t)r->n);
}

/* Counts exact, content intact, every sleep woken. */
START_TEST(forced_sleeps)
{
    force(_i);
    dl_link *l;
    ck_assert_int_eq(dl_chan_create(&l, 0, 1, 4, 4096), DL_OK);
    long n = DL_TEST_SMALL ? 150 : 300, lent;
    fs_arg r = {.l = l, .w = {DL_WAIT_SPIN, 1, NULL}, .n = n};
    run_forced(l, &r, &lent);
    ck_assert_uint_eq(l->stats.recv_sleeps, (uint64_t)n);
    ck_assert_uint_eq(l->stats.send_sleeps, (uint64_t)lent);
    assert_no_lost_wakeup(_i);
    dl_link_destroy(l);
    unforce();
}
END_TEST

/* The negative control: publishers that never wake (DL__CHAN_NO_WAKE) and a 20 ms long sleep;
 * each message published while its peer sleeps in the kernel. Every forced sleep must then end
 * by its timeout and be counted (where the wake-up is otherwise guaranteed; with membarrier
 * failing the 50 us sleeps are not counted), and the messages still arrive: the check above
 * cannot pass with wake-ups missing. */
START_TEST(lost_wakeup_control)
{
    force_with(_i, DL__CHAN_NO_WAKE, 20);
    dl_link *l;
    ck_assert_int_eq(dl_chan_create(&l, 0, 1, 4, 4096), DL_OK);
    long n = 6, lent;
    fs_arg r = {.l = l, .w = {DL_WAIT_SPIN, 1, NULL}, .n = n, .in_kernel = 1};
    run_forced(l, &r, &lent);
    ck_assert_uint_eq(l->stats.recv_sleeps, (uint64_t)n);
    ck_assert_uint_eq(l->stats.send_sleeps, (uint64_t)lent);
    if (wake_guaranteed(_i))
        ck_assert_int_ge(atomic_load(&hook.chan_timeouts), n + lent);
    dl_link_destroy(l);
    unforce();
}
END_TEST

/* ---- abort: a receiver asleep on an empty ring and a sender asleep on a full one ---- */

typedef struct {
    dl_link *l;
    dl_waiter w;
    int send; /* 1: post into the full ring, 0: acquire from the empty one */
    int rc;
} ab_arg;

static void *ab_thread(void *p)
{
    ab_arg *a = p;
    char x = 0;
    dl_msg m = {&x, 1, 0};
    a->rc = a->send ? dl_link_post(a->l, &m, &a->w) : dl_link_acquire(a->l, &m, &a->w);
    return NULL;
}

START_TEST(abort_wakes_sleepers)
{
    /* the abort flag is no part of the Dekker pair: a sleeper that read it just before it was
     * raised misses the wake-up and sees it at its timeout (20 ms here), by design */
    force_with(_i, 0, 0);
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
    ab_arg s = {full, w, 1, -1}, r = {empty, w, 0, -1};
    pthread_t ts, tr;
    pthread_create(&ts, NULL, ab_thread, &s);
    pthread_create(&tr, NULL, ab_thread, &r);
    tu_wait_asleep(&hook, DL__CHAN_SENDER, 1);
    tu_wait_asleep(&hook, DL__CHAN_RECEIVER, 1);
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
    uint64_t a, b; /* clock_gettime just before and after the acquire */
    int rc;
} late_arg;

static void *late_consumer(void *p)
{
    late_arg *a = p;
    dl_msg m;
    a->a = mono_ns();
    a->rc = dl_link_acquire(a->l, &m, &a->w);
    a->b = mono_ns();
    if (a->rc == DL_OK)
        a->rc = dl_link_release(a->l);
    return NULL;
}

/* The post comes 30 ms after the watch counts the consumer asleep, that is inside its wait: the
 * counted wait covers [p0, p] (p0 read once the consumer is seen asleep, p just before the post)
 * and lies in the acquire's bracket [a, b]. The TSC's scale factor errs by <= 0.2% (chan.c) and
 * dl_now_ns is this same clock, so counted <= (b - a)(1 + 0.002) + 1 us and >= (p - p0)(1 -
 * 0.002) - 1 us (the 1 us for the scaled clocks' rounding). Both bounds are forced by the test,
 * not by the scheduler. In us or unscaled ticks (>= 1 GHz) it would fail one side by a factor of
 * 1000 or >= 1.5. */
START_TEST(wait_counted_in_ns)
{
    force(_i);
    dl_link *l;
    ck_assert_int_eq(dl_chan_create(&l, 0, 1, 4, 0), DL_OK);
    late_arg a = {l, {DL_WAIT_SPIN, 1, NULL}, 0, 0, -1};
    pthread_t t;
    pthread_create(&t, NULL, late_consumer, &a);
    tu_wait_asleep(&hook, DL__CHAN_RECEIVER, 1);
    uint64_t p0 = mono_ns();
    tu_sleep_ms(30);
    char x = 1;
    dl_msg m = {&x, 1, 0};
    uint64_t p = mono_ns();
    ck_assert_int_eq(dl_link_post(l, &m, &a.w), DL_OK);
    pthread_join(t, NULL);
    ck_assert_int_eq(a.rc, DL_OK);
    uint64_t got = l->stats.recv_wait_ns, span = a.b - a.a, lead = p - p0;
    ck_assert_uint_eq(l->stats.recv_sleeps, 1);
    ck_assert_msg(got <= span + span / 500 + 1000, "counted %llu ns in a %llu ns acquire",
                  (unsigned long long)got, (unsigned long long)span);
    ck_assert_msg(got + lead / 500 + 1000 >= lead,
                  "counted %llu ns, the post came %llu ns after the wait slept",
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
        if (k % NRANKS == r) /* late: until both others sleep, waiting for this rank */
            tu_wait_asleep(&hook, DL__CHAN_EITHER, NRANKS - 1);
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
        tu_wait_asleep(&hook, DL__CHAN_EITHER, NRANKS - 1); /* the others, in the all-reduce */
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
    /* each round the late rank waits until the two others sleep at once (two waits, each
     * counted once; the late rank completes the round only after both left them) */
    ck_assert_msg(sleeps >= 2 * ROUNDS, "%llu sleeps in %d rounds", (unsigned long long)sleeps,
                  ROUNDS);
    assert_no_lost_wakeup(_i);
    force_with(_i, 0, 0); /* an abort may miss a sleeper: it sees the flag at its 20 ms timeout */
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
    /* Check's own timeout: a wait that never sleeps or never wakes holds a test up */
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, pingpong, 0, NCONFIGS);
    tcase_add_loop_test(tc, forced_sleeps, 0, NCONFIGS);
    tcase_add_loop_test(tc, lost_wakeup_control, 0, NCONFIGS);
    tcase_add_loop_test(tc, abort_wakes_sleepers, 0, NCONFIGS);
    tcase_add_loop_test(tc, wait_counted_in_ns, 0, NCONFIGS);
    tcase_add_loop_test(tc, collectives_sleep_and_abort, 0, NCONFIGS);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
