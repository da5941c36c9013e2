/* Data parallelism's gradient buckets (the trainer's dp module, parallel/dp_buckets.c). */
#ifndef DISTLAB_PARALLEL_DP_BUCKETS_H
#define DISTLAB_PARALLEL_DP_BUCKETS_H
#include <stddef.h>

/* The bucket planner. The backward reports gradients final from `first` to the end, first
 * falling to 0; [*launched, end) has been handed to the reduce already. Returns 1 when
 * [first, *launched) is a bucket to launch now (at least bucket_elems elements, or the rest once
 * first is 0), setting *lo and *n to it and *launched to first; else 0. */
int tr_bucket_next(size_t *launched, size_t first, size_t bucket_elems, size_t *lo, size_t *n);
#endif
