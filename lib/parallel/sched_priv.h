/* distlab (private): the text helper of the schedule renderers (lib/parallel/sched_show.c). */
#ifndef DISTLAB_PARALLEL_SCHED_PRIV_H
#define DISTLAB_PARALLEL_SCHED_PRIV_H

/* Display width of a UTF-8 string (East Asian wide characters count 2). */
int dl_sched_display_width(const char *utf8);

#endif
