// launch_gemv_mma<kQ5_K>: the Q5_K decode GEMV (one file per type, so the types compile in parallel).
#include "gemv_mma.cuh"

OPENJET_GEMV_MMA_INSTANCE(openjet::kQ5_K)
