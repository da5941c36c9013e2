/* The ZeRO engine alone (lib/parallel/zero_engine.h), on a toy list of units (5, 7, 1 and 7
 * elements: every unit padded on 3 ranks, one unit smaller than the rank count) and no model: each
 * rank's blocks tile the buffer exactly once and the arena holds exactly the shard sizes each stage
 * keeps; stage 1's in-place reduce-scatter and stages 2-3's reduce hook deliver this rank's block
 * of the serial sum of every rank's gradient (the reduce hook adds micro-batches up); stage 3's
 * gather hook returns the whole unit; the sharded AdamW (stages 1-3, f64 and bf16 mixed precision;
 * the trainer's optimizer, lib/train/optim.c, over the engine's blocks, then stages 1-2's
 * all-gather) ends with bitwise the parameters (bf16: master weights) of one unsharded AdamW on the
 * summed gradient, and the exported gradient is that sum. The gradients are small integers, so
 * every sum is exact in any order and bitwise equality is the right test; negative controls: the
 * sum differs from each rank's own gradient, the step moves every parameter, and every rank's
 * whole buffer is checked after the all-gather. */
#include "../testutil.h"
#include <check.h>
#include "model/ops.h"
#include "parallel/zero_engine.h"
#include "train/optim.h"

#define NR 3
#define NU 4
static const size_t BOUNDS[NU + 1] = {0, 5, 12, 13, 20};
#define P 20

/* rank r's gradient: small integers, exact in bf16 and in any sum of three */
static double grad_value(int r, size_t i)
{
    return (double)((int)((i * 7 + (size_t)r * 3) % 11) - 5);
}
/* the initial parameters: exact in bf16 too (the master copy starts from them) */
static double param_value(size_t i) { return ((double)i - 9.5) / 16.0; }

typedef struct job {
    int stage, micro;
    dl_dtype dt;
    double params[P], grads[P]; /* rank 0's export after the step */
    double block[NR][P];        /* each rank's reduced gradient at its blocks, else NAN */
    double gathered[NR][P];
    double whole[NR][P]; /* stages 0-2, f64: each rank's parameters after the step */
    int tiles[P];        /* how many (rank, unit) blocks own each element */
    uint64_t peak[NR][DL_MEM_NCATEGORIES];
} job;

static void put(dl_dtype t, void *p, size_t i, double v)
{
    if (t == DL_F64)
        ((double *)p)[i] = v;
    else if (t == DL_F32)
        ((float *)p)[i] = (float)v;
    else
        ((uint16_t *)p)[i] = tu_f32_to_bf16((float)v);
}

/* hand every unit's gradient of one backward to the engine, as the model would */
static int backward(dl_zero_engine *z, void *grads, float *cbuf, double *dbuf, int r)
{
    int rc = DL_OK;
    for (int u = NU - 1; u >= 0 && rc == DL_OK; u--) {
        const dl_zero_unit *b = &z->zu.u[u];
        size_t n = (size_t)z->zu.dp * b->shard;
        for (size_t k = 0; k < n; k++) {
            double g = k < b->numel ? grad_value(r, b->lo + k) : 0;
            if (z->stage >= 2 && z->dt == DL_F64)
                dbuf[k] = g;
            else if (z->stage >= 2)
                cbuf[k] = (float)g; /* the compute type */
            else if (k < b->numel)
                put(z->dt, grads, b->lo + k, g);
        }
        if (z->stage >= 2)
            rc = dl_zero_reduce_hook(z, u, z->dt == DL_F64 ? (void *)dbuf : (void *)cbuf);
    }
    return rc == DL_OK ? dl_zero_ready(z, 0) : rc;
}

static char *grad_block(void *arg, int u) { return dl_zero_grad_block(arg, u); }
static char *param_block(void *arg, int u) { return dl_zero_param_block(arg, u); }

static int rank_fn(dl_ctx *ctx, void *arg)
{
    job *J = arg;
    int r = dl_ctx_rank(ctx), rc = DL_OK;
    size_t es = dl_dtype_size(J->dt);
    dl_arena *A = dl_ctx_arena(ctx);
    void *params = NULL, *grads = NULL, *unit = NULL;
    float cbuf[32];
    double dbuf[32], full[P];
    float fullf[P];
    dl_zero_engine z;
    tr_optim op = {0};
    dl_zero_engine_init(&z, J->stage, J->dt, dl_ctx_comm(ctx));
    if ((J->stage < 3 && (rc = dl_arena_alloc(A, DL_MEM_PARAMS, P * es, &params))) ||
        (J->stage < 2 && (rc = dl_arena_alloc(A, DL_MEM_GRADS, P * es, &grads))) ||
        (rc = dl_zero_engine_setup(&z, BOUNDS, NU, NR, r, params, grads, A)))
        goto out;
    /* the optimizer over the engine's blocks, as the trainer composes them */
    tr_prec pr;
    tr_prec_init(&pr, J->dt);
    tr_shards sh = {&z.zu, grad_block, param_block, (float *)z.master, &z};
    tr_adam_hp hp = {0.9, 0.999, 1e-8, 0.01};
    if ((rc = tr_optim_init(&op, &sh, &pr, &hp, A)))
        goto out;
    dl_arena_stats as;
    dl_arena_get_stats(A, &as);
    memcpy(J->peak[r], as.peak, sizeof J->peak[r]);
    for (size_t i = 0; i < P; i++) full[i] = param_value(i), fullf[i] = (float)full[i];
    dl_zero_import(&z, J->dt == DL_F64 ? (void *)full : (void *)fullf);
    dl_zero_begin_step(&z);
    for (int m = 0; m < J->micro && rc == DL_OK; m++) rc = backward(&z, grads, cbuf, dbuf, r);
    for (int u = 0; u < NU && rc == DL_OK; u++) {
        const dl_zero_unit *b = &z.zu.u[u];
        const char *g = dl_zero_grad_block(&z, u);
        for (size_t k = 0; k < b->owned; k++) {
            J->block[r][b->begin + k] = tu_get(J->dt, g, k);
            __atomic_fetch_add(&J->tiles[b->begin + k], 1, __ATOMIC_RELAXED);
        }
    }
    if (rc == DL_OK && J->stage == 3 && (rc = dl_arena_alloc(A, DL_MEM_COMM, 32 * es, &unit)) == 0)
        for (int u = 0; u < NU && rc == DL_OK; u++)
            if ((rc = dl_zero_gather_hook(&z, u, unit)) == DL_OK)
                for (size_t k = 0; k < z.zu.u[u].numel; k++)
                    J->gathered[r][z.zu.u[u].lo + k] = tu_get(J->dt, unit, k);
    if (rc == DL_OK) {
        tr_optim_step(&op, 0.5, 1e-2);
        if (J->stage == 1 || J->stage == 2)
            rc = dl_zero_gather_params(&z);
        for (size_t i = 0; J->stage < 3 && i < P; i++) /* the model's whole buffer */
            J->whole[r][i] = J->dt == DL_F64 ? tu_get(J->dt, params, i) : NAN;
    }
    for (int which = 0; which < 2 && rc == DL_OK; which++)
        if ((rc = dl_zero_export(&z, which, J->dt == DL_F64 ? (void *)full : (void *)fullf)) ==
                DL_OK &&
            r == 0)
            for (size_t i = 0; i < P; i++)
                (which ? J->grads : J->params)[i] = J->dt == DL_F64 ? full[i] : fullf[i];
out:
    tr_optim_free(&op);
    dl_arena_free(A, unit);
    dl_zero_engine_free(&z);
    dl_arena_free(A, params);
    dl_arena_free(A, grads);
    return rc;
}

static void run_job(job *J, int stage, dl_dtype dt, int micro)
{
    memset(J, 0, sizeof *J);
    J->stage = stage, J->dt = dt, J->micro = micro;
    for (int r = 0; r < NR; r++)
        for (size_t i = 0; i < P; i++) J->block[r][i] = NAN;
    int rc = tu_run_world(NR, rank_fn, J);
    ck_assert_msg(rc == DL_OK, "engine stage %d: %s", stage, dl_errmsg());
}

static double serial_sum(size_t i, int micro)
{
    double s = 0;
    for (int r = 0; r < NR; r++) s += grad_value(r, i);
    return micro * s;
}

/* one unsharded AdamW (the library's kernels) on the summed gradient */
static void serial_adam(dl_dtype dt, int micro, double *out)
{
    double p[P], g[P], m[P] = {0}, v[P] = {0};
    float pf[P], mf[P] = {0}, vf[P] = {0};
    uint16_t gb[P];
    for (size_t i = 0; i < P; i++) {
        p[i] = param_value(i), g[i] = serial_sum(i, micro);
        pf[i] = (float)p[i], gb[i] = tu_f32_to_bf16((float)g[i]);
    }
    if (dt == DL_F64) {
        dl_adamw_f64(p, g, m, v, P, 1e-2, 0.9, 0.999, 1e-8, 0.01, 0.5, 1);
        memcpy(out, p, sizeof p);
    } else {
        dl_adamw_bf16(pf, gb, mf, vf, P, 1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f, 0.5f, 1, NULL);
        for (size_t i = 0; i < P; i++) out[i] = pf[i];
    }
}

static void check_stage(int stage, dl_dtype dt, int micro)
{
    job J;
    run_job(&J, stage, dt, micro);
    size_t es = dl_dtype_size(dt), cs = dt == DL_BF16 ? 4 : es, S = 2 + 3 + 1 + 3; /* sum S_u */
    double want[P];
    serial_adam(dt, micro, want);
    int own_only = 0;
    for (size_t i = 0; i < P; i++) {
        ck_assert_int_eq(J.tiles[i], 1); /* every element in exactly one rank's block */
        ck_assert_msg(J.params[i] == want[i], "stage %d %s: param %zu %.17g != %.17g", stage,
                      dl_dtype_name(dt), i, J.params[i], want[i]);
        ck_assert(J.params[i] != param_value(i)); /* control: the step moved it */
        ck_assert(J.grads[i] == serial_sum(i, micro));
        int owners = 0;
        for (int r = 0; r < NR; r++) {
            if (stage == 3) /* the gather hook: the whole unit on every rank */
                ck_assert(J.gathered[r][i] == param_value(i));
            if (stage < 3 && dt == DL_F64)
                ck_assert(J.whole[r][i] == want[i]);
            if (isnan(J.block[r][i]))
                continue;
            owners++;
            ck_assert(J.block[r][i] == serial_sum(i, micro));
            own_only += J.block[r][i] == micro * grad_value(r, i);
        }
        ck_assert_int_eq(owners, 1);
    }
    ck_assert_int_lt(own_only, P / 2); /* control: the blocks hold sums, not the own gradient */
    for (int r = 0; r < NR; r++) {
        const uint64_t *pk = J.peak[r];
        ck_assert_uint_eq(pk[DL_MEM_OPTIMIZER], S * (2 * cs + (dt == DL_BF16 ? 4 : 0)));
        ck_assert_uint_eq(pk[DL_MEM_GRADS], (stage >= 2 ? S : P) * es);
        ck_assert_uint_eq(pk[DL_MEM_PARAMS], (stage == 3 ? S : P) * es);
    }
}

START_TEST(stage1_f64) { check_stage(1, DL_F64, 1); }
END_TEST
START_TEST(stage2_f64) { check_stage(2, DL_F64, 2); }
END_TEST
START_TEST(stage3_f64) { check_stage(3, DL_F64, 2); }
END_TEST
START_TEST(stage1_bf16) { check_stage(1, DL_BF16, 1); }
END_TEST
START_TEST(stage2_bf16) { check_stage(2, DL_BF16, 1); }
END_TEST
START_TEST(stage3_bf16) { check_stage(3, DL_BF16, 2); }
END_TEST

int main(void)
{
    Suite *s = suite_create("zero_engine");
    TCase *tc = tcase_create("zero_engine");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, stage1_f64);
    tcase_add_test(tc, stage2_f64);
    tcase_add_test(tc, stage3_f64);
    tcase_add_test(tc, stage1_bf16);
    tcase_add_test(tc, stage2_bf16);
    tcase_add_test(tc, stage3_bf16);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
