/* distlab-lecture: shared declarations of the app's files (apps/lecture/distlab-lecture.c: options,
 * output, sections 01, 03, 05 and the exercises; apps/lecture/lecture_par.c: section 02, the real
 * runs of data and tensor parallelism on rank threads; apps/lecture/lecture_zero.c: section 04,
 * ZeRO; apps/lecture/lecture_pipe.c: section 03's real pipeline run; apps/lecture/lecture_async.c:
 * section 03's async run against 1F1B; apps/lecture/lecture_tera.c: its TeraPipe run with sleep
 * work; apps/lecture/lecture_moe.c: section 06, expert parallelism). */
#ifndef DISTLAB_APPS_LECTURE_H
#define DISTLAB_APPS_LECTURE_H

#include <stdarg.h>

/* Status of a printed figure against the lecture's. */
enum { LEC_INFO = -1, LEC_DIFF = 0, LEC_MATCH = 1 };

/* Text output (suppressed with --json). */
void lec_text(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

/* One figure: `ref` is the lecture's section ("§1.2", "code 03", "ex. 4"), `id` a short machine
 * name, `label` what it is, `value` the number (NAN when the figure is not a number), `shown`
 * the figure as printed, `lecture` what the lecture states ("" when it states nothing, then
 * status must be LEC_INFO). */
void lec_fig(const char *ref, const char *id, const char *label, double value, const char *shown,
             const char *lecture, int status);

/* |v - want| <= tol: LEC_MATCH, else LEC_DIFF. */
int lec_near(double v, double want, double tol);
/* v <= bound (and not NaN). */
int lec_le(double v, double bound);

/* A library call failed: print "distlab-lecture: <what>: <dl_errmsg()>" and remember the
 * failure (the exit status becomes 1). Returns -1 so callers can `return lec_fail(...)`. */
int lec_fail(const char *what);

/* Section 02 (apps/lecture/lecture_par.c). Returns 0, or -1 after lec_fail. */
int lecture_02(void);
/* Section 03, code 03 part 2: the 8-layer MLP in 4 pipeline stages on rank threads vs the full
 * batch (apps/lecture/lecture_pipe.c). Returns 0, or -1 after lec_fail. */
int lecture_03_pipe(void);
/* Section 03, §4.3 measured: async (no flush) against 1F1B, the trainer at pp 2
 * (apps/lecture/lecture_async.c). Returns 0, or -1 after lec_fail. */
int lecture_03_async(void);
/* Section 03, §6.2 measured: the TeraPipe schedule s (4 stages) on 4 rank threads with sleep
 * work, each chunk's forward 8 ms x scale[mb] / c, its backward twice that
 * (apps/lecture/lecture_tera.c); *bubble the median step's. Returns a dl_status. */
struct dl_sched;
int lecture_03_tera_measure(const struct dl_sched *s, const double *scale, double *bubble);
/* Section 04, ZeRO (apps/lecture/lecture_zero.c, on apps/lecture/lecture_mlp.c). Returns 0, or -1 after lec_fail. */
int lecture_04(void);
/* Section 06, §6.3 expert parallelism: the capacity sweep on rank threads and the Mixtral-sized
 * layer from the planner (apps/lecture/lecture_moe.c). Returns 0, or -1 after lec_fail. */
int lecture_06(void);

#endif
