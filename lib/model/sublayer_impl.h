/* The attention and the dense MLP sublayers (model/sublayer.h), written once for REAL = float and
 * double. Included twice by sublayer.c with REAL, SFX (f32 / f64) and IS64 (0 / 1) defined. Each
 * is a straight list of kernel calls on named views; the buffers are laid out at the largest
 * micro-batch (MB x T rows), the work is done on the current one's (B x T). */

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define OP(name) CAT(name, SFX)
#define FN(name) CAT(name, SFX)
#define R(p) ((REAL *)(p))

/* Megatron's two conjugate operators (lecture §3.3), over the tp group; identities at tp = 1.
 * f sits before a column-parallel layer: identity forward, all-reduce of the input gradient
 * backward. g sits after a row-parallel layer: all-reduce of the partial outputs forward,
 * identity backward (so neither identity appears below). */
static int FN(f_backward_)(dl_sub_ctx *c, REAL *dx, size_t n)
{
    return dl__sub_tp_allreduce(c, dx, n, IS64);
}
static int FN(g_forward_)(dl_sub_ctx *c, REAL *y, size_t n)
{
    return dl__sub_tp_allreduce(c, y, n, IS64);
}

/* ---- attention: y = x + proj(attention(qkv(ln_1(x)))) ------------------------------------ */

/* what the forward keeps: ln_1's output and statistics, Q/K/V of this rank's heads, the
 * attention probabilities and the heads' outputs */
typedef struct FN(att_acts_) {
    REAL *ln, *mean, *rstd, *qkv, *att, *atty;
} FN(att_acts_);
/* what a deferred weight part needs beyond them: the output gradient (dx on entry), the Q/K/V
 * gradient and ln_1's output gradient */
typedef struct FN(att_stash_) {
    REAL *dy, *dqkv, *dln;
} FN(att_stash_);

static FN(att_acts_) FN(att_acts_at_)(const dl_sub_ctx *c)
{
    const dl_sub_dims *d = &c->d;
    size_t N = (size_t)d->MB * d->T, C = d->C, Cl = d->Cl;
    REAL *p = R(c->act);
    FN(att_acts_) a;
    a.ln = p, p += N * C;
    a.mean = p, p += N;
    a.rstd = p, p += N;
    a.qkv = p, p += N * 3 * Cl;
    a.att = p, p += (size_t)d->MB * d->NHl * d->T * (d->Tkv > 0 ? d->Tkv : d->T);
    a.atty = p;
    return a;
}

static FN(att_stash_) FN(att_stash_at_)(const dl_sub_ctx *c)
{
    size_t N = (size_t)c->d.MB * c->d.T, C = c->d.C, Cl = c->d.Cl;
    REAL *p = R(c->stash);
    FN(att_stash_) s = {NULL, NULL, NULL};
    if (p) {
        s.dy = p, p += N * C;
        s.dqkv = p, p += N * 3 * Cl;
        s.dln = p;
    }
    return s;
}

static int FN(att_fwd_)(dl_sub_ctx *c)
{
    int B = c->d.B, T = c->d.T, N = B * T, C = c->d.C, Cl = c->d.Cl, rc;
    FN(att_acts_) a = FN(att_acts_at_)(c);
    REAL *const *w = (REAL *const *)c->w, *y = R(c->y);
    const REAL *x = c->x;
    OP(dl_layernorm_fwd_)(a.ln, a.mean, a.rstd, x, w[AT_LN_W], w[AT_LN_B], N, C);
    /* f (identity), then the column-parallel Q/K/V of this rank's heads */
    OP(dl_linear_fwd_)(a.qkv, a.ln, w[AT_QKV_W], w[AT_QKV_B], N, C, 3 * Cl);
    if (c->kv) { /* a token slice: its keys and values join the cache, its queries read it */
        REAL *kv = R(c->kv);
        OP(dl_kv_store_)(kv, a.qkv, c->d.Tkv, c->kv_ctx, B, T, Cl);
        OP(dl_attention_kv_fwd_)
        (a.atty, Cl, a.att, a.qkv, 3 * Cl, kv, kv + Cl, 2 * Cl, c->d.Tkv, c->kv_ctx, B, T, c->d.NHl,
         c->d.HS);
    } else
        OP(dl_attention_fwd_)
    (a.atty, Cl, a.att, a.qkv, a.qkv + Cl, a.qkv + 2 * Cl, 3 * Cl, B, T, c->d.NHl, c->d.HS);
    /* row-parallel output projection: partial sums, then g (all-reduce), then the whole bias */
    OP(dl_linear_fwd_)(y, a.atty, w[AT_PROJ_W], NULL, N, Cl, C);
    if ((rc = FN(g_forward_)(c, y, (size_t)N * C)))
        return rc;
    OP(dl_residual_bias_fwd_)(y, y, w[AT_PROJ_B], x, N, C); /* bias and residual */
    return DL_OK;
}

/* The key bias adds q·b_k to every score of a row, which softmax ignores: its gradient is
 * exactly zero, and what the GEMM leaves there is rounding noise that Adam would amplify to
 * lr-sized steps of random sign (and make layouts differ). Keep the exact zero. */
static void FN(att_key_bias_zero_)(dl_sub_ctx *c)
{
    memset(R(c->dw[AT_QKV_B]) + c->d.Cl, 0, sizeof(REAL) * (size_t)c->d.Cl);
}

static int FN(att_wgrad_)(dl_sub_ctx *c)
{
    int N = c->d.B * c->d.T, C = c->d.C, Cl = c->d.Cl;
    FN(att_acts_) a = FN(att_acts_at_)(c);
    FN(att_stash_) s = FN(att_stash_at_)(c);
    REAL *const *dw = (REAL *const *)c->dw;
    OP(dl_linear_bwd_)(NULL, dw[AT_PROJ_W], dw[AT_PROJ_B], s.dy, a.atty, NULL, N, Cl, C);
    OP(dl_linear_bwd_)(NULL, dw[AT_QKV_W], dw[AT_QKV_B], s.dqkv, a.ln, NULL, N, C, 3 * Cl);
    FN(att_key_bias_zero_)(c);
    OP(dl_layernorm_bwd_weight_)(dw[AT_LN_W], dw[AT_LN_B], s.dln, c->x, a.mean, a.rstd, N, C);
    return DL_OK;
}

/* A token slice's attention backward over the cache: dQ written, the cache's key/value
 * gradient added to (written by the sequence's last slice, whose backward runs first), and the
 * slice's own rows of it, now complete, copied into dK and dV. */
static void FN(att_kv_bwd_)(dl_sub_ctx *c, const FN(att_acts_) * a, REAL *dqkv, const REAL *datty)
{
    int B = c->d.B, T = c->d.T, Cl = c->d.Cl, Tkv = c->d.Tkv, ctx = c->kv_ctx;
    const REAL *kv = R(c->kv);
    REAL *dkv = R(c->dkv), beta = ctx + T == Tkv ? (REAL)0 : (REAL)1;
    OP(dl_attention_kv_bwd_)
    (dqkv, 3 * Cl, dkv, dkv + Cl, beta, R(c->ws_scratch), datty, Cl, a->qkv, kv, kv + Cl, 2 * Cl,
     Tkv, ctx, a->att, B, T, c->d.NHl, c->d.HS);
    OP(dl_kv_load_grad_)(dqkv, dkv, Tkv, ctx, B, T, Cl);
}

static int FN(att_bwd_)(dl_sub_ctx *c, dl_bwd_part part)
{
    if (part == DL_BWD_WEIGHT)
        return FN(att_wgrad_)(c);
    int B = c->d.B, T = c->d.T, N = B * T, C = c->d.C, Cl = c->d.Cl, rc;
    int whole = part == DL_BWD_WHOLE;
    FN(att_acts_) a = FN(att_acts_at_)(c);
    FN(att_stash_) s = FN(att_stash_at_)(c);
    REAL *const *w = (REAL *const *)c->w, *dx = R(c->dx), *datty = R(c->ws_datty);
    /* the whole backward's parameter gradients; NULL (not computed) in the input part */
    REAL *const *dw = whole ? (REAL *const *)c->dw : (REAL *const[6]){NULL};
    /* the gradients the weight part reads: the shared workspaces, or the stash when deferred */
    REAL *dqkv = whole ? R(c->ws_dqkv) : s.dqkv, *dln = whole ? R(c->ws_dln) : s.dln;
    /* g backward (identity); dx is updated in place below, so a deferred weight part keeps it */
    if (!whole)
        memcpy(s.dy, dx, sizeof(REAL) * (size_t)N * C);
    OP(dl_linear_bwd_write_)
    (datty, dw[AT_PROJ_W], dw[AT_PROJ_B], dx, a.atty, w[AT_PROJ_W], N, Cl, C);
    if (c->kv)
        FN(att_kv_bwd_)(c, &a, dqkv, datty);
    else
        OP(dl_attention_bwd_write_)
    (dqkv, dqkv + Cl, dqkv + 2 * Cl, R(c->ws_scratch), datty, Cl, a.qkv, a.qkv + Cl, a.qkv + 2 * Cl,
     3 * Cl, a.att, B, T, c->d.NHl, c->d.HS);
    OP(dl_linear_bwd_write_)
    (dln, dw[AT_QKV_W], dw[AT_QKV_B], dqkv, a.ln, w[AT_QKV_W], N, C, 3 * Cl);
    if (whole)
        FN(att_key_bias_zero_)(c);
    if ((rc = FN(f_backward_)(c, dln, (size_t)N * C)))
        return rc;
    if (whole)
        OP(dl_layernorm_bwd_)
    (dx, dw[AT_LN_W], dw[AT_LN_B], dln, c->x, w[AT_LN_W], a.mean, a.rstd, N, C);
    else OP(dl_layernorm_bwd_input_)(dx, dln, c->x, w[AT_LN_W], a.mean, a.rstd, N, C);
    return DL_OK;
}

/* ---- dense MLP: y = x + proj(gelu(fc(ln_2(x)))) ------------------------------------------ */

/* fch: the first linear's output; once the forward is done, the GeLU's derivative there
 * (dl_gelu_fwd_deriv in place), which is all the backward needs of it; fchg: the GeLU's output */
typedef struct FN(mlp_acts_) {
    REAL *ln, *mean, *rstd, *fch, *fchg;
} FN(mlp_acts_);
/* a deferred weight part: the output gradient, the pre-activation gradient, ln_2's output
 * gradient */
typedef struct FN(mlp_stash_) {
    REAL *dy, *dpre, *dln;
} FN(mlp_stash_);

static FN(mlp_acts_) FN(mlp_acts_at_)(const dl_sub_ctx *c)
{
    size_t N = (size_t)c->d.MB * c->d.T, C = c->d.C, Fl = c->d.Fl;
    REAL *p = R(c->act);
    FN(mlp_acts_) a;
    a.ln = p, p += N * C;
    a.mean = p, p += N;
    a.rstd = p, p += N;
    a.fch = p, p += N * Fl;
    a.fchg = p;
    return a;
}

static FN(mlp_stash_) FN(mlp_stash_at_)(const dl_sub_ctx *c)
{
    size_t N = (size_t)c->d.MB * c->d.T, C = c->d.C, Fl = c->d.Fl;
    REAL *p = R(c->stash);
    FN(mlp_stash_) s = {NULL, NULL, NULL};
    if (p) {
        s.dy = p, p += N * C;
        s.dpre = p, p += N * Fl;
        s.dln = p;
    }
    return s;
}

static int FN(mlp_fwd_)(dl_sub_ctx *c)
{
    int N = c->d.B * c->d.T, C = c->d.C, Fl = c->d.Fl, rc;
    FN(mlp_acts_) a = FN(mlp_acts_at_)(c);
    REAL *const *w = (REAL *const *)c->w, *y = R(c->y);
    const REAL *x = c->x;
    OP(dl_layernorm_fwd_)(a.ln, a.mean, a.rstd, x, w[ML_LN_W], w[ML_LN_B], N, C);
    /* f (identity), then the column-parallel first linear */
    OP(dl_linear_fwd_)(a.fch, a.ln, w[ML_FC_W], w[ML_FC_B], N, C, Fl);
    /* fch is read again only by the GeLU backward: keep its derivative there instead */
    OP(dl_gelu_fwd_deriv_)(a.fchg, a.fch, a.fch, (size_t)N * Fl);
    OP(dl_linear_fwd_)(y, a.fchg, w[ML_PROJ_W], NULL, N, Fl, C);
    if ((rc = FN(g_forward_)(c, y, (size_t)N * C)))
        return rc;
    OP(dl_residual_bias_fwd_)(y, y, w[ML_PROJ_B], x, N, C);
    return DL_OK;
}

/* The column sums of the pre-activation gradient that the whole backward fuses into the GeLU
 * backward are, in the weight part, the first linear's bias gradient (the same additions in the
 * same order). */
static int FN(mlp_wgrad_)(dl_sub_ctx *c)
{
    int N = c->d.B * c->d.T, C = c->d.C, Fl = c->d.Fl;
    FN(mlp_acts_) a = FN(mlp_acts_at_)(c);
    FN(mlp_stash_) s = FN(mlp_stash_at_)(c);
    REAL *const *dw = (REAL *const *)c->dw;
    OP(dl_linear_bwd_)(NULL, dw[ML_PROJ_W], dw[ML_PROJ_B], s.dy, a.fchg, NULL, N, Fl, C);
    OP(dl_linear_bwd_)(NULL, dw[ML_FC_W], dw[ML_FC_B], s.dpre, a.ln, NULL, N, C, Fl);
    OP(dl_layernorm_bwd_weight_)(dw[ML_LN_W], dw[ML_LN_B], s.dln, c->x, a.mean, a.rstd, N, C);
    return DL_OK;
}

static int FN(mlp_bwd_)(dl_sub_ctx *c, dl_bwd_part part)
{
    if (part == DL_BWD_WEIGHT)
        return FN(mlp_wgrad_)(c);
    int N = c->d.B * c->d.T, C = c->d.C, Fl = c->d.Fl, rc;
    int whole = part == DL_BWD_WHOLE;
    FN(mlp_acts_) a = FN(mlp_acts_at_)(c);
    FN(mlp_stash_) s = FN(mlp_stash_at_)(c);
    REAL *const *w = (REAL *const *)c->w, *dx = R(c->dx);
    REAL *const *dw = whole ? (REAL *const *)c->dw : (REAL *const[6]){NULL};
    REAL *dpre = whole ? R(c->ws_dfc) : s.dpre, *dln = whole ? R(c->ws_dln) : s.dln;
    /* The activation gradients are fresh at each use: the `_write` kernels overwrite them (no
     * zeroing). dx carries the residual stream and accumulates. g backward (identity); the whole
     * bias's gradient is the column sum of dx. */
    if (!whole)
        memcpy(s.dy, dx, sizeof(REAL) * (size_t)N * C);
    OP(dl_linear_bwd_write_)
    (dpre, dw[ML_PROJ_W], dw[ML_PROJ_B], dx, a.fchg, w[ML_PROJ_W], N, Fl, C);
    /* GeLU backward in place (dpre becomes d(pre-activation)) from the derivative the forward
     * kept in fch, with the first linear's bias gradient summed in the same pass (whole) */
    OP(dl_gelu_bwd_deriv_)(dpre, dw[ML_FC_B], a.fch, dpre, N, Fl);
    OP(dl_linear_bwd_write_)(dln, dw[ML_FC_W], NULL, dpre, a.ln, w[ML_FC_W], N, C, Fl);
    if ((rc = FN(f_backward_)(c, dln, (size_t)N * C)))
        return rc;
    if (whole)
        OP(dl_layernorm_bwd_)
    (dx, dw[ML_LN_W], dw[ML_LN_B], dln, c->x, w[ML_LN_W], a.mean, a.rstd, N, C);
    else OP(dl_layernorm_bwd_input_)(dx, dln, c->x, w[ML_LN_W], a.mean, a.rstd, N, C);
    return DL_OK;
}

#undef R
#undef OP
#undef FN
#undef CAT
#undef CAT_
