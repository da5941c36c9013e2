/* Evaluation and sampling (train/eval.h): forwards through the composition's runner
 * (tr_forward), so the same code evaluates one rank, a tp group or a pipeline. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "train/eval.h"
#include "train/compose.h"
#include "model/gpt_priv.h"
#include "parallel/tp_rules.h"

/* Mean validation loss over the first `windows` windows, split over the dp ranks. */
int tr_evaluate(tr_env *e, double *out, int *used)
{
    const dl_train_opts *o = e->o;
    long W = dl_data_val_windows(e->data);
    if (o->eval.windows > 0 && o->eval.windows < W)
        W = o->eval.windows;
    int T = o->model.seq, mb = o->batch.micro, d = e->mesh->dp, r = e->mesh->dp_rank;
    long lo = W * r / d, hi = W * (r + 1) / d;
    int *in = malloc(sizeof(int) * (size_t)mb * T), *tg = malloc(sizeof(int) * (size_t)mb * T);
    if (!in || !tg) {
        free(in), free(tg);
        return dl_error(DL_ENOMEM, "evaluation: out of memory");
    }
    double sum = 0;
    int rc = DL_OK;
    /* stage 3 gathers parameters in every forward: every dp rank runs as many (a rank out of
     * windows runs one window and drops its loss) */
    long rounds = ((W + d - 1) / d + mb - 1) / mb;
    for (long i = 0; e->lockstep_fwd && i < rounds && rc == DL_OK; i++) {
        if (lo + i * mb < hi)
            continue;
        double junk;
        if ((rc = dl_data_val_window(e->data, 0, in, tg)) == DL_OK)
            rc = tr_forward(e->comp, in, tg, 1, &junk);
    }
    for (long w = lo; w < hi && rc == DL_OK; w += mb) {
        int B = (int)(hi - w < mb ? hi - w : mb);
        for (int b = 0; b < B && rc == DL_OK; b++)
            rc = dl_data_val_window(e->data, w + b, in + (size_t)b * T, tg + (size_t)b * T);
        double loss;
        if (rc == DL_OK && (rc = tr_forward(e->comp, in, tg, B, &loss)) == DL_OK)
            sum += loss * B;
    }
    free(in), free(tg);
    if (rc == DL_OK && d > 1)
        rc = dl_allreduce(e->mesh->dp_comm, &sum, &sum, 1, DL_F64, DL_SUM, DL_PURPOSE_LOSS);
    *out = W > 0 ? sum / (double)W : NAN;
    *used = (int)W;
    return rc;
}

/* Scatter this rank's shard (f32 or f64) into an unsharded f64 buffer (tp = 1 layout order). */
void tr_gather_into(tr_env *e, const void *src, int es, double *dst)
{
    /* with expert parallelism the first ep group: each rank its experts, its rank 0 the rest */
    if (e->mesh->dp_rank >= e->mesh->ep)
        return;
    const dl_gpt_layout *l = dl_gpt_get_layout(e->g);
    dl_gpt_layout *full;
    if (dl_gpt_layout_create(&l->cfg, 1, 0, &full))
        return;
    for (int k = 0; k < l->ntensors; k++) {
        const dl_tensor_info *t = &l->t[k];
        if (!tr_tensor_counted(l, k)) /* tied wte's copy on the head stage: equal */
            continue;
        if (e->mesh->ep_rank != 0 && !dl__is_expert(t->name))
            continue;
        for (size_t i = 0; i < t->numel; i++) {
            size_t j = t->offset + i;
            double v = es == 8 ? ((const double *)src)[j] : ((const float *)src)[j];
            dst[full->t[t->id].offset + (size_t)dl_gpt_global_index(l, k, i)] = v;
        }
    }
    dl_gpt_layout_destroy(full);
}

enum { MAX_VOCAB = 1024 };

/* The byte drawn with u in [0, 1) from the head's probabilities p[V] raised to 1/temp and
 * normalised (temp 1: p itself, as it is). */
static int draw(const void *p, int csize, int V, double temp, double u)
{
    double w[MAX_VOCAB], sum = 0, acc = 0;
    for (int v = 0; v < V; v++) {
        double q = csize == 8 ? ((const double *)p)[v] : ((const float *)p)[v];
        w[v] = temp == 1 ? q : pow(q, 1 / temp);
        sum += w[v];
    }
    if (temp == 1)
        sum = 1;
    for (int v = 0; v < V; v++)
        if (u * sum < (acc += w[v]))
            return v;
    return V - 1;
}

int tr_sample_text(tr_env *e)
{
    const dl_train_opts *o = e->o;
    int T = o->model.seq, V = o->model.vocab, n = o->output.sample;
    double temp = o->output.temperature > 0 ? o->output.temperature : 1;
    const unsigned char *val = dl_data_bytes(e->data) + dl_data_train_len(e->data);
    const unsigned char *prompt = o->output.prompt ? (const unsigned char *)o->output.prompt : val;
    int plen = o->output.prompt ? (int)strlen(o->output.prompt) : 16;
    if (V > MAX_VOCAB)
        return dl_error(DL_EINVAL, "sampling: a vocabulary of %d (at most %d)", V, MAX_VOCAB);
    int *ctx = calloc((size_t)T, sizeof(int));
    char *out = calloc((size_t)n + 1, 1);
    if (!ctx || !out) {
        free(ctx), free(out);
        return dl_error(DL_ENOMEM, "sampling: out of memory");
    }
    int len = plen < T ? plen : T; /* the prompt's last T bytes */
    for (int i = 0; i < len; i++) ctx[i] = prompt[plen - len + i];
    uint64_t st = o->optim.seed * 0x9E3779B97F4A7C15ull + 12345;
    int rc = DL_OK;
    for (int i = 0; i < n && rc == DL_OK; i++) {
        if ((rc = tr_forward(e->comp, ctx, NULL, 1, NULL)))
            break;
        st = st * 6364136223846793005ull + 1442695040888963407ull; /* same on every rank */
        double u = (double)(st >> 11) * (1.0 / 9007199254740992.0);
        int c = V - 1;
        if (e->head) /* the head's probabilities */
            c = draw(dl_gpt_probs(e->g, 0, len - 1), e->pr.csize, V, temp, u);
        double cv = c;
        if ((rc = tr_from_head(e->comp, &cv, 1)))
            break;
        c = (int)cv;
        out[i] = (char)c;
        if (len < T)
            ctx[len++] = c;
        else {
            memmove(ctx, ctx + 1, sizeof(int) * (size_t)(T - 1));
            ctx[T - 1] = c;
        }
    }
    if (rc == DL_OK && dl_ctx_rank(e->ctx) == 0)
        e->res->output.sample = out;
    else
        free(out);
    free(ctx);
    return rc;
}

/* An evaluation inside training: its traffic is not training traffic, so what it sent is
 * counted apart (and subtracted from the per-step figures). */
int tr_evaluate_counted(tr_env *e, tr_eval_bytes *b, double *val, int *used)
{
    dl_comm_stats b0, b1, d0, d1;
    dl_comm_get_stats(e->mesh->tp_comm, &b0);
    dl_comm_get_stats(e->mesh->dp_comm, &d0);
    int rc = tr_evaluate(e, val, used);
    if (rc)
        return rc;
    dl_comm_get_stats(e->mesh->tp_comm, &b1);
    dl_comm_get_stats(e->mesh->dp_comm, &d1);
    b->tp += b1.bytes_sent[DL_PURPOSE_ACTIVATIONS] - b0.bytes_sent[DL_PURPOSE_ACTIVATIONS];
    b->loss += d1.bytes_sent[DL_PURPOSE_LOSS] - d0.bytes_sent[DL_PURPOSE_LOSS];
    b->param += d1.bytes_sent[DL_PURPOSE_PARAMS] - d0.bytes_sent[DL_PURPOSE_PARAMS];
    return DL_OK;
}
