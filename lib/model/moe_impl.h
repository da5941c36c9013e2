/* The mixture-of-experts MLP's forward and backward (model/sublayer_moe.c has the rules), written
 * once for REAL = float and double: included twice by sublayer_moe.c with REAL, SFX, IS64 and DT
 * (the collectives' dtype) defined. Routing decisions (expert indices, rows) are kept in the
 * activation set as REAL values: small integers, exact in either type. */

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define OP(name) CAT(name, SFX)
#define FN(name) CAT(name, SFX)
#define R(p) ((REAL *)(p))

/* The activation set's views (moe_act_elems's order). ch, gate, row, dg: per token K choices in
 * choice rank order (row: where the choice's row is in the rows sent, -1 when dropped); cnt_s:
 * rows sent per global expert (so per destination, expert-major); cnt_r: rows received per
 * source rank and local expert; ys: the rows sent (ln_2 output), then the expert outputs that
 * came back, then in the backward their gradients and the input gradients that came back; xe:
 * the received rows by local expert; x2, x3: exchange and permutation buffers; dye: the expert
 * outputs' gradient by local expert; h: the GeLU derivative; a: the GeLU output; dh: the
 * pre-activation gradient. */
typedef struct FN(moe_view_) {
    REAL *ln, *mean, *rstd, *p, *dlog, *lse, *ch, *gate, *row, *dg, *cnt_s, *cnt_r, *dln, *ys;
    REAL *xe, *x2, *x3, *dye, *h, *a, *dh;
} FN(moe_view_);

static FN(moe_view_) FN(moe_view_at_)(const dl_sub_ctx *c)
{
    const dl_sub_dims *d = &c->d;
    size_t N = (size_t)d->MB * d->T, C = d->C, E = d->E, K = d->K, F = d->Fe;
    size_t Ns = moe_rows_sent(d), Rr = moe_rows_recv(d);
    REAL *p = R(c->act);
    FN(moe_view_) v;
    v.ln = p, p += N * C;
    v.mean = p, p += N;
    v.rstd = p, p += N;
    v.p = p, p += N * E;
    v.dlog = p, p += N * E;
    v.lse = p, p += N;
    v.ch = p, p += N * K;
    v.gate = p, p += N * K;
    v.row = p, p += N * K;
    v.dg = p, p += N * K;
    v.cnt_s = p, p += E;
    v.cnt_r = p, p += E;
    v.dln = p, p += N * C;
    v.ys = p, p += Ns * C;
    v.xe = p, p += Rr * C;
    v.x2 = p, p += Rr * C;
    v.x3 = p, p += Rr * C;
    v.dye = p, p += Rr * C;
    v.h = p, p += Rr * F;
    v.a = p, p += Rr * F;
    v.dh = p;
    return v;
}

/* Softmax of one token's logits in place (probabilities), its logsumexp returned. */
static REAL FN(moe_softmax_)(REAL *l, int E)
{
    REAL m = l[0], s = 0;
    for (int e = 1; e < E; e++) m = l[e] > m ? l[e] : m;
    for (int e = 0; e < E; e++) /* each exp once: the routing's largest cost was these */
        s += l[e] = (REAL)exp((double)(l[e] - m));
    for (int e = 0; e < E; e++) l[e] /= s;
    return m + (REAL)log((double)s);
}

/* One token's top-k by p (ties to the lower index) and gates. */
static void FN(moe_topk_)(const REAL *p, int E, int K, REAL *ch, REAL *gate)
{
    REAL sum = 0;
    for (int c = 0; c < K; c++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int q = 0; q < c; q++) taken |= (int)ch[q] == e;
            if (!taken && (best < 0 || p[e] > p[best]))
                best = e;
        }
        ch[c] = (REAL)best;
        sum += p[best];
    }
    for (int c = 0; c < K; c++) gate[c] = K == 1 ? p[(int)ch[c]] : p[(int)ch[c]] / sum;
}

/* Route the B sequences: probabilities, choices, gates, admissions (row >= 0 marks an admitted
 * choice; the rows are numbered afterwards), the per-sequence losses and the measurements. */
static void FN(moe_route_)(dl_sub_ctx *c, FN(moe_view_) * v, int64_t *load)
{
    const dl_sub_dims *d = &c->d;
    const dl_gpt_config *cf = c->cfg;
    int B = d->B, T = d->T, E = d->E, K = d->K;
    int64_t cap = dl__moe_capacity(cf, T);
    for (int b = 0; b < B; b++) {
        double aux = 0, z = 0;
        uint64_t h = 0x6D6F65ull;
        memset(load, 0, sizeof(int64_t) * 2 * (size_t)E); /* admitted, chosen (the f_i) */
        for (int t = 0; t < T; t++) {
            size_t n = (size_t)b * T + t;
            REAL *p = v->p + n * E, *ch = v->ch + n * K;
            v->lse[n] = FN(moe_softmax_)(p, E);
            z += (double)v->lse[n] * (double)v->lse[n];
            FN(moe_topk_)(p, E, K, ch, v->gate + n * K);
            for (int q = 0; q < K; q++) {
                int e = (int)ch[q], in = cap < 0 || load[e] < cap;
                load[e] += in;
                load[E + e]++;
                v->row[n * K + q] = in ? 0 : -1;
                h = moe_mix(h, (uint64_t)(2 * e + in));
                moe_count(c->moe, e, in);
            }
        }
        for (int e = 0; e < E; e++) {
            double P = 0;
            for (int t = 0; t < T; t++) P += (double)v->p[((size_t)b * T + t) * E + e];
            aux += (double)load[E + e] / ((double)K * T) * (P / T);
        }
        moe_seq(c->moe, cf->aux_loss * E * aux, cf->z_loss * z / T, h);
    }
}

/* Number the admitted choices' rows expert-major (so destination-major), each expert's in token
 * order; cnt_s: rows per global expert. */
static void FN(moe_rows_)(const dl_sub_dims *d, FN(moe_view_) * v, int64_t *off)
{
    size_t NK = (size_t)d->B * d->T * d->K;
    memset(off, 0, sizeof(int64_t) * (size_t)d->E);
    for (size_t i = 0; i < NK; i++)
        if (v->row[i] >= 0)
            off[(int)v->ch[i]]++;
    for (int e = 0, o = 0; e < d->E; e++) {
        v->cnt_s[e] = (REAL)off[e];
        int n = (int)off[e];
        off[e] = o, o += n;
    }
    for (size_t i = 0; i < NK; i++)
        if (v->row[i] >= 0)
            v->row[i] = (REAL)off[(int)v->ch[i]]++;
}

/* One all-to-all-v of rows of `width` over the ep group: send[q] rows to rank q from the counts
 * per (destination, local expert) in scnt, rcnt likewise per (source, local expert); a copy at
 * ep 1. The bytes sent (this rank's own block included: the payload) go to the measurements. */
static int FN(moe_exchange_)(dl_sub_ctx *c, const REAL *send, const REAL *scnt, REAL *recv,
                             const REAL *rcnt, int width)
{
    const dl_sub_dims *d = &c->d;
    size_t sc[MOE_MAX_EP], sd[MOE_MAX_EP], rc[MOE_MAX_EP], rd[MOE_MAX_EP];
    size_t so = 0, ro = 0;
    for (int q = 0; q < d->ep; q++) {
        size_t ns = 0, nr = 0;
        for (int e = 0; e < d->El; e++) {
            ns += (size_t)scnt[q * d->El + e];
            nr += (size_t)rcnt[q * d->El + e];
        }
        sc[q] = ns * (size_t)width, sd[q] = so, so += sc[q];
        rc[q] = nr * (size_t)width, rd[q] = ro, ro += rc[q];
    }
    if (c->moe)
        c->moe->a2a_bytes += (double)so * sizeof(REAL);
    if (d->ep == 1) {
        if (so)
            memcpy(recv, send, so * sizeof(REAL));
        return DL_OK;
    }
    return dl_alltoallv(c->ep_comm, send, sc, sd, recv, rc, rd, DT, DL_PURPOSE_ACTIVATIONS);
}

/* The counts: every rank learns how many rows each source sends each of its experts. */
static int FN(moe_counts_)(dl_sub_ctx *c, FN(moe_view_) * v)
{
    if (c->d.ep == 1) {
        memcpy(v->cnt_r, v->cnt_s, sizeof(REAL) * (size_t)c->d.E);
        return DL_OK;
    }
    return dl_alltoall(c->ep_comm, v->cnt_s, v->cnt_r, (size_t)c->d.El, DT, DL_PURPOSE_OTHER);
}

/* Rows between source-major order (as received: per source, its rows for each local expert)
 * and expert-major order (per local expert, the sources' rows in source order). */
static void FN(moe_permute_)(const dl_sub_dims *d, const REAL *cnt_r, REAL *dst, const REAL *src,
                             int width, int to_expert)
{
    size_t start[MOE_MAX_EXPERTS + 1], so = 0;
    start[0] = 0;
    for (int e = 0; e < d->El; e++) {
        size_t n = 0;
        for (int s = 0; s < d->ep; s++) n += (size_t)cnt_r[s * d->El + e];
        start[e + 1] = start[e] + n;
    }
    for (int s = 0; s < d->ep; s++)
        for (int e = 0; e < d->El; e++) {
            size_t n = (size_t)cnt_r[s * d->El + e] * (size_t)width, eo = start[e] * width;
            if (n) {
                if (to_expert)
                    memcpy(dst + eo, src + so, n * sizeof(REAL));
                else
                    memcpy(dst + so, src + eo, n * sizeof(REAL));
            }
            start[e] += (size_t)cnt_r[s * d->El + e];
            so += n;
        }
}

/* local expert e's rows: their first row and count (expert-major order) */
static size_t FN(moe_expert_rows_)(const dl_sub_dims *d, const REAL *cnt_r, int e, size_t *first)
{
    size_t o = 0, n = 0;
    for (int q = 0; q < d->El; q++)
        for (int s = 0; s < d->ep; s++) {
            size_t k = (size_t)cnt_r[s * d->El + q];
            o += q < e ? k : 0;
            n += q == e ? k : 0;
        }
    *first = o;
    return n;
}

/* local expert e's parameters or gradients */
static REAL *FN(moe_ex_)(void *const *w, int e, int p) { return R(w[MO_FIXED + e * EX_N + p]); }

/* the experts' forward on their rows (expert-major in xe): h, a, and their outputs in x3 */
static void FN(moe_experts_fwd_)(dl_sub_ctx *c, FN(moe_view_) * v)
{
    const dl_sub_dims *d = &c->d;
    int C = d->C, F = d->Fe;
    for (int e = 0; e < d->El; e++) {
        size_t o, n = FN(moe_expert_rows_)(d, v->cnt_r, e, &o);
        if (!n)
            continue;
        REAL *h = v->h + o * F, *a = v->a + o * F;
        OP(dl_linear_fwd_)
        (h, v->xe + o * C, FN(moe_ex_)(c->w, e, EX_FC_W), FN(moe_ex_)(c->w, e, EX_FC_B), (int)n, C,
         F);
        OP(dl_gelu_fwd_deriv_)(a, h, h, n * (size_t)F);
        OP(dl_linear_fwd_)
        (v->x3 + o * C, a, FN(moe_ex_)(c->w, e, EX_PROJ_W), FN(moe_ex_)(c->w, e, EX_PROJ_B), (int)n,
         F, C);
        if (c->moe)
            c->moe->expert_flop += 4.0 * (double)n * C * F;
    }
}

/* the time since *t0 into *acc (when measuring), and *t0 = now */
static void FN(moe_lap_)(const dl_sub_ctx *c, uint64_t *acc, uint64_t *t0)
{
    uint64_t t = dl_now_ns();
    if (c->moe)
        *acc += t - *t0;
    *t0 = t;
}

/* With split_wait: wait for every ep rank to arrive before an all-to-all, timed apart (moved out
 * of the phase that *t0 starts) */
static int FN(moe_arrive_)(dl_sub_ctx *c, uint64_t *t0)
{
    if (!c->moe || !c->moe->split_wait || c->d.ep == 1)
        return DL_OK;
    uint64_t t = dl_now_ns();
    int rc = dl_barrier(c->ep_comm);
    uint64_t dt = dl_now_ns() - t;
    c->moe->peer_wait_ns += dt, *t0 += dt;
    return rc;
}

static int FN(moe_fwd_)(dl_sub_ctx *c)
{
    const dl_sub_dims *d = &c->d;
    int N = d->B * d->T, C = d->C, E = d->E, K = d->K, rc;
    FN(moe_view_) v = FN(moe_view_at_)(c);
    REAL *const *w = (REAL *const *)c->w, *y = R(c->y);
    const REAL *x = c->x;
    dl_moe_stats dummy = {0}, *st = c->moe ? c->moe : &dummy;
    uint64_t t0 = dl_now_ns();
    int64_t *tmp = malloc(sizeof(int64_t) * 2 * (size_t)E);
    if (!tmp)
        return dl_error(DL_ENOMEM, "moe: out of memory");
    OP(dl_layernorm_fwd_)(v.ln, v.mean, v.rstd, x, w[MO_LN_W], w[MO_LN_B], N, C);
    FN(moe_lap_)(c, &st->norm_ns, &t0);
    OP(dl_linear_fwd_)(v.p, v.ln, w[MO_ROUTER], NULL, N, C, E); /* logits, softmax in place */
    FN(moe_route_)(c, &v, tmp);
    FN(moe_rows_)(d, &v, tmp);
    free(tmp);
    FN(moe_lap_)(c, &st->router_ns, &t0);
    for (size_t i = 0; i < (size_t)N * K; i++) /* the dispatch's rows: ln_2's output */
        if (v.row[i] >= 0)
            memcpy(v.ys + (size_t)v.row[i] * C, v.ln + i / K * C, sizeof(REAL) * (size_t)C);
    if ((rc = FN(moe_arrive_)(c, &t0)))
        return rc;
    uint64_t ta = dl_now_ns();
    if ((rc = FN(moe_counts_)(c, &v)) ||
        (rc = FN(moe_exchange_)(c, v.ys, v.cnt_s, v.x2, v.cnt_r, C)))
        return rc;
    uint64_t tb = dl_now_ns();
    st->a2a_ns += tb - ta;
    dl_trace_add(st->tr, st->tr_rank, DL_TR_MOE_DISPATCH, st->tr_step, -1, st->layer, ta, tb);
    FN(moe_permute_)(d, v.cnt_r, v.xe, v.x2, C, 1);
    FN(moe_lap_)(c, &st->dispatch_ns, &t0);
    FN(moe_experts_fwd_)(c, &v);
    FN(moe_lap_)(c, &st->expert_ns, &t0);
    FN(moe_permute_)(d, v.cnt_r, v.x2, v.x3, C, 0);
    if ((rc = FN(moe_arrive_)(c, &t0)))
        return rc;
    uint64_t tw = dl_now_ns();
    rc = FN(moe_exchange_)(c, v.x2, v.cnt_r, v.ys, v.cnt_s, C); /* the combine */
    uint64_t tx = dl_now_ns();
    st->combine_wait_ns += tx - tw;
    st->a2a_ns += tx - tw;
    dl_trace_add(st->tr, st->tr_rank, DL_TR_MOE_COMBINE, st->tr_step, -1, st->layer, tw, tx);
    if (rc)
        return rc;
    memcpy(y, x, sizeof(REAL) * (size_t)N * C);
    for (size_t i = 0; i < (size_t)N * K; i++)
        if (v.row[i] >= 0) {
            const REAL *ye = v.ys + (size_t)v.row[i] * C;
            REAL g = v.gate[i], *yo = y + i / K * C;
            for (int j = 0; j < C; j++) yo[j] += g * ye[j];
        }
    FN(moe_lap_)(c, &st->combine_ns, &t0);
    return DL_OK;
}

/* The router's backward: the logits' gradient from the gates' gradient, the auxiliary loss and
 * the z-loss (each sequence's weighted by w = dloss · T / MoE layers: 1 / (sequences of the
 * global batch x MoE layers)). */
static void FN(moe_router_bwd_)(dl_sub_ctx *c, FN(moe_view_) * v, double *f)
{
    const dl_sub_dims *d = &c->d;
    const dl_gpt_config *cf = c->cfg;
    int T = d->T, E = d->E, K = d->K;
    double w = c->dloss * T / dl__moe_nlayers(cf);
    for (int b = 0; b < d->B; b++) {
        memset(f, 0, sizeof(double) * (size_t)E);
        for (size_t i = (size_t)b * T * K; i < (size_t)(b + 1) * T * K; i++)
            f[(int)v->ch[i]] += 1.0 / ((double)K * T);
        for (int t = 0; t < T; t++) {
            size_t n = (size_t)b * T + t;
            const REAL *p = v->p + n * E, *ch = v->ch + n * K, *dg = v->dg + n * K;
            REAL *dp = v->dlog + n * E, dot = 0;
            for (int e = 0; e < E; e++) dp[e] = (REAL)(w * cf->aux_loss * E * f[e] / T);
            if (K == 1) {
                dp[(int)ch[0]] += dg[0];
            } else {
                REAL S = 0, s = 0;
                for (int q = 0; q < K; q++) S += p[(int)ch[q]], s += dg[q] * v->gate[n * K + q];
                for (int q = 0; q < K; q++) dp[(int)ch[q]] += (dg[q] - s) / S;
            }
            for (int e = 0; e < E; e++) dot += p[e] * dp[e];
            REAL zz = (REAL)(w * cf->z_loss * 2.0 * (double)v->lse[n] / T);
            for (int e = 0; e < E; e++) dp[e] = p[e] * (dp[e] - dot) + zz * p[e];
        }
    }
}

/* The input part: the gates' and experts' input gradients through the two backward exchanges,
 * the router's, ln_2's into dx (which holds dL/dy, the residual's share, on entry). */
static int FN(moe_bwd_input_)(dl_sub_ctx *c)
{
    const dl_sub_dims *d = &c->d;
    int N = d->B * d->T, C = d->C, K = d->K, F = d->Fe, rc;
    FN(moe_view_) v = FN(moe_view_at_)(c);
    REAL *const *w = (REAL *const *)c->w, *dy = R(c->dx);
    for (size_t i = 0; i < (size_t)N * K; i++) { /* dg, then the rows become dL/d(expert out) */
        v.dg[i] = 0;
        if (v.row[i] < 0)
            continue;
        REAL *ye = v.ys + (size_t)v.row[i] * C, s = 0;
        const REAL *g = dy + i / K * C;
        for (int j = 0; j < C; j++) s += g[j] * ye[j];
        v.dg[i] = s;
        for (int j = 0; j < C; j++) ye[j] = v.gate[i] * g[j];
    }
    if ((rc = FN(moe_exchange_)(c, v.ys, v.cnt_s, v.x2, v.cnt_r, C)))
        return rc;
    FN(moe_permute_)(d, v.cnt_r, v.dye, v.x2, C, 1);
    for (int e = 0; e < d->El; e++) {
        size_t o, n = FN(moe_expert_rows_)(d, v.cnt_r, e, &o);
        if (!n)
            continue;
        REAL *dh = v.dh + o * F;
        OP(dl_linear_bwd_write_)
        (dh, NULL, NULL, v.dye + o * C, v.a + o * F, FN(moe_ex_)(c->w, e, EX_PROJ_W), (int)n, F, C);
        OP(dl_gelu_bwd_deriv_)(dh, NULL, v.h + o * F, dh, (int)n, F);
        OP(dl_linear_bwd_write_)
        (v.x3 + o * C, NULL, NULL, dh, v.xe + o * C, FN(moe_ex_)(c->w, e, EX_FC_W), (int)n, C, F);
    }
    FN(moe_permute_)(d, v.cnt_r, v.x2, v.x3, C, 0);
    if ((rc = FN(moe_exchange_)(c, v.x2, v.cnt_r, v.ys, v.cnt_s, C)))
        return rc;
    memset(v.dln, 0, sizeof(REAL) * (size_t)N * C);
    for (size_t i = 0; i < (size_t)N * K; i++)
        if (v.row[i] >= 0) {
            const REAL *dxe = v.ys + (size_t)v.row[i] * C;
            REAL *o = v.dln + i / K * C;
            for (int j = 0; j < C; j++) o[j] += dxe[j];
        }
    double *f = malloc(sizeof(double) * (size_t)d->E);
    if (!f)
        return dl_error(DL_ENOMEM, "moe: out of memory");
    FN(moe_router_bwd_)(c, &v, f);
    free(f);
    OP(dl_linear_bwd_)(v.dln, NULL, NULL, v.dlog, v.ln, w[MO_ROUTER], N, C, d->E);
    OP(dl_layernorm_bwd_input_)(dy, v.dln, c->x, w[MO_LN_W], v.mean, v.rstd, N, C);
    return DL_OK;
}

/* The weight part: every parameter gradient, accumulated, from what the input part left. */
static int FN(moe_wgrad_)(dl_sub_ctx *c)
{
    const dl_sub_dims *d = &c->d;
    int N = d->B * d->T, C = d->C, F = d->Fe;
    FN(moe_view_) v = FN(moe_view_at_)(c);
    REAL *const *dw = (REAL *const *)c->dw;
    for (int e = 0; e < d->El; e++) {
        size_t o, n = FN(moe_expert_rows_)(d, v.cnt_r, e, &o);
        if (!n)
            continue;
        OP(dl_linear_bwd_)
        (NULL, FN(moe_ex_)(c->dw, e, EX_PROJ_W), FN(moe_ex_)(c->dw, e, EX_PROJ_B), v.dye + o * C,
         v.a + o * F, NULL, (int)n, F, C);
        OP(dl_linear_bwd_)
        (NULL, FN(moe_ex_)(c->dw, e, EX_FC_W), FN(moe_ex_)(c->dw, e, EX_FC_B), v.dh + o * F,
         v.xe + o * C, NULL, (int)n, C, F);
    }
    OP(dl_linear_bwd_)(NULL, dw[MO_ROUTER], NULL, v.dlog, v.ln, NULL, N, C, d->E);
    OP(dl_layernorm_bwd_weight_)(dw[MO_LN_W], dw[MO_LN_B], v.dln, c->x, v.mean, v.rstd, N, C);
    return DL_OK;
}

/* Tensor parallelism (tp > 1): the layer's parameters replicated over the tp group and the
 * micro-batch's sequences split over it (routing groups are sequences: each routes as in the
 * whole batch). tp rank r takes sequences [r B/tp, (r+1) B/tp) through the layer, on its own ep
 * group's all-to-alls; its outputs (forward) or input gradients (backward) are then all-gathered
 * over tp. A batch not divisible by tp (an evaluation's last) runs whole on every tp rank. Each
 * tp rank's parameter gradients are its sequences' share: the trainer sums them over tp
 * (parallel/ep.c). 1: *s is the rank's share of c, of *n elements a block. */
static int FN(moe_tp_share_)(const dl_sub_ctx *c, dl_sub_ctx *s, size_t *n)
{
    int tp = c->d.tp;
    *s = *c;
    if (tp <= 1 || !c->tp_comm || c->d.B % tp)
        return 0;
    size_t r = (size_t)dl_comm_rank(c->tp_comm);
    s->d.B = c->d.B / tp;
    *n = (size_t)s->d.B * c->d.T * c->d.C;
    s->x = (const REAL *)c->x + r * *n;
    s->y = R(c->y) + r * *n;
    s->dx = c->dx ? R(c->dx) + r * *n : NULL;
    return 1;
}

static int FN(moe_tp_gather_)(const dl_sub_ctx *c, void *buf, size_t n)
{
    REAL *own = R(buf) + (size_t)dl_comm_rank(c->tp_comm) * n;
    return dl_allgather(c->tp_comm, own, buf, n * (size_t)c->d.tp, DT, DL_PURPOSE_ACTIVATIONS);
}

static int FN(moe_fwd_tp_)(dl_sub_ctx *c)
{
    dl_sub_ctx s;
    size_t n = 0;
    int split = FN(moe_tp_share_)(c, &s, &n), rc = FN(moe_fwd_)(&s);
    return rc == DL_OK && split ? FN(moe_tp_gather_)(c, c->y, n) : rc;
}

static int FN(moe_bwd_)(dl_sub_ctx *c, dl_bwd_part part)
{
    dl_sub_ctx s;
    size_t n = 0;
    int split = FN(moe_tp_share_)(c, &s, &n), rc = DL_OK;
    if (part != DL_BWD_WEIGHT && (rc = FN(moe_bwd_input_)(&s)) == DL_OK && split)
        rc = FN(moe_tp_gather_)(c, c->dx, n);
    if (rc == DL_OK && part != DL_BWD_INPUT)
        rc = FN(moe_wgrad_)(&s);
    return rc;
}

#undef R
#undef OP
#undef FN
#undef CAT
#undef CAT_
