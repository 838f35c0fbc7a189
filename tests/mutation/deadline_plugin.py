"""pytest plugin that stops a test running far past its time (scripts/mutation_select.py).

Loaded with `-p deadline_plugin` for every pytest run of a mutant. $MUTATION_DEADLINES is JSON
{test id: seconds}; a listed test still running after its seconds (a mutant made a loop run
forever) ends the whole run at once: the test's id goes to $MUTATION_TIMED_OUT and the process
exits with TIMED_OUT_CODE. A watchdog thread does it, since a loop inside a compiled XLA program
never returns to Python for a signal handler to run; the run's own limit stays as the backstop.
Without it, a mutant that hangs in its first test waited for the time of every selected test.
"""
import json
import os
import threading

import pytest

TIMED_OUT_CODE = 124
_DEADLINES = json.loads(os.environ.get("MUTATION_DEADLINES", "{}"))


def _stop(nodeid: str) -> None:
  path = os.environ.get("MUTATION_TIMED_OUT")
  if path:
    with open(path, "w") as f:
      f.write(nodeid)
  os._exit(TIMED_OUT_CODE)  # pylint: disable=protected-access  # no cleanup: it may hang too


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  del nextitem
  seconds = _DEADLINES.get(item.nodeid)
  timer = None
  if seconds is not None:
    timer = threading.Timer(seconds, _stop, args=(item.nodeid,))
    timer.daemon = True
    timer.start()
  try:
    yield
  finally:
    if timer is not None:
      timer.cancel()
