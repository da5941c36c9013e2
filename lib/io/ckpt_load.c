#define _GNU_SOURCE
/* Checkpoints: loading under any layout (a tp shard, a pipeline stage's part), with the checks
 * that need the layout: names and shapes, config, checksum, finite values. */
#include "config.h"
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "distlab.h"
#include "io/ckpt_priv.h"
#include "io/path.h"

/* Read `n` elements of size fds at `off` into dst (elements of dsize), converting. */
static int read_run(int fd, void *dst, size_t n, int fds, int dsize, off_t off, void *stage)
{
    if (CK_HOST_LE && fds == dsize)
        return dl__ck_pread_all(fd, dst, n * (size_t)dsize, off);
    size_t per = CK_IOBUF / 8;
    char *d = dst;
    while (n) {
        size_t m = n < per ? n : per;
        if (dl__ck_pread_all(fd, stage, m * (size_t)fds, off))
            return -1;
        if (!CK_HOST_LE)
            dl__ck_bswap(stage, m, fds);
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

/* Match every tensor of the whole model (full) to the file's entry of its name and global
 * shape (map[k]: the entry of tensor k); the file may hold nothing else, and the config its
 * metadata names must be this model's. */
static int load_match(const char *path, ck_hdr *h, const dl_gpt_layout *l, const dl_ckpt_info *inf,
                      int *map)
{
    for (int k = 0; k < l->ntensors; k++) {
        const dl_tensor_info *t = &l->t[k];
        int j = -1;
        for (int i = 0; i < h->n; i++)
            if (!h->e[i].used && !strcmp(h->e[i].name, t->name)) {
                j = i;
                break;
            }
        char want[64], got[160];
        dl__ck_shape_string(t->ndim, t->shape, want, sizeof want);
        if (j < 0) {
            char cfg[160];
            dl__ck_config_string(&l->cfg, cfg, sizeof cfg);
            return dl_error(DL_EINVAL,
                            "checkpoint '%s' has no tensor '%s' %s, which this model "
                            "(%s) needs%s%s",
                            path, t->name, want, cfg,
                            inf->has_config ? "; the file was saved with " : "",
                            inf->has_config ? h->config : "");
        }
        const ck_ent *e = &h->e[j];
        int same = e->ndim == t->ndim;
        for (int d = 0; same && d < t->ndim; d++) same = e->shape[d] == t->shape[d];
        if (!same) {
            dl__ck_shape_string(e->ndim, e->shape, got, sizeof got);
            return dl_error(DL_EINVAL,
                            "checkpoint '%s': tensor '%s' has shape %s in the file but "
                            "%s in this model (the configs differ)",
                            path, t->name, got, want);
        }
        h->e[j].used = 1;
        map[k] = j;
    }
    for (int i = 0; i < h->n; i++)
        if (!h->e[i].used) {
            char got[160];
            dl__ck_shape_string(h->e[i].ndim, h->e[i].shape, got, sizeof got);
            return dl_error(DL_EINVAL,
                            "checkpoint '%s': tensor '%s' %s is not part of this model "
                            "(was it saved with more layers or an untied head?)",
                            path, h->e[i].name, got);
        }
    if (inf->has_config) {
        const dl_gpt_config *a = &inf->cfg, *b = &l->cfg;
        if (a->layers != b->layers || a->d_model != b->d_model || a->heads != b->heads ||
            a->seq != b->seq || a->vocab != b->vocab || a->tie != b->tie) {
            char cfg[160];
            dl__ck_config_string(b, cfg, sizeof cfg);
            return dl_error(DL_EINVAL, "checkpoint '%s' was saved with config %s; this model is %s",
                            path, h->config, cfg);
        }
    }
    return DL_OK;
}

/* The checksum of the whole data section, when the policy asks for it on this rank. */
static int load_verify(const char *path, int fd, const ck_hdr *h, int tp_rank,
                       dl_ckpt_verify verify, dl_ckpt_info *inf, void *stage)
{
    int do_verify =
        verify == DL_CKPT_VERIFY_ALWAYS || (verify == DL_CKPT_VERIFY_AUTO && tp_rank == 0);
    if (!do_verify || !inf->has_checksum)
        return DL_OK;
    uint64_t hsh;
    if (dl__ck_hash_range(fd, (off_t)(8 + h->N), h->data_bytes, stage, &hsh))
        return dl_error(DL_ESYS, "checkpoint '%s': reading the data: %s", path,
                        dl__ck_errtext(errno));
    if (hsh != inf->checksum)
        return dl_error(DL_EINVAL,
                        "checkpoint '%s': checksum mismatch: the data section hashes "
                        "to %016" PRIx64 " but the header says %016" PRIx64 " (the file is "
                        "corrupted)",
                        path, hsh, inf->checksum);
    inf->checksum_verified = 1;
    return DL_OK;
}

/* This rank's slices of its part l (pmap[k]: the file's entry of tensor k), converted to dsize
 * and refused if not finite. */
static int load_slices(const char *path, int fd, const ck_hdr *h, const dl_gpt_layout *l,
                       const int *pmap, void *params, int dsize, dl_ckpt_info *inf, void *stage)
{
    for (int k = 0; k < l->ntensors; k++) {
        const dl_tensor_info *t = &l->t[k];
        const ck_ent *e = &h->e[pmap[k]];
        size_t run = dl__ck_run_len(l, t);
        char *dst = (char *)params + t->offset * (size_t)dsize;
        if (e->dsize != dsize)
            inf->converted = 1;
        for (size_t i = 0; i < t->numel; i += run) {
            int64_t g = dl_gpt_global_index(l, k, i);
            off_t off = (off_t)(8 + h->N + e->begin + (uint64_t)g * (uint64_t)e->dsize);
            if (read_run(fd, dst + i * (size_t)dsize, run, e->dsize, dsize, off, stage))
                return dl_error(DL_ESYS, "checkpoint '%s': reading %s at byte %lld: %s", path,
                                t->name, (long long)off, dl__ck_errtext(errno));
        }
        size_t bad = first_nonfinite(dst, t->numel, dsize);
        if (bad < t->numel) {
            double v = dsize == 8 ? ((const double *)dst)[bad] : ((const float *)dst)[bad];
            return dl_error(DL_EINVAL,
                            "checkpoint '%s': tensor '%s' holds a non-finite value (%g "
                            "at element %zu of this rank's part); refusing to load it",
                            path, t->name, v, bad);
        }
    }
    return DL_OK;
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
    rc = dl__ck_read_header(path, fd, &h);
    if (rc) {
        dl__ck_hdr_free(&h);
        close(fd);
        return rc;
    }
    /* the file must hold the whole model (a pipeline stage reads its part of it) */
    const dl_gpt_layout *part = l, *full = l;
    dl_gpt_layout *own_full = NULL;
    int *map = NULL, *pmap = NULL;
    void *stage = malloc(CK_IOBUF);
    dl_ckpt_info inf;
    dl__ck_fill_info(&h, &inf);
    if ((rc = dl__ck_whole_layout(part, &full, &own_full))) {
        rc = dl_error(rc, "checkpoint load from '%s': %s", path, dl_errmsg());
        goto out;
    }
    map = calloc((size_t)(full->ntensors ? full->ntensors : 1), sizeof *map);
    pmap = calloc((size_t)(part->ntensors ? part->ntensors : 1), sizeof *pmap);
    if (!map || !pmap || !stage) {
        rc = dl_error(DL_ENOMEM, "checkpoint load from '%s': out of memory", path);
        goto out;
    }
    if ((rc = load_match(path, &h, full, &inf, map)) ||
        (rc = load_verify(path, fd, &h, full->tp_rank, verify, &inf, stage)))
        goto out;
    /* the whole model's tensor ids index `map` */
    for (int k = 0; k < part->ntensors; k++) pmap[k] = map[part->t[k].id];
    rc = load_slices(path, fd, &h, part, pmap, params, dsize, &inf, stage);
out:
    if (info)
        *info = inf;
    free(map);
    free(pmap);
    dl_gpt_layout_destroy(own_full);
    free(stage);
    dl__ck_hdr_free(&h);
    close(fd);
    return rc;
}
