/* distlab: running one world over several processes (machines) with MPI.
 *
 * Launch one process per machine with mpirun; each process runs T rank threads, and the world
 * of P processes has P*T ranks: process k hosts world ranks k*T ... k*T+T-1, and each process is
 * one "node" (dl_ctx_node, the intra/inter-node byte counters). Links between two ranks of one
 * process are shared-memory channels; links that cross processes are MPI links implementing the
 * same link interface (post / acquire / release / flush / drain), so every collective, communicator
 * and trainer feature runs unchanged.
 *
 * Threading: distlab asks for MPI_THREAD_MULTIPLE and refuses less. Every link end has exactly
 * one owner thread, so MPI calls from different rank threads never touch the same request; the
 * alternative, one communication thread owning all MPI calls, would add a thread hand-off (1.5 to
 * 40 us on this machine) to every message of every crossing hop.
 *
 * Failure: a rank that fails sends its error to the other processes, whose worlds then abort and
 * return that error ("rank 3: ..."); apps then call MPI_Abort so that a job never hangs.
 *
 * Every function works in a build without MPI: dl_mpi_available() returns 0, dl_mpi_init returns
 * DL_EINVAL, and the rest report one process. */
#ifndef DISTLAB_MPI_H
#define DISTLAB_MPI_H

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when this library was built with MPI (./configure --with-mpi). */
int dl_mpi_available(void);

/* Initialise MPI with MPI_THREAD_MULTIPLE (or adopt an MPI the caller initialised, checking its
 * thread level), so that worlds span the processes of MPI_COMM_WORLD. DL_ESYS when MPI gives a
 * lower thread level, DL_EINVAL in a build without MPI. */
int dl_mpi_init(int *argc, char ***argv);
/* Finalise MPI if dl_mpi_init initialised it. */
int dl_mpi_finalize(void);
/* 1 between dl_mpi_init and dl_mpi_finalize. */
int dl_mpi_active(void);
/* This process's index in MPI_COMM_WORLD and the number of processes (0 and 1 when MPI is not
 * active); the processes on this host and this process's index among them. */
int dl_mpi_rank(void);
int dl_mpi_size(void);
int dl_mpi_host_rank(void);
int dl_mpi_host_size(void);

#ifdef __cplusplus
}
#endif
#endif
