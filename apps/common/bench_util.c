/* Shared pieces of the distlab-bench subcommands (see bench_util.h). */
#define _GNU_SOURCE
#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "distlab.h"
#include "core/blas.h"
#include "core/topo.h"
#include "model/ops.h"
#include "cli.h"
#include "bench_util.h"
#include "core/json.h"
#include "core/stats.h"

/* --------------------------------------------------------------------------- STREAM ---- */

typedef struct stream_thr {
    pthread_t tid;
    const dl_topo *topo;
    int os_pu;
    size_t bytes;
    int trials, kernel;
    pthread_barrier_t *bar;
    double *t; /* [trials] seconds */
    int fail;
} stream_thr;

/* a = b + s*c over n doubles; a separate function so that the loop vectorises on its own. */
static void triad(double *restrict a, const double *restrict b, const double *restrict c, double s,
                  size_t n)
{
    for (size_t i = 0; i < n; i++) a[i] = b[i] + s * c[i];
}

static void *stream_main(void *arg)
{
    stream_thr *s = arg;
    int actual = -1;
    char *src = NULL, *dst = NULL, *c3 = NULL;
    size_t nd = s->bytes / sizeof(double);
    (void)dl_topo_bind_self(s->topo, s->os_pu, &actual); /* unpinned is still a measurement */
    /* Page-aligned: keeps (dst - src) mod 4096 == 0, away from glibc's slow-memcpy offsets. */
    if (posix_memalign((void **)&src, 4096, s->bytes) != 0)
        src = NULL;
    if (posix_memalign((void **)&dst, 4096, s->bytes) != 0)
        dst = NULL;
    if (s->kernel == BU_TRIAD && posix_memalign((void **)&c3, 4096, s->bytes) != 0)
        c3 = NULL;
    s->fail = !src || !dst || (s->kernel == BU_TRIAD && !c3);
    if (!s->fail && s->kernel == BU_COPY) {
        memset(src, 1, s->bytes); /* first touch by this thread: pages on its NUMA node */
        memset(dst, 0, s->bytes);
        memcpy(dst, src, s->bytes); /* warm-up */
    } else if (!s->fail) {
        for (size_t i = 0; i < nd; i++) {
            ((double *)src)[i] = 1.0;
            ((double *)c3)[i] = 2.0;
            ((double *)dst)[i] = 0.0;
        }
        triad((double *)dst, (const double *)src, (const double *)c3, 3.0, nd); /* warm-up */
    }
    for (int k = 0; k < s->trials; k++) {
        pthread_barrier_wait(s->bar); /* all threads copy at once: shared memory bandwidth */
        uint64_t t0 = dl_now_ns();
        if (!s->fail) {
            if (s->kernel == BU_COPY)
                memcpy(dst, src, s->bytes);
            else
                triad((double *)dst, (const double *)src, (const double *)c3, 3.0, nd);
        }
        uint64_t t1 = dl_now_ns();
        s->t[k] = (double)(t1 - t0) * 1e-9;
    }
    /* and the work is not optimised away */
    if (!s->fail && s->kernel == BU_COPY)
        s->fail = dst[s->bytes - 1] != 1;
    if (!s->fail && s->kernel == BU_TRIAD && nd)
        s->fail = ((double *)dst)[nd - 1] != 7.0;
    free(src);
    free(dst);
    free(c3);
    return NULL;
}

double bu_stream(const dl_topo *topo, dl_place_policy policy, dl_node_kind nodes, int rpn, int nthr,
                 size_t bytes, int kernel, int trials, int stat)
{
    dl_placement *pl = NULL;
    stream_thr *th = calloc((size_t)nthr, sizeof *th);
    double *t = calloc((size_t)nthr * (size_t)trials, sizeof *t), gbs = 0;
    double *per = calloc((size_t)trials, sizeof *per);
    pthread_barrier_t bar;
    int started = 0, ok = th && t && per;
    if (ok && dl_place(topo, nthr, policy, nodes, rpn, &pl) != DL_OK)
        pl = NULL;
    if (ok && pthread_barrier_init(&bar, NULL, (unsigned)nthr) != 0)
        ok = 0;
    for (int i = 0; ok && i < nthr; i++) {
        th[i] = (stream_thr){.topo = topo,
                             .os_pu = pl ? pl->os_pu[i] : i,
                             .bytes = bytes,
                             .trials = trials,
                             .kernel = kernel,
                             .bar = &bar,
                             .t = t + (size_t)i * (size_t)trials};
        if (pthread_create(&th[i].tid, NULL, stream_main, &th[i]) != 0) {
            /* the others would wait at the barrier forever: give up before starting any */
            ok = 0;
            break;
        }
        started++;
    }
    if (!ok && started > 0) {
        /* cannot happen after the first thread in practice; keep the barrier count honest */
        cli_error("STREAM: could not start %d threads", nthr);
        exit(CLI_EXIT_FAIL);
    }
    for (int i = 0; i < started; i++) {
        pthread_join(th[i].tid, NULL);
        if (th[i].fail)
            ok = 0;
    }
    if (ok) {
        for (int k = 0; k < trials; k++) {
            per[k] = 0;
            for (int i = 0; i < nthr; i++)
                if (t[(size_t)i * trials + k] > per[k])
                    per[k] = t[(size_t)i * trials + k];
        }
        double sec = per[0];
        if (stat == BU_MEDIAN)
            sec = dl__median(per, (size_t)trials);
        else
            for (int k = 1; k < trials; k++) sec = per[k] < sec ? per[k] : sec;
        double counted = kernel == BU_COPY ? 2.0 : 3.0;
        if (sec > 0)
            gbs = counted * (double)bytes * nthr / sec / 1e9;
    }
    if (th && t && per && started == nthr)
        pthread_barrier_destroy(&bar);
    if (pl)
        dl_placement_destroy(pl);
    free(th);
    free(t);
    free(per);
    return gbs;
}

/* ----------------------------------------------------------------------- arithmetic ---- */

static int pos(double x) { return isfinite(x) && x > 0; }

double bu_contention(double t_alone, double t_together)
{
    if (!pos(t_alone) || !pos(t_together))
        return NAN;
    return t_together / t_alone;
}

bu_overlap bu_overlap_calc(double tc, double tg, double tc_both, double tg_both, double t_both)
{
    bu_overlap o = {NAN, NAN, NAN};
    if (pos(tc) && pos(tc_both))
        o.comm_slowdown = tc_both / tc;
    if (pos(tg) && pos(tg_both))
        o.comp_slowdown = tg_both / tg;
    if (pos(tc) && isfinite(tg) && tg >= 0 && pos(t_both)) {
        double h = (tc + tg - t_both) / tc;
        o.hidden = h < 0 ? 0 : h > 1 ? 1 : h;
    }
    return o;
}

void bu_check(FILE *f, const char *who, int cond, const char *text, int line, int *ok)
{
    if (cond)
        return;
    fprintf(f, "%s: FAILED %s (line %d)\n", who, text, line);
    *ok = 0;
}

static int near(double a, double b) { return fabs(a - b) <= 1e-12 * (fabs(b) + 1); }

int bu_selftest(FILE *f)
{
    int ok = 1;
#define CHECK(cond) bu_check(f, "selftest", (cond) != 0, #cond, __LINE__, &ok)
    /* contention: the same work taking 10 ms alone, 25 ms with others: each rank at 1/2.5 */
    CHECK(near(bu_contention(0.010, 0.025), 2.5));
    CHECK(near(bu_contention(0.010, 0.010), 1.0));
    CHECK(isnan(bu_contention(0, 0.01)) && isnan(bu_contention(0.01, NAN)));
    /* perfect overlap: comm 4, comp 10, both done at 10 -> all comm hidden */
    bu_overlap o = bu_overlap_calc(4, 10, 4, 10, 10);
    CHECK(near(o.hidden, 1.0) && near(o.comm_slowdown, 1.0) && near(o.comp_slowdown, 1.0));
    /* serial: both at 14 = 4 + 10 -> nothing hidden */
    o = bu_overlap_calc(4, 10, 4, 10, 14);
    CHECK(near(o.hidden, 0.0));
    /* partial: 11 of 14 -> 3 of the 4 hidden; comm slowed to 6, comp to 11 */
    o = bu_overlap_calc(4, 10, 6, 11, 11);
    CHECK(near(o.hidden, 0.75) && near(o.comm_slowdown, 1.5) && near(o.comp_slowdown, 1.1));
    /* worse than serial clamps to 0, faster than the longer part clamps to 1 */
    CHECK(near(bu_overlap_calc(4, 10, 8, 12, 16).hidden, 0.0));
    CHECK(near(bu_overlap_calc(4, 10, 4, 9, 9).hidden, 1.0));
    CHECK(isnan(bu_overlap_calc(0, 10, 1, 1, 1).hidden));
    /* GEMM FLOPs of the model's linear layers: 3 GEMMs x 2MNK each */
    bu_model m = {1, 8, 2, 4, 2};
    dl_gemm_log lg;
    bu_model_gemms(&m, &lg);
    /* per layer 3 x 2 x BT x C x (3C + C + 4C + 4C) + head 3 x 2 x BT x C x 256 */
    double bt = 8, c = 8;
    CHECK(near(bu_gemm_log_flops(&lg), 6 * bt * c * 12 * c + 6 * bt * c * 256));
    double v[] = {5, 1, 3, 2};
    CHECK(near(dl__median_copy(v, 4), 2.5) && near(dl__median_copy(v, 3), 3));
#undef CHECK
    fprintf(f, "selftest: %s\n", ok ? "ok" : "FAILED");
    return ok;
}

void bu_spin_until(uint64_t start, uint64_t ns)
{
    uint64_t end = start + ns;
    while (dl_now_ns() < end) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    }
}

struct timespec bu_deadline(uint64_t start, uint64_t ns)
{
    uint64_t d = start + ns;
    return (struct timespec){(time_t)(d / 1000000000ull), (long)(d % 1000000000ull)};
}

void bu_sleep_until(uint64_t start, uint64_t ns)
{
    struct timespec ts = bu_deadline(start, ns);
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

/* -------------------------------------------------------------------- GEMM shapes ---- */

void bu_model_default(bu_model *m) { *m = (bu_model){4, 256, 4, 128, 8}; }

static void add_shape(dl_gemm_log *l, int ta, int tb, int M, int N, int K, long count)
{
    for (int i = 0; i < l->n; i++) {
        dl_gemm_shape *s = &l->s[i];
        if (s->ta == ta && s->tb == tb && s->M == M && s->N == N && s->K == K) {
            s->count += count;
            return;
        }
    }
    if (l->n < DL_GEMM_LOG_MAX)
        l->s[l->n++] = (dl_gemm_shape){.ta = ta, .tb = tb, .M = M, .N = N, .K = K, .count = count};
    else
        l->dropped += count;
}

/* One linear layer inp(BT, IC) -> out(BT, OC) with W(OC, IC) as dl_linear_* stores it:
 * forward out = inp W^T, backward dinp = dout W and dW = dout^T inp. */
static void add_linear(dl_gemm_log *l, int bt, int ic, int oc, long count)
{
    add_shape(l, 0, 1, bt, oc, ic, count);
    add_shape(l, 0, 0, bt, ic, oc, count);
    add_shape(l, 1, 0, oc, ic, bt, count);
}

void bu_model_gemms(const bu_model *m, dl_gemm_log *log)
{
    memset(log, 0, sizeof *log);
    int bt = m->seq * m->micro_batch, c = m->d_model;
    add_linear(log, bt, c, 3 * c, m->layers); /* qkv */
    add_linear(log, bt, c, c, m->layers);     /* attention output projection */
    add_linear(log, bt, c, 4 * c, m->layers); /* MLP fc */
    add_linear(log, bt, 4 * c, c, m->layers); /* MLP projection */
    add_linear(log, bt, c, 256, 1);           /* LM head over the byte vocabulary */
}

double bu_gemm_log_flops(const dl_gemm_log *log)
{
    double f = 0;
    for (int i = 0; i < log->n; i++)
        f += 2.0 * log->s[i].M * (double)log->s[i].N * log->s[i].K * (double)log->s[i].count;
    return f;
}

int bu_gemm_alloc(const dl_gemm_log *log, bu_gemm_bufs *g)
{
    size_t am = 1, bm = 1, cm = 1;
    for (int i = 0; i < log->n; i++) {
        const dl_gemm_shape *s = &log->s[i];
        size_t a = (size_t)s->M * s->K, b = (size_t)s->K * s->N, c = (size_t)s->M * s->N;
        if (a > am)
            am = a;
        if (b > bm)
            bm = b;
        if (c > cm)
            cm = c;
    }
    g->a = g->b = g->c = NULL;
    if (posix_memalign((void **)&g->a, 4096, am * sizeof(float)) ||
        posix_memalign((void **)&g->b, 4096, bm * sizeof(float)) ||
        posix_memalign((void **)&g->c, 4096, cm * sizeof(float))) {
        bu_gemm_free(g);
        return -1;
    }
    /* small values: no denormals or overflow whatever the count of passes */
    for (size_t i = 0; i < am; i++) g->a[i] = (float)((i % 7) + 1) * 0.01f;
    for (size_t i = 0; i < bm; i++) g->b[i] = (float)((i % 5) + 1) * 0.01f;
    memset(g->c, 0, cm * sizeof(float));
    return 0;
}

void bu_gemm_free(bu_gemm_bufs *g)
{
    free(g->a);
    free(g->b);
    free(g->c);
    g->a = g->b = g->c = NULL;
}

void bu_gemm_one(const dl_gemm_shape *s, bu_gemm_bufs *g)
{
    int lda = s->ta ? s->M : s->K, ldb = s->tb ? s->K : s->N;
    cblas_sgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans, s->tb ? CblasTrans : CblasNoTrans,
                s->M, s->N, s->K, 1.0f, g->a, lda, g->b, ldb, 0.0f, g->c, s->N);
}

void bu_gemm_run(const dl_gemm_log *log, bu_gemm_bufs *g)
{
    for (int i = 0; i < log->n; i++)
        for (long k = 0; k < log->s[i].count; k++) bu_gemm_one(&log->s[i], g);
}

/* ------------------------------------------------------------------ machine facts ---- */

static void cpu_model(char *buf, size_t len)
{
    snprintf(buf, len, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) == 0) {
            char *p = strchr(line, ':');
            if (p) {
                p++;
                while (*p == ' ') p++;
                p[strcspn(p, "\n")] = 0;
                snprintf(buf, len, "%s", p);
            }
            break;
        }
    }
    fclose(f);
}

/* The cpufreq governor where readable (KVM guests usually have none: "n/a"). */
static void governor(char *buf, size_t len)
{
    snprintf(buf, len, "n/a");
    FILE *f = fopen("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor", "r");
    if (!f)
        return;
    if (fgets(buf, (int)len, f))
        buf[strcspn(buf, "\n")] = 0;
    else
        snprintf(buf, len, "n/a");
    fclose(f);
}

static const char *blas_config(void)
{
    /* OpenBLAS's build string: version, target kernel, threading (why a GEMM runs as it does) */
    const char *s = openblas_get_config();
    return s ? s : "unknown";
}

static void utc_date(char *buf, size_t len)
{
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(buf, len, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

dl_topo *bu_topo_load(const char *sub)
{
    dl_topo *topo = NULL;
    if (dl_topo_load(&topo, "") == DL_OK)
        return topo;
    cli_error("%s: cannot load the topology: %s", sub, dl_errmsg());
    return NULL;
}

/* What the text and JSON machine records say. */
typedef struct machine {
    dl_topo_summary s;
    char model[256], gov[64], date[64];
} machine;

static void machine_get(const dl_topo *topo, machine *m)
{
    dl_topo_get_summary(topo, &m->s);
    cpu_model(m->model, sizeof m->model);
    governor(m->gov, sizeof m->gov);
    utc_date(m->date, sizeof m->date);
}

void bu_machine_text(FILE *f, const dl_topo *topo)
{
    machine m;
    machine_get(topo, &m);
    const dl_topo_summary s = m.s;
    const char *model = m.model, *gov = m.gov, *date = m.date;
    fprintf(f, "# distlab-bench %s, %s\n", dl_version(), date);
    fprintf(f, "# machine: %s; %d PUs, %d cores, %d L3, %d NUMA, %d package%s (%s)\n", model, s.pus,
            s.cores, s.l3s, s.numas, s.packages, s.packages == 1 ? "" : "s", s.desc);
    fprintf(f, "# caches: L2 %lld KiB, L3 %lld KiB; real PUs %d; nproc %ld; governor %s\n",
            s.l2_bytes >> 10, s.l3_bytes >> 10, dl_topo_real_pus(topo),
            sysconf(_SC_NPROCESSORS_ONLN), gov);
    fprintf(f, "# OpenBLAS: %s\n", blas_config());
    bu_blas_text(f);
}

void bu_blas_text(FILE *f)
{
    dl_cpu_features c;
    dl_cpu_features_detect(&c);
    const char *k = dl_blas_loaded_kernel();
    fprintf(f, "# blas_kernel: %s (%s kernel; CPU %s)\n", k,
            dl_isa_level_name(dl_blas_kernel_level(k)), dl_isa_level_name(dl_cpu_isa_level(&c)));
}

void bu_machine_json(FILE *f, const dl_topo *topo)
{
    machine m;
    machine_get(topo, &m);
    const dl_topo_summary s = m.s;
    const char *model = m.model, *gov = m.gov, *date = m.date;
    fprintf(f, ",\"machine\":{\"date\":\"%s\",\"cpu\":", date);
    dl__json_fputs(f, model, DL__JSON_CTRL_DROP);
    fprintf(f,
            ",\"pus\":%d,\"cores\":%d,\"l3s\":%d,\"numas\":%d,\"packages\":%d,"
            "\"l2_bytes\":%lld,\"l3_bytes\":%lld,\"real_pus\":%d,\"nproc\":%ld,\"topology\":",
            s.pus, s.cores, s.l3s, s.numas, s.packages, s.l2_bytes, s.l3_bytes,
            dl_topo_real_pus(topo), sysconf(_SC_NPROCESSORS_ONLN));
    dl__json_fputs(f, s.desc, DL__JSON_CTRL_DROP);
    fputs(",\"governor\":", f);
    dl__json_fputs(f, gov, DL__JSON_CTRL_DROP);
    fputs(",\"openblas\":", f);
    dl__json_fputs(f, blas_config(), DL__JSON_CTRL_DROP);
    fputs(",\"blas_kernel\":", f);
    dl__json_fputs(f, dl_blas_loaded_kernel(), DL__JSON_CTRL_DROP);
    fputc('}', f);
}

void bu_json_begin(FILE *f, const char *sub, const char *type)
{
    fprintf(f,
            "{\"type\":\"%s\",\"schema\":\"distlab/1\",\"app\":\"distlab-bench\","
            "\"subcommand\":\"%s\",\"version\":",
            type, sub);
    dl__json_fputs(f, dl_version(), DL__JSON_CTRL_DROP);
}

void bu_json_end(FILE *f)
{
    fputs("}\n", f);
    fflush(f);
}

void bu_json_num(FILE *f, const char *key, double v)
{
    if (isfinite(v))
        fprintf(f, ",\"%s\":%.17g", key, v);
    else
        fprintf(f, ",\"%s\":null", key);
}

void bu_json_int(FILE *f, const char *key, long long v) { fprintf(f, ",\"%s\":%lld", key, v); }

void bu_json_str(FILE *f, const char *key, const char *v)
{
    fprintf(f, ",\"%s\":", key);
    dl__json_fputs(f, v, DL__JSON_CTRL_DROP);
}

void bu_json_bool(FILE *f, const char *key, int v)
{
    fprintf(f, ",\"%s\":%s", key, v ? "true" : "false");
}

int bu_warn_oversub(int n, int real_pus)
{
    if (n <= real_pus)
        return 0;
    cli_error("WARNING: %d ranks on %d PUs: ranks share cores (oversubscribed); timings include "
              "contention",
              n, real_pus);
    return 1;
}

/* ---------------------------------------------------------------------- gnuplot ---- */

static const char *plot_ext(const char *file)
{
    const char *dot = strrchr(file, '.');
    if (!dot || strchr(dot, '/'))
        return NULL;
    if (strcmp(dot, ".svg") == 0 || strcmp(dot, ".png") == 0)
        return dot;
    return NULL;
}

int bu_plot_check(const char *file)
{
    if (!file || !*file || !plot_ext(file) || strlen(file) > 3000) {
        cli_error("--plot: FILE must end in .svg or .png (got '%s')", file ? file : "");
        return -1;
    }
    /* the image, and the data and script written beside it */
    size_t stem = (size_t)(plot_ext(file) - file);
    char side[4096];
    if (cli_check_output("--plot", file))
        return -1;
    snprintf(side, sizeof side, "%.*s.dat", (int)stem, file);
    if (cli_check_output("--plot", side))
        return -1;
    snprintf(side, sizeof side, "%.*s.gp", (int)stem, file);
    return cli_check_output("--plot", side);
}

int bu_plot(const char *file, const char *data, const char *script)
{
    return bu_plot_to(file, data, script, stderr);
}

int bu_plot_to(const char *file, const char *data, const char *script, FILE *say)
{
    const char *who = say == stderr ? cli_progname : "", *colon = say == stderr ? ": " : "";
    const char *ext = plot_ext(file);
    size_t stem = (size_t)(ext - file);
    char dat[4096], gp[4096];
    snprintf(dat, sizeof dat, "%.*s.dat", (int)stem, file);
    snprintf(gp, sizeof gp, "%.*s.gp", (int)stem, file);
    FILE *f = fopen(dat, "w");
    if (!f || fputs(data, f) < 0 || fclose(f) != 0) {
        cli_error("--plot: cannot write %s", dat);
        return -1;
    }
    f = fopen(gp, "w");
    if (!f) {
        cli_error("--plot: cannot write %s", gp);
        return -1;
    }
    /* the script names the data file as written, so that it runs from the same directory as
     * the command did; pngcairo is gnuplot-nox's PNG terminal */
    fprintf(f, "# written by %s; render with: gnuplot %s\n", cli_progname, gp);
    if (strcmp(ext, ".svg") == 0)
        fprintf(f, "set terminal svg size 900,540 dynamic\n");
    else
        fprintf(f, "set terminal pngcairo size 900,540\n");
    fprintf(f, "set output '%s'\ndatafile = '%s'\nset grid\nset key outside right\n%s", file, dat,
            script);
    if (fclose(f) != 0) {
        cli_error("--plot: cannot write %s", gp);
        return -1;
    }
    if (access("/usr/bin/gnuplot", X_OK) != 0) {
        fprintf(say,
                "%s%sgnuplot not found: wrote %s and %s; render with `gnuplot %s` (apt-get "
                "install gnuplot-nox)\n",
                who, colon, dat, gp, gp);
        return 0;
    }
    char cmd[8400];
    snprintf(cmd, sizeof cmd, "/usr/bin/gnuplot '%s'", gp);
    if (strchr(gp, '\'') || system(cmd) != 0) {
        cli_error("--plot: gnuplot failed on %s", gp);
        return -1;
    }
    fprintf(say, "%s%swrote %s (data %s, script %s)\n", who, colon, file, dat, gp);
    return 0;
}

int bu_common_opt(const char *sub, int opt, char **argv, const struct option *lo, bu_common *o,
                  void (*usage)(FILE *))
{
    switch (opt) {
    case 'h': usage(stdout); exit(CLI_EXIT_OK);
    case BU_O_QUICK: o->quick = 1; return 0;
    case BU_O_CSV: o->csv = 1; return 0;
    case BU_O_JSON: o->json = 1; return 0;
    case BU_O_PLOT:
        if (bu_plot_check(optarg))
            return -1;
        o->plot = optarg;
        return 0;
    default: {
        char prefix[64], help[64];
        snprintf(prefix, sizeof prefix, "%s: ", sub);
        snprintf(help, sizeof help, "distlab-bench %s --help", sub);
        cli_unknown_option(prefix, argv[optind - 1], lo, sizeof lo[0], 0, 1, help);
        return -1;
    }
    }
}

int bu_common_done(const char *sub, int argc, char **argv, const bu_common *o)
{
    if (optind < argc) {
        cli_error("%s: unexpected argument '%s'", sub, argv[optind]);
        return -1;
    }
    if (o->csv && o->json) {
        cli_error("%s: --csv and --json are exclusive", sub);
        return -1;
    }
    return 0;
}

int bu_next_opt(const char *sub, int argc, char **argv, const struct option *lo, bu_common *o,
                void (*usage)(FILE *))
{
    for (;;) {
        int opt = getopt_long(argc, argv, "h", lo, NULL);
        if (opt == -1)
            return bu_common_done(sub, argc, argv, o) ? -1 : 0;
        int common =
            opt == 'h' || opt == '?' || opt == ':' || (opt >= BU_O_QUICK && opt <= BU_O_PLOT);
        if (!common)
            return opt;
        if (bu_common_opt(sub, opt, argv, lo, o, usage))
            return -1;
    }
}
