/* Per-rank traces (lib/io/trace.c) against independent references: the bubble and breakdown of
 * hand-built timelines computed by hand and, for random timelines, by a 1-ns bitmap; the grid of a
 * hand-built 2-rank timeline character for character, and grids of simulated schedules turned into
 * "measured" events equal to dl_sched_grid's text (measured and simulated output agree); Chrome
 * JSON structure (and python3's json parser when present); drops when full; 8 recording threads
 * (run under ThreadSanitizer by the sanitizer builds). */
#define _GNU_SOURCE
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "../testutil.h"
#include "distlab/trace.h"

#define ck_near(x, want, tol)                                                                      \
    ck_assert_msg(fabs((double)(x) - (double)(want)) <= (tol), "%s = %.12g, want %.12g +- %g", #x, \
                  (double)(x), (double)(want), (double)(tol))

static dl_trace *mk(int n, size_t cap)
{
    dl_trace *t = NULL;
    ck_assert_msg(dl_trace_create(n, cap, &t) == DL_OK, "create: %s", dl_errmsg());
    return t;
}

/* ---- bubble and breakdown by hand ---------------------------------------------------------- */

START_TEST(t_bubble_hand)
{
    dl_trace *t = mk(2, 64);
    /* rank 0, step 3 over [1000, 11000) */
    dl_trace_add(t, 0, DL_TR_STEP, 3, -1, 0, 1000, 11000);
    dl_trace_add(t, 0, DL_TR_FWD, 3, 0, 0, 0, 2000);      /* starts before the step: 1000 inside */
    dl_trace_add(t, 0, DL_TR_FWD, 3, 1, 0, 3000, 5000);   /* overlaps the next backward: */
    dl_trace_add(t, 0, DL_TR_BWD, 3, 0, 0, 4000, 7000);   /* union [3000, 7000) = 4000 */
    dl_trace_add(t, 0, DL_TR_SEND, 3, 1, 0, 7000, 9000);  /* not compute */
    dl_trace_add(t, 0, DL_TR_COMM, 3, -1, 0, 8000, 8500); /* comm union [8000, 9000) */
    dl_trace_add(t, 0, DL_TR_COMM, 3, -1, 0, 8200, 9000);
    dl_trace_add(t, 0, DL_TR_BWD, 3, 1, 0, 10000, 12000); /* ends after the step: 1000 inside */
    dl_trace_add(t, 0, DL_TR_FWD, 4, 0, 0, 12000, 13000); /* outside */
    dl_trace_add(t, 1, DL_TR_FWD, 3, 0, 0, 1000, 11000);  /* another rank's */
    /* busy = 1000 + 4000 + 1000 = 6000 of 10000 */
    double bub = -1, busy = -1, wall = -1;
    ck_assert_int_eq(dl_trace_bubble(t, 0, 3, &bub, &busy, &wall), DL_OK);
    ck_assert(busy == 6000.0);
    ck_assert(wall == 10000.0);
    ck_near(bub, 0.4, 1e-15);
    ck_assert_int_eq(dl_trace_bubble(t, 0, 3, NULL, NULL, NULL), DL_OK);

    double ns[DL_TR_NKINDS];
    ck_assert_int_eq(dl_trace_breakdown(t, 0, 3, ns), DL_OK);
    ck_assert(ns[DL_TR_FWD] == 3000.0); /* 1000 + 2000 */
    ck_assert(ns[DL_TR_BWD] == 4000.0); /* 3000 + 1000 */
    ck_assert(ns[DL_TR_SEND] == 2000.0);
    ck_assert(ns[DL_TR_RECV_WAIT] == 0.0);
    ck_assert(ns[DL_TR_OPT] == 0.0);
    ck_assert(ns[DL_TR_COMM] == 1000.0);
    ck_assert(ns[DL_TR_STEP] == 10000.0);
    ck_assert(ns[DL_TR_OTHER] == 0.0);

    /* no step event: rank 1, or step 4 */
    ck_assert_int_eq(dl_trace_bubble(t, 1, 3, &bub, NULL, NULL), DL_EINVAL);
    ck_assert_msg(strstr(dl_errmsg(), "rank 1") && strstr(dl_errmsg(), "step 3"), "%s",
                  dl_errmsg());
    ck_assert_int_eq(dl_trace_bubble(t, 0, 4, &bub, NULL, NULL), DL_EINVAL);
    ck_assert_int_eq(dl_trace_breakdown(t, 0, 4, ns), DL_EINVAL);
    ck_assert_int_eq(dl_trace_bubble(t, 2, 3, &bub, NULL, NULL), DL_EINVAL);
    ck_assert_int_eq(dl_trace_bubble(NULL, 0, 3, &bub, NULL, NULL), DL_EINVAL);
    dl_trace_destroy(t);
}
END_TEST

/* Random timelines: the union against a bitmap of 1-ns cells. */
START_TEST(t_bubble_random)
{
    enum { W = 4000 };
    static unsigned char bits[DL_TR_NKINDS][W], comp[W];
    int rounds = DL_TEST_SMALL ? 20 : 200;
    for (int round = 0; round < rounds; round++) {
        dl_trace *t = mk(1, 256);
        uint64_t base = 1000000 + (uint64_t)round;
        uint64_t s0 = 500 + tu_rand_u64(7, round, 0) % 500,
                 s1 = s0 + 1000 + tu_rand_u64(7, round, 1) % 2000;
        dl_trace_add(t, 0, DL_TR_STEP, round, -1, 0, base + s0, base + s1);
        memset(bits, 0, sizeof bits);
        memset(comp, 0, sizeof comp);
        int nev = 1 + (int)(tu_rand_u64(7, round, 2) % 60);
        for (int i = 0; i < nev; i++) {
            int kind = (int)(tu_rand_u64(7, round, 10 + 3 * (uint64_t)i) % DL_TR_NKINDS);
            if (kind == DL_TR_STEP)
                kind = DL_TR_OTHER;
            uint64_t a = tu_rand_u64(7, round, 11 + 3 * (uint64_t)i) % W;
            uint64_t len = tu_rand_u64(7, round, 12 + 3 * (uint64_t)i) % 700;
            uint64_t b = a + len > W ? W : a + len;
            dl_trace_add(t, 0, kind, round, i, 0, base + a, base + b);
            for (uint64_t x = a; x < b; x++) {
                if (x < s0 || x >= s1)
                    continue;
                bits[kind][x] = 1;
                if (kind == DL_TR_FWD || kind == DL_TR_BWD || kind == DL_TR_WGT)
                    comp[x] = 1;
            }
        }
        double want_busy = 0, want[DL_TR_NKINDS] = {0};
        for (int x = 0; x < W; x++) {
            want_busy += comp[x];
            for (int k = 0; k < DL_TR_NKINDS; k++) want[k] += bits[k][x];
        }
        want[DL_TR_STEP] = (double)(s1 - s0);
        double bub, busy, wall, ns[DL_TR_NKINDS];
        ck_assert_int_eq(dl_trace_bubble(t, 0, round, &bub, &busy, &wall), DL_OK);
        ck_assert_msg(busy == want_busy, "round %d: busy %g, want %g", round, busy, want_busy);
        ck_assert(wall == (double)(s1 - s0));
        ck_near(bub, 1.0 - want_busy / (double)(s1 - s0), 1e-15);
        ck_assert_int_eq(dl_trace_breakdown(t, 0, round, ns), DL_OK);
        for (int k = 0; k < DL_TR_NKINDS; k++)
            ck_assert_msg(ns[k] == want[k], "round %d kind %d: %g, want %g", round, k, ns[k],
                          want[k]);
        dl_trace_destroy(t);
    }
}
END_TEST

/* ---- grids ----------------------------------------------------------------------------------- */

START_TEST(t_grid_hand)
{
    dl_trace *t = mk(2, 64);
    /* unit 10 ns; the window is [100, 200) (rank 0's step), cells 0..9 */
    dl_trace_add(t, 0, DL_TR_STEP, 0, -1, 0, 100, 200);
    dl_trace_add(t, 0, DL_TR_FWD, 0, 0, 0, 100, 130); /* cells 0-2 */
    dl_trace_add(t, 0, DL_TR_BWD, 0, 0, 0, 150,
                 185); /* cells 5-7, and half of 8: ties idle, wins */
    dl_trace_add(t, 1, DL_TR_STEP, 0, -1, 0, 100, 190);
    dl_trace_add(t, 1, DL_TR_FWD, 0, 1, 0, 104, 116);       /* 6 of cell 0, 6 of cell 1 */
    dl_trace_add(t, 1, DL_TR_FWD, 0, 2, 0, 121, 124);       /* 3 of cell 2: idle covers most */
    dl_trace_add(t, 1, DL_TR_COMM, 0, -1, 0, 130, 160);     /* cells 3-5 */
    dl_trace_add(t, 1, DL_TR_OPT, 0, -1, 0, 160, 166);      /* 6 of cell 6 */
    dl_trace_add(t, 1, DL_TR_SEND, 0, 1, 0, 166, 170);      /* not drawn */
    dl_trace_add(t, 1, DL_TR_RECV_WAIT, 0, 1, 0, 170, 190); /* not drawn: waiting is idle */
    dl_trace_add(t, 1, DL_TR_BWD, 0, 3, 0, 195, 200);       /* cell 9: a tie with F3, */
    dl_trace_add(t, 1, DL_TR_FWD, 0, 3, 0, 190, 195);       /* which the lower kind wins */
    dl_trace_add(t, 1, DL_TR_FWD, 1, 4, 0, 200, 230);       /* after the window */
    char *g = NULL;
    ck_assert_msg(dl_trace_grid(t, 0, 10, &g) == DL_OK, "grid: %s", dl_errmsg());
    const char *want = "GPU 1  000\xC2\xB7\xC2\xB7"
                       "aaaa\xC2\xB7\n"
                       "GPU 2  11\xC2\xB7===*\xC2\xB7\xC2\xB7"
                       "3\n";
    ck_assert_msg(strcmp(g, want) == 0, "got\n%s\nwant\n%s", g, want);
    free(g);

    /* a unit of 30 ns: 4 cells ([100,130) [130,160) [160,190) [190,200)) */
    ck_assert_int_eq(dl_trace_grid(t, 0, 30, &g), DL_OK);
    want = "GPU 1  0\xC2\xB7"
           "a\xC2\xB7\n" /* [130,160): B 10 of 30; [160,190): B 25 of 30 */
           "GPU 2  \xC2\xB7=\xC2\xB7"
           "3\n"; /* [100,130): F1 12 + F2 3 = 15 covered, best 12 < idle 15 */
    ck_assert_msg(strcmp(g, want) == 0, "got\n%s\nwant\n%s", g, want);
    free(g);

    ck_assert_int_eq(dl_trace_grid(t, 1, 10, &g), DL_EINVAL); /* no step 1 */
    ck_assert_ptr_null(g);
    ck_assert_int_eq(dl_trace_grid(t, 0, 0, &g), DL_EINVAL);
    ck_assert_int_eq(dl_trace_grid(t, 0, 1, &g), DL_OK); /* 100 cells */
    free(g);
    dl_trace_add(t, 0, DL_TR_STEP, 2, -1, 0, 0, 2000000000ull);
    ck_assert_int_eq(dl_trace_grid(t, 2, 1, &g), DL_EINVAL); /* 2e9 cells */
    ck_assert_msg(strstr(dl_errmsg(), "larger unit") != NULL, "%s", dl_errmsg());
    dl_trace_destroy(t);
}
END_TEST

/* Which actions a grid hides (merged cells), counted by hand on t_grid_hand's events, and the
 * per-stage list that shows every one in start order. */
START_TEST(t_grid_hidden)
{
    dl_trace *t = mk(2, 64);
    dl_trace_add(t, 0, DL_TR_STEP, 0, -1, 0, 100, 200);
    dl_trace_add(t, 0, DL_TR_FWD, 0, 0, 0, 100, 130);
    dl_trace_add(t, 0, DL_TR_BWD, 0, 0, 0, 150, 185);
    dl_trace_add(t, 1, DL_TR_STEP, 0, -1, 0, 100, 190);
    dl_trace_add(t, 1, DL_TR_FWD, 0, 1, 0, 104, 116);
    dl_trace_add(t, 1, DL_TR_FWD, 0, 2, 0, 121, 124);
    dl_trace_add(t, 1, DL_TR_COMM, 0, -1, 0, 130, 160);
    dl_trace_add(t, 1, DL_TR_OPT, 0, -1, 0, 160, 166);
    dl_trace_add(t, 1, DL_TR_BWD, 0, 3, 0, 195, 200);
    dl_trace_add(t, 1, DL_TR_FWD, 0, 3, 0, 190, 195);
    dl_trace_add(t, 1, DL_TR_FWD, 1, 4, 0, 200, 230); /* step 1: never counted for step 0 */
    char *g = NULL;
    int hidden = -1;
    /* unit 10: F2 (idle covers most of cell 2) and B3 (loses cell 9 to F3) */
    ck_assert_int_eq(dl_trace_grid_hidden(t, 0, 10, &g, &hidden), DL_OK);
    ck_assert_int_eq(hidden, 2);
    free(g);
    /* unit 30: also F1 (cell 0: idle 18 > 12) and the optimizer step (6 of 30); the collective
     * is not an action */
    ck_assert_int_eq(dl_trace_grid_hidden(t, 0, 30, &g, &hidden), DL_OK);
    ck_assert_int_eq(hidden, 4);
    free(g);
    /* negative control: 1 ns cells hide nothing */
    ck_assert_int_eq(dl_trace_grid_hidden(t, 0, 1, &g, &hidden), DL_OK);
    ck_assert_int_eq(hidden, 0);
    free(g);
    ck_assert_int_eq(dl_trace_actions(t, 0, &g), DL_OK);
    ck_assert_msg(strcmp(g, "GPU 1  0 a\nGPU 2  1 2 * 3 d\n") == 0, "got\n%s", g);
    free(g);
    ck_assert_int_eq(dl_trace_actions(t, 1, &g), DL_OK);
    ck_assert_msg(strcmp(g, "GPU 1 \nGPU 2  4\n") == 0, "got\n%s", g);
    free(g);
    ck_assert_int_eq(dl_trace_actions(t, 5, &g), DL_EINVAL);
    ck_assert_ptr_null(g);
    dl_trace_destroy(t);
}
END_TEST

/* A simulated schedule as measured events (1 time unit = 1 ms from an arbitrary origin): the
 * trace's grid must be dl_sched_grid's text, and each rank's bubble the simulator's. */
static void check_against_sched(dl_sched *s, const char *what)
{
    dl_sched_sim *sim = NULL;
    ck_assert_msg(dl_sched_simulate(s, NULL, &sim) == DL_OK, "%s: %s", what, dl_errmsg());
    const uint64_t base = 123456789000ull, ms = 1000000ull;
    dl_trace *t = mk(s->p, 1024);
    dl_trace_set_chunks(t, s->v);
    for (int q = 0; q < s->p; q++) {
        dl_trace_add(t, q, DL_TR_STEP, 7, -1, -1, base,
                     base + (uint64_t)llround(sim->makespan) * ms);
        for (int i = 0; i < s->len[q]; i++) {
            const dl_sched_action *a = &s->act[q][i];
            int kind = a->op == DL_SCHED_F   ? DL_TR_FWD
                       : a->op == DL_SCHED_B ? DL_TR_BWD
                                             : DL_TR_OPT;
            dl_trace_add(t, q, kind, 7, a->mb, a->chunk,
                         base + (uint64_t)llround(sim->start[q][i]) * ms,
                         base + (uint64_t)llround(sim->end[q][i]) * ms);
        }
    }
    char *want = NULL, *got = NULL;
    ck_assert_int_eq(dl_sched_grid(s, sim, &want), DL_OK);
    ck_assert_msg(dl_trace_grid(t, 7, ms, &got) == DL_OK, "%s: %s", what, dl_errmsg());
    ck_assert_msg(strcmp(got, want) == 0, "%s: trace grid\n%s\nsched grid\n%s", what, got, want);
    double sum_busy = 0;
    for (int q = 0; q < s->p; q++) {
        double bub, busy, wall;
        ck_assert_int_eq(dl_trace_bubble(t, q, 7, &bub, &busy, &wall), DL_OK);
        ck_near(bub, sim->bubble[q], 1e-12);
        ck_near(wall, sim->makespan * 1e6, 0.5);
        sum_busy += busy;
    }
    ck_near(1.0 - sum_busy / (s->p * sim->makespan * 1e6), sim->bubble_total, 1e-12);
    free(want);
    free(got);
    dl_trace_destroy(t);
    dl_sched_sim_free(sim);
    dl_sched_free(s);
}

START_TEST(t_grid_vs_sched)
{
    dl_sched *s;
    ck_assert_int_eq(dl_sched_gpipe(4, 4, &s), DL_OK);
    check_against_sched(s, "gpipe p=4 m=4");
    ck_assert_int_eq(dl_sched_1f1b(4, 4, &s), DL_OK);
    check_against_sched(s, "1f1b p=4 m=4");
    ck_assert_int_eq(dl_sched_1f1b(4, 8, &s), DL_OK);
    check_against_sched(s, "1f1b p=4 m=8");
    ck_assert_int_eq(dl_sched_naive(4, &s), DL_OK);
    check_against_sched(s, "naive p=4");
    ck_assert_int_eq(dl_sched_interleaved(2, 4, 2, &s), DL_OK);
    check_against_sched(s, "interleaved p=2 m=4 v=2");

    /* and the lecture's 1F1B text itself (tests/unit/parallel/test_sched.c checks sched against it) */
    ck_assert_int_eq(dl_sched_1f1b(4, 8, &s), DL_OK);
    dl_sched_sim *sim = NULL;
    ck_assert_int_eq(dl_sched_simulate(s, NULL, &sim), DL_OK);
    dl_trace *t = mk(4, 64);
    for (int q = 0; q < 4; q++) {
        dl_trace_add(t, q, DL_TR_STEP, 0, -1, -1, 0, (uint64_t)llround(sim->makespan) * 1000);
        for (int i = 0; i < s->len[q]; i++)
            dl_trace_add(t, q, s->act[q][i].op == DL_SCHED_F ? DL_TR_FWD : DL_TR_BWD, 0,
                         s->act[q][i].mb, 0, (uint64_t)llround(sim->start[q][i]) * 1000,
                         (uint64_t)llround(sim->end[q][i]) * 1000);
    }
    char *g = NULL;
    ck_assert_int_eq(dl_trace_grid(t, 0, 1000, &g), DL_OK);
    ck_assert_str_eq(g, "GPU 1  0123······aa4bb5cc6dd7ee·ff·gg·hh\n"
                        "GPU 2  ·012····aa3bb4cc5dd6ee7ff·gg·hh··\n"
                        "GPU 3  ··01··aa2bb3cc4dd5ee6ff7gg·hh····\n"
                        "GPU 4  ···0aa1bb2cc3dd4ee5ff6gg7hh······\n");
    free(g);
    dl_trace_destroy(t);
    dl_sched_sim_free(sim);
    dl_sched_free(s);
}
END_TEST

/* ---- Chrome JSON ----------------------------------------------------------------------------- */

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    if (b)
        b[n] = 0;
    fclose(f);
    return b;
}

static int count_of(const char *s, const char *needle)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)) != NULL; p += strlen(needle)) n++;
    return n;
}

/* Brackets and braces balance outside strings, and never go negative. */
static int balanced(const char *s)
{
    int sq = 0, cu = 0, in = 0;
    for (const char *p = s; *p; p++) {
        if (in) {
            if (*p == '\\' && p[1])
                p++;
            else if (*p == '"')
                in = 0;
            continue;
        }
        if (*p == '"')
            in = 1;
        else if (*p == '[')
            sq++;
        else if (*p == ']')
            sq--;
        else if (*p == '{')
            cu++;
        else if (*p == '}')
            cu--;
        if (sq < 0 || cu < 0)
            return 0;
    }
    return sq == 0 && cu == 0 && !in;
}

START_TEST(t_chrome)
{
    char dir[] = "/tmp/dl_trace_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/t.json", dir);
    dl_trace *t = mk(3, 64);
    const uint64_t base = 5000000000ull;
    dl_trace_add(t, 0, DL_TR_STEP, 1, -1, -1, base, base + 9000000);
    dl_trace_add(t, 0, DL_TR_FWD, 1, 3, 0, base + 1234567,
                 base + 2234568); /* ts 1234.567 dur 1000.001 */
    dl_trace_add(t, 0, DL_TR_BWD, 1, 3, 0, base + 3000000, base + 5000000);
    dl_trace_add(t, 1, DL_TR_FWD, 1, 2, 1, base + 10, base + 20); /* chunk 1: "F2.1" */
    dl_trace_add(t, 1, DL_TR_SEND, 1, 2, 1, base + 20, base + 21);
    dl_trace_add(t, 1, DL_TR_RECV_WAIT, 1, 2, 1, base + 21, base + 30);
    dl_trace_add(t, 2, DL_TR_OPT, 1, -1, -1, base + 40, base + 50);
    dl_trace_add(t, 2, DL_TR_COMM, 1, -1, -1, base + 50, base + 60);
    dl_trace_add(t, 2, DL_TR_OTHER, 1, -1, -1, base + 60, base + 70);
    size_t nev = 9;
    const char *names[3] = {"stage 0 \"first\"", NULL, "stage 2"};
    ck_assert_msg(dl_trace_write_chrome(t, path, names) == DL_OK, "%s", dl_errmsg());
    char *j = slurp(path);
    ck_assert_ptr_nonnull(j);
    ck_assert_msg(balanced(j), "unbalanced:\n%s", j);
    ck_assert_ptr_nonnull(strstr(j, "\"traceEvents\":["));
    ck_assert_int_eq(count_of(j, "\"ph\":\"X\""), (int)nev);
    ck_assert_int_eq(count_of(j, "\"thread_name\""), 3);
    ck_assert_ptr_nonnull(
        strstr(j, "\"name\":\"F3\",\"cat\":\"fwd\",\"ph\":\"X\",\"ts\":1234.567,\"dur\":1000.001,"
                  "\"pid\":0,\"tid\":0,\"args\":{\"step\":1,\"mb\":3,\"chunk\":0}}"));
    ck_assert_ptr_nonnull(strstr(j, "\"name\":\"B3\""));
    ck_assert_ptr_nonnull(strstr(j, "\"name\":\"F2.1\""));
    ck_assert_ptr_nonnull(
        strstr(j, "\"name\":\"step\",\"cat\":\"step\",\"ph\":\"X\",\"ts\":0.000,\"dur\":9000.000"));
    ck_assert_ptr_nonnull(strstr(j, "\"name\":\"send\""));
    ck_assert_ptr_nonnull(strstr(j, "\"name\":\"recv-wait\""));
    ck_assert_ptr_nonnull(strstr(j, "\"name\":\"opt\""));
    ck_assert_ptr_nonnull(strstr(j, "\"name\":\"comm\""));
    ck_assert_ptr_nonnull(strstr(j, "\"args\":{\"name\":\"stage 0 \\\"first\\\"\"}"));
    ck_assert_ptr_nonnull(strstr(j, "\"args\":{\"name\":\"rank 1\"}"));
    ck_assert_ptr_nonnull(strstr(j, "\"args\":{\"name\":\"stage 2\"}"));
    free(j);

    /* with v > 1 every forward and backward carries its chunk */
    dl_trace_set_chunks(t, 2);
    ck_assert_int_eq(dl_trace_write_chrome(t, path, NULL), DL_OK);
    j = slurp(path);
    ck_assert_ptr_nonnull(strstr(j, "\"name\":\"F3.0\""));
    ck_assert_ptr_nonnull(strstr(j, "\"name\":\"B3.0\""));
    ck_assert_ptr_null(strstr(j, "\"name\":\"F3\""));
    free(j);

    /* python3's parser, when there is one */
    if (system("command -v python3 >/dev/null 2>&1") == 0) {
        char cmd[600];
        snprintf(cmd, sizeof cmd,
                 "python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); "
                 "x=[e for e in d[\"traceEvents\"] if e[\"ph\"]==\"X\"]; "
                 "assert len(x)==%zu, len(x); assert all(e[\"dur\"]>=0 and e[\"pid\"]==0 for e in "
                 "x); "
                 "assert x[1][\"ts\"]==1234.567' '%s'",
                 nev, path);
        ck_assert_msg(system(cmd) == 0, "python3 json check failed on %s", path);
    }
    /* only the file remains: the temporary was renamed */
    char ls[400];
    snprintf(ls, sizeof ls, "test $(ls -A '%s' | wc -l) -eq 1", dir);
    ck_assert_int_eq(system(ls), 0);
    unlink(path);
    rmdir(dir);

    /* a clear error naming the path */
    ck_assert_int_eq(dl_trace_write_chrome(t, "/nonexistent-dir-dl/x.json", NULL), DL_ESYS);
    ck_assert_msg(strstr(dl_errmsg(), "/nonexistent-dir-dl/x.json") != NULL, "%s", dl_errmsg());
    ck_assert_int_eq(dl_trace_write_chrome(NULL, path, NULL), DL_EINVAL);
    dl_trace_destroy(t);
}
END_TEST

/* ---- capacity, clear, errors ------------------------------------------------------------------ */

START_TEST(t_dropped)
{
    dl_trace *t = mk(2, 5);
    ck_assert_int_eq(dl_trace_nranks(t), 2);
    ck_assert_uint_eq(dl_trace_capacity(t), 5);
    for (int i = 0; i < 8; i++)
        dl_trace_add(t, 1, DL_TR_FWD, 0, i, 0, (uint64_t)i, (uint64_t)i + 1);
    ck_assert_uint_eq(dl_trace_count(t, 1), 5);
    ck_assert_uint_eq(dl_trace_dropped(t, 1), 3);
    ck_assert_uint_eq(dl_trace_count(t, 0), 0);
    ck_assert_uint_eq(dl_trace_dropped(t, 0), 0);
    const dl_trace_event *e = dl_trace_events(t, 1);
    for (int i = 0; i < 5; i++) {
        ck_assert_int_eq(e[i].mb, i);
        ck_assert_uint_eq(e[i].t0, (uint64_t)i);
        ck_assert_int_eq(e[i].kind, DL_TR_FWD);
    }
    /* ignored: a NULL trace, ranks out of range */
    dl_trace_add(NULL, 0, DL_TR_FWD, 0, 0, 0, 0, 1);
    dl_trace_add(t, -1, DL_TR_FWD, 0, 0, 0, 0, 1);
    dl_trace_add(t, 2, DL_TR_FWD, 0, 0, 0, 0, 1);
    ck_assert_uint_eq(dl_trace_count(t, 0), 0);
    ck_assert_uint_eq(dl_trace_count(t, 2), 0);
    ck_assert_ptr_null(dl_trace_events(t, 2));
    ck_assert_uint_eq(dl_trace_count(NULL, 0), 0);
    dl_trace_clear(t);
    ck_assert_uint_eq(dl_trace_count(t, 1), 0);
    ck_assert_uint_eq(dl_trace_dropped(t, 1), 0);
    dl_trace_add(t, 1, DL_TR_BWD, 0, 9, 0, 1, 2);
    ck_assert_uint_eq(dl_trace_count(t, 1), 1);
    ck_assert_int_eq(dl_trace_events(t, 1)[0].mb, 9);
    /* the region helpers */
    uint64_t t0 = dl_trace_begin(t);
    ck_assert(t0 > 0);
    dl_trace_end(t, 0, DL_TR_OTHER, 1, 2, 3, t0);
    ck_assert_uint_eq(dl_trace_count(t, 0), 1);
    ck_assert(dl_trace_events(t, 0)[0].t1 >= t0);
    ck_assert_uint_eq(dl_trace_begin(NULL), 0);
    dl_trace_end(NULL, 0, DL_TR_OTHER, 1, 2, 3, 0);
    dl_trace_destroy(t);
    dl_trace_destroy(NULL);

    dl_trace *x = (dl_trace *)1;
    ck_assert_int_eq(dl_trace_create(0, 10, &x), DL_EINVAL);
    ck_assert_ptr_null(x);
    ck_assert_int_eq(dl_trace_create(2, 0, &x), DL_EINVAL);
    ck_assert_int_eq(dl_trace_create(2, 10, NULL), DL_EINVAL);
    ck_assert_str_eq(dl_trace_kind_name(DL_TR_RECV_WAIT), "recv-wait");
    ck_assert_str_eq(dl_trace_kind_name(99), "other");
}
END_TEST

/* ---- 8 threads recording at once -------------------------------------------------------------- */

typedef struct targ {
    dl_trace *t;
    int rank, n;
} targ;

static void *recorder(void *p)
{
    targ *a = p;
    for (int i = 0; i < a->n; i++) {
        uint64_t t0 = dl_trace_begin(a->t);
        dl_trace_end(a->t, a->rank, i & 1 ? DL_TR_BWD : DL_TR_FWD, a->rank, i, a->rank, t0);
    }
    return NULL;
}

START_TEST(t_threads)
{
    enum { NT = 8 };
    int n = DL_TEST_SMALL ? 20000 : 200000, extra = 17;
    dl_trace *t = mk(NT, (size_t)n);
    pthread_t th[NT];
    targ a[NT];
    for (int r = 0; r < NT; r++) {
        a[r] = (targ){t, r, n + extra};
        ck_assert_int_eq(pthread_create(&th[r], NULL, recorder, &a[r]), 0);
    }
    for (int r = 0; r < NT; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < NT; r++) {
        ck_assert_uint_eq(dl_trace_count(t, r), (size_t)n);
        ck_assert_uint_eq(dl_trace_dropped(t, r), (uint64_t)extra);
        const dl_trace_event *e = dl_trace_events(t, r);
        int ok = 1;
        for (int i = 0; i < n && ok; i++)
            ok = e[i].mb == i && e[i].step == r && e[i].chunk == r && e[i].kind == (i & 1) &&
                 e[i].t1 >= e[i].t0 && (i == 0 || e[i].t0 >= e[i - 1].t1);
        ck_assert_msg(ok, "rank %d: events out of order or overwritten", r);
        /* buffers never share a cache line */
        for (int q = 0; q < NT; q++) {
            if (q == r)
                continue;
            uintptr_t a0 = (uintptr_t)e, a1 = (a0 + (size_t)n * sizeof *e + 63) & ~(uintptr_t)63;
            uintptr_t b0 = (uintptr_t)dl_trace_events(t, q),
                      b1 = (b0 + (size_t)n * sizeof *e + 63) & ~(uintptr_t)63;
            ck_assert(a1 <= b0 || b1 <= a0);
        }
        ck_assert_uint_eq((uintptr_t)e % 64, 0);
    }
    dl_trace_destroy(t);
}
END_TEST

static Suite *trace_suite(void)
{
    Suite *s = suite_create("trace");
    TCase *tc = tcase_create("trace");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, t_bubble_hand);
    tcase_add_test(tc, t_bubble_random);
    tcase_add_test(tc, t_grid_hand);
    tcase_add_test(tc, t_grid_hidden);
    tcase_add_test(tc, t_grid_vs_sched);
    tcase_add_test(tc, t_chrome);
    tcase_add_test(tc, t_dropped);
    tcase_add_test(tc, t_threads);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(trace_suite());
    srunner_run_all(sr, CK_ENV);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
