#define _GNU_SOURCE
/* The layout-independent state hash of a full-state checkpoint (lib/io/ckdir_map.h): per tensor
 * and kind the CRC32C of its values in global index order, combined from any ranks' pieces. */
#include "config.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "distlab.h"
#include "core/crc32c.h"
#include "io/ckdir.h"
#include "io/ckdir_map.h"
#include "io/ckpt_priv.h"
#include "io/path.h"

static uint64_t slot_bytes(const dl_gpt_layout *whole, const int *es, int slot)
{
    return (uint64_t)whole->t[slot / DL_CKD_KINDS].numel * (uint64_t)es[slot % DL_CKD_KINDS];
}

void dl__ckd_hash_run(uint32_t *h, const dl_gpt_layout *whole, const int *es, const dl__ckd_run *r,
                      const void *p)
{
    uint64_t n = (uint64_t)r->n * (uint64_t)r->es, end = (uint64_t)(r->g + r->n) * (uint64_t)r->es;
    h[r->slot] ^= dl__crc32c_shift(dl__crc32c(0, p, n), slot_bytes(whole, es, r->slot) - end);
}

static json_t *hex(uint32_t v)
{
    char b[16];
    snprintf(b, sizeof b, "%08x", v);
    return json_string(b);
}

/* the CRC32C of every slot's bytes one after another */
static uint32_t whole_crc(const dl_gpt_layout *whole, const int *es, const uint32_t *h)
{
    uint32_t c = 0; /* the CRC of nothing */
    for (int s = 0; s < whole->ntensors * DL_CKD_KINDS; s++)
        c = dl__crc32c_combine(c, h[s], slot_bytes(whole, es, s));
    return c;
}

json_t *dl__ckd_hash_json(const dl_gpt_layout *whole, const int *es, const uint32_t *h)
{
    json_t *t = json_object();
    for (int k = 0; k < whole->ntensors; k++) {
        json_t *o = json_object();
        for (int d = 0; d < DL_CKD_KINDS; d++)
            json_object_set_new(o, dl__ckd_kind_names[d], hex(h[k * DL_CKD_KINDS + d]));
        json_object_set_new(t, whole->t[k].name, o);
    }
    return json_pack("{s:s, s:o, s:o}", "function",
                     "CRC32C of each tensor's values (parameter: fp32 master weights in bf16 runs; "
                     "AdamW's exp_avg, exp_avg_sq) in global row-major order, little-endian, "
                     "without ZeRO padding or the tied embeddings' head copy; whole: of all "
                     "of them one after another",
                     "whole", hex(whole_crc(whole, es, h)), "tensors", t);
}

int dl__ckd_hash_check(json_t *m, const dl_gpt_layout *whole, const int *es, const uint32_t *h,
                       const char *what)
{
    json_t *sh = json_object_get(m, "state_hash");
    if (!sh)
        return DL_OK;
    json_t *t = json_object_get(sh, "tensors");
    char got[16];
    for (int s = 0; s < whole->ntensors * DL_CKD_KINDS; s++) {
        const char *name = whole->t[s / DL_CKD_KINDS].name,
                   *kn = dl__ckd_kind_names[s % DL_CKD_KINDS];
        const char *want = json_string_value(json_object_get(json_object_get(t, name), kn));
        snprintf(got, sizeof got, "%08x", h[s]);
        if (!want || strcmp(want, got) != 0)
            return dl_error(DL_EINVAL,
                            "%s: the state hash of %s's %s is %s, the manifest says %s: the "
                            "loaded state is not the saved one",
                            what, name, kn, got, want ? want : "nothing");
    }
    snprintf(got, sizeof got, "%08x", whole_crc(whole, es, h));
    const char *want = json_string_value(json_object_get(sh, "whole"));
    if (!want || strcmp(want, got) != 0)
        return dl_error(DL_EINVAL, "%s: the whole state hash is %s, the manifest says %s", what,
                        got, want ? want : "nothing");
    return DL_OK;
}

/* the run's bytes from its file (fds[file] opened on first use) into the hash */
static int hash_source(const char *dir, json_t *files, int *fds, const dl__ckd_run *r, char **buf,
                       size_t *cap, uint32_t *h, const dl_gpt_layout *whole, const int *es)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", dir,
             json_string_value(json_object_get(json_array_get(files, (size_t)r->file), "name")));
    size_t n = (size_t)r->n * (size_t)r->es;
    if (fds[r->file] < 0 && dl_path_open_input(p, "checkpoint shard", &fds[r->file]))
        return dl_error(DL_EINVAL, "%s: missing (%s)", p, dl_errmsg());
    if (n > *cap) {
        char *b = realloc(*buf, n);
        if (!b)
            return dl_error(DL_ENOMEM, "%s: out of memory", p);
        *buf = b, *cap = n;
    }
    if (dl__ck_pread_all(fds[r->file], *buf, n, (off_t)r->at))
        return dl_error(DL_EINVAL, "%s: %s", p, dl__ck_errtext(errno));
    dl__ckd_hash_run(h, whole, es, r, *buf);
    return DL_OK;
}

int dl__ckd_hash_verify(const char *dir, json_t *m)
{
    if (!json_object_get(m, "state_hash"))
        return DL_OK;
    char what[4200];
    snprintf(what, sizeof what, "%s/" DL_CKD_MANIFEST, dir);
    dl_gpt_layout *whole;
    int rc = dl__ckd_model(m, what, &whole);
    if (rc)
        return rc;
    const char *dt = json_string_value(json_object_get(json_object_get(m, "precision"), "dtype"));
    int e = dt && strcmp(dt, "f64") == 0 ? 8 : 4, es[DL_CKD_KINDS] = {e, e, e};
    json_t *files = json_object_get(m, "files");
    size_t nf = json_array_size(files), cap = 0;
    dl__ckd_runs src;
    uint32_t *h = calloc((size_t)whole->ntensors * DL_CKD_KINDS, sizeof *h);
    int *fds = malloc((nf + 1) * sizeof *fds);
    char *buf = NULL;
    for (size_t i = 0; fds && i < nf; i++) fds[i] = -1;
    rc = h && fds ? dl__ckd_source_runs(dir, m, whole, &src) : dl_error(DL_ENOMEM, "out of memory");
    for (size_t i = 0; rc == DL_OK && i < src.n; i++)
        rc = hash_source(dir, files, fds, &src.r[i], &buf, &cap, h, whole, es);
    if (rc == DL_OK)
        rc = dl__ckd_hash_check(m, whole, es, h, what);
    for (size_t i = 0; fds && i < nf; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    if (h && fds)
        dl__ckd_runs_free(&src);
    free(h), free(fds), free(buf);
    dl_gpt_layout_destroy(whole);
    return rc;
}
