r"""Run, schedule or report a sweep: the points returned by a config file's `sweep()`.

    # Every point, one after another, each in runs/lr_warmup/<its overrides>/:
    python scripts/sweep.py --config configs/default.py --workdir runs/lr_warmup
    # Four at a time, each on its own 2 devices (GPUs: CUDA_VISIBLE_DEVICES; CPU: 2 fake ones):
    python scripts/sweep.py --config configs/default.py --workdir runs/lr_warmup --parallel 4 \
        --devices_per_point 2
    # A SLURM array job instead (one task per point): writes runs/lr_warmup/sweep.sbatch
    python scripts/sweep.py --config configs/default.py --workdir runs/lr_warmup --slurm \
        --slurm_option=--gres=gpu:1 --slurm_option=--time=04:00:00
    # One point (what each array task runs):
    python scripts/sweep.py --config configs/default.py --workdir runs/lr_warmup --point 3
    # The table (CSV, Markdown) and a plot of BLEU against each swept field:
    python scripts/sweep.py --workdir runs/lr_warmup --report --metric bleu

`--config.FIELD=VALUE` overrides apply to every point. Points already finished (a `DONE`
marker) are skipped on a re-run; failed ones (a `FAILED` file with the exit status and the log's
tail) and stopped ones (exit 0 before the last step: SIGTERM) are run again and resume from their
checkpoint. The exit status is 1 if any point failed.
"""
import os
import sys

from absl import flags
from ml_collections import config_flags

from transformer_jax import cli, sweeps

TRAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train.py")


def define(values):
  v = {"flag_values": values}
  flags.DEFINE_string("workdir", None, "the sweep's directory", **v)
  flags.mark_flag_as_required("workdir", **v)
  flags.DEFINE_multi_integer("point", None, "run only this point (repeatable); default all", **v)
  flags.DEFINE_integer("parallel", 1, "points running at once", **v)
  flags.DEFINE_integer("devices_per_point", 0, "K devices per running point (0: all)", **v)
  flags.DEFINE_bool("slurm", False, "write sweep.sbatch, run nothing", **v)
  flags.DEFINE_multi_string("slurm_option", [], "an #SBATCH line, e.g. --gres=gpu:8", **v)
  flags.DEFINE_integer("slurm_max_concurrent", 0, "most array tasks at once (0: all)", **v)
  flags.DEFINE_bool("list", False, "print the points and their status", **v)
  flags.DEFINE_bool("report", False, "write report.csv/.md/.png", **v)
  flags.DEFINE_string("metric", "bleu", "report: the metric to sort and plot", **v)
  flags.DEFINE_bool("lower_is_better", None, "report: sort ascending (default: losses)", **v)


def body(values, args):
  if args:
    print(f"error: unexpected arguments {args}", file=sys.stderr)
    return 2
  if values.report:
    out = sweeps.report(values.workdir, values.metric, values.lower_is_better)
    print(out["markdown"], end="")
    print("wrote " + ", ".join(out["files"]), file=sys.stderr)
    return 0
  if values.config is None:
    print("error: --config is required unless --report", file=sys.stderr)
    return 2
  try:
    runner = sweeps.Runner(values["config"].config_filename, values.workdir, TRAIN,
                           config_flags.get_override_values(values["config"]))
  except sweeps.SweepError as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  if values.list:
    for i, p in enumerate(runner.points):
      print(f"{i}\t{runner.status(i)}\t{sweeps.point_name(p)}")
    return 0
  if values.slurm:
    path = sweeps.write_sbatch(runner, values.slurm_option, values.slurm_max_concurrent)
    print(f"wrote {path} ({len(runner.points)} points): submit with  sbatch {path}")
    return 0
  results = runner.run(values.point, parallel=values.parallel,
                       devices_per_point=values.devices_per_point,
                       log=lambda s: print(s, file=sys.stderr, flush=True))
  failed = [r for r in results if r["status"] == "failed"]
  for r in failed:
    print(f"FAILED: point {r['index']} {r['name']}: see "
          f"{os.path.join(values.workdir, r['name'], sweeps.FAILED)}", file=sys.stderr)
  return 1 if failed else 0


def main(argv=None):
  return cli.run(body, argv, doc=__doc__, define=define, config=None,
                 config_help="config file with get_config() and sweep(), path[:arg]; "
                 "required unless --report")


if __name__ == "__main__":
  sys.exit(main())
