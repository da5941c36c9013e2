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
#include "bench_topo.h"

#define PROG "distlab-bench topo"
#define MAX_RANKS 4096

static void usage(FILE *f)
{
    fprintf(f,
            "usage: distlab-bench topo [options]\n"
            "Show the machine's topology, place ranks on it, pin one thread per rank and\n"
            "report the cpu each rank actually runs on.\n"
            "\n"
            "  -n, --ranks N             number of ranks (default: the real PU count)\n"
            "  -p, --policy P            placement: compact (rank i on PU i) or scatter\n"
            "                            (round-robin over packages, NUMA nodes, L3s, cores);\n"
            "                            default compact\n"
            "  -N, --nodes K             group ranks into nodes by package, numa, l3, or\n"
            "                            fixed (ranks-per-node ranks each); default package\n"
            "  -k, --ranks-per-node K    ranks per node with --nodes fixed (implies it)\n"
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
        fprintf(stderr, PROG ": %s: expected a whole number from %d to %d, got \"%s\"\n", opt,
                lo, hi, s);
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
    int os_cpu;     /* where the placement says it goes */
    int rc;         /* dl_topo_bind_self's status */
    int bound_cpu;  /* cpu right after binding */
    int cpu;        /* cpu once every rank is bound */
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
    while (!r->g->open)
        pthread_cond_wait(&r->g->cv, &r->g->mu);
    pthread_mutex_unlock(&r->g->mu);
    r->cpu = sched_getcpu();
    return NULL;
}

int bench_topo_main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"ranks", required_argument, NULL, 'n'},
        {"policy", required_argument, NULL, 'p'},
        {"nodes", required_argument, NULL, 'N'},
        {"ranks-per-node", required_argument, NULL, 'k'},
        {"topology", required_argument, NULL, 't'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int nranks = 0, rpn = 0, nodes_given = 0;
    dl_place_policy policy = DL_PLACE_COMPACT;
    dl_node_kind nodes = DL_NODE_PACKAGE;
    const char *synthetic = NULL;

    /* The caller's main may have run getopt already: restart it from scratch (glibc). */
    optind = 0;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":n:p:N:k:t:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'n':
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
        case 't':
            synthetic = optarg;
            break;
        case 'h':
            usage(stdout);
            return 0;
        case ':':
            fprintf(stderr, PROG ": option %s needs a value (try --help)\n", argv[optind - 1]);
            return 2;
        default:
            if (optopt)
                fprintf(stderr, PROG ": unknown option -%c (try --help)\n", optopt);
            else
                fprintf(stderr, PROG ": unknown option %s (try --help)\n", argv[optind - 1]);
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
    while (g.arrived < started)
        pthread_cond_wait(&g.cv, &g.mu);
    g.open = 1;
    pthread_cond_broadcast(&g.cv);
    pthread_mutex_unlock(&g.mu);
    for (int r = 0; r < started; r++)
        pthread_join(th[r], NULL);
    if (started < nranks)
        goto out;

    int bind_failed = 0;
    for (int r = 0; r < nranks; r++) {
        actual[r] = rt[r].cpu;
        if (rt[r].rc != DL_OK && bind_failed++ < 5)
            fprintf(stderr, PROG ": rank %d: %s\n", r, rt[r].err);
    }
    printf("distlab-bench topo: %d %s, policy %s, nodes %s", nranks,
           nranks == 1 ? "rank" : "ranks", dl_place_policy_name(policy),
           dl_node_kind_name(nodes));
    if (nodes == DL_NODE_FIXED)
        printf(" (%d per node)", rpn);
    printf("\n");
    dl_topo_report(stdout, topo, pl, actual);
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
