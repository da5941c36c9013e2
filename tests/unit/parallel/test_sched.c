/* Pipeline schedules as data (lecture 17 §4, §6.2, code 03) against the lecture's text and
 * against independent counts: the grids character for character, bubbles, activations, weight
 * versions, TeraPipe, the partition example, the validator's rejections, and a property sweep
 * over p, m and v. */
#define _GNU_SOURCE
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "parallel/sched_priv.h"
#include "../testutil.h"

#define ck_near(x, want, tol)                                                                      \
    ck_assert_msg(fabs((double)(x) - (double)(want)) <= (tol), "%s = %.12g, want %.12g +- %g", #x, \
                  (double)(x), (double)(want), (double)(tol))

/* The lecture's §4.1 grids byte for byte, its captions in English (numbers unchanged) (code 03
 * part 1): the naive and GPipe grids side by side, then the 1F1B grid. */
static const char LECTURE_NAIVE_GPIPE[] =
    "naive (1 micro-batch): bubble 75%         GPipe (4 micro-batches): bubble 42.9%\n"
    "GPU 1  0·········aa                       GPU 1  0123·········aabbccdd\n"
    "GPU 2  ·0······aa··                       GPU 2  ·0123······aabbccdd··\n"
    "GPU 3  ··0···aa····                       GPU 3  ··0123···aabbccdd····\n"
    "GPU 4  ···0aa······                       GPU 4  ···0123aabbccdd······\n";
static const char LECTURE_1F1B[] =
    "1F1B (8 micro-batches): bubble 27.3%, activations held per stage 4 / 3 / 2 / 1\n"
    "GPU 1  0123······aa4bb5cc6dd7ee·ff·gg·hh\n"
    "GPU 2  ·012····aa3bb4cc5dd6ee7ff·gg·hh··\n"
    "GPU 3  ··01··aa2bb3cc4dd5ee6ff7gg·hh····\n"
    "GPU 4  ···0aa1bb2cc3dd4ee5ff6gg7hh······\n";

/* The lecture places the GPipe block at display column 42. */
#define LECTURE_COLUMN 42

static dl_sched_sim *sim_of(const dl_sched *s, const dl_sched_costs *c)
{
    dl_sched_sim *sim = NULL;
    ck_assert_msg(dl_sched_simulate(s, c, &sim) == DL_OK, "simulate: %s", dl_errmsg());
    return sim;
}

static char *render(const dl_sched *s, int with_act)
{
    dl_sched_sim *sim = sim_of(s, NULL);
    char *out = NULL;
    ck_assert_msg(dl_sched_render(s, sim, with_act, &out) == DL_OK, "render: %s", dl_errmsg());
    dl_sched_sim_free(sim);
    return out;
}

/* ---- the lecture's grids ----------------------------------------------------------------- */

START_TEST(t_lecture_grids)
{
    dl_sched *naive, *gpipe, *f1b;
    ck_assert_int_eq(dl_sched_naive(4, &naive), DL_OK);
    ck_assert_int_eq(dl_sched_gpipe(4, 4, &gpipe), DL_OK);
    ck_assert_int_eq(dl_sched_1f1b(4, 8, &f1b), DL_OK);

    char *a = render(naive, 0), *b = render(gpipe, 0), *both = NULL;
    ck_assert_int_eq(dl_sched_side_by_side(a, b, LECTURE_COLUMN, &both), DL_OK);
    ck_assert_msg(strcmp(both, LECTURE_NAIVE_GPIPE) == 0, "got\n%s\nwant\n%s", both,
                  LECTURE_NAIVE_GPIPE);
    free(a);
    free(b);
    free(both);

    char *c = render(f1b, 1);
    ck_assert_msg(strcmp(c, LECTURE_1F1B) == 0, "got\n%s\nwant\n%s", c, LECTURE_1F1B);
    free(c);

    /* The grid alone is the lines after the caption. */
    dl_sched_sim *sim = sim_of(f1b, NULL);
    char *g = NULL;
    ck_assert_int_eq(dl_sched_grid(f1b, sim, &g), DL_OK);
    ck_assert_str_eq(g, strchr(LECTURE_1F1B, '\n') + 1);
    free(g);
    dl_sched_sim_free(sim);

    /* Wide characters count two columns (the lecture's own captions are Chinese). */
    ck_assert_int_eq(dl_sched_display_width("朴素（1 个微批次）：气泡 75%"), 28);
    ck_assert_int_eq(dl_sched_display_width("GPU 1  0·········aa"), 19);
    dl_sched_free(naive);
    dl_sched_free(gpipe);
    dl_sched_free(f1b);
}
END_TEST

/* ---- exact orders ------------------------------------------------------------------------ */

/* A stage's actions as "F0 F1 B0 ...", in the validator's notation. */
static char *stage_str(const dl_sched *s, int q)
{
    static char out[1024];
    char a[32];
    out[0] = '\0';
    for (int i = 0; i < s->len[q]; i++) {
        if (i)
            strcat(out, " ");
        strcat(out, dl_sched_action_str(s, &s->act[q][i], a, sizeof a));
    }
    return out;
}

START_TEST(t_orders)
{
    dl_sched *s;
    /* 1F1B, p 4, m 8: GPU s+1 runs p - s forwards before its first backward (the grid) */
    ck_assert_int_eq(dl_sched_1f1b(4, 8, &s), DL_OK);
    ck_assert_str_eq(stage_str(s, 0), "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7 OPT");
    ck_assert_str_eq(stage_str(s, 3), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7 OPT");
    dl_sched_free(s);
    ck_assert_int_eq(dl_sched_async(3, 4, 1, &s), DL_OK);
    ck_assert_str_eq(stage_str(s, 0), "F0 F1 F2 B0 OPT F3 B1 OPT B2 OPT B3 OPT");
    dl_sched_free(s);
    /* Megatron's interleaved order, p 2, m 4, v 2 (derived by hand from schedules.py):
     * forward k is micro-batch (k / 4) 2 + k % 2 of chunk (k / 2) % 2, backward k the chunk
     * 1 - (k / 2) % 2; warm-up 2 (p - s - 1) + (v - 1) p = 4 on stage 0, 2 on stage 1. */
    ck_assert_int_eq(dl_sched_interleaved(2, 4, 2, &s), DL_OK);
    ck_assert_str_eq(stage_str(s, 0), "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 "
                                      "B2.1 B3.1 B2.0 B3.0 OPT");
    ck_assert_str_eq(stage_str(s, 1), "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 "
                                      "F3.1 B3.1 B2.0 B3.0 OPT");
    dl_sched_free(s);
    /* m = p: all forwards first (Megatron's special case) */
    ck_assert_int_eq(dl_sched_interleaved(2, 2, 2, &s), DL_OK);
    ck_assert_str_eq(stage_str(s, 1), "F0.0 F1.0 F0.1 F1.1 B0.1 B1.1 B0.0 B1.0 OPT");
    dl_sched_free(s);
    /* v = 1 is the plain 1F1B */
    ck_assert_int_eq(dl_sched_interleaved(2, 4, 1, &s), DL_OK);
    ck_assert_str_eq(stage_str(s, 0), "F0 F1 B0 F2 B1 F3 B2 B3 OPT");
    dl_sched_free(s);
    /* TeraPipe: sequences' token chunks forward in order, backward back to front */
    ck_assert_int_eq(dl_sched_terapipe(2, 2, 2, &s), DL_OK);
    ck_assert_str_eq(stage_str(s, 1), "F0 F1 F2 F3 B1 B0 B3 B2 OPT");
    dl_sched_free(s);
}
END_TEST

/* ---- bubbles and activations ------------------------------------------------------------- */

START_TEST(t_bubbles)
{
    struct {
        int kind, m;
        double want;
        const char *pct;
    } cases[] = {
        {DL_SCHED_NAIVE, 1, 0.75, "75.0"},
        {DL_SCHED_GPIPE, 4, 3.0 / 7, "42.9"},
        {DL_SCHED_1F1B, 8, 3.0 / 11, "27.3"},
        {DL_SCHED_GPIPE, 8, 3.0 / 11, "27.3"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dl_sched *s;
        int st = cases[i].kind == DL_SCHED_NAIVE   ? dl_sched_naive(4, &s)
                 : cases[i].kind == DL_SCHED_GPIPE ? dl_sched_gpipe(4, cases[i].m, &s)
                                                   : dl_sched_1f1b(4, cases[i].m, &s);
        ck_assert_int_eq(st, DL_OK);
        dl_sched_sim *sim = sim_of(s, NULL);
        ck_near(sim->bubble_total, cases[i].want, 1e-12);
        ck_near(dl_sched_bubble_formula(s), cases[i].want, 1e-12);
        ck_near(sim->makespan, 3.0 * (cases[i].m + 3), 0); /* (m + p - 1)(t_f + t_b) */
        char t[16];
        snprintf(t, sizeof t, "%.1f", 100 * sim->bubble_total);
        ck_assert_str_eq(t, cases[i].pct);
        /* every stage idles (p - 1)(t_f + t_b) = 9 units */
        for (int q = 0; q < 4; q++) ck_near(sim->bubble[q] * sim->makespan, 9, 1e-9);
        dl_sched_sim_free(sim);
        dl_sched_free(s);
    }
    /* Interleaving with per-chunk costs (1, 2): (p - 1)/(v m + p - 1) = 3/19 for p 4, m 8, v 2. */
    dl_sched *s;
    ck_assert_int_eq(dl_sched_interleaved(4, 8, 2, &s), DL_OK);
    dl_sched_sim *sim = sim_of(s, NULL);
    ck_near(sim->bubble_total, 3.0 / 19, 1e-12);
    ck_near(dl_sched_bubble_formula(s), 3.0 / 19, 1e-12);
    dl_sched_sim_free(sim);
    dl_sched_free(s);
}
END_TEST

START_TEST(t_activations)
{
    dl_sched *g, *f;
    ck_assert_int_eq(dl_sched_gpipe(4, 8, &g), DL_OK);
    ck_assert_int_eq(dl_sched_1f1b(4, 8, &f), DL_OK);
    dl_sched_sim *sg = sim_of(g, NULL), *sf = sim_of(f, NULL);
    for (int q = 0; q < 4; q++) {
        ck_assert_int_eq(sg->peak_act[q], 8);     /* GPipe: m */
        ck_assert_int_eq(sf->peak_act[q], 4 - q); /* 1F1B: 4 / 3 / 2 / 1 */
        ck_assert_int_eq(sf->peak_act[q], dl_plan_inflight(DL_PLAN_1F1B, 4, 8, q + 1));
        ck_assert_int_eq(sg->peak_act[q], dl_plan_inflight(DL_PLAN_GPIPE, 4, 8, q + 1));
    }
    dl_sched_sim_free(sg);
    dl_sched_sim_free(sf);
    dl_sched_free(g);
    dl_sched_free(f);
}
END_TEST

/* ---- weight versions (§4.3, exercise 6) ---------------------------------------------------- */

START_TEST(t_versions)
{
    int p = 4, m = 8;
    for (int stash = 0; stash <= 1; stash++) {
        dl_sched *s;
        ck_assert_int_eq(dl_sched_async(p, m, stash, &s), DL_OK);
        ck_assert_int_eq(s->flush, 0);
        ck_assert_int_eq(s->stash, stash);
        /* no flush: an OPT right after every backward, none elsewhere */
        for (int q = 0; q < p; q++) {
            int nopt = 0;
            for (int i = 0; i < s->len[q]; i++)
                if (s->act[q][i].op == DL_SCHED_OPT) {
                    nopt++;
                    ck_assert(i > 0 && s->act[q][i - 1].op == DL_SCHED_B &&
                              s->act[q][i - 1].mb == s->act[q][i].mb);
                }
            ck_assert_int_eq(nopt, m);
        }
        dl_sched_versions *v;
        ck_assert_msg(dl_sched_versions_get(s, &v) == DL_OK, "%s", dl_errmsg());
        for (int q = 0; q < p; q++) {
            /* the lecture's 3 / 2 / 1 / 0: p - s updates for 1-based s */
            ck_assert_int_eq(v->max_gap[q], 3 - q);
            ck_assert_int_eq(v->max_gap[q], dl_plan_staleness(p, q + 1));
            for (int j = 0; j < m; j++) {
                int k = q * m + j, w = p - q - 1;
                /* warm-up micro-batches see fewer updates; steady ones exactly p - s */
                ck_assert_int_eq(v->gap[k], j < w ? j : w);
                if (stash)
                    ck_assert_msg(v->bwd[k] == v->fwd[k],
                                  "stage %d mb %d: backward uses version %d, "
                                  "forward used %d",
                                  q, j, v->bwd[k], v->fwd[k]);
                else
                    ck_assert_int_eq(v->bwd[k], v->fwd[k] + v->gap[k]);
            }
            /* stashing keeps one version per micro-batch in flight */
            ck_assert_int_eq(v->peak_versions[q], stash ? 4 - q : 1);
        }
        dl_sched_versions_free(v);
        dl_sched_free(s);
    }
    /* with a flush nothing changes between a forward and its backward */
    dl_sched *s;
    ck_assert_int_eq(dl_sched_1f1b(4, 8, &s), DL_OK);
    dl_sched_versions *v;
    ck_assert_int_eq(dl_sched_versions_get(s, &v), DL_OK);
    for (int q = 0; q < 4; q++) ck_assert_int_eq(v->max_gap[q], 0);
    dl_sched_versions_free(v);
    dl_sched_free(s);
}
END_TEST

/* ---- TeraPipe (§6.2, code 03 part 5) --------------------------------------------------------- */

START_TEST(t_terapipe)
{
    const char *want[] = {"60.0", "42.9", "27.3", "15.8"};
    for (int i = 0, c = 1; c <= 8; c *= 2, i++) {
        dl_sched *s;
        ck_assert_int_eq(dl_sched_terapipe(4, 2, c, &s), DL_OK);
        ck_assert_int_eq(s->m, 2 * c);
        ck_assert_int_eq(s->seq_chunks, c);
        /* the lecture's approximation: a token chunk costs 1/c of its sequence */
        dl_sched_costs k = {1.0 / c, 2.0 / c, 0, -1};
        dl_sched_sim *sim = sim_of(s, &k);
        char t[16];
        snprintf(t, sizeof t, "%.1f", 100 * sim->bubble_total);
        ck_assert_str_eq(t, want[i]);
        ck_near(sim->bubble_total, dl_plan_bubble(4, 2 * c, 1), 1e-12); /* m: 2 -> 2c */
        dl_sched_sim_free(sim);
        dl_sched_free(s);
    }
    /* token order is checked: a chunk's backward before the later chunk's backward */
    dl_sched *s;
    ck_assert_int_eq(dl_sched_terapipe(2, 1, 2, &s), DL_OK);
    dl_sched_action t = s->act[1][2];
    s->act[1][2] = s->act[1][3];
    s->act[1][3] = t;
    ck_assert_int_eq(dl_sched_validate(s), DL_EINVAL);
    ck_assert_msg(strstr(dl_errmsg(), "stage 1 action 2 (B0)") &&
                      strstr(dl_errmsg(), "token chunk 0"),
                  "%s", dl_errmsg());
    dl_sched_free(s);
}
END_TEST

/* ---- partitioning (§4.4, code 03 part 4) -------------------------------------------------- */

START_TEST(t_partition)
{
    double c[12] = {3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 4};
    int first[5];
    double sc[4], mx;
    ck_assert_int_eq(dl_sched_partition(c, 12, 4, 0, first, sc, &mx), DL_OK);
    int even_first[5] = {0, 3, 6, 9, 12};
    double even_cost[4] = {5, 3, 3, 6};
    for (int j = 0; j < 5; j++) ck_assert_int_eq(first[j], even_first[j]);
    for (int j = 0; j < 4; j++) ck_near(sc[j], even_cost[j], 0);
    ck_near(mx, 6, 0);

    ck_assert_int_eq(dl_sched_partition(c, 12, 4, 1, first, sc, &mx), DL_OK);
    int dp_first[5] = {0, 2, 6, 10, 12}; /* 0-1, 2-5, 6-9, 10-11 */
    double dp_cost[4] = {4, 4, 4, 5};
    for (int j = 0; j < 5; j++) ck_assert_int_eq(first[j], dp_first[j]);
    for (int j = 0; j < 4; j++) ck_near(sc[j], dp_cost[j], 0);
    ck_near(mx, 5, 0);

    ck_assert_int_eq(dl_sched_partition(c, 12, 13, 1, first, NULL, NULL), DL_EINVAL);
    ck_assert_msg(strstr(dl_errmsg(), "13") != NULL, "%s", dl_errmsg());
}
END_TEST

/* ---- the validator ------------------------------------------------------------------------ */

static dl_sched *custom(int p, int m, int v)
{
    dl_sched *s;
    ck_assert_int_eq(dl_sched_new(p, m, v, &s), DL_OK);
    return s;
}

#define ck_rejects(s, ...)                                                                         \
    do {                                                                                           \
        ck_assert_int_eq(dl_sched_validate(s), DL_EINVAL);                                         \
        const char *want_[] = {__VA_ARGS__};                                                       \
        for (size_t w_ = 0; w_ < sizeof want_ / sizeof want_[0]; w_++)                             \
            ck_assert_msg(strstr(dl_errmsg(), want_[w_]) != NULL, "message '%s' lacks '%s'",       \
                          dl_errmsg(), want_[w_]);                                                 \
        dl_sched_sim *sim_ = NULL;                                                                 \
        ck_assert_int_eq(dl_sched_simulate(s, NULL, &sim_), DL_EINVAL);                            \
        ck_assert(sim_ == NULL);                                                                   \
    } while (0)

START_TEST(t_validator)
{
    /* a backward before its forward */
    dl_sched *s = custom(2, 1, 1);
    dl_sched_push(s, 0, DL_SCHED_F, 0, 0);
    dl_sched_push(s, 0, DL_SCHED_B, 0, 0);
    dl_sched_push(s, 0, DL_SCHED_OPT, -1, -1);
    dl_sched_push(s, 1, DL_SCHED_B, 0, 0);
    dl_sched_push(s, 1, DL_SCHED_F, 0, 0);
    dl_sched_push(s, 1, DL_SCHED_OPT, -1, -1);
    ck_rejects(s, "stage 1 action 0 (B0)", "backward before its forward", "action 1");
    dl_sched_free(s);

    /* a cross-stage cycle: stage 0 waits for B0 from stage 1, which first wants F1 from stage 0 */
    s = custom(2, 2, 1);
    int l0[][2] = {{DL_SCHED_F, 0}, {DL_SCHED_B, 0}, {DL_SCHED_F, 1}, {DL_SCHED_B, 1}};
    int l1[][2] = {{DL_SCHED_F, 1}, {DL_SCHED_F, 0}, {DL_SCHED_B, 0}, {DL_SCHED_B, 1}};
    for (int i = 0; i < 4; i++) {
        dl_sched_push(s, 0, l0[i][0], l0[i][1], 0);
        dl_sched_push(s, 1, l1[i][0], l1[i][1], 0);
    }
    dl_sched_push(s, 0, DL_SCHED_OPT, -1, -1);
    dl_sched_push(s, 1, DL_SCHED_OPT, -1, -1);
    ck_rejects(s, "deadlock", "stage 0 action 1 (B0) waits for B0 on stage 1 (its action 2)",
               "stage 1 action 0 (F1) waits for F1 on stage 0 (its action 2)");
    dl_sched_free(s);

    /* interleaving: chunk 1 of stage 0 before chunk 0 has gone round the pipeline */
    ck_assert_int_eq(dl_sched_interleaved(2, 2, 2, &s), DL_OK);
    ck_assert_int_eq(dl_sched_validate(s), DL_OK);
    int i0 = -1, i1 = -1;
    for (int i = 0; i < s->len[0]; i++) {
        dl_sched_action *x = &s->act[0][i];
        if (x->op == DL_SCHED_F && x->mb == 0 && x->chunk == 0)
            i0 = i;
        if (x->op == DL_SCHED_F && x->mb == 0 && x->chunk == 1)
            i1 = i;
    }
    ck_assert(i0 == 0 && i1 > i0);
    dl_sched_action t = s->act[0][i0];
    s->act[0][i0] = s->act[0][i1];
    s->act[0][i1] = t;
    ck_rejects(s, "deadlock", "stage 0 action 0 (F0.1) waits for F0.0 on stage 1");
    dl_sched_free(s);

    /* missing, repeated, out of range, misplaced optimizer step */
    ck_assert_int_eq(dl_sched_gpipe(2, 2, &s), DL_OK);
    s->len[1]--; /* drop stage 1's OPT */
    ck_rejects(s, "stage 1 has no optimizer step");
    s->len[1]++;
    s->act[1][3].mb = 0; /* B1 -> B0 twice */
    ck_rejects(s, "stage 1 action 3 (B0): repeats action 2");
    s->act[1][3].mb = 5;
    ck_rejects(s, "stage 1 action 3 (B5): micro-batch 5 out of range 0..1");
    s->act[1][3].mb = 1;
    s->act[0][1] = (dl_sched_action){DL_SCHED_OPT, -1, -1};
    ck_rejects(s, "stage 0 action 1 (OPT)", "one optimizer step per stage");
    dl_sched_free(s);
    ck_assert_int_eq(dl_sched_gpipe(2, 2, &s), DL_OK);
    s->len[0] -= 2; /* stage 0 loses B1 (and OPT, put back) */
    s->act[0][s->len[0]++] = (dl_sched_action){DL_SCHED_OPT, -1, -1};
    ck_rejects(s, "stage 0 never runs B1");
    dl_sched_free(s);
    ck_assert_int_eq(dl_sched_validate(NULL), DL_EINVAL);
}
END_TEST

/* 1F1B with each B split into I in its place and W right after, or every W deferred to the
 * end (before OPT): valid; each stage as busy as in 1F1B (I + W = B), and no slower, since an
 * I hands its gradient on after b / 2 instead of b. */
static dl_sched *split_1f1b(int p, int m, int defer)
{
    dl_sched *b, *s;
    ck_assert_int_eq(dl_sched_1f1b(p, m, &b), DL_OK);
    ck_assert_int_eq(dl_sched_new(p, m, 1, &s), DL_OK);
    for (int q = 0; q < p; q++) {
        for (int i = 0; i < b->len[q]; i++) {
            dl_sched_action *x = &b->act[q][i];
            if (x->op == DL_SCHED_OPT && defer)
                for (int j = 0; j < m; j++) dl_sched_push(s, q, DL_SCHED_W, j, 0);
            dl_sched_push(s, q, x->op == DL_SCHED_B ? DL_SCHED_I : x->op, x->mb, x->chunk);
            if (x->op == DL_SCHED_B && !defer)
                dl_sched_push(s, q, DL_SCHED_W, x->mb, 0);
        }
    }
    dl_sched_free(b);
    return s;
}

START_TEST(t_split_backward)
{
    for (int defer = 0; defer <= 1; defer++) {
        dl_sched *s = split_1f1b(4, 8, defer), *b;
        ck_assert_msg(dl_sched_validate(s) == DL_OK, "%s", dl_errmsg());
        ck_assert(dl_sched_splits(s, -1) && dl_sched_splits(s, 3));
        ck_assert_int_eq(dl_sched_1f1b(4, 8, &b), DL_OK);
        ck_assert(!dl_sched_splits(b, -1));
        dl_sched_sim *sim = sim_of(s, NULL), *ref = sim_of(b, NULL);
        ck_assert(sim->makespan <= ref->makespan);
        for (int q = 0; q < 4; q++) ck_assert_double_eq_tol(sim->busy[q], ref->busy[q], 1e-12);
        /* activations are held until W: deferring every W holds all m on every stage */
        ck_assert_int_eq(sim->peak_act[3], defer ? 8 : ref->peak_act[3]);
        dl_sched_sim_free(sim), dl_sched_sim_free(ref), dl_sched_free(b);
        char a[16];
        dl_sched_action x = {DL_SCHED_W, 3, 0};
        ck_assert_str_eq(dl_sched_action_str(s, &x, a, sizeof a), "W3");
        dl_sched_free(s);
    }
    /* a W before its I, named; a W without its I; an I without its W; B and I both */
    dl_sched *s = split_1f1b(2, 2, 0);
    ck_assert_int_eq(s->act[1][1].op, DL_SCHED_I); /* stage 1: F0 I0 W0 F1 I1 W1 OPT */
    dl_sched_action t = s->act[1][1];
    s->act[1][1] = s->act[1][2];
    s->act[1][2] = t;
    ck_rejects(s, "stage 1 action 1 (W0): weight gradient before its input gradient",
               "I0 is action 2 on stage 1");
    memmove(&s->act[1][2], &s->act[1][3], sizeof t * (size_t)(s->len[1] - 3));
    s->len[1]--; /* stage 1: F0 W0 F1 I1 W1 OPT */
    ck_rejects(s, "stage 1 action 1 (W0): weight gradient before its input gradient",
               "stage 1 never runs I0");
    dl_sched_free(s);
    s = split_1f1b(2, 2, 0);
    s->act[1][2] = (dl_sched_action){DL_SCHED_B, 0, 0}; /* stage 1: F0 I0 B0 ... */
    ck_rejects(s, "stage 1 action 1 (I0): B0 already runs as B (action 2)");
    s->act[1][2] = (dl_sched_action){DL_SCHED_F, 5, 0};
    ck_rejects(s, "micro-batch 5 out of range");
    dl_sched_free(s);
    /* async: an OPT that applies micro-batch 0 before W0 */
    dl_sched *as;
    ck_assert_int_eq(dl_sched_async(2, 2, 0, &as), DL_OK);
    s = custom(2, 2, 1);
    s->flush = 0;
    for (int q = 0; q < 2; q++)
        for (int i = 0; i < as->len[q]; i++) {
            dl_sched_action *x = &as->act[q][i];
            dl_sched_push(s, q, x->op == DL_SCHED_B ? DL_SCHED_I : x->op, x->mb, x->chunk);
            if (x->op == DL_SCHED_OPT && x->mb == 1)
                dl_sched_push(s, q, DL_SCHED_W, 0, 0), dl_sched_push(s, q, DL_SCHED_W, 1, 0);
        }
    dl_sched_free(as);
    ck_rejects(s, "stage 0 action", "(OPT): optimizer step before the weight gradient it applies",
               "W0 is action");
    dl_sched_free(s);
    s = split_1f1b(2, 2, 1);
    s->len[0] -= 3; /* stage 0 loses W0 W1 OPT; OPT put back */
    s->act[0][s->len[0]++] = (dl_sched_action){DL_SCHED_OPT, -1, -1};
    ck_rejects(s, "stage 0 never runs W0");
    dl_sched_free(s);
}
END_TEST

/* ---- zero-bubble schedules ----------------------------------------------------------------- */

/* Costs F, B (the input gradient I), W: a whole backward costs B + W. */
static dl_sched_costs fbw(double f, double b, double w) { return (dl_sched_costs){f, b + w, 0, w}; }

/* The makespans against the paper's bubbles, independent of the generators: a stage's work is
 * m (F + B + W) (per chunk for ZB-V); 1F1B-split adds (p-1)(F+B) (the lecture's 1F1B, whose
 * bubble is (p-1)(F+B+W) with the whole backward, but the I hands on before its W); ZB-H1 (p-1)(F+B-W); ZB-H2 (p-1)(F+B-2W) but never below the last stage's
 * start-up (p-1) F (a flush per step: the paper's zero also overlaps steps). Integer costs: exact
 * equality. */
START_TEST(t_zero_bubble)
{
    const int p = 4, m = 8;
    const double cost[2][3] = {{1, 1, 1}, {2, 3, 1}};
    for (int k = 0; k < 2; k++) {
        double F = cost[k][0], B = cost[k][1], W = cost[k][2], work = m * (F + B + W);
        dl_sched_costs c = fbw(F, B, W);
        dl_sched *s1, *h1, *h2, *zv;
        ck_assert_int_eq(dl_sched_1f1b_split(p, m, &s1), DL_OK);
        ck_assert_int_eq(dl_sched_zb_h1(p, m, &h1), DL_OK);
        ck_assert_int_eq(dl_sched_zb_h2(p, m, &h2), DL_OK);
        ck_assert_int_eq(dl_sched_zb_v(p, m, &zv), DL_OK);
        dl_sched_sim *a = sim_of(s1, &c), *b = sim_of(h1, &c), *d = sim_of(h2, &c);
        double h2_t = (p - 1) * (F + B - 2 * W);
        ck_near(a->makespan, work + (p - 1) * (F + B), 1e-9);
        ck_near(b->makespan, work + (p - 1) * (F + B - W), 1e-9);
        ck_near(d->makespan, work + (h2_t > (p - 1) * F ? h2_t : (p - 1) * F), 1e-9);
        /* the theory figure is that bubble as a fraction of the step */
        ck_near(dl_sched_bubble_theory(h1, F, B, W), (p - 1) * (F + B - W) / b->makespan, 1e-12);
        ck_near(dl_sched_bubble_theory(s1, F, B, W), (p - 1) * (F + B) / a->makespan, 1e-12);
        dl_sched *f1;
        ck_assert_int_eq(dl_sched_1f1b(p, m, &f1), DL_OK); /* whole backward: the lecture's */
        ck_near(dl_sched_bubble_theory(f1, F, B, W), (double)(p - 1) / (m + p - 1), 1e-12);
        dl_sched_free(f1);
        /* ZB-V, F = I = W (the costs its order is made for): 2m chunks a stage; the last stage
         * starts after (p-1) F and, V's turn being on it, cannot finish before its work's end;
         * it must beat 1F1B-split of whole stages (each action two chunks) */
        dl_sched_sim *v = sim_of(zv, &c);
        if (k == 0) {
            ck_assert(v->makespan >= 2 * work + (p - 1) * F);
            ck_assert_msg(v->bubble_total < a->bubble_total / 2, "ZB-V bubble %g, 1F1B-split %g",
                          v->bubble_total, a->bubble_total);
        } else { /* unequal costs: the order found at them beats the unit-cost one, and 1F1B-split */
            dl_sched *zc;
            ck_assert_int_eq(dl_sched_zb_v_costs(p, m, &c, &zc), DL_OK);
            dl_sched_sim *vc = sim_of(zc, &c);
            ck_assert(vc->makespan >= 2 * work + (p - 1) * F);
            ck_assert_msg(vc->bubble_total < v->bubble_total && vc->bubble_total < a->bubble_total,
                          "ZB-V at its costs %g, unit order %g, 1F1B-split %g", vc->bubble_total,
                          v->bubble_total, a->bubble_total);
            for (int q = 0; q < p; q++) ck_assert_int_le(vc->peak_act[q], zc->mem_limit[q]);
            dl_sched_sim_free(vc);
            dl_sched_free(zc);
        }
        /* every schedule within its documented memory limit; 1F1B-split and ZB-H1 at 1F1B's
         * peak p on stage 0 */
        dl_sched *all[] = {s1, h1, h2, zv};
        dl_sched_sim *sims[] = {a, b, d, v};
        for (int i = 0; i < 4; i++)
            for (int q = 0; q < p; q++) {
                ck_assert_int_gt(all[i]->mem_limit[q], 0);
                ck_assert_int_le(sims[i]->peak_act[q], all[i]->mem_limit[q]);
            }
        ck_assert_int_eq(a->peak_act[0], p);
        ck_assert_int_eq(b->peak_act[0], p);
        ck_assert_int_eq(h2->mem_limit[0], 2 * p - 1);
        ck_assert_int_eq(zv->mem_limit[0], 2 * p);
        for (int i = 0; i < 4; i++) dl_sched_sim_free(sims[i]), dl_sched_free(all[i]);
    }
}
END_TEST

/* The V placement, peers across it, and the refusals: a broken placement, a memory limit, each
 * naming the offending action and printing the actions around it. */
START_TEST(t_placement)
{
    dl_sched *s;
    ck_assert_int_eq(dl_sched_zb_v(4, 8, &s), DL_OK);
    ck_assert_int_eq(s->v, 2);
    for (int q = 0; q < 4; q++) {
        ck_assert_int_eq(s->vstage[q * 2], q);
        ck_assert_int_eq(s->vstage[q * 2 + 1], 7 - q);
        int st, ch;
        ck_assert_int_eq(dl_sched_holder(s, 7 - q, &st, &ch), DL_OK);
        ck_assert(st == q && ch == 1);
    }
    int prev, pc, next, nc;
    dl_sched_peers(s, 3, 0, &prev, &pc, &next, &nc); /* virtual stage 3: the turn */
    ck_assert(prev == 2 && pc == 0 && next == 3 && nc == 1);
    dl_sched_peers(s, 0, 1, &prev, &pc, &next, &nc); /* the last virtual stage */
    ck_assert(prev == 1 && pc == 1 && next == -1);
    ck_assert_int_eq(dl_sched_holder(s, 8, &prev, &pc), DL_EINVAL);
    int bad[8] = {0, 7, 1, 6, 2, 5, 3, 3};
    ck_assert_int_eq(dl_sched_set_placement(s, bad), DL_EINVAL);
    ck_assert_msg(strstr(dl_errmsg(), "stage 3 chunk 1 holds virtual stage 3 (placed twice)"), "%s",
                  dl_errmsg());
    bad[6] = 4, bad[7] = 3;
    ck_assert_int_eq(dl_sched_set_placement(s, bad), DL_EINVAL);
    ck_assert_msg(strstr(dl_errmsg(), "pipeline order"), "%s", dl_errmsg());
    s->vstage[7] = 3; /* written past the setter: the validator refuses it */
    ck_rejects(s, "placed twice");
    s->vstage[7] = 4;
    /* the loop placement on the same actions: valid too, but a different pipeline */
    int loop[8] = {0, 4, 1, 5, 2, 6, 3, 7};
    ck_assert_int_eq(dl_sched_set_placement(s, loop), DL_OK);
    ck_assert_int_eq(dl_sched_holder(s, 4, &prev, &pc), DL_OK);
    ck_assert(prev == 0 && pc == 1);
    dl_sched_free(s);

    /* ZB-H1 with stage 0's limit one lower: its 4th forward (action 3) breaks it */
    ck_assert_int_eq(dl_sched_zb_h1(4, 8, &s), DL_OK);
    ck_assert_int_eq(dl_sched_validate(s), DL_OK);
    s->mem_limit[0] = 3;
    ck_rejects(s, "stage 0 action 3 (F3): 4 activation slots held, over the stage's memory limit 3",
               "\n  stage 0: F0 F1 F2 [F3] I0", "\n  stage 3: F0 I0");
    dl_sched_free(s);
    /* a W moved before its I: named, with the context */
    ck_assert_int_eq(dl_sched_1f1b_split(2, 2, &s), DL_OK);
    dl_sched_action t = s->act[1][1]; /* stage 1: F0 I0 W0 ... */
    s->act[1][1] = s->act[1][2], s->act[1][2] = t;
    ck_rejects(s, "stage 1 action 1 (W0): weight gradient before its input gradient",
               "stage 1: F0 [W0] I0 F1");
    dl_sched_free(s);
}
END_TEST

/* ---- torch.distributed.pipelining's CSV form ---------------------------------------------- */

static int same_sched(const dl_sched *a, const dl_sched *b)
{
    if (a->p != b->p || a->m != b->m || a->v != b->v ||
        memcmp(a->vstage, b->vstage, sizeof(int) * (size_t)a->p * a->v))
        return 0;
    for (int q = 0; q < a->p; q++)
        if (a->len[q] != b->len[q] ||
            memcmp(a->act[q], b->act[q], sizeof(dl_sched_action) * (size_t)a->len[q]))
            return 0;
    return 1;
}

static dl_sched *csv_ok(const char *text, int letters, char *note, size_t cap)
{
    dl_sched *s = NULL;
    ck_assert_msg(dl_sched_parse_csv(text, strlen(text), letters, 0, &s, note, cap) == DL_OK,
                  "%s: %s", text, dl_errmsg());
    return s;
}

#define ck_csv_refuses(text, ...)                                                                  \
    do {                                                                                           \
        dl_sched *s_ = (dl_sched *)1;                                                              \
        ck_assert_int_eq(dl_sched_parse_csv(text, strlen(text), 0, 0, &s_, NULL, 0), DL_EINVAL);   \
        ck_assert(s_ == NULL);                                                                     \
        const char *want_[] = {__VA_ARGS__};                                                       \
        for (size_t w_ = 0; w_ < sizeof want_ / sizeof want_[0]; w_++)                             \
            ck_assert_msg(strstr(dl_errmsg(), want_[w_]) != NULL, "message '%s' lacks '%s'",       \
                          dl_errmsg(), want_[w_]);                                                 \
    } while (0)

/* DualPipeV, checked without the validator's help: the V placement; on every stage each (chunk,
 * micro-batch) has one F, one I and one W, I after F and W after I; the activation slots counted
 * along each stage (F takes one, W frees it) stay within the limit 2p + 1 and reach it (so a limit
 * of 2p is refused: the negative control); then the validator passes it, and at F = I = W its
 * simulated bubble is at most ZB-H1's at the same costs per whole stage (a chunk half a stage's
 * work) and at most the DualPipe paper's (p-1)(F + 2B - W) (its F&B = F + B + W unoverlapped). */
START_TEST(t_dualpipev)
{
    const int ms[] = {0, 1, 2, 8}; /* m = 2p + these */
    for (int p = 2; p <= 4; p++)
        for (int k = 0; k < 4; k++) {
            int m = 2 * p + ms[k], cnt[4][2][64] = {{{0}}}; /* [F, I, W, -][chunk][mb] */
            dl_sched *s, *h;
            ck_assert_int_eq(dl_sched_dualpipev(p, m, &s), DL_OK);
            ck_assert_int_eq(s->v, 2);
            for (int q = 0; q < p; q++) {
                ck_assert_int_eq(s->vstage[2 * q], q);
                ck_assert_int_eq(s->vstage[2 * q + 1], 2 * p - 1 - q);
                ck_assert_int_eq(s->mem_limit[q], 2 * p + 1);
                memset(cnt, 0, sizeof cnt);
                int held = 0, peak = 0;
                for (int i = 0; i < s->len[q] - 1; i++) {
                    const dl_sched_action *a = &s->act[q][i];
                    int r = a->op == DL_SCHED_F ? 0 : a->op == DL_SCHED_I ? 1 : 2;
                    ck_assert(a->op == DL_SCHED_F || a->op == DL_SCHED_I || a->op == DL_SCHED_W);
                    ck_assert(r == 0 || cnt[r - 1][a->chunk][a->mb] == 1); /* in F, I, W order */
                    cnt[r][a->chunk][a->mb]++;
                    held += r == 0 ? 1 : r == 2 ? -1 : 0;
                    peak = held > peak ? held : peak;
                }
                ck_assert_int_eq(s->act[q][s->len[q] - 1].op, DL_SCHED_OPT);
                ck_assert_int_eq(s->len[q], 6 * m + 1);
                for (int r = 0; r < 3; r++)
                    for (int c = 0; c < 2; c++)
                        for (int j = 0; j < m; j++) ck_assert_int_eq(cnt[r][c][j], 1);
                ck_assert_int_eq(peak, 2 * p + 1);
            }
            ck_assert_int_eq(dl_sched_validate(s), DL_OK);
            dl_sched_costs c = fbw(1, 1, 1), c2 = fbw(2, 2, 2);
            ck_assert_int_eq(dl_sched_zb_h1(p, m, &h), DL_OK);
            dl_sched_sim *sv = sim_of(s, &c), *sh = sim_of(h, &c2);
            ck_assert_msg(sv->bubble_total <= sh->bubble_total + 1e-12, "p %d m %d: %g > %g", p, m,
                          sv->bubble_total, sh->bubble_total);
            double t = (p - 1) * (1 + 2 - 1.0), theory = t / (2 * m * 3 + t);
            ck_near(dl_sched_bubble_theory(s, 1, 1, 1), theory, 1e-12);
            ck_assert(sv->bubble_total <= theory + 1e-12);
            for (int q = 0; q < p; q++) ck_assert_int_eq(sv->peak_act[q], 2 * p + 1);
            dl_sched_sim_free(sv), dl_sched_sim_free(sh), dl_sched_free(h);
            for (int q = 0; q < p; q++) s->mem_limit[q] = 2 * p;
            ck_assert_int_eq(dl_sched_validate(s), DL_EINVAL);
            ck_assert_msg(strstr(dl_errmsg(), "limit") != NULL, "%s", dl_errmsg());
            dl_sched_free(s);
        }
    dl_sched *s = NULL;
    ck_assert_int_eq(dl_sched_dualpipev(3, 5, &s), DL_EINVAL);
    ck_assert_msg(strstr(dl_errmsg(), "dualpipev") && strstr(dl_errmsg(), "m >= 6"), "%s",
                  dl_errmsg());
    ck_assert_int_eq(dl_sched_dualpipev(1, 4, &s), DL_EINVAL);
    dl_sched_kind kd;
    ck_assert_int_eq(dl_sched_kind_parse("dualpipev", &kd), DL_OK);
    ck_assert_int_eq(kd, DL_SCHED_DUALPIPEV);
}
END_TEST

/* Every flush schedule written and read back is the same schedule (actions, placement); the text
 * of ZB-V p 2 starts as the form says: stage numbers are global (rank 0 holds 0 and 3). */
START_TEST(t_csv_round_trip)
{
    dl_sched *all[9];
    int n = 0;
    ck_assert_int_eq(dl_sched_gpipe(3, 4, &all[n++]), DL_OK);
    ck_assert_int_eq(dl_sched_1f1b(4, 8, &all[n++]), DL_OK);
    ck_assert_int_eq(dl_sched_interleaved(2, 4, 3, &all[n++]), DL_OK);
    ck_assert_int_eq(dl_sched_1f1b_split(4, 8, &all[n++]), DL_OK);
    ck_assert_int_eq(dl_sched_zb_h1(4, 8, &all[n++]), DL_OK);
    ck_assert_int_eq(dl_sched_zb_h2(3, 6, &all[n++]), DL_OK);
    ck_assert_int_eq(dl_sched_zb_v(4, 8, &all[n++]), DL_OK);
    ck_assert_int_eq(dl_sched_dualpipev(3, 7, &all[n++]), DL_OK);
    ck_assert_int_eq(dl_sched_zb_v(2, 2, &all[n++]), DL_OK);
    for (int i = 0; i < n; i++) {
        char *text = NULL;
        ck_assert_int_eq(dl_sched_write_csv(all[i], &text), DL_OK);
        dl_sched *back = csv_ok(text, DL_SCHED_LETTERS_AUTO, NULL, 0);
        ck_assert_msg(same_sched(all[i], back), "%s: read back differs\n%s",
                      dl_sched_kind_name(all[i]->kind), text);
        if (i == n - 1)
            ck_assert_msg(strncmp(text, "0F0,0F1,3F0,3I0", 15) == 0 &&
                              strstr(text, "\n1F0,") != NULL,
                          "%s", text);
        free(text);
        dl_sched_free(back);
        dl_sched_free(all[i]);
    }
    dl_sched *as;
    char *text = NULL;
    ck_assert_int_eq(dl_sched_async(2, 2, 0, &as), DL_OK);
    ck_assert_int_eq(dl_sched_write_csv(as, &text), DL_EINVAL);
    dl_sched_free(as);
}
END_TEST

/* The letters: newer (I, W, B full), older (B input with W, BW full), detected as described;
 * overlap cells run as their two actions; communication actions ignored with one note. */
START_TEST(t_csv_letters)
{
    char note[256];
    dl_sched *s = csv_ok("0F0,0B0\n1F0,1B0\n", 0, note, sizeof note); /* B alone: full */
    ck_assert_int_eq(s->act[1][1].op, DL_SCHED_B);
    ck_assert_int_eq(s->act[1][2].op, DL_SCHED_OPT);
    ck_assert_str_eq(note, "");
    dl_sched_free(s);
    s = csv_ok("0F0,0B0,0W0\n1F0,1B0,1W0\n", 0, NULL, 0); /* B with W, no I: the older B */
    ck_assert(s->act[0][1].op == DL_SCHED_I && s->act[0][2].op == DL_SCHED_W);
    dl_sched_free(s);
    s = csv_ok("0F0,0BW0\n1F0,1B0,1W0\n", 0, NULL, 0); /* BW: older, so B is the input part */
    ck_assert(s->act[0][1].op == DL_SCHED_B && s->act[1][1].op == DL_SCHED_I);
    dl_sched_free(s);
    /* forced newer letters: B is a whole backward, so its W repeats it */
    ck_assert_int_eq(dl_sched_parse_csv("0F0,0B0,0W0\n1F0,1B0,1W0\n", 24, DL_SCHED_LETTERS_NEW, 0,
                                        &s, NULL, 0),
                     DL_EINVAL);
    ck_assert_msg(strstr(dl_errmsg(), "row 1, cell 3 ('0W0')") &&
                      strstr(dl_errmsg(), "already runs as B"),
                  "%s", dl_errmsg());
    const char *mixed = "0F0,0BW0\n1F0,1I0,1W0\n";
    ck_assert_int_eq(dl_sched_parse_csv(mixed, strlen(mixed), 0, 0, &s, NULL, 0), DL_EINVAL);
    ck_assert_msg(strstr(dl_errmsg(), "row 1, cell 2 ('0BW0'): BW is the older letters'"), "%s",
                  dl_errmsg());
    s = csv_ok(" 0F0 ,1SEND_F0,,(0F1;0I0)OVERLAP_F_B,0W0,0I1,0W1,0REDUCE_GRAD\r\n"
               "1RECV_F0,1F0,1I0,1F1,1I1,1W0,1W1,1UNSHARD\r\n\r\n",
               0, note, sizeof note);
    ck_assert_int_eq(s->len[0], 7); /* F0 F1 I0 W0 I1 W1 OPT: the overlap's two, in order */
    ck_assert(s->act[0][1].op == DL_SCHED_F && s->act[0][1].mb == 1);
    ck_assert(s->act[0][2].op == DL_SCHED_I && s->act[0][2].mb == 0);
    ck_assert_msg(strstr(note, "4 communication actions") != NULL, "%s", note);
    dl_sched_free(s);
}
END_TEST

/* Bad files: refused with the row, the cell and the reason. */
START_TEST(t_csv_refusals)
{
    ck_csv_refuses("0F0,0X0\n1F0,1B0\n", "row 1, cell 2 ('0X0'): unknown action type");
    ck_csv_refuses("0F0,F0\n", "row 1, cell 2 ('F0'): an action starts with its stage number");
    ck_csv_refuses("0F0,0F\n", "row 1, cell 2 ('0F'): the action needs a micro-batch");
    ck_csv_refuses("0F0,0B0x\n1F0,1B0\n", "row 1, cell 2 ('0B0x'): malformed action");
    ck_csv_refuses("0F0,(0F1;0I0)\n", "row 1, cell 2", "malformed overlap");
    /* a W before its I (a B with the newer letters: I present) */
    ck_csv_refuses("0F0,0I0,0W0\n1F0,1W0,1I0\n", "row 2, cell 2 ('1W0')",
                   "weight gradient before its input gradient");
    /* a cycle: stage 0 waits for stage 1's backward, which waits for stage 0's forward 1 */
    ck_csv_refuses("0F0,0B0,0F1,0B1\n1F1,1F0,1B0,1B1\n", "deadlock", "row 1, cell 2 ('0B0')",
                   "stage 1 action 0 (F1) waits for F1 on stage 0");
    /* micro-batch 1 missing on rank 2; micro-batch 0 twice on rank 1 */
    ck_csv_refuses("0F0,0B0,0F1,0B1\n1F0,1B0\n", "never runs F1", "stage s is row s + 1");
    ck_csv_refuses("0F0,0F0,0B0\n1F0,1B0\n", "row 1, cell 2 ('0F0')", "repeats action 0");
    /* a stage on two ranks */
    ck_csv_refuses("0F0,1F0,0B0\n1F0,1B0\n", "row 2, cell 1 ('1F0'): stage 1 is on two ranks");
    /* a memory limit broken: 1F1B-split's stage 0 holds 2 slots, the limit 1 */
    dl_sched *s = (dl_sched *)1;
    const char *f1 = "0F0,0F1,0I0,0W0,0I1,0W1\n1F0,1I0,1W0,1F1,1I1,1W1\n";
    ck_assert_int_eq(dl_sched_parse_csv(f1, strlen(f1), 0, 2, &s, NULL, 0), DL_OK);
    dl_sched_free(s);
    ck_assert_int_eq(dl_sched_parse_csv(f1, strlen(f1), 0, 1, &s, NULL, 0), DL_EINVAL);
    ck_assert_msg(strstr(dl_errmsg(), "row 1, cell 2 ('0F1'): stage 0 action 1 (F1): 2 activation "
                                      "slots held, over the stage's memory limit 1") != NULL,
                  "%s", dl_errmsg());
    ck_csv_refuses("", "no rows");
    ck_csv_refuses("0F0,0B0\n\n1F0,1B0\n", "row 2 is empty");
}
END_TEST

START_TEST(t_errors)
{
    dl_sched *s = (dl_sched *)1;
    ck_assert_int_eq(dl_sched_interleaved(4, 6, 2, &s), DL_EINVAL);
    ck_assert(s == NULL);
    ck_assert_msg(strstr(dl_errmsg(), "m = 6") && strstr(dl_errmsg(), "multiple") &&
                      strstr(dl_errmsg(), "p = 4"),
                  "%s", dl_errmsg());
    ck_assert_int_eq(dl_sched_gpipe(0, 4, &s), DL_EINVAL);
    ck_assert_msg(strstr(dl_errmsg(), "p = 0"), "%s", dl_errmsg());
    ck_assert_int_eq(dl_sched_1f1b(4, 0, &s), DL_EINVAL);
    ck_assert_msg(strstr(dl_errmsg(), "m = 0"), "%s", dl_errmsg());
    ck_assert_int_eq(dl_sched_interleaved(4, 4, 0, &s), DL_EINVAL);
    ck_assert_int_eq(dl_sched_terapipe(4, 2, 0, &s), DL_EINVAL);
    ck_assert_int_eq(dl_sched_async(4, 4, 0, NULL), DL_EINVAL);

    dl_sched_kind k;
    ck_assert_int_eq(dl_sched_kind_parse("1F1B", &k), DL_OK);
    ck_assert_int_eq(k, DL_SCHED_1F1B);
    ck_assert_int_eq(dl_sched_kind_parse("pipedream", &k), DL_OK);
    ck_assert_int_eq(k, DL_SCHED_ASYNC);
    ck_assert_str_eq(dl_sched_kind_name(DL_SCHED_INTERLEAVED), "interleaved");
    ck_assert_int_eq(dl_sched_kind_parse("zigzag", &k), DL_EINVAL);
    ck_assert_msg(strstr(dl_errmsg(), "zigzag"), "%s", dl_errmsg());

    /* costs: negative refused; fractional times cannot be drawn on a unit grid */
    ck_assert_int_eq(dl_sched_gpipe(2, 2, &s), DL_OK);
    dl_sched_costs c = {-1, 2, 0, -1};
    dl_sched_sim *sim = NULL;
    ck_assert_int_eq(dl_sched_simulate(s, &c, &sim), DL_EINVAL);
    c = (dl_sched_costs){0.5, 2, 0, -1};
    sim = sim_of(s, &c);
    char *g = NULL;
    ck_assert_int_eq(dl_sched_grid(s, sim, &g), DL_EINVAL);
    ck_assert_msg(strstr(dl_errmsg(), "whole"), "%s", dl_errmsg());
    dl_sched_sim_free(sim);
    /* an optimizer step of non-zero cost shows as '*' */
    c = (dl_sched_costs){1, 2, 1, -1};
    sim = sim_of(s, &c);
    ck_assert_int_eq(dl_sched_grid(s, sim, &g), DL_OK);
    ck_assert_str_eq(g, "GPU 1  01···aabb*\nGPU 2  ·01aabb*··\n");
    free(g);
    dl_sched_sim_free(sim);
    dl_sched_free(s);
}
END_TEST

/* ---- property sweep ----------------------------------------------------------------------- */

/* Counts each (op, j, c) on every stage independently of the library's validator. */
static void check_complete(const dl_sched *s, const char *what)
{
    int n = s->m * s->v;
    int *cnt = calloc((size_t)2 * n, sizeof *cnt);
    for (int q = 0; q < s->p; q++) {
        memset(cnt, 0, (size_t)2 * n * sizeof *cnt);
        for (int i = 0; i < s->len[q]; i++) {
            const dl_sched_action *x = &s->act[q][i];
            if (x->op == DL_SCHED_OPT)
                continue;
            ck_assert_msg(x->mb >= 0 && x->mb < s->m && x->chunk >= 0 && x->chunk < s->v, "%s",
                          what);
            cnt[x->op * n + x->mb * s->v + x->chunk]++;
        }
        for (int k = 0; k < 2 * n; k++)
            ck_assert_msg(cnt[k] == 1, "%s: stage %d: %s of mb %d chunk %d appears %d times", what,
                          q, k < n ? "F" : "B", (k % n) / s->v, k % s->v, cnt[k]);
    }
    free(cnt);
}

START_TEST(t_property)
{
    /* Cost conventions under which the simulated bubble equals (p-1)/(m+p-1) exactly: the same
     * forward cost and the same backward cost on every stage (any ratio), optimizer steps free,
     * communication free. Checked for three ratios. */
    dl_sched_costs conv[] = {{1, 2, 0, -1}, {1, 1, 0, -1}, {2, 1, 0, -1}};
    int nsched = 0;
    for (int p = 1; p <= 8; p++) {
        for (int m = 1; m <= 16; m++) {
            dl_sched *list[8];
            int n = 0;
            char what[64];
            ck_assert_int_eq(dl_sched_gpipe(p, m, &list[n++]), DL_OK);
            ck_assert_int_eq(dl_sched_1f1b(p, m, &list[n++]), DL_OK);
            ck_assert_int_eq(dl_sched_async(p, m, 0, &list[n++]), DL_OK);
            ck_assert_int_eq(dl_sched_async(p, m, 1, &list[n++]), DL_OK);
            if (m == 1)
                ck_assert_int_eq(dl_sched_naive(p, &list[n++]), DL_OK);
            for (int v = 1; v <= 3; v++) {
                dl_sched *s = NULL;
                int st = dl_sched_interleaved(p, m, v, &s);
                ck_assert_int_eq(st, m % p == 0 ? DL_OK : DL_EINVAL);
                if (st == DL_OK)
                    list[n++] = s;
            }
            for (int i = 0; i < n; i++) {
                dl_sched *s = list[i];
                snprintf(what, sizeof what, "%s p=%d m=%d v=%d", dl_sched_kind_name(s->kind), p, m,
                         s->v);
                ck_assert_msg(dl_sched_validate(s) == DL_OK, "%s: %s", what, dl_errmsg());
                check_complete(s, what);
                dl_sched_sim *sim = sim_of(s, NULL);
                for (int q = 0; q < p; q++) {
                    if (s->kind == DL_SCHED_GPIPE)
                        ck_assert_int_eq(sim->peak_act[q], m);
                    if (s->kind == DL_SCHED_1F1B || s->kind == DL_SCHED_ASYNC)
                        ck_assert_int_eq(sim->peak_act[q], p - q < m ? p - q : m);
                }
                /* interleaving: the formula (p-1)/(vm+p-1) with per-chunk costs */
                ck_near(sim->bubble_total, dl_plan_bubble(p, m, s->v), 1e-12);
                dl_sched_sim_free(sim);
                if (s->kind == DL_SCHED_GPIPE || s->kind == DL_SCHED_1F1B)
                    for (size_t c = 0; c < sizeof conv / sizeof conv[0]; c++) {
                        sim = sim_of(s, &conv[c]);
                        ck_assert_msg(fabs(sim->bubble_total - (double)(p - 1) / (m + p - 1)) <
                                          1e-12,
                                      "%s costs %g/%g: bubble %.15g", what, conv[c].f, conv[c].b,
                                      sim->bubble_total);
                        dl_sched_sim_free(sim);
                    }
                if (s->kind == DL_SCHED_ASYNC && m >= p) {
                    dl_sched_versions *v;
                    ck_assert_int_eq(dl_sched_versions_get(s, &v), DL_OK);
                    for (int q = 0; q < p; q++) {
                        ck_assert_int_eq(v->max_gap[q], p - q - 1);
                        for (int j = 0; j < m && s->stash; j++)
                            ck_assert_int_eq(v->bwd[q * m + j], v->fwd[q * m + j]);
                    }
                    dl_sched_versions_free(v);
                }
                dl_sched_free(s);
                nsched++;
            }
        }
    }
    ck_assert_int_ge(nsched, 8 * 16 * 4);
}
END_TEST

static Suite *sched_suite(void)
{
    Suite *s = suite_create("sched");
    TCase *tc = tcase_create("sched");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, t_lecture_grids);
    tcase_add_test(tc, t_orders);
    tcase_add_test(tc, t_bubbles);
    tcase_add_test(tc, t_activations);
    tcase_add_test(tc, t_versions);
    tcase_add_test(tc, t_terapipe);
    tcase_add_test(tc, t_partition);
    tcase_add_test(tc, t_validator);
    tcase_add_test(tc, t_split_backward);
    tcase_add_test(tc, t_zero_bubble);
    tcase_add_test(tc, t_dualpipev);
    tcase_add_test(tc, t_placement);
    tcase_add_test(tc, t_csv_round_trip);
    tcase_add_test(tc, t_csv_letters);
    tcase_add_test(tc, t_csv_refusals);
    tcase_add_test(tc, t_errors);
    tcase_add_test(tc, t_property);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(sched_suite());
    srunner_run_all(sr, CK_ENV);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
