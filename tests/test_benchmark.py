"""The train step compiles once (alone and in the training loop); the benchmarks
(`transformer_jax.bench`) run and report what they say: their figures are the arithmetic of
their times and counts (checked on hand-picked numbers and stand-in steps, datasets and traces)
and their tables print those figures; `scripts/benchmark.py` maps its flags onto them;
`--what train` needs neither tensorflow-datasets nor grain."""
import contextlib
import dataclasses
import gzip
import json
import os
from pathlib import Path
import re
import subprocess
import sys
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import transformer_jax as tj
from transformer_jax import search, steps
from transformer_jax.bench import common as bench_common
from transformer_jax.bench import curve
from transformer_jax.bench import data as bench_data
from transformer_jax.bench import decode as bench_decode
from transformer_jax.bench import kernels as bench_kernels
from transformer_jax.bench import profile as bench_profile
from transformer_jax.bench import train as bench_train
from transformer_jax.run import loop
from transformer_jax.run import trainer as trainer_lib

from scripts_under_test import load_script
import tiny_config
import xla_env

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(REPO, "tests", "tiny_config.py")
benchmark = load_script("benchmark")


# An XLA compilation, or the same program loaded from the persistent cache (tests/conftest.py).
COMPILE_EVENTS = ("/jax/core/compile/backend_compile_duration",
                  "/jax/compilation_cache/cache_retrieval_time_sec")


class CompileCounter:
  """Counts XLA compilations (of anything) while active, through jax.monitoring."""

  def __init__(self):
    self.count = 0

  def _listener(self, event, duration, **kwargs):
    if event in COMPILE_EVENTS:
      self.count += 1

  def __enter__(self):
    jax.monitoring.register_event_duration_secs_listener(self._listener)
    return self

  def __exit__(self, *exc):
    jax.monitoring.unregister_event_duration_listener(self._listener)


def test_train_step_compiles_once_for_batches_of_one_shape():
  cfg = tj.model_config("tiny", vocab_size=40, num_encoder_layers=1, num_decoder_layers=1)
  model = tj.Transformer(cfg)
  tx = optax.adam(1e-3)
  state = steps.unbox(steps.init_train_state(model, tx, jax.random.key(0), (1, 8)))
  step = jax.jit(steps.make_train_step(model, tx, lambda s: 1e-3, 0.1), donate_argnums=0)
  rng = np.random.default_rng(0)

  def batch(pad_from):
    inputs = rng.integers(4, 40, (4, 10)).astype(np.int32)
    targets = rng.integers(4, 40, (4, 7)).astype(np.int32)
    targets[:, pad_from:] = 0  # different padding, same shape
    return {"inputs": jnp.asarray(inputs), "targets": jnp.asarray(targets)}

  state, _ = step(state, batch(7))   # warm-up: the one compilation
  with CompileCounter() as counter:
    for pad_from in (3, 5, 7, 2):
      state, metrics = step(state, batch(pad_from))
    jax.block_until_ready(metrics)
  assert counter.count == 0
  assert step._cache_size() == 1
  assert int(state.step) == 5


def test_training_loop_compiles_the_train_step_once(tmp_path, monkeypatch):
  trainers = []

  class RecordingTrainer(trainer_lib.Trainer):
    def __init__(self, *args, **kwargs):
      super().__init__(*args, **kwargs)
      trainers.append(self)

  monkeypatch.setattr(loop, "Trainer", RecordingTrainer)
  c = tiny_config.get_config()
  c.data.data_dir = str(tmp_path / "tfds")
  c.num_train_steps = 4
  result = loop.train_and_evaluate(c, str(tmp_path / "run"))
  assert result["step"] == 4
  (trainer,) = trainers
  assert trainer.train_step._cache_size() == 1
  assert trainer.eval_step._cache_size() == 1


def last_json_line(text: str) -> dict:
  return json.loads(text.strip().splitlines()[-1])


def tiny_config_with(**model_fields):
  c = tiny_config.get_config()
  c.model.update(**model_fields)
  return c


def test_benchmark_data_smoke(tmp_path, capsys, monkeypatch):
  # The numbers dataset of tiny_config's size: the default's 50,000 pairs took 8 s to build and
  # to train the tokenizer on, and nothing here depends on them.
  default_data_config = bench_data.default_data_config

  def smaller():
    c = default_data_config()
    c.numbers_train_size = tiny_config.get_config().data.numbers_train_size
    return c

  monkeypatch.setattr(bench_data, "default_data_config", smaller)
  code = benchmark.main(["--what", "data", "--datasets", "numbers", "--batching", "pack,pad",
                         "--batch_size", "16", "--max_len", "32", "--seconds", "0.3",
                         "--data_dir", str(tmp_path / "tfds"), "--workdir", str(tmp_path)])
  out = capsys.readouterr().out
  assert code == 0
  printed = last_json_line(out)
  assert printed["what"] == "data" and printed["config"]["batch_size"] == 16
  assert printed["config"]["datasets"] == "numbers" and printed["config"]["batching"] == "pack,pad"
  for key in ("device_kind", "jax_version", "load_average_start", "load_average_end"):
    assert printed[key] not in (None, ""), key
  assert [(p["dataset"], p["batching"]) for p in printed["figures"]] == [
      ("numbers", "pack"), ("numbers", "pad")]
  for p in printed["figures"]:
    assert p["target_tokens_per_s"] > 0 and 0 < p["target_fill"] <= 1
    assert p["batch_shapes"] == [[16, 32]]
  assert out.count("input pipeline: numbers") == 2
  assert benchmark.main(["--what", "data", "--seconds", "0"]) == 2
  assert "--seconds=0.0: must be > 0" in capsys.readouterr().err


def _rows(real: int) -> np.ndarray:
  return np.array([1] * real + [0] * (8 - real)).reshape(2, 4)


class FakeClock:
  """`time` for the module under test: `perf_counter` moves only when `sleep` moves it, so the
  figures measured from it are exact, whatever the machine's load (a real clock made these
  tests' upper bounds a matter of chance)."""

  def __init__(self):
    self.now = 1000.0

  def perf_counter(self):
    return self.now

  def sleep(self, seconds):
    self.now += seconds


class FakeData:
  """What the data benchmark reads of `get_data`'s result: sizes, vocabulary, batches of 2 rows
  x 4 tokens with 5 real source and 3 real target tokens each, and whether it was closed. With a
  `clock`, each batch takes 1/64 s of it."""

  def __init__(self, clock=None):
    self.sources = {"train": [0] * 7, "validation": [0] * 2, "test": [0] * 3}
    self.tokenizer = types.SimpleNamespace(vocab_size=1234)
    self.closed = False
    self.read = 0
    self.clock = clock

  def train_dataset(self):
    return self

  def __iter__(self):
    return self

  def __next__(self):
    self.read += 1
    if self.clock:
      self.clock.sleep(1 / 64)
    return {"inputs_segmentation": _rows(5), "targets_segmentation": _rows(3),
            "inputs": np.zeros((2, 4), np.int32), "targets": np.zeros((2, 4), np.int32),
            "text": ["not an array"]}

  def close(self):
    self.closed = True


def test_the_data_benchmark_counts_real_tokens_after_one_untimed_batch(monkeypatch, capsys):
  clock = FakeClock()
  monkeypatch.setattr(bench_data, "time", clock)
  data = FakeData(clock)
  # Batches of 1/64 s read for 5/64 s: the 5 after the untimed first (exact in binary).
  n = bench_data._measure(data, 5 / 64)
  assert n["batches"] == data.read - 1 == 5 and data.closed   # the first batch is not timed
  b = n["batches"]
  assert (n["source"], n["target"], n["capacity"]) == (5 * b, 3 * b, 8 * b)
  assert n["shapes"] == [[2, 4]] and n["elapsed"] == 5 / 64
  # The figures of a point: per second of the timed reads, the fill of the target rows; the
  # setup (building the dataset, training the tokenizer) timed apart, in the dataset's workdir.
  asked = []
  monkeypatch.setattr(bench_data, "get_data", lambda c, workdir: asked.append(workdir) or data)
  clock = iter([10.0, 11.23456])
  monkeypatch.setattr(bench_data, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
  counts = {"batches": 7, "source": 5001, "target": 3001, "capacity": 8000, "elapsed": 3.2,
            "shapes": [[2, 4]]}
  monkeypatch.setattr(bench_data, "_measure", lambda data, seconds: counts)
  p = bench_data._point("numbers", "pack", bench_data.DataOptions(seconds=0.1, workdir="/w"))
  assert asked == ["/w/numbers"] and p == {
      "dataset": "numbers", "batching": "pack", "sizes": {"train": 7, "validation": 2, "test": 3},
      "vocab_size": 1234, "setup_s": 1.23, "batches_per_s": 2.2, "source_tokens_per_s": 1563,
      "target_tokens_per_s": 938, "target_fill": 0.375, "batch_shapes": [[2, 4]]}
  # No batch read in the time: no capacity, no fill.
  counts.update(batches=0, source=0, target=0, capacity=0, shapes=[])
  clock = iter([0.0, 1.0])
  p = bench_data._point("numbers", "pad", bench_data.DataOptions(seconds=0.1, workdir="/w"))
  assert (p["target_fill"], p["batches_per_s"], p["batch_shapes"]) == (0.0, 0.0, [])


def test_the_train_benchmarks_real_batches_are_the_datasets_first_with_its_reader_closed(
    monkeypatch):
  data = FakeData()
  monkeypatch.setattr(bench_train, "get_data", lambda c, workdir: data)
  batches, tok = bench_train.real_batches(tiny_config_with(), "/w", 3)
  assert len(batches) == 3 == data.read and data.closed and tok.vocab_size == 1234
  assert sorted(batches[0]) == ["inputs", "inputs_segmentation", "targets",
                                "targets_segmentation"]


def test_benchmark_train_smoke(capsys):
  code = benchmark.main(["--what", "train", "--config", TINY, "--steps", "2", "--warmup", "1",
                         "--matmul_n", "128", "--matmul_seconds", "0",
                         "--config.model.fused_qkv=True"])
  out, err = capsys.readouterr()
  assert code == 0 and "WARNING" not in err, err
  printed = last_json_line(out)
  assert "train step: 32d, 1+1 layers, vocab 200, float32, batches synthetic" in out
  assert f"config                    {TINY}\n" in out
  assert "warm-up (untimed)         1 step, the first compiles" in out
  assert printed["config_path"] == TINY and printed["warmup_steps"] == 1
  assert printed["what"] == "train" and printed["batches"] == "synthetic"
  assert printed["shapes"] == {"inputs": [8, 32], "targets": [8, 32]}
  assert printed["model"]["fused_qkv"] is True and printed["model"]["d_model"] == 32
  assert printed["config"]["data"]["batch_size"] == 8
  for key in ("device_kind", "platform", "jax_version", "dtype", "load_average_start"):
    assert printed[key] not in (None, ""), key
  f = printed["figures"]
  assert f["steps_timed"] == 2 and f["compilations"] == 1
  assert f["target_tokens_per_step"] == 8 * 32 and f["source_tokens_per_step"] == 8 * 32
  assert f["target_tokens_per_s"] == pytest.approx(256 / f["step_time_s"], rel=1e-2)
  assert f["tflops_per_s"] > 0 and 0 < f["mfu"] < 10 and np.isfinite(f["final_loss"])
  assert f["peak_source"].startswith("measured") and f["peak_memory_bytes"] > 0
  assert f["back_to_back_step_time_s"] > 0 and 0 < f["back_to_back_mfu"] < 10
  # The table prints the JSON line's figures.
  for name, value in bench_train.table_rows(f):
    assert re.search(rf"\n{re.escape(name)} +{re.escape(value)}\n", out), (name, value)


def test_train_benchmark_figures_and_table_are_the_arithmetic_of_the_times():
  # Digits chosen so that another rounding, another operator or another constant shows.
  t = {"times": [0.3456789, 0.123456789, 0.2345678], "back_to_back": 0.16789,
       "dispatch": [0.00123456, 0.0123456, 0.02], "first_step_s": 1.23456, "loss": 2.345678}
  f = bench_train.step_figures(t, 256.0, 128.0, 2.5e9, 1e10)
  assert f == {
      "first_step_s": 1.235, "step_time_s": 0.2346, "step_time_min_s": 0.1235,
      "step_time_max_s": 0.3457, "steps_timed": 3, "target_tokens_per_step": 256.0,
      "source_tokens_per_step": 128.0, "target_tokens_per_s": 1091.4,
      "source_target_tokens_per_s": 1637.1, "model_flops_per_step": 2.5e9,
      "tflops_per_s": 0.0107, "peak_flops_per_s": 1e10, "mfu": 1.0658,
      "back_to_back_step_time_s": 0.1679, "back_to_back_target_tokens_per_s": 1524.8,
      "back_to_back_mfu": 1.4891, "dispatch_time_s": 0.01235, "final_loss": 2.3457}
  f.update(peak_source="measured float32 64x64 matmul", state_arrays=17,
           peak_memory_bytes=int(1234.6 * 2**20), peak_memory_source="process peak RSS (CPU)",
           compilations=1)
  assert bench_train.table_rows(f) == [
      ("first step (compiles)", "1.24 s"),
      ("step time (median)", "234.6 ms  (min 123.5, max 345.7, 3 steps)"),
      ("target tokens/s", "1,091  (256 real per step)"),
      ("source+target tokens/s", "1,637"),
      ("model TFLOP/s", "0.0107  (2.5 GFLOP per step)"),
      ("peak FLOP/s", "0.0100 TFLOP/s  (measured float32 64x64 matmul)"),
      ("MFU", "106.6 %"),
      ("back to back (no wait)", "167.9 ms/step, 1,525 target tokens/s, MFU 148.9 %"),
      ("host dispatch (median)", "12.35 ms of the one-by-one step  (the state: 17 arrays)"),
      ("peak memory", "1,235 MiB  (process peak RSS (CPU))"),
      ("compilations of the step", "1")]


def test_benchmark_table_load_average_memory_and_random_tokens(monkeypatch, capsys, tmp_path):
  bench_common.print_table("title", [("a", "1"), ("longer key", "2")])
  rule = "-" * (len("longer key") + 24)
  assert capsys.readouterr().out == f"\ntitle\n{rule}\na           1\nlonger key  2\n{rule}\n"
  monkeypatch.setattr(bench_common.os, "getloadavg", lambda: (1.23456, 0.5, 2.0))
  assert bench_common.load_average() == [1.23, 0.5, 2.0]
  # On CPU the allocator keeps no statistics: the process's peak RSS, VmHWM (kB) from
  # /proc/self/status; of this run after a reset, the process's so far without one.
  status, clear_refs = tmp_path / "status", tmp_path / "clear_refs"
  status.write_text("Name:\tpython\nVmHWM:\t    1000 kB\nVmRSS:\t     900 kB\n")
  monkeypatch.setattr(bench_common, "STATUS", str(status))
  monkeypatch.setattr(bench_common, "CLEAR_REFS", str(clear_refs))
  assert bench_common.reset_peak_memory() and clear_refs.read_text() == "5"
  assert bench_common.peak_memory(True) == (1024000, "peak RSS of this run (CPU)")
  assert bench_common.peak_memory() == (1024000, "process peak RSS so far (CPU)")
  # No reset where clear_refs cannot be written; ru_maxrss (KiB on Linux) without VmHWM.
  monkeypatch.setattr(bench_common, "CLEAR_REFS", str(tmp_path / "none" / "clear_refs"))
  assert not bench_common.reset_peak_memory()
  status.write_text("Name:\tpython\n")
  monkeypatch.setattr(bench_common.resource, "getrusage",
                      lambda who: types.SimpleNamespace(ru_maxrss=2000))
  assert bench_common.peak_memory(True) == (2048000, "process peak RSS so far (CPU)")
  # Random real tokens: ids 4 (the first after the special ids) to vocab_size - 1.
  c = tiny_config_with()
  (b,) = bench_common.synthetic_batches(c, 6, 1)
  assert sorted(b) == ["inputs", "targets"] and b["inputs"].shape == (8, 32)
  assert {int(b[k].min()) for k in b} == {4} and {int(b[k].max()) for k in b} == {5}


class Pending:
  """A fake step's state: ready `device_s` of the clock after the call returned (what
  `jax.block_until_ready` waits for, calling this method)."""

  def __init__(self, clock, device_s):
    self.clock, self.left = clock, device_s

  def block_until_ready(self):
    self.clock.sleep(self.left)
    self.left = 0.0
    return self


class FakeSetup:
  """What `bench_train._timed` uses of a `TrainSetup`, with a step that records which batch it
  was given and takes `clock`'s time: call n (from 1) takes n ms to return (the host's
  dispatch) and its state is ready 10 ms later (the device), so each figure names the calls
  and the waits it timed."""

  model = types.SimpleNamespace(config=types.SimpleNamespace(dtype="float32"))

  def __init__(self, clock):
    self.calls = []
    self.clock = clock

  def context(self):
    return contextlib.nullcontext()

  def train_step(self, state, batch):
    self.calls.append(batch.name)
    self.clock.sleep(len(self.calls) / 1000)
    return Pending(self.clock, 0.010), {"loss": np.float32(6.0), "tokens": np.float32(4.0)}


class NamedBatch(dict):
  """A batch of `shapes` (zeros) that FakeSetup's step records by its name."""

  def __init__(self, name, **shapes):
    super().__init__({k: np.zeros(shape, np.int32) for k, shape in shapes.items()})
    self.name = name


def named_batches(*names, shape=(8, 32)) -> list:
  return [NamedBatch(name, inputs=shape, targets=shape) for name in names]


def test_train_benchmark_cycles_the_batches_and_times_each_step(monkeypatch):
  clock = FakeClock()
  monkeypatch.setattr(bench_train, "time", clock)
  setup = FakeSetup(clock)
  options = bench_train.TrainOptions(steps=4, warmup=3, matmul_n=64, matmul_seconds=0)
  t = bench_train._timed(setup, 0, named_batches("b0", "b1", "b2"), options)
  # Warm-up (the first call compiles), the timed steps one by one, then back to back.
  assert setup.calls == ["b0", "b1", "b2"] + ["b0", "b1", "b2", "b0"] * 2
  assert t["used"] == [0, 1, 2, 0] and t["loss"] == 1.5
  # The first call and its wait; calls 4-7 one by one, each returned (its dispatch) and then
  # waited for; calls 8-11 back to back with one wait at the end, the mean.
  assert t["first_step_s"] == pytest.approx(0.011)
  assert t["dispatch"] == pytest.approx([0.004, 0.005, 0.006, 0.007])
  assert t["times"] == pytest.approx([0.014, 0.015, 0.016, 0.017])
  assert t["back_to_back"] == pytest.approx((0.008 + 0.009 + 0.010 + 0.011 + 0.010) / 4)
  assert t["peak"][0] > 0 and t["peak"][1].startswith("measured")


def test_the_train_benchmark_warms_up_on_every_batch_shape_before_timing(monkeypatch):
  # Bucketed real batches come in several shapes, each compiling its own program: the first
  # batch of each shape gets one untimed step, so that no timed step compiles.
  clock = FakeClock()
  monkeypatch.setattr(bench_train, "time", clock)
  setup = FakeSetup(clock)
  batches = [*named_batches("a0"), *named_batches("b0", shape=(16, 16)), *named_batches("a1"),
             NamedBatch("c0", inputs=(8, 32), targets=(8, 24))]
  assert bench_train.first_of_each_shape(batches) == [0, 1, 3]
  options = bench_train.TrainOptions(steps=4, warmup=2, matmul_n=64, matmul_seconds=0)
  t = bench_train._timed(setup, 0, batches, options)
  assert setup.calls[:4] == ["a0", "b0", "c0", "b0"]   # the shapes', then warm-up step 2
  assert setup.calls[4:8] == ["a0", "b0", "a1", "c0"] and t["used"] == [0, 1, 2, 3]


def test_benchmark_profile_summary(tmp_path):
  # On the dataset's own (packed) batches: their real tokens are what is counted.
  c = tiny_config_with()
  c.data.data_dir = str(tmp_path / "tfds")
  options = bench_train.TrainOptions(steps=1, warmup=1, matmul_n=64, matmul_seconds=0,
                                     profile_dir=str(tmp_path / "profile"), batches="real",
                                     num_batches=2, workdir=str(tmp_path / "work"))
  result = bench_train.run(c, options)
  # What the script prints as its JSON line: the result must survive it unchanged.
  assert json.loads(json.dumps(result)) == result
  assert result["figures"]["steps_timed"] == 1 and result["figures"]["compilations"] == 1
  assert "spm.model" in os.listdir(tmp_path / "work")   # the tokenizer, where it was asked
  (batch,), tok = bench_train.real_batches(c, str(tmp_path / "work"), 1)
  assert result["batches"] == "real" and result["model"]["vocab_size"] == tok.vocab_size
  assert result["shapes"] == {k: [8, 32] for k in batch}
  src, tgt = (int(n.sum()) for n in bench_train.flops.batch_lengths(batch, tok.pad_id))
  assert tgt < 8 * 32 and result["figures"]["target_tokens_per_step"] == tgt
  assert result["figures"]["source_tokens_per_step"] == src != tgt
  profile = result["figures"]["profile"]
  assert profile["kernel_ms_per_step"] > 0 and profile["top"], profile
  assert sum(profile["categories"].values()) == pytest.approx(1.0, abs=1e-3)


def _write_trace(path, events, age_s=0.0):
  path.parent.mkdir(parents=True, exist_ok=True)
  with gzip.open(path, "wt") as f:
    json.dump({"traceEvents": events}, f)
  if age_s:
    os.utime(path, (time.time() - age_s, time.time() - age_s))


def meta(pid, name):
  return {"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}}


def span(pid, name, dur):
  return {"ph": "X", "pid": pid, "name": name, "dur": dur}


def test_a_profile_summary_sums_each_kernel_over_the_steps_by_category(tmp_path, capsys):
  gemm = "nvjet_gemm_" + "x" * 250   # a long kernel name: cut at 200 (JSON) and 110 (printed)
  # An accelerator's trace: only its device streams count, not the host's spans.
  _write_trace(tmp_path / "a" / "old.trace.json.gz", [meta(1, "/device:GPU:0"),
                                                      span(1, "nvjet_old", 10)], age_s=60)
  _write_trace(tmp_path / "a" / "x" / "new.trace.json.gz", [
      meta(1, "/device:GPU:0"), meta(2, "/host:CPU"), meta(3, "python"), span(1, gemm, 1233.3),
      span(1, "loop_fusion", 602.2), span(1, "cudnn_fmha", 200), span(1, gemm, 400),
      span(1, "threefry2x32", 100), span(1, "weird_op", 500), span(2, "host_work", 9000),
      span(3, "python_work", 7000),
      {"ph": "M", "name": "thread_name", "pid": 1, "args": {"name": "stream 7"}}])
  s = bench_profile.trace_summary(str(tmp_path / "a"), steps=4, top=2)
  assert s == {"trace": str(tmp_path / "a" / "x" / "new.trace.json.gz"),
               "where": "device streams: /device:GPU:0", "kernel_ms_per_step": 0.759,
               "categories": {"matmul": 0.5381, "reduction / elementwise fusion": 0.1984,
                              "other": 0.1647, "attention (cuDNN)": 0.0659,
                              "random bits (dropout)": 0.0329},
               "top": [[gemm[:200], 0.4083], ["loop_fusion", 0.1506]]}
  out = capsys.readouterr().out
  assert "profile (device streams: /device:GPU:0), 4 steps: 0.8 ms of kernel time/step\n" in out
  assert "  matmul                            53.8 %\n" in out
  assert f"   53.8 %     0.408 ms  {gemm[:110]}\n" in out and "weird_op" not in out
  assert "   19.8 %     0.151 ms  loop_fusion\n" in out
  # On CPU the ops run on the host's threads, beside the runtime's own spans.
  _write_trace(tmp_path / "c" / "t.trace.json.gz", [
      meta(1, "/host:CPU"), span(1, "dot.3", 300), span(1, "fusion.1", 100),
      span(1, "ThunkExecutor::Execute", 5000), span(1, "Pjit$step", 5000),
      span(1, "SlinkyThreadPool", 5000), {"ph": "X", "pid": 1, "name": "copy.2"}])
  s = bench_profile.trace_summary(str(tmp_path / "c"), steps=1)
  assert s["where"] == "host threads (CPU backend)" and s["kernel_ms_per_step"] == 0.4
  assert s["categories"] == {"matmul": 0.75, "reduction / elementwise fusion": 0.25,
                             "copy / transpose": 0.0}
  # Spans of no duration, and the 25 longest of many kernels.
  _write_trace(tmp_path / "z" / "t.trace.json.gz", [meta(1, "/host:CPU"), span(1, "copy.1", 0)])
  assert bench_profile.trace_summary(str(tmp_path / "z"), steps=1)["categories"] == {
      "copy / transpose": 0.0}
  _write_trace(tmp_path / "m" / "t.trace.json.gz",
               [meta(1, "/host:CPU")] + [span(1, f"op{i}", 100 + i) for i in range(30)])
  many = bench_profile.trace_summary(str(tmp_path / "m"), steps=1)
  assert [n for n, _ in many["top"]] == [f"op{i}" for i in range(29, 4, -1)]
  assert many["kernel_ms_per_step"] == 3.435   # 100 + 101 + ... + 129 us
  assert bench_profile.trace_summary(str(tmp_path / "none"), steps=1) == {
      "error": f"no *.trace.json.gz under {tmp_path / 'none'}"}


def test_an_mfu_above_100_percent_on_a_small_measured_matmul_is_explained(monkeypatch, capsys):
  # A peak as low as a 256 matmul's can be: the step's MFU comes out far above 100%.
  monkeypatch.setattr(bench_train.flops, "peak_flops",
                      lambda dtype, n, **kw: (1e6, f"measured {dtype} {n}x{n} matmul"))

  class Recompiling(bench_train.TrainSetup):
    """A step that reports three compilations, one more than its batches' two shapes need."""

    def __init__(self, *args):
      super().__init__(*args)
      step = self.train_step
      self.train_step = lambda *a: step(*a)
      self.train_step._cache_size = lambda: 3

  monkeypatch.setattr(bench_train, "TrainSetup", Recompiling)
  # Batches of two shapes (as bucketed real batches are): each is named in the table.
  real = bench_train._model_and_batches

  def two_shapes(config, options):
    model_cfg, batches = real(config, options)
    return model_cfg, batches + [{k: v[:, :16] for k, v in batches[0].items()}]

  monkeypatch.setattr(bench_train, "_model_and_batches", two_shapes)
  options = bench_train.TrainOptions(steps=1, warmup=2, matmul_n=256, matmul_seconds=0)
  result = bench_train.run(tiny_config_with(), options)
  assert result["figures"]["mfu"] > 1 and result["figures"]["compilations"] == 3
  out, err = capsys.readouterr()
  assert err == "WARNING: the train step compiled 3 times for 2 batch shapes\n"
  assert ("\nwarm-up (untimed)         2 steps, the first compiles; 1 more on the other batch "
          "shape\n") in out
  shapes = [{"inputs": [8, n], "targets": [8, n]} for n in (32, 16)]
  assert result["shapes"] == shapes[0] and result["distinct_shapes"] == shapes
  assert f"\nbatch shapes              {shapes[0]}; {shapes[1]}\n" in out
  notes = [line for line in out.splitlines() if line.startswith("note:")]
  assert len(notes) == 1 and "(measured float32 256x256 matmul) is below the CPU's" in notes[0]
  assert "default 2048" in notes[0]
  assert bench_train.mfu_note(0.98, "measured float32 256x256 matmul") is None
  assert bench_train.mfu_note(1.2, "table[H100][bfloat16]") is None   # not the matmul's doing


def test_help_into_a_closed_pipe_ends_without_a_traceback():
  """`benchmark.py --help | head`: the reader is gone before the help is written."""
  proc = subprocess.Popen([sys.executable, os.path.join(REPO, "scripts", "benchmark.py"),
                           "--help"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  proc.stdout.close()
  err = proc.stderr.read().decode()
  assert proc.wait(timeout=300) == 1 and "Traceback" not in err, err


def test_check_accelerator_runs_and_passes_on_cpu(tmp_path, monkeypatch):
  check_accelerator = load_script("check_accelerator")
  out = tmp_path / "check.json"
  from transformer_jax import losses
  weighed, loss_sums = [], losses.loss_sums

  def recorded(logits, targets, weights, *args):
    weighed.append((np.asarray(targets), np.asarray(weights)))  # the batch's, not traced
    return loss_sums(logits, targets, weights, *args)

  monkeypatch.setattr(losses, "loss_sums", recorded)
  code = check_accelerator.main(["--size", "tiny", "--length", "16", "--batch", "2",
                                 "--model_rows", "2", "--vocab", "64", "--json", str(out)])
  result = json.loads(out.read_text())
  assert code == 0 and result["passed"], result
  assert len(result["results"]) == 14
  # On CPU there is no cuDNN: the fused path is XLA's and must still match the reference.
  assert all(r["output_err" if "output_err" in r else "logits_err"] < 0.05
             for r in result["results"])
  attention, model = result["results"][:11], result["results"][11:]
  assert [r["shape"][2] for r in attention] == [16] * 4 + [20] * 3 + [16] * 3 + [20]
  assert all(r["shape"][:2] == [2, 16] and not r["cudnn_kernel"] for r in result["results"])
  assert [r["check"] for r in model] == ["model tiny: bfloat16, XLA attention",
                                         "model tiny: bfloat16, cuDNN attention",
                                         "model tiny (padded): bf16, cuDNN, lengths"]
  # The model's loss counts the real target tokens, every one of them (padding is id 0).
  assert len(weighed) == 5 and all(np.array_equal(w, t != 0) for t, w in weighed)
  assert all(0 < w.sum() < w.size for _, w in weighed)
  for r in model:  # bfloat16 against float32: close, never equal
    assert r["loss_rel_diff"] == abs(r["loss"] - r["reference_loss"]) / abs(r["reference_loss"])
    assert 0 < r["loss_rel_diff"] < 0.01 and 0 < r["logits_err"] and 0 < r["grad_err"], r


def test_benchmark_decode_smoke(capsys):
  # The config's rows (8) and output length (32) when none are given.
  options = bench_decode.DecodeOptions(beams=(1, 2), steps=1)
  start = time.perf_counter()
  result = bench_decode.run(tiny_config_with(), options)
  wall = time.perf_counter() - start
  assert json.loads(json.dumps(result)) == result
  out = capsys.readouterr().out
  assert "decode: 8 sources x 32 tokens, up to 32 output tokens" in out
  assert result["shapes"] == {"inputs": [8, 32], "max_output_len": 32}
  assert re.search(r"\nsources +random token ids \(4\.\.199, no padding\)", out), out
  assert result["what"] == "decode"
  assert result["parameters"] == "random parameters; EOS disabled, 32 tokens per sentence"
  assert result["sources"].startswith("random token ids")
  for name in ("greedy", "beam 2"):
    f = result["figures"][name]
    # EOS is disabled with random parameters: every sentence runs to its 32-token limit.
    assert f["target_tokens_per_batch"] == 8 * 32, name
    assert f["sentences_per_s"] > 0 and f["target_tokens_per_s"] > 0 and f["calls_timed"] == 1
    assert 0 < f["batch_time_s"] + f["first_call_s"] < wall
    for row, value in bench_decode.table_rows(name, f):
      assert re.search(rf"\n{re.escape(row)} +{re.escape(value)}\n", out), (row, value)
  # Three models searched together, for longer than the model's max_len of 32 positions.
  options = bench_decode.DecodeOptions(beams=(2,), steps=1, rows=2, decode_len=40,
                                       ensemble_size=3)
  result = bench_decode.run(tiny_config_with(), options)
  assert result["ensemble_size"] == 3 and result["parameters"] == (
      "random parameters; EOS disabled, 40 tokens per sentence; an ensemble of 3 models "
      "(seeds 0 to 2)")
  assert result["figures"]["beam 2"]["target_tokens_per_batch"] == 2 * 40
  # In the tests' 8 fake devices a batch is searched whole; asked for, in halves (said).
  assert result["search_parts"] == 1
  options = bench_decode.DecodeOptions(beams=(1,), steps=1, rows=4, parts=2)
  result = bench_decode.run(tiny_config_with(), options)
  assert result["search_parts"] == 2
  assert re.search(r"\nsearched as +2 slice\(s\) of 2 rows at a time\n", capsys.readouterr().out)
  with pytest.raises(bench_common.BenchError, match="--search_parts 3 does not divide the 4 rows"):
    bench_decode.run(tiny_config_with(), dataclasses.replace(options, parts=3))


def test_decode_benchmark_figures_and_table_are_the_arithmetic_of_the_calls():
  f = bench_decode.search_figures(7, 1.23456, [0.3456789, 0.123456789, 0.2345678], [71, 68, 69])
  assert f == {"first_call_s": 1.235, "batch_time_s": 0.2346, "calls_timed": 3,
               "sentences_per_s": 29.84, "target_tokens_per_s": 295.6,
               "target_tokens_per_batch": pytest.approx(69.3333333)}
  assert bench_decode.table_rows("beam 4", f) == [
      ("beam 4: batch time (median)", "234.6 ms (first call 1.24 s, 3 calls)"),
      ("beam 4: sentences/s", "29.8"), ("beam 4: target tokens/s", "296 (69 per batch)")]


def test_benchmark_kernels_smoke(capsys):
  # Each pair's before and after on the config's sizes (a vocabulary of 300, in blocks of 128:
  # 8 blocks for a beam of 2, so search.top_k takes its two passes), one figure per variant and
  # round; the three-variant pairs have a reference.
  config = tiny_config_with()
  config.data.vocab_size = 300
  options = bench_kernels.KernelOptions(rows=2, beam=2, decode_len=64, iterations=2, calls=1,
                                        repeats=2)
  result = bench_kernels.run(config, options)
  assert json.loads(json.dumps(result)) == result
  assert result["shapes"]["slots"] == [64, 128]    # stages of 32 and 64 positions, x 2 beams
  assert "search kernels" in capsys.readouterr().out
  names = ["greedy token", "beam candidates", "beam self-attention scores, 64 slots",
           "beam self-attention scores, 128 slots"]
  assert list(result["figures"]) == names
  for name, figure in result["figures"].items():
    assert figure["same_outputs"] is True, name
    variants = figure["us_per_iteration"]
    assert len(variants) == (2 if "scores" in name else 3), name
    assert all(len(us) == 2 and min(us) > 0 for us in variants.values()), name


def test_kernel_figures_are_the_median_call_per_iteration_and_a_difference_shows(monkeypatch,
                                                                                 capsys):
  clock = iter([0.0, 1.0, 1.0, 4.0, 4.0, 6.0])   # timed calls of 1, 3 and 2 s
  fake_time = types.SimpleNamespace(perf_counter=lambda: next(clock))
  monkeypatch.setattr(bench_kernels, "time", fake_time)
  assert bench_kernels._per_iteration(lambda x: x * 2, (jnp.ones(3),), 4, 3) == 0.5
  # Before and after that disagree are reported as such; each variant's figure per round.
  monkeypatch.setattr(bench_kernels, "_pairs", lambda **shapes: {"pair": ((jnp.ones(3),), {
      "before: x": lambda x: x, "after: x + 1": lambda x: x + 1})})
  monkeypatch.setattr(bench_kernels, "_per_iteration", lambda step, args, n, calls: 1.23456e-6)
  result = bench_kernels.run(tiny_config_with(), bench_kernels.KernelOptions(repeats=2))
  assert result["figures"] == {"pair": {"same_outputs": False, "us_per_iteration": {
      "before: x": [1.2, 1.2], "after: x + 1": [1.2, 1.2]}}}
  out = capsys.readouterr().out
  assert "pair (before and after give the same outputs: False)\n" in out
  assert f"\n  {'before: x':<40} 1, 1\n" in out and f"\n  {'after: x + 1':<40} 1, 1\n" in out


def test_the_kernels_loop_runs_each_step_once_an_iteration_on_shifted_inputs():
  count = jax.jit(bench_kernels._loop(lambda x: jnp.ones(()), 5))
  assert float(count(jnp.zeros(3))) == 5.0
  # The first input moves by 1e-3 an iteration: 0 + 0.001 + ... + 0.004.
  shifted = jax.jit(bench_kernels._loop(lambda x: x, 5))
  assert float(shifted(jnp.zeros(1))) == pytest.approx(0.01, rel=1e-5)
  # Beam search's scores of every extension: the live score plus the next token's log-prob.
  logits = np.random.default_rng(0).standard_normal((2 * 3, 5)).astype(np.float32)
  live = np.arange(6, dtype=np.float32).reshape(2, 3)
  log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  np.testing.assert_allclose(bench_kernels._log_scores(logits, live, 2, 3, 5),
                             (live[:, :, None] + log_probs.reshape(2, 3, 5)).reshape(2, 15),
                             atol=1e-5)
  # The config's rows and output length when the options leave them at 0.
  assert bench_kernels.shapes(tiny_config_with(), bench_kernels.KernelOptions()) == dict(
      rows=8, beam=4, vocab=200, d_model=32, heads=4,
      slots=[4 * end for end in search.stage_ends(32)])


@pytest.mark.parametrize("argv, message", [
    (["--what", "kernels", "--sweep", "data.batch_size=8,16"], "not kernels"),
    (["--sweep", "data.batch_size=8,16"], "not data"),   # --what data is the default
    (["--what", "train", "--config", TINY, "--sweep", "data.batch_size=8,16",
      "--sweep_config"], "pass --sweep or --sweep_config, not both"),
    (["--what", "data", "--config.model.d_model=8"], "--config.model.d_model apply to --what"),
    (["--what", "data", "--config", TINY], "--config apply to --what train, decode and kernels"),
    (["--what", "train", "--warmup", "0"], "--warmup=0"),
    # A flag of another mode would be ignored: refused, naming the modes it applies to.
    (["--what", "decode", "--profile_dir", "x"], "--profile_dir applies to --what train, not "
     "decode"),
    (["--what", "kernels", "--warmup", "2"], "--warmup applies to --what train, not kernels"),
    (["--what", "decode", "--batches", "real"], "--batches applies to --what train, not decode"),
    (["--what", "kernels", "--num_batches", "2"], "--num_batches applies to --what train"),
    (["--what", "decode", "--matmul_n", "64"], "--matmul_n applies to --what train, not decode"),
    (["--what", "train", "--decode_rows", "2"], "--decode_rows applies to --what decode and "
     "kernels, not train"),
    (["--what", "data", "--steps", "3"], "--steps applies to --what train, decode and kernels, "
     "not data"),
    (["--what", "train", "--batch_size", "4"], "--batch_size applies to --what data, not train: "
     "--what train reads --config.data.batch_size"),
    (["--what", "kernels", "--workdir", "x"], "--workdir applies to --what data, train and "
     "decode, not kernels"),
    (["--what", "train", "--workdir", "x"], "add --batches real, or drop --workdir"),
    (["--what", "train", "--curve_dir", "x"], "add --sweep or --sweep_config, or drop it"),
    # Numbers no run can take.
    (["--what", "train", "--matmul_n", "0"], "--matmul_n=0: 0 is not integer >= 16"),
    (["--what", "decode", "--decode_rows", "-2"], "--decode_rows=-2"),
    (["--what", "decode", "--decode_len", "-1"], "--decode_len=-1"),
    (["--what", "decode", "--beams", "1,0"], "--beams=1,0: must be beam sizes >= 1"),
    (["--what", "train", "--ensemble_size", "2"], "--ensemble_size applies to --what decode"),
    (["--what", "train", "--search_parts", "2"], "--search_parts applies to --what decode"),
    (["--what", "decode", "--ensemble_size", "2", "--workdir", "runs/x"],
     "drop --workdir, or decode trained runs together"),
    (["--what", "train", "--bogus"], "bogus"),
])
def test_benchmark_rejects_bad_flags(argv, message, capsys):
  assert benchmark.main(argv) == 2
  assert message in capsys.readouterr().err


def test_the_documented_benchmark_command_lines_pass_the_flag_checks(monkeypatch):
  # docs/benchmarks.md's, README.md's and scripts/benchmark_gpu.sh's (without measuring).
  measured = []
  monkeypatch.setattr(benchmark, "_measure", lambda v: measured.append(v.what) or 0)
  config = os.path.join(REPO, "configs", "cpu_reference.py")
  gpu = os.path.join(REPO, "configs", "wmt14_ende.py") + ":base"
  for argv in (
      ["--what", "train", "--config", config, "--steps", "30"],
      ["--what", "train", "--config", config, "--sweep", "data.batch_size=8,16,32,64", "--sweep",
       "model.fused_qkv=False,True", "--curve_dir", "runs/curve"],
      ["--what", "train", "--config", gpu, "--steps", "3", "--warmup", "5",
       "--config.model.fused_qkv=True", "--profile_dir", "x"],
      ["--what", "decode", "--config", config, "--beams", "1,4", "--steps", "7",
       "--decode_rows", "16", "--decode_len", "63", "--config.data.max_source_len=32"],
      ["--what", "decode", "--config", config, "--beams", "1,4", "--steps", "10",
       "--ensemble_size", "2"],
      ["--what", "kernels", "--config", config],
      ["--what", "data", "--datasets", "numbers", "--batching", "pack", "--seconds", "20"]):
    assert benchmark.main(argv) == 0, argv
  assert measured == ["train"] * 3 + ["decode"] * 2 + ["kernels", "data"]


def test_benchmark_options_check_their_ranges():
  with pytest.raises(ValueError, match="must be >= 1"):
    bench_train.TrainOptions(warmup=0)
  with pytest.raises(ValueError, match="steps=0: both must be >= 1"):
    bench_train.TrainOptions(steps=0)
  with pytest.raises(ValueError, match="num_batches=0: must be >= 1"):
    bench_train.TrainOptions(num_batches=0)
  bench_train.TrainOptions(steps=1, warmup=1, num_batches=1)
  with pytest.raises(ValueError, match="batches"):
    bench_train.TrainOptions(batches="fake")
  with pytest.raises(ValueError, match="beam sizes"):
    bench_decode.DecodeOptions(beams=(0,))
  with pytest.raises(ValueError, match="steps=0: must be >= 1"):
    bench_decode.DecodeOptions(steps=0)
  with pytest.raises(ValueError, match="ensemble_size=0: must be >= 1"):
    bench_decode.DecodeOptions(ensemble_size=0)
  with pytest.raises(ValueError, match="parts=-1: must be >= 0"):
    bench_decode.DecodeOptions(parts=-1)
  with pytest.raises(ValueError, match="evaluate.py --ensemble"):
    bench_decode.DecodeOptions(ensemble_size=2, workdir="runs/x")
  with pytest.raises(ValueError, match="iterations=0: must be >= 1"):
    bench_kernels.KernelOptions(iterations=0)
  with pytest.raises(ValueError, match="seconds=0: must be > 0"):
    bench_data.DataOptions(seconds=0)
  with pytest.raises(ValueError, match="datasets and batchings must each name at least one"):
    bench_data.DataOptions(datasets=())


BLOCKER = r"""
import importlib.abc, importlib.util, sys

class Block(importlib.abc.MetaPathFinder):
  def find_spec(self, name, path=None, target=None):
    if name.split(".")[0] in ("tensorflow_datasets", "grain"):
      raise ImportError(f"{name} is blocked in this test")
    return None

sys.meta_path.insert(0, Block())
sys.path[:0] = [REPO, REPO + "/scripts", REPO + "/tests"]
"""


def test_train_benchmark_needs_neither_tfds_nor_grain(tmp_path):
  # `base_config()` imports `transformer_jax.data.config`, and so the data package, which must
  # leave tensorflow-datasets and grain to the modules that read data.
  code = f"REPO = {REPO!r}\n" + BLOCKER + r"""
import benchmark
from transformer_jax import flops, model, search, steps
code = benchmark.main(["--what", "train", "--config", {tiny!r}, "--steps", "1",
                       "--warmup", "1", "--matmul_n", "64", "--matmul_seconds", "0"])
assert code == 0, code
assert not any(m.split(".")[0] in ("tensorflow_datasets", "grain") for m in sys.modules)
print("OK")
""".replace("{tiny!r}", repr(TINY))
  # One CPU device (not the session's eight) and the tests' quick compile (tests/xla_env.py):
  # 6 s of the subprocess's CPU time instead of 11.
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=xla_env.flags(1))
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  lines = out.stdout.strip().splitlines()
  assert lines[-1] == "OK"
  assert json.loads(lines[-2])["figures"]["compilations"] == 1


def _fuse_params(params):
  """Unfused attention parameters -> the fused layout: query/key/value stacked on axis 1."""
  def walk(tree, cross):
    out = {}
    for name, sub in tree.items():
      if not isinstance(sub, dict):
        out[name] = sub
      elif {"query", "key", "value"} <= set(sub):
        parts = (("key", "value") if cross or name == "cross_attention"
                 else ("query", "key", "value"))
        fused = {p: jnp.stack([sub[n][p] for n in parts], axis=1 if p == "kernel" else 0)
                 for p in ("kernel", "bias") if p in sub[parts[0]]}
        rest = {n: v for n, v in sub.items() if n not in parts}
        out[name] = {**rest, ("kv" if len(parts) == 2 else "qkv"): fused}
      else:
        out[name] = walk(sub, cross)
    return out
  return walk(params, False)


def test_fused_qkv_computes_the_same_function():
  from transformer_jax.search import greedy_search

  cfg = tj.model_config("tiny", vocab_size=40, norm_position="pre")
  fused_cfg = cfg.replace(fused_qkv=True)
  src = jax.random.randint(jax.random.key(1), (2, 9), 4, 40).at[1, 6:].set(0)
  tgt = jax.random.randint(jax.random.key(2), (2, 7), 4, 40).at[1, 5:].set(0)
  model = tj.Transformer(cfg.replace(deterministic=True))
  fused_model = tj.Transformer(fused_cfg.replace(deterministic=True))
  params = steps.unbox(model.init(jax.random.key(0), src, tgt)["params"])
  fused_params = _fuse_params(params)
  # The fused model's own parameters have this structure and these shapes.
  own = steps.unbox(fused_model.init(jax.random.key(0), src, tgt)["params"])
  assert jax.tree.map(jnp.shape, own) == jax.tree.map(jnp.shape, fused_params)
  np.testing.assert_allclose(fused_model.apply({"params": fused_params}, src, tgt),
                             model.apply({"params": params}, src, tgt), atol=1e-5)
  # Decoding (self-attention cache, cross-attention keys/values) agrees too.
  a = greedy_search(cfg, params, src, max_len_margin=5)
  b = greedy_search(fused_cfg, fused_params, src, max_len_margin=5)
  np.testing.assert_array_equal(a[0], b[0])
  # The init gives each stacked kernel the variance of a separate one (Glorot over d x d).
  kernel = own["encoder"]["layer_0"]["self_attention"]["qkv"]["kernel"]
  separate = params["encoder"]["layer_0"]["self_attention"]["query"]["kernel"]
  assert float(jnp.std(kernel)) == pytest.approx(float(jnp.std(separate)), rel=0.15)


def test_a_throughput_curve_runs_every_point_and_writes_table_plot_and_points(tmp_path, capsys):
  # Repeated --sweep flags give the product of their values, parsed as literals where they parse.
  assert curve.points_from_flags(["data.batch_size=8,16", "model.fused_qkv=False,True",
                                  "model.norm_position=pre"]) == [
      {"data.batch_size": b, "model.fused_qkv": f, "model.norm_position": "pre"}
      for b in (8, 16) for f in (False, True)]
  out = tmp_path / "curve"
  # Two points (each compiles its own step): the x axis and a second field of one value.
  code = benchmark.main(["--what", "train", "--config", TINY, "--steps", "1", "--warmup", "1",
                         "--matmul_n", "256", "--matmul_seconds", "0.05",
                         "--sweep", "data.batch_size=8,16", "--sweep", "model.fused_qkv=True",
                         "--curve_dir", str(out)])
  assert code == 0
  result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  rows = result["rows"]
  assert [(r["data.batch_size"], r["model.fused_qkv"]) for r in rows] == [(8, True), (16, True)]
  assert all(r["target tokens/s"] > 0 and 0 < r["MFU"] and r["peak FLOP/s"] > 0 for r in rows)
  assert sorted(os.listdir(out / "points")) == [
      f"data.batch_size={b},model.fused_qkv=True.json" for b in (16, 8)]
  with open(out / "curve.csv") as f:
    assert len(f.read().splitlines()) == 3
  # curve.md in the docs' units (curve.csv keeps the raw numbers): not `0.5395` or `1.076e+09`.
  header, _, first = (out / "curve.md").read_text().splitlines()[:3]
  assert header.split(" | ")[2:] == ["target tokens/s", "MFU", "peak TFLOP/s", "step",
                                     "back to back target tokens/s", "peak memory |"]
  cells = first.strip("| ").split(" | ")
  r = rows[0]
  assert cells[:6] == ["8", "True", f"{r['target tokens/s']:,.0f}", f"{100 * r['MFU']:.1f}%",
                       f"{r['peak FLOP/s'] / 1e12:.3f}", f"{r['step time (s)'] * 1e3:,.0f} ms"]
  assert cells[7] == f"{r['peak memory (bytes)'] / 1e9:.2f} GB"
  assert curve._md_cells(["greedy: sentences/s", "beam 4: target tokens/s"])[
      "greedy: sentences/s"][1](1234.56) == "1,234.6"
  assert (out / "curve.png").stat().st_size > 10_000
  assert benchmark.main(["--what", "train", "--config", TINY, "--sweep", "batch_size"]) == 1
  capsys.readouterr()
  # Mistakes in a curve's points are one error line each, before any point runs.
  bad = tmp_path / "bad_curve"
  for sweep, message in (
      ("data.batch_sise=8,16", "config has no field 'data.batch_sise'; did you mean"),
      ("data.batch_size=8,x", "data.batch_size='x': "),
      ("model.num_heads=4,5", "curve point 2 (model.num_heads=5): "),
      ("data.batch_size=8,16,", "expected FIELD=V1,V2")):
    assert benchmark.main(["--what", "train", "--config", TINY, "--sweep", sweep,
                           "--curve_dir", str(bad)]) == 1, sweep
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err, err
  assert not bad.exists()


def test_the_benchmarks_take_a_training_batchs_rows_also_from_batch_tokens():
  # Training steps data.batch_tokens // the longest row rows when batch_tokens > 0
  # (data.config.global_rows): 384 // 32 = 12 here, not data.batch_size's 8, which
  # grad_accum_steps=3 could not even split.
  c = tiny_config_with()
  c.data.batch_tokens, c.grad_accum_steps = 384, 3
  (b,) = bench_common.synthetic_batches(c, 200, 1)
  assert b["inputs"].shape == b["targets"].shape == (12, 32)
  assert bench_decode.sizes(c, bench_decode.DecodeOptions()) == (12, 32)
  assert bench_decode.sizes(c, bench_decode.DecodeOptions(rows=3, decode_len=5)) == (3, 5)
  assert bench_kernels.shapes(c, bench_kernels.KernelOptions())["rows"] == 12
  batch = load_script("trace_step").abstract_batch(c)
  assert len(batch) == 6 and {v.shape for v in batch.values()} == {(12, 32)}


@pytest.mark.parametrize("argv, message", [
    (["--what", "decode", "--decode_rows", "2", "--sweep", "data.batch_size=4,8"],
     "sweeps data.batch_size, which would change nothing measured: --decode_rows 2 sets every "
     "point's rows"),
    (["--what", "decode", "--decode_len", "4", "--sweep", "data.max_target_len=16,32"],
     "--decode_len 4 sets every point's output length"),
    (["--what", "decode", "--workdir", "runs/x", "--sweep", "model.d_model=32,64"],
     "--workdir's trained run gives every point its model and vocabulary"),
    (["--what", "decode", "--sweep", "learning_rate=0.1,0.2"], "--what decode reads only model.*"),
    (["--what", "train", "--sweep", "data.batching=pack,pad"],
     "synthetic batches are unpacked rows of random tokens"),
    (["--what", "train", "--sweep", "data.batch_size=8,16", "--config.data.batch_size=4"],
     "--config.data.batch_size sets a field the curve varies"),
    # Points that would run twice, or write one file, as training sweeps refuse them.
    (["--what", "train", "--sweep", "data.batch_size=8,8,4,4"],
     "the curve has the point data.batch_size=4 twice"),   # the first of them by name
    (["--what", "train", "--sweep", "model.dropout_rate=0.1,0.1000001"],
     "differ only beyond the 6 significant digits of their names and would share the file "
     "points/model.dropout_rate=0.1.json"),
    # A learned position table shorter than the output: a point's, or a run's.
    (["--what", "decode", "--decode_len", "40", "--config.model.position_encoding=learned",
      "--sweep", "data.batch_size=2,4"], "--decode_len 40 is longer than the learned position "
     "table's model.max_len=32 rows (model.position_encoding='learned'): pass --decode_len 32"),
    (["--what", "decode", "--decode_len", "40", "--config.model.position_encoding=learned"],
     "--decode_len 40 is longer than the learned position table's model.max_len=32 rows"),
])
def test_a_benchmark_that_would_not_measure_what_it_names_is_refused_first(argv, message,
                                                                         tmp_path, capsys):
  curve_dir = ["--curve_dir", str(tmp_path / "c")] * ("--sweep" in argv)
  assert benchmark.main(["--config", TINY, "--steps", "1", *argv, *curve_dir]) == 1
  out, err = capsys.readouterr()
  assert err.startswith("error: ") and message in err and "Traceback" not in err, err
  assert out == "" and not (tmp_path / "c").exists()


def test_each_curve_point_reports_its_own_peak_memory_on_cpu(tmp_path, monkeypatch):
  # The process's peak RSS is reset before each point: a small point after a big one reports
  # its own peak, not the big one's (points of one shape: one compilation).
  if not bench_common.reset_peak_memory():
    pytest.skip("no resettable peak RSS here (/proc/self/clear_refs)")
  timed, calls = bench_decode._time_search, []

  def big_first(*args):
    calls.append(args)
    if len(calls) == 1:
      block = np.ones(50_000_000)  # 400 MB, every page written, freed before the next point
      del block
    return timed(*args)

  monkeypatch.setattr(bench_decode, "_time_search", big_first)
  options = bench_decode.DecodeOptions(beams=(1,), steps=1, rows=2, decode_len=2)
  points = [{"seed": 0}, {"seed": 1}]
  curve.run_curve(tiny_config_with(), points, "decode", options, str(tmp_path), log=print)
  figures = [json.loads((tmp_path / "points" / f"seed={i}.json").read_text())["figures"]
             for i in (0, 1)]
  assert all(f["peak_memory_of_run"] for f in figures)
  assert all(f["peak_memory_source"] == "peak RSS of this run (CPU)" for f in figures)
  assert figures[0]["peak_memory_bytes"] - figures[1]["peak_memory_bytes"] > 300e6, figures


def test_a_curves_columns_log_and_plot(tmp_path, monkeypatch):
  """Without benchmarking (the runs are stand-ins): each search's columns of a decode curve,
  the Markdown units, the log line of each point, a second curve into the same directory, and
  the plot: one panel per figure, one line per setting of the other fields in a legend, the
  first field on the x axis (labels where it is not numeric)."""
  figures = {"greedy": {"sentences_per_s": 10.0, "target_tokens_per_s": 300.0},
             "beam 4": {"sentences_per_s": 4.0, "target_tokens_per_s": 120.0}, "device": "cpu"}
  assert curve._figures("decode", {"figures": figures}) == {
      "greedy: sentences/s": 10.0, "greedy: target tokens/s": 300.0,
      "beam 4: sentences/s": 4.0, "beam 4: target tokens/s": 120.0}
  cells = curve.MD_CELLS
  assert (cells["MFU"][1](0.5), cells["step time (s)"][1](1.0)) == ("50.0%", "1,000 ms")
  train_figures = {key: 1.0 + i for i, (key, _) in enumerate(curve.FIGURES["train"])}
  monkeypatch.setattr(curve.train, "run", lambda c, o: {"figures": train_figures})
  points = [{"data.batch_size": b, "model.fused_qkv": f} for b in (8, 16) for f in (False, True)]
  logs = []
  for _ in range(2):   # the second into the directory of the first
    out = curve.run_curve(tiny_config.get_config(), points, "train", bench_train.TrainOptions(),
                          str(tmp_path / "c"), log=logs.append)
  assert logs[:4] == [f"curve point {i}/4: data.batch_size={b},model.fused_qkv={f}"
                      for i, (b, f) in enumerate([(8, False), (8, True), (16, False),
                                                  (16, True)], 1)]
  # A peak memory that is not each point's own (an accelerator's: no reset) says so.
  assert out["rows"][0]["process peak memory so far (bytes)"] == train_figures[
      "peak_memory_bytes"] and "peak memory (bytes)" not in out["rows"][0]
  assert "| process peak memory so far |" in (tmp_path / "c" / "curve.md").read_text()
  for column in ("peak memory (bytes)", curve.PEAK_SO_FAR):   # both in GB, as the docs say
    assert curve.MD_CELLS[column][1](2_457_000_000) == "2.46 GB"
  with open(out["files"][-1], "rb") as f:
    head = f.read(24)
  assert (int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")) == (990, 360)
  fig = curve._figure(out["rows"], out["fields"], "train")
  assert [ax.get_ylabel() for ax in fig.axes] == ["target tokens/s", "MFU"]
  assert list(fig.get_size_inches()) == [11.0, 4.0]
  for ax in fig.axes:
    assert ax.get_xlabel() == "data.batch_size"
    assert [list(line.get_xdata()) for line in ax.get_lines()] == [[8, 16], [8, 16]]
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == [
        "model.fused_qkv=False", "model.fused_qkv=True"]
    assert {t.get_fontsize() for t in legend.get_texts()} == {8}
  # A flag on the x axis is two labels; one field alone needs no legend.
  rows = [{"model.fused_qkv": f, "target tokens/s": 1.0, "MFU": 0.5} for f in (False, True)]
  ax = curve._figure(rows, ["model.fused_qkv"], "train").axes[0]
  assert list(ax.get_lines()[0].get_xdata()) == ["False", "True"] and ax.get_legend() is None
  # A decode curve: one panel per search's sentences/s, from a single point too.
  row = {"data.batch_size": 8, **curve._figures("decode", {"figures": figures})}
  fig = curve._figure([row], ["data.batch_size"], "decode")
  assert [ax.get_ylabel() for ax in fig.axes] == ["greedy: sentences/s", "beam 4: sentences/s"]
  # ... and of one search, one panel (matplotlib's squeeze would hand back a bare Axes).
  greedy = curve._figures("decode", {"figures": {"greedy": figures["greedy"]}})
  fig = curve._figure([{"data.batch_size": 8, **greedy}], ["data.batch_size"], "decode")
  assert [ax.get_ylabel() for ax in fig.axes] == ["greedy: sentences/s"]


def _fake_python(tmp_path):
  """A stand-in for python that records each run (cwd, PYTHONPATH, the cache dir, arguments)
  and prints a benchmark-like JSON line, so benchmark_gpu.sh's plumbing runs in seconds. A
  compile-mode run (`--steps 1 --warmup 1` last) takes 0.5 s and logs its start and end, so a
  test can count how many ran at once; a check (accelerator or precision) takes 1.5 s and logs
  its end."""
  log = tmp_path / "calls.txt"
  fake = tmp_path / "fakepy"
  fake.write_text(
      "#!/usr/bin/env bash\n"
      f'echo "$PWD|${{PYTHONPATH:-}}|${{JAX_COMPILATION_CACHE_DIR:-}}|'
      f'${{XLA_PYTHON_CLIENT_PREALLOCATE:-}}|$*|${{XLA_FLAGS:-}}" >> {log}\n'
      'if [[ "$*" == *"--steps 1 --warmup 1" ]]; then\n'
      f'  echo "start $(date +%s.%N)" >> {log}.times; sleep 0.5;'
      f' echo "end $(date +%s.%N)" >> {log}.times\n'
      'elif [[ "$*" == *check_accelerator.py* || "$*" == *compare_precision.py* ]]; then\n'
      f'  sleep 1.5; echo "end $(date +%s.%N)" >> {log}.checks\n'
      'fi\n'
      'echo \'{"what": "train"}\'\n')
  fake.chmod(0o755)
  return fake, log


def _most_at_once(times_file) -> int:
  events = sorted((float(t), kind == "start") for kind, t in
                  (line.split() for line in times_file.read_text().splitlines()))
  running = most = 0
  for _, start in events:
    running += 1 if start else -1
    most = max(most, running)
  return most


def _timed_names(out) -> list[str]:
  """The runs benchmark_gpu.sh timed, in order (its summary's `=== NAME:` lines)."""
  return [ln[4:].split(":")[0] for ln in (out / "summary.txt").read_text().splitlines()
          if ln.startswith("=== ")]


def _run_groups(tmp_path, groups: str):
  """benchmark_gpu.sh with the stand-in python, PRECOMPILE=2, STEPS=3, no cache dir or
  XLA_FLAGS of the caller's: (the recorded calls split in fields, the output dir, the env)."""
  repo = Path(__file__).resolve().parents[1]
  fake, log = _fake_python(tmp_path)
  out = tmp_path / "out"
  env = {k: v for k, v in os.environ.items() if k not in ("JAX_COMPILATION_CACHE_DIR",
                                                          "XLA_FLAGS")}
  env.update(PYTHON=str(fake), PRECOMPILE="2", STEPS="3")
  r = subprocess.run(["bash", str(repo / "scripts/benchmark_gpu.sh"), str(out), "100", groups],
                     env=env, capture_output=True, text=True, timeout=60)
  assert r.returncode == 0, r.stderr
  return [c.split("|") for c in log.read_text().splitlines()], out, env


def test_benchmark_gpu_precompiles_each_program_once_then_times_in_order(tmp_path):
  repo = Path(__file__).resolve().parents[1]
  fake, log = _fake_python(tmp_path)
  baseline, other = tmp_path / "baseline", tmp_path / "other.tree"
  baseline.mkdir()
  other.mkdir()
  out = tmp_path / "out"
  env = {k: v for k, v in os.environ.items()
         if k not in ("JAX_COMPILATION_CACHE_DIR", "XLA_PYTHON_CLIENT_PREALLOCATE")}
  batches = tmp_path / "b.npz"
  batches.write_bytes(b"")
  env.update(PYTHON=str(fake), PRECOMPILE="2", BASELINE_TREE=f"{baseline},{other}", STEPS="3",
             PRECISION_BATCHES=str(batches))
  r = subprocess.run(["bash", str(repo / "scripts/benchmark_gpu.sh"), str(out), "100",
                      "now,compare,precision"], env=env, capture_output=True, text=True,
                     timeout=60)
  assert r.returncode == 0, r.stderr
  calls = [c.split("|") for c in log.read_text().splitlines()]
  compiles = [c for c in calls if c[4].endswith("--steps 1 --warmup 1")]
  timed = [c for c in calls if not c[4].endswith("--steps 1 --warmup 1")]
  # Six distinct train programs (base and big, in this tree and the two baselines), compiled
  # once each, without preallocating GPU memory, into the shared cache; the checks run beside.
  assert len(compiles) == 6
  assert {(c[0], "configs/wmt14_ende.py:big" in c[4]) for c in compiles} == {
      (str(tree), big) for tree in (repo, baseline, other) for big in (False, True)}
  assert all(c[2] == str(out / "jax_cache") and c[3] == "false" for c in compiles)
  # Timed: the checks once, then this tree, each baseline, this tree again; each run imports
  # the package of the tree it runs in.
  names = _timed_names(out)
  # (the two checks run at once, beside the compilations, in either order)
  assert sorted(names[:2]) == ["check", "precision"]
  assert names[2:] == ["base_now", "big_now", "base_baseline", "big_baseline",
                       "base_other.tree", "big_other.tree", "base_again", "big_again"]
  assert [c[0] for c in timed] == ([str(repo)] * 4 + [str(baseline)] * 2 + [str(other)] * 2
                                   + [str(repo)] * 2)
  assert all(c[1].split(":")[0] == c[0] for c in timed)
  (precision,) = [c[4] for c in timed[:2] if "compare_precision.py" in c[4]]
  assert f"--batches_file {batches}" in precision and "attention_impl=cudnn" in precision
  assert all("--steps 3 --warmup 5" in c[4] for c in timed[2:])
  # Timed runs preallocate as usual and load from the same cache.
  assert all(c[2] == str(out / "jax_cache") and c[3] == "" for c in timed[2:])
  assert len((out / "results.jsonl").read_text().splitlines()) == 10
  # PRECOMPILE=2: two compilations at a time, never more, beside the checks: the two checks
  # (1.5 s each, started first) take no compilation's place.
  assert _most_at_once(tmp_path / "calls.txt.times") == 2
  starts = sorted(float(line.split()[1]) for line in
                  (tmp_path / "calls.txt.times").read_text().splitlines() if line[:5] == "start")
  check_ends = [float(line.split()[1])
                for line in (tmp_path / "calls.txt.checks").read_text().splitlines()]
  assert len(check_ends) == 2 and starts[1] < min(check_ends), (starts, check_ends)


def test_benchmark_gpu_graphs_group_sets_the_command_buffer_flags(tmp_path):
  repo = Path(__file__).resolve().parents[1]
  calls, out, env = _run_groups(tmp_path, "graphs")
  log = tmp_path / "calls.txt"
  # Three programs (the flags change the compiled program): compiled once each, with the
  # flags of their timed run.
  compiles = sorted(c[5] for c in calls if c[4].endswith("--steps 1 --warmup 1"))
  every = ("--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,"
           "CONDITIONAL,WHILE --xla_gpu_graph_min_graph_size=1")
  assert compiles == sorted(["", every, "--xla_gpu_enable_command_buffer="])
  names = _timed_names(out)
  assert names == ["base_cb_default", "base_cb_all", "base_cb_none", "base_cb_default_again"]
  assert f'XLA_FLAGS="{every}" ' in (out / "summary.txt").read_text()
  timed = [c for c in calls if not c[4].endswith("--steps 1 --warmup 1")]
  assert [c[5] for c in timed] == ["", every, "--xla_gpu_enable_command_buffer=", ""]
  assert all("configs/wmt14_ende.py:base" in c[4] and "fused_qkv=True" in c[4] for c in timed)
  # The caller's XLA_FLAGS go to every run, the group's after them; an XFLAGS of the caller's
  # goes nowhere.
  env.update(XLA_FLAGS="--mine", XFLAGS="--stray")
  log.unlink()
  r = subprocess.run(["bash", str(repo / "scripts/benchmark_gpu.sh"), str(tmp_path / "out2"),
                      "100", "graphs"], env=env, capture_output=True, text=True, timeout=60)
  assert r.returncode == 0, r.stderr
  timed = [c[5] for c in (line.split("|") for line in log.read_text().splitlines())
           if not c[4].endswith("--steps 1 --warmup 1")]
  assert timed == ["--mine", f"--mine {every}", "--mine --xla_gpu_enable_command_buffer=",
                        "--mine"]


@pytest.mark.parametrize("group,old,new,flag", [
    ("lengths", "dense", "lengths", "padding_as_lengths=False"),
    ("flat", "tree", "flat", "flatten_optimizer=True")])
def test_benchmark_gpu_ab_groups_interleave_the_two_variants(tmp_path, group, old, new, flag):
  calls, out, _ = _run_groups(tmp_path, group)
  compiles = [c[4] for c in calls if c[4].endswith("--steps 1 --warmup 1")]
  assert len(compiles) == 4   # base and big, each in the two variants
  names = _timed_names(out)
  assert names == [f"base_{old}", f"base_{new}", f"big_{old}", f"big_{new}",
                   f"base_{old}_again", f"base_{new}_again"]
  timed = [c[4] for c in calls if not c[4].endswith("--steps 1 --warmup 1")]
  flagged = [flag in c for c in timed]
  assert flagged == [old == "dense", old != "dense"] * 3
  assert ["configs/wmt14_ende.py:big" in c for c in timed] == [False] * 2 + [True] * 2 + [False] * 2
  assert all("fused_qkv=True" in c and "attention_impl=cudnn" in c for c in timed)


def test_benchmark_gpu_skips_what_would_start_after_the_deadline(tmp_path):
  repo = Path(__file__).resolve().parents[1]
  fake, log = _fake_python(tmp_path)
  r = subprocess.run(["bash", str(repo / "scripts/benchmark_gpu.sh"), str(tmp_path / "out"), "0",
                      "now"], env=dict(os.environ, PYTHON=str(fake)), capture_output=True,
                     text=True, timeout=60)
  assert r.returncode == 0
  assert "skipped (deadline): check base_now big_now" in r.stdout
  assert not log.exists()
  r = subprocess.run(["bash", str(repo / "scripts/benchmark_gpu.sh"), str(tmp_path / "out2"),
                      "100", "compare"], env=dict(os.environ, PYTHON=str(fake)),
                     capture_output=True, text=True, timeout=60)
  assert r.returncode == 2 and "BASELINE_TREE is not set" in r.stderr
  (tmp_path / "now").mkdir()
  (tmp_path / "..x").mkdir()
  for trees, message in [(f"{tmp_path}/nowhere", "/nowhere' is not a directory"),
                         (f"{tmp_path},{tmp_path}", "is used twice"),
                         (f"{tmp_path}/now",
                          "'now' is used twice, is one of this tree's (now, again"),
                         (f"{tmp_path}/..x,{tmp_path}/..", "'..' is used twice")]:
    r = subprocess.run(["bash", str(repo / "scripts/benchmark_gpu.sh"), str(tmp_path / "out2"),
                        "100", "compare"], env=dict(os.environ, PYTHON=str(fake),
                                                    BASELINE_TREE=trees),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and message in r.stderr, r.stderr
  r = subprocess.run(["bash", str(repo / "scripts/benchmark_gpu.sh"), str(tmp_path / "out3"),
                      "100", "precision"], env=dict(os.environ, PYTHON=str(fake)),
                     capture_output=True, text=True, timeout=60)
  assert r.returncode == 2 and "PRECISION_BATCHES='' is not a file" in r.stderr
  for args, env_extra, message in [
      (["100", "now,flag"], {}, "unknown group 'flag'"),
      (["100", "now"], {"PRECOMPILE": "0"}, "PRECOMPILE=0: expected how many"),
  ]:
    r = subprocess.run(["bash", str(repo / "scripts/benchmark_gpu.sh"), str(tmp_path / "o"),
                        *args], env=dict(os.environ, PYTHON=str(fake), **env_extra),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and message in r.stderr, r.stderr
  assert not log.exists()


def _batches_file(tmp_path, count: int, name="b.npz"):
  """Synthetic batches of the tiny config saved as compare_precision.py saves real ones."""
  from transformer_jax.bench import common, precision
  c = tiny_config.get_config()
  path = str(tmp_path / name)
  ids = {"vocab_size": c.data.vocab_size, "pad_id": 0, "bos_id": 2, "eos_id": 3}
  precision.save(path, common.synthetic_batches(c, c.data.vocab_size, count), ids)
  return path


def test_compare_precision_same_setting_is_identical_and_bf16_close(tmp_path, capsys,
                                                                  monkeypatch):
  from transformer_jax.bench import precision
  path = _batches_file(tmp_path, 5)
  batches, ids = precision.load(path, 5)
  assert len(batches) == 5 and ids == {"vocab_size": 200, "pad_id": 0, "bos_id": 2, "eos_id": 3}
  assert batches[0]["inputs"].shape == (8, 32) and batches[0]["inputs"].dtype == np.int32
  # A variant that changes nothing: the same curve to the bit, parameters equal.
  start = time.perf_counter()
  same = precision.run(tiny_config.get_config(), precision.PrecisionOptions(
      steps=5, variant=(("model.dtype", "float32"),), batches_file=path), log=lambda m: None)
  wall = time.perf_counter() - start
  seconds = same["figures"]["reference_seconds"], same["figures"]["variant_seconds"]
  assert 0 < seconds[0] and 0 < seconds[1] and sum(seconds) <= wall + 0.01, (seconds, wall)
  assert same["passed"] and same["curves"]["reference"] == same["curves"]["variant"]
  assert same["figures"]["params_rel_diff"] == 0.0 and same["figures"]["tail_steps"] == 1
  assert len(same["curves"]["reference"]) == 5
  # The loss per target token: about ln(200) for the untrained model's 200 tokens, falling.
  first, last = same["curves"]["reference"][0], same["curves"]["reference"][-1]
  assert 4.5 < first < 6.5 and last < first
  # bfloat16: close, not equal; a tolerance below its difference fails.
  script = load_script("compare_precision")
  curves, real_curve = {}, precision._curve

  def recorded(config, model_cfg, host_batches):
    curves[model_cfg] = real_curve(config, model_cfg, host_batches)
    return curves[model_cfg]

  monkeypatch.setattr(precision, "_curve", recorded)
  code = script.main(["--config", TINY, "--steps", "5", "--batches_file", path,
                      "--json", str(tmp_path / "r.json"), "--plot", str(tmp_path / "r.png")])
  out = capsys.readouterr().out
  bf16 = last_json_line(out)
  assert code == 0 and bf16["passed"] and bf16["variant"] == {"model.dtype": "bfloat16"}
  assert "variant: bfloat16 compute, xla attention, 5 steps" in out and "PASS" in out
  f = bf16["figures"]
  assert 0 < f["tail_rel_diff"] < 0.02 and 0 < f["params_rel_diff"] < 0.05
  assert bf16["curves"]["reference"] == same["curves"]["reference"]  # the same reference run
  assert json.load(open(tmp_path / "r.json"))["figures"] == f
  assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"
  tight = f["tail_rel_diff"] / 2
  # The same two runs again, judged by a tolerance below their difference: their curves are the
  # ones just computed (runs of one setting are identical to the bit, as checked above), so
  # they are handed back instead of trained again.
  monkeypatch.setattr(precision, "_curve", lambda config, model_cfg, host_batches:
                      curves.pop(model_cfg))
  assert script.main(["--config", TINY, "--steps", "5", "--batches_file", path,
                      "--tolerance", str(tight)]) == 1
  assert not curves   # both reused
  assert "FAIL" in capsys.readouterr().out


def test_compare_precision_takes_bucketed_batches(tmp_path):
  # "bucket" batching: each batch has its bucket's shape. The check of a batches file accepts
  # each of them, both curves train on them (a compile per shape), and a shape of no bucket is
  # refused with the buckets' shapes.
  from transformer_jax.bench import precision
  from transformer_jax.data.config import train_batch_shapes
  c = tiny_config.get_config()
  c.data.batching, c.data.bucket_boundaries = "bucket", (16,)
  shapes = train_batch_shapes(c.data)
  assert [s["inputs"] for s in shapes] == [(16, 16), (8, 32)]
  rng = np.random.default_rng(0)
  batches = []
  for shape in shapes:
    rows, length = shape["inputs"]
    batch = {k: rng.integers(4, c.data.vocab_size, (rows, length), dtype=np.int32)
             for k in ("inputs", "targets")}
    batch["targets"][:, length - 3:] = 0    # right padding
    batches.append(batch)
  ids = {"vocab_size": c.data.vocab_size, "pad_id": 0, "bos_id": 2, "eos_id": 3}
  path = str(tmp_path / "bucketed.npz")
  precision.save(path, batches, ids)
  loaded, loaded_ids = precision.load(path, 2, c)
  assert loaded_ids == ids and [b["inputs"].shape for b in loaded] == [(16, 16), (8, 32)]
  # One curve (run() trains two such, as the tests above show for packed batches).
  losses, _, _ = precision._curve(c, tj.experiment.transformer_config(c, c.data.vocab_size),
                                  loaded)
  assert len(losses) == 2 and all(4 < x < 7 for x in losses), losses
  c.data.bucket_boundaries = (8,)   # buckets of 8 and 32: the file's 16 fits none
  with pytest.raises(precision.BatchesFileError,
                     match=re.escape("(batch 0), the config's are one of the 'bucket' batching's "
                                     "2: [{'inputs': (32, 8), 'targets': (32, 8)}, ")):
    precision.load(path, 2, c)
  # Packed rows of a bucket's shape (the last bucket's is the packed rows' with the default
  # rows): refused, the model would take them as packed.
  c.data.bucket_boundaries = (16,)
  packed = [dict(b, inputs_segmentation=np.ones_like(b["inputs"])) for b in batches]
  precision.save(path, packed, ids)
  with pytest.raises(precision.BatchesFileError,
                     match=re.escape("holds packed rows (batch 0 has inputs_segmentation), the "
                                     "config's data.batching='bucket' gives one pair per row")):
    precision.load(path, 2, c)


def test_compare_precision_says_what_is_wrong(tmp_path, capsys):
  script = load_script("compare_precision")
  path = _batches_file(tmp_path, 2)
  cases = [
      (["--steps", "3", "--batches_file", path], f"{path} holds 2 batches; 3 steps need 3"),
      (["--variant", "model.dtype=bfloat17"], "config.model.dtype='bfloat17': expected one of"),
      (["--variant", "model.dtpe=bfloat16"], "no field 'model.dtpe'"),
      (["--variant", "dtype"], "--variant 'dtype': expected FIELD=VALUE"),
      (["--batches_file", path, "--save_batches", str(tmp_path / "x.npz")],
       "read the batches or save them, not both"),
  ]
  np.savez(tmp_path / "other.npz", a=np.zeros(3))
  (tmp_path / "empty.npz").write_bytes(b"")
  (tmp_path / "text.npz").write_text("not numpy\n")
  np.savez(tmp_path / "stray.npz", **{f"tokenizer/{k}": 1 for k in
                                     ("vocab_size", "pad_id", "bos_id", "eos_id")}, extra=[1])
  for bad in ("other.npz", "empty.npz", "text.npz", "stray.npz"):
    cases.append((["--batches_file", str(tmp_path / bad)],
                  "not a batches file of compare_precision.py"))
  cases.append((["--batches_file", path, "--config.data.batch_size=4"],
                "holds batches of {'inputs': (8, 32), 'targets': (8, 32)} (batch 0), the "
                "config's are "
                "{'inputs': (4, 32), 'targets': (4, 32)}"))
  for args, message in cases:
    assert script.main(["--config", TINY, "--steps", "2", *args]) == 2, args
    assert message in capsys.readouterr().err, args
