"""Scaled dot-product attention, the masks it takes, and the sinusoidal position encoding.

Plain functions on arrays, no Flax: they are the equations of the paper, and the modules in
`layers.py` are built on them. Masks are boolean, True where attention is allowed, shaped to
broadcast against attention logits `[batch, heads, q_len, kv_len]`.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np


def scaled_dot_product_attention(query, key, value, mask=None, dropout_rate: float = 0.0,
                                 dropout_rng=None):
  """softmax(Q K^T / sqrt(d_k)) V over the last two axes; any leading batch/head axes.

  Args:
    query: `[..., q_len, d_k]`. key: `[..., kv_len, d_k]`. value: `[..., kv_len, d_v]`.
    mask: boolean, broadcastable to `[..., q_len, kv_len]`, True where a query may attend.
    dropout_rate: dropout on the attention weights (applied only when `dropout_rng` is given).
    dropout_rng: PRNG key for that dropout.

  Returns:
    `(output [..., q_len, d_v], weights [..., q_len, kv_len])`. `weights` are the softmax
    probabilities before dropout. A query whose whole row is masked (a padding position) gets
    zero weights and a zero output rather than NaN.
  """
  dtype = query.dtype
  depth = query.shape[-1]
  # Scale the query, not the logits: the same maths, one multiply on the smaller tensor.
  query = query / jnp.sqrt(depth).astype(dtype)
  logits = jnp.einsum("...qd,...kd->...qk", query, key)
  # Softmax in float32 even for bfloat16 compute: exp and the row sum lose too much otherwise.
  logits = logits.astype(jnp.float32)
  if mask is not None:
    logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
  weights = jax.nn.softmax(logits, axis=-1)
  if mask is not None:
    # A fully masked row would otherwise be a uniform average over padding.
    weights = jnp.where(jnp.any(mask, axis=-1, keepdims=True), weights, 0.0)
  weights = weights.astype(dtype)
  attend = weights
  if dropout_rate > 0.0 and dropout_rng is not None:
    attend = dropout(dropout_rng, dropout_rate, weights)
  output = jnp.einsum("...qk,...kd->...qd", attend, value)
  return output, weights


_THREEFRY_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def _threefry2x32(k1, k2, x1, x2):
  """Threefry-2x32 (20 rounds), as `jax._src.random.threefry2x32._threefry2x32_lowering`
  unrolled: the same additions, rotations and key schedule, written with jnp ops."""
  ks = (k1, k2, k1 ^ k2 ^ np.uint32(0x1BD11BDA))
  x1, x2 = x1 + ks[0], x2 + ks[1]
  for i in range(5):
    for r in _THREEFRY_ROTATIONS[i % 2]:
      x1 = x1 + x2
      x2 = x1 ^ ((x2 << np.uint32(r)) | (x2 >> np.uint32(32 - r)))
    x1 = x1 + ks[(i + 1) % 3]
    x2 = x2 + ks[(i + 2) % 3] + np.uint32(i + 1)
  return x1, x2


def random_bits(rng, shape) -> jax.Array:
  """`jax.random.bits(rng, shape, jnp.uint32)`, bit for bit, as one fusible expression.

  On CPU, JAX lowers its threefry hash as a rolled loop of 5 iterations (a smaller program to
  compile), and XLA:CPU runs each iteration as separate passes over the whole array, with
  copies of the loop state between them. Written out as elementwise ops, the hash fuses into
  one pass with the mask's compare: the train step of `configs/cpu_reference.py` is about 4%
  faster on the 2-core CPU (docs/benchmarks.md). On GPUs JAX lowers it unrolled anyway.

  The bits are those of JAX's partitionable threefry (`jax_threefry_partitionable`, on by
  default): threefry2x32 of the key and each element's 64-bit row-major index, the two output
  words xor-ed. The index is built from per-axis iotas, so a sharded array partitions it as
  JAX's does. Other key implementations, the non-partitionable scheme, scalars, and arrays of
  2^32 elements or more go to `jax.random.bits` itself.
  """
  shape = tuple(shape)
  size = int(np.prod(shape))
  data = jax.random.key_data(rng)
  if (str(jax.random.key_impl(rng)) != "threefry2x32" or data.shape != (2,) or not shape
      or size >= 2**32 or not jax.config.jax_threefry_partitionable):
    return jax.random.bits(rng, shape, jnp.uint32)
  k1, k2 = data
  strides = np.cumprod((shape[1:] + (1,))[::-1])[::-1]
  index = sum(jax.lax.broadcasted_iota(jnp.uint32, shape, axis) * np.uint32(stride)
              for axis, stride in enumerate(strides))
  # The index's high word (x1) is 0 below 2^32 elements.
  x1, x2 = _threefry2x32(k1, k2, jnp.zeros(shape, jnp.uint32), index)
  return x1 ^ x2


def keep_mask(rng, rate: float, shape) -> tuple[jax.Array, float]:
  """(boolean mask of `shape`, True with probability 1 - `rate`; that probability, exactly).

  The mask compares 16-bit random numbers with a threshold, two from each 32-bit word of
  `random_bits` (`jax.random.bits`'s): JAX's threefry (partitionable, so the bits do not
  depend on the sharding) hashes once per word it returns, so this is half the hashing of
  `jax.random.bernoulli`, which draws one float32 per element. The rate is rounded to a multiple
  of 1/65536 (0.1 -> 0.10001), and the returned probability is the rounded one, to scale by.
  Measured on the 2-core CPU: dropout of 4.5M elements took 16 ms against 37 ms for
  `bernoulli` (docs/benchmarks.md).
  """
  shape = tuple(shape)
  if not shape:
    raise ValueError("keep_mask: shape must have at least one axis")
  if not 0.0 <= rate <= 1.0:
    raise ValueError(f"dropout rate {rate} must be in [0, 1]")
  threshold = round(rate * 65536)  # drop where the 16-bit number < threshold
  if threshold == 65536:  # every 16-bit number is below it
    return jnp.zeros(shape, jnp.bool_), 0.0
  last, words = shape[-1], (shape[-1] + 1) // 2
  bits = random_bits(rng, (*shape[:-1], words))
  # [..., words] uint32 -> [..., words, 2] uint16 -> [..., 2 * words], packing along the last
  # axis only, so a sharding of the leading axes carries over.
  halves = jax.lax.bitcast_convert_type(bits, jnp.uint16).reshape(*shape[:-1], 2 * words)
  return halves[..., :last] >= jnp.uint16(threshold), 1.0 - threshold / 65536


def dropout(rng, rate: float, x):
  """Inverted dropout: zero elements with probability `rate`, scale the rest by 1 / keep."""
  keep, keep_prob = keep_mask(rng, rate, x.shape)
  if keep_prob == 0.0:
    return jnp.zeros_like(x)
  # Scale in float32: 1 / keep_prob rounded to bfloat16 would bias every kept value (-0.16% at
  # rate 0.1); each product is rounded once instead.
  scaled = (x.astype(jnp.float32) * (1.0 / keep_prob)).astype(x.dtype)
  return jnp.where(keep, scaled, jnp.zeros((), x.dtype))


def causal_mask(length: int, dtype=jnp.bool_):
  """`[1, 1, length, length]`, True where key position <= query position."""
  idx = jnp.arange(length)
  return (idx[None, :] <= idx[:, None]).astype(dtype)[None, None]


def padding_mask(query_valid, key_valid):
  """`[batch, 1, q_len, kv_len]` from per-token validity `[batch, q_len]` and `[batch, kv_len]`.

  A pair is allowed only when both the query and the key are real tokens.
  """
  return (query_valid[:, None, :, None].astype(bool) & key_valid[:, None, None, :].astype(bool))


def segment_mask(query_segments, key_segments):
  """`[batch, 1, q_len, kv_len]` for packed rows: True where both tokens are in the same sentence.

  Segment ids are >= 1 for real tokens and 0 for padding; padding attends nowhere.
  """
  q = query_segments[:, None, :, None]
  k = key_segments[:, None, None, :]
  return (q == k) & (k > 0)  # which is q > 0 as well


def row_lengths(valid) -> jax.Array:
  """`[batch]` int32: one past each row's last real token (0 for a row with none).

  For right-padded rows (every unpacked batch the data pipeline and the decoders build) this is
  the number of real tokens. A padding token inside a row would count as real here."""
  index = jnp.arange(1, valid.shape[1] + 1, dtype=jnp.int32)
  return jnp.max(jnp.where(valid, index, 0), axis=1)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LengthMask:
  """The mask of unpacked, right-padded rows, given as lengths instead of a dense array.

  Query i of row b may attend key j when i < query_lengths[b] and j < key_lengths[b] (and
  j <= i when `causal`): what `padding_mask` (and `causal_mask`) build densely from per-token
  validity, when each row's padding is all at its end. cuDNN's fused attention takes the lengths
  and the causal flag as they are, instead of a `[batch, 1, q_len, kv_len]` bias read by every
  head (layers.fused_attention_rows); `dense` gives the boolean mask for everything else.
  A pytree: the lengths are its leaves, `causal` is static.
  """

  query_lengths: jax.Array  # [batch] int32
  key_lengths: jax.Array    # [batch] int32
  causal: bool = dataclasses.field(default=False, metadata=dict(static=True))

  def dense(self, q_len: int, kv_len: int):
    """The same mask as a boolean `[batch, 1, q_len, kv_len]` array."""
    mask = padding_mask(jnp.arange(q_len) < self.query_lengths[:, None],
                        jnp.arange(kv_len) < self.key_lengths[:, None])
    if not self.causal:
      return mask
    # Key j <= query i, top-left aligned as cuDNN's causal mask (q_len == kv_len in the model).
    return mask & (jnp.arange(kv_len)[None, :] <= jnp.arange(q_len)[:, None])


def combine_masks(*masks):
  """Logical AND of the masks that are not None (None when all are)."""
  masks = [m for m in masks if m is not None]
  if not masks:
    return None
  out = masks[0]
  for m in masks[1:]:
    out = out & m
  return out


def sinusoidal_position_encoding(length: int, dim: int, base: float = 10000.0):
  """`[length, dim]` with PE(pos, 2i) = sin(pos / base^(2i/dim)), PE(pos, 2i+1) = cos(same).

  Sines and cosines interleave exactly as the formula says (Flax's WMT example concatenates them
  instead, which is a different, permuted encoding). Computed in NumPy float64 so the table is a
  constant folded into the compiled step.
  """
  if dim % 2:
    raise ValueError(f"sinusoidal_position_encoding: dim={dim} must be even")
  pos = np.arange(length, dtype=np.float64)[:, None]
  two_i = np.arange(0, dim, 2, dtype=np.float64)[None, :]
  angle = pos / np.power(base, two_i / dim)
  pe = np.zeros((length, dim), dtype=np.float64)
  pe[:, 0::2] = np.sin(angle)
  pe[:, 1::2] = np.cos(angle)
  return jnp.asarray(pe, dtype=jnp.float32)
