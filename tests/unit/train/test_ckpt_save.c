/* Full-state saves without stalling, and their faults: an asynchronous save (a snapshot at the
 * step boundary, the files written by the writer threads while training goes on) writes the
 * same bytes as a synchronous one, and its checkpoint resumes bit for bit (the same operations
 * on the same state give the same bits: no tolerance); a failed save (a full disk, a directory
 * that cannot be made) is reported, stops the run or lets it go on, and never leaves a
 * checkpoint that looks complete; a process that dies at any boundary of a save's I/O (the test
 * hook's crash points), or is killed at random during saves, leaves the latest complete
 * checkpoint loadable, and the resume from it is the uninterrupted run, bit for bit. */
#include "../testutil.h"
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "distlab/train.h"
#include "io/ckdir.h"

static char root[256];

static void mkroot(void)
{
    snprintf(root, sizeof root, "/tmp/dl_ckpt_save_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(root));
}

static void rmroot(void)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    ck_assert_int_eq(system(cmd), 0);
}

/* a tiny model on dp 2 with ZeRO-1 (both ranks write a file), a checkpoint every 2 steps */
static dl_train_opts tiny(const char *dir, int steps)
{
    dl_train_opts o;
    dl_train_opts_init(&o);
    o.model.layers = 2;
    o.model.d_model = 16;
    o.model.heads = 2;
    o.model.seq = 8;
    o.layout.dp = 2;
    o.zero.stage = 1;
    o.batch.micro = 2;
    o.batch.microbatches = 2;
    o.optim.steps = steps;
    o.optim.warmup = 2;
    o.optim.lr = 1e-2;
    o.optim.min_lr = 1e-3;
    o.eval.windows = 2;
    o.output.log_every = 0;
    o.output.log = NULL;
    o.output.want_params = 1;
    o.machine.timeout_s = 120;
    o.ckpt.dir = dir;
    o.ckpt.save_every = 2;
    return o;
}


static char *slurp(const char *p, size_t *n)
{
    FILE *f = fopen(p, "rb");
    ck_assert_msg(f != NULL, "cannot open %s", p);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc(*n + 1);
    ck_assert_uint_eq(fread(b, 1, *n, f), *n);
    fclose(f);
    return b;
}

/* 1 when the files a/name and b/name have the same bytes; *bytes += the size */
static int same_file(const char *a, const char *b, const char *name, uint64_t *bytes)
{
    char pa[600], pb[600];
    snprintf(pa, sizeof pa, "%s/%s", a, name);
    snprintf(pb, sizeof pb, "%s/%s", b, name);
    size_t na, nb;
    char *x = slurp(pa, &na), *y = slurp(pb, &nb);
    int same = na == nb && memcmp(x, y, na) == 0;
    free(x), free(y);
    *bytes += na;
    return same;
}

static const char *const files[] = {"rank-00000.safetensors", "rank-00001.safetensors",
                                    "manifest.json"};

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

/* Async and sync saves of the same run: every file of every checkpoint byte for byte equal,
 * the records' bytes the files' sizes; the control: step 2's files against step 4's differ
 * (the comparison can fail). The async checkpoint of step 2 resumes bit for bit. */
START_TEST(async_equals_sync)
{
    mkroot();
    char da[300], ds[300], a2[320], s2[320], a4[320], why[256];
    snprintf(da, sizeof da, "%s/async", root);
    snprintf(ds, sizeof ds, "%s/sync", root);
    dl_train_opts o = tiny(da, 6), p = tiny(ds, 6);
    p.ckpt.sync = 1;
    dl_train_result a, s, b;
    ck_assert_msg(dl_train_run(&o, &a) == DL_OK, "async: %s", dl_errmsg());
    ck_assert_msg(dl_train_run(&p, &s) == DL_OK, "sync: %s", dl_errmsg());
    ck_assert_int_eq(a.ckpt.saves, 3);
    ck_assert_int_eq(a.ckpt.nrecords, 3);
    ck_assert_int_eq(s.ckpt.nrecords, 3);
    for (int step = 2; step <= 6; step += 2) {
        snprintf(a2, sizeof a2, "%s/step-%07d", da, step);
        snprintf(s2, sizeof s2, "%s/step-%07d", ds, step);
        uint64_t bytes = 0, manifest = 0;
        for (int f = 0; f < 3; f++)
            ck_assert_msg(same_file(a2, s2, files[f], f < 2 ? &bytes : &manifest),
                          "step %d: %s differs between the async and the sync save", step,
                          files[f]);
        const dl_train_save *r = &a.ckpt.save[step / 2 - 1];
        ck_assert_int_eq(r->step, step);
        ck_assert_int_eq(r->ok, 1);
        ck_assert_uint_eq(r->bytes, bytes);
        ck_assert_uint_eq(s.ckpt.save[step / 2 - 1].bytes, bytes);
        ck_assert(r->stall_ms >= 0 && r->write_ms > 0 && r->writer_cpu_ms > 0);
    }
    uint64_t ignore = 0;
    snprintf(a2, sizeof a2, "%s/step-0000002", da);
    snprintf(a4, sizeof a4, "%s/step-0000004", da);
    ck_assert_msg(!same_file(a2, a4, files[0], &ignore), "control: steps 2 and 4 compare equal");
    dl_train_opts r = o;
    r.ckpt.dir = NULL;
    r.ckpt.resume = a2;
    ck_assert_msg(dl_train_run(&r, &b) == DL_OK, "resume: %s", dl_errmsg());
    ck_assert_int_eq(b.ckpt.resumed_from, 2);
    ck_assert_msg(tu_same_bits(&a, &b, why, sizeof why), "resumed from the async save: %s", why);
    ck_assert_msg(tu_same_bits(&s, &b, why, sizeof why), "the sync run: %s", why);
    dl_train_result_free(&a), dl_train_result_free(&s), dl_train_result_free(&b);
    rmroot();
}
END_TEST

/* A full disk during the save of step 4 (rank 1's file, part-written): with continue, the run
 * goes on, step 4 is reported failed and absent (no temporary left), 2 and 6 complete; with
 * stop, the run fails naming the file and the full disk, and step 2 resumes bit for bit. */
START_TEST(disk_full)
{
    mkroot();
    char dc[300], dst[300], why[256];
    snprintf(dc, sizeof dc, "%s/c", root);
    snprintf(dst, sizeof dst, "%s/s", root);
    dl__test_hook h = {0};
    h.ckpt_enospc_step = 4;
    h.ckpt_enospc_rank = 1;
    dl_train_opts o = tiny(dc, 6);
    o.ckpt.on_save_error = DL_SAVE_ERROR_CONTINUE;
    dl_train_result a, s, b, u;
    dl__test_hook_set(&h);
    int rc = dl_train_run(&o, &a);
    dl__test_hook_set(NULL);
    ck_assert_msg(rc == DL_OK, "continue: %s", dl_errmsg());
    ck_assert_int_eq(a.ckpt.saves, 2);
    ck_assert_int_eq(a.ckpt.failed, 1);
    ck_assert_int_eq(a.ckpt.nrecords, 3);
    ck_assert_int_eq(a.ckpt.save[1].step, 4);
    ck_assert_int_eq(a.ckpt.save[1].ok, 0);
    ck_assert_int_eq(count_entries(dc, "step-"), 2);
    ck_assert_int_eq(count_entries(dc, ".tmp"), 0);
    ck_assert_int_eq(a.nsteps, 6);
    dl_train_opts p = tiny(dst, 6);
    dl__test_hook_set(&h);
    rc = dl_train_run(&p, &s);
    dl__test_hook_set(NULL);
    ck_assert_int_eq(rc, DL_ESYS);
    const char *m = dl_errmsg();
    ck_assert_msg(strstr(m, "rank-00001.safetensors") && strstr(m, "space"), "message: %s", m);
    ck_assert_int_eq(count_entries(dst, "step-"), 1);
    ck_assert_int_eq(count_entries(dst, ".tmp"), 0);
    dl_train_opts r = p;
    r.ckpt.resume = dst;
    ck_assert_msg(dl_train_run(&r, &b) == DL_OK, "resume: %s", dl_errmsg());
    ck_assert_int_eq(b.ckpt.resumed_from, 2);
    dl_train_opts q = p;
    q.ckpt.dir = NULL;
    ck_assert_msg(dl_train_run(&q, &u) == DL_OK, "%s", dl_errmsg());
    ck_assert_msg(tu_same_bits(&u, &b, why, sizeof why), "%s", why);
    ck_assert_msg(tu_same_bits(&u, &a, why, sizeof why), "the run that went on: %s", why);
    dl_train_result_free(&a), dl_train_result_free(&s), dl_train_result_free(&b);
    dl_train_result_free(&u);
    rmroot();
}
END_TEST

/* A checkpoint directory that cannot be made (a plain file where its parent should be: root
 * ignores permissions, not that): stop fails at the first save naming it; continue trains on. */
START_TEST(unwritable_dir)
{
    mkroot();
    char file[300], dir[320];
    snprintf(file, sizeof file, "%s/plain", root);
    snprintf(dir, sizeof dir, "%s/sub", file);
    FILE *f = fopen(file, "w");
    ck_assert_ptr_nonnull(f);
    fclose(f);
    dl_train_opts o = tiny(dir, 4);
    dl_train_result a, b;
    ck_assert_int_eq(dl_train_run(&o, &a), DL_ESYS);
    ck_assert_msg(strstr(dl_errmsg(), dir) != NULL, "message: %s", dl_errmsg());
    ck_assert_int_eq(a.ckpt.saves, 0);
    o.ckpt.on_save_error = DL_SAVE_ERROR_CONTINUE;
    ck_assert_msg(dl_train_run(&o, &b) == DL_OK, "%s", dl_errmsg());
    ck_assert_int_eq(b.ckpt.failed, 2);
    ck_assert_int_eq(b.nsteps, 4);
    dl_train_result_free(&a), dl_train_result_free(&b);
    rmroot();
}
END_TEST

/* The newest complete checkpoint under dir verifies (sizes, CRC32C) and its resume is the
 * uninterrupted run u, bit for bit: its step into *step. */
static void latest_resumes(const dl_train_opts *o, const char *dir, const dl_train_result *u,
                           int *step, const char *what)
{
    char ck[4096], why[256];
    json_t *m;
    ck_assert_msg(dl__ckd_find(dir, ck, sizeof ck) == DL_OK, "%s: %s", what, dl_errmsg());
    ck_assert_msg(dl__ckd_open(ck, 1, &m) == DL_OK, "%s: %s", what, dl_errmsg());
    json_decref(m);
    dl_train_opts r = *o;
    r.ckpt.resume = dir;
    r.ckpt.dir = NULL; /* the resume saves nothing (fsyncs are slow) */
    dl_train_result b;
    ck_assert_msg(dl_train_run(&r, &b) == DL_OK, "%s: resume: %s", what, dl_errmsg());
    ck_assert_msg(tu_same_bits(u, &b, why, sizeof why), "%s: %s", what, why);
    *step = b.ckpt.resumed_from;
    dl_train_result_free(&b);
}

/* The crash points: the save of step 4 counts its I/O boundaries (K of them); a child that
 * _exits at each of 1..K leaves step 2 or step 4 as the newest complete one (both happen:
 * before and after the rename), which verifies and resumes bit for bit; K + 1 is not reached
 * (the child finishes). Async; sync too in the full tier (the same boundaries, on the rank
 * threads). */
static void crash_points(int sync)
{
    mkroot();
    char dir[300], what[64];
    dl_train_opts o = tiny(dir, 5), u0 = tiny(NULL, 5);
    o.ckpt.sync = sync;
    dl_train_result u;
    ck_assert_msg(dl_train_run(&u0, &u) == DL_OK, "%s", dl_errmsg());
    dl__test_hook h = {0};
    h.ckpt_crash_step = 4;
    snprintf(dir, sizeof dir, "%s/count", root);
    dl_train_result x;
    dl__test_hook_set(&h);
    int rc = dl_train_run(&o, &x);
    dl__test_hook_set(NULL);
    ck_assert_msg(rc == DL_OK, "%s", dl_errmsg());
    dl_train_result_free(&x);
    int K = atomic_load(&h.ckpt_points), seen[2] = {0, 0};
    ck_assert_int_ge(K, 20); /* 2 files x 4, the temporary 2, the manifest 4, the commit 6 */
    for (int k = 1; k <= K + 1; k++) {
        snprintf(dir, sizeof dir, "%s/k%d", root, k);
        pid_t pid = fork();
        if (pid == 0) {
            h.ckpt_crash_at = k;
            dl__test_hook_set(&h);
            _exit(dl_train_run(&o, &x) == DL_OK ? 0 : 1);
        }
        int st, step;
        ck_assert_int_eq(waitpid(pid, &st, 0), pid);
        ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == (k <= K ? 99 : 0),
                      "crash point %d of %d: status %d", k, K, st);
        if (k > K)
            break;
        snprintf(what, sizeof what, "%s crash point %d of %d", sync ? "sync" : "async", k, K);
        latest_resumes(&o, dir, &u, &step, what);
        ck_assert_msg(step == 2 || step == 4, "%s: resumed from %d", what, step);
        seen[step == 4]++;
    }
    ck_assert_msg(seen[0] && seen[1], "crashes before (%d) and after (%d) the rename", seen[0],
                  seen[1]);
    printf("%s: %d crash points, %d left step 2, %d step 4\n", sync ? "sync" : "async", K, seen[0],
           seen[1]);
    dl_train_result_free(&u);
    rmroot();
}

START_TEST(crash_points_async) { crash_points(0); }
END_TEST

START_TEST(crash_points_sync)
{
    if (!tu_test_small())
        crash_points(1);
}
END_TEST

/* kill -9 at a random moment of a run that saves every step (alternately async and sync): the
 * newest complete checkpoint verifies and resumes bit for bit. 50 trials (reduced tier: 5); the
 * moment is drawn from a fixed seed, and no assertion depends on where it fell. */
START_TEST(random_kills)
{
    mkroot();
    const int trials = tu_test_small() ? 5 : 50, steps = 24;
    char dir[300], first[340], what[64];
    dl_train_opts u0 = tiny(NULL, steps);
    dl_train_result u;
    ck_assert_msg(dl_train_run(&u0, &u) == DL_OK, "%s", dl_errmsg());
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    int killed = 0, torn = 0;
    for (int t = 0; t < trials; t++) {
        snprintf(dir, sizeof dir, "%s/t%d", root, t);
        snprintf(first, sizeof first, "%s/step-0000001", dir);
        dl_train_opts o = tiny(dir, steps);
        o.ckpt.save_every = 1;
        o.ckpt.sync = t % 2;
        pid_t pid = fork();
        if (pid == 0) {
            dl_train_result x;
            _exit(dl_train_run(&o, &x) == DL_OK ? 0 : 1);
        }
        /* wait for the first complete checkpoint (a condition, not a time), then kill within
         * the next 0-20 ms */
        struct stat sb;
        int st = 0;
        while (stat(first, &sb) != 0 && waitpid(pid, &st, WNOHANG) == 0) usleep(200);
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        usleep((useconds_t)((rng >> 33) % 20000));
        kill(pid, SIGKILL);
        ck_assert_int_eq(waitpid(pid, &st, 0), pid);
        if (!WIFSIGNALED(st))
            continue; /* it finished first: nothing to check */
        killed++;
        torn += count_entries(dir, ".tmp") > 0;
        int step;
        char ck[4096];
        snprintf(what, sizeof what, "kill %d", t);
        ck_assert_msg(dl__ckd_find(dir, ck, sizeof ck) == DL_OK, "%s: %s", what, dl_errmsg());
        char last[32];
        snprintf(last, sizeof last, "step-%07d", steps);
        if (strstr(ck, last)) /* killed after its last save: nothing to resume */
            continue;
        latest_resumes(&o, dir, &u, &step, what);
    }
    printf("random kills: %d of %d trials killed the run, %d during a save (a temporary "
           "left)\n",
           killed, trials, torn);
    ck_assert_int_gt(killed, 0);
    dl_train_result_free(&u);
    rmroot();
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ckpt_save");
    TCase *t = tcase_create("ckpt_save");
    tcase_set_timeout(t, 600);
    tcase_add_test(t, async_equals_sync);
    tcase_add_test(t, disk_full);
    tcase_add_test(t, unwritable_dir);
    tcase_add_test(t, crash_points_async);
    tcase_add_test(t, crash_points_sync);
    tcase_add_test(t, random_kills);
    suite_add_tcase(s, t);
    return tu_run_suite(s);
}
