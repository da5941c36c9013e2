/* distlab: one multicore machine as a small GPU cluster. Umbrella header. */
#ifndef DISTLAB_H
#define DISTLAB_H

#define DISTLAB_VERSION_STRING "0.2.0"

#include "distlab/error.h"
#include "distlab/world.h"
#include "distlab/comm.h"
#include "distlab/coll.h"
#include "distlab/plan.h"
#include "distlab/sched.h"
#include "distlab/tera.h"
#include "distlab/model.h"
#include "distlab/ckpt.h"
#include "distlab/gpt.h"
#include "distlab/train.h"
#include "distlab/data.h"
#include "distlab/trace.h"
#include "distlab/pipe.h"
#include "distlab/mpi.h"

#ifdef __cplusplus
extern "C" {
#endif
/* Library version ("0.2.0"). */
const char *dl_version(void);
#ifdef __cplusplus
}
#endif
#endif
