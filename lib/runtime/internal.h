/* Internal structures shared by world.c, comm.c and coll.c. Not installed. */
#ifndef DISTLAB_RUNTIME_INTERNAL_H
#define DISTLAB_RUNTIME_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include "distlab.h"
#include "core/topo.h"
#include "transport/chan.h"

/* Operation codes, used by the flight recorder, the watchdog and message fingerprints. */
typedef enum dl_opcode {
    OP_NONE = 0,
    OP_ALLREDUCE,
    OP_REDUCE_SCATTER,
    OP_ALLGATHER,
    OP_BROADCAST,
    OP_REDUCE,
    OP_ALLTOALL,
    OP_BARRIER,
    OP_SEND,
    OP_RECV,
    OP_SPLIT,
    OP_ALLTOALLV,
    OP_NCODES
} dl_opcode;

const char *dl__opname(int op);

/* How far one member got, on a cache line of its own: every member writes its own at the start of
 * every collective, and sharing a line cost the 8-byte all-reduce ~12 ns (a line transfer ahead
 * of the message's, in store order). */
typedef struct dl_entered {
    _Alignas(64) atomic_ullong seq;
} dl_entered;

/* What every member of a communicator shares: its members, its links, and how far each member
 * got (for the watchdog's "never arrived"). */
typedef struct dl_comm_shared {
    int n;
    int *world_ranks;          /* [n] */
    uint64_t uid;              /* 0 = world */
    _Atomic(dl_link *) *links; /* [n * n], src * n + dst, created on first use */
    dl_entered *entered;       /* [n] highest sequence number each member started */
    atomic_int refs;           /* members that have not freed it yet */
    dl_world *w;
    struct dl_comm_shared *next; /* world's registry (for abort wake-ups) */
    /* MPI worlds, hierarchical all-reduce: [0] this process's members, [1 + j] the j-th member
     * of every process (created on first use, under the world's hier_mu) */
    struct dl_comm_shared **hier;
} dl_comm_shared;

/* A rank's view of a communicator. */
struct dl_comm {
    dl_comm_shared *sh;
    int rank;
    dl_ctx *ctx;
    uint64_t seq; /* operations started (the same on every member) */
    dl_algo algo, last_algo;
    dl_comm_stats st;
    uint64_t cid; /* MPI worlds: the communicator's id in MPI tags (0 = world) */
    struct dl_comm *h_intra, *h_inter; /* hierarchical all-reduce: this member's views */
    void *scratch; /* rank's scratch buffer for reduce / reduce-scatter partials */
    size_t scratch_bytes;
    int label; /* dl__comm_label for injected faults (runtime/fault.h; 0: none) */
};

/* Flight recorder entry. */
typedef struct dl_flight {
    int op;
    int status;
    uint64_t comm_uid, seq;
    size_t count;
    int dtype;
    int peer; /* root or peer, -1 if none */
    uint64_t t_start, t_end;
} dl_flight;

#define DL_FLIGHT_N 16

struct dl_request {
    int kind; /* dl_opcode */
    dl_comm *c;
    const void *sbuf;
    void *rbuf;
    size_t count;
    dl_dtype t;
    dl_redop op;
    int root; /* point-to-point: the peer */
    dl_purpose p;
    int status;
    char errmsg[512];
    atomic_int done;
    int skip; /* the test hook's skipped reduction (lib/core/testhook.h): local result only */
    /* alltoallv: sendcounts, sdispls, recvcounts, rdispls (lib/coll/alltoallv.c) */
    const size_t *v[4];
    int agreed; /* the call failed alike on every member (alltoallv's count check): no abort */
    /* point-to-point (lib/coll/p2p.c) */
    int tag;
    int nb;              /* dl_isend / dl_irecv: on the heap, freed by dl_wait */
    int posted;          /* a send whose message is on its link */
    int own;             /* an isend posted on the caller's thread, which polls it (not queued) */
    dl_link *link;       /* a posted send's link */
    uint64_t until;      /* a posted send is done once its link released this many messages */
    atomic_ullong wait0; /* when the caller began waiting for it (the timeout counts from here) */
    struct dl_request *next;
};

/* Communication thread of a rank (for non-blocking collectives). */
typedef struct dl_progress {
    pthread_t th;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* new work or stop */
    pthread_cond_t done_cv; /* a request completed */
    dl_request *head, *tail;
    dl_request *poll;   /* point-to-point requests the thread started and polls (p2p.c) */
    dl_request *mine;   /* isends posted on the rank's own thread, not yet waited for */
    atomic_int pending; /* requests queued, running or polled */
    int stop;
} dl_progress;

struct dl_ctx {
    dl_world *w;
    int rank;
    int cpu; /* the PU the rank thread was pinned to, -1: not pinned to one */
    int node;
    dl_arena *arena;
    dl_comm *world_comm;
    dl_waiter waiter;
    int status;
    char errmsg[1024];

    /* what the rank is doing now, for the watchdog (atomics: read by the watchdog thread) */
    _Atomic(dl_comm_shared *) cur_sh;
    atomic_ullong cur_seq;
    atomic_int cur_op;
    atomic_int cur_peer;
    atomic_ullong cur_t0;
    atomic_int cur_active;

    dl_flight flight[DL_FLIGHT_N];
    uint64_t nflight;
    unsigned long test_reductions; /* reductions of the test hook's purpose started (testhook.h) */

    dl_progress prog;
    char cpus[96]; /* the cpus it may run on (dl_ctx_cpus); last: the hot fields keep their lines */
};

/* The transport between the processes of a world that spans several: links to ranks in other
 * processes and the communicator ids their messages carry. Set by that transport when the
 * world begins (transport/mpi.c); NULL in a world of one process. Communicators use only this,
 * so a transport between processes adds itself without touching them or the algorithms. */
typedef struct dl_remote_ops {
    int (*link_create)(dl_world *w, uint64_t cid, int src, int dst, dl_link **out);
    uint64_t (*new_cid)(dl_world *w); /* an id unique in the job */
} dl_remote_ops;

struct dl_world {
    dl_world_opts opts;
    int n;
    int oversub;
    dl_topo *topo;
    dl_placement *place;
    struct dl_ctx *ctxs;
    pthread_t *threads;
    atomic_int abort_flag;
    atomic_ullong next_uid;

    pthread_mutex_t err_mu;
    int err_status, err_rank;
    char err_msg[2048];

    pthread_mutex_t reg_mu;
    dl_comm_shared *registry;
    dl_comm_shared *world_sh;

    pthread_mutex_t wd_mu;
    pthread_cond_t wd_cv;
    int wd_stop;
    pthread_t wd;

    /* a world spanning MPI processes (NULL otherwise): this process hosts ranks [lo, hi) */
    struct dl_mpi_world *mpi;
    const dl_remote_ops *remote; /* the transport between processes (NULL: one process) */
    int nprocs, proc, lo, hi;
    pthread_mutex_t hier_mu;
    int bind; /* the dl_bind_kind in force (DL_BIND_AUTO resolved) */
    /* rd's small all-reduces gather every input in one round instead of log2 n exchanges
     * (oversubscribed, where each exchange waits for the scheduler; one process: every member
     * must agree) */
    int rd_one_round;
};

static inline int dl__local(const dl_world *w, int rank) { return rank >= w->lo && rank < w->hi; }

/* world.c */
void dl__world_fail(dl_world *w, int rank, int status, const char *msg);
/* an error another process reported (MPI worlds): recorded and aborts, not sent on */
void dl__world_fail_remote(dl_world *w, int rank, int status, const char *msg);
void dl__world_abort(dl_world *w);
/* Bind the calling thread (a rank's, or its communication thread) as the world binds rank
 * x->rank; with `note`, record in x->cpu / x->cpus what came of it. */
void dl__bind_thread(dl_ctx *x, int note);
void dl__op_begin(dl_comm *c, int op, size_t count, int dtype, int peer);
void dl__op_end(dl_comm *c, int status);

/* comm.c */
int dl__shared_create(dl_world *w, int n, const int *world_ranks, dl_comm_shared **out);
void dl__shared_unref(dl_comm_shared *sh);
int dl__comm_create(dl_comm_shared *sh, int rank, dl_ctx *ctx, dl_comm **out);
/* the link from member src to member dst of c, created by whichever end needs it first; the
 * lookup of an existing one inline (it is on every collective's path, before its first post) */
int dl__link_create(dl_comm *c, int src, int dst, dl_link **out);
static inline int dl__link(dl_comm *c, int src, int dst, dl_link **out)
{
    dl_comm_shared *sh = c->sh;
    dl_link *l = atomic_load_explicit(&sh->links[(size_t)src * (size_t)sh->n + (size_t)dst],
                                      memory_order_acquire);
    if (!l)
        return dl__link_create(c, src, dst, out);
    *out = l;
    return DL_OK;
}
/* dl_dtype_size, inline for the collectives' paths */
static inline size_t dl__dtype_size(dl_dtype t)
{
    switch (t) {
    case DL_F32: return 4;
    case DL_F64: return 8;
    case DL_BF16: return 2;
    default: return 0;
    }
}
int dl__scratch(dl_comm *c, size_t bytes, void **out);

/* coll.c */
void dl__progress_stop(dl_ctx *ctx);

/* mpi.c: worlds spanning MPI processes (stubs returning errors without MPI) */
int dl__mpi_want(const dl_world_opts *o); /* 1: this world spans processes */
int dl__mpi_world_begin(dl_world *w);     /* sets mpi, nprocs, proc, lo, hi */
void dl__mpi_world_end(dl_world *w);      /* stops listening for other processes' errors */
void dl__mpi_world_free(dl_world *w);     /* after the links: the world's MPI state */
void dl__mpi_notify(dl_world *w, int rank, int status, const char *msg); /* tell the others */
/* the id of the j-th cross-process group of communicator id cid's hierarchical all-reduce */
static inline uint64_t dl__mpi_sub_cid(uint64_t cid, int j) { return cid + 1 + (uint64_t)j; }

#endif
