/* distlab-bench: the timing harness. Subcommands `coll` (nccl-tests-style collective benchmark,
 * the default) and `topo` (topology and placement report). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cli.h"
#include "bench_coll.h"
#include "bench_topo.h"

/* Set once we re-exec'd ourselves, so that a failing or odd environment cannot loop. */

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: distlab-bench [SUBCOMMAND] [OPTIONS]\n"
            "\n"
            "The distlab timing harness: rank threads pinned to cores act as GPUs.\n"
            "\n"
            "Subcommands:\n"
            "  coll   collective benchmark in the style of nccl-tests (the default: running\n"
            "         distlab-bench alone, or with coll options only, runs it)\n"
            "  topo   the machine's topology and the rank -> PU -> node placement\n"
            "\n"
            "Options:\n"
            "  -h, --help      this help; `distlab-bench SUBCOMMAND --help` for a subcommand's\n"
            "  -V, --version   print the version\n"
            "\n"
            "OpenBLAS runs one thread per rank: unless OPENBLAS_NUM_THREADS is 1, distlab-bench sets it\n"
            "to 1 and restarts itself so that OpenBLAS sees it when it loads.\n");
}

int main(int argc, char **argv)
{
    cli_openblas_single_thread(argv);

    if (argc < 2) return bench_coll_main(argc, argv); /* no subcommand: coll at its defaults */

    const char *sub = argv[1];
    if (strcmp(sub, "-h") == 0 || strcmp(sub, "--help") == 0 || strcmp(sub, "help") == 0) {
        if (strcmp(sub, "help") == 0 && argc > 2) {
            /* `distlab-bench help coll` == `distlab-bench coll --help` */
            char *hargv[] = {argv[2], "--help", NULL};
            if (strcmp(argv[2], "coll") == 0) return bench_coll_main(2, hargv);
            if (strcmp(argv[2], "topo") == 0) return bench_topo_main(2, hargv);
            cli_error("unknown subcommand '%s' (subcommands: coll, topo)", argv[2]);
            return CLI_EXIT_USAGE;
        }
        usage(stdout);
        return CLI_EXIT_OK;
    }
    if (strcmp(sub, "-V") == 0 || strcmp(sub, "--version") == 0) {
        cli_print_version(stdout);
        return CLI_EXIT_OK;
    }
    if (strcmp(sub, "coll") == 0) return bench_coll_main(argc - 1, argv + 1);
    if (strcmp(sub, "topo") == 0) return bench_topo_main(argc - 1, argv + 1);
    if (sub[0] == '-') {
        /* Options without a subcommand belong to coll (`distlab-bench -b 8 -e 1M`, as one would
         * call an nccl-tests binary). argv[0] stays the program name for coll's parser. */
        return bench_coll_main(argc, argv);
    }
    cli_error("unknown subcommand '%s' (subcommands: coll, topo; see --help)", sub);
    return CLI_EXIT_USAGE;
}
