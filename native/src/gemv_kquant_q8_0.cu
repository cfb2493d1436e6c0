// launch_gemv_type<kQ8_0>: the Q8_0 GEMV kernels for T = 1..8 and 1, 2 or 4 rows per warp.
#include "gemv_kquant_launch.cuh"

OPENJET_GEMV_TYPE_INSTANCE(openjet::kQ8_0)
