"""Multi-host: two local processes (2 fake CPU devices each) train through scripts/train.py.

They meet through `jax.distributed.initialize` on 127.0.0.1 only, each reads its own half of
every global batch, agree on the (replicated) loss, and write one checkpoint together that this
single process then restores onto its own 8-device mesh. The last tests check the
collectives, joining and leaving in this process, with the other process's answers faked.
"""
import ast
import json
import os
import socket
import subprocess
import sys
import time
import types

import jax
import numpy as np
import pytest

from transformer_jax import batch as batch_lib
from transformer_jax.run import checkpointing, distributed, metrics
from transformer_jax.run.trainer import Trainer
from transformer_jax.run.workdir import RunError

import tiny_config as tiny_config_module
import xla_env

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

STEPS = 3
TIMEOUT = 300
# What makes `distributed.initialize` join a run that JAX detects: kept out of these tests.
CLUSTER_VARIABLES = ("SLURM_NTASKS", "TPU_WORKER_HOSTNAMES", "JAX_COORDINATOR_ADDRESS")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _config(data_dir):
  c = tiny_config_module.get_config()
  c.data.data_dir = str(data_dir)
  # No dropout: the loss is then a plain sum over rows, whatever row order the global batch has.
  c.model.dropout_rate = 0.0
  c.update(num_train_steps=STEPS, checkpoint_every_steps=STEPS, bleu_num_sentences=4)
  return c


def _summary(output: str) -> dict:
  """The result dict scripts/train.py prints last (on stderr) when it finishes."""
  lines = [line for line in output.splitlines() if line.startswith("{") and line.endswith("}")]
  assert lines, output[-3000:]
  return ast.literal_eval(lines[-1])


# What the coordinator (process 0) says, then it dies (SIGSEGV), when its port is taken: the
# port `_free_port` found free was bound by another program before the coordinator bound it.
PORT_TAKEN = "Failed to add port to server"


def _run_two_processes(data_dir, workdir, mesh_flags, attempts: int = 3,
                       first_port: int | None = None) -> tuple[list[int], list[str]]:
  """scripts/train.py in two local processes (2 fake CPU devices each): exit codes, outputs.
  Again on another port when the coordinator's was taken (nothing was written before it
  failed: `distributed.initialize` is the run's first step)."""
  for attempt in range(attempts):
    port = first_port if attempt == 0 and first_port else _free_port()
    codes, outputs = _two_processes_on(port, data_dir, workdir, mesh_flags)
    if not (codes[0] and PORT_TAKEN in outputs[0]):
      break
    print(f"attempt {attempt + 1}: the coordinator's port was taken; again on another")
  return codes, outputs


def _two_processes_on(port, data_dir, workdir, mesh_flags) -> tuple[list[int], list[str]]:
  env = dict(os.environ, XLA_FLAGS=xla_env.flags(2),
             JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
  for key in CLUSTER_VARIABLES:
    env.pop(key, None)
  procs = []
  for i in range(2):
    cmd = [sys.executable, os.path.join(REPO, "scripts", "train.py"),
           "--config", os.path.join(REPO, "tests", "tiny_config.py"), "--workdir", str(workdir),
           f"--config.data.data_dir={data_dir}", "--config.model.dropout_rate=0.0",
           f"--config.num_train_steps={STEPS}", f"--config.checkpoint_every_steps={STEPS}",
           "--config.bleu_num_sentences=4", "--config.keep_best=bleu",
           # Its collectives (the count's broadcasts at start and after each evaluation) run
           # on both processes; a patience this long never stops a run of STEPS steps.
           "--config.early_stopping_patience=50",
           f"--config.coordinator_address=127.0.0.1:{port}",
           f"--config.coordinator_bind_address=127.0.0.1:{port}",
           "--config.num_processes=2", f"--config.process_id={i}", *mesh_flags]
    procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, cwd=REPO))
  outputs = []
  try:
    for p in procs:
      outputs.append(p.communicate(timeout=TIMEOUT)[0])
      if p.returncode and PORT_TAKEN in outputs[-1]:
        break   # the other process would wait for the coordinator until JAX's timeout
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
    outputs += [p.communicate()[0] for p in procs[len(outputs):]]
    if any(p.returncode for p in procs):
      for i, p in enumerate(procs):
        print(f"---- process {i} (exit {p.returncode}):\n{outputs[i][-6000:]}")
  return [p.returncode for p in procs], outputs


@pytest.mark.parametrize("mesh_flags,mesh_text,prune", [
    # A checkpoint every step, 3 kept: the data case goes on to a resume that prunes them.
    (["--config.checkpoint_every_steps=1", "--config.keep_checkpoints=3"],
     "{'data': 4, 'fsdp': 1, 'tensor': 1}", True),
    # Parameters sharded over the devices of both processes (the usual case for big models).
    (["--config.mesh.data=1", "--config.mesh.fsdp=-1"], "{'data': 1, 'fsdp': 4, 'tensor': 1}",
     False),
], ids=["data", "fsdp"])
def test_two_processes_train_and_checkpoint_together(tmp_path, mesh_flags, mesh_text, prune):
  data_dir, workdir = tmp_path / "tfds", tmp_path / "run"
  c = _config(data_dir)
  from transformer_jax.data import get_data
  # Build the dataset and the tokenizer once here, so the two processes only read them.
  get_data(c.data, str(workdir))
  shards = [next(iter(get_data(c.data, str(workdir), process_index=i,
                               process_count=2).train_dataset())) for i in range(2)]
  assert shards[0]["inputs"].shape[0] == c.data.batch_size // 2
  assert not np.array_equal(shards[0]["inputs"], shards[1]["inputs"])  # each its own shard

  codes, outputs = _run_two_processes(data_dir, workdir, mesh_flags)
  assert codes == [0, 0]

  # Both processes see the same global loss and evaluation, and say they are 2 of 2.
  first, second = (_summary(o) for o in outputs)
  assert first["step"] == second["step"] == STEPS
  for key in ("train_loss", "eval_loss", "grad_norm"):
    assert first[key] == second[key], key
  # The run's lines come from process 0 alone (not a copy from every process).
  assert "2 process(es)" in outputs[0] and f"mesh {mesh_text}" in outputs[0]
  assert "transformer-jax:" in outputs[0] and f"step {STEPS}: " in outputs[0]
  assert "transformer-jax:" not in outputs[1] and f"step {STEPS}: " not in outputs[1]
  logged = {m["step"]: m for m in metrics.read_metrics(str(workdir)) if "train_loss" in m}
  assert sorted(logged) == list(range(1, STEPS + 1))          # written once, by process 0
  assert round(logged[STEPS]["train_loss"], 4) == first["train_loss"]

  # Step 1's loss is that of one process holding both shards (with the same initial state).
  single = _config(data_dir)
  trainer = Trainer.create(single, str(workdir))
  state = trainer.setup.init_state(jax.random.key(single.seed))
  batch = {k: np.concatenate([s[k] for s in shards]) for k in batch_lib.KEYS if k in shards[0]}
  with trainer.context():
    _, m = trainer.train_step(state, trainer.put(batch))
  assert float(m["loss"] / m["tokens"]) == pytest.approx(logged[1]["train_loss"], rel=1e-5)

  # The checkpoint both wrote restores in this one process, onto its 8-device mesh.
  step, params = checkpointing.load_params(str(workdir))
  assert step == STEPS
  state, data_state, origin = trainer.initial_state()
  assert origin == f"resumed from step {STEPS}" and data_state
  # Each process's own data position was saved. A 1-process resume continues at the same point
  # of the epoch (here: both are still in their first window, at chunk 0).
  assert data_state["process_count"] == 2 and sorted(data_state["processes"]) == ["0", "1"]
  saved = [data_state["processes"][i] for i in ("0", "1")]
  assert [(s["parent"]["next_index"], s["window"]) for s in saved] == [(0, 0), (0, 0)]
  assert distributed.own_data_state(data_state, trainer.data) == {
      "parent": {"next_index": 0}, "window": 1, "next": 0}
  kernel = state.params["encoder"]["layer_0"]["self_attention"]["query"]["kernel"]
  assert len(kernel.sharding.device_set) == 8
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(state.params)):
    np.testing.assert_array_equal(a, np.asarray(b))
  trainer.checkpointer.close()
  # Both processes wrote the best BLEU's parameters together (sharded over both with fsdp).
  best_step, best = checkpointing.load_params(str(workdir / "best_bleu"))
  assert best_step == STEPS
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(best)):
    np.testing.assert_array_equal(a, b)
  if prune:
    _resume_prunes_old_checkpoints(data_dir, workdir, outputs)


def test_two_processes_refuse_a_mesh_that_gives_both_the_same_rows(tmp_path, capsys):
  # With the batch replicated across the processes (data 1, tensor over all 4 devices), each
  # process's own rows would be taken for copies of the same rows: refused before training.
  data_dir, workdir = tmp_path / "tfds", tmp_path / "run"
  from transformer_jax.data import get_data
  get_data(_config(data_dir).data, str(workdir))
  # The first port given is taken (a program listens on it), as when another program binds
  # the port `_free_port` found between its check and the coordinator's bind: the two
  # processes are started again on another, at once (not after the other's 5-minute wait).
  with socket.socket() as taken:
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    start = time.monotonic()
    codes, outputs = _run_two_processes(data_dir, workdir,
                                        ["--config.mesh.data=1", "--config.mesh.tensor=-1"],
                                        first_port=taken.getsockname()[1])
  assert "attempt 1: the coordinator's port was taken" in capsys.readouterr().out
  assert time.monotonic() - start < TIMEOUT / 2
  assert codes == [1, 1], outputs
  for out in outputs:
    assert ("config.mesh ({'data': 1, 'fsdp': 1, 'tensor': 4}) do not give each of the 2 "
            "processes rows of its own") in out, out[-3000:]
  assert not os.path.exists(workdir / "checkpoints")


def _resume_prunes_old_checkpoints(data_dir, workdir, outputs):
  """The two processes of `outputs` saved steps 1..STEPS (3 kept). A resume with a lower
  keep_checkpoints deletes the oldest steps before it writes anything (Checkpointer.prune:
  Orbax deletes on its primary process): both processes must come through it together and
  leave only the steps kept. (In the data case of the test above: one two-process run less.)"""
  assert checkpointing.checkpoint_steps(checkpointing.checkpoint_dir(str(workdir))) == [1, 2, 3]
  # Each says what it waits for before JAX's silent wait for the others.
  for i, out in enumerate(outputs):
    assert f"process {i} of 2: joining the run at 127.0.0.1:" in out, out[-3000:]
    assert "check that every process was started" in out
  codes, outputs = _run_two_processes(data_dir, workdir, [
      f"--config.num_train_steps={STEPS + 1}", "--config.checkpoint_every_steps=1",
      "--config.keep_checkpoints=1"])
  assert codes == [0, 0]
  first, second = (_summary(o) for o in outputs)
  assert first["step"] == second["step"] == STEPS + 1
  # Steps 1 and 2 at the start (3, the step resumed from, stays until Orbax
  # deletes it after that save); said once, by process 0.
  said = "deleted checkpoint(s) [1, 2] from"
  assert said in outputs[0] and said not in outputs[1], outputs[0][-3000:]
  assert checkpointing.checkpoint_steps(checkpointing.checkpoint_dir(str(workdir))) == [STEPS + 1]
  step, _ = checkpointing.load_params(str(workdir))
  assert step == STEPS + 1


def test_a_detected_cluster_is_said_before_jax_waits(monkeypatch, capsys):
  calls = []
  monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
  monkeypatch.setattr(jax.distributed, "initialize", lambda *a, **k: calls.append((a, k)))
  for key, value in (("SLURM_NTASKS", "2"), ("SLURM_JOB_ID", "7"), ("SLURM_PROCID", "0"),
                     ("SLURM_STEP_NODELIST", "node1"), ("SLURM_LOCALID", "0")):
    monkeypatch.setenv(key, value)   # a task srun started
  c = tiny_config_module.get_config()
  distributed.initialize(c)
  assert calls == [((), {})]
  assert capsys.readouterr().err.startswith("joining a multi-process run that JAX detects ")


def test_a_process_of_a_slurm_allocation_that_srun_did_not_start_is_told_so(monkeypatch):
  """`python scripts/train.py` in an `salloc -n 2` shell, or in a batch script without srun:
  SLURM_NTASKS > 1 but no step of tasks to join. JAX failed with "coordinator_address should
  be defined"; the message now says what to run, and nothing waits."""
  calls = []
  monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
  monkeypatch.setattr(jax.distributed, "initialize", lambda *a, **k: calls.append((a, k)))
  for key in distributed.SLURM_STEP_VARIABLES + distributed.OTHER_LAUNCHERS:
    monkeypatch.delenv(key, raising=False)   # (a test machine may run in Kubernetes)
  monkeypatch.setenv("SLURM_NTASKS", "2")
  monkeypatch.setenv("SLURM_JOB_ID", "7")
  c = tiny_config_module.get_config()
  with pytest.raises(RunError, match=r"SLURM_NTASKS=2: .* not started by srun "
                     r"\(SLURM_STEP_NODELIST, SLURM_PROCID, SLURM_LOCALID unset\).*"
                     r"`srun python scripts/train.py "
                     r"\.\.\.`, or .* --config.distributed=off"):
    distributed.initialize(c)
  assert calls == []
  # Another launcher that JAX finds (mpirun inside `sbatch -n 2`, whose ranks have the batch
  # script's SLURM_NTASKS), or an explicit coordinator: JAX is asked, as before.
  for launcher in ("OMPI_MCA_orte_hnp_uri", "JAX_COORDINATOR_ADDRESS"):
    monkeypatch.setenv(launcher, "1531576320.0;tcp://10.0.0.1:34911")
    distributed.initialize(c)
    monkeypatch.delenv(launcher)
  assert calls == [((), {})] * 2
  calls.clear()
  # One task (srun -n 1, or a batch script of one): nothing to join, JAX asked when "on".
  monkeypatch.setenv("SLURM_NTASKS", "1")
  c.distributed = "on"
  distributed.initialize(c)
  assert calls == [((), {})]
  calls.clear()
  c.distributed = "auto"
  monkeypatch.setenv("SLURM_NTASKS", "2")
  # Inside srun's step: JAX is asked to find the rest.
  for key, value in (("SLURM_STEP_NODELIST", "node1"), ("SLURM_PROCID", "1"),
                     ("SLURM_LOCALID", "0")):
    monkeypatch.setenv(key, value)
  distributed.initialize(c)
  assert calls == [((), {})]


def test_the_collectives_as_process_0_of_two_sees_them(monkeypatch):
  """any_process, from_main, StopFlag.agreed and gather_data_states with a second process
  faked (its answers to the collectives), in this process: each must take the collective's
  answer, not its own value, when there are two processes."""
  theirs = {"parent": {"next_index": 7}, "window": [1, 2], "next": 3}   # process 1's position
  blob = np.frombuffer(json.dumps(theirs).encode(), np.uint8)

  def allgather(x):
    x = np.asarray(x)
    if x.dtype == np.uint8:      # each process's position as JSON, padded to the longest
      other = np.zeros_like(x)
      other[:blob.size] = blob
    elif x.shape == (1,):        # the JSON's lengths
      other = np.array([blob.size], np.int32)
    else:                        # a flag: process 1 got a signal
      other = np.array(1, np.int32)
    return np.stack([x, other])

  monkeypatch.setattr(jax, "process_count", lambda: 2)
  monkeypatch.setattr(distributed.multihost_utils, "process_allgather", allgather)
  monkeypatch.setattr(distributed.multihost_utils, "broadcast_one_to_all",
                      lambda x: np.array(True))                     # process 0's value
  assert distributed.any_process(False) is True
  assert distributed.from_main(False) is True
  assert distributed.StopFlag().agreed() == "a signal to another process"
  mine = {"parent": {"next_index": 4}, "window": [], "next": 0}
  record = distributed.gather_data_states(mine)
  assert record == {"process_count": 2, "processes": {"0": mine, "1": theirs}}
  assert distributed.own_data_state(record, data=None) == mine
  synced = []
  monkeypatch.setattr(distributed.multihost_utils, "sync_global_devices", synced.append)
  distributed.sync("the tokenizer is copied")
  assert synced == ["the tokenizer is copied"]


def test_joining_binds_where_asked_and_leaving_stops_the_service_last(monkeypatch):
  for key in CLUSTER_VARIABLES:
    monkeypatch.delenv(key, raising=False)
  joined = []
  monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
  monkeypatch.setattr(jax.distributed, "initialize", lambda **k: joined.append(k))
  c = tiny_config_module.get_config()
  c.update(coordinator_address="127.0.0.1:5000", num_processes=2, process_id=1)
  distributed.initialize(c)
  c.coordinator_bind_address = "127.0.0.1:5000"
  distributed.initialize(c)
  assert [k.get("coordinator_bind_address") for k in joined] == [None, "127.0.0.1:5000"]
  # Not when told not to, not twice, and on a TPU pod's variable alone.
  c.distributed = "off"
  distributed.initialize(c)
  c.distributed, c.coordinator_address = "auto", ""
  monkeypatch.setattr(jax.distributed, "is_initialized", lambda: True)
  monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "t0,t1")
  distributed.initialize(c)
  monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
  distributed.initialize(c)
  assert len(joined) == 3 and joined[2] == {}
  # Leaving: the client first (with the service detached from JAX's state), then the service.
  from jax._src import distributed as jax_distributed
  events = []
  service = types.SimpleNamespace(shutdown=lambda: events.append("service"))
  state = types.SimpleNamespace(service=service)
  monkeypatch.setattr(jax_distributed, "global_state", state)
  monkeypatch.setattr(jax.distributed, "shutdown",
                      lambda: events.append(("client", state.service)))
  monkeypatch.setattr(jax.distributed, "is_initialized", lambda: True)
  distributed.shutdown(linger_s=0.0)
  assert events == [("client", None), "service"]
  # Not in a multi-process run: nothing to leave.
  events.clear()
  monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
  distributed.shutdown(linger_s=0.0)
  assert events == []
