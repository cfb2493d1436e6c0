"""OpenJet: run Qwen3.8-27B fast on one NVIDIA GPU.

Data flows one way: GGUF -> config and tensors (``model``) -> engine -> tokens -> text -> HTTP.
"""

__version__ = "0.1.0"
