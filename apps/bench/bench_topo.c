/* distlab-bench topo: load the topology, place ranks, start one pinned thread per rank and
 * report where each one actually runs. Plain pthreads, so that this check of pinning does not
 * depend on the rest of the runtime. */
#define _GNU_SOURCE /* getopt_long, sched_getcpu */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "distlab.h"
#include "core/topo.h"
#include "bench_topo.h"
#include "cli.h"

#define PROG "distlab-bench topo"
#define MAX_RANKS 4096

static void usage(FILE *f)
{
    fprintf(f,
            "usage: distlab-bench topo [options]\n"
            "Show the machine's topology, place ranks on it, pin one thread per rank and\n"
            "report the cpu each rank actually runs on.\n"
            "\n"
            "  -g, --ranks N             number of ranks (default: the real PU count); -g as in\n"
            "                            coll (where -n is --iters); -n N, the older spelling,\n"
            "                            still works here\n"
            "  -p, --policy P            placement: compact (rank i on PU i) or scatter\n"
            "                            (round-robin over packages, NUMA nodes, L3s, cores);\n"
            "                            default compact\n"
            "  -N, --nodes K             group ranks into nodes by package, numa, l3, or\n"
            "                            fixed (ranks-per-node ranks each); default package\n"
            "  -k, --ranks-per-node K    ranks per node with --nodes fixed (implies it)\n"
            "      --tp T, --pp P        also show where the trainer's dp x tp x pp mesh lands\n"
            "                            (dp = ranks / (tp pp); tp fastest): which tp and dp "
            "groups\n"
            "                            stay inside an L3, a NUMA node, a node; which pipeline\n"
            "                            hand-offs cross them\n"
            "      --ep E                with --tp/--pp or alone: expert parallelism inside dp\n"
            "                            (E divides dp): the ep groups (E consecutive dp ranks)\n"
            "                            and the expert-data-parallel groups (dp / E ranks with\n"
            "                            the same experts)\n"
            "  -t, --topology STR        plan on a synthetic hwloc topology, e.g.\n"
            "                            \"pack:2 l3:2 core:4 pu:1\" (default: DISTLAB_TOPOLOGY,\n"
            "                            else this machine); threads still run on this machine\n"
            "  -h, --help                show this help\n");
}

/* Parse a whole decimal int in [lo, hi]; print one line and return -1 otherwise. */
static int parse_int(const char *opt, const char *s, int lo, int hi, int *out)
{
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, PROG ": %s: expected a whole number from %d to %d, got \"%s\"\n", opt, lo,
                hi, s);
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* All ranks bind, then wait at a gate until every started rank has bound, so that each
 * reports its cpu while all ranks exist at once, as they would in a run. A gate rather than a
 * pthread barrier because the main thread can open it even if some thread failed to start. */
typedef struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived;
    int open;
} gate;

typedef struct rank_thread {
    const dl_topo *topo;
    gate *g;
    int os_cpu;    /* where the placement says it goes */
    int rc;        /* dl_topo_bind_self's status */
    int bound_cpu; /* cpu right after binding */
    int cpu;       /* cpu once every rank is bound */
    char err[256];
} rank_thread;

static void *rank_main(void *arg)
{
    rank_thread *r = arg;
    r->rc = dl_topo_bind_self(r->topo, r->os_cpu, &r->bound_cpu);
    if (r->rc != DL_OK)
        snprintf(r->err, sizeof r->err, "%s", dl_errmsg());
    pthread_mutex_lock(&r->g->mu);
    r->g->arrived++;
    pthread_cond_broadcast(&r->g->cv);
    while (!r->g->open) pthread_cond_wait(&r->g->cv, &r->g->mu);
    pthread_mutex_unlock(&r->g->mu);
    r->cpu = sched_getcpu();
    return NULL;
}

/* Does every member of a group share the same value of `dom` (an L3, a NUMA node, a node)? */
static int same_domain(const int *dom, const int *members, int n)
{
    for (int i = 1; i < n; i++)
        if (dom[members[i]] != dom[members[0]])
            return 0;
    return 1;
}

/* Where the trainer's mesh lands on this placement: world rank = (pp_rank x dp + dp_rank) x tp +
 * tp_rank (Megatron's order, tp fastest). tp wants its groups inside a cache or memory domain
 * (four all-reduces per layer), pp only crosses between stages (hand-offs), dp once per step. */
/* group count and size of a mesh dimension's groups, and how many stay inside each domain */
static void group_line(const char *what, int groups, int size, const int *in)
{
    printf("  %s: %d of %d ranks each; inside one L3 %d, one NUMA node %d, one node %d\n", what,
           groups, size, in[0], in[1], in[2]);
}

/* Expert parallelism inside dp (lib/runtime/comm.c's mesh): ep groups are ep consecutive dp
 * ranks; expert-data-parallel groups the dp / ep ranks with the same ep rank. */
static void ep_report(const int *const *doms, int *m, int dp, int tp, int pp, int ep)
{
    int in[3] = {0, 0, 0}, ein[3] = {0, 0, 0};
    for (int st = 0; st < pp; st++)
        for (int t = 0; t < tp; t++) {
            for (int g = 0; g < dp / ep; g++) {
                for (int i = 0; i < ep; i++) m[i] = (st * dp + g * ep + i) * tp + t;
                for (int d = 0; d < 3; d++) in[d] += same_domain(doms[d], m, ep);
            }
            for (int q = 0; q < ep; q++) {
                for (int i = 0; i < dp / ep; i++) m[i] = (st * dp + i * ep + q) * tp + t;
                for (int d = 0; d < 3; d++) ein[d] += same_domain(doms[d], m, dp / ep);
            }
        }
    group_line("ep groups (experts spread, the all-to-alls)", pp * tp * (dp / ep), ep, in);
    group_line("expert-data-parallel groups (experts' gradients)", pp * tp * ep, dp / ep, ein);
}

static void mesh_report(const dl_placement *pl, int tp, int pp, int ep)
{
    int n = pl->nranks, dp = n / (tp * pp);
    int *m = malloc(sizeof(int) * (size_t)n);
    if (!m)
        return;
    const int *doms[3] = {pl->l3, pl->numa, pl->node};
    printf("mesh: dp %d x tp %d x pp %d (tp fastest, then dp, then pp; rank = (pp_rank x %d + "
           "dp_rank) x %d + tp_rank)\n",
           dp, tp, pp, dp, tp);
    /* tp groups: consecutive ranks */
    int in[3] = {0, 0, 0}, groups = n / tp;
    for (int g = 0; g < groups; g++) {
        for (int i = 0; i < tp; i++) m[i] = g * tp + i;
        for (int d = 0; d < 3; d++) in[d] += same_domain(doms[d], m, tp);
    }
    group_line("tp groups", groups, tp, in);
    /* dp groups: same (pp, tp) */
    for (int d = 0; d < 3; d++) in[d] = 0;
    groups = pp * tp;
    for (int st = 0; st < pp; st++)
        for (int t = 0; t < tp; t++) {
            for (int i = 0; i < dp; i++) m[i] = (st * dp + i) * tp + t;
            for (int d = 0; d < 3; d++) in[d] += same_domain(doms[d], m, dp);
        }
    group_line("dp groups", groups, dp, in);
    if (ep > 1)
        ep_report(doms, m, dp, tp, pp, ep);
    /* pipelines: how many stage boundaries cross a domain */
    int cross[3] = {0, 0, 0}, bounds = dp * tp * (pp - 1);
    for (int d0 = 0; d0 < dp; d0++)
        for (int t = 0; t < tp; t++)
            for (int st = 0; st + 1 < pp; st++) {
                int a = (st * dp + d0) * tp + t, b = ((st + 1) * dp + d0) * tp + t;
                for (int d = 0; d < 3; d++) cross[d] += doms[d][a] != doms[d][b];
            }
    if (pp > 1)
        printf("  pp hand-offs (%d stage boundaries): crossing an L3 %d, a NUMA node %d, a node "
               "%d\n",
               bounds, cross[0], cross[1], cross[2]);
    free(m);
}

int bench_topo_main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"ranks", required_argument, NULL, 'g'},
        {"policy", required_argument, NULL, 'p'},
        {"nodes", required_argument, NULL, 'N'},
        {"ranks-per-node", required_argument, NULL, 'k'},
        {"topology", required_argument, NULL, 't'},
        {"tp", required_argument, NULL, 'T'},
        {"pp", required_argument, NULL, 'P'},
        {"ep", required_argument, NULL, 'E'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int nranks = 0, rpn = 0, nodes_given = 0, mtp = 0, mpp = 0, mep = 0;
    dl_place_policy policy = DL_PLACE_COMPACT;
    dl_node_kind nodes = DL_NODE_PACKAGE;
    const char *synthetic = NULL;

    /* The caller's main may have run getopt already: restart it from scratch (glibc). */
    optind = 0;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":g:n:p:N:k:t:T:P:E:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'T':
            if (parse_int("--tp", optarg, 1, MAX_RANKS, &mtp))
                return 2;
            break;
        case 'P':
            if (parse_int("--pp", optarg, 1, MAX_RANKS, &mpp))
                return 2;
            break;
        case 'E':
            if (parse_int("--ep", optarg, 1, MAX_RANKS, &mep))
                return 2;
            break;
        case 'g':
        case 'n': /* the older spelling of -g, kept for scripts */
            if (parse_int("--ranks", optarg, 1, MAX_RANKS, &nranks))
                return 2;
            break;
        case 'p':
            if (dl_place_policy_parse(optarg, &policy) != DL_OK) {
                fprintf(stderr, PROG ": --policy: %s\n", dl_errmsg());
                return 2;
            }
            break;
        case 'N':
            if (dl_node_kind_parse(optarg, &nodes) != DL_OK) {
                fprintf(stderr, PROG ": --nodes: %s\n", dl_errmsg());
                return 2;
            }
            nodes_given = 1;
            break;
        case 'k':
            if (parse_int("--ranks-per-node", optarg, 1, MAX_RANKS, &rpn))
                return 2;
            break;
        case 't': synthetic = optarg; break;
        case 'h': usage(stdout); return 0;
        case ':':
            fprintf(stderr, PROG ": option %s needs a value (try --help)\n", argv[optind - 1]);
            return 2;
        default:
            if (optopt)
                fprintf(stderr, PROG ": unknown option -%c (try --help)\n", optopt);
            else
                cli_unknown_option("topo: ", argv[optind - 1], longopts, sizeof longopts[0], 0, 1,
                                   PROG " --help");
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, PROG ": unexpected argument \"%s\" (try --help)\n", argv[optind]);
        return 2;
    }
    if (rpn > 0 && !nodes_given)
        nodes = DL_NODE_FIXED;
    if (nodes == DL_NODE_FIXED && rpn == 0) {
        fprintf(stderr, PROG ": --nodes fixed needs --ranks-per-node K\n");
        return 2;
    }
    if (rpn > 0 && nodes != DL_NODE_FIXED) {
        fprintf(stderr, PROG ": --ranks-per-node applies only to --nodes fixed, not %s\n",
                dl_node_kind_name(nodes));
        return 2;
    }

    if (mtp || mpp || mep) {
        int tp = mtp ? mtp : 1, pp = mpp ? mpp : 1, ep = mep ? mep : 1;
        if (nranks == 0 || nranks % (tp * pp)) {
            fprintf(stderr, PROG ": --tp %d x --pp %d must divide --ranks (give --ranks N)\n", tp,
                    pp);
            return 2;
        }
        if ((nranks / (tp * pp)) % ep) {
            fprintf(stderr, PROG ": --ep %d must divide dp = ranks / (tp x pp) = %d\n", ep,
                    nranks / (tp * pp));
            return 2;
        }
    }
    dl_topo *topo = NULL;
    int rc = dl_topo_load(&topo, synthetic);
    if (rc != DL_OK) {
        fprintf(stderr, PROG ": %s\n", dl_errmsg());
        return rc == DL_EINVAL ? 2 : 1;
    }
    if (nranks == 0)
        nranks = dl_topo_real_pus(topo);
    dl_placement *pl = NULL;
    rc = dl_place(topo, nranks, policy, nodes, rpn, &pl);
    if (rc != DL_OK) {
        fprintf(stderr, PROG ": %s\n", dl_errmsg());
        dl_topo_destroy(topo);
        return rc == DL_EINVAL ? 2 : 1;
    }

    int status = 1, started = 0, attr_ok = 0;
    gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0};
    pthread_attr_t attr;
    rank_thread *rt = calloc((size_t)nranks, sizeof *rt);
    pthread_t *th = calloc((size_t)nranks, sizeof *th);
    int *actual = calloc((size_t)nranks, sizeof *actual);
    if (!rt || !th || !actual) {
        fprintf(stderr, PROG ": out of memory for %d ranks\n", nranks);
        goto out;
    }
    if (pthread_attr_init(&attr) == 0) {
        attr_ok = 1;
        /* Threads here only bind and report: keep thousands of them cheap. */
        pthread_attr_setstacksize(&attr, 256 * 1024);
    }
    for (int r = 0; r < nranks; r++) {
        rt[r].topo = topo;
        rt[r].g = &g;
        rt[r].os_cpu = pl->os_pu[r];
        rt[r].cpu = -1;
        if ((rc = pthread_create(&th[r], attr_ok ? &attr : NULL, rank_main, &rt[r])) != 0) {
            fprintf(stderr, PROG ": starting rank %d of %d: %s\n", r, nranks, strerror(rc));
            break;
        }
        started++;
    }
    pthread_mutex_lock(&g.mu);
    while (g.arrived < started) pthread_cond_wait(&g.cv, &g.mu);
    g.open = 1;
    pthread_cond_broadcast(&g.cv);
    pthread_mutex_unlock(&g.mu);
    for (int r = 0; r < started; r++) pthread_join(th[r], NULL);
    if (started < nranks)
        goto out;

    int bind_failed = 0;
    for (int r = 0; r < nranks; r++) {
        actual[r] = rt[r].cpu;
        if (rt[r].rc != DL_OK && bind_failed++ < 5)
            fprintf(stderr, PROG ": rank %d: %s\n", r, rt[r].err);
    }
    printf("distlab-bench topo: %d %s, policy %s, nodes %s", nranks, nranks == 1 ? "rank" : "ranks",
           dl_place_policy_name(policy), dl_node_kind_name(nodes));
    if (nodes == DL_NODE_FIXED)
        printf(" (%d per node)", rpn);
    printf("\n");
    dl_topo_report(stdout, topo, pl, actual);
    if (mtp || mpp || mep)
        mesh_report(pl, mtp ? mtp : 1, mpp ? mpp : 1, mep ? mep : 1);
    if (bind_failed) {
        fprintf(stderr, PROG ": %d of %d ranks could not be pinned\n", bind_failed, nranks);
        goto out;
    }
    status = 0;
out:
    if (attr_ok)
        pthread_attr_destroy(&attr);
    free(rt);
    free(th);
    free(actual);
    dl_placement_destroy(pl);
    dl_topo_destroy(topo);
    return status;
}
