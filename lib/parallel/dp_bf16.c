/* bf16 data parallelism at ZeRO stage 0 (parallel/module.h): every unit of the gradient is
 * all-reduced as the ring all-reduce's two halves, a reduce-scatter and an all-gather of the
 * padded unit, in place (through a staging buffer when padded). The same volume as one
 * all-reduce, but every element's sum is formed in the ring order of ZeRO's reduce-scatter, so
 * in bf16 (one rounding per hop) stage 0 reduces to bitwise the gradient stages 1-3 reduce (one
 * micro-batch), not merely to within bf16 rounding. Units go as soon as they are final, each
 * through the ZeRO engine's dl_zero_unit_reduce. With expert parallelism the units are cut into
 * dense pieces (over dp) and expert pieces (over the expert-data-parallel group). */
#include <stdlib.h>
#include "parallel/module.h"
#include "parallel/zero_engine.h"

typedef struct bf_state {
    tr_env *e;
    dl_zero_units zr; /* the units cut into dp blocks */
    char *stg;        /* one padded unit, when some unit is padded */
    int next_unit;    /* units >= next_unit are reduced (this step) */
} bf_state;

static int bf_setup(void *st)
{
    bf_state *b = st;
    tr_env *e = b->e;
    int nu;
    size_t *bounds;
    const dl_mesh *m = e->mesh;
    tr_pieces c = {0};
    int rc = tr_unit_bounds(e, &bounds, &nu);
    if (rc == DL_OK && m->edp_comm && (rc = tr_unit_pieces(e, bounds, nu, &c)) == DL_OK)
        rc = dl_zero_units_init2(&b->zr, c.bounds, c.n, m->dp, m->dp_rank, c.expert, m->dp / m->ep,
                                 m->dp_rank / m->ep);
    else if (rc == DL_OK)
        rc = dl_zero_units_init(&b->zr, bounds, nu, m->dp, m->dp_rank);
    tr_pieces_free(&c);
    free(bounds);
    if (rc == DL_OK && dl_zero_units_padded(&b->zr))
        rc = dl_arena_alloc(dl_ctx_arena(e->ctx), DL_MEM_COMM, b->zr.max_padded * 2,
                            (void **)&b->stg);
    return rc;
}

static int bf_begin(void *st)
{
    bf_state *b = st;
    b->next_unit = b->zr.n;
    return DL_OK;
}

static int bf_ready(void *st, size_t first)
{
    bf_state *b = st;
    int rc = DL_OK;
    while (rc == DL_OK && b->next_unit > 0 && b->zr.u[b->next_unit - 1].lo >= first) {
        int u = --b->next_unit;
        dl_comm *c = b->zr.u[u].grp ? b->e->mesh->edp_comm : b->e->mesh->dp_comm;
        rc = dl_zero_unit_reduce(&b->zr, u, c, DL_BF16, dl_gpt_grads(b->e->g), b->stg, 1);
    }
    return rc;
}

static void bf_teardown(void *st)
{
    bf_state *b = st;
    dl_arena_free(dl_ctx_arena(b->e->ctx), b->stg);
    dl_zero_units_free(&b->zr);
    free(b);
}

int tr_dp_bf16_make(tr_env *e, tr_module *m)
{
    const dl_train_opts *o = e->o;
    if (!e->pr.bf16 || o->zero.stage || o->layout.dp < 2 || o->eval.only)
        return DL_OK;
    bf_state *b = calloc(1, sizeof *b);
    if (!b)
        return dl_error(DL_ENOMEM, "bf16 data parallelism: out of memory");
    b->e = e;
    *m = (tr_module){.name = "dp-bf16",
                     .st = b,
                     .setup = bf_setup,
                     .begin = bf_begin,
                     .grads_ready = bf_ready,
                     .teardown = bf_teardown};
    return DL_OK;
}
