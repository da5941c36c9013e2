/* Fuzz target: --inject-fault's parser (lib/core/fault_spec.c, dl__fault_parse). Invariants
 * beyond "no crash, no sanitizer report": a refusal is one line naming --inject-fault; an
 * accepted spec has a rank >= 0, a place (a step >= 1, or a named communicator and a sequence
 * >= 1) and a kind (slow with 1..3600000 ms), and its text parses back to the same fault. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "distlab.h"
#include "core/fault_spec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (!s)
        return 0;
    memcpy(s, data, size);
    s[size] = '\0';
    dl__fault f, g;
    int rc = dl__fault_parse(s, &f);
    free(s);
    if (rc != DL_OK) {
        const char *e = dl_errmsg();
        if (!strstr(e, "--inject-fault") || strchr(e, '\n'))
            abort();
        return 0;
    }
    if (f.rank < 0 || f.n < 1 || (f.at != DL__AT_STEP && f.at != DL__AT_COLL) ||
        (f.at == DL__AT_COLL && (f.comm < DL__COMM_DP || f.comm > DL__COMM_WORLD)) ||
        f.kind < DL__FAULT_ERROR || f.kind > DL__FAULT_CRASH ||
        (f.kind == DL__FAULT_SLOW && (f.ms < 1 || f.ms > 3600000)))
        abort();
    char t[160];
    dl__fault_text(&f, t, sizeof t);
    if (dl__fault_parse(t, &g) != DL_OK || g.rank != f.rank || g.at != f.at || g.n != f.n ||
        g.kind != f.kind || (f.at == DL__AT_COLL && g.comm != f.comm) ||
        (f.kind == DL__FAULT_SLOW && g.ms != f.ms))
        abort();
    return 0;
}
