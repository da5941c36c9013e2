/* distlab: the kernel layer of the GPT trainer (llm.c style: one function per op and direction).
 *
 * Every kernel exists twice, as real exported functions: `_f32` on float and `_f64` on double,
 * with the same arguments. They take plain pointers and sizes, allocate nothing (scratch is
 * passed in), keep no state and are thread-safe: each rank thread calls them on its own data.
 * GEMMs go through OpenBLAS (run it with one thread per rank: OPENBLAS_NUM_THREADS=1). Nothing
 * is validated: sizes are positive, pointers valid, buffers do not overlap unless a function
 * says so.
 *
 * Shapes: B sequences of T positions, N = B*T rows; C channels; row-major everywhere, so
 * "(B, T, C)" means element (b, t, c) lives at [(b*T + t)*C + c].
 *
 * Gradient convention (llm.c): every backward ACCUMULATES (+=) into every gradient it produces,
 * parameter gradients and input (activation) gradients alike, so micro-batches add up and the
 * two branches of a residual add into one buffer. The caller zeroes gradient buffers before use.
 * The one exception is dl_crossentropy_bwd, which starts the chain and WRITES dlogits.
 * Extension: the `_write` variants below (dl_linear_bwd_write, dl_attention_bwd_write,
 * dl_gelu_bwd_deriv) WRITE the input gradient instead (its old contents are ignored, so a fresh
 * buffer needs no zeroing); their results are exactly those of zeroing it and accumulating.
 * Parameter gradients always accumulate.
 *
 * Linear weight layout: W is (OC, IC) row-major, out = inp · Wᵀ + bias, i.e. the layout of
 * PyTorch's nn.Linear.weight and of llm.c. Row o of W holds the weights of output feature o.
 * In the lecture's notation Z = GeLU(X·A + a)·B + b, W_fc = Aᵀ and W_proj = Bᵀ, hence for
 * Megatron's tensor parallelism over t ranks:
 *   - column-parallel (A, and Q/K/V by heads): rank r's shard is the CONTIGUOUS block of rows
 *     [r*OC/t, (r+1)*OC/t) of W (and the same slice of the bias);
 *   - row-parallel (B, and the attention output projection): rank r's shard is the STRIDED
 *     slice W[o][r*IC/t : (r+1)*IC/t] of every row o (OC rows of IC/t elements, stride IC); the
 *     bias is not split (add it once, after the all-reduce, or on one rank).
 * Heads: Q, K and V have head h in channels [h*HS, (h+1)*HS) (as torch_gpt.py's view(b, t, 3,
 * H, D/H)), so a rank's heads are a contiguous channel range of each of Q, K and V.
 * The tied LM head is a linear with W = wte (V, C), no bias. */
#ifndef DISTLAB_MODEL_OPS_H
#define DISTLAB_MODEL_OPS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* LayerNorm epsilon (PyTorch's default). */
#define DL_LN_EPS 1e-5

/* Row block of the causal attention GEMMs: only blocks on or below the diagonal are computed.
 * 32 rather than 64: (T/32+1)/(T/32) instead of (T/64+1)/(T/64) times the causal FLOPs, and at
 * T = 128 on one OpenBLAS thread the attention's GEMMs took 11.8 ms per step of the benchmark
 * model instead of 12.6 (128: 15.7, 16: 12.0). */
#define DL_ATT_BLOCK 32

/* ---- Encoder: token + position embedding ----------------------------------------------------
 * fwd: out (B,T,C) = wte[tokens[b,t]] + wpe[t]; tokens (B,T) in [0, V); wte (V,C); wpe (>=T,C).
 * bwd: dwte[tokens[b,t]] += dout[b,t]; dwpe[t] += dout[b,t] (a repeated token accumulates). */
void dl_encoder_fwd_f32(float *out, const int *tokens, const float *wte, const float *wpe, int B,
                        int T, int C);
void dl_encoder_fwd_f64(double *out, const int *tokens, const double *wte, const double *wpe, int B,
                        int T, int C);
void dl_encoder_bwd_f32(float *dwte, float *dwpe, const float *dout, const int *tokens, int B,
                        int T, int C);
void dl_encoder_bwd_f64(double *dwte, double *dwpe, const double *dout, const int *tokens, int B,
                        int T, int C);

/* ---- LayerNorm over the last dimension, weight and bias, eps DL_LN_EPS ----------------------
 * fwd: inp (N,C) -> out (N,C) = (inp - mean) * rstd * w + b; writes mean (N) and rstd (N) =
 *      1/sqrt(var + eps) (biased variance), which the backward reads (save them, or recompute).
 * bwd: reads dout, inp, w, mean, rstd; dinp (N,C) +=, dw (C) +=, db (C) +=. */
void dl_layernorm_fwd_f32(float *out, float *mean, float *rstd, const float *inp, const float *w,
                          const float *b, int N, int C);
void dl_layernorm_fwd_f64(double *out, double *mean, double *rstd, const double *inp,
                          const double *w, const double *b, int N, int C);
void dl_layernorm_bwd_f32(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                          const float *w, const float *mean, const float *rstd, int N, int C);
void dl_layernorm_bwd_f64(double *dinp, double *dw, double *db, const double *dout,
                          const double *inp, const double *w, const double *mean,
                          const double *rstd, int N, int C);

/* The fused backward in two parts (a backward split into input and weight gradients):
 * bwd_input: dinp (N,C) += as dl_layernorm_bwd; bwd_weight: dw (C) +=, db (C) += as it.
 * Together bitwise the fused kernel's results. */
void dl_layernorm_bwd_input_f32(float *dinp, const float *dout, const float *inp, const float *w,
                                const float *mean, const float *rstd, int N, int C);
void dl_layernorm_bwd_input_f64(double *dinp, const double *dout, const double *inp,
                                const double *w, const double *mean, const double *rstd, int N,
                                int C);
void dl_layernorm_bwd_weight_f32(float *dw, float *db, const float *dout, const float *inp,
                                 const float *mean, const float *rstd, int N, int C);
void dl_layernorm_bwd_weight_f64(double *dw, double *db, const double *dout, const double *inp,
                                 const double *mean, const double *rstd, int N, int C);

/* ---- Linear: out = inp · Wᵀ + bias (one GEMM) -----------------------------------------------
 * fwd: inp (N,IC), W (OC,IC) (layout above), bias (OC) or NULL -> out (N,OC) written.
 * bwd: reads dout (N,OC), inp, W; dinp (N,IC) += dout·W; dW (OC,IC) += doutᵀ·inp;
 *      dbias (OC) += column sums of dout. Any of dinp, dW, dbias may be NULL (not computed). */
void dl_linear_fwd_f32(float *out, const float *inp, const float *W, const float *bias, int N,
                       int IC, int OC);
void dl_linear_fwd_f64(double *out, const double *inp, const double *W, const double *bias, int N,
                       int IC, int OC);
void dl_linear_bwd_f32(float *dinp, float *dW, float *dbias, const float *dout, const float *inp,
                       const float *W, int N, int IC, int OC);
void dl_linear_bwd_f64(double *dinp, double *dW, double *dbias, const double *dout,
                       const double *inp, const double *W, int N, int IC, int OC);
/* As dl_linear_bwd, but WRITES dinp (dinp = dout·W; must not be NULL); dW, dbias still +=. */
void dl_linear_bwd_write_f32(float *dinp, float *dW, float *dbias, const float *dout,
                             const float *inp, const float *W, int N, int IC, int OC);
void dl_linear_bwd_write_f64(double *dinp, double *dW, double *dbias, const double *dout,
                             const double *inp, const double *W, int N, int IC, int OC);

/* ---- GeLU, exact: gelu(x) = x * Φ(x) = 0.5 x (1 + erf(x / √2)) ------------------------------
 * (not the tanh approximation). f64 calls libm's erf; f32 evaluates Φ with its own vectorised
 * erfc (within about 2 ulp, more accurate than 1 + erff(x/√2) in the left tail).
 * fwd: out[i] = gelu(inp[i]), n elements (out may alias inp).
 * bwd: dinp[i] += (Φ(x) + x φ(x)) * dout[i], x = inp[i], φ the standard normal density. */
void dl_gelu_fwd_f32(float *out, const float *inp, size_t n);
void dl_gelu_fwd_f64(double *out, const double *inp, size_t n);
void dl_gelu_bwd_f32(float *dinp, const float *inp, const float *dout, size_t n);
void dl_gelu_bwd_f64(double *dinp, const double *inp, const double *dout, size_t n);
/* Forward that also stores what the backward needs, so the backward is one multiply:
 * fwd_deriv: out[i] = gelu(x), deriv[i] = Φ(x) + x φ(x) (x = inp[i]); deriv may alias inp (the
 *      pre-activation is not needed again), out must not alias either. out and deriv are
 *      bitwise the values of dl_gelu_fwd and of the factor dl_gelu_bwd applies.
 * bwd_deriv: WRITES dinp[i] = deriv[i] * dout[i] (dinp may alias dout), for N rows of C, and
 *      when dbias is not NULL adds the column sums of dinp to dbias (C), as the next linear's
 *      backward would: the bias gradient of the linear that produced the GeLU's input, fused.
 *      Bitwise the results of dl_gelu_bwd into a zeroed dinp followed by that dbias sum. */
void dl_gelu_fwd_deriv_f32(float *out, float *deriv, const float *inp, size_t n);
void dl_gelu_fwd_deriv_f64(double *out, double *deriv, const double *inp, size_t n);
void dl_gelu_bwd_deriv_f32(float *dinp, float *dbias, const float *deriv, const float *dout, int N,
                           int C);
void dl_gelu_bwd_deriv_f64(double *dinp, double *dbias, const double *deriv, const double *dout,
                           int N, int C);

/* ---- Residual add -----------------------------------------------------------------------------
 * fwd: out[i] = a[i] + b[i] (out may alias a or b).  bwd: da[i] += dout[i]; db[i] += dout[i]. */
void dl_residual_fwd_f32(float *out, const float *a, const float *b, size_t n);
void dl_residual_fwd_f64(double *out, const double *a, const double *b, size_t n);
void dl_residual_bwd_f32(float *da, float *db, const float *dout, size_t n);
void dl_residual_bwd_f64(double *da, double *db, const double *dout, size_t n);
/* Bias and residual in one pass (after a row-parallel linear and its all-reduce):
 * out[n,c] = (a[n,c] + bias[c]) + res[n,c] for N rows of C; out may alias a or res. Bitwise the
 * result of adding the bias to a and then dl_residual_fwd. */
void dl_residual_bias_fwd_f32(float *out, const float *a, const float *bias, const float *res,
                              int N, int C);
void dl_residual_bias_fwd_f64(double *out, const double *a, const double *bias, const double *res,
                              int N, int C);

/* ---- Causal multi-head self-attention (after the Q/K/V projection, before the output one) ----
 * q, k, v: row (b,t) starts at [(b*T + t)*ldqkv]; head h of that row is the HS elements at
 * offset h*HS. So a packed qkv buffer (B,T,3C) gives q = qkv, k = qkv + C, v = qkv + 2C,
 * ldqkv = 3C; separate (B,T,C) buffers give ldqkv = C; a TP rank running heads [h0, h0+NH)
 * passes pointers advanced by h0*HS. out: row (b,t) at [(b*T + t)*ldout], NH*HS elements,
 * written. att (B,NH,T,T): the softmax probabilities P, written (zero above the diagonal);
 * the backward reads them. Per (b,h): P = softmax(Q Kᵀ / sqrt(HS), causal mask), O = P V,
 * with one matrix product per DL_ATT_BLOCK rows of Q, skipping blocks above the diagonal (run
 * by the library's own small-product kernel, not BLAS: see ops_gemm.c).
 * bwd: reads dout (stride ldout), q, k, v, att; dq, dk, dv (same layout and stride ldqkv as
 * q, k, v: pass dqkv, dqkv + C, dqkv + 2C for a packed buffer) +=. scratch: T*T elements. */
void dl_attention_fwd_f32(float *out, int ldout, float *att, const float *q, const float *k,
                          const float *v, int ldqkv, int B, int T, int NH, int HS);
void dl_attention_fwd_f64(double *out, int ldout, double *att, const double *q, const double *k,
                          const double *v, int ldqkv, int B, int T, int NH, int HS);
void dl_attention_bwd_f32(float *dq, float *dk, float *dv, float *scratch, const float *dout,
                          int ldout, const float *q, const float *k, const float *v, int ldqkv,
                          const float *att, int B, int T, int NH, int HS);
void dl_attention_bwd_f64(double *dq, double *dk, double *dv, double *scratch, const double *dout,
                          int ldout, const double *q, const double *k, const double *v, int ldqkv,
                          const double *att, int B, int T, int NH, int HS);
/* As dl_attention_bwd, but WRITES dq, dk and dv (every element of the B·T rows' NH heads). */
void dl_attention_bwd_write_f32(float *dq, float *dk, float *dv, float *scratch, const float *dout,
                                int ldout, const float *q, const float *k, const float *v,
                                int ldqkv, const float *att, int B, int T, int NH, int HS);
void dl_attention_bwd_write_f64(double *dq, double *dk, double *dv, double *scratch,
                                const double *dout, int ldout, const double *q, const double *k,
                                const double *v, int ldqkv, const double *att, int B, int T, int NH,
                                int HS);

/* ---- Softmax + cross-entropy over a vocabulary of V ------------------------------------------
 * fwd: logits (N,V), targets (N) in [0, V) -> probs (N,V) = softmax(logits) written (probs may
 *      alias logits); losses (N) = -log probs[target] written unless NULL. Returns the mean loss
 *      over the N rows (summed in double).
 * bwd: WRITES dlogits (N,V) = (probs - onehot(target)) * dloss (dlogits may alias probs).
 *      dloss is d(total loss)/d(loss of one row): 1/N for the mean over these rows; with
 *      micro-batches or data parallelism, 1 / (rows in the whole global batch). */
double dl_crossentropy_fwd_f32(float *probs, float *losses, const float *logits, const int *targets,
                               int N, int V);
double dl_crossentropy_fwd_f64(double *probs, double *losses, const double *logits,
                               const int *targets, int N, int V);
void dl_crossentropy_bwd_f32(float *dlogits, const float *probs, const int *targets, float dloss,
                             int N, int V);
void dl_crossentropy_bwd_f64(double *dlogits, const double *probs, const int *targets, double dloss,
                             int N, int V);

/* ---- AdamW (Loshchilov & Hutter; PyTorch's torch.optim.AdamW) over a flat buffer ------------
 * For each of the n elements, with g = grad * grad_scale (pass the clipping factor, or 1):
 *   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g²
 *   param = param (1 - lr wd) - lr/(1 - beta1^step) · m / (sqrt(v)/sqrt(1 - beta2^step) + eps)
 * i.e. param -= lr (m̂ / (sqrt(v̂) + eps) + wd param): decoupled weight decay, bias correction.
 * step counts from 1. param, m, v updated in place (state in the same precision); grad read. */
void dl_adamw_f32(float *param, const float *grad, float *m, float *v, size_t n, float lr,
                  float beta1, float beta2, float eps, float wd, float grad_scale, long step);
void dl_adamw_f64(double *param, const double *grad, double *m, double *v, size_t n, double lr,
                  double beta1, double beta2, double eps, double wd, double grad_scale, long step);

/* ---- GEMM shape log ------------------------------------------------------------------------
 * While a log is set, every matrix product the calling thread's kernels run is recorded by shape,
 * strides, beta and the kernel that ran it (with a count), so that the same products can be
 * replayed alone through the same kernels: "GEMM utilisation" = model FLOP/s over the FLOP/s of
 * replaying the step's own products on one thread (docs/PERFORMANCE.md). */
#define DL_GEMM_LOG_MAX 256
/* the kernel a logged product ran in: the BLAS, or the attention's small-product kernels */
enum { DL_GEMM_BLAS = 0, DL_GEMM_SMALL_AVX2 = 1, DL_GEMM_SMALL_AVX512 = 2 };
typedef struct dl_gemm_shape {
    int ta, tb, M, N, K; /* row-major C(M,N) = op(A)(M,K) op(B)(K,N) */
    long count;
    int kernel;        /* DL_GEMM_BLAS (0) or a small-product level */
    int lda, ldb, ldc; /* strides; 0: packed (K or M, N or K, N) */
    int zero_beta;     /* 1: C was written (beta 0), 0: accumulated into (beta 1) */
} dl_gemm_shape;
typedef struct dl_gemm_log {
    int n;
    long dropped; /* calls not recorded (more than DL_GEMM_LOG_MAX shapes) */
    dl_gemm_shape s[DL_GEMM_LOG_MAX];
} dl_gemm_log;
/* Start recording this thread's GEMMs into log (zero it first), or stop (NULL). */
void dl_ops_gemm_log(dl_gemm_log *log);
/* GFLOP/s of running the logged products once on this thread, each through the kernel it was
 * logged with (best of reps), f32 (dsize 4) or f64. */
double dl_ops_gemm_replay(const dl_gemm_log *log, int dsize, int reps);

/* The attention's small matrix products run in the library's own kernel where the CPU has
 * AVX-512 (level 2) or AVX2 with FMA (level 1), else through the BLAS (level 0); levels 1 and 2
 * give bitwise the same results. dl_ops_small_mm_cap(c) caps the level for the whole process
 * (c < 0: no cap) and returns the level now in use; the environment variable
 * DISTLAB_SMALL_MM=avx512|avx2|blas sets the cap at start-up. */
int dl_ops_small_mm_cap(int cap);

/* Sum of squares of x (n elements), accumulated in double: a gradient's squared norm for
 * global-norm clipping (reduce the partial sums of all shards, then sqrt). */
double dl_sumsq_f32(const float *x, size_t n);
double dl_sumsq_f64(const double *x, size_t n);

/* ---- bf16 mixed precision (bf16 as uint16_t; rounding to nearest even, NaN kept) ----------- */
void dl_bf16_from_f32(uint16_t *dst, const float *src, size_t n); /* dst = bf16(src) */
void dl_bf16_widen(float *dst, const uint16_t *src, size_t n);    /* dst = f32(src), exact */
void dl_bf16_acc_f32(uint16_t *dst, const float *src, size_t n);  /* dst = bf16(dst + src) */
void dl_bf16_acc(uint16_t *dst, const uint16_t *src, size_t n);   /* dst = bf16(dst + src) */
double dl_sumsq_bf16(const uint16_t *x, size_t n);
/* AdamW on an fp32 master copy from bf16 gradients (each element exactly dl_adamw_f32's
 * arithmetic on the widened gradient), then param = bf16(master) when param is not NULL. */
void dl_adamw_bf16(float *master, const uint16_t *grad, float *m, float *v, size_t n, float lr,
                   float beta1, float beta2, float eps, float wd, float grad_scale, long step,
                   uint16_t *param);

#ifdef __cplusplus
}
#endif
#endif
