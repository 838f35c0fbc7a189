"""WMT builders offline through tfds.testing.mock_data; user text corpora; config validation."""
import io
import json
import os
import sys

import numpy as np
import pytest
import tensorflow_datasets as tfds

from transformer_jax.data import DataError, default_data_config, get_data, validate
from transformer_jax.data.config import global_rows, stray_corpus_field


@pytest.mark.parametrize("dataset, source_lang, target_lang", [
    ("wmt14", "en", "de"), ("wmt14", "de", "en"), ("wmt17", "en", "de")])
def test_wmt_through_mock_data(tmp_path, dataset, source_lang, target_lang):
  c = default_data_config()
  c.dataset, c.source_lang, c.target_lang = dataset, source_lang, target_lang
  c.data_dir, c.vocab_size, c.batch_size = str(tmp_path / "tfds"), 100, 8
  with tfds.testing.mock_data(num_examples=40):
    data = get_data(c, str(tmp_path / "work"))
    examples = data.raw_examples("train")
    assert len(examples) == 40
    record = data.sources["train"][0]
    assert set(record) == {"de", "en"}
    source, target = examples[0]
    assert isinstance(source, str) and isinstance(target, str)
    batch = next(iter(data.train_dataset()))
    assert batch["inputs"].shape == (8, 64)
    assert (batch["targets_segmentation"] > 0).any()
    evals = list(data.eval_batches("test"))
    assert sum(b["num_real"] for b in evals) == 40
  # The direction is the config's: the source text is the source language's field.
  assert {s for s, _ in examples} == {
      r[source_lang] if isinstance(r[source_lang], str) else r[source_lang].decode()
      for r in [data.sources["train"][i] for i in range(40)]}


def test_tsv_and_aligned_files(tmp_path):
  lines = [(f"source sentence {i}", f"Zielsatz {i}") for i in range(400)]
  (tmp_path / "corpus.tsv").write_text(
      "".join(f"{s}\t{t}\n" for s, t in lines) + "\n", encoding="utf-8")
  (tmp_path / "src.txt").write_text("".join(s + "\n" for s, _ in lines), encoding="utf-8")
  (tmp_path / "tgt.txt").write_text("".join(t + "\n" for _, t in lines), encoding="utf-8")
  results = []
  for paths in ({"tsv_path": str(tmp_path / "corpus.tsv")},
                {"source_path": str(tmp_path / "src.txt"),
                 "target_path": str(tmp_path / "tgt.txt")}):
    c = default_data_config()
    c.dataset, c.data_dir, c.vocab_size = "text", str(tmp_path / "tfds"), 100
    c.held_out_per_mille = 100
    for key, value in paths.items():
      c[key] = value
    data = get_data(c, str(tmp_path / f"work{len(results)}"))
    splits = {s: data.raw_examples(s) for s in ("train", "validation", "test")}
    assert sorted(sum(splits.values(), [])) == sorted(lines)
    assert not {s for s, _ in splits["train"]} & {s for s, _ in splits["test"]}
    results.append(splits)
  assert results[0] == results[1]  # Same pairs, same hash split, whichever input format.


def test_aligned_files_must_align(tmp_path):
  (tmp_path / "a").write_text("one\ntwo\n")
  (tmp_path / "b").write_text("eins\n")
  c = default_data_config()
  c.dataset, c.data_dir = "text", str(tmp_path / "tfds")
  c.source_path, c.target_path = str(tmp_path / "a"), str(tmp_path / "b")
  # DataError, which the scripts print as one `error:` line.
  with pytest.raises(DataError, match="line-aligned"):
    get_data(c, str(tmp_path / "work"))


def test_lines_split_at_newlines_only(tmp_path):
  """Form feeds, U+0085 and U+2028 inside a sentence (web corpora have them) do not end a line;
  CRLF files read like LF files."""
  (tmp_path / "src").write_bytes("page\x0cbreak\r\nline\u2028sep\nnel\x85x\n".encode())
  (tmp_path / "tgt").write_bytes("Seite\r\nZeile\nNEL\n".encode())
  from transformer_jax.data import builders
  assert builders.read_lines(str(tmp_path / "src")) == ["page\x0cbreak", "line\u2028sep",
                                                         "nel\x85x"]
  pairs = builders.read_parallel_text(None, str(tmp_path / "src"), str(tmp_path / "tgt"))
  assert pairs == [("page break", "Seite"), ("line sep", "Zeile"), ("nel x", "NEL")]


def test_text_corpus_errors_name_the_file(tmp_path, capsys):
  (tmp_path / "latin1.tsv").write_bytes("one\teins\nGr\xfc\xdfe\tgreetings\n".encode("latin-1"))
  c = default_data_config()
  c.dataset, c.data_dir, c.tsv_path = "text", str(tmp_path / "tfds"), str(tmp_path / "latin1.tsv")
  with pytest.raises(ValueError, match=r"latin1.tsv line 2 is not UTF-8.*iconv"):
    get_data(c, str(tmp_path / "work"))
  # Too few pairs for a validation or test split: say so, not TFDS's "No examples were yielded".
  (tmp_path / "small.tsv").write_text("".join(f"s{i}\tt{i}\n" for i in range(5)))
  c.tsv_path = str(tmp_path / "small.tsv")
  with pytest.raises(DataError, match=r"small.tsv: split\(s\) \[.*\] would be empty.*"
                                       r"held_out_per_mille") as e:
    get_data(c, str(tmp_path / "work"))
  assert "of the corpus's near-duplicate groups (pairs sharing a normalized source or target) " \
      "(data.split='grouped_v2'): it has 5. Use a larger corpus" in str(e.value), e.value
  c.split = "source"
  with pytest.raises(DataError, match=r"share of the corpus's distinct sources "
                                       r"\(data.split='source'\): it has 5. Use"):
    get_data(c, str(tmp_path / "work"))
  c.split = "grouped_v2"
  # Groups as the split's mode makes them: a target shared by two pairs joins them; sides of
  # punctuation alone, by their exact text (the legacy "grouped" made one group of all such).
  (tmp_path / "groups.tsv").write_text("s0\tt0\ns1\tt0\nx1\t...\nx2\t?!\n")
  c.tsv_path = str(tmp_path / "groups.tsv")
  for mode, groups in (("grouped_v2", 3), ("grouped", 2)):
    c.split = mode
    with pytest.raises(DataError, match=rf"\(data.split='{mode}'\): it has {groups}; the largest "
                                         r"holds 2 of the 4 pairs \(a target or source.*into "
                                         r"one\)\. Use a larger corpus or raise "
                                         r"data.held_out_per_mille\.$"):
      get_data(c, str(tmp_path / "work"))
  c.split = "grouped_v2"
  # Two aligned files with old Mac line ends: one line each, and a warning says why.
  from transformer_jax.data import builders
  (tmp_path / "cr.en").write_bytes(b"one\rtwo\rthree\r")
  (tmp_path / "cr.de").write_bytes(b"eins\rzwei\rdrei\r")
  capsys.readouterr()
  assert builders.read_parallel_text(None, str(tmp_path / "cr.en"), str(tmp_path / "cr.de")) == [
      ("one two three", "eins zwei drei")]
  assert capsys.readouterr().err == (
      f"{tmp_path / 'cr.en'} and {tmp_path / 'cr.de'}: lines hold a carriage return not "
      "followed by a line feed: lines end at line feeds only, so what it separates is read as "
      "one line; if it ends lines (old Mac line ends), convert them, e.g. with "
      "`tr '\\r' '\\n'`\n")
  # Old Mac line ends beside a file of line feeds: the line counts differ, and the error says why.
  (tmp_path / "lf.de").write_bytes(b"eins\nzwei\ndrei\n")
  with pytest.raises(DataError, match=r"cr.en has 1 lines but .*lf.de has 3: the files must be "
                                       r"line-aligned\. .*cr.en: lines hold a carriage return"):
    builders.read_parallel_text(None, str(tmp_path / "cr.en"), str(tmp_path / "lf.de"))
  # One target across the corpus makes one group of every pair: no share can hold it out.
  (tmp_path / "yes.tsv").write_text("".join(f"question {i}\tJa.\n" for i in range(300)))
  c.tsv_path = str(tmp_path / "yes.tsv")
  with pytest.raises(DataError, match=r"it has 1; the largest holds 300 of the 300 pairs \(a "
                                       r"target or source repeated across the corpus joins its "
                                       r"pairs into one\)\. Use a larger corpus or raise "
                                       r"data.held_out_per_mille; where one group holds most "
                                       r"pairs neither helps .*--config.data.split=source"):
    get_data(c, str(tmp_path / "work"))
  # An empty file is said to be empty (not that held_out_per_mille is too small).
  (tmp_path / "empty.tsv").write_text("\n\n")
  c.tsv_path = str(tmp_path / "empty.tsv")
  with pytest.raises(DataError, match=r"empty.tsv holds no pairs"):
    get_data(c, str(tmp_path / "work"))
  # A wrong path names its field, and the directory a relative one was read from.
  c.tsv_path = "nope/corpus.tsv"
  with pytest.raises(DataError, match=r"data.tsv_path=nope/corpus.tsv \(read from "
                                       rf"{os.getcwd()}\): no such file: pass the path of "
                                       r"your corpus file$"):
    get_data(c, str(tmp_path / "work"))
  c.tsv_path = "~/corpus.tsv"  # `--config.data.tsv_path=~/corpus.tsv`: no shell expands it
  with pytest.raises(DataError, match=r"no such file: pass the path of your corpus file; `~` is "
                                       r"not your home directory here .*: write \$HOME/ instead"):
    get_data(c, str(tmp_path / "work"))
  c.tsv_path, c.source_path, c.target_path = None, str(tmp_path / "latin1.tsv"), str(tmp_path)
  with pytest.raises(DataError, match=rf"data.target_path={tmp_path}: is a directory"):
    get_data(c, str(tmp_path / "work"))
  c.source_path = c.target_path = None
  (tmp_path / "utf32.tsv").write_bytes("one\teins\n".encode("utf-32"))
  c.tsv_path = str(tmp_path / "utf32.tsv")
  with pytest.raises(ValueError, match=r"is UTF-32.*iconv -f UTF-32"):
    get_data(c, str(tmp_path / "work"))
  (tmp_path / "fields.tsv").write_text("one\teins\ntwo\tzwei\textra\n")
  c.tsv_path = str(tmp_path / "fields.tsv")
  with pytest.raises(DataError, match=r"fields.tsv: 1 of 2 lines do not have exactly 2 "
                                       r".*lines \[2\]; line 2 has 3$"):
    get_data(c, str(tmp_path / "work"))
  (tmp_path / "many.tsv").write_text("".join(f"s{i} t{i}\n" for i in range(40)) + "a\tb\n")
  c.tsv_path = str(tmp_path / "many.tsv")
  with pytest.raises(DataError, match=r"40 of 41 lines .*lines \[1, 2, 3, 4, 5, \.\.\.\]; "
                                       r"line 1 has 1$"):
    get_data(c, str(tmp_path / "work"))
  # Old Mac line ends: the whole file is one line.
  (tmp_path / "mac.tsv").write_bytes(b"one\teins\rtwo\tzwei\r")
  c.tsv_path = str(tmp_path / "mac.tsv")
  with pytest.raises(DataError, match=r"lines \[1\]; line 1 has 3\. .*bare carriage return"):
    get_data(c, str(tmp_path / "work"))
  # Excel's "Unicode Text" is UTF-16.
  (tmp_path / "utf16.tsv").write_bytes("one\teins\n".encode("utf-16"))
  c.tsv_path = str(tmp_path / "utf16.tsv")
  with pytest.raises(ValueError, match=r"utf16.tsv line 1 is not UTF-8.*is UTF-16.*"
                                        r"iconv -f UTF-16"):
    get_data(c, str(tmp_path / "work"))


def test_byte_order_mark_is_dropped(tmp_path, monkeypatch):
  """Notepad and Excel start "UTF-8" files with a BOM; whitespace normalisation keeps U+FEFF,
  so the first pair (or the first line to translate) would be a different string."""
  from transformer_jax.data import builders
  bom = b"\xef\xbb\xbf"
  (tmp_path / "corpus.tsv").write_bytes(bom + b"Hello world\tHallo Welt\r\nGood day\tGuten Tag\r\n")
  (tmp_path / "src").write_bytes(bom + b"Hello world\nGood day\n")
  (tmp_path / "tgt").write_bytes(bom + b"Hallo Welt\nGuten Tag\n")
  pairs = [("Hello world", "Hallo Welt"), ("Good day", "Guten Tag")]
  assert builders.read_parallel_text(str(tmp_path / "corpus.tsv"), None, None) == pairs
  assert builders.read_parallel_text(None, str(tmp_path / "src"), str(tmp_path / "tgt")) == pairs
  # translate.py reads its input (stdin for "-") the same way.
  monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(bom + b"I buy 3 dogs.\n")))
  assert builders.read_lines("-") == ["I buy 3 dogs."]
  # The mark alone is an empty file; with a line feed after it, one empty line.
  for data, lines in [(bom, []), (bom + b"\n", [""]), (b"", []), (b"\n\n", ["", ""])]:
    (tmp_path / "src").write_bytes(data)
    assert builders.read_lines(str(tmp_path / "src")) == lines, data


@pytest.mark.parametrize("field, value, message", [
    ("batching", "foo", "data.batching='foo': expected one of 'pack', 'bucket', 'pad'"),
    ("dataset", "wmt99", "data.dataset='wmt99': expected one of"),
    ("vocab_model_type", "char", "data.vocab_model_type='char'"),
    ("batch_size", 0, "data.batch_size=0: expected an integer > 0"),
    ("bucket_boundaries", (0,), "data.bucket_boundaries=.0,.: expected a non-empty sequence"),
    ("bucket_boundaries", (), "data.bucket_boundaries=.*positive integers"),
    ("target_lang", "en", "both 'en'"),
])
def test_validation_names_the_field(field, value, message):
  c = default_data_config()
  c[field] = value
  with pytest.raises(ValueError, match=message.replace("(", r"\(")):
    validate(c)


def test_text_needs_paths():
  c = default_data_config()
  c.dataset = "text"
  with pytest.raises(ValueError, match="data.tsv_path"):
    validate(c)
  c.source_path = "a.en"  # half a pair of files
  with pytest.raises(ValueError, match="data.source_path and data.target_path must both be set"):
    validate(c)


def test_data_checks_have_their_bounds_where_their_messages_say():
  def check(match=None, **fields):
    c = default_data_config()
    c.update(fields)
    if match is None:
      validate(c)
    else:
      with pytest.raises(ValueError, match=match):
        validate(c)

  check(held_out_per_mille=1, bucket_boundaries=(1, 8), shuffle_seed=0, batch_tokens=0)
  check(held_out_per_mille=499)
  for bad in (0, 500):
    check(f"data.held_out_per_mille={bad}: expected 1..499", held_out_per_mille=bad)
  check(r"data.batch_size=-1: expected an integer > 0", batch_size=-1)
  check(r"data.shuffle_seed=-1: expected an integer >= 0", shuffle_seed=-1)
  check(r"data.batch_tokens=-1: expected an integer >= 0", batch_tokens=-1)
  # Rows of a batch given in tokens: at least one, however few the tokens.
  c = default_data_config()
  for tokens, rows in ((0, 64), (1, 1), (10, 1), (128, 2)):
    c.batch_tokens = tokens
    assert global_rows(c) == rows, tokens
  # A corpus field set for another dataset is named, with the dataset it belongs to.
  c = default_data_config()
  assert stray_corpus_field(c) is None
  c.source_path, c.target_path = "a.en", "a.de"
  assert stray_corpus_field(c) == (
      "data.source_path is set but data.dataset='numbers': add --config.data.dataset=text to "
      "train on your files, or drop data.source_path")
  c.dataset = "text"
  assert stray_corpus_field(c) is None
  c.locale_dir = "/usr/share/locale"
  assert stray_corpus_field(c) == (
      "data.locale_dir is set but data.dataset='text': add --config.data.dataset=locale to "
      "train on those catalogs, or drop data.locale_dir")


def test_batch_tokens_sets_rows(tmp_path):
  c = default_data_config()
  c.data_dir, c.numbers_train_size, c.numbers_eval_size = str(tmp_path), 1200, 50
  c.vocab_size, c.batch_tokens = 300, 2048  # 2048 // 64 = 32 rows, 16 per process.
  data = get_data(c, str(tmp_path / "work"), process_index=1, process_count=2)
  assert (data.global_rows, data.rows_per_process) == (32, 16)
  assert next(iter(data.train_dataset()))["inputs"].shape == (16, 64)
  with pytest.raises(ValueError, match="do not split over 3 processes"):
    get_data(c, str(tmp_path / "work"), process_index=0, process_count=3)
  assert np.all(np.asarray(data.tokenizer.encode("2")) > 3)


def test_pairs_left_out_are_counted_when_the_corpus_is_built(tmp_path, capsys):
  from transformer_jax.data import datasets
  lines = [f"s{i}\tt{i}" for i in range(400)] + ["s1\tother", "\tleer", "x\t ", "s2\tagain"]
  (tmp_path / "c.tsv").write_text("\n".join(lines) + "\n")
  c = default_data_config()
  c.dataset, c.data_dir, c.tsv_path = "text", str(tmp_path / "tfds"), str(tmp_path / "c.tsv")
  sources = datasets.load_sources(c)
  assert sum(len(s) for s in sources.values()) == 400
  assert ("c.tsv: 400 of 404 lines kept as pairs; left out: 2 with a blank source or target, "
          "2 repeating an earlier line's source") in capsys.readouterr().err
  datasets.load_sources(c)                               # built already: nothing to say
  assert "kept as pairs" not in capsys.readouterr().err


def test_prepare_data_counts_the_training_pairs_too_long_to_train_on(tmp_path, capsys):
  from transformer_jax.data import raw_split

  from scripts_under_test import load_script
  import tiny_config
  # 40 pairs of 40 words or more a side: over 20 pieces whatever the vocabulary.
  lines = [f"s{i}\tt{i}" for i in range(60)] + [f"s{i} " + "long " * 40 + f"\tt{i}"
                                                 for i in range(60, 100)]
  (tmp_path / "c.tsv").write_text("\n".join(lines) + "\n")
  c = default_data_config()
  c.dataset, c.data_dir, c.tsv_path = "text", str(tmp_path / "tfds"), str(tmp_path / "c.tsv")
  c.held_out_per_mille = 100
  prepare = load_script("prepare_data")
  assert prepare.main(["--config", tiny_config.__file__, "--workdir", str(tmp_path / "w"),
                       f"--config.data.data_dir={c.data_dir}", "--config.data.dataset=text",
                       f"--config.data.tsv_path={c.tsv_path}",
                       "--config.data.held_out_per_mille=100", "--config.data.vocab_size=60",
                       "--config.data.max_source_len=20"]) == 0
  result = json.loads(capsys.readouterr().out)
  train = raw_split(c, "train")
  assert 0 < sum("long" in s for s, _ in train) < 40  # some held out: the count is train's
  # Read a chunk at a time (evaluate.py's overlap check): the same pairs in the same order.
  from transformer_jax.data import datasets, iter_pairs
  source = datasets.load_sources(c)["train"]
  assert len(train) > 7 and list(iter_pairs(source, c, chunk=7)) == train
  assert result["sizes"]["train"] == len(train)
  assert result["too_long_to_train_on"] == {"pairs": sum("long" in s for s, _ in train),
                                            "of": len(train), "max_source_len": 20,
                                            "max_target_len": 32}


def test_blank_tsv_lines_are_counted_as_lines_and_as_blank(tmp_path, capsys):
  """Blank lines with no tab or two ("", spaces, "\t\t") were neither lines nor left out in
  the build's summary, and a file of only such lines said nothing before its error."""
  from transformer_jax.data import builders
  c = default_data_config()
  c.dataset, c.data_dir = "text", str(tmp_path / "tfds")
  pairs = [f"s{i}\tt{i}" for i in range(40)]
  blank = ["", "   ", "\t\t", " \t ", "\t \t"]
  for name, lines, said in (
      ("some.tsv", pairs[:20] + blank + pairs[20:], "40 of 45 lines kept as pairs; left out: 5 "),
      ("only.tsv", blank[:3], "0 of 3 lines kept as pairs; left out: 3 with a blank source ")):
    (tmp_path / name).write_text("\n".join(lines) + "\n")
    c.tsv_path = str(tmp_path / name)
    builders.make_builder(c, c.data_dir)._pairs()
    assert said in capsys.readouterr().err


def test_a_corpus_built_by_another_process_while_this_one_waited_is_read(tmp_path, monkeypatch):
  """Two processes on one data_dir (a sweep's points on a scheduler, a run's hosts): the second
  makes its builder before the first has built the corpus, waits for the lock, and reads the
  first one's files (its builder's info had no splits then: a KeyError from TFDS once)."""
  from transformer_jax.data import builders, datasets
  (tmp_path / "c.tsv").write_text("".join(f"s{i}\tt{i}\n" for i in range(60)))
  c = default_data_config()
  c.dataset, c.data_dir, c.tsv_path = "text", str(tmp_path / "tfds"), str(tmp_path / "c.tsv")
  real, made = builders.prepare, []

  def other_process_first(builder):
    made.append(builder)
    real(datasets.make_builder(c))  # the other process, holding the lock first
    real(builder)

  monkeypatch.setattr(builders, "prepare", other_process_first)
  sources = datasets.load_sources(c)
  assert not made[0].info.splits  # the builder made before the other process's files
  assert sum(len(s) for s in sources.values()) == 60


def test_builder_details_found_by_mutation_testing(tmp_path, capsys, monkeypatch):
  import logging

  from transformer_jax.data import builders, numbers
  # A TSV's bad lines: five listed whole, more with "..."; the first one's fields counted; a bare
  # carriage return looked for in the five shown.
  def error(lines):
    (tmp_path / "bad.tsv").write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError) as e:
      builders._raw_pairs(str(tmp_path / "bad.tsv"), None, None)
    return str(e.value)

  five = ["a\tb\tc", "x", "x", "x", "x\ry", "ok\tgut"]
  assert "lines [1, 2, 3, 4, 5]; line 1 has 3. The file has lines that end in a bare " in (
      error(five))
  six = ["x", "x", "x", "x", "x", "x\ry", "ok\tgut"]
  assert error(six).endswith("lines [1, 2, 3, 4, 5, ...]; line 1 has 1")

  # The numbers task in either direction: its English sentences under "en" both ways.
  c = default_data_config()
  c.data_dir, c.numbers_train_size, c.numbers_eval_size = str(tmp_path / "tfds"), 40, 10
  for source, target, reverse in (("en", "de", False), ("de", "en", True)):
    c.source_lang, c.target_lang = source, target
    assert builders.make_builder(c, c.data_dir)._pairs() == numbers.generate_pairs(
        40, 10, 10, 0, reverse=reverse)

  # A text corpus says what it left out when only blank lines were, and nothing when clean.
  c = default_data_config()
  c.dataset, c.source_lang, c.target_lang = "text", "en", "de"
  for name, extra, said in (("blank.tsv", ["\tleer"], "1 with a blank source or target, 0 "),
                            ("clean.tsv", [], None)):
    (tmp_path / name).write_text("\n".join([f"s{i}\tt{i}" for i in range(40)] + extra) + "\n")
    c.tsv_path = str(tmp_path / name)
    builders.make_builder(c, str(tmp_path / "tfds"))._pairs()
    err = capsys.readouterr().err
    assert (said in err) if said else "kept as pairs" not in err, err

  # A locale corpus's build is named after its own dictionary path, included only when asked.
  catalogs = tmp_path / "locale" / "de" / "LC_MESSAGES"
  catalogs.mkdir(parents=True)
  (catalogs / "a.mo").write_bytes(b"")
  ding = tmp_path / "ding.txt"
  ding.write_text("Haus :: house\n")
  c = default_data_config()
  c.dataset, c.locale_dir, c.locale_ding_path = "locale", str(tmp_path / "locale"), str(ding)
  signature = [builders._file_signature(str(catalogs / "a.mo"))]
  for include, inputs in ((False, signature),
                          (True, signature + [builders._file_signature(str(ding))])):
    c.locale_include_ding = include
    params = builders.make_builder(c, str(tmp_path / "tfds")).builder_config.params
    assert (params["ding_path"], params["inputs"]) == (str(ding), builders._digest(inputs))

  # TFDS's custom-config warning is dropped and nothing else; no progress bars off a terminal.
  def record(msg):
    return logging.LogRecord("absl", logging.WARNING, "", 0, msg, None, None)

  notice = builders._CustomConfigNotice()
  assert not notice.filter(record("Using custom data configuration: x"))
  assert notice.filter(record("Generating splits..."))
  from tensorflow_datasets.core.utils import tqdm_utils
  shown = []
  monkeypatch.setattr(tqdm_utils, "_active", True)
  monkeypatch.setattr(builders.tfds, "display_progress_bar", shown.append)

  class Fake:
    data_dir_root, name = str(tmp_path), "fake"
    builder_config = type("Config", (), {"name": "x"})

    def download_and_prepare(self, file_format):
      pass

  builders.prepare(Fake())
  assert shown == [False, True]  # stderr is captured here: no terminal


def test_lines_come_in_chunks_and_files_are_closed(tmp_path, monkeypatch):
  from transformer_jax.data import lines as lines_lib
  for count, chunks in ((5, [["l0", "l1"], ["l2", "l3"], ["l4"]]),
                        (4, [["l0", "l1"], ["l2", "l3"]]), (0, [])):
    (tmp_path / "f").write_text("".join(f"l{i}\n" for i in range(count)))
    assert list(lines_lib.line_chunks(str(tmp_path / "f"), 2)) == chunks
  assert list(lines_lib.line_chunks(str(tmp_path / "f"))) == [[]]  # all at once: one list
  # A file read is closed; stdin is left open for whoever reads it next.
  opened = []

  def tracking_open(*args, **kwargs):
    opened.append(open(*args, **kwargs))
    return opened[-1]

  monkeypatch.setattr(lines_lib, "open", tracking_open, raising=False)
  (tmp_path / "f").write_text("a\nb\n")
  assert lines_lib.read_lines(str(tmp_path / "f")) == ["a", "b"] and opened[0].closed
  stdin = io.TextIOWrapper(io.BytesIO(b"c\n"))
  monkeypatch.setattr(sys, "stdin", stdin)
  assert lines_lib.read_lines("-") == ["c"] and not stdin.buffer.closed


def test_the_data_dir_is_the_configs_else_tfds_data_dir_else_tfds_default(monkeypatch):
  # Found by mutation testing: only the config's own data_dir was ever used.
  from transformer_jax.data import datasets
  c = default_data_config()
  monkeypatch.setenv("TFDS_DATA_DIR", "/data/tfds")
  c.data_dir = "~/mine"
  assert datasets.default_data_dir(c) == os.path.expanduser("~/mine")
  c.data_dir = None
  assert datasets.default_data_dir(c) == "/data/tfds"
  monkeypatch.delenv("TFDS_DATA_DIR")
  assert datasets.default_data_dir(c) == os.path.expanduser("~/tensorflow_datasets")
