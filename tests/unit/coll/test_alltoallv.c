/* dl_alltoallv against a serial reference: 1..16 ranks, f32 / f64 / bf16, uneven counts, zero
 * counts (all, some), an MoE-like skew (a hot receiver, one that receives nothing, every block
 * by rendezvous, so that in place peers read the staged copies while the owner's blocks move),
 * displacements with gaps and blocks out of order, in place, non-blocking;
 * the byte counters against their formula; mismatched counts -> DL_EMISMATCH on every rank with
 * the communicator still usable; bad arguments -> DL_EINVAL naming the argument.
 *
 * The counts and displacements are a function of (pattern, rank, peer), so every rank and the
 * test thread build the same matrix. Results are compared bitwise (alltoallv copies), over the
 * whole receive buffer: gaps must keep the sentinel the rank wrote before the call. */
#define _GNU_SOURCE
#include <check.h>
#include "../testutil.h"

enum { P_UNEVEN, P_SOMEZERO, P_ALLZERO, P_SKEW };

typedef struct a2case {
    int n, pattern;
    dl_dtype t;
    int inplace, async;
} a2case;

static const a2case cases[] = {
    {2, P_UNEVEN, DL_F32, 0, 0},    {3, P_UNEVEN, DL_F64, 0, 0},  {4, P_SOMEZERO, DL_BF16, 0, 0},
    {5, P_UNEVEN, DL_BF16, 1, 0},   {8, P_ALLZERO, DL_F32, 0, 0}, {16, P_UNEVEN, DL_F32, 0, 0},
    {16, P_SOMEZERO, DL_F64, 0, 1}, {7, P_UNEVEN, DL_F32, 1, 1},  {1, P_UNEVEN, DL_F64, 0, 0},
    {2, P_SOMEZERO, DL_F32, 1, 0},  {4, P_SKEW, DL_F32, 1, 0},    {3, P_SKEW, DL_F64, 0, 1},
    {2, P_SKEW, DL_BF16, 1, 0},     {5, P_SKEW, DL_F64, 1, 1},
};
static const int small_cases[] = {0, 2, 3, 4, 5, 8, 10, 12};
#define NCASES ((int)(sizeof cases / sizeof cases[0]))
#define NSMALL ((int)(sizeof small_cases / sizeof small_cases[0]))
#define ITERS 2

static uint64_t h3(uint64_t a, uint64_t b, uint64_t c)
{
    return tu_splitmix64(tu_splitmix64(tu_splitmix64(a) ^ b) ^ c);
}

/* Elements rank i sends to rank j: mostly small (inline / eager), one pair in four large
 * enough to travel by rendezvous (> 4096 bytes even in bf16). SKEW: every block by rendezvous,
 * rank 0 receiving about twice as much as the others and rank n-1 (n > 1) nothing. */
static size_t count_of(int pattern, int n, int i, int j)
{
    uint64_t h = h3(0xa11, (uint64_t)i, (uint64_t)j);
    if (pattern == P_SKEW)
        return n > 1 && j == n - 1 ? 0 : (2100 + h % 1000) * (j == 0 ? 2 : 1);
    if (pattern == P_ALLZERO || (pattern == P_SOMEZERO && (i * n + j) % 3 == 0))
        return 0;
    return (h >> 20) % 4 == 0 ? 2100 + h % 3000 : h % 64;
}

/* Row r of every array is rank r's argument. Send blocks lie in reverse peer order, receive
 * blocks start at peer r + 1, both with gaps of 0..4 (send) and 1..3 (receive) elements. */
typedef struct layout {
    int n;
    size_t *sc, *sd, *rc, *rd; /* [n * n] */
    size_t *sext, *rext;       /* [n] elements of each rank's send / receive buffer */
} layout;

static void layout_make(layout *L, int n, int pattern)
{
    size_t nn = (size_t)n * (size_t)n;
    L->n = n;
    L->sc = calloc(nn, sizeof(size_t)), L->sd = calloc(nn, sizeof(size_t));
    L->rc = calloc(nn, sizeof(size_t)), L->rd = calloc(nn, sizeof(size_t));
    L->sext = calloc((size_t)n, sizeof(size_t)), L->rext = calloc((size_t)n, sizeof(size_t));
    ck_assert(L->sc && L->sd && L->rc && L->rd && L->sext && L->rext);
    for (int r = 0; r < n; r++) {
        size_t pos = 0;
        for (int j = n - 1; j >= 0; j--) {
            pos += h3(1, (uint64_t)r, (uint64_t)j) % 5;
            L->sc[r * n + j] = count_of(pattern, n, r, j);
            L->sd[r * n + j] = pos;
            pos += L->sc[r * n + j];
        }
        L->sext[r] = pos + 3;
        pos = 0;
        for (int m = 1; m <= n; m++) {
            int i = (r + m) % n;
            pos += 1 + h3(2, (uint64_t)r, (uint64_t)i) % 3;
            L->rc[r * n + i] = count_of(pattern, n, i, r);
            L->rd[r * n + i] = pos;
            pos += L->rc[r * n + i];
        }
        L->rext[r] = pos + 2;
    }
}

static void layout_free(layout *L)
{
    free(L->sc), free(L->sd), free(L->rc), free(L->rd), free(L->sext), free(L->rext);
}

static void fill_sentinel(dl_dtype t, void *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (t == DL_F32)
            ((float *)p)[i] = -7.0f;
        else if (t == DL_F64)
            ((double *)p)[i] = -7.0;
        else
            ((uint16_t *)p)[i] = tu_f32_to_bf16(-7.0f);
    }
}

/* Elements of rank r's buffer (in place: one buffer holds both sides). */
static size_t buf_elems(const layout *L, int r, int inplace)
{
    size_t s = L->sext[r], q = L->rext[r];
    return inplace ? (s > q ? s : q) : q;
}

/* The buffer before the call: the send data at every element (gaps too) for the send buffer;
 * the receive buffer all sentinel, or in place the send data then the sentinel. */
static void initial(dl_dtype t, const layout *L, int r, int inplace, uint64_t seed, void *sb,
                    void *rb)
{
    fill_sentinel(t, rb, buf_elems(L, r, inplace));
    tu_fill(t, inplace ? rb : sb, L->sext[r], seed, r, 0);
}

/* The serial reference: rank j's buffer after the call. */
static void expected(dl_dtype t, const layout *L, int j, int inplace, uint64_t seed, void *out)
{
    int n = L->n;
    size_t es = tu_tsize(t);
    void *scratch = tu_alloc(L->sext[j] * es);
    ck_assert(scratch);
    initial(t, L, j, inplace, seed, scratch, out);
    for (int i = 0; i < n; i++)
        tu_fill(t, (char *)out + L->rd[j * n + i] * es, L->rc[j * n + i], seed, i,
                L->sd[i * n + j]);
    free(scratch);
}

typedef struct a2arg {
    const a2case *cs;
    layout L;
    void **out; /* [n] each rank's buffer after the last iteration */
    dl_comm_stats *st;
    int *status;
} a2arg;

static uint64_t seed_of(int it) { return 0x5eed + (uint64_t)it; }

static int a2_rank(dl_ctx *ctx, void *argp)
{
    a2arg *a = argp;
    const a2case *cs = a->cs;
    const layout *L = &a->L;
    dl_comm *c = dl_ctx_comm(ctx);
    int r = dl_ctx_rank(ctx), n = L->n, st = DL_OK;
    size_t es = tu_tsize(cs->t), be = buf_elems(L, r, cs->inplace);
    void *sb = tu_alloc(L->sext[r] * es), *rb = tu_alloc(be * es);
    if (!sb || !rb)
        st = DL_ENOMEM;
    dl_comm_reset_stats(c);
    for (int it = 0; it < ITERS && st == DL_OK; it++) {
        initial(cs->t, L, r, cs->inplace, seed_of(it), sb, rb);
        const void *src = cs->inplace ? rb : sb;
        const size_t *sc = L->sc + r * n, *sd = L->sd + r * n;
        const size_t *rc = L->rc + r * n, *rd = L->rd + r * n;
        if (cs->async) {
            dl_request *q = NULL;
            st = dl_ialltoallv(c, src, sc, sd, rb, rc, rd, cs->t, DL_PURPOSE_ACTIVATIONS, &q);
            if (st == DL_OK)
                st = dl_wait(q);
        } else {
            st = dl_alltoallv(c, src, sc, sd, rb, rc, rd, cs->t, DL_PURPOSE_ACTIVATIONS);
        }
    }
    dl_comm_get_stats(c, &a->st[r]);
    if (rb)
        memcpy(a->out[r], rb, be * es);
    a->status[r] = st;
    free(sb), free(rb);
    return st;
}

static void check_stats(const a2case *cs, const layout *L, int r, const dl_comm_stats *st)
{
    int n = L->n;
    uint64_t es = tu_tsize(cs->t), sent = 0, recv = 0, msgs = (uint64_t)(n - 1);
    for (int j = 0; j < n; j++) {
        if (j == r)
            continue;
        sent += L->sc[r * n + j] * es;
        recv += L->rc[r * n + j] * es;
        msgs += L->sc[r * n + j] != 0;
    }
    /* per call: the payload under the call's purpose; the count rows (16 n bytes to each
     * peer) under DL_PURPOSE_OTHER; one message per peer for the counts, one per nonzero block */
    uint64_t hdr = (uint64_t)(n - 1) * 16u * (uint64_t)n;
    ck_assert_uint_eq(st->bytes_sent[DL_PURPOSE_ACTIVATIONS], ITERS * sent);
    ck_assert_uint_eq(st->bytes_recv[DL_PURPOSE_ACTIVATIONS], ITERS * recv);
    ck_assert_uint_eq(st->bytes_sent[DL_PURPOSE_OTHER], ITERS * hdr);
    ck_assert_uint_eq(st->bytes_recv[DL_PURPOSE_OTHER], ITERS * hdr);
    ck_assert_uint_eq(st->msgs_sent, ITERS * msgs);
    ck_assert_uint_eq(st->bytes_sent[DL_PURPOSE_GRADS], 0);
}

/* What the pattern claims about its counts holds, so that the comparison cannot pass vacuously:
 * data cases move data the sentinel-only buffer would not match, UNEVEN has inline, eager and
 * rendezvous blocks, SOMEZERO has zero blocks among nonzero ones. */
static void check_layout(const a2case *cs, const layout *L)
{
    int n = L->n, zero = 0, inl = 0, eager = 0, rdv = 0;
    size_t es = tu_tsize(cs->t);
    for (int k = 0; k < n * n; k++) {
        size_t b = L->sc[k] * es;
        zero += b == 0, inl += b && b <= 40, eager += b > 40 && b <= 4096, rdv += b > 4096;
    }
    if (cs->pattern == P_ALLZERO)
        ck_assert_int_eq(zero, n * n);
    if (cs->pattern == P_SOMEZERO)
        ck_assert(zero > 0 && zero < n * n);
    if (cs->pattern == P_SKEW) { /* all rendezvous but the empty column of rank n-1 */
        ck_assert_int_eq(rdv, n * n - zero);
        ck_assert_int_eq(zero, n > 1 ? n : 0);
    }
    if (cs->pattern == P_UNEVEN && n >= 5)
        ck_assert_msg(inl && eager && rdv, "n=%d: %d inline, %d eager, %d rendezvous blocks", n,
                      inl, eager, rdv);
}

static void run_case(int ci)
{
    const a2case *cs = &cases[ci];
    int n = cs->n;
    a2arg a = {.cs = cs};
    layout_make(&a.L, n, cs->pattern);
    check_layout(cs, &a.L);
    size_t es = tu_tsize(cs->t);
    a.out = calloc((size_t)n, sizeof(void *));
    a.st = calloc((size_t)n, sizeof(dl_comm_stats));
    a.status = calloc((size_t)n, sizeof(int));
    ck_assert(a.out && a.st && a.status);
    for (int r = 0; r < n; r++) ck_assert((a.out[r] = tu_alloc(buf_elems(&a.L, r, 1) * es)));
    int st = tu_run_world(n, a2_rank, &a);
    ck_assert_msg(st == DL_OK, "case %d (n=%d): world returned %s: %s", ci, n, dl_strstatus(st),
                  dl_errmsg());
    for (int r = 0; r < n; r++) {
        size_t be = buf_elems(&a.L, r, cs->inplace), moved = 0;
        void *exp = tu_alloc(be * es), *before = tu_alloc(be * es);
        void *sb = tu_alloc(a.L.sext[r] * es);
        ck_assert(exp && before && sb);
        expected(cs->t, &a.L, r, cs->inplace, seed_of(ITERS - 1), exp);
        initial(cs->t, &a.L, r, cs->inplace, seed_of(ITERS - 1), sb, before);
        for (int i = 0; i < n; i++) moved += a.L.rc[r * n + i];
        /* negative control: a call that moved nothing would leave `before` */
        if (moved)
            ck_assert_msg(memcmp(exp, before, be * es) != 0, "case %d rank %d: trivial reference",
                          ci, r);
        else
            ck_assert(memcmp(exp, before, be * es) == 0);
        ck_assert_msg(memcmp(a.out[r], exp, be * es) == 0,
                      "case %d (n=%d %s%s%s): rank %d's buffer differs from the reference", ci, n,
                      dl_dtype_name(cs->t), cs->inplace ? " in place" : "",
                      cs->async ? " async" : "", r);
        check_stats(cs, &a.L, r, &a.st[r]);
        free(exp), free(before), free(sb), free(a.out[r]);
    }
    free(a.out), free(a.st), free(a.status);
    layout_free(&a.L);
}

START_TEST(t_alltoallv) { run_case(DL_TEST_SMALL ? small_cases[_i] : _i); }
END_TEST

/* ---- mismatched counts: DL_EMISMATCH on every rank, then the communicator still works ---- */

typedef struct mmcase {
    int n, rank, peer; /* rank `rank` changes its count for `peer` */
    int send;          /* 1: its sendcounts[peer], 0: its recvcounts[peer] */
} mmcase;

static const mmcase mm[] = {{2, 0, 1, 0}, {4, 2, 1, 1}, {16, 5, 9, 0}, {3, 1, 1, 1}};
#define NMM ((int)(sizeof mm / sizeof mm[0]))

typedef struct mmarg {
    const mmcase *m;
    layout L;
    int status[16], after_barrier[16], after_call[16];
    char msg[16][512];
} mmarg;

static int mm_rank(dl_ctx *ctx, void *argp)
{
    mmarg *a = argp;
    const layout *L = &a->L;
    dl_comm *c = dl_ctx_comm(ctx);
    int r = dl_ctx_rank(ctx), n = L->n;
    size_t sc[16], rc[16];
    memcpy(sc, L->sc + r * n, sizeof(size_t) * (size_t)n);
    memcpy(rc, L->rc + r * n, sizeof(size_t) * (size_t)n);
    if (r == a->m->rank)
        (a->m->send ? sc : rc)[a->m->peer] += 1;
    /* the changed count may reach past the layout's blocks: give both buffers room */
    float *sb = tu_alloc((L->sext[r] + 1) * 4), *rb = tu_alloc((L->rext[r] + 1) * 4);
    if (!sb || !rb)
        return DL_ENOMEM;
    tu_fill_f32(sb, L->sext[r] + 1, 9, r, 0);
    a->status[r] =
        dl_alltoallv(c, sb, sc, L->sd + r * n, rb, rc, L->rd + r * n, DL_F32, DL_PURPOSE_OTHER);
    snprintf(a->msg[r], sizeof a->msg[r], "%s", dl_errmsg());
    a->after_barrier[r] = dl_barrier(c);
    a->after_call[r] = dl_alltoallv(c, sb, L->sc + r * n, L->sd + r * n, rb, L->rc + r * n,
                                    L->rd + r * n, DL_F32, DL_PURPOSE_OTHER);
    free(sb), free(rb);
    return DL_OK;
}

START_TEST(t_mismatch)
{
    mmarg a;
    memset(&a, 0, sizeof a);
    a.m = &mm[_i];
    int n = a.m->n;
    layout_make(&a.L, n, P_UNEVEN);
    dl_world_opts o;
    tu_world_opts(&o, n);
    o.timeout_s = 30; /* a hang ends in DL_ETIMEOUT, which fails below */
    int st = dl_world_run(&o, mm_rank, &a);
    ck_assert_msg(st == DL_OK, "n=%d: world returned %s: %s", n, dl_strstatus(st), dl_errmsg());
    /* the pair that disagrees, as every rank must name it: sender first */
    int from = a.m->send ? a.m->rank : a.m->peer, to = a.m->send ? a.m->peer : a.m->rank;
    char want[64];
    snprintf(want, sizeof want, "rank %d sends", from);
    for (int r = 0; r < n; r++) {
        ck_assert_msg(a.status[r] == DL_EMISMATCH, "n=%d rank %d: %s (%s)", n, r,
                      dl_strstatus(a.status[r]), a.msg[r]);
        ck_assert_msg(strstr(a.msg[r], want) &&
                          tu_has_int_token(strstr(a.msg[r], want) + strlen(want), to),
                      "rank %d's message does not name %d -> %d: %s", r, from, to, a.msg[r]);
        ck_assert_int_eq(a.after_barrier[r], DL_OK);
        ck_assert_int_eq(a.after_call[r], DL_OK);
    }
    layout_free(&a.L);
}
END_TEST

/* ---- bad arguments: DL_EINVAL on the calling rank, naming what is wrong ---- */

typedef struct badarg {
    int status[12];
    char msg[12][256];
} badarg;

static int bad_rank(dl_ctx *ctx, void *argp)
{
    badarg *b = argp;
    dl_comm *c = dl_ctx_comm(ctx);
    float s[4] = {1, 2, 3, 4}, r[4];
    size_t two[1] = {2}, zero[1] = {0}, neg[1] = {(size_t)-3}, far[1] = {SIZE_MAX - 1};
    const dl_purpose P = DL_PURPOSE_OTHER;
    dl_request *q = NULL;
    int k = 0;
#define REC(CALL) (b->status[k] = (CALL), snprintf(b->msg[k], 256, "%s", dl_errmsg()), k++)
    REC(dl_alltoallv(c, s, NULL, zero, r, two, zero, DL_F32, P));
    REC(dl_alltoallv(c, s, two, zero, r, two, NULL, DL_F32, P));
    REC(dl_alltoallv(c, s, neg, zero, r, two, zero, DL_F32, P));
    REC(dl_alltoallv(c, s, two, zero, r, two, far, DL_F32, P));
    REC(dl_alltoallv(c, NULL, two, zero, r, two, zero, DL_F32, P));
    REC(dl_alltoallv(c, s, two, zero, NULL, two, zero, DL_F32, P));
    REC(dl_alltoallv(c, s, two, zero, r, two, zero, (dl_dtype)9, P));
    REC(dl_alltoallv(c, s, two, zero, r, two, zero, DL_F32, (dl_purpose)99));
    REC(dl_alltoallv(NULL, s, two, zero, r, two, zero, DL_F32, P));
    REC(dl_ialltoallv(c, s, two, zero, r, two, zero, DL_F32, P, NULL));
    REC(dl_alltoallv(c, NULL, zero, zero, NULL, zero, zero, DL_F32, P)); /* nothing to move */
    REC(dl_ialltoallv(c, s, two, zero, r, two, zero, DL_F32, P, &q));
#undef REC
    return dl_wait(q);
}

START_TEST(t_bad_args)
{
    static const char *const want[] = {"sendcounts",
                                       "rdispls",
                                       "sendcounts[0]",
                                       "rdispls[0]",
                                       "null send buffer",
                                       "null recv buffer",
                                       "data type",
                                       "purpose",
                                       "communicator",
                                       "request",
                                       NULL,
                                       NULL};
    badarg b;
    memset(&b, 0, sizeof b);
    int st = tu_run_world(1, bad_rank, &b);
    ck_assert_msg(st == DL_OK, "world returned %s: %s", dl_strstatus(st), dl_errmsg());
    for (int k = 0; k < 12; k++) {
        if (!want[k]) {
            ck_assert_msg(b.status[k] == DL_OK, "call %d: %s", k, b.msg[k]);
            continue;
        }
        ck_assert_msg(b.status[k] == DL_EINVAL, "call %d returned %s", k,
                      dl_strstatus(b.status[k]));
        ck_assert_msg(strstr(b.msg[k], want[k]) && strstr(b.msg[k], "alltoallv"),
                      "call %d's message lacks \"%s\": %s", k, want[k], b.msg[k]);
    }
}
END_TEST

static Suite *a2_suite(void)
{
    Suite *s = suite_create("alltoallv");
    TCase *tc = tcase_create("reference");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, t_alltoallv, 0, DL_TEST_SMALL ? NSMALL : NCASES);
    suite_add_tcase(s, tc);
    tc = tcase_create("errors");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, t_mismatch, 0, NMM);
    tcase_add_test(tc, t_bad_args);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(a2_suite());
    srunner_run_all(sr, CK_ENV);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
