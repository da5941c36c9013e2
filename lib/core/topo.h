/* distlab (private): machine topology (hwloc), rank placement and pinning.
 *
 * The real machine is always what threads are bound to. A synthetic topology string (as hwloc
 * takes it, e.g. "pack:2 l3:2 core:4 pu:1") only changes how ranks are grouped into "nodes" and
 * what the report says; with one, placement is computed on the synthetic machine and rank r is
 * bound to real PU (r mod the real PU count), so that ranks stay spread over the real cpus. */
#ifndef DISTLAB_CORE_TOPO_H
#define DISTLAB_CORE_TOPO_H

#include <stdio.h>
#include "distlab/world.h" /* dl_place_policy, dl_node_kind */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dl_topo dl_topo;

typedef struct dl_topo_summary {
    int pus, cores, l3s, numas, packages;
    int synthetic;      /* 1 if built from a synthetic string */
    long long l3_bytes; /* size of the first L3 (0 if none) */
    long long l2_bytes; /* size of the first L2 (0 if none) */
    char desc[256];     /* the synthetic string, or "this machine" */
} dl_topo_summary;

/* Load the topology: the real machine if `synthetic` is NULL or empty; otherwise the synthetic
 * string. If `synthetic` is NULL the environment variable DISTLAB_TOPOLOGY is consulted. The real
 * machine is always loaded too (for binding). */
int dl_topo_load(dl_topo **out, const char *synthetic);

/* Caps on a synthetic string, checked before hwloc builds it (hwloc's time and memory grow
 * with the objects: 1e5 PUs take minutes and gigabytes): at most DL_TOPO_MAX_PUS PUs (the
 * product of the levels' counts) and DL_TOPO_MAX_DEPTH levels; more is DL_EINVAL naming the
 * cap. */
#define DL_TOPO_MAX_PUS 4096
#define DL_TOPO_MAX_DEPTH 16
void dl_topo_destroy(dl_topo *t);
void dl_topo_get_summary(const dl_topo *t, dl_topo_summary *s);
/* PUs of the real machine (what binding uses). */
int dl_topo_real_pus(const dl_topo *t);

typedef struct dl_placement {
    int nranks;
    int wrapped;  /* 1 if nranks exceeds the (real or synthetic) PU count and placement wraps */
    int nnodes;   /* number of distinct nodes used */
    int *pu;      /* [nranks] logical PU index in the (synthetic or real) topology */
    int *os_pu;   /* [nranks] OS cpu index on the real machine the rank is bound to */
    int *core;    /* [nranks] core index */
    int *l3;      /* [nranks] L3 index (-1 if none) */
    int *numa;    /* [nranks] NUMA index */
    int *package; /* [nranks] package index */
    int *node;    /* [nranks] node index, 0..nnodes-1 */
} dl_placement;

/* Place `nranks` ranks. `ranks_per_node` is used only with DL_NODE_FIXED. */
int dl_place(const dl_topo *t, int nranks, dl_place_policy policy, dl_node_kind nodes,
             int ranks_per_node, dl_placement **out);
void dl_placement_destroy(dl_placement *p);

/* Bind the calling thread to the real OS cpu `os_pu` and return (in *actual) the cpu it is
 * running on afterwards (sched_getcpu), so that pinning is verified. */
int dl_topo_bind_self(const dl_topo *t, int os_pu, int *actual);
/* Move the calling thread to OS cpu `os_pu`, then bind it to every PU of the real package
 * holding it (all allowed PUs when hwloc shows no package), so that the kernel may move it off a
 * busy cpu; `cpus` (may be NULL) gets that set as a cpu list ("0-7", "any" on failure). */
int dl_topo_bind_self_package(const dl_topo *t, int os_pu, char *cpus, size_t len);

/* Parse "compact"/"scatter" and "package"/"numa"/"l3"/"fixed" (names used on command lines). */
int dl_place_policy_parse(const char *s, dl_place_policy *out);
int dl_node_kind_parse(const char *s, dl_node_kind *out);
const char *dl_place_policy_name(dl_place_policy p);
const char *dl_node_kind_name(dl_node_kind k);

/* Print the topology summary and the rank -> PU -> node table (what `distlab-bench topo`
 * shows). `actual_cpu` may be NULL or hold the cpu each rank reported after binding. */
void dl_topo_report(FILE *f, const dl_topo *t, const dl_placement *p, const int *actual_cpu);

/* What a world says of its placement beyond the public API (lib/runtime/world.c). */
const dl_placement *dl_world_placement(const dl_world *w);
const dl_topo *dl_world_topo(const dl_world *w);

#ifdef __cplusplus
}
#endif
#endif
