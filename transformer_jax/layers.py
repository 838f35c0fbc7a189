"""Building blocks: embeddings, multi-head attention (with the decoding cache) and the FFN.

Every parameter carries logical axis names (`vocab`, `embed`, `heads`, `kv`, `mlp`) and the main
activations are constrained to (`batch`, `length`, ...): the sharding rules in the training config
map these names onto a device mesh, so the model never names a device axis.
"""
from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_jax.attention import LengthMask, dropout, scaled_dot_product_attention
from transformer_jax.config import TransformerConfig


def kernel_init(cfg: TransformerConfig, in_axis=-2, out_axis=-1, batch_axis=()):
  """Xavier/Glorot uniform (the paper's tensor2tensor code) or N(0, 0.02) (BERT/GPT practice).

  For multi-axis kernels such as `[embed, heads, kv]` the fans are taken over the axes that form
  the equivalent 2-D matrix (`[d_model, heads * kv]`), so the variance is that of a plain Dense.
  `batch_axis` holds stacked kernels (the 3 of a fused `[embed, 3, heads, kv]` Q/K/V kernel):
  each gets the variance it would have on its own.
  """
  if cfg.kernel_init == "normal":
    return nn.initializers.normal(stddev=0.02)
  return nn.initializers.variance_scaling(1.0, "fan_avg", "uniform", in_axis=in_axis,
                                          out_axis=out_axis, batch_axis=batch_axis)


def constrain(x, names):
  return nn.with_logical_constraint(x, names)


class Embed(nn.Module):
  """A token embedding table `[vocab, embed]`, also usable as the tied output projection."""

  config: TransformerConfig
  num_embeddings: int

  def setup(self):
    cfg = self.config
    # With the sqrt(d_model) scale, N(0, d_model^-0.5) gives embeddings of unit variance, the
    # same scale as the sinusoidal encodings they are added to (tensor2tensor's choice).
    self.embedding = self.param(
        "embedding",
        nn.with_logical_partitioning(nn.initializers.normal(stddev=cfg.d_model**-0.5),
                                     ("vocab", "embed")),
        (self.num_embeddings, cfg.d_model), cfg.params_dtype)

  def __call__(self, ids):
    cfg = self.config
    x = jnp.take(jnp.asarray(self.embedding, cfg.compute_dtype), ids, axis=0)
    if cfg.scale_embeddings:
      x = x * jnp.asarray(math.sqrt(cfg.d_model), cfg.compute_dtype)
    return x

  def attend(self, x):
    """Logits `x @ E^T`: the pre-softmax linear layer sharing the embedding weights."""
    return jnp.einsum("...d,vd->...v", x, jnp.asarray(self.embedding, x.dtype))


class Projection(nn.Module):
  """`x @ W (+ b)` for a kernel with several input or output axes, e.g. `[embed, heads, kv]`.

  Used by attention only, so the bias follows `attention_bias` (off, as the paper's equations).

  Written out instead of `nn.DenseGeneral`, which initialises its kernel flattened to 2-D and so
  cannot carry one logical name per axis through Flax's metadata checks under a mesh.
  """

  config: TransformerConfig
  kernel_shape: tuple[int, ...]
  num_in: int                      # leading kernel axes contracted with x's trailing axes
  names: tuple[str | None, ...]
  stacked: tuple[int, ...] = ()    # output axes that stack separate kernels (for the init only)

  @nn.compact
  def __call__(self, x):
    cfg = self.config
    n = len(self.kernel_shape)
    in_axes = tuple(range(self.num_in))
    out_axes = tuple(a for a in range(self.num_in, n) if a not in self.stacked)
    kernel = self.param(
        "kernel", nn.with_logical_partitioning(
            kernel_init(cfg, in_axes, out_axes, self.stacked), self.names),
        self.kernel_shape, cfg.params_dtype)
    x = x.astype(cfg.compute_dtype)
    y = jnp.tensordot(x, jnp.asarray(kernel, cfg.compute_dtype),
                      axes=(tuple(range(x.ndim - self.num_in, x.ndim)), in_axes))
    if cfg.attention_bias:
      bias = self.param(
          "bias", nn.with_logical_partitioning(nn.initializers.zeros, self.names[self.num_in:]),
          self.kernel_shape[self.num_in:], cfg.params_dtype)
      y = y + jnp.asarray(bias, cfg.compute_dtype)
    return y


class KVCache(nn.Module):
  """Cache variables of one attention module in decode mode, written by `store`.

  A module of its own because Flax creates variables only in `setup` or in the one `compact`
  method of a module, while attention writes its cache from two methods (`prime` and a step).
  The cache is never part of a checkpoint.
  """

  @nn.compact
  def __call__(self, **values):
    for name, value in values.items():
      self.variable("cache", name, jnp.zeros, value.shape, value.dtype).value = value

  def read(self, *names):
    return tuple(self.get_variable("cache", name) for name in names)


class MultiHeadAttention(nn.Module):
  """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O,
  head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

  `cache` says how it behaves when `config.decode` is True:
    "none": never cached (encoder self-attention);
    "self": decoder self-attention; keys and values are appended one position per call;
    "cross": encoder-decoder attention; `prime` computes the keys and values of the encoder output
      once per batch of sentences, and every decoding step reads them from the cache.

  With `fused_qkv`, self-attention computes Q, K and V in one matmul ("qkv") and cross-attention
  K and V in one ("kv"): its queries come from the decoder and its keys from the encoder.
  """

  config: TransformerConfig
  cache: str = "none"

  def setup(self):
    cfg = self.config
    heads = (cfg.num_heads, cfg.head_dim)
    in_names = ("embed", "heads", "kv")
    self.fused_self = cfg.fused_qkv and self.cache != "cross"
    if self.fused_self:
      self.qkv = _stacked_projection(cfg, 3)
    else:
      self.query = Projection(cfg, (cfg.d_model,) + heads, 1, in_names)
      if cfg.fused_qkv:
        self.kv = _stacked_projection(cfg, 2)
      else:
        self.key = Projection(cfg, (cfg.d_model,) + heads, 1, in_names)
        self.value = Projection(cfg, (cfg.d_model,) + heads, 1, in_names)
    self.out = Projection(cfg, heads + (cfg.d_model,), 2, ("heads", "kv", "embed"))
    if cfg.decode and self.cache != "none":
      self.kv_cache = KVCache()

  def _project_kv(self, inputs_kv):
    if self.config.fused_qkv:
      return _split_heads(self.kv(inputs_kv), 2)
    return (_constrain_heads(self.key(inputs_kv)), _constrain_heads(self.value(inputs_kv)))

  def prime(self, inputs_kv, kv_valid):
    """Cross-attention in decode mode: compute and cache the keys and values of `inputs_kv`
    (`[batch, kv_len, d_model]`, the encoder output) and which of them are real (`kv_valid`,
    `[batch, kv_len]`). Done once per batch of source sentences."""
    if not (self.config.decode and self.cache == "cross"):
      raise ValueError("prime is only for cross-attention in decode mode")
    k, v = self._project_kv(inputs_kv)
    # Stored head-major, [batch, heads, kv_len, kv], the layout the attention reads: every
    # decoding step would otherwise transpose them again (12 copies a step in a 3-layer decoder,
    # 17% of greedy search on the 2-core CPU; docs/benchmarks.md).
    self.kv_cache(cross_key=k.swapaxes(1, 2), cross_value=v.swapaxes(1, 2),
                  cross_valid=kv_valid.astype(jnp.bool_))

  def __call__(self, inputs_q, inputs_kv=None, mask=None):
    """inputs_q `[batch, q_len, d_model]`; inputs_kv defaults to inputs_q (self-attention).

    `mask` is boolean, broadcastable to `[batch, heads, q_len, kv_len]`, or an
    `attention.LengthMask` (unpacked right-padded rows; cuDNN takes it as sequence lengths). In
    decode mode the cache supplies the masks.
    """
    cfg = self.config
    if self.fused_self and inputs_kv is not None and inputs_kv is not inputs_q:
      raise ValueError("fused_qkv: a self-attention module takes inputs_kv=None")
    inputs_kv = inputs_q if inputs_kv is None else inputs_kv
    if self.fused_self:
      q, k, v = _split_heads(self.qkv(inputs_q), 3)
    else:
      q = _constrain_heads(self.query(inputs_q))
    head_major = False  # whether k, v are [batch, heads, kv_len, kv] (the decoding cache)
    if cfg.decode and self.cache == "cross":
      if not self.kv_cache.has_variable("cache", "cross_key"):
        # Model initialisation in decode mode: create the cache from the encoder output's shape.
        self.prime(inputs_kv, jnp.ones(inputs_kv.shape[:2], jnp.bool_))
      k, v, valid = self.kv_cache.read("cross_key", "cross_value", "cross_valid")
      mask, head_major = valid[:, None, None, :], True
    else:
      if not self.fused_self:
        k, v = self._project_kv(inputs_kv)
      if cfg.decode and self.cache == "self":
        k, v, mask, head_major = self._append_to_cache(inputs_q, k, v)
    rows, sources = q.shape[0], k.shape[0]
    if head_major and rows != sources:
      # Beam search: the cache holds each source's keys/values once (cross-attention), or all of
      # its beam slots (self-attention, `_append_to_beam_cache`), and the `rows // sources`
      # hypotheses of a source (consecutive rows) are that source's queries, so the keys and
      # values are read once per source instead of once per beam.
      if q.shape[1] != 1 or rows % sources:
        raise ValueError(f"{self.cache}-attention cache of {sources} sources for {rows} rows of "
                         f"{q.shape[1]} positions: expected one position and a multiple")
      q = q.reshape((sources, rows // sources) + q.shape[2:])

    dropout_rng = None
    if not cfg.deterministic and cfg.attention_dropout_rate > 0.0:
      dropout_rng = self.make_rng("dropout")
    live = None  # fused attention: which rows may attend somewhere, when not all may
    if cfg.attention_impl == "cudnn":
      if head_major:
        k, v = k.swapaxes(1, 2), v.swapaxes(1, 2)
      x, live = fused_attention_rows(cfg, q, k, v, mask)
    else:
      if isinstance(mask, LengthMask):
        mask = mask.dense(q.shape[1], k.shape[2 if head_major else 1])
      # [batch, length, heads, kv] -> [batch, heads, length, kv] for the head-batched formula.
      if not head_major:
        k, v = k.swapaxes(1, 2), v.swapaxes(1, 2)
      x, weights = scaled_dot_product_attention(
          q.swapaxes(1, 2), k, v, mask=mask, dropout_rate=cfg.attention_dropout_rate,
          dropout_rng=dropout_rng)
      self.sow("intermediates", "attention_weights", weights)
      x = x.swapaxes(1, 2)
    # Grouped beams ([sources, beams, ...]) back to one row per hypothesis; otherwise a no-op.
    x = x.reshape(inputs_q.shape[:2] + x.shape[2:])
    y = self.out(_constrain_heads(x))
    if live is not None:
      # A row that attends nowhere gets what the reference's zero attention output projects
      # to: the bias (0 @ W^O + b rounds to b exactly), or zero. No gradient reaches its query.
      fill = 0.0
      if cfg.attention_bias:
        fill = jnp.asarray(nn.unbox(self.out.variables["params"]["bias"]), y.dtype)
      y = jnp.where(live.reshape(inputs_q.shape[:2] + (1,)), y, fill)
    return constrain(y, ("batch", "length", "embed"))

  def _append_to_cache(self, inputs_q, k, v):
    """Decoder self-attention in decode mode: (all keys, all values, mask, head-major) after
    writing this position's key and value. The first call (model initialisation) creates the
    cache, sized by the target length it is given, and attends as in training. The cache is
    head-major, [batch, heads, max_len, kv], as the cross-attention's (see `prime`)."""
    if not self.kv_cache.has_variable("cache", "cached_key"):
      self.kv_cache(cached_key=jnp.zeros_like(k.swapaxes(1, 2)),
                    cached_value=jnp.zeros_like(v.swapaxes(1, 2)),
                    cache_index=jnp.array(0, jnp.int32))
      return k, v, None, False
    if inputs_q.shape[1] != 1:
      raise ValueError(f"decode mode takes one target position per call, got {inputs_q.shape[1]}")
    cached_k, cached_v, i = self.kv_cache.read("cached_key", "cached_value", "cache_index")
    k, v = k.swapaxes(1, 2), v.swapaxes(1, 2)  # [rows, heads, 1, kv]
    if self.kv_cache.has_variable("cache", "cache_rows"):
      return self._append_to_beam_cache(cached_k, cached_v, i, k, v)
    cached_k = jax.lax.dynamic_update_slice(cached_k, k, (0, 0, i, 0))
    cached_v = jax.lax.dynamic_update_slice(cached_v, v, (0, 0, i, 0))
    self.kv_cache(cached_key=cached_k, cached_value=cached_v, cache_index=i + 1)
    # The new query sees every cached position up to and including its own.
    return cached_k, cached_v, (jnp.arange(cached_k.shape[2]) <= i)[None, None, None, :], True

  def _append_to_beam_cache(self, cached_k, cached_v, i, k, v):
    """Beam search's self-attention cache (search.py): keys and values stay where they were
    written, values `[sources, heads, positions x beams, kv]` (position t of beam slot c at
    t * beams + c) and keys transposed, `[sources, heads, kv, positions x beams]`, and
    `cache_rows` `[rows, positions]` says which beam slot of the same source holds each position
    of the hypothesis in each row. Reordering the beams then moves only `cache_rows`: moving the
    keys and values (a gather and a copy of the whole cache per layer and step) was a fifth of
    beam search's time on the 2-core CPU (docs/benchmarks.md). The keys are transposed for the
    product with the `beams` queries of a source: XLA:CPU's batched matmul of [beams, kv] by
    [kv, slots] took half the time of [beams, kv] by [slots, kv]^T (same results).

    Returns (keys, values, mask, head-major) for the grouped attention that cross-attention
    does too: each source's `beams` queries against all of its `positions x beams` keys, the
    mask keeping, for each query, its own hypothesis's positions up to `i`."""
    (rows,) = self.kv_cache.read("cache_rows")
    sources, heads, depth, _ = cached_k.shape
    beams, length = rows.shape[0] // sources, rows.shape[1]
    # [rows, heads, 1, kv] -> [sources, heads, beams, kv]: positions i * beams ... + beams - 1
    k, v = (x.reshape(sources, beams, heads, depth).swapaxes(1, 2) for x in (k, v))
    cached_k = jax.lax.dynamic_update_slice(cached_k, k.swapaxes(2, 3), (0, 0, 0, i * beams))
    cached_v = jax.lax.dynamic_update_slice(cached_v, v, (0, 0, i * beams, 0))
    slot = jnp.arange(sources * beams, dtype=rows.dtype)[:, None] % beams
    rows = jax.lax.dynamic_update_slice(rows, slot, (0, i))
    self.kv_cache(cached_key=cached_k, cached_value=cached_v, cache_index=i + 1, cache_rows=rows)
    # [sources, beams (queries), positions, beams (slots)] -> [sources, 1, beams, keys]
    held = rows.reshape(sources, beams, length, 1) == jnp.arange(beams)
    mask = held & (jnp.arange(length) <= i)[:, None]
    return (cached_k.swapaxes(2, 3), cached_v,
            mask.reshape(sources, 1, beams, length * beams), True)


def _stacked_projection(cfg: TransformerConfig, num: int) -> "Projection":
  """`num` projections in one `[d_model, num * d_model]` matmul instead of `num` of
  `[d_model, d_model]`: larger matrices keep the matmul units busier and read `x` once."""
  return Projection(cfg, (cfg.d_model, num, cfg.num_heads, cfg.head_dim), 1,
                    ("embed", None, "heads", "kv"), stacked=(1,))


def _constrain_heads(x):
  return constrain(x, ("batch", "length", "heads", "kv"))


def _split_heads(y, num: int):
  """`[batch, length, num, heads, kv]` -> `num` arrays of `[batch, length, heads, kv]`."""
  return tuple(_constrain_heads(y[:, :, i]) for i in range(num))


def fused_attention(cfg: TransformerConfig, q, k, v, mask):
  """`jax.nn.dot_product_attention`: cuDNN's fused kernel on GPUs for 16-bit inputs, else XLA.

  On `[batch, length, heads, kv]` arrays; `mask` is boolean (broadcastable to `[batch, 1, q_len,
  kv_len]`), an `attention.LengthMask`, or None. A query that may attend nowhere (padding) gets a
  zero output, as `scaled_dot_product_attention`'s. `scripts/check_accelerator.py` checks it against
  the float32 reference on GPUs.
  """
  x, live = fused_attention_rows(cfg, q, k, v, mask)
  return x if live is None else jnp.where(live, x, 0)


def fused_attention_rows(cfg: TransformerConfig, q, k, v, mask):
  """(`fused_attention` without its zeroing, which query rows are live `[batch, q_len, 1, 1]`
  or None when all are): the output of a row that may attend nowhere is then its attention over
  all keys, for the caller to replace. `MultiHeadAttention` does so after its output projection,
  where XLA fuses the select into the residual's kernel (before it, the select was a pass of its
  own over the attention output, forward and backward: 0.66 ms of a 42 ms transformer-base step
  on an H100, docs/benchmarks.md).
  """
  implementation = None
  if jax.default_backend() == "gpu" and cfg.compute_dtype in (jnp.bfloat16, jnp.float16):
    implementation = "cudnn"
  if isinstance(mask, LengthMask):
    # No bias for the kernel to read: cuDNN masks by the lengths (and causality) itself, and
    # skips the blocks they rule out. It is given at least one query and one key per row; the
    # rows of a row with no keys, and the padding queries, are dead and replaced by the caller.
    x = jax.nn.dot_product_attention(
        q, k, v, is_causal=mask.causal, query_seq_lengths=jnp.maximum(mask.query_lengths, 1),
        key_value_seq_lengths=jnp.maximum(mask.key_lengths, 1), implementation=implementation)
    live = (jnp.arange(q.shape[1]) < mask.query_lengths[:, None]) & (mask.key_lengths[:, None] > 0)
    return x, live[:, :, None, None]
  if mask is None:
    return jax.nn.dot_product_attention(q, k, v, implementation=implementation), None
  mask = jnp.broadcast_to(mask, (q.shape[0], 1, q.shape[1], k.shape[1]))
  live = jnp.any(mask, axis=-1, keepdims=True)
  # A query that may attend nowhere gets an all-allowed row, so no softmax row is empty inside
  # the kernel (cuDNN's backward gave NaN for such rows on an H100).
  x = jax.nn.dot_product_attention(q, k, v, mask=mask | ~live, implementation=implementation)
  # live [batch, 1, q_len, 1] -> [batch, q_len, 1, 1] against x [batch, q_len, heads, kv]
  # (squeeze, not [:, 0]: JAX clamps an out-of-range index, so [:, 1] would pass unnoticed).
  return x, live.squeeze(1)[..., None]


class Dropout(nn.Module):
  """`nn.Dropout` with the cheaper mask of `attention.keep_mask` (16-bit random numbers).

  Same interface and the same "dropout" RNG stream; the masks differ from `nn.Dropout`'s.
  """

  rate: float

  @nn.compact
  def __call__(self, x, deterministic: bool):
    if deterministic or self.rate == 0.0:
      return x
    return dropout(self.make_rng("dropout"), self.rate, x)


# config.CHOICES["activation"] names these (a test checks the two agree): a name added there
# alone is a KeyError here, never another activation in its place. "gelu" is flax's default,
# the tanh approximation (PyTorch's nn.GELU(approximate="tanh")).
ACTIVATIONS = {"relu": nn.relu, "gelu": nn.gelu}


class FeedForward(nn.Module):
  """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2 (or GELU), optional dropout after the activation."""

  config: TransformerConfig

  @nn.compact
  def __call__(self, x):
    cfg = self.config

    def dense(features, names, name):
      return nn.Dense(
          features, use_bias=cfg.use_bias, dtype=cfg.compute_dtype, param_dtype=cfg.params_dtype,
          kernel_init=nn.with_logical_partitioning(kernel_init(cfg), names),
          bias_init=nn.with_logical_partitioning(nn.initializers.zeros, names[1:]), name=name)

    h = dense(cfg.d_ff, ("embed", "mlp"), "wi")(x)
    h = ACTIVATIONS[cfg.activation](h)
    h = constrain(h, ("batch", "length", "mlp"))
    h = Dropout(cfg.relu_dropout_rate)(h, deterministic=cfg.deterministic)
    return constrain(dense(cfg.d_model, ("mlp", "embed"), "wo")(h), ("batch", "length", "embed"))


class LayerNorm(nn.Module):
  config: TransformerConfig

  @nn.compact
  def __call__(self, x):
    cfg = self.config
    return nn.LayerNorm(
        epsilon=cfg.layer_norm_epsilon, dtype=cfg.compute_dtype, param_dtype=cfg.params_dtype,
        scale_init=nn.with_logical_partitioning(nn.initializers.ones, ("embed",)),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)),
        name="norm")(x)


class Residual(nn.Module):
  """One sublayer with dropout, residual and LayerNorm in the configured position.

  post (the paper): LayerNorm(x + Dropout(Sublayer(x)));  pre: x + Dropout(Sublayer(LayerNorm(x))).
  """

  config: TransformerConfig

  def setup(self):
    self.norm = LayerNorm(self.config)
    self.dropout = Dropout(self.config.dropout_rate)

  def __call__(self, x, sublayer):
    cfg = self.config
    if cfg.norm_position == "pre":
      return x + self.dropout(sublayer(self.norm(x)), deterministic=cfg.deterministic)
    return self.norm(x + self.dropout(sublayer(x), deterministic=cfg.deterministic))
