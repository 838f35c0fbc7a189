"""Throughput benchmarks, one function per `--what` mode; each prints a table and a final JSON line.

    python scripts/benchmark.py --what train --config configs/cpu_reference.py
    python scripts/benchmark.py --what train --config configs/cpu_reference.py --config.model.dtype=bfloat16
    python scripts/benchmark.py --what decode --config configs/cpu_reference.py --beams 1,4
    python scripts/benchmark.py --what decode --config configs/default.py --workdir runs/default
    python scripts/benchmark.py --what data                      # numbers + locale, all modes
    python scripts/benchmark.py --what data --datasets numbers --batching pack --seconds 20

`train`: the compiled train step (forward, backward, Adam update; the state donated, as in
training) on batches of the config's shape: `config.data.batch_size` rows of
`data.max_source_len` source and `data.max_target_len` target tokens. `--batches synthetic`
(default) fills every position with a random token (no padding); `--batches real` takes the
first batches of the configured dataset (builds it and its tokenizer under `--workdir`). After
`--warmup` steps (the first compiles; its time is reported apart), `--steps` steps are timed one
by one, each waiting for its result; the table gives the median step time and from it real
target tokens/s, source+target tokens/s, model TFLOP/s (`transformer_jax.flops`), MFU against
the device's peak (a table for accelerators, a matmul measured in this run on CPU) and the peak
memory (the device's allocator where it reports one, else the process's peak RSS, labelled).
Then the same number of steps run back to back with one wait at the end, as the training loop
runs them: on accelerators this hides the host's per-step dispatch latency that the one-by-one
median pays. `--profile_dir` adds a device-time breakdown per kernel of 3 traced steps. It also
checks that the step compiled exactly once.

`decode`: greedy and beam search (`transformer_jax.decode.decode_batch`) on random source rows
of `data.max_source_len` tokens, `--decode_rows` at a time, compiled once then timed `--steps`
times: sentences/s and output tokens/s. With random parameters (no `--workdir`) the output
length is forced: EOS is set to the padding id, which the search never emits, so every sentence
runs to its limit of `--decode_len` tokens (default `data.max_target_len`) and the figures are
of that many steps. With `--workdir` holding a training run, its latest parameters and model
config are used and sentences stop at EOS as usual (tokens/s counts what was produced).

`data`: tokens/s the training input pipeline delivers (real, non-padding tokens per side), after
a warm-up that leaves out building the dataset and training the tokenizer, plus the fill rate
(real tokens / row capacity) and the dataset sizes. Numbers are per process; with the default
config one process reads on 2 threads.

Only `data` and `--batches real` import the data stack (tensorflow-datasets, grain); `train`
and `decode` need jax, flax, optax and ml_collections (and orbax with `--workdir`).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_CONFIG = os.path.join(REPO, "configs", "cpu_reference.py")


def _default_workdir() -> str:
  return os.path.join(tempfile.gettempdir(), "transformer_jax_bench")


def bench_data(args) -> dict:
  from transformer_jax.data import default_data_config, get_data  # Imports tfds and grain.

  load_start = _load_average()
  points = []
  for dataset in args.datasets.split(","):
    for batching in args.batching.split(","):
      c = default_data_config()
      c.dataset, c.batching = dataset, batching
      c.data_dir = args.data_dir
      c.batch_size = args.batch_size
      c.max_source_len = c.max_target_len = args.max_len
      workdir = os.path.join(args.workdir or _default_workdir(), dataset)
      start = time.perf_counter()
      data = get_data(c, workdir)
      setup_s = time.perf_counter() - start
      it = iter(data.train_dataset())
      batch = next(it)  # Warm-up: threads started, first window read.
      batches = source_tokens = target_tokens = capacity = 0
      shapes = set()
      start = time.perf_counter()
      while time.perf_counter() - start < args.seconds:
        batch = next(it)
        batches += 1
        source_tokens += int((batch["inputs_segmentation"] > 0).sum())
        target_tokens += int((batch["targets_segmentation"] > 0).sum())
        capacity += batch["targets"].size
        shapes.add(tuple(batch["targets"].shape))
      elapsed = time.perf_counter() - start
      if hasattr(it, "close"):
        it.close()  # Stops grain's prefetch thread before the interpreter exits.
      points.append({
          "dataset": dataset, "batching": batching,
          "sizes": {s: len(data.sources[s]) for s in ("train", "validation", "test")},
          "vocab_size": data.tokenizer.vocab_size, "setup_s": round(setup_s, 2),
          "batches_per_s": round(batches / elapsed, 1),
          "source_tokens_per_s": round(source_tokens / elapsed),
          "target_tokens_per_s": round(target_tokens / elapsed),
          "target_fill": round(target_tokens / max(1, capacity), 3),
          "batch_shapes": sorted(list(x) for x in shapes),
      })
      p = points[-1]
      _print_table(f"input pipeline: {dataset}, {batching}, {args.batch_size} rows x "
                   f"{args.max_len} tokens, {args.seconds:g} s timed", [
          ("pairs (train/valid/test)", "/".join(f"{n:,}" for n in p["sizes"].values())),
          ("vocabulary", f"{p['vocab_size']:,}"),
          ("setup (build, tokenizer)", f"{p['setup_s']:.2f} s"),
          ("batches/s", f"{p['batches_per_s']:,.1f}"),
          ("source tokens/s", f"{p['source_tokens_per_s']:,}"),
          ("target tokens/s", f"{p['target_tokens_per_s']:,}"),
          ("target fill", f"{p['target_fill']:.3f}"),
          ("batch shapes", ", ".join(f"{r} x {l}" for r, l in p["batch_shapes"])),
      ])
  return {"what": "data",
          "config": {"datasets": args.datasets, "batching": args.batching,
                     "batch_size": args.batch_size, "max_len": args.max_len,
                     "seconds": args.seconds, "data_dir": args.data_dir},
          **_environment(), "load_average_start": load_start,
          "load_average_end": _load_average(), "figures": points}


# ---------------------------------------------------------------------------- shared pieces


def _environment(model_cfg=None) -> dict:
  import flax
  import jax

  device = jax.devices()[0]
  out = {"device_kind": device.device_kind, "platform": device.platform,
         "num_devices": jax.device_count(), "jax_version": jax.__version__,
         "flax_version": flax.__version__, "cpu_count": os.cpu_count(),
         "xla_flags": os.environ.get("XLA_FLAGS", "")}
  if model_cfg is not None:
    out.update(dtype=model_cfg.dtype, param_dtype=model_cfg.param_dtype)
  return out


def _load_average() -> list[float]:
  return [round(x, 2) for x in os.getloadavg()]


def _peak_memory() -> tuple[int | None, str]:
  """(bytes, what they are): the device allocator's peak, or the process's peak RSS on CPU."""
  import jax

  stats = jax.devices()[0].memory_stats() or {}
  if "peak_bytes_in_use" in stats:
    return int(stats["peak_bytes_in_use"]), "device peak_bytes_in_use"
  # ru_maxrss is in KiB on Linux; it includes the compiler and Python, not only the step.
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "process peak RSS (CPU)"


def _model_config(config, vocab_size: int, pad_id: int = 0, bos_id: int = 2, eos_id: int = 3):
  from transformer_jax.experiment import transformer_config

  return transformer_config(config, vocab_size, pad_id, bos_id, eos_id)


def _synthetic_batches(config, vocab_size: int, count: int, seed: int = 0) -> list[dict]:
  """Rows full of random real tokens (ids 4.. vocab): no padding, so every position counts."""
  import numpy as np

  rng = np.random.default_rng(seed)
  d = config.data
  shape_s, shape_t = (d.batch_size, d.max_source_len), (d.batch_size, d.max_target_len)
  return [{"inputs": rng.integers(4, vocab_size, shape_s).astype(np.int32),
           "targets": rng.integers(4, vocab_size, shape_t).astype(np.int32)}
          for _ in range(count)]


def _real_batches(config, workdir: str, count: int):
  """The first `count` training batches of the configured dataset, and its tokenizer."""
  from transformer_jax.data import get_data  # Imports tfds and grain.
  from transformer_jax.train import ARRAY_KEYS

  data = get_data(config.data, workdir)
  it = iter(data.train_dataset())
  batches = [{k: v for k, v in next(it).items() if k in ARRAY_KEYS} for _ in range(count)]
  if hasattr(it, "close"):
    it.close()
  return batches, data.tokenizer


def _print_table(title: str, rows: list[tuple[str, str]]) -> None:
  width = max(len(k) for k, _ in rows)
  print(f"\n{title}")
  print("-" * (width + 24))
  for k, v in rows:
    print(f"{k:<{width}}  {v}")
  print("-" * (width + 24), flush=True)


def _config_json(config) -> dict:
  return json.loads(config.to_json_best_effort())


# ---------------------------------------------------------------------------- profile

# Device-time categories of a profile, by kernel / op name (cuBLAS and CUTLASS GEMMs show as
# nvjet_*, sm90_xmma_*, cutlass_*; XLA:CPU's matmuls as ynn_fusion / dot).
_CATEGORIES = (("attention (cuDNN)", r"fmha|flash|cudnn"),
               ("matmul", r"gemm|cublas|nvjet|xmma|cutlass|matmul|\bdot|ynn"),
               ("random bits (dropout)", r"threefry|rng|random"),
               ("copy / transpose", r"copy|transpose|memcpy|memset"),
               ("reduction / elementwise fusion", r"fusion|reduce|^loop|^input"))


def _profile_summary(trace_dir: str, steps: int, top: int = 25) -> dict:
  """Device time per kernel (accelerators) or per op (CPU) from the Perfetto trace that
  `jax.profiler.trace` wrote under `trace_dir`, summed over the traced steps, with shares."""
  import collections
  import glob
  import gzip
  import re

  paths = sorted(glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True),
                 key=os.path.getmtime)
  if not paths:
    return {"error": f"no *.trace.json.gz under {trace_dir}"}
  with gzip.open(paths[-1]) as f:
    events = json.load(f)["traceEvents"]
  names = {e["pid"]: e["args"]["name"] for e in events
           if e.get("ph") == "M" and e.get("name") == "process_name"}
  device_pids = {pid for pid, n in names.items() if "/device:" in n and "CPU" not in n}
  if device_pids:
    chosen = [e for e in events if e.get("ph") == "X" and e["pid"] in device_pids]
    where = "device streams: " + ", ".join(sorted(names[p] for p in device_pids))
  else:  # CPU: XLA's ops run on the host's threads; leave out the runtime's own spans
    # (C++ methods such as PjRt's ExecuteHelper, thread-pool waits, end markers).
    runtime = ("Pjit", "jit_", "ThunkExecutor", "SlinkyThreadPool", "end: ", "Handle",
               "Wait", "Parse", "Allocate")
    chosen = [e for e in events if e.get("ph") == "X" and "$" not in e.get("name", "")
              and "::" not in e.get("name", "") and not e.get("name", "").startswith(runtime)]
    where = "host threads (CPU backend)"
  per_name = collections.Counter()
  for e in chosen:
    per_name[e["name"]] += float(e.get("dur", 0))
  total = sum(per_name.values()) or 1.0
  categories = collections.Counter()
  for name, us in per_name.items():
    label = next((c for c, pattern in _CATEGORIES if re.search(pattern, name, re.I)), "other")
    categories[label] += us
  print(f"\nprofile ({where}), {steps} steps: {total / steps / 1e3:.1f} ms of kernel time/step")
  for label, us in categories.most_common():
    print(f"  {label:<32} {100 * us / total:5.1f} %")
  for name, us in per_name.most_common(top):
    print(f"  {100 * us / total:5.1f} %  {us / steps / 1e3:8.3f} ms  {name[:110]}")
  return {"trace": paths[-1], "where": where, "kernel_ms_per_step": round(total / steps / 1e3, 3),
          "categories": {k: round(v / total, 4) for k, v in categories.most_common()},
          "top": [[n[:200], round(us / steps / 1e3, 4)] for n, us in per_name.most_common(top)]}


# ---------------------------------------------------------------------------- train


def bench_train(args, config) -> dict:
  import jax
  import numpy as np

  from transformer_jax import flops, sharding
  from transformer_jax.steps import TrainSetup

  load_start = _load_average()
  if args.batches == "real":
    host_batches, tok = _real_batches(config, args.workdir or _default_workdir(),
                                      args.num_batches)
    model_cfg = _model_config(config, tok.vocab_size, tok.pad_id, tok.bos_id, tok.eos_id)
  else:
    model_cfg = _model_config(config, config.data.vocab_size)
    host_batches = _synthetic_batches(config, model_cfg.vocab_size, args.num_batches)
  # The Trainer's own mesh, state shardings and jitted step (donated state), without the data
  # stack or checkpoints.
  setup = TrainSetup(config, model_cfg)
  step, batch_sharding, context = setup.train_step, setup.batch_sharding, setup.context
  state = setup.init_state(jax.random.key(config.seed))
  pad = model_cfg.pad_id
  lengths = [flops.batch_lengths(b, pad) for b in host_batches]
  step_flops = [flops.train_flops(model_cfg, s, t) for s, t in lengths]
  target_tokens = [int(t.sum()) for _, t in lengths]
  source_tokens = [int(s.sum()) for s, _ in lengths]
  batches = [sharding.global_batch(b, batch_sharding) for b in host_batches]

  with context():
    start = time.perf_counter()
    state, metrics = step(state, batches[0])
    jax.block_until_ready((state, metrics))
    first_step_s = time.perf_counter() - start
    for i in range(1, args.warmup):
      state, metrics = step(state, batches[i % len(batches)])
    jax.block_until_ready((state, metrics))
    # The peak is measured between warm-up and timing, under the same load as the steps.
    peak, peak_source = flops.peak_flops(model_cfg.dtype, n=args.matmul_n,
                                         min_seconds=args.matmul_seconds)
    times, used = [], []
    for i in range(args.steps):
      b = i % len(batches)
      start = time.perf_counter()
      state, metrics = step(state, batches[b])
      jax.block_until_ready((state, metrics))
      times.append(time.perf_counter() - start)
      used.append(b)
    # Back to back, as the training loop runs them (it fetches metrics only at log steps):
    # the host dispatches the next step while the device works on this one, so per-step
    # launch latency is hidden where the step-by-step median above pays it every step.
    start = time.perf_counter()
    for i in range(args.steps):
      state, metrics = step(state, batches[i % len(batches)])
    jax.block_until_ready((state, metrics))
    back_to_back = (time.perf_counter() - start) / args.steps
    profile = None
    if args.profile_dir:
      # After timing, so the trace's overhead stays out of the figures.
      jax.block_until_ready(state)
      with jax.profiler.trace(args.profile_dir, create_perfetto_trace=True):
        for i in range(3):
          state, metrics = step(state, batches[i % len(batches)])
        jax.block_until_ready((state, metrics))
      profile = _profile_summary(args.profile_dir, steps=3)
  loss = float(metrics["loss"] / metrics["tokens"])
  if not np.isfinite(loss):
    raise FloatingPointError(f"non-finite training loss {loss} in the benchmark")
  compilations = step._cache_size()
  median = statistics.median(times)
  # Per-step work is averaged over the batches timed (they differ only with real batches).
  tgt = float(np.mean([target_tokens[b] for b in used]))
  src = float(np.mean([source_tokens[b] for b in used]))
  work = float(np.mean([step_flops[b] for b in used]))
  # On CPU the measured peak is the whole host's; on accelerators the table is per chip.
  peak_total = peak if jax.devices()[0].platform == "cpu" else peak * jax.device_count()
  memory, memory_source = _peak_memory()
  figures = {
      "first_step_s": round(first_step_s, 3),
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
      "peak_flops_per_s": peak_total,
      "peak_source": peak_source,
      "mfu": round(work / median / peak_total, 4),
      "back_to_back_step_time_s": round(back_to_back, 4),
      "back_to_back_target_tokens_per_s": round(tgt / back_to_back, 1),
      "back_to_back_mfu": round(work / back_to_back / peak_total, 4),
      "peak_memory_bytes": memory,
      "peak_memory_source": memory_source,
      "compilations": compilations,
      "final_loss": round(loss, 4),
  }
  shapes = {k: list(v.shape) for k, v in host_batches[0].items()}
  _print_table(
      f"train step: {config.model_size} ({model_cfg.d_model}d, "
      f"{model_cfg.num_encoder_layers}+{model_cfg.num_decoder_layers} layers, vocab "
      f"{model_cfg.vocab_size}), {model_cfg.dtype}, batches {args.batches} {shapes}", [
          ("device", f"{jax.devices()[0].device_kind} x {jax.device_count()}"),
          ("first step (compiles)", f"{first_step_s:.2f} s"),
          ("step time (median)", f"{median * 1e3:.1f} ms  (min {min(times) * 1e3:.1f}, "
                                 f"max {max(times) * 1e3:.1f}, {len(times)} steps)"),
          ("target tokens/s", f"{tgt / median:,.0f}  ({tgt:.0f} real per step)"),
          ("source+target tokens/s", f"{(tgt + src) / median:,.0f}"),
          ("model TFLOP/s", f"{work / median / 1e12:.4f}  ({work / 1e9:.1f} GFLOP per step)"),
          ("peak FLOP/s", f"{peak_total / 1e12:.4f} TFLOP/s  ({peak_source})"),
          ("MFU", f"{100 * work / median / peak_total:.1f} %"),
          ("back to back (no wait)", f"{back_to_back * 1e3:.1f} ms/step, "
                                     f"{tgt / back_to_back:,.0f} target tokens/s, MFU "
                                     f"{100 * work / back_to_back / peak_total:.1f} %"),
          ("peak memory", f"{memory / 2**20:,.0f} MiB  ({memory_source})"),
          ("compilations of the step", str(compilations)),
          ("load average (start)", str(load_start)),
      ])
  if compilations != 1:
    print(f"WARNING: the train step compiled {compilations} times", file=sys.stderr)
  if profile is not None:
    figures["profile"] = profile
  return {"what": "train", "batches": args.batches, "shapes": shapes,
          "model": model_cfg.to_dict(), "config": _config_json(config),
          **_environment(model_cfg), "load_average_start": load_start,
          "load_average_end": _load_average(), "figures": figures}


# ---------------------------------------------------------------------------- decode


def _trained_run(workdir: str):
  """(model config, host parameters, step) of a training run's workdir."""
  from transformer_jax import checkpointing
  from transformer_jax.config import TransformerConfig

  with open(os.path.join(workdir, "config.json")) as f:
    resolved = json.load(f)["resolved_model"]
  step, params = checkpointing.load_params(workdir)
  return TransformerConfig(**resolved).replace(deterministic=True, decode=False), params, step


def bench_decode(args, config) -> dict:
  import jax
  import numpy as np

  from transformer_jax.decode import decode_batch
  from transformer_jax.model import Transformer

  load_start = _load_average()
  d = config.data
  rows = args.decode_rows or d.batch_size
  decode_len = args.decode_len or d.max_target_len
  if args.workdir:
    model_cfg, params, ckpt_step = _trained_run(args.workdir)
    source = f"trained parameters of {args.workdir} (step {ckpt_step}); stops at EOS"
    search_cfg = model_cfg
  else:
    model_cfg = _model_config(config, d.vocab_size).replace(deterministic=True)
    params = jax.jit(Transformer(model_cfg).init)(
        jax.random.key(config.seed), np.ones((1, 8), np.int32),
        np.ones((1, 8), np.int32))["params"]
    # The search never emits the padding id: with EOS = padding every sentence runs to its
    # limit, so the figures are of exactly `decode_len` steps per sentence.
    search_cfg = model_cfg.replace(eos_id=model_cfg.pad_id)
    source = f"random parameters; EOS disabled, {decode_len} tokens per sentence"
  if search_cfg.max_len < decode_len:
    search_cfg = search_cfg.replace(max_len=decode_len)  # sinusoidal positions only
  rng = np.random.default_rng(0)
  inputs = rng.integers(4, model_cfg.vocab_size, (rows, d.max_source_len)).astype(np.int32)
  results, table = {}, [("device", f"{jax.devices()[0].device_kind}"), ("parameters", source)]
  for beam in [int(b) for b in args.beams.split(",")]:
    start = time.perf_counter()
    decode_batch(search_cfg, params, inputs, beam_size=beam, max_len_margin=decode_len,
                 max_decode_len=decode_len)
    first_s = time.perf_counter() - start
    times, produced = [], []
    for _ in range(args.steps):
      start = time.perf_counter()
      _, lengths = decode_batch(search_cfg, params, inputs, beam_size=beam,
                                max_len_margin=decode_len, max_decode_len=decode_len)
      times.append(time.perf_counter() - start)
      produced.append(int(lengths.sum()))
    median = statistics.median(times)
    tokens = float(np.mean(produced))
    name = "greedy" if beam == 1 else f"beam {beam}"
    results[name] = {"beam_size": beam, "first_call_s": round(first_s, 3),
                     "batch_time_s": round(median, 4), "sentences_per_s": round(rows / median, 2),
                     "target_tokens_per_s": round(tokens / median, 1),
                     "target_tokens_per_batch": tokens}
    table += [(f"{name}: batch time (median)", f"{median * 1e3:.1f} ms "
               f"(first call {first_s:.2f} s, {len(times)} calls)"),
              (f"{name}: sentences/s", f"{rows / median:,.1f}"),
              (f"{name}: target tokens/s", f"{tokens / median:,.0f} ({tokens:.0f} per batch)")]
  table.append(("load average (start)", str(load_start)))
  _print_table(f"decode: {rows} sources x {d.max_source_len} tokens, up to {decode_len} "
               f"output tokens, {model_cfg.dtype}", table)
  memory, memory_source = _peak_memory()
  return {"what": "decode", "parameters": source,
          "shapes": {"inputs": [rows, d.max_source_len], "max_output_len": decode_len},
          "model": model_cfg.to_dict(), "config": _config_json(config),
          **_environment(model_cfg), "load_average_start": load_start,
          "load_average_end": _load_average(),
          "figures": {**results, "peak_memory_bytes": memory,
                      "peak_memory_source": memory_source}}


MODES = {"data": bench_data, "train": bench_train, "decode": bench_decode}


def _parse(argv):
  """argparse for the benchmark's own flags; `--config` and `--config.*` (everything argparse
  does not know) go to ml_collections' config flags on a private FlagValues, so `main` can be
  called more than once in a process (tests)."""
  from absl import flags
  from ml_collections import config_flags

  parser = argparse.ArgumentParser(description=__doc__, allow_abbrev=False,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--what", choices=sorted(MODES), default="data")
  # data mode
  parser.add_argument("--datasets", default="numbers,locale",
                      help="comma-separated data.dataset values (data mode)")
  parser.add_argument("--batching", default="pack,bucket,pad",
                      help="comma-separated data.batching values (data mode)")
  parser.add_argument("--batch_size", type=int, default=64, help="rows per batch (data mode)")
  parser.add_argument("--max_len", type=int, default=64,
                      help="max source and target length (data mode)")
  parser.add_argument("--seconds", type=float, default=10.0, help="timed seconds per point")
  parser.add_argument("--data_dir", default=None, help="TFDS data dir (default: TFDS's)")
  parser.add_argument("--workdir", default=None,
                      help="data and train --batches real: where datasets' tokenizers are "
                           "trained and kept (default: a temp dir); decode: a training run "
                           "whose latest parameters to use (default: random parameters)")
  # train and decode modes
  parser.add_argument("--steps", type=int, default=20,
                      help="timed train steps / decode calls, one by one; the median is reported")
  parser.add_argument("--warmup", type=int, default=3, help="untimed train steps (>= 1)")
  parser.add_argument("--batches", choices=("synthetic", "real"), default="synthetic",
                      help="train: random tokens without padding, or the dataset's batches")
  parser.add_argument("--num_batches", type=int, default=4, help="train: distinct batches cycled")
  parser.add_argument("--matmul_n", type=int, default=2048, help="CPU peak: matmul size")
  parser.add_argument("--matmul_seconds", type=float, default=2.0,
                      help="CPU peak: at least this long measuring the matmul")
  parser.add_argument("--profile_dir", default="",
                      help="train: after timing, trace 3 steps with jax.profiler into this "
                           "directory and print device time per kernel and category")
  parser.add_argument("--beams", default="1,4", help="decode: comma-separated beam sizes")
  parser.add_argument("--decode_rows", type=int, default=0,
                      help="decode: sentences per batch (0: data.batch_size)")
  parser.add_argument("--decode_len", type=int, default=0,
                      help="decode: output length limit (0: data.max_target_len)")
  args, rest = parser.parse_known_args(argv)
  if args.warmup < 1 or args.steps < 1:
    parser.error("--warmup and --steps must be >= 1")
  if not args.seconds > 0:
    parser.error("--seconds must be > 0")
  config = None
  if args.what != "data":
    values, flag_argv = flags.FlagValues(), ["benchmark.py"] + rest
    # sys_argv: config_flags finds the --config.* overrides there (default: sys.argv).
    config_flags.DEFINE_config_file("config", DEFAULT_CONFIG, "Experiment config file "
                                    "(path[:arg]).", flag_values=values, lock_config=True,
                                    sys_argv=flag_argv)
    try:
      values(flag_argv)
    except flags.Error as e:
      parser.error(str(e))
    config = values.config
  elif rest:
    parser.error(f"unrecognized arguments: {' '.join(rest)}")
  return args, config


def main(argv=None):
  args, config = _parse(sys.argv[1:] if argv is None else argv)
  result = MODES["data"](args) if args.what == "data" else MODES[args.what](args, config)
  print(json.dumps(result), flush=True)
  return result


if __name__ == "__main__":
  main()
