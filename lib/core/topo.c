/* Machine topology (hwloc), rank placement, pinning and the placement report. */
#include "config.h"
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* sched_getcpu */
#endif
#include <errno.h>
#include <limits.h>
#include <hwloc.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "distlab/error.h"
#include "core/topo.h"

/* Ranks beyond this are surely a mistake, and the bound keeps the placement's int arrays far
 * from size_t overflow. */
#define DL_MAX_RANKS (1 << 20)

/* What placement needs to know about one PU of the planning topology, computed once at load. */
typedef struct pu_info {
    int core, l3, numa, package;
} pu_info;

struct dl_topo {
    hwloc_topology_t real; /* this machine: binding always goes through it */
    hwloc_topology_t syn;  /* synthetic topology for planning, or NULL */
    int real_pus;
    int *real_os; /* [real_pus] OS index of the real PU with that logical index */
    int npus;     /* PUs of the planning topology (synthetic if any, else real) */
    pu_info *pu;  /* [npus] */
    dl_topo_summary sum;
};

static hwloc_topology_t plan_topo(const dl_topo *t) { return t->syn ? t->syn : t->real; }

static int ancestor_index(hwloc_topology_t topo, hwloc_obj_type_t type, hwloc_obj_t pu)
{
    hwloc_obj_t a = hwloc_get_ancestor_obj_by_type(topo, type, pu);
    return a ? (int)a->logical_index : -1;
}

static long long first_cache_size(hwloc_topology_t topo, hwloc_obj_type_t type)
{
    hwloc_obj_t o = hwloc_get_obj_by_type(topo, type, 0);
    return o && o->attr ? (long long)o->attr->cache.size : 0;
}

/* Fill t->pu and t->sum from the planning topology. */
static int describe(dl_topo *t)
{
    hwloc_topology_t topo = plan_topo(t);
    int npus = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU);
    if (npus <= 0)
        return dl_error(DL_ESYS, "topology: hwloc found no PUs");
    int ncores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
    int nnuma = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
    t->pu = calloc((size_t)npus, sizeof *t->pu);
    if (!t->pu)
        return dl_error(DL_ENOMEM, "topology: out of host memory");
    t->npus = npus;
    for (int i = 0; i < npus; i++) {
        hwloc_obj_t pu = hwloc_get_obj_by_type(topo, HWLOC_OBJ_PU, (unsigned)i);
        pu_info *pi = &t->pu[i];
        /* A topology without Core objects: every PU is its own core. */
        pi->core = ncores > 0 ? ancestor_index(topo, HWLOC_OBJ_CORE, pu) : i;
        if (pi->core < 0)
            pi->core = i;
        pi->l3 = ancestor_index(topo, HWLOC_OBJ_L3CACHE, pu);
        /* No Package objects (e.g. synthetic "core:4 pu:1"): the machine is one package. */
        pi->package = ancestor_index(topo, HWLOC_OBJ_PACKAGE, pu);
        if (pi->package < 0)
            pi->package = 0;
        /* NUMA nodes hang off the tree as memory children in hwloc 2: take the first whose
         * cpuset holds this PU (a PU near both DRAM and HBM gets the first, the DRAM one). */
        pi->numa = 0;
        for (int n = 0; n < nnuma; n++) {
            hwloc_obj_t no = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, (unsigned)n);
            if (no && no->cpuset && hwloc_bitmap_isincluded(pu->cpuset, no->cpuset)) {
                pi->numa = n;
                break;
            }
        }
    }
    dl_topo_summary *s = &t->sum;
    s->pus = npus;
    s->cores = ncores > 0 ? ncores : npus;
    s->l3s = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_L3CACHE);
    if (s->l3s < 0)
        s->l3s = 0;
    s->numas = nnuma > 0 ? nnuma : 1;
    s->packages = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PACKAGE);
    if (s->packages <= 0)
        s->packages = 1;
    s->l3_bytes = first_cache_size(topo, HWLOC_OBJ_L3CACHE);
    s->l2_bytes = first_cache_size(topo, HWLOC_OBJ_L2CACHE);
    return DL_OK;
}

/* The count of one level ("pack:10", "10", "core:4(...)"): 0 when the token has none (hwloc
 * then judges it). */
static unsigned long long level_count(const char *tok, size_t len)
{
    const char *colon = memchr(tok, ':', len);
    const char *num = colon ? colon + 1 : tok;
    unsigned long long v = 0;
    for (; num < tok + len && *num >= '0' && *num <= '9'; num++)
        v = v > ULLONG_MAX / 10 ? ULLONG_MAX : v * 10 + (unsigned long long)(*num - '0');
    return v;
}

/* DL_OK if the synthetic string stays within DL_TOPO_MAX_PUS and DL_TOPO_MAX_DEPTH. Levels
 * are separated by blanks; attributes in parentheses may hold blanks. */
static int check_synthetic(const char *syn)
{
    unsigned long long pus = 1;
    int depth = 0;
    const char *p = syn;
    while (*p) {
        while (*p == ' ' || *p == '\t' || *p == '\n') p++;
        if (!*p)
            break;
        const char *t = p;
        int paren = 0;
        for (; *p && (paren || (*p != ' ' && *p != '\t' && *p != '\n')); p++)
            paren += *p == '(' ? 1 : *p == ')' && paren ? -1 : 0;
        unsigned long long c = level_count(t, (size_t)(p - t));
        if (c == 0)
            continue; /* "numa:..." attributes-only tokens and the like: hwloc decides */
        depth++;
        pus = pus > ULLONG_MAX / c ? ULLONG_MAX : pus * c;
    }
    if (depth > DL_TOPO_MAX_DEPTH)
        return dl_error(DL_EINVAL, "synthetic topology \"%s\" has %d levels; the cap is %d", syn,
                        depth, DL_TOPO_MAX_DEPTH);
    if (pus > DL_TOPO_MAX_PUS)
        return dl_error(DL_EINVAL,
                        "synthetic topology \"%s\" has %llu PUs; the cap is %d "
                        "(DL_TOPO_MAX_PUS)",
                        syn, pus, DL_TOPO_MAX_PUS);
    return DL_OK;
}

int dl_topo_load(dl_topo **out, const char *synthetic)
{
    if (!out)
        return dl_error(DL_EINVAL, "topo_load: null output pointer");
    *out = NULL;
    if (!synthetic)
        synthetic = getenv("DISTLAB_TOPOLOGY");
    if (synthetic && !*synthetic)
        synthetic = NULL;
    if (synthetic) {
        int st = check_synthetic(synthetic);
        if (st != DL_OK)
            return st;
    }

    dl_topo *t = calloc(1, sizeof *t);
    if (!t)
        return dl_error(DL_ENOMEM, "topo_load: out of host memory");
    int rc = DL_OK;
    if (hwloc_topology_init(&t->real) != 0) {
        t->real = NULL;
        rc = dl_error(DL_ESYS, "topo_load: hwloc_topology_init: %s", strerror(errno));
        goto fail;
    }
    if (hwloc_topology_load(t->real) != 0) {
        rc = dl_error(DL_ESYS, "topo_load: loading this machine's topology: %s", strerror(errno));
        goto fail;
    }
    t->real_pus = hwloc_get_nbobjs_by_type(t->real, HWLOC_OBJ_PU);
    if (t->real_pus <= 0) {
        rc = dl_error(DL_ESYS, "topo_load: hwloc found no PUs on this machine");
        goto fail;
    }
    t->real_os = calloc((size_t)t->real_pus, sizeof *t->real_os);
    if (!t->real_os) {
        rc = dl_error(DL_ENOMEM, "topo_load: out of host memory");
        goto fail;
    }
    for (int i = 0; i < t->real_pus; i++)
        t->real_os[i] = (int)hwloc_get_obj_by_type(t->real, HWLOC_OBJ_PU, (unsigned)i)->os_index;

    if (synthetic) {
        if (hwloc_topology_init(&t->syn) != 0) {
            t->syn = NULL;
            rc = dl_error(DL_ESYS, "topo_load: hwloc_topology_init: %s", strerror(errno));
            goto fail;
        }
        if (hwloc_topology_set_synthetic(t->syn, synthetic) != 0) {
            rc = dl_error(DL_EINVAL,
                          "invalid synthetic topology \"%s\" (hwloc syntax, e.g. "
                          "\"pack:2 l3:2 core:4 pu:1\")",
                          synthetic);
            goto fail;
        }
        if (hwloc_topology_load(t->syn) != 0) {
            rc = dl_error(DL_EINVAL, "synthetic topology \"%s\" failed to load: %s", synthetic,
                          strerror(errno));
            goto fail;
        }
        t->sum.synthetic = 1;
        snprintf(t->sum.desc, sizeof t->sum.desc, "%s", synthetic);
    } else {
        snprintf(t->sum.desc, sizeof t->sum.desc, "this machine");
    }
    rc = describe(t);
    if (rc != DL_OK)
        goto fail;
    *out = t;
    return DL_OK;
fail:
    dl_topo_destroy(t);
    return rc;
}

void dl_topo_destroy(dl_topo *t)
{
    if (!t)
        return;
    if (t->syn)
        hwloc_topology_destroy(t->syn);
    if (t->real)
        hwloc_topology_destroy(t->real);
    free(t->real_os);
    free(t->pu);
    free(t);
}

void dl_topo_get_summary(const dl_topo *t, dl_topo_summary *s)
{
    if (!s)
        return;
    if (!t) {
        memset(s, 0, sizeof *s);
        return;
    }
    *s = t->sum;
}

int dl_topo_real_pus(const dl_topo *t) { return t ? t->real_pus : 0; }

/* ---- placement ---- */

/* Scatter order. The PUs (in logical order, which is the tree's depth-first order) form a tree
 * with the levels package > NUMA node > L3 > core > PU; a missing level is one group. The order
 * of a group is the round-robin interleave of its children's orders, children in logical
 * order: the first PU of child 0, the first of child 1, ..., then the second of child 0, ...,
 * skipping children that have run out. So consecutive ranks alternate packages first, then
 * NUMA nodes, then L3s, then cores, and PUs of one core (SMT siblings) come last. On a regular
 * machine this is the mixed-radix rule: rank r goes to package r mod P, then within it to L3
 * (r / P) mod L, core (r / (P*L)) mod C, ... e.g. "pack:2 l3:2 core:4 pu:1" gives
 * PUs 0 8 4 12 1 9 5 13 ... Ranks beyond the PU count wrap around the same order. */
static int pu_key(const pu_info *p, int level, int pu_index)
{
    switch (level) {
    case 0: return p->package;
    case 1: return p->numa;
    case 2: return p->l3;
    case 3: return p->core;
    default: return pu_index;
    }
}

#define SCATTER_LEVELS 4

/* Write the scatter order of PUs idx[0..n) (consecutive in logical order) into out[0..n).
 * tmp is scratch of n ints. Groups are the runs of equal key at `level`. */
static void scatter_order(const pu_info *pu, const int *idx, int n, int level, int *out, int *tmp)
{
    if (level >= SCATTER_LEVELS || n <= 1) {
        memcpy(out, idx, (size_t)n * sizeof *idx);
        return;
    }
    /* Order each group into tmp, remembering where groups start. */
    int ngroups = 0;
    for (int i = 0; i < n; i++)
        if (i == 0 ||
            pu_key(&pu[idx[i]], level, idx[i]) != pu_key(&pu[idx[i - 1]], level, idx[i - 1]))
            ngroups++;
    if (ngroups == 1) {
        scatter_order(pu, idx, n, level + 1, out, tmp);
        return;
    }
    int *start = malloc((size_t)(ngroups + 1) * sizeof *start);
    int *taken = calloc((size_t)ngroups, sizeof *taken);
    if (!start || !taken) {
        /* Out of host memory for a few ints: keep logical order rather than fail placement. */
        free(start);
        free(taken);
        memcpy(out, idx, (size_t)n * sizeof *idx);
        return;
    }
    int g = 0;
    for (int i = 0; i < n; i++)
        if (i == 0 ||
            pu_key(&pu[idx[i]], level, idx[i]) != pu_key(&pu[idx[i - 1]], level, idx[i - 1]))
            start[g++] = i;
    start[ngroups] = n;
    /* Recursively order each group: input idx slice, output tmp slice, scratch out slice. */
    for (g = 0; g < ngroups; g++) {
        int len = start[g + 1] - start[g];
        scatter_order(pu, idx + start[g], len, level + 1, tmp + start[g], out + start[g]);
    }
    /* Deal round-robin over the groups. */
    int k = 0;
    while (k < n)
        for (g = 0; g < ngroups; g++)
            if (start[g] + taken[g] < start[g + 1])
                out[k++] = tmp[start[g] + taken[g]++];
    free(start);
    free(taken);
}

/* Renumber raw group ids densely in order of first appearance. Returns the number of groups,
 * or -1 if out of host memory. */
static int densify(const int *raw, int n, int *out)
{
    int lo = raw[0], hi = raw[0];
    for (int i = 1; i < n; i++) {
        if (raw[i] < lo)
            lo = raw[i];
        if (raw[i] > hi)
            hi = raw[i];
    }
    size_t span = (size_t)((long long)hi - lo + 1);
    int *map = malloc(span * sizeof *map);
    if (!map)
        return -1;
    for (size_t i = 0; i < span; i++) map[i] = -1;
    int nn = 0;
    for (int i = 0; i < n; i++) {
        int *m = &map[raw[i] - lo];
        if (*m < 0)
            *m = nn++;
        out[i] = *m;
    }
    free(map);
    return nn;
}

int dl_place(const dl_topo *t, int nranks, dl_place_policy policy, dl_node_kind nodes,
             int ranks_per_node, dl_placement **out)
{
    if (!out)
        return dl_error(DL_EINVAL, "place: null output pointer");
    *out = NULL;
    if (!t)
        return dl_error(DL_EINVAL, "place: null topology");
    if (nranks < 1 || nranks > DL_MAX_RANKS)
        return dl_error(DL_EINVAL, "place: number of ranks %d out of range 1..%d", nranks,
                        DL_MAX_RANKS);
    if (policy != DL_PLACE_COMPACT && policy != DL_PLACE_SCATTER)
        return dl_error(DL_EINVAL, "place: unknown placement policy %d (valid: compact, scatter)",
                        (int)policy);
    if (nodes != DL_NODE_PACKAGE && nodes != DL_NODE_NUMA && nodes != DL_NODE_L3 &&
        nodes != DL_NODE_FIXED)
        return dl_error(DL_EINVAL, "place: unknown node kind %d (valid: package, numa, l3, fixed)",
                        (int)nodes);
    if (nodes == DL_NODE_FIXED && ranks_per_node < 1)
        return dl_error(DL_EINVAL, "place: ranks per node must be >= 1 with nodes=fixed (got %d)",
                        ranks_per_node);

    size_t n = (size_t)nranks;
    /* One block: the struct, then its eight arrays; dl_placement_destroy frees it at once. */
    dl_placement *p = calloc(1, sizeof *p + 8 * n * sizeof(int));
    if (!p)
        return dl_error(DL_ENOMEM, "place: out of host memory for %d ranks", nranks);
    int *base = (int *)(p + 1);
    p->pu = base;
    p->os_pu = base + n;
    p->core = base + 2 * n;
    p->l3 = base + 3 * n;
    p->numa = base + 4 * n;
    p->package = base + 5 * n;
    p->node = base + 6 * n;
    int *raw = base + 7 * n; /* scratch for node ids; not part of the public struct */
    p->nranks = nranks;
    p->wrapped = nranks > t->npus;

    int npus = t->npus;
    int *order = NULL;
    if (policy == DL_PLACE_SCATTER) {
        order = malloc(3 * (size_t)npus * sizeof *order);
        if (!order) {
            free(p);
            return dl_error(DL_ENOMEM, "place: out of host memory");
        }
        int *idx = order + npus, *tmp = order + 2 * (size_t)npus;
        for (int i = 0; i < npus; i++) idx[i] = i;
        scatter_order(t->pu, idx, npus, 0, order, tmp);
    }

    int have_l3 = t->sum.l3s > 0;
    for (int r = 0; r < nranks; r++) {
        int pu = order ? order[r % npus] : r % npus;
        const pu_info *pi = &t->pu[pu];
        p->pu[r] = pu;
        /* a synthetic machine only groups ranks: spread them evenly over the real PUs (rank
         * order), so that a scatter placement does not pile ranks onto a few real cpus */
        p->os_pu[r] = t->real_os[(t->sum.synthetic ? r : pu) % t->real_pus];
        p->core[r] = pi->core;
        p->l3[r] = pi->l3;
        p->numa[r] = pi->numa;
        p->package[r] = pi->package;
        switch (nodes) {
        case DL_NODE_PACKAGE: raw[r] = pi->package; break;
        case DL_NODE_NUMA: raw[r] = pi->numa; break;
        /* No L3 on this machine: group by package instead. */
        case DL_NODE_L3: raw[r] = have_l3 ? pi->l3 : pi->package; break;
        case DL_NODE_FIXED: raw[r] = r / ranks_per_node; break;
        }
    }
    free(order);
    p->nnodes = densify(raw, nranks, p->node);
    if (p->nnodes < 0) {
        free(p);
        return dl_error(DL_ENOMEM, "place: out of host memory");
    }
    *out = p;
    return DL_OK;
}

void dl_placement_destroy(dl_placement *p) { free(p); }

/* ---- binding ---- */

/* The real machine's PU object of OS cpu `os_pu`, after refusing a topology that is not this
 * machine's. */
static int real_pu(const dl_topo *t, int os_pu, hwloc_obj_t *out)
{
    if (!t)
        return dl_error(DL_EINVAL, "bind: null topology");
    /* hwloc loaded from XML or a synthetic string (HWLOC_XMLFILE / HWLOC_SYNTHETIC in the
     * environment) accepts binding calls and binds nothing: refuse rather than pretend. */
    if (!hwloc_topology_is_thissystem(t->real))
        return dl_error(DL_ESYS,
                        "bind: hwloc's topology is not this machine (HWLOC_XMLFILE or "
                        "HWLOC_SYNTHETIC set?); use DISTLAB_TOPOLOGY for planning instead");
    *out = os_pu >= 0 ? hwloc_get_pu_obj_by_os_index(t->real, (unsigned)os_pu) : NULL;
    if (!*out)
        return dl_error(DL_EINVAL, "bind: no cpu %d on this machine (%d PUs)", os_pu, t->real_pus);
    return DL_OK;
}

int dl_topo_bind_self(const dl_topo *t, int os_pu, int *actual)
{
    if (actual)
        *actual = -1;
    hwloc_obj_t pu;
    int rc = real_pu(t, os_pu, &pu);
    if (rc)
        return rc;
    if (hwloc_set_cpubind(t->real, pu->cpuset, HWLOC_CPUBIND_THREAD) != 0)
        return dl_error(DL_ESYS, "bind: binding this thread to cpu %d: %s", os_pu, strerror(errno));
    if (actual) {
        /* sched_setaffinity on the calling thread migrates it before returning. */
        *actual = sched_getcpu();
    }
    return DL_OK;
}

int dl_topo_bind_self_package(const dl_topo *t, int os_pu, char *cpus, size_t len)
{
    if (cpus && len)
        snprintf(cpus, len, "any");
    /* Start on os_pu, where placement put the rank, then widen: threads bound to the package
     * from the start began unevenly spread (8 ranks on 2 cores: 8.8 us per 8-byte all-reduce
     * against 6.2 us pinned, and 6.2 us started on their PU). */
    int rc = dl_topo_bind_self(t, os_pu, NULL);
    if (rc)
        return rc;
    hwloc_obj_t pu = hwloc_get_pu_obj_by_os_index(t->real, (unsigned)os_pu);
    hwloc_obj_t pkg = hwloc_get_ancestor_obj_by_type(t->real, HWLOC_OBJ_PACKAGE, pu);
    hwloc_const_cpuset_t set = pkg ? pkg->cpuset : hwloc_topology_get_allowed_cpuset(t->real);
    if (hwloc_set_cpubind(t->real, set, HWLOC_CPUBIND_THREAD) != 0)
        return dl_error(DL_ESYS, "bind: binding this thread to the package of cpu %d: %s", os_pu,
                        strerror(errno));
    if (cpus && len)
        hwloc_bitmap_list_snprintf(cpus, len, set);
    return DL_OK;
}

/* ---- names ---- */

int dl_place_policy_parse(const char *s, dl_place_policy *out)
{
    if (s && out) {
        if (!strcasecmp(s, "compact")) {
            *out = DL_PLACE_COMPACT;
            return DL_OK;
        }
        if (!strcasecmp(s, "scatter")) {
            *out = DL_PLACE_SCATTER;
            return DL_OK;
        }
    }
    return dl_error(DL_EINVAL, "unknown placement policy \"%s\" (valid: compact, scatter)",
                    s ? s : "(null)");
}

int dl_node_kind_parse(const char *s, dl_node_kind *out)
{
    static const struct {
        const char *name;
        dl_node_kind kind;
    } names[] = {{"package", DL_NODE_PACKAGE},
                 {"numa", DL_NODE_NUMA},
                 {"l3", DL_NODE_L3},
                 {"fixed", DL_NODE_FIXED}};
    if (s && out)
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
            if (!strcasecmp(s, names[i].name)) {
                *out = names[i].kind;
                return DL_OK;
            }
    return dl_error(DL_EINVAL, "unknown node kind \"%s\" (valid: package, numa, l3, fixed)",
                    s ? s : "(null)");
}

const char *dl_place_policy_name(dl_place_policy p)
{
    switch (p) {
    case DL_PLACE_COMPACT: return "compact";
    case DL_PLACE_SCATTER: return "scatter";
    }
    return "unknown";
}

const char *dl_node_kind_name(dl_node_kind k)
{
    switch (k) {
    case DL_NODE_PACKAGE: return "package";
    case DL_NODE_NUMA: return "numa";
    case DL_NODE_L3: return "l3";
    case DL_NODE_FIXED: return "fixed";
    }
    return "unknown";
}

/* ---- report ---- */

static void print_bytes(FILE *f, long long b)
{
    if (b >= (1LL << 30) && b % (1LL << 30) == 0)
        fprintf(f, "%lld GiB", b >> 30);
    else if (b >= (1LL << 20) && b % (1LL << 20) == 0)
        fprintf(f, "%lld MiB", b >> 20);
    else if (b >= (1LL << 10) && b % (1LL << 10) == 0)
        fprintf(f, "%lld KiB", b >> 10);
    else
        fprintf(f, "%lld B", b);
}

static const char *plural(int n, const char *one, const char *many) { return n == 1 ? one : many; }

void dl_topo_report(FILE *f, const dl_topo *t, const dl_placement *p, const int *actual_cpu)
{
    if (!f)
        f = stdout;
    if (!t)
        return;
    const dl_topo_summary *s = &t->sum;
    if (s->synthetic)
        fprintf(f, "topology: synthetic: %s\n", s->desc);
    else
        fprintf(f, "topology: this machine\n");
    fprintf(f, "  %d %s, %d %s, ", s->pus, plural(s->pus, "PU", "PUs"), s->cores,
            plural(s->cores, "core", "cores"));
    if (s->l3s > 0) {
        fprintf(f, "%d L3 (", s->l3s);
        print_bytes(f, s->l3_bytes);
        fprintf(f, "%s), ", s->l3s > 1 ? " each" : "");
    } else {
        fprintf(f, "no L3, ");
    }
    fprintf(f, "%d NUMA %s, %d %s\n", s->numas, plural(s->numas, "node", "nodes"), s->packages,
            plural(s->packages, "package", "packages"));
    if (s->synthetic)
        fprintf(f,
                "  binding: rank r runs on real PU (r mod %d) of this machine; the synthetic "
                "machine only groups ranks\n",
                t->real_pus);
    if (!p)
        return;

    fprintf(f, "placement: %d %s on %d %s\n", p->nranks, plural(p->nranks, "rank", "ranks"),
            p->nnodes, plural(p->nnodes, "node", "nodes"));
    if (p->wrapped)
        fprintf(f, "warning: %d ranks on %d PUs: placement wraps (oversubscribed)\n", p->nranks,
                t->npus);
    else if (p->nranks > t->real_pus)
        fprintf(f,
                "warning: %d ranks on %d real PUs of this machine: threads share cpus "
                "(oversubscribed)\n",
                p->nranks, t->real_pus);
    if (t->syn) {
        /* Binding follows the synthetic PU index modulo the real PU count (the contract in
         * topo.h), which can pile ranks onto a few real cpus (e.g. scatter picks only even
         * PUs first): say so, since timings would be skewed. */
        int *load = calloc((size_t)t->real_pus, sizeof *load);
        if (load) {
            for (int r = 0; r < p->nranks; r++)
                for (int i = 0; i < t->real_pus; i++)
                    if (t->real_os[i] == p->os_pu[r]) {
                        load[i]++;
                        break;
                    }
            int lo = load[0], hi = load[0];
            for (int i = 1; i < t->real_pus; i++) {
                lo = load[i] < lo ? load[i] : lo;
                hi = load[i] > hi ? load[i] : hi;
            }
            if (hi - lo > 1)
                fprintf(f,
                        "warning: binding on this machine is unbalanced: %d to %d ranks per "
                        "real cpu\n",
                        lo, hi);
            free(load);
        }
    }
    fprintf(f, "%5s %5s %7s %5s %5s %5s %8s %5s", "rank", "pu", "os_cpu", "core", "l3", "numa",
            "package", "node");
    if (actual_cpu)
        fprintf(f, " %7s", "actual");
    fputc('\n', f);
    int mismatches = 0;
    for (int r = 0; r < p->nranks; r++) {
        fprintf(f, "%5d %5d %7d %5d %5d %5d %8d %5d", r, p->pu[r], p->os_pu[r], p->core[r],
                p->l3[r], p->numa[r], p->package[r], p->node[r]);
        if (actual_cpu) {
            fprintf(f, " %7d", actual_cpu[r]);
            if (actual_cpu[r] != p->os_pu[r]) {
                fputs("  (not where placed)", f);
                mismatches++;
            }
        }
        fputc('\n', f);
    }
    if (mismatches)
        fprintf(f, "warning: %d %s not running on the cpu placed on\n", mismatches,
                plural(mismatches, "rank is", "ranks are"));
}
