/* distlab (private): full-state checkpoint directories (docs/CHECKPOINTS.md describes the format).
 *
 * A checkpoint is D/step-NNNNNNN/: one safetensors file per writing rank (rank-NNNNN.safetensors,
 * its tensors in the layout that rank trains with) and manifest.json, written last. The save is
 * collective over the world: rank 0 makes D/.tmp-step-NNNNNNN.PID (removing the temporaries of
 * dead processes first), every writer writes and fsyncs its file, rank 0 reads the files' headers
 * back into the manifest (each tensor's global shape and the piece each file holds), writes and
 * fsyncs it, fsyncs the directory, renames it to D/step-NNNNNNN and fsyncs D; then it prunes the
 * complete checkpoints beyond the newest `keep`. Until the rename the previous checkpoint is the
 * latest complete one; a directory named step-N is complete by construction. JSON is read and
 * written with jansson. Checksums: CRC32C of each whole file (lib/core/crc32c.h). */
#ifndef DISTLAB_IO_CKDIR_H
#define DISTLAB_IO_CKDIR_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include "distlab.h"
#include "io/ckpt_priv.h"

#define DL_CKD_FORMAT "distlab-state"
#define DL_CKD_VERSION 1 /* the manifest's format version this build writes and reads */
#define DL_CKD_MANIFEST "manifest.json"

/* One writer's file being assembled: tensors in the order added. */
typedef struct dl__ckd_shard {
    json_t *hdr;    /* the safetensors header */
    json_t *pieces; /* name -> what of the global tensor this file holds (into the metadata) */
    const void **data;
    size_t *bytes;
    int n, cap;
    uint64_t off; /* data bytes so far */
} dl__ckd_shard;

void dl__ckd_shard_init(dl__ckd_shard *s);
void dl__ckd_shard_free(dl__ckd_shard *s);
/* Add a tensor: its safetensors dtype ("F32", "F64", "BF16"), local shape, bytes (little-endian
 * host), and `piece` (taken over, may be NULL): the global shape and the part held
 * ({"global_shape":[..],"blocks":[{"start":[..],"count":[..]},..]} or a flat description). The
 * data must stay valid until dl__ckd_save returns. DL_ENOMEM or DL_EINVAL (a name twice). */
int dl__ckd_shard_add(dl__ckd_shard *s, const char *name, const char *dtype, int ndim,
                      const int64_t *shape, const void *data, size_t bytes, json_t *piece);

/* The collective save. */
typedef struct dl__ckd_save_args {
    const char *dir; /* D */
    int step;        /* the steps done: the directory's N */
    int keep;        /* complete checkpoints kept (0: all) */
    dl_comm *world;  /* every rank of the run */
    int writer;      /* this rank writes `shard` */
    int coord[3];    /* this rank's (dp, tp, pp) coordinates, for the manifest */
    dl__ckd_shard *shard;
    json_t *manifest; /* rank 0: the manifest's own fields (taken over); others NULL */
} dl__ckd_save_args;

/* Save as above. Every rank returns the same status; a failing rank's message names the file
 * and the problem, the others name the failing rank. On failure the temporary directory is
 * removed and nothing else is touched. A step already saved under D is not saved again (its
 * state is this one: DL_OK). *out (may be NULL; rank 0) receives the final directory's path. */
int dl__ckd_save(const dl__ckd_save_args *a, char *out, size_t outn);

/* The same save in phases, so that its file I/O can run on a writer thread (io/ckdir_writer.h)
 * while the collective phases run on the rank's thread at step boundaries: begin (collective:
 * rank 0 makes the temporary), write (I/O: this rank's file), collect (collective: every file's
 * size and CRC), commit (I/O, rank 0: the manifest, the rename), finish (collective: the
 * status, the temporary removed on failure; frees). Every rank calls all five in this order,
 * whatever failed: a phase after a failure does nothing but report it, and finish returns the
 * save's status, the same on every rank. a (and its shard, until write returns) must live
 * until finish. */
typedef struct dl__ckd_save_state {
    char tmp[4096], fin[4096];
    double *v;      /* every rank's slots */
    ck_err e;       /* the first failure */
    int skip;       /* the step was saved already */
    int over;       /* every rank knows the save is over (skipped or failed at begin) */
    int made;       /* rank 0 made the temporary */
    uint64_t bytes; /* after collect: the files' bytes */
} dl__ckd_save_state;
int dl__ckd_begin(const dl__ckd_save_args *a, dl__ckd_save_state *s);
int dl__ckd_write(const dl__ckd_save_args *a, dl__ckd_save_state *s);
int dl__ckd_collect(const dl__ckd_save_args *a, dl__ckd_save_state *s);
int dl__ckd_commit(const dl__ckd_save_args *a, dl__ckd_save_state *s);
int dl__ckd_finish(const dl__ckd_save_args *a, dl__ckd_save_state *s, char *out, size_t outn);

/* Copy every tensor's data into buf (s->off bytes) and point the shard at the copies: a
 * snapshot that the training may overwrite the originals of. */
void dl__ckd_shard_snapshot(dl__ckd_shard *s, void *buf);

/* D itself when it holds a manifest or is named step-N, else the newest D/step-N: its path in out. DL_EINVAL
 * naming D when there is none. */
int dl__ckd_find(const char *d, char *out, size_t outn);

/* Read and check dir's manifest: it parses, its format and version are this build's, every file
 * it lists exists with its size and CRC32C (verify: read whole). One line naming the file and
 * the problem otherwise (DL_EINVAL). *m is freed with json_decref. */
int dl__ckd_open(const char *dir, int verify, json_t **m);

/* The manifest's entry for the file written by world rank `rank`, or NULL. */
json_t *dl__ckd_file_of(json_t *m, int rank);

/* Read tensor `name` of `file` (in dir) whole into out: its dtype must be `dtype` and its size
 * `bytes`. DL_EINVAL naming the file and the problem. */
int dl__ckd_read(const char *dir, const char *file, const char *name, const char *dtype, void *out,
                 size_t bytes);

/* Parameter tensor `name` whole (its global shape, row-major, esize-byte elements) into out,
 * from the pieces the manifest lists (a tied copy skipped), each file's blocks placed at their
 * hyperslabs. DL_EINVAL naming the file or the tensor when a piece is missing or malformed. */
int dl__ckd_gather(const char *dir, json_t *m, const char *name, int esize, void *out);

/* The manifest as text, parsed and checked as dl__ckd_open does without the files: DL_OK or
 * DL_EINVAL with the problem (the fuzz target's entry point). */
int dl__ckd_parse(const char *text, size_t n, const char *what, json_t **m);

/* uint64 as a JSON string of 16 hex digits (jansson's integers are signed 64-bit), and back. */
json_t *dl__ckd_u64(uint64_t v);
int dl__ckd_get_u64(json_t *o, const char *key, uint64_t *v);

#endif
