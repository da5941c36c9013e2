#define _GNU_SOURCE
/* Shared helpers of the distlab apps. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include "distlab.h"
#include "core/arena.h"
#include "core/blas.h"
#include "io/path.h"
#include "cli.h"

const char *cli_progname = "distlab-bench";

void cli_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", cli_progname);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

double cli_mib(double bytes) { return bytes / 1048576.0; }
double cli_gib(double bytes) { return bytes / 1073741824.0; }

void cli_put_ranked(FILE *f, const char *grid)
{
    for (const char *p = grid; *p;) {
        size_t n = strcspn(p, "\n");
        int gpu, at = 0;
        if (sscanf(p, "GPU %d%n", &gpu, &at) == 1 && at > 0 && (size_t)at <= n)
            fprintf(f, "rank %-*d%.*s\n", at - 4, gpu - 1, (int)(n - (size_t)at), p + at);
        else
            fprintf(f, "%.*s\n", (int)n, p);
        p += n + (p[n] == '\n');
    }
}

void cli_print_version(FILE *f) { fprintf(f, "%s (distlab) %s\n", cli_progname, dl_version()); }

int cli_parse_size(const char *what, const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
    uint64_t v = 0;
    /* dl_parse_size already insists on the whole string; a leading '-' would wrap, refuse it. */
    if (s == NULL || *s == '\0' || *s == '-' || dl_parse_size(s, &v) != DL_OK) {
        if (s && *s != '-' && strstr(dl_errmsg(), "too large"))
            cli_error("%s: '%s' is too large (at most %llu bytes)", what, s,
                      (unsigned long long)max);
        else
            cli_error("%s: '%s' is not a size (e.g. 8, 64K, 64M, 1G)", what, s ? s : "");
        return -1;
    }
    if (v < min || v > max) {
        cli_error("%s: %s is out of range [%llu, %llu] bytes", what, s, (unsigned long long)min,
                  (unsigned long long)max);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_parse_int(const char *what, const char *s, long min, long max, int *out)
{
    char *end = NULL;
    if (s == NULL || *s == '\0') {
        cli_error("%s: missing integer", what);
        return -1;
    }
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end != '\0') {
        cli_error("%s: '%s' is not an integer", what, s);
        return -1;
    }
    if (errno == ERANGE || v < min || v > max) {
        cli_error("%s: %s is out of range [%ld, %ld]", what, s, min, max);
        return -1;
    }
    *out = (int)v;
    return 0;
}

int cli_parse_double(const char *what, const char *s, double min, double max, double *out)
{
    char *end = NULL;
    if (s == NULL || *s == '\0') {
        cli_error("%s: missing number", what);
        return -1;
    }
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end != '\0' || !isfinite(v) || cli_is_hex(s)) {
        cli_error("%s: '%s' is not a number", what, s);
        return -1;
    }
    if (errno == ERANGE || v < min || v > max) {
        cli_error("%s: %s is out of range [%g, %g]", what, s, min, max);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_is_hex(const char *s)
{
    if (*s == '+' || *s == '-')
        s++;
    return s[0] == '0' && (s[1] == 'x' || s[1] == 'X');
}

int cli_split_list(const char *what, const char *s, char *buf, size_t bufsz, char **items, int max,
                   int *n)
{
    *n = 0;
    if (!s || strlen(s) >= bufsz) {
        cli_error("%s: list too long", what);
        return -1;
    }
    strcpy(buf, s);
    char *p = buf;
    for (;;) {
        char *comma = strchr(p, ',');
        if (comma)
            *comma = '\0';
        if (*p == '\0') {
            cli_error(*s ? "%s: '%s' has an empty element" : "%s: empty list%s", what, *s ? s : "");
            return -1;
        }
        if (*n == max) {
            cli_error("%s: at most %d values", what, max);
            return -1;
        }
        items[(*n)++] = p;
        if (!comma)
            return 0;
        p = comma + 1;
    }
}

int cli_parse_bool(const char *what, const char *s, int *out)
{
    static const char *const no[] = {"0", "no", "off", "false"};
    static const char *const yes[] = {"1", "yes", "on", "true"};
    for (size_t i = 0; s != NULL && i < sizeof no / sizeof no[0]; i++) {
        if (strcmp(s, no[i]) == 0) {
            *out = 0;
            return 0;
        }
        if (strcmp(s, yes[i]) == 0) {
            *out = 1;
            return 0;
        }
    }
    cli_error("%s: '%s' is not 0 or 1", what, s ? s : "");
    return -1;
}

void cli_ignore_sigxfsz(void) { signal(SIGXFSZ, SIG_IGN); }

/* The temporaries removed on a fatal signal: formatted up front, as a handler may only unlink */
static char tmp_names[8][4224];
static volatile sig_atomic_t ntmp;

static void remove_tmp_and_die(int sig)
{
    for (int i = 0; i < ntmp; i++) unlink(tmp_names[i]);
    signal(sig, SIG_DFL);
    raise(sig);
}

void cli_remove_tmp_on_signal(const char *path)
{
    if (!path || ntmp == 8 || strlen(path) > 4096)
        return;
    snprintf(tmp_names[ntmp], sizeof tmp_names[ntmp], "%s.tmp.%ld", path, (long)getpid());
    ntmp++;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = remove_tmp_and_die;
    sigemptyset(&sa.sa_mask);
    const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    for (int i = 0; i < 3; i++) {
        struct sigaction old;
        /* a signal ignored by whoever started us (nohup, a background job) stays ignored */
        if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler != SIG_IGN)
            sigaction(sigs[i], &sa, NULL);
    }
}

int cli_check_output(const char *what, const char *path)
{
    if (dl_path_check_output(path, what) == DL_OK)
        return 0;
    cli_error("%s", dl_errmsg());
    return -1;
}

/* Under mpirun only process 0 warns (every process makes the same decision). */
static int quiet_process(void)
{
    static const char *const rank_vars[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"};
    for (size_t i = 0; i < sizeof rank_vars / sizeof rank_vars[0]; i++) {
        const char *v = getenv(rank_vars[i]);
        if (v && *v)
            return strcmp(v, "0") != 0;
    }
    return 0;
}

static void blas_warn(const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!quiet_process())
        cli_error("warning: %s", msg);
}

/* The kernel OpenBLAS chose. Test hook (see cli.h): DISTLAB_BLAS_TEST_LOADED=NAME stands in for
 * it at the start, "static:NAME" also after the restart (as without DYNAMIC_ARCH). */
static const char *loaded_kernel(int restarted)
{
    const char *t = getenv("DISTLAB_BLAS_TEST_LOADED");
    if (t && strncmp(t, "static:", 7) == 0)
        return t[7] ? t + 7 : dl_blas_loaded_kernel();
    return t && *t && !restarted ? t : dl_blas_loaded_kernel();
}

/* After the restart ("kernel:OLD" in DISTLAB_REEXEC): an OpenBLAS built without DYNAMIC_ARCH
 * ignores OPENBLAS_CORETYPE, and the kernel stays what it was. */
static void check_restart(const char *mark)
{
    if (strncmp(mark, "kernel:", 7) != 0)
        return;
    const char *old = mark + 7, *now = loaded_kernel(1), *asked = getenv("OPENBLAS_CORETYPE");
    if (strcasecmp(now, old) == 0)
        blas_warn("OpenBLAS still runs its %s kernel after restarting with OPENBLAS_CORETYPE=%s "
                  "(an OpenBLAS built without DYNAMIC_ARCH ignores it): GEMMs run below this "
                  "CPU's speed",
                  now, asked ? asked : "");
}

static void check_user_coretype(const char *user, const dl_cpu_features *f)
{
    dl_isa_level need = dl_blas_kernel_level(user), have = dl_cpu_isa_level(f);
    if (need > have)
        blas_warn("OPENBLAS_CORETYPE=%s needs %s, which this CPU (with its OS) lacks (it has %s): "
                  "kept as set, so OpenBLAS may fall back or stop on an illegal instruction",
                  user, dl_isa_level_name(need), dl_isa_level_name(have));
}

void cli_blas_setup(char **argv)
{
    const char *mark = getenv("DISTLAB_REEXEC");
    if (mark) {
        check_restart(mark);
        return;
    }
    const char *user = getenv("OPENBLAS_CORETYPE"), *threads = getenv("OPENBLAS_NUM_THREADS");
    const char *want = NULL, *loaded = loaded_kernel(0);
    dl_cpu_features f;
    dl_cpu_features_detect(&f);
    if (user && *user)
        check_user_coretype(user, &f); /* the user's choice stands */
    else
        want = dl_blas_coretype_for(loaded, &f);
    if (!want && threads && strcmp(threads, "1") == 0)
        return;
    char km[80];
    snprintf(km, sizeof km, "kernel:%s", loaded);
    if (setenv("OPENBLAS_NUM_THREADS", "1", 1) != 0 ||
        setenv("DISTLAB_REEXEC", want ? km : "1", 1) != 0 ||
        (want && setenv("OPENBLAS_CORETYPE", want, 1) != 0))
        return;
    fflush(NULL);
    execv("/proc/self/exe", argv);
    /* no /proc (or exec refused): carry on; results stay correct, only slower */
    if (want) {
        unsetenv("OPENBLAS_CORETYPE");
        blas_warn("cannot restart with OPENBLAS_CORETYPE=%s: OpenBLAS keeps its %s kernel", want,
                  loaded);
    }
}

/* Optimal string alignment distance (Levenshtein with adjacent transpositions) of a and b,
 * capped: names longer than 63 bytes compare as far apart. */
static int edit_distance(const char *a, const char *b)
{
    enum { M = 64 };
    size_t la = strlen(a), lb = strlen(b);
    if (la >= M || lb >= M)
        return M;
    int d[M][M];
    for (size_t i = 0; i <= la; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            int c = a[i - 1] != b[j - 1], v = d[i - 1][j - 1] + c;
            if (d[i - 1][j] + 1 < v)
                v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v)
                v = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
        }
    return d[la][lb];
}

static const char *name_at(const void *names, size_t stride, size_t i)
{
    return *(const char *const *)((const char *)names + i * stride);
}

void cli_unknown_option(const char *prefix, const char *arg, const void *names, size_t stride,
                        size_t n, int abbrev, const char *help)
{
    char name[64];
    if (strncmp(arg, "--", 2) != 0) {
        cli_error("%sunknown option '%s' (see %s)", prefix, arg, help);
        return;
    }
    snprintf(name, sizeof name, "%.*s", (int)strcspn(arg + 2, "="), arg + 2);
    size_t len = strlen(name), nprefix = 0;
    const char *best = NULL, *first = NULL, *second = NULL, *exact = NULL;
    int bestd = 1 + (int)len / 4; /* a suggestion closer than a quarter of the word */
    for (size_t i = 0; n ? i < n : name_at(names, stride, i) != NULL; i++) {
        const char *s = name_at(names, stride, i);
        if (strcmp(s, name) == 0)
            exact = s;
        if (abbrev && len && strncmp(s, name, len) == 0 && nprefix++ < 2)
            *(nprefix == 1 ? &first : &second) = s;
        int d = edit_distance(name, s);
        if (d < bestd || (d == bestd && !best)) {
            best = s;
            bestd = d;
        }
    }
    /* a parser that takes a known name or a unique prefix complains about the value */
    if (exact || nprefix == 1)
        cli_error("%soption '--%s' %s (see %s)", prefix, exact ? exact : first,
                  strchr(arg, '=') ? "takes no value" : "needs a value", help);
    else if (nprefix > 1)
        cli_error("%sambiguous option '--%s' (--%s, --%s%s; see %s)", prefix, name, first, second,
                  nprefix > 2 ? ", ..." : "", help);
    else if (best)
        cli_error("%sunknown option '--%s' (did you mean '--%s'? see %s)", prefix, name, best,
                  help);
    else
        cli_error("%sunknown option '--%s' (see %s)", prefix, name, help);
}
