/* The world: rank threads, contexts, first-error propagation, abort, watchdog, flight recorder. */
#define _GNU_SOURCE
#include "config.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "distlab.h"
#include "core/arena.h"
#include "core/topo.h"
#include "transport/chan.h"
#include "distlab/mpi.h"
#include "runtime/internal.h"

void dl_world_opts_init(dl_world_opts *o)
{
    memset(o, 0, sizeof *o);
    o->nranks = 2;
    o->topology = NULL;
    o->policy = DL_PLACE_COMPACT;
    o->nodes = DL_NODE_PACKAGE;
    o->ranks_per_node = 1;
    o->bind = DL_BIND_AUTO;
    o->gpu_mem = 0;
    o->timeout_s = 60.0;
    o->wait_mode = -1;
    o->nslots = 16;
    o->eager_bytes = 4096;
    o->slice_bytes = 256 * 1024;
    o->mpi_slice_bytes = 128 * 1024;
    o->log = stderr;
    o->quiet = 0;
    o->mpi = -1;
}

static const char *opnames[OP_NCODES] = {
    "none",     "allreduce", "reduce_scatter", "allgather", "broadcast", "reduce",
    "alltoall", "barrier",   "send",           "recv",      "split",     "alltoallv",
};

const char *dl__opname(int op) { return op >= 0 && op < OP_NCODES ? opnames[op] : "?"; }

/* First error wins, except that a real error replaces a secondary abort. */
static int world_record(dl_world *w, int rank, int status, const char *msg)
{
    int first = 0;
    pthread_mutex_lock(&w->err_mu);
    if (w->err_status == DL_OK || (w->err_status == DL_EABORT && status != DL_EABORT)) {
        w->err_status = status;
        w->err_rank = rank;
        snprintf(w->err_msg, sizeof w->err_msg, "%s", msg);
        first = 1;
    }
    pthread_mutex_unlock(&w->err_mu);
    return first;
}

void dl__world_fail(dl_world *w, int rank, int status, const char *msg)
{
    int first = world_record(w, rank, status, msg);
    /* a world spanning processes tells the others (once, real errors only) */
    if (first && w->mpi)
        dl__mpi_notify(w, rank, status, msg);
    dl__world_abort(w);
}

void dl__world_fail_remote(dl_world *w, int rank, int status, const char *msg)
{
    world_record(w, rank, status, msg);
    dl__world_abort(w);
}

void dl__world_abort(dl_world *w)
{
    if (atomic_exchange(&w->abort_flag, 1))
        return;
    /* wake every sleeper on every link so that nobody waits for its futex timeout */
    pthread_mutex_lock(&w->reg_mu);
    for (dl_comm_shared *sh = w->registry; sh; sh = sh->next)
        for (int i = 0; i < sh->n * sh->n; i++) {
            dl_link *l = atomic_load(&sh->links[i]);
            if (l)
                l->ops->wake(l);
        }
    pthread_mutex_unlock(&w->reg_mu);
    /* every rank's queue wakes (its mutex exists from the start; `started` belongs to the rank,
     * which may be starting its thread just now, and a broadcast nobody waits for is harmless) */
    for (int r = 0; r < w->n; r++) {
        dl_progress *p = &w->ctxs[r].prog;
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_cond_broadcast(&p->done_cv);
        pthread_mutex_unlock(&p->mu);
    }
}

/* The watchdog (seconds) and the flight recorder (hang reports, in ms) need only a coarse clock:
 * CLOCK_MONOTONIC_COARSE is a vDSO load of the last tick (1-4 ms resolution), about a quarter of
 * a CLOCK_MONOTONIC read, and an 8-byte collective is only a few such reads long. */
static uint64_t coarse_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void dl__op_begin(dl_comm *c, int op, size_t count, int dtype, int peer)
{
    dl_ctx *x = c->ctx;
    /* point-to-point does not advance the collective sequence, which stays equal on all members */
    int coll = op != OP_SEND && op != OP_RECV;
    uint64_t seq = coll ? ++c->seq : c->seq;
    uint64_t now = coarse_now_ns();
    if (coll)
        atomic_store_explicit(&c->sh->entered[c->rank].seq, seq, memory_order_relaxed);
    atomic_store_explicit(&x->cur_peer, peer, memory_order_relaxed);
    atomic_store_explicit(&x->cur_sh, c->sh, memory_order_relaxed);
    atomic_store_explicit(&x->cur_seq, seq, memory_order_relaxed);
    atomic_store_explicit(&x->cur_op, op, memory_order_relaxed);
    atomic_store_explicit(&x->cur_t0, now, memory_order_relaxed);
    atomic_store_explicit(&x->cur_active, 1, memory_order_release);
    dl_flight *f = &x->flight[x->nflight++ % DL_FLIGHT_N];
    f->op = op;
    f->status = -1;
    f->comm_uid = c->sh->uid;
    f->seq = seq;
    f->count = count;
    f->dtype = dtype;
    f->peer = peer;
    f->t_start = now;
    f->t_end = 0;
    c->st.ops = seq;
}

void dl__op_end(dl_comm *c, int status)
{
    dl_ctx *x = c->ctx;
    atomic_store_explicit(&x->cur_active, 0, memory_order_release);
    dl_flight *f = &x->flight[(x->nflight - 1) % DL_FLIGHT_N];
    f->status = status;
    f->t_end = coarse_now_ns();
}

/* ---- watchdog ---- */

static void watchdog_check(dl_world *w)
{
    uint64_t now = dl_now_ns();
    uint64_t limit = (uint64_t)(w->opts.timeout_s * 1e9);
    for (int r = w->lo; r < w->hi; r++) {
        dl_ctx *x = &w->ctxs[r];
        if (!atomic_load_explicit(&x->cur_active, memory_order_acquire))
            continue;
        uint64_t t0 = atomic_load_explicit(&x->cur_t0, memory_order_relaxed);
        if (now < t0 || now - t0 < limit)
            continue;
        dl_comm_shared *sh = atomic_load_explicit(&x->cur_sh, memory_order_relaxed);
        uint64_t seq = atomic_load_explicit(&x->cur_seq, memory_order_relaxed);
        int op = atomic_load_explicit(&x->cur_op, memory_order_relaxed);
        if (op == OP_SEND || op == OP_RECV) {
            dl_comm_shared *psh = atomic_load_explicit(&x->cur_sh, memory_order_relaxed);
            int peer = atomic_load_explicit(&x->cur_peer, memory_order_relaxed);
            char pmsg[512];
            snprintf(pmsg, sizeof pmsg,
                     "watchdog: rank %d stuck for %.1f s in %s %s rank %d on communicator %llu; "
                     "rank %d never arrived",
                     r, (double)(now - t0) / 1e9, dl__opname(op), op == OP_SEND ? "to" : "from",
                     psh->world_ranks[peer], (unsigned long long)psh->uid, psh->world_ranks[peer]);
            dl__world_fail(w, r, DL_ETIMEOUT, pmsg);
            return;
        }
        char missing[1024];
        size_t len = 0;
        int nmiss = 0;
        missing[0] = '\0';
        for (int m = 0; m < sh->n; m++) {
            /* MPI worlds: only this process's members are known here */
            if (w->mpi && !dl__local(w, sh->world_ranks[m]))
                continue;
            if (atomic_load_explicit(&sh->entered[m].seq, memory_order_relaxed) < seq) {
                if (len < sizeof missing - 16)
                    len += (size_t)snprintf(missing + len, sizeof missing - len, "%s%d",
                                            nmiss ? ", " : "", sh->world_ranks[m]);
                nmiss++;
            }
        }
        char msg[1536];
        snprintf(msg, sizeof msg,
                 "watchdog: rank %d stuck for %.1f s in %s #%llu on communicator %llu (%d ranks); "
                 "%s%s",
                 r, (double)(now - t0) / 1e9, dl__opname(op), (unsigned long long)seq,
                 (unsigned long long)sh->uid, sh->n,
                 nmiss    ? "ranks that never arrived: "
                 : w->mpi ? "every rank of this process arrived (a peer stopped sending)"
                          : "every rank arrived (a peer stopped sending)",
                 missing);
        dl__world_fail(w, r, DL_ETIMEOUT, msg);
        return;
    }
}

static void *watchdog_main(void *arg)
{
    dl_world *w = arg;
    long period_ns = (long)(w->opts.timeout_s * 1e9 / 10);
    if (period_ns > 100000000L)
        period_ns = 100000000L;
    if (period_ns < 1000000L)
        period_ns = 1000000L;
    pthread_mutex_lock(&w->wd_mu);
    while (!w->wd_stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += period_ns;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&w->wd_cv, &w->wd_mu, &ts);
        if (w->wd_stop)
            break;
        pthread_mutex_unlock(&w->wd_mu);
        if (!atomic_load(&w->abort_flag))
            watchdog_check(w);
        pthread_mutex_lock(&w->wd_mu);
    }
    pthread_mutex_unlock(&w->wd_mu);
    return NULL;
}

/* ---- rank threads ---- */

void dl__bind_thread(dl_ctx *x, int note)
{
    const dl_world *w = x->w;
    int os = w->place->os_pu[x->rank], cpu = -1;
    char cpus[sizeof x->cpus] = "any";
    /* a failed binding (e.g. hwloc pointed at an XML file) leaves the thread where it was */
    if (w->bind == DL_BIND_PU && dl_topo_bind_self(w->topo, os, &cpu) == DL_OK)
        snprintf(cpus, sizeof cpus, "%d", cpu);
    else if (w->bind == DL_BIND_PACKAGE)
        (void)dl_topo_bind_self_package(w->topo, os, cpus, sizeof cpus);
    if (note) {
        x->cpu = cpu;
        memcpy(x->cpus, cpus, sizeof cpus);
    }
}

struct rank_arg {
    dl_ctx *ctx;
    dl_rank_fn fn;
    void *arg;
};

static void *rank_main(void *p)
{
    struct rank_arg *ra = p;
    dl_ctx *x = ra->ctx;
    dl_world *w = x->w;
    dl_error_clear();
    dl__bind_thread(x, 1);
    int rc = ra->fn(x, ra->arg);
    if (x->prog.started)
        dl__progress_stop(x);
    x->status = rc;
    if (rc != DL_OK) {
        const char *m = dl_errmsg();
        char prefix[32];
        int plen = snprintf(prefix, sizeof prefix, "rank %d: ", x->rank);
        /* messages that already name the rank (the arena's) are not prefixed twice */
        snprintf(x->errmsg, sizeof x->errmsg, "%s%s",
                 strncmp(m, prefix, (size_t)plen) ? prefix : "", m[0] ? m : dl_strstatus(rc));
        dl__world_fail(w, x->rank, rc, x->errmsg);
    }
    return NULL;
}

static void flight_dump(const dl_ctx *x, FILE *f, uint64_t t_base)
{
    uint64_t n = x->nflight < DL_FLIGHT_N ? x->nflight : DL_FLIGHT_N;
    fprintf(f, "  rank %d: last %llu operations (of %llu)%s\n", x->rank, (unsigned long long)n,
            (unsigned long long)x->nflight, n ? ":" : "");
    for (uint64_t i = x->nflight - n; i < x->nflight; i++) {
        const dl_flight *e = &x->flight[i % DL_FLIGHT_N];
        double ts = (double)(e->t_start - t_base) / 1e6;
        if (e->status < 0)
            fprintf(f, "    %-14s #%-6llu comm %llu count %zu  started %.3f ms, NOT FINISHED\n",
                    dl__opname(e->op), (unsigned long long)e->seq, (unsigned long long)e->comm_uid,
                    e->count, ts);
        else
            fprintf(f, "    %-14s #%-6llu comm %llu count %zu  started %.3f ms, took %.3f ms: %s\n",
                    dl__opname(e->op), (unsigned long long)e->seq, (unsigned long long)e->comm_uid,
                    e->count, ts, (double)(e->t_end - e->t_start) / 1e6, dl_strstatus(e->status));
    }
}

void dl_ctx_flight_dump(const dl_ctx *c, FILE *f) { flight_dump(c, f, 0); }

/* A world spanning MPI processes: each process is one node; this process's ranks are placed on
 * this machine next to those of the other processes on the same host (host index h of L: the
 * local ranks take slots h*T ... h*T+T-1 of a placement of L*T ranks). */
static int place_processes(dl_world *w)
{
    int T = w->hi - w->lo, L = dl_mpi_host_size(), h = dl_mpi_host_rank();
    dl_placement *loc;
    const dl_world_opts *o = &w->opts;
    int rc = dl_place(w->topo, L * T, o->policy, o->nodes, o->ranks_per_node, &loc);
    if (rc)
        return rc;
    dl_placement *p = w->place;
    for (int r = 0; r < w->n; r++) p->node[r] = r / T;
    for (int t = 0; t < T; t++) {
        int g = w->lo + t, l = h * T + t;
        p->pu[g] = loc->pu[l];
        p->os_pu[g] = loc->os_pu[l];
        p->core[g] = loc->core[l];
        p->l3[g] = loc->l3[l];
        p->numa[g] = loc->numa[l];
        p->package[g] = loc->package[l];
    }
    p->nnodes = w->nprocs;
    p->wrapped = loc->wrapped;
    dl_placement_destroy(loc);
    return DL_OK;
}

static int check_opts(const dl_world_opts *o, dl_rank_fn fn)
{
    if (!o || !fn)
        return dl_error(DL_EINVAL, "dl_world_run: null options or rank function");
    if (o->nranks < 1 || o->nranks > 4096)
        return dl_error(DL_EINVAL, "dl_world_run: invalid rank count %d (need 1..4096)", o->nranks);
    if (o->nslots < 2 || (o->nslots & (o->nslots - 1)))
        return dl_error(DL_EINVAL, "dl_world_run: slots per channel %d is not a power of two >= 2",
                        o->nslots);
    if (o->slice_bytes < 64)
        return dl_error(DL_EINVAL, "dl_world_run: slice size %zu too small (>= 64)",
                        o->slice_bytes);
    if (o->bind < DL_BIND_AUTO || o->bind > DL_BIND_PACKAGE)
        return dl_error(DL_EINVAL,
                        "dl_world_run: unknown binding %d (-1 auto, 0 none, 1 pu, 2 package)",
                        o->bind);
    if (o->wait_mode < -1 || o->wait_mode > DL_WAIT_YIELD)
        return dl_error(DL_EINVAL, "dl_world_run: unknown wait mode %d", o->wait_mode);
    return DL_OK;
}

/* A new world of o->nranks ranks, all hosted here until MPI says otherwise; NULL: no memory. */
static dl_world *world_alloc(const dl_world_opts *o)
{
    dl_world *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    w->opts = *o;
    w->n = o->nranks;
    w->lo = 0;
    w->hi = w->n;
    w->nprocs = 1;
    w->err_rank = -1;
    pthread_mutex_init(&w->err_mu, NULL);
    pthread_mutex_init(&w->reg_mu, NULL);
    pthread_mutex_init(&w->wd_mu, NULL);
    pthread_cond_init(&w->wd_cv, NULL);
    pthread_mutex_init(&w->hier_mu, NULL);
    atomic_init(&w->abort_flag, 0);
    atomic_init(&w->next_uid, 1);
    return w;
}

/* The machine's topology, MPI's processes and every rank's place. */
static int world_place(dl_world *w)
{
    const dl_world_opts *o = &w->opts;
    int rc = dl_topo_load(&w->topo, o->topology);
    if (rc == DL_OK && dl__mpi_want(o))
        rc = dl__mpi_world_begin(w);
    if (rc == DL_OK)
        rc = dl_place(w->topo, w->n, o->policy, o->nodes, o->ranks_per_node, &w->place);
    if (rc == DL_OK && w->mpi)
        rc = place_processes(w);
    return rc;
}

/* Every rank's context; this process's ranks also get their arena and world communicator. */
static int world_contexts(dl_world *w, int mode)
{
    int rc = DL_OK;
    for (int r = 0; rc == DL_OK && r < w->n; r++) {
        dl_ctx *x = &w->ctxs[r];
        x->w = w;
        x->rank = r;
        x->cpu = -1;
        snprintf(x->cpus, sizeof x->cpus, "any");
        x->node = w->place->node[r];
        x->waiter.mode = (dl_wait_mode)mode;
        x->waiter.spins = mode == DL_WAIT_SPIN ? 4000 : 1000;
        x->waiter.abort_flag = &w->abort_flag;
        pthread_mutex_init(&x->prog.mu, NULL);
        pthread_cond_init(&x->prog.cv, NULL);
        pthread_cond_init(&x->prog.done_cv, NULL);
        if (!dl__local(w, r))
            continue; /* hosted by another process */
        rc = dl_arena_create(&x->arena, r, w->opts.gpu_mem);
        if (rc == DL_OK)
            rc = dl__comm_create(w->world_sh, r, x, &x->world_comm);
    }
    return rc;
}

/* Run this process's ranks (ras: one argument each) under the watchdog, until all return. */
static void world_launch(dl_world *w, struct rank_arg *ras, dl_rank_fn fn, void *arg)
{
    int wd_on = w->opts.timeout_s > 0;
    if (wd_on && pthread_create(&w->wd, NULL, watchdog_main, w) != 0)
        wd_on = 0;
    int started = 0;
    for (int r = w->lo; r < w->hi; r++) {
        ras[r] = (struct rank_arg){&w->ctxs[r], fn, arg};
        if (pthread_create(&w->threads[r], NULL, rank_main, &ras[r]) != 0) {
            dl__world_fail(w, r, DL_ESYS, "dl_world_run: cannot start rank thread");
            break;
        }
        started++;
    }
    for (int r = w->lo; r < w->lo + started; r++) pthread_join(w->threads[r], NULL);
    dl__mpi_world_end(w);
    if (wd_on) {
        pthread_mutex_lock(&w->wd_mu);
        w->wd_stop = 1;
        pthread_cond_signal(&w->wd_cv);
        pthread_mutex_unlock(&w->wd_mu);
        pthread_join(w->wd, NULL);
    }
}

/* The first error and every local rank's flight recorder on the log. */
static void flight_report(const dl_world *w, FILE *log)
{
    fprintf(log, "distlab: %s\n", w->err_msg);
    uint64_t base = UINT64_MAX;
    for (int r = w->lo; r < w->hi; r++)
        for (uint64_t i = 0; i < w->ctxs[r].nflight && i < DL_FLIGHT_N; i++)
            if (w->ctxs[r].flight[i].t_start < base)
                base = w->ctxs[r].flight[i].t_start;
    if (base == UINT64_MAX)
        base = 0;
    fprintf(log, "distlab: flight recorder (times from the first operation)%s:\n",
            w->mpi ? " of this process's ranks" : "");
    for (int r = w->lo; r < w->hi; r++) flight_dump(&w->ctxs[r], log, base);
    fflush(log);
}

int dl_world_run_keep(const dl_world_opts *o, dl_rank_fn fn, void *arg, dl_world **out)
{
    *out = NULL;
    int rc = check_opts(o, fn);
    if (rc)
        return rc;
    dl_world *w = world_alloc(o);
    if (!w)
        return dl_error(DL_ENOMEM, "dl_world_run: out of memory");
    rc = world_place(w);
    if (rc != DL_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", dl_errmsg());
        dl_world_destroy(w);
        return dl_error(rc, "dl_world_run: %s", msg);
    }
    w->oversub = (w->mpi ? (w->hi - w->lo) * dl_mpi_host_size() : w->n) > dl_topo_real_pus(w->topo);
    int mode = o->wait_mode >= 0 ? o->wait_mode : (w->oversub ? DL_WAIT_YIELD : DL_WAIT_SPIN);
    w->bind = o->bind != DL_BIND_AUTO ? o->bind : w->oversub ? DL_BIND_PACKAGE : DL_BIND_PU;
    w->rd_one_round = w->oversub && !w->mpi;

    w->ctxs = calloc((size_t)w->n, sizeof *w->ctxs);
    w->threads = calloc((size_t)w->n, sizeof *w->threads);
    struct rank_arg *ras = calloc((size_t)w->n, sizeof *ras);
    int *all = malloc(sizeof(int) * (size_t)w->n);
    if (!w->ctxs || !w->threads || !ras || !all) {
        free(ras);
        free(all);
        dl_world_destroy(w);
        return dl_error(DL_ENOMEM, "dl_world_run: out of memory for %d ranks", o->nranks);
    }
    for (int r = 0; r < w->n; r++) all[r] = r;
    rc = dl__shared_create(w, w->n, all, &w->world_sh);
    free(all);
    if (rc == DL_OK)
        rc = world_contexts(w, mode);
    if (rc != DL_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", dl_errmsg());
        free(ras);
        *out = w;
        return dl_error(rc, "dl_world_run: %s", msg);
    }
    world_launch(w, ras, fn, arg);
    free(ras);
    *out = w;
    if (w->err_status != DL_OK) {
        /* the flight recorder explains hangs and disagreeing ranks; for any other error the
         * message returned to the caller says it all */
        int comm_error = w->err_status == DL_ETIMEOUT || w->err_status == DL_EMISMATCH;
        if (o->log && !o->quiet && comm_error)
            flight_report(w, o->log);
        return dl_error(w->err_status, "%s", w->err_msg);
    }
    return DL_OK;
}

int dl_world_run(const dl_world_opts *o, dl_rank_fn fn, void *arg)
{
    dl_world *w;
    int rc = dl_world_run_keep(o, fn, arg, &w);
    if (w) {
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", dl_errmsg());
        dl_world_destroy(w);
        if (rc)
            dl_error(rc, "%s", msg);
    }
    return rc;
}

void dl_world_destroy(dl_world *w)
{
    if (!w)
        return;
    if (w->ctxs) {
        for (int r = 0; r < w->n; r++) {
            dl_ctx *x = &w->ctxs[r];
            if (x->world_comm) {
                dl_comm *c = x->world_comm;
                if (c->scratch)
                    dl_arena_free(x->arena, c->scratch);
                free(c->h_intra); /* hierarchical views (MPI worlds); their scratch goes with */
                free(c->h_inter); /* the arena, their records with the registry */
                free(c);
            }
            dl_arena_destroy(x->arena);
            pthread_mutex_destroy(&x->prog.mu);
            pthread_cond_destroy(&x->prog.cv);
            pthread_cond_destroy(&x->prog.done_cv);
        }
    }
    /* free every communicator's shared state still registered (world's and leaked splits) */
    dl_comm_shared *sh = w->registry;
    while (sh) {
        dl_comm_shared *next = sh->next;
        for (int i = 0; i < sh->n * sh->n; i++) dl_link_destroy(atomic_load(&sh->links[i]));
        free(sh->links);
        free(sh->hier);
        free(sh->entered);
        free(sh->world_ranks);
        free(sh);
        sh = next;
    }
    dl__mpi_world_free(w);
    free(w->ctxs);
    free(w->threads);
    dl_placement_destroy(w->place);
    dl_topo_destroy(w->topo);
    pthread_mutex_destroy(&w->err_mu);
    pthread_mutex_destroy(&w->reg_mu);
    pthread_mutex_destroy(&w->wd_mu);
    pthread_cond_destroy(&w->wd_cv);
    pthread_mutex_destroy(&w->hier_mu);
    free(w);
}

const dl_placement *dl_world_placement(const dl_world *w) { return w->place; }
const dl_topo *dl_world_topo(const dl_world *w) { return w->topo; }
int dl_world_actual_cpu(const dl_world *w, int rank)
{
    return rank >= 0 && rank < w->n && w->ctxs ? w->ctxs[rank].cpu : -1;
}
int dl_world_error_rank(const dl_world *w) { return w->err_rank; }
int dl_world_oversubscribed(const dl_world *w) { return w->oversub; }
int dl_world_local(const dl_world *w, int *first, int *count)
{
    if (first)
        *first = w->lo;
    if (count)
        *count = w->hi - w->lo;
    return w->nprocs;
}

int dl_ctx_rank(const dl_ctx *c) { return c->rank; }
int dl_ctx_size(const dl_ctx *c) { return c->w->n; }
int dl_ctx_node(const dl_ctx *c) { return c->node; }
int dl_ctx_nnodes(const dl_ctx *c) { return c->w->place->nnodes; }
int dl_ctx_cpu(const dl_ctx *c) { return c->cpu; }
const char *dl_ctx_cpus(const dl_ctx *c) { return c->cpus; }
dl_comm *dl_ctx_comm(dl_ctx *c) { return c->world_comm; }
dl_arena *dl_ctx_arena(dl_ctx *c) { return c->arena; }
const dl_waiter *dl_ctx_waiter(const dl_ctx *c) { return &c->waiter; }
dl_world *dl_ctx_world(dl_ctx *c) { return c->w; }
const dl_world_opts *dl_ctx_opts(const dl_ctx *c) { return &c->w->opts; }
int dl_ctx_aborted(const dl_ctx *c) { return atomic_load(&c->w->abort_flag) != 0; }
