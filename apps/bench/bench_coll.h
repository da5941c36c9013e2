/* distlab-bench coll: the collective benchmark (nccl-tests contract). */
#ifndef DISTLAB_APPS_BENCH_COLL_H
#define DISTLAB_APPS_BENCH_COLL_H

/* argv[0] is the subcommand's name; returns the process exit status (0 ok, 1 wrong results or
 * a failed run, 2 bad usage). */
int bench_coll_main(int argc, char **argv);

#endif
