"""The comparison point of the search speed target: the Flax `examples/wmt` decoding, condensed.

Rebuilt from google/flax `examples/wmt/decode.py` (`beam_search`) and `train.py`
(`predict_step`), on the example's model in `flax_wmt.py` (decode mode): the encoder runs once per
batch and its output is repeated for every beam; every step runs the decoder on one token per
hypothesis with the self-attention keys/values cached by `nn.MultiHeadDotProductAttention`
(`decode=True`), while the encoder-decoder attention projects the encoder output again; then
log-softmax, the top 2 * beam of beam * vocab, the live and finished sets re-gathered by index
(sequences and the whole cache), GNMT's length penalty, and the example's stopping rule (no live
hypothesis can beat the worst finished one, or the length is reached). The example has no greedy
search; `greedy` is the same model and cache with an argmax per step, stopping when every row
has produced EOS.

`run(beams, rows, source_len, decode_len, calls)` times them like `transformer_jax.bench.decode`:
random parameters, random sources, EOS never produced (so every sentence runs to `decode_len`
tokens), the median over `calls` calls after one that compiles. Shares no code with this
package's search.
"""
from __future__ import annotations

import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.bench import flax_wmt

NEG_INF = -1.0e7  # the example's "effective negative infinity"
NO_EOS = -1       # an id the model never produces: every hypothesis runs to the length limit


def _penalty(alpha, length):
  return ((5.0 + length) / 6.0) ** alpha


def _expand(x, beam):
  """[batch, ...] -> [batch * beam, ...], each row repeated `beam` times in place."""
  return jnp.repeat(x, beam, axis=0) if x.ndim else x


def _pick(tree, index):
  """Per sentence, the hypotheses `index` [batch, k] of every [batch, n, ...] leaf."""
  rows = jnp.arange(index.shape[0])[:, None]
  return jax.tree.map(lambda x: x[rows, index] if x.ndim else x, tree)


def _beams(x, batch):
  return x.reshape((batch, -1) + x.shape[1:]) if x.ndim else x


def _flat(x):
  return x.reshape((-1,) + x.shape[2:]) if x.ndim else x


def _encode(params, inputs):
  """The example's `encode`: the encoder once per batch (decode mode plays no part in it)."""
  return flax_wmt.Model(train=False).apply({"params": params}, inputs,
                                           method=flax_wmt.Model.encode)


def _step_fn(params, encoded, inputs):
  """The example's `tokens_ids_to_logits`: ids [rows, 1], cache -> logits [rows, vocab], cache."""
  model = flax_wmt.Model(train=False, decode=True)

  def step(ids, cache):
    logits, variables = model.apply({"params": params, "cache": cache}, encoded, inputs, ids,
                                    mutable=["cache"], method=flax_wmt.Model.decode_logits)
    return logits[:, 0], variables["cache"]
  return step


def init_cache(rows: int, source_len: int, decode_len: int):
  """The example's `initialize_cache`: zeros shaped by a decode-mode init, outside the search."""
  init = flax_wmt.Model(train=False, decode=True).init
  shapes = jax.eval_shape(init, jax.random.key(0), jnp.ones((rows, source_len), jnp.int32),
                          jnp.ones((rows, decode_len), jnp.int32))["cache"]
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def settled(live_log_probs, finished_scores, finished_flags, *, alpha: float, length: int):
  """The example's early stop: every sentence's finished set is full and its worst score beats
  the best live hypothesis at the longest length's penalty (which a live one can only lose to:
  its log-probability only falls). `[batch, beam]` each (best last) -> a boolean."""
  best_live = live_log_probs[:, -1:] / _penalty(alpha, length)
  worst_finished = jnp.where(finished_flags,
                             jnp.min(finished_scores, axis=1, keepdims=True), NEG_INF)
  return jnp.all(worst_finished > best_live)


def beam_search(params, inputs, cache, *, beam: int, decode_len: int, alpha: float = 0.6,
                eos_id: int = NO_EOS):
  """The example's `predict_step` + `decode.beam_search`: (sequences [batch, beam, decode_len + 1]
  with the leading start token 0, scores [batch, beam]), best last."""
  batch = inputs.shape[0]
  length = decode_len + 1  # the example's sequences hold the start token too
  encoded = _expand(_encode(params, inputs), beam)
  step_fn = _step_fn(params, encoded, _expand(inputs, beam))
  state = dict(
      i=jnp.array(0), cache=jax.tree.map(lambda x: _beams(_expand(x, beam), batch), cache),
      live_log_probs=jnp.tile(jnp.array([0.0] + [NEG_INF] * (beam - 1)), (batch, 1)),
      finished_scores=jnp.full((batch, beam), NEG_INF),
      live_seqs=jnp.zeros((batch, beam, length), jnp.int32),
      finished_seqs=jnp.zeros((batch, beam, length), jnp.int32),
      finished_flags=jnp.zeros((batch, beam), jnp.bool_))

  def cond(s):
    return (s["i"] < length - 1) & ~settled(s["live_log_probs"], s["finished_scores"],
                                            s["finished_flags"], alpha=alpha, length=length)

  def body(s):
    i = s["i"]
    ids = jax.lax.dynamic_slice(s["live_seqs"], (0, 0, i), (batch, beam, 1)).reshape(-1, 1)
    logits, cache = step_fn(ids, jax.tree.map(_flat, s["cache"]))
    cache = jax.tree.map(lambda x: _beams(x, batch), cache)
    log_probs = jax.nn.log_softmax(_beams(logits, batch)) + s["live_log_probs"][:, :, None]
    vocab = log_probs.shape[-1]
    top_log_probs, top_index = jax.lax.top_k(log_probs.reshape(batch, -1), 2 * beam)
    parent = top_index // vocab
    seqs = jax.lax.dynamic_update_slice(_pick(s["live_seqs"], parent),
                                        (top_index % vocab)[:, :, None], (0, 0, i + 1))
    finished_now = seqs[:, :, i + 1] == eos_id
    # Live: the best `beam` of the 2 * beam that did not end, in increasing order.
    live_log_probs = top_log_probs + finished_now * NEG_INF
    keep = jnp.flip(jax.lax.top_k(live_log_probs, beam)[1], axis=1)
    live_seqs, live_log_probs, live_parent = _pick((seqs, live_log_probs, parent), keep)
    cache = _pick(cache, live_parent)
    # Finished: the best `beam` of the old set and the ones that ended now.
    scores = top_log_probs / _penalty(alpha, i + 1) + (~finished_now) * NEG_INF
    all_scores = jnp.concatenate([s["finished_scores"], scores], axis=1)
    keep = jnp.flip(jax.lax.top_k(all_scores, beam)[1], axis=1)
    finished_seqs, finished_scores, finished_flags = _pick(
        (jnp.concatenate([s["finished_seqs"], seqs], axis=1), all_scores,
         jnp.concatenate([s["finished_flags"], finished_now], axis=1)), keep)
    return dict(i=i + 1, cache=cache, live_log_probs=live_log_probs,
                finished_scores=finished_scores, live_seqs=live_seqs,
                finished_seqs=finished_seqs, finished_flags=finished_flags)

  s = jax.lax.while_loop(cond, body, state)
  # A sentence with nothing finished returns its live hypotheses.
  any_finished = jnp.any(s["finished_flags"], axis=1)
  seqs = jnp.where(any_finished[:, None, None], s["finished_seqs"], s["live_seqs"])
  scores = jnp.where(any_finished[:, None], s["finished_scores"], s["live_log_probs"])
  return seqs, scores


def greedy(params, inputs, cache, *, decode_len: int, eos_id: int = NO_EOS):
  """Argmax decoding on the example's model and cache: tokens [batch, decode_len] (0 after EOS)."""
  batch = inputs.shape[0]
  step_fn = _step_fn(params, _encode(params, inputs), inputs)

  def cond(s):
    return (s[0] < decode_len) & ~jnp.all(s[4])

  def body(s):
    i, cache, last, tokens, done = s
    logits, cache = step_fn(last[:, None], cache)
    token = jnp.where(done, 0, jnp.argmax(logits, axis=-1).astype(jnp.int32))
    tokens = jax.lax.dynamic_update_slice(tokens, token[:, None], (0, i))
    return i + 1, cache, token, tokens, done | (token == eos_id)

  state = (jnp.array(0), cache, jnp.zeros((batch,), jnp.int32),
           jnp.zeros((batch, decode_len), jnp.int32), jnp.zeros((batch,), jnp.bool_))
  return jax.lax.while_loop(cond, body, state)[3]


def init_params(rows: int, source_len: int, decode_len: int, seed: int = 0):
  return flax_wmt.Model(train=False).init(
      jax.random.key(seed), jnp.ones((rows, source_len), jnp.int32),
      jnp.ones((rows, decode_len), jnp.int32))["params"]


def search_fn(beam: int, decode_len: int):
  """The timed search, jitted: `(params, inputs, cache) ->` greedy's tokens (beam 1) or beam
  search's sequences, what `predict_step` returns: all of the search's work is needed for it."""
  if beam == 1:
    return jax.jit(lambda p, x, c: greedy(p, x, c, decode_len=decode_len))
  return jax.jit(lambda p, x, c: beam_search(p, x, c, beam=beam, decode_len=decode_len)[0])


def run(beams, *, rows: int, source_len: int, decode_len: int, calls: int) -> dict:
  """Median batch time and sentences/s of each search (beam 1: `greedy`), like
  `scripts/benchmark.py --what decode` with random parameters (the sizes: the script's flags)."""
  if calls < 1:
    raise ValueError(f"calls={calls}: must be >= 1")
  params = init_params(rows, source_len, decode_len)
  inputs = jnp.asarray(np.random.default_rng(0).integers(4, flax_wmt.V, (rows, source_len)),
                       jnp.int32)
  cache = init_cache(rows, source_len, decode_len)
  out = {"model": "flax examples/wmt search (condensed)", "rows": rows, "source_len": source_len,
         "decode_len": decode_len, "jax_version": jax.__version__,
         "glibc_tunables": os.environ.get("GLIBC_TUNABLES", "")}
  for beam in beams:
    search = search_fn(beam, decode_len)
    start = time.perf_counter()
    jax.block_until_ready(search(params, inputs, cache))
    first = time.perf_counter() - start
    times = []
    for _ in range(calls):
      start = time.perf_counter()
      jax.block_until_ready(search(params, inputs, cache))
      times.append(time.perf_counter() - start)
    median = statistics.median(times)
    out["greedy" if beam == 1 else f"beam {beam}"] = {
        "batch_time_s": round(median, 4), "sentences_per_s": round(rows / median, 2),
        "first_call_s": round(first, 3)}
  return out
