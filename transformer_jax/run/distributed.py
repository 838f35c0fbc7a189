"""Multi-process runs: joining and leaving `jax.distributed`, agreeing on when to stop, and each
process's data position in a checkpoint.

With one process everything here is a no-op or a plain return: no collective is issued.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time

import jax
from jax.experimental import multihost_utils
import numpy as np

from transformer_jax.run.checkpointing import CheckpointError
from transformer_jax.run.workdir import RunError

log = logging.getLogger(__name__)


def initialize(config) -> None:
  """Join a multi-process run when asked (explicit coordinator) or when a cluster is detected."""
  if config.distributed == "off" or jax.distributed.is_initialized():
    return
  # jax.distributed.initialize waits silently for every process (5 minutes by default): a
  # process that never started (a mistyped process_id, a node that failed) looks like a hang.
  waiting = ("waits until all have joined; JAX gives up after 5 minutes: check that every "
             "process was started")
  if config.coordinator_address:
    kwargs = {}
    if config.coordinator_bind_address:
      kwargs["coordinator_bind_address"] = config.coordinator_bind_address
    print(f"process {config.process_id} of {config.num_processes}: joining the run at "
          f"{config.coordinator_address} ({waiting})", file=sys.stderr, flush=True)
    jax.distributed.initialize(coordinator_address=config.coordinator_address,
                               num_processes=config.num_processes,
                               process_id=config.process_id, **kwargs)
  elif (config.distributed == "on" or int(os.environ.get("SLURM_NTASKS", "1")) > 1
        or "TPU_WORKER_HOSTNAMES" in os.environ or "JAX_COORDINATOR_ADDRESS" in os.environ):
    _check_slurm_step()
    # JAX finds SLURM, TPU pod (through the metadata server) and Kubernetes settings itself;
    # "on" is for clusters it detects but whose environment we cannot see (gcloud TPU VMs).
    print(f"joining a multi-process run that JAX detects ({waiting})", file=sys.stderr,
          flush=True)
    jax.distributed.initialize()


# What JAX's SLURM detection reads (jax/_src/clusters/slurm_cluster.py): srun sets them for each
# task of a step; a batch script or an `salloc` shell has SLURM_NTASKS without them.
SLURM_STEP_VARIABLES = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID",
                        "SLURM_LOCALID")
# What shows another launcher JAX detects (an explicit coordinator; Open MPI's mpirun, which JAX
# looks for before SLURM, e.g. `mpirun -np 2` inside `sbatch -n 2`; a TPU pod; Kubernetes):
# such a process has its own way to join, and SLURM_NTASKS is only the allocation's.
OTHER_LAUNCHERS = ("JAX_COORDINATOR_ADDRESS", "OMPI_MCA_orte_hnp_uri", "TPU_WORKER_HOSTNAMES",
                   "KUBERNETES_SERVICE_HOST")


def _check_slurm_step() -> None:
  """A multi-task SLURM allocation (SLURM_NTASKS > 1) seen from a process that srun did not
  start, and no other launcher (`OTHER_LAUNCHERS`): JAX would fail with "coordinator_address
  should be defined", which says nothing of the cause."""
  if (int(os.environ.get("SLURM_NTASKS", "1")) <= 1
      or any(v in os.environ for v in OTHER_LAUNCHERS)):
    return
  missing = [v for v in SLURM_STEP_VARIABLES if v not in os.environ]
  if missing:
    raise RunError(
        f"SLURM_NTASKS={os.environ['SLURM_NTASKS']}: this is an allocation of several tasks, "
        f"but this process was not started by srun ({', '.join(missing)} unset), so it cannot "
        "join them: start every task with `srun python scripts/train.py ...`, or train in this "
        "one process with --config.distributed=off")


def shutdown(linger_s: float = 1.0) -> None:
  """Leave a multi-process run with the coordinator's service stopping last.

  `jax.distributed.shutdown` (which JAX also runs at exit) passes a barrier of all clients and
  then stops the coordinator's gRPC service at once. Another process's client may still be
  tearing down and leave a request queued in the service, and gRPC then aborts the coordinator
  ("Check failed: queue.Pop() == nullptr", exit -6 after a finished run; seen in
  tests/test_multihost.py). JAX's public API cannot stop the client and the service apart, so
  this reaches into `jax._src.distributed.global_state` to wait `linger_s` between the two; if
  JAX moves that state, the plain public call is used.
  """
  if not jax.distributed.is_initialized():
    return
  try:
    from jax._src import distributed as jax_distributed
    state = jax_distributed.global_state
    service = state.service
  except (ImportError, AttributeError):
    jax.distributed.shutdown()
    return
  state.service = None          # so the call below shuts down the client only
  jax.distributed.shutdown()
  if service is not None:
    time.sleep(linger_s)
    service.shutdown()


def is_main() -> bool:
  """Process 0 writes the workdir's files (config, metrics, markers); all write checkpoints."""
  return jax.process_index() == 0


def any_process(flag: bool) -> bool:
  """True on every process if `flag` is true on any (a collective with several processes)."""
  if jax.process_count() == 1:
    return flag
  return bool(np.any(multihost_utils.process_allgather(np.array(flag, np.int32))))


def sync(name: str) -> None:
  """Wait until every process got here (nothing with one process)."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


def from_main(value: bool) -> bool:
  """Process 0's `value` on every process (a collective with several processes)."""
  if jax.process_count() == 1:
    return value
  return bool(multihost_utils.broadcast_one_to_all(np.array(value)))


class StopFlag:
  """Turns SIGTERM/SIGINT into "save and stop after this step" (preemption loses nothing).

  A second Ctrl-C (SIGINT) is the way out of a run that cannot reach the end of its step
  (stuck in a collective or in reading data): it restores the handler from before and
  re-sends itself, so it raises KeyboardInterrupt, losing the steps since the last checkpoint
  (a checkpoint being written is never read back half done). A second SIGTERM changes
  nothing: schedulers may send it again while the save is under way (SLURM's --signal ahead
  of the time limit, then at it), and SIGKILL remains for a stuck run.
  """

  def __init__(self):
    self.signal = None
    self._previous = {}

  def __enter__(self):
    for sig in (signal.SIGTERM, signal.SIGINT):
      try:
        self._previous[sig] = signal.signal(sig, self._handle)
      except ValueError:  # not the main thread: leave signals alone
        pass
    return self

  def _handle(self, signum, frame):
    name = signal.Signals(signum).name
    if self.signal is None:
      self.signal = name
      again = " (Ctrl-C again to stop at once, without saving)" if signum == signal.SIGINT else ""
      print(f"{name}: saving and stopping after this step{again}", file=sys.stderr, flush=True)
      return
    if signum != signal.SIGINT:
      return
    # None: the handler before was not Python's (nothing to restore but the default).
    signal.signal(signum, self._previous.get(signum) or signal.SIG_DFL)
    os.kill(os.getpid(), signum)

  def agreed(self) -> str | None:
    """The signal if any process got one: all processes must save and stop at the same step,
    or the others would wait forever in the next step's collectives."""
    if not any_process(self.signal is not None):
      return None
    return self.signal or "a signal to another process"

  def __exit__(self, *exc):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)


def gather_data_states(state: dict) -> dict:
  """Every process's data iterator state, so each resumes at its own position in its shard.

  Processes read disjoint shards and their windows fill differently, so their positions drift
  apart; saving only process 0's would put every process at process 0's position on resume.
  """
  count = jax.process_count()
  if count == 1:
    return {"process_count": 1, "processes": {"0": state}}
  blob = np.frombuffer(json.dumps(state).encode(), np.uint8)
  lengths = np.asarray(multihost_utils.process_allgather(np.array([blob.size], np.int32)))
  padded = np.zeros(int(lengths.max()), np.uint8)
  padded[:blob.size] = blob
  blobs = np.asarray(multihost_utils.process_allgather(padded))
  return {"process_count": count, "processes": {
      str(i): json.loads(bytes(blobs[i, :int(lengths.reshape(-1)[i])]).decode())
      for i in range(count)}}


def own_data_state(saved: dict, data) -> dict | None:
  """This process's iterator state from `gather_data_states`' record (None: nothing saved).

  When the run had another number of processes, the shards differ: `data.resharded_state`
  continues at the same point of the same epoch instead (see `pipeline.resharded_state`).
  """
  if not saved:
    return None
  if "process_count" not in saved and {"parent", "window", "next"} <= set(saved):
    # Checkpoints written before every process's position was saved (2026-11-22) hold one
    # record, process 0's: exact for one process; with several, each starts its shard afresh.
    if jax.process_count() == 1:
      return saved
    log.warning("the checkpoint holds one data position from an older version of this code; "
                "with %d processes each starts its shard from the beginning",
                jax.process_count())
    return None
  count = saved.get("process_count")
  processes = saved.get("processes", {})
  if not isinstance(count, int) or sorted(processes) != sorted(map(str, range(count))):
    raise CheckpointError(
        f"the checkpoint's data iterator record is not one this codebase wrote: {saved!r:.300}. "
        "Resume from another step (move this one aside) or start a new --workdir.")
  if count == jax.process_count():
    return processes[str(jax.process_index())]
  states = [processes[str(i)] for i in range(count)]
  state = data.resharded_state(states)
  log.warning("the checkpoint's data positions are for %d process(es), this run has %d: the "
              "shards differ, so each process continues at the same point of the epoch in its "
              "new shard (chunk %d); the pairs of this epoch come from new permutations, so "
              "some are seen twice and some not until the next epoch", count,
              jax.process_count(), state["parent"]["next_index"])
  return state
