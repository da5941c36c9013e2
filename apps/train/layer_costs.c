/* Per-layer costs measured on this machine, for the pipeline's balanced partition
 * (distlab-train --layer-costs measure).
 *
 * Every transformer block has the same shapes, so the blocks cost the same; what differs is the
 * first layer, which also runs the embeddings, and the last, which also runs the final LayerNorm,
 * the LM head and the loss (the head's V x C GEMM is often the largest single cost). So one rank
 * builds the model's first, a middle and the last layer as separate chunks of one stage (a
 * dl_gpt_part of up to 3 one-layer chunks), times each chunk's forward and backward on this
 * thread, and takes the median of `reps` passes: costs[0] = the first chunk, costs[L-1] = the
 * last, every other layer the middle one. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "distlab.h"
#include "core/arena.h"
#include "cli.h"
#include "layer_costs.h"
#include "core/stats.h"

int measure_layer_costs(const dl_gpt_config *cfg, dl_dtype dt, int micro_batch, int reps,
                        double *costs, char *desc, size_t desc_len)
{
    int L = cfg->layers, n = L < 3 ? L : 3; /* chunks: first, middle, last layer */
    if (reps < 1)
        reps = 1;
    dl_gpt_config c = *cfg;
    c.layers = n;
    dl_gpt_part part;
    memset(&part, 0, sizeof part);
    part.nchunks = n;
    for (int k = 0; k < n; k++) part.first[k] = k, part.count[k] = 1;
    part.embed = part.head = 1;
    dl_arena *arena = NULL;
    dl_gpt *g = NULL;
    int T = c.seq, rc;
    size_t N = (size_t)micro_batch * T, act = N * (size_t)c.d_model;
    int *in = malloc(sizeof(int) * N), *tg = malloc(sizeof(int) * N);
    double *t = calloc((size_t)n * (size_t)reps, sizeof(double));
    if (!in || !tg || !t) {
        rc = dl_error(DL_ENOMEM, "measuring layer costs: out of memory");
        goto out;
    }
    for (size_t i = 0; i < N; i++)
        in[i] = (int)(i * 7 % (size_t)c.vocab), tg[i] = (int)(i * 13 % (size_t)c.vocab);
    if ((rc = dl_arena_create(&arena, 0, 0)))
        goto out;
    dl_gpt_opts o;
    memset(&o, 0, sizeof o);
    o.cfg = c;
    o.dtype = dt == DL_F64 ? DL_F64 : DL_F32; /* bf16 computes in f32: the same work */
    o.micro_batch = micro_batch;
    o.tp = 1;
    o.seed = 1;
    o.arena = arena;
    o.part = &part;
    o.act_slots = n;
    if ((rc = dl_gpt_create(&o, &g)))
        goto out;
    size_t es = dt == DL_F64 ? 8 : 4;
    for (int r = 0; r <= reps && rc == DL_OK; r++) { /* pass 0 warms up */
        double loss;
        for (int k = 0; k < n && rc == DL_OK; k++) {
            if (k > 0)
                memcpy(dl_gpt_stage_input(g, k, k), dl_gpt_stage_output(g, k - 1, k - 1), act * es);
            uint64_t t0 = dl_now_ns();
            rc = dl_gpt_stage_forward(g, k, k, k == 0 ? in : NULL, k == n - 1 ? tg : NULL,
                                      micro_batch, &loss);
            if (r > 0)
                t[(size_t)k * reps + (r - 1)] += (double)(dl_now_ns() - t0);
        }
        for (int k = n - 1; k >= 0 && rc == DL_OK; k--) {
            uint64_t t0 = dl_now_ns();
            rc = dl_gpt_stage_backward(g, k, k, 1.0 / (double)N, NULL, NULL);
            if (r > 0)
                t[(size_t)k * reps + (r - 1)] += (double)(dl_now_ns() - t0);
        }
        dl_gpt_zero_grads(g);
    }
    if (rc)
        goto out;
    double med[3] = {0, 0, 0};
    for (int k = 0; k < n; k++)
        med[k] = dl__median(t + (size_t)k * reps, (size_t)reps) / 1e6; /* ms */
    for (int l = 0; l < L; l++) costs[l] = l == 0 ? med[0] : l == L - 1 ? med[n - 1] : med[1];
    if (desc) {
        char mid[64] = "";
        if (n > 2)
            snprintf(mid, sizeof mid, "a middle layer %.3f ms, ", med[1]);
        if (n == 1)
            snprintf(desc, desc_len,
                     "the one layer (with the embeddings, the head and the loss) "
                     "%.3f ms",
                     med[0]);
        else
            snprintf(desc, desc_len,
                     "first layer (with the embeddings) %.3f ms, %slast layer "
                     "(with the head and loss) %.3f ms",
                     med[0], mid, med[n - 1]);
        size_t k = strlen(desc);
        snprintf(desc + k, desc_len - k,
                 " per micro-batch of %d (forward + backward, median of %d)", micro_batch, reps);
    }
out:
    dl_gpt_destroy(g);
    dl_arena_destroy(arena);
    free(in), free(tg), free(t);
    return rc;
}
