"""Scoring given translations with a trained run: each target's log-probability given its source.

    translator = Translator("runs/default")
    result = score(translator, [("seven", "sieben"), ("two", "zwei")], "mine", "/tmp/out")

What reranking, quality estimation and perplexity need and a search does not give:
`log P(target | source)` (natural log) under the run's model, teacher-forced with dropout off,
over the target's SentencePiece pieces and its EOS, the log-softmax taken over the whole
vocabulary as beam search scores its hypotheses (with alpha 0, a finished hypothesis's beam
score is this number; tested). Sources are read as translate.py reads them (`Translator.encode`:
a source longer than max_len - 1 pieces is read whole, or cut where the position table is
learned, with a warning). A pair with an empty source is not scored (the model never saw one;
translate.py gives it an empty translation), nor, with a learned position table, a target of
more than max_len tokens (the table has no rows past it): such pairs get `log_prob` null and a
`skipped` reason. An empty target is scored: it is EOS alone.

Batching follows the search's (`Translator.bucket_shape`): pairs sorted by length, batches of at
most `batch_size`, rows padded to a power of two and both lengths to a multiple of 16, each
shape compiled once (ahead of time, its time reported apart).
"""
from __future__ import annotations

import json
import math
import os
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.files import write_atomically
from transformer_jax.inference.evaluation import (
  nonempty,
  translator_output_dir,
  warn_if_other_files,
  writable_dir,
)
from transformer_jax.inference.translator import Translator, warn_stderr
from transformer_jax.search import target_log_probs

EMPTY_SOURCE = "empty source"


class PairScorer:
  """A Translator's model and parameters, scoring id pairs in bucketed batches; one compiled
  program per batch shape, kept."""

  def __init__(self, translator: Translator):
    self.translator = translator
    self._programs: dict[tuple[int, int, int], Callable] = {}
    self.compile_seconds = 0.0
    self.score_seconds = 0.0

  @property
  def compiled_shapes(self) -> int:
    return len(self._programs)

  def _program(self, rows: int, source_len: int, target_len: int) -> Callable:
    key = (rows, source_len, target_len)
    if key not in self._programs:
      begin = time.perf_counter()
      config, params = self.translator.config, self.translator.params
      inputs = jax.ShapeDtypeStruct((rows, source_len), jnp.int32)
      targets = jax.ShapeDtypeStruct((rows, target_len), jnp.int32)
      self._programs[key] = target_log_probs.lower(config, params, inputs, targets).compile()
      self.compile_seconds += time.perf_counter() - begin
    return self._programs[key]

  def score_ids(self, sources: Sequence[Sequence[int]], targets: Sequence[Sequence[int]],
                skip: Sequence[bool] | None = None) -> list[float | None]:
    """log P(target | source) per pair of id lists (each with its EOS); None where the source
    is empty or `skip[i]` is set."""
    t = self.translator
    out: list[float | None] = [None] * len(sources)
    order = sorted((i for i, s in enumerate(sources) if len(s) and not (skip and skip[i])),
                   key=lambda i: (-len(targets[i]), -len(sources[i])))
    for start in range(0, len(order), t.batch_size):
      chunk = order[start:start + t.batch_size]
      rows, source_len = t.bucket_shape(len(chunk), max(len(sources[i]) for i in chunk))
      _, target_len = t.bucket_shape(len(chunk), max(len(targets[i]) for i in chunk))
      inputs = np.full((rows, source_len), t.config.pad_id, np.int32)
      padded = np.full((rows, target_len), t.config.pad_id, np.int32)
      for r, i in enumerate(chunk):
        inputs[r, :len(sources[i])] = sources[i]
        padded[r, :len(targets[i])] = targets[i]
      program = self._program(rows, source_len, target_len)
      begin = time.perf_counter()
      values = np.asarray(program(t.params, inputs, padded))
      self.score_seconds += time.perf_counter() - begin
      for r, i in enumerate(chunk):
        out[i] = float(values[r])
    return out


def pair_scores(translator: Translator, pairs: Sequence[tuple[str, str]],
                names: Sequence[str] | None = None, warn: Callable[[str], None] = warn_stderr,
                scorer: PairScorer | None = None) -> list[dict]:
  """One record per pair, in order: `pair` (from 1), `log_prob` (None when skipped, with
  `skipped` saying why), `target_tokens` (pieces and EOS) and `nll_per_token`. `names[i]`
  names pair i in warnings (default `pair <i+1>`); at most 10 warnings about long lines are
  given, then their count."""
  said: list[str] = []

  def capped(message: str) -> None:  # the long-line warnings, capped as evaluate.py's
    said.append(message)
    if len(said) <= 10:
      warn(message)

  names = names or [f"pair {i + 1}" for i in range(len(pairs))]
  scorer = scorer or PairScorer(translator)
  config, tokenizer = translator.config, translator.tokenizer
  sources = translator.encode([s for s, _ in pairs], capped, names, translated=False)
  targets = [list(ids) + [tokenizer.eos_id]
             for ids in tokenizer.encode_batch([t for _, t in pairs])] if pairs else []
  too_long = [len(ids) > config.max_len for ids in targets]
  for name, ids, long in zip(names, targets, too_long):
    if not long:
      continue
    if config.position_encoding == "learned":
      capped(f"{name}: the target is {len(ids)} tokens with EOS, more than the model's learned "
           f"position table (max_len {config.max_len}): not scored")
    else:
      capped(f"{name}: the target is {len(ids)} tokens with EOS, more than the {config.max_len} "
           "(max_len) the model was built for: scored whole, as sinusoidal positions extend "
           "past max_len")
  if len(said) > 10:
    warn(f"... and {len(said) - 10} more sources or targets longer than the model's max_len")
  empty = [name for name, ids in zip(names, sources) if not ids]
  if empty:
    more = ", ..." if len(empty) > 5 else ""
    warn(f"{len(empty)} pair(s) with an empty source not scored ({', '.join(empty[:5])}{more}): "
         "the model never saw an empty source (translate.py gives it an empty translation)")
  skip = [long and config.position_encoding == "learned" for long in too_long]
  values = scorer.score_ids(sources, targets, skip)
  records = []
  for i, (value, ids) in enumerate(zip(values, targets)):
    record = {"pair": i + 1, "log_prob": value, "target_tokens": len(ids),
              "nll_per_token": None if value is None else -value / len(ids)}
    if value is None:
      record["skipped"] = EMPTY_SOURCE if not sources[i] else "target over max_len"
    records.append(record)
  return records


def corpus_figures(records: Sequence[dict]) -> dict:
  """Over the scored pairs: their count, target tokens, summed log-probability, the negative
  log-likelihood per target token and its exponential, the perplexity per target token (of
  this tokenizer's pieces and EOS: it compares runs with the same spm.model only)."""
  scored = [r for r in records if r["log_prob"] is not None]
  tokens = sum(r["target_tokens"] for r in scored)
  total = math.fsum(r["log_prob"] for r in scored)
  nll = -total / tokens if tokens else None
  return {"scored": len(scored), "target_tokens": tokens, "log_prob": total,
          "nll_per_token": nll, "perplexity": math.exp(nll) if nll is not None else None,
          "skipped_empty_sources": sum(r.get("skipped") == EMPTY_SOURCE for r in records),
          "skipped_long_targets": sum(r.get("skipped") == "target over max_len"
                                      for r in records)}


def score(translator: Translator, pairs: Sequence[tuple[str, str]], name: str,
          output_dir: str | None = None, extra: dict | None = None,
          warn: Callable[[str], None] = warn_stderr) -> dict:
  """Score every pair, write `scores.<name>.jsonl` (one record per pair, in order) and the
  result `score.<name>.json` into `output_dir` (default: the checkpoint's evaluation
  directory, `evaluation.translator_output_dir`), both written whole, and return the result:
  the corpus figures (`corpus_figures`), the checkpoint, the timing and `extra`."""
  output_dir = output_dir or translator_output_dir(translator)
  pairs = nonempty(list(pairs), name)
  writable_dir(output_dir)  # now, not after scoring
  scorer = PairScorer(translator)
  records = pair_scores(translator, pairs, [f"{name} pair {i + 1}" for i in range(len(pairs))],
                        warn, scorer)
  seconds = scorer.score_seconds
  settings = translator.settings()
  figures = corpus_figures(records)
  result = {"split": name, "sentences": len(pairs), **figures,
            **{k: settings[k] for k in ("step", "checkpoint", "averaged_steps", "batch_size",
                                        "ensemble") if k in settings},
            "pairs_per_sec": figures["scored"] / seconds if seconds > 0 else None,
            "score_seconds": seconds, "compile_seconds": scorer.compile_seconds,
            "compiled_shapes": scorer.compiled_shapes, **(extra or {}),
            "scores": os.path.join(output_dir, f"scores.{name}.jsonl"), "time": time.time()}
  summary = os.path.join(output_dir, f"score.{name}.json")
  warn_if_other_files(summary, result, kept="")
  write_atomically(result["scores"], "".join(json.dumps(r) + "\n" for r in records))
  write_atomically(summary, json.dumps(result, indent=2))
  return result
