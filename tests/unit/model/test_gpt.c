/* The GPT shard: backward against finite differences (f64), tensor parallelism (t = 2, 4, 8;
 * within the rounding bounds of lib/train/compare.h, with negative controls that fail them) and
 * full recomputation against one rank, and the tp all-reduce count per layer. */
#include "../testutil.h"
#include <check.h>
#include <math.h>
#include <stddef.h>
#include "core/arena.h"
#include "model/layer.h"

static dl_gpt_config tiny(void)
{
    dl_gpt_config c = {.vocab = 256, .seq = 8, .layers = 2, .d_model = 16, .heads = 4, .tie = 0};
    return c;
}

enum { B = 2 };

static void batch(const dl_gpt_config *c, int *in, int *tg)
{
    for (int i = 0; i < B * c->seq; i++) {
        in[i] = (int)(tu_splitmix64((uint64_t)i * 7 + 1) % 256);
        tg[i] = (int)(tu_splitmix64((uint64_t)i * 13 + 5) % 256);
    }
}

typedef struct {
    dl_gpt_config cfg;
    int tp;
    dl_recompute rc;
    double perturb; /* negative control: rank 0's first h.0.ln_1 gain times 1 + perturb */
    /* outputs (global layout, f64) */
    double loss;
    double *grads; /* [numel of the unsharded model] */
    uint64_t tp_ops_fwd, tp_ops_bwd;
    int status[8];
} run_t;

/* Every tp rank computes its shard's gradients and scatters them into the global buffer. */
static int rank_fn(dl_ctx *x, void *arg)
{
    run_t *r = arg;
    int rank = dl_ctx_rank(x);
    dl_gpt_opts o = {.cfg = r->cfg,
                     .dtype = DL_F64,
                     .micro_batch = B,
                     .tp = r->tp,
                     .tp_comm = r->tp > 1 ? dl_ctx_comm(x) : NULL,
                     .recompute = r->rc,
                     .seed = 42,
                     .arena = dl_ctx_arena(x)};
    dl_gpt *g;
    int rc = dl_gpt_create(&o, &g);
    if (rc)
        return rc;
    if (r->perturb != 0 && rank == 0)
        ((double *)dl_gpt_params(g))[tu_rank0_index(&r->cfg, r->tp, "h.0.ln_1.weight", 0)] *=
            1 + r->perturb;
    int in[B * 64], tg[B * 64];
    batch(&r->cfg, in, tg);
    double loss;
    dl_gpt_zero_grads(g);
    dl_comm_stats st;
    dl_comm_reset_stats(dl_ctx_comm(x));
    if ((rc = dl_gpt_forward(g, in, tg, B, &loss)))
        goto out;
    dl_comm_get_stats(dl_ctx_comm(x), &st);
    uint64_t fwd_ops = st.ops;
    if ((rc = dl_gpt_backward(g, 1.0 / (B * r->cfg.seq), NULL, NULL)))
        goto out;
    dl_comm_get_stats(dl_ctx_comm(x), &st);
    if (rank == 0) {
        r->loss = loss;
        r->tp_ops_fwd = fwd_ops;
        r->tp_ops_bwd = st.ops - fwd_ops;
    }
    const dl_gpt_layout *l = dl_gpt_get_layout(g);
    const double *gr = dl_gpt_grads(g);
    /* global offsets: the single-rank layout of the same config */
    dl_gpt_layout *full;
    if ((rc = dl_gpt_layout_create(&r->cfg, 1, 0, &full)))
        goto out;
    for (int k = 0; k < l->ntensors; k++) {
        const dl_tensor_info *t = &l->t[k];
        if (t->shard == DL_SHARD_NONE && rank != 0)
            continue;
        for (size_t i = 0; i < t->numel; i++)
            r->grads[full->t[k].offset + (size_t)dl_gpt_global_index(l, k, i)] = gr[t->offset + i];
    }
    dl_gpt_layout_destroy(full);
out:
    dl_gpt_destroy(g);
    return rc;
}

static void run(run_t *r)
{
    r->grads = calloc((size_t)dl_gpt_num_params(&r->cfg), sizeof(double));
    dl_world_opts o;
    dl_world_opts_init(&o);
    o.nranks = r->tp;
    o.timeout_s = 120;
    int rc = dl_world_run(&o, rank_fn, r);
    ck_assert_msg(rc == DL_OK, "%s", dl_errmsg());
}


START_TEST(finite_differences)
{
    dl_gpt_config c = tiny();
    dl_arena *a;
    ck_assert_int_eq(dl_arena_create(&a, 0, 0), DL_OK);
    dl_gpt_opts o = {.cfg = c, .dtype = DL_F64, .micro_batch = B, .tp = 1, .seed = 7, .arena = a};
    dl_gpt *g;
    ck_assert_int_eq(dl_gpt_create(&o, &g), DL_OK);
    int in[B * 8], tg[B * 8];
    batch(&c, in, tg);
    double loss;
    dl_gpt_zero_grads(g);
    ck_assert_int_eq(dl_gpt_forward(g, in, tg, B, &loss), DL_OK);
    ck_assert(loss > 5.0 && loss < 6.1); /* about ln 256 = 5.545 at initialisation */
    ck_assert_int_eq(dl_gpt_backward(g, 1.0 / (B * c.seq), NULL, NULL), DL_OK);
    const dl_gpt_layout *l = dl_gpt_get_layout(g);
    double *p = dl_gpt_params(g), *gr = dl_gpt_grads(g);
    double worst = 0;
    for (int k = 0; k < l->ntensors; k++) {
        /* a few elements of every tensor (for wte: the rows of tokens that occur) */
        for (int s = 0; s < 4; s++) {
            size_t i = (size_t)(tu_splitmix64((uint64_t)k * 31 + (uint64_t)s) % l->t[k].numel);
            if (k == 0)
                i = (size_t)in[s] * (size_t)c.d_model + (size_t)s;
            size_t j = l->t[k].offset + i;
            double h = 1e-5, save = p[j], lp, lm;
            p[j] = save + h;
            dl_gpt_forward(g, in, tg, B, &lp);
            p[j] = save - h;
            dl_gpt_forward(g, in, tg, B, &lm);
            p[j] = save;
            double fd = (lp - lm) / (2 * h);
            double err = fabs(fd - gr[j]) / fmax(1e-6, fabs(fd) + fabs(gr[j]));
            ck_assert_msg(err < 1e-5, "%s[%zu]: backward %.10g, finite difference %.10g",
                          l->t[k].name, i, gr[j], fd);
            worst = fmax(worst, err);
        }
    }
    dl_gpt_destroy(g);
    dl_arena_destroy(a);
}
END_TEST

/* One forward and backward of f64 on tp ranks against one rank: the loss within R and the
 * gradients within gtol of lib/train/compare.h's rounding analysis (the batch: B sequences). With
 * a hook (the tp run's first backward all-reduce skipped) or a perturbation (1e-6 relative),
 * the same comparison must fail: returns whether it passed. */
static int tp_matches(int tp, int heads, dl__test_hook *hook, double perturb)
{
    dl_gpt_config c = tiny();
    c.heads = heads;
    dl_train_opts eo;
    dl_train_opts_init(&eo);
    eo.model = c;
    eo.precision.dtype = DL_F64;
    eo.batch.global = B;
    run_t one = {.cfg = c, .tp = 1}, par = {.cfg = c, .tp = tp, .perturb = perturb};
    run(&one);
    dl__test_hook_set(hook);
    run(&par);
    dl__test_hook_set(NULL);
    double R = dl__eq_round(&eo), gtol = dl__eq_grad_tol(&eo);
    int ok = fabs(one.loss - par.loss) <= R * fabs(one.loss);
    double w = dl__eq_worst_tensor(&c, par.grads, one.grads, NULL);
    ok = ok && w <= gtol;
    if (!hook && !perturb) {
        ck_assert_msg(ok,
                      "tp %d: loss %.17g vs %.17g (bound %.3g), gradients differ by %.3g "
                      "(bound %.3g)",
                      tp, par.loss, one.loss, R, w, gtol);
        /* exactly 2 all-reduces per layer forward and 2 backward */
        ck_assert_uint_eq(par.tp_ops_fwd, 2u * (unsigned)c.layers);
        ck_assert_uint_eq(par.tp_ops_bwd, 2u * (unsigned)c.layers);
    }
    free(one.grads);
    free(par.grads);
    return ok;
}

static void check_tp(int tp, int heads) { tp_matches(tp, heads, NULL, 0); }

START_TEST(controls)
{
    dl__test_hook h = tu_skip_hook(DL_PURPOSE_ACTIVATIONS, 2 * tiny().layers + 1);
    ck_assert_msg(!tp_matches(2, 4, &h, 0), "tp 2 without its first backward all-reduce passed");
    ck_assert_int_eq(atomic_load(&h.skipped), 2);
    ck_assert_msg(!tp_matches(2, 4, NULL, 1e-6), "tp 2 with one gain perturbed by 1e-6 passed");
}
END_TEST

START_TEST(tp2) { check_tp(2, 4); }
END_TEST
START_TEST(tp4) { check_tp(4, 4); }
END_TEST
START_TEST(tp8) { check_tp(8, 8); }
END_TEST

START_TEST(recompute_same)
{
    dl_gpt_config c = tiny();
    run_t a = {.cfg = c, .tp = 2, .rc = DL_RECOMPUTE_NONE},
          b = {.cfg = c, .tp = 2, .rc = DL_RECOMPUTE_FULL};
    run(&a);
    run(&b);
    ck_assert(a.loss == b.loss);
    ck_assert(dl__eq_worst_tensor(&c, b.grads, a.grads, NULL) == 0.0);
    ck_assert_uint_eq(b.tp_ops_bwd, 4u * (unsigned)c.layers); /* the forward's two again */
    free(a.grads);
    free(b.grads);
}
END_TEST

/* The named views (model/layer.h) against the layout's table: every field of a layer's view is
 * the tensor of that name (names written here, independently of model.c), on the whole model,
 * a tp shard and an interleaved pipeline stage; negative control: the view one tensor on agrees
 * on no field, so the comparison can fail. */
static const struct {
    size_t field;
    const char *name;
} view_names[] = {
    {offsetof(dl_layer_view, ln1_w), "ln_1.weight"},
    {offsetof(dl_layer_view, ln1_b), "ln_1.bias"},
    {offsetof(dl_layer_view, qkv_w), "attn.c_attn.weight"},
    {offsetof(dl_layer_view, qkv_b), "attn.c_attn.bias"},
    {offsetof(dl_layer_view, attproj_w), "attn.c_proj.weight"},
    {offsetof(dl_layer_view, attproj_b), "attn.c_proj.bias"},
    {offsetof(dl_layer_view, ln2_w), "ln_2.weight"},
    {offsetof(dl_layer_view, ln2_b), "ln_2.bias"},
    {offsetof(dl_layer_view, fc_w), "mlp.c_fc.weight"},
    {offsetof(dl_layer_view, fc_b), "mlp.c_fc.bias"},
    {offsetof(dl_layer_view, fcproj_w), "mlp.c_proj.weight"},
    {offsetof(dl_layer_view, fcproj_b), "mlp.c_proj.bias"},
};

static void *view_field(const dl_layer_view *v, size_t field)
{
    void *p;
    memcpy(&p, (const char *)v + field, sizeof p);
    return p;
}

/* Views of every layer the layout holds; returns the fields that name the expected tensor
 * (shift: take the view at the layer's first tensor + shift, the negative control). */
static int views_match(const dl_gpt_layout *l, int shift)
{
    int n = l->ntensors, good = 0;
    char *buf = malloc(l->numel + 1);
    void **tab = malloc(sizeof(void *) * (size_t)(n + DL_LT_COUNT));
    ck_assert(buf && tab);
    for (int k = 0; k < n + DL_LT_COUNT; k++) tab[k] = buf + (k < n ? l->t[k].offset : l->numel);
    for (int ch = 0; ch < l->part.nchunks; ch++)
        for (int i = l->part.first[ch]; i < l->part.first[ch] + l->part.count[ch]; i++) {
            char nm[64];
            snprintf(nm, sizeof nm, "h.%d.ln_1.weight", i);
            int k0 = dl_gpt_find(l, nm);
            ck_assert_int_ge(k0, 0);
            dl_layer_view v = dl_layer_view_at(tab, k0 + shift);
            for (size_t j = 0; j < sizeof view_names / sizeof view_names[0]; j++) {
                snprintf(nm, sizeof nm, "h.%d.%s", i, view_names[j].name);
                int k = dl_gpt_find(l, nm);
                ck_assert_msg(k >= 0, "no tensor %s", nm);
                good += view_field(&v, view_names[j].field) == tab[k];
            }
        }
    free(buf);
    free(tab);
    return good;
}

START_TEST(layer_views)
{
    dl_gpt_config c = tiny();
    c.layers = 4;
    ck_assert_int_eq((int)(sizeof view_names / sizeof view_names[0]), DL_LT_COUNT);
    ck_assert_int_eq((int)(sizeof(dl_layer_view) / sizeof(void *)), DL_LT_COUNT);
    dl_gpt_part stage;
    int bounds[5] = {0, 1, 2, 3, 4};
    ck_assert_int_eq(dl_gpt_part_stage(&c, 2, 2, 1, bounds, &stage), DL_OK);
    struct {
        int tp, rank;
        const dl_gpt_part *part;
        int layers;
    } cases[] = {{1, 0, NULL, 4}, {2, 1, NULL, 4}, {1, 0, &stage, 2}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dl_gpt_layout *l;
        ck_assert_int_eq(dl_gpt_layout_create_part(&c, cases[i].tp, cases[i].rank, cases[i].part,
                                                   &l),
                         DL_OK);
        ck_assert_int_eq(views_match(l, 0), cases[i].layers * DL_LT_COUNT);
        ck_assert_int_eq(views_match(l, 1), 0);
        dl_gpt_layout_destroy(l);
    }
}
END_TEST

START_TEST(bad_config)
{
    dl_gpt_config c = tiny();
    c.heads = 3;
    ck_assert_int_eq(dl_gpt_config_check(&c, 1), DL_EINVAL);
    ck_assert_ptr_nonnull(strstr(dl_errmsg(), "divisible"));
    c = tiny();
    ck_assert_int_eq(dl_gpt_config_check(&c, 3), DL_EINVAL);
    ck_assert_ptr_nonnull(strstr(dl_errmsg(), "tp 2 fits"));
    c.layers = 0;
    ck_assert_int_eq(dl_gpt_config_check(&c, 1), DL_EINVAL);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("gpt");
    TCase *tc = tcase_create("gpt");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, bad_config);
    tcase_add_test(tc, layer_views);
    tcase_add_test(tc, finite_differences);
    tcase_add_test(tc, tp2);
    tcase_add_test(tc, tp4);
    tcase_add_test(tc, controls);
    if (!DL_TEST_SMALL)
        tcase_add_test(tc, tp8);
    tcase_add_test(tc, recompute_same);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
