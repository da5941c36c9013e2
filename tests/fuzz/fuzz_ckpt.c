/* Fuzz target: the safetensors reader (lib/io/ckpt.c): dl_ckpt_inspect, then dl_ckpt_load_ex
 * into a small model's layout with the checksum verified and not. The bytes are a memfd, named
 * through /proc/self/fd. Invariants beyond "no crash, no sanitizer report": a refusal sets a
 * message naming the file; a load that succeeds leaves only finite parameters. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "distlab.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static dl_gpt_layout *l;
    static float *p;
    if (!l) {
        dl_gpt_config c = {16, 4, 1, 8, 2, 0}; /* vocab, seq, layers, d_model, heads, tie */
        if (dl_gpt_layout_create(&c, 1, 0, &l) != DL_OK)
            abort();
        p = malloc(l->numel * sizeof *p);
        if (!p)
            abort();
    }
    int fd = memfd_create("fuzz-ckpt", 0);
    if (fd < 0)
        return 0;
    if (size && write(fd, data, size) != (ssize_t)size) {
        close(fd);
        return 0;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    dl_ckpt_info info;
    if (dl_ckpt_inspect(path, &info) == DL_OK) {
        for (int v = 0; v < 2; v++) {
            int st = dl_ckpt_load_ex(path, l, p, 4,
                                     v ? DL_CKPT_VERIFY_ALWAYS : DL_CKPT_VERIFY_NEVER, NULL);
            if (st != DL_OK && !strstr(dl_errmsg(), path))
                abort();
            for (size_t i = 0; st == DL_OK && i < l->numel; i++)
                if (!isfinite(p[i]))
                    abort();
        }
    } else if (!strstr(dl_errmsg(), path)) {
        abort();
    }
    close(fd);
    return 0;
}
