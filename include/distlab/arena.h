/* distlab: the per-rank memory arena ("GPU memory").
 *
 * Every tensor a rank owns is allocated from its arena under a category, so that memory per rank
 * is measured, not estimated. Allocations are page-aligned (4096 B), which also avoids glibc's
 * slow-memcpy trap for copies between buffers whose addresses differ by 1-63 bytes mod 4096.
 * An optional capacity turns an over-allocation into DL_ENOMEM with a message naming the rank,
 * the category, the bytes asked and the bytes left. An arena is used by its rank's threads
 * (compute and communication thread); it is thread-safe. */
#ifndef DISTLAB_ARENA_H
#define DISTLAB_ARENA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dl_mem_category {
    DL_MEM_PARAMS = 0,
    DL_MEM_GRADS,
    DL_MEM_OPTIMIZER,
    DL_MEM_ACTIVATIONS,
    DL_MEM_COMM,
    DL_MEM_OTHER,
    DL_MEM_NCATEGORIES
} dl_mem_category;

typedef struct dl_arena dl_arena;

typedef struct dl_arena_stats {
    uint64_t current[DL_MEM_NCATEGORIES]; /* bytes live now, per category */
    uint64_t peak[DL_MEM_NCATEGORIES];    /* highest `current` seen, per category */
    uint64_t current_total;               /* sum of current over categories */
    uint64_t peak_total;                  /* highest current_total seen */
    uint64_t capacity;                    /* 0 = unlimited */
    uint64_t allocations;                 /* number of successful allocations so far */
} dl_arena_stats;

/* Name of a category ("params", "grads", "optimizer", "activations", "comm", "other"). */
const char *dl_mem_category_name(dl_mem_category cat);

/* Create an arena for `rank` (used in messages) with `capacity` bytes (0 = unlimited). */
int dl_arena_create(dl_arena **out, int rank, uint64_t capacity);
void dl_arena_destroy(dl_arena *a);

/* Allocate `bytes` (0 is allowed and returns a valid unique pointer) page-aligned, zeroed.
 * Fails with DL_ENOMEM if the capacity would be exceeded; nothing already allocated is touched. */
int dl_arena_alloc(dl_arena *a, dl_mem_category cat, size_t bytes, void **out);
/* Free a pointer from dl_arena_alloc (NULL is ignored). */
void dl_arena_free(dl_arena *a, void *p);

void dl_arena_get_stats(const dl_arena *a, dl_arena_stats *st);
/* Reset the peaks to the current values (e.g. before a measured step). */
void dl_arena_reset_peaks(dl_arena *a);

/* Parse a size such as "512M", "2G", "4096", "1.5GiB", "64k" (binary units) into bytes.
 * Returns DL_EINVAL for anything else. */
int dl_parse_size(const char *s, uint64_t *out);

#ifdef __cplusplus
}
#endif
#endif
