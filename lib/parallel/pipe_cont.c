/* The continuous async pipeline's part of the trainer (parallel/pipe_train.h): where its windows
 * end (the quiet points) and the step's loss handed from the head without a collective. */
#include <stdlib.h>
#include "parallel/pipe_train.h"

/* The first multiple of every at or after step (0: none). */
static int next_multiple(int step, int every)
{
    return every > 0 ? (step + every - 1) / every * every : 0;
}

static int earlier(int a, int b) { return b > 0 && b < a ? b : a; }

int tr_async_window_end(const dl_train_opts *o, int first)
{
    int end = o->optim.steps;
    end = earlier(end, next_multiple(first, o->eval.every));
    if (o->ckpt.dir)
        end = earlier(end, next_multiple(first, o->ckpt.save_every));
    return end < first ? first : end;
}

int tr_async_window_cut(int p, int m, int first, int end, int done)
{
    /* the slices up to step `done` stay as they ran while every forward they hold, up to
     * micro-batch (done - first + 1) m + p - 2 of the window, is still inside it */
    int need = (done - first + 1) * m + p - 1, n = (need + m - 1) / m;
    int cut = first + n - 1;
    return cut < end ? cut : end;
}

int tr_async_loss(dl_comm *pp, int head, double *x)
{
    int me = dl_comm_rank(pp), n = dl_comm_size(pp), rc = DL_OK;
    if (me != head)
        return dl_recv(pp, x, 1, DL_F64, head, DL_PURPOSE_LOSS);
    /* small messages are copied at once: the head never waits for the stages still busy with
     * this step's last backwards */
    for (int q = 0; q < n && rc == DL_OK; q++)
        if (q != head)
            rc = dl_send(pp, x, 1, DL_F64, q, DL_PURPOSE_LOSS);
    return rc;
}
