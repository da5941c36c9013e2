/* The per-rank memory arena ("GPU memory"): page-aligned, zeroed allocations counted per
 * category against an optional capacity. */
#include "config.h"
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* posix_memalign */
#endif
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "distlab/error.h"
#include "core/arena.h"

/* Each block is one page of header followed by the caller's bytes, so that the returned
 * pointer is page-aligned (glibc's memcpy is ~25x slower when dst - src is 1..63 mod 4096,
 * measured here) and the header is found again from the pointer alone. */
#define DL_ARENA_PAGE 4096u
#define DL_ARENA_MAGIC 0x646c6172656e6131ULL /* "dlarena1" */

typedef struct block_hdr {
    uint64_t magic;
    dl_arena *owner;
    size_t bytes; /* bytes asked: what the stats count */
    dl_mem_category cat;
    struct block_hdr *prev, *next; /* live blocks, so that destroy releases everything */
} block_hdr;

_Static_assert(sizeof(block_hdr) <= DL_ARENA_PAGE, "arena header must fit in one page");

struct dl_arena {
    pthread_mutex_t mu;
    int rank;
    dl_arena_stats st;
    block_hdr *live;
};

static const char *const category_names[DL_MEM_NCATEGORIES] = {"params",      "grads",  "optimizer",
                                                               "activations", "comm",   "other",
                                                               "ckpt",        "kvcache"};

const char *dl_mem_category_name(dl_mem_category cat)
{
    if ((int)cat < 0 || cat >= DL_MEM_NCATEGORIES)
        return "unknown";
    return category_names[cat];
}

int dl_arena_create(dl_arena **out, int rank, uint64_t capacity)
{
    if (!out)
        return dl_error(DL_EINVAL, "arena_create: null output pointer");
    *out = NULL;
    dl_arena *a = calloc(1, sizeof *a);
    if (!a)
        return dl_error(DL_ENOMEM, "rank %d: arena_create: out of host memory", rank);
    int rc = pthread_mutex_init(&a->mu, NULL);
    if (rc != 0) {
        free(a);
        return dl_error(DL_ESYS, "rank %d: arena_create: pthread_mutex_init: %s", rank,
                        strerror(rc));
    }
    a->rank = rank;
    a->st.capacity = capacity;
    *out = a;
    return DL_OK;
}

void dl_arena_destroy(dl_arena *a)
{
    if (!a)
        return;
    /* Release what is still live: a rank that failed half-way must not leak its tensors. */
    block_hdr *h = a->live;
    while (h) {
        block_hdr *next = h->next;
        h->magic = 0;
        free(h);
        h = next;
    }
    pthread_mutex_destroy(&a->mu);
    free(a);
}

int dl_arena_alloc(dl_arena *a, dl_mem_category cat, size_t bytes, void **out)
{
    if (!out)
        return dl_error(DL_EINVAL, "arena_alloc: null output pointer");
    *out = NULL;
    if (!a)
        return dl_error(DL_EINVAL, "arena_alloc: null arena");
    if ((int)cat < 0 || cat >= DL_MEM_NCATEGORIES)
        return dl_error(DL_EINVAL, "rank %d: arena_alloc: unknown memory category %d", a->rank,
                        (int)cat);
    /* One extra byte for a 0-byte request, so that its pointer is unique and dereferenceable. */
    size_t payload = bytes ? bytes : 1;
    if (payload > SIZE_MAX - DL_ARENA_PAGE)
        return dl_error(DL_ENOMEM, "rank %d: out of host memory allocating %zu bytes of %s",
                        a->rank, bytes, dl_mem_category_name(cat));

    pthread_mutex_lock(&a->mu);
    dl_arena_stats *st = &a->st;
    /* Check the capacity before touching the host allocator, and under the lock, so that
     * concurrent allocations can never overshoot it together. */
    if (st->capacity && (uint64_t)bytes > st->capacity - st->current_total) {
        /* in MiB, as --gpu-mem 16M means, with what this category holds already */
        const double M = 1048576.0;
        double cap = (double)st->capacity, used = (double)st->current_total,
               mine = (double)st->current[cat];
        int rank = a->rank;
        pthread_mutex_unlock(&a->mu);
        return dl_error(DL_ENOMEM,
                        "rank %d: out of GPU memory allocating %.3f MiB (%zu bytes) of %s: "
                        "capacity %.3f MiB, in use %.3f MiB (%s %.3f MiB), left %.3f MiB",
                        rank, (double)bytes / M, bytes, dl_mem_category_name(cat), cap / M,
                        used / M, dl_mem_category_name(cat), mine / M, (cap - used) / M);
    }
    void *block = NULL;
    int rc = posix_memalign(&block, DL_ARENA_PAGE, DL_ARENA_PAGE + payload);
    if (rc != 0) {
        pthread_mutex_unlock(&a->mu);
        return dl_error(DL_ENOMEM, "rank %d: out of host memory allocating %zu bytes of %s",
                        a->rank, bytes, dl_mem_category_name(cat));
    }
    block_hdr *h = block;
    h->magic = DL_ARENA_MAGIC;
    h->owner = a;
    h->bytes = bytes;
    h->cat = cat;
    h->prev = NULL;
    h->next = a->live;
    if (a->live)
        a->live->prev = h;
    a->live = h;
    st->current[cat] += bytes;
    if (st->current[cat] > st->peak[cat])
        st->peak[cat] = st->current[cat];
    st->current_total += bytes;
    if (st->current_total > st->peak_total)
        st->peak_total = st->current_total;
    st->allocations++;
    pthread_mutex_unlock(&a->mu);

    /* Zero outside the lock: nobody else can see this block yet, and large tensors would
     * otherwise serialise the rank's threads. */
    void *p = (char *)block + DL_ARENA_PAGE;
    memset(p, 0, payload);
    *out = p;
    return DL_OK;
}

void dl_arena_free(dl_arena *a, void *p)
{
    if (!p || !a)
        return;
    if (((uintptr_t)p & (DL_ARENA_PAGE - 1)) != 0) {
        /* A pointer we never handed out; freeing it would corrupt the heap. Say so, leak it. */
        fprintf(stderr, "distlab: rank %d: arena_free of a pointer not from an arena (%p)\n",
                a->rank, p);
        return;
    }
    block_hdr *h = (block_hdr *)((char *)p - DL_ARENA_PAGE);
    if (h->magic != DL_ARENA_MAGIC || h->owner != a) {
        fprintf(stderr, "distlab: rank %d: arena_free of a pointer not from this arena (%p)\n",
                a->rank, p);
        return;
    }
    pthread_mutex_lock(&a->mu);
    if (h->prev)
        h->prev->next = h->next;
    else
        a->live = h->next;
    if (h->next)
        h->next->prev = h->prev;
    a->st.current[h->cat] -= h->bytes;
    a->st.current_total -= h->bytes;
    h->magic = 0;
    pthread_mutex_unlock(&a->mu);
    free(h);
}

void dl_arena_get_stats(const dl_arena *a, dl_arena_stats *st)
{
    if (!st)
        return;
    if (!a) {
        memset(st, 0, sizeof *st);
        return;
    }
    /* The mutex is bookkeeping, not part of the arena's logical value: locking it through a
     * const pointer is fine (every arena lives in malloc'ed, non-const storage). */
    dl_arena *m = (dl_arena *)a;
    pthread_mutex_lock(&m->mu);
    *st = m->st;
    pthread_mutex_unlock(&m->mu);
}

void dl_arena_reset_peaks(dl_arena *a)
{
    if (!a)
        return;
    pthread_mutex_lock(&a->mu);
    for (int c = 0; c < DL_MEM_NCATEGORIES; c++) a->st.peak[c] = a->st.current[c];
    a->st.peak_total = a->st.current_total;
    pthread_mutex_unlock(&a->mu);
}

/* ---- sizes ---- */

static int size_error(const char *s)
{
    return dl_error(DL_EINVAL,
                    "invalid size \"%s\": expected a whole number of bytes or a number with a "
                    "binary unit K, M, G or T (optionally followed by B or iB), e.g. 4096, 64k, "
                    "512M, 1.5GiB",
                    s);
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }

int dl_parse_size(const char *s, uint64_t *out)
{
    if (!s)
        return dl_error(DL_EINVAL, "invalid size: null string");
    if (!out)
        return dl_error(DL_EINVAL, "parse_size: null output pointer");
    const char *q = s;
    if (!is_digit(*q))
        return size_error(s); /* empty, sign, whitespace, ".5" */

    uint64_t whole = 0;
    for (; is_digit(*q); q++) {
        unsigned d = (unsigned)(*q - '0');
        if (whole > (UINT64_MAX - d) / 10)
            return dl_error(DL_EINVAL, "invalid size \"%s\": too large", s);
        whole = whole * 10 + d;
    }
    /* Fraction kept as an exact decimal num / den (at most 18 digits; later digits cannot
     * change the result by a whole byte for any unit up to T). */
    uint64_t num = 0, den = 1;
    int has_frac = 0;
    if (*q == '.') {
        q++;
        if (!is_digit(*q))
            return size_error(s);
        has_frac = 1;
        for (int nd = 0; is_digit(*q); q++, nd++) {
            if (nd < 18) {
                num = num * 10 + (uint64_t)(*q - '0');
                den *= 10;
            }
        }
    }

    unsigned shift = 0;
    switch (*q) {
    case 'k':
    case 'K': shift = 10; break;
    case 'm':
    case 'M': shift = 20; break;
    case 'g':
    case 'G': shift = 30; break;
    case 't':
    case 'T': shift = 40; break;
    default: break;
    }
    if (shift) {
        q++;
        if (*q == 'i' || *q == 'I') {
            q++;
            if (*q != 'b' && *q != 'B')
                return size_error(s);
        }
        if (*q == 'b' || *q == 'B')
            q++;
    } else if (*q == 'b' || *q == 'B') {
        q++;
    }
    if (*q != '\0')
        return size_error(s);
    if (has_frac && shift == 0)
        return dl_error(DL_EINVAL, "invalid size \"%s\": not a whole number of bytes", s);

    if (shift && whole > (UINT64_MAX >> shift))
        return dl_error(DL_EINVAL, "invalid size \"%s\": too large", s);
    uint64_t v = whole << shift;
    /* floor(num * 2^shift / den) by binary long division: exact, no 128-bit arithmetic
     * (rem < den <= 10^18, so 2 * rem never overflows). */
    uint64_t frac = 0, rem = num;
    for (unsigned i = 0; i < shift; i++) {
        frac <<= 1;
        rem <<= 1;
        if (rem >= den) {
            frac++;
            rem -= den;
        }
    }
    if (frac > UINT64_MAX - v)
        return dl_error(DL_EINVAL, "invalid size \"%s\": too large", s);
    *out = v + frac;
    return DL_OK;
}
