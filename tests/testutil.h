/* Shared helpers for the Check tests (header-only).
 *
 * - a deterministic counter-based generator: value (seed, rank, index) -> 64 random bits
 *   (splitmix64), so that a rank thread and the test thread produce the same inputs;
 * - fill helpers for f32 / f64 / bf16 buffers (uniform in [-1, 1); bf16 values are exactly
 *   representable, rounded to nearest even by the test's own converter);
 * - DL_TEST_SMALL: 1 when DISTLAB_TEST_SCALE=small (reduced tier: smaller sizes, fewer ranks);
 * - tu_run_world(): run a world of n ranks with the test defaults (watchdog 120 s, log stderr);
 * - page-aligned allocation, a monotonic clock, and a few string checks for error messages.
 *
 * Rule for every test: never call ck_assert from a rank thread; ranks record what they saw in
 * buffers the test thread allocated, and the test thread asserts after dl_world_run returns. */
#ifndef DISTLAB_TESTUTIL_H
#define DISTLAB_TESTUTIL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <ctype.h>
#include <time.h>
#include "distlab.h"

/* ---- scale ---- */

static inline int tu_test_small(void)
{
    const char *s = getenv("DISTLAB_TEST_SCALE");
    return s != NULL && strcmp(s, "small") == 0;
}
#define DL_TEST_SMALL (tu_test_small())

/* ---- deterministic random numbers ---- */

static inline uint64_t tu_splitmix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* Per-(seed, rank) stream key. */
static inline uint64_t tu_rng_key(uint64_t seed, int rank)
{
    return tu_splitmix64(tu_splitmix64(seed) ^ (0xD1B54A32D192ED03ull * (uint64_t)(uint32_t)rank));
}

/* 64 random bits for element `idx` of stream (seed, rank). */
static inline uint64_t tu_rand_u64(uint64_t seed, int rank, uint64_t idx)
{
    return tu_splitmix64(tu_rng_key(seed, rank) + 0x9E3779B97F4A7C15ull * idx);
}

/* Same with a precomputed key (fast path for fills). */
static inline uint64_t tu_rand_keyed(uint64_t key, uint64_t idx)
{
    return tu_splitmix64(key + 0x9E3779B97F4A7C15ull * idx);
}

/* Uniform double in [-1, 1) from 64 bits (53 bits of precision). */
static inline double tu_bits_to_unit(uint64_t b)
{
    return (double)(b >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0;
}

static inline double tu_rand_unit(uint64_t seed, int rank, uint64_t idx)
{
    return tu_bits_to_unit(tu_rand_u64(seed, rank, idx));
}

/* ---- bf16 (the test's own converter, independent of the library's) ---- */

static inline uint16_t tu_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float tu_bf16_to_f32(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ---- fills: element i of the buffer gets value (seed, rank, first + i) ---- */

static inline void tu_fill_f64(double *p, size_t n, uint64_t seed, int rank, uint64_t first)
{
    uint64_t k = tu_rng_key(seed, rank);
    for (size_t i = 0; i < n; i++) p[i] = tu_bits_to_unit(tu_rand_keyed(k, first + i));
}

static inline void tu_fill_f32(float *p, size_t n, uint64_t seed, int rank, uint64_t first)
{
    uint64_t k = tu_rng_key(seed, rank);
    for (size_t i = 0; i < n; i++) p[i] = (float)tu_bits_to_unit(tu_rand_keyed(k, first + i));
}

static inline void tu_fill_bf16(uint16_t *p, size_t n, uint64_t seed, int rank, uint64_t first)
{
    uint64_t k = tu_rng_key(seed, rank);
    for (size_t i = 0; i < n; i++)
        p[i] = tu_f32_to_bf16((float)tu_bits_to_unit(tu_rand_keyed(k, first + i)));
}

/* Fill `n` elements of type t. */
static inline void tu_fill(dl_dtype t, void *p, size_t n, uint64_t seed, int rank, uint64_t first)
{
    switch (t) {
    case DL_F32: tu_fill_f32((float *)p, n, seed, rank, first); break;
    case DL_F64: tu_fill_f64((double *)p, n, seed, rank, first); break;
    case DL_BF16: tu_fill_bf16((uint16_t *)p, n, seed, rank, first); break;
    default: break;
    }
}

/* The value tu_fill writes at element `idx`, as a double (exact for every type). */
static inline double tu_value(dl_dtype t, uint64_t seed, int rank, uint64_t idx)
{
    double d = tu_rand_unit(seed, rank, idx);
    switch (t) {
    case DL_F32: return (double)(float)d;
    case DL_BF16: return (double)tu_bf16_to_f32(tu_f32_to_bf16((float)d));
    default: return d;
    }
}

/* Same with a precomputed key (tu_rng_key(seed, rank)). */
static inline double tu_value_keyed(dl_dtype t, uint64_t key, uint64_t idx)
{
    double d = tu_bits_to_unit(tu_rand_keyed(key, idx));
    switch (t) {
    case DL_F32: return (double)(float)d;
    case DL_BF16: return (double)tu_bf16_to_f32(tu_f32_to_bf16((float)d));
    default: return d;
    }
}

static inline size_t tu_tsize(dl_dtype t)
{
    return t == DL_F64 ? 8 : t == DL_F32 ? 4 : 2;
}

/* Read element i of a buffer of type t as a double. */
static inline double tu_get(dl_dtype t, const void *p, size_t i)
{
    switch (t) {
    case DL_F32: return (double)((const float *)p)[i];
    case DL_F64: return ((const double *)p)[i];
    case DL_BF16: return (double)tu_bf16_to_f32(((const uint16_t *)p)[i]);
    default: return 0.0;
    }
}

/* ---- memory and time ---- */

/* Page-aligned allocation (avoids glibc's slow-memcpy trap); never NULL for 0 bytes. */
static inline void *tu_alloc(size_t bytes)
{
    void *p = NULL;
    if (posix_memalign(&p, 4096, bytes ? bytes : 1) != 0) return NULL;
    return p;
}

static inline double tu_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline void tu_sleep_ms(int ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

/* ---- worlds ---- */

/* Test defaults: n ranks, watchdog 120 s, reports to stderr. */
static inline void tu_world_opts(dl_world_opts *o, int nranks)
{
    dl_world_opts_init(o);
    o->nranks = nranks;
    o->timeout_s = 120;
    o->log = stderr;
}

/* Run fn on n ranks with the test defaults; returns dl_world_run's status (the calling
 * thread's dl_errmsg() holds the message on failure). */
static inline int tu_run_world(int nranks, dl_rank_fn fn, void *arg)
{
    dl_world_opts o;
    tu_world_opts(&o, nranks);
    return dl_world_run(&o, fn, arg);
}

/* ---- message checks ---- */

/* 1 if `s` contains the decimal number v as a whole token (not part of a longer number). */
static inline int tu_has_int_token(const char *s, long v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%ld", v);
    size_t L = strlen(buf);
    for (const char *p = s; (p = strstr(p, buf)) != NULL; p++) {
        int before = (p == s) || !isdigit((unsigned char)p[-1]);
        int after = !isdigit((unsigned char)p[L]);
        if (before && after) return 1;
    }
    return 0;
}


/* ---- comparing whole models ---- */

/* The issues' "equals one rank" metric: per tensor max|a - b| / max|b| over two unsharded f64
 * buffers in the single-rank layout order of c (max|a - b| itself for an all-zero tensor); the
 * worst tensor's value, and its name in `name` (48 bytes) when not NULL. -1 on a bad config. */
static inline double tu_worst_tensor_rel(const dl_gpt_config *c, const double *a, const double *b,
                                         char *name)
{
    dl_gpt_layout *l;
    if (dl_gpt_layout_create(c, 1, 0, &l) != DL_OK)
        return -1;
    double w = 0;
    for (int k = 0; k < l->ntensors; k++) {
        double md = 0, mb = 0;
        for (size_t i = 0; i < l->t[k].numel; i++) {
            size_t j = l->t[k].offset + i;
            double d = a[j] - b[j];
            md = fmax(md, d < 0 ? -d : d);
            mb = fmax(mb, b[j] < 0 ? -b[j] : b[j]);
        }
        double r = mb > 0 ? md / mb : md;
        if (r >= w) {
            w = r;
            if (name)
                snprintf(name, 48, "%s", l->t[k].name);
        }
    }
    dl_gpt_layout_destroy(l);
    return w;
}

#endif
