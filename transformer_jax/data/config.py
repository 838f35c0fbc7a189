"""The data settings: one ConfigDict that experiment configs copy and override.

    config.data = default_data_config()
    config.data.dataset = "locale"

`validate` names the bad field and the allowed values; `get_data` calls it.
"""
from __future__ import annotations

import ml_collections

DATASETS = ("numbers", "locale", "text", "wmt14", "wmt17")
BATCHING = ("pack", "bucket", "pad")
SPLITS = ("grouped_v2", "grouped", "source")
# The datasets with splits of their own, which read neither `split` nor `held_out_per_mille`
# (a dataset not listed is taken to read them).
OWN_SPLIT_DATASETS = ("numbers", "wmt14", "wmt17")
# The `split` values that split gettext catalogs alike: no message normalizes to nothing
# (locale.clean_message), where the two groupings differ. One "locale" build serves both.
LOCALE_SAME_SPLITS = ("grouped", "grouped_v2")
VOCAB_MODEL_TYPES = ("unigram", "bpe")


class DataError(ValueError):
  """Data settings that no data fits (the message names the fields); the scripts print it as
  `error: ...` instead of a traceback."""


def default_data_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  # Which corpus: "numbers" (built in, synthetic), "locale" (gettext catalogs of this machine),
  # "text" (your TSV or aligned files), "wmt14" / "wmt17" (TFDS WMT de-en, needs internet once).
  c.dataset = "numbers"
  # Translation direction as language codes; swap them for German to English.
  c.source_lang = "en"
  c.target_lang = "de"
  # Where TFDS builds and finds datasets; None: $TFDS_DATA_DIR or ~/tensorflow_datasets.
  c.data_dir = ml_collections.config_dict.placeholder(str)
  # Percent-mille of sources hashed into validation and into test each ("locale", "text").
  c.held_out_per_mille = 30
  # How "locale" and "text" are split: "grouped_v2" keeps near-duplicates (a shared normalized
  # source or target) on one side (data/leakage.py); "grouped" is its first version, as runs
  # made 2026-11-23 to 2026-12-07 split (a side of punctuation alone, "...", joined one common
  # group); "source" hashes the exact source, as runs made before 2026-11-23 did (set either to
  # resume one of those runs). The "numbers" task has its own split and ignores this field.
  c.split = "grouped_v2"

  # "numbers": sentences per split and the generator's seed (the data is a function of these).
  c.numbers_train_size = 50_000
  c.numbers_eval_size = 1_000  # Validation and test each.
  c.numbers_seed = 0

  # "locale": root holding <lang>/LC_MESSAGES/*.mo; None: /usr/share/locale.
  c.locale_dir = ml_collections.config_dict.placeholder(str)
  # Add the Ding dictionary's phrase pairs (Debian package trans-de-en; German only).
  c.locale_include_ding = False
  # The Ding file; None: /usr/share/trans/de-en.
  c.locale_ding_path = ml_collections.config_dict.placeholder(str)

  # "text": one TSV file (source<TAB>target per line) or two line-aligned files.
  c.tsv_path = ml_collections.config_dict.placeholder(str)
  c.source_path = ml_collections.config_dict.placeholder(str)
  c.target_path = ml_collections.config_dict.placeholder(str)

  # SentencePiece vocabulary, joint for source and target, trained on the training split.
  c.vocab_size = 2_000  # An upper bound: a small corpus gets what it supports.
  c.vocab_model_type = "bpe"  # "bpe" (as the paper for EN-DE) or "unigram".
  c.vocab_max_chars = 10_000_000  # Character budget of the training sample (bounds its time).
  c.vocab_split_digits = True  # One piece per digit: numbers are read compositionally.
  c.vocab_byte_fallback = False  # Bytes for unseen characters (adds 256 pieces).
  # Model file; None: <workdir>/spm.model, trained on first use and reused on resume.
  c.vocab_path = ml_collections.config_dict.placeholder(str)

  # Training pairs longer than these (in pieces, with eos) are dropped; they are also the
  # length of the packed/padded rows. Evaluation never drops or truncates a sentence.
  c.max_source_len = 64
  c.max_target_len = 64
  # "pack": several pairs per row with segment ids (the default, least padding);
  # "bucket": one pair per row, rows grouped by length, one shape per bucket;
  # "pad": one pair per row padded to the maximum length (one shape, most padding).
  c.batching = "pack"
  # Rows per global batch (all processes together).
  c.batch_size = 64
  # Tokens per global batch and side; when > 0 it wins: rows = batch_tokens // max length
  # ("bucket": per bucket). The paper used about 25,000 source and 25,000 target tokens.
  c.batch_tokens = 0
  # "bucket": upper lengths of the buckets (the last is raised to the maximum length), and
  # the multiple the rows of every bucket's batch are rounded down to (device count).
  c.bucket_boundaries = (8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
  c.bucket_rows_multiple = 8
  # Chunks of 1,024 pairs read, tokenized and packed/bucketed together. Larger windows pack
  # better and waste less (each window's last batch may be partly empty) but use memory.
  c.window_chunks = 16
  # Shuffling: a full random permutation of the training split per epoch, from this seed.
  c.shuffle_seed = 0
  # Threads that read and tokenize examples, and batches prepared ahead in a background thread.
  c.num_threads = 2
  c.prefetch = 4

  # Evaluation batches: rows per batch and the padded length (0: the longest in the split,
  # rounded up to a multiple of 8, so one split has one shape).
  c.eval_batch_size = 64
  c.eval_max_len = 0
  return c


def global_rows(c) -> int:
  """Rows per global batch: batch_tokens // longest row length when batch_tokens > 0."""
  if c.batch_tokens > 0:
    return max(1, c.batch_tokens // max(c.max_source_len, c.max_target_len))
  return c.batch_size


def bucket_lengths(boundaries, max_len: int) -> list[int]:
  """Sorted bucket lengths, cut at `max_len`, with `max_len` itself as the last one."""
  return sorted({b for b in boundaries if b < max_len} | {max_len})


def bucket_rows(lengths, token_budget: int, multiple: int) -> list[int]:
  """Rows per batch of each bucket: the budget divided by the length, rounded down to
  `multiple` (the device count, so a batch shards evenly), and at least `multiple`."""
  return [max(multiple, token_budget // length // multiple * multiple) for length in lengths]


def buckets(c, rows: int, process_count: int = 1) -> tuple[list[int], list[int]]:
  """"bucket" batching's lengths and each one's rows per batch, for one of `process_count`
  processes whose other batches hold `rows` rows (its share of `global_rows`)."""
  max_len = max(c.max_source_len, c.max_target_len)
  lengths = bucket_lengths(c.bucket_boundaries, max_len)
  budget = c.batch_tokens // process_count if c.batch_tokens > 0 else rows * max_len
  return lengths, bucket_rows(lengths, budget, c.bucket_rows_multiple)


def train_batch_shapes(c) -> list[dict]:
  """The shapes a global training batch may have, as {"inputs": (rows, length), "targets":
  (rows, length)}: one ("pack", "pad"), or one per bucket ("bucket": rows of the bucket's
  length on both sides)."""
  rows = global_rows(c)
  if c.batching != "bucket":
    return [{"inputs": (rows, c.max_source_len), "targets": (rows, c.max_target_len)}]
  return [{"inputs": (r, n), "targets": (r, n)} for n, r in zip(*buckets(c, rows))]


def _check_choice(c, field, allowed):
  value = c[field]
  if value not in allowed:
    raise ValueError(f"data.{field}={value!r}: expected one of {', '.join(map(repr, allowed))}")


def _check_positive(c, field, allow_zero=False):
  value = c[field]
  if not isinstance(value, int) or value < 0 or (value == 0 and not allow_zero):
    bound = ">= 0" if allow_zero else "> 0"
    raise ValueError(f"data.{field}={value!r}: expected an integer {bound}")


def stray_corpus_field(c) -> str | None:
  """Why a new run's corpus fields contradict its dataset (None: they do not): the path of a
  text corpus or locale catalogs, or the locale corpus's dictionary, set for another dataset,
  which would train on that other one without a word. Checked when a run starts
  (`run.workdir.check_config`), not on resume: a run made with such a field is resumed and
  evaluated as it was."""
  for dataset, fields in (("text", ("tsv_path", "source_path", "target_path")),
                          ("locale", ("locale_dir", "locale_ding_path", "locale_include_ding"))):
    given = [f for f in fields if c[f]]
    if given and c.dataset != dataset:
      return (f"data.{given[0]} is set but data.dataset={c.dataset!r}: add "
              f"--config.data.dataset={dataset} to train on "
              + ("your files" if dataset == "text" else "those catalogs")
              + (f", or set data.{given[0]}=False" if c[given[0]] is True
                 else f", or drop data.{given[0]}"))
  return None


def check_languages(c) -> None:
  """The language pairs the built-in corpora have: refused when a run starts (`validate`), and
  by `builders.make_builder` for a caller that builds without validating."""
  pair = f"data.source_lang={c.source_lang!r}, data.target_lang={c.target_lang!r}"
  if c.dataset == "numbers" and {c.source_lang, c.target_lang} != {"en", "de"}:
    raise DataError(f"data.dataset='numbers' is English-German, got {pair}: set them to 'en' "
                    "and 'de' (either order), or choose another data.dataset")
  if c.dataset == "locale" and "en" not in (c.source_lang, c.target_lang):
    raise DataError(f"data.dataset='locale' pairs English with one language, got {pair}: set "
                    "one of them to 'en'")
  other = c.target_lang if c.source_lang == "en" else c.source_lang
  if c.dataset == "locale" and c.locale_include_ding and other != "de":
    raise DataError(f"data.locale_include_ding=True adds a German dictionary, but the pair is "
                    f"en-{other}: set data.locale_include_ding=False, or pair English with 'de'")


def validate(c) -> None:
  """Raises ValueError naming the first bad field and what it accepts."""
  _check_choice(c, "dataset", DATASETS)
  _check_choice(c, "batching", BATCHING)
  _check_choice(c, "split", SPLITS)
  _check_choice(c, "vocab_model_type", VOCAB_MODEL_TYPES)
  for field in ("vocab_size", "vocab_max_chars", "max_source_len", "max_target_len",
                "batch_size", "eval_batch_size", "num_threads", "bucket_rows_multiple",
                "window_chunks", "numbers_train_size", "numbers_eval_size"):
    _check_positive(c, field)
  for field in ("batch_tokens", "prefetch", "eval_max_len", "shuffle_seed", "numbers_seed"):
    _check_positive(c, field, allow_zero=True)
  if c.source_lang == c.target_lang:
    raise ValueError(f"data.source_lang and data.target_lang are both {c.source_lang!r}")
  if c.dataset in ("wmt14", "wmt17") and {c.source_lang, c.target_lang} != {"en", "de"}:
    raise ValueError(f"data.dataset={c.dataset!r} is de-en: data.source_lang/target_lang "
                     f"must be 'en' and 'de' in either order")
  check_languages(c)
  if c.dataset == "text":
    if bool(c.tsv_path) == bool(c.source_path or c.target_path):
      raise ValueError("data.dataset='text': set data.tsv_path, or data.source_path and "
                       "data.target_path (not both)")
    if not c.tsv_path and not (c.source_path and c.target_path):
      raise ValueError("data.dataset='text': data.source_path and data.target_path "
                       "must both be set")
  boundaries = c.bucket_boundaries
  if (not isinstance(boundaries, (tuple, list)) or not boundaries
      or not all(isinstance(b, int) and b > 0 for b in boundaries)):
    raise ValueError(f"data.bucket_boundaries={boundaries!r}: expected a non-empty sequence of "
                     "positive integers (row lengths), e.g. (16, 32, 64)")
  if not 0 < c.held_out_per_mille < 500:
    raise ValueError(f"data.held_out_per_mille={c.held_out_per_mille!r}: expected 1..499")
