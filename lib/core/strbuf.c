/* A growing string: see strbuf.h. */
#include "config.h"
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "distlab.h"
#include "core/strbuf.h"

/* Room for `more` bytes and the NUL; 0 on success, else oom is set. */
static int reserve(dl__strbuf *b, size_t more)
{
    if (b->oom)
        return -1;
    if (more > SIZE_MAX / 2 - 1 - b->n) { /* the doubling below could not reach it */
        b->oom = 1;
        return -1;
    }
    size_t need = b->n + more + 1;
    if (need <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) cap *= 2;
    char *p = realloc(b->p, cap);
    if (p == NULL) {
        b->oom = 1;
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

void dl__sb_add(dl__strbuf *b, const char *s, size_t len)
{
    if (reserve(b, len))
        return;
    memcpy(b->p + b->n, s, len);
    b->n += len;
    b->p[b->n] = '\0';
}

void dl__sb_str(dl__strbuf *b, const char *s) { dl__sb_add(b, s, strlen(s)); }

void dl__sb_printf(dl__strbuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (k < 0) {
        b->oom = 1;
        return;
    }
    if (reserve(b, (size_t)k))
        return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, b->cap - b->n, fmt, ap);
    va_end(ap);
    b->n += (size_t)k;
}

int dl__sb_finish(dl__strbuf *b, char **out, const char *what)
{
    if (b->p == NULL)
        dl__sb_add(b, "", 0);
    if (b->oom) {
        dl__sb_free(b);
        return dl_error(DL_ENOMEM, "%s: out of memory", what);
    }
    *out = b->p;
    b->p = NULL;
    b->n = b->cap = 0;
    return DL_OK;
}

void dl__sb_free(dl__strbuf *b)
{
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}
