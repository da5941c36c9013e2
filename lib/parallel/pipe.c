/* The pipeline engine: a stage walks its schedule's action list, receiving and sending the
 * hand-offs around each action (include/distlab/pipe.h). */
#include "config.h"
#include <stdlib.h>
#include <string.h>
#include "distlab.h"
#include "distlab/pipe.h"
#include "distlab/trace.h"

/* One staging buffer: a copy of an outgoing hand-off, lent to the receiver until its send
 * request completes. Buffers are reused once done, so a stage holds about as many as it has
 * sends in flight (1F1B: p - s; GPipe: up to m). */
typedef struct staging {
    void *buf;
    dl_request *req; /* the send in flight (busy) */
    int busy;
} staging;

/* A hand-off between two chunks of the same stage (the V placement's turn at the last stage):
 * kept here until that stage's receiving action takes it. */
typedef struct loopback {
    void *buf;
    int tag, full;
} loopback;

struct dl_pipe {
    dl_comm *pp;
    dl_comm *act_comm, *grad_comm;  /* duplicates of pp: activations forward, gradients back */
    const dl_pipe_split_ops *split; /* I and W actions' callbacks, or NULL */
    int p, stage;
    size_t count, bytes;
    dl_dtype t;
    dl_arena *arena;
    staging *st;
    int nst, capst;
    size_t staging_peak;
    loopback *loop;
    int nloop;
    int open; /* the next run continues this one: its last sends stay in flight */
};

enum { TAG_ACT = 0, TAG_GRAD = 1 };

static int tag_of(int kind, int mb, int chunk) { return (mb * 64 + chunk) * 2 + kind; }

void dl_pipe_peers(int p, int v, int stage, int chunk, int *prev, int *next)
{
    int vs = chunk * p + stage, last = p * v - 1;
    *prev = vs == 0 ? -1 : (vs - 1) % p;
    *next = vs == last ? -1 : (vs + 1) % p;
}

void dl_pipe_set_split(dl_pipe *e, const dl_pipe_split_ops *split) { e->split = split; }
void dl_pipe_set_open(dl_pipe *e, int open) { e->open = open; }

int dl_pipe_create(dl_comm *pp, size_t count, dl_dtype t, dl_arena *arena, dl_pipe **out)
{
    *out = NULL;
    if (!pp)
        return dl_error(DL_EINVAL, "pipeline: no pp communicator");
    if (t != DL_F32 && t != DL_F64 && t != DL_BF16)
        return dl_error(DL_EINVAL, "pipeline: hand-off type must be f32, f64 or bf16");
    dl_pipe *e = calloc(1, sizeof *e);
    if (!e)
        return dl_error(DL_ENOMEM, "pipeline: out of memory");
    e->pp = pp;
    e->p = dl_comm_size(pp);
    e->stage = dl_comm_rank(pp);
    e->count = count;
    e->t = t;
    e->bytes = count * dl_dtype_size(t);
    e->arena = arena;
    int rc = dl_comm_split(pp, 0, e->stage, &e->act_comm);
    if (rc == DL_OK)
        rc = dl_comm_split(pp, 0, e->stage, &e->grad_comm);
    if (rc) {
        dl_pipe_destroy(e);
        return rc;
    }
    *out = e;
    return DL_OK;
}

void dl_pipe_destroy(dl_pipe *e)
{
    if (!e)
        return;
    for (int i = 0; i < e->nst; i++) {
        if (e->st[i].busy)
            dl_wait(e->st[i].req);
        if (e->arena)
            dl_arena_free(e->arena, e->st[i].buf);
        else
            free(e->st[i].buf);
    }
    free(e->st);
    for (int i = 0; i < e->nloop; i++) {
        if (e->arena)
            dl_arena_free(e->arena, e->loop[i].buf);
        else
            free(e->loop[i].buf);
    }
    free(e->loop);
    if (e->act_comm)
        dl_comm_free(e->act_comm);
    if (e->grad_comm)
        dl_comm_free(e->grad_comm);
    free(e);
}

/* One hand-off-sized buffer from the arena (category comm) or malloc. */
static int buf_alloc(dl_pipe *e, void **out)
{
    if (e->arena)
        return dl_arena_alloc(e->arena, DL_MEM_COMM, e->bytes ? e->bytes : 1, out);
    if (!(*out = malloc(e->bytes ? e->bytes : 1)))
        return dl_error(DL_ENOMEM, "pipeline: out of memory for a %zu-byte staging buffer",
                        e->bytes);
    return DL_OK;
}

/* A free staging buffer: one whose send is done, else a new one. */
static int staging_get(dl_pipe *e, staging **out)
{
    for (int i = 0; i < e->nst; i++) {
        staging *s = &e->st[i];
        if (s->busy) {
            int done, rc = dl_test(s->req, &done);
            if (rc)
                return rc;
            if (done) {
                s->busy = 0;
                if ((rc = dl_wait(s->req)))
                    return rc;
            }
        }
        if (!s->busy) {
            *out = s;
            return DL_OK;
        }
    }
    if (e->nst == e->capst) {
        int cap = e->capst ? 2 * e->capst : 4;
        staging *n = realloc(e->st, sizeof *n * (size_t)cap);
        if (!n)
            return dl_error(DL_ENOMEM, "pipeline: out of memory for staging buffers");
        e->st = n;
        e->capst = cap;
    }
    staging *s = &e->st[e->nst];
    memset(s, 0, sizeof *s);
    int rc = buf_alloc(e, &s->buf);
    if (rc)
        return rc;
    e->nst++;
    e->staging_peak = (size_t)(e->nst + e->nloop) * e->bytes;
    *out = s;
    return DL_OK;
}

/* Keep a hand-off to this stage itself (no channel to oneself): a free loopback buffer or a new
 * one. */
static int loop_put(dl_pipe *e, int tag, const void *data)
{
    int k = 0;
    while (k < e->nloop && e->loop[k].full) k++;
    if (k == e->nloop) {
        loopback *n = realloc(e->loop, sizeof *n * (size_t)(k + 1));
        if (!n)
            return dl_error(DL_ENOMEM, "pipeline: out of memory for loopback buffers");
        e->loop = n;
        int rc = buf_alloc(e, &e->loop[k].buf);
        if (rc)
            return rc;
        e->nloop++;
        e->staging_peak = (size_t)(e->nst + e->nloop) * e->bytes;
    }
    memcpy(e->loop[k].buf, data, e->bytes);
    e->loop[k].tag = tag;
    e->loop[k].full = 1;
    return DL_OK;
}

static int loop_take(dl_pipe *e, int tag, void *into)
{
    for (int k = 0; k < e->nloop; k++)
        if (e->loop[k].full && e->loop[k].tag == tag) {
            memcpy(into, e->loop[k].buf, e->bytes);
            e->loop[k].full = 0;
            return DL_OK;
        }
    return dl_error(DL_EMISMATCH,
                    "pipeline: the hand-off from this stage's other chunk is missing");
}

static int send_handoff(dl_pipe *e, dl_comm *c, int peer, int tag, const void *data)
{
    staging *s = NULL;
    int rc = staging_get(e, &s);
    if (rc)
        return rc;
    memcpy(s->buf, data, e->bytes);
    if ((rc = dl_isend(c, s->buf, e->count, e->t, peer, tag, DL_PURPOSE_ACTIVATIONS, &s->req)))
        return rc;
    s->busy = 1;
    return DL_OK;
}

static int drain_sends(dl_pipe *e)
{
    for (int i = 0; i < e->nst; i++)
        if (e->st[i].busy) {
            e->st[i].busy = 0;
            int rc = dl_wait(e->st[i].req);
            if (rc)
                return rc;
        }
    return DL_OK;
}

/* A forward or a backward: receive its input hand-off (an activation from the previous virtual
 * stage, or a gradient from the next), compute, send its output the other way. The two mirror
 * each other; `what` names the phase for an error message. */
static int run_work(dl_pipe *e, const dl_sched *s, const dl_pipe_ops *ops, void *arg,
                    const dl_sched_action *a, int step, dl_trace *trace, int trace_rank,
                    dl_pipe_stats *st, const char **what)
{
    int fwd = a->op == DL_SCHED_F, prev, pc, next, nc, rc;
    dl_sched_peers(s, e->stage, a->chunk, &prev, &pc, &next, &nc);
    int from = fwd ? prev : next, to = fwd ? next : prev, kind = fwd ? TAG_ACT : TAG_GRAD;
    dl_comm *c = fwd ? e->act_comm : e->grad_comm;
    uint64_t t0, t1;
    if (from >= 0) {
        *what = fwd ? "receiving the input activation" : "receiving the output gradient";
        t0 = dl_now_ns();
        void *(*where)(void *, int, int) = fwd ? ops->fwd_in : ops->bwd_in;
        void *in = where ? where(arg, a->mb, a->chunk) : NULL;
        if (!in)
            return dl_error(DL_EINVAL, fwd ? "no input buffer" : "no gradient buffer");
        int tag = tag_of(kind, a->mb, a->chunk);
        if ((rc = from == e->stage
                      ? loop_take(e, tag, in)
                      : dl_recv_tag(c, in, e->count, e->t, from, tag, DL_PURPOSE_ACTIVATIONS)))
            return rc;
        t1 = dl_now_ns();
        st->recv_ns += t1 - t0;
        dl_trace_add(trace, trace_rank, DL_TR_RECV_WAIT, step, a->mb, a->chunk, t0, t1);
    }
    *what = fwd ? "forward" : a->op == DL_SCHED_I ? "input gradient" : "backward";
    const void *out = NULL;
    t0 = dl_now_ns();
    int (*work)(void *, int, int, const void **) = fwd                   ? ops->fwd
                                                   : a->op == DL_SCHED_I ? e->split->bwd_input
                                                                         : ops->bwd;
    if ((rc = work(arg, a->mb, a->chunk, &out)))
        return rc;
    t1 = dl_now_ns();
    st->busy_ns += t1 - t0;
    if (fwd)
        st->fwd++;
    else
        st->bwd++;
    dl_trace_add(trace, trace_rank, fwd ? DL_TR_FWD : DL_TR_BWD, step, a->mb, a->chunk, t0, t1);
    if (to < 0)
        return DL_OK;
    *what = fwd ? "sending the output activation" : "sending the input gradient";
    if (!out)
        return dl_error(DL_EINVAL, fwd ? "the forward returned no output"
                                       : "the backward returned no input gradient");
    int tag = tag_of(kind, a->mb, fwd ? nc : pc); /* the receiver's chunk */
    t0 = t1;
    if ((rc = to == e->stage ? loop_put(e, tag, out) : send_handoff(e, c, to, tag, out)))
        return rc;
    t1 = dl_now_ns();
    st->send_ns += t1 - t0;
    dl_trace_add(trace, trace_rank, DL_TR_SEND, step, a->mb, a->chunk, t0, t1);
    return DL_OK;
}

/* A weight-gradient action: no hand-off, timed as a backward. */
static int run_wgrad(const dl_pipe *e, void *arg, const dl_sched_action *a, int step,
                     dl_trace *trace, int trace_rank, dl_pipe_stats *st)
{
    uint64_t t0 = dl_now_ns();
    int rc = e->split->bwd_weight(arg, a->mb, a->chunk);
    uint64_t t1 = dl_now_ns();
    st->busy_ns += t1 - t0;
    dl_trace_add(trace, trace_rank, DL_TR_WGT, step, a->mb, a->chunk, t0, t1);
    return rc;
}

int dl_pipe_run(dl_pipe *e, const dl_sched *s, const dl_pipe_ops *ops, void *arg, int step,
                dl_trace *trace, int trace_rank, dl_pipe_stats *st)
{
    dl_pipe_stats local;
    if (!st)
        st = &local;
    memset(st, 0, sizeof *st);
    if (!s || !ops || !ops->fwd || !ops->bwd)
        return dl_error(DL_EINVAL, "pipeline: missing schedule or callbacks");
    if (s->p != e->p)
        return dl_error(DL_EINVAL, "pipeline: schedule for %d stages on a group of %d", s->p, e->p);
    if (s->v > 1 && e->p == 1)
        return dl_error(DL_EINVAL, "pipeline: interleaving needs at least 2 stages");
    if (s->v > 64)
        return dl_error(DL_EINVAL, "pipeline: at most 64 model chunks per stage (got %d)", s->v);
    int stage = e->stage, rc = DL_OK, i = 0;
    if (dl_sched_splits(s, stage) && (!e->split || !e->split->bwd_input || !e->split->bwd_weight))
        return dl_error(DL_EINVAL, "pipeline: the schedule splits backwards (I, W) but the "
                                   "callbacks have no bwd_input / bwd_weight");
    dl_comm_stats c0, c1, g0, g1;
    dl_comm_get_stats(e->act_comm, &c0);
    dl_comm_get_stats(e->grad_comm, &g0);
    const dl_sched_action *acts = s->act[stage];
    uint64_t t_start = dl_now_ns(), t = t_start;
    const char *what = "";
    for (i = 0; i < s->len[stage]; i++) {
        const dl_sched_action *a = &acts[i];
        if (a->op == DL_SCHED_OPT) {
            uint64_t t0, t1;
            what = "optimizer step";
            t0 = dl_now_ns();
            if (ops->opt && (rc = ops->opt(arg, a->mb)))
                break;
            t1 = dl_now_ns();
            st->opt_ns += t1 - t0;
            dl_trace_add(trace, trace_rank, DL_TR_OPT, step, a->mb, 0, t0, t1);
        } else if (a->op == DL_SCHED_W) {
            what = "weight gradient";
            if ((rc = run_wgrad(e, arg, a, step, trace, trace_rank, st)))
                break;
        } else if ((rc = run_work(e, s, ops, arg, a, step, trace, trace_rank, st, &what))) {
            break;
        }
        st->actions++;
    }
    uint64_t d0 = dl_now_ns();
    if (rc == DL_OK && !e->open) {
        what = "waiting for the last sends to be received";
        rc = drain_sends(e);
    }
    t = dl_now_ns();
    st->drain_ns = t - d0;
    st->wall_ns = t - t_start;
    /* waiting for a busy neighbour to take the last hand-offs is not the engine's overhead (it
     * would swamp it on the last stages: docs/PERFORMANCE.md, "Engine overhead per action") */
    uint64_t acc = st->busy_ns + st->recv_ns + st->send_ns + st->opt_ns + st->drain_ns;
    st->engine_ns = st->wall_ns > acc ? st->wall_ns - acc : 0;
    st->staging_bytes = e->staging_peak;
    dl_comm_get_stats(e->act_comm, &c1);
    dl_comm_get_stats(e->grad_comm, &g1);
    for (int k = 0; k < DL_NPURPOSES; k++)
        st->bytes_sent += c1.bytes_sent[k] - c0.bytes_sent[k] + g1.bytes_sent[k] - g0.bytes_sent[k];
    st->chan_wait_ns = (c1.wait_ns - c0.wait_ns) + (g1.wait_ns - g0.wait_ns);
    st->sleeps = (c1.sleeps - c0.sleeps) + (g1.sleeps - g0.sleeps);
    dl_trace_add(trace, trace_rank, DL_TR_STEP, step, -1, 0, t_start, t);
    if (rc) {
        char prev[768], buf[32];
        snprintf(prev, sizeof prev, "%s", dl_errmsg());
        const char *an =
            i < s->len[stage] ? dl_sched_action_str(s, &acts[i], buf, sizeof buf) : "end";
        rc = dl_error(rc, "pipeline stage %d, action %d (%s), %s: %s", stage, i, an, what, prev);
        /* the staging buffers may be lent: make sure nobody reads them before they are reused */
        dl_comm_fail(e->act_comm);
        dl_comm_fail(e->grad_comm);
        char keep[1024];
        snprintf(keep, sizeof keep, "%s", dl_errmsg());
        for (int k = 0; k < e->nst; k++)
            if (e->st[k].busy) { /* the requests report the abort: the stage's error stays */
                e->st[k].busy = 0;
                dl_wait(e->st[k].req);
            }
        dl_error(rc, "%s", keep);
    }
    return rc;
}
