/* distlab-lecture 02: lecture 17 §2 and §3 (its code 02) run for real on rank threads.
 *
 * §2   data parallelism: the library's GPT (dl_gpt) on 4 ranks, each its share of a batch, the
 *      gradients summed by a ring all-reduce (dl_allreduce), against the full batch on one rank;
 *      bytes each rank sent from the communicator's counters.
 * §3.3 the Megatron MLP Z = GeLU(X·A + a)·B + b: written out below with plain loops exactly as the
 *      lecture derives it, against the library's kernels (dl_linear_*, dl_gelu_*), and split over
 *      t = 2 and 4 rank threads (A by columns, B by rows, f and g as explicit all-reduces on a
 *      communicator split from the world) against one rank.
 * §3.4 attention split by heads 2 / 4 / 8 ways (library kernels on each rank's heads, output
 *      projection row-parallel) against one rank, and the library's GPT with tp = 2 counting its
 *      all-reduces per layer.
 * §3.5 the GPT-3-scale layer table from the planner (dl_plan_comm). */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "distlab.h"
#include "model/ops.h"
#include "lecture.h"

/* ---------------------------------------------------------------------------------------- */
/* Small helpers                                                                             */

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* uniform in [-scale, scale) */
static void fill(double *x, size_t n, double scale, uint64_t seed)
{
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++)
        x[i] = scale * (2.0 * (double)(splitmix64(&s) >> 11) / 9007199254740992.0 - 1.0);
}

static double maxabs(const double *x, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        if (fabs(x[i]) > m)
            m = fabs(x[i]);
    return m;
}

static double maxdiff(const double *a, const double *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        if (!(fabs(a[i] - b[i]) <= m))
            m = fabs(a[i] - b[i]); /* NaN propagates as a DIFF */
    return m;
}

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size);
    if (p == NULL) {
        fprintf(stderr, "distlab-lecture: out of memory\n");
        exit(1);
    }
    return p;
}

static void world_opts(dl_world_opts *o, int n)
{
    dl_world_opts_init(o);
    o->nranks = n;
    o->timeout_s = 60;
}

static double dmax(double a, double b) { return a > b || isnan(a) ? a : b; }

/* ---------------------------------------------------------------------------------------- */
/* §2 data parallelism                                                                       */

#define DP_RANKS 4
#define DP_BATCH 8 /* sequences in the global batch: 2 per rank */

typedef struct dp_run {
    dl_gpt_config cfg;
    dl_dtype dtype;
    const int *in, *tg; /* DP_BATCH x seq tokens */
    double *grads;      /* out (rank 0): the reduced gradient, as f64 */
    size_t numel;
    double loss;   /* mean loss over the global batch */
    uint64_t sent; /* gradient bytes rank 0 sent */
    uint64_t ops;  /* collectives the gradient reduction took */
    int algo_ring; /* the all-reduce ran the ring */
} dp_run;

static int dp_rank(dl_ctx *x, void *arg)
{
    dp_run *r = arg;
    int n = dl_ctx_size(x), rank = dl_ctx_rank(x), T = r->cfg.seq;
    int share = DP_BATCH / n;
    dl_gpt_opts o = {.cfg = r->cfg,
                     .dtype = r->dtype,
                     .micro_batch = share,
                     .tp = 1,
                     .seed = 7,
                     .arena = dl_ctx_arena(x)};
    dl_gpt *g;
    int rc = dl_gpt_create(&o, &g);
    if (rc)
        return rc;
    double loss = 0;
    dl_gpt_zero_grads(g);
    /* this rank's contiguous share of the global batch; d(mean over the global batch) */
    if ((rc = dl_gpt_forward(g, r->in + (size_t)rank * share * T, r->tg + (size_t)rank * share * T,
                             share, &loss)))
        goto out;
    if ((rc = dl_gpt_backward(g, 1.0 / ((double)DP_BATCH * T), NULL, NULL)))
        goto out;
    dl_comm *c = dl_ctx_comm(x);
    size_t numel = dl_gpt_numel(g);
    dl_comm_set_algo(c, DL_ALGO_RING);
    dl_comm_reset_stats(c);
    dl_comm_stats st0, st;
    dl_comm_get_stats(c, &st0);
    if (n > 1 && (rc = dl_allreduce(c, dl_gpt_grads(g), dl_gpt_grads(g), numel, r->dtype, DL_SUM,
                                    DL_PURPOSE_GRADS)))
        goto out;
    dl_comm_get_stats(c, &st);
    int ring = n == 1 || dl_comm_last_algo(c) == DL_ALGO_RING;
    /* the batch loss: mean of the ranks' means (equal shares) */
    double lsum = loss / n;
    if (n > 1 && (rc = dl_allreduce(c, &lsum, &lsum, 1, DL_F64, DL_SUM, DL_PURPOSE_LOSS)))
        goto out;
    if (rank == 0) {
        r->numel = numel;
        r->grads = xcalloc(numel, sizeof(double));
        const void *gr = dl_gpt_grads(g);
        for (size_t i = 0; i < numel; i++)
            r->grads[i] = r->dtype == DL_F64 ? ((const double *)gr)[i] : ((const float *)gr)[i];
        r->loss = lsum;
        r->sent = st.bytes_sent[DL_PURPOSE_GRADS];
        r->ops = st.ops - st0.ops;
        r->algo_ring = ring;
    }
out:
    dl_gpt_destroy(g);
    return rc;
}

static int run_dp(const dl_gpt_config *cfg, dl_dtype dtype, int n, const int *in, const int *tg,
                  dp_run *r)
{
    memset(r, 0, sizeof *r);
    r->cfg = *cfg;
    r->dtype = dtype;
    r->in = in;
    r->tg = tg;
    dl_world_opts o;
    world_opts(&o, n);
    if (dl_world_run(&o, dp_rank, r) != DL_OK)
        return lec_fail("data-parallel run");
    return 0;
}

static int section_dp(void)
{
    lec_text("§2 Data parallelism: %d rank threads, each its %d of %d sequences, gradients summed "
             "by a ring all-reduce,\n   against the whole batch on one rank (the library's GPT: "
             "2 layers, d_model 32, 4 heads, 16 positions)\n",
             DP_RANKS, DP_BATCH / DP_RANKS, DP_BATCH);
    dl_gpt_config cfg = {.vocab = 256, .seq = 16, .layers = 2, .d_model = 32, .heads = 4, .tie = 0};
    if (dl_gpt_config_check(&cfg, 1) != DL_OK)
        return lec_fail("model configuration");
    int *in = xcalloc((size_t)DP_BATCH * cfg.seq, sizeof(int));
    int *tg = xcalloc((size_t)DP_BATCH * cfg.seq, sizeof(int));
    uint64_t s = 17;
    for (int i = 0; i < DP_BATCH * cfg.seq; i++) {
        in[i] = (int)(splitmix64(&s) % 256);
        tg[i] = (int)(splitmix64(&s) % 256);
    }
    int ret = 0;
    static const dl_dtype types[2] = {DL_F64, DL_F32};
    for (int k = 0; k < 2 && ret == 0; k++) {
        dp_run one, dp;
        if (run_dp(&cfg, types[k], 1, in, tg, &one)) {
            ret = -1;
            break;
        }
        if (run_dp(&cfg, types[k], DP_RANKS, in, tg, &dp)) {
            free(one.grads);
            ret = -1;
            break;
        }
        double ad = maxdiff(one.grads, dp.grads, one.numel), ref = maxabs(one.grads, one.numel);
        double rel = ad / ref;
        char shown[128], label[160];
        size_t dsize = types[k] == DL_F64 ? 8 : 4;
        snprintf(label, sizeof label, "DP %d ranks vs full batch, max |grad diff| (%s, %zu params)",
                 DP_RANKS, dl_dtype_name(types[k]), one.numel);
        snprintf(shown, sizeof shown, "%.1e (rel %.1e)", ad, rel);
        if (types[k] == DL_F64)
            lec_fig("§2", "dp_grad_diff_f64", label, rel, shown,
                    "3.0e-08 in float32 (round-off); bound here: rel <= 1e-12 in f64",
                    lec_le(rel, 1e-12));
        else
            lec_fig("§2", "dp_grad_diff_f32", label, rel, shown,
                    "3.0e-08 (float32 round-off); bound: rel <= 1e-5", lec_le(rel, 1e-5));
        if (types[k] == DL_F64) {
            snprintf(shown, sizeof shown, "%.17g vs %.17g", dp.loss, one.loss);
            lec_fig("§2", "dp_loss", "batch mean loss, 4 ranks vs 1 rank (f64)",
                    fabs(dp.loss - one.loss), shown, "", LEC_INFO);
            double gbytes = (double)one.numel * dsize;
            double want = dl_plan_allreduce_sent(DP_RANKS, gbytes);
            snprintf(shown, sizeof shown, "%llu B = 2(N-1)/N x %.0f B (%s)",
                     (unsigned long long)dp.sent, gbytes, dp.algo_ring ? "ring" : "not the ring!");
            lec_fig("§2", "dp_bytes_sent", "gradient bytes each rank sent (dl_comm_get_stats)",
                    (double)dp.sent, shown, "2(N-1)/N x gradient bytes",
                    dp.algo_ring && one.numel % DP_RANKS == 0 ? lec_near((double)dp.sent, want, 0)
                                                              : LEC_DIFF);
            snprintf(shown, sizeof shown, "%llu", (unsigned long long)dp.ops);
            lec_fig("§2", "dp_comm_per_step", "GPU-to-GPU communications per iteration",
                    (double)dp.ops, shown, "1 (one all-reduce)", lec_near((double)dp.ops, 1, 0));
        }
        free(one.grads);
        free(dp.grads);
    }
    free(in);
    free(tg);
    return ret;
}

/* ---------------------------------------------------------------------------------------- */
/* §3.3 the MLP, by hand                                                                     */

/* Shapes: the lecture's weights per rank (512 on 4 ranks, 2048 on one) come from A (k x n) and
 * B (n x k) with k = 16 and n = 4k = 64: 2 k n = 2048, 2 k n / 4 = 512 (biases not counted). */
#define MK 16 /* k: model width (columns of X and Z) */
#define MN 64 /* n: hidden width, 4k */
#define MR 8  /* rows of X (the batch b) */

static double gelu(double x) { return 0.5 * x * (1.0 + erf(x / sqrt(2.0))); }
static double gelu_grad(double x)
{
    return 0.5 * (1.0 + erf(x / sqrt(2.0))) + x * exp(-0.5 * x * x) / sqrt(2.0 * M_PI);
}

/* Forward, the lecture's way: H = X·A + a, Y = GeLU(H), Z = Y·B (+ b when b != NULL).
 * X (N x k), A (k x n), a (n), B (n x k), b (k); row-major. */
static void mlp_fwd_hand(const double *X, const double *A, const double *a, const double *B,
                         const double *b, double *H, double *Y, double *Z, int N, int k, int n)
{
    for (int i = 0; i < N; i++)
        for (int j = 0; j < n; j++) {
            double s = a[j];
            for (int p = 0; p < k; p++) s += X[i * k + p] * A[p * n + j];
            H[i * n + j] = s;
            Y[i * n + j] = gelu(s);
        }
    for (int i = 0; i < N; i++)
        for (int q = 0; q < k; q++) {
            double s = b ? b[q] : 0.0;
            for (int j = 0; j < n; j++) s += Y[i * n + j] * B[j * k + q];
            Z[i * k + q] = s;
        }
}

/* Backward from G = dl/dZ: dB = Yᵀ G, db = Σ_rows G, dY = G Bᵀ, dH = dY ⊙ GeLU'(H),
 * dA = Xᵀ dH, da = Σ_rows dH, dX = dH Aᵀ. Writes every output (db may be NULL). */
static void mlp_bwd_hand(const double *X, const double *A, const double *B, const double *H,
                         const double *Y, const double *G, double *dX, double *dA, double *da,
                         double *dB, double *db, int N, int k, int n)
{
    double *dH = xcalloc((size_t)N * n, sizeof(double));
    for (int j = 0; j < n; j++)
        for (int q = 0; q < k; q++) {
            double s = 0;
            for (int i = 0; i < N; i++) s += Y[i * n + j] * G[i * k + q];
            dB[j * k + q] = s;
        }
    if (db)
        for (int q = 0; q < k; q++) {
            double s = 0;
            for (int i = 0; i < N; i++) s += G[i * k + q];
            db[q] = s;
        }
    for (int i = 0; i < N; i++)
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int q = 0; q < k; q++) s += G[i * k + q] * B[j * k + q];
            dH[i * n + j] = s * gelu_grad(H[i * n + j]);
        }
    for (int p = 0; p < k; p++)
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int i = 0; i < N; i++) s += X[i * k + p] * dH[i * n + j];
            dA[p * n + j] = s;
        }
    for (int j = 0; j < n; j++) {
        double s = 0;
        for (int i = 0; i < N; i++) s += dH[i * n + j];
        da[j] = s;
    }
    for (int i = 0; i < N; i++)
        for (int p = 0; p < k; p++) {
            double s = 0;
            for (int j = 0; j < n; j++) s += dH[i * n + j] * A[p * n + j];
            dX[i * k + p] = s;
        }
    free(dH);
}

typedef struct mlp_set { /* one rank's (or the whole) MLP: inputs and results */
    double X[MR * MK], A[MK * MN], a[MN], B[MN * MK], b[MK], G[MR * MK];
    double H[MR * MN], Y[MR * MN], Z[MR * MK];
    double dX[MR * MK], dA[MK * MN], da[MN], dB[MN * MK], db[MK];
} mlp_set;

static void transpose(const double *in, double *out, int rows, int cols)
{
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) out[j * rows + i] = in[i * cols + j];
}

/* The same MLP with the library's kernels (W_fc = Aᵀ, W_proj = Bᵀ, nn.Linear's layout). */
static void mlp_library(const mlp_set *s, mlp_set *o)
{
    double Wfc[MN * MK], Wproj[MK * MN], dWfc[MN * MK] = {0}, dWproj[MK * MN] = {0};
    double dY[MR * MN] = {0}, dH[MR * MN] = {0};
    transpose(s->A, Wfc, MK, MN);
    transpose(s->B, Wproj, MN, MK);
    dl_linear_fwd_f64(o->H, s->X, Wfc, s->a, MR, MK, MN);
    dl_gelu_fwd_f64(o->Y, o->H, (size_t)MR * MN);
    dl_linear_fwd_f64(o->Z, o->Y, Wproj, s->b, MR, MN, MK);
    memset(o->dX, 0, sizeof o->dX);
    memset(o->da, 0, sizeof o->da);
    memset(o->db, 0, sizeof o->db);
    dl_linear_bwd_f64(dY, dWproj, o->db, s->G, o->Y, Wproj, MR, MN, MK);
    dl_gelu_bwd_f64(dH, o->H, dY, (size_t)MR * MN);
    dl_linear_bwd_f64(o->dX, dWfc, o->da, dH, s->X, Wfc, MR, MK, MN);
    transpose(dWfc, o->dA, MN, MK);
    transpose(dWproj, o->dB, MK, MN);
}

/* Largest per-tensor relative difference (max|a-b| / max|ref|) over Z, dX, dA, da, dB, db. */
static double mlp_rel(const mlp_set *x, const mlp_set *ref)
{
    double m = 0;
    m = dmax(m, maxdiff(x->Z, ref->Z, MR * MK) / maxabs(ref->Z, MR * MK));
    m = dmax(m, maxdiff(x->dX, ref->dX, MR * MK) / maxabs(ref->dX, MR * MK));
    m = dmax(m, maxdiff(x->dA, ref->dA, MK * MN) / maxabs(ref->dA, MK * MN));
    m = dmax(m, maxdiff(x->da, ref->da, MN) / maxabs(ref->da, MN));
    m = dmax(m, maxdiff(x->dB, ref->dB, MN * MK) / maxabs(ref->dB, MN * MK));
    m = dmax(m, maxdiff(x->db, ref->db, MK) / maxabs(ref->db, MK));
    return m;
}

#define TP_WORLD 4
static const int TP_DEGREES[2] = {2, 4};

/* The tensor-parallel groups of degree t: consecutive world ranks, ordered by rank */
static int tp_split(dl_ctx *x, int t, dl_comm **tp)
{
    int wr = dl_ctx_rank(x);
    return dl_comm_split(dl_ctx_comm(x), wr / t, wr % t, tp);
}

typedef struct tp_mlp_run {
    const mlp_set *ref;       /* inputs and the one-rank results (read only) */
    double rel[2][TP_WORLD];  /* per degree, per rank: largest relative difference */
    double abs_[2][TP_WORLD]; /* largest absolute difference */
    int fwd_ar[2][TP_WORLD], bwd_ar[2][TP_WORLD];
    long weights[2][TP_WORLD]; /* elements of A and B this rank holds */
    uint64_t act_sent[2][TP_WORLD];
} tp_mlp_run;

static int tp_mlp_rank(dl_ctx *x, void *arg)
{
    tp_mlp_run *r = arg;
    const mlp_set *ref = r->ref;
    int wr = dl_ctx_rank(x);
    for (int d = 0; d < 2; d++) {
        int t = TP_DEGREES[d];
        dl_comm *tp = NULL;
        int rc = tp_split(x, t, &tp);
        if (rc)
            return rc;
        int tr = dl_comm_rank(tp), nl = MN / t, j0 = tr * nl;
        dl_comm_set_algo(tp, DL_ALGO_RING);
        /* this rank's shard: A's columns j0 .. j0+nl-1 (and a's), B's rows j0 .. j0+nl-1 */
        double *A = xcalloc((size_t)MK * nl, sizeof(double)),
               *B = xcalloc((size_t)nl * MK, sizeof(double));
        double *H = xcalloc((size_t)MR * nl, sizeof(double)),
               *Y = xcalloc((size_t)MR * nl, sizeof(double));
        double *dA = xcalloc((size_t)MK * nl, sizeof(double)),
               *dB = xcalloc((size_t)nl * MK, sizeof(double));
        double a[MN], da[MN], Z[MR * MK], dX[MR * MK], db[MK];
        for (int p = 0; p < MK; p++)
            for (int j = 0; j < nl; j++) A[p * nl + j] = ref->A[p * MN + j0 + j];
        for (int j = 0; j < nl; j++) a[j] = ref->a[j0 + j];
        memcpy(B, ref->B + (size_t)j0 * MK, sizeof(double) * nl * MK);
        r->weights[d][wr] = 2L * MK * nl;

        dl_comm_stats s0, s1, s2;
        dl_comm_reset_stats(tp);
        dl_comm_get_stats(tp, &s0);
        /* forward: f is the identity (every rank has X); local H, Y and partial Z = Y_i B_i; then
         * g: all-reduce Z, and b once after it */
        mlp_fwd_hand(ref->X, A, a, B, NULL, H, Y, Z, MR, MK, nl);
        rc = dl_allreduce(tp, Z, Z, MR * MK, DL_F64, DL_SUM, DL_PURPOSE_ACTIVATIONS);
        for (int i = 0; rc == 0 && i < MR; i++)
            for (int q = 0; q < MK; q++) Z[i * MK + q] += ref->b[q];
        dl_comm_get_stats(tp, &s1);
        /* backward: g's backward is the identity (every rank has G); local dB_i, db, dY_i, dH_i,
         * dA_i, da_i and partial dX = dH_i A_iᵀ; then f's backward: all-reduce dX */
        if (rc == 0) {
            mlp_bwd_hand(ref->X, A, B, H, Y, ref->G, dX, dA, da, dB, db, MR, MK, nl);
            rc = dl_allreduce(tp, dX, dX, MR * MK, DL_F64, DL_SUM, DL_PURPOSE_ACTIVATIONS);
        }
        dl_comm_get_stats(tp, &s2);
        if (rc == 0) {
            r->fwd_ar[d][wr] = (int)(s1.ops - s0.ops);
            r->bwd_ar[d][wr] = (int)(s2.ops - s1.ops);
            r->act_sent[d][wr] = s2.bytes_sent[DL_PURPOSE_ACTIVATIONS];
            /* compare with the one-rank results: whole Z, dX, db; this rank's slices of the rest */
            double dAref[MK * MN], dBref[MN * MK];
            for (int p = 0; p < MK; p++)
                for (int j = 0; j < nl; j++) dAref[p * nl + j] = ref->dA[p * MN + j0 + j];
            memcpy(dBref, ref->dB + (size_t)j0 * MK, sizeof(double) * nl * MK);
            double rel = 0, ab = 0, e;
            e = maxdiff(Z, ref->Z, MR * MK);
            ab = dmax(ab, e);
            rel = dmax(rel, e / maxabs(ref->Z, MR * MK));
            e = maxdiff(dX, ref->dX, MR * MK);
            ab = dmax(ab, e);
            rel = dmax(rel, e / maxabs(ref->dX, MR * MK));
            e = maxdiff(db, ref->db, MK);
            ab = dmax(ab, e);
            rel = dmax(rel, e / maxabs(ref->db, MK));
            e = maxdiff(dA, dAref, (size_t)MK * nl);
            ab = dmax(ab, e);
            rel = dmax(rel, e / maxabs(ref->dA, MK * MN));
            e = maxdiff(da, ref->da + j0, nl);
            ab = dmax(ab, e);
            rel = dmax(rel, e / maxabs(ref->da, MN));
            e = maxdiff(dB, dBref, (size_t)nl * MK);
            ab = dmax(ab, e);
            rel = dmax(rel, e / maxabs(ref->dB, MN * MK));
            r->rel[d][wr] = rel;
            r->abs_[d][wr] = ab;
        }
        free(A);
        free(B);
        free(H);
        free(Y);
        free(dA);
        free(dB);
        int rc2 = dl_comm_free(tp);
        if (rc)
            return rc;
        if (rc2)
            return rc2;
    }
    return DL_OK;
}

static int section_mlp(void)
{
    lec_text("\n§3.3 The Megatron MLP Z = GeLU(X·A + a)·B + b, f64. Shapes chosen here (the "
             "lecture's did\n"
             "   not survive in the text): X %d x %d, A %d x %d, B %d x %d, so that A and B hold "
             "%d weights on one\n"
             "   rank and %d on each of 4 (the lecture's 2048 and 512; biases a (%d, split) and b "
             "(%d) not counted)\n",
             MR, MK, MK, MN, MN, MK, 2 * MK * MN, 2 * MK * MN / 4, MN, MK);
    mlp_set *s = xcalloc(1, sizeof *s), *lib = xcalloc(1, sizeof *lib);
    fill(s->X, MR * MK, 1.0, 101);
    fill(s->A, MK * MN, 0.5, 102);
    fill(s->a, MN, 0.1, 103);
    fill(s->B, MN * MK, 0.25, 104);
    fill(s->b, MK, 0.1, 105);
    fill(s->G, MR * MK, 1.0, 106);
    mlp_fwd_hand(s->X, s->A, s->a, s->B, s->b, s->H, s->Y, s->Z, MR, MK, MN);
    mlp_bwd_hand(s->X, s->A, s->B, s->H, s->Y, s->G, s->dX, s->dA, s->da, s->dB, s->db, MR, MK, MN);
    mlp_library(s, lib);
    double rel = mlp_rel(lib, s);
    char shown[128], label[160];
    snprintf(shown, sizeof shown, "%.1e", rel);
    lec_fig("§3.3", "mlp_hand_vs_library",
            "handwritten fwd/bwd vs the library's kernels, max rel diff (Z dX dA da dB db)", rel,
            shown, "1.4e-14 (vs autograd); bound 1e-13", lec_le(rel, 1e-13));

    tp_mlp_run *r = xcalloc(1, sizeof *r);
    r->ref = s;
    dl_world_opts o;
    world_opts(&o, TP_WORLD);
    int ret = 0;
    if (dl_world_run(&o, tp_mlp_rank, r) != DL_OK) {
        ret = lec_fail("tensor-parallel MLP run");
    } else {
        for (int d = 0; d < 2; d++) {
            int t = TP_DEGREES[d];
            double mr = 0, ma = 0;
            int fwd = r->fwd_ar[d][0], bwd = r->bwd_ar[d][0], same = 1;
            for (int k = 0; k < TP_WORLD; k++) {
                mr = dmax(mr, r->rel[d][k]);
                ma = dmax(ma, r->abs_[d][k]);
                same &= r->fwd_ar[d][k] == fwd && r->bwd_ar[d][k] == bwd;
            }
            snprintf(label, sizeof label, "TP %d vs one rank: Z, dX, dA, dB (and a, b) max diff",
                     t);
            snprintf(shown, sizeof shown, "%.1e (rel %.1e)", ma, mr);
            char id[48];
            snprintf(id, sizeof id, "mlp_tp%d_diff", t);
            lec_fig("§3.3", id, label, mr, shown, "2.8e-14 (float64); bound rel 1e-13",
                    lec_le(mr, 1e-13));
            snprintf(label, sizeof label, "TP %d: all-reduces per MLP, forward + backward", t);
            snprintf(shown, sizeof shown, "%d + %d%s", fwd, bwd, same ? "" : " (ranks disagree)");
            snprintf(id, sizeof id, "mlp_tp%d_allreduces", t);
            lec_fig("§3.3", id, label, fwd + bwd, shown, "1 + 1 (g forward, f backward)",
                    same && fwd == 1 && bwd == 1 ? LEC_MATCH : LEC_DIFF);
            double want = 2 * dl_plan_allreduce_sent(t, MR * MK * 8.0);
            snprintf(label, sizeof label, "TP %d: activation bytes each rank sent per MLP", t);
            snprintf(shown, sizeof shown, "%llu B %s 2 x 2(t-1)/t x %d B",
                     (unsigned long long)r->act_sent[d][0],
                     (double)r->act_sent[d][0] == want ? "=" : "!=", MR * MK * 8);
            snprintf(id, sizeof id, "mlp_tp%d_bytes", t);
            lec_fig("§3.3", id, label, (double)r->act_sent[d][0], shown, "", LEC_INFO);
        }
        snprintf(shown, sizeof shown, "%ld vs %d", r->weights[1][0], 2 * MK * MN);
        lec_fig("§3.3", "mlp_weights_per_rank", "weights (A, B) per rank, TP 4 vs one rank",
                (double)r->weights[1][0], shown, "512 vs 2048",
                r->weights[1][0] == 512 && 2 * MK * MN == 2048 ? LEC_MATCH : LEC_DIFF);
    }
    free(r);
    free(s);
    free(lib);
    return ret;
}

/* ---------------------------------------------------------------------------------------- */
/* §3.4 attention by heads                                                                   */

#define AB 2  /* sequences */
#define AT 16 /* positions */
#define AC 32 /* channels */
#define ANH 8 /* heads (the lecture's 8) */
#define AHS (AC / ANH)
#define AN (AB * AT)
#define ATT_WORLD 8
static const int ATT_DEGREES[3] = {2, 4, 8};

typedef struct att_set {
    double X[AN * AC], Wqkv[3 * AC * AC], bqkv[3 * AC], Wo[AC * AC], bo[AC], G[AN * AC];
    /* one-rank results */
    double Yo[AN * AC], dX[AN * AC], dWqkv[3 * AC * AC], dbqkv[3 * AC], dWo[AC * AC], dbo[AC];
} att_set;

/* One rank's attention block over heads [h0, h0 + nh): QKV column-parallel (rows of each third),
 * attention on its heads, output projection row-parallel; f and g are the all-reduces on `tp`
 * (NULL: one rank, all heads). Results: Y, dX (full), dWqkv (3 nh HS x C rows), dbqkv, dWo
 * (C x nh HS columns), dbo. */
static int att_block(dl_comm *tp, const att_set *s, int h0, int nh, double *Y, double *dX,
                     double *dWqkv, double *dbqkv, double *dWo, double *dbo, int *fwd_ar,
                     int *bwd_ar)
{
    int cl = nh * AHS, c0 = h0 * AHS;
    double *W = xcalloc((size_t)3 * cl * AC, sizeof(double)),
           *bq = xcalloc(3 * (size_t)cl, sizeof(double));
    double *Wo = xcalloc((size_t)AC * cl, sizeof(double));
    double *qkv = xcalloc((size_t)AN * 3 * cl, sizeof(double)),
           *att = xcalloc((size_t)AB * nh * AT * AT, sizeof(double));
    double *o = xcalloc((size_t)AN * cl, sizeof(double)),
           *dout = xcalloc((size_t)AN * cl, sizeof(double));
    double *dqkv = xcalloc((size_t)AN * 3 * cl, sizeof(double)),
           *scratch = xcalloc((size_t)AT * AT, sizeof(double));
    for (int third = 0; third < 3; third++) {
        memcpy(W + (size_t)third * cl * AC, s->Wqkv + ((size_t)third * AC + c0) * AC,
               sizeof(double) * cl * AC);
        memcpy(bq + (size_t)third * cl, s->bqkv + (size_t)third * AC + c0, sizeof(double) * cl);
    }
    for (int r = 0; r < AC; r++)
        memcpy(Wo + (size_t)r * cl, s->Wo + (size_t)r * AC + c0, sizeof(double) * cl);
    int rc = 0;
    dl_comm_stats s0, s1, s2;
    if (tp)
        dl_comm_get_stats(tp, &s0);
    /* forward (f: identity) */
    dl_linear_fwd_f64(qkv, s->X, W, bq, AN, AC, 3 * cl);
    dl_attention_fwd_f64(o, cl, att, qkv, qkv + cl, qkv + 2 * cl, 3 * cl, AB, AT, nh, AHS);
    dl_linear_fwd_f64(Y, o, Wo, NULL, AN, cl, AC);
    if (tp)
        rc = dl_allreduce(tp, Y, Y, AN * AC, DL_F64, DL_SUM, DL_PURPOSE_ACTIVATIONS); /* g */
    for (int i = 0; rc == 0 && i < AN; i++)
        for (int c = 0; c < AC; c++) Y[i * AC + c] += s->bo[c];
    if (tp)
        dl_comm_get_stats(tp, &s1);
    /* backward (g: identity) */
    if (rc == 0) {
        memset(dX, 0, sizeof(double) * AN * AC);
        memset(dbo, 0, sizeof(double) * AC);
        dl_linear_bwd_f64(dout, dWo, dbo, s->G, o, Wo, AN, cl, AC);
        dl_attention_bwd_f64(dqkv, dqkv + cl, dqkv + 2 * cl, scratch, dout, cl, qkv, qkv + cl,
                             qkv + 2 * cl, 3 * cl, att, AB, AT, nh, AHS);
        dl_linear_bwd_f64(dX, dWqkv, dbqkv, dqkv, s->X, W, AN, AC, 3 * cl);
        if (tp)
            rc = dl_allreduce(tp, dX, dX, AN * AC, DL_F64, DL_SUM, DL_PURPOSE_ACTIVATIONS); /* f */
    }
    if (tp) {
        dl_comm_get_stats(tp, &s2);
        *fwd_ar = (int)(s1.ops - s0.ops);
        *bwd_ar = (int)(s2.ops - s1.ops);
    }
    free(W);
    free(bq);
    free(Wo);
    free(qkv);
    free(att);
    free(o);
    free(dout);
    free(dqkv);
    free(scratch);
    return rc;
}

typedef struct att_run {
    const att_set *s;
    double rel[3][ATT_WORLD];
    int fwd_ar[3][ATT_WORLD], bwd_ar[3][ATT_WORLD];
} att_run;

static int att_rank(dl_ctx *x, void *arg)
{
    att_run *r = arg;
    const att_set *s = r->s;
    int wr = dl_ctx_rank(x);
    for (int d = 0; d < 3; d++) {
        int t = ATT_DEGREES[d];
        dl_comm *tp = NULL;
        int rc = tp_split(x, t, &tp);
        if (rc)
            return rc;
        int tr = dl_comm_rank(tp), nh = ANH / t, cl = nh * AHS, c0 = tr * cl;
        double *Y = xcalloc(AN * AC, sizeof(double)), *dX = xcalloc(AN * AC, sizeof(double));
        double *dW = xcalloc((size_t)3 * cl * AC, sizeof(double)),
               *db = xcalloc(3 * (size_t)cl, sizeof(double));
        double *dWo = xcalloc((size_t)AC * cl, sizeof(double)), dbo[AC];
        rc = att_block(tp, s, tr * nh, nh, Y, dX, dW, db, dWo, dbo, &r->fwd_ar[d][wr],
                       &r->bwd_ar[d][wr]);
        if (rc == 0) {
            double rel = 0;
            rel = dmax(rel, maxdiff(Y, s->Yo, AN * AC) / maxabs(s->Yo, AN * AC));
            rel = dmax(rel, maxdiff(dX, s->dX, AN * AC) / maxabs(s->dX, AN * AC));
            rel = dmax(rel, maxdiff(dbo, s->dbo, AC) / maxabs(s->dbo, AC));
            for (int third = 0; third < 3; third++) {
                rel =
                    dmax(rel, maxdiff(dW + (size_t)third * cl * AC,
                                      s->dWqkv + ((size_t)third * AC + c0) * AC, (size_t)cl * AC) /
                                  maxabs(s->dWqkv, 3 * AC * AC));
                rel = dmax(rel, maxdiff(db + (size_t)third * cl, s->dbqkv + (size_t)third * AC + c0,
                                        cl) /
                                    maxabs(s->dbqkv, 3 * AC));
            }
            for (int row = 0; row < AC; row++)
                rel =
                    dmax(rel, maxdiff(dWo + (size_t)row * cl, s->dWo + (size_t)row * AC + c0, cl) /
                                  maxabs(s->dWo, AC * AC));
            r->rel[d][wr] = rel;
        }
        free(Y);
        free(dX);
        free(dW);
        free(db);
        free(dWo);
        int rc2 = dl_comm_free(tp);
        if (rc)
            return rc;
        if (rc2)
            return rc2;
    }
    return DL_OK;
}

/* The library's GPT with tp = 2: all-reduces per layer on the tp communicator. */
typedef struct gpt_tp_run {
    int layers;
    uint64_t fwd, bwd;
} gpt_tp_run;

static int gpt_tp_rank(dl_ctx *x, void *arg)
{
    gpt_tp_run *r = arg;
    dl_gpt_config cfg =
        {.vocab = 256, .seq = 8, .layers = r->layers, .d_model = 16, .heads = 2, .tie = 0};
    dl_gpt_opts o = {.cfg = cfg,
                     .dtype = DL_F64,
                     .micro_batch = 1,
                     .tp = dl_ctx_size(x),
                     .tp_comm = dl_ctx_comm(x),
                     .seed = 3,
                     .arena = dl_ctx_arena(x)};
    dl_gpt *g;
    int rc = dl_gpt_create(&o, &g);
    if (rc)
        return rc;
    int in[8], tg[8];
    for (int i = 0; i < 8; i++) in[i] = 10 * i, tg[i] = 10 * i + 1;
    dl_comm_stats s0, s1, s2;
    double loss;
    dl_gpt_zero_grads(g);
    dl_comm_get_stats(dl_ctx_comm(x), &s0);
    rc = dl_gpt_forward(g, in, tg, 1, &loss);
    dl_comm_get_stats(dl_ctx_comm(x), &s1);
    if (rc == 0)
        rc = dl_gpt_backward(g, 1.0 / 8, NULL, NULL);
    dl_comm_get_stats(dl_ctx_comm(x), &s2);
    if (rc == 0 && dl_ctx_rank(x) == 0) {
        r->fwd = s1.ops - s0.ops;
        r->bwd = s2.ops - s1.ops;
    }
    dl_gpt_destroy(g);
    return rc;
}

static int section_attention(void)
{
    lec_text("\n§3.4 Attention split by heads: %d heads of %d channels, %d sequences x %d "
             "positions, f64;\n"
             "   Q/K/V column-parallel by heads, output projection row-parallel, library kernels "
             "on each rank\n",
             ANH, AHS, AB, AT);
    att_set *s = xcalloc(1, sizeof *s);
    fill(s->X, AN * AC, 1.0, 201);
    fill(s->Wqkv, 3 * AC * AC, 0.3, 202);
    fill(s->bqkv, 3 * AC, 0.1, 203);
    fill(s->Wo, AC * AC, 0.2, 204);
    fill(s->bo, AC, 0.1, 205);
    fill(s->G, AN * AC, 1.0, 206);
    int f0, b0;
    if (att_block(NULL, s, 0, ANH, s->Yo, s->dX, s->dWqkv, s->dbqkv, s->dWo, s->dbo, &f0, &b0) !=
        0) {
        free(s);
        return lec_fail("attention on one rank");
    }
    att_run *r = xcalloc(1, sizeof *r);
    r->s = s;
    dl_world_opts o;
    world_opts(&o, ATT_WORLD);
    int ret = 0;
    char shown[128], label[160], id[48];
    if (dl_world_run(&o, att_rank, r) != DL_OK) {
        ret = lec_fail("attention by heads run");
    } else {
        for (int d = 0; d < 3; d++) {
            int t = ATT_DEGREES[d], same = 1;
            double mr = 0;
            for (int k = 0; k < ATT_WORLD; k++) {
                mr = dmax(mr, r->rel[d][k]);
                same &= r->fwd_ar[d][k] == r->fwd_ar[d][0] && r->bwd_ar[d][k] == r->bwd_ar[d][0];
            }
            snprintf(label, sizeof label,
                     "heads split %d ways (%d per rank) vs one rank: output and grads", t, ANH / t);
            snprintf(shown, sizeof shown, "rel %.1e", mr);
            snprintf(id, sizeof id, "attn_tp%d_diff", t);
            lec_fig("§3.4", id, label, mr, shown, "<= 6.7e-16; bound rel 1e-13", lec_le(mr, 1e-13));
            snprintf(label, sizeof label, "heads split %d ways: all-reduces forward (backward)", t);
            snprintf(shown, sizeof shown, "%d (%d)%s", r->fwd_ar[d][0], r->bwd_ar[d][0],
                     same ? "" : " ranks disagree");
            snprintf(id, sizeof id, "attn_tp%d_fwd_allreduces", t);
            lec_fig("§3.4", id, label, r->fwd_ar[d][0], shown, "1 forward",
                    same && r->fwd_ar[d][0] == 1 ? LEC_MATCH : LEC_DIFF);
        }
    }
    free(r);
    free(s);
    if (ret)
        return ret;

    gpt_tp_run g = {.layers = 2};
    world_opts(&o, 2);
    if (dl_world_run(&o, gpt_tp_rank, &g) != DL_OK)
        return lec_fail("GPT with tp = 2");
    snprintf(shown, sizeof shown, "%.0f + %.0f", (double)g.fwd / g.layers,
             (double)g.bwd / g.layers);
    lec_fig("§3.4", "layer_allreduces", "the library's GPT, tp 2: all-reduces per layer, fwd + bwd",
            (double)(g.fwd + g.bwd) / g.layers, shown, "2 + 2",
            g.fwd == 2u * g.layers && g.bwd == 2u * g.layers ? LEC_MATCH : LEC_DIFF);
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* §3.5 the cost of tensor parallelism at GPT-3 scale (planner)                              */

static int section_tp_cost(void)
{
    dl_plan_model m;
    dl_plan_hw hw;
    dl_plan_opts o;
    if (dl_plan_model_preset("gpt3-175b", &m) || dl_plan_hw_preset("h100", &hw))
        return lec_fail("planner presets");
    dl_plan_opts_init(&o);
    dl_plan_layout l =
        {.t = 8, .p = 1, .d = 1, .v = 1, .micro_batch = 1, .global_batch = 1, .seq = 2048};
    dl_plan_comm_report nv, ib;
    o.tp_link = DL_PLAN_LINK_INTRA;
    if (dl_plan_comm(&m, &hw, &o, &l, &nv))
        return lec_fail("planner (TP on NVLink)");
    o.tp_link = DL_PLAN_LINK_INTER;
    if (dl_plan_comm(&m, &hw, &o, &l, &ib))
        return lec_fail("planner (TP across nodes)");
    lec_text("\n§3.5 A GPT-3 layer (h = %d, s = %d, b = 1, BF16) split 8 ways; H100 %.0f TFLOP/s "
             "dense BF16 at %.0f%% "
             "MFU,\n   NVLink %.0f GB/s, InfiniBand %.0f GB/s per direction (the planner, "
             "dl_plan_comm; the lecture's "
             "table\n   did not survive in the text, only its 352 MB and the cross-node ratio in "
             "§8):\n",
             m.hidden, l.seq, hw.flops / 1e12, 100 * hw.mfu, hw.intra_bw / 1e9, hw.inter_bw / 1e9);
    lec_text("     one all-reduce: s*b*h = %.0f values, %.1f MB; %d per layer (2 forward, 2 "
             "backward)\n",
             nv.tp_msg_bytes / 2, nv.tp_msg_bytes / 1e6, o.tp_allreduces);
    lec_text("     %-22s %14s %16s %18s %14s\n", "link", "sent/GPU/layer", "comm per layer",
             "compute per layer", "comm/compute");
    lec_text("     %-22s %11.1f MB %13.3f ms %15.3f ms %14.3f\n", "NVLink (in a node)",
             nv.tp_layer_sent / 1e6, nv.tp_layer_time * 1e3, nv.tp_layer_compute * 1e3,
             nv.tp_layer_time / nv.tp_layer_compute);
    lec_text("     %-22s %11.1f MB %13.3f ms %15.3f ms %14.3f\n", "InfiniBand (across)",
             ib.tp_layer_sent / 1e6, ib.tp_layer_time * 1e3, ib.tp_layer_compute * 1e3,
             ib.tp_layer_time / ib.tp_layer_compute);
    char shown[64];
    snprintf(shown, sizeof shown, "%.1f MB", nv.tp_layer_sent / 1e6);
    lec_fig("§3.5", "tp_layer_sent", "bytes each GPU sends per layer (t = 8)", nv.tp_layer_sent,
            shown, "352 MB", lec_near(nv.tp_layer_sent / 1e6, 352, 0.5));
    double rn = nv.tp_layer_time / nv.tp_layer_compute, ri = ib.tp_layer_time / ib.tp_layer_compute;
    snprintf(shown, sizeof shown, "%.3f", rn);
    lec_fig("§3.5", "tp_ratio_nvlink", "TP comm / compute per layer on NVLink", rn, shown, "",
            LEC_INFO);
    snprintf(shown, sizeof shown, "%.2f", ri);
    lec_fig("§8", "tp_ratio_ib", "TP comm / compute per layer across nodes (InfiniBand)", ri, shown,
            "1.00", lec_near(ri, 1.00, 0.005));
    return 0;
}

int lecture_02(void)
{
    if (section_dp())
        return -1;
    if (section_mlp())
        return -1;
    if (section_attention())
        return -1;
    return section_tp_cost();
}
