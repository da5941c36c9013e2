/* Data: a file's bytes or the synthetic corpus (whose entropy rate is the loss floor), checked
 * before any thread starts; --write-corpus writes that corpus and exits. */
#include <math.h>
#include <stdint.h>
#include <unistd.h>
#include "group.h"
#include "cli.h"

static const char *corpus_path;

static int p_data(tg_run *r, const char *a)
{
    r->o.data.path = a;
    return 0;
}
static int p_max(tg_run *r, const char *a)
{
    return cli_parse_size("--data-max", a, 1, UINT64_MAX, &r->o.data.max_bytes);
}
static int p_seed(tg_run *r, const char *a)
{
    return cli_parse_size("--data-seed", a, 0, UINT64_MAX, &r->o.data.seed);
}
static int p_corpus(tg_run *r, const char *a)
{
    (void)r;
    corpus_path = a;
    return 0;
}

/* --write-corpus: the built-in corpus as a file, so that the --data examples have a file to
 * read. */
static int write_corpus(tg_run *r)
{
    dl_data_opts dop;
    dl_data *d;
    if (!corpus_path)
        return TG_NEXT;
    dl_data_opts_init(&dop);
    dop.seed = r->o.data.seed;
    if (dl_data_open(&dop, &d)) {
        cli_error("--write-corpus: %s", dl_errmsg());
        return tg_stop(r, CLI_EXIT_FAIL);
    }
    FILE *f = fopen(corpus_path, "wb");
    size_t n = dl_data_len(d), w = f ? fwrite(dl_data_bytes(d), 1, n, f) : 0;
    int bad = !f || w != n || fclose(f) != 0;
    dl_data_free(d);
    if (bad)
        return tg_refuse(r, "--write-corpus: cannot write '%s'", corpus_path);
    printf("wrote the synthetic corpus (data seed %llu, %zu bytes, entropy rate %.4f nats/byte) "
           "to %s\n",
           (unsigned long long)dop.seed, n, dl_data_entropy_rate(dop.p, dop.K), corpus_path);
    return tg_stop(r, CLI_EXIT_OK);
}

static int readable(tg_run *r)
{
    if (r->o.data.path && access(r->o.data.path, R_OK) != 0)
        return tg_refuse(r, "--data: cannot read '%s'", r->o.data.path);
    return TG_NEXT;
}

/* a data file too short or empty is a configuration error too: check before any thread */
static int opens(tg_run *r)
{
    dl_data_opts dop;
    dl_data *dd;
    dl_data_opts_init(&dop);
    dop.path = r->o.data.path;
    dop.seq = r->o.model.seq;
    dop.seed = r->o.data.seed;
    dop.max_bytes = r->o.data.max_bytes;
    if (dl_data_open(&dop, &dd))
        return tg_refuse(r, "%s", dl_errmsg());
    dl_data_free(dd);
    return TG_NEXT;
}

static void j_data(FILE *f, const tg_run *r)
{
    tg_put_str(f, r->o.data.path ? r->o.data.path : "synthetic");
}
static void j_floor(FILE *f, const tg_run *r) { tg_put_num(f, r->r->data.floor); }

/* clang-format off */
static const tg_opt opts[] = {
    {"data", 1, p_data,
"  --data FILE           train on FILE's bytes (last 10% held out); default: a synthetic\n"
"                        order-2 Markov corpus whose entropy rate (the loss floor) is known\n"},
    {"data-max", 1, p_max,
"  --data-max SIZE       refuse a --data file larger than SIZE (default 1G; the whole file\n"
"                        is held in memory); --data reads regular files only\n"},
    {"data-seed", 1, p_seed,
"  --data-seed N         seed of the synthetic corpus (default 1)\n"},
    {"write-corpus", 1, p_corpus,
"  --write-corpus FILE   write the synthetic corpus (4 MiB; --data-seed) to FILE and exit:\n"
"                        --data FILE then trains on the same bytes\n"},
    {0},
};
/* clang-format on */
static const tg_hook hooks[] = {{TG_CHECK, write_corpus},
                                {TG_FILES, readable},
                                {TG_FILES, opens},
                                {0}};
static const tg_field config[] = {{"data", j_data, NULL}, {0}};
static const tg_field summary[] = {{"loss_floor", j_floor, NULL}, {0}};

const tg_group tg_data = {.heading = "Data:\n",
                          .opts = opts,
                          .hooks = hooks,
                          .config = config,
                          .summary = summary};
