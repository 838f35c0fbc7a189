"""The sums the train and eval steps report: loss, nll, correct predictions and token count."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax import losses


def test_sentence_log_probs_sum_the_weighted_log_softmax_of_each_row():
  logits = jax.random.normal(jax.random.key(0), (3, 4, 6)) * 3
  targets = jnp.array([[1, 2, 3, 0], [5, 5, 0, 0], [0, 0, 0, 0]])
  weights = (targets != 0).astype(jnp.float32)
  log_probs = np.asarray(jax.nn.log_softmax(logits))
  picked = np.take_along_axis(log_probs, np.asarray(targets)[..., None], -1)[..., 0]
  expected = (picked * np.asarray(weights)).sum(1)
  got = losses.sentence_log_probs(logits, targets, weights)
  assert got.shape == (3,) and got[2] == 0
  np.testing.assert_allclose(got, expected, rtol=1e-6)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_loss_sums_count_correct_tokens_and_weights(dtype):
  # [batch 3, length 5, vocab 7]: correct where the label has the largest logit, an exact tie
  # counted as correct, padding (weight 0) counted nowhere.
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(3, 5, 7)).astype(np.float32)
  targets = rng.integers(0, 7, (3, 5))
  weights = (rng.random((3, 5)) > 0.3).astype(np.float32)
  logits[0, 0] = 0.0                      # all tied: correct whatever the label
  logits[1, 1, targets[1, 1]] = 5.0       # clearly correct
  logits = np.asarray(jnp.asarray(logits, dtype).astype(jnp.float32))
  label = np.take_along_axis(logits, targets[..., None], -1)[..., 0]
  correct = (label >= logits.max(-1)) * weights
  out = losses.loss_sums(jnp.asarray(logits, dtype), jnp.asarray(targets), jnp.asarray(weights),
                         0.0)
  assert 0 < correct.sum() < weights.sum()
  assert float(out["correct"]) == correct.sum()
  assert float(out["tokens"]) == weights.sum()
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  nll = -(np.take_along_axis(logp, targets[..., None], -1)[..., 0] * weights).sum()
  assert float(out["nll"]) == pytest.approx(nll, rel=1e-5)
  assert float(out["loss"]) == pytest.approx(nll, rel=1e-5)   # no smoothing: the nll


def test_bfloat16_reductions_read_the_logits_twice_and_agree_with_float32():
  # The 16-bit path takes the maximum, then sum(exp(x - max)) and sum(x) in one variadic
  # reduction: two reads of the [tokens, vocab] logits, where separate reductions were four on an
  # H100 (docs/benchmarks.md). Its values are the float32 path's on the same (exact) inputs.
  rng = np.random.default_rng(1)
  logits = jnp.asarray(rng.normal(size=(3, 5, 11)) * 4, jnp.bfloat16)
  targets = jnp.asarray(rng.integers(0, 11, (3, 5)))
  out = losses.vocab_reductions(logits, targets)
  ref = losses.vocab_reductions(logits.astype(jnp.float32), targets)
  for a, b, name in zip(out, ref, ("lse", "label", "total", "max")):
    assert a.dtype == jnp.float32, name
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-5, err_msg=name)
  jaxpr = jax.make_jaxpr(losses._two_pass_reductions)(logits, targets)
  reads = [e.primitive.name for e in jaxpr.eqns
           if e.primitive.name.startswith("reduce") and e.invars[0].aval.shape == logits.shape]
  assert sorted(reads) == ["reduce", "reduce_max"], reads
  # A row of -inf (a fully masked vocabulary) gives lse -inf, not NaN, as jax.nn.logsumexp.
  masked = logits.at[0, 0].set(-jnp.inf)
  assert float(losses.vocab_reductions(masked, targets)[0][0, 0]) == -np.inf


def test_bfloat16_loss_with_the_vocabulary_sharded_is_the_unsharded_one():
  # The variadic reduction over a vocabulary split across devices (the "tensor" axis shards the
  # logits' last axis): loss, accuracy and gradient as on one device.
  from jax.sharding import Mesh, NamedSharding, PartitionSpec
  mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "tensor"))
  rng = np.random.default_rng(2)
  logits = rng.normal(size=(4, 6, 64)) * 3
  targets = rng.integers(0, 64, (4, 6))
  np.put_along_axis(logits[:2], targets[:2, :, None], 20.0, axis=-1)   # half of them correct
  logits, targets = jnp.asarray(logits, jnp.bfloat16), jnp.asarray(targets)
  weights = jnp.asarray(rng.random((4, 6)) > 0.2, jnp.float32)

  def loss(x):
    sums = losses.loss_sums(x, targets, weights, 0.1)
    return sums["loss"], sums

  step = jax.jit(jax.value_and_grad(loss, has_aux=True))
  sharded = jax.device_put(logits, NamedSharding(mesh, PartitionSpec("data", None, "tensor")))
  ((a, sums_a), grad_a), ((b, sums_b), grad_b) = step(sharded), step(logits)
  assert len(grad_a.sharding.device_set) == 8
  assert float(a) == pytest.approx(float(b), rel=1e-6)
  assert float(sums_a["correct"]) == float(sums_b["correct"]) > 0
  np.testing.assert_allclose(np.asarray(grad_a, np.float32), np.asarray(grad_b, np.float32),
                             atol=1e-6)
