/* Forward and backward of a rank's GPT shard, written once for REAL = float and double.
 * Included twice by gpt.c with REAL, SFX (f32 / f64) and DT (DL_F32 / DL_F64) defined. */

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define OP(name) CAT(name, SFX)
#define FN(name) CAT(name, SFX)

/* fch: the first MLP linear's output; once the forward is done, the GeLU's derivative there
 * (dl_gelu_fwd_deriv in place), which is all the backward needs of it. */
typedef struct FN(acts_) {
    REAL *ln1, *ln1_mean, *ln1_rstd, *qkv, *att, *atty, *res2, *ln2, *ln2_mean, *ln2_rstd, *fch,
        *fchg;
} FN(acts_);

/* Pointers of layer set `s` inside the activation block. */
static FN(acts_) FN(layer_acts_)(const dl_gpt *g, int s)
{
    REAL *p = (REAL *)g->cur_act + (size_t)s * g->set_elems;
    size_t N = g->N, C = g->C, Cl = g->Cl, Fl = g->Fl;
    FN(acts_) a;
    a.ln1 = p, p += N * C;
    a.ln1_mean = p, p += N;
    a.ln1_rstd = p, p += N;
    a.qkv = p, p += N * 3 * Cl;
    a.att = p, p += (size_t)g->MB * g->NHl * g->T * g->T;
    a.atty = p, p += N * Cl;
    a.res2 = p, p += N * C;
    a.ln2 = p, p += N * C;
    a.ln2_mean = p, p += N;
    a.ln2_rstd = p, p += N;
    a.fch = p, p += N * Fl;
    a.fchg = p;
    return a;
}

/* tensor k's parameters and gradient: in the flat buffers, or in its unit's buffers while the
 * unit is materialised (unit_begin / unit_end in gpt.c); a layer's through dl_layer_view */
#define PARAM(k) ((REAL *)g->pw[k])
#define GRAD(k) ((REAL *)g->gw[k])
/* the residual stream of the current slot; index r is relative to the current chunk's first
 * layer (r = its input, r + 1 its first layer's output, ...) */
#define XRES(r) ((REAL *)g->xres + (size_t)(r)*g->N * g->C)

/* Megatron's two conjugate operators (lecture §3.3), over the tp group; identities at tp = 1.
 * f sits before a column-parallel layer: identity forward, all-reduce of the input gradient
 * backward. g sits after a row-parallel layer: all-reduce of the partial outputs forward,
 * identity backward. */
static int FN(tp_allreduce_)(dl_gpt *g, REAL *buf, size_t n)
{
    if (g->tp == 1)
        return DL_OK;
    return dl_allreduce(g->o.tp_comm, buf, buf, n, DT, DL_SUM, DL_PURPOSE_ACTIVATIONS);
}
static int FN(f_forward_)(dl_gpt *g, REAL *x, size_t n)
{
    (void)g, (void)x, (void)n;
    return DL_OK;
}
static int FN(f_backward_)(dl_gpt *g, REAL *dx, size_t n) { return FN(tp_allreduce_)(g, dx, n); }
static int FN(g_forward_)(dl_gpt *g, REAL *y, size_t n) { return FN(tp_allreduce_)(g, y, n); }
static int FN(g_backward_)(dl_gpt *g, REAL *dy, size_t n)
{
    (void)g, (void)dy, (void)n;
    return DL_OK;
}

static int FN(layer_fwd_)(dl_gpt *g, int l, int B)
{
    int N = B * g->T, C = g->C, Cl = g->Cl, Fl = g->Fl, rc;
    int k = g->k_layer[l], r = l - g->cbeg[g->cur_chunk];
    FN(acts_) a = FN(layer_acts_)(g, g->o.recompute ? 0 : r);
    dl_layer_view w = dl_layer_view_at(g->pw, k);
    REAL *x = XRES(r), *y = XRES(r + 1);
    OP(dl_layernorm_fwd_)(a.ln1, a.ln1_mean, a.ln1_rstd, x, w.ln1_w, w.ln1_b, N, C);
    if ((rc = FN(f_forward_)(g, a.ln1, (size_t)N * C)))
        return rc;
    /* column-parallel Q/K/V of this rank's heads */
    OP(dl_linear_fwd_)(a.qkv, a.ln1, w.qkv_w, w.qkv_b, N, C, 3 * Cl);
    OP(dl_attention_fwd_)
    (a.atty, Cl, a.att, a.qkv, a.qkv + Cl, a.qkv + 2 * Cl, 3 * Cl, B, g->T, g->NHl, g->HS);
    /* row-parallel output projection: partial sums, then g (all-reduce), then the whole bias */
    OP(dl_linear_fwd_)(a.res2, a.atty, w.attproj_w, NULL, N, Cl, C);
    if ((rc = FN(g_forward_)(g, a.res2, (size_t)N * C)))
        return rc;
    OP(dl_residual_bias_fwd_)(a.res2, a.res2, w.attproj_b, x, N, C); /* bias and residual */
    OP(dl_layernorm_fwd_)(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, w.ln2_w, w.ln2_b, N, C);
    if ((rc = FN(f_forward_)(g, a.ln2, (size_t)N * C)))
        return rc;
    OP(dl_linear_fwd_)(a.fch, a.ln2, w.fc_w, w.fc_b, N, C, Fl);
    /* fch is read again only by the GeLU backward: keep its derivative there instead */
    OP(dl_gelu_fwd_deriv_)(a.fchg, a.fch, a.fch, (size_t)N * Fl);
    OP(dl_linear_fwd_)(y, a.fchg, w.fcproj_w, NULL, N, Fl, C);
    if ((rc = FN(g_forward_)(g, y, (size_t)N * C)))
        return rc;
    OP(dl_residual_bias_fwd_)(y, y, w.fcproj_b, a.res2, N, C);
    return DL_OK;
}

/* dx holds dL/d(output of layer l) on entry and dL/d(input of layer l) on return. */
static int FN(layer_bwd_)(dl_gpt *g, int l, int B)
{
    int N = B * g->T, C = g->C, Cl = g->Cl, Fl = g->Fl, rc;
    int k = g->k_layer[l], r = l - g->cbeg[g->cur_chunk];
    if (g->o.recompute && (rc = FN(layer_fwd_)(g, l, B)))
        return rc;
    FN(acts_) a = FN(layer_acts_)(g, g->o.recompute ? 0 : r);
    dl_layer_view w = dl_layer_view_at(g->pw, k), d = dl_layer_view_at(g->gw, k);
    REAL *x = XRES(r), *dx = g->dx, *dln = g->dln, *dfchg = g->dfchg;
    REAL *dqkv = g->dqkv, *datty = g->datty;
    /* The activation gradients dfchg, dln, datty, dqkv are fresh at each use: the `_write`
     * kernels overwrite them (no zeroing). dx carries the residual stream and accumulates. */
    /* MLP: g backward (identity); the whole bias's gradient is the column sum of dx */
    if ((rc = FN(g_backward_)(g, dx, (size_t)N * C)))
        return rc;
    OP(dl_linear_bwd_write_)
    (dfchg, d.fcproj_w, d.fcproj_b, dx, a.fchg, w.fcproj_w, N, Fl, C);
    /* GeLU backward in place (dfchg becomes d(pre-activation)) from the derivative the forward
     * kept in fch, with the first MLP linear's bias gradient summed in the same pass */
    OP(dl_gelu_bwd_deriv_)(dfchg, d.fc_b, a.fch, dfchg, N, Fl);
    OP(dl_linear_bwd_write_)(dln, d.fc_w, NULL, dfchg, a.ln2, w.fc_w, N, C, Fl);
    if ((rc = FN(f_backward_)(g, dln, (size_t)N * C)))
        return rc;
    OP(dl_layernorm_bwd_)
    (dx, d.ln2_w, d.ln2_b, dln, a.res2, w.ln2_w, a.ln2_mean, a.ln2_rstd, N, C);
    /* attention */
    if ((rc = FN(g_backward_)(g, dx, (size_t)N * C)))
        return rc;
    OP(dl_linear_bwd_write_)(datty, d.attproj_w, d.attproj_b, dx, a.atty, w.attproj_w, N, Cl, C);
    OP(dl_attention_bwd_write_)
    (dqkv, dqkv + Cl, dqkv + 2 * Cl, g->att_scratch, datty, Cl, a.qkv, a.qkv + Cl, a.qkv + 2 * Cl,
     3 * Cl, a.att, B, g->T, g->NHl, g->HS);
    OP(dl_linear_bwd_write_)
    (dln, d.qkv_w, d.qkv_b, dqkv, a.ln1, w.qkv_w, N, C, 3 * Cl);
    /* The key bias adds q·b_k to every score of a row, which softmax ignores: its gradient is
     * exactly zero, and what the GEMM leaves there is rounding noise that Adam would amplify to
     * lr-sized steps of random sign (and make layouts differ). Keep the exact zero. */
    memset((REAL *)d.qkv_b + Cl, 0, sizeof(REAL) * (size_t)Cl);
    if ((rc = FN(f_backward_)(g, dln, (size_t)N * C)))
        return rc;
    OP(dl_layernorm_bwd_)
    (dx, d.ln1_w, d.ln1_b, dln, x, w.ln1_w, a.ln1_mean, a.ln1_rstd, N, C);
    return DL_OK;
}

/* Forward of the current chunk of the current slot: the embeddings first when the chunk is
 * virtual stage 0 (otherwise XRES(0) holds the received input), the head and the loss when it
 * is the last. */
static int FN(forward_)(dl_gpt *g, const int *inputs, const int *targets, int B, double *loss)
{
    int N = B * g->T, C = g->C, V = g->V, rc, ch = g->cur_chunk;
    int lb = g->cbeg[ch], le = g->cbeg[ch] + g->lay->part.count[ch];
    if (g->embed && ch == 0) {
        if ((rc = unit_begin(g, 0, 0)))
            return rc;
        OP(dl_encoder_fwd_)(XRES(0), inputs, PARAM(g->k_wte), PARAM(g->k_wpe), B, g->T, C);
    }
    for (int l = lb; l < le; l++)
        if ((rc = unit_begin(g, g->u_layer0 + l, 0)) || (rc = FN(layer_fwd_)(g, l, B)))
            return rc;
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

/* Backward of the current chunk: from the loss when it is the last virtual stage, otherwise
 * from the output gradient already in g->dx; ends with dx = the gradient of the chunk's input
 * (and the embeddings' gradients at virtual stage 0). */
static int FN(backward_)(dl_gpt *g, double dloss, dl_grad_ready_fn ready, void *arg)
{
    int B = g->lastB[g->cur_slot], N = B * g->T, C = g->C, V = g->V, rc, ch = g->cur_chunk;
    int lb = g->cbeg[ch], le = g->cbeg[ch] + g->lay->part.count[ch];
    if (g->head && ch == g->lay->part.nchunks - 1) {
        if ((g->keep0 && (rc = unit_begin(g, 0, 1))) || (rc = unit_begin(g, g->u_head, 1)))
            return rc;
        OP(dl_crossentropy_bwd_)(g->probs, g->probs, g->targets, (REAL)dloss, N, V);
        OP(dl_linear_bwd_write_)
        (g->dlnf, GRAD(g->k_head), NULL, g->probs, g->lnf, PARAM(g->k_head), N, C, V);
        memset(g->dx, 0, sizeof(REAL) * (size_t)N * C);
        OP(dl_layernorm_bwd_)
        (g->dx, GRAD(g->k_lnf), GRAD(g->k_lnfb), g->dlnf, XRES(le - lb), PARAM(g->k_lnf),
         g->lnf_mean, g->lnf_rstd, N, C);
        if ((rc = unit_end(g, g->u_head)))
            return rc;
        if (ready && (rc = ready(g->lay->t[g->k_lnf].offset, arg)))
            return rc;
    }
    for (int l = le - 1; l >= lb; l--) {
        int u = g->u_layer0 + l;
        if ((rc = unit_begin(g, u, 1)) || (rc = FN(layer_bwd_)(g, l, B)) || (rc = unit_end(g, u)))
            return rc;
        if (ready && (rc = ready(g->lay->t[g->k_layer[l]].offset, arg)))
            return rc;
    }
    if (g->embed && ch == 0) {
        /* the encoder's backward reads no parameter, but the unit is materialised like every
         * other (ZeRO-3's schedule: gathered before every unit's backward) */
        if (!g->keep0 && (rc = unit_begin(g, 0, 1)))
            return rc;
        OP(dl_encoder_bwd_)(GRAD(g->k_wte), GRAD(g->k_wpe), g->dx, g->inputs, B, g->T, C);
        if ((rc = unit_end(g, 0)))
            return rc;
        if (ready && (rc = ready(0, arg)))
            return rc;
    }
    return DL_OK;
}

#undef PARAM
#undef GRAD
#undef XRES
#undef OP
#undef FN
#undef CAT
#undef CAT_
