#define _GNU_SOURCE
/* Checkpoints: the header parser (exactly the safetensors header shape) and every check of a
 * file that does not depend on a layout; dl_ckpt_inspect. */
#include "config.h"
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "distlab.h"
#include "io/ckpt_priv.h"
#include "io/path.h"

void dl__ck_hdr_free(ck_hdr *h)
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

/* The tensors: a dtype distlab reads, data_offsets holding exactly their shape. */
static int check_tensors(const char *path, const ck_hdr *h)
{
    uint64_t maxend = 0;
    for (int i = 0; i < h->n; i++) {
        const ck_ent *t = &h->e[i];
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
            dl__ck_shape_string(t->ndim, t->shape, sh, sizeof sh);
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
    return DL_OK;
}

/* Sorted by begin, the tensors must tile the data section [0, data_bytes). */
static int check_tiling(const char *path, const ck_hdr *h)
{
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
    return DL_OK;
}

/* The metadata: strict when the file says it is ours. */
static int check_metadata(const char *path, const ck_hdr *h)
{
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
        if (!h->config || dl__ck_parse_config(h->config, &c))
            return dl_error(DL_EINVAL, "checkpoint '%s': __metadata__ config \"%s\" is malformed",
                            path, h->config ? h->config : "(missing)");
        if (!h->checksum)
            return dl_error(DL_EINVAL, "checkpoint '%s': __metadata__ has no checksum", path);
    }
    return DL_OK;
}

/* Open-file header reading and every check that does not depend on a layout. */
int dl__ck_read_header(const char *path, int fd, ck_hdr *h)
{
    memset(h, 0, sizeof *h);
    struct stat sb;
    if (fstat(fd, &sb))
        return dl_error(DL_ESYS, "checkpoint '%s': fstat: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return dl_error(DL_EINVAL, "checkpoint '%s' is not a regular file", path);
    h->file_bytes = (uint64_t)sb.st_size;
    unsigned char len[8];
    if (h->file_bytes < 8 || dl__ck_pread_all(fd, len, 8, 0))
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
    if (dl__ck_pread_all(fd, buf, (size_t)N, 8)) {
        int er = errno;
        free(buf);
        return dl_error(DL_ESYS, "checkpoint '%s': reading the header: %s", path,
                        dl__ck_errtext(er));
    }
    jp p = {buf, (size_t)N, 0, NULL, 0};
    if (jheader(&p, h)) {
        char near[40];
        size_t a = p.err_at < p.n ? p.err_at : p.n, k = 0;
        for (size_t i = a; i < p.n && k < 24; i++)
            near[k++] = (p.s[i] >= 0x20 && p.s[i] < 0x7f) ? p.s[i] : '?';
        near[k] = '\0';
        free(buf);
        dl__ck_hdr_free(h);
        return dl_error(DL_EINVAL,
                        "checkpoint '%s': malformed header at byte %zu of %" PRIu64
                        ": %s (near \"%s\")",
                        path, a, N, p.err, near);
    }
    free(buf);
    int rc = check_tensors(path, h);
    if (!rc)
        rc = check_tiling(path, h);
    if (!rc)
        rc = check_metadata(path, h);
    return rc;
}

void dl__ck_fill_info(const ck_hdr *h, dl_ckpt_info *info)
{
    memset(info, 0, sizeof *info);
    info->ntensors = h->n;
    info->header_bytes = (int64_t)h->N;
    info->data_bytes = (int64_t)h->data_bytes;
    info->dsize = h->n ? h->e[0].dsize : (h->dtype && !strcmp(h->dtype, "F64") ? 8 : 4);
    if (h->config && !dl__ck_parse_config(h->config, &info->cfg))
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
    rc = dl__ck_read_header(path, fd, &h);
    if (!rc)
        dl__ck_fill_info(&h, info);
    dl__ck_hdr_free(&h);
    close(fd);
    return rc;
}
