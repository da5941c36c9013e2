/* Mixed precision as a module: the storage and compute types of a run and the element kernels
 * the other modules use on the storage type (the squared norm, the gradient sum, AdamW), chosen
 * once from the dtype so that no phase tests it. bf16 stores parameters and gradients in bf16,
 * computes in f32 and keeps fp32 master weights (AdamW updates the master, the parameters are
 * its rounding). */
#ifndef DISTLAB_PARALLEL_PRECISION_H
#define DISTLAB_PARALLEL_PRECISION_H
#include <stddef.h>
#include "distlab.h"

/* AdamW's hyper-parameters (from dl_train_opts) */
typedef struct tr_adam_hp {
    double beta1, beta2, eps, wd;
} tr_adam_hp;

typedef struct tr_prec {
    dl_dtype dt; /* storage of parameters and gradients */
    int dsize;
    dl_dtype ct; /* activations and arithmetic (and AdamW's m and v) */
    int csize;
    int bf16;
    double (*sumsq)(const void *x, size_t n);          /* in double */
    void (*acc)(void *dst, const void *src, size_t n); /* dst += src, in the storage type */
    /* AdamW on n elements: p (storage), master (bf16 only), g (storage), m and v (compute) */
    void (*adamw)(void *p, float *master, const void *g, void *m, void *v, size_t n,
                  const tr_adam_hp *h, double lr, double scale, int t);
} tr_prec;

/* The types and kernels of storage type dt (f32, f64 or bf16). */
void tr_prec_init(tr_prec *p, dl_dtype dt);
#endif
