/* distlab-lecture 03, §4.3 measured: the asynchronous pipeline (PipeDream) that never drains
 * against 1F1B flushing every step, both run by the trainer on the real GPT at pp 2 (two rank
 * threads: they fit the two cores CI has). The simulator's figures are the verdicts (in
 * distlab-lecture.c); these are wall-clock measurements, printed beside them and never checked:
 * on a loaded host a late wake-up or a lost core idles the stage waiting for it (docs/
 * PERFORMANCE.md, "The continuous async pipeline"). */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "distlab.h"
#include "lecture.h"

enum { STAGES = 2, MICROBATCHES = 8, STEPS = 20 };

/* One run of the trainer: its total bubble (the median step after the first), the simulator's
 * for its schedule, and tokens per second. */
static int run(dl_sched_kind kind, double *bubble, double *sim, double *tps)
{
    dl_train_opts t;
    dl_train_opts_init(&t);
    t.model.layers = 4;
    t.model.d_model = 64;
    t.model.heads = 4;
    t.model.seq = 32;
    t.layout.pp = STAGES;
    t.pipeline.schedule = kind;
    t.pipeline.weight_stashing = kind == DL_SCHED_ASYNC;
    t.batch.micro = 2;
    t.batch.microbatches = MICROBATCHES;
    t.batch.global = 2 * MICROBATCHES;
    t.optim.steps = STEPS;
    t.optim.warmup = 1;
    t.eval.windows = 1;
    t.output.log_every = 0;
    t.output.log = NULL;
    dl_train_result r;
    memset(&r, 0, sizeof r);
    int rc = dl_train_resolve(&t, STAGES);
    if (rc == DL_OK)
        rc = dl_train_run(&t, &r);
    if (rc == DL_OK) {
        *bubble = r.pipeline.bubble_total;
        *sim = r.pipeline.bubble_theory;
        *tps = r.speed.tokens_per_s;
    }
    dl_train_result_free(&r);
    return rc;
}

int lecture_03_async(void)
{
    double b1, s1, t1, ba, sa, ta;
    if (run(DL_SCHED_1F1B, &b1, &s1, &t1) != DL_OK)
        return lec_fail("the 1F1B run");
    if (run(DL_SCHED_ASYNC, &ba, &sa, &ta) != DL_OK)
        return lec_fail("the async run");
    char shown[160];
    snprintf(shown, sizeof shown,
             "async %.1f%% a step (simulated %.1f%%), 1F1B %.1f%% (simulated %.1f%%); %.0f vs %.0f "
             "tokens/s",
             100 * ba, 100 * sa, 100 * b1, 100 * s1, ta, t1);
    lec_fig("§4.3", "async_measured_bubble",
            "  measured here (GPT, pp 2, m 8, 20 steps; wall clock, not checked)", 100 * ba, shown,
            "", LEC_INFO);
    return 0;
}
