#define _GNU_SOURCE
/* Full-state checkpoints: a writer's safetensors file and the collective, atomic save of a
 * checkpoint directory (lib/io/ckdir.h describes the protocol). */
#include "config.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "distlab.h"
#include "core/crc32c.h"
#include "core/testhook.h"
#include "io/ckdir.h"
#include "io/ckpt_priv.h"

void dl__ckd_shard_init(dl__ckd_shard *s)
{
    memset(s, 0, sizeof *s);
    s->hdr = json_object();
    s->pieces = json_object();
}

void dl__ckd_shard_free(dl__ckd_shard *s)
{
    json_decref(s->hdr);
    json_decref(s->pieces);
    free(s->data), free(s->bytes);
    memset(s, 0, sizeof *s);
}

int dl__ckd_shard_add(dl__ckd_shard *s, const char *name, const char *dtype, int ndim,
                      const int64_t *shape, const void *data, size_t bytes, json_t *piece)
{
    if (!s->hdr || !s->pieces)
        return json_decref(piece), dl_error(DL_ENOMEM, "checkpoint: out of memory");
    if (json_object_get(s->hdr, name))
        return json_decref(piece), dl_error(DL_EINVAL, "checkpoint: tensor '%s' twice", name);
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 64;
        const void **d = realloc(s->data, sizeof *d * (size_t)cap);
        if (d)
            s->data = d;
        size_t *b = realloc(s->bytes, sizeof *b * (size_t)cap);
        if (b)
            s->bytes = b;
        if (!d || !b)
            return json_decref(piece), dl_error(DL_ENOMEM, "checkpoint: out of memory");
        s->cap = cap;
    }
    json_t *sh = json_array();
    for (int d = 0; d < ndim; d++) json_array_append_new(sh, json_integer(shape[d]));
    json_t *t = json_pack("{s:s, s:o, s:[I, I]}", "dtype", dtype, "shape", sh, "data_offsets",
                          (json_int_t)s->off, (json_int_t)(s->off + bytes));
    if (!t || json_object_set_new(s->hdr, name, t) ||
        (piece && json_object_set_new(s->pieces, name, piece)))
        return dl_error(DL_ENOMEM, "checkpoint: out of memory");
    s->data[s->n] = data;
    s->bytes[s->n++] = bytes;
    s->off += bytes;
    return DL_OK;
}

void dl__ckd_shard_snapshot(dl__ckd_shard *s, void *buf)
{
    char *p = buf;
    for (int i = 0; i < s->n; i++) {
        memcpy(p, s->data[i], s->bytes[i]);
        s->data[i] = p;
        p += s->bytes[i];
    }
}

/* A boundary of the save of `step` (before or after a write, an fsync, a rename): the test hook's
 * crash points count them and _exit at the chosen one (core/testhook.h). Always 0. */
static int point(int step)
{
    dl__test_hook *h = dl__test_hook_get();
    if (!h || h->ckpt_crash_step != step)
        return 0;
    int k = atomic_fetch_add(&h->ckpt_points, 1) + 1;
    if (k == h->ckpt_crash_at)
        _exit(99); /* a crash here: what is on disk stays as it is */
    return 0;
}

/* the test hook fails this rank's file write of this step's save with ENOSPC */
static int disk_full(int step, int rank)
{
    dl__test_hook *h = dl__test_hook_get();
    return h && h->ckpt_enospc_step == step && h->ckpt_enospc_rank == rank;
}

/* A shard file being written: its descriptor, the bytes so far and their CRC32C, and the
 * write-behind's progress. */
typedef struct out_file {
    int fd;
    uint64_t off;     /* bytes written */
    uint64_t started; /* bytes whose writeback has been started */
    uint64_t dropped; /* bytes written back and dropped from the page cache */
    uint32_t crc;
} out_file;

enum {
    PUT_CHUNK = 256 << 10,   /* fits L2 */
    WB_CHUNK = 4 << 20,      /* the write-behind's unit */
    WB_WINDOW = 8 * WB_CHUNK /* written but not yet dropped, at most (plus a unit) */
};

/* Write-behind: each WB_CHUNK written is handed to writeback at once, and the one WB_WINDOW
 * behind it, on disk by then or waited for, is dropped from the page cache. The final fsync
 * then waits for the last window only, and the save dirties at most a window of memory (on the
 * 2-vCPU guest a page the page cache has not held before costs the host a fault: writing a
 * 277 MiB file into fresh pages took 2-3 times as long as into recycled ones). A hint: the
 * fsync that follows reports what failed. */
static void write_behind(out_file *o)
{
#ifdef SYNC_FILE_RANGE_WRITE
    while (o->off - o->started >= WB_CHUNK) {
        sync_file_range(o->fd, (off_t)o->started, WB_CHUNK, SYNC_FILE_RANGE_WRITE);
        o->started += WB_CHUNK;
    }
    while (o->started - o->dropped > WB_WINDOW) {
        sync_file_range(o->fd, (off_t)o->dropped, WB_CHUNK,
                        SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                            SYNC_FILE_RANGE_WAIT_AFTER);
        posix_fadvise(o->fd, (off_t)o->dropped, WB_CHUNK, POSIX_FADV_DONTNEED);
        o->dropped += WB_CHUNK;
    }
#else
    (void)o;
#endif
}

/* write everything, adding to the CRC: a chunk at a time, so that the write copies what the
 * checksum has just brought into the cache (one pass over memory, not two) */
static int put(out_file *o, const void *p, size_t n)
{
    const char *b = p;
    while (n) {
        size_t c = n < PUT_CHUNK ? n : PUT_CHUNK;
        o->crc = dl__crc32c(o->crc, b, c);
        for (size_t done = 0; done < c;) {
            ssize_t k = write(o->fd, b + done, c - done);
            if (k < 0 && errno == EINTR)
                continue;
            if (k <= 0) {
                if (k == 0)
                    errno = ENOSPC;
                return -1;
            }
            done += (size_t)k;
        }
        b += c;
        n -= c;
        o->off += c;
        write_behind(o);
    }
    return 0;
}

/* The header: the tensors, then __metadata__ with the pieces (its values strings, as
 * safetensors requires), padded with spaces to a multiple of 8. */
static char *shard_header(dl__ckd_shard *s, uint64_t *N)
{
    char *pieces = json_dumps(s->pieces, JSON_COMPACT);
    json_t *meta = json_pack("{s:s, s:s, s:s}", "format", DL_CKD_FORMAT, "version", "1", "pieces",
                             pieces ? pieces : "");
    free(pieces);
    if (!meta || json_object_set_new(s->hdr, "__metadata__", meta))
        return NULL;
    char *h = json_dumps(s->hdr, JSON_COMPACT);
    json_object_del(s->hdr, "__metadata__");
    if (!h)
        return NULL;
    size_t n = strlen(h), pad = (8 - n % 8) % 8;
    char *p = realloc(h, n + pad + 1);
    if (!p)
        return free(h), NULL;
    memset(p + n, ' ', pad);
    p[n + pad] = '\0';
    *N = n + pad;
    return p;
}

/* Write the shard to path (created, fsync'd): its CRC32C and size. */
static int shard_write(dl__ckd_shard *s, const char *path, int step, int rank, uint32_t *crc,
                       uint64_t *size, ck_err *e)
{
    uint64_t N = 0;
    char *h = shard_header(s, &N);
    if (!h)
        return dl__ck_fail(e, DL_ENOMEM, "checkpoint '%s': out of memory", path), -1;
    out_file o = {.fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644)};
    unsigned char len[8];
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)(N >> (8 * i));
    int bad = o.fd < 0 || point(step) || put(&o, len, 8) || put(&o, h, N);
    if (!bad && disk_full(step, rank))
        bad = 1, errno = ENOSPC; /* a full disk part-way: the file is left short */
    for (int i = 0; !bad && i < s->n; i++) bad = put(&o, s->data[i], s->bytes[i]);
    if (!bad)
        bad = point(step) || point(step) || fsync(o.fd) || point(step);
    int err = errno;
    if (o.fd >= 0 && close(o.fd) && !bad)
        bad = 1, err = errno;
    *crc = o.crc;
    free(h);
    *size = 8 + N + s->off;
    if (bad)
        dl__ck_fail(e, DL_ESYS, "checkpoint: cannot write '%s': %s", path, dl__ck_errtext(err));
    return bad ? -1 : 0;
}

static int fsync_dir(const char *d)
{
    int fd = open(d, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

/* Remove a checkpoint directory (its plain files, then itself). */
static void rm_dir(const char *d)
{
    DIR *dd = opendir(d);
    struct dirent *de;
    char p[8192];
    while (dd && (de = readdir(dd)))
        if (de->d_name[0] != '.' || strncmp(de->d_name, ".tmp", 4) == 0) {
            snprintf(p, sizeof p, "%s/%s", d, de->d_name);
            unlink(p);
        }
    if (dd)
        closedir(dd);
    rmdir(d);
}

/* N of "step-N" (0 when the name is not that) */
static long step_of(const char *name)
{
    char *end;
    if (strncmp(name, "step-", 5) != 0 || name[5] < '0' || name[5] > '9')
        return 0;
    long v = strtol(name + 5, &end, 10);
    return *end ? 0 : v;
}

static int cmp_long(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

/* The complete checkpoints under d, ascending (malloc'd; *n of them). */
static long *list_steps(const char *d, int *n)
{
    DIR *dd = opendir(d);
    long *v = NULL;
    int cap = 0;
    *n = 0;
    struct dirent *de;
    while (dd && (de = readdir(dd))) {
        long s = step_of(de->d_name);
        if (s <= 0)
            continue;
        if (*n == cap) {
            long *w = realloc(v, sizeof *v * (size_t)(cap = cap ? 2 * cap : 16));
            if (!w)
                break;
            v = w;
        }
        v[(*n)++] = s;
    }
    if (dd)
        closedir(dd);
    if (v)
        qsort(v, (size_t)*n, sizeof *v, cmp_long);
    return v;
}

/* The temporaries of processes that no longer exist (.tmp-step-N.PID). */
static void remove_stale(const char *d)
{
    DIR *dd = opendir(d);
    struct dirent *de;
    char p[8192];
    while (dd && (de = readdir(dd))) {
        const char *dot =
            strncmp(de->d_name, ".tmp-step-", 10) == 0 ? strrchr(de->d_name, '.') : NULL;
        long pid = dot && dot > de->d_name ? strtol(dot + 1, NULL, 10) : 0;
        if (pid <= 0 || pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue;
        snprintf(p, sizeof p, "%s/%s", d, de->d_name);
        rm_dir(p);
    }
    if (dd)
        closedir(dd);
}

static void prune(const char *d, int keep)
{
    int n;
    long *v = list_steps(d, &n);
    char p[8192];
    for (int i = 0; keep > 0 && i < n - keep; i++) {
        snprintf(p, sizeof p, "%s/step-%07ld", d, v[i]);
        rm_dir(p);
    }
    free(v);
    if (keep > 0)
        fsync_dir(d);
}

/* Per rank: status, writer, crc, size, dp, tp, pp, skip (rank 0: already saved). */
enum { S_ST, S_WR, S_CRC, S_SIZE, S_DP, S_TP, S_PP, S_SKIP, S_N };

/* Every rank's slot summed: a rank fills only its own. 0, or -1 after setting e (this rank's
 * own error, or one naming the failing rank). */
static int sync_slots(const dl__ckd_save_args *a, double *v, ck_err *e, const char *where)
{
    int me = dl_comm_rank(a->world), n = dl_comm_size(a->world);
    v[(size_t)me * S_N + S_ST] = e->st;
    int rc = dl_allreduce(a->world, v, v, (size_t)n * S_N, DL_F64, DL_SUM, DL_PURPOSE_OTHER);
    if (rc)
        return dl__ck_fail(e, rc, "%s", dl_errmsg()), -1;
    int first = -1;
    for (int r = 0; r < n && first < 0; r++)
        if (v[(size_t)r * S_N + S_ST] != 0)
            first = r;
    if (first < 0)
        return 0;
    /* every rank reports the first failing rank's own message (its bytes, sent as floats) */
    float msg[sizeof e->msg / sizeof(float)];
    memcpy(msg, e->msg, sizeof msg);
    if (dl_broadcast(a->world, msg, msg, sizeof msg / sizeof *msg, DL_F32, first,
                     DL_PURPOSE_OTHER) == DL_OK &&
        first != me) {
        char text[sizeof e->msg];
        memcpy(text, msg, sizeof text);
        text[sizeof text - 1] = '\0';
        dl__ck_fail(e, (int)v[(size_t)first * S_N + S_ST],
                    "checkpoint save to '%s' failed on rank %d (nothing was written there): %s",
                    where, first, text);
    }
    return e->st ? -1 : 0;
}

/* Rank 0, after every file is written: the manifest with the files and the tensors' pieces
 * (read back from the files' headers), written and fsync'd in tmp. */
static void write_manifest(const dl__ckd_save_args *a, const double *v, const char *tmp, ck_err *e);

/* Rank 0: the directory renamed into place, D fsync'd, the old ones pruned. */
static void commit(const dl__ckd_save_args *a, const char *tmp, const char *fin, ck_err *e)
{
    int bad = point(a->step) || fsync_dir(tmp) || point(a->step) || point(a->step) ||
              rename(tmp, fin) || point(a->step) || point(a->step) || fsync_dir(a->dir) ||
              point(a->step);
    if (bad) {
        dl__ck_fail(e, DL_ESYS, "checkpoint: cannot commit '%s': %s", fin, strerror(errno));
        return;
    }
    prune(a->dir, a->keep);
}

int dl__ckd_begin(const dl__ckd_save_args *a, dl__ckd_save_state *s)
{
    int me = dl_comm_rank(a->world), n = dl_comm_size(a->world);
    memset(s, 0, sizeof *s);
    snprintf(s->tmp, sizeof s->tmp, "%s/.tmp-step-%07d.%ld", a->dir, a->step, (long)getpid());
    snprintf(s->fin, sizeof s->fin, "%s/step-%07d", a->dir, a->step);
    s->v = calloc((size_t)n * S_N, sizeof *s->v);
    if (!s->v)
        dl__ck_fail(&s->e, DL_ENOMEM, "checkpoint: out of memory");
    struct stat sb;
    if (me == 0 && !s->e.st) {
        if (mkdir(a->dir, 0755) && errno != EEXIST)
            dl__ck_fail(&s->e, DL_ESYS, "checkpoint: cannot create '%s': %s", a->dir,
                        strerror(errno));
        remove_stale(a->dir);
        s->skip = stat(s->fin, &sb) == 0;
        point(a->step);
        if (!s->e.st && !s->skip && mkdir(s->tmp, 0755))
            dl__ck_fail(&s->e, DL_ESYS, "checkpoint: cannot create '%s': %s", s->tmp,
                        strerror(errno));
        s->made = !s->e.st && !s->skip;
        point(a->step);
        s->v[S_SKIP] = s->skip;
    }
    if (!s->v || sync_slots(a, s->v, &s->e, s->fin))
        return s->over = 1, dl__ck_return(&s->e);
    s->skip = s->over = s->v[S_SKIP] != 0;
    memset(s->v, 0, sizeof *s->v * (size_t)n * S_N);
    return DL_OK;
}

int dl__ckd_write(const dl__ckd_save_args *a, dl__ckd_save_state *s)
{
    int me = dl_comm_rank(a->world);
    char file[4200];
    if (s->over || !a->writer)
        return DL_OK;
    double *mine = s->v + (size_t)me * S_N;
    uint32_t crc;
    uint64_t size;
    snprintf(file, sizeof file, "%s/rank-%05d.safetensors", s->tmp, me);
    if (shard_write(a->shard, file, a->step, me, &crc, &size, &s->e) == 0) {
        mine[S_WR] = 1, mine[S_CRC] = crc, mine[S_SIZE] = (double)size;
        mine[S_DP] = a->coord[0], mine[S_TP] = a->coord[1], mine[S_PP] = a->coord[2];
    }
    dl__test_hook *h = dl__test_hook_get();
    if (h && h->ckpt_die_at_step == a->step && me == 0)
        _exit(99); /* a crash mid-save: the temporary stays behind */
    return dl__ck_return(&s->e);
}

int dl__ckd_collect(const dl__ckd_save_args *a, dl__ckd_save_state *s)
{
    int n = dl_comm_size(a->world);
    if (s->over)
        return dl__ck_return(&s->e);
    if (sync_slots(a, s->v, &s->e, s->fin) == 0)
        for (int r = 0; r < n; r++) s->bytes += (uint64_t)s->v[(size_t)r * S_N + S_SIZE];
    return dl__ck_return(&s->e);
}

int dl__ckd_commit(const dl__ckd_save_args *a, dl__ckd_save_state *s)
{
    if (s->over || s->e.st || dl_comm_rank(a->world) != 0)
        return dl__ck_return(&s->e);
    write_manifest(a, s->v, s->tmp, &s->e);
    if (!s->e.st)
        commit(a, s->tmp, s->fin, &s->e);
    return dl__ck_return(&s->e);
}

int dl__ckd_finish(const dl__ckd_save_args *a, dl__ckd_save_state *s, char *out, size_t outn)
{
    int me = dl_comm_rank(a->world), n = dl_comm_size(a->world);
    if (!s->over) {
        memset(s->v, 0, sizeof *s->v * (size_t)n * S_N);
        sync_slots(a, s->v, &s->e, s->fin);
    }
    if (me == 0 && s->e.st && s->made)
        rm_dir(s->tmp);
    if (me == 0 && out)
        snprintf(out, outn, "%s", s->fin);
    free(s->v);
    s->v = NULL;
    json_decref(me == 0 ? a->manifest : NULL);
    return dl__ck_return(&s->e);
}

int dl__ckd_save(const dl__ckd_save_args *a, char *out, size_t outn)
{
    dl__ckd_save_state s;
    dl__ckd_begin(a, &s);
    dl__ckd_write(a, &s);
    dl__ckd_collect(a, &s);
    dl__ckd_commit(a, &s);
    return dl__ckd_finish(a, &s, out, outn);
}

/* The pieces a file's header lists (its __metadata__'s "pieces"), new reference or NULL. */
static json_t *file_pieces(const char *path, ck_err *e)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    unsigned char len[8];
    json_t *p = NULL;
    if (fd < 0 || dl__ck_pread_all(fd, len, 8, 0)) {
        dl__ck_fail(e, DL_ESYS, "checkpoint: cannot read back '%s'", path);
    } else {
        uint64_t N = 0;
        for (int i = 0; i < 8; i++) N |= (uint64_t)len[i] << (8 * i);
        char *h = N < CK_MAX_HEADER ? malloc(N + 1) : NULL;
        json_t *hdr = h && dl__ck_pread_all(fd, h, N, 8) == 0 ? json_loadb(h, N, 0, NULL) : NULL;
        const char *ps =
            json_string_value(json_object_get(json_object_get(hdr, "__metadata__"), "pieces"));
        p = ps ? json_loads(ps, 0, NULL) : NULL;
        if (!p)
            dl__ck_fail(e, DL_ESYS, "checkpoint: cannot read back the header of '%s'", path);
        json_decref(hdr);
        free(h);
    }
    if (fd >= 0)
        close(fd);
    return p;
}

/* tensors[name] = {"global_shape":..,"pieces":[{"file":F, ...}]} from one file's pieces */
static int merge_pieces(json_t *tensors, json_t *pieces, const char *fname)
{
    const char *name;
    json_t *pc;
    json_object_foreach(pieces, name, pc)
    {
        json_t *t = json_object_get(tensors, name);
        if (!t) {
            json_t *gs = json_object_get(pc, "global_shape");
            t = json_pack("{s:O*, s:[]}", "global_shape", gs, "pieces");
            if (!t || json_object_set_new(tensors, name, t))
                return -1;
        }
        json_t *q = json_deep_copy(pc);
        json_object_del(q, "global_shape");
        if (!q || json_object_set_new(q, "file", json_string(fname)) ||
            json_array_append_new(json_object_get(t, "pieces"), q))
            return -1;
    }
    return 0;
}

static void write_manifest(const dl__ckd_save_args *a, const double *v, const char *tmp, ck_err *e)
{
    int n = dl_comm_size(a->world);
    json_t *m = a->manifest, *files = json_array(), *tensors = json_object();
    char fname[64], path[4200], crc[16];
    for (int r = 0; r < n && !e->st; r++) {
        const double *s = v + (size_t)r * S_N;
        if (!s[S_WR])
            continue;
        snprintf(fname, sizeof fname, "rank-%05d.safetensors", r);
        snprintf(path, sizeof path, "%s/%s", tmp, fname);
        snprintf(crc, sizeof crc, "%08x", (unsigned)s[S_CRC]);
        json_array_append_new(files,
                              json_pack("{s:s, s:i, s:[i, i, i], s:I, s:s}", "name", fname, "rank",
                                        r, "dp_tp_pp", (int)s[S_DP], (int)s[S_TP], (int)s[S_PP],
                                        "bytes", (json_int_t)s[S_SIZE], "crc32c", crc));
        json_t *p = file_pieces(path, e);
        if (p && merge_pieces(tensors, p, fname))
            dl__ck_fail(e, DL_ENOMEM, "checkpoint: out of memory");
        json_decref(p);
    }
    json_object_set_new(m, "files", files);
    json_object_set_new(m, "tensors", tensors);
    snprintf(path, sizeof path, "%s/" DL_CKD_MANIFEST, tmp);
    if (!e->st && (point(a->step) || json_dump_file(m, path, JSON_INDENT(1)) != 0))
        dl__ck_fail(e, DL_ESYS, "checkpoint: cannot write '%s'", path);
    int fd = e->st ? -1 : open(path, O_RDONLY | O_CLOEXEC);
    if (!e->st && (fd < 0 || point(a->step) || point(a->step) || fsync(fd) || point(a->step)))
        dl__ck_fail(e, DL_ESYS, "checkpoint: cannot sync '%s': %s", path, strerror(errno));
    if (fd >= 0)
        close(fd);
}
