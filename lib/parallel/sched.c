/* Pipeline schedules as data: construction, the generators, weight versions and layer
 * partitioning (lecture 17 §4, §6.2); sched_sim.c validates and simulates a schedule,
 * sched_show.c prints one. The bubble formula and the partition dynamic program are the
 * planner's (lib/plan/plan.c); these files only call them. */
#include "config.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "distlab/error.h"
#include "distlab/plan.h"
#include "distlab/sched.h"
#include "parallel/sched_priv.h"
#include "core/grid.h"
#include "core/strbuf.h"

/* ---------------------------------------------------------------------------------------- */
/* Construction                                                                              */

int dl_sched_new(int p, int m, int v, dl_sched **out)
{
    if (out == NULL)
        return dl_error(DL_EINVAL, "schedule: null output");
    *out = NULL;
    if (p < 1)
        return dl_error(DL_EINVAL, "schedule: need at least 1 stage (p = %d)", p);
    if (m < 1)
        return dl_error(DL_EINVAL, "schedule: need at least 1 micro-batch (m = %d)", m);
    if (v < 1)
        return dl_error(DL_EINVAL, "schedule: need at least 1 model chunk per stage (v = %d)", v);
    dl_sched *s = calloc(1, sizeof *s);
    if (s == NULL)
        return dl_error(DL_ENOMEM, "schedule: out of memory");
    s->kind = DL_SCHED_CUSTOM;
    s->p = p;
    s->m = m;
    s->v = v;
    s->seq_chunks = 1;
    s->flush = 1;
    s->len = calloc((size_t)p, sizeof *s->len);
    s->cap_ = calloc((size_t)p, sizeof *s->cap_);
    s->act = calloc((size_t)p, sizeof *s->act);
    s->vstage = malloc((size_t)p * v * sizeof *s->vstage);
    s->mem_limit = calloc((size_t)p, sizeof *s->mem_limit);
    if (!s->len || !s->cap_ || !s->act || !s->vstage || !s->mem_limit) {
        dl_sched_free(s);
        return dl_error(DL_ENOMEM, "schedule: out of memory");
    }
    for (int q = 0; q < p; q++)
        for (int c = 0; c < v; c++) s->vstage[q * v + c] = c * p + q;
    *out = s;
    return DL_OK;
}

void dl_sched_free(dl_sched *s)
{
    if (s == NULL)
        return;
    if (s->act)
        for (int i = 0; i < s->p; i++) free(s->act[i]);
    free(s->act);
    free(s->len);
    free(s->cap_);
    free(s->vstage);
    free(s->mem_limit);
    free(s);
}

int dl__sched_placement_check(int p, int v, const int *vstage)
{
    int n = p * v;
    char *seen = calloc((size_t)n, 1);
    if (seen == NULL)
        return dl_error(DL_ENOMEM, "schedule: out of memory");
    int st = DL_OK;
    for (int q = 0; q < p && st == DL_OK; q++)
        for (int c = 0; c < v && st == DL_OK; c++) {
            int g = vstage[q * v + c];
            if (g < 0 || g >= n || seen[g])
                st = dl_error(DL_EINVAL,
                              "schedule placement: stage %d chunk %d holds virtual stage %d (%s)",
                              q, c, g, g < 0 || g >= n ? "out of range" : "placed twice");
            else if (c > 0 && g < vstage[q * v + c - 1])
                st = dl_error(DL_EINVAL,
                              "schedule placement: stage %d's chunks must be its virtual stages in "
                              "pipeline order (chunk %d holds %d, chunk %d holds %d)",
                              q, c - 1, vstage[q * v + c - 1], c, g);
            else
                seen[g] = 1;
        }
    free(seen);
    return st;
}

int dl_sched_set_placement(dl_sched *s, const int *vstage)
{
    int st = dl__sched_placement_check(s->p, s->v, vstage);
    if (st == DL_OK)
        memcpy(s->vstage, vstage, (size_t)s->p * s->v * sizeof *vstage);
    return st;
}

int dl_sched_holder(const dl_sched *s, int g, int *stage, int *chunk)
{
    for (int k = 0; k < s->p * s->v; k++)
        if (s->vstage[k] == g) {
            *stage = k / s->v;
            *chunk = k % s->v;
            return DL_OK;
        }
    return dl_error(DL_EINVAL, "schedule: no stage holds virtual stage %d", g);
}

void dl_sched_peers(const dl_sched *s, int stage, int chunk, int *prev, int *prev_chunk, int *next,
                    int *next_chunk)
{
    int g = s->vstage[stage * s->v + chunk];
    *prev = *next = *prev_chunk = *next_chunk = -1;
    if (g > 0)
        dl_sched_holder(s, g - 1, prev, prev_chunk);
    if (g < s->p * s->v - 1)
        dl_sched_holder(s, g + 1, next, next_chunk);
}

int dl_sched_push(dl_sched *s, int stage, int op, int mb, int chunk)
{
    if (s == NULL)
        return dl_error(DL_EINVAL, "schedule: null schedule");
    if (stage < 0 || stage >= s->p)
        return dl_error(DL_EINVAL, "schedule: stage %d out of range 0..%d", stage, s->p - 1);
    if (s->len[stage] == s->cap_[stage]) {
        int nc = s->cap_[stage] ? 2 * s->cap_[stage] : 16;
        dl_sched_action *na = realloc(s->act[stage], (size_t)nc * sizeof *na);
        if (na == NULL)
            return dl_error(DL_ENOMEM, "schedule: out of memory");
        s->act[stage] = na;
        s->cap_[stage] = nc;
    }
    /* Ranges are the validator's job, so that a broken custom schedule can be built and named. */
    s->act[stage][s->len[stage]++] = (dl_sched_action){op, mb, chunk};
    return DL_OK;
}

static const char *const kind_names[] = {"custom",      "naive", "gpipe",    "1f1b",
                                         "interleaved", "async", "terapipe", "1f1b-split",
                                         "zb-h1",       "zb-h2", "zb-v",     "dualpipev"};

const char *dl_sched_kind_name(dl_sched_kind kind)
{
    return ((int)kind >= 0 && (int)kind < (int)(sizeof kind_names / sizeof kind_names[0]))
               ? kind_names[kind]
               : "?";
}

int dl_sched_kind_parse(const char *name, dl_sched_kind *kind)
{
    if (name == NULL || kind == NULL)
        return dl_error(DL_EINVAL, "schedule: null name");
    for (int k = DL_SCHED_NAIVE; k <= DL_SCHED_DUALPIPEV; k++)
        if (strcasecmp(name, kind_names[k]) == 0) {
            *kind = (dl_sched_kind)k;
            return DL_OK;
        }
    if (strcasecmp(name, "pipedream") == 0) {
        *kind = DL_SCHED_ASYNC;
        return DL_OK;
    }
    return dl_error(DL_EINVAL,
                    "unknown schedule '%s' (naive, gpipe, 1f1b, interleaved, async, terapipe, "
                    "1f1b-split, zb-h1, zb-h2, zb-v, dualpipev)",
                    name);
}

int dl_sched_splits(const dl_sched *s, int stage)
{
    for (int q = stage < 0 ? 0 : stage; q < (stage < 0 ? s->p : stage + 1); q++)
        for (int i = 0; i < s->len[q]; i++)
            if (s->act[q][i].op == DL_SCHED_I || s->act[q][i].op == DL_SCHED_W)
                return 1;
    return 0;
}

const char *dl_sched_action_str(const dl_sched *s, const dl_sched_action *a, char *buf, size_t cap)
{
    static const char letter[] =
        {[DL_SCHED_F] = 'F', [DL_SCHED_B] = 'B', [DL_SCHED_I] = 'I', [DL_SCHED_W] = 'W'};
    if (a->op == DL_SCHED_OPT)
        snprintf(buf, cap, "OPT");
    else if (a->op < 0 || a->op > DL_SCHED_W)
        snprintf(buf, cap, "op %d", a->op);
    else if (s != NULL && s->v > 1)
        snprintf(buf, cap, "%c%d.%d", letter[a->op], a->mb, a->chunk);
    else
        snprintf(buf, cap, "%c%d", letter[a->op], a->mb);
    return buf;
}

/* ---------------------------------------------------------------------------------------- */
/* Generators                                                                                */

void dl__gen_emit(dl__gen *g, int stage, int op, int mb, int chunk)
{
    if (g->st == DL_OK)
        g->st = dl_sched_push(g->s, stage, op, mb, chunk);
}

int dl__gen_finish(dl__gen *g, dl_sched **out)
{
    if (g->st != DL_OK) {
        dl_sched_free(g->s);
        return g->st;
    }
    *out = g->s;
    return DL_OK;
}

int dl__gen_start(dl__gen *g, dl_sched_kind kind, int p, int m, int v, dl_sched **out)
{
    if (out == NULL)
        return dl_error(DL_EINVAL, "%s schedule: null output", dl_sched_kind_name(kind));
    *out = NULL;
    g->st = dl_sched_new(p, m, v, &g->s);
    if (g->st != DL_OK)
        return g->st;
    g->s->kind = kind;
    return DL_OK;
}

int dl_sched_gpipe(int p, int m, dl_sched **out)
{
    dl__gen g;
    int st = dl__gen_start(&g, DL_SCHED_GPIPE, p, m, 1, out);
    if (st != DL_OK)
        return st;
    for (int s = 0; s < p; s++) {
        for (int j = 0; j < m; j++) dl__gen_emit(&g, s, DL_SCHED_F, j, 0);
        for (int j = 0; j < m; j++) dl__gen_emit(&g, s, DL_SCHED_B, j, 0);
        dl__gen_emit(&g, s, DL_SCHED_OPT, -1, -1);
    }
    return dl__gen_finish(&g, out);
}

int dl_sched_naive(int p, dl_sched **out)
{
    int st = dl_sched_gpipe(p, 1, out);
    if (st == DL_OK)
        (*out)->kind = DL_SCHED_NAIVE;
    return st;
}

/* The i-th backward of a stage: micro-batch i, or with c token chunks a sequence's chunks last
 * to first (the earlier chunks' key/value gradients come from the later ones). */
static int bwd_mb(int i, int c) { return i - i % c + (c - 1 - i % c); }

/* The 1F1B order of one stage; async adds an OPT after every backward instead of the flush;
 * split runs each backward as I then W. With c token chunks a sequence (Seq1F1B's order), c - 1
 * more warm-up forwards: the first backward is the first sequence's last chunk. */
static void one_f_one_b(dl__gen *g, int s, int p, int m, int c, int async, int split)
{
    int w = p - s - 1 + c - 1 < m ? p - s - 1 + c - 1 : m;
    for (int j = 0; j < w; j++) dl__gen_emit(g, s, DL_SCHED_F, j, 0);
    for (int i = 0; i < m; i++) {
        if (w + i < m)
            dl__gen_emit(g, s, DL_SCHED_F, w + i, 0);
        int j = bwd_mb(i, c);
        dl__gen_emit(g, s, split ? DL_SCHED_I : DL_SCHED_B, j, 0);
        if (split)
            dl__gen_emit(g, s, DL_SCHED_W, j, 0);
        if (async)
            dl__gen_emit(g, s, DL_SCHED_OPT, j, -1);
    }
    if (!async)
        dl__gen_emit(g, s, DL_SCHED_OPT, -1, -1);
}

int dl_sched_1f1b(int p, int m, dl_sched **out)
{
    dl__gen g;
    int st = dl__gen_start(&g, DL_SCHED_1F1B, p, m, 1, out);
    if (st != DL_OK)
        return st;
    for (int s = 0; s < p; s++) one_f_one_b(&g, s, p, m, 1, 0, 0);
    return dl__gen_finish(&g, out);
}

/* A schedule of nseq sequences x c token chunks (micro-batch j: chunk j % c of sequence j / c). */
static int tokens_start(dl__gen *g, dl_sched_kind kind, int p, int nseq, int c, dl_sched **out)
{
    if (out == NULL)
        return dl_error(DL_EINVAL, "%s schedule: null output", dl_sched_kind_name(kind));
    *out = NULL;
    if (nseq < 1 || c < 1)
        return dl_error(DL_EINVAL,
                        "%s schedule with token chunks: need sequences >= 1 and token chunks >= 1 "
                        "(got %d and %d)",
                        dl_sched_kind_name(kind), nseq, c);
    int st = dl__gen_start(g, kind, p, nseq * c, 1, out);
    if (st == DL_OK)
        g->s->seq_chunks = c;
    return st;
}

int dl_sched_1f1b_tokens(int p, int nseq, int c, dl_sched **out)
{
    dl__gen g;
    int st = tokens_start(&g, DL_SCHED_1F1B, p, nseq, c, out);
    if (st != DL_OK)
        return st;
    for (int s = 0; s < p; s++) one_f_one_b(&g, s, p, nseq * c, c, 0, 0);
    return dl__gen_finish(&g, out);
}

int dl_sched_1f1b_split(int p, int m, dl_sched **out)
{
    dl__gen g;
    int st = dl__gen_start(&g, DL_SCHED_1F1B_SPLIT, p, m, 1, out);
    if (st != DL_OK)
        return st;
    for (int s = 0; s < p; s++) {
        one_f_one_b(&g, s, p, m, 1, 0, 1);
        g.s->mem_limit[s] = p - s < m ? p - s : m;
    }
    return dl__gen_finish(&g, out);
}

int dl_sched_async(int p, int m, int stash, dl_sched **out)
{
    dl__gen g;
    int st = dl__gen_start(&g, DL_SCHED_ASYNC, p, m, 1, out);
    if (st != DL_OK)
        return st;
    g.s->flush = 0;
    g.s->stash = stash ? 1 : 0;
    for (int s = 0; s < p; s++) one_f_one_b(&g, s, p, m, 1, 1, 0);
    return dl__gen_finish(&g, out);
}

int dl_sched_interleaved(int p, int m, int v, dl_sched **out)
{
    if (out == NULL)
        return dl_error(DL_EINVAL, "interleaved schedule: null output");
    *out = NULL;
    if (p < 1 || m < 1 || v < 1)
        return dl_error(DL_EINVAL,
                        "interleaved schedule: need p >= 1, m >= 1, v >= 1 (p = %d, m = %d, v = "
                        "%d)",
                        p, m, v);
    if (m % p != 0)
        return dl_error(DL_EINVAL,
                        "interleaved schedule: micro-batches (m = %d) must be a multiple of the "
                        "stages "
                        "(p = %d), as Megatron-LM requires: forwards go in groups of p per chunk",
                        m, p);
    if (v == 1) {
        int st = dl_sched_1f1b(p, m, out);
        if (st == DL_OK)
            (*out)->kind = DL_SCHED_INTERLEAVED;
        return st;
    }
    dl__gen g;
    int st = dl__gen_start(&g, DL_SCHED_INTERLEAVED, p, m, v, out);
    if (st != DL_OK)
        return st;
    int total = m * v;
    for (int s = 0; s < p; s++) {
        /* Megatron's warm-up: the chunks of the first group must all be in flight before the
         * last virtual stage returns a backward; 2 (p-s-1) covers the round trip to the end. */
        int w = m == p ? total : 2 * (p - s - 1) + (v - 1) * p;
        if (w > total)
            w = total;
            /* k-th forward / backward of this stage: micro-batch and chunk. */
#define MB(k) (((k) / (p * v)) * p + (k) % p)
#define CF(k) (((k) / p) % v)
#define CB(k) (v - 1 - ((k) / p) % v)
        for (int k = 0; k < w; k++) dl__gen_emit(&g, s, DL_SCHED_F, MB(k), CF(k));
        for (int i = 0; i < total - w; i++) {
            dl__gen_emit(&g, s, DL_SCHED_F, MB(w + i), CF(w + i));
            dl__gen_emit(&g, s, DL_SCHED_B, MB(i), CB(i));
        }
        for (int k = total - w; k < total; k++) dl__gen_emit(&g, s, DL_SCHED_B, MB(k), CB(k));
#undef MB
#undef CF
#undef CB
        dl__gen_emit(&g, s, DL_SCHED_OPT, -1, -1);
    }
    return dl__gen_finish(&g, out);
}

int dl_sched_terapipe(int p, int nseq, int c, dl_sched **out)
{
    dl__gen g;
    int st = tokens_start(&g, DL_SCHED_TERAPIPE, p, nseq, c, out);
    if (st != DL_OK)
        return st;
    for (int s = 0; s < p; s++) {
        for (int j = 0; j < nseq * c; j++) dl__gen_emit(&g, s, DL_SCHED_F, j, 0);
        /* Backward of a token chunk needs the later chunks' backward (their queries read its
         * keys and values), so each sequence goes back to front. */
        for (int q = 0; q < nseq; q++)
            for (int k = c - 1; k >= 0; k--) dl__gen_emit(&g, s, DL_SCHED_B, q * c + k, 0);
        dl__gen_emit(&g, s, DL_SCHED_OPT, -1, -1);
    }
    return dl__gen_finish(&g, out);
}

/* ---------------------------------------------------------------------------------------- */
/* Weight versions                                                                           */

void dl_sched_versions_free(dl_sched_versions *v)
{
    if (v == NULL)
        return;
    free(v->fwd);
    free(v->bwd);
    free(v->gap);
    free(v->max_gap);
    free(v->peak_versions);
    free(v);
}

int dl_sched_versions_get(const dl_sched *s, dl_sched_versions **out)
{
    if (out == NULL)
        return dl_error(DL_EINVAL, "versions: null output");
    *out = NULL;
    int st = dl_sched_validate(s);
    if (st != DL_OK)
        return st;
    size_t n = (size_t)s->p * s->m * s->v;
    dl_sched_versions *v = calloc(1, sizeof *v);
    int *live = calloc((size_t)s->m * s->v, sizeof *live); /* 1: forward done, backward not */
    if (v) {
        v->p = s->p;
        v->m = s->m;
        v->v = s->v;
        v->fwd = calloc(n, sizeof *v->fwd);
        v->bwd = calloc(n, sizeof *v->bwd);
        v->gap = calloc(n, sizeof *v->gap);
        v->max_gap = calloc((size_t)s->p, sizeof *v->max_gap);
        v->peak_versions = calloc((size_t)s->p, sizeof *v->peak_versions);
    }
    if (!v || !live || !v->fwd || !v->bwd || !v->gap || !v->max_gap || !v->peak_versions) {
        dl_sched_versions_free(v);
        free(live);
        return dl_error(DL_ENOMEM, "versions: out of memory");
    }
    for (int q = 0; q < s->p; q++) {
        int ver = 0;
        memset(live, 0, (size_t)s->m * s->v * sizeof *live);
        v->peak_versions[q] = 1;
        for (int i = 0; i < s->len[q]; i++) {
            const dl_sched_action *x = &s->act[q][i];
            size_t k = ((size_t)q * s->m + (x->op == DL_SCHED_OPT ? 0 : x->mb)) * s->v +
                       (x->op == DL_SCHED_OPT ? 0 : x->chunk);
            if (x->op == DL_SCHED_F) {
                v->fwd[k] = ver;
                live[(size_t)x->mb * s->v + x->chunk] = 1;
            } else if (x->op == DL_SCHED_B || x->op == DL_SCHED_I) { /* the weights' user */
                v->gap[k] = ver - v->fwd[k];
                v->bwd[k] = s->stash ? v->fwd[k] : ver;
                if (v->gap[k] > v->max_gap[q])
                    v->max_gap[q] = v->gap[k];
                live[(size_t)x->mb * s->v + x->chunk] = 0;
            } else if (x->op == DL_SCHED_OPT) {
                ver++;
            }
            if (s->stash) {
                /* Versions kept: the current one plus every older one a live forward used.
                 * A stage's live forwards are few; a quadratic scan keeps this obvious. */
                int distinct = 1;
                for (int a = 0; a < s->m * s->v; a++) {
                    if (!live[a])
                        continue;
                    int fv = v->fwd[(size_t)q * s->m * s->v + a], dup = fv == ver;
                    for (int b2 = 0; b2 < a && !dup; b2++)
                        if (live[b2] && v->fwd[(size_t)q * s->m * s->v + b2] == fv)
                            dup = 1;
                    if (!dup)
                        distinct++;
                }
                if (distinct > v->peak_versions[q])
                    v->peak_versions[q] = distinct;
            }
        }
    }
    free(live);
    *out = v;
    return DL_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Partitioning                                                                              */

int dl_sched_partition(const double *costs, int n, int k, int balanced, int *first,
                       double *stage_cost, double *max_cost)
{
    double mx;
    int st = balanced ? dl_plan_partition(costs, n, k, first, &mx)
                      : dl_plan_partition_even(costs, n, k, first, &mx);
    if (st != DL_OK)
        return st;
    if (stage_cost)
        for (int j = 0; j < k; j++) {
            stage_cost[j] = 0;
            for (int i = first[j]; i < first[j + 1]; i++) stage_cost[j] += costs[i];
        }
    if (max_cost)
        *max_cost = mx;
    return DL_OK;
}
