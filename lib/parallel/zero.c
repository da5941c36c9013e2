/* ZeRO's sharding arithmetic: padding, contiguous dp shards, packing columns of the shards into
 * the blocks of a reduce-scatter / all-gather (see lib/parallel/zero.h). */
#include "config.h"
#include <stdlib.h>
#include <string.h>
#include "distlab/error.h"
#include "parallel/zero.h"

void dl_zero_shard_init(dl_zero_shard *z, size_t numel, int dp, int rank)
{
    size_t d = dp > 0 ? (size_t)dp : 1;
    memset(z, 0, sizeof *z);
    z->numel = numel;
    z->dp = (int)d;
    z->rank = rank;
    z->shard = (numel + d - 1) / d;
    z->padded = z->shard * d;
    z->padding = z->padded - numel;
    z->begin = (size_t)rank * z->shard;
    z->owned = numel > z->begin ? numel - z->begin : 0;
    if (z->owned > z->shard)
        z->owned = z->shard;
}

/* elements of row r's columns [lo, lo + k) that exist (below numel) */
static size_t row_real(const dl_zero_shard *z, int r, size_t lo, size_t k)
{
    size_t a = (size_t)r * z->shard + lo;
    if (a >= z->numel)
        return 0;
    return z->numel - a < k ? z->numel - a : k;
}

void dl_zero_pack_row(const dl_zero_shard *z, int r, const void *src, size_t lo, size_t k,
                      int dsize, void *packed)
{
    size_t n = row_real(z, r, lo, k), ds = (size_t)dsize;
    char *dst = (char *)packed + (size_t)r * k * ds;
    if (n)
        memcpy(dst, src, n * ds);
    if (n < k)
        memset(dst + n * ds, 0, (k - n) * ds);
}

void dl_zero_pack(const dl_zero_shard *z, const void *full, size_t lo, size_t k, int dsize,
                  void *packed)
{
    size_t ds = (size_t)dsize;
    for (int r = 0; r < z->dp; r++)
        dl_zero_pack_row(z, r, (const char *)full + ((size_t)r * z->shard + lo) * ds, lo, k, dsize,
                         packed);
}

void dl_zero_unpack(const dl_zero_shard *z, void *full, size_t lo, size_t k, int dsize,
                    const void *packed, int skip)
{
    size_t ds = (size_t)dsize;
    for (int r = 0; r < z->dp; r++) {
        size_t n = row_real(z, r, lo, k);
        if (r == skip || n == 0)
            continue;
        memcpy((char *)full + ((size_t)r * z->shard + lo) * ds,
               (const char *)packed + (size_t)r * k * ds, n * ds);
    }
}

size_t dl_zero_final_column(const dl_zero_shard *z, size_t first)
{
    return first < z->shard ? first : z->shard;
}

int dl_zero_units_init(dl_zero_units *z, const size_t *bounds, int n, int dp, int rank)
{
    return dl_zero_units_init2(z, bounds, n, dp, rank, NULL, 1, 0);
}

int dl_zero_units_init2(dl_zero_units *z, const size_t *bounds, int n, int dp, int rank,
                        const unsigned char *expert, int edp, int edp_rank)
{
    memset(z, 0, sizeof *z);
    z->u = calloc((size_t)(n > 0 ? n : 1), sizeof *z->u);
    if (!z->u)
        return dl_error(DL_ENOMEM, "zero: out of memory");
    z->dp = dp > 0 ? dp : 1;
    z->rank = rank;
    z->n = n;
    z->numel = n > 0 ? bounds[n] : 0;
    for (int i = 0; i < n; i++) {
        dl_zero_unit *u = &z->u[i];
        u->grp = expert && expert[i];
        u->d = u->grp ? (edp > 0 ? edp : 1) : z->dp;
        u->r = u->grp ? edp_rank : rank;
        size_t d = (size_t)u->d;
        u->lo = bounds[i];
        u->numel = bounds[i + 1] - bounds[i];
        u->shard = (u->numel + d - 1) / d;
        size_t off = (size_t)u->r * u->shard;
        u->begin = u->lo + off;
        u->owned = u->numel > off ? u->numel - off : 0;
        if (u->owned > u->shard)
            u->owned = u->shard;
        u->sbase = z->shard;
        z->shard += u->shard;
        z->padded += d * u->shard;
        if (d * u->shard > z->max_padded)
            z->max_padded = d * u->shard;
    }
    z->padding = z->padded - z->numel;
    return DL_OK;
}

int dl_zero_units_padded(const dl_zero_units *z)
{
    int padded = 0;
    for (int u = 0; u < z->n; u++) padded |= z->u[u].numel != (size_t)z->u[u].d * z->u[u].shard;
    return padded;
}

char *dl_zero_unit_staged(const dl_zero_units *z, int u, char *full, char *stg, int dsize)
{
    const dl_zero_unit *b = &z->u[u];
    size_t ss = (size_t)dsize, n = (size_t)b->d * b->shard;
    char *src = full + b->lo * ss;
    if (n == b->numel)
        return src;
    memcpy(stg, src, b->numel * ss);
    memset(stg + b->numel * ss, 0, (n - b->numel) * ss);
    return stg;
}

void dl_zero_units_free(dl_zero_units *z)
{
    free(z->u);
    z->u = NULL;
    z->n = 0;
}
