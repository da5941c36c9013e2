/* distlab (private): a full-state checkpoint's tensors in global terms, for resharding and the
 * layout-independent state hash (docs/CHECKPOINTS.md, "Resharding" and "The state hash").
 *
 * Every saved value is an element of one of the model's tensors (named as in the one-rank
 * layout) of one kind: the parameter (bf16 runs: its fp32 master weight), AdamW's m or v. A
 * "run" is a range of consecutive global (row-major, unsharded) element indices [g, g + n) of
 * one (tensor, kind) slot that sits contiguously somewhere: in a checkpoint file (source runs,
 * from the manifest's pieces: the parameters' hyperslab blocks, the moments' flat ZeRO units
 * mapped through the saving rank's layout) or in a rank's buffers (target runs, from its own
 * layout and units). Loading under another layout intersects the target's runs with the
 * sources' and reads exactly those byte ranges; the hash CRCs each run and combines them by
 * their place in the tensor (lib/core/crc32c.h). ZeRO padding is in no run; the last pipeline
 * stage's copy of tied embeddings is in no source run (targets read it from the embeddings). */
#ifndef DISTLAB_IO_CKDIR_MAP_H
#define DISTLAB_IO_CKDIR_MAP_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include "distlab.h"

enum { DL_CKD_PARAM, DL_CKD_EXP_AVG, DL_CKD_EXP_AVG_SQ, DL_CKD_KINDS };
extern const char *const dl__ckd_kind_names[DL_CKD_KINDS]; /* "parameter", "exp_avg", ... */

typedef struct dl__ckd_run {
    int slot;     /* tensor (index in the one-rank layout) x DL_CKD_KINDS + kind */
    int file;     /* source: index in the manifest's files; target: -1 */
    int64_t g, n; /* global elements [g, g + n) */
    uint64_t at;  /* source: byte offset in the file; target: element offset in its buffer */
    int es;       /* bytes per element (source: the file's dtype) */
} dl__ckd_run;

typedef struct dl__ckd_runs {
    dl__ckd_run *r;
    size_t n, cap;
    int nomem;
} dl__ckd_runs;

/* Which runs dl__ckd_flat_runs emits. */
enum {
    DL_CKD_SKIP_TIED = 1,   /* not the last stage's copy of tied embeddings */
    DL_CKD_ONE_REPLICA = 2, /* a tp-replicated tensor only from tp rank 0 (the hash) */
    DL_CKD_EXPERTS_ONLY = 4 /* only the experts' tensors (the hash on an ep rank but the first) */
};

/* The model's one-rank layout (names, global sizes) from the manifest's "model". */
int dl__ckd_model(json_t *m, const char *what, dl_gpt_layout **whole);

/* The runs of flat elements [lo, lo + n) of layout l's buffer (tp rank, pipeline part): element
 * lo + j at `at` + j x step (bytes or elements), `es` bytes each, kind `kind`. Neighbours merge
 * when both their elements and their places are consecutive. */
void dl__ckd_flat_runs(dl__ckd_runs *out, const dl_gpt_layout *whole, const dl_gpt_layout *l,
                       int kind, size_t lo, size_t n, uint64_t at, uint64_t step, int es, int file,
                       int flags);

/* The manifest's source runs (dir's files' headers read for the data offsets and dtypes),
 * sorted by (slot, g) and made disjoint (tp replicas kept once). DL_EINVAL naming the file or
 * the tensor when a piece is malformed or not in the model. Free with dl__ckd_runs_free. */
int dl__ckd_source_runs(const char *dir, json_t *m, const dl_gpt_layout *whole, dl__ckd_runs *out);
void dl__ckd_runs_free(dl__ckd_runs *r);

/* Fill the target runs' elements from the sources: dst[kind] is the buffer of each kind (NULL:
 * that kind is not read). Reads only the intersecting byte ranges, coalesced per file.
 * DL_EINVAL naming the tensor when an element is in no source or a dtype differs; DL_ESYS-like
 * DL_EINVAL naming the file when a read fails. */
int dl__ckd_fill(const char *dir, json_t *m, const dl_gpt_layout *whole, const dl__ckd_runs *src,
                 const dl__ckd_runs *dst, void *const *buf);

/* The header of open shard fd (path p, size bytes): N and the parsed JSON, or NULL with
 * DL_EINVAL naming p (io/ckdir_load.c). */
json_t *dl__ckd_header(int fd, const char *p, uint64_t *N, uint64_t size);

/* ---- the state hash (io/ckdir_hash.c) ----
 * Per slot: the CRC32C of the slot's values (their bytes, little-endian) in global index
 * order, computed piecewise as the XOR of each run's CRC shifted by the bytes after it. h has
 * whole->ntensors x DL_CKD_KINDS entries, zero to start; es[kind] the element sizes. */
void dl__ckd_hash_run(uint32_t *h, const dl_gpt_layout *whole, const int *es, const dl__ckd_run *r,
                      const void *p);
/* The manifest's "state_hash": each tensor's three CRCs and "whole", the CRC32C of every slot's
 * bytes one after another (tensors in the one-rank order; parameter, m, v). */
json_t *dl__ckd_hash_json(const dl_gpt_layout *whole, const int *es, const uint32_t *h);
/* h against the manifest's state_hash: DL_OK, or DL_EINVAL "<what>: the state hash of <tensor>
 * <kind> is X, the manifest says Y" (the first that differs). A manifest without one: DL_OK. */
int dl__ckd_hash_check(json_t *m, const dl_gpt_layout *whole, const int *es, const uint32_t *h,
                       const char *what);
/* The hash of a checkpoint recomputed from its files (distlab-ckpt verify), checked as above. */
int dl__ckd_hash_verify(const char *dir, json_t *m);

#endif
