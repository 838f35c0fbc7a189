"""The best checkpoint by a validation metric: `config.keep_best`.

    c.keep_best = "bleu"          # or "eval_loss", "eval_accuracy"; "" = off (the default)

After every evaluation that reports the metric, the parameters are saved to
`<workdir>/best_<metric>/<step>/` when the value beats every earlier one of the run (ties keep
the earlier step; NaN never wins). Only that one step is kept there, in the layout of
`averaged/` (`state/params` and a `meta` item: step, metric, value), so the tools read it with
`--checkpoint <workdir>/best_bleu`. The rotation of `checkpoints/` (keep-N) never touches it.

Written with Orbax, synchronously, by every process (the parameters may be sharded across
hosts): the new step is complete before the old one is deleted, so a crash mid-save leaves the
previous best. On resume the best value so far is read back from the directory's `meta`.
The paper does not pick a best checkpoint (it averages the last ones, run/averaging.py); this
is for early-stopping studies and for runs that overfit a small corpus.
"""
from __future__ import annotations

import math
import os

from transformer_jax.experiment import BEST_METRICS
from transformer_jax.run import checkpointing, distributed


def improves(value: float | None, best: float | None, higher: bool,
             margin: float = 0.0) -> bool:
  """Whether `value` beats `best` (None: no best yet) by more than `margin`: strictly, so ties
  keep the earlier; NaN never does. The rule of keep_best (margin 0) and of early stopping's
  count (margin: config.early_stopping_min_delta) alike."""
  if value is None or math.isnan(value):
    return False
  return best is None or (value > best + margin if higher else value < best - margin)


def best_dir(workdir: str, metric: str) -> str:
  return os.path.join(os.path.abspath(workdir), f"best_{metric}")


class BestKeeper:
  """Keeps the parameters of the best evaluation of `metric` so far (see the module doc)."""

  def __init__(self, workdir: str, metric: str, put_back: bool = False):
    """`put_back` (training, which alone writes here and holds the workdir's lock): first puts
    back a best that a save killed part-way left set aside (`checkpointing.put_back_set_aside`),
    so that it counts; a reader (the sweep report) leaves the directory as it is."""
    if metric not in BEST_METRICS:
      raise ValueError(f"config.keep_best={metric!r}: expected '' (off) or one of "
                       f"{sorted(BEST_METRICS)}")
    self.metric, self.higher = metric, BEST_METRICS[metric]
    self.directory = best_dir(workdir, metric)
    self.step: int | None = None
    self.value: float | None = None
    if put_back:
      checkpointing.put_back_set_aside(self.directory)  # process 0's; the others wait for it
      distributed.sync("transformer_jax: the best checkpoint's directory made ready")
    for step in checkpointing.checkpoint_steps(self.directory):
      meta = checkpointing.load_meta(self.directory, step) or {}
      if "value" in meta and self.better(float(meta["value"])):
        self.step, self.value = step, float(meta["value"])

  def better(self, value: float) -> bool:
    return improves(value, self.value, self.higher)

  def offer(self, step: int, params, record: dict) -> bool:
    """Save `params` as the best if `record[metric]` beats the best so far (a collective: every
    process calls it with the same record); returns whether it did."""
    value = record.get(self.metric)
    if not distributed.from_main(value is not None and self.better(float(value))):
      return False
    meta = {"step": int(step), "metric": self.metric, "value": float(value)}
    try:
      checkpointing.save_params(self.directory, step, params, meta, keep_only=True)
    except Exception as e:  # noqa: BLE001 - storage failures are reported, the rest re-raised
      if not checkpointing.is_storage_failure(e):
        raise
      kept = (f"The best so far, step {self.step}, is untouched." if self.step is not None
              else "There was no best yet.")
      raise checkpointing.StorageError(
          f"saving step {step}'s parameters as the best {self.metric} into {self.directory} "
          f"failed: {str(e).strip().splitlines()[0][:300]}. {kept} The training checkpoints "
          "are not affected: free space (or drop --config.keep_best) and run the same command "
          "to resume.") from None
    self.step, self.value = int(step), float(value)
    return True
