/* Private: the lecture's pipeline grid, one text row per GPU and one cell per time unit, drawn
 * from a schedule's simulation (lib/parallel/sched.c) and from a measured trace (lib/io/trace.c):
 *     GPU 1  01234567········abcdefgh
 * A forward of micro-batch m is 0-9 then A-Z ('+' beyond), its backward a-z ('-' beyond), an
 * optimizer step '*', a collective drawn by itself '='; an idle cell is U+00B7 MIDDLE DOT. A split
 * backward draws its input part I as a backward and its weight part W in capitals ('A'-'Z'), so
 * schedules with W draw forwards from micro-batch 10 on as '+' (sched_show.c). */
#ifndef DISTLAB_CORE_GRID_H
#define DISTLAB_CORE_GRID_H

#include <stddef.h>
#include "core/strbuf.h"

typedef enum dl__grid_kind {
    DL__GRID_FWD,
    DL__GRID_BWD,
    DL__GRID_OPT,
    DL__GRID_COMM,
    DL__GRID_WGT /* a split backward's weight part W: 'A'-'Z' ('~' beyond) */
} dl__grid_kind;

/* The cell mark of an action of kind k on micro-batch mb. */
char dl__grid_mark(dl__grid_kind k, int mb);
/* Width of the row numbers 1..rows (digits of rows). */
int dl__grid_label_width(int rows);
/* "GPU N " (N = row + 1, left-aligned in wd columns). */
void dl__grid_label(dl__strbuf *b, int row, int wd);
/* A whole grid row: the label, a space, the T cells (0: idle) and a newline. */
void dl__grid_row(dl__strbuf *b, int row, int wd, const char *cells, size_t T);

#endif
