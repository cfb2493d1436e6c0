"""One prefill call of a mixer kernel at the 27B's widths, for a profiler to catch (scripts/gpu_ncu_attn_gdn.sh):

    python native/bench/one_prefill_kernel.py attn KV N_PAST   # the flash attention of a 2,048-row chunk after
                                                               # N_PAST cached rows; KV: F16 or Q8_0
    python native/bench/one_prefill_kernel.py gdn [ROWS]       # the chunked GDN of a 2,048-row (ROWS-row) call
                                                               # (the form OPENJET_GDN_CHUNKED selects, default
                                                               # two phases)
    python native/bench/one_prefill_kernel.py engine MODEL ROWS   # a ROWS-token prefill of a GGUF (q8_0 KV,
                                                               # ROWS-row chunks): every kernel of a whole chunk,
                                                               # inside cuProfilerStart/Stop (for ncu
                                                               # --profile-from-start off: not the load's kernels)
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from openjet_launcher.engine import kernels_test_attn as ka  # noqa: E402
from openjet_launcher.engine import kernels_test_gdn as kg  # noqa: E402

T = 2048


def main() -> None:
    what = sys.argv[1] if sys.argv[1:] else ""
    if what == "attn":
        ka.bench_attn_prefill(ka.KV_TYPES[sys.argv[2]], 24, 4, int(sys.argv[3]), T, 1, 1)
    elif what == "gdn":
        kg.bench_gdn(16, 48, int(sys.argv[2]) if sys.argv[2:] else T, 1, 1, 1)
    elif what == "engine":
        import ctypes

        import numpy as np

        from openjet_launcher.engine.cuda import CudaEngine

        rows = int(sys.argv[3])
        engine = CudaEngine.load(sys.argv[2], n_ctx=rows + 64, kv_type="q8_0", prefill_rows=rows)
        cuda = ctypes.CDLL("libcuda.so.1")  # the driver's profiler range: the engine's context is current here
        try:
            state = engine.new_state()
            ids = np.random.default_rng(0).integers(0, 4096, rows)
            if cuda.cuProfilerStart() != 0:
                sys.exit("cuProfilerStart failed")
            try:
                engine.prefill(state, ids)
            finally:
                cuda.cuProfilerStop()
        finally:
            engine.close()
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
