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
#ifndef DISTLAB_TESTS_UNIT_TESTUTIL_H
#define DISTLAB_TESTS_UNIT_TESTUTIL_H

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
#include <sched.h>
#include <signal.h>
#include <check.h>
#include "distlab.h"
#include "core/testhook.h"
#include "transport/chan.h"
#include "train/compare.h"

/* Every suite's main ends here: run S with CK_ENV's verbosity, free the runner, and return the
 * process status (EXIT_FAILURE when any test failed). */
static inline int tu_run_suite(Suite *s)
{
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_ENV);
    int nf = srunner_ntests_failed(sr);
    srunner_free(sr);
    return nf ? EXIT_FAILURE : EXIT_SUCCESS;
}

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
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
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

static inline size_t tu_tsize(dl_dtype t) { return t == DL_F64 ? 8 : t == DL_F32 ? 4 : 2; }

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
    if (posix_memalign(&p, 4096, bytes ? bytes : 1) != 0)
        return NULL;
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
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
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

/* ---- forcing a wait to sleep: the channels' sleep watch (core/testhook.h) ----
 * A delay ("sleep 50 ms, the peer is asleep by then") is a guess about the host's scheduler; a
 * test that waits until the watch counts its peer asleep and only then publishes has forced the
 * peer's wait to sleep, on any host and under any load. */

/* Install h with the watch on (sleep_ms > 0: the long sleep's timeout, so that a lost wake-up is
 * told apart from a slow peer), from the test's thread while no channel is in use. */
static inline void tu_chan_watch(dl__test_hook *h, int sleep_ms)
{
    h->chan_watch = 1;
    h->chan_sleep_ms = sleep_ms;
    dl__test_hook_set(h);
    dl__chan_test_configure();
}

/* Remove the hook (before it goes out of scope: the channels keep a pointer to it). */
static inline void tu_chan_unwatch(void)
{
    dl__test_hook_set(NULL);
    dl__chan_test_configure();
}

/* Wait until at least n threads sleep on a channel's futex on `side` (DL__CHAN_RECEIVER,
 * DL__CHAN_SENDER or DL__CHAN_EITHER). Each of those waits then counts a sleep, whatever comes
 * next. A wait that never sleeps is a bug: Check's timeout ends the test. */
static inline void tu_wait_asleep(dl__test_hook *h, int side, int n)
{
    while (atomic_load(&h->chan_asleep[side]) < n) sched_yield();
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
        if (before && after)
            return 1;
    }
    return 0;
}


/* ---- comparing whole models: the bounds are the library's (lib/train/compare.h, where their
 * error analysis is written; distlab-train --check uses the same) ---- */

/* TU_EQ_VERBOSE=1 prints each compared quantity's measured/bound ratio. */
static inline void tu_eq_verbose(const dl__eq_report *rep)
{
    const char *e = getenv("TU_EQ_VERBOSE");
    if (!e || !*e || strcmp(e, "0") == 0)
        return;
    for (int k = 0; k < DL__EQ_N; k++) {
        const dl__eq_item *it = &rep->item[k];
        if (it->present)
            fprintf(stderr, "  eq: %-18s %.3g (bound %.3g, %.2g of it; %s)\n",
                    dl__eq_name((dl__eq_kind)k), it->measured, it->bound,
                    it->bound > 0 ? it->measured / it->bound : 0.0, it->where);
    }
}

/* Compare run a with run b (the reference) of configuration o (resolved: global_batch set):
 * dl__train_compare. 1: the same model within the bounds; 0: not, with the failed check and its
 * figures in why. Needs want_params, and want_grads when o->optim.steps == 1. */
static inline int tu_compare_runs(const dl_train_opts *o, const dl_train_result *a,
                                  const dl_train_result *b, char *why, size_t wn)
{
    dl__eq_report rep;
    int same = dl__train_compare(o, a, b, &rep);
    tu_eq_verbose(&rep);
    snprintf(why, wn, "%s", rep.why);
    return same == 1;
}

/* Train oa and ob (want_params and want_grads set here) and compare them (tu_compare_runs, ob
 * the reference); when they train more than one step, the same for their first step alone.
 * hook_a: the private test hook (lib/core/testhook.h) in force while oa trains, or NULL.
 * 1: the same model; 0: not (why); -1: a run failed (why: its message). */
static inline int tu_same_model(dl_train_opts oa, dl__test_hook *hook_a, dl_train_opts ob,
                                char *why, size_t wn)
{
    for (int pass = 0; pass < 2; pass++) {
        dl_train_result a, b;
        oa.output.want_params = ob.output.want_params = oa.output.want_grads =
            ob.output.want_grads = 1;
        dl__test_hook_set(hook_a);
        int rc = dl_train_run(&oa, &a);
        dl__test_hook_set(NULL);
        if (rc != DL_OK || dl_train_run(&ob, &b) != DL_OK) {
            snprintf(why, wn, "%s", dl_errmsg());
            if (rc == DL_OK)
                dl_train_result_free(&a);
            return -1;
        }
        dl_train_resolve(&ob, ob.layout.dp * ob.layout.tp * (ob.layout.pp > 1 ? ob.layout.pp : 1));
        int same = tu_compare_runs(&ob, &a, &b, why, wn);
        dl_train_result_free(&a);
        dl_train_result_free(&b);
        if (!same || ob.optim.steps == 1)
            return same;
        oa.optim.steps = ob.optim.steps = 1;
    }
    return 1;
}

/* ---- pipelined training (tests/unit/parallel/test_pipe.c, test_pipe_tera.c) ---- */

/* A small pipelined run: 4 layers of width 32, 4 heads, 16 tokens, micro-batches of 2, m of
 * them, schedule `sched` over pp stages, 2 or 3 steps (reduced tier: 2). */
static inline dl_train_opts tu_pipe_opts(int pp, int m, int sched, dl_dtype dt)
{
    dl_train_opts o;
    dl_train_opts_init(&o);
    o.model.layers = 4;
    o.model.d_model = 32;
    o.model.heads = 4;
    o.model.seq = 16;
    o.precision.dtype = dt;
    o.layout.dp = 1;
    o.layout.tp = 1;
    o.layout.pp = pp;
    o.pipeline.schedule = sched;
    o.batch.micro = 2;
    o.batch.microbatches = m;
    o.optim.steps = DL_TEST_SMALL ? 2 : 3;
    o.optim.warmup = 2;
    o.optim.lr = dt == DL_F32 ? 1e-3 : 1e-2;
    o.optim.min_lr = 1e-4;
    o.eval.windows = 4;
    o.output.log_every = 0;
    o.output.want_params = 1;
    o.machine.timeout_s = 120;
    return o;
}

/* Train `o` and the same configuration on one rank (no pipeline, dp x m micro-batches, the same
 * global batch): tu_same_model's verdict (1 the same model within lib/train/compare.h's bounds,
 * 0 not, -1 a run failed or o does not resolve; why says which). hook: the test hook in force
 * for the pipelined run. */
static inline int tu_pipe_vs_one_rank(dl_train_opts o, dl__test_hook *hook, char *why, size_t wn)
{
    dl_train_opts one = o;
    if (dl_train_resolve(&o, o.layout.dp * o.layout.tp * o.layout.pp) != DL_OK) {
        snprintf(why, wn, "%s", dl_errmsg());
        return -1;
    }
    one.layout.dp = one.layout.tp = one.layout.pp = 1;
    one.pipeline.schedule = 0;
    one.pipeline.virtual_stages = 0;
    one.pipeline.token_chunks = 0;
    one.pipeline.token_lens = NULL;
    one.batch.microbatches = o.layout.dp * o.batch.microbatches;
    one.batch.global = 0;
    return tu_same_model(o, hook, one, why, wn);
}

/* ---- negative controls (lib/core/testhook.h) ---- */

/* Where world rank 0 keeps element i of tensor `name` (its tp shard's layout, first stage). */
static inline size_t tu_rank0_index(const dl_gpt_config *c, int tp, const char *name, size_t i)
{
    dl_gpt_layout *l;
    if (dl_gpt_layout_create(c, tp, 0, &l) != DL_OK)
        return (size_t)-1;
    int k = dl_gpt_find(l, name);
    size_t at = k < 0 ? (size_t)-1 : l->t[k].offset + i;
    dl_gpt_layout_destroy(l);
    return at;
}

/* The perturbation control: world rank 0's first gain of h.0.ln_1 (1 at initialisation, used by
 * every token) times 1 + 1e-6 (f64) or 1 + 1e-3 (f32). */
static inline dl__test_hook tu_perturb_hook(const dl_train_opts *o)
{
    dl__test_hook h = {.perturb_rel = o->precision.dtype == DL_F64 ? 1e-6 : 1e-3,
                       .perturb_rank = 0,
                       .perturb_index =
                           tu_rank0_index(&o->model, o->layout.tp, "h.0.ln_1.weight", 0)};
    return h;
}

/* The skipped-reduction control: each rank's n-th reduction of purpose p skipped. */
static inline dl__test_hook tu_skip_hook(dl_purpose p, int n)
{
    dl__test_hook h = {.skip_nth = n, .skip_purpose = p};
    return h;
}

/* A step callback (dl_train_opts.output.on_step, on_step_arg: a const int *) that requests the
 * run's stop (as SIGTERM would) once step *arg has finished. */
static inline int tu_stop_at(const dl_train_step *s, void *arg)
{
    if (s->step == *(const int *)arg)
        dl_train_request_stop(SIGTERM);
    return DL_OK;
}

/* Runs o with a stop requested once step *stop_step has finished (o's step callback is set to
 * tu_stop_at for the run and cleared after) and checks what a stop owes: the run returned after
 * SIGTERM's request with one checkpoint, of its last step. The steps it ran are a->nsteps. */
static inline void tu_run_stopped(dl_train_opts *o, const int *stop_step, dl_train_result *a)
{
    o->output.on_step = tu_stop_at, o->output.on_step_arg = (void *)stop_step;
    ck_assert_msg(dl_train_run(o, a) == DL_OK, "%s", dl_errmsg());
    dl_train_request_stop(0);
    o->output.on_step = NULL, o->output.on_step_arg = NULL;
    ck_assert_int_eq(a->ckpt.stopped, SIGTERM);
    ck_assert_int_eq(a->ckpt.saves, 1);
    ck_assert_int_eq(a->nsteps, a->ckpt.last_saved);
}

/* Full-state checkpoint tests: 1 when b's steps from b's first run step and its final parameters equal a's, bit for bit */
static inline int tu_same_bits(const dl_train_result *a, const dl_train_result *b, char *why,
                               size_t wn)
{
    if (a->nsteps != b->nsteps)
        return snprintf(why, wn, "%d steps against %d", b->nsteps, a->nsteps), 0;
    for (int i = b->ckpt.resumed_from; i < a->nsteps; i++)
        if (memcmp(&a->steps[i].loss, &b->steps[i].loss, sizeof(double)) != 0)
            return snprintf(why, wn, "step %d: loss %.17g against %.17g", i + 1, b->steps[i].loss,
                            a->steps[i].loss),
                   0;
    if (memcmp(a->output.params, b->output.params, sizeof(double) * (size_t)a->nparams) != 0)
        return snprintf(why, wn, "the final parameters differ"), 0;
    return 1;
}

#endif
