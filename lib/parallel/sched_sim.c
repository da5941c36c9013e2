/* Pipeline schedules: the validator (structure and dependencies, by executing the schedule in
 * the unit-cost model) and the simulator (lecture 17 §4). */
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
/* Validation and the execution model                                                        */

/* Positions of every (op, j, c) on every stage, so dependencies are found in O(1). */
typedef struct index {
    int p, m, v;
    int *pos;   /* [((s * NOPS + op) * m + j) * v + c]: action index on stage s, or -1 */
    int bq, bi; /* the offending action of a refusal (stage, index), or -1 */
} index_t;

enum { NOPS = DL_SCHED_W + 1 }; /* indexed by op (OPT's row unused) */
#define POS(ix, s, op, j, c)                                                                       \
    ((ix)->pos[((((size_t)(s)*NOPS + (op)) * (ix)->m + (j)) * (ix)->v + (c))])
/* where (j, c)'s backward hands its input gradient on: its B, or its I when split */
#define BIN(ix, s, j, c)                                                                           \
    (POS(ix, s, DL_SCHED_B, j, c) >= 0 ? POS(ix, s, DL_SCHED_B, j, c)                              \
                                       : POS(ix, s, DL_SCHED_I, j, c))

static int is_work(int op)
{
    return op == DL_SCHED_F || op == DL_SCHED_B || op == DL_SCHED_I || op == DL_SCHED_W;
}

static const char *astr(const dl_sched *s, int stage, int i, char *buf, size_t cap)
{
    return dl_sched_action_str(s, &s->act[stage][i], buf, cap);
}

/* Keep the offending action for the context the validator appends; returns st. */
static int at(index_t *ix, int q, int i, int st)
{
    if (ix->bq < 0)
        ix->bq = q, ix->bi = i;
    return st;
}

/* "weight gradient before its input gradient", naming the W at action i of stage q */
static int w_before_i(const dl_sched *s, index_t *ix, int q, int i)
{
    at(ix, q, i, 0);
    char a[32], b[32];
    const dl_sched_action *x = &s->act[q][i];
    dl_sched_action y = {DL_SCHED_I, x->mb, x->chunk};
    int at = POS(ix, q, DL_SCHED_I, x->mb, x->chunk);
    dl_sched_action_str(s, &y, b, sizeof b);
    if (at < 0)
        return dl_error(DL_EINVAL,
                        "schedule: stage %d action %d (%s): weight gradient before its input "
                        "gradient (stage %d never runs %s)",
                        q, i, astr(s, q, i, a, sizeof a), q, b);
    return dl_error(DL_EINVAL,
                    "schedule: stage %d action %d (%s): weight gradient before its input gradient "
                    "(%s is action %d on stage %d)",
                    q, i, astr(s, q, i, a, sizeof a), b, at, q);
}

/* (j, c) on stage q runs its F and either B or both I and W (each once: the index holds one). */
static int check_backward(const dl_sched *s, index_t *ix, int q, int j, int c)
{
    char a[32], b[32];
    int f = POS(ix, q, DL_SCHED_F, j, c), bw = POS(ix, q, DL_SCHED_B, j, c);
    int in = POS(ix, q, DL_SCHED_I, j, c), w = POS(ix, q, DL_SCHED_W, j, c);
    dl_sched_action y = {DL_SCHED_F, j, c};
    if (f < 0)
        return dl_error(DL_EINVAL, "schedule: stage %d never runs %s", q,
                        dl_sched_action_str(s, &y, a, sizeof a));
    if (bw >= 0 && (in >= 0 || w >= 0)) {
        int k = in >= 0 ? in : w;
        at(ix, q, k, 0);
        return dl_error(DL_EINVAL,
                        "schedule: stage %d action %d (%s): %s already runs as B (action %d)", q, k,
                        astr(s, q, k, a, sizeof a), astr(s, q, bw, b, sizeof b), bw);
    }
    if (w >= 0 && in < 0)
        return w_before_i(s, ix, q, w);
    y.op = in >= 0 ? DL_SCHED_W : DL_SCHED_B;
    if (bw < 0 && w < 0)
        return dl_error(DL_EINVAL, "schedule: stage %d never runs %s", q,
                        dl_sched_action_str(s, &y, a, sizeof a));
    return DL_OK;
}

/* The stage's memory limit: a (micro-batch, chunk) holds a slot from its F to its B or W. */
static int check_memory(const dl_sched *s, index_t *ix, int q)
{
    int held = 0, lim = s->mem_limit[q];
    char a[32];
    for (int i = 0; i < s->len[q] && lim > 0; i++) {
        int op = s->act[q][i].op;
        held += op == DL_SCHED_F ? 1 : op == DL_SCHED_B || op == DL_SCHED_W ? -1 : 0;
        if (held > lim)
            return at(ix, q, i, 0),
                   dl_error(DL_EINVAL,
                            "schedule: stage %d action %d (%s): %d activation slots held, over "
                            "the stage's memory limit %d (a micro-batch holds one from its F "
                            "until its B or W)",
                            q, i, astr(s, q, i, a, sizeof a), held, lim);
    }
    return DL_OK;
}

/* Structure checks and the index; the caller frees ix->pos on success. */
static int check_structure(const dl_sched *s, index_t *ix)
{
    char a[32];
    ix->pos = NULL;
    ix->bq = ix->bi = -1;
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
    if (s->vstage == NULL || s->mem_limit == NULL)
        return dl_error(DL_EINVAL,
                        "schedule: no placement table (build schedules with dl_sched_new)");
    int st = dl__sched_placement_check(s->p, s->v, s->vstage);
    if (st != DL_OK)
        return st;
    ix->p = s->p;
    ix->m = s->m;
    ix->v = s->v;
    size_t n = (size_t)s->p * NOPS * s->m * s->v;
    ix->pos = malloc(n * sizeof *ix->pos);
    if (ix->pos == NULL)
        return dl_error(DL_ENOMEM, "schedule: out of memory");
    for (size_t i = 0; i < n; i++) ix->pos[i] = -1;
    for (int q = 0; q < s->p && st == DL_OK; q++) {
        int nopt = 0;
        for (int i = 0; i < s->len[q] && st == DL_OK; i++) {
            const dl_sched_action *x = &s->act[q][i];
            if (x->op == DL_SCHED_OPT) {
                nopt++;
                if (s->flush && (nopt > 1 || i != s->len[q] - 1))
                    st = (at(ix, q, i, 0),
                          dl_error(DL_EINVAL,
                                   "schedule: stage %d action %d (OPT): a schedule with a flush "
                                   "has one optimizer step per stage, after all its backwards",
                                   q, i));
                continue;
            }
            if (!is_work(x->op) || x->mb < 0 || x->mb >= s->m || x->chunk < 0 || x->chunk >= s->v ||
                POS(ix, q, x->op, x->mb, x->chunk) >= 0)
                at(ix, q, i, 0);
            if (!is_work(x->op))
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
            for (int c = 0; c < s->v && st == DL_OK; c++) st = check_backward(s, ix, q, j, c);
    }
    /* Same-stage order, reported at the later of the two actions' positions being the
     * offending one: the backward (or token chunk) that runs too early. */
    for (int q = 0; q < s->p && st == DL_OK; q++) {
        for (int i = 0; i < s->len[q] && st == DL_OK; i++) {
            const dl_sched_action *x = &s->act[q][i];
            if (x->op == DL_SCHED_OPT) { /* a flush's OPT is last; an async one applies x->mb */
                for (int c = 0; x->mb >= 0 && x->mb < s->m && c < s->v && st == DL_OK; c++)
                    if (POS(ix, q, DL_SCHED_W, x->mb, c) > i) {
                        dl_sched_action y = {DL_SCHED_W, x->mb, c};
                        char b2[32];
                        st = dl_error(DL_EINVAL,
                                      "schedule: stage %d action %d (OPT): optimizer step before "
                                      "the weight gradient it applies (%s is action %d)",
                                      q, i, dl_sched_action_str(s, &y, b2, sizeof b2),
                                      POS(ix, q, DL_SCHED_W, x->mb, c));
                    }
                continue;
            }
            int j = x->mb, c = x->chunk, k = s->seq_chunks;
            int bin = x->op == DL_SCHED_B || x->op == DL_SCHED_I;
            char b2[32];

            if (x->op == DL_SCHED_W && POS(ix, q, DL_SCHED_I, j, c) > i) {
                st = w_before_i(s, ix, q, i);
            } else if (bin && POS(ix, q, DL_SCHED_F, j, c) > i) {
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
            } else if (k > 1 && bin && j % k != k - 1 && BIN(ix, q, j + 1, c) > i) {
                st = dl_error(DL_EINVAL,
                              "schedule: stage %d action %d (%s): token chunk %d of sequence %d "
                              "runs backward before chunk %d",
                              q, i, astr(s, q, i, a, sizeof a), j % k, j / k, j % k + 1);
            }
            if (st != DL_OK)
                at(ix, q, i, 0);
        }
    }
    for (int q = 0; q < s->p && st == DL_OK; q++) st = check_memory(s, ix, q);
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
    int j = x->mb, prev, pc, next, nc;
    if (x->op != DL_SCHED_F && x->op != DL_SCHED_B && x->op != DL_SCHED_I)
        return 0;
    dl_sched_peers(s, q, x->chunk, &prev, &pc, &next, &nc);
    if (x->op == DL_SCHED_F && prev >= 0) {
        *ds = prev;
        *di = POS(ix, prev, DL_SCHED_F, j, pc);
        return 1;
    }
    if (x->op != DL_SCHED_F && next >= 0) {
        *ds = next;
        *di = BIN(ix, next, j, nc);
        return 1;
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
/* Action i of stage q's duration: measured (dur), else its kind's cost, scaled per micro-batch. */
static double duration(const dl_sched *s, const dl_sched_costs *cost, const double *scale,
                       const double *const *dur, int q, int i)
{
    const dl_sched_action *x = &s->act[q][i];
    if (dur)
        return dur[q][i];
    double w = cost->w < 0 ? cost->b / 2 : cost->w;
    double d = x->op == DL_SCHED_F     ? cost->f
               : x->op == DL_SCHED_B   ? cost->b
               : x->op == DL_SCHED_OPT ? cost->opt
               : x->op == DL_SCHED_W   ? w
                                       : cost->b - w; /* I */
    return scale && x->op != DL_SCHED_OPT ? d * scale[x->mb] : d;
}

static int execute(const dl_sched *s, const index_t *ix, const dl_sched_costs *cost,
                   const double *scale, const double *const *dur, double **start, double **end,
                   int *bad)
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
                double d = duration(s, cost, scale, dur, q, i);
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
        if (bad)
            bad[0] = q, bad[1] = next[q];
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
    c->w = -1.0;
}

/* The refusal's message followed by the actions around the offending one. */
static int with_context(const dl_sched *s, int q, int i, int st)
{
    if (q < 0 || st == DL_OK || st == DL_ENOMEM)
        return st;
    char msg[1024], ctx[640];
    snprintf(msg, sizeof msg, "%s", dl_errmsg());
    dl_sched_context(s, q, i, ctx, sizeof ctx);
    return dl_error(st, "%s\n%s", msg, ctx);
}

int dl_sched_check(const dl_sched *s, int *stage, int *index)
{
    index_t ix;
    int st = check_structure(s, &ix), bad[2] = {-1, -1};
    if (st != DL_OK) {
        bad[0] = ix.bq, bad[1] = ix.bi;
    } else {
        dl_sched_costs c;
        dl_sched_costs_init(&c);
        st = execute(s, &ix, &c, NULL, NULL, NULL, NULL, bad);
        free(ix.pos);
    }
    if (stage)
        *stage = st ? bad[0] : -1;
    if (index)
        *index = st ? bad[1] : -1;
    return with_context(s, bad[0], bad[1], st);
}

int dl_sched_validate(const dl_sched *s) { return dl_sched_check(s, NULL, NULL); }

void dl_sched_context(const dl_sched *s, int stage, int i, char *buf, size_t cap)
{
    enum { SIDE = 4, ROWS = 3 }; /* actions either side; stages either side */
    buf[0] = '\0';
    for (int q = stage - ROWS < 0 ? 0 : stage - ROWS; q < s->p && q <= stage + ROWS; q++) {
        app(buf, cap, "%s  stage %d:", buf[0] ? "\n" : "", q);
        int lo = i - SIDE < 0 ? 0 : i - SIDE,
            hi = i + SIDE + 1 < s->len[q] ? i + SIDE + 1 : s->len[q];
        if (lo > 0)
            app(buf, cap, " ...");
        for (int k = lo; k < hi; k++) {
            char a[32];
            int mark = q == stage && k == i;
            app(buf, cap, " %s%s%s", mark ? "[" : "", astr(s, q, k, a, sizeof a), mark ? "]" : "");
        }
        if (hi < s->len[q])
            app(buf, cap, " ...");
    }
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
    return dl_sched_simulate_scaled(s, costs, NULL, out);
}

static int simulate(const dl_sched *s, const dl_sched_costs *costs, const double *mb_scale,
                    const double *const *dur, dl_sched_sim **out);

int dl_sched_simulate_scaled(const dl_sched *s, const dl_sched_costs *costs, const double *mb_scale,
                             dl_sched_sim **out)
{
    return simulate(s, costs, mb_scale, NULL, out);
}

int dl_sched_simulate_times(const dl_sched *s, const double *const *dur, dl_sched_sim **out)
{
    if (dur == NULL || s == NULL)
        return dl_error(DL_EINVAL, "simulate: no schedule or no action times");
    for (int q = 0; q < s->p; q++)
        for (int i = 0; i < s->len[q]; i++)
            if (!(dur[q][i] >= 0) || !isfinite(dur[q][i]))
                return dl_error(DL_EINVAL, "simulate: stage %d action %d's time %g is not >= 0", q,
                                i, dur[q][i]);
    return simulate(s, NULL, NULL, dur, out);
}

static int simulate(const dl_sched *s, const dl_sched_costs *costs, const double *mb_scale,
                    const double *const *dur, dl_sched_sim **out)
{
    if (out == NULL)
        return dl_error(DL_EINVAL, "simulate: null output");
    *out = NULL;
    dl_sched_costs c;
    if (costs)
        c = *costs;
    else
        dl_sched_costs_init(&c);
    if (!(c.f >= 0) || !(c.b >= 0) || !(c.opt >= 0) || !isfinite(c.f + c.b + c.opt + c.w) ||
        c.w > c.b)
        return dl_error(DL_EINVAL,
                        "simulate: costs must be non-negative, the weight part at most the "
                        "backward (forward %g, backward %g, weight part %g, optimizer %g)",
                        c.f, c.b, c.w, c.opt);
    for (int j = 0; mb_scale && s && j < s->m; j++)
        if (!(mb_scale[j] >= 0) || !isfinite(mb_scale[j]))
            return dl_error(DL_EINVAL, "simulate: micro-batch %d's cost factor %g is not >= 0", j,
                            mb_scale[j]);
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
    if ((st = execute(s, &ix, &c, mb_scale, dur, sim->start, sim->end, NULL)) != DL_OK)
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
            if (x->op == DL_SCHED_B || x->op == DL_SCHED_W) /* kept until the weight gradient */
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
