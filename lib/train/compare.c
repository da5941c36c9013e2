/* Two training runs are the same model (train/compare.h: the bounds and their derivation). */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "train/compare.h"

const char *dl__eq_name(dl__eq_kind k)
{
    static const char *const names[DL__EQ_N] = {"losses", "step 1 gradients", "step 1 parameters",
                                                "final parameters"};
    return k < DL__EQ_N ? names[k] : "?";
}

double dl__eq_unit_roundoff(dl_dtype t) { return t == DL_F64 ? 0x1p-53 : 0x1p-24; }

double dl__eq_round(const dl_train_opts *o)
{
    const dl_gpt_config *c = &o->model;
    double n = fmax(fmax(4.0 * c->d_model, (double)c->vocab), (double)o->batch.global * c->seq);
    return (c->layers + 2) * 8.0 * sqrt(n) * dl__eq_unit_roundoff(o->precision.dtype);
}

double dl__eq_grad_tol(const dl_train_opts *o)
{
    double r = dl__eq_round(o);
    if (o->precision.dtype == DL_BF16) {
        const dl_train_layout *l = &o->layout;
        int m = o->batch.microbatches,
            c = o->pipeline.token_chunks > 1 ? o->pipeline.token_chunks : 1;
        r += (l->dp * m + m * c + l->dp + l->tp - 1) * 0x1p-8; /* token slices: one a backward */
    }
    return 8.0 * r;
}

double dl__eq_worst_tensor(const dl_gpt_config *c, const double *a, const double *b, char *name)
{
    dl_gpt_layout *l;
    if (dl_gpt_layout_create(c, 1, 0, &l) != DL_OK)
        return -1;
    double w = 0;
    for (int k = 0; k < l->ntensors; k++) {
        double md = 0, mb = 0;
        for (size_t i = 0; i < l->t[k].numel; i++) {
            size_t j = l->t[k].offset + i;
            md = fmax(md, fabs(a[j] - b[j]));
            mb = fmax(mb, fabs(b[j]));
        }
        double r = mb > 0 ? md / mb : md;
        if (r >= w) {
            w = r;
            if (name)
                snprintf(name, 48, "%s", l->t[k].name);
        }
    }
    dl_gpt_layout_destroy(l);
    return w;
}

/* min(gradient norm, clip) of step i: the largest scaled gradient element is at most this */
static double gscale(const dl_train_opts *o, const dl_train_result *r, int i)
{
    double g = r->steps[i].grad_norm;
    return o->optim.clip > 0 && g > o->optim.clip ? o->optim.clip : g;
}

/* step 1's clipping factor */
static double clip1(const dl_train_opts *o, const dl_train_result *r)
{
    double g = r->steps[0].grad_norm;
    return o->optim.clip > 0 && g > o->optim.clip ? o->optim.clip / g : 1;
}

static double phi(double g, double eps) { return g / (fabs(g) + eps); }

/* the item's verdict, and the report's first failure */
static void settle(dl__eq_report *rep, dl__eq_kind k)
{
    dl__eq_item *it = &rep->item[k];
    it->present = 1;
    it->pass = it->measured <= it->bound;
    if (!it->pass && !rep->why[0])
        snprintf(rep->why, sizeof rep->why, "%s: %s, difference %.3g > bound %.3g", dl__eq_name(k),
                 it->where, it->measured, it->bound);
}

static void cmp_losses(const dl_train_opts *o, const dl_train_result *a, const dl_train_result *b,
                       dl__eq_report *rep)
{
    dl__eq_item *it = &rep->item[DL__EQ_LOSSES];
    double R = dl__eq_round(o), gtol = dl__eq_grad_tol(o), drift = 0, worst = -1;
    for (int t = 0; t < b->nsteps; t++) {
        double L = fabs(b->steps[t].loss), d = fabs(a->steps[t].loss - b->steps[t].loss) / L;
        double bound = R + (double)b->nparams * drift / (4 * L);
        if (!(d / bound <= worst)) { /* the worst step by its share of the bound (NaN too) */
            worst = d / bound;
            it->measured = d;
            it->bound = bound;
            snprintf(it->where, sizeof it->where, "step %d: %.9g vs %.9g", t + 1, a->steps[t].loss,
                     b->steps[t].loss);
        }
        drift += b->steps[t].lr * gtol * gscale(o, b, t);
    }
    settle(rep, DL__EQ_LOSSES);
}

static void cmp_grads(const dl_train_opts *o, const dl_train_result *a, const dl_train_result *b,
                      dl__eq_report *rep)
{
    dl__eq_item *it = &rep->item[DL__EQ_GRADS];
    it->measured = dl__eq_worst_tensor(&o->model, a->output.grads, b->output.grads, it->where);
    it->bound = dl__eq_grad_tol(o);
    settle(rep, DL__EQ_GRADS);
}

/* every parameter element: one step, within Adam's image of the gradients' difference plus
 * rounding; several steps, within Adam's step bound (loose) */
static void cmp_params(const dl_train_opts *o, const dl_train_result *a, const dl_train_result *b,
                       dl__eq_report *rep)
{
    int T = b->nsteps;
    dl__eq_kind k = T == 1 ? DL__EQ_PARAMS : DL__EQ_DRIFT;
    dl__eq_item *it = &rep->item[k];
    double u = dl__eq_unit_roundoff(o->precision.dtype), gtol = dl__eq_grad_tol(o);
    double lr1 = b->steps[0].lr, eps = o->optim.eps, lrmax = 0, cap = 0, worst = -1;
    double sa = clip1(o, a), sb = clip1(o, b);
    for (int t = 0; t < T; t++) {
        lrmax = fmax(lrmax, b->steps[t].lr);
        cap += b->steps[t].lr * fmin(2 * sqrt(t + 1.0), 2 * gtol * gscale(o, b, t) / eps);
    }
    for (size_t i = 0; i < (size_t)b->nparams; i++) {
        double pa = a->output.params[i], pb = b->output.params[i], d = fabs(pa - pb), pred, slack;
        if (T == 1) {
            pred =
                lr1 * fabs(phi(sa * a->output.grads[i], eps) - phi(sb * b->output.grads[i], eps));
            slack = 4 * u * fabs(pb) + 24 * u * lr1;
        } else {
            pred = cap;
            slack = T * (4 * u * fabs(pb) + 24 * u * lrmax);
        }
        /* one step: what the difference has beyond Adam's image of the gradients' difference,
         * against rounding; several steps: the whole difference against the whole bound */
        double m = T == 1 ? d - pred : d, b = T == 1 ? slack : pred + slack;
        if (!(m / b <= worst)) {
            worst = m / b;
            it->measured = m;
            it->bound = b;
            snprintf(it->where, sizeof it->where, "element %zu: %.9g vs %.9g", i, pa, pb);
        }
    }
    it->loose = T > 1;
    settle(rep, k);
}

int dl__train_compare(const dl_train_opts *o, const dl_train_result *a, const dl_train_result *b,
                      dl__eq_report *rep)
{
    memset(rep, 0, sizeof *rep);
    int T = b->nsteps;
    if (T < 1 || a->nsteps != T || a->nparams != b->nparams || !a->output.params ||
        !b->output.params || (T == 1 && (!a->output.grads || !b->output.grads))) {
        snprintf(rep->why, sizeof rep->why,
                 "not comparable: %d vs %d steps, %lld vs %lld parameters (or no parameters, or "
                 "one step without its gradients)",
                 a->nsteps, T, (long long)a->nparams, (long long)b->nparams);
        return -1;
    }
    cmp_losses(o, a, b, rep);
    if (T == 1)
        cmp_grads(o, a, b, rep);
    cmp_params(o, a, b, rep);
    return rep->why[0] ? 0 : 1;
}
