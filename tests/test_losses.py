"""The sums the train and eval steps report: loss, nll, correct predictions and token count."""
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax import losses


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
