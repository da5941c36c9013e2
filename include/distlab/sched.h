/* distlab: pipeline schedules as data (lecture 17 §4 and §6.2, code 03).
 *
 * A schedule is, for each of p stages, an ordered array of actions: the forward (F) or backward
 * (B) of micro-batch j through model chunk c of that stage, or an optimizer step (OPT). The
 * generators below write those arrays; the validator, the simulator, the grid printer, the
 * weight-version analysis, the engine (distlab/pipe.h) and the timing harness all read the same
 * arrays, so what is simulated is what runs.
 *
 * Indices are 0-based in the API: stage s = 0 .. p-1 (the lecture's "GPU s+1", and its 1-based
 * s in formulas such as the version gap p - s), micro-batch j = 0 .. m-1, chunk c = 0 .. v-1.
 * With v chunks per stage, the schedule's placement table says which virtual stage (0 .. p v - 1,
 * the model's pipeline order) chunk c of stage s is: vstage[s v + c]. Interleaving uses the loop
 * placement c p + s (Megatron-LM); ZB-V the V placement, stage s holding virtual stages s and
 * 2p - 1 - s (so stage 0 holds the first and the last). A stage's chunks are its virtual stages
 * in pipeline order (vstage[s v + c] increases with c).
 *
 * Execution model (shared by the validator and the simulator): each stage runs its array in
 * order, one action at a time; an action starts when the stage is free and its cross-stage
 * input has arrived:
 *   F(j, c) on s needs F(j) of the previous virtual stage (where the placement puts it; none
 *   for virtual stage 0);
 *   B(j, c) on s needs F(j, c) earlier on s itself and B(j) of the next virtual stage (none for
 *   the last virtual stage, which turns its forward into its backward);
 *   OPT needs nothing but the actions before it on its stage.
 * A backward may be split (zero-bubble schedules): I(j, c) in B's place (the same inputs, the
 * same hand-off: a stage's I or B receives from the next stage's I or B), then W(j, c) later on
 * the same stage with no cross-stage input. Each (j, c) runs either B or both I and W.
 * Communication costs nothing (the lecture's grids assume so).
 *
 * Functions that can fail return a dl_status code and leave a message (dl_errmsg). */
#ifndef DISTLAB_SCHED_H
#define DISTLAB_SCHED_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dl_sched_op {
    DL_SCHED_F = 0,   /* forward of (mb, chunk) */
    DL_SCHED_B = 1,   /* backward of (mb, chunk): input and weight gradients together */
    DL_SCHED_OPT = 2, /* optimizer step of this stage's weights */
    DL_SCHED_I = 3,   /* the input-gradient part of B (hands the gradient on, as B does) */
    DL_SCHED_W = 4    /* the weight-gradient part of B (no hand-off; after its I, before OPT) */
} dl_sched_op;

typedef struct dl_sched_action {
    int op;    /* dl_sched_op */
    int mb;    /* micro-batch; OPT: the micro-batch whose backward it applies (asynchronous) or
                * -1 (a flush applies all of them) */
    int chunk; /* model chunk on this stage, 0 .. v-1; OPT: -1 */
} dl_sched_action;

typedef enum dl_sched_kind {
    DL_SCHED_CUSTOM = 0,      /* built with dl_sched_new + dl_sched_push */
    DL_SCHED_NAIVE = 1,       /* one micro-batch: F, B, OPT */
    DL_SCHED_GPIPE = 2,       /* all forwards, all backwards, flush (OPT) */
    DL_SCHED_1F1B = 3,        /* PipeDream-Flush: warm-up, steady 1F1B, cool-down, flush */
    DL_SCHED_INTERLEAVED = 4, /* Megatron's interleaved 1F1B, v chunks per stage */
    DL_SCHED_ASYNC = 5,       /* PipeDream 1F1B without flush: OPT after every backward */
    DL_SCHED_TERAPIPE = 6,    /* GPipe over token chunks of sequences (TeraPipe) */
    DL_SCHED_1F1B_SPLIT = 7,  /* 1F1B with each backward split into I then W at once */
    DL_SCHED_ZB_H1 = 8,       /* Zero Bubble ZB-H1: 1F1B's order of F and I, W fills bubbles */
    DL_SCHED_ZB_H2 = 9,       /* ZB-H2: more warm-up forwards, W fills the rest */
    DL_SCHED_ZB_V = 10,       /* ZB-V: two chunks per stage in the V placement */
    DL_SCHED_DUALPIPEV = 11   /* DeepSeek's DualPipeV: ZB-V's V, forward and backward paired */
} dl_sched_kind;

typedef struct dl_sched {
    dl_sched_kind kind;
    int p;          /* stages */
    int m;          /* micro-batches (TeraPipe: sequences x token chunks) */
    int v;          /* model chunks per stage (1 unless interleaved) */
    int seq_chunks; /* TeraPipe: token chunks per sequence c; micro-batch j is token chunk j % c
                     * of sequence j / c, whose forward needs chunk j-1 and whose backward needs
                     * chunk j+1 of the same sequence on the same stage (causal attention).
                     * 1 for every other kind */
    int flush;      /* 1: synchronous, each stage ends with its one OPT; 0: asynchronous */
    int stash;      /* asynchronous only: a backward uses the weight version its forward used */
    int *len;       /* len[s]: number of actions of stage s */
    dl_sched_action **act; /* act[s][0 .. len[s]-1] in execution order */
    int *cap_;             /* private: allocated length of act[s] */
    int *vstage;           /* placement: vstage[s * v + c], the virtual stage of chunk c of stage s
                            * (dl_sched_new writes the loop placement c p + s) */
    int *mem_limit;        /* per stage: most activation slots held at once (a micro-batch's
                            * chunk holds one from its F until its B or W), 0: no limit; the
                            * validator checks it */
} dl_sched;

/* ---- generators (each returns a new schedule in *out; free it with dl_sched_free) ---------- */

/* Naive model parallelism: the whole batch as one micro-batch. */
int dl_sched_naive(int p, dl_sched **out);
/* GPipe (Huang et al. 2019): F 0..m-1, B 0..m-1, OPT on every stage. */
int dl_sched_gpipe(int p, int m, dl_sched **out);
/* 1F1B with flush (PipeDream-Flush, Megatron's non-interleaved schedule): stage s runs
 * w = min(p-s-1, m) warm-up forwards, then m-w pairs (F, B), then w backwards, then OPT — so
 * GPU s+1 runs p-s forwards before its first backward, as in the lecture's grid. */
int dl_sched_1f1b(int p, int m, dl_sched **out);
/* 1F1B over token chunks (Seq1F1B's order, the trainer's --schedule 1f1b --token-chunks c):
 * each of nseq sequences cut into c chunks, micro-batch j being chunk j % c of sequence j / c
 * (seq_chunks = c, kind 1F1B); stage s runs min(p-s-1 + c-1, nseq c) warm-up forwards, then
 * 1F1B pairs whose backwards take each sequence's chunks last to first, then the remaining
 * backwards, then OPT. c = 1 is dl_sched_1f1b. */
int dl_sched_1f1b_tokens(int p, int nseq, int c, dl_sched **out);
/* Interleaved 1F1B with v chunks per stage (Narayanan et al. 2021; Megatron-LM's order):
 * forward k (k = 0 .. m v - 1) is micro-batch (k / (p v)) p + k % p, chunk (k / p) % v;
 * backward k the same micro-batch with chunk v-1 - (k / p) % v; stage s runs
 * min(2 (p-s-1) + (v-1) p, m v) warm-up forwards (all of them when m = p), then 1F1B pairs,
 * then the remaining backwards, then OPT. m must be a multiple of p (DL_EINVAL otherwise);
 * with v = 1 the actions are 1F1B's (the kind stays INTERLEAVED, and m must still be a multiple
 * of p). */
int dl_sched_interleaved(int p, int m, int v, dl_sched **out);
/* Asynchronous PipeDream 1F1B: the order of dl_sched_1f1b with an OPT right after every
 * backward and no flush. stash = 1: weight stashing (each backward uses its forward's weights). */
int dl_sched_async(int p, int m, int stash, dl_sched **out);
/* The continuous asynchronous pipeline (distlab-train --schedule async): a window of n steps of
 * m micro-batches between two quiet points (the run's start and end, an evaluation, a
 * checkpoint) is dl_sched_async(p, n m, stash), one pipeline that never drains inside the
 * window; a step is m micro-batches' updates. Step t (0 .. n-1) is the slice of each stage's
 * list that ends with the OPT of micro-batch (t+1) m - 1: stage s runs the next step's first
 * p-s-1 forwards before its own last backwards. Micro-batches are numbered 0 .. n m - 1 over the
 * window. DL_EINVAL for t outside the window. */
int dl_sched_async_step(int p, int m, int n, int t, int stash, dl_sched **out);
/* TeraPipe (Li et al. 2021) as the lecture approximates it: each of nseq sequences is cut into c
 * token chunks, each a micro-batch of 1/c the cost; all forwards (sequence by sequence, chunks in
 * order), then all backwards (sequence by sequence, chunks in reverse), then OPT. The bubble is
 * GPipe's with m = nseq * c. */
int dl_sched_terapipe(int p, int nseq, int c, dl_sched **out);

/* 1F1B with split backward (the zero-bubble baseline): dl_sched_1f1b's order with every B
 * replaced by I then W. Memory limit min(p - s, m) (1F1B's). */
int dl_sched_1f1b_split(int p, int m, dl_sched **out);
/* Zero Bubble ZB-H1 (Qi et al. 2024): the F and I of 1F1B in 1F1B's order; a stage runs a
 * pending W whenever its next F or I cannot start (its input not there yet, or an F would
 * exceed the limit) and the rest at the end. Memory limit min(p, m) on every stage (1F1B's
 * peak, stage 0's). Bubble (p-1)(F+B-W) with B the input gradient's cost. */
int dl_sched_zb_h1(int p, int m, dl_sched **out);
/* ZB-H2: as ZB-H1 with 2 (p-s-1) warm-up forwards and memory limit min(2p - 1, m). The paper's
 * zero bubble also overlaps one step's tail with the next step's warm-up (it bypasses the
 * optimizer's synchronisation); with a flush per step the last stage still waits (p-1) F. */
int dl_sched_zb_h2(int p, int m, dl_sched **out);
/* ZB-V: v = 2 chunks per stage in the V placement; each stage runs, whenever free, a ready input
 * gradient (the later virtual stage first), else a ready forward (the later virtual stage first)
 * if under the limit, else a pending W; the order is fixed by running this in the unit-cost model
 * (F = I = W). Memory limit min(2p, 2m) chunk slots (each half a stage: 1F1B's peak). p >= 2. */
int dl_sched_zb_v(int p, int m, dl_sched **out);
struct dl_sched_costs;
/* ZB-V with its order found at costs c (f, b, w per chunk action; NULL: F = I = W): the policy
 * adapts to unequal costs (p 4, m 8, F 2/B 3/W 1: 12% simulated against 30% for the unit-cost
 * order). Costs must be positive. */
int dl_sched_zb_v_costs(int p, int m, const struct dl_sched_costs *c, dl_sched **out);
/* DualPipeV (DeepSeek-V3's DualPipe folded into ZB-V's V, as torch.distributed.pipelining's
 * ScheduleDualPipeV): v = 2 chunks per stage, stage s holding virtual stages s and 2p - 1 - s.
 * Stage s runs 2(p-s-1) forwards of chunk 0, s+1 pairs (F chunk 0, F chunk 1), p-s-1 pairs
 * (I chunk 1, F chunk 1), then m-2p+s+1 overlapped steps F0 I1 F1 I0 (one chunk's forward, then
 * the other's backward, in that order: distlab runs no two actions at once), then the cool-down
 * I1 F1 I0 (p-s-1 times), I1 I0 (s+1), I0 (p-s-1); each W runs when the next F or I cannot start
 * (its input not there, or the limit reached) or at the end. Memory limit 2p + 1 chunk slots on
 * every stage (the overlapped forward before its paired backward holds one past the warm-up's 2p).
 * Needs p >= 2 and m >= 2p (DL_EINVAL naming the rule otherwise). */
int dl_sched_dualpipev(int p, int m, dl_sched **out);

/* Set the placement (vstage[s v + c] for every stage and chunk; copied). DL_EINVAL unless it is a
 * permutation of 0 .. p v - 1 with each stage's chunks in increasing order. */
int dl_sched_set_placement(dl_sched *s, const int *vstage);
/* Where virtual stage g sits: *stage and *chunk (DL_EINVAL for g out of range). */
int dl_sched_holder(const dl_sched *s, int g, int *stage, int *chunk);
/* The neighbours of chunk `chunk` of stage `stage`: the stage and chunk its forward receives
 * from (*prev = -1: virtual stage 0) and sends to (*next = -1: the last virtual stage); a
 * backward the reverse. */
void dl_sched_peers(const dl_sched *s, int stage, int chunk, int *prev, int *prev_chunk, int *next,
                    int *next_chunk);

/* An empty custom schedule (flush = 1, stash = 0; change them if needed) and appending to it. */
int dl_sched_new(int p, int m, int v, dl_sched **out);
int dl_sched_push(dl_sched *s, int stage, int op, int mb, int chunk);
void dl_sched_free(dl_sched *s);

/* By name: "naive", "gpipe", "1f1b", "interleaved", "async" (also "pipedream"), "terapipe",
 * "1f1b-split", "zb-h1", "zb-h2", "zb-v", "dualpipev"; DL_EINVAL for another. dl_sched_kind_name gives the canonical name ("custom" for CUSTOM). */
int dl_sched_kind_parse(const char *name, dl_sched_kind *kind);
const char *dl_sched_kind_name(dl_sched_kind kind);

/* 1 when stage `stage` (-1: any stage) of s runs a split backward (an I or a W action). */
int dl_sched_splits(const dl_sched *s, int stage);

/* "F3", "B3", "I3", "W3", "OPT", with the chunk when v > 1 ("F3.1"): the form messages use. */
const char *dl_sched_action_str(const dl_sched *s, const dl_sched_action *a, char *buf, size_t cap);

/* A zero-bubble paper's theoretical bubble of this schedule's kind, as a fraction of the step:
 * bubble time t over m (F + B + W) + t with F, B (input gradient), W the costs of one action
 * (of one chunk for ZB-V, whose m counts 2 chunks): 1F1B and GPipe t = (p-1)(F+B+W) (their
 * backward is whole); 1F1B-split (p-1)(F+B) (its I hands the gradient on before W); ZB-H1 (p-1)(F+B-W); ZB-H2 and ZB-V (p-1)(F+B-2W), 0 when negative (so 0 when
 * F = B = W). -1 for the other kinds. */
double dl_sched_bubble_theory(const dl_sched *s, double f, double b, double w);

/* ---- validation -------------------------------------------------------------------------- */

/* Check a schedule and return DL_OK or DL_EINVAL with a message naming the first offending
 * action (stage, index, action). In this order: sizes; each action's op, micro-batch and
 * chunk in range; every (F, j, c) exactly once on every stage, and either (B, j, c) or both
 * (I, j, c) and (W, j, c), each once; every B or I after its F on the same stage (and TeraPipe's
 * token order), every W after its I ("weight gradient before its input gradient"); with flush,
 * exactly one OPT per stage, last, and every W before it; the placement; each stage's memory limit
 * (the action that breaks it);
 * finally no deadlock: the execution model above is run, and if stages block each other the
 * message lists the cycle ("stage 0 action 1 (B0) waits for B0 on stage 1 (its action 2); ..."). */
int dl_sched_validate(const dl_sched *s);
/* The actions around action i of stage `stage`, each stage's on its own line with the offending
 * one in brackets ("  stage 1: ... F3 I2 [W4] F5 ..."): what the validator's messages append. */
void dl_sched_context(const dl_sched *s, int stage, int i, char *buf, size_t cap);

/* dl_sched_validate that also says where: *stage and *index (may be NULL) receive the offending
 * action's position, or -1 when the refusal names no action (a missing one, the sizes). */
int dl_sched_check(const dl_sched *s, int *stage, int *index);

/* ---- torch.distributed.pipelining's CSV form ---------------------------------------------- */

/* A schedule file's letters (dl_sched_parse_csv). */
enum { DL_SCHED_LETTERS_AUTO = 0, DL_SCHED_LETTERS_NEW = 1, DL_SCHED_LETTERS_OLD = 2 };

/* One row per rank, its cells that rank's actions in order (an empty cell: an idle slot of the
 * file's grid); an action is [global virtual stage][type][micro-batch] ("2F0", "1I3", "0W5"),
 * type F, I (input gradient), W (weight gradient) or B (full backward); the stages in a rank's row
 * are its chunks, in increasing order (the placement). Older files used B for the input gradient
 * and BW for the full backward: DL_SCHED_LETTERS_AUTO takes the older letters when the file has a
 * BW, or a B and a W of the same (stage, micro-batch), and no I and no OVERLAP_F_B.
 * "(aFx;bBy)OVERLAP_F_B" runs as the two actions in order; communication actions (SEND_F,
 * RECV_F, SEND_B, RECV_B, UNSHARD, RESHARD, REDUCE_GRAD, the micro-batch optional) are accepted
 * and ignored (the engine posts its own transfers; *note says how many, "" when none).
 * m is the largest micro-batch + 1, p the rows; every rank ends with the flush's OPT; mem_limit
 * > 0 sets every stage's memory limit. The schedule is validated: a refusal (DL_EINVAL) names the
 * row, the cell and the reason ("schedule file: row 2, cell 5 ('1W3'): weight gradient before
 * its input gradient ..."), rows and cells counted from 1, on one line (no context lines). */
int dl_sched_parse_csv(const char *text, size_t len, int letters, int mem_limit, dl_sched **out,
                       char *note, size_t notecap);
/* The same from a file (at most 64 MiB); messages start with the path. */
int dl_sched_load_csv(const char *path, int letters, int mem_limit, dl_sched **out, char *note,
                      size_t notecap);
/* A flush schedule in that form with the newer letters, one line per rank (OPT left out: the
 * form has none); parse_csv gives back the same actions and placement. *out is malloc'd.
 * DL_EINVAL for an invalid schedule, or one with optimizer steps inside the step or token
 * chunks (async, TeraPipe). */
int dl_sched_write_csv(const dl_sched *s, char **out);
int dl_sched_save_csv(const dl_sched *s, const char *path);

/* ---- simulation -------------------------------------------------------------------------- */

typedef struct dl_sched_costs {
    double f;   /* one forward action (of one chunk when interleaved): 1 */
    double b;   /* one whole backward action B: 2 */
    double opt; /* one optimizer step: 0 (the lecture's grids show none) */
    double w;   /* a split backward's weight part W; its input part I costs b - w. < 0: b / 2 */
} dl_sched_costs;

/* The defaults beside the fields (f 1, b 2, opt 0, w -1). */
void dl_sched_costs_init(dl_sched_costs *c);

typedef struct dl_sched_sim {
    int p;
    double makespan; /* end of the last action (the first starts at 0) */
    double **start;  /* start[s][i], end[s][i]: action i of stage s (aligned with act[s]) */
    double **end;
    double *busy;        /* per stage: time spent in actions */
    double *bubble;      /* per stage: 1 - busy / makespan */
    double bubble_total; /* 1 - sum(busy) / (p makespan): the lecture's bubble fraction */
    int *peak_act;       /* per stage: most (micro-batch, chunk) pairs held at once (forward done,
                         * backward not yet): GPipe m; 1F1B min(p - s, m), i.e. 4/3/2/1 for p = 4.
                         * Interleaved counts chunk activations (each 1/v of a stage's layers) */
} dl_sched_sim;

/* Validate, then run the execution model with costs (NULL: the defaults). */
int dl_sched_simulate(const dl_sched *s, const dl_sched_costs *costs, dl_sched_sim **out);
/* The same with a factor per micro-batch on its F, B, I and W (mb_scale: m entries, >= 0;
 * NULL: dl_sched_simulate): TeraPipe's later token chunks cost more, their queries reading every
 * earlier key (include/distlab/tera.h, dl_tera_chunk_scale). */
int dl_sched_simulate_scaled(const dl_sched *s, const dl_sched_costs *costs, const double *mb_scale,
                             dl_sched_sim **out);
/* Replays the schedule with each action's own time: dur[q][i] for action i of stage q (a run's
 * measured times, OPT included), so that a measured bubble can be split into what the actions'
 * times explain and what the hand-offs between them add. DL_EINVAL for a negative time. */
int dl_sched_simulate_times(const dl_sched *s, const double *const *dur, dl_sched_sim **out);
void dl_sched_sim_free(dl_sched_sim *sim);

/* The continuous pipeline's simulated bubble for p stages, m micro-batches a step and n steps
 * (dl_sched_async_step's window) with costs c (NULL: the defaults): *run over the whole window
 * (warm-up and drain once: (p-1)/(n m + p-1) at uniform costs), *steady the median over the
 * steps after the first of each step's 1 - sum busy / (p x its longest span), a stage's step
 * spanning from the end of its previous step to the end of its own (as the trainer measures). */
int dl_sched_async_continuous(int p, int m, int n, const dl_sched_costs *c, double *run,
                              double *steady);
/* The same window per stage: stage[q] (p of them) the median over the steps after the first of
 * 1 - busy / span of stage q's step (what the trainer's per-stage steady state measures). */
int dl_sched_async_continuous_stages(int p, int m, int n, const dl_sched_costs *c, double *stage);
/* The window replayed with a run's own action times (dl_sched_simulate_times; dur[q] holds stage
 * q's dl_sched_async(p, n m) actions in order): *steady as dl_sched_async_continuous's. */
int dl_sched_async_continuous_replay(int p, int m, int n, const double *const *dur, double *steady);

/* The lecture's bubble (p-1)/(v m + p-1) for this schedule's p, m, v (the planner's
 * dl_plan_bubble). With costs (f, b, 0), GPipe, 1F1B, naive and TeraPipe simulate to exactly
 * this; see docs/ARCHITECTURE.md "Pipeline schedules". */
double dl_sched_bubble_formula(const dl_sched *s);

/* ---- printing ---------------------------------------------------------------------------- */

/* The lecture's grid, one line per stage: "GPU 1  " then one character per time unit: the
 * micro-batch's digit for a forward ('0'..'9', then 'A'..'Z', then '+' from 36 on), its letter
 * for a backward or an input gradient I ('a'..'z', then '-' from 26 on; a backward of cost 2
 * prints "aa"), its capital for a weight gradient W ('A'..'Z', then '~'; a schedule with W draws
 * forwards past 9 as '+'), '*' for an optimizer step of non-zero cost and U+00B7 '·' for idle. Every action must start and end on
 * whole units, and the makespan must not exceed 1e6 units (DL_EINVAL otherwise).
 * *out is a malloc'd string, each line ending in '\n'. */
int dl_sched_grid(const dl_sched *s, const dl_sched_sim *sim, char **out);
/* The lecture's caption, in English: "GPipe (4 micro-batches): bubble 42.9%" (the percentage with
 * one decimal, ".0" dropped as the lecture writes 75%), and with with_act ", activations held per
 * stage 4 / 3 / 2 / 1". */
int dl_sched_caption(const dl_sched *s, const dl_sched_sim *sim, int with_act, char **out);
/* Caption line followed by the grid. */
int dl_sched_render(const dl_sched *s, const dl_sched_sim *sim, int with_act, char **out);
/* Two blocks of lines side by side, as the lecture prints the naive and GPipe grids: each left
 * line padded with spaces to display column col (CJK characters count two columns), then the
 * right line; col <= 0: two columns past the widest left line. */
int dl_sched_side_by_side(const char *left, const char *right, int col, char **out);

/* ---- weight versions (PipeDream, lecture §4.3, exercise 6) --------------------------------- */

typedef struct dl_sched_versions {
    int p, m, v;
    /* per stage s, micro-batch j, chunk c at [(s * m + j) * v + c]: */
    int *fwd;           /* the stage's weight version (OPTs done on it) when F(j, c) ran */
    int *bwd;           /* the version B(j, c) uses: fwd with stashing, the current one without */
    int *gap;           /* updates of the stage's weights between F(j, c) and B(j, c) */
    int *max_gap;       /* per stage: largest gap; p - s - 1 (0-based s) for async 1F1B, m >= p */
    int *peak_versions; /* per stage: weight versions held at once (current + stashed); 1 without
                        * stashing */
} dl_sched_versions;

/* Walk each stage's actions in order, counting OPTs. Validates first. */
int dl_sched_versions_get(const dl_sched *s, dl_sched_versions **out);
void dl_sched_versions_free(dl_sched_versions *v);

/* ---- partitioning layers into stages (lecture §4.4, code 03 part 4) ------------------------ */

/* Split n layers with per-layer costs into k contiguous non-empty stages: balanced = 1 minimises
 * the slowest stage with the planner's dynamic program (dl_plan_partition: ties to the earliest
 * boundary, which gives the lecture's 0-1, 2-5, 6-9, 10-11); balanced = 0 splits evenly by layer
 * count (dl_plan_partition_even). first[0..k] receives the boundaries (stage i = layers
 * first[i] .. first[i+1]-1); stage_cost[0..k-1] (may be NULL) each stage's cost; *max_cost (may
 * be NULL) the slowest. */
int dl_sched_partition(const double *costs, int n, int k, int balanced, int *first,
                       double *stage_cost, double *max_cost);

#ifdef __cplusplus
}
#endif
#endif
