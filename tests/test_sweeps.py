"""Sweeps: point helpers, names, skip/fail/resume bookkeeping, SLURM script, report, end to end."""
import csv
import dataclasses
import functools
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time

from absl import flags
import matplotlib
from ml_collections import config_flags
import numpy as np
import pytest
import sacrebleu

from transformer_jax import bleu as bleu_lib
from transformer_jax import sweeps
from transformer_jax.data import get_data
from transformer_jax.run import metrics
from transformer_jax.run.best import BestKeeper
from transformer_jax.sweeps import compare as sweeps_compare
from transformer_jax.sweeps import slurm as sweeps_slurm
from transformer_jax.sweeps.report import figure, log_scale, markdown, run_row, search_text

from scripts_under_test import load_script
import tiny_config  # tests/ is on sys.path: pytest puts a test file's directory there
import xla_env

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(REPO, "tests", "tiny_config.py")


def load_sweep_script():
  return load_script("sweep")


def test_product_zipped_cross_chain():
  assert sweeps.product(a=[1, 2], b=["x", "y"]) == [
      {"a": 1, "b": "x"}, {"a": 1, "b": "y"}, {"a": 2, "b": "x"}, {"a": 2, "b": "y"}]
  assert sweeps.zipped(d=[1, 2], h=[3, 4]) == [{"d": 1, "h": 3}, {"d": 2, "h": 4}]
  with pytest.raises(ValueError, match="different lengths"):
    sweeps.zipped(d=[1, 2], h=[3])
  assert sweeps.cross(sweeps.zipped(d=[1, 2], h=[3, 4]), sweeps.product(lr=[0.1])) == [
      {"d": 1, "h": 3, "lr": 0.1}, {"d": 2, "h": 4, "lr": 0.1}]
  with pytest.raises(ValueError, match="set by two groups"):
    sweeps.cross([{"a": 1}], [{"a": 2}])
  assert sweeps.chain([{"a": 1}], [{"a": 1}, {"a": 2}]) == [{"a": 1}, {"a": 2}]
  # The same point written in another key order (a cross of groups in another order) is one.
  assert sweeps.chain([{"a": 1, "b": 2}], [{"b": 2, "a": 1}]) == [{"a": 1, "b": 2}]


def test_product_and_zipped_refuse_one_value_where_a_list_belongs():
  # A string is iterable: "gelu" would sweep "g", "e", "l", "u", and "pre" zip with 3 seeds.
  with pytest.raises(sweeps.SweepError,
                     match=r"product: model.activation='gelu' is one value.*\['gelu'\]"):
    sweeps.product(**{"model.activation": "gelu", "learning_rate": [1.0, 2.0]})
  with pytest.raises(sweeps.SweepError, match=r"zipped: model.norm_position='pre' is one value"):
    sweeps.zipped(**{"model.norm_position": "pre", "seed": [1, 2, 3]})
  with pytest.raises(sweeps.SweepError, match=r"product: seed=3 is one value.*seed=\[3\]"):
    sweeps.product(seed=3, learning_rate=[1.0])
  with pytest.raises(sweeps.SweepError, match="zipped: tag=b'ab' is one value"):
    sweeps.zipped(tag=b"ab", seed=[1, 2])
  # Any other iterable is a list of values, also one that has no len().
  assert sweeps.zipped(a=iter([1, 2]), b=(3, 4)) == [{"a": 1, "b": 3}, {"a": 2, "b": 4}]


def test_a_misspelt_parent_field_is_named_not_a_key_error(tmp_path):
  base = tiny_config.get_config()
  with pytest.raises(sweeps.SweepError, match=(
      r"no field 'modle' \(in 'modle.d_model'\); did you mean 'model'\?")):
    sweeps.apply_overrides(base, {"modle.d_model": 64})
  with pytest.raises(sweeps.SweepError, match=r"no field 'learning_rate.x'$"):
    sweeps.apply_overrides(base, {"learning_rate.x": 1.0})   # below a leaf
  assert sweeps.apply_overrides(base, {"model.d_model": 64}).model.d_model == 64
  typo = tmp_path / "typo.py"
  typo.write_text("from tiny_config import get_config\n"
                  "def sweep():\n  return [{'model.d_model': 32}, {'modle.d_model': 64}]\n")
  with pytest.raises(sweeps.SweepError, match="no field 'modle'"):
    sweeps.load_sweep(str(typo))


def test_a_none_value_is_passed_only_where_train_py_reads_it_back(tmp_path, capsys):
  """`--config.FIELD=None` reaches train.py as None only for a field whose default is None (a
  path: transformer_jax/cli.py unsets it); elsewhere as the string "None" (a str field) or
  refused (a number), so such a point's None fails before anything runs."""
  from transformer_jax import cli
  with pytest.raises(sweeps.SweepError, match=(
      r"model.attention_impl=None cannot be passed.*leave 'model.attention_impl' out of the "
      "point")):
    sweeps.override_flags({"learning_rate": 1.0, "model.attention_impl": None})
  with pytest.raises(sweeps.SweepError, match="learning_rate=None cannot be passed"):
    sweeps.override_flags({"learning_rate": None})
  nones = tmp_path / "nones.py"
  nones.write_text("from tiny_config import get_config\n"
                   "def sweep():\n  return [{'model.activation': 'gelu'},"
                   " {'model.activation': None}]\n")
  with pytest.raises(sweeps.SweepError, match="model.activation=None cannot be passed"):
    sweeps.load_sweep(str(nones))
  # A path's None (unset) is a flag, which train.py's command line reads back as None.
  point = {"data.vocab_path": None, "data.data_dir": None, "learning_rate": 1.0}
  flags_of_point = sweeps.override_flags(point)
  assert flags_of_point == ["--config.data.vocab_path=None", "--config.data.data_dir=None",
                            "--config.learning_rate=1.0"]
  seen = {}

  def body(values, args):
    seen.update(vocab_path=values.config.data.vocab_path, data_dir=values.config.data.data_dir,
                learning_rate=values.config.learning_rate)
  assert cli.run(body, flags_of_point, doc="", config=TINY) == 0, capsys.readouterr().err
  assert seen == {"vocab_path": None, "data_dir": None, "learning_rate": 1.0}
  paths = tmp_path / "paths.py"
  paths.write_text("from tiny_config import get_config\n"
                   "def sweep():\n  return [{'data.vocab_path': '/spm.model'},"
                   " {'data.vocab_path': None}]\n")
  assert [p["data.vocab_path"] for p in sweeps.load_sweep(str(paths)).points] == [
      "/spm.model", None]
  # None inside a container has a literal, which config flags read back.
  assert sweeps.override_flags({"x": (1, None)}) == ["--config.x=(1, None)"]


def test_names_flags_and_values():
  assert sweeps.point_name({"warmup_steps": 10, "learning_rate": 0.5}) == (
      "learning_rate=0.5,warmup_steps=10")
  assert sweeps.point_name({}) == "default"
  odd = sweeps.point_name({"data.vocab_path": "/a/b.model"})
  assert "/" not in odd and odd.startswith("data.vocab_path=_a_b.model-")
  assert sweeps.point_name({"x": "/a"}) != sweeps.point_name({"x": "_a"})
  long = sweeps.point_name({"f": "v" * 500})
  assert len(long) <= 120 and long != sweeps.point_name({"f": "v" * 499})
  assert sweeps.override_flags({"model.norm_position": "pre", "async_checkpointing": False,
                                "learning_rate": 2.0}) == [
      "--config.model.norm_position=pre", "--config.async_checkpointing=false",
      "--config.learning_rate=2.0"]
  # The flags parse back, through ml_collections' config flags as scripts/train.py reads them,
  # into the values they came from.
  point = {"num_train_steps": 3, "schedule": "constant", "async_checkpointing": True,
           "learning_rate": 2e-05, "data.bucket_boundaries": (8, 16), "mesh.data": 2,
           "data.data_dir": "/tmp/x"}
  argv = ["train.py", "--config", TINY, *sweeps.override_flags(point)]
  values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=values, sys_argv=argv)
  values(argv)
  assert config_flags.get_override_values(values["config"]) == point
  env = sweeps.slot_env(1, 2, {"XLA_FLAGS": "--xla_force_host_platform_device_count=8 --foo"})
  assert env["CUDA_VISIBLE_DEVICES"] == "2,3"
  assert env["XLA_FLAGS"] == "--foo --xla_force_host_platform_device_count=2"


def test_points_from_config_checks_fields(tmp_path):
  good = sweeps.points_from_config(TINY)
  assert len(good) == 4 and {p["warmup_steps"] for p in good} == {5, 10}
  bad = tmp_path / "bad.py"
  bad.write_text("from transformer_jax.experiment import base_config\n"
                 "def get_config(arg=None):\n  return base_config('tiny')\n"
                 "def sweep(arg):\n  return [{'learning_rat': 1.0}]\n")
  with pytest.raises(ValueError, match="no field 'learning_rat'"):
    sweeps.points_from_config(str(bad) + ":x")
  none = tmp_path / "none.py"
  none.write_text("def get_config():\n  return None\n")
  with pytest.raises(ValueError, match="no sweep"):
    sweeps.points_from_config(str(none))


# A stand-in for scripts/train.py: logs metrics like the real one, fails where told to.
FAKE_TRAIN = textwrap.dedent("""
    import json, os, sys
    args = sys.argv[1:]
    workdir = args[args.index("--workdir") + 1]
    flags = dict(a[len("--config."):].split("=", 1) for a in args if a.startswith("--config."))
    lr, warmup = float(flags["learning_rate"]), int(flags["warmup_steps"])
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "calls"), "a") as f:
      f.write("x")
    if lr == 2.0 and warmup == 5:
      raise SystemExit("boom: this point fails")
    stop_at = int(os.environ.get("FAKE_STOP_AT", 3))  # as SIGTERM does: save, exit 0
    with open(os.path.join(workdir, "metrics.jsonl"), "a") as f:
      for step in range(1, stop_at + 1):
        f.write(json.dumps({"step": step, "train_loss": 5.0 / step, "learning_rate": 1e-3})
                + "\\n")
      os.makedirs(os.path.join(workdir, "checkpoints", str(stop_at)), exist_ok=True)
      if stop_at == 3:
        f.write(json.dumps({"step": 3, "bleu": 10 * lr + warmup, "eval_loss": 1 / lr}) + "\\n")
      if os.environ.get("FAKE_STOPPED_EARLY"):  # as config.early_stopping_patience ends a run
        os.makedirs(os.path.join(workdir, "checkpoints", str(stop_at), "state"), exist_ok=True)
        f.write(json.dumps({"step": stop_at, "stopped_early": {"metric": "bleu"}}) + "\\n")
""")


def _calls(sweep_dir, point):
  with open(os.path.join(sweeps.point_dir(sweep_dir, point), "calls")) as f:
    return len(f.read())


def test_point_names_stay_as_they_were_named(tmp_path):
  """A point's name is its workdir: a re-run finds its finished points by it, so the format, the
  cut at 120 characters and the hash must not change (every point would start anew)."""
  # The hash is of the point with its keys sorted: the order it was written in does not count.
  assert sweeps.point_name({"x": "/a", "w": 1}) == "w=1,x=_a-775a2429"
  assert sweeps.point_name({"w": 1, "x": "/a"}) == "w=1,x=_a-775a2429"
  assert sweeps.point_name({"f": "v" * 118}) == "f=" + "v" * 118        # 120 characters: whole
  assert sweeps.point_name({"f": "v" * 119}) == "f=" + "v" * 108 + "-a065906e"   # 121: cut
  # 120 characters with one replaced: whole, and the hash after it.
  assert sweeps.point_name({"f": "/" + "v" * 117}) == "f=_" + "v" * 117 + "-6f9a614a"
  # A sweep() that returns a point twice would run it twice into one workdir: refused.
  twice = tmp_path / "twice.py"
  twice.write_text("from tiny_config import get_config\n"
                   "def sweep():\n  return [{'seed': 1}, {'seed': 2}, {'seed': 1}]\n")
  with pytest.raises(sweeps.SweepError, match=r"returns the same point twice: \['seed=1'\]"):
    sweeps.load_sweep(str(twice))


def test_runner_records_failures_skips_done_and_reports(tmp_path, monkeypatch):
  fake = tmp_path / "fake_train.py"
  fake.write_text(FAKE_TRAIN)
  sweep_dir = str(tmp_path / "sweep")
  runner = sweeps.Runner(TINY, sweep_dir, str(fake), {"num_train_steps": 3})
  assert runner.num_steps == [3, 3, 3, 3]
  # Stopped (exit 0) after step 2 of 3: no marker, and the next run resumes it.
  monkeypatch.setenv("FAKE_STOP_AT", "2")
  assert runner.run([0], log=lambda s: None)[0]["status"] == "stopped"
  assert runner.status(0) == "partial"
  assert not os.path.exists(os.path.join(sweeps.point_dir(sweep_dir, runner.points[0]),
                                         sweeps.DONE))
  monkeypatch.delenv("FAKE_STOP_AT")
  lines = []
  results = runner.run(log=lines.append)
  # One point at a time unless told: each ends before the next starts.
  assert [line.split(": ")[1].split(" ")[0] for line in lines] == ["started", "done"] * 2 + [
      "started", "failed", "started", "done"], lines
  assert not [line for line in lines if "slot" in line]   # one slot: not named
  assert all(0 < r["seconds"] < 300 for r in results), results   # each from its own start
  by_name = {r["name"]: r for r in results}
  failed = sweeps.point_name({"learning_rate": 2.0, "warmup_steps": 5})
  assert by_name[failed]["status"] == "failed"
  assert [r["status"] for r in results].count("done") == 3   # the others went on
  failed_file = os.path.join(sweep_dir, failed, sweeps.FAILED)
  text = open(failed_file).read()
  assert "exit status 1" in text and "boom: this point fails" in text
  with open(os.path.join(sweep_dir, "status.json")) as f:
    assert [r["status"] for r in json.load(f)] == [r["status"] for r in results]

  # Re-run: done points are skipped, the failed one runs again.
  again = sweeps.Runner(TINY, sweep_dir, str(fake), {"num_train_steps": 3})
  results = again.run(log=lambda s: None)
  assert [r["status"] for r in results].count("skipped (done)") == 3
  assert _calls(sweep_dir, {"learning_rate": 1.0, "warmup_steps": 5}) == 2  # stopped, then done
  assert _calls(sweep_dir, {"learning_rate": 2.0, "warmup_steps": 5}) == 2
  # One point by index, as a SLURM array task runs it.
  lines = []
  assert again.run([0], log=lines.append)[0]["status"] == "skipped (done)"
  assert lines == [f"[0] {sweeps.point_name(again.points[0])}: already done, skipped"]
  assert again.run([2], log=lambda s: None)[0]["status"] == "failed"
  assert _calls(sweep_dir, {"learning_rate": 2.0, "warmup_steps": 5}) == 3
  for i in (4, -1):
    with pytest.raises(sweeps.SweepError, match=rf"--point {i}: this sweep has points 0..3"):
      again.run([i])
  # A point that saved and evaluated its last step counts as done without a DONE marker;
  # without the final evaluation (killed during it) it does not.
  done_dir = sweeps.point_dir(sweep_dir, {"learning_rate": 1.0, "warmup_steps": 10})
  os.remove(os.path.join(done_dir, sweeps.DONE))
  assert again.status(1) == "done"
  assert sweeps.status(done_dir, num_train_steps=4) == "partial"
  metrics_path = os.path.join(done_dir, "metrics.jsonl")
  lines = open(metrics_path).readlines()
  with open(metrics_path, "w") as f:
    f.writelines(line for line in lines if "bleu" not in line)
  assert again.status(1) == "partial"
  with open(metrics_path, "w") as f:
    f.writelines(lines)

  out = sweeps.report(sweep_dir, metric="bleu")
  assert [r["name"] for r in out["rows"]][:3] == [
      "learning_rate=2,warmup_steps=10", "learning_rate=1,warmup_steps=10",
      "learning_rate=1,warmup_steps=5"]
  assert out["rows"][-1]["status"] == "failed" and "bleu" not in out["rows"][-1]
  with open(os.path.join(sweep_dir, "report.csv")) as f:
    rows = list(csv.DictReader(f))
  assert float(rows[0]["bleu"]) == 30 and rows[0]["learning_rate"] == "2.0"
  assert "| name | learning_rate | warmup_steps | status |" in out["markdown"]
  assert os.path.getsize(os.path.join(sweep_dir, "report_bleu.png")) > 1000
  # Losses sort ascending.
  assert sweeps.report(sweep_dir, metric="eval_loss")["rows"][0]["learning_rate"] == 2.0


def test_a_point_that_stopped_early_is_done_and_its_marker_says_where(tmp_path, monkeypatch):
  fake = tmp_path / "fake_train.py"
  fake.write_text(FAKE_TRAIN)
  sweep_dir = str(tmp_path / "sweep")
  runner = sweeps.Runner(TINY, sweep_dir, str(fake), {"num_train_steps": 3})
  monkeypatch.setenv("FAKE_STOP_AT", "2")
  monkeypatch.setenv("FAKE_STOPPED_EARLY", "1")
  assert runner.run([0], log=lambda s: None)[0]["status"] == "done"  # not "stopped"
  d = sweeps.point_dir(sweep_dir, runner.points[0])
  assert "stopped early at step 2\n" in open(os.path.join(d, sweeps.DONE)).read()
  os.remove(os.path.join(d, sweeps.DONE))
  assert runner.status(0) == "done" and sweeps.status(d) == "done"  # also without the marker
  assert runner.run([0], log=lambda s: None)[0]["status"] == "skipped (done)"
  row = sweeps.report(sweep_dir, metric="train_loss")["rows"][0]
  assert (row["status"], row["step"], row["stopped_early"]) == ("done", 2, 2)


def test_the_requeue_check_of_docs_scaling_md_ends_at_early_stopping(tmp_path, monkeypatch):
  """The sbatch script in docs/scaling.md requeues a job until its run has ended. Its check was
  the last step's checkpoint, which a run stopped early never writes: requeued forever. The
  doc's command, run as written (but for the workdir and the step), on runs the fake trainer
  left finished, stopped early, and stopped by a signal."""
  doc = open(os.path.join(REPO, "docs", "scaling.md")).read()
  check = re.search(r'(python -c "import sys; from transformer_jax[^"]*")\n'
                    r'if \[ \$\? -eq 3 \]; then scontrol requeue', doc).group(1)
  assert "'runs/big', 300000" in check
  fake = tmp_path / "fake_train.py"
  fake.write_text(FAKE_TRAIN)
  runner = sweeps.Runner(TINY, str(tmp_path / "sweep"), str(fake), {"num_train_steps": 3})
  for i, (stop_at, early, ended) in enumerate([(3, "", True), (2, "1", True), (2, "", False)]):
    monkeypatch.setenv("FAKE_STOP_AT", str(stop_at))
    monkeypatch.setenv("FAKE_STOPPED_EARLY", early)
    runner.run([i], log=lambda s: None)
    workdir = sweeps.point_dir(runner.sweep_dir, runner.points[i])
    command = check.replace("'runs/big', 300000", f"{workdir!r}, 3")
    proc = subprocess.run(["bash", "-c", command], cwd=REPO, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=REPO))
    assert proc.returncode == (0 if ended else 3), (i, proc.stderr)
  # The check failing itself (here an import that fails): not 3, so the job is not requeued
  # for ever.
  broken = tmp_path / "broken" / "transformer_jax"
  broken.mkdir(parents=True)
  (broken / "__init__.py").write_text("raise ImportError('not this checkout')\n")
  proc = subprocess.run(["bash", "-c", command], cwd=str(tmp_path), capture_output=True,
                        text=True, env=dict(os.environ, PYTHONPATH=str(broken.parent)))
  assert proc.returncode == 1 and "not this checkout" in proc.stderr, proc.stderr


def test_points_run_one_by_one_update_their_entries_of_status_json(tmp_path):
  """`--point i` (a SLURM array task, or a point run by hand) records its outcome in status.json
  beside the other points', in point order; an entry of a point the sweep no longer has goes."""
  fake = tmp_path / "fake_train.py"
  fake.write_text(FAKE_TRAIN)
  sweep_dir = str(tmp_path / "sweep")
  path = os.path.join(sweep_dir, "status.json")
  runner = sweeps.Runner(TINY, sweep_dir, str(fake), {"num_train_steps": 3})
  os.makedirs(sweep_dir)
  with open(path, "w") as f:   # an older sweep()'s point 1, and a line that is no entry
    json.dump([{"index": 1, "name": "learning_rate=9,warmup_steps=9", "status": "done"}, 7,
               # indices the sweep does not have (named as its last point, or past it)
               {"index": -1, "name": sweeps.point_name(runner.points[-1]), "status": "done"},
               {"index": 4, "name": "learning_rate=9", "status": "done"}], f)

  def recorded():
    with open(path) as f:
      return [(r["index"], r["status"]) for r in json.load(f)]

  runner.run([2], log=lambda s: None)
  assert recorded() == [(2, "failed")]
  runner.run([0], log=lambda s: None)
  assert recorded() == [(0, "done"), (2, "failed")]
  again = sweeps.Runner(TINY, sweep_dir, str(fake), {"num_train_steps": 3})
  again.run([3, 0], log=lambda s: None)
  assert recorded() == [(0, "skipped (done)"), (2, "failed"), (3, "done")]
  again.run([1], log=lambda s: None)    # the entries of the other points stay, point 0's too
  assert recorded() == [(0, "skipped (done)"), (1, "done"), (2, "failed"), (3, "done")]
  with open(path) as f:
    assert json.load(f)[3]["name"] == sweeps.point_name(runner.points[3])


def test_a_done_point_runs_again_when_the_sweep_asks_for_more_steps(tmp_path):
  """A point DONE at 3 steps is not done at 6: the re-run extends it (training resumes from its
  checkpoint), SLURM re-submits it, and the report stops calling it done once it restarts."""
  fake = tmp_path / "fake_train.py"
  fake.write_text(textwrap.dedent("""
      import json, os, sys
      args = sys.argv[1:]
      workdir = args[args.index("--workdir") + 1]
      steps = int([a for a in args if a.startswith("--config.num_train_steps=")][-1][25:])
      if steps == 12:
        raise SystemExit("boom: the extension fails")
      os.makedirs(os.path.join(workdir, "checkpoints", str(steps)))
      with open(os.path.join(workdir, "metrics.jsonl"), "a") as f:
        f.write(json.dumps({"step": steps, "eval_loss": 1.0, "bleu": float(steps)}) + "\\n")
  """))
  sweep_dir = str(tmp_path / "sweep")
  quiet = {"log": lambda s: None}
  short = sweeps.Runner(TINY, sweep_dir, str(fake), {"num_train_steps": 3})
  assert short.run([0], **quiet)[0]["status"] == "done"
  assert short.run([0], **quiet)[0]["status"] == "skipped (done)"
  longer = sweeps.Runner(TINY, sweep_dir, str(fake), {"num_train_steps": 6})
  assert longer.status(0) == "partial"
  assert sweeps.unfinished(longer) == [0, 1, 2, 3]
  assert longer.run([0], **quiet)[0]["status"] == "done"
  d = sweeps.point_dir(sweep_dir, longer.points[0])
  assert metrics.last_values(d)["bleu"] == 6.0
  assert longer.status(0) == short.status(0) == "done"   # 6 steps cover a request for 3
  # A marker that records no steps (an older sweep's) counts where the run finished them.
  with open(os.path.join(d, sweeps.DONE), "w") as f:
    f.write("finished in 1.0 s\n")
  longest = sweeps.Runner(TINY, sweep_dir, str(fake), {"num_train_steps": 12})
  assert (longer.status(0), longest.status(0)) == ("done", "partial")
  # An extension that fails leaves the point failed, also in the report (which knows no steps).
  assert longest.run([0], **quiet)[0]["status"] == "failed"
  assert longest.status(0) == sweeps.status(d) == "failed"


def test_the_report_of_a_sweep_extended_to_more_steps_calls_only_the_longer_points_done(
    tmp_path):
  """sweep.json records each point's steps: after a 3-step sweep is extended to 6 and one point
  is run, the report calls the others partial (their 3-step figures are not the sweep's), not
  done on their 3-step markers; and `--point 0,0` runs point 0 once."""
  fake = tmp_path / "fake_train.py"
  fake.write_text(textwrap.dedent("""
      import json, os, sys
      args = sys.argv[1:]
      workdir = args[args.index("--workdir") + 1]
      steps = int([a for a in args if a.startswith("--config.num_train_steps=")][-1][25:])
      os.makedirs(os.path.join(workdir, "checkpoints", str(steps)), exist_ok=True)
      with open(os.path.join(workdir, "calls"), "a") as f:
        f.write("x")
      with open(os.path.join(workdir, "metrics.jsonl"), "a") as f:
        f.write(json.dumps({"step": steps, "eval_loss": 1.0, "bleu": float(steps)}) + "\\n")
  """))
  sweep_dir = str(tmp_path / "sweep")
  quiet = {"log": lambda s: None}
  short = sweeps.Runner(TINY, sweep_dir, str(fake), {"num_train_steps": 3})
  short.run(**quiet)
  assert [r["status"] for r in sweeps.report(sweep_dir)["rows"]] == ["done"] * 4
  longer = sweeps.Runner(TINY, sweep_dir, str(fake), {"num_train_steps": 6})
  assert [r["status"] for r in longer.run([0, 0], **quiet)] == ["done"]
  assert _calls(sweep_dir, longer.points[0]) == 2          # once at 3 steps, once at 6
  with open(os.path.join(sweep_dir, "sweep.json")) as f:
    assert [p["num_train_steps"] for p in json.load(f)["points"]] == [6] * 4
  rows = {r["name"]: r for r in sweeps.report(sweep_dir)["rows"]}
  assert [rows[sweeps.point_name(p)]["status"] for p in longer.points] == [
      "done", "partial", "partial", "partial"]
  # A sweep.json from before the steps were recorded: any marker counts, as it did.
  with open(os.path.join(sweep_dir, "sweep.json")) as f:
    record = json.load(f)
  for p in record["points"]:
    del p["num_train_steps"]
  with open(os.path.join(sweep_dir, "sweep.json"), "w") as f:
    json.dump(record, f)
  assert [r["status"] for r in sweeps.report(sweep_dir)["rows"]] == ["done"] * 4


def test_points_are_the_same_by_exact_value_and_names_that_round_two_together_are_refused(
    tmp_path):
  # chain: 1 and 1.0 are one value (one workdir); a point's name keeps 6 digits, so distinct
  # values beyond them would share a workdir: refused, saying so (not "the same point twice").
  assert sweeps.chain(sweeps.product(learning_rate=[1, 2]),
                      sweeps.product(learning_rate=[1.0, 3.0])) == [
      {"learning_rate": 1}, {"learning_rate": 2}, {"learning_rate": 3.0}]
  close = tmp_path / "close.py"
  close.write_text("from tiny_config import get_config\n"
                   "def sweep():\n  return [{'learning_rate': 512 ** -0.5}, "
                   "{'learning_rate': 0.0441942}]\n")
  with pytest.raises(sweeps.SweepError, match=(
      r"differ only beyond the 6 significant digits of their names, which would share the "
      r"workdir 'learning_rate=0.0441942'")):
    sweeps.load_sweep(str(close))
  # A list field: no --config flag sets one, so it is refused before anything runs.
  listed = tmp_path / "listed.py"
  listed.write_text("from tiny_config import get_config\n"
                    "def sweep():\n  return [{'logical_axis_rules': [['batch', 'data']]}]\n")
  with pytest.raises(sweeps.SweepError, match=(
      r"logical_axis_rules is a list in get_config\(\), which no --config flag can set")):
    sweeps.load_sweep(str(listed))
  # The spread over seeds groups settings by exact value (1 and 1.0 one setting), not by the
  # rounded names: two learning rates equal to 6 digits are two settings of one seed each.
  rows = [{"learning_rate": lr, "seed": seed, "status": "done", "bleu": b}
          for lr, seed, b in ((0.000123456, 1, 20.0), (0.0001234564, 2, 30.0),
                              (1, 1, 10.0), (1.0, 2, 12.0))]
  seeds = sweeps.seed_summary(rows, ["learning_rate", "seed"], "bleu")
  assert sorted((r["learning_rate"], r["seeds"], r["n"]) for r in seeds) == [
      (0.000123456, "1", 1), (0.0001234564, "2", 1), (1, "1 2", 2)]


def test_report_plot_leaves_the_matplotlib_backend_alone(tmp_path):
  """One panel per swept field, 4 x 3.2 inches each at 100 dpi; numbers on a numeric axis (log
  where they are positive and span 10x), anything else as sorted labels; the backend as it was."""
  original = matplotlib.get_backend()
  matplotlib.use("svg")  # not Agg, so a plot that switched to Agg would show
  try:
    rows = [{"learning_rate": 1.0, "schedule": "rsqrt", "warmup": 4, "bleu": 3.0},
            {"learning_rate": 20.0, "schedule": "constant", "warmup": 64, "bleu": 5.0},
            {"learning_rate": 2.0, "schedule": "rsqrt", "warmup": 16, "bleu": None}]
    fields = ["learning_rate", "schedule"]
    path = sweeps.plot(rows, fields, "bleu", str(tmp_path / "p.png"))
    assert os.path.getsize(path) > 1000
    assert matplotlib.get_backend().lower() == "svg"
    with open(path, "rb") as f:
      head = f.read(24)
    assert (int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")) == (800, 320)
    fig = figure(rows, fields, "bleu")
    assert [ax.get_xlabel() for ax in fig.axes] == fields   # no other panel
    lr, schedule = fig.axes
    assert (lr.get_xscale(), lr.get_ylabel()) == ("log", "bleu")
    assert lr.collections[0].get_offsets().tolist() == [[1.0, 3.0], [20.0, 5.0]]  # no None
    assert schedule.get_xscale() == "linear"
    assert [t.get_text() for t in schedule.get_xticklabels()] == ["constant", "rsqrt"]
    assert {t.get_rotation() for t in schedule.get_xticklabels()} == {30}
    assert schedule.collections[0].get_offsets().tolist() == [[1.0, 3.0], [0.0, 5.0]]
    assert figure(rows, ["warmup"], "bleu").axes[0].get_xscale() == "log"
    # Nothing to draw: no row has the metric, or nothing was swept.
    assert sweeps.plot(rows, fields, "eval_loss", str(tmp_path / "none.png")) is None
    assert sweeps.plot(rows, [], "bleu", str(tmp_path / "none.png")) is None
    assert not os.path.exists(tmp_path / "none.png")
  finally:
    matplotlib.use(original)
  # A log axis for positive values spanning 10x or more (1 // 0.1 is 9.0: the ratio is divided).
  assert log_scale([0.1, 1.0]) and log_scale([4, 64, 16])
  for linear in ([1.0, 9.5], [0.0, 100.0], [-1.0, 20.0], [0.5, 2.0], [3, 3]):
    assert not log_scale(linear), linear


def test_report_rows_read_best_checkpoints_cut_lines_and_sort_missing_last(tmp_path):
  """A row has keep_best's best value and step where the run kept one; a results line cut by a
  crash is skipped, not the end of the file; rows without the metric sort last, in their order."""
  run, plain = str(tmp_path / "run"), str(tmp_path / "plain")
  os.makedirs(os.path.join(run, "eval"))
  os.makedirs(os.path.join(plain, "best_bleu"))   # a best_ directory with no step in it
  assert BestKeeper(run, "bleu").offer(3, {"w": np.ones(2, np.float32)}, {"bleu": 7.5})
  with open(os.path.join(run, "eval", "results.jsonl"), "w") as f:
    f.write('{"split": "test", "bleu": 5.0, "beam_size": 4, "alpha": 0.6, "step": 2}\n'
            '{"split": "test", "bl\n'     # cut by a crash; evaluate.py ran again after it
            '{"split": "test", "bleu": 6.0, "beam_size": 1, "step": 3}\n')
  row = run_row(run, {"name": "run"}, num_train_steps=3)
  assert (row["best_bleu"], row["best_bleu_step"]) == (7.5, 3)
  assert (row["test_bleu"], row["test_search"]) == (6.0, "greedy, step 3")
  assert search_text({"beam_size": 2, "alpha": 0.6, "step": 1}) == "beam 2, alpha 0.6, step 1"
  assert search_text({"beam_size": 0, "alpha": 0.6, "step": 1}) == "beam 0, alpha 0.6, step 1"
  other = run_row(plain, {"name": "plain"}, num_train_steps=3)
  assert not any(k.startswith("best_") for k in other)
  assert not os.path.exists(os.path.join(plain, "best_eval_loss"))
  rows = [{"n": "a"}, {"n": "b", "bleu": 3.0}, {"n": "c", "bleu": float("nan")},
          {"n": "d", "bleu": 5.0}, {"n": "e", "bleu": "x"}]
  assert [r["n"] for r in sweeps.sort_rows(rows, "bleu")] == ["d", "b", "a", "c", "e"]
  assert [r["n"] for r in sweeps.sort_rows(rows, "bleu", lower=True)] == ["b", "d", "a", "c", "e"]


def test_report_gives_the_mean_and_spread_over_seeds(tmp_path):
  """Points that differ only in `seed` are merged per setting: n, mean, sample std, range; only
  finished seeds with a finite metric count, the others are named with their status."""
  bleu = {(1.0, 0): 10.0, (1.0, 1): 12.0, (1.0, 2): 14.0,
          (2.0, 0): 20.0, (2.0, 1): 21.0, (2.0, 2): 22.0, (2.0, 3): float("nan"),
          (2.0, 4): 99.0, (4.0, 0): 30.0}
  points = [{"learning_rate": lr, "seed": seed} for lr, seed in bleu]
  (tmp_path / "sweep.json").write_text(json.dumps({"points": [{"overrides": p} for p in points]}))
  for (lr, seed), value in bleu.items():
    d = sweeps.point_dir(str(tmp_path), {"learning_rate": lr, "seed": seed})
    os.makedirs(d)
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
      f.write(json.dumps({"step": 3, "bleu": value, "eval_loss": 5.0 - value / 10}) + "\n")
    if seed != 4:  # seed 4 is still running: its BLEU of an early step must not count
      open(os.path.join(d, sweeps.DONE), "w").close()
  out = sweeps.report(str(tmp_path), "bleu")
  seeds = out["seeds"]
  assert [r["learning_rate"] for r in seeds] == [4.0, 2.0, 1.0]     # best mean first
  two = seeds[1]
  assert (two["seeds"], two["n"]) == ("0 1 2", 3)
  assert two["bleu_mean"] == pytest.approx(21.0) and two["bleu_std"] == pytest.approx(1.0)
  assert (two["bleu_min"], two["bleu_max"]) == (20.0, 22.0)
  assert two["left_out"] == "3 (bleu NaN), 4 (partial)"
  assert seeds[2]["bleu_std"] == pytest.approx(2.0) and seeds[2]["left_out"] == ""
  assert seeds[0]["n"] == 1 and math.isnan(seeds[0]["bleu_std"])   # one seed: no spread
  assert "Over seeds" in out["markdown"] and "| 21 | 1 | 20 | 22 |" in out["markdown"]
  assert [os.path.basename(f) for f in out["files"]] == [
      "report.csv", "report.md", "report_bleu.png", "report_seeds.csv", "report_seeds.md"]
  # A loss sorts lowest first, unless told otherwise; learning_rate 1 and 1.0 are one setting,
  # as their workdirs are.
  by_loss = sweeps.seed_summary(out["rows"], out["fields"], "eval_loss")
  assert [r["learning_rate"] for r in by_loss] == [4.0, 2.0, 1.0]
  lowest = sweeps.seed_summary(out["rows"], out["fields"], "bleu", lower=True)
  assert [r["learning_rate"] for r in lowest] == [1.0, 2.0, 4.0]
  # Seeds listed numbers first, in order, then others by their text.
  mixed = [{"learning_rate": 1.0, "seed": seed, "status": "done", "bleu": 1.0}
           for seed in (10, "b", 2, "a")]
  assert sweeps.seed_summary(mixed, ["learning_rate", "seed"], "bleu")[0]["seeds"] == "2 10 a b"
  as_int = [dict(r, learning_rate=1) if r["learning_rate"] == 1.0 and r["seed"] == 0 else r
            for r in out["rows"]]
  assert sweeps.seed_summary(as_int, out["fields"], "bleu")[2]["n"] == 3
  # Without a repeated setting there is no summary, and a new report drops the old files.
  single = [r for r in out["rows"] if r["seed"] == 0]
  assert sweeps.seed_summary(single, out["fields"], "bleu") == []
  # Two runs of one seed (compare_runs.py of runs made by hand) are not two seeds: no summary
  # from them alone, and where other seeds make one, the repeat is left out and named.
  repeated = single + [dict(single[0], bleu=11.0)]
  assert sweeps.seed_summary(repeated, out["fields"], "bleu") == []
  lr1 = next(r for r in single if r["learning_rate"] == 1.0)
  again = sweeps.seed_summary(out["rows"] + [dict(lr1, bleu=11.0)], out["fields"], "bleu")
  assert (again[2]["seeds"], again[2]["n"]) == ("0 1 2", 3), again[2]
  assert again[2]["bleu_mean"] == pytest.approx(12.0), again[2]   # 10, 12, 14: not the 11
  assert again[2]["left_out"] == "0 (another run of this seed)"
  assert sweeps.seed_summary(out["rows"], ["learning_rate"], "bleu") == []
  with open(tmp_path / "sweep.json", "w") as f:
    json.dump({"points": [{"overrides": p} for p in points if p["seed"] == 0]}, f)
  assert "seeds" not in json.dumps(sweeps.report(str(tmp_path), "bleu")["files"])
  assert "report_seeds.csv" not in os.listdir(tmp_path)
  # A misspelt metric is an error listing what the points logged, not an empty report.
  with pytest.raises(sweeps.SweepError, match=r"--metric blue: no point logged it; did you "
                                              r"mean 'bleu'\? The points logged: bleu, "):
    sweeps.report(str(tmp_path), "blue")


def test_sweep_files_and_reports_are_written_whole_and_reach_the_disk(tmp_path, monkeypatch):
  """A marker, status.json, report or plot is written to a temporary file, synced, renamed and the
  rename synced: a report rewritten in place was left cut short by a crash or a full disk, and
  a renamed file can come back empty after a power loss when its bytes were not on the disk."""
  import importlib
  import stat
  report_module = importlib.import_module("transformer_jax.sweeps.report")
  runner_module = importlib.import_module("transformer_jax.sweeps.runner")
  synced, fsync = [], os.fsync
  monkeypatch.setattr(os, "fsync", lambda fd: synced.append(
      "directory" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file") or fsync(fd))
  prefix = str(tmp_path / "report")
  assert report_module.write_rows([{"a": 1.5}], ["a"], ["a"], prefix) == [prefix + ".csv",
                                                                           prefix + ".md"]
  assert synced == ["file", "directory"] * 2
  runner_module.write_atomically(str(tmp_path / "DONE"), "finished\n")
  assert synced == ["file", "directory"] * 3
  # The plot too: drawn into memory, then written as the others (a report redrawn while a
  # viewer reads it showed half an image).
  rows = [{"a": 1.5, "bleu": 3.0}, {"a": 2.5, "bleu": 4.0}]
  assert report_module.plot(rows, ["a"], "bleu", prefix + ".png") == prefix + ".png"
  assert synced == ["file", "directory"] * 4
  png = open(prefix + ".png", "rb").read()
  assert png.startswith(b"\x89PNG")
  # The format is the name's, as savefig's own: an .svg is SVG.
  report_module.plot(rows, ["a"], "bleu", str(tmp_path / "other.svg"))
  assert b"<svg" in (tmp_path / "other.svg").read_bytes()[:1000]
  os.unlink(tmp_path / "other.svg")

  def no_space(fd):
    raise OSError(28, "No space left on device")
  monkeypatch.setattr(os, "fsync", no_space)
  with pytest.raises(OSError, match="No space left"):
    report_module.write_rows([{"a": 2.5}], ["a"], ["a"], prefix)
  with pytest.raises(OSError, match="No space left"):
    report_module.plot(rows[:1], ["a"], "bleu", prefix + ".png")
  assert open(prefix + ".csv", newline="").read() == "a\r\n1.5\r\n"
  assert "1.5" in open(prefix + ".md").read()
  assert open(prefix + ".png", "rb").read() == png
  assert sorted(os.listdir(tmp_path)) == ["DONE", "report.csv", "report.md", "report.png"]


def test_markdown_cells_of_other_units():
  """`md_cells`: a column's Markdown heading and how its values read (benchmark curves give
  rates in other units than their CSV); an empty cell stays empty."""
  cells = {"rate": ("rate (%)", lambda v: f"{100 * v:.0f}%")}
  text = markdown([{"rate": 0.5, "n": None}, {"rate": None, "n": 2}], ["rate", "n"],
                         cells)
  assert text == "| rate (%) | n |\n|---|---|\n| 50% |  |\n|  | 2 |\n"


def _evaluated_sweep(sweep_dir, results, step, tail=""):
  """Done points of a learning-rate sweep in `sweep_dir` (sweep.json written by the caller):
  per rate in `results`, BLEU 10 x rate logged at `step` and its evaluate.py result lines (then
  `tail`)."""
  for lr, lines in results.items():
    d = sweeps.point_dir(str(sweep_dir), {"learning_rate": lr})
    os.makedirs(os.path.join(d, "eval"))
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
      f.write(json.dumps({"step": step, "bleu": 10.0 * lr}) + "\n")
    with open(os.path.join(d, "eval", "results.jsonl"), "w") as f:
      f.write("".join(json.dumps(r) + "\n" for r in lines) + tail)
    open(os.path.join(d, sweeps.DONE), "w").close()


def test_report_sorts_by_the_scores_of_evaluate_py(tmp_path, capsys):
  """`--metric test_bleu`: the latest scripts/evaluate.py result per split (eval/results.jsonl),
  not only what training logged; copy baselines, ensembles and cut lines left out."""
  points = [{"learning_rate": 1.0}, {"learning_rate": 2.0}]
  (tmp_path / "sweep.json").write_text(json.dumps({"points": [{"overrides": p} for p in points]}))
  results = {1.0: [{"split": "test", "bleu": 30.0, "chrf": 50.0},
                   {"split": "test", "bleu": 31.0, "chrf": 51.0,   # the latest counts
                    "tokenized_bleu": 32.5, "beam_size": 4, "alpha": 0.6, "step": 3,
                    "averaged_steps": [2, 3], "bleu_ci95": 1.25}],
             2.0: [{"split": "test", "bleu": 35.0, "chrf": 55.0},
                   {"split": "test", "baseline": "copy", "bleu": 90.0, "chrf": 90.0},
                   {"split": "newstest", "bleu": 12.5, "chrf": 40.0},
                   # with other models (--ensemble): not this point's own figure
                   {"split": "test", "bleu": 99.0, "chrf": 99.0, "ensemble": [{"step": 3}]}]}
  _evaluated_sweep(tmp_path, results, step=3, tail='{"split": "test", "bl')
  out = sweeps.report(str(tmp_path), "test_bleu")
  assert [(r["learning_rate"], r["test_bleu"], r["test_chrf"]) for r in out["rows"]] == [
      (2.0, 35.0, 55.0), (1.0, 31.0, 51.0)]
  assert out["rows"][0]["newstest_bleu"] == 12.5 and "newstest_bleu" not in out["rows"][1]
  assert out["rows"][1]["test_tokenized_bleu"] == 32.5
  assert "test_tokenized_bleu" not in out["rows"][0]
  # Which checkpoint and search each figure is of, beside it in the table.
  assert out["rows"][1]["test_search"] == "beam 4, alpha 0.6, average of 2 to step 3"
  header = [c.strip() for c in out["markdown"].splitlines()[0].strip("|").split("|")]
  assert header[header.index("test_bleu") + 1:header.index("test_bleu") + 3] == [
      "test_bleu_ci95", "test_search"], header
  assert out["rows"][1]["test_bleu_ci95"] == 1.25 and "test_bleu_ci95" not in out["rows"][0]
  assert " test_bleu " in out["markdown"].splitlines()[0]   # a column of the table
  assert os.path.exists(tmp_path / "report_test_bleu.png")


def test_report_and_compare_take_the_evaluations_asked_for(tmp_path, capsys):
  """`--averaged` / `--noaveraged` and `--beam_size N` (scripts/sweep.py --report,
  scripts/compare_runs.py): `test_bleu` is the latest evaluate.py result of that kind, whichever
  came last; a run with results of other kinds only has none and is named with the command
  that makes one; a metric no run then has is an error that says why; a beam of 0 is refused."""
  script = load_sweep_script()
  points = [{"learning_rate": 1.0}, {"learning_rate": 2.0}]
  (tmp_path / "sweep.json").write_text(json.dumps({"points": [{"overrides": p} for p in points]}))
  def result(bleu, beam, averaged=False, split="test"):
    return {"split": split, "bleu": bleu, "beam_size": beam, "alpha": 0.6, "step": 4,
            **({"averaged_steps": [3, 4]} if averaged else {})}
  results = {1.0: [result(30.0, 4, averaged=True), result(31.0, 1, averaged=True),
                   result(28.0, 4), result(27.0, 1)],           # the last checkpoint last
             2.0: [result(25.0, 4), result(24.0, 1, split="validation")]}  # never averaged
  _evaluated_sweep(tmp_path, results, step=4)
  def test_bleu(*choice):
    rows = sweeps.report(str(tmp_path), "test_bleu", None, sweeps.Evaluations(*choice))["rows"]
    return {r["learning_rate"]: (r.get("test_bleu"), r.get("test_search")) for r in rows}
  assert test_bleu() == {1.0: (27.0, "greedy, step 4"), 2.0: (25.0, "beam 4, alpha 0.6, step 4")}
  assert test_bleu(True, 4) == {1.0: (30.0, "beam 4, alpha 0.6, average of 2 to step 4"),
                                2.0: (None, None)}
  assert test_bleu(True) == {1.0: (31.0, "greedy, average of 2 to step 4"), 2.0: (None, None)}
  assert test_bleu(False, 4) == {1.0: (28.0, "beam 4, alpha 0.6, step 4"),
                                 2.0: (25.0, "beam 4, alpha 0.6, step 4")}
  assert test_bleu(None, 1) == {1.0: (27.0, "greedy, step 4"), 2.0: (None, None)}
  # The script: the table by the averaged beam-4 scores, and the point without one named.
  lr2 = sweeps.point_dir(str(tmp_path), {"learning_rate": 2.0})
  assert script.main(["--workdir", str(tmp_path), "--report", "--metric", "test_bleu",
                      "--averaged", "--beam_size", "4"]) == 0
  out, err = capsys.readouterr()
  assert "| 30 |" in out and "average of 2 to step 4" in out, out
  assert (f"warning: {lr2}: none of its 1 test results of evaluate.py is of an averaged "
          f"checkpoint with beam 4: its test_bleu is left empty (python "
          f"scripts/average_checkpoints.py --workdir {lr2}, then python scripts/evaluate.py "
          f"--workdir {lr2} --split test --averaged --beam_size 4 makes one)") in err, err
  assert f"--workdir {lr2} --split validation --averaged --beam_size 4 makes one" in err, err
  # Per split: lr 2's validation result is greedy, its test result is not; the test split named.
  warnings = sweeps.report(str(tmp_path), "test_bleu", None, sweeps.Evaluations(None, 1))[
      "warnings"]
  assert warnings == [f"{lr2}: none of its 1 test results of evaluate.py is of a checkpoint "
                      f"with greedy search: its test_bleu is left empty (python "
                      f"scripts/evaluate.py --workdir {lr2} --split test --beam_size 1 makes "
                      "one)"], warnings
  # A misspelt metric is still one, whatever the choice passed over.
  assert script.main(["--workdir", str(tmp_path), "--report", "--metric", "tst_bleu",
                      "--beam_size", "4"]) == 1
  assert "error: --metric tst_bleu: no point logged it; did you mean 'test_bleu'?" in (
      capsys.readouterr().err)
  # No point has a beam-5 score: an error naming the choice, not "no point logged it".
  assert script.main(["--workdir", str(tmp_path), "--report", "--metric", "test_bleu",
                      "--beam_size", "5"]) == 1
  err = capsys.readouterr().err
  assert err.startswith("error: --metric test_bleu: no point has an evaluate.py score of a "
                        "checkpoint with beam 5; 2 have others, e.g. "
                        f"{sweeps.point_dir(str(tmp_path), points[0])}: none of its 4 test "), err
  assert "--split test --beam_size 5 makes one" in err, err
  # A metric training logged still sorts; the choice only empties the evaluate.py columns.
  assert script.main(["--workdir", str(tmp_path), "--report", "--metric", "bleu",
                      "--beam_size", "5"]) == 0
  out, err = capsys.readouterr()
  assert "test_bleu" not in out and err.count("warning: ") == 3, (out, err)   # lr 2: 2 splits
  assert [sweeps.Evaluations(a, b).describe() for a, b in ((None, 1), (False, 2), (True, 4))] == [
      "a checkpoint with greedy search", "a single checkpoint with beam 2",
      "an averaged checkpoint with beam 4"]
  with pytest.raises(dataclasses.FrozenInstanceError):   # the default is shared: not to change
    sweeps.Evaluations().beam_size = 4
  assert script.main(["--workdir", str(tmp_path), "--report", "--beam_size", "0"]) == 1
  assert "error: --beam_size 0: a beam holds 1 hypothesis or more" in capsys.readouterr().err
  # --paired reaches the report (these results name no hypotheses files: each point says so).
  assert script.main(["--workdir", str(tmp_path), "--report", "--metric", "test_bleu",
                      "--paired"]) == 0
  assert capsys.readouterr().err.count("test result's hypotheses or references file is gone") == 2
  # compare_runs.py takes the same flags, over the points' workdirs.
  compare = load_script("compare_runs")
  lr1 = sweeps.point_dir(str(tmp_path), {"learning_rate": 1.0})
  for d, lr in ((lr1, 1.0), (lr2, 2.0)):
    _made_run(d + "_run", 4, 10.0 * lr, results[lr], learning_rate=lr)
  assert compare.main([lr1 + "_run", lr2 + "_run", "--metric", "test_bleu",
                       "--noaveraged", "--beam_size", "4"]) == 0
  out, err = capsys.readouterr()
  assert [line.split(" | ")[:2] for line in out.splitlines()[2:4]] == [
      [f"| {os.path.basename(lr1)}_run", "1"], [f"| {os.path.basename(lr2)}_run", "2"]], out
  assert "| 28 |" in out and err.count("warning") == 1, (out, err)   # lr 2's validation split
  assert f"warning: {lr2}_run: none of its 1 validation results of evaluate.py" in err, err
  assert compare.main([lr1 + "_run", lr2 + "_run", "--metric", "test_bleu", "--averaged"]) == 0
  out, err = capsys.readouterr()
  assert "| 31 |" in out and f"warning: {lr2}_run: none of its 1 test results" in err
  # The choice's flags belong to --report: refused for a sweep's run, which reads --config.
  assert script.main(["--config", os.path.join(REPO, "tests", "tiny_config.py"), "--workdir",
                      str(tmp_path / "other"), "--list", "--beam_size", "4"]) == 2
  assert ("error: --beam_size: only for --report (which evaluate.py results it reads); the "
          "points' own settings are --config.FIELD=VALUE") in capsys.readouterr().err
  assert not os.path.exists(tmp_path / "other")


def test_compare_runs_tests_each_run_against_the_best_on_the_same_references(tmp_path, capsys,
                                                                             monkeypatch):
  """`--paired`: each run's paired bootstrap p-value (sacreBLEU's --paired-bs) against the run
  with the best BLEU on the same references, `-` for that one; runs on other references are
  compared among themselves; a run moved since it was evaluated is found under its eval/; one
  whose hypotheses are gone is named; --paired with a metric that is no evaluate.py BLEU is an
  error."""
  compare = load_script("compare_runs")
  rng = np.random.default_rng(0)
  words = [f"w{i}" for i in range(40)]
  references = [" ".join(rng.choice(words, 8)) for _ in range(60)]
  def noisy(keep):  # each reference word kept with probability `keep`, else another word
    return [" ".join(w if rng.random() < keep else "x" for w in r.split()) for r in references]
  def run(name, hypotheses, refs=references, where=None, beam4=None):
    """A run with a greedy test result (and, after it, a beam-4 one of `beam4`)."""
    workdir = tmp_path / name
    eval_dir = workdir / "eval" / "step_4"
    (eval_dir).mkdir(parents=True)
    (eval_dir / "references.test.txt").write_text("".join(r + "\n" for r in refs))
    recorded = (where or workdir) / "eval" / "step_4"   # where evaluate.py wrote them
    _made_run(str(workdir / "x"), 4, 10.0, learning_rate=len(name))  # config.json, metrics
    for f in os.listdir(workdir / "x"):
      os.rename(workdir / "x" / f, workdir / f)
    os.rmdir(workdir / "x")
    for beam, hyps in ((1, hypotheses), (4, beam4)):
      if hyps is None:
        continue
      (eval_dir / f"hypotheses.test.{beam}.txt").write_text("".join(h + "\n" for h in hyps))
      result = {"split": "test", "bleu": sacrebleu.corpus_bleu(hyps, [refs]).score,
                "beam_size": beam, "step": 4,
                "hypotheses": str(recorded / f"hypotheses.test.{beam}.txt"),
                "references": str(recorded / "references.test.txt")}
      with open(workdir / "eval" / "results.jsonl", "a") as f:
        f.write(json.dumps(result) + "\n")
  good, far = noisy(0.9), noisy(0.5)
  close = good[:-2] + far[-2:]   # two sentences worse: a difference the sentences could make
  other = [r + " y" for r in references]
  # Those with no test first: a row passed over must not end the others' tests.
  _made_run(str(tmp_path / "unevaluated"), 4, 10.0, learning_rate=99.0)
  run("cut", far[:-1])                                   # a line short of its references
  run("gone", good)
  os.remove(tmp_path / "gone" / "eval" / "step_4" / "hypotheses.test.1.txt")
  run("unreadable", references)                          # BLEU 100, but not UTF-8 on disk
  (tmp_path / "unreadable" / "eval" / "step_4" / "hypotheses.test.1.txt").write_bytes(b"\xff\n")
  run("lonely", good, refs=[r + " z" for r in references])   # alone on its references
  run("other_pair", good, refs=other)          # another test set: compared among its own
  run("other_pair_worse", far[:-1] + [other[-1]], refs=other)
  run("best", good)
  run("same_as_best", good)
  run("close", close, beam4=references)   # its beam-4 result, made last, the best of all
  # Moved since (found under its own eval/, the last "eval" of the recorded path).
  run("far_moved", far, where=tmp_path / "eval" / "old")
  names = ("unevaluated", "cut", "gone", "unreadable", "lonely", "other_pair",
           "other_pair_worse", "best", "same_as_best", "close", "far_moved")
  runs = [str(tmp_path / n) for n in names]
  assert "test_p_vs_best" not in json.dumps(sweeps_compare.compare(runs, "test_bleu")["rows"])
  latest = sweeps_compare.compare(runs, "test_bleu", paired=True)["rows"]   # any search
  assert {r["name"]: r.get("test_p_vs_best") for r in latest}["close"] == "-"
  greedy = sweeps.Evaluations(beam_size=1)
  out = sweeps_compare.compare(runs, "test_bleu", paired=True, choice=greedy)
  p = {r["name"]: r.get("test_p_vs_best") for r in out["rows"]}
  assert p["best"] == "-" or p["same_as_best"] == "-", p   # the first of the two best
  assert {p["best"], p["same_as_best"]} == {"-", 1.0}, p   # the same translations: p = 1
  assert 0.05 < p["close"] < 1.0 and p["far_moved"] < 0.01, p
  assert p["other_pair"] == "-" and p["other_pair_worse"] < 0.01, p   # a pair: tested
  assert [p[n] for n in ("unevaluated", "cut", "gone", "unreadable", "lonely")] == [None] * 5, p
  warnings = out["warnings"]
  assert [w.split(":")[0] for w in warnings] == ["cut", "gone", "unreadable", "unreadable"], (
      warnings)
  assert warnings[0] == (f"cut: {tmp_path}/cut/eval/step_4/hypotheses.test.1.txt has 59 "
                         f"lines, {tmp_path}/cut/eval/step_4/references.test.txt 60: no paired "
                         "test")
  assert warnings[1].startswith(
      "gone: its test result's hypotheses or references file is gone"), warnings
  assert warnings[2].startswith("unreadable: its test result's files cannot be read ("), warnings
  # A run with a higher BLEU could not be tested: each baseline it beats is named as a stand-in.
  assert warnings[3] == (
      "unreadable: a higher test_bleu than best, but not tested; the p-values on best's "
      "references are against best, the best of the runs that could be tested"), warnings
  header = out["markdown"].splitlines()[0]
  assert "| test_bleu | test_search | test_p_vs_best |" in header, header
  # Above bleu.BOOTSTRAP_MAX_SENTENCES sentences: no test, and a line that says so.
  monkeypatch.setattr(bleu_lib, "BOOTSTRAP_MAX_SENTENCES", 59)
  out = sweeps_compare.compare(runs[7:9], "test_bleu", paired=True)
  assert [r.get("test_p_vs_best") for r in out["rows"]] == [None, None], out["rows"]
  assert out["warnings"] == ["60 test sentences: over 59, no paired test"], out["warnings"]
  monkeypatch.undo()
  # The script prints it; a metric that is no evaluate.py BLEU cannot be tested.
  assert compare.main([*runs[7:10], "--metric", "test_bleu", "--paired"]) == 0
  assert " | - | " in capsys.readouterr().out
  assert compare.main([*runs[7:10], "--metric", "test_chrf"]) == 1   # unpaired: not logged
  assert "--metric test_chrf: no run logged it. The runs logged: " in capsys.readouterr().err
  for metric in ("bleu", "test_chrf", "test_tokenized_bleu", "best_bleu"):
    assert compare.main([*runs[7:10], "--metric", metric, "--paired"]) == 1
    assert ("error: --paired tests the BLEU of evaluate.py results: give --metric <split>_bleu "
            f"(test_bleu), not --metric {metric}") in capsys.readouterr().err, metric


def test_report_before_any_metric_warns_of_a_metric_the_trainer_does_not_log(tmp_path, capsys):
  """With nothing logged there is nothing to check --metric against: a name the trainer does
  not log is a warning with the likely one (the report of statuses is still written)."""
  script = load_sweep_script()
  points = [{"learning_rate": 1.0}, {"learning_rate": 2.0}]
  (tmp_path / "sweep.json").write_text(json.dumps({"points": [{"overrides": p} for p in points]}))
  assert script.main(["--workdir", str(tmp_path), "--report", "--metric", "blue"]) == 0
  err = capsys.readouterr().err
  assert ("warning: no point has logged a metric yet, so --metric blue cannot be checked; the "
          "trainer logs bleu, eval_loss") in err and "did you mean 'bleu'?" in err, err
  assert "report.md" in os.listdir(tmp_path)
  for metric in ("bleu", "eval_loss", "test_bleu"):   # the usual names: no warning
    assert script.main(["--workdir", str(tmp_path), "--report", "--metric", metric]) == 0
    assert "warning" not in capsys.readouterr().err


def _made_run(workdir, last_step, bleu, results=(), **fields):
  """A run's workdir as training leaves it: config.json (the tiny config with `fields`), the
  checkpoint of `last_step` and metrics.jsonl to it (BLEU at its last evaluation)."""
  from transformer_jax import experiment
  from transformer_jax.run import workdir as workdir_lib
  c = tiny_config.get_config()
  c.num_train_steps = 4
  c = sweeps.apply_overrides(c, fields)
  os.makedirs(os.path.join(workdir, "checkpoints", str(last_step)))
  workdir_lib.write_config(workdir, c, experiment.transformer_config(c, vocab_size=32))
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    for step in range(1, last_step + 1):
      f.write(json.dumps({"step": step, "train_loss": 5.0 - step}) + "\n")
    f.write(json.dumps({"step": last_step, "eval_loss": 9.0 - bleu / 10, "bleu": bleu}) + "\n")
  if results:
    os.makedirs(os.path.join(workdir, "eval"))
    with open(os.path.join(workdir, "eval", "results.jsonl"), "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in results)


def test_compare_runs_tabulates_what_runs_made_by_hand_differ_in(tmp_path, capsys):
  """scripts/compare_runs.py: the config fields the runs differ in are the columns (found from
  config.json: a field an older run did not record counts as what it did), each run's status
  against its own num_train_steps, metrics and evaluate.py scores, best first, and the spread
  over runs that differ in the seed alone; workdirs, sweeps and directories of them."""
  script = load_script("compare_runs")
  runs = tmp_path / "runs"
  def test(bleu, **more):
    return [{"split": "test", "bleu": bleu, "beam_size": 4, "alpha": 0.6, "step": 4, **more}]
  _made_run(str(runs / "base"), 4, 20.0, test(21.5, chrf=50.0))
  _made_run(str(runs / "base_seed1"), 4, 22.0, test(23.5), seed=1)
  _made_run(str(runs / "lr2"), 4, 30.0, test(19.0), learning_rate=2.0)
  _made_run(str(runs / "lr2_short"), 2, 35.0, learning_rate=2.0, seed=1)  # stopped at step 2
  # An older run's config.json without a field added since: read as the default it had (and
  # data.split's default before 2026-12-07, which a numbers run does not read: no column)...
  path = runs / "base_seed1" / "config.json"
  old = json.loads(path.read_text())
  del old["early_stopping_min_delta"]
  old["data"]["split"] = "grouped"
  path.write_text(json.dumps(old))
  # ... and a sweep beside the runs: its started point counts, the other has no run yet.
  sweep = runs / "sweep"
  points = [{"model.d_model": 16}, {"model.d_model": 32}]
  sweep.mkdir()
  (sweep / "sweep.json").write_text(json.dumps({"points": [{"overrides": p} for p in points]}))
  _made_run(sweeps.point_dir(str(sweep), points[0]), 4, 5.0, **{"model.d_model": 16})

  (runs / "0_notes").mkdir()   # a directory that is neither: passed over
  assert script.main([str(runs), "--out", str(tmp_path / "table")]) == 0
  out, err = capsys.readouterr()
  lines = out.splitlines()
  assert (f"warning: sweep {sweep}: 1 of its 2 points have no config.json yet (not started, or "
          "failed before it): not shown") in err, err
  assert lines[0] == ("| name | seed | learning_rate | model.d_model | status | step | bleu | "
                      "test_bleu | test_search | eval_loss | train_loss |"), out
  names = [line.split(" | ")[0].lstrip("| ") for line in lines[2:7]]
  assert names == ["lr2_short", "lr2", "base_seed1", "base", "model.d_model=16"], out
  assert lines[7] == "", out
  assert lines[2].startswith("| lr2_short | 1 | 2 | 32 | partial | 2 | 35 |  |  |"), out
  assert lines[4] == ("| base_seed1 | 1 | 1 | 32 | done | 4 | 22 | 23.5 | beam 4, alpha 0.6, "
                      "step 4 | 6.8 | 1 |"), out
  assert "Over seeds (bleu" in out and "| 1 | 32 | 0 1 | 2 | 21 | 1.414 | 20 | 22 |  |" in out
  # lr 2's seed 1 stopped before its last step: left out of the mean, with its status.
  assert "| 2 | 32 | 0 | 1 | 30 | nan | 30 | 30 | 1 (partial) |" in out, out
  assert "wrote " in err and (tmp_path / "table_seeds.md").exists()
  with open(tmp_path / "table.csv") as f:
    rows = list(csv.DictReader(f))
  assert rows[1]["workdir"] == str(runs / "lr2") and rows[3]["test_chrf"] == "50.0"

  # Two runs by path, by the evaluate.py score; a field they share, shown on request; one run
  # named twice (by a link too) counts once; the seeds' table of an earlier --out goes.
  os.symlink(runs / "base", tmp_path / "link")
  assert script.main([str(runs / "lr2"), str(runs / "base"), str(runs / "base") + "/",
                      str(tmp_path / "link"),
                      "--metric", "test_bleu", "--field", "model.d_model",
                      "--out", str(tmp_path / "table")]) == 0
  out, err = capsys.readouterr()
  assert out.splitlines()[0].startswith("| name | learning_rate | model.d_model | status |")
  assert "warning" not in err, err   # nothing left out, nothing to warn of
  assert [line.split(" | ")[0] for line in out.splitlines()[2:]] == ["| base", "| lr2"], out
  assert not (tmp_path / "table_seeds.md").exists()
  # Once every point of the sweep has started, all are shown and none is warned about.
  _made_run(sweeps.point_dir(str(sweep), points[1]), 4, 6.0, **{"model.d_model": 32})
  assert script.main([str(sweep)]) == 0
  out, err = capsys.readouterr()
  assert [line.split(" | ")[0] for line in out.splitlines()[2:]] == [
      "| model.d_model=32", "| model.d_model=16"] and "warning" not in err, (out, err)
  # A seed made on another machine differs in data.data_dir too: a column, and a group of its
  # own, unless --ignore leaves that field out.
  _made_run(str(tmp_path / "moved"), 4, 24.0, seed=2, **{"data.data_dir": "/elsewhere"})
  three = [str(runs / "base"), str(runs / "base_seed1"), str(tmp_path / "moved")]
  assert script.main(three) == 0
  out = capsys.readouterr().out
  assert out.splitlines()[0].startswith("| name | data.data_dir | seed | status |"), out
  assert "| 0 1 | 2 | 21 |" in out
  assert script.main([*three, "--ignore", "data.data_dir"]) == 0
  out = capsys.readouterr().out
  assert out.splitlines()[0].startswith("| name | seed | status |"), out
  assert "| 0 1 2 | 3 | 22 | 2 | 20 | 24 |  |" in out, out
  # Losses sort lowest first.
  assert script.main([str(runs / "lr2"), str(runs / "base"), "--metric", "eval_loss"]) == 0
  assert capsys.readouterr().out.splitlines()[2].startswith("| lr2 |")

  # A run whose config.json was cut short, and one another version made: the first is left
  # out, the second compared without the field this code does not know; both are said.
  other = tmp_path / "other"
  _made_run(str(other / "cut"), 4, 99.0)
  (other / "cut" / "config.json").write_text('{"seed": ')
  _made_run(str(other / "newer"), 4, 1.0, seed=3)
  newer = json.loads((other / "newer" / "config.json").read_text())
  (other / "newer" / "config.json").write_text(json.dumps({**newer, "new_field": 1}))
  assert script.main([str(other), str(runs / "base")]) == 0
  out, err = capsys.readouterr()
  assert (f"warning: {other / 'cut' / 'config.json'} does not read as JSON (JSONDecodeError: "
          "Expecting value: line 1 column 10 (char 9)): the file is damaged (emptied or cut "
          f"short) or was edited; mend it or restore it from a copy ({other / 'cut'} left out)"
          ) in err, err
  assert (f"warning: {other / 'newer' / 'config.json'} has fields this code does not know: "
          "['new_field'] (another version of transformer-jax made the run): not compared") in err
  assert out.splitlines()[0].startswith("| name | seed | status |")
  assert [line.split(" | ")[0] for line in out.splitlines()[2:4]] == ["| base", "| newer"]
  empty = tmp_path / "empty"
  (empty / "sweep").mkdir(parents=True)
  (empty / "sweep" / "sweep.json").write_text(json.dumps({"points": [{"overrides": {}}]}))
  (tmp_path / "broken_sweep").mkdir()
  (tmp_path / "broken_sweep" / "sweep.json").write_text('{"points": [{"over')
  (tmp_path / "not_a_run").mkdir()
  (tmp_path / "not_a_run" / "config.json").write_text("{}")
  for argv, code, said in (
      ([], 2, "error: give the runs to compare"),
      ([str(tmp_path / "missing")], 1, f"{tmp_path / 'missing'} does not exist"),
      ([str(runs / "base" / "config.json")], 1,
       f"{runs / 'base' / 'config.json'} is a file: pass the run's workdir"),
      ([str(empty)], 1, f"{empty} holds no training run: no config.json in it or in the "
       f"directories directly under it (its sweeps ['{empty / 'sweep'}'] have no started "
       "point). Pass the workdirs"),
      ([str(other / "cut"), str(tmp_path / "not_a_run")], 1,
       f"error: no run to compare: {other / 'cut' / 'config.json'} does not read as JSON"),
      ([str(tmp_path / "not_a_run")], 1, "has no 'resolved_model': it was not written by"),
      ([str(tmp_path / "broken_sweep")], 1,
       f"{tmp_path / 'broken_sweep' / 'sweep.json'} is not a sweep's record (JSONDecodeError"),
      ([str(runs), "--metric", "blue"], 1,
       "--metric blue: no run logged it; did you mean 'bleu'?"),
      ([str(runs), "--field", "model.d_mdoel"], 1,
       "--field model.d_mdoel: no such config field; did you mean 'model.d_model'?"),
      ([str(runs), "--ignore", "data.data_dri"], 1,
       "--ignore data.data_dri: no such config field; did you mean 'data.data_dir'?"),
      ([str(runs), "--ignore", "seed", "--field", "seed", "--field", "learning_rate",
        "--ignore", "learning_rate"], 1,
       "learning_rate, seed: given to both --field and --ignore; pick one for each")):
    assert script.main(argv) == code, argv
    assert said in capsys.readouterr().err, argv


def test_report_of_a_directory_that_is_not_a_sweep_says_so(tmp_path, capsys):
  """Not the bare `[Errno 2] ... sweep.json`: what the directory is and what to pass."""
  script = load_sweep_script()
  run = tmp_path / "run"
  run.mkdir()
  (run / "config.json").write_text("{}")
  for path, hint in ((tmp_path, "pass the --workdir a sweep ran in"),
                     (run, f"scripts/plot_metrics.py --workdir {run}"),
                     (tmp_path / "missing", "it does not exist")):
    assert script.main(["--workdir", str(path), "--report"]) == 1
    err = capsys.readouterr().err
    assert f"error: {path} is not a sweep directory (no sweep.json): " in err and hint in err, err
    assert "Errno" not in err
  assert os.listdir(run) == ["config.json"]   # no report written into it


def test_config_overrides_reach_every_point(tmp_path, monkeypatch, capsys):
  """`--config.X=V` given to scripts/sweep.py reaches each point's train command after the
  point's own fields, and sets the number of steps the driver checks a point against."""
  fake = tmp_path / "fake_train.py"
  fake.write_text(textwrap.dedent("""
      import json, os, sys
      workdir = sys.argv[sys.argv.index("--workdir") + 1]
      os.makedirs(workdir, exist_ok=True)
      with open(os.path.join(workdir, "argv.json"), "w") as f:
        json.dump(sys.argv[1:], f)
  """))
  script = load_sweep_script()
  monkeypatch.setattr(script, "TRAIN", str(fake))
  sweep_dir = tmp_path / "sweep"
  overrides = ["--config.num_train_steps=7", "--config.model.d_model=16",
               "--config.async_checkpointing=true"]
  assert script.main(["--config", TINY + ":x", "--workdir", str(sweep_dir), *overrides]) == 0
  for point in sweeps.points_from_config(TINY):
    argv = json.loads((sweep_dir / sweeps.point_name(point) / "argv.json").read_text())
    assert argv[:2] == ["--config", TINY + ":x"]
    assert argv[-5:] == sweeps.override_flags(point) + overrides
  assert json.loads((sweep_dir / "sweep.json").read_text())["extra_flags"] == overrides
  # An override of a swept field would replace every point's value (it comes last) while the
  # points' names and the report showed the swept ones: refused before anything runs.
  swept = tmp_path / "steps.py"
  swept.write_text("from tiny_config import get_config\n"
                   "def sweep():\n  return [{'num_train_steps': 2}, {'num_train_steps': 4}]\n")
  assert sweeps.Runner(str(swept), str(tmp_path / "s0"), str(fake)).num_steps == [2, 4]
  assert script.main(["--config", str(swept), "--workdir", str(tmp_path / "s1"),
                      "--config.num_train_steps=7"]) == 1
  assert ("error: --config.num_train_steps sets a field the sweep varies: it would replace "
          "every point's num_train_steps") in capsys.readouterr().err
  assert not (tmp_path / "s1").exists()
  with pytest.raises(sweeps.SweepError, match=r"^--config.learning_rate sets a field the sweep "
                     r"varies: it would replace every point's learning_rate; drop the flag"):
    sweeps.Runner(TINY, str(tmp_path / "s2"), str(fake),  # two swept: the first named
                  {"warmup_steps": 3, "learning_rate": 0.5})
  # A point no run could train with fails before the first point runs, naming the point; so
  # does a value of the wrong type.
  bad = tmp_path / "bad_point.py"
  bad.write_text("from tiny_config import get_config\n"
                 "def sweep():\n  return [{'model.num_heads': 4}, {'model.num_heads': 5}]\n")
  assert script.main(["--config", str(bad), "--workdir", str(tmp_path / "s2")]) == 1
  err = capsys.readouterr().err
  assert "error: point 1 (model.num_heads=5): " in err and "not divisible by num_heads=5" in err
  assert not (tmp_path / "s2").exists()
  typed = tmp_path / "typed.py"
  typed.write_text("from tiny_config import get_config\n"
                   "def sweep():\n  return [{'data.batch_size': 8}, {'data.batch_size': 'x'}]\n")
  with pytest.raises(sweeps.SweepError, match="data.batch_size='x': "):
    sweeps.points_from_config(str(typed))
  # A misspelt override fails before any point runs, naming the field.
  assert script.main(["--config", TINY, "--workdir", str(tmp_path / "bad"),
                      "--config.num_train_stepz=7"]) == 2
  assert "num_train_stepz" in capsys.readouterr().err
  assert not (tmp_path / "bad").exists()
  # So does a value no point could train with: one error line, not a traceback per point.
  assert script.main(["--config", TINY, "--workdir", str(tmp_path / "bad"),
                      "--config.log_every_steps=0"]) == 1
  assert "error: config.log_every_steps=0: must be >= 1" in capsys.readouterr().err
  assert not (tmp_path / "bad").exists()


def test_slots_take_their_gpus_from_an_inherited_cuda_visible_devices():
  """An allocation's (or a user's) CUDA_VISIBLE_DEVICES: a slot takes entries [s*K, (s+1)*K) of
  it, not physical ids from 0, and a slot past its end is refused."""
  parent = {"CUDA_VISIBLE_DEVICES": "4,5,6,7", "XLA_FLAGS": ""}
  assert [sweeps.slot_env(s, 2, parent)["CUDA_VISIBLE_DEVICES"] for s in (0, 1)] == [
      "4,5", "6,7"]
  uuids = {"CUDA_VISIBLE_DEVICES": "GPU-8f3c2b1a, GPU-0d9e7f66"}
  assert sweeps.slot_env(1, 1, uuids)["CUDA_VISIBLE_DEVICES"] == "GPU-0d9e7f66"
  with pytest.raises(sweeps.SweepError, match=(
      r"3 point\(s\) at a time x --devices_per_point 2 need 6 GPUs, but the inherited "
      r"CUDA_VISIBLE_DEVICES=4,5,6,7 lists 4 that CUDA shows: lower --parallel or "
      r"--devices_per_point")):
    sweeps.slot_env(2, 2, parent)
  # Unset: every GPU is ours, counted from 0. Empty: GPUs hidden for a CPU sweep stay hidden.
  assert sweeps.slot_env(3, 2, {})["CUDA_VISIBLE_DEVICES"] == "6,7"
  hidden = sweeps.slot_env(3, 2, {"CUDA_VISIBLE_DEVICES": ""})
  assert hidden["CUDA_VISIBLE_DEVICES"] == ""
  assert hidden["XLA_FLAGS"] == "--xla_force_host_platform_device_count=2"
  # So do the other ways of hiding them: CUDA's "-1", SLURM's "NoDevFiles".
  for value in ("-1", "NoDevFiles"):
    assert sweeps.slot_env(3, 2, {"CUDA_VISIBLE_DEVICES": value})["CUDA_VISIBLE_DEVICES"] == value
  # CUDA shows the entries before the first that is neither an id nor a UUID: "0,1,-1,3" is 0, 1.
  cut = {"CUDA_VISIBLE_DEVICES": "0,1,-1,3"}
  assert [sweeps.slot_env(s, 1, cut)["CUDA_VISIBLE_DEVICES"] for s in (0, 1)] == ["0", "1"]
  with pytest.raises(sweeps.SweepError, match=r"CUDA_VISIBLE_DEVICES=0,1,-1,3 lists 2 that"):
    sweeps.slot_env(2, 1, cut)
  assert sweeps.slot_env(5, 0, parent) == parent   # K=0: each point sees all of them


def test_more_slots_than_inherited_gpus_fail_before_any_point_starts(tmp_path, monkeypatch):
  # Two per point, or one: two slots want more GPUs than the inherited list has.
  for gpus, per_point in (("2,3", 2), ("2", 1)):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", gpus)
    runner = sweeps.Runner(TINY, str(tmp_path / "sweep"), str(tmp_path / "train.py"))
    with pytest.raises(sweeps.SweepError,
                       match=rf"2 point\(s\) at a time x --devices_per_point {per_point}"):
      runner.run(parallel=2, devices_per_point=per_point, log=lambda s: None)
    assert not any(os.path.exists(sweeps.point_dir(runner.sweep_dir, p)) for p in runner.points)
    assert not os.path.exists(os.path.join(runner.sweep_dir, "sweep.json"))  # refused: untouched
  monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
  # Only slots with a point to run need GPUs: one point left runs on the first slot's.
  fake = tmp_path / "fake_train.py"
  fake.write_text("import os, sys\nw = sys.argv[sys.argv.index('--workdir') + 1]\n"
                  "os.makedirs(w, exist_ok=True)\n"
                  "gpus = os.environ['CUDA_VISIBLE_DEVICES']\n"
                  "open(os.path.join(w, 'devices'), 'w').write(gpus)\n")
  runner = sweeps.Runner(TINY, str(tmp_path / "one"), str(fake))
  [result] = runner.run([0], parallel=2, devices_per_point=2, log=lambda s: None)
  assert result["returncode"] == 0
  with open(os.path.join(sweeps.point_dir(runner.sweep_dir, runner.points[0]), "devices")) as f:
    assert f.read() == "2,3"


def test_a_sweep_with_every_point_done_needs_no_gpus(tmp_path, monkeypatch):
  # Run again on a smaller machine, a finished sweep reports its points.
  fake = tmp_path / "fake_train.py"
  fake.write_text(FAKE_TRAIN)
  monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
  runner = sweeps.Runner(TINY, str(tmp_path / "done"), str(fake), {"num_train_steps": 3})
  assert runner.run([0], log=lambda s: None)[0]["status"] == "done"
  [again] = runner.run([0], parallel=2, devices_per_point=3, log=lambda s: None)
  assert again["status"] == "skipped (done)"


SLOT_TRAIN = textwrap.dedent("""
    import os, sys, time
    workdir = sys.argv[sys.argv.index("--workdir") + 1]
    os.makedirs(workdir, exist_ok=True)
    with open(os.path.join(workdir, "devices"), "w") as f:
      f.write(os.environ.get("CUDA_VISIBLE_DEVICES", "unset"))
    name, go = os.path.basename(workdir), os.environ["FAKE_GO"]
    if name == os.environ["FAKE_LAST"]:
      open(go, "w").close()
    if name == os.environ["FAKE_SLOW"]:   # until the last point has run (at most 30 s)
      end = time.time() + 30
      while not os.path.exists(go) and time.time() < end:
        time.sleep(0.05)
""")


def test_a_slot_takes_the_next_point_as_soon_as_its_own_ends(tmp_path, monkeypatch):
  """Two slots: points 1, 2, 3 run one after another in one slot while point 0 holds the other
  (until point 3 has run), not after it; without --devices_per_point the points' environment
  keeps its devices as it is; --parallel 0 runs them one at a time, as 1 does."""
  monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
  fake = tmp_path / "fake_train.py"
  fake.write_text(SLOT_TRAIN)
  runner = sweeps.Runner(TINY, str(tmp_path / "sweep"), str(fake))
  names = [sweeps.point_name(p) for p in runner.points]
  monkeypatch.setenv("FAKE_SLOW", names[0])
  monkeypatch.setenv("FAKE_LAST", names[3])
  monkeypatch.setenv("FAKE_GO", str(tmp_path / "go"))
  lines = []
  results = runner.run(parallel=2, log=lines.append)
  assert [r["returncode"] for r in results] == [0] * 4

  def at(i, what):
    return next(k for k, line in enumerate(lines) if line.startswith(f"[{i}] ") and what in line)

  ended = [at(i, "(exit status 0, ") for i in range(4)]
  assert ended[1] < at(2, "started") < ended[2] < at(3, "started") < ended[0], lines
  assert results[0]["seconds"] < 20, lines   # released by point 3, not by its time limit
  for name in names:
    assert (tmp_path / "sweep" / name / "devices").read_text() == "unset"
  # --parallel 0: one at a time (run in a thread, so that a loop with no slot fails the test
  # instead of hanging it).
  (tmp_path / "go").unlink()
  one = sweeps.Runner(TINY, str(tmp_path / "one"), str(fake))
  done = []
  thread = threading.Thread(target=lambda: done.append(
      one.run([1, 3], parallel=0, log=lambda s: None)), daemon=True)
  thread.start()
  thread.join(timeout=60)
  assert done and [r["returncode"] for r in done[0]] == [0, 0]


def test_sweep_errors_found_while_running_are_one_error_line(tmp_path, monkeypatch, capsys):
  # Found by Runner.run, after the points loaded: still `error: ...`, not a traceback.
  monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
  script = load_sweep_script()
  assert script.main(["--config", TINY, "--workdir", str(tmp_path / "sweep"), "--parallel", "2",
                      "--devices_per_point", "2"]) == 1
  err = capsys.readouterr().err
  assert err.startswith("error: 2 point(s) at a time x --devices_per_point 2") and \
      err.count("\n") == 1, err


def test_parallel_slots_get_disjoint_devices(tmp_path, monkeypatch):
  monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)  # slots then count GPUs from 0
  fake = tmp_path / "fake_train.py"
  fake.write_text(textwrap.dedent("""
      import os, sys, time
      workdir = sys.argv[sys.argv.index("--workdir") + 1]
      os.makedirs(workdir, exist_ok=True)
      open(os.path.join(workdir, "devices"), "w").write(os.environ["CUDA_VISIBLE_DEVICES"] + " "
                                                        + os.environ["XLA_FLAGS"])
      time.sleep(0.5)
  """))
  sweep_dir = str(tmp_path / "sweep")
  runner = sweeps.Runner(TINY, sweep_dir, str(fake))
  lines = []
  results = runner.run(parallel=2, devices_per_point=4, log=lines.append)
  assert [r["returncode"] for r in results] == [0] * 4  # (not "done": no final step is saved)
  # The first two start at once, each in its own slot, named in the log.
  assert [line.split(": ", 1)[1] for line in lines[:2]] == ["started (slot 0)",
                                                            "started (slot 1)"], lines
  seen = []
  for p in runner.points:
    with open(os.path.join(sweeps.point_dir(sweep_dir, p), "devices")) as f:
      visible, flags = f.read().split(" ", 1)
    seen.append(visible)
    assert flags.endswith("--xla_force_host_platform_device_count=4")
  assert set(seen) == {"0,1,2,3", "4,5,6,7"}


def test_slurm_script(tmp_path):
  sweep_dir = tmp_path / "lr"
  out = subprocess.run(
      [sys.executable, os.path.join(REPO, "scripts", "sweep.py"), "--config", TINY + ":x",
       "--workdir", str(sweep_dir), "--slurm", "--slurm_option=--gres=gpu:1",
       "--slurm_max_concurrent", "2", "--config.num_train_steps=3"],
      capture_output=True, text=True, timeout=120, cwd=REPO)
  assert out.returncode == 0, out.stderr
  script = (sweep_dir / "sweep.sbatch").read_text()
  assert "#SBATCH --array=0-3%2" in script and "#SBATCH --gres=gpu:1" in script
  assert script.rstrip().endswith("--point $SLURM_ARRAY_TASK_ID")
  assert f"--config {TINY}:x" in script and "--config.num_train_steps=3" in script
  assert os.path.isdir(sweep_dir / "slurm")
  recorded = (sweep_dir / "sweep.json").read_text()
  assert len(json.loads(recorded)["points"]) == 4
  # A look with another command line (no `:x`, no flags) must not rewrite what the sweep recorded.
  listing = subprocess.run(
      [sys.executable, os.path.join(REPO, "scripts", "sweep.py"), "--config", TINY,
       "--workdir", str(sweep_dir), "--list"], capture_output=True, text=True, timeout=120)
  assert listing.returncode == 0, listing.stderr
  assert listing.stdout.splitlines()[0] == "0\tnew\tlearning_rate=1,warmup_steps=5"
  assert (sweep_dir / "sweep.json").read_text() == recorded


def test_list_writes_nothing(tmp_path, monkeypatch):
  """`--list` before a sweep exists: statuses, and no directory left behind."""
  sweep_dir = tmp_path / "not_yet"
  runner = sweeps.Runner(TINY, str(sweep_dir), str(tmp_path / "train.py"), record=False)
  assert [runner.status(i) for i in range(len(runner.points))] == ["new"] * 4
  assert not sweep_dir.exists()
  with pytest.raises(ValueError, match="only looks"):
    runner.run()
  runner.write_spec()   # what a submission calls: a look writes nothing
  assert not sweep_dir.exists()
  # Nor does a task of a multi-task point but its first (srun: SLURM_PROCID 1, 2, ...).
  monkeypatch.setenv("SLURM_PROCID", "1")
  sweeps.Runner(TINY, str(sweep_dir), str(tmp_path / "train.py")).write_spec()
  assert not sweep_dir.exists()
  monkeypatch.setenv("SLURM_PROCID", "0")
  sweeps.Runner(TINY, str(sweep_dir), str(tmp_path / "train.py")).write_spec()
  assert json.loads((sweep_dir / "sweep.json").read_text())["config"] == TINY


def test_list_takes_the_overrides_the_sweep_recorded(tmp_path, capsys):
  """A sweep run with `--config.num_train_steps=3` is listed done without the flag (not partial
  against the config's default steps); other flags are used, with a warning naming the sweep's."""
  fake = tmp_path / "fake_train.py"
  fake.write_text(FAKE_TRAIN)
  sweep_dir = str(tmp_path / "sweep")
  sweeps.Runner(TINY, sweep_dir, str(fake), {"num_train_steps": 3}).run([0], log=lambda s: None)
  with open(os.path.join(sweep_dir, "sweep.json")) as f:
    assert json.load(f)["overrides"] == {"num_train_steps": 3}
  script = load_sweep_script()

  def listing(*flags):
    assert script.main(["--config", TINY, "--workdir", sweep_dir, "--list", *flags]) == 0
    out, err = capsys.readouterr()
    return [line.split("\t")[1] for line in out.splitlines()], err

  assert listing() == (["done", "new", "new", "new"], "")
  assert listing("--config.num_train_steps=3") == (["done", "new", "new", "new"], "")
  statuses, err = listing("--config.num_train_steps=5")
  assert statuses[0] == "partial"
  assert err == ("warning: statuses are computed with this command's flags "
                 "(--config.num_train_steps=5), not the sweep's (--config.num_train_steps=3, "
                 f"recorded in {sweep_dir}/sweep.json)\n")


def test_a_look_compares_overrides_as_sweep_json_holds_them(tmp_path):
  """A tuple override comes back from sweep.json as a list: the same value, though its flag now
  reads `[8, 16]` where the sweep's read `(8, 16)`. A look warns of other values only."""
  fake = tmp_path / "fake_train.py"
  fake.write_text(FAKE_TRAIN)
  sweep_dir = str(tmp_path / "sweep")
  overrides = {"num_train_steps": 3, "data.bucket_boundaries": (8, 16)}
  sweeps.Runner(TINY, sweep_dir, str(fake), overrides).run([0], log=lambda s: None)
  look = sweeps.Runner(TINY, sweep_dir, str(fake), record=False)
  assert look.extra_flags != look.recorded_flags and not look.differs_from_recorded()
  look = sweeps.Runner(TINY, sweep_dir, str(fake), {"num_train_steps": 5}, record=False)
  assert look.differs_from_recorded()
  # Nothing recorded: nothing to differ from.
  fresh = sweeps.Runner(TINY, str(tmp_path / "new"), str(fake), {"seed": 3}, record=False)
  assert not fresh.differs_from_recorded()
  # A sweep.json from before "overrides" (2026-11-25) holds the flags only: compared as flags.
  old = tmp_path / "old"
  old.mkdir()
  (old / "sweep.json").write_text(json.dumps({"config": TINY,
                                              "extra_flags": ["--config.num_train_steps=3"]}))
  same = sweeps.Runner(TINY, str(old), str(fake), {"num_train_steps": 3}, record=False)
  assert same.recorded_flags == same.extra_flags and not same.differs_from_recorded()
  assert sweeps.Runner(TINY, str(old), str(fake), {"num_train_steps": 5},
                       record=False).differs_from_recorded()


def test_a_failed_points_marker_holds_its_time_and_the_last_60_lines_of_its_log(tmp_path):
  fake = tmp_path / "fake_train.py"
  fake.write_text("import sys\nprint('\\n'.join(f'line {i}' for i in range(1, 101)))\n"
                  "sys.exit(3)\n")
  runner = sweeps.Runner(TINY, str(tmp_path / "sweep"), str(fake))
  [result] = runner.run([0], log=lambda s: None)
  assert result["returncode"] == 3
  d = sweeps.point_dir(runner.sweep_dir, runner.points[0])
  text = open(os.path.join(d, sweeps.FAILED)).read()
  assert text.startswith("exit status 3 after ")
  tail = text.split("train.log:\n", 1)[1]
  assert tail.splitlines() == [f"line {i}" for i in range(41, 101)]
  assert runner._finish(0, 3, 1.26, stopped=False)["seconds"] == 1.3
  assert open(os.path.join(d, sweeps.FAILED)).read().startswith("exit status 3 after 1.3 s\n$ ")


def test_slurm_script_quotes_its_paths_for_sbatch(tmp_path):
  """sbatch splits `#SBATCH` lines itself as shlex does with comments: at unquoted spaces, and an
  unquoted `#` starts a comment. `%` in the directory would be a SLURM filename pattern."""
  sweep_dir = tmp_path / "my runs#2" / "lr 50%"
  runner = sweeps.Runner(TINY, str(sweep_dir), str(tmp_path / "train.py"))
  script = sweeps.sbatch_script(runner)
  directives = [shlex.split(line[len("#SBATCH "):], comments=True)
                for line in script.splitlines() if line.startswith("#SBATCH ")]
  assert directives == [["--job-name=lr 50%"], ["--array=0-3"],
                        [f"--output={tmp_path}/my runs#2/lr 50%%/slurm/%A_%a.out"]]
  # What SLURM makes of it (%A_%a expanded, %% a %) is where the driver looks for a task's log.
  assert sweeps.log_path(runner, "7", 1) == f"{sweep_dir}/slurm/7_1.out"
  # A backslash turns SLURM's patterns off: every task would write one file.
  backslash = sweeps.Runner(TINY, str(tmp_path / "a\\b"), str(tmp_path / "train.py"))
  with pytest.raises(sweeps.SweepError, match="has a backslash, which SLURM's --output cannot"):
    sweeps.write_sbatch(backslash)


def test_sweep_end_to_end(tmp_path):
  """Two of the 4 points (learning rate x warmup) of the tiny config, 3 steps each, through
  scripts/train.py: `--point` runs only those; a re-run skips them; the report shows all 4."""
  data_dir = tmp_path / "tfds"
  c = tiny_config.get_config()
  c.data.data_dir = str(data_dir)
  get_data(c.data, str(tmp_path / "prebuild"))  # the dataset once, before the processes use it
  sweep_dir = tmp_path / "lr_warmup"
  cmd = [sys.executable, os.path.join(REPO, "scripts", "sweep.py"), "--config", TINY,
         "--workdir", str(sweep_dir), f"--config.data.data_dir={data_dir}",
         "--config.num_train_steps=3", "--config.bleu_num_sentences=4"]
  # Each point trains its own vocabulary in its workdir, whose name has commas in it.
  env = dict(os.environ, XLA_FLAGS=xla_env.flags(1))
  out = subprocess.run(cmd + ["--point", "1", "--point", "2"], capture_output=True, text=True,
                       timeout=600, cwd=REPO, env=env)
  assert out.returncode == 0, out.stderr[-5000:]
  names = [sweeps.point_name(p) for p in sweeps.points_from_config(TINY)]
  ran = [names[1], names[2]]
  assert ran == ["learning_rate=1,warmup_steps=10", "learning_rate=2,warmup_steps=5"]
  for name in names:
    assert os.path.exists(sweep_dir / name / sweeps.DONE) == (name in ran), name
  for name in ran:
    assert sweeps.finished(str(sweep_dir / name), 3)
  # The learning rate reached the run: at step 3 the rate is lr * d^-0.5 * 3 * warmup^-1.5.
  lrs = {}
  for name in ran:
    records = [json.loads(line) for line in open(sweep_dir / name / "metrics.jsonl")]
    lrs[name] = [r["learning_rate"] for r in records if "learning_rate" in r][-1]
  def expected(lr, w):
    return lr * 32**-0.5 * 3 * w**-1.5  # the schedule's count is 2 at step 3
  assert lrs["learning_rate=2,warmup_steps=5"] == pytest.approx(expected(2.0, 5), rel=1e-5)
  assert lrs["learning_rate=1,warmup_steps=10"] == pytest.approx(expected(1.0, 10), rel=1e-5)

  # Re-running them skips both; the report sorts by final BLEU and plots the two that ran.
  again = subprocess.run(cmd + ["--point", "1", "--point", "2"], capture_output=True, text=True,
                         timeout=120, cwd=REPO, env=env)
  assert again.returncode == 0 and again.stderr.count("already done, skipped") == 2
  rep = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "sweep.py"), "--workdir",
                        str(sweep_dir), "--report", "--metric", "bleu"],
                       capture_output=True, text=True, timeout=120, cwd=REPO)
  assert rep.returncode == 0, rep.stderr
  assert rep.stdout.count("| done |") == 2 and len(rep.stdout.strip().splitlines()) == 2 + 4
  with open(sweep_dir / "report.csv") as f:
    rows = list(csv.DictReader(f))
  assert sorted(float(r["learning_rate"]) for r in rows) == [1.0, 1.0, 2.0, 2.0]
  done = [r for r in rows if r["status"] == "done"]
  assert len(done) == 2 and all(float(r["step"]) == 3 and r["bleu"] != "" for r in done)
  assert {"report.csv", "report.md", "report_bleu.png"} <= set(os.listdir(sweep_dir))


def test_a_metrics_line_cut_by_a_crash_is_skipped(tmp_path):
  with open(tmp_path / "metrics.jsonl", "w") as f:
    f.write(json.dumps({"step": 1, "train_loss": 2.0}) + "\n")
    f.write(json.dumps({"step": 2, "bleu": 7.5}) + "\n")
    f.write('{"step": 3, "train_lo')  # the process died mid-write
  assert [r["step"] for r in metrics.read_metrics(str(tmp_path))] == [1, 2]
  assert metrics.last_values(str(tmp_path))["bleu"] == 7.5


def test_slurm_submission_covers_unfinished_points_and_counts_killed_ones(tmp_path,
                                                                          monkeypatch):
  """Without SLURM: which points a submission takes, and how a task SLURM killed is reported
  (tests/test_slurm.py submits for real)."""
  runner = sweeps.Runner(TINY, str(tmp_path / "s"), str(tmp_path / "train.py"))
  assert sweeps.array_spec([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
  done = sweeps.point_dir(runner.sweep_dir, runner.points[1])
  os.makedirs(done)
  with open(os.path.join(done, sweeps.DONE), "w") as f:
    f.write(f"num_train_steps {runner.num_steps[1]}\n")
  assert sweeps.unfinished(runner) == [0, 2, 3]
  assert "#SBATCH --array=0,2-3" in sweeps.sbatch_script(runner, indices=[0, 2, 3])
  # A point that never wrote a marker ended unfinished: with SLURM's logs it is a failure.
  lines, failed = runner.outcome([0, 1], logs=lambda i: f"slurm/7_{i}.out")
  assert failed == 1 and lines[0].endswith("ended unfinished, see slurm/7_0.out")
  assert lines[1].endswith(": done")
  assert runner.outcome([0, 1])[1] == 0                 # run locally: still to be run
  # An earlier array job of the sweep still in the queue: no second submission races it.
  os.makedirs(os.path.join(runner.sweep_dir, "slurm"), exist_ok=True)
  with open(os.path.join(runner.sweep_dir, "slurm", "job_id"), "w") as f:
    f.write("41\n")
  monkeypatch.setattr(sweeps_slurm, "queued", lambda job: job == "41")
  with pytest.raises(sweeps.SubmitError, match="job 41 of this sweep is still queued"):
    sweeps.submit(runner)


FAKE_SLURM = """#!/bin/sh
# A stand-in for sbatch or squeue: records its arguments, answers what the test set.
echo "$0 $*" >> "$FAKE_SLURM_LOG"
name=$(basename "$0")
eval "out=\\$FAKE_${name}_OUT; err=\\$FAKE_${name}_ERR; rc=\\$FAKE_${name}_RC"
[ -n "$out" ] && echo "$out"
[ -n "$err" ] && echo "$err" >&2
exit "${rc:-0}"
"""


def test_a_submission_waited_for_records_its_job_as_soon_as_sbatch_accepts_it(tmp_path,
                                                                            monkeypatch):
  """`--submit --wait` recorded the job only once the whole array had ended: a wait cut short
  (Ctrl-C, a closed session) left no record, and the next --submit sent every point again
  beside the running array."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  # sbatch --wait: the id when accepted, then the wait (here until the test creates `ended`).
  (bin_dir / "sbatch").write_text(
      f"#!/bin/sh\necho 79\nwhile [ ! -e {tmp_path}/ended ]; do sleep 0.05; done\nexit 1\n")
  (bin_dir / "squeue").write_text("#!/bin/sh\necho '  79_0  debug  sweep  me  R  0:05  1 node'\n")
  for name in ("sbatch", "squeue"):
    (bin_dir / name).chmod(0o755)
  monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
  sweep_dir = str(tmp_path / "s")
  runner = sweeps.Runner(TINY, sweep_dir, str(tmp_path / "train.py"))
  record = os.path.join(sweep_dir, "slurm", "job_id")
  waited = []
  thread = threading.Thread(target=lambda: waited.append(sweeps.submit(runner, wait=True)))
  thread.start()
  try:
    deadline = time.time() + 30
    while not (os.path.exists(record) and open(record).read()) and time.time() < deadline:
      time.sleep(0.05)
    assert open(record).read() == "79\n" and thread.is_alive()   # recorded while it waits
    assert os.path.exists(os.path.join(sweep_dir, "sweep.json"))
    with pytest.raises(sweeps.SubmitError, match="job 79 of this sweep is still queued"):
      sweeps.submit(runner)
  finally:
    (tmp_path / "ended").touch()
    thread.join(30)
  # The array's exit status (a point failed) is the caller's to read from the markers.
  assert waited == [("79", [0, 1, 2, 3])]


def test_slurm_submission_with_stand_ins_for_sbatch_and_squeue(tmp_path, monkeypatch):
  """What `submit` runs and reads, with scripts in place of sbatch and squeue on the PATH: the
  job id of `--parsable` (`id;cluster`), `--wait` only when asked, a refusal's message, no
  submission when every point is done or an earlier job is still queued."""
  bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
  bin_dir.mkdir()
  for name in ("sbatch", "squeue"):
    (bin_dir / name).write_text(FAKE_SLURM)
    (bin_dir / name).chmod(0o755)
  monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
  monkeypatch.setenv("FAKE_SLURM_LOG", str(log))

  def calls():
    text = log.read_text() if log.exists() else ""
    log.write_text("")
    return [line.split()[1:] for line in text.splitlines()]

  # squeue: a job is queued while it lists any task; an error (exit 1, unknown id) is not one.
  monkeypatch.setenv("FAKE_squeue_OUT", "  41_0  debug  sweep  me  R  0:05  1 node")
  assert sweeps_slurm.queued("41") and calls() == [["-h", "-j", "41"]]
  monkeypatch.setenv("FAKE_squeue_RC", "1")
  assert not sweeps_slurm.queued("41")
  monkeypatch.setenv("FAKE_squeue_RC", "0")
  monkeypatch.setenv("FAKE_squeue_OUT", "")
  assert not sweeps_slurm.queued("41")
  calls()

  sweep_dir = str(tmp_path / "s")
  runner = sweeps.Runner(TINY, sweep_dir, str(tmp_path / "train.py"))
  record = os.path.join(sweep_dir, "slurm", "job_id")
  # Refused by sbatch: its message, nothing recorded, sweep.json not written.
  monkeypatch.setenv("FAKE_sbatch_ERR", "sbatch: error: invalid partition specified: gpu")
  monkeypatch.setenv("FAKE_sbatch_RC", "1")
  with pytest.raises(sweeps.SubmitError, match=r"sbatch --parsable .*sweep\.sbatch failed "
                                               r"\(exit 1\): sbatch: error: invalid partition"):
    sweeps.submit(runner, ["--partition=gpu"])
  assert not os.path.exists(record) and not os.path.exists(os.path.join(sweep_dir, "sweep.json"))
  assert "#SBATCH --partition=gpu" in open(os.path.join(sweep_dir, "sweep.sbatch")).read()
  monkeypatch.setenv("FAKE_sbatch_ERR", "")
  monkeypatch.setenv("FAKE_sbatch_OUT", "sbatch: error: Batch job submission failed\n"
                     "sbatch: error: Invalid account")   # on stdout, one line after the other
  with pytest.raises(sweeps.SubmitError, match=r"\(exit 1\): sbatch: error: Batch job "
                                               r"submission failed\nsbatch: error: Invalid"):
    sweeps.submit(runner)
  calls()
  # Accepted: the id before `;cluster` recorded, the points given back, no --wait by default.
  monkeypatch.setenv("FAKE_sbatch_RC", "0")
  monkeypatch.setenv("FAKE_sbatch_OUT", "77;cluster0")
  script = os.path.join(sweep_dir, "sweep.sbatch")
  assert sweeps.submit(runner) == ("77", [0, 1, 2, 3])
  assert calls() == [["--parsable", script]]
  assert open(record).read() == "77\n" and os.path.exists(os.path.join(sweep_dir, "sweep.json"))
  assert "#SBATCH --array=0-3\n" in open(script).read()   # no limit on running tasks
  # Job 77 still queued: refused; ended: submitted again, here waiting for it.
  monkeypatch.setenv("FAKE_squeue_OUT", "  77_2  debug  sweep  me  R  0:05  1 node")
  with pytest.raises(sweeps.SubmitError, match="job 77 of this sweep is still queued"):
    sweeps.submit(runner)
  monkeypatch.setenv("FAKE_squeue_OUT", "")
  monkeypatch.setenv("FAKE_sbatch_OUT", "78")
  assert sweeps.submit(runner, max_concurrent=2, wait=True) == ("78", [0, 1, 2, 3])
  assert calls() == [["-h", "-j", "77"], ["-h", "-j", "77"], ["--parsable", "--wait", script]]
  assert "#SBATCH --array=0-3%2\n" in open(script).read()
  # A record left empty (a crash as it was written) asks squeue nothing.
  open(record, "w").close()
  monkeypatch.setenv("FAKE_squeue_OUT", "  1_0  debug  other  me  R  0:05  1 node")
  assert sweeps.submit(runner)[0] == "78" and calls() == [["--parsable", script]]
  # Every point done: nothing submitted.
  monkeypatch.setenv("FAKE_squeue_OUT", "")
  for i, point in enumerate(runner.points):
    os.makedirs(sweeps.point_dir(sweep_dir, point), exist_ok=True)
    with open(os.path.join(sweeps.point_dir(sweep_dir, point), sweeps.DONE), "w") as f:
      f.write(f"num_train_steps {runner.num_steps[i]}\n")
  assert sweeps.submit(runner) == (None, []) and calls() == [["-h", "-j", "78"]]
  assert "#SBATCH --array=0-3\n" in open(sweeps.write_sbatch(runner)).read()  # every point
  # sbatch --array syntax: runs of two or more as ranges, anywhere in the list.
  assert [sweeps.array_spec(i) for i in ([0, 1, 3], [0, 2], [4], [3, 1, 2], [5, 0, 1, 9])] == [
      "0-1,3", "0,2", "4", "1-3", "0-1,5,9"]


def test_a_refused_command_leaves_sweep_json_as_it_was(tmp_path, capsys):
  fake = tmp_path / "fake_train.py"
  fake.write_text(FAKE_TRAIN)
  sweep_dir = str(tmp_path / "sweep")
  sweeps.Runner(TINY, sweep_dir, str(fake), {"num_train_steps": 3}).run([0], log=lambda s: None)
  spec = os.path.join(sweep_dir, "sweep.json")
  with open(spec) as f:
    before = f.read()
  script = load_sweep_script()
  # An index out of range, with other steps: refused before sweep.json is written.
  assert script.main(["--config", TINY, "--workdir", sweep_dir, "--point", "7",
                      "--config.num_train_steps=5"]) == 1
  assert "--point 7: this sweep has points 0..3" in capsys.readouterr().err
  with open(spec) as f:
    assert f.read() == before
  # Another value of a field the sweep does not vary, once a point has started: its done
  # points would be skipped and reported under this value.
  assert script.main(["--config", TINY, "--workdir", sweep_dir, "--config.model.d_model=64",
                      "--config.num_train_steps=3"]) == 1
  assert capsys.readouterr().err == (
      f"error: {sweep_dir} is a sweep run with --config.num_train_steps=3 (sweep.json), and "
      "this command differs in model.d_model: its points would be skipped or resumed, and "
      "reported, as if run with this command's values. Give the sweep's own flags to go on "
      "with it (a new --config.num_train_steps extends it), or another --workdir for other "
      "values\n")
  with open(spec) as f:
    assert f.read() == before
  # A value every started point ran with (its config.json says) changes none of them: taken,
  # and given to the rest (a text corpus's sweep made before data.split's default moved).
  from transformer_jax import experiment
  from transformer_jax.run import workdir as workdir_lib
  first = sweeps.Runner(TINY, sweep_dir, str(fake)).points[0]
  c = sweeps.apply_overrides(tiny_config.get_config(), {**first, "data.split": "grouped"})
  started = sweeps.point_dir(sweep_dir, first)
  workdir_lib.write_config(started, c, experiment.transformer_config(c, vocab_size=32))
  assert sweeps.Runner(TINY, sweep_dir, str(fake), {"data.split": "grouped"}).overrides == {
      "num_train_steps": 3, "data.split": "grouped"}
  with pytest.raises(sweeps.SweepError, match="differs in data.split: its points"):
    sweeps.Runner(TINY, sweep_dir, str(fake), {"data.split": "source"})
  # Every config the point ran with: one resumed with another value is changed by it.
  c.data.split = "source"
  workdir_lib.write_config(started, c, experiment.transformer_config(c, vocab_size=32),
                           name="config.2.json")
  with pytest.raises(sweeps.SweepError, match="differs in data.split: its points"):
    sweeps.Runner(TINY, sweep_dir, str(fake), {"data.split": "grouped"})
  os.remove(os.path.join(started, "config.2.json"))
  # A config.json that does not read tells nothing: refused as before.
  with open(os.path.join(started, workdir_lib.CONFIG), "w") as f:
    f.write('{"data": ')
  with pytest.raises(sweeps.SweepError, match="differs in data.split: its points"):
    sweeps.Runner(TINY, sweep_dir, str(fake), {"data.split": "grouped"})
  os.remove(os.path.join(started, workdir_lib.CONFIG))
  with pytest.raises(sweeps.SweepError, match="differs in data.split: its points"):
    sweeps.Runner(TINY, sweep_dir, str(fake), {"data.split": "grouped"})
  # No flags at all: the sweep's own (as --list takes them), not the config's defaults; and
  # a new num_train_steps alone extends a sweep run with other flags too.
  assert sweeps.Runner(TINY, sweep_dir, str(fake)).overrides == {"num_train_steps": 3}
  with open(spec) as f:
    recorded = json.load(f)
  recorded["overrides"]["label_smoothing"] = 0.0
  with open(spec, "w") as f:
    json.dump(recorded, f)
  assert sweeps.Runner(TINY, sweep_dir, str(fake), {"num_train_steps": 5}).overrides == {
      "num_train_steps": 5, "label_smoothing": 0.0}
  # A sweep.json from before "overrides" was recorded: its flags cannot be taken, so a
  # command without them is refused (it would train to the config's default steps).
  del recorded["overrides"]
  with open(spec, "w") as f:
    json.dump(recorded, f)
  with pytest.raises(sweeps.SweepError, match="differs in flags"):
    sweeps.Runner(TINY, sweep_dir, str(fake))
  assert sweeps.Runner(TINY, sweep_dir, str(fake), {"num_train_steps": 3}).overrides == {
      "num_train_steps": 3}
  # More steps extend it; the same flags go on with it.
  more = sweeps.Runner(TINY, sweep_dir, str(fake), {"num_train_steps": 4})
  more.write_spec()
  with open(spec) as f:
    assert json.load(f)["overrides"] == {"num_train_steps": 4}
  # A sweep directory whose points never started takes any flags.
  fresh = str(tmp_path / "fresh")
  sweeps.Runner(TINY, fresh, str(fake), {"num_train_steps": 3}).write_spec()
  sweeps.Runner(TINY, fresh, str(fake), {"num_train_steps": 3, "model.d_model": 64})


def test_another_configs_sweep_is_refused_where_its_points_started(tmp_path, capsys,
                                                                   monkeypatch):
  """A sweep directory belongs to the config sweep.json records once a point of it started:
  another config's run there would replace sweep.json and drop the old points from the
  report. Without --config, the recorded one is used."""
  fake = tmp_path / "fake_train.py"
  fake.write_text(FAKE_TRAIN)
  sweep_dir = str(tmp_path / "sweep")
  sweeps.Runner(TINY, sweep_dir, str(fake), {"num_train_steps": 3}).run([0, 1],
                                                                       log=lambda s: None)
  spec = os.path.join(sweep_dir, "sweep.json")
  with open(spec) as f:
    before = f.read()
  other = tmp_path / "other.py"
  other.write_text(open(TINY).read() + "\n\ndef sweep():\n  return [{'seed': 7}]\n")
  script = load_sweep_script()
  assert script.main(["--config", str(other), "--workdir", sweep_dir]) == 1
  assert capsys.readouterr().err == (
      f"error: {sweep_dir} is a sweep of --config {TINY} (sweep.json), not of {other}: 2 of "
      f"its started points ({sweeps.point_name(sweeps.load_sweep(TINY).points[0])} first) are "
      "not this config's, and running it there would replace sweep.json and leave them out of "
      "the report. Leave out --config (or give that one) to go on with that sweep, or give "
      "another --workdir for this config\n")
  with open(spec) as f:
    assert f.read() == before
  # A look at the other config's points warns that they are not the sweep's, and writes nothing.
  assert script.main(["--config", str(other), "--workdir", sweep_dir, "--list"]) == 0
  out, err = capsys.readouterr()
  assert out == "0\tnew\tseed=7\n" and "records another config" in err, (out, err)
  # Without --config, the recorded config and flags: point 0 done at the recorded 3 steps.
  assert script.main(["--workdir", sweep_dir, "--list"]) == 0
  out, err = capsys.readouterr()
  assert err == f"note: --config {TINY}, as {spec} records\n", err
  assert out.splitlines()[0].split("\t")[:2] == ["0", "done"] and len(out.splitlines()) == 4
  # A --config.X flag without --config: on the recorded one (to extend the sweep, say).
  assert script.main(["--workdir", sweep_dir, "--list", "--config.num_train_steps=5"]) == 0
  err = capsys.readouterr().err
  assert err.startswith(f"note: --config {TINY}, as {spec} records\n"), err
  assert "statuses are computed with this command's flags (--config.num_train_steps=5)" in err
  # The same file by another path is the same config; so is a copy elsewhere (a moved
  # checkout) whose points hold the started one: the sweep's flags apply.
  monkeypatch.chdir(tmp_path)
  sweeps.Runner(os.path.relpath(TINY), sweep_dir, str(fake))
  moved = tmp_path / "moved.py"
  moved.write_text(open(TINY).read())
  assert sweeps.Runner(str(moved), sweep_dir, str(fake)).overrides == {"num_train_steps": 3}
  # ... and where the recorded file is gone, sweep.py without --config takes the path as it
  # was given, when it is there from the current directory.
  recorded = json.loads(before)
  recorded.update(config="moved.py", config_file=str(tmp_path / "gone.py"))
  with open(spec, "w") as f:
    json.dump(recorded, f)
  assert sweeps.recorded_config(sweep_dir) == "moved.py"
  # ... and the copy's config is the recorded one, started points or not (a sweep.json alone):
  # the sweep's flags apply; TINY's is another's.
  alone = tmp_path / "alone"
  alone.mkdir()
  (alone / "sweep.json").write_text(json.dumps(recorded))
  runner = sweeps.Runner(str(moved), str(alone), str(fake), record=False)
  assert runner.recorded_config is None and runner.overrides == {"num_train_steps": 3}
  runner = sweeps.Runner(TINY, str(alone), str(fake), record=False)
  assert runner.recorded_config == "moved.py" and runner.overrides == {}
  os.remove(moved)
  assert sweeps.recorded_config(sweep_dir) == str(tmp_path / "gone.py")
  # A sweep.json written before it kept the file's absolute path: its config as given, taken
  # from the current directory.
  recorded = json.loads(before)
  del recorded["config_file"], recorded["config_arg"]
  recorded["config"] = os.path.relpath(TINY)
  with open(spec, "w") as f:
    json.dump(recorded, f)
  assert sweeps.Runner(TINY, sweep_dir, str(fake)).overrides == {"num_train_steps": 3}
  with pytest.raises(sweeps.SweepError, match="is a sweep of --config "):
    sweeps.Runner(str(other), sweep_dir, str(fake))
  # Where none of the recorded points started, another config may take the directory over,
  # without the old config's flags.
  for point in sweeps.load_sweep(TINY).points[:2]:
    shutil.rmtree(sweeps.point_dir(sweep_dir, point))
  assert sweeps.Runner(str(other), sweep_dir, str(fake)).overrides == {}
  # No sweep.json and no --config: nothing to run.
  assert script.main(["--workdir", str(tmp_path / "none"), "--list"]) == 2
  assert "has no sweep.json naming one" in capsys.readouterr().err


def _sleeping_point(tmp_path, marker: str, save_seconds: float = 0.0, handles: bool = True):
  """A stand-in for train.py that writes its pid and sleeps; on SIGTERM (if it `handles` it)
  it takes `save_seconds` to "save", writes the signal's name into `<workdir>/<marker>` and
  exits 0, as train.py does."""
  fake = tmp_path / "fake_train.py"
  fake.write_text(textwrap.dedent(f"""
      import os, signal, sys, time
      workdir = sys.argv[sys.argv.index("--workdir") + 1]
      os.makedirs(workdir, exist_ok=True)
      def stop(signum, frame):
        time.sleep({save_seconds})   # the save
        with open(os.path.join(workdir, {marker!r}), "w") as f:
          f.write(signal.Signals(signum).name)
        sys.exit(0)
      if {handles}:
        signal.signal(signal.SIGTERM, stop)
      with open(os.path.join(workdir, "pid"), "w") as f:
        f.write(str(os.getpid()))
      time.sleep(120)
  """))
  return fake


def test_killing_the_driver_stops_its_points(tmp_path):
  """kill -9 of sweep.py: its running point gets SIGTERM (it saves and stops, as for a
  scheduler's), not trains on, orphaned, holding its workdir's lock against the next run."""
  fake = _sleeping_point(tmp_path, marker="stopped")
  sweep_dir = tmp_path / "sweep"
  driver = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
      import sys; sys.path.insert(0, {REPO!r})
      from transformer_jax import sweeps
      sweeps.Runner({TINY!r}, {str(sweep_dir)!r}, {str(fake)!r}).run([0], log=print)
  """)])
  point = sweeps.point_dir(str(sweep_dir), sweeps.load_sweep(TINY).points[0])
  pid_file = os.path.join(point, "pid")
  try:
    deadline = time.time() + 60
    while not os.path.exists(pid_file) or not open(pid_file).read():
      assert time.time() < deadline and driver.poll() is None, "the point never started"
      time.sleep(0.1)
    driver.kill()
    driver.wait()
    deadline = time.time() + 20
    stopped = os.path.join(point, "stopped")
    # Until the signal's name is in it: the file exists from its open, before the write (a run
    # on 2026-11-26 read it empty).
    while not (os.path.exists(stopped) and open(stopped).read()):
      assert time.time() < deadline, "the point ran on after its driver was killed"
      time.sleep(0.1)
    with open(stopped) as f:
      assert f.read() == "SIGTERM"
  finally:
    if driver.poll() is None:
      driver.kill()
    if os.path.exists(pid_file) and not os.path.exists(os.path.join(point, "stopped")):
      os.kill(int(open(pid_file).read()), 9)  # this test's own orphan, on a failure


@pytest.mark.parametrize("handles", [True, False], ids=["saves", "still_starting"])
def test_a_signal_to_the_driver_waits_for_its_point_to_save(tmp_path, handles):
  """SIGTERM to sweep.py (a SLURM array task's process, which SLURM signals with the point's):
  the driver died at once, and SLURM then kills what is left of the task, cutting the point's
  save short. Now it passes SIGTERM on, waits for the point, starts no other and records both;
  a point killed by it before it could take it (still starting) is stopped, not failed."""
  fake = _sleeping_point(tmp_path, marker="saved", save_seconds=1.0, handles=handles)
  sweep_dir = tmp_path / "sweep"
  driver = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
      import sys; sys.path.insert(0, {REPO!r})
      from transformer_jax import sweeps
      print(sweeps.Runner({TINY!r}, {str(sweep_dir)!r}, {str(fake)!r}).run([0, 1], log=print))
  """)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  points = [sweeps.point_dir(str(sweep_dir), p) for p in sweeps.load_sweep(TINY).points[:2]]
  pid_file = os.path.join(points[0], "pid")
  try:
    deadline = time.time() + 60
    while not os.path.exists(pid_file) or not open(pid_file).read():
      assert time.time() < deadline and driver.poll() is None, "the point never started"
      time.sleep(0.1)
    driver.send_signal(signal.SIGTERM)
    if handles:
      time.sleep(0.5)
      assert driver.poll() is None   # still there while its point saves
    out = driver.communicate(timeout=30)[0]
  finally:
    if driver.poll() is None:
      driver.kill()
  assert driver.returncode == 0, out
  assert "SIGTERM: stopping the 1 running point(s)" in out, out
  if handles:
    assert open(os.path.join(points[0], "saved")).read() == "SIGTERM"
  assert not os.path.exists(os.path.join(points[0], sweeps.FAILED))
  assert not os.path.exists(points[1])   # never started
  recorded = json.load(open(os.path.join(sweep_dir, "status.json")))
  assert [r["status"] for r in recorded] == ["stopped", "not started (SIGTERM)"], recorded


def test_the_drivers_signal_handling_in_its_parts():
  """What a driver passes on (`_passed_on`): SIGTERM first, a second Ctrl-C as it is, SIGKILL
  at the third signal (a point stuck where Python's handlers never run kept the driver waiting
  for ever). A SIGINT ignored from the start (`sweep.py &`) stays ignored. A point's process
  before exec has the driver's handlers: `_stop_with` must not have its SIGTERM swallowed."""
  stop = sweeps.runner._Stop()
  passed = []
  for signum in (signal.SIGINT, signal.SIGINT, signal.SIGTERM):
    forwarded = stop.count
    stop._handle(signum, None)
    passed.append(sweeps.runner._passed_on(stop, forwarded))
  assert passed == [signal.SIGTERM, signal.SIGINT, signal.SIGKILL]
  stop = sweeps.runner._Stop()
  stop._handle(signal.SIGTERM, None)
  stop._handle(signal.SIGTERM, None)
  assert sweeps.runner._passed_on(stop, 1) == signal.SIGTERM   # a second TERM: TERM again
  before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
  try:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with sweeps.runner._Stop() as stop:
      assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
      assert signal.getsignal(signal.SIGTERM) == stop._handle
      # The driver "died" before the point's prctl (its parent is not the pid given): the
      # point sends itself SIGTERM, which must end it before it runs anything.
      proc = subprocess.Popen([sys.executable, "-c", "pass"],
                              preexec_fn=functools.partial(sweeps.runner._stop_with, -1))
      assert proc.wait(timeout=60) == -signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) == before[signal.SIGTERM]   # given back
    # Python's own SIGINT handler, not `before`'s: pytest started in the background (`&`, as
    # the mutation tool's runs) has SIGINT ignored, which the driver would rightly keep.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)   # an ignored TERM: INT is still taken
    with sweeps.runner._Stop() as stop:
      assert signal.getsignal(signal.SIGINT) == stop._handle
    assert signal.getsignal(signal.SIGINT) == signal.default_int_handler
  finally:
    for sig, handler in before.items():
      signal.signal(sig, handler)


def test_a_stopped_sweep_says_what_it_did_not_start_and_what_it_stopped(tmp_path):
  """A signal the driver gets as its last point ends (none left to pass it on to) is still
  said; a point that ends killed by the signal passed on is stopped, one that fails is failed."""
  runner = sweeps.Runner(TINY, str(tmp_path / "s"), str(tmp_path / "train.py"))
  stop, logs = sweeps.runner._Stop(), []
  stop._handle(signal.SIGTERM, None)
  runner._loop([1, 2], {}, [0], 1, 0, {}, stop, logs.append)
  assert logs == ["SIGTERM: starting none of the 2 point(s) left; run the sweep again to go on"]
  os.makedirs(sweeps.point_dir(runner.sweep_dir, runner.points[0]))
  outcomes = {code: runner._finish(0, code, 1.0, stopped=True)["status"]
              for code in (-signal.SIGTERM, -signal.SIGINT, 2, 1, -signal.SIGKILL)}
  assert outcomes == {-15: "stopped", -2: "stopped", 2: "failed", 1: "failed", -9: "failed"}


def test_exit_text_names_the_signal():
  assert sweeps.runner.exit_text(1) == "exit status 1"
  assert sweeps.runner.exit_text(0) == "exit status 0"
  assert sweeps.runner.exit_text(-9) == "killed by SIGKILL"
  assert sweeps.runner.exit_text(-1) == "killed by SIGHUP"   # every negative code is a signal
  assert sweeps.runner.exit_text(-200) == "killed by signal 200"


def test_a_point_whose_workdir_a_live_process_holds_is_running(tmp_path):
  import socket

  from transformer_jax.run import workdir as workdir_lib
  fake = tmp_path / "fake_train.py"
  fake.write_text(FAKE_TRAIN)
  sweep_dir = str(tmp_path / "sweep")
  runner = sweeps.Runner(TINY, sweep_dir, str(fake), {"num_train_steps": 3})
  runner.write_spec()
  d = sweeps.point_dir(sweep_dir, runner.points[0])
  os.makedirs(d)
  with open(os.path.join(d, "metrics.jsonl"), "w") as f:
    f.write('{"step": 1, "train_loss": 5.0}\n')
  lock = os.path.join(d, ".lock")
  # Its command name holds parentheses, which /proc/PID/stat shows unescaped.
  sleeper = subprocess.Popen([sys.executable, "-c", "import time; open('/proc/self/comm', 'w')"
                              ".write('a) b) c'); time.sleep(60)"])
  try:
    comm = f"/proc/{sleeper.pid}/comm"
    for _ in range(200):
      if open(comm).read().strip() == "a) b) c":
        break
      time.sleep(0.05)
    assert open(comm).read().strip() == "a) b) c"
    # Started after this process: a later start time (clock ticks after boot).
    started = workdir_lib.process_start(sleeper.pid)
    assert int(started) > int(workdir_lib.process_start(os.getpid()))
    # A holder whose pid went to another process since (it was killed with -9 long ago): not
    # running. Lock.acquire records its process's start time, which tells them apart.
    with open(lock, "w") as f:
      json.dump({"host": socket.gethostname(), "pid": sleeper.pid, "pid_start": "1"}, f)
    assert runner.status(0) == "partial"
    with open(lock, "w") as f:     # what Lock.acquire writes for its holder
      json.dump({"host": socket.gethostname(), "pid": sleeper.pid,
                 "pid_start": workdir_lib.process_start(sleeper.pid)}, f)
    assert runner.status(0) == "running"
    assert sweeps.report(sweep_dir, "train_loss")["rows"][0]["status"] == "running"
    # The sweep run again beside it skips it rather than fail on its lock.
    lines = []
    [result] = runner.run([0], log=lines.append)
    assert result["status"] == "skipped (running)" and not os.path.exists(
        os.path.join(d, "calls"))
    assert lines == [f"[0] {sweeps.point_name(runner.points[0])}: running (its workdir is in "
                     "use by a live process), skipped: run the sweep again once it has ended"]
  finally:
    sleeper.kill()
    sleeper.wait()
  assert runner.status(0) == "partial"               # its holder is gone (killed with -9)
  with open(lock, "w") as f:
    json.dump({"host": "elsewhere", "pid": os.getpid()}, f)
  assert runner.status(0) == "partial"               # another host's pid cannot be checked
  # This process's own lock, as a run writes it: running, its start time the one it records.
  lock_of_run = workdir_lib.Lock(d)
  assert lock_of_run.acquire() is None
  try:
    recorded = json.load(open(lock))["pid_start"]
    assert recorded is not None and recorded == workdir_lib.process_start(os.getpid())
    assert runner.status(0) == "running"
  finally:
    lock_of_run.release()
  assert workdir_lib.process_start(-1) is None       # no such process
