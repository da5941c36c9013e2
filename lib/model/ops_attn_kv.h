/* distlab (private): causal attention of a token slice over a key/value cache (token-level
 * pipelining, TeraPipe). A sequence of T positions is cut into slices that run one after
 * another; the slice of L positions [ctx, ctx + L) attends to the keys and values of every
 * position up to its own, which earlier slices left in a per-sequence cache. Written once for
 * float and double (model/ops_tmpl.h), like the other kernels (model/ops.h: shapes, heads,
 * conventions).
 *
 * The cache: row (b, t) of sequence b's keys at k[(b*Tc + t)*ldkv], values at v[...] the same
 * (t < Tc, the cache's rows per sequence); head h at offset h*HS. q: the slice's queries, row
 * (b, i) at q[(b*L + i)*ldq]; out: row (b, i) at out[(b*L + i)*ldout], NH*HS elements, written.
 * The caller has put the slice's own keys and values at rows [ctx, ctx + L) of the cache.
 * att (B, NH, L, ctx + L): the softmax probabilities, written; query i (position ctx + i)
 * attends to keys [0, ctx + i] (zero beyond). With ctx = 0 and L = Tc this is exactly the
 * attention of dl_attention_fwd (up to the order of the sums).
 *
 * bwd: dq written (stride ldq). dk, dv: the cache's gradient (stride ldkv, Tc rows per
 * sequence), rows [0, ctx + L) of each sequence written (beta_kv 0) or accumulated (1): the
 * slices' backwards run in reverse order, the sequence's last slice writes and every earlier one
 * adds, so when slice s runs, rows [ctx_s, ctx_s + L_s) hold the gradient of its own keys and
 * values from every later slice plus its own. scratch: L*(ctx + L) elements. */
#ifndef DISTLAB_MODEL_OPS_ATTN_KV_H
#define DISTLAB_MODEL_OPS_ATTN_KV_H

void dl_attention_kv_fwd_f32(float *out, int ldout, float *att, const float *q, int ldq,
                             const float *k, const float *v, int ldkv, int Tc, int ctx, int B,
                             int L, int NH, int HS);
void dl_attention_kv_fwd_f64(double *out, int ldout, double *att, const double *q, int ldq,
                             const double *k, const double *v, int ldkv, int Tc, int ctx, int B,
                             int L, int NH, int HS);
void dl_attention_kv_bwd_f32(float *dq, int ldq, float *dk, float *dv, float beta_kv,
                             float *scratch, const float *dout, int ldout, const float *q,
                             const float *k, const float *v, int ldkv, int Tc, int ctx,
                             const float *att, int B, int L, int NH, int HS);
void dl_attention_kv_bwd_f64(double *dq, int ldq, double *dk, double *dv, double beta_kv,
                             double *scratch, const double *dout, int ldout, const double *q,
                             const double *k, const double *v, int ldkv, int Tc, int ctx,
                             const double *att, int B, int L, int NH, int HS);

/* Copy the slice's keys and values (rows of a packed Q/K/V buffer: k at qkv + Cl, v at
 * qkv + 2Cl, stride 3Cl) into cache rows [ctx, ctx + L) of each of B sequences (keys at kv,
 * values at kv + Cl, stride 2Cl, Tc rows per sequence); _grad copies the other way, from a
 * cache gradient into the K/V parts of a Q/K/V gradient. */
void dl_kv_store_f32(float *kv, const float *qkv, int Tc, int ctx, int B, int L, int Cl);
void dl_kv_store_f64(double *kv, const double *qkv, int Tc, int ctx, int B, int L, int Cl);
void dl_kv_load_grad_f32(float *dqkv, const float *dkv, int Tc, int ctx, int B, int L, int Cl);
void dl_kv_load_grad_f64(double *dqkv, const double *dkv, int Tc, int ctx, int B, int L, int Cl);

/* The GEMM the kernel files share (ops_gemm.c: OpenBLAS, counted in the GEMM shape log):
 * C (M x N) = alpha op(A) op(B) + beta C, row-major, ta / tb transpose A / B. */
void dl__ops_gemm_f32(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                      const float *B, int ldb, float beta, float *C, int ldc);
void dl__ops_gemm_f64(int ta, int tb, int M, int N, int K, double alpha, const double *A, int lda,
                      const double *B, int ldb, double beta, double *C, int ldc);

#endif
