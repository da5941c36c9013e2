/* Fuzz target: dl_parse_size (lib/core/arena.c) on arbitrary text. Invariants beyond "no crash":
 * a string of decimal digits alone parses to exactly its value when it fits (and is "too
 * large" when it does not); a K suffix multiplies by 1024. Built with libFuzzer
 * (tests/fuzz/run.sh) and as a replay of the committed corpus in `make check`. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "distlab.h"
#include "core/arena.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 64)
        return 0;
    char s[80], k[82];
    memcpy(s, data, size);
    s[size] = '\0';
    uint64_t v = 0, w = 0;
    int st = dl_parse_size(s, &v);
    size_t nd = strspn(s, "0123456789");
    if (size > 0 && nd == size && strlen(s) == size) {
        /* digits only: the value is the number, or it overflows */
        uint64_t ref = 0;
        int over = 0;
        for (size_t i = 0; i < nd; i++) {
            unsigned d = (unsigned)(s[i] - '0');
            if (ref > (UINT64_MAX - d) / 10)
                over = 1;
            ref = ref * 10 + d;
        }
        if (over ? st == DL_OK : (st != DL_OK || v != ref))
            abort();
        snprintf(k, sizeof k, "%sK", s);
        int sk = dl_parse_size(k, &w);
        if (!over && ref <= UINT64_MAX >> 10 && (sk != DL_OK || w != ref << 10))
            abort();
        if (!over && ref > UINT64_MAX >> 10 && sk == DL_OK)
            abort();
    }
    return 0;
}
