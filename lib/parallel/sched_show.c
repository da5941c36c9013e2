/* Pipeline schedules printed: the lecture's grids, captions, side-by-side text and the display
 * width of UTF-8 text the renderers align with. */
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
/* Printing                                                                                  */

/* The grid's mark of an action (a schedule draws no collectives); with W actions drawn in
 * capitals, forwards past 9 draw '+' (core/grid.h). */
static char mark(const dl_sched_action *x, int split)
{
    dl__grid_kind k = x->op == DL_SCHED_F     ? DL__GRID_FWD
                      : x->op == DL_SCHED_OPT ? DL__GRID_OPT
                      : x->op == DL_SCHED_W   ? DL__GRID_WGT
                                              : DL__GRID_BWD; /* B and I */
    if (split && x->op == DL_SCHED_F && x->mb >= 10)
        return '+';
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
    int split = dl_sched_splits(s, -1);
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
                                q, i, dl_sched_action_str(s, &s->act[q][i], t, sizeof t), a, b);
            }
            for (int t = (int)floor(a + 0.5); t < (int)floor(b + 0.5); t++)
                row[t] = mark(&s->act[q][i], split);
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
    static const char *const names[] =
        {"custom",     "naive", "GPipe", "1F1B", "interleaved 1F1B", "async 1F1B", "TeraPipe",
         "1F1B split", "ZB-H1", "ZB-H2", "ZB-V", "DualPipeV"};
    dl__strbuf sb = {0};
    dl__sb_str(&sb, (int)s->kind >= 0 && s->kind <= DL_SCHED_DUALPIPEV ? names[s->kind] : "?");
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
