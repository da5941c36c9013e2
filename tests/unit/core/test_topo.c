/* Unit tests of topology loading, placement, pinning and the placement report. */
#define _GNU_SOURCE /* open_memstream, setenv, sched_getcpu */
#include <check.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "distlab.h"
#include "core/topo.h"

#define SYN16 "pack:2 l3:2 core:4 pu:1"

static dl_topo *load(const char *syn)
{
    dl_topo *t = NULL;
    int rc = dl_topo_load(&t, syn);
    ck_assert_msg(rc == DL_OK, "load \"%s\": %s %s", syn ? syn : "(null)", dl_strstatus(rc),
                  dl_errmsg());
    ck_assert_ptr_nonnull(t);
    return t;
}

static dl_placement *place(const dl_topo *t, int n, dl_place_policy pol, dl_node_kind nk, int rpn)
{
    dl_placement *p = NULL;
    int rc = dl_place(t, n, pol, nk, rpn, &p);
    ck_assert_msg(rc == DL_OK, "place %d: %s %s", n, dl_strstatus(rc), dl_errmsg());
    ck_assert_ptr_nonnull(p);
    ck_assert_int_eq(p->nranks, n);
    return p;
}

/* OS cpu of the real PU with logical index (logical mod real PUs), taken from a compact
 * placement on the real machine (rank i on PU i); test_real_os_cpus checks that table against
 * the kernel's affinity mask. */
static int real_os_of_logical(int logical, int *npus)
{
    dl_topo *t = load("");
    int n = dl_topo_real_pus(t);
    dl_placement *p = place(t, n, DL_PLACE_COMPACT, DL_NODE_PACKAGE, 0);
    int os = p->os_pu[logical % n];
    dl_placement_destroy(p);
    dl_topo_destroy(t);
    if (npus)
        *npus = n;
    return os;
}

/* The real PUs are distinct OS cpus and include every cpu this process may run on. */
START_TEST(test_real_os_cpus)
{
    dl_topo *t = load("");
    int n = dl_topo_real_pus(t);
    ck_assert_int_ge(n, 1);
    dl_placement *p = place(t, n, DL_PLACE_COMPACT, DL_NODE_PACKAGE, 0);
    cpu_set_t mine, placed;
    CPU_ZERO(&placed);
    for (int i = 0; i < n; i++) {
        ck_assert_int_ge(p->os_pu[i], 0);
        ck_assert_int_lt(p->os_pu[i], CPU_SETSIZE);
        ck_assert_msg(!CPU_ISSET(p->os_pu[i], &placed), "cpu %d twice", p->os_pu[i]);
        CPU_SET(p->os_pu[i], &placed);
    }
    ck_assert_int_eq(sched_getaffinity(0, sizeof mine, &mine), 0);
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &mine))
            ck_assert_msg(CPU_ISSET(c, &placed), "allowed cpu %d is not a real PU", c);
    ck_assert_int_le(CPU_COUNT(&mine), n);
    dl_placement_destroy(p);
    dl_topo_destroy(t);
}
END_TEST

START_TEST(test_synthetic_summary)
{
    dl_topo *t = load(SYN16);
    dl_topo_summary s;
    dl_topo_get_summary(t, &s);
    ck_assert_int_eq(s.pus, 16);
    ck_assert_int_eq(s.cores, 16);
    ck_assert_int_eq(s.l3s, 4);
    ck_assert_int_eq(s.packages, 2);
    ck_assert_int_eq(s.numas, 1);
    ck_assert_int_eq(s.synthetic, 1);
    ck_assert_str_eq(s.desc, SYN16);
    ck_assert_int_gt(s.l3_bytes, 0); /* hwloc gives synthetic caches a default size */
    int real;
    (void)real_os_of_logical(0, &real);
    ck_assert_int_eq(dl_topo_real_pus(t), real);
    dl_topo_destroy(t);
}
END_TEST

START_TEST(test_real_summary)
{
    dl_topo *t = load("");
    dl_topo_summary s;
    dl_topo_get_summary(t, &s);
    ck_assert_int_eq(s.synthetic, 0);
    ck_assert_str_eq(s.desc, "this machine");
    int real;
    (void)real_os_of_logical(0, &real);
    ck_assert_int_eq(s.pus, real);
    ck_assert_int_eq(dl_topo_real_pus(t), real);
    ck_assert_int_ge(s.cores, 1);
    ck_assert_int_le(s.cores, s.pus);
    ck_assert_int_ge(s.packages, 1);
    ck_assert_int_ge(s.numas, 1);
    dl_topo_destroy(t);
}
END_TEST

START_TEST(test_compact_nodes)
{
    dl_topo *t = load(SYN16);
    dl_placement *p = place(t, 16, DL_PLACE_COMPACT, DL_NODE_PACKAGE, 0);
    ck_assert_int_eq(p->wrapped, 0);
    ck_assert_int_eq(p->nnodes, 2);
    for (int r = 0; r < 16; r++) {
        ck_assert_int_eq(p->pu[r], r);
        ck_assert_int_eq(p->core[r], r);
        ck_assert_int_eq(p->l3[r], r / 4);
        ck_assert_int_eq(p->package[r], r / 8);
        ck_assert_int_eq(p->numa[r], 0);
        ck_assert_int_eq(p->node[r], r / 8);
        ck_assert_int_eq(p->os_pu[r], real_os_of_logical(r, NULL));
    }
    dl_placement_destroy(p);

    p = place(t, 16, DL_PLACE_COMPACT, DL_NODE_L3, 0);
    ck_assert_int_eq(p->nnodes, 4);
    for (int r = 0; r < 16; r++) ck_assert_int_eq(p->node[r], r / 4);
    dl_placement_destroy(p);

    p = place(t, 16, DL_PLACE_COMPACT, DL_NODE_NUMA, 0);
    ck_assert_int_eq(p->nnodes, 1);
    for (int r = 0; r < 16; r++) ck_assert_int_eq(p->node[r], 0);
    dl_placement_destroy(p);
    dl_topo_destroy(t);
}
END_TEST

START_TEST(test_numa_nodes)
{
    dl_topo *t = load("pack:2 numa:2 l3:2 core:4 pu:1");
    dl_topo_summary s;
    dl_topo_get_summary(t, &s);
    ck_assert_int_eq(s.pus, 32);
    ck_assert_int_eq(s.numas, 4);
    ck_assert_int_eq(s.l3s, 8);
    dl_placement *p = place(t, 32, DL_PLACE_COMPACT, DL_NODE_NUMA, 0);
    ck_assert_int_eq(p->nnodes, 4);
    for (int r = 0; r < 32; r++) {
        ck_assert_int_eq(p->numa[r], r / 8);
        ck_assert_int_eq(p->node[r], r / 8);
    }
    dl_placement_destroy(p);
    /* Scatter goes package, then NUMA node, then L3: 4 ranks on 4 NUMA nodes. */
    p = place(t, 4, DL_PLACE_SCATTER, DL_NODE_NUMA, 0);
    static const int expect_pu[4] = {0, 16, 8, 24};
    for (int r = 0; r < 4; r++) ck_assert_int_eq(p->pu[r], expect_pu[r]);
    ck_assert_int_eq(p->nnodes, 4);
    static const int expect_node[4] = {0, 1, 2, 3}; /* renumbered in order of appearance */
    for (int r = 0; r < 4; r++) ck_assert_int_eq(p->node[r], expect_node[r]);
    ck_assert_int_eq(p->numa[1], 2);
    ck_assert_int_eq(p->numa[2], 1);
    dl_placement_destroy(p);
    dl_topo_destroy(t);
}
END_TEST

START_TEST(test_scatter)
{
    dl_topo *t = load(SYN16);
    dl_placement *p = place(t, 4, DL_PLACE_SCATTER, DL_NODE_L3, 0);
    int l3_seen[4] = {0}, pkg_seen[2] = {0};
    for (int r = 0; r < 4; r++) {
        ck_assert_int_ge(p->l3[r], 0);
        ck_assert_int_lt(p->l3[r], 4);
        l3_seen[p->l3[r]]++;
        pkg_seen[p->package[r]]++;
    }
    for (int i = 0; i < 4; i++) ck_assert_int_eq(l3_seen[i], 1);
    ck_assert_int_eq(pkg_seen[0], 2);
    ck_assert_int_eq(pkg_seen[1], 2);
    /* Consecutive ranks in different packages. */
    for (int r = 1; r < 4; r++) ck_assert_int_ne(p->package[r], p->package[r - 1]);
    ck_assert_int_eq(p->nnodes, 4);
    ck_assert_int_eq(p->wrapped, 0);
    dl_placement_destroy(p);

    /* The documented mixed-radix order, and every PU exactly once. */
    static const int order[16] = {0, 8, 4, 12, 1, 9, 5, 13, 2, 10, 6, 14, 3, 11, 7, 15};
    p = place(t, 16, DL_PLACE_SCATTER, DL_NODE_PACKAGE, 0);
    for (int r = 0; r < 16; r++) {
        ck_assert_int_eq(p->pu[r], order[r]);
        ck_assert_int_eq(p->package[r], order[r] / 8);
        ck_assert_int_eq(p->node[r], r % 2);
        ck_assert_int_eq(p->os_pu[r],
                         real_os_of_logical(r, NULL)); /* synthetic: bound by rank order */
    }
    dl_placement_destroy(p);
    dl_topo_destroy(t);
}
END_TEST

START_TEST(test_scatter_smt)
{
    /* SMT siblings come last: both cores get a rank before any core gets two. */
    dl_topo *t = load("pack:1 core:2 pu:2");
    dl_placement *p = place(t, 4, DL_PLACE_SCATTER, DL_NODE_PACKAGE, 0);
    static const int pu[4] = {0, 2, 1, 3}, core[4] = {0, 1, 0, 1};
    for (int r = 0; r < 4; r++) {
        ck_assert_int_eq(p->pu[r], pu[r]);
        ck_assert_int_eq(p->core[r], core[r]);
    }
    dl_placement_destroy(p);
    /* Three cores per package: ranks alternate packages, then walk the cores of each. */
    dl_topo_destroy(t);
    t = load("pack:2 core:3 pu:1");
    p = place(t, 6, DL_PLACE_SCATTER, DL_NODE_PACKAGE, 0);
    static const int pu2[6] = {0, 3, 1, 4, 2, 5};
    for (int r = 0; r < 6; r++) ck_assert_int_eq(p->pu[r], pu2[r]);
    dl_placement_destroy(p);
    dl_topo_destroy(t);
}
END_TEST

START_TEST(test_wrap)
{
    dl_topo *t = load(SYN16);
    dl_placement *p = place(t, 20, DL_PLACE_COMPACT, DL_NODE_PACKAGE, 0);
    ck_assert_int_eq(p->wrapped, 1);
    for (int r = 0; r < 20; r++) {
        ck_assert_int_eq(p->pu[r], r % 16);
        ck_assert_int_eq(p->node[r], (r % 16) / 8);
    }
    ck_assert_int_eq(p->nnodes, 2);
    dl_placement_destroy(p);

    p = place(t, 20, DL_PLACE_SCATTER, DL_NODE_PACKAGE, 0);
    ck_assert_int_eq(p->wrapped, 1);
    static const int head[4] = {0, 8, 4, 12};
    for (int r = 16; r < 20; r++) ck_assert_int_eq(p->pu[r], head[r - 16]);
    dl_placement_destroy(p);

    p = place(t, 16, DL_PLACE_COMPACT, DL_NODE_PACKAGE, 0);
    ck_assert_int_eq(p->wrapped, 0);
    dl_placement_destroy(p);
    dl_topo_destroy(t);
}
END_TEST

START_TEST(test_fixed_nodes)
{
    dl_topo *t = load(SYN16);
    dl_placement *p = place(t, 7, DL_PLACE_COMPACT, DL_NODE_FIXED, 3);
    static const int node[7] = {0, 0, 0, 1, 1, 1, 2};
    for (int r = 0; r < 7; r++) ck_assert_int_eq(p->node[r], node[r]);
    ck_assert_int_eq(p->nnodes, 3);
    dl_placement_destroy(p);

    p = place(t, 7, DL_PLACE_SCATTER, DL_NODE_FIXED, 1);
    ck_assert_int_eq(p->nnodes, 7);
    dl_placement_destroy(p);

    dl_placement *q = (dl_placement *)0x1;
    ck_assert_int_eq(dl_place(t, 7, DL_PLACE_COMPACT, DL_NODE_FIXED, 0, &q), DL_EINVAL);
    ck_assert_ptr_null(q);
    ck_assert_int_eq(dl_place(t, 7, DL_PLACE_COMPACT, DL_NODE_FIXED, -2, &q), DL_EINVAL);
    ck_assert_int_eq(dl_place(t, 0, DL_PLACE_COMPACT, DL_NODE_PACKAGE, 0, &q), DL_EINVAL);
    ck_assert_int_eq(dl_place(t, -1, DL_PLACE_COMPACT, DL_NODE_PACKAGE, 0, &q), DL_EINVAL);
    ck_assert_int_eq(dl_place(t, 4, (dl_place_policy)7, DL_NODE_PACKAGE, 0, &q), DL_EINVAL);
    ck_assert_int_eq(dl_place(t, 4, DL_PLACE_COMPACT, (dl_node_kind)9, 0, &q), DL_EINVAL);
    ck_assert_int_eq(dl_place(NULL, 4, DL_PLACE_COMPACT, DL_NODE_PACKAGE, 0, &q), DL_EINVAL);
    dl_topo_destroy(t);
}
END_TEST

START_TEST(test_no_l3_falls_back_to_package)
{
    dl_topo *t = load("pack:2 core:2 pu:1");
    dl_topo_summary s;
    dl_topo_get_summary(t, &s);
    ck_assert_int_eq(s.l3s, 0);
    ck_assert_int_eq(s.l3_bytes, 0);
    dl_placement *p = place(t, 4, DL_PLACE_COMPACT, DL_NODE_L3, 0);
    ck_assert_int_eq(p->nnodes, 2);
    for (int r = 0; r < 4; r++) {
        ck_assert_int_eq(p->l3[r], -1);
        ck_assert_int_eq(p->node[r], r / 2);
    }
    dl_placement_destroy(p);
    dl_topo_destroy(t);
}
END_TEST

/* ---- binding (in a helper thread, so the test's own thread keeps its affinity) ---- */

typedef struct bind_job {
    const dl_topo *t;
    int n;
    int os[256];
    int rc[256];
    int actual[256];
    int after[256];
    char msg[256];
} bind_job;

static void *bind_main(void *arg)
{
    bind_job *j = arg;
    for (int i = 0; i < j->n; i++) {
        j->rc[i] = dl_topo_bind_self(j->t, j->os[i], &j->actual[i]);
        if (j->rc[i] != DL_OK && !j->msg[0])
            snprintf(j->msg, sizeof j->msg, "%s", dl_errmsg());
        /* Still there after yielding the cpu: the binding holds, not just the first pick. */
        sched_yield();
        j->after[i] = sched_getcpu();
    }
    return NULL;
}

START_TEST(test_bind_each_real_pu)
{
    dl_topo *t = load(SYN16); /* binding must use the real machine even with a synthetic one */
    int real = dl_topo_real_pus(t);
    ck_assert_int_ge(real, 1);
    dl_placement *p = place(t, real, DL_PLACE_COMPACT, DL_NODE_PACKAGE, 0);
    static bind_job j;
    memset(&j, 0, sizeof j);
    j.t = t;
    j.n = real < 256 ? real : 256;
    for (int i = 0; i < j.n; i++) j.os[i] = p->os_pu[i];
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, bind_main, &j), 0);
    pthread_join(th, NULL);
    if (j.rc[0] == DL_ESYS) {
        /* Binding unsupported here (e.g. a sandbox forbidding sched_setaffinity). */
        fprintf(stderr, "test_bind_each_real_pu: binding unsupported, skipped: %s\n", j.msg);
    } else {
        for (int i = 0; i < j.n; i++) {
            ck_assert_msg(j.rc[i] == DL_OK, "bind cpu %d: %s", j.os[i], j.msg);
            ck_assert_int_eq(j.actual[i], j.os[i]);
            ck_assert_int_eq(j.after[i], j.os[i]);
        }
    }
    /* A cpu the machine does not have. */
    int actual = 0;
    ck_assert_int_eq(dl_topo_bind_self(t, 1 << 20, &actual), DL_EINVAL);
    ck_assert_int_eq(actual, -1);
    ck_assert_int_eq(dl_topo_bind_self(t, -1, NULL), DL_EINVAL);
    dl_placement_destroy(p);
    dl_topo_destroy(t);
}
END_TEST

/* ---- names, bad input, environment ---- */

START_TEST(test_names)
{
    dl_place_policy pol;
    dl_node_kind nk;
    ck_assert_int_eq(dl_place_policy_parse("compact", &pol), DL_OK);
    ck_assert_int_eq(pol, DL_PLACE_COMPACT);
    ck_assert_int_eq(dl_place_policy_parse("scatter", &pol), DL_OK);
    ck_assert_int_eq(pol, DL_PLACE_SCATTER);
    ck_assert_int_eq(dl_place_policy_parse("Scatter", &pol), DL_OK);
    ck_assert_int_eq(dl_node_kind_parse("package", &nk), DL_OK);
    ck_assert_int_eq(nk, DL_NODE_PACKAGE);
    ck_assert_int_eq(dl_node_kind_parse("numa", &nk), DL_OK);
    ck_assert_int_eq(nk, DL_NODE_NUMA);
    ck_assert_int_eq(dl_node_kind_parse("l3", &nk), DL_OK);
    ck_assert_int_eq(nk, DL_NODE_L3);
    ck_assert_int_eq(dl_node_kind_parse("fixed", &nk), DL_OK);
    ck_assert_int_eq(nk, DL_NODE_FIXED);

    ck_assert_int_eq(dl_place_policy_parse("spread", &pol), DL_EINVAL);
    ck_assert_ptr_nonnull(strstr(dl_errmsg(), "spread"));
    ck_assert_ptr_nonnull(strstr(dl_errmsg(), "compact"));
    ck_assert_ptr_nonnull(strstr(dl_errmsg(), "scatter"));
    ck_assert_int_eq(dl_place_policy_parse("", &pol), DL_EINVAL);
    ck_assert_int_eq(dl_place_policy_parse(NULL, &pol), DL_EINVAL);
    ck_assert_int_eq(dl_node_kind_parse("socket", &nk), DL_EINVAL);
    ck_assert_ptr_nonnull(strstr(dl_errmsg(), "package"));
    ck_assert_ptr_nonnull(strstr(dl_errmsg(), "numa"));
    ck_assert_ptr_nonnull(strstr(dl_errmsg(), "l3"));
    ck_assert_ptr_nonnull(strstr(dl_errmsg(), "fixed"));
    ck_assert_int_eq(dl_node_kind_parse("l2", &nk), DL_EINVAL);

    ck_assert_str_eq(dl_place_policy_name(DL_PLACE_COMPACT), "compact");
    ck_assert_str_eq(dl_place_policy_name(DL_PLACE_SCATTER), "scatter");
    ck_assert_str_eq(dl_node_kind_name(DL_NODE_PACKAGE), "package");
    ck_assert_str_eq(dl_node_kind_name(DL_NODE_NUMA), "numa");
    ck_assert_str_eq(dl_node_kind_name(DL_NODE_L3), "l3");
    ck_assert_str_eq(dl_node_kind_name(DL_NODE_FIXED), "fixed");
    ck_assert_ptr_nonnull(dl_node_kind_name((dl_node_kind)42));
    ck_assert_ptr_nonnull(dl_place_policy_name((dl_place_policy)42));
}
END_TEST

START_TEST(test_bad_synthetic)
{
    dl_topo *t = (dl_topo *)0x1;
    ck_assert_int_eq(dl_topo_load(&t, "pack:2 bogus:3"), DL_EINVAL);
    ck_assert_ptr_null(t);
    ck_assert_ptr_nonnull(strstr(dl_errmsg(), "bogus"));
    ck_assert_int_eq(dl_topo_load(NULL, NULL), DL_EINVAL);
}
END_TEST

START_TEST(test_env_topology)
{
    ck_assert_int_eq(setenv("DISTLAB_TOPOLOGY", "pack:2 core:2 pu:1", 1), 0);
    dl_topo *t = load(NULL);
    dl_topo_summary s;
    dl_topo_get_summary(t, &s);
    ck_assert_int_eq(s.synthetic, 1);
    ck_assert_int_eq(s.pus, 4);
    ck_assert_int_eq(s.packages, 2);
    ck_assert_str_eq(s.desc, "pack:2 core:2 pu:1");
    dl_topo_destroy(t);

    /* An explicit string wins over the environment; "" means this machine. */
    t = load(SYN16);
    dl_topo_get_summary(t, &s);
    ck_assert_int_eq(s.pus, 16);
    dl_topo_destroy(t);
    t = load("");
    dl_topo_get_summary(t, &s);
    ck_assert_int_eq(s.synthetic, 0);
    dl_topo_destroy(t);

    /* An empty variable means this machine too. */
    ck_assert_int_eq(setenv("DISTLAB_TOPOLOGY", "", 1), 0);
    t = load(NULL);
    dl_topo_get_summary(t, &s);
    ck_assert_int_eq(s.synthetic, 0);
    dl_topo_destroy(t);

    ck_assert_int_eq(setenv("DISTLAB_TOPOLOGY", "nonsense", 1), 0);
    ck_assert_int_eq(dl_topo_load(&t, NULL), DL_EINVAL);
    unsetenv("DISTLAB_TOPOLOGY");
}
END_TEST

/* ---- report ---- */

/* Lines of the rank table: they start with the rank number, then seven more integers. */
static int count_table_rows(const char *text, int *first_rank_ok)
{
    int rows = 0;
    *first_rank_ok = 1;
    for (const char *line = text; line && *line;) {
        int v[8], consumed = 0;
        if (sscanf(line, "%d %d %d %d %d %d %d %d%n", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
                   &v[6], &v[7], &consumed) == 8 &&
            consumed > 0) {
            if (v[0] != rows)
                *first_rank_ok = 0;
            rows++;
        }
        line = strchr(line, '\n');
        if (line)
            line++;
    }
    return rows;
}

static char *report_text(const dl_topo *t, const dl_placement *p, const int *actual)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ck_assert_ptr_nonnull(f);
    dl_topo_report(f, t, p, actual);
    fclose(f);
    ck_assert_ptr_nonnull(buf);
    return buf;
}

START_TEST(test_report_synthetic)
{
    dl_topo *t = load(SYN16);
    dl_placement *p = place(t, 16, DL_PLACE_SCATTER, DL_NODE_L3, 0);
    char *txt = report_text(t, p, NULL);
    ck_assert_msg(strstr(txt, "synthetic") != NULL, "%s", txt);
    ck_assert_msg(strstr(txt, SYN16) != NULL, "%s", txt);
    ck_assert_msg(strstr(txt, "16 PUs") != NULL, "%s", txt);
    ck_assert_msg(strstr(txt, "2 packages") != NULL, "%s", txt);
    ck_assert_msg(strstr(txt, "rank") && strstr(txt, "os_cpu") && strstr(txt, "package") &&
                      strstr(txt, "node"),
                  "%s", txt);
    ck_assert_msg(strstr(txt, "actual") == NULL, "%s", txt);
    ck_assert_msg(strstr(txt, "wraps") == NULL, "%s", txt);
    int ok;
    ck_assert_int_eq(count_table_rows(txt, &ok), 16);
    ck_assert(ok);
    free(txt);
    dl_placement_destroy(p);

    p = place(t, 20, DL_PLACE_COMPACT, DL_NODE_PACKAGE, 0);
    int actual[20];
    for (int r = 0; r < 20; r++) actual[r] = p->os_pu[r];
    txt = report_text(t, p, actual);
    ck_assert_msg(strstr(txt, "20 ranks on 16 PUs: placement wraps (oversubscribed)") != NULL, "%s",
                  txt);
    ck_assert_msg(strstr(txt, "actual") != NULL, "%s", txt);
    ck_assert_int_eq(count_table_rows(txt, &ok), 20);
    ck_assert(ok);
    free(txt);
    dl_placement_destroy(p);
    dl_topo_destroy(t);
}
END_TEST

START_TEST(test_report_real)
{
    dl_topo *t = load("");
    int n = dl_topo_real_pus(t);
    dl_placement *p = place(t, n, DL_PLACE_COMPACT, DL_NODE_PACKAGE, 0);
    char *txt = report_text(t, p, NULL);
    ck_assert_msg(strstr(txt, "this machine") != NULL, "%s", txt);
    ck_assert_msg(strstr(txt, "synthetic") == NULL, "%s", txt);
    int ok;
    ck_assert_int_eq(count_table_rows(txt, &ok), n);
    ck_assert(ok);
    free(txt);
    /* Summary only. */
    txt = report_text(t, NULL, NULL);
    ck_assert_int_eq(count_table_rows(txt, &ok), 0);
    free(txt);
    dl_placement_destroy(p);
    dl_topo_destroy(t);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("topo");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_synthetic_summary);
    tcase_add_test(tc, test_real_summary);
    tcase_add_test(tc, test_real_os_cpus);
    tcase_add_test(tc, test_compact_nodes);
    tcase_add_test(tc, test_numa_nodes);
    tcase_add_test(tc, test_scatter);
    tcase_add_test(tc, test_scatter_smt);
    tcase_add_test(tc, test_wrap);
    tcase_add_test(tc, test_fixed_nodes);
    tcase_add_test(tc, test_no_l3_falls_back_to_package);
    tcase_add_test(tc, test_bind_each_real_pu);
    tcase_add_test(tc, test_names);
    tcase_add_test(tc, test_bad_synthetic);
    tcase_add_test(tc, test_env_topology);
    tcase_add_test(tc, test_report_synthetic);
    tcase_add_test(tc, test_report_real);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_ENV);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
