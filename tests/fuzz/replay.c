/* Runs a fuzz target (tests/fuzz/fuzz_*.c) over files given on the command line, as libFuzzer
 * would over its corpus: `make check` replays the committed corpus and every crash reproducer
 * with the normal build, so a fixed crash stays fixed. Exit 0, or the target aborts. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        FILE *f = fopen(argv[i], "rb");
        if (!f) {
            fprintf(stderr, "replay: cannot open %s\n", argv[i]);
            return 1;
        }
        static uint8_t buf[1 << 20];
        size_t n = fread(buf, 1, sizeof buf, f);
        fclose(f);
        LLVMFuzzerTestOneInput(buf, n);
    }
    printf("replay: %d inputs\n", argc - 1);
    return 0;
}
