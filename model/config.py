"""ModelConfig: every shape and architectural choice of a GPT, validated when it is built."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar, Literal

from common.schema import Bool, Float, Int, Nullable, Str, check_fields

MLP_KINDS = ("gelu", "swiglu")
NORM_KINDS = ("layernorm", "rmsnorm")
POS_KINDS = ("rope", "learned")
ATTN_IMPLS = ("manual", "sdpa")


@dataclass
class ModelConfig:
    vocab_size: int = 50304  # GPT-2's 50257 padded up to a multiple of 64 (faster matmuls); char models use their own
    block_size: int = 256  # the longest context the model sees; learned positions and the RoPE table are this long
    n_layer: int = 6  # transformer blocks
    n_head: int = 6  # query heads
    n_kv_head: int | None = None  # key/value heads shared by groups of query heads (GQA); None -> n_head (MHA), 1 -> MQA
    d_model: int = 384  # residual-stream width; head_dim = d_model // n_head
    mlp: Literal["gelu", "swiglu"] = "gelu"  # GPT-2's GELU MLP or LLaMA's gated SwiGLU
    mlp_hidden: int | None = None  # MLP inner width; None -> 4*d_model (gelu) or 8/3*d_model rounded up to 32 (swiglu)
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"  # pre-norm before attention and MLP, and after the last block
    pos: Literal["rope", "learned"] = "learned"  # rotary embeddings on q, k; or GPT-2's learned absolute positions
    rope_theta: float = 10000.0  # RoPE base: larger values rotate slower, reaching further
    norm_eps: float | None = None  # added to the variance inside each norm; None -> 1e-5 (layernorm), 1e-6 (rmsnorm)
    dropout: float = 0.0  # on attention weights, residual branches and embeddings; 0 for pretraining
    bias: bool = False  # biases in Linear and LayerNorm; False is slightly better and faster (nanoGPT)
    tie_embeddings: bool = True  # the LM head reuses the token-embedding matrix
    attn_impl: Literal["manual", "sdpa"] = "manual"  # from-scratch softmax(QK^T/sqrt(d))V, or fused F.scaled_dot_product_attention

    # each field's rule (common/schema.py: the rules that check untrusted JSON), with the words its message says
    # where they are not the rule's own; checked before the rules between fields in __post_init__
    FIELDS: ClassVar = {
        **dict.fromkeys(("vocab_size", "block_size", "n_layer", "n_head", "n_kv_head", "d_model"), Int(1)),
        "mlp_hidden": Nullable(Int(1)), "bias": Bool(), "tie_embeddings": Bool(),
        **{name: (Str(kinds), f"one of {', '.join(kinds)}") for name, kinds in
           (("mlp", MLP_KINDS), ("norm", NORM_KINDS), ("pos", POS_KINDS), ("attn_impl", ATTN_IMPLS))},
        "rope_theta": Float(above=0),
        "norm_eps": (Nullable(Float(above=0, below=1)), "in (0, 1), or null for the norm's default"),
        "dropout": (Float(low=0, below=1), "in [0, 1)")}

    def __post_init__(self) -> None:
        """Every field of its type and in range (a config may come from a file someone else wrote: a bool is not
        an integer, 16.0 is not an integer, inf is not a number here); sizes are bounded by memory, not here
        (pretrained/memory.py)."""
        if self.n_kv_head is None:
            self.n_kv_head = self.n_head
        check_fields(self, self.FIELDS)
        if self.d_model % self.n_head != 0:
            raise ValueError(f"d_model={self.d_model}: must be divisible by n_head={self.n_head} "
                             f"(head_dim = d_model // n_head)")
        if self.n_head % self.n_kv_head != 0:
            raise ValueError(f"n_kv_head={self.n_kv_head}: n_head={self.n_head} must be divisible by it, "
                             f"so each key/value head serves the same number of query heads")
        if self.pos == "rope" and self.head_dim % 2 != 0:
            raise ValueError(f"pos='rope' needs an even head_dim, got d_model/n_head = {self.head_dim}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def norm_epsilon(self) -> float:
        """norm_eps, or the default of the norm in use (PyTorch's LayerNorm 1e-5; RMSNorm 1e-6 as in LLaMA)."""
        if self.norm_eps is not None:
            return float(self.norm_eps)
        return 1e-5 if self.norm == "layernorm" else 1e-6

    @property
    def hidden_dim(self) -> int:
        if self.mlp_hidden is not None:
            return self.mlp_hidden
        if self.mlp == "gelu":
            return 4 * self.d_model
        # SwiGLU has three matrices instead of two: 2/3 of 4*d keeps the parameter count of a GELU MLP
        hidden = int(8 * self.d_model / 3)
        return 32 * ((hidden + 31) // 32)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ModelConfig":
        if not isinstance(d, dict):
            raise TypeError(f"a model config must be a mapping of its settings, not {type(d).__name__}")
        unknown = sorted(set(d) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"unknown model config keys: {', '.join(unknown)}")
        return cls(**d)
