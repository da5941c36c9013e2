#define _GNU_SOURCE
/* Acting on an injected fault (runtime/fault.h): error fails the operation, hang waits there
 * until the world is aborted (the peers' watchdog names the rank, the operation and its
 * sequence), slow sleeps before it, crash _exits the process (DL__FAULT_CRASH_STATUS). */
#include "config.h"
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "distlab.h"
#include "runtime/fault.h"
#include "runtime/internal.h"

static dl__fault plan;     /* written by the caller's thread while no rank runs */
static atomic_int planned; /* 1 while plan holds a fault */

void dl__fault_install(const dl__fault *f)
{
    if (f)
        plan = *f;
    atomic_store(&planned, f != NULL);
}

void dl__comm_set_label(dl_comm *c, dl__comm_label label)
{
    if (c)
        c->label = (int)label;
}

static void nap_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

/* The fault at `where` of rank x. */
static int act(dl_ctx *x, const char *where)
{
    const atomic_int *abort_flag = x->waiter.abort_flag;
    int rank = x->rank;
    char spec[128];
    dl__fault_text(&plan, spec, sizeof spec);
    switch (plan.kind) {
    case DL__FAULT_SLOW: nap_ms(plan.ms); return DL_OK;
    case DL__FAULT_CRASH:
        fprintf(stderr, "distlab: injected fault %s: rank %d crashes at %s (exit %d)\n", spec, rank,
                where, DL__FAULT_CRASH_STATUS);
        fflush(stderr);
        _exit(DL__FAULT_CRASH_STATUS);
    case DL__FAULT_HANG:
        /* stopped here: only the world's abort (the peers' watchdog) ends the wait */
        while (!abort_flag || !atomic_load(abort_flag)) nap_ms(1);
        return dl_error(DL_EABORT, "injected fault %s: rank %d hung at %s", spec, rank, where);
    default: {
        /* failed as a real failure fails: the world aborted with this message, so that no peer
         * waits for this rank (under MPI the other processes are told) */
        char msg[512];
        snprintf(msg, sizeof msg, "injected fault %s: rank %d failed %s", spec, rank, where);
        dl__world_fail(x->w, rank, DL_EUSER, msg);
        return dl_error(DL_EUSER, "%s", msg);
    }
    }
}

int dl__fault_step(dl_ctx *x, int step)
{
    if (!atomic_load_explicit(&planned, memory_order_relaxed) || plan.at != DL__AT_STEP ||
        plan.rank != x->rank || plan.n != step)
        return DL_OK;
    char where[64];
    snprintf(where, sizeof where, "step %d", step);
    return act(x, where);
}

int dl__fault_op(dl_comm *c, int op)
{
    if (!atomic_load_explicit(&planned, memory_order_relaxed) || plan.at != DL__AT_COLL)
        return DL_OK;
    int label = c->sh->uid == 0 ? DL__COMM_WORLD : c->label;
    if (label != (int)plan.comm || c->ctx->rank != plan.rank || c->seq + 1 != (uint64_t)plan.n)
        return DL_OK;
    char where[96];
    snprintf(where, sizeof where, "%s #%ld on %s", dl__opname(op), plan.n,
             dl__comm_label_name(label));
    return act(c->ctx, where);
}
