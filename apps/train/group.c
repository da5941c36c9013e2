/* The option groups' engine: getopt's table, --help and the JSON records built from the
 * groups distlab-train.c lists, and their hooks run by phase in the groups' order. */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>
#include "group.h"
#include "cli.h"
#include "core/json.h"

enum { MAX_OPTS = 128, OPT_BASE = 256 };

static const tg_group *const *groups;
static int ngroups;
static const char *help_intro, *help_outro;

void tg_groups(const tg_group *const *g, int n, const char *intro, const char *outro)
{
    groups = g;
    ngroups = n;
    help_intro = intro;
    help_outro = outro;
}

void tg_usage(FILE *f)
{
    fputs(help_intro, f);
    for (int i = 0; i < ngroups; i++) {
        if (groups[i]->heading)
            fputs(groups[i]->heading, f);
        for (const tg_opt *o = groups[i]->opts; o && o->name; o++)
            if (o->help)
                fputs(o->help, f);
    }
    fputs(help_outro, f);
}

/* Every group's options in one table (index = getopt's value - OPT_BASE), then -h and -V. */
static int build_table(const tg_opt **flat, struct option *lo)
{
    int n = 0;
    for (int i = 0; i < ngroups; i++)
        for (const tg_opt *o = groups[i]->opts; o && o->name && n < MAX_OPTS; o++, n++) {
            flat[n] = o;
            lo[n] =
                (struct option){o->name, o->arg ? required_argument : no_argument, 0, OPT_BASE + n};
        }
    lo[n++] = (struct option){"help", no_argument, 0, 'h'};
    lo[n++] = (struct option){"version", no_argument, 0, 'V'};
    lo[n] = (struct option){0, 0, 0, 0};
    return n;
}

int tg_parse(tg_run *run, int argc, char **argv)
{
    static const tg_opt *flat[MAX_OPTS];
    static struct option lo[MAX_OPTS + 3];
    int n = build_table(flat, lo) - 2, c;
    for (int i = 0; i < ngroups; i++)
        if (groups[i]->init)
            groups[i]->init(run);
    opterr = 0;
    while ((c = getopt_long(argc, argv, "hV", lo, NULL)) != -1) {
        run->status = CLI_EXIT_OK;
        if (c == 'h' || c == 'V') {
            c == 'h' ? tg_usage(stdout) : cli_print_version(stdout);
            return TG_STOP;
        }
        if (c < OPT_BASE || c >= OPT_BASE + n) {
            if (optopt && optopt < OPT_BASE)
                cli_error("unknown option '-%c' (see --help)", optopt);
            else
                cli_unknown_option("", argv[optind - 1], lo, sizeof lo[0], 0, 1, "--help");
            run->status = CLI_EXIT_USAGE;
            return TG_STOP;
        }
        if (run->ngiven < (int)(sizeof run->given / sizeof run->given[0]))
            run->given[run->ngiven++] = flat[c - OPT_BASE]->name;
        int bad = flat[c - OPT_BASE]->parse(run, optarg);
        if (bad < 0)
            run->status = CLI_EXIT_USAGE;
        if (bad)
            return TG_STOP;
    }
    if (optind < argc) {
        cli_error("unexpected argument '%s' (see --help)", argv[optind]);
        run->status = CLI_EXIT_USAGE;
        return TG_STOP;
    }
    return TG_NEXT;
}

int tg_given(const tg_run *run, const char *name)
{
    for (int i = 0; i < run->ngiven; i++)
        if (strcmp(run->given[i], name) == 0)
            return 1;
    return 0;
}

int tg_hooks(tg_run *run, tg_phase first, tg_phase last)
{
    for (tg_phase p = first; p <= last; p++)
        for (int i = 0; i < ngroups; i++)
            for (const tg_hook *h = groups[i]->hooks; h && h->run; h++)
                if (h->phase == p && h->run(run) == TG_STOP)
                    return TG_STOP;
    return TG_NEXT;
}

static const tg_field *fields_of(const tg_group *g, tg_kind kind)
{
    return kind == TG_CONFIG ? g->config : kind == TG_STEP ? g->step : g->summary;
}

static void put_fields(FILE *f, const tg_run *run, const tg_field *fl)
{
    for (; fl && fl->key; fl++) {
        if (fl->present && !fl->present(run))
            continue;
        fprintf(f, ",\"%s\":", fl->key);
        fl->put(f, run);
    }
}

int tg_record(tg_run *run, tg_kind kind, const char *type, const tg_field *own)
{
    FILE *f = run->json.f;
    fprintf(f, "{\"type\":\"%s\"", type);
    put_fields(f, run, own);
    for (int i = 0; i < ngroups; i++) put_fields(f, run, fields_of(groups[i], kind));
    fputs("}\n", f);
    return tg_json_flush(&run->json);
}

int tg_json_flush(tg_json *j)
{
    if (fflush(j->f) == 0 && !ferror(j->f))
        return DL_OK;
    return dl_error(DL_ESYS, "--json: writing '%s' failed: %s", j->path, strerror(errno));
}

int tg_json_close(tg_json *j, int quiet)
{
    int bad = tg_json_flush(j) != DL_OK;
    if (bad && !quiet)
        cli_error("%s", dl_errmsg());
    if (fclose(j->f) != 0 && !bad && !quiet) {
        cli_error("--json: closing '%s' failed: %s", j->path, strerror(errno));
        bad = 1;
    }
    j->f = NULL;
    return bad ? -1 : 0;
}

void tg_put_num(FILE *f, double v)
{
    if (isnan(v) || isinf(v))
        fputs("null", f);
    else
        fprintf(f, "%.17g", v);
}

void tg_put_bool(FILE *f, int v) { fputs(v ? "true" : "false", f); }

void tg_put_str(FILE *f, const char *s) { dl__json_fputs(f, s, DL__JSON_CTRL_DROP); }

void tg_put_keynum(FILE *f, const char *key, double v, int comma)
{
    fprintf(f, "\"%s\":", key);
    tg_put_num(f, v);
    if (comma)
        fputc(',', f);
}

const char *tg_plural(int n, const char *es) { return n == 1 ? "" : es; }

void tg_wrote(const char *path, const char *what) { printf("wrote %s (%s)\n", path, what); }

int tg_stop(tg_run *run, int status)
{
    run->status = status;
    return TG_STOP;
}

int tg_refuse(tg_run *run, const char *fmt, ...)
{
    char msg[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cli_error("%s", msg);
    return tg_stop(run, CLI_EXIT_USAGE);
}
