/* mpi_coll: time one MPI collective over a range of sizes, the way nccl-tests and
 * `distlab-bench coll` report it, so that docs/peers-allreduce.sh can put the two side by side.
 *
 * Usage: mpirun -n P ./mpi_coll [OP [MINBYTES [MAXBYTES [FACTOR]]]]
 *   OP: allreduce (default), reducescatter, allgather, alltoall; f32, MPI_SUM where it reduces.
 *   Sizes go MINBYTES, MINBYTES*FACTOR, ... up to MAXBYTES (defaults 8, 64 MiB, 4).
 * Size is nccl-tests' convention: the per-rank buffer of all-reduce, the whole (P-block) buffer of
 * the others. Each size: 5 untimed calls, then batches of back-to-back calls after a barrier,
 * the batch long enough (>= 20 ms) to swamp the timer; a batch's time is the slowest rank's;
 * the row is the median of 5 batches. busbw = size / time x 2(P-1)/P (all-reduce) or (P-1)/P.
 * Output: a '#' header, then one row per size: bytes, time_us, algbw_GBs, busbw_GBs, iters. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { ALLREDUCE, REDUCESCATTER, ALLGATHER, ALLTOALL };
static const char *op_names[] = {"allreduce", "reducescatter", "allgather", "alltoall"};

static void call(int op, const float *send, float *recv, int count, int nprocs)
{
    int block = count / nprocs; /* the per-rank block of the P-block collectives */
    switch (op) {
    case ALLREDUCE: MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
    case REDUCESCATTER:
        MPI_Reduce_scatter_block(send, recv, block, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
    case ALLGATHER:
        MPI_Allgather(send, block, MPI_FLOAT, recv, block, MPI_FLOAT, MPI_COMM_WORLD);
        break;
    default: MPI_Alltoall(send, block, MPI_FLOAT, recv, block, MPI_FLOAT, MPI_COMM_WORLD); break;
    }
}

/* Seconds per call of a batch of `iters` calls, the slowest rank's. */
static double batch(int op, const float *send, float *recv, int count, int nprocs, long iters)
{
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (long i = 0; i < iters; i++)
        call(op, send, recv, count, nprocs);
    double mine = (MPI_Wtime() - t0) / (double)iters, slowest;
    MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return slowest;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    int nprocs, me, op = -1;
    MPI_Init(&argc, &argv);
    MPI_Comm_size(MPI_COMM_WORLD, &nprocs);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    const char *name = argc > 1 ? argv[1] : "allreduce";
    for (int k = 0; k < 4; k++)
        if (!strcmp(name, op_names[k])) op = k;
    long minb = argc > 2 ? atol(argv[2]) : 8, maxb = argc > 3 ? atol(argv[3]) : 64L << 20;
    long factor = argc > 4 ? atol(argv[4]) : 4;
    if (op < 0 || minb < 1 || maxb < minb || factor < 2) {
        if (!me) fprintf(stderr, "usage: mpi_coll [allreduce|reducescatter|allgather|alltoall] "
                                 "[minbytes [maxbytes [factor >= 2]]]\n");
        MPI_Finalize();
        return 2;
    }
    /* one float per rank at least; the P-block collectives need a multiple of P floats */
    long unit = op == ALLREDUCE ? 4 : 4L * nprocs;
    long cap = (maxb + unit - 1) / unit * unit;
    float *send = malloc((size_t)cap), *recv = malloc((size_t)cap);
    if (!send || !recv) MPI_Abort(MPI_COMM_WORLD, 1);
    for (long i = 0; i < cap / 4; i++) send[i] = (float)(me + 1), recv[i] = 0;
    double bus = op == ALLREDUCE ? 2.0 * (nprocs - 1) / nprocs : (double)(nprocs - 1) / nprocs;
    if (!me) {
        char lib[MPI_MAX_LIBRARY_VERSION_STRING];
        int len;
        MPI_Get_library_version(lib, &len);
        lib[strcspn(lib, "\n")] = 0;
        printf("# mpi_coll %s, %d processes, f32 sum; %s\n", name, nprocs, lib);
        printf("# %12s %10s %10s %10s %8s\n", "bytes", "time_us", "algbw", "busbw", "iters");
    }
    for (long b = minb; b <= maxb; b *= factor) {
        long bytes = (b + unit - 1) / unit * unit;
        int count = (int)(bytes / 4);
        for (int w = 0; w < 5; w++)
            call(op, send, recv, count, nprocs);
        long iters = 1;
        while (iters < (1L << 20) && batch(op, send, recv, count, nprocs, iters) * iters < 0.02)
            iters *= 2;
        MPI_Bcast(&iters, 1, MPI_LONG, 0, MPI_COMM_WORLD); /* every rank the same count */
        double t[5];
        for (int r = 0; r < 5; r++)
            t[r] = batch(op, send, recv, count, nprocs, iters);
        qsort(t, 5, sizeof t[0], by_value);
        double algbw = (double)bytes / t[2] / 1e9;
        if (!me)
            printf("  %12ld %10.2f %10.3f %10.3f %8ld\n", bytes, t[2] * 1e6, algbw, algbw * bus,
                   iters);
        fflush(stdout);
    }
    free(send);
    free(recv);
    MPI_Finalize();
    return 0;
}
