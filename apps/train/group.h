/* distlab-train's option groups. Each module of the trainer is one tg_group in its own file:
 * its options (with their --help lines), its checks and steps before the run, its JSON fields
 * and its summary lines. distlab-train.c lists the groups; group.c builds getopt's table, the
 * help and the JSON records from them, and runs the hooks. */
#ifndef DISTLAB_APPS_TRAIN_GROUP_H
#define DISTLAB_APPS_TRAIN_GROUP_H

#include <stdio.h>
#include "distlab.h"

/* --json's stream: every record is flushed as it is written and every write is checked, so
 * that a signal or a crash leaves every completed record on disk and a full disk is an error. */
typedef struct tg_json {
    FILE *f; /* NULL: no --json (or not this process's) */
    const char *path;
} tg_json;

/* The run, shared by the groups. A group keeps what only it reads in its own file. */
typedef struct tg_run {
    dl_train_opts o;
    int nprocs;                /* processes under mpirun (1 without) */
    int threads;               /* --threads (0: not given) */
    int status;                /* the exit status once a hook returns TG_STOP */
    tg_json json;              /* --json */
    const dl_train_result *r;  /* the finished run (the report's hooks, summary fields) */
    const dl_train_step *step; /* the step whose record is being written (step fields) */
    const char *given[128];    /* the options the command line gave (names without --), in order */
    int ngiven;
} tg_run;

/* What parsers and hooks return: go on, or stop now and exit with run->status. */
enum { TG_NEXT = 0, TG_STOP = 1 };

/* --name (with an argument when arg). parse: 0, -1 (bad value: message printed, exit 2) or
 * TG_STOP. help: its lines of --help exactly as printed; NULL when another option's line
 * documents it. */
typedef struct tg_opt {
    const char *name;
    int arg;
    int (*parse)(tg_run *run, const char *arg);
    const char *help;
} tg_opt;

/* When a hook runs. The phases run in this order, and within a phase the groups' hooks run in
 * the order the groups are listed (groups.h) and each group lists them: so which refusal a command
 * line with several errors sees first is a rule (the options before the configuration as a whole,
 * that before the files), not a number. */
typedef enum {
    /* before the run; a refusal prints one line, sets status 2 and stops */
    TG_CHECK,    /* the options alone: their refusals, values derived from them */
    TG_RESOLVE,  /* the configuration as a whole: the world, the library's resolution */
    TG_FILES,    /* the files: inputs readable and valid, outputs writable; nothing written */
    TG_OPEN,     /* the outputs opened (--json) */
    TG_ANNOUNCE, /* the banner and the config record */
    TG_PREPARE,  /* work before the ranks start (--layer-costs measure), stdout flushed */
    /* after a successful run */
    TG_INSTEAD, /* what replaces the summary (--eval-only's loss; it stops) */
    TG_HEAD,    /* the summary's header */
    TG_REPORT,  /* the summary's lines */
    TG_VERIFY,  /* --check's run on one rank */
    TG_CLOSE,   /* the summary record, --json closed */
    TG_NPHASES
} tg_phase;

/* A step of the run's set-up or of its report, in its phase. */
typedef struct tg_hook {
    tg_phase phase;
    int (*run)(tg_run *run);
} tg_hook;

/* A field "key":value of a JSON record; put writes the value. A record's fields are in the order
 * the groups are listed and each group lists them (docs/JSON.md follows it). present: NULL
 * (always) or whether the field is written. */
typedef struct tg_field {
    const char *key;
    void (*put)(FILE *f, const tg_run *run);
    int (*present)(const tg_run *run);
} tg_field;

/* One module's share of the command line. Lists end with an all-zero entry; any may be NULL. */
typedef struct tg_group {
    const char *heading; /* --help's heading above the options; NULL: the previous group's */
    const tg_opt *opts;
    void (*init)(tg_run *run);               /* defaults, before parsing */
    const tg_hook *hooks;                    /* after parsing: before and after the run */
    const tg_field *config, *step, *summary; /* the JSON records' fields */
} tg_group;

/* The record kinds, for tg_record. */
typedef enum { TG_CONFIG, TG_STEP, TG_SUMMARY } tg_kind;

/* Register the groups (in --help's order) and --help's text before them and after them. */
void tg_groups(const tg_group *const *groups, int n, const char *intro, const char *outro);
/* --help. */
void tg_usage(FILE *f);
/* Every group's init, then the command line: TG_NEXT, or TG_STOP with run->status set. */
int tg_parse(tg_run *run, int argc, char **argv);
/* 1 when the command line gave --name (name without the dashes), else 0. */
int tg_given(const tg_run *run, const char *name);
/* The hooks of phases first..last (tg_phase's order): TG_NEXT, or TG_STOP. */
int tg_hooks(tg_run *run, tg_phase first, tg_phase last);
/* {"type":TYPE,...own,...every group's fields of kind}\n on --json, flushed: DL_OK or DL_ESYS.
 * own: the record's own fields before the groups' (NULL: none). */
int tg_record(tg_run *run, tg_kind kind, const char *type, const tg_field *own);
/* Flush --json and check: DL_OK, or DL_ESYS with the message set. */
int tg_json_flush(tg_json *j);
/* Close --json, reporting a failed write (message printed) unless quiet (the run failed
 * already); 0 or -1. */
int tg_json_close(tg_json *j, int quiet);
/* --json's file closed after the last record: "wrote FILE (what)", or the run's status FAIL. */
void tg_json_end(tg_run *r, const char *what);

/* JSON values: a number (%.17g; null when not finite), true/false, a string (escaped). */
void tg_put_num(FILE *f, double v);
void tg_put_bool(FILE *f, int v);
void tg_put_str(FILE *f, const char *s);
/* "key":number, with a comma after it when comma. */
void tg_put_keynum(FILE *f, const char *key, double v, int comma);
/* "" or the plural ending es ("1 rank", "2 ranks": plural(n, "s")). */
const char *tg_plural(int n, const char *es);
/* The one line naming a file the run wrote: "wrote PATH (WHAT)" on stdout (process 0's, under
 * mpirun). */
void tg_wrote(const char *path, const char *what);
/* Stop with exit status `status` (a message already printed): TG_STOP. */
int tg_stop(tg_run *run, int status);
/* A refusal: the message on stderr, status 2, TG_STOP. */
int tg_refuse(tg_run *run, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

#endif
