r"""Plot the learning curves of one or more runs from their metrics.jsonl, as one PNG.

    python scripts/plot_metrics.py --workdir runs/locale_ende
    python scripts/plot_metrics.py --workdir runs/a --workdir runs/b --label pre --label post \
        --out runs/compare.png

Six panels: train and validation loss, validation BLEU and the learning rate, each against the
step and against wall time (hours since the run's first record). Several runs are overlaid with
a legend (labels: `--label`, one per run and no two alike; by default the workdir's name, with
its parent directories where two names are alike: `a/run`, `b/run`). Works on a run still in
progress and on a resumed run (one point per step). Default --out: <first workdir>/curves.png;
its extension picks the format (.png, .pdf, .svg, ...; none: .png is added), and the JSON line
printed names the file written.
"""
import json
import os
import sys

from absl import flags

from transformer_jax import cli
from transformer_jax.run import curves
from transformer_jax.run import workdir as workdir_lib
from transformer_jax.run.workdir import RunError


def define(values):
  flags.DEFINE_multi_string("workdir", None, "a run's directory (repeatable)", flag_values=values)
  flags.mark_flag_as_required("workdir", flag_values=values)
  flags.DEFINE_multi_string("label", [], "legend label per --workdir (default: its name)",
                            flag_values=values)
  flags.DEFINE_string("out", None, "the image, its format by its extension (default: "
                      "<first workdir>/curves.png)",
                      flag_values=values)
  flags.DEFINE_string("title", "", "a title over the panels", flag_values=values)


def body(values, args):
  workdirs = values.workdir
  labels = values.label or curves.default_labels(workdirs)
  if len(labels) != len(workdirs):
    raise RunError(f"{len(labels)} --label for {len(workdirs)} --workdir: give one per run")
  for i, label in enumerate(labels):
    if label in labels[:i]:  # one curve would silently hide the other run
      raise RunError(f"two runs are labelled {label!r} ({workdirs[labels.index(label)]} and "
                     f"{workdirs[i]}): give each --workdir its own --label")
  # Before anything is read or drawn: what it would write, or why not.
  out = curves.output_path(values.out or os.path.join(workdirs[0], "curves.png"),
                           [os.path.join(w, name) for w in workdirs
                            for name in ("metrics.jsonl", workdir_lib.CONFIG)])
  runs = {}
  for label, workdir in zip(labels, workdirs):
    series = curves.load_series(workdir)
    if not series:
      holds = workdir_lib.holds_runs(workdir)
      raise RunError(workdir_lib.not_a_run(workdir) or (
          f"{holds}, not one: give each run to plot as a --workdir of its own" if holds else
          f"{os.path.join(workdir, 'metrics.jsonl')} holds no metrics: is {workdir} the "
          "workdir of a training run (one that has logged a step)?"))
    runs[label] = series
  drawn = curves.plot_runs(runs, out, values.title)
  print(json.dumps({"out": out, "curves": drawn}), flush=True)
  return 0


def main(argv=None):
  return cli.run(body, argv, doc=__doc__, define=define)


if __name__ == "__main__":
  sys.exit(main())
