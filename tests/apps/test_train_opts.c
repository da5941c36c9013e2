/* distlab-train's option registry (apps/train/group.h): every registered option is named in
 * --help and every option --help names is registered; names, JSON keys and hook places are
 * unique; the getopt table built from the groups parses into dl_train_opts and refuses an
 * unknown option; a record's fields come out in pos order. Negative controls: a doctored group
 * list (an undocumented option, a documented phantom, a duplicated group) must be flagged. */
#include "../unit/testutil.h" /* first: it sets _GNU_SOURCE before any system header */
#include <check.h>
#include <getopt.h>
#include "groups.h"
#include "cli.h"

static const tg_group *const real[] = {TG_GROUPS(TG_ADDRESS)};
enum { NREAL = sizeof real / sizeof real[0] };

/* --help of the groups g[0..n) (no intro: the options' lines and headings), until the next
 * call */
static const char *help_of(const tg_group *const *g, int n)
{
    static char buf[1 << 16];
    memset(buf, 0, sizeof buf);
    FILE *f = fmemopen(buf, sizeof buf - 1, "w");
    tg_groups(g, n, "", "");
    tg_usage(f);
    fclose(f);
    return buf;
}

static int registered(const tg_group *const *g, int n, const char *name, size_t len)
{
    for (int i = 0; i < n; i++)
        for (const tg_opt *o = g[i]->opts; o && o->name; o++)
            if (strlen(o->name) == len && !strncmp(o->name, name, len))
                return 1;
    return 0;
}

static int is_name_char(char c) { return isalnum((unsigned char)c) || c == '-'; }

/* "--name" in help as a whole word */
static int documented(const char *help, const char *name)
{
    size_t len = strlen(name);
    for (const char *p = strstr(help, "--"); p; p = strstr(p + 1, "--"))
        if ((p == help || !is_name_char(p[-1])) && !strncmp(p + 2, name, len) &&
            !is_name_char(p[2 + len]))
            return 1;
    return 0;
}

/* Problems of the groups' options against their help: each printed on stderr, counted. */
static int audit_help(const tg_group *const *g, int n)
{
    const char *help = help_of(g, n);
    int bad = 0;
    for (int i = 0; i < n; i++)
        for (const tg_opt *o = g[i]->opts; o && o->name; o++)
            if (!documented(help, o->name) || !o->parse || (o->help && !strchr(o->help, '\n')))
                fprintf(stderr, "  --%s: not in --help, or no parser\n", o->name), bad++;
    for (const char *p = strstr(help, "--"); p; p = strstr(p + 2, "--")) {
        size_t len = 0;
        while (is_name_char(p[2 + len])) len++;
        if (len && (p == help || !is_name_char(p[-1])) && !registered(g, n, p + 2, len))
            fprintf(stderr, "  --help names --%.*s: not an option\n", (int)len, p + 2), bad++;
    }
    return bad;
}

/* Duplicates: option names, hooks (a function listed twice), keys per record; a hook's phase
 * outside tg_phase. */
static int audit_unique(const tg_group *const *g, int n)
{
    int bad = 0;
    for (int i = 0; i < n; i++)
        for (const tg_opt *o = g[i]->opts; o && o->name; o++)
            for (int j = i; j < n; j++)
                for (const tg_opt *q = j == i ? o + 1 : g[j]->opts; q && q->name; q++)
                    bad += !strcmp(o->name, q->name);
    for (int kind = 0; kind < 4; kind++)
        for (int i = 0; i < n; i++)
            for (int j = i; j < n; j++) {
                const tg_group *a = g[i], *b = g[j];
                if (kind == 0) {
                    for (const tg_hook *ha = a->hooks; ha && ha->run; ha++) {
                        bad += j == i && (ha->phase < TG_CHECK || ha->phase >= TG_NPHASES);
                        for (const tg_hook *hb = j == i ? ha + 1 : b->hooks; hb && hb->run; hb++)
                            bad += ha->run == hb->run;
                    }
                    continue;
                }
                const tg_field *fa = kind == 1 ? a->config : kind == 2 ? a->step : a->summary;
                const tg_field *fb0 = kind == 1 ? b->config : kind == 2 ? b->step : b->summary;
                for (; fa && fa->key; fa++)
                    for (const tg_field *fb = j == i ? fa + 1 : fb0; fb && fb->key; fb++)
                        bad += !strcmp(fa->key, fb->key);
            }
    return bad;
}

START_TEST(help_matches_options)
{
    ck_assert_int_eq(audit_help(real, NREAL), 0);
    ck_assert_int_eq(audit_unique(real, NREAL), 0);
    /* every option of the table, none twice: the count is --help's option lines' */
    int nopts = 0;
    for (int i = 0; i < NREAL; i++)
        for (const tg_opt *o = real[i]->opts; o && o->name; o++) nopts++;
    ck_assert_int_ge(nopts, 50);
}
END_TEST

static int p_none(tg_run *r, const char *a) { return (void)r, (void)a, 0; }

/* negative controls: each doctoring is found */
START_TEST(audits_catch_mistakes)
{
    static const tg_opt hidden[] = {{"undocumented", 0, p_none, NULL}, {0}};
    static const tg_opt phantom[] = {{"other", 0, p_none,
                                      "  --other               like --phantom\n"},
                                     {0}};
    static const tg_group g_hidden = {.opts = hidden}, g_phantom = {.opts = phantom};
    const tg_group *list[NREAL + 1];
    memcpy(list, real, sizeof real);
    list[NREAL] = &g_hidden;
    ck_assert_int_eq(audit_help(list, NREAL + 1), 1);
    list[NREAL] = &g_phantom;
    ck_assert_int_eq(audit_help(list, NREAL + 1), 1);
    list[NREAL] = real[NREAL - 1]; /* a group listed twice: every name, key and hook again */
    ck_assert_int_gt(audit_unique(list, NREAL + 1), 3);
}
END_TEST

/* tg_parse over argv; TG_NEXT or TG_STOP */
static int parse(tg_run *r, int argc, const char **argv)
{
    memset(r, 0, sizeof *r);
    dl_train_opts_init(&r->o);
    tg_groups(real, NREAL, "", "");
    optind = 0; /* glibc: restart getopt */
    return tg_parse(r, argc, (char **)argv);
}

START_TEST(table_parses)
{
    static tg_run r;
    const char *a1[] = {"t",    "--dp",       "3",       "--tp", "2",           "--zero",
                        "2",    "--schedule", "1f1b",    "--pp", "2",           "--dtype",
                        "bf16", "--overlap",  "--steps", "7",    "--threads=5", NULL};
    ck_assert_int_eq(parse(&r, 17, a1), TG_NEXT);
    ck_assert_int_eq(r.o.layout.dp, 3);
    ck_assert_int_eq(r.o.layout.tp, 2);
    ck_assert_int_eq(r.o.layout.pp, 2);
    ck_assert_int_eq(r.o.zero.stage, 2);
    ck_assert_int_eq(r.o.pipeline.schedule, DL_SCHED_1F1B);
    ck_assert_int_eq(r.o.precision.dtype, DL_BF16);
    ck_assert_int_eq(r.o.comm.overlap, 1);
    ck_assert_int_eq(r.o.optim.steps, 7);
    ck_assert_int_eq(r.threads, 5);
    /* the groups' defaults where nothing was given */
    const char *a2[] = {"t", NULL};
    ck_assert_int_eq(parse(&r, 1, a2), TG_NEXT);
    ck_assert_int_eq(r.o.optim.steps, 1500);
    ck_assert_int_eq(r.o.model.layers, 4);
    ck_assert_int_eq(r.o.layout.dp, 0);
    ck_assert_int_eq(r.o.layout.pp, 1);
    /* refusals: exit 2 */
    const char *a3[] = {"t", "--no-such-option", NULL};
    ck_assert_int_eq(parse(&r, 2, a3), TG_STOP);
    ck_assert_int_eq(r.status, CLI_EXIT_USAGE);
    const char *a4[] = {"t", "--zero", "4", NULL};
    ck_assert_int_eq(parse(&r, 3, a4), TG_STOP);
    ck_assert_int_eq(r.status, CLI_EXIT_USAGE);
}
END_TEST

static void put_a(FILE *f, const tg_run *r) { (void)r, fputs("1", f); }
static void put_b(FILE *f, const tg_run *r) { (void)r, fputs("\"b\"", f); }
static int never(const tg_run *r) { return (void)r, 0; }

/* the record's own fields, then the groups' in the order they are listed and list them */
START_TEST(record_in_declaration_order)
{
    static const tg_field own[] = {{"id", put_b, NULL}, {0}};
    static const tg_field f1[] = {{"c", put_a, NULL}, {"a", put_a, NULL}, {0}};
    static const tg_field f2[] = {{"gone", put_a, never}, {"b", put_b, NULL}, {0}};
    static const tg_group g1 = {.config = f1}, g2 = {.config = f2};
    const tg_group *list[] = {&g1, &g2};
    static tg_run r;
    char *buf = NULL;
    size_t len = 0;
    r.json.f = open_memstream(&buf, &len);
    r.json.path = "memory";
    tg_groups(list, 2, "", "");
    ck_assert_int_eq(tg_record(&r, TG_CONFIG, "config", own), DL_OK);
    fclose(r.json.f);
    ck_assert_str_eq(buf, "{\"type\":\"config\",\"id\":\"b\",\"c\":1,\"a\":1,\"b\":\"b\"}\n");
    free(buf);
}
END_TEST

/* hooks: phase by phase, within one the groups' order and each group's; TG_STOP stops */
static char trail[16];
static int h_a(tg_run *r) { return (void)r, strcat(trail, "a"), TG_NEXT; }
static int h_b(tg_run *r) { return (void)r, strcat(trail, "b"), TG_NEXT; }
static int h_c(tg_run *r) { return (void)r, strcat(trail, "c"), TG_NEXT; }
static int h_stop(tg_run *r) { return (void)r, strcat(trail, "s"), TG_STOP; }

START_TEST(hooks_in_phase_order)
{
    static const tg_hook k1[] = {{TG_FILES, h_a}, {TG_CHECK, h_b}, {TG_REPORT, h_stop}, {0}};
    static const tg_hook k2[] = {{TG_CHECK, h_c}, {TG_RESOLVE, h_a}, {TG_REPORT, h_b}, {0}};
    static const tg_group g1 = {.hooks = k1}, g2 = {.hooks = k2};
    const tg_group *list[] = {&g1, &g2};
    static tg_run r;
    tg_groups(list, 2, "", "");
    trail[0] = 0;
    ck_assert_int_eq(tg_hooks(&r, TG_CHECK, TG_PREPARE), TG_NEXT);
    ck_assert_str_eq(trail, "bcaa");
    trail[0] = 0;
    ck_assert_int_eq(tg_hooks(&r, TG_INSTEAD, TG_CLOSE), TG_STOP);
    ck_assert_str_eq(trail, "s");
}
END_TEST

int main(void)
{
    cli_progname = "test_train_opts";
    Suite *s = suite_create("train_opts");
    TCase *tc = tcase_create("train_opts");
    tcase_add_test(tc, help_matches_options);
    tcase_add_test(tc, audits_catch_mistakes);
    tcase_add_test(tc, table_parses);
    tcase_add_test(tc, record_in_declaration_order);
    tcase_add_test(tc, hooks_in_phase_order);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
