#define _GNU_SOURCE
/* Checkpoints: sharded save / load of the GPT parameters in the safetensors layout
 * (include/distlab/ckpt.h describes the format and the protocol). This file: what saving and
 * loading share (the checksum, errors, whole-file I/O, the metadata's config, shard runs);
 * ckpt_header.c reads and checks a header, ckpt_save.c writes, ckpt_load.c reads. */
#include "config.h"
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "distlab.h"
#include "io/ckpt_priv.h"

uint64_t dl_ckpt_fnv1a64(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

void dl__ck_fail(ck_err *e, int st, const char *fmt, ...)
{
    if (e->st)
        return;
    e->st = st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
}

void dl__ck_bswap(void *p, size_t n, int dsize)
{
    unsigned char *b = p;
    for (size_t i = 0; i < n; i++, b += dsize)
        for (int j = 0; j < dsize / 2; j++) {
            unsigned char t = b[j];
            b[j] = b[dsize - 1 - j];
            b[dsize - 1 - j] = t;
        }
}

int dl__ck_pio(int fd, char *p, size_t n, off_t off, int write)
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

const char *dl__ck_errtext(int e)
{
    if (e == 0)
        return "unexpected end of file";
    if (e == ENOSPC)
        return "No space left on device (disk full)";
    return strerror(e);
}

void dl__ck_config_string(const dl_gpt_config *c, char *buf, size_t n)
{
    snprintf(buf, n, "layers=%d,d_model=%d,heads=%d,seq=%d,vocab=%d,tie=%d", c->layers, c->d_model,
             c->heads, c->seq, c->vocab, c->tie);
}

int dl__ck_parse_config(const char *s, dl_gpt_config *c)
{
    memset(c, 0, sizeof *c); /* (the file records no mixture of experts: its tensors do) */
    int used = -1;
    if (sscanf(s, "layers=%d,d_model=%d,heads=%d,seq=%d,vocab=%d,tie=%d%n", &c->layers, &c->d_model,
               &c->heads, &c->seq, &c->vocab, &c->tie, &used) != 6 ||
        used < 0 || s[used] != '\0')
        return -1;
    return 0;
}

void dl__ck_shape_string(int ndim, const int64_t *shape, char *buf, size_t n)
{
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < ndim && k < n; d++)
        k += (size_t)snprintf(buf + k, n - k, d ? ", %" PRId64 : "%" PRId64, shape[d]);
    if (k < n)
        snprintf(buf + k, n - k, "]");
}

/* Local elements per contiguous run of a tensor's shard (runs start at multiples of it). */
size_t dl__ck_run_len(const dl_gpt_layout *l, const dl_tensor_info *t)
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
           p->head && l->ep <= 1; /* an ep rank's layout holds its experts only */
}

int dl__ck_whole_layout(const dl_gpt_layout *l, const dl_gpt_layout **full, dl_gpt_layout **own)
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

/* FNV-1a 64 of bytes [from, from + n) of fd. */
int dl__ck_hash_range(int fd, off_t from, uint64_t n, void *buf, uint64_t *out)
{
    uint64_t h = DL_CKPT_FNV_INIT;
    while (n) {
        size_t m = n < CK_IOBUF ? (size_t)n : CK_IOBUF;
        if (dl__ck_pread_all(fd, buf, m, from))
            return -1;
        h = dl_ckpt_fnv1a64(h, buf, m);
        from += (off_t)m;
        n -= m;
    }
    *out = h;
    return 0;
}
