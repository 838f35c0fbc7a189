"""Run, schedule or report a sweep: the points returned by a config file's `sweep()`.

    # Every point, one after another, each in runs/lr_warmup/<its overrides>/:
    python scripts/sweep.py --config configs/default.py --workdir runs/lr_warmup
    # Four at a time, each on its own 2 devices (GPUs via CUDA_VISIBLE_DEVICES; on CPU, 2 fake ones):
    python scripts/sweep.py --config configs/default.py --workdir runs/lr_warmup --parallel 4 \
        --devices_per_point 2
    # A SLURM array job instead (one task per point): writes runs/lr_warmup/sweep.sbatch
    python scripts/sweep.py --config configs/default.py --workdir runs/lr_warmup --slurm \
        --slurm_option=--gres=gpu:1 --slurm_option=--time=04:00:00
    # One point (what each array task runs):
    python scripts/sweep.py --config configs/default.py --workdir runs/lr_warmup --point 3
    # The table (CSV, Markdown) and a plot of BLEU against each swept field:
    python scripts/sweep.py --workdir runs/lr_warmup --report --metric bleu

Extra `--config.FIELD=VALUE` arguments apply to every point. Points already finished (a `DONE`
marker) are skipped on a re-run; failed ones (a `FAILED` file with the exit status and the log's
tail) and stopped ones (exit 0 before the last step: SIGTERM) are run again and resume from their
checkpoint. The exit status is 1 if any point failed.
"""
import argparse
import os
import sys

from transformer_jax import sweeps

TRAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train.py")


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter,
                                   epilog="\n".join(__doc__.splitlines()[1:]))
  parser.add_argument("--config", help="config file with get_config() and sweep(), path[:arg]")
  parser.add_argument("--workdir", required=True, help="the sweep's directory")
  parser.add_argument("--point", type=int, action="append",
                      help="run only this point index (repeatable); default all")
  parser.add_argument("--parallel", type=int, default=1, help="points running at once")
  parser.add_argument("--devices_per_point", type=int, default=0,
                      help="give each running point its own K devices (0: all visible ones)")
  parser.add_argument("--slurm", action="store_true", help="write sweep.sbatch, run nothing")
  parser.add_argument("--slurm_option", action="append", default=[],
                      help="an #SBATCH line, e.g. --slurm_option=--gres=gpu:8 (repeatable)")
  parser.add_argument("--slurm_max_concurrent", type=int, default=0,
                      help="at most this many array tasks at once (0: no limit)")
  parser.add_argument("--list", action="store_true", help="print the points and their status")
  parser.add_argument("--report", action="store_true", help="write report.csv/.md/.png")
  parser.add_argument("--metric", default="bleu", help="report: the metric to sort and plot")
  parser.add_argument("--lower_is_better", action="store_true", default=None,
                      help="report: sort ascending (default: ascending for losses only)")
  args, extra = parser.parse_known_args(argv)

  if args.report:
    out = sweeps.report(args.workdir, args.metric, args.lower_is_better)
    print(out["markdown"], end="")
    print("wrote " + ", ".join(out["files"]), file=sys.stderr)
    return 0
  if not args.config:
    parser.error("--config is required unless --report")
  runner = sweeps.Runner(args.config, args.workdir, TRAIN, extra_flags=extra)
  if args.list:
    for i, p in enumerate(runner.points):
      print(f"{i}\t{runner.status(i)}\t{sweeps.point_name(p)}")
    return 0
  if args.slurm:
    path = runner.slurm_script(args.slurm_option, args.slurm_max_concurrent)
    print(f"wrote {path} ({len(runner.points)} points): submit with  sbatch {path}")
    return 0
  results = runner.run(args.point, parallel=args.parallel,
                       devices_per_point=args.devices_per_point,
                       log=lambda s: print(s, file=sys.stderr, flush=True))
  failed = [r for r in results if r["status"] == "failed"]
  for r in failed:
    print(f"FAILED: point {r['index']} {r['name']}: see "
          f"{os.path.join(args.workdir, r['name'], sweeps.FAILED)}", file=sys.stderr)
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
