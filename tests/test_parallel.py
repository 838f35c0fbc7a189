"""Parallelism on 8 fake CPU devices: every mesh gives the one-device loss and gradients, the
`base` model's partition specs match the reviewed golden files, and checkpoints move between meshes.

The golden files in tests/golden/ record where each parameter of the `base` model lives. When a
change to the model or the rules moves a parameter on purpose, regenerate and review the diff:

    REGENERATE_GOLDEN=1 python -m pytest tests/test_parallel.py -k golden
"""
import functools
import json
import os
import re

import flax.linen as nn
import jax
from jax.sharding import PartitionSpec as P
import numpy as np
import optax
import pytest

import transformer_jax as tj
from transformer_jax import experiment, sharding, steps
from transformer_jax.run import checkpointing
from transformer_jax.run.trainer import Trainer

import tiny_config as tiny_config_module

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(REPO, "tests", "golden")

RULES = sharding.DEFAULT_RULES
# A tiny model whose sharded dimensions divide every mesh axis below (at most 8): vocab 64,
# d_model 32, 4 heads, d_ff 64. Dropout stays on: with JAX's partitionable threefry the random
# bits do not depend on the sharding, so the dropout masks are the same on every mesh.
MODEL = tj.model_config("tiny", vocab_size=64, d_model=32, num_heads=4, d_ff=64,
                        num_encoder_layers=1, num_decoder_layers=1, dropout_rate=0.1)
ROWS = 8  # divides data * fsdp on every mesh

MESHES = {
    "data8": {"data": 8},
    "fsdp8": {"fsdp": 8},
    "data2_tensor4": {"data": 2, "tensor": 4},
    "fsdp2_tensor4": {"fsdp": 2, "tensor": 4},
    "fsdp4_tensor2": {"fsdp": 4, "tensor": 2},
    "data2_fsdp2_tensor2": {"data": 2, "fsdp": 2, "tensor": 2},
}

# float32 sums in a different order (all-reduces, sharded matmuls): agreement to about 1e-6
# relative is expected; the bounds below leave a margin of ~10x.
LOSS_RTOL = 1e-5
GRAD_ATOL, GRAD_RTOL = 2e-6, 1e-4


def _batch():
  rng = np.random.default_rng(0)
  inputs = rng.integers(4, MODEL.vocab_size, (ROWS, 12)).astype(np.int32)
  targets = rng.integers(4, MODEL.vocab_size, (ROWS, 10)).astype(np.int32)
  for r in range(ROWS):  # padding of different lengths, so token counts differ per shard
    inputs[r, 12 - r % 3:] = 0
    targets[r, 10 - r % 4:] = 0
  return {"inputs": inputs, "targets": targets}


def _run_step(mesh, constrained: bool):
  """One SGD(lr=1) train step on `mesh`: (metrics, gradients = old params - new params)."""
  model = tj.Transformer(MODEL)
  tx = optax.sgd(1.0)
  init = functools.partial(steps.init_train_state, model, tx, batch_shape=(1, 8))
  boxed = jax.eval_shape(init, jax.random.key(0))
  shardings = sharding.logical_shardings(boxed, mesh, RULES)
  state = jax.jit(lambda r: steps.unbox(init(r)), out_shardings=shardings)(jax.random.key(0))
  batch_sharding = sharding.batch_sharding(mesh, RULES)
  batch = sharding.global_batch(_batch(), batch_sharding)
  step = jax.jit(steps.make_train_step(model, tx, lambda s: 1.0, 0.1),
                 in_shardings=(shardings, batch_sharding),
                 out_shardings=(shardings, sharding.replicated(mesh)))
  old = jax.device_get(state.params)
  if constrained:  # as the Trainer traces: activations constrained to the logical axes
    with jax.set_mesh(mesh), nn.logical_axis_rules(RULES):
      new, m = step(state, batch)
  else:
    new, m = step(state, batch)
  kernel = new.params["encoder"]["layer_0"]["self_attention"]["query"]["kernel"]
  assert len(kernel.sharding.device_set) == mesh.size
  grads = jax.tree.map(lambda a, b: a - np.asarray(b), old, jax.device_get(new.params))
  return jax.device_get(m), grads


@pytest.fixture(scope="module")
def reference():
  return _run_step(sharding.make_mesh({"data": 1}, jax.devices()[:1]), constrained=False)


# Every mesh as the Trainer traces (constrained); the plain tracing (parameter shardings only,
# XLA free to place activations) on the two meshes that mix axes.
CASES = [(name, True) for name in sorted(MESHES)] + [
    ("data2_tensor4", False), ("data2_fsdp2_tensor2", False)]


@pytest.mark.parametrize("name,constrained", CASES,
                         ids=[f"{n}-{'constrained' if c else 'plain'}" for n, c in CASES])
def test_mesh_matches_one_device(reference, name, constrained):
  ref_metrics, ref_grads = reference
  mesh = sharding.make_mesh(MESHES[name])
  assert mesh.size == 8
  got_metrics, got_grads = _run_step(mesh, constrained)
  assert float(ref_metrics["tokens"]) == float(got_metrics["tokens"])
  for k in ("loss", "nll", "correct", "grad_norm"):
    assert float(got_metrics[k]) == pytest.approx(float(ref_metrics[k]), rel=LOSS_RTOL), k
  flat_ref = jax.tree_util.tree_leaves_with_path(ref_grads)
  flat_got = jax.tree.leaves(got_grads)
  for (path, a), b in zip(flat_ref, flat_got):
    np.testing.assert_allclose(b, a, atol=GRAD_ATOL, rtol=GRAD_RTOL,
                               err_msg=jax.tree_util.keystr(path))
  # The gradients are not trivially zero (the comparison could fail).
  assert float(ref_metrics["grad_norm"]) > 1e-3


def test_constraints_shard_activations():
  """Under the mesh and rules context the activation constraints are really in the program."""
  mesh = sharding.make_mesh({"data": 2, "tensor": 4})
  model = tj.Transformer(MODEL.replace(deterministic=True))
  # Unboxed outside the jitted function: only the model's own (activation) constraints count.
  params = steps.unbox(jax.eval_shape(lambda: model.init(
      jax.random.key(0), np.ones((ROWS, 8), np.int32), np.ones((ROWS, 8), np.int32))["params"]))
  apply = jax.jit(lambda p, x, y: model.apply({"params": p}, x, y))
  x = jax.ShapeDtypeStruct((ROWS, 8), np.int32)

  def constraints(constrained):
    if constrained:
      with jax.set_mesh(mesh), nn.logical_axis_rules(RULES):
        text = apply.lower(params, x, x).as_text()
    else:
      text = apply.lower(params, x, x).as_text()
    return [line for line in text.splitlines() if "sharding_constraint" in line]

  assert constraints(False) == []
  lines = constraints(True)
  heads = f"tensor<{ROWS}x8x{MODEL.num_heads}x{MODEL.head_dim}x"
  # [batch, length, heads, kv] activations: rows over data (x fsdp), heads over tensor.
  assert any(heads in line and '[{"data", "fsdp"}, {}, {"tensor"}, {}]' in line
             for line in lines), lines
  # [batch, length, embed] activations: rows over data (x fsdp).
  assert any(f"tensor<{ROWS}x8x{MODEL.d_model}x" in line and '{"data", "fsdp"}' in line
             for line in lines)


# ---------------------------------------------------------------- golden partition specs


def _base_specs(mesh_spec: dict) -> dict:
  """Mesh partition spec and shape of every `base` parameter, without materialising them."""
  c = experiment.base_config("base")
  cfg = experiment.transformer_config(c, vocab_size=32000)
  model = tj.Transformer(cfg)
  dummy = jax.ShapeDtypeStruct((1, 8), np.int32)
  boxed = jax.eval_shape(lambda x: model.init(jax.random.key(0), x, x)["params"], dummy)
  mesh = sharding.make_mesh(mesh_spec)
  shardings = sharding.logical_shardings(boxed, mesh, sharding.rules_from_config(
      c.logical_axis_rules))
  shapes = steps.unbox(boxed)
  out = {}
  for (path, s), shape in zip(jax.tree_util.tree_leaves_with_path(shardings),
                              jax.tree.leaves(shapes)):
    # Every sharded dimension must divide by its mesh axes, or jit would refuse the layout.
    for dim, axes in zip(shape.shape, s.spec):
      for axis in (axes if isinstance(axes, tuple) else (axes,)):
        if axis is not None:
          assert dim % mesh.shape[axis] == 0, (jax.tree_util.keystr(path), shape.shape, s.spec)
    out["/".join(str(k.key) for k in path)] = {
        "shape": list(shape.shape),
        "spec": [list(a) if isinstance(a, tuple) else a for a in s.spec]}
  return {"mesh": dict(mesh.shape), "params": out}


def test_misspelt_axis_rules_are_refused_before_anything_runs():
  """Flax takes any name: a rule for "head" left the model's "heads" kernels whole on every
  device without a word, and a mesh axis "tensr" failed as a bare KeyError inside the setup."""
  c = experiment.base_config("base")
  cfg = experiment.transformer_config(c, vocab_size=320)
  boxed = jax.eval_shape(lambda x: tj.Transformer(cfg).init(jax.random.key(0), x, x)["params"],
                         jax.ShapeDtypeStruct((1, 8), np.int32))
  used = {name for spec in jax.tree.leaves(nn.get_partition_spec(boxed),
                                           is_leaf=lambda x: isinstance(x, P))
          for name in spec if name is not None}
  assert used <= set(sharding.LOGICAL_AXES), used   # the list the check holds is the model's
  default = [list(r) for r in c.logical_axis_rules]
  renamed = [["head", r[1]] if r[0] == "heads" else r for r in default]
  cases = {
      "'head' is not a logical axis of the model": renamed,
      "no rule for ['heads']": [r for r in default if r[0] != "heads"],
      "no rule for ['heads', 'mlp']: give each logical axis one (e.g. ['heads', None]":
          [r for r in default if r[0] not in ("heads", "mlp")],
      "the rule for 'heads' names [None]": [["heads", [None]]] + default,
      "the rule for 'heads' names ['tensr']": [["heads", "tensr"]] + default,
      "the rule for 'batch' names ['dta']": [["batch", ["dta", "fsdp"]]] + default,
      "['heads'] is not a rule": [["heads"]] + default,
  }
  for message, rules in cases.items():
    c.logical_axis_rules = rules
    with pytest.raises(ValueError, match=re.escape(f"config.logical_axis_rules: {message}")):
      experiment.validate(c)
    with pytest.raises(ValueError, match=re.escape(message)):
      sharding.rules_from_config(rules)
  c.logical_axis_rules = [["heads", None]] + default   # a rule first in priority: fine
  experiment.validate(c)


@pytest.mark.parametrize("filename,mesh_spec", [
    ("base_2x4_data_tensor.json", {"data": 2, "tensor": 4}),
    ("base_2x4_fsdp_tensor.json", {"fsdp": 2, "tensor": 4}),
])
def test_golden_partition_specs(filename, mesh_spec):
  got = _base_specs(mesh_spec)
  path = os.path.join(GOLDEN, filename)
  if os.environ.get("REGENERATE_GOLDEN"):
    os.makedirs(GOLDEN, exist_ok=True)
    with open(path, "w") as f:
      json.dump(got, f, indent=1, sort_keys=True)
      f.write("\n")
  with open(path) as f:
    want = json.load(f)
  assert got["mesh"] == want["mesh"]
  changed = {k: (want["params"].get(k), got["params"].get(k))
             for k in sorted(set(want["params"]) | set(got["params"]))
             if want["params"].get(k) != got["params"].get(k)}
  assert not changed, (
      f"partition specs differ from {path} (golden, now): {json.dumps(changed, indent=1)}\n"
      "If intended, regenerate with REGENERATE_GOLDEN=1 python -m pytest "
      "tests/test_parallel.py -k golden and review the diff.")


# ---------------------------------------------------------------- portable checkpoints


def _state_on(mesh):
  model = tj.Transformer(MODEL)
  tx = optax.adam(1e-3)
  init = functools.partial(steps.init_train_state, model, tx, batch_shape=(1, 8))
  boxed = jax.eval_shape(init, jax.random.key(0))
  shardings = sharding.logical_shardings(boxed, mesh, RULES)
  return jax.jit(lambda r: steps.unbox(init(r)), out_shardings=shardings)(jax.random.key(3)), boxed


def test_checkpoint_moves_from_data_to_tensor_mesh(tmp_path):
  src = sharding.make_mesh({"data": 8})
  dst = sharding.make_mesh({"data": 2, "tensor": 4})
  state, boxed = _state_on(src)
  ckpt = checkpointing.Checkpointer(str(tmp_path), async_save=False)
  ckpt.save(2, state, {"next_index": 7}, {}, force=True)
  ckpt.wait()
  target = checkpointing.abstract_like(steps.unbox(boxed),
                                       sharding.logical_shardings(boxed, dst, RULES))
  step, restored, data_state, _ = ckpt.restore_latest(target)
  ckpt.close()
  assert step == 2 and data_state == {"next_index": 7}
  for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  kernel = restored.params["decoder"]["layer_0"]["feed_forward"]["wi"]["kernel"]
  assert kernel.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor")
  assert kernel.addressable_shards[0].data.shape == (32, 64 // 4)


def _steps(trainer, state, it, n):
  losses = []
  for _ in range(n):
    with trainer.context():
      state, m = trainer.train_step(state, trainer.put(next(it)))
    losses.append(float(m["loss"] / m["tokens"]))
  return state, losses


def test_trainer_resumes_a_workdir_under_another_mesh(tmp_path):
  """A run saved on an 8-way data mesh continues on a 2x4 data x tensor mesh, same losses."""
  import ml_collections
  c = tiny_config_module.get_config()
  c.data.data_dir = str(tmp_path / "tfds")
  workdir = str(tmp_path / "run")
  first = Trainer.create(c, workdir)
  assert dict(first.mesh.shape) == {"data": 8, "fsdp": 1, "tensor": 1}
  state, _, origin = first.initial_state()
  assert origin == "scratch"
  it = iter(first.data.train_dataset())
  state, _ = _steps(first, state, it, 3)
  first.checkpointer.save(3, state, it.get_state(), {"step": 3}, force=True)
  first.checkpointer.close()
  state, straight = _steps(first, state, it, 2)            # steps 4 and 5 on the data mesh

  moved = c.copy_and_resolve_references()
  moved.mesh = ml_collections.ConfigDict({"data": 2, "fsdp": 1, "tensor": 4})
  second = Trainer.create(moved, workdir)
  state, data_state, origin = second.initial_state()
  assert origin == "resumed from step 3"
  kernel = state.params["decoder"]["layer_0"]["feed_forward"]["wi"]["kernel"]
  assert kernel.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor")
  it = iter(second.data.train_dataset())
  it.set_state(data_state)
  state, resumed = _steps(second, state, it, 2)             # the same steps on data x tensor
  second.checkpointer.close()
  assert int(state.step) == 5
  np.testing.assert_allclose(resumed, straight, rtol=LOSS_RTOL)


@pytest.mark.parametrize("mesh_spec, process_of, ok", [
    ({"data": 2, "tensor": 4}, lambda d: d.id // 4, True),    # each process one data shard
    ({"data": 4, "tensor": 2}, lambda d: d.id // 4, True),    # two data shards each
    ({"fsdp": 8}, lambda d: d.id // 2, True),                 # four processes, two shards each
    ({"data": 1, "tensor": 8}, lambda d: d.id // 4, False),   # the batch replicated on both
    ({"data": 2, "tensor": 4}, lambda d: d.id % 2, False),    # tensor axis across processes
    ({"data": 8}, lambda d: int(d.id >= 6), False),           # rows of its own, but 12 and 4
])
def test_each_process_must_hold_rows_of_its_own(mesh_spec, process_of, ok):
  # 8 fake devices standing in for the devices of 2 or 4 processes (process_of): each process
  # feeds its own rows, so the batch axes must give it a block of its own.
  mesh = sharding.make_mesh(mesh_spec)
  batch_sharding = sharding.batch_sharding(mesh, RULES)
  processes = len({process_of(d) for d in jax.devices()})
  if ok:
    sharding.check_rows_split_over_processes(batch_sharding, 16, processes, process_of)
  else:
    with pytest.raises(ValueError, match=r"config.mesh .* do not give each of the \d processes "
                       r"rows of its own"):
      sharding.check_rows_split_over_processes(batch_sharding, 16, processes, process_of)
