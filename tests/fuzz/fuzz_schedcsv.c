/* Fuzz target: the schedule file reader (lib/parallel/sched_csv.c, torch.distributed.pipelining's
 * CSV form). Invariants: an accepted file is a schedule the validator accepts; written back and
 * read again it gives the same actions and placement; a refusal leaves a message naming the
 * schedule file. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "distlab.h"
#include "distlab/sched.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int same(const dl_sched *a, const dl_sched *b)
{
    if (a->p != b->p || a->m != b->m || a->v != b->v)
        return 0;
    if (memcmp(a->vstage, b->vstage, sizeof(int) * (size_t)a->p * a->v) != 0)
        return 0;
    for (int q = 0; q < a->p; q++)
        if (a->len[q] != b->len[q] ||
            memcmp(a->act[q], b->act[q], sizeof(dl_sched_action) * (size_t)a->len[q]) != 0)
            return 0;
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 8192)
        return 0;
    for (int letters = 0; letters < 3; letters++) {
        dl_sched *s = NULL, *t = NULL;
        char note[256], *text = NULL;
        if (dl_sched_parse_csv((const char *)data, size, letters, 0, &s, note, sizeof note)) {
            if (s != NULL || strstr(dl_errmsg(), "schedule file") == NULL)
                abort();
            continue;
        }
        if (dl_sched_validate(s) != DL_OK || dl_sched_write_csv(s, &text) != DL_OK ||
            dl_sched_parse_csv(text, strlen(text), DL_SCHED_LETTERS_NEW, 0, &t, NULL, 0) != DL_OK ||
            !same(s, t))
            abort();
        free(text);
        dl_sched_free(s);
        dl_sched_free(t);
    }
    return 0;
}
