"""What every benchmark reports beside its figures: the environment, the load average, the peak
memory (reset per run where the platform allows), the config; the printed table; batches of
random tokens in the batch schema; and `BenchError`, options a benchmark cannot run with."""
from __future__ import annotations

import json
import os
import re
import resource
import tempfile

import flax
import jax
import numpy as np

from transformer_jax import batch as batch_lib
from transformer_jax.data.config import global_rows

# The first id after the special ones (padding, <unk>, BOS, EOS: transformer_jax/data/tokenizer.py).
FIRST_TOKEN = 4


def default_workdir() -> str:
  """Where datasets' tokenizers are trained and kept when no workdir is given."""
  return os.path.join(tempfile.gettempdir(), "transformer_jax_bench")


def environment(model_cfg=None) -> dict:
  device = jax.devices()[0]
  out = {"device_kind": device.device_kind, "platform": device.platform,
         "num_devices": jax.device_count(), "jax_version": jax.__version__,
         "flax_version": flax.__version__, "cpu_count": os.cpu_count(),
         "xla_flags": os.environ.get("XLA_FLAGS", ""),
         # How host memory is paged (scripts/_host_memory.py sets the tunable).
         "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
         "transparent_hugepages": huge_pages_mode()}
  if model_cfg is not None:
    out.update(dtype=model_cfg.dtype, param_dtype=model_cfg.param_dtype)
  return out


def huge_pages_mode(path: str = "/sys/kernel/mm/transparent_hugepage/enabled") -> str | None:
  """The kernel's transparent huge page mode ("always", "madvise", "never"), None if unknown:
  what `glibc.malloc.hugetlb=1` can ask for. (scripts/_host_memory.py reads the same file for
  "[never]" alone: it runs before the package may be imported, so it cannot call this.)"""
  try:
    with open(path) as f:
      text = f.read()
  except OSError:
    return None
  chosen = re.search(r"\[(\w+)\]", text)  # the mode in use is the bracketed one
  return chosen.group(1) if chosen else None


def host_paging() -> str:
  """One line for a benchmark's table: GLIBC_TUNABLES and the huge page mode."""
  tunables = os.environ.get("GLIBC_TUNABLES") or "glibc's defaults (no GLIBC_TUNABLES)"
  return f"{tunables}; transparent huge pages: {huge_pages_mode() or 'unknown'}"


def load_average() -> list[float]:
  return [round(x, 2) for x in os.getloadavg()]


class BenchError(ValueError):
  """Options a benchmark cannot run with (the message names the flag and what to pass);
  scripts/benchmark.py prints it as `error: ...`."""


# Linux: writing "5" here resets the process's peak RSS (VmHWM in /proc/self/status) to its
# current RSS (proc(5), clear_refs).
CLEAR_REFS, STATUS = "/proc/self/clear_refs", "/proc/self/status"


def reset_peak_memory() -> bool:
  """Start the process's peak RSS anew (Linux, CPU), so that `peak_memory(True)` is what ran
  since: a curve's point after a bigger one would report the bigger one's peak otherwise.
  False where it cannot: no writable clear_refs or no VmHWM, or an accelerator, whose
  allocator peak (`memory_stats()["peak_bytes_in_use"]`) jax offers no way to reset."""
  stats = jax.devices()[0].memory_stats() or {}
  if "peak_bytes_in_use" in stats:
    return False
  try:
    with open(CLEAR_REFS, "w") as f:
      f.write("5")
  except OSError:
    return False
  return _vm_hwm() is not None


def _vm_hwm() -> int | None:
  """The process's peak RSS in bytes from /proc/self/status (VmHWM, in kB), None without it."""
  try:
    with open(STATUS) as f:
      for status_line in f:
        if status_line.startswith("VmHWM:"):
          return int(status_line.split()[1]) * 1024
  except (OSError, ValueError, IndexError):
    pass
  return None


def peak_memory(since_reset: bool = False) -> tuple[int | None, str]:
  """(bytes, what they are): the device allocator's peak, or the process's peak RSS on CPU;
  the peak since `reset_peak_memory` where it returned True (`since_reset`), else the
  process's so far (the compiler, Python and earlier runs included)."""
  stats = jax.devices()[0].memory_stats() or {}
  if "peak_bytes_in_use" in stats:
    return int(stats["peak_bytes_in_use"]), "device peak_bytes_in_use, the process's so far"
  hwm = _vm_hwm()
  if hwm is not None and since_reset:
    return hwm, "peak RSS of this run (CPU)"
  if hwm is not None:
    return hwm, "process peak RSS so far (CPU)"
  # ru_maxrss is in KiB on Linux.
  return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
          "process peak RSS so far (CPU)")


def print_table(title: str, rows: list[tuple[str, str]]) -> None:
  width = max(len(k) for k, _ in rows)
  print(f"\n{title}")
  print("-" * (width + 24))
  for k, v in rows:
    print(f"{k:<{width}}  {v}")
  print("-" * (width + 24), flush=True)


def config_json(config) -> dict:
  return json.loads(config.to_json_best_effort())


def synthetic_batches(config, vocab_size: int, count: int, seed: int = 0) -> list[dict]:
  """Rows full of random real tokens (`random_tokens`): no padding, so every position counts.

  Unpacked rows, so only the schema's required keys (`batch.REQUIRED`)."""
  rng = np.random.default_rng(seed)
  d = config.data
  rows = global_rows(d)  # as training's: data.batch_size, or data.batch_tokens' rows
  shapes = {"inputs": (rows, d.max_source_len), "targets": (rows, d.max_target_len)}
  return [{k: random_tokens(rng, vocab_size, shapes[k]) for k in batch_lib.REQUIRED}
          for _ in range(count)]


def random_tokens(rng: np.random.Generator, vocab_size: int, shape) -> np.ndarray:
  """int32 ids drawn uniformly from FIRST_TOKEN.. vocab_size - 1: real tokens, none special."""
  return rng.integers(FIRST_TOKEN, vocab_size, shape).astype(np.int32)
