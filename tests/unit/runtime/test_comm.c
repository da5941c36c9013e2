/* Communicators: the world communicator, split (MPI colour / key semantics), the dp x pp x tp
 * (x ep) mesh with Megatron's rank order (tp fastest), dl_block, and point-to-point send/recv.
 *
 * Rank threads never assert: they record what they saw into arrays the test thread owns; the
 * test thread computes the expected values from the formulas and asserts after the run.
 *
 * Group membership is checked twice: through dl_comm_world_rank of every member, and through an
 * all-reduce in which world rank w contributes 2^w, so that the sum is exactly the bit mask of
 * the members the data really came from. */
#define _GNU_SOURCE
#include <check.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../testutil.h"

#define NMAX 16

typedef struct errs {
    int n;
    char first[1024];
} errs;

static void efail(errs *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void efail(errs *e, const char *fmt, ...)
{
    if (e->n++ == 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->first, sizeof e->first, fmt, ap);
        va_end(ap);
    }
}
#define ASSERT_NO_ERRS(e) ck_assert_msg((e).n == 0, "%d failure(s); first: %s", (e).n, (e).first)

/* What a rank saw of one communicator. */
typedef struct comm_view {
    int is_null;
    int rank, size;
    int members[NMAX]; /* dl_comm_world_rank(c, i) */
    double mask;       /* all-reduce of 2^world_rank */
    int mask_status;
    int big_ok; /* all-reduce of a larger vector gave the exact group sum */
    int big_status;
} comm_view;

/* Record c's view and run the two membership all-reduces on it. */
static int view_comm(dl_comm *c, int wrank, comm_view *v, size_t big)
{
    memset(v, 0, sizeof *v);
    if (!c) {
        v->is_null = 1;
        return DL_OK;
    }
    v->rank = dl_comm_rank(c);
    v->size = dl_comm_size(c);
    for (int i = 0; i < v->size && i < NMAX; i++) v->members[i] = dl_comm_world_rank(c, i);
    double x = (double)(1u << wrank), y = -1;
    v->mask_status = dl_allreduce(c, &x, &y, 1, DL_F64, DL_SUM, DL_PURPOSE_OTHER);
    v->mask = y;
    if (v->mask_status != DL_OK)
        return v->mask_status;
    if (big) {
        /* element i of world rank w is (w + 1) * (i % 7 + 1): integer sums, exact in any order */
        double *bx = tu_alloc(big * sizeof(double)), *by = tu_alloc(big * sizeof(double));
        if (!bx || !by)
            return dl_error(DL_ENOMEM, "test: no memory");
        for (size_t i = 0; i < big; i++) bx[i] = (double)(wrank + 1) * (double)(i % 7 + 1);
        v->big_status = dl_allreduce(c, bx, by, big, DL_F64, DL_SUM, DL_PURPOSE_OTHER);
        double wsum = 0;
        for (int i = 0; i < v->size; i++) wsum += v->members[i] + 1;
        v->big_ok = v->big_status == DL_OK;
        for (size_t i = 0; i < big && v->big_ok; i++)
            if (by[i] != wsum * (double)(i % 7 + 1))
                v->big_ok = 0;
        free(bx);
        free(by);
        if (v->big_status != DL_OK)
            return v->big_status;
    }
    return DL_OK;
}

/* Compare a view with the expected member list (world ranks in comm-rank order). */
static void check_view(errs *e, const char *what, int wrank, const comm_view *v, const int *want,
                       int nwant, int check_big)
{
    if (nwant == 0) {
        if (!v->is_null)
            efail(e, "%s: world rank %d: expected no communicator (NULL)", what, wrank);
        return;
    }
    if (v->is_null) {
        efail(e, "%s: world rank %d: got NULL, expected a communicator of %d", what, wrank, nwant);
        return;
    }
    if (v->size != nwant) {
        efail(e, "%s: world rank %d: size %d, expected %d", what, wrank, v->size, nwant);
        return;
    }
    int myrank = -1;
    double mask = 0;
    for (int i = 0; i < nwant; i++) {
        if (want[i] == wrank)
            myrank = i;
        mask += (double)(1u << want[i]);
        if (v->members[i] != want[i])
            efail(e, "%s: world rank %d: member %d is world rank %d, expected %d", what, wrank, i,
                  v->members[i], want[i]);
    }
    if (v->rank != myrank)
        efail(e, "%s: world rank %d: comm rank %d, expected %d", what, wrank, v->rank, myrank);
    if (v->mask_status != DL_OK)
        efail(e, "%s: world rank %d: all-reduce returned %s", what, wrank,
              dl_strstatus(v->mask_status));
    else if (v->mask != mask)
        efail(e,
              "%s: world rank %d: all-reduce of 2^w gave %.0f, expected %.0f (the members' mask)",
              what, wrank, v->mask, mask);
    if (check_big && !v->big_ok)
        efail(e, "%s: world rank %d: all-reduce of a long vector did not give the group's sum (%s)",
              what, wrank, dl_strstatus(v->big_status));
}

/* ------------------------------------------------------------------------------------------ */
/* dl_block                                                                                     */

START_TEST(t_block)
{
    static const size_t counts[] = {0, 1, 2, 3, 7, 8, 15, 16, 17, 100, 1000, 1000003};
    for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++)
        for (int n = 1; n <= 17; n++) {
            size_t count = counts[ci], next = 0, sum = 0;
            for (int r = 0; r < n; r++) {
                size_t off = 12345, len = 12345;
                dl_block(count, n, r, &off, &len);
                size_t want_len = count / (size_t)n + ((size_t)r < count % (size_t)n ? 1 : 0);
                ck_assert_msg(off == next,
                              "dl_block(%zu, %d, %d): offset %zu, expected %zu (contiguous)", count,
                              n, r, off, next);
                ck_assert_msg(len == want_len, "dl_block(%zu, %d, %d): len %zu, expected %zu",
                              count, n, r, len, want_len);
                next = off + len;
                sum += len;
            }
            ck_assert_msg(sum == count, "dl_block(%zu, %d): blocks sum to %zu", count, n, sum);
        }
}
END_TEST

START_TEST(t_names)
{
    ck_assert_uint_eq(dl_dtype_size(DL_F32), 4);
    ck_assert_uint_eq(dl_dtype_size(DL_F64), 8);
    ck_assert_uint_eq(dl_dtype_size(DL_BF16), 2);
    dl_dtype t;
    dl_redop op;
    dl_algo a;
    ck_assert_int_eq(dl_dtype_parse("f32", &t), DL_OK);
    ck_assert_int_eq(t, DL_F32);
    ck_assert_int_eq(dl_dtype_parse("double", &t), DL_OK);
    ck_assert_int_eq(t, DL_F64);
    ck_assert_int_eq(dl_dtype_parse("bf16", &t), DL_OK);
    ck_assert_int_eq(t, DL_BF16);
    ck_assert_int_eq(dl_dtype_parse("f16", &t), DL_EINVAL);
    ck_assert_int_eq(dl_redop_parse("avg", &op), DL_OK);
    ck_assert_int_eq(op, DL_AVG);
    ck_assert_int_eq(dl_redop_parse("prod", &op), DL_EINVAL);
    ck_assert_int_eq(dl_algo_parse("ring", &a), DL_OK);
    ck_assert_int_eq(a, DL_ALGO_RING);
    ck_assert_int_eq(dl_algo_parse("auto", &a), DL_OK);
    ck_assert_int_eq(a, DL_ALGO_AUTO);
    ck_assert_int_eq(dl_algo_parse("tree", &a), DL_EINVAL);
    for (int k = 0; k < DL_NDTYPES; k++) {
        ck_assert_int_eq(dl_dtype_parse(dl_dtype_name((dl_dtype)k), &t), DL_OK);
        ck_assert_int_eq(t, k);
    }
    for (int k = 0; k < DL_NREDOPS; k++) {
        ck_assert_int_eq(dl_redop_parse(dl_redop_name((dl_redop)k), &op), DL_OK);
        ck_assert_int_eq(op, k);
    }
    for (int k = 0; k < DL_NALGOS; k++) {
        ck_assert_int_eq(dl_algo_parse(dl_algo_name((dl_algo)k), &a), DL_OK);
        ck_assert_int_eq(a, k);
    }
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* the world communicator                                                                       */

typedef struct world_arg {
    int ctx_rank[NMAX], ctx_size[NMAX];
    comm_view v[NMAX];
} world_arg;

static int world_rank_fn(dl_ctx *ctx, void *argp)
{
    world_arg *a = argp;
    int r = dl_ctx_rank(ctx);
    a->ctx_rank[r] = r;
    a->ctx_size[r] = dl_ctx_size(ctx);
    dl_comm *w = dl_ctx_comm(ctx);
    if (dl_comm_ctx(w) != ctx)
        return dl_error(DL_EINVAL, "dl_comm_ctx(world) is not the rank's ctx");
    return view_comm(w, r, &a->v[r], 1001);
}

START_TEST(t_world_comm)
{
    static const int nss[] = {1, 2, 5, 8, 16};
    int n = DL_TEST_SMALL ? nss[_i % 3] : nss[_i];
    world_arg *a = calloc(1, sizeof *a);
    int st = tu_run_world(n, world_rank_fn, a);
    ck_assert_msg(st == DL_OK, "n=%d: %s: %s", n, dl_strstatus(st), dl_errmsg());
    errs e = {0};
    int want[NMAX];
    for (int i = 0; i < n; i++) want[i] = i;
    for (int r = 0; r < n; r++) {
        ck_assert_int_eq(a->ctx_size[r], n);
        check_view(&e, "world", r, &a->v[r], want, n, 1);
    }
    free(a);
    ASSERT_NO_ERRS(e);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* split                                                                                        */

enum {
    SPLIT_PARITY_REVERSED,
    SPLIT_THIRDS,
    SPLIT_UNDEFINED,
    SPLIT_ALL_ONE,
    SPLIT_SINGLETONS,
    NSPLITS
};
static const char *split_name[NSPLITS] = {"color rank%2, key -rank", "color rank/3, key 0",
                                          "rank 0 DL_UNDEFINED, key rank%3",
                                          "one color, key (rank*5)%n", "color rank, key 0"};

static void split_args(int variant, int r, int n, int *color, int *key)
{
    switch (variant) {
    case SPLIT_PARITY_REVERSED:
        *color = r % 2;
        *key = -r;
        break;
    case SPLIT_THIRDS:
        *color = r / 3;
        *key = 0;
        break;
    case SPLIT_UNDEFINED:
        *color = r == 0 ? DL_UNDEFINED : 7;
        *key = r % 3;
        break;
    case SPLIT_ALL_ONE:
        *color = 0;
        *key = (r * 5) % n;
        break;
    default:
        *color = r;
        *key = 0;
        break;
    }
}

/* Expected members (world ranks, new-rank order) of the comm world rank r lands in. */
static int split_expect(int variant, int r, int n, int *out)
{
    int color, key;
    split_args(variant, r, n, &color, &key);
    if (color == DL_UNDEFINED)
        return 0;
    int k = 0;
    for (int q = 0; q < n; q++) {
        int cq, kq;
        split_args(variant, q, n, &cq, &kq);
        if (cq == color)
            out[k++] = q;
    }
    /* order by (key, old rank): insertion sort, stable on old rank */
    for (int i = 1; i < k; i++)
        for (int j = i; j > 0; j--) {
            int c1, k1, c2, k2;
            split_args(variant, out[j - 1], n, &c1, &k1);
            split_args(variant, out[j], n, &c2, &k2);
            if (k1 > k2 || (k1 == k2 && out[j - 1] > out[j])) {
                int t = out[j];
                out[j] = out[j - 1];
                out[j - 1] = t;
            } else {
                break;
            }
        }
    return k;
}

typedef struct split_arg {
    int variant;
    int status[NMAX];
    int out_not_set[NMAX];
    comm_view v[NMAX];      /* the split comm */
    comm_view nested[NMAX]; /* split of the split comm by (new rank % 2), key 0 */
    uint64_t world_bytes_during_split_ops[NMAX];
    uint64_t split_bytes[NMAX];
    int free_status[NMAX];
    double after_free[NMAX];
} split_arg;

static int split_rank(dl_ctx *ctx, void *argp)
{
    split_arg *a = argp;
    dl_comm *w = dl_ctx_comm(ctx);
    int r = dl_ctx_rank(ctx), n = dl_ctx_size(ctx);
    int color, key;
    split_args(a->variant, r, n, &color, &key);
    static char sentinel;
    dl_comm *s = (dl_comm *)(void *)&sentinel; /* must be overwritten, with NULL for DL_UNDEFINED */
    int st = dl_comm_split(w, color, key, &s);
    a->status[r] = st;
    if (st != DL_OK)
        return st;
    if (s == (dl_comm *)(void *)&sentinel) {
        a->out_not_set[r] = 1;
        return dl_error(DL_EINVAL, "test: dl_comm_split did not set *out");
    }
    dl_comm_reset_stats(w);
    if (s)
        dl_comm_reset_stats(s);
    /* every split comm runs its collectives at the same time as the others */
    st = view_comm(s, r, &a->v[r], 70001);
    if (st != DL_OK)
        return st;
    dl_comm_stats ws, ss;
    dl_comm_get_stats(w, &ws);
    a->world_bytes_during_split_ops[r] = 0;
    for (int p = 0; p < DL_NPURPOSES; p++) a->world_bytes_during_split_ops[r] += ws.bytes_sent[p];
    if (s) {
        dl_comm_get_stats(s, &ss);
        a->split_bytes[r] = ss.bytes_sent[DL_PURPOSE_OTHER];
    }
    dl_comm *nested = NULL;
    if (s) {
        st = dl_comm_split(s, dl_comm_rank(s) % 2, 0, &nested);
        if (st != DL_OK)
            return st;
    }
    st = view_comm(nested, r, &a->nested[r], 0);
    if (st != DL_OK)
        return st;
    int fs = dl_comm_free(nested);
    if (fs == DL_OK)
        fs = dl_comm_free(s);
    a->free_status[r] = fs;
    if (fs != DL_OK)
        return fs;
    /* the world still works after the splits are freed */
    double x = r + 1, y = 0;
    st = dl_allreduce(w, &x, &y, 1, DL_F64, DL_SUM, DL_PURPOSE_OTHER);
    a->after_free[r] = y;
    return st;
}

START_TEST(t_split)
{
    static const int nss[] = {8, 7, 16, 1};
    int variant = _i % NSPLITS;
    int n = nss[_i / NSPLITS];
    split_arg *a = calloc(1, sizeof *a);
    a->variant = variant;
    int st = tu_run_world(n, split_rank, a);
    ck_assert_msg(st == DL_OK, "split \"%s\" n=%d: %s: %s", split_name[variant], n,
                  dl_strstatus(st), dl_errmsg());
    errs e = {0};
    char what[128];
    snprintf(what, sizeof what, "split \"%s\" n=%d", split_name[variant], n);
    for (int r = 0; r < n; r++) {
        int want[NMAX];
        int k = split_expect(variant, r, n, want);
        check_view(&e, what, r, &a->v[r], want, k, 1);
        /* nested: members of my comm whose new rank has my parity, in new-rank order */
        if (k > 0 && !a->v[r].is_null) {
            int nw[NMAX], nk = 0, my = -1;
            for (int i = 0; i < k; i++)
                if (want[i] == r)
                    my = i;
            for (int i = 0; i < k; i++)
                if (i % 2 == my % 2)
                    nw[nk++] = want[i];
            char w2[160];
            snprintf(w2, sizeof w2, "%s, nested split", what);
            check_view(&e, w2, r, &a->nested[r], nw, nk, 0);
        }
        if (a->world_bytes_during_split_ops[r] != 0)
            efail(&e,
                  "%s: rank %d: collectives on the split comm counted %llu bytes on the world comm",
                  what, r, (unsigned long long)a->world_bytes_during_split_ops[r]);
        if (k > 1 && a->split_bytes[r] == 0)
            efail(&e, "%s: rank %d: no bytes counted on the split comm", what, r);
        if (a->free_status[r] != DL_OK)
            efail(&e, "%s: rank %d: dl_comm_free failed", what, r);
        if (a->after_free[r] != n * (n + 1) / 2.0)
            efail(&e, "%s: rank %d: world all-reduce after freeing gave %g", what, r,
                  a->after_free[r]);
    }
    free(a);
    ASSERT_NO_ERRS(e);
}
END_TEST

/* Many splits in a row (communicators created, used and freed). */
typedef struct churn_arg {
    int iters;
    int bad[NMAX];
} churn_arg;

static int churn_rank(dl_ctx *ctx, void *argp)
{
    churn_arg *a = argp;
    dl_comm *w = dl_ctx_comm(ctx);
    int r = dl_ctx_rank(ctx), n = dl_ctx_size(ctx);
    for (int it = 0; it < a->iters; it++) {
        int groups = 1 + it % 3;
        dl_comm *s = NULL;
        int st = dl_comm_split(w, r % groups, (r * 7 + it) % n, &s);
        if (st != DL_OK)
            return st;
        double x = (double)(1u << r), y = 0;
        st = dl_allreduce(s, &x, &y, 1, DL_F64, DL_SUM, DL_PURPOSE_OTHER);
        if (st != DL_OK)
            return st;
        double want = 0;
        for (int q = 0; q < n; q++)
            if (q % groups == r % groups)
                want += (double)(1u << q);
        if (y != want)
            a->bad[r]++;
        st = dl_comm_free(s);
        if (st != DL_OK)
            return st;
    }
    return DL_OK;
}

START_TEST(t_split_churn)
{
    churn_arg a;
    memset(&a, 0, sizeof a);
    a.iters = DL_TEST_SMALL ? 20 : 100;
    int n = 6;
    int st = tu_run_world(n, churn_rank, &a);
    ck_assert_msg(st == DL_OK, "%s: %s", dl_strstatus(st), dl_errmsg());
    for (int r = 0; r < n; r++)
        ck_assert_msg(a.bad[r] == 0, "rank %d: %d wrong group sums", r, a.bad[r]);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* mesh                                                                                         */

typedef struct mesh_cfg {
    int n, dp, pp, tp, ep;
} mesh_cfg;

static const mesh_cfg mesh_full[] = {
    {8, 2, 2, 2, 1}, {8, 2, 1, 4, 1},  {8, 1, 4, 2, 1},  {8, 8, 1, 1, 1},
    {8, 1, 1, 8, 1}, {8, 1, 8, 1, 1},  {8, 4, 1, 2, 2},  {8, 4, 2, 1, 4},
    {8, 2, 2, 2, 2}, {12, 3, 2, 2, 3}, {16, 4, 2, 2, 2}, {1, 1, 1, 1, 1},
};
static const mesh_cfg mesh_small[] = {{8, 2, 2, 2, 1}, {8, 4, 1, 2, 2}};

typedef struct mesh_arg {
    mesh_cfg cfg;
    int status[NMAX];
    dl_mesh m[NMAX]; /* the struct as returned (comm pointers only compared to NULL) */
    comm_view dpv[NMAX], ppv[NMAX], tpv[NMAX], epv[NMAX];
    int destroy_status[NMAX];
} mesh_arg;

static int mesh_rank(dl_ctx *ctx, void *argp)
{
    mesh_arg *a = argp;
    int r = dl_ctx_rank(ctx);
    dl_mesh m;
    memset(&m, 0, sizeof m);
    int st = dl_mesh_create(dl_ctx_comm(ctx), a->cfg.dp, a->cfg.pp, a->cfg.tp, a->cfg.ep, &m);
    a->status[r] = st;
    if (st != DL_OK)
        return st;
    a->m[r] = m;
    /* the same sequence of group collectives on every rank: each group's all-reduce runs at the
     * same time as the other groups' */
    if ((st = view_comm(m.dp_comm, r, &a->dpv[r], 10007)))
        return st;
    if ((st = view_comm(m.pp_comm, r, &a->ppv[r], 10007)))
        return st;
    if ((st = view_comm(m.tp_comm, r, &a->tpv[r], 10007)))
        return st;
    if ((st = view_comm(m.ep_comm, r, &a->epv[r], 0)))
        return st;
    a->destroy_status[r] = dl_mesh_destroy(&m);
    return a->destroy_status[r];
}

START_TEST(t_mesh)
{
    const mesh_cfg *cfg = DL_TEST_SMALL ? &mesh_small[_i] : &mesh_full[_i];
    const int n = cfg->n, dp = cfg->dp, pp = cfg->pp, tp = cfg->tp, ep = cfg->ep;
    mesh_arg *a = calloc(1, sizeof *a);
    a->cfg = *cfg;
    int st = tu_run_world(n, mesh_rank, a);
    ck_assert_msg(st == DL_OK, "mesh dp=%d pp=%d tp=%d ep=%d on %d: %s: %s", dp, pp, tp, ep, n,
                  dl_strstatus(st), dl_errmsg());
    errs e = {0};
    char what[128];
    for (int w = 0; w < n; w++) {
        /* Megatron order: w = pp_rank * dp * tp + dp_rank * tp + tp_rank */
        int tpr = w % tp, dpr = (w / tp) % dp, ppr = w / (dp * tp);
        const dl_mesh *m = &a->m[w];
        snprintf(what, sizeof what, "mesh dp=%d pp=%d tp=%d ep=%d", dp, pp, tp, ep);
        if (m->dp != dp || m->pp != pp || m->tp != tp || m->ep != ep)
            efail(&e, "%s: world rank %d: sizes %d/%d/%d/%d in the struct", what, w, m->dp, m->pp,
                  m->tp, m->ep);
        if (m->dp_rank != dpr || m->pp_rank != ppr || m->tp_rank != tpr)
            efail(&e, "%s: world rank %d: (dp, pp, tp) ranks (%d, %d, %d), expected (%d, %d, %d)",
                  what, w, m->dp_rank, m->pp_rank, m->tp_rank, dpr, ppr, tpr);
        if (m->ep_rank != dpr % ep)
            efail(&e, "%s: world rank %d: ep rank %d, expected %d", what, w, m->ep_rank, dpr % ep);
        int want[NMAX];
        for (int i = 0; i < dp; i++) want[i] = ppr * dp * tp + i * tp + tpr;
        snprintf(what, sizeof what, "mesh dp=%d pp=%d tp=%d ep=%d: dp group", dp, pp, tp, ep);
        check_view(&e, what, w, &a->dpv[w], want, dp, 1);
        for (int i = 0; i < pp; i++) want[i] = i * dp * tp + dpr * tp + tpr;
        snprintf(what, sizeof what, "mesh dp=%d pp=%d tp=%d ep=%d: pp group", dp, pp, tp, ep);
        check_view(&e, what, w, &a->ppv[w], want, pp, 1);
        for (int i = 0; i < tp; i++) want[i] = ppr * dp * tp + dpr * tp + i;
        snprintf(what, sizeof what, "mesh dp=%d pp=%d tp=%d ep=%d: tp group", dp, pp, tp, ep);
        check_view(&e, what, w, &a->tpv[w], want, tp, 1);
        snprintf(what, sizeof what, "mesh dp=%d pp=%d tp=%d ep=%d: ep group", dp, pp, tp, ep);
        if (ep == 1) {
            check_view(&e, what, w, &a->epv[w], want, 0, 0); /* NULL when ep == 1 */
        } else {
            int g = dpr / ep;
            for (int i = 0; i < ep; i++) want[i] = ppr * dp * tp + (g * ep + i) * tp + tpr;
            check_view(&e, what, w, &a->epv[w], want, ep, 0);
        }
        if (a->destroy_status[w] != DL_OK)
            efail(&e, "world rank %d: dl_mesh_destroy failed", w);
    }
    free(a);
    ASSERT_NO_ERRS(e);
}
END_TEST

/* A peer aborts the world after the mesh's first split: the other ranks' dl_mesh_create fails
 * and leaves no communicator behind (all NULL; the sanitizer build's leak check covers the rest). */
typedef struct aborted_mesh_arg {
    int st[NMAX], left[NMAX];
    dl__test_hook *watch;
} aborted_mesh_arg;

static int aborted_mesh_rank(dl_ctx *ctx, void *argp)
{
    aborted_mesh_arg *a = argp;
    dl_comm *world = dl_ctx_comm(ctx);
    int r = dl_ctx_rank(ctx);
    if (r == 0) {
        /* dp 2 x tp 2: the mesh's first split is the tp group (color dp_rank, key tp_rank) */
        dl_comm *tp;
        int st = dl_comm_split(world, 0, 0, &tp);
        /* the peers finish that split without rank 0 and then wait for it in the next: fail
         * once the channels' watch shows all three asleep (a delay would be a guess) */
        tu_wait_asleep(a->watch, DL__CHAN_EITHER, 3);
        dl_comm_fail(world);
        if (st == DL_OK)
            dl_comm_free(tp);
        return dl_error(DL_EUSER, "rank 0 fails on purpose");
    }
    dl_mesh m;
    a->st[r] = dl_mesh_create(world, 2, 1, 2, 1, &m);
    a->left[r] =
        (m.tp_comm != NULL) + (m.dp_comm != NULL) + (m.pp_comm != NULL) + (m.ep_comm != NULL);
    if (a->st[r] == DL_OK)
        dl_mesh_destroy(&m);
    return a->st[r];
}

START_TEST(t_mesh_aborted)
{
    aborted_mesh_arg a = {0};
    dl__test_hook hook = {0};
    tu_chan_watch(&hook, 0);
    a.watch = &hook;
    int st = tu_run_world(4, aborted_mesh_rank, &a);
    tu_chan_unwatch();
    ck_assert_int_ne(st, DL_OK);
    for (int r = 1; r < 4; r++) {
        ck_assert_msg(a.st[r] != DL_OK, "rank %d: mesh created in an aborted world", r);
        ck_assert_msg(a.left[r] == 0, "rank %d: %d communicators left after a failed mesh", r,
                      a.left[r]);
    }
}
END_TEST

typedef struct bad_mesh_arg {
    int st[NMAX][8];
    int ok_after[NMAX];
} bad_mesh_arg;

static const int bad_mesh[][4] = {
    {3, 1, 2, 1},   /* 6 != 8 */
    {2, 2, 3, 1},   /* 12 != 8 */
    {2, 2, 2, 3},   /* ep does not divide dp */
    {4, 1, 2, 3},   /* ep does not divide dp */
    {0, 4, 2, 1},   /* zero */
    {-2, -2, 2, 1}, /* negative sizes whose product is 8 */
    {2, 2, 2, 0},   /* ep 0 */
    {8, 1, 1, -8},  /* negative ep */
};
#define NBADMESH ((int)(sizeof bad_mesh / sizeof bad_mesh[0]))

static int bad_mesh_rank(dl_ctx *ctx, void *argp)
{
    bad_mesh_arg *a = argp;
    int r = dl_ctx_rank(ctx);
    for (int k = 0; k < NBADMESH; k++) {
        dl_mesh m;
        memset(&m, 0, sizeof m);
        a->st[r][k] = dl_mesh_create(dl_ctx_comm(ctx), bad_mesh[k][0], bad_mesh[k][1],
                                     bad_mesh[k][2], bad_mesh[k][3], &m);
        if (a->st[r][k] == DL_OK)
            dl_mesh_destroy(&m);
    }
    dl_mesh m;
    int st = dl_mesh_create(dl_ctx_comm(ctx), 2, 2, 2, 2, &m);
    a->ok_after[r] = st;
    if (st == DL_OK)
        st = dl_mesh_destroy(&m);
    return st;
}

START_TEST(t_mesh_invalid)
{
    bad_mesh_arg a;
    memset(&a, 0, sizeof a);
    int st = tu_run_world(8, bad_mesh_rank, &a);
    ck_assert_msg(st == DL_OK, "%s: %s", dl_strstatus(st), dl_errmsg());
    for (int r = 0; r < 8; r++) {
        for (int k = 0; k < NBADMESH; k++)
            ck_assert_msg(a.st[r][k] == DL_EINVAL,
                          "rank %d: dl_mesh_create(dp=%d, pp=%d, tp=%d, ep=%d) on 8 ranks "
                          "returned %s, expected DL_EINVAL",
                          r, bad_mesh[k][0], bad_mesh[k][1], bad_mesh[k][2], bad_mesh[k][3],
                          dl_strstatus(a.st[r][k]));
        ck_assert_msg(a.ok_after[r] == DL_OK, "rank %d: a valid mesh after the rejected ones: %s",
                      r, dl_strstatus(a.ok_after[r]));
    }
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* point-to-point between arbitrary pairs                                                       */

/* message k: 1 element .. 1 MiB, cycling types */
static const size_t p2p_counts[] = {1, 7, 10, 11, 1000, 1025, 65537, 262144};
#define NP2P ((int)(sizeof p2p_counts / sizeof p2p_counts[0]))
static dl_dtype p2p_type(int k) { return k == NP2P - 1 ? DL_F32 : (dl_dtype)(k % 3); }
static uint64_t p2p_seed(int k, int src_world)
{
    return 0x9292ull * 1000 + (uint64_t)k * 31 + (uint64_t)src_world;
}

typedef struct p2p_arg {
    int n;
    int reversed; /* run on a comm with reversed rank order (comm rank i = world rank n-1-i) */
    unsigned char *got[NMAX][NMAX][NP2P]; /* [receiver comm rank][sender comm rank][k] */
    int status[NMAX];
    uint64_t bytes_sent[NMAX], bytes_recv[NMAX];
} p2p_arg;

static int p2p_rank(dl_ctx *ctx, void *argp)
{
    p2p_arg *a = argp;
    dl_comm *c = dl_ctx_comm(ctx), *rc = NULL;
    int wr = dl_ctx_rank(ctx), n = dl_ctx_size(ctx);
    if (a->reversed) {
        int st = dl_comm_split(c, 0, -wr, &rc);
        if (st != DL_OK)
            return st;
        c = rc;
    }
    int me = dl_comm_rank(c);
    dl_comm_reset_stats(c);
    /* one global sequence of (sender, receiver) pairs, the same on every rank: deadlock-free
     * whatever send waits for */
    for (int s = 0; s < n; s++)
        for (int d = 0; d < n; d++) {
            if (s == d || (me != s && me != d))
                continue;
            for (int k = 0; k < NP2P; k++) {
                dl_dtype t = p2p_type(k);
                int st;
                if (me == s) {
                    void *buf = tu_alloc(p2p_counts[k] * tu_tsize(t));
                    if (!buf)
                        return dl_error(DL_ENOMEM, "test: no memory");
                    tu_fill(t, buf, p2p_counts[k], p2p_seed(k, wr), 0, 0);
                    st = dl_send(c, buf, p2p_counts[k], t, d, DL_PURPOSE_ACTIVATIONS);
                    free(buf);
                } else {
                    st = dl_recv(c, a->got[me][s][k], p2p_counts[k], t, s, DL_PURPOSE_ACTIVATIONS);
                }
                if (st != DL_OK) {
                    a->status[wr] = st;
                    return st;
                }
            }
        }
    dl_comm_stats stt;
    dl_comm_get_stats(c, &stt);
    a->bytes_sent[me] = stt.bytes_sent[DL_PURPOSE_ACTIVATIONS];
    a->bytes_recv[me] = stt.bytes_recv[DL_PURPOSE_ACTIVATIONS];
    return rc ? dl_comm_free(rc) : DL_OK;
}

START_TEST(t_p2p_pairs)
{
    int n = DL_TEST_SMALL ? 3 : 5;
    int reversed = _i;
    p2p_arg *a = calloc(1, sizeof *a);
    a->n = n;
    a->reversed = reversed;
    uint64_t per_pair = 0;
    for (int k = 0; k < NP2P; k++) per_pair += p2p_counts[k] * tu_tsize(p2p_type(k));
    for (int d = 0; d < n; d++)
        for (int s = 0; s < n; s++)
            for (int k = 0; k < NP2P; k++) {
                size_t b = p2p_counts[k] * tu_tsize(p2p_type(k));
                a->got[d][s][k] = tu_alloc(b);
                memset(a->got[d][s][k], 0xA5, b);
            }
    int st = tu_run_world(n, p2p_rank, a);
    ck_assert_msg(st == DL_OK, "n=%d reversed=%d: %s: %s", n, reversed, dl_strstatus(st),
                  dl_errmsg());
    errs e = {0};
    for (int d = 0; d < n; d++) {
        for (int s = 0; s < n; s++) {
            if (s == d)
                continue;
            int src_world = reversed ? n - 1 - s : s;
            for (int k = 0; k < NP2P; k++) {
                dl_dtype t = p2p_type(k);
                size_t b = p2p_counts[k] * tu_tsize(t);
                void *want = tu_alloc(b);
                tu_fill(t, want, p2p_counts[k], p2p_seed(k, src_world), 0, 0);
                if (memcmp(a->got[d][s][k], want, b) != 0)
                    efail(&e,
                          "reversed=%d: comm rank %d: message %d (%zu x %s) from comm rank %d "
                          "(world %d) is wrong or out of order",
                          reversed, d, k, p2p_counts[k], dl_dtype_name(t), s, src_world);
                free(want);
            }
        }
        if (a->bytes_sent[d] != (uint64_t)(n - 1) * per_pair)
            efail(&e, "comm rank %d: %llu bytes sent counted, expected %llu", d,
                  (unsigned long long)a->bytes_sent[d], (unsigned long long)((n - 1) * per_pair));
        if (a->bytes_recv[d] != (uint64_t)(n - 1) * per_pair)
            efail(&e, "comm rank %d: %llu bytes received counted, expected %llu", d,
                  (unsigned long long)a->bytes_recv[d], (unsigned long long)((n - 1) * per_pair));
    }
    for (int d = 0; d < n; d++)
        for (int s = 0; s < n; s++)
            for (int k = 0; k < NP2P; k++) free(a->got[d][s][k]);
    free(a);
    ASSERT_NO_ERRS(e);
}
END_TEST

/* Many small messages in a row to one peer, then the other way: FIFO order across slot wrap. */
#define STREAM_MSGS 2000

typedef struct stream_arg {
    int wrong[2];
    int status[2];
} stream_arg;

static int stream_rank(dl_ctx *ctx, void *argp)
{
    stream_arg *a = argp;
    dl_comm *c = dl_ctx_comm(ctx);
    int r = dl_ctx_rank(ctx);
    for (int dir = 0; dir < 2; dir++) {
        int sender = dir;
        for (int i = 0; i < STREAM_MSGS; i++) {
            size_t cnt = 1 + (size_t)(tu_rand_u64(42, dir, (uint64_t)i) % 3000);
            uint32_t buf[3000];
            int st;
            if (r == sender) {
                for (size_t j = 0; j < cnt; j++) buf[j] = (uint32_t)i * 7919u + (uint32_t)j;
                st = dl_send(c, buf, cnt, DL_F32, 1 - r, DL_PURPOSE_OTHER);
            } else {
                memset(buf, 0, cnt * 4);
                st = dl_recv(c, buf, cnt, DL_F32, 1 - r, DL_PURPOSE_OTHER);
                for (size_t j = 0; j < cnt; j++)
                    if (buf[j] != (uint32_t)i * 7919u + (uint32_t)j) {
                        a->wrong[r]++;
                        break;
                    }
            }
            if (st != DL_OK) {
                a->status[r] = st;
                return st;
            }
        }
    }
    return DL_OK;
}

START_TEST(t_p2p_stream)
{
    stream_arg a;
    memset(&a, 0, sizeof a);
    int st = tu_run_world(2, stream_rank, &a);
    ck_assert_msg(st == DL_OK, "%s: %s", dl_strstatus(st), dl_errmsg());
    ck_assert_msg(a.wrong[0] == 0 && a.wrong[1] == 0,
                  "%d + %d messages arrived wrong or out of order", a.wrong[0], a.wrong[1]);
}
END_TEST


/* Non-blocking sends: both ranks lend large buffers to each other at once (blocking rendezvous
 * sends would deadlock), a lent send is not done before the peer received it, the requests
 * complete, and a receiver expecting another tag gets DL_EMISMATCH. */
#define ISEND_N 3
#define ISEND_COUNT 50000

typedef struct isend_arg {
    int wrong[2];
    int done_early[2]; /* dl_test said done before the peer could have received */
    int status[2];
    int mismatch_status; /* rank 1's receive with the wrong tag */
    atomic_int tested;   /* ranks that ran their early dl_test */
} isend_arg;

static int isend_rank(dl_ctx *ctx, void *argp)
{
    isend_arg *a = argp;
    dl_comm *c = dl_ctx_comm(ctx);
    int r = dl_ctx_rank(ctx), peer = 1 - r, st;
    static double out[2][ISEND_N][ISEND_COUNT], in[2][ISEND_COUNT];
    dl_request *req[ISEND_N];
    for (int i = 0; i < ISEND_N; i++) {
        for (int j = 0; j < ISEND_COUNT; j++) out[r][i][j] = r * 1e6 + i * 1e5 + j;
        if ((st = dl_isend(c, out[r][i], ISEND_COUNT, DL_F64, peer, 100 + i, DL_PURPOSE_OTHER,
                           &req[i])))
            goto fail;
    }
    int done;
    if ((st = dl_test(req[0], &done)))
        goto fail;
    /* the peer cannot have received before both tested (a barrier on c would queue behind the
     * sends on the same links, so the test synchronises through the argument) */
    a->done_early[r] = done;
    atomic_fetch_add(&a->tested, 1);
    while (atomic_load(&a->tested) < 2) sched_yield();
    for (int i = 0; i < ISEND_N; i++) {
        if ((st = dl_recv_tag(c, in[r], ISEND_COUNT, DL_F64, peer, 100 + i, DL_PURPOSE_OTHER)))
            goto fail;
        for (int j = 0; j < ISEND_COUNT; j++)
            if (in[r][j] != peer * 1e6 + i * 1e5 + j) {
                a->wrong[r]++;
                break;
            }
    }
    if ((st = dl_wait(req[ISEND_N - 1])))
        goto fail;
    for (int i = 0; i < ISEND_N - 1; i++) {
        if ((st = dl_test(req[i], &done)) || (st = dl_wait(req[i])))
            goto fail;
        a->wrong[r] += !done; /* sent before the last, which is done */
    }
    /* a wrong tag: rank 0 sends tag 7, rank 1 expects 8 */
    if (r == 0) {
        dl_request *q;
        if ((st = dl_isend(c, out[0][0], 4, DL_F64, 1, 7, DL_PURPOSE_OTHER, &q)) == DL_OK)
            dl_wait(q); /* taken (and refused) by rank 1, or aborted: either way freed */
    } else {
        a->mismatch_status = dl_recv_tag(c, in[1], 4, DL_F64, 0, 8, DL_PURPOSE_OTHER);
        st = DL_OK;
    }
    return st;
fail:
    a->status[r] = st;
    return st;
}

START_TEST(t_p2p_isend)
{
    isend_arg a;
    memset(&a, 0, sizeof a);
    int st = tu_run_world(2, isend_rank, &a);
    (void)st; /* the world fails by design (the mismatched tag); what matters is below */
    ck_assert_msg(a.status[0] == DL_OK && a.status[1] == DL_OK, "isend/recv failed: %d %d (%s)",
                  a.status[0], a.status[1], dl_errmsg());
    ck_assert_msg(a.wrong[0] == 0 && a.wrong[1] == 0, "%d + %d wrong payloads or undone sends",
                  a.wrong[0], a.wrong[1]);
    ck_assert_msg(!a.done_early[0] && !a.done_early[1], "a lent send was done before its receive");
    ck_assert_int_eq(a.mismatch_status, DL_EMISMATCH);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */

static Suite *comm_suite(void)
{
    Suite *s = suite_create("comm");
    TCase *tc = tcase_create("comm");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, t_block);
    tcase_add_test(tc, t_names);
    tcase_add_loop_test(tc, t_world_comm, 0, DL_TEST_SMALL ? 3 : 5);
    tcase_add_loop_test(tc, t_split, 0, DL_TEST_SMALL ? NSPLITS : 4 * NSPLITS);
    tcase_add_test(tc, t_split_churn);
    tcase_add_loop_test(tc, t_mesh, 0,
                        DL_TEST_SMALL ? (int)(sizeof mesh_small / sizeof mesh_small[0])
                                      : (int)(sizeof mesh_full / sizeof mesh_full[0]));
    tcase_add_test(tc, t_mesh_invalid);
    tcase_add_test(tc, t_mesh_aborted);
    tcase_add_loop_test(tc, t_p2p_pairs, 0, 2);
    tcase_add_test(tc, t_p2p_stream);
    tcase_add_test(tc, t_p2p_isend);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(comm_suite());
    srunner_run_all(sr, CK_ENV);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
