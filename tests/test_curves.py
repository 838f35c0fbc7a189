"""Learning curves (scripts/plot_metrics.py): one point per step, every curve drawn, a real PNG."""
import json
import os
import shutil
import subprocess
import sys

from matplotlib import image
import numpy as np

from transformer_jax import experiment
from transformer_jax.run import curves, metrics
from transformer_jax.run import workdir as workdir_lib

from scripts_under_test import SCRIPTS, load_script
import tiny_config

plot_metrics = load_script("plot_metrics")
replay_script = load_script("replay_early_stopping")
compare_script = load_script("compare_runs")


def write_metrics(workdir, records):
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in records)


def run_records(steps=10, start=1000.0, resumed_at=None, bleu=True):
  """Train records every step, evaluation at 5 and 10; with `resumed_at`, the records of the
  steps after it appear twice (a crashed session's, then the resumed one's, an hour later)."""
  out = []
  def train(step, t, loss):
    out.append({"step": step, "time": t, "train_loss": loss, "learning_rate": 1e-3 * step})
  for step in range(1, steps + 1):
    train(step, start + 10 * step, 5.0 / step)
    if step % 5 == 0:
      out.append({"step": step, "time": start + 10 * step + 1, "eval_loss": 4.0 / step,
                  **({"bleu": 3.0 * step} if bleu else {})})
  if resumed_at is not None:
    for step in range(resumed_at + 1, steps + 1):
      train(step, start + 3600 + 10 * step, 4.0 / step)
  return out


def test_one_point_per_step_and_the_last_record_wins(tmp_path):
  write_metrics(tmp_path / "r", run_records(resumed_at=6))
  series = curves.load_series(str(tmp_path / "r"))
  steps, hours, values = series["train_loss"]
  assert steps == list(range(1, 11))                      # no step twice
  assert values[6] == 4.0 / 7                             # the resumed session's value
  assert hours[-1] > 1.0 and hours[0] == 0.0              # the downtime shows in wall time
  assert series["eval_loss"][0] == [5, 10] and series["bleu"][2] == [15.0, 30.0]
  assert curves.load_series(str(tmp_path / "missing")) == {}


def test_plot_draws_every_curve_of_every_run_into_a_real_png(tmp_path):
  write_metrics(tmp_path / "a", run_records())
  write_metrics(tmp_path / "b", run_records(steps=7, bleu=False))   # in progress, no BLEU yet
  out = tmp_path / "curves.png"
  rc = plot_metrics.main(["--workdir", str(tmp_path / "a"), "--workdir", str(tmp_path / "b"),
                          "--label", "pre", "--label", "post", "--out", str(out)])
  assert rc == 0
  with open(out, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  pixels = image.imread(str(out))
  assert pixels.shape[0] > 500 and np.std(pixels[..., :3]) > 0.05   # not a blank canvas
  drawn = curves.plot_runs({"pre": curves.load_series(str(tmp_path / "a")),
                            "post": curves.load_series(str(tmp_path / "b"))},
                           str(tmp_path / "again.png"))
  assert drawn == {"loss": {"pre": {"train_loss": 10, "eval_loss": 2},
                            "post": {"train_loss": 7, "eval_loss": 1}},
                   "validation BLEU": {"pre": {"bleu": 2}},
                   "learning rate": {"pre": {"learning_rate": 10},
                                     "post": {"learning_rate": 7}}}


def test_what_each_panel_draws_found_by_mutation_testing(tmp_path, monkeypatch):
  # Hours since the first record, exactly.
  write_metrics(tmp_path / "r", [{"step": 1, "time": 1000.0, "train_loss": 2.0},
                                 {"step": 2, "time": 8200.0, "train_loss": 1.0}])
  assert curves.load_series(str(tmp_path / "r"))["train_loss"][1] == [0.0, 2.0]
  # A workdir given twice keeps its whole path (and the search for a longer name ends).
  assert curves.default_labels(["/a/run", "/a/run"]) == ["/a/run", "/a/run"]
  figures = []

  class Recorded(curves.Figure):
    def __init__(self, *args, **kwargs):
      super().__init__(*args, **kwargs)
      figures.append(self)

  monkeypatch.setattr(curves, "Figure", Recorded)
  # Eleven runs (colours cycle past ten), the first of 29 points, the others of 30; the last
  # lacks train_loss (its eval_loss still drawn) and every run lacks BLEU.
  def series(n, train=True):
    out = {"eval_loss": (list(range(n)), [h / 10 for h in range(n)], [1.0] * n),
           "learning_rate": (list(range(n)), [h / 10 for h in range(n)], [0.1] * n)}
    if train:
      out["train_loss"] = (list(range(n)), [h / 10 for h in range(n)], [2.0] * n)
    return out

  runs = {f"r{i}": series(29 if i == 0 else 30, train=i < 10) for i in range(11)}
  curves.plot_runs(runs, str(tmp_path / "p.png"), title="eleven runs")
  fig, = figures
  assert fig._suptitle.get_text() == "eleven runs" and len(fig.axes) == 6
  loss_step, bleu_step, rate_step, loss_time, bleu_time, rate_time = fig.axes
  for ax, xlabel in ((loss_step, "step"), (loss_time, "wall time (hours)")):
    assert ax.get_xlabel() == xlabel and ax.get_yscale() == "log"
    lines = {line.get_label(): line for line in ax.lines}
    assert len(lines) == 21 and lines["r10: validation"]
    train, validation = lines["r0: train"], lines["r0: validation"]
    assert (train.get_linestyle(), validation.get_linestyle()) == ("-", "--")
    assert train.get_marker() == "o" and lines["r1: train"].get_marker() in (None, "None")
    assert lines["r10: validation"].get_color() == "C0" and train.get_color() == "C0"
    hours = [h / 10 for h in range(29)]
    assert list(train.get_xdata()) == (list(range(29)) if xlabel == "step" else hours)
    assert ax.get_legend() is not None
  assert rate_step.get_yscale() == "log" and [line.get_label() for line in rate_step.lines][:2] == [
      "r0", "r1"]
  for ax in (bleu_step, bleu_time):  # no run has BLEU: an empty panel, linear, without legend
    assert not ax.lines and ax.get_yscale() == "linear" and ax.get_legend() is None
  figures.clear()
  curves.plot_runs({"r": series(3)}, str(tmp_path / "q.png"))
  assert figures[0]._suptitle is None
  # BLEU is drawn on a linear scale; a log scale only for loss and learning rate with points.
  figures.clear()
  curves.plot_runs({"r": {"bleu": ([1, 2], [0.0, 1.0], [10.0, 20.0])}}, str(tmp_path / "b.png"))
  assert [ax.get_yscale() for ax in figures[0].axes] == ["linear"] * 6


def _run_with_odd_lines(workdir):
  """A 10-step run (a training config, keep_best bleu) whose metrics.jsonl also holds lines
  training never writes: other bytes, JSON that is no object, steps that are no integer (True
  is 1 to Python), no step, a cut line; and a time that is no number."""
  c = tiny_config.get_config()
  c.update(num_train_steps=10, keep_best="bleu")
  os.makedirs(workdir)
  workdir_lib.write_config(workdir, c, experiment.transformer_config(c, vocab_size=32))
  good = run_records() + [{"step": 10, "time": "late", "train_loss": 0.4}]
  odd = [b'{"step": 11, "bleu": 1.0, "note": "\xff"}', b"\x00\x00\x00", b"", b"[1, 2]", b'"x"',
         b'{"step": "x", "bleu": 1.0}', b'{"step": null, "bleu": 1.0}',
         b'{"step": true, "bleu": 1.0}', b'{"step": 12.0, "bleu": 1.0}', b'{"bleu": 1.0}']
  with open(os.path.join(workdir, "metrics.jsonl"), "wb") as f:
    f.writelines(json.dumps(r).encode() + b"\n" for r in good)
    f.writelines(line + b"\n" for line in odd)
    f.write(b'{"step": 14')  # cut short by a crash
  return good


def test_lines_training_never_writes_are_skipped_by_every_reader(tmp_path, capsys):
  """Each gave a traceback in plot_metrics, replay_early_stopping and compare_runs."""
  run = str(tmp_path / "run")
  good = _run_with_odd_lines(run)
  assert metrics.read_metrics(run) == good
  series = curves.load_series(run)
  steps, hours, values = series["train_loss"]
  assert steps == list(range(1, 11)) and values[-1] == 0.4  # the last record of step 10 wins
  assert hours[0] == 0.0 and np.isnan(hours[-1])  # no time to draw it at: by its step alone
  assert series["bleu"][0] == [5, 10]
  out = str(tmp_path / "c.png")
  assert plot_metrics.main(["--workdir", run, "--out", out]) == 0, capsys.readouterr().err
  assert json.loads(capsys.readouterr().out)["curves"]["loss"]["run"]["train_loss"] == 10
  assert replay_script.main(["--patience", "1", run]) == 0, capsys.readouterr().err
  assert json.loads(capsys.readouterr().out.splitlines()[-1])["trained_to"] == 10
  assert compare_script.main([run]) == 0, capsys.readouterr().err
  assert "| 10 |" in capsys.readouterr().out


def test_plot_metrics_errors_are_one_line(tmp_path, capsys):
  # A missing workdir, one without metrics, a sweep, a directory of runs: each its own advice.
  assert plot_metrics.main(["--workdir", str(tmp_path / "none")]) == 1
  assert capsys.readouterr().err == (f"error: --workdir {tmp_path}/none does not exist: pass the "
                                     "directory of a training run\n")
  (tmp_path / "empty").mkdir()
  assert plot_metrics.main(["--workdir", str(tmp_path / "empty")]) == 1
  assert "empty/metrics.jsonl holds no metrics: is " in capsys.readouterr().err
  (tmp_path / "sweep" / "lr=1").mkdir(parents=True)
  (tmp_path / "sweep" / "sweep.json").write_text("{}")
  assert plot_metrics.main(["--workdir", str(tmp_path / "sweep")]) == 1
  assert "sweep is a sweep (it holds sweep.json), not one run" in capsys.readouterr().err
  write_metrics(tmp_path / "a", run_records())
  (tmp_path / "a" / "config.json").write_text("{}")
  assert plot_metrics.main(["--workdir", str(tmp_path)]) == 1
  assert capsys.readouterr().err == (f"error: {tmp_path} holds runs ({tmp_path}/a), not one: give "
                                     "each run to plot as a --workdir of its own\n")
  for name in "bcde":  # the first three named, and how many more
    (tmp_path / name).mkdir()
    (tmp_path / name / "config.json").write_text("{}")
  assert plot_metrics.main(["--workdir", str(tmp_path)]) == 1
  assert f"{tmp_path}/c and 2 more), not one: give each run" in capsys.readouterr().err
  for name in "bcde":
    shutil.rmtree(tmp_path / name)
  assert plot_metrics.main(["--workdir", str(tmp_path / "a"), "--label", "x",
                            "--label", "y"]) == 1
  assert "2 --label for 1 --workdir" in capsys.readouterr().err
  assert plot_metrics.main(["--workdir", str(tmp_path / "a")]) == 0
  assert os.path.getsize(tmp_path / "a" / "curves.png") > 10_000


def test_plot_metrics_writes_the_file_it_names_or_refuses_up_front(tmp_path, capsys):
  """--out x.txt or a run's metrics.jsonl: matplotlib's traceback after the drawing; --out
  curves or a folder: "curves" (the folder) printed, curves.png (folder.png) written."""
  run = tmp_path / "run"
  write_metrics(run, run_records())
  metrics_file = str(run / "metrics.jsonl")
  before = open(metrics_file).read()
  (tmp_path / "folder").mkdir()
  for out, error in [
      (str(tmp_path / "x.txt"), f"error: --out {tmp_path}/x.txt: .txt is no image format "
                                "matplotlib writes: end the name with one of "),
      (metrics_file, f"error: --out {metrics_file} is metrics.jsonl of a --workdir it plots, "
                     f"which it would overwrite: give the image's own file name, e.g. --out "
                     f"{run}/curves.png\n"),
      (str(tmp_path / "folder"), f"error: --out {tmp_path}/folder names a directory: give the "
                                 f"image's file name, e.g. --out {tmp_path}/folder/curves.png\n"),
      (f"{tmp_path}/new/", f"error: --out {tmp_path}/new/ names a directory")]:
    assert plot_metrics.main(["--workdir", str(run), "--out", out]) == 1, out
    out_, err = capsys.readouterr()
    assert err.startswith(error) and out_ == "", err
    assert ".txt" not in out or (".pdf, " in err and ".png, " in err and ".svg, " in err), err
  assert open(metrics_file).read() == before
  assert sorted(os.listdir(tmp_path)) == ["folder", "run"] and not os.listdir(tmp_path / "folder")
  # No extension: .png, and the file written is the one printed; another format by its own.
  for out, written in [(tmp_path / "mycurves", tmp_path / "mycurves.png"),
                       (tmp_path / "c.PDF", tmp_path / "c.PDF"),
                       (tmp_path / "folder" / "c.svg", tmp_path / "folder" / "c.svg")]:
    assert plot_metrics.main(["--workdir", str(run), "--out", str(out)]) == 0
    assert json.loads(capsys.readouterr().out)["out"] == str(written)
    assert os.path.getsize(written) > 1000
  assert open(tmp_path / "c.PDF", "rb").read(4) == b"%PDF"


def test_runs_with_the_same_name_are_told_apart_or_refused(tmp_path, capsys):
  """Two workdirs named alike get their parents in the labels (one label would draw one curve);
  two alike labels given with --label are refused."""
  for parent in ("a", "b"):
    write_metrics(tmp_path / parent / "run", run_records())
  both = ["--workdir", str(tmp_path / "a" / "run"), "--workdir", str(tmp_path / "b" / "run")]
  assert plot_metrics.main([*both, "--out", str(tmp_path / "c.png")]) == 0
  drawn = json.loads(capsys.readouterr().out)["curves"]
  assert list(drawn["loss"]) == ["a/run", "b/run"]
  assert plot_metrics.main([*both, "--label", "x", "--label", "x"]) == 1
  assert "two runs are labelled 'x'" in capsys.readouterr().err
  assert plot_metrics.main([*both[:2], *both[:2]]) == 1                  # one workdir twice
  assert "give each --workdir its own --label" in capsys.readouterr().err
  # Only the names alike grow, and only as far as it takes.
  assert curves.default_labels(["x/a/run", "y/a/run", "runs/other", "z/b/run"]) == [
      "x/a/run", "y/a/run", "other", "b/run"]


def test_the_progress_bar_shows_the_numbers_of_the_step_it_shows(capsys):
  """At 20/60 the bar shows step 20's loss and learning rate, not the previous log's."""
  progress = metrics.Progress(total=60, initial=0)
  # Redraw at every update, as log intervals of seconds do.
  progress.bar.mininterval, progress.bar.miniters, progress.bar.dynamic_miniters = 0, 0, False
  for step in (10, 20, 30):
    progress.update(step, {"train_loss": step / 10, "learning_rate": step * 1e-4,
                           "tokens_per_sec": 1000.0, "mfu": 0.5})
  progress.close()
  drawn = [line for line in capsys.readouterr().err.split("\r") if "/60" in line]
  for step in (10, 20, 30):
    lines = [line for line in drawn if f" {step}/60 " in line]
    assert lines and all(f"loss {step / 10:.3f} lr {step * 1e-4:.2e} tok/s 1,000 MFU 50.0%"
                         in line for line in lines), lines
  assert progress.bar.disable  # closed
  # Processes other than the first show neither a bar nor the lines every process would print.
  quiet = metrics.Progress(total=60, initial=0, enabled=False)
  quiet.update(10, {"train_loss": 1.0})
  quiet.write("saved step 10")
  quiet.close()
  assert capsys.readouterr().err == ""
  progress = metrics.Progress(total=60, initial=0)
  progress.write("saved step 20")
  progress.close()
  assert "saved step 20\n" in capsys.readouterr().err


def test_help_into_a_closed_pipe_ends_without_a_traceback():
  """`plot_metrics.py --help | head`: the reader is gone before the help is written."""
  proc = subprocess.Popen([sys.executable, os.path.join(SCRIPTS, "plot_metrics.py"), "--help"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  proc.stdout.close()
  err = proc.stderr.read().decode()
  assert proc.wait(timeout=120) == 1 and "Traceback" not in err and "Error" not in err, err
