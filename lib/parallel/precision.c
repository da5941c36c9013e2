/* The storage types' kernels (parallel/precision.h). */
#include "parallel/precision.h"
#include "model/ops.h"

static double sumsq_f32(const void *x, size_t n) { return dl_sumsq_f32(x, n); }
static double sumsq_f64(const void *x, size_t n) { return dl_sumsq_f64(x, n); }
static double sumsq_bf16(const void *x, size_t n) { return dl_sumsq_bf16(x, n); }

static void acc_f32(void *dst, const void *src, size_t n)
{
    for (size_t i = 0; i < n; i++) ((float *)dst)[i] += ((const float *)src)[i];
}

static void acc_f64(void *dst, const void *src, size_t n)
{
    for (size_t i = 0; i < n; i++) ((double *)dst)[i] += ((const double *)src)[i];
}

static void acc_bf16(void *dst, const void *src, size_t n) { dl_bf16_acc(dst, src, n); }

static void adamw_f32(void *p, float *master, const void *g, void *m, void *v, size_t n,
                      const tr_adam_hp *h, double lr, double scale, int t)
{
    (void)master;
    dl_adamw_f32(p, g, m, v, n, (float)lr, (float)h->beta1, (float)h->beta2, (float)h->eps,
                 (float)h->wd, (float)scale, t);
}

static void adamw_f64(void *p, float *master, const void *g, void *m, void *v, size_t n,
                      const tr_adam_hp *h, double lr, double scale, int t)
{
    (void)master;
    dl_adamw_f64(p, g, m, v, n, lr, h->beta1, h->beta2, h->eps, h->wd, scale, t);
}

static void adamw_bf16(void *p, float *master, const void *g, void *m, void *v, size_t n,
                       const tr_adam_hp *h, double lr, double scale, int t)
{
    dl_adamw_bf16(master, g, m, v, n, (float)lr, (float)h->beta1, (float)h->beta2, (float)h->eps,
                  (float)h->wd, (float)scale, t, p);
}

void tr_prec_init(tr_prec *p, dl_dtype dt)
{
    p->dt = dt;
    p->dsize = (int)dl_dtype_size(dt);
    p->bf16 = dt == DL_BF16;
    p->ct = p->bf16 ? DL_F32 : dt;
    p->csize = (int)dl_dtype_size(p->ct);
    p->sumsq = p->bf16 ? sumsq_bf16 : p->dsize == 8 ? sumsq_f64 : sumsq_f32;
    p->acc = p->bf16 ? acc_bf16 : p->dsize == 8 ? acc_f64 : acc_f32;
    p->adamw = p->bf16 ? adamw_bf16 : p->dsize == 8 ? adamw_f64 : adamw_f32;
}
