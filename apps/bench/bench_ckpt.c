/* distlab-bench ckpt: the sides of full-state checkpoint throughput (bench_ckpt.h). */
#include <stdio.h>
#include <string.h>
#include "cli.h"
#include "bench_ckpt.h"

static void usage(FILE *f)
{
    fprintf(f, "Usage: distlab-bench ckpt save|load [OPTIONS]\n"
               "\n"
               "Full-state checkpoint throughput against dd on the same directory:\n"
               "  save     writing one (inline and asynchronously) and the async saves' stall\n"
               "  load     reading a checkpoint under its own and another layout\n"
               "`distlab-bench ckpt SIDE --help` for its options.\n");
}

int bench_ckpt_main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? CLI_EXIT_USAGE : CLI_EXIT_OK;
    }
    if (strcmp(argv[1], "save") == 0)
        return bench_ckpt_save_main(argc - 1, argv + 1);
    if (strcmp(argv[1], "load") == 0)
        return bench_ckpt_load_main(argc - 1, argv + 1);
    cli_error("ckpt: unknown side '%s' (save, load; see distlab-bench ckpt --help)", argv[1]);
    return CLI_EXIT_USAGE;
}
