/* Token-level pipelining in the trainer (TeraPipe, Li et al. 2021; parallel/pipe_tera.h). Each
 * sequence of a micro-batch is cut into c slices (equal, L = T / c positions, or the lengths
 * given: TeraPipe's dynamic program; buffers and hand-offs sized for the longest); the schedule moves
 * slices (GPipe's order: dl_sched_terapipe; 1F1B's: dl_sched_1f1b_tokens). A stage keeps the
 * keys and values of each micro-batch in flight in one of the model's caches (model/gpt.c,
 * category kvcache), taken at its first slice's forward and given back after that slice's
 * backward, its last: the most micro-batches in flight on the stage (walked from the schedule)
 * is how many caches it needs. The loss of a slice is the mean over its B·l positions: weighted
 * l / T it adds up to the sequence's mean, and the backward's d(loss)/d(position) is the
 * unsliced one, so the step computes exactly the model one rank computes. */
#include <stdlib.h>
#include <string.h>
#include "parallel/pipe_tera.h"

/* The most micro-batches whose slices are in flight at once on stage q: from the forward of a
 * micro-batch's first slice to the backward of that slice. */
static int peak_caches(const dl_sched *s, int q)
{
    int live = 0, peak = 0, c = s->seq_chunks;
    for (int i = 0; i < s->len[q]; i++) {
        const dl_sched_action *a = &s->act[q][i];
        if (a->op == DL_SCHED_OPT || a->mb % c != 0)
            continue;
        live += a->op == DL_SCHED_F ? 1 : -1;
        peak = live > peak ? live : peak;
    }
    return peak;
}

int tr_tera_open(tr_tera *t, const dl_train_opts *o, const dl_sched *s, int stage)
{
    memset(t, 0, sizeof *t);
    t->c = o->pipeline.token_chunks > 1 ? o->pipeline.token_chunks : 1;
    t->T = o->model.seq;
    t->L = t->T / t->c;
    t->m = o->batch.microbatches;
    if (t->c == 1)
        return DL_OK;
    t->len = malloc(sizeof(int) * (size_t)t->c);
    t->t0 = malloc(sizeof(int) * (size_t)t->c);
    if (!t->len || !t->t0)
        return dl_error(DL_ENOMEM, "pipeline: out of memory");
    for (int k = 0, at = 0; k < t->c; at += t->len[k++]) {
        const int *given = o->pipeline.token_lens;
        t->len[k] = given ? given[k] : t->T / t->c;
        t->t0[k] = at;
        t->L = t->len[k] > t->L ? t->len[k] : t->L;
    }
    t->ncache = peak_caches(s, stage);
    size_t n = (size_t)o->batch.micro * t->L;
    t->cache_of = malloc(sizeof(int) * (size_t)t->m);
    t->free_cache = malloc(sizeof(int) * (size_t)(t->ncache ? t->ncache : 1));
    t->in = malloc(sizeof(int) * n);
    t->tg = malloc(sizeof(int) * n);
    if (!t->cache_of || !t->free_cache || !t->in || !t->tg)
        return dl_error(DL_ENOMEM, "pipeline: out of memory");
    for (int i = 0; i < t->m; i++) t->cache_of[i] = -1;
    for (int i = 0; i < t->ncache; i++) t->free_cache[i] = t->ncache - 1 - i;
    t->nfree = t->ncache;
    return DL_OK;
}

void tr_tera_close(tr_tera *t)
{
    free(t->cache_of), free(t->free_cache), free(t->in), free(t->tg), free(t->len), free(t->t0);
    memset(t, 0, sizeof *t);
}

void tr_tera_columns(const tr_tera *t, const int *full, int B, int k, int *out)
{
    size_t l = (size_t)t->len[k];
    for (int b = 0; b < B; b++)
        memcpy(out + b * l, full + (size_t)b * t->T + (size_t)t->t0[k], sizeof(int) * l);
}

double tr_tera_weight(const tr_tera *t, int j)
{
    return t->c == 1 ? 1.0 : (double)t->len[j % t->c] / t->T;
}

int tr_tera_place(const tr_tera *t, dl_gpt *g, int slot, int cache, int k)
{
    return dl_gpt_slot_slice(g, slot, cache, t->t0[k], t->len[k]);
}

int tr_tera_forward(tr_tera *t, dl_gpt *g, int slot, int j, int B, const int **in, const int **tg)
{
    int mb = j / t->c, k = j % t->c, *cache = &t->cache_of[mb % t->m];
    if (k == 0) {
        if (*cache >= 0 || t->nfree == 0)
            return dl_error(DL_EINVAL,
                            "pipeline: no key/value cache for micro-batch %d (%d caches, the "
                            "schedule's most in flight)",
                            mb, t->ncache);
        *cache = t->free_cache[--t->nfree];
    } else if (*cache < 0) {
        return dl_error(DL_EINVAL, "pipeline: token slice %d of micro-batch %d before its first", k,
                        mb);
    }
    if (*in) {
        tr_tera_columns(t, *in, B, k, t->in);
        *in = t->in;
    }
    if (*tg) {
        tr_tera_columns(t, *tg, B, k, t->tg);
        *tg = t->tg;
    }
    return tr_tera_place(t, g, slot, *cache, k);
}

void tr_tera_backward_done(tr_tera *t, int j)
{
    if (t->c == 1)
        return;
    int *cache = &t->cache_of[(j / t->c) % t->m];
    if (j % t->c == 0 && *cache >= 0) {
        t->free_cache[t->nfree++] = *cache;
        *cache = -1;
    }
}

int tr_tera_resolve(const dl_train_opts *o)
{
    int c = o->pipeline.token_chunks, T = o->model.seq, k = o->pipeline.schedule;
    const int *lens = o->pipeline.token_lens;
    if (c <= 1)
        return DL_OK;
    if (o->layout.pp < 2)
        return dl_error(DL_EINVAL, "--token-chunks needs a pipeline (--pp N, N >= 2)");
    if (c > T)
        return dl_error(DL_EINVAL,
                        "--token-chunks %d is more than the sequence's %d tokens (--seq)", c, T);
    long sum = 0;
    for (int i = 0; lens && i < c; i++)
        sum += lens[i] >= 1 ? lens[i] : -(long)T - 1; /* a slice of no token: the sum is off */
    if (lens && sum != T)
        return dl_error(DL_EINVAL,
                        "token slices: %d lengths of at least 1 must add up to the sequence's %d "
                        "tokens",
                        c, T);
    if (!lens && T % c)
        return dl_error(DL_EINVAL,
                        "--token-chunks %d does not divide the sequence's %d tokens (--seq): the "
                        "slices are equal",
                        c, T);
    if (o->pipeline.schedule_file)
        return dl_error(DL_EINVAL, "--token-chunks does not combine with --schedule-file (the "
                                   "file's micro-batches are not token slices)");
    if (k != DL_SCHED_CUSTOM && k != DL_SCHED_GPIPE && k != DL_SCHED_1F1B) /* custom: gpipe */
        return dl_error(DL_EINVAL,
                        "--token-chunks needs --schedule gpipe or 1f1b (%s cannot carry token "
                        "slices: a sequence's slices run forward in order and backward in "
                        "reverse)",
                        dl_sched_kind_name((dl_sched_kind)k));
    if (o->model.experts > 0)
        return dl_error(DL_EINVAL,
                        "--token-chunks does not combine with MoE layers (--experts): an "
                        "expert's per-sequence capacity would have to carry across the slices");
    if (o->output.sample > 0)
        return dl_error(DL_EINVAL, "--token-chunks does not combine with --sample (the head "
                                   "keeps one slice's probabilities)");
    return DL_OK;
}
