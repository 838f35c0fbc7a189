"""Throughput of the training input pipeline: `run(DataOptions(...)) -> dict`.

For each dataset and batching: tokens/s the pipeline delivers (real, non-padding tokens per
side), after a warm-up that leaves out building the dataset and training the tokenizer, plus the
fill rate (real tokens / row capacity) and the dataset sizes. Numbers are per process; with the
default data config one process reads on 2 threads. Needs the data stack (tensorflow-datasets,
grain), as the train benchmark's real batches do.
"""
from __future__ import annotations

import dataclasses
import os
import time

from transformer_jax.bench import common
from transformer_jax.data import default_data_config, get_data

SPLITS = ("train", "validation", "test")


@dataclasses.dataclass(frozen=True)
class DataOptions:
  datasets: tuple[str, ...] = ("numbers", "locale")     # data.dataset values
  batchings: tuple[str, ...] = ("pack", "bucket", "pad")  # data.batching values
  batch_size: int = 64                                  # rows per batch
  max_len: int = 64                                     # max source and target length
  seconds: float = 10.0                                 # timed seconds per point
  data_dir: str | None = None                           # TFDS data dir (None: TFDS's)
  workdir: str | None = None                            # where tokenizers are trained and kept

  def __post_init__(self):
    if not self.seconds > 0:
      raise ValueError(f"seconds={self.seconds}: must be > 0")
    if not self.datasets or not self.batchings:
      raise ValueError("datasets and batchings must each name at least one value")


def _measure(data, seconds: float) -> dict:
  """Batches and real tokens read in `seconds`, after one untimed batch."""
  it = iter(data.train_dataset())
  next(it)  # Warm-up: threads started, first window read.
  n = {"batches": 0, "source": 0, "target": 0, "capacity": 0}
  shapes = set()
  start = time.perf_counter()
  while time.perf_counter() - start < seconds:
    batch = next(it)
    n["batches"] += 1
    n["source"] += int((batch["inputs_segmentation"] > 0).sum())
    n["target"] += int((batch["targets_segmentation"] > 0).sum())
    n["capacity"] += batch["targets"].size
    shapes.add(tuple(batch["targets"].shape))
  n["elapsed"] = time.perf_counter() - start
  if hasattr(it, "close"):
    it.close()  # Stops grain's prefetch thread before the interpreter exits.
  n["shapes"] = sorted(list(x) for x in shapes)
  return n


def _point(dataset: str, batching: str, options: DataOptions) -> dict:
  c = default_data_config()
  c.dataset, c.batching = dataset, batching
  c.data_dir = options.data_dir
  c.batch_size = options.batch_size
  c.max_source_len = c.max_target_len = options.max_len
  workdir = os.path.join(options.workdir or common.default_workdir(), dataset)
  start = time.perf_counter()
  data = get_data(c, workdir)
  setup_s = time.perf_counter() - start
  n = _measure(data, options.seconds)
  elapsed = n["elapsed"]
  return {
      "dataset": dataset, "batching": batching,
      "sizes": {s: len(data.sources[s]) for s in SPLITS},
      "vocab_size": data.tokenizer.vocab_size, "setup_s": round(setup_s, 2),
      "batches_per_s": round(n["batches"] / elapsed, 1),
      "source_tokens_per_s": round(n["source"] / elapsed),
      "target_tokens_per_s": round(n["target"] / elapsed),
      "target_fill": round(n["target"] / max(1, n["capacity"]), 3),
      "batch_shapes": n["shapes"],
  }


def run(options: DataOptions = DataOptions()) -> dict:
  """Measure every (dataset, batching) pair; prints a table per pair and returns the figures
  with the settings, environment and load average."""
  load_start = common.load_average()
  points = []
  for dataset in options.datasets:
    for batching in options.batchings:
      p = _point(dataset, batching, options)
      points.append(p)
      common.print_table(
          f"input pipeline: {dataset}, {batching}, {options.batch_size} rows x "
          f"{options.max_len} tokens, {options.seconds:g} s timed", [
              ("pairs (train/valid/test)", "/".join(f"{n:,}" for n in p["sizes"].values())),
              ("vocabulary", f"{p['vocab_size']:,}"),
              ("setup (build, tokenizer)", f"{p['setup_s']:.2f} s"),
              ("batches/s", f"{p['batches_per_s']:,.1f}"),
              ("source tokens/s", f"{p['source_tokens_per_s']:,}"),
              ("target tokens/s", f"{p['target_tokens_per_s']:,}"),
              ("target fill", f"{p['target_fill']:.3f}"),
              ("batch shapes", ", ".join(f"{r} x {n}" for r, n in p["batch_shapes"])),
          ])
  return {"what": "data",
          "config": {"datasets": ",".join(options.datasets),
                     "batching": ",".join(options.batchings),
                     "batch_size": options.batch_size, "max_len": options.max_len,
                     "seconds": options.seconds, "data_dir": options.data_dir},
          **common.environment(), "load_average_start": load_start,
          "load_average_end": common.load_average(), "figures": points}
