#define _GNU_SOURCE
/* Full-state checkpoints in global terms: the runs of a layout's buffers and of a checkpoint's
 * files, and the load that intersects them (lib/io/ckdir_map.h). */
#include "config.h"
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "distlab.h"
#include "io/ckdir.h"
#include "io/ckdir_map.h"
#include "io/ckpt_priv.h"
#include "io/path.h"
#include "model/sublayer.h"

const char *const dl__ckd_kind_names[DL_CKD_KINDS] = {"parameter", "exp_avg", "exp_avg_sq"};

int dl__ckd_model(json_t *m, const char *what, dl_gpt_layout **whole)
{
    json_t *g = json_object_get(m, "model");
    const char *keys[6] = {"layers", "d_model", "heads", "seq", "vocab", "tie"};
    int v[6];
    for (int i = 0; i < 6; i++) {
        json_t *x = json_object_get(g, keys[i]);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > 1 << 24)
            return dl_error(DL_EINVAL, "%s: no valid model.%s", what, keys[i]);
        v[i] = (int)json_integer_value(x);
    }
    dl_gpt_config c =
        {.layers = v[0], .d_model = v[1], .heads = v[2], .seq = v[3], .vocab = v[4], .tie = v[5]};
    /* the mixture of experts names the layers' tensors (a manifest without "moe": none) */
    json_t *moe = json_object_get(m, "moe");
    const char *mk[4] = {"experts", "top_k", "moe_every", "expert_ffn"};
    int *mv[4] = {&c.experts, &c.top_k, &c.moe_every, &c.expert_ffn};
    for (int i = 0; moe && i < 4; i++) {
        json_t *x = json_object_get(moe, mk[i]);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > 1 << 24)
            return dl_error(DL_EINVAL, "%s: no valid moe.%s", what, mk[i]);
        *mv[i] = (int)json_integer_value(x);
    }
    if (dl_gpt_layout_create(&c, 1, 0, whole))
        return dl_error(DL_EINVAL, "%s: the model: %s", what, dl_errmsg());
    return DL_OK;
}

void dl__ckd_runs_free(dl__ckd_runs *r)
{
    free(r->r);
    memset(r, 0, sizeof *r);
}

/* append r, or extend the last run when r continues it (elements and place; step per element) */
static void push(dl__ckd_runs *o, dl__ckd_run r, uint64_t step)
{
    dl__ckd_run *p = o->n ? &o->r[o->n - 1] : NULL;
    if (p && p->slot == r.slot && p->file == r.file && p->g + p->n == r.g &&
        p->at + (uint64_t)p->n * step == r.at) {
        p->n += r.n;
        return;
    }
    if (o->n == o->cap) {
        size_t cap = o->cap ? 2 * o->cap : 256;
        dl__ckd_run *q = realloc(o->r, cap * sizeof *q);
        if (!q) {
            o->nomem = 1;
            return;
        }
        o->r = q, o->cap = cap;
    }
    o->r[o->n++] = r;
}

/* local elements of tensor t whose global indices are consecutive: a row (COLS), a rank's rows
 * of one third (QKV), the whole tensor otherwise */
static size_t contiguous_span(const dl_gpt_layout *l, const dl_tensor_info *t)
{
    size_t cols = (size_t)t->local[1];
    if (t->shard == DL_SHARD_COLS)
        return cols;
    if (t->shard == DL_SHARD_QKV)
        return (size_t)(t->shape[0] / 3 / l->tp) * cols;
    return t->numel;
}

void dl__ckd_flat_runs(dl__ckd_runs *out, const dl_gpt_layout *whole, const dl_gpt_layout *l,
                       int kind, size_t lo, size_t n, uint64_t at, uint64_t step, int es, int file,
                       int flags)
{
    for (int k = 0; k < l->ntensors; k++) {
        const dl_tensor_info *t = &l->t[k];
        size_t a = lo > t->offset ? lo : t->offset, b = t->offset + t->numel;
        if (lo + n < b)
            b = lo + n;
        int w = dl_gpt_find(whole, t->name);
        if (a >= b || w < 0 || ((flags & DL_CKD_SKIP_TIED) && t->id == 0 && !l->part.embed) ||
            ((flags & DL_CKD_ONE_REPLICA) && t->shard == DL_SHARD_NONE && l->tp_rank != 0) ||
            ((flags & DL_CKD_EXPERTS_ONLY) && !dl__is_expert(t->name)))
            continue;
        size_t span = contiguous_span(l, t);
        for (size_t i = a - t->offset; i < b - t->offset;) {
            size_t e = (i / span + 1) * span;
            if (e > b - t->offset)
                e = b - t->offset;
            dl__ckd_run r = {w * DL_CKD_KINDS + kind,          file,
                             dl_gpt_global_index(l, k, i),     (int64_t)(e - i),
                             at + (t->offset + i - lo) * step, es};
            push(out, r, step);
            i = e;
        }
    }
}

/* ---- the checkpoint's side ---- */

/* one file of the manifest: where its data starts and its header */
typedef struct src_file {
    const char *name;
    json_t *hdr;
    uint64_t base, size;
} src_file;

static int open_file(const char *dir, src_file *f)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", dir, f->name);
    int fd;
    if (dl_path_open_input(p, "checkpoint shard", &fd))
        return dl_error(DL_EINVAL, "%s: missing (%s)", p, dl_errmsg());
    struct stat sb;
    uint64_t N = 0;
    f->hdr = fstat(fd, &sb) == 0 ? dl__ckd_header(fd, p, &N, (uint64_t)sb.st_size) : NULL;
    close(fd);
    f->base = 8 + N;
    f->size = (uint64_t)sb.st_size;
    return f->hdr ? DL_OK : DL_EINVAL;
}

/* tensor `name` of file f: its data's byte range in the file and its element size */
static int data_range(const char *dir, const src_file *f, const char *name, uint64_t *a,
                      uint64_t *b, int *es)
{
    json_t *t = json_object_get(f->hdr, name), *off = json_object_get(t, "data_offsets");
    const char *dt = json_string_value(json_object_get(t, "dtype"));
    json_int_t x = json_integer_value(json_array_get(off, 0)),
               y = json_integer_value(json_array_get(off, 1));
    *es = dt && strcmp(dt, "F64") == 0 ? 8 : dt && strcmp(dt, "F32") == 0 ? 4 : 0;
    if (!t || !*es || x < 0 || y < x || f->base + (uint64_t)y > f->size)
        return dl_error(DL_EINVAL, "%s/%s: tensor '%s' missing, not F32/F64, or outside the file",
                        dir, f->name, name);
    *a = f->base + (uint64_t)x, *b = f->base + (uint64_t)y;
    return DL_OK;
}

static int64_t int_at(json_t *a, size_t i) { return json_integer_value(json_array_get(a, i)); }

/* a parameter piece: its hyperslab blocks, one after another in the file from byte a */
static int block_runs(dl__ckd_runs *o, json_t *blocks, const dl_tensor_info *w, int slot, int file,
                      uint64_t a, uint64_t b, int es)
{
    int64_t cols = w->ndim == 2 ? w->shape[1] : 1;
    uint64_t at = a;
    json_t *bl;
    size_t i;
    json_array_foreach(blocks, i, bl)
    {
        json_t *st = json_object_get(bl, "start"), *ct = json_object_get(bl, "count");
        int64_t r0 = int_at(st, 0), c0 = w->ndim == 2 ? int_at(st, 1) : 0;
        int64_t nr = int_at(ct, 0), nc = w->ndim == 2 ? int_at(ct, 1) : 1;
        if ((int)json_array_size(st) != w->ndim || (int)json_array_size(ct) != w->ndim || r0 < 0 ||
            c0 < 0 || nr < 0 || nc < 0 || r0 + nr > w->shape[0] || c0 + nc > cols)
            return -1;
        for (int64_t r = 0; r < nr; r++, at += (uint64_t)(nc * es))
            push(o, (dl__ckd_run){slot, file, (r0 + r) * cols + c0, nc, at, es}, (uint64_t)es);
    }
    return at == b ? 0 : -1;
}

/* a moments piece: the saving rank's ZeRO units of its layout's flat buffer */
static int flat_piece_runs(dl__ckd_runs *o, json_t *flat, const dl_gpt_layout *whole, int kind,
                           int file, uint64_t a, uint64_t b, int es)
{
    json_t *pt = json_object_get(flat, "part"), *ch = json_object_get(pt, "chunks"), *u;
    dl_gpt_part part = {.nchunks = (int)json_array_size(ch),
                        .embed = json_is_true(json_object_get(pt, "embed")),
                        .head = json_is_true(json_object_get(pt, "head"))};
    for (int c = 0; c < part.nchunks && c < DL_GPT_MAX_CHUNKS; c++) {
        part.first[c] = (int)int_at(json_array_get(ch, (size_t)c), 0);
        part.count[c] = (int)int_at(json_array_get(ch, (size_t)c), 1);
    }
    /* (a part without "ep": written before expert parallelism, every expert held) */
    json_t *ep = json_object_get(pt, "ep");
    dl_gpt_layout *l;
    if (dl_gpt_layout_create_ep(&whole->cfg, (int)json_integer_value(json_object_get(pt, "tp")),
                                (int)json_integer_value(json_object_get(pt, "tp_rank")),
                                ep ? (int)json_integer_value(ep) : 1,
                                (int)json_integer_value(json_object_get(pt, "ep_rank")), &part, &l))
        return -1;
    int bad = 0;
    size_t i;
    json_array_foreach(json_object_get(flat, "units"), i, u)
    {
        json_int_t begin = json_integer_value(json_object_get(u, "begin")),
                   owned = json_integer_value(json_object_get(u, "owned")),
                   at = json_integer_value(json_object_get(u, "at"));
        if (begin < 0 || owned < 0 || at < 0 || (uint64_t)(begin + owned) > l->numel ||
            a + (uint64_t)(at + owned) * (uint64_t)es > b) {
            bad = 1;
            break;
        }
        dl__ckd_flat_runs(o, whole, l, kind, (size_t)begin, (size_t)owned,
                          a + (uint64_t)at * (uint64_t)es, (uint64_t)es, es, file,
                          DL_CKD_SKIP_TIED);
    }
    dl_gpt_layout_destroy(l);
    return bad ? -1 : 0;
}

/* one piece of tensor `name` (in file fi) into runs */
static int piece_runs(const char *dir, dl__ckd_runs *o, const dl_gpt_layout *whole,
                      const char *name, json_t *pc, src_file *files, int fi)
{
    uint64_t a = 0, b = 0;
    int es, rc = data_range(dir, &files[fi], name, &a, &b, &es);
    if (rc)
        return rc;
    json_t *flat = json_object_get(pc, "flat");
    int kind = !flat                                   ? DL_CKD_PARAM
               : strcmp(name, "optim.exp_avg") == 0    ? DL_CKD_EXP_AVG
               : strcmp(name, "optim.exp_avg_sq") == 0 ? DL_CKD_EXP_AVG_SQ
                                                       : -1;
    int w = flat ? 0 : dl_gpt_find(whole, name);
    if (kind < 0 || w < 0)
        return dl_error(DL_EINVAL, "%s/" DL_CKD_MANIFEST ": tensor '%s' is not in the model", dir,
                        name);
    int bad = flat ? flat_piece_runs(o, flat, whole, kind, fi, a, b, es)
                   : block_runs(o, json_object_get(pc, "blocks"), &whole->t[w],
                                w * DL_CKD_KINDS + kind, fi, a, b, es);
    if (bad)
        return dl_error(DL_EINVAL, "%s/%s: tensor '%s': a piece that does not fit its shape", dir,
                        files[fi].name, name);
    return DL_OK;
}

static int cmp_run(const void *x, const void *y)
{
    const dl__ckd_run *a = x, *b = y;
    if (a->slot != b->slot)
        return a->slot < b->slot ? -1 : 1;
    if (a->g != b->g)
        return a->g < b->g ? -1 : 1;
    return (a->file > b->file) - (a->file < b->file);
}

/* sorted, each element once (a tp replica's ranges again: dropped) */
static void disjoint(dl__ckd_runs *o)
{
    qsort(o->r, o->n, sizeof *o->r, cmp_run);
    size_t k = 0;
    for (size_t i = 0; i < o->n; i++) {
        dl__ckd_run r = o->r[i];
        int64_t end = k && o->r[k - 1].slot == r.slot ? o->r[k - 1].g + o->r[k - 1].n : INT64_MIN;
        if (r.g + r.n <= end)
            continue;
        if (r.g < end) {
            r.at += (uint64_t)(end - r.g) * (uint64_t)r.es;
            r.n -= end - r.g, r.g = end;
        }
        o->r[k++] = r;
    }
    o->n = k;
}

/* the manifest's files with their headers (free with free_files) */
static int load_files(const char *dir, json_t *m, src_file **out, int *n)
{
    json_t *files = json_object_get(m, "files");
    *n = (int)json_array_size(files);
    src_file *f = calloc((size_t)*n + 1, sizeof *f);
    *out = f;
    if (!f)
        return dl_error(DL_ENOMEM, "checkpoint: out of memory");
    int rc = DL_OK;
    for (int i = 0; i < *n && rc == DL_OK; i++) {
        f[i].name = json_string_value(json_object_get(json_array_get(files, (size_t)i), "name"));
        rc = open_file(dir, &f[i]);
    }
    return rc;
}

static void free_files(src_file *f, int n)
{
    for (int i = 0; f && i < n; i++) json_decref(f[i].hdr);
    free(f);
}

static int file_index(const src_file *f, int n, const char *name)
{
    for (int i = 0; name && i < n; i++)
        if (strcmp(f[i].name, name) == 0)
            return i;
    return -1;
}

int dl__ckd_source_runs(const char *dir, json_t *m, const dl_gpt_layout *whole, dl__ckd_runs *out)
{
    memset(out, 0, sizeof *out);
    src_file *files;
    int nf, rc = load_files(dir, m, &files, &nf);
    const char *name;
    json_t *t, *pc;
    json_object_foreach(json_object_get(m, "tensors"), name, t)
    {
        size_t i;
        json_array_foreach(json_object_get(t, "pieces"), i, pc)
        {
            const char *fname = json_string_value(json_object_get(pc, "file"));
            int fi = file_index(files, nf, fname);
            if (rc || json_is_true(json_object_get(pc, "tied_copy")))
                continue;
            if (fi < 0)
                rc = dl_error(DL_EINVAL,
                              "%s/" DL_CKD_MANIFEST ": tensor '%s': a piece in no listed file", dir,
                              name);
            else
                rc = piece_runs(dir, out, whole, name, pc, files, fi);
        }
    }
    free_files(files, nf);
    if (rc == DL_OK && out->nomem)
        rc = dl_error(DL_ENOMEM, "checkpoint: out of memory");
    if (rc == DL_OK)
        disjoint(out);
    return rc;
}

/* ---- the load ---- */

typedef struct read_op {
    int file;
    uint64_t off;
    char *dst;
    size_t bytes;
} read_op;

static int cmp_op(const void *x, const void *y)
{
    const read_op *a = x, *b = y;
    if (a->file != b->file)
        return a->file < b->file ? -1 : 1;
    return (a->off > b->off) - (a->off < b->off);
}

/* the first source run of slot s that ends after g */
static size_t first_source(const dl__ckd_runs *src, int s, int64_t g)
{
    size_t lo = 0, hi = src->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const dl__ckd_run *r = &src->r[mid];
        if (r->slot < s || (r->slot == s && r->g + r->n <= g))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* the reads that fill target run t (appended to ops) */
static int plan_run(const dl__ckd_runs *src, const dl__ckd_run *t, char *base,
                    const dl_gpt_layout *whole, read_op **ops, size_t *nops, size_t *cap)
{
    int64_t covered = 0;
    const char *name = whole->t[t->slot / DL_CKD_KINDS].name,
               *kn = dl__ckd_kind_names[t->slot % DL_CKD_KINDS];
    for (size_t i = first_source(src, t->slot, t->g);
         i < src->n && src->r[i].slot == t->slot && src->r[i].g < t->g + t->n; i++) {
        const dl__ckd_run *s = &src->r[i];
        int64_t lo = s->g > t->g ? s->g : t->g, hi = s->g + s->n;
        if (hi > t->g + t->n)
            hi = t->g + t->n;
        if (s->es != t->es)
            return dl_error(DL_EINVAL,
                            "--resume: %s's %s is stored with %d-byte elements, this run keeps %d",
                            name, kn, s->es, t->es);
        if (*nops == *cap) {
            size_t c = *cap ? 2 * *cap : 1024;
            read_op *q = realloc(*ops, c * sizeof *q);
            if (!q)
                return dl_error(DL_ENOMEM, "--resume: out of memory");
            *ops = q, *cap = c;
        }
        (*ops)[(*nops)++] = (read_op){s->file, s->at + (uint64_t)(lo - s->g) * (uint64_t)s->es,
                                      base + (t->at + (uint64_t)(lo - t->g)) * (uint64_t)t->es,
                                      (size_t)(hi - lo) * (size_t)t->es};
        covered += hi - lo;
    }
    if (covered != t->n)
        return dl_error(DL_EINVAL,
                        "--resume: %s's %s: elements of [%" PRId64 ", %" PRId64
                        ") are in no file of the checkpoint",
                        name, kn, t->g, t->g + t->n);
    return DL_OK;
}

/* A rank's rows of a column slice lie a half-row apart: one small pread after another got no
 * readahead (cold, tp 2: 0.34-0.64 of dd's bandwidth). So the kernel is asked to read each file's
 * spans ahead (posix_fadvise WILLNEED), and reads closer than a page, which the device reads
 * whole anyway, are joined into one pread through a staging buffer (0.66-0.93 of dd). The rank
 * still copies only its own bytes. */
#define JOIN_GAP ((uint64_t)4096)
#define STAGE_MAX ((uint64_t)8 << 20)

/* the kernel asked to read ahead every span of ops[i..]'s file (spans closer than 1 MiB
 * joined), asynchronously: the device streams while the ranges are copied */
static void prefetch(int fd, const read_op *ops, size_t i, size_t n)
{
    uint64_t lo = ops[i].off, hi = lo + ops[i].bytes;
    for (size_t j = i + 1; j <= n; j++) {
        if (j < n && ops[j].file == ops[i].file && ops[j].off <= hi + ((uint64_t)1 << 20)) {
            if (ops[j].off + ops[j].bytes > hi)
                hi = ops[j].off + ops[j].bytes;
            continue;
        }
        posix_fadvise(fd, (off_t)lo, (off_t)(hi - lo), POSIX_FADV_WILLNEED);
        if (j == n || ops[j].file != ops[i].file)
            return;
        lo = ops[j].off, hi = lo + ops[j].bytes;
    }
}

/* the end (exclusive) of the ops joined with ops[i]; *end: the span's last byte + 1 */
static size_t span_of(const read_op *ops, size_t i, size_t n, uint64_t *end)
{
    size_t j = i + 1;
    *end = ops[i].off + ops[i].bytes;
    while (j < n && ops[j].file == ops[i].file && ops[j].off < *end + JOIN_GAP &&
           ops[j].off + ops[j].bytes - ops[i].off <= STAGE_MAX) {
        if (ops[j].off + ops[j].bytes > *end)
            *end = ops[j].off + ops[j].bytes;
        j++;
    }
    return j;
}

/* ops[i..j): one pread (a single op straight into place), else staged and copied */
static int read_span(int fd, const read_op *ops, size_t i, size_t j, uint64_t end, char *stg)
{
    if (j == i + 1)
        return dl__ck_pread_all(fd, ops[i].dst, ops[i].bytes, (off_t)ops[i].off);
    if (dl__ck_pread_all(fd, stg, end - ops[i].off, (off_t)ops[i].off))
        return -1;
    for (size_t q = i; q < j; q++)
        memcpy(ops[q].dst, stg + (ops[q].off - ops[i].off), ops[q].bytes);
    return 0;
}

/* sorted by file and offset, neighbours in the file and in memory joined; then read */
static int run_ops(const char *dir, json_t *m, read_op *ops, size_t n)
{
    qsort(ops, n, sizeof *ops, cmp_op);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        read_op *p = k ? &ops[k - 1] : NULL;
        if (p && p->file == ops[i].file && p->off + p->bytes == ops[i].off &&
            p->dst + p->bytes == ops[i].dst)
            p->bytes += ops[i].bytes;
        else
            ops[k++] = ops[i];
    }
    int rc = DL_OK, fd = -1, cur = -1;
    char p[4200], *stg = malloc(STAGE_MAX);
    json_t *files = json_object_get(m, "files");
    if (!stg)
        rc = dl_error(DL_ENOMEM, "--resume: out of memory");
    for (size_t i = 0, j; i < k && rc == DL_OK; i = j) {
        if (ops[i].file != cur) {
            if (fd >= 0)
                close(fd);
            cur = ops[i].file;
            snprintf(p, sizeof p, "%s/%s", dir,
                     json_string_value(
                         json_object_get(json_array_get(files, (size_t)cur), "name")));
            if (dl_path_open_input(p, "checkpoint shard", &fd))
                rc = dl_error(DL_EINVAL, "%s: missing (%s)", p, dl_errmsg());
            else
                prefetch(fd, ops, i, k);
        }
        uint64_t end;
        j = span_of(ops, i, k, &end);
        if (rc == DL_OK && read_span(fd, ops, i, j, end, stg))
            rc = dl_error(DL_EINVAL, "%s: %s", p, dl__ck_errtext(errno));
    }
    if (fd >= 0)
        close(fd);
    free(stg);
    return rc;
}

int dl__ckd_fill(const char *dir, json_t *m, const dl_gpt_layout *whole, const dl__ckd_runs *src,
                 const dl__ckd_runs *dst, void *const *buf)
{
    read_op *ops = NULL;
    size_t nops = 0, cap = 0;
    int rc = dst->nomem ? dl_error(DL_ENOMEM, "--resume: out of memory") : DL_OK;
    for (size_t i = 0; i < dst->n && rc == DL_OK; i++) {
        char *base = buf[dst->r[i].slot % DL_CKD_KINDS];
        if (base)
            rc = plan_run(src, &dst->r[i], base, whole, &ops, &nops, &cap);
    }
    if (rc == DL_OK)
        rc = run_ops(dir, m, ops, nops);
    free(ops);
    return rc;
}
