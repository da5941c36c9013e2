/* Full-state checkpoints: a run resumed from a checkpoint continues bit for bit as the
 * uninterrupted run on the same layout (every step's loss and the final parameters compared as
 * bits: the same operations on the same state in the same order give the same bits, so no
 * tolerance applies), with a negative control (a resume without AdamW's moments differs); the
 * directory protocol (keep, a stale temporary, a crash mid-save); damaged checkpoints refused
 * with one line naming the file and the problem, nothing written; a stop request. */
#include "../testutil.h"
#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "distlab/train.h"

static char root[256];

static void mkroot(void)
{
    snprintf(root, sizeof root, "/tmp/dl_resume_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(root));
}

static void rmroot(void)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    ck_assert_int_eq(system(cmd), 0);
}

/* a tiny model, a few steps, a checkpoint every 2 */
static dl_train_opts tiny(int dp, int tp, int pp, dl_dtype dt, const char *dir)
{
    dl_train_opts o;
    dl_train_opts_init(&o);
    o.model.layers = pp > 1 ? 4 : 2;
    o.model.d_model = 16;
    o.model.heads = 2;
    o.model.seq = 8;
    o.precision.dtype = dt;
    o.layout.dp = dp;
    o.layout.tp = tp;
    o.layout.pp = pp;
    o.batch.micro = 2;
    o.batch.microbatches = pp > 1 ? 4 : 2;
    o.optim.steps = 5;
    o.optim.warmup = 2;
    o.optim.lr = 1e-2;
    o.optim.min_lr = 1e-3;
    o.eval.windows = 2;
    o.output.log_every = 0;
    o.output.want_params = 1;
    o.machine.timeout_s = 120;
    o.ckpt.dir = dir;
    o.ckpt.save_every = 2;
    return o;
}


/* The uninterrupted run (saving at 2 and 4) and the run resumed from step 2: the same bits; the
 * same resume without the moments (the control): different bits. */
static void resume_case(dl_train_opts o, const char *what)
{
    mkroot();
    char dir[300], from[320], why[256];
    snprintf(dir, sizeof dir, "%s/a", root);
    o.ckpt.dir = dir;
    dl_train_result a, b, c;
    ck_assert_msg(dl_train_run(&o, &a) == DL_OK, "%s: %s", what, dl_errmsg());
    ck_assert_int_eq(a.ckpt.saves, 2);
    snprintf(from, sizeof from, "%s/step-0000002", dir);
    dl_train_opts r = o;
    r.ckpt.dir = NULL;
    r.ckpt.resume = from;
    ck_assert_msg(dl_train_run(&r, &b) == DL_OK, "%s: resume: %s", what, dl_errmsg());
    ck_assert_int_eq(b.ckpt.resumed_from, 2);
    ck_assert_msg(tu_same_bits(&a, &b, why, sizeof why), "%s: resumed: %s", what, why);
    dl__test_hook h = {0};
    h.ckpt_skip_moments = 1;
    dl__test_hook_set(&h);
    int rc = dl_train_run(&r, &c);
    dl__test_hook_set(NULL);
    ck_assert_msg(rc == DL_OK, "%s: control: %s", what, dl_errmsg());
    ck_assert_msg(!tu_same_bits(&a, &c, why, sizeof why), "%s: a resume without the moments passed",
                  what);
    dl_train_result_free(&a), dl_train_result_free(&b), dl_train_result_free(&c);
    rmroot();
}

START_TEST(resume_f32_dp)
{
    resume_case(tiny(1, 1, 1, DL_F32, NULL), "f32 one rank");
    resume_case(tiny(2, 1, 1, DL_F32, NULL), "f32 dp 2");
}
END_TEST

START_TEST(resume_dtypes)
{
    resume_case(tiny(2, 1, 1, DL_F64, NULL), "f64 dp 2");
    resume_case(tiny(2, 1, 1, DL_BF16, NULL), "bf16 dp 2");
}
END_TEST

START_TEST(resume_tp) { resume_case(tiny(1, 2, 1, DL_F32, NULL), "f32 tp 2"); }
END_TEST

START_TEST(resume_pp)
{
    dl_train_opts o = tiny(1, 1, 2, DL_F32, NULL);
    o.pipeline.schedule = DL_SCHED_1F1B;
    resume_case(o, "f32 pp 2 1F1B");
    o.pipeline.schedule = DL_SCHED_INTERLEAVED;
    o.pipeline.virtual_stages = 2;
    resume_case(o, "f32 pp 2 interleaved v 2");
}
END_TEST

START_TEST(resume_zero)
{
    static const char *names[] = {"", "ZeRO-1 dp 2", "ZeRO-2 dp 2", "ZeRO-3 dp 2"};
    for (int s = 1; s <= 3; s++) {
        dl_train_opts o = tiny(2, 1, 1, DL_F32, NULL);
        o.zero.stage = s;
        resume_case(o, names[s]);
    }
    dl_train_opts o = tiny(2, 1, 1, DL_BF16, NULL);
    o.zero.stage = 3;
    resume_case(o, "bf16 ZeRO-3 dp 2");
}
END_TEST

static int count_entries(const char *d, const char *prefix)
{
    DIR *dd = opendir(d);
    int n = 0;
    struct dirent *e;
    while (dd && (e = readdir(dd))) n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    if (dd)
        closedir(dd);
    return n;
}

/* --keep 2: the two newest complete ones stay; a stale temporary of a dead process goes. */
START_TEST(keep_and_stale)
{
    mkroot();
    char dir[300], stale[400], f[460];
    snprintf(dir, sizeof dir, "%s/k", root);
    ck_assert_int_eq(mkdir(dir, 0755), 0);
    pid_t dead = fork();
    if (dead == 0)
        _exit(0);
    waitpid(dead, NULL, 0);
    snprintf(stale, sizeof stale, "%s/.tmp-step-0000009.%ld", dir, (long)dead);
    ck_assert_int_eq(mkdir(stale, 0755), 0);
    snprintf(f, sizeof f, "%s/rank-00000.safetensors", stale);
    FILE *fp = fopen(f, "w");
    ck_assert_ptr_nonnull(fp);
    fclose(fp);
    dl_train_opts o = tiny(1, 1, 1, DL_F32, dir);
    o.ckpt.save_every = 1;
    o.ckpt.keep = 2;
    dl_train_result a;
    ck_assert_msg(dl_train_run(&o, &a) == DL_OK, "%s", dl_errmsg());
    ck_assert_int_eq(a.ckpt.saves, 5);
    ck_assert_int_eq(count_entries(dir, "step-"), 2);
    ck_assert_int_eq(count_entries(dir, ".tmp"), 0);
    snprintf(f, sizeof f, "%s/step-0000005/manifest.json", dir);
    ck_assert_int_eq(access(f, R_OK), 0);
    snprintf(f, sizeof f, "%s/step-0000004/manifest.json", dir);
    ck_assert_int_eq(access(f, R_OK), 0);
    dl_train_result_free(&a);
    rmroot();
}
END_TEST

/* A process that dies during the save of step 4 (after its files, before the manifest): the
 * latest complete checkpoint is step 2, it resumes bit for bit, and the next save removes the
 * dead process's temporary. */
START_TEST(crash_during_save)
{
    mkroot();
    char dir[300], why[256];
    snprintf(dir, sizeof dir, "%s/c", root);
    dl_train_opts o = tiny(2, 1, 1, DL_F32, dir);
    pid_t pid = fork();
    if (pid == 0) {
        dl__test_hook h = {0};
        h.ckpt_die_at_step = 4;
        dl__test_hook_set(&h);
        dl_train_result x;
        dl_train_run(&o, &x);
        _exit(1); /* not reached: the hook exits with 99 */
    }
    int st;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 99);
    ck_assert_int_eq(count_entries(dir, "step-"), 1);
    ck_assert_int_eq(count_entries(dir, ".tmp-step-0000004"), 1);
    dl_train_opts r = o;
    r.ckpt.resume = dir; /* the newest complete one under it */
    dl_train_result a, b;
    ck_assert_msg(dl_train_run(&r, &b) == DL_OK, "%s", dl_errmsg());
    ck_assert_int_eq(b.ckpt.resumed_from, 2);
    ck_assert_int_eq(count_entries(dir, ".tmp"), 0);
    ck_assert_int_eq(count_entries(dir, "step-"), 2);
    dl_train_opts u = o;
    u.ckpt.dir = NULL;
    ck_assert_msg(dl_train_run(&u, &a) == DL_OK, "%s", dl_errmsg());
    ck_assert_msg(tu_same_bits(&a, &b, why, sizeof why), "%s", why);
    dl_train_result_free(&a), dl_train_result_free(&b);
    rmroot();
}
END_TEST

/* A stop request during step 3: the run finishes the step, saves it and returns; resumed, the
 * rest is the uninterrupted run's, bit for bit. */
START_TEST(stop_request)
{
    mkroot();
    char dir[300], why[256];
    snprintf(dir, sizeof dir, "%s/s", root);
    dl_train_opts o = tiny(2, 1, 1, DL_F32, dir);
    o.ckpt.save_every = 0;
    static const int stop_step = 3;
    dl_train_result a, b, u;
    tu_run_stopped(&o, &stop_step, &a);
    /* on_step runs once every rank finished the step: the ranks stop after step 3 or 4 */
    ck_assert_int_lt(a.nsteps, 5);
    dl_train_opts r = o;
    r.ckpt.resume = dir;
    ck_assert_msg(dl_train_run(&r, &b) == DL_OK, "%s", dl_errmsg());
    dl_train_opts p = r;
    p.ckpt.resume = NULL;
    p.ckpt.dir = NULL;
    ck_assert_msg(dl_train_run(&p, &u) == DL_OK, "%s", dl_errmsg());
    ck_assert_msg(tu_same_bits(&u, &b, why, sizeof why), "%s", why);
    dl_train_result_free(&a), dl_train_result_free(&b), dl_train_result_free(&u);
    rmroot();
}
END_TEST

/* ---- damaged checkpoints ---- */

static char *slurp(const char *p, size_t *n)
{
    FILE *f = fopen(p, "rb");
    ck_assert_ptr_nonnull(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc(*n + 1);
    ck_assert_uint_eq(fread(b, 1, *n, f), *n);
    b[*n] = 0;
    fclose(f);
    return b;
}

static void spill(const char *p, const char *b, size_t n)
{
    FILE *f = fopen(p, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(b, 1, n, f), n);
    fclose(f);
}

/* The resume of `ck` (with ckpt.dir = ck's parent: a refused run must write nothing) is refused
 * with one line naming `file` and `problem`, and the directory is unchanged. */
static void refused(dl_train_opts r, const char *dir, const char *file, const char *problem)
{
    char cmd[700], before[64], after[64];
    snprintf(cmd, sizeof cmd, "cd '%s' && find . -type f | sort | xargs cat | md5sum", dir);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(fgets(before, sizeof before, p));
    pclose(p);
    dl_train_result x;
    int rc = dl_train_run(&r, &x);
    const char *m = dl_errmsg();
    ck_assert_msg(rc == DL_EINVAL, "%s: not refused (%d: %s)", problem, rc, m);
    ck_assert_msg(strstr(m, file) && strstr(m, problem) && !strchr(m, '\n'),
                  "message '%s' should name '%s' and '%s' on one line", m, file, problem);
    dl_train_result_free(&x);
    p = popen(cmd, "r");
    ck_assert_ptr_nonnull(fgets(after, sizeof after, p));
    pclose(p);
    ck_assert_str_eq(before, after);
}

START_TEST(damaged)
{
    mkroot();
    char dir[300], ck[320], shard[400], man[400];
    snprintf(dir, sizeof dir, "%s/d", root);
    dl_train_opts o = tiny(2, 1, 1, DL_F32, dir);
    o.zero.stage = 1; /* both ranks write a file */
    o.optim.steps = 2;
    dl_train_result a;
    ck_assert_msg(dl_train_run(&o, &a) == DL_OK, "%s", dl_errmsg());
    dl_train_result_free(&a);
    snprintf(ck, sizeof ck, "%s/step-0000002", dir);
    snprintf(shard, sizeof shard, "%s/rank-00001.safetensors", ck);
    snprintf(man, sizeof man, "%s/manifest.json", ck);
    dl_train_opts r = o;
    r.optim.steps = 4;
    r.ckpt.resume = ck;
    size_t n, mn;
    char *orig = slurp(shard, &n), *morig = slurp(man, &mn);
    /* truncated shard */
    spill(shard, orig, n - 1);
    refused(r, dir, "rank-00001.safetensors", "truncated");
    /* one bit flipped in the data */
    char *bad = malloc(n);
    memcpy(bad, orig, n);
    bad[n - 5] ^= 0x10;
    spill(shard, bad, n);
    refused(r, dir, "rank-00001.safetensors", "checksum mismatch");
    /* missing shard */
    ck_assert_int_eq(unlink(shard), 0);
    refused(r, dir, "rank-00001.safetensors", "missing");
    spill(shard, orig, n);
    /* manifest without its version, and from the future */
    char *m2 = malloc(mn + 16), *v = strstr(morig, "\"version\": 1");
    ck_assert_ptr_nonnull(v);
    size_t at = (size_t)(v - morig);
    memcpy(m2, morig, at);
    memcpy(m2 + at, "\"versio_\": 1", 12);
    memcpy(m2 + at + 12, morig + at + 12, mn - at - 12);
    spill(man, m2, mn);
    refused(r, dir, "manifest.json", "no format version");
    m2[at + 7] = 'n';
    m2[at + 11] = '7';
    spill(man, m2, mn);
    refused(r, dir, "manifest.json", "format version 7");
    ck_assert_int_eq(unlink(man), 0);
    refused(r, dir, "manifest.json", "missing");
    spill(man, morig, mn);
    /* a configuration that does not match */
    dl_train_opts c = r;
    c.model.d_model = 32;
    refused(c, dir, ck, "--d-model");
    c = r;
    c.precision.dtype = DL_F64;
    refused(c, dir, ck, "--dtype");
    c = r; /* the global batch (the data position), unlike the layout, cannot change */
    c.batch.microbatches = 4;
    refused(c, dir, ck, "--global-batch");
    /* the intact checkpoint still resumes */
    ck_assert_msg(dl_train_run(&r, &a) == DL_OK, "%s", dl_errmsg());
    dl_train_result_free(&a);
    free(orig), free(morig), free(bad), free(m2);
    rmroot();
}
END_TEST

/* Omitted options come from the manifest, given ones are checked (--steps given: the total,
 * larger than the checkpoint's 2). */
static int only_heads(const char *option, void *arg)
{
    (void)arg;
    return strcmp(option, "--heads") == 0 || strcmp(option, "--steps") == 0;
}

START_TEST(options_from_manifest)
{
    mkroot();
    char dir[300];
    snprintf(dir, sizeof dir, "%s/o", root);
    dl_train_opts o = tiny(2, 1, 1, DL_BF16, dir);
    o.optim.steps = 2;
    o.zero.stage = 2;
    dl_train_result a;
    ck_assert_msg(dl_train_run(&o, &a) == DL_OK, "%s", dl_errmsg());
    dl_train_result_free(&a);
    dl_train_opts d, g;
    dl_train_opts_init(&d);
    g = d;
    ck_assert_int_eq(dl_train_resume_opts(dir, &g, only_heads, NULL), DL_EINVAL); /* 4, not 2 */
    ck_assert_ptr_nonnull(strstr(dl_errmsg(), "--heads was 2"));
    g = d;
    g.model.heads = 2;
    ck_assert_int_eq(dl_train_resume_opts(dir, &g, only_heads, NULL), DL_OK);
    ck_assert_int_eq(g.model.d_model, 16);
    ck_assert_int_eq(g.precision.dtype, DL_BF16);
    ck_assert_int_eq(g.layout.dp, 2);
    ck_assert_int_eq(g.zero.stage, 2);
    ck_assert(g.optim.lr == 1e-2);
    ck_assert_int_eq(g.optim.steps, d.optim.steps);
    ck_assert_str_eq(g.ckpt.dir, dir); /* saving on where it saved */
    g = d;                             /* every option given: the lr may differ, the model not */
    g.model.heads = 2, g.model.d_model = 16, g.model.layers = 2, g.model.seq = 8;
    g.optim.lr = 0.5;
    ck_assert_int_eq(dl_train_resume_opts(dir, &g, NULL, NULL), DL_EINVAL);
    ck_assert_ptr_nonnull(strstr(dl_errmsg(), "--dtype was \"bf16\""));
    rmroot();
}
END_TEST

int main(void)
{
    Suite *s = suite_create("resume");
    TCase *t = tcase_create("resume");
    tcase_set_timeout(t, 300);
    tcase_add_test(t, resume_f32_dp);
    tcase_add_test(t, resume_dtypes);
    tcase_add_test(t, resume_tp);
    tcase_add_test(t, resume_pp);
    tcase_add_test(t, resume_zero);
    tcase_add_test(t, keep_and_stale);
    tcase_add_test(t, crash_during_save);
    tcase_add_test(t, stop_request);
    tcase_add_test(t, damaged);
    tcase_add_test(t, options_from_manifest);
    suite_add_tcase(s, t);
    return tu_run_suite(s);
}
