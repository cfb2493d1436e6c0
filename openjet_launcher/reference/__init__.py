"""The numpy reference engine: qwen38.md §3 in float32, the oracle every GPU test compares against.

    engine = ReferenceEngine.load("tiny.gguf")
    state = engine.new_state()
    out = engine.prefill(state, prompt_ids)          # out.logits [1, n_vocab]
    out = engine.decode(state, [next_id])
"""

from .engine import ReferenceEngine
from .state import ReferenceState

__all__ = ["ReferenceEngine", "ReferenceState"]
