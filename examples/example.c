/* A minimal distlab program: 4 rank threads all-reduce a vector of f32 and check the result.
 *
 * Build against an installed distlab:
 *   cc example.c $(pkg-config --cflags --libs distlab) -o example
 * Run with OPENBLAS_NUM_THREADS=1 (one BLAS thread per rank). */
#include <stdio.h>
#include <distlab.h>

#define NRANKS 4
#define COUNT 100003 /* not a multiple of 4: the ring's blocks are uneven */

typedef struct result {
    int wrong[NRANKS];
} result;

/* Each rank runs this. Rank r contributes x[i] = r + (i % 5), small integers, so the sum over
 * the 4 ranks is exact in f32: 0+1+2+3 + 4*(i % 5) = 6 + 4*(i % 5). */
static int rank_main(dl_ctx *ctx, void *arg)
{
    result *res = arg;
    int r = dl_ctx_rank(ctx), rc;
    void *mem = NULL;
    dl_arena *arena = dl_ctx_arena(ctx);

    /* The rank's arena: page-aligned, counted under "grads" like a real gradient buffer. */
    if ((rc = dl_arena_alloc(arena, DL_MEM_GRADS, COUNT * sizeof(float), &mem)) != DL_OK)
        return rc;
    float *x = mem;
    for (int i = 0; i < COUNT; i++) x[i] = (float)(r + i % 5);

    /* In place: x becomes the sum over all ranks. */
    rc = dl_allreduce(dl_ctx_comm(ctx), x, x, COUNT, DL_F32, DL_SUM, DL_PURPOSE_GRADS);
    if (rc == DL_OK) {
        int wrong = 0;
        for (int i = 0; i < COUNT; i++) wrong += x[i] != (float)(6 + 4 * (i % 5));
        res->wrong[r] = wrong; /* each rank writes only its own slot */
    }
    dl_arena_free(arena, x);
    return rc;
}

int main(void)
{
    dl_world_opts opts;
    result res = {{0}};

    dl_world_opts_init(&opts);
    opts.nranks = NRANKS;
    int rc = dl_world_run(&opts, rank_main, &res);
    if (rc != DL_OK) {
        fprintf(stderr, "example: %s: %s\n", dl_strstatus(rc), dl_errmsg());
        return 1;
    }
    int wrong = 0;
    for (int r = 0; r < NRANKS; r++) wrong += res.wrong[r];
    if (wrong) {
        fprintf(stderr, "example: allreduce on %d ranks gave %d wrong elements\n", NRANKS, wrong);
        return 1;
    }
    printf("example: allreduce on %d ranks ok\n", NRANKS);
    return 0;
}
