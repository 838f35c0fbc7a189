r"""Compare training runs made one by one: one row per run, the config fields they differ in as
columns, then status, step, metrics, evaluate.py scores and the best evaluation, best first.

    python scripts/compare_runs.py runs/default runs/post_ln_lr1
    python scripts/compare_runs.py runs/ --metric test_bleu            # every run under runs/
    python scripts/compare_runs.py runs/ende_seed* --metric test_bleu --out runs/seeds
    python scripts/compare_runs.py runs/a runs/b --field model.d_model --field learning_rate
    python scripts/compare_runs.py runs/ --ignore data.data_dir    # runs from two machines
    python scripts/compare_runs.py runs/ --metric test_bleu --averaged --beam_size 4
                                                  # by the averaged checkpoints' beam-4 BLEU

Each argument is a run's workdir (it holds config.json), a sweep's directory (its started
points) or a directory of those, one level down. The columns are found from the runs' configs
(the config each trains with now; a field added since a run was made reads as what it did):
`--field` adds a field every run shares, `--ignore` leaves out one they differ in by accident
(`data.data_dir` of runs made on two machines). Runs that differ in `seed` alone are also
summed up over their seeds (mean, sample standard deviation, range; finished runs only), as a
sweep report's seeds are. `--metric` sorts (losses lowest first; `--lower_is_better` to choose), and
takes what training logged (`bleu`, `eval_loss`, ...) or evaluate.py's latest score per split
(`test_bleu`, `test_chrf`): of any checkpoint and search, or with `--averaged` (`--noaveraged`)
of the average of checkpoints (of a single checkpoint) only, with `--beam_size N` of that
search only; `test_search` says which one each figure is of. `--paired` (with `--metric
<split>_bleu`) adds each run's paired bootstrap p-value against the run with the highest BLEU
on the same references (`<split>_p_vs_best`). Prints the Markdown table;
`--out PREFIX` also writes PREFIX.csv (every metric, each run's workdir) and PREFIX.md (and
PREFIX_seeds.csv/.md); a PREFIX that names a directory (`runs/`) is refused.
"""
import sys

from absl import flags

from transformer_jax import cli
from transformer_jax.sweeps import SweepError
from transformer_jax.sweeps.compare import compare


def define(values):
  v = {"flag_values": values}
  flags.DEFINE_string("metric", "bleu", "the metric to sort by", **v)
  flags.DEFINE_bool("lower_is_better", None, "sort ascending (default: losses)", **v)
  flags.DEFINE_multi_string("field", [], "a config field to show although no run differs in "
                            "it (repeatable)", **v)
  flags.DEFINE_multi_string("ignore", [], "a config field the runs differ in by accident, left "
                            "out of the columns and of the seed grouping (repeatable)", **v)
  flags.DEFINE_string("out", None, "write PREFIX.csv and PREFIX.md", **v)
  cli.define_evaluations(values)


def body(values, args):
  if not args:
    print("error: give the runs to compare: their workdirs, sweep directories, or a directory "
          "of them (e.g. runs/)", file=sys.stderr)
    return 2
  try:
    choice = cli.evaluations(values)
    out = compare(args, values.metric, values.lower_is_better, values.field, values.out,
                  values.ignore, choice, values.paired)
  except SweepError as e:  # a misspelt --metric, a beam of 0
    print(f"error: {e}", file=sys.stderr)
    return 1
  print(out["markdown"], end="")
  for warning in out["warnings"]:
    print(f"warning: {warning}", file=sys.stderr)
  if out["files"]:
    print("wrote " + ", ".join(out["files"]), file=sys.stderr)
  return 0


def main(argv=None):
  return cli.run(body, argv, doc=__doc__, define=define, positional=True)


if __name__ == "__main__":
  sys.exit(main())
