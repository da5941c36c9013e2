/* The trainer's data: the synthetic order-2 Markov corpus, files, the train / validation split,
 * training samples by global index and validation windows. include/distlab/data.h states every
 * rule (and why the chain's entropy rate is exactly H(p)); this file implements them. */
#define _GNU_SOURCE
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "distlab/error.h"
#include "distlab/data.h"
#include "io/path.h"

#define GOLDEN 0x9E3779B97F4A7C15ull
#define KEY_OFFSETS 0x4F46465345545321ull  /* "OFFSET!" */
#define KEY_GENERATE 0x47454E4552415445ull /* "GENERATE" */

struct dl_data {
    unsigned char *bytes;
    size_t n, train_len, val_len;
    int seq;
    int synthetic;
    double floor;
    char name[512];
};

static uint64_t splitmix64(uint64_t x)
{
    x += GOLDEN;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

void dl_data_opts_init(dl_data_opts *o)
{
    if (!o)
        return;
    memset(o, 0, sizeof *o);
    o->path = NULL;
    o->seq = 64;
    o->val_fraction = 0.1;
    o->seed = 1;
    o->synth_bytes = (size_t)4 << 20;
    o->burn_in = 4096;
    o->K = 4;
    o->p[0] = 0.5;
    o->p[1] = 0.25;
    o->p[2] = 0.125;
    o->p[3] = 0.125;
}

/* ---------------------------------------------------------------------------------------- */
/* The synthetic chain                                                                       */

/* 1 if (p, K) is a probability vector we accept; else 0 with a reason in why. */
static int check_p(const double *p, int K, char *why, size_t whylen)
{
    if (K < 1 || K > DL_DATA_MAX_K) {
        snprintf(why, whylen, "K = %d branches (need 1 .. %d)", K, DL_DATA_MAX_K);
        return 0;
    }
    if (!p) {
        snprintf(why, whylen, "null probability vector");
        return 0;
    }
    double s = 0;
    for (int j = 0; j < K; j++) {
        if (!isfinite(p[j]) || p[j] < 0) {
            snprintf(why, whylen, "p[%d] = %g (need a finite value >= 0)", j, p[j]);
            return 0;
        }
        s += p[j];
    }
    if (fabs(s - 1.0) > 1e-9) {
        snprintf(why, whylen, "the %d probabilities sum to %.12g (need 1)", K, s);
        return 0;
    }
    return 1;
}

double dl_data_entropy_rate(const double *p, int K)
{
    char why[128];
    if (!check_p(p, K, why, sizeof why))
        return NAN;
    double h = 0;
    for (int j = 0; j < K; j++)
        if (p[j] > 0)
            h -= p[j] * log(p[j]);
    return h;
}

int dl_data_markov_offsets(uint64_t seed, int K, unsigned char *off)
{
    if (K < 1 || K > DL_DATA_MAX_K)
        return dl_error(DL_EINVAL, "data: K = %d branches (need 1 .. %d)", K, DL_DATA_MAX_K);
    if (!off)
        return dl_error(DL_EINVAL, "data: null offset buffer");
    uint64_t key = splitmix64(seed ^ KEY_OFFSETS);
    uint64_t n = 0;
    for (int b = 0; b < 256; b++) {
        unsigned char taken[256] = {0};
        for (int j = 0; j < K; j++) {
            unsigned v;
            do v = (unsigned)(splitmix64(key + GOLDEN * n++) & 255u);
            while (taken[v]);
            taken[v] = 1;
            off[b * K + j] = (unsigned char)v;
        }
    }
    return DL_OK;
}

int dl_data_markov_generate(uint64_t seed, int K, const double *p, long burn_in, size_t n,
                            unsigned char *out)
{
    char why[128];
    if (!check_p(p, K, why, sizeof why))
        return dl_error(DL_EINVAL, "data: %s", why);
    if (burn_in < 0)
        return dl_error(DL_EINVAL, "data: burn-in %ld < 0", burn_in);
    if (n > 0 && !out)
        return dl_error(DL_EINVAL, "data: null output buffer");
    unsigned char off[256 * DL_DATA_MAX_K];
    int st = dl_data_markov_offsets(seed, K, off);
    if (st != DL_OK)
        return st;

    /* cumulative thresholds; the last branch with p_j > 0 catches any rounding excess */
    double cum[DL_DATA_MAX_K];
    double s = 0;
    int last = 0;
    for (int j = 0; j < K; j++) {
        s += p[j];
        cum[j] = s;
        if (p[j] > 0)
            last = j;
    }
    cum[last] = 2.0;

    uint64_t key = splitmix64(seed ^ KEY_GENERATE);
    unsigned a = 0, b = 0;
    uint64_t total = (uint64_t)burn_in + (uint64_t)n;
    for (uint64_t t = 0; t < total; t++) {
        double u = (double)(splitmix64(key + GOLDEN * t) >> 11) * (1.0 / 9007199254740992.0);
        int j = 0;
        while (u >= cum[j]) j++;
        unsigned c = off[b * (unsigned)K + (unsigned)j] ^ (a & 1u);
        if (t >= (uint64_t)burn_in)
            out[t - (uint64_t)burn_in] = (unsigned char)c;
        a = b;
        b = c;
    }
    return DL_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Opening                                                                                   */

static size_t val_len_of(size_t n, int seq, double f)
{
    size_t w = (size_t)seq + 1;
    size_t v = (size_t)floor((double)n * f);
    return v > w ? v : w;
}

/* Smallest n with a training and a validation window: n - val_len_of(n) >= seq + 1. */
static size_t min_len(int seq, double f)
{
    size_t w = (size_t)seq + 1;
    double est = (double)w / (1.0 - f) - 2.0;
    size_t n = 2 * w;
    if (est > (double)n)
        n = (size_t)est;
    while (n < val_len_of(n, seq, f) + w) n++;
    return n;
}

/* Read all of the regular file `path` (at most `max` bytes) into *buf (malloc'd), its length
 * into *len. The size is fstat's; a file that grows while read is cut at max + 1 and refused. */
static int read_file(const char *path, uint64_t max, unsigned char **buf, size_t *len)
{
    *buf = NULL;
    *len = 0;
    int fd, st = dl_path_open_input(path, "data file", &fd);
    if (st != DL_OK)
        return st;
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return dl_error(DL_ESYS, "data: fstat of '%s': %s", path, strerror(e));
    }
    if ((uint64_t)sb.st_size > max || (uint64_t)sb.st_size >= SIZE_MAX) {
        close(fd);
        return dl_error(DL_EINVAL,
                        "data: '%s' is %lld bytes, more than the cap of %llu bytes "
                        "(max_bytes; distlab-train --data-max)",
                        path, (long long)sb.st_size, (unsigned long long)max);
    }
    size_t cap = (size_t)sb.st_size + 1;
    unsigned char *p = malloc(cap);
    if (!p) {
        close(fd);
        return dl_error(DL_ENOMEM, "data: no memory for %zu bytes of '%s'", cap, path);
    }
    size_t n = 0;
    while (n < cap) {
        ssize_t r = read(fd, p + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int e = errno;
            free(p);
            close(fd);
            return dl_error(DL_ESYS, "data: cannot read '%s': %s", path, strerror(e));
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    close(fd);
    if (n == cap) { /* it grew past its size: don't chase it */
        free(p);
        return dl_error(DL_EINVAL, "data: '%s' grew while it was read (from %zu bytes)", path,
                        cap - 1);
    }
    *buf = p;
    *len = n;
    return DL_OK;
}

int dl_data_open(const dl_data_opts *o, dl_data **out)
{
    if (!out)
        return dl_error(DL_EINVAL, "data: null output pointer");
    *out = NULL;
    if (!o)
        return dl_error(DL_EINVAL, "data: null options");
    if (o->seq < 1)
        return dl_error(DL_EINVAL, "data: sequence length %d (need >= 1)", o->seq);
    if (!(o->val_fraction > 0.0 && o->val_fraction < 1.0))
        return dl_error(DL_EINVAL, "data: validation fraction %g (need a value in (0, 1))",
                        o->val_fraction);
    int file = o->path && o->path[0];
    size_t need = min_len(o->seq, o->val_fraction);

    dl_data *d = calloc(1, sizeof *d);
    if (!d)
        return dl_error(DL_ENOMEM, "data: no memory");
    d->seq = o->seq;
    int st;
    if (file) {
        d->floor = NAN;
        snprintf(d->name, sizeof d->name, "%s", o->path);
        st =
            read_file(o->path, o->max_bytes ? o->max_bytes : DL_DATA_DEFAULT_MAX, &d->bytes, &d->n);
        if (st != DL_OK)
            goto fail;
        if (d->n == 0) {
            st = dl_error(DL_EINVAL,
                          "data: '%s' is empty; need at least %zu bytes (one training and one "
                          "validation window of seq + 1 = %d bytes, validation = the last "
                          "max(seq + 1, %g of the file))",
                          o->path, need, o->seq + 1, o->val_fraction);
            goto fail;
        }
    } else {
        char why[128];
        if (!check_p(o->p, o->K, why, sizeof why)) {
            st = dl_error(DL_EINVAL, "data: synthetic corpus: %s", why);
            goto fail;
        }
        if (o->burn_in < 0) {
            st = dl_error(DL_EINVAL, "data: synthetic corpus: burn-in %ld < 0", o->burn_in);
            goto fail;
        }
        d->synthetic = 1;
        d->floor = dl_data_entropy_rate(o->p, o->K);
        snprintf(d->name, sizeof d->name, "synthetic(seed=%llu, K=%d)", (unsigned long long)o->seed,
                 o->K);
        d->n = o->synth_bytes;
        if (d->n < need) {
            st = dl_error(DL_EINVAL,
                          "data: synthetic corpus of %zu bytes is too short; need at least %zu "
                          "(one training and one validation window of seq + 1 = %d bytes)",
                          d->n, need, o->seq + 1);
            goto fail;
        }
        d->bytes = malloc(d->n);
        if (!d->bytes) {
            st = dl_error(DL_ENOMEM, "data: no memory for a %zu-byte synthetic corpus", d->n);
            goto fail;
        }
        st = dl_data_markov_generate(o->seed, o->K, o->p, o->burn_in, d->n, d->bytes);
        if (st != DL_OK)
            goto fail;
    }
    if (d->n < need) {
        st = dl_error(DL_EINVAL,
                      "data: '%s' has %zu bytes; need at least %zu (one training and one "
                      "validation window of seq + 1 = %d bytes, validation = the last "
                      "max(seq + 1, %g of the file))",
                      o->path, d->n, need, o->seq + 1, o->val_fraction);
        goto fail;
    }
    d->val_len = val_len_of(d->n, o->seq, o->val_fraction);
    d->train_len = d->n - d->val_len;
    *out = d;
    return DL_OK;
fail:
    dl_data_free(d);
    return st;
}

void dl_data_free(dl_data *d)
{
    if (!d)
        return;
    free(d->bytes);
    free(d);
}

int dl_data_seq(const dl_data *d) { return d ? d->seq : 0; }
int dl_data_is_synthetic(const dl_data *d) { return d ? d->synthetic : 0; }
const char *dl_data_name(const dl_data *d) { return d ? d->name : ""; }
size_t dl_data_len(const dl_data *d) { return d ? d->n : 0; }
size_t dl_data_train_len(const dl_data *d) { return d ? d->train_len : 0; }
size_t dl_data_val_len(const dl_data *d) { return d ? d->val_len : 0; }
const unsigned char *dl_data_bytes(const dl_data *d) { return d ? d->bytes : NULL; }
double dl_data_floor(const dl_data *d) { return d ? d->floor : NAN; }

/* ---------------------------------------------------------------------------------------- */
/* Samples and windows                                                                       */

/* (a * b) mod m without overflow, for a, b < m. */
static uint64_t mulmod(uint64_t a, uint64_t b, uint64_t m)
{
    if (a == 0 || b <= UINT64_MAX / a)
        return (a * b) % m;
    uint64_t r = 0;
    while (b) {
        if (b & 1)
            r = (r >= m - a) ? r - (m - a) : r + a;
        a = (a >= m - a) ? a - (m - a) : a + a;
        b >>= 1;
    }
    return r;
}

size_t dl_data_sample_start(const dl_data *d, long i)
{
    if (!d || i < 0)
        return (size_t)-1;
    uint64_t m = (uint64_t)(d->train_len - (size_t)d->seq);
    return (size_t)mulmod((uint64_t)i % m, (uint64_t)d->seq % m, m);
}

static void copy_window(const unsigned char *w, int seq, int *inputs, int *targets)
{
    for (int t = 0; t < seq; t++) {
        inputs[t] = w[t];
        targets[t] = w[t + 1];
    }
}

int dl_data_sample(const dl_data *d, long i, int *inputs, int *targets)
{
    if (!d || !inputs || !targets)
        return dl_error(DL_EINVAL, "data: sample: null argument");
    if (i < 0)
        return dl_error(DL_EINVAL, "data: sample index %ld < 0", i);
    copy_window(d->bytes + dl_data_sample_start(d, i), d->seq, inputs, targets);
    return DL_OK;
}

int dl_data_batch(const dl_data *d, long step, int G, int dp, int dp_rank, int micro, int mb,
                  int *inputs, int *targets)
{
    if (!d || !inputs || !targets)
        return dl_error(DL_EINVAL, "data: batch: null argument");
    if (step < 0)
        return dl_error(DL_EINVAL, "data: batch: step %ld < 0", step);
    if (G < 1)
        return dl_error(DL_EINVAL, "data: batch: global batch %d (need >= 1)", G);
    if (dp < 1)
        return dl_error(DL_EINVAL, "data: batch: dp = %d (need >= 1)", dp);
    if (dp_rank < 0 || dp_rank >= dp)
        return dl_error(DL_EINVAL, "data: batch: dp rank %d outside [0, %d)", dp_rank, dp);
    if (G % dp != 0)
        return dl_error(DL_EINVAL,
                        "data: batch: global batch %d is not divisible by dp = %d (a multiple "
                        "of %d would fit)",
                        G, dp, dp);
    int share = G / dp;
    if (mb < 1)
        return dl_error(DL_EINVAL, "data: batch: micro-batch size %d (need >= 1)", mb);
    if (micro < 0 || (long)micro * mb + mb > share)
        return dl_error(DL_EINVAL,
                        "data: batch: micro-batch %d of %d sequences does not fit in the rank's "
                        "share of %d sequences (G = %d / dp = %d)",
                        micro, mb, share, G, dp);
    if (step > (LONG_MAX - G) / G)
        return dl_error(DL_EINVAL, "data: batch: step %ld x global batch %d overflows", step, G);
    long first = step * G + (long)dp_rank * share + (long)micro * mb;
    size_t seq = (size_t)d->seq;
    for (int s = 0; s < mb; s++)
        copy_window(d->bytes + dl_data_sample_start(d, first + s), d->seq, inputs + s * seq,
                    targets + s * seq);
    return DL_OK;
}

long dl_data_val_windows(const dl_data *d)
{
    if (!d)
        return 0;
    return (long)((d->val_len - 1) / (size_t)d->seq);
}

int dl_data_val_window(const dl_data *d, long i, int *inputs, int *targets)
{
    if (!d || !inputs || !targets)
        return dl_error(DL_EINVAL, "data: validation: null argument");
    long nval = dl_data_val_windows(d);
    if (i < 0 || i >= nval)
        return dl_error(DL_EINVAL, "data: validation window %ld outside [0, %ld)", i, nval);
    copy_window(d->bytes + d->train_len + (size_t)i * (size_t)d->seq, d->seq, inputs, targets);
    return DL_OK;
}
