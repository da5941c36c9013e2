/* Checkpoints (lib/io/ckpt.c): sharded save in the safetensors layout, load under any layout.
 *
 * - Round trips: shards of tp 2 (and tp 4 with 8 heads, and dp 2 x tp 2 with dp replicas that do
 *   not write) initialised with dl_gpt_init are saved; tp 1 and other tp layouts load them and
 *   must equal dl_gpt_init of their own layout element for element (bitwise), in f32 and f64,
 *   and across precisions (f64 file into an f32 run rounds like dl_gpt_init's f32 does).
 * - The file is read back by the test's own minimal reader, independent of the library: header
 *   length (a multiple of 8, space padded), every tensor's dtype, shape and data_offsets
 *   (contiguous, in layout order, ending at the file's end), the metadata, the FNV-1a 64
 *   checksum computed here, and the data against the single-rank weights.
 * - Corrupt or mismatched files are refused with messages: truncated, bad JSON, header length
 *   beyond the file, an unsupported dtype, a wrong shape, a missing or extra tensor, a flipped
 *   data byte (checksum), a missing file.
 * - Failures during save (a directory that does not exist, a file size limit) return an error
 *   on every rank without hanging, leave no temporary file, and leave an older checkpoint intact.
 *   Ranks that disagree on the config, or a tp rank without a writer, are refused on all ranks.
 * - tests/ref/ckpt_check.py (Python, standard library) re-reads a file when python3 and the source
 *   directory are at hand; otherwise that check is skipped.
 *
 * Rank threads never assert: they record statuses, messages and counts; the test thread asserts. */
#define _GNU_SOURCE
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "../testutil.h"

#define NMAX 8
#define MSG 800

/* ------------------------------------------------------------------------------------------ */
/* helpers                                                                                      */

static char g_dir[256];

static void mk_dir(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/distlab-ckpt-XXXXXX");
    ck_assert_msg(mkdtemp(g_dir) != NULL, "mkdtemp: %s", strerror(errno));
}

static void rm_dir(void)
{
    DIR *d = opendir(g_dir);
    if (!d)
        return;
    struct dirent *e;
    char p[600];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(p, sizeof p, "%s/%s", g_dir, e->d_name);
            unlink(p);
        }
    closedir(d);
    rmdir(g_dir);
}

/* Files in the test directory whose name contains ".tmp." (left-over temporaries). */
static int count_tmp(void)
{
    DIR *d = opendir(g_dir);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".tmp."))
            n++;
    closedir(d);
    return n;
}

static void in_dir(char *out, size_t n, const char *name)
{
    snprintf(out, n, "%s/%s", g_dir, name);
}

static unsigned char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) {
        b[n] = 0;
        *len = (size_t)n;
    }
    return b;
}

static void spit(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    ck_assert_msg(f != NULL, "fopen %s: %s", path, strerror(errno));
    ck_assert(fwrite(b, 1, n, f) == n);
    ck_assert(fclose(f) == 0);
}

/* The test's own FNV-1a 64. */
static uint64_t fnv(const unsigned char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static uint64_t get_le64(const unsigned char *b)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | b[i];
    return v;
}

static void put_le64(unsigned char *b, uint64_t v)
{
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
}

static dl_gpt_config cfg_make(int vocab, int seq, int layers, int d_model, int heads, int tie)
{
    dl_gpt_config c = {.vocab = vocab,
                       .seq = seq,
                       .layers = layers,
                       .d_model = d_model,
                       .heads = heads,
                       .tie = tie};
    return c;
}

/* The values a layout's params should hold after loading a file saved at precision fds from
 * dl_gpt_init(seed), in a run of precision ds. */
static void *expected_params(const dl_gpt_layout *l, int fds, int ds, uint64_t seed)
{
    void *out = tu_alloc(l->numel * (size_t)ds);
    if (!out)
        abort();
    if (fds == ds) {
        dl_gpt_init(l, out, ds, seed);
        return out;
    }
    void *tmp = tu_alloc(l->numel * (size_t)fds);
    if (!tmp)
        abort();
    dl_gpt_init(l, tmp, fds, seed);
    for (size_t i = 0; i < l->numel; i++) {
        if (ds == 4)
            ((float *)out)[i] = (float)((double *)tmp)[i];
        else
            ((double *)out)[i] = (double)((float *)tmp)[i];
    }
    free(tmp);
    return out;
}

/* ------------------------------------------------------------------------------------------ */
/* save and load worlds                                                                         */

typedef struct save_job {
    dl_gpt_config cfg;
    int tp, dp, dsize;
    uint64_t seed;
    char path[512];
    int group_mode;                   /* 0: world comm; 1: the mesh's tp comm, dp replica 0 only */
    int writer_mode;                  /* 0: dp_rank 0 writes; 1: world rank 0 only; 2: every rank */
    int bad_dsize_rank, odd_cfg_rank; /* -1 or a world rank that passes dsize 2 / seq + 1 */
    double poison; /* not 0: world rank 0 saves this value at element 3 of its tensor 1 */
    int status[NMAX];
    char msg[NMAX][MSG];
} save_job;

static void save_job_init(save_job *j, dl_gpt_config cfg, int tp, int dp, int dsize, uint64_t seed,
                          const char *name)
{
    memset(j, 0, sizeof *j);
    j->cfg = cfg;
    j->tp = tp;
    j->dp = dp;
    j->dsize = dsize;
    j->seed = seed;
    j->bad_dsize_rank = j->odd_cfg_rank = -1;
    in_dir(j->path, sizeof j->path, name);
    for (int r = 0; r < NMAX; r++) j->status[r] = -1;
}

static int save_rank(dl_ctx *ctx, void *arg)
{
    save_job *j = arg;
    int w = dl_ctx_rank(ctx), tp_rank = w % j->tp, dp_rank = w / j->tp;
    dl_gpt_config cfg = j->cfg;
    if (w == j->odd_cfg_rank)
        cfg.seq++;
    dl_gpt_layout *l;
    int rc = dl_gpt_layout_create(&cfg, j->tp, tp_rank, &l);
    if (rc)
        return rc;
    void *p = tu_alloc(l->numel * (size_t)j->dsize);
    if (!p)
        return dl_error(DL_ENOMEM, "test: no memory");
    dl_gpt_init(l, p, j->dsize, j->seed);
    if (j->poison != 0 && w == 0) {
        size_t at = l->t[1].offset + 3;
        if (j->dsize == 8)
            ((double *)p)[at] = j->poison;
        else
            ((float *)p)[at] = (float)j->poison;
    }
    dl_mesh m;
    dl_comm *g = dl_ctx_comm(ctx);
    if (j->group_mode == 1) {
        if ((rc = dl_mesh_create(dl_ctx_comm(ctx), j->dp, 1, j->tp, 1, &m)))
            return rc;
        g = m.tp_comm;
    }
    int writer = j->writer_mode == 0 ? dp_rank == 0 : j->writer_mode == 1 ? w == 0 : 1;
    int ds = w == j->bad_dsize_rank ? 2 : j->dsize;
    if (j->group_mode == 0 || dp_rank == 0) {
        j->status[w] = dl_ckpt_save(j->path, l, p, ds, g, writer);
        snprintf(j->msg[w], MSG, "%s", j->status[w] ? dl_errmsg() : "");
    } else {
        j->status[w] = DL_OK;
    }
    if (j->group_mode == 1)
        dl_mesh_destroy(&m);
    free(p);
    dl_gpt_layout_destroy(l);
    return DL_OK; /* statuses are asserted by the test thread */
}

static void run_save(save_job *j)
{
    int st = tu_run_world(j->tp * j->dp, save_rank, j);
    ck_assert_msg(st == DL_OK, "save world: %s: %s", dl_strstatus(st), dl_errmsg());
}

static void assert_saved(const save_job *j)
{
    for (int r = 0; r < j->tp * j->dp; r++)
        ck_assert_msg(j->status[r] == DL_OK, "save rank %d: %s: %s", r, dl_strstatus(j->status[r]),
                      j->msg[r]);
    ck_assert_msg(count_tmp() == 0, "a temporary file was left in %s", g_dir);
}

typedef struct load_job {
    dl_gpt_config cfg;
    int tp, dsize, file_dsize;
    uint64_t seed;
    char path[512];
    dl_ckpt_verify verify;
    int status[NMAX];
    char msg[NMAX][MSG];
    long wrong[NMAX];
    dl_ckpt_info info[NMAX];
} load_job;

static int load_rank(dl_ctx *ctx, void *arg)
{
    load_job *j = arg;
    int r = dl_ctx_rank(ctx);
    dl_gpt_layout *l;
    int rc = dl_gpt_layout_create(&j->cfg, j->tp, r, &l);
    if (rc)
        return rc;
    size_t bytes = l->numel * (size_t)j->dsize;
    unsigned char *p = tu_alloc(bytes);
    if (!p)
        return dl_error(DL_ENOMEM, "test: no memory");
    memset(p, 0xff, bytes); /* NaN everywhere: an element the loader misses cannot match */
    j->status[r] = dl_ckpt_load_ex(j->path, l, p, j->dsize, j->verify, &j->info[r]);
    snprintf(j->msg[r], MSG, "%s", j->status[r] ? dl_errmsg() : "");
    if (!j->status[r]) {
        unsigned char *e = expected_params(l, j->file_dsize, j->dsize, j->seed);
        for (size_t i = 0; i < l->numel; i++)
            j->wrong[r] +=
                memcmp(p + i * (size_t)j->dsize, e + i * (size_t)j->dsize, (size_t)j->dsize) != 0;
        free(e);
    }
    free(p);
    dl_gpt_layout_destroy(l);
    return DL_OK;
}

static void run_load(load_job *j)
{
    int st = tu_run_world(j->tp, load_rank, j);
    ck_assert_msg(st == DL_OK, "load world: %s: %s", dl_strstatus(st), dl_errmsg());
}

static void load_and_compare(const char *path, dl_gpt_config cfg, int tp, int file_dsize, int dsize,
                             uint64_t seed)
{
    load_job *j = calloc(1, sizeof *j);
    ck_assert(j != NULL);
    j->cfg = cfg;
    j->tp = tp;
    j->dsize = dsize;
    j->file_dsize = file_dsize;
    j->seed = seed;
    j->verify = DL_CKPT_VERIFY_AUTO;
    snprintf(j->path, sizeof j->path, "%s", path);
    run_load(j);
    for (int r = 0; r < tp; r++) {
        ck_assert_msg(j->status[r] == DL_OK, "load tp %d rank %d (f%d from f%d): %s: %s", tp, r,
                      8 * dsize, 8 * file_dsize, dl_strstatus(j->status[r]), j->msg[r]);
        ck_assert_msg(j->wrong[r] == 0,
                      "load tp %d rank %d (f%d from f%d): %ld elements differ "
                      "from dl_gpt_init of this layout",
                      tp, r, 8 * dsize, 8 * file_dsize, j->wrong[r]);
        ck_assert_int_eq(j->info[r].checksum_verified, r == 0);
        ck_assert_int_eq(j->info[r].converted, file_dsize != dsize);
        ck_assert_int_eq(j->info[r].dsize, file_dsize);
    }
    free(j);
}

/* ------------------------------------------------------------------------------------------ */
/* the test's own reader                                                                        */

/* Position just after `"name":` in the header, or NULL. */
static const char *find_key(const char *hdr, const char *name)
{
    char key[128];
    snprintf(key, sizeof key, "\"%s\":", name);
    return strstr(hdr, key) ? strstr(hdr, key) + strlen(key) : NULL;
}

/* Check the file against the single-rank model (cfg, precision ds, seed). Returns "" or why. */
static void check_file(const char *path, dl_gpt_config cfg, int ds, uint64_t seed, char *why,
                       size_t nwhy)
{
    why[0] = '\0';
    size_t len;
    unsigned char *f = slurp(path, &len);
    if (!f) {
        snprintf(why, nwhy, "cannot read %s", path);
        return;
    }
    dl_gpt_layout *l = NULL;
    void *ref = NULL;
    char *hdr = NULL;
    if (len < 8) {
        snprintf(why, nwhy, "file of %zu bytes", len);
        goto out;
    }
    uint64_t N = get_le64(f);
    if (N % 8 || 8 + N > len) {
        snprintf(why, nwhy, "header length %" PRIu64 " (file %zu bytes)", N, len);
        goto out;
    }
    hdr = malloc(N + 1);
    memcpy(hdr, f + 8, N);
    hdr[N] = '\0';
    if (strlen(hdr) != N) {
        snprintf(why, nwhy, "NUL byte in the header");
        goto out;
    }
    size_t end = N;
    while (end > 0 && hdr[end - 1] == ' ') end--;
    if (end == 0 || hdr[0] != '{' || hdr[end - 1] != '}') {
        snprintf(why, nwhy, "header is not one object padded with spaces");
        goto out;
    }
    if (dl_gpt_layout_create(&cfg, 1, 0, &l)) {
        snprintf(why, nwhy, "layout: %s", dl_errmsg());
        goto out;
    }
    ref = tu_alloc(l->numel * (size_t)ds);
    dl_gpt_init(l, ref, ds, seed);
    const unsigned char *data = f + 8 + N;
    uint64_t pos = 0;
    int count = 0;
    for (const char *s = hdr; (s = strstr(s, "\"data_offsets\"")); s++) count++;
    if (count != l->ntensors) {
        snprintf(why, nwhy, "%d tensors in the header, expected %d", count, l->ntensors);
        goto out;
    }
    for (int k = 0; k < l->ntensors; k++) {
        const dl_tensor_info *t = &l->t[k];
        const char *e = find_key(hdr, t->name);
        char dt[8];
        long long s0 = -1, s1 = -1;
        unsigned long long b = 0, en = 0;
        int n;
        if (!e || sscanf(e, "{\"dtype\":\"%7[^\"]\",\"shape\":[%lld%n", dt, &s0, &n) != 2) {
            snprintf(why, nwhy, "%s: entry missing or not {\"dtype\":..,\"shape\":[..", t->name);
            goto out;
        }
        e += n;
        if (*e == ',') {
            if (sscanf(e, ",%lld%n", &s1, &n) != 1)
                break;
            e += n;
        }
        if (sscanf(e, "],\"data_offsets\":[%llu,%llu]}", &b, &en) != 2) {
            snprintf(why, nwhy, "%s: data_offsets not found", t->name);
            goto out;
        }
        if (strcmp(dt, ds == 8 ? "F64" : "F32")) {
            snprintf(why, nwhy, "%s: dtype %s", t->name, dt);
            goto out;
        }
        if (s0 != t->shape[0] || (t->ndim == 2 ? s1 != t->shape[1] : s1 != -1)) {
            snprintf(why, nwhy, "%s: shape [%lld, %lld], expected [%lld, %lld] (ndim %d)", t->name,
                     s0, s1, (long long)t->shape[0], (long long)t->shape[1], t->ndim);
            goto out;
        }
        uint64_t bytes = (uint64_t)(t->shape[0] * t->shape[1]) * (uint64_t)ds;
        if (b != pos || en != pos + bytes) {
            snprintf(why, nwhy,
                     "%s: data_offsets [%llu, %llu], expected [%" PRIu64 ", %" PRIu64
                     "] (contiguous, layout order)",
                     t->name, b, en, pos, pos + bytes);
            goto out;
        }
        if (memcmp(data + b, (char *)ref + t->offset * (size_t)ds, bytes)) {
            snprintf(why, nwhy, "%s: data differ from the single-rank weights", t->name);
            goto out;
        }
        pos = en;
    }
    if (8 + N + pos != len) {
        snprintf(why, nwhy, "data end at %" PRIu64 " but the file has %zu bytes", 8 + N + pos, len);
        goto out;
    }
    const char *m = find_key(hdr, "__metadata__");
    char cfgs[160], want[160];
    snprintf(cfgs, sizeof cfgs,
             "\"config\":\"layers=%d,d_model=%d,heads=%d,seq=%d,vocab=%d,tie=%d\"", cfg.layers,
             cfg.d_model, cfg.heads, cfg.seq, cfg.vocab, cfg.tie);
    snprintf(want, sizeof want, "\"checksum\":\"%016" PRIx64 "\"", fnv(data, pos));
    if (!m || !strstr(m, "\"format\":\"distlab-gpt\"") || !strstr(m, "\"version\":\"1\"") ||
        !strstr(m, cfgs) || !strstr(m, ds == 8 ? "\"dtype\":\"F64\"" : "\"dtype\":\"F32\"")) {
        snprintf(why, nwhy, "metadata: %.300s", m ? m : "(none)");
        goto out;
    }
    if (!strstr(m, want)) {
        snprintf(why, nwhy, "checksum: expected %s in %.300s", want, m);
        goto out;
    }
out:
    free(hdr);
    free(ref);
    dl_gpt_layout_destroy(l);
    free(f);
}

#define ASSERT_FILE_OK(path, cfg, ds, seed)                                                        \
    do {                                                                                           \
        char why_[1024];                                                                           \
        check_file(path, cfg, ds, seed, why_, sizeof why_);                                        \
        ck_assert_msg(why_[0] == '\0', "%s: %s", path, why_);                                      \
    } while (0)

/* Optional: tests/ref/ckpt_check.py (srcdir from the test harness, or the build's parent). */
static void python_check(const char *path, dl_gpt_config cfg)
{
    const char *src = getenv("srcdir");
    char script[1024], cmd[2600];
    snprintf(script, sizeof script, "%s/tests/ckpt_check.py", src ? src : "..");
    if (access(script, R_OK) || system("python3 -c '' >/dev/null 2>&1"))
        return; /* skipped */
    snprintf(cmd, sizeof cmd,
             "python3 '%s' '%s' --config 'layers=%d,d_model=%d,heads=%d,seq=%d,"
             "vocab=%d,tie=%d' >/dev/null",
             script, path, cfg.layers, cfg.d_model, cfg.heads, cfg.seq, cfg.vocab, cfg.tie);
    int rc = system(cmd);
    ck_assert_msg(rc != -1 && WIFEXITED(rc) && (WEXITSTATUS(rc) == 0 || WEXITSTATUS(rc) == 77),
                  "%s failed (status %d)", cmd, rc);
}

/* ------------------------------------------------------------------------------------------ */
/* round trips                                                                                  */

typedef struct rt_case {
    int heads, tp_save, dp_save, group_mode, tie;
    int load_tp[3];
} rt_case;

static const rt_case rt_cases[] = {
    {4, 2, 1, 0, 0, {1, 4, 2}}, /* tp 2 -> tp 1, 4, 2 */
    {8, 4, 1, 0, 0, {1, 2, 8}}, /* tp 4 (8 heads) -> tp 1, 2, 8 */
    {4, 2, 2, 0, 0, {1, 4, 0}}, /* dp 2 x tp 2, world group, dp replica 1 does not write */
    {4, 2, 2, 1, 1, {1, 2, 0}}, /* dp 2 x tp 2, tp group of replica 0, tied head */
    {4, 1, 1, 0, 0, {2, 4, 0}}, /* tp 1 -> tp 2, 4 */
};
#define NRT ((int)(sizeof rt_cases / sizeof rt_cases[0]))

START_TEST(t_roundtrip)
{
    const rt_case *c = &rt_cases[_i / 2];
    int ds = _i % 2 ? 8 : 4;
    mk_dir();
    dl_gpt_config cfg = cfg_make(50, 12, 2, 32, c->heads, c->tie);
    save_job *j = malloc(sizeof *j);
    save_job_init(j, cfg, c->tp_save, c->dp_save, ds, 1234 + (uint64_t)_i, "model.safetensors");
    j->group_mode = c->group_mode;
    run_save(j);
    assert_saved(j);
    ASSERT_FILE_OK(j->path, cfg, ds, j->seed);
    for (int k = 0; k < 3 && c->load_tp[k]; k++) {
        load_and_compare(j->path, cfg, c->load_tp[k], ds, ds, j->seed);
        load_and_compare(j->path, cfg, c->load_tp[k], ds, 12 - ds, j->seed); /* other precision */
    }
    dl_ckpt_info info;
    ck_assert_msg(dl_ckpt_inspect(j->path, &info) == DL_OK, "%s", dl_errmsg());
    ck_assert_int_eq(info.has_config, 1);
    ck_assert_int_eq(info.cfg.heads, cfg.heads);
    ck_assert_int_eq(info.cfg.tie, cfg.tie);
    ck_assert_int_eq(info.cfg.seq, cfg.seq);
    ck_assert_int_eq(info.dsize, ds);
    ck_assert_int_eq(info.has_checksum, 1);
    ck_assert_int_eq(info.ntensors, 2 + 12 * cfg.layers + 2 + !cfg.tie);
    ck_assert_int_eq(info.header_bytes % 8, 0);
    ck_assert_int_eq(info.data_bytes, dl_gpt_num_params(&cfg) * ds);
    if (_i == 0)
        python_check(j->path, cfg);
    free(j);
    rm_dir();
}
END_TEST

/* Larger tensors than the 1 MiB staging buffer (conversion in several chunks), saved twice to
 * the same path (the second replaces the first). */
START_TEST(t_large_and_overwrite)
{
    mk_dir();
    dl_gpt_config cfg = cfg_make(256, 64, 1, DL_TEST_SMALL ? 128 : 256, 4, 0);
    save_job *j = malloc(sizeof *j);
    save_job_init(j, cfg, 2, 1, 8, 7, "big.safetensors");
    run_save(j);
    assert_saved(j);
    j->seed = 8;
    run_save(j);
    assert_saved(j);
    ASSERT_FILE_OK(j->path, cfg, 8, 8);
    load_and_compare(j->path, cfg, 1, 8, 4, 8);
    load_and_compare(j->path, cfg, 4, 8, 8, 8);
    free(j);
    rm_dir();
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* corrupt and mismatched files                                                                 */

static dl_gpt_config small_cfg(void) { return cfg_make(40, 8, 2, 16, 4, 0); }

/* Load `path` on the test thread with a tp 1 (or tp_rank 1 of 2) layout; expect failure with
 * every needle in the message. */
static void expect_load_fail(const char *path, dl_gpt_config cfg, int tp, int tp_rank,
                             dl_ckpt_verify v, const char *n1, const char *n2, const char *n3)
{
    dl_gpt_layout *l;
    ck_assert(dl_gpt_layout_create(&cfg, tp, tp_rank, &l) == DL_OK);
    float *p = tu_alloc(l->numel * 4);
    int st = dl_ckpt_load_ex(path, l, p, 4, v, NULL);
    const char *m = dl_errmsg();
    ck_assert_msg(st != DL_OK, "loading %s succeeded; expected an error with \"%s\"", path, n1);
    ck_assert_msg(strstr(m, path) != NULL, "message does not name the file: %s", m);
    ck_assert_msg(!n1 || strstr(m, n1), "message lacks \"%s\": %s", n1, m);
    ck_assert_msg(!n2 || strstr(m, n2), "message lacks \"%s\": %s", n2, m);
    ck_assert_msg(!n3 || strstr(m, n3), "message lacks \"%s\": %s", n3, m);
    free(p);
    dl_gpt_layout_destroy(l);
}

static int load_ok(const char *path, dl_gpt_config cfg, int tp, int tp_rank, dl_ckpt_verify v)
{
    dl_gpt_layout *l;
    ck_assert(dl_gpt_layout_create(&cfg, tp, tp_rank, &l) == DL_OK);
    float *p = tu_alloc(l->numel * 4);
    int st = dl_ckpt_load_ex(path, l, p, 4, v, NULL);
    free(p);
    dl_gpt_layout_destroy(l);
    return st;
}

/* Copy `src` to `dst` with the first occurrence of `from` in the header replaced by `to`, the
 * header re-padded to a multiple of 8 and its length rewritten. */
static void rewrite_header(const char *src, const char *dst, const char *from, const char *to)
{
    size_t len;
    unsigned char *f = slurp(src, &len);
    ck_assert(f != NULL);
    uint64_t N = get_le64(f);
    char *h = calloc(N + strlen(to) + 16, 1);
    memcpy(h, f + 8, N);
    char *at = strstr(h, from);
    ck_assert_msg(at != NULL, "\"%s\" not in the header", from);
    size_t pre = (size_t)(at - h), fl = strlen(from), tl = strlen(to);
    char *nh = calloc(N + tl + 16, 1);
    memcpy(nh, h, pre);
    memcpy(nh + pre, to, tl);
    memcpy(nh + pre + tl, h + pre + fl, N - pre - fl);
    size_t M = N - fl + tl;
    while (M > 0 && nh[M - 1] == ' ') M--;
    while (M % 8) nh[M++] = ' ';
    unsigned char *out = malloc(8 + M + (len - 8 - N));
    put_le64(out, M);
    memcpy(out + 8, nh, M);
    memcpy(out + 8 + M, f + 8 + N, len - 8 - N);
    spit(dst, out, 8 + M + (len - 8 - N));
    free(out);
    free(nh);
    free(h);
    free(f);
}

START_TEST(t_corrupt)
{
    mk_dir();
    dl_gpt_config cfg = small_cfg();
    save_job *j = malloc(sizeof *j);
    save_job_init(j, cfg, 2, 1, 4, 99, "good.safetensors");
    run_save(j);
    assert_saved(j);
    ck_assert_int_eq(load_ok(j->path, cfg, 1, 0, DL_CKPT_VERIFY_ALWAYS), DL_OK);
    size_t len;
    unsigned char *f = slurp(j->path, &len);
    ck_assert(f != NULL);
    uint64_t N = get_le64(f);
    char p[600];

    /* missing file */
    in_dir(p, sizeof p, "absent.safetensors");
    expect_load_fail(p, cfg, 1, 0, DL_CKPT_VERIFY_AUTO, "cannot open", NULL, NULL);

    /* truncated: data cut short; and cut inside the header; and shorter than 8 bytes */
    in_dir(p, sizeof p, "trunc.safetensors");
    spit(p, f, len - 100);
    expect_load_fail(p, cfg, 1, 0, DL_CKPT_VERIFY_NEVER, "truncated", NULL, NULL);
    spit(p, f, 8 + N / 2);
    expect_load_fail(p, cfg, 1, 0, DL_CKPT_VERIFY_NEVER, "exceeds the file", NULL, NULL);
    spit(p, f, 5);
    expect_load_fail(p, cfg, 1, 0, DL_CKPT_VERIFY_NEVER, "too short", NULL, NULL);

    /* extra bytes after the data */
    in_dir(p, sizeof p, "long.safetensors");
    {
        unsigned char *g = calloc(len + 16, 1);
        memcpy(g, f, len);
        spit(p, g, len + 16);
        free(g);
    }
    expect_load_fail(p, cfg, 1, 0, DL_CKPT_VERIFY_NEVER, "after the last tensor", NULL, NULL);

    /* bad JSON: ':' after a key replaced; a header length far beyond the file; trailing junk;
     * a negative number; a duplicate key; a non-string metadata value */
    in_dir(p, sizeof p, "json.safetensors");
    {
        unsigned char *g = malloc(len);
        memcpy(g, f, len);
        char *c = strstr((char *)g + 8, "\"data_offsets\":");
        ck_assert(c != NULL);
        c[strlen("\"data_offsets\"")] = '=';
        spit(p, g, len);
        expect_load_fail(p, cfg, 1, 0, DL_CKPT_VERIFY_NEVER, "malformed header", "':'", NULL);
        memcpy(g, f, len);
        put_le64(g, (uint64_t)1 << 40);
        spit(p, g, len);
        expect_load_fail(p, cfg, 1, 0, DL_CKPT_VERIFY_NEVER, "header length", NULL, NULL);
        memcpy(g, f, len);
        g[8 + N - 1] = 'x'; /* last header byte: padding or the closing brace */
        spit(p, g, len);
        expect_load_fail(p, cfg, 1, 0, DL_CKPT_VERIFY_NEVER, "malformed header", NULL, NULL);
        free(g);
    }
    rewrite_header(j->path, p, "\"shape\":[40,", "\"shape\":[-40,");
    expect_load_fail(p, cfg, 1, 0, DL_CKPT_VERIFY_NEVER, "malformed header", "integer", NULL);
    rewrite_header(j->path, p, "\"dtype\":\"F32\",\"shape\"",
                   "\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\"");
    expect_load_fail(p, cfg, 1, 0, DL_CKPT_VERIFY_NEVER, "malformed header", "duplicate", NULL);
    rewrite_header(j->path, p, "\"version\":\"1\"", "\"version\":1");
    expect_load_fail(p, cfg, 1, 0, DL_CKPT_VERIFY_NEVER, "malformed header", "strings", NULL);
    rewrite_header(j->path, p, "\"wpe.weight\":{", "\"wpe.weight\":{\"x\":1,");
    expect_load_fail(p, cfg, 1, 0, DL_CKPT_VERIFY_NEVER, "malformed header", "unknown key", NULL);

    /* unsupported dtype; inconsistent data_offsets; foreign format; bad checksum field */
    rewrite_header(j->path, p, "\"dtype\":\"F32\",\"shape\":[40,16]",
                   "\"dtype\":\"BF16\",\"shape\":[40,16]");
    expect_load_fail(p, cfg, 1, 0, DL_CKPT_VERIFY_NEVER, "wte.weight", "BF16", NULL);
    rewrite_header(j->path, p, "\"shape\":[8,16]", "\"shape\":[9,16]");
    expect_load_fail(p, cfg, 1, 0, DL_CKPT_VERIFY_NEVER, "wpe.weight", "data_offsets", NULL);
    rewrite_header(j->path, p, "\"format\":\"distlab-gpt\"", "\"format\":\"other\"");
    expect_load_fail(p, cfg, 1, 0, DL_CKPT_VERIFY_NEVER, "format", "other", NULL);
    rewrite_header(j->path, p, "\"checksum\":\"", "\"checksum\":\"zz");
    expect_load_fail(p, cfg, 1, 0, DL_CKPT_VERIFY_NEVER, "checksum", NULL, NULL);

    /* checksum mismatch: one data byte flipped */
    in_dir(p, sizeof p, "flip.safetensors");
    {
        unsigned char *g = malloc(len);
        memcpy(g, f, len);
        g[8 + N + (len - 8 - N) / 2] ^= 0x10;
        spit(p, g, len);
        free(g);
    }
    expect_load_fail(p, cfg, 1, 0, DL_CKPT_VERIFY_ALWAYS, "checksum mismatch", NULL, NULL);
    expect_load_fail(p, cfg, 2, 0, DL_CKPT_VERIFY_AUTO, "checksum mismatch", NULL, NULL);
    ck_assert_int_eq(load_ok(p, cfg, 2, 1, DL_CKPT_VERIFY_AUTO), DL_OK); /* tp_rank 1: no check */
    ck_assert_int_eq(load_ok(p, cfg, 1, 0, DL_CKPT_VERIFY_NEVER), DL_OK);
    {
        dl_gpt_layout *l;
        ck_assert(dl_gpt_layout_create(&cfg, 1, 0, &l) == DL_OK);
        float *q = tu_alloc(l->numel * 4);
        ck_assert_int_ne(dl_ckpt_load(p, l, q, 4), DL_OK);
        free(q);
        dl_gpt_layout_destroy(l);
    }

    /* the library's header reader also agrees on the good file */
    dl_ckpt_info info;
    ck_assert_int_eq(dl_ckpt_inspect(j->path, &info), DL_OK);
    ck_assert_uint_eq(info.checksum, fnv(f + 8 + N, len - 8 - N));
    free(f);
    free(j);
    rm_dir();
}
END_TEST

/* Weights that are NaN or infinite (saved as written, with a correct checksum) are refused at
 * load, naming the tensor; the same file without the poison loads (negative control). */
START_TEST(t_nonfinite)
{
    mk_dir();
    dl_gpt_config cfg = small_cfg();
    dl_gpt_layout *l;
    ck_assert(dl_gpt_layout_create(&cfg, 1, 0, &l) == DL_OK);
    char name[64];
    snprintf(name, sizeof name, "%s", l->t[1].name);
    dl_gpt_layout_destroy(l);
    const double poisons[] = {NAN, INFINITY, -INFINITY, 0};
    for (int i = 0; i < 4; i++) {
        save_job *j = malloc(sizeof *j);
        save_job_init(j, cfg, 1, 1, 4, 5, "poisoned.safetensors");
        j->poison = poisons[i];
        run_save(j);
        assert_saved(j);
        if (poisons[i] != 0)
            expect_load_fail(j->path, cfg, 1, 0, DL_CKPT_VERIFY_ALWAYS, "non-finite value", name,
                             "element 3");
        else
            ck_assert_int_eq(load_ok(j->path, cfg, 1, 0, DL_CKPT_VERIFY_ALWAYS), DL_OK);
        free(j);
    }
    rm_dir();
}
END_TEST

START_TEST(t_mismatch)
{
    mk_dir();
    dl_gpt_config cfg = small_cfg();
    save_job *j = malloc(sizeof *j);
    save_job_init(j, cfg, 2, 1, 4, 5, "m.safetensors");
    run_save(j);
    assert_saved(j);

    /* wrong shapes: another context length, another width, another vocabulary */
    dl_gpt_config c2 = cfg;
    c2.seq = 16;
    expect_load_fail(j->path, c2, 1, 0, DL_CKPT_VERIFY_NEVER, "wpe.weight", "[8, 16]", "[16, 16]");
    c2 = cfg;
    c2.vocab = 41;
    expect_load_fail(j->path, c2, 2, 1, DL_CKPT_VERIFY_NEVER, "wte.weight", "[40, 16]", "[41, 16]");
    c2 = cfg;
    c2.d_model = 32;
    expect_load_fail(j->path, c2, 1, 0, DL_CKPT_VERIFY_NEVER, "wte.weight", "[40, 16]", "[40, 32]");
    /* missing tensors (more layers), extra tensors (fewer layers, tied head) */
    c2 = cfg;
    c2.layers = 3;
    expect_load_fail(j->path, c2, 1, 0, DL_CKPT_VERIFY_NEVER, "h.2.ln_1.weight", "no tensor", NULL);
    c2 = cfg;
    c2.layers = 1;
    expect_load_fail(j->path, c2, 1, 0, DL_CKPT_VERIFY_NEVER, "h.1.ln_1.weight", "not part", NULL);
    c2 = cfg;
    c2.tie = 1;
    expect_load_fail(j->path, c2, 1, 0, DL_CKPT_VERIFY_NEVER, "lm_head.weight", "not part", NULL);
    /* heads: same shapes, other config */
    c2 = cfg;
    c2.heads = 2;
    expect_load_fail(j->path, c2, 1, 0, DL_CKPT_VERIFY_NEVER, "heads=4", "heads=2", NULL);
    free(j);
    rm_dir();
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* save failures: every rank returns an error, nobody hangs, nothing is left behind             */

static void assert_all_failed(const save_job *j, int nranks, int want, const char *needle0)
{
    for (int r = 0; r < nranks; r++) {
        ck_assert_msg(j->status[r] != DL_OK && j->status[r] != -1,
                      "rank %d returned %s, expected an error", r, dl_strstatus(j->status[r]));
        if (want >= 0)
            ck_assert_msg(j->status[r] == want, "rank %d: %s (%s), expected %s", r,
                          dl_strstatus(j->status[r]), j->msg[r], dl_strstatus(want));
        ck_assert_msg(strstr(j->msg[r], j->path) != NULL,
                      "rank %d message does not name the file: %s", r, j->msg[r]);
    }
    if (needle0)
        ck_assert_msg(strstr(j->msg[0], needle0) != NULL, "rank 0 message lacks \"%s\": %s",
                      needle0, j->msg[0]);
    /* nobody hung: a save still waiting would have ended the world by its watchdog
     * (DL_ETIMEOUT), which the callers' world status rejects */
    ck_assert_msg(count_tmp() == 0, "a temporary file was left in %s", g_dir);
}

START_TEST(t_create_fails)
{
    mk_dir();
    save_job *j = malloc(sizeof *j);
    save_job_init(j, small_cfg(), 2, 2, 4, 1, "no/such/dir/model.safetensors");
    run_save(j);
    assert_all_failed(j, 4, DL_ESYS, "cannot write");
    for (int r = 1; r < 4; r++)
        ck_assert_msg(strstr(j->msg[r], "rank 0") != NULL, "rank %d: %s", r, j->msg[r]);
    free(j);
    rm_dir();
}
END_TEST

/* The save replaces PATH by a rename: a FIFO or a symlink there is refused (every rank), and
 * left as it was, not replaced by a regular file. */
START_TEST(t_refuses_non_regular)
{
    mk_dir();
    save_job *j = malloc(sizeof *j);
    save_job_init(j, small_cfg(), 2, 2, 4, 1, "fifo.safetensors");
    ck_assert_int_eq(mkfifo(j->path, 0600), 0);
    run_save(j);
    assert_all_failed(j, 4, DL_EINVAL, "is a FIFO; refusing to replace it");
    struct stat sb;
    ck_assert(lstat(j->path, &sb) == 0 && S_ISFIFO(sb.st_mode));
    char target[600];
    snprintf(target, sizeof target, "%s", j->path);
    save_job_init(j, small_cfg(), 2, 2, 4, 1, "link.safetensors");
    ck_assert_int_eq(symlink(target, j->path), 0);
    run_save(j);
    assert_all_failed(j, 4, DL_EINVAL, "is a symbolic link");
    ck_assert(lstat(j->path, &sb) == 0 && S_ISLNK(sb.st_mode));
    free(j);
    rm_dir();
}
END_TEST

/* A file size limit (EFBIG, like a full disk) while an older checkpoint is at the path: every
 * rank fails, the old file is intact, no temporary is left. */
START_TEST(t_size_limit_keeps_old)
{
    mk_dir();
    dl_gpt_config cfg = small_cfg();
    save_job *j = malloc(sizeof *j);
    save_job_init(j, cfg, 2, 1, 4, 3, "keep.safetensors");
    run_save(j);
    assert_saved(j);
    size_t len0;
    unsigned char *old = slurp(j->path, &len0);
    ck_assert(old != NULL);

    struct rlimit rl0, rl;
    ck_assert(getrlimit(RLIMIT_FSIZE, &rl0) == 0);
    void (*h0)(int) = signal(SIGXFSZ, SIG_IGN);
    rl = rl0;
    rl.rlim_cur = 4096;
    ck_assert(setrlimit(RLIMIT_FSIZE, &rl) == 0);
    j->seed = 4;
    int st = tu_run_world(2, save_rank, j);
    setrlimit(RLIMIT_FSIZE, &rl0);
    signal(SIGXFSZ, h0);
    ck_assert_msg(st == DL_OK, "%s", dl_errmsg());
    assert_all_failed(j, 2, DL_ESYS, NULL);
    ck_assert_msg(strstr(j->msg[0], "File too large") != NULL, "%s", j->msg[0]);

    size_t len1;
    unsigned char *now = slurp(j->path, &len1);
    ck_assert(now != NULL);
    ck_assert_msg(len1 == len0 && !memcmp(old, now, len0), "the old checkpoint changed");
    free(old);
    free(now);
    free(j);
    rm_dir();
}
END_TEST

START_TEST(t_group_disagrees)
{
    mk_dir();
    save_job *j = malloc(sizeof *j);
    /* one rank with another config */
    save_job_init(j, small_cfg(), 2, 2, 4, 1, "a.safetensors");
    j->odd_cfg_rank = 3;
    run_save(j);
    assert_all_failed(j, 4, DL_EINVAL, "disagree");
    /* a tp rank nobody writes */
    save_job_init(j, small_cfg(), 2, 2, 4, 1, "b.safetensors");
    j->writer_mode = 1;
    run_save(j);
    assert_all_failed(j, 4, DL_EINVAL, "tp rank 1");
    /* a bad argument on one rank */
    save_job_init(j, small_cfg(), 2, 1, 8, 1, "c.safetensors");
    j->bad_dsize_rank = 1;
    run_save(j);
    assert_all_failed(j, 2, DL_EINVAL, "rank 1");
    ck_assert_msg(strstr(j->msg[1], "element size 2") != NULL, "%s", j->msg[1]);
    /* none of the targets exists */
    char p[600];
    in_dir(p, sizeof p, "a.safetensors");
    ck_assert(access(p, F_OK) != 0);
    in_dir(p, sizeof p, "c.safetensors");
    ck_assert(access(p, F_OK) != 0);
    /* every rank writing (dp replicas too) is allowed: they write the same bytes */
    save_job_init(j, small_cfg(), 2, 2, 8, 11, "d.safetensors");
    j->writer_mode = 2;
    run_save(j);
    assert_saved(j);
    ASSERT_FILE_OK(j->path, small_cfg(), 8, 11);
    free(j);
    rm_dir();
}
END_TEST

START_TEST(t_fnv)
{
    /* FNV-1a 64 reference values */
    ck_assert_uint_eq(dl_ckpt_fnv1a64(DL_CKPT_FNV_INIT, "", 0), 0xcbf29ce484222325ull);
    ck_assert_uint_eq(dl_ckpt_fnv1a64(DL_CKPT_FNV_INIT, "a", 1), 0xaf63dc4c8601ec8cull);
    ck_assert_uint_eq(dl_ckpt_fnv1a64(DL_CKPT_FNV_INIT, "foobar", 6), 0x85944171f73967e8ull);
    ck_assert_uint_eq(dl_ckpt_fnv1a64(dl_ckpt_fnv1a64(DL_CKPT_FNV_INIT, "foo", 3), "bar", 3),
                      0x85944171f73967e8ull);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */

static Suite *ckpt_suite(void)
{
    Suite *s = suite_create("ckpt");
    TCase *tc = tcase_create("ckpt");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, t_fnv);
    tcase_add_loop_test(tc, t_roundtrip, 0, 2 * NRT);
    tcase_add_test(tc, t_large_and_overwrite);
    tcase_add_test(tc, t_corrupt);
    tcase_add_test(tc, t_mismatch);
    tcase_add_test(tc, t_create_fails);
    tcase_add_test(tc, t_nonfinite);
    tcase_add_test(tc, t_refuses_non_regular);
    tcase_add_test(tc, t_size_limit_keeps_old);
    tcase_add_test(tc, t_group_disagrees);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(ckpt_suite());
    srunner_run_all(sr, CK_ENV);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
