// launch_gemv_mma<kQ6_K>: the Q6_K decode GEMV (one file per type, so the types compile in parallel).
#include "gemv_mma.cuh"

OPENJET_GEMV_MMA_INSTANCE(openjet::kQ6_K)
