/* distlab-bench: the timing harness. Subcommands `coll` (nccl-tests-style collective benchmark,
 * the default), `topo` (topology and placement report), `gemm` (GEMM contention), `stream`
 * (memory bandwidth) and `overlap` (communication hidden behind computation). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cli.h"
#include "bench_coll.h"
#include "bench_topo.h"
#include "bench_util.h"
#include "bench_pipeline.h"
#include "bench_ckpt.h"
#include "trace_plot.h"

/* Set once we re-exec'd ourselves, so that a failing or odd environment cannot loop. */

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: distlab-bench [SUBCOMMAND] [OPTIONS]\n"
            "\n"
            "The distlab timing harness: rank threads pinned to cores act as GPUs.\n"
            "\n"
            "Subcommands:\n"
            "  coll     collective benchmark in the style of nccl-tests (the default: running\n"
            "           distlab-bench alone, or with coll options only, runs it)\n"
            "  topo     the machine's topology and the rank -> PU -> node placement\n"
            "  gemm     GEMM FLOP/s per rank with 1 ... N ranks at once: the contention factor\n"
            "  stream   memory bandwidth (copy, triad), 1 ... N threads, compact and scatter\n"
            "  overlap  all-reduce alone, GEMMs alone, both at once: slowdowns, fraction hidden\n"
            "  contention  time in collectives split into waiting and working; futex sleeps\n"
            "  scaling  the trainer's strong and weak scaling over dp and tp, strong over pp\n"
            "  moe      mixture of experts: the capacity factor's drops, imbalance and idle time\n"
            "  overhead the harness's own cost per training step (timestamps, trace events)\n"
            "  pipeline measured pipeline bubbles of the schedules vs the lecture and the "
            "simulator\n"
            "  ckpt     full-state checkpoints: save (throughput vs dd, async saves' stall) and "
            "load\n"
            "           (the resharding load vs dd)\n"
            "\n"
            "Options:\n"
            "  -h, --help      this help; `distlab-bench SUBCOMMAND --help` for a subcommand's\n"
            "  -V, --version   print the version\n"
            "\n"
            "OpenBLAS runs one thread per rank: unless OPENBLAS_NUM_THREADS is 1, distlab-bench "
            "sets it\n"
            "to 1 and restarts itself so that OpenBLAS sees it when it loads; so too, unless\n"
            "OPENBLAS_CORETYPE is set, with OPENBLAS_CORETYPE set to the CPU's kernel class when\n"
            "OpenBLAS picked a lower one (a CPU newer than OpenBLAS).\n");
}

int main(int argc, char **argv)
{
    cli_ignore_sigxfsz();
    cli_blas_setup(argv);

    if (argc < 2)
        return bench_coll_main(argc, argv); /* no subcommand: coll at its defaults */

    const char *sub = argv[1];
    if (strcmp(sub, "-h") == 0 || strcmp(sub, "--help") == 0 || strcmp(sub, "help") == 0) {
        if (strcmp(sub, "help") == 0 && argc > 2) {
            /* `distlab-bench help coll` == `distlab-bench coll --help` */
            char *hargv[] = {argv[2], "--help", NULL};
            if (strcmp(argv[2], "coll") == 0)
                return bench_coll_main(2, hargv);
            if (strcmp(argv[2], "topo") == 0)
                return bench_topo_main(2, hargv);
            if (strcmp(argv[2], "gemm") == 0)
                return bench_gemm_main(2, hargv);
            if (strcmp(argv[2], "stream") == 0)
                return bench_stream_main(2, hargv);
            if (strcmp(argv[2], "overlap") == 0)
                return bench_overlap_main(2, hargv);
            if (strcmp(argv[2], "contention") == 0)
                return bench_contention_main(2, hargv);
            if (strcmp(argv[2], "scaling") == 0)
                return bench_scaling_main(2, hargv);
            if (strcmp(argv[2], "overhead") == 0)
                return bench_overhead_main(2, hargv);
            if (strcmp(argv[2], "pipeline") == 0)
                return bench_pipeline_main(2, hargv);
            if (strcmp(argv[2], "ckpt") == 0)
                return bench_ckpt_main(2, hargv);
            if (strcmp(argv[2], "moe") == 0)
                return bench_moe_main(2, hargv);
            cli_error("unknown subcommand '%s' (subcommands: coll, topo, gemm, stream, overlap, "
                      "contention, scaling, overhead, pipeline, ckpt, moe)",
                      argv[2]);
            return CLI_EXIT_USAGE;
        }
        usage(stdout);
        return CLI_EXIT_OK;
    }
    if (strcmp(sub, "-V") == 0 || strcmp(sub, "--version") == 0) {
        cli_print_version(stdout);
        return CLI_EXIT_OK;
    }
    if (strcmp(sub, "coll") == 0)
        return bench_coll_main(argc - 1, argv + 1);
    if (strcmp(sub, "topo") == 0)
        return bench_topo_main(argc - 1, argv + 1);
    if (strcmp(sub, "gemm") == 0)
        return bench_gemm_main(argc - 1, argv + 1);
    if (strcmp(sub, "stream") == 0)
        return bench_stream_main(argc - 1, argv + 1);
    if (strcmp(sub, "overlap") == 0)
        return bench_overlap_main(argc - 1, argv + 1);
    if (strcmp(sub, "contention") == 0)
        return bench_contention_main(argc - 1, argv + 1);
    if (strcmp(sub, "scaling") == 0)
        return bench_scaling_main(argc - 1, argv + 1);
    if (strcmp(sub, "overhead") == 0)
        return bench_overhead_main(argc - 1, argv + 1);
    if (strcmp(sub, "pipeline") == 0)
        return bench_pipeline_main(argc - 1, argv + 1);
    if (strcmp(sub, "ckpt") == 0)
        return bench_ckpt_main(argc - 1, argv + 1);
    if (strcmp(sub, "moe") == 0)
        return bench_moe_main(argc - 1, argv + 1);
    /* hidden: the harness's arithmetic on synthetic timings (tests/apps/test_bench_harness.sh) */
    if (strcmp(sub, "selftest") == 0)
        return bu_selftest(stdout) ? CLI_EXIT_OK : CLI_EXIT_FAIL;
    /* hidden: a simulated schedule drawn through the trace's Gantt chart (apps/bench/trace_plot.c) */
    if (strcmp(sub, "gantt-demo") == 0)
        return trace_plot_demo_main(argc - 1, argv + 1);
    if (sub[0] == '-') {
        /* Options without a subcommand belong to coll (`distlab-bench -b 8 -e 1M`, as one would
         * call an nccl-tests binary). argv[0] stays the program name for coll's parser. */
        return bench_coll_main(argc, argv);
    }
    cli_error("unknown subcommand '%s' (subcommands: coll, topo, gemm, stream, overlap, "
              "contention, scaling, overhead, pipeline, ckpt, moe; see --help)",
              sub);
    return CLI_EXIT_USAGE;
}
