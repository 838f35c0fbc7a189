"""Run a mutant against the tests that execute the mutated line (scripts/mutation_test.py).

    python scripts/mutation_select.py SELECTION_JSON     # cosmic-ray's test command, in a copy

A mutant's tests used to be its module's whole test list. Most mutants are killed by one of a
few tests, and a surviving one ran every test, so a run of the core took hours. Instead:

1. `coverage_map` (once per module, from the unmutated tests run under coverage with one context
   per test and JAX's caches emptied before each test, tests/mutation/pytest_plugin.py): for
   every line of the module, the tests that executed it.
2. Here, per mutant: the lines that differ from the unmutated module (kept beside the session)
   and the statement around each; the tests that executed any of them, fastest first, run with
   `pytest -x`. A failure kills the mutant.
3. A mutant that none of them catch, or whose lines no test executed in-process ("not executed"),
   is run against the module's whole list before it counts as surviving (`confirm`, the
   default): a test that depends on the line without executing it in the coverage pass
   (through a fixture or a cache filled by another test, or in a subprocess) still gets its
   chance. So the selection only makes killing faster; it cannot make a mutant survive that the
   whole list would kill. `--trust_coverage` skips the confirmation (a quick look).

Lines executed outside any test (at import) select the whole list; lines run while a fixture was
set up or torn down select every test of the file whose setup it was (a module fixture serves
that file; a session fixture serves more, which the confirmation covers).

Each test has its own time limit: `TIMEOUT_FACTOR` x its unmutated time (from the coverage pass,
which compiled from empty caches) + `TEST_SLACK` (tests/mutation/deadline_plugin.py), and each
pytest run `TIMEOUT_FACTOR` x the time of the tests it runs + `TIMEOUT_SLACK` for start-up. A
mutant that makes a loop run forever is stopped at the first limit it passes (the process group
killed), printed as `TIMED_OUT` and reported as a timeout (killed): after the hanging test's
seconds, not those of every selected test, nor cosmic-ray's limit for the whole list, which
stays as the backstop.
"""
from __future__ import annotations

import ast
import difflib
import json
import os
from pathlib import Path
import signal
import subprocess
import sys
import tempfile
import time

ALL = "*"  # in a line's test list: every listed test
NOT_EXECUTED = "mutation_select: no listed test executes the mutated lines"
TIMED_OUT = "mutation_select: timeout"
TIMEOUT_FACTOR, TIMEOUT_SLACK = 3.0, 30.0
# Per test: a module fixture's set-up may fall in another test than in the coverage pass (the
# order differs), and the first test initialises JAX's backend.
TEST_SLACK = 20.0
PLUGINS = Path(__file__).resolve().parent.parent / "tests" / "mutation"


def coverage_map(data_files: Path | list[Path], module_path: str,
                 durations: dict[str, float]) -> dict:
  """{line: sorted test ids, or [ALL]} of `module_path` from pytest-cov runs with
  `--cov-context=test` (contexts "<nodeid>|setup", "|run", "|teardown"; "" outside tests).
  `durations` holds the module's tests: what other tests of the runs executed is left out."""
  import coverage  # pylint: disable=import-outside-toplevel
  module_tests, per_file = set(durations), {}
  for nodeid in durations:
    per_file.setdefault(nodeid.split("::")[0], set()).add(nodeid)
  lines: dict[str, set[str]] = {}
  for data_file in data_files if isinstance(data_files, list) else [data_files]:
    data = coverage.CoverageData(basename=str(data_file))
    data.read()
    measured = [f for f in data.measured_files() if f.endswith("/" + module_path)]
    if len(measured) != 1:
      raise SystemExit(f"{data_file}: expected one measured file ending in {module_path}, found "
                       f"{measured}: did the tests import the module from the copy?")
    for line, contexts in (data.contexts_by_lineno(measured[0]) or {}).items():
      tests = lines.setdefault(str(line), set())
      for context in contexts:
        nodeid, _, phase = context.rpartition("|")
        if not nodeid:
          tests.add(ALL)  # import time or a session fixture: any test may depend on it
        elif phase == "run":
          tests |= {nodeid} & module_tests
        else:
          # A fixture's setup runs in the first test that asks for it, and a module-scoped one
          # serves the rest of the file: count every test of that file. (A session fixture set
          # up in a file of another module's tests is missed here; the whole list confirms.)
          tests |= per_file.get(nodeid.split("::")[0], set())
  return {line: sorted(tests) if ALL not in tests else [ALL]
          for line, tests in lines.items() if tests}


def changed_lines(original: str, mutated: str) -> list[int]:
  """1-based lines of `original` that the mutant replaced or removed (or inserted before)."""
  matcher = difflib.SequenceMatcher(a=original.splitlines(), b=mutated.splitlines(),
                                    autojunk=False)
  lines = []
  for tag, i1, i2, _, _ in matcher.get_opcodes():
    if tag != "equal":
      lines += list(range(i1 + 1, max(i2, i1 + 1) + 1))
  return lines


def statement_lines(code: str, line: int) -> list[int] | None:
  """The lines of the innermost statement around `line` (a multi-line statement is traced on
  any of its lines); a compound statement's header only. None when no statement holds it (a
  decorator, a comment between statements): the caller then takes every test."""
  best = None
  for node in ast.walk(ast.parse(code)):
    if isinstance(node, ast.stmt) and node.lineno <= line <= node.end_lineno:
      if best is None or node.end_lineno - node.lineno <= best.end_lineno - best.lineno:
        best = node
  if best is None:
    return None
  body = [n for field in ("body", "orelse", "finalbody", "handlers")
          for n in getattr(best, field, []) or [] if isinstance(n, ast.AST)]
  end = min([n.lineno - 1 for n in body] + [best.end_lineno])
  if line > end:  # a line between the header and the body: comments
    return None
  return list(range(best.lineno, end + 1))


def select(lines_map: dict, durations: dict, original: str, mutated: str) -> list[str] | None:
  """The tests to run for a mutant, fastest first; [] when none executes it; None for all."""
  tests = set()
  for line in changed_lines(original, mutated):
    span = statement_lines(original, line)
    if span is None:
      return None
    for covered in span:
      tests |= set(lines_map.get(str(covered), []))
  if ALL in tests:
    return None
  return sorted(tests, key=lambda t: (durations.get(t, 0.0), t))


def pytest_command(python: str, tests: list[str], deselect: list[str]) -> list[str]:
  return [python, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
          *tests, *[f"--deselect={t}" for t in deselect]]


def time_limit(durations: dict[str, float], tests: list[str] | None) -> float:
  """Seconds a run of `tests` (None: every test in `durations`) may take."""
  seconds = sum(durations.values()) if tests is None else sum(durations.get(t, 0.0) for t in tests)
  return TIMEOUT_FACTOR * seconds + TIMEOUT_SLACK


def test_limits(durations: dict[str, float]) -> dict[str, float]:
  """Seconds each test may take."""
  return {t: TIMEOUT_FACTOR * s + TEST_SLACK for t, s in durations.items()}


def run_tests(command: list[str], cwd: Path, limit: float,
              per_test: dict[str, float] | None = None) -> int:
  """The exit code of pytest `command`, or 124 after printing TIMED_OUT when it runs past
  `limit` s or one of its tests past its `per_test` s (the whole process group is killed: the
  tests may have started processes of their own)."""
  with tempfile.TemporaryDirectory() as tmp:
    env = dict(os.environ, MUTATION_DEADLINES=json.dumps(per_test or {}),
               MUTATION_TIMED_OUT=os.path.join(tmp, "test"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(PLUGINS),
                                                        os.environ.get("PYTHONPATH")])))
    process = subprocess.Popen([*command, "-p", "deadline_plugin"], cwd=cwd, env=env,
                               start_new_session=True)
    try:
      code = process.wait(timeout=limit)
    except subprocess.TimeoutExpired:
      os.killpg(process.pid, signal.SIGKILL)
      process.wait()
      print(f"{TIMED_OUT}: still running after {limit:.0f} s", flush=True)
      return 124
    finally:
      try:  # what the tests started, if the plugin's exit left it running
        os.killpg(process.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
    if os.path.exists(env["MUTATION_TIMED_OUT"]):
      test = Path(env["MUTATION_TIMED_OUT"]).read_text()
      print(f"{TIMED_OUT}: {test} still running after {per_test[test]:.0f} s", flush=True)
      return 124
    return code


def run(selection_file: Path, cwd: Path = Path(".")) -> int:
  """cosmic-ray's test command: exit 0 if the mutant survives, else the tests' exit code."""
  start = time.monotonic()
  try:
    return _run(json.loads(selection_file.read_text()), selection_file.parent, cwd)
  finally:
    print(f"mutation_select: {time.monotonic() - start:.1f} s", flush=True)


def _run(spec: dict, sessions: Path, cwd: Path) -> int:
  original = (sessions / spec["original"]).read_text()
  mutated = (cwd / spec["module_path"]).read_text()
  durations = spec["durations"]
  per_test = test_limits(durations)
  full = pytest_command(sys.executable, spec["tests"], spec["deselect"])
  chosen = select(spec["lines"], durations, original, mutated)
  if chosen is None:  # every listed test
    return run_tests(full, cwd, time_limit(durations, None), per_test)
  code = 0
  if chosen:
    print(f"mutation_select: {len(chosen)} test(s) execute the mutated lines", flush=True)
    code = run_tests(pytest_command(sys.executable, chosen, []), cwd,
                     time_limit(durations, chosen), per_test)
    # 1: a test failed; 124: they ran far past their time. Any other failure (no such test id,
    # none collected: a mutant can rename a parametrized test) is not a verdict; the whole list
    # gives it.
    if code in (1, 124):
      return code
  else:
    print(NOT_EXECUTED, flush=True)
  if code == 0 and not spec.get("confirm", True):
    return 0
  print("mutation_select: the whole list confirms", flush=True)
  return run_tests(full, cwd, time_limit(durations, None), per_test)


if __name__ == "__main__":
  if len(sys.argv) != 2 or not Path(sys.argv[1]).is_file():  # --help, or a wrong path
    sys.exit(__doc__)
  sys.exit(run(Path(sys.argv[1])))
