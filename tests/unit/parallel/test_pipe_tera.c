/* Token-level pipelining in the trainer (TeraPipe, --token-chunks; lib/parallel/pipe_tera.c):
 *  - 1F1B over token chunks (Seq1F1B's order): valid, c = 1 is 1F1B itself, and each stage holds
 *    p - s + c - 1 slices at most (1-based s: its warm-up forwards plus one), at most all of them;
 *  - the trainer with c = 2, 4 slices, pp 2, GPipe's order and 1F1B's, alone and with dp 2 (tp,
 *    ZeRO-3 and full recomputation in the full tier), and with unequal slices (one of a single
 *    token), trains exactly the model one rank trains,
 *    within the rounding bounds of lib/train/compare.h (f64), and the negative control (slices
 *    that skip their key/value cache) fails them;
 *  - evaluation through the slices equals one rank's (equal and unequal slices);
 *  - the key/value caches: on each stage as many as micro-batches in flight (GPipe: all m), of
 *    the stage's layers' keys and values and their gradients, in the arena's kvcache category;
 *  - combinations that cannot run are refused by name. */
#include "../testutil.h"
#include <check.h>
#include <math.h>
#include <string.h>

/* test_pipe.c's small run, f64, with c token slices */
static dl_train_opts base(int pp, int m, int sched, int c)
{
    dl_train_opts o = tu_pipe_opts(pp, m, sched, DL_F64);
    o.pipeline.token_chunks = c;
    return o;
}

/* ---- the schedule --------------------------------------------------------------------------- */

START_TEST(seq1f1b_order)
{
    for (int p = 1; p <= 4; p++)
        for (int n = 1; n <= 3; n++)
            for (int c = 1; c <= 4; c *= 2) {
                dl_sched *s, *one;
                dl_sched_sim *sim;
                ck_assert_int_eq(dl_sched_1f1b_tokens(p, n, c, &s), DL_OK);
                ck_assert_msg(dl_sched_validate(s) == DL_OK, "p %d n %d c %d: %s", p, n, c,
                              dl_errmsg());
                ck_assert_int_eq(s->seq_chunks, c);
                ck_assert_int_eq(dl_sched_simulate(s, NULL, &sim), DL_OK);
                for (int q = 0; q < p; q++) {
                    int want = p - q + c - 1 < n * c ? p - q + c - 1 : n * c;
                    ck_assert_msg(sim->peak_act[q] == want, "p %d n %d c %d stage %d: %d slots", p,
                                  n, c, q, sim->peak_act[q]);
                }
                if (c == 1) { /* 1F1B itself */
                    ck_assert_int_eq(dl_sched_1f1b(p, n, &one), DL_OK);
                    for (int q = 0; q < p; q++) {
                        ck_assert_int_eq(s->len[q], one->len[q]);
                        ck_assert(!memcmp(s->act[q], one->act[q],
                                          sizeof(dl_sched_action) * (size_t)s->len[q]));
                    }
                    dl_sched_free(one);
                }
                dl_sched_sim_free(sim);
                dl_sched_free(s);
            }
}
END_TEST

/* ---- the trainer equals one rank ------------------------------------------------------------ */

static void equals_one_rank(dl_train_opts o)
{
    char why[512];
    int same = tu_pipe_vs_one_rank(o, NULL, why, sizeof why);
    ck_assert_msg(same == 1, "%s c %d dp %d tp %d pp %d m %d zero %d: %s",
                  dl_sched_kind_name((dl_sched_kind)o.pipeline.schedule), o.pipeline.token_chunks,
                  o.layout.dp, o.layout.tp, o.layout.pp, o.batch.microbatches, o.zero.stage, why);
}

/* loop index -> (dp, m, schedule, c) */
static const struct {
    int dp, m, sched, c;
} CASES[] = {
    {1, 2, DL_SCHED_GPIPE, 2}, {2, 2, DL_SCHED_1F1B, 4},  {1, 3, DL_SCHED_1F1B, 2},
    {2, 2, DL_SCHED_GPIPE, 4}, {1, 2, DL_SCHED_GPIPE, 4}, {2, 1, DL_SCHED_1F1B, 2},
};
#define NCASES (int)(sizeof CASES / sizeof CASES[0])

START_TEST(tera_f64)
{
    dl_train_opts o = base(2, CASES[_i].m, CASES[_i].sched, CASES[_i].c);
    o.layout.dp = CASES[_i].dp;
    equals_one_rank(o);
}
END_TEST

/* unequal slices (TeraPipe's dynamic program's kind, a slice of one token among them; the
 * buffers and hand-offs sized for the longest), in both orders, with dp 2 */
START_TEST(tera_unequal_f64)
{
    static const int lens[4] = {5, 3, 7, 1};
    for (int k = 0; k < 2; k++) {
        dl_train_opts o = base(2, 2, k ? DL_SCHED_1F1B : DL_SCHED_GPIPE, 4);
        o.pipeline.token_lens = lens;
        o.layout.dp = 1 + k;
        equals_one_rank(o);
    }
}
END_TEST

/* with tp 2, ZeRO-3 (the units gathered again for every slice) and full recomputation (a
 * slice's recomputed keys and values rewrite its cache rows with the same values) */
START_TEST(tera_compose_f64)
{
    dl_train_opts o = base(2, 2, DL_SCHED_1F1B, 4);
    o.layout.tp = 2;
    o.model.layers = 2;
    equals_one_rank(o);
    o = base(2, 2, DL_SCHED_GPIPE, 2);
    o.layout.dp = 2;
    o.zero.stage = 3;
    equals_one_rank(o);
    o = base(2, 2, DL_SCHED_1F1B, 4);
    o.precision.recompute = DL_RECOMPUTE_FULL;
    equals_one_rank(o);
}
END_TEST

/* Evaluation runs each batch's slices through a cache (equal and unequal slices): with the
 * parameters left at their initial values (lr 1e-300: Adam's update lr·φ(g), |φ| <= 1, is lost
 * in the parameters' rounding) the validation loss is one rank's to the
 * rounding of a forward (lib/train/compare.h's R, relative; a mean of positive terms). */
START_TEST(eval_slices)
{
    static const int lens[4] = {5, 3, 7, 1};
    for (int k = 0; k < 2; k++) {
        dl_train_opts o = base(2, 2, DL_SCHED_GPIPE, 4), one;
        o.pipeline.token_lens = k ? lens : NULL;
        o.optim.steps = 1;
        o.optim.lr = 1e-300, o.optim.min_lr = 0; /* an update below the parameters' rounding */
        o.output.want_params = 0;
        one = o;
        one.layout.pp = 1, one.pipeline.token_chunks = 0, one.pipeline.token_lens = NULL;
        one.pipeline.schedule = 0;
        dl_train_result a, b;
        ck_assert_msg(dl_train_run(&o, &a) == DL_OK, "%s", dl_errmsg());
        ck_assert_msg(dl_train_run(&one, &b) == DL_OK, "%s", dl_errmsg());
        double va = a.eval.final_val_loss, vb = b.eval.final_val_loss;
        ck_assert_msg(fabs(va - vb) <= dl__eq_round(&o) * vb,
                      "%s slices: validation loss %.17g, one rank %.17g", k ? "unequal" : "equal",
                      va, vb);
        dl_train_result_free(&a);
        dl_train_result_free(&b);
    }
}
END_TEST

/* The bounds see the cache: slices that attend to their own positions only (the earlier
 * slices' keys and values skipped) fail them. */
START_TEST(control_no_cache)
{
    dl_train_opts o = base(2, 2, DL_SCHED_GPIPE, 4);
    dl__test_hook h = {0};
    h.tera_skip_cache = 1;
    char why[512];
    int same = tu_pipe_vs_one_rank(o, &h, why, sizeof why);
    ck_assert_msg(same == 0 && atomic_load(&h.skipped) > 0, "slices without their cache: %s",
                  same ? "passed as the same model" : why);
    fprintf(stderr, "control: token slices without their key/value cache differ (%s)\n", why);
}
END_TEST

/* ---- the caches' memory --------------------------------------------------------------------- */

/* GPipe's order holds every micro-batch in flight: m caches per stage, each of the stage's
 * layers' keys and values (micro x T rows of 2C) and as much for their gradients. */
START_TEST(kv_memory)
{
    int m = 3, c = 4;
    dl_train_opts o = base(2, m, DL_SCHED_GPIPE, c);
    o.output.want_params = 0;
    o.optim.steps = 1;
    dl_train_result r;
    ck_assert_msg(dl_train_run(&o, &r) == DL_OK, "%s", dl_errmsg());
    uint64_t want = 2ull * m * (o.model.layers / 2) * o.batch.micro * o.model.seq * 2 *
                    o.model.d_model * sizeof(double);
    for (int rank = 0; rank < 2; rank++)
        ck_assert_msg(r.memory.peak[rank * DL_MEM_NCATEGORIES + DL_MEM_KVCACHE] == want,
                      "stage %d: %llu kvcache bytes, expected %llu", rank,
                      (unsigned long long)r.memory.peak[rank * DL_MEM_NCATEGORIES + DL_MEM_KVCACHE],
                      (unsigned long long)want);
    ck_assert_int_eq(r.pipeline.slots[0], m * c);
    dl_train_result_free(&r);
}
END_TEST

/* ---- refusals ------------------------------------------------------------------------------- */

static void refused(dl_train_opts o, const char *what)
{
    ck_assert_int_eq(dl_train_resolve(&o, o.layout.dp * o.layout.tp * o.layout.pp), DL_EINVAL);
    ck_assert_msg(strstr(dl_errmsg(), what) != NULL, "expected '%s' in: %s", what, dl_errmsg());
}

START_TEST(bad_configs)
{
    refused(base(2, 2, DL_SCHED_GPIPE, 3), "does not divide the sequence's 16 tokens");
    refused(base(2, 2, DL_SCHED_GPIPE, 32), "more than the sequence's 16 tokens");
    static const int short_lens[3] = {5, 3, 7}, empty[3] = {8, 8, 0};
    dl_train_opts u = base(2, 2, DL_SCHED_GPIPE, 3);
    u.pipeline.token_lens = short_lens;
    refused(u, "3 lengths of at least 1 must add up to the sequence's 16 tokens");
    u.pipeline.token_lens = empty;
    refused(u, "3 lengths of at least 1 must add up to the sequence's 16 tokens");
    const int no[] = {DL_SCHED_INTERLEAVED, DL_SCHED_ASYNC, DL_SCHED_NAIVE,    DL_SCHED_1F1B_SPLIT,
                      DL_SCHED_ZB_H1,       DL_SCHED_ZB_V,  DL_SCHED_DUALPIPEV};
    for (int k = 0; k < (int)(sizeof no / sizeof no[0]); k++) {
        dl_train_opts o = base(2, no[k] == DL_SCHED_NAIVE ? 1 : 4, no[k], 2);
        refused(o, "--token-chunks needs --schedule gpipe or 1f1b");
    }
    dl_train_opts o = base(2, 2, DL_SCHED_GPIPE, 2);
    o.model.experts = 4;
    o.model.top_k = 1, o.model.moe_every = 1, o.model.capacity = 1.0;
    refused(o, "does not combine with MoE layers");
    o = base(2, 2, DL_SCHED_GPIPE, 2);
    o.output.sample = 8;
    refused(o, "does not combine with --sample");
    o = base(1, 2, DL_SCHED_GPIPE, 2);
    refused(o, "--token-chunks needs a pipeline");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("pipe_tera");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, seq1f1b_order);
    tcase_add_test(tc, bad_configs);
    tcase_add_loop_test(tc, tera_f64, 0, DL_TEST_SMALL ? 2 : NCASES);
    tcase_add_test(tc, tera_unequal_f64);
    tcase_add_test(tc, eval_slices);
    tcase_add_test(tc, control_no_cache);
    tcase_add_test(tc, kv_memory);
    if (!DL_TEST_SMALL)
        tcase_add_test(tc, tera_compose_f64);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
