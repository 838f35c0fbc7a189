"""Average the parameters of a run's last N checkpoints (the paper: 5 for base, 20 for big).

    python scripts/average_checkpoints.py --workdir runs/default --last 5
    python scripts/evaluate.py --workdir runs/default --averaged --beam_size 4

The mean is taken elementwise in float32 over `<workdir>/checkpoints`' last N steps and saved
into `<workdir>/averaged/<last step>/` (or `--output`), never into `<workdir>/checkpoints`,
which training resumes from: an `--output` that is any run's `checkpoints/` or
`best_<metric>/`, or a directory holding checkpoints that are not averages, is refused. The
checkpoint holds `state` = {"params": ...}, the layout `checkpointing.load_params` reads, and
`meta` = {"averaged_steps": [...], ...}; translate.py, evaluate.py and plot_attention.py load it
with `--averaged` or `--checkpoint <dir>`; evaluate.py writes into
`<workdir>/eval/averaged_last<N>_<step>/`. Keep enough checkpoints while training:
`--config.keep_checkpoints=N` (default 3). An average of one checkpoint (`--last 1`, or the
default `average_last_checkpoints` of most configs) is a copy of it, with a warning.
"""
import json
import logging
import sys

from absl import flags

from transformer_jax import cli
from transformer_jax.inference.translator import workdir_config
from transformer_jax.run.averaging import average_checkpoints
from transformer_jax.run.checkpointing import checkpoint_dir, checkpoint_steps


def define(values):
  flags.DEFINE_string("workdir", None, "the training run's directory", flag_values=values)
  flags.mark_flag_as_required("workdir", flag_values=values)
  flags.DEFINE_integer("last", None, "how many of the latest checkpoints (default: the run's "
                       "config.average_last_checkpoints)", flag_values=values)
  flags.DEFINE_string("output", None, "directory for the average (default: <workdir>/averaged)",
                      flag_values=values)


def _warn_one(values, run: dict, step: int) -> None:
  """An "average" of one checkpoint is a copy of it: most configs' average_last_checkpoints
  is 1, so without --last that is what a user gets, and should be told. Where the run kept
  only that one, --last N cannot help: the advice is for its training."""
  why = "--last 1" if values.last is not None else (
      "--last not given, and the run's config.average_last_checkpoints is 1")
  source = checkpoint_dir(values.workdir)
  kept = len(checkpoint_steps(source))
  if kept > 1:
    advice = f"pass --last N to average the last N checkpoints ({source} holds {kept})"
  else:
    advice = (f"{source} holds no other: training keeps the last config.keep_checkpoints "
              f"({run.get('keep_checkpoints', '?')} in this run) of its checkpoints, saved "
              f"every config.checkpoint_every_steps ({run.get('checkpoint_every_steps', '?')}) "
              "steps, and those at multiples of config.keep_every_steps "
              f"({run.get('keep_every_steps', '?')}; 0 is none): train with "
              "--config.keep_checkpoints=N (or --config.keep_every_steps) to have checkpoints "
              "to average")
  print(f"average_checkpoints: warning: {why}: the \"average\" is a copy of step {step}; "
        f"{advice}", file=sys.stderr, flush=True)


def body(values, args):
  # A sweep or a checkpoints directory is told what to pass (this script has no --step).
  run = workdir_config(values.workdir, choose=False)
  last = values.last
  if last is None:
    last = int(run.get("average_last_checkpoints", 1))
  output, step, steps = average_checkpoints(
      values.workdir, last, values.output,
      log=lambda m: print(f"average_checkpoints: {m}", file=sys.stderr, flush=True))
  if len(steps) == 1:
    _warn_one(values, run, step)
  print(json.dumps({"output": output, "step": step, "averaged_steps": steps}), flush=True)
  print(f"average_checkpoints: use it with --checkpoint {output}"
        + (" (or --averaged)" if values.output is None else ""), file=sys.stderr)
  return 0


def main(argv=None):
  return cli.run(body, argv, doc=__doc__, define=define, absl_level=logging.ERROR)


if __name__ == "__main__":
  sys.exit(main())
