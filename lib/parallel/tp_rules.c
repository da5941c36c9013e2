/* Tensor parallelism's module in the trainer (parallel/tp_rules.h): the gradient norm's sum over
 * the tp group (each tp rank counted its shards, tr_tensor_counted). */
#include "parallel/tp_rules.h"
#include "parallel/module.h"

int tr_tensor_counted(const dl_gpt_layout *l, int k)
{
    const dl_tensor_info *t = &l->t[k];
    if (t->shard == DL_SHARD_NONE && l->tp_rank != 0)
        return 0;
    return !(t->id == 0 && !l->part.embed);
}

static int tp_reduce_norm(void *st, double *sq)
{
    const tr_env *e = st;
    return dl_allreduce(e->mesh->tp_comm, sq, sq, 1, DL_F64, DL_SUM, DL_PURPOSE_LOSS);
}

int tr_tp_make(tr_env *e, tr_module *m)
{
    if (e->o->layout.tp > 1)
        *m = (tr_module){.name = "tp", .st = e, .reduce_norm = tp_reduce_norm};
    return DL_OK;
}
