"""The Qwen3.8 ("qwen35") hyper-parameters as data: the 27B target and the synthetic presets.

One frozen dataclass describes every model of the family; the GGUF metadata keys map onto its
fields one to one (``GGUF_KEYS``), so reading a file and writing a synthetic one share a table.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

ARCH = "qwen35"


@dataclass(frozen=True)
class ModelShape:
    n_embd: int                 # hidden size
    n_ff: int                   # SwiGLU intermediate size
    n_layer: int                # trunk layers (the MTP block is stored after them)
    n_nextn: int                # MTP ("nextn") blocks stored as blk.{n_layer}
    n_head: int                 # attention query heads
    n_head_kv: int              # attention key/value heads (GQA group = n_head / n_head_kv)
    head_dim: int               # attention key = value head size
    n_rot: int                  # rotated dims per head (partial RoPE, NeoX pairing)
    rope_sections: tuple[int, ...]  # interleaved M-RoPE sections (sum = n_rot / 2)
    ssm_n_k_heads: int          # Gated DeltaNet key heads (ssm.group_count)
    ssm_n_v_heads: int          # Gated DeltaNet value heads (ssm.time_step_rank)
    ssm_head_dim: int           # Gated DeltaNet k and v head size (ssm.state_size)
    n_vocab: int                # embedding / lm_head rows (padded vocabulary)
    n_ctx_train: int = 262144
    rope_base: float = 1.0e7
    rms_eps: float = 1.0e-6
    full_attn_interval: int = 4
    ssm_conv_kernel: int = 4

    # Derived sizes, named as the spec names them.
    @property
    def n_block(self) -> int:
        return self.n_layer + self.n_nextn

    @property
    def ssm_d_inner(self) -> int:        # value_dim
        return self.ssm_n_v_heads * self.ssm_head_dim

    @property
    def ssm_key_dim(self) -> int:
        return self.ssm_n_k_heads * self.ssm_head_dim

    @property
    def ssm_conv_dim(self) -> int:       # q ‖ k ‖ v channels of the causal conv
        return 2 * self.ssm_key_dim + self.ssm_d_inner

    @property
    def q_dim(self) -> int:              # attention output width (n_head * head_dim)
        return self.n_head * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_head_kv * self.head_dim

    def is_attention_layer(self, il: int) -> bool:
        """Full attention every ``full_attn_interval``-th trunk layer; the MTP block is attention too."""
        return il >= self.n_layer or (il + 1) % self.full_attn_interval == 0

    def with_(self, **changes) -> "ModelShape":
        return replace(self, **changes)


# Qwen3.8-27B as stored in real GGUF files (qwen38.md §1, §2.1).
QWEN38_27B = ModelShape(
    n_embd=5120, n_ff=17408, n_layer=64, n_nextn=1,
    n_head=24, n_head_kv=4, head_dim=256, n_rot=64, rope_sections=(11, 11, 10, 0),
    ssm_n_k_heads=16, ssm_n_v_heads=48, ssm_head_dim=128, n_vocab=248320,
)

# Synthetic presets. Per-head sizes stay at the 27B values (attention 256 with 64 rotary dims,
# DeltaNet 128) so every kernel path is the real one; more value heads than key heads so that a
# wrong head pairing (v mod n_k vs v div ratio) changes the output.
PRESETS: dict[str, ModelShape] = {
    "tiny": ModelShape(
        n_embd=256, n_ff=768, n_layer=4, n_nextn=1,
        n_head=4, n_head_kv=2, head_dim=256, n_rot=64, rope_sections=(11, 11, 10, 0),
        ssm_n_k_heads=2, ssm_n_v_heads=6, ssm_head_dim=128, n_vocab=4096, n_ctx_train=4096,
    ),
    "small": ModelShape(
        n_embd=1024, n_ff=3072, n_layer=8, n_nextn=1,
        n_head=8, n_head_kv=2, head_dim=256, n_rot=64, rope_sections=(11, 11, 10, 0),
        ssm_n_k_heads=4, ssm_n_v_heads=12, ssm_head_dim=128, n_vocab=8192, n_ctx_train=32768,
    ),
    "full": QWEN38_27B,
}


@dataclass(frozen=True)
class Key:
    """One ``qwen35.*`` metadata key: the field it fills and whether a file may omit it."""
    name: str
    field: str
    required: bool = True
    default: object = None


GGUF_KEYS: tuple[Key, ...] = (
    Key("block_count", "n_block"),
    Key("nextn_predict_layers", "n_nextn", required=False, default=0),
    Key("context_length", "n_ctx_train", required=False, default=262144),
    Key("embedding_length", "n_embd"),
    Key("feed_forward_length", "n_ff"),
    Key("attention.head_count", "n_head"),
    Key("attention.head_count_kv", "n_head_kv"),
    Key("attention.key_length", "head_dim"),
    Key("attention.value_length", "value_length"),   # must equal key_length
    Key("attention.layer_norm_rms_epsilon", "rms_eps"),
    Key("rope.freq_base", "rope_base"),
    Key("rope.dimension_count", "n_rot"),
    Key("rope.dimension_sections", "rope_sections"),
    Key("full_attention_interval", "full_attn_interval"),
    Key("ssm.conv_kernel", "ssm_conv_kernel"),
    Key("ssm.state_size", "ssm_head_dim"),
    Key("ssm.group_count", "ssm_n_k_heads"),
    Key("ssm.time_step_rank", "ssm_n_v_heads"),
    Key("ssm.inner_size", "ssm_d_inner"),
)

# Values fixed for the whole family: our kernels and the reference are built for exactly these.
FAMILY_CONSTANTS: dict[str, object] = {
    "rope_base": 1.0e7,
    "rms_eps": 1.0e-6,
    "full_attn_interval": 4,
    "ssm_conv_kernel": 4,
    "head_dim": 256,
    "n_rot": 64,
    "rope_sections": (11, 11, 10, 0),
    "ssm_head_dim": 128,
}

# Special tokens of the Qwen3.5/3.8 tokenizer (qwen38.md §1.1), as offsets from the first added id.
EOS_TOKENS = ("<|im_end|>", "<|endoftext|>")
