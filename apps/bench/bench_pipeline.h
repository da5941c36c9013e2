/* distlab-bench pipeline: measured pipeline bubbles against the lecture's and the simulator's
 * (apps/bench/bench_pipeline.c). argv[0] is the subcommand's name; returns the exit status (0 ok,
 * 1 a failed run, 2 bad usage). */
#ifndef DISTLAB_APPS_BENCH_PIPELINE_H
#define DISTLAB_APPS_BENCH_PIPELINE_H

int bench_pipeline_main(int argc, char **argv);

#endif
