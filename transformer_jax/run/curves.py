"""Learning curves of one or more runs, from their `metrics.jsonl`: what `scripts/plot_metrics.py`
draws.

    series = load_series("runs/default")        # {"train_loss": ([steps], [hours], [values]), ...}
    plot_runs({"default": series}, "curves.png")

Each curve keeps one point per step (the last record of that step wins, so a file written by a
crashed session and its resume never shows a step twice), in step order; a run still in
progress simply has fewer points. Wall time is hours since the run's first record, so the time
a resumed run was not running shows as a gap.
"""
from __future__ import annotations

import os

from matplotlib.figure import Figure

from transformer_jax.files import save_figure
from transformer_jax.run.metrics import read_metrics
from transformer_jax.run.workdir import RunError

# Panels: (title, [(metric, curve label)]); each is drawn against step and against wall time.
PANELS = (("loss", [("train_loss", "train"), ("eval_loss", "validation")]),
          ("validation BLEU", [("bleu", "BLEU")]),
          ("learning rate", [("learning_rate", "learning rate")]))
METRICS = tuple(m for _, curves in PANELS for m, _ in curves)

Series = dict[str, tuple[list[int], list[float], list[float]]]


def load_series(workdir: str) -> Series:
  """{metric: (steps, hours since the first record, values)} for every metric in `METRICS`."""
  records = read_metrics(workdir)
  if not records:
    return {}
  # A record with no number for its time (one not written by training) is drawn against its
  # step only: the wall-time panels have no place for it.
  times = [r["time"] for r in records if _number(r.get("time"))]
  start = min(times, default=0.0)
  points: dict[str, dict[int, tuple[float, float]]] = {m: {} for m in METRICS}
  for r in records:
    hours = (r["time"] - start) / 3600 if _number(r.get("time")) else float("nan")
    for metric in METRICS:
      value = r.get(metric)
      if _number(value):
        points[metric][r["step"]] = (hours, float(value))
  out = {}
  for metric, by_step in points.items():
    if by_step:
      steps = sorted(by_step)
      out[metric] = (steps, [by_step[s][0] for s in steps], [by_step[s][1] for s in steps])
  return out


def _number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def default_labels(workdirs: list[str]) -> list[str]:
  """Each workdir's name, with as many parent directories as it takes to tell apart runs whose
  names are alike (`runs/a/seed0`, `runs/b/seed0` -> `a/seed0`, `b/seed0`): runs sharing a
  label would be drawn as one. A workdir given twice keeps its whole path, twice."""
  parts = [os.path.abspath(w).split(os.sep) for w in workdirs]
  depth = [1] * len(parts)
  while True:
    labels = ["/".join(p[-d:]) for p, d in zip(parts, depth)]
    grow = [i for i, label in enumerate(labels)
            if labels.count(label) > 1 and depth[i] < len(parts[i])]
    if not grow:
      return labels
    for i in grow:
      depth[i] += 1


def output_path(out: str, inputs: list[str]) -> str:
  """The file `plot_runs` is to write for `--out out`, checked before anything is drawn:
  `.png` added where it has no extension (matplotlib would add it unasked, and the path
  printed would not be the file written); a RunError for a directory, one of the files the
  plot reads (`inputs`), or a format matplotlib cannot write (its traceback came after the
  drawing)."""
  path = out if os.path.splitext(out)[1] else out + ".png"
  if out.endswith(os.sep) or os.path.isdir(out) or os.path.isdir(path):
    raise RunError(f"--out {out} names a directory: give the image's file name, e.g. --out "
                   f"{os.path.join(out, 'curves.png')}")
  if os.path.realpath(path) in {os.path.realpath(p) for p in inputs}:
    raise RunError(f"--out {out} is {os.path.basename(path)} of a --workdir it plots, which it "
                   f"would overwrite: give the image's own file name, e.g. --out "
                   f"{os.path.join(os.path.dirname(path), 'curves.png')}")
  extension = os.path.splitext(path)[1][1:].lower()
  formats = sorted(Figure().canvas.get_supported_filetypes())
  if extension not in formats:
    raise RunError(f"--out {out}: .{extension} is no image format matplotlib writes: end the "
                   f"name with one of {', '.join('.' + f for f in formats)} (.png by default)")
  return path


def plot_runs(runs: dict[str, Series], path: str, title: str = "") -> dict:
  """A PNG of 2 x 3 panels (loss, BLEU, learning rate; against step and against wall time),
  every run overlaid; returns what was drawn: {panel: {run: {metric: points}}}."""
  fig = Figure(figsize=(15, 8))
  axes = fig.subplots(2, len(PANELS))
  drawn: dict = {}
  for column, (panel, curves) in enumerate(PANELS):
    drawn[panel] = {}
    for row, (axis, xlabel) in enumerate(((0, "step"), (1, "wall time (hours)"))):
      ax = axes[row][column]
      for run_index, (name, series) in enumerate(runs.items()):
        color = f"C{run_index % 10}"
        for curve_index, (metric, label) in enumerate(curves):
          if metric not in series:
            continue
          steps, hours, values = series[metric]
          xs = steps if axis == 0 else hours
          style = ("-", "--", ":")[curve_index % 3]
          marker = "o" if len(values) < 30 else None
          curve_label = f"{name}: {label}" if len(curves) > 1 else name
          ax.plot(xs, values, style, color=color, marker=marker, markersize=3,
                  label=curve_label)
          drawn[panel].setdefault(name, {})[metric] = len(values)
      ax.set_xlabel(xlabel)
      ax.set_title(panel)
      ax.grid(alpha=0.3)
      if panel in ("loss", "learning rate") and any(
          m in s for s in runs.values() for m, _ in curves):
        ax.set_yscale("log")
      if ax.lines:
        ax.legend(fontsize=7)
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  save_figure(fig, path, dpi=90)
  return drawn
