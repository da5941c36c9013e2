/* distlab (private to lib/coll/): the algorithms, and what the entry points share.
 * Every algorithm takes the call (prims.h) and its buffers; none knows which public collective
 * it serves, and only hier_mpi.c knows that a world may span MPI processes. */
#ifndef DISTLAB_COLL_ALGO_H
#define DISTLAB_COLL_ALGO_H

#include <stddef.h>
#include "distlab.h"
#include "runtime/internal.h"
#include "coll/prims.h"

/* ring.c */
int dl__ring_reduce_scatter(dl_call *k, const void *sbuf, void *rbuf, size_t count, dl_dtype t,
                            dl_redop op);
int dl__ring_allgather(dl_call *k, const void *sbuf, void *rbuf, size_t count, dl_dtype t);
int dl__ring_allreduce(dl_call *k, const void *sbuf, void *rbuf, size_t count, dl_dtype t,
                       dl_redop op);
/* rounds of a schedule over n blocks of count elements cut into slices of slice_bytes */
size_t dl__nrounds(size_t count, int n, size_t es, size_t slice_bytes);

/* small.c */
int dl__oneshot_allreduce(dl_call *k, const void *sbuf, void *rbuf, size_t count, dl_dtype t,
                          dl_redop op);
int dl__rd_allreduce(dl_call *k, const void *sbuf, void *rbuf, size_t count, dl_dtype t,
                     dl_redop op);

/* chain.c */
int dl__chain_broadcast(dl_call *k, const void *sbuf, void *rbuf, size_t count, dl_dtype t,
                        int root);
int dl__chain_reduce(dl_call *k, const void *sbuf, void *rbuf, size_t count, dl_dtype t,
                     dl_redop op, int root);

/* alltoall.c, barrier.c */
int dl__alltoall(dl_call *k, const void *sbuf, void *rbuf, size_t count, dl_dtype t);
/* every outgoing link of k's member: what was lent to the peer (rendezvous) is back */
int dl__flush_peers(dl_call *k);
int dl__barrier(dl_call *k);
/* alltoallv.c: the per-peer counts and displacements are q->v; sets q->agreed when every
 * member fails alike */
int dl__alltoallv(dl_call *k, dl_request *q);

/* hier_mpi.c: worlds spanning MPI processes */
/* the slice the ring and the chains cut c's buffers into */
size_t dl__slice_bytes(const dl_comm *c);
/* 1 where the hierarchical all-reduce can run on c (the same number >= 2 of members in each of
 * >= 2 processes) */
int dl__hier_fits(dl_comm *c);
int dl__hier_allreduce(dl_call *k, const void *sbuf, void *rbuf, size_t count, dl_dtype t,
                       dl_redop op);
/* the hierarchical all-reduce's groups' links, drained after a failure */
void dl__hier_drain(dl_comm *c);

/* dispatch.c */
/* the all-reduce algorithm `auto` (or c's forced one) runs for `bytes` bytes */
dl_algo dl__choose_allreduce(dl_comm *c, size_t bytes);
/* the flat all-reduce the choice names (ring, one-shot or recursive doubling) */
int dl__flat_allreduce(dl_call *k, dl_algo a, const void *sbuf, void *rbuf, size_t count,
                       dl_dtype t, dl_redop op);
/* run one request on the calling thread */
int dl__run_op(dl_request *q);
/* abort the world after a failed call and wait until no peer reads this member's buffers */
void dl__fail_and_drain(dl_comm *c);
/* the links' drain for c's outgoing links */
void dl__drain_links(dl_comm *c);

/* p2p.c: run a send or receive request on the calling thread */
int dl__run_p2p(dl_request *q);
/* an isend posted / irecv kept on the caller's thread (dl_request.own): poll it, wait for it;
 * whether the caller keeps an irecv (a blocking call then queues, so that it cannot wait while
 * its own receive owes the peer progress) */
int dl__p2p_own_recvs(const dl_progress *p);
int dl__p2p_own_test(dl_request *q);
int dl__p2p_own_wait(dl_request *q);
/* the caller's own isends as a queue chain (*head .. *tail, oldest first); returns how many */
int dl__p2p_hand_over(dl_progress *p, dl_request **head, dl_request **tail);
/* the communication thread: start a queued point-to-point request (1: poll it, 0: complete with
 * *rc), poll its list once (returns how many completed), and before a collective on c finish
 * the receives c's links owe */
int dl__p2p_start(dl_request *q, dl_request *poll, int *rc);
int dl__p2p_poll(dl_progress *p);
void dl__p2p_settle(dl_progress *p, dl_comm *c);

/* check.c */
int dl__check_common(dl_comm *c, const char *what, dl_dtype t, int need_op, dl_redop op);
int dl__check_purpose(const char *what, dl_purpose p);
/* validate a collective's arguments and fill the request */
int dl__prepare(dl_request *q, int kind, dl_comm *c, const void *sbuf, void *rbuf, size_t count,
                dl_dtype t, dl_redop op, int root, dl_purpose p);

/* progress.c */
/* run now on this thread, or behind the rank's pending requests */
int dl__submit_blocking(dl_request *q);
/* queue a copy of proto on the rank's communication thread */
int dl__submit_async(const dl_request *proto, dl_request **req);
/* queue q itself; complete q with status rc (wakes dl_wait) */
int dl__progress_enqueue(dl_request *q);
/* hand the caller's own requests to the thread, which polls them from now on; wait for a
 * queued request */
int dl__progress_adopt(dl_ctx *x);
int dl__progress_wait(dl_request *q);
void dl__progress_complete(dl_request *q, int rc);

#endif
