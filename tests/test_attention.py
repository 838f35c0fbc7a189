"""The attention equation, the masks and the position encoding against direct NumPy computations."""
import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer_jax as tj


def numpy_attention(q, k, v, mask=None):
  logits = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
  if mask is not None:
    logits = np.where(mask, logits, -np.inf)
  with np.errstate(invalid="ignore"):
    w = np.exp(logits - logits.max(-1, keepdims=True))
    w = w / w.sum(-1, keepdims=True)
  w = np.nan_to_num(w, nan=0.0)  # fully masked rows: zeros
  return w @ v, w


@pytest.fixture(scope="module")
def qkv():
  rng = np.random.default_rng(0)
  q = rng.normal(size=(2, 3, 5, 8)).astype(np.float32)
  k = rng.normal(size=(2, 3, 6, 8)).astype(np.float32)
  v = rng.normal(size=(2, 3, 6, 4)).astype(np.float32)
  return q, k, v


def test_attention_matches_numpy_without_mask(qkv):
  q, k, v = qkv
  out, w = tj.scaled_dot_product_attention(q, k, v)
  ref_out, ref_w = numpy_attention(q, k, v)
  np.testing.assert_allclose(out, ref_out, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(w, ref_w, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(w).sum(-1), 1.0, rtol=1e-5)


def test_attention_matches_numpy_with_mask_and_zero_rows(qkv):
  q, k, v = qkv
  mask = np.random.default_rng(1).random((2, 1, 5, 6)) > 0.4
  mask[0, 0, 2, :] = False  # one fully masked query row
  out, w = tj.scaled_dot_product_attention(q, k, v, mask=mask)
  ref_out, ref_w = numpy_attention(q, k, v, mask)
  assert np.all(np.isfinite(out))
  np.testing.assert_allclose(out, ref_out, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(w, ref_w, rtol=1e-5, atol=1e-6)
  assert np.all(np.asarray(out)[0, :, 2] == 0.0)
  assert np.all(np.asarray(w)[~np.broadcast_to(mask, w.shape)] == 0.0)


def test_attention_dropout_is_seeded_and_rescaled(qkv):
  q, k, v = qkv
  a, w = tj.scaled_dot_product_attention(q, k, v, dropout_rate=0.5, dropout_rng=jax.random.key(0))
  b, _ = tj.scaled_dot_product_attention(q, k, v, dropout_rate=0.5, dropout_rng=jax.random.key(0))
  c, _ = tj.scaled_dot_product_attention(q, k, v, dropout_rate=0.5, dropout_rng=jax.random.key(1))
  ref, ref_w = numpy_attention(q, k, v)
  np.testing.assert_array_equal(a, b)
  assert not np.allclose(a, c)
  np.testing.assert_allclose(w, ref_w, rtol=1e-5, atol=1e-6)  # weights are pre-dropout
  # Inverted dropout keeps the expectation: averaged over many keys it approaches the reference.
  outs = [tj.scaled_dot_product_attention(q, k, v, dropout_rate=0.5,
                                          dropout_rng=jax.random.key(i))[0]
          for i in range(200)]
  np.testing.assert_allclose(np.mean(outs, 0), ref, atol=0.15)
  # No key (evaluation, decoding): no dropout whatever the rate.
  d, _ = tj.scaled_dot_product_attention(q, k, v, dropout_rate=0.5, dropout_rng=None)
  np.testing.assert_allclose(d, ref, rtol=1e-5, atol=1e-5)
  # A key and no rate: the rate defaults to 0, nothing is dropped.
  e, _ = tj.scaled_dot_product_attention(q, k, v, dropout_rng=jax.random.key(0))
  np.testing.assert_allclose(e, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rate", [0.1, 0.3, 0.5])
def test_dropout_mask_rate_and_scale(rate):
  from transformer_jax.attention import dropout, keep_mask
  # An odd last axis: 16-bit numbers come two per word and the extra half is cut off.
  shape = (64, 33, 257)
  keep, keep_prob = keep_mask(jax.random.key(3), rate, shape)
  assert keep.shape == shape and keep.dtype == jnp.bool_
  assert keep_prob == pytest.approx(1 - rate, abs=1 / 65536)
  # Exactly the probability that a uniform 16-bit number is at or above the threshold: the
  # factor the kept values are scaled by, so the expectation is kept exactly.
  assert keep_prob == np.mean(np.arange(65536) >= round(rate * 65536))
  n = keep.size
  # Within 5 standard deviations of the binomial count.
  assert abs(float(keep.mean()) - keep_prob) < 5 * math.sqrt(keep_prob * (1 - keep_prob) / n)
  # Columns are independent of their neighbours (the two halves of one word are not copies).
  k = np.asarray(keep)
  both = (k[..., 0:256:2] & k[..., 1:257:2]).mean()
  assert abs(both - keep_prob**2) < 0.01
  x = jnp.full(shape, 2.0)
  y = np.asarray(dropout(jax.random.key(3), rate, x))
  np.testing.assert_array_equal(y == 0, ~k)
  np.testing.assert_allclose(y[k], 2.0 / keep_prob, rtol=1e-6)
  assert not np.array_equal(np.asarray(keep_mask(jax.random.key(4), rate, shape)[0]), k)


def test_dropout_mask_edges():
  from transformer_jax.attention import dropout, keep_mask
  key = jax.random.key(0)
  none, p = keep_mask(key, 1.0, (4, 9))
  assert p == 0.0 and not bool(none.any())   # 65536 does not wrap around in 16 bits
  assert bool(keep_mask(key, 0.0, (4, 9))[0].all())
  assert keep_mask(key, 0.1, (0, 9))[0].shape == (0, 9)
  np.testing.assert_array_equal(dropout(key, 1.0, jnp.ones((2, 3))), 0.0)
  for bad in (-0.1, 1.5):
    with pytest.raises(ValueError, match="dropout rate"):
      keep_mask(key, bad, (2, 3))


def test_masks():
  np.testing.assert_array_equal(tj.causal_mask(3)[0, 0],
                                [[1, 0, 0], [1, 1, 0], [1, 1, 1]])
  pm = tj.padding_mask(jnp.array([[1, 1, 0]]), jnp.array([[1, 0]]))
  assert pm.shape == (1, 1, 3, 2)
  np.testing.assert_array_equal(pm[0, 0], [[1, 0], [1, 0], [0, 0]])
  seg = jnp.array([[1, 1, 2, 0]])
  sm = tj.segment_mask(seg, seg)[0, 0]
  np.testing.assert_array_equal(sm, [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]])
  assert tj.combine_masks(None, None) is None
  combined = tj.combine_masks(tj.causal_mask(4), tj.segment_mask(seg, seg))
  np.testing.assert_array_equal(combined[0, 0],
                                [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]])


def test_length_mask_is_the_dense_mask_of_right_padded_rows():
  valid_q = jnp.array([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], bool)
  valid_k = jnp.array([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]], bool)
  lq, lk = tj.row_lengths(valid_q), tj.row_lengths(valid_k)
  np.testing.assert_array_equal(lq, [3, 1, 0])
  np.testing.assert_array_equal(lk, [2, 5, 0])
  assert lq.dtype == jnp.int32   # what jax.nn.dot_product_attention takes
  np.testing.assert_array_equal(tj.LengthMask(lq, lk).dense(4, 5),
                                tj.padding_mask(valid_q, valid_k))
  causal = tj.LengthMask(lq, lq, causal=True).dense(4, 4)
  np.testing.assert_array_equal(
      causal, tj.combine_masks(tj.causal_mask(4), tj.padding_mask(valid_q, valid_q)))
  # A pad inside a row counts as a real token: one past the last real one.
  np.testing.assert_array_equal(tj.row_lengths(jnp.array([[1, 0, 1, 0]], bool)), [3])
  # A pytree whose lengths are traced and whose causal flag stays static (through remat too).
  leaves, _ = jax.tree_util.tree_flatten(tj.LengthMask(lq, lq, causal=True))
  assert len(leaves) == 2
  count = jax.jit(jax.checkpoint(lambda m: m.dense(4, 4).sum()))
  assert int(count(tj.LengthMask(lq, lq, causal=True))) == 6 + 1
  assert int(count(tj.LengthMask(lq, lq))) == 9 + 1
  with pytest.raises(dataclasses.FrozenInstanceError):   # a value, as the dense masks are
    tj.LengthMask(lq, lq).causal = True


def test_sinusoidal_position_encoding_formula():
  length, dim, base = 50, 16, 10000.0   # the paper's base is the default
  pe = np.asarray(tj.sinusoidal_position_encoding(length, dim))
  assert pe.shape == (length, dim)
  for pos in range(length):
    for i in range(dim // 2):
      angle = pos / base ** (2 * i / dim)
      assert pe[pos, 2 * i] == pytest.approx(math.sin(angle), abs=1e-6)
      assert pe[pos, 2 * i + 1] == pytest.approx(math.cos(angle), abs=1e-6)
  with pytest.raises(ValueError, match="even"):
    tj.sinusoidal_position_encoding(4, 5)


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_keep_mask_keeps_exactly_its_probability_of_the_16_bit_numbers(monkeypatch, rate):
  # With every 16-bit number drawn exactly once (random bits replaced by 0, 1, ..., 65535), the
  # mask keeps exactly keep_prob * 65536 of them: the threshold's boundary is counted once.
  from transformer_jax import attention
  from transformer_jax.attention import keep_mask
  every = np.arange(65536, dtype=np.uint16).view(np.uint32).reshape(1, 32768)
  monkeypatch.setattr(attention, "random_bits", lambda *a, **k: jnp.asarray(every))
  keep, keep_prob = keep_mask(jax.random.key(0), rate, (1, 65536))
  assert int(np.asarray(keep).sum()) == round(keep_prob * 65536) == 65536 - round(rate * 65536)


@pytest.mark.parametrize("shape", [(1,), (3,), (16, 4, 64, 32), (5, 7, 9), (2, 3, 1, 4), (0, 9)])
def test_random_bits_are_jax_random_bits(shape):
  # The unrolled threefry gives JAX's own bits, for typed and raw keys, keys made by fold_in
  # (as Flax's make_rng does), under jit, and on the fallback paths.
  from transformer_jax.attention import random_bits
  keys = [jax.random.key(0), jax.random.PRNGKey(7), jax.random.fold_in(jax.random.key(123), 9),
          jax.random.key(2**31 + 5), jax.random.key(1, impl="rbg")]
  jitted = jax.jit(random_bits, static_argnums=1)
  for key in keys:
    want = np.asarray(jax.random.bits(key, shape, jnp.uint32))
    for got in (random_bits(key, shape), jitted(key, shape)):
      assert got.dtype == jnp.uint32 and got.shape == shape
      np.testing.assert_array_equal(np.asarray(got), want)
  with jax.threefry_partitionable(False):
    key = jax.random.key(3)
    np.testing.assert_array_equal(random_bits(key, shape), jax.random.bits(key, shape, jnp.uint32))


def test_random_bits_take_their_own_path_only_where_they_equal_jax():
  # The equality test above would also pass if every key fell back to jax.random.bits: check
  # which path each case takes (JAX's random-bits or threefry primitive in the traced program).
  from transformer_jax.attention import random_bits

  def uses_jax(key, shape):
    program = str(jax.make_jaxpr(lambda k: random_bits(k, shape))(key))
    return "random_bits[" in program or "threefry2x32" in program

  for key in (jax.random.key(0), jax.random.PRNGKey(7), jax.random.fold_in(jax.random.key(1), 2)):
    assert not uses_jax(key, (4, 5))
  assert uses_jax(jax.random.key(0), (2**16, 2**16))   # 2^32 elements: the index needs 64 bits
  assert not uses_jax(jax.random.key(0), (2**16 - 1, 2**16 + 1))   # 2^32 - 1: it does not
  assert uses_jax(jax.random.key(0), ())
  with jax.threefry_partitionable(False):
    assert uses_jax(jax.random.key(0), (4, 5))
  assert uses_jax(jax.random.key(0, impl="rbg"), (4, 5))
  np.testing.assert_array_equal(random_bits(jax.random.key(5), ()),
                                jax.random.bits(jax.random.key(5), (), jnp.uint32))
  # A batch of keys is JAX's to refuse; the hash would broadcast it against the last axis.
  batch = jax.random.split(jax.random.key(0), 2)
  with pytest.raises(Exception) as jax_error:
    jax.random.bits(batch, (3, 2), jnp.uint32)
  with pytest.raises(type(jax_error.value)):
    random_bits(batch, (3, 2))


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="JAX's rolled threefry is CPU's")
def test_random_bits_compile_to_one_pass_without_a_loop():
  # Why random_bits exists: on CPU jax.random.bits compiles to a rolled while loop; this must not.
  from transformer_jax.attention import keep_mask
  hlo = jax.jit(lambda k: keep_mask(k, 0.1, (16, 64, 256))[0]).lower(
      jax.random.key(0)).compile().as_text()
  assert " while(" not in hlo
  rolled = jax.jit(lambda k: jax.random.bits(k, (16, 64, 128), jnp.uint32)).lower(
      jax.random.key(0)).compile().as_text()
  # The check above can see a loop: JAX's own bits have one on CPU. (Should a JAX upgrade unroll
  # them, this fails, and random_bits may no longer be needed.)
  assert " while(" in rolled
