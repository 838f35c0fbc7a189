"""What a researcher sees: a live progress bar, `metrics.jsonl` and TensorBoard event files.

Steps return sums (loss, nll, correct, tokens); `summarize` turns them into averages on the host,
so averages over several steps and devices are exact token-weighted means.
"""
from __future__ import annotations

import contextlib
import io
import json
import math
import os
import sys
import time

import numpy as np
from tqdm import tqdm

from transformer_jax.files import write_atomically

# The metrics a training run logs that a sweep report is most often sorted by (the trainer logs
# more: throughput, norms, learning rate); tests/test_train.py checks that a run logs them all.
MAIN_METRICS = ("bleu", "eval_loss", "eval_accuracy", "eval_nll", "eval_perplexity",
                "train_loss", "train_accuracy")


def summarize(sums: dict[str, float], prefix: str) -> dict[str, float]:
  tokens = max(float(sums["tokens"]), 1.0)
  nll = float(sums["nll"]) / tokens
  return {f"{prefix}_loss": float(sums["loss"]) / tokens,
          f"{prefix}_nll": nll,
          f"{prefix}_perplexity": math.exp(min(nll, 50.0)),
          f"{prefix}_accuracy": float(sums["correct"]) / tokens}


def accumulate(total: dict | None, new: dict) -> dict:
  new = {k: float(np.asarray(v)) for k, v in new.items()}
  if total is None:
    return new
  return {k: total.get(k, 0.0) + v for k, v in new.items()}


class MetricsWriter:
  """Appends JSON lines and TensorBoard scalars; only the first process writes."""

  def __init__(self, workdir: str, enabled: bool = True, tensorboard: bool = True,
               resume_step: int | None = None):
    """`resume_step`: the step training resumes from; records of later steps (written before a
    crash, and about to be written again) are removed from metrics.jsonl and TensorBoard."""
    self.enabled = enabled
    self.workdir = workdir
    self.path = os.path.join(workdir, "metrics.jsonl")
    self.tb = None
    if enabled and resume_step is not None:
      _truncate(workdir, resume_step)
    if enabled and tensorboard:
      from tensorboardX import SummaryWriter  # imported lazily: only the writer needs it
      # purge_step: TensorBoard hides the events of this step and later from earlier sessions.
      purge = resume_step + 1 if resume_step is not None else None
      self.tb = SummaryWriter(os.path.join(workdir, "tensorboard"), purge_step=purge)

  def write(self, step: int, values: dict):
    if not self.enabled:
      return
    record = {"step": int(step), "time": time.time(), **{k: _plain(v) for k, v in values.items()}}
    try:
      append_line(self.path, json.dumps(record))
    except OSError as e:
      raise self._failed(self.path, e) from None
    if self.tb is not None:
      try:
        for k, v in record.items():
          if k not in ("step", "time") and isinstance(v, (int, float)) and not isinstance(v, bool):
            self.tb.add_scalar(k, v, int(step))
        self.tb.flush()
      except OSError as e:
        tb, self.tb = self.tb, None
        raise self._tensorboard_failed(tb, e) from None

  def close(self):
    if self.tb is not None:
      tb, self.tb = self.tb, None
      try:
        tb.close()
      except OSError as e:
        raise self._tensorboard_failed(tb, e) from None

  def _tensorboard_failed(self, tb, error: OSError) -> Exception:
    _abandon(tb)
    return self._failed(tb.logdir, error)

  def _failed(self, path: str, error: OSError) -> Exception:
    """A failed write of the metrics (a full disk, say) as one StorageError: which file, why,
    and where the same command resumes from (the OSError of a write to an open file names no
    file)."""
    from transformer_jax.run import checkpointing  # here: the readers of metrics need no Orbax
    return checkpointing.StorageError(
        f"writing the run's metrics into {path} failed: {error.strerror or error}. What was "
        "written before stays readable (a line cut short is skipped, and a resume cuts "
        "metrics.jsonl and TensorBoard back to its step). "
        + checkpointing.resume_advice(os.path.join(self.workdir, "checkpoints")))


def _abandon(tb) -> None:
  """After a failed write of TensorBoard events: tensorboardX's exit handler would flush them
  again, and its writer thread would wait on a queue torn down at exit, each printing a
  traceback after the run's one message. So each writer's thread is stopped, its file closed
  (the unwritten events dropped: a resume cuts TensorBoard back to its step anyway) and the
  writer marked closed (tensorboardX's own fields, its version pinned in requirements.txt)."""
  for writer in (tb.all_writers or {}).values():  # None once a close has gone through
    events = writer.event_writer
    events._closed = True
    # Each may fail (a writer tensorboardX closed already has no thread), and neither matters.
    with contextlib.suppress(Exception):
      events._worker.stop()        # the events still queued go to the file's buffer
    with contextlib.suppress(Exception):
      events._ev_writer.close()    # its flush fails again; the file is closed all the same


def _plain(v):
  if isinstance(v, (np.generic, np.ndarray)):
    return v.item()
  return v


def _truncate(workdir: str, last_step: int) -> None:
  """Rewrite metrics.jsonl (atomically) without the records after `last_step` (they are run
  again) and without a last line cut short by a crash (the next record would be appended to
  it). Every other line stays as it was, a line no reader takes (`_record`: a note added by
  hand, other bytes) included: nothing a resume need not remove is lost."""
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return
  with open(path, "rb") as f:
    old = f.read()
  kept = []
  # Lines end at "\n" alone, as `read_metrics` reads them (bytes.splitlines would also end
  # one at a "\r" inside a line of other bytes, and drop its first part).
  for line in io.BytesIO(old).readlines():
    record = _record(line)
    if record is None and not line.endswith(b"\n"):
      continue
    if record is None or record["step"] <= last_step:
      kept.append(line if line.endswith(b"\n") else line + b"\n")
  new = b"".join(kept)
  if new == old:
    return
  write_atomically(path, new)


def append_line(path: str, line: str) -> None:
  """`line` appended to the JSON-lines file `path` in one write (writers side by side do not
  interleave), after a line break where the file's last line was cut short (a full disk, a
  power loss): glued onto that line, the new record would be unreadable too, and every reader
  skips such a line (`read_metrics`, the sweep report's reading of eval/results.jsonl)."""
  with open(path, "ab+") as f:
    cut_short = f.seek(0, os.SEEK_END) > 0 and not _ends_a_line(f)
    f.write(b"\n" * cut_short + line.encode("utf-8") + b"\n")


def _ends_a_line(f) -> bool:
  f.seek(-1, os.SEEK_END)
  return f.read(1) == b"\n"


FINAL_EVALUATION = ("eval_loss", "bleu")  # what a run's last step is evaluated with


def evaluated(workdir: str, step: int) -> bool:
  """Whether metrics.jsonl holds the final evaluation of `step`: its loss and its BLEU."""
  return not missing_evaluation(workdir, step)


def missing_evaluation(workdir: str, step: int) -> list[str]:
  """What of the final evaluation (`FINAL_EVALUATION`) metrics.jsonl lacks at `step`. Both may
  be in one record or in two: a step the cadence evaluated for one of them only (a run
  shortened on resume to end there) gets the other when it is made the last."""
  logged = {key for record in read_metrics(workdir) if record.get("step") == step
            for key in record}
  return [key for key in FINAL_EVALUATION if key not in logged]


def last_values(workdir: str) -> dict:
  """The last logged value of every numeric metric in `metrics.jsonl`, and the last step."""
  out: dict = {}
  for record in read_metrics(workdir):
    for k, v in record.items():
      if k != "time" and isinstance(v, (int, float)) and not isinstance(v, bool):
        out[k] = v
  return out


def read_metrics(workdir: str) -> list[dict]:
  """The records of `<workdir>/metrics.jsonl`, each with an integer "step" (`_record`): a line
  cut short by a crash is skipped, and so is any line training never writes, so every reader,
  training's resume included, can rely on `record["step"]`."""
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return []
  # Bytes, decoded line by line: one line of other bytes (a disk error, a hand edit) would end
  # the reading of the whole file with a UnicodeDecodeError.
  with open(path, "rb") as f:
    return [r for r in map(_record, f) if r is not None]


def _record(line: bytes) -> dict | None:
  """The record a line of metrics.jsonl holds, or None where it holds none: not UTF-8, not a
  JSON object, a "step" that is missing or no integer."""
  try:
    record = json.loads(line.decode("utf-8"))
  except ValueError:  # UnicodeDecodeError and JSONDecodeError alike
    return None
  step = record.get("step") if isinstance(record, dict) else None
  if isinstance(step, int) and not isinstance(step, bool):  # True is 1 to Python
    return record
  return None


class Progress:
  """A tqdm bar over training steps showing loss, learning rate, tokens/s, MFU and the ETA, and
  the run's messages above it. Not `enabled` (every process of a multi-process run but the
  first): neither, as every process would print the same lines (16 copies of each in one
  SLURM output file for 2 nodes of 8 tasks)."""

  def __init__(self, total: int, initial: int, enabled: bool = True):
    self.enabled = enabled
    self.bar = None
    if enabled:
      self.bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True,
                      file=sys.stderr, mininterval=1.0, smoothing=0.1)

  def update(self, step: int, info: dict | None = None):
    if self.bar is None:
      return
    # The postfix first: `update` redraws the bar, and a postfix set after it would show only at
    # the next redraw, next to the next interval's step count.
    if info:
      self.bar.set_postfix_str(
          f"loss {info['train_loss']:.3f} lr {info['learning_rate']:.2e} "
          f"tok/s {info['tokens_per_sec']:,.0f} MFU {100 * info['mfu']:.1f}%",
          refresh=False)
    self.bar.update(step - self.bar.n)

  def write(self, text: str):
    """A line above the bar, on stderr as the bar (tqdm's own default is stdout, which would
    split a run's messages over two streams by whether it has a bar)."""
    if self.enabled:
      self.bar.write(text, file=sys.stderr)

  def close(self):
    if self.bar is not None:
      self.bar.close()
