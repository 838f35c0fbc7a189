"""Training throughput and the health of the steps: the metrics of a window of steps, averaged.

The training loop hands every step's (device-side) metrics to `add` and asks for a record at log,
save and evaluation steps; only then are the metrics fetched, so the steps run asynchronously.
Time spent saving or evaluating is left out by `restart`. The first step of a process compiles:
a new run's is logged on its own without a throughput; a resumed process's joins the averages
of the window it falls in (`carry`), as in a run that never stopped, and only its time is left
out.
"""
from __future__ import annotations

import time

import jax
import numpy as np

from transformer_jax import flops
from transformer_jax.config import TransformerConfig
from transformer_jax.run import metrics as metrics_lib
from transformer_jax.run.workdir import RunError

SUMS = ("loss", "nll", "correct", "tokens", "source_tokens")
NORMS = ("grad_norm", "param_norm", "update_norm")


class NonFiniteLossError(RunError, FloatingPointError):
  """The run stopped at a non-finite loss or parameters: settings to change, which the message
  names, so a RunError (the scripts print one line) rather than a traceback."""


class ThroughputMeter:
  """Pending step metrics and the model FLOPs of the current window.

  `peak_flops` is the whole run's: on CPU the measured peak is the host's (fake devices share its
  cores), on accelerators the table's per-device peak times the devices.
  """

  def __init__(self, model_cfg: TransformerConfig, peak_flops: float, checkpoint_dir: str):
    self.model_cfg, self.peak_flops = model_cfg, peak_flops
    self.checkpoint_dir = checkpoint_dir
    self.pending: list = []
    self.carried: dict | None = None  # sums of steps that count in the averages, not the timing
    self.carried_last: dict | None = None  # the last carried step's metrics
    self.window_flops = 0.0
    self.window_start: float | None = None  # None until the compiling step is logged or carried

  @property
  def compiling(self) -> bool:
    return self.window_start is None

  def add(self, step_metrics, source_lengths, target_lengths) -> None:
    """One step's metrics; the lengths are this process's sentences (for the FLOPs), and other
    processes read equally sized shards."""
    self.pending.append(step_metrics)
    if not self.compiling:
      self.window_flops += (flops.train_flops(self.model_cfg, source_lengths, target_lengths)
                            * jax.process_count())

  def restart(self) -> None:
    """Start a new timing window now (after saving or evaluating, which are not training)."""
    self.window_start = time.perf_counter()

  def _fetch(self, step: int) -> tuple[dict | None, dict | None, int]:
    """The pending steps' sums, the last one's metrics and their number (None, None, 0 if none
    is pending), stopping on a non-finite loss; nothing stays pending."""
    if not self.pending:
      return None, None, 0
    host = jax.device_get(self.pending)
    total = None
    for m in host:
      # The loss is computed before the update, the norms after it: an update that makes the
      # parameters inf/NaN shows in param_norm before any loss does.
      if not all(np.isfinite(m[k]) for k in ("loss",) + NORMS):
        raise NonFiniteLossError(
            f"non-finite training loss or parameters at step {step}: stopping without saving; "
            f"the last good checkpoint in {self.checkpoint_dir} is untouched. Lower "
            "config.learning_rate, raise config.warmup_steps or set config.grad_clip_norm.")
      total = metrics_lib.accumulate(total, {k: m[k] for k in SUMS})
    self.pending = []
    return total, host[-1], len(host)

  def carry(self, step: int) -> None:
    """A resumed process's compiling first step: its metrics count in the next record's
    averages (the window a run that never stopped logs them in), not in its throughput; the
    timing window opens now."""
    total, last, _ = self._fetch(step)
    if total is not None:
      self.carried = metrics_lib.accumulate(self.carried, total)
      self.carried_last = last
    self.window_flops = 0.0
    self.restart()

  def record(self, step: int) -> dict:
    """Fetch the pending metrics, stop on a non-finite loss, return their averages (with any
    carried step's) and the window's throughput ({} when nothing is pending or carried)."""
    carried, self.carried = self.carried, None
    timed, last, steps = self._fetch(step)
    if timed is None and carried is None:
      return {}
    total = metrics_lib.accumulate(carried, timed) if timed is not None else carried
    record = metrics_lib.summarize(total, "train")
    last = last if last is not None else self.carried_last
    record.update({k: float(last[k]) for k in ("learning_rate",) + NORMS})
    if self.compiling or timed is None:  # a compiling step has no meaningful throughput
      record.update(tokens_per_sec=None, includes_compilation=True)
    else:
      elapsed = time.perf_counter() - self.window_start
      # Real (non-pad) tokens of the global batch, counted by the step itself; timed steps only.
      record["tokens_per_sec"] = timed["tokens"] / elapsed
      record["source_target_tokens_per_sec"] = (timed["tokens"] + timed["source_tokens"]) / elapsed
      record["steps_per_sec"] = steps / elapsed
      record["tflops_per_sec"] = self.window_flops / elapsed / 1e12
      record["mfu"] = self.window_flops / elapsed / self.peak_flops
    self.window_flops = 0.0
    self.restart()
    return record
