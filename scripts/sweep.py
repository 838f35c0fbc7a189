r"""Run, submit or report a sweep: the points of a config file's `sweep()` (docs/scaling.md).

    python scripts/sweep.py --config configs/default.py --workdir runs/lr_warmup     # locally
    python scripts/sweep.py --config configs/default.py --workdir runs/lr_warmup --parallel 4 \
        --devices_per_point 2                # 4 at a time on 2 devices each
    python scripts/sweep.py --config configs/default.py --workdir runs/lr_warmup --submit \
        --wait --slurm_option=--gres=gpu:1   # a SLURM array of the points not done yet
    python scripts/sweep.py --workdir runs/lr_warmup --report --metric bleu
    python scripts/sweep.py --workdir runs/lr_warmup --report --metric test_bleu --averaged \
        --beam_size 4                        # by evaluate.py's scores of averaged checkpoints

`--config.FIELD=VALUE` overrides apply to every point, on top of those sweep.json recorded (a
re-run needs none; `--config.num_train_steps=N` alone extends the sweep); other values than the
recorded ones are refused once a point has started. Done points, and points a live process of
this machine is running, are skipped on a re-run or re-submission; failed and stopped ones run
again, resuming their checkpoints. `--slurm` only writes sweep.sbatch; `--point i` runs one
point (what each array task runs); `--list` prints each point's status and writes nothing.
Without `--config`, the config sweep.json records is used (`--list`, a re-run, `--config.X`
flags). Another config is refused in a directory where a started point of the recorded config
is not among its points.
A refused command leaves sweep.json as it was. The exit status is 1 if a point failed.
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
  flags.DEFINE_bool("submit", False, "write sweep.sbatch for the points not done and sbatch it",
                    **v)
  flags.DEFINE_bool("wait", False, "with --submit: return when the array job has ended", **v)
  flags.DEFINE_multi_string("slurm_option", [], "an #SBATCH line, e.g. --gres=gpu:8", **v)
  flags.DEFINE_integer("slurm_max_concurrent", 0, "most array tasks at once (0: all)", **v)
  flags.DEFINE_bool("list", False, "print the points and their status", **v)
  flags.DEFINE_bool("report", False, "write report.csv, report.md and report_<metric>.png", **v)
  flags.DEFINE_string("metric", "bleu", "report: the metric to sort and plot", **v)
  flags.DEFINE_bool("lower_is_better", None, "report: sort ascending (default: losses)", **v)
  cli.define_evaluations(values)  # report: --averaged, --beam_size


def body(values, args):
  try:
    return _body(values)
  except sweeps.SweepError as e:  # a sweep the user got wrong: its points, devices, paths
    print(f"error: {e}", file=sys.stderr)
    return 1


def _body(values):
  if values.report:
    out = sweeps.report(values.workdir, values.metric, values.lower_is_better,
                        cli.evaluations(values), values.paired)
    print(out["markdown"], end="")
    for warning in [out["warning"]] * bool(out["warning"]) + out["warnings"]:
      print(f"warning: {warning}", file=sys.stderr)
    print("wrote " + ", ".join(out["files"]), file=sys.stderr)
    return 0
  given = [f"--{name}" for name in ("averaged", "beam_size", "paired") if values[name].present]
  if given:  # not a training flag: --beam_size 4 here would train with the config's beam
    print(f"error: {', '.join(given)}: only for --report (which evaluate.py results it "
          "reads); the points' own settings are --config.FIELD=VALUE (--config.beam_size=4)",
          file=sys.stderr)
    return 2
  if values.config is None:
    spec = _announce_recorded_config(values.workdir)
    if spec is None:
      print(f"error: --config is required unless --report ({values.workdir} has no sweep.json "
            "naming one: give the config file whose sweep() to run)", file=sys.stderr)
      return 2
    overrides = {}
  else:
    spec = values["config"].config_filename
    overrides = config_flags.get_override_values(values["config"])
  runner = sweeps.Runner(spec, values.workdir, TRAIN, overrides, record=not values.list)
  if values.list:
    if runner.recorded_config is not None:
      print(f"warning: {os.path.join(runner.sweep_dir, 'sweep.json')} records another config, "
            f"--config {runner.recorded_config}: these are {spec}'s points, not that sweep's",
            file=sys.stderr)
    if runner.differs_from_recorded():
      print(f"warning: statuses are computed with this command's flags "
            f"({' '.join(runner.extra_flags) or 'none'}), not the sweep's "
            f"({' '.join(runner.recorded_flags or []) or 'none'}, recorded in "
            f"{os.path.join(runner.sweep_dir, 'sweep.json')})", file=sys.stderr)
    for i, p in enumerate(runner.points):
      print(f"{i}\t{runner.status(i)}\t{sweeps.point_name(p)}")
    return 0
  if values.submit:
    job, indices = sweeps.submit(runner, values.slurm_option, values.slurm_max_concurrent,
                                 wait=values.wait)
    if job is None:
      print("every point is done: nothing submitted", file=sys.stderr)
      return 0
    print(f"submitted job {job}: points {sweeps.array_spec(indices)}", file=sys.stderr)
    if not values.wait:
      return 0
    return _failed(runner, indices, lambda i: sweeps.log_path(runner, job, i))
  if values.slurm:
    path = sweeps.write_sbatch(runner, values.slurm_option, values.slurm_max_concurrent)
    runner.write_spec()
    print(f"wrote {path} ({len(runner.points)} points): submit with  sbatch {path}")
    return 0
  results = runner.run(values.point, parallel=values.parallel,
                       devices_per_point=values.devices_per_point,
                       log=lambda s: print(s, file=sys.stderr, flush=True))
  return _failed(runner, [r["index"] for r in results])


def _announce_recorded_config(workdir: str | None) -> str | None:
  """The --config that `workdir`'s sweep.json records, announced; None where there is none."""
  spec = sweeps.recorded_config(workdir) if workdir is not None else None
  if spec is not None:
    print(f"note: --config {spec}, as {os.path.join(workdir, 'sweep.json')} records",
          file=sys.stderr)
  return spec


def _failed(runner, indices, logs=None) -> int:
  lines, failed = runner.outcome(indices, logs)
  print("\n".join(lines), file=sys.stderr)
  return 1 if failed else 0


def main(argv=None):
  argv = list(sys.argv[1:] if argv is None else argv)
  overrides = cli.overrides_without_config(argv)
  if overrides and not {"-h", "--help", "--helpfull"} & set(argv):
    # Overrides exist only with a config file (absl would answer "Unknown command line flag"):
    # the one sweep.json records, where there is one (`--config.num_train_steps=N` extends).
    spec = _announce_recorded_config(cli.flag_value(argv, "workdir"))
    if spec is None:
      print(f"error: {overrides[0].split('=')[0]} overrides a field of --config, and there is "
            "none: give the config file whose sweep() to run, e.g. --config configs/default.py",
            file=sys.stderr)
      return 2
    argv = ["--config", spec] + argv
  return cli.run(body, argv, doc=__doc__, define=define, config=None,
                 config_help="config file with get_config() and sweep(), path[:arg]; "
                 "required unless --report")


if __name__ == "__main__":
  sys.exit(main())
