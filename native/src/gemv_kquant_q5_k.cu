// launch_gemv_type<kQ5_K>: the Q5_K GEMV kernels for T = 1..8 and 1, 2 or 4 rows per warp.
#include "gemv_kquant_launch.cuh"

OPENJET_GEMV_TYPE_INSTANCE(openjet::kQ5_K)
