/* The capacity-factor sweep's runs and figures (moe_sweep.h). */
#include "moe_sweep.h"
#include <math.h>
#include <stdio.h>

const double ms_factors[MS_NF] = {0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 0.0};

dl_train_opts ms_train_opts(const ms_cfg *c, double cap)
{
    dl_train_opts o;
    dl_train_opts_init(&o);
    o.model.layers = c->layers, o.model.d_model = c->d_model, o.model.seq = c->seq;
    o.model.heads = 4;
    o.model.experts = c->experts, o.model.top_k = c->top_k, o.model.capacity = cap;
    o.model.moe_every = 1, o.model.aux_loss = 0.01;
    o.layout.dp = c->dp, o.layout.ep = c->ep;
    o.batch.global = c->batch;
    o.optim.steps = c->steps;
    o.eval.windows = 1;
    o.output.log_every = 0;
    return o;
}

void ms_summarise(const dl_train_result *r, double cap, ms_row *w)
{
    const dl_train_moe_result *m = &r->moe;
    double routed = 0, dropped = 0, imb = 0, bytes = 0, wait = 0;
    int E = m->experts, n = 0;
    for (int s = 0; s < r->nsteps; s++) {
        for (int i = 0; i < m->layers; i++, n++) {
            const int64_t *ro = m->routed + ((size_t)s * m->layers + i) * E;
            const int64_t *dr = m->dropped + ((size_t)s * m->layers + i) * E;
            double mx = 0, sum = 0;
            for (int e = 0; e < E; e++) {
                mx = fmax(mx, (double)ro[e]), sum += (double)ro[e];
                dropped += (double)dr[e];
            }
            routed += sum;
            imb += sum > 0 ? mx / (sum / E) : 1;
        }
        for (int q = 0; q < r->nranks; q++) {
            bytes += m->a2a_bytes[(size_t)s * r->nranks + q];
            wait += m->combine_wait_ms[(size_t)s * r->nranks + q];
        }
    }
    double rs = (double)r->nsteps * r->nranks;
    *w = (ms_row){cap,
                  routed > 0 ? dropped / routed : 0,
                  n ? imb / n : 1,
                  r->speed.ms_per_step,
                  bytes / rs,
                  wait / rs};
}

void ms_step_load(const dl_train_result *r, int s, int ep, double *drop, double *idle)
{
    const dl_train_moe_result *m = &r->moe;
    int E = m->experts, per = E / (ep > 0 ? ep : 1);
    double routed = 0, dropped = 0, idle_sum = 0;
    for (int i = 0; i < m->layers; i++) {
        const int64_t *ro = m->routed + ((size_t)s * m->layers + i) * E;
        const int64_t *dr = m->dropped + ((size_t)s * m->layers + i) * E;
        double mx = 0, sum = 0;
        for (int q = 0; q < E / per; q++) { /* ep rank q holds experts q per .. q per + per - 1 */
            double load = 0;
            for (int e = q * per; e < (q + 1) * per; e++) load += (double)(ro[e] - dr[e]);
            mx = fmax(mx, load), sum += load;
        }
        for (int e = 0; e < E; e++) routed += (double)ro[e], dropped += (double)dr[e];
        idle_sum += mx > 0 ? 1 - sum / (E / per) / mx : 0;
    }
    *drop = routed > 0 ? dropped / routed : 0;
    *idle = m->layers ? idle_sum / m->layers : 0;
}

int ms_run(const ms_cfg *c, double cap, ms_row *w, dl_train_result *r)
{
    dl_train_opts o = ms_train_opts(c, cap);
    int st = dl_train_run(&o, r);
    if (st == DL_OK)
        ms_summarise(r, cap, w);
    else
        dl_train_result_free(r);
    return st;
}

void ms_label(double cap, char *buf, size_t n)
{
    if (cap > 0)
        snprintf(buf, n, "%g", cap);
    else
        snprintf(buf, n, "no limit");
}
