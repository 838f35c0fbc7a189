"""The search's costliest small operations one by one, as they were and as they are:
`run(config, KernelOptions(...)) -> dict` (`scripts/benchmark.py --what kernels`).

A profile of greedy and beam search on the 2-core CPU (docs/benchmarks.md, 2026-11-25) found
three kernels out of proportion to their work; each pair here is the operation before and
after its change, on the config's sizes, with a reference that does the same work without it:
  * greedy's next token: `jnp.argmax` of the logits against `search.first_argmax`
    (reference: the logits matmul alone);
  * beam search's candidates: `lax.top_k` over `beam x vocab` log-probabilities per sentence
    against `search.top_k` in blocks of `search.TOP_K_BLOCK` (reference: no top-k);
  * beam search's self-attention scores against keys cached `[slots, kv]` and, as now,
    `[kv, slots]`, at each stage's number of slots.
Each operation runs inside one compiled `lax.fori_loop` of `iterations` (its input shifted
each time and its outputs summed into the carry, so nothing is hoisted or dropped); a figure is
the median over `calls` calls divided by `iterations`, and the three variants of a pair are
timed in turn, `repeats` times. Before and after are checked to give the same outputs first.
"""
from __future__ import annotations

import dataclasses
import functools
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax import search
from transformer_jax.bench import common
from transformer_jax.data.config import global_rows


@dataclasses.dataclass(frozen=True)
class KernelOptions:
  rows: int = 0           # sentences (0: a training batch's rows, data.config.global_rows)
  beam: int = 4
  decode_len: int = 0     # output positions, whose stages give the slots (0: max_target_len)
  iterations: int = 50    # loop iterations per call
  calls: int = 9          # timed calls per figure; the median is reported
  repeats: int = 3        # rounds over the variants of a pair

  def __post_init__(self):
    for name in ("beam", "iterations", "calls", "repeats"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name}={getattr(self, name)}: must be >= 1")
    if self.rows < 0 or self.decode_len < 0:
      raise ValueError(f"rows={self.rows}, decode_len={self.decode_len}: must be >= 0 (0: the "
                       "config's)")


def _loop(step, iterations: int):
  """`step` run `iterations` times in one loop, its input shifted each time and its outputs summed
  into the carry, so that XLA can neither hoist it out of the loop nor drop it."""
  def loop(first, *rest):
    def body(i, carry):
      outputs = step(first + i.astype(first.dtype) * 1e-3, *rest)
      total = sum(jnp.sum(o.astype(jnp.float32)) for o in jax.tree_util.tree_leaves(outputs))
      return carry + total
    return jax.lax.fori_loop(0, iterations, body, jnp.float32(0))
  return loop


def _per_iteration(step, args, iterations: int, calls: int) -> float:
  """Median seconds per iteration of `step(*args)` in a compiled loop."""
  compiled = jax.jit(_loop(step, iterations))
  jax.block_until_ready(compiled(*args))
  times = []
  for _ in range(calls):
    start = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    times.append(time.perf_counter() - start)
  return statistics.median(times) / iterations


def _log_scores(logits, live, rows: int, beam: int, vocab: int):
  """Beam search's scores of every one-token extension: each live hypothesis's score plus the
  log-probabilities of its next token, `[rows, beam * vocab]`."""
  log_probs = jax.nn.log_softmax(logits, axis=-1).reshape(rows, beam, vocab)
  return (live[:, :, None] + log_probs).reshape(rows, beam * vocab)


def _pairs(rows: int, beam: int, vocab: int, d_model: int, heads: int, slots: list[int]):
  """{name: (args, {variant: step})} on random float32 inputs; before and after first."""
  rng = np.random.default_rng(0)
  normal = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)  # noqa: E731
  candidates = search.num_candidates(beam, vocab)
  log_scores = functools.partial(_log_scores, rows=rows, beam=beam, vocab=vocab)
  pairs = {"greedy token": ((normal(rows, d_model), normal(d_model, vocab)), {
      "before: jnp.argmax": lambda x, w: jnp.argmax(x @ w, axis=-1),
      "after: search.first_argmax": lambda x, w: search.first_argmax(x @ w),
      "reference: the logits matmul alone": lambda x, w: x @ w})}
  pairs["beam candidates"] = ((normal(rows * beam, vocab), normal(rows, beam)), {
      "before: lax.top_k": lambda x, s: jax.lax.top_k(log_scores(x, s), candidates),
      "after: search.top_k": lambda x, s: search.top_k(log_scores(x, s), candidates,
                                                       search.TOP_K_BLOCK),
      "reference: no top-k": lambda x, s: log_scores(x, s)[:, :candidates]})
  depth = d_model // heads
  for n in slots:
    keys = normal(rows, heads, n, depth)
    pairs[f"beam self-attention scores, {n} slots"] = (
        (normal(rows, heads, beam, depth), keys, keys.swapaxes(2, 3).copy()), {
            "before: keys [slots, kv]": lambda q, k, kt: jnp.einsum("shqd,shkd->shqk", q, k),
            "after: keys [kv, slots]": lambda q, k, kt: jnp.einsum("shqd,shdk->shqk", q, kt)})
  return pairs


def shapes(config, options: KernelOptions) -> dict:
  """The sizes the pairs run at: the config's, `options`' rows and beam, and the cached slots of
  each stage of the search's cache (`search.stage_ends` of the output length, times the beam)."""
  decode_len = options.decode_len or config.data.max_target_len
  return dict(rows=options.rows or global_rows(config.data), beam=options.beam,
              vocab=config.data.vocab_size, d_model=config.model.d_model,
              heads=config.model.num_heads,
              slots=[end * options.beam for end in search.stage_ends(decode_len)])


def run(config, options: KernelOptions) -> dict:
  sizes = shapes(config, options)
  pairs = _pairs(**sizes)
  load_start = common.load_average()
  figures = {}
  for name, (args, variants) in pairs.items():
    outputs = [jax.jit(step)(*args) for step in list(variants.values())[:2]]
    same = all(bool(jnp.array_equal(a, b)) for a, b in zip(
        jax.tree_util.tree_leaves(outputs[0]), jax.tree_util.tree_leaves(outputs[1])))
    times = {variant: [] for variant in variants}
    for _ in range(options.repeats):
      for variant, step in variants.items():
        times[variant].append(_per_iteration(step, args, options.iterations, options.calls))
    figures[name] = {"same_outputs": same, "us_per_iteration": {
        v: [round(t * 1e6, 1) for t in ts] for v, ts in times.items()}}
  print(f"search kernels, {sizes}, float32, {options.iterations} iterations a call, median of "
        f"{options.calls} calls, {options.repeats} rounds (us per iteration):")
  for name, figure in figures.items():
    print(f"{name} (before and after give the same outputs: {figure['same_outputs']})")
    for variant, us in figure["us_per_iteration"].items():
      print(f"  {variant:<40} {', '.join(f'{u:,.0f}' for u in us)}")
  return dict(what="kernels", shapes=sizes, options=dataclasses.asdict(options),
              config=common.config_json(config), **common.environment(),
              load_average_start=load_start, load_average_end=common.load_average(),
              figures=figures)
