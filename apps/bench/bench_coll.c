/* distlab-bench coll: the collective benchmark, following the nccl-tests contract.
 *
 * One dl_world_run: every rank thread loops over the rows (op, size) and, per row, over the
 * out-of-place and in-place variants: warm-up calls, then timed iterations (barrier, t0, op, t1
 * on each rank), then one checked call on deterministic inputs. Ranks write their per-iteration
 * times and wrong-element counts into shared arrays; after a barrier at the end of each row,
 * rank 0 reduces them (per iteration the max over ranks, then the median over iterations) and
 * prints the row, so the table streams like nccl-tests'. JSON is written by the main thread
 * after the run. */
#define _GNU_SOURCE
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "distlab.h"
#include "core/bf16.h"
#include "core/topo.h"
#include "transport/chan.h"
#include "cli.h"
#include "bench_coll.h"
#include "bench_limits.h"
#include "bench_util.h"
#include "mpi_app.h"
#include "core/json.h"
#include "config.h"
#include "core/stats.h"
#ifdef DL_HAVE_MPI
#include <mpi.h>
#endif

enum {
    OP_ALLREDUCE,
    OP_REDUCESCATTER,
    OP_ALLGATHER,
    OP_BROADCAST,
    OP_REDUCE,
    OP_ALLTOALL,
    OP_SENDRECV,
    OP_ALLTOALLV,
    NOPS
};
static const char *const op_name[NOPS] = {"allreduce", "reducescatter", "allgather", "broadcast",
                                          "reduce",    "alltoall",      "sendrecv",  "alltoallv"};

enum { MODE_OOP = 0, MODE_IP = 1, NMODES = 2 };
/* alltoallv's count patterns (--counts) */
enum { CNT_UNIFORM, CNT_UNEVEN, CNT_SKEW, NCNTS };
static const char *const cnt_name[NCNTS] = {"uniform", "uneven", "skew"};
static const char *const mode_key[NMODES] = {"out_of_place", "in_place"};

#define MAX_RANKS 1024
#define MAX_ROWS 100000
#define MAX_TIMING_DOUBLES ((size_t)1 << 27) /* 1 GiB of timings at most */
#define PURPOSE DL_PURPOSE_OTHER

typedef struct coll_cfg {
    int ops[NOPS], nops;
    int nranks;
    uint64_t minbytes, maxbytes, stepbytes; /* stepbytes 0: geometric steps by stepfactor */
    int stepfactor;
    int warmup, iters;
    dl_dtype dtype;
    dl_redop redop;
    dl_algo algo;
    int root;
    int check;
    int mode_on[NMODES];
    const char *inplace_arg;
    dl_world_opts w;
    int csv, json;
    int limits, stream_mib, dram; /* --limits, --stream-mib (0: from the L3), --dram */
    int nprocs, threads, vs_mpi;  /* under mpirun: processes, rank threads each, --vs-mpi */
    int counts;                   /* alltoallv's count pattern (CNT_*) */
} coll_cfg;

typedef struct row {
    int op;
    uint64_t bytes; /* the size column (nccl-tests conventions) */
    size_t count;   /* count passed to the library */
    int root;       /* -1 for ops without a root */
} row;

typedef struct cell {
    int valid;
    double time_us, algbw, busbw;
    double lim_pct, hops; /* of the row's limit (bench_limits.h); NAN where it does not apply */
    uint64_t wrong;
    int algo; /* dl_algo that ran; -1 for point-to-point */
} cell;

typedef struct bench {
    const coll_cfg *c;
    row *rows;
    int nrows;
    size_t buf_bytes; /* per buffer per rank */
    size_t elt;
    double *times;    /* [nrows][NMODES][iters][nranks] ns */
    uint64_t *wrong;  /* [nrows][NMODES][nranks] */
    int *algo;        /* [nrows][NMODES], written by rank 0 */
    cell *cells;      /* [nrows][NMODES], written by rank 0 */
    double *scratch;  /* [iters], rank 0 */
    int *cpu, *node;  /* [nranks] */
    char (*cpus)[24]; /* [nranks] the cpus each rank may run on (dl_ctx_cpus) */
    int nnodes, oversub;
    dl_topo_summary topo;
    int real_pus;
    bl_limits lim; /* the machine's limits, measured before the run (STREAM also after) */
    /* Deterministic inputs: rank q's element with global index g is val(q, g) = (7q + g) mod m,
     * a small non-negative integer, so that every partial sum is an integer no larger than
     * n(m-1), exact in the type (bf16: <= 256), whatever the order of the additions. The result
     * of a reduction then depends only on g mod m: red[g mod m]. */
    int m;
    float *vf;
    double *vd;
    uint16_t *vb;
    double *red;
    double avg_tol; /* relative tolerance for avg (one division's rounding, with margin) */
    /* worlds spanning MPI processes: bytes per call a rank sent inside its process and to other
     * processes (mean over ranks), and plain MPI's median time (us; NAN: not timed), per cell */
    double *intra_b, *inter_b, *mpi_us;
    uint64_t *mpi_wrong;    /* plain MPI's alltoallv checked as distlab's (one thread a process) */
    int lo;                 /* first rank of this process */
    pthread_mutex_t mpi_mu; /* --vs-mpi: the process's other threads sleep while MPI is timed */
    pthread_cond_t mpi_cv;
    long mpi_gen;
} bench;

/* ---------------------------------------------------------------- deterministic data ---- */

static inline double get_elem(const void *buf, dl_dtype t, size_t i)
{
    switch (t) {
    case DL_F32: return ((const float *)buf)[i];
    case DL_F64: return ((const double *)buf)[i];
    default: return dl__bf16_widen(((const uint16_t *)buf)[i]);
    }
}

static inline int first_k(const bench *b, int q, size_t g0)
{
    return (int)(((uint64_t)q * 7 % (uint64_t)b->m + g0 % (uint64_t)b->m) % (uint64_t)b->m);
}

/* buf[j] = val(q, g0 + j) */
static void fill_seq(const bench *b, void *buf, size_t len, int q, size_t g0)
{
    int k = first_k(b, q, g0), m = b->m;
    switch (b->c->dtype) {
    case DL_F32:
        for (size_t j = 0; j < len; j++) {
            ((float *)buf)[j] = b->vf[k];
            if (++k == m)
                k = 0;
        }
        break;
    case DL_F64:
        for (size_t j = 0; j < len; j++) {
            ((double *)buf)[j] = b->vd[k];
            if (++k == m)
                k = 0;
        }
        break;
    default:
        for (size_t j = 0; j < len; j++) {
            ((uint16_t *)buf)[j] = b->vb[k];
            if (++k == m)
                k = 0;
        }
        break;
    }
}

/* -1 everywhere: never a correct value (inputs and results are >= 0). */
static void fill_sentinel(const bench *b, void *buf, size_t len)
{
    switch (b->c->dtype) {
    case DL_F32:
        for (size_t j = 0; j < len; j++) ((float *)buf)[j] = -1.0f;
        break;
    case DL_F64:
        for (size_t j = 0; j < len; j++) ((double *)buf)[j] = -1.0;
        break;
    default: {
        uint16_t s = dl_f32_to_bf16(-1.0f);
        for (size_t j = 0; j < len; j++) ((uint16_t *)buf)[j] = s;
    }
    }
}

/* Elements of buf that differ from val(q, g0 + j): data moved, never combined: exact. */
static uint64_t wrong_seq(const bench *b, const void *buf, size_t len, int q, size_t g0)
{
    uint64_t bad = 0;
    int k = first_k(b, q, g0), m = b->m;
    for (size_t j = 0; j < len; j++) {
        bad += get_elem(buf, b->c->dtype, j) != b->vd[k];
        if (++k == m)
            k = 0;
    }
    return bad;
}

/* Elements of buf that differ from the reduction over all ranks at global index g0 + j.
 * sum and max are exact; avg divides an exact integer sum once, so allow that rounding. */
static uint64_t wrong_red(const bench *b, const void *buf, size_t len, size_t g0)
{
    uint64_t bad = 0;
    int k = (int)(g0 % (uint64_t)b->m), m = b->m;
    int avg = b->c->redop == DL_AVG;
    for (size_t j = 0; j < len; j++) {
        double got = get_elem(buf, b->c->dtype, j), want = b->red[k];
        if (avg)
            bad += !(fabs(got - want) <= b->avg_tol * fabs(want)); /* NaN counts as wrong */
        else
            bad += got != want;
        if (++k == m)
            k = 0;
    }
    return bad;
}

static int pattern_init(bench *b, int n)
{
    const coll_cfg *c = b->c;
    /* Largest integer every partial sum must stay within to be exact in the type. */
    double exact = c->dtype == DL_BF16  ? 256.0
                   : c->dtype == DL_F32 ? 16777216.0
                                        : 9007199254740992.0;
    double mm = floor(exact / n);
    b->m = (int)(mm < 64 ? mm : 64) + 1; /* values 0 .. m-1 */
    b->vf = malloc(sizeof(float) * b->m);
    b->vd = malloc(sizeof(double) * b->m);
    b->vb = malloc(sizeof(uint16_t) * b->m);
    b->red = malloc(sizeof(double) * b->m);
    if (!b->vf || !b->vd || !b->vb || !b->red)
        return -1;
    for (int k = 0; k < b->m; k++) {
        b->vf[k] = (float)k;
        b->vd[k] = (double)k;
        b->vb[k] = dl_f32_to_bf16((float)k);
        double sum = 0, mx = 0;
        for (int q = 0; q < n; q++) {
            double v = (double)first_k(b, q, (size_t)k);
            sum += v;
            if (v > mx)
                mx = v;
        }
        b->red[k] = c->redop == DL_MAX ? mx : c->redop == DL_AVG ? sum / n : sum;
    }
    /* avg: one rounding of the quotient (maybe two: via f32, or sum * (1/n)); 4 ulps' margin */
    b->avg_tol = c->dtype == DL_BF16 ? 0x1p-6 : c->dtype == DL_F32 ? 0x1p-21 : 0x1p-50;
    return 0;
}

/* alltoallv's count patterns (--counts); q = the row's count (size / n / elt), and every rank
 * sends n q elements whatever the pattern.
 *   uniform  q to every rank (MoE with perfectly balanced routing).
 *   uneven   rank r sends u[(p - r) mod n] elements to rank p, with u[k] = q + d_k and
 *            u[n-1-k] = q - d_k for k < n/2 (the middle one q when n is odd),
 *            d_k = splitmix64(42 + k) mod (q + 1): blocks of 0 .. 2q, every rank also receives
 *            n q, of which n q - u[0] cross ranks.
 *   skew     every rank sends rank p w_p = floor(2q (n-1-p) / (n-1)) elements (rank 0 also the
 *            remainder, so that the w_p sum to n q): a hot expert on rank 0 receiving about 2 n q,
 *            linearly fewer down to rank n-1, which receives nothing (the dispatch of a badly
 *            balanced MoE router). One rank: q to itself. */
static size_t a2av_u(size_t q, int n, int k)
{
    int lo = k < n - 1 - k ? k : n - 1 - k;
    if (lo == n - 1 - lo)
        return q;
    uint64_t x = 42 + (uint64_t)lo + 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    size_t d = (size_t)((x ^ (x >> 31)) % ((uint64_t)q + 1));
    return k == lo ? q + d : q - d;
}

static size_t a2av_skew(size_t q, int n, int p)
{
    if (n == 1)
        return q;
    size_t w = 2 * q * (size_t)(n - 1 - p) / (size_t)(n - 1), sum = 0;
    if (p > 0)
        return w;
    for (int j = 0; j < n; j++) sum += 2 * q * (size_t)(n - 1 - j) / (size_t)(n - 1);
    return w + (size_t)n * q - sum; /* the floors' remainder */
}

/* Elements rank `from` sends to rank `to` under pattern pat. */
static size_t a2av_count(int pat, size_t q, int n, int from, int to)
{
    switch (pat) {
    case CNT_UNEVEN: return a2av_u(q, n, (to - from + n) % n);
    case CNT_SKEW: return a2av_skew(q, n, to);
    default: return q;
    }
}

/* Rank r's arguments, in v[4n]: sendcounts, sdispls, recvcounts, rdispls (blocks packed in
 * peer order on both sides). */
static void a2av_args(int pat, size_t q, int r, int n, size_t *v)
{
    size_t so = 0, ro = 0;
    for (int p = 0; p < n; p++) {
        v[p] = a2av_count(pat, q, n, r, p), v[n + p] = so, so += v[p];
        v[2 * n + p] = a2av_count(pat, q, n, p, r), v[3 * n + p] = ro, ro += v[2 * n + p];
    }
}

/* Where rank p's block for rank r starts in p's send buffer. */
static size_t a2av_sdispl(int pat, size_t q, int p, int r, int n)
{
    size_t off = 0;
    for (int j = 0; j < r; j++) off += a2av_count(pat, q, n, p, j);
    return off;
}

/* The part of the n ranks' n q elements each that crosses ranks: busbw's factor (uniform and
 * skew (n-1)/n, uneven (nq - u[0])/(nq)). */
static double a2av_factor(int pat, size_t q, int n)
{
    double stay = 0, nq = (double)q * n;
    for (int r = 0; r < n; r++) stay += (double)a2av_count(pat, q, n, r, r);
    return nq > 0 ? (n * nq - stay) / (n * nq) : 0;
}

/* The most elements any rank receives (the receive buffer's size). */
static size_t a2av_recv_max(int pat, size_t q, int n)
{
    size_t mx = 0;
    for (int r = 0; r < n; r++) {
        size_t in = 0;
        for (int p = 0; p < n; p++) in += a2av_count(pat, q, n, p, r);
        mx = in > mx ? in : mx;
    }
    return mx;
}

/* ------------------------------------------------------------------- per-op conventions -- */

static double bus_factor(int op, int n)
{
    switch (op) {
    case OP_ALLREDUCE: return 2.0 * (n - 1) / n;
    case OP_REDUCESCATTER:
    case OP_ALLGATHER:
    case OP_ALLTOALL: return (double)(n - 1) / n;
    default: return 1.0; /* broadcast, reduce, sendrecv */
    }
}

/* The factor of a row: alltoallv's is the part of its size that crosses ranks. */
static double row_bus_factor(const coll_cfg *c, const row *rw, int n)
{
    if (rw->op != OP_ALLTOALLV || !rw->count)
        return bus_factor(rw->op, n);
    return a2av_factor(c->counts, rw->count, n);
}

/* DRAM-bound limit on busbw, as a fraction of B, the STREAM copy bandwidth of n threads at a
 * DRAM-resident size (read + write counted). Moving T bytes through memory takes at least T/B,
 * and each op must at least read every input it combines or moves once and write every output
 * once. S is the row's size:
 *   allreduce      read n inputs of S, write n outputs of S: T = 2nS, algbw = S/t <= B/(2n),
 *                  busbw = 2(n-1)/n algbw <= B(n-1)/n^2 (in place too).
 *   reducescatter  read the n full inputs (nS), write n blocks of S/n (S): T = (n+1)S,
 *                  busbw = (n-1)/n algbw <= B(n-1)/(n(n+1)).
 *   allgather      read the n blocks once (S), write n full outputs (nS): T = (n+1)S, same
 *                  bound; in place each rank's own block is already there: T = nS,
 *                  busbw <= B(n-1)/n^2.
 *   broadcast      read the root's S, write n outputs: T = (n+1)S, busbw = algbw <= B/(n+1);
 *                  in place the root writes nothing: T = nS, busbw <= B/n.
 *   reduce         read n inputs (nS), write the root's S: T = (n+1)S, busbw <= B/(n+1).
 *   alltoall       read nS, write nS: T = 2nS, busbw = (n-1)/n algbw <= B(n-1)/(2n^2); in place
 *                  the own blocks stay: T = 2(n-1)S, busbw <= B/(2n).
 *   sendrecv       every rank reads its S and writes S received: T = 2nS, busbw <= B/(2n).
 * Returns 0 where busbw is identically 0 (n = 1 for the ops whose factor is (n-1)/n). It bounds
 * DRAM traffic only: rows whose buffers fit the L3 are held to the single-copy bound instead. */
static double limit_frac(int op, int mode, int n)
{
    double dn = n;
    switch (op) {
    case OP_ALLREDUCE: return (dn - 1) / (dn * dn);
    case OP_REDUCESCATTER: return (dn - 1) / (dn * (dn + 1));
    case OP_ALLGATHER: return mode == MODE_IP ? (dn - 1) / (dn * dn) : (dn - 1) / (dn * (dn + 1));
    case OP_BROADCAST: return mode == MODE_IP ? 1.0 / dn : 1.0 / (dn + 1);
    case OP_REDUCE: return 1.0 / (dn + 1);
    case OP_ALLTOALL: return mode == MODE_IP ? 1.0 / (2 * dn) : (dn - 1) / (2 * dn * dn);
    default: return 1.0 / (2 * dn);
    }
}

static int op_has_redop(int op)
{
    return op == OP_ALLREDUCE || op == OP_REDUCESCATTER || op == OP_REDUCE;
}
static int op_has_root(int op) { return op == OP_BROADCAST || op == OP_REDUCE; }

/* sendrecv cannot run in place with blocking send/recv: a rank that receives first would
 * overwrite the data it has yet to send. */
static int mode_runs(const bench *b, int op, int mode)
{
    return b->c->mode_on[mode] && !(op == OP_SENDRECV && mode == MODE_IP);
}

/* ---------------------------------------------------------------------- the rank side ---- */

typedef struct bufs {
    const void *s; /* what the op reads */
    void *d;       /* what the op writes */
    size_t out_len;
    size_t *v; /* alltoallv: this rank's counts and displacements (a2av_args) */
} bufs;

static bufs layout(const bench *b, const row *rw, int mode, int r, int n, void *sendbuf,
                   void *recvbuf)
{
    bufs x;
    size_t off, len, elt = b->elt;
    dl_block(rw->count, n, r, &off, &len);
    x.s = sendbuf;
    x.d = recvbuf;
    x.out_len = rw->count;
    switch (rw->op) {
    case OP_REDUCESCATTER:
        x.out_len = len;
        if (mode == MODE_IP) {
            x.s = recvbuf;
            x.d = (char *)recvbuf + off * elt;
        }
        break;
    case OP_ALLGATHER:
        if (mode == MODE_IP)
            x.s = (char *)recvbuf + off * elt;
        break;
    case OP_ALLTOALL:
    case OP_ALLTOALLV:
        x.out_len = rw->count * (size_t)n;
        if (mode == MODE_IP)
            x.s = recvbuf;
        break;
    default:
        if (mode == MODE_IP)
            x.s = recvbuf;
        break;
    }
    return x;
}

static void fill_input(const bench *b, const row *rw, const bufs *x, int r, int n)
{
    size_t off, len;
    void *s = (void *)x->s; /* our own buffer: writing it is fine */
    switch (rw->op) {
    case OP_ALLGATHER:
        dl_block(rw->count, n, r, &off, &len);
        fill_seq(b, s, len, r, off);
        break;
    case OP_BROADCAST:
        if (r == rw->root)
            fill_seq(b, s, rw->count, r, 0);
        break;
    case OP_ALLTOALL:  /* block p of rank r holds val(r, p*count + j) */
    case OP_ALLTOALLV: /* element g of rank r's send blocks holds val(r, g) */
        fill_seq(b, s, rw->count * (size_t)n, r, 0);
        break;
    default: /* allreduce, reducescatter (the full buffer), reduce, sendrecv */
        fill_seq(b, s, rw->count, r, 0);
        break;
    }
}

static uint64_t count_wrong(const bench *b, const row *rw, const bufs *x, int r, int n)
{
    size_t off, len, elt = b->elt;
    uint64_t bad = 0;
    switch (rw->op) {
    case OP_ALLREDUCE: return wrong_red(b, x->d, rw->count, 0);
    case OP_REDUCESCATTER:
        dl_block(rw->count, n, r, &off, &len);
        return wrong_red(b, x->d, len, off);
    case OP_ALLGATHER:
        for (int q = 0; q < n; q++) {
            dl_block(rw->count, n, q, &off, &len);
            bad += wrong_seq(b, (const char *)x->d + off * elt, len, q, off);
        }
        return bad;
    case OP_BROADCAST: return wrong_seq(b, x->d, rw->count, rw->root, 0);
    case OP_REDUCE: return r == rw->root ? wrong_red(b, x->d, rw->count, 0) : 0;
    case OP_ALLTOALL: /* block p came from rank p, which sent its block r */
        for (int p = 0; p < n; p++)
            bad += wrong_seq(b, (const char *)x->d + (size_t)p * rw->count * elt, rw->count, p,
                             (size_t)r * rw->count);
        return bad;
    case OP_ALLTOALLV: /* the block from rank p: p's send elements from its block for r on */
        for (int p = 0; p < n; p++)
            bad += wrong_seq(b, (const char *)x->d + x->v[3 * n + p] * elt, x->v[2 * n + p], p,
                             a2av_sdispl(b->c->counts, rw->count, p, r, n));
        return bad;
    default: return wrong_seq(b, x->d, rw->count, (r + n - 1) % n, 0);
    }
}

/* Ring shift with blocking point-to-point: even ranks send first, odd ranks receive first, so
 * that no cycle of ranks all waits in send (with n odd the last, even, rank sends to rank 0,
 * which is itself sending to rank 1, which receives first: the chain unwinds). */
static int sendrecv(dl_comm *comm, const void *s, void *d, size_t count, dl_dtype t, int r, int n)
{
    int next = (r + 1) % n, prev = (r + n - 1) % n, rc;
    if (r % 2 == 0) {
        if ((rc = dl_send(comm, s, count, t, next, PURPOSE)) != DL_OK)
            return rc;
        return dl_recv(comm, d, count, t, prev, PURPOSE);
    }
    if ((rc = dl_recv(comm, d, count, t, prev, PURPOSE)) != DL_OK)
        return rc;
    return dl_send(comm, s, count, t, next, PURPOSE);
}

static int run_op(const bench *b, dl_comm *comm, const row *rw, const bufs *x, int r, int n)
{
    const coll_cfg *c = b->c;
    switch (rw->op) {
    case OP_ALLREDUCE:
        return dl_allreduce(comm, x->s, x->d, rw->count, c->dtype, c->redop, PURPOSE);
    case OP_REDUCESCATTER:
        return dl_reduce_scatter(comm, x->s, x->d, rw->count, c->dtype, c->redop, PURPOSE);
    case OP_ALLGATHER: return dl_allgather(comm, x->s, x->d, rw->count, c->dtype, PURPOSE);
    case OP_BROADCAST:
        return dl_broadcast(comm, x->s, x->d, rw->count, c->dtype, rw->root, PURPOSE);
    case OP_REDUCE:
        return dl_reduce(comm, x->s, x->d, rw->count, c->dtype, c->redop, rw->root, PURPOSE);
    case OP_ALLTOALL: return dl_alltoall(comm, x->s, x->d, rw->count, c->dtype, PURPOSE);
    case OP_ALLTOALLV:
        return dl_alltoallv(comm, x->s, x->v, x->v + n, x->d, x->v + 2 * n, x->v + 3 * n, c->dtype,
                            PURPOSE);
    default: return n > 1 ? sendrecv(comm, x->s, x->d, rw->count, c->dtype, r, n) : DL_OK;
    }
}

static void print_row(bench *b, int i);
static void print_preamble(bench *b);
static int batch_reps(size_t bytes);

/* A world spanning MPI processes: every iteration's time becomes the max over all ranks (in this
 * rank's slot; reduce_row takes the max over the slots), and the bytes each rank sent per call
 * inside its process and to other processes are averaged over the ranks. */
static int mpi_gather_times(bench *b, dl_comm *comm, size_t ci, int r, const dl_comm_stats *st0,
                            int reps)
{
    const coll_cfg *c = b->c;
    int n = c->nranks, rc;
    double *t = calloc((size_t)c->iters + 2, sizeof *t);
    if (!t)
        return dl_error(DL_ENOMEM, "out of memory");
    for (int it = 0; it < c->iters; it++) t[it] = b->times[(ci * c->iters + it) * n + r];
    if ((rc = dl_allreduce(comm, t, t, (size_t)c->iters, DL_F64, DL_MAX, PURPOSE)) == DL_OK) {
        for (int it = 0; it < c->iters; it++) b->times[(ci * c->iters + it) * n + r] = t[it];
        dl_comm_stats st1;
        dl_comm_get_stats(comm, &st1);
        uint64_t sent = 0;
        for (int p = 0; p < DL_NPURPOSES; p++) sent += st1.bytes_sent[p] - st0->bytes_sent[p];
        double inter = (double)(st1.bytes_sent_inter - st0->bytes_sent_inter);
        double calls = (double)c->iters * reps;
        t[0] = ((double)sent - inter) / calls;
        t[1] = inter / calls;
        rc = dl_allreduce(comm, t, t, 2, DL_F64, DL_SUM, PURPOSE);
        if (rc == DL_OK && r == 0) {
            b->intra_b[ci] = t[0] / n;
            b->inter_b[ci] = t[1] / n;
        }
    }
    free(t);
    return rc;
}

/* Plain MPI on the same buffers: one MPI rank per process. Returns DL_OK; b->mpi_us[ci] stays NAN
 * where MPI has no such operation (bf16, sendrecv). alltoallv: MPI_Alltoallv with the pattern's
 * counts and packed displacements over the P processes (q = size / P / elt), so with one rank
 * thread per process exactly the arguments distlab's ranks pass. */
static int mpi_time(bench *b, const row *rw, const bufs *x, size_t ci)
{
#ifdef DL_HAVE_MPI
    const coll_cfg *c = b->c;
    if (c->dtype == DL_BF16 || rw->op == OP_SENDRECV)
        return DL_OK;
    MPI_Datatype dt = c->dtype == DL_F32 ? MPI_FLOAT : MPI_DOUBLE;
    MPI_Op op = c->redop == DL_MAX ? MPI_MAX : MPI_SUM;
    int P, me;
    MPI_Comm_size(MPI_COMM_WORLD, &P);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    int a2a = rw->op == OP_ALLTOALL || rw->op == OP_ALLTOALLV;
    size_t count = a2a ? rw->bytes / b->elt / (size_t)P : rw->count;
    int *cnt = calloc(4 * (size_t)P, sizeof *cnt), *dsp = cnt + P; /* alltoallv: + recv side */
    size_t *v = calloc(4 * (size_t)P, sizeof *v);
    double *ts = calloc((size_t)c->iters + 1, sizeof *ts);
    if (!cnt || !v || !ts) {
        free(cnt), free(v), free(ts);
        return dl_error(DL_ENOMEM, "out of memory");
    }
    if (rw->op == OP_ALLTOALLV)
        a2av_args(c->counts, count, me, P, v);
    for (int p = 0; p < P; p++) {
        size_t off, len;
        dl_block(count, P, p, &off, &len);
        cnt[p] = (int)len, dsp[p] = (int)off;
        if (rw->op == OP_ALLTOALLV)
            for (int k = 0; k < 4; k++) cnt[k * P + p] = (int)v[k * P + p];
    }
    const void *s = x->s;
    void *d = x->d;
    int e = MPI_SUCCESS, reps = batch_reps(rw->bytes), root = rw->root < 0 ? 0 : rw->root % P;
    for (int k = 0; k < c->warmup + c->iters && e == MPI_SUCCESS; k++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int q = 0; q < reps && e == MPI_SUCCESS; q++) {
            switch (rw->op) {
            case OP_ALLREDUCE: e = MPI_Allreduce(s, d, (int)count, dt, op, MPI_COMM_WORLD); break;
            case OP_REDUCESCATTER: e = MPI_Reduce_scatter(s, d, cnt, dt, op, MPI_COMM_WORLD); break;
            case OP_ALLGATHER:
                e = MPI_Allgatherv(s, cnt[me], dt, d, cnt, dsp, dt, MPI_COMM_WORLD);
                break;
            case OP_BROADCAST: e = MPI_Bcast(d, (int)count, dt, root, MPI_COMM_WORLD); break;
            case OP_REDUCE: e = MPI_Reduce(s, d, (int)count, dt, op, root, MPI_COMM_WORLD); break;
            case OP_ALLTOALLV:
                e = MPI_Alltoallv(s, cnt, dsp, dt, d, cnt + 2 * P, cnt + 3 * P, dt, MPI_COMM_WORLD);
                break;
            default: e = MPI_Alltoall(s, (int)count, dt, d, (int)count, dt, MPI_COMM_WORLD); break;
            }
        }
        double dt_us = (MPI_Wtime() - t0) * 1e6 / reps;
        MPI_Allreduce(MPI_IN_PLACE, &dt_us, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (k >= c->warmup)
            ts[k - c->warmup] = dt_us;
    }
    if (me == 0)
        b->mpi_us[ci] = dl__median(ts, (size_t)c->iters);
    if (e == MPI_SUCCESS && rw->op == OP_ALLTOALLV && c->check && P == c->nranks) {
        /* the same arguments as distlab's ranks: check MPI's result as theirs */
        fill_sentinel(b, d, x->out_len);
        fill_input(b, rw, x, me, P);
        e = MPI_Alltoallv(s, cnt, dsp, dt, d, cnt + 2 * P, cnt + 3 * P, dt, MPI_COMM_WORLD);
        uint64_t bad = e == MPI_SUCCESS ? count_wrong(b, rw, x, me, P) : 0, sum = 0;
        MPI_Reduce(&bad, &sum, 1, MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
        b->mpi_wrong[ci] = sum;
    }
    free(cnt), free(v), free(ts);
    return e == MPI_SUCCESS ? DL_OK : dl_error(DL_ESYS, "--vs-mpi: an MPI collective failed");
#else
    (void)b, (void)rw, (void)x, (void)ci;
    return DL_OK;
#endif
}

/* Calls per timed sample: min(100, 64 KiB / size), at least 1. */
static int batch_reps(size_t bytes)
{
    size_t reps = bytes ? 65536 / bytes : 100;
    return reps < 1 ? 1 : reps > 100 ? 100 : (int)reps;
}

static int rank_fn(dl_ctx *ctx, void *arg)
{
    bench *b = arg;
    const coll_cfg *c = b->c;
    int r = dl_ctx_rank(ctx), n = dl_ctx_size(ctx), rc;
    dl_comm *comm = dl_ctx_comm(ctx);
    dl_arena *arena = dl_ctx_arena(ctx);
    void *sendbuf = NULL, *recvbuf = NULL;
    long ci_gen = 0; /* --vs-mpi rounds this rank has seen */
    size_t *a2v = calloc(4 * (size_t)n, sizeof *a2v);
    if (!a2v)
        return dl_error(DL_ENOMEM, "out of memory");

    b->cpu[r] = dl_ctx_cpu(ctx);
    snprintf(b->cpus[r], sizeof b->cpus[r], "%s", dl_ctx_cpus(ctx));
    b->node[r] = dl_ctx_node(ctx);
    if (r == 0) {
        b->nnodes = dl_ctx_nnodes(ctx);
        b->oversub = dl_world_oversubscribed(dl_ctx_world(ctx));
    }
    dl_comm_set_algo(comm, c->algo);
    /* Page-aligned arena buffers (glibc's memcpy is ~25x slower at 1-63 B mod 4096 offsets). */
    if ((rc = dl_arena_alloc(arena, DL_MEM_COMM, b->buf_bytes, &sendbuf)) != DL_OK)
        return rc;
    if ((rc = dl_arena_alloc(arena, DL_MEM_COMM, b->buf_bytes, &recvbuf)) != DL_OK)
        goto out;
    if ((rc = dl_barrier(comm)) != DL_OK)
        goto out;        /* placement written by every rank */
    if (c->nprocs > 1) { /* the other processes' ranks: every rank's (cpu, node) */
        int32_t mine[2] = {b->cpu[r], b->node[r]}, *all = calloc((size_t)n * 2, sizeof *all);
        if (!all) {
            rc = dl_error(DL_ENOMEM, "out of memory");
            goto out;
        }
        rc = dl_allgather(comm, mine, all, 2 * (size_t)n, DL_F32, PURPOSE);
        int lo, nlocal;
        dl_world_local(dl_ctx_world(ctx), &lo, &nlocal);
        for (int q = 0; rc == DL_OK && q < n; q++)
            if (q < lo || q >= lo + nlocal) { /* another process's: its pinned cpu, or none */
                b->cpu[q] = all[2 * q], b->node[q] = all[2 * q + 1];
                if (b->cpu[q] >= 0)
                    snprintf(b->cpus[q], sizeof b->cpus[q], "%d", b->cpu[q]);
                else
                    snprintf(b->cpus[q], sizeof b->cpus[q], "not one");
            }
        free(all);
        if (rc != DL_OK)
            goto out;
    }
    if (r == 0)
        print_preamble(b);

    for (int i = 0; i < b->nrows; i++) {
        const row *rw = &b->rows[i];
        for (int mode = 0; mode < NMODES; mode++) {
            if (!mode_runs(b, rw->op, mode))
                continue;
            bufs x = layout(b, rw, mode, r, n, sendbuf, recvbuf);
            size_t ci = (size_t)i * NMODES + mode;
            if (rw->op == OP_ALLTOALLV) { /* the receive blocks are packed: their total */
                a2av_args(c->counts, rw->count, r, n, x.v = a2v);
                x.out_len = a2v[4 * (size_t)n - 1] + a2v[3 * (size_t)n - 1];
            }
            fill_input(b, rw, &x, r, n); /* sane values for the timed calls too */
            for (int w = 0; w < c->warmup; w++)
                if ((rc = run_op(b, comm, rw, &x, r, n)) != DL_OK)
                    goto out;
            /* Small calls are timed in back-to-back batches, as nccl-tests does, so that the
             * barrier's exit skew and the clock do not dominate a sub-microsecond call. */
            int reps = batch_reps(rw->bytes);
            dl_comm_stats st0;
            dl_comm_get_stats(comm, &st0);
            for (int it = 0; it < c->iters; it++) {
                if ((rc = dl_barrier(comm)) != DL_OK)
                    goto out;
                uint64_t t0 = dl_now_ns();
                for (int k = 0; k < reps && rc == DL_OK; k++) rc = run_op(b, comm, rw, &x, r, n);
                uint64_t t1 = dl_now_ns();
                if (rc != DL_OK)
                    goto out;
                b->times[(ci * c->iters + it) * n + r] = (double)(t1 - t0) / reps;
            }
            if (r == 0)
                b->algo[ci] = rw->op == OP_SENDRECV ? -1 : (int)dl_comm_last_algo(comm);
            if (c->nprocs > 1 && (rc = mpi_gather_times(b, comm, ci, r, &st0, reps)) != DL_OK)
                goto out;
            if (c->check) {
                /* output first: in place, the input fill then overwrites the shared part */
                fill_sentinel(b, x.d, x.out_len);
                fill_input(b, rw, &x, r, n);
                dl_comm_stats s0, s1;
                dl_comm_get_stats(comm, &s0);
                if ((rc = run_op(b, comm, rw, &x, r, n)) != DL_OK)
                    goto out;
                dl_comm_get_stats(comm, &s1);
                b->wrong[ci * n + r] = count_wrong(b, rw, &x, r, n);
                /* alltoallv's byte counters: the crossing payload plus the count rows (16 n
                 * bytes to each peer), all under PURPOSE here; a wrong total counts as one */
                uint64_t want = (uint64_t)(n - 1) * 16u * (uint64_t)n +
                                ((uint64_t)n * rw->count - a2v[r]) * b->elt;
                if (rw->op == OP_ALLTOALLV &&
                    s1.bytes_sent[PURPOSE] - s0.bytes_sent[PURPOSE] != want)
                    b->wrong[ci * n + r]++;
                if (c->nprocs > 1) { /* the sum over every process, kept in rank 0's slot */
                    double w = (double)b->wrong[ci * n + r];
                    if ((rc = dl_allreduce(comm, &w, &w, 1, DL_F64, DL_SUM, PURPOSE)) != DL_OK)
                        goto out;
                    b->wrong[ci * n + r] = r == 0 ? (uint64_t)w : 0;
                }
            }
            if (c->vs_mpi && mode == MODE_OOP) {
                /* plain MPI on the same buffers, one MPI rank per process (its first thread);
                 * the process's other threads wait at the barrier */
                if ((rc = dl_barrier(comm)) != DL_OK)
                    goto out;
                if (r == b->lo) {
                    rc = mpi_time(b, rw, &x, ci);
                    pthread_mutex_lock(&b->mpi_mu);
                    b->mpi_gen++;
                    pthread_cond_broadcast(&b->mpi_cv);
                    pthread_mutex_unlock(&b->mpi_mu);
                    if (rc != DL_OK)
                        goto out;
                } else { /* asleep, not polling, while MPI runs */
                    pthread_mutex_lock(&b->mpi_mu);
                    while (b->mpi_gen == ci_gen && !dl_ctx_aborted(ctx))
                        pthread_cond_wait(&b->mpi_cv, &b->mpi_mu);
                    pthread_mutex_unlock(&b->mpi_mu);
                }
                ci_gen++;
                if ((rc = dl_barrier(comm)) != DL_OK)
                    goto out;
            }
        }
        /* Every rank's timings of this row are written: rank 0 reduces and prints them. */
        if ((rc = dl_barrier(comm)) != DL_OK)
            goto out;
        if (r == 0)
            print_row(b, i);
    }
    rc = dl_barrier(comm);
out:
    dl_arena_free(arena, recvbuf);
    dl_arena_free(arena, sendbuf);
    free(a2v);
    return rc;
}

/* ------------------------------------------------------------------------- reporting ---- */

/* The limit that applies to a row (bench_limits.h): the one-way hop in ns for latency rows, the
 * single-copy bound at its size for rows that fit the L3, STREAM x the op's DRAM fraction
 * beyond; GB/s; 0 when not measured. */
static double row_limit(const bench *b, const row *rw, int mode)
{
    const bl_limits *L = &b->lim;
    int n = b->c->nranks, a2a = rw->op == OP_ALLTOALL || rw->op == OP_ALLTOALLV;
    /* all-to-all out of place: each rank also writes its own block, which busbw does not count,
     * so both bounds carry the crossing factor (in place the own blocks stay) */
    double cross = a2a && mode == MODE_OOP ? row_bus_factor(b->c, rw, n) : 1.0;
    switch (bl_kind_of(L, rw->bytes, n)) {
    case BL_HOP: return isfinite(L->hop_ns) ? L->hop_ns : 0;
    case BL_COPY: return bl_copy_limit(L, rw->bytes, n) * cross;
    case BL_DRAM:
        if (a2a) /* T = 2nS over the crossing part: B x factor / (2n) */
            return L->stream_gbs * cross / (2.0 * n);
        return L->stream_gbs * limit_frac(rw->op, mode, n);
    default: return 0;
    }
}

static void reduce_row(bench *b, int i)
{
    const coll_cfg *c = b->c;
    const row *rw = &b->rows[i];
    int n = c->nranks;
    for (int mode = 0; mode < NMODES; mode++) {
        size_t ci = (size_t)i * NMODES + mode;
        cell *ce = &b->cells[ci];
        memset(ce, 0, sizeof *ce);
        ce->lim_pct = ce->hops = NAN;
        if (!mode_runs(b, rw->op, mode))
            continue;
        for (int it = 0; it < c->iters; it++) {
            const double *t = &b->times[(ci * c->iters + it) * n];
            double mx = 0;
            for (int r = 0; r < n; r++)
                if (t[r] > mx)
                    mx = t[r];
            b->scratch[it] = mx; /* the iteration took as long as its slowest rank */
        }
        double ns = dl__median(b->scratch, (size_t)c->iters);
        ce->valid = 1;
        ce->time_us = ns / 1e3;
        ce->algbw = ns > 0 ? (double)rw->bytes / ns : 0; /* bytes per ns == GB/s (1e9) */
        ce->busbw = ce->algbw * row_bus_factor(c, rw, n);
        double lim = row_limit(b, rw, mode);
        if (bl_kind_of(&b->lim, rw->bytes, n) == BL_HOP)
            ce->hops = lim > 0 ? ns / lim : NAN;
        else if (lim > 0 && row_bus_factor(c, rw, n) > 0)
            ce->lim_pct = 100.0 * ce->busbw / lim;
        for (int r = 0; r < n; r++) ce->wrong += b->wrong[ci * n + r];
        ce->algo = b->algo[ci];
    }
}

static const char *algo_str(int a) { return a < 0 ? "p2p" : dl_algo_name((dl_algo)a); }

/* The algorithm column: one name, or "out/in" when the two variants ran different ones. */
static void row_algo(const bench *b, int i, char *buf, size_t len)
{
    const cell *o = &b->cells[(size_t)i * NMODES], *p = o + 1;
    if (o->valid && p->valid && o->algo != p->algo)
        snprintf(buf, len, "%s/%s", algo_str(o->algo), algo_str(p->algo));
    else
        snprintf(buf, len, "%s", algo_str(o->valid ? o->algo : p->algo));
}

/* nccl-tests' time format: fewer decimals as times grow, fixed width. */
static void fmt_time(char *buf, size_t len, double us)
{
    if (us >= 10000.0)
        snprintf(buf, len, "%9.0f", us);
    else if (us >= 100.0)
        snprintf(buf, len, "%9.1f", us);
    else
        snprintf(buf, len, "%9.2f", us);
}

static void print_section(bench *b, int op)
{
    const coll_cfg *c = b->c;
    FILE *f = stdout;
    fprintf(f, "#\n# %s: busbw = algbw x %s", op_name[op],
            op == OP_ALLREDUCE                                                    ? "2(n-1)/n"
            : (op == OP_REDUCESCATTER || op == OP_ALLGATHER || op == OP_ALLTOALL) ? "(n-1)/n"
            : op == OP_ALLTOALLV ? "the part of the ranks' nq that crosses ranks"
                                 : "1");
    fputc('\n', f);
    if (op == OP_ALLTOALLV && c->counts == CNT_UNEVEN)
        fprintf(f, "# alltoallv --counts uneven: rank r sends u[(p-r) mod n] elements to rank p; "
                   "u[k] = q + d_k, u[n-1-k] = q - d_k, d_k = splitmix64(42+k) mod (q+1), "
                   "q = count\n");
    else if (op == OP_ALLTOALLV)
        fprintf(f, "# alltoallv --counts %s: %s\n", cnt_name[c->counts],
                c->counts == CNT_SKEW ? "every rank sends rank p floor(2q(n-1-p)/(n-1)) elements "
                                        "(rank 0 the remainder too; rank n-1 receives nothing), "
                                        "q = count"
                                      : "q = count elements to every rank");
    if (op == OP_SENDRECV && c->mode_on[MODE_IP])
        fprintf(f,
                "# sendrecv: ring shift r -> r+1 with blocking send/recv; no in-place variant\n");
    fprintf(f, "#%12s %13s %6s %6s %5s %-8s", "", "", "", "", "", "");
    for (int mode = 0; mode < NMODES; mode++) {
        /* centre the label over its 42 columns */
        const char *label = mode == MODE_OOP ? "out-of-place" : "in-place";
        int pad = (42 - (int)strlen(label)) / 2;
        if (c->mode_on[mode])
            fprintf(f, " %*s%s%*s", pad, "", label, 42 - pad - (int)strlen(label), "");
    }
    if (c->nprocs > 1) /* MPI: out-of-place bytes per rank and call over intra/inter links / time */
        fprintf(f, " %-17s%s", " per-rank link bw",
                c->vs_mpi ? "  plain MPI (1 rank per process)" : "");
    fprintf(f, "\n#%12s %13s %6s %6s %5s %-8s", "size", "count", "type", "redop", "root", "algo");
    for (int mode = 0; mode < NMODES; mode++)
        if (c->mode_on[mode])
            fprintf(f, " %9s %8s %8s %6s %7s", "time", "algbw", "busbw", "vs lim", "#wrong");
    if (b->lim.measured)
        fprintf(f, " %5s %9s", "limit", "");
    if (c->nprocs > 1)
        fprintf(f, " %8s %8s", "intra", "inter");
    if (c->vs_mpi)
        fprintf(f, " %9s %8s %6s", "mpi time", "busbw", "ratio");
    fprintf(f, "\n#%12s %13s %6s %6s %5s %-8s", "(B)", "(elements)", "", "", "", "");
    for (int mode = 0; mode < NMODES; mode++)
        if (c->mode_on[mode])
            fprintf(f, " %9s %8s %8s %6s %7s", "(us)", "(GB/s)", "(GB/s)", "", "");
    if (b->lim.measured)
        fprintf(f, " %5s %9s", "", "(ns|GB/s)");
    if (c->nprocs > 1)
        fprintf(f, " %8s %8s", "(GB/s)", "(GB/s)");
    if (c->vs_mpi)
        fprintf(f, " %9s %8s %6s", "(us)", "(GB/s)", "dl/mpi");
    fputc('\n', f);
}

static void csv_num(FILE *f, double v, int decimals)
{
    fputc(',', f);
    if (isfinite(v))
        fprintf(f, "%.*f", decimals, v);
}

/* The MPI columns of row i: per-rank intra/inter-node link bandwidth of the out-of-place cell (the
 * in-place one if only that ran), and with --vs-mpi plain MPI's time, busbw and distlab / MPI
 * (NAN where not measured). */
static void mpi_cols(const bench *b, int i, double *intra, double *inter, double *mpi_us,
                     double *mpi_bus, double *ratio)
{
    const coll_cfg *c = b->c;
    *intra = *inter = *mpi_us = *mpi_bus = *ratio = NAN;
    if (c->nprocs > 1) {
        size_t ci = (size_t)i * NMODES + (b->cells[(size_t)i * NMODES].valid ? 0 : 1);
        double ns = b->cells[ci].time_us * 1e3;
        *intra = ns > 0 ? b->intra_b[ci] / ns : 0.0;
        *inter = ns > 0 ? b->inter_b[ci] / ns : 0.0;
    }
    if (c->vs_mpi) {
        const cell *ce = &b->cells[(size_t)i * NMODES];
        double us = b->mpi_us[(size_t)i * NMODES];
        if (isfinite(us) && us > 0 && ce->valid) {
            *mpi_us = us;
            const row *rw = &b->rows[i];
            double f =
                rw->op == OP_ALLTOALLV
                    ? a2av_factor(c->counts, rw->bytes / b->elt / (size_t)c->nprocs, c->nprocs)
                    : bus_factor(rw->op, c->nprocs);
            *mpi_bus = (double)rw->bytes / (us * 1e3) * f;
            *ratio = *mpi_bus > 0 ? ce->busbw / *mpi_bus : NAN;
        }
    }
}

static void print_row(bench *b, int i)
{
    const coll_cfg *c = b->c;
    const row *rw = &b->rows[i];
    char algo[64];
    reduce_row(b, i);
    if (c->json)
        return;
    row_algo(b, i, algo, sizeof algo);
    const char *redop = op_has_redop(rw->op) ? dl_redop_name(c->redop) : "none";
    size_t count = rw->bytes / b->elt;
    FILE *f = stdout;
    if (c->csv) {
        fprintf(f, "%s,%d,%" PRIu64 ",%zu,%s,%s,%d,%s", op_name[rw->op], c->nranks, rw->bytes,
                count, dl_dtype_name(c->dtype), redop, rw->root, algo);
        for (int mode = 0; mode < NMODES; mode++) {
            const cell *ce = &b->cells[(size_t)i * NMODES + mode];
            if (!ce->valid) {
                fputs(",,,,,", f);
                continue;
            }
            csv_num(f, ce->time_us, 3);
            csv_num(f, ce->algbw, 4);
            csv_num(f, ce->busbw, 4);
            csv_num(f, ce->lim_pct, 1);
            if (c->check)
                fprintf(f, ",%" PRIu64, ce->wrong);
            else
                fputc(',', f);
        }
        if (b->lim.measured) {
            const cell *o = &b->cells[(size_t)i * NMODES], *p = o + 1;
            fprintf(f, ",%s", bl_kind_name(bl_kind_of(&b->lim, rw->bytes, c->nranks)));
            csv_num(f, row_limit(b, rw, o->valid ? MODE_OOP : MODE_IP), 4);
            csv_num(f, o->hops, 2);
            csv_num(f, p->hops, 2);
        }
        double ia, ie, mu, mb, ra;
        mpi_cols(b, i, &ia, &ie, &mu, &mb, &ra);
        if (c->nprocs > 1) {
            csv_num(f, ia, 4);
            csv_num(f, ie, 4);
        }
        if (c->vs_mpi) {
            csv_num(f, mu, 3);
            csv_num(f, mb, 4);
            csv_num(f, ra, 4);
        }
        fputc('\n', f);
        fflush(f);
        return;
    }
    if (i == 0 || b->rows[i - 1].op != rw->op)
        print_section(b, rw->op);
    fprintf(f, " %12" PRIu64 " %13zu %6s %6s %5d %-8s", rw->bytes, count, dl_dtype_name(c->dtype),
            redop, rw->root, algo);
    for (int mode = 0; mode < NMODES; mode++) {
        if (!c->mode_on[mode])
            continue;
        const cell *ce = &b->cells[(size_t)i * NMODES + mode];
        if (!ce->valid) {
            fprintf(f, " %9s %8s %8s %6s %7s", "-", "-", "-", "-", "-");
            continue;
        }
        char t[32], lim[16], wr[24];
        fmt_time(t, sizeof t, ce->time_us);
        if (isfinite(ce->lim_pct))
            snprintf(lim, sizeof lim, "%5.0f%%", ce->lim_pct);
        else if (isfinite(ce->hops))
            snprintf(lim, sizeof lim, "%5.1fh", ce->hops);
        else
            snprintf(lim, sizeof lim, "-");
        if (c->check)
            snprintf(wr, sizeof wr, "%" PRIu64, ce->wrong);
        else
            snprintf(wr, sizeof wr, "N/A");
        fprintf(f, " %s %8.2f %8.2f %6s %7s", t, ce->algbw, ce->busbw, lim, wr);
    }
    if (b->lim.measured) {
        double v = row_limit(b, rw, b->cells[(size_t)i * NMODES].valid ? MODE_OOP : MODE_IP);
        fprintf(f, " %5s %9.*f", bl_kind_name(bl_kind_of(&b->lim, rw->bytes, c->nranks)),
                v >= 100 ? 1 : 2, v);
    }
    double ia, ie, mu, mb, ra;
    mpi_cols(b, i, &ia, &ie, &mu, &mb, &ra);
    if (c->nprocs > 1)
        fprintf(f, " %8.2f %8.2f", ia, ie);
    if (c->vs_mpi) {
        if (isfinite(mu)) {
            char t[32];
            fmt_time(t, sizeof t, mu);
            fprintf(f, " %s %8.2f %6.2f", t, mb, isfinite(ra) ? ra : 0.0);
        } else {
            fprintf(f, " %9s %8s %6s", "-", "-", "-");
        }
    }
    fputc('\n', f);
    fflush(f);
}

static void print_preamble(bench *b)
{
    const coll_cfg *c = b->c;
    int n = c->nranks;
    if (c->json || c->csv) {
        /* machine-readable output stays clean: the warning goes to stderr */
        if (b->oversub)
            cli_error("WARNING: %d ranks on %d PUs: ranks share cores, timings include contention",
                      n, b->real_pus);
    }
    if (c->json)
        return;
    if (c->csv) {
        printf("op,ranks,size,count,type,redop,root,algo");
        for (int mode = 0; mode < NMODES; mode++) {
            const char *p = mode == MODE_OOP ? "oop" : "ip";
            printf(",%s_time_us,%s_algbw_gbs,%s_busbw_gbs,%s_lim_pct,%s_wrong", p, p, p, p, p);
        }
        if (b->lim.measured)
            printf(",limit,limit_value,oop_hops,ip_hops");
        if (c->nprocs > 1)
            printf(",intra_gbs,inter_gbs");
        if (c->vs_mpi)
            printf(",mpi_time_us,mpi_busbw_gbs,dl_over_mpi");
        printf("\n");
        fflush(stdout);
        return;
    }
    printf("# nodes: %d (%s)\n", b->nnodes, dl_node_kind_name(c->w.nodes));
    for (int r = 0; r < n; r++)
        printf("#  Rank %3d  cpu %3s  node %2d\n", r, b->cpus[r], b->node[r]);
    if (b->oversub)
        printf("# WARNING: %d ranks on %d PUs: ranks share cores (oversubscribed); timings include "
               "contention\n",
               n, b->real_pus);
    fflush(stdout);
}

/* ------------------------------------------------------------------------ options ---- */

static void usage(FILE *f)
{
    /* clang-format off */
    fprintf(f,
"Usage: distlab-bench coll [OPTIONS]\n"
"\n"
"Collective benchmark in the style of nccl-tests: rank threads pinned to cores act as GPUs and\n"
"exchange data only through ring channels. One row per size; out-of-place and in-place columns.\n"
"\n"
"What to run:\n"
"  --op OP               allreduce|reducescatter|allgather|broadcast|reduce|alltoall|sendrecv|\n"
"                        alltoallv|all (default allreduce; a comma list works too)\n"
"  --ranks N, -g N       number of ranks (default 2; may exceed the cores: oversubscribed)\n"
"  -b, --minbytes SIZE   smallest size (default 8)\n"
"  -e, --maxbytes SIZE   largest size (default 64M)\n"
"  -f, --stepfactor F    size factor (default 4; nccl-tests uses 2). Sizes are maxbytes/F^k down\n"
"                        to minbytes, plus minbytes itself, so that both ends are measured\n"
"                        (the defaults give 8, 16, 64, ..., 1M, 4M, 16M, 64M)\n"
"  -i, --stepbytes SIZE  linear steps instead: minbytes, minbytes+SIZE, ... <= maxbytes\n"
"  -w, --warmup N        untimed calls per row and variant (default 5)\n"
"  -n, --iters N         timed calls per row and variant (default 20)\n"
"  -d, --dtype T         f32|f64|bf16 (default f32)\n"
"  -o, --redop OP        sum|avg|max (default sum)\n"
"  --algo A              auto|ring|oneshot|rd (default auto; each row shows what ran: oneshot\n"
"                        and rd apply to all-reduces up to 64 KiB and the eager size, the ring\n"
"                        runs the rest; rd needs a power-of-two --ranks)\n"
"  -r, --root R          root of broadcast and reduce (default 0)\n"
"  --counts P            alltoallv's per-peer counts: uniform (default: q to every rank),\n"
"                        uneven (seeded blocks of 0..2q) or skew (an MoE router's hot expert:\n"
"                        every rank sends rank p floor(2q(n-1-p)/(n-1)), so rank 0 receives\n"
"                        about 2x the mean and rank n-1 nothing); see below\n"
"  -c, --check 0|1       check results (default 1): inputs are small integers from a formula\n"
"                        of (rank, index), so every result is exact and known; #wrong counts\n"
"                        the elements that differ (avg: within one rounding)\n"
"  --inplace 0|1|both    out-of-place only, in-place only, or both (default both)\n"
"\n"
"The simulated cluster:\n"
"  --policy P            compact|scatter rank placement (default compact)\n"
"  --nodes K             group ranks into nodes by package|numa|l3|fixed (default package)\n"
"  --ranks-per-node N    ranks per node (implies --nodes fixed)\n"
"  --topology STR        synthetic hwloc topology for grouping and the report, e.g.\n"
"                        \"pack:2 l3:2 core:4 pu:1\" (binding always uses this machine)\n"
"  --gpu-mem SIZE        memory capacity per rank (default unlimited)\n"
"  --timeout SEC         watchdog timeout (default 60; 0 disables)\n"
"  --slots N             slots per channel (power of two; library default)\n"
"  --eager SIZE          eager payload per slot (library default)\n"
"  --slice SIZE          collective slice size (library default)\n"
"  --wait auto|spin|yield  how ranks wait (default auto: yield when oversubscribed)\n"
"  --bind auto|pu|package|none  how rank threads are bound (default auto: each to its own PU\n"
"                        while the ranks fit the PUs; oversubscribed, each to its package's\n"
"                        PUs, so the kernel can move a rank off a busy core)\n"
"  --threads N           rank threads per process: under mpirun -np P the world is P x N ranks\n"
"                        (default: --ranks over P); each process is one node, and the table adds\n"
"                        intra- and inter-node link bandwidth per rank\n"
"  --vs-mpi              under mpirun: also time plain MPI (MPI_Allreduce, ...) on the same\n"
"                        buffers, one MPI rank per process, and print distlab/MPI busbw\n"
"\n"
"Output:\n"
"  --csv                 rows as CSV with a header line (no comment lines)\n"
"  --json                one JSON object: the header information and a \"rows\" array\n"
"  --limits 0|1          measure the machine's limits first (default 1; --stream is the old\n"
"                        name): the one-way hop, the single-copy bandwidth at each size whose\n"
"                        buffers fit the L3, STREAM copy (hop and STREAM again after the run,\n"
"                        to show drift)\n"
"  --stream-mib N        MiB per STREAM thread (default: 4 x L3 over the threads, rounded up\n"
"                        to MiB; less is said to be not DRAM-resident)\n"
"  --dram                the sizes are 2^k >= 4 x L3 and twice that (replaces -b and -e)\n"
"  -h, --help            this help\n"
"\n");
    /* clang-format on */
    /* clang-format off */
    fprintf(f,
"Columns: size (B) and count follow nccl-tests: allreduce, broadcast, reduce, sendrecv: one\n"
"buffer; reducescatter and allgather: the full buffer (count is the library's full count);\n"
"alltoall, alltoallv: the total per rank. time: median over iterations of the slowest rank's time (each\n"
"iteration: barrier, then min(100, 64K/size) calls back to back (at least 1) timed on every\n"
"rank, time per call). algbw = size/time (GB/s = 1e9 B/s);\n"
"busbw = algbw x factor: allreduce 2(n-1)/n; reducescatter, allgather, alltoall (n-1)/n;\n"
"broadcast, reduce, sendrecv 1. sendrecv is a ring shift (rank r sends to r+1) with blocking\n"
"send/recv, even ranks sending first; out-of-place only, and skipped for one rank.\n"
"alltoallv: q = count = size/(n x elt) and every rank sends nq elements (size bytes), blocks\n"
"packed in peer order on both sides; --counts uniform: q to every rank; uneven: rank r sends\n"
"u[(p-r) mod n] elements to rank p, u[k] = q + d_k and u[n-1-k] = q - d_k for k < n/2 (the\n"
"middle one q), d_k = splitmix64(42 + k) mod (q+1), so every rank also receives size bytes in\n"
"blocks of 0..2q; skew: every rank sends rank p w_p = floor(2q(n-1-p)/(n-1)) elements (rank 0\n"
"also the floors' remainder, so the w_p sum to nq): rank 0 receives n w_0 (about 2 x size),\n"
"rank n-1 nothing. busbw = algbw x the part of all ranks' nq that crosses ranks: (n-1)/n for\n"
"uniform and skew, (nq - u[0])/(nq) for uneven. --vs-mpi: MPI_Alltoallv with the same pattern\n"
"over the P processes (q = size/(P x elt)): the same arguments when --threads is 1. The check\n"
"also counts one wrong where the rank's bytes_sent differs from the payload that crosses plus\n"
"the count rows the library exchanges first (16n bytes to each peer).\n"
"\n");
    /* clang-format on */
    bl_help(f);
    /* clang-format off */
    fprintf(f,
"DRAM factors (S = size, n = ranks): allreduce T = 2nS: busbw <= B(n-1)/n^2; reducescatter,\n"
"allgather (n+1)S: B(n-1)/(n(n+1)) (allgather in place nS: B(n-1)/n^2); broadcast (n+1)S:\n"
"B/(n+1) (in place B/n); reduce B/(n+1); alltoall 2nS: B(n-1)/(2n^2) (in place B/(2n));\n"
"sendrecv 2nS: B/(2n); alltoallv as alltoall over its crossing part: B x factor/(2n) (in place\n"
"B/(2n)). alltoall and alltoallv out of place: the copy bound is C x the crossing factor too,\n"
"since every rank also writes its own block, which busbw does not count.\n"
"\n"
"Exit status: 0 ok, 1 wrong results or a failed run, 2 bad usage.\n");
    /* clang-format on */
}

static int parse_ops(const char *s, coll_cfg *c)
{
    char buf[256], *items[64];
    int nitems;
    if (cli_split_list("--op", s, buf, sizeof buf, items, 64, &nitems))
        return -1;
    memset(c->ops, 0, sizeof c->ops);
    c->nops = 0;
    for (int i = 0; i < nitems; i++) {
        const char *tok = items[i];
        static const struct {
            const char *name;
            int op;
        } alias[] = {{"all_reduce", OP_ALLREDUCE}, {"reduce_scatter", OP_REDUCESCATTER},
                     {"all_gather", OP_ALLGATHER}, {"all_to_all", OP_ALLTOALL},
                     {"send_recv", OP_SENDRECV},   {"bcast", OP_BROADCAST}};
        int found = -1;
        if (strcmp(tok, "all") == 0) {
            for (int o = 0; o < NOPS; o++) c->ops[o] = 1;
            continue;
        }
        for (int o = 0; o < NOPS; o++)
            if (strcmp(tok, op_name[o]) == 0)
                found = o;
        for (size_t a = 0; found < 0 && a < sizeof alias / sizeof alias[0]; a++)
            if (strcmp(tok, alias[a].name) == 0)
                found = alias[a].op;
        if (found < 0) {
            cli_error("--op: unknown collective '%s' (allreduce, reducescatter, allgather, "
                      "broadcast, reduce, alltoall, sendrecv, alltoallv, all)",
                      tok);
            return -1;
        }
        c->ops[found] = 1;
    }
    for (int o = 0; o < NOPS; o++) c->nops += c->ops[o];
    if (c->nops == 0) {
        cli_error("--op: no collective given");
        return -1;
    }
    return 0;
}

enum {
    O_OP = 256,
    O_ALGO,
    O_INPLACE,
    O_POLICY,
    O_NODES,
    O_RPN,
    O_TOPOLOGY,
    O_GPUMEM,
    O_TIMEOUT,
    O_CSV,
    O_JSON,
    O_LIMITS,
    O_STREAM_MIB,
    O_DRAM,
    O_SLOTS,
    O_EAGER,
    O_SLICE,
    O_WAIT,
    O_BIND,
    O_THREADS,
    O_VSMPI,
    O_COUNTS
};

/* --bind's value as a dl_bind_kind; -1 after one line on stderr */
static int parse_bind(const char *s, int *out)
{
    static const char *names[] = {"none", "pu", "package"}; /* DL_BIND_NONE.. */
    if (strcmp(s, "auto") == 0) {
        *out = DL_BIND_AUTO;
        return 0;
    }
    for (int k = 0; k < 3; k++)
        if (strcmp(s, names[k]) == 0) {
            *out = k;
            return 0;
        }
    cli_error("--bind: '%s' is not auto, pu, package or none", s);
    return -1;
}

static int parse_args(int argc, char **argv, coll_cfg *c)
{
    static const struct option lo[] = {{"op", required_argument, NULL, O_OP},
                                       {"ranks", required_argument, NULL, 'g'},
                                       {"minbytes", required_argument, NULL, 'b'},
                                       {"maxbytes", required_argument, NULL, 'e'},
                                       {"stepfactor", required_argument, NULL, 'f'},
                                       {"stepbytes", required_argument, NULL, 'i'},
                                       {"warmup", required_argument, NULL, 'w'},
                                       {"warmup_iters", required_argument, NULL, 'w'},
                                       {"iters", required_argument, NULL, 'n'},
                                       {"dtype", required_argument, NULL, 'd'},
                                       {"datatype", required_argument, NULL, 'd'},
                                       {"redop", required_argument, NULL, 'o'},
                                       {"op_type", required_argument, NULL, 'o'},
                                       {"algo", required_argument, NULL, O_ALGO},
                                       {"root", required_argument, NULL, 'r'},
                                       {"check", required_argument, NULL, 'c'},
                                       {"inplace", required_argument, NULL, O_INPLACE},
                                       {"policy", required_argument, NULL, O_POLICY},
                                       {"nodes", required_argument, NULL, O_NODES},
                                       {"ranks-per-node", required_argument, NULL, O_RPN},
                                       {"topology", required_argument, NULL, O_TOPOLOGY},
                                       {"gpu-mem", required_argument, NULL, O_GPUMEM},
                                       {"timeout", required_argument, NULL, O_TIMEOUT},
                                       {"csv", no_argument, NULL, O_CSV},
                                       {"json", no_argument, NULL, O_JSON},
                                       {"limits", required_argument, NULL, O_LIMITS},
                                       {"stream", required_argument, NULL, O_LIMITS},
                                       {"stream-mib", required_argument, NULL, O_STREAM_MIB},
                                       {"dram", no_argument, NULL, O_DRAM},
                                       {"slots", required_argument, NULL, O_SLOTS},
                                       {"eager", required_argument, NULL, O_EAGER},
                                       {"slice", required_argument, NULL, O_SLICE},
                                       {"wait", required_argument, NULL, O_WAIT},
                                       {"bind", required_argument, NULL, O_BIND},
                                       {"threads", required_argument, NULL, O_THREADS},
                                       {"vs-mpi", no_argument, NULL, O_VSMPI},
                                       {"counts", required_argument, NULL, O_COUNTS},
                                       {"help", no_argument, NULL, 'h'},
                                       {NULL, 0, NULL, 0}};
    const uint64_t max_bytes = (uint64_t)1 << 40;
    uint64_t u;
    int v, rpn_set = 0, nodes_set = 0;

    optind = 0; /* glibc: a full restart, whatever ran getopt before */
    opterr = 0; /* our own one-line messages */
    for (;;) {
        int longidx = -1;
        /* '+': stop at the first non-option (reported below); ':': tell missing arguments */
        int ch = getopt_long(argc, argv, "+:hb:e:f:i:w:n:g:d:o:r:c:", lo, &longidx);
        if (ch == -1)
            break;
        switch (ch) {
        case 'h': usage(stdout); exit(CLI_EXIT_OK);
        case O_OP:
            if (parse_ops(optarg, c))
                return -1;
            break;
        case 'g':
            if (cli_parse_int("--ranks", optarg, 1, MAX_RANKS, &c->nranks))
                return -1;
            break;
        case 'b':
            if (cli_parse_size("--minbytes", optarg, 1, max_bytes, &c->minbytes))
                return -1;
            break;
        case 'e':
            if (cli_parse_size("--maxbytes", optarg, 1, max_bytes, &c->maxbytes))
                return -1;
            break;
        case 'f':
            if (cli_parse_int("--stepfactor", optarg, 2, 1 << 20, &c->stepfactor))
                return -1;
            break;
        case 'i':
            if (cli_parse_size("--stepbytes", optarg, 1, max_bytes, &c->stepbytes))
                return -1;
            break;
        case 'w':
            if (cli_parse_int("--warmup", optarg, 0, 1000000, &c->warmup))
                return -1;
            break;
        case 'n':
            if (cli_parse_int("--iters", optarg, 1, 1000000, &c->iters))
                return -1;
            break;
        case 'd': {
            const char *s = strcmp(optarg, "bfloat16") == 0 ? "bf16" : optarg;
            if (dl_dtype_parse(s, &c->dtype) != DL_OK) {
                cli_error("--dtype: unknown type '%s' (f32, f64, bf16)", optarg);
                return -1;
            }
            break;
        }
        case 'o':
            if (dl_redop_parse(optarg, &c->redop) != DL_OK) {
                cli_error("--redop: unknown reduction '%s' (sum, avg, max)", optarg);
                return -1;
            }
            break;
        case O_ALGO:
            if (dl_algo_parse(optarg, &c->algo) != DL_OK) {
                cli_error("--algo: unknown algorithm '%s' (auto, ring, oneshot, rd)", optarg);
                return -1;
            }
            break;
        case 'r':
            if (cli_parse_int("--root", optarg, 0, MAX_RANKS - 1, &c->root))
                return -1;
            break;
        case 'c':
            if (cli_parse_bool("--check", optarg, &c->check))
                return -1;
            break;
        case O_INPLACE:
            if (strcmp(optarg, "both") == 0) {
                c->mode_on[MODE_OOP] = c->mode_on[MODE_IP] = 1;
            } else if (cli_parse_bool("--inplace", optarg, &v) == 0) {
                c->mode_on[MODE_OOP] = !v;
                c->mode_on[MODE_IP] = v;
            } else
                return -1;
            c->inplace_arg = optarg;
            break;
        case O_POLICY:
            if (dl_place_policy_parse(optarg, &c->w.policy) != DL_OK) {
                cli_error("--policy: unknown placement '%s' (compact, scatter)", optarg);
                return -1;
            }
            break;
        case O_NODES:
            if (dl_node_kind_parse(optarg, &c->w.nodes) != DL_OK) {
                cli_error("--nodes: unknown node kind '%s' (package, numa, l3, fixed)", optarg);
                return -1;
            }
            nodes_set = 1;
            break;
        case O_RPN:
            if (cli_parse_int("--ranks-per-node", optarg, 1, MAX_RANKS, &c->w.ranks_per_node))
                return -1;
            rpn_set = 1;
            break;
        case O_TOPOLOGY: c->w.topology = optarg; break;
        case O_GPUMEM:
            if (cli_parse_size("--gpu-mem", optarg, 1, UINT64_MAX, &c->w.gpu_mem))
                return -1;
            break;
        case O_TIMEOUT:
            if (cli_parse_double("--timeout", optarg, 0, 1e6, &c->w.timeout_s))
                return -1;
            break;
        case O_CSV: c->csv = 1; break;
        case O_JSON: c->json = 1; break;
        case O_LIMITS:
            if (cli_parse_bool("--limits", optarg, &c->limits))
                return -1;
            break;
        case O_DRAM: c->dram = 1; break;
        case O_STREAM_MIB:
            if (cli_parse_int("--stream-mib", optarg, 1, 1 << 16, &c->stream_mib))
                return -1;
            break;
        case O_SLOTS:
            if (cli_parse_int("--slots", optarg, 2, 1 << 16, &c->w.nslots))
                return -1;
            if (c->w.nslots & (c->w.nslots - 1)) {
                cli_error("--slots: %d is not a power of two", c->w.nslots);
                return -1;
            }
            break;
        case O_EAGER:
            if (cli_parse_size("--eager", optarg, 0, 1 << 30, &u))
                return -1;
            c->w.eager_bytes = (size_t)u;
            break;
        case O_SLICE:
            if (cli_parse_size("--slice", optarg, 1, 1 << 30, &u))
                return -1;
            c->w.slice_bytes = (size_t)u;
            break;
        case O_THREADS:
            if (cli_parse_int("--threads", optarg, 1, MAX_RANKS, &c->threads))
                return -1;
            break;
        case O_VSMPI: c->vs_mpi = 1; break;
        case O_COUNTS:
            for (c->counts = 0; c->counts < NCNTS && strcmp(optarg, cnt_name[c->counts]);)
                c->counts++;
            if (c->counts == NCNTS) {
                cli_error("--counts: '%s' is not uniform, uneven or skew", optarg);
                return -1;
            }
            break;
        case O_WAIT:
            if (strcmp(optarg, "auto") == 0)
                c->w.wait_mode = -1;
            else if (strcmp(optarg, "spin") == 0)
                c->w.wait_mode = DL_WAIT_SPIN;
            else if (strcmp(optarg, "yield") == 0)
                c->w.wait_mode = DL_WAIT_YIELD;
            else {
                cli_error("--wait: '%s' is not auto, spin or yield", optarg);
                return -1;
            }
            break;
        case O_BIND:
            if (parse_bind(optarg, &c->w.bind))
                return -1;
            break;
        case ':':
            if (optopt)
                cli_error("option '-%c' needs a value (see --help)", optopt);
            else
                cli_error("option '%s' needs a value (see --help)", argv[optind - 1]);
            return -1;
        default: /* '?' */
            if (optopt)
                cli_error("unknown option '-%c' (see --help)", optopt);
            else
                cli_unknown_option("", argv[optind - 1], lo, sizeof lo[0], 0, 1,
                                   "distlab-bench coll --help");
            return -1;
        }
    }
    if (optind < argc) {
        cli_error("unexpected argument '%s' (see --help)", argv[optind]);
        return -1;
    }
    if (rpn_set) {
        if (nodes_set && c->w.nodes != DL_NODE_FIXED) {
            cli_error("--ranks-per-node needs --nodes fixed");
            return -1;
        }
        c->w.nodes = DL_NODE_FIXED;
    } else if (c->w.nodes == DL_NODE_FIXED) {
        cli_error("--nodes fixed needs --ranks-per-node N");
        return -1;
    }
    if (c->maxbytes < c->minbytes) {
        cli_error("--maxbytes (%" PRIu64 ") is smaller than --minbytes (%" PRIu64 ")", c->maxbytes,
                  c->minbytes);
        return -1;
    }
    if (c->threads > 0) /* rank threads per process: the world is processes x threads */
        c->nranks = c->nprocs * c->threads;
    if (c->nranks % c->nprocs || c->nranks > MAX_RANKS) {
        cli_error("--ranks %d do not divide over %d MPI processes (or use --threads N per process)",
                  c->nranks, c->nprocs);
        return -1;
    }
    if (c->vs_mpi && c->nprocs < 2) {
        cli_error("--vs-mpi: run under mpirun -np P (P >= 2) with a build that has MPI");
        return -1;
    }
    if (c->algo == DL_ALGO_RD && (c->nranks & (c->nranks - 1))) {
        /* the library would run the ring on every row: say so instead of measuring it silently */
        cli_error("--algo rd: recursive doubling needs a power-of-two rank count, not %d "
                  "(--algo auto picks one that fits)",
                  c->nranks);
        return -1;
    }
    if (c->root >= c->nranks) {
        cli_error("--root %d: needs a rank below --ranks %d", c->root, c->nranks);
        return -1;
    }
    if (c->csv && c->json) {
        cli_error("--csv and --json are exclusive");
        return -1;
    }
    c->w.nranks = c->nranks;
    return 0;
}

/* Sizes: with -i, nccl-tests' linear list; otherwise max/f^k down to min, plus min. */
static int make_sizes(const coll_cfg *c, uint64_t **out, int *nout)
{
    uint64_t *s = NULL;
    int n = 0, cap = 0;
    if (c->stepbytes) {
        for (uint64_t x = c->minbytes; x <= c->maxbytes; x += c->stepbytes) {
            if (n == MAX_ROWS)
                goto too_many;
            if (n == cap) {
                cap = cap ? 2 * cap : 64;
                uint64_t *t = realloc(s, sizeof *s * (size_t)cap);
                if (!t)
                    goto too_many;
                s = t;
            }
            s[n++] = x;
            if (c->maxbytes - x < c->stepbytes)
                break; /* no overflow */
        }
    } else {
        cap = 66;
        if (!(s = malloc(sizeof *s * (size_t)cap)))
            goto too_many;
        for (uint64_t x = c->maxbytes; x >= c->minbytes && n < cap - 1;
             x /= (uint64_t)c->stepfactor)
            s[n++] = x;
        if (n == 0 || s[n - 1] != c->minbytes)
            s[n++] = c->minbytes;
        for (int i = 0; i < n / 2; i++) {
            uint64_t t = s[i];
            s[i] = s[n - 1 - i];
            s[n - 1 - i] = t;
        }
    }
    *out = s;
    *nout = n;
    return 0;
too_many:
    free(s);
    cli_error("too many sizes (at most %d): raise --stepbytes", MAX_ROWS);
    return -1;
}

/* ----------------------------------------------------------------------------- JSON ---- */

static void json_num(FILE *f, double v)
{
    if (isfinite(v))
        fprintf(f, "%.6g", v);
    else
        fputs("null", f);
}

/* , "key": v */
static void json_kv(FILE *f, const char *key, double v)
{
    fprintf(f, ", \"%s\": ", key);
    json_num(f, v);
}

static void print_json(const bench *b, double avg_bus, uint64_t wrong_total, int nrows_done, int rc)
{
    const coll_cfg *c = b->c;
    FILE *f = stdout;
    fprintf(f, "{\n  \"tool\": \"distlab-bench coll\",\n  \"version\": ");
    dl__json_fputs(f, dl_version(), DL__JSON_CTRL_U);
    fprintf(f, ",\n  \"ops\": [");
    for (int o = 0, k = 0; o < NOPS; o++)
        if (c->ops[o])
            fprintf(f, "%s\"%s\"", k++ ? ", " : "", op_name[o]);
    fprintf(f, "],\n  \"processes\": %d,\n  \"threads_per_process\": %d,", c->nprocs,
            c->nprocs > 1 ? c->nranks / c->nprocs : c->nranks);
    fprintf(f,
            "\n  \"ranks\": %d,\n  \"nodes\": %d,\n  \"node_kind\": \"%s\",\n  \"policy\": "
            "\"%s\",\n",
            c->nranks, b->nnodes, dl_node_kind_name(c->w.nodes), dl_place_policy_name(c->w.policy));
    fprintf(f, "  \"topology\": ");
    dl__json_fputs(f, b->topo.desc, DL__JSON_CTRL_U);
    fprintf(f, ",\n  \"synthetic\": %s,\n  \"real_pus\": %d,\n  \"oversubscribed\": %s,\n",
            b->topo.synthetic ? "true" : "false", b->real_pus, b->oversub ? "true" : "false");
    fprintf(f, "  \"placement\": [");
    for (int r = 0; r < c->nranks; r++)
        fprintf(f, "%s{\"rank\": %d, \"cpu\": %d, \"cpus\": \"%s\", \"node\": %d}", r ? ", " : "",
                r, b->cpu[r], b->cpus[r], b->node[r]);
    fprintf(f,
            "],\n  \"dtype\": \"%s\",\n  \"redop\": \"%s\",\n  \"root\": %d,\n  \"algo\": "
            "\"%s\",\n",
            dl_dtype_name(c->dtype), dl_redop_name(c->redop), c->root, dl_algo_name(c->algo));
    fprintf(f,
            "  \"minbytes\": %" PRIu64 ",\n  \"maxbytes\": %" PRIu64 ",\n  \"stepfactor\": %d,\n"
            "  \"stepbytes\": %" PRIu64
            ",\n  \"warmup\": %d,\n  \"iters\": %d,\n  \"check\": %d,\n",
            c->minbytes, c->maxbytes, c->stepfactor, c->stepbytes, c->warmup, c->iters, c->check);
    fprintf(f, "  \"inplace\": \"%s\",\n  \"counts\": \"%s\",\n  \"limits\": ",
            c->inplace_arg ? c->inplace_arg : "both", cnt_name[c->counts]);
    if (b->lim.measured) {
        fputs("{", f);
        bl_print_json(f, &b->lim);
        fputs("},\n", f);
    } else {
        fprintf(f, "null,\n");
    }
    fprintf(f, "  \"rows\": [");
    for (int i = 0; i < nrows_done; i++) {
        const row *rw = &b->rows[i];
        char algo[64];
        row_algo(b, i, algo, sizeof algo);
        fprintf(f,
                "%s\n    {\"op\": \"%s\", \"size\": %" PRIu64 ", \"count\": %zu, \"type\": \"%s\", "
                "\"redop\": \"%s\", \"root\": %d, \"algo\": \"%s\"",
                i ? "," : "", op_name[rw->op], rw->bytes, (size_t)(rw->bytes / b->elt),
                dl_dtype_name(c->dtype), op_has_redop(rw->op) ? dl_redop_name(c->redop) : "none",
                rw->root, algo);
        if (b->lim.measured) {
            fprintf(f, ", \"limit\": \"%s\", \"limit_value\": ",
                    bl_kind_name(bl_kind_of(&b->lim, rw->bytes, c->nranks)));
            json_num(f, row_limit(b, rw, b->cells[(size_t)i * NMODES].valid ? MODE_OOP : MODE_IP));
        }
        for (int mode = 0; mode < NMODES; mode++) {
            const cell *ce = &b->cells[(size_t)i * NMODES + mode];
            fprintf(f, ", \"%s\": ", mode_key[mode]);
            if (!ce->valid) {
                fputs("null", f);
                continue;
            }
            fprintf(f, "{\"time_us\": ");
            json_num(f, ce->time_us);
            json_kv(f, "algbw_gbs", ce->algbw);
            json_kv(f, "busbw_gbs", ce->busbw);
            json_kv(f, "lim_pct", ce->lim_pct);
            json_kv(f, "hops", ce->hops);
            if (c->check)
                fprintf(f, ", \"wrong\": %" PRIu64 "}", ce->wrong);
            else
                fprintf(f, ", \"wrong\": null}");
        }
        double ia, ie, mu, mb, ra;
        mpi_cols(b, i, &ia, &ie, &mu, &mb, &ra);
        if (c->nprocs > 1) {
            fprintf(f, ", \"link_gbs\": {\"intra\": ");
            json_num(f, ia);
            json_kv(f, "inter", ie);
            fputc('}', f);
        }
        if (c->vs_mpi) {
            fprintf(f, ", \"mpi\": {\"time_us\": ");
            json_num(f, mu);
            json_kv(f, "busbw_gbs", mb);
            json_kv(f, "dl_over_mpi", ra);
            fprintf(f, ", \"wrong\": %" PRIu64 "}", b->mpi_wrong[(size_t)i * NMODES]);
        }
        fputc('}', f);
    }
    fprintf(f, "\n  ],\n  \"avg_busbw_gbs\": ");
    json_num(f, avg_bus);
    fprintf(f, ",\n  \"wrong_total\": %" PRIu64 ",\n  \"status\": ", wrong_total);
    dl__json_fputs(f, rc == DL_OK ? "ok" : dl_strstatus(rc), DL__JSON_CTRL_U);
    fprintf(f, "\n}\n");
    fflush(f);
}

/* ------------------------------------------------------------------------------ main ---- */

static int coll_main(int argc, char **argv, int nprocs);

/* Under mpirun the world spans the processes; a failed run ends the job with MPI_Abort. */
int bench_coll_main(int argc, char **argv)
{
    int nprocs = app_mpi_start(&argc, &argv);
    if (nprocs < 0)
        return CLI_EXIT_FAIL;
    return app_mpi_end(coll_main(argc, argv, nprocs));
}

static int coll_main(int argc, char **argv, int nprocs)
{
    coll_cfg c;
    memset(&c, 0, sizeof c);
    c.nprocs = nprocs;
    dl_world_opts_init(&c.w);
    c.ops[OP_ALLREDUCE] = 1;
    c.nops = 1;
    c.nranks = 2;
    c.minbytes = 8;
    c.maxbytes = (uint64_t)64 << 20;
    c.stepfactor = 4;
    c.warmup = 5;
    c.iters = 20;
    c.dtype = DL_F32;
    c.redop = DL_SUM;
    c.algo = DL_ALGO_AUTO;
    c.check = 1;
    c.mode_on[MODE_OOP] = c.mode_on[MODE_IP] = 1;
    c.limits = 1;
    if (parse_args(argc, argv, &c) != 0)
        return CLI_EXIT_USAGE;
    if (c.dram) { /* two sizes from 4 x the real L3 up: DRAM-resident whatever -b and -e said */
        int assumed;
        c.minbytes = bl_dram_size(bl_l3_bytes(&assumed));
        c.maxbytes = 2 * c.minbytes;
    }

    int n = c.nranks, status = CLI_EXIT_OK;
    bench b;
    memset(&b, 0, sizeof b);
    b.c = &c;
    b.elt = dl_dtype_size(c.dtype);

    /* Rows: for each op (in the fixed order above), each size. */
    uint64_t *sizes = NULL;
    int nsizes = 0;
    if (make_sizes(&c, &sizes, &nsizes) != 0)
        return CLI_EXIT_USAGE;
    if ((size_t)nsizes * (size_t)c.nops > MAX_ROWS) {
        free(sizes);
        cli_error("too many rows (at most %d)", MAX_ROWS);
        return CLI_EXIT_USAGE;
    }
    b.rows = calloc((size_t)nsizes * (size_t)c.nops + 1, sizeof *b.rows);
    if (!b.rows) {
        free(sizes);
        cli_error("out of memory");
        return CLI_EXIT_FAIL;
    }
    const char *skipped_sendrecv = NULL;
    for (int o = 0; o < NOPS; o++) {
        if (!c.ops[o])
            continue;
        if (o == OP_SENDRECV && n == 1) {
            skipped_sendrecv = "it needs at least 2 ranks";
            continue;
        }
        if (o == OP_SENDRECV && !c.mode_on[MODE_OOP]) {
            skipped_sendrecv = "it has no in-place variant";
            continue;
        }
        for (int k = 0; k < nsizes; k++) {
            row *rw = &b.rows[b.nrows++];
            size_t elems = (size_t)(sizes[k] / b.elt), need;
            rw->op = o;
            rw->root = op_has_root(o) ? c.root : -1;
            if (o == OP_ALLTOALL || o == OP_ALLTOALLV) { /* per-peer count (alltoallv: the mean);
                                                            the size column: the total per rank */
                rw->count = elems / (size_t)n;
                rw->bytes = (uint64_t)rw->count * (uint64_t)n * b.elt;
            } else {
                rw->count = elems;
                rw->bytes = (uint64_t)elems * b.elt;
            }
            /* no buffer holds more than the size column, but alltoallv's skew receives more */
            need = (size_t)rw->bytes;
            if (o == OP_ALLTOALLV) { /* and --vs-mpi's pattern over the processes */
                size_t qp = (size_t)(rw->bytes / b.elt) / (size_t)c.nprocs;
                size_t mine = a2av_recv_max(c.counts, rw->count, n);
                size_t mpi = c.vs_mpi ? a2av_recv_max(c.counts, qp, c.nprocs) : 0;
                need = (mine > mpi ? mine : mpi) * b.elt;
            }
            if (need > b.buf_bytes)
                b.buf_bytes = need;
        }
    }
    free(sizes);

    size_t ncells = (size_t)b.nrows * NMODES;
    if (ncells && (size_t)c.iters * (size_t)n > MAX_TIMING_DOUBLES / ncells) {
        cli_error("rows x iterations x ranks too large for the timing table: lower --iters");
        free(b.rows);
        return CLI_EXIT_USAGE;
    }

    /* The topology: for the report, the real PU count and the STREAM threads' pinning. */
    dl_topo *topo = NULL;
    if (dl_topo_load(&topo, c.w.topology) != DL_OK) {
        cli_error("topology: %s", dl_errmsg());
        free(b.rows);
        return CLI_EXIT_USAGE;
    }
    dl_topo_get_summary(topo, &b.topo);
    b.real_pus = dl_topo_real_pus(topo);
    b.oversub = n > b.real_pus;
    b.nnodes = 1;

    if (!c.json && !c.csv) {
        printf("# distlab-bench coll (distlab %s)\n", dl_version());
        printf("# op:");
        for (int o = 0; o < NOPS; o++)
            if (c.ops[o])
                printf(" %s", op_name[o]);
        printf("  ranks: %d  dtype: %s  redop: %s  root: %d  algo: %s\n", n, dl_dtype_name(c.dtype),
               dl_redop_name(c.redop), c.root, dl_algo_name(c.algo));
        if (c.nprocs > 1)
            printf("# MPI: %d processes x %d rank threads (each process is one node); intra/inter: "
                   "bytes a rank sent per call inside its process / to other processes, over the "
                   "time%s\n",
                   c.nprocs, n / c.nprocs,
                   c.vs_mpi ? "; plain MPI: MPI_COMM_WORLD, one rank per process, the same buffers"
                            : "");
        if (c.stepbytes)
            printf("# minBytes %" PRIu64 " maxBytes %" PRIu64 " step: %" PRIu64 "(bytes)",
                   c.minbytes, c.maxbytes, c.stepbytes);
        else
            printf("# minBytes %" PRIu64 " maxBytes %" PRIu64 " step: %d(factor)", c.minbytes,
                   c.maxbytes, c.stepfactor);
        printf(" warmup iters: %d iters: %d validation: %d inplace: %s\n", c.warmup, c.iters,
               c.check, c.inplace_arg ? c.inplace_arg : "both");
        printf("# topology: %s%s: PUs %d, cores %d, L3s %d (%lld MiB each), NUMA nodes %d, "
               "packages %d; real PUs %d; placement %s\n",
               b.topo.desc, b.topo.synthetic ? " (synthetic)" : "", b.topo.pus, b.topo.cores,
               b.topo.l3s, b.topo.l3_bytes >> 20, b.topo.numas, b.topo.packages, b.real_pus,
               dl_place_policy_name(c.w.policy));
        bu_blas_text(stdout);
        fflush(stdout);
    }

    if (c.nprocs > 1 && app_mpi_rank() != 0)
        c.limits = 0; /* one measurement, by the process that prints */
    if (c.limits) {
        size_t *sz = calloc((size_t)b.nrows + 1, sizeof *sz);
        int thr = n < b.real_pus ? n : b.real_pus;
        for (int i = 0; sz && i < b.nrows; i++) sz[i] = (size_t)b.rows[i].bytes;
        if (!sz || bl_measure(&b.lim, topo, &c.w, thr < 1 ? 1 : thr, sz, b.nrows, n,
                              (size_t)c.stream_mib << 20) != 0)
            cli_error("limits not measured: out of memory");
        free(sz);
        if (b.lim.stream_gbs <= 0)
            cli_error("STREAM measurement failed (DRAM rows have no limit)");
        if (!c.json && !c.csv)
            bl_print_text(stdout, &b.lim);
    }
    if (!c.json && !c.csv && skipped_sendrecv)
        printf("# sendrecv skipped: %s\n", skipped_sendrecv);

    b.times = calloc(ncells * (size_t)c.iters * (size_t)n + 1, sizeof *b.times);
    b.wrong = calloc(ncells * (size_t)n + 1, sizeof *b.wrong);
    b.algo = calloc(ncells + 1, sizeof *b.algo);
    b.cells = calloc(ncells + 1, sizeof *b.cells);
    b.scratch = calloc((size_t)c.iters, sizeof *b.scratch);
    b.cpu = calloc((size_t)n, sizeof *b.cpu);
    b.cpus = calloc((size_t)n, sizeof *b.cpus);
    b.node = calloc((size_t)n, sizeof *b.node);
    b.intra_b = calloc(ncells + 1, sizeof *b.intra_b);
    b.inter_b = calloc(ncells + 1, sizeof *b.inter_b);
    b.mpi_us = calloc(ncells + 1, sizeof *b.mpi_us);
    for (size_t k = 0; b.mpi_us && k < ncells; k++) b.mpi_us[k] = NAN;
    b.mpi_wrong = calloc(ncells + 1, sizeof *b.mpi_wrong);
    b.lo = app_mpi_rank() * (n / c.nprocs);
    pthread_mutex_init(&b.mpi_mu, NULL);
    pthread_cond_init(&b.mpi_cv, NULL);
    if (!b.intra_b || !b.inter_b || !b.mpi_us || !b.mpi_wrong || !b.times || !b.wrong || !b.algo ||
        !b.cells || !b.scratch || !b.cpu || !b.cpus || !b.node || pattern_init(&b, n) != 0) {
        cli_error("out of memory");
        status = CLI_EXIT_FAIL;
        goto done;
    }
    for (int r = 0; r < n; r++) b.cpu[r] = b.node[r] = -1;

    dl_world *world = NULL;
    int rc = dl_world_run_keep(&c.w, rank_fn, &b, &world);
    if (rc != DL_OK) {
        cli_error("run failed: %s (%s)", dl_errmsg(), dl_strstatus(rc));
        status = rc == DL_EINVAL ? CLI_EXIT_USAGE : CLI_EXIT_FAIL;
    }
    if (world)
        dl_world_destroy(world);
    if (rc == DL_OK)
        bl_measure_after(&b.lim, topo, &c.w);

    /* Summary over the rows rank 0 finished (all of them unless the run failed). */
    int done = 0;
    for (int i = 0; i < b.nrows; i++)
        if (b.cells[(size_t)i * NMODES].valid || b.cells[(size_t)i * NMODES + 1].valid)
            done = i + 1;
    double bus_sum = 0;
    int bus_n = 0;
    uint64_t wrong_total = 0;
    for (size_t ci = 0; ci < (size_t)done * NMODES; ci++) {
        if (!b.cells[ci].valid)
            continue;
        bus_sum += b.cells[ci].busbw;
        bus_n++;
        wrong_total += b.cells[ci].wrong + b.mpi_wrong[ci];
    }
    double avg_bus = bus_n ? bus_sum / bus_n : NAN;
    if (wrong_total > 0 && status == CLI_EXIT_OK)
        status = CLI_EXIT_FAIL;

    if (c.json) {
        print_json(&b, avg_bus, wrong_total, done, rc);
    } else if (!c.csv) {
        if (b.lim.measured)
            printf("# limits after the run (drift; vs lim uses the first): one-way hop %.1f ns "
                   "(%.1f), STREAM copy %.2f GB/s (%.2f)\n",
                   b.lim.hop_after_ns, b.lim.hop_ns, b.lim.stream_after_gbs, b.lim.stream_gbs);
        if (rc != DL_OK)
            printf("# run failed (%s) after %d of %d rows\n", dl_strstatus(rc), done, b.nrows);
        printf("# Out of bounds values : %" PRIu64 " %s%s\n", wrong_total,
               wrong_total ? "FAILED" : "OK", c.check ? "" : " (not checked: --check 0)");
        printf("# Avg bus bandwidth    : %.4f\n", bus_n ? avg_bus : 0.0);
        printf("#\n# %d rows, %" PRIu64 " wrong\n", done, wrong_total);
        fflush(stdout);
    }
    if (wrong_total > 0)
        cli_error("%" PRIu64 " wrong elements", wrong_total);

done:
    bl_free(&b.lim);
    dl_topo_destroy(topo);
    free(b.times);
    free(b.wrong);
    free(b.algo);
    free(b.cells);
    free(b.scratch);
    free(b.cpu);
    free(b.cpus);
    free(b.node);
    free(b.intra_b);
    free(b.inter_b);
    free(b.mpi_us);
    free(b.mpi_wrong);
    pthread_mutex_destroy(&b.mpi_mu);
    pthread_cond_destroy(&b.mpi_cv);
    free(b.vf);
    free(b.vd);
    free(b.vb);
    free(b.red);
    free(b.rows);
    return status;
}
