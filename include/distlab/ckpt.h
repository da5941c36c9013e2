/* distlab: checkpoints of the GPT model's parameters in the safetensors layout.
 *
 * A checkpoint holds the FULL (unsharded) model, whatever tensor-parallel layout or pipeline
 * stage saved it, and any layout (any tp degree, any pipeline part) loads it: a stage's layout
 * (dl_gpt_layout.part) writes and reads its own tensors, matched to the whole model's by tensor
 * id; the whole model's header and offsets are used either way, a file must hold every tensor
 * of the whole model, and a head stage's copy of tied wte is read but not written. No rank ever holds the whole model: every rank computes
 * the same header from its dl_gpt_layout and reads or writes only its own slices, at their
 * global offsets, with pread / pwrite.
 *
 * File format (https://github.com/huggingface/safetensors):
 *   bytes [0, 8)        N, the header length, unsigned 64-bit little-endian; N % 8 == 0
 *   bytes [8, 8 + N)    JSON header, padded with spaces (0x20) to N bytes:
 *     {"wte.weight":{"dtype":"F32","shape":[256,256],"data_offsets":[0,262144]},
 *      "wpe.weight":{...}, ..., "h.0.ln_1.weight":{"dtype":"F32","shape":[256],...}, ...,
 *      "__metadata__":{"format":"distlab-gpt","version":"1",
 *                      "config":"layers=4,d_model=256,heads=4,seq=128,vocab=256,tie=0",
 *                      "dtype":"F32","checksum_algo":"fnv1a64","checksum":"<16 hex digits>"}}
 *   bytes [8 + N, end)  the data section: each tensor's elements, row-major, little-endian,
 *                       in the layout's (forward) order, contiguous, data_offsets relative to
 *                       the start of the data section.
 * Tensor names, shapes and order are those of include/distlab/model.h (nn.Linear's (out, in)
 * weights; 1-D tensors have shape [n]; lm_head.weight is absent when the head is tied). dtype is
 * "F32" or "F64" (the saving run's precision). Every __metadata__ value is a string, as
 * safetensors requires. "checksum" is FNV-1a 64 over the bytes of the whole data section, as 16
 * lower-case hex digits.
 *
 * Saving is atomic: rank 0 of the group writes to PATH.tmp.<pid> and renames it over PATH only
 * after every slice is written and the file is synced; on any failure the temporary file is
 * removed and PATH is untouched (an older checkpoint there survives). */
#ifndef DISTLAB_CKPT_H
#define DISTLAB_CKPT_H

#include <stdint.h>
#include "distlab/comm.h"
#include "distlab/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Save the model. Collective over `group`, which must contain every rank that holds a distinct
 * shard (the tp group, or the world). Every member passes its own layout (all with the same
 * config and tp degree) and parameter buffer (`dsize` 4: f32, 8: f64). `writer` = 1 on the
 * ranks that write their slices: for each tp rank exactly one member should write (dp replicas
 * pass 0 and still take part); replicated tensors are written by the writer with tp_rank 0.
 * Protocol: rank 0 of the group creates PATH.tmp.<pid>, writes the header and sizes the file;
 * status all-reduce; writers pwrite their slices; status all-reduce; rank 0 reads the data
 * section back, patches the checksum into the header, fsyncs, renames over PATH and syncs the
 * directory; status all-reduce. The status all-reduces (a few f32, max, DL_PURPOSE_OTHER)
 * replace barriers so that when any rank fails every rank returns an error (no one hangs):
 * the failing rank its own message naming the file, the others the same code with a message
 * naming the failing group rank. Also refused on every rank: members that disagree on the
 * config, tp degree or dtype, and a tp rank that no writer covers (checked for tp <= 64). */
int dl_ckpt_save(const char *path, const dl_gpt_layout *l, const void *params, int dsize,
                 dl_comm *group, int writer);

/* When dl_ckpt_load_ex verifies the data section's checksum (reading the whole file). */
typedef enum dl_ckpt_verify {
    DL_CKPT_VERIFY_AUTO = 0,   /* on tp_rank 0 of the layout only (dl_ckpt_load's choice) */
    DL_CKPT_VERIFY_ALWAYS = 1, /* on this rank */
    DL_CKPT_VERIFY_NEVER = 2
} dl_ckpt_verify;

/* What a checkpoint file says about itself. */
typedef struct dl_ckpt_info {
    int dsize; /* 4 (F32) or 8 (F64): the file's element size */
    int ntensors;
    int64_t header_bytes; /* N */
    int64_t data_bytes;   /* length of the data section */
    int has_config;       /* 1 when __metadata__ holds a parseable "config" */
    dl_gpt_config cfg;    /* that config (valid when has_config) */
    int has_checksum;
    uint64_t checksum;     /* the stored FNV-1a 64 of the data section */
    int checksum_verified; /* set by dl_ckpt_load_ex: 1 when this rank verified it */
    int converted;         /* set by dl_ckpt_load_ex: 1 when the file's dtype was converted */
} dl_ckpt_info;

/* Load this rank's slices of every tensor of `l` from `path` into `params` (`dsize` 4 or 8).
 * Not collective: each rank reads (pread) only its own slices, so any tp degree loads a file
 * saved under any other. Checks, each failing with a message naming the file: the file opens;
 * the header length fits the file; the header is well-formed JSON of the safetensors shape
 * (anything else is DL_EINVAL); data_offsets are consistent with dtype and shape and tile the
 * data section exactly (a truncated file is refused); every tensor of the layout is present with
 * its global shape (DL_EINVAL naming the first mismatching tensor and both shapes), no extra
 * tensor, and a stored config, if any, agrees with l's; dtype is F32 or F64 (a file whose dtype
 * differs from `dsize` is converted: f64 -> f32 rounds to nearest); the checksum matches when it
 * is verified (dl_ckpt_load: on tp_rank 0 only, see dl_ckpt_verify). On failure `params` may be
 * partly written. */
int dl_ckpt_load(const char *path, const dl_gpt_layout *l, void *params, int dsize);

/* Same with the verification policy given, and `info` (may be NULL) filled with what the file
 * holds, whether its checksum was verified here and whether the data were converted. */
int dl_ckpt_load_ex(const char *path, const dl_gpt_layout *l, void *params, int dsize,
                    dl_ckpt_verify verify, dl_ckpt_info *info);

/* Read and check a checkpoint's header only (no data), e.g. to learn a file's config before
 * building a layout. Same header checks as dl_ckpt_load (not the layout ones). */
int dl_ckpt_inspect(const char *path, dl_ckpt_info *info);

#define DL_CKPT_FNV_INIT 0xcbf29ce484222325ull
/* FNV-1a 64 of `n` bytes, continuing from `h` (start with DL_CKPT_FNV_INIT). */
uint64_t dl_ckpt_fnv1a64(uint64_t h, const void *p, size_t n);

#ifdef __cplusplus
}
#endif
#endif
