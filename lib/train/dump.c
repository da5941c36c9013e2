/* The trainer's dumps (train/dump.h): the reduced gradient and the parameters, whole, for the
 * caller, a checkpoint or a comparison with other frameworks. */
#include <stdio.h>
#include <stdlib.h>
#include "train/dump.h"
#include "train/eval.h"
#include "train/compose.h"
#include "io/path.h"
#include "distlab/ckpt.h"
#include "model/gpt_priv.h"

/* Step 1's gradients as a safetensors file (every rank writes its own slices) and its global
 * batch (rank 0), for comparisons with other frameworks. */
static int dump_step(tr_env *e, const void *grads, int es)
{
    const dl_train_opts *o = e->o;
    int rc = dl_ckpt_save(o->output.dump_grads, dl_gpt_get_layout(e->g), grads, es,
                          dl_ctx_comm(e->ctx), e->mesh->dp_rank < e->mesh->ep);
    if (rc || dl_ctx_rank(e->ctx) != 0)
        return rc;
    char path[4096];
    snprintf(path, sizeof path, "%s.tokens", o->output.dump_grads);
    if ((rc = dl_path_check_output(path, "gradient dump")))
        return rc;
    FILE *f = fopen(path, "wb");
    if (!f)
        return dl_error(DL_ESYS, "cannot write '%s'", path);
    int T = o->model.seq, G = o->batch.global;
    int *in = malloc(sizeof(int) * (size_t)T * G), *tg = malloc(sizeof(int) * (size_t)T * G);
    for (int i = 0; in && tg && i < G && rc == DL_OK; i++)
        rc = dl_data_sample(e->data, i, in + (size_t)i * T, tg + (size_t)i * T);
    if (!in || !tg)
        rc = dl_error(DL_ENOMEM, "dump: out of memory");
    if (rc == DL_OK) {
        for (size_t i = 0; i < (size_t)T * G; i++) {
            int32_t v = in[i];
            fwrite(&v, 4, 1, f);
        }
        for (size_t i = 0; i < (size_t)T * G; i++) {
            int32_t v = tg[i];
            fwrite(&v, 4, 1, f);
        }
    }
    if (fclose(f) != 0 && rc == DL_OK)
        rc = dl_error(DL_ESYS, "cannot write '%s'", path);
    free(in), free(tg);
    return rc;
}


int tr_dump_grads(tr_env *e)
{
    const dl_train_opts *o = e->o;
    int last = o->output.want_grads && e->step == o->optim.steps,
        first = o->output.dump_grads && e->step == 1;
    if (!last && !first)
        return DL_OK;
    /* the reduced gradient, whole, for the caller (not training traffic) */
    int es = e->pr.bf16 ? 4 : e->pr.dsize;
    void *full = malloc(e->numel * (size_t)es + 64);
    if (!full)
        return dl_error(DL_ENOMEM, "training: out of host memory");
    int rc = tr_export(e->comp, 1, full);
    if (rc == DL_OK && last)
        tr_gather_into(e, full, es, e->res->output.grads);
    if (rc == DL_OK && first)
        rc = dump_step(e, full, es);
    free(full);
    return rc;
}

int tr_params_whole(tr_env *e, void **full, int *owned)
{
    int es = e->pr.bf16 ? 4 : e->pr.dsize;
    void *direct = tr_whole_params(e->comp);
    *full = direct;
    *owned = !direct;
    if (direct)
        return DL_OK;
    if (!(*full = malloc(e->numel * (size_t)es + 64)))
        return dl_error(DL_ENOMEM, "training: out of host memory");
    int rc = tr_export(e->comp, 0, *full);
    if (rc) {
        free(*full);
        *full = NULL, *owned = 0;
    }
    return rc;
}

int tr_save_params(tr_env *e)
{
    const dl_train_opts *o = e->o;
    if (!o->output.want_params && !o->ckpt.save)
        return DL_OK;
    int es = e->pr.bf16 ? 4 : e->pr.dsize, owned;
    void *full;
    int rc = tr_params_whole(e, &full, &owned);
    if (rc)
        return rc;
    if (o->output.want_params)
        tr_gather_into(e, full, es, e->res->output.params);
    if (rc == DL_OK && o->ckpt.save)
        rc = dl_ckpt_save(o->ckpt.save, dl_gpt_get_layout(e->g), full, es, dl_ctx_comm(e->ctx),
                          e->mesh->dp_rank < e->mesh->ep);
    if (owned)
        free(full);
    return rc;
}
