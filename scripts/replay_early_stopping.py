r"""Where early stopping would have stopped finished runs: a patience (and min_delta) chosen from
their metrics.jsonl, before the next sweep spends the steps.

    python scripts/replay_early_stopping.py --workdir runs/locale_ende_long --metric eval_loss \
        --patience 2,3,5 --min_delta 0,0.01
    python scripts/replay_early_stopping.py --patience 3 runs/sweep/*/   # a sweep's points

Runs are the `--workdir` flags and the arguments. For each run, each patience and each
min_delta (every combination), the count that `config.early_stopping_patience` keeps
(run/early_stopping.py) is replayed over the run's recorded evaluations of `--metric`
(default: the run's keep_best): the step where it would have stopped, the count's best then,
the best evaluation of the whole run, and the steps it would have saved. Only a stop before
the run's `num_train_steps` (its config now) counts, as in the training loop: at that step a
run ends anyway. A run still training is replayed as far as it got ("trained to"). Nothing is
trained or read but metrics.jsonl and config.json. Prints a Markdown table, then one JSON line
per row.
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
  if metric not in BEST_METRICS:
    raise RunError(f"--metric={metric}: expected one of {sorted(BEST_METRICS)}")
  return metric


def rows(workdir: str, metric: str | None, patiences: list[int],
         min_deltas: list[float]) -> list[dict]:
  """One row per (patience, min_delta) for the run in `workdir`."""
  records = metrics_lib.read_metrics(workdir)
  if not records:
    raise RunError(f"{os.path.join(workdir, 'metrics.jsonl')} holds no records: is {workdir} "
                   "the workdir of a training run?")
  run = workdir_lib.load_run_config(workdir)  # a training run's workdir, or a clear error
  metric = _metric(run, workdir, metric)
  evaluations = [r for r in records if "step" in r and r.get(metric) is not None]
  if not evaluations:
    raise RunError(f"{workdir}'s metrics.jsonl has no evaluation of {metric}: choose a metric "
                   "it logged (bleu needs bleu_every_steps, the eval_ metrics eval_every_steps)")
  trained = max(int(r["step"]) for r in records if "step" in r)
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
  all_rows = [row for w in workdirs
              for row in rows(w.rstrip("/") or w, values.metric, patiences, min_deltas)]
  print(table(all_rows))
  for row in all_rows:
    print(json.dumps(row), flush=True)
  return 0


def main(argv=None):
  return cli.run(body, argv, doc=__doc__, define=define, positional=True)


if __name__ == "__main__":
  sys.exit(main())
