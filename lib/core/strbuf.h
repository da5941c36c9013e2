/* Private: a growing NUL-terminated string, for the renderers and headers the library builds
 * in memory (schedule grids, trace grids, the checkpoint header). An allocation failure or a
 * size overflow sets `oom`; every later call is then a no-op and dl__sb_finish reports it once,
 * so a builder checks for errors only at the end. Start from a zeroed struct. */
#ifndef DISTLAB_CORE_STRBUF_H
#define DISTLAB_CORE_STRBUF_H

#include <stddef.h>

typedef struct dl__strbuf {
    char *p;       /* NULL until the first byte (then always NUL-terminated) */
    size_t n, cap; /* length without the NUL; allocated size */
    int oom;       /* 1 once an allocation or a size failed */
} dl__strbuf;

/* Append len bytes of s. */
void dl__sb_add(dl__strbuf *b, const char *s, size_t len);
/* Append the string s. */
void dl__sb_str(dl__strbuf *b, const char *s);
/* Append printf-formatted text (any length). */
void dl__sb_printf(dl__strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Hand the string to *out (the caller frees it; "" when nothing was added) and return DL_OK;
 * after a failure free it, leave *out alone and return DL_ENOMEM with "WHAT: out of memory". */
int dl__sb_finish(dl__strbuf *b, char **out, const char *what);
/* Free the string (a builder abandoned on another error). */
void dl__sb_free(dl__strbuf *b);

#endif
