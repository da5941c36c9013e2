/* Ring reduce-scatter, ring all-gather, and ring all-reduce as their composition (NCCL's
 * schedule).
 *
 * The buffer is cut into n blocks (dl_block) and every block into R slices; the ring runs R
 * rounds, one slice of every block per round, so consecutive hops overlap and each link holds at
 * most a couple of messages per round (no deadlock whatever the slot count). In a round, at step
 * s a member handles block (top - s) mod n:
 *   reduce-scatter half: send block top; n-2 x recv-reduce-send; the last block's final sum;
 *   all-gather half:     send block top; n-2 x recv-copy-send; recv.
 * The all-reduce fuses the two where they meet (recv-reduce-copy-send), so its all-gather half
 * starts one block later. Large slices travel by rendezvous: the receiver reduces straight from
 * the sender's buffer and its release is the acknowledgement; a lent region is rewritten only
 * after its data went round the ring, and the final flush covers the rest. */
#include "config.h"
#include <string.h>
#include "distlab.h"
#include "coll/prims.h"
#include "coll/algo.h"

/* non-temporal stores only pay off when the output does not fit the caches anyway */
#define NT_FINAL_BYTES ((size_t)32 << 20)

typedef struct ring {
    dl_prims p;
    int n, r;
    size_t count, R, q; /* elements, rounds, this round */
} ring;

size_t dl__nrounds(size_t count, int n, size_t es, size_t slice_bytes)
{
    size_t maxblock = (count + (size_t)n - 1) / (size_t)n;
    size_t r = (maxblock * es + slice_bytes - 1) / slice_bytes;
    return r ? r : 1;
}

static int ring_open(ring *g, dl_call *k, size_t count, dl_dtype t, dl_redop op)
{
    g->n = k->c->sh->n;
    g->r = k->c->rank;
    g->count = count;
    g->q = 0;
    int rc = dl__prims_ring(&g->p, k, t, op);
    g->R = dl__nrounds(count, g->n, g->p.es, dl__slice_bytes(k->c));
    g->p.nt = count * g->p.es >= NT_FINAL_BYTES;
    return rc;
}

/* This round's slice of block b: first element in the buffer (*e0), offset in the block (*lo),
 * length (*m). */
static void slice(const ring *g, int b, size_t *e0, size_t *lo, size_t *m)
{
    size_t off, len;
    dl_block(g->count, g->n, dl__mod(b, g->n), &off, &len);
    *lo = len * g->q / g->R;
    *m = len * (g->q + 1) / g->R - *lo;
    *e0 = off + *lo;
}

/* The reduce-scatter half up to its last step: send block top of `in`, then n-2 partial sums
 * of in and upstream into `part` (indexed like `in`), each sent on. */
static int reduce_down(ring *g, int top, const char *in, char *part)
{
    size_t es = g->p.es, e0, lo, m;
    slice(g, top, &e0, &lo, &m);
    int rc = dl__send(&g->p, in + e0 * es, m);
    for (int s = 1; s < g->n - 1 && rc == DL_OK; s++) {
        slice(g, top - s, &e0, &lo, &m);
        rc = dl__recv_reduce_send(&g->p, in + e0 * es, part + e0 * es, m);
    }
    return rc;
}

/* The all-gather half after its first send (block top): n-2 copies sent on, then the last. */
static int gather_down(ring *g, int top, char *out)
{
    size_t es = g->p.es, e0, lo, m;
    int rc = DL_OK;
    for (int s = 1; s < g->n - 1 && rc == DL_OK; s++) {
        slice(g, top - s, &e0, &lo, &m);
        rc = dl__recv_copy_send(&g->p, out + e0 * es, m);
    }
    slice(g, top - (g->n - 1), &e0, &lo, &m);
    return rc ? rc : dl__recv(&g->p, out + e0 * es, m);
}

int dl__ring_reduce_scatter(dl_call *k, const void *sbuf, void *rbuf, size_t count, dl_dtype t,
                            dl_redop op)
{
    ring g;
    int rc = ring_open(&g, k, count, t, op);
    char *part = NULL; /* partial sums (rbuf holds one block); two members need none */
    if (rc == DL_OK && g.n > 2)
        rc = dl__scratch(k->c, count * g.p.es, (void **)&part);
    double div = op == DL_AVG ? (double)g.n : 1.0;
    for (; rc == DL_OK && g.q < g.R; g.q++) {
        size_t e0, lo, m;
        rc = reduce_down(&g, g.r - 1, sbuf, part);
        slice(&g, g.r, &e0, &lo, &m); /* the member's own block, final */
        if (rc == DL_OK)
            rc = dl__recv_reduce_copy(&g.p, (const char *)sbuf + e0 * g.p.es,
                                      (char *)rbuf + lo * g.p.es, m, div);
    }
    return rc ? rc : dl__prims_flush(&g.p);
}

int dl__ring_allgather(dl_call *k, const void *sbuf, void *rbuf, size_t count, dl_dtype t)
{
    ring g;
    int rc = ring_open(&g, k, count, t, DL_SUM);
    size_t es = g.p.es, own_off, own_len;
    dl_block(count, g.n, g.r, &own_off, &own_len);
    if (sbuf != (char *)rbuf + own_off * es)
        memcpy((char *)rbuf + own_off * es, sbuf, own_len * es);
    for (; rc == DL_OK && g.q < g.R; g.q++) {
        size_t e0, lo, m;
        slice(&g, g.r, &e0, &lo, &m);
        rc = dl__send(&g.p, (const char *)sbuf + lo * es, m); /* sbuf holds the own block */
        if (rc == DL_OK)
            rc = gather_down(&g, g.r, rbuf);
    }
    return rc ? rc : dl__prims_flush(&g.p);
}

int dl__ring_allreduce(dl_call *k, const void *sbuf, void *rbuf, size_t count, dl_dtype t,
                       dl_redop op)
{
    ring g;
    int rc = ring_open(&g, k, count, t, op);
    double div = op == DL_AVG ? (double)g.n : 1.0;
    for (; rc == DL_OK && g.q < g.R; g.q++) {
        size_t es = g.p.es, e0, lo, m;
        rc = reduce_down(&g, g.r, sbuf, rbuf);
        slice(&g, g.r + 1, &e0, &lo, &m); /* block r+1 is final here: sent straight on */
        if (rc == DL_OK)
            rc = dl__recv_reduce_copy_send(&g.p, (const char *)sbuf + e0 * es,
                                           (char *)rbuf + e0 * es, m, div);
        if (rc == DL_OK)
            rc = gather_down(&g, g.r + 1, rbuf);
    }
    return rc ? rc : dl__prims_flush(&g.p);
}
