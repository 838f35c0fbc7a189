"""The comparison point of the CPU target: the official Flax `examples/wmt` model, condensed.

Rebuilt from google/flax `examples/wmt/models.py` (pre-LN, `nn.MultiHeadDotProductAttention`
without biases, dropout 0.1 on embeddings, residuals and inside the MLP, attention dropout 0.1,
logits through the shared embedding) and its `train.py` loss (label smoothing 0.1 on one-hot
targets with log-softmax), trained with optax Adam under `jit` with donated state, in the CPU
reference setting of `configs/cpu_reference.py`: vocabulary 8,000, d_model 256, 4 heads, d_ff
1,024, 3+3 layers, 16 x 64 source and 16 x 64 target tokens without padding, float32.

`run(steps)` reports the median step time over `steps` steps after 3 warm-up steps, like the
train benchmark (`transformer_jax.bench.train`) on `configs/cpu_reference.py`. It shares no code
with this package's model, so it stays the example's model.
"""
from __future__ import annotations

import statistics
import time

from flax import linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

# vocab, d_model, heads, d_ff, layers, rows, length
V, D, H, F, N, B, L = 8000, 256, 4, 1024, 3, 16, 64
DROP, ADROP = 0.1, 0.1
WARMUP_STEPS = 3
DEFAULT_STEPS = 30
kernel_init, bias_init = nn.initializers.xavier_uniform(), nn.initializers.normal(stddev=1e-6)


def sinusoid(max_len, d):
  # The Flax example's table: sines in the first half of the features, cosines in the second.
  pe = np.zeros((max_len, d), np.float32)
  pos = np.arange(max_len)[:, None]
  div = np.exp(np.arange(d // 2) * (-np.log(10000.0) / (d // 2 - 1)))
  pe[:, :d // 2], pe[:, d // 2:] = np.sin(pos * div), np.cos(pos * div)
  return jnp.array(pe[None])


def attention(name=None):
  return nn.MultiHeadDotProductAttention(
      num_heads=H, qkv_features=D, kernel_init=kernel_init, bias_init=bias_init, use_bias=False,
      broadcast_dropout=False, dropout_rate=ADROP, deterministic=False, name=name)


class Mlp(nn.Module):
  @nn.compact
  def __call__(self, x):
    y = nn.relu(nn.Dense(F, kernel_init=kernel_init, bias_init=bias_init)(x))
    y = nn.Dropout(DROP)(y, deterministic=False)
    y = nn.Dense(D, kernel_init=kernel_init, bias_init=bias_init)(y)
    return nn.Dropout(DROP)(y, deterministic=False)


class EncoderBlock(nn.Module):
  @nn.compact
  def __call__(self, x, mask):
    y = attention()(nn.LayerNorm()(x), mask=mask)
    x = x + nn.Dropout(DROP)(y, deterministic=False)
    return x + Mlp()(nn.LayerNorm()(x))


class DecoderBlock(nn.Module):
  @nn.compact
  def __call__(self, t, encoded, self_mask, cross_mask):
    x = attention()(nn.LayerNorm()(t), mask=self_mask)
    x = t + nn.Dropout(DROP)(x, deterministic=False)
    y = attention()(nn.LayerNorm()(x), encoded, mask=cross_mask)
    y = x + nn.Dropout(DROP)(y, deterministic=False)
    return y + Mlp()(nn.LayerNorm()(y))


class Model(nn.Module):
  @nn.compact
  def __call__(self, inputs, targets):
    embed = nn.Embed(V, D, embedding_init=nn.initializers.normal(stddev=1.0))
    pe = sinusoid(2048, D)
    x = nn.Dropout(DROP)(embed(inputs) + pe[:, :L], deterministic=False)
    encoder_mask = nn.make_attention_mask(inputs > 0, inputs > 0)
    for _ in range(N):
      x = EncoderBlock()(x, encoder_mask)
    encoded = nn.LayerNorm()(x)
    self_mask = nn.combine_masks(nn.make_attention_mask(targets > 0, targets > 0),
                                 nn.make_causal_mask(targets))
    cross_mask = nn.make_attention_mask(targets > 0, inputs > 0)
    y = jnp.pad(targets, ((0, 0), (1, 0)))[:, :-1]
    y = nn.Dropout(DROP)(embed(y) + pe[:, :L], deterministic=False)
    for _ in range(N):
      y = DecoderBlock()(y, encoded, self_mask, cross_mask)
    return embed.attend(nn.LayerNorm()(y)) / jnp.sqrt(D)


def loss_fn(logits, targets, weights, smoothing=0.1):
  confidence, low = 1.0 - smoothing, smoothing / (V - 1)
  normalizer = -(confidence * jnp.log(confidence) + (V - 1) * low * jnp.log(low + 1e-20))
  soft = jax.nn.one_hot(targets, V) * (confidence - low) + low
  loss = -jnp.sum(soft * nn.log_softmax(logits), axis=-1) - normalizer
  return (loss * weights).sum() / weights.sum()


def run(steps: int = DEFAULT_STEPS) -> dict:
  """Median step time and target tokens/s of `steps` timed steps after the warm-up."""
  if steps < 1:
    raise ValueError(f"steps={steps}: must be >= 1")
  model, tx = Model(), optax.adam(1e-3, b1=0.9, b2=0.98, eps=1e-9)
  rng = np.random.default_rng(0)
  inputs = jnp.asarray(rng.integers(1, V, (B, L)), jnp.int32)
  targets = jnp.asarray(rng.integers(1, V, (B, L)), jnp.int32)
  params = model.init({"params": jax.random.key(0), "dropout": jax.random.key(1)},
                      inputs, targets)["params"]
  opt_state = tx.init(params)

  def step(params, opt_state, key, inputs, targets):
    def f(p):
      logits = model.apply({"params": p}, inputs, targets, rngs={"dropout": key})
      return loss_fn(logits, targets, (targets > 0).astype(jnp.float32))
    loss, grads = jax.value_and_grad(f)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  step = jax.jit(step, donate_argnums=(0, 1))
  for i in range(WARMUP_STEPS):
    params, opt_state, loss = step(params, opt_state, jax.random.key(i), inputs, targets)
    loss.block_until_ready()
  times = []
  for i in range(steps):
    start = time.perf_counter()
    params, opt_state, loss = step(params, opt_state, jax.random.key(100 + i), inputs, targets)
    loss.block_until_ready()
    times.append(time.perf_counter() - start)
  median = statistics.median(times)
  return {"model": "flax examples/wmt (condensed)", "median_step_s": round(median, 4),
          "target_tokens_per_sec": round(B * L / median, 1), "loss": float(loss),
          "jax_version": jax.__version__}
