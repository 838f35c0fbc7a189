"""TFDS builders for the offline corpora: the built-in numbers task, gettext catalogs, user text.

All three are `tfds.core.GeneratorBasedBuilder`s that write array_record files, read back with
`builder.as_data_source(split)` (random access, no TensorFlow). Their examples have the same
format as the WMT builders (`{lang: text}`), so one pipeline reads them all.

Each builder's parameters are a `BuilderConfig` whose name carries a hash of everything that
changes the data (sizes and seed, the catalog files and their sizes, the text files and their
modification times), so a changed input gets a new directory instead of a stale cache.

Building is quick (seconds) and safe for concurrent processes: `prepare` holds a file lock, and
TFDS itself writes into an `incomplete.*` directory that it renames when done.
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import logging
import os
import sys

import tensorflow_datasets as tfds

from transformer_jax.data import leakage, locale, numbers
from transformer_jax.data.config import LOCALE_SAME_SPLITS, DataError, check_languages
from transformer_jax.data.lines import read_lines
from transformer_jax.data.tokenizer import normalize_spaces
from transformer_jax.files import file_lock

SPLITS = ("train", "validation", "test")


def split_pairs(pairs, held_out_per_mille: int,
                mode: str = "grouped_v2") -> dict[str, list[tuple[str, str]]]:
  """validation / test / train by a hash of each pair's near-duplicate group
  (`leakage.group_keys`; mode "grouped_v2"): a group never straddles two splits, so no held-out
  pair shares a normalized source or target with a training pair. Mode "grouped" groups as runs
  made 2026-11-23 to 2026-12-07 did (a side of punctuation alone joined one common group); mode
  "source" hashes the exact source (the split of runs made before the grouping)."""
  out = {split: [] for split in SPLITS}
  for pair, key in zip(pairs, split_keys(pairs, mode)):
    out[numbers.split_of(key, held_out_per_mille)].append(pair)
  return out


def split_keys(pairs, mode: str) -> list[str]:
  """What `split_pairs` hashes for each pair: its near-duplicate group's key, or its source."""
  if mode == "source":
    return [s for s, _ in pairs]
  if mode in ("grouped", "grouped_v2"):
    return leakage.group_keys(pairs, empty_links_all=mode == "grouped")
  raise ValueError(f"split mode {mode!r}: not one of grouped_v2, grouped, source")


def _digest(obj) -> str:
  return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:10]


def _file_signature(path: str) -> list:
  stat = os.stat(path)
  return [os.path.abspath(path), stat.st_size, stat.st_mtime_ns]


@dataclasses.dataclass
class PairsConfig(tfds.core.BuilderConfig):
  """The parameters of one corpus; `name` must be unique per parameter set (see `make`)."""
  source_lang: str = "en"
  target_lang: str = "de"
  params: dict = dataclasses.field(default_factory=dict)


class _PairsBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """A builder whose subclass returns {split: [(source, target)]} from `_pairs`."""

  VERSION = tfds.core.Version("1.0.0")
  DESCRIPTION = ""

  def _pairs(self) -> dict[str, list[tuple[str, str]]]:
    raise NotImplementedError

  def _info(self):
    config = self.builder_config
    return tfds.core.DatasetInfo(
        builder=self, description=self.DESCRIPTION,
        features=tfds.features.Translation(languages=(config.source_lang, config.target_lang)),
        supervised_keys=(config.source_lang, config.target_lang),
        metadata=tfds.core.MetadataDict(params=config.params))

  def _inputs(self) -> str:
    """What the pairs come from, for error messages."""
    return self.name

  def _split_generators(self, dl_manager):
    del dl_manager  # Everything is on the machine already.
    pairs = self._pairs()
    empty = [split for split in SPLITS if not pairs[split]]
    if not any(pairs.values()):
      raise DataError(f"{self._inputs()} holds no pairs (no line with a source and a target "
                      "that are both non-blank): check that it is the file you meant")
    if empty:
      raise DataError(self._empty_splits_message(pairs, empty))
    return {split: self._generate_examples(pairs[split]) for split in SPLITS}

  def _empty_splits_message(self, pairs: dict, empty: list[str]) -> str:
    counts = ", ".join(f"{split} {len(pairs[split])}" for split in SPLITS)
    mode = self.builder_config.params["split"]
    every = [pair for split in SPLITS for pair in pairs[split]]
    units = ("distinct sources" if mode == "source" else
             "near-duplicate groups (pairs sharing a normalized source or target)")
    sizes = collections.Counter(split_keys(every, mode))
    largest = max(sizes.values())  # 1 for distinct sources: clean_pairs keeps one pair each
    why = (f"; the largest holds {largest:,} of the {len(every):,} pairs (a target or source "
           "repeated across the corpus joins its pairs into one)" if largest > 1 else "")
    advice = ("Use a larger corpus or raise data.held_out_per_mille" + (
        "; where one group holds most pairs neither helps (a group never spans two splits): "
        "keep fewer pairs of the repeated side, or split by the exact source "
        "(--config.data.split=source, which lets near-duplicates cross splits)"
        if largest > len(every) // 2 else ""))
    return (f"{self._inputs()}: split(s) {empty} would be empty (pairs: {counts}). Validation "
            f"and test each take the pairs of a hash-chosen data.held_out_per_mille share of "
            f"the corpus's {units} (data.split={mode!r}): it has {len(sizes):,}{why}. "
            f"{advice}.")

  def _generate_examples(self, pairs):
    config = self.builder_config
    for i, (source, target) in enumerate(pairs):
      yield i, {config.source_lang: source, config.target_lang: target}

  # TFDS's notices around a build are a download's ("Downloading and preparing dataset Unknown
  # size ...", then "... downloaded and prepared to ..."): for a corpus made from local files in
  # seconds they read like a failure. One line when the build is done says what happened.
  def _log_download_bytes(self) -> None:
    pass

  def _log_download_done(self) -> None:
    print(f"built dataset {self.name}/{self.builder_config.name} in {self.data_dir} (later "
          "runs reuse it)", file=sys.stderr, flush=True)


class NumbersTranslate(_PairsBuilder):
  """The built-in English-German task of `numbers.py`."""
  name = "numbers_translate"
  DESCRIPTION = "Synthetic English-German sentences with numbers, dates and times."

  def _pairs(self):
    p = self.builder_config.params
    pairs = numbers.generate_pairs(p["num_train"], p["num_validation"], p["num_test"],
                                   p["seed"], reverse=self.builder_config.source_lang == "de")
    return pairs


class LocaleTranslate(_PairsBuilder):
  """Software messages from gettext catalogs (see `locale.py` for the cleaning rules)."""
  name = "locale_translate"
  DESCRIPTION = "English-X pairs from /usr/share/locale/<lang>/LC_MESSAGES/*.mo."

  def _pairs(self):
    config = self.builder_config
    p = config.params
    pairs, _ = locale.locale_pairs(p["locale_dir"], p["lang"], reverse=p["reverse"],
                                   include_ding=p["include_ding"], ding_path=p["ding_path"])
    return split_pairs(pairs, p["held_out_per_mille"], p["split"])


class TextTranslate(_PairsBuilder):
  """A user corpus: one TSV file (source<TAB>target) or two line-aligned files."""
  name = "text_translate"
  DESCRIPTION = "Parallel text from user files."

  def _inputs(self):
    p = self.builder_config.params
    return p["tsv_path"] or f"{p['source_path']} / {p['target_path']}"

  def _pairs(self):
    p = self.builder_config.params
    raw = _raw_pairs(p["tsv_path"], p["source_path"], p["target_path"])
    pairs, blank, repeated = clean_pairs(raw)
    if blank or repeated:
      # Said once, when the corpus is built: a blank side in two aligned files is often a sign
      # that they are not aligned.
      print(f"{self._inputs()}: {len(pairs):,} of {len(raw):,} lines kept as pairs; left out: "
            f"{blank:,} with a blank source or target, {repeated:,} repeating an earlier "
            "line's source (the first pair of each source is kept)", file=sys.stderr, flush=True)
    return split_pairs(pairs, p["held_out_per_mille"], p["split"])


def read_parallel_text(tsv_path: str | None, source_path: str | None,
                       target_path: str | None) -> list[tuple[str, str]]:
  """Pairs from a TSV or two aligned files; pairs with a blank side dropped, the first pair per
  source kept."""
  return clean_pairs(_raw_pairs(tsv_path, source_path, target_path))[0]


def _raw_pairs(tsv_path: str | None, source_path: str | None,
               target_path: str | None) -> list[tuple[str, str]]:
  """Every line's (source, target), as read."""
  if tsv_path:
    rows = [line.split("\t") for line in read_lines(tsv_path)]
    bad = [i + 1 for i, row in enumerate(rows) if len(row) != 2 and any(c.strip() for c in row)]
    if bad:
      shown = f"{bad[:5]}"[:-1] + (", ...]" if len(bad) > 5 else "]")
      cr = any("\r" in "".join(rows[i - 1]) for i in bad[:5])
      raise DataError(
          f"{tsv_path}: {len(bad)} of {len(rows)} lines do not have exactly 2 tab-separated "
          f"fields (source<TAB>target): lines {shown}; line {bad[0]} has "
          f"{len(rows[bad[0] - 1])}"
          + (". The file has lines that end in a bare carriage return (old Mac line ends): "
             "convert them to line feeds, e.g. with `tr '\\r' '\\n'`" if cr else ""))
    # The other rows are blank lines ("", spaces, tabs only): blank pairs, so that the build's
    # summary (`clean_pairs`) counts every line of the file and each blank one as blank.
    raw = [(row[0], row[1]) if len(row) == 2 else ("", "") for row in rows]
  else:
    sources, targets = read_lines(source_path), read_lines(target_path)
    odd = [path for path, lines in ((source_path, sources), (target_path, targets))
           if any("\r" in line for line in lines)]
    said = (f"{' and '.join(odd)}: lines hold a carriage return not followed by a line feed: "
            "lines end at line feeds only, so what it separates is read as one line; if it ends "
            "lines (old Mac line ends), convert them, e.g. with `tr '\\r' '\\n'`")
    if len(sources) != len(targets):
      raise DataError(f"{source_path} has {len(sources)} lines but {target_path} has "
                      f"{len(targets)}: the files must be line-aligned"
                      + (f". {said}" if odd else ""))
    raw = list(zip(sources, targets))
    if odd:  # the TSV's are refused above, as lines of one field
      print(said, file=sys.stderr)
  return raw


def clean_pairs(raw) -> tuple[list[tuple[str, str]], int, int]:
  """(pairs with whitespace collapsed, how many had a blank source or target, how many
  repeated an earlier pair's source): the pairs kept are the first for each source."""
  seen, pairs, blank, repeated = set(), [], 0, 0
  for source, target in raw:
    source, target = normalize_spaces(source), normalize_spaces(target)
    if not (source and target):
      blank += 1
    elif source in seen:
      repeated += 1
    else:
      seen.add(source)
      pairs.append((source, target))
  return pairs, blank, repeated


def make_builder(data_config, data_dir: str) -> _PairsBuilder:
  """The builder for `data_config.dataset` in {'numbers', 'locale', 'text'}."""
  c = data_config
  src, tgt = c.source_lang, c.target_lang
  check_languages(c)
  if c.dataset == "numbers":
    cls = NumbersTranslate
    params = {"num_train": c.numbers_train_size, "num_validation": c.numbers_eval_size,
              "num_test": c.numbers_eval_size, "seed": c.numbers_seed}
  elif c.dataset == "locale":
    cls = LocaleTranslate
    reverse = src != "en"   # English is one side (check_languages)
    lang = src if reverse else tgt
    locale_dir = c.locale_dir or locale.DEFAULT_LOCALE_DIR
    catalogs = locale.catalog_paths(locale_dir, lang)
    if not catalogs:
      raise FileNotFoundError(locale.missing_catalogs_message(locale_dir, lang))
    ding_path = c.locale_ding_path or locale.DEFAULT_DING_PATH
    inputs = [_file_signature(p) for p in catalogs]
    if c.locale_include_ding and os.path.exists(ding_path):
      inputs.append(_file_signature(ding_path))
    params = {"locale_dir": locale_dir, "lang": lang, "reverse": reverse,
              "include_ding": c.locale_include_ding, "ding_path": ding_path,
              "held_out_per_mille": c.held_out_per_mille,
              # One build for LOCALE_SAME_SPLITS (the texts clean_message began to drop on
              # 2026-12-07 are in none of the 3,674 catalogs of this machine's 197 languages, so
              # no earlier build holds one).
              "split": "grouped" if c.split in LOCALE_SAME_SPLITS else c.split,
              "inputs": _digest(inputs)}
  elif c.dataset == "text":
    cls = TextTranslate
    fields = ["tsv_path"] if c.tsv_path else ["source_path", "target_path"]
    for field in fields:
      if not os.path.isfile(c[field]):
        where = "" if os.path.isabs(c[field]) else f" (read from {os.getcwd()})"
        # A shell leaves `~` after `--config.data.tsv_path=` as it is.
        tilde = ("; `~` is not your home directory here (a shell expands it only at the start "
                 "of a word): write $HOME/ instead" if c[field].startswith("~") else "")
        raise DataError(f"data.{field}={c[field]}{where}: "
                        + ("is a directory" if os.path.isdir(c[field]) else "no such file")
                        + f": pass the path of your corpus file{tilde}")
    paths = [c[f] for f in fields]
    params = {"tsv_path": c.tsv_path, "source_path": c.source_path,
              "target_path": c.target_path, "held_out_per_mille": c.held_out_per_mille,
              "split": c.split, "inputs": _digest([_file_signature(p) for p in paths])}
  else:
    raise ValueError(f"data.dataset={c.dataset!r} has no local builder")
  name = f"{src}-{tgt}-{_digest(params)}"
  config = PairsConfig(name=name, description=json.dumps(params), source_lang=src,
                       target_lang=tgt, params=params)
  absl_logger, quiet = logging.getLogger("absl"), _CustomConfigNotice()
  absl_logger.addFilter(quiet)
  try:
    return cls(data_dir=data_dir, config=config, file_format="array_record")
  finally:
    absl_logger.removeFilter(quiet)


class _CustomConfigNotice(logging.Filter):
  """Drops TFDS's "WARNING: Using custom data configuration: PairsConfig(...)", logged at every
  builder's construction: a local corpus's config is custom by design (named by a hash of its
  inputs), so it warns of nothing. Every other record passes."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("Using custom data configuration")


def prepare(builder) -> None:
  """Builds the dataset once; concurrent callers wait for the first one and reuse its files."""
  lock = os.path.join(builder.data_dir_root, f".{builder.name}-{builder.builder_config.name}.lock")
  from tensorflow_datasets.core.utils import tqdm_utils
  shown = tqdm_utils._active  # TFDS's switch (tfds.display_progress_bar sets it, none reads it)
  # Progress bars redraw with cursor escapes: in a log file (a background run's, a scheduler's)
  # they are lines of "[A" and "Shuffling ...incomplete..." around the one useful line.
  tfds.display_progress_bar(shown and sys.stderr.isatty())
  try:
    with file_lock(lock):
      builder.download_and_prepare(file_format="array_record")
  finally:
    tfds.display_progress_bar(shown)
