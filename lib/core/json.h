/* Private: JSON string escaping, the one copy the library and the apps write strings with.
 * '"' and '\\' are escaped, bytes from 0x80 up pass through (UTF-8 stays UTF-8), and the control
 * characters (below 0x20) are treated as the caller's output always has: */
#ifndef DISTLAB_CORE_JSON_H
#define DISTLAB_CORE_JSON_H

#include <stdio.h>
#include "core/strbuf.h"

typedef enum dl__json_ctrl {
    DL__JSON_CTRL_U,    /* as \u00XX (checkpoint header, traces, bench and plan JSON) */
    DL__JSON_CTRL_NL,   /* "\n" for a newline, \u00XX for the others (the lecture's JSON) */
    DL__JSON_CTRL_DROP, /* left out (the trainer's data path, the bench machine record) */
} dl__json_ctrl;

/* The escape of byte c: writes it into e (NUL-terminated) and returns its length, 0 when it is
 * dropped. */
size_t dl__json_escape(unsigned char c, dl__json_ctrl ctrl, char e[8]);
/* s as a quoted JSON string (NULL: ""). */
void dl__json_fputs(FILE *f, const char *s, dl__json_ctrl ctrl);
void dl__sb_json(dl__strbuf *b, const char *s, dl__json_ctrl ctrl);

#endif
