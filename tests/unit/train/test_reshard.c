/* Resharding full-state checkpoints (docs/CHECKPOINTS.md, "Resharding"): a checkpoint written
 * under one layout resumes under another, and the continued run is the uninterrupted one's
 * model within the bounds of the changed reduction order (lib/train/compare.h: the losses of
 * every step and the final parameters, in f64 where those bounds are tight). Every resume
 * checks the layout-independent state hash of what its ranks loaded against the manifest's
 * (the run fails otherwise), and the files' own hash is recomputed from their pieces (a third
 * partition of the same state). Negative controls: a resharded resume without the moments is
 * not the same model; a value changed in a file (its file checksum made to match) and two
 * slices swapped in the manifest are refused by the hash, naming the tensor; the CRC32C
 * combination equals the CRC of the concatenation. */
#include "../testutil.h"
#include <check.h>
#include <jansson.h>
#include <sys/stat.h>
#include <unistd.h>
#include "distlab/train.h"
#include "core/crc32c.h"
#include "io/ckdir.h"
#include "io/ckdir_map.h"

static char root[256];

static void mkroot(void)
{
    snprintf(root, sizeof root, "/tmp/dl_reshard_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(root));
}

static void rmroot(void)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    ck_assert_int_eq(system(cmd), 0);
}

/* A tiny 4-layer model (so that pp 2 with 2 virtual stages has a layer per chunk), global
 * batch 16 under every layout (micro-batches of 2: dp 4 takes 2 each, one rank 8), 5 steps,
 * a checkpoint at 2 and 4. */
static dl_train_opts tiny(int dp, int tp, int pp, dl_dtype dt)
{
    dl_train_opts o;
    dl_train_opts_init(&o);
    o.model.layers = 4;
    o.model.d_model = 16;
    o.model.heads = 2;
    o.model.seq = 8;
    o.precision.dtype = dt;
    o.layout.dp = dp;
    o.layout.tp = tp;
    o.layout.pp = pp;
    o.batch.global = 16;
    o.batch.micro = 2;
    o.optim.steps = 5;
    o.optim.warmup = 2;
    o.optim.lr = 1e-2;
    o.optim.min_lr = 1e-3;
    o.eval.windows = 2;
    o.output.log_every = 0;
    o.output.want_params = 1;
    o.machine.timeout_s = 120;
    o.ckpt.save_every = 2;
    return o;
}

static dl_train_opts with_pipe(dl_train_opts o, int sched, int v)
{
    o.pipeline.schedule = sched;
    o.pipeline.virtual_stages = v;
    return o;
}

/* A mixture of experts (4 experts, top-2, every second layer) at dp x ep */
static dl_train_opts moe(int dp, int ep)
{
    dl_train_opts o = tiny(dp, 1, 1, DL_F64);
    o.model.experts = 4, o.model.top_k = 2, o.model.moe_every = 2, o.model.capacity = 1.0;
    o.model.aux_loss = 0.01, o.model.z_loss = 0.001;
    o.layout.ep = ep;
    return o;
}

/* the differing routing figures (per expert routed and dropped, per layer the choices' hash)
 * of the steps after b's resume: 0 when the routing is a's */
static int routing_diffs(const dl_train_result *a, const dl_train_result *b)
{
    const dl_train_moe_result *x = &a->moe, *y = &b->moe;
    ck_assert_int_eq(x->layers, y->layers);
    size_t le = (size_t)x->layers * x->experts, s0 = (size_t)b->ckpt.resumed_from;
    int d = 0;
    for (size_t i = s0 * le; i < (size_t)a->nsteps * le; i++)
        d += (x->routed[i] != y->routed[i]) + (x->dropped[i] != y->dropped[i]);
    for (size_t i = s0 * x->layers; i < (size_t)a->nsteps * x->layers; i++)
        d += x->hash[i] != y->hash[i];
    return d;
}

/* b (resumed) against a (uninterrupted): the steps before the resume are a's by construction;
 * returns the largest relative loss difference after it, or -1 when b is not a's model */
static double continued_same(dl_train_opts ob, const dl_train_result *a, dl_train_result *b,
                             char *why, size_t wn)
{
    for (int i = 0; i < b->ckpt.resumed_from; i++) b->steps[i] = a->steps[i];
    dl_train_resolve(&ob, ob.layout.dp * ob.layout.tp * (ob.layout.pp > 1 ? ob.layout.pp : 1));
    if (!tu_compare_runs(&ob, b, a, why, wn))
        return -1;
    if (ob.model.experts && routing_diffs(a, b)) {
        snprintf(why, wn, "the routing differs");
        return -1;
    }
    double worst = 0;
    for (int i = b->ckpt.resumed_from; i < a->nsteps; i++)
        worst = fmax(worst, fabs(b->steps[i].loss - a->steps[i].loss) / fabs(a->steps[i].loss));
    return worst;
}

/* the checkpoint's files against its state hash (distlab-ckpt verify's check) */
static void files_hash_ok(const char *ck)
{
    json_t *m;
    ck_assert_msg(dl__ckd_open(ck, 1, &m) == DL_OK, "%s", dl_errmsg());
    ck_assert_ptr_nonnull(json_object_get(m, "state_hash"));
    ck_assert_msg(dl__ckd_hash_verify(ck, m) == DL_OK, "%s: %s", ck, dl_errmsg());
    json_decref(m);
}

/* Train `from` uninterrupted (saving in D/a), resume its step 2 under `to`: the same model as
 * the uninterrupted run. With `back`, `to`'s own step-4 checkpoint resumes under `back`, too.
 * The control (first case only): `to` resumed without the moments is not the same model. */
static void reshard_case(dl_train_opts from, dl_train_opts to, const dl_train_opts *back,
                         const char *what, int control)
{
    mkroot();
    char dir[300], dir2[300], ck[330], why[512];
    snprintf(dir, sizeof dir, "%s/a", root);
    snprintf(dir2, sizeof dir2, "%s/b", root);
    from.ckpt.dir = dir;
    dl_train_result a, b, c;
    ck_assert_msg(dl_train_run(&from, &a) == DL_OK, "%s: %s", what, dl_errmsg());
    snprintf(ck, sizeof ck, "%s/step-0000002", dir);
    files_hash_ok(ck);
    to.ckpt.dir = dir2;
    to.ckpt.resume = ck;
    ck_assert_msg(dl_train_run(&to, &b) == DL_OK, "%s: resume: %s", what, dl_errmsg());
    ck_assert_int_eq(b.ckpt.resumed_from, 2);
    double d = continued_same(to, &a, &b, why, sizeof why);
    ck_assert_msg(d >= 0, "%s: not the uninterrupted run's model: %s", what, why);
    fprintf(stderr, "reshard %-40s hash equal, largest loss difference %.3g (relative)%s\n", what,
            d, to.model.experts ? ", routing identical" : "");
    if (back) {
        dl_train_opts r = *back;
        snprintf(ck, sizeof ck, "%s/step-0000004", dir2);
        files_hash_ok(ck);
        r.ckpt.resume = ck;
        ck_assert_msg(dl_train_run(&r, &c) == DL_OK, "%s: back: %s", what, dl_errmsg());
        d = continued_same(r, &a, &c, why, sizeof why);
        ck_assert_msg(d >= 0, "%s: back: not the uninterrupted run's model: %s", what, why);
        fprintf(stderr, "reshard %-40s hash equal, largest loss difference %.3g (relative)\n",
                "  ... and back from step 4", d);
        dl_train_result_free(&c);
    }
    if (control) {
        dl__test_hook h = {0};
        h.ckpt_skip_moments = 1;
        to.ckpt.dir = NULL;
        snprintf(ck, sizeof ck, "%s/step-0000002", dir);
        dl__test_hook_set(&h);
        int rc = dl_train_run(&to, &c);
        dl__test_hook_set(NULL);
        ck_assert_msg(rc == DL_OK, "%s: control: %s", what, dl_errmsg());
        ck_assert_msg(continued_same(to, &a, &c, why, sizeof why) < 0,
                      "%s: a resharded resume without the moments passed", what);
        dl_train_result_free(&c);
    }
    dl_train_result_free(&a), dl_train_result_free(&b);
    rmroot();
}

START_TEST(dp2_to_tp2)
{
    reshard_case(tiny(2, 1, 1, DL_F64), tiny(1, 2, 1, DL_F64), NULL, "f64 dp 2 -> tp 2", 1);
}
END_TEST

START_TEST(pp2_to_1)
{
    reshard_case(with_pipe(tiny(1, 1, 2, DL_F64), DL_SCHED_1F1B, 0), tiny(1, 1, 1, DL_F64), NULL,
                 "f64 pp 2 (1F1B) -> one rank", 0);
}
END_TEST

START_TEST(zero3_dp4_to_1_and_back)
{
    dl_train_opts z = tiny(4, 1, 1, DL_F64);
    z.zero.stage = 3;
    reshard_case(z, tiny(1, 1, 1, DL_F64), &z, "f64 ZeRO-3 dp 4 -> dp 1", 0);
}
END_TEST

START_TEST(interleaved_to_1f1b)
{
    reshard_case(with_pipe(tiny(1, 1, 2, DL_F64), DL_SCHED_INTERLEAVED, 2),
                 with_pipe(tiny(1, 1, 2, DL_F64), DL_SCHED_1F1B, 0), NULL,
                 "f64 pp 2 interleaved v 2 -> 1F1B", 0);
}
END_TEST

START_TEST(dp2_to_pp2_dp2)
{
    reshard_case(tiny(2, 1, 1, DL_F64), with_pipe(tiny(2, 1, 2, DL_F64), DL_SCHED_1F1B, 0), NULL,
                 "f64 dp 2 -> pp 2 x dp 2", 0);
}
END_TEST

/* bf16: the fp32 master weights and the moments of a ZeRO-1 dp 2 run into tp 2 x pp 2 with tied
 * embeddings (the head stage's copy is filled from the embeddings) */
START_TEST(bf16_zero1_to_tp2_pp2_tied)
{
    dl_train_opts f = tiny(2, 1, 1, DL_BF16),
                  t = with_pipe(tiny(1, 2, 2, DL_BF16), DL_SCHED_1F1B, 0);
    f.zero.stage = 1;
    f.model.tie = t.model.tie = 1;
    reshard_case(f, t, NULL, "bf16 ZeRO-1 dp 2 -> tp 2 x pp 2, tied", 0);
}
END_TEST

/* Expert parallelism: the experts' whole tensors read from whichever ep rank's file holds
 * them, the moments in the target rank's own layout order; the routing the uninterrupted run's */
START_TEST(ep_dp2_ep2_to_1)
{
    reshard_case(moe(2, 2), moe(1, 1), NULL, "f64 MoE dp 2 x ep 2 -> dp 1", 0);
}
END_TEST

START_TEST(ep_dp1_to_dp4_ep4)
{
    reshard_case(moe(1, 1), moe(4, 4), NULL, "f64 MoE dp 1 -> dp 4 x ep 4", 0);
}
END_TEST

START_TEST(ep_dp4_ep2_to_dp2_ep2)
{
    reshard_case(moe(4, 2), moe(2, 2), NULL, "f64 MoE dp 4 x ep 2 -> dp 2 x ep 2", 0);
}
END_TEST

/* Composed layouts: pp 2 x dp 2 x ep 2 with ZeRO-1 (1F1B; a MoE layer on each stage) resharded
 * into dp 4 x ep 2 with ZeRO-3 (the expert moments sharded over the other edp group), and that
 * run's own checkpoint resumed under the first layout again */
START_TEST(ep_pp2_zero1_to_dp4_zero3_and_back)
{
    dl_train_opts f = with_pipe(moe(2, 2), DL_SCHED_1F1B, 0), t = moe(4, 2);
    f.layout.pp = 2, f.zero.stage = 1, t.zero.stage = 3;
    reshard_case(f, t, &f, "f64 MoE pp2 dp2 ep2 Z1 -> dp4 ep2 Z3", 0);
}
END_TEST

/* ---- negative controls ---- */

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

/* the resume of ck under o fails naming the state hash and `tensor`; so does the files' check */
static void hash_refuses(dl_train_opts o, const char *ck, const char *tensor)
{
    dl_train_result x;
    o.ckpt.resume = ck;
    o.ckpt.dir = NULL;
    ck_assert_int_eq(dl_train_run(&o, &x), DL_EINVAL);
    const char *m = dl_errmsg();
    ck_assert_msg(strstr(m, "state hash") && strstr(m, tensor) && !strchr(m, '\n'),
                  "'%s' should name the state hash and %s", m, tensor);
    dl_train_result_free(&x);
    json_t *man;
    ck_assert_int_eq(dl__ckd_open(ck, 1, &man), DL_OK);
    ck_assert_int_eq(dl__ckd_hash_verify(ck, man), DL_EINVAL);
    ck_assert_ptr_nonnull(strstr(dl_errmsg(), "state hash"));
    json_decref(man);
}

/* the manifest m's file `name`'s crc32c set to its bytes' */
static void set_crc(json_t *m, const char *name, const char *b, size_t n)
{
    json_t *f;
    size_t i;
    char crc[16];
    snprintf(crc, sizeof crc, "%08x", dl__crc32c(0, b, n));
    json_array_foreach(json_object_get(m, "files"), i,
                       f) if (strcmp(json_string_value(json_object_get(f, "name")), name) == 0)
        json_object_set_new(f, "crc32c", json_string(crc));
}

/* byte offset in a safetensors file image of tensor `name`'s element k (8-byte elements) */
static size_t element_at(const char *b, const char *name, size_t k)
{
    uint64_t N = 0;
    for (int i = 0; i < 8; i++) N |= (uint64_t)(unsigned char)b[i] << (8 * i);
    json_t *h = json_loadb(b + 8, N, 0, NULL);
    json_int_t off = json_integer_value(
        json_array_get(json_object_get(json_object_get(h, name), "data_offsets"), 0));
    ck_assert_ptr_nonnull(json_object_get(h, name));
    json_decref(h);
    return 8 + N + (size_t)off + 8 * k;
}

/* A tp 2 checkpoint: one moment value changed in rank 1's file (its CRC32C in the manifest made
 * to match, so only the hash can tell), then two tp slices of a weight swapped in the manifest:
 * both refused by the hash, under the same layout and under another. */
START_TEST(corrupted_and_swapped)
{
    mkroot();
    char dir[300], ck[330], shard[400], man[400];
    snprintf(dir, sizeof dir, "%s/c", root);
    dl_train_opts o = tiny(1, 2, 1, DL_F64), one = tiny(1, 1, 1, DL_F64);
    o.optim.steps = 2;
    o.ckpt.dir = dir;
    dl_train_result a;
    ck_assert_msg(dl_train_run(&o, &a) == DL_OK, "%s", dl_errmsg());
    dl_train_result_free(&a);
    o.optim.steps = one.optim.steps = 4;
    snprintf(ck, sizeof ck, "%s/step-0000002", dir);
    snprintf(shard, sizeof shard, "%s/rank-00001.safetensors", ck);
    snprintf(man, sizeof man, "%s/manifest.json", ck);
    size_t n, mn;
    char *orig = slurp(shard, &n), *morig = slurp(man, &mn), *bad = malloc(n);
    memcpy(bad, orig, n);
    /* m of an element of tp rank 1's own slice (not a replica, which is read from tp rank 0):
     * dp 1, so the moments are the flat buffer itself */
    dl_gpt_layout *l;
    ck_assert_int_eq(dl_gpt_layout_create(&o.model, 2, 1, &l), DL_OK);
    size_t at = l->t[dl_gpt_find(l, "h.2.mlp.c_fc.weight")].offset + 5;
    dl_gpt_layout_destroy(l);
    bad[element_at(bad, "optim.exp_avg", at)] ^= 1; /* the lowest mantissa bit */
    spill(shard, bad, n);
    json_t *m = json_loads(morig, 0, NULL);
    set_crc(m, "rank-00001.safetensors", bad, n);
    ck_assert_int_eq(json_dump_file(m, man, 0), 0);
    hash_refuses(o, ck, "h.2.mlp.c_fc.weight's exp_avg");
    hash_refuses(one, ck, "h.2.mlp.c_fc.weight's exp_avg");
    /* back to the intact file; the two slices of h.1.mlp.c_fc.weight's files swapped */
    spill(shard, orig, n);
    json_decref(m);
    m = json_loads(morig, 0, NULL);
    json_t *pcs =
        json_object_get(json_object_get(json_object_get(m, "tensors"), "h.1.mlp.c_fc.weight"),
                        "pieces");
    ck_assert_int_eq(json_array_size(pcs), 2);
    json_t *f0 = json_deep_copy(json_object_get(json_array_get(pcs, 0), "file"));
    json_object_set(json_array_get(pcs, 0), "file",
                    json_object_get(json_array_get(pcs, 1), "file"));
    json_object_set_new(json_array_get(pcs, 1), "file", f0);
    ck_assert_int_eq(json_dump_file(m, man, 0), 0);
    hash_refuses(o, ck, "h.1.mlp.c_fc.weight's parameter");
    hash_refuses(one, ck, "h.1.mlp.c_fc.weight's parameter");
    /* the intact checkpoint resumes */
    spill(man, morig, mn);
    o.ckpt.resume = ck;
    o.ckpt.dir = NULL;
    ck_assert_msg(dl_train_run(&o, &a) == DL_OK, "%s", dl_errmsg());
    dl_train_result_free(&a);
    json_decref(m);
    free(orig), free(morig), free(bad);
    rmroot();
}
END_TEST

/* The async pipeline's checkpoint: another schedule is refused naming it, as is async with
 * other micro-batches; async with another dp resumes (its per-stage versions kept). */
START_TEST(async_refused)
{
    mkroot();
    char dir[300], ck[330];
    snprintf(dir, sizeof dir, "%s/y", root);
    dl_train_opts o = with_pipe(tiny(1, 1, 2, DL_F64), DL_SCHED_ASYNC, 0);
    o.optim.steps = 2;
    o.ckpt.dir = dir;
    dl_train_result a;
    ck_assert_msg(dl_train_run(&o, &a) == DL_OK, "%s", dl_errmsg());
    dl_train_result_free(&a);
    snprintf(ck, sizeof ck, "%s/step-0000002", dir);
    dl_train_opts r = with_pipe(tiny(1, 1, 2, DL_F64), DL_SCHED_1F1B, 0);
    r.optim.steps = 3;
    r.ckpt.resume = ck;
    ck_assert_int_eq(dl_train_run(&r, &a), DL_EINVAL);
    ck_assert_ptr_nonnull(strstr(dl_errmsg(), "async pipeline"));
    dl_train_result_free(&a);
    r = o, r.optim.steps = 3, r.ckpt.dir = NULL, r.ckpt.resume = ck;
    r.batch.micro = 1; /* 16 micro-batches, not 8 */
    ck_assert_int_eq(dl_train_run(&r, &a), DL_EINVAL);
    ck_assert_ptr_nonnull(strstr(dl_errmsg(), "--microbatches"));
    dl_train_result_free(&a);
    r.layout.dp = 2; /* 8 micro-batches of 1 per dp rank: as many as the checkpoint's */
    ck_assert_msg(dl_train_run(&r, &a) == DL_OK, "%s", dl_errmsg());
    dl_train_result_free(&a);
    rmroot();
}
END_TEST

/* One expert's moments zeroed in the only file that has them (ep rank 1's; CRC32C made to
 * match): the hash refuses it naming the expert; with the manifest's hash removed the resume
 * runs, and the comparison sees another model (it would see a loader that dropped them). */
START_TEST(ep_expert_moments_dropped)
{
    mkroot();
    char dir[300], ck[330], shard[400], man[400], why[512];
    snprintf(dir, sizeof dir, "%s/e", root);
    dl_train_opts o = moe(2, 2), one = moe(1, 1);
    o.ckpt.dir = dir;
    dl_train_result a, b;
    ck_assert_msg(dl_train_run(&o, &a) == DL_OK, "%s", dl_errmsg());
    snprintf(ck, sizeof ck, "%s/step-0000002", dir);
    snprintf(shard, sizeof shard, "%s/rank-00001.safetensors", ck);
    snprintf(man, sizeof man, "%s/manifest.json", ck);
    size_t n;
    char *bad = slurp(shard, &n);
    dl_gpt_layout *l; /* ep rank 1's layout: the file's flat moments (dp 1 units: the buffer) */
    ck_assert_int_eq(dl_gpt_layout_create_ep(&o.model, 1, 0, 2, 1, NULL, &l), DL_OK);
    const dl_tensor_info *t = &l->t[dl_gpt_find(l, "h.0.mlp.experts.3.c_fc.weight")];
    for (size_t k = 0; k < t->numel; k++) {
        memset(bad + element_at(bad, "optim.exp_avg", t->offset + k), 0, 8);
        memset(bad + element_at(bad, "optim.exp_avg_sq", t->offset + k), 0, 8);
    }
    dl_gpt_layout_destroy(l);
    spill(shard, bad, n);
    json_t *m;
    ck_assert_int_eq(dl__ckd_open(ck, 0, &m), DL_OK);
    set_crc(m, "rank-00001.safetensors", bad, n);
    ck_assert_int_eq(json_dump_file(m, man, 0), 0);
    hash_refuses(one, ck, "h.0.mlp.experts.3.c_fc.weight's exp_avg");
    json_object_del(m, "state_hash");
    ck_assert_int_eq(json_dump_file(m, man, 0), 0);
    one.ckpt.resume = ck;
    ck_assert_msg(dl_train_run(&one, &b) == DL_OK, "%s", dl_errmsg());
    ck_assert_msg(continued_same(one, &a, &b, why, sizeof why) < 0,
                  "a resume without one expert's moments passed");
    dl_train_result_free(&a), dl_train_result_free(&b);
    json_decref(m);
    free(bad);
    rmroot();
}
END_TEST

/* CRC32C bit by bit from its definition (the reflected polynomial 0x82F63B78, initial and final
 * inversion): the reference for the library's table and interleaved-instruction paths */
static uint32_t crc32c_bitwise(const unsigned char *b, size_t n)
{
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= b[i];
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    }
    return ~c;
}

/* Long inputs take the three-stream path (24 KiB blocks): lengths around the block's multiples
 * from unaligned starts, whole and split at a block boundary's neighbours, against the bitwise
 * definition; a changed byte in each stream's part changes the CRC (the control). */
START_TEST(crc32c_long)
{
    enum { MAX = 3 * 3 * 8192 + 64 };
    unsigned char *b = malloc(MAX);
    ck_assert_ptr_nonnull(b);
    for (size_t i = 0; i < MAX; i++) b[i] = (unsigned char)(tu_splitmix64(i + 7) >> 17);
    const size_t lens[] = {24575, 24576, 24577, 49152 + 9, 3 * 3 * 8192 + 63};
    for (size_t o = 0; o < 2; o++)
        for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
            size_t n = lens[i] - o;
            uint32_t want = crc32c_bitwise(b + o, n);
            ck_assert_uint_eq(dl__crc32c(0, b + o, n), want);
            ck_assert_uint_eq(dl__crc32c(dl__crc32c(0, b + o, 5), b + o + 5, n - 5), want);
        }
    uint32_t whole = dl__crc32c(0, b, 24576);
    for (size_t at = 100; at < 24576; at += 8192) {
        b[at] ^= 0x10;
        ck_assert_uint_ne(dl__crc32c(0, b, 24576), whole);
        ck_assert_uint_eq(dl__crc32c(0, b, 24576), crc32c_bitwise(b, 24576));
        b[at] ^= 0x10;
    }
    free(b);
}
END_TEST

START_TEST(crc32c_combine)
{
    unsigned char b[3000];
    for (size_t i = 0; i < sizeof b; i++) b[i] = (unsigned char)(tu_splitmix64(i) >> 11);
    ck_assert_uint_eq(dl__crc32c(0, "123456789", 9), 0xE3069283u);
    const size_t cuts[][2] = {{0, 0}, {0, 1}, {1, 1}, {7, 9}, {1000, 3}, {17, 2983}, {2999, 1}};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        size_t x = cuts[i][0], y = cuts[i][1];
        uint32_t whole = dl__crc32c(0, b, x + y);
        ck_assert_uint_eq(dl__crc32c_combine(dl__crc32c(0, b, x), dl__crc32c(0, b + x, y), y),
                          whole);
    }
    /* three pieces from three "ranks", in any order: each shifted by the bytes after it */
    uint32_t h = dl__crc32c_shift(dl__crc32c(0, b + 1000, 1500), 500) ^
                 dl__crc32c_shift(dl__crc32c(0, b, 1000), 2000) ^ dl__crc32c(0, b + 2500, 500);
    ck_assert_uint_eq(h, dl__crc32c(0, b, 3000));
    /* the control: a piece placed wrongly, or one byte changed, is another CRC */
    ck_assert_uint_ne(dl__crc32c_shift(dl__crc32c(0, b, 1000), 2001) ^
                          dl__crc32c_shift(dl__crc32c(0, b + 1000, 1500), 500) ^
                          dl__crc32c(0, b + 2500, 500),
                      dl__crc32c(0, b, 3000));
    b[5] ^= 1;
    ck_assert_uint_ne(dl__crc32c(0, b, 3000), h);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("reshard");
    TCase *t = tcase_create("reshard");
    tcase_set_timeout(t, 300);
    tcase_add_test(t, crc32c_combine);
    tcase_add_test(t, crc32c_long);
    tcase_add_test(t, dp2_to_tp2);
    tcase_add_test(t, pp2_to_1);
    tcase_add_test(t, zero3_dp4_to_1_and_back);
    tcase_add_test(t, interleaved_to_1f1b);
    tcase_add_test(t, dp2_to_pp2_dp2);
    tcase_add_test(t, bf16_zero1_to_tp2_pp2_tied);
    tcase_add_test(t, corrupted_and_swapped);
    tcase_add_test(t, async_refused);
    tcase_add_test(t, ep_dp2_ep2_to_1);
    tcase_add_test(t, ep_dp1_to_dp4_ep4);
    tcase_add_test(t, ep_dp4_ep2_to_dp2_ep2);
    tcase_add_test(t, ep_pp2_zero1_to_dp4_zero3_and_back);
    tcase_add_test(t, ep_expert_moments_dropped);
    suite_add_tcase(s, t);
    return tu_run_suite(s);
}
