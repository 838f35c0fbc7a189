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

import os
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


def attention(train: bool, decode: bool = False):
  return nn.MultiHeadDotProductAttention(
      num_heads=H, qkv_features=D, kernel_init=kernel_init, bias_init=bias_init, use_bias=False,
      broadcast_dropout=False, dropout_rate=ADROP, deterministic=not train, decode=decode)


class AddPosition(nn.Module):
  """The example's `AddPositionEmbs` with its fixed table: in decode mode one position per call,
  counted in the "cache" collection."""
  decode: bool = False

  @nn.compact
  def __call__(self, x):
    pe = sinusoid(2048, D)
    if self.decode:
      initialized = self.has_variable("cache", "cache_index")
      index = self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.uint32))
      if initialized:
        i = index.value
        index.value = i + 1
        return x + jax.lax.dynamic_slice(pe, (0, i.astype(jnp.int32), 0), (1, 1, D))
    return x + pe[:, :x.shape[1]]


class Mlp(nn.Module):
  train: bool

  @nn.compact
  def __call__(self, x):
    y = nn.relu(nn.Dense(F, kernel_init=kernel_init, bias_init=bias_init)(x))
    y = nn.Dropout(DROP)(y, deterministic=not self.train)
    y = nn.Dense(D, kernel_init=kernel_init, bias_init=bias_init)(y)
    return nn.Dropout(DROP)(y, deterministic=not self.train)


class EncoderBlock(nn.Module):
  train: bool

  @nn.compact
  def __call__(self, x, mask):
    y = attention(self.train)(nn.LayerNorm()(x), mask=mask)
    x = x + nn.Dropout(DROP)(y, deterministic=not self.train)
    return x + Mlp(self.train)(nn.LayerNorm()(x))


class DecoderBlock(nn.Module):
  train: bool
  decode: bool

  @nn.compact
  def __call__(self, t, encoded, self_mask, cross_mask):
    # As the example: only the self-attention caches; cross-attention projects the encoder
    # output again at every decoding step.
    x = attention(self.train, self.decode)(nn.LayerNorm()(t), mask=self_mask)
    x = t + nn.Dropout(DROP)(x, deterministic=not self.train)
    y = attention(self.train)(nn.LayerNorm()(x), encoded, mask=cross_mask)
    y = x + nn.Dropout(DROP)(y, deterministic=not self.train)
    return y + Mlp(self.train)(nn.LayerNorm()(y))


class Model(nn.Module):
  """`__call__` for training (teacher forcing); `encode` and `decode_logits` for the search, as
  the example's `Transformer.encode` / `Transformer.decode` (in decode mode `targets` is the
  one token of the step, and the cache holds the position and the self-attention keys/values)."""
  train: bool = True
  decode: bool = False

  def setup(self):
    self.embed = nn.Embed(V, D, embedding_init=nn.initializers.normal(stddev=1.0))
    self.encoder_position = AddPosition()
    self.encoder_blocks = [EncoderBlock(self.train) for _ in range(N)]
    self.encoder_norm = nn.LayerNorm()
    self.decoder_position = AddPosition(self.decode)
    self.decoder_blocks = [DecoderBlock(self.train, self.decode) for _ in range(N)]
    self.decoder_norm = nn.LayerNorm()
    self.dropout = nn.Dropout(DROP)

  def encode(self, inputs):
    x = self.dropout(self.encoder_position(self.embed(inputs)), deterministic=not self.train)
    mask = nn.make_attention_mask(inputs > 0, inputs > 0)
    for block in self.encoder_blocks:
      x = block(x, mask)
    return self.encoder_norm(x)

  def decode_logits(self, encoded, inputs, targets):
    if self.decode:
      self_mask, y = None, targets  # the cache masks the future; no shift
      cross_mask = nn.make_attention_mask(jnp.ones_like(targets) > 0, inputs > 0)
    else:
      self_mask = nn.combine_masks(nn.make_attention_mask(targets > 0, targets > 0),
                                   nn.make_causal_mask(targets))
      cross_mask = nn.make_attention_mask(targets > 0, inputs > 0)
      y = jnp.pad(targets, ((0, 0), (1, 0)))[:, :-1]
    y = self.dropout(self.decoder_position(self.embed(y)), deterministic=not self.train)
    for block in self.decoder_blocks:
      y = block(y, encoded, self_mask, cross_mask)
    return self.embed.attend(self.decoder_norm(y)) / jnp.sqrt(D)

  def __call__(self, inputs, targets):
    return self.decode_logits(self.encode(inputs), inputs, targets)


def loss_fn(logits, targets, weights, smoothing=0.1):
  confidence, low = 1.0 - smoothing, smoothing / (V - 1)
  normalizer = -(confidence * jnp.log(confidence) + (V - 1) * low * jnp.log(low + 1e-20))
  soft = jax.nn.one_hot(targets, V) * (confidence - low) + low
  loss = -jnp.sum(soft * nn.log_softmax(logits), axis=-1) - normalizer
  return (loss * weights).sum() / weights.sum()


def batch(rng: np.random.Generator):
  """Random source and target ids `[B, L]` without padding (id 0): every token counts."""
  inputs = jnp.asarray(rng.integers(1, V, (B, L)), jnp.int32)
  return inputs, jnp.asarray(rng.integers(1, V, (B, L)), jnp.int32)


def train_step(model: Model, tx: optax.GradientTransformation):
  """The example's `train_step` on one device: loss, gradients and the Adam update, jitted with
  the parameters and the optimizer state donated (updated in place, as the example's state)."""
  def step(params, opt_state, key, inputs, targets):
    def f(p):
      logits = model.apply({"params": p}, inputs, targets, rngs={"dropout": key})
      return loss_fn(logits, targets, (targets > 0).astype(jnp.float32))
    loss, grads = jax.value_and_grad(f)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss
  return jax.jit(step, donate_argnums=(0, 1))


def optimizer() -> optax.GradientTransformation:
  """Adam with the paper's (and the example's) betas and epsilon, at a constant rate: the
  example's schedule costs the same per step."""
  return optax.adam(1e-3, b1=0.9, b2=0.98, eps=1e-9)


def run(steps: int = DEFAULT_STEPS) -> dict:
  """Median step time and target tokens/s of `steps` timed steps after the warm-up."""
  if steps < 1:
    raise ValueError(f"steps={steps}: must be >= 1")
  model, tx = Model(), optimizer()
  inputs, targets = batch(np.random.default_rng(0))
  params = model.init({"params": jax.random.key(0), "dropout": jax.random.key(1)},
                      inputs, targets)["params"]
  opt_state = tx.init(params)
  step = train_step(model, tx)
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
          "jax_version": jax.__version__, "glibc_tunables": os.environ.get("GLIBC_TUNABLES", "")}
