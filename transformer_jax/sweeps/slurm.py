"""A sweep as a SLURM array job: task i runs `scripts/sweep.py ... --point i`, one point per
task, so SLURM does the scheduling and a re-submission skips the points already done."""
from __future__ import annotations

import os
import shlex
from typing import Sequence

from transformer_jax.sweeps.runner import Runner


def sbatch_script(runner: Runner, options: Sequence[str] = (), max_concurrent: int = 0) -> str:
  """The text of the array job for `runner`'s sweep; `options` become `#SBATCH` lines."""
  # scripts/sweep.py sits beside the train script it runs.
  sweep_py = os.path.join(os.path.dirname(os.path.abspath(runner.train_script)), "sweep.py")
  last = len(runner.points) - 1
  array = f"0-{last}" + (f"%{max_concurrent}" if max_concurrent else "")
  lines = ["#!/bin/bash",
           f"#SBATCH --job-name={os.path.basename(runner.sweep_dir)}",
           f"#SBATCH --array={array}",
           f"#SBATCH --output={os.path.join(runner.sweep_dir, 'slurm', '%A_%a.out')}",
           *[f"#SBATCH {o}" for o in options],
           "",
           f"# {len(runner.points)} points of {runner.config_spec}; "
           f"see {runner.sweep_dir}/sweep.json.",
           "# Submit: sbatch " + os.path.join(runner.sweep_dir, "sweep.sbatch"),
           "# Re-submitting skips finished points; each task resumes its point's checkpoint.",
           f"cd {shlex.quote(os.getcwd())}",
           "srun " + " ".join(shlex.quote(a) for a in [
               runner.python, sweep_py, "--config", runner.sweep.config_arg,
               "--workdir", runner.sweep_dir, *runner.extra_flags])
           + " --point $SLURM_ARRAY_TASK_ID",
           ""]
  return "\n".join(lines)


def write_sbatch(runner: Runner, options: Sequence[str] = (), max_concurrent: int = 0) -> str:
  """Writes `<sweep>/sweep.sbatch` (and the `slurm/` directory its logs go to); returns its
  path."""
  os.makedirs(os.path.join(runner.sweep_dir, "slurm"), exist_ok=True)
  path = os.path.join(runner.sweep_dir, "sweep.sbatch")
  with open(path, "w") as f:
    f.write(sbatch_script(runner, options, max_concurrent))
  return path
