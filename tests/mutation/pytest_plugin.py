"""pytest plugin for the mutation runner's coverage pass (scripts/mutation_select.py).

Loaded with `-p pytest_plugin` (this folder on PYTHONPATH) when the unmutated tests run once under
coverage. Before every test it empties JAX's tracing and compilation caches, so each test traces
(and so is recorded as executing) the code it depends on: a test that reused a function another
test had already jitted would otherwise run none of that function's Python lines. The persistent
compilation cache on disk stays, so this costs tracing, not compiling. It also writes each test's
duration (setup + call + teardown) to $MUTATION_DURATIONS as JSON, for running the fastest first.
"""
import json
import os

_durations = {}


def pytest_runtest_setup(item):
  del item
  import jax  # pylint: disable=import-outside-toplevel
  jax.clear_caches()


def pytest_runtest_logreport(report):
  _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session):
  del session
  path = os.environ.get("MUTATION_DURATIONS")
  if path:
    with open(path, "w") as f:
      json.dump(_durations, f, indent=0)
