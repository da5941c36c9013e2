/* distlab: collectives over a communicator's links.
 *
 * Ring all-reduce is a reduce-scatter followed by an all-gather (NCCL's ring schedule); each
 * chunk is cut into slices so that consecutive hops overlap. Types f32, f64, bf16 (bf16 travels
 * as bf16; each hop adds in f32 and rounds once, to nearest even); ops sum, avg, max. Any count
 * (0 too), n = 1, in-place (sendbuf == recvbuf, or for reduce-scatter / all-gather the rank's
 * block of the full buffer) and out-of-place. Results are bitwise identical on every rank and
 * from run to run.
 *
 * Counts: allreduce, broadcast, reduce take the element count of the whole buffer.
 * reduce_scatter takes the full count: sendbuf holds `count` elements, recvbuf receives this
 * rank's block (dl_block). allgather takes the full count: sendbuf holds this rank's block,
 * recvbuf the `count` elements. alltoall takes the count per peer: both buffers hold n blocks.
 * alltoallv takes a count and a displacement per peer for each side, in elements (MPI_Alltoallv).
 *
 * Non-blocking forms return a request completed by dl_wait / dl_test; they run on the rank's
 * communication thread, in the order started, and buffers must stay untouched until completion.
 * A blocking call made while requests are pending on the rank runs after them. */
#ifndef DISTLAB_COLL_H
#define DISTLAB_COLL_H

#include "distlab/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Blocking collectives over every member of c (each member calls them with the same count,
 * type, op and root): the counts as above. */
int dl_allreduce(dl_comm *c, const void *sendbuf, void *recvbuf, size_t count, dl_dtype t,
                 dl_redop op, dl_purpose p);
int dl_reduce_scatter(dl_comm *c, const void *sendbuf, void *recvbuf, size_t count, dl_dtype t,
                      dl_redop op, dl_purpose p);
int dl_allgather(dl_comm *c, const void *sendbuf, void *recvbuf, size_t count, dl_dtype t,
                 dl_purpose p);
/* sendbuf is read at the root only; every rank (the root too) receives into recvbuf. */
int dl_broadcast(dl_comm *c, const void *sendbuf, void *recvbuf, size_t count, dl_dtype t, int root,
                 dl_purpose p);
/* recvbuf is written at the root only (may be NULL elsewhere). */
int dl_reduce(dl_comm *c, const void *sendbuf, void *recvbuf, size_t count, dl_dtype t, dl_redop op,
              int root, dl_purpose p);
/* Rank r sends block j of sendbuf to member j and receives block r of every member into
 * recvbuf (count elements per block). */
int dl_alltoall(dl_comm *c, const void *sendbuf, void *recvbuf, size_t count, dl_dtype t,
                dl_purpose p);
/* All-to-all with per-peer counts, as MPI_Alltoallv: rank r sends sendcounts[j] elements from
 * element sdispls[j] of sendbuf to member j, and receives recvcounts[i] elements from member i
 * into recvbuf at element rdispls[i] (arrays of n entries; blocks may leave gaps and come in any
 * order, but must not overlap in recvbuf; sendbuf == recvbuf works, other overlaps do not). The
 * members first exchange their counts (one message of 16 n bytes per peer, counted under
 * DL_PURPOSE_OTHER), so when some sendcounts[j] differs from member j's recvcounts[r] every
 * member returns DL_EMISMATCH naming the first such pair, no data moves and the communicator
 * stays usable (a member that aborts the world before the others have left the call, e.g. by
 * returning the error from its rank function, turns theirs into DL_EABORT). A buffer may be
 * NULL where its counts are all zero. */
int dl_alltoallv(dl_comm *c, const void *sendbuf, const size_t *sendcounts, const size_t *sdispls,
                 void *recvbuf, const size_t *recvcounts, const size_t *rdispls, dl_dtype t,
                 dl_purpose p);
/* Returns once every member has entered it. */
int dl_barrier(dl_comm *c);

/* Non-blocking forms of the collectives above: *req completes through dl_wait / dl_test. */
int dl_iallreduce(dl_comm *c, const void *sendbuf, void *recvbuf, size_t count, dl_dtype t,
                  dl_redop op, dl_purpose p, dl_request **req);
int dl_ireduce_scatter(dl_comm *c, const void *sendbuf, void *recvbuf, size_t count, dl_dtype t,
                       dl_redop op, dl_purpose p, dl_request **req);
int dl_iallgather(dl_comm *c, const void *sendbuf, void *recvbuf, size_t count, dl_dtype t,
                  dl_purpose p, dl_request **req);
int dl_ibroadcast(dl_comm *c, const void *sendbuf, void *recvbuf, size_t count, dl_dtype t,
                  int root, dl_purpose p, dl_request **req);
/* dl_alltoallv's non-blocking form: the four arrays, like the buffers, stay untouched until
 * completion. */
int dl_ialltoallv(dl_comm *c, const void *sendbuf, const size_t *sendcounts, const size_t *sdispls,
                  void *recvbuf, const size_t *recvcounts, const size_t *rdispls, dl_dtype t,
                  dl_purpose p, dl_request **req);
/* Wait for completion of a request (a non-blocking collective, dl_isend or dl_irecv), free it
 * and return its status (NULL: DL_OK). */
int dl_wait(dl_request *req);
/* *done = 1 when complete (then call dl_wait to collect the status and free it). */
int dl_test(dl_request *req, int *done);

#ifdef __cplusplus
}
#endif
#endif
