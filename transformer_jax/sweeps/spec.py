"""The points of a sweep: building them, naming their workdirs, and reading a config file's
`sweep()` next to its `get_config()`.

This is the part config files use; the runner, the SLURM writer and the report import it, never
the other way round.
"""
from __future__ import annotations

import dataclasses
import difflib
import hashlib
import importlib.util
import inspect
import itertools
import json
import os
import re
from typing import Any, Iterable, Mapping, Sequence

import ml_collections

from transformer_jax import experiment

Point = dict[str, Any]


class SweepError(ValueError):
  """A sweep the user can fix: no sweep(), a misspelt field, the same point twice."""


# ---------------------------------------------------------------- building points


def _value_lists(helper: str, fields: Mapping[str, Any]) -> dict[str, list]:
  """Each field's values as a list; refuses a single value given where a list belongs.

  A string is iterable, so `activation="gelu"` would otherwise sweep "g", "e", "l", "u"; a dict
  would sweep its keys."""
  out = {}
  for name, values in fields.items():
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable):
      raise SweepError(f"sweeps.{helper}: {name}={values!r} is one value, not a list of values: "
                       f"pass a list, e.g. {name}=[{values!r}]")
    out[name] = list(values)
  return out


def product(**fields: Sequence[Any]) -> list[Point]:
  """Every combination: `product(lr=[1, 2], warmup=[10, 20])` gives 4 points, the last field
  varying fastest."""
  fields = _value_lists("product", fields)
  names = list(fields)
  return [dict(zip(names, values)) for values in itertools.product(*fields.values())]


def zipped(**fields: Sequence[Any]) -> list[Point]:
  """Values taken together: `zipped(d_model=[256, 512], num_heads=[4, 8])` gives 2 points."""
  fields = _value_lists("zipped", fields)
  lengths = {name: len(values) for name, values in fields.items()}
  if len(set(lengths.values())) > 1:
    raise SweepError(f"sweeps.zipped: the fields have different lengths {lengths}")
  names = list(fields)
  return [dict(zip(names, values)) for values in zip(*fields.values())]


def cross(*groups: Iterable[Point]) -> list[Point]:
  """The product of lists of points: `cross(zipped(...), product(...))` merges every pair."""
  out = []
  for combo in itertools.product(*groups):
    point: Point = {}
    for part in combo:
      overlap = set(point) & set(part)
      if overlap:
        raise SweepError(f"sweeps.cross: field(s) {sorted(overlap)} set by two groups")
      point.update(part)
    out.append(point)
  return out


def point_key(point: Mapping[str, Any]) -> str:
  """What makes two points the same point: their fields and exact values, an int the same as
  the float it equals (learning_rate 1 is 1.0, as `point_name` has them); tuples as lists."""
  def canonical(v):
    if isinstance(v, int) and not isinstance(v, bool):
      return float(v)
    if isinstance(v, (list, tuple)):
      return [canonical(x) for x in v]
    if isinstance(v, Mapping):
      return {k: canonical(x) for k, x in v.items()}
    return v
  return json.dumps({k: canonical(v) for k, v in point.items()}, sort_keys=True, default=str)


def chain(*groups: Iterable[Point]) -> list[Point]:
  """Points of several sweeps one after another (duplicates removed, first kept: 1 and 1.0 are
  one value)."""
  out, seen = [], set()
  for group in groups:
    for point in group:
      key = point_key(point)
      if key not in seen:
        seen.add(key)
        out.append(dict(point))
  return out


# ---------------------------------------------------------------- names


def _format(value) -> str:
  if isinstance(value, float):
    return f"{value:g}"
  return str(value)


def point_name(point: Point) -> str:
  """A readable directory name: `learning_rate=0.5,warmup_steps=10` (fields sorted).

  Characters outside `[A-Za-z0-9._=,+-]` become `_`; names over 120 characters are cut and get
  a hash of the full point, so distinct points never share a workdir.
  """
  if not point:
    return "default"
  text = ",".join(f"{k}={_format(point[k])}" for k in sorted(point))
  name = re.sub(r"[^A-Za-z0-9._=,+-]", "_", text)
  if len(name) > 120 or name != text:
    digest = hashlib.sha1(json.dumps(point, sort_keys=True, default=str).encode()).hexdigest()
    name = name[:110] + "-" + digest[:8] if len(name) > 120 else name + "-" + digest[:8]
  return name


def point_dir(sweep_dir: str, point: Point) -> str:
  return os.path.join(sweep_dir, point_name(point))


# ---------------------------------------------------------------- overrides


def _field_parent(config, key: str, point: Mapping[str, Any]):
  """The ConfigDict holding dotted `key`'s last part, and that part.

  A SweepError names the first part that is not there (`modle` of `modle.d_model`), where
  indexing would raise a KeyError traceback, or a TypeError below a leaf."""
  parts = key.split(".")
  target = config
  for depth, name in enumerate(parts):
    fields = list(target.keys()) if hasattr(target, "keys") else []
    if name not in fields:
      missing = ".".join(parts[:depth + 1])
      close = difflib.get_close_matches(name, fields, n=1)
      raise SweepError(f"sweep point {dict(point)}: config has no field {missing!r}"
                       + (f" (in {key!r})" if missing != key else "")
                       + (f"; did you mean {close[0]!r}?" if close else ""))
    if depth < len(parts) - 1:
      target = target[name]
  return target, parts[-1]


def apply_overrides(config, point: Mapping[str, Any]):
  """A copy of the ConfigDict with `point`'s dotted fields set (raises on an unknown field)."""
  c = ml_collections.ConfigDict(config.to_dict()) if hasattr(config, "to_dict") else config
  for key, value in point.items():
    target, leaf = _field_parent(c, key, point)
    try:
      target[leaf] = value
    except TypeError as e:  # a value of another type than the field's
      raise SweepError(f"sweep point {dict(point)}: {key}={value!r}: {e}") from None
  return c


def validated_configs(config, points: Sequence[Point], overrides: Mapping[str, Any] | None = None,
                      label: str = "point", first: int = 0) -> list:
  """Each point's full config (`config` with the point's fields, then `overrides`), checked by
  `experiment.validate`: a bad value in the last point fails before the first one runs, as a
  SweepError naming the point (`<label> <index from first> (<name>)`)."""
  configs = []
  for i, point in enumerate(points, first):
    c = apply_overrides(apply_overrides(config, point), overrides or {})
    try:
      experiment.validate(c)
    except ValueError as e:
      raise SweepError(f"{label} {i} ({point_name(point)}): {e}") from None
    configs.append(c)
  return configs


def override_flags(point: Mapping[str, Any]) -> list[str]:
  """`{"learning_rate": 0.5}` -> `["--config.learning_rate=0.5"]` for scripts/train.py.

  The text is what ml_collections' config flags parse back into the same value: `true`/`false`
  for booleans, a Python literal for containers (which `ast.literal_eval` reads, `None` and
  `True` inside included). A bare None is `None`, which scripts/train.py reads back as None
  only for a field whose default is None (a path: unset, transformer_jax/cli.py); config flags
  parse it as the string "None" for another str field and refuse it for a number, so there it
  is refused here."""
  out = []
  for key, value in point.items():
    if value is None and not experiment.unset_by_none(key):
      raise SweepError(f"sweep point {dict(point)}: {key}=None cannot be passed to "
                       f"scripts/train.py (--config.{key}=None arrives as the string 'None'; "
                       "only a field whose default is None, a path, takes None): leave "
                       f"{key!r} out of the point to keep get_config()'s value, or set it to "
                       "None in get_config()")
    if hasattr(value, "to_dict"):  # a ConfigDict, as config_flags gives a dict-valued override
      value = value.to_dict()
    if isinstance(value, bool):
      text = "true" if value else "false"
    elif isinstance(value, (list, tuple, dict)):
      text = repr(value)
    else:
      text = str(value)
    out.append(f"--config.{key}={text}")
  return out


# ---------------------------------------------------------------- config files


def split_config_arg(spec: str) -> tuple[str, str | None]:
  """`configs/x.py:big` -> ("configs/x.py", "big"), as ml_collections' config flag reads it."""
  path, sep, arg = spec.partition(":")
  return path, (arg if sep else None)


def join_config_arg(path: str, arg: str | None) -> str:
  """("configs/x.py", "big") -> `configs/x.py:big`: `split_config_arg` undone."""
  return path + (f":{arg}" if arg is not None else "")


def load_config_module(path: str):
  if not os.path.isfile(path):
    raise FileNotFoundError(f"config file {path!r} does not exist")
  spec = importlib.util.spec_from_file_location(
      "sweep_config_" + hashlib.md5(os.path.abspath(path).encode()).hexdigest()[:8], path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _call_with_arg(fn, arg):
  params = inspect.signature(fn).parameters
  return fn(arg) if params else fn()


@dataclasses.dataclass(frozen=True)
class Sweep:
  """A config file's sweep: its points and the config they override."""
  spec: str                 # path[:arg], as given
  path: str                 # the config file, absolute
  arg: str | None
  points: list[Point]
  base: Any                 # get_config(arg)

  @property
  def config_arg(self) -> str:
    """`--config` for a subprocess, which may run in another directory."""
    return join_config_arg(self.path, self.arg)


def clashes(points: Sequence[Point]) -> tuple[list[str], dict[str, list[Point]]]:
  """(the names of points given twice, and the distinct points that would share a name, by
  that name): names keep 6 significant digits (`point_name`), so values differing beyond them
  would share a workdir or a file. Points equal by value (`point_key`) share a name too: one
  grouping by name finds both."""
  by_name: dict[str, list[Point]] = {}
  for p in points:
    by_name.setdefault(point_name(p), []).append(p)
  twice = sorted(name for name, same in by_name.items()
                 if len({point_key(p) for p in same}) < len(same))
  return twice, {name: same for name, same in by_name.items()
                 if len(same) > 1 and name not in twice}


def load_sweep(spec: str) -> Sweep:
  """The points of `path[:arg]`'s `sweep()`, each checked against its `get_config()`; the
  module is executed once."""
  path, arg = split_config_arg(spec)
  module = load_config_module(path)
  if not hasattr(module, "sweep"):
    raise SweepError(f"{path} has no sweep() function: define one next to get_config() "
                     "returning a list of override dicts (see docs/scaling.md)")
  points = list(_call_with_arg(module.sweep, arg))
  if not points:
    raise SweepError(f"{path}: sweep() returned no points")
  base = _call_with_arg(module.get_config, arg)
  twice, colliding = clashes(points)
  if twice:
    raise SweepError(f"{path}: sweep() returns the same point twice: {twice}")
  for name, same in colliding.items():
    raise SweepError(f"{path}: sweep() returns points that differ only beyond the 6 "
                     f"significant digits of their names, which would share the workdir "
                     f"{name!r}: {same}; round the values so that they differ within 6 "
                     "digits, or leave one out")
  for p in points:
    # A misspelt field, or a value no flag can carry, fails before anything runs.
    apply_overrides(base, p)
    override_flags(p)
    for key in p:
      target, leaf = _field_parent(base, key, p)
      if isinstance(target[leaf], list):
        raise SweepError(f"{path}: sweep point {dict(p)}: {key} is a list in get_config(), "
                         "which no --config flag can set (ml_collections' flags override "
                         "numbers, strings, booleans and tuples): make it a tuple in "
                         "get_config(), or sweep a scalar field that get_config() builds it "
                         "from")
  return Sweep(spec, os.path.abspath(path), arg, points, base)


def points_from_config(spec: str) -> list[Point]:
  """The points of `path[:arg]`'s `sweep()` (see `load_sweep`)."""
  return load_sweep(spec).points
