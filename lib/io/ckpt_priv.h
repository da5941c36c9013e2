/* distlab (private): what the checkpoint files share (io/ckpt.c: the format's pieces and the
 * I/O helpers; ckpt_header.c: reading and checking a header; ckpt_save.c; ckpt_load.c). */
#ifndef DISTLAB_IO_CKPT_PRIV_H
#define DISTLAB_IO_CKPT_PRIV_H

#include <stdint.h>
#include <sys/types.h>
#include "distlab.h"

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

/* First error of an operation: code and message, kept locally so that later successful calls
 * (collectives) cannot overwrite it before it is returned. */
typedef struct ck_err {
    int st;
    char msg[640];
} ck_err;

void dl__ck_fail(ck_err *e, int st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static inline int dl__ck_return(const ck_err *e)
{
    return e->st ? dl_error(e->st, "%s", e->msg) : DL_OK;
}

/* Reverse the bytes of each of n elements of dsize bytes. */
void dl__ck_bswap(void *p, size_t n, int dsize);
/* pwrite / pread everything or fail with errno set: a write that makes no progress is ENOSPC,
 * a read at the end of the file errno 0. */
int dl__ck_pio(int fd, char *p, size_t n, off_t off, int write);
/* (pwrite only reads the buffer) */
static inline int dl__ck_pwrite_all(int fd, const void *buf, size_t n, off_t off)
{
    return dl__ck_pio(fd, (char *)buf, n, off, 1);
}
static inline int dl__ck_pread_all(int fd, void *buf, size_t n, off_t off)
{
    return dl__ck_pio(fd, buf, n, off, 0);
}
/* strerror, with 0 as the end of the file and ENOSPC spelled out */
const char *dl__ck_errtext(int e);
/* FNV-1a 64 of bytes [from, from + n) of fd (buf: CK_IOBUF bytes). */
int dl__ck_hash_range(int fd, off_t from, uint64_t n, void *buf, uint64_t *out);

/* The model config as the header's metadata spells it, and back (-1 if malformed). */
void dl__ck_config_string(const dl_gpt_config *c, char *buf, size_t n);
int dl__ck_parse_config(const char *s, dl_gpt_config *c);
/* "[r, c]" */
void dl__ck_shape_string(int ndim, const int64_t *shape, char *buf, size_t n);
/* Local elements per contiguous run of a tensor's shard (runs start at multiples of it). */
size_t dl__ck_run_len(const dl_gpt_layout *l, const dl_tensor_info *t);
/* The whole model's layout for l's tp rank: l itself, or a new one in *own to destroy. */
int dl__ck_whole_layout(const dl_gpt_layout *l, const dl_gpt_layout **full, dl_gpt_layout **own);

/* A header as read: its tensors and the metadata distlab writes. */
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
    char jmsg[160]; /* jansson's message for a header that is not JSON */
} ck_hdr;

/* Open-file header reading and every check that does not depend on a layout; h is freed with
 * dl__ck_hdr_free whatever the result. */
int dl__ck_read_header(const char *path, int fd, ck_hdr *h);
void dl__ck_hdr_free(ck_hdr *h);
void dl__ck_fill_info(const ck_hdr *h, dl_ckpt_info *info);

#endif
