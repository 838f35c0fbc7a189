"""The files go to xdist's workers longest first (tests/file_order.py, tests/conftest.py)."""
import glob
import json
import os

import file_order  # tests/ is on sys.path

TESTS = os.path.dirname(os.path.abspath(__file__))

LOG = """\
============================= slowest durations ==============================
73.16s call     tests/test_slurm.py::test_preempted[a-b]
29.20s setup    tests/test_slurm.py::test_srun
0.50s teardown tests/test_slurm.py::test_srun
2.25s call     /abs/path/tests/test_model.py::test_variants_run
[gw0] [ 51%] PASSED tests/test_sweeps.py::test_x
12.00s call     tests/test_model.py::TestClass::test_method
(1794 durations < 0.005s hidden.  Use -vv to show these durations.)
"""


def test_file_seconds_sum_each_files_setups_calls_and_teardowns():
  assert file_order.file_seconds(LOG) == {"test_slurm.py": 73.16 + 29.20 + 0.50,
                                          "test_model.py": 2.25 + 12.00}


def test_longest_first_keeps_each_files_tests_together_and_in_order():
  nodeids = ["tests/test_a.py::t1", "tests/test_a.py::t2[x]", "tests/test_b.py::t1",
             "tests/test_new.py::t1", "tests/test_c.py::t2", "tests/test_c.py::t1",
             "tests/test_d.py::t1", "tests/test_b.py::t0"]
  seconds = {"test_a.py": 5.0, "test_b.py": 50.0, "test_c.py": 5.0, "test_d.py": 7.0}
  assert file_order.longest_first(nodeids, seconds) == [
      "tests/test_b.py::t1", "tests/test_b.py::t0", "tests/test_d.py::t1",
      "tests/test_a.py::t1", "tests/test_a.py::t2[x]", "tests/test_c.py::t2",
      "tests/test_c.py::t1", "tests/test_new.py::t1"]


def test_every_test_file_has_its_seconds_and_every_entry_a_file():
  listed = set(file_order.load())
  files = {os.path.basename(p) for p in glob.glob(os.path.join(TESTS, "test_*.py"))}
  assert not files - listed, (
      f"{sorted(files - listed)}: not in tests/file_seconds.json, so they go to the workers "
      "last; add each with its seconds (python tests/file_order.py LOG, or an estimate)")
  assert not listed - files, f"{sorted(listed - files)}: in tests/file_seconds.json, no such file"


def test_this_session_runs_its_files_longest_first(request, pytestconfig):
  nodeids = [item.nodeid for item in request.session.items]
  assert nodeids == file_order.longest_first(nodeids, file_order.load())
  if hasattr(pytestconfig.option, "loadscopereorder"):  # xdist installed
    assert pytestconfig.option.loadscopereorder is False


def test_the_script_writes_the_seconds_longest_first(tmp_path, monkeypatch, capsys):
  log = tmp_path / "suite.log"
  log.write_text(LOG)
  for name in ("test_slurm.py", "test_model.py", "test_quick.py", "test_new.py"):
    (tmp_path / name).write_text("")
  # test_quick.py's tests all took under 5 ms (no --durations line): it keeps its figure; a
  # new file of such tests is listed with 0.
  (tmp_path / "file_seconds.json").write_text('{"test_quick.py": 0.3, "test_gone.py": 9}')
  monkeypatch.setattr(file_order, "SECONDS", tmp_path / "file_seconds.json")
  assert file_order.main([str(log)]) == 0
  written = json.loads((tmp_path / "file_seconds.json").read_text())
  assert list(written.items()) == [("test_slurm.py", 102.9), ("test_model.py", 14.2),
                                   ("test_quick.py", 0.3), ("test_new.py", 0.0)]
  (tmp_path / "empty.log").write_text("no durations here\n")
  assert file_order.main([str(tmp_path / "empty.log")]) == 1
  assert "no --durations lines" in capsys.readouterr().err
