"""Greedy and beam search on the decoding cache, batched and compiled whole (`jax.lax.while_loop`).

Both searches run the encoder and the encoder-decoder keys/values once per batch (`prime_cache`),
then call `decode_step` once per target position for every row at the same time: the cache's
position counters are scalars shared by the batch, so all rows (and all beams) step together and
a row that has finished keeps stepping, its output ignored, until every row has finished.
Rows never read each other, so `search_batch` (and the Translator) may search a batch as slices
of its rows at the same time, one thread each (`in_parts`): on a CPU of 2 or more cores, two
halves by default (`concurrent_parts`), which keep both cores busy where one search's few-row
products run on about one.

Output conventions, shared by both searches:
  * tokens `[batch, T]` are what follows BOS: the output ends with EOS, then `pad_id` to the end.
  * the padding token is never produced: its log-probability is set to -inf (not renormalised),
    so "tokens != pad_id" is exactly the output and `lengths` counts it, EOS included.
  * a sentence may produce at most `limit = min(source_length + max_len_margin, T)` tokens, with
    source_length its number of non-padding tokens (the paper: input length + 50), and T the static
    buffer `max_decode_len or (padded source length + max_len_margin)`, capped at `config.max_len`
    (the decoder has no positions beyond it). A sentence that reaches its limit without EOS stops
    there: its output is `limit` tokens with no EOS (beam search treats it as a finished
    hypothesis: the sum of its tokens' log-probabilities over lp(limit), no EOS term).

Beam search follows tensor2tensor's (the paper's) and Flax's `examples/wmt`: 2 * beam candidates per
step, a live set of `beam` hypotheses and a separate finished set of `beam`, GNMT's length
penalty; the differences, which make beam size 1 exactly greedy search, are in `beam_search`.

Every search (and `target_log_probs`) also takes an `Ensemble` of several models' parameters in
place of `params`: it then decodes with the mean of the models' next-token probabilities, as
fairseq's ensembles do (`log p(y) = logsumexp_m log p_m(y) - log M`), each model with its own
cache.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
import concurrent.futures
import functools
import math
import os
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax import losses
from transformer_jax.config import TransformerConfig
from transformer_jax.model import Transformer, init_cache


@flax.struct.dataclass
class Ensemble:
  """Several models of one architecture, decoded together: their parameters (or, inside the
  searches, their decoding caches) stacked on a leading axis of `size` members. A pytree whose
  type a compiled search tells apart from one model's parameters (another program)."""
  stacked: Any

  @classmethod
  def of(cls, members: Sequence) -> Ensemble:
    """The ensemble of `members`, parameter trees of the same structure and shapes (host numpy
    arrays stay on the host, stacked there: one copy on the device once put there)."""
    if len(members) < 2:
      raise ValueError(f"an ensemble needs 2 or more models, got {len(members)}")
    def stack(*xs):
      return np.stack(xs) if all(isinstance(x, np.ndarray) for x in xs) else jnp.stack(xs)
    return cls(jax.tree.map(stack, *members))

  @property
  def size(self) -> int:
    return jax.tree.leaves(self.stacked)[0].shape[0]


def _mean_probability(logits):
  """The members' logits `[members, ..., vocab]` -> `[..., vocab]` float32, the log of their
  mean probability (each member normalised first)."""
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  return jax.nn.logsumexp(log_probs, axis=0) - math.log(log_probs.shape[0])


def length_penalty(length, alpha: float):
  """GNMT's lp(Y) = ((5 + |Y|) / 6) ** alpha, |Y| the output tokens (EOS included, BOS not)."""
  return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


def stops(finished_scores, best_live, length, limit_penalty, alpha: float):
  """Whether beam search stops each sentence after a step that made hypotheses of `length`
  tokens (`beam_search`'s rules (a)-(c)): `finished_scores` [batch, beam] best first (-inf in an
  empty slot), `best_live` [batch] the best live log-probability (-inf where none is left),
  `limit_penalty` [batch] the length penalty of the longest output each may still reach."""
  # (a): the best finished score is no lower than any a live hypothesis could still reach
  # (the larger penalty of the two: lp(limit) for alpha >= 0, the next length's below 0).
  # (c), no live hypothesis left, is (a) with `reachable` -inf: any score, -inf too, is >= it.
  reachable = best_live / jnp.maximum(length_penalty(length + 1, alpha), limit_penalty)
  # (b): the finished set is full and its worst is no worse than the best live hypothesis
  # scores now (-inf in an empty slot, so never true before `beam` have finished).
  full = finished_scores[:, -1] >= best_live / length_penalty(length, alpha)
  return (finished_scores[:, 0] >= reachable) | full


def buffer_length(config: TransformerConfig, source_len: int, max_len_margin: int,
                  max_decode_len: int | None = None) -> int:
  """T, the static number of output positions: `max_decode_len` or source_len + margin, capped
  at `config.max_len`."""
  length = source_len + max_len_margin if max_decode_len is None else max_decode_len
  length = min(length, config.max_len)
  if length < 1:
    raise ValueError(f"no room to decode: max_decode_len={max_decode_len}, source length "
                     f"{source_len} + max_len_margin={max_len_margin}, max_len={config.max_len}")
  return length


def length_limits(config: TransformerConfig, inputs, max_len_margin: int, buffer_len: int):
  """Per-sentence output limit `[batch]`: real source tokens + margin, at most the buffer.

  An all-padding row (a filler row of a bucketed batch, or the warm-up batch that compiles a
  shape) gets 0, so it finishes at once and does not keep the search loop running.
  """
  source_lengths = jnp.sum(inputs != config.pad_id, axis=-1).astype(jnp.int32)
  limits = jnp.minimum(source_lengths + max_len_margin, buffer_len)
  return jnp.where(source_lengths > 0, limits, 0)


def _decode_model(config: TransformerConfig) -> Transformer:
  return Transformer(config.replace(decode=True, deterministic=True))


def _primed_cache(model: Transformer, params, inputs, buffer_len: int, repeat: int = 1):
  """Encode once and compute the encoder-decoder keys/values once per sentence; with
  `repeat > 1` (beam search: rows b*repeat .. b*repeat + repeat - 1 are the beams of sentence b)
  the self-attention cache gets a slot per beam and `cache_rows` (`_beam_cache`). An `Ensemble`
  gets an `Ensemble` of its members' caches."""
  if isinstance(params, Ensemble):
    return Ensemble(jax.vmap(lambda p: _primed_cache(model, p, inputs, buffer_len, repeat))(
        params.stacked))
  batch, source_len = inputs.shape
  cache = init_cache(model.config, batch, source_len, buffer_len)
  encoded = model.apply({"params": params}, inputs, method=Transformer.encode)
  _, mutated = model.apply({"params": params, "cache": cache}, encoded, inputs,
                           method=Transformer.prime_cache, mutable=["cache"])
  cache = mutated["cache"]
  if repeat > 1:
    cache = _beam_cache(cache, repeat)
  return cache


def _beam_cache(cache, beams: int):
  """The cache with a slot per beam in the self-attention values, `[sources, heads, positions x
  beams, kv]`, and keys, transposed: `[sources, heads, kv, positions x beams]` (layers.py says
  why); beside them `cache_rows` `[sources * beams, positions]`: which beam slot holds each
  position of the hypothesis in each row. `_reorder_beams` follows the beams' parents in
  `cache_rows`; keys and values never move.

  The encoder-decoder entries stay one per sentence: attention reads them for all the sentence's
  beams at once. Scalars (cache_index, decode_position) are shared by all rows."""
  if not isinstance(cache, Mapping):
    return cache
  cache = {name: _beam_cache(value, beams) for name, value in cache.items()}
  if "cached_key" in cache:
    sources, _, positions, _ = cache["cached_key"].shape
    # zeros [sources, heads, positions, kv] -> a slot per beam; keys [.., kv, positions x beams]
    cache["cached_key"] = jnp.repeat(cache["cached_key"], beams, axis=2).swapaxes(2, 3)
    cache["cached_value"] = jnp.repeat(cache["cached_value"], beams, axis=2)
    # Any slot: a position is read only after its step wrote it (its row's own slot there);
    # the mask hides the ones not written yet.
    cache["cache_rows"] = jnp.zeros((sources * beams, positions), jnp.int32)
  return cache


def _step_logits(model: Transformer, params, cache, last_tokens):
  """One decoder step: float32 logits `[rows, vocab]`, new cache. An `Ensemble`'s "logits" are
  the log of its members' mean probabilities (normalised already: `_log_softmax`)."""
  if isinstance(params, Ensemble):
    # The position counters (scalars, the same in every member) are vmapped over too. Kept
    # shared (unbatched) instead, an ensemble of 3 decoded no faster (docs/decoding.md).
    logits, cache = jax.vmap(lambda p, c: _step_logits(model, p, c, last_tokens))(
        params.stacked, cache.stacked)
    return _mean_probability(logits), Ensemble(cache)
  logits, mutated = model.apply({"params": params, "cache": cache}, last_tokens[:, None],
                                method=Transformer.decode_step, mutable=["cache"])
  return logits.squeeze(1).astype(jnp.float32), mutated["cache"]  # squeeze: [:, 1] would clamp


def _step_log_probs(model: Transformer, params, cache, last_tokens):
  """One decoder step: float32 log-probabilities `[rows, vocab]` (padding forbidden), new cache."""
  logits, cache = _step_logits(model, params, cache, last_tokens)
  log_probs = _log_softmax(params, logits)
  return log_probs.at[:, model.config.pad_id].set(-jnp.inf), cache


def _log_softmax(params, logits):
  """Log-probabilities of `_step_logits`' output (an ensemble's are that already: another pass
  over the vocabulary would only round them again)."""
  return logits if isinstance(params, Ensemble) else jax.nn.log_softmax(logits, axis=-1)


def first_argmax(x):
  """`jnp.argmax(x, axis=-1)` for rows without NaN: the first index of each row's maximum.

  XLA:CPU compiles argmax to a (value, index) reduction that took about 0.3 ms of a 3.5 ms
  greedy step over 16 x 8,000 logits (docs/benchmarks.md); a max, a compare and a min over the
  indices are plain vectorised reductions, a quarter of that. A row with a NaN has no index
  equal to its maximum: it gets the last index (argmax would give the NaN's), still in range.
  """
  n = x.shape[-1]
  first = jnp.min(jnp.where(x == jnp.max(x, axis=-1, keepdims=True),
                            jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1), n), axis=-1)
  return jnp.minimum(first, n - 1)


# Block width of beam search's `top_k`: 64, 128 and 256 measured the same (docs/benchmarks.md).
TOP_K_BLOCK = 128


def top_k(x, k: int, block: int):
  """`jax.lax.top_k(x, k)` over the last axis of `x` `[rows, n]`, the same values and indices
  (ties to the lower index) for rows without NaN, in two cheap passes instead of one over all
  of `n`. (A NaN makes its block's maximum NaN, which ranks first; `lax.top_k` ranks a negative
  NaN last. Beam search's scores are NaN only when the model's are, and then nothing is right.)

  XLA:CPU's top-k over beam search's 4 x 8,000 scores per sentence took about 0.9 ms of an
  11 ms step. Here: the maximum of each block of `block` entries, the k best blocks (ties to the
  lower block), and the top k of those k blocks' entries, kept in index order. Exact: an entry
  of the top k lies in one of the k best blocks, since a block ranked before its own has a
  maximum that ranks before it, and k of them would leave it out. Rows of fewer than 2k blocks
  take `jax.lax.top_k` directly.
  """
  rows, n = x.shape
  blocks = -(-n // block)
  if blocks < 2 * k:
    return jax.lax.top_k(x, k)
  padded = jnp.pad(x, ((0, 0), (0, blocks * block - n)), constant_values=-jnp.inf)
  padded = padded.reshape(rows, blocks, block)
  _, best = jax.lax.top_k(jnp.max(padded, axis=-1), k)
  best = jnp.sort(best)  # index order, so that ties still go to the lower index
  entries = jnp.take_along_axis(padded, best[:, :, None], axis=1).reshape(rows, k * block)
  values, index = jax.lax.top_k(entries, k)
  return values, jnp.take_along_axis(best, index // block, axis=1) * block + index % block


def _reorder_beams(cache, rows):
  """Row b of every hypothesis-dependent cache entry becomes row `rows[b]` (its parent's).

  Only the self-attention's history depends on the hypothesis, and of it only `cache_rows` moves
  (beam slots within the same source): the keys and values stay in the slots that wrote them.
  The cross-attention entries are one per sentence (a beam's parent is always a beam of the same
  sentence), and the position counters are shared scalars.
  """
  if isinstance(cache, Ensemble):  # the same reordering in every member's cache
    return Ensemble(jax.vmap(_reorder_beams, in_axes=(0, None))(cache.stacked, rows))

  def gather(path, x):
    # In bounds by construction: "clip" clamps the row indices, where the default ("fill")
    # masks every element of the result (a select over all of it).
    moves = getattr(path[-1], "key", None) == "cache_rows"
    return jnp.take(x, rows, axis=0, mode="clip") if moves else x
  return jax.tree_util.tree_map_with_path(gather, cache)


# The self-attention cache starts this long and doubles up to the buffer (see `_run_in_stages`).
# 16 made the fixed 64-token benchmark no faster beyond the noise and compiled one more loop
# (evaluate.py: 16-18 s of compiling 3 shapes against 14 s); most real outputs are shorter.
FIRST_STAGE = 32


def num_candidates(beam: int, vocab: int) -> int:
  """The one-token extensions a beam search step keeps: 2 * beam, as tensor2tensor's and Flax's
  (a finished one among them leaves a live one to go on), or every one if there are fewer."""
  return min(2 * beam, beam * vocab)


def stage_ends(buffer_len: int) -> list[int]:
  """The output positions at which the self-attention cache grows: FIRST_STAGE, twice that, ...
  then the buffer length (a last stage shorter than half the one before is merged into it)."""
  ends, end = [], FIRST_STAGE
  while end < buffer_len:
    ends.append(end)
    end *= 2
  if ends and buffer_len - ends[-1] < ends[-1] // 2:
    ends.pop()
  return ends + [buffer_len]


def _grow_self_cache(cache, old: int, length: int):
  """Zero-pad the self-attention keys/values `[rows, heads, positions, kv]` from `old` to `length`
  positions (beam search's: `[sources, heads, positions x beams, kv]`, keys `[sources, heads,
  kv, positions x beams]`, and `cache_rows` `[rows, positions]`; unwritten positions are masked,
  so slot 0 for them is as good as any)."""
  if isinstance(cache, Ensemble):
    return Ensemble(jax.vmap(lambda c: _grow_self_cache(c, old, length))(cache.stacked))
  if not isinstance(cache, Mapping):
    return cache
  cache = {name: _grow_self_cache(value, old, length) for name, value in cache.items()}
  if "cached_key" in cache:
    beams = "cache_rows" in cache
    for name, axis in (("cached_key", 3 if beams else 2), ("cached_value", 2)):
      x = cache[name]
      widths = [(0, 0)] * x.ndim
      widths[axis] = (0, (length - old) * (x.shape[axis] // old))  # x beams, or x 1
      cache[name] = jnp.pad(x, widths)
    if beams:
      cache["cache_rows"] = jnp.pad(cache["cache_rows"], ((0, 0), (0, length - old)))
  return cache


def _run_in_stages(step, not_done, state, ends, *, position, get_cache, set_cache):
  """`while not_done(state) and position(state) < end: state = step(state)` for each end of
  `ends`, the self-attention cache grown to `end` before each stage.

  A step reads every cached position (in beam search, of every beam slot), written or not, so
  a cache sized for the whole buffer makes every step as slow as the last one can be. Sized by
  stage, a search that stops after 20 tokens never touches a 66-position cache, and one that
  runs to the end of a 64-position buffer reads on average 3/4 of it. Each stage is its own compiled
  loop (1-3 for buffers of up to 128 positions).
  """
  for n, end in enumerate(ends):
    if n:
      state = set_cache(state, _grow_self_cache(get_cache(state), ends[n - 1], end))
    state = jax.lax.while_loop(lambda s, end=end: not_done(s) & (position(s) < end), step, state)
  return state


def _one_token_search(config: TransformerConfig, params, inputs, choose, *, max_len_margin: int,
                      max_decode_len: int | None, score: bool):
  """The loop greedy search and sampling share: one token per sentence and step, `choose(logits
  [rows, vocab] float32 with padding at -inf, i)` -> tokens `[rows]`, until every sentence has
  produced EOS or reached its limit. Returns `(tokens, lengths)`, and with `score` the summed
  log-probabilities `[rows]` of the tokens chosen (log-softmax over the whole vocabulary, as
  beam search and `target_log_probs` score them)."""
  model = _decode_model(config)
  batch, source_len = inputs.shape
  buffer_len = buffer_length(config, source_len, max_len_margin, max_decode_len)
  limits = length_limits(config, inputs, max_len_margin, buffer_len)
  ends = stage_ends(buffer_len)
  cache = _primed_cache(model, params, inputs, ends[0])

  def not_done(state):
    i, _, _, _, done, _ = state
    return (i < buffer_len) & ~jnp.all(done)

  def step(state):
    i, cache, last, tokens, done, total = state
    logits, cache = _step_logits(model, params, cache, last)
    token = choose(logits.at[:, config.pad_id].set(-jnp.inf), i)
    if score:
      picked = jnp.take_along_axis(_log_softmax(params, logits), token[:, None], axis=-1)
      total = total + jnp.where(done, 0.0, picked[:, 0])
    token = jnp.where(done, config.pad_id, token)
    tokens = jax.lax.dynamic_update_slice(tokens, token[:, None], (0, i))
    done = done | (token == config.eos_id) | (i + 1 >= limits)
    return i + 1, cache, token, tokens, done, total

  state = (jnp.array(0, jnp.int32), cache, jnp.full((batch,), config.bos_id, jnp.int32),
           jnp.full((batch, buffer_len), config.pad_id, jnp.int32), limits <= 0,
           jnp.zeros((batch,), jnp.float32))
  state = _run_in_stages(step, not_done, state, ends, position=lambda s: s[0],
                         get_cache=lambda s: s[1], set_cache=lambda s, c: (s[0], c) + s[2:])
  tokens = state[3]
  lengths = jnp.sum(tokens != config.pad_id, axis=-1).astype(jnp.int32)
  return (tokens, lengths, state[5]) if score else (tokens, lengths)


@functools.partial(jax.jit, static_argnames=("config", "max_len_margin", "max_decode_len",
                                              "score"))
def greedy_search(config: TransformerConfig, params, inputs, *, max_len_margin: int = 50,
                  max_decode_len: int | None = None, score: bool = False):
  """Greedy decoding of source `inputs` `[batch, source_len]` (padding = `pad_id`).

  Returns `(tokens [batch, T] int32, lengths [batch] int32)`: see the module docstring.
  Stops as soon as every sentence has produced EOS or reached its length limit. With `score`,
  also each output's log-probability `[batch]` float32, summed in the loop (what
  `target_log_probs` gives the same tokens, to float32 rounding): the same tokens, and one
  log-softmax over the vocabulary a step more.
  """
  # The argmax of the logits is that of the log-probabilities: no softmax pass over the
  # vocabulary unless asked for the score. Padding is forbidden as in beam search.
  return _one_token_search(config, params, inputs, lambda logits, i: first_argmax(logits),
                           max_len_margin=max_len_margin, max_decode_len=max_decode_len,
                           score=score)


def nucleus(values, top_p: float):
  """`values` `[rows, n]`, logits sorted best first, with those outside the nucleus (Holtzman et
  al., 2020) set to -inf: the nucleus is the fewest best tokens whose probabilities (softmax over
  the row) add up to at least `top_p`, i.e. every token that the tokens ranked above it leave
  short of `top_p`. The best token always stays; tokens tied with the last one kept, and ranked
  after it, do not."""
  probs = jax.nn.softmax(values, axis=-1)
  # The mass ranked above each token: an exclusive running sum (no cumsum - probs cancellation).
  above = jnp.cumsum(probs, axis=-1)
  above = jnp.concatenate([jnp.zeros_like(above[:, :1]), above[:, :-1]], axis=-1)
  return jnp.where(above < top_p, values, -jnp.inf)


@functools.partial(jax.jit, static_argnames=("config", "top_k", "top_p", "max_len_margin",
                                              "max_decode_len"))
def sample_search(config: TransformerConfig, params, inputs, keys, *, temperature=1.0,
                  top_k: int = 0, top_p: float = 1.0, max_len_margin: int = 50,
                  max_decode_len: int | None = None):
  """Ancestral sampling: each next token drawn from softmax(logits / temperature) over the
  vocabulary without padding, or over its `top_k` most probable tokens when `top_k` > 0 (Edunov
  et al., 2018, back-translate by unrestricted and top-10 sampling), and then, when `top_p` < 1,
  over the nucleus of those (`nucleus`: the fewest most probable whose probability, renormalised
  after the temperature and the top-k, reaches `top_p`; Holtzman et al., 2020), renormalised.
  `keys` `[batch]`: one PRNG key per sentence; step i draws with `fold_in(key, i)`, so a
  sentence's sample depends on its own key and source, not on the rest of the batch.
  `temperature` is traced (another value does not recompile), and must be > 0; `top_p` is a
  compile-time constant in (0, 1] (1: no nucleus, and no sort of the vocabulary).

  Returns `(tokens [batch, T], lengths [batch], log_probs [batch])`: the outputs as greedy
  search's, and each sample's log-probability under the model itself (temperature 1, no top-k
  or nucleus restriction; what `target_log_probs` gives the same tokens). Limits and EOS as
  greedy search.
  """
  if not 0.0 < top_p <= 1.0:
    raise ValueError(f"top_p={top_p}: must be above 0 and at most 1 (1: the whole distribution)")

  def choose(logits, i):
    step_keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, i)
    scaled = logits / temperature
    if not top_k and top_p == 1.0:
      return jax.vmap(jax.random.categorical)(step_keys, scaled).astype(jnp.int32)
    # Best first: the top k, or for a nucleus alone the whole (padding last, at -inf) sorted.
    values, index = jax.lax.top_k(scaled, top_k or scaled.shape[-1])
    if top_p < 1.0:
      values = nucleus(values, top_p)
    pick = jax.vmap(jax.random.categorical)(step_keys, values)
    return jnp.take_along_axis(index, pick[:, None], axis=-1)[:, 0].astype(jnp.int32)

  return _one_token_search(config, params, inputs, choose, max_len_margin=max_len_margin,
                           max_decode_len=max_decode_len, score=True)


@functools.partial(jax.jit, static_argnames=("config", "beam_size", "alpha", "max_len_margin",
                                              "max_decode_len", "return_all"))
def beam_search(config: TransformerConfig, params, inputs, *, beam_size: int = 4,
                alpha: float = 0.6, max_len_margin: int = 50, max_decode_len: int | None = None,
                return_all: bool = False):
  """Beam search with GNMT's length penalty: score(Y) = log P(Y | X) / ((5 + |Y|) / 6) ** alpha.

  Returns `(tokens [batch, T], scores [batch])`, the best finished hypothesis of each sentence, or
  with `return_all=True` the finished set `(tokens [batch, beam, T], scores [batch, beam])`, best
  first (empty slots: score -inf, all padding). A sentence with a limit of 0 tokens (empty source,
  margin 0) returns no tokens and score 0.

  Each step takes the 2 * beam best one-token extensions of the live hypotheses by log-probability.
  Of those, the ones ending in EOS (or reaching the sentence's length limit) *and ranked within the
  first `beam`* become finished hypotheses, scored with the length penalty, and the best `beam`
  finished so far are kept; the best `beam` others stay live. A sentence stops when
    (a) its best finished score is >= the best score any live hypothesis could still reach (its
        log-probability can only fall, so the bound divides it by the largest penalty it could
        still get, lp(limit) for alpha >= 0), or
    (b) the finished set is full (`beam` hypotheses) and its worst score is >= the best live
        hypothesis's score at its current length, or
    (c) no live hypothesis is left (the length limit finishes them all).
  The rank rule is fairseq's and Hugging Face's, (b) Hugging Face's default (`early_stopping=
  False`); tensor2tensor and Flax finalise every EOS among the 2 * beam and stop by (a) and (c)
  alone. With the rank rule and (b), beam size 1 is exactly greedy search (EOS finishes a
  hypothesis only when it is the best next token, and then the live one, ranked below it, scores
  no better). fairseq's (b), stopping once `beam` have finished whatever the live ones score, is
  not used: it dropped live hypotheses better than every finished one (one of probability 0.32
  at beam 4, below greedy's output). At alpha 0 no score can rise as a hypothesis grows, so
  early stopping never changes the best hypothesis (the same as searching to the length limit),
  and stopping by (b) none of the finished set. For alpha > 0, (a) is exact too, but (b) judges
  a live hypothesis by its score now, which the length penalty may still raise: a heuristic, as
  in Hugging Face.
  With a beam at least as wide as the number of candidates of every step, the search is exhaustive.
  A stopped sentence's live hypotheses are dropped, so its result does not depend on the others.
  """
  model = _decode_model(config)
  batch, source_len = inputs.shape
  vocab = config.output_vocab_size
  beam = beam_size
  candidates = num_candidates(beam, vocab)
  buffer_len = buffer_length(config, source_len, max_len_margin, max_decode_len)
  limits = length_limits(config, inputs, max_len_margin, buffer_len)
  ends = stage_ends(buffer_len)
  cache = _primed_cache(model, params, inputs, ends[0], repeat=beam)
  neg_inf = jnp.array(-jnp.inf, jnp.float32)
  in_first_beam = (jnp.arange(candidates) < beam)[None, :]
  # Penalty of the longest output a sentence can still reach: the bound of rule (a).
  limit_penalty = length_penalty(limits, alpha)

  def take(x, index):  # x [batch, n, ...], index [batch, m] -> [batch, m, ...]
    return jnp.take_along_axis(x, index.reshape(index.shape + (1,) * (x.ndim - 2)), axis=1)

  def not_done(state):
    return (state["i"] < buffer_len) & ~jnp.all(state["done"])

  def step(state):
    i = state["i"]
    length = i + 1  # of every hypothesis made in this step
    log_probs, cache = _step_log_probs(model, params, state["cache"],
                                       state["last"].reshape(batch * beam))
    log_probs = log_probs.reshape(batch, beam, vocab)
    extended = (state["live_log_probs"][:, :, None] + log_probs).reshape(batch, beam * vocab)
    top_log_probs, top_index = top_k(extended, candidates, TOP_K_BLOCK)
    parent, token = top_index // vocab, (top_index % vocab).astype(jnp.int32)
    seqs = jax.lax.dynamic_update_slice(take(state["live_seqs"], parent), token[:, :, None],
                                        (0, 0, i))
    valid = top_log_probs > neg_inf
    ends = (token == config.eos_id) | (length >= limits)[:, None]
    finishing = valid & ends & in_first_beam

    # Finished set: the best `beam` of the old set and the ones finishing now.
    new_scores = jnp.where(finishing, top_log_probs / length_penalty(length, alpha), neg_inf)
    finished_scores, keep = jax.lax.top_k(
        jnp.concatenate([state["finished_scores"], new_scores], axis=1), beam)
    finished_seqs = take(jnp.concatenate([state["finished_seqs"], seqs], axis=1), keep)

    # Live set: the best `beam` candidates that go on; the cache follows their parents.
    live_log_probs, keep = jax.lax.top_k(jnp.where(valid & ~ends, top_log_probs, neg_inf), beam)
    live_seqs, live_parent, last = take(seqs, keep), take(parent, keep), take(token, keep)
    rows = (jnp.arange(batch)[:, None] * beam + live_parent).reshape(batch * beam)
    cache = _reorder_beams(cache, rows)

    done = state["done"] | stops(finished_scores, live_log_probs[:, 0], length,
                                 limit_penalty, alpha)
    return dict(i=i + 1, cache=cache, last=last, live_seqs=live_seqs,
                live_log_probs=jnp.where(done[:, None], neg_inf, live_log_probs),
                finished_seqs=finished_seqs, finished_scores=finished_scores,
                done=done)

  done = limits <= 0
  first_beam_only = jnp.where(jnp.arange(beam) == 0, 0.0, neg_inf)[None, :]
  empty_seqs = jnp.full((batch, beam, buffer_len), config.pad_id, jnp.int32)
  state = dict(
      i=jnp.array(0, jnp.int32), cache=cache,
      last=jnp.full((batch, beam), config.bos_id, jnp.int32),
      live_seqs=empty_seqs,
      # All beams start as the same empty hypothesis: only the first may be extended.
      live_log_probs=jnp.where(done[:, None], neg_inf, first_beam_only),
      finished_seqs=empty_seqs,
      finished_scores=jnp.full((batch, beam), neg_inf),
      done=done)
  state = _run_in_stages(step, not_done, state, ends, position=lambda s: s["i"],
                         get_cache=lambda s: s["cache"], set_cache=lambda s, c: dict(s, cache=c))

  scores = state["finished_scores"]
  seqs = jnp.where((scores > neg_inf)[:, :, None], state["finished_seqs"], config.pad_id)
  # The empty output (limit 0) has log-probability 0.
  scores = scores.at[:, 0].set(jnp.where(limits <= 0, 0.0, scores[:, 0]))
  if return_all:
    return seqs, scores
  return seqs[:, 0], scores[:, 0]


def search_batch(config: TransformerConfig, params, inputs, *, beam_size: int = 1,
                 alpha: float = 0.6, max_len_margin: int = 50,
                 max_decode_len: int | None = None, parts: int | None = None):
  """Translate a batch: greedy search for `beam_size == 1`, else beam search.

  Returns numpy `(tokens [batch, T] int32, lengths [batch] int32)`: row i's output is
  `tokens[i, :lengths[i]]`, ending in EOS unless it hit its length limit (`output_ids` strips it).
  Compiled once per (config, settings, input shape): pad batches to a few fixed shapes.
  The batch is searched as `parts` slices of its rows at the same time (`in_parts`; None:
  `concurrent_parts`), which gives each row the same output as one search of the whole batch.
  """
  if beam_size < 1:
    raise ValueError(f"beam_size={beam_size}: must be >= 1")

  def search(inputs):
    if beam_size == 1:
      return greedy_search(config, params, inputs, max_len_margin=max_len_margin,
                           max_decode_len=max_decode_len)
    tokens, _ = beam_search(config, params, inputs, beam_size=beam_size, alpha=float(alpha),
                            max_len_margin=max_len_margin, max_decode_len=max_decode_len)
    return tokens, jnp.sum(tokens != config.pad_id, axis=-1)

  tokens, lengths = in_parts(search, inputs, parts=parts)
  return tokens.astype(np.int32), lengths.astype(np.int32)


# Where a container's CPU quota is (cgroup v2, then v1): "quota period", or the two files.
CPU_MAX = "/sys/fs/cgroup/cpu.max"
CFS_FILES = ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu/cpu.cfs_period_us")


def _read(path: str) -> str:
  with open(path) as f:
    return f.read().strip()


def _quota_cores() -> float | None:
  """The CPUs a cgroup quota allows this process (`docker --cpus`, a Kubernetes limit), or None
  where none is set or it cannot be read."""
  try:
    quota, period = _read(CPU_MAX).split()  # "max 100000": none
  except (OSError, ValueError):
    try:
      quota, period = (_read(path) for path in CFS_FILES)
    except OSError:
      return None
  try:
    quota, period = float(quota), float(period)
  except ValueError:  # "max": no quota
    return None
  return quota / period if quota > 0 and period > 0 else None


def _cores() -> int:
  """The CPU cores this process may run on: its affinity (taskset, a scheduler's cpuset), and no
  more than a cgroup quota allows (a container of 1 CPU on a host of many)."""
  try:
    cores = len(os.sched_getaffinity(0))
  except AttributeError:  # not on Linux
    cores = os.cpu_count() or 1
  quota = _quota_cores()
  return cores if quota is None else max(1, min(cores, int(quota)))


def concurrent_parts(rows: int) -> int:
  """How many slices of a batch of `rows` the searches run at the same time by default: 2 on a
  process with one CPU device and 2 or more cores, for an even number of rows; else 1.

  Why: a search step multiplies few rows (16 for greedy search on 16 sentences) by every weight
  of the decoder and the vocabulary-sized output kernel, which XLA:CPU runs on about one core at a
  time (CPU time over wall time 1.3-1.45, docs/benchmarks.md). Two halves of the batch, each a
  search of its own on its own thread, keep both cores busy: on a 2-core host, the benchmark's
  greedy search 1.33x and beam 4 1.47x as fast (medians of five rounds; docs/benchmarks.md,
  "Two halves of a batch at the same time"); measured on 2-core hosts only. On an accelerator,
  or over several devices, a batch stays whole.
  """
  if rows < 2 or rows % 2 or jax.default_backend() != "cpu" or jax.local_device_count() != 1:
    return 1
  return 2 if _cores() >= 2 else 1


def _thread_settings() -> list[str]:
  """What a `with` block set for this thread alone, which a thread of the pool would not see:
  JAX settings (`jax.debug_nans`, `jax.default_matmul_precision`, `jax.default_device`, ...),
  a mesh (`jax.set_mesh`), Flax's logical axis rules. Reading JAX's settings takes its private
  `_value_holders` (no public way lists them): where that is gone, only the mesh and the rules
  are told."""
  found = []
  try:
    from jax._src.config import State
    holders = jax.config._value_holders
  except (ImportError, AttributeError):
    holders, State = {}, ()
  for name, state in holders.items():
    if isinstance(state, State) and state.value is not state.get_global():
      found.append(name)
  mesh = getattr(jax.sharding, "get_abstract_mesh", None)  # jax >= 0.6
  if mesh is not None and not mesh().empty:
    found.append("mesh")
  if nn.get_logical_axis_rules():
    found.append("logical_axis_rules")
  return found


@functools.cache
def _threads(parts: int) -> concurrent.futures.ThreadPoolExecutor:
  return concurrent.futures.ThreadPoolExecutor(parts - 1, thread_name_prefix="search-part")


def in_parts(search, *rows_args, parts: int | None = None) -> tuple[np.ndarray, ...]:
  """`search(*rows_args)` as numpy arrays, run as `parts` equal slices of the rows (the leading
  axis of every `rows_args` array and of every output) at the same time, one thread each, the
  outputs put back together in row order. Every search treats its rows independently, so this
  gives each row what one call on the whole batch gives it (to float32 rounding: XLA may sum in
  another order for another number of rows, as for another bucket shape). `parts` None:
  `concurrent_parts`; it must divide the rows. Called inside a `with` block that set JAX or
  Flax settings for this thread (`_thread_settings`), the batch is searched whole: the other
  threads would search without them."""
  rows = rows_args[0].shape[0]
  if any(x.shape[0] != rows for x in rows_args):
    raise ValueError(f"the arrays' first axes hold {[x.shape[0] for x in rows_args]} rows: each "
                     f"must hold the batch's {rows}")
  parts = concurrent_parts(rows) if parts is None else parts
  if parts < 1 or rows % parts:
    raise ValueError(f"parts={parts}: must be >= 1 and divide the batch's {rows} rows")
  if _thread_settings():  # which the pool's threads would search without
    parts = 1
  size = rows // parts

  def part(k):
    outputs = search(*(x[k * size:(k + 1) * size] for x in rows_args))
    return tuple(np.asarray(x) for x in outputs)  # waits for this part's result

  # JAX compiles a program once when two threads first call it together.
  others = [_threads(parts).submit(part, k) for k in range(1, parts)]
  results = [part(0)] + [f.result() for f in others]
  return tuple(np.concatenate(xs) for xs in zip(*results))


@functools.partial(jax.jit, static_argnames="config")
def target_log_probs(config: TransformerConfig, params, inputs, targets):
  """`[rows]` float32: log P(targets[r] | inputs[r]) summed over the row's non-padding target
  tokens (an all-padding row: 0), teacher-forced with dropout off: what a search scores that
  output (before beam search's length penalty). For scoring given translations
  (`inference.scoring`). An `Ensemble` scores each token by its members' mean probability."""
  model = Transformer(config.replace(deterministic=True, decode=False))
  if isinstance(params, Ensemble):
    logits = jax.vmap(lambda p: model.apply({"params": p}, inputs, targets))(params.stacked)
    # Normalised log-probabilities: the log-softmax below leaves them as they are (to rounding).
    logits = _mean_probability(logits)
  else:
    logits = model.apply({"params": params}, inputs, targets)
  weights = (targets != config.pad_id).astype(jnp.float32)
  return losses.sentence_log_probs(logits, targets, weights)


def output_ids(tokens, lengths, eos_id: int) -> list[list[int]]:
  """Per sentence, the output token ids without EOS and padding (for detokenising and BLEU)."""
  out = []
  for row, n in zip(np.asarray(tokens), np.asarray(lengths)):
    ids = row[:n].tolist()
    out.append(ids[:-1] if ids and ids[-1] == eos_id else ids)
  return out
