"""SentencePiece: fixed special ids, unk distinct from pad, lossless round trip, reuse."""
import json
import os
import pickle

import pytest

from transformer_jax import files
from transformer_jax.data import tokenizer as tok_lib
from transformer_jax.data.config import DataError

TEXTS = [
    "The farmer bought 27 red cows yesterday.",
    "Der Bauer hat gestern siebenundzwanzig rote Kühe gekauft.",
    "Ich weiß, dass sie dreihundert Äpfel hat.",
    "Open the file and save it again?",
    "Öffnen Sie die Datei und speichern Sie sie erneut?",
] * 40
# train_tokenizer's settings (no defaults: the data config gives them all), bar vocab_size.
SETTINGS = dict(model_type="unigram", max_chars=100_000, split_digits=True, byte_fallback=False,
                seed=0)


def train(texts, path, vocab_size: int, **changes):
  return tok_lib.train_tokenizer(texts, str(path), vocab_size=vocab_size,
                                 **{**SETTINGS, **changes})


@pytest.fixture(scope="module", params=["unigram", "bpe"])
def tokenizer(request, tmp_path_factory):
  path = tmp_path_factory.mktemp("spm") / "spm.model"
  return train(TEXTS, path, 120, model_type=request.param)


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
                                vocab_size=120, **SETTINGS)
  assert not calls and again.encode(TEXTS[1]) == tokenizer.encode(TEXTS[1])
  clone = pickle.loads(pickle.dumps(tokenizer))
  assert clone.encode(TEXTS[2]) == tokenizer.encode(TEXTS[2])
  fresh = tmp_path / "new" / "spm.model"
  made = tok_lib.load_or_train(str(fresh), lambda: calls.append(1) or TEXTS, vocab_size=100,
                               **SETTINGS)
  assert calls == [1] and os.path.exists(fresh) and made.vocab_size <= 100
  assert sorted(os.listdir(fresh.parent)) == ["spm.model", "spm.model.lock"]  # No leftovers.


def test_trains_in_a_directory_named_like_a_sweep_point(tmp_path):
  """Sweep points' workdirs are `field=value,field=value`; SentencePiece splits file lists at
  commas, so training must not pass it paths."""
  path = tmp_path / "learning_rate=1.0,warmup_steps=200" / "spm.model"
  made = train(TEXTS, path, 120)
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
    train(texts, path, 100)
  with pytest.raises(DataError, match=r"data.vocab_size=3: .*raise data.vocab_size"):
    train(texts, path, 3)
  assert not os.path.exists(path)
  assert train(texts, path, 305).vocab_size == 305


def test_too_many_characters_names_the_byte_pieces_only_with_byte_fallback(tmp_path):
  texts = ["".join(chr(0x4e00 + (i * 7 + j) % 300) for j in range(10)) for i in range(100)]
  with pytest.raises(DataError, match=r"at least \d+ pieces, .*4 special ones and 256 byte "
                     r"pieces \(data.vocab_byte_fallback\)\. Raise"):
    train(texts, tmp_path / "spm.model", 100, byte_fallback=True)
  with pytest.raises(DataError, match=r"4 special ones\. Raise") as raised:
    train(texts, tmp_path / "spm.model", 100)
  assert "byte" not in str(raised.value)


def test_the_vocabulary_does_not_depend_on_the_machines_core_count(tmp_path, monkeypatch):
  """Unigram's EM sums per thread in floating point, so 1 and 16 threads give other scores
  and piece ids: the trainer's thread count is fixed, not the machine's."""
  import sentencepiece as spm
  models = []
  for cores in (1, 16):
    monkeypatch.setattr(os, "cpu_count", lambda cores=cores: cores)
    made = train(TEXTS, tmp_path / f"{cores}" / "spm.model", 120, model_type="unigram")
    proc = spm.SentencePieceProcessor(model_file=made.path)
    models.append([(proc.id_to_piece(i), proc.get_score(i)) for i in range(made.vocab_size)])
  assert models[0] == models[1]
  # What a fixed count guards against: these texts train differently on 1 and 2 threads.
  threads = []
  for n in (1, 2):
    monkeypatch.setattr(tok_lib, "TRAINER_THREADS", n)
    made = train(TEXTS, tmp_path / f"threads{n}" / "spm.model", 120, model_type="unigram")
    proc = spm.SentencePieceProcessor(model_file=made.path)
    threads.append([proc.get_score(i) for i in range(made.vocab_size)])
  assert threads[0] != threads[1]


def test_the_sample_is_a_seeded_prefix_within_the_character_budget():
  texts = ["aaaa", "", "bb\tb", "c", "dddddd", "ee", "f  f"]
  everything, total = tok_lib.sample_lines(texts, 10**6, seed=3)
  assert sorted(everything) == sorted(["aaaa", "bb b", "c", "dddddd", "ee", "f f"])  # No "".
  assert total == sum(map(len, everything)) == 20
  assert tok_lib.sample_lines(texts, 10**6, seed=3) == (everything, total)  # Reproducible.
  assert any(tok_lib.sample_lines(texts, 10**6, seed=s)[0] != everything for s in range(4, 9))
  for budget in range(total + 1):
    lines, chars = tok_lib.sample_lines(texts, budget, seed=3)
    # The longest prefix of the seeded order within the budget, the budget itself included.
    k = max(i for i in range(len(everything) + 1) if sum(map(len, everything[:i])) <= budget)
    assert (lines, chars) == (everything[:k], sum(map(len, everything[:k])))
  # A text that does not fit ends the sample, though a shorter one after it would fit.
  texts = ["aaaa", "bbbbbbbb", "c"]
  order = tok_lib.sample_lines(texts, 100, seed=5)[0]
  assert order.index("bbbbbbbb") < order.index("c")  # The case this seed gives.
  before = order[:order.index("bbbbbbbb")]
  assert tok_lib.sample_lines(texts, sum(map(len, before)) + 7, seed=5)[0] == before


def test_the_lock_can_be_taken_again_and_a_waiting_trainer_reuses_the_model(tmp_path):
  """Two processes building one workdir: the second waits on the lock, then loads what the
  first trained instead of training again."""
  import threading
  path = str(tmp_path / "shared" / "spm.model")
  with files.file_lock(path + ".lock"):
    pass
  with files.file_lock(path + ".lock"):  # The directory exists now.
    calls, result = [], {}
    waiter = threading.Thread(target=lambda: result.setdefault("made", tok_lib.load_or_train(
        path, lambda: calls.append(1) or TEXTS, vocab_size=120, **SETTINGS)))
    waiter.start()
    waiter.join(0.5)
    assert waiter.is_alive() and not os.path.exists(path)  # Waits on the lock.
    train(TEXTS, path, 120)  # The first process trains meanwhile.
  waiter.join(30)
  assert not calls and result["made"].encode(TEXTS[0]) == train(
      TEXTS, tmp_path / "again" / "spm.model", 120).encode(TEXTS[0])
  assert not os.path.exists(path + ".json")


def test_what_the_model_was_trained_from_is_written_beside_it(tmp_path):
  record = {"vocab_size": 120, "files": ["a.tsv"]}
  made = tok_lib.load_or_train(str(tmp_path / "a" / "spm.model"), lambda: TEXTS,
                               trained_from=record, vocab_size=120, **SETTINGS)
  with open(made.path + ".json") as f:
    assert json.load(f) == record
  assert sorted(os.listdir(tmp_path / "a")) == ["spm.model", "spm.model.json", "spm.model.lock"]
  calls = []
  made = tok_lib.load_or_train(str(tmp_path / "b" / "spm.model"), lambda: TEXTS,
                               trained_from=lambda: calls.append(1) or record,
                               vocab_size=120, **SETTINGS)
  with open(made.path + ".json") as f:
    assert json.load(f) == record and calls == [1]
  # An existing model is loaded as it is: nothing trained, nothing recorded.
  tok_lib.load_or_train(made.path, lambda: TEXTS, trained_from=lambda: calls.append(2) or {},
                        vocab_size=120, **SETTINGS)
  assert calls == [1]
  made = tok_lib.load_or_train(str(tmp_path / "c" / "spm.model"), lambda: TEXTS,
                               vocab_size=120, **SETTINGS)
  assert not os.path.exists(made.path + ".json")


class _Killed(BaseException):
  """A kill -9 at a chosen moment (no handler runs: BaseException passes every `except`)."""


def test_a_kill_between_the_record_and_the_model_leaves_no_model_without_its_record(
    tmp_path, monkeypatch):
  """Killed between its two renames, training leaves a record without its model (replaced with
  the next model trained), never a model without its record: run.workdir's _check_tokenizer
  would have nothing to compare a later command's other data config with, and that command
  would use the old model."""
  path, replace, renamed = str(tmp_path / "spm.model"), os.replace, []

  def killed_at_the_second_rename(src, dst):
    if renamed:
      raise _Killed
    renamed.append(dst)
    replace(src, dst)
  monkeypatch.setattr(os, "replace", killed_at_the_second_rename)
  with pytest.raises(_Killed):
    tok_lib.load_or_train(path, lambda: TEXTS, trained_from={"vocab_size": 120},
                          vocab_size=120, **SETTINGS)
  assert renamed == [path + ".json"] and not os.path.exists(path)
  monkeypatch.undo()
  made = tok_lib.load_or_train(path, lambda: TEXTS, trained_from={"vocab_size": 100},
                               vocab_size=100, **SETTINGS)
  with open(path + ".json") as f:
    assert json.load(f) == {"vocab_size": 100} and made.vocab_size <= 100
  # Trained without a record: one a killed command left would pass for the new model's.
  os.remove(path)
  tok_lib.load_or_train(path, lambda: TEXTS, vocab_size=120, **SETTINGS)
  assert not os.path.exists(path + ".json")


def test_an_atomic_write_reaches_the_disk_before_and_after_its_rename(tmp_path, monkeypatch):
  """The file's bytes are synced before the rename and the directory after it: without that, a
  power loss can leave the renamed file empty. A failed write leaves the old file whole and no
  temporary one."""
  import stat
  events = []
  fsync, replace = os.fsync, os.replace
  monkeypatch.setattr(os, "fsync", lambda fd: events.append(
      "directory" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file") or fsync(fd))
  monkeypatch.setattr(os, "replace", lambda a, b: events.append("rename") or replace(a, b))
  path = str(tmp_path / "record.json")
  files.write_atomically(path, "{}\n")
  assert events == ["file", "rename", "directory"] and open(path).read() == "{}\n"
  events.clear()
  train(TEXTS, tmp_path / "spm.model", 120)  # the model goes the same way
  assert events == ["file", "rename", "directory"]

  def no_space(fd):
    raise OSError(28, "No space left on device")
  monkeypatch.setattr(os, "fsync", no_space)
  with pytest.raises(OSError, match=f"No space left on device: '{path}'"):  # names the file
    files.write_atomically(path, "{\"cut\": ")
  assert open(path).read() == "{}\n" and sorted(os.listdir(tmp_path)) == ["record.json",
                                                                           "spm.model"]
  missing = str(tmp_path / "missing" / "record.json")   # the error names it, not its tmp file
  with pytest.raises(FileNotFoundError) as e:
    files.write_atomically(missing, "{}")
  assert e.value.filename == missing


def test_training_prints_nothing(tmp_path, capfd):
  """SentencePiece logs every stage at INFO: quiet unless it fails."""
  train(TEXTS, tmp_path / "spm.model", 120)
  out, err = capfd.readouterr()
  assert out == "" and err == ""


def test_lines_longer_than_sentencepieces_limit_are_trained_on(tmp_path):
  """SentencePiece's trainer skips lines over 4,192 bytes without a word: a character seen only
  in them got no piece (<unk>), and a sample of only such lines failed inside SentencePiece."""
  long_line = "Ω " * 2100 + "end"  # 6,303 bytes
  assert len(long_line.encode()) > tok_lib.SPM_MAX_SENTENCE_LENGTH
  # The trainer's argument is raised only past its default of 4,192 bytes (bytes, not
  # characters: "Ω" is two): a sample that fits keeps the default, and its model's bytes.
  limit = tok_lib._sentence_limit
  assert limit([]) == {} and limit(["x" * 4192, "y"]) == {} and limit(["Ω" * 2096]) == {}
  assert limit(["x" * 4193]) == {"max_sentence_length": 4193}
  assert limit(["a", "Ω" * 2097, "x" * 4000]) == {"max_sentence_length": 4194}
  made = train(TEXTS + [long_line] * 3, tmp_path / "mixed" / "spm.model", 120)
  assert tok_lib.UNK_ID not in made.encode("Ω")
  only_long = [(f"word{i} " * 700).strip() for i in range(10)]  # 4,199 bytes each
  made = train(only_long, tmp_path / "long" / "spm.model", 60)
  assert made.detokenize(made.encode(only_long[3])) == only_long[3]


def test_an_empty_sample_names_the_character_budget(tmp_path):
  texts = ["a fairly long first line here"] * 3
  with pytest.raises(DataError, match=r"^data.vocab_max_chars=5 leaves the vocabulary sample "
                     r"empty: the first text in its seeded order has 29 characters. Raise "
                     r"data.vocab_max_chars .*to many times that$"):
    train(texts, tmp_path / "spm.model", 100, max_chars=5)
  with pytest.raises(DataError, match=r"the training split has no text that is not blank"):
    train(["", " \t "], tmp_path / "spm.model", 100)
  assert not os.path.exists(tmp_path / "spm.model")


def test_special_piece_names_in_the_sample_are_warned_of(tmp_path, caplog):
  """SentencePiece's trainer takes `<unk>`, `<s>`, `</s>`, `<pad>` out of its text: "<", "k"
  and "/" seen only inside them got no piece, and such text no longer round-trips."""
  named = ["the <unk> cat </s> sat", "a <unk> <pad> b"]
  with caplog.at_level("WARNING"):
    made = train(TEXTS + named, tmp_path / "a" / "spm.model", 120)
  assert [r.getMessage() for r in caplog.records] == [
      f"vocabulary sample: 2 of {len(TEXTS) + 2} lines hold <unk>, </s>, <pad>, the names of "
      "SentencePiece's special pieces, which its trainer removes from the text: a character "
      "seen only inside them gets no piece and encodes as <unk>. Set "
      "data.vocab_byte_fallback=True (such characters become byte pieces) or take the strings "
      "out of the corpus"]
  assert tok_lib.UNK_ID in made.encode(named[0])  # what the warning is about
  caplog.clear()
  with caplog.at_level("WARNING"):
    made = train(TEXTS + named, tmp_path / "b" / "spm.model", 400, byte_fallback=True)
    train(TEXTS + ["a < b / k"], tmp_path / "c" / "spm.model", 120)
  assert not caplog.records  # byte pieces keep the characters; "<" alone is no name
  assert made.detokenize(made.encode(named[0])) == named[0]
