/* Schedules in torch.distributed.pipelining's CSV form, read and written (include/distlab/sched.h):
 * one row per rank, each cell one action "[stage][type][micro-batch]" of a global virtual stage.
 * The reader builds the schedule (the stages of a rank's row give the placement), appends the
 * flush's optimizer step to every rank and validates it, reporting a refusal by row and cell. */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "distlab/error.h"
#include "distlab/sched.h"
#include "parallel/sched_priv.h"
#include "core/strbuf.h"

enum { T_F, T_I, T_W, T_B, T_BW, T_COMM }; /* a cell's action type as written */
enum { MAX_MB = 1 << 20, MAX_STAGE = 4096, MAX_CELL = 64 };

typedef struct raw {
    int g, type, mb, row, cell; /* row and cell 1-based */
    char tok[MAX_CELL];
} raw;

typedef struct csv {
    raw *a;
    int n, cap, rows, ncomm, overlap;
} csv;

static int bad_cell(int row, int cell, const char *tok, const char *why)
{
    return dl_error(DL_EINVAL, "schedule file: row %d, cell %d ('%s'): %s", row, cell, tok, why);
}

static int add(csv *c, int g, int type, int mb, int row, int cell, const char *tok)
{
    if (c->n == c->cap) {
        int nc = c->cap ? 2 * c->cap : 64;
        raw *na = realloc(c->a, sizeof *na * (size_t)nc);
        if (!na)
            return dl_error(DL_ENOMEM, "schedule file: out of memory");
        c->a = na, c->cap = nc;
    }
    raw *r = &c->a[c->n++];
    *r = (raw){g, type, mb, row, cell, ""};
    snprintf(r->tok, sizeof r->tok, "%s", tok);
    return DL_OK;
}

/* One action "2F0", "1UNSHARD", "0REDUCE_GRAD" (s: NUL-terminated, trimmed). */
static int parse_action(csv *c, const char *s, int row, int cell, const char *tok)
{
    static const struct {
        const char *name;
        int type, needs_mb;
    } types[] = {{"F", T_F, 1},          {"I", T_I, 1},          {"W", T_W, 1},
                 {"B", T_B, 1},          {"BW", T_BW, 1},        {"SEND_F", T_COMM, 1},
                 {"RECV_F", T_COMM, 1},  {"SEND_B", T_COMM, 1},  {"RECV_B", T_COMM, 1},
                 {"UNSHARD", T_COMM, 0}, {"RESHARD", T_COMM, 0}, {"REDUCE_GRAD", T_COMM, 0}};
    const char *p = s;
    long g = 0, mb = -1;
    if (!isdigit((unsigned char)*p))
        return bad_cell(row, cell, tok, "an action starts with its stage number");
    for (; isdigit((unsigned char)*p); p++)
        if ((g = g * 10 + (*p - '0')) >= MAX_STAGE)
            return bad_cell(row, cell, tok, "stage number too large");
    const char *t0 = p;
    while (isupper((unsigned char)*p) || *p == '_') p++;
    size_t tl = (size_t)(p - t0);
    if (isdigit((unsigned char)*p))
        for (mb = 0; isdigit((unsigned char)*p); p++)
            if ((mb = mb * 10 + (*p - '0')) >= MAX_MB)
                return bad_cell(row, cell, tok, "micro-batch number too large");
    if (*p != '\0')
        return bad_cell(row, cell, tok, "malformed action (want e.g. 2F0, 1I3, 0W5)");
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++)
        if (strlen(types[k].name) == tl && strncmp(types[k].name, t0, tl) == 0) {
            if (types[k].needs_mb && types[k].type != T_COMM && mb < 0)
                return bad_cell(row, cell, tok, "the action needs a micro-batch number");
            if (types[k].type == T_COMM) {
                c->ncomm++;
                return DL_OK;
            }
            return add(c, (int)g, types[k].type, (int)mb, row, cell, tok);
        }
    return bad_cell(row, cell, tok, "unknown action type (F, I, W, B, BW or a communication)");
}

/* A cell: empty (idle), one action, or "(aFx;bBy)OVERLAP_F_B" (run as the two in order). */
static int parse_cell(csv *c, char *s, int row, int cell)
{
    while (isspace((unsigned char)*s)) s++;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1])) s[--n] = '\0';
    if (n >= 2 && s[0] == '"' && s[n - 1] == '"')
        s[--n] = '\0', s++, n--;
    char tok[MAX_CELL];
    snprintf(tok, sizeof tok, "%s", s);
    if (n == 0)
        return DL_OK;
    if (s[0] != '(')
        return parse_action(c, s, row, cell, tok);
    static const char suffix[] = ")OVERLAP_F_B";
    size_t k = sizeof suffix - 1;
    if (n < k + 1 || strcmp(s + n - k, suffix) != 0)
        return bad_cell(row, cell, tok, "malformed overlap (want (aFx;bBy)OVERLAP_F_B)");
    s[n - k] = '\0';
    c->overlap = 1;
    int rc = DL_OK;
    for (char *part = s + 1, *semi; rc == DL_OK && part; part = semi ? semi + 1 : NULL) {
        semi = strchr(part, ';');
        if (semi)
            *semi = '\0';
        rc = parse_action(c, part, row, cell, tok);
    }
    return rc;
}

static int parse_text(csv *c, const char *text, size_t len)
{
    char *buf = malloc(len + 1);
    if (!buf)
        return dl_error(DL_ENOMEM, "schedule file: out of memory");
    memcpy(buf, text, len);
    buf[len] = '\0';
    if (memchr(text, '\0', len)) {
        free(buf);
        return dl_error(DL_EINVAL, "schedule file: a NUL byte (not a text file)");
    }
    int rc = DL_OK, row = 0, last = 0;
    for (char *line = buf, *nl; rc == DL_OK && line; line = nl ? nl + 1 : NULL) {
        nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        size_t n = strlen(line);
        if (n && line[n - 1] == '\r')
            line[--n] = '\0';
        row++;
        if (n == 0)
            continue;
        if (row > last + 1 && last > 0)
            rc = dl_error(DL_EINVAL, "schedule file: row %d is empty (every rank has a row)",
                          last + 1);
        last = row;
        int cell = 0;
        for (char *x = line, *comma; rc == DL_OK && x; x = comma ? comma + 1 : NULL) {
            comma = strchr(x, ',');
            if (comma)
                *comma = '\0';
            rc = parse_cell(c, x, row, ++cell);
        }
    }
    free(buf);
    if (rc == DL_OK && last == 0)
        rc = dl_error(DL_EINVAL, "schedule file: no rows");
    c->rows = last;
    return rc;
}

/* The letters: explicit, or detected as the issue describes torch's two generations. */
static int detect_old(const csv *c)
{
    int any_i = c->overlap, any_bw = 0;
    for (int k = 0; k < c->n; k++) any_i |= c->a[k].type == T_I, any_bw |= c->a[k].type == T_BW;
    if (any_i)
        return 0;
    if (any_bw)
        return 1;
    for (int k = 0; k < c->n; k++) /* a B and a W of the same (stage, mb): B is the input part */
        for (int j = 0; c->a[k].type == T_B && j < c->n; j++)
            if (c->a[j].type == T_W && c->a[j].g == c->a[k].g && c->a[j].mb == c->a[k].mb)
                return 1;
    return 0;
}

static int op_of(const raw *r, int old, int *op)
{
    static const char *const why[2] =
        {"BW is the older letters' full backward, but this file uses the newer ones (I present, "
         "or --schedule-letters new)",
         "I is the newer letters' input gradient, but this file uses the older ones (BW present, "
         "or --schedule-letters old)"};
    switch (r->type) {
    case T_F: *op = DL_SCHED_F; return DL_OK;
    case T_W: *op = DL_SCHED_W; return DL_OK;
    case T_B: *op = old ? DL_SCHED_I : DL_SCHED_B; return DL_OK;
    case T_I:
        if (old)
            return bad_cell(r->row, r->cell, r->tok, why[1]);
        *op = DL_SCHED_I;
        return DL_OK;
    default:
        if (!old)
            return bad_cell(r->row, r->cell, r->tok, why[0]);
        *op = DL_SCHED_B;
        return DL_OK;
    }
}

/* Placement from the rows: each rank's stages in order are its chunks. */
static int place(const csv *c, int **vstage, int *v_out, int *holder_out)
{
    int p = c->rows, maxg = -1;
    for (int k = 0; k < c->n; k++) maxg = c->a[k].g > maxg ? c->a[k].g : maxg;
    int ng = maxg + 1, *holder = holder_out;
    for (int g = 0; g < ng; g++) holder[g] = -1;
    for (int k = 0; k < c->n; k++) {
        const raw *r = &c->a[k];
        if (holder[r->g] >= 0 && holder[r->g] != r->row - 1) {
            char why[96];
            snprintf(why, sizeof why, "stage %d is on two ranks (rows %d and %d)", r->g,
                     holder[r->g] + 1, r->row);
            return bad_cell(r->row, r->cell, r->tok, why);
        }
        holder[r->g] = r->row - 1;
    }
    for (int g = 0; g < ng; g++)
        if (holder[g] < 0)
            return dl_error(DL_EINVAL, "schedule file: no row runs stage %d (stages 0..%d)", g,
                            ng - 1);
    if (ng % p)
        return dl_error(DL_EINVAL,
                        "schedule file: %d stages over %d rows: every rank must hold as many", ng,
                        p);
    int v = ng / p, *vs = malloc(sizeof(int) * (size_t)ng), *cnt = calloc((size_t)p, sizeof(int));
    if (!vs || !cnt) {
        free(vs), free(cnt);
        return dl_error(DL_ENOMEM, "schedule file: out of memory");
    }
    int rc = DL_OK;
    for (int g = 0; g < ng && rc == DL_OK; g++) {
        int q = holder[g];
        if (cnt[q] == v)
            rc = dl_error(DL_EINVAL,
                          "schedule file: row %d holds more than %d stages (%d stages over %d "
                          "rows)",
                          q + 1, v, ng, p);
        else
            vs[q * v + cnt[q]++] = g; /* stages in increasing order: chunks in pipeline order */
    }
    free(cnt);
    if (rc) {
        free(vs);
        return rc;
    }
    *vstage = vs;
    *v_out = v;
    return DL_OK;
}

/* The schedule from the actions; *cells[s][i] the raw index of action i of stage s. */
static int build(const csv *c, int letters, int mem_limit, dl_sched **out, int **where)
{
    int old = letters == DL_SCHED_LETTERS_OLD   ? 1
              : letters == DL_SCHED_LETTERS_NEW ? 0
                                                : detect_old(c);
    int m = 0, v = 0, *vs = NULL, rc = DL_OK;
    for (int k = 0; k < c->n; k++) m = c->a[k].mb + 1 > m ? c->a[k].mb + 1 : m;
    if (c->n == 0)
        return dl_error(DL_EINVAL, "schedule file: no computation action");
    int *holder = malloc(sizeof(int) * MAX_STAGE);
    if (!holder)
        return dl_error(DL_ENOMEM, "schedule file: out of memory");
    rc = place(c, &vs, &v, holder);
    free(holder);
    if (rc)
        return rc;
    dl_sched *s = NULL;
    if ((rc = dl_sched_new(c->rows, m, v, &s)) == DL_OK)
        rc = dl_sched_set_placement(s, vs);
    for (int k = 0; rc == DL_OK && k < c->n; k++) {
        const raw *r = &c->a[k];
        int op = DL_SCHED_F, q = r->row - 1, ch = 0;
        while (vs[q * v + ch] != r->g) ch++;
        if ((rc = op_of(r, old, &op)) == DL_OK) {
            where[q][s->len[q]] = k;
            rc = dl_sched_push(s, q, op, r->mb, ch);
        }
    }
    for (int q = 0; rc == DL_OK && q < c->rows; q++) {
        s->mem_limit[q] = mem_limit > 0 ? mem_limit : 0;
        where[q][s->len[q]] = -1;
        rc = dl_sched_push(s, q, DL_SCHED_OPT, -1, -1);
    }
    free(vs);
    if (rc)
        dl_sched_free(s);
    else
        *out = s;
    return rc;
}

int dl_sched_parse_csv(const char *text, size_t len, int letters, int mem_limit, dl_sched **out,
                       char *note, size_t notecap)
{
    if (out == NULL || (text == NULL && len))
        return dl_error(DL_EINVAL, "schedule file: null argument");
    *out = NULL;
    if (note && notecap)
        note[0] = '\0';
    csv c = {0};
    int rc = parse_text(&c, text ? text : "", len);
    int **where = NULL;
    if (rc == DL_OK) {
        where = calloc((size_t)c.rows, sizeof *where);
        for (int q = 0; where && q < c.rows; q++)
            if (!(where[q] = malloc(sizeof(int) * (size_t)(c.n + 1))))
                rc = dl_error(DL_ENOMEM, "schedule file: out of memory");
        if (!where)
            rc = dl_error(DL_ENOMEM, "schedule file: out of memory");
    }
    dl_sched *s = NULL;
    if (rc == DL_OK)
        rc = build(&c, letters, mem_limit, &s, where);
    int bq = -1, bi = -1;
    if (rc == DL_OK && (rc = dl_sched_check(s, &bq, &bi)) != DL_OK) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", dl_errmsg());
        /* one line: the row and cell say where (the validator's context lines dropped) */
        char *nl = strchr(msg, '\n');
        if (nl)
            *nl = '\0';
        const char *why = strncmp(msg, "schedule: ", 10) == 0 ? msg + 10 : msg;
        int k = bq >= 0 ? where[bq][bi] : -1;
        if (k >= 0)
            bad_cell(c.a[k].row, c.a[k].cell, c.a[k].tok, why);
        else
            dl_error(rc, "schedule file: %s (stage s is row s + 1)", why);
        dl_sched_free(s);
        s = NULL;
    }
    if (rc == DL_OK && note && notecap && c.ncomm)
        snprintf(note, notecap,
                 "note: the schedule file's %d communication action%s (SEND_F, RECV_B, UNSHARD, "
                 "REDUCE_GRAD, ...) ignored: the engine posts its own transfers",
                 c.ncomm, c.ncomm == 1 ? "" : "s");
    for (int q = 0; where && q < c.rows; q++) free(where[q]);
    free(where);
    free(c.a);
    *out = s;
    return rc;
}

int dl_sched_load_csv(const char *path, int letters, int mem_limit, dl_sched **out, char *note,
                      size_t notecap)
{
    if (out)
        *out = NULL;
    FILE *f = path ? fopen(path, "rb") : NULL;
    if (!f)
        return dl_error(DL_ESYS, "schedule file %s: %s", path ? path : "(null)", strerror(errno));
    dl__strbuf sb = {0};
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0 && sb.n < (64u << 20)) dl__sb_add(&sb, buf, n);
    int err = ferror(f);
    fclose(f);
    if (err || sb.oom || sb.n >= (64u << 20)) {
        dl__sb_free(&sb);
        return dl_error(err ? DL_ESYS : DL_EINVAL, "schedule file %s: %s", path,
                        err ? "read error" : "too large (over 64 MiB) or out of memory");
    }
    int rc = dl_sched_parse_csv(sb.p ? sb.p : "", sb.n, letters, mem_limit, out, note, notecap);
    dl__sb_free(&sb);
    if (rc) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", dl_errmsg());
        rc = dl_error(rc, "%s: %s", path, msg);
    }
    return rc;
}

int dl_sched_write_csv(const dl_sched *s, char **out)
{
    static const char letter[] =
        {[DL_SCHED_F] = 'F', [DL_SCHED_B] = 'B', [DL_SCHED_I] = 'I', [DL_SCHED_W] = 'W'};
    if (out == NULL)
        return dl_error(DL_EINVAL, "schedule CSV: null output");
    *out = NULL;
    int rc = dl_sched_validate(s);
    if (rc)
        return rc;
    if (!s->flush || s->seq_chunks > 1)
        return dl_error(DL_EINVAL,
                        "schedule CSV: %s has no CSV form (the form has no optimizer step inside "
                        "a step, nor token chunks)",
                        dl_sched_kind_name(s->kind));
    dl__strbuf sb = {0};
    for (int q = 0; q < s->p; q++) {
        int cell = 0;
        for (int i = 0; i < s->len[q]; i++) {
            const dl_sched_action *a = &s->act[q][i];
            if (a->op == DL_SCHED_OPT)
                continue;
            dl__sb_printf(&sb, "%s%d%c%d", cell++ ? "," : "", s->vstage[q * s->v + a->chunk],
                          letter[a->op], a->mb);
        }
        dl__sb_str(&sb, "\n");
    }
    return dl__sb_finish(&sb, out, "schedule CSV");
}

int dl_sched_save_csv(const dl_sched *s, const char *path)
{
    char *text = NULL;
    int rc = dl_sched_write_csv(s, &text);
    if (rc)
        return rc;
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(text);
        return dl_error(DL_ESYS, "schedule file %s: %s", path, strerror(errno));
    }
    size_t n = strlen(text);
    int bad = fwrite(text, 1, n, f) != n;
    bad |= fclose(f) != 0;
    free(text);
    return bad ? dl_error(DL_ESYS, "schedule file %s: write error", path) : DL_OK;
}
