/* distlab-lecture 04's experiment (apps/lecture/lecture_mlp.c: the lecture's MLP on the library's ZeRO
 * engine, lib/parallel/zero_engine.c) on rank threads. Layout and padding; the model-state bytes
 * each stage's arena measures against the formulas at the padded size; elements sent per step;
 * stages 1-3 bitwise equal; f32 within round-off of one rank; the loss goes down; other rank counts
 * (padding in two layers); bad options. */
#include "../unit/testutil.h" /* first: it sets _GNU_SOURCE before any system header */
#include <check.h>
#include "lecture_mlp.h"

START_TEST(layout)
{
    zm_layout L;
    ck_assert_int_eq(zm_layout_init(&L, 4), DL_OK);
    ck_assert_uint_eq(L.psi, 1633);
    ck_assert_uint_eq(L.ppad, 1636);
    ck_assert_uint_eq(L.shard, 409);
    ck_assert_uint_eq(L.pad[0], 544);
    ck_assert_uint_eq(L.pad[1], 1056);
    ck_assert_uint_eq(L.pad[2], 36);
    ck_assert_uint_eq(L.off[2], 1600);
    ck_assert_uint_eq(L.soff[2], 136 + 264);
    ck_assert_int_eq(zm_layout_init(&L, 1), DL_OK);
    ck_assert_uint_eq(L.ppad, 1633);
    ck_assert_int_eq(zm_layout_init(&L, 3), DL_OK);
    ck_assert_uint_eq(L.pad[0], 546);
    ck_assert_uint_eq(L.pad[1], 1056);
    ck_assert_uint_eq(L.pad[2], 33);
    ck_assert_uint_eq(L.shard, 182 + 352 + 11);
    ck_assert_int_eq(zm_layout_init(&L, 0), DL_EINVAL);
}
END_TEST

static void run_ok(zm_opts *o, zm_result *r)
{
    int rc = zm_run(o, r);
    ck_assert_msg(rc == DL_OK, "zm_run (stage %d, %d ranks): %s", o->stage, o->nranks, dl_errmsg());
}

START_TEST(bytes_and_traffic_bf16)
{
    zm_opts o;
    zm_opts_init(&o);
    zm_result ref, v[4];
    o.nranks = 1;
    run_ok(&o, &ref);
    o.nranks = 4;
    const uint64_t P = 1636, S = 409;
    const uint64_t want_bytes[4] = {16 * P, 4 * P + 12 * S, 2 * P + 14 * S, 16 * S};
    const uint64_t want_sent[4] = {2 * 3 * S, 2 * 3 * S, 2 * 3 * S,
                                   3 * 3 * S}; /* elements per step */
    for (int s = 0; s < 4; s++) {
        o.stage = s;
        run_ok(&o, &v[s]);
        for (int k = 0; k < 4; k++) {
            ck_assert_uint_eq(zm_state_bytes(&v[s], k), want_bytes[s]);
            uint64_t sent = v[s].sent[k][DL_PURPOSE_GRADS] + v[s].sent[k][DL_PURPOSE_PARAMS];
            ck_assert_uint_eq(sent, want_sent[s] * 2 * (uint64_t)o.steps);
        }
        /* stage 2 and 3 never hold a full gradient; stage 3 never the full parameters */
        ck_assert_uint_eq(v[s].peak[0][DL_MEM_GRADS], (s >= 2 ? S : P) * 2);
        ck_assert_uint_eq(v[s].peak[0][DL_MEM_PARAMS], (s == 3 ? S : P) * 2);
        ck_assert_uint_eq(v[s].peak[0][DL_MEM_OPTIMIZER], (s == 0 ? P : S) * 12);
        ck_assert(v[s].loss[o.steps - 1] < v[s].loss[0]);
        ck_assert(zm_maxdiff(&v[s], &ref) <= 2.0 * o.steps * 1.1 * o.lr); /* Adam's step bound */
    }
    ck_assert(zm_maxdiff(&v[1], &v[2]) == 0.0);
    ck_assert(zm_maxdiff(&v[1], &v[3]) == 0.0);
    ck_assert(ref.loss[o.steps - 1] < ref.loss[0]);
    zm_result_free(&ref);
    for (int s = 0; s < 4; s++) zm_result_free(&v[s]);
}
END_TEST

START_TEST(f32_matches_single_rank)
{
    zm_opts o;
    zm_opts_init(&o);
    o.dtype = DL_F32;
    zm_result r;
    for (int n = 2; n <= 4; n++) {
        for (int s = 0; s < 4; s++) {
            o.nranks = n;
            o.stage = s;
            o.batch = 48; /* a multiple of 2, 3, 4 */
            zm_result ref48;
            zm_opts o1 = o;
            o1.nranks = 1;
            run_ok(&o1, &ref48);
            run_ok(&o, &r);
            double d = zm_maxdiff(&r, &ref48);
            ck_assert_msg(d <= 1e-6, "f32 stage %d on %d ranks: %g", s, n, d);
            /* f32 keeps no master copy (the engine's f32 AdamW updates the parameters): K = 8 */
            ck_assert_uint_eq(zm_state_bytes(&r, 0), s == 0   ? 16 * r.L.ppad
                                                     : s == 1 ? 8 * r.L.ppad + 8 * r.L.shard
                                                     : s == 2 ? 4 * r.L.ppad + 12 * r.L.shard
                                                              : 16 * r.L.shard);
            zm_result_free(&r);
            zm_result_free(&ref48);
        }
    }
    /* one step moves every weight by at most lr */
    zm_opts o1 = o;
    o1.nranks = 4;
    o1.stage = 3;
    o1.steps = 1;
    o1.batch = 64;
    zm_result a, init;
    run_ok(&o1, &a);
    o1.lr = 1e-30f; /* effectively the initial weights */
    run_ok(&o1, &init);
    ck_assert(zm_maxdiff(&a, &init) <= 1.0001 * 1e-3);
    ck_assert(zm_maxdiff(&a, &init) >= 0.5e-3);
    zm_result_free(&a);
    zm_result_free(&init);
}
END_TEST

START_TEST(bad_options)
{
    zm_opts o;
    zm_result r;
    zm_opts_init(&o);
    o.stage = 4;
    ck_assert_int_eq(zm_run(&o, &r), DL_EINVAL);
    zm_opts_init(&o);
    o.batch = 62; /* not a multiple of 4 */
    ck_assert_int_eq(zm_run(&o, &r), DL_EINVAL);
    zm_opts_init(&o);
    o.dtype = DL_F64;
    ck_assert_int_eq(zm_run(&o, &r), DL_EINVAL);
    zm_opts_init(&o);
    o.steps = 0;
    ck_assert_int_eq(zm_run(&o, &r), DL_EINVAL);
    ck_assert_int_eq(zm_run(NULL, &r), DL_EINVAL);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("lecture_zero");
    TCase *tc = tcase_create("lecture_zero");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, layout);
    tcase_add_test(tc, bytes_and_traffic_bf16);
    tcase_add_test(tc, bad_options);
    tcase_add_test(tc, f32_matches_single_rank); /* milliseconds: no reduced tier needed */
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
