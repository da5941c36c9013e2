/* distlab: communicators, point-to-point, the parallelism mesh, and byte counters.
 *
 * A communicator is an ordered group of ranks with its own ring (rank i sends to i+1 mod n) and
 * its own links, so that collectives on different communicators never interleave on a link.
 * dl_comm_split(color, key) works like MPI_Comm_split. dl_mesh_create builds the dp / pp / tp
 * (/ ep) groups of a 3-D/4-D layout with Megatron's rank order: tp varies fastest, then dp
 * (ep subdivides dp), then pp. Every communicator numbers its operations (a sequence number per
 * communicator, the same on every member) and counts the bytes each rank sends and receives by
 * purpose. */
#ifndef DISTLAB_COMM_H
#define DISTLAB_COMM_H

#include <stddef.h>
#include <stdint.h>
#include "distlab/world.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DL_UNDEFINED (-1)

typedef enum dl_dtype { DL_F32 = 0, DL_F64 = 1, DL_BF16 = 2, DL_NDTYPES } dl_dtype;
typedef enum dl_redop { DL_SUM = 0, DL_AVG = 1, DL_MAX = 2, DL_NREDOPS } dl_redop;

/* Why bytes move; the caller says, the counters keep them apart. */
typedef enum dl_purpose {
    DL_PURPOSE_GRADS = 0,
    DL_PURPOSE_PARAMS,
    DL_PURPOSE_ACTIVATIONS,
    DL_PURPOSE_LOSS, /* loss, norms and other scalars */
    DL_PURPOSE_OTHER,
    DL_NPURPOSES
} dl_purpose;

/* Collective algorithms (all-reduce; the other collectives always use the ring or a chain).
 * AUTO (the default) picks, for messages up to the eager size, a one-shot exchange (n = 2, or n
 * <= 8 not a power of two) or recursive doubling (powers of two), and the ring otherwise.
 * ONESHOT and RD apply only where they can (messages up to the eager size; RD at powers of two);
 * elsewhere the ring runs. dl_comm_last_algo() always says what ran. */
typedef enum dl_algo {
    DL_ALGO_AUTO = 0,
    DL_ALGO_RING = 1,
    DL_ALGO_ONESHOT = 2, /* every rank sends its whole input to every other (small n, small data) */
    DL_ALGO_RD = 3,      /* recursive doubling (power-of-two sizes) */
    DL_ALGO_HIER = 4,    /* hierarchical, in a world spanning MPI processes: reduce-scatter inside
                           * each process, all-reduce of the shard across processes, all-gather
                           * inside; AUTO picks it for messages above the eager size when every
                           * process holds the same number (>= 2) of the communicator's members */
    DL_NALGOS
} dl_algo;

/* Bytes of one element, and the names the command lines and reports use ("f32", "sum",
 * "grads", "ring"). */
size_t dl_dtype_size(dl_dtype t);
const char *dl_dtype_name(dl_dtype t);
const char *dl_redop_name(dl_redop op);
const char *dl_purpose_name(dl_purpose p);
const char *dl_algo_name(dl_algo a);
int dl_dtype_parse(const char *s, dl_dtype *out); /* "f32"|"float", "f64"|"double", "bf16" */
int dl_redop_parse(const char *s, dl_redop *out); /* "sum", "avg", "max" */
int dl_algo_parse(const char *s, dl_algo *out);   /* "auto", "ring", "oneshot", "rd" */

/* The block of a count-element buffer that rank r of n owns in reduce-scatter / all-gather:
 * the first count % n ranks get one element more. */
void dl_block(size_t count, int n, int r, size_t *offset, size_t *len);

/* This rank's index in c, and c's number of members. */
int dl_comm_rank(const dl_comm *c);
int dl_comm_size(const dl_comm *c);
int dl_comm_world_rank(const dl_comm *c, int r); /* world rank of member r */
dl_ctx *dl_comm_ctx(dl_comm *c);
/* Collective over c: members with the same color form a new communicator ordered by (key, old
 * rank). color DL_UNDEFINED gives *out = NULL. */
int dl_comm_split(dl_comm *c, int color, int key, dl_comm **out);
/* Collective over the members; NULL is ignored. The world communicator is freed by the world. */
int dl_comm_free(dl_comm *c);

/* Algorithm for this rank's collectives on c (every member must set the same). */
void dl_comm_set_algo(dl_comm *c, dl_algo a);
dl_algo dl_comm_get_algo(const dl_comm *c);
/* Algorithm the last collective on c actually ran. */
dl_algo dl_comm_last_algo(const dl_comm *c);

typedef struct dl_comm_stats {
    uint64_t bytes_sent[DL_NPURPOSES];
    uint64_t bytes_recv[DL_NPURPOSES];
    uint64_t msgs_sent, msgs_recv;
    uint64_t ops;                 /* operations started on this communicator (its sequence) */
    uint64_t algo_ops[DL_NALGOS]; /* collectives run with each algorithm */
    uint64_t wait_ns, copy_ns;    /* summed over this communicator's links */
    uint64_t sleeps;              /* waits that slept on a futex (this rank's ends of its links) */
    uint64_t bytes_sent_inter; /* the part of bytes_sent / bytes_recv (all purposes) that crossed */
    uint64_t bytes_recv_inter; /* nodes: processes of an MPI world, the placement's nodes else */
} dl_comm_stats;

/* This rank's counters on c. */
void dl_comm_get_stats(const dl_comm *c, dl_comm_stats *st);
void dl_comm_reset_stats(dl_comm *c);

/* Point-to-point (comm ranks). dl_send returns when the receiver holds the data (small
 * messages: when it is copied). Messages between a pair arrive in order. Like a blocking
 * collective, a point-to-point call made while non-blocking requests are pending on the rank
 * runs after them (every call below). */
int dl_send(dl_comm *c, const void *buf, size_t count, dl_dtype t, int peer, dl_purpose p);
int dl_recv(dl_comm *c, void *buf, size_t count, dl_dtype t, int peer, dl_purpose p);

/* A non-blocking operation in flight: a collective's (coll.h), dl_isend's or dl_irecv's. */
typedef struct dl_request dl_request;
/* Non-blocking send (the pipeline's hand-offs): *req completes through dl_wait / dl_test (like
 * a non-blocking collective's) once the receiver has taken the message; until then buf must stay
 * unchanged (large messages are lent, not copied). With nothing pending on the rank it posts at
 * once and blocks only while the link's ring is full; otherwise it queues behind the pending
 * requests. `tag` must equal the receiver's (dl_recv_tag / dl_irecv; DL_EMISMATCH otherwise):
 * messages between a pair still arrive in posting order, the tag only catches a receiver
 * expecting a different one. dl_send and dl_recv use tag 0. Errors found at once (bad
 * arguments, a failed post) are returned with *req = NULL. */
int dl_isend(dl_comm *c, const void *buf, size_t count, dl_dtype t, int peer, int tag, dl_purpose p,
             dl_request **req);
/* Non-blocking receive: *req completes through dl_wait / dl_test once buf holds the message.
 * Receives from one peer match that peer's messages in the order they were started; a receive
 * and the collectives on its communicator count in the order started (a collective first
 * finishes the receives started before it). An irecv waiting for its message holds up nothing
 * started after it; the world's abort or timeout completes it with DL_EABORT / DL_ETIMEOUT. */
int dl_irecv(dl_comm *c, void *buf, size_t count, dl_dtype t, int peer, int tag, dl_purpose p,
             dl_request **req);
/* Blocking receive with a tag (dl_isend's). */
int dl_recv_tag(dl_comm *c, void *buf, size_t count, dl_dtype t, int peer, int tag, dl_purpose p);
/* After a failure in the caller's own work: abort the world and wait until no peer still reads
 * a buffer this rank lent on c (dl_isend), so that the caller may free it (its requests still
 * need their dl_wait, which then reports the abort). */
void dl_comm_fail(dl_comm *c);

/* The mesh: world = pp x dp x tp (x ep inside dp), tp fastest. */
typedef struct dl_mesh {
    int dp, pp, tp, ep;
    int dp_rank, pp_rank, tp_rank, ep_rank;
    dl_comm *dp_comm;  /* ranks with the same (pp, tp): gradient all-reduce */
    dl_comm *pp_comm;  /* ranks with the same (dp, tp): the pipeline, stage order */
    dl_comm *tp_comm;  /* ranks with the same (pp, dp): tensor parallel group */
    dl_comm *ep_comm;  /* ep consecutive dp ranks (ep divides dp); NULL when ep == 1 */
    dl_comm *edp_comm; /* expert-data-parallel: the dp / ep ranks with this rank's (pp, tp,
                        * ep_rank), which hold the same experts; NULL when ep == 1 */
} dl_mesh;

/* Collective over `world`; dp * pp * tp must equal its size and ep must divide dp. */
int dl_mesh_create(dl_comm *world, int dp, int pp, int tp, int ep, dl_mesh *out);
int dl_mesh_destroy(dl_mesh *m);

#ifdef __cplusplus
}
#endif
#endif
