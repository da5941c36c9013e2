/* The MPI transport (distlab/mpi.h): worlds spanning processes and the MPI link.
 *
 * A world spanning P processes gets its own MPI communicator (MPI_Comm_idup of a private dup of
 * MPI_COMM_WORLD), so that messages of one world never match receives of the next. Tag 0 carries
 * error notices between processes; a link from world rank s to world rank d of distlab
 * communicator `cid` uses tag 1 + (cid*T + s mod T)*T + d mod T (T rank threads per process),
 * unique per (communicator, source thread, destination thread) between two processes, so MPI's
 * non-overtaking order per (source, tag) keeps each link FIFO. Communicator ids are allocated by
 * the new group's rank 0 as (1 + counter*P + its process)*(T+1), unique in the job; the ids in
 * between name the cross-process groups of the hierarchical all-reduce.
 *
 * The MPI link (one end per process; links inside a process are shared-memory channels):
 *   - every message starts with a 64-byte header (bytes, fingerprint); up to `eager_bytes` the
 *     payload follows the header in the same MPI message, copied into one of the link's nslots
 *     send buffers (like the channel's eager slots);
 *   - larger payloads are lent: a second MPI message is sent straight from the caller's buffer
 *     (no copy), and flush waits for those sends to complete, as the channel's flush waits for
 *     the receiver's release;
 *   - the receiver receives the header (and eager payload) into its slot buffer, then a large
 *     payload into a page-aligned buffer of the link, and hands out a pointer to it until release.
 * Waiting polls MPI_Test (spin or yield, then short sleeps), checking the abort flag. */
#define _GNU_SOURCE
#include "config.h"
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "distlab.h"
#include "transport/chan.h"
#include "distlab/mpi.h"
#include "runtime/internal.h"

#ifndef DL_HAVE_MPI

int dl_mpi_available(void) { return 0; }
int dl_mpi_init(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    return dl_error(DL_EINVAL, "dl_mpi_init: distlab was built without MPI (configure --with-mpi)");
}
int dl_mpi_finalize(void) { return DL_OK; }
int dl_mpi_active(void) { return 0; }
int dl_mpi_rank(void) { return 0; }
int dl_mpi_size(void) { return 1; }
int dl_mpi_host_rank(void) { return 0; }
int dl_mpi_host_size(void) { return 1; }
int dl__mpi_want(const dl_world_opts *o) { return o->mpi == 1; }
int dl__mpi_world_begin(dl_world *w)
{
    (void)w;
    return dl_error(DL_EINVAL, "world: spanning MPI processes (mpi = 1) needs distlab built with "
                               "MPI (configure --with-mpi)");
}
void dl__mpi_world_end(dl_world *w) { (void)w; }
void dl__mpi_world_free(dl_world *w) { (void)w; }
void dl__mpi_notify(dl_world *w, int rank, int status, const char *msg)
{
    (void)w, (void)rank, (void)status, (void)msg;
}

#else /* DL_HAVE_MPI */

#include <mpi.h>

#define TAG_NOTICE 0
#define NOTICE_BYTES 2048
#define HDR 64

static struct {
    int active, owns;
    int rank, size, host_rank, host_size;
    long tag_ub;
    MPI_Comm base;
} g;

int dl_mpi_available(void) { return 1; }
int dl_mpi_active(void) { return g.active; }
int dl_mpi_rank(void) { return g.active ? g.rank : 0; }
int dl_mpi_size(void) { return g.active ? g.size : 1; }
int dl_mpi_host_rank(void) { return g.active ? g.host_rank : 0; }
int dl_mpi_host_size(void) { return g.active ? g.host_size : 1; }

static const char *level_name(int l)
{
    return l == MPI_THREAD_SINGLE       ? "MPI_THREAD_SINGLE"
           : l == MPI_THREAD_FUNNELED   ? "MPI_THREAD_FUNNELED"
           : l == MPI_THREAD_SERIALIZED ? "MPI_THREAD_SERIALIZED"
                                        : "MPI_THREAD_MULTIPLE";
}

int dl_mpi_init(int *argc, char ***argv)
{
    if (g.active)
        return DL_OK;
    int inited = 0, provided = MPI_THREAD_SINGLE;
    MPI_Initialized(&inited);
    if (!inited) {
        if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
            return dl_error(DL_ESYS, "dl_mpi_init: MPI_Init_thread failed");
        g.owns = 1;
    } else {
        MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_MULTIPLE) {
        if (g.owns)
            MPI_Finalize();
        g.owns = 0;
        return dl_error(DL_ESYS,
                        "dl_mpi_init: this MPI provides %s; distlab's rank threads call MPI "
                        "concurrently and need MPI_THREAD_MULTIPLE",
                        level_name(provided));
    }
    MPI_Comm_dup(MPI_COMM_WORLD, &g.base);
    MPI_Comm_set_errhandler(g.base, MPI_ERRORS_RETURN);
    MPI_Comm_rank(g.base, &g.rank);
    MPI_Comm_size(g.base, &g.size);
    MPI_Comm host;
    if (MPI_Comm_split_type(g.base, MPI_COMM_TYPE_SHARED, g.rank, MPI_INFO_NULL, &host) ==
        MPI_SUCCESS) {
        MPI_Comm_rank(host, &g.host_rank);
        MPI_Comm_size(host, &g.host_size);
        MPI_Comm_free(&host);
    } else {
        g.host_rank = 0;
        g.host_size = 1;
    }
    void *v = NULL;
    int flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &v, &flag);
    g.tag_ub = flag && v ? *(int *)v : 32767;
    g.active = 1;
    return DL_OK;
}

int dl_mpi_finalize(void)
{
    if (!g.active)
        return DL_OK;
    MPI_Comm_free(&g.base);
    g.active = 0;
    if (g.owns) {
        g.owns = 0;
        if (MPI_Finalize() != MPI_SUCCESS)
            return dl_error(DL_ESYS, "dl_mpi_finalize: MPI_Finalize failed");
    }
    return DL_OK;
}

/* ---- polling ---- */

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void nap(long ns)
{
    struct timespec ts = {0, ns};
    nanosleep(&ts, NULL);
}

/* Wait for *rq: spin (or yield) `spins` polls, yield up to 2 ms, then poll every 50 us.
 * honor_abort: leave with DL_EABORT when the world aborts (the request stays active).
 * limit_ns > 0: leave with DL_ETIMEOUT after that long. */
static int poll_req(MPI_Request *rq, MPI_Status *st, const dl_waiter *w, int honor_abort,
                    uint64_t limit_ns, uint64_t *wait_ns, uint64_t *sleeps)
{
    int flag = 0;
    if (MPI_Test(rq, &flag, st) != MPI_SUCCESS)
        return dl_error(DL_ESYS, "MPI_Test failed");
    if (flag)
        return DL_OK;
    uint64_t t0 = dl_now_ns(), now = t0;
    int spins = w ? w->spins : 1000;
    int mode = w ? (int)w->mode : DL_WAIT_SPIN;
    atomic_int *abort_flag = w ? w->abort_flag : NULL;
    int slept = 0, rc = DL_OK;
    for (long i = 0;; i++) {
        if (honor_abort && abort_flag && atomic_load_explicit(abort_flag, memory_order_relaxed)) {
            rc = dl_error(DL_EABORT, "aborted while waiting on an MPI link");
            break;
        }
        if (i < spins) {
            if (mode == DL_WAIT_SPIN)
                cpu_relax();
            else
                sched_yield();
        } else if (now - t0 < 2000000) {
            sched_yield();
        } else {
            nap(50000);
            slept = 1;
        }
        if (MPI_Test(rq, &flag, st) != MPI_SUCCESS) {
            rc = dl_error(DL_ESYS, "MPI_Test failed");
            break;
        }
        if (flag)
            break;
        if ((i & 63) == 0 || i >= spins)
            now = dl_now_ns();
        if (limit_ns && now - t0 > limit_ns) {
            rc = dl_error(DL_ETIMEOUT, "MPI request not complete after %.1f s",
                          (double)limit_ns / 1e9);
            break;
        }
    }
    if (wait_ns)
        *wait_ns += dl_now_ns() - t0;
    if (sleeps)
        *sleeps += (uint64_t)slept;
    return rc;
}

/* ---- the world's MPI state ---- */

typedef struct dl_mpi_world {
    dl_world *w;
    MPI_Comm comm;
    int T;
    uint64_t cid_max;
    atomic_ullong next_cid;
    pthread_t ctl;
    int ctl_on;
    atomic_int ctl_stop;
    char notice_in[NOTICE_BYTES];
    char notice_out[NOTICE_BYTES];
    atomic_int notified;
    MPI_Request *out_req; /* [nprocs] notices sent */
} dl_mpi_world;

typedef struct notice {
    int32_t status, rank;
    char msg[NOTICE_BYTES - 8];
} notice;
_Static_assert(sizeof(notice) == NOTICE_BYTES, "notice size");

/* The control thread: waits for another process's error notice and fails this world with it. */
static void *ctl_main(void *arg)
{
    dl_mpi_world *mw = arg;
    MPI_Request rq;
    MPI_Status st;
    if (MPI_Irecv(mw->notice_in, NOTICE_BYTES, MPI_BYTE, MPI_ANY_SOURCE, TAG_NOTICE, mw->comm,
                  &rq) != MPI_SUCCESS)
        return NULL;
    while (!atomic_load(&mw->ctl_stop)) {
        int flag = 0;
        MPI_Test(&rq, &flag, &st);
        if (flag) {
            notice nt;
            memcpy(&nt, mw->notice_in, sizeof nt);
            nt.msg[sizeof nt.msg - 1] = '\0';
            dl__world_fail_remote(mw->w, nt.rank, nt.status, nt.msg);
            return NULL;
        }
        nap(1000000);
    }
    MPI_Cancel(&rq);
    MPI_Wait(&rq, MPI_STATUS_IGNORE);
    return NULL;
}

int dl__mpi_want(const dl_world_opts *o)
{
    if (o->mpi == 0)
        return 0;
    if (o->mpi == 1)
        return 1;
    return g.active && g.size > 1;
}

static uint64_t mpi_new_cid(dl_world *w);
static int mpi_link_create(dl_world *w, uint64_t cid, int src, int dst, dl_link **out);

/* what communicators use of MPI (internal.h) */
static const dl_remote_ops mpi_remote = {mpi_link_create, mpi_new_cid};

int dl__mpi_world_begin(dl_world *w)
{
    if (!g.active)
        return dl_error(DL_EINVAL, "world: spanning MPI processes needs dl_mpi_init() first");
    int P = g.size;
    if (w->n % P)
        return dl_error(DL_EINVAL,
                        "world: %d ranks do not divide over %d MPI processes (the world "
                        "is processes x threads per process)",
                        w->n, P);
    int T = w->n / P;
    dl_mpi_world *mw = calloc(1, sizeof *mw);
    MPI_Request *oq = calloc((size_t)P, sizeof *oq);
    if (!mw || !oq) {
        free(mw);
        free(oq);
        return dl_error(DL_ENOMEM, "world: out of memory");
    }
    for (int i = 0; i < P; i++) oq[i] = MPI_REQUEST_NULL;
    mw->out_req = oq;
    mw->w = w;
    mw->T = T;
    atomic_init(&mw->next_cid, 0);
    atomic_init(&mw->ctl_stop, 0);
    atomic_init(&mw->notified, 0);
    uint64_t tt = (uint64_t)T * (uint64_t)T;
    mw->cid_max = (uint64_t)g.tag_ub > tt ? ((uint64_t)g.tag_ub - tt) / tt : 0;
    if (mw->cid_max < 1) {
        free(oq);
        free(mw);
        return dl_error(DL_EINVAL,
                        "world: %d threads per process do not fit this MPI's tag space "
                        "(MPI_TAG_UB %ld)",
                        T, g.tag_ub);
    }
    /* every process creates the world's communicator; a process that never comes is a hang
     * the watchdog's timeout bounds */
    MPI_Request rq;
    if (MPI_Comm_idup(g.base, &mw->comm, &rq) != MPI_SUCCESS) {
        free(oq);
        free(mw);
        return dl_error(DL_ESYS, "world: MPI_Comm_idup failed");
    }
    uint64_t limit = w->opts.timeout_s > 0 ? (uint64_t)(w->opts.timeout_s * 1e9) : 0;
    dl_waiter wt = {DL_WAIT_YIELD, 100, NULL};
    int rc = poll_req(&rq, MPI_STATUS_IGNORE, &wt, 0, limit, NULL, NULL);
    if (rc) {
        /* the request cannot be cancelled: leak it with the state it writes into */
        return dl_error(DL_ETIMEOUT,
                        "world: not every MPI process started the world within %.1f s "
                        "(each process must run the same sequence of worlds)",
                        w->opts.timeout_s);
    }
    MPI_Comm_set_errhandler(mw->comm, MPI_ERRORS_RETURN);
    w->mpi = mw;
    w->remote = &mpi_remote;
    w->nprocs = P;
    w->proc = g.rank;
    w->lo = g.rank * T;
    w->hi = w->lo + T;
    if (pthread_create(&mw->ctl, NULL, ctl_main, mw) == 0)
        mw->ctl_on = 1;
    return DL_OK;
}

void dl__mpi_world_end(dl_world *w)
{
    dl_mpi_world *mw = w->mpi;
    if (!mw || !mw->ctl_on)
        return;
    atomic_store(&mw->ctl_stop, 1);
    pthread_join(mw->ctl, NULL);
    mw->ctl_on = 0;
}

void dl__mpi_world_free(dl_world *w)
{
    dl_mpi_world *mw = w->mpi;
    if (!mw)
        return;
    dl__mpi_world_end(w);
    /* error notices to processes that may be gone: give them a moment, then let them go */
    dl_waiter wt = {DL_WAIT_YIELD, 10, NULL};
    for (int p = 0; p < w->nprocs; p++)
        if (mw->out_req[p] != MPI_REQUEST_NULL &&
            poll_req(&mw->out_req[p], MPI_STATUS_IGNORE, &wt, 0, 200000000, NULL, NULL))
            MPI_Request_free(&mw->out_req[p]);
    MPI_Comm_free(&mw->comm);
    free(mw->out_req);
    free(mw);
    w->mpi = NULL;
    w->remote = NULL;
}

void dl__mpi_notify(dl_world *w, int rank, int status, const char *msg)
{
    dl_mpi_world *mw = w->mpi;
    if (!mw || status == DL_OK || status == DL_EABORT || atomic_exchange(&mw->notified, 1))
        return;
    notice nt;
    memset(&nt, 0, sizeof nt);
    nt.status = status;
    nt.rank = rank;
    snprintf(nt.msg, sizeof nt.msg, "%s", msg);
    memcpy(mw->notice_out, &nt, sizeof nt);
    for (int p = 0; p < w->nprocs; p++)
        if (p != w->proc)
            MPI_Isend(mw->notice_out, NOTICE_BYTES, MPI_BYTE, p, TAG_NOTICE, mw->comm,
                      &mw->out_req[p]);
}

/* Ids are multiples of T + 1: id + 1 + j (j < T) names the j-th cross-process group of a
 * hierarchical all-reduce on communicator id (dl__mpi_sub_cid), without any exchange. */
static uint64_t mpi_new_cid(dl_world *w)
{
    dl_mpi_world *mw = w->mpi;
    if (!mw)
        return 0;
    uint64_t k = 1 + atomic_fetch_add(&mw->next_cid, 1) * (uint64_t)w->nprocs + (uint64_t)w->proc;
    return k * (uint64_t)(mw->T + 1);
}

/* ---- the MPI link ---- */

typedef struct hdr {
    uint64_t bytes;
    uint32_t check;
    uint32_t pad;
} hdr;

typedef struct sslot {
    MPI_Request req[2]; /* header (+ eager payload), lent payload */
    unsigned char *buf; /* HDR + eager bytes, page-aligned */
} sslot;

typedef struct rslot {
    unsigned char *buf; /* HDR + eager */
    unsigned char *big; /* large payloads */
    size_t big_cap;
} rslot;

typedef struct mlink {
    dl_link base;
    MPI_Comm comm;
    atomic_int *abort_flag;
    int peer, tag, sender;
    uint32_t nslots;
    size_t eager;
    sslot *s;
    uint64_t s_head, s_done;
    rslot *r;
    uint64_t r_acq, r_rel;
    int pre_on; /* a receive for message r_acq's header is already posted (pre_rq) */
    MPI_Request pre_rq;
    int pre_done; /* ml_ready saw pre_rq complete: pre_st holds its status */
    MPI_Status pre_st;
    int broken; /* a receive was abandoned: its buffers may still be written, never free them */
} mlink;

/* Sender: complete slot i (both requests). */
static int slot_complete(mlink *ml, sslot *s, const dl_waiter *w, int honor_abort, uint64_t limit)
{
    for (int k = 0; k < 2; k++)
        if (s->req[k] != MPI_REQUEST_NULL) {
            int rc = poll_req(&s->req[k], MPI_STATUS_IGNORE, w, honor_abort, limit,
                              &ml->base.stats.send_wait_ns, &ml->base.stats.send_sleeps);
            if (rc)
                return rc;
        }
    return DL_OK;
}

static int ml_post(dl_link *l, const dl_msg *m, const dl_waiter *w)
{
    mlink *ml = (mlink *)l;
    if (!ml->sender)
        return dl_error(DL_EINVAL, "MPI link %d->%d: post on the receiving end", l->src, l->dst);
    if (m->bytes > (size_t)INT_MAX)
        return dl_error(DL_EINVAL, "MPI link %d->%d: message of %zu bytes exceeds MPI's int count",
                        l->src, l->dst, m->bytes);
    if (ml->s_head - ml->s_done == ml->nslots) {
        int rc = slot_complete(ml, &ml->s[ml->s_done % ml->nslots], w, 1, 0);
        if (rc)
            return rc;
        ml->s_done++;
    }
    sslot *s = &ml->s[ml->s_head % ml->nslots];
    hdr h = {m->bytes, m->check, 0};
    memcpy(s->buf, &h, sizeof h);
    int e;
    if (m->bytes <= ml->eager) {
        uint64_t t0 = dl_now_ns();
        if (m->bytes)
            memcpy(s->buf + HDR, m->data, m->bytes);
        l->stats.copy_ns += dl_now_ns() - t0;
        e = MPI_Isend(s->buf, (int)(HDR + m->bytes), MPI_BYTE, ml->peer, ml->tag, ml->comm,
                      &s->req[0]);
    } else {
        e = MPI_Isend(s->buf, HDR, MPI_BYTE, ml->peer, ml->tag, ml->comm, &s->req[0]);
        if (e == MPI_SUCCESS)
            e = MPI_Isend((void *)m->data, (int)m->bytes, MPI_BYTE, ml->peer, ml->tag, ml->comm,
                          &s->req[1]);
    }
    if (e != MPI_SUCCESS)
        return dl_error(DL_ESYS, "MPI link %d->%d: MPI_Isend failed", l->src, l->dst);
    ml->s_head++;
    l->stats.bytes_sent += m->bytes;
    l->stats.msgs_sent++;
    return DL_OK;
}

/* Receive into buf; on abort cancel the receive (or, if it already matched, wait for it for a
 * bounded time, and otherwise abandon the buffer). */
static int recv_wait(mlink *ml, MPI_Request *rq, MPI_Status *st, const dl_waiter *w)
{
    int rc = poll_req(rq, st, w, 1, 0, &ml->base.stats.recv_wait_ns, &ml->base.stats.recv_sleeps);
    if (rc == DL_OK)
        return DL_OK;
    char msg[256];
    snprintf(msg, sizeof msg, "%s", dl_errmsg());
    MPI_Cancel(rq);
    if (poll_req(rq, MPI_STATUS_IGNORE, NULL, 0, 1000000000ull, NULL, NULL) != DL_OK)
        ml->broken = 1;
    else
        ml->broken = ml->broken || rc != DL_EABORT;
    return dl_error(rc, "%s", msg);
}

static int post_header(mlink *ml, uint64_t msg, MPI_Request *rq)
{
    if (MPI_Irecv(ml->r[msg % ml->nslots].buf, (int)(HDR + ml->eager), MPI_BYTE, ml->peer, ml->tag,
                  ml->comm, rq) != MPI_SUCCESS)
        return dl_error(DL_ESYS, "MPI link %d->%d: MPI_Irecv failed", ml->base.src, ml->base.dst);
    return DL_OK;
}

static int ml_acquire(dl_link *l, dl_msg *m, const dl_waiter *w)
{
    mlink *ml = (mlink *)l;
    if (ml->sender)
        return dl_error(DL_EINVAL, "MPI link %d->%d: acquire on the sending end", l->src, l->dst);
    if (ml->broken)
        return dl_error(DL_EABORT, "MPI link %d->%d: unusable after an aborted receive", l->src,
                        l->dst);
    if (ml->r_acq - ml->r_rel == ml->nslots)
        return dl_error(DL_EINVAL, "MPI link %d->%d: more than %u messages acquired", l->src,
                        l->dst, ml->nslots);
    rslot *r = &ml->r[ml->r_acq % ml->nslots];
    MPI_Request rq;
    MPI_Status st;
    int rc;
    if (ml->pre_on) {
        rq = ml->pre_rq;
        ml->pre_on = 0;
    } else if ((rc = post_header(ml, ml->r_acq, &rq))) {
        return rc;
    }
    if (ml->pre_done)
        st = ml->pre_st, ml->pre_done = 0;
    else if ((rc = recv_wait(ml, &rq, &st, w)))
        return rc;
    int got = 0;
    MPI_Get_count(&st, MPI_BYTE, &got);
    hdr h;
    memcpy(&h, r->buf, sizeof h);
    if (got < HDR || (h.bytes <= ml->eager && (size_t)got != HDR + h.bytes)) {
        ml->broken = 1;
        return dl_error(DL_ESYS, "MPI link %d->%d: malformed message (%d bytes)", l->src, l->dst,
                        got);
    }
    /* the next header's receive goes up as soon as this message's last receive is posted (MPI
     * matches receives of one tag in posting order), if its slot is free: it then lands straight
     * in the slot, and its wait starts with the message already there */
    int pre = ml->r_acq + 1 - ml->r_rel < ml->nslots;
    if (h.bytes <= ml->eager) {
        m->data = r->buf + HDR;
        if (pre && (rc = post_header(ml, ml->r_acq + 1, &ml->pre_rq)) == DL_OK)
            ml->pre_on = 1;
    } else {
        if (r->big_cap < h.bytes) {
            free(r->big);
            r->big = NULL;
            r->big_cap = 0;
            size_t cap = (h.bytes + 4095) & ~(size_t)4095;
            if (posix_memalign((void **)&r->big, 4096, cap))
                return dl_error(DL_ENOMEM, "MPI link %d->%d: out of memory for %zu bytes", l->src,
                                l->dst, cap);
            r->big_cap = cap;
        }
        if (MPI_Irecv(r->big, (int)h.bytes, MPI_BYTE, ml->peer, ml->tag, ml->comm, &rq) !=
            MPI_SUCCESS)
            return dl_error(DL_ESYS, "MPI link %d->%d: MPI_Irecv failed", l->src, l->dst);
        if (pre && post_header(ml, ml->r_acq + 1, &ml->pre_rq) == DL_OK)
            ml->pre_on = 1;
        if ((rc = recv_wait(ml, &rq, &st, w)))
            return rc;
        m->data = r->big;
    }
    m->bytes = h.bytes;
    m->check = h.check;
    ml->r_acq++;
    l->stats.bytes_recv += h.bytes;
    l->stats.msgs_recv++;
    return DL_OK;
}

/* The next header's receive goes up here if it is not yet; a header that arrived is kept for
 * acquire. Anything wrong answers "ready", and acquire then reports it. */
static int ml_ready(dl_link *l)
{
    mlink *ml = (mlink *)l;
    if (ml->sender || ml->broken || ml->r_acq - ml->r_rel == ml->nslots || ml->pre_done)
        return 1;
    if (!ml->pre_on) {
        if (post_header(ml, ml->r_acq, &ml->pre_rq))
            return 1;
        ml->pre_on = 1;
    }
    int flag = 0;
    if (MPI_Test(&ml->pre_rq, &flag, &ml->pre_st) != MPI_SUCCESS)
        return 1;
    ml->pre_done = flag;
    return flag;
}

static int ml_release(dl_link *l)
{
    mlink *ml = (mlink *)l;
    if (ml->r_rel == ml->r_acq)
        return dl_error(DL_EINVAL, "MPI link %d->%d: release without an acquired message", l->src,
                        l->dst);
    ml->r_rel++;
    return DL_OK;
}

/* Lent payloads: wait until MPI completed their sends (the caller may then reuse its buffers). */
static int ml_flush(dl_link *l, const dl_waiter *w)
{
    mlink *ml = (mlink *)l;
    for (uint64_t i = ml->s_done; i < ml->s_head; i++) {
        sslot *s = &ml->s[i % ml->nslots];
        if (s->req[1] != MPI_REQUEST_NULL) {
            int rc = poll_req(&s->req[1], MPI_STATUS_IGNORE, w, 1, 0, &l->stats.send_wait_ns,
                              &l->stats.send_sleeps);
            if (rc)
                return rc;
        }
    }
    return DL_OK;
}

/* After an abort: lent payloads still in flight are given a second to complete, then let go
 * (MPI may still read them if the peer receives later; its world is aborting too). */
static int ml_drain(dl_link *l)
{
    mlink *ml = (mlink *)l;
    if (!ml->sender)
        return DL_OK;
    int rc = DL_OK;
    uint64_t t0 = dl_now_ns();
    for (uint64_t i = ml->s_done; i < ml->s_head; i++) {
        sslot *s = &ml->s[i % ml->nslots];
        if (s->req[1] == MPI_REQUEST_NULL)
            continue;
        uint64_t spent = dl_now_ns() - t0, limit = 1000000000ull;
        if (spent >= limit ||
            poll_req(&s->req[1], MPI_STATUS_IGNORE, NULL, 0, limit - spent, NULL, NULL) != DL_OK) {
            MPI_Request_free(&s->req[1]);
            rc = dl_error(DL_ETIMEOUT,
                          "MPI link %d->%d: a lent payload was not received after an "
                          "abort",
                          l->src, l->dst);
        }
    }
    return rc;
}

/* A message counts as released once MPI completed its sends (header and lent payload): the
 * receiver has it, or MPI has buffered it, and the sender's buffer is free again. */
static uint64_t ml_released(dl_link *l)
{
    mlink *ml = (mlink *)l;
    while (ml->sender && ml->s_done < ml->s_head) {
        sslot *s = &ml->s[ml->s_done % ml->nslots];
        for (int k = 0; k < 2; k++) {
            int flag = 1;
            if (s->req[k] != MPI_REQUEST_NULL)
                MPI_Test(&s->req[k], &flag, MPI_STATUS_IGNORE);
            if (!flag)
                return ml->s_done;
        }
        ml->s_done++;
    }
    return ml->s_done;
}

static int ml_wait_released(dl_link *l, uint64_t n, const dl_waiter *w)
{
    mlink *ml = (mlink *)l;
    if (n > ml->s_head)
        return dl_error(DL_EINVAL,
                        "MPI link %d->%d: waiting for %llu released messages of %llu "
                        "posted",
                        l->src, l->dst, (unsigned long long)n, (unsigned long long)ml->s_head);
    while (ml->s_done < n) {
        int rc = slot_complete(ml, &ml->s[ml->s_done % ml->nslots], w, 1, 0);
        if (rc)
            return rc;
        ml->s_done++;
    }
    return DL_OK;
}

static void ml_wake(dl_link *l) { (void)l; }

static void ml_destroy(dl_link *l)
{
    mlink *ml = (mlink *)l;
    if (ml->sender && ml->s) {
        /* the last messages of a world may still be on their way: let them complete (bounded),
         * unless the world aborted */
        int aborted = ml->abort_flag && atomic_load(ml->abort_flag);
        uint64_t limit = aborted ? 200000000ull : 30000000000ull;
        dl_waiter wt = {DL_WAIT_YIELD, 10, NULL};
        int leak = 0;
        for (uint32_t i = 0; i < ml->nslots; i++)
            for (int k = 0; k < 2; k++)
                if (ml->s[i].req[k] != MPI_REQUEST_NULL &&
                    poll_req(&ml->s[i].req[k], MPI_STATUS_IGNORE, &wt, 0, limit, NULL, NULL)) {
                    MPI_Request_free(&ml->s[i].req[k]);
                    leak = 1;
                }
        for (uint32_t i = 0; i < ml->nslots && !leak; i++) free(ml->s[i].buf);
        free(ml->s);
    } else if (ml->r) {
        if (ml->pre_on &&
            !ml->pre_done) { /* the next header's receive, posted ahead: withdraw it */
            MPI_Cancel(&ml->pre_rq);
            if (poll_req(&ml->pre_rq, MPI_STATUS_IGNORE, NULL, 0, 1000000000ull, NULL, NULL))
                ml->broken = 1;
        }
        for (uint32_t i = 0; i < ml->nslots && !ml->broken; i++) {
            free(ml->r[i].buf);
            free(ml->r[i].big);
        }
        free(ml->r);
    }
    free(ml);
}

static const dl_link_ops mpi_link_ops = {
    .post = ml_post,
    .acquire = ml_acquire,
    .ready = ml_ready,
    .release = ml_release,
    .flush = ml_flush,
    .drain = ml_drain,
    .wake = ml_wake,
    .destroy = ml_destroy,
    .released = ml_released,
    .wait_released = ml_wait_released,
};

static int mpi_link_create(dl_world *w, uint64_t cid, int src, int dst, dl_link **out)
{
    *out = NULL;
    dl_mpi_world *mw = w->mpi;
    if (!mw)
        return dl_error(DL_EINVAL, "link %d->%d: not an MPI world", src, dst);
    if (cid > mw->cid_max)
        return dl_error(DL_EINVAL,
                        "link %d->%d: communicator id %llu exceeds what this MPI's tags "
                        "can carry (%llu communicators with %d threads per process)",
                        src, dst, (unsigned long long)cid, (unsigned long long)mw->cid_max, mw->T);
    int T = mw->T;
    mlink *ml = NULL; /* dl_link is 64-byte aligned (chan.h) */
    if (posix_memalign((void **)&ml, 64, sizeof *ml))
        return dl_error(DL_ENOMEM, "link %d->%d: out of memory", src, dst);
    memset(ml, 0, sizeof *ml);
    ml->base.ops = &mpi_link_ops;
    ml->base.src = src;
    ml->base.dst = dst;
    ml->comm = mw->comm;
    ml->abort_flag = &w->abort_flag;
    ml->sender = dl__local(w, src);
    ml->peer = ml->sender ? dst / T : src / T;
    ml->tag =
        (int)(1 + (cid * (uint64_t)T + (uint64_t)(src % T)) * (uint64_t)T + (uint64_t)(dst % T));
    ml->nslots = (uint32_t)w->opts.nslots;
    ml->eager = w->opts.eager_bytes;
    size_t sb = (HDR + ml->eager + 4095) & ~(size_t)4095;
    int ok = 1;
    if (ml->sender) {
        ml->s = calloc(ml->nslots, sizeof *ml->s);
        ok = ml->s != NULL;
        for (uint32_t i = 0; ok && i < ml->nslots; i++) {
            ml->s[i].req[0] = ml->s[i].req[1] = MPI_REQUEST_NULL;
            ok = posix_memalign((void **)&ml->s[i].buf, 4096, sb) == 0;
        }
    } else {
        ml->r = calloc(ml->nslots, sizeof *ml->r);
        ok = ml->r != NULL;
        for (uint32_t i = 0; ok && i < ml->nslots; i++)
            ok = posix_memalign((void **)&ml->r[i].buf, 4096, sb) == 0;
    }
    if (!ok) {
        ml_destroy(&ml->base);
        return dl_error(DL_ENOMEM, "link %d->%d: out of memory for %u slots", src, dst, ml->nslots);
    }
    *out = &ml->base;
    return DL_OK;
}

#endif /* DL_HAVE_MPI */
