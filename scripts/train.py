"""Train a Transformer: `python scripts/train.py --config configs/default.py --workdir runs/default`.

Any config field can be overridden: `--config.num_train_steps=500 --config.model.d_model=256`.
Re-running the same command resumes from the workdir's latest checkpoint.
"""
import logging
import sys

from absl import app, flags
from ml_collections import config_flags

from transformer_jax.train import shutdown_distributed, train_and_evaluate

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file (path[:arg]).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and the "
                               "tokenizer; resumed from when it holds checkpoints.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.getLogger("absl").setLevel(logging.WARNING)
  result = train_and_evaluate(_CONFIG.value, _WORKDIR.value)
  summary = {k: v for k, v in result.items() if isinstance(v, (int, float, str))}
  print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in summary.items()},
        file=sys.stderr)
  shutdown_distributed()  # multi-process runs: the coordinator's service stops last


if __name__ == "__main__":
  app.run(main)
