"""SentencePiece: one joint source/target vocabulary, trained once and saved with the run.

Ids are fixed for the whole code base: pad=0, unk=1, bos=2 (`<s>`), eos=3 (`</s>`). Unknown
pieces get their own id (the Flax WMT example folds them into padding, which hides them from
the loss and the attention masks). The model inserts bos itself, so `encode` adds nothing and
the pipeline appends eos.

Every text is whitespace-normalised (`normalize_spaces`) on its way in, when the model is
trained and in `encode`, so that training, evaluation and translation all see the same text.
"""
from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import random
import re
from typing import Iterable, Sequence

import sentencepiece as spm

from transformer_jax.data.config import DataError
from transformer_jax.files import file_lock, write_atomically

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
# The special pieces' names, by id.
PIECES = {PAD_ID: "<pad>", UNK_ID: "<unk>", BOS_ID: "<s>", EOS_ID: "</s>"}


def normalize_spaces(text: str) -> str:
  """`text` with every run of whitespace (tab, NBSP, thin space, newline...) as one space and
  none at the ends. The model is trained on such text only, so an NBSP left in would be <unk>."""
  return " ".join(text.split())


class Tokenizer:
  """A thin, picklable wrapper over a SentencePiece model file."""

  pad_id, unk_id, bos_id, eos_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID

  def __init__(self, path: str):
    self.path = os.fspath(path)
    self._sp = spm.SentencePieceProcessor(model_file=self.path)
    ids = (self._sp.pad_id(), self._sp.unk_id(), self._sp.bos_id(), self._sp.eos_id())
    if ids != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
      raise ValueError(f"{self.path}: special ids (pad, unk, bos, eos) = {ids}, "
                       f"expected {(PAD_ID, UNK_ID, BOS_ID, EOS_ID)}; retrain the vocabulary")

  # Pickling reloads from the file: grain may copy transforms into worker threads/processes.
  def __getstate__(self):
    return {"path": self.path}

  def __setstate__(self, state):
    self.__init__(state["path"])

  @property
  def vocab_size(self) -> int:
    return self._sp.get_piece_size()

  def encode(self, text: str) -> list[int]:
    """Piece ids of `text` (whitespace-normalised first), without bos or eos."""
    return self._sp.encode(normalize_spaces(text))

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    # WMT text reaches the pipeline as stored (NBSP, tabs); references for BLEU stay raw.
    return self._sp.encode([normalize_spaces(t) for t in texts])

  def detokenize(self, ids: Iterable[int]) -> str:
    """Text of `ids`, stopping at the first eos and skipping pad and bos."""
    out = []
    for i in ids:
      i = int(i)
      if i == EOS_ID:
        break
      if i not in (PAD_ID, BOS_ID):
        out.append(i)
    return self._sp.decode(out)

  def pieces(self, ids: Iterable[int]) -> list[str]:
    """One printable piece per id (for attention plots); pad/bos/eos shown by name."""
    return [self._sp.id_to_piece(int(i)) for i in ids]


# SentencePiece's trainer threads: a fixed count, not the machine's. Unigram's EM sums its
# expected counts per thread in floating point, so the pieces' scores, and with them their
# ids, depend on the thread count (BPE's integer counts do not); a fixed count makes the
# vocabulary of a corpus and config the same on a 2-core laptop and a 16-core GPU host.
TRAINER_THREADS = 8

# SentencePiece's wording when the corpus has more distinct characters than pieces allowed.
_TOO_MANY_CHARS = re.compile(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)")

# SentencePiece's trainer skips, without a word, sample lines longer than this many UTF-8 bytes.
SPM_MAX_SENTENCE_LENGTH = 4192

# The special pieces' names in the text: SentencePiece's trainer removes them from its lines.
_PIECE_NAMES = re.compile("|".join(re.escape(name) for name in PIECES.values()))


def _sentence_limit(lines: list[str]) -> dict:
  """The trainer's `max_sentence_length` argument when a sample line is longer than its
  default: a skipped line's characters may get no piece (<unk>), and a sample of only such
  lines fails inside SentencePiece. Nothing when every line fits: the field, once set, is
  written into the model, so the model of a corpus that trained before would change bytes."""
  longest = max((len(line.encode()) for line in lines), default=0)
  return {"max_sentence_length": longest} if longest > SPM_MAX_SENTENCE_LENGTH else {}


def _warn_of_piece_names(lines: list[str]) -> None:
  """Warns (once per training) when sample lines hold `<unk>`, `<s>`, `</s>` or `<pad>`:
  the trainer takes those strings out of its text, so a character seen only inside them gets
  no piece and encodes as <unk>, and `detokenize(encode(x)) != x` for text with them."""
  found: dict[str, None] = {}  # In order of first sight.
  lines_with = 0
  for line in lines:
    names = _PIECE_NAMES.findall(line)
    lines_with += bool(names)
    found.update(dict.fromkeys(names))
  if lines_with:
    logging.warning(
        "vocabulary sample: %d of %d lines hold %s, the names of SentencePiece's special "
        "pieces, which its trainer removes from the text: a character seen only inside them "
        "gets no piece and encodes as <unk>. Set data.vocab_byte_fallback=True (such "
        "characters become byte pieces) or take the strings out of the corpus",
        lines_with, len(lines), ", ".join(found))


def _train_model(lines: list[str], *, vocab_size: int, model_type: str, split_digits: bool,
                 byte_fallback: bool) -> bytes:
  """The serialised SentencePiece model trained on `lines`; DataError if `vocab_size` is too
  small for the corpus's characters (SentencePiece's own advice names a flag we do not have)."""
  if vocab_size <= EOS_ID:
    raise DataError(f"data.vocab_size={vocab_size}: ids 0-3 are pad, unk, bos and eos, and "
                    "every distinct character of the corpus needs a piece too: raise "
                    "data.vocab_size")
  # Sentences in and the model out through Python objects, not files: SentencePiece splits
  # `input=` at commas, and sweep points' workdirs have commas in their names.
  model = io.BytesIO()
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=vocab_size,
        model_type=model_type, pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
        pad_piece=PIECES[PAD_ID], unk_piece=PIECES[UNK_ID], bos_piece=PIECES[BOS_ID],
        eos_piece=PIECES[EOS_ID],
        # Identity normalisation keeps decode(encode(x)) == x for text without odd spacing.
        # Coverage 1.0: every character of the sample gets a piece, none becomes <unk>.
        normalization_rule_name="identity", character_coverage=1.0,
        split_digits=split_digits, byte_fallback=byte_fallback,
        # A small corpus may not support the requested size: take what it supports.
        hard_vocab_limit=False, input_sentence_size=0, shuffle_input_sentence=False,
        num_threads=TRAINER_THREADS, minloglevel=2, **_sentence_limit(lines))
  except RuntimeError as e:
    match = _TOO_MANY_CHARS.search(str(e))
    if not match:
      raise
    extra = " and 256 byte pieces (data.vocab_byte_fallback)" if byte_fallback else ""
    raise DataError(
        f"data.vocab_size={vocab_size} is too small for this corpus: it needs at least "
        f"{match.group(2)} pieces, one per distinct character of the vocabulary sample plus the "
        f"4 special ones{extra}. Raise data.vocab_size, to a few times that number so that "
        "pieces longer than one character fit too") from None
  return model.getvalue()


def sample_lines(texts: Iterable[str], max_chars: int, seed: int) -> tuple[list[str], int]:
  """The non-empty `texts` shuffled by `seed`, whitespace-normalised, up to the first that
  would take the total past `max_chars` characters; and that total."""
  texts = [t for t in texts if t]
  random.Random(seed).shuffle(texts)
  lines, chars = [], 0
  for t in texts:
    line = normalize_spaces(t)  # As `encode` will see it; also one sentence per line.
    if chars + len(line) > max_chars:
      break  # A prefix of the shuffle: a shorter text further on would change the sample's mix.
    lines.append(line)
    chars += len(line)
  return lines, chars


def _empty_sample(texts: list[str], max_chars: int, seed: int) -> str:
  """Why the vocabulary sample of `texts` has no character (SentencePiece would fail on it
  with an internal error)."""
  everything, _ = sample_lines(texts, float("inf"), seed)
  first = next((line for line in everything if line), None)
  if first is None:
    return ("the vocabulary sample is empty: the training split has no text that is not "
            "blank; check the corpus files")
  return (f"data.vocab_max_chars={max_chars:,} leaves the vocabulary sample empty: the first "
          f"text in its seeded order has {len(first):,} characters. Raise data.vocab_max_chars "
          "(the characters the vocabulary is trained on) to many times that")


def train_tokenizer(texts: Iterable[str], path: str, *, vocab_size: int, model_type: str,
                    max_chars: int, split_digits: bool, byte_fallback: bool,
                    seed: int) -> Tokenizer:
  """Trains a SentencePiece model on `texts` and writes it atomically to `path`.

  `texts` is the training split's sources and targets interleaved; a seeded sample of them up
  to `max_chars` characters is used (the character budget bounds the training time). The model
  is written to a temporary name and renamed, so a reader never sees half a file. No argument
  has a default: the data config's fields (`data.vocab_*`, `data.shuffle_seed`) are the only
  ones, so a caller cannot train with other settings than its config says.
  """
  texts = list(texts)  # Read twice when the sample is empty (to say why).
  lines, chars = sample_lines(texts, max_chars, seed)
  if not any(lines):
    raise DataError(_empty_sample(texts, max_chars, seed))
  if not byte_fallback:  # With byte pieces, the characters inside the names round-trip.
    _warn_of_piece_names(lines)
  logging.info("Training a %s SentencePiece model (%d pieces) on %d characters",
               model_type, vocab_size, chars)
  model = _train_model(lines, vocab_size=vocab_size, model_type=model_type,
                       split_digits=split_digits, byte_fallback=byte_fallback)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  write_atomically(path, model)
  return Tokenizer(path)


def load_or_train(path: str, texts_fn, trained_from: dict | None = None,
                  **train_kwargs) -> Tokenizer:
  """The tokenizer at `path`, trained first (under a lock) if the file does not exist yet.

  `texts_fn()` returns the training texts; it is only called when training is needed, so a
  resumed run never touches the corpus for its vocabulary. `trained_from` (the data config and
  the corpus files' record, or a function returning them, called only when training) is
  written beside a newly trained model as `<path>.json`, so a later command can tell whether
  its own data config and files match the tokenizer it finds (`run.workdir.check_config`).
  """
  if os.path.exists(path):
    return Tokenizer(path)
  with file_lock(path + ".lock"):
    if os.path.exists(path):  # Another process trained it while we waited.
      return Tokenizer(path)
    # The record before the model: a command killed between the two leaves a record without
    # its model, which the next model trained replaces, never a model without its record, which
    # a later command with another data config would take unchecked (run.workdir's
    # `_check_tokenizer` has nothing to compare it with).
    record = trained_from() if callable(trained_from) else trained_from
    if record is not None:
      write_atomically(path + ".json", json.dumps(record, indent=1))
    else:  # a record a killed command left would pass for this model's
      with contextlib.suppress(FileNotFoundError):
        os.remove(path + ".json")
    return train_tokenizer(texts_fn(), path, **train_kwargs)
