/* World tests: options checking, contexts against the placement, pinning verified, first error
 * propagation, arena capacity through --gpu-mem, flight recorder, non-blocking requests,
 * oversubscription, the binding policy. Rank threads only record; the test thread asserts. */
#define _GNU_SOURCE /* sched_getaffinity, the CPU_ macros */
#include "../testutil.h"
#include <sched.h>
#include <check.h>
#include <stdio.h>
#include "core/arena.h"
#include "core/topo.h"

#define MAXR 32

typedef struct {
    int rank[MAXR], size[MAXR], node[MAXR], cpu[MAXR], rc[MAXR];
    char text[MAXR][2048];
    uint64_t peak_comm[MAXR];
    double f64[MAXR];
} rec;

static dl_world_opts opts(int n)
{
    dl_world_opts o;
    dl_world_opts_init(&o);
    o.nranks = n;
    o.timeout_s = 120;
    o.quiet = 1;
    return o;
}

static int who(dl_ctx *x, void *arg)
{
    rec *r = arg;
    int k = dl_ctx_rank(x);
    r->rank[k] = k;
    r->size[k] = dl_ctx_size(x);
    r->node[k] = dl_ctx_node(x);
    r->cpu[k] = dl_ctx_cpu(x);
    return DL_OK;
}

START_TEST(contexts_match_placement)
{
    static rec r;
    memset(&r, 0, sizeof r);
    dl_world_opts o = opts(8);
    o.topology = "pack:2 l3:2 core:4 pu:1";
    o.nodes = DL_NODE_L3;
    o.bind = DL_BIND_PU; /* the default binds oversubscribed worlds to packages */
    dl_world *w;
    ck_assert_int_eq(dl_world_run_keep(&o, who, &r, &w), DL_OK);
    const dl_placement *p = dl_world_placement(w);
    ck_assert_int_eq(p->nranks, 8);
    for (int k = 0; k < 8; k++) {
        ck_assert_int_eq(r.rank[k], k);
        ck_assert_int_eq(r.size[k], 8);
        ck_assert_int_eq(r.node[k], k / 4); /* compact on 4 cores per L3 */
        ck_assert_int_eq(r.node[k], p->node[k]);
        /* pinning is verified: the thread ran on the cpu it was placed on */
        ck_assert_int_eq(r.cpu[k], p->os_pu[k]);
        ck_assert_int_eq(dl_world_actual_cpu(w, k), r.cpu[k]);
    }
    ck_assert_int_eq(dl_world_error_rank(w), -1);
    dl_world_destroy(w);
}
END_TEST

START_TEST(bad_options)
{
    dl_world_opts o = opts(0);
    ck_assert_int_eq(dl_world_run(&o, who, NULL), DL_EINVAL);
    ck_assert_ptr_nonnull(strstr(dl_errmsg(), "rank count"));
    o.nranks = -3;
    ck_assert_int_eq(dl_world_run(&o, who, NULL), DL_EINVAL);
    o = opts(2);
    o.nslots = 6;
    ck_assert_int_eq(dl_world_run(&o, who, NULL), DL_EINVAL);
    o = opts(2);
    ck_assert_int_eq(dl_world_run(&o, NULL, NULL), DL_EINVAL);
    ck_assert_int_eq(dl_world_run(NULL, who, NULL), DL_EINVAL);
    o = opts(2);
    o.topology = "this is not a topology";
    ck_assert_int_ne(dl_world_run(&o, who, NULL), DL_OK);
}
END_TEST

static int fail_rank1(dl_ctx *x, void *arg)
{
    (void)arg;
    if (dl_ctx_rank(x) == 1)
        return dl_error(DL_EUSER, "bad luck on purpose");
    return DL_OK;
}

START_TEST(first_error_names_rank)
{
    dl_world_opts o = opts(4);
    dl_world *w;
    ck_assert_int_eq(dl_world_run_keep(&o, fail_rank1, NULL, &w), DL_EUSER);
    ck_assert_ptr_nonnull(strstr(dl_errmsg(), "rank 1: bad luck on purpose"));
    ck_assert_int_eq(dl_world_error_rank(w), 1);
    dl_world_destroy(w);
}
END_TEST

/* Each rank takes 3 MiB of params then asks for 2 MiB of optimizer state under a 4 MiB cap. */
static int over_capacity(dl_ctx *x, void *arg)
{
    rec *r = arg;
    int k = dl_ctx_rank(x);
    void *a, *b;
    int rc = dl_arena_alloc(dl_ctx_arena(x), DL_MEM_PARAMS, 3u << 20, &a);
    if (rc)
        return rc;
    memset(a, 7, 3u << 20);
    rc = dl_arena_alloc(dl_ctx_arena(x), DL_MEM_OPTIMIZER, 2u << 20, &b);
    r->rc[k] = rc;
    snprintf(r->text[k], sizeof r->text[k], "%s", dl_errmsg());
    dl_arena_stats st;
    dl_arena_get_stats(dl_ctx_arena(x), &st);
    r->peak_comm[k] = st.current_total;
    /* the params are intact */
    unsigned char *p = a;
    r->size[k] = p[0] == 7 && p[(3u << 20) - 1] == 7;
    return DL_OK;
}

START_TEST(gpu_mem_capacity)
{
    static rec r;
    memset(&r, 0, sizeof r);
    dl_world_opts o = opts(2);
    ck_assert_int_eq(dl_parse_size("4M", &o.gpu_mem), DL_OK);
    ck_assert_int_eq(dl_world_run(&o, over_capacity, &r), DL_OK);
    for (int k = 0; k < 2; k++) {
        ck_assert_int_eq(r.rc[k], DL_ENOMEM);
        char want[32];
        snprintf(want, sizeof want, "rank %d", k);
        ck_assert_ptr_nonnull(strstr(r.text[k], want));
        ck_assert_ptr_nonnull(strstr(r.text[k], "optimizer"));
        ck_assert_ptr_nonnull(strstr(r.text[k], "2097152"));        /* bytes asked */
        ck_assert_ptr_nonnull(strstr(r.text[k], "left 1.000 MiB")); /* 4 MiB less 3 in use */
        ck_assert_uint_eq(r.peak_comm[k], 3u << 20);
        ck_assert_int_eq(r.size[k], 1);
    }
}
END_TEST

static int record_flight(dl_ctx *x, void *arg)
{
    rec *r = arg;
    int k = dl_ctx_rank(x);
    double v = k + 1, out;
    for (int i = 0; i < 3; i++) {
        int rc = dl_allreduce(dl_ctx_comm(x), &v, &out, 1, DL_F64, DL_SUM, DL_PURPOSE_LOSS);
        if (rc)
            return rc;
    }
    r->f64[k] = out;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    dl_ctx_flight_dump(x, f);
    fclose(f);
    snprintf(r->text[k], sizeof r->text[k], "%s", buf);
    free(buf);
    return DL_OK;
}

START_TEST(flight_recorder)
{
    static rec r;
    memset(&r, 0, sizeof r);
    dl_world_opts o = opts(3);
    ck_assert_int_eq(dl_world_run(&o, record_flight, &r), DL_OK);
    for (int k = 0; k < 3; k++) {
        ck_assert(r.f64[k] == 6.0);
        ck_assert_ptr_nonnull(strstr(r.text[k], "allreduce"));
        ck_assert_ptr_nonnull(strstr(r.text[k], "#3"));
        ck_assert_ptr_null(strstr(r.text[k], "#4"));
    }
}
END_TEST

/* Non-blocking requests run in order on the rank's communication thread, and a blocking
 * collective issued while they are pending runs after them. */
static int nonblocking(dl_ctx *x, void *arg)
{
    rec *r = arg;
    int k = dl_ctx_rank(x), n = dl_ctx_size(x);
    dl_comm *c = dl_ctx_comm(x);
    enum { N = 1000 };
    static _Thread_local double a[N], b[N], out_a[N], out_b[N], c1;
    for (int i = 0; i < N; i++) {
        a[i] = k * N + i;
        b[i] = -(double)(k * N + i);
    }
    dl_request *ra, *rb;
    int rc = dl_iallreduce(c, a, out_a, N, DL_F64, DL_SUM, DL_PURPOSE_GRADS, &ra);
    if (!rc)
        rc = dl_iallreduce(c, b, out_b, N, DL_F64, DL_MAX, DL_PURPOSE_GRADS, &rb);
    double one = 1;
    if (!rc)
        rc = dl_allreduce(c, &one, &c1, 1, DL_F64, DL_SUM, DL_PURPOSE_LOSS);
    int done = 0;
    if (!rc)
        rc = dl_test(rb, &done);
    if (!rc)
        rc = dl_wait(ra);
    if (!rc)
        rc = dl_wait(rb);
    if (rc)
        return rc;
    int ok = c1 == n;
    for (int i = 0; i < N; i++) {
        double s = 0;
        for (int j = 0; j < n; j++) s += j * N + i;
        ok &= out_a[i] == s && out_b[i] == -(double)i;
    }
    r->rc[k] = ok;
    return DL_OK;
}

START_TEST(nonblocking_in_order)
{
    static rec r;
    memset(&r, 0, sizeof r);
    int n = DL_TEST_SMALL ? 3 : 4;
    dl_world_opts o = opts(n);
    ck_assert_int_eq(dl_world_run(&o, nonblocking, &r), DL_OK);
    for (int k = 0; k < n; k++) ck_assert_int_eq(r.rc[k], 1);
}
END_TEST

static int barriers(dl_ctx *x, void *arg)
{
    rec *r = arg;
    for (int i = 0; i < 200; i++) {
        int rc = dl_barrier(dl_ctx_comm(x));
        if (rc)
            return rc;
    }
    r->rc[dl_ctx_rank(x)] = 1;
    return DL_OK;
}

START_TEST(oversubscribed_16)
{
    static rec r;
    memset(&r, 0, sizeof r);
    dl_world_opts o = opts(16);
    dl_world *w;
    ck_assert_int_eq(dl_world_run_keep(&o, barriers, &r, &w), DL_OK);
    ck_assert_int_eq(dl_world_oversubscribed(w), 16 > dl_topo_real_pus(dl_world_topo(w)));
    ck_assert_int_eq(dl_world_placement(w)->wrapped, 16 > dl_topo_real_pus(dl_world_topo(w)));
    for (int k = 0; k < 16; k++) ck_assert_int_eq(r.rc[k], 1);
    dl_world_destroy(w);
}
END_TEST

/* ---- binding: each rank thread's own affinity against the policy ---- */

typedef struct {
    int cpu[MAXR];
    char cpus[MAXR][96];
    cpu_set_t aff[MAXR];
} bind_rec;

static int where(dl_ctx *x, void *arg)
{
    bind_rec *b = arg;
    int k = dl_ctx_rank(x);
    b->cpu[k] = dl_ctx_cpu(x);
    snprintf(b->cpus[k], sizeof b->cpus[k], "%s", dl_ctx_cpus(x));
    return sched_getaffinity(0, sizeof b->aff[k], &b->aff[k]) ? DL_ESYS : DL_OK;
}

/* A cpu list ("0-3,8") as a set; 0 when it is not one. */
static int parse_cpulist(const char *s, cpu_set_t *set)
{
    CPU_ZERO(set);
    for (;;) {
        char *end;
        long a = strtol(s, &end, 10), b = a;
        if (end == s)
            return 0;
        if (*end == '-')
            b = strtol(end + 1, &end, 10);
        for (long c = a; c <= b; c++) CPU_SET((int)c, set);
        if (*end != ',')
            return *end == 0;
        s = end + 1;
    }
}

static dl_world *run_bound(int n, int bind, bind_rec *b)
{
    memset(b, 0, sizeof *b);
    dl_world_opts o = opts(n);
    o.bind = bind;
    dl_world *w;
    ck_assert_int_eq(dl_world_run_keep(&o, where, b, &w), DL_OK);
    return w;
}

START_TEST(binding_policy)
{
    cpu_set_t proc; /* the test thread's affinity, which an unbound rank keeps */
    ck_assert_int_eq(sched_getaffinity(0, sizeof proc, &proc), 0);
    int over = CPU_COUNT(&proc) + 1;
    static bind_rec b;
    /* fits: auto pins each rank to its own PU */
    dl_world *w = run_bound(1, DL_BIND_AUTO, &b);
    ck_assert_int_eq(dl_world_oversubscribed(w), 0);
    int os = dl_world_placement(w)->os_pu[0];
    ck_assert_int_eq(b.cpu[0], os);
    ck_assert_int_eq(CPU_COUNT(&b.aff[0]), 1);
    ck_assert(CPU_ISSET(os, &b.aff[0]));
    ck_assert_int_eq(atoi(b.cpus[0]), os);
    dl_world_destroy(w);
    /* not bound: the process's cpus */
    w = run_bound(1, DL_BIND_NONE, &b);
    ck_assert_int_eq(b.cpu[0], -1);
    ck_assert_str_eq(b.cpus[0], "any");
    ck_assert(CPU_EQUAL(&b.aff[0], &proc));
    dl_world_destroy(w);
    if (over > MAXR) {
        fprintf(stderr, "binding_policy: %d cpus, oversubscribed part skipped\n", over - 1);
        return;
    }
    /* oversubscribed: auto binds to the package; on one package that is every allowed cpu */
    w = run_bound(over, DL_BIND_AUTO, &b);
    ck_assert_int_eq(dl_world_oversubscribed(w), 1);
    dl_topo_summary sum;
    dl_topo_get_summary(dl_world_topo(w), &sum);
    for (int k = 0; k < over; k++) {
        cpu_set_t listed;
        ck_assert_int_eq(b.cpu[k], -1);
        ck_assert_msg(parse_cpulist(b.cpus[k], &listed), "rank %d cpus '%s'", k, b.cpus[k]);
        ck_assert_msg(CPU_EQUAL(&listed, &b.aff[k]), "rank %d: '%s' is not its affinity", k,
                      b.cpus[k]);
        ck_assert(CPU_ISSET(dl_world_placement(w)->os_pu[k], &b.aff[k]));
        cpu_set_t both;
        CPU_AND(&both, &b.aff[k], &proc);
        ck_assert(CPU_EQUAL(&both, &b.aff[k])); /* within the process's cpus */
        if (sum.packages == 1)
            ck_assert(CPU_EQUAL(&b.aff[k], &proc));
    }
    dl_world_destroy(w);
    /* the old behaviour on request: one PU each, oversubscribed too */
    w = run_bound(over, DL_BIND_PU, &b);
    for (int k = 0; k < over; k++) {
        ck_assert_int_eq(b.cpu[k], dl_world_placement(w)->os_pu[k]);
        ck_assert_int_eq(CPU_COUNT(&b.aff[k]), 1);
    }
    dl_world_destroy(w);
}
END_TEST

START_TEST(binding_bad)
{
    dl_world_opts o = opts(2);
    o.bind = DL_BIND_PACKAGE + 1;
    ck_assert_int_eq(dl_world_run(&o, who, NULL), DL_EINVAL);
    ck_assert_ptr_nonnull(strstr(dl_errmsg(), "binding"));
    o.bind = DL_BIND_AUTO - 1;
    ck_assert_int_eq(dl_world_run(&o, who, NULL), DL_EINVAL);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("world");
    TCase *tc = tcase_create("world");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, bad_options);
    tcase_add_test(tc, contexts_match_placement);
    tcase_add_test(tc, first_error_names_rank);
    tcase_add_test(tc, gpu_mem_capacity);
    tcase_add_test(tc, flight_recorder);
    tcase_add_test(tc, nonblocking_in_order);
    tcase_add_test(tc, oversubscribed_16);
    tcase_add_test(tc, binding_policy);
    tcase_add_test(tc, binding_bad);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
