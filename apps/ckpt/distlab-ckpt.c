/* distlab-ckpt: a full-state checkpoint from the outside (docs/CHECKPOINTS.md): list what it
 * holds, verify every file's checksum and the state hash, convert it to the parameter-only safetensors file that
 * `distlab-train --save` writes and `--load` reads. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "distlab.h"
#include "io/ckdir.h"
#include "io/ckdir_map.h"
#include "cli.h"

/* clang-format off */
static const char usage[] =
"Usage: distlab-ckpt list DIR | verify DIR | convert DIR OUT.safetensors\n"
"\n"
"DIR is a checkpoint (DIR/manifest.json) or a directory of them (the newest complete one).\n"
"  list     the step, model, dtype, layout, the files and the tensors\n"
"  verify   every file's size and CRC32C against the manifest, and the state hash recomputed\n"
"           from the files' pieces against the manifest's (independent of the layout)\n"
"  convert  the parameters, whole, as the safetensors file --save writes (bf16: fp32 masters)\n"
"Exit status: 0 ok, 1 a damaged or unreadable checkpoint, 2 bad usage.\n";
/* clang-format on */

static int get_int(json_t *m, const char *g, const char *k)
{
    return (int)json_integer_value(json_object_get(json_object_get(m, g), k));
}

static int list(const char *dir, json_t *m)
{
    json_t *f, *t;
    size_t i;
    const char *name;
    printf("%s: step %d (Adam step %d, %d skipped), model %d layers, d-model %d, %d heads, "
           "seq %d, vocab %d%s, %s\n",
           dir, (int)json_integer_value(json_object_get(m, "step")),
           (int)json_integer_value(json_object_get(m, "adam_step")),
           (int)json_integer_value(json_object_get(m, "skipped_steps")),
           get_int(m, "model", "layers"), get_int(m, "model", "d_model"),
           get_int(m, "model", "heads"), get_int(m, "model", "seq"), get_int(m, "model", "vocab"),
           get_int(m, "model", "tie") ? ", tied" : "",
           json_string_value(json_object_get(json_object_get(m, "precision"), "dtype")));
    printf("layout: dp %d x tp %d x pp %d, ZeRO stage %d\n", get_int(m, "layout", "dp"),
           get_int(m, "layout", "tp"), get_int(m, "layout", "pp"),
           get_int(m, "layout", "zero_stage"));
    json_array_foreach(json_object_get(m, "files"), i, f)
        printf("file %s: rank %d, %lld bytes, crc32c %s\n",
               json_string_value(json_object_get(f, "name")),
               (int)json_integer_value(json_object_get(f, "rank")),
               (long long)json_integer_value(json_object_get(f, "bytes")),
               json_string_value(json_object_get(f, "crc32c")));
    json_object_foreach(json_object_get(m, "tensors"), name, t)
    {
        char *gs = json_dumps(json_object_get(t, "global_shape"), JSON_COMPACT);
        printf("tensor %s %s in %zu piece(s)\n", name, gs ? gs : "?",
               json_array_size(json_object_get(t, "pieces")));
        free(gs);
    }
    return 0;
}

typedef struct conv {
    const char *out;
    const dl_gpt_layout *l;
    const void *p;
    int es;
} conv;

static int save_rank(dl_ctx *ctx, void *arg)
{
    conv *c = arg;
    return dl_ckpt_save(c->out, c->l, c->p, c->es, dl_ctx_comm(ctx), 1);
}

/* the whole parameters gathered from the pieces, saved by a world of one rank */
static int convert(const char *dir, json_t *m, const char *out)
{
    dl_gpt_config cfg = {.vocab = get_int(m, "model", "vocab"),
                         .seq = get_int(m, "model", "seq"),
                         .layers = get_int(m, "model", "layers"),
                         .d_model = get_int(m, "model", "d_model"),
                         .heads = get_int(m, "model", "heads"),
                         .tie = get_int(m, "model", "tie")};
    json_t *moe = json_object_get(m, "moe"); /* a mixture of experts (absent: none) */
    if (moe) {
        cfg.experts = get_int(m, "moe", "experts"), cfg.top_k = get_int(m, "moe", "top_k");
        cfg.moe_every = get_int(m, "moe", "moe_every");
        cfg.expert_ffn = get_int(m, "moe", "expert_ffn");
        cfg.capacity = json_number_value(json_object_get(moe, "capacity_factor"));
        cfg.aux_loss = json_number_value(json_object_get(moe, "aux_loss"));
        cfg.z_loss = json_number_value(json_object_get(moe, "z_loss"));
    }
    const char *dt = json_string_value(json_object_get(json_object_get(m, "precision"), "dtype"));
    int es = dt && strcmp(dt, "f64") == 0 ? 8 : 4, rc;
    dl_gpt_layout *l;
    if ((rc = dl_gpt_layout_create(&cfg, 1, 0, &l)))
        return rc;
    char *p = malloc(l->numel * (size_t)es + 64);
    rc = p ? DL_OK : dl_error(DL_ENOMEM, "convert: out of memory");
    for (int k = 0; rc == DL_OK && k < l->ntensors; k++)
        rc = dl__ckd_gather(dir, m, l->t[k].name, es, p + l->t[k].offset * (size_t)es);
    conv c = {out, l, p, es};
    dl_world_opts w;
    dl_world_opts_init(&w);
    w.nranks = 1;
    if (rc == DL_OK)
        rc = dl_world_run(&w, save_rank, &c);
    free(p);
    dl_gpt_layout_destroy(l);
    return rc;
}

int main(int argc, char **argv)
{
    cli_progname = "distlab-ckpt";
    cli_ignore_sigxfsz();
    const char *cmd = argc > 1 ? argv[1] : "";
    int conv_args = strcmp(cmd, "convert") == 0;
    if (argc == 2 && (!strcmp(cmd, "-h") || !strcmp(cmd, "--help"))) {
        fputs(usage, stdout);
        return CLI_EXIT_OK;
    }
    if (cmd[0] == '-') { /* the one option is --help: the apps' did-you-mean line */
        static const char *const names[] = {"help", NULL};
        cli_unknown_option("", cmd, names, sizeof names[0], 0, 1, "--help");
        return CLI_EXIT_USAGE;
    }
    if ((strcmp(cmd, "list") && strcmp(cmd, "verify") && !conv_args) || argc != 3 + conv_args) {
        cli_error("usage: distlab-ckpt list DIR | verify DIR | convert DIR OUT (see --help)");
        return CLI_EXIT_USAGE;
    }
    if (conv_args && cli_check_output("convert", argv[3]))
        return CLI_EXIT_USAGE;
    char dir[4096];
    json_t *m = NULL;
    int rc = dl__ckd_find(argv[2], dir, sizeof dir);
    if (rc == DL_OK)
        rc = dl__ckd_open(dir, strcmp(cmd, "list") != 0, &m);
    if (rc == DL_OK && !strcmp(cmd, "list"))
        list(dir, m);
    else if (rc == DL_OK && !strcmp(cmd, "verify") && (rc = dl__ckd_hash_verify(dir, m)) == DL_OK) {
        const char *h =
            json_string_value(json_object_get(json_object_get(m, "state_hash"), "whole"));
        printf("%s: %zu file(s), sizes and CRC32C as the manifest says; state hash %s\n", dir,
               json_array_size(json_object_get(m, "files")), h ? h : "none (an older checkpoint)");
    } else if (rc == DL_OK)
        rc = convert(dir, m, argv[3]);
    json_decref(m);
    if (rc) {
        cli_error("%s", dl_errmsg());
        return CLI_EXIT_FAIL;
    }
    return CLI_EXIT_OK;
}
