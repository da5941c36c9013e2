/* Injected faults (--inject-fault, ckpt machine.inject_fault): each kind at a step and at a
 * collective of a named communicator. error and hang fail the run with a message naming the
 * rank and where (hang: the watchdog's, within a 1 s timeout, naming the stuck rank, the
 * operation, its sequence and the rank that never arrived); crash ends the process with status
 * 3 (in a child); slow only delays (the same bits as the run without it). After each failure
 * the last complete checkpoint resumes, bit for bit the uninterrupted run. The parser refuses
 * malformed specs with one line. */
#include "../testutil.h"
#include <check.h>
#include <sys/wait.h>
#include <unistd.h>
#include "distlab/train.h"
#include "core/fault_spec.h"

static char root[256];

static dl_train_opts tiny(const char *dir)
{
    dl_train_opts o;
    dl_train_opts_init(&o);
    o.model.layers = 2;
    o.model.d_model = 16;
    o.model.heads = 2;
    o.model.seq = 8;
    o.layout.dp = 2;
    o.batch.micro = 2;
    o.batch.microbatches = 2;
    o.optim.steps = 6;
    o.optim.warmup = 2;
    o.optim.lr = 1e-2;
    o.eval.windows = 2;
    o.output.log_every = 0;
    o.output.log = NULL;
    o.output.want_params = 1;
    o.machine.timeout_s = 120;
    o.ckpt.dir = dir;
    o.ckpt.save_every = 2;
    o.ckpt.sync = 1; /* each checkpoint complete at its boundary: which one a fault leaves is
                      * known (an async save still in flight when a rank fails is lost) */
    return o;
}

static int same_bits(const dl_train_result *a, const dl_train_result *b)
{
    if (a->nsteps != b->nsteps)
        return 0;
    for (int i = b->ckpt.resumed_from; i < a->nsteps; i++)
        if (memcmp(&a->steps[i].loss, &b->steps[i].loss, sizeof(double)) != 0)
            return 0;
    return memcmp(a->output.params, b->output.params, sizeof(double) * (size_t)a->nparams) == 0;
}

/* The run with `spec` fails with `code`, its message holding each of want[]; the newest
 * complete checkpoint (step `last`) resumes to the uninterrupted run u's bits. */
static void fails_then_resumes(const char *spec, double timeout, int code, const char *const *want,
                               int last, const dl_train_result *u)
{
    char dir[300], cmd[400];
    snprintf(dir, sizeof dir, "%s/f", root);
    dl_train_opts o = tiny(dir);
    o.machine.inject_fault = spec;
    o.machine.timeout_s = timeout;
    dl_train_result a, b;
    ck_assert_int_eq(dl_train_run(&o, &a), code);
    const char *m = dl_errmsg();
    for (int i = 0; want[i]; i++)
        ck_assert_msg(strstr(m, want[i]) != NULL, "%s: '%s' lacks '%s'", spec, m, want[i]);
    dl_train_result_free(&a);
    dl_train_opts r = tiny(NULL);
    r.ckpt.resume = dir;
    ck_assert_msg(dl_train_run(&r, &b) == DL_OK, "%s: resume: %s", spec, dl_errmsg());
    ck_assert_int_eq(b.ckpt.resumed_from, last);
    ck_assert_msg(same_bits(u, &b), "%s: the resume differs from the uninterrupted run", spec);
    dl_train_result_free(&b);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

START_TEST(error_and_hang)
{
    snprintf(root, sizeof root, "/tmp/dl_faults_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(root));
    dl_train_opts p = tiny(NULL);
    dl_train_result u;
    ck_assert_msg(dl_train_run(&p, &u) == DL_OK, "%s", dl_errmsg());
    /* error at step 5: the checkpoint of step 4 is the last */
    const char *const e1[] = {"injected fault", "rank 1 failed step 5", NULL};
    fails_then_resumes("rank=1,at=step:5,kind=error", 120, DL_EUSER, e1, 4, &u);
    /* error before the dp communicator's 7th all-reduce: step 4's first (a step all-reduces
     * the gradients and then the loss over dp) */
    const char *const e2[] = {"rank 0 failed allreduce #7 on dp", NULL};
    fails_then_resumes("rank=0,at=coll:dp:7,kind=error", 120, DL_EUSER, e2, 2, &u);
    /* hang at step 3, and before dp's 9th all-reduce (step 5's first): rank 0's watchdog (1 s)
     * names where it waits and that rank 1 never arrived */
    const char *const h1[] = {"watchdog: rank 0 stuck", "allreduce #5", "never arrived: 1", NULL};
    fails_then_resumes("rank=1,at=step:3,kind=hang", 1, DL_ETIMEOUT, h1, 2, &u);
    const char *const h2[] = {"watchdog: rank 0 stuck", "allreduce #9", "never arrived: 1", NULL};
    fails_then_resumes("rank=1,at=coll:dp:9,kind=hang", 1, DL_ETIMEOUT, h2, 4, &u);
    dl_train_result_free(&u);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* crash: the process exits with status 3 (a child); the checkpoint before it resumes. slow: the
 * same bits, and the step holding the sleep (step 2: dp's 4th all-reduce) took at least its 200 ms (nanosleep's guarantee: a
 * lower bound, not a timing). */
START_TEST(crash_and_slow)
{
    snprintf(root, sizeof root, "/tmp/dl_faults_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(root));
    char dir[300];
    snprintf(dir, sizeof dir, "%s/c", root);
    dl_train_opts p = tiny(NULL), o = tiny(dir);
    dl_train_result u, b, s;
    ck_assert_msg(dl_train_run(&p, &u) == DL_OK, "%s", dl_errmsg());
    o.machine.inject_fault = "rank=1,at=step:4,kind=crash";
    pid_t pid = fork();
    if (pid == 0) {
        dl_train_result x;
        dl_train_run(&o, &x);
        _exit(0);
    }
    int st;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == DL__FAULT_CRASH_STATUS, "status %d", st);
    dl_train_opts r = tiny(NULL);
    r.ckpt.resume = dir;
    ck_assert_msg(dl_train_run(&r, &b) == DL_OK, "%s", dl_errmsg());
    ck_assert_int_eq(b.ckpt.resumed_from, 2);
    ck_assert(same_bits(&u, &b));
    dl_train_opts q = tiny(NULL);
    q.machine.inject_fault = "rank=1,at=coll:dp:4,kind=slow:200";
    ck_assert_msg(dl_train_run(&q, &s) == DL_OK, "%s", dl_errmsg());
    ck_assert(same_bits(&u, &s));
    ck_assert_msg(s.steps[1].ms >= 200, "step 2 took %.1f ms", s.steps[1].ms);
    dl_train_result_free(&u), dl_train_result_free(&b), dl_train_result_free(&s);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* The parser: the forms it takes (each key once, any order) and one-line refusals. */
START_TEST(parser)
{
    dl__fault f;
    ck_assert_int_eq(dl__fault_parse("kind=slow:250,at=coll:tp:7,rank=3", &f), DL_OK);
    ck_assert(f.rank == 3 && f.at == DL__AT_COLL && f.comm == DL__COMM_TP && f.n == 7 &&
              f.kind == DL__FAULT_SLOW && f.ms == 250);
    char t[128];
    dl__fault_text(&f, t, sizeof t);
    ck_assert_str_eq(t, "rank=3,at=coll:tp:7,kind=slow:250");
    ck_assert_int_eq(dl__fault_parse("rank=0,at=step:1,kind=crash", &f), DL_OK);
    ck_assert(f.at == DL__AT_STEP && f.n == 1 && f.kind == DL__FAULT_CRASH);
    static const char *const bad[] = {"",
                                      "rank=0",
                                      "rank=0,at=step:0,kind=error",
                                      "rank=0,at=step:1,kind=error,",
                                      "rank=0,at=step:1,kind=error,rank=1",
                                      "rank=-1,at=step:1,kind=error",
                                      "rank=0x1,at=step:1,kind=error",
                                      "rank=0,at=coll:ep:1,kind=error",
                                      "rank=0,at=coll:dp,kind=error",
                                      "rank=0,at=step:1,kind=slow:",
                                      "rank=0,at=step:1,kind=slow:0",
                                      "rank=0,at=step:1,kind=explode",
                                      "rank=0,at=step:99999999999,kind=hang",
                                      NULL};
    for (int i = 0; bad[i]; i++) {
        ck_assert_msg(dl__fault_parse(bad[i], &f) == DL_EINVAL, "'%s' accepted", bad[i]);
        ck_assert(strstr(dl_errmsg(), "--inject-fault") && !strchr(dl_errmsg(), '\n'));
    }
    /* the library refuses a rank beyond the world */
    dl_train_opts o = tiny(NULL);
    o.machine.inject_fault = "rank=2,at=step:1,kind=error";
    dl_train_result x;
    ck_assert_int_eq(dl_train_run(&o, &x), DL_EINVAL);
    ck_assert_ptr_nonnull(strstr(dl_errmsg(), "rank 2 of 2 ranks"));
    dl_train_result_free(&x);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("faults");
    TCase *t = tcase_create("faults");
    tcase_set_timeout(t, 300);
    tcase_add_test(t, error_and_hang);
    tcase_add_test(t, crash_and_slow);
    tcase_add_test(t, parser);
    suite_add_tcase(s, t);
    return tu_run_suite(s);
}
