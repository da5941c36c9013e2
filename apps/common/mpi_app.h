/* The apps under mpirun: start MPI when launched by mpirun, end with MPI_Abort on failure. */
#ifndef DISTLAB_APPS_COMMON_MPI_APP_H
#define DISTLAB_APPS_COMMON_MPI_APP_H

/* When this build has MPI and the process was launched by mpirun (or mpiexec): initialise MPI
 * (MPI_THREAD_MULTIPLE) so that worlds span the processes, and silence stdout on every process
 * but the first. Returns the number of processes (1 otherwise), or -1 after printing an error. */
int app_mpi_start(int *argc, char ***argv);
/* This process's index (0 without MPI). */
int app_mpi_rank(void);
/* End of main: with MPI active, a failed status calls MPI_Abort (so that no process of the job
 * is left waiting), a good one finalises. Returns status. */
int app_mpi_end(int status);

#endif
