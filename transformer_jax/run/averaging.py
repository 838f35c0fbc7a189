"""Checkpoint averaging, as the paper evaluates: the mean of the last N checkpoints' parameters
(5 for base, 20 for big).

Averaged parameters go into `<workdir>/averaged/<step>/` with the `{"state": {"params": ...}}`
layout of a training checkpoint, so `checkpointing.load_params` (and every tool) loads them like
any step; training never resumes from that directory.
"""
from __future__ import annotations

import os
from typing import Callable, Iterable

import jax
import numpy as np

from transformer_jax.run import checkpointing
from transformer_jax.run.workdir import AVERAGED, RunError, owning_run, train_hint


def average_params(trees: Iterable[tuple[str, object]]) -> object:
  """Elementwise mean of `(name, parameter tree)` pairs, in float32, cast back per leaf.

  Trees are consumed one at a time into a running float32 sum, so averaging the paper's 20
  checkpoints of transformer-big holds the sum and one checkpoint, not 20. Trees of another
  structure or shape are refused, naming both trees and the parameter.
  """
  treedef, count = None, 0
  for name, tree in trees:
    leaves, structure = jax.tree.flatten(tree)
    if treedef is None:
      treedef, first_name = structure, name
      paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(tree)]
      shapes = [np.shape(x) for x in leaves]
      dtypes = [np.asarray(x).dtype for x in leaves]
      total = [np.array(x, np.float32) for x in leaves]  # a copy, even of float32 leaves
    else:
      if structure != treedef:
        raise RunError(f"{name} and {first_name} have different parameter structures: they "
                       "are not checkpoints of one model")
      for path, shape, x in zip(paths, shapes, leaves):
        if np.shape(x) != shape:
          raise RunError(f"parameter {path} has shape {np.shape(x)} in {name} but {shape} in "
                         f"{first_name}: they are not checkpoints of one model")
      for t, x in zip(total, leaves):
        np.add(t, np.asarray(x, np.float32), out=t)
    count += 1
    del tree, leaves  # before the next one is loaded
  if treedef is None:
    raise ValueError("nothing to average")
  return jax.tree.unflatten(treedef, [(t / count).astype(d) for t, d in zip(total, dtypes)])


def average_checkpoints(workdir: str, last: int, output: str | None = None,
                        log: Callable[[str], None] = lambda m: None) -> tuple[str, int, list[int]]:
  """Average the parameters of the last `last` steps in `<workdir>/checkpoints` into `output`
  (default `<workdir>/averaged`), saved as step = the last averaged step. Returns (output
  directory, step, averaged steps)."""
  source = checkpointing.checkpoint_dir(workdir)
  if last < 1:
    raise RunError(f"--last {last}: must be >= 1")
  output = os.path.abspath(output or os.path.join(workdir, AVERAGED))
  _refuse_output(output, workdir, source)
  # A run that trains meanwhile deletes its oldest checkpoint as it saves a new one (keep-N):
  # a chosen step gone before it was read is chosen again from the steps there are then.
  deleted = 0
  while True:
    chosen = _choose(workdir, source, last, log)
    try:
      params = average_params(_trees(source, chosen, last, log))
      break
    except _Rotated as gone:
      deleted += 1
      if deleted > _ROTATION_RETRIES:
        raise RunError(
            f"checkpoint {gone.step} in {source} was deleted while the average read it, "
            f"{deleted} times: the run training there deletes its oldest checkpoint at each "
            f"save (keep_checkpoints). Average once it has stopped, or let it keep more "
            f"checkpoints than --last {last} (--config.keep_checkpoints)") from None
      log(f"step {gone.step} was deleted while it was read (the run training in {workdir} "
          f"keeps its last checkpoints only); choosing the last {last} again")
  step = chosen[-1]
  if step in checkpointing.checkpoint_steps(output):
    log(f"replacing the earlier average saved as step {step} in {output}")
  checkpointing.save_params(output, step, params,
                            {"averaged_steps": chosen, "source": source, "last": last})
  return output, step, chosen


def _refuse_output(output: str, workdir: str, source: str) -> None:
  """Refuse an output directory a run reads as its own: this run's checkpoints, a directory
  of any other run's (`owning_run`: its checkpoints/, averaged/, best_<metric>/ or eval/, which
  that run would resume from, evaluate or compare as its own), or a directory holding
  checkpoints that are not averages. The run's own `averaged/` is the default. Compared by
  realpath, so a link or `..` does not slip past."""
  real = os.path.realpath(output)
  if real == os.path.realpath(source):
    raise RunError(f"refusing to write the average into {source}: training resumes from there; "
                   "leave out --output (the average goes into <workdir>/averaged) or pass a "
                   "directory of its own")
  found = owning_run(real)
  if found and real != os.path.join(os.path.realpath(workdir), AVERAGED):
    run, name = found
    where = "" if real == os.path.join(run, name) else "inside "
    raise RunError(f"--output {output} is {where}the {name}/ directory of the run {run}, "
                   f"which that run reads as its own: the average would pass for one of its "
                   "models. Pass a directory outside every run's (e.g. runs/averages/<name>), "
                   "or leave out --output for <workdir>/averaged")
  trained = [s for s in checkpointing.checkpoint_steps(output)
             if averaged_steps(output, s) is None]
  if trained:
    raise RunError(f"--output {output} holds checkpoints that are not averages (step(s) "
                   f"{trained}): the average would be mixed in with them, and whoever reads "
                   "that directory would take it for one of them. Pass an empty or new "
                   "directory, or one that holds averages only")


def averaged_steps(checkpoint_dir: str, step: int) -> list[int] | None:
  """The steps an averaged checkpoint was made from (None for a training checkpoint)."""
  meta = checkpointing.load_meta(checkpoint_dir, step)
  return list(meta["averaged_steps"]) if meta and "averaged_steps" in meta else None


_ROTATION_RETRIES = 3


class _Rotated(Exception):
  """A chosen step was deleted (by the training run's keep-N rotation) before it was read."""

  def __init__(self, step: int):
    super().__init__(step)
    self.step = step


def _choose(workdir: str, source: str, last: int, log: Callable[[str], None]) -> list[int]:
  """The last `last` steps of `source` to average, evenly spaced ones first."""
  steps = checkpointing.checkpoint_steps(source)
  if not steps:
    raise RunError(f"no checkpoint in {source}: " + train_hint(workdir))
  # The paper averages checkpoints written at even intervals: a save forced by a signal (a
  # preemption) or by early stopping falls between them and is left out where enough others
  # are kept (checkpoints before 2026-11-25 say nothing: taken as on cadence). It took a kept
  # place, though, so after a late stop it may be needed: then it is averaged, and said.
  off = [s for s in steps if (checkpointing.load_meta(source, s) or {}).get("on_cadence") is False]
  if off and last <= len(steps) - len(off):
    log(f"leaving out step(s) {off}: saved off the checkpoint cadence where a signal or early "
        "stopping stopped the run, between the run's evenly spaced checkpoints")
    steps = [s for s in steps if s not in off]
  elif off and last <= len(steps):
    log(f"warning: averaging step(s) {[s for s in off if s in steps[-last:]]} too, saved off "
        "the cadence where a signal or early stopping stopped the run: only "
        f"{len(steps) - len(off)} evenly spaced checkpoint(s) are kept for --last {last}; the "
        "average spans fewer steps")
  if last > len(steps):
    raise RunError(f"--last {last}, but {source} holds only {len(steps)} checkpoint(s) "
                   f"(steps {steps}): pass --last {len(steps)} or fewer, or keep more while "
                   f"training (--config.keep_checkpoints={last}, with checkpoint_every_steps "
                   "setting their spacing)")
  return steps[-last:]


def _trees(source: str, chosen: list[int], last: int, log: Callable[[str], None]):
  """("step N", parameters) of each chosen step, loaded one at a time."""
  for i, s in enumerate(chosen):
    log(f"loading step {s}")
    try:
      params = checkpointing.load_params(source, s)[1]
    except Exception as e:
      if s not in checkpointing.checkpoint_steps(source):
        raise _Rotated(s) from e
      if isinstance(e, RunError) and not isinstance(e, checkpointing.DamagedCheckpoint):
        raise
      # A damaged step: load_params' advice (--step) is not the average's.
      reason = (e.reason if isinstance(e, checkpointing.DamagedCheckpoint)
                else checkpointing.error_line(e))
      later = len(chosen) - i - 1
      way_out = (f"average only the steps after it (--last {later})" if later else
                 "there is no later step to average")
      raise RunError(f"checkpoint {s} in {source} does not load, so it cannot be averaged "
                     f"({reason}): it is damaged; {way_out}, or train on until {last} good "
                     "checkpoints follow it") from e
    yield f"step {s}", params
