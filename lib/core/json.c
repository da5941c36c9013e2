/* JSON string escaping: see json.h. */
#include "config.h"
#include <stdio.h>
#include "core/json.h"

size_t dl__json_escape(unsigned char c, dl__json_ctrl ctrl, char e[8])
{
    if (c == '"' || c == '\\') {
        e[0] = '\\', e[1] = (char)c, e[2] = '\0';
        return 2;
    }
    if (c >= 0x20) {
        e[0] = (char)c, e[1] = '\0';
        return 1;
    }
    if (ctrl == DL__JSON_CTRL_DROP) {
        e[0] = '\0';
        return 0;
    }
    if (ctrl == DL__JSON_CTRL_NL && c == '\n') {
        e[0] = '\\', e[1] = 'n', e[2] = '\0';
        return 2;
    }
    return (size_t)snprintf(e, 8, "\\u%04x", c);
}

void dl__json_fputs(FILE *f, const char *s, dl__json_ctrl ctrl)
{
    char e[8];
    fputc('"', f);
    for (const unsigned char *c = (const unsigned char *)s; c && *c; c++)
        if (dl__json_escape(*c, ctrl, e))
            fputs(e, f);
    fputc('"', f);
}

void dl__sb_json(dl__strbuf *b, const char *s, dl__json_ctrl ctrl)
{
    char e[8];
    dl__sb_add(b, "\"", 1);
    for (const unsigned char *c = (const unsigned char *)s; c && *c; c++)
        dl__sb_add(b, e, dl__json_escape(*c, ctrl, e));
    dl__sb_add(b, "\"", 1);
}
