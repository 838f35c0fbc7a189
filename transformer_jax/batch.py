"""The batch schema: what a training or evaluation batch holds, defined once.

A batch is a dict of int32 `[rows, length]` arrays whose keys are the keyword arguments of
`Transformer.__call__`, so `model.apply(params, **batch)` needs no translation:

    inputs, targets             token ids; padding is `pad_id`
    inputs_segmentation,        packed rows: which sentence pair a token belongs to (1, 2, ...
    targets_segmentation          in a row; 0 = padding). A pair's source and target share an id.
    inputs_positions,           packed rows: positions that restart at 0 in every segment
    targets_positions

`inputs` and `targets` are required; the other four come together or not at all (unpacked rows
need none). The data pipeline writes these keys, the training loop and the steps read them, and
the benchmarks build them.
"""
from __future__ import annotations

from typing import Mapping

REQUIRED = ("inputs", "targets")
PACKING = ("inputs_segmentation", "targets_segmentation", "inputs_positions", "targets_positions")
KEYS = REQUIRED + PACKING


def side_keys(side: str) -> tuple[str, str, str]:
  """(tokens, segment ids, positions) keys of one side, "inputs" or "targets"."""
  if side not in REQUIRED:
    raise KeyError(f"a batch's sides are {REQUIRED}, not {side!r}")
  keys = (side, f"{side}_segmentation", f"{side}_positions")
  assert all(k in KEYS for k in keys)
  return keys


def packs(batching: str) -> bool:
  """Whether a `data.batching` mode's rows go to the model with their packing keys: only
  "pack" puts several pairs in a row; "pad" and "bucket" rows hold one pair each."""
  return batching == "pack"


def model_arrays(batch: Mapping, packed: bool = True) -> dict:
  """The batch's arrays that the model and the steps take (drops text, counts and the like).

  `packed=False` for rows that hold one right-padded pair each (the `pad` and `bucket` batchings,
  evaluation batches): their packing keys say nothing the padding does not, and without them the
  model knows the rows are unpacked, so cuDNN attention takes the padding as sequence lengths
  (`model.padding_as_lengths`) instead of a dense mask. The same function either way."""
  missing = [k for k in REQUIRED if k not in batch]
  if missing:
    raise KeyError(f"a batch needs {REQUIRED}; missing {missing} (has {sorted(batch)})")
  return {k: batch[k] for k in (KEYS if packed else REQUIRED) if k in batch}


def packing(batch: Mapping) -> dict:
  """The segment ids and positions of a packed batch (empty for unpacked rows)."""
  return {k: batch[k] for k in PACKING if k in batch}
