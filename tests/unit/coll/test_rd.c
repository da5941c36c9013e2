/* Recursive doubling's two transports (lib/coll/small.c): its log2 n exchanges, and the one round
 * that gathers every input and folds rd's tree locally, must leave the same bytes on every rank:
 * 2, 4, 8, 16 ranks, f32 / f64 / bf16, sum / avg / max, in and out of place, blocking and not,
 * counts from 1 element to the eager size. Each transport is forced through the test hook, and
 * the bytes each rank sent say which one ran ((n - 1) S against log2 n S for S bytes; the world's
 * own choice too). References computed here: the balanced pairwise tree over the ranks
 * ((x0 + x1) + (x2 + x3)) + ... for sum and max in f32 and f64 (rd's value, since a + b and
 * max(a, b) are commutative bitwise for finite inputs), exact; and, as the negative control, the
 * rank-order fold (one-shot's order), which must differ from rd's bytes for these inputs, or the
 * comparison would not tell the two orders apart. */
#define _GNU_SOURCE
#include <check.h>
#include "../testutil.h"

#define NMAX 16
#define EAGER 4096 /* the library's default eager size: rd runs up to it */

static const dl_dtype types[] = {DL_F32, DL_F64, DL_BF16};
static const dl_redop ops[] = {DL_SUM, DL_AVG, DL_MAX};
static const size_t counts[] = {1, 3, 17, 255, 0}; /* 0: the most that fits EAGER */
#define NT 3
#define NO 3
#define NC 5
#define NCASES (NT * NO * NC * 2) /* x in place or not */

typedef struct rd_case {
    dl_dtype t;
    dl_redop op;
    size_t count;
    int inplace, async;
} rd_case;

static rd_case case_of(int i)
{
    rd_case c;
    c.inplace = i % 2;
    c.async = (i / 2) % 3 == 1; /* every third pair non-blocking */
    int ci = (i / 2) % NC, oi = (i / 2 / NC) % NO, ti = i / 2 / NC / NO;
    c.t = types[ti];
    c.op = ops[oi];
    c.count = counts[ci] ? counts[ci] : EAGER / tu_tsize(c.t);
    return c;
}

typedef struct rd_run {
    int n, transport;   /* 0: the world's choice, else DL__RD_EXCHANGES / DL__RD_ONE_ROUND */
    unsigned char *out; /* [NCASES][NMAX][EAGER] each rank's result */
    uint64_t sent[NCASES][NMAX];
    int algo[NCASES][NMAX], oversub;
} rd_run;

static unsigned char *slot(const rd_run *R, int i, int r)
{
    return R->out + ((size_t)i * NMAX + (size_t)r) * EAGER;
}

static uint64_t seed_of(int i) { return 0x7d00 + (uint64_t)i; }

static int one_case(dl_comm *c, rd_run *R, int i, int r, void *in)
{
    rd_case k = case_of(i);
    void *out = slot(R, i, r);
    tu_fill(k.t, in, k.count, seed_of(i), r, 0);
    if (k.inplace)
        memcpy(out, in, k.count * tu_tsize(k.t));
    const void *src = k.inplace ? out : in;
    dl_comm_reset_stats(c);
    int rc;
    if (k.async) {
        dl_request *q;
        rc = dl_iallreduce(c, src, out, k.count, k.t, k.op, DL_PURPOSE_OTHER, &q);
        if (rc == DL_OK)
            rc = dl_wait(q);
    } else
        rc = dl_allreduce(c, src, out, k.count, k.t, k.op, DL_PURPOSE_OTHER);
    dl_comm_stats st;
    dl_comm_get_stats(c, &st);
    R->sent[i][r] = st.bytes_sent[DL_PURPOSE_OTHER];
    R->algo[i][r] = (int)dl_comm_last_algo(c);
    return rc;
}

static int rank_fn(dl_ctx *x, void *arg)
{
    rd_run *R = arg;
    int r = dl_ctx_rank(x), rc = DL_OK;
    dl_comm *c = dl_ctx_comm(x);
    void *in = tu_alloc(EAGER);
    if (!in)
        return DL_ENOMEM;
    if (r == 0)
        R->oversub = dl_world_oversubscribed(dl_ctx_world(x));
    dl_comm_set_algo(c, DL_ALGO_RD);
    for (int i = 0; rc == DL_OK && i < NCASES; i++) rc = one_case(c, R, i, r, in);
    free(in);
    return rc;
}

static rd_run *run_world(int n, int transport)
{
    rd_run *R = calloc(1, sizeof *R);
    ck_assert_ptr_nonnull(R);
    R->n = n;
    R->transport = transport;
    R->out = calloc((size_t)NCASES * NMAX, EAGER);
    ck_assert_ptr_nonnull(R->out);
    dl__test_hook h;
    memset(&h, 0, sizeof h);
    h.rd_transport = transport;
    dl__test_hook_set(&h);
    int rc = tu_run_world(n, rank_fn, R);
    dl__test_hook_set(NULL);
    ck_assert_msg(rc == DL_OK, "n=%d transport %d: %s", n, transport, dl_errmsg());
    return R;
}

static void run_free(rd_run *R)
{
    free(R->out);
    free(R);
}

static int log2i(int n)
{
    int l = 0;
    while ((1 << l) < n) l++;
    return l;
}

/* Every case ran rd, and each rank sent what the transport sends. */
static void check_bytes(const rd_run *R)
{
    int one = R->transport == DL__RD_ONE_ROUND || (R->transport == 0 && R->oversub);
    for (int i = 0; i < NCASES; i++) {
        rd_case k = case_of(i);
        uint64_t S = k.count * tu_tsize(k.t);
        uint64_t want = S * (uint64_t)(one ? R->n - 1 : log2i(R->n));
        for (int r = 0; r < R->n; r++) {
            ck_assert_int_eq(R->algo[i][r], DL_ALGO_RD);
            ck_assert_msg(R->sent[i][r] == want,
                          "n=%d transport %d case %d rank %d: sent %llu bytes, expected %llu", R->n,
                          R->transport, i, r, (unsigned long long)R->sent[i][r],
                          (unsigned long long)want);
        }
    }
}

/* Element j of rank r's input in case i, as its own type's value (f32 / f64 only). */
static double x_of(const rd_case *k, int i, int r, size_t j)
{
    return tu_value(k->t, seed_of(i), r, j);
}

static double combine(const rd_case *k, double a, double b)
{
    if (k->op == DL_MAX)
        return a > b ? a : b;
    return k->t == DL_F32 ? (double)((float)a + (float)b) : a + b;
}

/* The balanced pairwise tree over ranks lo .. lo + len - 1. */
static double tree(const rd_case *k, int i, int lo, int len, size_t j)
{
    if (len == 1)
        return x_of(k, i, lo, j);
    return combine(k, tree(k, i, lo, len / 2, j), tree(k, i, lo + len / 2, len / 2, j));
}

static double rank_order(const rd_case *k, int i, int n, size_t j)
{
    double v = x_of(k, i, 0, j);
    for (int r = 1; r < n; r++) v = combine(k, v, x_of(k, i, r, j));
    return v;
}

static void check_rd(int n)
{
    rd_run *ex = run_world(n, DL__RD_EXCHANGES), *one = run_world(n, DL__RD_ONE_ROUND);
    rd_run *dflt = run_world(n, 0);
    check_bytes(ex);
    check_bytes(one);
    check_bytes(dflt);
    size_t differs = 0; /* elements where the rank-order fold is not rd's value */
    for (int i = 0; i < NCASES; i++) {
        rd_case k = case_of(i);
        size_t S = k.count * tu_tsize(k.t);
        for (int r = 0; r < n; r++) {
            ck_assert_msg(memcmp(slot(ex, i, r), slot(one, i, r), S) == 0,
                          "n=%d case %d (%s %s count %zu %s): rank %d differs between rd's "
                          "transports",
                          n, i, dl_dtype_name(k.t), dl_redop_name(k.op), k.count,
                          k.inplace ? "in place" : "out of place", r);
            ck_assert(memcmp(slot(ex, i, r), slot(dflt, i, r), S) == 0);
        }
        if (k.t == DL_BF16 || k.op == DL_AVG)
            continue; /* covered by the comparison above */
        for (size_t j = 0; j < k.count; j++) {
            double want = tree(&k, i, 0, n, j);
            for (int r = 0; r < n; r++)
                ck_assert_msg(tu_get(k.t, slot(one, i, r), j) == want,
                              "n=%d case %d rank %d element %zu: %.17g, the tree gives %.17g", n, i,
                              r, j, tu_get(k.t, slot(one, i, r), j), want);
            differs += k.op == DL_SUM && rank_order(&k, i, n, j) != want;
        }
    }
    if (n >= 4) /* the negative control: the two orders are told apart */
        ck_assert_msg(differs > 0, "n=%d: the rank-order fold equals rd's tree everywhere", n);
    run_free(ex);
    run_free(one);
    run_free(dflt);
}

static const int sizes[] = {2, 4, 8, 16};

START_TEST(rd_transports_agree)
{
    int n = sizes[_i];
    if (n > 8 && tu_test_small()) {
        fprintf(stderr, "rd_transports_agree: n=%d skipped (DISTLAB_TEST_SCALE=small)\n", n);
        return;
    }
    check_rd(n);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("rd");
    TCase *tc = tcase_create("rd");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, rd_transports_agree, 0, 4);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
