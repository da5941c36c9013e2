#define _GNU_SOURCE
/* The trainer's full state in checkpoints (train/state.h). What a rank holds that the next step
 * reads: its parameters (bf16: the fp32 master weights; the bf16 working copy is their
 * rounding), AdamW's m and v of its shard and the Adam step, the modules' counter (the async
 * pipeline's weight version). What the run derives from the step alone is recorded, not kept:
 * the learning rate (the schedule at the step), the data position (step k reads samples
 * k G .. k G + G - 1) and the random streams, which are all counter-based (the initialisation
 * keyed by (seed, tensor, element), the corpus by its seed, the sampling after training by the
 * seed): no stream advances during training, so its state is its key. */
#include "config.h"
#include <math.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "distlab.h"
#include "core/blas.h"
#include "core/testhook.h"
#include "io/ckdir.h"
#include "model/gpt_priv.h"
#include "train/dump.h"
#include "train/optim.h"
#include "train/run.h"
#include "train/saver.h"
#include "train/state.h"

/* ---- the options a checkpoint records ---- */

typedef struct ck_field {
    const char *opt;         /* the option */
    const char *group, *key; /* where the manifest keeps it */
    size_t off;              /* in dl_train_opts */
    char type;               /* i int, p pipeline stages (0 = 1), d double, u uint64, t dtype,
                              * s string or null */
    int fixed;               /* 1: a difference is refused; 2: follows the layout (the
                              * manifest's value is taken, when omitted, only under its dp) */
} ck_field;

#define F(opt, g, k, m, t, fx)                                                                     \
    {                                                                                              \
        opt, g, k, offsetof(dl_train_opts, m), t, fx                                               \
    }
static const ck_field fields[] = {
    F("--layers", "model", "layers", model.layers, 'i', 1),
    F("--d-model", "model", "d_model", model.d_model, 'i', 1),
    F("--heads", "model", "heads", model.heads, 'i', 1),
    F("--seq", "model", "seq", model.seq, 'i', 1),
    F("vocab", "model", "vocab", model.vocab, 'i', 1),
    F("--tie-embeddings", "model", "tie", model.tie, 'i', 1),
    F("--dtype", "precision", "dtype", precision.dtype, 't', 1),
    F("--dp", "layout", "dp", layout.dp, 'i', 0),
    F("--tp", "layout", "tp", layout.tp, 'i', 0),
    F("--pp", "layout", "pp", layout.pp, 'p', 0),
    F("--zero", "layout", "zero_stage", zero.stage, 'i', 0),
    F("--schedule", "layout", "schedule", pipeline.schedule, 'i', 0),
    F("--virtual-stages", "layout", "virtual_stages", pipeline.virtual_stages, 'i', 0),
    F("--weight-stashing", "layout", "weight_stashing", pipeline.weight_stashing, 'i', 0),
    F("--global-batch", "batch", "global", batch.global, 'i', 1),
    F("--micro-batch", "batch", "micro", batch.micro, 'i', 2),
    F("--microbatches", "batch", "microbatches", batch.microbatches, 'i', 2),
    F("--data", "data", "path", data.path, 's', 1),
    F("--data-seed", "data", "seed", data.seed, 'u', 1),
    F("--seed", "optim", "seed", optim.seed, 'u', 0),
    F("--steps", "optim", "steps", optim.steps, 'i', 0),
    F("--lr", "optim", "lr", optim.lr, 'd', 0),
    F("--min-lr", "optim", "min_lr", optim.min_lr, 'd', 0),
    F("--warmup", "optim", "warmup", optim.warmup, 'i', 0),
    F("beta1", "optim", "beta1", optim.beta1, 'd', 0),
    F("beta2", "optim", "beta2", optim.beta2, 'd', 0),
    F("eps", "optim", "eps", optim.eps, 'd', 0),
    F("--weight-decay", "optim", "weight_decay", optim.weight_decay, 'd', 0),
    F("--clip", "optim", "clip", optim.clip, 'd', 0),
    F("--save-every", "ckpt", "save_every", ckpt.save_every, 'i', 0),
    F("--keep", "ckpt", "keep", ckpt.keep, 'i', 0),
    F("--save-at-end", "ckpt", "save_at_end", ckpt.save_at_end, 'i', 0),
    /* the mixture of experts (a manifest without this group predates it: no experts) */
    F("--experts", "moe", "experts", model.experts, 'i', 1),
    F("--top-k", "moe", "top_k", model.top_k, 'i', 1),
    F("--capacity-factor", "moe", "capacity_factor", model.capacity, 'd', 1),
    F("--moe-every", "moe", "moe_every", model.moe_every, 'i', 1),
    F("--expert-ffn", "moe", "expert_ffn", model.expert_ffn, 'i', 1),
    F("--aux-loss", "moe", "aux_loss", model.aux_loss, 'd', 1),
    F("--z-loss", "moe", "z_loss", model.z_loss, 'd', 1),
    F("--ep", "moe", "ep", layout.ep, 'i', 2),
};
#undef F
#define NFIELDS (sizeof fields / sizeof fields[0])

static const char *const dtype_names[] = {"f32", "f64", "bf16"};

/* a field of o as JSON */
static json_t *field_get(const ck_field *f, const dl_train_opts *o)
{
    const char *p = (const char *)o + f->off;
    switch (f->type) {
    case 'i': return json_integer(*(const int *)p);
    case 'p': return json_integer(*(const int *)p > 1 ? *(const int *)p : 1);
    case 'd': return json_real(*(const double *)p);
    case 'u': return dl__ckd_u64(*(const uint64_t *)p);
    case 't': return json_string(dtype_names[*(const dl_dtype *)p]);
    default: return *(const char *const *)p ? json_string(*(const char *const *)p) : json_null();
    }
}

/* the manifest's value (grp's f->key) into o (-1 when it is not of the field's type) */
static int field_set(const ck_field *f, json_t *grp, dl_train_opts *o)
{
    json_t *v = json_object_get(grp, f->key);
    static char path[4096]; /* the data path outlives the manifest (options are set up once) */
    char *p = (char *)o + f->off;
    uint64_t u;
    switch (f->type) {
    case 'i':
    case 'p':
        if (!json_is_integer(v))
            return -1;
        *(int *)p = (int)json_integer_value(v);
        return 0;
    case 'd':
        if (!json_is_number(v))
            return -1;
        *(double *)p = json_number_value(v);
        return 0;
    case 'u':
        if (dl__ckd_get_u64(grp, f->key, &u))
            return -1;
        *(uint64_t *)p = u;
        return 0;
    case 't':
        for (int k = 0; k < 3; k++)
            if (json_is_string(v) && strcmp(json_string_value(v), dtype_names[k]) == 0) {
                *(dl_dtype *)p = (dl_dtype)k;
                return 0;
            }
        return -1;
    default:
        if (json_is_null(v)) {
            *(const char **)p = NULL;
            return 0;
        }
        if (!json_is_string(v))
            return -1;
        snprintf(path, sizeof path, "%s", json_string_value(v));
        *(const char **)p = path;
        return 0;
    }
}

static void field_text(json_t *v, char *b, size_t n)
{
    char *s = json_dumps(v, JSON_ENCODE_ANY);
    snprintf(b, n, "%s", s ? s : "?");
    free(s);
}

typedef int (*given_fn)(const char *option, void *arg);

static int layout_int(json_t *m, const char *key)
{
    return (int)json_integer_value(json_object_get(json_object_get(m, "layout"), key));
}

/* the manifest's dp is this run's (the batch split follows it) */
static int same_dp(json_t *m, const dl_train_opts *o)
{
    return layout_int(m, "dp") == o->layout.dp;
}

/* Another layout loads any checkpoint (train/state_reshard.c), except to or from the async
 * pipeline: its updates after every micro-batch and its per-stage weight versions belong to its
 * stages and micro-batches, so those must stay (dp, tp and ZeRO may change). */
static int check_reshard(json_t *m, const char *dir, const dl_train_opts *o)
{
    int pp = o->layout.pp > 1 ? o->layout.pp : 1, async_was = 0, async_is = 0;
    if (layout_int(m, "pp") > 1)
        async_was = layout_int(m, "schedule") == DL_SCHED_ASYNC;
    if (pp > 1)
        async_is = o->pipeline.schedule == DL_SCHED_ASYNC;
    if (!async_was && !async_is)
        return DL_OK;
    json_t *b = json_object_get(m, "batch");
    if (async_was && async_is && layout_int(m, "pp") == pp &&
        layout_int(m, "weight_stashing") == o->pipeline.weight_stashing &&
        json_integer_value(json_object_get(b, "microbatches")) == o->batch.microbatches)
        return DL_OK;
    return dl_error(DL_EINVAL,
                    "--resume: the checkpoint %s %s the async pipeline: its per-micro-batch "
                    "updates and per-stage weight versions reshard only to the same --pp, "
                    "--microbatches and --weight-stashing under --schedule async",
                    dir, async_was ? "ran" : "would continue under");
}

/* Apply the manifest's options the command line omitted (given NULL: none) and check the rest. */
static int apply_opts(json_t *m, const char *dir, dl_train_opts *o, given_fn given, void *arg)
{
    for (size_t i = 0; i < NFIELDS; i++) {
        const ck_field *f = &fields[i];
        json_t *grp = json_object_get(m, f->group), *want = json_object_get(grp, f->key);
        json_t *mine = field_get(f, o);
        int same = json_equal(mine, want), omitted = given && !given(f->opt, arg), rc = DL_OK;
        char a[256], b[256];
        field_text(want, a, sizeof a);
        field_text(mine, b, sizeof b);
        if (!want && !strcmp(f->group, "moe") && !o->model.experts)
            same = 1; /* written before the mixture of experts, resumed without one */
        else if (!want)
            rc = dl_error(DL_EINVAL, "--resume: %s/" DL_CKD_MANIFEST ": no %s.%s", dir, f->group,
                          f->key);
        else if (!same && omitted && (f->fixed != 2 || same_dp(m, o)))
            rc = field_set(f, grp, o);
        else if (!same && f->fixed == 1)
            rc = dl_error(DL_EINVAL,
                          "--resume: %s was %s in the checkpoint %s, this run gives %s: the %s "
                          "cannot change on resume",
                          f->opt, a, dir, b, f->group);
        if (rc < 0)
            rc = dl_error(DL_EINVAL, "--resume: %s/" DL_CKD_MANIFEST ": %s.%s is not valid", dir,
                          f->group, f->key);
        json_decref(mine);
        if (rc)
            return rc;
    }
    return check_reshard(m, dir, o);
}

/* steps left to run after the checkpoint's */
static int check_left(json_t *m, const char *dir, const dl_train_opts *o)
{
    json_int_t done = json_integer_value(json_object_get(m, "step"));
    if (done < o->optim.steps)
        return DL_OK;
    return dl_error(DL_EINVAL,
                    "--resume: the checkpoint %s has done %" JSON_INTEGER_FORMAT
                    " steps of --steps %d (the total): nothing is left (a larger --steps trains "
                    "on)",
                    dir, done, o->optim.steps);
}

int dl_train_resume_opts(const char *path, dl_train_opts *o, given_fn given, void *arg)
{
    static char parent[4096]; /* outlives the call, as the options do */
    char dir[4096];
    json_t *m;
    int rc = dl__ckd_find(path, dir, sizeof dir);
    if (rc == DL_OK && (rc = dl__ckd_open(dir, 0, &m)) == DL_OK) {
        rc = apply_opts(m, dir, o, given, arg);
        if (rc == DL_OK)
            rc = check_left(m, dir, o);
        json_decref(m);
    }
    /* the run goes on saving where it saved, unless told otherwise */
    if (rc == DL_OK && given && !given("--ckpt-dir", arg)) {
        snprintf(parent, sizeof parent, "%s", dir);
        char *slash = strrchr(parent, '/');
        if (slash)
            *slash = '\0';
        else
            snprintf(parent, sizeof parent, ".");
        o->ckpt.dir = parent;
    }
    return rc;
}

/* ---- before the ranks, and the stop request ---- */

static atomic_int stop_request;

void dl_train_request_stop(int sig) { atomic_store(&stop_request, sig); }

/* "model name" of /proc/cpuinfo, else the ISA level */
static void cpu_name(char *b, size_t n)
{
    dl_cpu_features f;
    dl_cpu_features_detect(&f);
    snprintf(b, n, "%s", dl_isa_level_name(dl_cpu_isa_level(&f)));
    FILE *c = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (c && fgets(line, sizeof line, c))
        if (strncmp(line, "model name", 10) == 0 && strchr(line, ':')) {
            char *v = strchr(line, ':') + 2;
            v[strcspn(v, "\n")] = '\0';
            snprintf(b + strlen(b), n - strlen(b), ", %s", v);
            break;
        }
    if (c)
        fclose(c);
}

/* the machine the checkpoint ran on against this one: a warning on the log */
static void warn_machine(const tr_run *R)
{
    json_t *mach = json_object_get(R->resume, "machine");
    const char *blas = json_string_value(json_object_get(mach, "blas"));
    const char *cpu = json_string_value(json_object_get(mach, "cpu"));
    char here[512];
    cpu_name(here, sizeof here);
    FILE *log = R->o->output.log;
    if (log && blas && strcmp(blas, dl_blas_loaded_kernel()) != 0)
        fprintf(log,
                "warning: the checkpoint ran on the BLAS kernel %s, this run on %s: the "
                "continued losses may differ in the last bits\n",
                blas, dl_blas_loaded_kernel());
    if (log && cpu && strcmp(cpu, here) != 0)
        fprintf(log, "warning: the checkpoint ran on the CPU '%s', this run on '%s'\n", cpu, here);
}

/* a line on the log when the layout differs from the checkpoint's (ep 0 and 1 alike: none) */
static void log_reshard(json_t *m, const dl_train_opts *o)
{
    int ep = (int)json_integer_value(json_object_get(json_object_get(m, "moe"), "ep"));
    int was[5] = {layout_int(m, "dp"), layout_int(m, "tp"), layout_int(m, "pp"),
                  layout_int(m, "zero_stage"), ep > 1 ? ep : 1};
    int is[5] = {o->layout.dp, o->layout.tp, o->layout.pp > 1 ? o->layout.pp : 1, o->zero.stage,
                 o->layout.ep > 1 ? o->layout.ep : 1};
    if (o->output.log && memcmp(was, is, sizeof was) != 0)
        fprintf(o->output.log,
                "resharding: the checkpoint's dp %d x tp %d x pp %d (ZeRO %d, ep %d) loads into "
                "dp %d x tp %d x pp %d (ZeRO %d, ep %d)\n",
                was[0], was[1], was[2], was[3], was[4], is[0], is[1], is[2], is[3], is[4]);
}

int tr_ckpt_prepare(tr_run *R)
{
    const dl_train_opts *o = R->o;
    if (!o->ckpt.resume || o->eval.only)
        return DL_OK;
    json_t *m;
    int rc = dl__ckd_find(o->ckpt.resume, R->resume_dir, sizeof R->resume_dir);
    if (rc || (rc = dl__ckd_open(R->resume_dir, 1, &m)))
        return rc;
    R->resume = m;
    if ((rc = apply_opts(m, R->resume_dir, (dl_train_opts *)o, NULL, NULL)))
        return rc;
    if ((rc = check_left(m, R->resume_dir, o)))
        return rc;
    log_reshard(m, o);
    R->start = (int)json_integer_value(json_object_get(m, "step"));
    R->skipped0 = (int)json_integer_value(json_object_get(m, "skipped_steps"));
    for (int i = 0; i < R->start; i++) R->loss[i] = R->val[i] = R->norm[i] = R->lr[i] = NAN;
    R->steps_done = R->emitted = R->start;
    R->res->ckpt.resumed_from = R->start;
    warn_machine(R);
    return DL_OK;
}

void tr_ckpt_close(tr_run *R)
{
    json_decref(R->resume);
    R->resume = NULL;
}

/* ---- a rank's pieces ---- */

static json_t *ints(int n, const int64_t *v)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(v[i]));
    return a;
}

/* the global shape and the hyperslabs of tensor t this tp rank holds, in the local order */
static json_t *tensor_piece(const dl_gpt_layout *l, const dl_tensor_info *t)
{
    int nd = t->ndim, r = l->tp_rank;
    json_t *blocks = json_array();
    int64_t start[2] = {0, 0}, count[2] = {t->local[0], t->local[1]};
    if (t->shard == DL_SHARD_QKV) {
        int64_t third = t->shape[0] / 3, per = third / l->tp;
        count[0] = per;
        for (int p = 0; p < 3; p++) {
            start[0] = p * third + r * per;
            json_array_append_new(blocks, json_pack("{s:o, s:o}", "start", ints(nd, start), "count",
                                                    ints(nd, count)));
        }
    } else {
        if (t->shard == DL_SHARD_ROWS)
            start[0] = r * t->local[0];
        if (t->shard == DL_SHARD_COLS)
            start[1] = r * t->local[1];
        json_array_append_new(blocks, json_pack("{s:o, s:o}", "start", ints(nd, start), "count",
                                                ints(nd, count)));
    }
    return json_pack("{s:o, s:o, s:b}", "global_shape", ints(nd, t->shape), "blocks", blocks,
                     "tied_copy", t->id == 0 && !l->part.embed);
}

/* the pipeline part a file's flat buffers follow */
static json_t *part_json(const dl_gpt_layout *l)
{
    json_t *ch = json_array();
    for (int c = 0; c < l->part.nchunks; c++)
        json_array_append_new(ch, json_pack("[i, i]", l->part.first[c], l->part.count[c]));
    return json_pack("{s:i, s:i, s:i, s:i, s:o, s:b, s:b}", "tp", l->tp, "tp_rank", l->tp_rank,
                     "ep", l->ep, "ep_rank", l->ep_rank, "chunks", ch, "embed", l->part.embed,
                     "head", l->part.head);
}

/* AdamW's shard: each unit's block [begin, begin + owned) of the tp rank's flat parameter
 * buffer (the layout's order) at element `at` of the file's tensor, padded to `shard` */
static json_t *flat_piece(const dl_gpt_layout *l, const dl_zero_units *zu)
{
    json_t *units = json_array();
    for (int u = 0; u < zu->n; u++) {
        const dl_zero_unit *b = &zu->u[u];
        json_array_append_new(units,
                              json_pack("{s:I, s:I, s:I, s:I, s:I, s:I}", "lo", (json_int_t)b->lo,
                                        "numel", (json_int_t)b->numel, "begin",
                                        (json_int_t)b->begin, "owned", (json_int_t)b->owned,
                                        "shard", (json_int_t)b->shard, "at", (json_int_t)b->sbase));
    }
    int64_t n = (int64_t)zu->shard;
    return json_pack("{s:o, s:{s:o, s:i, s:i, s:o}}", "global_shape", ints(1, &n), "flat", "part",
                     part_json(l), "dp", zu->dp, "dp_rank", zu->rank, "units", units);
}

static const char *st_dtype(int es) { return es == 8 ? "F64" : "F32"; }

/* A writer's tensors: its parameters (dp rank 0), its moments, its counters. */
static int add_state(dl__ckd_shard *sh, tr_env *e, tr_comp *c, const void *full, int64_t *counters)
{
    const dl_gpt_layout *l = dl_gpt_get_layout(e->g);
    int es = e->pr.bf16 ? 4 : e->pr.dsize, cs = e->pr.csize, rc = DL_OK;
    /* (with expert parallelism each rank of the first ep group writes its own experts) */
    for (int k = 0; rc == DL_OK && e->mesh->dp_rank < e->mesh->ep && k < l->ntensors; k++) {
        const dl_tensor_info *t = &l->t[k];
        rc = dl__ckd_shard_add(sh, t->name, st_dtype(es), t->ndim, t->local,
                               (const char *)full + t->offset * (size_t)es, t->numel * (size_t)es,
                               tensor_piece(l, t));
    }
    const dl_zero_units *zu = c->sh->zu;
    int64_t n = (int64_t)zu->shard, two = 2;
    if (rc == DL_OK)
        rc = dl__ckd_shard_add(sh, "optim.exp_avg", st_dtype(cs), 1, &n, c->opt.m,
                               zu->shard * (size_t)cs, flat_piece(l, zu));
    if (rc == DL_OK)
        rc = dl__ckd_shard_add(sh, "optim.exp_avg_sq", st_dtype(cs), 1, &n, c->opt.v,
                               zu->shard * (size_t)cs, flat_piece(l, zu));
    counters[0] = c->opt.t;
    tr_counter(c, &counters[1], 0);
    if (rc == DL_OK)
        rc = dl__ckd_shard_add(sh, "state.adam_step_and_version", "I64", 1, &two, counters,
                               2 * sizeof *counters, NULL);
    return rc;
}

/* rank 0: the manifest's own fields */
static json_t *manifest(tr_env *e, tr_comp *c, int step, int skipped)
{
    const dl_train_opts *o = e->o;
    json_t *m =
        json_pack("{s:s, s:i, s:i, s:i, s:i}", "format", DL_CKD_FORMAT, "version", DL_CKD_VERSION,
                  "step", step, "adam_step", c->opt.t, "skipped_steps", skipped);
    for (size_t i = 0; i < NFIELDS; i++) {
        const ck_field *f = &fields[i];
        if (!json_object_get(m, f->group))
            json_object_set_new(m, f->group, json_object());
        json_object_set_new(json_object_get(m, f->group), f->key, field_get(f, o));
    }
    json_t *data = json_object_get(m, "data");
    json_object_set_new(data, "next_sample", json_integer((json_int_t)step * o->batch.global));
    json_object_set_new(m, "lr_position",
                        json_pack("{s:i, s:f}", "next_step", step + 1, "next_lr",
                                  step < o->optim.steps
                                      ? tr_lr_at(o->optim.lr, o->optim.min_lr, o->optim.warmup,
                                                 o->optim.steps, step + 1)
                                      : 0.0));
    json_object_set_new(m, "random",
                        json_pack("{s:{s:s, s:o}, s:{s:s, s:o}, s:{s:s, s:o}}", "init", "kind",
                                  "counter-based: splitmix64(seed, tensor, global element index)",
                                  "seed", dl__ckd_u64(o->optim.seed), "corpus", "kind",
                                  "counter-based: splitmix64 keyed by the data seed", "seed",
                                  dl__ckd_u64(o->data.seed), "sample", "kind",
                                  "after training: a stream seeded by the seed, not advanced while "
                                  "training",
                                  "seed", dl__ckd_u64(o->optim.seed)));
    int64_t ver = 0;
    tr_counter(c, &ver, 0);
    json_object_set_new(m, "pipeline",
                        json_pack("{s:I, s:s}", "weight_version_rank0", (json_int_t)ver,
                                  "stashed_weights",
                                  "none at a step boundary (every backward runs within its step); "
                                  "each file's state.adam_step_and_version holds its stage's"));
    char cpu[512];
    cpu_name(cpu, sizeof cpu);
    json_object_set_new(m, "machine",
                        json_pack("{s:s, s:s}", "blas", dl_blas_loaded_kernel(), "cpu", cpu));
    return m;
}

int tr_ckpt_stop_requested(void) { return atomic_load(&stop_request); }

int tr_ckpt_save(tr_env *e, tr_comp *c, tr_saver *sv, int step, int skipped)
{
    const dl_train_opts *o = e->o;
    void *full;
    int owned, rc = tr_params_whole(e, &full, &owned);
    if (rc)
        return rc;
    dl__ckd_shard sh;
    dl__ckd_shard_init(&sh);
    int64_t counters[2];
    int writer = e->mesh->dp_rank < e->mesh->ep || c->sh->zu->dp > 1;
    if (writer)
        rc = add_state(&sh, e, c, full, counters);
    /* the layout-independent hash of the state (train/state_reshard.c): collective, every
     * rank's status with it, so that all go on to save or none */
    json_t *hash;
    dl_comm *ck = tr_saver_comm(sv);
    int hrc = tr_state_hash(e, c, ck, full, rc, &hash);
    if (hrc) {
        dl__ckd_shard_free(&sh);
        if (owned)
            free(full);
        return hrc;
    }
    /* a failed rank still takes part in the save's collectives, which report it */
    json_t *man = dl_comm_rank(ck) == 0 ? manifest(e, c, step, skipped) : NULL;
    if (man)
        json_object_set_new(man, "state_hash", hash);
    dl__ckd_save_args a = {.dir = o->ckpt.dir,
                           .step = step,
                           .keep = o->ckpt.keep,
                           .writer = writer && rc == DL_OK,
                           .coord = {e->mesh->dp_rank, e->mesh->tp_rank, e->mesh->pp_rank},
                           .shard = &sh,
                           .manifest = man};
    /* the saver snapshots the data (or, ckpt.sync, writes it) before it returns */
    int src = tr_saver_start(sv, &a);
    if (owned)
        free(full);
    return rc ? rc : src;
}
