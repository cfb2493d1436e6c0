// launch_gemv_type<kQ6_K>: the Q6_K GEMV kernels for T = 1..8 and 1, 2 or 4 rows per warp.
#include "gemv_kquant_launch.cuh"

OPENJET_GEMV_TYPE_INSTANCE(openjet::kQ6_K)
