"""A sweep's report: one row per point with its fields, status and last metrics (and, for runs
with `config.keep_best`, the best evaluation's value and step, `best_bleu` and `best_bleu_step`;
`stopped_early`, the step where early stopping ended a run), sorted by one metric, as
`report.csv`, `report.md` and a plot of the metric against each swept field; where a setting ran
with several seeds, their mean and spread as `report_seeds.csv/.md`."""
from __future__ import annotations

import csv
import dataclasses
import difflib
import io
import json
import math
import os
import re
import statistics
from typing import Sequence

from transformer_jax import bleu as bleu_lib
from transformer_jax.experiment import BEST_METRICS
from transformer_jax.files import save_figure, write_atomically
from transformer_jax.run.best import BestKeeper, best_dir
from transformer_jax.run.early_stopping import stopped_at
from transformer_jax.run.metrics import MAIN_METRICS, last_values
from transformer_jax.run.workdir import EVAL, EVAL_LOG
from transformer_jax.sweeps.runner import status
from transformer_jax.sweeps.spec import Point, SweepError, point_dir, point_key, point_name


def lower_is_better(metric: str) -> bool:
  return any(word in metric for word in ("loss", "nll", "perplexity", "time", "error"))


@dataclasses.dataclass(frozen=True)
class Evaluations:
  """Which scripts/evaluate.py results a row's `<split>_bleu` may come from (the latest of
  those): `averaged` True for the average of checkpoints only (`evaluate.py --averaged`, the
  paper's final model), False for single checkpoints only, None for either; `beam_size` one
  search's (1: greedy), None for any. The default takes every result, as evaluate every point
  alike."""
  averaged: bool | None = None
  beam_size: int | None = None

  def __post_init__(self):
    if self.beam_size is not None and self.beam_size < 1:
      raise SweepError(f"--beam_size {self.beam_size}: a beam holds 1 hypothesis or more "
                       "(1 is greedy search); leave it out to take every search")

  def matches(self, result: dict) -> bool:
    if self.averaged is not None and isinstance(result.get("averaged_steps"), list) != (
        self.averaged):
      return False
    return self.beam_size is None or result.get("beam_size") == self.beam_size

  def describe(self) -> str:
    """`an averaged checkpoint with beam 4`, `a single checkpoint with greedy search`."""
    what = {None: "a checkpoint", True: "an averaged checkpoint",
            False: "a single checkpoint"}[self.averaged]
    if self.beam_size is not None:
      what += " with " + ("greedy search" if self.beam_size == 1 else f"beam {self.beam_size}")
    return what

  def flags(self) -> str:
    """The scripts/evaluate.py flags that make such a result."""
    return " ".join([*(["--averaged"] if self.averaged else []),
                     *([f"--beam_size {self.beam_size}"] if self.beam_size else [])])


EVERY = Evaluations()   # every result: the default


def collect(sweep_dir: str, points: list[Point], steps: Sequence[int | None],
            choice: Evaluations = EVERY, passed: list[tuple[str, str]] | None = None
            ) -> tuple[list[dict], list[str]]:
  """One row per point: its fields, status and last metrics; and the swept field names.
  `steps`: each point's num_train_steps as sweep.json records it (`_recorded`), which a point
  must have trained to be done (None: any DONE marker counts)."""
  fields: list[str] = []
  for p in points:
    fields += [k for k in p if k not in fields]
  rows = [run_row(point_dir(sweep_dir, p),
                  {"name": point_name(p), **{k: p.get(k) for k in fields}}, n,
                  choice=choice, passed=passed) for p, n in zip(points, steps)]
  return rows, fields


def run_row(workdir: str, row: dict, num_train_steps: int | None = None,
            choice: Evaluations = EVERY, passed: list[tuple[str, str]] | None = None) -> dict:
  """`row` (a name and field values) with what the run in `workdir` did: its status (`status`,
  with `num_train_steps` for a run no sweep marked), its last logged metrics, its latest
  evaluate.py scores per split (of those `choice` takes; a split with none of them is named
  in `passed`, as `evaluated` says), keep_best's best evaluation and its step, the step early
  stopping ended it at, and a failed run's log."""
  row = {**row, "status": status(workdir, num_train_steps)}
  # A field keeps its value where a metric has the same name (learning_rate is both).
  row.update({k: v for k, v in last_values(workdir).items() if k not in row})
  row.update({k: v for k, v in evaluated(workdir, choice, passed).items() if k not in row})
  for name in BEST_METRICS:  # config.keep_best's: the best evaluation, beside the last one
    if os.path.isdir(best_dir(workdir, name)):
      kept = BestKeeper(workdir, name)
      if kept.step is not None:
        row.update({f"best_{name}": kept.value, f"best_{name}_step": kept.step})
  stop = stopped_at(workdir)
  if stop is not None:  # config.early_stopping_patience ended it at this step
    row["stopped_early"] = stop
  if row["status"] == "failed":
    row["log"] = os.path.join(workdir, "train.log")  # FAILED beside it: the exit and the tail
  return row


def evaluated(workdir: str, choice: Evaluations = EVERY,
              passed: list[tuple[str, str]] | None = None) -> dict:
  """`<split>_bleu`, `<split>_chrf` and `<split>_tokenized_bleu` (`test_bleu`, `newstest_chrf`)
  of the latest scripts/evaluate.py result per split or test set in
  `<workdir>/eval/results.jsonl` that `choice` takes (by default whatever its checkpoint and
  search: evaluate every point alike), `<split>_bleu_ci95` (its BLEU's 95% bootstrap interval)
  and `<split>_search`, which they were (`_search`), and `<split>_hypotheses` and
  `<split>_references`, its files (None where gone); copy baselines and ensembles (the point's
  model with others' checkpoints, evaluate.py --ensemble) left out. A split whose results
  `choice` all passes over is named in `passed`, as (the split, a line for the user with the
  command that would make one)."""
  out: dict = {}
  path = os.path.join(workdir, EVAL, EVAL_LOG)
  if not os.path.exists(path):
    return out
  skipped: dict[str, int] = {}   # split -> results `choice` passed over
  with open(path, encoding="utf-8") as f:
    for line in f:
      try:
        result = json.loads(line)
      except ValueError:  # a line cut short by a crash
        continue
      if (not isinstance(result, dict) or result.get("baseline") or result.get("ensemble")
          or "split" not in result):
        continue
      if not choice.matches(result):
        skipped[result["split"]] = skipped.get(result["split"], 0) + 1
        continue
      for score in ("bleu", "bleu_ci95", "chrf", "tokenized_bleu"):
        if isinstance(result.get(score), (int, float)):
          out[f"{result['split']}_{score}"] = result[score]
        else:  # a later result without it (too many sentences, an older run's) has none
          out.pop(f"{result['split']}_{score}", None)
      out[f"{result['split']}_search"] = search_text(result)
      for kind in ("hypotheses", "references"):  # for a paired test (`paired_tests`)
        out[f"{result['split']}_{kind}"] = _eval_file(workdir, result.get(kind))
  make = f"python scripts/average_checkpoints.py --workdir {workdir}, then " * bool(choice.averaged)
  for split, count in skipped.items():
    if f"{split}_search" not in out and passed is not None:
      passed.append((split, f"{workdir}: none of its {count} {split} results of evaluate.py "
                            f"is of {choice.describe()}: its {split}_bleu is left empty ({make}"
                            f"python scripts/evaluate.py --workdir {workdir} --split {split}"
                            f"{' ' * bool(choice.flags())}{choice.flags()} makes one)"))
  return out


def _eval_file(workdir: str, path) -> str | None:
  """A hypotheses or references file an evaluate.py result names: as recorded, or, where the
  run was moved or copied since, the same file under this workdir's eval/; None if neither
  exists."""
  if not isinstance(path, str):
    return None
  if os.path.isfile(path):
    return path
  _, sep, tail = path.rpartition(os.sep + EVAL + os.sep)
  moved = os.path.join(workdir, EVAL, tail)
  return moved if sep and os.path.isfile(moved) else None


def paired_split(metric: str) -> str:
  """The split whose BLEU `metric` is (`test` of `test_bleu`), which --paired tests; a
  SweepError for any other metric."""
  split = _EVALUATED.fullmatch(metric)
  if (not split or not metric.endswith("_bleu") or metric.endswith("_tokenized_bleu")
      or split.group(1) == "best"):   # keep_best's best_bleu: no hypotheses behind it
    raise SweepError(f"--paired tests the BLEU of evaluate.py results: give --metric "
                     f"<split>_bleu (test_bleu), not --metric {metric}")
  return split.group(1)


def paired_tests(rows: list[dict], metric: str, warnings: list[str]) -> None:
  """`<split>_p_vs_best` in each row with a `metric` (`<split>_bleu`, an evaluate.py score):
  the paired bootstrap p-value (sacreBLEU's --paired-bs, `bleu.paired_bootstrap`) of its
  hypotheses against those of the row with the best BLEU on the same references (`-` there),
  so that runs on other test sets (another language pair) are each compared within their own.
  Best is the highest BLEU, whatever the table's sort; unfinished runs count as they stand. A
  row whose files are gone or cannot be read, or with no other row on its references, gets
  none; the first is named in `warnings`, and where it had a higher BLEU than the baseline of
  its references (of every baseline, where its references are unknown), that too."""
  name = paired_split(metric)
  groups: dict[tuple, list] = {}
  untested: list[tuple[dict, tuple | None]] = []   # (row, its references where readable)

  def read(path):
    try:
      return bleu_lib.read_lines(path) if path is not None else None
    except (OSError, UnicodeDecodeError):
      return None

  for r in rows:
    if not _number(r.get(metric)):
      continue
    hypotheses, references = r.get(f"{name}_hypotheses"), r.get(f"{name}_references")
    hyps, refs = read(hypotheses), read(references)
    if hypotheses is None or references is None:
      warnings.append(f"{r['name']}: its {name} result's hypotheses or references file is "
                      "gone (or the result is older than they are): no paired test; run "
                      "scripts/evaluate.py again to write them")
    elif hyps is None or refs is None:
      warnings.append(f"{r['name']}: its {name} result's files cannot be read ({hypotheses}, "
                      f"{references}: not UTF-8 text, or not readable): no paired test")
    elif len(hyps) != len(refs):
      warnings.append(f"{r['name']}: {hypotheses} has {len(hyps)} lines, {references} "
                      f"{len(refs)}: no paired test")
    else:
      groups.setdefault(tuple(refs), []).append((r, hyps))
      continue
    untested.append((r, None if refs is None else tuple(refs)))
  for refs, members in groups.items():
    if len(members) < 2:
      continue
    members.sort(key=lambda m: -float(m[0][metric]))  # the best first: the baseline
    p_values = bleu_lib.paired_bootstrap([h for _, h in members], list(refs))
    if p_values[1] is None:  # too many sentences (BOOTSTRAP_MAX_SENTENCES)
      warnings.append(f"{len(refs):,} {name} sentences: over "
                      f"{bleu_lib.BOOTSTRAP_MAX_SENTENCES:,}, no paired test")
      continue
    for (r, _), p in zip(members, p_values):
      r[f"{name}_p_vs_best"] = "-" if p is None else p
    base = members[0][0]
    above = [u["name"] for u, theirs in untested if theirs in (None, refs)
             and float(u[metric]) > float(base[metric])]
    if above:  # a better run that could not be tested: the baseline is not the best
      warnings.append(f"{', '.join(above)}: a higher {metric} than {base['name']}, but not "
                      f"tested; the p-values on {base['name']}'s references are against "
                      f"{base['name']}, the best of the runs that could be tested")


def search_text(result: dict) -> str:
  """Which checkpoint and search an evaluate.py result is of: `beam 4, alpha 0.6, average of 5
  to step 1500`, `greedy, step 1000` (the column beside a sweep report's <split>_bleu)."""
  beam = result.get("beam_size")
  if not isinstance(beam, int):
    return ""   # not written by evaluate.py
  search = "greedy" if beam == 1 else f"beam {beam}, alpha {result.get('alpha')}"
  averaged = result.get("averaged_steps")
  step = result.get("step")
  where = (f"average of {len(averaged)} to step {step}" if isinstance(averaged, list)
           else f"step {step}")
  return f"{search}, {where}"


# The names `evaluated` gives: <split>_<score>, the split as group 1 (`test_tokenized_bleu`).
_EVALUATED = re.compile(r"([A-Za-z0-9][A-Za-z0-9_.-]*?)_(?:tokenized_bleu|bleu|chrf)")


def _evaluated_name(metric: str) -> bool:
  """Whether `metric` is a name `evaluated` gives (`test_bleu`, `newstest_chrf`)."""
  return _EVALUATED.fullmatch(metric) is not None


def sort_rows(rows: list[dict], metric: str, lower: bool | None = None) -> list[dict]:
  """Best first by `metric`; rows without it (failed, not started) last."""
  lower = lower_is_better(metric) if lower is None else lower
  def key(row):  # (missing, value): False sorts first
    v = row.get(metric)
    if not isinstance(v, (int, float)) or (isinstance(v, float) and math.isnan(v)):
      return (True,)
    return (False, v if lower else -v)
  return sorted(rows, key=key)


def _columns(rows: list[dict], fields: list[str], metric: str) -> list[str]:
  preferred = ["name", *fields, "status", "step", "stopped_early", metric, f"best_{metric}",
               f"best_{metric}_step", "bleu", "test_bleu", "eval_loss", "eval_accuracy",
               "train_loss", "log"]
  # An evaluate.py score is followed by its interval (BLEU) and the search it is of
  # (`test_bleu`, `test_bleu_ci95`, `test_search`).
  for score in (metric, "test_bleu"):
    split = _EVALUATED.fullmatch(score)
    if split:
      after = [f"{split.group(1)}_bleu_ci95"] * score.endswith("_bleu") + [
          f"{split.group(1)}_search", f"{split.group(1)}_p_vs_best"]
      at = preferred.index(score) + 1
      preferred[at:at] = after
  cols = []
  for c in preferred:
    if c not in cols and any(c in r for r in rows):
      cols.append(c)
  return cols


def _cell(v) -> str:
  if v is None:
    return ""
  if isinstance(v, float):
    return f"{v:.4g}"
  return str(v)


def write_rows(rows: list[dict], csv_columns: list[str], md_columns: list[str],
               out_prefix: str, md_cells: dict | None = None) -> list[str]:
  """`<prefix>.csv` with `csv_columns` and `<prefix>.md` with `md_columns`; returns the paths.

  `md_cells` maps a column to (its Markdown header, a function from a value to its text), for
  columns that read better in other units than the CSV's raw numbers. Each is written whole
  (`write_atomically`): a report rewritten while a crash, a full disk or a power loss strikes
  keeps its last whole version."""
  table = io.StringIO(newline="")
  writer = csv.DictWriter(table, fieldnames=csv_columns, extrasaction="ignore")
  writer.writeheader()
  writer.writerows(rows)
  write_atomically(out_prefix + ".csv", table.getvalue())
  write_atomically(out_prefix + ".md", markdown(rows, md_columns, md_cells))
  return [out_prefix + ".csv", out_prefix + ".md"]


def markdown(rows: list[dict], columns: list[str], md_cells: dict | None = None) -> str:
  """`rows` as a Markdown table of `columns` (`md_cells`: as `write_rows`)."""
  md_cells = md_cells or {}
  def cell(c, v):
    return _cell(v) if v is None or c not in md_cells else md_cells[c][1](v)
  header = [md_cells[c][0] if c in md_cells else c for c in columns]
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(columns)]
  for r in rows:
    lines.append("| " + " | ".join(cell(c, r.get(c)) for c in columns) + " |")
  return "\n".join(lines) + "\n"


def write_table(rows: list[dict], fields: list[str], metric: str, out_prefix: str) -> list[str]:
  """`<prefix>.csv` (every metric) and `<prefix>.md` (the main columns); returns the paths."""
  all_cols = _columns(rows, fields, metric)
  for r in rows:
    all_cols += [k for k in r if k not in all_cols]
  return write_rows(rows, all_cols, _columns(rows, fields, metric), out_prefix)


def plot(rows: list[dict], fields: list[str], metric: str, path: str) -> str | None:
  """One panel per swept field: `metric` against the field's values (PNG, 4 x 3.2 inches a
  panel at 100 dpi); None where no row has the metric or nothing was swept."""
  fig = figure(rows, fields, metric)
  if fig is None:
    return None
  save_figure(fig, path, dpi=100)
  return path


def log_scale(values: list) -> bool:
  """Whether a numeric field's axis is logarithmic: every value positive, spanning 10x or more
  (learning rates, batch sizes in powers of two)."""
  return all(v > 0 for v in values) and max(values) / min(values) >= 10


def figure(rows: list[dict], fields: list[str], metric: str):
  """`plot`'s matplotlib Figure, not saved: one panel per field, in order; numbers on their
  own axis (`log_scale`), anything else as sorted labels, one for each distinct text.

  A bare `Figure` draws without pyplot, so the caller's matplotlib backend is left alone."""
  # Imported here: matplotlib adds about half a second to each import of transformer_jax.sweeps
  # (every SLURM array task, every --list), and only the report draws.
  from matplotlib.figure import Figure

  have = [r for r in rows if isinstance(r.get(metric), (int, float))]
  if not have or not fields:
    return None
  fig = Figure(figsize=(4 * len(fields), 3.2))
  # Flattened, not indexed: one row of panels, one per field.
  for ax, field in zip(fig.subplots(1, len(fields), squeeze=False).ravel(), fields):
    values = [r.get(field) for r in have]
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    if numeric:
      xs = values
      if log_scale(values):
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
  return fig


def _number(v) -> bool:
  return isinstance(v, (int, float)) and not isinstance(v, bool) and not (
      isinstance(v, float) and math.isnan(v))


def _seed_order(v):
  """Numbers in order, then anything else by its text (seeds 2, 10, "a")."""
  return (False, v) if _number(v) else (True, str(v))


def seed_summary(rows: list[dict], fields: list[str], metric: str, lower: bool | None = None,
                 seed_field: str = "seed") -> list[dict]:
  """Points that differ only in `seed_field` merged into one row per setting: the seeds that
  count (done, with a finite `metric`), n, the mean, sample standard deviation, min and max of
  `metric`, and the seeds left out with their status (failed, still running, not started, or
  done with a NaN metric: a diverged run), best mean first.

  [] unless some setting has the metric from two seeds or more: one seed gives no spread, and
  a difference between settings means little until it is compared with the spread. A second
  run of a seed (runs compared by hand can repeat one) is left out, not counted as a seed.
  """
  if seed_field not in fields:
    return []
  others = [f for f in fields if f != seed_field]
  groups: dict[str, list[dict]] = {}
  for r in rows:
    # Grouped by exact values, learning_rate 1 and 1.0 one setting (`point_key`); not by the
    # workdirs' names, which round floats to 6 digits.
    groups.setdefault(point_key({f: r.get(f) for f in others}), []).append(r)

  def counts(r):
    return r.get("status") == "done" and _number(r.get(metric))

  def split(group):
    """(the runs that count, one per seed; the others, each with why it is left out)."""
    used, left, seen = [], [], set()
    for r in sorted(group, key=lambda r: _seed_order(r.get(seed_field))):
      seed = point_name({seed_field: r.get(seed_field)})
      if not counts(r):
        left.append((r, r.get("status") if r.get("status") != "done" else f"{metric} NaN"))
      elif seed in seen:
        left.append((r, "another run of this seed"))
      else:
        seen.add(seed)
        used.append(r)
    return used, left

  if not any(len(split(g)[0]) > 1 for g in groups.values()):
    return []
  out = []
  for group in groups.values():
    used, left = split(group)
    row = {**{f: group[0].get(f) for f in others},
           "seeds": " ".join(str(r.get(seed_field)) for r in used), "n": len(used)}
    values = [float(r[metric]) for r in used]
    if values:
      row.update({f"{metric}_mean": statistics.mean(values),
                  f"{metric}_std": statistics.stdev(values) if len(values) > 1 else float("nan"),
                  f"{metric}_min": min(values), f"{metric}_max": max(values)})
    row["left_out"] = ", ".join(f"{r.get(seed_field)} ({why})" for r, why in left)
    out.append(row)
  return sort_rows(out, f"{metric}_mean", lower_is_better(metric) if lower is None else lower)


def _check_sweep_dir(sweep_dir: str) -> None:
  """A SweepError saying what to pass where `sweep_dir` holds no sweep (not the bare errno)."""
  if os.path.exists(os.path.join(sweep_dir, "sweep.json")):
    return
  if os.path.exists(os.path.join(sweep_dir, "config.json")):
    what = (f"it is one training run: plot its metrics with scripts/plot_metrics.py --workdir "
            f"{sweep_dir}, compare it with other runs with scripts/compare_runs.py {sweep_dir} "
            "OTHER_RUN..., or pass the sweep directory above it")
  elif os.path.isdir(sweep_dir):
    what = ("pass the --workdir a sweep ran in (scripts/sweep.py --config FILE --workdir DIR "
            "writes sweep.json there)")
  else:
    what = "it does not exist: pass the --workdir a sweep ran in"
  raise SweepError(f"{sweep_dir} is not a sweep directory (no sweep.json): {what}")


def check_metric(rows: list[dict], fields: list[str], metric: str, what: str,
                 choice: Evaluations = EVERY,
                 passed: Sequence[tuple[str, str]] = ()) -> str | None:
  """A SweepError for a `metric` none of the rows (`what`s: points, runs) logged, once any
  logged metrics; before that, a warning (a line for the user) for one the trainer does not
  log, or None. `passed`: (split, line) of the runs whose evaluate.py results `choice` passed
  over (`evaluated`), named in the error where they are why the metric's split has no score."""
  logged = sorted({k for r in rows for k, v in r.items()
                   if isinstance(v, (int, float)) and k not in fields and k != "step"})
  split = _EVALUATED.fullmatch(metric)
  lines = [line for s, line in passed if split and s == split.group(1)]
  if logged and metric not in logged and lines:
    raise SweepError(f"--metric {metric}: no {what} has an evaluate.py score of "
                     f"{choice.describe()}; {len(lines)} have others, e.g. {lines[0]}")
  close = difflib.get_close_matches(metric, logged, n=1)
  scored = {_split_of(k) for k in logged} - {None, "best"}  # keep_best's best_bleu is no split
  if (logged and metric not in logged and split and split.group(1) != "best"
      and split.group(1) not in scored and not (close and _split_of(close[0]) in scored)):
    # An evaluate.py score of a split no run was evaluated on (not a misspelt score a run
    # has): "did you mean 'bleu'" would offer training's validation BLEU for a test set's.
    raise SweepError(_not_evaluated(metric, split.group(1), what))
  if logged and metric not in logged:  # a misspelt metric: no column, no plot, no word
    raise SweepError(f"--metric {metric}: no {what} logged it"
                     + (f"; did you mean {close[0]!r}?" if close else ".")
                     + f" The {what}s logged: {', '.join(logged)}")
  if not logged and metric not in MAIN_METRICS and not _evaluated_name(metric):
    # Nothing to check a misspelling against yet: say so rather than sort by a column that
    # may never exist (a metric of one's own, logged later, is still allowed).
    close = difflib.get_close_matches(metric, MAIN_METRICS, n=1)
    return (f"no {what} has logged a metric yet, so --metric {metric} cannot be checked; "
            f"the trainer logs {', '.join(MAIN_METRICS)} and more"
            + (f"; did you mean {close[0]!r}?" if close else ""))
  return None


# scripts/evaluate.py's --split choices (inference.evaluation.SPLITS, which sweeps/ does not
# import); any other <name>_bleu is of a test set of one's own, evaluate.py --name <name>.
_RUN_SPLITS = ("validation", "test")


def _split_of(name: str) -> str | None:
  """The split of an evaluate.py score's name (`test_bleu`: test), else None."""
  match = _EVALUATED.fullmatch(name)
  return match.group(1) if match else None


def _not_evaluated(metric: str, split: str, what: str) -> str:
  """Why --metric `metric`, an evaluate.py score of `split`, has no column, and the command
  that makes one."""
  command = (f"scripts/evaluate.py --workdir W --split {split}" if split in _RUN_SPLITS else
             f"scripts/evaluate.py --workdir W --source SRC --reference REF --name {split}")
  close = difflib.get_close_matches(split, _RUN_SPLITS, n=1) if split not in _RUN_SPLITS else []
  misspelt = f"; or did you mean --metric {close[0]}{metric[len(split):]}?" if close else ""
  return (f"--metric {metric}: no {what} has an evaluate.py result for the {split} split "
          f"({metric} is evaluate.py's score, not one training logs; training's own "
          f"validation BLEU is --metric bleu): run {command} for each {what} W first"
          + misspelt)


def recorded_points(sweep_dir: str) -> list[Point]:
  """The points `sweep.json` in `sweep_dir` records (their overrides), in the sweep's order; a
  SweepError naming the file where it is not a sweep's record."""
  return _recorded(sweep_dir)[0]


def _recorded(sweep_dir: str) -> tuple[list[Point], list[int | None]]:
  """(`recorded_points`, each point's num_train_steps as sweep.json records it: None for a
  sweep.json written before 2026-12-06, whose points count as done on any DONE marker)."""
  path = os.path.join(sweep_dir, "sweep.json")
  try:
    with open(path) as f:
      entries = json.load(f)["points"]
    points = [p["overrides"] for p in entries]
  except (ValueError, KeyError, TypeError) as e:
    raise SweepError(f"{path} is not a sweep's record ({type(e).__name__}: {e}): pass the "
                     "workdirs of its points instead") from None
  steps = [p.get("num_train_steps") if isinstance(p.get("num_train_steps"), int) else None
           for p in entries]
  return points, steps


def check_out_prefix(prefix: str) -> None:
  """A SweepError for a `--out` prefix that names a directory (`runs/`, or one that exists):
  the files would be `runs/.csv` and `runs/.md`, hidden, or sit beside the directory as
  `runs.csv`, where `runs/...` was meant."""
  if prefix.endswith(("/", os.sep)) or os.path.isdir(prefix):
    example = os.path.join(prefix, "compare")
    raise SweepError(f"--out {prefix} names a directory: --out takes the start of the files' "
                     f"names (PREFIX.csv, PREFIX.md): give e.g. --out {example} for "
                     f"{example}.csv and {example}.md")


def tables(rows: list[dict], fields: list[str], metric: str, lower: bool | None = None,
           out_prefix: str | None = None) -> tuple[str, list[dict], list[str]]:
  """The Markdown of `rows` (sorted) and, where a setting has several seeds, of
  `seed_summary`'s rows after it; those rows; and with `out_prefix` the files written:
  `<prefix>.csv/.md` (`write_table`) and `<prefix>_seeds.csv/.md` (an earlier table's seed
  files removed where there are no seeds now)."""
  text = markdown(rows, _columns(rows, fields, metric))
  seeds = seed_summary(rows, fields, metric, lower)
  columns = [*[f for f in fields if f != "seed"], "seeds", "n", f"{metric}_mean",
             f"{metric}_std", f"{metric}_min", f"{metric}_max", "left_out"]
  if seeds:
    text += (f"\nOver seeds ({metric}: mean, sample standard deviation, range):\n\n"
             + markdown(seeds, columns))
  files = []
  if out_prefix:
    files = write_table(rows, fields, metric, out_prefix)
    for stale in (out_prefix + "_seeds.csv", out_prefix + "_seeds.md"):  # an earlier table's
      if os.path.exists(stale):
        os.remove(stale)
    if seeds:
      files += write_rows(seeds, columns, columns, out_prefix + "_seeds")
  return text, seeds, files


def report(sweep_dir: str, metric: str = "bleu", lower: bool | None = None,
           choice: Evaluations = EVERY, paired: bool = False) -> dict:
  """`report.csv`, `report.md` and `report_<metric>.png` in the sweep directory, the
  evaluate.py scores from the results `choice` takes. A `metric` no point logged is an error
  once any point logged metrics; before that, one the trainer does not log gives `warning` (a
  line for the user) in the result; `warnings` (lines) names the points with evaluate.py
  results of which `choice` takes none. `paired`: each point's paired bootstrap p-value against
  the best (`paired_tests`; `metric` must be an evaluate.py BLEU)."""
  _check_sweep_dir(sweep_dir)
  if paired:
    paired_split(metric)   # before reading every point
  passed: list[tuple[str, str]] = []
  points, steps = _recorded(sweep_dir)
  rows, fields = collect(sweep_dir, points, steps, choice, passed)
  warning = check_metric(rows, fields, metric, "point", choice, passed)
  warnings = [line for _, line in passed]
  if paired:
    paired_tests(rows, metric, warnings)
  rows = sort_rows(rows, metric, lower)
  text, seeds, files = tables(rows, fields, metric, lower, os.path.join(sweep_dir, "report"))
  png = plot(rows, fields, metric, os.path.join(sweep_dir, f"report_{metric}.png"))
  if png:
    files.insert(2, png)  # after report.csv and report.md, before the seeds' files
  return {"rows": rows, "fields": fields, "files": files, "markdown": text, "seeds": seeds,
          "warning": warning, "warnings": warnings}
