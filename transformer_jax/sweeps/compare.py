"""Runs made one by one, as one table: a sweep's report for workdirs that no sweep made.

The columns are the config fields in which the runs differ, found in their config.json (the
config each trains with now, fields added since a run was made read as what it did), then each
run's status, last metrics, latest evaluate.py scores, keep_best's best evaluation and where
early stopping ended it (`report.run_row`, the sweep report's row). Runs that differ in `seed`
and nothing else get their mean and spread, as a sweep's seeds do (`report.seed_summary`).
"""
from __future__ import annotations

import difflib
import json
import os
from typing import Sequence

from transformer_jax.run.curves import default_labels
from transformer_jax.run.workdir import (
    CONFIG,
    LAUNCH_FIELDS,
    RunError,
    field_defaults,
    load_run_config,
    recorded_values,
    run_config_path,
    same_run_fields,
)
from transformer_jax.sweeps.report import (
    EVERY,
    Evaluations,
    check_metric,
    check_out_prefix,
    paired_split,
    paired_tests,
    recorded_points,
    run_row,
    sort_rows,
    tables,
)
from transformer_jax.sweeps.spec import point_dir


def _is_run(path: str) -> bool:
  return os.path.isfile(os.path.join(path, CONFIG))


def _sweep_points(sweep_dir: str, warnings: list[str]) -> list[str]:
  """The workdirs of a sweep's points that have started (written their config.json), in the
  sweep's order; the others are named in `warnings`."""
  dirs = [point_dir(sweep_dir, p) for p in recorded_points(sweep_dir)]
  started = [d for d in dirs if _is_run(d)]
  if len(started) < len(dirs):
    warnings.append(f"sweep {sweep_dir}: {len(dirs) - len(started)} of its {len(dirs)} points "
                    f"have no {CONFIG} yet (not started, or failed before it): not shown; "
                    f"scripts/sweep.py --workdir {sweep_dir} --report lists every point")
  return started


def _runs_of(path: str, warnings: list[str]) -> list[str] | None:
  """[path] for a run's workdir, a sweep directory's started points, None for anything else."""
  if _is_run(path):
    return [path]
  if os.path.isfile(os.path.join(path, "sweep.json")):
    return _sweep_points(path, warnings)
  return None


def find_runs(paths: Sequence[str], warnings: list[str] | None = None) -> list[str]:
  """The run workdirs `paths` name: each a run's workdir (it holds config.json), a sweep's
  directory (its points that have started; the others are named in `warnings`), or a
  directory of those one level down (`runs/`). A run named twice (or by a link) counts once; a
  path that holds no run is a RunError saying what it is."""
  warnings = [] if warnings is None else warnings
  found: list[str] = []
  for path in paths:
    runs = _runs_of(path, warnings)
    if runs is not None:
      found += runs
    elif os.path.isdir(path):
      inside, sweeps = [], []
      for child in sorted(os.path.join(path, name) for name in os.listdir(path)):
        runs = _runs_of(child, warnings)
        if runs is None:
          continue
        inside += runs
        if not _is_run(child):
          sweeps.append(child)
      if not inside:
        raise RunError(f"{path} holds no training run: no {CONFIG} in it or in the "
                       "directories directly under it"
                       + (f" (its sweeps {sweeps} have no started point)" if sweeps else "")
                       + ". Pass the workdirs of training runs (each holds config.json), "
                       "sweep directories, or a directory of them")
      found += inside
    elif os.path.exists(path):
      raise RunError(f"{path} is a file: pass the run's workdir (the directory that holds "
                     f"{CONFIG}), a sweep directory, or a directory of them")
    else:
      raise RunError(f"{path} does not exist: pass the workdirs of training runs")
  unique, seen = [], set()
  for run in found:
    key = os.path.realpath(run)
    if key not in seen:
      seen.add(key)
      unique.append(run)
  return unique


def _read(workdir: str, warnings: list[str]) -> dict | None:
  """The run's flat config (`recorded_values`), or None with a warning where its config
  cannot be read (the other runs are still compared)."""
  try:
    run = load_run_config(workdir)
  except RunError as e:  # not a training run's config, or one that does not parse
    warnings.append(f"{e} ({workdir} left out)")
    return None
  config = recorded_values(run)
  unknown = sorted(set(config) - set(field_defaults()))
  if unknown:
    warnings.append(f"{run_config_path(workdir)} has fields this code does not know: "
                    f"{unknown} (another version of transformer-jax made the run): not compared")
  return config


def differing_fields(configs: Sequence[dict]) -> list[str]:
  """The flat config fields (`model.d_model`) this code has whose value is not the same in
  every config of `configs` (`recorded_values` dicts, which hold every such field), in the
  config's order; how a process joined a run (LAUNCH_FIELDS) is left out, and so are fields
  that make the same run (`same_run_fields`: data.split of numbers runs made before and after
  its default moved). Values compare as JSON read them back: 1 equals 1.0 (as sweeps name
  them), a list a list."""
  first, *rest = configs
  same = same_run_fields(*configs)
  return [k for k in field_defaults() if k not in LAUNCH_FIELDS and k not in same
          and any(c[k] != first[k] for c in rest)]


def compare(paths: Sequence[str], metric: str = "bleu", lower: bool | None = None,
            show: Sequence[str] = (), out_prefix: str | None = None,
            ignore: Sequence[str] = (), choice: Evaluations = EVERY,
            paired: bool = False) -> dict:
  """The table of the runs `paths` name (`find_runs`), best `metric` first.

  `show`: config fields to add as columns although every run has the same value; `ignore`:
  fields in which the runs differ by accident (`data.data_dir` of runs made on two machines),
  left out of the columns, so that runs differing in them and `seed` alone are still summed up
  over their seeds. `choice`: which evaluate.py results the `<split>_bleu` columns come from
  (the latest of those; every result by default); `paired`: each run's paired bootstrap
  p-value against the best run on the same references (`report.paired_tests`). With
  `out_prefix`, writes `<prefix>.csv` (every metric), `<prefix>.md` and, where runs differ
  only in `seed`, `<prefix>_seeds.csv/.md`. Returns the rows, the fields, the Markdown, the
  seed rows, the files written and `warnings`: lines for the user (a run left out and why,
  sweep points not started, a metric that cannot be checked yet, a run with evaluate.py
  results none of which `choice` takes, one that cannot be tested paired)."""
  if paired:
    paired_split(metric)   # before reading every run
  if out_prefix:
    check_out_prefix(out_prefix)  # and before the table is made, only to be refused
  known = field_defaults()
  for flag, names in (("--field", show), ("--ignore", ignore)):
    for field in names:
      if field not in known:
        close = difflib.get_close_matches(field, list(known), n=1)
        raise RunError(f"{flag} {field}: no such config field"
                       + (f"; did you mean {close[0]!r}?" if close else ""))
  both = sorted(set(show) & set(ignore))
  if both:
    raise RunError(f"{', '.join(both)}: given to both --field and --ignore; pick one for each")
  warnings: list[str] = []
  runs, configs = [], []
  for workdir in find_runs(paths, warnings):
    config = _read(workdir, warnings)
    if config is not None:
      runs.append(workdir)
      configs.append(config)
  if not runs:
    raise RunError("no run to compare: " + "; ".join(warnings or ["none was found"]))
  fields = [f for f in differing_fields(configs) if f not in ignore]
  fields += [f for f in show if f not in fields]
  rows, passed = [], []
  for label, workdir, config in zip(default_labels(runs), runs, configs):
    values = {f: _cell_value(config.get(f)) for f in fields}
    row = run_row(workdir, {"name": label, **values},
                  num_train_steps=config["num_train_steps"], choice=choice, passed=passed)
    rows.append({**row, "workdir": workdir})
  warnings += [line for _, line in passed]
  warning = check_metric(rows, fields, metric, "run", choice, passed)
  if paired:
    paired_tests(rows, metric, warnings)
  if warning:
    warnings.append(warning)
  rows = sort_rows(rows, metric, lower)
  text, seeds, files = tables(rows, fields, metric, lower, out_prefix)
  return {"rows": rows, "fields": fields, "markdown": text, "seeds": seeds, "files": files,
          "warnings": warnings}


def _cell_value(value):
  """A field's value for the table and the CSV: lists and dicts as JSON (not Python's repr)."""
  return json.dumps(value) if isinstance(value, (list, tuple, dict)) else value
