"""Throughput curves: one benchmark per point of a sweep, as a table, a plot and every point's JSON.

    points = sweeps.product(**{"data.batch_size": [8, 16, 32], "model.fused_qkv": [False, True]})
    run_curve(config, points, "train", TrainOptions(steps=10), "runs/bench_curve")

A point is a dict of dotted config overrides, as in training sweeps (`transformer_jax.sweeps`),
so a config's `sweep()` serves as well. The first field is the x axis of the plot; every
combination of the other fields is one line. Points run one after another in this process (each
compiles its own step), so compare them only within one curve: the machine's speed moves between
minutes. A curve whose points would not differ in what is measured is refused before any point
runs: the same point twice, points whose names collide, a field the mode does not read or that an
option (or a `--config.` flag, `fixed`) sets for every point (`check_points`).

Peak memory: on CPU each point's own (each run resets the process's peak RSS first,
`common.reset_peak_memory`); on an accelerator the allocator's peak cannot be reset, so the
column is named for what it is, the process's peak so far (`PEAK_SO_FAR`): a point after a
bigger one shows the bigger one's.
"""
from __future__ import annotations

import ast
import json
import os

from matplotlib.figure import Figure

from transformer_jax.bench import decode, train
from transformer_jax.files import save_figure
from transformer_jax.run.workdir import RunError
from transformer_jax.sweeps.report import write_rows
from transformer_jax.sweeps.spec import (
  Point,
  SweepError,
  clashes,
  point_name,
  product,
  validated_configs,
)

# The figures a curve shows, per mode: (key in the result, column name).
FIGURES = {
    # The peak is measured at each point and moves with the machine: MFU is against it.
    "train": (("target_tokens_per_s", "target tokens/s"), ("mfu", "MFU"),
              ("peak_flops_per_s", "peak FLOP/s"), ("step_time_s", "step time (s)"),
              ("back_to_back_target_tokens_per_s", "back to back target tokens/s"),
              ("peak_memory_bytes", "peak memory (bytes)")),
    "decode": (("sentences_per_s", "sentences/s"), ("target_tokens_per_s", "target tokens/s")),
}


# The peak memory column where it is not each point's own (an accelerator's: no reset).
PEAK_SO_FAR = "process peak memory so far (bytes)"


def _count(v):
  return f"{v:,.0f}"


# curve.md shows each figure in the units the docs use; curve.csv keeps the raw numbers.
MD_CELLS = {
    "target tokens/s": ("target tokens/s", _count),
    "back to back target tokens/s": ("back to back target tokens/s", _count),
    "MFU": ("MFU", lambda v: f"{100 * v:.1f}%"),
    "peak FLOP/s": ("peak TFLOP/s", lambda v: f"{v / 1e12:.3f}"),
    "step time (s)": ("step", lambda v: f"{v * 1e3:,.0f} ms"),
    "peak memory (bytes)": ("peak memory", lambda v: f"{v / 1e9:.2f} GB"),
    PEAK_SO_FAR: ("process peak memory so far", lambda v: f"{v / 1e9:.2f} GB"),
}

# The config fields a decode point reads (prefixes end in "."): another field would change
# nothing measured.
DECODE_FIELDS = ("model.", "seed", "data.vocab_size", "data.max_source_len",
                 "data.max_target_len", "data.batch_size", "data.batch_tokens")
# The data fields synthetic train batches read: their shape, their vocabulary.
SYNTHETIC_DATA_FIELDS = ("data.vocab_size", "data.max_source_len", "data.max_target_len",
                         "data.batch_size", "data.batch_tokens")
ROW_FIELDS = ("data.batch_size", "data.batch_tokens")


def _md_cells(columns: list[str]) -> dict:
  """MD_CELLS, and decode's per-search columns ("greedy: sentences/s", ...)."""
  cells = {c: MD_CELLS[c] for c in columns if c in MD_CELLS}
  for c in columns:
    if c.endswith(": sentences/s"):
      cells[c] = (c, lambda v: f"{v:,.1f}")
    elif c.endswith(": target tokens/s"):
      cells[c] = (c, _count)
  return cells


def _figures(what: str, result: dict) -> dict:
  figures = result["figures"]
  if what == "train":
    out = {name: figures[key] for key, name in FIGURES["train"]}
    if not figures.get("peak_memory_of_run", False):
      out[PEAK_SO_FAR] = out.pop("peak memory (bytes)")
    return out
  out = {}
  for search, values in figures.items():  # "greedy", "beam 4": one column each
    if isinstance(values, dict):
      out.update({f"{search}: {name}": values[key] for key, name in FIGURES["decode"]})
  return out


def _matches(field: str, names) -> bool:
  return any(field == n or (n.endswith(".") and field.startswith(n)) for n in names)


def unused_reason(field: str, what: str, options) -> str | None:
  """Why swept `field` would change nothing that `what` measures with `options` (None: it
  does), as the end of an error message."""
  if what == "decode":
    if options.rows and field in ROW_FIELDS:
      return (f"--decode_rows {options.rows} sets every point's rows: drop --decode_rows to "
              f"sweep {field}")
    if options.decode_len and field == "data.max_target_len":
      return (f"--decode_len {options.decode_len} sets every point's output length: drop "
              "--decode_len to sweep data.max_target_len")
    if options.workdir and _matches(field, ("model.", "seed", "data.vocab_size")):
      return (f"--workdir's trained run gives every point its model and vocabulary: drop "
              f"--workdir to sweep {field} on random parameters")
    if not _matches(field, DECODE_FIELDS):
      read = ", ".join(f + "*" if f.endswith(".") else f for f in DECODE_FIELDS)
      return f"--what decode reads only {read}"
  elif options.batches == "synthetic" and field.startswith("data.") and (
      field not in SYNTHETIC_DATA_FIELDS):
    return ("synthetic batches are unpacked rows of random tokens, the same whatever it says: "
            "add --batches real to step the dataset's own batches")
  return None


def check_points(points: list[Point], what: str, options, fixed=()) -> None:
  """A SweepError, before anything runs, for a curve that would not measure what it names: the
  same point twice or two whose names (and so files) collide, as `sweeps.load_sweep` refuses
  them; a field `unused_reason` finds unused; or one in `fixed` (`--config.` flags, which the
  points would override without a word)."""
  twice, colliding = clashes(points)
  if twice:
    raise SweepError(f"the curve has the point {twice[0]} twice: give each value once")
  for name, same in colliding.items():
    raise SweepError(f"curve points {same} differ only beyond the 6 significant digits of "
                     f"their names and would share the file points/{name}.json: round the "
                     "values so that they differ within 6 digits, or leave one out")
  for field in dict.fromkeys(k for p in points for k in p):
    if field in fixed:
      raise SweepError(f"--config.{field} sets a field the curve varies: each point would "
                       f"replace it; drop the flag, or change the sweep")
    reason = unused_reason(field, what, options)
    if reason:
      raise SweepError(f"the curve sweeps {field}, which would change nothing measured: "
                       f"{reason}")


def run_curve(config, points: list[Point], what: str, options, out_dir: str,
              log=print, fixed=()) -> dict:
  """Benchmark every point; writes `<out_dir>/points/<name>.json`, `curve.csv`, `curve.md` and
  `curve.png`; returns {"rows", "fields", "files"}. `fixed`: the config fields set on the
  command line, which no point may sweep (`check_points`)."""
  if what not in FIGURES:
    raise ValueError(f"a throughput curve measures {tuple(FIGURES)}, not {what!r}")
  if not points:
    raise ValueError("a curve needs at least one point")
  fields = list(dict.fromkeys(k for p in points for k in p))
  # A bad last point fails now, not after the others ran (a misspelt field first).
  configs = validated_configs(config, points, label="curve point", first=1)
  check_points(points, what, options, fixed)
  if what == "decode":
    for c in configs:  # a learned position table too short for a point's output length
      decode.check_point(c, options)
  os.makedirs(os.path.join(out_dir, "points"), exist_ok=True)
  rows = []
  for i, (point, c) in enumerate(zip(points, configs)):
    log(f"curve point {i + 1}/{len(points)}: {point_name(point)}")
    result = train.run(c, options) if what == "train" else decode.run(c, options)
    with open(os.path.join(out_dir, "points", point_name(point) + ".json"), "w") as f:
      json.dump({"point": point, **result}, f, indent=1, default=str)
    rows.append({**{k: point.get(k) for k in fields}, **_figures(what, result)})
  columns = list(dict.fromkeys(k for r in rows for k in r))
  files = write_rows(rows, columns, columns, os.path.join(out_dir, "curve"), _md_cells(columns))
  files.append(_plot(rows, fields, what, os.path.join(out_dir, "curve.png")))
  return {"rows": rows, "fields": fields, "files": files}


def _plot(rows: list[dict], fields: list[str], what: str, path: str) -> str:
  """`_figure` as a PNG at 90 dpi (5.5 x 4 inches a panel)."""
  save_figure(_figure(rows, fields, what), path, dpi=90)
  return path


def _figure(rows: list[dict], fields: list[str], what: str) -> Figure:
  """Target tokens/s and MFU (train), or each search's sentences/s (decode), against the first
  field; one line per combination of the others, named in a legend."""
  x_field, others = fields[0], fields[1:]
  panels = ([k for k in rows[0] if k.endswith("sentences/s")] if what == "decode"
            else ["target tokens/s", "MFU"])
  fig = Figure(figsize=(5.5 * len(panels), 4))
  axes = fig.subplots(1, len(panels), squeeze=False).ravel()  # one row of panels
  groups: dict[tuple, list[dict]] = {}
  for r in rows:
    groups.setdefault(tuple(r[f] for f in others), []).append(r)
  for ax, panel in zip(axes, panels):
    for key, group in groups.items():
      label = ", ".join(f"{f}={v}" for f, v in zip(others, key)) or None
      xs = [r[x_field] for r in group]
      numeric = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs)
      positions = xs if numeric else [str(x) for x in xs]
      ax.plot(positions, [r[panel] for r in group], "o-", label=label)
    ax.set_xlabel(x_field)
    ax.set_ylabel(panel)
    ax.grid(alpha=0.3)
    if others:
      ax.legend(fontsize=8)
  fig.tight_layout()
  return fig


def points_from_flags(specs: list[str]) -> list[Point]:
  """`["data.batch_size=8,16", "model.fused_qkv=False,True"]` -> their product (values parsed
  as Python literals where they parse)."""
  fields = {}
  for spec in specs:
    name, sep, values = spec.partition("=")
    if "" in values.split(","):  # no `=` (so no values), no values, or an empty one
      raise RunError(f"--sweep {spec!r}: expected FIELD=V1,V2,... e.g. data.batch_size=8,16")
    if name in fields:
      raise RunError(f"--sweep {spec!r}: {name} is swept twice; give its values once")
    parsed = []
    for text in values.split(","):
      try:
        parsed.append(ast.literal_eval(text))
      except (ValueError, SyntaxError):
        parsed.append(text)
    fields[name] = parsed
  return product(**fields)
