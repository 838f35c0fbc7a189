"""The model's configuration: one frozen dataclass, and the named sizes in one table.

`TransformerConfig` is passed whole to every module. Eval and decode variants are
`cfg.replace(deterministic=True, decode=True)` of the training config (as Flax `lm1b` does), so
the three can never drift apart.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax.numpy as jnp

# Allowed values of the string-valued fields, kept here so errors can list them.
CHOICES: dict[str, tuple[str, ...]] = {
    "norm_position": ("post", "pre"),
    "position_encoding": ("sinusoidal", "learned"),
    "activation": ("relu", "gelu"),
    "kernel_init": ("xavier_uniform", "normal"),
    "dtype": ("float32", "bfloat16", "float16"),
    "param_dtype": ("float32", "bfloat16"),
    "attention_impl": ("xla", "cudnn"),
    "remat": ("none", "layer"),
}

# Named sizes. `base` and `big` are the paper's Table 3 rows; `tiny` keeps tests fast.
SIZES: dict[str, dict[str, Any]] = {
    "tiny": dict(d_model=32, num_heads=4, d_ff=64, num_encoder_layers=2, num_decoder_layers=2,
                 dropout_rate=0.1, max_len=64),
    "small": dict(d_model=256, num_heads=4, d_ff=1024, num_encoder_layers=3, num_decoder_layers=3,
                  dropout_rate=0.1),
    "base": dict(d_model=512, num_heads=8, d_ff=2048, num_encoder_layers=6, num_decoder_layers=6,
                 dropout_rate=0.1),
    "big": dict(d_model=1024, num_heads=16, d_ff=4096, num_encoder_layers=6, num_decoder_layers=6,
                dropout_rate=0.3),
}


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """Every knob of the encoder-decoder Transformer. Defaults follow the paper's base model."""

  vocab_size: int = 37000              # source vocabulary (and target, when shared)
  target_vocab_size: int | None = None  # None: one vocabulary for both sides, as the paper
  d_model: int = 512
  num_heads: int = 8
  d_ff: int = 2048
  num_encoder_layers: int = 6
  num_decoder_layers: int = 6
  dropout_rate: float = 0.1            # residual and embedding(+position) dropout, P_drop
  attention_dropout_rate: float = 0.0  # on the attention weights (not in the paper; t2t used 0.1)
  relu_dropout_rate: float = 0.0       # after the FFN activation (not in the paper)
  norm_position: str = "post"          # "post": LN(x + sublayer(x)), the paper; "pre": later work
  layer_norm_epsilon: float = 1e-6
  share_embeddings: bool = True        # one embedding matrix for source and target
  tie_output_embedding: bool = True    # logits through the (target) embedding matrix
  scale_embeddings: bool = True        # multiply embeddings by sqrt(d_model), as the paper
  position_encoding: str = "sinusoidal"
  max_len: int = 256                   # longest position the model (and a learned table) covers
  activation: str = "relu"
  use_bias: bool = True                # FFN biases b_1, b_2 (and an untied output layer's)
  attention_bias: bool = False         # the paper's W^Q, W^K, W^V, W^O have none (nor t2t's)
  kernel_init: str = "xavier_uniform"  # the paper's implementation; "normal" is N(0, 0.02)
  dtype: str = "float32"               # compute dtype
  param_dtype: str = "float32"
  attention_impl: str = "xla"          # "xla": our einsum; "cudnn": jax.nn.dot_product_attention
  # cuDNN attention of unpacked rows gets their padding as sequence lengths (and the decoder's
  # causality as a flag), not as a dense mask: rows must be right-padded, as every batch the
  # data pipeline and the decoders build is. False: the dense mask, for any padding pattern.
  # (Runs from before the field read back False: run/workdir.py LEGACY_VALUES.)
  padding_as_lengths: bool = True
  remat: str = "none"                  # "layer": recompute each layer's activations backward
  fused_qkv: bool = False              # one [embed, 3, heads, kv] matmul for Q, K, V (cross: K, V)
  pad_id: int = 0
  bos_id: int = 2                      # decoder start token inserted by the right shift
  eos_id: int = 3
  deterministic: bool = False          # True disables dropout (evaluation, decoding)
  decode: bool = False                 # True: one token at a time with a key/value cache

  def __post_init__(self):
    for name, allowed in CHOICES.items():
      value = getattr(self, name)
      if value not in allowed:
        raise ValueError(f"TransformerConfig.{name}={value!r}: expected one of {allowed}")
    for name in ("vocab_size", "d_model", "num_heads", "d_ff", "max_len"):
      if getattr(self, name) <= 0:
        raise ValueError(f"TransformerConfig.{name}={getattr(self, name)}: must be positive")
    for name in ("num_encoder_layers", "num_decoder_layers"):
      if getattr(self, name) < 1:
        raise ValueError(f"TransformerConfig.{name}={getattr(self, name)}: need at least 1 layer")
    if self.d_model % self.num_heads:
      raise ValueError(
          f"TransformerConfig.d_model={self.d_model} is not divisible by "
          f"num_heads={self.num_heads}: "
          f"choose num_heads among the divisors of d_model "
          f"{[h for h in range(1, min(self.d_model, 64) + 1) if self.d_model % h == 0]}")
    for name in ("dropout_rate", "attention_dropout_rate", "relu_dropout_rate"):
      if not 0.0 <= getattr(self, name) < 1.0:
        raise ValueError(f"TransformerConfig.{name}={getattr(self, name)}: must be in [0, 1)")
    if not (math.isfinite(self.layer_norm_epsilon) and self.layer_norm_epsilon > 0):
      # 0 or < 0: NaN wherever a row's variance is that small (a constant row is 0 / 0); NaN
      # makes every output NaN, inf every output 0. Training would stop at a non-finite loss.
      raise ValueError(f"TransformerConfig.layer_norm_epsilon={self.layer_norm_epsilon}: must be "
                       "> 0 and finite (the paper's implementation: 1e-6)")
    if self.target_vocab_size not in (None, self.vocab_size) and self.share_embeddings:
      raise ValueError(
          f"TransformerConfig.share_embeddings=True needs one vocabulary, but vocab_size="
          f"{self.vocab_size} and target_vocab_size={self.target_vocab_size}: set "
          "share_embeddings=False or target_vocab_size=None")
    if self.attention_impl == "cudnn" and self.attention_dropout_rate > 0:
      raise ValueError(
          "TransformerConfig.attention_impl='cudnn' has no attention-weight dropout: set "
          "attention_dropout_rate=0.0 or attention_impl='xla'")
    if self.position_encoding == "sinusoidal" and self.d_model % 2:
      raise ValueError(f"TransformerConfig.d_model={self.d_model}: sinusoidal encoding needs it "
                       "even (sine and cosine pairs); or position_encoding='learned'")

  @property
  def head_dim(self) -> int:
    return self.d_model // self.num_heads

  @property
  def output_vocab_size(self) -> int:
    return self.target_vocab_size or self.vocab_size

  @property
  def compute_dtype(self):
    return jnp.dtype(self.dtype)

  @property
  def params_dtype(self):
    return jnp.dtype(self.param_dtype)

  def replace(self, **changes) -> "TransformerConfig":
    return dataclasses.replace(self, **changes)

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


def model_config(size: str = "base", **overrides) -> TransformerConfig:
  """A named size from `SIZES` with any field overridden, e.g.
  `model_config("big", vocab_size=32000)`."""
  if size not in SIZES:
    raise ValueError(f"model size {size!r}: expected one of {tuple(SIZES)}")
  fields = {f.name for f in dataclasses.fields(TransformerConfig)}
  unknown = sorted(set(overrides) - fields)
  if unknown:
    raise ValueError(f"unknown TransformerConfig field(s) {unknown}: expected among "
                     f"{sorted(fields)}")
  return TransformerConfig(**{**SIZES[size], **overrides})
