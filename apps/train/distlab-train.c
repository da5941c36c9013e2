/* distlab-train: train a GPT-style byte model on rank threads with data, tensor and pipeline
 * parallelism. The command line is composed of option groups, one file each (group.h):
 * adding a module's options, help lines, JSON fields and summary lines is its file and one
 * line of TG_GROUPS (groups.h). */
#include <stdio.h>
#include <string.h>
#include "distlab.h"
#include "group.h"
#include "groups.h"
#include "cli.h"
#include "mpi_app.h"

static const tg_group *const groups[] = {TG_GROUPS(TG_ADDRESS)};

/* clang-format off */
static const char intro[] =
"Usage: distlab-train [options]\n"
"\n"
"Trains a GPT-style decoder over bytes on dp x tp x pp rank threads (data, Megatron tensor\n"
"and pipeline parallelism). Every layout trains exactly the model one rank trains (--check shows it).\n"
"With no options: a small model on the built-in corpus with dp = the number of cores.\n"
"\n";
static const char outro[] =
"  -h, --help            this help;  -V, --version  the version\n"
"\n"
"An option that would have no effect in the configuration given is refused (exit 2), as are\n"
"empty list elements (1,,2) and hexadecimal numbers.\n"
"OpenBLAS runs one thread per rank: distlab-train sets OPENBLAS_NUM_THREADS=1 and restarts\n"
"itself when needed, also to pick the CPU's kernel class when OpenBLAS picked a lower one and\n"
"OPENBLAS_CORETYPE is unset. Exit status: 0 ok, 1 a failed run (a failed save with\n"
"--on-save-error stop, an injected error or hang), 2 bad options, 3 an injected crash,\n"
"130 / 143 stopped by SIGINT / SIGTERM with --ckpt-dir (a checkpoint written).\n";
/* clang-format on */

/* Parse, the groups' checks and steps, the run, the groups' reports. */
static int train_main(int argc, char **argv, int nprocs)
{
    static tg_run run;
    dl_train_result r;
    memset(&run, 0, sizeof run);
    dl_train_opts_init(&run.o);
    run.nprocs = nprocs;
    tg_groups(groups, (int)(sizeof groups / sizeof groups[0]), intro, outro);
    if (tg_parse(&run, argc, argv) == TG_STOP || tg_hooks(&run, TG_CHECK, TG_PREPARE) == TG_STOP) {
        if (run.json.f)
            tg_json_close(&run.json, 1);
        return run.status;
    }
    if (dl_train_run(&run.o, &r)) {
        cli_error("%s", dl_errmsg());
        run.status = CLI_EXIT_FAIL;
    } else {
        run.r = &r;
        run.status = CLI_EXIT_OK;
        tg_hooks(&run, TG_INSTEAD, TG_CLOSE);
    }
    if (run.json.f)
        tg_json_close(&run.json, 1);
    dl_train_result_free(&r);
    return run.status;
}

/* Under mpirun: MPI first (the world spans the processes), MPI_Abort when the run failed. */
int main(int argc, char **argv)
{
    cli_progname = "distlab-train";
    cli_ignore_sigxfsz();
    cli_blas_setup(argv);
    int nprocs = app_mpi_start(&argc, &argv);
    if (nprocs < 0)
        return CLI_EXIT_FAIL;
    return app_mpi_end(train_main(argc, argv, nprocs));
}
