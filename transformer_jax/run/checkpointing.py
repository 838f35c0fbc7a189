"""Orbax checkpoints of the train state, the data iterator state and run metadata.

One `CheckpointManager` under `<workdir>/checkpoints`, async saves, keep the last N (and every
K-th step if asked). Orbax writes each step into a temporary directory and renames it when
complete, so a half-written step is never listed; a step whose files are damaged fails to
restore, and we then fall back to the previous step with a warning, never to a fresh start.
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import shlex
import shutil
import sys
import time
from typing import Any

import jax
from jax.experimental import multihost_utils
import numpy as np
import orbax.checkpoint as ocp

from transformer_jax.experiment import BEST_METRICS
from transformer_jax.run.workdir import AVERAGED, CHECKPOINTS, CheckpointError, RunError, train_hint

log = logging.getLogger(__name__)


# What a failed write says, wherever it comes from (Python's OSError texts, TensorStore's and
# Orbax's status codes).
OS_FAILURES = ("No space left on device", "Disk quota exceeded", "Permission denied",
               "Read-only file system", "Input/output error", "File too large")
# TensorStore's status codes, counted only for a failed write: RESOURCE_EXHAUSTED alone is also
# XLA's words for a device out of memory, which is not a storage failure.
STATUS_FAILURES = ("RESOURCE_EXHAUSTED", "PERMISSION_DENIED", "DATA_LOSS")
_TMP_DIR = ".orbax-checkpoint-tmp"   # Orbax's suffix of a step still being written
_TMP_STEP = re.compile(r"/(\d+)" + re.escape(_TMP_DIR))


class StorageError(CheckpointError):
  """A checkpoint could not be written (disk full, permissions, I/O error)."""


def is_storage_failure(error: BaseException | str) -> bool:
  text = str(error)
  return (isinstance(error, OSError) or any(m in text for m in OS_FAILURES)
          or (any(m in text for m in STATUS_FAILURES) and "writ" in text.lower()))


class _QuietStorageErrors(logging.Filter):
  """Orbax logs a failed asynchronous save from each of its threads, with tracebacks, before the
  failure reaches the training loop; the loop reports it once (StorageError), so these records
  are dropped. Other records pass."""

  def __init__(self):
    super().__init__()
    self.after_failure = False   # set once the failure was reported and its step removed

  def filter(self, record: logging.LogRecord) -> bool:
    if record.levelno < logging.ERROR:
      return True
    text = record.getMessage() + (logging.Formatter().formatException(record.exc_info)
                                  if record.exc_info else "")
    # asyncio's "Task (or Future) exception was never retrieved" carries Orbax's write tasks.
    if "orbax" in record.pathname + text and is_storage_failure(text):
      return False
    # Writes still in flight when the clean-up removed the failed step's temporary directory
    # fail with NOT_FOUND (CI, 2026-11-27: one asyncio record per array, with tracebacks):
    # echoes of the failure already reported, about a directory that is gone on purpose.
    return not (self.after_failure and _TMP_DIR in text)


# The loggers Orbax's failed writes reach: its own (absl) and asyncio's, for the write tasks
# that were still running when the first one failed.
_QUIETED_LOGGERS = ("absl", "asyncio")


def _closed_loop_noise(exc_type, exc) -> bool:
  return exc_type is RuntimeError and str(exc) == "Event loop is closed"


_closed_loop_quieted = False


def _quiet_closed_loop():
  """After a failed asynchronous save, TensorStore still completes the writes that were in flight
  and hands each result to Orbax's event loop, which the failure closed: every one prints a
  traceback ("Event loop is closed") from a TensorStore thread, before the failure reaches the
  training loop (at the next save or wait), which reports it once as StorageError. So these are
  dropped from the start, once per process; any other exception prints as before."""
  global _closed_loop_quieted
  if _closed_loop_quieted:
    return
  _closed_loop_quieted = True
  excepthook, unraisablehook = sys.excepthook, sys.unraisablehook

  def quiet_excepthook(exc_type, exc, tb):
    if not _closed_loop_noise(exc_type, exc):
      excepthook(exc_type, exc, tb)

  def quiet_unraisablehook(unraisable):
    if not _closed_loop_noise(unraisable.exc_type, unraisable.exc_value):
      unraisablehook(unraisable)

  sys.excepthook, sys.unraisablehook = quiet_excepthook, quiet_unraisablehook


def directory_bytes(path: str) -> int:
  total = 0
  for root, _, files in os.walk(path):
    for name in files:
      try:
        total += os.path.getsize(os.path.join(root, name))
      except OSError:
        pass
  return total


def tree_bytes(tree) -> int:
  return int(sum(np.prod(x.shape) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree)))


def _mib(n: int) -> str:
  return f"{n / 2**20:.1f} MiB"


def checkpoint_dir(workdir: str) -> str:
  return os.path.join(os.path.abspath(workdir), CHECKPOINTS)


def param_shapes(tree) -> dict[str, tuple]:
  """{"encoder/layer_0/.../kernel": shape} of a parameter tree (arrays, ShapeDtypeStructs or
  the checkpoint metadata's leaves), in its order."""
  return {"/".join(str(getattr(k, "key", k)) for k in path): tuple(leaf.shape)
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def shape_difference(there: dict[str, tuple], here: dict[str, tuple]) -> str | None:
  """The first parameter (`param_shapes` paths) whose shape differs between the parameters
  `there` and the model `here`, as "<path> has shape X there but Y in the model"; None if
  they agree."""
  for path in [*here, *(p for p in there if p not in here)]:
    if here.get(path) != there.get(path):
      return (f"{path} has shape {there.get(path, 'none (missing)')} there but "
              f"{here.get(path, 'none (no such parameter)')} in the model")
  return None


def abstract_like(tree, shardings=None):
  """ShapeDtypeStructs (with target shardings) to restore into."""
  if shardings is None:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree,
                      shardings)


class Checkpointer:
  """Saves and restores `{state, data, meta}` per step.

  A save that cannot be written (disk full, permissions, I/O error; with async saves this shows
  at the next save or at `wait`/`close`) raises one `StorageError` naming the step, the bytes a
  checkpoint takes, the free space and the last good step; the half-written step directory is
  removed, and the earlier checkpoints stay loadable.
  """

  def __init__(self, workdir: str, max_to_keep: int = 3, keep_period: int | None = None,
               async_save: bool = True):
    self.directory = checkpoint_dir(workdir)
    options = ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep, keep_period=keep_period or None,
        enable_async_checkpointing=async_save, create=True)
    self.manager = ocp.CheckpointManager(self.directory, options=options)
    self.max_to_keep, self.keep_period = max_to_keep, keep_period or None
    self.async_save = async_save
    self.restored_step: int | None = None   # the step restore_latest resumed from
    self.failed = False
    self._last_requested: int | None = None
    self._state_bytes = 0
    self._quiet = _QuietStorageErrors()
    for name in _QUIETED_LOGGERS:
      logging.getLogger(name).addFilter(self._quiet)
    _quiet_closed_loop()

  def all_steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def save(self, step: int, state, data_state: dict | None = None, meta: dict | None = None,
           force: bool = False) -> bool:
    args = ocp.args.Composite(state=ocp.args.StandardSave(state),
                              data=ocp.args.JsonSave(data_state or {}),
                              meta=ocp.args.JsonSave(meta or {}))
    self._state_bytes = self._state_bytes or tree_bytes(state)
    # An asynchronous save that failed in the background raises here, at the next save: an
    # error that names no step path is then blamed on the save before (a synchronous save's
    # error is its own).
    previous, self._last_requested = self._last_requested, int(step)
    try:
      return self.manager.save(int(step), args=args, force=force)
    except Exception as e:  # noqa: BLE001 - storage failures are reported, the rest re-raised
      blamed = previous if self.async_save and previous is not None else int(step)
      self._storage_failure(e, blamed)

  def checkpoint_bytes(self, state_shapes=None) -> int:
    """What one checkpoint takes: the newest on disk, else the state's array bytes."""
    steps = checkpoint_steps(self.directory)
    if steps:
      return directory_bytes(os.path.join(self.directory, str(steps[-1])))
    return self._state_bytes or (tree_bytes(state_shapes) if state_shapes is not None else 0)

  def space_warning(self, keep: int, state_shapes) -> str | None:
    """A warning when the free space cannot hold `keep + 1` checkpoints (a new one is written
    before the oldest is deleted)."""
    needs = self.checkpoint_bytes(state_shapes) * (keep + 1)
    free = shutil.disk_usage(self.directory).free
    if free >= needs:
      return None
    return (f"{self.directory} has {_mib(free)} free, less than the {_mib(needs)} that "
            f"{keep + 1} checkpoints of this run take (keep_checkpoints={keep}, plus the one "
            "being written): a save will fail when the disk is full; free space or lower "
            "--config.keep_checkpoints")

  def prune(self) -> list[int]:
    """Delete the oldest steps beyond `max_to_keep` now; returns them. Orbax deletes them only
    after the next save is complete, so a run resumed with a lower keep_checkpoints on a full
    disk needed room for all the old steps plus the new one. Called when a session starts,
    before it writes anything: the step resumed from, the newest `max_to_keep` and every
    `keep_period`-th step stay. (Orbax deletes on its primary process and syncs the others.)"""
    steps = self.all_steps()
    kept = set(steps[-self.max_to_keep:]) if self.max_to_keep else set(steps)
    kept |= {s for s in steps if self.keep_period and s % self.keep_period == 0}
    kept |= {self.restored_step} - {None}
    doomed = [s for s in steps if s not in kept]
    for step in doomed:
      self.manager.delete(step)
    return doomed

  def _storage_failure(self, error: Exception, step: int):
    """Raise StorageError for a failed write (after removing the half-written step), or re-raise
    anything else."""
    if not is_storage_failure(error):
      raise error
    self.failed = self._quiet.after_failure = True
    match = _TMP_STEP.search(str(error))
    step = int(match.group(1)) if match else step
    remove_partial_steps(self.directory)
    free = shutil.disk_usage(self.directory).free
    # The operating system's words first: TensorStore's messages bury them after long paths.
    text = str(error).strip()
    cause = next((m for m in OS_FAILURES if m in text), None)
    first_line = text.splitlines()[0] if text else repr(error)
    reason = f"{cause} ({first_line[:200]}...)" if cause else first_line[:400]
    resume = resume_advice(self.directory)
    raise StorageError(
        f"saving checkpoint {step} into {self.directory} failed: {reason}. A checkpoint of "
        f"this run takes about {_mib(self.checkpoint_bytes())}; {_mib(free)} are free there. "
        f"The half-written step was removed. {resume}") from None

  def restore(self, step: int, abstract_state) -> tuple[Any, dict, dict]:
    args = ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state),
                              data=ocp.args.JsonRestore(), meta=ocp.args.JsonRestore())
    out = self.manager.restore(int(step), args=args)
    return out["state"], dict(out["data"] or {}), dict(out["meta"] or {})

  def restore_latest(self, abstract_state) -> tuple[int, Any, dict, dict] | None:
    """The newest step that restores; older ones are tried, with a warning, if it is damaged.

    Returns None when there is no checkpoint at all; raises CheckpointError when there are
    checkpoints but none restores (a run must not silently start again from scratch).
    """
    steps = self.all_steps()
    if not steps:
      return None
    errors, kinds = [], set()
    for step in reversed(steps):
      try:
        state, data, meta = self.restore(step, abstract_state)
      except Exception as e:  # noqa: BLE001 - any failure to read means "damaged"...
        changed = self._other_model(step, abstract_state)
        if changed:  # ...unless the checkpoint is whole and holds another model
          raise CheckpointError(
              f"the checkpoints in {self.directory} hold another model than the one this code "
              f"builds from the run's config.json: {changed}. They are intact (nothing was "
              "moved): the model code changed since they were written (a parameter added, "
              "renamed or reshaped). Resume with the code that trained the run; a new model "
              "field must default to the old behaviour, or have a LEGACY_VALUES entry "
              "(transformer_jax/run/workdir.py; docs/model.md, \"Adding a model option\")."
              ) from None
        msg = f"step {step}: {error_line(e)}"
        log.warning("checkpoint %s/%d does not restore (%s); trying the previous one",
                    self.directory, step, msg)
        errors.append(msg)
        kinds.add(type(e).__name__)
      else:
        if errors:
          log.warning("restored step %d after skipping damaged checkpoint(s): %s", step,
                      "; ".join(errors))
          self._set_aside([t for t in steps if t > step])
        self.restored_step = step
        return step, state, data, meta
    alike = len(steps) > 1 and len(kinds) == 1
    raise CheckpointError(
        f"none of the checkpoints {steps} in {self.directory} could be restored:\n  "
        + "\n  ".join(errors)
        # Damage seldom strikes every step alike; a change in the code that reads them does.
        + ("\nThey all fail alike: if the code changed since they were written (the optimizer "
           "or its state, the train state), resume with the code that wrote them before moving "
           "anything." if alike else "")
        + "\nMove the directory aside to start from scratch, or point --workdir at another "
        "run.")

  def _other_model(self, step: int, abstract_state) -> str | None:
    """How the parameters `step` holds differ from `abstract_state`'s (`shape_difference`), read
    from the checkpoint's metadata; None when they agree, or when the metadata itself does not
    read (a damaged step)."""
    try:
      metadata = self.manager.item_metadata(step)["state"]
      saved = getattr(metadata, "tree", metadata)["params"]
      return shape_difference(param_shapes(saved), param_shapes(abstract_state.params))
    except Exception:  # noqa: BLE001 - unreadable metadata: a damaged step, as before
      return None

  def _set_aside(self, damaged: list[int]):
    """Rename damaged steps to `<step>.damaged` (kept for inspection, no longer listed), so the
    resumed run can save those step numbers again and keep-N counts only good checkpoints."""
    if jax.process_index() == 0:
      for step in damaged:
        path = os.path.join(self.directory, str(step))
        target = f"{path}.damaged"
        suffix = 1
        while os.path.exists(target):
          target, suffix = f"{path}.damaged{suffix}", suffix + 1
        os.rename(path, target)
        log.warning("moved damaged checkpoint %s to %s", path, target)
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices("transformer_jax: damaged checkpoints set aside")
    self.manager.reload()

  def wait(self):
    try:
      self.manager.wait_until_finished()
    except Exception as e:  # noqa: BLE001 - storage failures are reported, the rest re-raised
      self._storage_failure(e, self._last_requested or 0)

  def close(self):
    """Finish pending saves (raising StorageError if one failed) and release the manager."""
    try:
      if not self.failed:
        self.wait()
    finally:
      try:
        self.manager.close()
      except Exception:  # noqa: BLE001 - after a failed save its error was reported already
        if not self.failed:
          raise
      finally:
        if self.failed:
          # Writer threads of the failed save can still create files after the first clean-up
          # (seen on a loaded machine: a step's temporary directory left behind): clean again
          # until none reappears for a moment.
          for _ in range(25):
            removed = remove_partial_steps(self.directory)
            time.sleep(0.2)
            if not removed and not remove_partial_steps(self.directory):
              break
        # After a failed save the filter stays: Orbax's threads go on logging it until the
        # process ends.
        if not self.failed:
          for name in _QUIETED_LOGGERS:
            logging.getLogger(name).removeFilter(self._quiet)


def manager_directory(path: str) -> tuple[str, int | None]:
  """(Orbax manager directory, step or None) for a workdir, its checkpoints (or averaged)
  directory, or one `<step>` directory of either."""
  path = os.path.abspath(path)
  if os.path.isdir(os.path.join(path, CHECKPOINTS)):
    path = os.path.join(path, CHECKPOINTS)
  if os.path.isdir(os.path.join(path, "state")) and os.path.basename(path).isdigit():
    return os.path.dirname(path), int(os.path.basename(path))
  return path, None


def load_params(path: str, step: int | None = None):
  """Parameters (host numpy) from a workdir, its checkpoints dir, or one step's directory.

  Used by `init_from` and the translation tools. Reads only `state/params`, with the shapes
  and dtypes the checkpoint's metadata records, so it needs to know neither the optimizer the
  run was trained with nor its mesh, and never holds the optimizer state (twice the parameters'
  size with Adam) in memory.
  """
  path, step_dir = manager_directory(path)
  step = step_dir if step_dir is not None else step
  if why := unfinished_set_aside(path, step):
    raise CheckpointError(why)
  if not os.path.isdir(path):
    raise CheckpointError(f"no checkpoint directory at {path}: pass a workdir of a training run "
                          "or its checkpoints/<step> directory")
  with read_only_manager(path, item_handlers={"state": ocp.PyTreeCheckpointHandler()}) as mgr:
    steps = sorted(mgr.all_steps())
    if not steps:
      raise CheckpointError(f"{path} holds no finished checkpoint")
    if step is None:
      step = default_step(path, steps)
    elif step not in steps:
      raise CheckpointError(f"step {step} is not in {path}: available steps {steps}")
    try:
      params = _read_params(mgr, path, step)
    except (ValueError, OSError) as e:  # TensorStore's and Orbax's errors of files that do not read
      if step not in checkpoint_steps(path):
        raise CheckpointError(f"checkpoint {step} in {path} was deleted while it was read (a run "
                              "training there keeps its last checkpoints only): read another "
                              "step") from e
      raise DamagedCheckpoint(path, step, [s for s in steps if s != step], e) from e
  return step, jax.tree.map(np.asarray, params)


def _read_params(mgr: ocp.CheckpointManager, path: str, step: int):
  """`state/params` of `step`, onto one local device, with the shapes and dtypes its metadata
  records."""
  metadata = mgr.item_metadata(step)["state"]
  tree = getattr(metadata, "tree", metadata)
  if not isinstance(tree, dict) or "params" not in tree:
    raise CheckpointError(f"{path}/{step}/state holds no `params` (keys: "
                          f"{sorted(tree) if isinstance(tree, dict) else type(tree).__name__}); "
                          "it is not a checkpoint of this codebase")
  # Saved on devices this process may lack (more hosts or devices): read onto one local device.
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  target = {"params": jax.tree.map(
      lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), tree["params"])}
  restore_args = jax.tree.map(lambda _: ocp.ArrayRestoreArgs(sharding=device), target)
  restored = mgr.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
      item=target, restore_args=restore_args, partial_restore=True)))
  return restored["state"]["params"]


def error_line(error: BaseException) -> str:
  """`error` as "<type>: <its first line>", for a message of one line: TensorStore's errors run
  to pages (the spec of the array it read)."""
  lines = str(error).strip().splitlines()
  return f"{type(error).__name__}: {lines[0][:300]}" if lines else type(error).__name__


class DamagedCheckpoint(CheckpointError):
  """A finished step whose files do not read: cut short or emptied (a disk error, a full disk
  or a power loss while they were copied). `reason`: the error's `error_line`."""

  def __init__(self, directory: str, step: int, others: list[int], error: BaseException):
    self.directory, self.step, self.reason = directory, step, error_line(error)
    way_out = (f"read another of its steps ({', '.join(map(str, others))}: --step N, or that "
               "step's directory)" if others else f"{directory} has no other step to read")
    super().__init__(f"checkpoint {step} in {directory} does not load ({self.reason}): its "
                     f"files are damaged (cut short or emptied); {way_out}")


def default_step(directory: str, steps: list[int]) -> int:
  """The step of `steps` (a manager directory's, sorted) that a reader takes when none is asked
  for: the newest; in a best_<metric> directory, the best by the value its `meta` records, as
  training's BestKeeper chooses. A keep_best save killed while it deleted the earlier best leaves
  both there, and after a resume from an earlier checkpoint the better one may be the lower."""
  name = os.path.basename(os.path.normpath(directory))
  metric = name[len("best_"):] if name.startswith("best_") else None
  if len(steps) < 2 or metric not in BEST_METRICS:
    return steps[-1]
  from transformer_jax.run.best import BestKeeper  # here: run/best.py builds on this module
  best = BestKeeper(os.path.dirname(os.path.normpath(directory)), metric).step
  return steps[-1] if best is None else best


def resume_advice(directory: str) -> str:
  """After a failed write into a run: the step the same command resumes from, and what to do.
  `directory`: the run's checkpoints (an Orbax manager directory)."""
  good = checkpoint_steps(directory)
  if good:
    return (f"The last good checkpoint is step {good[-1]}, untouched: free space, or lower "
            "--config.keep_checkpoints (a resume deletes the oldest steps beyond it before "
            "it writes anything), and run the same command to resume from it.")
  return ("There is no earlier checkpoint: run the same command again once there is space, "
          "and training starts from step 0.")


def checkpoint_steps(directory: str) -> list[int]:
  """Finished steps of an Orbax manager directory (unfinished ones have a temporary name)."""
  if not os.path.isdir(directory):
    return []
  return sorted(int(n) for n in os.listdir(directory)
                if n.isdigit() and os.path.isdir(os.path.join(directory, n, "state")))


def resolve_checkpoint(workdir: str, checkpoint: str | None = None, step: int | None = None,
                       averaged: bool = False) -> tuple[str, int]:
  """(Orbax manager directory, step) that `load_params` will read, or a RunError saying why not.

  `checkpoint` may be a workdir, a checkpoints/averaged directory or one step's directory; by
  default the run's own `<workdir>/checkpoints`, or `<workdir>/averaged` with `averaged=True`.
  """
  if checkpoint and averaged:
    raise RunError("pass either --checkpoint or --averaged, not both")
  if averaged:
    checkpoint = os.path.join(workdir, AVERAGED)
    if not os.path.isdir(checkpoint):
      raise RunError(f"no averaged checkpoint in {checkpoint}: run scripts/average_checkpoints.py "
                     f"--workdir {shlex.quote(workdir)} --last N first")
  name = os.path.basename(os.path.normpath(checkpoint or ""))
  # Only the run's own best_<metric> for a metric keep_best takes: advice to train with
  # --config.keep_best=model for /tmp/x/best_model would send the user to a refused flag.
  if (checkpoint and not os.path.exists(checkpoint) and name.startswith("best_")
      and name[len("best_"):] in BEST_METRICS
      and os.path.dirname(os.path.abspath(checkpoint)) == os.path.abspath(workdir)):
    raise RunError(f"--checkpoint {checkpoint} does not exist: a run keeps best_<metric>/ only "
                   "when trained with --config.keep_best=<metric> (and once it has evaluated); "
                   f"pass --step N, --averaged or another --checkpoint, or train with "
                   f"--config.keep_best={name[len('best_'):]}")
  path, step_dir = manager_directory(checkpoint or workdir)
  if step_dir is not None:
    if step is not None and step != step_dir:
      raise RunError(f"--step {step} contradicts the step directory {path}/{step_dir}")
    return path, step_dir
  if why := unfinished_set_aside(path, step):
    raise RunError(why)
  steps = checkpoint_steps(path)
  if not steps:
    where = path if checkpoint else checkpoint_dir(workdir)
    raise RunError(f"no checkpoint in {where}: " + (
        train_hint(workdir) if not checkpoint else
        "pass a workdir, its checkpoints or averaged directory, or one checkpoints/<step> "
        "directory"))
  if step is None:
    return path, default_step(path, steps)
  if step not in steps:
    raise RunError(f"step {step} is not in {path}: available steps {steps}")
  return path, step


def remove_partial_steps(directory: str) -> bool:
  """Delete an Orbax directory's half-written (temporary) steps, on process 0; returns whether
  there were any."""
  if jax.process_index() != 0 or not os.path.isdir(directory):
    return False
  partial = [n for n in os.listdir(directory) if _TMP_DIR in n]
  for name in partial:
    shutil.rmtree(os.path.join(directory, name), ignore_errors=True)
  return bool(partial)


_ASIDE = ".replaced"  # save_params' suffix for a step's earlier save until the new one is complete


def set_aside_steps(directory: str) -> dict[int, str]:
  """The earlier saves that `save_params` set aside (`<step>.replaced`), by step."""
  if not os.path.isdir(directory):
    return {}
  return {int(n[:-len(_ASIDE)]): os.path.join(directory, n) for n in os.listdir(directory)
          if n.endswith(_ASIDE) and n[:-len(_ASIDE)].isdigit()}


def put_back_set_aside(directory: str) -> list[str]:
  """On process 0, what a `save_params` killed part-way (`kill -9`, a lost node) left: a step's
  earlier save that was set aside goes back where the new save never finished, and is deleted
  where it did (killed between finishing and deleting). Returns what was done, a line each.

  A `<step>` directory that is neither finished nor Orbax's temporary one is nobody's to
  delete: the copy set aside stays beside it, with a warning.
  """
  done = []
  if jax.process_index() != 0:
    return done
  finished = set(checkpoint_steps(directory))
  for step, aside in sorted(set_aside_steps(directory).items()):
    here = os.path.join(directory, str(step))
    if step in finished:
      shutil.rmtree(aside, ignore_errors=True)
      done.append(f"could not delete {aside} (the save that replaced it had finished): delete "
                  "it by hand" if os.path.exists(aside) else
                  f"deleted {aside}: the save that replaced it had finished")
      continue
    remove_partial_steps(directory)  # the killed save's temporary directory (no save is running)
    if os.path.exists(here):
      log.warning("%s is not a finished checkpoint; %s, the step's earlier save, is left beside "
                  "it: move one of them away by hand", here, aside)
      continue
    os.replace(aside, here)
    done.append(f"put {aside} back as {here}: the save that was to replace it never finished")
  for line in done:
    log.warning("%s", line)
  return done


def unfinished_set_aside(directory: str, step: int | None) -> str | None:
  """Why reading `step` (None: the newest) of `directory` would miss a save set aside by a
  `save_params` that has not finished, as an error's text; None when it would not. Readers leave
  the directory as it is (that save may still be running): the next save puts the copy back.

  `directory` may also be the missing `<step>` directory itself (`.../averaged/5`)."""
  name = os.path.basename(os.path.normpath(directory))
  if name.isdigit() and not os.path.exists(directory) and step in (None, int(name)):
    directory, step = os.path.dirname(os.path.normpath(directory)), int(name)
  finished = checkpoint_steps(directory)
  for s, aside in sorted(set_aside_steps(directory).items(), reverse=True):
    if s not in finished and (s == step or (step is None and s > max(finished, default=-1))):
      here = os.path.join(directory, str(s))
      saver = ("training with --config.keep_best puts it back when it starts"
               if os.path.basename(directory).startswith("best_") else
               "the next save into it (scripts/average_checkpoints.py writing there) puts it "
               "back first")
      return (f"{aside} is step {s}'s earlier save, set aside by a save of step {s} into "
              f"{directory} that has not finished (one still running, or one killed part-way). "
              f"Once no save into it is running: {saver}; or put it back by hand: "
              f"rm -rf {shlex.quote(here)}{_TMP_DIR}*; mv {shlex.quote(aside)} "
              f"{shlex.quote(here)}")
  return None


def save_params(directory: str, step: int, params, meta: dict, keep_only: bool = False) -> None:
  """Parameters alone (`state` = {"params": ...}, the layout `load_params` reads) and a JSON
  `meta` item as `<directory>/<step>` (synchronous; every process writes its shards).

  An earlier save of that step is set aside (`<step>.replaced`) until the new one is complete,
  and put back if the save fails: a failed save never loses the old one, and what a save killed
  part-way left is put right by the next one (`put_back_set_aside`). `keep_only`: the
  directory's other steps are deleted once the new one is complete (by hand: Orbax's
  max_to_keep would keep the highest step, and the new one may be lower).
  """
  here = os.path.join(directory, str(step))
  aside = f"{here}{_ASIDE}"
  main = jax.process_index() == 0
  if main:
    put_back_set_aside(directory)
    if step in checkpoint_steps(directory):
      os.replace(here, aside)
  options = ocp.CheckpointManagerOptions(create=True, enable_async_checkpointing=False)
  try:
    # Every process waits for process 0's renames before any writes. Inside the try: a barrier
    # that fails (another process gone) puts the old step back too.
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices("transformer_jax: the step's directory made ready")
    with ocp.CheckpointManager(directory, options=options) as manager:
      manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave({"params": params}),
                                                 meta=ocp.args.JsonSave(meta)), force=True)
      manager.wait_until_finished()
      for old in manager.all_steps() if keep_only else []:
        if old != step:
          manager.delete(old)
  except BaseException:
    remove_partial_steps(directory)
    if main and os.path.isdir(aside) and not os.path.isdir(here):
      os.replace(aside, here)
    raise
  if main and os.path.isdir(aside):
    shutil.rmtree(aside, ignore_errors=True)


class _ReadNotices(logging.Filter):
  """Drops Orbax's notices on opening a checkpoint to read part of it: that a read-only manager
  saves nothing, and that the items not asked for (`data`, `meta`) were not restored."""
  NOTICES = ("CheckpointManagerOptions.read_only=True", "Given directory is read only",
             "was found in the checkpoint, but could not be restored")

  def filter(self, record: logging.LogRecord) -> bool:
    return not any(n in str(record.msg) for n in self.NOTICES)


@contextlib.contextmanager
def read_only_manager(directory: str, **kwargs):
  """A read-only Orbax CheckpointManager on `directory`, without its notices on the console."""
  quiet, absl_logger = _ReadNotices(), logging.getLogger("absl")
  absl_logger.addFilter(quiet)
  try:
    with ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(read_only=True),
                               **kwargs) as manager:
      yield manager
  finally:
    absl_logger.removeFilter(quiet)


def load_meta(directory: str, step: int) -> dict | None:
  """The `meta` item of one step (None where the step has none)."""
  try:
    with read_only_manager(directory) as manager:
      meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
  except (FileNotFoundError, KeyError, ValueError):  # no meta item in this step
    return None
  return dict(meta) if meta else None
