/* distlab-bench ckpt load: the load side of full-state checkpoints (docs/PERFORMANCE.md). A run
 * of the library writes a checkpoint of at least --mib MiB of state (parameters and AdamW's two
 * moments, f32) under dp 2 with ZeRO-1 (two files: the moments sharded), then one target rank
 * holding the whole model, and the two ranks of tp 2 one after the other, read it through the
 * resharding load (io/ckdir_map.h: runs intersected, coalesced preads), against `dd` reading
 * the same files to /dev/null in the same run, cold (the files' pages dropped with
 * posix_fadvise, so both read the device) and warm (the page cache). Medians over trials. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "distlab.h"
#include "core/stats.h"
#include "core/topo.h"
#include "io/ckdir.h"
#include "io/ckdir_map.h"
#include "cli.h"
#include "bench_util.h"

typedef struct lcfg {
    int mib, trials;
    const char *dir;
    bu_common o;
} lcfg;

static void usage(FILE *f)
{
    /* clang-format off */
    fprintf(f,
"Usage: distlab-bench ckpt load [OPTIONS]\n"
"\n"
"Full-state checkpoint load throughput. Writes a checkpoint (dp 2, ZeRO-1, f32, 2 layers, the\n"
"width chosen for --mib MiB of state: parameters and AdamW's m and v) under --dir, then reads it\n"
"as one rank holding the whole model and as tp 2's two ranks in turn (the resharding load:\n"
"each reads only the byte ranges of its pieces), against dd bs=4M reading the same files to\n"
"/dev/null. Cold: the files' pages dropped (posix_fadvise DONTNEED) before each read; warm: from\n"
"the page cache. GB/s = 10^9 bytes per second; the ratio is load / dd (the goal: >= 0.5 cold).\n"
"\n"
"Options:\n"
"  --mib N       state size in MiB, at least (default 256; --quick 16)\n"
"  --trials N    reads per point, the median reported (default 3)\n"
"  --dir DIR     where the checkpoint goes (default $TMPDIR or /tmp; removed afterwards)\n"
"  --quick       --mib 16\n"
"  --csv         CSV rows\n"
"  --json        JSON Lines: one row per (reader, cache), schema distlab/1\n"
"  -h, --help    this help\n");
    /* clang-format on */
}

static int parse(int argc, char **argv, lcfg *c)
{
    enum { O_MIB = 256, O_TRIALS, O_DIR };
    static const struct option lo[] = {{"mib", required_argument, NULL, O_MIB},
                                       {"trials", required_argument, NULL, O_TRIALS},
                                       {"dir", required_argument, NULL, O_DIR},
                                       BU_LONGOPTS_END};
    int opt;
    BU_FOR_EACH_OPT(opt, "ckpt load", argc, argv, lo, &c->o, usage)
    {
        if (opt == O_MIB && cli_parse_int("--mib", optarg, 1, 1 << 16, &c->mib))
            return -1;
        if (opt == O_TRIALS && cli_parse_int("--trials", optarg, 1, 100, &c->trials))
            return -1;
        if (opt == O_DIR)
            c->dir = optarg;
    }
    if (opt < 0)
        return -1;
    if (!c->mib)
        c->mib = c->o.quick ? 16 : 256;
    if (!c->trials)
        c->trials = 3;
    return 0;
}

/* the checkpoint: one step of a 2-layer model whose state (3 x 4 bytes a parameter) is at least
 * mib MiB, saved at its end; its directory in out */
static int write_checkpoint(const char *root, int mib, char *out, size_t n)
{
    dl_train_opts o;
    dl_train_opts_init(&o);
    int C = 64;
    while (12.0 * (24.0 * C * C + 320.0 * C) < mib * 1048576.0) C += 64;
    o.model.layers = 2, o.model.d_model = C, o.model.heads = 8, o.model.seq = 64;
    o.layout.dp = 2, o.zero.stage = 1;
    o.batch.global = 2, o.batch.micro = 1;
    o.optim.steps = 1;
    o.eval.windows = 1;
    o.output.log_every = 0;
    o.ckpt.dir = root, o.ckpt.save_at_end = 1;
    dl_train_result r;
    int rc = dl_train_run(&o, &r);
    if (rc == DL_OK)
        dl_train_result_free(&r);
    snprintf(out, n, "%s/step-0000001", root);
    return rc;
}

/* every listed file's pages dropped (clean after the save's fsync) */
static void drop_pages(const char *dir, json_t *m)
{
    json_t *f;
    size_t i;
    char p[4200];
    json_array_foreach(json_object_get(m, "files"), i, f)
    {
        snprintf(p, sizeof p, "%s/%s", dir, json_string_value(json_object_get(f, "name")));
        int fd = open(p, O_RDONLY | O_CLOEXEC);
        if (fd >= 0)
            posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), close(fd);
    }
}

/* seconds for dd to read every listed file; bytes in *bytes */
static double dd_read(const char *dir, json_t *m, double *bytes)
{
    json_t *f;
    size_t i;
    char cmd[4400];
    double t0 = dl_now_ns() * 1e-9;
    *bytes = 0;
    json_array_foreach(json_object_get(m, "files"), i, f)
    {
        snprintf(cmd, sizeof cmd, "dd if='%s/%s' of=/dev/null bs=4M status=none", dir,
                 json_string_value(json_object_get(f, "name")));
        if (system(cmd) != 0)
            return -1;
        *bytes += (double)json_integer_value(json_object_get(f, "bytes"));
    }
    return dl_now_ns() * 1e-9 - t0;
}

/* a reader: tp rank r of tp, the whole model's parameters and one moments unit of all of them */
typedef struct reader {
    dl_gpt_layout *l;
    dl__ckd_runs dst;
    void *buf[DL_CKD_KINDS];
    double bytes;
} reader;

static int reader_init(reader *rd, const dl_gpt_layout *whole, int tp, int r)
{
    memset(rd, 0, sizeof *rd);
    int rc = dl_gpt_layout_create(&whole->cfg, tp, r, &rd->l);
    if (rc)
        return rc;
    size_t n = rd->l->numel;
    for (int k = 0; k < DL_CKD_KINDS; k++) {
        dl__ckd_flat_runs(&rd->dst, whole, rd->l, k, 0, n, 0, 1, 4, -1, 0);
        if (!(rd->buf[k] = malloc(n * 4)))
            return dl_error(DL_ENOMEM, "ckpt load: out of memory");
        memset(rd->buf[k], 0, n * 4); /* touched: the read measures the read, not page faults */
    }
    rd->bytes = 3.0 * 4.0 * (double)n;
    return rd->dst.nomem ? dl_error(DL_ENOMEM, "ckpt load: out of memory") : DL_OK;
}

static void reader_free(reader *rd)
{
    dl_gpt_layout_destroy(rd->l);
    dl__ckd_runs_free(&rd->dst);
    for (int k = 0; k < DL_CKD_KINDS; k++) free(rd->buf[k]);
}

/* seconds for the tp ranks to load their pieces one after another (the sources' runs built
 * from the manifest as each rank does); bytes loaded in *bytes */
static double load(const char *dir, json_t *m, const dl_gpt_layout *whole, reader *rd, int tp,
                   double *bytes)
{
    double t0 = dl_now_ns() * 1e-9;
    *bytes = 0;
    for (int r = 0; r < tp; r++) {
        dl__ckd_runs src;
        int rc = dl__ckd_source_runs(dir, m, whole, &src);
        if (rc == DL_OK)
            rc = dl__ckd_fill(dir, m, whole, &src, &rd[r].dst, rd[r].buf);
        dl__ckd_runs_free(&src);
        if (rc)
            return -1;
        *bytes += rd[r].bytes;
    }
    return dl_now_ns() * 1e-9 - t0;
}

static void row(const lcfg *c, const char *who, const char *cache, double bytes, double t,
                double dd)
{
    double gbs = bytes / t * 1e-9, ddgbs = dd;
    if (c->o.json) {
        bu_json_begin(stdout, "ckpt", "row");
        bu_json_str(stdout, "side", "load");
        bu_json_str(stdout, "reader", who);
        bu_json_str(stdout, "cache", cache);
        bu_json_num(stdout, "bytes", bytes);
        bu_json_num(stdout, "seconds", t);
        bu_json_num(stdout, "gbs", gbs);
        bu_json_num(stdout, "dd_gbs", ddgbs);
        bu_json_num(stdout, "ratio", gbs / ddgbs);
        bu_json_end(stdout);
    } else if (c->o.csv)
        printf("load,%s,%s,%.0f,%.6f,%.3f,%.3f,%.3f\n", who, cache, bytes, t, gbs, ddgbs,
               gbs / ddgbs);
    else
        printf("  %-26s %-5s %9.1f MiB %8.3f s %7.2f GB/s   dd %7.2f GB/s   ratio %.2f\n", who,
               cache, bytes / 1048576.0, t, gbs, ddgbs, gbs / ddgbs);
}

/* the trials of one (reader, cache) point, alternating dd and the load */
static int point(const lcfg *c, const char *dir, json_t *m, const dl_gpt_layout *whole, reader *rd,
                 int tp, int cold, const char *who, double *worst)
{
    double *td = calloc((size_t)c->trials, sizeof *td), *tl = calloc((size_t)c->trials, sizeof *tl);
    double db = 0, lb = 0;
    int rc = td && tl ? 0 : -1;
    for (int i = 0; rc == 0 && i < c->trials; i++) {
        if (cold)
            drop_pages(dir, m);
        td[i] = dd_read(dir, m, &db);
        if (cold)
            drop_pages(dir, m);
        tl[i] = load(dir, m, whole, rd, tp, &lb);
        rc = td[i] < 0 || tl[i] < 0 ? -1 : 0;
    }
    if (rc == 0) {
        double t = dl__median(tl, (size_t)c->trials), dd = db / dl__median(td, (size_t)c->trials);
        row(c, who, cold ? "cold" : "warm", lb, t, dd * 1e-9);
        if (cold && lb / t / dd < *worst)
            *worst = lb / t / dd;
    }
    free(td), free(tl);
    return rc;
}

/* the machine and the checkpoint: a config record (JSON), '#' lines (text), a header (CSV) */
static void header(const lcfg *c, const char *dir, json_t *m, const dl_gpt_layout *whole)
{
    size_t nf = json_array_size(json_object_get(m, "files"));
    if (c->o.csv) {
        printf("side,reader,cache,bytes,seconds,gbs,dd_gbs,ratio\n");
        return;
    }
    dl_topo *topo = bu_topo_load("ckpt");
    if (c->o.json) {
        bu_json_begin(stdout, "ckpt", "config");
        bu_machine_json(stdout, topo);
        bu_json_str(stdout, "side", "load");
        bu_json_int(stdout, "files", (long long)nf);
        bu_json_int(stdout, "d_model", whole->cfg.d_model);
        bu_json_int(stdout, "trials", c->trials);
        bu_json_end(stdout);
    } else {
        bu_machine_text(stdout, topo);
        printf("# checkpoint: %s, %zu files, dp 2 ZeRO-1, f32, d-model %d\n", dir, nf,
               whole->cfg.d_model);
    }
    dl_topo_destroy(topo);
}

int bench_ckpt_load_main(int argc, char **argv)
{
    lcfg c = {0};
    if (parse(argc, argv, &c))
        return CLI_EXIT_USAGE;
    char root[4096], dir[4200], cmd[4400];
    const char *base = c.dir ? c.dir : getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(root, sizeof root, "%s/distlab-bench-ckpt.XXXXXX", base);
    if (!mkdtemp(root)) {
        cli_error("ckpt load: cannot create a directory under '%s'", base);
        return CLI_EXIT_USAGE;
    }
    json_t *m = NULL;
    dl_gpt_layout *whole = NULL;
    reader one, two[2];
    memset(&one, 0, sizeof one), memset(two, 0, sizeof two);
    int rc = write_checkpoint(root, c.mib, dir, sizeof dir);
    if (rc == DL_OK)
        rc = dl__ckd_open(dir, 1, &m);
    if (rc == DL_OK)
        rc = dl__ckd_model(m, dir, &whole);
    int ok = rc == DL_OK && reader_init(&one, whole, 1, 0) == DL_OK &&
             reader_init(&two[0], whole, 2, 0) == DL_OK &&
             reader_init(&two[1], whole, 2, 1) == DL_OK;
    if (ok)
        header(&c, dir, m, whole);
    double worst = 1e300;
    for (int cold = 1; ok && cold >= 0; cold--)
        ok = point(&c, dir, m, whole, &one, 1, cold, "one rank (whole model)", &worst) == 0 &&
             point(&c, dir, m, whole, two, 2, cold, "tp 2 (rank by rank)", &worst) == 0;
    if (c.o.json) {
        bu_json_begin(stdout, "ckpt", "summary");
        bu_json_num(stdout, "worst_cold_ratio", worst);
        bu_json_str(stdout, "status", ok ? "ok" : "failed");
        bu_json_end(stdout);
    } else if (ok && !c.o.csv)
        printf("# worst cold load / dd: %.2f (the goal: at least 0.5)\n", worst);
    if (!ok)
        cli_error("ckpt load: %s", dl_errmsg());
    reader_free(&one), reader_free(&two[0]), reader_free(&two[1]);
    json_decref(m);
    dl_gpt_layout_destroy(whole);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0)
        cli_error("ckpt load: could not remove '%s'", root);
    return ok ? CLI_EXIT_OK : CLI_EXIT_FAIL;
}
