#define _GNU_SOURCE
/* Checkpoints: the header read with jansson and checked to be exactly the safetensors header
 * shape, and every check of a file that does not depend on a layout; dl_ckpt_inspect. */
#include "config.h"
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <jansson.h>
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

/* A structural error: what, and where (the byte offset of the value, as far as jansson tells). */
typedef struct jerr {
    const char *what;
    size_t at;
} jerr;

static int jfail(jerr *e, const char *what)
{
    if (!e->what)
        e->what = what;
    return -1;
}

/* A string value copied (NULL: not a string). */
static char *dup_string(json_t *v)
{
    return json_is_string(v) ? strdup(json_string_value(v)) : NULL;
}

/* An array of at most max non-negative integers below 2^62. */
static int uint_array(json_t *a, uint64_t *v, int max, int *count, jerr *e)
{
    if (!json_is_array(a))
        return jfail(e, "expected '['");
    if (json_array_size(a) > (size_t)max)
        return jfail(e, "too many array items");
    *count = (int)json_array_size(a);
    for (int i = 0; i < *count; i++) {
        json_t *x = json_array_get(a, (size_t)i);
        if (!json_is_integer(x) || json_integer_value(x) < 0)
            return jfail(e, "expected a non-negative integer");
        if (json_integer_value(x) > ((json_int_t)1 << 62))
            return jfail(e, "integer too large");
        v[i] = (uint64_t)json_integer_value(x);
    }
    return 0;
}

static int jtensor(json_t *o, ck_ent *t, jerr *e)
{
    if (!json_is_object(o))
        return jfail(e, "expected '{' opening a tensor entry");
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v)
    {
        if (strcmp(key, "dtype") && strcmp(key, "shape") && strcmp(key, "data_offsets"))
            return jfail(e, "unknown key in a tensor entry (expected dtype, shape, data_offsets)");
    }
    json_t *dt = json_object_get(o, "dtype"), *sh = json_object_get(o, "shape"),
           *off = json_object_get(o, "data_offsets");
    if (!dt || !sh || !off)
        return jfail(e, !dt   ? "tensor entry without \"dtype\""
                        : !sh ? "tensor entry without \"shape\""
                              : "tensor entry without \"data_offsets\"");
    if (!json_is_string(dt))
        return jfail(e, "expected a string");
    if (strlen(json_string_value(dt)) >= sizeof t->dtype)
        return jfail(e, "dtype name too long");
    snprintf(t->dtype, sizeof t->dtype, "%s", json_string_value(dt));
    t->dsize = !strcmp(t->dtype, "F32") ? 4 : !strcmp(t->dtype, "F64") ? 8 : 0;
    uint64_t s[CK_MAXDIM], ob[2];
    int c;
    if (uint_array(sh, s, CK_MAXDIM, &c, e))
        return -1;
    t->ndim = c;
    for (int d = 0; d < c; d++) t->shape[d] = (int64_t)s[d];
    if (uint_array(off, ob, 2, &c, e))
        return -1;
    if (c != 2)
        return jfail(e, "data_offsets must hold two integers");
    t->begin = ob[0];
    t->end = ob[1];
    return 0;
}

/* __metadata__: every value a string; distlab's keys kept, other tools' ignored. */
static int jmetadata(json_t *o, ck_hdr *h, jerr *e)
{
    if (!json_is_object(o))
        return jfail(e, "expected '{' opening __metadata__");
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v)
    {
        if (!json_is_string(v))
            return jfail(e, "__metadata__ values must be strings");
    }
    h->has_meta = 1;
    h->format = dup_string(json_object_get(o, "format"));
    h->version = dup_string(json_object_get(o, "version"));
    h->config = dup_string(json_object_get(o, "config"));
    h->dtype = dup_string(json_object_get(o, "dtype"));
    h->checksum = dup_string(json_object_get(o, "checksum"));
    h->checksum_algo = dup_string(json_object_get(o, "checksum_algo"));
    return 0;
}

/* The header: jansson parses (duplicate keys, \u0000, trailing characters and integers beyond
 * 64 bits refused), then the safetensors shape is checked. */
static int jheader(const char *buf, size_t n, ck_hdr *h, jerr *e)
{
    json_error_t je;
    json_t *root = json_loadb(buf, n, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        e->at = (size_t)je.position;
        snprintf(h->jmsg, sizeof h->jmsg, "%s", je.text);
        return jfail(e, h->jmsg);
    }
    int rc = json_is_object(root) ? 0 : jfail(e, "expected '{' opening the header");
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v)
    {
        if (rc)
            break;
        if (!strcmp(key, "__metadata__")) {
            rc = jmetadata(v, h, e);
            continue;
        }
        if (!*key) {
            rc = jfail(e, "empty tensor name");
            break;
        }
        if (h->n == h->cap) {
            int cap = h->cap ? 2 * h->cap : 64;
            ck_ent *q = realloc(h->e, (size_t)cap * sizeof *q);
            if (!q) {
                rc = jfail(e, "out of memory");
                break;
            }
            h->e = q;
            h->cap = cap;
        }
        ck_ent *t = &h->e[h->n];
        memset(t, 0, sizeof *t);
        if (!(t->name = strdup(key))) {
            rc = jfail(e, "out of memory");
            break;
        }
        h->n++;
        rc = jtensor(v, t, e);
    }
    json_decref(root);
    return rc;
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
        int ok = strlen(h->checksum) == 16 && strspn(h->checksum, "0123456789abcdefABCDEF") == 16 &&
                 (!h->checksum_algo || !strcmp(h->checksum_algo, "fnv1a64"));
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
    jerr je = {NULL, 0};
    if (jheader(buf, (size_t)N, h, &je)) {
        char near[40];
        size_t a = je.at < (size_t)N ? je.at : (size_t)N, k = 0;
        for (size_t i = a; i < (size_t)N && k < 24; i++)
            near[k++] = (buf[i] >= 0x20 && buf[i] < 0x7f) ? buf[i] : '?';
        near[k] = '\0';
        free(buf);
        char what[200];
        snprintf(what, sizeof what, "%s", je.what);
        dl__ck_hdr_free(h);
        return dl_error(DL_EINVAL,
                        "checkpoint '%s': malformed header at byte %zu of %" PRIu64
                        ": %s (near \"%s\")",
                        path, a, N, what, near);
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
