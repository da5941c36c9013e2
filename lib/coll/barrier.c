/* The dissemination barrier: in round d (1, 2, 4, ...) every member sends an empty message to
 * member r + d and waits for the one from r - d; ceil(log2 n) rounds. */
#include "config.h"
#include "distlab.h"
#include "coll/prims.h"
#include "coll/algo.h"

int dl__barrier(dl_call *k)
{
    int n = k->c->sh->n, r = k->c->rank, rc;
    for (int d = 1; d < n; d <<= 1) {
        dl_prims p;
        if ((rc = dl__prims_open(&p, k, dl__mod(r - d, n), dl__mod(r + d, n), DL_F32, DL_SUM)) ||
            (rc = dl__send(&p, NULL, 0)) || (rc = dl__recv(&p, NULL, 0)))
            return rc;
    }
    return DL_OK;
}
