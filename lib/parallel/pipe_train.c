/* The pipeline adapter (parallel/module.h): the GPT stage under the engine (include/distlab/pipe.h)
 * as the step's runner. The engine runs this stage's actions of the schedule; the forward and
 * backward callbacks map micro-batches to activation slots, keep weight versions (and, with
 * weight stashing, the parameters each forward used) and accumulate the last stage's loss.
 * Flush schedules reduce the gradients after the engine (stage by stage, not overlapped with the
 * backward); async (PipeDream) updates the stage after every micro-batch, inside the engine, and
 * runs as one continuous pipeline across steps: each step the engine runs that step's slice of
 * the window's schedule (dl_sched_async_step), left open until the window's quiet point. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "parallel/pipe_train.h"
#include "parallel/module.h"
#include "parallel/pipe_tera.h"
#include "model/gpt_priv.h"

typedef struct pipe_state {
    tr_env *e;
    dl_pipe *eng;
    dl_sched *sched;
    dl_gpt_part part;
    int p, v, stage;
    int embed_rank, head_rank; /* the stages holding virtual stage 0 and the last (ZB-V: both 0) */
    int nslots, *slot_of, *free_slot, nfree;
    int *pin, *ptg; /* a micro-batch's tokens */
    double loss_sum;
    int version, max_gap, *fwd_version;
    int mbmod; /* micro-batch index modulus of slot_of, fwd_version (the window numbers them on) */
    int cont;  /* the continuous async pipeline */
    int win_first, win_end; /* its window (1-based steps, inclusive) */
    uint64_t prev_end;      /* the end of this stage's previous step (continuous: the spans) */
    char *stash;            /* weight stashing: one parameter copy per slot */
    void *tie_buf;          /* tied embeddings: the other end's wte gradient */
    tr_tera tera;           /* token slices (--token-chunks): micro-batch index = unit */
} pipe_state;

/* The index of (micro-batch, chunk) in slot_of and fwd_version */
static int mb_at(const pipe_state *s, int mb, int ch) { return (mb % s->mbmod) * s->v + ch; }

static int pp_take_slot(pipe_state *s, int mb, int ch, int *slot)
{
    int *so = &s->slot_of[mb_at(s, mb, ch)];
    if (*so < 0) {
        if (s->nfree == 0)
            return dl_error(DL_EINVAL,
                            "pipeline: no free activation slot for micro-batch %d "
                            "(the schedule holds at most %d)",
                            mb, s->nslots);
        *so = s->free_slot[--s->nfree];
    }
    *slot = *so;
    return DL_OK;
}

static void *pp_fwd_in(void *arg, int mb, int ch)
{
    pipe_state *s = arg;
    int slot = 0;
    if (pp_take_slot(s, mb, ch, &slot))
        return NULL;
    return dl_gpt_stage_input(s->e->g, slot, ch);
}

static int pp_fwd(void *arg, int mb, int ch, const void **out)
{
    pipe_state *s = arg;
    const dl_train_opts *o = s->e->o;
    int slot = 0, rc = pp_take_slot(s, mb, ch, &slot);
    if (rc)
        return rc;
    int vs = s->sched->vstage[s->stage * s->v + ch];
    int first = vs == 0, last = vs == s->p * s->v - 1;
    int G = o->batch.global, mbs = o->batch.micro, m = o->batch.microbatches;
    /* the continuous window numbers its micro-batches on from its first step */
    long dstep = s->cont ? s->win_first - 1 + mb / m : s->e->step - 1;
    int c = s->tera.c; /* token slices: unit mb is slice mb % c of micro-batch mb / c */
    if ((first || last) &&
        (rc = dl_data_batch(s->e->data, dstep, G, o->layout.dp, s->e->mesh->dp_rank,
                            s->cont ? mb % m : mb / c, mbs, s->pin, s->ptg)))
        return rc;
    const int *in = first ? s->pin : NULL, *tg = last ? s->ptg : NULL;
    if (c > 1 && (rc = tr_tera_forward(&s->tera, s->e->g, slot, mb, mbs, &in, &tg)))
        return rc;
    if (s->stash)
        memcpy(s->stash + (size_t)slot * s->e->numel * s->e->pr.dsize, dl_gpt_params(s->e->g),
               s->e->numel * s->e->pr.dsize);
    s->fwd_version[mb_at(s, mb, ch)] = s->version;
    double loss = 0;
    if ((rc = dl_gpt_stage_forward(s->e->g, slot, ch, in, tg, mbs, &loss)))
        return rc;
    if (last) /* a slice's mean over its positions weighs l / T of its sequences' */
        s->loss_sum += loss * mbs / G * tr_tera_weight(&s->tera, mb);
    *out = last ? NULL : dl_gpt_stage_output(s->e->g, slot, ch);
    return DL_OK;
}

static void *pp_bwd_in(void *arg, int mb, int ch)
{
    (void)mb, (void)ch;
    return dl_gpt_stage_grad(((pipe_state *)arg)->e->g);
}

/* B(mb, ch), or its input part I (split): the slot is released after B, or after W */
static int pp_bwd_part(void *arg, int mb, int ch, const void **din, int split)
{
    pipe_state *s = arg;
    const dl_train_opts *o = s->e->o;
    int *so = &s->slot_of[mb_at(s, mb, ch)], slot = *so, rc;
    if (slot < 0)
        return dl_error(DL_EINVAL, "pipeline: backward of micro-batch %d without its forward", mb);
    /* flush: the mean over the global batch; async: each update applies one micro-batch (over
     * the dp group), so its mean */
    double T = o->model.seq;
    double dloss = s->sched->flush ? 1.0 / ((double)o->batch.global * T)
                                   : 1.0 / ((double)o->batch.micro * o->layout.dp * T);
    int fv = s->fwd_version[mb_at(s, mb, ch)];
    int used = s->stash ? fv : s->version; /* the weight version this backward computes with */
    if (used - fv > s->max_gap)
        s->max_gap = used - fv;
    void *prev =
        s->stash
            ? dl_gpt_use_params(s->e->g, s->stash + (size_t)slot * s->e->numel * s->e->pr.dsize)
            : NULL;
    rc = split ? dl_gpt_stage_backward_input(s->e->g, slot, ch, dloss)
               : dl_gpt_stage_backward(s->e->g, slot, ch, dloss, NULL, NULL);
    if (s->stash)
        dl_gpt_use_params(s->e->g, prev);
    if (!split) {
        *so = -1;
        s->free_slot[s->nfree++] = slot;
        tr_tera_backward_done(&s->tera, mb);
    }
    if (rc)
        return rc;
    *din = s->sched->vstage[s->stage * s->v + ch] == 0 ? NULL : dl_gpt_stage_grad(s->e->g);
    return DL_OK;
}

static int pp_bwd(void *arg, int mb, int ch, const void **din)
{
    return pp_bwd_part(arg, mb, ch, din, 0);
}
static int pp_bwd_input(void *arg, int mb, int ch, const void **din)
{
    return pp_bwd_part(arg, mb, ch, din, 1);
}

/* W(mb, ch): the weight gradients (they read no parameter: no stashed copy needed), then the
 * slot's activations are spent */
static int pp_bwd_weight(void *arg, int mb, int ch)
{
    pipe_state *s = arg;
    int *so = &s->slot_of[mb_at(s, mb, ch)], slot = *so;
    if (slot < 0)
        return dl_error(DL_EINVAL,
                        "pipeline: weight gradient of micro-batch %d without its "
                        "forward",
                        mb);
    int rc = dl_gpt_stage_backward_weight(s->e->g, slot, ch, NULL, NULL);
    *so = -1;
    s->free_slot[s->nfree++] = slot;
    return rc;
}

static int pp_opt(void *arg, int mb)
{
    pipe_state *s = arg;
    const dl_train_opts *o = s->e->o;
    (void)mb;
    if (s->sched->flush)
        return DL_OK;
    int rc = DL_OK;
    if (o->layout.dp > 1)
        rc = dl_allreduce(s->e->mesh->dp_comm, dl_gpt_grads(s->e->g), dl_gpt_grads(s->e->g),
                          s->e->numel, s->e->pr.dt, DL_SUM, DL_PURPOSE_GRADS);
    if (rc == DL_OK)
        rc = s->e->call.norm_update(s->e->comp);
    if (rc)
        return rc;
    dl_gpt_zero_grads(s->e->g);
    s->version++;
    return rc;
}

static const dl_pipe_ops pp_ops = {pp_fwd_in, pp_fwd, pp_bwd_in, pp_bwd, pp_opt};
static const dl_pipe_split_ops pp_split_ops = {pp_bwd_input, pp_bwd_weight};

/* Layers to virtual stages: evenly, or by the given per-layer costs (the lecture's dynamic
 * program, which minimises the slowest stage). */
static int pp_bounds(const dl_train_opts *o, int k, int *bounds)
{
    int L = o->model.layers;
    double *c = malloc(sizeof(double) * (size_t)L);
    if (!c)
        return dl_error(DL_ENOMEM, "pipeline: out of memory");
    for (int i = 0; i < L; i++) c[i] = o->pipeline.layer_costs ? o->pipeline.layer_costs[i] : 1.0;
    int rc = dl_sched_partition(c, L, k, o->pipeline.layer_costs != NULL, bounds, NULL, NULL);
    free(c);
    return rc;
}

static int mk_gpipe(const dl_train_opts *o, dl_sched **out)
{
    return dl_sched_gpipe(o->layout.pp, o->batch.microbatches, out);
}
static int mk_1f1b(const dl_train_opts *o, dl_sched **out)
{
    return dl_sched_1f1b(o->layout.pp, o->batch.microbatches, out);
}
static int mk_interleaved(const dl_train_opts *o, dl_sched **out)
{
    return dl_sched_interleaved(o->layout.pp, o->batch.microbatches, o->pipeline.virtual_stages,
                                out);
}
static int mk_async(const dl_train_opts *o, dl_sched **out)
{
    return dl_sched_async(o->layout.pp, o->batch.microbatches, o->pipeline.weight_stashing, out);
}
static int mk_naive(const dl_train_opts *o, dl_sched **out)
{
    return dl_sched_naive(o->layout.pp, out);
}
static int mk_1f1b_split(const dl_train_opts *o, dl_sched **out)
{
    return dl_sched_1f1b_split(o->layout.pp, o->batch.microbatches, out);
}
static int mk_zb_h1(const dl_train_opts *o, dl_sched **out)
{
    return dl_sched_zb_h1(o->layout.pp, o->batch.microbatches, out);
}
static int mk_zb_h2(const dl_train_opts *o, dl_sched **out)
{
    return dl_sched_zb_h2(o->layout.pp, o->batch.microbatches, out);
}
static int mk_zb_v(const dl_train_opts *o, dl_sched **out)
{
    return dl_sched_zb_v(o->layout.pp, o->batch.microbatches, out);
}
static int mk_dualpipev(const dl_train_opts *o, dl_sched **out)
{
    return dl_sched_dualpipev(o->layout.pp, o->batch.microbatches, out);
}

/* The schedules the trainer runs, in --help's order (GPipe the default): the one list. */
static const struct {
    dl_sched_kind kind;
    int (*make)(const dl_train_opts *o, dl_sched **out);
} schedules[] = {{DL_SCHED_GPIPE, mk_gpipe},
                 {DL_SCHED_1F1B, mk_1f1b},
                 {DL_SCHED_INTERLEAVED, mk_interleaved},
                 {DL_SCHED_ASYNC, mk_async},
                 {DL_SCHED_NAIVE, mk_naive},
                 {DL_SCHED_1F1B_SPLIT, mk_1f1b_split},
                 {DL_SCHED_ZB_H1, mk_zb_h1},
                 {DL_SCHED_ZB_H2, mk_zb_h2},
                 {DL_SCHED_ZB_V, mk_zb_v},
                 {DL_SCHED_DUALPIPEV, mk_dualpipev}};
enum { NSCHEDULES = sizeof schedules / sizeof schedules[0] };

int tr_pipe_trains(int k)
{
    for (int i = 0; i < NSCHEDULES; i++)
        if ((int)schedules[i].kind == k)
            return 1;
    return 0;
}

void tr_pipe_kind_list(char *buf, size_t n)
{
    size_t at = 0;
    for (int i = 0; i < NSCHEDULES && at < n; i++) {
        const char *sep = i == 0 ? "" : i == NSCHEDULES - 1 ? " or " : ", ";
        int w = snprintf(buf + at, n - at, "%s%s", sep, dl_sched_kind_name(schedules[i].kind));
        at += w > 0 ? (size_t)w : 0;
    }
}

int tr_pipe_make_sched(const dl_train_opts *o, dl_sched **out)
{
    if (o->pipeline.schedule_file)
        return dl_sched_load_csv(o->pipeline.schedule_file, o->pipeline.schedule_letters,
                                 o->pipeline.schedule_mem_limit, out, NULL, 0);
    int c = o->pipeline.token_chunks, p = o->layout.pp, m = o->batch.microbatches;
    if (c > 1) /* token slices: tr_tera_resolve allows these two orders */
        return o->pipeline.schedule == DL_SCHED_1F1B ? dl_sched_1f1b_tokens(p, m, c, out)
                                                     : dl_sched_terapipe(p, m, c, out);
    for (int i = 0; i < NSCHEDULES; i++)
        if ((int)schedules[i].kind == o->pipeline.schedule)
            return schedules[i].make(o, out);
    return dl_error(DL_EINVAL, "pipeline: schedule %s does not train",
                    dl_sched_kind_name((dl_sched_kind)o->pipeline.schedule));
}

/* A split backward with full recomputation is refused by name (the model would recompute each
 * layer for W again). */
static int refuse_recompute(const char *what)
{
    return dl_error(DL_EINVAL,
                    "--recompute full does not combine with %s: its deferred weight gradient "
                    "would recompute each layer again (use --recompute none)",
                    what);
}

/* A mixture of experts runs one model chunk a stage with a flush (the model's MoE layers keep
 * one set of measurements a chunk; the async schedule's per-micro-batch updates would reduce the
 * expert gradients once a micro-batch). */
static int refuse_moe(const char *what)
{
    return dl_error(DL_EINVAL,
                    "a mixture of experts with %s is not supported (several chunks a stage, or no "
                    "flush): use gpipe, 1f1b or another schedule of one chunk a stage",
                    what);
}

/* --schedule-file: the file's schedule decides p, m and v (checked against the options). */
static int resolve_file(dl_train_opts *o)
{
    dl_sched *s = NULL;
    int p = o->layout.pp, rc = tr_pipe_make_sched(o, &s);
    if (rc)
        return rc;
    if (s->p != p)
        rc = dl_error(DL_EINVAL, "schedule file %s has %d rows (ranks) for pp %d",
                      o->pipeline.schedule_file, s->p, p);
    else if (s->m != o->batch.microbatches)
        rc = dl_error(DL_EINVAL,
                      "schedule file %s runs %d micro-batches: use --microbatches %d (got %d)",
                      o->pipeline.schedule_file, s->m, s->m, o->batch.microbatches);
    else if (s->v > DL_GPT_MAX_CHUNKS || p * s->v > o->model.layers)
        rc = dl_error(DL_EINVAL,
                      "schedule file %s: %d stages need at least as many layers (got %d; at "
                      "most %d chunks a rank)",
                      o->pipeline.schedule_file, p * s->v, o->model.layers, DL_GPT_MAX_CHUNKS);
    else if (dl_sched_splits(s, -1) && o->precision.recompute == DL_RECOMPUTE_FULL)
        rc = refuse_recompute("a schedule file with split backwards (I, W)");
    else if (o->model.tie && o->zero.stage)
        rc = dl_error(DL_EINVAL, "tied embeddings with pp > 1 and ZeRO are not supported yet");
    o->pipeline.schedule = DL_SCHED_CUSTOM;
    o->pipeline.virtual_stages = s->v;
    if (rc == DL_OK && o->model.experts > 0 && s->v > 1 && o->layout.pp > 1)
        rc = refuse_moe("a schedule file of several chunks a stage");
    dl_sched_free(s);
    return rc;
}

/* The pipeline's part of the configuration, after the batch sizes are known (modules.def:
 * dl_train_resolve calls it). */
int tr_pipe_resolve(dl_train_opts *o)
{
    int p = o->layout.pp, L = o->model.layers, m = o->batch.microbatches;
    int rc = tr_tera_resolve(o);
    if (rc)
        return rc;
    if (o->pipeline.schedule_file)
        return resolve_file(o);
    if (o->pipeline.schedule == DL_SCHED_CUSTOM)
        o->pipeline.schedule = DL_SCHED_GPIPE;
    int k = o->pipeline.schedule;
    if (!tr_pipe_trains(k)) {
        char list[128];
        tr_pipe_kind_list(list, sizeof list);
        return dl_error(DL_EINVAL, "schedule %s cannot train: use %s",
                        dl_sched_kind_name((dl_sched_kind)k), list);
    }
    if (k == DL_SCHED_NAIVE && m != 1)
        return dl_error(DL_EINVAL, "the naive schedule runs one micro-batch (got %d)", m);
    int zbv = k == DL_SCHED_ZB_V || k == DL_SCHED_DUALPIPEV; /* the V: two chunks a stage */
    const char *kn = dl_sched_kind_name((dl_sched_kind)k);
    if (k != DL_SCHED_INTERLEAVED && o->pipeline.virtual_stages > 1 + zbv)
        return dl_error(DL_EINVAL, "--virtual-stages %d needs --schedule interleaved%s%s%s",
                        o->pipeline.virtual_stages, zbv ? " (" : "", zbv ? kn : "",
                        zbv ? " holds 2 chunks a stage)" : "");
    int v = k == DL_SCHED_INTERLEAVED
                ? (o->pipeline.virtual_stages > 0 ? o->pipeline.virtual_stages : 2)
                : 1 + zbv;
    o->pipeline.virtual_stages = v;
    if (p > L)
        return dl_error(DL_EINVAL, "pp %d is larger than the layers %d: every stage needs a layer",
                        p, L);
    if (zbv && p > 1 && 2 * p > L)
        return dl_error(DL_EINVAL,
                        "%s holds two chunks a stage: pp %d needs at least %d layers (got %d)", kn,
                        p, 2 * p, L);
    if (zbv && p < 2)
        return dl_error(DL_EINVAL, "the %s schedule needs pp >= 2 (its V spans two stages)", kn);
    if (k == DL_SCHED_DUALPIPEV && m < 2 * p)
        return dl_error(DL_EINVAL,
                        "the dualpipev schedule needs micro-batches >= 2 pp (pp %d: at least %d, "
                        "got %d)",
                        p, 2 * p, m);
    int split = k >= DL_SCHED_1F1B_SPLIT && k <= DL_SCHED_DUALPIPEV;
    if (split && p > 1 && o->precision.recompute == DL_RECOMPUTE_FULL) {
        char what[64];
        snprintf(what, sizeof what, "--schedule %s", dl_sched_kind_name((dl_sched_kind)k));
        return refuse_recompute(what);
    }
    if (v > DL_GPT_MAX_CHUNKS)
        return dl_error(DL_EINVAL, "at most %d virtual stages (got %d)", DL_GPT_MAX_CHUNKS, v);
    if (k == DL_SCHED_INTERLEAVED) {
        if (p < 2)
            return dl_error(DL_EINVAL, "the interleaved schedule needs pp >= 2");
        if (L % (p * v))
            return dl_error(DL_EINVAL,
                            "interleaving: layers %d are not divisible by pp %d x "
                            "virtual stages %d",
                            L, p, v);
        if (m % p)
            return dl_error(DL_EINVAL,
                            "interleaving: micro-batches %d must be a multiple of pp "
                            "%d (try --microbatches %d)",
                            m, p, (m / p + 1) * p);
    }
    if (o->pipeline.weight_stashing && k != DL_SCHED_ASYNC)
        return dl_error(DL_EINVAL, "--weight-stashing needs --schedule async");
    if (p == 1)
        return DL_OK;
    if (o->model.experts > 0 && (v > 1 || k == DL_SCHED_ASYNC)) {
        char what[64];
        snprintf(what, sizeof what, "--schedule %s", kn);
        return refuse_moe(what);
    }
    if (k == DL_SCHED_ASYNC && (o->zero.stage || o->model.tie))
        return dl_error(DL_EINVAL, "the async schedule updates each stage on its own: it does "
                                   "not combine with ZeRO or tied embeddings");
    if (o->model.tie && o->zero.stage)
        return dl_error(DL_EINVAL, "tied embeddings with pp > 1 and ZeRO are not supported yet");
    return DL_OK;
}

/* The stage's part, its slots and the engine (after the mesh exists, before the model). */
static int pp_setup(pipe_state *s, dl_gpt_part *part)
{
    const dl_train_opts *o = s->e->o;
    s->p = o->layout.pp;
    s->v = o->pipeline.virtual_stages;
    s->stage = s->e->mesh->pp_rank;
    int rc = tr_pipe_make_sched(o, &s->sched);
    if (rc)
        return rc;
    dl_sched_sim *sim;
    if ((rc = dl_sched_simulate(s->sched, NULL, &sim)))
        return rc;
    s->nslots = sim->peak_act[s->stage];
    dl_sched_sim_free(sim);
    /* continuous: stage s holds p - s micro-batches in flight whatever m (1F1B's steady state) */
    s->cont = s->sched->kind == DL_SCHED_ASYNC && !o->pipeline.schedule_file;
    if (s->cont && s->nslots < s->p - s->stage)
        s->nslots = s->p - s->stage;
    int k = s->p * s->v, bounds[DL_GPT_MAX_CHUNKS * 64 + 1];
    if (k > (int)(sizeof bounds / sizeof bounds[0]) - 1)
        return dl_error(DL_EINVAL, "pipeline: too many virtual stages (%d)", k);
    if ((rc = pp_bounds(o, k, bounds)) ||
        (rc = dl_gpt_part_stage(&o->model, s->p, s->v, s->stage, bounds, part)))
        return rc;
    /* the part by the schedule's placement (the model's chunks are a stage's virtual stages in
     * pipeline order, which the validator guarantees) */
    for (int c = 0; c < s->v; c++) {
        int g = s->sched->vstage[s->stage * s->v + c];
        part->first[c] = bounds[g];
        part->count[c] = bounds[g + 1] - bounds[g];
    }
    int ch;
    if ((rc = dl_sched_holder(s->sched, 0, &s->embed_rank, &ch)) ||
        (rc = dl_sched_holder(s->sched, k - 1, &s->head_rank, &ch)))
        return rc;
    part->embed = s->stage == s->embed_rank;
    part->head = s->stage == s->head_rank;
    if (dl_ctx_rank(s->e->ctx) == 0 && s->e->res->pipeline.bounds)
        memcpy(s->e->res->pipeline.bounds, bounds, sizeof(int) * (size_t)(k + 1));
    int m = s->sched->m, T = o->model.seq; /* m: the schedule's units (token slices) */
    if ((rc = tr_tera_open(&s->tera, o, s->sched, s->stage)))
        return rc;
    s->mbmod = s->cont && m < s->p ? s->p : m; /* more than the micro-batches in flight */
    s->slot_of = malloc(sizeof(int) * (size_t)s->mbmod * s->v);
    s->fwd_version = calloc((size_t)s->mbmod * s->v, sizeof(int));
    s->free_slot = malloc(sizeof(int) * (size_t)s->nslots);
    s->pin = malloc(sizeof(int) * (size_t)o->batch.micro * T);
    s->ptg = malloc(sizeof(int) * (size_t)o->batch.micro * T);
    if (!s->slot_of || !s->fwd_version || !s->free_slot || !s->pin || !s->ptg)
        return dl_error(DL_ENOMEM, "pipeline: out of memory");
    for (int i = 0; i < s->mbmod * s->v; i++) s->slot_of[i] = -1;
    for (int i = 0; i < s->nslots; i++) s->free_slot[i] = s->nslots - 1 - i;
    s->nfree = s->nslots;
    rc = dl_pipe_create(s->e->mesh->pp_comm, (size_t)o->batch.micro * s->tera.L * o->model.d_model,
                        s->e->pr.ct, dl_ctx_arena(s->e->ctx), &s->eng);
    if (rc == DL_OK)
        dl_pipe_set_split(s->eng, &pp_split_ops);
    return rc;
}

static void pp_teardown(void *st)
{
    pipe_state *s = st;
    dl_pipe_destroy(s->eng);
    dl_sched_free(s->sched);
    free(s->slot_of), free(s->fwd_version), free(s->free_slot), free(s->pin), free(s->ptg);
    tr_tera_close(&s->tera);
    if (s->stash)
        dl_arena_free(dl_ctx_arena(s->e->ctx), s->stash);
    if (s->tie_buf)
        dl_arena_free(dl_ctx_arena(s->e->ctx), s->tie_buf);
    free(s);
}

/* Tied embeddings across stages: the first stage's wte and the last stage's copy receive the
 * sum of both gradients (a + b on one side, b + a on the other: the same bits), as Megatron's
 * embedding group all-reduce does. */
static int pp_tie_sync(pipe_state *s)
{
    const dl_gpt_layout *l = dl_gpt_get_layout(s->e->g);
    int er = s->embed_rank, hr = s->head_rank;
    if (!s->e->o->model.tie || er == hr || (s->stage != er && s->stage != hr))
        return DL_OK;
    const dl_tensor_info *t = &l->t[s->stage == er ? 0 : l->ntensors - 1];
    int peer = s->stage == er ? hr : er, rc;
    char *g = (char *)dl_gpt_grads(s->e->g) + t->offset * (size_t)s->e->pr.dsize;
    dl_request *send;
    if ((rc = dl_isend(s->e->mesh->pp_comm, g, t->numel, s->e->pr.dt, peer, 77, DL_PURPOSE_GRADS,
                       &send)))
        return rc;
    rc = dl_recv_tag(s->e->mesh->pp_comm, s->tie_buf, t->numel, s->e->pr.dt, peer, 77,
                     DL_PURPOSE_GRADS);
    int rc2 = dl_wait(send); /* freed either way; the first error is the one reported */
    if (rc || (rc = rc2))
        return rc;
    s->e->pr.acc(g, s->tie_buf, t->numel);
    return DL_OK;
}

/* A forward through every stage without the engine (evaluation, sampling): each virtual stage
 * in turn receives, computes, sends on; the loss (and the head's probabilities) end on the last
 * stage. One slice of B x L positions (L: the sequence, or a token slice's length). */
static int pp_forward_slice(pipe_state *s, const int *in, const int *tg, int B, int L, double *l)
{
    size_t n = (size_t)B * L * s->e->o->model.d_model;
    int rc = DL_OK;
    dl_comm *pp = s->e->mesh->pp_comm;
    for (int ch = 0; ch < s->v && rc == DL_OK; ch++) {
        int prev, pc, next, nc;
        dl_sched_peers(s->sched, s->stage, ch, &prev, &pc, &next, &nc);
        /* a hand-off to this stage's own next chunk (ZB-V's turn) is the copy below */
        if (prev >= 0 && prev != s->stage &&
            (rc = dl_recv(pp, dl_gpt_stage_input(s->e->g, 0, ch), n, s->e->pr.ct, prev,
                          DL_PURPOSE_ACTIVATIONS)))
            break;
        if ((rc = dl_gpt_stage_forward(s->e->g, 0, ch, in, tg, B, l)))
            break;
        if (next == s->stage)
            memcpy(dl_gpt_stage_input(s->e->g, 0, nc), dl_gpt_stage_output(s->e->g, 0, ch),
                   n * dl_dtype_size(s->e->pr.ct));
        else if (next >= 0)
            rc = dl_send(pp, dl_gpt_stage_output(s->e->g, 0, ch), n, s->e->pr.ct, next,
                         DL_PURPOSE_ACTIVATIONS);
    }
    return rc;
}

/* The whole forward: with token slices, slice after slice through cache 0 (no step is in
 * flight), each slice's loss weighing l / T; the loss is then broadcast over the pipeline. */
static int pp_forward(void *arg, const int *in, const int *tg, int B, double *loss)
{
    pipe_state *s = arg;
    tr_tera *t = &s->tera;
    double l = 0, sum = 0;
    int rc = DL_OK;
    for (int k = 0; k < t->c && rc == DL_OK; k++) {
        const int *si = in, *st = tg;
        if (t->c > 1) {
            if (in)
                tr_tera_columns(t, in, B, k, t->in), si = t->in;
            if (tg)
                tr_tera_columns(t, tg, B, k, t->tg), st = t->tg;
            rc = tr_tera_place(t, s->e->g, 0, 0, k);
        }
        int L = t->c > 1 ? t->len[k] : t->L;
        if (rc == DL_OK && (rc = pp_forward_slice(s, si, st, B, L, &l)) == DL_OK)
            sum += l * tr_tera_weight(t, k);
    }
    if (rc == DL_OK)
        rc =
            dl_broadcast(s->e->mesh->pp_comm, &sum, &sum, 1, DL_F64, s->head_rank, DL_PURPOSE_LOSS);
    if (loss)
        *loss = sum;
    return rc;
}

/* Before the model: this stage's part and slots, the engine. */
static int pp_model_opts(void *st, dl_gpt_opts *go)
{
    pipe_state *s = st;
    int rc = pp_setup(s, &s->part);
    go->part = &s->part;
    go->act_slots = s->nslots;
    if (rc == DL_OK && s->tera.c > 1) {
        go->token_slice = s->tera.L;
        go->kv_seqs = s->tera.ncache;
    }
    go->defer_w = rc == DL_OK && dl_sched_splits(s->sched, s->stage);
    if (rc == DL_OK) {
        s->e->self_update = !s->sched->flush;
        s->e->head = s->stage == s->head_rank;
    }
    return rc;
}

/* After the model: weight stashing's copies, tied embeddings' receive buffer. */
static int pp_alloc(void *st)
{
    pipe_state *s = st;
    const dl_train_opts *o = s->e->o;
    dl_arena *a = dl_ctx_arena(s->e->ctx);
    size_t ds = (size_t)s->e->pr.dsize;
    int rc = DL_OK;
    if (o->pipeline.weight_stashing &&
        (rc = dl_arena_alloc(a, DL_MEM_PARAMS, (size_t)s->nslots * s->e->numel * ds,
                             (void **)&s->stash)))
        return rc;
    if (o->model.tie && s->embed_rank != s->head_rank &&
        (s->stage == s->embed_rank || s->stage == s->head_rank))
        rc = dl_arena_alloc(a, DL_MEM_COMM, (size_t)o->model.vocab * o->model.d_model * ds,
                            &s->tie_buf);
    return rc;
}

/* The continuous pipeline's slice for this step (*out, the caller frees it): a new window after
 * a quiet point, cut short after a stop request; the engine stays open unless the window ends
 * here (then it drains: the quiet point). */
static int pp_slice(pipe_state *s, dl_sched **out)
{
    tr_env *e = s->e;
    const dl_train_opts *o = e->o;
    int m = o->batch.microbatches, t = e->step;
    if (t > s->win_end) {
        s->win_first = t;
        s->win_end = tr_async_window_end(o, t);
    } else if (e->stop_soon) {
        s->win_end = tr_async_window_cut(s->p, m, s->win_first, s->win_end, t - 1);
    }
    e->open = t < s->win_end;
    dl_pipe_set_open(s->eng, e->open);
    return dl_sched_async_step(s->p, m, s->win_end - s->win_first + 1, t - s->win_first,
                               o->pipeline.weight_stashing, out);
}

/* The step's forwards and backwards: the engine runs this stage's actions (continuous: the
 * step's slice); its figures go to the run's tables; a flush schedule's gradients are then final
 * (tied wte summed first). */
static int pp_fwd_bwd(void *st, double *loss_sum)
{
    pipe_state *s = st;
    tr_env *e = s->e;
    tr_pp_rows *R = e->pp;
    dl_pipe_stats ps;
    dl_sched *slice = NULL;
    s->loss_sum = 0;
    s->max_gap = 0;
    int rc = s->cont ? pp_slice(s, &slice) : DL_OK;
    uint64_t t0 = dl_now_ns();
    if (rc == DL_OK)
        rc =
            dl_pipe_run(s->eng, slice ? slice : s->sched, &pp_ops, s, e->step, e->tr, e->rank, &ps);
    dl_sched_free(slice);
    if (rc)
        return rc;
    *loss_sum = s->loss_sum;
    /* a continuous step's span starts where this stage's previous step ended (what the trainer
     * did between them counts as waiting) */
    uint64_t from = s->cont && e->step > s->win_first ? s->prev_end : t0;
    s->prev_end = t0 + ps.wall_ns;
    size_t at = (size_t)(e->step - 1) * R->nranks + e->rank;
    /* async updates inside the step: its optimizer steps are work, not waiting */
    R->busy[at] = (double)(ps.busy_ns + (s->sched->flush ? 0 : ps.opt_ns));
    R->wall[at] = (double)(s->prev_end - from);
    R->engine[at] = ps.actions ? (double)ps.engine_ns / ps.actions : 0;
    R->gap[at] = s->max_gap;
    if (e->rank == 0)
        R->bytes += ps.bytes_sent;
    if (rc == DL_OK && s->sched->flush && (rc = pp_tie_sync(s)) == DL_OK)
        rc = e->call.grads_ready(0, e->comp);
    return rc;
}

/* The loss is the last stage's */
static int pp_sum(void *st, double *x)
{
    pipe_state *s = st;
    return dl_allreduce(s->e->mesh->pp_comm, x, x, 1, DL_F64, DL_SUM, DL_PURPOSE_LOSS);
}

/* the loss: continuous, from the head (no collective: the head is a step ahead of stage 0) */
static int pp_loss(void *st, double *x)
{
    pipe_state *s = st;
    return s->cont ? tr_async_loss(s->e->mesh->pp_comm, s->head_rank, x) : pp_sum(st, x);
}

/* the stages hold different tensors (async updates each stage on its own norm) */

static int pp_norm(void *st, double *sq)
{
    pipe_state *s = st;
    return s->sched->flush ? pp_sum(st, sq) : DL_OK;
}

static int pp_from_head(void *st, double *v, int n)
{
    pipe_state *s = st;
    return dl_broadcast(s->e->mesh->pp_comm, v, v, (size_t)n, DL_F64, s->head_rank,
                        DL_PURPOSE_OTHER);
}

/* the weight version (a full-state checkpoint keeps it; checkpoints are quiet points of the
 * continuous pipeline, where no stash is held: every forward's backward ran) */
static void pp_counter(void *st, int64_t *v, int set)
{
    pipe_state *s = st;
    if (set)
        s->version = (int)*v;
    else
        *v = s->version;
}

int tr_pipe_make(tr_env *e, tr_module *m)
{
    if (e->o->layout.pp < 2)
        return DL_OK;
    pipe_state *s = calloc(1, sizeof *s);
    if (!s)
        return dl_error(DL_ENOMEM, "pipeline: out of memory");
    s->e = e;
    *m = (tr_module){.name = "pipeline",
                     .st = s,
                     .model_opts = pp_model_opts,
                     .setup = pp_alloc,
                     .fwd_bwd = pp_fwd_bwd,
                     .forward = pp_forward,
                     .from_head = pp_from_head,
                     .reduce_loss = pp_loss,
                     .reduce_norm = pp_norm,
                     .counter = pp_counter,
                     .teardown = pp_teardown};
    e->head = e->mesh->pp_rank == e->o->layout.pp - 1; /* pp_model_opts corrects it (ZB-V) */
    e->runner_span = 1; /* a pipeline's step span is the engine's (its bubble's window) */
    return DL_OK;
}
