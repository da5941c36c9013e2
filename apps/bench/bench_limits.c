/* The machine's limits a benchmark row is measured against (see bench_limits.h). */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "distlab.h"
#include "core/topo.h"
#include "core/stats.h"
#include "cli.h"
#include "bench_util.h"
#include "bench_limits.h"

static inline void relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

long long bl_l3_bytes(int *assumed)
{
    dl_topo *t = NULL;
    dl_topo_summary s;
    long long l3 = 0;
    if (dl_topo_load(&t, "") == DL_OK) { /* "": the real machine, never a synthetic one */
        dl_topo_get_summary(t, &s);
        l3 = s.l3_bytes;
        dl_topo_destroy(t);
    }
    *assumed = l3 <= 0;
    return l3 > 0 ? l3 : BL_L3_FALLBACK;
}

size_t bl_dram_size(long long l3)
{
    size_t s = 1;
    while (s < (size_t)l3 * 4) s <<= 1;
    return s;
}

size_t bl_stream_bytes(long long l3, int threads)
{
    size_t mib = (size_t)1 << 20, per = ((size_t)l3 * 4 + (size_t)threads - 1) / (size_t)threads;
    return (per + mib - 1) / mib * mib;
}

/* The fastest trial: a limit is what the machine allows when nothing else gets in the way, and
 * noise (a preempted thread, the other tenants of this host) only ever makes a trial slower. */
static double min_of(const double *t, int n)
{
    double m = t[0];
    for (int i = 1; i < n; i++)
        if (t[i] < m)
            m = t[i];
    return m;
}

/* ------------------------------------------------------------------------ the hop ---- */

typedef struct hop_thr {
    pthread_t tid;
    const dl_topo *topo;
    int cpu, side, rounds, trials;
    _Atomic uint64_t *line; /* the one cache line both threads write */
    pthread_barrier_t *bar;
    double *t; /* [trials] ns per one-way hop (side 0) */
} hop_thr;

/* Side 0 writes odd values and waits for the even answer; side 1 answers: every value crosses
 * the cores once, so a round trip is two hops. */
static void *hop_main(void *arg)
{
    hop_thr *h = arg;
    int actual;
    (void)dl_topo_bind_self(h->topo, h->cpu, &actual);
    for (int k = 0; k < h->trials; k++) {
        uint64_t base = (uint64_t)k * 2 * (uint64_t)h->rounds;
        pthread_barrier_wait(h->bar);
        uint64_t t0 = dl_now_ns();
        for (uint64_t i = 0; i < (uint64_t)h->rounds; i++) {
            uint64_t ping = base + 2 * i + 1;
            if (h->side == 0) {
                atomic_store_explicit(h->line, ping, memory_order_release);
                while (atomic_load_explicit(h->line, memory_order_acquire) != ping + 1) relax();
            } else {
                while (atomic_load_explicit(h->line, memory_order_acquire) != ping) relax();
                atomic_store_explicit(h->line, ping + 1, memory_order_release);
            }
        }
        if (h->side == 0)
            h->t[k] = (double)(dl_now_ns() - t0) / h->rounds / 2;
    }
    return NULL;
}

double bl_hop_ns(const dl_topo *topo, int a, int b, int rounds, int trials)
{
    if (a == b || a < 0 || b < 0 || rounds < 1 || trials < 1)
        return NAN;
    _Atomic uint64_t *line = NULL;
    double *t = calloc((size_t)trials, sizeof *t), r = NAN;
    pthread_barrier_t bar;
    if (!t || posix_memalign((void **)&line, 64, 64) != 0) { /* a line of its own */
        free(t);
        return NAN;
    }
    atomic_init(line, 0);
    pthread_barrier_init(&bar, NULL, 2);
    hop_thr h[2];
    for (int s = 0; s < 2; s++)
        h[s] = (hop_thr){.topo = topo,
                         .cpu = s ? b : a,
                         .side = s,
                         .rounds = rounds,
                         .trials = trials,
                         .line = line,
                         .bar = &bar,
                         .t = t};
    int started = pthread_create(&h[0].tid, NULL, hop_main, &h[0]) == 0;
    if (started && pthread_create(&h[1].tid, NULL, hop_main, &h[1]) != 0) {
        /* side 0 would wait at the barrier for a partner that never comes */
        cli_error("one-way hop: could not start its second thread");
        exit(CLI_EXIT_FAIL);
    }
    if (started) {
        pthread_join(h[1].tid, NULL);
        pthread_join(h[0].tid, NULL);
        r = min_of(t, trials);
    }
    pthread_barrier_destroy(&bar);
    free((void *)line);
    free(t);
    return r;
}

/* ------------------------------------------------------------------- single copy ---- */

typedef struct copy_thr {
    pthread_t tid;
    const dl_topo *topo;
    int cpu, trials;
    size_t bytes;
    unsigned char *src, *dst;
    const unsigned char *peer; /* the previous thread's src */
    pthread_barrier_t *bar;
    double *t; /* [trials] ns */
    int fail;
} copy_thr;

static void *copy_main(void *arg)
{
    copy_thr *c = arg;
    int actual;
    (void)dl_topo_bind_self(c->topo, c->cpu, &actual);
    /* first touch by the owner; page-aligned against glibc's slow-memcpy offsets. The source is
     * written once: `coll` sends the same, unchanged buffers every iteration, so after its
     * warm-up the reader's own caches hold them. A source rewritten before every trial (fresh
     * data in the writer's cache) copies slower, and coll's rows beat that bound (issue 29). */
    memset(c->src, 1, c->bytes);
    memset(c->dst, 0, c->bytes);
    pthread_barrier_wait(c->bar);          /* every src allocated and written before anyone reads */
    for (int k = 0; k <= c->trials; k++) { /* trial 0 warms up, untimed */
        pthread_barrier_wait(c->bar);
        uint64_t t0 = dl_now_ns();
        memcpy(c->dst, c->peer, c->bytes);
        uint64_t t1 = dl_now_ns();
        if (k > 0)
            c->t[k - 1] = (double)(t1 - t0);
        c->fail |= c->dst[c->bytes - 1] != 1;
        c->dst[c->bytes - 1] = 0; /* the next trial's check sees its own copy */
    }
    return NULL;
}

double bl_copy_gbs(const dl_topo *topo, const int *cpus, int k, size_t bytes, int trials)
{
    copy_thr *th = calloc((size_t)k, sizeof *th);
    double *t = calloc((size_t)k * (size_t)trials, sizeof *t), gbs = 0;
    double *per = calloc((size_t)trials, sizeof *per);
    pthread_barrier_t bar;
    int ok = th && t && per && bytes > 0 && k > 0, started = 0;
    for (int i = 0; ok && i < k; i++) {
        th[i] = (copy_thr){.topo = topo,
                           .cpu = cpus[i],
                           .trials = trials,
                           .bytes = bytes,
                           .bar = &bar,
                           .t = t + (size_t)i * (size_t)trials};
        if (posix_memalign((void **)&th[i].src, 4096, bytes) != 0)
            th[i].src = NULL;
        if (posix_memalign((void **)&th[i].dst, 4096, bytes) != 0)
            th[i].dst = NULL;
        ok = th[i].src && th[i].dst;
    }
    for (int i = 0; ok && i < k; i++) th[i].peer = th[(i + k - 1) % k].src;
    if (ok && pthread_barrier_init(&bar, NULL, (unsigned)k) == 0) {
        for (; started < k; started++)
            if (pthread_create(&th[started].tid, NULL, copy_main, &th[started]) != 0)
                break;
        if (started < k) { /* the started ones would wait at the barrier forever */
            cli_error("single-copy: could not start %d threads", k);
            exit(CLI_EXIT_FAIL);
        }
        for (int i = 0; i < k; i++) {
            pthread_join(th[i].tid, NULL);
            ok &= !th[i].fail;
        }
        pthread_barrier_destroy(&bar);
        for (int j = 0; ok && j < trials; j++) {
            for (int i = 0; i < k; i++)
                if (t[(size_t)i * trials + j] > per[j])
                    per[j] = t[(size_t)i * trials + j];
        }
        double ns = ok ? min_of(per, trials) : 0;
        gbs = ns > 0 ? (double)bytes / ns : 0;
    }
    for (int i = 0; th && i < k; i++) {
        free(th[i].src);
        free(th[i].dst);
    }
    free(th);
    free(t);
    free(per);
    return gbs;
}

/* ------------------------------------------------------------------- all of them ---- */

/* Short hop trials (about 10 us each): most of them run without being preempted. */
enum { HOP_ROUNDS = 200, HOP_TRIALS = 201 };
/* STREAM trials (about 10 ms each at 64 MiB): the fastest is the limit, as for hop and copy. */
enum { STREAM_TRIALS = 7 };

/* Copy trials by size: many for small copies (a few us each), fewer for MiBs. */
static int copy_trials(size_t bytes) { return bytes <= (1u << 20) ? 31 : 11; }

int bl_measure(bl_limits *L, const dl_topo *topo, const dl_world_opts *w, int threads,
               const size_t *sizes, int nsizes, int nranks, size_t stream_bytes)
{
    dl_placement *pl = NULL;
    int rpn = w->ranks_per_node > 0 ? w->ranks_per_node : 1, np = threads < 2 ? 2 : threads;
    memset(L, 0, sizeof *L);
    L->measured = 1;
    L->cpu[0] = L->cpu[1] = -1;
    L->hop_ns = L->hop_after_ns = NAN;
    L->threads = threads;
    L->l3_bytes = bl_l3_bytes(&L->l3_assumed);
    L->copy = calloc((size_t)nsizes + 1, sizeof *L->copy);
    int *cpus = calloc((size_t)np, sizeof *cpus);
    if (!L->copy || !cpus) {
        free(cpus);
        bl_free(L);
        return -1;
    }
    if (dl_place(topo, np, w->policy, w->nodes, rpn, &pl) == DL_OK) {
        for (int i = 0; i < np; i++) cpus[i] = pl->os_pu[i];
        dl_placement_destroy(pl);
    } else {
        for (int i = 0; i < np; i++) cpus[i] = i % dl_topo_real_pus(topo);
    }
    L->cpu[0] = cpus[0], L->cpu[1] = cpus[1];
    L->hop_ns =
        bl_hop_ns(topo, cpus[0], cpus[1], HOP_ROUNDS, HOP_TRIALS); /* short trials: few preempted */
    for (int i = 0; i < nsizes; i++) {
        int dup = 0;
        for (int j = 0; j < L->ncopy; j++) dup |= L->copy[j].bytes == sizes[i];
        if (dup || bl_kind_of(L, sizes[i], nranks) != BL_COPY)
            continue;
        L->copy[L->ncopy].bytes = sizes[i];
        L->copy[L->ncopy++].gbs = bl_copy_gbs(topo, cpus, threads, sizes[i], copy_trials(sizes[i]));
    }
    free(cpus);
    L->stream_bytes = stream_bytes ? stream_bytes : bl_stream_bytes(L->l3_bytes, threads);
    L->stream_gbs = bu_stream(topo, w->policy, w->nodes, rpn, threads, L->stream_bytes, BU_COPY,
                              STREAM_TRIALS, BU_FASTEST);
    return 0;
}

void bl_measure_after(bl_limits *L, const dl_topo *topo, const dl_world_opts *w)
{
    if (L->measured && isfinite(L->hop_ns))
        L->hop_after_ns = bl_hop_ns(topo, L->cpu[0], L->cpu[1], HOP_ROUNDS, HOP_TRIALS);
    if (L->measured && L->stream_gbs > 0)
        L->stream_after_gbs =
            bu_stream(topo, w->policy, w->nodes, w->ranks_per_node > 0 ? w->ranks_per_node : 1,
                      L->threads, L->stream_bytes, BU_COPY, STREAM_TRIALS, BU_FASTEST);
}

void bl_free(bl_limits *L)
{
    free(L->copy);
    memset(L, 0, sizeof *L);
}

bl_kind bl_kind_of(const bl_limits *L, size_t size, int nranks)
{
    if (!L->measured)
        return BL_NONE;
    if (size <= BL_LATENCY_MAX)
        return BL_HOP;
    return 2.0 * nranks * (double)size <= (double)L->l3_bytes ? BL_COPY : BL_DRAM;
}

double bl_copy_at(const bl_limits *L, size_t bytes)
{
    for (int i = 0; i < L->ncopy; i++)
        if (L->copy[i].bytes == bytes)
            return L->copy[i].gbs;
    return 0;
}

double bl_copy_limit(const bl_limits *L, size_t bytes, int nranks)
{
    double g = bl_copy_at(L, bytes);
    return nranks > L->threads ? g * L->threads / nranks : g;
}

const char *bl_kind_name(bl_kind k)
{
    return k == BL_HOP ? "hop" : k == BL_COPY ? "copy" : k == BL_DRAM ? "dram" : "none";
}

/* ------------------------------------------------------------------------ output ---- */

void bl_help(FILE *f)
{
    /* clang-format off */
    fputs(
"vs lim: each row against the machine's limit that applies to it, measured in this run (the\n"
"limit column names it and gives its value):\n"
"  hop   rows <= 4 KiB: hops spent = time / the one-way hop, the round trip / 2 of two threads\n"
"        pinned as ranks 0 and 1 bouncing one cache line (\"7.0h\": seven hand-offs' time);\n"
"  copy  rows whose buffers (2 x ranks x size) fit the L3: busbw as % of the single-copy\n"
"        bound C x k / ranks (x 1 when ranks <= k): C = GB/s per thread of k = min(ranks, PUs)\n"
"        threads at once, each memcpy'ing size bytes of the previous one's unchanged buffer,\n"
"        as coll resends its unchanged buffers (warm in the reader's caches); busbw counts\n"
"        what each rank must receive, and k cores copy for all ranks, so none beats it;\n"
"  dram  larger rows: busbw as % of the DRAM bound, B x the op's factor, B = STREAM copy\n"
"        (read + write counted) of those threads at >= 4 x L3 in all: every input is read and\n"
"        every output written once, T bytes, so time >= T/B.\n"
"Hop, copy and STREAM take the fastest of their trials (noise only ever slows a trial down).\n"
"The hop and STREAM are measured again after the run to show the host's drift.\n", f);
    /* clang-format on */
}

static int dram_resident(const bl_limits *L)
{
    return (double)L->stream_bytes * L->threads >= 4.0 * (double)L->l3_bytes;
}

void bl_print_text(FILE *f, const bl_limits *L)
{
    if (!L->measured)
        return;
    fprintf(f,
            "# limits, measured now (vs lim: latency rows <= %d B: hops = time / one-way hop;\n"
            "#   rows whose buffers (2 x ranks x size) fit the L3: %% of the single-copy bound,\n"
            "#   C x threads / ranks when the ranks share cores;\n"
            "#   larger rows: %% of the DRAM bound, STREAM copy B x the op's factor)\n",
            BL_LATENCY_MAX);
    if (isfinite(L->hop_ns))
        fprintf(f,
                "#   one-way hop (cpus %d <-> %d, cache-line ping-pong, round trip / 2): %.1f ns\n",
                L->cpu[0], L->cpu[1], L->hop_ns);
    else
        fprintf(f, "#   one-way hop: not measured (needs two cpus)\n");
    if (L->ncopy > 0) {
        fprintf(f,
                "#   single-copy C (%d thread%s, each memcpy's the previous one's unchanged "
                "buffer), GB/s per thread:",
                L->threads, L->threads > 1 ? "s" : "");
        for (int i = 0; i < L->ncopy; i++)
            fprintf(f, "%s %zu B %.2f", i ? "," : "", L->copy[i].bytes, L->copy[i].gbs);
        fputc('\n', f);
    }
    fprintf(f,
            "#   STREAM copy B = %.2f GB/s (%d thread%s x %zu MiB, read + write counted; L3 %lld "
            "MiB%s; "
            "%s)\n",
            L->stream_gbs, L->threads, L->threads > 1 ? "s" : "", L->stream_bytes >> 20,
            L->l3_bytes >> 20, L->l3_assumed ? " assumed: hwloc reports none" : "",
            dram_resident(L) ? "sources >= 4 x L3: DRAM-resident"
                             : "below 4 x L3 (--stream-mib): NOT DRAM-resident");
}

void bl_print_json(FILE *f, const bl_limits *L)
{
    fprintf(f, "\"hop_ns\": ");
    if (isfinite(L->hop_ns))
        fprintf(f, "%.6g", L->hop_ns);
    else
        fputs("null", f);
    fprintf(f, ", \"hop_ns_after\": ");
    if (isfinite(L->hop_after_ns))
        fprintf(f, "%.6g", L->hop_after_ns);
    else
        fputs("null", f);
    fprintf(f,
            ", \"hop_cpus\": [%d, %d], \"latency_max_bytes\": %d, \"l3_bytes\": %lld, "
            "\"l3_assumed\": %s, \"threads\": %d,\n    \"copy\": [",
            L->cpu[0], L->cpu[1], BL_LATENCY_MAX, L->l3_bytes, L->l3_assumed ? "true" : "false",
            L->threads);
    for (int i = 0; i < L->ncopy; i++)
        fprintf(f, "%s{\"size\": %zu, \"gbs\": %.6g}", i ? ", " : "", L->copy[i].bytes,
                L->copy[i].gbs);
    fprintf(f,
            "],\n    \"stream\": {\"bytes_per_thread\": %zu, \"dram_bytes\": %zu, "
            "\"dram_resident\": %s, \"copy_gbs\": %.6g, \"copy_gbs_after\": %.6g}",
            L->stream_bytes, L->stream_bytes * (size_t)L->threads,
            dram_resident(L) ? "true" : "false", L->stream_gbs, L->stream_after_gbs);
}
