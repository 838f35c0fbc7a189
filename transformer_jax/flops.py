"""Analytic model FLOPs of the Transformer and the peak FLOP/s they are compared against (MFU).

We count the multiply-adds of matrix products (2 FLOPs each) on real (non-pad) tokens only, per
sentence, as the model's useful work. With d = d_model, f = d_ff, V = the output vocabulary, a
sentence of s source and t target tokens:
  encoder layer: Q,K,V,O projections 8 d^2 s + FFN 4 d f s;
    self-attention scores (Q K^T) and weighted sum (A V): 2 d + 2 d = 4 d per (query, key)
    pair, s^2 pairs (full);
  decoder layer: self Q,K,V,O 8 d^2 t + cross Q,O 4 d^2 t + FFN 4 d f t;
    cross K,V 4 d^2 s (on the encoder output, once per sentence);
    causal self-attention 4 d per pair, t (t + 1) / 2 pairs; cross-attention 4 d per pair, s t;
  output projection 2 d V t.
Packed rows count each sentence on its own (no pairs across segments), so a packed row costs
the sum of its sentences. Left out: embedding lookups, biases, LayerNorm, softmax, dropout and
the optimizer (O(d) per token each, about 2-3% of the total for the paper's sizes). A training
step is 3x the forward pass: the backward pass is two matmuls per forward matmul (gradients
of the input and of the weight). Rematerialisation recomputes the layers' forward pass; that is
hardware work, not model work, so MFU leaves it out (as MaxText and PaLM's MFU do).

What XLA's `cost_analysis()` reports for the compiled program is larger, for three reasons:
it counts every padded position and the masked upper half of the causal square (`causal="full"`
below reproduces that part), and it counts elementwise work (softmax, LayerNorm, dropout,
biases, the loss) at about one FLOP per element. `tests/test_flops.py` states the tolerance.
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec
import numpy as np

# Dense peak FLOP/s per chip (no structured sparsity), from the vendors' data sheets, in the
# order they are matched against `device.device_kind` (a case-insensitive substring): the more
# specific names first ("H100 PCIe" before "H100", "TPU v5 lite" before "TPU v5").
# float32 on Ampere/Hopper GPUs is the TF32 tensor-core rate, because XLA's default matmul
# precision runs float32 matmuls as TF32 there; on TPUs it runs them as one bfloat16 pass.
PEAK_FLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    ("H100 PCIe", {"bfloat16": 756e12, "float16": 756e12, "float32": 378e12}),
    ("H100 NVL", {"bfloat16": 835e12, "float16": 835e12, "float32": 418e12}),
    ("H100", {"bfloat16": 989e12, "float16": 989e12, "float32": 494e12}),    # SXM; "H100 80GB HBM3"
    ("H200", {"bfloat16": 989e12, "float16": 989e12, "float32": 494e12}),    # also GH200
    ("A100", {"bfloat16": 312e12, "float16": 312e12, "float32": 156e12}),    # SXM and PCIe
    ("L40S", {"bfloat16": 362e12, "float16": 362e12, "float32": 183e12}),   # before "L40", "L4"
    ("L40", {"bfloat16": 181e12, "float16": 181e12, "float32": 90.5e12}),
    ("L4", {"bfloat16": 121e12, "float16": 121e12, "float32": 60e12}),
    ("V100", {"float16": 125e12, "float32": 15.7e12}),                      # no bfloat16 units
    ("TPU v6 lite", {"bfloat16": 918e12, "float32": 918e12}),                # v6e (Trillium)
    ("TPU v5 lite", {"bfloat16": 197e12, "float32": 197e12}),                # v5e
    ("TPU v5p", {"bfloat16": 459e12, "float32": 459e12}),
    ("TPU v5", {"bfloat16": 459e12, "float32": 459e12}),                     # v5p reports "TPU v5"
    ("TPU v4", {"bfloat16": 275e12, "float32": 275e12}),
)


def sentence_lengths(segments: np.ndarray) -> np.ndarray:
  """Lengths of every segment (sentence) in a `[rows, length]` segment-id array (0 = padding)."""
  out = []
  for row in np.asarray(segments):
    _, counts = np.unique(row[row > 0], return_counts=True)
    out.extend(counts.tolist())
  return np.asarray(out, np.int64)


def batch_lengths(batch, pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """Per-sentence (source, target) real lengths of a batch, packed or not.

  Packed rows list their segments in order, source and target segment k being one pair; an
  unpacked row is one pair whose length is its number of non-pad tokens.
  """
  if "inputs_segmentation" in batch:
    return (sentence_lengths(batch["inputs_segmentation"]),
            sentence_lengths(batch["targets_segmentation"]))
  return ((np.asarray(batch["inputs"]) != pad_id).sum(1),
          (np.asarray(batch["targets"]) != pad_id).sum(1))


def forward_flops_breakdown(cfg, source_lengths, target_lengths,
                            causal: str = "half") -> dict[str, float]:
  """FLOPs of one forward pass per component, over sentences with these real lengths.

  `causal="half"` counts the t (t + 1) / 2 query-key pairs decoder self-attention needs (model
  FLOPs); `"full"` counts the t^2 a dense implementation computes before masking.
  """
  if causal not in ("half", "full"):
    raise ValueError(f"causal={causal!r}: expected 'half' or 'full'")
  s = np.asarray(source_lengths, np.float64)
  t = np.asarray(target_lengths, np.float64)
  if s.shape != t.shape:
    raise ValueError(f"{s.size} source and {t.size} target lengths: one of each per sentence")
  d, f, v = cfg.d_model, cfg.d_ff, cfg.output_vocab_size
  ne, nd = cfg.num_encoder_layers, cfg.num_decoder_layers
  causal_pairs = (t * (t + 1) / 2).sum() if causal == "half" else (t * t).sum()
  return {
      "encoder_qkvo": ne * 8 * d * d * s.sum(),
      "encoder_ffn": ne * 4 * d * f * s.sum(),
      "encoder_attention": ne * 4 * d * (s * s).sum(),
      "decoder_self_qkvo": nd * 8 * d * d * t.sum(),
      "decoder_cross_qo": nd * 4 * d * d * t.sum(),
      "decoder_cross_kv": nd * 4 * d * d * s.sum(),
      "decoder_ffn": nd * 4 * d * f * t.sum(),
      "decoder_self_attention": nd * 4 * d * causal_pairs,
      "decoder_cross_attention": nd * 4 * d * (s * t).sum(),
      "output_projection": 2 * d * v * t.sum(),
  }


def forward_flops(cfg, source_lengths, target_lengths, causal: str = "half") -> float:
  """FLOPs of one forward pass over sentences with these real lengths (see the module doc)."""
  return float(sum(forward_flops_breakdown(cfg, source_lengths, target_lengths, causal).values()))


def train_flops(cfg, source_lengths, target_lengths) -> float:
  """Model FLOPs of one training step (forward + backward = 3x forward; the update is O(params))."""
  return 3.0 * forward_flops(cfg, source_lengths, target_lengths)


def peak_flops_for_kind(device_kind: str, dtype: str = "bfloat16") -> tuple[float, str] | None:
  """(dense peak FLOP/s, table key) for a device kind string, or None when the table lacks it."""
  for key, rates in PEAK_FLOPS:
    if key.lower() in device_kind.lower():
      return rates.get(dtype, float("nan")), key  # NaN: no such units (V100 bfloat16)
  return None


# The side of the CPU's peak matmul: large enough to run at the CPU's peak (a 256 matmul does not),
# small enough to measure at start-up in about a second.
PEAK_MATMUL_N = 2048


def measure_matmul_peak(n: int = PEAK_MATMUL_N, dtype=jnp.float32, repeats: int = 9,
                        min_seconds: float = 0.0) -> float:
  """FLOP/s of a jitted n x n matmul, one on each local device at once: a CPU host's peak.

  The median over `repeats` timed calls (at least `min_seconds` in all), after one untimed call
  that compiles. On a shared machine this moves with the load, as the step times do: measure it
  in the same run as what it is compared with.
  """
  a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n)), dtype)
  copies = 1
  devices = jax.local_devices()
  if len(devices) > 1:
    # Fake CPU devices (--xla_force_host_platform_device_count) split the host's cores: one
    # matmul per device at once measures the whole host, as the sharded step uses it.
    # (Accelerators are not measured: `peak_flops` reads their data sheets' PEAK_FLOPS.)
    copies = len(devices)
    mesh = Mesh(np.array(devices), ("d",))
    a = jax.device_put(jnp.stack([a] * copies), NamedSharding(mesh, PartitionSpec("d")))
  f = jax.jit(lambda x: x @ x)
  f(a).block_until_ready()
  times: list[float] = []
  start = time.perf_counter()
  while len(times) < repeats or time.perf_counter() - start < min_seconds:
    t0 = time.perf_counter()
    f(a).block_until_ready()
    times.append(time.perf_counter() - t0)
  return copies * 2 * n**3 / float(np.median(times))


def peak_flops(dtype: str = "float32", device=None, **measure_kwargs) -> tuple[float, str]:
  """(peak FLOP/s per device, where the number comes from) for the device's kind and `dtype`.

  Accelerators: the `PEAK_FLOPS` table. CPUs: a matmul measured now (of the whole host, which
  fake CPU devices share). Unknown accelerators: NaN, so MFU shows as NaN instead of stopping a
  training run; add the device to `PEAK_FLOPS`.
  """
  device = device or jax.devices()[0]
  found = peak_flops_for_kind(device.device_kind, dtype)
  if found is not None:
    return found[0], f"table[{found[1]}][{dtype}]"
  if device.platform == "cpu":
    n = measure_kwargs.pop("n", PEAK_MATMUL_N)
    return (measure_matmul_peak(n, jnp.dtype(dtype), **measure_kwargs),
            f"measured {dtype} {n}x{n} matmul")
  return float("nan"), (f"unknown device kind {device.device_kind!r}: add it to "
                        "transformer_jax.flops.PEAK_FLOPS")


def peak_total(peak: float, platform: str, device_count: int) -> float:
  """The peak FLOP/s of all the devices a step runs on, from `peak_flops`' per device: a CPU's
  measured peak is the whole host's (which fake CPU devices share); an accelerator's table
  entry is per chip."""
  return peak if platform == "cpu" else peak * device_count


def mfu_note(mfu: float, peak_source: str, how: str) -> str | None:
  """A line for an MFU above 100% on a measured CPU peak, else None; `how` says how to measure
  on a larger matmul (the flag and its default).

  A small matmul (say 256) runs below the CPU's peak, slower than the model's larger matmuls, so
  it is no peak to divide by; and a peak measured while other processes loaded the cores (it is
  measured once, when the process starts) is below what the step reaches once they finish. Above
  100% on a table's peak would be a FLOP count's bug instead, and is left to show as it is."""
  if not (mfu > 1 and peak_source.startswith("measured")):
    return None
  return (f"note: MFU above 100%: the peak ({peak_source}) is below the CPU's: too small a "
          f"matmul, or measured while other processes loaded the machine (once, at the start); "
          f"measure it on a larger one ({how}) with the machine otherwise idle")
