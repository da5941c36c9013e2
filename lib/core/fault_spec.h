/* distlab (private): an injected fault, as --inject-fault spells it (lib/core/fault_spec.c), and
 * where the runtime acts on it (lib/runtime/fault.c, runtime/fault.h):
 *
 *   rank=R,at=step:N|coll:COMM:N,kind=error|hang|slow:MS|crash
 *
 * World rank R, at the start of its N-th training step, or before its N-th collective on the
 * communicator COMM (dp, tp, pp, world; N 1-based, counted per communicator by the collective
 * sequence, which the communication thread does not reorder). The keys once each, in any order;
 * numbers in decimal digits. */
#ifndef DISTLAB_CORE_FAULT_SPEC_H
#define DISTLAB_CORE_FAULT_SPEC_H

typedef enum {
    DL__FAULT_ERROR = 1,
    DL__FAULT_HANG,
    DL__FAULT_SLOW,
    DL__FAULT_CRASH
} dl__fault_kind;
typedef enum { DL__AT_STEP = 1, DL__AT_COLL } dl__fault_at;
/* the communicators a fault can name (a communicator's label, runtime/internal.h) */
typedef enum { DL__COMM_DP = 1, DL__COMM_TP, DL__COMM_PP, DL__COMM_WORLD } dl__comm_label;

typedef struct dl__fault {
    int rank;
    dl__fault_at at;
    dl__comm_label comm; /* at coll */
    long n;              /* the step, or the collective's sequence on comm (1-based) */
    dl__fault_kind kind;
    long ms; /* slow: the sleep */
} dl__fault;

/* The exit status of an injected crash (documented in distlab-train --help). */
#define DL__FAULT_CRASH_STATUS 3

/* Parse s into *f: DL_OK, or DL_EINVAL with one line naming what is wrong. */
int dl__fault_parse(const char *s, dl__fault *f);
/* The fault as the spec spells it (for messages): "rank 1, allreduce #3 on dp" is the runtime's;
 * this is "rank=1,at=coll:dp:3,kind=hang". */
void dl__fault_text(const dl__fault *f, char *buf, unsigned n);
/* The label's name ("dp", "tp", "pp", "world"). */
const char *dl__comm_label_name(int label);

#endif
