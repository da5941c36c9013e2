/* Token-level pipelining in the trainer (TeraPipe, --token-chunks c; parallel/pipe_tera.c): the
 * pipeline module's unit j is slice j % c of micro-batch j / c. */
#ifndef DISTLAB_PARALLEL_PIPE_TERA_H
#define DISTLAB_PARALLEL_PIPE_TERA_H
#include "distlab.h"
#include "distlab/train.h"
#include "model/gpt_priv.h"

typedef struct tr_tera {
    int c, L;        /* slices per sequence (1: none) and the longest's length */
    int *len, *t0;   /* [c]: each slice's length and first position */
    int T;           /* the sequence's length */
    int m;           /* micro-batches of a step */
    int ncache;      /* key/value caches on this stage: the most micro-batches in flight */
    int *cache_of;   /* [m]: micro-batch -> its cache, -1: none */
    int *free_cache; /* the free caches, nfree of them */
    int nfree;
    int *in, *tg; /* a slice's tokens (micro x L) */
} tr_tera;

/* The slicing of options o (c = 1 without --token-chunks) and this stage's caches, from the
 * schedule s (its unit j: slice j % c of micro-batch j / c). tr_tera_close frees it, also after
 * an error. */
int tr_tera_open(tr_tera *t, const dl_train_opts *o, const dl_sched *s, int stage);
void tr_tera_close(tr_tera *t);

/* Before unit j's forward in `slot` (c > 1): the micro-batch's cache (taken at its first
 * slice) and the slice's positions to the model; *in and *tg (when not NULL) become the slice's
 * columns of the micro-batch's B x T tokens. */
int tr_tera_forward(tr_tera *t, dl_gpt *g, int slot, int j, int B, const int **in, const int **tg);
/* After unit j's backward: its micro-batch's first slice gives the cache back (the schedules run
 * a micro-batch's slices backward last to first, so that one is its last backward). */
void tr_tera_backward_done(tr_tera *t, int j);
/* Slice k's columns of B sequences of T tokens into out (B x its length). */
void tr_tera_columns(const tr_tera *t, const int *full, int B, int k, int *out);
/* Unit j's share of its micro-batch's loss: its slice's positions over the sequence's. */
double tr_tera_weight(const tr_tera *t, int j);
/* Place slot's next forward on slice k of the sequences in `cache` (the model's
 * dl_gpt_slot_slice). */
int tr_tera_place(const tr_tera *t, dl_gpt *g, int slot, int cache, int k);

/* The pipeline's refusals for token chunks (dl_train_resolve): equal slices must divide the
 * sequence (unequal ones add up to it), the schedule carry slices (gpipe or 1f1b), no MoE
 * layers, schedule file or sampling. */
int tr_tera_resolve(const dl_train_opts *o);

#endif
