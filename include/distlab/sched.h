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
 * With v chunks per stage (interleaving), chunk c of stage s is virtual stage c*p + s, as in
 * Megatron-LM.
 *
 * Execution model (shared by the validator and the simulator): each stage runs its array in
 * order, one action at a time; an action starts when the stage is free and its cross-stage
 * input has arrived:
 *   F(j, c) on s needs F(j, c) on s-1, or for s = 0 and c > 0, F(j, c-1) on stage p-1;
 *   B(j, c) on s needs F(j, c) earlier on s itself and B(j, c) on s+1, or for s = p-1 and
 *   c < v-1, B(j, c+1) on stage 0 (the last virtual stage turns its forward into its backward);
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
    DL_SCHED_TERAPIPE = 6     /* GPipe over token chunks of sequences (TeraPipe) */
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
/* TeraPipe (Li et al. 2021) as the lecture approximates it: each of nseq sequences is cut into c
 * token chunks, each a micro-batch of 1/c the cost; all forwards (sequence by sequence, chunks in
 * order), then all backwards (sequence by sequence, chunks in reverse), then OPT. The bubble is
 * GPipe's with m = nseq * c. */
int dl_sched_terapipe(int p, int nseq, int c, dl_sched **out);

/* An empty custom schedule (flush = 1, stash = 0; change them if needed) and appending to it. */
int dl_sched_new(int p, int m, int v, dl_sched **out);
int dl_sched_push(dl_sched *s, int stage, int op, int mb, int chunk);
void dl_sched_free(dl_sched *s);

/* By name: "naive", "gpipe", "1f1b", "interleaved", "async" (also "pipedream"), "terapipe";
 * DL_EINVAL for another. dl_sched_kind_name gives the canonical name ("custom" for CUSTOM). */
int dl_sched_kind_parse(const char *name, dl_sched_kind *kind);
const char *dl_sched_kind_name(dl_sched_kind kind);

/* 1 when stage `stage` (-1: any stage) of s runs a split backward (an I or a W action). */
int dl_sched_splits(const dl_sched *s, int stage);

/* "F3", "B3", "I3", "W3", "OPT", with the chunk when v > 1 ("F3.1"): the form messages use. */
const char *dl_sched_action_str(const dl_sched *s, const dl_sched_action *a, char *buf, size_t cap);

/* ---- validation -------------------------------------------------------------------------- */

/* Check a schedule and return DL_OK or DL_EINVAL with a message naming the first offending
 * action (stage, index, action). In this order: sizes; each action's op, micro-batch and
 * chunk in range; every (F, j, c) exactly once on every stage, and either (B, j, c) or both
 * (I, j, c) and (W, j, c), each once; every B or I after its F on the same stage (and TeraPipe's
 * token order), every W after its I ("weight gradient before its input gradient"); with flush,
 * exactly one OPT per stage, last;
 * finally no deadlock: the execution model above is run, and if stages block each other the
 * message lists the cycle ("stage 0 action 1 (B0) waits for B0 on stage 1 (its action 2); ..."). */
int dl_sched_validate(const dl_sched *s);

/* ---- simulation -------------------------------------------------------------------------- */

typedef struct dl_sched_costs {
    double f;   /* one forward action (of one chunk when interleaved): 1 */
    double b;   /* one backward action: 2; its parts I and W each cost b / 2 */
    double opt; /* one optimizer step: 0 (the lecture's grids show none) */
} dl_sched_costs;

/* The defaults beside the fields (f 1, b 2, opt 0). */
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
void dl_sched_sim_free(dl_sched_sim *sim);

/* The lecture's bubble (p-1)/(v m + p-1) for this schedule's p, m, v (the planner's
 * dl_plan_bubble). With costs (f, b, 0), GPipe, 1F1B, naive and TeraPipe simulate to exactly
 * this; see docs/ARCHITECTURE.md "Pipeline schedules". */
double dl_sched_bubble_formula(const dl_sched *s);

/* ---- printing ---------------------------------------------------------------------------- */

/* The lecture's grid, one line per stage: "GPU 1  " then one character per time unit: the
 * micro-batch's digit for a forward ('0'..'9', then 'A'..'Z', then '+' from 36 on), its letter
 * for a backward ('a'..'z', then '-' from 26 on; a backward of cost 2 prints "aa"), '*' for an
 * optimizer step of non-zero cost and U+00B7 '·' for idle. Every action must start and end on
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
