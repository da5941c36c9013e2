#define _GNU_SOURCE
/* Full-state checkpoints: finding the latest, reading and checking the manifest and the files it
 * lists, reading a tensor (lib/io/ckdir.h). */
#include "config.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "distlab.h"
#include "core/crc32c.h"
#include "io/ckdir.h"
#include "io/ckdir_map.h"
#include "io/ckpt_priv.h"
#include "io/path.h"

json_t *dl__ckd_u64(uint64_t v)
{
    char b[24];
    snprintf(b, sizeof b, "%016" PRIx64, v);
    return json_string(b);
}

int dl__ckd_get_u64(json_t *o, const char *key, uint64_t *v)
{
    const char *s = json_string_value(json_object_get(o, key));
    char *end;
    if (!s || strlen(s) != 16)
        return -1;
    errno = 0;
    *v = strtoull(s, &end, 16);
    return *end || errno ? -1 : 0;
}

int dl__ckd_find(const char *d, char *out, size_t outn)
{
    char p[4200];
    struct stat sb;
    snprintf(p, sizeof p, "%s/" DL_CKD_MANIFEST, d);
    const char *base = strrchr(d, '/') ? strrchr(d, '/') + 1 : d;
    /* a named checkpoint is taken as it is (its manifest checked by dl__ckd_open) */
    if (stat(p, &sb) == 0 || strncmp(base, "step-", 5) == 0) {
        snprintf(out, outn, "%s", d);
        return DL_OK;
    }
    DIR *dd = opendir(d);
    if (!dd)
        return dl_error(DL_EINVAL, "--resume: cannot read the directory '%s': %s", d,
                        strerror(errno));
    long best = 0;
    struct dirent *de;
    while ((de = readdir(dd))) {
        char *end;
        if (strncmp(de->d_name, "step-", 5) != 0 || de->d_name[5] < '0' || de->d_name[5] > '9')
            continue;
        long s = strtol(de->d_name + 5, &end, 10);
        if (!*end && s > best)
            best = s;
    }
    closedir(dd);
    if (!best)
        return dl_error(DL_EINVAL, "--resume: '%s' holds no complete checkpoint (no step-N)", d);
    snprintf(out, outn, "%s/step-%07ld", d, best);
    return DL_OK;
}

/* the structural checks of one "files" entry */
static int check_file_entry(json_t *f, const char *what, int i)
{
    const char *name = json_string_value(json_object_get(f, "name"));
    const char *crc = json_string_value(json_object_get(f, "crc32c"));
    if (!name || !*name || strchr(name, '/') || name[0] == '.')
        return dl_error(DL_EINVAL, "%s: files[%d] has no plain file name", what, i);
    if (!json_is_integer(json_object_get(f, "rank")) ||
        json_integer_value(json_object_get(f, "rank")) < 0 ||
        !json_is_integer(json_object_get(f, "bytes")) ||
        json_integer_value(json_object_get(f, "bytes")) < 8)
        return dl_error(DL_EINVAL, "%s: files[%d] ('%s') lacks its rank or size", what, i, name);
    if (!crc || strlen(crc) != 8 || strspn(crc, "0123456789abcdef") != 8)
        return dl_error(DL_EINVAL, "%s: files[%d] ('%s') lacks its crc32c (8 hex digits)", what, i,
                        name);
    return DL_OK;
}

int dl__ckd_parse(const char *text, size_t n, const char *what, json_t **out)
{
    json_error_t je;
    json_t *m = json_loadb(text, n, JSON_REJECT_DUPLICATES, &je);
    *out = NULL;
    if (!m)
        return dl_error(DL_EINVAL, "%s: not JSON (line %d: %s)", what, je.line, je.text);
    int rc = DL_OK;
    json_t *ver = json_object_get(m, "version"), *files = json_object_get(m, "files");
    const char *fmt = json_string_value(json_object_get(m, "format"));
    if (!json_is_object(m) || !fmt || strcmp(fmt, DL_CKD_FORMAT) != 0)
        rc = dl_error(DL_EINVAL, "%s: not a distlab checkpoint manifest (format is not \"%s\")",
                      what, DL_CKD_FORMAT);
    else if (!json_is_integer(ver))
        rc = dl_error(DL_EINVAL, "%s: no format version", what);
    else if (json_integer_value(ver) != DL_CKD_VERSION)
        rc =
            dl_error(DL_EINVAL, "%s: format version %" JSON_INTEGER_FORMAT " (this build reads %d)",
                     what, json_integer_value(ver), DL_CKD_VERSION);
    else if (!json_is_integer(json_object_get(m, "step")) ||
             json_integer_value(json_object_get(m, "step")) < 0)
        rc = dl_error(DL_EINVAL, "%s: no step", what);
    else if (!json_is_array(files) || json_array_size(files) == 0)
        rc = dl_error(DL_EINVAL, "%s: no files", what);
    for (size_t i = 0; rc == DL_OK && i < json_array_size(files); i++)
        rc = check_file_entry(json_array_get(files, i), what, (int)i);
    if (rc == DL_OK && !json_is_object(json_object_get(m, "tensors")))
        rc = dl_error(DL_EINVAL, "%s: no tensors", what);
    if (rc)
        json_decref(m);
    else
        *out = m;
    return rc;
}

/* size and CRC32C of one listed file */
static int verify_file(const char *dir, json_t *f, int verify)
{
    const char *name = json_string_value(json_object_get(f, "name"));
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    int fd;
    if (dl_path_open_input(p, "checkpoint shard", &fd))
        return dl_error(DL_EINVAL, "%s: missing (%s)", p, dl_errmsg());
    struct stat sb;
    int rc = DL_OK;
    uint64_t want = (uint64_t)json_integer_value(json_object_get(f, "bytes"));
    if (fstat(fd, &sb) || (uint64_t)sb.st_size != want)
        rc =
            dl_error(DL_EINVAL, "%s: %" PRIu64 " bytes, the manifest says %" PRIu64 " (truncated?)",
                     p, (uint64_t)sb.st_size, want);
    char *buf = verify && rc == DL_OK ? malloc(CK_IOBUF) : NULL;
    if (verify && rc == DL_OK && !buf)
        rc = dl_error(DL_ENOMEM, "%s: out of memory", p);
    uint32_t crc = 0;
    for (uint64_t off = 0; buf && rc == DL_OK && off < want;) {
        size_t k = want - off < CK_IOBUF ? (size_t)(want - off) : CK_IOBUF;
        if (dl__ck_pread_all(fd, buf, k, (off_t)off))
            rc = dl_error(DL_EINVAL, "%s: %s", p, dl__ck_errtext(errno));
        crc = dl__crc32c(crc, buf, k);
        off += k;
    }
    char got[16];
    snprintf(got, sizeof got, "%08x", crc);
    const char *exp = json_string_value(json_object_get(f, "crc32c"));
    if (buf && rc == DL_OK && strcmp(got, exp) != 0)
        rc = dl_error(DL_EINVAL,
                      "%s: checksum mismatch (CRC32C %s, the manifest says %s): the file "
                      "is damaged",
                      p, got, exp);
    free(buf);
    close(fd);
    return rc;
}

int dl__ckd_open(const char *dir, int verify, json_t **m)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/" DL_CKD_MANIFEST, dir);
    int fd;
    *m = NULL;
    if (dl_path_open_input(p, "checkpoint manifest", &fd))
        return dl_error(DL_EINVAL, "%s: missing (an incomplete or foreign directory)", p);
    struct stat sb;
    char *text = NULL;
    int rc = DL_OK;
    if (fstat(fd, &sb) || sb.st_size > (off_t)CK_MAX_HEADER ||
        !(text = malloc((size_t)sb.st_size + 1)))
        rc = dl_error(DL_EINVAL, "%s: cannot be read (or larger than 100 MiB)", p);
    else if (dl__ck_pread_all(fd, text, (size_t)sb.st_size, 0))
        rc = dl_error(DL_EINVAL, "%s: %s", p, dl__ck_errtext(errno));
    close(fd);
    if (rc == DL_OK)
        rc = dl__ckd_parse(text, (size_t)sb.st_size, p, m);
    free(text);
    json_t *files = json_object_get(*m, "files");
    for (size_t i = 0; rc == DL_OK && i < json_array_size(files); i++)
        rc = verify_file(dir, json_array_get(files, i), verify);
    if (rc) {
        json_decref(*m);
        *m = NULL;
    }
    return rc;
}

json_t *dl__ckd_file_of(json_t *m, int rank)
{
    json_t *files = json_object_get(m, "files"), *f;
    size_t i;
    json_array_foreach(files, i,
                       f) if (json_integer_value(json_object_get(f, "rank")) == rank) return f;
    return NULL;
}

json_t *dl__ckd_header(int fd, const char *p, uint64_t *N, uint64_t size)
{
    unsigned char len[8];
    if (dl__ck_pread_all(fd, len, 8, 0))
        return dl_error(DL_EINVAL, "%s: %s", p, dl__ck_errtext(errno)), NULL;
    *N = 0;
    for (int i = 0; i < 8; i++) *N |= (uint64_t)len[i] << (8 * i);
    if (*N > CK_MAX_HEADER || *N + 8 > size)
        return dl_error(DL_EINVAL, "%s: header length %" PRIu64 " does not fit the file", p, *N),
               NULL;
    char *h = malloc(*N + 1);
    json_t *hdr = h && dl__ck_pread_all(fd, h, *N, 8) == 0 ? json_loadb(h, *N, 0, NULL) : NULL;
    free(h);
    if (!json_is_object(hdr))
        dl_error(DL_EINVAL, "%s: the header is not a JSON object", p);
    return hdr;
}

/* one piece's blocks (row-major in the file, one after another) into the whole tensor */
static int place_blocks(json_t *blocks, const int64_t *gs, int nd, const char *src, size_t have,
                        int esize, char *out)
{
    size_t used = 0;
    json_t *b;
    size_t i;
    json_array_foreach(blocks, i, b)
    {
        int64_t st[2] = {0, 0}, ct[2] = {1, 1};
        for (int d = 0; d < nd; d++) {
            st[d] = json_integer_value(json_array_get(json_object_get(b, "start"), (size_t)d));
            ct[d] = json_integer_value(json_array_get(json_object_get(b, "count"), (size_t)d));
            if (st[d] < 0 || ct[d] < 0 || st[d] + ct[d] > gs[d])
                return -1;
        }
        int64_t cols = nd == 2 ? gs[1] : 1;
        size_t row = (size_t)(nd == 2 ? ct[1] : ct[0]) * (size_t)esize;
        int64_t rows = nd == 2 ? ct[0] : 1;
        for (int64_t r = 0; r < rows; r++) {
            if (used + row > have)
                return -1;
            size_t at = nd == 2 ? (size_t)((st[0] + r) * cols + st[1]) : (size_t)st[0];
            memcpy(out + at * (size_t)esize, src + used, row);
            used += row;
        }
    }
    return used == have ? 0 : -1;
}

int dl__ckd_gather(const char *dir, json_t *m, const char *name, int esize, void *out)
{
    json_t *t = json_object_get(json_object_get(m, "tensors"), name);
    json_t *gsj = json_object_get(t, "global_shape"), *pc;
    int nd = (int)json_array_size(gsj);
    int64_t gs[2] = {1, 1};
    if (!t || nd < 1 || nd > 2)
        return dl_error(DL_EINVAL, "%s/" DL_CKD_MANIFEST ": tensor '%s' has no 1- or 2-D shape",
                        dir, name);
    for (int d = 0; d < nd; d++) gs[d] = json_integer_value(json_array_get(gsj, (size_t)d));
    const char *dtype = esize == 8 ? "F64" : "F32";
    size_t i;
    int rc = DL_OK;
    json_array_foreach(json_object_get(t, "pieces"), i, pc)
    {
        if (rc || json_is_true(json_object_get(pc, "tied_copy")))
            continue;
        const char *file = json_string_value(json_object_get(pc, "file"));
        json_t *blocks = json_object_get(pc, "blocks");
        size_t n = 0;
        json_t *b;
        size_t k;
        json_array_foreach(blocks, k, b)
        {
            json_t *c = json_object_get(b, "count");
            n += (size_t)(json_integer_value(json_array_get(c, 0)) *
                          (nd == 2 ? json_integer_value(json_array_get(c, 1)) : 1));
        }
        char *buf = file ? malloc(n * (size_t)esize + 1) : NULL;
        if (!buf)
            rc = dl_error(DL_EINVAL, "%s: tensor '%s': a piece without a file", dir, name);
        else if ((rc = dl__ckd_read(dir, file, name, dtype, buf, n * (size_t)esize)) == DL_OK &&
                 place_blocks(blocks, gs, nd, buf, n * (size_t)esize, esize, out))
            rc = dl_error(DL_EINVAL, "%s/%s: tensor '%s': blocks that do not fit its shape", dir,
                          file, name);
        free(buf);
    }
    return rc;
}

int dl__ckd_read(const char *dir, const char *file, const char *name, const char *dtype, void *out,
                 size_t bytes)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", dir, file);
    int fd;
    if (dl_path_open_input(p, "checkpoint shard", &fd))
        return dl_error(DL_EINVAL, "%s: missing (%s)", p, dl_errmsg());
    struct stat sb;
    uint64_t N = 0;
    json_t *hdr = fstat(fd, &sb) == 0 ? dl__ckd_header(fd, p, &N, (uint64_t)sb.st_size) : NULL;
    int rc = hdr ? DL_OK : DL_EINVAL;
    json_t *t = json_object_get(hdr, name), *off = json_object_get(t, "data_offsets");
    const char *dt = json_string_value(json_object_get(t, "dtype"));
    json_int_t a = json_integer_value(json_array_get(off, 0)),
               b = json_integer_value(json_array_get(off, 1));
    if (rc == DL_OK && !t)
        rc = dl_error(DL_EINVAL, "%s: no tensor '%s'", p, name);
    else if (rc == DL_OK && (!dt || strcmp(dt, dtype) != 0))
        rc = dl_error(DL_EINVAL, "%s: tensor '%s' is %s, expected %s", p, name, dt ? dt : "?",
                      dtype);
    else if (rc == DL_OK &&
             (a < 0 || b - a != (json_int_t)bytes || (uint64_t)b + 8 + N > (uint64_t)sb.st_size))
        rc = dl_error(DL_EINVAL,
                      "%s: tensor '%s' holds bytes [%" JSON_INTEGER_FORMAT ", %" JSON_INTEGER_FORMAT
                      "), expected %zu within the file",
                      p, name, a, b, bytes);
    else if (rc == DL_OK && dl__ck_pread_all(fd, out, bytes, (off_t)(8 + N + (uint64_t)a)))
        rc = dl_error(DL_EINVAL, "%s: %s", p, dl__ck_errtext(errno));
    json_decref(hdr);
    close(fd);
    return rc;
}
