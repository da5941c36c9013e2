/* The trainer: each rank's set-up, its step loop over the strategy modules (parallel/module.h,
 * composed in train/compose.c from the list in train/modules.def) and the run around the ranks. */
#define _GNU_SOURCE
#include "config.h"
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "distlab.h"
#include "model/gpt_priv.h"
#include "model/ops.h"
#include "distlab/train.h"
#include "distlab/data.h"
#include "distlab/mpi.h"
#include "train/compose.h"
#include "train/dump.h"
#include "train/eval.h"
#include "train/report.h"
#include "train/run.h"
#include "train/saver.h"
#include "runtime/fault.h"
#include "train/state.h"

/* ---- the step ---- */

enum { TR_STOPPED = -1 };

/* After a step, with ckpt.dir: a checkpoint when one is due or the ranks agreed to stop (sig);
 * TR_STOPPED when the run stops here (its checkpoint written). */
static int ckpt_boundary(tr_env *e, tr_comp *c, tr_saver *sv, int step, int skipped, int sig)
{
    const dl_train_opts *o = e->o;
    int rc = DL_OK;
    int due = (o->ckpt.save_every > 0 && step % o->ckpt.save_every == 0) ||
              (o->ckpt.save_at_end && step == o->optim.steps) || sig;
    if (rc == DL_OK && due)
        rc = tr_ckpt_save(e, c, sv, step, skipped);
    if (rc == DL_OK && sig && (rc = tr_saver_drain(sv, 1)) == DL_OK) {
        if (e->rank == 0)
            e->R->res->ckpt.stopped = sig;
        return TR_STOPPED;
    }
    return rc;
}

/* Every step: the runner's forwards and backwards (the modules reducing gradients as they are
 * final), the reductions' end and the loss, the norm, the optimizer (unless the runner updated
 * already), the records, evaluations. */

/* The step's trace (or NULL) for the MoE layers' all-to-all events. */
static void moe_trace(dl_gpt *g, dl_trace *tr, int rank, int step)
{
    for (int i = 0; i < dl_gpt_moe_layers(g); i++) {
        dl_moe_stats *ms = dl_gpt_moe_stats(g, i);
        ms->tr = tr, ms->tr_rank = rank, ms->tr_step = step;
    }
}
static int train_steps(tr_env *e, tr_comp *c)
{
    tr_run *R = e->R;
    const dl_train_opts *o = e->o;
    int rank = e->rank, rc = DL_OK, last_logged = R->start, skipped = R->skipped0;
    tr_eval_bytes eb = {0, 0, 0};
    /* full-state checkpoints talk on their own communicator: their traffic is not the step's */
    dl_comm *ck = NULL;
    tr_saver *sv = NULL;
    if (o->ckpt.dir && (rc = dl_comm_split(dl_ctx_comm(e->ctx), 0, rank, &ck)))
        return rc;
    if (ck && (rc = tr_saver_create(e, ck, &sv))) {
        dl_comm_free(ck);
        return rc;
    }
    dl_comm_reset_stats(e->mesh->dp_comm);
    dl_comm_reset_stats(e->mesh->tp_comm);
    dl_comm_reset_stats(dl_ctx_comm(e->ctx));
    for (int step = R->start + 1; step <= o->optim.steps && rc == DL_OK; step++) {
        int logging = rank == 0 && R->gemm && step == (o->optim.steps > 1 ? 2 : 1);
        if (logging)
            dl_ops_gemm_log(R->gemm);
        if ((rc = dl__fault_step(e->ctx, step)))
            break;
        uint64_t t0 = dl_now_ns();
        e->step = step;
        e->tr =
            !o->trace.first || (step >= o->trace.first && step <= o->trace.last) ? R->trace : NULL;
        dl_gpt_zero_grads(e->g);
        tr_step_rec r = {.val = NAN,
                         .lr = tr_lr_at(o->optim.lr, o->optim.min_lr, o->optim.warmup,
                                        o->optim.steps, step)};
        moe_trace(e->g, e->tr, rank, step);
        if ((rc = tr_begin(c)) || (rc = tr_fwd_bwd(c, &r.loss)))
            break;
        moe_trace(e->g, NULL, rank, step); /* evaluations' forwards are not the step's */
        uint64_t c0 = dl_now_ns();
        if ((rc = tr_reduce(c)) || (rc = tr_reduce_loss(c, &r.loss)))
            break;
        /* a non-finite loss does not recover (a non-finite gradient alone skips the step): stop */
        if (!isfinite(r.loss))
            rc = dl_error(DL_EINVAL,
                          "training: step %d: the loss is %g, not finite; stopping (the "
                          "model diverged: try a lower learning rate)",
                          step, r.loss);
        /* the gradient reduction's wait (and whatever of it did not overlap) and the loss */
        dl_trace_add(e->tr, rank, DL_TR_COMM, step, -1, 0, c0, dl_now_ns());
        if (rc == DL_OK && !e->self_update)
            rc = tr_grad_norm(c, &r.norm);
        if (rc || (rc = tr_dump_grads(e)))
            break;
        /* a non-finite gradient anywhere (the norm is global) skips the step on every rank */
        r.skip = !e->self_update && !isfinite(r.norm);
        skipped += r.skip;
        uint64_t a0 = dl_now_ns();
        if (!e->self_update && !r.skip &&
            (rc = tr_update(c, tr_clip_scale(o->optim.clip, r.norm), r.lr)))
            break;
        dl_trace_add(e->tr, rank, DL_TR_OPT, step, -1, 0, a0, dl_now_ns());
        if (!e->runner_span)
            dl_trace_add(e->tr, rank, DL_TR_STEP, step, -1, 0, t0, dl_now_ns());
        R->step_ms[(size_t)(step - 1) * R->nranks + rank] = (double)(dl_now_ns() - t0) / 1e6;
        atomic_fetch_add_explicit(&R->finished[step - 1], 1, memory_order_release);
        if (logging)
            dl_ops_gemm_log(NULL);
        /* the ranks agree on a stop request: the last step then evaluates as the last does */
        int sig = 0;
        if (sv && (rc = tr_saver_boundary(sv, &sig)))
            break;
        /* the continuous pipeline stops at its next quiet point (it drains there, usually the
         * next step): the ranks agreed on sig and their windows alike */
        if (sig && e->open) {
            e->stop_soon = 1;
            sig = 0;
        }
        if (((o->eval.every > 0 && step % o->eval.every == 0) || step == o->optim.steps || sig) &&
            (rc = tr_evaluate_counted(e, &eb, &r.val, &r.used)))
            break;
        if (rank == 0)
            tr_record_step(e, &r, &last_logged, &rc);
        if (sv && rc == DL_OK && (rc = ckpt_boundary(e, c, sv, step, skipped, sig)) == TR_STOPPED) {
            rc = DL_OK;
            break;
        }
    }
    /* the run's end waits for the save in flight */
    if (sv && rc == DL_OK)
        rc = tr_saver_drain(sv, 1);
    tr_saver_destroy(sv);
    if (ck)
        dl_comm_free(ck);
    if (rc == DL_OK && rank == 0) {
        tr_report_traffic(e, &eb, skipped);
        tr_report(c, R->res);
    }
    return rc;
}

/* Only evaluate (--eval-only): the loaded model's validation loss. */
static int eval_only(tr_env *e)
{
    double v;
    int used, rc = tr_evaluate(e, &v, &used);
    if (rc == DL_OK && e->rank == 0) {
        e->R->res->eval.final_val_loss = v;
        e->R->res->eval.windows = used;
    }
    return rc;
}

/* The modules, the model; the steps; the saved parameters and the sample. */
static int rank_run(tr_env *e, tr_comp **c)
{
    const dl_train_opts *o = e->o;
    int rc;
    dl_comm_set_algo(e->mesh->dp_comm, o->comm.algo);
    dl_comm_set_algo(e->mesh->tp_comm, o->comm.algo);
    dl_comm_set_algo(e->mesh->pp_comm, o->comm.algo);
    dl_gpt_opts go = {.cfg = o->model,
                      .dtype = o->precision.dtype,
                      .micro_batch = o->batch.micro,
                      .tp = o->layout.tp,
                      .tp_comm = o->layout.tp > 1 ? e->mesh->tp_comm : NULL,
                      .recompute = o->precision.recompute,
                      .seed = o->optim.seed,
                      .arena = dl_ctx_arena(e->ctx),
                      .act_slots = 1};
    if ((rc = tr_compose(e, c)) || (rc = tr_model_opts(*c, &go)) ||
        (rc = dl_gpt_create(&go, &e->g)))
        return rc;
    e->numel = dl_gpt_numel(e->g);
    if ((rc = tr_setup(*c)) || (rc = tr_ckpt_restore(e, *c)) ||
        (rc = o->eval.only ? eval_only(e) : train_steps(e, *c)) || (rc = tr_save_params(e)))
        return rc;
    return o->output.sample > 0 ? tr_sample_text(e) : DL_OK;
}

static int train_rank(dl_ctx *ctx, void *arg)
{
    tr_run *R = arg;
    dl_mesh mesh = {0};
    tr_env E = {.o = R->o,
                .R = R,
                .data = R->data,
                .res = R->res,
                .pp = &R->pp,
                .ctx = ctx,
                .rank = dl_ctx_rank(ctx),
                .mesh = &mesh,
                .head = 1};
    tr_prec_init(&E.pr, R->o->precision.dtype);
    tr_comp *c = NULL;
    dl_comm *world = dl_ctx_comm(ctx);
    dl_comm_set_algo(world, R->o->comm.algo);
    int ep = R->o->layout.ep > 1 ? R->o->layout.ep : 1;
    int rc = dl_mesh_create(world, R->o->layout.dp, R->o->layout.pp, R->o->layout.tp, ep, &mesh);
    if (rc)
        return rc;
    rc = rank_run(&E, &c);
    if (rc == DL_OK) {
        /* measured before the model is freed: what this rank held at its peak */
        dl_arena_stats as;
        dl_arena_get_stats(dl_ctx_arena(ctx), &as);
        for (int k = 0; k < DL_MEM_NCATEGORIES; k++)
            R->res->memory.peak[(size_t)E.rank * DL_MEM_NCATEGORIES + k] = as.peak[k];
        if (dl_mpi_size() > 1)
            rc = tr_share_rank_stats(R, E.rank, world, as.peak);
    }
    tr_teardown(c);
    dl_gpt_destroy(E.g);
    if (rc == DL_OK)
        return dl_mesh_destroy(&mesh);
    /* abort the world first (the peers may wait for this rank in a collective), then free the
     * communicators (their barriers return at once), keeping this rank's message */
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", dl_errmsg());
    dl_comm_fail(world);
    dl_mesh_destroy(&mesh);
    dl_error(rc, "%s", msg);
    return rc;
}

int dl_train_run(const dl_train_opts *oin, dl_train_result *res)
{
    memset(res, 0, sizeof *res);
    dl_train_opts o = *oin;
    int n = o.layout.dp * o.layout.tp * (o.layout.pp > 1 ? o.layout.pp : 1);
    int rc = dl_train_resolve(&o, n);
    if (rc)
        return rc;
    tr_run R;
    if ((rc = tr_run_open(&R, &o, res, n)) || (rc = tr_ckpt_prepare(&R)))
        goto done;
    dl_world_opts w;
    dl_world_opts_init(&w);
    w.nranks = n;
    w.gpu_mem = o.machine.gpu_mem;
    w.timeout_s = o.machine.timeout_s;
    w.topology = o.machine.topology;
    if (!o.eval.only)
        R.gemm = calloc(1, sizeof *R.gemm);
    dl__fault f;
    if (o.machine.inject_fault && dl__fault_parse(o.machine.inject_fault, &f) == DL_OK)
        dl__fault_install(&f);
    rc = dl_world_run(&w, train_rank, &R);
    dl__fault_install(NULL);
    /* GEMM utilisation's reference: the step's own GEMMs replayed alone on one thread */
    if (R.gemm && R.gemm->n > 0)
        res->speed.gemm_gflops = dl_ops_gemm_replay(R.gemm, o.precision.dtype == DL_F64 ? 8 : 4, 5);
    free(R.gemm);
    tr_summarise(&R, res);
    /* the records still owed to on_step (the last ones, or all of them under MPI) */
    int erc = tr_emit_steps(&R, 1);
    if (erc && rc == DL_OK)
        rc = erc;
    if (R.steps_done > 0)
        tr_finish_trace(&R,
                        o.trace.last && o.trace.last < R.steps_done ? o.trace.last : R.steps_done);
    if (R.trace_rc && rc == DL_OK)
        rc = R.trace_rc;
done:
    tr_run_close(&R);
    return rc;
}

void dl_train_result_free(dl_train_result *r)
{
    tr_pipe_result_free(&r->pipeline);
    free(r->output.timeline);
    free(r->steps);
    free(r->ckpt.save);
    free(r->memory.peak);
    free(r->output.params);
    free(r->output.grads);
    free(r->output.sample);
    dl_train_moe_result *m = &r->moe;
    free(m->layer), free(m->routed), free(m->dropped), free(m->aux), free(m->z), free(m->hash);
    free(m->a2a_bytes), free(m->combine_wait_ms);
    memset(r, 0, sizeof *r);
}
