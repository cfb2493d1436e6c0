// launch_gemv_mma<kQ8_0>: the Q8_0 decode GEMV (one file per type, so the types compile in parallel).
#include "gemv_mma.cuh"

OPENJET_GEMV_MMA_INSTANCE(openjet::kQ8_0)
