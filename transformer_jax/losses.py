"""Label-smoothed cross-entropy and accuracy, as sums over non-pad tokens (averaged on the host)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def _reductions(logits, targets):
  """Float32 logits: separate reductions, differentiated by plain autodiff (XLA:CPU shares the
  two maxima and fuses the rest)."""
  lse = jax.nn.logsumexp(logits, axis=-1)
  label = jnp.take_along_axis(logits, targets[..., None], axis=-1).squeeze(-1)
  return lse, label, jnp.sum(logits, axis=-1), jnp.max(logits, axis=-1)


def _two_pass_reductions(logits, targets):
  """The same four values for 16-bit logits in two passes over them, each converting to float32
  as it reads (exact for bfloat16): the maximum, then the sum of exp(x - max) and the sum of x
  in one variadic reduction. As separate reductions XLA:GPU read the 1.8 GB logits of
  transformer-base four times (the accuracy's bfloat16 max, the log-sum-exp's float32 max, the
  two sums); two reads made its step 1.4 ms (3%) faster on an H100 (docs/benchmarks.md).
  """
  x = logits.astype(jnp.float32)
  peak = jnp.max(x, axis=-1)
  # As jax.nn.logsumexp: a row of -inf (or +inf) would make exp(x - peak) NaN.
  shift = jnp.where(jnp.isfinite(peak), peak, 0.0)
  sum_exp, total = jax.lax.reduce(
      (jnp.exp(x - shift[..., None]), x), (np.float32(0), np.float32(0)),
      lambda a, b: (a[0] + b[0], a[1] + b[1]), (x.ndim - 1,))
  label = jnp.take_along_axis(x, targets[..., None], axis=-1).squeeze(-1)
  return shift + jnp.log(sum_exp), label, total, peak


def vocab_reductions(logits, targets):
  """(log-sum-exp, the label's logit, the sum of the logits, the maximum) over the last axis, in
  float32. The maximum is for the accuracy only and carries no gradient.

  Float32 logits: plain autodiff (on the 2-core CPU 3-15% faster a step than the custom VJP
  below, which recomputes the exponentials).
  Lower precision: two passes over the logits (`_two_pass_reductions`), never converting the
  whole [tokens, vocab] tensor at once, since that would write it out in float32, twice the
  bytes of bfloat16 logits (1.7 GiB more peak memory for transformer-base on an H100,
  docs/benchmarks.md); and a custom VJP sums the gradient in float32 and rounds it once.
  """
  if logits.dtype == jnp.float32:
    out = _reductions(logits, targets)
  else:
    out = _low_precision_reductions(logits, targets)
  return (*out[:3], jax.lax.stop_gradient(out[3]))


@jax.custom_vjp
def _low_precision_reductions(logits, targets):
  return _two_pass_reductions(logits, targets)


def _vocab_reductions_fwd(logits, targets):
  out = _two_pass_reductions(logits, targets)
  return out, (logits, targets, out[0])


def _vocab_reductions_bwd(residuals, cotangents):
  # d/dlogits = g_lse * softmax + g_label * onehot(label) + g_total, summed in float32 and
  # rounded to the logits' dtype once. (Autodiff through per-reduction converts would round
  # each term to bfloat16 and add them there: softmax - 1 at a confident label then cancels
  # in bfloat16, a 10x larger gradient error, tested in tests/test_train.py.) The maximum's
  # cotangent is dropped: vocab_reductions stops its gradient.
  logits, targets, lse = residuals
  g_lse, g_label, g_total = (g[..., None] for g in cotangents[:3])
  softmax = jnp.exp(logits.astype(jnp.float32) - lse[..., None])
  onehot = jnp.arange(logits.shape[-1]) == targets[..., None]
  grad = g_lse * softmax + jnp.where(onehot, g_label, 0.0) + g_total
  return grad.astype(logits.dtype), None


_low_precision_reductions.defvjp(_vocab_reductions_fwd, _vocab_reductions_bwd)


def _token_losses(logits, targets, label_smoothing: float):
  """Per-token (smoothed loss, nll, the label's logit, the maximum logit), unweighted."""
  vocab = logits.shape[-1]
  # Everything from reductions over the vocabulary (log-sum-exp, sum, the label's logit), without
  # materialising log-probabilities: the gradient is then one fused pass (14% faster step on CPU).
  lse, label, total, peak = vocab_reductions(logits, targets)
  nll = lse - label
  if label_smoothing > 0:
    confidence = 1.0 - label_smoothing
    low = label_smoothing / (vocab - 1)
    # -sum_k q_k log p_k with q = low everywhere but confidence at the label;
    # -sum_k log p_k = V lse - sum_k logits_k.
    smooth = confidence * nll + low * (vocab * lse - total - nll)
    entropy = -(confidence * jnp.log(confidence) + (vocab - 1) * low * jnp.log(low))
    loss = smooth - entropy
  else:
    loss = nll
  return loss, nll, label, peak


def smoothed_cross_entropy(logits, targets, weights, label_smoothing: float):
  """Per-token losses `[batch, length]`: (smoothed loss, plain negative log-likelihood).

  The smoothed target puts 1 - eps on the label and eps / (V - 1) on every other token (the
  paper's epsilon_ls). Its entropy is subtracted so a perfect prediction of the smoothed target
  scores 0, which keeps the number comparable across vocabulary sizes (Flax WMT, tensor2tensor).
  Computed in float32 whatever the compute dtype.
  """
  loss, nll, _, _ = _token_losses(logits, targets, label_smoothing)
  return loss * weights, nll * weights


def loss_sums(logits, targets, weights, label_smoothing: float):
  """Sums over the batch: smoothed loss, nll, correct predictions, token count."""
  loss, nll, label, peak = _token_losses(logits, targets, label_smoothing)
  # The label's logit is the largest (an exact tie counts as correct): the maximum the
  # log-sum-exp takes anyway, instead of argmax's slower (value, index) reduction. Both are
  # values of `logits` (in float32 for 16-bit logits, converted exactly): compared exactly.
  correct = (label >= peak) * weights
  return {"loss": (loss * weights).sum(), "nll": (nll * weights).sum(),
          "correct": correct.sum(), "tokens": weights.sum()}


def sentence_log_probs(logits, targets, weights):
  """Per row, `sum_t weights[t] * log P(targets[t])` in float32 `[batch]`: the natural-log
  probability of each target sentence, teacher-forced, with the log-softmax over the whole
  vocabulary as the search scores its hypotheses (`scripts/score.py`)."""
  _, nll = smoothed_cross_entropy(logits, targets, weights, 0.0)
  return -nll.sum(axis=-1)
