/* distlab (private): the kernels' reductions, included once per type inside a kernel file's
 * body (real, SFX and FN from model/ops_tmpl.h and ops_twice.h); no include guard on purpose. */

/* ---- reductions with 8 partial sums (vectorisable, and a little more accurate) ---- */

static inline real FN(vsum)(const real *x, int n)
{
    real s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) s[l] += x[i + l];
    real r = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; i < n; i++) r += x[i];
    return r;
}

/* Σ (x - m)² */
static inline real FN(vsumsqdev)(const real *x, real m, int n)
{
    real s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) {
            real d = x[i + l] - m;
            s[l] += d * d;
        }
    real r = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; i < n; i++) r += (x[i] - m) * (x[i] - m);
    return r;
}

static inline real FN(vdot)(const real *x, const real *y, int n)
{
    real s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) s[l] += x[i + l] * y[i + l];
    real r = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; i < n; i++) r += x[i] * y[i];
    return r;
}

/* 8 partial maxima, so that it vectorises (a max is exact: the same result in any order) */
static inline real FN(vmax)(const real *x, int n)
{
    real s[8] = {x[0], x[0], x[0], x[0], x[0], x[0], x[0], x[0]};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) s[l] = x[i + l] > s[l] ? x[i + l] : s[l];
    real m = s[0];
    for (int l = 1; l < 8; l++) m = s[l] > m ? s[l] : m;
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

/* x[i] = exp(x[i] - m) for i < n; returns the sum. In place so the caller's row is reused. */
static inline real FN(vexp_sum)(real *x, real m, int n)
{
    for (int i = 0; i < n; i++) x[i] = FN(exp)(x[i] - m);
    return FN(vsum)(x, n);
}
