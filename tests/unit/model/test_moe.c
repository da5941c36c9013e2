/* The mixture-of-experts MLP (model/sublayer_moe.c) on one rank, f64 and f32:
 * - the forward against an independent serial reference written here in straight loops (layer
 *   norm, router, softmax, top-k with ties to the lower index, gates, per-sequence capacity in
 *   position order then choice rank, experts, the auxiliary and z losses), for k = 1, 2, 3 and
 *   capacities with and without drops; negative control: the reference without the capacity
 *   differs where choices were dropped;
 * - finite differences of the objective sum(y r) + the weighted auxiliary and z losses in the
 *   input and every parameter (router, gates at k = 1 and 2, experts, ln_2) with capacity drops
 *   active, the routing unchanged by every perturbation (its hash asserted) and the top-k margin
 *   asserted far above the step's effect;
 * - the smallest capacity (1 per expert and sequence) drops every other choice, and a token whose
 *   choices are all dropped keeps its residual exactly (output = input, input gradient = output
 *   gradient, with no auxiliary loss); capacity 0 drops nothing;
 * - f32 routes as f64 and agrees within its rounding;
 * - in the model: the gradient of cross-entropy + the auxiliary losses (through the backward's
 *   dloss) against finite differences; causality (changing a later token never changes an
 *   earlier position's output, with drops active; the changed position's output does change);
 *   the split backward (input then weight part) equals the whole one bitwise; expert tensors
 *   keep their counter-based initial values on any ep rank's layout. */
#include "../testutil.h"
#include <check.h>
#include <math.h>
#include "core/arena.h"
#include "model/gpt_priv.h"
#include "model/sublayer.h"

enum { MB = 2, T = 8, C = 8, E = 4, FE = 12, MAXP = 3 + 4 * E };
#define LN_EPS 1e-5

/* ---- the sublayer on its own: a harness ---------------------------------------------------- */

typedef struct {
    dl_gpt_config cfg;
    dl_sub_ctx c;
    dl_moe_stats st;
    int64_t routed[E], dropped[E];
    double *p[MAXP], *g[MAXP], *x, *r, *y, *dx;
    size_t np[MAXP];
    int n;
    void *w[MAXP], *dw[MAXP];
} mh;

static double val(uint64_t key, size_t i, double scale, double base)
{
    return base + scale * (tu_bits_to_unit(tu_rand_keyed(key, i)) - 0.5);
}

static void mh_init(mh *h, int K, double cap, double aux, double z, uint64_t seed)
{
    memset(h, 0, sizeof *h);
    h->cfg = (dl_gpt_config){.vocab = 256,
                             .seq = T,
                             .layers = 1,
                             .d_model = C,
                             .heads = 2,
                             .experts = E,
                             .top_k = K,
                             .moe_every = 1,
                             .expert_ffn = FE,
                             .capacity = cap,
                             .aux_loss = aux,
                             .z_loss = z};
    dl_sub_ctx *c = &h->c;
    c->d = (dl_sub_dims){MB, MB, T, C, C, 4 * C, 2, C / 2, 1, E, K, FE, E, 1, 0};
    c->cfg = &h->cfg;
    h->st = (dl_moe_stats){.layer = 0, .E = E, .routed = h->routed, .dropped = h->dropped};
    c->moe = &h->st;
    h->n = dl__moe_kind.nparams(&h->cfg, 0);
    for (int q = 0; q < h->n; q++) {
        dl_sub_param pr;
        dl__moe_kind.param(&h->cfg, 0, q, &pr);
        int ln = strstr(pr.name, "ln_") != NULL, bias = strstr(pr.name, ".bias") != NULL;
        int router = strstr(pr.name, "router") != NULL;
        h->np[q] = (size_t)(pr.rows * pr.cols);
        h->p[q] = malloc(sizeof(double) * h->np[q]);
        h->g[q] = calloc(h->np[q], sizeof(double));
        /* a strong router spreads the probabilities (routing margins) */
        double scale = router ? 3.0 : ln || bias ? 0.2 : 0.8, base = ln && !bias ? 1.0 : 0.0;
        for (size_t i = 0; i < h->np[q]; i++)
            h->p[q][i] = val(seed * 131 + (uint64_t)q, i, scale, base);
        h->w[q] = h->p[q], h->dw[q] = h->g[q];
    }
    c->w = h->w, c->dw = h->dw;
    size_t N = (size_t)MB * T;
    h->x = malloc(sizeof(double) * N * C), h->r = malloc(sizeof(double) * N * C);
    for (size_t i = 0; i < N * C; i++) h->x[i] = val(seed * 7 + 1000, i, 2.0, 0.0);
    for (size_t i = 0; i < N * C; i++) h->r[i] = val(seed * 7 + 1001, i, 1.0, 0.0);
    h->y = calloc(N * C, sizeof(double)), h->dx = calloc(N * C, sizeof(double));
    c->x = h->x, c->y = h->y, c->dx = h->dx;
    c->act = calloc(dl__moe_kind.act_elems(&c->d), sizeof(double));
    c->dloss = 1.0 / (MB * T); /* the auxiliary losses' weight: 1 / B sequences */
}

static void mh_free(mh *h)
{
    for (int q = 0; q < h->n; q++) free(h->p[q]), free(h->g[q]);
    free(h->x), free(h->r), free(h->y), free(h->dx), free(h->c.act);
}

static void mh_reset_stats(mh *h)
{
    memset(h->routed, 0, sizeof h->routed), memset(h->dropped, 0, sizeof h->dropped);
    h->st.seqs = 0, h->st.aux = h->st.z = 0, h->st.hash = 0;
}

/* the objective: sum(y r) + (1 / B) x the sequences' auxiliary and z losses */
static double mh_loss(mh *h)
{
    mh_reset_stats(h);
    ck_assert_int_eq(dl__moe_kind.fwd[1](&h->c), DL_OK);
    double L = 0;
    for (size_t i = 0; i < (size_t)MB * T * C; i++) L += h->y[i] * h->r[i];
    return L + (h->st.aux + h->st.z) / MB;
}

static void mh_grads(mh *h)
{
    mh_loss(h);
    memcpy(h->dx, h->r, sizeof(double) * MB * T * C);
    ck_assert_int_eq(dl__moe_kind.bwd[1](&h->c, DL_BWD_WHOLE), DL_OK);
}

/* ---- the independent reference ------------------------------------------------------------- */

typedef struct {
    double aux, z;     /* sums over the sequences, weighted by α and β */
    double margin;     /* smallest gap between the k-th and the (k+1)-th probability */
    int dropped, kept; /* choices */
} ref_out;

static double gelu(double v) { return 0.5 * v * (1.0 + erf(v / sqrt(2.0))); }

/* y of the MoE layer by the spec, straight loops; nocap: ignore the capacity (negative
 * control) */
static void reference(const mh *h, double *y, ref_out *o, int nocap)
{
    const dl_gpt_config *cf = &h->cfg;
    int K = cf->top_k;
    double *const *P = h->p;
    long cap = cf->capacity > 0 ? (long)ceil(cf->capacity * T * K / E) : -1;
    memset(o, 0, sizeof *o);
    o->margin = INFINITY;
    for (int b = 0; b < MB; b++) {
        long load[E] = {0};
        double f[E] = {0}, Pm[E] = {0}, z = 0;
        for (int t = 0; t < T; t++) {
            const double *x = h->x + ((size_t)b * T + t) * C;
            double mean = 0, var = 0, ln[C], lg[E], p[E], mx = -INFINITY, s = 0;
            for (int j = 0; j < C; j++) mean += x[j] / C;
            for (int j = 0; j < C; j++) var += (x[j] - mean) * (x[j] - mean) / C;
            for (int j = 0; j < C; j++)
                ln[j] = (x[j] - mean) / sqrt(var + LN_EPS) * P[0][j] + P[1][j];
            for (int e = 0; e < E; e++) {
                lg[e] = 0;
                for (int j = 0; j < C; j++) lg[e] += P[2][e * C + j] * ln[j];
                mx = fmax(mx, lg[e]);
            }
            for (int e = 0; e < E; e++) s += exp(lg[e] - mx);
            for (int e = 0; e < E; e++) p[e] = exp(lg[e] - mx) / s, Pm[e] += p[e] / T;
            z += pow(mx + log(s), 2) / T;
            int ch[E], used[E] = {0};
            double gsum = 0;
            for (int q = 0; q < K; q++) {
                int best = -1;
                for (int e = 0; e < E; e++)
                    if (!used[e] && (best < 0 || p[e] > p[best]))
                        best = e;
                ch[q] = best, used[best] = 1, gsum += p[best];
                f[best] += 1.0 / (K * T);
            }
            for (int e = 0; e < E && K < E; e++) /* the (k+1)-th's gap to the k-th */
                if (!used[e])
                    o->margin = fmin(o->margin, p[ch[K - 1]] - p[e]);
            double *yo = y + ((size_t)b * T + t) * C;
            for (int j = 0; j < C; j++) yo[j] = x[j];
            for (int q = 0; q < K; q++) {
                int e = ch[q];
                if (!nocap && cap >= 0 && load[e] >= cap) {
                    o->dropped++;
                    continue;
                }
                load[e]++, o->kept++;
                double g = K == 1 ? p[e] : p[e] / gsum, a[FE];
                const double *W1 = P[3 + 4 * e], *b1 = P[4 + 4 * e], *W2 = P[5 + 4 * e],
                             *b2 = P[6 + 4 * e];
                for (int i = 0; i < FE; i++) {
                    a[i] = b1[i];
                    for (int j = 0; j < C; j++) a[i] += W1[i * C + j] * ln[j];
                    a[i] = gelu(a[i]);
                }
                for (int j = 0; j < C; j++) {
                    double v = b2[j];
                    for (int i = 0; i < FE; i++) v += W2[j * FE + i] * a[i];
                    yo[j] += g * v;
                }
            }
        }
        double aux = 0;
        for (int e = 0; e < E; e++) aux += f[e] * Pm[e];
        o->aux += cf->aux_loss * E * aux;
        o->z += cf->z_loss * z;
    }
}

/* Both f64 and of O(1) size: the layer's and the reference's sums differ in order only, each
 * value a sum of at most FE + C products of O(1) terms: |error| <= (FE + C) 2^-52 x O(10) =
 * 5e-14; 1e-11 leaves a wide margin while a wrong gate, choice or drop is off by O(0.1). */
static double max_diff(const double *a, const double *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(a[i] - b[i]));
    return m;
}

START_TEST(forward_matches_reference)
{
    struct {
        int K;
        double cap;
        int drops; /* expect drops */
    } cases[] = {{1, 1.0, 1}, {2, 0.5, 1}, {2, 0.0, 0}, {3, 0.5, 1}, {2, 2.0, -1}};
    size_t n = (size_t)MB * T * C;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        mh h;
        mh_init(&h, cases[k].K, cases[k].cap, 0.05, 0.01, 3 + k);
        mh_loss(&h);
        double *y = malloc(sizeof(double) * n), *y2 = malloc(sizeof(double) * n);
        ref_out o, o2;
        reference(&h, y, &o, 0);
        double d = max_diff(y, h.y, n);
        ck_assert_msg(d < 1e-11, "k %d capacity %g: |y - reference| = %g", cases[k].K, cases[k].cap,
                      d);
        ck_assert_msg(fabs(o.aux - h.st.aux) < 1e-12 && fabs(o.z - h.st.z) < 1e-12,
                      "aux %.15g vs %.15g, z %.15g vs %.15g", h.st.aux, o.aux, h.st.z, o.z);
        int64_t dropped = 0, routed = 0;
        for (int e = 0; e < E; e++) dropped += h.dropped[e], routed += h.routed[e];
        ck_assert_int_eq(routed, (int64_t)MB * T * cases[k].K);
        ck_assert_int_eq(dropped, o.dropped);
        if (cases[k].drops >= 0)
            ck_assert_msg((o.dropped > 0) == cases[k].drops, "k %d capacity %g: %d dropped",
                          cases[k].K, cases[k].cap, o.dropped);
        if (o.dropped) { /* negative control: the drops matter, and the comparison sees it */
            reference(&h, y2, &o2, 1);
            ck_assert(max_diff(y2, h.y, n) > 1e-3);
        }
        free(y), free(y2);
        mh_free(&h);
    }
}
END_TEST

/* Central difference of the objective in *v, as a fraction of the tolerance; the routing (its
 * hash over choices and admissions) must not change. Truncation h^2/6 |L'''| < 1e-9 (h = 1e-5,
 * third derivatives O(10)), rounding eps sum|y r| / h = 2.2e-16 x 1e2 / 1e-5 = 2e-9: |fd - g| <=
 * 1e-7 + 1e-6 (|fd| + |g|) holds with margin; a missing term is off by O(|g|). */
static double fd_err(mh *h, double *v, double g, uint64_t hash)
{
    double step = 1e-5, save = *v, lp, lm;
    *v = save + step;
    lp = mh_loss(h);
    ck_assert_msg(h->st.hash == hash, "a perturbation changed the routing");
    *v = save - step;
    lm = mh_loss(h);
    ck_assert_msg(h->st.hash == hash, "a perturbation changed the routing");
    *v = save;
    double fd = (lp - lm) / (2 * step);
    return fabs(fd - g) / (1e-7 + 1e-6 * (fabs(fd) + fabs(g)));
}

static void fd_check(int K, double cap)
{
    mh h;
    mh_init(&h, K, cap, 0.3, 0.2, 11 + (uint64_t)K);
    size_t n = (size_t)MB * T * C;
    double *y = malloc(sizeof(double) * n);
    ref_out o;
    reference(&h, y, &o, 0);
    free(y);
    /* a perturbation of 1e-5 moves a probability by well under 1e-4 here */
    ck_assert_msg(o.margin > 1e-3, "k %d: routing margin %g too small for the step", K, o.margin);
    ck_assert_msg(o.dropped > 0 && o.kept > 0, "k %d capacity %g: %d dropped, %d kept", K, cap,
                  o.dropped, o.kept);
    mh_grads(&h);
    uint64_t hash = h.st.hash;
    double worst = 0, *gx = malloc(sizeof(double) * n);
    memcpy(gx, h.dx, sizeof(double) * n);
    for (int t = 0; t < 12; t++) {
        size_t i = (size_t)(tu_splitmix64((uint64_t)t + 7) % n);
        worst = fmax(worst, fd_err(&h, &h.x[i], gx[i], hash));
    }
    for (int q = 0; q < h.n; q++)
        for (int t = 0; t < 4; t++) {
            size_t i = (size_t)(tu_splitmix64((uint64_t)(q * 16 + t)) % h.np[q]);
            worst = fmax(worst, fd_err(&h, &h.p[q][i], h.g[q][i], hash));
        }
    ck_assert_msg(worst <= 1, "k %d capacity %g: worst gradient error %.3g of the tolerance", K,
                  cap, worst);
    free(gx);
    mh_free(&h);
}

START_TEST(finite_differences_k1) { fd_check(1, 1.0); }
END_TEST
START_TEST(finite_differences_k2) { fd_check(2, 0.75); }
END_TEST

/* Capacity 1 per expert and sequence (the smallest a positive factor gives): every choice after
 * an expert's first of the sequence is dropped; a token with every choice dropped passes its
 * input through exactly, forward and backward (no auxiliary losses here). Capacity 0: no drop. */
START_TEST(capacity_extremes)
{
    mh h;
    mh_init(&h, 2, 1e-9, 0.0, 0.0, 5);
    ck_assert_int_eq(dl__moe_capacity(&h.cfg, T), 1);
    mh_grads(&h);
    int64_t dropped = 0, whole = 0;
    for (int e = 0; e < E; e++) dropped += h.dropped[e];
    int distinct = 0; /* experts chosen by each sequence: the admitted choices */
    for (int b = 0; b < MB; b++)
        for (int e = 0; e < E; e++) distinct += h.routed[e] > 0; /* upper bound below */
    ck_assert(dropped >= (int64_t)MB * T * 2 - (int64_t)MB * E);
    ck_assert(distinct > 0);
    for (int t = 0; t < MB * T; t++) {
        const double *x = h.x + (size_t)t * C, *y = h.y + (size_t)t * C;
        if (!memcmp(x, y, sizeof(double) * C)) {
            whole++;
            ck_assert(!memcmp(h.dx + (size_t)t * C, h.r + (size_t)t * C, sizeof(double) * C));
        }
    }
    /* at most E tokens of a sequence keep a choice: the others pass through */
    ck_assert_int_ge(whole, (int64_t)MB * (T - E));
    mh_free(&h);
    mh_init(&h, 2, 0.0, 0.01, 0.0, 5);
    mh_loss(&h);
    for (int e = 0; e < E; e++) ck_assert_int_eq(h.dropped[e], 0);
    mh_free(&h);
}
END_TEST

/* f32 routes exactly as f64 (margins > 1e-3 against f32's 1e-6 relative rounding) and its
 * output agrees within 1e-4 (sums of ~20 products of O(1) terms: 20 x 6e-8 x O(10)). */
START_TEST(f32_agrees)
{
    mh h;
    mh_init(&h, 2, 0.75, 0.1, 0.1, 13);
    mh_loss(&h);
    uint64_t hash = h.st.hash;
    size_t n = (size_t)MB * T * C;
    dl_sub_ctx c = h.c;
    float *pf[MAXP], *x = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n);
    void *w[MAXP];
    for (int q = 0; q < h.n; q++) {
        pf[q] = malloc(sizeof(float) * h.np[q]);
        for (size_t i = 0; i < h.np[q]; i++) pf[q][i] = (float)h.p[q][i];
        w[q] = pf[q];
    }
    for (size_t i = 0; i < n; i++) x[i] = (float)h.x[i];
    c.w = w, c.x = x, c.y = y;
    c.act = calloc(dl__moe_kind.act_elems(&c.d), sizeof(float));
    mh_reset_stats(&h);
    ck_assert_int_eq(dl__moe_kind.fwd[0](&c), DL_OK);
    ck_assert_msg(h.st.hash == hash, "f32 routed differently from f64");
    double d = 0;
    for (size_t i = 0; i < n; i++) d = fmax(d, fabs((double)y[i] - h.y[i]));
    ck_assert_msg(d < 1e-4, "f32 vs f64: %g", d);
    for (int q = 0; q < h.n; q++) free(pf[q]);
    free(x), free(y), free(c.act);
    mh_free(&h);
}
END_TEST

/* ---- in the model -------------------------------------------------------------------------- */

enum { GT = 16, GB = 2 };

static dl_gpt_config moe_cfg(double cap)
{
    return (dl_gpt_config){.vocab = 256,
                           .seq = GT,
                           .layers = 2,
                           .d_model = 16,
                           .heads = 4,
                           .experts = E,
                           .top_k = 2,
                           .moe_every = 1,
                           .expert_ffn = 24,
                           .capacity = cap,
                           .aux_loss = 0.2,
                           .z_loss = 0.1};
}

static dl_gpt *make(dl_gpt_config c, dl_arena **a, int defer_w)
{
    ck_assert_int_eq(dl_arena_create(a, 0, 0), DL_OK);
    dl_gpt_opts o = {.cfg = c,
                     .dtype = DL_F64,
                     .micro_batch = GB,
                     .tp = 1,
                     .seed = 9,
                     .arena = *a,
                     .defer_w = defer_w};
    dl_gpt *g;
    ck_assert_msg(dl_gpt_create(&o, &g) == DL_OK, "%s", dl_errmsg());
    return g;
}

static void tokens(int *in, int *tg, uint64_t s)
{
    for (int i = 0; i < GB * GT; i++) {
        in[i] = (int)(tu_splitmix64((uint64_t)i * 7 + s) % 256);
        tg[i] = (int)(tu_splitmix64((uint64_t)i * 13 + s + 1) % 256);
    }
}

/* the objective: cross-entropy + the auxiliary and z losses averaged over the sequences and
 * the MoE layers; *hash: the routing of every layer */
static double objective(dl_gpt *g, const int *in, const int *tg, uint64_t *hash, int64_t *drops)
{
    double ce, extra = 0;
    dl_gpt_moe_reset(g);
    ck_assert_int_eq(dl_gpt_forward(g, in, tg, GB, &ce), DL_OK);
    *hash = 0, *drops = 0;
    int n = dl_gpt_moe_layers(g);
    for (int i = 0; i < n; i++) {
        dl_moe_stats *s = dl_gpt_moe_stats(g, i);
        extra += (s->aux + s->z) / ((double)s->seqs * n);
        *hash = *hash * 31 + s->hash;
        for (int e = 0; e < s->E; e++) *drops += s->dropped[e];
    }
    return ce + extra;
}

/* The model's gradient of the whole objective (the auxiliary losses' weight comes through the
 * backward's dloss = 1 / (B T)) against central differences (tolerance as fd_err above). */
START_TEST(model_gradient)
{
    dl_arena *a;
    dl_gpt *g = make(moe_cfg(0.75), &a, 0);
    int in[GB * GT], tg[GB * GT];
    tokens(in, tg, 3);
    uint64_t hash, h2;
    int64_t drops;
    dl_gpt_zero_grads(g);
    objective(g, in, tg, &hash, &drops);
    ck_assert(drops > 0);
    ck_assert_int_eq(dl_gpt_backward(g, 1.0 / (GB * GT), NULL, NULL), DL_OK);
    const dl_gpt_layout *l = dl_gpt_get_layout(g);
    double *p = dl_gpt_params(g), *gr = dl_gpt_grads(g), worst = 0;
    int checked = 0;
    for (int k = 0; k < l->ntensors; k++) {
        if (!strstr(l->t[k].name, "mlp.") && !strstr(l->t[k].name, "ln_2"))
            continue;
        for (int s = 0; s < 3; s++, checked++) {
            size_t j = l->t[k].offset +
                       (size_t)(tu_splitmix64((uint64_t)k * 31 + (uint64_t)s) % l->t[k].numel);
            double h = 1e-5, save = p[j];
            p[j] = save + h;
            double lp = objective(g, in, tg, &h2, &drops);
            ck_assert(h2 == hash);
            p[j] = save - h;
            double lm = objective(g, in, tg, &h2, &drops);
            ck_assert(h2 == hash);
            p[j] = save;
            double fd = (lp - lm) / (2 * h);
            worst = fmax(worst, fabs(fd - gr[j]) / (1e-8 + 1e-5 * (fabs(fd) + fabs(gr[j]))));
        }
    }
    ck_assert_int_ge(checked, 3 * (2 * (3 + 4 * E)));
    ck_assert_msg(worst <= 1, "worst gradient error %.3g of the tolerance", worst);
    dl_gpt_destroy(g);
    dl_arena_destroy(a);
}
END_TEST

/* Changing the token at position t0 never changes an earlier position's output (admission is
 * causal); it does change position t0's (the check sees outputs). Drops are active. Not bitwise:
 * a later token moves the rows of an earlier one inside the experts' GEMMs (their count and
 * alignment), which changes BLAS's blocking and so the rounding, by a few ulp of the O(1)
 * logits: probabilities within 1e-12, while a token that leaked into an earlier admission
 * would move an output by O(gate x expert output) = O(1e-2). */
static double prob_diff(const double *a, const double *b, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(a[i] - b[i]));
    return m;
}

START_TEST(causality)
{
    dl_arena *a;
    dl_gpt *g = make(moe_cfg(0.5), &a, 0);
    int in[GB * GT], tg[GB * GT];
    tokens(in, tg, 5);
    size_t V = 256;
    double *before = malloc(sizeof(double) * GB * GT * V);
    uint64_t hash;
    int64_t drops;
    objective(g, in, tg, &hash, &drops);
    ck_assert(drops > 0);
    for (int b = 0; b < GB; b++)
        for (int t = 0; t < GT; t++)
            memcpy(before + ((size_t)b * GT + t) * V, dl_gpt_probs(g, b, t), sizeof(double) * V);
    for (int t0 = 1; t0 < GT; t0 += 3) {
        int in2[GB * GT];
        memcpy(in2, in, sizeof in);
        in2[t0] = (in2[t0] + 101) % 256, in2[GT + t0] = (in2[GT + t0] + 57) % 256;
        objective(g, in2, tg, &hash, &drops);
        for (int b = 0; b < GB; b++) {
            for (int t = 0; t < t0; t++)
                ck_assert_msg(prob_diff(before + ((size_t)b * GT + t) * V, dl_gpt_probs(g, b, t),
                                        V) < 1e-12,
                              "changing position %d changed position %d", t0, t);
            ck_assert(prob_diff(before + ((size_t)b * GT + t0) * V, dl_gpt_probs(g, b, t0), V) >
                      1e-6);
        }
    }
    free(before);
    dl_gpt_destroy(g);
    dl_arena_destroy(a);
}
END_TEST

/* The input part then the weight part equals the whole backward bitwise. */
START_TEST(split_equals_whole)
{
    dl_arena *a;
    dl_gpt *g = make(moe_cfg(0.75), &a, 1);
    int in[GB * GT], tg[GB * GT];
    tokens(in, tg, 7);
    size_t P = dl_gpt_numel(g);
    double loss, *whole = malloc(sizeof(double) * P);
    dl_gpt_zero_grads(g);
    ck_assert_int_eq(dl_gpt_forward(g, in, tg, GB, &loss), DL_OK);
    ck_assert_int_eq(dl_gpt_backward(g, 1.0 / (GB * GT), NULL, NULL), DL_OK);
    memcpy(whole, dl_gpt_grads(g), sizeof(double) * P);
    dl_gpt_zero_grads(g);
    ck_assert_int_eq(dl_gpt_forward(g, in, tg, GB, &loss), DL_OK);
    ck_assert_int_eq(dl_gpt_stage_backward_input(g, 0, 0, 1.0 / (GB * GT)), DL_OK);
    ck_assert_int_eq(dl_gpt_stage_backward_weight(g, 0, 0, NULL, NULL), DL_OK);
    ck_assert(!memcmp(whole, dl_gpt_grads(g), sizeof(double) * P));
    free(whole);
    dl_gpt_destroy(g);
    dl_arena_destroy(a);
}
END_TEST

/* Every ep rank's layout holds its experts (and every dense tensor) with the single-rank
 * initial values. */
START_TEST(expert_init_any_ep)
{
    dl_gpt_config c = moe_cfg(1.0);
    dl_gpt_layout *one, *part;
    ck_assert_int_eq(dl_gpt_layout_create(&c, 1, 0, &one), DL_OK);
    double *p1 = malloc(sizeof(double) * one->numel);
    dl_gpt_init(one, p1, 8, 4);
    ck_assert_int_eq(dl_gpt_num_params(&c), (int64_t)one->numel);
    for (int r = 0; r < 2; r++) {
        ck_assert_int_eq(dl_gpt_layout_create_ep(&c, 1, 0, 2, r, NULL, &part), DL_OK);
        double *p2 = malloc(sizeof(double) * part->numel);
        dl_gpt_init(part, p2, 8, 4);
        int experts = 0;
        for (int k = 0; k < part->ntensors; k++) {
            const dl_tensor_info *t = &part->t[k];
            int j = dl_gpt_find(one, t->name), e;
            ck_assert_int_ge(j, 0);
            ck_assert_int_eq(t->id, j); /* the id: the index in the whole layout */
            if (sscanf(t->name, "h.%*d.mlp.experts.%d", &e) == 1) {
                ck_assert_int_eq(e / (E / 2), r);
                experts++;
            }
            ck_assert(!memcmp(p2 + t->offset, p1 + one->t[j].offset, sizeof(double) * t->numel));
        }
        ck_assert_int_eq(experts, 2 * 4 * (E / 2));
        ck_assert_int_eq(part->ntensors, one->ntensors - 2 * 4 * (E / 2));
        free(p2);
        dl_gpt_layout_destroy(part);
    }
    free(p1);
    dl_gpt_layout_destroy(one);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("moe");
    TCase *tc = tcase_create("moe");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, forward_matches_reference);
    tcase_add_test(tc, finite_differences_k1);
    tcase_add_test(tc, finite_differences_k2);
    tcase_add_test(tc, capacity_extremes);
    tcase_add_test(tc, f32_agrees);
    tcase_add_test(tc, model_gradient);
    tcase_add_test(tc, causality);
    tcase_add_test(tc, split_equals_whole);
    tcase_add_test(tc, expert_init_any_ep);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
