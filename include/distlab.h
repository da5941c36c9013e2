/* distlab: one multicore machine as a small GPU cluster. Umbrella header. */
#ifndef DISTLAB_H
#define DISTLAB_H

#define DISTLAB_VERSION_STRING "0.1.0"

#include "distlab/error.h"
#include "distlab/arena.h"
#include "distlab/topo.h"
#include "distlab/chan.h"
#include "distlab/world.h"
#include "distlab/comm.h"
#include "distlab/coll.h"
#include "distlab/plan.h"
#include "distlab/sched.h"
#include "distlab/ops.h"
#include "distlab/blas.h"
#include "distlab/model.h"
#include "distlab/path.h"
#include "distlab/ckpt.h"
#include "distlab/gpt.h"
#include "distlab/train.h"
#include "distlab/data.h"
#include "distlab/trace.h"
#include "distlab/pipe.h"

#ifdef __cplusplus
extern "C" {
#endif
/* Library version ("0.1.0"). */
const char *dl_version(void);
#ifdef __cplusplus
}
#endif
#endif
