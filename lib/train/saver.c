#define _GNU_SOURCE
/* A rank's full-state saves over the run (train/saver.h): one save in flight at a time, its
 * phases IDLE -> WRITING (the rank's file on the writer) -> COMMITTING (rank 0's manifest and
 * rename on the writer) -> IDLE, each step taken at a boundary where every rank's writer is done
 * (the boundary's all-reduce carries the stop request and whether this rank's writer is busy), so
 * that every rank takes it at the same boundary and the collectives stay on the rank's thread. */
#include "config.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "distlab.h"
#include "io/ckdir_writer.h"
#include "train/run.h"
#include "train/saver.h"
#include "train/state.h"

enum { SV_IDLE, SV_WRITING, SV_COMMITTING };

struct tr_saver {
    tr_env *e;
    dl_comm *ck;
    dl__ckd_writer *w;
    int phase;
    dl__ckd_save_args a; /* the save in flight */
    dl__ckd_shard sh;
    dl__ckd_save_state st;
    void *snap; /* the snapshot's buffer (DL_MEM_CKPT), kept for the next save */
    size_t snap_bytes;
    double stall_ms, write_ms, cpu_ms; /* this rank's, for the save in flight */
    int ending; /* the run's end waits: no training is held up (not a stall) */
};

static double ms_since(uint64_t t0) { return (double)(dl_now_ns() - t0) / 1e6; }

static int job_write(void *p)
{
    tr_saver *s = p;
    return dl__ckd_write(&s->a, &s->st);
}

static int job_commit(void *p)
{
    tr_saver *s = p;
    return dl__ckd_commit(&s->a, &s->st);
}

dl_comm *tr_saver_comm(const tr_saver *s) { return s->ck; }

int tr_saver_create(tr_env *e, dl_comm *ck, tr_saver **out)
{
    tr_saver *s = calloc(1, sizeof *s);
    *out = NULL;
    if (!s)
        return dl_error(DL_ENOMEM, "checkpoint: out of memory");
    s->e = e;
    s->ck = ck;
    int rc = dl__ckd_writer_create(e->o->ckpt.sync, &s->w);
    if (rc) {
        free(s);
        return rc;
    }
    *out = s;
    return DL_OK;
}

/* Rank 0: the save's record (the ranks' figures gathered: every rank calls this), its warning
 * when it failed; the status the run goes on with (a failure with on_save_error stop). */
static int record(tr_saver *s, int rc)
{
    tr_env *e = s->e;
    int n = dl_comm_size(s->ck), me = dl_comm_rank(s->ck);
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", rc ? dl_errmsg() : "");
    double *v = calloc((size_t)n * 3, sizeof *v);
    if (!v)
        return dl_error(DL_ENOMEM, "checkpoint: out of memory");
    v[me * 3] = s->stall_ms, v[me * 3 + 1] = s->write_ms, v[me * 3 + 2] = s->cpu_ms;
    int arc = dl_allreduce(s->ck, v, v, (size_t)n * 3, DL_F64, DL_SUM, DL_PURPOSE_OTHER);
    dl_train_ckpt_result *k = &e->R->res->ckpt;
    dl_train_save *grown =
        me == 0 ? realloc(k->save, sizeof *grown * (size_t)(k->nrecords + 1)) : NULL;
    if (grown) {
        dl_train_save *r = &grown[k->nrecords++];
        memset(r, 0, sizeof *r);
        r->step = s->a.step, r->ok = rc == DL_OK, r->bytes = s->st.bytes;
        for (int i = 0; i < n; i++) {
            r->stall_ms = v[i * 3] > r->stall_ms ? v[i * 3] : r->stall_ms;
            r->write_ms = v[i * 3 + 1] > r->write_ms ? v[i * 3 + 1] : r->write_ms;
            r->writer_cpu_ms += v[i * 3 + 2];
        }
        k->save = grown;
        if (rc == DL_OK)
            k->saves++, k->last_saved = s->a.step;
        else
            k->failed++;
    }
    free(v);
    s->stall_ms = s->write_ms = s->cpu_ms = 0;
    FILE *log = e->o->output.log;
    int go_on = e->o->ckpt.on_save_error == DL_SAVE_ERROR_CONTINUE;
    if (rc && go_on && me == 0 && log)
        fprintf(log, "warning: %s; training goes on (--on-save-error continue)\n", msg);
    if (arc)
        return arc;
    return rc && !go_on ? dl_error(rc, "%s", msg) : DL_OK;
}

/* The save's next phase, once every rank's writer is done (waiting for this rank's). */
static int advance(tr_saver *s)
{
    uint64_t t0 = dl_now_ns();
    dl__ckd_job_time t;
    dl__ckd_writer_wait(s->w, &t); /* its status is the save's, which finish reports */
    s->write_ms += t.wall_ms, s->cpu_ms += t.cpu_ms;
    if (s->phase == SV_WRITING) {
        dl__ckd_shard_free(&s->sh);
        dl__ckd_collect(&s->a, &s->st);
        dl__ckd_writer_post(s->w, job_commit, s);
        s->phase = SV_COMMITTING;
        s->stall_ms += s->ending ? 0 : ms_since(t0);
        return DL_OK;
    }
    int rc = dl__ckd_finish(&s->a, &s->st, NULL, 0);
    s->phase = SV_IDLE;
    s->stall_ms += s->ending ? 0 : ms_since(t0);
    return record(s, rc);
}

int tr_saver_drain(tr_saver *s, int end)
{
    int rc = DL_OK;
    s->ending = end;
    while (s->phase != SV_IDLE && rc == DL_OK) rc = advance(s);
    return rc;
}

int tr_saver_boundary(tr_saver *s, int *sig)
{
    float v[2] = {(float)tr_ckpt_stop_requested(),
                  s->phase != SV_IDLE && dl__ckd_writer_busy(s->w)};
    int rc = dl_allreduce(s->ck, v, v, 2, DL_F32, DL_MAX, DL_PURPOSE_OTHER);
    *sig = rc ? 0 : (int)v[0];
    if (rc == DL_OK && s->phase != SV_IDLE && v[1] == 0)
        rc = advance(s);
    return rc;
}

/* The snapshot: the shard's data copied into the saver's buffer, counted in the arena. */
static int snapshot(tr_saver *s)
{
    dl_arena *ar = dl_ctx_arena(s->e->ctx);
    size_t need = (size_t)s->sh.off;
    if (need > s->snap_bytes) {
        dl_arena_free(ar, s->snap);
        s->snap = NULL, s->snap_bytes = 0;
        int rc = dl_arena_alloc(ar, DL_MEM_CKPT, need, &s->snap);
        if (rc)
            return rc;
        s->snap_bytes = need;
    }
    dl__ckd_shard_snapshot(&s->sh, s->snap);
    return DL_OK;
}

int tr_saver_start(tr_saver *s, dl__ckd_save_args *a)
{
    int rc = tr_saver_drain(s, 0);
    uint64_t t0 = dl_now_ns();
    s->sh = *a->shard;
    s->a = *a;
    s->a.shard = &s->sh;
    s->a.world = s->ck;
    if (rc) { /* the previous save stopped the run: this one is not begun */
        dl__ckd_shard_free(&s->sh);
        json_decref(s->a.manifest);
        return rc;
    }
    dl__ckd_begin(&s->a, &s->st);
    /* a rank without its snapshot writes nothing, and collect fails the save everywhere */
    int src = !s->st.over && s->a.writer && !s->e->o->ckpt.sync ? snapshot(s) : DL_OK;
    if (src) {
        s->a.writer = 0;
        dl__ck_fail(&s->st.e, src, "checkpoint of step %d: no snapshot: %s", a->step, dl_errmsg());
    }
    dl__ckd_writer_post(s->w, job_write, s);
    s->phase = SV_WRITING;
    s->stall_ms += ms_since(t0);
    return s->e->o->ckpt.sync ? tr_saver_drain(s, 0) : DL_OK;
}

void tr_saver_destroy(tr_saver *s)
{
    if (!s)
        return;
    dl__ckd_writer_destroy(s->w);
    if (s->phase == SV_WRITING)
        dl__ckd_shard_free(&s->sh);
    if (s->phase != SV_IDLE && dl_comm_rank(s->ck) == 0)
        json_decref(s->a.manifest);
    free(s->st.v);
    dl_arena_free(dl_ctx_arena(s->e->ctx), s->snap);
    free(s);
}
