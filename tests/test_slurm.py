"""Launching on a real SLURM: slurmctld + slurmd + munged on 127.0.0.1 for this module.

Multi-process training started by `srun` with nothing SLURM-specific on the command line (JAX
finds the cluster), preemption the way clusters do it (`scancel --signal=TERM`, then
`scontrol requeue`) ending with the losses of an uninterrupted run, and a sweep submitted as an
array job whose failed point is reported and alone re-submitted. `.ci/run` installs the Debian
packages; without them (or without root) these tests skip, except under CI=true, where they
fail. Every daemon and job this module starts is stopped at its end, also when a test fails.
"""
import os
import sys
import time

import pytest

from transformer_jax.data import get_data
from transformer_jax.run import checkpointing, metrics

from slurm_cluster import LocalSlurm, SlurmUnavailable
import tiny_config
import xla_env

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(REPO, "tests", "tiny_config.py")
TRAIN = os.path.join(REPO, "scripts", "train.py")
STEPS = 24


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
  cluster = LocalSlurm(tmp_path_factory.mktemp("slurm"))
  try:
    cluster.start()
  except SlurmUnavailable as e:
    if os.environ.get("CI") == "true":
      pytest.fail(f"CI runs the SLURM tests, but the local SLURM did not start: {e}")
    pytest.skip(f"no local SLURM: {e}")
  try:
    yield cluster
  finally:
    cluster.cancel_all()
    deadline = time.time() + 60
    while cluster.run(["squeue", "-h"]).stdout.strip() and time.time() < deadline:
      time.sleep(0.5)
    cluster.stop()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return tmp_path_factory.mktemp("tfds")


def job_env(cluster):
  # Two fake CPU devices per process: the tiny batch of 8 rows splits over the 4 of 2 processes.
  env = cluster.env(XLA_FLAGS=xla_env.flags(2), JAX_PLATFORMS="cpu",
                    PYTHONUNBUFFERED="1")
  for key in ("JAX_COORDINATOR_ADDRESS", "TPU_WORKER_HOSTNAMES"):
    env.pop(key, None)
  return env


def train_args(workdir, data_dir):
  return [sys.executable, TRAIN, "--config", TINY, "--workdir", str(workdir),
          f"--config.data.data_dir={data_dir}", f"--config.num_train_steps={STEPS}",
          "--config.checkpoint_every_steps=1000", "--config.log_every_steps=1",
          "--config.bleu_num_sentences=4"]


def prepare(workdir, data_dir):
  """The dataset and tokenizer, built once here so the job's processes only read them."""
  c = tiny_config.get_config()
  c.data.data_dir = str(data_dir)
  get_data(c.data, str(workdir))


def losses(workdir):
  return {r["step"]: r["train_loss"] for r in metrics.read_metrics(str(workdir))
          if "train_loss" in r}


@pytest.fixture(scope="module")
def reference(slurm, data_dir, tmp_path_factory):
  """`srun -n 2 python scripts/train.py ...`: one uninterrupted two-process run."""
  workdir = tmp_path_factory.mktemp("srun") / "run"
  prepare(workdir, data_dir)
  proc = slurm.run(["srun", "-n", "2", "--kill-on-bad-exit=1", *train_args(workdir, data_dir)],
                   env=job_env(slurm), timeout=600)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  return workdir, proc.stdout + proc.stderr


def test_srun_trains_with_two_processes_found_by_jax_and_one_process_restores(reference):
  workdir, output = reference
  # JAX read the cluster from SLURM's environment: both tasks joined one run of 2 processes
  # (said by process 0 alone), and both ended with its summary.
  assert output.count("2 process(es)") == 1, output[-3000:]
  assert output.count(f"'step': {STEPS}}}") == 2, output[-3000:]
  assert "(measured float32 256x256 matmul)" in output  # the config's CPU peak size was used
  assert sorted(losses(workdir)) == list(range(1, STEPS + 1))   # logged once, by process 0
  step, params = checkpointing.load_params(str(workdir))          # this one process restores
  assert step == STEPS and params


def test_preempted_by_scancel_and_requeued_the_run_ends_with_uninterrupted_losses(
    slurm, data_dir, reference, tmp_path):
  workdir = tmp_path / "run"
  prepare(workdir, data_dir)
  script = tmp_path / "train.sbatch"
  script.write_text("\n".join([
      "#!/bin/bash", "#SBATCH --ntasks=2", "#SBATCH --requeue", "#SBATCH --open-mode=append",
      f"#SBATCH --output={tmp_path}/job.out",
      "srun --kill-on-bad-exit=1 " + " ".join(train_args(workdir, data_dir)), ""]))
  job = slurm.run(["sbatch", "--parsable", str(script)], env=job_env(slurm)).stdout.strip()
  assert job, "sbatch accepted no job"
  # TERM as soon as the first step is logged: the tasks stop some 4 steps later (0.3 s here,
  # 2026-11-29), and the job must not finish its STEPS before the signal reaches it.
  deadline = time.time() + 300
  while time.time() < deadline and not losses(workdir):
    assert slurm.job_state(job) in ("PENDING", "RUNNING", "CONFIGURING"), (
        (tmp_path / "job.out").read_text()[-3000:])
    time.sleep(0.2)
  # What a preempting scheduler does: TERM to the job's tasks, which save and exit cleanly...
  assert slurm.run(["scancel", "--signal=TERM", job]).returncode == 0
  assert slurm.wait_for(job, ("COMPLETED", "FAILED", "CANCELLED")) == "COMPLETED"
  out = (tmp_path / "job.out").read_text()
  assert "SIGTERM: saved step" in out, out[-3000:]
  saved = checkpointing.checkpoint_steps(str(workdir / "checkpoints"))
  assert saved and saved[-1] < STEPS, out[-3000:]
  # ... then puts it back in the queue: the same job resumes from that checkpoint.
  assert slurm.run(["scontrol", "requeue", job]).returncode == 0
  deadline = time.time() + 60
  while slurm.job_state(job) == "COMPLETED" and time.time() < deadline:
    time.sleep(0.2)
  assert slurm.wait_for(job, ("COMPLETED", "FAILED", "CANCELLED")) == "COMPLETED"
  out = (tmp_path / "job.out").read_text()
  assert f"resumed from step {saved[-1]}" in out, out[-3000:]
  resumed, straight = losses(workdir), losses(reference[0])
  assert sorted(resumed) == list(range(1, STEPS + 1))
  for step in range(1, STEPS + 1):
    assert resumed[step] == pytest.approx(straight[step], rel=1e-6), step


SWEEP_CONFIG = """
import importlib.util

spec = importlib.util.spec_from_file_location("tiny", {tiny!r})
tiny = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tiny)
get_config = tiny.get_config


def sweep():
  # The last point cannot train (no training pair fits 2 target pieces, found only once the
  # data is read; a value validation refuses would stop the whole sweep before it starts): it
  # must be reported as failed, and alone submitted again.
  return [dict(learning_rate=1.0), dict(learning_rate=2.0),
          {{"learning_rate": 3.0, "data.max_target_len": 2}}]
"""


BAD_POINT = "data.max_target_len=2,learning_rate=3"


def test_a_sweep_runs_as_an_array_job_and_resubmits_only_its_unfinished_points(
    slurm, data_dir, tmp_path):
  config = tmp_path / "swept.py"
  config.write_text(SWEEP_CONFIG.format(tiny=TINY))
  sweep_dir = tmp_path / "sweep"
  command = [sys.executable, os.path.join(REPO, "scripts", "sweep.py"), "--config", str(config),
             "--workdir", str(sweep_dir), "--submit", "--wait",
             "--config.num_train_steps=2", f"--config.data.data_dir={data_dir}",
             "--config.bleu_num_sentences=4"]
  env = slurm.env(JAX_PLATFORMS="cpu")
  first = slurm.run(command, env=env, timeout=600)
  assert first.returncode == 1, first.stderr[-3000:]
  assert "points 0-2" in first.stderr
  lines = first.stderr.splitlines()
  assert "[0] learning_rate=1: done" in lines and "[1] learning_rate=2: done" in lines
  failed = next(line for line in lines
                if line.startswith(f"[2] {BAD_POINT}: failed"))
  failed_file = failed.split(": see ")[1]
  assert "no training pair fits" in open(failed_file).read()  # the exit status and log tail
  logs = {n: os.path.getsize(sweep_dir / n / "train.log")
          for n in ("learning_rate=1", "learning_rate=2")}

  again = slurm.run(command, env=env, timeout=600)
  assert again.returncode == 1 and "points 2" in again.stderr, again.stderr[-3000:]
  assert logs == {n: os.path.getsize(sweep_dir / n / "train.log") for n in logs}  # not re-run

  report = slurm.run([sys.executable, os.path.join(REPO, "scripts", "sweep.py"), "--workdir",
                      str(sweep_dir), "--report"], env=env, timeout=120)
  assert report.returncode == 0, report.stderr[-3000:]
  row = next(line for line in report.stdout.splitlines() if BAD_POINT in line)
  assert "failed" in row and str(sweep_dir / BAD_POINT / "train.log") in row
