"""Encoder, Decoder and the Transformer of "Attention Is All You Need".

Batches may be packed: several sentence pairs share one row, told apart by segment ids (>= 1,
0 for padding) and positions that restart at 0 in each segment. Packed sentences never attend
across segments (all three attentions) and the decoder's right shift restarts in each segment.

Decode mode (one target token at a time, for search): build the model from
`config.replace(decode=True, deterministic=True)`, make a zero cache with `init_cache`, call
`prime_cache` once per batch of source sentences (the encoder-decoder keys and values are
computed there, once), then `decode_step` one target token at a time. `transformer_jax.search`
does this; `teacher_forced_logits` is the training-time pass over whole target sequences.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.attention import (
  LengthMask,
  causal_mask,
  combine_masks,
  padding_mask,
  row_lengths,
  segment_mask,
  sinusoidal_position_encoding,
)
from transformer_jax.config import TransformerConfig
from transformer_jax.layers import (
  Dropout,
  Embed,
  FeedForward,
  LayerNorm,
  MultiHeadAttention,
  Residual,
  constrain,
  kernel_init,
)


def shift_right(targets, bos_id: int, segment_ids=None):
  """Decoder inputs: targets moved one step right with `bos_id` in front.

  With segment ids, every segment starts with `bos_id` instead of the previous segment's last
  token, so no packed sentence sees another's tokens through the shift.
  """
  shifted = jnp.pad(targets, ((0, 0), (1, 0)), constant_values=bos_id)[:, :-1]
  if segment_ids is not None:
    previous = jnp.pad(segment_ids, ((0, 0), (1, 0)))[:, :-1]
    shifted = jnp.where(segment_ids != previous, bos_id, shifted)
  return shifted


def _lengths_for_masks(cfg: TransformerConfig) -> bool:
  """Whether unpacked rows' masks go to the attention as `LengthMask`s (cuDNN's lengths)."""
  return cfg.attention_impl == "cudnn" and cfg.padding_as_lengths


def _row_lengths(valid):
  # Split as the rows are: cuDNN's sharding rule does not tie the lengths to the batch axis.
  return constrain(row_lengths(valid), ("batch",))


def token_validity(tokens, segment_ids, pad_id: int):
  """Real (non-padding) tokens: segment id > 0 for packed rows, else token != pad_id."""
  return tokens != pad_id if segment_ids is None else segment_ids > 0


class PositionEncoding(nn.Module):
  """Adds the position encoding (sinusoidal, as the paper, or a learned table) to embeddings."""

  config: TransformerConfig

  @nn.compact
  def __call__(self, x, positions=None):
    cfg = self.config
    length = x.shape[1]
    if positions is None:
      positions = jnp.arange(length)[None, :]
    if cfg.position_encoding == "learned":
      if length > cfg.max_len:
        raise ValueError(f"a sequence of {length} positions is longer than the learned position "
                         f"table (TransformerConfig.max_len={cfg.max_len}): raise max_len")
      table = self.param(
          "embedding",
          nn.with_logical_partitioning(nn.initializers.normal(stddev=0.02), (None, "embed")),
          (cfg.max_len, cfg.d_model), cfg.params_dtype)
    else:
      # The formula holds at any position: cover rows longer than max_len (evaluation never
      # truncates a sentence) instead of reading past the table.
      table = sinusoidal_position_encoding(max(cfg.max_len, length), cfg.d_model)
    # Positions never exceed the row length (packed positions restart in each segment).
    return x + jnp.take(jnp.asarray(table, x.dtype), positions, axis=0, mode="clip")


class EncoderLayer(nn.Module):
  config: TransformerConfig

  def setup(self):
    self.self_attention = MultiHeadAttention(self.config)
    self.feed_forward = FeedForward(self.config)
    self.attention_block = Residual(self.config)
    self.feed_forward_block = Residual(self.config)

  def __call__(self, x, mask):
    x = self.attention_block(x, lambda h: self.self_attention(h, mask=mask))
    return self.feed_forward_block(x, self.feed_forward)


class DecoderLayer(nn.Module):
  config: TransformerConfig

  def setup(self):
    self.self_attention = MultiHeadAttention(self.config, cache="self")
    self.cross_attention = MultiHeadAttention(self.config, cache="cross")
    self.feed_forward = FeedForward(self.config)
    self.self_attention_block = Residual(self.config)
    self.cross_attention_block = Residual(self.config)
    self.feed_forward_block = Residual(self.config)

  def prime(self, encoded, encoded_valid):
    self.cross_attention.prime(encoded, encoded_valid)

  def __call__(self, x, encoded, self_mask, cross_mask):
    x = self.self_attention_block(x, lambda h: self.self_attention(h, mask=self_mask))
    x = self.cross_attention_block(x, lambda h: self.cross_attention(h, encoded, mask=cross_mask))
    return self.feed_forward_block(x, self.feed_forward)


def _layer_class(cls, cfg: TransformerConfig):
  # Rematerialisation trades a second forward pass per layer for not storing its activations.
  return nn.remat(cls) if cfg.remat == "layer" else cls


class _Stack(nn.Module):
  """What the encoder and decoder share: embedding + position encoding + dropout on the way in,
  N layers, and (pre-LN) a final LayerNorm on the way out."""

  config: TransformerConfig
  embedding: Embed

  def _setup_stack(self, layer_cls, num_layers: int):
    cfg = self.config
    self.position = PositionEncoding(cfg)
    self.dropout = Dropout(cfg.dropout_rate)
    layer = _layer_class(layer_cls, cfg)
    self.layers = [layer(cfg, name=f"layer_{i}") for i in range(num_layers)]
    if cfg.norm_position == "pre":
      self.final_norm = LayerNorm(cfg)

  def _embed(self, tokens, positions):
    x = self.position(self.embedding(tokens), positions)
    x = self.dropout(x, deterministic=self.config.deterministic)
    return constrain(x, ("batch", "length", "embed"))

  def _finish(self, x):
    return self.final_norm(x) if self.config.norm_position == "pre" else x


class Encoder(_Stack):

  def setup(self):
    self._setup_stack(EncoderLayer, self.config.num_encoder_layers)

  def __call__(self, inputs, positions=None, segment_ids=None):
    cfg = self.config
    valid = token_validity(inputs, segment_ids, cfg.pad_id)
    if segment_ids is None and _lengths_for_masks(cfg):
      lengths = _row_lengths(valid)
      mask = LengthMask(lengths, lengths)
    else:
      mask = combine_masks(padding_mask(valid, valid),
                           None if segment_ids is None else segment_mask(segment_ids, segment_ids))
    x = self._embed(inputs, positions)
    for layer in self.layers:
      x = layer(x, mask)
    return self._finish(x)


class Decoder(_Stack):

  def setup(self):
    cfg = self.config
    self._setup_stack(DecoderLayer, cfg.num_decoder_layers)
    if cfg.decode:
      # How many tokens this cache has seen: the position of the next one.
      self.cache_ready = self.has_variable("cache", "decode_position")
      self.next_position = self.variable("cache", "decode_position",
                                         lambda: jnp.array(0, jnp.int32))
      if cfg.tie_output_embedding:
        # The tied output projection E^T `[embed, vocab]`, transposed once per batch by `prime`:
        # a step multiplying by E `[vocab, embed]` itself was 20-30% slower on the 2-core CPU.
        self.output_kernel = self.variable(
            "cache", "output_kernel", jnp.zeros, (cfg.d_model, cfg.output_vocab_size),
            cfg.compute_dtype)
    if not cfg.tie_output_embedding:
      self.logits_dense = nn.Dense(
          cfg.output_vocab_size, use_bias=cfg.use_bias, dtype=cfg.compute_dtype,
          param_dtype=cfg.params_dtype,
          kernel_init=nn.with_logical_partitioning(kernel_init(cfg), ("embed", "vocab")),
          bias_init=nn.with_logical_partitioning(nn.initializers.zeros, ("vocab",)))

  def prime(self, encoded, encoded_valid):
    for layer in self.layers:
      layer.prime(encoded, encoded_valid)
    if self.config.tie_output_embedding:
      self.output_kernel.value = jnp.asarray(self.embedding.embedding,
                                             self.config.compute_dtype).T

  def __call__(self, encoded, decoder_inputs, positions=None, self_mask=None, cross_mask=None):
    cfg = self.config
    if cfg.decode and self.cache_ready:
      positions = jnp.broadcast_to(self.next_position.value, decoder_inputs.shape)
      self.next_position.value = self.next_position.value + 1
    y = self._embed(decoder_inputs, positions)
    for layer in self.layers:
      y = layer(y, encoded, self_mask, cross_mask)
    y = self._finish(y)
    if cfg.tie_output_embedding and cfg.decode and self.cache_ready:
      logits = jnp.einsum("...d,dv->...v", y, self.output_kernel.value.astype(y.dtype))
    elif cfg.tie_output_embedding:
      logits = self.embedding.attend(y)
    else:
      logits = self.logits_dense(y)
    return constrain(logits, ("batch", "length", "vocab"))


class Transformer(nn.Module):
  """The encoder-decoder Transformer: `__call__(inputs, targets)` -> logits `[batch, len, vocab]`.

  `targets` are the labels (ending in EOS, no BOS): the decoder sees them shifted right.
  """

  config: TransformerConfig

  def setup(self):
    cfg = self.config
    if cfg.share_embeddings:
      self.shared_embedding = Embed(cfg, cfg.vocab_size)
      source = target = self.shared_embedding
    else:
      self.source_embedding = Embed(cfg, cfg.vocab_size)
      self.target_embedding = Embed(cfg, cfg.output_vocab_size)
      source, target = self.source_embedding, self.target_embedding
    self.encoder = Encoder(cfg, embedding=source)
    self.decoder = Decoder(cfg, embedding=target)

  def encode(self, inputs, inputs_positions=None, inputs_segmentation=None):
    return self.encoder(inputs, inputs_positions, inputs_segmentation)

  def teacher_forced_logits(self, encoded, inputs, targets, targets_positions=None,
                            inputs_segmentation=None, targets_segmentation=None):
    """The decoder's logits for every target position at once, given the encoder output and
    the reference `targets` (shifted right): training, evaluation and scoring."""
    cfg = self.config
    target_valid = token_validity(targets, targets_segmentation, cfg.pad_id)
    input_valid = token_validity(inputs, inputs_segmentation, cfg.pad_id)
    packed = targets_segmentation is not None
    if not packed and _lengths_for_masks(cfg):
      target_lengths = _row_lengths(target_valid)
      self_mask = LengthMask(target_lengths, target_lengths, causal=True)
      cross_mask = LengthMask(target_lengths, _row_lengths(input_valid))
    else:
      self_mask = combine_masks(
          causal_mask(targets.shape[1]), padding_mask(target_valid, target_valid),
          segment_mask(targets_segmentation, targets_segmentation) if packed else None)
      cross_mask = combine_masks(
          padding_mask(target_valid, input_valid),
          segment_mask(targets_segmentation, inputs_segmentation) if packed else None)
    decoder_inputs = shift_right(targets, cfg.bos_id, targets_segmentation)
    return self.decoder(encoded, decoder_inputs, targets_positions, self_mask, cross_mask)

  def __call__(self, inputs, targets, inputs_positions=None, targets_positions=None,
               inputs_segmentation=None, targets_segmentation=None):
    if self.config.decode:
      # Only used by `init` in decode mode, to create the cache with the right shapes.
      encoded = self.encode(inputs)
      return self.decoder(encoded, targets)
    encoded = self.encode(inputs, inputs_positions, inputs_segmentation)
    return self.teacher_forced_logits(encoded, inputs, targets, targets_positions,
                                      inputs_segmentation, targets_segmentation)

  def prime_cache(self, encoded, inputs):
    """Decode mode: compute every layer's encoder-decoder keys/values once for these sources."""
    self.decoder.prime(encoded, inputs != self.config.pad_id)

  def decode_step(self, tokens):
    """Decode mode: logits `[batch, 1, vocab]` for the next position, given the last token
    `[batch, 1]`."""
    return self.decoder(None, tokens)


def init_cache(config: TransformerConfig, batch_size: int, source_len: int, max_decode_len: int):
  """A zero decoding cache for `batch_size` sentences of `source_len` source and up to
  `max_decode_len` target tokens (shapes only are traced; nothing is computed)."""
  model = Transformer(config.replace(decode=True, deterministic=True))
  shapes = jax.eval_shape(lambda: model.init(
      jax.random.key(0), jnp.ones((batch_size, source_len), jnp.int32),
      jnp.ones((batch_size, max_decode_len), jnp.int32)))["cache"]
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def _is_embedding(path) -> bool:
  names = [getattr(p, "key", str(p)) for p in path]
  return any("embedding" in n or n == "logits_dense" for n in names)


def count_params(params, non_embedding: bool = False) -> int:
  """Number of parameters; `non_embedding=True` leaves out token/position embedding tables and an
  untied output projection (the convention of Kaplan et al. 2020)."""
  params = nn.meta.unbox(params)
  total = 0
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    if non_embedding and _is_embedding(path):
      continue
    total += int(np.prod(leaf.shape))
  return total
