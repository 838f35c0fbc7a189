"""The schedules and the optimizer that configs select, against hand calculations and properties."""
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from transformer_jax import experiment, optim, steps
from transformer_jax.model import Transformer

import tiny_config


def config(**overrides):
  c = ml_collections.ConfigDict(dict(
      schedule="rsqrt", learning_rate=2.0, warmup_steps=10, num_train_steps=110,
      weight_decay=0.0, weight_decay_mask="all", grad_clip_norm=0.0, adam_b1=0.9, adam_b2=0.98,
      adam_eps=1e-9, flatten_optimizer=False))
  c.update(overrides)
  return c


def rates(schedule, counts):
  return [float(schedule(c)) for c in counts]


def test_rsqrt_is_the_papers_formula_times_learning_rate():
  schedule = optim.make_schedule(config(schedule="rsqrt"), d_model=64)
  for count in [0, 4, 9, 10, 50]:
    step = count + 1
    expected = 2.0 * 64**-0.5 * min(step**-0.5, step * 10**-1.5)
    assert float(schedule(count)) == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("warmup", [1, 10])
def test_constant_warms_up_linearly_from_zero(warmup):
  schedule = optim.make_schedule(config(schedule="constant", warmup_steps=warmup), d_model=64)
  np.testing.assert_allclose(rates(schedule, [0, warmup / 2, warmup, 10 * warmup]),
                             [0.0, 1.0, 2.0, 2.0], rtol=1e-6)


def test_constant_without_warmup_starts_at_the_rate():
  schedule = optim.make_schedule(config(schedule="constant", warmup_steps=0), d_model=64)
  np.testing.assert_allclose(rates(schedule, [0, 1, 1000]), [2.0, 2.0, 2.0])


def test_cosine_warms_up_then_decays_to_zero_at_the_last_step():
  schedule = optim.make_schedule(config(schedule="cosine"), d_model=64)
  # Warmup 10 steps to 2.0, then half a cosine over the remaining 100: 1.0 halfway, 0 at the end.
  np.testing.assert_allclose(rates(schedule, [0, 5, 10, 60, 110]), [0.0, 1.0, 2.0, 1.0, 0.0],
                             atol=1e-6)


def test_unknown_schedule_names_the_field():
  with pytest.raises(ValueError, match="config.schedule='linear'"):
    optim.make_schedule(config(schedule="linear"), d_model=64)


@pytest.mark.parametrize("field", ["weight_decay", "grad_clip_norm"])
def test_negative_decay_or_clip_names_the_field(field):
  with pytest.raises(ValueError, match=f"config.{field}=-0.5: must be >= 0"):
    optim.make_optimizer(config(**{field: -0.5}), d_model=64)


def updates(c, grads):
  """The parameter updates of make_optimizer's transform for a sequence of gradients."""
  tx, _ = optim.make_optimizer(c, d_model=64)
  params = jnp.array([1.0, -2.0, 3.0])
  state = tx.init(params)
  out = []
  for g in grads:
    u, state = tx.update(jnp.asarray(g, jnp.float32), state, params)
    out.append(np.asarray(u))
  return out


def test_weight_decay_is_decoupled_and_off_at_zero():
  zero = [[0.0, 0.0, 0.0]]
  # No gradient: Adam moves nothing; AdamW still shrinks each weight by lr * wd * weight.
  np.testing.assert_array_equal(updates(config(schedule="constant", warmup_steps=0), zero)[0], 0.0)
  decayed = updates(config(schedule="constant", warmup_steps=0, weight_decay=0.1), zero)[0]
  np.testing.assert_allclose(decayed, -2.0 * 0.1 * np.array([1.0, -2.0, 3.0]), rtol=1e-6)


def test_weight_decay_on_the_matrices_leaves_biases_and_layer_norms_alone():
  params = {"dense": {"kernel": jnp.ones((3, 2)), "bias": jnp.ones((2,))},
            "norm": {"scale": jnp.ones((2,)), "bias": jnp.ones((2,))},
            "embed": {"embedding": jnp.full((4, 2), 2.0)}}
  zero = jax.tree.map(jnp.zeros_like, params)

  def update(mask):
    c = config(schedule="constant", warmup_steps=0, weight_decay=0.1, weight_decay_mask=mask)
    tx, _ = optim.make_optimizer(c, d_model=64)
    return tx.update(zero, tx.init(params), params)[0]

  u = update("matrices")
  np.testing.assert_allclose(u["dense"]["kernel"], -0.2, rtol=1e-6)
  np.testing.assert_allclose(u["embed"]["embedding"], -0.4, rtol=1e-6)
  for leaf in (u["dense"]["bias"], u["norm"]["scale"], u["norm"]["bias"]):
    np.testing.assert_array_equal(leaf, 0.0)
  assert all(np.all(np.asarray(leaf) < 0) for leaf in jax.tree.leaves(update("all")))
  with pytest.raises(ValueError, match="config.weight_decay_mask='norms'"):
    update("norms")


def test_the_models_matrices_are_its_kernels_and_embeddings():
  c = tiny_config.get_config()
  model_cfg = experiment.transformer_config(c, vocab_size=64)
  model = Transformer(model_cfg)
  x = jnp.ones((1, 8), jnp.int32)
  params = jax.eval_shape(lambda: steps.unbox(model.init(jax.random.key(0), x, x)["params"]))
  decays = jax.tree_util.tree_flatten_with_path(optim.decay_mask("matrices")(params))[0]
  names = {jax.tree_util.keystr(path): bool(d) for path, d in decays}
  assert names and all(d == (k.endswith("['kernel']") or k.endswith("['embedding']"))
                       for k, d in names.items()), names
  assert any(not d for d in names.values()) and any(names.values())


def test_global_norm_clipping():
  # A gradient of norm 100 and then the same direction at norm 1. Clipped at 1, Adam sees the
  # same gradient twice and makes the same update twice; unclipped, the first gradient dominates
  # the second moment and the second update is much smaller. Clip 0 means off, not "clip to 0".
  u = np.array([0.6, 0.0, -0.8])
  grads = [100 * u, u]
  base = config(schedule="constant", warmup_steps=0)
  clipped = updates(config(schedule="constant", warmup_steps=0, grad_clip_norm=1.0), grads)
  np.testing.assert_allclose(clipped[0], clipped[1], rtol=1e-5)
  np.testing.assert_allclose(clipped[0], -2.0 * np.sign(u), atol=1e-5)
  plain = updates(base, grads)
  assert np.abs(plain[1]).max() < 0.8 * np.abs(plain[0]).max()  # 0.68 by hand
  np.testing.assert_allclose(plain[0], clipped[0], atol=1e-5)  # Adam's first step ignores scale


@pytest.mark.parametrize("extra", [
    {}, {"grad_clip_norm": 0.5}, {"weight_decay": 0.1, "weight_decay_mask": "all"},
    {"weight_decay": 0.1, "weight_decay_mask": "matrices", "grad_clip_norm": 0.5}])
def test_a_flat_optimizer_makes_the_same_updates_with_fewer_state_arrays(extra):
  params = {"dense": {"kernel": jnp.arange(6.0).reshape(3, 2) - 2, "bias": jnp.ones((2,))},
            "embed": {"embedding": jnp.full((4, 2), 2.0)}}
  grads = [jax.tree.map(lambda p, i=i: jnp.sin(p * (i + 1)) + 0.1 * i, params) for i in range(3)]

  def run(flat):
    c = config(schedule="constant", warmup_steps=0, flatten_optimizer=flat, **extra)
    tx, _ = optim.make_optimizer(c, d_model=64)
    p, state, out = params, tx.init(params), []
    for g in grads:
      u, state = tx.update(g, state, p)
      p = jax.tree.map(jnp.add, p, u)
      out.append(u)
    return out, len(jax.tree.leaves(state))

  (flat, flat_arrays), (tree, tree_arrays) = run(True), run(False)
  for a, b in zip(jax.tree.leaves(flat), jax.tree.leaves(tree)):   # to float32 rounding (the
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)          # clip's norm sums in order)
  assert jax.tree.structure(flat[0]) == jax.tree.structure(params)
  assert flat_arrays < tree_arrays   # Adam's two moments: one vector each, not one per leaf


def test_a_flat_optimizer_needs_a_data_parallel_mesh():
  c = tiny_config.get_config()
  c.flatten_optimizer = True
  experiment.validate(c)
  c.mesh.fsdp = 2
  with pytest.raises(ValueError, match=r"config.flatten_optimizer=True: needs a data-parallel "
                                       r"mesh, but config.mesh splits \{'fsdp': 2\}"):
    experiment.validate(c)
