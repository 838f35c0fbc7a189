"""Analytic FLOPs: a hand count, packing, XLA's count of the compiled program, the peak table."""
import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer_jax as tj
from transformer_jax import flops
from transformer_jax.config import CHOICES


def small_config(**overrides):
  kw = dict(vocab_size=10, d_model=8, num_heads=2, d_ff=16, num_encoder_layers=2,
            num_decoder_layers=1)
  kw.update(overrides)
  return tj.model_config("tiny", **kw)


def test_forward_flops_against_a_hand_count():
  # Two sentences: (s, t) = (3, 2) and (1, 4). d = 8, d_ff = 16, V = 10, 2 encoder layers,
  # 1 decoder layer.
  cfg = small_config()
  d, f, v = 8, 16, 10
  src_tokens, tgt_tokens = 3 + 1, 2 + 4
  hand = {
      # Per encoder layer and source token: 4 projections d x d, 2 FLOPs per multiply-add.
      "encoder_qkvo": 2 * 4 * (2 * d * d) * src_tokens,                  # 4096
      # FFN: d -> d_ff -> d.
      "encoder_ffn": 2 * 2 * (2 * d * f) * src_tokens,                   # 4096
      # Q K^T and A V: 2 d FLOPs each per (query, key) pair; full s x s pairs: 9 + 1.
      "encoder_attention": 2 * (2 * d + 2 * d) * (3 * 3 + 1 * 1),        # 640
      "decoder_self_qkvo": 1 * 4 * (2 * d * d) * tgt_tokens,             # 3072
      # Cross-attention Q and O on target tokens, K and V on source tokens.
      "decoder_cross_qo": 1 * 2 * (2 * d * d) * tgt_tokens,              # 1536
      "decoder_cross_kv": 1 * 2 * (2 * d * d) * src_tokens,              # 1024
      "decoder_ffn": 1 * 2 * (2 * d * f) * tgt_tokens,                   # 3072
      # Causal pairs: t (t + 1) / 2 = 3 and 10.
      "decoder_self_attention": 1 * (4 * d) * (3 + 10),                  # 416
      # Source x target pairs: 3 * 2 + 1 * 4.
      "decoder_cross_attention": 1 * (4 * d) * (6 + 4),                  # 320
      "output_projection": 2 * d * v * tgt_tokens,                       # 960
  }
  got = flops.forward_flops_breakdown(cfg, [3, 1], [2, 4])
  assert got == pytest.approx(hand)
  assert flops.forward_flops(cfg, [3, 1], [2, 4]) == pytest.approx(19232)
  assert sum(hand.values()) == 19232
  assert flops.train_flops(cfg, [3, 1], [2, 4]) == pytest.approx(3 * 19232)
  # A dense implementation computes the whole causal square: t^2 = 4 + 16 pairs.
  full = flops.forward_flops_breakdown(cfg, [3, 1], [2, 4], causal="full")
  assert full["decoder_self_attention"] == pytest.approx(4 * d * 20)
  # An untied output layer does the same matmul.
  assert flops.forward_flops(small_config(tie_output_embedding=False), [3, 1], [2, 4]) == \
      pytest.approx(19232)
  with pytest.raises(ValueError, match="one of each per sentence"):
    flops.forward_flops(cfg, [3, 1], [2])


def test_padding_is_not_counted_and_packed_rows_are_the_sum_of_their_sentences():
  cfg = small_config()
  # Unpacked: lengths are the non-pad tokens of each row.
  padded = {"inputs": np.array([[5, 6, 7, 0, 0], [5, 0, 0, 0, 0]]),
            "targets": np.array([[5, 6, 0], [5, 6, 7]])}
  src, tgt = flops.batch_lengths(padded, pad_id=0)
  assert src.tolist() == [3, 1] and tgt.tolist() == [2, 3]
  # Packed: one row holding both pairs, plus an empty row.
  packed = {"inputs": np.array([[5, 6, 7, 5, 0], [0, 0, 0, 0, 0]]),
            "inputs_segmentation": np.array([[1, 1, 1, 2, 0], [0, 0, 0, 0, 0]]),
            "targets": np.array([[5, 6, 5, 6, 7], [0, 0, 0, 0, 0]]),
            "targets_segmentation": np.array([[1, 1, 2, 2, 2], [0, 0, 0, 0, 0]])}
  assert [x.tolist() for x in flops.batch_lengths(packed)] == [[3, 1], [2, 3]]
  separate = sum(flops.forward_flops(cfg, [s], [t]) for s, t in [(3, 2), (1, 3)])
  assert flops.train_flops(cfg, *flops.batch_lengths(packed)) == pytest.approx(3 * separate)
  assert flops.train_flops(cfg, *flops.batch_lengths(padded)) == pytest.approx(3 * separate)
  # Counting the packed row as one long sentence would count cross-segment pairs: more.
  assert flops.forward_flops(cfg, [4], [5]) > separate


# The model's options, each flipped alone from the test model's value: a new bool or choice
# field joins by itself, so a FLOP term it needs in flops.py (a gated FFN's third matmul,
# say) is not forgotten. Fields that change no count are here too: they must stay in bounds.
_NOT_VARIANTS = ("deterministic", "decode",  # modes, not options
                 "dtype", "param_dtype")     # the same count in another precision
_VARIANTS = [(f.name, not f.default) for f in dataclasses.fields(tj.TransformerConfig)
             if f.type in ("bool", bool) and f.name not in _NOT_VARIANTS] + [
    (name, value) for name, values in CHOICES.items() if name not in _NOT_VARIANTS
    for value in values if value != getattr(tj.TransformerConfig, name)]


@pytest.mark.parametrize("name,value", [(None, None)] + _VARIANTS,
                         ids=["default"] + [f"{n}={v}" for n, v in _VARIANTS])
def test_against_xla_cost_analysis_of_the_forward_pass(name, value):
  """XLA's count of the compiled forward pass on an unpadded batch.

  XLA counts every matmul exactly (2 per multiply-add), the whole causal square (we count half),
  and the elementwise work we leave out (LayerNorm, softmax, biases, residuals, ReLU, the
  embedding scale) at about 1 FLOP per element. So XLA >= our `causal="full"` count, and the
  excess is that elementwise work: measured 2.7% for this d_model = 64 model (0.6% for the
  d_model = 256 reference model, 16% for d_model = 32 with a 50-word vocabulary, where O(d)
  work per token is no longer small against O(d^2)). The bound 1.06 leaves room for XLA
  versions that count a few more elementwise ops.
  """
  cfg = tj.model_config("tiny", vocab_size=500, d_model=64, num_heads=4, d_ff=256,
                        num_encoder_layers=2, num_decoder_layers=2, max_len=32)
  if name is not None:
    cfg = cfg.replace(**{name: value})
  model = tj.Transformer(cfg.replace(deterministic=True))
  batch, s, t = 4, 16, 12
  src = jnp.full((batch, s), 5, jnp.int32)
  tgt = jnp.full((batch, t), 6, jnp.int32)
  params = jax.jit(model.init)(jax.random.key(0), src, tgt)["params"]
  forward = jax.jit(lambda p, x, y: model.apply({"params": p}, x, y))
  analysis = forward.lower(params, src, tgt).compile().cost_analysis()
  analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
  xla = float(analysis["flops"])
  full = flops.forward_flops(cfg, [s] * batch, [t] * batch, causal="full")
  half = flops.forward_flops(cfg, [s] * batch, [t] * batch)
  assert half < full
  assert 1.0 <= xla / full <= 1.06, (xla, full)


@pytest.mark.parametrize("kind,dtype,expected,key", [
    ("NVIDIA H100 80GB HBM3", "bfloat16", 989e12, "H100"),
    ("NVIDIA H100 PCIe", "bfloat16", 756e12, "H100 PCIe"),
    # Names that contain shorter ones: matched by their own rows, not by "H100" or "L4".
    ("NVIDIA H100 NVL", "bfloat16", 835e12, "H100 NVL"),
    ("NVIDIA L40S", "bfloat16", 362e12, "L40S"),
    ("NVIDIA L40", "float32", 90.5e12, "L40"),
    ("NVIDIA L4", "bfloat16", 121e12, "L4"),
    ("NVIDIA H200", "bfloat16", 989e12, "H200"),
    ("NVIDIA A100-SXM4-40GB", "bfloat16", 312e12, "A100"),
    ("NVIDIA A100-SXM4-80GB", "float32", 156e12, "A100"),
    ("TPU v4", "bfloat16", 275e12, "TPU v4"),
    ("TPU v5 lite", "bfloat16", 197e12, "TPU v5 lite"),
    ("TPU v5", "bfloat16", 459e12, "TPU v5"),
    ("TPU v5p", "bfloat16", 459e12, "TPU v5p"),
    ("TPU v6 lite", "bfloat16", 918e12, "TPU v6 lite"),
])
def test_peak_table_lookup_by_device_kind(kind, dtype, expected, key):
  assert flops.peak_flops_for_kind(kind, dtype) == (expected, key)
  device = types.SimpleNamespace(device_kind=kind, platform="gpu" if "NVIDIA" in kind else "tpu")
  peak, source = flops.peak_flops(dtype, device)
  assert peak == expected and source == f"table[{key}][{dtype}]"


def test_peak_for_unknown_devices_and_cpu():
  assert flops.peak_flops_for_kind("Some Future Chip", "bfloat16") is None
  # An unknown accelerator gives NaN (MFU shows NaN) rather than stopping a training run.
  unknown = types.SimpleNamespace(device_kind="X9", platform="gpu")
  peak, source = flops.peak_flops("bfloat16", unknown)
  assert np.isnan(peak) and "PEAK_FLOPS" in source
  # V100 has no bfloat16 units.
  assert np.isnan(flops.peak_flops_for_kind("Tesla V100-SXM2-16GB", "bfloat16")[0])
  # CPU: a matmul measured now, never a table entry.
  peak, source = flops.peak_flops("float32", jax.devices("cpu")[0], n=256, repeats=3)
  assert peak > 1e8 and source == "measured float32 256x256 matmul"


def test_peak_table_rates_agree_with_each_other():
  """A typo in the data-sheet table shows as rates that disagree: float16 runs at bfloat16's rate
  on every GPU with both, float32 (XLA's default TF32) at about half of it from Ampere on (V100
  has no TF32: 125 against 15.7), and TPUs run float32 matmuls as one bfloat16 pass."""
  keys = [key for key, _ in flops.PEAK_FLOPS]
  assert len(keys) == len(set(keys)) == 14
  for key, rates in flops.PEAK_FLOPS:
    if key.startswith("TPU"):
      assert set(rates) == {"bfloat16", "float32"} and rates["float32"] == rates["bfloat16"], key
    elif key == "V100":
      assert set(rates) == {"float16", "float32"}
      assert rates["float16"] / rates["float32"] == pytest.approx(7.96, abs=0.01)
    else:
      assert set(rates) == {"bfloat16", "float16", "float32"}, key
      assert rates["float16"] == rates["bfloat16"], key
      assert rates["float32"] / rates["bfloat16"] == pytest.approx(0.5, rel=0.02), key


class CountingClock:
  """`time.perf_counter` for `flops.measure_matmul_peak`: each reading `tick` seconds after the
  last, so every timed call lasts `tick` and the loop's own readings are counted."""

  def __init__(self, tick: float):
    self.tick, self.readings = tick, 0

  def perf_counter(self) -> float:
    self.readings += 1
    return self.readings * self.tick


def test_the_measured_peak_is_the_matmuls_flops_over_its_median_time(monkeypatch):
  # 8 fake CPU devices (conftest): one 64 x 64 matmul on each at once, each call `tick` long.
  clock = CountingClock(0.3)
  monkeypatch.setattr(flops, "time", clock)
  assert len(jax.local_devices()) == 8
  peak = flops.measure_matmul_peak(64, repeats=3)
  assert peak == pytest.approx(8 * 2 * 64**3 / 0.3, rel=1e-12)
  assert clock.readings == 1 + 2 * 3 + 1        # the start, 3 timed calls, the last check
  # By default 9 calls, with no minimum time: readings 1 + 2 * 9 + 1, however short each call.
  clock = CountingClock(0.01)
  monkeypatch.setattr(flops, "time", clock)
  flops.measure_matmul_peak(64)
  assert clock.readings == 1 + 2 * 9 + 1
  # min_seconds keeps timing past `repeats` until that much time has passed since the start:
  # the start at 1 s, 2 calls (readings 2-5), the check at 6 s (5 s: on), a third call (7-8),
  # the check at 9 s: exactly 8 s have passed, which ends it.
  clock = CountingClock(1.0)
  monkeypatch.setattr(flops, "time", clock)
  flops.measure_matmul_peak(64, repeats=2, min_seconds=8.0)
  assert clock.readings == 9
  # With one call asked for: the checks at 4 and 7 s go on (3 and 6 s), the one at 10 s ends.
  clock = CountingClock(1.0)
  monkeypatch.setattr(flops, "time", clock)
  flops.measure_matmul_peak(64, repeats=1, min_seconds=8.0)
  assert clock.readings == 10
  # Two devices, then one: a matmul on each.
  for count in (2, 1):
    devices = jax.local_devices()[:count]
    monkeypatch.setattr(flops.jax, "local_devices", lambda devices=devices: devices)
    clock = CountingClock(0.3)
    monkeypatch.setattr(flops, "time", clock)
    assert flops.measure_matmul_peak(64, repeats=3) == pytest.approx(count * 2 * 64**3 / 0.3,
                                                                     rel=1e-12)


def test_the_cpu_peak_is_measured_on_the_first_device_by_default(monkeypatch):
  calls = []
  monkeypatch.setattr(flops, "measure_matmul_peak",
                      lambda n, dtype, **kw: calls.append((n, dtype, kw)) or 1e11)
  one = jax.devices()[:1]   # a host with one device: `device` left out reads it
  monkeypatch.setattr(flops.jax, "devices", lambda *args: one)
  assert flops.peak_flops() == (1e11, "measured float32 2048x2048 matmul")
  assert flops.peak_flops("bfloat16", n=512, repeats=4) == (1e11,
                                                           "measured bfloat16 512x512 matmul")
  assert calls == [(2048, jnp.float32, {}), (512, jnp.bfloat16, {"repeats": 4})]


def test_the_peak_of_all_devices():
  # A CPU's measured peak is the host's, which its fake devices share; a table's is per chip.
  assert flops.peak_total(5.0, "cpu", 8) == 5.0
  assert flops.peak_total(5.0, "gpu", 8) == 40.0
  assert flops.peak_total(5.0, "tpu", 3) == 15.0


def test_the_mfu_note_is_for_an_mfu_above_100_percent_on_a_measured_peak():
  measured, table = "measured float32 256x256 matmul", "table[H100][bfloat16]"
  note = flops.mfu_note(1.5, measured, "--flag, default 2048")
  assert note == ("note: MFU above 100%: the peak (measured float32 256x256 matmul) is below "
                  "the CPU's: too small a matmul, or measured while other processes loaded the "
                  "machine (once, at the start); measure it on a larger one (--flag, default "
                  "2048) with the machine otherwise idle")
  assert flops.mfu_note(1.0, measured, "x") is None      # exactly the peak: possible
  assert flops.mfu_note(0.5, measured, "x") is None
  assert flops.mfu_note(1.5, table, "x") is None         # a table's peak: a FLOP count's bug
