/* The apps under mpirun (see mpi_app.h). The only place that calls MPI_Abort: the library
 * returns errors, the apps end the job. */
#define _GNU_SOURCE
#include "config.h"
#include <stdio.h>
#include <stdlib.h>
#include "distlab.h"
#include "distlab/mpi.h"
#include "cli.h"
#include "mpi_app.h"
#ifdef DL_HAVE_MPI
#include <mpi.h>
#endif

static int launched_by_mpirun(void)
{
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK") ||
           getenv("MPI_LOCALNRANKS");
}

int app_mpi_start(int *argc, char ***argv)
{
    if (!launched_by_mpirun())
        return 1;
    if (!dl_mpi_available()) {
        cli_error("warning: launched by mpirun but built without MPI: every process runs a world "
                  "of its own (configure --with-mpi)");
        return 1;
    }
    if (dl_mpi_init(argc, argv)) {
        cli_error("%s", dl_errmsg());
        return -1;
    }
    if (dl_mpi_rank() != 0 && !freopen("/dev/null", "w", stdout))
        cli_error("cannot silence stdout on process %d", dl_mpi_rank());
    return dl_mpi_size();
}

int app_mpi_rank(void) { return dl_mpi_rank(); }

int app_mpi_end(int status)
{
    if (!dl_mpi_active())
        return status;
    fflush(NULL);
#ifdef DL_HAVE_MPI
    if (status != 0)
        MPI_Abort(MPI_COMM_WORLD, status);
#endif
    dl_mpi_finalize();
    return status;
}
