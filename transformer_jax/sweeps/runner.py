"""Running a sweep's points on this machine: one `scripts/train.py` subprocess per point, a few
at a time on disjoint devices, with the markers that let a re-run skip finished points.

Each point is its own process, so a crash or a leak in one cannot touch the others.
"""
from __future__ import annotations

import ctypes
import functools
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from typing import Any, Mapping, Sequence

from transformer_jax.files import file_lock, write_atomically
from transformer_jax.run.early_stopping import stopped_at
from transformer_jax.run.metrics import evaluated
from transformer_jax.run.workdir import (
    CONFIG,
    RunError,
    history,
    read_json,
    recorded_values,
    running_here,
)
from transformer_jax.sweeps.spec import (
  SweepError,
  join_config_arg,
  load_sweep,
  override_flags,
  point_dir,
  point_name,
  split_config_arg,
  validated_configs,
)

DONE, FAILED, RUNNING = "DONE", "FAILED", "RUNNING"  # marker files in a point's workdir


def finished(workdir: str, num_train_steps: int) -> bool:
  """Whether the run in `workdir` saved its final step and logged that step's evaluation, or
  stopped early (`config.early_stopping_patience`: its last checkpoint's step has the record).

  Training saves the final checkpoint, then evaluates: a run stopped in between (killed, or
  stopped by SIGTERM and exiting 0) is not finished, and resumes on the next run."""
  return _reached(workdir, num_train_steps) or stopped_at(workdir) is not None


def _reached(workdir: str, num_train_steps: int) -> bool:
  """Whether the run saved step `num_train_steps` and logged its final evaluation."""
  final = os.path.join(workdir, "checkpoints", str(int(num_train_steps)))
  return os.path.isdir(final) and evaluated(workdir, int(num_train_steps))


def _marked_done(workdir: str, num_train_steps: int | None = None) -> bool:
  """Whether `workdir` has a DONE marker that covers `num_train_steps` (any marker if None).

  The marker records the steps it was written for: a sweep re-run with more steps must resume
  the point, not skip it. A marker that records none (written before it did) counts only if the
  run `finished` these steps."""
  path = os.path.join(workdir, DONE)
  if not os.path.exists(path):
    return False
  if num_train_steps is None:
    return True
  with open(path, errors="replace") as f:
    recorded = re.search(r"^num_train_steps (\d+)$", f.read(), re.MULTILINE)
  if recorded is None:
    return finished(workdir, num_train_steps)
  # More steps than asked also counts: training from there has nothing left to do.
  return int(recorded.group(1)) >= int(num_train_steps)


def status(workdir: str, num_train_steps: int | None = None) -> str:
  """"done" (a DONE marker covering `num_train_steps`, or `finished`), "running" (a live
  process of this host holds its workdir), "failed", "partial" or "new".

  A re-run skips "done" points and runs the others again: their workdirs resume from their
  last checkpoint (also to train on, where `num_train_steps` grew)."""
  if _marked_done(workdir, num_train_steps):
    return "done"
  if running_here(workdir):
    return "running"
  if os.path.exists(os.path.join(workdir, FAILED)):
    return "failed"  # even past the last step: it may have failed in the final evaluation
  # Finished outside the sweep driver (e.g. run by hand), or stopped early, whatever the number
  # of steps asked for.
  if ((num_train_steps is not None and _reached(workdir, num_train_steps))
      or stopped_at(workdir) is not None):
    return "done"
  if os.path.exists(os.path.join(workdir, "metrics.jsonl")):
    return "partial"
  return "new"


def _slot_gpus(slot: int, devices_per_point: int, visible: str | None) -> str:
  """CUDA_VISIBLE_DEVICES of `slot`: entries [slot*K, (slot+1)*K) of the inherited `visible`.

  The inherited list is the job's allocation (SLURM without device cgroups exports physical
  ids; a user may have set it to avoid busy GPUs; it may hold UUIDs): counting from physical
  id 0 instead would run points on GPUs outside it. Unset, every GPU is ours; set empty, or
  to what CUDA reads as no device ("-1", SLURM's "NoDevFiles": a list that starts with an
  entry that is neither an id nor a UUID), GPUs are hidden on purpose (a CPU sweep), and stay
  hidden as they were. As for CUDA, the list ends at its first such entry ("0,1,-1,2" shows
  GPUs 0 and 1): a slot never gets a GPU that CUDA would not show it."""
  first, last = slot * devices_per_point, (slot + 1) * devices_per_point
  if visible is None:
    return ",".join(str(i) for i in range(first, last))
  entries = list(itertools.takewhile(
      lambda d: d.isdigit() or d.startswith(("GPU-", "MIG-")),
      [d.strip() for d in visible.split(",") if d.strip()]))
  if not entries:
    return visible
  if last > len(entries):
    raise SweepError(
        f"{slot + 1} point(s) at a time x --devices_per_point {devices_per_point} need {last} "
        f"GPUs, but the inherited CUDA_VISIBLE_DEVICES={visible} lists {len(entries)} that "
        "CUDA shows: lower --parallel or --devices_per_point, or make more GPUs visible (set "
        "it empty for a CPU sweep on fake devices)")
  return ",".join(entries[first:last])


def slot_env(slot: int, devices_per_point: int, base_env: dict | None = None) -> dict:
  """The environment of a point running in `slot` on devices [slot*K, (slot+1)*K).

  GPUs: CUDA_VISIBLE_DEVICES picks the subset, of the inherited CUDA_VISIBLE_DEVICES where one
  is set (`_slot_gpus`). CPU: each process gets K fake host devices
  (--xla_force_host_platform_device_count). Both are set; each only affects its platform.
  """
  env = dict(os.environ if base_env is None else base_env)
  if devices_per_point <= 0:
    return env
  env["CUDA_VISIBLE_DEVICES"] = _slot_gpus(slot, devices_per_point,
                                           env.get("CUDA_VISIBLE_DEVICES"))
  flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", env.get("XLA_FLAGS", ""))
  count = f"--xla_force_host_platform_device_count={devices_per_point}"
  env["XLA_FLAGS"] = f"{flags} {count}".strip()
  return env


def _read_json(path: str, kind: type):
  """The JSON value of type `kind` (list, dict) in `path`; an empty one where there is none
  (missing, cut short, another type)."""
  try:
    with open(path) as f:
      value = json.load(f)
  except (OSError, ValueError):
    return kind()
  return value if isinstance(value, kind) else kind()


def _recorded_file(recorded: Mapping[str, Any]) -> tuple[str, str | None] | None:
  """The config file and argument that sweep.json's `recorded` dict names:
  - the absolute path sweep.json keeps since 2026-11-29 (`config_file`, `config_arg`);
  - the config as given (`config`, path[:arg], from the current directory) where there is no
    such path (an older sweep.json), or where that path is gone and the given one is there
    from here (a moved checkout);
  - None where it names neither."""
  given = recorded["config"] if isinstance(recorded.get("config"), str) else None
  kept = recorded["config_file"] if isinstance(recorded.get("config_file"), str) else None
  moved = (kept is not None and not os.path.exists(kept) and bool(given)
           and os.path.exists(split_config_arg(given)[0]))
  if kept is not None and not moved:
    return kept, recorded.get("config_arg")
  return None if given is None else split_config_arg(given)


def recorded_config(sweep_dir: str) -> str | None:
  """The `--config` sweep.json in `sweep_dir` records (its absolute path where it keeps one),
  or None where there is no sweep.json or it names none."""
  found = _recorded_file(_read_json(os.path.join(sweep_dir, "sweep.json"), dict))
  return None if found is None else join_config_arg(*found)


def _same_file(found: tuple[str, str | None], sweep) -> bool:
  """Whether the config file and argument `found` in sweep.json are `sweep`'s (by real path)."""
  path, arg = found
  return os.path.realpath(path) == os.path.realpath(sweep.path) and arg == sweep.arg


def _as_json(overrides: Mapping[str, Any]) -> dict:
  """`overrides` as sweep.json holds them: tuples as lists, a ConfigDict as a dict."""
  return json.loads(json.dumps(
      {k: v.to_dict() if hasattr(v, "to_dict") else v for k, v in overrides.items()},
      default=str))


# prctl's PR_SET_PDEATHSIG (Linux): a signal for a process when the thread that started it ends.
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
_PR_SET_PDEATHSIG = 1


def _stop_with(driver_pid: int) -> None:
  """A point's process, before it runs train.py: SIGTERM when the sweep driver dies, however
  it dies (kill -9 included), so the point saves and stops as it does for a scheduler's
  SIGTERM, instead of training on, orphaned, holding its workdir's lock against the sweep's
  next run. (The driver starts its points from its main thread, which lives as long as it.)"""
  # The driver's own handlers (`_Stop`) live on in this forked copy until exec: they would
  # swallow the SIGTERMs below, and the point would train on, orphaned.
  signal.signal(signal.SIGTERM, signal.SIG_DFL)
  signal.signal(signal.SIGINT, signal.SIG_DFL)
  if _LIBC is not None:
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != driver_pid:  # the driver died before the line above
      os.kill(os.getpid(), signal.SIGTERM)


def _passed_on(stop: "_Stop", forwarded: int) -> int:
  """The signal the driver passes on to its points after `stop.count` signals, `forwarded` of
  them passed on already. The first, of either kind, as SIGTERM (each point saves and stops; a
  point that has the terminal's Ctrl-C too, in the same process group, takes a SIGTERM after
  a SIGINT as nothing more). A second Ctrl-C as it is: train.py stops at once, without saving.
  A third signal of any kind: SIGKILL, for a point stuck where Python's handlers never run (in
  a collective, in XLA), which would keep the driver waiting for ever."""
  if stop.count >= 3:
    return signal.SIGKILL
  if forwarded == 0 or stop.last != signal.SIGINT:
    return signal.SIGTERM
  return signal.SIGINT


class _Stop:
  """The sweep driver's SIGTERM and SIGINT, counted for its loop (`Runner._loop`) to act on.

  The driver must outlive its points: under SLURM each array task is `srun sweep.py --point
  i`, every process of the task gets the scheduler's SIGTERM, and once the task (the driver)
  has exited SLURM kills what is left of it, so a driver that died at once cut short the
  point's save on SIGTERM (it resumed from its last periodic checkpoint), and recorded
  nothing. In any other thread than the main one, signals are left alone."""

  def __init__(self):
    self.signal, self.last, self.count = None, None, 0
    self._previous = {}

  def __enter__(self):
    for sig in (signal.SIGTERM, signal.SIGINT):
      # A SIGINT ignored from the start (`sweep.py &` in a script) stays ignored: a Ctrl-C
      # meant for the foreground must not stop the sweep.
      if signal.getsignal(sig) == signal.SIG_IGN:
        continue
      try:
        self._previous[sig] = signal.signal(sig, self._handle)
      except ValueError:
        pass
    return self

  def _handle(self, signum, frame):
    self.signal = self.signal or signal.Signals(signum).name
    self.last, self.count = signum, self.count + 1

  def __exit__(self, *exc):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)


def exit_text(returncode: int) -> str:
  """`exit status 1`, or `killed by SIGKILL` for a negative return code."""
  if returncode >= 0:
    return f"exit status {returncode}"
  try:
    return f"killed by {signal.Signals(-returncode).name}"
  except ValueError:
    return f"killed by signal {-returncode}"


def _but_steps(flags: Sequence[str]) -> list[str]:
  return sorted(f for f in flags if not f.startswith("--config.num_train_steps="))


def _tail(path: str, lines: int = 60) -> str:
  if not os.path.exists(path):
    return ""
  with open(path, errors="replace") as f:
    return "".join(f.readlines()[-lines:])


class Runner:
  """Runs the points of one sweep directory as `train_script` subprocesses.

  `overrides` (dotted field -> value) apply to every point: each point's command line gives
  them after the point's own fields, so they win where both set a field.

  Each point's workdir holds `overrides.json`, `train.log` (its output, appended on re-runs),
  then `DONE` (with the number of steps it finished) or `FAILED` (exit status and the log's
  tail). `sweep.json` lists every point and the overrides; `status.json` the latest outcome of
  each point run so far, in point order (a run of some points, `--point`, updates their entries).
  `record=False` only looks (`--list`): it writes nothing, creates no directory and cannot run.
  The overrides sweep.json recorded apply under this command's, so that a point counts as done
  at the steps the sweep trained it for, not at the config's default, and a new
  num_train_steps alone extends the sweep; `recorded_flags` are the flags sweep.json names
  (None where there is none), for the caller to warn when they differ. One that records
  refuses, once a point has started, values other than the recorded ones but for
  num_train_steps (`_check_same_flags`), and writes sweep.json only when it runs or is
  submitted (`write_spec`): a refused command changes nothing.
  Each point's process gets SIGTERM when the driver dies (`_stop_with`).
  """

  def __init__(self, config_spec: str, sweep_dir: str, train_script: str,
               overrides: Mapping[str, Any] | None = None, python: str | None = None,
               record: bool = True):
    self.config_spec, self.sweep_dir = config_spec, os.path.abspath(sweep_dir)
    self.train_script, self.overrides = train_script, dict(overrides or {})
    self.python = python or sys.executable
    self.recorded_flags, self._recorded = None, None
    self.sweep = load_sweep(config_spec)
    self.points = self.sweep.points
    recorded = _read_json(os.path.join(self.sweep_dir, "sweep.json"), dict)
    # The recorded points that started and are not this config's: another config's sweep
    # (a run must not take its directory over, `_check_same_config`).
    names = {point_name(p) for p in self.points}
    started = [p["overrides"] for p in recorded.get("points", [])
               if isinstance(p, dict) and isinstance(p.get("overrides"), dict)
               and os.path.isdir(point_dir(self.sweep_dir, p["overrides"]))]
    self._started_elsewhere = [point_name(p) for p in started if point_name(p) not in names]
    # The config sweep.json records, where it is another's: its flags are not this sweep's.
    # None where it is this one: the same file by its real path (a moved checkout's copy
    # included, `_recorded_file`), or another whose points hold every started point (a copy in
    # another checkout, say).
    found = _recorded_file(recorded)
    same = (found is None or _same_file(found, self.sweep)
            or bool(started and not self._started_elsewhere))
    self.recorded_config = None if same else join_config_arg(*found)
    if isinstance(recorded.get("extra_flags"), list) and self.recorded_config is None:
      self.recorded_flags = [str(f) for f in recorded["extra_flags"]]
    if isinstance(recorded.get("overrides"), dict) and self.recorded_config is None:
      # (sweeps recorded before 2026-11-25 have none.) The sweep's own flags, with this
      # command's on top: `--config.num_train_steps=N` alone extends a sweep run with others.
      self._recorded = recorded["overrides"]
      self.overrides = {**self._recorded, **self.overrides}
    swept = sorted({k for p in self.points for k in p} & set(self.overrides))
    if swept:
      # The flag comes last on each point's command line: it would replace every point's value
      # while the point's name and the report still showed the swept one.
      raise SweepError(f"--config.{swept[0]} sets a field the sweep varies: it would replace "
                       f"every point's {swept[0]}; drop the flag, or change the sweep")
    # A bad value in the last point fails now, not hours into the sweep.
    self.num_steps = [int(c.num_train_steps) for c in
                      validated_configs(self.sweep.base, self.points, self.overrides)]
    self.record = record
    # One writer of sweep.json, the markers and status.json: the first task of a multi-task
    # point (srun), and never a look (`--list`): another command line's config and flags must
    # not replace the sweep.json that the sweep's own runs wrote.
    self._main = record and os.environ.get("SLURM_PROCID", "0") == "0"
    if record:
      self._check_same_config()
      self._check_same_flags()

  def _check_same_config(self) -> None:
    """Refuse to run another config's points in a sweep directory where a point of the config
    sweep.json names has started: sweep.json would name the new config alone, and the old
    points would drop out of `--report` and compare_runs.py."""
    started = self._started_elsewhere
    if self.recorded_config is None or not started:
      return
    raise SweepError(
        f"{self.sweep_dir} is a sweep of --config {self.recorded_config} (sweep.json), not of "
        f"{self.sweep.spec}: {len(started)} of its started points ({started[0]} first) are "
        "not this config's, and running it there would replace sweep.json and leave them out "
        "of the report. Leave out --config (or give that one) to go on with that sweep, or "
        "give another --workdir for this config")

  def _check_same_flags(self) -> None:
    """Refuse flags other than those a started sweep recorded (but num_train_steps, which
    extends its points, and a value every started point ran with): its done points would be
    skipped, and its report would show their results under this command's values."""
    if not any(os.path.isdir(point_dir(self.sweep_dir, p)) for p in self.points):
      return  # no point started: any flags
    if self._recorded is not None:
      old, new = self._recorded, _as_json(self.overrides)
      differ = sorted(k for k in set(old) | set(new)
                      if k != "num_train_steps" and old.get(k) != new.get(k)
                      and not self._points_ran_with(k, new))
      sweep_flags = override_flags(old)
    elif self.recorded_flags is not None:  # recorded before "overrides" (2026-11-25)
      old_flags = self.recorded_flags
      # Its flags cannot be taken as overrides: a command without any must give them.
      differ = ["flags"] if (_but_steps(old_flags) != _but_steps(self.extra_flags)
                             or old_flags and not self.overrides) else []
      sweep_flags = old_flags
    else:
      return
    if differ:
      raise SweepError(
          f"{self.sweep_dir} is a sweep run with {' '.join(sweep_flags) or 'no --config flags'} "
          f"(sweep.json), and this command differs in {', '.join(differ)}: its points would "
          "be skipped or resumed, and reported, as if run with this command's values. Give the "
          "sweep's own flags to go on with it (a new --config.num_train_steps extends it), "
          "or another --workdir for other values")

  def _points_ran_with(self, field: str, overrides: dict) -> bool:
    """Whether `overrides` gives `field` the value every started point recorded in its
    config.json and every later config.<step>.json (and one did): such a flag changes none of
    them, and the rest get it too. `--config.data.split=grouped` goes on with a sweep of a text
    corpus made before that default moved (2026-12-07), whose points would otherwise be
    refused."""
    dirs = [d for d in (point_dir(self.sweep_dir, p) for p in self.points)
            if os.path.exists(os.path.join(d, CONFIG))]
    paths = [p for d in dirs for p in [os.path.join(d, CONFIG)] + [p for _, p in history(d)]]
    try:
      return field in overrides and bool(dirs) and all(
          recorded_values(read_json(p)).get(field) == overrides[field] for p in paths)
    except RunError:  # a config that does not parse: the refusal stands
      return False

  def write_spec(self) -> None:
    """sweep.json: the config, the flags and the points. Written when the sweep runs or is
    submitted, after every check: a refused command changes nothing. A look, or a task of a
    multi-task point but its first, writes nothing (not even the directory)."""
    if not self._main:
      return
    os.makedirs(self.sweep_dir, exist_ok=True)
    # Every SLURM array task writes it (at once, when their array starts): each renames a whole
    # file of its own.
    write_atomically(os.path.join(self.sweep_dir, "sweep.json"), json.dumps(
        {"config": self.config_spec, "config_file": self.sweep.path, "config_arg": self.sweep.arg,
         "extra_flags": self.extra_flags,
         "overrides": _as_json(self.overrides),
         "points": [{"index": i, "name": point_name(p), "overrides": p,
                     "num_train_steps": self.num_steps[i]}
                    for i, p in enumerate(self.points)]}, indent=1, default=str) + "\n")

  def differs_from_recorded(self) -> bool:
    """Whether a look's overrides are not those sweep.json recorded (False where it recorded
    none): its statuses then answer for other steps, say, than the sweep's."""
    if self._recorded is not None:
      return _as_json(self.overrides) != self._recorded
    return self.recorded_flags is not None and self.recorded_flags != self.extra_flags

  @property
  def extra_flags(self) -> list[str]:
    """The `--config.X=V` flags every point gets after its own."""
    return override_flags(self.overrides)

  def command(self, index: int) -> list[str]:
    return [self.python, self.train_script, "--config", self.sweep.config_arg,
            "--workdir", point_dir(self.sweep_dir, self.points[index]),
            *override_flags(self.points[index]), *self.extra_flags]

  def status(self, index: int) -> str:
    return status(point_dir(self.sweep_dir, self.points[index]), self.num_steps[index])

  def outcome(self, indices: Sequence[int], logs=None) -> tuple[list[str], int]:
    """A line per point (`[i] name: status`, a failed one with its FAILED file, which holds the
    exit status and its log's tail) and how many failed. With `logs` (index -> a log path: the
    points ran as SLURM array tasks), a point that did not finish counts as failed too: SLURM
    ended it (time limit, memory, cancel) before it could write a marker."""
    lines, failed = [], 0
    for i in indices:
      state, d = self.status(i), point_dir(self.sweep_dir, self.points[i])
      line = f"[{i}] {point_name(self.points[i])}: {state}"
      if state == "failed":
        line += f": see {os.path.join(d, FAILED)}"
      elif logs is not None and state != "done":
        line += f": ended unfinished, see {logs(i)}"
        state = "failed"
      lines.append(line)
      failed += state == "failed"
    return lines, failed

  def _start(self, index: int, env: dict):
    d = point_dir(self.sweep_dir, self.points[index])
    os.makedirs(d, exist_ok=True)
    if self._main:
      write_atomically(os.path.join(d, "overrides.json"),
                       json.dumps(self.points[index], default=str) + "\n")
      # Retried, or extended to more steps: its workdir resumes from its checkpoint, and until
      # it ends the report must not show its old outcome.
      for marker in (FAILED, DONE):
        if os.path.exists(os.path.join(d, marker)):
          os.remove(os.path.join(d, marker))
    log = open(os.path.join(d, "train.log"), "a")
    log.write(f"$ {' '.join(self.command(index))}\n")
    log.flush()
    proc = subprocess.Popen(self.command(index), stdout=log, stderr=subprocess.STDOUT, env=env,
                            preexec_fn=functools.partial(_stop_with, os.getpid()))
    return proc, log

  def _finish(self, index: int, returncode: int, seconds: float, stopped: bool) -> dict:
    """`stopped`: the sweep passed a signal on to the point (`_loop`)."""
    d = point_dir(self.sweep_dir, self.points[index])
    name = point_name(self.points[index])
    if stopped and returncode in (-signal.SIGTERM, -signal.SIGINT):
      # Killed by the signal passed on before train.py could take it (still starting, or a
      # second Ctrl-C): nothing of it to fail on, and the next run resumes it.
      outcome = "stopped"
    elif returncode != 0:
      outcome = "failed"
    elif finished(d, self.num_steps[index]):
      outcome = "done"
    else:
      # Exit 0 before the last step: stopped by SIGTERM/SIGINT, which saves and exits 0. No
      # marker: the next run resumes it.
      outcome = "stopped"
    if self._main:
      if outcome == "done":
        early = stopped_at(d)
        write_atomically(os.path.join(d, DONE), f"finished in {seconds:.1f} s\n"
               f"num_train_steps {self.num_steps[index]}\n"
               + (f"stopped early at step {early}\n" if early is not None else ""))
      elif outcome == "failed":
        write_atomically(os.path.join(d, FAILED),
               f"{exit_text(returncode)} after {seconds:.1f} s\n$ {' '.join(self.command(index))}"
               f"\n--- last lines of {os.path.join(d, 'train.log')}:\n"
               + _tail(os.path.join(d, "train.log")))
    return {"index": index, "name": name, "status": outcome, "returncode": returncode,
            "seconds": round(seconds, 1)}

  def run(self, indices: Sequence[int] | None = None, parallel: int = 1,
          devices_per_point: int = 0, log=print) -> list[dict]:
    """Run the points not yet done, `parallel` at a time; returns one status dict per point."""
    if not self.record:
      raise ValueError("a Runner made with record=False only looks; make one that records")
    # A point named twice (`--point 0,0`) runs once: two trainings would share its workdir.
    indices = list(dict.fromkeys(range(len(self.points)) if indices is None else indices))
    for i in indices:
      if not 0 <= i < len(self.points):
        raise SweepError(f"--point {i}: this sweep has points 0..{len(self.points) - 1} "
                         "(--list shows them)")
    results: dict[int, dict] = {}
    todo = []
    for i in indices:
      state = self.status(i)
      if state in ("done", "running"):
        # A running one: another driver's, or one left by a driver that died elsewhere; a
        # second train.py there would only fail on its lock.
        results[i] = {"index": i, "name": point_name(self.points[i]),
                      "status": f"skipped ({state})"}
        log(f"[{i}] {point_name(self.points[i])}: "
            + ("already done, skipped" if state == "done" else "running (its workdir is in "
               "use by a live process), skipped: run the sweep again once it has ended"))
      else:
        todo.append(i)
    parallel = min(max(1, parallel), max(1, len(todo)))  # no slot without a point to run
    if devices_per_point > 0 and todo:
      slot_env(parallel - 1, devices_per_point)  # the last slot's GPUs exist, or refuse
    self.write_spec()
    running: dict[int, tuple] = {}   # slot -> (index, proc, log file, start time)
    free = list(range(parallel))
    with _Stop() as stop:
      self._loop(todo, running, free, parallel, devices_per_point, results, stop, log)
    for i in todo:  # not started: a signal stopped the sweep first
      results[i] = {"index": i, "name": point_name(self.points[i]),
                    "status": f"not started ({stop.signal})"}
    ordered = [results[i] for i in indices]
    if self._main:
      self._record(ordered)
    return ordered

  def _loop(self, todo, running, free, parallel, devices_per_point, results, stop, log):
    """Start points as slots free up, until none is left or a signal stops the sweep: then
    the running points get SIGTERM (each saves and stops) and are waited for."""
    forwarded = 0
    while (todo and not stop.signal) or running:
      if stop.count > forwarded:
        if forwarded == 0:
          log(f"{stop.signal}: stopping the {len(running)} running point(s) (each saves and "
              f"stops) and starting none of the {len(todo)} left; run the sweep again to go on")
        for _, proc, _, _ in running.values():
          if proc.poll() is None:
            proc.send_signal(_passed_on(stop, forwarded))
        forwarded = stop.count
      while todo and free and not stop.signal:
        slot, i = free.pop(0), todo.pop(0)
        proc, f = self._start(i, slot_env(slot, devices_per_point))
        running[slot] = (i, proc, f, time.time())
        log(f"[{i}] {point_name(self.points[i])}: started"
            + (f" (slot {slot})" if parallel > 1 else ""))
      time.sleep(0.2)
      for slot, (i, proc, f, start) in list(running.items()):
        if proc.poll() is None:
          continue
        f.close()
        results[i] = self._finish(i, proc.returncode, time.time() - start,
                                  stopped=stop.signal is not None)
        log(f"[{i}] {results[i]['name']}: {results[i]['status']} "
            f"({exit_text(proc.returncode)}, {results[i]['seconds']} s)")
        del running[slot]
        free.append(slot)
    if stop.signal and forwarded == 0:  # it came as the last point ended: none to pass it on to
      log(f"{stop.signal}: starting none of the {len(todo)} point(s) left; run the sweep again "
          "to go on")

  def _record(self, results: list[dict]) -> None:
    """Merge `results` into `status.json`. SLURM array tasks (`--point i` each) end at once: the
    lock keeps every task's entry, the rename keeps a reader from a half-written file. Entries
    of points the sweep no longer has (its `sweep()` changed) are dropped."""
    path = os.path.join(self.sweep_dir, "status.json")
    with file_lock(os.path.join(self.sweep_dir, ".status.lock")):
      names = [point_name(p) for p in self.points]
      entries = {}
      for r in _read_json(path, list):
        i = r.get("index") if isinstance(r, dict) else None
        if isinstance(i, int) and 0 <= i < len(names) and r.get("name") == names[i]:
          entries[i] = r
      entries.update((r["index"], r) for r in results)
      write_atomically(path, json.dumps([entries[i] for i in sorted(entries)], indent=1) + "\n")
