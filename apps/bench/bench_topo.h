/* distlab-bench topo: show the topology and where ranks are placed and actually run. */
#ifndef DISTLAB_APPS_BENCH_TOPO_H
#define DISTLAB_APPS_BENCH_TOPO_H

/* Entry point of `distlab-bench topo [options]`; argv[0] is the subcommand name.
 * Returns 0 on success, 1 on a runtime failure, 2 on bad usage. */
int bench_topo_main(int argc, char **argv);

#endif
