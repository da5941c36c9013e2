#define _GNU_SOURCE
/* Checkpoints: the sharded, atomic save (include/distlab/ckpt.h describes the protocol): the
 * header a layout saves, the writers' slices, the status all-reduces between the phases. */
#include "config.h"
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>
#include "distlab.h"
#include "io/ckpt_priv.h"
#include "io/path.h"
#include "core/json.h"
#include "core/strbuf.h"

static const char *dtype_name(int dsize) { return dsize == 8 ? "F64" : "F32"; }

static int64_t global_numel(const dl_tensor_info *t) { return t->shape[0] * t->shape[1]; }

/* The head stage's copy of a tied wte (equal to the first stage's): not written twice. */
static int is_tied_copy(const dl_gpt_layout *l, const dl_tensor_info *t)
{
    return t->id == 0 && !l->part.embed;
}

/* The header a layout saves. */
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
    dl__ck_config_string(&l->cfg, cfg, sizeof cfg);
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
        return dl__ck_pwrite_all(fd, src, n * (size_t)dsize, off);
    const char *p = src;
    size_t per = CK_IOBUF / (size_t)dsize;
    while (n) {
        size_t m = n < per ? n : per;
        memcpy(stage, p, m * (size_t)dsize);
        dl__ck_bswap(stage, m, dsize);
        if (dl__ck_pwrite_all(fd, stage, m * (size_t)dsize, off))
            return -1;
        p += m * (size_t)dsize;
        off += (off_t)(m * (size_t)dsize);
        n -= m;
    }
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
    dl__ck_fail(e, (int)v[0],
                "checkpoint save to '%s' failed on rank %d of the group (%s); nothing was "
                "written there",
                path, (int)v[1] - 1, dl_strstatus((int)v[0]));
    return 1;
}

/* One save's state, shared by its phases. */
typedef struct ck_save {
    const char *path;
    const dl_gpt_layout *l;
    const void *params;
    int dsize, writer, me;
    dl_comm *group;
    ck_err e;
    ck_plan plan;
    char tmp[4200];
    int fd, have_tmp;
    void *stage;
    dl_gpt_layout *own_full;
    long pid;
    float v[6 + CK_COVER]; /* status, failing rank, sig, -sig, pid lo/hi, writer per tp rank */
} ck_save;

/* The arguments, the output path (rank 0), the whole model's header, the staging buffer. */
static void save_prepare(ck_save *s)
{
    const char *path = s->path;
    const dl_gpt_layout *l = s->l;
    int rc;
    if (!path || !*path)
        dl__ck_fail(&s->e, DL_EINVAL, "checkpoint save: empty file name");
    else if (strlen(path) > 4000)
        dl__ck_fail(&s->e, DL_EINVAL, "checkpoint save: file name too long (%zu bytes)",
                    strlen(path));
    else if (!l)
        dl__ck_fail(&s->e, DL_EINVAL, "checkpoint save to '%s': null layout", path);
    else if (s->dsize != 4 && s->dsize != 8)
        dl__ck_fail(&s->e, DL_EINVAL, "checkpoint save to '%s': element size %d (expected 4 or 8)",
                    path, s->dsize);
    else if (!s->params && l->numel)
        dl__ck_fail(&s->e, DL_EINVAL, "checkpoint save to '%s': null parameter buffer", path);
    else if (s->me == 0 && (rc = dl_path_check_output(path, "checkpoint save")))
        dl__ck_fail(&s->e, rc, "%s", dl_errmsg());
    const dl_gpt_layout *full = l;
    if (!s->e.st && dl__ck_whole_layout(l, &full, &s->own_full))
        dl__ck_fail(&s->e, DL_ENOMEM, "checkpoint save to '%s': %s", path, dl_errmsg());
    if (!s->e.st && plan_build(full, s->dsize, &s->plan))
        dl__ck_fail(&s->e, DL_ENOMEM, "checkpoint save to '%s': out of memory building the header",
                    path);
    if (!s->e.st && !CK_HOST_LE && !(s->stage = malloc(CK_IOBUF)))
        dl__ck_fail(&s->e, DL_ENOMEM, "checkpoint save to '%s': out of memory", path);
    s->pid = (long)getpid();
}

/* 1. rank 0 creates the temporary file with the header and its full size (after removing the
 * temporaries of earlier writers that were killed) */
static void save_create(ck_save *s)
{
    const ck_plan *plan = &s->plan;
    dl_path_remove_stale_tmp(s->path);
    snprintf(s->tmp, sizeof s->tmp, "%s.tmp.%ld", s->path, s->pid);
    s->fd = open(s->tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (s->fd < 0) {
        dl__ck_fail(&s->e, DL_ESYS, "checkpoint save: cannot create '%s': %s", s->tmp,
                    dl__ck_errtext(errno));
        return;
    }
    s->have_tmp = 1;
    unsigned char len[8];
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)(plan->N >> (8 * i));
    off_t total = (off_t)(8 + plan->N + plan->data_bytes);
    if (dl__ck_pwrite_all(s->fd, len, 8, 0) || dl__ck_pwrite_all(s->fd, plan->hdr, plan->N, 8))
        dl__ck_fail(&s->e, DL_ESYS, "checkpoint save: writing the header of '%s': %s", s->tmp,
                    dl__ck_errtext(errno));
    else if (ftruncate(s->fd, total))
        dl__ck_fail(&s->e, DL_ESYS, "checkpoint save: cannot size '%s' to %lld bytes: %s", s->tmp,
                    (long long)total, dl__ck_errtext(errno));
    else if (fallocate(s->fd, 0, 0, total) && errno != EOPNOTSUPP && errno != ENOSYS &&
             errno != EINVAL)
        dl__ck_fail(&s->e, DL_ESYS, "checkpoint save: cannot reserve %lld bytes for '%s': %s",
                    (long long)total, s->tmp, dl__ck_errtext(errno));
}

/* The group agrees: nobody failed, the same config / tp / dtype everywhere, a writer for every
 * tp rank; then everyone knows rank 0's temporary name. Nonzero: the save is over. */
static int save_agree(ck_save *s)
{
    const dl_gpt_layout *l = s->l;
    float *v = s->v;
    set_status(v, &s->e, s->me);
    if (!s->e.st) {
        float sig = group_sig(l, s->dsize);
        v[2] = sig;
        v[3] = -sig;
        if (s->me == 0) {
            v[4] = (float)(s->pid & 0xfff);
            v[5] = (float)(s->pid >> 12);
        }
        if (s->writer && l->tp_rank < CK_COVER)
            v[6 + l->tp_rank] = 1.0f;
    }
    int rc = status_sync(s->group, v, sizeof s->v / sizeof s->v[0]);
    if (rc) {
        dl__ck_fail(&s->e, rc, "checkpoint save to '%s': status all-reduce failed: %s",
                    s->path ? s->path : "", dl_errmsg());
        return -1;
    }
    if (group_failed(&s->e, v, s->path))
        return -1;
    if (v[2] != -v[3]) {
        dl__ck_fail(&s->e, DL_EINVAL,
                    "checkpoint save to '%s': the ranks of the group disagree on the "
                    "model config, tp degree or dtype",
                    s->path);
        return -1;
    }
    if (l->tp <= CK_COVER)
        for (int r = 0; r < l->tp; r++)
            if (v[6 + r] != 1.0f) {
                dl__ck_fail(&s->e, DL_EINVAL,
                            "checkpoint save to '%s': no writer holds tp rank %d's shard "
                            "(pass writer = 1 on one member per tp rank)",
                            s->path, r);
                return -1;
            }
    s->pid = (long)v[4] + ((long)v[5] << 12);
    snprintf(s->tmp, sizeof s->tmp, "%s.tmp.%ld", s->path, s->pid);
    return 0;
}

/* 2. every writer writes its slices at their global offsets */
static void save_write(ck_save *s)
{
    const dl_gpt_layout *l = s->l;
    int dsize = s->dsize;
    if (s->fd < 0 && (s->fd = open(s->tmp, O_WRONLY | O_CLOEXEC)) < 0)
        dl__ck_fail(&s->e, DL_ESYS, "checkpoint save: cannot open '%s' for writing: %s", s->tmp,
                    dl__ck_errtext(errno));
    for (int k = 0; k < l->ntensors && !s->e.st; k++) {
        const dl_tensor_info *t = &l->t[k];
        if (t->shard == DL_SHARD_NONE && l->tp_rank != 0)
            continue; /* replicated: the tp_rank 0 writer's */
        if (is_tied_copy(l, t))
            continue; /* the first stage writes wte */
        size_t run = dl__ck_run_len(l, t);
        const char *src = (const char *)s->params + t->offset * (size_t)dsize;
        for (size_t i = 0; i < t->numel; i += run) {
            int64_t g = dl_gpt_global_index(l, k, i);
            off_t off =
                (off_t)(8 + s->plan.N + s->plan.begin[t->id] + (uint64_t)g * (uint64_t)dsize);
            if (write_run(s->fd, src + i * (size_t)dsize, run, dsize, off, s->stage)) {
                dl__ck_fail(&s->e, DL_ESYS, "checkpoint save: writing %s to '%s' at byte %lld: %s",
                            t->name, s->tmp, (long long)off, dl__ck_errtext(errno));
                break;
            }
        }
    }
}

/* Make a rename in path's directory durable: sync the directory (best effort). */
static void sync_dir(const char *path)
{
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

/* 3. rank 0: checksum, fsync, atomic rename */
static void save_finish(ck_save *s)
{
    void *buf = malloc(CK_IOBUF);
    uint64_t h = 0;
    if (!buf)
        dl__ck_fail(&s->e, DL_ENOMEM, "checkpoint save to '%s': out of memory", s->path);
    else if (dl__ck_hash_range(s->fd, (off_t)(8 + s->plan.N), s->plan.data_bytes, buf, &h))
        dl__ck_fail(&s->e, DL_ESYS, "checkpoint save: reading '%s' back: %s", s->tmp,
                    dl__ck_errtext(errno));
    free(buf);
    if (!s->e.st) {
        char hex[17];
        snprintf(hex, sizeof hex, "%016" PRIx64, h);
        if (dl__ck_pwrite_all(s->fd, hex, 16, (off_t)(8 + s->plan.cksum_pos)))
            dl__ck_fail(&s->e, DL_ESYS, "checkpoint save: writing the checksum of '%s': %s", s->tmp,
                        dl__ck_errtext(errno));
    }
    if (!s->e.st && fsync(s->fd))
        dl__ck_fail(&s->e, DL_ESYS, "checkpoint save: fsync of '%s': %s", s->tmp,
                    dl__ck_errtext(errno));
    int cr = close(s->fd);
    s->fd = -1;
    if (!s->e.st && cr)
        dl__ck_fail(&s->e, DL_ESYS, "checkpoint save: closing '%s': %s", s->tmp,
                    dl__ck_errtext(errno));
    if (!s->e.st && rename(s->tmp, s->path))
        dl__ck_fail(&s->e, DL_ESYS, "checkpoint save: cannot rename '%s' to '%s': %s", s->tmp,
                    s->path, dl__ck_errtext(errno));
    if (!s->e.st) {
        s->have_tmp = 0;
        sync_dir(s->path);
    }
}

/* The status all-reduce between phases; nonzero when the save failed anywhere. */
static int save_sync(ck_save *s)
{
    set_status(s->v, &s->e, s->me);
    int rc = status_sync(s->group, s->v, 2);
    if (rc) {
        dl__ck_fail(&s->e, rc, "checkpoint save to '%s': status all-reduce failed: %s", s->path,
                    dl_errmsg());
        return -1;
    }
    return group_failed(&s->e, s->v, s->path);
}

int dl_ckpt_save(const char *path, const dl_gpt_layout *l, const void *params, int dsize,
                 dl_comm *group, int writer)
{
    if (!group)
        return dl_error(DL_EINVAL, "checkpoint save to '%s': null group", path ? path : "(null)");
    ck_save s = {.path = path,
                 .l = l,
                 .params = params,
                 .dsize = dsize,
                 .writer = writer,
                 .me = dl_comm_rank(group),
                 .group = group,
                 .fd = -1};
    save_prepare(&s);
    if (s.me == 0 && !s.e.st)
        save_create(&s);
    if (save_agree(&s))
        goto out;
    if (writer)
        save_write(&s);
    if (s.me != 0 && s.fd >= 0) {
        if (close(s.fd) && !s.e.st)
            dl__ck_fail(&s.e, DL_ESYS, "checkpoint save: closing '%s': %s", s.tmp,
                        dl__ck_errtext(errno));
        s.fd = -1;
    }
    if (save_sync(&s))
        goto out;
    if (s.me == 0)
        save_finish(&s);
    save_sync(&s);
out:
    if (s.fd >= 0)
        close(s.fd);
    if (s.have_tmp && s.me == 0)
        unlink(s.tmp);
    free(s.stage);
    plan_free(&s.plan);
    dl_gpt_layout_destroy(s.own_full);
    return dl__ck_return(&s.e);
}
