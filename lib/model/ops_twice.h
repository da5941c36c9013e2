/* distlab (private): compile the kernel file DL_OPS_SELF names twice, as the f32 and the f64
 * variant (model/ops_tmpl.h explains the template). */
#define DL_OPS_BODY 1
#define real float
#define SFX _f32
#define DL_OPS_F32 1
#include DL_OPS_SELF
#undef real
#undef SFX
#undef DL_OPS_F32
#define real double
#define SFX _f64
#define DL_OPS_F32 0
#include DL_OPS_SELF
#undef real
#undef SFX
#undef DL_OPS_F32
#undef DL_OPS_BODY
