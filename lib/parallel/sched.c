/* Pipeline schedules as data: generators, validator, unit-cost simulator, the lecture's grids,
 * weight versions and layer partitioning (lecture 17 §4, §6.2). The bubble formula and the
 * partition dynamic program are the planner's (lib/plan/plan.c); this file only calls them. */
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
    if (!s->len || !s->cap_ || !s->act) {
        dl_sched_free(s);
        return dl_error(DL_ENOMEM, "schedule: out of memory");
    }
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
    free(s);
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

static const char *const kind_names[] = {"custom",      "naive", "gpipe",   "1f1b",
                                         "interleaved", "async", "terapipe"};

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
    for (int k = DL_SCHED_NAIVE; k <= DL_SCHED_TERAPIPE; k++)
        if (strcasecmp(name, kind_names[k]) == 0) {
            *kind = (dl_sched_kind)k;
            return DL_OK;
        }
    if (strcasecmp(name, "pipedream") == 0) {
        *kind = DL_SCHED_ASYNC;
        return DL_OK;
    }
    return dl_error(DL_EINVAL,
                    "unknown schedule '%s' (naive, gpipe, 1f1b, interleaved, async, terapipe)",
                    name);
}

const char *dl_sched_action_str(const dl_sched *s, const dl_sched_action *a, char *buf, size_t cap)
{
    if (a->op == DL_SCHED_OPT)
        snprintf(buf, cap, "OPT");
    else if (a->op != DL_SCHED_F && a->op != DL_SCHED_B)
        snprintf(buf, cap, "op %d", a->op);
    else if (s != NULL && s->v > 1)
        snprintf(buf, cap, "%c%d.%d", a->op == DL_SCHED_F ? 'F' : 'B', a->mb, a->chunk);
    else
        snprintf(buf, cap, "%c%d", a->op == DL_SCHED_F ? 'F' : 'B', a->mb);
    return buf;
}

/* ---------------------------------------------------------------------------------------- */
/* Generators                                                                                */

/* Each generator emits stage by stage through push; the first failure is kept and returned. */
typedef struct gen {
    dl_sched *s;
    int st;
} gen;

static void emit(gen *g, int stage, int op, int mb, int chunk)
{
    if (g->st == DL_OK)
        g->st = dl_sched_push(g->s, stage, op, mb, chunk);
}

static int finish(gen *g, dl_sched **out)
{
    if (g->st != DL_OK) {
        dl_sched_free(g->s);
        return g->st;
    }
    *out = g->s;
    return DL_OK;
}

static int start(gen *g, dl_sched_kind kind, int p, int m, int v, dl_sched **out)
{
    if (out == NULL)
        return dl_error(DL_EINVAL, "%s schedule: null output", kind_names[kind]);
    *out = NULL;
    g->st = dl_sched_new(p, m, v, &g->s);
    if (g->st != DL_OK)
        return g->st;
    g->s->kind = kind;
    return DL_OK;
}

int dl_sched_gpipe(int p, int m, dl_sched **out)
{
    gen g;
    int st = start(&g, DL_SCHED_GPIPE, p, m, 1, out);
    if (st != DL_OK)
        return st;
    for (int s = 0; s < p; s++) {
        for (int j = 0; j < m; j++) emit(&g, s, DL_SCHED_F, j, 0);
        for (int j = 0; j < m; j++) emit(&g, s, DL_SCHED_B, j, 0);
        emit(&g, s, DL_SCHED_OPT, -1, -1);
    }
    return finish(&g, out);
}

int dl_sched_naive(int p, dl_sched **out)
{
    int st = dl_sched_gpipe(p, 1, out);
    if (st == DL_OK)
        (*out)->kind = DL_SCHED_NAIVE;
    return st;
}

/* The 1F1B order of one stage; async adds an OPT after every backward instead of the flush. */
static void one_f_one_b(gen *g, int s, int p, int m, int async)
{
    int w = p - s - 1 < m ? p - s - 1 : m;
    for (int j = 0; j < w; j++) emit(g, s, DL_SCHED_F, j, 0);
    for (int i = 0; i < m; i++) {
        if (w + i < m)
            emit(g, s, DL_SCHED_F, w + i, 0);
        emit(g, s, DL_SCHED_B, i, 0);
        if (async)
            emit(g, s, DL_SCHED_OPT, i, -1);
    }
    if (!async)
        emit(g, s, DL_SCHED_OPT, -1, -1);
}

int dl_sched_1f1b(int p, int m, dl_sched **out)
{
    gen g;
    int st = start(&g, DL_SCHED_1F1B, p, m, 1, out);
    if (st != DL_OK)
        return st;
    for (int s = 0; s < p; s++) one_f_one_b(&g, s, p, m, 0);
    return finish(&g, out);
}

int dl_sched_async(int p, int m, int stash, dl_sched **out)
{
    gen g;
    int st = start(&g, DL_SCHED_ASYNC, p, m, 1, out);
    if (st != DL_OK)
        return st;
    g.s->flush = 0;
    g.s->stash = stash ? 1 : 0;
    for (int s = 0; s < p; s++) one_f_one_b(&g, s, p, m, 1);
    return finish(&g, out);
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
    gen g;
    int st = start(&g, DL_SCHED_INTERLEAVED, p, m, v, out);
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
        for (int k = 0; k < w; k++) emit(&g, s, DL_SCHED_F, MB(k), CF(k));
        for (int i = 0; i < total - w; i++) {
            emit(&g, s, DL_SCHED_F, MB(w + i), CF(w + i));
            emit(&g, s, DL_SCHED_B, MB(i), CB(i));
        }
        for (int k = total - w; k < total; k++) emit(&g, s, DL_SCHED_B, MB(k), CB(k));
#undef MB
#undef CF
#undef CB
        emit(&g, s, DL_SCHED_OPT, -1, -1);
    }
    return finish(&g, out);
}

int dl_sched_terapipe(int p, int nseq, int c, dl_sched **out)
{
    if (out == NULL)
        return dl_error(DL_EINVAL, "terapipe schedule: null output");
    *out = NULL;
    if (nseq < 1 || c < 1)
        return dl_error(DL_EINVAL,
                        "terapipe schedule: need sequences >= 1 and token chunks >= 1 "
                        "(got %d and %d)",
                        nseq, c);
    gen g;
    int st = start(&g, DL_SCHED_TERAPIPE, p, nseq * c, 1, out);
    if (st != DL_OK)
        return st;
    g.s->seq_chunks = c;
    for (int s = 0; s < p; s++) {
        for (int j = 0; j < nseq * c; j++) emit(&g, s, DL_SCHED_F, j, 0);
        /* Backward of a token chunk needs the later chunks' backward (their queries read its
         * keys and values), so each sequence goes back to front. */
        for (int q = 0; q < nseq; q++)
            for (int k = c - 1; k >= 0; k--) emit(&g, s, DL_SCHED_B, q * c + k, 0);
        emit(&g, s, DL_SCHED_OPT, -1, -1);
    }
    return finish(&g, out);
}

/* ---------------------------------------------------------------------------------------- */
/* Validation and the execution model                                                        */

/* Positions of every (op, j, c) on every stage, so dependencies are found in O(1). */
typedef struct index {
    int p, m, v;
    int *pos; /* [((s * 2 + op) * m + j) * v + c]: action index on stage s, or -1 */
} index_t;

#define POS(ix, s, op, j, c) ((ix)->pos[((((size_t)(s)*2 + (op)) * (ix)->m + (j)) * (ix)->v + (c))])

static const char *astr(const dl_sched *s, int stage, int i, char *buf, size_t cap)
{
    return dl_sched_action_str(s, &s->act[stage][i], buf, cap);
}

/* Structure checks and the index; the caller frees ix->pos on success. */
static int check_structure(const dl_sched *s, index_t *ix)
{
    char a[32];
    ix->pos = NULL;
    if (s == NULL)
        return dl_error(DL_EINVAL, "schedule: null schedule");
    if (s->p < 1 || s->m < 1 || s->v < 1 || s->seq_chunks < 1 || s->len == NULL || s->act == NULL)
        return dl_error(DL_EINVAL,
                        "schedule: bad sizes (p = %d, m = %d, v = %d, token chunks = %d)", s->p,
                        s->m, s->v, s->seq_chunks);
    if (s->seq_chunks > 1 && s->m % s->seq_chunks != 0)
        return dl_error(DL_EINVAL,
                        "schedule: %d micro-batches are not whole sequences of %d token chunks",
                        s->m, s->seq_chunks);
    ix->p = s->p;
    ix->m = s->m;
    ix->v = s->v;
    size_t n = (size_t)s->p * 2 * s->m * s->v;
    ix->pos = malloc(n * sizeof *ix->pos);
    if (ix->pos == NULL)
        return dl_error(DL_ENOMEM, "schedule: out of memory");
    for (size_t i = 0; i < n; i++) ix->pos[i] = -1;
    int st = DL_OK;
    for (int q = 0; q < s->p && st == DL_OK; q++) {
        int nopt = 0;
        for (int i = 0; i < s->len[q] && st == DL_OK; i++) {
            const dl_sched_action *x = &s->act[q][i];
            if (x->op == DL_SCHED_OPT) {
                nopt++;
                if (s->flush && (nopt > 1 || i != s->len[q] - 1))
                    st = dl_error(DL_EINVAL,
                                  "schedule: stage %d action %d (OPT): a schedule with a flush "
                                  "has one optimizer step per stage, after all its backwards",
                                  q, i);
                continue;
            }
            if (x->op != DL_SCHED_F && x->op != DL_SCHED_B)
                st =
                    dl_error(DL_EINVAL, "schedule: stage %d action %d: unknown op %d", q, i, x->op);
            else if (x->mb < 0 || x->mb >= s->m)
                st =
                    dl_error(DL_EINVAL,
                             "schedule: stage %d action %d (%s): micro-batch %d out of range 0..%d",
                             q, i, astr(s, q, i, a, sizeof a), x->mb, s->m - 1);
            else if (x->chunk < 0 || x->chunk >= s->v)
                st = dl_error(DL_EINVAL,
                              "schedule: stage %d action %d (%s): chunk %d out of range 0..%d", q,
                              i, astr(s, q, i, a, sizeof a), x->chunk, s->v - 1);
            else if (POS(ix, q, x->op, x->mb, x->chunk) >= 0)
                st = dl_error(DL_EINVAL, "schedule: stage %d action %d (%s): repeats action %d", q,
                              i, astr(s, q, i, a, sizeof a), POS(ix, q, x->op, x->mb, x->chunk));
            else
                POS(ix, q, x->op, x->mb, x->chunk) = i;
        }
        if (st == DL_OK && s->flush && nopt == 0)
            st = dl_error(DL_EINVAL,
                          "schedule: stage %d has no optimizer step (a schedule with a flush "
                          "ends every stage with one)",
                          q);
        for (int j = 0; j < s->m && st == DL_OK; j++)
            for (int c = 0; c < s->v && st == DL_OK; c++)
                for (int op = DL_SCHED_F; op <= DL_SCHED_B && st == DL_OK; op++)
                    if (POS(ix, q, op, j, c) < 0) {
                        dl_sched_action y = {op, j, c};
                        st = dl_error(DL_EINVAL, "schedule: stage %d never runs %s", q,
                                      dl_sched_action_str(s, &y, a, sizeof a));
                    }
    }
    /* Same-stage order, reported at the later of the two actions' positions being the
     * offending one: the backward (or token chunk) that runs too early. */
    for (int q = 0; q < s->p && st == DL_OK; q++) {
        for (int i = 0; i < s->len[q] && st == DL_OK; i++) {
            const dl_sched_action *x = &s->act[q][i];
            if (x->op == DL_SCHED_OPT)
                continue;
            int j = x->mb, c = x->chunk, k = s->seq_chunks;
            char b2[32];
            if (x->op == DL_SCHED_B && POS(ix, q, DL_SCHED_F, j, c) > i) {
                dl_sched_action y = {DL_SCHED_F, j, c};
                st = dl_error(DL_EINVAL,
                              "schedule: stage %d action %d (%s): backward before its forward "
                              "(%s is action %d on stage %d)",
                              q, i, astr(s, q, i, a, sizeof a),
                              dl_sched_action_str(s, &y, b2, sizeof b2),
                              POS(ix, q, DL_SCHED_F, j, c), q);
            } else if (k > 1 && x->op == DL_SCHED_F && j % k != 0 &&
                       POS(ix, q, DL_SCHED_F, j - 1, c) > i) {
                st = dl_error(DL_EINVAL,
                              "schedule: stage %d action %d (%s): token chunk %d of sequence %d "
                              "runs forward before chunk %d",
                              q, i, astr(s, q, i, a, sizeof a), j % k, j / k, j % k - 1);
            } else if (k > 1 && x->op == DL_SCHED_B && j % k != k - 1 &&
                       POS(ix, q, DL_SCHED_B, j + 1, c) > i) {
                st = dl_error(DL_EINVAL,
                              "schedule: stage %d action %d (%s): token chunk %d of sequence %d "
                              "runs backward before chunk %d",
                              q, i, astr(s, q, i, a, sizeof a), j % k, j / k, j % k + 1);
            }
        }
    }
    if (st != DL_OK) {
        free(ix->pos);
        ix->pos = NULL;
    }
    return st;
}

/* The cross-stage input of action i on stage q: *ds, *di (stage and index), or 0 if none. */
static int dependency(const dl_sched *s, const index_t *ix, int q, int i, int *ds, int *di)
{
    const dl_sched_action *x = &s->act[q][i];
    int p = s->p, j = x->mb, c = x->chunk;
    if (x->op == DL_SCHED_F) {
        if (q > 0) {
            *ds = q - 1;
            *di = POS(ix, q - 1, DL_SCHED_F, j, c);
            return 1;
        }
        if (c > 0) {
            *ds = p - 1;
            *di = POS(ix, p - 1, DL_SCHED_F, j, c - 1);
            return 1;
        }
    } else if (x->op == DL_SCHED_B) {
        if (q < p - 1) {
            *ds = q + 1;
            *di = POS(ix, q + 1, DL_SCHED_B, j, c);
            return 1;
        }
        if (c < s->v - 1) {
            *ds = 0;
            *di = POS(ix, 0, DL_SCHED_B, j, c + 1);
            return 1;
        }
    }
    return 0;
}

/* Append printf text to a fixed buffer, truncating quietly. */
static void app(char *buf, size_t cap, const char *fmt, ...)
{
    size_t n = strlen(buf);
    if (n + 1 >= cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + n, cap - n, fmt, ap);
    va_end(ap);
}

/* Run the execution model. end[q][i] < 0 marks not yet run. With start/end NULL only order
 * matters (the validator). Returns DL_EINVAL naming the cycle if the stages block each other. */
static int execute(const dl_sched *s, const index_t *ix, const dl_sched_costs *cost, double **start,
                   double **end)
{
    int p = s->p, st = DL_OK;
    int *next = calloc((size_t)p, sizeof *next);
    double *freeat = calloc((size_t)p, sizeof *freeat);
    double **done = end;
    double **own = NULL;
    if (done == NULL) { /* the validator needs completion marks even without times */
        own = calloc((size_t)p, sizeof *own);
        if (own)
            for (int q = 0; q < p; q++) {
                own[q] = malloc((size_t)(s->len[q] ? s->len[q] : 1) * sizeof **own);
                if (own[q] == NULL) {
                    st = DL_ENOMEM;
                    break;
                }
            }
        done = own;
    }
    if (!next || !freeat || !done || st != DL_OK) {
        st = dl_error(DL_ENOMEM, "schedule: out of memory");
        goto out;
    }
    for (int q = 0; q < p; q++)
        for (int i = 0; i < s->len[q]; i++) done[q][i] = -1;
    /* Each sweep advances every stage as far as its inputs allow; a sweep without progress with
     * work left is a deadlock. At most (total actions) sweeps. */
    for (int progress = 1; progress;) {
        progress = 0;
        for (int q = 0; q < p; q++) {
            while (next[q] < s->len[q]) {
                int i = next[q], ds, di;
                double t = freeat[q];
                if (dependency(s, ix, q, i, &ds, &di)) {
                    if (done[ds][di] < 0)
                        break;
                    if (done[ds][di] > t)
                        t = done[ds][di];
                }
                const dl_sched_action *x = &s->act[q][i];
                double d = x->op == DL_SCHED_F   ? cost->f
                           : x->op == DL_SCHED_B ? cost->b
                                                 : cost->opt;
                if (start)
                    start[q][i] = t;
                done[q][i] = t + d;
                freeat[q] = t + d;
                next[q]++;
                progress = 1;
            }
        }
    }
    for (int q = 0; q < p; q++) {
        if (next[q] >= s->len[q])
            continue;
        /* Follow "waits for" from the first blocked stage until a stage repeats: that is the
         * cycle (a dependency always exists and is not done, or the stage would have moved). */
        char msg[1024] = "", a[32], b[32];
        int *seen = calloc((size_t)p, sizeof *seen);
        int cur = q;
        for (int hops = 0; hops <= p; hops++) {
            int i = next[cur], ds = -1, di = -1;
            if (seen && seen[cur])
                break;
            if (seen)
                seen[cur] = 1;
            dependency(s, ix, cur, i, &ds, &di);
            if (ds < 0)
                break;
            app(msg, sizeof msg,
                "%sstage %d action %d (%s) waits for %s on stage %d (its action %d)",
                hops ? "; " : "", cur, i, astr(s, cur, i, a, sizeof a),
                astr(s, ds, di, b, sizeof b), ds, di);
            cur = ds;
        }
        free(seen);
        st = dl_error(DL_EINVAL, "schedule: deadlock: %s", msg);
        break;
    }
out:
    if (own) {
        for (int q = 0; q < p; q++) free(own[q]);
        free(own);
    }
    free(next);
    free(freeat);
    return st;
}

void dl_sched_costs_init(dl_sched_costs *c)
{
    c->f = 1.0;
    c->b = 2.0;
    c->opt = 0.0;
}

int dl_sched_validate(const dl_sched *s)
{
    index_t ix;
    int st = check_structure(s, &ix);
    if (st != DL_OK)
        return st;
    dl_sched_costs c;
    dl_sched_costs_init(&c);
    st = execute(s, &ix, &c, NULL, NULL);
    free(ix.pos);
    return st;
}

/* ---------------------------------------------------------------------------------------- */
/* Simulation                                                                                */

void dl_sched_sim_free(dl_sched_sim *sim)
{
    if (sim == NULL)
        return;
    if (sim->start)
        for (int q = 0; q < sim->p; q++) free(sim->start[q]);
    if (sim->end)
        for (int q = 0; q < sim->p; q++) free(sim->end[q]);
    free(sim->start);
    free(sim->end);
    free(sim->busy);
    free(sim->bubble);
    free(sim->peak_act);
    free(sim);
}

int dl_sched_simulate(const dl_sched *s, const dl_sched_costs *costs, dl_sched_sim **out)
{
    if (out == NULL)
        return dl_error(DL_EINVAL, "simulate: null output");
    *out = NULL;
    dl_sched_costs c;
    if (costs)
        c = *costs;
    else
        dl_sched_costs_init(&c);
    if (!(c.f >= 0) || !(c.b >= 0) || !(c.opt >= 0) || !isfinite(c.f + c.b + c.opt))
        return dl_error(DL_EINVAL,
                        "simulate: costs must be non-negative (forward %g, backward %g, optimizer "
                        "%g)",
                        c.f, c.b, c.opt);
    index_t ix;
    int st = check_structure(s, &ix);
    if (st != DL_OK)
        return st;
    int p = s->p;
    dl_sched_sim *sim = calloc(1, sizeof *sim);
    if (sim) {
        sim->p = p;
        sim->start = calloc((size_t)p, sizeof *sim->start);
        sim->end = calloc((size_t)p, sizeof *sim->end);
        sim->busy = calloc((size_t)p, sizeof *sim->busy);
        sim->bubble = calloc((size_t)p, sizeof *sim->bubble);
        sim->peak_act = calloc((size_t)p, sizeof *sim->peak_act);
    }
    if (!sim || !sim->start || !sim->end || !sim->busy || !sim->bubble || !sim->peak_act) {
        st = dl_error(DL_ENOMEM, "simulate: out of memory");
        goto fail;
    }
    for (int q = 0; q < p; q++) {
        size_t n = (size_t)(s->len[q] ? s->len[q] : 1);
        sim->start[q] = malloc(n * sizeof **sim->start);
        sim->end[q] = malloc(n * sizeof **sim->end);
        if (!sim->start[q] || !sim->end[q]) {
            st = dl_error(DL_ENOMEM, "simulate: out of memory");
            goto fail;
        }
    }
    if ((st = execute(s, &ix, &c, sim->start, sim->end)) != DL_OK)
        goto fail;
    double busy = 0;
    for (int q = 0; q < p; q++) {
        int held = 0;
        for (int i = 0; i < s->len[q]; i++) {
            const dl_sched_action *x = &s->act[q][i];
            if (sim->end[q][i] > sim->makespan)
                sim->makespan = sim->end[q][i];
            sim->busy[q] += sim->end[q][i] - sim->start[q][i];
            /* Activations live from a forward to its backward; order alone decides the peak. */
            if (x->op == DL_SCHED_F && ++held > sim->peak_act[q])
                sim->peak_act[q] = held;
            if (x->op == DL_SCHED_B)
                held--;
        }
        busy += sim->busy[q];
    }
    for (int q = 0; q < p; q++)
        sim->bubble[q] = sim->makespan > 0 ? 1.0 - sim->busy[q] / sim->makespan : 0.0;
    sim->bubble_total = sim->makespan > 0 ? 1.0 - busy / (p * sim->makespan) : 0.0;
    free(ix.pos);
    *out = sim;
    return DL_OK;
fail:
    free(ix.pos);
    dl_sched_sim_free(sim);
    return st;
}

double dl_sched_bubble_formula(const dl_sched *s)
{
    if (s == NULL)
        return -1.0;
    return dl_plan_bubble(s->p, s->m, s->v);
}

/* ---------------------------------------------------------------------------------------- */
/* Printing                                                                                  */

/* The grid's mark of an action (a schedule draws no collectives). */
static char mark(const dl_sched_action *x)
{
    dl__grid_kind k = x->op == DL_SCHED_F   ? DL__GRID_FWD
                      : x->op == DL_SCHED_B ? DL__GRID_BWD
                                            : DL__GRID_OPT;
    return dl__grid_mark(k, x->mb);
}

static int whole(double t) { return fabs(t - floor(t + 0.5)) < 1e-9; }

int dl_sched_grid(const dl_sched *s, const dl_sched_sim *sim, char **out)
{
    if (s == NULL || sim == NULL || out == NULL || sim->p != s->p)
        return dl_error(DL_EINVAL, "grid: null or mismatched schedule and simulation");
    *out = NULL;
    if (!whole(sim->makespan) || sim->makespan > 1e6)
        return dl_error(DL_EINVAL, "grid: the makespan %g is not a whole number of time units",
                        sim->makespan);
    int T = (int)floor(sim->makespan + 0.5), p = s->p, wd = dl__grid_label_width(p);
    char *row = malloc((size_t)T + 1);
    if (row == NULL)
        return dl_error(DL_ENOMEM, "grid: out of memory");
    dl__strbuf sb = {0};
    for (int q = 0; q < p; q++) {
        memset(row, 0, (size_t)T + 1); /* 0 = idle */
        for (int i = 0; i < s->len[q]; i++) {
            double a = sim->start[q][i], b = sim->end[q][i];
            if (!whole(a) || !whole(b)) {
                char t[32];
                free(row);
                dl__sb_free(&sb);
                return dl_error(DL_EINVAL,
                                "grid: stage %d action %d (%s) runs from %g to %g, not on whole "
                                "time units (use integer costs)",
                                q, i, astr(s, q, i, t, sizeof t), a, b);
            }
            for (int t = (int)floor(a + 0.5); t < (int)floor(b + 0.5); t++)
                row[t] = mark(&s->act[q][i]);
        }
        dl__grid_row(&sb, q, wd, row, (size_t)T);
    }
    free(row);
    return dl__sb_finish(&sb, out, "grid");
}

/* The lecture writes percentages with one decimal but "75%" for 75.0%. */
static void percent(dl__strbuf *sb, double frac)
{
    char t[32];
    snprintf(t, sizeof t, "%.1f", 100.0 * frac);
    size_t n = strlen(t);
    if (n > 2 && strcmp(t + n - 2, ".0") == 0)
        t[n - 2] = '\0';
    dl__sb_str(sb, t);
    dl__sb_str(sb, "%");
}

int dl_sched_caption(const dl_sched *s, const dl_sched_sim *sim, int with_act, char **out)
{
    if (s == NULL || sim == NULL || out == NULL || sim->p != s->p)
        return dl_error(DL_EINVAL, "caption: null or mismatched schedule and simulation");
    *out = NULL;
    static const char *const names[] = {"custom",           "naive",      "GPipe",   "1F1B",
                                        "interleaved 1F1B", "async 1F1B", "TeraPipe"};
    dl__strbuf sb = {0};
    dl__sb_str(&sb, (int)s->kind >= 0 && s->kind <= DL_SCHED_TERAPIPE ? names[s->kind] : "?");
    dl__sb_printf(&sb, " (%d micro-batch%s", s->m, s->m == 1 ? "" : "es");
    if (s->v > 1)
        dl__sb_printf(&sb, ", %d chunks per stage", s->v);
    dl__sb_str(&sb, "): bubble ");
    percent(&sb, sim->bubble_total);
    if (with_act) {
        dl__sb_str(&sb, ", activations held per stage ");
        for (int q = 0; q < s->p; q++) dl__sb_printf(&sb, "%s%d", q ? " / " : "", sim->peak_act[q]);
    }
    return dl__sb_finish(&sb, out, "caption");
}

int dl_sched_render(const dl_sched *s, const dl_sched_sim *sim, int with_act, char **out)
{
    char *cap = NULL, *grid = NULL;
    int st = dl_sched_caption(s, sim, with_act, &cap);
    if (st == DL_OK)
        st = dl_sched_grid(s, sim, &grid);
    if (st == DL_OK) {
        dl__strbuf sb = {0};
        dl__sb_str(&sb, cap);
        dl__sb_str(&sb, "\n");
        dl__sb_str(&sb, grid);
        st = dl__sb_finish(&sb, out, "render");
    }
    free(cap);
    free(grid);
    return st;
}

/* East Asian wide ranges (Unicode EastAsianWidth W/F, the blocks this text uses). */
static int cp_width(unsigned cp)
{
    if ((cp >= 0x1100 && cp <= 0x115F) || (cp >= 0x2E80 && cp <= 0x303E) ||
        (cp >= 0x3041 && cp <= 0x33FF) || (cp >= 0x3400 && cp <= 0x4DBF) ||
        (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0xA000 && cp <= 0xA4CF) ||
        (cp >= 0xAC00 && cp <= 0xD7A3) || (cp >= 0xF900 && cp <= 0xFAFF) ||
        (cp >= 0xFE30 && cp <= 0xFE4F) || (cp >= 0xFF00 && cp <= 0xFF60) ||
        (cp >= 0xFFE0 && cp <= 0xFFE6) || (cp >= 0x20000 && cp <= 0x3FFFD))
        return 2;
    return 1;
}

/* Width of the first len bytes. */
static int width_n(const char *u, size_t len)
{
    int w = 0;
    const unsigned char *c = (const unsigned char *)u, *e = c + len;
    while (c < e) {
        unsigned cp;
        int k;
        if (*c < 0x80) {
            cp = *c;
            k = 1;
        } else if ((*c & 0xE0) == 0xC0) {
            cp = *c & 0x1F;
            k = 2;
        } else if ((*c & 0xF0) == 0xE0) {
            cp = *c & 0x0F;
            k = 3;
        } else {
            cp = *c & 0x07;
            k = 4;
        }
        for (int i = 1; i < k && c + i < e; i++) cp = (cp << 6) | (c[i] & 0x3F);
        c += k;
        w += cp_width(cp);
    }
    return w;
}

int dl_sched_display_width(const char *utf8) { return utf8 ? width_n(utf8, strlen(utf8)) : 0; }

/* Line i of text (without its '\n'): *beg and *len; 0 past the last line. */
static int line_at(const char *text, int i, const char **beg, size_t *len)
{
    const char *c = text;
    for (; i > 0; i--) {
        c = strchr(c, '\n');
        if (c == NULL || *++c == '\0')
            return 0;
    }
    if (*c == '\0')
        return 0;
    const char *e = strchr(c, '\n');
    *beg = c;
    *len = e ? (size_t)(e - c) : strlen(c);
    return 1;
}

int dl_sched_side_by_side(const char *left, const char *right, int col, char **out)
{
    if (left == NULL || right == NULL || out == NULL)
        return dl_error(DL_EINVAL, "side by side: null argument");
    *out = NULL;
    const char *b;
    size_t n;
    if (col <= 0) {
        for (int i = 0; line_at(left, i, &b, &n); i++)
            if (width_n(b, n) + 2 > col)
                col = width_n(b, n) + 2;
    }
    dl__strbuf sb = {0};
    for (int i = 0;; i++) {
        const char *lb = "", *rb = "";
        size_t ln = 0, rn = 0;
        int hl = line_at(left, i, &lb, &ln), hr = line_at(right, i, &rb, &rn);
        if (!hl && !hr)
            break;
        dl__sb_add(&sb, lb, ln);
        if (hr) {
            for (int w = width_n(lb, ln); w < col; w++) dl__sb_add(&sb, " ", 1);
            dl__sb_add(&sb, rb, rn);
        }
        dl__sb_str(&sb, "\n");
    }
    return dl__sb_finish(&sb, out, "side by side");
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
            } else if (x->op == DL_SCHED_B) {
                v->gap[k] = ver - v->fwd[k];
                v->bwd[k] = s->stash ? v->fwd[k] : ver;
                if (v->gap[k] > v->max_gap[q])
                    v->max_gap[q] = v->gap[k];
                live[(size_t)x->mb * s->v + x->chunk] = 0;
            } else {
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
