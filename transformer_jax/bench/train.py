"""Throughput of the compiled train step: `run(config, TrainOptions(...)) -> dict`.

The step is the training loop's own (`steps.TrainSetup`: forward, backward, Adam update, the
state donated) on batches of the config's shape, as many rows as training takes
(`data.config.global_rows`: `data.batch_size`, or `data.batch_tokens` // the longest row) of
`data.max_source_len` source and `data.max_target_len` target tokens: random tokens without
padding (`batches="synthetic"`) or the first batches of the configured dataset (`"real"`, whose
batches may differ in shape: `data.batching="bucket"`). After `warmup` steps (the first
compiles; its time is reported apart) and one more on each other batch shape (each compiles
its own program), `steps` steps are timed one by one, each waiting for its result. From the
median: real target tokens/s, source+target tokens/s, model TFLOP/s (`transformer_jax.flops`),
MFU against the device's peak (a table for accelerators, a matmul measured in this run on CPU)
and the peak memory. Then the same number of steps run back to back with one wait at the end,
as the training loop runs them. The step must compile exactly once per batch shape.
"""
from __future__ import annotations

import dataclasses
import statistics
import sys
import time

import jax
import numpy as np

from transformer_jax import batch as batch_lib
from transformer_jax import flops, sharding
from transformer_jax.bench import common
from transformer_jax.bench.profile import trace_summary

# The data package loads tensorflow-datasets and grain only when get_data builds a dataset, so
# this import keeps synthetic-batch runs free of them.
from transformer_jax.data import get_data
from transformer_jax.experiment import transformer_config
from transformer_jax.steps import TrainSetup

BATCHES = ("synthetic", "real")
PROFILED_STEPS = 3
# The smallest CPU peak matmul, as for training's `config.cpu_peak_matmul_size`
# (experiment.validate): smaller ones measure nothing like a peak, and 0 divides by zero.
MIN_MATMUL_N = 16


@dataclasses.dataclass(frozen=True)
class TrainOptions:
  steps: int = 20              # timed steps, one by one; the median is reported
  warmup: int = 3              # untimed steps first (>= 1); the first one compiles
  batches: str = "synthetic"   # "synthetic": random tokens, no padding; "real": the dataset's
  num_batches: int = 4         # distinct batches, cycled
  workdir: str | None = None   # "real": where the dataset's tokenizer is trained and kept
  matmul_n: int = flops.PEAK_MATMUL_N  # CPU peak: the size of the measured matmul
  matmul_seconds: float = 2.0  # CPU peak: at least this long measuring it
  profile_dir: str = ""        # after timing, trace 3 steps here and summarise device time
  config_path: str | None = None  # the config file (path[:arg]) the config came from: reported

  def __post_init__(self):
    if self.warmup < 1 or self.steps < 1:
      raise ValueError(f"warmup={self.warmup}, steps={self.steps}: both must be >= 1")
    if self.batches not in BATCHES:
      raise ValueError(f"batches={self.batches!r}: expected one of {BATCHES}")
    if self.num_batches < 1:
      raise ValueError(f"num_batches={self.num_batches}: must be >= 1")
    if self.matmul_n < MIN_MATMUL_N:
      raise ValueError(f"matmul_n={self.matmul_n}: must be >= {MIN_MATMUL_N} (the default "
                       f"{flops.PEAK_MATMUL_N} measures the CPU's peak)")
    if self.matmul_seconds < 0:
      raise ValueError(f"matmul_seconds={self.matmul_seconds}: must be >= 0")


def real_batches(config, workdir: str, count: int):
  """The first `count` training batches of the configured dataset (the model's arrays of the
  batch schema, as the training loop hands them to the step), and its tokenizer."""
  data = get_data(config.data, workdir)
  it = iter(data.train_dataset())
  packed = batch_lib.packs(config.data.batching)
  batches = [batch_lib.model_arrays(next(it), packed) for _ in range(count)]
  if hasattr(it, "close"):
    it.close()  # Stops grain's prefetch thread.
  return batches, data.tokenizer


def _model_and_batches(config, options: TrainOptions):
  if options.batches == "real":
    host_batches, tok = real_batches(config, options.workdir or common.default_workdir(),
                                     options.num_batches)
    model_cfg = transformer_config(config, tok.vocab_size, tok.pad_id, tok.bos_id, tok.eos_id)
    return model_cfg, host_batches
  model_cfg = transformer_config(config, config.data.vocab_size)
  return model_cfg, common.synthetic_batches(config, model_cfg.vocab_size, options.num_batches)


def batch_shapes(batch) -> dict:
  """{key: [rows, length]} of a batch (host or device arrays)."""
  return {k: list(v.shape) for k, v in batch.items()}


def first_of_each_shape(batches) -> list[int]:
  """The index of the first batch of each distinct shape, in order (one with a single shape)."""
  seen = {}
  for i, batch in enumerate(batches):
    seen.setdefault(str(sorted(batch_shapes(batch).items())), i)
  return list(seen.values())


def _timed(setup: TrainSetup, state, batches, options: TrainOptions) -> dict:
  """Warm-up, the CPU peak, the steps one by one and back to back, and the profile."""
  step = setup.train_step
  out = {}
  with setup.context():
    start = time.perf_counter()
    state, metrics = step(state, batches[0])
    jax.block_until_ready((state, metrics))
    out["first_step_s"] = time.perf_counter() - start
    # Each other shape compiles its own program: untimed here, not in a timed step.
    for i in first_of_each_shape(batches)[1:]:
      state, metrics = step(state, batches[i])
    for i in range(1, options.warmup):
      state, metrics = step(state, batches[i % len(batches)])
    jax.block_until_ready((state, metrics))
    # The peak is measured between warm-up and timing, under the same load as the steps.
    out["peak"] = flops.peak_flops(setup.model.config.dtype, n=options.matmul_n,
                                   min_seconds=options.matmul_seconds)
    out["times"], out["used"], out["dispatch"] = [], [], []
    for i in range(options.steps):
      b = i % len(batches)
      start = time.perf_counter()
      state, metrics = step(state, batches[b])
      # The call returns once the host has handed the step to the device (flattened the state's
      # arrays, enqueued the program): host time that back-to-back steps overlap with the device.
      out["dispatch"].append(time.perf_counter() - start)
      jax.block_until_ready((state, metrics))
      out["times"].append(time.perf_counter() - start)
      out["used"].append(b)
    # Back to back, as the training loop runs them (it fetches metrics only at log steps):
    # the host dispatches the next step while the device works on this one, so per-step
    # launch latency is hidden where the step-by-step median above pays it every step.
    start = time.perf_counter()
    for i in range(options.steps):
      state, metrics = step(state, batches[i % len(batches)])
    jax.block_until_ready((state, metrics))
    out["back_to_back"] = (time.perf_counter() - start) / options.steps
    if options.profile_dir:
      # After timing, so the trace's overhead stays out of the figures.
      with jax.profiler.trace(options.profile_dir, create_perfetto_trace=True):
        for batch in (batches * PROFILED_STEPS)[:PROFILED_STEPS]:
          state, metrics = step(state, batch)
        jax.block_until_ready((state, metrics))
      out["profile"] = trace_summary(options.profile_dir, steps=PROFILED_STEPS)
  out["loss"] = float(metrics["loss"] / metrics["tokens"])
  return out


def run(config, options: TrainOptions = TrainOptions()) -> dict:
  """Time the train step of `config`; prints a table and returns the figures with the config,
  shapes, model, environment and load average."""
  load_start = common.load_average()
  # The peak memory of this run alone, where it can be reset (CPU): not an earlier one's.
  fresh_peak = common.reset_peak_memory()
  model_cfg, host_batches = _model_and_batches(config, options)
  # The Trainer's own mesh, state shardings and jitted step, without the data stack or
  # checkpoints.
  setup = TrainSetup(config, model_cfg)
  state = setup.init_state(jax.random.key(config.seed))
  lengths = [flops.batch_lengths(b, model_cfg.pad_id) for b in host_batches]
  step_flops = [flops.train_flops(model_cfg, s, t) for s, t in lengths]
  batches = [sharding.global_batch(b, setup.batch_sharding) for b in host_batches]
  t = _timed(setup, state, batches, options)
  if not np.isfinite(t["loss"]):
    raise FloatingPointError(f"non-finite training loss {t['loss']} in the benchmark")
  compilations = setup.train_step._cache_size()
  state_arrays = len(jax.tree.leaves(state))
  # Per-step work is averaged over the batches timed (they differ only with real batches).
  tgt = float(np.mean([int(lengths[b][1].sum()) for b in t["used"]]))
  src = float(np.mean([int(lengths[b][0].sum()) for b in t["used"]]))
  work = float(np.mean([step_flops[b] for b in t["used"]]))
  peak, peak_source = t["peak"]
  memory, memory_source = common.peak_memory(fresh_peak)
  figures = step_figures(t, tgt, src, work,
                         flops.peak_total(peak, jax.default_backend(), jax.device_count()))
  figures.update(peak_source=peak_source, state_arrays=state_arrays, peak_memory_bytes=memory,
                 peak_memory_source=memory_source, peak_memory_of_run=fresh_peak,
                 compilations=compilations)
  shapes = {k: list(v.shape) for k, v in host_batches[0].items()}
  distinct = [batch_shapes(host_batches[i]) for i in first_of_each_shape(host_batches)]
  others = len(distinct) - 1
  warmup = f"{options.warmup} step{'s' * (options.warmup > 1)}, the first compiles"
  stepped = f"batches {options.batches} {shapes}"
  if others:
    warmup += ("; 1 more on the other batch shape" if others == 1
               else f"; 1 more on each of the other {others} batch shapes")
    stepped += f" and {others} more shape{'s' * (others > 1)}"
  common.print_table(
      f"train step: {model_cfg.d_model}d, {model_cfg.num_encoder_layers}+"
      f"{model_cfg.num_decoder_layers} layers, vocab {model_cfg.vocab_size}, {model_cfg.dtype}, "
      f"{stepped}", [
          ("config", options.config_path or "(not from a file)"),
          ("device", f"{jax.devices()[0].device_kind} x {jax.device_count()}"),
          ("batch shapes", "; ".join(map(str, distinct))),
          ("warm-up (untimed)", warmup),
          *table_rows(figures),
          ("host memory", common.host_paging()),
          ("load average (start)", str(load_start)),
      ])
  note = mfu_note(max(figures["mfu"], figures["back_to_back_mfu"]), peak_source)
  if note:
    print(note, flush=True)
  if compilations != len(distinct):
    print(f"WARNING: the train step compiled {compilations} times for {len(distinct)} batch "
          f"shape{'s' * (len(distinct) > 1)}", file=sys.stderr)
  if "profile" in t:
    figures["profile"] = t["profile"]
  return {"what": "train", "config_path": options.config_path, "batches": options.batches,
          "warmup_steps": options.warmup, "shapes": shapes, "distinct_shapes": distinct,
          "model": model_cfg.to_dict(), "config": common.config_json(config),
          **common.environment(model_cfg), "load_average_start": load_start,
          "load_average_end": common.load_average(), "figures": figures}


def step_figures(t: dict, tgt: float, src: float, work: float, peak: float) -> dict:
  """The figures of `_timed`'s times (`t`) for steps of `tgt` target and `src` source tokens and
  `work` model FLOPs, against `peak` FLOP/s: from the median step, the back-to-back mean and the
  median host dispatch."""
  times, b2b = t["times"], t["back_to_back"]
  median = statistics.median(times)
  return {
      "first_step_s": round(t["first_step_s"], 3),
      "step_time_s": round(median, 4),
      "step_time_min_s": round(min(times), 4),
      "step_time_max_s": round(max(times), 4),
      "steps_timed": len(times),
      "target_tokens_per_step": tgt,
      "source_tokens_per_step": src,
      "target_tokens_per_s": round(tgt / median, 1),
      "source_target_tokens_per_s": round((tgt + src) / median, 1),
      "model_flops_per_step": work,
      "tflops_per_s": round(work / median / 1e12, 4),
      "peak_flops_per_s": peak,
      "mfu": round(work / median / peak, 4),
      "back_to_back_step_time_s": round(b2b, 4),
      "back_to_back_target_tokens_per_s": round(tgt / b2b, 1),
      "back_to_back_mfu": round(work / b2b / peak, 4),
      "dispatch_time_s": round(statistics.median(t["dispatch"]), 5),
      "final_loss": round(t["loss"], 4),
  }


def _ms(seconds: float) -> str:
  return f"{seconds * 1e3:.1f}"


def table_rows(f: dict) -> list[tuple[str, str]]:
  """The printed table's rows of the figures (`step_figures` and the run's own), read from the
  figures themselves so that the table and the JSON line cannot disagree."""
  return [
      ("first step (compiles)", f"{f['first_step_s']:.2f} s"),
      ("step time (median)", f"{_ms(f['step_time_s'])} ms  (min {_ms(f['step_time_min_s'])}, "
                             f"max {_ms(f['step_time_max_s'])}, {f['steps_timed']} steps)"),
      ("target tokens/s", f"{f['target_tokens_per_s']:,.0f}  "
                          f"({f['target_tokens_per_step']:.0f} real per step)"),
      ("source+target tokens/s", f"{f['source_target_tokens_per_s']:,.0f}"),
      ("model TFLOP/s", f"{f['tflops_per_s']:.4f}  "
                        f"({f['model_flops_per_step'] / 1e9:.1f} GFLOP per step)"),
      ("peak FLOP/s", f"{f['peak_flops_per_s'] / 1e12:.4f} TFLOP/s  ({f['peak_source']})"),
      ("MFU", f"{100 * f['mfu']:.1f} %"),
      ("back to back (no wait)", f"{_ms(f['back_to_back_step_time_s'])} ms/step, "
                                 f"{f['back_to_back_target_tokens_per_s']:,.0f} target "
                                 f"tokens/s, MFU {100 * f['back_to_back_mfu']:.1f} %"),
      ("host dispatch (median)", f"{f['dispatch_time_s'] * 1e3:.2f} ms of the one-by-one step  "
                                 f"(the state: {f['state_arrays']} arrays)"),
      ("peak memory", f"{f['peak_memory_bytes'] / 2**20:,.0f} MiB  ({f['peak_memory_source']})"),
      ("compilations of the step", str(f["compilations"])),
  ]


def mfu_note(mfu: float, peak_source: str) -> str | None:
  """`flops.mfu_note` with this benchmark's flag."""
  return flops.mfu_note(mfu, peak_source, f"--matmul_n, default {TrainOptions.matmul_n}")
