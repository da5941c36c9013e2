/* The private test hook (lib/core/testhook.h): negative controls for the equivalence tests. */
#include "core/testhook.h"

static dl__test_hook *hook; /* written by the test's thread while no rank runs */

void dl__test_hook_set(dl__test_hook *h)
{
    if (h) {
        atomic_store(&h->skipped, 0);
        atomic_store(&h->perturbed, 0);
        atomic_store(&h->chan_asleep[0], 0);
        atomic_store(&h->chan_asleep[1], 0);
        atomic_store(&h->chan_asleep[2], 0);
        atomic_store(&h->chan_timeouts, 0);
        atomic_store(&h->ckpt_points, 0);
    }
    hook = h;
}

dl__test_hook *dl__test_hook_get(void) { return hook; }

int dl__test_skip_reduction(dl_purpose p, unsigned long *seen)
{
    dl__test_hook *h = hook;
    if (!h || h->skip_nth <= 0 || p != h->skip_purpose)
        return 0;
    if (++*seen != (unsigned long)h->skip_nth)
        return 0;
    atomic_fetch_add(&h->skipped, 1);
    return 1;
}
