/* Checkpoints: --save and --dump-grads (checked before the run), --load (a checkpoint of this
 * model, refused otherwise before any thread starts) and --eval-only. */
#include <math.h>
#include <unistd.h>
#include "group.h"
#include "cli.h"

static int p_save(tg_run *r, const char *a)
{
    r->o.ckpt.save = a;
    return 0;
}
static int p_dump(tg_run *r, const char *a)
{
    r->o.output.dump_grads = a;
    return 0;
}
static int p_load(tg_run *r, const char *a)
{
    r->o.ckpt.load = a;
    return 0;
}
static int p_eval_only(tg_run *r, const char *a)
{
    (void)a;
    r->o.eval.only = 1;
    return 0;
}

static int check_save(tg_run *r)
{
    if (r->o.ckpt.save && cli_check_output("--save", r->o.ckpt.save))
        return tg_stop(r, CLI_EXIT_USAGE);
    cli_remove_tmp_on_signal(r->o.ckpt.save);
    return TG_NEXT;
}

/* the gradients' file and its FILE.tokens */
static int check_dump(tg_run *r)
{
    const char *p = r->o.output.dump_grads;
    char tok[4096];
    if (!p)
        return TG_NEXT;
    if (cli_check_output("--dump-grads", p))
        return tg_stop(r, CLI_EXIT_USAGE);
    cli_remove_tmp_on_signal(p);
    snprintf(tok, sizeof tok, "%s.tokens", p);
    if (cli_check_output("--dump-grads", tok))
        return tg_stop(r, CLI_EXIT_USAGE);
    return TG_NEXT;
}

static int check_eval_only(tg_run *r)
{
    if (r->o.eval.only && !r->o.ckpt.load)
        return tg_refuse(r, "--eval-only needs --load FILE");
    return TG_NEXT;
}

/* refuse a file that is not a checkpoint of this model before any thread starts */
static int check_load(tg_run *r)
{
    const char *p = r->o.ckpt.load;
    dl_ckpt_info info;
    if (!p)
        return TG_NEXT;
    if (access(p, R_OK) != 0)
        return tg_refuse(r, "--load: cannot read '%s'", p);
    if (dl_ckpt_inspect(p, &info))
        return tg_refuse(r, "--load: %s", dl_errmsg());
    const dl_gpt_config *f = &info.cfg, *m = &r->o.model;
    if (info.has_config && (f->layers != m->layers || f->d_model != m->d_model ||
                            f->heads != m->heads || f->seq != m->seq || f->tie != m->tie))
        return tg_refuse(r,
                         "--load: '%s' holds a model with --layers %d --d-model %d --heads %d "
                         "--seq %d%s; give the same shape",
                         p, f->layers, f->d_model, f->heads, f->seq,
                         f->tie ? " --tie-embeddings" : "");
    return TG_NEXT;
}

/* --eval-only: the validation loss, its own summary record, and the end */
static int eval_only(tg_run *run)
{
    const dl_train_result *r = run->r;
    if (!run->o.eval.only)
        return TG_NEXT;
    if (!isfinite(r->eval.final_val_loss)) {
        cli_error("--eval-only: the validation loss of '%s' is %g, not finite", run->o.ckpt.load,
                  r->eval.final_val_loss);
        return tg_stop(run, CLI_EXIT_FAIL);
    }
    printf("validation loss %.6f over %d windows of %d bytes (window i starts at byte i*%d of "
           "the validation split)\n",
           r->eval.final_val_loss, r->eval.windows, run->o.model.seq, run->o.model.seq);
    run->status = CLI_EXIT_OK;
    if (run->json.f) {
        FILE *jf = run->json.f;
        fprintf(jf, "{\"type\":\"summary\",");
        tg_put_keynum(jf, "final_val_loss", r->eval.final_val_loss, 1);
        fprintf(jf, "\"eval_windows\":%d}\n", r->eval.windows);
        tg_json_end(run, "JSON Lines: the summary with the validation loss; docs/JSON.md");
    }
    return TG_STOP;
}

static int wrote(tg_run *run)
{
    const dl_train_opts *o = &run->o;
    char tok[4096];
    if (o->ckpt.save)
        tg_wrote(o->ckpt.save, "the parameters: safetensors, unsharded, any layout loads it");
    if (o->output.dump_grads) {
        tg_wrote(o->output.dump_grads, "step 1's gradients: safetensors, the same layout");
        snprintf(tok, sizeof tok, "%s.tokens", o->output.dump_grads);
        tg_wrote(tok, "step 1's batch: int32 inputs, then targets");
    }
    return TG_NEXT;
}

/* clang-format off */
static const tg_opt opts[] = {
    {"save", 1, p_save,
"  --save FILE           write the parameters (safetensors, unsharded, GPT-2-like names)\n"},
    {"dump-grads", 1, p_dump,
"  --dump-grads FILE     write step 1's gradients (same layout) and FILE.tokens (its batch)\n"},
    {"load", 1, p_load,
"  --load FILE           start from such a file (any layout)\n"},
    {"eval-only", 0, p_eval_only,
"  --eval-only           with --load: print the mean validation loss and exit\n"},
    {0},
};
/* clang-format on */
static const tg_hook hooks[] = {{TG_CHECK, check_eval_only},
                                {TG_FILES, check_save},
                                {TG_FILES, check_dump},
                                {TG_FILES, check_load},
                                {TG_INSTEAD, eval_only},
                                {TG_CLOSE, wrote},
                                {0}};

/* under the output heading */
const tg_group tg_ckpt = {
    .opts = opts,
    .hooks = hooks,
};
