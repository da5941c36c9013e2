/* --token-chunks auto (apps/common/tera_fit.h; distlab-bench pipeline, distlab-train): a transformer layer's
 * forward and backward timed on token slices through the model's own sublayers, the latency
 * model fitted to them, and TeraPipe's dynamic program over it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "tera_fit.h"
#include "core/stats.h"
#include "model/sublayer.h"

enum { HEADS = 4, REPS = 5, NPAR = 8 };

/* One layer's buffers for a slice of up to T tokens of B sequences (f32, tp 1). */
typedef struct layer_bufs {
    const dl_sublayer_kind *k[2];
    int np[2];
    float *w[2][NPAR], *dw[2][NPAR];
    float *act[2], *x, *mid, *y, *dx, *kv, *dkv, *dln, *datty, *dqkv, *dfc, *scratch;
} layer_bufs;

static float *fcalloc(size_t n) { return calloc(n ? n : 1, sizeof(float)); }

static dl_sub_dims dims(int B, int l, int T, int C)
{
    return (dl_sub_dims){.MB = B,
                         .B = B,
                         .T = l,
                         .C = C,
                         .Cl = C,
                         .Fl = 4 * C,
                         .NHl = HEADS,
                         .HS = C / HEADS,
                         .tp = 1,
                         .Tkv = T};
}

static int bufs_init(layer_bufs *b, int B, int T, int C)
{
    memset(b, 0, sizeof *b);
    dl_gpt_config cfg = {.vocab = 64, .seq = T, .layers = 1, .d_model = C, .heads = HEADS};
    dl_sub_dims d = dims(B, T, T, C);
    size_t N = (size_t)B * T;
    int ok = 1;
    b->k[0] = dl__sublayer_kinds[DL_SUB_ATTENTION], b->k[1] = dl__sublayer_kinds[DL_SUB_MLP_DENSE];
    for (int s = 0; s < 2; s++) {
        b->np[s] = b->k[s]->nparams(&cfg, 0);
        for (int q = 0; q < b->np[s] && q < NPAR; q++) {
            dl_sub_param p;
            b->k[s]->param(&cfg, 0, q, &p);
            size_t n = (size_t)p.rows * (size_t)p.cols;
            b->w[s][q] = fcalloc(n), b->dw[s][q] = fcalloc(n);
            ok &= b->w[s][q] && b->dw[s][q];
            for (size_t i = 0; ok && i < n; i++) /* small values: the times do not depend on them */
                b->w[s][q][i] = 0.02f * (float)((i * 2654435761u) % 1000) / 1000.0f;
        }
        b->act[s] = fcalloc(b->k[s]->act_elems(&d));
        ok &= b->act[s] != NULL;
    }
    b->x = fcalloc(N * C), b->mid = fcalloc(N * C), b->y = fcalloc(N * C), b->dx = fcalloc(N * C);
    b->kv = fcalloc(N * 2 * C), b->dkv = fcalloc(N * 2 * C), b->dln = fcalloc(N * C);
    b->datty = fcalloc(N * C), b->dqkv = fcalloc(N * 3 * C), b->dfc = fcalloc(N * 4 * C);
    b->scratch = fcalloc((size_t)T * T);
    ok &= b->x && b->mid && b->y && b->dx && b->kv && b->dkv && b->dln && b->datty && b->dqkv &&
          b->dfc && b->scratch;
    return ok ? DL_OK : dl_error(DL_ENOMEM, "token-chunks auto: out of memory");
}

static void bufs_free(layer_bufs *b)
{
    for (int s = 0; s < 2; s++) {
        for (int q = 0; q < b->np[s] && q < NPAR; q++) free(b->w[s][q]), free(b->dw[s][q]);
        free(b->act[s]);
    }
    free(b->x), free(b->mid), free(b->y), free(b->dx), free(b->kv), free(b->dkv), free(b->dln);
    free(b->datty), free(b->dqkv), free(b->dfc), free(b->scratch);
}

/* sublayer s of the layer for the slice [ctx, ctx + l) */
static void ctx_of(layer_bufs *b, int s, dl_sub_dims d, int ctx, dl_sub_ctx *c)
{
    memset(c, 0, sizeof *c);
    c->d = d;
    c->w = (void *const *)b->w[s], c->dw = (void *const *)b->dw[s];
    c->act = b->act[s];
    c->x = s ? b->mid : b->x, c->y = s ? b->y : b->mid, c->dx = b->dx;
    c->ws_dln = b->dln, c->ws_datty = b->datty, c->ws_dqkv = b->dqkv, c->ws_dfc = b->dfc;
    c->ws_scratch = b->scratch;
    if (!s)
        c->kv = b->kv, c->dkv = b->dkv, c->kv_ctx = ctx;
}

/* seconds of one forward and whole backward of the layer on the slice (median of REPS) */
static int time_slice(layer_bufs *b, int B, int T, int C, int l, int ctx, double *sec)
{
    double t[REPS];
    dl_sub_dims d = dims(B, l, T, C);
    dl_sub_ctx c[2];
    ctx_of(b, 0, d, ctx, &c[0]);
    ctx_of(b, 1, d, ctx, &c[1]);
    for (int r = 0; r < REPS; r++) {
        uint64_t t0 = dl_now_ns();
        int rc = b->k[0]->fwd[0](&c[0]);
        rc = rc ? rc : b->k[1]->fwd[0](&c[1]);
        rc = rc ? rc : b->k[1]->bwd[0](&c[1], DL_BWD_WHOLE);
        rc = rc ? rc : b->k[0]->bwd[0](&c[0], DL_BWD_WHOLE);
        if (rc)
            return rc;
        t[r] = (double)(dl_now_ns() - t0) / 1e9;
    }
    *sec = dl__median_copy(t, REPS);
    return DL_OK;
}

int tera_fit_latency(int T, int C, int B, FILE *f, dl_tera_latency *model, double err[2])
{
    enum { MAXPTS = 32 };
    int l[MAXPTS], ctx[MAXPTS], n = 0, rc;
    double t[MAXPTS], rms = 0, mx = 0;
    layer_bufs b;
    if (T < 4 || C % HEADS)
        return dl_error(DL_EINVAL, "token-chunks auto: need --seq >= 4 and --d-model a multiple "
                                   "of 4");
    if ((rc = bufs_init(&b, B, T, C)) != DL_OK) {
        bufs_free(&b);
        return rc;
    }
    /* slices of T/16 .. T tokens, each at every context quarter it fits after */
    for (int li = T / 16 > 0 ? T / 16 : 1; li <= T && rc == DL_OK; li *= 2)
        for (int q = 0; q < 4 && n < MAXPTS && rc == DL_OK; q++) {
            int cx = q * T / 4;
            if (cx + li > T)
                break;
            l[n] = li, ctx[n] = cx;
            rc = time_slice(&b, B, T, C, li, cx, &t[n]);
            n++;
        }
    bufs_free(&b);
    if (rc == DL_OK)
        rc = dl_tera_latency_fit(l, ctx, t, n, model, &rms, &mx);
    if (rc == DL_OK)
        fprintf(f,
                "# token-chunks auto: one layer's forward + backward, %d x %d tokens, width %d, "
                "%d slices timed: t(l, ctx) = %.3g + %.3g l + %.3g l (ctx + (l+1)/2) s; "
                "fit error %.1f%% rms, %.1f%% worst\n",
                B, T, C, n, model->a, model->b, model->c, 100 * rms, 100 * mx);
    if (rc == DL_OK && err)
        err[0] = rms, err[1] = mx;
    return rc;
}

static double model_cost(void *arg, int l, int ctx)
{
    double t = dl_tera_latency_eval(arg, l, ctx);
    return t > 0 ? t : 1e-12; /* a fit may go negative far from its points */
}

int tera_fit_plan(const dl_tera_latency *model, int T, int K, int nseq, FILE *f, int *lens, int *n,
                  double **scale)
{
    int gran = T % 32 == 0 ? T / 32 : 1, rc;
    if ((rc = dl_tera_slices(T, K, gran, model_cost, (void *)model, lens, n, NULL)) != DL_OK)
        return rc;
    *scale = malloc(sizeof(double) * (size_t)nseq * (size_t)*n);
    if (!*scale)
        return dl_error(DL_ENOMEM, "token-chunks auto: out of memory");
    double whole = model_cost((void *)model, T, 0) / *n;
    fprintf(f, "# token-chunks auto, %d stages: %d slices of", K, *n);
    for (int i = 0, cx = 0; i < *n; cx += lens[i], i++) {
        fprintf(f, " %d", lens[i]);
        for (int q = 0; q < nseq; q++)
            (*scale)[q * *n + i] = model_cost((void *)model, lens[i], cx) / whole;
    }
    int big = 0;
    for (int i = 0; i < *n; i++) big = lens[i] > big ? lens[i] : big;
    fprintf(f, " tokens (the largest hand-off: %d tokens)\n", big);
    return DL_OK;
}
