/* distlab-bench ckpt: full-state checkpoint throughput, one side a file (bench_ckpt_save.c: the
 * save; bench_ckpt_load.c: the load). */
#ifndef DISTLAB_BENCH_CKPT_H
#define DISTLAB_BENCH_CKPT_H

/* `distlab-bench ckpt SIDE [OPTIONS]`: argv[1] names the side */
int bench_ckpt_main(int argc, char **argv);
int bench_ckpt_save_main(int argc, char **argv); /* bench_ckpt_save.c */
int bench_ckpt_load_main(int argc, char **argv);

#endif
