"""A real single-node SLURM (munged + slurmctld + slurmd) on 127.0.0.1, for the tests.

    cluster = LocalSlurm(directory)
    cluster.start()                      # seconds; raises SlurmUnavailable with the reason
    subprocess.run(["srun", "-n", "2", "hostname"], env=cluster.env())
    cluster.stop()                       # only the daemons this object started, by their PIDs

Tested with Debian bookworm's slurm 22.05 (the packages below): the daemons listen on
127.0.0.1 only, state and logs live in `directory`, no cgroups. `.ci/run` installs the packages.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

PACKAGES = "slurmctld slurmd slurm-client munge"
BINARIES = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "squeue", "scontrol", "sinfo")
MUNGE_PID = "/run/munge/munged.pid"


class SlurmUnavailable(RuntimeError):
  pass


def missing_binaries() -> list[str]:
  return [b for b in BINARIES if not shutil.which(b) and not os.path.exists(f"/usr/sbin/{b}")]


def _which(name: str) -> str:
  return shutil.which(name) or f"/usr/sbin/{name}"


class LocalSlurm:

  def __init__(self, directory: str):
    self.dir = str(directory)
    self.conf = os.path.join(self.dir, "slurm.conf")
    self.started: list[tuple[str, int]] = []   # (daemon, pid) this object started

  def env(self, **extra) -> dict:
    env = dict(os.environ, SLURM_CONF=self.conf)
    env.update(extra)
    return env

  def _write_conf(self) -> None:
    for sub in ("state", "spool", "log"):
      os.makedirs(os.path.join(self.dir, sub), exist_ok=True)
    d = self.dir
    memory = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20 * 0.8)
    # Twice the cores, so a 2-task job and a sweep's array tasks can share the node (the tests
    # oversubscribe knowingly; config_overrides lets slurmd accept the mismatch).
    cpus = 2 * (os.cpu_count() or 2)
    with open(self.conf, "w") as f:
      f.write(f"""ClusterName=jaxtest
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# A requeued job waits out its old credential's lifetime before it may start again: 120 s by
# default, 5 here, so the preemption test does not sleep for two minutes (10 cost it 5 s more).
AuthInfo=cred_expire=5
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
# A requeued job may start once its old credential has expired, but no event then wakes the
# scheduler: the backfill pass (every 30 s by default) found it 24 s after the requeue.
SchedulerParameters=bf_interval=1,sched_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
SlurmdParameters=config_overrides
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
KillWait=30
# `sbatch --wait` polls the job at 2 s, then 8 s, then 32 s, unless MinJobAge is under 5 (it
# must not sleep past a finished job's purge): at 600 a 12 s job's `sbatch --wait` returned
# after 42 s, at 4 after 14 s. A finished job's record stays 4 s or more: sbatch (every 2 s)
# and the preemption test's requeue (within a second of seeing COMPLETED) find it.
MinJobAge=4
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
NodeName=localhost NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")

  def _start_munge(self) -> None:
    if _alive(_read_pid(MUNGE_PID)):
      return  # a munged of the machine's: use it, never stop it
    if not (os.path.exists("/etc/munge/munge.key") and os.path.getsize("/etc/munge/munge.key")):
      subprocess.run(["/usr/sbin/mungekey", "--create"], check=True, capture_output=True)
      shutil.chown("/etc/munge/munge.key", "munge", "munge")
      os.chmod("/etc/munge/munge.key", 0o400)
    os.makedirs("/run/munge", exist_ok=True)
    shutil.chown("/run/munge", "munge", "munge")
    subprocess.run(["runuser", "-u", "munge", "--", _which("munged")], check=True,
                   capture_output=True)
    self._record("munged", MUNGE_PID)

  def _record(self, daemon: str, pidfile: str) -> None:
    deadline = time.time() + 10
    while time.time() < deadline:
      pid = _read_pid(pidfile)
      if pid:
        self.started.append((daemon, pid))
        return
      time.sleep(0.05)
    raise SlurmUnavailable(f"{daemon} wrote no pid file {pidfile}")

  def start(self, timeout: float = 30.0) -> None:
    missing = missing_binaries()
    if missing:
      raise SlurmUnavailable(f"not installed: {missing} (apt-get install {PACKAGES})")
    if os.geteuid() != 0:
      raise SlurmUnavailable("the local SLURM daemons run as root here")
    self._write_conf()
    try:
      self._start_munge()
      for daemon, args in (("slurmctld", ["-f", self.conf]),
                           ("slurmd", ["-f", self.conf, "-N", "localhost"])):
        subprocess.run([_which(daemon), *args], check=True, capture_output=True,
                       env=self.env())
        self._record(daemon, os.path.join(self.dir, f"{daemon}.pid"))
      deadline = time.time() + timeout
      while time.time() < deadline:
        state = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True,
                               env=self.env()).stdout.strip()
        if state == "idle":
          return
        time.sleep(0.2)
      raise SlurmUnavailable(f"the node is not idle after {timeout} s (sinfo: {state!r}); "
                             f"logs in {self.dir}/log")
    except (subprocess.CalledProcessError, OSError, LookupError) as e:
      self.stop()
      raise SlurmUnavailable(f"could not start the local SLURM: {e}") from e
    except SlurmUnavailable:
      self.stop()
      raise

  def stop(self) -> None:
    """SIGTERM the daemons this object started (slurm first, munge last), by PID, and wait."""
    for _, pid in reversed(self.started):
      if _alive(pid):
        os.kill(pid, signal.SIGTERM)
      deadline = time.time() + 15
      while _alive(pid) and time.time() < deadline:
        time.sleep(0.1)
      if _alive(pid):
        os.kill(pid, signal.SIGKILL)
    self.started = []

  # ---- jobs

  def run(self, args: list[str], **kwargs) -> subprocess.CompletedProcess:
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("text", True)
    return subprocess.run(args, env=kwargs.pop("env", self.env()), **kwargs)

  def job_state(self, job_id: str) -> str:
    out = self.run(["scontrol", "show", "job", job_id]).stdout
    for field in out.split():
      if field.startswith("JobState="):
        return field.split("=", 1)[1]
    return ""

  def wait_for(self, job_id: str, states: tuple[str, ...], timeout: float = 300) -> str:
    deadline = time.time() + timeout
    state = ""
    while time.time() < deadline:
      state = self.job_state(job_id)
      if state in states:
        return state
      time.sleep(0.3)
    raise TimeoutError(f"job {job_id} is {state!r}, not in {states}, after {timeout} s")

  def cancel_all(self) -> None:
    """Cancel every job still queued or running (a failed test must not leave any)."""
    jobs = self.run(["squeue", "-h", "-o", "%i"]).stdout.split()
    if jobs:
      self.run(["scancel", *jobs])


def _read_pid(path: str) -> int | None:
  try:
    with open(path) as f:
      return int(f.read().strip())
  except (OSError, ValueError):
    return None


def _alive(pid: int | None) -> bool:
  if not pid:
    return False
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  # A zombie child of this process counts as gone.
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().split()[2] != "Z"
  except OSError:
    return False
