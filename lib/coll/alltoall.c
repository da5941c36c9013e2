/* All-to-all: one message per peer (never two on one link, so posting everything first cannot
 * block), then every peer's block received in turn, then every outgoing link flushed
 * (dl__flush_peers, which alltoallv.c's two phases end with too). */
#include "config.h"
#include <string.h>
#include "distlab.h"
#include "coll/prims.h"
#include "coll/algo.h"

int dl__alltoall(dl_call *k, const void *sbuf, void *rbuf, size_t count, dl_dtype t)
{
    dl_comm *c = k->c;
    int n = c->sh->n, r = c->rank, rc;
    size_t bytes = count * dl_dtype_size(t);
    if (sbuf == rbuf && n > 1 && bytes) {
        /* in place: peers read our blocks while we overwrite them, so lend a copy instead */
        void *tmp;
        if ((rc = dl__scratch(c, bytes * (size_t)n, &tmp)))
            return rc;
        memcpy(tmp, sbuf, bytes * (size_t)n);
        sbuf = tmp;
    }
    for (int d = 1; d < n; d++) {
        dl_prims p;
        int to = dl__mod(r + d, n);
        if ((rc = dl__prims_open(&p, k, -1, to, t, DL_SUM)) ||
            (rc = dl__send(&p, (const char *)sbuf + (size_t)to * bytes, count)))
            return rc;
    }
    if (sbuf != rbuf)
        memcpy((char *)rbuf + (size_t)r * bytes, (const char *)sbuf + (size_t)r * bytes, bytes);
    for (int d = 1; d < n; d++) {
        dl_prims p;
        int from = dl__mod(r - d, n);
        if ((rc = dl__prims_open(&p, k, from, -1, t, DL_SUM)) ||
            (rc = dl__recv(&p, (char *)rbuf + (size_t)from * bytes, count)))
            return rc;
    }
    return dl__flush_peers(k);
}

int dl__flush_peers(dl_call *k)
{
    int n = k->c->sh->n, r = k->c->rank, rc;
    for (int d = 1; d < n; d++) {
        dl_prims p; /* the type is not read: a flush moves no elements */
        if ((rc = dl__prims_open(&p, k, -1, dl__mod(r + d, n), DL_F64, DL_SUM)) ||
            (rc = dl__prims_flush(&p)))
            return rc;
    }
    return DL_OK;
}
