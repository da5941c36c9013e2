/* Causal attention of a token slice over a key/value cache (model/ops_attn_kv.h), and the copies
 * between a slice's Q/K/V rows and the cache. The products go through the shared GEMM (OpenBLAS)
 * by blocks of DL_ATT_BLOCK query rows, each over the keys it may see, as the whole-sequence
 * kernel does. (model/ops_tmpl.h explains the file's form.) */
#ifndef DL_OPS_BODY
#include "config.h"

#include "model/ops_tmpl.h"
#include "model/ops_attn_kv.h"

#define DL_OPS_SELF "model/ops_attn_kv.c"
#include "model/ops_twice.h"

#else /* DL_OPS_BODY: everything below is compiled once per type */

#include "model/ops_vec.h"

void FN(dl_attention_kv_fwd)(real *out, int ldout, real *att, const real *q, int ldq, const real *k,
                             const real *v, int ldkv, int Tc, int ctx, int B, int L, int NH, int HS)
{
    const real scale = (real)1 / FN(sqrt)((real)HS);
    int W = ctx + L; /* keys this slice may see */
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            size_t hoff = (size_t)h * HS;
            const real *qb = q + (size_t)b * L * ldq + hoff;
            const real *kb = k + (size_t)b * Tc * ldkv + hoff,
                       *vb = v + (size_t)b * Tc * ldkv + hoff;
            real *ob = out + (size_t)b * L * ldout + hoff;
            real *P = att + ((size_t)b * NH + h) * L * W;
            for (int i0 = 0; i0 < L; i0 += DL_ATT_BLOCK) {
                int i1 = i0 + DL_ATT_BLOCK < L ? i0 + DL_ATT_BLOCK : L, n = ctx + i1;
                /* S = scale · Q Kᵀ over keys [0, ctx + i1), then the causal softmax per row */
                FN(dl__ops_gemm)
                (0, 1, i1 - i0, n, HS, scale, qb + (size_t)i0 * ldq, ldq, kb, ldkv, (real)0,
                 P + (size_t)i0 * W, W);
                for (int i = i0; i < i1; i++) {
                    real *p = P + (size_t)i * W;
                    int m = ctx + i + 1;
                    real mx = FN(vmax)(p, m);
                    real inv = (real)1 / FN(vexp_sum)(p, mx, m);
                    for (int j = 0; j < m; j++) p[j] *= inv;
                    for (int j = m; j < W; j++) p[j] = 0;
                }
                /* O = P V over the same keys */
                FN(dl__ops_gemm)
                (0, 0, i1 - i0, HS, n, (real)1, P + (size_t)i0 * W, W, vb, ldkv, (real)0,
                 ob + (size_t)i0 * ldout, ldout);
            }
        }
}

void FN(dl_attention_kv_bwd)(real *dq, int ldq, real *dk, real *dv, real beta_kv, real *scratch,
                             const real *dout, int ldout, const real *q, const real *k,
                             const real *v, int ldkv, int Tc, int ctx, const real *att, int B,
                             int L, int NH, int HS)
{
    const real scale = (real)1 / FN(sqrt)((real)HS);
    int W = ctx + L;
    real *D = scratch; /* dP, then dS in place: (L, W) */
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            size_t hoff = (size_t)h * HS, kvo = (size_t)b * Tc * ldkv + hoff;
            const real *qb = q + (size_t)b * L * ldq + hoff, *kb = k + kvo, *vb = v + kvo;
            const real *dob = dout + (size_t)b * L * ldout + hoff;
            real *dqb = dq + (size_t)b * L * ldq + hoff, *dkb = dk + kvo, *dvb = dv + kvo;
            const real *P = att + ((size_t)b * NH + h) * L * W;
            for (int i0 = 0; i0 < L; i0 += DL_ATT_BLOCK) {
                int i1 = i0 + DL_ATT_BLOCK < L ? i0 + DL_ATT_BLOCK : L, n = ctx + i1;
                /* dP = dO Vᵀ over keys [0, ctx + i1) */
                FN(dl__ops_gemm)
                (0, 1, i1 - i0, n, HS, (real)1, dob + (size_t)i0 * ldout, ldout, vb, ldkv, (real)0,
                 D + (size_t)i0 * W, W);
                /* softmax backward: dS = P ⊙ (dP - Σ_j P dP), zero beyond the row's keys */
                for (int i = i0; i < i1; i++) {
                    const real *p = P + (size_t)i * W;
                    real *d = D + (size_t)i * W;
                    int m = ctx + i + 1;
                    real s = FN(vdot)(p, d, m);
                    for (int j = 0; j < m; j++) d[j] = p[j] * (d[j] - s);
                    for (int j = m; j < W; j++) d[j] = 0;
                }
                /* dQ = scale · dS K (written) */
                FN(dl__ops_gemm)
                (0, 0, i1 - i0, HS, n, scale, D + (size_t)i0 * W, W, kb, ldkv, (real)0,
                 dqb + (size_t)i0 * ldq, ldq);
            }
            /* keys/values [j0, j1) receive from the query rows that see them: i >= j0 - ctx */
            for (int j0 = 0; j0 < W; j0 += DL_ATT_BLOCK) {
                int j1 = j0 + DL_ATT_BLOCK < W ? j0 + DL_ATT_BLOCK : W;
                int r0 = j0 > ctx ? j0 - ctx : 0;
                /* dK[j0:j1] (+)= scale · dS[r0:L, j0:j1]ᵀ Q[r0:L] */
                FN(dl__ops_gemm)
                (1, 0, j1 - j0, HS, L - r0, scale, D + (size_t)r0 * W + j0, W,
                 qb + (size_t)r0 * ldq, ldq, beta_kv, dkb + (size_t)j0 * ldkv, ldkv);
                /* dV[j0:j1] (+)= P[r0:L, j0:j1]ᵀ dO[r0:L] */
                FN(dl__ops_gemm)
                (1, 0, j1 - j0, HS, L - r0, (real)1, P + (size_t)r0 * W + j0, W,
                 dob + (size_t)r0 * ldout, ldout, beta_kv, dvb + (size_t)j0 * ldkv, ldkv);
            }
        }
}

void FN(dl_kv_store)(real *kv, const real *qkv, int Tc, int ctx, int B, int L, int Cl)
{
    for (int b = 0; b < B; b++)
        for (int i = 0; i < L; i++)
            memcpy(kv + ((size_t)b * Tc + ctx + i) * 2 * Cl,
                   qkv + ((size_t)b * L + i) * 3 * Cl + Cl, sizeof(real) * 2 * (size_t)Cl);
}

void FN(dl_kv_load_grad)(real *dqkv, const real *dkv, int Tc, int ctx, int B, int L, int Cl)
{
    for (int b = 0; b < B; b++)
        for (int i = 0; i < L; i++)
            memcpy(dqkv + ((size_t)b * L + i) * 3 * Cl + Cl,
                   dkv + ((size_t)b * Tc + ctx + i) * 2 * Cl, sizeof(real) * 2 * (size_t)Cl);
}

#endif /* DL_OPS_BODY */
