"""Data for training and evaluation: `get_data(config.data, workdir)` is the entry point.

    data = get_data(config.data, workdir, process_index=jax.process_index(),
                    process_count=jax.process_count())
    it = iter(data.train_dataset())       # endless; it.get_state() goes into the checkpoint
    batch = next(it)                      # dict of int32 [rows_per_process, max_len] arrays
    for batch in data.eval_batches("validation"): ...
    data.tokenizer.detokenize(ids)

Modules: config (settings), numbers (the built-in task's grammar), locale (gettext corpus),
builders / datasets (TFDS), tokenizer (SentencePiece), pipeline (grain). This package imports
tensorflow_datasets and grain; the model and training code must not need them otherwise.
"""
from __future__ import annotations

import json
import os
from typing import Iterator

import numpy as np

# datasets (tensorflow-datasets) and pipeline (grain) are imported where they are used, so that
# importing `transformer_jax.data.config` (experiment.base_config does) does not load them.
from transformer_jax.data import tokenizer as tokenizer_lib
from transformer_jax.data.config import DataError, default_data_config, global_rows, validate
from transformer_jax.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer

__all__ = ["Data", "DataError", "get_data", "default_data_config", "validate", "Tokenizer",
           "PAD_ID", "UNK_ID", "BOS_ID", "EOS_ID"]


class Data:
  """The datasets, tokenizer and batch streams of one run (see `get_data`)."""

  def __init__(self, data_config, workdir: str, *, process_index: int = 0,
               process_count: int = 1):
    validate(data_config)
    if not 0 <= process_index < process_count:
      raise ValueError(f"process_index={process_index} not in [0, {process_count})")
    if data_config.batching == "bucket" and process_count > 1:
      # Each process buckets its own shard, so at a given step the processes would hold
      # batches of different lengths: different programs, collectives that do not match.
      raise DataError(f"data.batching='bucket' with {process_count} processes: each would "
                      "step batches of its own shapes; use 'pack' (the default) or 'pad'")
    self.config = data_config
    self.process_index, self.process_count = process_index, process_count
    self.global_rows = global_rows(data_config)
    if self.global_rows % process_count:
      raise DataError(f"{self.global_rows} rows per global batch (data.batch_size or "
                      f"data.batch_tokens) do not split over {process_count} processes")
    self.rows_per_process = self.global_rows // process_count
    from transformer_jax.data import datasets
    self.sources = datasets.load_sources(data_config)
    self._raw: dict[str, list[tuple[str, str]]] = {}
    path = self.tokenizer_path = data_config.vocab_path or os.path.join(workdir, "spm.model")
    self.tokenizer = tokenizer_lib.load_or_train(
        path, self._vocab_texts, trained_from=self._trained_from,
        vocab_size=data_config.vocab_size,
        model_type=data_config.vocab_model_type, max_chars=data_config.vocab_max_chars,
        split_digits=data_config.vocab_split_digits,
        byte_fallback=data_config.vocab_byte_fallback, seed=data_config.shuffle_seed)

  def vocab_settings_not_followed(self) -> str | None:
    """What to warn of where this run's tokenizer was not trained with its config's
    `data.vocab_*` settings (`vocab_settings_not_followed` below)."""
    return vocab_settings_not_followed(self.config, self.tokenizer_path,
                                       self.tokenizer.vocab_size)

  def _trained_from(self) -> dict:
    """spm.model.json: the data config and what its corpus files held (`fingerprint.record`),
    so a later command on other bytes under the same paths is told (`run.workdir`)."""
    from transformer_jax.data import fingerprint
    return {**self.config.to_dict(), "resolved_data": fingerprint.record(self.config)}

  def _vocab_texts(self) -> list[str]:
    """A seeded sample of training sources and targets within the character budget."""
    from transformer_jax.data import datasets
    c, source = self.config, self.sources["train"]
    order = np.random.default_rng(c.shuffle_seed).permutation(len(source))
    texts, chars = [], 0
    for start in range(0, len(order), 1024):
      for example in datasets.get_items(source, order[start:start + 1024].tolist()):
        for lang in (c.source_lang, c.target_lang):
          texts.append(datasets.as_text(example[lang]))
          chars += len(texts[-1])
      if chars >= c.vocab_max_chars:
        break
    return texts

  def train_dataset(self):
    """The endless, resumable grain IterDataset of this process's training batches."""
    from transformer_jax.data import pipeline
    return pipeline.train_dataset(self.sources["train"], self.tokenizer, self.config,
                                  rows=self.rows_per_process,
                                  process_index=self.process_index,
                                  process_count=self.process_count)

  def resharded_state(self, states: list[dict]) -> dict:
    """This process's train iterator state from those saved by a run with another number
    of processes (`states[i]` is old process i's): see `pipeline.resharded_state`."""
    from transformer_jax.data import pipeline
    return pipeline.resharded_state(states, len(self.sources["train"]), self.process_index,
                                    self.process_count)

  def raw_examples(self, split: str) -> list[tuple[str, str]]:
    """All (source, target) strings of a split, in the stored order."""
    if split not in self._raw:
      self._raw[split] = read_pairs(self.sources[split], self.config)
    return self._raw[split]

  def eval_batches(self, split: str, max_len: int | None = None):
    """Every pair of `split` ("validation" or "test") in padded batches; identical on all
    processes (global batches of data.eval_batch_size rows; shard them in the loop).
    `max_len`: a learned position table's size, which rows are cut to (`pipeline.eval_ids`)."""
    if split not in ("validation", "test"):
      raise ValueError(f"eval_batches({split!r}): expected 'validation' or 'test'")
    from transformer_jax.data import pipeline
    return pipeline.eval_batches(self.raw_examples(split), self.tokenizer,
                                 batch_size=self.config.eval_batch_size,
                                 min_len=self.config.eval_max_len, max_len=max_len)


# The data fields that only a tokenizer the run trains follows (`tokenizer.train_tokenizer`).
VOCAB_FIELDS = ("vocab_size", "vocab_model_type", "vocab_split_digits", "vocab_byte_fallback",
                "vocab_max_chars")


def vocab_settings(path: str) -> dict:
  """The `data.vocab_*` settings the SentencePiece model at `path` was trained with: those the
  model file's trainer spec carries (any SentencePiece model), and all of them where the data
  config a run records beside the model it trains (`<path>.json`) is there. The file alone has
  no vocab_size to compare: SentencePiece keeps the pieces it got, at most the size asked for."""
  from sentencepiece import sentencepiece_model_pb2  # protobuf: only where a model is read
  model = sentencepiece_model_pb2.ModelProto()
  with open(path, "rb") as f:
    model.ParseFromString(f.read())
  spec = model.trainer_spec
  settings = {"vocab_model_type": sentencepiece_model_pb2.TrainerSpec.ModelType.Name(
                  spec.model_type).lower(),
              "vocab_split_digits": spec.split_digits, "vocab_byte_fallback": spec.byte_fallback}
  record = _record_beside(path)
  settings.update({k: record[k] for k in VOCAB_FIELDS if k in record})
  return settings


def _record_beside(path: str) -> dict:
  """The data config recorded beside the model at `path` (`<path>.json`); {} where there is
  none or it does not read as one (a copy cut short, another program's file): the model's own
  trainer spec is compared then, and a run given the file trains as before it was read."""
  try:
    with open(path + ".json", "rb") as f:
      record = json.loads(f.read())
  except (OSError, ValueError):
    return {}
  return record if isinstance(record, dict) else {}


def vocab_settings_not_followed(data_config, path: str, pieces: int) -> str | None:
  """What to warn of where the tokenizer at `path` (of `pieces` pieces) was trained with other
  `data.vocab_*` settings than `data_config`'s (None: it was not): a run given an existing file
  (data.vocab_path, or init_from's copy) uses it as it is, while its config.json records values
  that describe no tokenizer of the run."""
  trained = vocab_settings(path)
  differ = [f"{k}={data_config[k]!r} (the tokenizer's: {v!r})" for k, v in trained.items()
            if data_config[k] != v]
  if "vocab_size" not in trained and pieces > data_config.vocab_size:
    differ.append(f"vocab_size={data_config.vocab_size!r} (the tokenizer has {pieces} pieces)")
  if not differ:
    return None
  return (f"{path} was trained with other settings than this config's data.vocab_* fields, "
          "which config.json records but only a tokenizer the run trains itself follows: "
          + ", ".join(differ))


def iter_pairs(source, data_config, chunk: int = 10_000) -> Iterator[tuple[str, str]]:
  """Every (source, target) string pair of one split's data source, in the stored order, read
  `chunk` records at a time (a whole WMT training split at once would hold gigabytes)."""
  from transformer_jax.data import datasets
  for start in range(0, len(source), chunk):
    examples = datasets.get_items(source, list(range(start, min(start + chunk, len(source)))))
    yield from ((datasets.as_text(e[data_config.source_lang]),
                 datasets.as_text(e[data_config.target_lang])) for e in examples)


def read_pairs(source, data_config) -> list[tuple[str, str]]:
  """`iter_pairs` as a list."""
  return list(iter_pairs(source, data_config))


def raw_split(data_config, split: str) -> list[tuple[str, str]]:
  """The pairs of one split without a tokenizer (building the dataset if needed)."""
  from transformer_jax.data import datasets
  validate(data_config)
  return read_pairs(datasets.load_sources(data_config)[split], data_config)


def get_data(data_config, workdir: str, *, process_index: int = 0, process_count: int = 1) -> Data:
  """Builds (once) the dataset, loads or trains the tokenizer in `workdir`, returns `Data`."""
  return Data(data_config, workdir, process_index=process_index, process_count=process_count)
