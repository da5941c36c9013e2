/* --inject-fault's spec (core/fault_spec.h): key=value pairs, each key once; numbers in decimal
 * digits only (no sign, no hex), bounded so that nothing overflows. */
#include "config.h"
#include <stdio.h>
#include <string.h>
#include "distlab.h"
#include "core/fault_spec.h"

static const char *const comm_names[] = {"", "dp", "tp", "pp", "world"};

const char *dl__comm_label_name(int label)
{
    return label >= DL__COMM_DP && label <= DL__COMM_WORLD ? comm_names[label] : "?";
}

/* [s, s + n) as a decimal number in [lo, hi]: 0, else -1 */
static int number(const char *s, size_t n, long lo, long hi, long *out)
{
    long v = 0;
    if (n == 0 || n > 9)
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return v >= lo && v <= hi ? 0 : -1;
}

/* "step:N" or "coll:COMM:N" */
static int parse_at(const char *v, size_t n, dl__fault *f)
{
    if (n > 5 && strncmp(v, "step:", 5) == 0) {
        f->at = DL__AT_STEP;
        return number(v + 5, n - 5, 1, 999999999, &f->n);
    }
    if (n <= 5 || strncmp(v, "coll:", 5) != 0)
        return -1;
    const char *c = v + 5, *colon = memchr(c, ':', n - 5);
    if (!colon)
        return -1;
    for (int k = DL__COMM_DP; k <= DL__COMM_WORLD; k++)
        if ((size_t)(colon - c) == strlen(comm_names[k]) &&
            strncmp(c, comm_names[k], (size_t)(colon - c)) == 0)
            f->comm = (dl__comm_label)k;
    f->at = DL__AT_COLL;
    return f->comm ? number(colon + 1, n - (size_t)(colon + 1 - v), 1, 999999999, &f->n) : -1;
}

static int parse_kind(const char *v, size_t n, dl__fault *f)
{
    static const char *const kinds[] = {"", "error", "hang", "", "crash"};
    for (int k = DL__FAULT_ERROR; k <= DL__FAULT_CRASH; k++)
        if (kinds[k][0] && n == strlen(kinds[k]) && strncmp(v, kinds[k], n) == 0) {
            f->kind = (dl__fault_kind)k;
            return 0;
        }
    if (n > 5 && strncmp(v, "slow:", 5) == 0) {
        f->kind = DL__FAULT_SLOW;
        return number(v + 5, n - 5, 1, 3600000, &f->ms);
    }
    return -1;
}

static const char *const help =
    "rank=R,at=step:N|coll:dp|tp|pp|world:N,kind=error|hang|slow:MS|crash";

int dl__fault_parse(const char *s, dl__fault *f)
{
    memset(f, 0, sizeof *f);
    int seen[3] = {0, 0, 0};
    const char *p = s ? s : "";
    /* the messages below quote the text: keep them one line */
    for (const char *q = p; *q; q++)
        if ((unsigned char)*q < 0x20 || *q == 0x7f)
            return dl_error(DL_EINVAL, "--inject-fault: a control character (byte %d) at offset %d",
                            (unsigned char)*q, (int)(q - p));
    while (*p) {
        const char *end = strchr(p, ','), *eq;
        size_t len = end ? (size_t)(end - p) : strlen(p);
        eq = memchr(p, '=', len);
        size_t klen = eq ? (size_t)(eq - p) : 0, vlen = eq ? len - klen - 1 : 0;
        int key = !eq                                       ? -1
                  : klen == 4 && strncmp(p, "rank", 4) == 0 ? 0
                  : klen == 2 && strncmp(p, "at", 2) == 0   ? 1
                  : klen == 4 && strncmp(p, "kind", 4) == 0 ? 2
                                                            : -1;
        long r = 0;
        int bad = key < 0 || seen[key]++ ||
                  (key == 0   ? number(eq + 1, vlen, 0, 1 << 20, &r)
                   : key == 1 ? parse_at(eq + 1, vlen, f)
                              : parse_kind(eq + 1, vlen, f));
        if (bad)
            return dl_error(DL_EINVAL, "--inject-fault: '%.*s' is not one of %s (each once)",
                            (int)(len > 200 ? 200 : len), p, help);
        if (key == 0)
            f->rank = (int)r;
        p += len + (end != NULL);
        if (end && !*p)
            return dl_error(DL_EINVAL, "--inject-fault: an empty element at the end");
    }
    if (!seen[0] || !seen[1] || !seen[2])
        return dl_error(DL_EINVAL, "--inject-fault: '%.200s' lacks %s (it is %s)", s ? s : "",
                        !seen[0]   ? "rank="
                        : !seen[1] ? "at="
                                   : "kind=",
                        help);
    return DL_OK;
}

void dl__fault_text(const dl__fault *f, char *buf, unsigned n)
{
    char at[64], kind[32];
    if (f->at == DL__AT_STEP)
        snprintf(at, sizeof at, "step:%ld", f->n);
    else
        snprintf(at, sizeof at, "coll:%s:%ld", dl__comm_label_name(f->comm), f->n);
    static const char *const kinds[] = {"", "error", "hang", "slow", "crash"};
    if (f->kind == DL__FAULT_SLOW)
        snprintf(kind, sizeof kind, "slow:%ld", f->ms);
    else
        snprintf(kind, sizeof kind, "%s", kinds[f->kind]);
    snprintf(buf, n, "rank=%d,at=%s,kind=%s", f->rank, at, kind);
}
