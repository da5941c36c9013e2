/* Under mpirun: a world of P processes x T threads; every collective against the serial
 * reference, communicators split across processes, and failure propagation.
 *
 *   test_mpi_coll coll T      every collective, f32/f64/bf16, sum/avg/max, every algorithm,
 *                             in place and out of place, mesh and split communicators;
 *                             all-to-all-v with uneven and zero counts and a count mismatch
 *   test_mpi_coll fail T      the last rank fails after a few collectives: every process's world
 *                             must return that rank's error (exit 0 when it does)
 *   test_mpi_coll hang T      the last rank stops calling collectives: the watchdog (1 s) of the
 *                             waiting processes must end every process's world
 *   test_mpi_coll abort T     like fail, then MPI_Abort as the apps do: the job ends non-zero
 * Prints one line per process; exit status 0 on success. */
#define _GNU_SOURCE
#include <math.h>
#include <stdarg.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "distlab.h"
#include "core/bf16.h"
#include "distlab/mpi.h"

#define MAXR 64

typedef struct res {
    long checks, bad, hier;
    char first[256];
} res;

static res R[MAXR];
static int small_tier;

static double val(int q, size_t i) { return (double)((q * 7 + (long)(i % 1000003) * 3) % 17) - 8; }

static void put(void *b, dl_dtype t, size_t i, double v)
{
    if (t == DL_F32)
        ((float *)b)[i] = (float)v;
    else if (t == DL_F64)
        ((double *)b)[i] = v;
    else
        ((uint16_t *)b)[i] = dl_f32_to_bf16((float)v);
}

static double get(const void *b, dl_dtype t, size_t i)
{
    if (t == DL_F32)
        return ((const float *)b)[i];
    if (t == DL_F64)
        return ((const double *)b)[i];
    return dl_bf16_to_f32(((const uint16_t *)b)[i]);
}

/* reduction over members (world ranks wr[0..n)) of val(., i) */
static double red(const int *wr, int n, size_t i, dl_dtype t, dl_redop op)
{
    double acc = val(wr[0], i);
    for (int k = 1; k < n; k++) acc = op == DL_MAX ? fmax(acc, val(wr[k], i)) : acc + val(wr[k], i);
    if (op == DL_AVG) {
        if (t == DL_F32)
            return (float)acc / (float)n;
        if (t == DL_BF16)
            return dl_bf16_to_f32(dl_f32_to_bf16((float)acc / (float)n));
        return acc / n;
    }
    return acc;
}

static void fail(int rank, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(int rank, const char *fmt, ...)
{
    res *r = &R[rank];
    r->bad++;
    if (r->bad == 1) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->first, sizeof r->first, fmt, ap);
        va_end(ap);
    }
}

static void expect(int rank, const char *what, const void *b, dl_dtype t, size_t i, double want)
{
    double got = get(b, t, i);
    double tol = t == DL_F64 ? 1e-12 : t == DL_F32 ? 1e-6 : 1e-2;
    R[rank].checks++;
    if (!(fabs(got - want) <= tol * fmax(1.0, fabs(want))))
        fail(rank, "%s: element %zu is %g, expected %g", what, i, got, want);
}

static void *xalloc(size_t bytes)
{
    void *p = NULL;
    if (posix_memalign(&p, 4096, bytes ? bytes : 64))
        abort();
    memset(p, 0xff, bytes ? bytes : 64);
    return p;
}

/* all-to-all-v: the elements world rank a sends world rank b: none for about a third of the
 * pairs, 1 + 0 to 2 `per` for the rest (none at all when per == 0) */
static size_t a2av_count(int a, int b, size_t per)
{
    return !per || (a + 2 * b) % 3 == 1 ? 0 : 1 + per * (size_t)((a * 3 + b * 7) % 5) / 2;
}
static double a2av_val(int a, int b, size_t i) { return a * 1e6 + b * 1e3 + (double)(i % 997); }

/* dl_alltoallv over c against the serial reference: receive blocks in reverse member order with
 * a one-element gap after each (the gaps must keep the 0xff sentinel), f64 (exact); then a
 * receive count one too large on member 0 must give DL_EMISMATCH on every member, and the
 * communicator must still work after it. */
static int test_alltoallv(dl_comm *c, const int *wr, int wrank, const char *name, size_t per)
{
    int n = dl_comm_size(c), r = dl_comm_rank(c), rc;
    size_t sc[MAXR], sd[MAXR], rcn[MAXR], rd[MAXR], stot = 0, rtot = 0;
    for (int j = 0; j < n; j++) {
        sc[j] = a2av_count(wr[r], wr[j], per), sd[j] = stot, stot += sc[j];
    }
    for (int k = n - 1; k >= 0; k--) {
        rcn[k] = a2av_count(wr[k], wr[r], per), rd[k] = rtot, rtot += rcn[k] + 1;
    }
    double *s = xalloc(stot * 8), *d = xalloc(rtot * 8);
    unsigned char sentinel[8];
    memset(sentinel, 0xff, 8);
    for (int j = 0; j < n; j++)
        for (size_t i = 0; i < sc[j]; i++) s[sd[j] + i] = a2av_val(wr[r], wr[j], i);
    char what[160];
    snprintf(what, sizeof what, "%s alltoallv f64 per=%zu", name, per);
    if ((rc = dl_alltoallv(c, s, sc, sd, d, rcn, rd, DL_F64, DL_PURPOSE_OTHER)))
        goto out;
    for (int k = 0; k < n; k++) {
        for (size_t i = 0; i < rcn[k]; i++)
            expect(wrank, what, d, DL_F64, rd[k] + i, a2av_val(wr[k], wr[r], i));
        R[wrank].checks++;
        if (memcmp(&d[rd[k] + rcn[k]], sentinel, 8))
            fail(wrank, "%s: the gap after member %d's block was written", what, k);
    }
    /* negative control: the pattern moves data between members (else the checks above could
     * pass on buffers nobody wrote) */
    size_t cross = 0;
    for (int a = 0; a < n; a++)
        for (int b = 0; b < n; b++) cross += a != b ? a2av_count(wr[a], wr[b], per) : 0;
    R[wrank].checks++;
    if (per && n > 1 && !cross)
        fail(wrank, "%s: the count pattern moves nothing between members", what);
    if (n > 1) {
        if (r == 0)
            rcn[n - 1]++;
        rc = dl_alltoallv(c, s, sc, sd, d, rcn, rd, DL_F64, DL_PURPOSE_OTHER);
        R[wrank].checks++;
        if (rc != DL_EMISMATCH || !strstr(dl_errmsg(), "expects"))
            fail(wrank, "%s mismatch: %s (%s), expected DL_EMISMATCH", what, dl_strstatus(rc),
                 dl_errmsg());
        rc = dl_barrier(c);
    }
out:
    free(s);
    free(d);
    return rc;
}

/* every collective on communicator c (members' world ranks from the communicator) */
static int test_comm(dl_comm *c, int wrank, const char *name)
{
    int n = dl_comm_size(c), r = dl_comm_rank(c), rc;
    int wr[MAXR];
    for (int k = 0; k < n; k++) wr[k] = dl_comm_world_rank(c, k);
    size_t big = small_tier ? 70001 : 300001;
    size_t counts[] = {0, 1, 5, 1001, big};
    int ncounts = 5;
    char what[160];
    for (int ci = 0; ci < ncounts; ci++) {
        size_t count = counts[ci];
        for (int t = 0; t < DL_NDTYPES; t++) {
            size_t es = dl_dtype_size((dl_dtype)t);
            void *s = xalloc(count * es), *d = xalloc(count * es);
            for (int op = 0; op < DL_NREDOPS; op++) {
                for (int a = 0; a < DL_NALGOS; a++) {
                    if (count == big && a != DL_ALGO_AUTO && a != DL_ALGO_RING)
                        continue;
                    for (int inplace = 0; inplace < 2; inplace++) {
                        dl_comm_set_algo(c, (dl_algo)a);
                        for (size_t i = 0; i < count; i++) put(s, (dl_dtype)t, i, val(wr[r], i));
                        void *out = inplace ? s : d;
                        if ((rc = dl_allreduce(c, s, out, count, (dl_dtype)t, (dl_redop)op,
                                               DL_PURPOSE_OTHER)))
                            return rc;
                        R[wrank].hier += dl_comm_last_algo(c) == DL_ALGO_HIER;
                        snprintf(what, sizeof what, "%s allreduce %s %s n=%zu algo %s%s", name,
                                 dl_dtype_name((dl_dtype)t), dl_redop_name((dl_redop)op), count,
                                 dl_algo_name(dl_comm_last_algo(c)), inplace ? " in place" : "");
                        for (size_t i = 0; i < count; i++)
                            expect(wrank, what, out, (dl_dtype)t, i,
                                   red(wr, n, i, (dl_dtype)t, (dl_redop)op));
                    }
                }
                dl_comm_set_algo(c, DL_ALGO_AUTO);
                /* reduce-scatter: this rank's block */
                size_t off, len;
                dl_block(count, n, r, &off, &len);
                for (size_t i = 0; i < count; i++) put(s, (dl_dtype)t, i, val(wr[r], i));
                if ((rc = dl_reduce_scatter(c, s, d, count, (dl_dtype)t, (dl_redop)op,
                                            DL_PURPOSE_OTHER)))
                    return rc;
                snprintf(what, sizeof what, "%s reduce_scatter %s %s n=%zu", name,
                         dl_dtype_name((dl_dtype)t), dl_redop_name((dl_redop)op), count);
                for (size_t i = 0; i < len; i++)
                    expect(wrank, what, d, (dl_dtype)t, i,
                           red(wr, n, off + i, (dl_dtype)t, (dl_redop)op));
                /* reduce to root 0 and n-1 */
                for (int root = 0; root<n; root += n> 1 ? n - 1 : 1) {
                    for (size_t i = 0; i < count; i++) put(s, (dl_dtype)t, i, val(wr[r], i));
                    if ((rc = dl_reduce(c, s, d, count, (dl_dtype)t, (dl_redop)op, root,
                                        DL_PURPOSE_OTHER)))
                        return rc;
                    snprintf(what, sizeof what, "%s reduce %s %s n=%zu root %d", name,
                             dl_dtype_name((dl_dtype)t), dl_redop_name((dl_redop)op), count, root);
                    if (r == root)
                        for (size_t i = 0; i < count; i++)
                            expect(wrank, what, d, (dl_dtype)t, i,
                                   red(wr, n, i, (dl_dtype)t, (dl_redop)op));
                }
            }
            /* all-gather: block k from member k */
            size_t off, len;
            dl_block(count, n, r, &off, &len);
            for (size_t i = 0; i < len; i++) put(s, (dl_dtype)t, i, val(wr[r], off + i));
            if ((rc = dl_allgather(c, s, d, count, (dl_dtype)t, DL_PURPOSE_OTHER)))
                return rc;
            snprintf(what, sizeof what, "%s allgather %s n=%zu", name, dl_dtype_name((dl_dtype)t),
                     count);
            for (int k = 0; k < n; k++) {
                dl_block(count, n, k, &off, &len);
                for (size_t i = 0; i < len; i++)
                    expect(wrank, what, d, (dl_dtype)t, off + i, val(wr[k], off + i));
            }
            /* broadcast from 0 and n-1 */
            for (int root = 0; root<n; root += n> 1 ? n - 1 : 1) {
                for (size_t i = 0; i < count; i++) put(s, (dl_dtype)t, i, val(wr[r], i));
                if ((rc = dl_broadcast(c, s, d, count, (dl_dtype)t, root, DL_PURPOSE_OTHER)))
                    return rc;
                snprintf(what, sizeof what, "%s broadcast %s n=%zu root %d", name,
                         dl_dtype_name((dl_dtype)t), count, root);
                for (size_t i = 0; i < count; i++)
                    expect(wrank, what, d, (dl_dtype)t, i, val(wr[root], i));
            }
            free(s);
            free(d);
        }
        /* all-to-all (count per peer), f64 */
        size_t per = count > 1001 ? 20000 : count;
        double *s = xalloc(per * n * 8), *d = xalloc(per * n * 8);
        for (int k = 0; k < n; k++)
            for (size_t i = 0; i < per; i++) s[k * per + i] = val(wr[r], i) * 100 + k;
        if ((rc = dl_alltoall(c, s, d, per, DL_F64, DL_PURPOSE_OTHER)))
            return rc;
        snprintf(what, sizeof what, "%s alltoall f64 per=%zu", name, per);
        for (int k = 0; k < n; k++)
            for (size_t i = 0; i < per; i++)
                expect(wrank, what, d, DL_F64, k * per + i, val(wr[k], i) * 100 + r);
        if ((rc = test_alltoallv(c, wr, wrank, name, per)))
            return rc;
        /* point-to-point around the ring: even ranks send first */
        if (n > 1) {
            int to = (r + 1) % n, from = (r + n - 1) % n;
            for (size_t i = 0; i < per; i++) s[i] = val(wr[r], i);
            if (r % 2 == 0) {
                if ((rc = dl_send(c, s, per, DL_F64, to, DL_PURPOSE_OTHER)) ||
                    (rc = dl_recv(c, d, per, DL_F64, from, DL_PURPOSE_OTHER)))
                    return rc;
            } else {
                if ((rc = dl_recv(c, d, per, DL_F64, from, DL_PURPOSE_OTHER)) ||
                    (rc = dl_send(c, s, per, DL_F64, to, DL_PURPOSE_OTHER)))
                    return rc;
            }
            snprintf(what, sizeof what, "%s send/recv f64 n=%zu", name, per);
            for (size_t i = 0; i < per; i++) expect(wrank, what, d, DL_F64, i, val(wr[from], i));
        }
        free(s);
        free(d);
        if ((rc = dl_barrier(c)))
            return rc;
    }
    return DL_OK;
}

static int coll_rank(dl_ctx *x, void *arg)
{
    (void)arg;
    int wrank = dl_ctx_rank(x), n = dl_ctx_size(x), rc;
    dl_comm *w = dl_ctx_comm(x);
    if ((rc = test_comm(w, wrank, "world")))
        return rc;
    /* a split that reverses the order and mixes processes */
    dl_comm *half;
    if ((rc = dl_comm_split(w, wrank % 2, -wrank, &half)) ||
        (rc = test_comm(half, wrank, "split")) || (rc = dl_comm_free(half)))
        return rc;
    /* meshes: every tp dividing n, dp the rest */
    for (int tp = 1; tp <= n; tp++) {
        if (n % tp)
            continue;
        dl_mesh m;
        if ((rc = dl_mesh_create(w, n / tp, 1, tp, 1, &m)))
            return rc;
        char name[32];
        snprintf(name, sizeof name, "tp%d", tp);
        if ((rc = test_comm(m.tp_comm, wrank, name)))
            return rc;
        snprintf(name, sizeof name, "dp%d", n / tp);
        if ((rc = test_comm(m.dp_comm, wrank, name)) || (rc = dl_mesh_destroy(&m)))
            return rc;
    }
    return DL_OK;
}

static int fail_rank(dl_ctx *x, void *arg)
{
    int mode = *(int *)arg;
    int r = dl_ctx_rank(x), n = dl_ctx_size(x), rc;
    dl_comm *w = dl_ctx_comm(x);
    double v[1000];
    for (int i = 0; i < 1000; i++) v[i] = r;
    for (int it = 0; it < 3; it++)
        if ((rc = dl_allreduce(w, v, v, 1000, DL_F64, DL_SUM, DL_PURPOSE_OTHER)))
            return rc;
    if (r == n - 1) {
        if (mode == 1)
            return dl_error(DL_EUSER, "deliberate failure on the last rank");
        while (!dl_ctx_aborted(x)) /* hang: stop calling collectives until the world aborts */
            usleep(1000);
        return dl_error(DL_EUSER, "stopped on purpose");
    }
    for (;;) /* the others go on until the world aborts */
        if ((rc = dl_allreduce(w, v, v, 1000, DL_F64, DL_SUM, DL_PURPOSE_OTHER)))
            return rc;
}

int main(int argc, char **argv)
{
    if (argc < 3) { /* make check runs every check program: this one is driven by test_mpi.sh */
        printf("test_mpi_coll: run under mpirun by tests/apps/test_mpi.sh (usage: test_mpi_coll "
               "coll|fail|hang|abort THREADS)\n");
        return 77;
    }
    const char *s = getenv("DISTLAB_TEST_SCALE");
    small_tier = s && !strcmp(s, "small");
    if (dl_mpi_init(&argc, &argv)) {
        fprintf(stderr, "test_mpi_coll: %s\n", dl_errmsg());
        return 1;
    }
    int T = atoi(argv[2]), P = dl_mpi_size(), me = dl_mpi_rank();
    if (T < 1 || P * T > MAXR) {
        fprintf(stderr, "test_mpi_coll: bad thread count\n");
        return 2;
    }
    dl_world_opts o;
    dl_world_opts_init(&o);
    o.nranks = P * T;
    int status = 0;
    double t0 = MPI_Wtime();
    if (!strcmp(argv[1], "coll")) {
        int rc = dl_world_run(&o, coll_rank, NULL);
        long checks = 0, bad = 0, hier = 0;
        const char *first = NULL;
        for (int r = me * T; r < me * T + T; r++) {
            hier += R[r].hier;
            checks += R[r].checks;
            bad += R[r].bad;
            if (R[r].bad && !first)
                first = R[r].first;
        }
        printf("process %d of %d (%d threads): %s; %ld hierarchical all-reduces; %ld checks, %ld "
               "wrong%s%s\n",
               me, P, T, rc ? dl_errmsg() : "ok", hier, checks, bad, first ? "; first: " : "",
               first ? first : "");
        status = rc || bad || checks == 0;
    } else {
        int mode = !strcmp(argv[1], "hang") ? 2 : 1;
        o.timeout_s = mode == 2 ? 1.0 : 30.0;
        o.quiet = 1;
        int rc = dl_world_run(&o, fail_rank, &mode);
        double dt = MPI_Wtime() - t0;
        printf("process %d of %d: world returned %s after %.2f s: %s\n", me, P, dl_strstatus(rc),
               dt, dl_errmsg());
        fflush(stdout);
        const char *want = mode == 1 ? "deliberate failure" : "watchdog";
        /* dt: an upper bound on failure detection (20x the 1 s watchdog; a deliberate failure
         * must end the world without waiting for its 30 s one) */
        status = !(rc && strstr(dl_errmsg(), want) && dt < 20);
        if (!strcmp(argv[1], "abort") && rc)
            MPI_Abort(MPI_COMM_WORLD, 3);
    }
    fflush(stdout);
    dl_mpi_finalize();
    return status;
}
