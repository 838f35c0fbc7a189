"""Train a Transformer.

    python scripts/train.py --config configs/default.py --workdir runs/default

Any config field can be overridden: `--config.num_train_steps=500 --config.model.d_model=256`.
Re-running the same command resumes from the workdir's latest checkpoint, and so does
`python scripts/train.py --workdir runs/default` alone (the config the run trains with now, from
its workdir); to resume with changes, `--config configs/resume.py:runs/default
--config.num_train_steps=2000`.
"""
import os
import shlex
import sys

import _host_memory  # noqa: F401 (before jax: restarts with huge pages, see the module)
from absl import flags

from transformer_jax import cli, experiment
from transformer_jax.run import distributed
from transformer_jax.run import workdir as workdir_lib
from transformer_jax.run.loop import train_and_evaluate


def define(values):
  flags.DEFINE_string("workdir", None, "directory for checkpoints, metrics and the tokenizer; "
                      "resumed from when it holds checkpoints", flag_values=values)
  flags.mark_flag_as_required("workdir", flag_values=values)


def body(values, args):
  config = values.config
  if config is None:
    if not os.path.exists(os.path.join(values.workdir, workdir_lib.CONFIG)):
      print(f"error: --config is required to start a run ({values.workdir} holds none to "
            "resume), e.g. --config configs/default.py", file=sys.stderr)
      return 2
    config = _own_config(values.workdir)
    print(f"train: resuming with the run's own config "
          f"({workdir_lib.current_config_path(values.workdir)}); to change fields, "
          f"--config {shlex.quote('configs/resume.py:' + values.workdir)} --config.<field>=...",
          file=sys.stderr)
  result = train_and_evaluate(config, values.workdir)
  summary = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in result.items()
             if isinstance(v, (int, float, str))}
  print(summary, file=sys.stderr)
  distributed.shutdown()  # multi-process runs: the coordinator's service stops last
  return 0


def _own_config(workdir):
  """The config the run in `workdir` trains with now, checked as --config's is (cli.run): one
  that today's rules refuse is a RunError naming the file, not a traceback from the loop."""
  config = workdir_lib.experiment_config(workdir)
  try:
    experiment.validate(config)
  except ValueError as e:
    raise workdir_lib.RunError(
        f"{e} (in {workdir_lib.current_config_path(workdir)}, the run's own config: resume with "
        f"--config {shlex.quote('configs/resume.py:' + workdir)} --config.<field>=<value>)"
    ) from None
  return config


def main(argv=None):
  argv = list(sys.argv[1:] if argv is None else argv)
  overrides = cli.overrides_without_config(argv)
  if overrides and not {"-h", "--help", "--helpfull"} & set(argv):
    w = cli.flag_value(argv, "workdir") or "<workdir>"
    fix = (f"to change fields of the run in {w}, add --config "
           f"{shlex.quote('configs/resume.py:' + w)} (the run's own config)"
           if os.path.exists(os.path.join(w, workdir_lib.CONFIG)) else
           "add the config file, e.g. --config configs/default.py")
    print(f"error: {overrides[0].split('=')[0]} overrides a field of --config, and there is "
          f"none: {fix}", file=sys.stderr)
    return 2
  return cli.run(body, argv, doc=__doc__, define=define, config=None)


if __name__ == "__main__":
  sys.exit(main())
