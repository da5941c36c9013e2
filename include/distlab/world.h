/* distlab: the world, its rank threads ("GPUs") and their contexts.
 *
 * dl_world_run() starts N rank threads (N may exceed the number of PUs; placement then wraps),
 * binds each (dl_world_opts.bind: to its own PU while the ranks fit the machine, to its package's
 * PUs when they do not, so the kernel can move a rank off a busy core), gives it a context (rank, size, node, world communicator, arena, stats),
 * runs the rank function on each, joins them and returns the first error.
 *
 * Failure is loud and bounded: a rank whose function fails aborts the world, and every other
 * rank leaves its wait with DL_EABORT. A watchdog turns a hang into DL_ETIMEOUT naming the
 * operation, its sequence number and the ranks that never arrived; each rank's flight recorder
 * of its last operations is printed with such an error. */
#ifndef DISTLAB_WORLD_H
#define DISTLAB_WORLD_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dl_world dl_world;
typedef struct dl_ctx dl_ctx;
typedef struct dl_comm dl_comm;

/* How ranks are placed on the machine's PUs. */
typedef enum dl_place_policy {
    DL_PLACE_COMPACT = 0, /* rank i on PU i: neighbours share caches */
    DL_PLACE_SCATTER = 1  /* spread ranks round-robin over packages, then L3s, then cores */
} dl_place_policy;

/* What groups ranks into "nodes" (dl_ctx_node, the intra/inter-node byte counters). */
typedef enum dl_node_kind {
    DL_NODE_PACKAGE = 0, /* one node per package (socket) */
    DL_NODE_NUMA = 1,    /* one node per NUMA node */
    DL_NODE_L3 = 2,      /* one node per L3 domain */
    DL_NODE_FIXED = 3    /* a fixed number of ranks per node (ranks_per_node) */
} dl_node_kind;

/* How rank threads are bound to the real machine's cpus (dl_world_opts.bind). Oversubscribed, a
 * rank pinned to one PU that shares it with a busy thread (another rank, another process) waits a
 * whole time slice per hand-off; bound to its package, the kernel moves it to a free PU. */
typedef enum dl_bind_kind {
    DL_BIND_AUTO = -1,  /* DL_BIND_PU when the ranks fit the real PUs, else DL_BIND_PACKAGE */
    DL_BIND_NONE = 0,   /* not bound: the threads keep the process's affinity */
    DL_BIND_PU = 1,     /* each rank to the one PU placement gave it */
    DL_BIND_PACKAGE = 2 /* each rank to every PU of the package holding its placed PU */
} dl_bind_kind;

/* ---- a rank's memory ("GPU memory") ---------------------------------------------------------
 * Every tensor a rank owns is allocated from its arena (dl_ctx_arena) under a category, so that
 * memory per rank is measured, not estimated. Allocations are page-aligned (4096 B). A capacity
 * (dl_world_opts.gpu_mem) turns an over-allocation into DL_ENOMEM with a message naming the
 * rank, the category, the bytes asked and the bytes left. An arena is thread-safe. */
typedef struct dl_arena dl_arena;

typedef enum dl_mem_category {
    DL_MEM_PARAMS = 0,
    DL_MEM_GRADS,
    DL_MEM_OPTIMIZER,
    DL_MEM_ACTIVATIONS,
    DL_MEM_COMM,
    DL_MEM_OTHER,
    DL_MEM_CKPT,    /* a full-state checkpoint's snapshot, written while training goes on */
    DL_MEM_KVCACHE, /* token-level pipelining: the keys and values of a sequence's earlier slices */
    DL_MEM_NCATEGORIES
} dl_mem_category;

typedef struct dl_arena_stats {
    uint64_t current[DL_MEM_NCATEGORIES]; /* bytes live now, per category */
    uint64_t peak[DL_MEM_NCATEGORIES];    /* highest `current` seen, per category */
    uint64_t current_total;               /* sum of current over categories */
    uint64_t peak_total;                  /* highest current_total seen */
    uint64_t capacity;                    /* 0 = unlimited */
    uint64_t allocations;                 /* number of successful allocations so far */
} dl_arena_stats;

/* Name of a category ("params", "grads", "optimizer", "activations", "comm", "other", "ckpt"). */
const char *dl_mem_category_name(dl_mem_category cat);

/* Allocate `bytes` (0 is allowed and returns a valid unique pointer) page-aligned, zeroed.
 * Fails with DL_ENOMEM if the capacity would be exceeded; nothing already allocated is touched. */
int dl_arena_alloc(dl_arena *a, dl_mem_category cat, size_t bytes, void **out);
/* Free a pointer from dl_arena_alloc (NULL is ignored). */
void dl_arena_free(dl_arena *a, void *p);

/* The arena's current and peak bytes per category. */
void dl_arena_get_stats(const dl_arena *a, dl_arena_stats *st);
/* Reset the peaks to the current values (e.g. before a measured step). */
void dl_arena_reset_peaks(dl_arena *a);

/* ---- the world ------------------------------------------------------------------------------ */

typedef struct dl_world_opts {
    int nranks;             /* >= 1 (default 2) */
    const char *topology;   /* synthetic topology string, NULL: DISTLAB_TOPOLOGY or the machine */
    dl_place_policy policy; /* default compact */
    dl_node_kind nodes;     /* default package */
    int ranks_per_node;     /* for DL_NODE_FIXED */
    int bind;               /* a dl_bind_kind (default DL_BIND_AUTO; 1 = DL_BIND_PU, 0 = none) */
    uint64_t gpu_mem;       /* arena capacity per rank in bytes, 0 = unlimited (default) */
    double timeout_s;       /* watchdog timeout (default 60; <= 0 disables) */
    int wait_mode;          /* -1 auto (default): yield when ranks exceed cores; 0 spin, 1 yield
                               * (then sleep on a futex, either way) */
    int nslots;             /* slots per channel (default 16) */
    size_t eager_bytes;     /* eager payload per slot (default 4096) */
    size_t slice_bytes;     /* collective slice size (default 256 KiB) */
    FILE *log; /* where watchdog/flight-recorder reports go (default stderr; NULL: none) */
    int quiet; /* 1: don't print the flight recorder (printed for DL_ETIMEOUT and
                               * DL_EMISMATCH, with the error line) */
    int mpi;   /* span the processes of MPI_COMM_WORLD (distlab/mpi.h): -1 auto
                               * (default: when dl_mpi_init was called and there are several
                               * processes), 0 never, 1 always. Spanning P processes, nranks is
                               * the whole world (a multiple of P) and process k hosts ranks
                               * k*nranks/P ... (k+1)*nranks/P-1; each process is one node. */
    size_t mpi_slice_bytes; /* worlds spanning MPI processes: the slice of communicators whose
                               * ranks live in several processes (default 128 KiB; 0: slice_bytes) */
} dl_world_opts;

/* The defaults written beside each field. */
void dl_world_opts_init(dl_world_opts *o);

typedef int (*dl_rank_fn)(dl_ctx *ctx, void *arg);

/* Run `fn(ctx, arg)` on `o->nranks` rank threads. Returns DL_OK or the first error; the calling
 * thread's dl_errmsg() then names the rank and what failed. */
int dl_world_run(const dl_world_opts *o, dl_rank_fn fn, void *arg);

/* Same, but keep the world to query it afterwards (placement, stats); free with
 * dl_world_destroy. `*out` is set even when the run fails (NULL only on bad options). */
int dl_world_run_keep(const dl_world_opts *o, dl_rank_fn fn, void *arg, dl_world **out);
void dl_world_destroy(dl_world *w);
/* cpu each rank reported after pinning (-1 if not bound to one PU) */
int dl_world_actual_cpu(const dl_world *w, int rank);
/* rank whose error was first (-1 if none) */
int dl_world_error_rank(const dl_world *w);
/* 1 if ranks exceed the real machine's PUs */
int dl_world_oversubscribed(const dl_world *w);
/* The ranks this process hosts: [*first, *first + *count) (all of them unless the world spans
 * MPI processes); returns the number of processes the world spans. */
int dl_world_local(const dl_world *w, int *first, int *count);

/* --- inside a rank function --- */
int dl_ctx_rank(const dl_ctx *c);
int dl_ctx_size(const dl_ctx *c);
int dl_ctx_node(const dl_ctx *c); /* node index of this rank */
int dl_ctx_nnodes(const dl_ctx *c);
int dl_ctx_cpu(const dl_ctx *c); /* cpu this rank reported after pinning (-1: not on one PU) */
/* The cpus this rank's threads may run on, as a cpu list: "3" when pinned to one PU, its
 * package's set ("0-15") with DL_BIND_PACKAGE, "any" when not bound. */
const char *dl_ctx_cpus(const dl_ctx *c);
dl_comm *dl_ctx_comm(dl_ctx *c); /* the world communicator */
dl_arena *dl_ctx_arena(dl_ctx *c);
dl_world *dl_ctx_world(dl_ctx *c);
const dl_world_opts *dl_ctx_opts(const dl_ctx *c);
/* 1 when the world has been aborted (a rank failed or the watchdog fired). */
int dl_ctx_aborted(const dl_ctx *c);

/* Flight recorder: the last operations of this rank, oldest first. */
void dl_ctx_flight_dump(const dl_ctx *c, FILE *f);

#ifdef __cplusplus
}
#endif
#endif
