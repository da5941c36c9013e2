/* The pipeline grid's rows: see grid.h. */
#include "config.h"
#include "core/grid.h"

static const char IDLE[] = "\xC2\xB7"; /* U+00B7 MIDDLE DOT, the lecture's idle mark */

char dl__grid_mark(dl__grid_kind k, int mb)
{
    switch (k) {
    case DL__GRID_FWD:
        return mb >= 0 && mb < 10    ? (char)('0' + mb)
               : mb >= 10 && mb < 36 ? (char)('A' + mb - 10)
                                     : '+';
    case DL__GRID_BWD: return mb >= 0 && mb < 26 ? (char)('a' + mb) : '-';
    case DL__GRID_OPT: return '*';
    case DL__GRID_WGT: return mb >= 0 && mb < 26 ? (char)('A' + mb) : '~';
    default: return '=';
    }
}

int dl__grid_label_width(int rows)
{
    int wd = 1;
    for (int x = rows; x >= 10; x /= 10) wd++;
    return wd;
}

void dl__grid_label(dl__strbuf *b, int row, int wd) { dl__sb_printf(b, "GPU %-*d ", wd, row + 1); }

void dl__grid_row(dl__strbuf *b, int row, int wd, const char *cells, size_t T)
{
    dl__grid_label(b, row, wd);
    dl__sb_add(b, " ", 1);
    for (size_t t = 0; t < T; t++) {
        if (cells[t])
            dl__sb_add(b, &cells[t], 1);
        else
            dl__sb_add(b, IDLE, sizeof IDLE - 1);
    }
    dl__sb_add(b, "\n", 1);
}
