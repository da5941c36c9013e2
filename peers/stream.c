/* stream: memory bandwidth by the four kernels of McCalpin's STREAM (copy, scale, add, triad),
 * written here from the benchmark's published definition, so that `distlab-bench stream` and
 * the limit `distlab-bench coll` divides by can be checked against an independent program.
 *
 * Usage: OMP_NUM_THREADS=N ./stream [TRIALS [MIB]]   (defaults 10 trials, 64 MiB per array)
 * Build: cc -O2 -fopenmp peers/stream.c -o stream
 * Three arrays of doubles; each kernel runs TRIALS times over all threads (OpenMP, static
 * split, first-touch by the same split); bytes are counted as STREAM counts them (copy and scale
 * 2 arrays, add and triad 3; no write-allocate). Prints best and median GB/s (10^9 B/s) per
 * kernel, and checks the arrays' final values against the recurrence run on scalars. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    int trials = argc > 1 ? atoi(argv[1]) : 10;
    long mib = argc > 2 ? atol(argv[2]) : 64;
    if (trials < 1 || trials > 1000 || mib < 1) {
        fprintf(stderr, "usage: stream [trials 1..1000 [MiB per array]]\n");
        return 2;
    }
    long n = mib * 1024 * 1024 / (long)sizeof(double);
    double *a = malloc((size_t)n * sizeof *a), *b = malloc((size_t)n * sizeof *b);
    double *c = malloc((size_t)n * sizeof *c), q = 3.0;
    double *t = malloc(4 * (size_t)trials * sizeof *t);
    if (!a || !b || !c || !t) {
        fprintf(stderr, "stream: out of memory for 3 x %ld MiB\n", mib);
        return 1;
    }
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++)
        a[i] = 1.0, b[i] = 2.0, c[i] = 0.0;
    for (int r = 0; r < trials; r++) {
        double t0 = omp_get_wtime();
#pragma omp parallel for schedule(static)
        for (long i = 0; i < n; i++) c[i] = a[i];
        double t1 = omp_get_wtime();
#pragma omp parallel for schedule(static)
        for (long i = 0; i < n; i++) b[i] = q * c[i];
        double t2 = omp_get_wtime();
#pragma omp parallel for schedule(static)
        for (long i = 0; i < n; i++) c[i] = a[i] + b[i];
        double t3 = omp_get_wtime();
#pragma omp parallel for schedule(static)
        for (long i = 0; i < n; i++) a[i] = b[i] + q * c[i];
        double t4 = omp_get_wtime();
        t[0 * trials + r] = t1 - t0, t[1 * trials + r] = t2 - t1;
        t[2 * trials + r] = t3 - t2, t[3 * trials + r] = t4 - t3;
    }
    /* the same recurrence on scalars: every element must end equal to it */
    double ea = 1.0, eb = 2.0, ec = 0.0;
    for (int r = 0; r < trials; r++)
        ec = ea, eb = q * ec, ec = ea + eb, ea = eb + q * ec;
    long wrong = 0;
    for (long i = 0; i < n; i++)
        wrong += a[i] != ea || b[i] != eb || c[i] != ec;
    static const char *names[4] = {"copy", "scale", "add", "triad"};
    static const double arrays[4] = {2, 2, 3, 3};
    printf("# stream: %d threads, %ld MiB per array, %d trials; GB/s = 10^9 bytes/s\n",
           omp_get_max_threads(), mib, trials);
    printf("# %-6s %10s %10s\n", "kernel", "best_GBs", "median_GBs");
    for (int k = 0; k < 4; k++) {
        double *tk = t + (size_t)k * trials, bytes = arrays[k] * (double)n * sizeof(double);
        qsort(tk, (size_t)trials, sizeof *tk, by_value);
        printf("  %-6s %10.2f %10.2f\n", names[k], bytes / tk[0] / 1e9,
               bytes / tk[trials / 2] / 1e9);
    }
    printf("# %ld elements differ from the expected values\n", wrong);
    free(a), free(b), free(c), free(t);
    return wrong != 0;
}
