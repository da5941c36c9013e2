/* distlab (private): the per-rank memory arena ("GPU memory"); what users see of it (the
 * categories, dl_arena_alloc, dl_arena_get_stats) is in include/distlab/world.h.
 *
 * Every tensor a rank owns is allocated from its arena under a category, so that memory per rank
 * is measured, not estimated. Allocations are page-aligned (4096 B), which also avoids glibc's
 * slow-memcpy trap for copies between buffers whose addresses differ by 1-63 bytes mod 4096.
 * An optional capacity turns an over-allocation into DL_ENOMEM with a message naming the rank,
 * the category, the bytes asked and the bytes left. An arena is used by its rank's threads
 * (compute and communication thread); it is thread-safe. */
#ifndef DISTLAB_CORE_ARENA_H
#define DISTLAB_CORE_ARENA_H

#include <stddef.h>
#include <stdint.h>
#include "distlab/world.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Create an arena for `rank` (used in messages) with `capacity` bytes (0 = unlimited). */
int dl_arena_create(dl_arena **out, int rank, uint64_t capacity);
void dl_arena_destroy(dl_arena *a);

/* Parse a size such as "512M", "2G", "4096", "1.5GiB", "64k" (binary units) into bytes.
 * Returns DL_EINVAL for anything else. */
int dl_parse_size(const char *s, uint64_t *out);

#ifdef __cplusplus
}
#endif
#endif
