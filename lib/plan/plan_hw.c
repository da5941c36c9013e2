/* The planner's hardware profiles: the presets (lecture 17 §1.1), their checks, and the
 * key = value profile files distlab-plan calibrate writes and every subcommand reads. */
#define _GNU_SOURCE
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "distlab/error.h"
#include "distlab/plan.h"
#include "io/path.h"

/* ---------------------------------------------------------------------------------------- */
/* Hardware                                                                                  */

/* Dense BF16 (half the slides' sparse figures), as lecture §1.1 lists them; H100 is code 01's
 * (3.35 TB/s SXM, NVLink 4: 450 GB/s per direction, one 400 Gb/s NIC per GPU: 50 GB/s).
 * A100: NVLink 3 300 GB/s per direction, HDR 200 Gb/s = 25 GB/s. B200: NVLink 5 900 GB/s per
 * direction, 800 Gb/s = 100 GB/s, 192 GB (the slides' "only 192 GB"). MFU 0.40 is code 01's. */
static const dl_plan_hw hw_presets[] = {
    {"a100", 312e12, 0.40, 80e9, 2.039e12, 300e9, 25e9, 0.0, 0.0, 8, 0, 0.0, 0.0, 0.0, 0.0, 0.0,
     0.0},
    {"h100", 989e12, 0.40, 80e9, 3.35e12, 450e9, 50e9, 0.0, 0.0, 8, 0, 0.0, 0.0, 0.0, 0.0, 0.0,
     0.0},
    {"b200", 2250e12, 0.40, 192e9, 8e12, 900e9, 100e9, 0.0, 0.0, 8, 0, 0.0, 0.0, 0.0, 0.0, 0.0,
     0.0},
};
#define N_HW_PRESETS ((int)(sizeof hw_presets / sizeof hw_presets[0]))

const char *dl_plan_hw_preset_name(int i)
{
    return (i >= 0 && i < N_HW_PRESETS) ? hw_presets[i].name : NULL;
}

static int streq_nocase(const char *a, const char *b)
{
    for (; *a && *b; a++, b++)
        if (tolower((unsigned char)*a) != tolower((unsigned char)*b))
            return 0;
    return *a == *b;
}

int dl_plan_hw_preset(const char *name, dl_plan_hw *hw)
{
    if (name == NULL || hw == NULL)
        return dl_error(DL_EINVAL, "hardware preset: null argument");
    for (int i = 0; i < N_HW_PRESETS; i++) {
        if (streq_nocase(name, hw_presets[i].name)) {
            *hw = hw_presets[i];
            return DL_OK;
        }
    }
    return dl_error(DL_EINVAL,
                    "unknown hardware preset '%s' (presets: a100, h100, b200, or a profile file)",
                    name);
}

int dl_plan_hw_check(const dl_plan_hw *hw)
{
    if (hw == NULL)
        return dl_error(DL_EINVAL, "hardware: null");
    if (!(hw->flops > 0) || !(hw->mem_bytes > 0) || !(hw->intra_bw > 0) || !(hw->inter_bw > 0))
        return dl_error(DL_EINVAL,
                        "hardware %s: flops, memory, NVLink and InfiniBand bandwidth must be "
                        "positive",
                        hw->name);
    if (!(hw->mfu > 0) || hw->mfu > 1)
        return dl_error(DL_EINVAL, "hardware %s: mfu %g is not in (0, 1]", hw->name, hw->mfu);
    if (hw->gpus_per_node <= 0)
        return dl_error(DL_EINVAL, "hardware %s: GPUs per node must be positive", hw->name);
    if (hw->hbm_bw < 0 || hw->intra_lat < 0 || hw->inter_lat < 0)
        return dl_error(DL_EINVAL, "hardware %s: bandwidths and latencies cannot be negative",
                        hw->name);
    return DL_OK;
}

double dl_plan_ops_per_byte(const dl_plan_hw *hw)
{
    return (hw && hw->intra_bw > 0) ? hw->flops / (2.0 * hw->intra_bw) : 0.0;
}

enum {
    K_NAME,
    K_FLOPS,
    K_MFU,
    K_MEM,
    K_HBM,
    K_INTRA,
    K_INTER,
    K_INTRA_LAT,
    K_INTER_LAT,
    K_GPN,
    K_VERSION,
    K_RANKS,
    K_FLOPS1,
    K_P2P_BW,
    K_P2P_LAT,
    K_NONGEMM,
    K_FIXED,
    K_NGCONT,
    K_COUNT
};
static const char *const hw_keys[K_COUNT] = {"name",
                                             "flops",
                                             "mfu",
                                             "mem_bytes",
                                             "hbm_bw",
                                             "intra_bw",
                                             "inter_bw",
                                             "intra_lat",
                                             "inter_lat",
                                             "gpus_per_node",
                                             "distlab-hw-profile",
                                             "ranks",
                                             "flops_alone",
                                             "p2p_bw",
                                             "p2p_lat",
                                             "nongemm_ratio",
                                             "sync_cost",
                                             "nongemm_contention"};

static char *trim(char *s)
{
    while (isspace((unsigned char)*s)) s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1])) *--e = '\0';
    return s;
}

int dl_plan_hw_parse(const char *text, const char *origin, dl_plan_hw *hw)
{
    if (text == NULL || hw == NULL)
        return dl_error(DL_EINVAL, "hardware profile: null argument");
    if (origin == NULL)
        origin = "hardware profile";
    dl_plan_hw h;
    memset(&h, 0, sizeof h);
    h.mfu = 1.0; /* a measured profile's flops is what a step achieves */
    snprintf(h.name, sizeof h.name, "profile");
    int seen[K_COUNT] = {0};
    int lineno = 0;
    const char *p = text;
    while (*p) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        lineno++;
        char line[512];
        if (len >= sizeof line)
            return dl_error(DL_EINVAL, "%s:%d: line too long", origin, lineno);
        memcpy(line, p, len);
        line[len] = '\0';
        p = nl ? nl + 1 : p + len;
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        char *s = trim(line);
        if (*s == '\0')
            continue;
        char *eq = strchr(s, '=');
        if (eq == NULL)
            return dl_error(DL_EINVAL, "%s:%d: expected 'key = value'", origin, lineno);
        *eq = '\0';
        char *key = trim(s), *val = trim(eq + 1);
        int k = -1;
        for (int i = 0; i < K_COUNT; i++)
            if (strcmp(key, hw_keys[i]) == 0)
                k = i;
        if (k < 0)
            return dl_error(DL_EINVAL, "%s:%d: unknown key '%s'", origin, lineno, key);
        if (seen[k])
            return dl_error(DL_EINVAL, "%s:%d: key '%s' given twice", origin, lineno, key);
        seen[k] = 1;
        if (*val == '\0')
            return dl_error(DL_EINVAL, "%s:%d: key '%s' has no value", origin, lineno, key);
        if (k == K_NAME) {
            snprintf(h.name, sizeof h.name, "%s", val);
            continue;
        }
        char *end = NULL;
        errno = 0;
        double x = strtod(val, &end);
        if (end == val || *end != '\0' || errno == ERANGE || !isfinite(x) || x < 0)
            return dl_error(DL_EINVAL, "%s:%d: %s: '%s' is not a non-negative number", origin,
                            lineno, key, val);
        switch (k) {
        case K_FLOPS: h.flops = x; break;
        case K_MFU: h.mfu = x; break;
        case K_MEM: h.mem_bytes = x; break;
        case K_HBM: h.hbm_bw = x; break;
        case K_INTRA: h.intra_bw = x; break;
        case K_INTER: h.inter_bw = x; break;
        case K_INTRA_LAT: h.intra_lat = x; break;
        case K_INTER_LAT: h.inter_lat = x; break;
        case K_GPN:
        case K_RANKS: /* counts: whole numbers */
            if (x != floor(x) || x < 1 || x > 1e6)
                return dl_error(DL_EINVAL, "%s:%d: %s: '%s' is not a positive integer", origin,
                                lineno, key, val);
            *(k == K_GPN ? &h.gpus_per_node : &h.ranks) = (int)x;
            break;
        case K_FLOPS1: h.flops_alone = x; break;
        case K_P2P_BW: h.p2p_bw = x; break;
        case K_P2P_LAT: h.p2p_lat = x; break;
        case K_NONGEMM: h.nongemm_ratio = x; break;
        case K_FIXED: h.sync_cost = x; break;
        case K_NGCONT: h.nongemm_contention = x; break;
        case K_VERSION:
            if (x != 1)
                return dl_error(DL_EINVAL, "%s:%d: profile format version %s (this build reads 1)",
                                origin, lineno, val);
            break;
        default: break;
        }
    }
    static const int required[] = {K_FLOPS, K_MEM, K_INTRA, K_INTER, K_GPN};
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++)
        if (!seen[required[i]])
            return dl_error(DL_EINVAL, "%s: missing key '%s'", origin, hw_keys[required[i]]);
    int st = dl_plan_hw_check(&h);
    if (st != DL_OK)
        return dl_error(st, "%s: %s", origin, dl_errmsg());
    *hw = h;
    return DL_OK;
}

int dl_plan_hw_load(const char *path, dl_plan_hw *hw)
{
    if (path == NULL || hw == NULL)
        return dl_error(DL_EINVAL, "hardware profile: null argument");
    int fd;
    if (dl_path_open_input(path, "hardware profile", &fd) != DL_OK)
        return DL_EINVAL;
    FILE *f = fdopen(fd, "r");
    if (f == NULL) {
        close(fd);
        return dl_error(DL_ESYS, "hardware profile %s: %s", path, strerror(errno));
    }
    /* Profiles are a dozen lines; 64 KiB is far more than any legitimate one. */
    size_t cap = 65536, n = 0;
    char *buf = malloc(cap + 1);
    if (buf == NULL) {
        fclose(f);
        return dl_error(DL_ENOMEM, "hardware profile %s: out of memory", path);
    }
    n = fread(buf, 1, cap, f);
    int err = ferror(f), more = !feof(f) && fgetc(f) != EOF;
    fclose(f);
    if (err || more) {
        free(buf);
        return dl_error(DL_EINVAL, "hardware profile %s: %s", path,
                        err ? "read error" : "larger than 64 KiB, not a profile");
    }
    buf[n] = '\0';
    if (memchr(buf, '\0', n) != NULL) {
        free(buf);
        return dl_error(DL_EINVAL, "hardware profile %s: binary file", path);
    }
    int st = dl_plan_hw_parse(buf, path, hw);
    free(buf);
    return st;
}

int dl_plan_hw_write(FILE *f, const dl_plan_hw *hw)
{
    if (f == NULL || hw == NULL)
        return dl_error(DL_EINVAL, "hardware profile: null argument");
    int r = fprintf(f,
                    "# distlab hardware profile (docs/PLANNER.md); bytes, seconds, FLOP/s\n"
                    "distlab-hw-profile = 1\n"
                    "name = %s\n"
                    "flops = %.6g          # FLOP/s per GPU\n"
                    "mfu = %.6g            # fraction of flops a training step achieves\n"
                    "mem_bytes = %.6g\n"
                    "hbm_bw = %.6g         # bytes/s\n"
                    "intra_bw = %.6g       # bytes/s per GPU per direction inside a node\n"
                    "inter_bw = %.6g       # bytes/s per GPU per direction between nodes\n"
                    "intra_lat = %.6g      # s per hop\n"
                    "inter_lat = %.6g      # s per hop\n"
                    "gpus_per_node = %d\n",
                    hw->name, hw->flops, hw->mfu, hw->mem_bytes, hw->hbm_bw, hw->intra_bw,
                    hw->inter_bw, hw->intra_lat, hw->inter_lat, hw->gpus_per_node);
    if (r >= 0 && hw->ranks > 0)
        r = fprintf(f, "ranks = %d             # ranks measured at once\n", hw->ranks);
    if (r >= 0 && hw->flops_alone > 0)
        r = fprintf(f, "flops_alone = %.6g    # GEMM FLOP/s of one rank alone\n", hw->flops_alone);
    if (r >= 0 && hw->p2p_bw > 0)
        r = fprintf(f, "p2p_bw = %.6g         # bytes/s, dl_send/dl_recv\n", hw->p2p_bw);
    if (r >= 0 && hw->p2p_lat > 0)
        r = fprintf(f, "p2p_lat = %.6g        # s per message\n", hw->p2p_lat);
    if (r >= 0 && hw->nongemm_ratio > 0)
        r = fprintf(f, "nongemm_ratio = %.6g  # non-GEMM s per GEMM s of a training step\n",
                    hw->nongemm_ratio);
    if (r >= 0 && hw->sync_cost > 0)
        r = fprintf(f, "sync_cost = %.6g      # s per blocking collective beyond its bytes\n",
                    hw->sync_cost);
    if (r >= 0 && hw->nongemm_contention > 0)
        r = fprintf(f, "nongemm_contention = %.6g  # non-GEMM time with `ranks` at once / alone\n",
                    hw->nongemm_contention);
    if (r < 0 || fflush(f) != 0)
        return dl_error(DL_ESYS, "hardware profile: write failed");
    return DL_OK;
}
