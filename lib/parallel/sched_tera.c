/* Token-level pipelining's slice lengths (include/distlab/tera.h): the model FLOPs of a slice,
 * the latency model and its fit, and TeraPipe's dynamic program. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "distlab.h"

double dl_tera_slice_flops(int l, int ctx, int C)
{
    double L = l, c = C;
    return 3.0 * (24.0 * L * c * c + 4.0 * L * c * (ctx + (L + 1) / 2));
}

int dl_tera_chunk_scale(int nseq, int c, const int *lens, int C, double *scale)
{
    if (nseq < 1 || c < 1 || !lens || C < 1 || !scale)
        return dl_error(DL_EINVAL, "TeraPipe chunk costs: need sequences, slices and a width");
    double sum = 0;
    for (int k = 0, ctx = 0; k < c; ctx += lens[k], k++) {
        if (lens[k] < 1)
            return dl_error(DL_EINVAL, "TeraPipe chunk costs: slice %d has %d tokens", k, lens[k]);
        sum += scale[k] = dl_tera_slice_flops(lens[k], ctx, C);
    }
    for (int k = 0; k < c; k++) scale[k] /= sum / c;
    for (int q = 1; q < nseq; q++) memcpy(scale + (size_t)q * c, scale, sizeof *scale * (size_t)c);
    return DL_OK;
}

/* the model's three terms for a slice */
static void terms(int l, int ctx, double x[3])
{
    x[0] = 1, x[1] = l, x[2] = (double)l * (ctx + ((double)l + 1) / 2);
}

double dl_tera_latency_eval(const dl_tera_latency *m, int l, int ctx)
{
    double x[3];
    terms(l, ctx, x);
    return m->a * x[0] + m->b * x[1] + m->c * x[2];
}

/* Solve the 3 x 3 system A y = r in place (Gaussian elimination, partial pivoting); 0 when a
 * pivot is negligible against the matrix's scale (the points do not determine y). */
static int solve3(double A[3][3], double r[3], double y[3])
{
    double scale = 0;
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++) scale = fmax(scale, fabs(A[i][j]));
    for (int k = 0; k < 3; k++) {
        int p = k;
        for (int i = k + 1; i < 3; i++)
            if (fabs(A[i][k]) > fabs(A[p][k]))
                p = i;
        if (!(fabs(A[p][k]) > 1e-12 * scale))
            return 0;
        for (int j = 0; j < 3; j++) {
            double t = A[k][j];
            A[k][j] = A[p][j], A[p][j] = t;
        }
        double t = r[k];
        r[k] = r[p], r[p] = t;
        for (int i = k + 1; i < 3; i++) {
            double f = A[i][k] / A[k][k];
            for (int j = k; j < 3; j++) A[i][j] -= f * A[k][j];
            r[i] -= f * r[k];
        }
    }
    for (int k = 2; k >= 0; k--) {
        double s = r[k];
        for (int j = k + 1; j < 3; j++) s -= A[k][j] * y[j];
        y[k] = s / A[k][k];
    }
    return 1;
}

int dl_tera_latency_fit(const int *l, const int *ctx, const double *t, int n, dl_tera_latency *out,
                        double *rel_rms, double *rel_max)
{
    if (!l || !ctx || !t || !out || n < 3)
        return dl_error(DL_EINVAL, "latency fit: need at least 3 measured slices (got %d)", n);
    double A[3][3] = {{0}}, r[3] = {0}, y[3] = {0}, x[3];
    for (int i = 0; i < n; i++) {
        if (!(t[i] > 0) || l[i] < 1 || ctx[i] < 0)
            return dl_error(DL_EINVAL,
                            "latency fit: measurement %d (l %d, ctx %d, t %g) is not a slice "
                            "with a positive time",
                            i, l[i], ctx[i], t[i]);
        terms(l[i], ctx[i], x);
        for (int j = 0; j < 3; j++) { /* rows divided by t: relative residuals */
            for (int k = 0; k < 3; k++) A[j][k] += x[j] * x[k] / (t[i] * t[i]);
            r[j] += x[j] / t[i];
        }
    }
    if (!solve3(A, r, y))
        return dl_error(DL_EINVAL,
                        "latency fit: the %d slices do not determine the model (vary the "
                        "lengths and the contexts)",
                        n);
    out->a = y[0], out->b = y[1], out->c = y[2];
    double ss = 0, mx = 0;
    for (int i = 0; i < n; i++) {
        double e = fabs(dl_tera_latency_eval(out, l[i], ctx[i]) - t[i]) / t[i];
        ss += e * e, mx = fmax(mx, e);
    }
    if (rel_rms)
        *rel_rms = sqrt(ss / n);
    if (rel_max)
        *rel_max = mx;
    return DL_OK;
}

double dl_tera_objective(const int *lens, int n, int K, dl_tera_cost_fn cost, void *arg)
{
    double sum = 0, mx = 0;
    for (int i = 0, ctx = 0; i < n; ctx += lens[i], i++) {
        double t = cost(arg, lens[i], ctx);
        sum += t, mx = fmax(mx, t);
    }
    return sum + (K - 1) * mx;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The least Σ t over cuts of units [0, n) with every slice's cost <= tmax (tc[j * (n+1) + k]:
 * slice [j, k)); the cut's start units in from[] (from[k]: where the slice ending at k starts).
 * DBL_MAX when no cut fits. */
static double best_sum(const double *tc, int n, double tmax, double *f, int *from)
{
    f[0] = 0;
    for (int k = 1; k <= n; k++) {
        f[k] = DBL_MAX, from[k] = -1;
        for (int j = 0; j < k; j++) {
            double t = tc[(size_t)j * (n + 1) + k];
            if (t <= tmax && f[j] < DBL_MAX && f[j] + t < f[k])
                f[k] = f[j] + t, from[k] = j;
        }
    }
    return f[n];
}

int dl_tera_slices(int T, int K, int gran, dl_tera_cost_fn cost, void *arg, int *lens, int *n,
                   double *objective)
{
    if (T < 1 || K < 1 || gran < 1 || T % gran || !cost || !lens || !n)
        return dl_error(DL_EINVAL,
                        "TeraPipe slicing: need T >= 1 tokens in whole units of gran >= 1 and "
                        "K >= 1 stages (got T %d, gran %d, K %d)",
                        T, gran, K);
    int u = T / gran, nc = 0, rc = DL_OK;
    size_t cells = (size_t)(u + 1) * (u + 1);
    double *tc = malloc(cells * sizeof *tc), *cand = malloc(cells * sizeof *cand);
    double *f = malloc((size_t)(u + 1) * sizeof *f);
    int *from = malloc((size_t)(u + 1) * sizeof *from),
        *bestfrom = malloc((size_t)(u + 1) * sizeof *from);
    if (!tc || !cand || !f || !from || !bestfrom) {
        rc = dl_error(DL_ENOMEM, "TeraPipe slicing: out of memory for %d units", u);
        goto out;
    }
    for (int j = 0; j < u; j++)
        for (int k = j + 1; k <= u; k++)
            cand[nc++] = tc[(size_t)j * (u + 1) + k] = cost(arg, (k - j) * gran, j * gran);
    qsort(cand, (size_t)nc, sizeof *cand, cmp_double);
    /* the least sum with no bound: every candidate's objective is at least it + (K−1)·bound */
    double floor_sum = best_sum(tc, u, DBL_MAX, f, from), best = DBL_MAX;
    for (int i = 0; i < nc; i++) {
        if (i > 0 && cand[i] == cand[i - 1])
            continue;
        if (floor_sum + (K - 1) * cand[i] >= best)
            break;
        double s = best_sum(tc, u, cand[i], f, from);
        if (s < DBL_MAX && s + (K - 1) * cand[i] < best) {
            best = s + (K - 1) * cand[i];
            memcpy(bestfrom, from, (size_t)(u + 1) * sizeof *from);
        }
    }
    /* the slices back to front from the cut's links, then in order */
    int m = 0;
    for (int k = u; k > 0; k = bestfrom[k]) lens[m++] = (k - bestfrom[k]) * gran;
    for (int i = 0; i < m / 2; i++) {
        int t = lens[i];
        lens[i] = lens[m - 1 - i], lens[m - 1 - i] = t;
    }
    *n = m;
    if (objective)
        *objective = best;
out:
    free(tc), free(cand), free(f), free(from), free(bestfrom);
    return rc;
}
