"""The config a run trains with now, read back from its workdir: resume or extend a run without
retyping the overrides it was started with.

    python scripts/train.py --config configs/resume.py:runs/mine --workdir runs/mine \
        --config.num_train_steps=2000

`python scripts/train.py --workdir runs/mine` (no --config) does the same without overrides.
"""
from transformer_jax.run.workdir import RunError, experiment_config


def get_config(workdir=None):
  if not workdir:
    raise ValueError("configs/resume.py needs the run's workdir: "
                     "--config configs/resume.py:<workdir>")
  try:
    return experiment_config(workdir)
  except RunError as e:  # config_flags reports a ValueError as one line
    raise ValueError(str(e)) from None
