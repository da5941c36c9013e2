/* distlab: ZeRO's sharding arithmetic over the dp group (stages 1 and 2; the trainer uses it).
 *
 * A rank's flat buffer (its tp shard: P = dl_gpt_numel elements, parameters and gradients alike)
 * is padded to a multiple of the dp size d and cut into d contiguous shards of S = padded / d
 * elements: dp rank r owns [r·S, (r+1)·S) of the padded buffer (the ZeRO paper's partition). The
 * padding (< d elements) is at the end of the padded buffer; it usually falls in the last shard
 * but can span several when it exceeds S (P = 5, d = 4: S = 2, shards 2 and 3 hold padding, rank
 * 3 owns no real element). It never exists in the model's buffers (the packers below read it as
 * zero and never write it).
 *
 * Collectives over shards ("columns"): view the padded buffer as d rows (the shards) of S
 * columns. The columns [lo, lo + k) of all rows are d·k elements; packed row after row they are
 * exactly what dl_reduce_scatter / dl_allgather of a count of d·k cut into blocks (k each, rank r
 * the r-th), so one reduce-scatter of a packed round delivers to every rank the reduced columns of
 * ITS shard, and one all-gather spreads every rank's columns to all. A round is final when its
 * row-0 part is (gradients become final from the end of the buffer towards its start, and row 0
 * comes first): dl_zero_final_column. Element counts only: the same arithmetic serves any element
 * type (f32, f64; bf16 and stage 3 later). */
#ifndef DISTLAB_ZERO_H
#define DISTLAB_ZERO_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dl_zero_shard {
    size_t numel;    /* P: elements of the rank's flat buffer */
    int dp, rank;    /* d and this rank's dp rank */
    size_t padded;   /* d·S >= P: P rounded up to a multiple of d */
    size_t padding;  /* padded - P (< d) */
    size_t shard;    /* S = padded / d: elements each dp rank owns (optimizer state: 2·S) */
    size_t begin;    /* r·S: where this rank's shard starts */
    size_t owned;    /* elements of [begin, begin + S) below P: what this rank's optimizer updates */
} dl_zero_shard;

/* numel >= 0, dp >= 1, 0 <= rank < dp. With dp = 1 the one shard is the whole buffer. */
void dl_zero_shard_init(dl_zero_shard *z, size_t numel, int dp, int rank);

/* Copy columns [lo, lo + k) of every row of `full` (numel elements of `dsize` bytes) into
 * `packed` (d·k elements, row r at r·k); elements at or beyond numel (the padding) read as 0. */
void dl_zero_pack(const dl_zero_shard *z, const void *full, size_t lo, size_t k, int dsize,
                  void *packed);
/* Copy row r's k columns (one rank's piece: `src` holds columns [lo, lo + k) of that row,
 * i.e. shard elements lo..) into block r of `packed`, the elements beyond numel as 0. */
void dl_zero_pack_row(const dl_zero_shard *z, int r, const void *src, size_t lo, size_t k,
                      int dsize, void *packed);
/* The inverse of dl_zero_pack: write columns [lo, lo + k) of every row except `skip` (-1: none)
 * from `packed` into `full`, never at or beyond numel. */
void dl_zero_unpack(const dl_zero_shard *z, void *full, size_t lo, size_t k, int dsize,
                    const void *packed, int skip);

/* Lowest column whose d elements are all final once every element at flat offsets >= first is:
 * first when first < S, S (no column) otherwise. */
size_t dl_zero_final_column(const dl_zero_shard *z, size_t first);

#ifdef __cplusplus
}
#endif
#endif
