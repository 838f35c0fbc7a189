r"""Where early stopping would have stopped finished runs: a patience (and min_delta) chosen from
their metrics.jsonl, before the next sweep spends the steps.

    python scripts/replay_early_stopping.py --workdir runs/locale_ende_long --metric eval_loss \
        --patience 2,3,5 --min_delta 0,0.01
    python scripts/replay_early_stopping.py --patience 3 runs/sweep/*/   # a sweep's points

Runs are the `--workdir` flags and the arguments, each a run's workdir, a sweep's directory (its
started points) or a directory of those, as compare_runs.py takes them (a run named twice counts
once). One that has nothing to replay (no metrics yet, no evaluation of the metric, no run at
all: a sweep's slurm/) is named in a warning on stderr; the others are replayed. For each run,
each patience and each min_delta (every combination), the count that
`config.early_stopping_patience` keeps (run/early_stopping.py) is replayed over the run's
recorded evaluations of `--metric` (default: the run's keep_best): the step where it would have
stopped, the count's best then, the best evaluation of the whole run, and the steps it would
have saved. Only a stop before the run's `num_train_steps` (its config now) counts, as in the
training loop: at that step a run ends anyway. A run still training is replayed as far as it
got ("trained to"). Nothing is trained or read but metrics.jsonl and config.json. Prints a
Markdown table, then one JSON line per row.
"""
import json
import os
import sys

from absl import flags

from transformer_jax import cli
from transformer_jax.experiment import BEST_METRICS
from transformer_jax.run import early_stopping
from transformer_jax.run import metrics as metrics_lib
from transformer_jax.run import workdir as workdir_lib
from transformer_jax.run.workdir import RunError
from transformer_jax.sweeps.compare import find_runs


def define(values):
  flags.DEFINE_multi_string("workdir", [], "a run's directory (repeatable; or as arguments)",
                            flag_values=values)
  flags.DEFINE_string("metric", None, f"one of {sorted(BEST_METRICS)} (default: each run's "
                      "keep_best)", flag_values=values)
  flags.DEFINE_list("patience", None, "evaluations without a new best, comma-separated values",
                    flag_values=values)
  flags.mark_flag_as_required("patience", flag_values=values)
  flags.DEFINE_list("min_delta", ["0"], "a new best must beat the count's best by more than this; "
                    "comma-separated values", flag_values=values)


def _numbers(flag: str, texts: list[str], kind, least) -> list:
  try:
    values = [kind(t) for t in texts]
  except ValueError:
    values = []
  if not values or any(not least <= v < float("inf") for v in values):
    raise RunError(f"--{flag}={','.join(texts)}: expected comma-separated "
                   f"{'integers >= 1' if kind is int else 'finite numbers >= 0'}")
  return values


def _metric(run: dict, workdir: str, metric: str | None) -> str:
  if metric is None:
    metric = run.get("keep_best") or None
    if metric is None:
      raise RunError(f"{workdir} was trained without keep_best: name the metric to replay, "
                     f"--metric (one of {sorted(BEST_METRICS)})")
  _check_metric(metric)
  return metric


def _check_metric(metric: str) -> None:
  if metric not in BEST_METRICS:
    raise RunError(f"--metric={metric}: expected one of {sorted(BEST_METRICS)}")


def _runs(paths: list[str], warnings: list[str]) -> list[str]:
  """The runs `paths` name (`find_runs`: a run, a sweep's started points, a directory of
  them), each once; a path that names none is a warning, so a glob over a sweep (`*/` takes
  in its slurm/) still replays the rest."""
  found, seen = [], set()
  for path in paths:
    path = path.rstrip("/") or path
    try:
      runs = find_runs([path], warnings)
    except RunError as e:
      warnings.append(workdir_lib.not_a_run(path) if not os.path.exists(path) else str(e))
      continue
    for run in runs:
      if os.path.realpath(run) not in seen:
        seen.add(os.path.realpath(run))
        found.append(run)
  return found


def rows(workdir: str, metric: str | None, patiences: list[int],
         min_deltas: list[float]) -> list[dict]:
  """One row per (patience, min_delta) for the run in `workdir`; a RunError where it has
  nothing to replay (yet)."""
  records = metrics_lib.read_metrics(workdir)
  if not records:
    raise RunError(f"{workdir} has no metrics yet ({os.path.join(workdir, 'metrics.jsonl')} "
                   "holds no step): nothing to replay until it has logged evaluations")
  try:
    run = workdir_lib.load_run_config(workdir)  # a training run's workdir, or a clear error
  except ValueError as e:  # json.JSONDecodeError: a half-written or edited file
    raise RunError(f"{workdir_lib.run_config_path(workdir)} is not valid JSON ({e}): mend or "
                   "remove that file") from None
  metric = _metric(run, workdir, metric)
  evaluations = [r for r in records if r.get(metric) is not None]
  if not evaluations:
    raise RunError(f"{workdir}'s metrics.jsonl has no evaluation of {metric} (yet): choose a "
                   "metric it logged (bleu needs bleu_every_steps, the eval_ metrics "
                   "eval_every_steps), or wait for a run still training to evaluate")
  trained = max(r["step"] for r in records)
  # The loop stops early only before num_train_steps (the run's config now: a resume may have
  # changed it); at that step the run ends anyway.
  target = int(run["num_train_steps"])
  # The run's best evaluation: the count's best with no min_delta, after every record.
  best = early_stopping.from_records(metric, 1, records, trained)
  out = []
  for patience in patiences:
    for min_delta in min_deltas:
      stop, state = early_stopping.replay(metric, patience, records, min_delta)
      early = stop is not None and stop < target
      out.append({
          "workdir": workdir, "metric": metric, "patience": patience, "min_delta": min_delta,
          "stop_step": stop if early else None, "num_train_steps": target,
          "trained_to": trained, "steps_saved": target - stop if early else 0,
          "count_best_step": state.best_step, "count_best_value": state.best_value,
          "run_best_step": best.best_step, "run_best_value": best.best_value,
          "evaluations": len(evaluations)})
  return out


def table(all_rows: list[dict]) -> str:
  def value(v):
    return "" if v is None else f"{v:.4f}"
  lines = ["| run | metric | patience | min_delta | stops at | num_train_steps (trained to) | "
           "count's best (step) | run's best (step) |", "|---|---|---|---|---|---|---|---|"]
  for r in all_rows:
    stop = r["stop_step"]
    if stop is None:  # a run still training, or one that stopped early itself, ends sooner
      stop = ("does not stop" if r["trained_to"] >= r["num_train_steps"] else
              f"not by step {r['trained_to']}")
    lines.append(
        f"| {r['workdir']} | {r['metric']} | {r['patience']} | {r['min_delta']:g} | {stop} | "
        f"{r['num_train_steps']} ({r['trained_to']}) | {value(r['count_best_value'])} "
        f"({r['count_best_step']}) | {value(r['run_best_value'])} ({r['run_best_step']}) |")
  return "\n".join(lines)


def body(values, args):
  patiences = _numbers("patience", values.patience, int, 1)
  min_deltas = _numbers("min_delta", values.min_delta, float, 0.0)
  workdirs = values.workdir + list(args)
  if not workdirs:
    raise RunError("no run to replay: give --workdir DIR (repeatable) or the runs' directories "
                   "as arguments")
  if values.metric is not None:
    _check_metric(values.metric)  # the same mistake for every run: one error
  warnings: list[str] = []
  all_rows = []
  for workdir in _runs(workdirs, warnings):
    try:
      all_rows += rows(workdir, values.metric, patiences, min_deltas)
    except RunError as e:
      warnings.append(f"{e} (left out)")
  if not all_rows:
    if len(warnings) == 1:
      raise RunError(warnings[0].removesuffix(" (left out)"))
    _warn(warnings)
    raise RunError(f"nothing to replay in {' '.join(workdirs)}: see the warnings above")
  print(table(all_rows))
  for row in all_rows:
    print(json.dumps(row), flush=True)
  _warn(warnings)
  return 0


def _warn(warnings: list[str]) -> None:
  for warning in warnings:
    print(f"replay_early_stopping: warning: {warning}", file=sys.stderr, flush=True)


def main(argv=None):
  return cli.run(body, argv, doc=__doc__, define=define, positional=True)


if __name__ == "__main__":
  sys.exit(main())
