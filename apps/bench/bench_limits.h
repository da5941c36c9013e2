/* The machine's own limits, measured in the same run as a benchmark so that its rows can be
 * stated as a fraction of them (issue 18): the one-way cache-line hop between two pinned cores,
 * the single-copy cross-core bandwidth at a given size, and STREAM copy at a DRAM-resident size
 * chosen from the real L3. Used by `distlab-bench coll`; free of collective knowledge. */
#ifndef DISTLAB_APPS_BENCH_LIMITS_H
#define DISTLAB_APPS_BENCH_LIMITS_H

#include <stddef.h>
#include <stdio.h>
#include "distlab.h"
#include "core/topo.h"

/* Rows at most this size are latency rows: their time is hand-offs, not bytes. */
#define BL_LATENCY_MAX 4096
/* L3 assumed when hwloc reports none (said in the output). */
#define BL_L3_FALLBACK ((long long)32 << 20)

/* Which limit applies to a row. */
typedef enum bl_kind { BL_NONE = -1, BL_HOP = 0, BL_COPY = 1, BL_DRAM = 2 } bl_kind;

typedef struct bl_copy {
    size_t bytes;
    double gbs; /* per thread; 0: failed */
} bl_copy;

typedef struct bl_limits {
    int measured;        /* 0: --limits 0, nothing below is valid */
    int cpu[2];          /* the OS cpus of the hop (the first two placed threads); -1: none */
    double hop_ns;       /* one-way hop = round trip / 2, fastest trial; NAN: not measured */
    double hop_after_ns; /* again after the run (drift); NAN: not measured */
    long long l3_bytes;  /* the real machine's L3 (BL_L3_FALLBACK when unknown) */
    int l3_assumed;
    int threads;             /* copy and STREAM threads: min(ranks, real PUs) */
    size_t stream_bytes;     /* per thread */
    double stream_gbs;       /* before the sweep, fastest trial; 0: failed */
    double stream_after_gbs; /* after it: how far the host drifted */
    bl_copy *copy;           /* one per measured size */
    int ncopy;
} bl_limits;

/* The real machine's L3 in bytes (the fallback when none: *assumed = 1). */
long long bl_l3_bytes(int *assumed);
/* The smallest power of two >= 4 x l3: the first size of the --dram sweep. */
size_t bl_dram_size(long long l3);
/* Per-thread STREAM array bytes so that the threads' sources total >= 4 x l3 (MiB multiple). */
size_t bl_stream_bytes(long long l3, int threads);

/* One-way hop between OS cpus a and b: two pinned threads bounce one cache line, rounds round
 * trips per trial; the fastest trial's round trip / 2 in ns (NAN on failure or a == b). Limits
 * take the fastest trial: noise only ever slows a trial down. */
double bl_hop_ns(const dl_topo *topo, int a, int b, int rounds, int trials);
/* Single-copy cross-core bandwidth: k threads on cpus[0..k-1]; each writes its own source once,
 * then per trial thread i memcpy's thread i-1's unchanged source into its own page-aligned
 * destination, all at once as the ranks of a ring step do. Unchanged, as `coll` resends the same
 * buffers every iteration: a source rewritten before each trial copies up to 2x slower (its lines
 * come from the writer's cache) and coll's rows beat that bound (issue 29). Per trial the
 * slowest thread; the fastest trial; GB/s = bytes / time (one thread's payload). 0 on failure. */
double bl_copy_gbs(const dl_topo *topo, const int *cpus, int k, size_t bytes, int trials);

/* Measure hop, copy at each of sizes[0..nsizes-1] whose rows (of nranks ranks) are copy rows,
 * and STREAM, with `threads` threads placed as the first ranks are. stream_bytes 0: chosen from
 * the L3. Returns 0, or -1 when out of memory (L is then cleared). */
int bl_measure(bl_limits *L, const dl_topo *topo, const dl_world_opts *w, int threads,
               const size_t *sizes, int nsizes, int nranks, size_t stream_bytes);
/* The hop and STREAM again, after the benchmark: how far the host drifted meanwhile. */
void bl_measure_after(bl_limits *L, const dl_topo *topo, const dl_world_opts *w);
void bl_free(bl_limits *L);

/* The limit of a row: footprint = bytes the op's buffers hold over all ranks (2 x ranks x size
 * for send and receive buffers). Latency when size <= BL_LATENCY_MAX, copy while the footprint
 * fits the L3, DRAM beyond. */
bl_kind bl_kind_of(const bl_limits *L, size_t size, int nranks);
/* The copy bandwidth measured at `bytes` (0 if not measured). */
double bl_copy_at(const bl_limits *L, size_t bytes);
/* The copy limit of a row of nranks ranks: bl_copy_at x threads / nranks when the ranks share
 * the threads' cores (every rank's received bytes are copied by those cores), else bl_copy_at. */
double bl_copy_limit(const bl_limits *L, size_t bytes, int nranks);
const char *bl_kind_name(bl_kind k);

/* What the limits are and which applies to a row, for a subcommand's --help. */
void bl_help(FILE *f);
/* The limits as "# " text lines, and as the members of a JSON "limits" object (no braces). */
void bl_print_text(FILE *f, const bl_limits *L);
void bl_print_json(FILE *f, const bl_limits *L);

#endif
