"""The mutation-testing setup (scripts/mutation_test.py, tests/mutation/config.toml) stays true to
the code: its test lists exist, its equivalent mutants are still mutants of the current code, and
a sample of seeded bugs in one module is run through cosmic-ray and killed."""
import ast
import json
import os
import re
import sqlite3
import subprocess
import sys
import time
from unittest import mock

import pytest

from scripts_under_test import load_script

mutation = load_script("mutation_test")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_listed_test_exists():
  config = mutation.load_config()
  for name, module in config["modules"].items():
    for node in module["tests"] + module.get("deselect", []):
      path, _, test = node.partition("::")
      assert os.path.isfile(os.path.join(REPO, path)), f"[modules.{name}] lists {node}"
      if test:
        tree = ast.parse(open(os.path.join(REPO, path)).read())
        names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert test.split("[")[0] in names, f"[modules.{name}] lists {node}: no such test"


def test_annotations_and_other_operators_are_not_mutated():
  code = ("from __future__ import annotations\n"
          "def f(x: int | None, n=2) -> int | None:\n  return x | n\n")
  spans = mutation.annotation_spans(code)
  config = {"operators": {"include": ["core/ReplaceBinaryOperator_BitOr_BitAnd$"]}}

  class Mutation:
    operator_name, occurrence, operator_args = "core/ReplaceBinaryOperator_BitOr_BitAnd", 0, {}
    start_pos = (2, 14)  # the `|` of `int | None`

  assert mutation.classify(code, spans, Mutation, config, "m").startswith("annotation")
  Mutation.start_pos, Mutation.occurrence = (3, 11), 2  # the `|` of `x | n`: runs
  assert mutation.classify(code, spans, Mutation, config, "m") is None
  assert mutation.mutant_lines(code, Mutation) == ("return x | n", "return x & n")
  Mutation.operator_name = "core/ReplaceBinaryOperator_BitOr_Add"
  assert mutation.classify(code, spans, Mutation, config, "m").startswith("operator")


def test_mutant_lines_are_cosmic_rays():
  """`mutant_lines` splices one mutated node into the source instead of mutating the whole
  module per mutant: every mutant of a module, named as cosmic-ray's own `mutate_code` names it
  (including the ones that mutate nothing: an occurrence past the last)."""
  from cosmic_ray.mutating import MutationVisitor
  import cosmic_ray.plugins
  config = mutation.load_config()
  code = open(os.path.join(REPO, config["modules"]["flax_wmt_search"]["path"])).read()
  lines = code.splitlines()
  checked = 0
  for name in cosmic_ray.plugins.operator_names():
    if not any(re.match(p, name) for p in config["operators"]["include"]):
      continue
    operator = cosmic_ray.plugins.get_operator(name)()
    for occurrence in range(len(mutation._mutation_points(code, name, "{}")[1]) + 1):
      mutated = MutationVisitor.mutate_code(code, operator, occurrence)
      mutated_lines = (mutated or code).splitlines()
      changed = next((i for i, (a, b) in enumerate(zip(lines, mutated_lines)) if a != b), 0)
      got = mutation._mutant_lines(code, name, occurrence, changed + 1, "{}")
      assert got == (lines[changed].strip(), mutated_lines[changed].strip()), (name, occurrence)
      checked += mutated is not None
  assert checked > 150  # 205 on 2026-11-28


def test_every_equivalent_entry_still_names_a_mutant(tmp_path, monkeypatch):
  config = mutation.load_config()
  entries = config.get("equivalent", [])
  # Only the operators the runs use make mutants that can be equivalent (classify says
  # "operator: ..." of the others first); each operator numbers its occurrences on its own, so
  # leaving the others out of init changes none of these mutants, and saves a walk of each
  # module per left-out operator.
  import cosmic_ray.plugins
  names = cosmic_ray.plugins.operator_names()
  monkeypatch.setattr(cosmic_ray.plugins, "operator_names", lambda: [
      n for n in names if any(re.match(p, n) for p in config["operators"]["include"])])
  found = set()
  for name in sorted({e["module"] for e in entries}):
    module = config["modules"][name]
    code = open(os.path.join(REPO, module["path"])).read()
    spans = mutation.annotation_spans(code)
    with mutation.use_db(str(tmp_path / f"{name}.sqlite")) as db:
      for item in mutation.init_mutants(db, module["path"], mutation.REPO):
        reason = mutation.classify(code, spans, item.mutations[0], config, name)
        if reason and reason.startswith("equivalent"):
          found.add((name, *mutation.mutant_lines(code, item.mutations[0])))
  stale = [e for e in entries if (e["module"], e["line"], e["mutant"]) not in found]
  assert not stale, f"tests/mutation/config.toml: no longer mutants, remove them: {stale}"


@pytest.mark.slow
def test_the_docs_list_every_equivalent_mutant():
  # docs/equivalent_mutants.md is the config's [[equivalent]] list, written by the runner.
  with open(os.path.join(REPO, "docs", "equivalent_mutants.md")) as f:
    written = f.read()
  assert written == mutation.equivalent_markdown(mutation.load_config()), (
      "docs/equivalent_mutants.md is stale: python scripts/mutation_test.py --equivalent "
      "> docs/equivalent_mutants.md")


def test_a_sample_of_seeded_bugs_is_killed(tmp_path, capsys, monkeypatch):
  # Three mutants of optim.py drawn at random, each run by cosmic-ray against the module's tests
  # in a copy of the tree (after a baseline run of the unmutated copy). The tree's digest is
  # pinned: an edit of the checkout while this test runs must not count as a changed tree.
  monkeypatch.setattr(mutation, "fingerprint", lambda root, names: "tree A")
  mutation.main(["--out", str(tmp_path), "--modules", "optim", "--sample", "3", "--workers", "1"])
  report = json.loads((tmp_path / "report.json").read_text())["optim"]
  assert report["killed"] + report["timeout"] == 3 and report["survived"] == 0, report
  assert report["score"] == 100.0
  assert (tmp_path / "survivors" / "optim.diff").read_text() == ""
  # The score is the sample's, and the report says so. Every mutant cosmic-ray made is one
  # work item: the 3 run, the ones not drawn, the equivalent and the filtered.
  with sqlite3.connect(tmp_path / "sessions" / "optim.0.sqlite") as db:
    made = db.execute("select count(*) from work_items").fetchone()[0]
  total = made - report["equivalent"] - report["filtered"]
  assert report["not_drawn"] == total - 3 > 0, (made, report)
  assert f"| optim | 3 of {total} (a sample) | " in (tmp_path / "report.md").read_text()
  assert report["seconds"] > 0 and report["seconds_per_mutant"] > 0  # mutation_select's times

  # A run stopped early (here: one result taken back) goes on with --resume: only the pending
  # mutant runs, the others' results stay as they were.
  with sqlite3.connect(tmp_path / "sessions" / "optim.0.sqlite") as db:
    done = db.execute("select job_id, output from work_results where worker_outcome = "
                      "'NORMAL' order by job_id").fetchall()
    db.execute("delete from work_results where job_id = ?", (done[0][0],))
  mutation.main(["--out", str(tmp_path), "--report"])
  assert json.loads((tmp_path / "report.json").read_text())["optim"]["pending"] == 1
  capsys.readouterr()
  mutation.main(["--out", str(tmp_path), "--resume"])
  # No file changed since the run: its coverage pass holds and is not run again.
  printed = capsys.readouterr().out
  assert "coverage pass and time limits are reused" in printed and "baseline:" not in printed
  report = json.loads((tmp_path / "report.json").read_text())["optim"]
  assert report["killed"] + report["timeout"] == 3 and report["pending"] == 0, report
  with sqlite3.connect(tmp_path / "sessions" / "optim.0.sqlite") as db:
    again = db.execute("select job_id, output from work_results where worker_outcome = "
                       "'NORMAL' order by job_id").fetchall()
    db.execute("delete from work_results where job_id = ?", (done[1][0],))
  # The result taken back is there again, so that mutant ran again (its output may well be
  # the same text, times included); the others' rows are the ones from before.
  assert [j for j, _ in again] == [j for j, _ in done] and again[1:] == done[1:]
  toml = (tmp_path / "sessions" / "optim.0.toml").read_text()
  assert json.dumps(str(tmp_path / "sessions" / "optim.select.json"))[1:-1] in toml
  # A file changed since (here: the digest differs): the coverage pass runs again, and its
  # time limit goes into the session and the record.
  monkeypatch.setattr(mutation, "fingerprint", lambda root, names: "tree B")
  monkeypatch.setattr(mutation, "baseline", mock.Mock(return_value={"optim": 123.0}))
  monkeypatch.setattr(mutation, "execute_all", mock.Mock())
  mutation.main(["--out", str(tmp_path), "--resume"])
  assert mutation.baseline.call_count == 1 and mutation.execute_all.call_count == 1
  assert "timeout = 123.0\n" in (tmp_path / "sessions" / "optim.0.toml").read_text()
  assert mutation.recorded_baselines(tmp_path)["optim"] == {"tree": "tree B", "timeout": 123.0}
  # The module must read as it did when mutated, or the pending mutants are other lines.
  (tmp_path / "sessions" / "optim.py").write_text("# changed\n")
  with pytest.raises(SystemExit, match="changed since the run"):
    mutation.main(["--out", str(tmp_path), "--resume"])


def test_the_tree_fingerprint_follows_every_file_git_would_copy(tmp_path, monkeypatch):
  git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
  subprocess.run(git + ["init", "-q", str(tmp_path)], check=True)
  (tmp_path / ".gitignore").write_text("runs/\n")
  (tmp_path / "a.py").write_text("x = 1\n")
  subprocess.run(git + ["add", "."], cwd=tmp_path, check=True)
  subprocess.run(git + ["commit", "-qm", "a"], cwd=tmp_path, check=True)

  def digest():
    return mutation.fingerprint(tmp_path, mutation.tree_files(tmp_path))

  first = digest()
  assert mutation.tree_files(tmp_path) == [".gitignore", "a.py"]
  (tmp_path / "runs").mkdir()
  (tmp_path / "runs" / "log.txt").write_text("ignored\n")
  assert digest() == first                                   # what git ignores is not copied
  (tmp_path / "a.py").write_text("x = 2\n")
  edited = digest()                                          # an edit, not yet committed
  (tmp_path / "a.py").write_text("x = 1\n")
  assert edited != first == digest()
  (tmp_path / "test_new.py").write_text("")                  # a new test file, untracked
  assert digest() != first
  (tmp_path / "test_new.py").unlink()
  monkeypatch.setenv("JAX_PLATFORMS", "cuda")                # another platform: other limits
  assert digest() != first
  # Per module: a later run of another module into the same --out keeps the first's record.
  (tmp_path / "sessions").mkdir()
  mutation.record_baseline(tmp_path, {"optim": 10.0}, "one")
  mutation.record_baseline(tmp_path, {"losses": 20.0}, "two")
  assert mutation.recorded_baselines(tmp_path) == {"optim": {"tree": "one", "timeout": 10.0},
                                                   "losses": {"tree": "two", "timeout": 20.0}}


def test_a_larger_sample_after_a_smaller_one_runs_only_the_mutants_it_did_not_draw(capsys):
  runnable = list(range(3, 92))
  first = mutation.draw(runnable, 40, seed=0)
  rest = mutation.draw(runnable, 89, seed=0, after_sample=40)
  assert len(first) == 40 and len(rest) == 49 and not first & rest
  assert first | rest == set(runnable) == mutation.draw(runnable, 89, seed=0)
  with pytest.raises(SystemExit):
    mutation.main(["--out", "unused", "--sample", "3", "--after_sample", "3"])
  with pytest.raises(SystemExit):  # the rest of a run takes that run's own choices
    mutation.main(["--out", "unused", "--resume", "--trust_coverage"])
  assert "leave out --trust_coverage" in capsys.readouterr().err


def test_the_report_says_how_many_mutants_a_partial_run_took():
  c = dict.fromkeys(["killed", "timeout", "survived", "incompetent", "pending", "not_drawn",
                     "unchanged"], 0)
  c.update(killed=30, timeout=1, survived=3)
  assert mutation.mutants_run(c) == "34 (all)"
  c.update(killed=2, timeout=0, survived=1, not_drawn=31)  # --sample 3
  assert mutation.mutants_run(c) == "3 of 34 (a sample)"
  c.update(not_drawn=0, unchanged=100, since="main")  # --since main
  assert mutation.mutants_run(c) == "3 of 103 (on lines changed since main)"
  c.update(not_drawn=9)  # both
  assert mutation.mutants_run(c) == "3 of 112 (a sample of the 12 on lines changed since main)"


def test_modules_default_to_the_core_and_all_means_every_module():
  config = mutation.load_config()
  core = mutation.module_names(config, "")
  assert core == config["core"] and "search" in core and "loop" not in core
  assert mutation.module_names(config, "all") == list(config["modules"])
  # --report and --retest take whatever was run into --out: every module by default.
  assert mutation.module_names(config, "", "all") == list(config["modules"])
  assert mutation.module_names(config, "loop,losses", "all") == ["loop", "losses"]
  with pytest.raises(SystemExit, match=r"\['lop'\] not in .*known: all, or"):
    mutation.module_names(config, "lop")


select = load_script("mutation_select")


def test_changed_lines_and_the_statement_around_them():
  code = ("import functools\n"                      # 1
          "@functools.cache\n"                      # 2
          "def f(x,\n"                              # 3
          "      n=2):\n"                           # 4
          "  if (x > 0 and\n"                       # 5
          "      n < 3):\n"                         # 6
          "    return (x +\n"                       # 7
          "            n)\n"                        # 8
          "  return 0\n")                           # 9
  mutated = code.replace("n < 3", "n <= 3")
  assert select.changed_lines(code, mutated) == [6]
  assert select.changed_lines(code, code.replace("@functools.cache\n", "")) == [2]
  assert select.statement_lines(code, 6) == [5, 6]         # the if's header, not its body
  assert select.statement_lines(code, 8) == [7, 8]
  assert select.statement_lines(code, 9) == [9]
  assert select.statement_lines(code, 4) == [3, 4]         # a default argument: the def line
  assert select.statement_lines(code, 2) is None           # a decorator: every test


def test_selection_runs_the_tests_of_the_mutated_lines_fastest_first():
  code = "a = 1\nb = 2\nc = 3\n"
  lines = {"1": ["t::x", "t::y"], "2": [select.ALL]}
  durations = {"t::x": 5.0, "t::y": 1.0}
  assert select.select(lines, durations, code, code.replace("a = 1", "a = 2")) == ["t::y", "t::x"]
  assert select.select(lines, durations, code, code.replace("b = 2", "b = 3")) is None
  assert select.select(lines, durations, code, code.replace("c = 3", "c = 4")) == []


def test_coverage_map_sees_every_test_that_runs_a_jitted_line(tmp_path):
  # Two tests call one jitted function. Without the plugin's cache clearing only the first
  # traces it (the second hits the jit cache), and a mutant there would run one test of two.
  (tmp_path / "pkg").mkdir()
  (tmp_path / "pkg" / "__init__.py").write_text("")
  (tmp_path / "pkg" / "mod.py").write_text(
      "import jax\n\n\n@jax.jit\ndef double(x):\n  return x * 2\n\n\n"
      "def fixture_value():\n  return 3\n\n\ndef unused():\n  return 4\n")
  (tmp_path / "test_mod.py").write_text(
      "import pytest\nfrom pkg import mod\n\n\n@pytest.fixture(scope='module')\n"
      "def value():\n  return mod.fixture_value()\n\n\n"
      "def test_a(value):\n  assert mod.double(value) == 6\n\n\n"
      "def test_b(value):\n  assert mod.double(1) == 2\n\n\ndef test_c():\n  pass\n")
  env = dict(os.environ, COVERAGE_FILE=str(tmp_path / "cov"),
             MUTATION_DURATIONS=str(tmp_path / "durations.json"),
             PYTHONPATH=os.pathsep.join([str(tmp_path), os.path.join(REPO, "tests", "mutation")]))
  subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o",
                  "addopts=", "--cov=pkg", "--cov-context=test", "--cov-report=",
                  "-p", "pytest_plugin", "test_mod.py"], cwd=tmp_path, env=env, check=True)
  durations = json.loads((tmp_path / "durations.json").read_text())
  assert sorted(durations) == ["test_mod.py::test_a", "test_mod.py::test_b", "test_mod.py::test_c"]
  lines = select.coverage_map(tmp_path / "cov", "pkg/mod.py", durations)
  assert lines["6"] == ["test_mod.py::test_a", "test_mod.py::test_b"]   # x * 2, traced by both
  # The module-scoped fixture ran in test_a's setup: it serves the whole file.
  assert lines["10"] == sorted(durations)
  assert lines["1"] == [select.ALL]                  # import time
  assert "14" not in lines                           # never run
  # The coverage pass runs each test once for all modules: another run (another module's
  # tests) adds its file's data, and only the tests in `durations` count.
  (tmp_path / "test_other.py").write_text(
      "from pkg import mod\n\n\ndef test_d():\n  assert mod.unused() == 4\n")
  subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o",
                  "addopts=", "--cov=pkg", "--cov-context=test", "--cov-report=",
                  "-p", "pytest_plugin", "test_other.py", "test_mod.py::test_c"], cwd=tmp_path,
                 env=dict(env, COVERAGE_FILE=str(tmp_path / "cov2")), check=True)
  both = select.coverage_map([tmp_path / "cov", tmp_path / "cov2"], "pkg/mod.py", durations)
  assert both == lines                               # test_d is not one of the module's
  with_d = dict(durations, **{"test_other.py::test_d": 1.0})
  both = select.coverage_map([tmp_path / "cov", tmp_path / "cov2"], "pkg/mod.py", with_d)
  assert both["14"] == ["test_other.py::test_d"]
  assert both["6"] == lines["6"]


def test_the_coverage_pass_lists_each_test_once_with_the_deselections_all_modules_make():
  config = {"modules": {
      "a": {"tests": ["tests/test_losses.py", "tests/test_optim.py::test_x"],
            "deselect": ["tests/test_losses.py::t1"]},
      "b": {"tests": ["tests/test_optim.py"], "deselect": ["tests/test_optim.py::t2"]},
      "c": {"tests": ["tests/test_losses.py"]}}}
  # test_optim.py::test_x runs with the whole file. t1 runs, since module c keeps it; t2 does
  # not, since the only module that runs it (b) deselects it.
  groups = mutation.coverage_groups(config, ["a", "b", "c"], 1)
  assert [sorted(g) for g in groups] == [
      ["--deselect=tests/test_optim.py::t2", "tests/test_losses.py", "tests/test_optim.py"]]
  assert [sorted(g) for g in mutation.coverage_groups(config, ["a"], 1)] == [
      ["--deselect=tests/test_losses.py::t1", "tests/test_losses.py",
       "tests/test_optim.py::test_x"]]
  assert sorted(map(sorted, mutation.coverage_groups(config, ["a", "b", "c"], 2))) == [
      ["--deselect=tests/test_optim.py::t2", "tests/test_optim.py"], ["tests/test_losses.py"]]
  durations = {"tests/test_losses.py::t1": 1.0, "tests/test_losses.py::t3[0]": 1.0,
               "tests/test_optim.py::test_x[1]": 1.0, "tests/test_optim.py::t2": 1.0}
  assert sorted(mutation.module_durations(config["modules"]["a"], durations)) == [
      "tests/test_losses.py::t3[0]", "tests/test_optim.py::test_x[1]"]
  assert sorted(mutation.module_durations(config["modules"]["b"], durations)) == [
      "tests/test_optim.py::test_x[1]"]


def test_a_mutant_no_test_executes_is_still_run_against_the_whole_list(tmp_path, capfd):
  (tmp_path / "m.py").write_text("a = 1\n")
  (tmp_path / "orig.py").write_text("a = 1\n")
  (tmp_path / "test_m.py").write_text("import m\n\ndef test_m():\n  assert m.a == 1\n")
  spec = {"module_path": "m.py", "original": "orig.py", "tests": ["test_m.py"], "deselect": [],
          "confirm": True, "durations": {}, "lines": {}}
  (tmp_path / "sel.json").write_text(json.dumps(spec))
  (tmp_path / "m.py").write_text("a = 2\n")
  # Line 1 has no test in the map ("not executed"), but the whole list confirms and kills it.
  assert select.run(tmp_path / "sel.json", cwd=tmp_path) != 0
  assert select.NOT_EXECUTED in capfd.readouterr().out
  (tmp_path / "sel.json").write_text(json.dumps(dict(spec, confirm=False)))
  assert select.run(tmp_path / "sel.json", cwd=tmp_path) == 0   # --trust_coverage
  # A selected test that no longer exists (pytest exits 4, not 1) is no verdict: the whole
  # list gives it, and here the mutant survives it.
  (tmp_path / "m.py").write_text("a = 1 + 0\n")
  (tmp_path / "sel.json").write_text(json.dumps(dict(spec, lines={"1": ["test_m.py::gone"]})))
  assert select.run(tmp_path / "sel.json", cwd=tmp_path) == 0
  assert "the whole list confirms" in capfd.readouterr().out


def test_a_survivor_is_applied_to_the_current_code_at_its_nearest_line():
  code = "def f(x):\n  return x + 1\n\n\ndef g(x):\n  return x + 1\n"
  # The line moved by a few lines since the first run: the nearest equal line is taken.
  assert (mutation.apply_survivor(code, 7, "return x + 1", "return x - 1")
          == "def f(x):\n  return x + 1\n\n\ndef g(x):\n  return x - 1\n")
  assert mutation.apply_survivor(code, 1, "return x + 1", "return x - 1").startswith(
      "def f(x):\n  return x - 1\n")
  assert mutation.apply_survivor(code, 2, "return x * 2", "return x / 2") is None  # gone


def test_a_mutant_that_hangs_is_stopped_at_its_tests_time_limit(tmp_path, capfd, monkeypatch):
  # The limit is the selected tests' unmutated time x TIMEOUT_FACTOR + TIMEOUT_SLACK, not
  # cosmic-ray's limit for the whole list: a mutant that loops forever costs seconds.
  assert select.time_limit({"a": 1.0, "b": 2.0}, ["b"]) == 2.0 * select.TIMEOUT_FACTOR + 30.0
  assert select.time_limit({"a": 1.0, "b": 2.0}, None) == 3.0 * select.TIMEOUT_FACTOR + 30.0
  monkeypatch.setattr(select, "TIMEOUT_SLACK", 3.0)
  (tmp_path / "orig.py").write_text("a = 1\n")
  (tmp_path / "m.py").write_text("a = 1\nwhile a: pass\n")  # the mutant: an endless loop
  (tmp_path / "test_m.py").write_text("import m\n\ndef test_m():\n  assert m.a == 1\n")
  spec = {"module_path": "m.py", "original": "orig.py", "tests": ["test_m.py"], "deselect": [],
          "confirm": True, "durations": {"test_m.py::test_m": 0.1},
          "lines": {"1": ["test_m.py::test_m"]}}
  (tmp_path / "sel.json").write_text(json.dumps(spec))
  start = time.monotonic()
  assert select.run(tmp_path / "sel.json", cwd=tmp_path) == 124
  assert time.monotonic() - start < 60
  out = capfd.readouterr().out
  assert select.TIMED_OUT in out and "the whole list confirms" not in out
  # ... and the report counts it as a timeout (caught), not a plain kill.
  result = mutation.WorkResult(output=out, test_outcome=mutation.TestOutcome.KILLED,
                               worker_outcome=mutation.WorkerOutcome.NORMAL)
  assert mutation.outcome(result) == "timeout"
  failed = mutation.WorkResult(output="1 failed", test_outcome=mutation.TestOutcome.KILLED,
                               worker_outcome=mutation.WorkerOutcome.NORMAL)
  assert mutation.outcome(failed) == "killed"


def test_a_test_that_hangs_is_stopped_at_its_own_time_limit(tmp_path, capfd, monkeypatch):
  # The first selected test hangs: the run stops after that test's limit (its unmutated time
  # x TIMEOUT_FACTOR + TEST_SLACK), not after the time of every selected test, and names it.
  assert select.test_limits({"a": 2.0}) == {"a": 2.0 * select.TIMEOUT_FACTOR + select.TEST_SLACK}
  monkeypatch.setattr(select, "TIMEOUT_SLACK", 600.0)
  monkeypatch.setattr(select, "TEST_SLACK", 2.0)
  (tmp_path / "orig.py").write_text("def f():\n  return 1\n")
  (tmp_path / "m.py").write_text("def f():\n  while True: pass\n")  # the mutant
  (tmp_path / "test_m.py").write_text(
      "import m\n\ndef test_fast():\n  assert m.f() == 1\n\ndef test_slow():\n  pass\n")
  durations = {"test_m.py::test_fast": 0.1, "test_m.py::test_slow": 100.0}
  spec = {"module_path": "m.py", "original": "orig.py", "tests": ["test_m.py"], "deselect": [],
          "confirm": True, "durations": durations,
          "lines": {"2": ["test_m.py::test_fast", "test_m.py::test_slow"]}}
  (tmp_path / "sel.json").write_text(json.dumps(spec))
  start = time.monotonic()
  assert select.run(tmp_path / "sel.json", cwd=tmp_path) == 124
  assert time.monotonic() - start < 60   # the run's own limit is 3 x 100.1 + 600 s
  out = capfd.readouterr().out
  assert f"{select.TIMED_OUT}: test_m.py::test_fast still running after 2 s" in out
  # The unmutated function passes under the same limits.
  (tmp_path / "m.py").write_text("def f():\n  return 1\n")
  assert select.run(tmp_path / "sel.json", cwd=tmp_path) == 0


def test_since_selects_the_lines_changed_since_a_revision(tmp_path):
  def git(*args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path,
                   check=True, capture_output=True)
  git("init", "-q")
  (tmp_path / "m.py").write_text("a = 1\nb = 2\nc = 3\nd = 4\ne = 5\n")
  git("add", "m.py")
  git("commit", "-qm", "first")
  # b changed, d removed, two lines added after e: the working tree's lines 2, 5 and 6.
  (tmp_path / "m.py").write_text("a = 1\nb = 20\nc = 3\ne = 5\nf = 6\ng = 7\n")
  assert mutation.lines_changed_since("HEAD", "m.py", tmp_path) == {2, 5, 6}
  with pytest.raises(SystemExit, match="--since nosuchrev"):
    mutation.lines_changed_since("nosuchrev", "m.py", tmp_path)
