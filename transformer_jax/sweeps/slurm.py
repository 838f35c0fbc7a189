"""A sweep as a SLURM array job: task i runs `scripts/sweep.py ... --point i`, one point per
task, so SLURM does the scheduling. `submit` sends only the points not done yet, so submitting
again after a failure or a preemption runs just those (each resumes its own checkpoint)."""
from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
from typing import Sequence

from transformer_jax.run.workdir import RunError
from transformer_jax.sweeps.runner import Runner
from transformer_jax.sweeps.spec import SweepError

JOB_ID = "job_id"   # <sweep>/slurm/job_id: the last array job submitted


class SubmitError(RunError):
  """sbatch refused the job (the message is sbatch's), or an earlier one is still queued."""


def log_path(runner: Runner, job_id: str, index: int) -> str:
  """The SLURM output file of one array task (the `--output` pattern of the script)."""
  return os.path.join(runner.sweep_dir, "slurm", f"{job_id}_{index}.out")


def queued(job_id: str) -> bool:
  """Whether any task of the job is still pending or running."""
  proc = subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True, text=True)
  return proc.returncode == 0 and bool(proc.stdout.strip())


def array_spec(indices: Sequence[int]) -> str:
  """`[0, 1, 2, 5]` -> "0-2,5" (sbatch --array syntax)."""
  parts, run = [], []
  for i in sorted(indices):
    if run and i == run[-1] + 1:
      run.append(i)
      continue
    if run:
      parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    run = [i]
  if run:
    parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
  return ",".join(parts)


def unfinished(runner: Runner) -> list[int]:
  return [i for i in range(len(runner.points)) if runner.status(i) != "done"]


def output_pattern(sweep_dir: str) -> str:
  """sbatch's `--output` for the tasks' logs, each at `log_path`.

  `%` in the directory would start a SLURM filename pattern, so it is doubled (`%%` is a `%`);
  a backslash turns every pattern off (all tasks would write one file, `%A_%a.out`) and a
  newline would end the `#SBATCH` line, so neither has an escape and both are refused."""
  bad = [name for c, name in (("\\", "a backslash"), ("\n", "a newline")) if c in sweep_dir]
  if bad:
    raise SweepError(f"the sweep directory {sweep_dir!r} has {' and '.join(bad)}, which SLURM's "
                     "--output cannot carry: pass a --workdir without it")
  return os.path.join(sweep_dir.replace("%", "%%"), "slurm", "%A_%a.out")


def sbatch_script(runner: Runner, options: Sequence[str] = (), max_concurrent: int = 0,
                  indices: Sequence[int] | None = None) -> str:
  """The text of the array job for `runner`'s sweep (all points, or `indices`); `options`
  become `#SBATCH` lines."""
  # scripts/sweep.py sits beside the train script it runs.
  sweep_py = os.path.join(os.path.dirname(os.path.abspath(runner.train_script)), "sweep.py")
  indices = range(len(runner.points)) if indices is None else indices
  array = array_spec(indices) + (f"%{max_concurrent}" if max_concurrent else "")
  # sbatch splits `#SBATCH` lines itself: at unquoted spaces, and an unquoted `#` starts a
  # comment; it reads shell quotes, so shlex.quote keeps a path with either whole.
  lines = ["#!/bin/bash",
           f"#SBATCH --job-name={shlex.quote(os.path.basename(runner.sweep_dir))}",
           f"#SBATCH --array={array}",
           f"#SBATCH --output={shlex.quote(output_pattern(runner.sweep_dir))}",
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


def write_sbatch(runner: Runner, options: Sequence[str] = (), max_concurrent: int = 0,
                 indices: Sequence[int] | None = None) -> str:
  """Writes `<sweep>/sweep.sbatch` (and the `slurm/` directory its logs go to); returns its
  path."""
  os.makedirs(os.path.join(runner.sweep_dir, "slurm"), exist_ok=True)
  path = os.path.join(runner.sweep_dir, "sweep.sbatch")
  with open(path, "w") as f:
    f.write(sbatch_script(runner, options, max_concurrent, indices))
  return path


def submit(runner: Runner, options: Sequence[str] = (), max_concurrent: int = 0,
           wait: bool = False) -> tuple[str | None, list[int]]:
  """Submit the points not done yet as one array job: (job id, point indices); (None, []) when
  every point is done. With `wait`, return when the whole array has ended (`sbatch --wait`)."""
  record = os.path.join(runner.sweep_dir, "slurm", JOB_ID)
  if os.path.exists(record):
    with open(record) as f:
      previous = f.read().strip()
    if previous and queued(previous):
      # Its points are not done yet, and submitting them again would race their workdirs.
      raise SubmitError(f"job {previous} of this sweep is still queued or running: wait for it "
                        f"(squeue -j {previous}) or cancel it (scancel {previous}) first")
  indices = unfinished(runner)
  if not indices:
    return None, []
  path = write_sbatch(runner, options, max_concurrent, indices)
  command = ["sbatch", "--parsable", *(["--wait"] if wait else []), path]
  with tempfile.TemporaryFile("w+") as errors:
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors, text=True)
    # sbatch prints the id (--parsable: `<id>` or `<id>;<cluster>`) once the job is accepted,
    # and with --wait goes on until the array has ended: the id is recorded at once, so a wait
    # cut short (Ctrl-C, a closed session) still leaves it for the next --submit's check. A
    # message on stdout (a wrapper's, a site's sbatch plugin) is no job id.
    printed, job_id = [], ""
    for line in proc.stdout:
      printed.append(line.strip())
      if line.strip().split(";")[0].isdigit():
        job_id = line.strip().split(";")[0]
        break
    if job_id:
      with open(record, "w") as f:
        f.write(job_id + "\n")
      runner.write_spec()  # once the job is accepted: a refused submission changes nothing
    # --wait returns the array's exit status: non-zero when a point failed, which the caller
    # reads from the points' markers; only a job that was never accepted is an error here.
    printed += [line.strip() for line in proc.stdout]
    proc.wait()
    errors.seek(0)
    if not job_id:
      raise SubmitError(f"{' '.join(command)} failed (exit {proc.returncode}): "
                        f"{errors.read().strip() or chr(10).join(p for p in printed if p)}")
  return job_id, indices
