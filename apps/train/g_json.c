/* --json: JSON Lines (docs/JSON.md): the config record before the run, one record per step
 * while it runs, the summary after it; the fields are every group's. */
#include <errno.h>
#include <string.h>
#include "group.h"
#include "cli.h"
#include "mpi_app.h"

static const char *path;

static int p_json(tg_run *r, const char *a)
{
    (void)r;
    path = a;
    return 0;
}

static int check_output(tg_run *r)
{
    if (path && cli_check_output("--json", path))
        return tg_stop(r, CLI_EXIT_USAGE);
    return TG_NEXT;
}

/* under mpirun process 0 writes the records */
static int open_json(tg_run *r)
{
    r->json.path = path;
    if (!path || (r->nprocs > 1 && app_mpi_rank() != 0))
        return TG_NEXT;
    if (!(r->json.f = fopen(path, "w")))
        return tg_refuse(r, "--json: cannot write '%s': %s", path, strerror(errno));
    return TG_NEXT;
}

static void j_schema(FILE *f, const tg_run *r) { (void)r, fputs("\"distlab/1\"", f); }
static void j_app(FILE *f, const tg_run *r) { (void)r, fputs("\"distlab-train\"", f); }
static void j_version(FILE *f, const tg_run *r) { (void)r, fprintf(f, "\"%s\"", dl_version()); }

static void j_step(FILE *f, const tg_run *r) { fprintf(f, "%d", r->step->step); }

/* the records' own fields, before the groups' */
static const tg_field config_own[] = {{"schema", j_schema, NULL},
                                      {"app", j_app, NULL},
                                      {"version", j_version, NULL},
                                      {0}};
static const tg_field step_own[] = {{"step", j_step, NULL}, {0}};

/* dl_train_opts.on_step: one step record. */
static int step_record(const dl_train_step *s, void *arg)
{
    tg_run *r = arg;
    r->step = s;
    return tg_record(r, TG_STEP, "step", step_own);
}

static int config_record(tg_run *r)
{
    if (!r->json.f)
        return TG_NEXT;
    if (tg_record(r, TG_CONFIG, "config", config_own)) {
        cli_error("%s", dl_errmsg());
        return tg_stop(r, CLI_EXIT_FAIL);
    }
    r->o.output.on_step = step_record;
    r->o.output.on_step_arg = r;
    return TG_NEXT;
}

static int summary_record(tg_run *r)
{
    if (!r->json.f)
        return TG_NEXT;
    tg_record(r, TG_SUMMARY, "summary", NULL); /* a failed write is the close's error */
    tg_json_end(r, "JSON Lines: the config, a record per step, the summary; docs/JSON.md");
    return TG_NEXT;
}

void tg_json_end(tg_run *r, const char *what)
{
    if (tg_json_close(&r->json, 0))
        r->status = CLI_EXIT_FAIL;
    else
        tg_wrote(r->json.path, what);
}

/* clang-format off */
static const tg_opt opts[] = {
    {"json", 1, p_json,
"  --json FILE           JSON Lines: a config record, one record per step, a summary\n"
"                        (docs/JSON.md)\n"},
    {0},
};
/* clang-format on */
static const tg_hook hooks[] = {{TG_FILES, check_output},
                                {TG_OPEN, open_json},
                                {TG_ANNOUNCE, config_record},
                                {TG_CLOSE, summary_record},
                                {0}};

/* under the output heading */
const tg_group tg_json_out = {.opts = opts, .hooks = hooks};
