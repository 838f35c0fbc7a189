"""Hyperparameter sweeps: the points a config's `sweep()` returns, their workdirs, status and report.

A config file defines, next to `get_config()`, a `sweep()` (or `sweep(arg)`) returning a list of
points, each a dict of config overrides with dotted names:

    from transformer_jax import sweeps

    def sweep():
      return sweeps.product(learning_rate=[1.0, 2.0], warmup_steps=[200, 400])

`scripts/sweep.py` runs each point as a `scripts/train.py` subprocess with `--config.X=value`
flags, in its own workdir named after its overrides. This module does not import JAX: the sweep
driver stays light, and every point gets a fresh process.
"""
from __future__ import annotations

import csv
import hashlib
import importlib.util
import inspect
import itertools
import json
import math
import os
import re
from typing import Any, Iterable, Sequence

Point = dict[str, Any]

DONE, FAILED, RUNNING = "DONE", "FAILED", "RUNNING"  # marker files in a point's workdir


# ---------------------------------------------------------------- building points


def product(**fields: Sequence[Any]) -> list[Point]:
  """Every combination: `product(lr=[1, 2], warmup=[10, 20])` gives 4 points, the last field
  varying fastest."""
  names = list(fields)
  return [dict(zip(names, values)) for values in itertools.product(*fields.values())]


def zipped(**fields: Sequence[Any]) -> list[Point]:
  """Values taken together: `zipped(d_model=[256, 512], num_heads=[4, 8])` gives 2 points."""
  lengths = {name: len(values) for name, values in fields.items()}
  if len(set(lengths.values())) > 1:
    raise ValueError(f"sweeps.zipped: the fields have different lengths {lengths}")
  names = list(fields)
  return [dict(zip(names, values)) for values in zip(*fields.values())]


def cross(*groups: Iterable[Point]) -> list[Point]:
  """The product of lists of points: `cross(zipped(...), product(...))` merges every pair."""
  out = []
  for combo in itertools.product(*groups):
    point: Point = {}
    for part in combo:
      overlap = set(point) & set(part)
      if overlap:
        raise ValueError(f"sweeps.cross: field(s) {sorted(overlap)} set by two groups")
      point.update(part)
    out.append(point)
  return out


def chain(*groups: Iterable[Point]) -> list[Point]:
  """Points of several sweeps one after another (duplicates removed, first kept)."""
  out, seen = [], set()
  for group in groups:
    for point in group:
      key = json.dumps(point, sort_keys=True, default=str)
      if key not in seen:
        seen.add(key)
        out.append(dict(point))
  return out


# ---------------------------------------------------------------- config files


def split_config_arg(spec: str) -> tuple[str, str | None]:
  """`configs/x.py:big` -> ("configs/x.py", "big"), as ml_collections' config flag reads it."""
  path, sep, arg = spec.partition(":")
  return path, (arg if sep else None)


def load_config_module(path: str):
  if not os.path.isfile(path):
    raise FileNotFoundError(f"config file {path!r} does not exist")
  spec = importlib.util.spec_from_file_location(
      "sweep_config_" + hashlib.md5(os.path.abspath(path).encode()).hexdigest()[:8], path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _call_with_arg(fn, arg):
  params = inspect.signature(fn).parameters
  return fn(arg) if params else fn()


def points_from_config(spec: str) -> list[Point]:
  """The points of `path[:arg]`'s `sweep()`, each checked against its `get_config()`."""
  path, arg = split_config_arg(spec)
  module = load_config_module(path)
  if not hasattr(module, "sweep"):
    raise ValueError(f"{path} has no sweep() function: define one next to get_config() "
                     "returning a list of override dicts (see transformer_jax/sweeps.py)")
  points = list(_call_with_arg(module.sweep, arg))
  if not points:
    raise ValueError(f"{path}: sweep() returned no points")
  base = _call_with_arg(module.get_config, arg)
  names = [point_name(p) for p in points]
  duplicates = sorted({n for n in names if names.count(n) > 1})
  if duplicates:
    raise ValueError(f"{path}: sweep() returns the same point twice: {duplicates}")
  for p in points:
    apply_overrides(base, p)  # fails on a misspelt field before anything runs
  return points


def apply_overrides(config, point: Point):
  """A copy of the ConfigDict with `point`'s dotted fields set (raises on an unknown field)."""
  import ml_collections
  c = ml_collections.ConfigDict(config.to_dict()) if hasattr(config, "to_dict") else config
  for key, value in point.items():
    *parents, leaf = key.split(".")
    target = c
    for p in parents:
      target = target[p]
    if leaf not in target:
      raise ValueError(f"sweep point {point}: config has no field {key!r}")
    target[leaf] = value
  return c


def override_flags(point: Point) -> list[str]:
  """`{"learning_rate": 0.5}` -> `["--config.learning_rate=0.5"]` for scripts/train.py."""
  out = []
  for key, value in point.items():
    if isinstance(value, bool):
      text = "true" if value else "false"
    elif isinstance(value, (list, tuple, dict)):
      text = json.dumps(value)
    else:
      text = str(value)
    out.append(f"--config.{key}={text}")
  return out


# ---------------------------------------------------------------- names and status


def _format(value) -> str:
  if isinstance(value, float):
    return f"{value:g}"
  return str(value)


def point_name(point: Point) -> str:
  """A readable directory name: `learning_rate=0.5,warmup_steps=10` (fields sorted).

  Characters outside `[A-Za-z0-9._=,+-]` become `_`; names over 120 characters are cut and get
  a hash of the full point, so distinct points never share a workdir.
  """
  if not point:
    return "default"
  text = ",".join(f"{k}={_format(point[k])}" for k in sorted(point))
  name = re.sub(r"[^A-Za-z0-9._=,+-]", "_", text)
  if len(name) > 120 or name != text:
    digest = hashlib.sha1(json.dumps(point, sort_keys=True, default=str).encode()).hexdigest()
    name = name[:110] + "-" + digest[:8] if len(name) > 120 else name + "-" + digest[:8]
  return name


def point_dir(sweep_dir: str, point: Point) -> str:
  return os.path.join(sweep_dir, point_name(point))


def finished(workdir: str, num_train_steps: int) -> bool:
  """Whether the run in `workdir` saved its final step and logged that step's evaluation.

  Training saves the final checkpoint, then evaluates: a run stopped in between (killed, or
  stopped early by SIGTERM and exiting 0) is not finished, and resumes on the next run."""
  from transformer_jax.metrics import evaluated  # no JAX import there
  final = os.path.join(workdir, "checkpoints", str(int(num_train_steps)))
  return os.path.isdir(final) and evaluated(workdir, int(num_train_steps))


def status(workdir: str, num_train_steps: int | None = None) -> str:
  """"done" (DONE marker, or `finished`), "failed", "partial" or "new".

  A re-run skips "done" points and runs the others again: their workdirs resume from their
  last checkpoint."""
  if os.path.exists(os.path.join(workdir, DONE)):
    return "done"
  if os.path.exists(os.path.join(workdir, FAILED)):
    return "failed"  # even past the last step: it may have failed in the final evaluation
  if num_train_steps is not None and finished(workdir, num_train_steps):
    return "done"    # finished outside the sweep driver (e.g. run by hand)
  if os.path.exists(os.path.join(workdir, "metrics.jsonl")):
    return "partial"
  return "new"


# ---------------------------------------------------------------- the report


def lower_is_better(metric: str) -> bool:
  return any(word in metric for word in ("loss", "nll", "perplexity", "time", "error"))


def collect(sweep_dir: str, points: list[Point]) -> tuple[list[dict], list[str]]:
  """One row per point: its fields, status and last metrics; and the swept field names."""
  from transformer_jax.metrics import last_values  # no JAX import there
  fields: list[str] = []
  for p in points:
    fields += [k for k in p if k not in fields]
  rows = []
  for p in points:
    d = point_dir(sweep_dir, p)
    row = {"name": point_name(p), **{k: p.get(k) for k in fields}, "status": status(d)}
    # A swept field keeps its value where a metric has the same name (learning_rate is both).
    row.update({k: v for k, v in last_values(d).items() if k not in row})
    rows.append(row)
  return rows, fields


def sort_rows(rows: list[dict], metric: str, lower: bool | None = None) -> list[dict]:
  """Best first by `metric`; rows without it (failed, not started) last."""
  lower = lower_is_better(metric) if lower is None else lower
  def key(row):
    v = row.get(metric)
    if not isinstance(v, (int, float)) or (isinstance(v, float) and math.isnan(v)):
      return (1, 0.0)
    return (0, v if lower else -v)
  return sorted(rows, key=key)


def _columns(rows: list[dict], fields: list[str], metric: str) -> list[str]:
  preferred = ["name", *fields, "status", "step", metric, "bleu", "eval_loss", "eval_accuracy",
               "train_loss"]
  cols = []
  for c in preferred:
    if c not in cols and any(c in r for r in rows):
      cols.append(c)
  return cols


def write_table(rows: list[dict], fields: list[str], metric: str, out_prefix: str) -> list[str]:
  """`<prefix>.csv` (every metric) and `<prefix>.md` (the main columns); returns the paths."""
  all_cols = _columns(rows, fields, metric)
  for r in rows:
    all_cols += [k for k in r if k not in all_cols]
  with open(out_prefix + ".csv", "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=all_cols, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
  cols = _columns(rows, fields, metric)
  lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
  for r in rows:
    lines.append("| " + " | ".join(_cell(r.get(c)) for c in cols) + " |")
  with open(out_prefix + ".md", "w") as f:
    f.write("\n".join(lines) + "\n")
  return [out_prefix + ".csv", out_prefix + ".md"]


def _cell(v) -> str:
  if v is None:
    return ""
  if isinstance(v, float):
    return f"{v:.4g}"
  return str(v)


def plot(rows: list[dict], fields: list[str], metric: str, path: str) -> str | None:
  """One panel per swept field: `metric` against the field's values (PNG, matplotlib Agg)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  have = [r for r in rows if isinstance(r.get(metric), (int, float))]
  if not have or not fields:
    return None
  fig, axes = plt.subplots(1, len(fields), figsize=(4 * len(fields), 3.2), squeeze=False)
  for ax, field in zip(axes[0], fields):
    values = [r.get(field) for r in have]
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    if numeric:
      xs = values
      positive = [v for v in values if v > 0]
      if positive and len(positive) == len(values) and max(values) / min(values) >= 10:
        ax.set_xscale("log")
    else:
      labels = sorted({str(v) for v in values})
      xs = [labels.index(str(v)) for v in values]
      ax.set_xticks(range(len(labels)), labels, rotation=30)
    ax.scatter(xs, [r[metric] for r in have])
    ax.set_xlabel(field)
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path


# ---------------------------------------------------------------- running points


def parse_value(text: str):
  """`"0.5"` -> 0.5, `"true"` -> True, `"[1, 2]"` -> [1, 2], anything else stays a string."""
  import ast
  lowered = text.strip().lower()
  if lowered in ("true", "false"):
    return lowered == "true"
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


def flags_to_point(flags: Sequence[str]) -> Point:
  """`["--config.num_train_steps=3"]` -> `{"num_train_steps": 3}` (for the "done" check)."""
  out = {}
  for flag in flags:
    if not flag.startswith("--config.") or "=" not in flag:
      raise ValueError(f"extra argument {flag!r}: expected --config.FIELD=VALUE")
    key, _, value = flag[len("--config."):].partition("=")
    out[key] = parse_value(value)
  return out


def slot_env(slot: int, devices_per_point: int, base_env: dict | None = None) -> dict:
  """The environment of a point running in `slot` on devices [slot*K, (slot+1)*K).

  GPUs: CUDA_VISIBLE_DEVICES picks the subset. CPU: each process gets K fake host devices
  (--xla_force_host_platform_device_count). Both are set; each only affects its platform.
  """
  env = dict(os.environ if base_env is None else base_env)
  if devices_per_point <= 0:
    return env
  first = slot * devices_per_point
  env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(first, first + devices_per_point))
  flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", env.get("XLA_FLAGS", ""))
  env["XLA_FLAGS"] = (flags + f" --xla_force_host_platform_device_count={devices_per_point}").strip()
  return env


def _write(path: str, text: str):
  with open(path, "w") as f:
    f.write(text)


def _tail(path: str, lines: int = 60) -> str:
  if not os.path.exists(path):
    return ""
  with open(path, errors="replace") as f:
    return "".join(f.readlines()[-lines:])


class Runner:
  """Runs the points of one sweep directory as `train_script` subprocesses.

  Each point's workdir holds `overrides.json`, `train.log` (its output, appended on re-runs),
  then `DONE` or `FAILED` (exit status and the log's tail). `sweep.json` lists every point;
  `status.json` the outcome of each point of the last invocation that ran them all.
  """

  def __init__(self, config_spec: str, sweep_dir: str, train_script: str,
               extra_flags: Sequence[str] = (), python: str | None = None):
    import sys
    self.config_spec, self.sweep_dir = config_spec, os.path.abspath(sweep_dir)
    self.train_script, self.extra_flags = train_script, list(extra_flags)
    self.python = python or sys.executable
    self.points = points_from_config(config_spec)
    path, arg = split_config_arg(config_spec)
    module = load_config_module(path)
    base = apply_overrides(_call_with_arg(module.get_config, arg), flags_to_point(extra_flags))
    self.num_steps = [int(apply_overrides(base, p).num_train_steps) for p in self.points]
    os.makedirs(self.sweep_dir, exist_ok=True)
    self._main = os.environ.get("SLURM_PROCID", "0") == "0"  # multi-task points: one writes
    if self._main:
      _write(os.path.join(self.sweep_dir, "sweep.json"), json.dumps(
          {"config": config_spec, "extra_flags": self.extra_flags,
           "points": [{"index": i, "name": point_name(p), "overrides": p}
                      for i, p in enumerate(self.points)]}, indent=1, default=str) + "\n")

  def command(self, index: int) -> list[str]:
    path, arg = split_config_arg(self.config_spec)
    config = os.path.abspath(path) + (f":{arg}" if arg is not None else "")
    return [self.python, self.train_script, "--config", config,
            "--workdir", point_dir(self.sweep_dir, self.points[index]),
            *override_flags(self.points[index]), *self.extra_flags]

  def status(self, index: int) -> str:
    return status(point_dir(self.sweep_dir, self.points[index]), self.num_steps[index])

  def _start(self, index: int, env: dict):
    import subprocess
    d = point_dir(self.sweep_dir, self.points[index])
    os.makedirs(d, exist_ok=True)
    if self._main:
      _write(os.path.join(d, "overrides.json"), json.dumps(self.points[index], default=str) + "\n")
      if os.path.exists(os.path.join(d, FAILED)):
        os.remove(os.path.join(d, FAILED))  # retried: its workdir resumes from its checkpoint
    log = open(os.path.join(d, "train.log"), "a")
    log.write(f"$ {' '.join(self.command(index))}\n")
    log.flush()
    proc = subprocess.Popen(self.command(index), stdout=log, stderr=subprocess.STDOUT, env=env)
    return proc, log

  def _finish(self, index: int, returncode: int, seconds: float) -> dict:
    d = point_dir(self.sweep_dir, self.points[index])
    name = point_name(self.points[index])
    if returncode != 0:
      outcome = "failed"
    elif finished(d, self.num_steps[index]):
      outcome = "done"
    else:
      # Exit 0 before the last step: stopped by SIGTERM/SIGINT, which saves and exits 0. No
      # marker: the next run resumes it.
      outcome = "stopped"
    if self._main:
      if outcome == "done":
        _write(os.path.join(d, DONE), f"finished in {seconds:.1f} s\n")
      elif outcome == "failed":
        _write(os.path.join(d, FAILED),
               f"exit status {returncode} after {seconds:.1f} s\n$ {' '.join(self.command(index))}"
               f"\n--- last lines of {os.path.join(d, 'train.log')}:\n"
               + _tail(os.path.join(d, "train.log")))
    return {"index": index, "name": name, "status": outcome, "returncode": returncode,
            "seconds": round(seconds, 1)}

  def run(self, indices: Sequence[int] | None = None, parallel: int = 1,
          devices_per_point: int = 0, log=print) -> list[dict]:
    """Run the points not yet done, `parallel` at a time; returns one status dict per point."""
    import time
    indices = list(range(len(self.points)) if indices is None else indices)
    for i in indices:
      if not 0 <= i < len(self.points):
        raise IndexError(f"point {i}: this sweep has points 0..{len(self.points) - 1}")
    results: dict[int, dict] = {}
    todo = []
    for i in indices:
      if self.status(i) == "done":
        results[i] = {"index": i, "name": point_name(self.points[i]), "status": "skipped (done)"}
        log(f"[{i}] {point_name(self.points[i])}: already done, skipped")
      else:
        todo.append(i)
    running: dict[int, tuple] = {}   # slot -> (index, proc, log file, start time)
    free = list(range(max(1, parallel)))
    while todo or running:
      while todo and free:
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
        results[i] = self._finish(i, proc.returncode, time.time() - start)
        log(f"[{i}] {results[i]['name']}: {results[i]['status']} "
            f"(exit {proc.returncode}, {results[i]['seconds']} s)")
        del running[slot]
        free.append(slot)
    ordered = [results[i] for i in indices]
    if self._main and len(indices) == len(self.points):  # array tasks (--point) would race
      _write(os.path.join(self.sweep_dir, "status.json"), json.dumps(ordered, indent=1) + "\n")
    return ordered

  def slurm_script(self, options: Sequence[str] = (), max_concurrent: int = 0) -> str:
    """A SLURM array job: task i runs `scripts/sweep.py ... --point i` (one point per task)."""
    import shlex
    sweep_py = os.path.join(os.path.dirname(os.path.abspath(self.train_script)), "sweep.py")
    path, arg = split_config_arg(self.config_spec)
    config = os.path.abspath(path) + (f":{arg}" if arg is not None else "")
    last = len(self.points) - 1
    array = f"0-{last}" + (f"%{max_concurrent}" if max_concurrent else "")
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name={os.path.basename(self.sweep_dir)}",
             f"#SBATCH --array={array}",
             f"#SBATCH --output={os.path.join(self.sweep_dir, 'slurm', '%A_%a.out')}",
             *[f"#SBATCH {o}" for o in options],
             "",
             f"# {len(self.points)} points of {self.config_spec}; see {self.sweep_dir}/sweep.json.",
             "# Submit: sbatch " + os.path.join(self.sweep_dir, "sweep.sbatch"),
             "# Re-submitting skips finished points; each task resumes its point's checkpoint.",
             f"cd {shlex.quote(os.getcwd())}",
             "srun " + " ".join(shlex.quote(a) for a in [
                 self.python, sweep_py, "--config", config, "--workdir", self.sweep_dir,
                 *self.extra_flags]) + " --point $SLURM_ARRAY_TASK_ID",
             ""]
    os.makedirs(os.path.join(self.sweep_dir, "slurm"), exist_ok=True)
    path = os.path.join(self.sweep_dir, "sweep.sbatch")
    _write(path, "\n".join(lines))
    return path


def report(sweep_dir: str, metric: str = "bleu", lower: bool | None = None) -> dict:
  """`report.csv`, `report.md` and `report_<metric>.png` in the sweep directory."""
  with open(os.path.join(sweep_dir, "sweep.json")) as f:
    points = [p["overrides"] for p in json.load(f)["points"]]
  rows, fields = collect(sweep_dir, points)
  rows = sort_rows(rows, metric, lower)
  prefix = os.path.join(sweep_dir, "report")
  files = write_table(rows, fields, metric, prefix)
  png = plot(rows, fields, metric, os.path.join(sweep_dir, f"report_{metric}.png"))
  if png:
    files.append(png)
  with open(prefix + ".md") as f:
    table = f.read()
  return {"rows": rows, "fields": fields, "files": files, "markdown": table}
