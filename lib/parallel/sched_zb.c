/* The zero-bubble generators (Qi et al. 2024, "Zero Bubble Pipeline Parallelism"): ZB-H1, ZB-H2
 * and ZB-V. Each runs a list scheduler in the unit-cost model (F = I = W = 1): stages take turns
 * in time order, each running, when free, the action its policy picks among those whose inputs
 * have arrived, and a pending weight gradient (W) when none can start. The order so found is the
 * schedule; the simulator then runs it with any costs. */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "distlab/error.h"
#include "distlab/sched.h"
#include "parallel/sched_priv.h"

enum { OPF = 0, OPI = 1 }; /* the rows of the end-time table */

typedef struct zb {
    dl__gen g;
    int p, m, v, nvs, greedy;
    long dur[3];        /* F, I, W: 1 each in the unit-cost model */
    int *end;           /* [(op * nvs + g) * m + j]: end time of F / I of virtual stage g, or -1 */
    int *freeat, *wait; /* per stage: when it is free; 1 while it waits for another stage */
    int *held, *left;   /* per stage: activation slots held; actions still to run */
    int *ord, *nord, *pos; /* fixed order: per stage up to 2mv (op, c, j) as (op v + c) m + j */
    int *nextf, *nexti;    /* greedy: per stage and chunk, the next micro-batch to run */
    int *wq, *wh, *wt;     /* per stage: a FIFO of pending W (chunk * m + j), head, tail */
} zb;

#define END(z, op, g, j) ((z)->end[((size_t)(op) * (z)->nvs + (g)) * (z)->m + (j)])

static int zb_vs(const zb *z, int q, int c) { return z->g.s->vstage[q * z->v + c]; }

/* F(j) or I(j) of chunk c of stage q can start at time t: its input has arrived. */
static int ready(const zb *z, int q, int op, int c, int j, long t)
{
    int g = zb_vs(z, q, c);
    long e;
    if (op == OPF)
        e = g == 0 ? 0 : END(z, OPF, g - 1, j);
    else
        e = g == z->nvs - 1 ? END(z, OPF, g, j) : END(z, OPI, g + 1, j);
    return e >= 0 && e <= t;
}

/* The policy's choice at time t: *op (OPF, OPI, or 2 for a pending W), *c, *j; 0 if none. */
static int pick(zb *z, int q, long t, int *op, int *c, int *j)
{
    int lim = z->g.s->mem_limit[q];
    if (!z->greedy && z->pos[q] < z->nord[q]) {
        int k = z->ord[(size_t)q * 2 * z->m * z->v + z->pos[q]];
        *op = k / z->m / z->v, *c = k / z->m % z->v, *j = k % z->m;
        if (ready(z, q, *op, *c, *j, t) && (*op == OPI || z->held[q] < lim)) {
            z->pos[q]++;
            return 1;
        }
    }
    /* greedy: an input gradient first (the critical path), then a forward, later virtual
     * stages first (they reach the loss, and turn into backwards, sooner) */
    for (int want = OPI; z->greedy && want >= OPF; want--)
        for (int cc = z->v - 1; cc >= 0; cc--) {
            int *nx = want == OPI ? &z->nexti[q * z->v + cc] : &z->nextf[q * z->v + cc];
            if (*nx < z->m && ready(z, q, want, cc, *nx, t) && (want == OPI || z->held[q] < lim)) {
                *op = want, *c = cc, *j = (*nx)++;
                return 1;
            }
        }
    if (z->wh[q] == z->wt[q])
        return 0;
    int w = z->wq[(size_t)q * z->m * z->v + z->wh[q]++];
    *op = 2, *c = w / z->m, *j = w % z->m;
    return 1;
}

static void run_one(zb *z, int q, int op, int c, int j, long t)
{
    static const int sched_op[] = {DL_SCHED_F, DL_SCHED_I, DL_SCHED_W};
    dl__gen_emit(&z->g, q, sched_op[op], j, c);
    if (op == OPF) {
        z->held[q]++;
        END(z, OPF, zb_vs(z, q, c), j) = t + z->dur[OPF];
    } else if (op == OPI) {
        END(z, OPI, zb_vs(z, q, c), j) = t + z->dur[OPI];
        z->wq[(size_t)q * z->m * z->v + z->wt[q]++] = c * z->m + j;
    } else {
        z->held[q]--;
    }
    z->freeat[q] = t + z->dur[op];
    z->left[q]--;
    memset(z->wait, 0, sizeof(int) * (size_t)z->p);
}

/* The earliest end time after t (-1: none): when a waiting stage may find an input. */
static long next_event(const zb *z, long t)
{
    long best = -1;
    for (size_t k = 0; k < (size_t)2 * z->nvs * z->m; k++)
        if (z->end[k] > t && (best < 0 || z->end[k] < best))
            best = z->end[k];
    return best;
}

static int zb_run(zb *z)
{
    for (;;) {
        int q = -1;
        for (int r = 0; r < z->p; r++)
            if (z->left[r] > 0 && (q < 0 || z->freeat[r] < z->freeat[q] ||
                                   (z->freeat[r] == z->freeat[q] && z->wait[r] < z->wait[q])))
                q = r;
        if (q < 0)
            return DL_OK;
        long t = z->freeat[q];
        int op, c, j;
        if (pick(z, q, t, &op, &c, &j)) {
            run_one(z, q, op, c, j, t);
            continue;
        }
        int other = 0; /* another stage at time t has not looked yet: let it go first */
        for (int r = 0; r < z->p; r++)
            other |= r != q && z->left[r] > 0 && z->freeat[r] == t && !z->wait[r];
        if (other) {
            z->wait[q] = 1;
            continue;
        }
        long e = next_event(z, t);
        if (e < 0)
            return dl_error(DL_EINVAL, "%s schedule: stage %d cannot go on (internal)",
                            dl_sched_kind_name(z->g.s->kind), q);
        z->freeat[q] = e;
        memset(z->wait, 0, sizeof(int) * (size_t)z->p);
    }
}

static void zb_free(zb *z)
{
    free(z->end), free(z->freeat), free(z->wait), free(z->held), free(z->left);
    free(z->ord), free(z->nord), free(z->pos), free(z->nextf), free(z->nexti);
    free(z->wq), free(z->wh), free(z->wt);
}

/* Stage s's fixed order of forwards and input gradients: o[0 .. n-1] as (op v + c) m + j. */
typedef int (*zb_order)(int p, int m, int s, int *o);

/* A zero-bubble schedule: the fixed order (greedy = 0) or the greedy policy, W filling the gaps;
 * limit the memory limit of every stage. */
static int zb_make(dl_sched_kind kind, int p, int m, int v, int greedy, int limit, zb_order order,
                   const long dur[3], dl_sched **out)
{
    zb z = {.p = p, .m = m, .v = v, .nvs = p * v, .greedy = greedy};
    memcpy(z.dur, dur, sizeof z.dur);
    int st = dl__gen_start(&z.g, kind, p, m, v, out);
    if (st != DL_OK)
        return st;
    size_t P = (size_t)p, M = (size_t)m, V = (size_t)v;
    z.end = malloc(sizeof(long) * 2 * P * V * M);
    z.freeat = calloc(P, sizeof(long)), z.wait = calloc(P, sizeof(int));
    z.held = calloc(P, sizeof(int)), z.left = calloc(P, sizeof(int));
    z.ord = malloc(sizeof(int) * P * 2 * M * V), z.nord = calloc(P, sizeof(int));
    z.pos = calloc(P, sizeof(int));
    z.nextf = calloc(P * V, sizeof(int)), z.nexti = calloc(P * V, sizeof(int));
    z.wq = malloc(sizeof(int) * P * M * V), z.wh = calloc(P, sizeof(int));
    z.wt = calloc(P, sizeof(int));
    if (!z.end || !z.freeat || !z.wait || !z.held || !z.left || !z.ord || !z.nord || !z.pos ||
        !z.nextf || !z.nexti || !z.wq || !z.wh || !z.wt) {
        zb_free(&z);
        z.g.st = dl_error(DL_ENOMEM, "%s schedule: out of memory", dl_sched_kind_name(kind));
        return dl__gen_finish(&z.g, out);
    }
    for (size_t k = 0; k < 2 * P * V * M; k++) z.end[k] = -1;
    if (v == 2) { /* the V: stage s holds virtual stages s and 2p - 1 - s */
        for (int s = 0; s < p; s++)
            z.g.s->vstage[s * 2] = s, z.g.s->vstage[s * 2 + 1] = 2 * p - 1 - s;
    }
    for (int s = 0; s < p; s++) {
        z.left[s] = 3 * m * v;
        z.g.s->mem_limit[s] = limit;
        if (!greedy)
            z.nord[s] = order(p, m, s, z.ord + (size_t)s * 2 * m * v);
    }
    st = zb_run(&z);
    if (st != DL_OK && z.g.st == DL_OK)
        z.g.st = st;
    for (int s = 0; s < p; s++) dl__gen_emit(&z.g, s, DL_SCHED_OPT, -1, -1);
    zb_free(&z);
    return dl__gen_finish(&z.g, out);
}

static const long unit[3] = {1, 1, 1};

/* w warm-up forwards, then 1F1B's alternation of a forward and an input gradient (one chunk). */
static int order_1f1b(int m, int w, int *o)
{
    int n = 0;
    w = w < m ? w : m;
    for (int j = 0; j < w; j++) o[n++] = OPF * m + j;
    for (int i = 0; i < m; i++) {
        if (w + i < m)
            o[n++] = OPF * m + w + i;
        o[n++] = OPI * m + i;
    }
    return n;
}
static int order_h1(int p, int m, int s, int *o) { return order_1f1b(m, p - s - 1, o); }
static int order_h2(int p, int m, int s, int *o) { return order_1f1b(m, 2 * (p - s - 1), o); }

static int zb_args(const char *what, int p, int m)
{
    if (p < 1 || m < 1)
        return dl_error(DL_EINVAL, "%s schedule: need p >= 1 and m >= 1 (p = %d, m = %d)", what, p,
                        m);
    return DL_OK;
}

int dl_sched_zb_h1(int p, int m, dl_sched **out)
{
    int st = zb_args("zb-h1", p, m);
    return st ? st : zb_make(DL_SCHED_ZB_H1, p, m, 1, 0, p < m ? p : m, order_h1, unit, out);
}

int dl_sched_zb_h2(int p, int m, dl_sched **out)
{
    int st = zb_args("zb-h2", p, m);
    return st ? st
              : zb_make(DL_SCHED_ZB_H2, p, m, 1, 0, 2 * p - 1 < m ? 2 * p - 1 : m, order_h2, unit,
                        out);
}

int dl_sched_zb_v(int p, int m, dl_sched **out) { return dl_sched_zb_v_costs(p, m, NULL, out); }

int dl_sched_zb_v_costs(int p, int m, const dl_sched_costs *c, dl_sched **out)
{
    int st = zb_args("zb-v", p, m);
    if (st == DL_OK && p < 2)
        st = dl_error(DL_EINVAL, "zb-v schedule: the V needs at least 2 stages (p = %d)", p);
    long dur[3] = {1, 1, 1};
    if (st == DL_OK && c) {
        /* whole microseconds of a millisecond-like unit: integer times keep ties exact */
        double w = c->w < 0 ? c->b / 2 : c->w, x[3] = {c->f, c->b - w, w};
        for (int k = 0; k < 3 && st == DL_OK; k++) {
            if (!(x[k] > 0 && x[k] < 1e9))
                st = dl_error(DL_EINVAL,
                              "zb-v schedule: costs must be positive (forward %g, input "
                              "gradient %g, weight gradient %g)",
                              x[0], x[1], x[2]);
            dur[k] = (long)(x[k] * 1000 + 0.5);
            if (dur[k] < 1)
                dur[k] = 1;
        }
    }
    return st ? st : zb_make(DL_SCHED_ZB_V, p, m, 2, 1, p < m ? 2 * p : 2 * m, NULL, dur, out);
}

/* DualPipeV (DeepSeek's DualPipe folded into a V), stage s of p, m >= 2p micro-batches, chunk 0
 * going down the V and chunk 1 coming back up. The phases, with their counts:
 *   2(p-s-1) forwards of chunk 0 (the V's far end must fill before s's chunk 1 has input);
 *   s+1 pairs F0 F1 (chunk 1's first inputs arrive one each two steps);
 *   p-s-1 pairs I1 F1 (the first input gradients, one W each filling the wait for the F1);
 *   m-2p+s+1 overlapped quads F0 I1 F1 I0: one chunk's forward then the other's backward;
 *   p-s-1 triples I1 F1 I0, s+1 pairs I1 I0, p-s-1 lone I0 (the cool-down), W deferred.
 * Each chunk gets m forwards and m input gradients. Pending Ws fill the gaps (run_one's FIFO) and
 * the limit 2p+1 (the overlapped F0 before I1 holds one slot past the 2p of the warm-up) makes
 * each steady-phase W run before the next forward, as DualPipe's full backward does. */
static int order_dualpipev(int p, int m, int s, int *o)
{
    static const char *phase[] = {"f", "fF", "iF", "fiFI", "iFI", "iI", "I"};
    int count[] = {2 * (p - s - 1), s + 1, p - s - 1, m - 2 * p + s + 1,
                   p - s - 1,       s + 1, p - s - 1};
    int next[2][2] = {{0, 0}, {0, 0}}, n = 0; /* [op][chunk]: the next micro-batch */
    for (int ph = 0; ph < 7; ph++)
        for (int k = 0; k < count[ph]; k++)
            for (const char *a = phase[ph]; *a; a++) {
                /* f/F: forward of chunk 0/1; i/I: input gradient of chunk 1/0 (the backward
                 * runs the V the other way) */
                int op = *a == 'f' || *a == 'F' ? OPF : OPI;
                int c = (*a == 'F') || (*a == 'i');
                o[n++] = (op * 2 + c) * m + next[op][c]++;
            }
    return n;
}

int dl_sched_dualpipev(int p, int m, dl_sched **out)
{
    int st = zb_args("dualpipev", p, m);
    if (st == DL_OK && p < 2)
        st = dl_error(DL_EINVAL, "dualpipev schedule: the V needs at least 2 stages (p = %d)", p);
    if (st == DL_OK && m < 2 * p)
        st = dl_error(DL_EINVAL,
                      "dualpipev schedule: needs at least 2p micro-batches (p = %d: m >= %d, got "
                      "%d)",
                      p, 2 * p, m);
    return st ? st : zb_make(DL_SCHED_DUALPIPEV, p, m, 2, 0, 2 * p + 1, order_dualpipev, unit, out);
}

double dl_sched_bubble_theory(const dl_sched *s, double f, double b, double w)
{
    if (s == NULL)
        return -1.0;
    double k = s->p - 1, t;
    switch (s->kind) {
    case DL_SCHED_GPIPE:
    case DL_SCHED_1F1B: t = k * (f + b + w); break;
    case DL_SCHED_1F1B_SPLIT: t = k * (f + b); break; /* I hands on after B, not B + W */
    case DL_SCHED_ZB_H1: t = k * (f + b - w); break;
    case DL_SCHED_ZB_H2:
    case DL_SCHED_ZB_V: t = k * (f + b - 2 * w); break;
    /* DualPipe's (PP/2 - 1)(F&B + B - 3W) for PP devices, B the whole backward and F&B an
     * overlapped forward-backward pair; DualPipeV is half of it, PP/2 = p. distlab runs the pair
     * one after the other (F&B = F + B + W here), so t = (p-1)(F + 2B - W) with B the I. */
    case DL_SCHED_DUALPIPEV: t = k * (f + 2 * b - w); break;
    default: return -1.0;
    }
    if (t < 0)
        t = 0;
    double work = (double)s->m * s->v * (f + b + w);
    return work + t > 0 ? t / (work + t) : 0.0;
}
