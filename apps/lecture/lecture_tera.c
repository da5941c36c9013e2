/* distlab-lecture 03, §6.2 measured: TeraPipe's schedule (2 sequences, 4 stages, c token chunks
 * each) run by the library's pipeline engine (dl_pipe_run) on 4 rank threads with sleep work:
 * each chunk's forward sleeps its share of a sequence's forward (FWD_MS; the backward twice as
 * long), scaled by the chunk's cost factor (the lecture's equal chunks, or each chunk's FLOPs),
 * to an absolute deadline, so sleeping stages need no core of their own and the figure holds on a
 * loaded 2-core machine. The bubble is the trainer's: 1 - Σ busy / (p × the longest stage's
 * step), busy the time inside the callbacks, the median of STEPS steps. */
#define _GNU_SOURCE
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "distlab.h"
#include "distlab/pipe.h"
#include "bench_util.h"
#include "lecture.h"

enum { TP_S = 4, STEPS = 3, FWD_MS = 8, HAND = 16 };

typedef struct tp_job {
    const dl_sched *s;
    const double *scale; /* per micro-batch (chunk) */
    double bubble[STEPS];
} tp_job;

typedef struct tp_stage {
    const tp_job *J;
    float in[HAND], out[HAND];
} tp_stage;

/* sleep ms x the chunk's factor / c from now */
static void work(const tp_stage *t, int mb, double ms)
{
    bu_sleep_until(dl_now_ns(),
                   (uint64_t)llround(ms * 1e6 * t->J->scale[mb] / t->J->s->seq_chunks));
}

static void *tp_in(void *arg, int mb, int ch)
{
    (void)mb, (void)ch;
    return ((tp_stage *)arg)->in;
}
static int tp_fwd(void *arg, int mb, int ch, const void **out)
{
    (void)ch;
    work(arg, mb, FWD_MS);
    *out = ((tp_stage *)arg)->out;
    return DL_OK;
}
static int tp_bwd(void *arg, int mb, int ch, const void **din)
{
    (void)ch;
    work(arg, mb, 2 * FWD_MS);
    *din = ((tp_stage *)arg)->out;
    return DL_OK;
}
static const dl_pipe_ops tp_ops = {tp_in, tp_fwd, tp_in, tp_bwd, NULL};

static int tp_rank(dl_ctx *x, void *arg)
{
    tp_job *J = arg;
    tp_stage S = {.J = J};
    dl_pipe *eng = NULL;
    int rc = dl_pipe_create(dl_ctx_comm(x), HAND, DL_F32, dl_ctx_arena(x), &eng);
    for (int i = 0; i < STEPS && rc == DL_OK; i++) {
        dl_pipe_stats st;
        double v[2], all[2 * TP_S];
        if ((rc = dl_pipe_run(eng, J->s, &tp_ops, &S, i, NULL, 0, &st)))
            break;
        v[0] = (double)st.busy_ns, v[1] = (double)st.wall_ns;
        if ((rc = dl_allgather(dl_ctx_comm(x), v, all, 2 * TP_S, DL_F64, DL_PURPOSE_OTHER)))
            break;
        double busy = 0, wall = 0;
        for (int s = 0; s < TP_S; s++) {
            busy += all[2 * s];
            wall = all[2 * s + 1] > wall ? all[2 * s + 1] : wall;
        }
        if (dl_ctx_rank(x) == 0)
            J->bubble[i] = 1 - busy / (TP_S * wall);
    }
    if (eng)
        dl_pipe_destroy(eng);
    return rc;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int lecture_03_tera_measure(const dl_sched *s, const double *scale, double *bubble)
{
    tp_job J = {.s = s, .scale = scale};
    dl_world_opts o;
    dl_world_opts_init(&o);
    o.nranks = TP_S;
    o.timeout_s = 60;
    int rc = dl_world_run(&o, tp_rank, &J);
    if (rc)
        return rc;
    qsort(J.bubble, STEPS, sizeof(double), cmp_double);
    *bubble = J.bubble[STEPS / 2];
    return DL_OK;
}
