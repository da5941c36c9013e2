/* Checkpoints: --save and --dump-grads (checked before the run), --load (a checkpoint of this
 * model, refused otherwise before any thread starts) and --eval-only; full-state checkpoints
 * (--ckpt-dir, --save-every, --keep, --save-at-end), --resume (the options the command line
 * omits from the checkpoint's manifest) and Ctrl-C / SIGTERM: the step finished, a checkpoint
 * written, exit 130 / 143; a second signal exits at once. */
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
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

static int p_ckpt_dir(tg_run *r, const char *a)
{
    r->o.ckpt.dir = a;
    return 0;
}
static int p_save_every(tg_run *r, const char *a)
{
    return cli_parse_int("--save-every", a, 1, 1 << 30, &r->o.ckpt.save_every);
}
static int p_keep(tg_run *r, const char *a)
{
    return cli_parse_int("--keep", a, 1, 1 << 30, &r->o.ckpt.keep);
}
static int p_save_at_end(tg_run *r, const char *a)
{
    (void)a;
    r->o.ckpt.save_at_end = 1;
    return 0;
}
static int p_ckpt_sync(tg_run *r, const char *a)
{
    (void)a;
    r->o.ckpt.sync = 1;
    return 0;
}
static int p_on_save_error(tg_run *r, const char *a)
{
    if (strcmp(a, "stop") == 0 || strcmp(a, "continue") == 0) {
        r->o.ckpt.on_save_error = a[0] == 'c' ? DL_SAVE_ERROR_CONTINUE : DL_SAVE_ERROR_STOP;
        return 0;
    }
    cli_error("--on-save-error: '%s' is not stop or continue", a);
    return -1;
}
static int p_resume(tg_run *r, const char *a)
{
    r->o.ckpt.resume = a;
    return 0;
}

/* the library names an option "--name" */
static int given(const char *option, void *arg)
{
    return strncmp(option, "--", 2) == 0 && tg_given(arg, option + 2);
}

/* options that need --ckpt-dir; --resume takes what the command line omits from the manifest
 * and refuses a model, dtype, batch or data that differs (another layout reshards) */
static int check_full_state(tg_run *r)
{
    const dl_train_ckpt *k = &r->o.ckpt;
    if (!k->dir && (k->save_every || k->keep || k->save_at_end || tg_given(r, "ckpt-sync") ||
                    tg_given(r, "on-save-error")))
        return tg_refuse(r, "--save-every, --keep, --save-at-end, --ckpt-sync and "
                            "--on-save-error need --ckpt-dir DIR");
    if (k->resume && (k->load || r->o.eval.only))
        return tg_refuse(r, "--resume continues a run: not with --load or --eval-only");
    if (!k->resume)
        return TG_NEXT;
    if (dl_train_resume_opts(k->resume, &r->o, given, r))
        return tg_refuse(r, "%s", dl_errmsg());
    return TG_NEXT;
}

/* Ctrl-C and SIGTERM with --ckpt-dir: the first asks the run to stop after its step (a
 * checkpoint is written), the second exits at once (the last complete checkpoint stays). */
static atomic_int signals;

static void on_stop_signal(int sig)
{
    if (atomic_fetch_add(&signals, 1) > 0)
        _exit(128 + sig);
    dl_train_request_stop(sig);
}

static int install_stop(tg_run *r)
{
    if (!r->o.ckpt.dir)
        return TG_NEXT;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    const int sigs[] = {SIGINT, SIGTERM};
    for (int i = 0; i < 2; i++) {
        struct sigaction old;
        /* a signal ignored by whoever started us (nohup, a background job) stays ignored */
        if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler != SIG_IGN)
            sigaction(sigs[i], &sa, NULL);
    }
    return TG_NEXT;
}

/* the checkpoints written, and a stopped run's way back */
static int report_full_state(tg_run *run)
{
    const dl_train_ckpt_result *k = &run->r->ckpt;
    const char *d = run->o.ckpt.dir;
    if (run->r->ckpt.resumed_from)
        printf("resumed from step %d\n", k->resumed_from);
    for (int i = 0; i < k->nrecords; i++) {
        const dl_train_save *v = &k->save[i];
        printf("checkpoint step %d: %s, %.1f MiB, stall %.2f ms, write %.1f ms, writer CPU "
               "%.1f ms (%s)\n",
               v->step, v->ok ? "complete" : "FAILED", cli_mib((double)v->bytes), v->stall_ms,
               v->write_ms, v->writer_cpu_ms, run->o.ckpt.sync ? "--ckpt-sync" : "async");
    }
    if (d && k->saves)
        printf("checkpoints: %d written, the last %s/step-%07d\n", k->saves, d, k->last_saved);
    if (k->failed)
        printf("checkpoints: %d failed (--on-save-error continue)\n", k->failed);
    if (k->stopped)
        printf("stopped by %s after step %d; continue with --resume %s\n",
               k->stopped == SIGINT    ? "SIGINT"
               : k->stopped == SIGTERM ? "SIGTERM"
                                       : "a signal",
               k->last_saved, d);
    fflush(stdout);
    return TG_NEXT;
}

/* a stopped run exits as the signal would have: 128 + its number */
static int stopped_status(tg_run *run)
{
    if (run->r->ckpt.stopped && run->status == CLI_EXIT_OK)
        run->status = 128 + run->r->ckpt.stopped;
    return TG_NEXT;
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

/* --load without a shape on the command line: the file's (as --resume takes the manifest's);
 * a file that cannot be read is refused by check_load */
static int load_shape(tg_run *r)
{
    static const char *const shape[] = {"layers", "d-model", "heads", "seq", "tie-embeddings"};
    dl_ckpt_info info;
    if (!r->o.ckpt.load || dl_ckpt_inspect(r->o.ckpt.load, &info) || !info.has_config)
        return TG_NEXT;
    for (size_t i = 0; i < sizeof shape / sizeof shape[0]; i++)
        if (tg_given(r, shape[i]))
            return TG_NEXT;
    r->o.model = info.cfg;
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
"  --load FILE           start from such a file (any layout; its shape unless one is given)\n"},
    {"eval-only", 0, p_eval_only,
"  --eval-only           with --load: print the mean validation loss and exit\n"},
    {"ckpt-dir", 1, p_ckpt_dir,
"  --ckpt-dir DIR        full-state checkpoints DIR/step-NNNNNNN (parameters, AdamW state,\n"
"                        positions); Ctrl-C / SIGTERM: finish the step, save, exit 130 / 143\n"},
    {"save-every", 1, p_save_every,
"  --save-every N        with --ckpt-dir: a checkpoint every N steps\n"},
    {"keep", 1, p_keep,
"  --keep K              with --ckpt-dir: keep the K newest complete checkpoints\n"},
    {"save-at-end", 0, p_save_at_end,
"  --save-at-end         with --ckpt-dir: a checkpoint after the last step\n"},
    {"ckpt-sync", 0, p_ckpt_sync,
"  --ckpt-sync           with --ckpt-dir: write each checkpoint at its step (default: copy\n"
"                        the state there, a thread per rank writes it while training goes on)\n"},
    {"on-save-error", 1, p_on_save_error,
"  --on-save-error stop|continue\n"
"                        with --ckpt-dir: a failed save (full disk, unwritable directory)\n"
"                        stops the run, exit 1 (default), or is reported and training goes on\n"},
    {"resume", 1, p_resume,
"  --resume DIR          continue from DIR (a step-N, or the newest under it), bit for bit;\n"
"                        omitted options from it; --steps is the total; another layout\n"
"                        (--dp --tp --pp --zero --schedule ...) reshards it, to rounding\n"},
    {0},
};
/* clang-format on */
static const tg_hook hooks[] = {{TG_CHECK, check_eval_only},    {TG_CHECK, check_full_state},
                                {TG_CHECK, load_shape},         {TG_FILES, check_save},
                                {TG_FILES, check_dump},         {TG_FILES, check_load},
                                {TG_PREPARE, install_stop},     {TG_INSTEAD, eval_only},
                                {TG_REPORT, report_full_state}, {TG_CLOSE, wrote},
                                {TG_CLOSE, stopped_status},     {0}};

/* the saves, as the summary lists them */
static void j_saves(FILE *f, const tg_run *run)
{
    const dl_train_ckpt_result *k = &run->r->ckpt;
    fputc('[', f);
    for (int i = 0; i < k->nrecords; i++) {
        const dl_train_save *v = &k->save[i];
        fprintf(f, "%s{\"step\":%d,\"ok\":", i ? "," : "", v->step);
        tg_put_bool(f, v->ok);
        fprintf(f, ",\"bytes\":%llu,", (unsigned long long)v->bytes);
        tg_put_keynum(f, "stall_ms", v->stall_ms, 1);
        tg_put_keynum(f, "write_ms", v->write_ms, 1);
        tg_put_keynum(f, "writer_cpu_ms", v->writer_cpu_ms, 0);
        fputc('}', f);
    }
    fprintf(f, "]");
}

static int has_dir(const tg_run *run) { return run->o.ckpt.dir != NULL; }

static const tg_field summary[] = {{"checkpoints", j_saves, has_dir}, {0}};

/* under the output heading */
const tg_group tg_ckpt = {
    .opts = opts,
    .hooks = hooks,
    .summary = summary,
};
