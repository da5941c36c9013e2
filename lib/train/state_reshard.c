/* The trainer's state in global terms (train/state.h, io/ckdir_map.h): the layout-independent
 * hash of a rank's pieces at a save, and the resume under any layout, each rank reading the
 * byte ranges of its own pieces and checking the hash of what it loaded against the manifest. */
#include "config.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "distlab.h"
#include "core/testhook.h"
#include "io/ckdir.h"
#include "io/ckdir_map.h"
#include "train/compose.h"
#include "train/run.h"
#include "train/state.h"

/* element sizes per kind: parameters in the export type (bf16: fp32 masters), moments in the
 * compute type */
static void kind_sizes(const tr_env *e, int *es)
{
    es[DL_CKD_PARAM] = e->pr.bf16 ? 4 : e->pr.dsize;
    es[DL_CKD_EXP_AVG] = es[DL_CKD_EXP_AVG_SQ] = e->pr.csize;
}

/* This rank's runs: every element it keeps (hash 0: what a load fills, the tied copy too), or
 * the elements the hash counts once (hash 1: the parameters of dp rank 0, the moments of every
 * ZeRO shard or of dp rank 0 when they are not sharded, a tp replica on tp rank 0 only; with
 * expert parallelism each expert from the rank of the first ep group that holds it, dp ranks
 * 0 .. ep - 1, and the dense tensors from dp rank 0: the shares are XORed, so an element
 * counted twice would cancel). */
static int rank_runs(tr_env *e, tr_comp *c, const dl_gpt_layout *whole, int hash, dl__ckd_runs *out)
{
    const dl_gpt_layout *l = dl_gpt_get_layout(e->g);
    const dl_zero_units *zu = c->sh->zu;
    int es[DL_CKD_KINDS], flags = hash ? DL_CKD_SKIP_TIED | DL_CKD_ONE_REPLICA : 0;
    int dp = e->mesh->dp_rank, all = !hash || dp == 0, some = all || dp < e->mesh->ep;
    int xf = all ? flags : flags | DL_CKD_EXPERTS_ONLY;
    kind_sizes(e, es);
    memset(out, 0, sizeof *out);
    if (some)
        dl__ckd_flat_runs(out, whole, l, DL_CKD_PARAM, 0, l->numel, 0, 1, es[0], -1, xf);
    for (int k = DL_CKD_EXP_AVG; k <= DL_CKD_EXP_AVG_SQ && (some || zu->dp > 1); k++)
        for (int u = 0; u < zu->n; u++)
            dl__ckd_flat_runs(out, whole, l, k, zu->u[u].begin, zu->u[u].owned, zu->u[u].sbase, 1,
                              es[k], -1, zu->dp > 1 ? flags : xf);
    return out->nomem ? dl_error(DL_ENOMEM, "checkpoint: out of memory") : DL_OK;
}

/* this rank's share of the hash from its buffers (params: the export-type flat buffer) */
static int local_hash(tr_env *e, tr_comp *c, const dl_gpt_layout *whole, const void *params,
                      uint32_t *h)
{
    dl__ckd_runs r;
    int es[DL_CKD_KINDS], rc = rank_runs(e, c, whole, 1, &r);
    const char *base[DL_CKD_KINDS] = {params, (const char *)c->opt.m, (const char *)c->opt.v};
    kind_sizes(e, es);
    for (size_t i = 0; rc == DL_OK && i < r.n; i++) {
        const dl__ckd_run *x = &r.r[i];
        dl__ckd_hash_run(h, whole, es, x, base[x->slot % DL_CKD_KINDS] + x->at * (uint64_t)x->es);
    }
    dl__ckd_runs_free(&r);
    return rc;
}

/* Every rank's status and share summed over comm (each fills its own row), the shares XORed:
 * the whole hash in h on every rank. The first failing rank's status, named, when one failed. */
static int exchange(dl_comm *comm, int st, uint32_t *h, int nslots)
{
    int n = dl_comm_size(comm), me = dl_comm_rank(comm), w = nslots + 1;
    double *v = calloc((size_t)n * (size_t)w, sizeof *v);
    if (!v)
        return dl_error(DL_ENOMEM, "checkpoint: the state hash: out of memory");
    v[(size_t)me * w] = st;
    for (int s = 0; s < nslots; s++) v[(size_t)me * w + 1 + s] = h[s];
    int rc = dl_allreduce(comm, v, v, (size_t)n * w, DL_F64, DL_SUM, DL_PURPOSE_OTHER);
    for (int r = 0; rc == DL_OK && r < n; r++)
        if (v[(size_t)r * w] != 0)
            rc = r == me ? st
                         : dl_error((int)v[(size_t)r * w],
                                    "checkpoint: rank %d failed: see its message", r);
    for (int s = 0; rc == DL_OK && s < nslots; s++) {
        h[s] = 0;
        for (int r = 0; r < n; r++) h[s] ^= (uint32_t)v[(size_t)r * w + 1 + s];
    }
    free(v);
    return rc;
}

int tr_state_hash(tr_env *e, tr_comp *c, dl_comm *comm, const void *params, int st, json_t **out)
{
    dl_gpt_layout *whole = NULL;
    uint32_t *h = NULL;
    int rc = dl_gpt_layout_create(&e->o->model, 1, 0, &whole), ns = whole ? whole->ntensors : 0;
    ns *= DL_CKD_KINDS;
    if (rc == DL_OK && !(h = calloc((size_t)ns, sizeof *h)))
        rc = dl_error(DL_ENOMEM, "checkpoint: the state hash: out of memory");
    if (rc == DL_OK && st == DL_OK)
        rc = local_hash(e, c, whole, params, h);
    rc = exchange(comm, st ? st : rc, h, ns);
    *out = NULL;
    if (rc == DL_OK && dl_comm_rank(comm) == 0) {
        int es[DL_CKD_KINDS];
        kind_sizes(e, es);
        *out = dl__ckd_hash_json(whole, es, h);
    }
    free(h);
    dl_gpt_layout_destroy(whole);
    return rc;
}

/* Adam's step and the pipeline's weight version: from the file of the same pipeline stage when
 * the checkpoint had as many stages (the async pipeline's versions are per stage), else stage 0's
 * (a flush schedule's version is 0 everywhere and the step the same). */
static int read_counters(tr_env *e, tr_comp *c, const char *dir, json_t *m)
{
    int pp = e->o->layout.pp > 1 ? e->o->layout.pp : 1;
    int same = json_integer_value(json_object_get(json_object_get(m, "layout"), "pp")) == pp;
    int want = same ? e->mesh->pp_rank : 0;
    json_t *f;
    size_t i;
    json_array_foreach(json_object_get(m, "files"), i, f)
    {
        json_t *co = json_object_get(f, "dp_tp_pp");
        if (json_integer_value(json_array_get(co, 0)) != 0 ||
            json_integer_value(json_array_get(co, 1)) != 0 ||
            json_integer_value(json_array_get(co, 2)) != want)
            continue;
        int64_t v[2];
        int rc = dl__ckd_read(dir, json_string_value(json_object_get(f, "name")),
                              "state.adam_step_and_version", "I64", v, sizeof v);
        if (rc == DL_OK) {
            c->opt.t = (int)v[0];
            tr_counter(c, &v[1], 1);
        }
        return rc;
    }
    return dl_error(DL_EINVAL, "--resume: %s/" DL_CKD_MANIFEST " lists no file of dp 0 tp 0 pp %d",
                    dir, want);
}

/* this rank's pieces from the checkpoint into full (the export type) and the moments */
static int load_pieces(tr_env *e, tr_comp *c, const dl_gpt_layout *whole, char *full, int skip_m)
{
    tr_run *R = e->R;
    dl__ckd_runs src, dst;
    int rc = dl__ckd_source_runs(R->resume_dir, R->resume, whole, &src);
    if (rc == DL_OK)
        rc = rank_runs(e, c, whole, 0, &dst);
    void *buf[DL_CKD_KINDS] = {full, skip_m ? NULL : c->opt.m, skip_m ? NULL : c->opt.v};
    if (rc == DL_OK)
        rc = dl__ckd_fill(R->resume_dir, R->resume, whole, &src, &dst, buf);
    if (rc == DL_OK && !skip_m)
        rc = read_counters(e, c, R->resume_dir, R->resume);
    dl__ckd_runs_free(&src), dl__ckd_runs_free(&dst);
    return rc;
}

int tr_ckpt_restore(tr_env *e, tr_comp *c)
{
    tr_run *R = e->R;
    if (!R->resume)
        return DL_OK;
    dl__test_hook *hk = dl__test_hook_get();
    int skip_m = hk && hk->ckpt_skip_moments, es[DL_CKD_KINDS], ns = 0;
    kind_sizes(e, es);
    dl_gpt_layout *whole = NULL;
    uint32_t *h = NULL;
    char *full = malloc(e->numel * (size_t)es[0] + 64);
    int rc = full ? dl__ckd_model(R->resume, R->resume_dir, &whole)
                  : dl_error(DL_ENOMEM, "--resume: out of host memory");
    if (rc == DL_OK && !(h = calloc((size_t)(ns = whole->ntensors * DL_CKD_KINDS), sizeof *h)))
        rc = dl_error(DL_ENOMEM, "--resume: out of host memory");
    if (rc == DL_OK)
        rc = load_pieces(e, c, whole, full, skip_m);
    if (rc == DL_OK && !skip_m)
        rc = local_hash(e, c, whole, full, h);
    /* every rank takes part even after a failure (its status goes round with the hash) */
    if (!skip_m) {
        char what[4200];
        snprintf(what, sizeof what, "--resume: %s", R->resume_dir);
        rc = exchange(dl_ctx_comm(e->ctx), rc, h, ns);
        if (rc == DL_OK)
            rc = dl__ckd_hash_check(R->resume, whole, es, h, what);
    }
    if (rc == DL_OK)
        tr_import(c, full);
    free(full), free(h);
    dl_gpt_layout_destroy(whole);
    return rc;
}
