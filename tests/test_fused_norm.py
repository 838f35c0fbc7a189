"""The fused post-LN kernel (`fused_norm`, `model.norm_impl="pallas"`) against the unfused path.

On CPU the kernels run in Pallas's interpret mode: the same kernel bodies the GPU compiles
through Triton; one test lowers them for CUDA to check that Triton accepts every operation.
"""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer_jax as tj
from transformer_jax import fused_norm
from transformer_jax.attention import keep_mask


def rel(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return np.linalg.norm((a - b).ravel()) / np.linalg.norm(b.ravel())


def inputs(seed, shape, dtype):
  k = jax.random.split(jax.random.key(seed), 5)
  d = shape[-1]
  x = jax.random.normal(k[0], shape, jnp.float32).astype(dtype)
  y = (2.0 * jax.random.normal(k[1], shape, jnp.float32) + 0.5).astype(dtype)
  scale = 1.0 + 0.3 * jax.random.normal(k[2], (d,))
  bias = 0.3 * jax.random.normal(k[3], (d,))
  cot = jax.random.normal(k[4], shape, jnp.float32).astype(dtype)
  return x, y, scale, bias, cot


def value_and_grads(fn, x, y, keep, scale, bias, cot, keep_prob, dtype):
  def loss(x, y, scale, bias):
    out = fn(x, y, keep, scale, bias, keep_prob=keep_prob, eps=1e-6, dtype=dtype)
    return jnp.sum(out.astype(jnp.float32) * cot.astype(jnp.float32)), out
  (_, out), grads = jax.jit(jax.value_and_grad(loss, (0, 1, 2, 3), has_aux=True))(
      x, y, scale, bias)
  return out, grads


@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 1e-6), (jnp.bfloat16, 1e-2)])
@pytest.mark.parametrize("dropout", [0.1, None])
@pytest.mark.parametrize("shape", [(3, 8, 64), (5, 3, 16)])
def test_kernel_matches_the_unfused_computation(dtype, tol, dropout, shape):
  x, y, scale, bias, cot = inputs(len(shape) + shape[0], shape, dtype)
  keep, keep_prob = (None, 1.0) if dropout is None else keep_mask(jax.random.key(9), dropout,
                                                                   shape)
  out, grads = value_and_grads(fused_norm.residual_norm, x, y, keep, scale, bias, cot,
                               keep_prob, dtype)
  ref_out, ref_grads = value_and_grads(fused_norm.reference, x, y, keep, scale, bias, cot,
                                       keep_prob, dtype)
  assert out.dtype == ref_out.dtype and out.shape == shape
  assert rel(out, ref_out) < tol
  for name, g, r in zip(("x", "y", "scale", "bias"), grads, ref_grads):
    assert g.dtype == r.dtype and g.shape == r.shape, name
    assert rel(g, r) < tol, (name, rel(g, r))
  if keep is not None:  # a dropped element passes no gradient to y, all of it to x
    dy = np.asarray(grads[1], np.float32)
    assert np.all(dy[~np.asarray(keep)] == 0) and np.any(dy[np.asarray(keep)] != 0)
    assert np.all(np.asarray(grads[0], np.float32)[~np.asarray(keep)] != 0)


def test_block_rows_divide_the_rows():
  assert fused_norm.block_rows(96 * 256, 512) == 16
  assert fused_norm.block_rows(96 * 256, 1024) == 8
  assert fused_norm.block_rows(15, 64) == 1
  assert fused_norm.block_rows(12, 64) == 4
  assert fused_norm.block_rows(1024, 16384) == 1


def test_bad_shapes_are_refused():
  x = jnp.ones((4, 8))
  with pytest.raises(ValueError, match="one shape"):
    fused_norm.residual_norm(x, jnp.ones((4, 6)), None, jnp.ones(8), jnp.zeros(8))
  with pytest.raises(ValueError, match=r"must be \(8,\)"):
    fused_norm.residual_norm(x, x, None, jnp.ones(6), jnp.zeros(8))
  with pytest.raises(ValueError, match="power of two"):
    fused_norm.residual_norm(jnp.ones((4, 24)), jnp.ones((4, 24)), None, jnp.ones(24),
                             jnp.zeros(24), interpret=False)


def test_triton_lowers_the_kernels_for_cuda():
  # Lowering (no GPU needed) runs Pallas's Triton lowering of every operation of both kernels;
  # what Triton cannot express fails here rather than on a lent GPU.
  x = jnp.zeros((64, 128), jnp.bfloat16)

  def loss(x, y, scale, bias, rng):
    keep, keep_prob = keep_mask(rng, 0.1, x.shape)
    out = fused_norm.residual_norm(x, y, keep, scale, bias, keep_prob=keep_prob,
                                   dtype=jnp.bfloat16, interpret=False)
    return jnp.sum(out.astype(jnp.float32))

  lowered = jax.jit(jax.grad(loss, (0, 1, 2, 3))).trace(
      x, x, jnp.ones(128), jnp.zeros(128), jax.random.key(0)).lower(
          lowering_platforms=("cuda",))
  text = lowered.as_text()
  assert text.count("__gpu$xla.gpu.triton") == 2, "expected the forward and backward kernels"


def test_pre_ln_is_refused():
  with pytest.raises(ValueError, match="norm_position='post' or norm_impl='xla'"):
    tj.model_config("tiny", norm_position="pre", norm_impl="pallas")


VOCAB = 40


@pytest.fixture(scope="module")
def tiny():
  cfg = tj.model_config("tiny", vocab_size=VOCAB, dropout_rate=0.2)
  src = jax.random.randint(jax.random.key(1), (3, 9), 4, VOCAB).at[0, 6:].set(0)
  tgt = jax.random.randint(jax.random.key(2), (3, 7), 4, VOCAB).at[0, 5:].set(0)
  variables = jax.jit(tj.Transformer(cfg).init)(jax.random.key(0), src, tgt)
  return cfg, src, tgt, variables


def test_same_parameters_under_both_implementations(tiny):
  cfg, src, tgt, variables = tiny
  fused = jax.jit(tj.Transformer(cfg.replace(norm_impl="pallas")).init)(
      jax.random.key(0), src, tgt)
  same = jax.tree.map(lambda a, b: a.shape == b.shape and bool(jnp.all(a == b)),
                      nn.meta.unbox(variables), nn.meta.unbox(fused))
  assert all(jax.tree.leaves(same))
  assert jax.tree.structure(variables) == jax.tree.structure(fused)  # logical names too


@pytest.mark.parametrize("deterministic", [False, True])
def test_model_loss_and_gradients_equal_the_unfused_model(tiny, deterministic):
  # Dropout on: the same masks are drawn, so the loss is the same to float rounding (a
  # different mask would move it by far more than the tolerance).
  cfg, src, tgt, variables = tiny
  params = nn.meta.unbox(variables["params"])
  weights = (tgt != 0).astype(jnp.float32)

  def loss_of(impl):
    model = tj.Transformer(cfg.replace(norm_impl=impl, deterministic=deterministic))

    def loss(p):
      logits = model.apply({"params": p}, src, tgt, rngs={"dropout": jax.random.key(5)})
      nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), tgt[..., None], -1)[..., 0]
      return jnp.sum(nll * weights) / jnp.sum(weights)
    return jax.jit(jax.value_and_grad(loss))(params)

  ref_loss, ref_grads = loss_of("xla")
  loss, grads = loss_of("pallas")
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
  for path, g in jax.tree_util.tree_flatten_with_path(grads)[0]:
    r = ref_grads
    for key in path:
      r = r[key.key]
    assert rel(g, r) < 1e-5, jax.tree_util.keystr(path)
  if not deterministic:  # dropout did act: another key gives another loss
    other = tj.Transformer(cfg.replace(norm_impl="pallas")).apply(
        {"params": params}, src, tgt, rngs={"dropout": jax.random.key(6)})
    same = tj.Transformer(cfg.replace(norm_impl="pallas")).apply(
        {"params": params}, src, tgt, rngs={"dropout": jax.random.key(5)})
    assert not np.allclose(other, same, atol=1e-3)
