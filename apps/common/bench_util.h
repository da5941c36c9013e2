/* Shared pieces of the distlab-bench subcommands: the STREAM kernel (copy, triad), machine facts,
 * JSON Lines / CSV helpers, the gnuplot driver, the model's GEMM shapes, and the harness's
 * arithmetic (contention factor, hidden fraction) as small pure functions so that
 * `distlab-bench selftest` can check them on synthetic timings. */
#ifndef DISTLAB_APPS_COMMON_BENCH_UTIL_H
#define DISTLAB_APPS_COMMON_BENCH_UTIL_H

#include <getopt.h>
#include <stddef.h>
#include <stdio.h>
#include "distlab.h"
#include "core/topo.h"
#include "model/ops.h"

/* ---- STREAM ---- */
enum { BU_COPY = 0, BU_TRIAD = 1 };
/* Which trial bu_stream reports: the median (a typical figure) or the fastest (a limit: noise
 * only ever slows a trial down). */
enum { BU_MEDIAN = 0, BU_FASTEST = 1 };
/* STREAM bandwidth of `nthr` threads placed by (policy, nodes, rpn) on the real machine, each
 * with its own page-aligned arrays of `bytes` bytes (first-touched by the thread). Copy (memcpy)
 * counts read + write (2 x bytes), triad a = b + s*c on doubles counts 3 x bytes, as STREAM does.
 * Per trial the slowest thread's time; over `trials`, the median or the fastest (stat). Returns
 * GB/s, 0 on failure. */
double bu_stream(const dl_topo *topo, dl_place_policy policy, dl_node_kind nodes, int rpn, int nthr,
                 size_t bytes, int kernel, int trials, int stat);

/* ---- the harness's arithmetic (pure; tested by `distlab-bench selftest`) ---- */
/* Contention factor = per-rank rate alone / per-rank rate together = t_together / t_alone for
 * the same work. 1 = no contention, 2 = each rank runs at half speed. NAN on bad input. */
double bu_contention(double t_alone, double t_together);
/* Overlap of a communication (alone: tc) and a computation (alone: tg) run at once: the
 * communication took tc_both, the computation tg_both, the pair (start to both finished) t_both.
 * hidden = fraction of the communication's own time that did not add to the pair's time,
 * (tc + tg - t_both) / tc, clamped to [0, 1] (noise can push it outside). */
typedef struct bu_overlap {
    double comm_slowdown; /* tc_both / tc */
    double comp_slowdown; /* tg_both / tg */
    double hidden;        /* [0, 1] or NAN */
} bu_overlap;
bu_overlap bu_overlap_calc(double tc, double tg, double tc_both, double tg_both, double t_both);
/* 1 when all pure-function checks pass; prints failures to f. */
int bu_selftest(FILE *f);

/* ---- GEMM shapes of the benchmark model ---- */
typedef struct bu_model {
    int layers, d_model, heads, seq, micro_batch;
} bu_model;
void bu_model_default(bu_model *m); /* the PyTorch peer's model: 4 x 256, 4 heads, T 128, B 8 */
/* Fill log with the linear layers' GEMMs of one training step (forward and both backward GEMMs
 * of qkv, attention projection, MLP fc and fc-proj per layer, the LM head's three): the shapes
 * dl_linear_{fwd,bwd} run. Attention's per-head GEMMs are left out. */
void bu_model_gemms(const bu_model *m, dl_gemm_log *log);
double bu_gemm_log_flops(const dl_gemm_log *log);
/* Buffers big enough for any shape of log; run every shape `count` times (sgemm). */
typedef struct bu_gemm_bufs {
    float *a, *b, *c;
} bu_gemm_bufs;
int bu_gemm_alloc(const dl_gemm_log *log, bu_gemm_bufs *g);
void bu_gemm_free(bu_gemm_bufs *g);
void bu_gemm_run(const dl_gemm_log *log, bu_gemm_bufs *g);
void bu_gemm_one(const dl_gemm_shape *s, bu_gemm_bufs *g);

/* ---- machine facts, output ---- */
typedef struct bu_out {
    const char *sub; /* "gemm", "stream", "overlap" */
    int csv, json;
} bu_out;
/* The facts as "# " lines (text and CSV: gnuplot and pandas(comment='#') skip them), or as the
 * `"machine"` object's members in JSON. */
void bu_machine_text(FILE *f, const dl_topo *topo);
void bu_machine_json(FILE *f, const dl_topo *topo);
/* "# blas_kernel: Haswell (AVX2+FMA kernel; CPU AVX-512)": the kernel OpenBLAS runs, both levels
 * (part of bu_machine_text; JSON: "blas_kernel" in the machine object). */
void bu_blas_text(FILE *f);
/* Start a JSON Lines record: {"type":"<type>","schema":"distlab/1","app":"distlab-bench",
 * "subcommand":"<sub>" — the caller adds ,"key":value pairs and ends with bu_json_end. */
void bu_json_begin(FILE *f, const char *sub, const char *type);
void bu_json_end(FILE *f);
void bu_json_num(FILE *f, const char *key, double v); /* ,"key":%.17g or null if not finite */
void bu_json_int(FILE *f, const char *key, long long v);
void bu_json_str(FILE *f, const char *key, const char *v);
void bu_json_bool(FILE *f, const char *key, int v);

/* Warn (stderr) when n exceeds the real PUs; returns 1 when it does. */
int bu_warn_oversub(int n, int real_pus);

/* --plot FILE.svg|FILE.png: check the extension (usage error: -1, message printed). */
int bu_plot_check(const char *file);
/* Write FILE's data file (FILE minus extension + ".dat") with `data` (already formatted), the
 * gnuplot script (+ ".gp") whose body is `script` (after the terminal and output lines), and run
 * gnuplot when /usr/bin/gnuplot exists; else say how to render. Returns 0, or -1 on failure. */
int bu_plot(const char *file, const char *data, const char *script);
/* bu_plot saying what it wrote on `say`: one line "wrote FILE (data ..., script ...)" (on stderr
 * after the program's name, as bu_plot does). */
int bu_plot_to(const char *file, const char *data, const char *script, FILE *say);

/* Busy-wait until `ns` nanoseconds after `start` (dl_now_ns clock): fixed "compute" that
 * occupies a core, for the harness's emulated work. */
void bu_spin_until(uint64_t start, uint64_t ns);

/* Sleep until `ns` nanoseconds after `start` (dl_now_ns clock, an absolute CLOCK_MONOTONIC
 * deadline, so a late start does not lengthen it): emulated work that needs no core. */
void bu_sleep_until(uint64_t start, uint64_t ns);
/* That deadline as a timespec (carrying into seconds). */
struct timespec bu_deadline(uint64_t start, uint64_t ns);

/* The subcommands: argv[0] is the subcommand's name; return the exit status (0 ok, 1 a failed
 * run, 2 bad usage). */
int bench_gemm_main(int argc, char **argv);
int bench_stream_main(int argc, char **argv);
int bench_overlap_main(int argc, char **argv);
int bench_contention_main(int argc, char **argv);
int bench_scaling_main(int argc, char **argv);
int bench_overhead_main(int argc, char **argv);
int bench_moe_main(int argc, char **argv); /* apps/bench/bench_moe.c */

/* The machine's topology for subcommand `sub`; NULL, with one line on stderr ("SUB: cannot load
 * the topology: ..."), when it cannot be loaded. */
dl_topo *bu_topo_load(const char *sub);

/* Common options of gemm, stream and overlap, parsed by each subcommand's getopt loop. */
typedef struct bu_common {
    int csv, json, quick;
    const char *plot;
} bu_common;

/* getopt codes of the common options (a subcommand's own start at 256), and their long options */
enum { BU_O_QUICK = 1000, BU_O_CSV, BU_O_JSON, BU_O_PLOT };
#define BU_LONGOPTS_COMMON                                                                         \
    {"quick", no_argument, NULL, BU_O_QUICK}, {"csv", no_argument, NULL, BU_O_CSV},                \
    {                                                                                              \
        "json", no_argument, NULL, BU_O_JSON                                                       \
    }
#define BU_LONGOPT_PLOT                                                                            \
    {                                                                                              \
        "plot", required_argument, NULL, BU_O_PLOT                                                 \
    }
/* The end of a subcommand's long options: the common ones (with --plot or without), --help and
 * the terminator. */
#define BU_LONGOPTS_END                                                                            \
    BU_LONGOPTS_COMMON, BU_LONGOPT_PLOT, {"help", no_argument, NULL, 'h'}, { NULL, 0, NULL, 0 }
#define BU_LONGOPTS_END_NOPLOT                                                                     \
    BU_LONGOPTS_COMMON, {"help", no_argument, NULL, 'h'}, { NULL, 0, NULL, 0 }
/* A selftest's check: when cond is 0, "WHO: FAILED TEXT (line N)" on f and *ok = 0. Call it
 * through a macro that passes #cond and __LINE__. */
void bu_check(FILE *f, const char *who, int cond, const char *text, int line, int *ok);
/* A subcommand's option loop over its own options (declare `int opt` before it; after it,
 * opt < 0 is a usage error, one line printed): getopt_long from argv[1], -h the only short
 * option, our own one-line messages; -h, the common options and the final checks
 * (bu_common_done) are bu_next_opt's. */
#define BU_FOR_EACH_OPT(opt, sub, argc, argv, lo, o, usage)                                        \
    for (opt = (opterr = 0, optind = 1, 0); (opt = bu_next_opt(sub, argc, argv, lo, o, usage)) > 0;)
/* The next of subcommand `sub`'s own options (its getopt value); 0 after the last (no stray
 * argument, --csv and --json not both), -1 on a usage error (one line printed). -h prints
 * usage on stdout and exits 0. */
int bu_next_opt(const char *sub, int argc, char **argv, const struct option *lo, bu_common *o,
                void (*usage)(FILE *));
/* A getopt result that is none of subcommand `sub`'s own options: -h (usage on stdout, exit 0),
 * a common option (returns 0) or a usage error (returns -1, one line printed, with the nearest of
 * lo's names when one is close). */
int bu_common_opt(const char *sub, int opt, char **argv, const struct option *lo, bu_common *o,
                  void (*usage)(FILE *));
/* After the getopt loop: no stray arguments, and --csv and --json not both (0, or -1 printed). */
int bu_common_done(const char *sub, int argc, char **argv, const bu_common *o);

#endif
