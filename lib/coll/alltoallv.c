/* All-to-all with per-peer counts (dl_alltoallv, MPI_Alltoallv's layout).
 *
 * Two phases over the communicator's links. First every member sends every other its row of
 * the count matrix (its sendcounts and recvcounts, 16 n bytes, counted under DL_PURPOSE_OTHER),
 * so that every member holds the whole matrix and reaches the same verdict: a pair that
 * disagrees is DL_EMISMATCH on every member, with no data moved and nothing to abort. Then, as
 * in dl_alltoall, each member posts its nonzero blocks to their destinations (one message per
 * link, so posting them all first cannot block), copies its own block, and takes each nonzero
 * incoming block in place; pairs with a zero count exchange no data message. The count rows are
 * 8-byte words that travel as f64-sized elements (copied, never read as numbers).
 *
 * Every byte is copied once, by its receiver, straight from the sender's buffer (the channel's
 * rendezvous). In place, peers would read blocks that this member overwrites as its own arrive,
 * so they read copies of the blocks bound for other members instead (stage): the own block is
 * not copied (it moves before anything arrives), nor the gaps between blocks. */
#include "config.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "distlab.h"
#include "runtime/internal.h"
#include "coll/prims.h"
#include "coll/algo.h"

enum { SC, SD, RC, RD }; /* dl_request.v: sendcounts, sdispls, recvcounts, rdispls */

/* One side's arguments: the arrays present, every block inside the addressable range (a count
 * or displacement converted from a negative number lands outside), the buffer present when the
 * side moves anything. *extent = elements the side's blocks span. */
static int check_side(int send, int r, int n, size_t lim, const void *buf, const size_t *cnt,
                      const size_t *dsp, size_t *extent)
{
    const char *side = send ? "send" : "recv", *cn = send ? "sendcounts" : "recvcounts";
    const char *dn = send ? "sdispls" : "rdispls";
    if (!cnt || !dsp)
        return dl_error(DL_EINVAL, "alltoallv: null %s on rank %d", !cnt ? cn : dn, r);
    size_t total = 0;
    *extent = 0;
    for (int j = 0; j < n; j++) {
        if (cnt[j] > lim || dsp[j] > lim - cnt[j])
            return dl_error(DL_EINVAL,
                            "alltoallv: rank %d's %s[%d] = %zu, %s[%d] = %zu out of range "
                            "(negative, or past %zu elements)",
                            r, cn, j, cnt[j], dn, j, dsp[j], lim);
        total += cnt[j];
        if (cnt[j] && dsp[j] + cnt[j] > *extent)
            *extent = dsp[j] + cnt[j];
    }
    if (total && !buf)
        return dl_error(DL_EINVAL, "alltoallv: null %s buffer for %zu elements on rank %d", side,
                        total, r);
    return DL_OK;
}

static int prepare(dl_request *q, dl_comm *c, const void *sbuf, const size_t *sc, const size_t *sd,
                   void *rbuf, const size_t *rc, const size_t *rd, dl_dtype t, dl_purpose p)
{
    int err = dl__check_common(c, "alltoallv", t, 0, DL_SUM);
    if (err || (err = dl__check_purpose("alltoallv", p)))
        return err;
    int n = c->sh->n, r = c->rank;
    size_t lim = (SIZE_MAX / 4) / dl_dtype_size(t), ext;
    if ((err = check_side(1, r, n, lim, sbuf, sc, sd, &ext)) ||
        (err = check_side(0, r, n, lim, rbuf, rc, rd, &ext)))
        return err;
    *q = (dl_request){.kind = OP_ALLTOALLV,
                      .c = c,
                      .sbuf = sbuf,
                      .rbuf = rbuf,
                      .count = 0, /* part of the calls' fingerprint: the same on every member */
                      .t = t,
                      .op = DL_SUM,
                      .root = -1,
                      .p = p,
                      .v = {sc, sd, rc, rd}};
    return DL_OK;
}

/* The next member to take a message from among those with want[] set (cleared as chosen): the
 * first whose message has arrived, else the first left (*from = -1: none left). Messages are
 * taken as they arrive, not in rank order, so that a member late to post (descheduled, when
 * ranks share cores) holds up nobody else's; waiting stays the links' (policy, abort). */
static int next_from(dl_call *k, int n, char *want, int *from)
{
    int r = k->c->rank, rc;
    *from = -1;
    for (int d = 1; d < n; d++) {
        int m = dl__mod(r - d, n);
        dl_link *l;
        if (!want[m])
            continue;
        if ((rc = dl__xfer_link(k, m, r, &l)))
            return rc;
        if (*from < 0)
            *from = m;
        if (dl_link_ready(l)) {
            *from = m;
            break;
        }
    }
    if (*from >= 0)
        want[*from] = 0;
    return DL_OK;
}

/* Row m of mat (2n entries) becomes member m's sendcounts then recvcounts. */
static int exchange_counts(const dl_call *k, const dl_request *q, uint64_t *mat, char *want)
{
    dl_call kc = *k;
    kc.p = DL_PURPOSE_OTHER; /* metadata: the payload's purpose counts the payload only */
    int n = k->c->sh->n, r = k->c->rank, rc;
    size_t row = 2 * (size_t)n;
    uint64_t *mine = mat + (size_t)r * row;
    for (int j = 0; j < n; j++) {
        mine[j] = q->v[SC][j];
        mine[n + j] = q->v[RC][j];
    }
    for (int d = 1; d < n; d++) {
        dl_prims p;
        if ((rc = dl__prims_open(&p, &kc, -1, dl__mod(r + d, n), DL_F64, DL_SUM)) ||
            (rc = dl__send(&p, mine, row)))
            return rc;
    }
    for (int j = 0; j < n; j++) want[j] = j != r;
    for (int from; !(rc = next_from(&kc, n, want, &from)) && from >= 0;) {
        dl_prims p;
        if ((rc = dl__prims_open(&p, &kc, from, -1, DL_F64, DL_SUM)) ||
            (rc = dl__recv(&p, mat + (size_t)from * row, row)))
            return rc;
    }
    return rc;
}

/* The same verdict on every member: the first (sender, receiver) pair in rank order whose send
 * count differs from the receiver's expectation. */
static int agree(const uint64_t *mat, int n)
{
    size_t row = 2 * (size_t)n;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            unsigned long long s = mat[(size_t)i * row + (size_t)j];
            unsigned long long e = mat[(size_t)j * row + (size_t)n + (size_t)i];
            if (s != e)
                return dl_error(DL_EMISMATCH,
                                "alltoallv: rank %d sends %llu elements to rank %d, which expects "
                                "%llu from it (its sendcounts[%d] != rank %d's recvcounts[%d])",
                                i, s, j, e, j, j, i);
        }
    return DL_OK;
}

/* In place: copy the nonzero blocks bound for other members to `base` (page-aligned), each at
 * its source's offset in a page (a copy whose source and destination differ by a few bytes mod
 * 4096 runs several times slower, so the receivers copy as fast as from the user's buffer), and
 * point blk[] at them. Without base, only the bytes needed. */
static size_t stage(const dl_request *q, int n, int r, size_t es, char *base, const char **blk)
{
    size_t pos = 0;
    for (int d = 1; d < n; d++) {
        int to = dl__mod(r + d, n);
        size_t len = q->v[SC][to] * es;
        const char *src = (const char *)q->sbuf + q->v[SD][to] * es;
        if (!len)
            continue;
        pos += ((uintptr_t)src - pos) & 4095; /* pos = src mod 4096 */
        if (base) {
            memcpy(base + pos, src, len);
            blk[to] = base + pos;
        }
        pos += len;
    }
    return pos;
}

/* blk: where the blocks for the other members are (staged), or NULL: in the send buffer */
static int move_data(dl_call *k, const dl_request *q, const char *const *blk, char *want)
{
    int n = k->c->sh->n, r = k->c->rank, rc;
    size_t es = dl_dtype_size(q->t);
    const size_t *sc = q->v[SC], *sd = q->v[SD], *rn = q->v[RC], *rd = q->v[RD];
    const char *sbuf = q->sbuf;
    char *rbuf = q->rbuf;
    for (int d = 1; d < n; d++) {
        dl_prims p;
        int to = dl__mod(r + d, n);
        if (sc[to] && ((rc = dl__prims_open(&p, k, -1, to, q->t, DL_SUM)) ||
                       (rc = dl__send(&p, blk ? blk[to] : sbuf + sd[to] * es, sc[to]))))
            return rc;
    }
    /* in place, the own block's source is intact (nothing arrived yet) and whatever of the
     * other blocks it overwrites was staged */
    if (sc[r] && sbuf + sd[r] * es != rbuf + rd[r] * es)
        memmove(rbuf + rd[r] * es, sbuf + sd[r] * es, sc[r] * es);
    for (int j = 0; j < n; j++) want[j] = j != r && rn[j];
    for (int from; !(rc = next_from(k, n, want, &from)) && from >= 0;) {
        dl_prims p;
        if ((rc = dl__prims_open(&p, k, from, -1, q->t, DL_SUM)) ||
            (rc = dl__recv(&p, rbuf + rd[from] * es, rn[from])))
            return rc;
    }
    return rc;
}

int dl__alltoallv(dl_call *k, dl_request *q)
{
    dl_comm *c = k->c;
    int n = c->sh->n, r = c->rank, rc;
    size_t es = dl_dtype_size(q->t), matb = 2 * (size_t)n * (size_t)n * sizeof(uint64_t);
    /* scratch: the count matrix, blk[n], want[n], then from a page boundary the staged blocks */
    size_t head = (matb + (size_t)n * (sizeof(char *) + 1) + 4095) & ~(size_t)4095;
    size_t stageb = q->sbuf == q->rbuf ? stage(q, n, r, es, NULL, NULL) : 0;
    /* the scratch outlives the call, so peers may still read it (rendezvous) after a failure */
    char *scratch;
    if ((rc = dl__scratch(c, head + stageb, (void **)&scratch)))
        return rc;
    const char **blk = NULL;
    char *want = scratch + matb + (size_t)n * sizeof(char *);
    if (stageb) {
        blk = (const char **)(scratch + matb);
        stage(q, n, r, es, scratch + head, blk);
    }
    if ((rc = exchange_counts(k, q, (uint64_t *)scratch, want)))
        return rc;
    if ((rc = agree((const uint64_t *)scratch, n))) {
        /* every member holds the same matrix, so every member fails here: nothing to abort */
        q->agreed = dl__flush_peers(k) == DL_OK;
        return rc;
    }
    if ((rc = move_data(k, q, blk, want)))
        return rc;
    return dl__flush_peers(k);
}

int dl_alltoallv(dl_comm *c, const void *sendbuf, const size_t *sendcounts, const size_t *sdispls,
                 void *recvbuf, const size_t *recvcounts, const size_t *rdispls, dl_dtype t,
                 dl_purpose p)
{
    dl_request q;
    int rc = prepare(&q, c, sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls, t, p);
    return rc ? rc : dl__submit_blocking(&q);
}

int dl_ialltoallv(dl_comm *c, const void *sendbuf, const size_t *sendcounts, const size_t *sdispls,
                  void *recvbuf, const size_t *recvcounts, const size_t *rdispls, dl_dtype t,
                  dl_purpose p, dl_request **req)
{
    dl_request q;
    int rc = prepare(&q, c, sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls, t, p);
    return rc ? rc : dl__submit_async(&q, req);
}
