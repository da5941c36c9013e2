/* Chain broadcast and chain reduce, sliced like the ring (R slices of the whole buffer).
 *
 * Broadcast: the root sends each slice; every other member recv-copy-sends it on, the last one
 * only receives. Reduce: the member after the root starts by sending its input; every member
 * after it recv-reduce-sends its partial on (in scratch: only the root has an output), and the
 * root ends the chain with the final sum. */
#include "config.h"
#include <string.h>
#include "distlab.h"
#include "coll/prims.h"
#include "coll/algo.h"

/* prims of the member at position pos of the chain (0 starts it, n - 1 ends it) */
static int chain_open(dl_prims *p, dl_call *k, int pos, dl_dtype t, dl_redop op)
{
    int n = k->c->sh->n, r = k->c->rank;
    return dl__prims_open(p, k, pos > 0 ? dl__mod(r - 1, n) : -1,
                          pos < n - 1 ? dl__mod(r + 1, n) : -1, t, op);
}

int dl__chain_broadcast(dl_call *k, const void *sbuf, void *rbuf, size_t count, dl_dtype t,
                        int root)
{
    int n = k->c->sh->n, pos = dl__mod(k->c->rank - root, n);
    dl_prims p;
    int rc = chain_open(&p, k, pos, t, DL_SUM);
    size_t es = p.es, R = dl__nrounds(count, 1, es, dl__slice_bytes(k->c));
    for (size_t q = 0; q < R && rc == DL_OK; q++) {
        size_t lo = count * q / R, m = count * (q + 1) / R - lo;
        char *dst = (char *)rbuf + lo * es;
        if (pos == 0) {
            if (rbuf != sbuf)
                memcpy(dst, (const char *)sbuf + lo * es, m * es);
            rc = dl__send(&p, dst, m);
        } else if (pos < n - 1) {
            rc = dl__recv_copy_send(&p, dst, m);
        } else {
            rc = dl__recv(&p, dst, m);
        }
    }
    return rc ? rc : dl__prims_flush(&p);
}

int dl__chain_reduce(dl_call *k, const void *sbuf, void *rbuf, size_t count, dl_dtype t,
                     dl_redop op, int root)
{
    int n = k->c->sh->n, pos = dl__mod(k->c->rank - root - 1, n); /* root + 1 starts */
    dl_prims p;
    int rc = chain_open(&p, k, pos, t, op);
    size_t es = p.es, R = dl__nrounds(count, 1, es, dl__slice_bytes(k->c));
    char *part = NULL;
    if (rc == DL_OK && pos > 0 && pos < n - 1)
        rc = dl__scratch(k->c, count * es, (void **)&part);
    double div = op == DL_AVG ? (double)n : 1.0;
    for (size_t q = 0; q < R && rc == DL_OK; q++) {
        size_t lo = count * q / R, m = count * (q + 1) / R - lo;
        const char *mine = (const char *)sbuf + lo * es;
        if (pos == 0)
            rc = dl__send(&p, mine, m);
        else if (pos < n - 1)
            rc = dl__recv_reduce_send(&p, mine, part + lo * es, m);
        else
            rc = dl__recv_reduce_copy(&p, mine, (char *)rbuf + lo * es, m, div);
    }
    return rc ? rc : dl__prims_flush(&p);
}
