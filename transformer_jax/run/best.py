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
import shutil

import orbax.checkpoint as ocp

from transformer_jax.experiment import BEST_METRICS
from transformer_jax.run import checkpointing, distributed


def best_dir(workdir: str, metric: str) -> str:
  return os.path.join(os.path.abspath(workdir), f"best_{metric}")


def _options() -> ocp.CheckpointManagerOptions:
  # No max_to_keep: Orbax would keep the highest step, and after a resume from an earlier
  # checkpoint the new best can be a lower step than the old one. The old is deleted by hand.
  return ocp.CheckpointManagerOptions(create=True, enable_async_checkpointing=False)


class BestKeeper:
  """Keeps the parameters of the best evaluation of `metric` so far (see the module doc)."""

  def __init__(self, workdir: str, metric: str):
    if metric not in BEST_METRICS:
      raise ValueError(f"config.keep_best={metric!r}: expected '' (off) or one of "
                       f"{sorted(BEST_METRICS)}")
    self.metric, self.higher = metric, BEST_METRICS[metric]
    self.directory = best_dir(workdir, metric)
    self.step: int | None = None
    self.value: float | None = None
    for step in checkpointing.checkpoint_steps(self.directory):
      meta = checkpointing.load_meta(self.directory, step) or {}
      if "value" in meta and self.better(float(meta["value"])):
        self.step, self.value = step, float(meta["value"])

  def better(self, value: float) -> bool:
    if value is None or math.isnan(value):
      return False
    if self.value is None:
      return True
    return value > self.value if self.higher else value < self.value

  def offer(self, step: int, params, record: dict) -> bool:
    """Save `params` as the best if `record[metric]` beats the best so far (a collective: every
    process calls it with the same record); returns whether it did."""
    value = record.get(self.metric)
    if not distributed.from_main(value is not None and self.better(float(value))):
      return False
    meta = {"step": int(step), "metric": self.metric, "value": float(value)}
    # The same step again (a resume from before it): its old save is set aside, not deleted,
    # until the new one is complete, and put back if the new one fails.
    here = os.path.join(self.directory, str(step))
    aside = f"{here}.replaced"
    if step in checkpointing.checkpoint_steps(self.directory):
      if distributed.is_main():
        os.replace(here, aside)
      distributed.sync("transformer_jax: the best's old save of this step set aside")
    try:
      with ocp.CheckpointManager(self.directory, options=_options()) as mgr:
        mgr.save(int(step), args=ocp.args.Composite(
            state=ocp.args.StandardSave({"params": params}), meta=ocp.args.JsonSave(meta)),
            force=True)
        mgr.wait_until_finished()
        for old in mgr.all_steps():  # only once the new one is complete
          if old != step:
            mgr.delete(old)
    except Exception as e:  # noqa: BLE001 - storage failures are reported, the rest re-raised
      if distributed.is_main() and os.path.isdir(self.directory):
        for name in os.listdir(self.directory):  # the half-written step
          if ".orbax-checkpoint-tmp" in name:
            shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)
        if os.path.isdir(aside) and not os.path.isdir(here):
          os.replace(aside, here)
      if not checkpointing.is_storage_failure(e):
        raise
      kept = (f"The best so far, step {self.step}, is untouched." if self.step is not None
              else "There was no best yet.")
      raise checkpointing.StorageError(
          f"saving step {step}'s parameters as the best {self.metric} into {self.directory} "
          f"failed: {str(e).strip().splitlines()[0][:300]}. {kept} The training checkpoints "
          "are not affected: free space (or drop --config.keep_best) and run the same command "
          "to resume.") from None
    if distributed.is_main() and os.path.isdir(aside):
      shutil.rmtree(aside, ignore_errors=True)
    self.step, self.value = int(step), float(value)
    return True
