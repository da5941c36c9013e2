/* The trainer's data (include/distlab/data.h): the synthetic chain's entropy rate, offsets,
 * legal transitions, exact stationary distribution and determinism; the split; training samples
 * and batches by global index (every dp layout gives the single-rank batch); validation windows;
 * errors.
 *
 * Statistical checks use a long stream (16 MiB; 2 MiB with DISTLAB_TEST_SCALE=small). The
 * conditional entropy is estimated from the counts n(a, b, c) with the Miller-Madow correction
 * (plug-in + (sum over states of (observed outcomes - 1)) / 2N), whose remaining bias is far
 * below the tolerance; the statistical error is about 0.57 / sqrt(N) nats. The stationary
 * distribution pi of the default chain (seed 1) is computed exactly by power iteration over the
 * 65536 states and the stream's state frequencies are compared with it. */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "../testutil.h"

/* Check's ck_assert records a checkpoint through a pipe on every call, so hot loops count
 * failures with BAD() and assert once afterwards. */
#define BAD(bad, cond) ((bad) += !(cond))

static const double P_DEFAULT[4] = {0.5, 0.25, 0.125, 0.125};

static size_t stream_len(void) { return DL_TEST_SMALL ? ((size_t)2 << 20) : ((size_t)16 << 20); }

/* ---------------------------------------------------------------------------------------- */

START_TEST(test_entropy_rate)
{
    double h = dl_data_entropy_rate(P_DEFAULT, 4);
    ck_assert_msg(fabs(h - 1.75 * log(2.0)) < 1e-15, "H = %.17g", h);
    ck_assert_msg(fabs(h - 1.2130) < 1e-4, "H = %.6f nats", h);
    double one = 1.0;
    ck_assert(dl_data_entropy_rate(&one, 1) == 0.0);
    double u[16];
    for (int j = 0; j < 16; j++) u[j] = 1.0 / 16;
    ck_assert(fabs(dl_data_entropy_rate(u, 16) - log(16.0)) < 1e-14);
    double z[3] = {0.5, 0.0, 0.5}; /* a zero branch contributes nothing */
    ck_assert(fabs(dl_data_entropy_rate(z, 3) - log(2.0)) < 1e-15);
    double bad[2] = {0.5, 0.6}, neg[2] = {1.5, -0.5};
    ck_assert(isnan(dl_data_entropy_rate(bad, 2)));
    ck_assert(isnan(dl_data_entropy_rate(neg, 2)));
    ck_assert(isnan(dl_data_entropy_rate(NULL, 4)));
    ck_assert(isnan(dl_data_entropy_rate(u, 0)));
    ck_assert(isnan(dl_data_entropy_rate(u, DL_DATA_MAX_K + 1)));

    /* the corpus reports it as its floor; a file has none */
    dl_data_opts o;
    dl_data_opts_init(&o);
    o.synth_bytes = 1 << 16;
    dl_data *d = NULL;
    ck_assert_int_eq(dl_data_open(&o, &d), DL_OK);
    ck_assert(dl_data_is_synthetic(d));
    ck_assert(fabs(dl_data_floor(d) - 1.75 * log(2.0)) < 1e-15);
    dl_data_free(d);
}
END_TEST

START_TEST(test_offsets_distinct)
{
    static const int Ks[] = {1, 2, 4, 7, 16};
    static const uint64_t seeds[] = {0, 1, 2, 12345, 0xFFFFFFFFFFFFFFFFull};
    unsigned char off[256 * DL_DATA_MAX_K], off2[256 * DL_DATA_MAX_K];
    for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++)
        for (size_t si = 0; si < sizeof seeds / sizeof seeds[0]; si++) {
            int K = Ks[ki];
            ck_assert_int_eq(dl_data_markov_offsets(seeds[si], K, off), DL_OK);
            long bad = 0;
            for (int b = 0; b < 256; b++)
                for (int j = 0; j < K; j++)
                    for (int l = 0; l < j; l++) BAD(bad, off[b * K + j] != off[b * K + l]);
            ck_assert_msg(bad == 0, "K %d seed %llu: %ld equal offset pairs", K,
                          (unsigned long long)seeds[si], bad);
            ck_assert_int_eq(dl_data_markov_offsets(seeds[si], K, off2), DL_OK);
            ck_assert(memcmp(off, off2, (size_t)256 * K) == 0);
        }
    /* different seeds give different offsets */
    ck_assert_int_eq(dl_data_markov_offsets(1, 4, off), DL_OK);
    ck_assert_int_eq(dl_data_markov_offsets(2, 4, off2), DL_OK);
    ck_assert(memcmp(off, off2, 256 * 4) != 0);
    ck_assert_int_eq(dl_data_markov_offsets(1, 0, off), DL_EINVAL);
    ck_assert_int_eq(dl_data_markov_offsets(1, DL_DATA_MAX_K + 1, off), DL_EINVAL);
    ck_assert_int_eq(dl_data_markov_offsets(1, 4, NULL), DL_EINVAL);
}
END_TEST

/* Legal transitions, branch frequencies and empirical conditional entropy of a long stream. */
START_TEST(test_empirical_entropy)
{
    size_t N = stream_len();
    uint64_t seed = 1;
    unsigned char *s = tu_alloc(N + 2);
    uint32_t *cnt = calloc((size_t)1 << 24, sizeof *cnt); /* n(a, b, c) at (a << 16 | b << 8 | c) */
    unsigned char off[256 * 4];
    ck_assert(s && cnt);
    ck_assert_int_eq(dl_data_markov_offsets(seed, 4, off), DL_OK);
    ck_assert_int_eq(dl_data_markov_generate(seed, 4, P_DEFAULT, 4096, N + 2, s), DL_OK);

    /* every transition is one of the K allowed ones, c = off_j(b) ^ (a & 1); count which branch
     * it took */
    uint64_t branch[5] = {0}; /* branch[4]: not a transition of the chain */
    for (size_t t = 2; t < N + 2; t++) {
        unsigned a = s[t - 2], b = s[t - 1], c = s[t];
        cnt[a << 16 | b << 8 | c]++;
        unsigned v = c ^ (a & 1u);
        int j = 0;
        while (j < 4 && off[b * 4 + j] != v) j++;
        branch[j]++;
    }
    ck_assert_msg(branch[4] == 0, "%llu bytes are not transitions of the chain",
                  (unsigned long long)branch[4]);
    for (int j = 0; j < 4; j++) {
        double f = (double)branch[j] / (double)N;
        double sd = sqrt(P_DEFAULT[j] * (1 - P_DEFAULT[j]) / (double)N);
        ck_assert_msg(fabs(f - P_DEFAULT[j]) < 6 * sd, "branch %d: frequency %.6f vs %.6f", j, f,
                      P_DEFAULT[j]);
    }

    /* conditional entropy from the counts: plug-in and Miller-Madow */
    double hsum = 0; /* sum n log n(a,b,c) - sum n(a,b) log n(a,b) */
    long extra = 0;  /* sum over states of (outcomes seen - 1) */
    for (unsigned ab = 0; ab < 65536; ab++) {
        const uint32_t *row = cnt + ((size_t)ab << 8);
        double nab = 0;
        int seen = 0;
        for (unsigned c = 0; c < 256; c++)
            if (row[c]) {
                nab += row[c];
                hsum -= (double)row[c] * log((double)row[c]);
                seen++;
            }
        if (nab > 0) {
            hsum += nab * log(nab);
            extra += seen - 1;
        }
    }
    double h_plugin = hsum / (double)N;
    double h_mm = h_plugin + (double)extra / (2.0 * (double)N);
    double h = dl_data_entropy_rate(P_DEFAULT, 4);
    double tol = DL_TEST_SMALL ? 0.01 : 0.003;
    fprintf(stderr, "test_data: N = %zu: plug-in %.5f, Miller-Madow %.5f, exact %.5f nats\n", N,
            h_plugin, h_mm, h);
    ck_assert_msg(fabs(h_mm - h) < tol, "empirical conditional entropy %.5f vs exact %.5f nats",
                  h_mm, h);

    free(cnt);
    free(s);
}
END_TEST

/* One step of the exact state distribution: y = x P, state (a, b) at index a << 8 | b, moving
 * to (b, off_j(b) ^ (a & 1)) with probability p_j. */
static void chain_step(const unsigned char *off, const double *x, double *y)
{
    memset(y, 0, 65536 * sizeof *y);
    for (unsigned ab = 0; ab < 65536; ab++) {
        if (x[ab] == 0)
            continue;
        unsigned a = ab >> 8, b = ab & 255u;
        for (int j = 0; j < 4; j++) y[b << 8 | (off[b * 4 + j] ^ (a & 1u))] += P_DEFAULT[j] * x[ab];
    }
}

static double l1_diff(const double *x, const double *y)
{
    double d = 0;
    for (int i = 0; i < 65536; i++) d += fabs(x[i] - y[i]);
    return d;
}

#define STAT_MAX_STEPS 20000

/* The stationary distribution of the default chain (seed 1): power iteration from uniform until
 * the L1 change of one step is < 1e-12 (or STAT_MAX_STEPS steps). Returns pi (malloc'd); the
 * steps taken and the last change in *steps, *change. */
static double *stationary(const unsigned char *off, int *steps, double *change)
{
    double *x = malloc(65536 * sizeof *x), *y = malloc(65536 * sizeof *y);
    ck_assert(x && y);
    for (int i = 0; i < 65536; i++) x[i] = 1.0 / 65536;
    double ch = 1;
    int k = 0;
    while (k < STAT_MAX_STEPS && ch >= 1e-12) {
        chain_step(off, x, y);
        ch = l1_diff(x, y);
        double *t = x;
        x = y;
        y = t;
        k++;
    }
    free(y);
    *steps = k;
    *change = ch;
    return x;
}

/* pi is stationary, sums to 1, and the entropy rate sum pi(a, b) H(P(. | a, b)) is H(p): every
 * row of the transition matrix (built here from the documented rule, merging equal successors
 * should there be any) has K distinct successors and entropy H(p). */
START_TEST(test_stationary_exact)
{
    unsigned char off[256 * 4];
    ck_assert_int_eq(dl_data_markov_offsets(1, 4, off), DL_OK);
    int steps;
    double change;
    double *pi = stationary(off, &steps, &change);
    double *y = malloc(65536 * sizeof *y);
    ck_assert(y != NULL);
    chain_step(off, pi, y);
    double again = l1_diff(pi, y);
    double sum = 0, pmin = INFINITY, pmax = 0;
    int support = 0;
    for (int i = 0; i < 65536; i++) {
        sum += pi[i];
        if (pi[i] > 1e-15) {
            support++;
            if (pi[i] < pmin)
                pmin = pi[i];
            if (pi[i] > pmax)
                pmax = pi[i];
        }
    }
    /* the byte marginal and the best bigram loss H(c | b) under pi (at most H(p) + ln 2) */
    double hcb = 0;
    int bytes_seen = 0;
    for (unsigned b = 0; b < 256; b++) {
        double pb = 0, pbc[256] = {0};
        for (unsigned c = 0; c < 256; c++) pb += pi[b << 8 | c];
        for (unsigned a = 0; a < 256; a++) {
            double w = pi[a << 8 | b];
            if (w == 0)
                continue;
            for (int j = 0; j < 4; j++) pbc[off[b * 4 + j] ^ (a & 1u)] += w * P_DEFAULT[j];
        }
        double pb_in = 0;
        for (unsigned c = 0; c < 256; c++) pb_in += pbc[c];
        if (pb > 1e-15)
            bytes_seen++;
        for (unsigned c = 0; c < 256; c++)
            if (pbc[c] > 0)
                hcb -= pbc[c] * log(pbc[c] / pb_in);
    }
    fprintf(stderr,
            "test_data: stationary distribution (seed 1): %d power steps from uniform (last L1 "
            "change %.2e, one more step %.2e); %d states with pi > 1e-15 over %d bytes; pi min "
            "%.3e, max %.3e (uniform over the support %.3e); best bigram loss H(c|b) %.5f nats\n",
            steps, change, again, support, bytes_seen, pmin, pmax, 1.0 / support, hcb);
    ck_assert_msg(change < 1e-12, "power iteration: L1 change %.3e after %d steps", change, steps);
    ck_assert_msg(again < 1e-10, "pi is not stationary: one step changes it by %.3e", again);
    ck_assert_msg(fabs(sum - 1) < 1e-12, "pi sums to %.17g", sum);

    /* rows: K distinct successors with probabilities p, entropy H(p); the rate under pi */
    double h = dl_data_entropy_rate(P_DEFAULT, 4);
    double rate = 0, worst = 0;
    long bad = 0;
    for (unsigned ab = 0; ab < 65536; ab++) {
        unsigned a = ab >> 8, b = ab & 255u;
        double row[256] = {0};
        for (int j = 0; j < 4; j++) row[off[b * 4 + j] ^ (a & 1u)] += P_DEFAULT[j];
        int nz = 0;
        double hr = 0;
        for (unsigned c = 0; c < 256; c++)
            if (row[c] > 0) {
                nz++;
                hr -= row[c] * log(row[c]);
            }
        BAD(bad, nz == 4);
        if (fabs(hr - h) > worst)
            worst = fabs(hr - h);
        rate += pi[ab] * hr;
    }
    fprintf(stderr,
            "test_data: entropy rate under pi %.15f, H(p) %.15f nats (max row |H - H(p)| "
            "%.1e)\n",
            rate, h, worst);
    ck_assert_msg(bad == 0, "%ld states without 4 distinct successors", bad);
    ck_assert_msg(worst < 1e-15, "a row's entropy differs from H(p) by %.3e", worst);
    ck_assert_msg(fabs(rate - h) < 1e-12, "entropy rate under pi %.17g vs H(p) %.17g", rate, h);
    ck_assert_msg(hcb <= h + log(2.0) + 1e-12 && hcb > h, "H(c|b) = %.6f", hcb);
    free(y);
    free(pi);
}
END_TEST

/* A long generated stream visits the states with the frequencies pi: chi-square per degree of
 * freedom near 1 over the states with expected count >= 5, and no state with pi = 0. */
START_TEST(test_stationary_stream)
{
    unsigned char off[256 * 4];
    ck_assert_int_eq(dl_data_markov_offsets(1, 4, off), DL_OK);
    int steps;
    double change;
    double *pi = stationary(off, &steps, &change);
    ck_assert_msg(change < 1e-12, "power iteration: L1 change %.3e after %d steps", change, steps);

    size_t N = stream_len();
    unsigned char *s = tu_alloc(N + 1);
    uint32_t *cnt = calloc(65536, sizeof *cnt); /* n(b, c) of the N states (s[t-1], s[t]) */
    ck_assert(s && cnt);
    ck_assert_int_eq(dl_data_markov_generate(1, 4, P_DEFAULT, 4096, N + 1, s), DL_OK);
    for (size_t t = 1; t < N + 1; t++) cnt[(unsigned)s[t - 1] << 8 | s[t]]++;

    double chi2 = 0, emass = 0;
    long cells = 0, outside = 0, zero_pi = 0;
    for (unsigned x = 0; x < 65536; x++) {
        double e = (double)N * pi[x];
        if (pi[x] < 1e-15)
            zero_pi += cnt[x];
        if (e >= 5) {
            double dv = (double)cnt[x] - e;
            chi2 += dv * dv / e;
            emass += pi[x];
            cells++;
        } else {
            outside += cnt[x];
        }
    }
    double per_df = chi2 / (double)(cells - 1);
    fprintf(stderr,
            "test_data: stream of %zu states vs pi: chi2/df %.3f over %ld states with E >= 5 "
            "(pi mass %.6f); %ld visits elsewhere, %ld to states with pi = 0\n",
            N, per_df, cells, emass, outside, zero_pi);
    ck_assert_msg(zero_pi == 0, "%ld visits to states with pi = 0", zero_pi);
    ck_assert_msg(cells > 100, "only %ld states with expected count >= 5", cells);
    /* the samples are a Markov chain, not independent draws: allow some slack around 1 */
    ck_assert_msg(per_df > 0.5 && per_df < 2.0, "chi2/df = %.3f over %ld states", per_df, cells);
    free(cnt);
    free(s);
    free(pi);
}
END_TEST

START_TEST(test_determinism)
{
    dl_data_opts o;
    dl_data_opts_init(&o);
    o.synth_bytes = DL_TEST_SMALL ? (1 << 18) : (4 << 20);
    dl_data *d1 = NULL, *d2 = NULL, *d3 = NULL;
    ck_assert_int_eq(dl_data_open(&o, &d1), DL_OK);
    ck_assert_int_eq(dl_data_open(&o, &d2), DL_OK);
    o.seed = 2;
    ck_assert_int_eq(dl_data_open(&o, &d3), DL_OK);
    size_t n = o.synth_bytes;
    ck_assert_uint_eq(dl_data_len(d1), n);
    ck_assert(memcmp(dl_data_bytes(d1), dl_data_bytes(d2), n) == 0);
    size_t same = 0;
    for (size_t i = 0; i < n; i++) same += dl_data_bytes(d1)[i] == dl_data_bytes(d3)[i];
    ck_assert_msg(same < n / 64, "seeds 1 and 2 agree on %zu of %zu bytes", same, n);
    ck_assert_str_eq(dl_data_name(d1), "synthetic(seed=1, K=4)");

    /* dl_data_open's bytes are dl_data_markov_generate's; burn-in is a prefix skipped */
    unsigned char *g = malloc(n + 4096);
    ck_assert(g != NULL);
    ck_assert_int_eq(dl_data_markov_generate(1, 4, P_DEFAULT, 0, n + 4096, g), DL_OK);
    ck_assert(memcmp(g + 4096, dl_data_bytes(d1), n) == 0);
    /* a prefix of a longer corpus is the shorter corpus */
    ck_assert_int_eq(dl_data_markov_generate(1, 4, P_DEFAULT, 4096, 1000, g), DL_OK);
    ck_assert(memcmp(g, dl_data_bytes(d1), 1000) == 0);
    free(g);
    dl_data_free(d1);
    dl_data_free(d2);
    dl_data_free(d3);
}
END_TEST

/* The rank threads of a world open the corpus independently and get the same bytes. */
#define WRANKS 4
typedef struct world_arg {
    size_t n;
    uint64_t hash[WRANKS];
    size_t len[WRANKS];
} world_arg;

static int open_on_rank(dl_ctx *ctx, void *argp)
{
    world_arg *a = argp;
    dl_data_opts o;
    dl_data_opts_init(&o);
    o.synth_bytes = a->n;
    dl_data *d = NULL;
    int st = dl_data_open(&o, &d);
    if (st != DL_OK)
        return st;
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    const unsigned char *b = dl_data_bytes(d);
    for (size_t i = 0; i < dl_data_len(d); i++) h = (h ^ b[i]) * 1099511628211ull;
    int r = dl_ctx_rank(ctx);
    a->hash[r] = h;
    a->len[r] = dl_data_len(d);
    dl_data_free(d);
    return DL_OK;
}

START_TEST(test_ranks_identical)
{
    world_arg a;
    memset(&a, 0, sizeof a);
    a.n = DL_TEST_SMALL ? (1 << 18) : (4 << 20);
    ck_assert_msg(tu_run_world(WRANKS, open_on_rank, &a) == DL_OK, "%s", dl_errmsg());
    for (int r = 0; r < WRANKS; r++) {
        ck_assert_uint_eq(a.len[r], a.n);
        ck_assert_msg(a.hash[r] == a.hash[0], "rank %d's corpus differs from rank 0's", r);
    }
}
END_TEST

/* ---------------------------------------------------------------------------------------- */
/* Split, samples, batches, validation                                                       */

static char tmpdir[256];

static const char *tmp_path(const char *name)
{
    static char buf[512];
    if (!tmpdir[0]) {
        const char *t = getenv("TMPDIR");
        snprintf(tmpdir, sizeof tmpdir, "%s/dl_test_data_XXXXXX", t && t[0] ? t : "/tmp");
        ck_assert(mkdtemp(tmpdir) != NULL);
    }
    snprintf(buf, sizeof buf, "%s/%s", tmpdir, name);
    return buf;
}

/* Write n bytes: byte i = (i * 7 + i / 256) mod 256 (not periodic in 256). */
static void write_file(const char *path, size_t n)
{
    FILE *f = fopen(path, "wb");
    ck_assert_msg(f != NULL, "cannot create %s", path);
    for (size_t i = 0; i < n; i++) fputc((int)((i * 7 + i / 256) & 255u), f);
    ck_assert_int_eq(fclose(f), 0);
}

/* Remove this test's directory (each Check test runs in its own process). */
static void tmp_cleanup(void)
{
    if (tmpdir[0])
        rmdir(tmpdir);
    tmpdir[0] = '\0';
}

static unsigned file_byte(size_t i) { return (unsigned)((i * 7 + i / 256) & 255u); }

START_TEST(test_split_file)
{
    const char *p = tmp_path("split.bin");
    write_file(p, 1000);
    dl_data_opts o;
    dl_data_opts_init(&o);
    o.path = p;
    o.seq = 16;
    dl_data *d = NULL;
    ck_assert_int_eq(dl_data_open(&o, &d), DL_OK);
    ck_assert(!dl_data_is_synthetic(d));
    ck_assert(isnan(dl_data_floor(d)));
    ck_assert_str_eq(dl_data_name(d), p);
    ck_assert_uint_eq(dl_data_len(d), 1000);
    ck_assert_uint_eq(dl_data_val_len(d), 100); /* floor(1000 * 0.1) */
    ck_assert_uint_eq(dl_data_train_len(d), 900);
    long bad = 0;
    for (size_t i = 0; i < 1000; i++) BAD(bad, dl_data_bytes(d)[i] == file_byte(i));
    ck_assert_int_eq(bad, 0);
    dl_data_free(d);

    /* val_len = max(seq + 1, floor(n f)) */
    o.seq = 40;
    ck_assert_int_eq(dl_data_open(&o, &d), DL_OK);
    ck_assert_uint_eq(dl_data_val_len(d), 100);
    dl_data_free(d);
    o.seq = 150;
    ck_assert_int_eq(dl_data_open(&o, &d), DL_OK);
    ck_assert_uint_eq(dl_data_val_len(d), 151);
    ck_assert_uint_eq(dl_data_train_len(d), 849);
    dl_data_free(d);
    o.seq = 16;
    o.val_fraction = 0.25;
    ck_assert_int_eq(dl_data_open(&o, &d), DL_OK);
    ck_assert_uint_eq(dl_data_val_len(d), 250);
    dl_data_free(d);

    /* the synthetic corpus gets the same split */
    dl_data_opts_init(&o);
    o.seq = 32;
    o.synth_bytes = 12345;
    ck_assert_int_eq(dl_data_open(&o, &d), DL_OK);
    ck_assert_uint_eq(dl_data_val_len(d), 1234);
    ck_assert_uint_eq(dl_data_train_len(d), 12345 - 1234);
    dl_data_free(d);
    unlink(p);
    tmp_cleanup();
}
END_TEST

/* The documented start rule, computed here independently. */
static size_t ref_start(size_t train_len, int seq, long i)
{
    uint64_t m = train_len - (size_t)seq;
    return (size_t)(((uint64_t)i % m) * (uint64_t)seq % m);
}

START_TEST(test_samples)
{
    dl_data_opts o;
    dl_data_opts_init(&o);
    o.seq = 16;
    o.synth_bytes = 1000; /* train 900: wraps after 55 samples */
    dl_data *d = NULL;
    ck_assert_int_eq(dl_data_open(&o, &d), DL_OK);
    size_t tl = dl_data_train_len(d);
    ck_assert_uint_eq(tl, 900);
    const unsigned char *B = dl_data_bytes(d);
    int in[16], tg[16];
    long wraps = 0, bad = 0;
    for (long i = 0; i < 2000; i++) {
        size_t st = dl_data_sample_start(d, i);
        BAD(bad, st == ref_start(tl, 16, i));
        BAD(bad, st + 17 <= tl);
        if (i > 0) {
            size_t prev = dl_data_sample_start(d, i - 1);
            if (st != prev + 16) {
                wraps++;
                BAD(bad, prev + 16 >= tl - 16); /* wraps only when the next start is invalid */
            }
        }
        BAD(bad, dl_data_sample(d, i, in, tg) == DL_OK);
        for (int t = 0; t < 16; t++) {
            BAD(bad, in[t] == B[st + t]);
            BAD(bad, tg[t] == B[st + t + 1]);
        }
    }
    ck_assert_msg(bad == 0, "%ld sample checks failed", bad);
    ck_assert(wraps > 30);
    ck_assert_uint_eq(dl_data_sample_start(d, 0), 0);
    ck_assert_uint_eq(dl_data_sample_start(d, 3), 48);
    /* any index is well defined */
    ck_assert_uint_eq(dl_data_sample_start(d, 0x7FFFFFFFFFFFFFFFL),
                      ref_start(tl, 16, 0x7FFFFFFFFFFFFFFFL));
    ck_assert_uint_eq(dl_data_sample_start(d, -1), (size_t)-1);
    ck_assert_int_eq(dl_data_sample(d, -1, in, tg), DL_EINVAL);
    ck_assert_int_eq(dl_data_sample(d, 0, NULL, tg), DL_EINVAL);
    dl_data_free(d);
}
END_TEST

/* Every (G, dp, mb) layout gives the single-rank batch, sample for sample and byte for byte. */
START_TEST(test_batch_union)
{
    dl_data_opts o;
    dl_data_opts_init(&o);
    o.seq = 16;
    o.synth_bytes = 3001;
    dl_data *d = NULL;
    ck_assert_int_eq(dl_data_open(&o, &d), DL_OK);
    const int seq = 16;
    size_t tl = dl_data_train_len(d);
    const unsigned char *B = dl_data_bytes(d);
    static const int layouts[][3] = {/* G, dp, mb */
                                     {1, 1, 1},  {8, 1, 8},   {8, 2, 2},  {8, 4, 1},
                                     {8, 8, 1},  {12, 3, 2},  {12, 4, 3}, {12, 2, 6},
                                     {24, 6, 2}, {16, 16, 1}, {60, 5, 4}};
    int *ref_in = malloc(60 * seq * sizeof(int)), *ref_tg = malloc(60 * seq * sizeof(int));
    int *in = malloc(60 * seq * sizeof(int)), *tg = malloc(60 * seq * sizeof(int));
    ck_assert(ref_in && ref_tg && in && tg);
    long nsteps = DL_TEST_SMALL ? 20 : 60;
    for (size_t li = 0; li < sizeof layouts / sizeof layouts[0]; li++) {
        int G = layouts[li][0], dp = layouts[li][1], mb = layouts[li][2], share = G / dp;
        for (long k = 0; k < nsteps; k++) {
            ck_assert_int_eq(dl_data_batch(d, k, G, 1, 0, 0, G, ref_in, ref_tg), DL_OK);
            /* the single-rank batch is the documented samples k*G .. k*G + G - 1 */
            long bad = 0;
            for (int s = 0; s < G; s++) {
                size_t st = ref_start(tl, seq, k * G + s);
                for (int t = 0; t < seq; t++) {
                    BAD(bad, ref_in[s * seq + t] == B[st + t]);
                    BAD(bad, ref_tg[s * seq + t] == B[st + t + 1]);
                }
            }
            ck_assert_msg(bad == 0, "G %d step %ld: %ld tokens differ from the rule", G, k, bad);
            /* concatenating rank 0's micro-batches, then rank 1's, ... gives it back */
            int filled = 0;
            for (int r = 0; r < dp; r++)
                for (int m = 0; m < share / mb; m++) {
                    BAD(bad, dl_data_batch(d, k, G, dp, r, m, mb, in + filled * seq,
                                           tg + filled * seq) == DL_OK);
                    filled += mb;
                }
            ck_assert_msg(bad == 0, "G %d dp %d mb %d step %ld: a micro-batch failed: %s", G, dp,
                          mb, k, dl_errmsg());
            ck_assert_int_eq(filled, G);
            ck_assert_msg(memcmp(in, ref_in, (size_t)G * seq * sizeof(int)) == 0 &&
                              memcmp(tg, ref_tg, (size_t)G * seq * sizeof(int)) == 0,
                          "G %d dp %d mb %d step %ld: union differs from the single-rank batch", G,
                          dp, mb, k);
        }
    }
    /* errors */
    ck_assert_int_eq(dl_data_batch(d, 0, 10, 4, 0, 0, 1, in, tg), DL_EINVAL); /* 10 % 4 */
    ck_assert(strstr(dl_errmsg(), "divisible") != NULL);
    ck_assert_int_eq(dl_data_batch(d, 0, 8, 2, 2, 0, 1, in, tg), DL_EINVAL); /* rank >= dp */
    ck_assert_int_eq(dl_data_batch(d, 0, 8, 2, -1, 0, 1, in, tg), DL_EINVAL);
    ck_assert_int_eq(dl_data_batch(d, 0, 8, 2, 1, 2, 2, in, tg), DL_EINVAL); /* past the share */
    ck_assert_int_eq(dl_data_batch(d, 0, 8, 2, 1, 1, 2, in, tg), DL_OK);
    ck_assert_int_eq(dl_data_batch(d, 0, 8, 2, 1, 0, 5, in, tg), DL_EINVAL); /* mb > share */
    ck_assert_int_eq(dl_data_batch(d, 0, 8, 2, 1, 0, 0, in, tg), DL_EINVAL);
    ck_assert_int_eq(dl_data_batch(d, 0, 8, 2, 1, -1, 1, in, tg), DL_EINVAL);
    ck_assert_int_eq(dl_data_batch(d, -1, 8, 2, 1, 0, 1, in, tg), DL_EINVAL);
    ck_assert_int_eq(dl_data_batch(d, 0, 0, 1, 0, 0, 1, in, tg), DL_EINVAL);
    ck_assert_int_eq(dl_data_batch(d, 0, 8, 0, 0, 0, 1, in, tg), DL_EINVAL);
    ck_assert_int_eq(dl_data_batch(d, 0, 8, 1, 0, 0, 1, NULL, tg), DL_EINVAL);
    ck_assert_int_eq(dl_data_batch(d, 0x7FFFFFFFFFFFFFFFL, 8, 1, 0, 0, 1, in, tg), DL_EINVAL);
    free(ref_in);
    free(ref_tg);
    free(in);
    free(tg);
    dl_data_free(d);
}
END_TEST

START_TEST(test_val_windows)
{
    const char *p = tmp_path("val.bin");
    write_file(p, 1000);
    dl_data_opts o;
    dl_data_opts_init(&o);
    o.path = p;
    static const int seqs[] = {1, 7, 16, 33, 99};
    for (size_t si = 0; si < sizeof seqs / sizeof seqs[0]; si++) {
        int seq = seqs[si];
        o.seq = seq;
        dl_data *d = NULL;
        ck_assert_int_eq(dl_data_open(&o, &d), DL_OK);
        size_t tl = dl_data_train_len(d), vl = dl_data_val_len(d);
        ck_assert_uint_eq(tl + vl, 1000);
        long nval = dl_data_val_windows(d);
        ck_assert_int_eq(nval, (long)((vl - 1) / (size_t)seq));
        ck_assert(nval >= 1);
        int *in = malloc((size_t)seq * sizeof(int)), *tg = malloc((size_t)seq * sizeof(int));
        ck_assert(in && tg);
        long bad = 0;
        for (long i = 0; i < nval; i++) {
            BAD(bad, dl_data_val_window(d, i, in, tg) == DL_OK);
            for (int t = 0; t < seq; t++) {
                size_t off = tl + (size_t)i * seq + t; /* offset i*seq of the validation split */
                BAD(bad, in[t] == (int)file_byte(off));
                BAD(bad, tg[t] == (int)file_byte(off + 1));
            }
        }
        ck_assert_msg(bad == 0, "seq %d: %ld validation checks failed", seq, bad);
        /* the last window's last target is inside the file, one more window would not be */
        ck_assert((size_t)nval * seq + 1 <= vl);
        ck_assert((size_t)(nval + 1) * seq + 1 > vl);
        ck_assert_int_eq(dl_data_val_window(d, nval, in, tg), DL_EINVAL);
        ck_assert_int_eq(dl_data_val_window(d, -1, in, tg), DL_EINVAL);
        free(in);
        free(tg);
        dl_data_free(d);
    }
    unlink(p);
    tmp_cleanup();
}
END_TEST

START_TEST(test_errors)
{
    dl_data_opts o;
    dl_data_opts_init(&o);
    dl_data *d = (dl_data *)&o; /* must be reset to NULL on failure */

    /* missing file */
    const char *miss = tmp_path("no-such-file.bin");
    o.path = miss;
    o.seq = 16;
    ck_assert_int_eq(dl_data_open(&o, &d), DL_EINVAL);
    ck_assert(d == NULL);
    ck_assert_msg(strstr(dl_errmsg(), miss) && strstr(dl_errmsg(), "No such file"), "%s",
                  dl_errmsg());

    /* only regular files are read: a directory, a device (it never ends) */
    o.path = tmpdir;
    ck_assert_int_eq(dl_data_open(&o, &d), DL_EINVAL);
    ck_assert_msg(strstr(dl_errmsg(), tmpdir) && strstr(dl_errmsg(), "is a directory"), "%s",
                  dl_errmsg());
    o.path = "/dev/zero";
    ck_assert_int_eq(dl_data_open(&o, &d), DL_EINVAL);
    ck_assert_msg(strstr(dl_errmsg(), "character device"), "%s", dl_errmsg());

    /* the size cap: one byte over is refused, exactly at it is read */
    char capped[512];
    snprintf(capped, sizeof capped, "%s", tmp_path("capped.bin"));
    write_file(capped, 4096);
    o.path = capped;
    o.max_bytes = 4095;
    ck_assert_int_eq(dl_data_open(&o, &d), DL_EINVAL);
    ck_assert_msg(strstr(dl_errmsg(), "4096 bytes, more than the cap of 4095"), "%s", dl_errmsg());
    o.max_bytes = 4096;
    ck_assert_int_eq(dl_data_open(&o, &d), DL_OK);
    ck_assert_uint_eq(dl_data_len(d), 4096);
    dl_data_free(d);
    unlink(capped);
    d = (dl_data *)&o;
    o.max_bytes = 0;

    /* empty */
    char empty[512];
    snprintf(empty, sizeof empty, "%s", tmp_path("empty.bin"));
    write_file(empty, 0);
    o.path = empty;
    ck_assert_int_eq(dl_data_open(&o, &d), DL_EINVAL);
    ck_assert_msg(strstr(dl_errmsg(), empty) && strstr(dl_errmsg(), "empty") &&
                      tu_has_int_token(dl_errmsg(), 34),
                  "%s", dl_errmsg());

    /* too short: 2 (seq + 1) = 34 bytes are needed at val_fraction 0.1 */
    char shortf[512];
    snprintf(shortf, sizeof shortf, "%s", tmp_path("short.bin"));
    write_file(shortf, 33);
    o.path = shortf;
    ck_assert_int_eq(dl_data_open(&o, &d), DL_EINVAL);
    ck_assert_msg(strstr(dl_errmsg(), shortf) && tu_has_int_token(dl_errmsg(), 33) &&
                      tu_has_int_token(dl_errmsg(), 34),
                  "%s", dl_errmsg());
    write_file(shortf, 34);
    ck_assert_int_eq(dl_data_open(&o, &d), DL_OK);
    ck_assert_uint_eq(dl_data_train_len(d), 17);
    ck_assert_uint_eq(dl_data_val_len(d), 17);
    ck_assert_int_eq(dl_data_val_windows(d), 1);
    ck_assert_uint_eq(dl_data_sample_start(d, 5), 0); /* one valid start */
    dl_data_free(d);
    /* a larger validation share needs more: n - max(17, floor(0.6 n)) >= 17 first at n = 41
     * (40 - 24 = 16, 41 - 24 = 17) */
    o.val_fraction = 0.6;
    write_file(shortf, 40);
    ck_assert_int_eq(dl_data_open(&o, &d), DL_EINVAL);
    ck_assert_msg(tu_has_int_token(dl_errmsg(), 40) && tu_has_int_token(dl_errmsg(), 41), "%s",
                  dl_errmsg());
    write_file(shortf, 41);
    ck_assert_int_eq(dl_data_open(&o, &d), DL_OK);
    ck_assert_uint_eq(dl_data_train_len(d), 17);
    ck_assert_uint_eq(dl_data_val_len(d), 24);
    dl_data_free(d);

    /* bad options */
    dl_data_opts_init(&o);
    o.seq = 0;
    ck_assert_int_eq(dl_data_open(&o, &d), DL_EINVAL);
    dl_data_opts_init(&o);
    o.val_fraction = 0;
    ck_assert_int_eq(dl_data_open(&o, &d), DL_EINVAL);
    o.val_fraction = 1;
    ck_assert_int_eq(dl_data_open(&o, &d), DL_EINVAL);
    dl_data_opts_init(&o);
    o.p[0] = 0.6;
    ck_assert_int_eq(dl_data_open(&o, &d), DL_EINVAL);
    ck_assert_msg(strstr(dl_errmsg(), "sum") != NULL, "%s", dl_errmsg());
    dl_data_opts_init(&o);
    o.K = 0;
    ck_assert_int_eq(dl_data_open(&o, &d), DL_EINVAL);
    dl_data_opts_init(&o);
    o.burn_in = -1;
    ck_assert_int_eq(dl_data_open(&o, &d), DL_EINVAL);
    dl_data_opts_init(&o);
    o.seq = 64;
    o.synth_bytes = 100; /* need 130 */
    ck_assert_int_eq(dl_data_open(&o, &d), DL_EINVAL);
    ck_assert_msg(tu_has_int_token(dl_errmsg(), 130), "%s", dl_errmsg());
    ck_assert_int_eq(dl_data_open(NULL, &d), DL_EINVAL);
    ck_assert_int_eq(dl_data_open(&o, NULL), DL_EINVAL);
    ck_assert_int_eq(dl_data_markov_generate(1, 4, P_DEFAULT, 0, 10, NULL), DL_EINVAL);
    ck_assert(d == NULL);

    unlink(empty);
    unlink(shortf);
    tmp_cleanup();
}
END_TEST

static Suite *data_suite(void)
{
    Suite *s = suite_create("data");
    TCase *tc = tcase_create("data");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_entropy_rate);
    tcase_add_test(tc, test_offsets_distinct);
    tcase_add_test(tc, test_empirical_entropy);
    tcase_add_test(tc, test_stationary_exact);
    tcase_add_test(tc, test_stationary_stream);
    tcase_add_test(tc, test_determinism);
    tcase_add_test(tc, test_ranks_identical);
    tcase_add_test(tc, test_split_file);
    tcase_add_test(tc, test_samples);
    tcase_add_test(tc, test_batch_union);
    tcase_add_test(tc, test_val_windows);
    tcase_add_test(tc, test_errors);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(data_suite());
    srunner_run_all(sr, CK_ENV);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
