/* distlab: the trainer's data: a synthetic byte corpus with an exactly known entropy rate, any
 * file as bytes, the train / validation split, and batches cut by global sample index.
 *
 * ---- The built-in corpus: an order-2 Markov chain over bytes ----
 *
 * The state is the pair (a, b) of the two previous bytes. For every b the generator draws K
 * DISTINCT values off_0(b), ..., off_{K-1}(b) in [0, 256) (splitmix64 keyed by the seed; see
 * dl_data_markov_offsets). The next byte is
 *
 *     c = off_j(b) XOR (a & 1)   with probability p_j,   j = 0 .. K-1,
 *
 * and the state becomes (b, c). By default K = 4 and p = (1/2, 1/4, 1/8, 1/8).
 *
 * Why the entropy rate is exactly H(p): every row of the transition matrix is a permutation of
 * p. The K values off_j(b) are distinct and XOR with the same bit (a & 1) keeps them distinct, so
 * the K successors (b, off_j(b) ^ (a & 1)) of (a, b) are distinct states and the next byte has
 * exactly the distribution p over K distinct values. Hence the conditional entropy of the next
 * byte given the whole past (= given (a, b), the chain being of order 2) is H(p) from EVERY
 * state, and the entropy rate sum_{a,b} pi(a, b) H(P(. | a, b)) is exactly H(p) =
 * -sum_j p_j ln p_j WHATEVER the stationary distribution pi (and from any start, since it holds
 * for every state). For the default p this is 1.75 bits = 1.75 ln 2 = 1.21301 nats per byte: the
 * lowest expected cross-entropy any model can reach on this stream, the loss floor the trainer
 * prints (dl_data_entropy_rate, dl_data_floor).
 *
 * The stationary distribution pi is NOT uniform (the chain is not doubly stochastic): byte c
 * always lies in {off_j(b), off_j(b) ^ 1}, so at most 2K successors of each byte ever occur and
 * most of the 65536 pairs have pi = 0. None of this matters for the entropy rate (above).
 * tests/unit/io/test_data.c computes pi exactly for the default chain (power iteration over the 65536
 * states: 1964 states with pi > 0, pi from 9.0e-6 to 3.7e-3), checks that the generated stream's
 * state frequencies follow it and that sum pi H(row) = H(p).
 *
 * Why "order 2": a model learns the chain in two parts. The bigram table b -> off_j(b) (with
 * probabilities p_j) predicts the next byte up to its low bit, which gets within ln 2 of the
 * floor: the best loss from b alone, H(c | b), is at most H(p) + ln 2 = 1.906 nats by default
 * (1.759 for seed 1). Attending to the previous byte's low bit (a & 1) closes the rest, down to
 * H(p). (The earlier chain c = (a + off_j(b)) mod 256 made the next byte uniform given b alone,
 * a modular-addition task on which small models stayed at ln 256 for hundreds of steps.)
 *
 * Generation: a sequential generator starts at state (0, 0), discards `burn_in` bytes, then
 * writes `synth_bytes` bytes; byte t (t = 0, 1, ...) of that run, counting the burn-in, uses
 * u_t = top 53 bits of splitmix64(key + t * 0x9E3779B97F4A7C15) / 2^53 with key derived from
 * the seed, and picks the first j with u_t < p_0 + ... + p_j. The bytes depend only on (seed, K,
 * p, burn_in, synth_bytes): every rank that opens the corpus gets the identical bytes.
 *
 * ---- Files ----
 *
 * With opts.path set, the file's bytes are the corpus (token = byte value, vocabulary 256).
 *
 * ---- The split (same rule for a file and for the synthetic corpus) ----
 *
 * For a corpus of n bytes and window length seq:
 *     val_len   = max(seq + 1, floor(n * val_fraction))     (default val_fraction 0.1)
 *     train_len = n - val_len
 * The training split is bytes [0, train_len), the validation split the LAST val_len bytes
 * [train_len, n). Both must hold at least one window of seq + 1 bytes; otherwise opening fails
 * with DL_EINVAL and a message naming the file, its size and the size needed.
 *
 * ---- Training samples and batches ----
 *
 * Sample i (i >= 0, the global sample index) is the window of seq + 1 bytes starting at
 *     start(i) = (i * seq) mod (train_len - seq)
 * of the training split; inputs = its first seq bytes, targets = its last seq bytes (the inputs
 * shifted by one). train_len - seq is the number of valid starts (0 .. train_len - seq - 1), so
 * every i gives a whole window; consecutive samples tile the stream (sample i + 1's inputs begin
 * where sample i's end) until the start wraps, and each pass begins at a different phase.
 *
 * Step k (k >= 0) of a run with global batch G uses samples k*G .. k*G + G - 1. Data-parallel
 * rank r of dp takes the contiguous share [r*G/dp, (r+1)*G/dp) of them (G must be divisible by
 * dp), cut in order into micro-batches of mb sequences: micro-batch m of rank r is samples
 *     k*G + r*(G/dp) + m*mb + s,   s = 0 .. mb-1.
 * So the union over dp ranks and micro-batches is exactly the single-rank batch, in order.
 *
 * ---- Validation windows ----
 *
 * Window i (0 <= i < nval, nval = floor((val_len - 1) / seq)) starts at byte offset i*seq of the
 * validation split: inputs = val[i*seq .. i*seq + seq - 1], targets = val[i*seq + 1 .. i*seq + seq].
 * The windows tile the split; a framework that reproduces this rule reproduces the eval loss.
 *
 * Tokens are written as ints 0..255, row-major: sequence s of a batch occupies [s*seq, (s+1)*seq).
 * After dl_data_open a dl_data is read-only: every query below may be called concurrently from
 * any number of threads on one shared dl_data. Functions that can fail return a dl_status code
 * and leave a message (dl_errmsg); none of them exits. */
#ifndef DISTLAB_DATA_H
#define DISTLAB_DATA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DL_DATA_MAX_K 16 /* most branches per state of the synthetic chain */
/* Default cap on a corpus file's size: the whole file is held in memory, so a huge file (or a
 * mistyped path to one) fails at once instead of filling the machine. */
#define DL_DATA_DEFAULT_MAX ((uint64_t)1 << 30)

typedef struct dl_data_opts {
    const char *path;    /* NULL or "": the synthetic corpus; else read this file */
    int seq;             /* window length (context), >= 1; default 64 */
    double val_fraction; /* validation share of the corpus, in (0, 1); default 0.1 */
    /* the synthetic corpus (ignored for a file) */
    uint64_t seed;           /* default 1 */
    size_t synth_bytes;      /* corpus length; default 4 MiB */
    long burn_in;            /* bytes discarded after the start state (0, 0); default 4096 */
    int K;                   /* branches per state, 1 .. DL_DATA_MAX_K; default 4 */
    double p[DL_DATA_MAX_K]; /* branch probabilities p_0 .. p_{K-1}, >= 0, sum 1 (within 1e-9);
                              * default 0.5, 0.25, 0.125, 0.125 */
    uint64_t max_bytes;      /* a file larger than this is refused (only regular files are
                              * read: a FIFO or a device is refused before it is opened);
                              * default (and 0): DL_DATA_DEFAULT_MAX = 1 GiB */
} dl_data_opts;

typedef struct dl_data dl_data;

/* Fill *o with the defaults above. */
void dl_data_opts_init(dl_data_opts *o);

/* Load the file or generate the synthetic corpus and split it. Errors: DL_EINVAL (seq < 1,
 * val_fraction outside (0, 1), bad K or p, synth_bytes below the minimum corpus or burn_in < 0,
 * a missing file, one that is not a regular file (a FIFO or device: refused before it is
 * opened), one larger than max_bytes, an empty file,
 * a corpus too short for one training and one validation window: the message names the file,
 * its size and the bytes needed), DL_ESYS (the file cannot be opened or read otherwise: the message names
 * it and the system's reason), DL_ENOMEM. On success *out must be released with dl_data_free. */
int dl_data_open(const dl_data_opts *o, dl_data **out);
void dl_data_free(dl_data *d);

/* ---- what was loaded ---- */
int dl_data_seq(const dl_data *d);
int dl_data_is_synthetic(const dl_data *d);
/* The corpus name: the file path, or "synthetic(seed=S, K=K)". */
const char *dl_data_name(const dl_data *d);
size_t dl_data_len(const dl_data *d);       /* n: all bytes */
size_t dl_data_train_len(const dl_data *d); /* train_len */
size_t dl_data_val_len(const dl_data *d);   /* val_len */
/* All n bytes: the training split is bytes [0, train_len), validation [train_len, n). */
const unsigned char *dl_data_bytes(const dl_data *d);
/* The loss floor in nats per byte: the entropy rate of the synthetic chain; NAN for a file
 * (unknown). */
double dl_data_floor(const dl_data *d);

/* ---- training samples (rules above) ---- */
/* start(i) as a byte offset in the training split; (size_t)-1 if i < 0. */
size_t dl_data_sample_start(const dl_data *d, long i);
/* Sample i's seq inputs and seq targets. DL_EINVAL for i < 0 or null buffers. */
int dl_data_sample(const dl_data *d, long i, int *inputs, int *targets);
/* Micro-batch `micro` (of mb sequences) of dp rank dp_rank at step `step`: mb*seq inputs and
 * mb*seq targets. DL_EINVAL (with the reason) for step < 0, G < 1, dp < 1, dp_rank outside
 * [0, dp), G not divisible by dp, mb < 1, micro < 0, (micro + 1)*mb > G/dp, null buffers, or an
 * index overflowing a long. */
int dl_data_batch(const dl_data *d, long step, int G, int dp, int dp_rank, int micro, int mb,
                  int *inputs, int *targets);

/* ---- validation windows (rule above) ---- */
long dl_data_val_windows(const dl_data *d); /* nval = floor((val_len - 1) / seq) */
/* Window i's seq inputs and seq targets. DL_EINVAL for i outside [0, nval) or null buffers. */
int dl_data_val_window(const dl_data *d, long i, int *inputs, int *targets);

/* ---- the synthetic chain, standalone ---- */
/* Entropy rate H(p) = -sum p_j ln p_j in nats (terms with p_j = 0 contribute 0). NAN when p is
 * NULL, K outside [1, DL_DATA_MAX_K], a p_j is negative or not finite, or |sum p - 1| > 1e-9. */
double dl_data_entropy_rate(const double *p, int K);
/* The values off[b*K + j] = off_j(b), distinct for each b (the next byte is off_j(b) ^ (a & 1)).
 * Drawn as successive values splitmix64(key + n * 0x9E3779B97F4A7C15) mod 256, n = 0, 1, ...,
 * with key derived from the seed, skipping a value already taken for the same b. DL_EINVAL for
 * bad K or a null buffer. */
int dl_data_markov_offsets(uint64_t seed, int K, unsigned char *off);
/* n bytes of the chain (seed, K, p) after burn_in discarded bytes from state (0, 0), into out:
 * exactly the bytes dl_data_open generates for synth_bytes = n. DL_EINVAL for bad arguments. */
int dl_data_markov_generate(uint64_t seed, int K, const double *p, long burn_in, size_t n,
                            unsigned char *out);

#ifdef __cplusplus
}
#endif
#endif
