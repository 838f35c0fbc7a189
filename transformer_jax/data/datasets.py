"""From a data config to one random-access TFDS data source per split.

The local corpora are built by `builders.py`; WMT uses the stock TFDS builders unchanged
(`wmt14_translate/de-en`, the paper's data, and `wmt17_translate/de-en`, the Flax example's),
which download once when the machine has internet and are read offline afterwards. Tests run
WMT offline under `tfds.testing.mock_data`.
"""
from __future__ import annotations

import os

import tensorflow_datasets as tfds

from transformer_jax.data import builders

SPLITS = builders.SPLITS
WMT_NAMES = {"wmt14": "wmt14_translate/de-en", "wmt17": "wmt17_translate/de-en"}


def default_data_dir(data_config) -> str:
  return os.path.expanduser(data_config.data_dir or os.environ.get("TFDS_DATA_DIR")
                            or "~/tensorflow_datasets")


def make_builder(data_config):
  data_dir = default_data_dir(data_config)
  if data_config.dataset in WMT_NAMES:
    # Importing the package registers its builders with TFDS, wmt14's and wmt17's among them
    # (importing either module imports the package: one branch per year registered both).
    import tensorflow_datasets.translate  # noqa: F401 - registers the builders
    return tfds.builder(WMT_NAMES[data_config.dataset], data_dir=data_dir,
                        file_format="array_record")
  return builders.make_builder(data_config, data_dir)


def load_sources(data_config) -> dict:
  """{split: data source} for train/validation/test, building the dataset first if needed.

  Each source supports `len()`, `source[i]` and `source.__getitems__(indices)` and returns
  `{lang: text}` with text as bytes (or str under `mock_data`).
  """
  builder = make_builder(data_config)
  builders.prepare(builder)
  if not builder.info.splits:
    # Made before another process (a sweep's other point, a run's other host) finished building
    # the dataset while this one waited for the lock: TFDS read its info then, with no splits,
    # and `download_and_prepare` only says it reuses the files. A builder made now reads them.
    builder = make_builder(data_config)
  return {split: builder.as_data_source(split=split) for split in SPLITS}


def as_text(value) -> str:
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def get_items(source, keys: list[int]) -> list:
  """Records at `keys` in one batched read where the source supports it.

  `tfds.testing.mock_data`'s patched sources break on `__getitems__` (a TypeError inside
  TFDS): fall back to reading one record at a time there.
  """
  try:
    return list(source.__getitems__(keys))
  except TypeError:
    return [source[k] for k in keys]
