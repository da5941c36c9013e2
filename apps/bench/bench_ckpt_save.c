/* distlab-bench ckpt: full-state checkpoints' save side. (1) Save throughput: a one-rank model
 * whose state (parameters and AdamW's moments) is at least --mib MiB, saved synchronously after
 * one step; the bytes over the save's write time (the file written with its CRC32C and fsync'd,
 * the manifest, the rename) against `dd if=/dev/zero bs=1M conv=fsync` writing as many bytes to
 * the same directory, alternated, medians. (2) Training with asynchronous checkpoints every
 * --every steps against the same run without, alternated: the summed stall against the training
 * time, the writers' CPU time, tokens/s of each. */
#define _GNU_SOURCE
#include <ftw.h>
#include <getopt.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "distlab.h"
#include "distlab/train.h"
#include "core/blas.h"
#include "core/stats.h"
#include "cli.h"
#include "bench_util.h"
#include "bench_ckpt.h"

typedef struct ccfg {
    const char *dir;
    int mib, steps, every, pairs;
} ccfg;

static void usage(FILE *f)
{
    /* clang-format off */
    fprintf(f,
"Usage: distlab-bench ckpt save [OPTIONS]\n"
"\n"
"Full-state checkpoints, the save side (docs/CHECKPOINTS.md).\n"
"1. Save throughput: a one-rank model whose state is at least --mib MiB, saved with\n"
"   --ckpt-sync after one step: the bytes over the write time (file, CRC32C, fsync, manifest,\n"
"   rename), against dd if=/dev/zero bs=1M conv=fsync of as many bytes in the same directory;\n"
"   alternated, --pairs times, medians. Goal: at least 50%% of dd.\n"
"2. The benchmark model (--layers 4 --d-model 256 --heads 4 --seq 128 --micro-batch 8, dp 2)\n"
"   for --steps steps with asynchronous checkpoints every --every steps, against the same run\n"
"   without, alternated --pairs times: the summed stall over the training time (goal: at most\n"
"   2%%), the writers' CPU time, tokens/s of each (medians).\n"
"\n"
"Options:\n"
"  --dir DIR     where to write (default: the current directory), in a directory of the\n"
"                benchmark's own that it removes after\n"
"  --mib N       the saved state's least size (default 256)\n"
"  --steps N     training steps of part 2 (default 200)\n"
"  --every N     a checkpoint every N steps (default 50)\n"
"  --pairs N     alternations (default 3)\n"
"  --quick       --mib 16 --steps 20 --every 10 --pairs 1 (a smoke test)\n"
"  -h, --help    this help\n");
    /* clang-format on */
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *f)
{
    (void)sb, (void)flag, (void)f;
    return remove(p);
}

static void rm_tree(const char *p) { nftw(p, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

/* dd writing mib MiB to dir/dd.bin with conv=fsync: its wall seconds (-1 when it failed) */
static double dd_seconds(const char *dir, int mib)
{
    char of[4200], count[32];
    snprintf(of, sizeof of, "of=%s/dd.bin", dir);
    snprintf(count, sizeof count, "count=%d", mib);
    char *av[] = {"dd", "if=/dev/zero", of, "bs=1M", count, "conv=fsync", "status=none", NULL};
    pid_t pid;
    uint64_t t0 = dl_now_ns();
    int st;
    if (posix_spawnp(&pid, "dd", NULL, NULL, av, environ) != 0 || waitpid(pid, &st, 0) != pid ||
        !WIFEXITED(st) || WEXITSTATUS(st) != 0)
        return -1;
    double s = (double)(dl_now_ns() - t0) / 1e9;
    snprintf(of, sizeof of, "%s/dd.bin", dir);
    unlink(of);
    return s;
}

/* 4 layers, 4 heads, d_model dm, seq bytes, micro-batches of mb, one per rank; quiet */
static dl_train_opts quiet_opts(int dm, int seq, int mb)
{
    dl_train_opts o;
    dl_train_opts_init(&o);
    o.model.layers = 4;
    o.model.heads = 4;
    o.model.d_model = dm;
    o.model.seq = seq;
    o.batch.micro = mb;
    o.batch.microbatches = 1;
    o.output.log = NULL;
    o.output.log_every = 0;
    o.eval.windows = 1;
    o.eval.every = 0;
    return o;
}

/* One synchronous save of a one-rank state of at least mib MiB: its bytes and write ms. */
static int one_save(const ccfg *c, uint64_t *bytes, double *ms)
{
    char d[4200];
    snprintf(d, sizeof d, "%s/save", c->dir);
    /* f32 state: 12 bytes a parameter (weights, m, v); 12 L d^2 of the 4 layers dominate */
    int dm = 64;
    while (12.0 * 12.0 * 4 * dm * dm < (double)c->mib * 1048576.0) dm += 64;
    dl_train_opts o = quiet_opts(dm, 16, 1);
    o.optim.steps = 1;
    o.ckpt.dir = d;
    o.ckpt.save_at_end = 1;
    o.ckpt.sync = 1;
    dl_train_result r;
    int rc = dl_train_run(&o, &r);
    if (rc == DL_OK && r.ckpt.nrecords == 1 && r.ckpt.save[0].ok) {
        *bytes = r.ckpt.save[0].bytes;
        *ms = r.ckpt.save[0].write_ms;
    } else if (rc == DL_OK) {
        rc = dl_error(DL_ESYS, "the save failed");
    }
    dl_train_result_free(&r);
    rm_tree(d);
    return rc;
}

/* One run of the benchmark model, with checkpoints every c->every steps (ckpt) or none. */
typedef struct crun {
    double wall_s, train_ms, stall_ms, cpu_ms, tok_s_median;
    int saves;
} crun;

static int bench_run(const ccfg *c, int ckpt, crun *out)
{
    dl_train_opts o = quiet_opts(256, 128, 8);
    char d[4200];
    snprintf(d, sizeof d, "%s/train", c->dir);
    o.layout.dp = 2;
    o.optim.steps = c->steps;
    if (ckpt) {
        o.ckpt.dir = d;
        o.ckpt.save_every = c->every;
        o.ckpt.keep = 1;
    }
    dl_train_result r;
    memset(out, 0, sizeof *out);
    uint64_t t0 = dl_now_ns();
    int rc = dl_train_run(&o, &r);
    out->wall_s = (double)(dl_now_ns() - t0) / 1e9;
    if (rc == DL_OK) {
        for (int i = 0; i < r.nsteps; i++) out->train_ms += r.steps[i].ms;
        for (int i = 0; i < r.ckpt.nrecords; i++) {
            out->stall_ms += r.ckpt.save[i].stall_ms;
            out->cpu_ms += r.ckpt.save[i].writer_cpu_ms;
            out->saves += r.ckpt.save[i].ok;
        }
        out->train_ms += out->stall_ms; /* the steps' times leave the boundaries out */
        out->tok_s_median = r.speed.tokens_per_s;
    }
    dl_train_result_free(&r);
    rm_tree(d);
    return rc;
}

static int parse(int argc, char **argv, ccfg *c)
{
    static const struct option lo[] = {{"dir", 1, 0, 'd'},   {"mib", 1, 0, 'm'},
                                       {"steps", 1, 0, 's'}, {"every", 1, 0, 'e'},
                                       {"pairs", 1, 0, 'p'}, {"quick", 0, 0, 'q'},
                                       {"help", 0, 0, 'h'},  {0, 0, 0, 0}};
    int ch, bad = 0;
    *c = (ccfg){".", 256, 200, 50, 3};
    opterr = 0;
    optind = 1;
    while (!bad && (ch = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (ch) {
        case 'd': c->dir = optarg; break;
        case 'm': bad = cli_parse_int("--mib", optarg, 1, 1 << 20, &c->mib); break;
        case 's': bad = cli_parse_int("--steps", optarg, 1, 1 << 20, &c->steps); break;
        case 'e': bad = cli_parse_int("--every", optarg, 1, 1 << 20, &c->every); break;
        case 'p': bad = cli_parse_int("--pairs", optarg, 1, 100, &c->pairs); break;
        case 'q': *c = (ccfg){c->dir, 16, 20, 10, 1}; break;
        case 'h': usage(stdout); return 1;
        default: cli_error("ckpt: unknown option '%s' (see --help)", argv[optind - 1]); return -1;
        }
    }
    if (!bad && optind < argc) {
        cli_error("ckpt: unexpected argument '%s' (see --help)", argv[optind]);
        bad = -1;
    }
    return bad ? -1 : 0;
}

/* Part 1: save throughput against dd. */
static int throughput(const ccfg *c)
{
    double save[100], dd[100];
    uint64_t bytes = 0;
    for (int p = 0; p < c->pairs; p++) {
        double ms = 0, s;
        if (one_save(c, &bytes, &ms))
            return cli_error("ckpt: the save: %s", dl_errmsg()), -1;
        if ((s = dd_seconds(c->dir, (int)((bytes + 1048575) >> 20))) < 0)
            return cli_error("ckpt: dd failed in '%s'", c->dir), -1;
        save[p] = (double)bytes / (ms / 1e3) / 1e6;
        dd[p] = (double)((bytes + 1048575) >> 20 << 20) / s / 1e6;
        printf("  pair %d: save %.0f MB/s (%.1f MiB in %.0f ms), dd conv=fsync %.0f MB/s\n", p + 1,
               save[p], cli_mib((double)bytes), ms, dd[p]);
    }
    double ms_ = dl__median(save, (size_t)c->pairs), md = dl__median(dd, (size_t)c->pairs);
    printf("save throughput %.0f MB/s, dd %.0f MB/s (medians of %d): %.0f%% of dd (goal >= "
           "50%%): %s\n",
           ms_, md, c->pairs, 100 * ms_ / md, ms_ >= 0.5 * md ? "PASS" : "FAIL");
    return DL_OK;
}

/* Part 2: asynchronous checkpoints during training, against none. */
static int async_cost(const ccfg *c)
{
    double with[100], without[100], stall[100], cpu[100];
    for (int p = 0; p < c->pairs; p++) {
        crun a, b;
        if (bench_run(c, 0, &b) || bench_run(c, 1, &a))
            return cli_error("ckpt: the training run: %s", dl_errmsg()), -1;
        double tok = (double)c->steps * 2 * 8 * 128;
        without[p] = tok / b.wall_s, with[p] = tok / a.wall_s;
        stall[p] = 100 * a.stall_ms / a.train_ms, cpu[p] = a.cpu_ms;
        printf("  pair %d: without %.0f tokens/s (median step %.0f), with %d checkpoints %.0f "
               "tokens/s (median step %.0f); stall %.1f ms of %.0f ms training (%.2f%%), writer "
               "CPU %.0f ms\n",
               p + 1, without[p], b.tok_s_median, a.saves, with[p], a.tok_s_median, a.stall_ms,
               a.train_ms, stall[p], a.cpu_ms);
    }
    size_t n = (size_t)c->pairs;
    double mw = dl__median(with, n), mo = dl__median(without, n), ms = dl__median(stall, n);
    printf("async checkpoints every %d of %d steps: summed stall %.2f%% of the training time "
           "(goal <= 2%%): %s; writer CPU %.0f ms a run; tokens/s %.0f with, %.0f without "
           "(%.1f%%; medians of %d, whole runs)\n",
           c->every, c->steps, ms, ms <= 2 ? "PASS" : "FAIL", dl__median(cpu, n), mw, mo,
           100 * (mw / mo - 1), c->pairs);
    return DL_OK;
}

int bench_ckpt_save_main(int argc, char **argv)
{
    ccfg c;
    int p = parse(argc, argv, &c);
    if (p)
        return p > 0 ? CLI_EXIT_OK : CLI_EXIT_USAGE;
    static char work[4200];
    snprintf(work, sizeof work, "%s/.distlab-bench-ckpt.%ld", c.dir, (long)getpid());
    if (mkdir(work, 0755)) {
        cli_error("ckpt: cannot create '%s'", work);
        return CLI_EXIT_USAGE;
    }
    printf("distlab-bench ckpt: in %s; BLAS kernel %s\n", c.dir, dl_blas_loaded_kernel());
    c.dir = work;
    int rc = throughput(&c);
    if (rc == DL_OK)
        rc = async_cost(&c);
    rm_tree(c.dir);
    return rc ? CLI_EXIT_FAIL : CLI_EXIT_OK;
}
