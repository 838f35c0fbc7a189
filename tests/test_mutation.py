"""The mutation-testing setup (scripts/mutation_test.py, tests/mutation/config.toml) stays true to
the code: its test lists exist, its equivalent mutants are still mutants of the current code, and
a sample of seeded bugs in one module is run through cosmic-ray and killed."""
import ast
import json
import os

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


def test_every_equivalent_entry_still_names_a_mutant(tmp_path):
  config = mutation.load_config()
  entries = config.get("equivalent", [])
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
def test_a_sample_of_seeded_bugs_is_killed(tmp_path):
  # Three mutants of optim.py drawn at random, each run by cosmic-ray against the module's tests
  # in a copy of the tree (after a baseline run of the unmutated copy).
  mutation.main(["--out", str(tmp_path), "--modules", "optim", "--sample", "3", "--workers", "1"])
  report = json.loads((tmp_path / "report.json").read_text())["optim"]
  assert report["killed"] + report["timeout"] == 3 and report["survived"] == 0, report
  assert report["score"] == 100.0
  assert (tmp_path / "survivors" / "optim.diff").read_text() == ""
  assert "| optim | " in (tmp_path / "report.md").read_text()
