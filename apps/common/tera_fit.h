/* --token-chunks auto (distlab-bench pipeline, distlab-train): TeraPipe's slice lengths from a
 * latency model measured on this machine (apps/common/tera_fit.c). */
#ifndef DISTLAB_APPS_COMMON_TERA_FIT_H
#define DISTLAB_APPS_COMMON_TERA_FIT_H

#include <stdio.h>
#include "distlab.h"

/* Time one transformer layer (the attention sublayer over a key/value cache, then the dense MLP;
 * f32, one rank, B sequences of T tokens, width C, 4 heads), forward and whole backward, for
 * slices of l tokens after ctx earlier ones on a grid of (l, ctx) (median of reps each), fit
 * t(l, ctx) and print the fit and its relative error to f ('#' lines); err (may be NULL) gets the
 * error, root-mean-square and worst (relative), for the JSON records. */
int tera_fit_latency(int T, int C, int B, FILE *f, dl_tera_latency *model, double err[2]);

/* TeraPipe's dynamic program for K stages over that model (slices in whole units of T/32
 * tokens, or 1 for T < 32): the lengths in lens (room for T), their number in *n, and per
 * micro-batch of nseq sequences its time over an equal split's (t(l_i, ctx_i) / (t(T, 0) / n)),
 * malloc'd in *scale. Prints the lengths to f. */
int tera_fit_plan(const dl_tera_latency *model, int T, int K, int nseq, FILE *f, int *lens, int *n,
                  double **scale);

#endif
