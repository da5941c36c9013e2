/* Private: the median the library and the apps summarise timings and fractions with. */
#ifndef DISTLAB_CORE_STATS_H
#define DISTLAB_CORE_STATS_H

#include <stddef.h>

/* Median of v[0..n-1], sorting v in place (ascending); the mean of the middle two for even n;
 * NaN when n == 0 (no value: a caller that prints a number for it handles n == 0 itself). */
double dl__median(double *v, size_t n);
/* The same without touching v (sorts a copy); NaN also when the copy cannot be allocated. */
double dl__median_copy(const double *v, size_t n);

#endif
