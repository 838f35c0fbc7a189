"""The Transformer's guarantees: causality, padding, packing, decoding, gradients, sizes."""
import dataclasses
import functools
import os

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import transformer_jax as tj
from transformer_jax.config import CHOICES

VOCAB = 40


def make(norm="post", **overrides):
  cfg = tj.model_config("tiny", vocab_size=VOCAB, norm_position=norm, **overrides)
  return cfg, tj.Transformer(cfg.replace(deterministic=True))


def random_tokens(seed, shape):
  return jax.random.randint(jax.random.key(seed), shape, 4, VOCAB)


@pytest.fixture(scope="module", params=["post", "pre"])
def setup(request):
  cfg, model = make(request.param)
  params = jax.jit(model.init)(jax.random.key(0), random_tokens(0, (2, 9)),
                               random_tokens(1, (2, 7)))["params"]
  apply = jax.jit(lambda p, *a, **k: model.apply({"params": p}, *a, **k))
  return cfg, model, params, apply


@functools.partial(jax.jit, static_argnums=0)
def logits_of(cfg, params, *args):
  """The logits of `cfg`'s model, compiled once per config and shapes for the module's tests
  (the whole model op by op costs more)."""
  return tj.Transformer(cfg).apply({"params": params}, *args)


def test_causality(setup):
  cfg, _, params, apply = setup
  src, tgt = random_tokens(2, (2, 9)), random_tokens(3, (2, 7))
  base = apply(params, src, tgt)
  for t in range(7):
    changed = tgt.at[:, t].set((tgt[:, t] + 1 - 4) % (VOCAB - 4) + 4)
    out = apply(params, src, changed)
    # Position i predicts target i from targets < i: positions <= t must not move.
    np.testing.assert_allclose(out[:, :t + 1], base[:, :t + 1], atol=1e-5)
    if t < 6:
      assert not np.allclose(out[:, t + 1:], base[:, t + 1:], atol=1e-5)


def test_padding_does_not_leak(setup):
  cfg, _, params, apply = setup
  src, tgt = random_tokens(4, (2, 9)), random_tokens(5, (2, 7))
  src = src.at[:, 6:].set(cfg.pad_id)
  tgt = tgt.at[:, 5:].set(cfg.pad_id)
  base = apply(params, src, tgt)
  # More padding on the right changes nothing at real positions.
  longer = apply(params, jnp.pad(src, ((0, 0), (0, 5))), jnp.pad(tgt, ((0, 0), (0, 4))))
  np.testing.assert_allclose(longer[:, :5], base[:, :5], atol=1e-5)
  # With segment ids, padding is where the segment is 0: whatever tokens sit there are ignored.
  seg_s, seg_t = (src != 0).astype(jnp.int32), (tgt != 0).astype(jnp.int32)
  pos_s = jnp.broadcast_to(jnp.arange(9), src.shape)
  pos_t = jnp.broadcast_to(jnp.arange(7), tgt.shape)
  garbage_src = jnp.where(seg_s > 0, src, random_tokens(6, src.shape))
  garbage_tgt = jnp.where(seg_t > 0, tgt, random_tokens(7, tgt.shape))
  out = apply(params, garbage_src, garbage_tgt, pos_s, pos_t, seg_s, seg_t)
  np.testing.assert_allclose(out[:, :5], base[:, :5], atol=1e-5)
  # Changing a real source token does change the output (the test can fail).
  moved = apply(params, src.at[:, 0].set(src[:, 0] % (VOCAB - 5) + 5), tgt)
  assert not np.allclose(moved[:, :5], base[:, :5], atol=1e-5)


def test_packed_equals_separate(setup):
  cfg, _, params, apply = setup
  s1, t1 = random_tokens(8, (1, 4)), random_tokens(9, (1, 3))
  s2, t2 = random_tokens(10, (1, 5)), random_tokens(11, (1, 4))
  alone1 = apply(params, s1, t1)
  alone2 = apply(params, s2, t2)

  def pad(x, n):
    return jnp.pad(x, ((0, 0), (0, n)))

  src = pad(jnp.concatenate([s1, s2], 1), 2)          # 4 + 5 + 2 padding
  tgt = pad(jnp.concatenate([t1, t2], 1), 1)          # 3 + 4 + 1 padding
  src_seg = jnp.array([[1] * 4 + [2] * 5 + [0] * 2])
  tgt_seg = jnp.array([[1] * 3 + [2] * 4 + [0]])
  src_pos = jnp.array([list(range(4)) + list(range(5)) + [0, 0]])
  tgt_pos = jnp.array([list(range(3)) + list(range(4)) + [0]])
  packed = apply(params, src, tgt, src_pos, tgt_pos, src_seg, tgt_seg)
  np.testing.assert_allclose(packed[:, :3], alone1, atol=1e-5)
  np.testing.assert_allclose(packed[:, 3:7], alone2, atol=1e-5)


def test_sinusoidal_rows_longer_than_max_len(setup):
  cfg, _, params, apply = setup
  src, tgt = random_tokens(22, (1, cfg.max_len + 9)), random_tokens(23, (1, cfg.max_len + 3))
  out = apply(params, src, tgt)
  assert np.all(np.isfinite(out))
  np.testing.assert_allclose(apply(params, src, tgt[:, :5]), out[:, :5], atol=1e-5)


def test_shift_right_restarts_each_segment():
  tgt = jnp.array([[11, 12, 13, 21, 22, 0]])
  seg = jnp.array([[1, 1, 1, 2, 2, 0]])
  np.testing.assert_array_equal(tj.shift_right(tgt, 2), [[2, 11, 12, 13, 21, 22]])
  np.testing.assert_array_equal(tj.shift_right(tgt, 2, seg), [[2, 11, 12, 2, 21, 2]])


def greedy_cached_logits(cfg, params, src, decoder_inputs):
  dcfg = cfg.replace(deterministic=True, decode=True)
  model = tj.Transformer(dcfg)
  cache = tj.init_cache(dcfg, src.shape[0], src.shape[1], decoder_inputs.shape[1])
  p = {"params": params}
  encoded = model.apply(p, src, method=tj.Transformer.encode)
  _, mut = model.apply({**p, "cache": cache}, encoded, src, method=tj.Transformer.prime_cache,
                       mutable=["cache"])
  cache, outs = mut["cache"], []
  step = jax.jit(lambda c, tok: model.apply({**p, "cache": c}, tok,
                                            method=tj.Transformer.decode_step, mutable=["cache"]))
  for t in range(decoder_inputs.shape[1]):
    logits, mut = step(cache, decoder_inputs[:, t:t + 1])
    cache = mut["cache"]
    outs.append(logits)
  return jnp.concatenate(outs, 1), cache


def test_cached_decoding_equals_teacher_forcing(setup):
  cfg, _, params, apply = setup
  src, tgt = random_tokens(12, (3, 9)), random_tokens(13, (3, 6))
  src = src.at[1, 5:].set(cfg.pad_id)  # a padded source in the batch
  full = apply(params, src, tgt)
  stepwise, cache = greedy_cached_logits(cfg, params, src, tj.shift_right(tgt, cfg.bos_id))
  np.testing.assert_allclose(stepwise, full, atol=1e-5)
  # The fused-attention path reads the same head-major cache.
  fused, _ = greedy_cached_logits(cfg.replace(attention_impl="cudnn"), params, src,
                                  tj.shift_right(tgt, cfg.bos_id))
  np.testing.assert_allclose(fused, full, atol=1e-5)
  # The encoder-decoder keys/values were computed once (prime) and are only read afterwards.
  cross = cache["decoder"]["layer_0"]["cross_attention"]["kv_cache"]
  assert cross["cross_key"].shape == (3, cfg.num_heads, 9, cfg.head_dim)  # head-major
  assert not np.asarray(cross["cross_valid"])[1, 5:].any()
  # A decode step takes one position per sentence; two are refused, naming the count.
  dcfg = cfg.replace(deterministic=True, decode=True)
  with pytest.raises(ValueError, match="one target position per call, got 2"):
    tj.Transformer(dcfg).apply({"params": params, "cache": cache}, tgt[:, :2],
                               method=tj.Transformer.decode_step, mutable=["cache"])


def test_gradients_finite_and_nonzero_for_every_parameter(setup):
  cfg, _, params, _ = setup   # the module's initial parameters, post and pre: no init to compile
  model = tj.Transformer(cfg)  # dropout on
  src, tgt = random_tokens(14, (2, 8)), random_tokens(15, (2, 6))
  params = nn.meta.unbox(params)

  def loss(p):
    logits = model.apply({"params": p}, src, tgt, rngs={"dropout": jax.random.key(2)})
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tgt[..., None], -1))

  grads = jax.jit(jax.grad(loss))(params)
  for path, g in jax.tree_util.tree_flatten_with_path(grads)[0]:
    assert np.all(np.isfinite(g)), path
    assert np.any(g != 0), path


def test_every_parameter_has_logical_axis_names():
  cfg, model = make("pre", tie_output_embedding=False, position_encoding="learned")
  # The names are the boxes' metadata: traced (eval_shape), not computed, they are the same.
  variables = jax.eval_shape(model.init, jax.random.key(0), random_tokens(0, (1, 4)),
                             random_tokens(1, (1, 3)))
  leaves = jax.tree.leaves(variables["params"], is_leaf=lambda x: isinstance(x, nn.Partitioned))
  assert leaves and all(isinstance(x, nn.Partitioned) for x in leaves)
  for box in leaves:
    assert len(box.names) == box.value.ndim
  specs = nn.get_partition_spec(variables)["params"]
  assert specs["shared_embedding"]["embedding"] == jax.sharding.PartitionSpec("vocab", "embed")
  q = specs["encoder"]["layer_0"]["self_attention"]["query"]["kernel"]
  assert q == jax.sharding.PartitionSpec("embed", "heads", "kv")


def hand_count(V, d, f, n, final_norms=0):
  attention = 4 * d * d                  # W^Q, W^K, W^V, W^O (no biases, as the paper)
  ffn = d * f + f + f * d + d            # W_1, b_1, W_2, b_2
  norm = 2 * d                           # LayerNorm gain and bias
  encoder_layer = attention + ffn + 2 * norm
  decoder_layer = 2 * attention + ffn + 3 * norm
  return V * d + n * (encoder_layer + decoder_layer) + final_norms * norm  # one shared, tied V x d


@pytest.mark.parametrize("size,expected_millions", [("base", 63.05), ("big", 214.17)])
def test_parameter_counts_of_paper_sizes(size, expected_millions):
  cfg = tj.model_config(size, vocab_size=37000)
  model = tj.Transformer(cfg)
  shapes = jax.eval_shape(model.init, jax.random.key(0), jnp.ones((1, 8), jnp.int32),
                          jnp.ones((1, 8), jnp.int32))["params"]
  count = tj.count_params(shapes)
  assert count == hand_count(37000, cfg.d_model, cfg.d_ff, 6)
  assert count / 1e6 == pytest.approx(expected_millions, abs=0.01)
  assert tj.count_params(shapes, non_embedding=True) == count - 37000 * cfg.d_model
  pre = tj.Transformer(cfg.replace(norm_position="pre"))
  pre_shapes = jax.eval_shape(pre.init, jax.random.key(0), jnp.ones((1, 8), jnp.int32),
                              jnp.ones((1, 8), jnp.int32))["params"]
  assert tj.count_params(pre_shapes) == hand_count(37000, cfg.d_model, cfg.d_ff, 6, final_norms=2)


def test_fused_attention_path_matches_reference(setup):
  cfg, _, params, apply = setup
  src, tgt = random_tokens(16, (2, 9)), random_tokens(17, (2, 7))
  src = src.at[0, 6:].set(0)
  tgt = tgt.at[0, 4:].set(0)

  def logits(**fields):
    return logits_of(cfg.replace(deterministic=True, **fields), params, src, tgt)

  ref = apply(params, src, tgt)
  out = logits(attention_impl="cudnn")
  np.testing.assert_allclose(out[1], ref[1], atol=1e-5)
  np.testing.assert_allclose(out[0, :4], ref[0, :4], atol=1e-5)
  # In bfloat16 too (cuDNN's kernel on GPUs; elsewhere XLA's, which is what runs here).
  out = logits(attention_impl="cudnn", dtype="bfloat16")
  ref = logits(dtype="bfloat16")
  np.testing.assert_allclose(np.asarray(out[1], np.float32), np.asarray(ref[1], np.float32),
                             atol=0.1)


def right_padded(seed, shape, lengths):
  return jnp.where(jnp.arange(shape[1]) < jnp.array(lengths)[:, None],
                   random_tokens(seed, shape), 0)


@pytest.mark.parametrize("remat", ["none", "layer"])
def test_padding_as_lengths_gives_the_dense_masks_results(setup, remat):
  # Unpacked rows reach cuDNN as lengths (LengthMask); everything must be as with the dense
  # mask: logits everywhere (padding rows too), the loss and every gradient. Row 2 has an empty
  # source (its cross-attention rows attend nowhere), row 1 no padding at all. With remat, the
  # mask passes through jax.checkpoint (its causal flag static).
  cfg, _, params, _ = setup
  src, tgt = right_padded(30, (3, 9), [6, 9, 0]), right_padded(31, (3, 7), [4, 7, 5])
  cot = jax.random.normal(jax.random.key(32), (3, 7, VOCAB)) * (tgt != 0)[..., None]

  def run(padding_as_lengths):
    model = tj.Transformer(cfg.replace(deterministic=True, attention_impl="cudnn", remat=remat,
                                       padding_as_lengths=padding_as_lengths))
    logits, vjp = jax.vjp(lambda p: model.apply({"params": p}, src, tgt), params)
    return logits, vjp(cot)[0]

  (lengths, lengths_grads), (dense, dense_grads) = run(True), run(False)
  np.testing.assert_allclose(lengths, dense, atol=1e-5)
  for a, b in zip(jax.tree.leaves(lengths_grads), jax.tree.leaves(dense_grads)):
    np.testing.assert_allclose(a, b, atol=1e-5)
  assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(lengths_grads)) > 0


def test_unpacked_rows_reach_the_fused_kernel_as_lengths_and_packed_rows_as_a_mask(monkeypatch):
  cfg = tj.model_config("tiny", vocab_size=VOCAB, attention_impl="cudnn", deterministic=True)
  src, tgt = right_padded(33, (3, 9), [6, 9, 0]), right_padded(34, (3, 7), [4, 7, 5])
  model = tj.Transformer(cfg)
  params = jax.jit(model.init)(jax.random.key(0), src, tgt)["params"]  # before the spy: traced
  calls = []
  real = jax.nn.dot_product_attention

  def spy(q, k, v, bias=None, mask=None, **kw):
    lengths = [kw.get(f"{side}_seq_lengths") for side in ("query", "key_value")]
    calls.append((mask is None, kw.get("is_causal", False),
                  *(None if n is None else np.asarray(n).tolist() for n in lengths)))
    return real(q, k, v, bias, mask, **kw)

  monkeypatch.setattr(jax.nn, "dot_product_attention", spy)
  model.apply({"params": params}, src, tgt)
  encoder = (True, False, [6, 9, 1], [6, 9, 1])   # no mask; lengths, an empty row given 1
  decoder_self = (True, True, [4, 7, 5], [4, 7, 5])
  cross = (True, False, [4, 7, 5], [6, 9, 1])
  assert calls == [encoder] * 2 + [decoder_self, cross] * 2
  # The dense mask when asked for, and for packed rows whatever the setting.
  calls.clear()
  tj.Transformer(cfg.replace(padding_as_lengths=False)).apply({"params": params}, src, tgt)
  assert calls == [(False, False, None, None)] * 6
  calls.clear()
  seg_s, seg_t = (src != 0).astype(jnp.int32), (tgt != 0).astype(jnp.int32)
  model.apply({"params": params}, src, tgt, None, None, seg_s, seg_t)
  assert calls == [(False, False, None, None)] * 6


def value_and_vjp(fn, args, cot):
  """`fn(*args)` and its vector-Jacobian product with `cot`, compiled as one program: cheaper
  than the forward and backward passes op by op."""
  def both(*args):
    out, vjp = jax.vjp(fn, *args)
    return out, vjp(cot)
  return jax.jit(both)(*args)


def test_fused_attention_of_lengths_equals_its_dense_mask():
  # Dead rows (padding queries, and every query of a row with no keys) come out as zeros, and
  # no gradient is lost or made up elsewhere.
  cfg = tj.model_config("tiny", attention_impl="cudnn", attention_dropout_rate=0.0)
  q = jax.random.normal(jax.random.key(0), (3, 5, cfg.num_heads, cfg.head_dim))
  k = jax.random.normal(jax.random.key(1), (3, 7, cfg.num_heads, cfg.head_dim))
  v = jax.random.normal(jax.random.key(2), (3, 7, cfg.num_heads, cfg.head_dim))
  for mask in (tj.LengthMask(jnp.array([5, 2, 3]), jnp.array([7, 4, 0])),
               tj.LengthMask(jnp.array([5, 2, 0]), jnp.array([5, 2, 0]), causal=True)):
    kv_len = 5 if mask.causal else 7
    args = (q, k[:, :kv_len], v[:, :kv_len])
    dense = mask.dense(5, kv_len)
    cot = jax.random.normal(jax.random.key(3), q.shape)
    out, grads = value_and_vjp(lambda *a, m=mask: tj.layers.fused_attention(cfg, *a, m), args, cot)
    ref, ref_grads = value_and_vjp(lambda *a, m=dense: tj.layers.fused_attention(cfg, *a, m),
                                   args, cot)
    np.testing.assert_allclose(out, ref, atol=1e-6)
    live = np.asarray(dense.any(-1))[:, 0]
    assert not live.all() and np.all(np.asarray(out)[~live] == 0)
    for a, b in zip(grads, ref_grads):
      np.testing.assert_allclose(a, b, atol=1e-6)


def test_dead_rows_of_lengths_are_replaced_whatever_the_kernel_writes_there(monkeypatch):
  # What cuDNN leaves in padding rows is not documented: every dead row (a padding query, a
  # row without keys) must be replaced, the live ones (a single key included) kept.
  from transformer_jax import layers
  monkeypatch.setattr(jax.nn, "dot_product_attention",
                      lambda q, k, v, **kw: jnp.full_like(q, 7.0))
  cfg = tj.model_config("tiny", attention_impl="cudnn", attention_dropout_rate=0.0)
  q = jnp.ones((3, 5, cfg.num_heads, cfg.head_dim))
  mask = tj.LengthMask(jnp.array([5, 2, 3]), jnp.array([1, 4, 0]))
  out = np.asarray(layers.fused_attention(cfg, q, q, q, mask))
  live = np.asarray(mask.dense(5, 5).any(-1))[:, 0]
  assert live.sum() == 5 + 2 and live[0].all()   # row 0: one key, every query live
  np.testing.assert_array_equal(out[live], 7.0)
  np.testing.assert_array_equal(out[~live], 0.0)


def test_the_xla_path_takes_a_length_mask_as_its_dense_mask():
  cfg = tj.model_config("tiny", attention_dropout_rate=0.0, deterministic=True)
  x = jax.random.normal(jax.random.key(0), (2, 5, cfg.d_model))
  kv = jax.random.normal(jax.random.key(1), (2, 7, cfg.d_model))
  attention = tj.layers.MultiHeadAttention(cfg, cache="cross")
  mask = tj.LengthMask(jnp.array([5, 3]), jnp.array([4, 7]))
  params = attention.init(jax.random.key(2), x, kv, mask.dense(5, 7))
  np.testing.assert_allclose(attention.apply(params, x, kv, mask),
                             attention.apply(params, x, kv, mask.dense(5, 7)), atol=1e-6)
  assert not np.allclose(attention.apply(params, x, kv, mask),
                         attention.apply(params, x, kv, mask.dense(5, 5 + 2)[:, :, :, ::-1]))


def test_fused_attention_never_gives_the_kernel_an_empty_row(monkeypatch):
  # cuDNN's backward gave NaN gradients for packed cross-attention with query rows that may
  # attend nowhere (measured on an H100, docs/benchmarks.md); such rows get a full row instead
  # and their output is zeroed afterwards. Checked here on the mask the kernel receives.
  from transformer_jax import layers
  seen = []
  real = jax.nn.dot_product_attention

  def spy(q, k, v, mask=None, **kw):
    seen.append(np.asarray(mask))
    return real(q, k, v, mask=mask, **kw)

  monkeypatch.setattr(jax.nn, "dot_product_attention", spy)
  cfg = tj.model_config("tiny", attention_impl="cudnn", attention_dropout_rate=0.0)
  q = jax.random.normal(jax.random.key(0), (2, 5, cfg.num_heads, cfg.head_dim))
  k = jax.random.normal(jax.random.key(1), (2, 7, cfg.num_heads, cfg.head_dim))
  seg_q = jnp.array([[1, 1, 2, 0, 0], [1, 2, 2, 2, 0]])
  seg_k = jnp.array([[1, 2, 2, 0, 0, 0, 0], [1, 1, 1, 2, 2, 2, 0]])
  mask = tj.segment_mask(seg_q, seg_k)
  out, vjp = jax.vjp(lambda q, k: layers.fused_attention(cfg, q, k, k, mask), q, k)
  assert seen and all(m.any(axis=-1).all() for m in seen)
  np.testing.assert_array_equal(np.asarray(out)[np.asarray(seg_q) == 0], 0.0)
  grads = vjp(jnp.ones_like(out))
  assert all(np.isfinite(np.asarray(g)).all() for g in grads)


@pytest.mark.parametrize("bias", [True, False])
def test_fused_attention_module_matches_reference_on_rows_that_attend_nowhere(bias):
  # The fused path replaces a dead row (a query that may attend nowhere) after the output
  # projection, with the projection of zeros: the bias, or zero. Its output and every gradient
  # must be the reference's, which zeroes the row before the projection.
  cfg = tj.model_config("tiny", attention_bias=bias, attention_dropout_rate=0.0,
                        deterministic=True)
  x = jax.random.normal(jax.random.key(0), (2, 5, cfg.d_model))
  kv = jax.random.normal(jax.random.key(1), (2, 7, cfg.d_model))
  mask = tj.segment_mask(jnp.array([[1, 1, 2, 0, 0], [1, 2, 2, 2, 0]]),
                         jnp.array([[1, 2, 2, 0, 0, 0, 0], [1, 1, 1, 2, 2, 2, 0]]))
  ref = tj.layers.MultiHeadAttention(cfg, cache="cross")
  fused = tj.layers.MultiHeadAttention(cfg.replace(attention_impl="cudnn"), cache="cross")
  params = nn.meta.unbox(ref.init(jax.random.key(2), x, kv, mask)["params"])
  if bias:  # nonzero biases, so a dead row's output is not zero by accident
    params = jax.tree_util.tree_map_with_path(
        lambda path, p: p + 0.5 if path[-1].key == "bias" else p, params)
  cot = jax.random.normal(jax.random.key(3), x.shape)

  def value_and_grads(module):
    return value_and_vjp(lambda p, x, kv: module.apply({"params": p}, x, kv, mask),
                         (params, x, kv), cot)

  (ref_out, ref_grads), (out, grads) = value_and_grads(ref), value_and_grads(fused)
  dead = np.array([[0, 0, 0, 1, 1], [0, 0, 0, 0, 1]], bool)
  expected = np.broadcast_to(params["out"]["bias"] if bias else 0.0, out[dead].shape)
  np.testing.assert_allclose(out[dead], expected, atol=1e-6)
  np.testing.assert_allclose(out, ref_out, atol=1e-5)
  for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
    np.testing.assert_allclose(a, b, atol=1e-5)
  assert np.abs(np.asarray(grads[1])[dead]).max() == 0.0   # no gradient reaches a dead query


def test_bfloat16_compute_stays_close_to_float32(setup):
  cfg, _, params, apply = setup
  src, tgt = random_tokens(18, (2, 9)), random_tokens(19, (2, 7))
  out = logits_of(cfg.replace(deterministic=True, dtype="bfloat16"), params, src, tgt)
  assert out.dtype == jnp.bfloat16
  ref = apply(params, src, tgt)
  probs = jax.nn.softmax(out.astype(jnp.float32))
  np.testing.assert_allclose(probs, jax.nn.softmax(ref), atol=0.03)


def test_variants_run():
  src, tgt = random_tokens(20, (2, 6)), random_tokens(21, (2, 5))
  # remat="layer" is left to test_padding_as_lengths_gives_the_dense_masks_results (gradients
  # included).
  for overrides in [dict(position_encoding="learned", activation="gelu", use_bias=False,
                         kernel_init="normal", scale_embeddings=False),
                    dict(attention_bias=True, share_embeddings=False, tie_output_embedding=False,
                         target_vocab_size=VOCAB + 7, attention_dropout_rate=0.1,
                         relu_dropout_rate=0.1)]:
    cfg, _ = make("pre", num_encoder_layers=1, num_decoder_layers=1, **overrides)
    model = tj.Transformer(cfg)

    @jax.jit
    def init_and_apply(src, tgt, model=model):
      v = model.init(jax.random.key(0), src, tgt)
      return model.apply(v, src, tgt, rngs={"dropout": jax.random.key(1)})
    # init and apply compiled as one program: 2.5 s a variant at the tests' -O0
    # (tests/xla_env.py), against 4-9 s op by op.
    out = init_and_apply(src, tgt)
    assert out.shape == (2, 5, cfg.output_vocab_size), overrides
    assert np.all(np.isfinite(out)), overrides


def test_invalid_configs_name_the_field():
  with pytest.raises(ValueError, match="d_model=30 is not divisible by num_heads=4"):
    tj.model_config("tiny", d_model=30)
  with pytest.raises(ValueError, match=r"norm_position='middle'.*\('post', 'pre'\)"):
    tj.model_config("tiny", norm_position="middle")
  with pytest.raises(ValueError, match=r"model size 'huge'.*tiny"):
    tj.model_config("huge")
  with pytest.raises(ValueError, match="unknown TransformerConfig field"):
    tj.model_config("base", d_modle=3)
  with pytest.raises(ValueError, match="share_embeddings"):
    tj.model_config("tiny", target_vocab_size=99)
  with pytest.raises(ValueError, match="attention_dropout_rate"):
    tj.model_config("tiny", attention_impl="cudnn", attention_dropout_rate=0.1)
  with pytest.raises(ValueError, match=r"d_model=33: sinusoidal encoding needs it even \(sine "
                                       r"and cosine pairs\); or position_encoding='learned'"):
    tj.model_config("tiny", d_model=33, num_heads=3)
  tj.model_config("tiny", d_model=33, num_heads=3, position_encoding="learned")
  with pytest.raises(dataclasses.FrozenInstanceError):
    tj.model_config("tiny").d_model = 3


def test_the_configs_defaults_sizes_and_bounds():
  """TransformerConfig's defaults are the paper's base model (PAPER.md; found by mutation
  testing: no test read them), the named sizes its Table 3 rows, and each check's bound sits
  where its message says."""
  assert tj.TransformerConfig().to_dict() == dict(
      vocab_size=37000, target_vocab_size=None, d_model=512, num_heads=8, d_ff=2048,
      num_encoder_layers=6, num_decoder_layers=6, dropout_rate=0.1, attention_dropout_rate=0.0,
      relu_dropout_rate=0.0, norm_position="post", layer_norm_epsilon=1e-6,
      share_embeddings=True, tie_output_embedding=True, scale_embeddings=True,
      position_encoding="sinusoidal", max_len=256, activation="relu", use_bias=True,
      attention_bias=False, kernel_init="xavier_uniform", dtype="float32",
      param_dtype="float32", attention_impl="xla", padding_as_lengths=True, remat="none",
      fused_qkv=False, pad_id=0, bos_id=2, eos_id=3, deterministic=False, decode=False)
  assert tj.model_config() == tj.TransformerConfig()  # "base" by default
  def layers(n):
    return dict(num_encoder_layers=n, num_decoder_layers=n)
  assert tj.config.SIZES == {
      "tiny": dict(d_model=32, num_heads=4, d_ff=64, **layers(2), dropout_rate=0.1, max_len=64),
      "small": dict(d_model=256, num_heads=4, d_ff=1024, **layers(3), dropout_rate=0.1),
      "base": dict(d_model=512, num_heads=8, d_ff=2048, **layers(6), dropout_rate=0.1),
      "big": dict(d_model=1024, num_heads=16, d_ff=4096, **layers(6), dropout_rate=0.3)}
  assert CHOICES == {
      "norm_position": ("post", "pre"), "position_encoding": ("sinusoidal", "learned"),
      "activation": ("relu", "gelu"), "kernel_init": ("xavier_uniform", "normal"),
      "dtype": ("float32", "bfloat16", "float16"), "param_dtype": ("float32", "bfloat16"),
      "attention_impl": ("xla", "cudnn"), "remat": ("none", "layer")}
  for name, allowed in CHOICES.items():
    for value in allowed:
      tj.model_config("tiny", **{name: value, "attention_dropout_rate": 0.0})
  def refused(message, **fields):
    with pytest.raises(ValueError) as e:
      tj.model_config("tiny", **fields)
    assert str(e.value) == message
  for name in ("vocab_size", "d_model", "num_heads", "d_ff", "max_len"):
    refused(f"TransformerConfig.{name}=0: must be positive", **{name: 0})
  tj.model_config("tiny", vocab_size=1, max_len=1, d_ff=1)
  tj.model_config("tiny", d_model=2, num_heads=1)
  for name in ("num_encoder_layers", "num_decoder_layers"):
    refused(f"TransformerConfig.{name}=0: need at least 1 layer", **{name: 0})
    tj.model_config("tiny", **{name: 1})
  refused("TransformerConfig.d_model=30 is not divisible by num_heads=4: choose num_heads among "
          "the divisors of d_model [1, 2, 3, 5, 6, 10, 15, 30]", d_model=30)
  refused("TransformerConfig.d_model=128 is not divisible by num_heads=3: choose num_heads "
          "among the divisors of d_model [1, 2, 4, 8, 16, 32, 64]", d_model=128, num_heads=3)
  refused("TransformerConfig.d_model=130 is not divisible by num_heads=4: choose num_heads "
          "among the divisors of d_model [1, 2, 5, 10, 13, 26]", d_model=130)  # not 65: > 64
  for name in ("dropout_rate", "attention_dropout_rate", "relu_dropout_rate"):
    for bad in (-0.01, 1.0):
      refused(f"TransformerConfig.{name}={bad}: must be in [0, 1)", **{name: bad})
    tj.model_config("tiny", **{name: 0.0})
    tj.model_config("tiny", **{name: 0.99})
  # One vocabulary when shared: the same size given twice is one; two sizes need two tables.
  assert tj.model_config("tiny", vocab_size=50, target_vocab_size=50).output_vocab_size == 50
  untied = tj.model_config("tiny", vocab_size=50, target_vocab_size=70, share_embeddings=False)
  assert untied.output_vocab_size == 70 and tj.model_config("tiny").output_vocab_size == 37000
  tj.model_config("tiny", attention_impl="cudnn", attention_dropout_rate=0.0)
  refused("TransformerConfig.attention_impl='cudnn' has no attention-weight dropout: set "
          "attention_dropout_rate=0.0 or attention_impl='xla'", attention_impl="cudnn",
          attention_dropout_rate=0.1)
  cfg = tj.model_config("tiny", dtype="bfloat16")
  assert cfg.head_dim == 8 and cfg.compute_dtype == jnp.bfloat16
  assert cfg.params_dtype == jnp.float32 and cfg.replace(d_ff=8).d_ff == 8 and cfg.d_ff == 64
  refused("unknown TransformerConfig field(s) ['d_modle', 'headz']: expected among "
          f"{sorted(tj.TransformerConfig().to_dict())}", d_modle=3, headz=1)


def test_token_validity_of_packed_rows_is_their_segment_ids():
  from transformer_jax.model import token_validity
  tokens = jnp.array([[5, 6, 0, 7, 0]])
  np.testing.assert_array_equal(token_validity(tokens, None, 0), [[1, 1, 0, 1, 0]])
  # Packed rows: the segment ids decide (0 is padding), whatever the token ids there are.
  segments = jnp.array([[1, 1, 0, 2, 0]])
  np.testing.assert_array_equal(token_validity(jnp.full((1, 5), 9), segments, 0),
                                [[1, 1, 0, 1, 0]])


def test_learned_position_tables_start_at_std_0_02():
  # One layer a side: the tables sit below the layers, whose number does not change them.
  cfg, model = make(position_encoding="learned", num_encoder_layers=1, num_decoder_layers=1)
  params = jax.jit(model.init)(jax.random.key(0), random_tokens(0, (1, 8)),
                               random_tokens(1, (1, 8)))["params"]
  for side in ("encoder", "decoder"):
    table = np.asarray(nn.meta.unbox(params[side]["position"]["embedding"]))
    assert table.shape == (cfg.max_len, cfg.d_model)
    assert abs(table.std() - 0.02) < 0.002 and abs(table.mean()) < 0.002, side


def test_a_learned_table_takes_max_len_positions_and_refuses_more():
  # The table has rows 0 .. max_len - 1: a sequence of exactly max_len positions fits, one more
  # is a clear error (a lookup past the table would silently clamp to its last row).
  cfg, model = make(position_encoding="learned", max_len=8)
  shapes = jax.eval_shape(model.init, jax.random.key(0), random_tokens(0, (1, 8)),
                          random_tokens(1, (1, 8)))["params"]
  assert nn.meta.unbox(shapes["encoder"]["position"]["embedding"]).shape == (8, cfg.d_model)
  with pytest.raises(ValueError, match="longer than the learned position table"):
    jax.eval_shape(model.init, jax.random.key(0), random_tokens(0, (1, 9)),
                   random_tokens(1, (1, 8)))


@pytest.mark.parametrize("kind", ["dropout_rate", "attention_dropout_rate", "relu_dropout_rate"])
def test_each_dropout_acts_in_training_only(kind):
  rates = dict(dropout_rate=0.0, attention_dropout_rate=0.0, relu_dropout_rate=0.0)
  cfg, evaluate = make(**{**rates, kind: 0.3}, num_encoder_layers=1, num_decoder_layers=1)
  src, tgt = random_tokens(0, (2, 9)), random_tokens(1, (2, 7))
  params = jax.jit(evaluate.init)(jax.random.key(0), src, tgt)["params"]
  train = tj.Transformer(cfg)
  no_dropout = tj.Transformer(cfg.replace(**rates))
  rngs = {"dropout": jax.random.key(1)}
  run = lambda m: np.asarray(jax.jit(m.apply)({"params": params}, src, tgt, rngs=rngs))  # noqa: E731
  reference = run(no_dropout)
  np.testing.assert_allclose(run(evaluate), reference, rtol=1e-5, atol=1e-5)
  assert np.abs(run(train) - reference).max() > 1e-2


@pytest.mark.parametrize("fused", [False, True])
def test_attention_kernels_have_the_variance_of_a_plain_glorot_matrix(fused):
  # Q, K, V and output kernels, one by one or fused in one [embed, 3, heads, kv] array: each
  # d_model x d_model matrix is Glorot-uniform, U(+-sqrt(3 / d_model)), std d_model^-0.5.
  cfg, model = make(fused_qkv=fused, num_encoder_layers=1, num_decoder_layers=1)
  params = jax.jit(model.init)(jax.random.key(0), random_tokens(0, (1, 8)),
                               random_tokens(1, (1, 8)))["params"]
  flat = flax.traverse_util.flatten_dict(nn.meta.unbox(params))
  kernels = {k: np.asarray(v) for k, v in flat.items()
             if k[-1] == "kernel" and len(k) > 2 and "attention" in k[-3]}
  assert any(k[-2] == "qkv" for k in kernels) == fused and len(kernels) == (7 if fused else 12)
  d = cfg.d_model
  for name, w in kernels.items():
    assert np.abs(w).max() <= np.sqrt(3 / d), name
    assert abs(w.std() / d**-0.5 - 1) < 0.05, name
  # The feed-forward kernels [d_model, d_ff] and [d_ff, d_model]: std sqrt(2 / (d_model + d_ff)).
  ffn = [np.asarray(v) for k, v in flat.items() if k[-1] == "kernel" and np.ndim(v) == 2
         and {np.shape(v)[0], np.shape(v)[1]} == {d, cfg.d_ff}]
  assert len(ffn) == 4
  for w in ffn:
    assert abs(w.std() / np.sqrt(2 / (d + cfg.d_ff)) - 1) < 0.05


@pytest.mark.parametrize("scale", [True, False])
def test_embedding_is_scaled_by_sqrt_d_model_and_logits_use_the_plain_table(scale):
  # The paper, 3.4: the shared weight matrix is multiplied by sqrt(d_model) in the embedding
  # layers, not in the pre-softmax projection. At init the table's std is d_model^-0.5, so the
  # scaled embeddings have unit variance, the scale of the sinusoids they are added to.
  from transformer_jax.layers import Embed
  cfg = tj.model_config("tiny", vocab_size=VOCAB, scale_embeddings=scale)
  embed = Embed(cfg, num_embeddings=VOCAB)
  ids = jnp.array([[4, 5, 39]])
  params = embed.init(jax.random.key(0), ids)["params"]
  table = np.asarray(nn.meta.unbox(params["embedding"]))
  factor = np.sqrt(cfg.d_model) if scale else 1.0
  np.testing.assert_allclose(embed.apply({"params": params}, ids), table[[4, 5, 39]][None] * factor,
                             rtol=1e-6)
  x = np.asarray(jax.random.normal(jax.random.key(1), (2, cfg.d_model)))
  np.testing.assert_allclose(embed.apply({"params": params}, x, method=Embed.attend), x @ table.T,
                             rtol=1e-5, atol=1e-5)
  assert abs(table.std() * np.sqrt(cfg.d_model) - 1) < 0.1


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_residual_puts_layer_norm_where_configured(norm):
  # post (the paper): LayerNorm(x + Sublayer(x)); pre: x + Sublayer(LayerNorm(x)). At init the
  # LayerNorm has scale 1 and bias 0, so it is (x - mean) / sqrt(var + eps) over d_model.
  from transformer_jax.layers import Residual
  cfg = tj.model_config("tiny", vocab_size=VOCAB, norm_position=norm).replace(deterministic=True)
  x = jax.random.normal(jax.random.key(0), (2, 3, cfg.d_model)) * 3 + 1
  sublayer = lambda y: 2.0 * y + 0.5  # noqa: E731
  residual = Residual(cfg)
  params = residual.init(jax.random.key(1), x, sublayer)
  got = residual.apply(params, x, sublayer)

  def layer_norm(y):
    y = np.asarray(y, np.float64)
    mean, var = y.mean(-1, keepdims=True), y.var(-1, keepdims=True)
    return (y - mean) / np.sqrt(var + cfg.layer_norm_epsilon)

  x64 = np.asarray(x, np.float64)
  expected = (layer_norm(x64 + sublayer(x64)) if norm == "post"
              else x64 + sublayer(layer_norm(x64)))
  np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_cross_attention_reads_one_cache_row_per_source_for_all_its_beams():
  # Beam search keeps each source's encoder keys/values once; the beams of source b are the
  # consecutive rows b*beam .. b*beam + beam - 1. The result must equal attention against a
  # cache copied once per row, and a row count that is not a multiple is refused.
  from transformer_jax.layers import MultiHeadAttention
  cfg = tj.model_config("tiny", vocab_size=VOCAB).replace(deterministic=True, decode=True)
  attention = MultiHeadAttention(cfg, cache="cross")
  encoded = jax.random.normal(jax.random.key(0), (2, 5, cfg.d_model))
  variables = attention.init(jax.random.key(1), encoded[:, :1], encoded)
  queries = jax.random.normal(jax.random.key(2), (6, 1, cfg.d_model))  # 2 sources x 3 beams
  grouped, _ = attention.apply(variables, queries, encoded, mutable=["cache"])
  per_row = jax.tree_util.tree_map(lambda c: jnp.repeat(c, 3, axis=0), variables["cache"])
  expected, _ = attention.apply({"params": variables["params"], "cache": per_row}, queries,
                                jnp.repeat(encoded, 3, axis=0), mutable=["cache"])
  assert grouped.shape == (6, 1, cfg.d_model)
  np.testing.assert_allclose(grouped, expected, rtol=1e-5, atol=1e-5)
  # One source with all its beams (translating a single sentence with beam search).
  one = jax.tree_util.tree_map(lambda c: c[:1], variables["cache"])
  alone, _ = attention.apply({"params": variables["params"], "cache": one}, queries[:3],
                             encoded[:1], mutable=["cache"])
  np.testing.assert_allclose(alone, expected[:3], rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="2 sources for 5 rows of 1 positions"):
    attention.apply(variables, queries[:5], encoded, mutable=["cache"])
  with pytest.raises(ValueError, match="2 sources for 4 rows of 2 positions"):
    attention.apply(variables, queries[:4].reshape(2, 2, -1).repeat(2, 0), encoded,
                    mutable=["cache"])


def test_fused_qkv_self_attention_takes_no_other_inputs():
  from transformer_jax.layers import MultiHeadAttention
  cfg = tj.model_config("tiny", vocab_size=VOCAB, fused_qkv=True).replace(deterministic=True)
  attention = MultiHeadAttention(cfg)
  x = jax.random.normal(jax.random.key(0), (1, 4, cfg.d_model))
  variables = attention.init(jax.random.key(1), x)
  np.testing.assert_allclose(attention.apply(variables, x, x), attention.apply(variables, x))
  with pytest.raises(ValueError, match="fused_qkv: a self-attention module takes inputs_kv=None"):
    attention.apply(variables, x, x + 1)


@pytest.mark.parametrize("bias", [False, True])
def test_projection_is_x_times_kernel_plus_bias(bias):
  # Attention's projections contract x's last axes with the kernel's first (`num_in`) axes;
  # with attention_bias the bias is added (biases start at zero, so set one by hand).
  from transformer_jax.layers import Projection
  cfg = tj.model_config("tiny", vocab_size=VOCAB, attention_bias=bias)
  shape = (cfg.d_model, cfg.num_heads, cfg.head_dim)
  projection = Projection(cfg, shape, 1, ("embed", "heads", "kv"))
  x = jax.random.normal(jax.random.key(0), (2, 3, cfg.d_model))
  params = nn.meta.unbox(projection.init(jax.random.key(1), x)["params"])
  assert ("bias" in params) == bias
  if bias:
    params["bias"] = jax.random.normal(jax.random.key(2), shape[1:])
  expected = np.einsum("bld,dhk->blhk", x, params["kernel"]) + (params["bias"] if bias else 0)
  np.testing.assert_allclose(projection.apply({"params": params}, x), expected, rtol=1e-5,
                             atol=1e-5)


def test_normal_kernel_init_has_std_0_02():
  # kernel_init="normal" (BERT/GPT practice): every matmul kernel N(0, 0.02), whatever its fans.
  cfg, model = make(kernel_init="normal", num_encoder_layers=1, num_decoder_layers=1)
  params = jax.jit(model.init)(jax.random.key(0), random_tokens(0, (1, 8)),
                               random_tokens(1, (1, 8)))["params"]
  kernels = [np.asarray(v) for k, v in flax.traverse_util.flatten_dict(
      nn.meta.unbox(params)).items() if k[-1] == "kernel"]
  assert len(kernels) == 16   # 4 + 2 in the encoder layer, 8 + 2 in the decoder layer
  for w in kernels:
    assert abs(w.std() - 0.02) < 0.002 and abs(w.mean()) < 0.002, w.shape


# Every activation the config accepts, computed by hand: one added to config.CHOICES needs its
# formula here (a KeyError otherwise) and its function in layers.ACTIVATIONS.
HAND_ACTIVATIONS = {
    "relu": lambda h: np.maximum(h, 0),
    # The tanh approximation, flax's default (not the erf form of PyTorch's default nn.GELU).
    "gelu": lambda h: 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3))),
}


@pytest.mark.parametrize("activation", CHOICES["activation"])
def test_feed_forward_is_the_papers_equation_2(activation):
  # FFN(x) = max(0, x W1 + b1) W2 + b2 (GELU instead of the max with activation="gelu"),
  # against a hand computation with biases set away from their zero init.
  from transformer_jax.layers import ACTIVATIONS, FeedForward
  assert set(ACTIVATIONS) == set(CHOICES["activation"])
  cfg = tj.model_config("tiny", vocab_size=VOCAB, activation=activation).replace(
      deterministic=True)
  ffn = FeedForward(cfg)
  x = jax.random.normal(jax.random.key(0), (2, 3, cfg.d_model))
  params = nn.meta.unbox(ffn.init(jax.random.key(1), x)["params"])
  params["wi"]["bias"] = jax.random.normal(jax.random.key(2), (cfg.d_ff,))
  params["wo"]["bias"] = jax.random.normal(jax.random.key(3), (cfg.d_model,))
  x64 = np.asarray(x, np.float64)
  h = x64 @ np.asarray(params["wi"]["kernel"]) + np.asarray(params["wi"]["bias"])
  h = HAND_ACTIVATIONS[activation](h)
  expected = h @ np.asarray(params["wo"]["kernel"]) + np.asarray(params["wo"]["bias"])
  np.testing.assert_allclose(ffn.apply({"params": params}, x), expected, rtol=1e-4, atol=1e-4)


def test_only_a_decoding_cross_attention_can_be_primed():
  from transformer_jax.layers import MultiHeadAttention
  cfg = tj.model_config("tiny", vocab_size=VOCAB).replace(deterministic=True)
  encoded = jnp.ones((1, 4, cfg.d_model))
  valid = jnp.ones((1, 4), jnp.bool_)
  for config, cache in ((cfg.replace(decode=True), "self"), (cfg, "cross"),
                        (cfg.replace(decode=True), "none")):
    attention = MultiHeadAttention(config, cache=cache)
    variables = attention.init(jax.random.key(0), encoded)
    with pytest.raises(ValueError, match="prime is only for cross-attention in decode mode"):
      attention.apply(variables, encoded, valid, method=MultiHeadAttention.prime,
                      mutable=["cache"])


def test_non_embedding_count_leaves_out_every_table_wherever_it_sits():
  # Learned position tables sit inside the encoder and decoder, before the shared embedding in
  # the parameter tree, and an untied output projection counts as an embedding (Kaplan et al.).
  cfg = tj.model_config("tiny", vocab_size=VOCAB, position_encoding="learned",
                        tie_output_embedding=False)
  shapes = jax.eval_shape(tj.Transformer(cfg).init, jax.random.key(0),
                          jnp.ones((1, 8), jnp.int32), jnp.ones((1, 8), jnp.int32))["params"]
  tables = VOCAB * cfg.d_model + 2 * cfg.max_len * cfg.d_model + (cfg.d_model * VOCAB + VOCAB)
  assert tj.count_params(shapes, non_embedding=True) == tj.count_params(shapes) - tables


def test_every_model_field_is_documented():
  """docs/model.md's table of options names every option of TransformerConfig; the sizes, ids
  and modes are listed below it. A new field in neither is a gap in the docs."""
  with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs",
                         "model.md")) as f:
    doc = f.read()
  table = doc[doc.index("| field | default (paper) |"):doc.index("The sizes (`vocab_size`")]
  others = doc[doc.index("The sizes (`vocab_size`"):doc.index("a test\n(`tests/test_model.py`)")]
  missing = [f.name for f in dataclasses.fields(tj.TransformerConfig)
             if f"`{f.name}`" not in table and f"`{f.name}`" not in others]
  assert not missing, f"add these TransformerConfig fields to docs/model.md's table: {missing}"
