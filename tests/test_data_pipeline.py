"""The training and evaluation streams on a small numbers dataset built into a tmp dir."""
import json
import logging
import re
import threading

import grain
import numpy as np
import pytest

from transformer_jax import batch as batch_lib
from transformer_jax.data import config as data_config
from transformer_jax.data import datasets, default_data_config, get_data, pipeline

KEYS = batch_lib.KEYS


def small_config(tmp, **overrides):
  c = default_data_config()
  c.data_dir = str(tmp / "tfds")
  c.numbers_train_size, c.numbers_eval_size = 3000, 150
  c.vocab_size = 500
  c.max_source_len = c.max_target_len = 32
  c.batch_size = 16
  c.window_chunks = 1  # Small windows so a few batches cross windows and epochs.
  c.prefetch = 2
  for key, value in overrides.items():
    c[key] = value
  return c


@pytest.fixture(scope="session")
def base(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("pipeline")
  data = get_data(small_config(tmp), str(tmp / "work"))
  return tmp, data


def data_with(base, **overrides):
  tmp, data = base
  # Same dataset and tokenizer files: only the batching settings change.
  return get_data(small_config(tmp, **overrides), str(tmp / "work"))


def take(it, n):
  return [next(it) for _ in range(n)]


def assert_same_batches(xs, ys):
  assert len(xs) == len(ys)
  for x, y in zip(xs, ys):
    for key in KEYS:
      np.testing.assert_array_equal(x[key], y[key])


def segments(batch, row, side):
  """{segment id: token ids} of one row."""
  ids, seg = batch[side][row], batch[f"{side}_segmentation"][row]
  return {int(s): ids[seg == s].tolist() for s in np.unique(seg) if s}


def test_shapes_and_dtypes(base):
  _, data = base
  for mode in ("pack", "pad"):
    batches = take(iter(data_with(base, batching=mode).train_dataset()), 12)
    for batch in batches:
      assert set(batch) == set(KEYS)
      for key in KEYS:
        assert batch[key].shape == (16, 32) and batch[key].dtype == np.int32, key


def test_packing_keeps_segments_apart(base):
  _, data = base
  batches = take(iter(data.train_dataset()), 10)
  multi = 0
  for batch in batches:
    for row in range(batch["inputs"].shape[0]):
      for side in ("inputs", "targets"):
        seg = batch[f"{side}_segmentation"][row]
        pos = batch[f"{side}_positions"][row]
        ids = batch[side][row]
        real = seg > 0
        assert (ids[~real] == 0).all() and (pos[~real] == 0).all()
        assert (ids[real] != 0).all()
        # Segment ids are 1..k, contiguous, in order; positions restart at 0.
        k = seg.max()
        assert sorted(set(seg[real].tolist())) == list(range(1, k + 1))
        for s in range(1, k + 1):
          where = np.flatnonzero(seg == s)
          assert (np.diff(where) == 1).all()
          assert pos[where].tolist() == list(range(len(where)))
          assert ids[where][-1] == data.tokenizer.eos_id  # Every segment ends in eos.
      # The same pairs in inputs and targets: same segment ids on both sides.
      src, tgt = segments(batch, row, "inputs"), segments(batch, row, "targets")
      assert src.keys() == tgt.keys()
      multi += len(src) > 1
  assert multi > 50  # Packing really packs several pairs per row.


def test_packed_pairs_are_real_pairs(base):
  _, data = base
  train = dict(data.raw_examples("train"))
  batch = next(iter(data.train_dataset()))
  tok = data.tokenizer
  for row in range(4):
    src, tgt = segments(batch, row, "inputs"), segments(batch, row, "targets")
    for s in src:
      assert train[tok.detokenize(src[s])] == tok.detokenize(tgt[s])


def test_unpacked_modes_use_the_same_format(base):
  for mode in ("pad", "bucket"):
    batch = next(iter(data_with(base, batching=mode).train_dataset()))
    seg = batch["targets_segmentation"]
    assert set(np.unique(seg)) <= {0, 1}
    lengths = seg.sum(1)
    for row in range(seg.shape[0]):
      assert batch["targets_positions"][row, :lengths[row]].tolist() == list(
          range(lengths[row]))


def test_bucket_shapes_follow_the_token_budget(base):
  data = data_with(base, batching="bucket", batch_tokens=512, bucket_boundaries=(8, 16, 24))
  shapes = {next(it)["inputs"].shape for it in [iter(data.train_dataset())] for _ in range(30)}
  assert shapes <= {(64, 8), (32, 16), (16, 24), (16, 32)}, shapes
  assert len(shapes) >= 2


def test_same_seed_same_batches_and_new_seed_differs(base):
  a = take(iter(data_with(base).train_dataset()), 5)
  b = take(iter(data_with(base).train_dataset()), 5)
  c = take(iter(data_with(base, shuffle_seed=7).train_dataset()), 5)
  for x, y in zip(a, b):
    for key in KEYS:
      np.testing.assert_array_equal(x[key], y[key])
  assert any((x["inputs"] != y["inputs"]).any() for x, y in zip(a, c))


@pytest.mark.parametrize("mode,before", [("pack", 17), ("bucket", 17), ("pad", 17), ("pack", 0)])
def test_resume_reproduces_the_continuation(base, mode, before):
  data = data_with(base, batching=mode)
  # 3000 pairs are 3 chunks: 40 batches cross several windows and an epoch boundary. A state
  # saved before the first batch (a resume at step 0) must restore the fresh stream too.
  it = iter(data.train_dataset())
  take(it, before)
  state = json.loads(json.dumps(it.get_state()))  # Must survive a JSON checkpoint.
  expected = take(it, 23)
  resumed = iter(data_with(base, batching=mode).train_dataset())
  resumed.set_state(state)
  assert_same_batches(expected, take(resumed, 23))


def _real_rows(batches):
  """The non-empty rows of `batches`, in order, as tuples of every key's row."""
  return [tuple(tuple(b[k][r]) for k in KEYS) for b in batches
          for r in range(b["inputs"].shape[0]) if b["inputs_segmentation"][r].any()]


@pytest.mark.parametrize("mode", ["pack", "pad"])
def test_resume_with_another_batch_size_trains_on_every_row_once(base, mode):
  # 16 rows a batch, stopped after 5 batches, resumed with 8 or 24: the rows that follow are
  # those an uninterrupted run would train on next (only the last batch of a window, partly
  # empty, ends elsewhere), so no pair is skipped or repeated.
  it = iter(data_with(base, batching=mode, batch_size=16).train_dataset())
  take(it, 5)
  state = json.loads(json.dumps(it.get_state()))
  expected = _real_rows(take(it, 12))
  for rows in (8, 24):
    resumed = iter(data_with(base, batching=mode, batch_size=rows).train_dataset())
    resumed.set_state(state)
    got = _real_rows(take(resumed, 12 * 16 // rows))
    n = min(len(got), len(expected))
    assert n > 100 and got[:n] == expected[:n], rows
  # The resumed stream's own state (the rows it skipped in its window) restores exactly.
  resumed = iter(data_with(base, batching=mode, batch_size=24).train_dataset())
  resumed.set_state(state)
  take(resumed, 1)
  again = json.loads(json.dumps(resumed.get_state()))
  assert again["window"] == state["window"] and again["skip_rows"] == 5 * 16
  continued = take(resumed, 4)
  restored = iter(data_with(base, batching=mode, batch_size=24).train_dataset())
  restored.set_state(again)
  assert_same_batches(continued, take(restored, 4))


@pytest.mark.parametrize("mode, change", [
    ("pack", {"batching": "pad"}), ("pad", {"batching": "pack"}),
    # The same mode and rows with other lengths: other rows, so no rows to skip either.
    ("pack", {"max_source_len": 24, "max_target_len": 24}),
])
def test_resume_with_other_batching_goes_on_at_the_next_window(base, caplog, mode, change):
  it = iter(data_with(base, batching=mode).train_dataset())
  take(it, 2)
  state = json.loads(json.dumps(it.get_state()))
  resumed = iter(data_with(base, **{"batching": mode, **change}).train_dataset())
  with caplog.at_level("WARNING"):
    resumed.set_state(state)
  assert any("the data batching changed since the checkpoint" in r.message
             and "training continues with the next window" in r.message for r in caplog.records)
  got = next(resumed)
  assert resumed.get_state()["window"] == state["window"] + 1
  # The first batch of that next window, batched the new way: as a fresh stream has it.
  fresh = iter(data_with(base, **{"batching": mode, **change}).train_dataset())
  while fresh.get_state()["window"] < state["window"] + 1:
    first = next(fresh)
  for key in KEYS:
    np.testing.assert_array_equal(got[key], first[key])


def _rest_of_window(it, window: int) -> list[dict]:
  """The batches `it` emits while still in `window` (the next one's first batch is dropped)."""
  out = []
  while True:
    batch = next(it)
    if it.get_state()["window"] != window:
      return out
    out.append(batch)


@pytest.mark.parametrize("mode", ["pack", "bucket"])
def test_resume_with_another_window_size_finishes_the_window_as_it_was_read(base, caplog, mode):
  """data.window_chunks is memory, not data: a resume with another one finishes the window it
  stopped in as that window was read (the same pairs, batched and shuffled the same, so none is
  skipped or trained twice; it used to re-read the window at the new size and skip the
  batches already emitted of that one), says nothing, and reads the new size from the next
  window on."""
  it = iter(data_with(base, batching=mode, window_chunks=2).train_dataset())
  take(it, 5)
  state = json.loads(json.dumps(it.get_state()))
  assert state["window_chunks"] == 2
  expected = _rest_of_window(it, state["window"])
  assert len(expected) > 5
  resumed = iter(data_with(base, batching=mode, window_chunks=1).train_dataset())
  with caplog.at_level("WARNING"):
    resumed.set_state(state)
  assert_same_batches(expected, _rest_of_window(resumed, state["window"]))
  assert not caplog.records
  after = resumed.get_state()
  assert after["window"] == state["window"] + 1 and after["window_chunks"] == 1
  # A state from before the count was saved reads its window at this iterator's size.
  old = iter(data_with(base, batching=mode, window_chunks=2).train_dataset())
  old.set_state({k: v for k, v in state.items() if k != "window_chunks"})
  assert_same_batches(expected, _rest_of_window(old, state["window"]))


@pytest.mark.parametrize("mode", ["pack", "pad"])
def test_a_state_without_a_layout_restores_as_before(base, mode):
  # Checkpoints written before the layout was saved (and `resharded_state`'s) hold only
  # parent, window and next: the batches of this batcher, nothing skipped.
  it = iter(data_with(base, batching=mode).train_dataset())
  take(it, 3)
  state = {k: v for k, v in it.get_state().items() if k in ("parent", "window", "next")}
  expected = take(it, 4)
  resumed = iter(data_with(base, batching=mode).train_dataset())
  resumed.set_state(state)
  assert_same_batches(expected, take(resumed, 4))


@pytest.mark.parametrize("done", [60, 64])
def test_a_resume_at_the_end_of_a_window_emits_no_empty_batch(base, done):
  # pad: 1,024 pairs a window are 64 batches of 16. Resumed with 8 rows after 60 (8 rows left
  # in the window) or all 64 (none left): the stream goes on with real rows only.
  it = iter(data_with(base, batching="pad", batch_size=16).train_dataset())
  take(it, done)
  state = json.loads(json.dumps(it.get_state()))
  assert state["window"] == 0 and state["next"] == done
  resumed = iter(data_with(base, batching="pad", batch_size=8).train_dataset())
  resumed.set_state(state)
  batches = take(resumed, 16)
  assert all(b["inputs_segmentation"].any(axis=1).sum() == 8 for b in batches)
  assert _real_rows(batches) == _real_rows(take(it, 8))


def test_resume_with_another_process_count_keeps_the_epoch_position(base):
  """2 processes -> 1 and 3: each new process starts at the old run's fraction of the epoch."""
  tmp, data = base
  c = data.config
  work = str(tmp / "work")
  n = len(data.sources["train"])  # 3000 pairs: 2 chunks per epoch per process for 2 processes
  old = [get_data(c, work, process_index=i, process_count=2) for i in range(2)]
  per_epoch = [pipeline.ReadChunk(d.sources["train"], d.tokenizer, c, i, 2).chunks_per_epoch
               for i, d in enumerate(old)]
  assert per_epoch == [2, 2]
  iters = [iter(d.train_dataset()) for d in old]
  for it in iters:  # into the second chunk of epoch 1 (window_chunks = 1: a window a chunk)
    while it.get_state()["parent"]["next_index"] < 3:
      next(it)
  states = json.loads(json.dumps([it.get_state() for it in iters]))
  assert [s["parent"]["next_index"] for s in states] == [3, 3]  # 1.5 epochs
  one = get_data(c, work)
  state = one.resharded_state(states)
  # One process has 3 chunks an epoch: 1.5 epochs is chunk 4, in a window no process used.
  assert state == {"parent": {"next_index": 4}, "window": max(s["window"] for s in states) + 1,
                   "next": 0}
  resumed = iter(one.train_dataset())
  resumed.set_state(state)
  read = pipeline.ReadChunk(one.sources["train"], one.tokenizer, c, 0, 1)
  expected = {str(p[1]) for p in read(4)}
  batch = next(resumed)
  got = [segments(batch, r, "targets") for r in range(batch["targets"].shape[0])]
  assert got and all(str(ids) in expected for row in got for ids in row.values())
  # Three processes of 1000 pairs (1 chunk an epoch each): the slowest old process decides.
  states[1]["parent"]["next_index"] = 2  # epoch 1.0
  three = [pipeline.resharded_state(states, n, i, 3) for i in range(3)]
  assert [s["parent"]["next_index"] for s in three] == [1, 1, 1]
  with pytest.raises(ValueError, match="process 0"):
    pipeline.resharded_state([{"parent": {}}], n, 0, 1)


def test_epochs_are_reshuffled(base):
  _, data = base
  c = data.config
  read = pipeline.ReadChunk(data.sources["train"], data.tokenizer, c, 0, 1)
  epoch0 = [p for k in range(read.chunks_per_epoch) for p in read(k)]
  epoch1 = [p for k in range(read.chunks_per_epoch, 2 * read.chunks_per_epoch) for p in read(k)]
  assert sorted(map(str, epoch0)) == sorted(map(str, epoch1))
  assert epoch0 != epoch1


def test_process_shards_are_disjoint_and_cover(base):
  _, data = base
  c = data.config
  every = {str(p) for k in range(3) for p in pipeline.ReadChunk(
      data.sources["train"], data.tokenizer, c, 0, 1)(k)}
  shards = []
  for p in range(3):
    read = pipeline.ReadChunk(data.sources["train"], data.tokenizer, c, p, 3)
    shards.append({str(x) for k in range(read.chunks_per_epoch) for x in read(k)})
  assert not shards[0] & shards[1] and not shards[0] & shards[2] and not shards[1] & shards[2]
  assert set().union(*shards) == every
  # Through get_data: rows split over processes, different data per process.
  tmp, _ = base
  d0 = get_data(small_config(tmp), str(tmp / "work"), process_index=0, process_count=2)
  d1 = get_data(small_config(tmp), str(tmp / "work"), process_index=1, process_count=2)
  b0, b1 = next(iter(d0.train_dataset())), next(iter(d1.train_dataset()))
  assert b0["inputs"].shape == (8, 32) and b1["inputs"].shape == (8, 32)
  assert (b0["inputs"] != b1["inputs"]).any()


def test_long_pairs_are_dropped_in_training_only(base):
  data = data_with(base, max_source_len=12, max_target_len=12)
  for batch in take(iter(data.train_dataset()), 5):
    for side in ("inputs", "targets"):
      assert batch[side].shape[1] == 12
  # One epoch of training pairs: exactly the train pairs that fit (ids + eos <= 12 a side),
  # whole and unchanged (dropped, not truncated).
  tok, train = data.tokenizer, data.raw_examples("train")
  read = pipeline.ReadChunk(data.sources["train"], tok, data.config, 0, 1)
  epoch = [p for k in range(read.chunks_per_epoch) for p in read(k)]
  fits = [(s, t) for s, t in train if len(tok.encode(s)) < 12 and len(tok.encode(t)) < 12]
  assert 0 < len(fits) < len(train)  # some pairs are too long (the test could fail)
  assert sorted((tok.detokenize(s[:-1]), tok.detokenize(t[:-1])) for s, t in epoch) == sorted(fits)
  # What prepare_data.py reports, counted without reading an epoch.
  assert pipeline.count_too_long(train, tok, data.config) == len(train) - len(fits)
  pairs = data.raw_examples("validation")
  batches = list(data.eval_batches("validation"))
  assert sum(b["num_real"] for b in batches) == len(pairs) == 150
  got = [t for b in batches for t in b["target_text"]]
  assert got == [t for _, t in pairs]
  tok = data.tokenizer
  decoded = [tok.detokenize(row) for b in batches for row in b["targets"][:b["num_real"]]]
  assert decoded == got  # Nothing truncated, even sentences longer than 12 pieces.
  assert max(len(tok.encode(t)) for t in got) >= 12


def test_eval_batches_shapes(base):
  _, data = base
  batches = list(data.eval_batches("test"))
  assert len({b["inputs"].shape for b in batches}) == 1
  assert all(b["inputs"].shape[0] == 64 for b in batches)
  last = batches[-1]
  assert last["num_real"] == 150 - 128
  assert (last["inputs"][last["num_real"]:] == 0).all()
  assert last["inputs"].shape[1] % 8 == 0
  with pytest.raises(ValueError, match="validation"):
    data.eval_batches("train")


def test_grain_first_fit_packer_matches_our_format():
  # Kept as the record of why grain's packer would be valid too (we use our own for speed).
  pairs = [(np.arange(1, n + 1, dtype=np.int32), np.arange(1, m + 1, dtype=np.int32))
           for n, m in [(3, 5), (4, 2), (6, 6), (2, 7)]]
  ds = grain.MapDataset.source([{"inputs": a, "targets": b} for a, b in pairs])
  packed = list(grain.experimental.FirstFitPackIterDataset(
      ds.to_iter_dataset(), length_struct={"inputs": 8, "targets": 8}, num_packing_bins=2,
      shuffle_bins=False))
  row = packed[0]
  assert row["inputs_segment_ids"].tolist() == [1, 1, 1, 2, 2, 2, 2, 0]
  assert row["targets_segment_ids"].tolist() == [1, 1, 1, 1, 1, 2, 2, 0]
  assert row["inputs_positions"].tolist() == [0, 1, 2, 0, 1, 2, 3, 0]
  ours, _ = pipeline.pack_rows([(list(a), list(b)) for a, b in pairs[:2]], 8, 8)
  # Longest pair (by source + target) first: (3, 5) before (4, 2).
  assert ours["inputs_segmentation"][0].tolist() == [1, 1, 1, 2, 2, 2, 2, 0]
  assert ours["targets_positions"][0].tolist() == [0, 1, 2, 3, 4, 0, 1, 0]


@pytest.mark.parametrize("mode", ["pack", "pad", "bucket"])
def test_an_epoch_of_batches_holds_every_pair_once(base, mode):
  # Nothing skipped or repeated between the chunks of one epoch and the batches made of them.
  data = data_with(base, batching=mode)
  read = pipeline.ReadChunk(data.sources["train"], data.tokenizer, data.config, 0, 1)
  epoch = sorted(str(p) for k in range(read.chunks_per_epoch) for p in read(k))
  seen, it = [], iter(data.train_dataset())
  while len(seen) < len(epoch):
    batch = next(it)
    for row in range(len(batch["inputs"])):
      source, target = segments(batch, row, "inputs"), segments(batch, row, "targets")
      assert source.keys() == target.keys()
      seen += [str((source[s], target[s])) for s in source]
  assert sorted(seen) == epoch


def test_pack_rows_is_first_fit_decreasing():
  # Rows of 10 + 10 tokens; pairs of (source, target) lengths 4+4, 6+6, 5+5, 4+4. Longest first,
  # each into the first row where both sides fit: 6+6 opens row 0, 5+5 opens row 1 (row 0 has
  # 4 left), the first 4+4 fills row 0, the second goes to row 1. Two rows; increasing order
  # would need three, and "the last row that fits" would put the first 4+4 into row 1.
  pairs = [([i + 10] * n, [i + 20] * n) for i, n in enumerate([4, 6, 5, 4])]
  rows, num_rows = pipeline.pack_rows(pairs, 10, 10)
  assert num_rows == 2 and rows["inputs"].shape == (4, 10)
  assert rows["inputs"][0].tolist() == [11] * 6 + [10] * 4
  assert rows["inputs"][1].tolist() == [12] * 5 + [13] * 4 + [0]
  assert rows["targets"][1].tolist() == [22] * 5 + [23] * 4 + [0]
  assert rows["targets_segmentation"][1].tolist() == [1] * 5 + [2] * 4 + [0]
  assert rows["inputs_positions"][0].tolist() == list(range(6)) + list(range(4))
  assert not rows["inputs"][2:].any()  # the rows not used stay padding
  # "Longest" is source + target: (8, 1) goes before (2, 5), though its target is shorter.
  rows, num_rows = pipeline.pack_rows([([5] * 2, [6] * 5), ([7] * 8, [8] * 1)], 10, 10)
  assert num_rows == 1 and rows["inputs"][0].tolist() == [7] * 8 + [5] * 2


def test_bucket_lengths_and_rows():
  # Boundaries at or past the longest length are cut; the longest length is always a bucket.
  assert data_config.bucket_lengths((8, 16, 24, 32, 40), 32) == [8, 16, 24, 32]
  assert data_config.bucket_lengths((16, 8), 20) == [8, 16, 20]
  # 512 tokens: 64 rows of 8, 32 of 16, 21 of 24 rounded down to a multiple of 4 = 20, and at
  # least the multiple when a bucket's length alone exceeds the budget.
  assert data_config.bucket_rows([8, 16, 24, 1024], 512, 4) == [64, 32, 20, 4]


def test_eval_lengths_round_up_to_eight_and_never_truncate(base):
  _, data = base
  tok = data.tokenizer
  pairs = [("one two", "eins zwei"), ("x " * 9, "y " * 17)]
  batches = list(pipeline.eval_batches(pairs, tok, batch_size=3))
  assert len(batches) == 1 and batches[0]["num_real"] == 2
  longest = max(len(tok.encode(t)) + 1 for t, _ in pairs)
  assert batches[0]["inputs"].shape == (3, -(-longest // 8) * 8)
  assert batches[0]["inputs_segmentation"][1].sum() == len(tok.encode(pairs[1][0])) + 1
  # min_len pads further, never shorter than the longest sentence.
  padded = next(pipeline.eval_batches(pairs, tok, batch_size=3, min_len=40))
  assert padded["targets"].shape == (3, 40)
  # The raw texts travel with their batch (sacreBLEU scores against them).
  three = list(pipeline.eval_batches(pairs * 2, tok, batch_size=3))
  assert [b["source_text"] for b in three] == [[s for s, _ in pairs * 2][:3],
                                                [s for s, _ in pairs * 2][3:]]
  assert [b["target_text"] for b in three] == [[t for _, t in pairs * 2][:3],
                                                [t for _, t in pairs * 2][3:]]
  assert [b["num_real"] for b in three] == [3, 1]


def test_eval_rows_fit_a_learned_position_table_when_given_its_size(base):
  # A learned position table of max_len rows takes no longer row: longer sentences keep their
  # first max_len - 1 pieces and eos, and rounding up to 8 never passes max_len.
  _, data = base
  tok = data.tokenizer
  pairs = [("one two", "eins zwei"), ("x " * 3, "y " * 25)]
  long_source = len(tok.encode(pairs[1][0])) + 1
  long_target = len(tok.encode(pairs[1][1])) + 1
  max_len = long_target - 1 if (long_target - 1) % 8 else long_target - 2
  assert long_source <= max_len < long_target and max_len % 8  # the source fits, not the target
  source_ids, target_ids, cut = pipeline.eval_ids(pairs, tok, max_len)
  assert cut == 1 and target_ids[1] == tok.encode(pairs[1][1])[:max_len - 1] + [pipeline.EOS_ID]
  # A side of exactly max_len fits: not cut, not counted, as a source or as a target.
  for side in (0, 1):
    flipped = [(t, s) for s, t in pairs] if side == 0 else pairs
    ids = pipeline.eval_ids(flipped, tok, long_target)
    assert ids[2] == 0 and ids[side][1] == tok.encode(pairs[1][1]) + [pipeline.EOS_ID]
  assert source_ids[1] == tok.encode(pairs[1][0]) + [pipeline.EOS_ID]  # fits: unchanged
  batch = next(pipeline.eval_batches(pairs, tok, batch_size=2, max_len=max_len))
  assert batch["targets"].shape == (2, max_len)
  assert batch["inputs"].shape == (2, min(max_len, -(-long_source // 8) * 8))
  assert batch["targets"][1].tolist() == target_ids[1]
  assert batch["target_text"] == [t for _, t in pairs]  # the references stay whole
  # Without max_len nothing is cut (test_eval_lengths_round_up_to_eight_and_never_truncate).
  assert pipeline.eval_ids(pairs, tok)[2] == 0


def test_bucket_budget_is_batch_tokens_split_over_processes_else_rows_times_length(base):
  _, data = base
  c = data_with(base, batching="bucket", bucket_boundaries=(8, 16), bucket_rows_multiple=1,
                batch_tokens=1024).config
  # 1,024 tokens, whatever the rows: 128 rows of 8, 64 of 16, 32 of 32.
  assert pipeline.Batcher(c, rows=16, process_count=1).rows == [128, 64, 32]
  # Each of 2 processes gets half the budget; rows are whole numbers (they shape arrays), also
  # of a budget that does not halve evenly.
  assert pipeline.Batcher(c, rows=16, process_count=2).rows == [64, 32, 16]
  c.batch_tokens = 1025
  rows = pipeline.Batcher(c, rows=16, process_count=2).rows
  assert rows == [64, 32, 16] and all(type(r) is int for r in rows), rows
  c.batch_tokens = 1024
  # But several processes would bucket their own shards into batches of different shapes at
  # the same step (a collective mismatch): refused.
  tmp, _ = base
  with pytest.raises(pipeline.DataError, match="data.batching='bucket' with 2 processes"):
    get_data(small_config(tmp, batching="bucket"), str(tmp / "work"), process_index=0,
             process_count=2)
  # No token budget: rows x the longest length (16 x 32 = 512 tokens) per batch.
  c.batch_tokens = 0
  assert pipeline.Batcher(c, rows=16, process_count=1).rows == [64, 32, 16]
  # A budget of 1 token is a budget: the fewest rows allowed (the multiple), not rows x length.
  c.batch_tokens = 1
  assert pipeline.Batcher(c, rows=16, process_count=1).rows == [1, 1, 1]
  # The shapes of a global batch (one process), as compare_precision.py checks saved batches:
  # one per bucket, of its length on both sides; rows x each side's length otherwise.
  c.batch_tokens = 1024
  assert data_config.train_batch_shapes(c) == [{"inputs": (r, n), "targets": (r, n)}
                                         for r, n in ((128, 8), (64, 16), (32, 32))]
  c.batching, c.max_target_len = "pack", 16
  assert data_config.train_batch_shapes(c) == [{"inputs": (32, 32), "targets": (32, 16)}]


def test_train_dataset_defaults_to_one_process_and_refuses_a_process_without_data(base):
  _, data = base
  c = data.config
  source, tok = data.sources["train"], data.tokenizer
  whole = next(iter(pipeline.train_dataset(source, tok, c, rows=16)))
  one = next(iter(pipeline.train_dataset(source, tok, c, rows=16, process_index=0,
                                         process_count=1)))
  for key in KEYS:
    np.testing.assert_array_equal(whole[key], one[key])
  # More processes than examples: the last one's slice is empty, which is said, not trained on.
  with pytest.raises(ValueError, match="process 3 of 4 has no training data"):
    pipeline.ReadChunk([None] * 3, tok, c, 3, 4)  # 3 examples (only their count is read here)


def test_dropped_pairs_are_said_once_and_a_chunk_that_keeps_less_than_half_once_more(
    base, caplog):
  """A run's log says that training skips pairs too long for the rows (the first chunk that
  drops any: count, share, the fields to raise), and again when a chunk drops most of its."""
  _, data = base
  def pairs(n):  # n one-piece sentences (only the lengths and counts are read here)
    return [[1]] * n
  limits = ("data.max_source_len=32 / data.max_target_len=32 (pieces, EOS included)")
  read = pipeline.ReadChunk([None] * 3000, data.tokenizer, data.config, 0, 1)  # counts only
  with caplog.at_level("WARNING"):
    read._check_kept(0, 0, 10, pairs(10), pairs(10))  # none dropped
    read._check_kept(0, 1, 0, [], [])                 # an empty chunk: nothing to say
    assert not caplog.records
    read._check_kept(0, 2, 5, pairs(8), pairs(8))    # 3 of 8 dropped: dropping is said
    read._check_kept(0, 3, 9, pairs(10), pairs(10))  # again: said once is enough
    read._check_kept(0, 4, 5, pairs(11), pairs(11))  # less than half kept
    read._check_kept(1, 0, 0, pairs(9), pairs(9))    # again: said once is enough
  assert [r.getMessage() for r in caplog.records] == [
      f"training data: a chunk dropped 3 of 8 pairs (37.5%), longer than {limits}: training "
      "skips such pairs (said once); raise the limits to train on them",
      f"training data: a chunk kept 5 of 11 pairs; the rest are longer than {limits}"]
  # A first drop of most of a chunk is said once, not twice.
  caplog.clear()
  read = pipeline.ReadChunk([None] * 3000, data.tokenizer, data.config, 0, 1)
  with caplog.at_level("WARNING"):
    read._check_kept(0, 0, 1, pairs(3), pairs(3))
    read._check_kept(0, 1, 9, pairs(10), pairs(10))
  assert [r.getMessage()[:35] for r in caplog.records] == ["training data: a chunk kept 1 of 3 "]


def test_empty_chunks_are_counted_per_epoch_and_forgotten_two_epochs_on(base):
  _, data = base
  read = pipeline.ReadChunk([None] * 3000, data.tokenizer, data.config, 0, 1)
  assert read.chunks_per_epoch == 3
  for epoch in range(4):  # one empty chunk an epoch: never a whole epoch
    read._check_kept(epoch, 1, 0, [[1]], [[1]])
    # The epoch before stays (reader threads may still finish it), older ones go.
    assert sorted(read._empty_chunks) == list(range(max(epoch - 1, 0), epoch + 1))
  read._check_kept(3, 0, 7, [[1]] * 7, [[1]] * 7)  # a chunk that kept pairs clears its epoch
  assert sorted(read._empty_chunks) == [2]
  read._check_kept(2, 0, 0, [[1]], [[1]])
  with pytest.raises(pipeline.DataError, match="all 3000 pairs of this process"):
    read._check_kept(2, 2, 0, [[1]], [[1]])
  # The lengths named are one pair's, the nearest to fitting (not the shortest source of one
  # pair and the shortest target of another, which could both fit).
  read = pipeline.ReadChunk([None] * 1000, data.tokenizer,
                            data_with(base, max_source_len=5, max_target_len=5).config, 0, 1)
  with pytest.raises(pipeline.DataError, match="nearest to fitting has 12 source / 9 target"):
    read._check_kept(0, 0, 0, [[1] * 8, [1] * 12], [[1] * 14, [1] * 9])


def test_limits_no_pair_fits_are_an_error_not_an_endless_read(base, caplog):
  # Every pair of the numbers task has more than 3 pieces a side: the batcher would read window
  # after empty window forever (and the run could not be stopped). A whole epoch of empty
  # chunks is an error naming the fields.
  data = data_with(base, max_source_len=3, max_target_len=3)
  tok, train = data.tokenizer, data.raw_examples("train")
  lengths = [(len(tok.encode(s)) + 1, len(tok.encode(t)) + 1) for s, t in train]
  _, source_len, target_len = min((max(s - 3, t - 3), s, t) for s, t in lengths)
  assert source_len != target_len  # so that swapping the two would show
  message = (r"no training pair fits data.max_source_len=3 / data.max_target_len=3 .*all 3000 "
             rf"pairs .*the nearest to fitting has {source_len} source / {target_len} target "
             "pieces")
  read = pipeline.ReadChunk(data.sources["train"], data.tokenizer, data.config, 0, 1)
  for k in range(read.chunks_per_epoch - 1):
    assert read(k) == []
  with pytest.raises(pipeline.DataError, match=message):
    read(read.chunks_per_epoch - 1)
  # Through grain's reader threads to the caller of next(), in a thread of its own so that a
  # regression fails here instead of hanging the suite.
  raised = []
  def first_batch():
    try:
      next(iter(data.train_dataset()))
    except pipeline.DataError as e:
      raised.append(str(e))
  reader = threading.Thread(target=first_batch, daemon=True)
  reader.start()
  reader.join(timeout=120)
  assert len(raised) == 1 and re.match(message, raised[0]), raised
  # Some pairs fitting is no error, but dropping most of a chunk is worth a warning.
  read = pipeline.ReadChunk(data.sources["train"], data.tokenizer,
                            data_with(base, max_source_len=12, max_target_len=12).config, 0, 1)
  with caplog.at_level("WARNING"):
    kept = [len(read(k)) for k in range(read.chunks_per_epoch)]
  assert 0 < sum(kept) < read.chunks_per_epoch * pipeline.CHUNK / 2
  assert [r.message for r in caplog.records].count(
      f"training data: a chunk kept {kept[0]} of {pipeline.CHUNK} pairs; the rest are longer "
      "than data.max_source_len=12 / data.max_target_len=12 (pieces, EOS included)") == 1
  # The next epoch's chunks still come (the error needs a whole epoch without a pair).
  assert read(read.chunks_per_epoch)


def test_a_local_corpus_builds_and_loads_without_tfds_download_notices(tmp_path, capsys, caplog):
  """TFDS's "Using custom data configuration" WARNING and its "Downloading and preparing dataset
  Unknown size" read like failures for a corpus built from local files; they are not shown, and
  other warnings still are."""
  c = small_config(tmp_path, numbers_train_size=200, numbers_eval_size=20)
  with caplog.at_level(logging.INFO, logger="absl"):
    for _ in range(2):  # the build, then a load of what it built
      sources = datasets.load_sources(c)
    logging.getLogger("absl").warning("a real warning")
  out, err = capsys.readouterr()
  shown = out + err + caplog.text
  for notice in ("custom data configuration", "Downloading and preparing", "Unknown size",
                 "downloaded and prepared"):
    assert notice not in shown, notice
  assert err.count("built dataset numbers_translate/en-de-") == 1
  assert "a real warning" in caplog.text and len(sources["train"]) == 200
  # No progress bars where stderr is not a terminal (a log file): they are cursor escapes and
  # "Shuffling .../incomplete..." lines. TFDS's own switch is left as it was.
  for bar in ("Generating", "Shuffling", "\x1b[A", "examples/s"):
    assert bar not in err, bar
  from tensorflow_datasets.core.utils import tqdm_utils
  assert tqdm_utils._active


def test_data_defaults_to_one_process_and_checks_its_index_first(base, tmp_path):
  """Found by mutation testing: `Data`'s defaults and its index check were never reached (every
  test passed both). The check comes before any read, so a bad index costs nothing."""
  from transformer_jax.data import Data
  tmp, data = base
  one = Data(data.config, str(tmp / "work"))
  assert (one.process_index, one.process_count, one.rows_per_process) == (0, 1, 16)
  for index, count in ((-1, 2), (2, 2), (0, 0)):
    with pytest.raises(ValueError, match=re.escape(f"process_index={index} not in [0, {count})")):
      Data(data.config, str(tmp_path / "never"), process_index=index, process_count=count)
  assert not (tmp_path / "never").exists()


def test_the_tokenizers_sample_is_seeded_and_stops_at_the_first_chunk_past_the_budget():
  """`Data._vocab_texts`: sources and targets of the training pairs in a seeded order, read
  1,024 pairs at a time until the characters read reach data.vocab_max_chars."""
  from transformer_jax.data import Data
  class Source(list):  # a data source's batched read
    def __getitems__(self, keys):
      return [self[k] for k in keys]
  c = default_data_config()
  pairs = Source({c.source_lang: f"s{i}".encode(), c.target_lang: f"t{i} x"} for i in range(2500))
  data = Data.__new__(Data)  # only the fields the sampler reads
  data.config, data.sources = c, {"train": pairs}
  order = np.random.default_rng(c.shuffle_seed).permutation(len(pairs))
  expected = [t for i in order for t in (f"s{i}", f"t{i} x")]
  c.vocab_max_chars = 10**9  # every pair, in the seeded order
  assert data._vocab_texts() == expected
  first = sum(len(t) for t in expected[:2048])  # the first chunk's characters, exactly
  for budget, pairs_read in ((first, 1024), (first + 1, 2048), (1, 1024)):
    c.vocab_max_chars = budget
    assert data._vocab_texts() == expected[:2 * pairs_read], budget
