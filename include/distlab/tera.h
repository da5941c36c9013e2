/* distlab: token-level pipelining (TeraPipe, Li et al. 2021): the cost of a token slice and the
 * choice of slice lengths.
 *
 * In a causal Transformer the slice of l tokens after ctx earlier ones costs, per layer, the
 * linear layers' work (proportional to l) plus the attention's, whose queries each read every
 * earlier key (proportional to l·(ctx + (l+1)/2)): later slices of equal length cost more. With
 * K stages and slices costing t_1 .. t_n per stage, one sequence's pipeline latency is about
 * Σ t_i + (K−1)·max t_i (the last stage's work plus the fill of the others by the slowest
 * slice); TeraPipe chooses the lengths that minimise it, by dynamic programming over a latency
 * model t(l, ctx) measured on the machine. */
#ifndef DISTLAB_TERA_H
#define DISTLAB_TERA_H

#ifdef __cplusplus
extern "C" {
#endif

/* The model FLOPs of one layer's forward and backward for a slice of l tokens of one sequence
 * after ctx earlier ones, width C: 3 × (24 l C² for the four linears + 4 l C (ctx + (l+1)/2) for
 * the attention's two products), the backward counted twice the forward. */
double dl_tera_slice_flops(int l, int ctx, int C);

/* The simulator's per micro-batch cost factors (dl_sched_costs.mb_scale) of a TeraPipe
 * schedule: nseq sequences, each cut into the c slices of lens[0 .. c-1] tokens, micro-batch j
 * being slice j % c of sequence j / c; factor j = the slice's FLOPs (width C) over the mean
 * slice's, so the total work is the lecture's (c equal chunks of cost 1) and only its spread
 * over the slices changes. scale: nseq * c entries. DL_EINVAL for bad arguments. */
int dl_tera_chunk_scale(int nseq, int c, const int *lens, int C, double *scale);

/* The latency model t(l, ctx) = a + b·l + c·l·(ctx + (l+1)/2) (seconds, or any unit): a fixed
 * cost per slice, the per-token work, the attention's. */
typedef struct dl_tera_latency {
    double a, b, c;
} dl_tera_latency;

/* t(l, ctx) for the model m. */
double dl_tera_latency_eval(const dl_tera_latency *m, int l, int ctx);

/* Least-squares fit of the model to n >= 3 measurements t[i] of slices (l[i], ctx[i]), relative
 * (each residual divided by its t, so short slices count as much as long ones). *rel_rms gets the
 * fit's root-mean-square relative error and *rel_max the largest (may be NULL). DL_EINVAL when
 * the points do not determine the three coefficients (fewer than 3, or all of one shape) or a
 * time is not positive. */
int dl_tera_latency_fit(const int *l, const int *ctx, const double *t, int n, dl_tera_latency *out,
                        double *rel_rms, double *rel_max);

/* A slice's cost: cost(arg, l, ctx) > 0. */
typedef double (*dl_tera_cost_fn)(void *arg, int l, int ctx);

/* TeraPipe's dynamic program: cut T tokens into slices whose lengths are multiples of gran
 * (T % gran == 0; gran 1: any lengths) minimising Σ t_i + (K−1)·max t_i for K stages, with
 * t_i = cost(l_i, ctx_i). For each candidate bound t_max (every slice cost, in increasing
 * order, stopping once (K−1)·t_max alone exceeds the best found), the least Σ t_i with every
 * t_i <= t_max over prefixes. lens (room for T / gran entries) receives the lengths in order,
 * *n their number, *objective the minimum (may be NULL). DL_EINVAL for bad arguments. */
int dl_tera_slices(int T, int K, int gran, dl_tera_cost_fn cost, void *arg, int *lens, int *n,
                   double *objective);

/* Σ t_i + (K−1)·max t_i of the given slices (the objective the dynamic program minimises). */
double dl_tera_objective(const int *lens, int n, int K, dl_tera_cost_fn cost, void *arg);

#ifdef __cplusplus
}
#endif
#endif
