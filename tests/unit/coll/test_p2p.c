/* Point-to-point requests: dl_isend / dl_irecv completed by dl_wait / dl_test.
 *
 * Pairs in both orders (receive first, send first) at inline, eager and rendezvous sizes, and a
 * receive request followed by a blocking rendezvous send on both ranks (it deadlocks unless the
 * waiting receive holds up nothing started after it); many requests outstanding, waited for in
 * reverse order (receives from one peer match in posting order, so each gets its own tag);
 * requests mixed with pending non-blocking collectives on the same communicator; dl_test polled
 * to completion (and not done before the peer has sent); wrong arguments; the world's abort
 * completing a waiting receive. Payloads are f64 values no rank writes by accident, checked
 * exactly against their formula, into buffers filled with -1 first (so an untouched buffer
 * fails). Hangs end in the world's watchdog (120 s), never in a timed assert. */
#define _GNU_SOURCE
#include <check.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>
#include "../testutil.h"

#define MAXN 4
static const size_t sizes[] = {1, 200, 20000}; /* f64: inline, eager, rendezvous (eager 4096 B) */
#define NSIZES 3

static double pval(int from, int tag, size_t i) { return from * 1e7 + tag * 1e5 + (double)i; }

static void fill(double *b, int from, int tag, size_t n)
{
    for (size_t i = 0; i < n; i++) b[i] = pval(from, tag, i);
}

/* elements of b that differ from what `from` sent with `tag` */
static int wrong(const double *b, int from, int tag, size_t n)
{
    int w = 0;
    for (size_t i = 0; i < n; i++) w += b[i] != pval(from, tag, i);
    return w;
}

typedef struct targ {
    int status[MAXN];
    int bad[MAXN];     /* wrong elements, or requests that misreported */
    int checked[MAXN]; /* buffers compared (a zero would mean nothing was checked) */
    char msg[MAXN][256];
    atomic_int flag;
    atomic_int waiting; /* t_abort: rank 1's receive is posted and being waited for or polled */
    atomic_int arrived; /* pairs_rank's order 3: ranks past their receive requests */
} targ;

static int note(targ *a, int r, int rc, const char *what)
{
    if (rc && !a->status[r]) {
        a->status[r] = rc;
        snprintf(a->msg[r], sizeof a->msg[r], "%s: %s", what, dl_errmsg());
    }
    return rc;
}
#define CK(call, what)                                                                             \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_)                                                                                   \
            return note(a, r, rc_, what);                                                          \
    } while (0)

/* The ring tests' rank (many, mixed): declares what CK and the test use, a and r, and the
 * ring's neighbours: r sends to `to` = r + 1 and receives from `from` = r - 1 (of n). */
#define RING_RANK(x, arg)                                                                          \
    targ *a = (arg);                                                                               \
    dl_comm *c = dl_ctx_comm(x);                                                                   \
    int r = dl_ctx_rank(x), n = dl_ctx_size(x), to = (r + 1) % n, from = (r + n - 1) % n

static void check_buf(targ *a, int r, const double *b, int from, int tag, size_t n)
{
    a->bad[r] += wrong(b, from, tag, n);
    a->checked[r]++;
}

/* Run fn on n ranks with a->flag = flag: the world and every rank succeed, no rank found a
 * wrong element, and each checked at least want_checked buffers. */
static void run_clean(targ *a, dl_rank_fn fn, int n, int flag, int want_checked)
{
    memset(a, 0, sizeof *a);
    atomic_init(&a->flag, flag);
    int rc = tu_run_world(n, fn, a);
    ck_assert_msg(rc == DL_OK, "%s: %s", dl_strstatus(rc), dl_errmsg());
    for (int r = 0; r < n; r++) {
        ck_assert_msg(a->status[r] == DL_OK, "rank %d: %s", r, a->msg[r]);
        ck_assert_msg(a->bad[r] == 0, "rank %d: %d wrong", r, a->bad[r]);
        ck_assert_msg(a->checked[r] >= want_checked, "rank %d checked %d buffers, expected %d", r,
                      a->checked[r], want_checked);
    }
}

/* ---- pairs in both orders, and a receive request before a blocking send ---- */

/* Order 3: each rank's receive request exists before either message is posted, and each waits
 * for its send first. The send's release needs the peer's receive, kept on the peer's own
 * thread: a wait that blocked on the send alone would deadlock both (what two posts and two
 * looks reordered by the store buffer did to order 1, rarely, under load). */

static int pairs_rank(dl_ctx *x, void *arg)
{
    targ *a = arg;
    dl_comm *c = dl_ctx_comm(x);
    int r = dl_ctx_rank(x), peer = 1 - r;
    static double out[2][20000], in[2][20000];
    for (int si = 0; si < NSIZES; si++)
        for (int order = 0; order < 4; order++) {
            size_t n = sizes[si];
            int tag = si * 4 + order;
            dl_request *sq = NULL, *rq = NULL;
            fill(out[r], r, tag, n);
            for (size_t i = 0; i < n; i++) in[r][i] = -1;
            if (order == 0) { /* receive first */
                CK(dl_irecv(c, in[r], n, DL_F64, peer, tag, DL_PURPOSE_OTHER, &rq), "irecv");
                CK(dl_isend(c, out[r], n, DL_F64, peer, tag, DL_PURPOSE_OTHER, &sq), "isend");
                CK(dl_wait(rq), "wait irecv");
                CK(dl_wait(sq), "wait isend");
            } else if (order == 1) { /* send first, waited for in the other order */
                CK(dl_isend(c, out[r], n, DL_F64, peer, tag, DL_PURPOSE_OTHER, &sq), "isend");
                CK(dl_irecv(c, in[r], n, DL_F64, peer, tag, DL_PURPOSE_OTHER, &rq), "irecv");
                CK(dl_wait(sq), "wait isend");
                CK(dl_wait(rq), "wait irecv");
            } else if (order == 3) { /* both receive requests first, then sends waited first */
                CK(dl_irecv(c, in[r], n, DL_F64, peer, tag, DL_PURPOSE_OTHER, &rq), "irecv");
                atomic_fetch_add(&a->arrived, 1);
                while (atomic_load(&a->arrived) < 2 * (si + 1)) sched_yield();
                CK(dl_isend(c, out[r], n, DL_F64, peer, tag, DL_PURPOSE_OTHER, &sq), "isend");
                CK(dl_wait(sq), "wait isend");
                CK(dl_wait(rq), "wait irecv");
            } else { /* a receive request, then a blocking send (tag 0, dl_send's) */
                CK(dl_irecv(c, in[r], n, DL_F64, peer, 0, DL_PURPOSE_OTHER, &rq), "irecv");
                CK(dl_send(c, out[r], n, DL_F64, peer, DL_PURPOSE_OTHER), "send after irecv");
                CK(dl_wait(rq), "wait irecv");
            }
            check_buf(a, r, in[r], peer, tag, n);
        }
    return DL_OK;
}

START_TEST(t_pairs)
{
    targ a;
    run_clean(&a, pairs_rank, 2, 0, 4 * NSIZES);
}
END_TEST

/* ---- many outstanding: NMANY receives posted first, then the sends, waited for backwards ---- */

#define NMANY 24

static int many_rank(dl_ctx *x, void *arg)
{
    RING_RANK(x, arg);
    static double out[MAXN][NMANY][20000], in[MAXN][NMANY][20000];
    dl_request *rq[NMANY], *sq[NMANY];
    for (int i = 0; i < NMANY; i++) {
        size_t len = sizes[i % NSIZES];
        for (size_t j = 0; j < len; j++) in[r][i][j] = -1;
        CK(dl_irecv(c, in[r][i], len, DL_F64, from, i, DL_PURPOSE_OTHER, &rq[i]), "irecv");
    }
    for (int i = 0; i < NMANY; i++) {
        fill(out[r][i], r, i, sizes[i % NSIZES]);
        CK(dl_isend(c, out[r][i], sizes[i % NSIZES], DL_F64, to, i, DL_PURPOSE_OTHER, &sq[i]),
           "isend");
    }
    for (int i = NMANY - 1; i >= 0; i--) {
        CK(dl_wait(rq[i]), "wait irecv");
        check_buf(a, r, in[r][i], from, i, sizes[i % NSIZES]);
    }
    for (int i = 0; i < NMANY; i++) CK(dl_wait(sq[i]), "wait isend");
    return DL_OK;
}

START_TEST(t_many)
{
    targ a;
    run_clean(&a, many_rank, 2 + _i, 0, NMANY); /* 2 and 3 ranks (a ring: r sends to r + 1) */
}
END_TEST

/* ---- mixed with pending non-blocking collectives on the same communicator ---- */

#define NCOLL 1000

static int mixed_rank(dl_ctx *x, void *arg)
{
    RING_RANK(x, arg);
    static double out[MAXN][3][20000], in[MAXN][3][20000], cin[MAXN][NCOLL], cout[MAXN][2][NCOLL];
    for (int i = 0; i < NCOLL; i++) cin[r][i] = pval(r, 0, (size_t)i);
    for (int k = 0; k < 3; k++) {
        fill(out[r][k], r, 50 + k, 20000);
        for (int j = 0; j < 20000; j++) in[r][k][j] = -1;
    }
    dl_request *c1, *c2, *rq0, *sq0, *rq1, *sq1;
    CK(dl_iallreduce(c, cin[r], cout[r][0], NCOLL, DL_F64, DL_SUM, DL_PURPOSE_OTHER, &c1), "c1");
    /* queued behind c1: a receive first on even ranks, a send first on odd ones */
    if (r % 2 == 0) {
        CK(dl_irecv(c, in[r][0], 20000, DL_F64, from, 50, DL_PURPOSE_OTHER, &rq0), "irecv 0");
        CK(dl_isend(c, out[r][0], 20000, DL_F64, to, 50, DL_PURPOSE_OTHER, &sq0), "isend 0");
    } else {
        CK(dl_isend(c, out[r][0], 20000, DL_F64, to, 50, DL_PURPOSE_OTHER, &sq0), "isend 0");
        CK(dl_irecv(c, in[r][0], 20000, DL_F64, from, 50, DL_PURPOSE_OTHER, &rq0), "irecv 0");
    }
    /* a second collective while they are pending, then more point-to-point and a blocking pair */
    CK(dl_iallreduce(c, cin[r], cout[r][1], NCOLL, DL_F64, DL_MAX, DL_PURPOSE_OTHER, &c2), "c2");
    CK(dl_irecv(c, in[r][1], 200, DL_F64, from, 51, DL_PURPOSE_OTHER, &rq1), "irecv 1");
    CK(dl_isend(c, out[r][1], 200, DL_F64, to, 51, DL_PURPOSE_OTHER, &sq1), "isend 1");
    if (r % 2 == 0)
        CK(dl_send(c, out[r][2], 20000, DL_F64, to, DL_PURPOSE_OTHER), "send");
    CK(dl_recv(c, in[r][2], 20000, DL_F64, from, DL_PURPOSE_OTHER), "recv");
    if (r % 2 == 1)
        CK(dl_send(c, out[r][2], 20000, DL_F64, to, DL_PURPOSE_OTHER), "send");
    CK(dl_wait(rq1), "wait irecv 1");
    CK(dl_wait(c2), "wait c2");
    CK(dl_wait(sq0), "wait isend 0");
    CK(dl_wait(c1), "wait c1");
    CK(dl_wait(rq0), "wait irecv 0");
    CK(dl_wait(sq1), "wait isend 1");
    check_buf(a, r, in[r][0], from, 50, 20000);
    check_buf(a, r, in[r][1], from, 51, 200);
    check_buf(a, r, in[r][2], from, 52, 20000);
    for (int i = 0; i < NCOLL; i++) {
        double sum = 0, max = pval(0, 0, (size_t)i);
        for (int k = 0; k < n; k++) { /* exact: integers well below 2^53 */
            sum += pval(k, 0, (size_t)i);
            max = pval(k, 0, (size_t)i) > max ? pval(k, 0, (size_t)i) : max;
        }
        a->bad[r] += cout[r][0][i] != sum || cout[r][1][i] != max;
    }
    a->checked[r]++;
    return DL_OK;
}

START_TEST(t_mixed)
{
    targ a;
    run_clean(&a, mixed_rank, 2 + _i, 0, 4);
}
END_TEST

/* ---- dl_test polled to completion ---- */

/* Rank 1 posts a receive and tests it once before rank 0 may send (it must not be done: the
 * negative control), then polls it; rank 0 polls its send. With `coll`, a non-blocking
 * collective is started while the send is in flight (the send then completes on the
 * communication thread). */
static int poll_rank(dl_ctx *x, void *arg)
{
    targ *a = arg;
    dl_comm *c = dl_ctx_comm(x);
    int r = dl_ctx_rank(x), coll = atomic_load(&a->flag) >= 100;
    static double buf[2][20000], cin[2][NCOLL], cout[2][NCOLL];
    dl_request *q, *cq = NULL;
    int done = 0;
    for (int i = 0; i < NCOLL; i++) cin[r][i] = r + 1;
    if (r == 1) {
        for (int j = 0; j < 20000; j++) buf[1][j] = -1;
        CK(dl_irecv(c, buf[1], 20000, DL_F64, 0, 5, DL_PURPOSE_OTHER, &q), "irecv");
        CK(dl_test(q, &done), "first test");
        a->bad[1] += done; /* nothing was sent yet */
        atomic_fetch_add(&a->flag, 1);
    } else {
        fill(buf[0], 0, 5, 20000);
        while (atomic_load(&a->flag) % 100 == 0) sched_yield();
        CK(dl_isend(c, buf[0], 20000, DL_F64, 1, 5, DL_PURPOSE_OTHER, &q), "isend");
    }
    if (coll)
        CK(dl_iallreduce(c, cin[r], cout[r], NCOLL, DL_F64, DL_SUM, DL_PURPOSE_OTHER, &cq), "iar");
    long polls = 0;
    for (done = 0; !done; polls++) {
        CK(dl_test(q, &done), "test");
        if (!done)
            sched_yield();
    }
    a->checked[r] += polls > 0;
    CK(dl_wait(q), "wait after test");
    if (r == 1)
        check_buf(a, 1, buf[1], 0, 5, 20000);
    if (cq) {
        CK(dl_wait(cq), "wait iallreduce");
        for (int i = 0; i < NCOLL; i++) a->bad[r] += cout[r][i] != 3;
    }
    return DL_OK;
}

START_TEST(t_poll)
{
    targ a;
    run_clean(&a, poll_rank, 2, _i ? 100 : 0, 1);
    ck_assert_int_eq(a.checked[1], 2);
}
END_TEST

/* ---- wrong arguments: the errors blocking point-to-point gives, and a null request ---- */

static int bad_rank(dl_ctx *x, void *arg)
{
    targ *a = arg;
    dl_comm *c = dl_ctx_comm(x);
    int r = dl_ctx_rank(x);
    double b[8] = {0};
    dl_request *q;
    int nbad = 0;
    /* each must fail with DL_EINVAL naming the problem and set the request to NULL */
#define BAD(call, want)                                                                            \
    do {                                                                                           \
        q = (dl_request *)b;                                                                       \
        int rc_ = (call);                                                                          \
        a->checked[r]++;                                                                           \
        if (rc_ != DL_EINVAL || q || !strstr(dl_errmsg(), want))                                   \
            nbad++, snprintf(a->msg[r], sizeof a->msg[r], "%s: %s", #call, dl_errmsg());           \
    } while (0)
    BAD(dl_isend(c, b, 4, DL_F64, -1, 0, DL_PURPOSE_OTHER, &q), "isend: peer -1 invalid");
    BAD(dl_irecv(c, b, 4, DL_F64, 2, 0, DL_PURPOSE_OTHER, &q), "irecv: peer 2 invalid");
    BAD(dl_irecv(c, b, 4, DL_F64, r, 0, DL_PURPOSE_OTHER, &q), "invalid for rank");
    BAD(dl_isend(c, NULL, 4, DL_F64, 1 - r, 0, DL_PURPOSE_OTHER, &q), "null buffer");
    BAD(dl_isend(c, b, 4, DL_NDTYPES, 1 - r, 0, DL_PURPOSE_OTHER, &q), "isend");
    BAD(dl_irecv(c, b, 4, DL_F64, 1 - r, 0, DL_NPURPOSES, &q), "irecv");
    BAD(dl_isend(NULL, b, 4, DL_F64, 1 - r, 0, DL_PURPOSE_OTHER, &q), "isend");
#undef BAD
    q = NULL;
    a->checked[r]++;
    if (dl_irecv(c, b, 4, DL_F64, 1 - r, 0, DL_PURPOSE_OTHER, NULL) != DL_EINVAL ||
        !strstr(dl_errmsg(), "irecv: null request pointer"))
        nbad++, snprintf(a->msg[r], sizeof a->msg[r], "null request: %s", dl_errmsg());
    a->bad[r] += nbad;
    /* a count mismatch (4 sent, 5 expected): the receive's request fails with DL_EMISMATCH,
     * the error blocking receives give, and the world aborts (the sender's request reports it
     * or completes) */
    if (r == 0) {
        CK(dl_isend(c, b, 4, DL_F64, 1, 9, DL_PURPOSE_OTHER, &q), "isend 4");
        dl_wait(q);
    } else {
        CK(dl_irecv(c, b, 5, DL_F64, 0, 9, DL_PURPOSE_OTHER, &q), "irecv 5");
        a->status[1] = dl_wait(q);
        snprintf(a->msg[1], sizeof a->msg[1], "%s", dl_errmsg());
    }
    return DL_OK;
}

START_TEST(t_bad_args)
{
    targ a;
    memset(&a, 0, sizeof a);
    tu_run_world(2, bad_rank, &a); /* aborted by the mismatch */
    ck_assert_msg(a.bad[0] == 0 && a.bad[1] == 0, "%s / %s", a.msg[0], a.msg[1]);
    ck_assert_int_eq(a.checked[0], 8);
    ck_assert_msg(a.status[1] == DL_EMISMATCH && strstr(a.msg[1], "does not match") &&
                      strstr(a.msg[1], "irecv from rank 0 (tag 9)"),
                  "%s: %s", dl_strstatus(a.status[1]), a.msg[1]);
}
END_TEST

/* ---- the world's abort completes a waiting receive (waited for, or polled) ---- */

/* Rank 0 fails only once rank 1 has posted its receive and polled it once or started waiting
 * for it (a delay instead would let rank 0 fail first on a slow host, and test nothing). */
static int abort_rank(dl_ctx *x, void *arg)
{
    targ *a = arg;
    dl_comm *c = dl_ctx_comm(x);
    int r = dl_ctx_rank(x), polled = atomic_load(&a->flag);
    double b[4];
    if (r == 0) {
        while (!atomic_load(&a->waiting)) sched_yield();
        return dl_error(DL_EUSER, "rank 0 fails on purpose");
    }
    dl_request *q;
    CK(dl_irecv(c, b, 4, DL_F64, 0, 1, DL_PURPOSE_OTHER, &q), "irecv");
    for (int done = 0; polled && !done; sched_yield()) {
        if (dl_test(q, &done))
            break;
        atomic_store(&a->waiting, 1);
    }
    atomic_store(&a->waiting, 1);
    a->status[1] = dl_wait(q);
    snprintf(a->msg[1], sizeof a->msg[1], "%s", dl_errmsg());
    return a->status[1];
}

START_TEST(t_abort)
{
    targ a;
    memset(&a, 0, sizeof a);
    atomic_init(&a.flag, _i);
    atomic_init(&a.waiting, 0);
    int rc = tu_run_world(2, abort_rank, &a);
    ck_assert_msg(rc == DL_EUSER, "world: %s", dl_strstatus(rc));
    ck_assert_msg(a.status[1] == DL_EABORT && strstr(a.msg[1], "irecv from rank 0"), "%s: %s",
                  dl_strstatus(a.status[1]), a.msg[1]);
}
END_TEST

static Suite *p2p_suite(void)
{
    Suite *s = suite_create("p2p");
    TCase *tc = tcase_create("requests");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, t_pairs);
    tcase_add_loop_test(tc, t_many, 0, 2);
    tcase_add_loop_test(tc, t_mixed, 0, 2);
    tcase_add_loop_test(tc, t_poll, 0, 2);
    tcase_add_test(tc, t_bad_args);
    tcase_add_loop_test(tc, t_abort, 0, 2);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return tu_run_suite(p2p_suite()); }
