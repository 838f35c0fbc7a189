"""SentencePiece: fixed special ids, unk distinct from pad, lossless round trip, reuse."""
import os
import pickle

import pytest

from transformer_jax.data import tokenizer as tok_lib
from transformer_jax.data.config import DataError

TEXTS = [
    "The farmer bought 27 red cows yesterday.",
    "Der Bauer hat gestern siebenundzwanzig rote Kühe gekauft.",
    "Ich weiß, dass sie dreihundert Äpfel hat.",
    "Open the file and save it again?",
    "Öffnen Sie die Datei und speichern Sie sie erneut?",
] * 40


@pytest.fixture(scope="module", params=["unigram", "bpe"])
def tokenizer(request, tmp_path_factory):
  path = tmp_path_factory.mktemp("spm") / "spm.model"
  return tok_lib.train_tokenizer(TEXTS, str(path), vocab_size=120,
                                 model_type=request.param, max_chars=100_000)


def test_special_ids(tokenizer):
  assert (tokenizer.pad_id, tokenizer.unk_id, tokenizer.bos_id, tokenizer.eos_id) == (0, 1, 2, 3)
  assert tokenizer.pieces([0, 1, 2, 3]) == ["<pad>", "<unk>", "<s>", "</s>"]
  # Unknown characters get <unk>, never padding (the Flax example maps them onto pad).
  ids = tokenizer.encode("Zebra ☃")
  assert tok_lib.UNK_ID in ids and tok_lib.PAD_ID not in ids
  assert 4 <= min(tokenizer.encode(TEXTS[0]))
  assert tokenizer.vocab_size <= 120


def test_round_trip(tokenizer):
  for text in set(TEXTS) | {"Kühe 272 und 7, Äpfel.", "a b  c"}:
    ids = tokenizer.encode(text)
    assert tok_lib.EOS_ID not in ids and tok_lib.BOS_ID not in ids
    expected = " ".join(text.split())  # SentencePiece collapses repeated spaces.
    assert tokenizer.detokenize(ids) == expected
  # decode stops at eos and skips pad and bos.
  ids = tokenizer.encode(TEXTS[0])
  assert tokenizer.detokenize([2] + ids + [3] + ids + [0, 0]) == TEXTS[0]
  assert tokenizer.encode_batch(TEXTS[:2]) == [tokenizer.encode(t) for t in TEXTS[:2]]


def test_digits_are_split(tokenizer):
  assert tokenizer.pieces(tokenizer.encode("277"))[-3:] == ["2", "7", "7"]


def test_reused_not_retrained_and_picklable(tokenizer, tmp_path):
  calls = []
  again = tok_lib.load_or_train(tokenizer.path, lambda: calls.append(1) or TEXTS,
                                vocab_size=120)
  assert not calls and again.encode(TEXTS[1]) == tokenizer.encode(TEXTS[1])
  clone = pickle.loads(pickle.dumps(tokenizer))
  assert clone.encode(TEXTS[2]) == tokenizer.encode(TEXTS[2])
  fresh = tmp_path / "new" / "spm.model"
  made = tok_lib.load_or_train(str(fresh), lambda: calls.append(1) or TEXTS, vocab_size=100)
  assert calls == [1] and os.path.exists(fresh) and made.vocab_size <= 100
  assert [p for p in os.listdir(fresh.parent) if p.startswith("tmp")] == []  # No leftovers.


def test_trains_in_a_directory_named_like_a_sweep_point(tmp_path):
  """Sweep points' workdirs are `field=value,field=value`; SentencePiece splits file lists at
  commas, so training must not pass it paths."""
  path = tmp_path / "learning_rate=1.0,warmup_steps=200" / "spm.model"
  made = tok_lib.train_tokenizer(TEXTS, str(path), vocab_size=120, max_chars=100_000)
  assert os.path.exists(path) and made.detokenize(made.encode(TEXTS[0])) == TEXTS[0]
  assert os.listdir(path.parent) == ["spm.model"]
  # Readable as the umask says (a shared vocab_path), not only by its owner.
  umask = os.umask(0)
  os.umask(umask)
  assert os.stat(path).st_mode & 0o777 == 0o666 & ~umask


def test_odd_spaces_encode_like_single_spaces(tokenizer):
  """WMT text has NBSPs, tabs and runs of spaces; the vocabulary was trained without them, so
  every encoder (training pipeline, evaluation, Translator) must see them as single spaces."""
  from transformer_jax.data import pipeline
  raw = "Der Bauer\u00a0hat gestern\tsiebenundzwanzig  rote\u2009Kühe gekauft. "
  clean = "Der Bauer hat gestern siebenundzwanzig rote Kühe gekauft."
  assert tokenizer.encode(raw) == tokenizer.encode(clean)
  assert tok_lib.UNK_ID not in tokenizer.encode(raw)
  assert tokenizer.encode_batch([raw, clean]) == [tokenizer.encode(clean)] * 2
  # Evaluation encodes the stored text but keeps it raw as the reference for sacreBLEU.
  (batch,) = pipeline.eval_batches([(raw, raw)], tokenizer, batch_size=1)
  assert tok_lib.UNK_ID not in batch["inputs"][0] and batch["target_text"] == [raw]


def test_too_many_characters_is_a_data_error(tmp_path):
  """A corpus with more distinct characters than pieces (CJK with the default size) names the
  setting and the size it needs, not SentencePiece's --character_coverage flag."""
  texts = ["".join(chr(0x4e00 + (i * 7 + j) % 300) for j in range(10)) for i in range(100)]
  path = tmp_path / "spm.model"
  # 300 characters, the "▁" of the first word and the 4 special pieces.
  with pytest.raises(DataError, match=r"data.vocab_size=100 .*at least 305 pieces"):
    tok_lib.train_tokenizer(texts, str(path), vocab_size=100)
  with pytest.raises(DataError, match=r"data.vocab_size=3: .*raise data.vocab_size"):
    tok_lib.train_tokenizer(texts, str(path), vocab_size=3)
  assert not os.path.exists(path)
  assert tok_lib.train_tokenizer(texts, str(path), vocab_size=305).vocab_size == 305
