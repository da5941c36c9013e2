/* What the collectives know about worlds spanning MPI processes (and nothing else in lib/coll/
 * does): the slice size of communicators whose members live in several processes, and the
 * hierarchical all-reduce, which runs the generic algorithms on two groups of the communicator:
 * its members in this process, and the j-th member of every process. */
#include "config.h"
#include <pthread.h>
#include <stdlib.h>
#include "distlab.h"
#include "runtime/internal.h"
#include "coll/prims.h"
#include "coll/algo.h"

/* Slice of c's collectives: the world's, or in a world spanning MPI processes, for a
 * communicator whose members live in several processes, the MPI slice (every member computes the
 * same, from the members' ranks). */
size_t dl__slice_bytes(const dl_comm *c)
{
    dl_world *w = c->ctx->w;
    size_t s = w->opts.slice_bytes;
    if (w->mpi && w->opts.mpi_slice_bytes) {
        int T = w->hi - w->lo, p0 = c->sh->world_ranks[0] / T;
        for (int m = 1; m < c->sh->n; m++)
            if (c->sh->world_ranks[m] / T != p0)
                return w->opts.mpi_slice_bytes;
    }
    return s;
}

/* Whether c has the same number k >= 2 of members in each of np >= 2 processes; then *j is this
 * member's index among its process's members (comm order) and *pi its process's position among
 * the processes (order of first appearance in the communicator). */
static int hier_shape(dl_comm *c, int *kout, int *npout, int *j, int *pi)
{
    dl_world *w = c->ctx->w;
    dl_comm_shared *sh = c->sh;
    int n = sh->n, T = w->hi - w->lo, np = 0, k = -1, fm = -1;
    *j = *pi = 0;
    for (int m = 0; m < n; m++) {
        int pm = sh->world_ranks[m] / T, cnt = 0, first = 1;
        for (int q = 0; q < n; q++)
            if (sh->world_ranks[q] / T == pm) {
                cnt++;
                first = first && q >= m;
            }
        if (k < 0)
            k = cnt;
        if (cnt != k)
            return 0;
        if (first) {
            np++;
            if (pm == w->proc)
                fm = m;
            else if (fm < 0)
                ++*pi; /* a process that appears before this one */
        }
        if (pm == w->proc && m < c->rank)
            ++*j;
    }
    *kout = k;
    *npout = np;
    return k >= 2 && np >= 2;
}

/* This member's views of the two groups: its process's members, and the j-th member of every
 * process. The groups' records live in c's record of this process (created once, under the
 * world's hier_mu); the cross-process group's MPI tags use the id dl__mpi_sub_cid(c's id, j). */
static int hier_views(dl_comm *c, int k, int np, int j, int pi)
{
    if (c->h_intra && c->h_inter)
        return DL_OK;
    dl_world *w = c->ctx->w;
    dl_comm_shared *sh = c->sh;
    int n = sh->n, T = w->hi - w->lo, rc = DL_OK;
    int *intra = malloc(sizeof(int) * (size_t)k), *inter = malloc(sizeof(int) * (size_t)np);
    int *seen = calloc((size_t)w->nprocs, sizeof(int));
    if (!intra || !inter || !seen) {
        free(intra), free(inter), free(seen);
        return dl_error(DL_ENOMEM, "hierarchical all-reduce: out of memory");
    }
    int ni = 0, ne = 0;
    for (int m = 0; m < n; m++) {
        int wr = sh->world_ranks[m], pm = wr / T;
        if (pm == w->proc)
            intra[ni++] = wr;
        if (seen[pm]++ == j) /* the j-th member of process pm, in process order of appearance */
            inter[ne++] = wr;
    }
    /* inter[] is in order of each process's j-th member; reorder by first appearance */
    int *order = seen; /* reuse: position of each process by first appearance */
    for (int p = 0; p < w->nprocs; p++) order[p] = -1;
    int pos = 0;
    for (int m = 0; m < n; m++) {
        int pm = sh->world_ranks[m] / T;
        if (order[pm] < 0)
            order[pm] = pos++;
    }
    int *sorted = malloc(sizeof(int) * (size_t)np);
    if (!sorted) {
        free(intra), free(inter), free(seen);
        return dl_error(DL_ENOMEM, "hierarchical all-reduce: out of memory");
    }
    for (int e = 0; e < ne; e++) sorted[order[inter[e] / T]] = inter[e];
    pthread_mutex_lock(&w->hier_mu);
    if (!sh->hier && !(sh->hier = calloc((size_t)k + 1, sizeof *sh->hier)))
        rc = dl_error(DL_ENOMEM, "hierarchical all-reduce: out of memory");
    if (rc == DL_OK && !sh->hier[0])
        rc = dl__shared_create(w, k, intra, &sh->hier[0]);
    if (rc == DL_OK && !sh->hier[1 + j])
        rc = dl__shared_create(w, np, sorted, &sh->hier[1 + j]);
    pthread_mutex_unlock(&w->hier_mu);
    if (rc == DL_OK && !c->h_intra)
        rc = dl__comm_create(sh->hier[0], j, c->ctx, &c->h_intra);
    if (rc == DL_OK && !c->h_inter &&
        (rc = dl__comm_create(sh->hier[1 + j], pi, c->ctx, &c->h_inter)) == DL_OK)
        c->h_inter->cid = dl__mpi_sub_cid(c->cid, j);
    free(intra), free(inter), free(seen), free(sorted);
    return rc;
}

static void stats_add(dl_comm_stats *to, const dl_comm_stats *now, const dl_comm_stats *before)
{
    for (int p = 0; p < DL_NPURPOSES; p++) {
        to->bytes_sent[p] += now->bytes_sent[p] - before->bytes_sent[p];
        to->bytes_recv[p] += now->bytes_recv[p] - before->bytes_recv[p];
    }
    to->msgs_sent += now->msgs_sent - before->msgs_sent;
    to->msgs_recv += now->msgs_recv - before->msgs_recv;
    to->wait_ns += now->wait_ns - before->wait_ns;
    to->copy_ns += now->copy_ns - before->copy_ns;
    to->sleeps += now->sleeps - before->sleeps;
    to->bytes_sent_inter += now->bytes_sent_inter - before->bytes_sent_inter;
    to->bytes_recv_inter += now->bytes_recv_inter - before->bytes_recv_inter;
}

/* A step on one of the groups: the group's own sequence number and fingerprint; its bytes are
 * counted on the caller's communicator (sub_end). */
static dl_call sub_begin(const dl_call *k, dl_comm *sub, int opcode, dl_dtype t, dl_redop op,
                         size_t count, dl_comm_stats *before)
{
    sub->seq++;
    *before = sub->st;
    dl_call ks = dl__call(sub, opcode, sub->seq, t, op, count, -1, k->p);
    ks.w = k->w;
    return ks;
}

static int sub_end(dl_call *k, const dl_comm *sub, const dl_comm_stats *before, int rc)
{
    stats_add(&k->c->st, &sub->st, before);
    return rc;
}

int dl__hier_fits(dl_comm *c)
{
    int kk, np, j, pi;
    return c->ctx->w->mpi && hier_shape(c, &kk, &np, &j, &pi);
}

/* Reduce-scatter inside the process (member j gets block j of k), all-reduce of that shard with
 * the j-th members of the other processes, all-gather inside. avg sums and divides the shard
 * once, so every rank gets bitwise the same result. */
int dl__hier_allreduce(dl_call *k, const void *sbuf, void *rbuf, size_t count, dl_dtype t,
                       dl_redop op)
{
    dl_comm *c = k->c;
    int kk, np, j, pi, rc;
    hier_shape(c, &kk, &np, &j, &pi);
    if ((rc = hier_views(c, kk, np, j, pi)))
        return rc;
    size_t es = dl_dtype_size(t), off, len;
    dl_block(count, kk, j, &off, &len);
    dl_redop sop = op == DL_AVG ? DL_SUM : op;
    char *shard = (char *)rbuf + off * es;
    dl_comm_stats b;
    dl_call ks = sub_begin(k, c->h_intra, OP_REDUCE_SCATTER, t, sop, count, &b);
    rc = sub_end(k, c->h_intra, &b, dl__ring_reduce_scatter(&ks, sbuf, shard, count, t, sop));
    if (rc)
        return rc;
    ks = sub_begin(k, c->h_inter, OP_ALLREDUCE, t, sop, len, &b);
    dl_algo a = dl__choose_allreduce(c->h_inter, len * es);
    rc = sub_end(k, c->h_inter, &b, dl__flat_allreduce(&ks, a, shard, shard, len, t, sop));
    if (rc)
        return rc;
    if (op == DL_AVG)
        dl__scale(t, shard, shard, len, (double)c->sh->n);
    ks = sub_begin(k, c->h_intra, OP_ALLGATHER, t, sop, count, &b);
    return sub_end(k, c->h_intra, &b, dl__ring_allgather(&ks, shard, rbuf, count, t));
}

void dl__hier_drain(dl_comm *c)
{
    if (c->h_intra)
        dl__drain_links(c->h_intra);
    if (c->h_inter)
        dl__drain_links(c->h_inter);
}
