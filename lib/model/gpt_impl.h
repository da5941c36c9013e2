/* Forward and backward of a rank's GPT shard, written once for REAL = float and double: the
 * embeddings, the layers as their sublayers (model/sublayer.h) and the head. Included twice by
 * gpt.c with REAL, SFX (f32 / f64) and IS64 (0 / 1) defined. */

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define OP(name) CAT(name, SFX)
#define FN(name) CAT(name, SFX)

/* tensor k's parameters and gradient: in the flat buffers, or in its unit's buffers while the
 * unit is materialised (unit_begin / unit_end in gpt.c) */
#define PARAM(k) ((REAL *)g->pw[k])
#define GRAD(k) ((REAL *)g->gw[k])
/* the residual stream of the current slot; index r is relative to the current chunk's first
 * layer (r = its input, r + 1 its first layer's output, ...) */
#define XRES(r) ((REAL *)g->xres + (size_t)(r)*g->N * g->C)

/* The forward of layer l: its sublayers in order (model/sublayer.h). */
static int FN(layer_fwd_)(dl_gpt *g, int l, int B)
{
    for (int j = 0; j < g->nsub[l]; j++) {
        dl_sub_ctx c;
        sub_ctx(g, l, j, B, &c);
        int rc = g->sub[l * DL_SUB_MAX + j].kind->fwd[IS64](&c);
        if (rc)
            return rc;
    }
    return DL_OK;
}

/* The backward of layer l's sublayers, last to first (part: whole, input or weight; dx holds
 * dL/d(output of layer l) on entry and dL/d(input of layer l) on return, except for the weight
 * part, which leaves it). Units: each materialised before its last sublayer's backward; its
 * gradient complete (handed on, `ready`) after its first sublayer's, unless this is the input
 * part, which writes no parameter gradient. Full recomputation re-runs the layer's forward
 * after its (single) unit is materialised. */
static int FN(layer_bwd_)(dl_gpt *g, int l, int B, dl_bwd_part part, dl_grad_ready_fn ready,
                          void *arg)
{
    const dl_sub_inst *s = &g->sub[l * DL_SUB_MAX];
    int rc;
    for (int j = g->nsub[l] - 1; j >= 0; j--) {
        int u = s[j].unit;
        if ((j == g->nsub[l] - 1 || s[j + 1].unit != u) && (rc = unit_begin_part(g, u, part)))
            return rc;
        if (j == g->nsub[l] - 1 && g->o.recompute && (rc = FN(layer_fwd_)(g, l, B)))
            return rc;
        dl_sub_ctx c;
        sub_ctx(g, l, j, B, &c);
        if ((rc = s[j].kind->bwd[IS64](&c, part)))
            return rc;
        if ((j == 0 || s[j - 1].unit != u) && part != DL_BWD_INPUT &&
            ((rc = unit_end(g, u)) || (ready && (rc = ready(g->ubound[u], arg)))))
            return rc;
    }
    return DL_OK;
}

/* Forward of the current chunk of the current slot: the embeddings first when the chunk is
 * virtual stage 0 (otherwise XRES(0) holds the received input), the head and the loss when it
 * is the last. */
static int FN(forward_)(dl_gpt *g, const int *inputs, const int *targets, int B, double *loss)
{
    int T = rows_T(g), N = B * T, C = g->C, V = g->V, rc, ch = g->cur_chunk;
    int lb = g->cbeg[ch], le = g->cbeg[ch] + g->lay->part.count[ch];
    if (g->embed && ch == 0) {
        if ((rc = unit_begin(g, 0, 0)))
            return rc;
        /* a token slice's positions start at its t0 */
        OP(dl_encoder_fwd_)
        (XRES(0), inputs, PARAM(g->k_wte), PARAM(g->k_wpe) + slice_t0(g) * C, B, T, C);
    }
    for (int l = lb; l < le; l++)
        for (int j = 0; j < g->nsub[l]; j++) {
            const dl_sub_inst *s = &g->sub[l * DL_SUB_MAX + j];
            if ((j == 0 || s[-1].unit != s->unit) && (rc = unit_begin(g, s->unit, 0)))
                return rc;
            dl_sub_ctx c;
            sub_ctx(g, l, j, B, &c);
            if ((rc = s->kind->fwd[IS64](&c)))
                return rc;
        }
    if (!(g->head && ch == g->lay->part.nchunks - 1))
        return DL_OK;
    /* with tied embeddings kept (keep0), unit 0 is still materialised for the head */
    if ((rc = unit_begin(g, g->u_head, 0)))
        return rc;
    OP(dl_layernorm_fwd_)
    (g->lnf, g->lnf_mean, g->lnf_rstd, XRES(le - lb), PARAM(g->k_lnf), PARAM(g->k_lnfb), N, C);
    OP(dl_linear_fwd_)(g->probs, g->lnf, PARAM(g->k_head), NULL, N, C, V);
    double m = OP(dl_crossentropy_fwd_)(g->probs, g->losses, g->probs, targets, N, V);
    if (loss)
        *loss = m;
    return DL_OK;
}

/* The head's backward (ln_f and the LM head) in the given part. The probabilities become the
 * logits' gradient in place (kept per slot, so the weight part finds them); ln_f's output
 * gradient goes to the shared workspace, or to the slot's stash when the weight part is
 * deferred. */
static int FN(head_bwd_)(dl_gpt *g, double dloss, int B, int r, dl_bwd_part part)
{
    int N = B * rows_T(g), C = g->C, V = g->V, whole = part == DL_BWD_WHOLE;
    REAL *dlnf = whole ? (REAL *)g->dlnf : (REAL *)g->cur_stash_head;
    if (part == DL_BWD_WEIGHT) {
        OP(dl_linear_bwd_)(NULL, GRAD(g->k_head), NULL, g->probs, g->lnf, NULL, N, C, V);
        OP(dl_layernorm_bwd_weight_)
        (GRAD(g->k_lnf), GRAD(g->k_lnfb), dlnf, XRES(r), g->lnf_mean, g->lnf_rstd, N, C);
        return DL_OK;
    }
    OP(dl_crossentropy_bwd_)(g->probs, g->probs, g->targets, (REAL)dloss, N, V);
    OP(dl_linear_bwd_write_)
    (dlnf, whole ? GRAD(g->k_head) : NULL, NULL, g->probs, g->lnf, PARAM(g->k_head), N, C, V);
    memset(g->dx, 0, sizeof(REAL) * (size_t)N * C);
    if (whole)
        OP(dl_layernorm_bwd_)
    (g->dx, GRAD(g->k_lnf), GRAD(g->k_lnfb), dlnf, XRES(r), PARAM(g->k_lnf), g->lnf_mean,
     g->lnf_rstd, N, C);
    else OP(dl_layernorm_bwd_input_)(g->dx, dlnf, XRES(r), PARAM(g->k_lnf), g->lnf_mean,
                                     g->lnf_rstd, N, C);
    return DL_OK;
}

/* Backward of the current chunk (part: whole, input or weight gradient): from the loss when it
 * is the last virtual stage, otherwise from the output gradient already in g->dx; the whole
 * and the input part end with dx = the gradient of the chunk's input. The weight part runs the
 * units in the whole backward's order (head, layers last to first, embeddings: the tied wte
 * gradient's two terms in the same order) and hands each on as it completes. */
static int FN(backward_)(dl_gpt *g, double dloss, dl_bwd_part part, dl_grad_ready_fn ready,
                         void *arg)
{
    int B = g->lastB[g->cur_slot], T = rows_T(g), N = B * T, C = g->C, rc, ch = g->cur_chunk;
    int lb = g->cbeg[ch], le = g->cbeg[ch] + g->lay->part.count[ch];
    int wpart = part != DL_BWD_INPUT;
    g->cur_dloss = dloss;
    if (g->head && ch == g->lay->part.nchunks - 1) {
        if ((g->keep0 && (rc = unit_begin_part(g, 0, part))) ||
            (rc = unit_begin_part(g, g->u_head, part)) ||
            (rc = FN(head_bwd_)(g, dloss, B, le - lb, part)))
            return rc;
        if (wpart && ((rc = unit_end(g, g->u_head)) ||
                      (ready && (rc = ready(g->lay->t[g->k_lnf].offset, arg)))))
            return rc;
    }
    for (int l = le - 1; l >= lb; l--)
        if ((rc = FN(layer_bwd_)(g, l, B, part, ready, arg)))
            return rc;
    if (!(g->embed && ch == 0))
        return DL_OK;
    /* the encoder's backward is all weight gradient: the input part keeps its output gradient */
    if (part == DL_BWD_INPUT) {
        memcpy(g->cur_stash_emb, g->dx, sizeof(REAL) * (size_t)N * C);
        return DL_OK;
    }
    /* it reads no parameter, but the unit is materialised like every other (ZeRO-3's schedule:
     * gathered before every unit's backward) */
    if (!g->keep0 && (rc = unit_begin_part(g, 0, part)))
        return rc;
    const REAL *demb = part == DL_BWD_WHOLE ? (REAL *)g->dx : (REAL *)g->cur_stash_emb;
    OP(dl_encoder_bwd_)
    (GRAD(g->k_wte), GRAD(g->k_wpe) + slice_t0(g) * C, demb, g->inputs, B, T, C);
    if ((rc = unit_end(g, 0)))
        return rc;
    if (ready && (rc = ready(0, arg)))
        return rc;
    return DL_OK;
}

#undef PARAM
#undef GRAD
#undef XRES
#undef OP
#undef FN
#undef CAT
#undef CAT_
