#define _GNU_SOURCE
/* Checkpoints: sharded save / load of the GPT parameters in the safetensors layout
 * (include/distlab/ckpt.h describes the format and the protocol). */
#include "config.h"
#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>
#include "distlab.h"
#include "io/path.h"
#include "core/json.h"
#include "core/strbuf.h"

#define CK_MAX_HEADER ((uint64_t)100 << 20) /* safetensors' own limit on N */
#define CK_IOBUF ((size_t)1 << 20)          /* staging / checksum chunk */
#define CK_COVER 64                         /* tp ranks whose writer coverage is checked */
#define CK_MAXDIM 8
#define CK_FORMAT "distlab-gpt"
#define CK_VERSION "1"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define CK_HOST_LE 0
#else
#define CK_HOST_LE 1
#endif

uint64_t dl_ckpt_fnv1a64(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

/* ---------------------------------------------------------------------------------------- */
/* small helpers                                                                              */

/* First error of an operation: code and message, kept locally so that later successful calls
 * (collectives) cannot overwrite it before it is returned. */
typedef struct ck_err {
    int st;
    char msg[640];
} ck_err;

static void ck_fail(ck_err *e, int st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void ck_fail(ck_err *e, int st, const char *fmt, ...)
{
    if (e->st)
        return;
    e->st = st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
}

static int ck_return(const ck_err *e) { return e->st ? dl_error(e->st, "%s", e->msg) : DL_OK; }

static void bswap_elems(void *p, size_t n, int dsize)
{
    unsigned char *b = p;
    for (size_t i = 0; i < n; i++, b += dsize)
        for (int j = 0; j < dsize / 2; j++) {
            unsigned char t = b[j];
            b[j] = b[dsize - 1 - j];
            b[dsize - 1 - j] = t;
        }
}

/* pwrite / pread everything or fail with errno set: a write that makes no progress is ENOSPC,
 * a read at the end of the file errno 0. */
static int pio_all(int fd, char *p, size_t n, off_t off, int write)
{
    while (n) {
        ssize_t k = write ? pwrite(fd, p, n, off) : pread(fd, p, n, off);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (k == 0) {
            errno = write ? ENOSPC : 0;
            return -1;
        }
        p += k;
        n -= (size_t)k;
        off += k;
    }
    return 0;
}

/* (pwrite only reads the buffer) */
static int pwrite_all(int fd, const void *buf, size_t n, off_t off)
{
    return pio_all(fd, (char *)buf, n, off, 1);
}

static int pread_all(int fd, void *buf, size_t n, off_t off) { return pio_all(fd, buf, n, off, 0); }

static const char *errtext(int e)
{
    if (e == 0)
        return "unexpected end of file";
    if (e == ENOSPC)
        return "No space left on device (disk full)";
    return strerror(e);
}

static const char *dtype_name(int dsize) { return dsize == 8 ? "F64" : "F32"; }

static void config_string(const dl_gpt_config *c, char *buf, size_t n)
{
    snprintf(buf, n, "layers=%d,d_model=%d,heads=%d,seq=%d,vocab=%d,tie=%d", c->layers, c->d_model,
             c->heads, c->seq, c->vocab, c->tie);
}

static int parse_config(const char *s, dl_gpt_config *c)
{
    int used = -1;
    if (sscanf(s, "layers=%d,d_model=%d,heads=%d,seq=%d,vocab=%d,tie=%d%n", &c->layers, &c->d_model,
               &c->heads, &c->seq, &c->vocab, &c->tie, &used) != 6 ||
        used < 0 || s[used] != '\0')
        return -1;
    return 0;
}

static int64_t global_numel(const dl_tensor_info *t) { return t->shape[0] * t->shape[1]; }

static void shape_string(int ndim, const int64_t *shape, char *buf, size_t n)
{
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < ndim && k < n; d++)
        k += (size_t)snprintf(buf + k, n - k, d ? ", %" PRId64 : "%" PRId64, shape[d]);
    if (k < n)
        snprintf(buf + k, n - k, "]");
}

/* Local elements per contiguous run of a tensor's shard (runs start at multiples of it). */
static size_t run_len(const dl_gpt_layout *l, const dl_tensor_info *t)
{
    switch (t->shard) {
    case DL_SHARD_COLS: return (size_t)t->local[1];
    case DL_SHARD_QKV: return (size_t)(t->shape[0] / 3 / l->tp * t->local[1]);
    default: return t->numel;
    }
}

/* A pipeline stage's layout holds part of the model (include/distlab/model.h, dl_gpt_part);
 * the file always holds the whole model. `full` is the whole model's layout for l's tp rank
 * (l itself when it is whole; otherwise a new one the caller destroys): headers, offsets and
 * the check that a file has every tensor are the whole model's, slices the part's, matched by
 * each tensor's single-rank id (t->id, the index in the whole layout). */
static int is_whole(const dl_gpt_layout *l)
{
    const dl_gpt_part *p = &l->part;
    return p->nchunks == 1 && p->first[0] == 0 && p->count[0] == l->cfg.layers && p->embed &&
           p->head;
}

static int whole_layout(const dl_gpt_layout *l, const dl_gpt_layout **full, dl_gpt_layout **own)
{
    *own = NULL;
    *full = l;
    if (is_whole(l))
        return DL_OK;
    int rc = dl_gpt_layout_create_part(&l->cfg, l->tp, l->tp_rank, NULL, own);
    if (rc == DL_OK)
        *full = *own;
    return rc;
}

/* The head stage's copy of a tied wte (equal to the first stage's): not written twice. */
static int is_tied_copy(const dl_gpt_layout *l, const dl_tensor_info *t)
{
    return t->id == 0 && !l->part.embed;
}

/* ---------------------------------------------------------------------------------------- */
/* the header a layout saves                                                                  */

typedef struct ck_plan {
    char *hdr; /* N bytes, space padded */
    uint64_t N;
    size_t cksum_pos; /* where the 16 hex digits of the checksum start in hdr */
    uint64_t *begin;  /* [ntensors] byte offset of each tensor in the data section */
    uint64_t data_bytes;
} ck_plan;

static void plan_free(ck_plan *p)
{
    free(p->hdr);
    free(p->begin);
    memset(p, 0, sizeof *p);
}

static int plan_build(const dl_gpt_layout *l, int dsize, ck_plan *p)
{
    memset(p, 0, sizeof *p);
    p->begin = calloc((size_t)(l->ntensors ? l->ntensors : 1), sizeof *p->begin);
    if (!p->begin)
        return -1;
    dl__strbuf s = {0};
    const char *dt = dtype_name(dsize);
    uint64_t off = 0;
    dl__sb_printf(&s, "{");
    for (int k = 0; k < l->ntensors; k++) {
        const dl_tensor_info *t = &l->t[k];
        uint64_t bytes = (uint64_t)global_numel(t) * (uint64_t)dsize;
        p->begin[k] = off;
        dl__sb_json(&s, t->name, DL__JSON_CTRL_U);
        dl__sb_printf(&s, ":{\"dtype\":\"%s\",\"shape\":[%" PRId64, dt, t->shape[0]);
        if (t->ndim == 2)
            dl__sb_printf(&s, ",%" PRId64, t->shape[1]);
        dl__sb_printf(&s, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]},", off, off + bytes);
        off += bytes;
    }
    char cfg[160];
    config_string(&l->cfg, cfg, sizeof cfg);
    dl__sb_printf(&s,
                  "\"__metadata__\":{\"format\":\"" CK_FORMAT "\",\"version\":\"" CK_VERSION "\","
                  "\"config\":\"%s\",\"dtype\":\"%s\",\"checksum_algo\":\"fnv1a64\",\"checksum\":"
                  "\"",
                  cfg, dt);
    size_t pos = s.n;
    dl__sb_printf(&s, "0000000000000000\"}}");
    while (!s.oom && s.n % 8) dl__sb_add(&s, " ", 1);
    if (s.oom) {
        dl__sb_free(&s);
        free(p->begin);
        p->begin = NULL;
        return -1;
    }
    p->hdr = s.p;
    p->N = s.n;
    p->cksum_pos = pos;
    p->data_bytes = off;
    return 0;
}

/* Write `n` elements at file offset `off`, little-endian. */
static int write_run(int fd, const void *src, size_t n, int dsize, off_t off, void *stage)
{
    if (CK_HOST_LE)
        return pwrite_all(fd, src, n * (size_t)dsize, off);
    const char *p = src;
    size_t per = CK_IOBUF / (size_t)dsize;
    while (n) {
        size_t m = n < per ? n : per;
        memcpy(stage, p, m * (size_t)dsize);
        bswap_elems(stage, m, dsize);
        if (pwrite_all(fd, stage, m * (size_t)dsize, off))
            return -1;
        p += m * (size_t)dsize;
        off += (off_t)(m * (size_t)dsize);
        n -= m;
    }
    return 0;
}

/* FNV-1a 64 of bytes [from, from + n) of fd. */
static int hash_range(int fd, off_t from, uint64_t n, void *buf, uint64_t *out)
{
    uint64_t h = DL_CKPT_FNV_INIT;
    while (n) {
        size_t m = n < CK_IOBUF ? (size_t)n : CK_IOBUF;
        if (pread_all(fd, buf, m, from))
            return -1;
        h = dl_ckpt_fnv1a64(h, buf, m);
        from += (off_t)m;
        n -= m;
    }
    *out = h;
    return 0;
}

/* 24-bit signature of what every member must agree on (exact in an f32). */
static float group_sig(const dl_gpt_layout *l, int dsize)
{
    int v[8] = {l->cfg.vocab, l->cfg.seq, l->cfg.layers, l->cfg.d_model,
                l->cfg.heads, l->cfg.tie, l->tp,         dsize};
    uint64_t h = dl_ckpt_fnv1a64(DL_CKPT_FNV_INIT, v, sizeof v);
    return (float)((h ^ (h >> 24) ^ (h >> 48)) & 0xffffff);
}

/* The status all-reduce that stands in for a barrier: v[0] = status code, v[1] = group rank + 1
 * of a failing rank (max over the group). */
static int status_sync(dl_comm *g, float *v, size_t n)
{
    return dl_allreduce(g, v, v, n, DL_F32, DL_MAX, DL_PURPOSE_OTHER);
}

static void set_status(float *v, const ck_err *e, int me)
{
    v[0] = (float)e->st;
    v[1] = e->st ? (float)(me + 1) : 0.0f;
}

/* After a status sync: did anyone fail? Then this rank's error is set (its own, or one naming the
 * failing rank). */
static int group_failed(ck_err *e, const float *v, const char *path)
{
    if (v[0] <= 0)
        return 0;
    ck_fail(e, (int)v[0],
            "checkpoint save to '%s' failed on rank %d of the group (%s); nothing was "
            "written there",
            path, (int)v[1] - 1, dl_strstatus((int)v[0]));
    return 1;
}

/* ---------------------------------------------------------------------------------------- */
/* save                                                                                       */

int dl_ckpt_save(const char *path, const dl_gpt_layout *l, const void *params, int dsize,
                 dl_comm *group, int writer)
{
    if (!group)
        return dl_error(DL_EINVAL, "checkpoint save to '%s': null group", path ? path : "(null)");
    int me = dl_comm_rank(group);
    ck_err e = {0};
    ck_plan plan = {0};
    char tmp[4200] = "";
    int fd = -1, have_tmp = 0, rc;
    void *stage = NULL;
    float v[6 + CK_COVER]; /* status, failing rank, sig, -sig, pid lo/hi, writer per tp rank */
    memset(v, 0, sizeof v);

    if (!path || !*path)
        ck_fail(&e, DL_EINVAL, "checkpoint save: empty file name");
    else if (strlen(path) > 4000)
        ck_fail(&e, DL_EINVAL, "checkpoint save: file name too long (%zu bytes)", strlen(path));
    else if (!l)
        ck_fail(&e, DL_EINVAL, "checkpoint save to '%s': null layout", path);
    else if (dsize != 4 && dsize != 8)
        ck_fail(&e, DL_EINVAL, "checkpoint save to '%s': element size %d (expected 4 or 8)", path,
                dsize);
    else if (!params && l->numel)
        ck_fail(&e, DL_EINVAL, "checkpoint save to '%s': null parameter buffer", path);
    else if (me == 0 && (rc = dl_path_check_output(path, "checkpoint save")))
        ck_fail(&e, rc, "%s", dl_errmsg());
    const dl_gpt_layout *full = l;
    dl_gpt_layout *own_full = NULL;
    if (!e.st && whole_layout(l, &full, &own_full))
        ck_fail(&e, DL_ENOMEM, "checkpoint save to '%s': %s", path, dl_errmsg());
    if (!e.st && plan_build(full, dsize, &plan))
        ck_fail(&e, DL_ENOMEM, "checkpoint save to '%s': out of memory building the header", path);
    if (!e.st && !CK_HOST_LE && !(stage = malloc(CK_IOBUF)))
        ck_fail(&e, DL_ENOMEM, "checkpoint save to '%s': out of memory", path);
    long pid = (long)getpid();

    /* 1. rank 0 creates the temporary file with the header and its full size (after removing
     * the temporaries of earlier writers that were killed) */
    if (me == 0 && !e.st) {
        dl_path_remove_stale_tmp(path);
        snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, pid);
        fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
        if (fd < 0) {
            ck_fail(&e, DL_ESYS, "checkpoint save: cannot create '%s': %s", tmp, errtext(errno));
        } else {
            have_tmp = 1;
            unsigned char len[8];
            for (int i = 0; i < 8; i++) len[i] = (unsigned char)(plan.N >> (8 * i));
            off_t total = (off_t)(8 + plan.N + plan.data_bytes);
            if (pwrite_all(fd, len, 8, 0) || pwrite_all(fd, plan.hdr, plan.N, 8))
                ck_fail(&e, DL_ESYS, "checkpoint save: writing the header of '%s': %s", tmp,
                        errtext(errno));
            else if (ftruncate(fd, total))
                ck_fail(&e, DL_ESYS, "checkpoint save: cannot size '%s' to %lld bytes: %s", tmp,
                        (long long)total, errtext(errno));
            else if (fallocate(fd, 0, 0, total) && errno != EOPNOTSUPP && errno != ENOSYS &&
                     errno != EINVAL)
                ck_fail(&e, DL_ESYS, "checkpoint save: cannot reserve %lld bytes for '%s': %s",
                        (long long)total, tmp, errtext(errno));
        }
    }
    set_status(v, &e, me);
    if (!e.st) {
        float sig = group_sig(l, dsize);
        v[2] = sig;
        v[3] = -sig;
        if (me == 0) {
            v[4] = (float)(pid & 0xfff);
            v[5] = (float)(pid >> 12);
        }
        if (writer && l->tp_rank < CK_COVER)
            v[6 + l->tp_rank] = 1.0f;
    }
    rc = status_sync(group, v, sizeof v / sizeof v[0]);
    if (rc) {
        ck_fail(&e, rc, "checkpoint save to '%s': status all-reduce failed: %s", path ? path : "",
                dl_errmsg());
        goto out;
    }
    if (group_failed(&e, v, path))
        goto out;
    if (v[2] != -v[3]) {
        ck_fail(&e, DL_EINVAL,
                "checkpoint save to '%s': the ranks of the group disagree on the "
                "model config, tp degree or dtype",
                path);
        goto out;
    }
    if (l->tp <= CK_COVER)
        for (int r = 0; r < l->tp; r++)
            if (v[6 + r] != 1.0f) {
                ck_fail(&e, DL_EINVAL,
                        "checkpoint save to '%s': no writer holds tp rank %d's shard "
                        "(pass writer = 1 on one member per tp rank)",
                        path, r);
                goto out;
            }
    pid = (long)v[4] + ((long)v[5] << 12);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, pid);

    /* 2. every writer writes its slices at their global offsets */
    if (writer) {
        if (fd < 0 && (fd = open(tmp, O_WRONLY | O_CLOEXEC)) < 0)
            ck_fail(&e, DL_ESYS, "checkpoint save: cannot open '%s' for writing: %s", tmp,
                    errtext(errno));
        for (int k = 0; k < l->ntensors && !e.st; k++) {
            const dl_tensor_info *t = &l->t[k];
            if (t->shard == DL_SHARD_NONE && l->tp_rank != 0)
                continue; /* replicated: the tp_rank 0 writer's */
            if (is_tied_copy(l, t))
                continue; /* the first stage writes wte */
            size_t run = run_len(l, t);
            const char *src = (const char *)params + t->offset * (size_t)dsize;
            for (size_t i = 0; i < t->numel; i += run) {
                int64_t g = dl_gpt_global_index(l, k, i);
                off_t off = (off_t)(8 + plan.N + plan.begin[t->id] + (uint64_t)g * (uint64_t)dsize);
                if (write_run(fd, src + i * (size_t)dsize, run, dsize, off, stage)) {
                    ck_fail(&e, DL_ESYS, "checkpoint save: writing %s to '%s' at byte %lld: %s",
                            t->name, tmp, (long long)off, errtext(errno));
                    break;
                }
            }
        }
    }
    if (me != 0 && fd >= 0) {
        if (close(fd) && !e.st)
            ck_fail(&e, DL_ESYS, "checkpoint save: closing '%s': %s", tmp, errtext(errno));
        fd = -1;
    }
    set_status(v, &e, me);
    rc = status_sync(group, v, 2);
    if (rc) {
        ck_fail(&e, rc, "checkpoint save to '%s': status all-reduce failed: %s", path, dl_errmsg());
        goto out;
    }
    if (group_failed(&e, v, path))
        goto out;

    /* 3. rank 0: checksum, fsync, atomic rename */
    if (me == 0) {
        void *buf = malloc(CK_IOBUF);
        uint64_t h = 0;
        if (!buf)
            ck_fail(&e, DL_ENOMEM, "checkpoint save to '%s': out of memory", path);
        else if (hash_range(fd, (off_t)(8 + plan.N), plan.data_bytes, buf, &h))
            ck_fail(&e, DL_ESYS, "checkpoint save: reading '%s' back: %s", tmp, errtext(errno));
        free(buf);
        if (!e.st) {
            char hex[17];
            snprintf(hex, sizeof hex, "%016" PRIx64, h);
            if (pwrite_all(fd, hex, 16, (off_t)(8 + plan.cksum_pos)))
                ck_fail(&e, DL_ESYS, "checkpoint save: writing the checksum of '%s': %s", tmp,
                        errtext(errno));
        }
        if (!e.st && fsync(fd))
            ck_fail(&e, DL_ESYS, "checkpoint save: fsync of '%s': %s", tmp, errtext(errno));
        int cr = close(fd);
        fd = -1;
        if (!e.st && cr)
            ck_fail(&e, DL_ESYS, "checkpoint save: closing '%s': %s", tmp, errtext(errno));
        if (!e.st && rename(tmp, path))
            ck_fail(&e, DL_ESYS, "checkpoint save: cannot rename '%s' to '%s': %s", tmp, path,
                    errtext(errno));
        if (!e.st) {
            have_tmp = 0;
            /* make the rename durable: sync the directory (best effort) */
            char dir[4200];
            snprintf(dir, sizeof dir, "%s", path);
            char *slash = strrchr(dir, '/');
            if (!slash)
                snprintf(dir, sizeof dir, ".");
            else if (slash == dir)
                dir[1] = '\0';
            else
                *slash = '\0';
            int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            if (dfd >= 0) {
                (void)fsync(dfd);
                close(dfd);
            }
        }
    }
    set_status(v, &e, me);
    rc = status_sync(group, v, 2);
    if (rc)
        ck_fail(&e, rc, "checkpoint save to '%s': status all-reduce failed: %s", path, dl_errmsg());
    else
        group_failed(&e, v, path);

out:
    if (fd >= 0)
        close(fd);
    if (have_tmp && me == 0)
        unlink(tmp);
    free(stage);
    plan_free(&plan);
    dl_gpt_layout_destroy(own_full);
    return ck_return(&e);
}

/* ---------------------------------------------------------------------------------------- */
/* the header parser: exactly the safetensors header shape                                    */

typedef struct ck_ent {
    char *name;
    char dtype[16];
    int dsize; /* 4, 8, or 0 for a dtype distlab does not read */
    int ndim;
    int64_t shape[CK_MAXDIM];
    uint64_t begin, end;
    int used;
} ck_ent;

typedef struct ck_hdr {
    ck_ent *e;
    int n, cap;
    int has_meta;
    char *format, *version, *config, *dtype, *checksum, *checksum_algo;
    uint64_t N, data_bytes, file_bytes;
} ck_hdr;

static void hdr_free(ck_hdr *h)
{
    for (int i = 0; i < h->n; i++) free(h->e[i].name);
    free(h->e);
    free(h->format);
    free(h->version);
    free(h->config);
    free(h->dtype);
    free(h->checksum);
    free(h->checksum_algo);
    memset(h, 0, sizeof *h);
}

typedef struct jp {
    const char *s;
    size_t n, i;
    const char *err;
    size_t err_at;
} jp;

static int jfail(jp *p, const char *what)
{
    if (!p->err) {
        p->err = what;
        p->err_at = p->i;
    }
    return -1;
}

static void jws(jp *p)
{
    while (p->i < p->n &&
           (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r'))
        p->i++;
}

static int jexpect(jp *p, char c, const char *what)
{
    jws(p);
    if (p->i >= p->n || p->s[p->i] != c)
        return jfail(p, what);
    p->i++;
    return 0;
}

/* 1 if the next non-blank character is c (consumed). */
static int jaccept(jp *p, char c)
{
    jws(p);
    if (p->i < p->n && p->s[p->i] == c) {
        p->i++;
        return 1;
    }
    return 0;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static int jhex4(jp *p, unsigned *out)
{
    if (p->i + 4 > p->n)
        return jfail(p, "truncated \\u escape");
    unsigned u = 0;
    for (int k = 0; k < 4; k++) {
        int h = hexval(p->s[p->i + (size_t)k]);
        if (h < 0)
            return jfail(p, "bad \\u escape");
        u = u * 16 + (unsigned)h;
    }
    p->i += 4;
    *out = u;
    return 0;
}

/* A JSON string into a new NUL-terminated buffer (escapes decoded, \u0000 refused). */
static int jstring(jp *p, char **out)
{
    *out = NULL;
    jws(p);
    if (p->i >= p->n || p->s[p->i] != '"')
        return jfail(p, "expected a string");
    p->i++;
    size_t cap = 32, n = 0;
    char *b = malloc(cap);
    if (!b)
        return jfail(p, "out of memory");
    for (;;) {
        if (p->i >= p->n) {
            free(b);
            return jfail(p, "unterminated string");
        }
        unsigned char c = (unsigned char)p->s[p->i++];
        unsigned cp;
        if (c == '"')
            break;
        if (c < 0x20) {
            free(b);
            p->i--;
            return jfail(p, "control character in a string");
        }
        if (c != '\\') {
            cp = c; /* raw byte (UTF-8 passes through) */
        } else {
            if (p->i >= p->n) {
                free(b);
                return jfail(p, "unterminated string");
            }
            char x = p->s[p->i++];
            switch (x) {
            case '"': cp = '"'; break;
            case '\\': cp = '\\'; break;
            case '/': cp = '/'; break;
            case 'b': cp = '\b'; break;
            case 'f': cp = '\f'; break;
            case 'n': cp = '\n'; break;
            case 'r': cp = '\r'; break;
            case 't': cp = '\t'; break;
            case 'u':
                if (jhex4(p, &cp)) {
                    free(b);
                    return -1;
                }
                if (cp >= 0xD800 && cp < 0xDC00) {
                    unsigned lo;
                    if (p->i + 2 > p->n || p->s[p->i] != '\\' || p->s[p->i + 1] != 'u') {
                        free(b);
                        return jfail(p, "lone surrogate in \\u escape");
                    }
                    p->i += 2;
                    if (jhex4(p, &lo)) {
                        free(b);
                        return -1;
                    }
                    if (lo < 0xDC00 || lo >= 0xE000) {
                        free(b);
                        return jfail(p, "bad surrogate pair in \\u escape");
                    }
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                } else if (cp >= 0xDC00 && cp < 0xE000) {
                    free(b);
                    return jfail(p, "lone surrogate in \\u escape");
                }
                if (cp == 0) {
                    free(b);
                    return jfail(p, "\\u0000 in a string");
                }
                break;
            default:
                free(b);
                p->i--;
                return jfail(p, "bad escape in a string");
            }
        }
        if (n + 5 > cap) {
            char *q = realloc(b, cap *= 2);
            if (!q) {
                free(b);
                return jfail(p, "out of memory");
            }
            b = q;
        }
        if (c != '\\' || cp < 0x80) {
            b[n++] = (char)cp;
        } else if (cp < 0x800) {
            b[n++] = (char)(0xC0 | (cp >> 6));
            b[n++] = (char)(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            b[n++] = (char)(0xE0 | (cp >> 12));
            b[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
            b[n++] = (char)(0x80 | (cp & 0x3F));
        } else {
            b[n++] = (char)(0xF0 | (cp >> 18));
            b[n++] = (char)(0x80 | ((cp >> 12) & 0x3F));
            b[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
            b[n++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    b[n] = '\0';
    *out = b;
    return 0;
}

/* An object's key and the ':' after it (the caller frees *key when this returns 0). */
static int jkey(jp *p, char **key)
{
    if (jstring(p, key))
        return -1;
    if (jexpect(p, ':', "expected ':' after a key")) {
        free(*key);
        return -1;
    }
    return 0;
}

/* A non-negative integer without sign, fraction or exponent, below 2^62. */
static int juint(jp *p, uint64_t *out)
{
    jws(p);
    size_t start = p->i;
    uint64_t v = 0;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
        if (v > ((uint64_t)1 << 62) / 10)
            return jfail(p, "integer too large");
        v = v * 10 + (uint64_t)(p->s[p->i] - '0');
        p->i++;
    }
    if (p->i == start)
        return jfail(p, "expected a non-negative integer");
    if (p->i - start > 1 && p->s[start] == '0')
        return jfail(p, "leading zero in an integer");
    if (p->i < p->n && (p->s[p->i] == '.' || p->s[p->i] == 'e' || p->s[p->i] == 'E'))
        return jfail(p, "expected an integer, found a fraction or exponent");
    *out = v;
    return 0;
}

/* '[' uint (',' uint)* ']' or '[]', at most `max` items. */
static int juint_array(jp *p, uint64_t *v, int max, int *count)
{
    *count = 0;
    if (jexpect(p, '[', "expected '['"))
        return -1;
    if (jaccept(p, ']'))
        return 0;
    for (;;) {
        if (*count >= max)
            return jfail(p, "too many array items");
        if (juint(p, &v[*count]))
            return -1;
        (*count)++;
        if (jaccept(p, ']'))
            return 0;
        if (jexpect(p, ',', "expected ',' or ']' in an array"))
            return -1;
    }
}

static int jtensor(jp *p, ck_ent *t)
{
    int have_dtype = 0, have_shape = 0, have_off = 0;
    if (jexpect(p, '{', "expected '{' opening a tensor entry"))
        return -1;
    if (jaccept(p, '}'))
        return jfail(p, "tensor entry without dtype, shape and data_offsets");
    for (;;) {
        char *key;
        size_t at = p->i;
        if (jkey(p, &key))
            return -1;
        int rc = 0;
        if (!strcmp(key, "dtype")) {
            char *dt;
            if (have_dtype++) {
                p->i = at;
                rc = jfail(p, "duplicate \"dtype\"");
            } else if (!(rc = jstring(p, &dt))) {
                snprintf(t->dtype, sizeof t->dtype, "%s", dt);
                t->dsize = !strcmp(dt, "F32") ? 4 : !strcmp(dt, "F64") ? 8 : 0;
                if (strlen(dt) >= sizeof t->dtype) {
                    p->i = at;
                    rc = jfail(p, "dtype name too long");
                }
                free(dt);
            }
        } else if (!strcmp(key, "shape")) {
            uint64_t s[CK_MAXDIM];
            int c;
            if (have_shape++) {
                p->i = at;
                rc = jfail(p, "duplicate \"shape\"");
            } else if (!(rc = juint_array(p, s, CK_MAXDIM, &c))) {
                t->ndim = c;
                for (int d = 0; d < c; d++) t->shape[d] = (int64_t)s[d];
            }
        } else if (!strcmp(key, "data_offsets")) {
            uint64_t o[2];
            int c;
            if (have_off++) {
                p->i = at;
                rc = jfail(p, "duplicate \"data_offsets\"");
            } else if (!(rc = juint_array(p, o, 2, &c))) {
                if (c != 2)
                    rc = jfail(p, "data_offsets must hold two integers");
                t->begin = o[0];
                t->end = o[1];
            }
        } else {
            p->i = at;
            rc = jfail(p, "unknown key in a tensor entry (expected dtype, shape, data_offsets)");
        }
        free(key);
        if (rc)
            return -1;
        if (jaccept(p, '}'))
            break;
        if (jexpect(p, ',', "expected ',' or '}' in a tensor entry"))
            return -1;
    }
    if (!have_dtype || !have_shape || !have_off)
        return jfail(p, !have_dtype   ? "tensor entry without \"dtype\""
                        : !have_shape ? "tensor entry without \"shape\""
                                      : "tensor entry without \"data_offsets\"");
    return 0;
}

static int jmetadata(jp *p, ck_hdr *h)
{
    if (jexpect(p, '{', "expected '{' opening __metadata__"))
        return -1;
    if (jaccept(p, '}'))
        return 0;
    for (;;) {
        char *key, *val;
        size_t at;
        jws(p);
        at = p->i;
        if (jstring(p, &key))
            return -1;
        if (jexpect(p, ':', "expected ':' after a key")) {
            free(key);
            return -1;
        }
        jws(p);
        if (p->i < p->n && p->s[p->i] != '"') {
            free(key);
            return jfail(p, "__metadata__ values must be strings");
        }
        if (jstring(p, &val)) {
            free(key);
            return -1;
        }
        char **slot = !strcmp(key, "format")          ? &h->format
                      : !strcmp(key, "version")       ? &h->version
                      : !strcmp(key, "config")        ? &h->config
                      : !strcmp(key, "dtype")         ? &h->dtype
                      : !strcmp(key, "checksum")      ? &h->checksum
                      : !strcmp(key, "checksum_algo") ? &h->checksum_algo
                                                      : NULL;
        free(key);
        if (slot && *slot) {
            free(val);
            p->i = at;
            return jfail(p, "duplicate key in __metadata__");
        }
        if (slot)
            *slot = val;
        else
            free(val); /* other tools' metadata: ignored */
        if (jaccept(p, '}'))
            return 0;
        if (jexpect(p, ',', "expected ',' or '}' in __metadata__"))
            return -1;
    }
}

static int jheader(jp *p, ck_hdr *h)
{
    if (jexpect(p, '{', "expected '{' opening the header"))
        return -1;
    if (!jaccept(p, '}')) {
        for (;;) {
            char *key;
            jws(p);
            size_t at = p->i;
            if (jkey(p, &key))
                return -1;
            if (!strcmp(key, "__metadata__")) {
                free(key);
                if (h->has_meta++) {
                    p->i = at;
                    return jfail(p, "duplicate __metadata__");
                }
                if (jmetadata(p, h))
                    return -1;
            } else {
                for (int i = 0; i < h->n; i++)
                    if (!strcmp(h->e[i].name, key)) {
                        free(key);
                        p->i = at;
                        return jfail(p, "duplicate tensor name");
                    }
                if (!*key) {
                    free(key);
                    p->i = at;
                    return jfail(p, "empty tensor name");
                }
                if (h->n == h->cap) {
                    int cap = h->cap ? 2 * h->cap : 64;
                    ck_ent *q = realloc(h->e, (size_t)cap * sizeof *q);
                    if (!q) {
                        free(key);
                        return jfail(p, "out of memory");
                    }
                    h->e = q;
                    h->cap = cap;
                }
                ck_ent *t = &h->e[h->n++];
                memset(t, 0, sizeof *t);
                t->name = key;
                if (jtensor(p, t))
                    return -1;
            }
            if (jaccept(p, '}'))
                break;
            if (jexpect(p, ',', "expected ',' or '}' after an entry"))
                return -1;
        }
    }
    jws(p);
    if (p->i != p->n)
        return jfail(p, "unexpected characters after the header object");
    return 0;
}

/* Open-file header reading and every check that does not depend on a layout. */
static int read_header(const char *path, int fd, ck_hdr *h)
{
    memset(h, 0, sizeof *h);
    struct stat sb;
    if (fstat(fd, &sb))
        return dl_error(DL_ESYS, "checkpoint '%s': fstat: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return dl_error(DL_EINVAL, "checkpoint '%s' is not a regular file", path);
    h->file_bytes = (uint64_t)sb.st_size;
    unsigned char len[8];
    if (h->file_bytes < 8 || pread_all(fd, len, 8, 0))
        return dl_error(DL_EINVAL,
                        "checkpoint '%s' is too short (%" PRIu64 " bytes) to be a "
                        "safetensors file",
                        path, h->file_bytes);
    uint64_t N = 0;
    for (int i = 7; i >= 0; i--) N = (N << 8) | len[i];
    if (N < 2 || N > CK_MAX_HEADER)
        return dl_error(DL_EINVAL,
                        "checkpoint '%s': header length %" PRIu64 " is out of range "
                        "(2 .. %" PRIu64 "): not a safetensors file",
                        path, N, CK_MAX_HEADER);
    if (N > h->file_bytes - 8)
        return dl_error(DL_EINVAL,
                        "checkpoint '%s': header length %" PRIu64 " exceeds the file "
                        "(%" PRIu64 " bytes): truncated, or not a safetensors file",
                        path, N, h->file_bytes);
    h->N = N;
    h->data_bytes = h->file_bytes - 8 - N;
    char *buf = malloc((size_t)N);
    if (!buf)
        return dl_error(DL_ENOMEM, "checkpoint '%s': out of memory for a %" PRIu64 "-byte header",
                        path, N);
    if (pread_all(fd, buf, (size_t)N, 8)) {
        int er = errno;
        free(buf);
        return dl_error(DL_ESYS, "checkpoint '%s': reading the header: %s", path, errtext(er));
    }
    jp p = {buf, (size_t)N, 0, NULL, 0};
    if (jheader(&p, h)) {
        char near[40];
        size_t a = p.err_at < p.n ? p.err_at : p.n, k = 0;
        for (size_t i = a; i < p.n && k < 24; i++)
            near[k++] = (p.s[i] >= 0x20 && p.s[i] < 0x7f) ? p.s[i] : '?';
        near[k] = '\0';
        free(buf);
        hdr_free(h);
        return dl_error(DL_EINVAL,
                        "checkpoint '%s': malformed header at byte %zu of %" PRIu64
                        ": %s (near \"%s\")",
                        path, a, N, p.err, near);
    }
    free(buf);

    /* tensors: dtype, sizes, and the data section tiled exactly */
    uint64_t maxend = 0;
    for (int i = 0; i < h->n; i++) {
        ck_ent *t = &h->e[i];
        if (!t->dsize)
            return dl_error(DL_EINVAL,
                            "checkpoint '%s': tensor '%s' has dtype \"%s\"; distlab "
                            "reads F32 and F64",
                            path, t->name, t->dtype);
        uint64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            if (t->shape[d] && numel > (UINT64_MAX >> 4) / (uint64_t)t->shape[d])
                return dl_error(DL_EINVAL, "checkpoint '%s': tensor '%s': shape too large", path,
                                t->name);
            numel *= (uint64_t)t->shape[d];
        }
        if (t->end < t->begin || t->end - t->begin != numel * (uint64_t)t->dsize) {
            char sh[160];
            shape_string(t->ndim, t->shape, sh, sizeof sh);
            return dl_error(DL_EINVAL,
                            "checkpoint '%s': tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                            "] do not hold %s x %s (%" PRIu64 " bytes)",
                            path, t->name, t->begin, t->end, t->dtype, sh,
                            numel * (uint64_t)t->dsize);
        }
        if (t->end > maxend)
            maxend = t->end;
    }
    if (maxend > h->data_bytes)
        return dl_error(DL_EINVAL,
                        "checkpoint '%s' is truncated: the header says the data run "
                        "to byte %" PRIu64 " of the data section but the file holds %" PRIu64
                        " data bytes (%" PRIu64 " in all)",
                        path, maxend, h->data_bytes, h->file_bytes);
    {
        /* sorted by begin, the tensors must tile [0, data_bytes) */
        int *ord = malloc((h->n > 0 ? (size_t)h->n : 1) * sizeof *ord);
        if (!ord)
            return dl_error(DL_ENOMEM, "checkpoint '%s': out of memory", path);
        for (int i = 0; i < h->n; i++) ord[i] = i;
        for (int i = 1; i < h->n; i++) { /* insertion sort: files are written in order */
            int x = ord[i], j = i;
            while (j > 0 && h->e[ord[j - 1]].begin > h->e[x].begin) {
                ord[j] = ord[j - 1];
                j--;
            }
            ord[j] = x;
        }
        uint64_t pos = 0;
        for (int i = 0; i < h->n; i++) {
            const ck_ent *t = &h->e[ord[i]];
            if (t->begin != pos) {
                free(ord);
                return dl_error(DL_EINVAL,
                                "checkpoint '%s': tensor '%s' starts at data byte %" PRIu64
                                ", expected %" PRIu64 " (tensors must tile the data "
                                "section without gaps or overlaps)",
                                path, t->name, t->begin, pos);
            }
            pos = t->end;
        }
        free(ord);
        if (pos != h->data_bytes)
            return dl_error(DL_EINVAL,
                            "checkpoint '%s': %" PRIu64 " bytes after the last tensor "
                            "(the data section holds %" PRIu64 ", the tensors %" PRIu64 ")",
                            path, h->data_bytes - pos, h->data_bytes, pos);
    }

    /* metadata: strict when the file says it is ours */
    if (h->format && strcmp(h->format, CK_FORMAT))
        return dl_error(DL_EINVAL,
                        "checkpoint '%s': __metadata__ format is \"%s\", expected \"" CK_FORMAT
                        "\"",
                        path, h->format);
    if (h->format && (!h->version || strcmp(h->version, CK_VERSION)))
        return dl_error(DL_EINVAL,
                        "checkpoint '%s': format version \"%s\" is not supported "
                        "(this library reads version " CK_VERSION ")",
                        path, h->version ? h->version : "(missing)");
    if (h->checksum) {
        int ok = strlen(h->checksum) == 16 &&
                 (!h->checksum_algo || !strcmp(h->checksum_algo, "fnv1a64"));
        for (int i = 0; ok && i < 16; i++) ok = hexval(h->checksum[i]) >= 0;
        if (!ok)
            return dl_error(DL_EINVAL,
                            "checkpoint '%s': checksum \"%s\" (algorithm %s) is not 16 "
                            "hex digits of fnv1a64",
                            path, h->checksum, h->checksum_algo ? h->checksum_algo : "fnv1a64");
    }
    if (h->format) {
        dl_gpt_config c;
        if (!h->config || parse_config(h->config, &c))
            return dl_error(DL_EINVAL, "checkpoint '%s': __metadata__ config \"%s\" is malformed",
                            path, h->config ? h->config : "(missing)");
        if (!h->checksum)
            return dl_error(DL_EINVAL, "checkpoint '%s': __metadata__ has no checksum", path);
    }
    return DL_OK;
}

static void fill_info(const ck_hdr *h, dl_ckpt_info *info)
{
    memset(info, 0, sizeof *info);
    info->ntensors = h->n;
    info->header_bytes = (int64_t)h->N;
    info->data_bytes = (int64_t)h->data_bytes;
    info->dsize = h->n ? h->e[0].dsize : (h->dtype && !strcmp(h->dtype, "F64") ? 8 : 4);
    if (h->config && !parse_config(h->config, &info->cfg))
        info->has_config = 1;
    if (h->checksum) {
        info->has_checksum = 1;
        info->checksum = strtoull(h->checksum, NULL, 16);
    }
}

int dl_ckpt_inspect(const char *path, dl_ckpt_info *info)
{
    if (!path || !info)
        return dl_error(DL_EINVAL, "checkpoint inspect: null argument");
    int fd, rc = dl_path_open_input(path, "checkpoint", &fd);
    if (rc)
        return rc;
    ck_hdr h;
    rc = read_header(path, fd, &h);
    if (!rc)
        fill_info(&h, info);
    hdr_free(&h);
    close(fd);
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* load                                                                                       */

/* Read `n` elements of size fds at `off` into dst (elements of dsize), converting. */
static int read_run(int fd, void *dst, size_t n, int fds, int dsize, off_t off, void *stage)
{
    if (CK_HOST_LE && fds == dsize)
        return pread_all(fd, dst, n * (size_t)dsize, off);
    size_t per = CK_IOBUF / 8;
    char *d = dst;
    while (n) {
        size_t m = n < per ? n : per;
        if (pread_all(fd, stage, m * (size_t)fds, off))
            return -1;
        if (!CK_HOST_LE)
            bswap_elems(stage, m, fds);
        if (fds == dsize)
            memcpy(d, stage, m * (size_t)dsize);
        else if (fds == 8) /* f64 file into an f32 run */
            for (size_t i = 0; i < m; i++)
                ((float *)(void *)d)[i] = (float)((const double *)stage)[i];
        else
            for (size_t i = 0; i < m; i++)
                ((double *)(void *)d)[i] = (double)((const float *)stage)[i];
        d += m * (size_t)dsize;
        off += (off_t)(m * (size_t)fds);
        n -= m;
    }
    return 0;
}

/* Index of the first NaN or infinity of p[0..n-1] (elements of dsize 4 or 8), n if none: a
 * checkpoint is refused for one (a checksum only says the file is as written; training from
 * NaN weights would print "loss nan" for ever). */
static size_t first_nonfinite(const void *p, size_t n, int dsize)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(dsize == 8 ? ((const double *)p)[i] : (double)((const float *)p)[i]))
            return i;
    return n;
}

int dl_ckpt_load(const char *path, const dl_gpt_layout *l, void *params, int dsize)
{
    return dl_ckpt_load_ex(path, l, params, dsize, DL_CKPT_VERIFY_AUTO, NULL);
}

int dl_ckpt_load_ex(const char *path, const dl_gpt_layout *l, void *params, int dsize,
                    dl_ckpt_verify verify, dl_ckpt_info *info)
{
    if (!path || !*path)
        return dl_error(DL_EINVAL, "checkpoint load: empty file name");
    if (!l)
        return dl_error(DL_EINVAL, "checkpoint load from '%s': null layout", path);
    if (dsize != 4 && dsize != 8)
        return dl_error(DL_EINVAL, "checkpoint load from '%s': element size %d (expected 4 or 8)",
                        path, dsize);
    if (!params && l->numel)
        return dl_error(DL_EINVAL, "checkpoint load from '%s': null parameter buffer", path);
    if (verify != DL_CKPT_VERIFY_AUTO && verify != DL_CKPT_VERIFY_ALWAYS &&
        verify != DL_CKPT_VERIFY_NEVER)
        return dl_error(DL_EINVAL, "checkpoint load from '%s': bad verify policy %d", path,
                        (int)verify);
    int fd, rc = dl_path_open_input(path, "checkpoint", &fd);
    if (rc)
        return rc;
    ck_hdr h;
    rc = read_header(path, fd, &h);
    if (rc) {
        hdr_free(&h);
        close(fd);
        return rc;
    }
    /* the file must hold the whole model (a pipeline stage reads its part of it) */
    const dl_gpt_layout *part = l, *full = l;
    dl_gpt_layout *own_full = NULL;
    int *map = NULL, *pmap = NULL;
    void *stage = malloc(CK_IOBUF);
    dl_ckpt_info inf;
    fill_info(&h, &inf);
    if ((rc = whole_layout(part, &full, &own_full))) {
        rc = dl_error(rc, "checkpoint load from '%s': %s", path, dl_errmsg());
        goto out;
    }
    l = full;
    map = calloc((size_t)(l->ntensors ? l->ntensors : 1), sizeof *map);
    pmap = calloc((size_t)(part->ntensors ? part->ntensors : 1), sizeof *pmap);
    if (!map || !pmap || !stage) {
        rc = dl_error(DL_ENOMEM, "checkpoint load from '%s': out of memory", path);
        goto out;
    }

    /* every tensor of the whole model, with its global shape */
    for (int k = 0; k < l->ntensors; k++) {
        const dl_tensor_info *t = &l->t[k];
        int j = -1;
        for (int i = 0; i < h.n; i++)
            if (!h.e[i].used && !strcmp(h.e[i].name, t->name)) {
                j = i;
                break;
            }
        char want[64], got[160];
        shape_string(t->ndim, t->shape, want, sizeof want);
        if (j < 0) {
            char cfg[160];
            config_string(&l->cfg, cfg, sizeof cfg);
            rc = dl_error(DL_EINVAL,
                          "checkpoint '%s' has no tensor '%s' %s, which this model "
                          "(%s) needs%s%s",
                          path, t->name, want, cfg,
                          inf.has_config ? "; the file was saved with " : "",
                          inf.has_config ? h.config : "");
            goto out;
        }
        const ck_ent *e = &h.e[j];
        int same = e->ndim == t->ndim;
        for (int d = 0; same && d < t->ndim; d++) same = e->shape[d] == t->shape[d];
        if (!same) {
            shape_string(e->ndim, e->shape, got, sizeof got);
            rc = dl_error(DL_EINVAL,
                          "checkpoint '%s': tensor '%s' has shape %s in the file but "
                          "%s in this model (the configs differ)",
                          path, t->name, got, want);
            goto out;
        }
        h.e[j].used = 1;
        map[k] = j;
    }
    for (int i = 0; i < h.n; i++)
        if (!h.e[i].used) {
            char got[160];
            shape_string(h.e[i].ndim, h.e[i].shape, got, sizeof got);
            rc = dl_error(DL_EINVAL,
                          "checkpoint '%s': tensor '%s' %s is not part of this model "
                          "(was it saved with more layers or an untied head?)",
                          path, h.e[i].name, got);
            goto out;
        }
    if (inf.has_config) {
        const dl_gpt_config *a = &inf.cfg, *b = &l->cfg;
        if (a->layers != b->layers || a->d_model != b->d_model || a->heads != b->heads ||
            a->seq != b->seq || a->vocab != b->vocab || a->tie != b->tie) {
            char cfg[160];
            config_string(b, cfg, sizeof cfg);
            rc = dl_error(DL_EINVAL, "checkpoint '%s' was saved with config %s; this model is %s",
                          path, h.config, cfg);
            goto out;
        }
    }

    /* checksum of the whole data section */
    int do_verify =
        verify == DL_CKPT_VERIFY_ALWAYS || (verify == DL_CKPT_VERIFY_AUTO && l->tp_rank == 0);
    if (do_verify && inf.has_checksum) {
        uint64_t hsh;
        if (hash_range(fd, (off_t)(8 + h.N), h.data_bytes, stage, &hsh)) {
            rc = dl_error(DL_ESYS, "checkpoint '%s': reading the data: %s", path, errtext(errno));
            goto out;
        }
        if (hsh != inf.checksum) {
            rc = dl_error(DL_EINVAL,
                          "checkpoint '%s': checksum mismatch: the data section hashes "
                          "to %016" PRIx64 " but the header says %016" PRIx64 " (the file is "
                          "corrupted)",
                          path, hsh, inf.checksum);
            goto out;
        }
        inf.checksum_verified = 1;
    }

    /* this rank's slices (of its part; the whole model's tensor ids index `map`) */
    l = part;
    for (int k = 0; k < l->ntensors; k++) pmap[k] = map[l->t[k].id];
    for (int k = 0; k < l->ntensors; k++) {
        const dl_tensor_info *t = &l->t[k];
        const ck_ent *e = &h.e[pmap[k]];
        size_t run = run_len(l, t);
        char *dst = (char *)params + t->offset * (size_t)dsize;
        if (e->dsize != dsize)
            inf.converted = 1;
        for (size_t i = 0; i < t->numel; i += run) {
            int64_t g = dl_gpt_global_index(l, k, i);
            off_t off = (off_t)(8 + h.N + e->begin + (uint64_t)g * (uint64_t)e->dsize);
            if (read_run(fd, dst + i * (size_t)dsize, run, e->dsize, dsize, off, stage)) {
                rc = dl_error(DL_ESYS, "checkpoint '%s': reading %s at byte %lld: %s", path,
                              t->name, (long long)off, errtext(errno));
                goto out;
            }
        }
        size_t bad = first_nonfinite(dst, t->numel, dsize);
        if (bad < t->numel) {
            double v = dsize == 8 ? ((const double *)dst)[bad] : ((const float *)dst)[bad];
            rc = dl_error(DL_EINVAL,
                          "checkpoint '%s': tensor '%s' holds a non-finite value (%g "
                          "at element %zu of this rank's part); refusing to load it",
                          path, t->name, v, bad);
            goto out;
        }
    }
    rc = DL_OK;
out:
    if (info)
        *info = inf;
    free(map);
    free(pmap);
    dl_gpt_layout_destroy(own_full);
    free(stage);
    hdr_free(&h);
    close(fd);
    return rc;
}
