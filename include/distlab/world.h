/* distlab: the world, its rank threads ("GPUs") and their contexts.
 *
 * dl_world_run() starts N rank threads (N may exceed the number of PUs; placement then wraps),
 * pins each to a PU, gives it a context (rank, size, node, world communicator, arena, stats),
 * runs the rank function on each, joins them and returns the first error.
 *
 * Failure is loud and bounded: a rank whose function fails aborts the world, and every other
 * rank leaves its wait with DL_EABORT. A watchdog turns a hang into DL_ETIMEOUT naming the
 * operation, its sequence number and the ranks that never arrived; each rank's flight recorder
 * of its last operations is printed with such an error. */
#ifndef DISTLAB_WORLD_H
#define DISTLAB_WORLD_H

#include <stdint.h>
#include <stdio.h>
#include "distlab/topo.h"
#include "distlab/arena.h"
#include "distlab/chan.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dl_world dl_world;
typedef struct dl_ctx dl_ctx;
typedef struct dl_comm dl_comm;

typedef struct dl_world_opts {
    int nranks;               /* >= 1 (default 2) */
    const char *topology;     /* synthetic topology string, NULL: DISTLAB_TOPOLOGY or the machine */
    dl_place_policy policy;   /* default compact */
    dl_node_kind nodes;       /* default package */
    int ranks_per_node;       /* for DL_NODE_FIXED */
    int bind;                 /* pin rank threads (default 1) */
    uint64_t gpu_mem;         /* arena capacity per rank in bytes, 0 = unlimited (default) */
    double timeout_s;         /* watchdog timeout (default 60; <= 0 disables) */
    int wait_mode;            /* -1 auto (default): yield when ranks exceed cores; else dl_wait_mode */
    int nslots;               /* slots per channel (default 16) */
    size_t eager_bytes;       /* eager payload per slot (default 4096) */
    size_t slice_bytes;       /* collective slice size (default 256 KiB) */
    FILE *log;                /* where watchdog/flight-recorder reports go (default stderr; NULL: none) */
    int quiet;                /* 1: don't print the flight recorder (printed for DL_ETIMEOUT and
                               * DL_EMISMATCH, with the error line) */
    int mpi;                  /* span the processes of MPI_COMM_WORLD (distlab/mpi.h): -1 auto
                               * (default: when dl_mpi_init was called and there are several
                               * processes), 0 never, 1 always. Spanning P processes, nranks is
                               * the whole world (a multiple of P) and process k hosts ranks
                               * k*nranks/P ... (k+1)*nranks/P-1; each process is one node. */
    size_t mpi_slice_bytes;   /* worlds spanning MPI processes: the slice of communicators whose
                               * ranks live in several processes (default 128 KiB; 0: slice_bytes) */
} dl_world_opts;

void dl_world_opts_init(dl_world_opts *o);

typedef int (*dl_rank_fn)(dl_ctx *ctx, void *arg);

/* Run `fn(ctx, arg)` on `o->nranks` rank threads. Returns DL_OK or the first error; the calling
 * thread's dl_errmsg() then names the rank and what failed. */
int dl_world_run(const dl_world_opts *o, dl_rank_fn fn, void *arg);

/* Same, but keep the world to query it afterwards (placement, stats); free with
 * dl_world_destroy. `*out` is set even when the run fails (NULL only on bad options). */
int dl_world_run_keep(const dl_world_opts *o, dl_rank_fn fn, void *arg, dl_world **out);
void dl_world_destroy(dl_world *w);
const dl_placement *dl_world_placement(const dl_world *w);
const dl_topo *dl_world_topo(const dl_world *w);
/* cpu each rank reported after pinning (-1 if not bound) */
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
int dl_ctx_node(const dl_ctx *c);        /* node index of this rank */
int dl_ctx_nnodes(const dl_ctx *c);
int dl_ctx_cpu(const dl_ctx *c);         /* cpu this rank reported after pinning (-1: not bound) */
dl_comm *dl_ctx_comm(dl_ctx *c);         /* the world communicator */
dl_arena *dl_ctx_arena(dl_ctx *c);
const dl_waiter *dl_ctx_waiter(const dl_ctx *c);
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
