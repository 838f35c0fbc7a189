"""Test setup: 8 fake CPU devices and quick compiles (tests/xla_env.py), set before jax is imported
anywhere, one XLA cache, and the heaviest test modules first."""
import atexit
import os
import shutil
import tempfile

import xla_env  # tests/ is on sys.path

os.environ["XLA_FLAGS"] = xla_env.flags(8, os.environ.get("XLA_FLAGS", ""))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# One persistent compilation cache for the session and every process it starts (the scripts under
# test, the SLURM tasks, the two-process runs): the tiny model's steps are compiled once, not once
# per process. The key is the program and the compile options, so a changed program misses.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="tj-xla-cache-")
  atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.3")


# The modules that take longest, longest first (their summed test times with `-n 2`, measured
# 2026-11-23: test_slurm 171 s, test_benchmark 147, test_model 147, test_train 135, ...).
# `pytest -n 2 --dist loadfile` (the README's command) hands whole modules to its two workers in
# collection order: started first, the long ones overlap each other and the many short modules
# fill the gaps, instead of one long module running alone at the end while the other idles.
HEAVIEST_FIRST = ("test_slurm.py", "test_benchmark.py", "test_model.py", "test_train.py",
                  "test_multihost.py", "test_workdir.py", "test_parallel.py", "test_decode.py",
                  "test_mutation.py", "test_sweeps.py", "test_tools.py", "test_steps.py")


def pytest_collection_modifyitems(config, items):
  del config
  rank = {name: i for i, name in enumerate(HEAVIEST_FIRST)}
  # A stable sort: each module's tests stay together and in their order.
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
