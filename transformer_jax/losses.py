"""Label-smoothed cross-entropy and accuracy, as sums over non-pad tokens (normalised on the host)."""
from __future__ import annotations

import jax
import jax.numpy as jnp


def smoothed_cross_entropy(logits, targets, weights, label_smoothing: float):
  """Per-token losses `[batch, length]`: (smoothed loss, plain negative log-likelihood).

  The smoothed target puts 1 - eps on the label and eps / (V - 1) on every other token (the
  paper's epsilon_ls). Its entropy is subtracted so a perfect prediction of the smoothed target
  scores 0, which keeps the number comparable across vocabulary sizes (Flax WMT, tensor2tensor).
  Computed in float32 whatever the compute dtype.
  """
  vocab = logits.shape[-1]
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  nll = -jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
  if label_smoothing > 0:
    confidence = 1.0 - label_smoothing
    low = label_smoothing / (vocab - 1)
    # -sum_k q_k log p_k with q = low everywhere but confidence at the label.
    smooth = confidence * nll + low * (-jnp.sum(log_probs, axis=-1) - nll)
    entropy = -(confidence * jnp.log(confidence) + (vocab - 1) * low * jnp.log(low))
    loss = smooth - entropy
  else:
    loss = nll
  return loss * weights, nll * weights


def loss_sums(logits, targets, weights, label_smoothing: float):
  """Sums over the batch: smoothed loss, nll, correct predictions, token count."""
  loss, nll = smoothed_cross_entropy(logits, targets, weights, label_smoothing)
  correct = (jnp.argmax(logits, axis=-1) == targets) * weights
  return {"loss": loss.sum(), "nll": nll.sum(), "correct": correct.sum(), "tokens": weights.sum()}
