/* distlab-bench: pictures of traces (include/distlab/trace.h) with gnuplot. */
#ifndef DISTLAB_APPS_BENCH_TRACE_PLOT_H
#define DISTLAB_APPS_BENCH_TRACE_PLOT_H

#include "distlab.h"

/* The timeline of step `step` as a Gantt chart: one row per rank ("rank 0" on top), forwards,
 * backwards, optimizer steps and collectives as boxes in their own colours (forward and backward
 * boxes labelled with the micro-batch, and ".chunk" when the trace has chunks), x in ms from the
 * earliest STEP start of that step; the title gives the mean measured bubble. svg_path ends in
 * .svg or .png; the data (.dat) and script (.gp) are written next to it and gnuplot renders them
 * when installed (bu_plot's fallback otherwise: the command to run is printed). Returns 0, or -1
 * with one line printed (no STEP event of that step, a bad extension, a file not writable). */
int trace_plot_gantt(const dl_trace *t, int step, const char *svg_path);

/* distlab-bench gantt-demo FILE.svg [SCHED [P [M]]] (hidden; tests/apps/test_bench_harness.sh): a
 * schedule's simulated timeline (1 ms per unit, default 1f1b 4 8) recorded into a trace and drawn
 * with trace_plot_gantt; the trace's grid is printed (rows named "rank 0".., cli_put_ranked), which
 * must equal dl_sched_grid's. */
int trace_plot_demo_main(int argc, char **argv);

#endif
