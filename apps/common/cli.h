/* Small helpers shared by the distlab apps: strict number parsing, error printing, the version
 * line and the list splitter. Every parser prints its own "distlab-bench: ..." message and
 * returns -1 on bad input, so that callers only map -1 to exit status 2. */
#ifndef DISTLAB_APPS_COMMON_CLI_H
#define DISTLAB_APPS_COMMON_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Name printed in front of every message ("distlab-bench"). */
extern const char *cli_progname;

/* Exit statuses of the apps. */
enum { CLI_EXIT_OK = 0, CLI_EXIT_FAIL = 1, CLI_EXIT_USAGE = 2 };

/* Print "distlab-bench: <message>\n" on stderr. */
void cli_error(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

/* The command-line word `arg` (argv[optind - 1] after getopt's '?': "--micro-batches", "--x=3")
 * is no option: one line on stderr, "PREFIXunknown option '--micro-batches' (did you mean
 * '--microbatches'? see HELP)" with the nearest name by edit distance when one is close; for a
 * known option without its value "PREFIXoption '--steps' needs a value (see HELP)"; for a
 * prefix of several "ambiguous option '--micro' (--micro-batch, --microbatches; see HELP)"
 * (abbrev below).
 * names: the option names without "--", each the first member of a table's entries `stride`
 * bytes apart (struct option's name, or a plain array: stride sizeof(char *)); n of them, or
 * n = 0: up to a NULL name. abbrev: the parser takes a unique prefix of a name (getopt_long
 * does), so a known name or prefix means a value is missing or extra, and a prefix of several
 * is ambiguous. prefix: "" or "coll: "; help: "--help". */
void cli_unknown_option(const char *prefix, const char *arg, const void *names, size_t stride,
                        size_t n, int abbrev, const char *help);

/* Bytes in MiB (2^20) and GiB (2^30), the units the apps print bytes in for people (--json keeps
 * bytes; --gpu-mem 16M means 16 MiB). */
double cli_mib(double bytes);
double cli_gib(double bytes);

/* A grid the library draws as the lecture does ("GPU 1" for rank 0) printed on f with the apps'
 * name for it: "rank 0" (distlab-lecture keeps the lecture's); other lines as they are. */
void cli_put_ranked(FILE *f, const char *grid);

/* "distlab-bench (distlab) 0.2.0" on f. */
void cli_print_version(FILE *f);

/* Parse the whole of `s` as a size ("64M", "4096", "1.5GiB": dl_parse_size) within [min, max].
 * `what` names the option in the message. Returns 0 or -1 (message printed). */
int cli_parse_size(const char *what, const char *s, uint64_t min, uint64_t max, uint64_t *out);
/* Whole-string decimal integer within [min, max]. */
int cli_parse_int(const char *what, const char *s, long min, long max, int *out);
/* Whole-string finite double within [min, max]. */
int cli_parse_double(const char *what, const char *s, double min, double max, double *out);
/* Split the comma-separated list `s` into at most `max` items (pointers into buf, which
 * receives a copy of s; bufsz bytes). Empty items ("1,,2", "1,2,", ",1") and an empty list are
 * refused. The count in *n. 0 or -1 (message printed, naming `what`). */
int cli_split_list(const char *what, const char *s, char *buf, size_t bufsz, char **items, int max,
                   int *n);
/* 1 if s (after an optional sign) is a hexadecimal number ("0x1p3"), which strtod would take:
 * the apps accept decimal numbers only. */
int cli_is_hex(const char *s);
/* "0"/"1" (also "no"/"yes", "off"/"on", "false"/"true"). */
int cli_parse_bool(const char *what, const char *s, int *out);

/* An output file `path` (option `what`, e.g. "--save") may be written without destroying
 * anything: it does not exist or is a regular file, not a symlink, in a writable directory
 * (dl_path_check_output). Called after option parsing, before any work. 0 or -1 (message
 * printed). */
int cli_check_output(const char *what, const char *path);

/* A file size limit (ulimit -f) must be a write error with a message (EFBIG), not a silent
 * death by SIGXFSZ: ignore the signal. Called first thing by every app. */
void cli_ignore_sigxfsz(void);

/* SIGINT, SIGTERM and SIGHUP remove PATH.tmp.PID (the temporary a save or trace of PATH
 * writes before its rename; lib/io/path.h) and then kill the process as before. Call
 * for each output path after option parsing; NULL is ignored; at most 8 paths. */
void cli_remove_tmp_on_signal(const char *path);

/* OpenBLAS reads OPENBLAS_NUM_THREADS and OPENBLAS_CORETYPE when it loads (before main), so the
 * apps restart themselves once (/proc/self/exe, guarded by DISTLAB_REEXEC), before MPI_Init:
 * - unless OPENBLAS_NUM_THREADS is already "1", with it set to 1 (one OpenBLAS thread per rank);
 * - unless the user set OPENBLAS_CORETYPE (empty counts as unset), when the loaded kernel's ISA
 *   level is below the CPU's, with OPENBLAS_CORETYPE set to the CPU's best class
 *   (dl_blas_coretype_for), even if OPENBLAS_NUM_THREADS is already 1; after that restart, a
 *   warning if the kernel did not change (OpenBLAS without DYNAMIC_ARCH).
 * A user's OPENBLAS_CORETYPE is kept, with a warning when the CPU cannot run it. Messages go to
 * stderr, from process 0 only under mpirun. Test hook (tests/apps/test_blas_apps.sh):
 * DISTLAB_BLAS_TEST_LOADED=NAME makes the start read NAME as the loaded kernel (Prescott: a CPU
 * OpenBLAS does not recognise; the user's OPENBLAS_CORETYPE still rules the restart out), and
 * "static:NAME" the restarted process too (an OpenBLAS without DYNAMIC_ARCH). */
void cli_blas_setup(char **argv);

#endif
