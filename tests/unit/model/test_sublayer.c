/* The layer as sublayers with a split backward (model/sublayer.h): per sublayer kind (f64, tp 1
 * and 2) the input-gradient part against finite differences of the input and the weight-gradient
 * part against finite differences of every parameter, the input part writing no parameter
 * gradient; at the model, the input and weight parts of two micro-batches in the order
 * F0 F1 I1 I0 W0 W1 equal the whole backward in the plain order bitwise (f64, f32, bf16; tp 1
 * and 2), a skipped weight part fails that comparison (negative control), a weight part before
 * its input part is refused, and the deferred storage is the activations the sublayers declare;
 * through the pipeline engine (2 stages), 1F1B with I actions and deferred W actions equals 1F1B
 * bitwise on both stages, and leaving out one W fails that comparison. */
#include "../testutil.h"
#include <check.h>
#include <math.h>
#include <stddef.h>
#include "core/arena.h"
#include "model/sublayer.h"

enum { MB = 2, T = 8, C = 16, H = 4 };

/* ---- one sublayer against finite differences --------------------------------------------- */

typedef struct {
    const dl_sublayer_kind *kind;
    int tp;
    double worst_x, worst_w; /* largest relative errors seen (rank 0) */
    int wrote_param_grad;    /* the input part left a non-zero parameter gradient */
} fd_run;

static size_t param_numel(const dl_sub_param *p, int tp)
{
    size_t n = (size_t)p->rows * (size_t)p->cols;
    return p->sh == DL_SHARD_NONE ? n : n / (size_t)tp;
}

/* deterministic values: replicated tensors equal on every rank, shards differ by rank */
static double val(int q, size_t i, int rank, double scale, double base)
{
    uint64_t u = tu_splitmix64(((uint64_t)q << 40) ^ ((uint64_t)rank << 32) ^ i);
    return base + scale * ((double)(u >> 11) / 9007199254740992.0 - 0.5);
}

typedef struct {
    dl_sub_ctx c;
    const dl_sublayer_kind *k;
    double *p[8], *g[8], *x, *r;
    size_t np[8], N;
} fd_state;

/* L = sum(y * r) for fixed weights r: equal on every tp rank, since y is all-reduced */
static double fd_loss(fd_state *s)
{
    ck_assert_int_eq(s->k->fwd[1](&s->c), DL_OK);
    const double *y = s->c.y;
    double L = 0;
    for (size_t i = 0; i < s->N * C; i++) L += y[i] * s->r[i];
    return L;
}

/* Central difference of L in *v (every rank perturbs it when `all`, else rank 0 alone), as a
 * fraction of the tolerance. The truncation error h^2/6 |L'''| is below 1e-9 here (h = 1e-5,
 * third derivatives O(10) on these O(1) activations) and the rounding error about
 * eps sum|y r| / h = 2.2e-16 * 100 / 1e-5 = 2e-9, so |fd - g| <= 1e-7 + 1e-6 (|fd| + |g|) holds
 * with margin, while a missing or doubled term is off by O(|g|). */
static double fd_err(fd_state *s, double *v, int all, int rank, double g)
{
    double h = 1e-5, save = *v, lp, lm;
    if (all || rank == 0)
        *v = save + h;
    lp = fd_loss(s);
    if (all || rank == 0)
        *v = save - h;
    lm = fd_loss(s);
    *v = save;
    double fd = (lp - lm) / (2 * h);
    return fabs(fd - g) / (1e-7 + 1e-6 * (fabs(fd) + fabs(g)));
}

static double *fill(size_t n, int q, int rank, double scale, double base)
{
    double *b = malloc(sizeof(double) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) b[i] = val(q, i, rank, scale, base);
    return b;
}

static int fd_rank(dl_ctx *x, void *arg)
{
    fd_run *fr = arg;
    int rank = dl_ctx_rank(x), tp = fr->tp;
    fd_state s = {.k = fr->kind, .N = (size_t)MB * T};
    dl_sub_ctx *c = &s.c;
    c->d = (dl_sub_dims){.MB = MB,
                         .B = MB,
                         .T = T,
                         .C = C,
                         .Cl = C / tp,
                         .Fl = 4 * C / tp,
                         .NHl = H / tp,
                         .HS = C / H,
                         .tp = tp}; /* dense: no experts */
    c->tp_comm = tp > 1 ? dl_ctx_comm(x) : NULL;
    size_t N = s.N, na = s.k->act_elems(&c->d), ns = s.k->stash_elems(&c->d);
    void *w[8], *dw[8];
    dl_gpt_config cfg = {.vocab = 256, .seq = T, .layers = 1, .d_model = C, .heads = H};
    dl_sub_param prs[8];
    int np = s.k->nparams(&cfg, 0);
    for (int q = 0; q < np; q++) {
        const dl_sub_param *pr = &prs[q];
        s.k->param(&cfg, 0, q, &prs[q]);
        int ln = strstr(pr->name, "ln_") != NULL, bias = strstr(pr->name, ".bias") != NULL;
        s.np[q] = param_numel(pr, tp);
        int r = pr->sh == DL_SHARD_NONE ? 0 : rank + 1;
        s.p[q] = fill(s.np[q], q, r, ln || bias ? 0.2 : 0.4, ln && !bias ? 1.0 : 0.0);
        s.g[q] = calloc(s.np[q], sizeof(double));
        w[q] = s.p[q], dw[q] = s.g[q];
    }
    c->w = w, c->dw = dw;
    s.x = fill(N * C, 100, 0, 2.0, 0.0);
    s.r = fill(N * C, 101, 0, 1.0, 0.0);
    c->x = s.x;
    c->y = calloc(N * C, sizeof(double));
    c->act = calloc(na, sizeof(double));
    c->stash = calloc(ns, sizeof(double));
    c->dx = malloc(sizeof(double) * N * C);
    c->ws_dln = calloc(N * C, sizeof(double));
    c->ws_datty = calloc(N * C, sizeof(double));
    c->ws_dqkv = calloc(N * 3 * C, sizeof(double));
    c->ws_dfc = calloc(N * 4 * C, sizeof(double));
    c->ws_scratch = calloc((size_t)T * T, sizeof(double));
    fd_loss(&s);
    memcpy(c->dx, s.r, sizeof(double) * N * C);
    int rc = s.k->bwd[1](c, DL_BWD_INPUT);
    for (int q = 0; q < np && rank == 0; q++)
        for (size_t i = 0; i < s.np[q]; i++) fr->wrote_param_grad |= s.g[q][i] != 0;
    if (rc == DL_OK)
        rc = s.k->bwd[1](c, DL_BWD_WEIGHT);
    ck_assert_int_eq(rc, DL_OK);
    double *gx = malloc(sizeof(double) * N * C);
    memcpy(gx, c->dx, sizeof(double) * N * C);
    for (int t = 0; t < 6; t++) { /* the input gradient: x is replicated */
        size_t i = (size_t)(tu_splitmix64((uint64_t)t + 7) % (N * C));
        double e = fd_err(&s, &s.x[i], 1, rank, gx[i]);
        if (rank == 0 && e > fr->worst_x) /* rank 0 alone writes the result */
            fr->worst_x = e;
    }
    for (int q = 0; q < np; q++) /* every parameter: a few elements each */
        for (int t = 0; t < 4; t++) {
            size_t i = (size_t)(tu_splitmix64((uint64_t)(q * 16 + t)) % s.np[q]);
            int all = prs[q].sh == DL_SHARD_NONE;
            double e = fd_err(&s, &s.p[q][i], all, rank, s.g[q][i]);
            if (rank == 0 && e > fr->worst_w)
                fr->worst_w = e;
        }
    for (int q = 0; q < np; q++) free(s.p[q]), free(s.g[q]);
    free(s.x), free(s.r), free(gx), free(c->y), free(c->act), free(c->stash), free(c->dx);
    free(c->ws_dln), free(c->ws_datty), free(c->ws_dqkv), free(c->ws_dfc), free(c->ws_scratch);
    return DL_OK;
}

static void fd_check(int kind, int tp)
{
    fd_run r = {.kind = dl__sublayer_kinds[kind], .tp = tp};
    ck_assert_msg(tu_run_world(tp, fd_rank, &r) == DL_OK, "%s", dl_errmsg());
    ck_assert_msg(!r.wrote_param_grad, "%s tp %d: the input part wrote a parameter gradient",
                  r.kind->name, tp);
    ck_assert_msg(r.worst_x <= 1 && r.worst_w <= 1,
                  "%s tp %d: input gradient %.3g, weight gradient %.3g of the tolerance",
                  r.kind->name, tp, r.worst_x, r.worst_w);
}

START_TEST(fd_sublayers)
{
    /* the dense kinds (the mixture of experts has its own test, tests/unit/model/test_moe.c) */
    for (int k = 0; k < DL_SUB_MLP_MOE; k++) {
        fd_check(k, 1);
        fd_check(k, 2);
    }
}
END_TEST

/* ---- the model: split backward against the whole one ------------------------------------- */

static dl_gpt_config tiny(void)
{
    dl_gpt_config c = {.vocab = 256, .seq = T, .layers = 2, .d_model = C, .heads = H, .tie = 1};
    return c;
}

static void batch(int mb, int *in, int *tg)
{
    for (int i = 0; i < MB * T; i++) {
        in[i] = (int)(tu_splitmix64((uint64_t)(i * 7 + 1 + 1000 * mb)) % 256);
        tg[i] = (int)(tu_splitmix64((uint64_t)(i * 13 + 5 + 1000 * mb)) % 256);
    }
}

enum { ORDER_PLAIN, ORDER_SPLIT, ORDER_SKIP_W };

/* the gradient-ready notifications of a run, in order */
typedef struct {
    size_t at[64];
    int n;
} ready_log;

static int log_ready(size_t first, void *arg)
{
    ready_log *r = arg;
    if (r->n < 64)
        r->at[r->n++] = first;
    return DL_OK;
}

typedef struct {
    dl_dtype dt;
    int tp;
    int ready_same;   /* rank 0: the split order notified the same units in the same order */
    int same[2];      /* per rank: the split order's gradients equal the plain order's bitwise */
    int skip_same[2]; /* per rank, negative control: W1 skipped, yet equal (must stay 0) */
} eq_run;

/* Two micro-batches into the gradient: plain F0 B0 F1 B1 (one slot), or F0 F1 I1 I0 W0 W1 on two
 * slots (the second W left out for the negative control). Returns the gradients (malloc). */
static void *grads_of(dl_ctx *x, const eq_run *r, int order, size_t *bytes, ready_log *rl)
{
    dl_gpt_opts o = {.cfg = tiny(),
                     .dtype = r->dt,
                     .micro_batch = MB,
                     .tp = r->tp,
                     .tp_comm = r->tp > 1 ? dl_ctx_comm(x) : NULL,
                     .seed = 5,
                     .arena = dl_ctx_arena(x),
                     .act_slots = 2,
                     .defer_w = order != ORDER_PLAIN};
    dl_gpt *g;
    ck_assert_int_eq(dl_gpt_create(&o, &g), DL_OK);
    dl_gpt_zero_grads(g);
    int in[2][MB * T], tg[2][MB * T];
    batch(0, in[0], tg[0]);
    batch(1, in[1], tg[1]);
    double dl = 1.0 / (2 * MB * T), loss;
    if (order == ORDER_PLAIN) {
        for (int m = 0; m < 2; m++) {
            ck_assert_int_eq(dl_gpt_stage_forward(g, 0, 0, in[m], tg[m], MB, &loss), DL_OK);
            ck_assert_int_eq(dl_gpt_stage_backward(g, 0, 0, dl, log_ready, rl), DL_OK);
        }
    } else {
        for (int m = 0; m < 2; m++)
            ck_assert_int_eq(dl_gpt_stage_forward(g, m, 0, in[m], tg[m], MB, &loss), DL_OK);
        ck_assert_int_eq(dl_gpt_stage_backward_input(g, 1, 0, dl), DL_OK);
        ck_assert_int_eq(dl_gpt_stage_backward_input(g, 0, 0, dl), DL_OK);
        ck_assert_int_eq(rl->n, 0); /* the input parts complete no unit */
        ck_assert_int_eq(dl_gpt_stage_backward_weight(g, 0, 0, log_ready, rl), DL_OK);
        if (order == ORDER_SPLIT)
            ck_assert_int_eq(dl_gpt_stage_backward_weight(g, 1, 0, log_ready, rl), DL_OK);
    }
    *bytes = dl_gpt_numel(g) * dl_dtype_size(r->dt);
    void *out = malloc(*bytes);
    memcpy(out, dl_gpt_grads(g), *bytes);
    dl_gpt_destroy(g);
    return out;
}

static int eq_rank(dl_ctx *x, void *arg)
{
    eq_run *r = arg;
    int rank = dl_ctx_rank(x);
    size_t n;
    ready_log lp = {.n = 0}, ls = {.n = 0}, lk = {.n = 0};
    void *plain = grads_of(x, r, ORDER_PLAIN, &n, &lp);
    void *split = grads_of(x, r, ORDER_SPLIT, &n, &ls);
    void *skip = grads_of(x, r, ORDER_SKIP_W, &n, &lk);
    /* head, layers last to first, embeddings; per micro-batch (2 layers: 4 units, twice) */
    if (rank == 0)
        r->ready_same = lp.n == 8 && ls.n == 8 && !memcmp(lp.at, ls.at, sizeof lp.at) &&
                        lp.at[3] == 0 && lp.at[0] > lp.at[1] && lp.at[1] > lp.at[2];
    r->same[rank] = !memcmp(plain, split, n);
    if (!memcmp(plain, skip, n))
        r->skip_same[rank] = 1;
    free(plain), free(split), free(skip);
    return DL_OK;
}

START_TEST(split_equals_whole)
{
    const dl_dtype dts[] = {DL_F64, DL_F32, DL_BF16};
    for (int t = 1; t <= 2; t++)
        for (int i = 0; i < 3; i++) {
            eq_run r = {.dt = dts[i], .tp = t};
            ck_assert_msg(tu_run_world(t, eq_rank, &r) == DL_OK, "%s", dl_errmsg());
            for (int k = 0; k < t; k++)
                ck_assert_msg(r.same[k],
                              "%s tp %d rank %d: F0 F1 I1 I0 W0 W1 differs from F0 B0 F1 B1",
                              dl_dtype_name(dts[i]), t, k);
            ck_assert_msg(!r.skip_same[0] && !r.skip_same[1],
                          "%s tp %d: the comparison passes with W1 skipped", dl_dtype_name(dts[i]),
                          t);
            ck_assert_msg(r.ready_same, "%s tp %d: the weight parts notified other units",
                          dl_dtype_name(dts[i]), t);
        }
}
END_TEST

/* A weight part before its input part, a second input part, a forward over a pending weight
 * part, and a split backward without the deferred storage are refused, naming what failed. */
START_TEST(order_refused)
{
    dl_arena *a;
    ck_assert_int_eq(dl_arena_create(&a, 0, 0), DL_OK);
    dl_gpt_opts o = {.cfg = tiny(), .dtype = DL_F64, .micro_batch = MB, .seed = 5, .arena = a};
    dl_gpt *g;
    int in[MB * T], tg[MB * T];
    batch(0, in, tg);
    double loss, dl = 1.0 / (MB * T);
    ck_assert_int_eq(dl_gpt_create(&o, &g), DL_OK);
    ck_assert_int_eq(dl_gpt_stage_forward(g, 0, 0, in, tg, MB, &loss), DL_OK);
    ck_assert_int_eq(dl_gpt_stage_backward_input(g, 0, 0, dl), DL_EINVAL);
    ck_assert_ptr_nonnull(strstr(dl_errmsg(), "defer_w"));
    dl_gpt_destroy(g);
    o.defer_w = 1;
    ck_assert_int_eq(dl_gpt_create(&o, &g), DL_OK);
    ck_assert_int_eq(dl_gpt_stage_forward(g, 0, 0, in, tg, MB, &loss), DL_OK);
    ck_assert_int_eq(dl_gpt_stage_backward_weight(g, 0, 0, NULL, NULL), DL_EINVAL);
    ck_assert_ptr_nonnull(strstr(dl_errmsg(), "no input gradient of slot 0 chunk 0"));
    ck_assert_int_eq(dl_gpt_stage_backward_input(g, 0, 0, dl), DL_OK);
    ck_assert_int_eq(dl_gpt_stage_backward_input(g, 0, 0, dl), DL_EINVAL);
    ck_assert_ptr_nonnull(strstr(dl_errmsg(), "pending"));
    ck_assert_int_eq(dl_gpt_stage_forward(g, 0, 0, in, tg, MB, &loss), DL_EINVAL);
    ck_assert_ptr_nonnull(strstr(dl_errmsg(), "pending"));
    ck_assert_int_eq(dl_gpt_stage_backward_weight(g, 0, 0, NULL, NULL), DL_OK);
    ck_assert_int_eq(dl_gpt_stage_backward_weight(g, 0, 0, NULL, NULL), DL_EINVAL);
    dl_gpt_destroy(g);
    o.recompute = DL_RECOMPUTE_FULL;
    ck_assert_int_eq(dl_gpt_create(&o, &g), DL_EINVAL);
    ck_assert_ptr_nonnull(strstr(dl_errmsg(), "recomputation"));
    dl_arena_destroy(a);
}
END_TEST

/* The deferred storage is what the sublayers declare: per slot, each layer's sublayers' stash
 * (attention: its output gradient, the Q/K/V gradient, ln_1's output gradient = 2NC + 3NC;
 * MLP: 2NC + 4NC at tp 1), plus the head's and the embeddings' N x C. The arena counts requested
 * bytes (its page alignment is outside the counts), so the peaks differ by exactly that. */
START_TEST(stash_accounted)
{
    dl_gpt_config cfg = tiny();
    const int slots = 3;
    uint64_t peak[2];
    for (int d = 0; d < 2; d++) {
        dl_arena *a;
        ck_assert_int_eq(dl_arena_create(&a, 0, 0), DL_OK);
        dl_gpt_opts o = {.cfg = cfg,
                         .dtype = DL_F64,
                         .micro_batch = MB,
                         .seed = 5,
                         .arena = a,
                         .act_slots = slots,
                         .defer_w = d};
        dl_gpt *g;
        ck_assert_int_eq(dl_gpt_create(&o, &g), DL_OK);
        dl_arena_stats st;
        dl_arena_get_stats(a, &st);
        peak[d] = st.peak[DL_MEM_ACTIVATIONS];
        dl_gpt_destroy(g);
        dl_arena_destroy(a);
    }
    dl_sub_dims dims =
        {.MB = MB, .B = MB, .T = T, .C = C, .Cl = C, .Fl = 4 * C, .NHl = H, .HS = C / H, .tp = 1};
    size_t NC = (size_t)MB * T * C, per_layer = 0;
    const dl_sublayer_kind *k[DL_SUB_MAX];
    int ns = dl__layer_sublayers(&cfg, 0, k);
    for (int j = 0; j < ns; j++) per_layer += k[j]->stash_elems(&dims);
    ck_assert_uint_eq(per_layer, 11 * NC);
    uint64_t declared = (uint64_t)slots * (cfg.layers * per_layer + 2 * NC) * sizeof(double);
    ck_assert_uint_eq(peak[1] - peak[0], declared);
}
END_TEST

/* ---- through the pipeline engine: I and W actions on two stages ---------------------------- */

enum { PM = 4 }; /* micro-batches */

typedef struct {
    dl_gpt *g;
    int stage, in[PM][MB * T], tg[PM][MB * T];
} pp_rank;

static void *t_fwd_in(void *arg, int mb, int ch)
{
    return dl_gpt_stage_input(((pp_rank *)arg)->g, mb, ch);
}
static int t_fwd(void *arg, int mb, int ch, const void **out)
{
    pp_rank *r = arg;
    double loss;
    int rc = dl_gpt_stage_forward(r->g, mb, ch, r->stage == 0 ? r->in[mb] : NULL,
                                  r->stage == 1 ? r->tg[mb] : NULL, MB, &loss);
    *out = r->stage == 1 ? NULL : dl_gpt_stage_output(r->g, mb, ch);
    return rc;
}
static void *t_bwd_in(void *arg, int mb, int ch)
{
    (void)mb, (void)ch;
    return dl_gpt_stage_grad(((pp_rank *)arg)->g);
}
static int t_bwd(void *arg, int mb, int ch, const void **din)
{
    pp_rank *r = arg;
    *din = r->stage == 0 ? NULL : dl_gpt_stage_grad(r->g);
    return dl_gpt_stage_backward(r->g, mb, ch, 1.0 / (PM * MB * T), NULL, NULL);
}
static int t_bwd_input(void *arg, int mb, int ch, const void **din)
{
    pp_rank *r = arg;
    *din = r->stage == 0 ? NULL : dl_gpt_stage_grad(r->g);
    return dl_gpt_stage_backward_input(r->g, mb, ch, 1.0 / (PM * MB * T));
}
static int t_bwd_weight(void *arg, int mb, int ch)
{
    return dl_gpt_stage_backward_weight(((pp_rank *)arg)->g, mb, ch, NULL, NULL);
}

/* 1F1B on 2 stages with every B split: I in its place, the W's deferred to the end, in
 * increasing micro-batch order (or, for the negative control, W0 left out and W1 twice
 * replaced by nothing: the comparison must fail) */
static dl_sched *split_sched(int skip_w0)
{
    dl_sched *b, *s;
    ck_assert_int_eq(dl_sched_1f1b(2, PM, &b), DL_OK);
    ck_assert_int_eq(dl_sched_new(2, PM, 1, &s), DL_OK);
    for (int q = 0; q < 2; q++)
        for (int i = 0; i < b->len[q]; i++) {
            dl_sched_action *x = &b->act[q][i];
            if (x->op == DL_SCHED_OPT)
                for (int j = skip_w0; j < PM; j++) dl_sched_push(s, q, DL_SCHED_W, j, 0);
            dl_sched_push(s, q, x->op == DL_SCHED_B ? DL_SCHED_I : x->op, x->mb, x->chunk);
        }
    dl_sched_free(b);
    return s;
}

typedef struct {
    int same[2], skip_same[2]; /* per rank */
} pp_result;

static void *pp_grads(dl_ctx *x, const dl_sched *s, size_t *bytes)
{
    pp_rank *r = calloc(1, sizeof *r);
    r->stage = dl_ctx_rank(x);
    dl_gpt_config cfg = tiny();
    dl_gpt_part part;
    int bounds[3] = {0, 1, 2};
    ck_assert_int_eq(dl_gpt_part_stage(&cfg, 2, 1, r->stage, bounds, &part), DL_OK);
    dl_gpt_opts o = {.cfg = cfg,
                     .dtype = DL_F64,
                     .micro_batch = MB,
                     .seed = 5,
                     .arena = dl_ctx_arena(x),
                     .part = &part,
                     .act_slots = PM,
                     .defer_w = dl_sched_splits(s, r->stage)};
    ck_assert_int_eq(dl_gpt_create(&o, &r->g), DL_OK);
    dl_gpt_zero_grads(r->g);
    for (int m = 0; m < PM; m++) batch(m, r->in[m], r->tg[m]);
    dl_pipe *e;
    ck_assert_int_eq(dl_pipe_create(dl_ctx_comm(x), (size_t)MB * T * C, DL_F64, dl_ctx_arena(x),
                                    &e),
                     DL_OK);
    dl_pipe_ops ops = {t_fwd_in, t_fwd, t_bwd_in, t_bwd, NULL};
    dl_pipe_split_ops split = {t_bwd_input, t_bwd_weight};
    dl_pipe_set_split(e, &split);
    ck_assert_msg(dl_pipe_run(e, s, &ops, r, 1, NULL, 0, NULL) == DL_OK, "%s", dl_errmsg());
    dl_pipe_destroy(e);
    *bytes = dl_gpt_numel(r->g) * sizeof(double);
    void *out = malloc(*bytes);
    memcpy(out, dl_gpt_grads(r->g), *bytes);
    dl_gpt_destroy(r->g);
    free(r);
    return out;
}

static int pp_rank_fn(dl_ctx *x, void *arg)
{
    pp_result *res = arg;
    dl_sched *plain, *split = split_sched(0), *skip = split_sched(1);
    ck_assert_int_eq(dl_sched_1f1b(2, PM, &plain), DL_OK);
    ck_assert_msg(dl_sched_validate(split) == DL_OK, "%s", dl_errmsg());
    size_t n;
    void *a = pp_grads(x, plain, &n), *b = pp_grads(x, split, &n);
    res->same[dl_ctx_rank(x)] = !memcmp(a, b, n);
    /* the negative control runs unvalidated (the validator refuses it: a stage never runs W0) */
    void *c = pp_grads(x, skip, &n);
    if (!memcmp(a, c, n))
        res->skip_same[dl_ctx_rank(x)] = 1;
    free(a), free(b), free(c);
    dl_sched_free(plain), dl_sched_free(split), dl_sched_free(skip);
    return DL_OK;
}

START_TEST(engine_split)
{
    pp_result res = {{0, 0}, {0, 0}};
    ck_assert_msg(tu_run_world(2, pp_rank_fn, &res) == DL_OK, "%s", dl_errmsg());
    ck_assert_msg(res.same[0] && res.same[1], "1F1B with I and deferred W differs from 1F1B");
    ck_assert_msg(!res.skip_same[0] && !res.skip_same[1], "the comparison passes with W0 left out");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("sublayer");
    TCase *tc = tcase_create("sublayer");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, fd_sublayers);
    tcase_add_test(tc, split_equals_whole);
    tcase_add_test(tc, order_refused);
    tcase_add_test(tc, stash_accounted);
    tcase_add_test(tc, engine_split);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
