/* Communicators: groups with their own links, split, the dp/pp/tp(/ep) mesh, byte counters. */
#define _GNU_SOURCE
#include "config.h"
#include <stdlib.h>
#include <string.h>
#include "distlab.h"
#include "transport/chan.h"
#include "runtime/internal.h"
#include "runtime/fault.h"

static const char *dtype_names[DL_NDTYPES] = {"f32", "f64", "bf16"};
static const char *redop_names[DL_NREDOPS] = {"sum", "avg", "max"};
static const char *purpose_names[DL_NPURPOSES] = {"grads", "params", "activations", "loss",
                                                  "other"};
static const char *algo_names[DL_NALGOS] = {"auto", "ring", "oneshot", "rd", "hier"};

size_t dl_dtype_size(dl_dtype t) { return dl__dtype_size(t); }
const char *dl_dtype_name(dl_dtype t) { return (unsigned)t < DL_NDTYPES ? dtype_names[t] : "?"; }
const char *dl_redop_name(dl_redop op) { return (unsigned)op < DL_NREDOPS ? redop_names[op] : "?"; }
const char *dl_purpose_name(dl_purpose p)
{
    return (unsigned)p < DL_NPURPOSES ? purpose_names[p] : "?";
}
const char *dl_algo_name(dl_algo a) { return (unsigned)a < DL_NALGOS ? algo_names[a] : "?"; }

int dl_dtype_parse(const char *s, dl_dtype *out)
{
    if (s && (!strcmp(s, "f32") || !strcmp(s, "float") || !strcmp(s, "float32")))
        *out = DL_F32;
    else if (s && (!strcmp(s, "f64") || !strcmp(s, "double") || !strcmp(s, "float64")))
        *out = DL_F64;
    else if (s && (!strcmp(s, "bf16") || !strcmp(s, "bfloat16")))
        *out = DL_BF16;
    else
        return dl_error(DL_EINVAL, "unknown data type '%s' (f32, f64, bf16)", s ? s : "(null)");
    return DL_OK;
}

int dl_redop_parse(const char *s, dl_redop *out)
{
    for (int i = 0; s && i < DL_NREDOPS; i++)
        if (!strcmp(s, redop_names[i])) {
            *out = (dl_redop)i;
            return DL_OK;
        }
    return dl_error(DL_EINVAL, "unknown reduction '%s' (sum, avg, max)", s ? s : "(null)");
}

int dl_algo_parse(const char *s, dl_algo *out)
{
    for (int i = 0; s && i < DL_NALGOS; i++)
        if (!strcmp(s, algo_names[i])) {
            *out = (dl_algo)i;
            return DL_OK;
        }
    return dl_error(DL_EINVAL, "unknown algorithm '%s' (auto, ring, oneshot, rd)",
                    s ? s : "(null)");
}

void dl_block(size_t count, int n, int r, size_t *offset, size_t *len)
{
    size_t q = count / (size_t)n, rem = count % (size_t)n, ur = (size_t)r;
    *len = q + (ur < rem);
    *offset = ur * q + (ur < rem ? ur : rem);
}

/* ---- shared state ---- */

int dl__shared_create(dl_world *w, int n, const int *world_ranks, dl_comm_shared **out)
{
    dl_comm_shared *sh = calloc(1, sizeof *sh);
    if (!sh)
        return dl_error(DL_ENOMEM, "communicator: out of memory");
    sh->n = n;
    sh->w = w;
    sh->world_ranks = malloc(sizeof(int) * (size_t)n);
    sh->links = calloc((size_t)n * (size_t)n, sizeof *sh->links);
    sh->entered = aligned_alloc(64, (size_t)n * sizeof *sh->entered);
    if (!sh->world_ranks || !sh->links || !sh->entered) {
        free(sh->world_ranks);
        free(sh->links);
        free(sh->entered);
        free(sh);
        return dl_error(DL_ENOMEM, "communicator: out of memory for %d ranks", n);
    }
    memcpy(sh->world_ranks, world_ranks, sizeof(int) * (size_t)n);
    for (int i = 0; i < n * n; i++) atomic_init(&sh->links[i], NULL);
    for (int i = 0; i < n; i++) atomic_init(&sh->entered[i].seq, 0);
    int nlocal =
        n; /* a world spanning processes: each process has its own record for its members */
    for (int i = 0; i < n; i++) nlocal -= !dl__local(w, world_ranks[i]);
    atomic_init(&sh->refs, nlocal);
    sh->uid = w->world_sh ? atomic_fetch_add(&w->next_uid, 1) : 0;
    pthread_mutex_lock(&w->reg_mu);
    sh->next = w->registry;
    w->registry = sh;
    pthread_mutex_unlock(&w->reg_mu);
    *out = sh;
    return DL_OK;
}

/* The last member to free a communicator destroys its links; the small shared record stays in
 * the world's registry until the world ends, so that a watchdog scan never reads freed memory. */
void dl__shared_unref(dl_comm_shared *sh)
{
    if (atomic_fetch_sub(&sh->refs, 1) != 1)
        return;
    pthread_mutex_lock(&sh->w->reg_mu);
    for (int i = 0; i < sh->n * sh->n; i++) dl_link_destroy(atomic_exchange(&sh->links[i], NULL));
    pthread_mutex_unlock(&sh->w->reg_mu);
}

int dl__comm_create(dl_comm_shared *sh, int rank, dl_ctx *ctx, dl_comm **out)
{
    dl_comm *c = calloc(1, sizeof *c);
    if (!c)
        return dl_error(DL_ENOMEM, "communicator: out of memory");
    c->sh = sh;
    c->rank = rank;
    c->ctx = ctx;
    c->algo = DL_ALGO_AUTO;
    c->last_algo = DL_ALGO_AUTO;
    *out = c;
    return DL_OK;
}

/* Link from member src to member dst, created by whichever end needs it first (dl__link looked
 * first; another member may have created it since). */
int dl__link_create(dl_comm *c, int src, int dst, dl_link **out)
{
    dl_comm_shared *sh = c->sh;
    _Atomic(dl_link *) *slot = &sh->links[(size_t)src * (size_t)sh->n + (size_t)dst];
    dl_link *l = atomic_load_explicit(slot, memory_order_acquire);
    if (l) {
        *out = l;
        return DL_OK;
    }
    dl_world *w = c->ctx->w;
    const dl_world_opts *o = &w->opts;
    int ws = sh->world_ranks[src], wd = sh->world_ranks[dst];
    /* ranks in one process: a shared-memory channel; otherwise the transport between processes */
    int rc = dl__local(w, ws) && dl__local(w, wd)
                 ? dl_chan_create(&l, ws, wd, o->nslots, o->eager_bytes)
                 : w->remote->link_create(w, c->cid, ws, wd, &l);
    if (rc)
        return rc;
    l->inter = w->place->node[l->src] != w->place->node[l->dst];
    dl_link *expected = NULL;
    if (!atomic_compare_exchange_strong_explicit(slot, &expected, l, memory_order_acq_rel,
                                                 memory_order_acquire)) {
        dl_link_destroy(l);
        l = expected;
    }
    *out = l;
    return DL_OK;
}

int dl__scratch(dl_comm *c, size_t bytes, void **out)
{
    if (c->scratch_bytes < bytes) {
        dl_arena *a = c->ctx->arena;
        if (c->scratch)
            dl_arena_free(a, c->scratch);
        c->scratch = NULL;
        c->scratch_bytes = 0;
        int rc = dl_arena_alloc(a, DL_MEM_COMM, bytes, &c->scratch);
        if (rc)
            return rc;
        c->scratch_bytes = bytes;
    }
    *out = c->scratch;
    return DL_OK;
}

/* ---- queries ---- */

int dl_comm_rank(const dl_comm *c) { return c->rank; }
int dl_comm_size(const dl_comm *c) { return c->sh->n; }
int dl_comm_world_rank(const dl_comm *c, int r)
{
    return r >= 0 && r < c->sh->n ? c->sh->world_ranks[r] : -1;
}
dl_ctx *dl_comm_ctx(dl_comm *c) { return c->ctx; }
void dl_comm_set_algo(dl_comm *c, dl_algo a)
{
    c->algo = (unsigned)a < DL_NALGOS ? a : DL_ALGO_AUTO;
}
dl_algo dl_comm_get_algo(const dl_comm *c) { return c->algo; }
dl_algo dl_comm_last_algo(const dl_comm *c) { return c->last_algo; }

void dl_comm_get_stats(const dl_comm *c, dl_comm_stats *st) { *st = c->st; }

void dl_comm_reset_stats(dl_comm *c)
{
    uint64_t ops = c->st.ops;
    memset(&c->st, 0, sizeof c->st);
    c->st.ops = ops;
}

/* ---- split and mesh ---- */

static int cmp_pair(const void *a, const void *b)
{
    const int *x = a, *y = b; /* (key, old rank) */
    if (x[0] != y[0])
        return x[0] < y[0] ? -1 : 1;
    return x[1] < y[1] ? -1 : x[1] > y[1];
}

/* Split's second half: the new group's shared record is created by its first member in this
 * process (a world spanning processes keeps one record per process, for its members; in one
 * process that is the new rank 0) and an all-gather hands every member its address. Across
 * processes the new rank 0 also hands out the communicator id the remote links' messages carry. */
static int split_share(dl_comm *c, int rc, int m, int myidx, const int *grp, const int *wr,
                       dl_comm **out)
{
    dl_world *w = c->ctx->w;
    int n = c->sh->n, lidx = -1, words = w->remote ? 2 : 1;
    for (int i = 0; myidx >= 0 && i < m; i++)
        if (dl__local(w, wr[i])) {
            lidx = i;
            break;
        }
    uint64_t *all = malloc(sizeof(uint64_t) * (size_t)words * (size_t)n);
    if (!all)
        return dl_error(DL_ENOMEM, "comm_split: out of memory");
    dl_comm_shared *sh = NULL;
    if (rc == DL_OK && myidx >= 0 && myidx == lidx)
        rc = dl__shared_create(w, m, wr, &sh);
    uint64_t mine[2] = {(uint64_t)(uintptr_t)sh,
                        w->remote && myidx == 0 ? w->remote->new_cid(w) : 0};
    /* a failed create must not leave the others waiting: they learn of it through the abort */
    int rc2 = dl_allgather(c, mine, all, 2 * (size_t)words * (size_t)n, DL_F32, DL_PURPOSE_OTHER);
    if (rc == DL_OK)
        rc = rc2;
    if (rc == DL_OK && myidx >= 0) {
        sh = (dl_comm_shared *)(uintptr_t)all[words * grp[2 * lidx + 1]];
        rc = sh ? dl__comm_create(sh, myidx, c->ctx, out)
                : dl_error(DL_ESYS, "comm_split: the new group's first member in this process "
                                    "could not create it");
        if (rc == DL_OK && w->remote)
            (*out)->cid = all[2 * grp[1] + 1];
    }
    free(all);
    return rc;
}

int dl_comm_split(dl_comm *c, int color, int key, dl_comm **out)
{
    *out = NULL;
    if (color < 0 && color != DL_UNDEFINED)
        return dl_error(DL_EINVAL, "comm_split: color %d is negative (use DL_UNDEFINED)", color);
    int n = c->sh->n;
    /* exchange (color, key) and then the new group's shared record, bitwise through allgather */
    int32_t *ck = malloc(sizeof(int32_t) * 2 * (size_t)n);
    int *grp = malloc(sizeof(int) * 2 * (size_t)n);
    int *wr = malloc(sizeof(int) * (size_t)n);
    if (!ck || !grp || !wr) {
        free(ck), free(grp), free(wr);
        return dl_error(DL_ENOMEM, "comm_split: out of memory");
    }
    int32_t mine[2] = {color, key};
    int rc = dl_allgather(c, mine, ck, 2 * (size_t)n, DL_F32, DL_PURPOSE_OTHER);
    int m = 0, myidx = -1;
    if (rc == DL_OK && color != DL_UNDEFINED) {
        for (int r = 0; r < n; r++)
            if (ck[2 * r] == color) {
                grp[2 * m] = ck[2 * r + 1];
                grp[2 * m + 1] = r;
                m++;
            }
        qsort(grp, (size_t)m, 2 * sizeof(int), cmp_pair);
        for (int i = 0; i < m; i++) {
            wr[i] = c->sh->world_ranks[grp[2 * i + 1]];
            if (grp[2 * i + 1] == c->rank)
                myidx = i;
        }
    }
    rc = split_share(c, rc, m, myidx, grp, wr, out);
    free(ck), free(grp), free(wr);
    return rc;
}

int dl_comm_free(dl_comm *c)
{
    if (!c)
        return DL_OK;
    if (c == c->ctx->world_comm)
        return dl_error(DL_EINVAL, "comm_free: the world communicator belongs to the world");
    int rc = dl_barrier(c);
    if (c->scratch)
        dl_arena_free(c->ctx->arena, c->scratch);
    dl_comm *subs[2] = {c->h_intra, c->h_inter}; /* hierarchical all-reduce's views */
    for (int i = 0; i < 2; i++)
        if (subs[i]) {
            if (subs[i]->scratch)
                dl_arena_free(c->ctx->arena, subs[i]->scratch);
            dl__shared_unref(subs[i]->sh);
            free(subs[i]);
        }
    dl__shared_unref(c->sh);
    free(c);
    return rc;
}

int dl_mesh_create(dl_comm *world, int dp, int pp, int tp, int ep, dl_mesh *out)
{
    memset(out, 0, sizeof *out);
    int n = dl_comm_size(world);
    if (dp < 1 || pp < 1 || tp < 1 || ep < 1 || (long)dp * pp * tp != n)
        return dl_error(DL_EINVAL, "mesh: dp %d x pp %d x tp %d does not equal %d ranks", dp, pp,
                        tp, n);
    if (dp % ep)
        return dl_error(DL_EINVAL, "mesh: ep %d does not divide dp %d", ep, dp);
    int r = dl_comm_rank(world);
    out->dp = dp, out->pp = pp, out->tp = tp, out->ep = ep;
    out->tp_rank = r % tp;
    out->dp_rank = (r / tp) % dp;
    out->pp_rank = r / (tp * dp);
    out->ep_rank = out->dp_rank % ep;
    int rc = dl_comm_split(world, out->pp_rank * dp + out->dp_rank, out->tp_rank, &out->tp_comm);
    if (rc == DL_OK)
        rc = dl_comm_split(world, out->pp_rank * tp + out->tp_rank, out->dp_rank, &out->dp_comm);
    if (rc == DL_OK)
        rc = dl_comm_split(world, out->dp_rank * tp + out->tp_rank, out->pp_rank, &out->pp_comm);
    dl__comm_set_label(out->tp_comm, DL__COMM_TP);
    dl__comm_set_label(out->dp_comm, DL__COMM_DP);
    dl__comm_set_label(out->pp_comm, DL__COMM_PP);
    if (rc == DL_OK && ep > 1)
        rc =
            dl_comm_split(world, (out->pp_rank * tp + out->tp_rank) * (dp / ep) + out->dp_rank / ep,
                          out->ep_rank, &out->ep_comm);
    if (rc == DL_OK && ep > 1)
        rc = dl_comm_split(world, (out->pp_rank * tp + out->tp_rank) * ep + out->ep_rank,
                           out->dp_rank / ep, &out->edp_comm);
    if (rc != DL_OK) {
        /* a split fails when a peer aborted the world meanwhile: free what was made (the frees'
         * barriers return at once then), keeping the split's message */
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", dl_errmsg());
        dl_mesh_destroy(out);
        dl_error(rc, "%s", msg);
    }
    return rc;
}

int dl_mesh_destroy(dl_mesh *m)
{
    int rc = DL_OK, r;
    dl_comm **cs[5] = {&m->edp_comm, &m->ep_comm, &m->pp_comm, &m->dp_comm, &m->tp_comm};
    for (int i = 0; i < 5; i++) {
        if ((r = dl_comm_free(*cs[i])) != DL_OK && rc == DL_OK)
            rc = r;
        *cs[i] = NULL;
    }
    return rc;
}
