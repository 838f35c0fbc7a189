"""Test setup: 8 fake CPU devices and quick compiles (tests/xla_env.py), set before jax is imported
anywhere, one XLA cache, the files handed to xdist's workers longest first (tests/file_order.py),
and a finished tiny run that a module's tests work on copies of (`trained`, `run`)."""
import atexit
import os
import shutil
import tempfile

import pytest

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


def pytest_configure(config):
  # xdist would order the files by their number of tests; pytest_collection_modifyitems below
  # orders them by time instead (tests/file_order.py says why).
  if hasattr(config.option, "loadscopereorder"):
    config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
  import file_order  # tests/ is on sys.path
  seconds = file_order.load()
  items.sort(key=lambda item: file_order.key(item.nodeid, seconds))  # stable, as longest_first


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_dir):
  """A finished 3-step run of tests/tiny_config.py (checkpoint at step 3), its dataset in the
  requesting module's `data_dir`; tests work on copies of it (`run`)."""
  from transformer_jax.run import loop

  import tiny_config
  c = tiny_config.get_config()
  c.data.data_dir = str(data_dir)
  c.num_train_steps = 3
  path = str(tmp_path_factory.mktemp("trained") / "run")
  loop.train_and_evaluate(c, path)
  return path


@pytest.fixture
def run(trained, tmp_path):
  """A copy of `trained`, the test's own."""
  path = str(tmp_path / "run")
  shutil.copytree(trained, path)
  return path
