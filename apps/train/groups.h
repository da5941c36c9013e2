/* distlab-train's option groups, in --help's order (a group without a heading continues the
 * one above), which is also the order of their hooks within a phase and of their JSON fields: a
 * new module is its file (Makefile.am's TRAIN_GROUPS) and one line here. */
#ifndef DISTLAB_APPS_TRAIN_GROUPS_H
#define DISTLAB_APPS_TRAIN_GROUPS_H

#include "group.h"

#define TG_GROUPS(X)                                                                               \
    X(tg_layout)                                                                                   \
    X(tg_pipeline)                                                                                 \
    X(tg_trace)                                                                                    \
    X(tg_model)                                                                                    \
    X(tg_moe)                                                                                      \
    X(tg_precision)                                                                                \
    X(tg_batch)                                                                                    \
    X(tg_optim)                                                                                    \
    X(tg_comm)                                                                                     \
    X(tg_zero)                                                                                     \
    X(tg_data)                                                                                     \
    X(tg_eval)                                                                                     \
    X(tg_report)                                                                                   \
    X(tg_json_out)                                                                                 \
    X(tg_plot)                                                                                     \
    X(tg_check)                                                                                    \
    X(tg_sample)                                                                                   \
    X(tg_ckpt)                                                                                     \
    X(tg_machine)

#define TG_DECLARE(g) extern const tg_group g;
#define TG_ADDRESS(g) &g,
TG_GROUPS(TG_DECLARE)

#endif
