/* distlab: ZeRO's sharding arithmetic over the dp group. The trainer shards per unit (below,
 * "per-unit sharding"); the contiguous partition of the whole buffer that follows first is the
 * ZeRO paper's, kept for the planner (apps/plan/plan_calib.c) and its tests.
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
 * type (f32, f64, bf16). */
#ifndef DISTLAB_PARALLEL_ZERO_H
#define DISTLAB_PARALLEL_ZERO_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dl_zero_shard {
    size_t numel;   /* P: elements of the rank's flat buffer */
    int dp, rank;   /* d and this rank's dp rank */
    size_t padded;  /* d·S >= P: P rounded up to a multiple of d */
    size_t padding; /* padded - P (< d) */
    size_t shard;   /* S = padded / d: elements each dp rank owns (optimizer state: 2·S) */
    size_t begin;   /* r·S: where this rank's shard starts */
    size_t owned;   /* elements of [begin, begin + S) below P: what this rank's optimizer updates */
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

/* ---- per-unit sharding (what the trainer uses: stages 0-3, and bf16's dp at stage 0) ---------
 * FSDP's flat parameters: the rank's flat buffer is cut into units (the model's: embeddings, each
 * layer, head; dl_gpt_num_units), each unit padded to a multiple of d and cut into d blocks of
 * S_u = ceil(n_u / d) elements; dp rank r owns block r of every unit: [lo + r S_u, lo + (r+1) S_u)
 * of the unit, the padding (< d per unit) at the end of the unit's last block(s), never stored in
 * the model's buffers. So a unit's gradient is one plain reduce-scatter of d S_u elements (each
 * rank receives its block) and its parameters one plain all-gather, as soon as the backward
 * finishes the unit, or right before its forward. The rank's shard buffers (optimizer state,
 * stage 2-3 gradients, stage 3 parameters) hold its blocks one after another: shard = sum S_u,
 * padded = d x shard = sum of the padded units (Psi padded). With d = 1 the blocks are the units. */
typedef struct dl_zero_unit {
    size_t lo, numel; /* the unit: [lo, lo + numel) of the flat buffer */
    size_t shard;     /* S_u */
    size_t begin;     /* lo + r S_u: the flat offset of this rank's block */
    size_t owned;     /* real elements of the block (those below lo + numel) */
    size_t sbase;     /* where the block starts in the rank's shard buffers */
    int d, r;         /* the group this unit is sharded over: its size and this rank's rank */
    int grp;          /* which group: 0 the dp group, 1 the expert-data-parallel group */
} dl_zero_unit;

typedef struct dl_zero_units {
    int dp, rank, n;
    size_t numel;      /* P */
    size_t shard;      /* sum of S_u */
    size_t padded;     /* sum of d S_u (d x shard when every unit has the dp group) */
    size_t padding;    /* padded - P */
    size_t max_padded; /* the largest d S_u */
    dl_zero_unit *u;   /* [n] */
} dl_zero_units;

/* bounds[0] = 0 < bounds[1] < ... < bounds[n] = P (n >= 1). DL_ENOMEM only. */
int dl_zero_units_init(dl_zero_units *z, const size_t *bounds, int n, int dp, int rank);
/* The same with two groups (expert parallelism): unit i is sharded over the dp group (dp, rank)
 * when expert[i] is 0, over the expert-data-parallel group (edp, edp_rank) otherwise; the
 * blocks of both kinds follow one another in the shard buffers in unit order. expert NULL:
 * every unit over dp. */
int dl_zero_units_init2(dl_zero_units *z, const size_t *bounds, int n, int dp, int rank,
                        const unsigned char *expert, int edp, int edp_rank);
void dl_zero_units_free(dl_zero_units *z);
/* 1 when some unit is padded (d S_u > n_u): its collectives then need a staging unit of
 * max_padded elements */
int dl_zero_units_padded(const dl_zero_units *z);
/* Unit u of the flat buffer `full` (elements of dsize bytes) as the d S_u elements a unit's
 * collective takes: `full` + lo itself when the unit is not padded, else `stg` holding a copy of
 * the unit with its padding zeroed. */
char *dl_zero_unit_staged(const dl_zero_units *z, int u, char *full, char *stg, int dsize);

#ifdef __cplusplus
}
#endif
#endif
