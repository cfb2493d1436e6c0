// launch_gemv_mma<kQ4_K>: the Q4_K decode GEMV (one file per type, so the types compile in parallel).
#include "gemv_mma.cuh"

OPENJET_GEMV_MMA_INSTANCE(openjet::kQ4_K)
