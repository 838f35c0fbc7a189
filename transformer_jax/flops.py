"""Analytic model FLOPs of the Transformer and the peak FLOP/s they are compared against (MFU).

We count the multiply-adds of matrix products (2 FLOPs each) on real (non-pad) tokens only, per
sentence, as the model's useful work:
  encoder layer, per source token: Q,K,V,O projections 8 d^2 + FFN 4 d d_ff;
    self-attention scores and weighted sum 4 d per (query, key) pair, s^2 pairs per sentence;
  decoder layer, per target token: self Q,K,V,O 8 d^2 + cross Q,O 4 d^2 + FFN 4 d d_ff;
    cross K,V 4 d^2 per *source* token (computed once per sentence);
    causal self-attention 4 d per pair, t (t + 1) / 2 pairs; cross-attention 4 d per pair, s t pairs;
  output projection 2 d V per target token.
Left out: embeddings (lookups), biases, LayerNorm, softmax and the optimizer (each O(d) per
token, under 1% for the paper's sizes). A training step is 3x the forward pass (the backward pass
is two matmuls per forward matmul). The XLA program does more work than this: padding, the masked
upper half of causal attention, elementwise ops; see `tests/test_flops.py` for the comparison.
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

# Dense peak FLOP/s per chip for the compute dtype (no sparsity), from the vendors' data sheets.
PEAK_FLOPS = {
    # device_kind substring: {dtype: flop/s}
    "H200": {"bfloat16": 989e12, "float16": 989e12, "float32": 67e12},
    "H100": {"bfloat16": 989e12, "float16": 989e12, "float32": 67e12},   # SXM
    "A100": {"bfloat16": 312e12, "float16": 312e12, "float32": 19.5e12},
    "L4": {"bfloat16": 121e12, "float16": 121e12, "float32": 30e12},
    "V100": {"bfloat16": 125e12, "float16": 125e12, "float32": 15.7e12},
    "TPU v6": {"bfloat16": 918e12, "float32": 918e12 / 4},
    "TPU v5p": {"bfloat16": 459e12, "float32": 459e12 / 4},
    "TPU v5 lite": {"bfloat16": 197e12, "float32": 197e12 / 4},   # v5e
    "TPU v5e": {"bfloat16": 197e12, "float32": 197e12 / 4},
    "TPU v4": {"bfloat16": 275e12, "float32": 275e12 / 4},
}


def sentence_lengths(segments: np.ndarray) -> np.ndarray:
  """Lengths of every segment (sentence) in a `[rows, length]` segment-id array (0 = padding)."""
  out = []
  for row in np.asarray(segments):
    ids, counts = np.unique(row[row > 0], return_counts=True)
    out.extend(counts.tolist())
  return np.asarray(out, np.int64)


def batch_lengths(batch, pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """Per-sentence (source, target) real lengths of a batch, packed or not."""
  if "inputs_segmentation" in batch:
    return (sentence_lengths(batch["inputs_segmentation"]),
            sentence_lengths(batch["targets_segmentation"]))
  return ((np.asarray(batch["inputs"]) != pad_id).sum(1),
          (np.asarray(batch["targets"]) != pad_id).sum(1))


def forward_flops(cfg, source_lengths, target_lengths) -> float:
  """FLOPs of one forward pass over sentences with these real lengths (see the module doc)."""
  s = np.asarray(source_lengths, np.float64)
  t = np.asarray(target_lengths, np.float64)
  d, f, v = cfg.d_model, cfg.d_ff, cfg.output_vocab_size
  encoder = cfg.num_encoder_layers * (s.sum() * (8 * d * d + 4 * d * f) + 4 * d * (s * s).sum())
  decoder = cfg.num_decoder_layers * (
      t.sum() * (12 * d * d + 4 * d * f) + s.sum() * 4 * d * d
      + 4 * d * (t * (t + 1) / 2).sum() + 4 * d * (s * t).sum())
  logits = 2 * d * v * t.sum()
  return float(encoder + decoder + logits)


def train_flops(cfg, source_lengths, target_lengths) -> float:
  return 3.0 * forward_flops(cfg, source_lengths, target_lengths)


def measure_matmul_peak(n: int = 2048, dtype=jnp.float32, repeats: int = 5) -> float:
  """FLOP/s of a jitted n x n matmul on the default device: the CPU's reference peak."""
  a = jnp.ones((n, n), dtype)
  f = jax.jit(lambda x: x @ x)
  f(a).block_until_ready()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    f(a).block_until_ready()
    times.append(time.perf_counter() - start)
  return 2 * n**3 / float(np.median(times))


def peak_flops(dtype: str = "float32", device=None) -> tuple[float, str]:
  """(peak FLOP/s per device, where the number comes from) for the device kind and dtype."""
  device = device or jax.devices()[0]
  kind = device.device_kind
  for key, table in PEAK_FLOPS.items():
    if key.lower() in kind.lower():
      return table.get(dtype, table["bfloat16"]), f"table[{key}][{dtype}]"
  if device.platform == "cpu":
    return measure_matmul_peak(), "measured float32 2048x2048 matmul"
  raise ValueError(f"no peak FLOP/s known for device kind {kind!r}: add it to "
                   "transformer_jax.flops.PEAK_FLOPS")
