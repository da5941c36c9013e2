/* Per-rank event traces: recording (one store per event, no sharing between ranks), the measured
 * bubble and per-kind breakdown of a step (unions of intervals), Chrome trace JSON, and the
 * lecture's ASCII grid drawn from measured times (lib/parallel/sched.c's conventions). */
#define _GNU_SOURCE
#include "config.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "distlab/error.h"
#include "distlab/trace.h"
#include "io/path.h"
#include "core/grid.h"
#include "core/json.h"
#include "core/strbuf.h"

/* One rank's buffer header: its own cache line (the _Alignas pads the struct to 64 bytes), so a
 * rank's count and drop counter never share a line with another rank's. */
typedef struct rank_buf {
    _Alignas(64) dl_trace_event *ev;
    size_t n, cap;
    uint64_t dropped;
} rank_buf;

struct dl_trace {
    int nranks, v;
    size_t cap;
    rank_buf *r; /* [nranks], 64-byte aligned */
};

_Static_assert(sizeof(rank_buf) == 64, "rank_buf is one cache line");

int dl_trace_create(int nranks, size_t events_per_rank, dl_trace **out)
{
    if (out == NULL)
        return dl_error(DL_EINVAL, "trace: null output");
    *out = NULL;
    if (nranks < 1 || events_per_rank < 1)
        return dl_error(DL_EINVAL,
                        "trace: need at least one rank and one event per rank (got %d ranks, "
                        "%zu events)",
                        nranks, events_per_rank);
    if (events_per_rank > ((size_t)1 << 40) / sizeof(dl_trace_event))
        return dl_error(DL_EINVAL, "trace: %zu events per rank is too many", events_per_rank);
    dl_trace *t = calloc(1, sizeof *t);
    if (t == NULL)
        return dl_error(DL_ENOMEM, "trace: out of memory");
    t->nranks = nranks;
    t->v = 1;
    t->cap = events_per_rank;
    void *p = NULL;
    if (posix_memalign(&p, 64, (size_t)nranks * sizeof(rank_buf)) != 0) {
        free(t);
        return dl_error(DL_ENOMEM, "trace: out of memory for %d rank headers", nranks);
    }
    t->r = p;
    memset(t->r, 0, (size_t)nranks * sizeof(rank_buf));
    /* Page-aligned buffers rounded up to whole cache lines: ranks never share a line. The pages
     * are not touched here, so each is first touched (placed) by the rank that writes it. */
    size_t bytes = (events_per_rank * sizeof(dl_trace_event) + 63) & ~(size_t)63;
    for (int r = 0; r < nranks; r++) {
        p = NULL;
        if (posix_memalign(&p, 4096, bytes) != 0) {
            dl_trace_destroy(t);
            return dl_error(DL_ENOMEM, "trace: out of memory for %zu events of rank %d (%zu bytes)",
                            events_per_rank, r, bytes);
        }
        t->r[r].ev = p;
        t->r[r].cap = events_per_rank;
    }
    *out = t;
    return DL_OK;
}

void dl_trace_destroy(dl_trace *t)
{
    if (t == NULL)
        return;
    if (t->r)
        for (int r = 0; r < t->nranks; r++) free(t->r[r].ev);
    free(t->r);
    free(t);
}

void dl_trace_add(dl_trace *t, int rank, int kind, int step, int mb, int chunk, uint64_t t0,
                  uint64_t t1)
{
    if (t == NULL || (unsigned)rank >= (unsigned)t->nranks)
        return;
    rank_buf *b = &t->r[rank];
    size_t n = b->n;
    if (n >= b->cap) {
        b->dropped++;
        return;
    }
    dl_trace_event *e = &b->ev[n];
    e->t0 = t0;
    e->t1 = t1;
    e->step = step;
    e->mb = mb;
    e->chunk = (int16_t)chunk;
    e->kind = (int16_t)kind;
    b->n = n + 1;
}

size_t dl_trace_count(const dl_trace *t, int rank)
{
    if (t == NULL || (unsigned)rank >= (unsigned)t->nranks)
        return 0;
    return t->r[rank].n;
}

const dl_trace_event *dl_trace_events(const dl_trace *t, int rank)
{
    if (t == NULL || (unsigned)rank >= (unsigned)t->nranks)
        return NULL;
    return t->r[rank].ev;
}

uint64_t dl_trace_dropped(const dl_trace *t, int rank)
{
    if (t == NULL || (unsigned)rank >= (unsigned)t->nranks)
        return 0;
    return t->r[rank].dropped;
}

int dl_trace_nranks(const dl_trace *t) { return t ? t->nranks : 0; }
size_t dl_trace_capacity(const dl_trace *t) { return t ? t->cap : 0; }

void dl_trace_clear(dl_trace *t)
{
    if (t == NULL)
        return;
    for (int r = 0; r < t->nranks; r++) {
        t->r[r].n = 0;
        t->r[r].dropped = 0;
    }
}

void dl_trace_set_chunks(dl_trace *t, int v)
{
    if (t)
        t->v = v > 1 ? v : 1;
}

const char *dl_trace_kind_name(int kind)
{
    static const char *const names[DL_TR_NKINDS] = {"fwd",          "bwd",        "send",
                                                    "recv-wait",    "opt",        "comm",
                                                    "step",         "other",      "wgt",
                                                    "moe-dispatch", "moe-combine"};
    return kind >= 0 && kind < DL_TR_NKINDS ? names[kind] : "other";
}

/* ---------------------------------------------------------------------------------------- */
/* Windows and unions of intervals                                                           */

/* The rank's first STEP event of `step`, or NULL. */
static const dl_trace_event *find_step(const dl_trace *t, int rank, int step)
{
    const rank_buf *b = &t->r[rank];
    for (size_t i = 0; i < b->n; i++)
        if (b->ev[i].kind == DL_TR_STEP && b->ev[i].step == step)
            return &b->ev[i];
    return NULL;
}

typedef struct iv {
    uint64_t a, b;
} iv;

static int iv_cmp(const void *x, const void *y)
{
    const iv *p = x, *q = y;
    return p->a < q->a ? -1 : p->a > q->a ? 1 : (p->b < q->b ? -1 : p->b > q->b);
}

/* Collect the events of `rank` whose kind is in `mask`, clipped to [w0, w1), non-empty, into
 * v (room for every event); sort and merge them in place. Returns the merged count. */
static size_t merged(const rank_buf *b, unsigned mask, uint64_t w0, uint64_t w1, iv *v)
{
    size_t k = 0;
    for (size_t i = 0; i < b->n; i++) {
        const dl_trace_event *e = &b->ev[i];
        if (e->kind < 0 || e->kind >= DL_TR_NKINDS || !(mask & (1u << e->kind)))
            continue;
        uint64_t a = e->t0 > w0 ? e->t0 : w0, z = e->t1 < w1 ? e->t1 : w1;
        if (z > a)
            v[k++] = (iv){a, z};
    }
    if (k < 2)
        return k;
    qsort(v, k, sizeof *v, iv_cmp);
    size_t m = 0;
    for (size_t i = 1; i < k; i++) {
        if (v[i].a <= v[m].b) {
            if (v[i].b > v[m].b)
                v[m].b = v[i].b;
        } else {
            v[++m] = v[i];
        }
    }
    return m + 1;
}

static uint64_t total(const iv *v, size_t k)
{
    uint64_t s = 0;
    for (size_t i = 0; i < k; i++) s += v[i].b - v[i].a;
    return s;
}

static int check_rank(const dl_trace *t, int rank, const char *what)
{
    if (t == NULL)
        return dl_error(DL_EINVAL, "trace %s: null trace", what);
    if (rank < 0 || rank >= t->nranks)
        return dl_error(DL_EINVAL, "trace %s: rank %d out of range (the trace has %d ranks)", what,
                        rank, t->nranks);
    return DL_OK;
}

/* The window [w0, w1] of rank's step event and a scratch interval array for merged() (the
 * caller frees *v); `what` names the query in the messages. */
static int step_window(const dl_trace *t, int rank, int step, const char *what, uint64_t *w0,
                       uint64_t *w1, iv **v)
{
    int rc = check_rank(t, rank, what);
    if (rc)
        return rc;
    const dl_trace_event *s = find_step(t, rank, step);
    if (s == NULL)
        return dl_error(DL_EINVAL, "trace %s: rank %d has no step event of step %d", what, rank,
                        step);
    *w0 = s->t0, *w1 = s->t1 > s->t0 ? s->t1 : s->t0;
    size_t n = t->r[rank].n;
    *v = malloc((n ? n : 1) * sizeof **v);
    if (*v == NULL)
        return dl_error(DL_ENOMEM, "trace %s: out of memory", what);
    return DL_OK;
}

int dl_trace_bubble(const dl_trace *t, int rank, int step, double *bubble, double *busy_ns,
                    double *wall_ns)
{
    uint64_t w0, w1;
    iv *v;
    int rc = step_window(t, rank, step, "bubble", &w0, &w1, &v);
    if (rc)
        return rc;
    const rank_buf *b = &t->r[rank];
    uint64_t busy =
        total(v, merged(b, (1u << DL_TR_FWD) | (1u << DL_TR_BWD) | (1u << DL_TR_WGT), w0, w1, v));
    free(v);
    double wall = (double)(w1 - w0);
    if (busy_ns)
        *busy_ns = (double)busy;
    if (wall_ns)
        *wall_ns = wall;
    if (bubble)
        *bubble = wall > 0 ? 1.0 - (double)busy / wall : 0.0;
    return DL_OK;
}

int dl_trace_breakdown(const dl_trace *t, int rank, int step, double ns[DL_TR_NKINDS])
{
    int rc = check_rank(t, rank, "breakdown");
    if (rc)
        return rc;
    if (ns == NULL)
        return dl_error(DL_EINVAL, "trace breakdown: null output");
    uint64_t w0, w1;
    iv *v;
    if ((rc = step_window(t, rank, step, "breakdown", &w0, &w1, &v)))
        return rc;
    const rank_buf *b = &t->r[rank];
    for (int k = 0; k < DL_TR_NKINDS; k++) ns[k] = (double)total(v, merged(b, 1u << k, w0, w1, v));
    free(v);
    return DL_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Chrome trace JSON                                                                         */

/* Microseconds with exactly 3 decimals, from integer nanoseconds (no rounding). */
static void us3(FILE *f, uint64_t ns)
{
    fprintf(f, "%llu.%03u", (unsigned long long)(ns / 1000), (unsigned)(ns % 1000));
}

static void event_name(const dl_trace *t, const dl_trace_event *e, char *buf, size_t cap)
{
    if (e->kind == DL_TR_FWD || e->kind == DL_TR_BWD || e->kind == DL_TR_WGT) {
        char c = e->kind == DL_TR_FWD ? 'F' : e->kind == DL_TR_BWD ? 'B' : 'W';
        if (e->chunk > 0 || t->v > 1)
            snprintf(buf, cap, "%c%d.%d", c, (int)e->mb, (int)e->chunk);
        else
            snprintf(buf, cap, "%c%d", c, (int)e->mb);
    } else {
        snprintf(buf, cap, "%s", e->kind == DL_TR_OPT ? "opt" : dl_trace_kind_name(e->kind));
    }
}

int dl_trace_write_chrome(const dl_trace *t, const char *path, const char *const *names)
{
    if (t == NULL || path == NULL || *path == '\0')
        return dl_error(DL_EINVAL, "trace: write chrome: null trace or empty path");
    int st = dl_path_check_output(path, "trace");
    if (st != DL_OK)
        return st;
    uint64_t base = UINT64_MAX;
    for (int r = 0; r < t->nranks; r++)
        for (size_t i = 0; i < t->r[r].n; i++)
            if (t->r[r].ev[i].t0 < base)
                base = t->r[r].ev[i].t0;
    if (base == UINT64_MAX)
        base = 0;

    size_t len = strlen(path) + 32;
    char *tmp = malloc(len);
    if (tmp == NULL)
        return dl_error(DL_ENOMEM, "trace: write chrome %s: out of memory", path);
    snprintf(tmp, len, "%s.tmp.%ld", path, (long)getpid());
    dl_path_remove_stale_tmp(path);
    FILE *f = fopen(tmp, "w");
    if (f == NULL) {
        int e = errno;
        free(tmp);
        return dl_error(DL_ESYS, "trace: cannot write %s: %s", path, strerror(e));
    }
    fputs("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n", f);
    int first = 1;
    fputs("{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"tid\":0,\"args\":{\"name\":"
          "\"distlab\"}}",
          f);
    first = 0;
    for (int r = 0; r < t->nranks; r++) {
        char nm[32];
        snprintf(nm, sizeof nm, "rank %d", r);
        fprintf(f,
                ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,\"args\":{"
                "\"name\":",
                r);
        dl__json_fputs(f, names && names[r] ? names[r] : nm, DL__JSON_CTRL_U);
        fprintf(f,
                "}},\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":0,\"tid\":%d,"
                "\"args\":{\"sort_index\":%d}}",
                r, r);
    }
    for (int r = 0; r < t->nranks; r++) {
        for (size_t i = 0; i < t->r[r].n; i++) {
            const dl_trace_event *e = &t->r[r].ev[i];
            char nm[48];
            event_name(t, e, nm, sizeof nm);
            uint64_t dur = e->t1 > e->t0 ? e->t1 - e->t0 : 0;
            fputs(first ? "" : ",\n", f);
            first = 0;
            /* W in a colour of its own (Chrome's reserved colour names; Perfetto colours by
             * name) */
            fprintf(f, "{\"name\":\"%s\",\"cat\":\"%s\",%s\"ph\":\"X\",\"ts\":", nm,
                    dl_trace_kind_name(e->kind),
                    e->kind == DL_TR_WGT ? "\"cname\":\"olive\"," : "");
            us3(f, e->t0 - base);
            fputs(",\"dur\":", f);
            us3(f, dur);
            fprintf(f, ",\"pid\":0,\"tid\":%d,\"args\":{\"step\":%d,\"mb\":%d,\"chunk\":%d}}", r,
                    (int)e->step, (int)e->mb, (int)e->chunk);
        }
    }
    fputs("\n]}\n", f);
    int bad = ferror(f);
    if (fclose(f) != 0)
        bad = 1;
    if (bad) {
        int e = errno;
        unlink(tmp);
        free(tmp);
        return dl_error(DL_ESYS, "trace: writing %s failed: %s", path, strerror(e));
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        free(tmp);
        return dl_error(DL_ESYS, "trace: cannot write %s (rename): %s", path, strerror(e));
    }
    free(tmp);
    return DL_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* The lecture's grid from measured times                                                    */

/* The grid's mark of an event (0: not drawn). */
static char mark(const dl_trace_event *e)
{
    switch (e->kind) {
    case DL_TR_FWD: return dl__grid_mark(DL__GRID_FWD, e->mb);
    case DL_TR_BWD: return dl__grid_mark(DL__GRID_BWD, e->mb);
    case DL_TR_OPT: return dl__grid_mark(DL__GRID_OPT, e->mb);
    case DL_TR_COMM: return dl__grid_mark(DL__GRID_COMM, e->mb);
    case DL_TR_WGT: return dl__grid_mark(DL__GRID_WGT, e->mb);
    default: return 0;
    }
}

#define DRAWN                                                                                      \
    ((1u << DL_TR_FWD) | (1u << DL_TR_BWD) | (1u << DL_TR_OPT) | (1u << DL_TR_COMM) |              \
     (1u << DL_TR_WGT))

int dl_trace_grid(const dl_trace *t, int step, uint64_t unit_ns, char **out)
{
    return dl_trace_grid_hidden(t, step, unit_ns, out, NULL);
}

/* An action the grid draws by itself (collectives nest inside forwards and backwards). */
static int is_action(const dl_trace_event *e)
{
    return e->kind == DL_TR_FWD || e->kind == DL_TR_BWD || e->kind == DL_TR_OPT ||
           e->kind == DL_TR_WGT;
}

int dl_trace_grid_hidden(const dl_trace *t, int step, uint64_t unit_ns, char **out, int *hidden)
{
    if (t == NULL || out == NULL)
        return dl_error(DL_EINVAL, "trace grid: null argument");
    *out = NULL;
    if (hidden)
        *hidden = 0;
    if (unit_ns == 0)
        return dl_error(DL_EINVAL, "trace grid: the time unit must be > 0 ns");
    uint64_t w0 = UINT64_MAX, w1 = 0;
    for (int r = 0; r < t->nranks; r++) {
        const dl_trace_event *s = find_step(t, r, step);
        if (s == NULL)
            continue;
        if (s->t0 < w0)
            w0 = s->t0;
        if (s->t1 > w1)
            w1 = s->t1;
    }
    if (w0 == UINT64_MAX)
        return dl_error(DL_EINVAL, "trace grid: no rank has a step event of step %d", step);
    if (w1 < w0)
        w1 = w0;
    uint64_t cells = (w1 - w0 + unit_ns - 1) / unit_ns;
    if (cells > 1000000)
        return dl_error(DL_EINVAL,
                        "trace grid: step %d spans %llu cells of %llu ns (at most 1e6; use a "
                        "larger unit)",
                        step, (unsigned long long)cells, (unsigned long long)unit_ns);
    size_t T = (size_t)cells, most = 1;
    for (int r = 0; r < t->nranks; r++)
        if (t->r[r].n > most)
            most = t->r[r].n;
    uint64_t *cov = malloc((T ? T : 1) * sizeof *cov), *best = malloc((T ? T : 1) * sizeof *best);
    const dl_trace_event **who = malloc((T ? T : 1) * sizeof *who);
    iv *v = malloc(most * sizeof *v);
    char *shown = malloc(most), *row = malloc(T ? T : 1);
    int rc = DL_OK;
    dl__strbuf g = {0};
    if (!cov || !best || !who || !v || !shown || !row) {
        rc = dl_error(DL_ENOMEM, "trace grid: out of memory (%zu cells)", T);
        goto done;
    }
    int wd = dl__grid_label_width(t->nranks);
    for (int r = 0; r < t->nranks; r++) {
        const rank_buf *b = &t->r[r];
        memset(cov, 0, T * sizeof *cov);
        memset(best, 0, T * sizeof *best);
        memset(who, 0, T * sizeof *who);
        /* how much of each cell any drawn event covers (the union, so nesting counts once) */
        size_t k = merged(b, DRAWN, w0, w1, v);
        for (size_t i = 0; i < k; i++)
            for (size_t c = (v[i].a - w0) / unit_ns; c < T && w0 + c * unit_ns < v[i].b; c++) {
                uint64_t ca = w0 + c * unit_ns, cb = ca + unit_ns;
                uint64_t a = v[i].a > ca ? v[i].a : ca, z = v[i].b < cb ? v[i].b : cb;
                if (z > a)
                    cov[c] += z - a;
            }
        /* which single event covers most of each cell */
        for (size_t i = 0; i < b->n; i++) {
            const dl_trace_event *e = &b->ev[i];
            if (e->kind < 0 || e->kind >= DL_TR_NKINDS || !(DRAWN & (1u << e->kind)))
                continue;
            uint64_t ea = e->t0 > w0 ? e->t0 : w0, ez = e->t1 < w1 ? e->t1 : w1;
            if (ez <= ea)
                continue;
            for (size_t c = (ea - w0) / unit_ns; c < T && w0 + c * unit_ns < ez; c++) {
                uint64_t ca = w0 + c * unit_ns, cb = ca + unit_ns;
                uint64_t a = ea > ca ? ea : ca, z = ez < cb ? ez : cb;
                if (z <= a)
                    continue;
                uint64_t o = z - a;
                const dl_trace_event *w = who[c];
                if (w == NULL || o > best[c] ||
                    (o == best[c] &&
                     (e->kind < w->kind || (e->kind == w->kind && e->t0 < w->t0)))) {
                    best[c] = o;
                    who[c] = e;
                }
            }
        }
        memset(shown, 0, b->n ? b->n : 1);
        for (size_t c = 0; c < T; c++) {
            uint64_t ca = w0 + c * unit_ns, cb = ca + unit_ns < w1 ? ca + unit_ns : w1;
            uint64_t idle = (cb - ca) - cov[c];
            row[c] = 0; /* idle */
            if (who[c] != NULL && best[c] >= idle) {
                row[c] = mark(who[c]);
                shown[who[c] - b->ev] = 1;
            }
        }
        dl__grid_row(&g, r, wd, row, T);
        /* this step's actions inside the window that no cell shows */
        for (size_t i = 0; hidden && i < b->n; i++) {
            const dl_trace_event *e = &b->ev[i];
            if (e->step == step && is_action(e) && e->t1 > w0 && e->t0 < w1 && !shown[i])
                (*hidden)++;
        }
    }
    rc = dl__sb_finish(&g, out, "trace grid");
done:
    free(row);
    free(cov);
    free(best);
    free(who);
    free(v);
    free(shown);
    return rc;
}

static int ev_start_cmp(const void *a, const void *b)
{
    const dl_trace_event *x = *(const dl_trace_event *const *)a,
                         *y = *(const dl_trace_event *const *)b;
    return x->t0 < y->t0 ? -1 : x->t0 > y->t0;
}

int dl_trace_actions(const dl_trace *t, int step, char **out)
{
    if (t == NULL || out == NULL)
        return dl_error(DL_EINVAL, "trace actions: null argument");
    *out = NULL;
    size_t most = 1;
    for (int r = 0; r < t->nranks; r++)
        if (t->r[r].n > most)
            most = t->r[r].n;
    const dl_trace_event **e = malloc(most * sizeof *e);
    if (!e)
        return dl_error(DL_ENOMEM, "trace actions: out of memory");
    int wd = dl__grid_label_width(t->nranks), any = 0;
    dl__strbuf g = {0};
    for (int r = 0; r < t->nranks; r++) {
        const rank_buf *b = &t->r[r];
        size_t k = 0;
        for (size_t i = 0; i < b->n; i++)
            if (b->ev[i].step == step && is_action(&b->ev[i]))
                e[k++] = &b->ev[i];
        qsort(e, k, sizeof *e, ev_start_cmp);
        dl__grid_label(&g, r, wd);
        for (size_t i = 0; i < k; i++) {
            char s[2] = {' ', mark(e[i])};
            dl__sb_add(&g, s, 2);
        }
        dl__sb_add(&g, "\n", 1);
        any += k > 0;
    }
    free(e);
    if (!any && !g.oom) {
        dl__sb_free(&g);
        return dl_error(DL_EINVAL,
                        "trace actions: no forward, backward or optimizer step in step %d", step);
    }
    return dl__sb_finish(&g, out, "trace actions");
}
