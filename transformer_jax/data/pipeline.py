"""The grain pipeline: tokenized, filtered, shuffled, packed, sharded, prefetched, resumable.

Training (`train_dataset`), in order:

    chunk ids 0, 1, 2, ... (grain MapDataset.range)
    -> ReadChunk: this process's slice [p::P] of the split, permuted anew each epoch from the
       seed; the chunk's records read in one call, tokenized in one SentencePiece call, eos
       appended, over-long pairs dropped
    -> threaded read-ahead of chunks (grain ReadOptions)
    -> WindowBatcher: a window of chunks packed (or bucketed, or padded) into fixed-shape batches
    -> background prefetch of batches (grain ThreadPrefetchIterDataset)

Every stage's iterator has `get_state()` / `set_state()`; the state is a few integers (the next
chunk id at the start of the current window and the batches of that window already emitted),
so the state saved with a checkpoint restores exactly the batches an uninterrupted run sees.
Processes read disjoint slices that together cover the split, and shuffle them with the same
seed.

Why not grain's own packer and per-example reads: `FirstFitPackIterDataset` gives the right
segment ids and positions (checked in tests/test_data_pipeline.py) but managed about 800 rows
of 64 tokens per second here (~30k target tokens/s), and per-example reads and tokenization
about 5,500 pairs/s; too close to the 10x margin over the train step that we want. Reading and
tokenizing a chunk at a time and packing a window with first-fit-decreasing in numpy is many
times faster and fills rows better (see docs/data.md).

Evaluation (`eval_batches`) is plain Python over the whole split: nothing dropped or truncated
(but for a learned position table's length),
one padded shape per split, the last batch padded with empty rows and `num_real` saying how
many are real.
"""
from __future__ import annotations

from fractions import Fraction
import logging
import random
import threading
from typing import Iterator, Sequence

import grain
import numpy as np

from transformer_jax import batch as batch_lib
from transformer_jax.data.config import DataError, buckets
from transformer_jax.data.datasets import as_text, get_items
from transformer_jax.data.tokenizer import EOS_ID, PAD_ID, Tokenizer

CHUNK = 1024  # Pairs read and tokenized per call.


def _fits(source_ids, target_ids, max_source: int, max_target: int) -> bool:
  """Whether training keeps a pair (ids with eos) under the limits of its rows."""
  return len(source_ids) <= max_source and len(target_ids) <= max_target


def count_too_long(pairs: Sequence[tuple[str, str]], tokenizer: Tokenizer, c) -> int:
  """How many of the training `pairs` (strings) `ReadChunk` drops under the limits of `c`
  (data.max_source_len / data.max_target_len), counted without reading an epoch."""
  sources, targets, _ = eval_ids(pairs, tokenizer)
  return sum(not _fits(s, t, c.max_source_len, c.max_target_len)
             for s, t in zip(sources, targets))


class ReadChunk:
  """Chunk id -> this process's pairs of that chunk as (source ids + eos, target ids + eos).

  Chunk ids run on forever: chunk k of epoch e is positions [k*CHUNK, (k+1)*CHUNK) of epoch
  e's permutation of this process's indices, so an epoch never mixes with the next one.
  Thread-safe: grain calls it from several reader threads.
  """

  def __init__(self, source, tokenizer: Tokenizer, c, process_index: int, process_count: int):
    self._source, self._tokenizer = source, tokenizer
    self._source_lang, self._target_lang = c.source_lang, c.target_lang
    self._max_source, self._max_target = c.max_source_len, c.max_target_len
    self._seed = c.shuffle_seed
    self._indices = np.arange(process_index, len(source), process_count)
    if len(self._indices) == 0:
      raise ValueError(f"process {process_index} of {process_count} has no training data "
                       f"({len(source)} examples)")
    self.chunks_per_epoch = -(-len(self._indices) // CHUNK)
    self._lock = threading.Lock()
    self._permutations: dict[int, np.ndarray] = {}
    # Chunks of each epoch that kept no pair, and the (source, target) lengths of the pair
    # nearest to fitting: a whole epoch of them means no pair fits the limits, and the window
    # batcher would read forever.
    self._empty_chunks: dict[int, set[int]] = {}
    self._nearest: tuple[int, int, int] | None = None
    # Each said once: that pairs are dropped at all, and that a chunk lost most of its pairs.
    self._warned_dropped = self._warned = False

  def _permutation(self, epoch: int) -> np.ndarray:
    with self._lock:
      if epoch not in self._permutations:
        rng = np.random.default_rng([self._seed, epoch])
        self._permutations[epoch] = rng.permutation(len(self._indices))
        for old in [e for e in self._permutations if e < epoch - 1]:
          del self._permutations[old]  # Threads may still finish the previous epoch.
      return self._permutations[epoch]

  def __call__(self, chunk_id: int) -> list[tuple[list[int], list[int]]]:
    epoch, k = divmod(int(chunk_id), self.chunks_per_epoch)
    positions = self._permutation(epoch)[k * CHUNK:(k + 1) * CHUNK]
    records = get_items(self._source, self._indices[positions].tolist())
    sources = self._tokenizer.encode_batch([as_text(r[self._source_lang]) for r in records])
    targets = self._tokenizer.encode_batch([as_text(r[self._target_lang]) for r in records])
    out = []
    for source, target in zip(sources, targets):
      source.append(EOS_ID)
      target.append(EOS_ID)
      # Training drops pairs longer than the rows; evaluation never does.
      if _fits(source, target, self._max_source, self._max_target):
        out.append((source, target))
    self._check_kept(epoch, k, len(out), sources, targets)
    return out

  def _check_kept(self, epoch: int, k: int, kept: int, sources, targets) -> None:
    """Warn once when a chunk drops pairs and once when it drops most of them; raise when a
    whole epoch kept none."""
    with self._lock:
      limits = (f"data.max_source_len={self._max_source} / data.max_target_len="
                f"{self._max_target} (pieces, EOS included)")
      self._warn_of_drops(kept, len(sources), limits)
      if kept:
        self._empty_chunks.pop(epoch, None)
        return
      # Only an epoch of empty chunks is an error: only they can hold the pair it names, the
      # one whose longer side (against its limit) is the least too long.
      pairs = [(max(len(s) - self._max_source, len(t) - self._max_target), len(s), len(t))
               for s, t in zip(sources, targets)]
      self._nearest = min(pairs + [self._nearest] if self._nearest else pairs, default=None)
      for old in [e for e in self._empty_chunks if e < epoch - 1]:
        del self._empty_chunks[old]
      empty = self._empty_chunks.setdefault(epoch, set())
      empty.add(k)
      if len(empty) < self.chunks_per_epoch:
        return
      _, source_len, target_len = self._nearest
    raise DataError(
        f"no training pair fits {limits}: all {len(self._indices)} pairs of this process were "
        f"read and dropped (the nearest to fitting has {source_len} source / {target_len} "
        "target pieces); raise the limits or check data.source_lang / data.target_lang")

  def _warn_of_drops(self, kept: int, read: int, limits: str) -> None:
    """Says the first chunk that drops pairs, so that a run's log shows that training skips
    some (once: with a few long pairs in the corpus, every chunk drops some), and again the
    first that drops most of them, as the limits may then be set too low."""
    if kept < read / 2 and not self._warned:
      self._warned = self._warned_dropped = True
      logging.warning("training data: a chunk kept %d of %d pairs; the rest are longer than "
                      "%s", kept, read, limits)
    elif kept < read and not self._warned_dropped:
      self._warned_dropped = True
      logging.warning("training data: a chunk dropped %d of %d pairs (%.1f%%), longer than %s: "
                      "training skips such pairs (said once); raise the limits to train on "
                      "them", read - kept, read, 100 * (read - kept) / read, limits)


def _empty_batch(rows: int, source_len: int, target_len: int) -> dict:
  """Zeros (padding, segment 0) for every key of `batch.KEYS`."""
  return {key: np.zeros((rows, length), np.int32)
          for side, length in (("inputs", source_len), ("targets", target_len))
          for key in batch_lib.side_keys(side)}


def _place(batch: dict, row: int, side: str, offset: int, ids, segment: int) -> None:
  n = len(ids)
  tokens, segments, positions = batch_lib.side_keys(side)
  batch[tokens][row, offset:offset + n] = ids
  batch[segments][row, offset:offset + n] = segment
  batch[positions][row, offset:offset + n] = np.arange(n, dtype=np.int32)


def _cut(rows: dict, num_rows: int, batch_rows: int) -> list[dict]:
  """Consecutive batches of `batch_rows` rows; the last is padded with empty rows."""
  batches = []
  for start in range(0, num_rows, batch_rows):
    batch = {k: v[start:start + batch_rows] for k, v in rows.items()}
    missing = batch_rows - len(batch["inputs"])
    if missing:
      batch = {k: np.concatenate([v, np.zeros((missing, v.shape[1]), np.int32)])
               for k, v in batch.items()}
    batches.append(batch)
  return batches


def pack_rows(pairs: Sequence[tuple[Sequence[int], Sequence[int]]], source_len: int,
              target_len: int) -> tuple[dict, int]:
  """First-fit-decreasing packing of pairs into rows; returns (arrays [n, len], rows used).

  Pairs are taken longest first and each goes into the first row where both its source and
  its target still fit. A pair's source and target get the same segment id (1, 2, ... in a
  row, 0 for padding) and positions that restart at 0 in every segment.
  """
  n = len(pairs)
  order = sorted(range(n), key=lambda i: -(len(pairs[i][0]) + len(pairs[i][1])))
  free_source = np.empty(n, np.int64)
  free_target = np.empty(n, np.int64)
  segments = np.zeros(n, np.int64)
  rows = _empty_batch(n, source_len, target_len)
  num_rows = 0
  for i in order:
    source, target = pairs[i]
    fits = np.flatnonzero((free_source[:num_rows] >= len(source))
                          & (free_target[:num_rows] >= len(target)))
    if len(fits):
      row = int(fits[0])
    else:
      row, num_rows = num_rows, num_rows + 1
      free_source[row], free_target[row] = source_len, target_len
    segments[row] += 1
    _place(rows, row, "inputs", source_len - free_source[row], source, segments[row])
    _place(rows, row, "targets", target_len - free_target[row], target, segments[row])
    free_source[row] -= len(source)
    free_target[row] -= len(target)
  return rows, num_rows


def pad_rows(pairs, source_len: int, target_len: int) -> tuple[dict, int]:
  """One pair per row, in order."""
  rows = _empty_batch(len(pairs), source_len, target_len)
  for row, (source, target) in enumerate(pairs):
    _place(rows, row, "inputs", 0, source, 1)
    _place(rows, row, "targets", 0, target, 1)
  return rows, len(pairs)


class Batcher:
  """Turns one window of pairs into a list of batches, by `data.batching`."""

  def __init__(self, c, rows: int, process_count: int):
    self._mode, self._seed, self._rows = c.batching, c.shuffle_seed, rows
    self._source_len, self._target_len = c.max_source_len, c.max_target_len
    if self._mode == "bucket":
      self.lengths, self.rows = buckets(c, rows, process_count)

  @property
  def layout(self) -> dict:
    """What decides the batches of a window (saved with the iterator state; JSON values)."""
    layout = {"mode": self._mode, "rows": self._rows, "source_len": self._source_len,
              "target_len": self._target_len}
    if self._mode == "bucket":
      layout.update(bucket_lengths=list(self.lengths), bucket_rows=list(self.rows))
    return layout

  def same_rows_in_other_batches(self, saved: dict) -> bool:
    """Whether a window batched under `saved` has the same rows in the same order as under
    this batcher, cut into batches of another size (pack and pad: only the rows per batch
    differ), so that a resume can skip exactly the rows already trained on."""
    return (self._mode in ("pack", "pad") and saved.get("mode") == self._mode
            and {**saved, "rows": self._rows} == self.layout)

  def __call__(self, pairs: list, window: int, skip_rows: int) -> list[dict]:
    """The window's batches; `skip_rows` (pack and pad): without its first rows."""
    rng = random.Random(self._seed * 1_000_003 + window)
    if self._mode == "pad":
      rows, num_rows = pad_rows(pairs, self._source_len, self._target_len)
      return _cut({k: v[skip_rows:] for k, v in rows.items()}, max(num_rows - skip_rows, 0),
                  self._rows)
    if self._mode == "pack":
      rows, num_rows = pack_rows(pairs, self._source_len, self._target_len)
      # Packing sorted the pairs by length: shuffle the rows so batches mix lengths.
      order = np.asarray(rng.sample(range(num_rows), num_rows), np.int64)[skip_rows:]
      rows = {k: v[order] for k, v in rows.items()}
      return _cut(rows, len(order), self._rows)
    assert not skip_rows, "bucket batches are shuffled: rows cannot be skipped"
    by_bucket: list[list] = [[] for _ in self.lengths]
    for pair in pairs:
      length = max(len(pair[0]), len(pair[1]))
      by_bucket[next(i for i, b in enumerate(self.lengths) if length <= b)].append(pair)
    batches = []
    for length, rows, bucket in zip(self.lengths, self.rows, by_bucket):
      if bucket:
        batches.extend(_cut(*pad_rows(bucket, length, length), rows))
    rng.shuffle(batches)  # Otherwise a window would go from short to long batches.
    return batches


class _WindowIterator(grain.DatasetIterator):
  """Reads `window` chunks, turns them into batches with `batcher`, emits them in order.

  The state is the parent's state at the start of the current window, the window's number
  and how many of its batches were emitted: restoring re-reads the window and skips those
  batches, which is exact and keeps the state small. The last batch of a window may be
  partly empty (about one batch in `window` chunks' worth): the price of that small state.

  The state also holds the batcher's `layout`. A resume with other rows per batch (pack, pad)
  skips the rows already emitted and cuts the rest into the new batches (`skip_rows`, kept in
  the state from then on); any other change to the batching starts at the next window, with a
  warning, as its batches no longer say which pairs were trained on. And it holds how many
  chunks the window read (`window_chunks`): a resume with another `data.window_chunks` reads
  the current window as it was read (the same pairs, packed and shuffled the same) and the
  new number from the next window on.
  """

  def __init__(self, parent, *, batcher, window: int):
    super().__init__(parent)
    self._batcher, self._window = batcher, window
    self._window_index, self._window_state = -1, None
    self._batches: list[dict] = []
    self._next = self._skip = 0
    self._chunks = window

  def _fill(self, window_index: int, skip_rows: int = 0, chunks: int | None = None) -> None:
    self._window_state = self._parent.get_state()
    self._window_index = window_index
    self._chunks = chunks or self._window
    pairs = []
    for _ in range(self._chunks):
      pairs.extend(next(self._parent))
    self._batches, self._next = self._batcher(pairs, window_index, skip_rows), 0
    self._skip = skip_rows

  def __next__(self):
    while self._next >= len(self._batches):
      self._fill(self._window_index + 1)
    batch = self._batches[self._next]
    self._next += 1
    return batch

  def get_state(self):
    if self._window_state is None:  # Nothing read yet.
      return {"parent": self._parent.get_state(), "window": -1, "next": 0}
    return {"parent": self._window_state, "window": self._window_index, "next": self._next,
            "skip_rows": self._skip, "batching": self._batcher.layout,
            "window_chunks": self._chunks}

  def set_state(self, state):
    self._parent.set_state(state["parent"])
    self._batches, self._next, self._window_state = [], 0, None
    self._window_index = state["window"]
    if state["window"] < 0:
      return
    # States without a layout (older checkpoints, `resharded_state`) are this batcher's; those
    # without a chunk count (before 2026-12-06) read windows of this iterator's size.
    saved, skip = state.get("batching", self._batcher.layout), state.get("skip_rows", 0)
    chunks = state.get("window_chunks", self._window)
    if saved == self._batcher.layout:
      self._fill(state["window"], skip, chunks)
      self._next = state["next"]
    elif self._batcher.same_rows_in_other_batches(saved):
      self._fill(state["window"], skip + state["next"] * saved["rows"], chunks)
    else:
      self._fill(state["window"], chunks=chunks)
      logging.warning(
          "the data batching changed since the checkpoint (%s -> %s): its position in window "
          "%d (batch %d) says nothing about the new batches, so training continues with the "
          "next window; the %d batches left of this one are skipped", saved,
          self._batcher.layout, state["window"], state["next"], len(self._batches))
      self._next = len(self._batches)


class WindowBatchDataset(grain.IterDataset):
  """Batches from windows of chunks of pairs (see `_WindowIterator`)."""

  def __init__(self, parent, *, batcher, window: int):
    super().__init__(parent)
    self._batcher, self._window = batcher, window

  def __iter__(self):
    return _WindowIterator(self._parent.__iter__(), batcher=self._batcher,
                           window=self._window)


def train_dataset(source, tokenizer: Tokenizer, c, *, rows: int, process_index: int = 0,
                  process_count: int = 1) -> grain.IterDataset:
  """The endless training stream of this process (see the module docstring).

  "pack"/"pad": batches of `rows` rows (this process's share) of the configured lengths;
  "bucket": per bucket, [rows_b, length_b] with this process's share of the token budget.
  """
  read = ReadChunk(source, tokenizer, c, process_index, process_count)
  ds = grain.MapDataset.range(0, 1 << 62).map(read)  # Endless: epochs follow each other.
  it = ds.to_iter_dataset(grain.ReadOptions(num_threads=c.num_threads,
                                            prefetch_buffer_size=2 * c.window_chunks))
  it = WindowBatchDataset(it, batcher=Batcher(c, rows, process_count), window=c.window_chunks)
  if c.prefetch > 0:
    it = grain.experimental.ThreadPrefetchIterDataset(it, prefetch_buffer_size=c.prefetch)
  return it


def _chunks_per_epoch(num_examples: int, process_index: int, process_count: int) -> int:
  """`ReadChunk.chunks_per_epoch` of that process, without reading anything."""
  return -(-len(range(process_index, num_examples, process_count)) // CHUNK)


def resharded_state(states: Sequence[dict], num_examples: int, process_index: int,
                    process_count: int) -> dict:
  """This process's iterator state from the states of a run with another number of processes.

  The shards (`ReadChunk`) depend on the process count, so no position in the new shard holds
  exactly the batches the old ones would have given. What carries over is how far the run got:
  the slowest old process's position as a fraction of an epoch (the start of its current
  window, so at most one window is seen twice). Each new process starts at that fraction of
  its own shard's epoch. The rest of that epoch comes from the new shards' permutations, so
  some of its pairs are seen twice and others not until the next epoch; every later epoch is
  whole, and the run neither replays nor skips epochs.
  """
  progress = []
  for index, state in enumerate(states):
    try:
      chunk, window = int(state["parent"]["next_index"]), int(state["window"])
    except (KeyError, TypeError, ValueError) as e:
      raise ValueError(f"saved data iterator state of process {index} is not one this "
                       f"pipeline wrote ({e!r}: {state!r})") from e
    progress.append((Fraction(chunk, _chunks_per_epoch(num_examples, index, len(states))),
                     window))
  epochs = min(fraction for fraction, _ in progress)
  per_epoch = _chunks_per_epoch(num_examples, process_index, process_count)
  whole = epochs.numerator // epochs.denominator
  chunk = whole * per_epoch + int((epochs - whole) * per_epoch)
  # A window number no old process used: it seeds the window's row shuffle.
  window = max(w for _, w in progress) + 1
  return {"parent": {"next_index": chunk}, "window": window, "next": 0}


# ----------------------------------------------------------------------------------------------
# Evaluation.

def _round_up(n: int, multiple: int = 8) -> int:
  return -(-n // multiple) * multiple


def eval_ids(pairs: Sequence[tuple[str, str]], tokenizer: Tokenizer,
             max_len: int | None = None) -> tuple[list[list[int]], list[list[int]], int]:
  """(source ids + eos, target ids + eos, how many pairs were cut). With `max_len` (a learned
  position table's size), a side longer than it keeps its first `max_len - 1` pieces and eos."""
  source_ids = [ids + [EOS_ID] for ids in tokenizer.encode_batch([s for s, _ in pairs])]
  target_ids = [ids + [EOS_ID] for ids in tokenizer.encode_batch([t for _, t in pairs])]
  if not max_len:
    return source_ids, target_ids, 0
  cut = sum(len(s) > max_len or len(t) > max_len for s, t in zip(source_ids, target_ids))
  source_ids, target_ids = ([x if len(x) <= max_len else x[:max_len - 1] + [EOS_ID] for x in ids]
                            for ids in (source_ids, target_ids))
  return source_ids, target_ids, cut


def eval_batches(pairs: Sequence[tuple[str, str]], tokenizer: Tokenizer, *, batch_size: int,
                 min_len: int = 0, max_len: int | None = None) -> Iterator[dict]:
  """All `pairs` in order, in batches of `batch_size` rows padded to one length per split.

  The length is the longest sentence (with eos) rounded up to a multiple of 8, or `min_len`
  if that is larger: nothing is truncated, unless `max_len` is given (a model with a learned
  position table of that size, which cannot take longer rows): then longer sentences are cut
  (`eval_ids`) and no row is longer than `max_len`. Keys: `batch.KEYS`, `source_text`,
  `target_text` (raw references for sacreBLEU) and `num_real` (rows before the padding rows).
  """
  sources = [s for s, _ in pairs]
  targets = [t for _, t in pairs]
  source_ids, target_ids, _ = eval_ids(pairs, tokenizer, max_len)
  source_len = max(min_len, _round_up(max((len(x) for x in source_ids), default=1)))
  target_len = max(min_len, _round_up(max((len(x) for x in target_ids), default=1)))
  if max_len:
    source_len, target_len = min(source_len, max_len), min(target_len, max_len)
  for start in range(0, len(pairs), batch_size):
    chunk = list(zip(source_ids[start:start + batch_size], target_ids[start:start + batch_size]))
    batch = _cut(*pad_rows(chunk, source_len, target_len), batch_size)[0]
    batch["source_text"] = sources[start:start + batch_size]
    batch["target_text"] = targets[start:start + batch_size]
    batch["num_real"] = len(chunk)
    yield batch


assert PAD_ID == 0  # The np.zeros padding above relies on it.
