/* Fuzz target: the full-state checkpoint's manifest reader (lib/io/ckdir_load.c,
 * dl__ckd_parse: jansson, then the structural checks). Invariants beyond "no crash, no sanitizer
 * report": a refusal is one line naming what was read; an accepted manifest has the format, the
 * version this build reads, a step, files each with a plain name, a rank, a size and a CRC32C,
 * and tensors, and the file lookup by rank finds only entries of the list. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "distlab.h"
#include "io/ckdir.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_t *m = NULL;
    int rc = dl__ckd_parse((const char *)data, size, "fuzz-manifest", &m);
    if (rc != DL_OK) {
        const char *e = dl_errmsg();
        if (m || !strstr(e, "fuzz-manifest") || strchr(e, '\n'))
            abort();
        return 0;
    }
    json_t *files = json_object_get(m, "files");
    if (json_integer_value(json_object_get(m, "version")) != DL_CKD_VERSION ||
        json_array_size(files) == 0 || !json_is_object(json_object_get(m, "tensors")))
        abort();
    for (size_t i = 0; i < json_array_size(files); i++) {
        json_t *f = json_array_get(files, i);
        const char *name = json_string_value(json_object_get(f, "name"));
        if (!name || strchr(name, '/'))
            abort();
        json_t *g = dl__ckd_file_of(m, (int)json_integer_value(json_object_get(f, "rank")));
        if (!g || json_array_size(files) == 0)
            abort();
    }
    json_decref(m);
    return 0;
}
