/* Fuzz target: the apps' list splitter and number parsers (apps/common/cli.c). Invariants: a split
 * that succeeds gives no empty item and its items joined by ',' are the input; a number that
 * cli_parse_double accepts is finite, in range, and not hexadecimal. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 512)
        return 0;
    char s[520], buf[520], *items[64], joined[600];
    memcpy(s, data, size);
    s[size] = '\0';
    int n = 0;
    if (cli_split_list("--fuzz", s, buf, sizeof buf, items, 64, &n) == 0) {
        size_t at = 0;
        for (int i = 0; i < n; i++) {
            if (items[i][0] == '\0')
                abort();
            at += (size_t)snprintf(joined + at, sizeof joined - at, "%s%s", i ? "," : "", items[i]);
        }
        if (strcmp(joined, s) != 0)
            abort();
        for (int i = 0; i < n; i++) {
            double d;
            int iv;
            if (cli_parse_double("--fuzz", items[i], -1e6, 1e6, &d) == 0 &&
                (!(d >= -1e6 && d <= 1e6) || cli_is_hex(items[i])))
                abort();
            if (cli_parse_int("--fuzz", items[i], -1000, 1000, &iv) == 0 &&
                (iv < -1000 || iv > 1000))
                abort();
        }
    } else if (n < 0 || n > 64) {
        abort();
    }
    return 0;
}
