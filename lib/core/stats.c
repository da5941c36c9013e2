/* The median: see stats.h. */
#include "config.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "core/stats.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double dl__median(double *v, size_t n)
{
    if (n == 0)
        return NAN;
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double dl__median_copy(const double *v, size_t n)
{
    if (n == 0)
        return NAN;
    double *w = malloc(n * sizeof *w);
    if (w == NULL)
        return NAN;
    memcpy(w, v, n * sizeof *w);
    double r = dl__median(w, n);
    free(w);
    return r;
}
