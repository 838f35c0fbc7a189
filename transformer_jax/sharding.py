"""Device mesh and logical-axis sharding: the only place that knows about devices.

The model names its axes (`batch`, `length`, `embed`, `heads`, `kv`, `mlp`, `vocab`); the config's
`logical_axis_rules` map those names onto the mesh axes `data`, `fsdp` and `tensor`. Rules are in
priority order and a mesh axis is used at most once per array (Flax's semantics), so
`("embed", "fsdp")` shards parameters over fsdp while activations, whose `batch` axis already
took fsdp, keep `embed` whole.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import flax.linen as nn
import jax
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np

MESH_AXES = ("data", "fsdp", "tensor")
# The names the model gives its arrays' axes (layers.py, attention.py, model.py).
LOGICAL_AXES = ("batch", "length", "embed", "heads", "kv", "mlp", "vocab")

DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
    ("batch", ("data", "fsdp")),
    ("vocab", "tensor"),
    ("heads", "tensor"),
    ("mlp", "tensor"),
    ("embed", "fsdp"),
    ("length", None),
    ("kv", None),
)


class ShardingError(ValueError):
  """A config whose mesh does not fit the devices, or whose sizes the mesh cannot split: the
  message names the fields to change; the scripts print it as `error: ...`."""


def mesh_shape(spec: dict[str, int], num_devices: int) -> tuple[int, ...]:
  """Resolve `{"data": -1, "fsdp": 1, "tensor": 2}` against the device count (-1 fills the rest)."""
  unknown = sorted(set(spec) - set(MESH_AXES))
  if unknown:
    raise ShardingError(f"config.mesh has unknown axes {unknown}: expected among {MESH_AXES}")
  sizes = [int(spec.get(a, 1)) for a in MESH_AXES]
  if sizes.count(-1) > 1:
    raise ShardingError(f"config.mesh={dict(spec)}: at most one axis may be -1")
  fixed = math.prod(s for s in sizes if s != -1)
  if any(s == 0 or s < -1 for s in sizes) or num_devices % fixed:
    raise ShardingError(f"config.mesh={dict(spec)} does not divide the {num_devices} devices")
  sizes = [num_devices // fixed if s == -1 else s for s in sizes]
  if math.prod(sizes) != num_devices:
    raise ShardingError(f"config.mesh={dict(spec)} uses {math.prod(sizes)} devices, but "
                        f"{num_devices} are present: set one axis to -1 to fill the rest")
  return tuple(sizes)


def make_mesh(spec: dict[str, int], devices: Sequence[jax.Device] | None = None) -> Mesh:
  devices = list(jax.devices() if devices is None else devices)
  shape = mesh_shape(spec, len(devices))
  if devices[0].platform == "cpu":
    # CPU devices have no interconnect topology: plain order.
    grid = np.asarray(devices).reshape(shape)
  else:
    # Accelerators: an order that keeps the inner mesh axes on the fastest links.
    grid = mesh_utils.create_device_mesh(shape, devices)
  return Mesh(grid, MESH_AXES)


def rules_problem(rules) -> str | None:
  """Why `config.logical_axis_rules` cannot be used, or None. Flax takes any name: a misspelt
  logical name ("head") leaves the model's "heads" without a rule, so those arrays are silently
  whole on every device, and a misspelt mesh axis fails deep inside as a bare KeyError."""
  named = set()
  for rule in rules:
    if not (isinstance(rule, (list, tuple)) and len(rule) == 2 and isinstance(rule[0], str)):
      return f"{rule!r} is not a rule: each is [logical name, mesh axis or list of them or None]"
    name, axes = rule
    if name not in LOGICAL_AXES:
      return f"{name!r} is not a logical axis of the model: they are {LOGICAL_AXES}"
    listed = axes if isinstance(axes, (list, tuple)) else [axes]
    unknown = [a for a in listed if a not in MESH_AXES and not (a is None and axes is None)]
    if unknown:
      return (f"the rule for {name!r} names {unknown}: mesh axes are {MESH_AXES} (or None to "
              "keep the axis whole)")
    named.add(name)
  missing = [n for n in LOGICAL_AXES if n not in named]
  if missing:
    return (f"no rule for {missing}: give each logical axis one (e.g. [{missing[0]!r}, None] to "
            "keep it whole on every device)")
  return None


def rules_from_config(rules) -> tuple[tuple[str, Any], ...]:
  """ConfigDict lists come back as lists; Flax wants tuples of (name, axis or tuple of axes)."""
  problem = rules_problem(rules)
  if problem:
    raise ValueError(f"config.logical_axis_rules: {problem}")
  out = []
  for name, axes in rules:
    out.append((name, tuple(axes) if isinstance(axes, (list, tuple)) else axes))
  return tuple(out)


def logical_shardings(abstract_tree, mesh: Mesh, rules):
  """NamedShardings for a tree whose leaves may be `nn.Partitioned` (unboxed structure)."""
  specs = nn.get_partition_spec(abstract_tree)
  return nn.logical_to_mesh_sharding(specs, mesh, rules)


# The config field that sets each logical axis's size: what to change when it does not split.
AXIS_SIZES = {
    "vocab": "the vocabulary size (data.vocab_size is an upper bound: the tokenizer's piece "
             "count decides)",
    "heads": "model.num_heads", "mlp": "model.d_ff", "embed": "model.d_model",
    "kv": "model.d_model // model.num_heads", "length": "model.max_len",
}


def _mesh_axes(entry) -> tuple[str, ...]:
  """One PartitionSpec entry (None, a mesh axis, or a tuple of them) as a tuple of axes."""
  return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


def check_divisible(abstract_tree, mesh: Mesh, rules) -> None:
  """Raise, naming the config field, where the rules split an axis of a parameter (or of the
  optimizer state) over mesh axes whose size does not divide it; otherwise jax fails later
  with an `IndivisibleError` that names no field."""
  specs = nn.get_partition_spec(abstract_tree)
  shapes = nn.unbox(abstract_tree)
  is_spec = lambda x: isinstance(x, P)  # noqa: E731
  for spec, leaf in zip(jax.tree.leaves(specs, is_leaf=is_spec), jax.tree.leaves(shapes)):
    mesh_spec = nn.logical_to_mesh_axes(tuple(spec), rules) if len(spec) else P()
    for name, entry, size in zip(spec, mesh_spec, leaf.shape):
      axes = _mesh_axes(entry)
      ways = math.prod(mesh.shape[a] for a in axes)
      if size % ways:
        raise ShardingError(
            f"{AXIS_SIZES.get(name, name)} = {size} does not split over mesh axes {axes} "
            f"({ways} devices; config.mesh={dict(mesh.shape)}, logical axis {name!r}): make it "
            f"a multiple of {ways}, or change config.mesh / config.logical_axis_rules")


def batch_sharding(mesh: Mesh, rules) -> NamedSharding:
  """Batches `[batch, length]` are split over the axes that `batch` maps to."""
  return NamedSharding(mesh, nn.logical_to_mesh_axes(("batch", "length"), rules))


def batch_shards(sharding: NamedSharding) -> int:
  """How many ways `batch_sharding` splits the rows of a batch."""
  axes = _mesh_axes(sharding.spec[0] if len(sharding.spec) else None)
  return math.prod(sharding.mesh.shape[a] for a in axes)


def check_rows_split_over_processes(sharding: NamedSharding, rows: int, process_count: int,
                                   process_of=lambda device: device.process_index) -> None:
  """Raise unless each process's devices hold `rows / process_count` rows of their own, as
  each process reads its own shard of the data (`global_batch`).

  Where processes share rows (e.g. 2 processes with `data=1, tensor=2`: the batch is
  replicated across them), `jax.make_array_from_process_local_data` takes each process's
  different rows for copies of the same ones: half the batch, and partial sums of different
  batches mixed in every tensor-parallel product, without an error.
  """
  held: dict[int, set[int]] = {}
  for device, index in sharding.devices_indices_map((rows, 1)).items():
    held.setdefault(process_of(device), set()).update(range(*index[0].indices(rows)))
  per_process = rows // process_count
  claimed: set[int] = set()
  for process, own in sorted(held.items()):
    if len(own) != per_process or own & claimed:
      axes = dict(sharding.mesh.shape)
      raise ShardingError(
          f"the batch axes of config.mesh ({axes}) do not give each of the {process_count} "
          f"processes rows of its own (process {process}'s devices hold {len(own)} of a "
          f"{rows}-row batch, {per_process} expected): each process reads different data, so "
          "the axes that `batch` maps to (data, fsdp) must split the batch across processes; "
          "e.g. make config.mesh.data a multiple of the process count")
    claimed |= own


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def global_batch(local_batch: dict[str, np.ndarray],
                 sharding: NamedSharding) -> dict[str, jax.Array]:
  """Assemble each process's rows into global arrays (one process: just a device_put)."""
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
          for k, v in local_batch.items()}
