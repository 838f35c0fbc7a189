"""Early stopping: `config.early_stopping_patience`, on `config.keep_best`'s metric.

    c.keep_best = "bleu"               # the metric, and where the best parameters are kept
    c.early_stopping_patience = 5      # stop after 5 evaluations of it without a new best
    c.early_stopping_min_delta = 0.1   # optional: a new best must beat the count's by > 0.1

After every evaluation that reports the metric, the run counts the evaluations since the best
one so far (a new best resets the count; ties and NaN are no new best, as for keep_best). When
the count reaches the patience before `num_train_steps`, that step is saved, a record
`{"stopped_early": ...}` goes to metrics.jsonl and the run ends: finished, as a run that
reached `num_train_steps` is (run again, it does nothing; a sweep counts the point done). Its
best parameters are in `<workdir>/best_<metric>/`.

With `early_stopping_min_delta` D > 0 (in the metric's units: BLEU points, nats of eval_loss),
an evaluation resets the count only when it beats the count's best by more than D, and only
then becomes the count's best (as Keras' and PyTorch Lightning's `min_delta`): a validation
loss creeping down by 0.001 an evaluation no longer keeps a run going for ever. keep_best
still saves every new best, however small the gain.

The count is derived from metrics.jsonl, the records up to the step a run resumes from, and
not kept anywhere else: a run resumed after a crash or a preemption stops where an
uninterrupted one stops, and a resume with a larger patience (`configs/resume.py:W
--config.early_stopping_patience=N`, or 0 for none, with a min_delta back to 0) trains on.
The paper trains for a fixed number of steps (0, off, is the default); this is for small
corpora that overfit and for sweeps that should not spend the rest of a point's steps on a run
that stopped improving.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Iterable

from transformer_jax.experiment import BEST_METRICS
from transformer_jax.run import checkpointing
from transformer_jax.run import metrics as metrics_lib
from transformer_jax.run.best import improves

RECORD = "stopped_early"  # the metrics.jsonl field of the record written when a run stops


@dataclasses.dataclass
class Patience:
  """The evaluations of `metric` since its best so far, against `patience` (> 0)."""

  metric: str
  patience: int
  min_delta: float = 0.0
  best_step: int | None = None
  best_value: float | None = None
  since_best: int = 0
  # The largest gain on the count's best since it was set, too small for min_delta (0: none):
  # a min_delta below it would have counted that evaluation as a new best.
  gain_since_best: float = 0.0

  def offer(self, step: int, record: dict) -> None:
    """Count `record`, one evaluation's, if it reports the metric."""
    value = record.get(self.metric)
    if value is None:
      return
    value = float(value)
    higher = BEST_METRICS[self.metric]
    if improves(value, self.best_value, higher, self.min_delta):
      self.best_step, self.best_value, self.since_best = int(step), value, 0
      self.gain_since_best = 0.0
    else:
      self.since_best += 1
      if improves(value, self.best_value, higher):
        gain = value - self.best_value if higher else self.best_value - value
        self.gain_since_best = max(self.gain_since_best, gain)

  @property
  def exhausted(self) -> bool:
    return self.since_best >= self.patience

  def reason(self) -> str:
    settings = f"early_stopping_patience={self.patience}"
    if self.best_step is None:
      return (f"{self.since_best} evaluation(s) of {self.metric} without a new best (no finite "
              f"value yet; {settings})")
    if not self.min_delta:
      return (f"{self.since_best} evaluation(s) of {self.metric} without a new best (the best, "
              f"{self.best_value:.4f}, at step {self.best_step}; {settings})")
    return (f"{self.since_best} evaluation(s) of {self.metric} without beating "
            f"{self.best_value:.4f} (step {self.best_step}'s) by more than {self.min_delta:g} "
            f"({settings}, early_stopping_min_delta={self.min_delta:g})")


def from_records(metric: str, patience: int, records: Iterable[dict],
                 last_step: int, min_delta: float = 0.0) -> Patience:
  """The count after the evaluations in `records` (metrics.jsonl's) up to `last_step`."""
  state = Patience(metric, patience, float(min_delta))
  for step, record in _evaluations(metric, records):
    if step <= last_step:
      state.offer(step, record)
  return state


def _evaluations(metric: str, records: Iterable[dict]) -> list[tuple[int, dict]]:
  """(step, record) of each evaluation of `metric` in `records`, one a step: a step logged
  twice (runs before 2026-12-06 could log a final evaluation again on a shortened resume) is
  one evaluation, not an evaluation without a new best."""
  by_step: dict[int, dict] = {}
  for record in records:
    if "step" in record and metric in record:
      by_step[int(record["step"])] = record
  return list(by_step.items())


def replay(metric: str, patience: int, records: Iterable[dict],
           min_delta: float = 0.0) -> tuple[int | None, Patience]:
  """Where a run whose metrics.jsonl holds `records` would have stopped with this patience and
  min_delta: the step of the evaluation that used the patience up (None: none did), and the
  count then (or after the last record). The loop's rule, so a run's own settings give back
  its own stop; a stop at the run's last step is where it ended anyway."""
  state = Patience(metric, patience, float(min_delta))
  for step, record in _evaluations(metric, records):
    state.offer(step, record)
    if state.exhausted:
      return step, state
  return None, state


def stop_record(workdir: str) -> dict | None:
  """The `stopped_early` record (metric, patience, min_delta, evaluations_since_best, best_step,
  best_value, and its `step`) if the run in `workdir` stopped early, else None: the record must
  be of the latest checkpoint's step, with no record of a later step after it (a run resumed
  with a larger patience logs its next step at once, before its next checkpoint)."""
  steps = checkpointing.checkpoint_steps(os.path.join(workdir, "checkpoints"))
  records = [r for r in metrics_lib.read_metrics(workdir) if "step" in r]
  stops = [i for i, r in enumerate(records) if isinstance(r.get(RECORD), dict)]
  if not steps or not stops:
    return None
  step = int(records[stops[-1]]["step"])
  if step != max(steps) or any(int(r["step"]) > step for r in records[stops[-1]:]):
    return None
  return {**records[stops[-1]][RECORD], "step": step}


def stopped_at(workdir: str) -> int | None:
  """The step at which the run in `workdir` stopped early, or None (`stop_record`)."""
  record = stop_record(workdir)
  return None if record is None else record["step"]
