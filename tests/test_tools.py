"""The decoding tools: translate, evaluate, score, average_checkpoints and plot_attention.

One tiny run is trained once for the module (steps 3 and 6 saved); the scripts' `main` functions
are called in-process (one subprocess smoke test checks the command line itself).
"""
import copy
import errno
import hashlib
import io
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import time

import jax
import ml_collections
import numpy as np
import pytest

from transformer_jax import bleu, search
from transformer_jax.data import get_data
from transformer_jax.files import write_atomically
from transformer_jax.inference import attention_maps, evaluation, scoring
from transformer_jax.inference import flags as tool_flags
from transformer_jax.inference import translator as translator_lib
from transformer_jax.run import averaging, checkpointing, loop
from transformer_jax.run import workdir as workdir_lib

from scripts_under_test import load_script
import tiny_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

EVAL_SIZE = 24
LONG = " ".join(["one hundred and twenty three thousand"] * 12)  # well over max_len=32 pieces


translate_script = load_script("translate")
evaluate_script = load_script("evaluate")
score_script = load_script("score")
average_script = load_script("average_checkpoints")
plot_script = load_script("plot_attention")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  """A tiny run trained for 6 steps with checkpoints at steps 3 and 6."""
  root = tmp_path_factory.mktemp("tools")
  c = tiny_config.get_config()
  c.data.data_dir = str(root / "tfds")
  c.data.numbers_eval_size = EVAL_SIZE
  c.data.numbers_train_size = 500
  # The default window (tiny_config's is 1 chunk): the model this module's tests were written
  # against, which must cut a hypothesis at a one-token margin, among others.
  c.data.window_chunks = 16
  c.num_train_steps = 6
  c.checkpoint_every_steps = 3
  path = str(root / "run")
  loop.train_and_evaluate(c, path)
  assert checkpointing.checkpoint_steps(os.path.join(path, "checkpoints")) == [3, 6]
  return path


@pytest.fixture(scope="module")
def translator(workdir):
  return translator_lib.Translator(workdir, batch_size=4)


def run_main(module, argv, capsys, stdin=None, monkeypatch=None):
  if stdin is not None:
    data = stdin if isinstance(stdin, bytes) else stdin.encode("utf-8")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))
  rc = module.main(argv)
  out, err = capsys.readouterr()
  return rc, out, err


# ---------------------------------------------------------------- translate


def test_translate_stdin_keeps_lines_and_survives_odd_input(workdir, capsys, monkeypatch,
                                                            tmp_path):
  lines = ["one hundred and two", "", "   ", "日本語 ☃ seven", LONG, "five"]
  rc, out, err = run_main(translate_script, ["--workdir", workdir, "--batch_size", "2"], capsys,
                          stdin="\n".join(lines) + "\n", monkeypatch=monkeypatch)
  assert rc == 0, err
  outputs = out.split("\n")
  assert outputs[-1] == "" and len(outputs[:-1]) == len(lines)   # one line per input line
  assert outputs[1] == "" and outputs[2] == ""                    # empty stays empty
  # Read whole, as evaluate.py reads it (sinusoidal positions), with a warning naming the line.
  assert ("stdin line 5: 276 pieces, more than the 31 (max_len 32 - 1 for eos) the model was "
          "built for: read whole, as sinusoidal positions extend past max_len, but its "
          "translation stops at 32 tokens\n") in err, err
  assert "line 4" not in err                                      # unknown characters: no warning
  assert err.count("warning:") == 1
  # In chunks of 4 lines: the same output, the warning naming the same line.
  rc, chunked, err = run_main(translate_script, ["--workdir", workdir, "--batch_size", "2",
                                                 "--chunk_lines", "4"], capsys,
                              stdin="\n".join(lines) + "\n", monkeypatch=monkeypatch)
  assert rc == 0 and chunked == out and "stdin line 5: 276 pieces" in err, err
  # A lone carriage return or a form feed inside a line does not end it; CRLF does. The lone
  # carriage return is warned about (old Mac line ends would make the whole file one line).
  rc, out, err = run_main(translate_script, ["--workdir", workdir], capsys,
                          stdin="seven\rone\r\nfive\x0cten\n", monkeypatch=monkeypatch)
  assert rc == 0 and len(out.split("\n")) == 3, err
  assert ("warning: --input stdin: 1 line(s) hold a carriage return not followed by a line feed "
          "(first: line 1)") in err and "tr '\\r' '\\n'" in err, err
  # Read a chunk at a time: a line that is not UTF-8 in the third chunk stops the command with
  # the two chunks before it written; in the first chunk, before the model loads. A carriage
  # return is warned about with the chunk it comes in.
  streamed, never = tmp_path / "streamed.txt", tmp_path / "never.txt"
  bad = b"seven\nfive\none\rten\nsix\nzw\xf6lf\nnine\n"
  rc, _, err = run_main(translate_script, ["--workdir", workdir, "--chunk_lines", "2",
                                           "--output", str(streamed)], capsys, stdin=bad,
                        monkeypatch=monkeypatch)
  assert rc == 1 and "error: stdin line 5 is not UTF-8 (invalid start byte" in err, err
  assert ("--input stdin: 1 line(s) of lines 3-4 hold a carriage return not followed by a line "
          "feed (first: line 3)") in err, err
  assert len(streamed.read_text(encoding="utf-8").splitlines()) == 4
  rc, _, err = run_main(translate_script, ["--workdir", workdir, "--output", str(never)],
                        capsys, stdin=bad, monkeypatch=monkeypatch)
  assert rc == 1 and "stdin line 5 is not UTF-8" in err and not never.exists(), err


def test_translate_writes_utf8_to_stdout_and_names_a_closed_stdin_or_stdout(workdir, capsys,
                                                                           monkeypatch):
  # stdout in a pipe is written UTF-8 as the input is read and --output written, whatever the
  # locale's encoding (here ASCII, which cannot hold the line at all).
  pipe = io.BytesIO()
  out = io.TextIOWrapper(pipe, encoding="ascii")
  out.write("before\n")
  translate_script._write_chunk(out, "zwölf ☃\n", 0, "-")
  assert pipe.getvalue() == "before\nzwölf ☃\n".encode("utf-8")
  # Started with stdin (`<&-`) or stdout (`>&-`) closed: Python's None there, an error here.
  monkeypatch.setattr(sys, "stdin", None)
  rc, _, err = run_main(translate_script, ["--workdir", workdir], capsys)
  assert rc == 1 and "--input -: stdin is closed: give a file, or send the lines to stdin" in err
  monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"seven\n"), encoding="utf-8"))
  monkeypatch.setattr(sys, "stdout", None)
  assert translate_script.main(["--workdir", workdir]) == 1
  assert "stdout is closed: pass --output FILE" in capsys.readouterr().err


def test_a_carriage_return_in_the_first_of_several_chunks_names_its_lines(tmp_path, capsys):
  # Found by mutation testing: the chunk's line range was tested in a later chunk only.
  path = tmp_path / "in.txt"
  path.write_bytes(b"one\rtwo\nthree\nfour\nfive\n")
  assert list(tool_flags.flag_line_chunks("input", str(path), 2)) == [
      ["one\rtwo", "three"], ["four", "five"]]
  assert (f"warning: --input {path}: 1 line(s) of lines 1-2 hold a carriage return not followed "
          "by a line feed (first: line 1)") in capsys.readouterr().err
  # The whole file in its first chunk (fewer lines than a chunk): no range to name.
  assert list(tool_flags.flag_line_chunks("input", str(path), 10)) == [
      ["one\rtwo", "three", "four", "five"]]
  assert f"--input {path}: 1 line(s) hold a carriage return" in capsys.readouterr().err
  # Carriage returns in both chunks, two in the first: one warning, naming the first line.
  path.write_bytes(b"one\rtwo\nthree\rx\nfour\rx\nfive\n")
  list(tool_flags.flag_line_chunks("input", str(path), 2))
  err = capsys.readouterr().err
  assert err.count("warning:") == 1 and "2 line(s) of lines 1-2" in err and "(first: line 1)" in err


def test_batch_size_says_what_a_batch_holds_for_each_tool():
  from absl import flags
  helps = {}
  for searches in (True, False):
    values = flags.FlagValues()
    tool_flags.define_checkpoint_flags(values, search=searches)
    helps[searches] = values["batch_size"].help
  assert helps == {True: "sentences per search batch", False: "sentence pairs per batch"}


def test_translate_arguments_to_file_with_overrides(workdir, tmp_path, capsys):
  out_path = tmp_path / "out.txt"
  rc, out, err = run_main(translate_script, [
      "--workdir", workdir, "--step", "3", "--beam_size", "2", "--alpha", "0.6",
      "--output", str(out_path), "--verbose", "seven", "", "eight hundred"], capsys)
  assert rc == 0, err
  assert out == ""
  assert out_path.read_text(encoding="utf-8").split("\n")[1] == ""
  assert len(out_path.read_text(encoding="utf-8").split("\n")) == 4
  settings = json.loads(err.split("\n")[0][len("translate: "):])   # JSON, for a log parser
  assert settings["step"] == 3 and settings["beam_size"] == 2 and "sentences/s" in err


def test_the_chosen_step_is_the_one_translated_with(workdir):
  """`--step` (through the flags, as the scripts parse them) loads that step's parameters."""
  from absl import flags
  values = flags.FlagValues()
  tool_flags.define_checkpoint_flags(values)
  values(["translate.py", "--workdir", workdir, "--step", "3"])
  t3 = tool_flags.translator_from_flags(values)
  _, p3 = checkpointing.load_params(workdir, 3)
  _, p6 = checkpointing.load_params(workdir, 6)
  leaves = jax.tree.leaves
  assert all(np.array_equal(a, np.asarray(b)) for a, b in zip(leaves(p3), leaves(t3.params)))
  assert not all(np.array_equal(a, b) for a, b in zip(leaves(p3), leaves(p6)))


def test_translate_ids_keeps_the_input_order(translator, monkeypatch):
  """With a search that echoes its source, every output must be its own line's source: the
  length-sorted batches are put back in input order (the tiny model's outputs all look alike,
  so this cannot be checked through real translations)."""
  def echo(inputs, index):
    return inputs.copy(), (inputs != translator.config.pad_id).sum(1).astype(np.int32)

  monkeypatch.setattr(translator, "_search", echo)
  eos = translator.config.eos_id
  sources = [[5, 6, eos], [7, eos], [], [8, 9, 10, 11, eos], [12, eos], [13, 14, eos]]
  assert translator.translate_ids(sources) == [s[:-1] for s in sources]


def test_translation_order_and_batching(translator):
  """Results come back in input order whatever the batching; empty sources are not searched."""
  lines = ["one", "two hundred and three", "four thousand", "", "ninety nine", "six", "seventy"]
  before = translator.stats.sentences
  forward = translator.translate(lines)
  assert translator.stats.sentences - before == len(lines) - 1
  backward = translator.translate(lines[::-1])[::-1]
  assert forward == backward
  assert forward[3] == ""
  # Search settings default to the run's config.json.
  run = workdir_lib.load_run_config(translator.workdir)
  assert (translator.beam_size, translator.alpha, translator.max_len_margin) == (
      run["beam_size"], run["length_penalty_alpha"], run["max_len_margin"])


def test_bucket_shapes_are_bounded(translator):
  shapes = {translator.bucket_shape(rows, length) for rows in range(1, 5)
            for length in range(1, translator.config.max_len + 1)}
  assert {r for r, _ in shapes} == {1, 2, 4} and {n for _, n in shapes} == {16, 32}
  assert translator.bucket_shape(3, 40) == (4, 48)   # untruncated (evaluation) sources


def test_unknown_characters_use_unk(translator):
  (ids,) = translator.encode(["☃"])
  assert translator.tokenizer.unk_id in ids and ids[-1] == translator.tokenizer.eos_id


def test_actionable_errors(workdir, tmp_path, capsys, monkeypatch):
  rc, _, err = run_main(translate_script, ["--workdir", str(tmp_path), "one"], capsys)
  assert rc == 1 and "not the workdir of a training run" in err and "scripts/train.py" in err
  empty = tmp_path / "empty"
  empty.mkdir()
  shutil.copy(os.path.join(workdir, "config.json"), empty)
  shutil.copy(os.path.join(workdir, "spm.model"), empty)
  rc, _, err = run_main(translate_script, ["--workdir", str(empty), "one"], capsys)
  assert rc == 1
  assert (f"no checkpoint in {empty}/checkpoints: train first with python scripts/train.py "
          f"--workdir {empty} (it trains with the run's own config.json)") in err, err
  rc, _, err = run_main(translate_script, ["--workdir", workdir, "--step", "4", "one"], capsys)
  assert rc == 1 and "available steps [3, 6]" in err
  rc, _, err = run_main(translate_script, ["--workdir", str(empty), "--averaged", "one"], capsys)
  assert rc == 1 and "average_checkpoints.py" in err
  rc, _, err = run_main(evaluate_script, ["--workdir", str(empty)], capsys)
  assert rc == 1 and "train first" in err
  # Input that is not UTF-8 names the line; an unwritable output fails before translating.
  latin1 = tmp_path / "latin1.txt"
  latin1.write_bytes("seven\nGr\xfc\xdfe\n".encode("latin-1"))
  rc, out, err = run_main(translate_script, ["--workdir", workdir, "--input", str(latin1)], capsys)
  assert rc == 1 and f"{latin1} line 2 is not UTF-8" in err and out == ""
  rc, _, err = run_main(translate_script, ["--workdir", workdir], capsys,
                        stdin=b"seven\n\xff\n", monkeypatch=monkeypatch)
  assert rc == 1 and "stdin line 2 is not UTF-8" in err
  # An argument the locale could not decode (Python keeps its bytes as surrogate escapes).
  escaped = b"I buy \xff apples".decode("utf-8", "surrogateescape")
  rc, out, err = run_main(translate_script, ["--workdir", workdir, "seven", escaped], capsys)
  assert rc == 1 and "error: argument 2 is not UTF-8 (at character 7)" in err and out == "", err
  rc, _, err = run_main(translate_script, ["--workdir", workdir, "--output",
                                           str(tmp_path / "no" / "such" / "dir.txt"), "one"],
                        capsys)
  assert rc == 1 and "No such file or directory" in err


def test_translate_names_the_input_flag_of_a_missing_file(workdir, tmp_path, capsys):
  missing = tmp_path / "missing.txt"
  rc, out, err = run_main(translate_script, ["--workdir", workdir, "--input", str(missing)],
                          capsys)
  assert rc == 1 and out == ""
  assert f"error: --input {missing}: No such file or directory" in err, err


def test_missing_and_unwritable_files_name_their_flag(workdir, tmp_path, capsys):
  """Not `[Errno 2] No such file or directory: 'nope.en'`, which names no flag."""
  src, missing = tmp_path / "src.en", tmp_path / "nope.en"
  src.write_text("seven\n", encoding="utf-8")
  for argv, flag in ((["--source", str(missing), "--reference", str(src)], "source"),
                     (["--source", str(src), "--reference", str(missing)], "reference")):
    rc, out, err = run_main(evaluate_script, ["--workdir", workdir] + argv, capsys)
    assert rc == 1 and out == "", err
    assert err == f"error: --{flag} {missing}: No such file or directory\n", err
  # A corpus's TSV given as the test set: every "sentence" would hold both sides.
  tsv = tmp_path / "pairs.tsv"
  tsv.write_text("seven\tsieben\n\neight\tacht\n", encoding="utf-8")
  rc, out, err = run_main(evaluate_script, ["--workdir", workdir, "--source", str(tsv),
                                            "--reference", str(tsv)], capsys)
  assert rc == 1 and out == "", err
  assert err.startswith(f"error: every line of --source {tsv} holds a tab: a TSV of pairs?"), err
  assert f"`cut -f1 {tsv} > source.txt`" in err
  # Empty files: named, before the model is loaded (not "the src split is empty").
  empty = tmp_path / "empty.en"
  empty.write_text("")
  rc, out, err = run_main(evaluate_script, ["--workdir", workdir, "--source", str(empty),
                                            "--reference", str(empty)], capsys)
  assert rc == 1 and out == "", err
  assert err.startswith(f"error: --source {empty} and --reference {empty} are empty: "), err
  unwritable = tmp_path / "nonexistent" / "x.txt"
  rc, out, err = run_main(translate_script, ["--workdir", workdir, "--output", str(unwritable),
                                             "seven"], capsys)
  assert rc == 1 and out == "", err
  assert err == f"error: --output {unwritable}: No such file or directory\n", err
  # evaluate's --output_dir fails before the search, not after it.
  blocked = tmp_path / "a_file" / "eval"
  (tmp_path / "a_file").write_text("")
  rc, out, err = run_main(evaluate_script, ["--workdir", workdir, "--source", str(src),
                                            "--reference", str(src), "--output_dir",
                                            str(blocked)], capsys)
  assert rc == 1 and out == "" and err.count("\n") == 1, err
  assert err.startswith(f"error: cannot create the output directory {blocked}: Not a "
                        "directory; pass --output_dir DIR"), err
  # So does the copy baseline's, before it scores anything.
  rc, out, err = run_main(evaluate_script, ["--workdir", workdir, "--baseline", "copy",
                                            "--output_dir", str(blocked)], capsys)
  assert rc == 1 and out == "" and err.count("\n") == 1, err
  assert err.startswith(f"error: cannot create the output directory {blocked}: Not a "
                        "directory; pass --output_dir DIR"), err


def assert_overlap_skipped_or_unbuilt(script, argv, source, tmp_path, capsys):
  """`script` (evaluate.py, score.py) run with `argv`, a `--source` test set of one's own: with
  --nocheck_overlap it reads no training pairs; with a --data_dir where the run's dataset is not
  built it scores the pairs, compares none, and says why."""
  rc, out, err = run_main(script, argv + ["--nocheck_overlap"], capsys)
  assert rc == 0 and "train_overlap" not in json.loads(out) and "trained on" not in err, err
  rc, out, err = run_main(script, argv + ["--data_dir", str(tmp_path / "none")], capsys)
  assert rc == 0 and json.loads(out)["train_overlap"] is None, err
  assert (f"--source {source}: not compared with the run's training pairs: the run's dataset "
          f"is not built in {tmp_path / 'none'} (pass --data_dir") in err, err


def test_a_test_set_of_ones_own_is_compared_with_the_training_pairs(workdir, tmp_path, capsys):
  """Sentences the run trained on score what the model remembers: evaluate.py names the lines of
  a --source test set whose source or reference is a training pair's, verbatim or up to case
  and punctuation, and counts them in the result."""
  from transformer_jax.data import raw_split
  run = translator_lib.workdir_config(workdir)
  train = raw_split(evaluation.data_config(run, workdir), "train")
  (s0, t0), (s1, t1), (s2, _) = train[:3]
  novel = [("Qxq zzv.", "Vvz qxq."), ("Zzq qq.", "Qq zzq.")]
  pairs = [novel[0], (s0, t0), (s1.upper() + " !", "x"), novel[1], ("y", t1), (s2, "z")]
  src, ref = tmp_path / "own.src", tmp_path / "own.ref"
  src.write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
  ref.write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
  own = ["--workdir", workdir, "--source", str(src), "--reference", str(ref), "--baseline",
         "copy", "--output_dir", str(tmp_path / "out")]
  rc, out, err = run_main(evaluate_script, own, capsys)
  assert rc == 0, err
  assert json.loads(out)["train_overlap"] == {
      "pairs": 6, "exact_source": 2, "normalized_source": 3, "verbatim_target": 2,
      "normalized_target": 2, "any_normalized": 4}
  assert (f"--source {src}: 4 (lines 2, 3, 5, 6) of 6 pairs have a source or reference that "
          "the run trained on (2 sources and 2 references verbatim") in err, err
  assert_overlap_skipped_or_unbuilt(evaluate_script, own, src, tmp_path, capsys)


def test_flags_the_command_would_ignore_are_refused(workdir, tmp_path, capsys):
  src = tmp_path / "src.en"
  src.write_text("seven\n", encoding="utf-8")
  own = ["--workdir", workdir, "--source", str(src), "--reference", str(src)]
  cases = [
      (evaluate_script, own + ["--split", "test"], "--split is ignored with --source/--reference",
       "drop --split, or drop --source and --reference to score the split"),
      (evaluate_script, own + ["--nocheck_overlap", "--data_dir", str(tmp_path)],
       "--data_dir is ignored with --source/--reference and --nocheck_overlap",
       "drop --data_dir, or drop --nocheck_overlap"),
      (evaluate_script, ["--workdir", workdir, "--check_overlap"], "--check_overlap is ignored "
       "without --source/--reference", "drop --check_overlap"),
      (evaluate_script, ["--workdir", workdir, "--name", "x", "--check_overlap"],
       "--name --check_overlap are ignored without --source/--reference",
       "drop --name --check_overlap"),
      (evaluate_script, ["--workdir", workdir, "--name", "nt14"], "--name is ignored without "
       "--source/--reference", "drop --name"),
      (evaluate_script, ["--workdir", workdir, "--baseline", "copy", "--beam_size", "4"],
       "--beam_size is ignored with --baseline copy, which uses no model",
       "drop --beam_size, or drop --baseline to evaluate the model"),
      (evaluate_script, own + ["--baseline", "copy", "--step", "3", "--alpha", "0.6",
                               "--averaged", "--checkpoint", workdir],
       "--step --checkpoint --averaged --alpha are ignored with --baseline copy", "drop --step "
       "--checkpoint --averaged --alpha"),
      (translate_script, ["--workdir", workdir, "--input", str(src), "seven"],
       "--input is ignored when sentences are given as arguments",
       "pass either --input or the sentences"),
  ]
  for script, argv, ignored, what_to_do in cases:
    rc, out, err = run_main(script, argv, capsys)
    assert rc == 1 and out == "" and err.count("\n") == 1, (argv, err)
    assert err.startswith(f"error: {ignored}") and what_to_do in err, (argv, err)
  # The same flags at their defaults, or not contradicted, are no error.
  rc, out, err = run_main(evaluate_script, ["--workdir", workdir, "--split", "test",
                                            "--baseline", "copy"], capsys)
  assert rc == 0, err
  # A boolean given as False asks for what the baseline does anyway; given as True it is refused
  # (however written), and so is another flag typed at its default value.
  for argv in (["--noaveraged"], ["--averaged=false"]):
    rc, out, err = run_main(evaluate_script, ["--workdir", workdir, "--baseline", "copy"] + argv,
                            capsys)
    assert rc == 0 and "error" not in err, (argv, err)
  for argv, ignored in ((["--averaged=true"], "--averaged"), (["--batch_size", "64"],
                                                              "--batch_size"),
                        (["--noaveraged", "--batch_size=64"], "--batch_size")):
    rc, out, err = run_main(evaluate_script, ["--workdir", workdir, "--baseline", "copy"] + argv,
                            capsys)
    assert rc == 1 and err == (f"error: {ignored} is ignored with --baseline copy, which uses no "
                               f"model: drop {ignored}, or drop --baseline to evaluate the "
                               "model\n"), (argv, err)
  rc, out, err = run_main(evaluate_script, own + ["--baseline", "copy", "--name", "nt14",
                                                  "--output_dir", str(tmp_path / "out")], capsys)
  assert rc == 0, err


def test_a_run_made_by_other_code_is_refused_naming_its_config_file(workdir, tmp_path, capsys):
  """A model field this code does not know was dropped, decoding another model than the one
  trained; a value it refuses was a ValueError traceback."""
  run = str(tmp_path / "run")
  shutil.copytree(workdir, run)
  path = os.path.join(run, "config.json")
  with open(path) as f:
    config = json.load(f)
  config["resolved_model"]["field_of_other_code"] = 10000.0
  with open(path, "w") as f:
    json.dump(config, f)
  for script, argv in ((translate_script, ["seven"]), (evaluate_script, ["--examples", "0"])):
    rc, out, err = run_main(script, ["--workdir", run] + argv, capsys)
    assert rc == 1 and out == "" and err.count("\n") == 1, err
    assert err.startswith(f"error: {path} has model fields this code does not know: "
                          "['field_of_other_code'] (in resolved_model)"), err
    assert "made by other code: check out the code that trained it" in err
    assert "remove them from resolved_model if you know they are inert" in err
  del config["resolved_model"]["field_of_other_code"]
  config["resolved_model"]["activation"] = "activation_of_other_code"
  with open(path, "w") as f:
    json.dump(config, f)
  rc, out, err = run_main(translate_script, ["--workdir", run, "seven"], capsys)
  assert rc == 1 and out == "" and err.count("\n") == 1 and "Traceback" not in err, err
  assert err.startswith(f"error: {path} has a model value this code refuses (in "
                        "resolved_model): TransformerConfig.activation="
                        "'activation_of_other_code'"), err
  assert "made by other code" in err


def test_a_model_value_of_the_wrong_type_is_refused_naming_the_field(workdir, tmp_path, capsys):
  """`max_len: "64"` was a TypeError from TransformerConfig's checks ("'<=' not supported
  between instances of 'str' and 'int'") naming no field; the decode benchmark's error named
  no file either."""
  from transformer_jax.bench import decode as bench_decode
  run = str(tmp_path / "run")
  shutil.copytree(workdir, run)
  path = os.path.join(run, "config.json")
  with open(path) as f:
    config = json.load(f)
  model = config["resolved_model"]
  config["resolved_model"] = {**model, "max_len": "64"}
  with open(path, "w") as f:
    json.dump(config, f)
  rc, out, err = run_main(translate_script, ["--workdir", run, "seven"], capsys)
  assert rc == 1 and out == "" and err.count("\n") == 1, err
  assert err == (f"error: {path} has max_len='64' in resolved_model, where this code expects "
                 "int: the run was made by other code: check out the code that trained it to "
                 "decode with it\n"), err
  with pytest.raises(workdir_lib.RunError) as e:
    bench_decode.trained_run(run)
  assert str(e.value).startswith(f"{path} has max_len='64' in resolved_model"), e.value
  # A bool is no number, nor a number a bool; an int is a float, and None fits `int | None`.
  for field, value, expected in (("max_len", True, "int"), ("share_embeddings", 1, "bool"),
                                 ("dropout_rate", "0.1", "float"),
                                 ("target_vocab_size", "7", "int or None"),
                                 ("activation", None, "str")):
    with pytest.raises(workdir_lib.RunError, match=f"has {field}={value!r} in resolved_model, "
                       f"where this code expects {expected}: "):
      translator_lib.model_config_from({"resolved_model": {**model, field: value}}, "c.json")
  fine = translator_lib.model_config_from(
      {"resolved_model": {**model, "dropout_rate": 0, "target_vocab_size": None}}, "c.json")
  assert (fine.dropout_rate, fine.target_vocab_size) == (0, None)


def test_the_train_hint_of_a_run_with_a_config_resumes_it(workdir, tmp_path, capsys):
  """With a config.json, `train.py --config configs/default.py` would be refused (another
  model) or train the wrong one: the run trains with its own config."""
  spaced = tmp_path / "my run"
  spaced.mkdir()
  shutil.copy(os.path.join(workdir, "config.json"), spaced)
  shutil.copy(os.path.join(workdir, "spm.model"), spaced)
  hint = f"train first with python scripts/train.py --workdir '{spaced}' (it trains with the " \
      "run's own config.json)"
  for script, argv in ((translate_script, ["seven"]), (evaluate_script, []),
                       (average_script, [])):
    rc, _, err = run_main(script, ["--workdir", str(spaced)] + argv, capsys)
    assert rc == 1 and hint in err and "configs/default.py" not in err, err
  # Without a config.json there is none to train with: the default config's command.
  assert workdir_lib.train_hint(str(tmp_path / "new")) == (
      f"train first with scripts/train.py --config configs/default.py --workdir {tmp_path}/new")
  # A directory of runs (here the runs one and two levels down): one of them, not a new run.
  parent = tmp_path / "runs[1]"   # a name that is a glob pattern: taken as it is
  for run in ("a", "b", "c", "d", os.path.join("sweep", "lr=1")):
    (parent / run / "checkpoints").mkdir(parents=True)
  assert workdir_lib.train_hint(str(parent)) == (
      f"{parent} holds runs ({parent}/a, {parent}/b, {parent}/c and 2 more): give one of them "
      "as --workdir")
  rc, _, err = run_main(evaluate_script, ["--workdir", str(parent)], capsys)
  assert rc == 1 and f"{parent} holds runs ({parent}/a," in err and "train first" not in err
  shutil.rmtree(parent / "sweep")
  assert workdir_lib.train_hint(str(parent)).startswith(f"{parent} holds runs ({parent}/a, "
                                                        f"{parent}/b, {parent}/c and 1 more)")
  shutil.rmtree(parent / "d")
  assert workdir_lib.train_hint(str(parent)).startswith(f"{parent} holds runs ({parent}/a, "
                                                        f"{parent}/b, {parent}/c): give")
  # A run a live process of this host is training, before its first checkpoint: wait for it.
  with open(spaced / ".lock", "w") as f:
    json.dump({"host": socket.gethostname(), "pid": os.getpid(), "started": "12:00"}, f)
  rc, _, err = run_main(evaluate_script, ["--workdir", str(spaced)], capsys)
  assert rc == 1 and (f"a run is training in it now (pid {os.getpid()}, started 12:00) and has "
                      "not written it yet: wait for its first checkpoint") in err, err
  # A best_<metric>/ that is not there: kept only by a run trained to keep it.
  best = os.path.join(workdir, "best_bleu")
  rc, out, err = run_main(translate_script, ["--workdir", workdir, "--checkpoint", best,
                                             "seven"], capsys)
  assert rc == 1 and out == "" and err.count("\n") == 1, err
  assert (f"error: --checkpoint {best} does not exist: a run keeps best_<metric>/ only when "
          "trained with --config.keep_best=<metric>") in err, err
  assert "--config.keep_best=bleu" in err
  # The same run's best_bleu written another way gets the advice too; a best_<name> of another
  # directory, or for a name keep_best refuses, is just a missing checkpoint.
  also = os.path.join(workdir, "checkpoints", "..", "best_bleu")
  rc, _, err = run_main(translate_script, ["--workdir", workdir, "--checkpoint", also, "seven"],
                        capsys)
  assert rc == 1 and "--config.keep_best=bleu" in err, err
  for path in (os.path.join(workdir, "best_model"), str(tmp_path / "best_bleu")):
    rc, _, err = run_main(translate_script, ["--workdir", workdir, "--checkpoint", path,
                                             "seven"], capsys)
    assert rc == 1 and err == (f"error: no checkpoint in {path}: pass a workdir, its checkpoints "
                               "or averaged directory, or one checkpoints/<step> directory\n"), err


def test_search_settings_that_would_be_ignored_or_break_the_search_are_refused(workdir,
                                                                              capsys):
  """--alpha with greedy search (no length penalty: it would be recorded as if applied), a
  non-finite --alpha (empty translations), a beam wider than the vocabulary (out of memory)."""
  base = ["--workdir", workdir]
  vocab = translator_lib.Translator(workdir).config.vocab_size
  cases = [
      (["--alpha", "3", "seven"], "error: alpha=3.0 is ignored by greedy search (beam_size 1, "
       f"the run's config.beam_size in {workdir}/config.json), which has no length penalty: "
       "pass a "
       "beam_size of 2 or more with it, or drop it\n"),
      (["--beam_size", "1", "--alpha", "0.6", "seven"], "error: alpha=0.6 is ignored by greedy "
       "search (beam_size 1), which has no length penalty: pass a beam_size of 2 or more with "
       "it, or drop it\n"),
      (["--beam_size", "2", "--alpha", "nan", "seven"], "error: alpha=nan: the length penalty "
       "must be a finite number (the paper's is 0.6)\n"),
      (["--beam_size", "2", "--alpha", "inf", "seven"], "error: alpha=inf: "),
      (["--beam_size", str(vocab + 1), "seven"], f"error: beam_size={vocab + 1} is wider than "
       f"the vocabulary ({vocab} pieces): at most {vocab}\n"),
  ]
  for argv, message in cases:
    rc, out, err = run_main(translate_script, base + argv, capsys)
    assert rc == 1 and out == "" and err.startswith(message), (argv, err)
  rc, out, err = run_main(evaluate_script, base + ["--split", "test", "--alpha", "1.0"], capsys)
  assert rc == 1 and "is ignored by greedy search" in err, err
  # A beam as wide as the vocabulary, and an alpha with a beam, are searches.
  assert translator_lib.Translator(workdir, beam_size=vocab).beam_size == vocab
  rc, out, err = run_main(translate_script, base + ["--beam_size", "2", "--alpha", "-0.5",
                                                    "seven"], capsys)
  assert rc == 0 and out.count("\n") == 1, err


def test_an_out_of_memory_search_is_one_error_line(workdir, capsys, monkeypatch):
  """XLA's RESOURCE_EXHAUSTED (a batch or beam too big for the device): what to make smaller,
  not a traceback."""
  def exhausted(*args, **kwargs):
    raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating "
                                     "52208244152 bytes.\nmore detail")
  monkeypatch.setattr(translator_lib, "search_batch", exhausted)
  rc, out, err = run_main(translate_script, ["--workdir", workdir, "seven"], capsys)
  assert rc == 1 and err == (
      "error: out of memory (RESOURCE_EXHAUSTED: Out of memory allocating 52208244152 bytes.): "
      "when decoding, fewer sentences per batch (--batch_size) or a narrower beam "
      "(--beam_size); when training, the same tokens per step in smaller pieces "
      "(--config.grad_accum_steps=N), recomputed activations (--config.model.remat=layer), or "
      "smaller evaluation batches (--config.data.eval_batch_size)\n"), err
  # Any other runtime error is a bug, or not the device's memory: its traceback stays.
  for message in ("INTERNAL: something else", "RESOURCE_EXHAUSTED: too many open streams"):
    def other(*args, message=message, **kwargs):
      raise jax.errors.JaxRuntimeError(message)
    monkeypatch.setattr(translator_lib, "search_batch", other)
    with pytest.raises(jax.errors.JaxRuntimeError, match=message):
      translate_script.main(["--workdir", workdir, "seven"])


def test_translate_from_a_terminal_says_it_is_reading(workdir, capsys, monkeypatch):
  """A bare `translate.py --workdir W` on a terminal waited without a word, and looked hung."""
  class Terminal(io.TextIOWrapper):
    def isatty(self):
      return True
  monkeypatch.setattr(sys, "stdin", Terminal(io.BytesIO(b"seven\n"), encoding="utf-8"))
  rc, out, err = run_main(translate_script, ["--workdir", workdir], capsys)
  assert rc == 0 and err.startswith("translate: reading sentences from the terminal, one a "
                                    "line; end with Ctrl-D"), err
  assert out.count("\n") == 1


def test_what_is_not_a_workdir_is_told_what_to_pass(workdir, tmp_path, capsys):
  """Not "train first": a missing path, a run's checkpoints or one step of them, a sweep."""
  missing = tmp_path / "no_such_run"
  rc, _, err = run_main(translate_script, ["--workdir", str(missing), "one"], capsys)
  assert rc == 1 and f"--workdir {missing} does not exist" in err and "train first" not in err
  step_dir = os.path.join(workdir, "checkpoints", "6")
  rc, _, err = run_main(evaluate_script, ["--workdir", step_dir], capsys)
  assert rc == 1 and f"pass --workdir {workdir} --step 6" in err and "train first" not in err
  rc, _, err = run_main(translate_script, ["--workdir", os.path.join(workdir, "checkpoints"),
                                           "one"], capsys)
  assert rc == 1 and f"pass --workdir {workdir}, with --step N" in err and "steps [3, 6]" in err
  rc, _, err = run_main(average_script, ["--workdir", os.path.join(workdir, "checkpoints")],
                        capsys)
  assert rc == 1 and f"pass --workdir {workdir}" in err and "train first" not in err
  assert "--step" not in err and "--checkpoint" not in err, err   # flags it does not have
  rc, _, err = run_main(average_script, ["--workdir", step_dir], capsys)
  assert rc == 1 and err.rstrip().endswith(f"pass --workdir {workdir}"), err
  run = tmp_path / "run"   # a run's averaged/: its workdir with --averaged
  _, params = checkpointing.load_params(workdir, 3)
  checkpointing.save_params(str(run / "averaged"), 3, params, {"averaged_steps": [3]})
  rc, _, err = run_main(translate_script, ["--workdir", str(run / "averaged"), "one"], capsys)
  assert rc == 1 and f"pass --workdir {run} --averaged" in err, err
  sweep = tmp_path / "sweep"
  (sweep / "learning_rate=1").mkdir(parents=True)
  (sweep / "sweep.json").write_text("{}")
  shutil.copy(os.path.join(workdir, "config.json"), sweep / "learning_rate=1")
  rc, _, err = run_main(evaluate_script, ["--workdir", str(sweep), "--baseline", "copy"], capsys)
  assert rc == 1 and "is a sweep (it holds sweep.json)" in err, err
  assert f"pass one point's workdir as --workdir:\n  {sweep}/learning_rate=1" in err
  assert "train first" not in err


def _swap_two_pieces(spm_path: str) -> None:
  """Another tokenizer with the same vocabulary size: two pieces change places."""
  from sentencepiece import sentencepiece_model_pb2
  model = sentencepiece_model_pb2.ModelProto()
  with open(spm_path, "rb") as f:
    model.ParseFromString(f.read())
  model.pieces[-1].piece, model.pieces[-2].piece = model.pieces[-2].piece, model.pieces[-1].piece
  with open(spm_path, "wb") as f:
    f.write(model.SerializeToString())


def test_a_checkpoint_of_a_run_with_another_tokenizer_is_refused(workdir, tmp_path, capsys):
  """Same vocabulary size, other pieces: it used to decode silently with the wrong tokenizer."""
  same = str(tmp_path / "same")
  shutil.copytree(workdir, same)
  rc, out, err = run_main(translate_script, ["--workdir", workdir, "--checkpoint",
                                             os.path.join(same, "checkpoints"), "seven"], capsys)
  assert rc == 0 and out.count("\n") == 1, err   # the same spm.model: fine
  other = str(tmp_path / "other")
  shutil.copytree(workdir, other)
  _swap_two_pieces(os.path.join(other, "spm.model"))
  # The same size and time stamp as this run's: only the bytes can tell them apart.
  mine = os.stat(os.path.join(workdir, "spm.model"))
  os.utime(os.path.join(other, "spm.model"), ns=(mine.st_atime_ns, mine.st_mtime_ns))
  assert os.path.getsize(os.path.join(other, "spm.model")) == mine.st_size
  for checkpoint in (other, os.path.join(other, "checkpoints"),
                     os.path.join(other, "checkpoints", "3")):
    rc, out, err = run_main(translate_script, ["--workdir", workdir, "--checkpoint", checkpoint,
                                               "seven"], capsys)
    assert rc == 1 and out == "", err
    assert (f"belongs to the run {other}, trained with the tokenizer {other}/spm.model, which "
            f"differs from {workdir}/spm.model") in err, err
    assert f"pass --workdir {other} instead" in err
  # A run trained with data.vocab_path has no spm.model of its own: its vocab_path is read.
  shared = str(tmp_path / "shared.model")
  os.replace(os.path.join(other, "spm.model"), shared)
  with open(os.path.join(other, "config.json")) as f:
    run = json.load(f)
  run["data"]["vocab_path"] = shared
  with open(os.path.join(other, "config.json"), "w") as f:
    json.dump(run, f)
  rc, out, err = run_main(translate_script, ["--workdir", workdir, "--checkpoint", other,
                                             "seven"], capsys)
  assert rc == 1 and f"trained with the tokenizer {shared}, which differs" in err, err


def test_parameters_of_another_model_are_refused_naming_the_parameter(workdir, tmp_path,
                                                                       capsys):
  """A checkpoint of another vocabulary size: one line naming the parameter, not Flax's
  ScopeParamShapeError traceback."""
  _, params = checkpointing.load_params(workdir, 6)
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  path, table = next((p, x) for p, x in flat if "embed" in jax.tree_util.keystr(p))
  name = "/".join(k.key for k in path)
  bigger = jax.tree_util.tree_map_with_path(
      lambda p, x: np.concatenate([x, x[:8]]) if p == path else x, params)
  elsewhere = str(tmp_path / "elsewhere")
  checkpointing.save_params(elsewhere, 6, bigger, {})
  rc, out, err = run_main(translate_script, ["--workdir", workdir, "--checkpoint", elsewhere,
                                             "seven"], capsys)
  assert rc == 1 and out == "" and "Traceback" not in err, err
  wider = (table.shape[0] + 8,) + table.shape[1:]
  assert (f"the parameters in {elsewhere}/6 do not fit the model of {workdir}: {name} has "
          f"shape {wider} there but {table.shape} in the model") in err, err
  assert err.count("\n") == 1
  # The run's own checkpoint that no longer fits: the code changed, not the run (the advice to
  # pass "the workdir of the run these parameters were trained in" named the one given).
  run = str(tmp_path / "run")
  shutil.copytree(workdir, run)
  shutil.rmtree(os.path.join(run, "averaged"), ignore_errors=True)
  checkpointing.save_params(os.path.join(run, "averaged"), 6, bigger, {"averaged_steps": [6]})
  rc, out, err = run_main(translate_script, ["--workdir", run, "--averaged", "seven"], capsys)
  assert rc == 1 and err.startswith(
      f"error: the parameters in {run}/averaged/6 do not fit the model this code builds from "
      f"the run's config.json: {name} has shape {wider} there but {table.shape} in the model. "
      "The model code changed since the run was trained"), err
  assert "pass the workdir" not in err


def test_a_stale_average_is_warned_about(workdir, tmp_path, capsys, monkeypatch):
  run = str(tmp_path / "run")
  shutil.copytree(workdir, run)
  shutil.rmtree(os.path.join(run, "averaged"), ignore_errors=True)
  _, p3 = checkpointing.load_params(run, 3)
  checkpointing.save_params(os.path.join(run, "averaged"), 3, p3, {"averaged_steps": [3]})
  rc, out, err = run_main(translate_script, ["--workdir", run, "--averaged", "seven"], capsys)
  assert rc == 0 and out.count("\n") == 1, err
  warnings = [line for line in err.splitlines() if line.startswith("warning:")]
  assert len(warnings) == 1 and "has reached step 6" in warnings[0], err
  assert f"re-run scripts/average_checkpoints.py --workdir {run}" in warnings[0]
  # Against the latest checkpoint, not the second: with checkpoints at 2, 3 and 9, the average
  # of step 3 is stale.
  real_steps, checkpoints = checkpointing.checkpoint_steps, os.path.join(run, "checkpoints")
  monkeypatch.setattr(translator_lib.checkpointing, "checkpoint_steps",
                      lambda path: [2, 3, 9] if path == checkpoints else real_steps(path))
  translator_lib.Translator(run, averaged=True)
  assert "has reached step 9" in capsys.readouterr().err
  monkeypatch.undo()
  rc, _, err = run_main(average_script, ["--workdir", run, "--last", "1"], capsys)
  assert rc == 0, err
  rc, _, err = run_main(translate_script, ["--workdir", run, "--averaged", "seven"], capsys)
  assert rc == 0 and "warning:" not in err, err


# ---------------------------------------------------------------- evaluate


def test_nbest_lists_the_searches_finished_hypotheses_with_their_log_probabilities(translator,
                                                                                    capsys):
  lines = ["one hundred and two", "", "seven thousand and three", "twelve"]
  beam = translator.with_search(4, 0.6)
  nbest = beam.translate_nbest(lines, 4)
  # Rank 1 is what translate gives with the same search; scores best first, at most 4.
  assert [h[0][0] for h in nbest] == beam.translate(lines)
  assert nbest[1] == [("", 0.0, 0.0)]  # an empty line: not searched
  for hypotheses in nbest:
    assert 1 <= len(hypotheses) <= 4
    assert [h[1] for h in hypotheses] == sorted((h[1] for h in hypotheses), reverse=True)
  # The log-probability is the teacher-forced one of the hypothesis's pieces (and EOS): the
  # score times the length penalty, which scoring the same ids gives back.
  sources = beam.encode(lines)
  ids = beam.nbest_ids(sources, 4)
  pairs = [(i, hyp) for i, hyps in enumerate(ids) if sources[i] for hyp in hyps]
  # (A hypothesis cut at the length limit has no EOS, nor its log-probability an EOS term.)
  targets = [hyp.ids + [beam.tokenizer.eos_id] * hyp.eos for _, hyp in pairs]
  scored = scoring.PairScorer(beam).score_ids([sources[i] for i, _ in pairs], targets)
  np.testing.assert_allclose(scored, [hyp.log_prob for _, hyp in pairs], rtol=1e-5, atol=1e-5)
  # Greedy search: one hypothesis, its log-probability as both numbers.
  greedy = translator.with_search(1, None)
  one = greedy.translate_nbest(lines, 1)
  assert [h[0][0] for h in one] == greedy.translate(lines)
  assert all(len(h) == 1 and h[0][1] == h[0][2] for h in one)  # no length penalty
  found = [hyps[0] for hyps, s in zip(greedy.nbest_ids(sources, 1), sources) if s]
  scored = scoring.PairScorer(greedy).score_ids(
      [s for s in sources if s], [h.ids + [greedy.tokenizer.eos_id] * h.eos for h in found])
  np.testing.assert_allclose(scored, [h.log_prob for h in found], rtol=1e-5, atol=1e-5)
  # Hypotheses cut at the length limit (a margin of 1 token) end without EOS, and their
  # log-probability has no EOS term.
  # Beam 2, the narrowest with a length penalty.
  short = translator_lib.Translator(beam.workdir, batch_size=4, beam_size=2, max_len_margin=1)
  cut = [(i, h) for i, hyps in enumerate(short.nbest_ids(sources, 2)) if sources[i]
         for h in hyps]
  assert any(not h.eos for _, h in cut)
  scored = scoring.PairScorer(short).score_ids(
      [sources[i] for i, _ in cut], [h.ids + [beam.tokenizer.eos_id] * h.eos for _, h in cut])
  np.testing.assert_allclose(scored, [h.log_prob for _, h in cut], rtol=1e-5, atol=1e-5)
  with pytest.raises(workdir_lib.RunError, match=r"nbest=0: must be 1 or more"):
    beam.nbest_ids(sources, 0)
  with pytest.raises(workdir_lib.RunError, match=r"nbest=5: must be between 1 and the beam size "
                     r"\(4\): pass --beam_size 5 or more"):
    beam.translate_nbest(lines, 5)


def test_the_edges_of_the_translators_defaults_and_checks(workdir, translator, tmp_path):
  # A run whose config.json predates the search fields decodes with the paper's search.
  run = str(tmp_path / "old")
  shutil.copytree(workdir, run, ignore=shutil.ignore_patterns("eval", "tfds"))
  path = os.path.join(run, "config.json")
  with open(path) as f:
    config = json.load(f)
  for key in ("beam_size", "length_penalty_alpha", "max_len_margin"):
    del config[key]
  with open(path, "w") as f:
    json.dump(config, f)
  old = translator_lib.Translator(run)
  assert (old.beam_size, old.alpha, old.max_len_margin, old.batch_size) == (1, 0.6, 50, 64)
  # No search timed yet: no rate rather than a division by zero.
  stats = translator_lib.SearchStats(sentences=3, output_tokens=7).as_dict()
  assert stats["sentences_per_sec"] is None and stats["target_tokens_per_sec"] is None
  stats = translator_lib.SearchStats(sentences=3, output_tokens=7, search_seconds=2.0).as_dict()
  assert (stats["sentences_per_sec"], stats["target_tokens_per_sec"]) == (1.5, 3.5)
  fresh = translator.with_search(1, None)   # its own figures: one sentence, one shape compiled
  fresh.translate(["seven", ""])
  stats = fresh.stats.as_dict()
  assert (stats["searched_sentences"], stats["batches"], stats["compiled_shapes"]) == (1, 1, 1)
  # A margin of 0 extra tokens is one, and a batch of 1 row; a margin of -1 is not.
  narrow = translator_lib.Translator(workdir, max_len_margin=0, batch_size=1)
  assert (narrow.max_len_margin, narrow.batch_size) == (0, 1)
  with pytest.raises(workdir_lib.RunError, match="max_len_margin=-1 >= 0"):
    translator_lib.Translator(workdir, max_len_margin=-1)
  # Sampling's checks at their edges: a small temperature is one; a file's 2^32nd line is not.
  for temperature in (0.01, 1e-30, 1e30):
    assert translator.with_sampling(temperature).sampling.temperature == temperature
  sampler = translator.with_sampling()
  assert sampler.sampling == translator_lib.Sampling(1.0, 0, 1.0, 0, 0)
  assert sampler.with_line_offset(2**32 - 1).sampling.line_offset == 2**32 - 1
  assert translator.with_sampling(line_offset=2**31 - 1).sampling.line_offset == 2**31 - 1
  with pytest.raises(workdir_lib.RunError, match=r"line_offset=2147483648: must be between"):
    translator.with_sampling(line_offset=2**31)
  with pytest.raises(workdir_lib.RunError, match=r"line_offset=4294967296: the lines before"):
    sampler.with_line_offset(2**32)
  # A source longer than the model's positions is named by its line, counted from 1.
  warnings = []
  ids = translator.encode(["seven", "seven " * 300], warn=warnings.append)
  assert len(warnings) == 1 and warnings[0].startswith("line 2: "), warnings
  assert len(ids[1]) > translator.max_source_pieces
  # A hypothesis that is EOS alone ended with EOS (an empty translation, not one cut short).
  eos, pad = translator.config.eos_id, translator.config.pad_id
  assert translator._hypothesis(np.array([eos, pad, pad]), 1, -1.0, -1.0).eos
  assert not translator._hypothesis(np.array([pad, pad, pad]), 0, 0.0, 0.0).eos
  # Batches go longest first (the largest shape, and an out-of-memory error, come first);
  # each shape is compiled on an all-padding batch first (the empty lists).
  seen = []
  def search(inputs, index):
    seen.append(sorted(int(i) for i, row in zip(index, inputs) if row.any()))
    return (np.zeros((len(index), 1)),)
  sources = [[5] * n for n in (1, 3, 2, 5, 4)]
  translator.with_search(1, None)._in_batches(sources, search, [None] * 5, "search")
  assert [x for x in seen if x] == [[1, 2, 3, 4], [0]], seen   # batch_size 4: 4 longest, 1


def test_the_translators_counts_bounds_and_empty_lines(workdir, translator, monkeypatch):
  """What the throughput figures add up (seconds on a clock that ticks once a reading, output
  tokens with EOS), the bounds of the batch, length and sampling checks, and an empty line
  among others in n-best lists and samples."""
  eos = translator.config.eos_id
  # A clock that advances by one at every reading: one compile and one search, a second each.
  fresh = translator.with_search(1, None)
  assert fresh.stats == translator_lib.SearchStats(0, 0, 0, 0.0, 0.0, 0)
  ticks = iter(range(100, 1000))   # from 100: a sum of two readings shows
  monkeypatch.setattr(translator_lib.time, "perf_counter", lambda: float(next(ticks)))
  fresh._in_batches([[5, eos], [5, 5, eos]], lambda inputs, index: (np.zeros((len(index), 1)),),
                    [None, None], "search")
  monkeypatch.undo()
  assert (fresh.stats.compile_seconds, fresh.stats.search_seconds) == (1.0, 1.0)
  # Output tokens: the best hypothesis's, EOS included; an empty line in the middle is one
  # empty hypothesis (no EOS), and the lines after it are searched.
  beam = translator.with_search(3, 0.6)
  found = beam.nbest_ids(beam.encode(["seven", "", "eight nine"]), 2)
  assert found[1] == [translator_lib.Hypothesis([], 0.0, 0.0, False)]
  assert len(found[2]) >= 1 and found[2][0].ids
  assert beam.stats.output_tokens == sum(len(h[0].ids) + h[0].eos for h in found)
  # Sampling: the same; translate and a 1-sample list share their program (one shape).
  sampler = translator.with_sampling(seed=3)
  drawn = sampler.nbest_ids(sampler.encode(["seven", "", "eight nine"]), 2)
  assert drawn[1] == [translator_lib.Hypothesis([], 0.0, 0.0, False)] and len(drawn[2]) == 2
  once = translator.with_sampling(seed=3)
  once.translate(["seven"])
  once.translate_nbest(["seven"], 1)
  assert once.stats.shapes == 1
  # n-best's hint names the beam to pass.
  with pytest.raises(workdir_lib.RunError, match="pass --beam_size 2 or more for 2 "):
    translator.with_search(1, None).check_nbest(2)
  # Bounds: a batch of 0 rows, a top_k below 0 and a line offset below 0 are refused; a top_k
  # of the whole vocabulary is not.
  with pytest.raises(workdir_lib.RunError, match="batch_size=0 must be >= 1"):
    copy.copy(translator)._set_search(None, None, None, 0)
  vocab = translator.config.output_vocab_size
  assert translator.with_sampling(top_k=vocab).sampling.top_k == vocab
  with pytest.raises(workdir_lib.RunError, match="top_k=-1: must be between 0"):
    translator.with_sampling(top_k=-1)
  # A nucleus of any probability above 0 up to 1; not 0, above 1 or NaN.
  for top_p in (1e-9, 0.9, 1.0):
    assert translator.with_sampling(top_p=top_p).sampling.top_p == top_p
  for top_p in (0.0, -0.5, 1.0000001, float("nan")):
    with pytest.raises(workdir_lib.RunError, match=rf"top_p={top_p}: must be above 0 and at most"):
      translator.with_sampling(top_p=top_p)
  with pytest.raises(workdir_lib.RunError, match="line_offset=-1: the lines before"):
    sampler.with_line_offset(-1)
  # Bucket shapes: an empty length is one bucket; a longest source of exactly max_len is
  # padded to max_len, not past it (40 here, not a multiple of the bucket).
  assert translator.bucket_shape(1, 0) == (1, translator_lib.LENGTH_BUCKET)
  long = copy.copy(translator)
  long.config = translator.config.replace(max_len=40)
  assert long.bucket_shape(3, 40) == (4, 40) and long.bucket_shape(3, 41) == (4, 48)
  # A source of exactly the model's maximum is no warning; one piece more is.
  limit = translator.max_source_pieces
  for k in range(1, 200):
    line = " ".join(["seven"] * k)
    if len(translator.tokenizer.encode_batch([line])[0]) >= limit:
      break
  pieces = translator.tokenizer.encode_batch([line])[0]
  while len(pieces) > limit:  # down to exactly the limit, a piece at a time
    line = translator.detokenize(pieces[:-1])
    pieces = translator.tokenizer.encode_batch([line])[0]
  assert len(pieces) == limit, (len(pieces), limit)
  warnings = []
  translator.encode([line], warn=warnings.append)
  assert warnings == []
  translator.encode([line + " seven"], warn=warnings.append)
  assert len(warnings) == 1


def test_a_checkpoint_is_decoded_with_the_config_its_step_was_written_with(workdir, tmp_path):
  """A resume at step 4 changed the search (`config.4.json`): step 3 decodes with the first
  config, step 6 with the second; an ensemble member of another run is checked against the
  model its own step was written with. A directory named like a step, with no checkpoint in
  it, is no checkpoint to point at."""
  run = tmp_path / "resumed"
  shutil.copytree(workdir, run, ignore=shutil.ignore_patterns("eval", "tfds"))
  config = json.loads((run / "config.json").read_text())
  first = config.get("beam_size", 1)
  (run / "config.4.json").write_text(json.dumps(dict(config, beam_size=first + 2)))
  assert translator_lib.Translator(str(run), step=3).beam_size == first
  assert translator_lib.Translator(str(run), step=6).beam_size == first + 2
  other = tmp_path / "other"
  shutil.copytree(workdir, other, ignore=shutil.ignore_patterns("eval", "tfds"))
  mine = config["resolved_model"]["activation"]
  config["resolved_model"]["activation"] = {"relu": "gelu"}.get(mine, "relu")
  (other / "config.4.json").write_text(json.dumps(config))
  member = translator_lib.Translator(workdir, ensemble=[str(other / "checkpoints" / "3")])
  assert member.params.size == 2
  with pytest.raises(workdir_lib.RunError, match="activation="):
    translator_lib.Translator(workdir, ensemble=[str(other / "checkpoints" / "6")])
  (tmp_path / "7").mkdir()
  assert translator_lib._not_a_workdir(str(tmp_path / "7"), True) is None
  # A run without its tokenizer: named, with the config that recorded it and what to do (a
  # tokenizer trained again might read the ids as other pieces); one from before the record:
  # named, with the command that trains the run.
  os.remove(run / "spm.model")
  with pytest.raises(workdir_lib.RunError, match=re.escape(
      f"{run}/spm.model is missing: {run}/config.4.json records the run's tokenizer as sha256")
      + r".*Put the run's own file back at"):
    translator_lib.Translator(str(run))
  for name in ("config.json", "config.4.json"):
    with open(run / name) as f:
      stored = json.load(f)
    stored.pop(workdir_lib.RESOLVED_TOKENIZER)
    with open(run / name, "w") as f:
      json.dump(stored, f)
  with pytest.raises(workdir_lib.RunError, match=re.escape(
      f"{run}/spm.model not found: the run's SentencePiece model is missing; train first with "
      f"python scripts/train.py --workdir {run} (it trains with the run's own config.json)")):
    translator_lib.Translator(str(run))


def test_translate_writes_one_line_a_translation_and_refuses_its_input_as_output(
    workdir, tmp_path, capsys, monkeypatch):
  """The output's lines stay aligned with the input's: a translation holding a line break (a
  byte-fallback piece decodes to one) is written on one line; and the input named as the
  output (which opening it would empty, the reader then reading the translations) is refused
  with the input left as it was, also through another name for the file."""
  source = tmp_path / "in.txt"
  source.write_text("seven\ntwelve\n")
  os.symlink(source, tmp_path / "link.txt")
  for output in (source, tmp_path / "link.txt"):
    rc, _, err = run_main(translate_script, ["--workdir", workdir, "--input", str(source),
                                             "--output", str(output)], capsys)
    assert rc == 1 and "--input and --output are the same file" in err, err
    assert source.read_text() == "seven\ntwelve\n"
  with open(source, encoding="utf-8") as stdin:  # `--output in.txt < in.txt`
    monkeypatch.setattr(sys, "stdin", stdin)
    rc, _, err = run_main(translate_script, ["--workdir", workdir, "--output", str(source)],
                          capsys)
  assert rc == 1 and "stdin and --output are the same file" in err, err
  assert source.read_text() == "seven\ntwelve\n"
  captured = sys.stdout
  with open(source, "a", encoding="utf-8") as stdout:  # `--input in.txt >> in.txt`
    monkeypatch.setattr(sys, "stdout", stdout)
    rc, _, err = run_main(translate_script, ["--workdir", workdir, "--input", str(source)],
                          capsys)
  monkeypatch.setattr(sys, "stdout", captured)
  assert rc == 1 and "--input and stdout are the same file" in err, err
  assert source.read_text() == "seven\ntwelve\n"
  # Not a regular file: /dev/null read and written is nothing to empty.
  with open(os.devnull, encoding="utf-8") as stdin:
    monkeypatch.setattr(sys, "stdin", stdin)
    rc, _, err = run_main(translate_script, ["--workdir", workdir, "--output", os.devnull],
                          capsys)
  assert rc == 0, err
  monkeypatch.setattr(translator_lib.Translator, "translate",
                      lambda self, lines, names=None: ["a\nb", "c\r\nd\re"][:len(lines)])
  out = tmp_path / "out.txt"
  rc, _, err = run_main(translate_script, ["--workdir", workdir, "--input", str(source),
                                           "--output", str(out)], capsys)
  assert rc == 0 and out.read_text() == "a b\nc d e\n", err
  # A write cut short (a full disk) is undone: the output ends after the last whole chunk, so
  # `wc -l` counts the lines done (the docstring's way to go on), also on stdout sent to a
  # file in append mode, whose earlier lines stay.
  writes = []

  def short_write(fd, data):
    writes.append(data)
    if len(writes) % 2 == 0:  # every second chunk: one byte, then the disk is full
      os.write(fd, data[:1])
      raise OSError(errno.ENOSPC, "No space left on device")
    os.write(fd, data)
  monkeypatch.setattr(translate_script, "_write_all", short_write)
  rc, _, err = run_main(translate_script, ["--workdir", workdir, "--input", str(source),
                                           "--output", str(out), "--chunk_lines", "1"], capsys)
  assert rc == 1 and (f"--output {out}: No space left on device while writing the translations "
                      "of this input's lines 2 on; it ends with those of the lines before") in err
  assert out.read_text() == "a b\n"
  appended = tmp_path / "appended.txt"
  appended.write_text("kept\n")
  # As a shell's `>> appended.txt` opens it: in append mode, at offset 0 until a write.
  with os.fdopen(os.open(appended, os.O_WRONLY | os.O_APPEND), "w", encoding="utf-8") as stdout:
    monkeypatch.setattr(sys, "stdout", stdout)
    writes[:] = [b""]  # its first chunk is cut short
    rc, _, err = run_main(translate_script, ["--workdir", workdir, "--input", str(source),
                                             "--chunk_lines", "1"], capsys)
  monkeypatch.setattr(sys, "stdout", captured)
  assert rc == 1 and ("the output (stdout): No space left on device while writing the "
                      "translations of this input's lines 1 on") in err, err
  assert appended.read_text() == "kept\n"
  # `> out 2>&1`: the offset is put back too, so what is written next (the error) follows the
  # last whole line instead of leaving a hole of NUL bytes.
  with open(appended, "w", encoding="utf-8") as stdout:
    monkeypatch.setattr(sys, "stdout", stdout)
    writes[:] = []  # the first chunk whole, the second cut short
    rc, _, err = run_main(translate_script, ["--workdir", workdir, "--input", str(source),
                                             "--chunk_lines", "1"], capsys)
    assert rc == 1 and os.lseek(stdout.fileno(), 0, os.SEEK_CUR) == len("a b\n"), err
  monkeypatch.setattr(sys, "stdout", captured)
  assert appended.read_text() == "a b\n"


def test_translate_nbest_writes_tab_separated_rows(workdir, tmp_path, capsys):
  out = tmp_path / "nbest.tsv"
  rc, _, err = run_main(translate_script, ["--workdir", workdir, "--beam_size", "3", "--nbest",
                                           "3", "--output", str(out), "seven", "", "twelve"],
                        capsys)
  assert rc == 0, err
  rows = [line.split("\t") for line in out.read_text(encoding="utf-8").splitlines()]
  assert all(len(row) == 5 for row in rows)
  assert [row[0] for row in rows].count("2") == 1 and ["2", "1", "0.000000", "0.000000", ""] in rows
  for line in ("1", "3"):
    ranks = [row[1] for row in rows if row[0] == line]
    assert ranks == [str(r) for r in range(1, len(ranks) + 1)] and 1 <= len(ranks) <= 3
  # More than the beam finishes is refused before anything is written.
  rc, _, err = run_main(translate_script, ["--workdir", workdir, "--nbest", "2", "--output",
                                           str(tmp_path / "none.tsv"), "seven"], capsys)
  assert rc == 1 and "nbest=2: must be between 1 and the beam size (1)" in err
  assert not (tmp_path / "none.tsv").exists()


def test_score_gives_the_runs_own_validation_nll(workdir, tmp_path, capsys):
  """score.py on the validation split: the per-token negative log-likelihood the training loop
  logged for it at the same step (another batching, the same number)."""
  rc, out, err = run_main(score_script, ["--workdir", workdir, "--split", "validation",
                                         "--output_dir", str(tmp_path)], capsys)
  assert rc == 0, err
  result = json.loads(out)
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    logged = [json.loads(line) for line in f if '"eval_nll"' in line]
  assert logged[-1]["step"] == result["step"] == 6
  assert result["nll_per_token"] == pytest.approx(logged[-1]["eval_nll"], rel=1e-5)
  assert result["perplexity"] == pytest.approx(np.exp(result["nll_per_token"]))
  assert result["sentences"] == result["scored"] == EVAL_SIZE
  assert f"perplexity {result['perplexity']:.3f}" in err
  with open(os.path.join(tmp_path, "scores.validation.jsonl"), encoding="utf-8") as f:
    records = [json.loads(line) for line in f]
  assert [r["pair"] for r in records] == list(range(1, EVAL_SIZE + 1))
  assert sum(r["log_prob"] for r in records) == pytest.approx(result["log_prob"])
  assert sum(r["target_tokens"] for r in records) == result["target_tokens"]
  with open(os.path.join(tmp_path, "score.validation.json"), encoding="utf-8") as f:
    assert json.load(f) == result


def test_scoring_details_found_by_mutation_testing(translator, tmp_path):
  config = translator.config
  assert config.position_encoding == "sinusoidal" and config.max_len == 32
  pieces = lambda text: len(translator.tokenizer.encode_batch([text])[0])  # noqa: E731

  def of_pieces(n):  # a target of n pieces, words added while they fit
    words = []
    while pieces(" ".join(words)) < n:
      fitting = [w for w in ("sieben", "ein") if pieces(" ".join(words + [w])) <= n]
      assert fitting, words
      words.append(fitting[0])
    return " ".join(words)

  # A target of exactly max_len tokens with EOS is not too long; one more is.
  fits, longer = of_pieces(31), of_pieces(32)
  # Twelve long targets among short ones: ten warnings, each naming its pair, then a count;
  # scored whole, as sinusoidal positions extend past max_len.
  pairs = [("seven", "sieben"), ("seven", fits)] + [("seven", longer)] * 12
  said = []
  records = scoring.pair_scores(translator, pairs, warn=said.append)
  assert len(said) == 11 and said[0].startswith("pair 3: the target is 33 tokens with EOS, "
                                                "more than the 32 (max_len)")
  assert said[9].startswith("pair 12: ") and said[10] == (
      "... and 2 more sources or targets longer than the model's max_len")
  assert all(r["log_prob"] is not None and "skipped" not in r for r in records)
  assert [r["target_tokens"] for r in records[:3]] == [3, 32, 33]  # "sieben" is 2 pieces
  for r in records:
    assert r["nll_per_token"] == -r["log_prob"] / r["target_tokens"] > 0
  # Empty sources: five named, more said with "...".
  for empty, named in ((5, "(pair 1, pair 2, pair 3, pair 4, pair 5): "),
                       (6, "(pair 1, pair 2, pair 3, pair 4, pair 5, ...): ")):
    said = []
    scoring.pair_scores(translator, [("", "sieben")] * empty, warn=said.append)
    assert said == [f"{empty} pair(s) with an empty source not scored {named}the model never "
                    "saw an empty source (translate.py gives it an empty translation)"]
  # A long source is read whole; nothing is translated, so no translation stops anywhere.
  said = []
  scoring.pair_scores(translator, [(LONG, "sieben")], warn=said.append)
  assert said == ["pair 1: 276 pieces, more than the 31 (max_len 32 - 1 for eos) the model was "
                  "built for: read whole, as sinusoidal positions extend past max_len"]
  # A scorer starts at no time; score() reports the time of its own scoring and compiling.
  scorer = scoring.PairScorer(translator)
  assert (scorer.compile_seconds, scorer.score_seconds, scorer.compiled_shapes) == (0.0, 0.0, 0)
  begin = time.perf_counter()
  result = scoring.score(translator, pairs[:2], "two", str(tmp_path / "two"))
  elapsed = time.perf_counter() - begin
  assert 0 < result["score_seconds"] and 0 <= result["compile_seconds"]
  assert result["score_seconds"] + result["compile_seconds"] < elapsed
  assert result["pairs_per_sec"] == pytest.approx(2 / result["score_seconds"])
  # With a learned position table the long targets are not scored: skipped and counted, and
  # nothing scored has no speed.
  learned = copy.copy(translator)
  learned.config = config.replace(position_encoding="learned")
  said = []
  result = scoring.score(learned, [("seven", longer)] * 2, "long", str(tmp_path / "long"),
                         warn=said.append)
  assert said[0] == ("long pair 1: the target is 33 tokens with EOS, more than the model's "
                     "learned position table (max_len 32): not scored")
  assert (result["scored"], result["skipped_long_targets"], result["skipped_empty_sources"],
          result["pairs_per_sec"]) == (0, 2, 0, None)
  # Ten warnings are all said; the eleventh is counted.
  for count, last in ((10, "pair 10: the target"), (11, "... and 1 more sources or targets")):
    said = []
    scoring.pair_scores(learned, [("seven", longer)] * count, warn=said.append)
    assert len(said) == 10 + (count > 10) and said[-1].startswith(last), said[-1]


def test_score_pairs_of_ones_own(workdir, tmp_path, capsys):
  src, tgt = tmp_path / "src.en", tmp_path / "hyps.de"
  src.write_text("seven\n\ntwelve\nseven\n", encoding="utf-8")
  tgt.write_text("sieben\nzwei\n\nacht\n", encoding="utf-8")
  run = str(tmp_path / "run")
  shutil.copytree(workdir, run)
  rc, out, err = run_main(score_script, ["--workdir", run, "--source", str(src), "--target",
                                         str(tgt), "--batch_size", "2"], capsys)
  assert rc == 0, err
  result = json.loads(out)
  # Named after the target file, in the checkpoint's evaluation directory.
  assert result["split"] == "hyps" and result["target_file"] == str(tgt)
  assert result["scores"] == os.path.join(run, "eval", "step_6", "scores.hyps.jsonl")
  with open(result["scores"], encoding="utf-8") as f:
    records = [json.loads(line) for line in f]
  # The empty source is skipped (with a warning naming it), the empty target scored as EOS.
  assert records[1]["log_prob"] is None and records[1]["skipped"] == "empty source"
  assert "1 pair(s) with an empty source not scored (hyps pair 2)" in err
  assert records[2]["target_tokens"] == 1 and records[2]["log_prob"] < 0
  assert result["scored"] == 3 and result["skipped_empty_sources"] == 1
  # Compared with the training pairs (as evaluate.py compares a test set): none of these.
  assert result["train_overlap"]["pairs"] == 4 and result["train_overlap"]["any_normalized"] == 0
  # The same source with another target: the model prefers neither by accident of batching.
  translator = translator_lib.Translator(run, batch_size=4)
  alone = scoring.pair_scores(translator, [("seven", "acht")])[0]["log_prob"]
  assert alone == pytest.approx(records[3]["log_prob"], rel=1e-5)
  # Flags the command would ignore, and half a pair of files, are one error line each.
  for argv, message in (
      (["--source", str(src)], "--source and --target go together"),
      (["--source", str(src), "--target", str(tgt), "--split", "test"],
       "--split is ignored with --source/--target"),
      (["--name", "x"], "--name is ignored without --source/--target"),
      (["--check_overlap"], "--check_overlap is ignored without --source/--target"),
      (["--source", str(src), "--target", str(tgt), "--nocheck_overlap", "--data_dir", run],
       "--data_dir is ignored with --source/--target"),
      (["--beam_size", "4"], "Unknown command line flag 'beam_size'")):
    rc, _, err = run_main(score_script, ["--workdir", run] + argv, capsys)
    assert rc != 0 and message in err, (argv, err)
  # A pair the run trained on: its perplexity is no held-out one, so its line is named and
  # counted; --nocheck_overlap skips reading the training pairs.
  from transformer_jax.data import raw_split
  ((s0, t0),) = raw_split(evaluation.data_config(translator_lib.workdir_config(run), run),
                          "train")[:1]
  mine_src, mine_tgt = tmp_path / "mine.en", tmp_path / "mine.de"
  mine_src.write_text(f"seven\n{s0}\n", encoding="utf-8")
  mine_tgt.write_text(f"sieben\n{t0}\n", encoding="utf-8")
  mine = ["--workdir", run, "--source", str(mine_src), "--target", str(mine_tgt)]
  rc, out, err = run_main(score_script, mine, capsys)
  assert rc == 0 and json.loads(out)["train_overlap"]["exact_source"] == 1, err
  assert (f"--source {mine_src}: 1 (line 2) of 2 pairs have a source or target that the run "
          "trained on (1 sources and 1 targets verbatim, the rest up to case and punctuation): "
          "their perplexity measures what the model remembers") in err, err
  assert_overlap_skipped_or_unbuilt(score_script, mine, mine_src, tmp_path, capsys)
  # A checkpoint flag that names nothing is said before the training pairs are read.
  rc, out, err = run_main(score_script, mine + ["--step", "99"], capsys)
  assert rc == 1 and "step 99 is not in" in err and "trained on" not in err, err
  # Another target file of the same name replaces the files, and says so.
  other = tmp_path / "other"
  other.mkdir()
  (other / "hyps.de").write_text("acht\nzwei\n\nsieben\n", encoding="utf-8")
  rc, out, err = run_main(score_script, ["--workdir", run, "--source", str(src), "--target",
                                         str(other / "hyps.de")], capsys)
  assert rc == 0 and f"held the result for target_file {tgt}" in err, err
  assert "pass --name to keep their files side by side" in err
  # A default name that is a split's says where it came from.
  (other / "test.de").write_text("acht\nzwei\n\nsieben\n", encoding="utf-8")
  rc, _, err = run_main(score_script, ["--workdir", run, "--source", str(src), "--target",
                                       str(other / "test.de")], capsys)
  assert rc == 1 and ("the test set's name 'test' (from --target's file name) is a split's"
                      in err), err
  tgt.write_text("one line\n", encoding="utf-8")
  rc, _, err = run_main(score_script, ["--workdir", run, "--source", str(src), "--target",
                                       str(tgt)], capsys)
  assert rc == 1 and f"--source {src} has 4 lines but --target {tgt} has 1" in err
  # Two empty files: named, not "the e split is empty" (a split named after the target file).
  empty_src, empty_tgt = tmp_path / "none.en", tmp_path / "e.de"
  empty_src.write_text("")
  empty_tgt.write_text("")
  rc, _, err = run_main(score_script, ["--workdir", run, "--source", str(empty_src),
                                       "--target", str(empty_tgt)], capsys)
  assert rc == 1 and err == (f"error: --source {empty_src} and --target {empty_tgt} are empty: "
                             "nothing to score. Give the sources and their targets, one "
                             "sentence a line, line-aligned\n"), err


def test_an_ensemble_decodes_its_members_by_their_mean_probability(workdir, translator, tmp_path,
                                                                  capsys):
  """`--ensemble`: the checkpoints named, loaded and decoded together (the search on the
  members' parameters, loaded by hand, gives the same tokens and log-probabilities); its
  results go to a directory of their own and name the members; a member twice, a path that
  holds no checkpoint and another model are refused before anything is decoded."""
  lines = ["one hundred and two", "seven thousand and three", "twelve"]
  ens = translator_lib.Translator(workdir, batch_size=4,
                                  ensemble=[os.path.join(workdir, "checkpoints", "3")])
  assert isinstance(ens.params, search.Ensemble) and ens.params.size == 2
  assert [m["step"] for m in ens.settings()["ensemble"]] == [3]
  sources = ens.encode(lines)
  found = ens.with_search(1, None).nbest_ids(sources, 1)
  members = search.Ensemble.of([checkpointing.load_params(workdir, step)[1] for step in (6, 3)])
  width = max(map(len, sources))
  inputs = np.array([s + [0] * (width - len(s)) for s in sources], np.int32)
  tokens, lengths, log_probs = search.greedy_search(ens.config, members, inputs,
                                                    max_len_margin=ens.max_len_margin, score=True)
  expected = search.output_ids(tokens, lengths, ens.config.eos_id)
  assert [h[0].ids for h in found] == expected
  np.testing.assert_allclose([h[0].log_prob for h in found], log_probs, rtol=1e-5, atol=1e-5)
  alone = translator.with_search(1, None).nbest_ids(sources, 1)
  assert [h[0].log_prob for h in alone] != [h[0].log_prob for h in found]
  # score.py's scorer on the ensemble: what its greedy search summed for the same ids.
  scored = scoring.PairScorer(ens).score_ids(
      sources, [h[0].ids + [ens.tokenizer.eos_id] * h[0].eos for h in found])
  np.testing.assert_allclose(scored, log_probs, rtol=1e-5, atol=1e-5)
  # evaluate.py: the ensemble's own directory, its members in the result.
  rc, out, err = run_main(evaluate_script, ["--workdir", workdir, "--split", "test",
                                            "--beam_size", "1", "--ensemble",
                                            os.path.join(workdir, "checkpoints", "3")], capsys)
  assert rc == 0, err
  result = json.loads(out.splitlines()[-1])
  assert re.fullmatch(r"step_6\.ensemble2_[0-9a-f]{8}", os.path.basename(
      os.path.dirname(result["hypotheses"]))), result["hypotheses"]
  assert result["ensemble"][0]["checkpoint"] == os.path.join(workdir, "checkpoints", "3")
  # Refused, each with one error line.
  other = tmp_path / "other_activation"
  shutil.copytree(workdir, other, ignore=shutil.ignore_patterns("eval", "tfds"))
  config = json.loads((other / "config.json").read_text())
  # The same parameter shapes, another model: only the config check can tell.
  mine = config["resolved_model"]["activation"]
  theirs = config["resolved_model"]["activation"] = {"relu": "gelu"}.get(mine, "relu")
  (other / "config.json").write_text(json.dumps(config))
  # Another dropout rate is the same model at decoding: a member.
  dropout = tmp_path / "other_dropout"
  shutil.copytree(workdir, dropout, ignore=shutil.ignore_patterns("eval", "tfds"))
  resolved = json.loads((dropout / "config.json").read_text())
  resolved["resolved_model"]["dropout_rate"] = 0.5 if config["resolved_model"][
      "dropout_rate"] != 0.5 else 0.25
  (dropout / "config.json").write_text(json.dumps(resolved))
  assert translator_lib.Translator(workdir, ensemble=[str(dropout)]).params.size == 2
  other_tokenizer = tmp_path / "other_tokenizer"
  shutil.copytree(workdir, other_tokenizer, ignore=shutil.ignore_patterns("eval", "tfds"))
  (other_tokenizer / "spm.model").write_bytes(b"another tokenizer")
  # Bare parameters (no run around them) of a wider model: only their shapes can tell.
  wider = ens.config.replace(d_model=2 * ens.config.d_model, deterministic=True)
  dummy = np.ones((1, 4), np.int32)
  checkpointing.save_params(str(tmp_path / "wider"), 3, translator_lib.Transformer(wider).init(
      jax.random.key(0), dummy, dummy)["params"], {})
  os.symlink(workdir, tmp_path / "link")
  for members, message in (
      ([os.path.join(workdir, "checkpoints", "6")], "is already in the ensemble (the translator's "
       "own checkpoint)"),
      ([str(tmp_path / "link" / "checkpoints" / "6")], "is already in the ensemble (the "
       "translator's own checkpoint)"),   # the same checkpoint through a symbolic link
      ([os.path.join(workdir, "checkpoints", "3"), str(tmp_path / "link" / "checkpoints" / "3")],
       f"is already in the ensemble (--ensemble {os.path.join(workdir, 'checkpoints', '3')})"),
      ([str(tmp_path / "nowhere")], f"--ensemble {tmp_path / 'nowhere'}: no checkpoint in"),
      ([str(other)], f"activation={theirs!r} (--workdir's: {mine!r})"),
      ([str(other_tokenizer)], f"--ensemble {other_tokenizer}: "),
      ([str(tmp_path / "wider")], f"--ensemble {tmp_path / 'wider'}: the parameters in "
       f"{tmp_path / 'wider'}/3 do not fit the model of {workdir}"),
      ([os.path.join(workdir, "checkpoints", "3"), ""], "an empty path (a comma too many?)")):
    rc, _, err = run_main(translate_script, ["--workdir", workdir, "--ensemble",
                                             ",".join(members), "seven"], capsys)
    assert rc == 1 and message in err, (members, err)
  # A later --step that is also a member: refused before the first step's search.
  rc, out, err = run_main(evaluate_script, ["--workdir", workdir, "--step", "3,6", "--ensemble",
                                            os.path.join(workdir, "checkpoints", "6")], capsys)
  assert rc == 1 and not out and (
      f"--step 6: {os.path.join(workdir, 'checkpoints', '6')} is also in --ensemble") in err, err


def test_the_translator_searches_halves_of_its_batches_as_it_searches_them_whole(
    translator, monkeypatch):
  """With a batch's halves searched at the same time (`search.concurrent_parts`, the default on
  one CPU device of 2+ cores), translations, n-best lists and samples are what a whole batch
  gives: rows in order, each line its own key; the scores to float32 rounding (XLA sums a
  row's log-softmax in another order for another number of rows, as for another bucket)."""
  lines = ["one hundred and two", "seven", "", "twelve thousand", "three", "forty one"]
  searches = {"greedy": translator.with_search(1, None), "beam": translator.with_search(4, 0.6),
              "sample": translator.with_sampling(1.5, seed=3)}
  def outputs():
    return {name: (t.translate(lines), t.translate_nbest(lines, 1 if name == "greedy" else 2))
            for name, t in searches.items()}
  whole = outputs()
  halves = []
  def two(rows):
    halves.append(rows)
    return 2 if rows % 2 == 0 else 1
  monkeypatch.setattr(search, "concurrent_parts", two)
  split = outputs()
  for name, (texts, nbest) in whole.items():
    assert split[name][0] == texts, name
    assert [[h[0] for h in hyps] for hyps in split[name][1]] == [[h[0] for h in hyps]
                                                                for hyps in nbest], name
    np.testing.assert_allclose([h[1:] for hyps in split[name][1] for h in hyps],
                               [h[1:] for hyps in nbest for h in hyps], rtol=1e-6)
  assert 4 in halves  # batches of 4 rows (and one of 1, whole)


def test_sampling_draws_each_line_by_its_own_key(translator, workdir, tmp_path, capsys):
  lines = ["one hundred and two", "seven", "", "twelve thousand", "three"]
  sampler = translator.with_sampling(temperature=1.5, seed=3)
  drawn = sampler.translate(lines)
  assert drawn[2] == "" and drawn != translator.with_search(1, None).translate(lines)
  # The same draws in another batching; another seed draws others.
  assert translator.with_sampling(1.5, seed=3).translate(lines[:2]) == drawn[:2]
  wide = translator_lib.Translator(workdir, batch_size=2).with_sampling(1.5, seed=3)
  assert wide.translate(lines) == drawn
  assert translator.with_sampling(1.5, seed=4).translate(lines) != drawn
  # A file split into pieces draws as it does whole, each piece after its offset.
  assert translator.with_sampling(1.5, seed=3, line_offset=3).translate(lines[3:]) == drawn[3:]
  assert translator.with_sampling(1.5, seed=3).translate(lines[3:]) != drawn[3:]
  # n samples a line, the most probable first, each with its log-probability; the first draw is
  # the one translate gives.
  samples = sampler.translate_nbest(lines, 3)
  assert samples[2] == [("", 0.0, 0.0)]
  for line, hyps in zip(drawn, samples):
    assert len(hyps) == 3 or line == ""
    assert [h[2] for h in hyps] == sorted((h[2] for h in hyps), reverse=True)
    assert line in [h[0] for h in hyps]
  assert sampler.settings()["sampling"] == {"temperature": 1.5, "top_k": 0, "top_p": 1.0,
                                            "seed": 3, "line_offset": 0}
  # A nucleus draws other samples, and one of a tiny probability is greedy search.
  assert translator.with_sampling(1.5, seed=3, top_p=0.5).translate(lines) != drawn
  assert translator.with_sampling(1.5, seed=3, top_p=1e-6).translate(lines) == (
      translator.with_search(1, None).translate(lines))
  assert sampler.settings()["beam_size"] is None
  assert sampler.with_search(1, None).translate(lines) == translator.with_search(1, None).translate(
      lines)
  for kwargs, message in (({"temperature": 0.0}, "temperature=0.0: must be a number above 0"),
                          ({"top_k": 10**6}, "top_k=1000000: must be between 0"),
                          ({"line_offset": -1}, "line_offset=-1: must be between 0")):
    with pytest.raises(workdir_lib.RunError, match=message):
      translator.with_sampling(**kwargs)
  # The command line: flags that sampling, or searching, would ignore are refused.
  out = tmp_path / "bt.txt"
  rc, _, err = run_main(translate_script, ["--workdir", workdir, "--sample", "--temperature",
                                           "1.5", "--seed", "3", "--output", str(out)] + lines,
                        capsys)
  assert rc == 0 and out.read_text(encoding="utf-8").splitlines() == drawn, err
  rc, _, err = run_main(translate_script, ["--workdir", workdir, "--sample", "--top_p", "1e-6",
                                           "--output", str(out)] + lines, capsys)
  assert rc == 0 and out.read_text(encoding="utf-8").splitlines() == (
      translator.with_search(1, None).translate(lines)), err
  rc, _, err = run_main(translate_script, ["--workdir", workdir, "--sample", "--temperature",
                                           "1.5", "--seed", "3", "--line_offset", "3", "--nbest",
                                           "2", "--output", str(out)] + lines[3:], capsys)
  rows = whole = [row.split("\t") for row in out.read_text(encoding="utf-8").splitlines()]
  assert rc == 0 and [row[:2] for row in rows] == [["4", "1"], ["4", "2"], ["5", "1"],
                                                   ["5", "2"]], err
  assert drawn[3] in (rows[0][4], rows[1][4]) and drawn[4] in (rows[2][4], rows[3][4])
  # In chunks of 2 lines (the keys follow each chunk's place) the same draws, in order, and
  # n-best rows numbered on from chunk to chunk.
  rc, _, err = run_main(translate_script, ["--workdir", workdir, "--sample", "--temperature",
                                           "1.5", "--seed", "3", "--chunk_lines", "2",
                                           "--verbose", "--output", str(out)] + lines, capsys)
  assert rc == 0 and out.read_text(encoding="utf-8").splitlines() == drawn, err
  assert "translate: 2 lines written" in err and "translate: 5 lines written" in err, err
  rc, _, err = run_main(translate_script, ["--workdir", workdir, "--sample", "--temperature",
                                           "1.5", "--seed", "3", "--chunk_lines", "1", "--nbest",
                                           "2", "--output", str(out)] + lines, capsys)
  rows = [row.split("\t") for row in out.read_text(encoding="utf-8").splitlines()]
  assert rc == 0 and [row[0] for row in rows] == ["1", "1", "2", "2", "3", "4", "4", "5", "5"]
  assert rows[5:] == whole  # lines 4 and 5, drawn as with --line_offset 3 above
  # The offset and the chunks together: lines 4 and 5 alone, one a chunk.
  rc, _, err = run_main(translate_script, ["--workdir", workdir, "--sample", "--temperature",
                                           "1.5", "--seed", "3", "--chunk_lines", "1", "--nbest",
                                           "2", "--line_offset", "3", "--output", str(out)]
                        + lines[3:], capsys)
  assert rc == 0 and [row.split("\t") for row in out.read_text(
      encoding="utf-8").splitlines()] == whole, err
  for argv, message in (
      (["--sample", "--beam_size", "4"], "--beam_size is ignored with --sample"),
      (["--line_offset", "5"], "--line_offset is ignored without --sample or --nbest"),
      (["--top_k", "5"], "--top_k is ignored without --sample: add --sample"),
      (["--top_p", "0.9"], "--top_p is ignored without --sample: add --sample")):
    rc, _, err = run_main(translate_script, ["--workdir", workdir] + argv + ["seven"], capsys)
    assert rc == 1 and message in err, (argv, err)


def test_evaluate_writes_hypotheses_and_reports_json(workdir, capsys):
  rc, out, err = run_main(evaluate_script, ["--workdir", workdir, "--split", "test"], capsys)
  assert rc == 0, err
  result = json.loads(out)
  for key in ("bleu", "chrf", "tokenized_bleu", "bleu_signature", "chrf_signature",
              "tokenized_bleu_signature", "sentences", "step", "beam_size", "alpha",
              "sentences_per_sec", "target_tokens_per_sec", "compile_seconds"):
    assert key in result, key
  assert result["sentences"] == EVAL_SIZE and result["step"] == 6
  assert "case:mixed" in result["bleu_signature"] and "tok:13a" in result["bleu_signature"]
  # The paper's kind of BLEU, tokenized for the run's target language (the numbers task: de).
  assert result["tokenized_bleu_signature"].startswith("moses-tok:de|")
  assert 0 <= result["tokenized_bleu"] <= 100
  assert f"(tokenized BLEU {result['tokenized_bleu']:.2f})" in err
  assert evaluation.target_lang({"data": {"target_lang": "fr"}}) == "fr"
  assert 0 <= result["bleu"] <= 100 and 0 <= result["chrf"] <= 100
  assert result["sentences_per_sec"] > 0 and result["target_tokens_per_sec"] > 0
  assert result["beam_size"] == 1 and result["max_len_margin"] == 50
  out_dir = os.path.join(workdir, "eval", "step_6")
  hyp_path = os.path.join(out_dir, "hypotheses.test.greedy.txt")
  assert result["hypotheses"] == hyp_path
  with open(hyp_path, encoding="utf-8") as f:
    assert len(f.read().split("\n")) == EVAL_SIZE + 1
  # The references scored, beside the hypotheses: sacreBLEU's own command gives the same BLEU
  # from the two files (and compares two evaluations, docs/decoding.md).
  assert result["references"] == os.path.join(out_dir, "references.test.txt")
  with open(result["references"], encoding="utf-8") as f:
    refs = f.read().split("\n")
  assert len(refs) == EVAL_SIZE + 1 and refs[-1] == "" and all(refs[:-1])
  cli = subprocess.run([sys.executable, "-m", "sacrebleu", result["references"], "-i", hyp_path,
                        "-b", "-w", "4"], capture_output=True, text=True, check=True)
  assert float(cli.stdout) == round(result["bleu"], 4), (cli.stdout, result["bleu"])
  assert "sentences/s" in err
  # 10 pairs drawn at random plus the worst, with their references, in the split's order.
  assert result["examples"] == os.path.join(out_dir, "examples.test.greedy.md")
  with open(result["examples"], encoding="utf-8") as f:
    table = f.read().splitlines()
  assert len(table) == 2 + 11 and table[-1].startswith("| ") and "(worst)" in table[-1]
  with open(hyp_path, encoding="utf-8") as f:
    hyps = f.read().splitlines()
  numbers = [int(row.split(" | ")[0].strip("| (worst)")) for row in table[2:]]
  assert numbers[:10] == sorted(numbers[:10]) and len(set(numbers)) == 11
  assert all(hyps[n - 1] in row for n, row in zip(numbers, table[2:]))
  with open(os.path.join(out_dir, "eval.test.greedy.json"), encoding="utf-8") as f:
    assert json.load(f) == result
  # Nothing is written into the checkpoint (training deletes old steps, and with them what
  # is inside), and no half-written file is left behind.
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints", "6"))) == sorted(
      os.listdir(os.path.join(workdir, "checkpoints", "3")))
  assert not [n for n in os.listdir(out_dir) if n.endswith(".tmp")]
  step, _ = checkpointing.load_params(workdir)
  assert step == 6


def test_evaluations_with_other_searches_sit_side_by_side_and_are_logged(workdir, tmp_path,
                                                                          capsys):
  run = str(tmp_path / "run")
  shutil.copytree(workdir, run)
  shutil.rmtree(os.path.join(run, "eval"), ignore_errors=True)
  results = []
  for argv in ([], ["--beam_size", "2"], ["--beam_size", "2", "--alpha", "1.0"],
               ["--step", "3", "--max_len_margin", "5"]):
    rc, out, err = run_main(evaluate_script, ["--workdir", run, "--split", "test",
                                              "--examples", "0"] + argv, capsys)
    assert rc == 0, err
    results.append(json.loads(out))
  names = ["step_6/hypotheses.test.greedy.txt", "step_6/hypotheses.test.beam2.alpha0.6.txt",
           "step_6/hypotheses.test.beam2.alpha1.txt",
           "step_3/hypotheses.test.greedy.margin5.txt"]
  assert [r["hypotheses"] for r in results] == [os.path.join(run, "eval", n) for n in names]
  assert all(os.path.exists(r["hypotheses"]) for r in results)
  with open(os.path.join(run, "eval", "results.jsonl"), encoding="utf-8") as f:
    assert [json.loads(line) for line in f] == results
  # The copy baseline is logged beside them.
  rc, out, err = run_main(evaluate_script, ["--workdir", run, "--split", "test",
                                            "--baseline", "copy"], capsys)
  assert rc == 0, err
  with open(os.path.join(run, "eval", "results.jsonl"), encoding="utf-8") as f:
    assert json.loads(f.read().splitlines()[-1]) == json.loads(out)


def test_evaluate_searches_a_grid_of_beams_and_alphas_as_separate_commands_would(
    workdir, tmp_path, capsys):
  """`--beam_size 1,2 --alpha 0.6,1.0`: greedy search once (it has no length penalty), beam 2
  with each alpha, in the order given, each the result, files and log line that the command
  for that one search gives; one JSON line per search and a closing table."""
  run = str(tmp_path / "run")
  shutil.copytree(workdir, run)
  shutil.rmtree(os.path.join(run, "eval"), ignore_errors=True)
  base = ["--workdir", run, "--split", "test", "--examples", "0"]
  rc, out, err = run_main(evaluate_script, base + ["--beam_size", "1,2", "--alpha",
                                                   "0.6,1.0,0.6"], capsys)
  assert rc == 0, err
  grid = [json.loads(line) for line in out.splitlines()]
  assert [(r["beam_size"], r["alpha"]) for r in grid] == [(1, None), (2, 0.6), (2, 1.0)]
  with open(os.path.join(run, "eval", "results.jsonl"), encoding="utf-8") as f:
    assert [json.loads(line) for line in f] == grid
  hypotheses = []
  for r in grid:
    with open(r["hypotheses"], encoding="utf-8") as f:
      hypotheses.append(f.read())
  table = err[err.index("evaluate: test: 3 searches"):].splitlines()
  differ = len({r["bleu"] for r in grid}) > 1
  assert len(table) == 5 + differ and table[2].split()[:2] == ["1", "-"], err
  top = max(r["bleu"] for r in grid)
  if differ:
    assert [line.startswith("*") for line in table[2:5]] == [r["bleu"] == top for r in grid], err
    # The p-value column: "-" on the first best row, a probability on the others.
    first_best = [r["bleu"] for r in grid].index(top)
    cells = [line.split()[-1] for line in table[2:5]]
    assert cells[first_best] == "-" and all(
        0 < float(c) <= 1 for i, c in enumerate(cells) if i != first_best), table
    assert table[5].startswith("p vs best: paired bootstrap (1,000 resamples"), table
  assert all(r["bleu_ci95"] >= 0 for r in grid) and all(
      "bs:1000" in r["bleu_ci95_signature"] for r in grid)
  assert err.count("evaluate: test: beam 2, alpha 0.6: BLEU") == 1, err
  grid_warnings = [line for line in err.splitlines() if line.startswith("warning:")]
  timing = ("time", "sentences_per_sec", "target_tokens_per_sec", "search_seconds",
            "compile_seconds")
  for r, text, argv in zip(grid, hypotheses, (["--beam_size", "1"],
                                              ["--beam_size", "2", "--alpha", "0.6"],
                                              ["--beam_size", "2", "--alpha", "1.0"])):
    rc, out, err = run_main(evaluate_script, base + argv, capsys)
    alone = json.loads(out)
    assert rc == 0 and {k: v for k, v in alone.items() if k not in timing} == {
        k: v for k, v in r.items() if k not in timing}, err
    with open(alone["hypotheses"], encoding="utf-8") as f:
      assert f.read() == text
    # The data's warnings (long sources here) are said once, as by one search, not per search.
    assert [line for line in err.splitlines() if line.startswith("warning:")] == grid_warnings
  # The combinations are checked before any is searched.
  with open(os.path.join(run, "eval", "results.jsonl"), encoding="utf-8") as f:
    logged = f.read()
  for argv, message in (
      (["--beam_size", "2,x"], "error: --beam_size 2,x: 'x' is not an integer\n"),
      (["--beam_size", "2,"], "error: --beam_size 2,: '' is not an integer (a comma too "
       "many?)\n"),
      (["--beam_size", "1", "--alpha", "0.6,1.0"], "error: alpha=0.6 is ignored by greedy "
       "search (beam_size 1), which has no length penalty: pass a beam_size of 2 or more with "
       "it, or drop it\n"),
      (["--beam_size", "2,0"], "error: beam_size=0 and batch_size=64 must be >= 1, "
       "max_len_margin=50 >= 0\n"),
      (["--alpha", "0.6,nan", "--beam_size", "2"], "error: alpha=nan: the length penalty must "
       "be a finite number (the paper's is 0.6)\n")):
    rc, out, err = run_main(evaluate_script, base + argv, capsys)
    assert rc == 1 and out == "" and err == message, (argv, err)
  with open(os.path.join(run, "eval", "results.jsonl"), encoding="utf-8") as f:
    assert f.read() == logged


def test_evaluate_several_steps_as_separate_commands_would(workdir, tmp_path, capsys):
  """`--step 3,6`: each checkpoint evaluated as `--step N` alone would be, into its own
  eval/step_<N>; a closing table with the steps; a missing step, or one --output_dir for all,
  refused before anything is searched."""
  run = str(tmp_path / "run")
  shutil.copytree(workdir, run)
  shutil.rmtree(os.path.join(run, "eval"), ignore_errors=True)
  base = ["--workdir", run, "--split", "test", "--examples", "0", "--beam_size", "1"]
  rc, out, err = run_main(evaluate_script, base + ["--step", "3,6,3"], capsys)
  assert rc == 0, err
  steps = [json.loads(line) for line in out.splitlines()]
  assert [(r["step"], os.path.basename(os.path.dirname(r["hypotheses"]))) for r in steps] == [
      (3, "step_3"), (6, "step_6")]
  assert "evaluate: test: step 3, greedy: BLEU" in err, err
  table = err[err.index("evaluate: test: 2 evaluations"):].splitlines()
  assert table[1].split()[:3] == ["step", "beam", "alpha"], table
  assert [line.lstrip("* ").split()[0] for line in table[2:4]] == ["3", "6"], table
  rc, out, err = run_main(evaluate_script, base + ["--step", "3"], capsys)
  alone = json.loads(out)
  timing = ("time", "sentences_per_sec", "target_tokens_per_sec", "search_seconds",
            "compile_seconds")
  assert rc == 0 and {k: v for k, v in alone.items() if k not in timing} == {
      k: v for k, v in steps[0].items() if k not in timing}, err
  with open(os.path.join(run, "eval", "results.jsonl"), encoding="utf-8") as f:
    logged = f.read()
  for argv, message in (
      (["--step", "3,99"], "error: step 99 is not in"),
      (["--step", "3,6", "--output_dir", str(tmp_path / "o")],
       "error: --output_dir with several --step values (3,6): each step's files would replace")):
    rc, out, err = run_main(evaluate_script, base + argv, capsys)
    assert rc == 1 and out == "" and err.startswith(message), (argv, err)
  with open(os.path.join(run, "eval", "results.jsonl"), encoding="utf-8") as f:
    assert f.read() == logged


def test_tokenized_bleu_takes_the_runs_target_language_and_tokenized_references_are_warned_of(
    workdir, tmp_path, capsys):
  """The Moses tokenizer gets the run's config.data.target_lang; references that are Moses
  output already (a .tok file: &quot;, ##AT##) are counted and warned about, lines named."""
  translator = translator_lib.Translator(workdir)
  translator.run = dict(translator.run, data=dict(translator.run["data"], target_lang="fr"))
  pairs = [("seven", "sieben"), ("eight", "acht &quot; x &quot;"), ("nine", "neun ##AT##-##AT## x")]
  result = evaluation.evaluate(translator, None, "mine", str(tmp_path / "out"), num_examples=0,
                               pairs=pairs)
  assert result["tokenized_bleu_signature"].startswith("moses-tok:fr|")
  # No examples asked for: no examples file.
  assert "examples" not in result and sorted(os.listdir(tmp_path / "out")) == [
      "eval.mine.greedy.json", "hypotheses.mine.greedy.txt", "references.mine.txt"]
  assert result["tokenized_looking_references"] == 2
  err = capsys.readouterr().err
  assert "warning: the mine references: 2 (pairs 2, 3) of 3 look tokenized already" in err, err
  # A test set of one's own names its file and lines; raw references give no warning.
  src, ref = tmp_path / "t.en", tmp_path / "t.de"
  src.write_text("seven\neight\n", encoding="utf-8")
  ref.write_text("sieben\nacht @-@ x\n", encoding="utf-8")
  run = str(tmp_path / "run")
  shutil.copytree(workdir, run)
  rc, out, err = run_main(evaluate_script, ["--workdir", run, "--source", str(src),
                                            "--reference", str(ref)], capsys)
  assert rc == 0 and json.loads(out)["tokenized_looking_references"] == 1, err
  assert f"warning: --reference {ref}: 1 (line 2) of 2 look tokenized already" in err, err
  rc, out, err = run_main(evaluate_script, ["--workdir", run, "--split", "test"], capsys)
  assert rc == 0 and json.loads(out)["tokenized_looking_references"] == 0
  assert "look tokenized" not in err, err
  # Periods and commas split off as words count when a tenth of the lines have them (a .tok
  # file), not in raw text that has one (French's « , »).
  raw = [f"Satz {i}, mit Komma." for i in range(30)] + ["Opérande attendu après « , »"]
  assert evaluation.tokenized_lines(raw) == []
  tok = [f"Satz {i} , mit Komma ." for i in range(3)] + raw[:17]
  assert evaluation.tokenized_lines(tok) == [1, 2, 3]
  # The same source scored against other references replaces the files of that name: said.
  ref2 = tmp_path / "t2.de"
  ref2.write_text("sieben\nacht\n", encoding="utf-8")
  rc, out, err = run_main(evaluate_script, ["--workdir", run, "--source", str(src),
                                            "--reference", str(ref2)], capsys)
  assert rc == 0 and f"held the result for reference_file {ref}; it is replaced by this one for " \
      f"{ref2}" in err, err
  assert "references.t.txt held other references" in err
  assert f"replaced by those of {ref2}, and" in err
  # The references file is every search's of the test set, not only the same search's: beam 2
  # against the first references (no earlier beam 2 result) is told too; again, it is not.
  for told in (True, False):
    rc, out, err = run_main(evaluate_script, ["--workdir", run, "--source", str(src),
                                              "--reference", str(ref), "--beam_size", "2"],
                            capsys)
    assert rc == 0 and ("references.t.txt held other references" in err) == told, err
    assert "held the result for" not in err, err
  assert open(json.loads(out)["references"], encoding="utf-8").read() == ref.read_text(
      encoding="utf-8")


def test_bleu_text_and_a_grid_without_intervals_or_p_values():
  assert evaluation.bleu_text({"bleu": 32.123, "bleu_ci95": 3.577}) == "BLEU 32.12 +- 3.58"
  assert evaluation.bleu_text({"bleu": 32.123, "bleu_ci95": None}) == "BLEU 32.12"
  assert evaluation.bleu_text({"bleu": 32.123}) == "BLEU 32.12"  # a result from before
  rows = [dict(beam_size=1, alpha=None, bleu=20.0, chrf=50.0, tokenized_bleu=21.0,
               sentences_per_sec=10.0, bleu_ci95=None),
          dict(beam_size=4, alpha=0.6, bleu=22.5, chrf=51.0, tokenized_bleu=23.0,
               sentences_per_sec=5.0, bleu_ci95=None)]
  table = evaluation.grid_table("test", rows, [None, None]).splitlines()
  assert "p vs best" not in "\n".join(table) and len(table) == 4, table
  assert table[3].split() == ["*", "4", "0.6", "22.50", "51.00", "23.00", "5.0"], table
  # Every source blank: nothing searched, no speed.
  rows[1]["sentences_per_sec"] = None
  table = evaluation.grid_table("test", rows, [None, None]).splitlines()
  assert table[3].split() == ["*", "4", "0.6", "22.50", "51.00", "23.00", "-"], table


def test_a_grids_columns_end_under_their_headings_and_hypotheses_are_read_line_by_line(
    tmp_path):
  rows = [dict(beam_size=1, alpha=None, bleu=20.0, chrf=50.0, tokenized_bleu=21.0,
               sentences_per_sec=10.0, bleu_ci95=1.25, step=100),
          dict(beam_size=4, alpha=0.6, bleu=22.5, chrf=51.0, tokenized_bleu=23.0,
               sentences_per_sec=5.0, bleu_ci95=1.5, step=200)]
  for p_values in (None, [0.012, None]):
    table = evaluation.grid_table("test", rows, p_values).splitlines()
    heading, body = table[1], table[2:4]
    assert all(len(line) == len(heading) for line in body), table
    # Each value's last character under its heading's: columns right-aligned.
    ends = [m.end() for m in re.finditer(r"\S+(?: \S+)*", heading)]
    assert all(line[end - 1] != " " and (end == len(line) or line[end] == " ")
               for line in body for end in ends), table
  path = tmp_path / "hypotheses.test.greedy.txt"
  path.write_bytes("eins\nzwei\r drei\n\nvier\n".encode())
  assert bleu.read_lines(str(path)) == ["eins", "zwei\r drei", "", "vier"]


def test_a_grid_marks_every_best_row_and_none_when_all_are_the_same():
  results = [dict(beam_size=1, alpha=None, bleu=20.0, chrf=50.0, tokenized_bleu=21.0,
                  sentences_per_sec=10.0),
             dict(beam_size=4, alpha=0.6, bleu=22.5, chrf=51.0, tokenized_bleu=23.0,
                  sentences_per_sec=5.0),
             dict(beam_size=4, alpha=1.0, bleu=22.5, chrf=51.5, tokenized_bleu=23.5,
                  sentences_per_sec=5.0)]
  table = evaluation.grid_table("validation", results).splitlines()
  assert table[0] == "evaluate: validation: 3 searches (the best sacreBLEU marked *)"
  assert [line[0] for line in table[2:]] == [" ", "*", "*"], table
  assert table[3].split() == ["*", "4", "0.6", "22.50", "51.00", "23.00", "5.0"], table
  # One best search on the development set: how to report it on the test split.
  results[2]["bleu"] = 23.0
  assert evaluation.grid_table("validation", results).splitlines()[-1] == (
      "chosen on the development set: score the test split with --beam_size 4 --alpha 1 "
      "--split test")
  assert "chosen" not in evaluation.grid_table("test", results)
  same = [dict(r, bleu=0.0) for r in results]
  table = evaluation.grid_table("validation", same).splitlines()
  assert "(all the same sacreBLEU)" in table[0] and "*" not in "".join(table[2:]), table


def test_evaluate_scores_a_test_set_of_ones_own(workdir, tmp_path, capsys):
  run = str(tmp_path / "run")
  shutil.copytree(workdir, run)
  pairs = get_data(ml_collections.ConfigDict(workdir_lib.load_run_config(run)["data"]),
                   run).raw_examples("test")
  src, ref = tmp_path / "newstest.en", tmp_path / "newstest.de"
  src.write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
  ref.write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
  rc, out, err = run_main(evaluate_script, ["--workdir", run, "--split", "test"], capsys)
  assert rc == 0, err
  split = json.loads(out)
  rc, out, err = run_main(evaluate_script, ["--workdir", run, "--source", str(src),
                                            "--reference", str(ref)], capsys)
  assert rc == 0, err
  own = json.loads(out)
  # The same pairs as the test split: the same scores, under the files' name.
  assert (own["bleu"], own["chrf"], own["sentences"]) == (split["bleu"], split["chrf"],
                                                         EVAL_SIZE)
  assert own["split"] == "newstest" and own["source_file"] == str(src)
  assert own["hypotheses"] == os.path.join(run, "eval", "step_6",
                                           "hypotheses.newstest.greedy.txt")
  with open(os.path.join(run, "eval", "results.jsonl"), encoding="utf-8") as f:
    assert json.loads(f.read().splitlines()[-1]) == own
  rc, out, err = run_main(evaluate_script, ["--workdir", run, "--source", str(src),
                                            "--reference", str(ref), "--baseline", "copy",
                                            "--name", "nt14"], capsys)
  assert rc == 0 and json.loads(out)["split"] == "nt14", err
  # Misaligned files and a lone --source are one error line each.
  ref.write_text("one line\n", encoding="utf-8")
  rc, _, err = run_main(evaluate_script, ["--workdir", run, "--source", str(src),
                                          "--reference", str(ref)], capsys)
  assert rc == 1 and f"--source {src} has {EVAL_SIZE} lines but --reference {ref} has 1" in err
  rc, _, err = run_main(evaluate_script, ["--workdir", run, "--source", str(src)], capsys)
  assert rc == 1 and "--source and --reference go together" in err
  # A name that would replace a split's files, or leave eval/, is refused.
  for name, why in (("test", "is a split's"), ("../x", "must be letters")):
    rc, _, err = run_main(evaluate_script, ["--workdir", run, "--source", str(src),
                                            "--reference", str(src), "--name", name], capsys)
    assert rc == 1 and f"the test set's name {name!r} (--name) {why}" in err, err


def test_translate_and_evaluate_read_a_long_source_alike_and_log_what_they_ran(workdir, tmp_path,
                                                                              capsys):
  """translate.py cut a source over max_len - 1 pieces where evaluate.py read it whole: two
  answers for one sentence. Both read it whole now (sinusoidal positions), and warn. The log
  line says what ran: alpha None for greedy search, the batch size, the time."""
  run = str(tmp_path / "run")
  shutil.copytree(workdir, run)
  src, ref = tmp_path / "long.en", tmp_path / "long.de"
  src.write_text(f"seven\n{LONG}\n", encoding="utf-8")
  ref.write_text("sieben\nviele\n", encoding="utf-8")
  braces = tmp_path / "long{1}{x}.en"  # the line names are no format string
  shutil.copy(src, braces)
  rc, translated, err = run_main(translate_script, ["--workdir", run, "--input", str(braces)],
                                 capsys)
  assert rc == 0 and "input " not in err and f"{braces} line 2: 276 pieces, more than" in err, err
  rc, out, err = run_main(evaluate_script, ["--workdir", run, "--source", str(src),
                                            "--reference", str(ref), "--batch_size", "8"], capsys)
  assert rc == 0 and "long pair 2: 276 pieces, more than the 31" in err, err
  result = json.loads(out)
  with open(result["hypotheses"], encoding="utf-8") as f:
    assert f.read() == translated
  assert (result["long_sources"], result["truncated_sources"]) == (1, 0)
  assert (result["alpha"], result["batch_size"], result["averaged_steps"]) == (None, 8, None)
  with open(os.path.join(run, "eval", "results.jsonl"), encoding="utf-8") as f:
    logged = json.loads(f.read().splitlines()[-1])
  assert logged == result and abs(logged["time"] - time.time()) < 600
  # A model with a learned position table has no rows past max_len: cut, in both tools.
  cut = translator_lib.Translator(run)
  cut.config = cut.config.replace(position_encoding="learned")
  warnings = []
  assert len(cut.encode([LONG], warnings.append)[0]) == 32
  assert "truncated to 31 pieces" in warnings[0]


def test_empty_lines_of_a_test_set_are_warned_about_and_counted(workdir, tmp_path, capsys):
  """sacreBLEU's chrF leaves out pairs with an empty reference: their hypotheses counted for
  nothing without a word. Scored still (a blank line can be legitimate), but said."""
  run = str(tmp_path / "run")
  shutil.copytree(workdir, run)
  src, ref = tmp_path / "t.en", tmp_path / "t.de"
  src.write_text("seven\n\neight\nnine\nten\n", encoding="utf-8")
  ref.write_text("\nzwei\n \nneun\n\n", encoding="utf-8")
  files = ["--workdir", run, "--source", str(src), "--reference", str(ref), "--examples", "0"]
  for argv in ([], ["--baseline", "copy"]):
    rc, out, err = run_main(evaluate_script, files + argv, capsys)
    assert rc == 0, err
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert warnings == [f"warning: empty lines: --reference {ref}: 3 (lines 1, 3, 5); --source "
                        f"{src}: 1 (line 2); sacreBLEU's chrF leaves out pairs with an empty "
                        "reference and an empty source is not translated (empty_references and "
                        "empty_sources in the result)"], err
    result = json.loads(out)
    assert (result["empty_references"], result["empty_sources"]) == (3, 1)
    # Where they came from, with the copy baseline too.
    assert (result["source_file"], result["reference_file"]) == (str(src), str(ref))
  # A split's pairs are counted as well; none are empty, and nothing is said.
  rc, out, err = run_main(evaluate_script, ["--workdir", run, "--baseline", "copy"], capsys)
  assert rc == 0 and "warning:" not in err, err
  assert (json.loads(out)["empty_references"], json.loads(out)["empty_sources"]) == (0, 0)
  many = [("", "")] * 7
  assert evaluation.check_empty(many, "test", warn=lambda m: None) == {
      "empty_sources": 7, "empty_references": 7}
  said = []
  evaluation.check_empty(many, "test", warn=said.append)
  assert said[0].startswith("empty pairs: the test references: 7 (pairs 1, 2, 3, 4, 5, ...); "
                            "the test sources: 7 (pairs 1, 2, 3, 4, 5, ...)"), said
  # Either alone is said too.
  for pair, counts in ((("a", ""), "references: 1 (pair 2); the test sources: 0"),
                       (("", "a"), "references: 0; the test sources: 1 (pair 2)")):
    said = []
    evaluation.check_empty([("x", "y"), pair], "test", warn=said.append)
    assert len(said) == 1 and said[0].startswith(f"empty pairs: the test {counts};"), said


def test_evaluation_files_are_written_whole_under_their_own_temporary_names(tmp_path):
  """Two evaluations of one checkpoint, split and search ending together: each writes its own
  temporary file, and the last rename wins whole."""
  import threading
  path = str(tmp_path / "eval.test.greedy.json")
  errors = []

  def write(text):
    try:
      for _ in range(200):
        write_atomically(path, text)
    except OSError as e:
      errors.append(e)

  threads = [threading.Thread(target=write, args=(t * 5000,)) for t in "ab"]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert not errors and open(path).read() in ("a" * 5000, "b" * 5000)
  assert os.listdir(tmp_path) == ["eval.test.greedy.json"]


def test_a_result_appended_after_a_line_cut_short_is_read(tmp_path):
  """A full disk or a power loss cut eval/results.jsonl's (or metrics.jsonl's) last line short:
  the next record starts a line of its own. Glued onto the cut one it was unreadable too, and
  the sweep report showed the evaluation before it."""
  from transformer_jax.run import metrics
  from transformer_jax.sweeps.report import evaluated
  run = str(tmp_path / "run")
  os.makedirs(os.path.join(run, "eval"))
  with open(os.path.join(run, "eval", "results.jsonl"), "w") as f:
    f.write(json.dumps({"split": "test", "bleu": 10.0}) + '\n{"split": "test", "bl')
  evaluation._write(str(tmp_path / "out"), "test", "greedy", ["a"], {"split": "test", "bleu": 20.0},
                    [("a", "a")], 0, run)
  assert evaluated(run)["test_bleu"] == 20.0
  with open(os.path.join(run, "metrics.jsonl"), "w") as f:
    f.write('{"step": 1, "train_loss": 3.0}\n{"step": 2, "train_lo')
  metrics.MetricsWriter(run, tensorboard=False).write(2, {"train_loss": 2.0})
  assert metrics.last_values(run) == {"step": 2, "train_loss": 2.0}
  path = os.path.join(run, "metrics.jsonl")
  with open(path, "w") as f:   # one byte, cut short
    f.write("{")
  metrics.MetricsWriter(run, tensorboard=False).write(3, {"train_loss": 1.0})
  assert metrics.last_values(run) == {"step": 3, "train_loss": 1.0}
  # A whole last record whose line break was lost: a resume keeps it, ending its line.
  with open(path, "w") as f:
    f.write('{"step": 1, "train_loss": 3.0}\n{"step": 2, "train_loss": 2.0}')
  metrics._truncate(run, 2)
  assert open(path).read() == '{"step": 1, "train_loss": 3.0}\n{"step": 2, "train_loss": 2.0}\n'


def test_evaluation_files_and_a_resumes_metrics_reach_the_disk_before_their_rename(
    tmp_path, monkeypatch):
  """Synced before the rename and the directory after it: without that, a power loss can leave
  a renamed eval.<name>.json, or the metrics.jsonl a resume rewrote, empty."""
  import stat

  from transformer_jax.run import metrics
  synced, fsync = [], os.fsync
  monkeypatch.setattr(os, "fsync", lambda fd: synced.append(
      "directory" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file") or fsync(fd))
  write_atomically(str(tmp_path / "eval.test.greedy.json"), "{}")
  assert synced == ["file", "directory"]
  (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
  metrics.MetricsWriter(str(tmp_path), tensorboard=False, resume_step=1)
  assert synced == ["file", "directory"] * 2
  assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1}\n'


def test_an_evaluation_outlives_its_checkpoint(workdir, tmp_path):
  """Training rotated the step out while it was being evaluated: the results are kept, and no
  stray step directory is written back among the checkpoints."""
  run = str(tmp_path / "run")
  shutil.copytree(workdir, run)
  translator = translator_lib.Translator(run, step=3, batch_size=8)
  shutil.rmtree(os.path.join(run, "checkpoints", "3"))
  data = get_data(ml_collections.ConfigDict(translator.run["data"]), run)
  result = evaluation.evaluate(translator, data, "test", num_examples=0)
  assert result["step"] == 3 and os.path.exists(result["hypotheses"])
  assert os.listdir(os.path.join(run, "checkpoints")) == ["6"]
  assert checkpointing.checkpoint_steps(os.path.join(run, "checkpoints")) == [6]


def test_default_evaluation_directories(tmp_path):
  w = str(tmp_path / "w")
  assert evaluation.default_output_dir(w, os.path.join(w, "checkpoints"), 5) == os.path.join(
      w, "eval", "step_5")
  # Averages of different counts share their last step: their evaluations must not.
  assert evaluation.default_output_dir(w, os.path.join(w, "averaged"), 5, 2) == os.path.join(
      w, "eval", "averaged_last2_5")
  assert evaluation.default_output_dir(w, os.path.join(w, "averaged"), 5, 1) == os.path.join(
      w, "eval", "averaged_last1_5")
  assert evaluation.default_output_dir(w, os.path.join(w, "best_bleu"), 5) == os.path.join(
      w, "eval", "best_bleu_5")
  # Another directory's: its last two names and a digest of its path, so that two runs named
  # alike in two places (a/run, b/run) keep their evaluations apart.
  other = str(tmp_path / "other run" / "checkpoints")
  digest = hashlib.sha256(os.path.abspath(other).encode()).hexdigest()[:8]
  assert evaluation.default_output_dir(w, other, 7) == os.path.join(
      w, "eval", f"other_run.checkpoints-{digest}_7")
  assert evaluation.default_output_dir(w, str(tmp_path / "a" / "run"), 7) != (
      evaluation.default_output_dir(w, str(tmp_path / "b" / "run"), 7))
  assert evaluation.search_tag(1, 0.6, 50) == "greedy"
  assert evaluation.search_tag(4, 0.6, 50) == "beam4.alpha0.6"
  assert evaluation.search_tag(1, 0.6, 10) == "greedy.margin10"
  # Two alphas alike to 6 digits get two tags (two files); others keep their short tag.
  assert evaluation.search_tag(4, 0.6000001, 50) == "beam4.alpha0.6000001"
  assert evaluation.search_tag(4, 1 / 3, 50) == "beam4.alpha0.3333333333333333"
  assert evaluation.search_tag(4, 1e-7, 50) == "beam4.alpha1e-07"


def test_examples_are_a_seeded_draw_plus_the_worst_and_escape_table_cells():
  pairs = [(f"source {i}", f"reference number {i}") for i in range(30)]
  hyps = [f"reference number {i}" if i % 3 else "x | y" for i in range(30)]
  rows = evaluation.examples(pairs, hyps, num=5, worst=2, seed=0)
  assert rows == evaluation.examples(pairs, hyps, num=5, worst=2, seed=0)
  assert rows[:5] != evaluation.examples(pairs, hyps, num=5, worst=2, seed=1)[:5]
  drawn = [r["pair"] for r in rows[:5]]
  assert drawn == sorted(drawn) and not any(r["worst"] for r in rows[:5])
  assert all((r["source"], r["reference"], r["hypothesis"]) == (*pairs[r["pair"] - 1],
                                                               hyps[r["pair"] - 1]) for r in rows)
  # The worst: the lowest sentence chrF among the pairs not drawn (ties: the earlier pair).
  others = sorted(((bleu.sentence_chrf(hyps[i], pairs[i][1]), i + 1) for i in range(30)
                   if i + 1 not in drawn))
  assert [r["pair"] for r in rows[5:]] == [n for _, n in others[:2]]
  assert all(r["worst"] and r["chrf"] < 50 for r in rows[5:])
  assert all(r["chrf"] == 100 for r in rows if r["hypothesis"] == r["reference"])
  table = evaluation.examples_markdown(rows)
  assert table.count("\n") == 2 + 7 and "x \\| y" in table
  assert all(line.count(" | ") == 5 for line in table.splitlines()[2:])


def test_copy_baseline_scores_the_sources_as_translations(workdir, tmp_path, capsys):
  rc, out, err = run_main(evaluate_script, ["--workdir", workdir, "--split", "test",
                                            "--baseline", "copy"], capsys)
  assert rc == 0, err
  result = json.loads(out)
  assert result["baseline"] == "copy" and result["sentences"] == EVAL_SIZE
  hyp_path = os.path.join(workdir, "baselines", "hypotheses.test.copy.txt")
  assert result["hypotheses"] == hyp_path
  run = workdir_lib.load_run_config(workdir)
  pairs = get_data(ml_collections.ConfigDict(run["data"]), workdir).raw_examples("test")
  with open(hyp_path, encoding="utf-8") as f:
    assert f.read().splitlines() == [s for s, _ in pairs]
  expected, _ = bleu.corpus_bleu([s for s, _ in pairs], [t for _, t in pairs])
  assert result["bleu"] == pytest.approx(expected) and 0 <= result["bleu"] < 50
  tokenized, signature = bleu.tokenized_bleu([s for s, _ in pairs], [t for _, t in pairs], "de")
  assert (result["tokenized_bleu"], result["tokenized_bleu_signature"]) == (tokenized, signature)
  assert "baseline copy" in err and f"(tokenized BLEU {tokenized:.2f})" in err
  # It needs neither a model nor a tokenizer: a workdir with only its config.json works, and
  # gets no spm.model of its own (which a later resume would then use).
  bare = tmp_path / "bare"
  bare.mkdir()
  shutil.copy(os.path.join(workdir, "config.json"), bare)
  rc, out, err = run_main(evaluate_script, ["--workdir", str(bare), "--baseline", "copy"], capsys)
  assert rc == 0 and json.loads(out)["bleu"] == pytest.approx(expected), err
  assert sorted(os.listdir(bare)) == ["baselines", "config.json", "eval"]
  # A run from before data.split was recorded: a numbers run never read it, and is scored
  # as before; a text run is told what to add, not guessed (its held-out pairs depend on it)
  # and not a KeyError traceback.
  with open(bare / "config.json") as f:
    old = json.load(f)
  del old["data"]["split"]
  with open(bare / "config.json", "w") as f:
    json.dump(old, f)
  rc, out, err = run_main(evaluate_script, ["--workdir", str(bare), "--baseline", "copy"],
                          capsys)
  assert rc == 0 and json.loads(out)["bleu"] == pytest.approx(expected), err
  old["data"]["dataset"] = "text"
  with open(bare / "config.json", "w") as f:
    json.dump(old, f)
  rc, _, err = run_main(evaluate_script, ["--workdir", str(bare), "--baseline", "copy"], capsys)
  assert rc == 1 and f"{bare}/config.json has no data.split" in err and '"split": "source"' in err
  # Flags only: a stray argument is an error, not ignored.
  assert run_main(evaluate_script, ["--workdir", workdir, "test"], capsys)[0] == 2


def test_load_params_reads_only_the_parameters(workdir, monkeypatch):
  """The tools never read the optimizer state: only `state/params` arrays are deserialized."""
  from orbax.checkpoint import type_handlers
  deserialize = type_handlers.ArrayHandler.deserialize
  read = []

  async def counting(self, infos, args=None):
    read.extend(info.name for info in infos)
    return await deserialize(self, infos, args)

  monkeypatch.setattr(type_handlers.ArrayHandler, "deserialize", counting)
  step, params = checkpointing.load_params(workdir, 3)
  assert step == 3 and read and len(read) == len(jax.tree.leaves(params))
  saved = os.listdir(os.path.join(workdir, "checkpoints", "3", "state"))
  assert any("ocdbt" in name or name == "_METADATA" for name in saved)
  # The full state has the Adam moments as well: three times as many arrays at least.
  import orbax.checkpoint as ocp
  with ocp.CheckpointManager(os.path.join(workdir, "checkpoints"),
                             options=ocp.CheckpointManagerOptions(read_only=True),
                             item_handlers={"state": ocp.PyTreeCheckpointHandler()}) as mgr:
    tree = mgr.item_metadata(3)["state"].tree
  assert len(jax.tree.leaves(tree)) >= 3 * len(read)


# ---------------------------------------------------------------- averaging


def test_commands_in_messages_quote_a_workdir_with_spaces(tmp_path):
  spaced = str(tmp_path / "my run")
  with pytest.raises(workdir_lib.RunError) as e:
    checkpointing.resolve_checkpoint(spaced)
  assert f"--workdir '{spaced}'" in str(e.value), e.value
  with pytest.raises(workdir_lib.RunError, match=f"--workdir '{spaced}' --last N first"):
    checkpointing.resolve_checkpoint(spaced, averaged=True)


def test_reading_parameters_prints_no_orbax_notices(workdir, caplog):
  with caplog.at_level(logging.INFO, logger="absl"):
    checkpointing.load_params(workdir)
    assert checkpointing.load_meta(os.path.join(workdir, "checkpoints"), 6)["step"] == 6
    logging.getLogger("absl").warning("a real warning")
  messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
  assert messages == ["a real warning"], messages


def test_average_refuses_checkpoints_of_different_models():
  a = {"dense": {"kernel": np.ones((2, 3), np.float32)}}
  b = {"dense": {"kernel": np.zeros((2, 3), np.float32)}}
  mean = averaging.average_params(iter([("step 1", a), ("step 2", b)]))
  np.testing.assert_array_equal(mean["dense"]["kernel"], np.full((2, 3), 0.5, np.float32))
  wide = {"dense": {"kernel": np.ones((1, 3), np.float32)}}  # would broadcast silently
  with pytest.raises(workdir_lib.RunError,
                     match=r"\['dense'\]\['kernel'\] has shape \(1, 3\) in step 9 but "
                           r"\(2, 3\) in step 1"):
    averaging.average_params([("step 1", a), ("step 9", wide)])
  with pytest.raises(workdir_lib.RunError, match="step 9 and step 1 have different parameter"):
    averaging.average_params([("step 1", a), ("step 9", {"other": a["dense"]})])


def test_average_is_elementwise_mean_and_loadable(workdir, capsys, monkeypatch):
  rc, out, err = run_main(average_script, ["--workdir", workdir, "--last", "2"], capsys)
  assert rc == 0, err
  result = json.loads(out)
  averaged_dir = os.path.join(workdir, "averaged")
  assert result == {"output": averaged_dir, "step": 6, "averaged_steps": [3, 6]}
  assert "replacing" not in err
  # Training's own directory is untouched.
  assert checkpointing.checkpoint_steps(os.path.join(workdir, "checkpoints")) == [3, 6]
  _, p3 = checkpointing.load_params(workdir, 3)
  _, p6 = checkpointing.load_params(workdir, 6)
  step, avg = checkpointing.load_params(averaged_dir)
  assert step == 6
  for a, b, m in zip(jax.tree.leaves(p3), jax.tree.leaves(p6), jax.tree.leaves(avg)):
    assert m.dtype == a.dtype
    np.testing.assert_allclose(m, (a.astype(np.float32) + b.astype(np.float32)) / 2, rtol=1e-6,
                               atol=1e-7)
  assert not all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(p3), jax.tree.leaves(p6)))
  assert averaging.averaged_steps(averaged_dir, 6) == [3, 6]
  assert averaging.averaged_steps(os.path.join(workdir, "checkpoints"), 6) is None  # trained
  # Loadable by the tools; running it again replaces the average.
  rc, out, err = run_main(translate_script, ["--workdir", workdir, "--averaged"], capsys,
                          stdin="seven\n\n", monkeypatch=monkeypatch)
  assert rc == 0 and len(out.split("\n")) == 3, err
  rc, _, err = run_main(average_script, ["--workdir", workdir, "--last", "1"], capsys)
  assert rc == 0 and f"replacing the earlier average saved as step 6 in {averaged_dir}" in err, err
  _, avg1 = checkpointing.load_params(averaged_dir)
  for a, b in zip(jax.tree.leaves(avg1), jax.tree.leaves(p6)):
    np.testing.assert_array_equal(a, b)
  rc, _, err = run_main(average_script, ["--workdir", workdir, "--last", "5"], capsys)
  assert rc == 1 and "holds only 2 checkpoint(s)" in err and "keep_checkpoints=5" in err
  # A workdir with no checkpoint: what to train.
  empty = os.path.join(os.path.dirname(workdir), "no_run")
  with pytest.raises(workdir_lib.RunError,
                     match=r"no checkpoint in .*no_run/checkpoints: train first with "
                           r"scripts/train\.py --config configs/default\.py"):
    averaging.average_checkpoints(empty, 2)
  with pytest.raises(workdir_lib.RunError, match="--last 0: must be >= 1"):  # not "all of them"
    averaging.average_checkpoints(workdir, 0)


def test_an_average_is_never_written_where_a_run_reads_its_own_checkpoints(workdir, capsys,
                                                                          tmp_path):
  """--output into another run's checkpoints/, averaged/, best_<metric>/ or eval/, or among
  trained checkpoints, made that run (or that directory's reader) take the average for its
  own model."""
  run = str(tmp_path / "run")
  shutil.copytree(workdir, run)
  other = tmp_path / "other"
  for name in ("checkpoints", "best_bleu", "averaged", "eval"):
    (other / name).mkdir(parents=True)
  shutil.copy(os.path.join(workdir, "config.json"), other / "config.json")
  os.symlink(other / "checkpoints", tmp_path / "link")
  loose = str(tmp_path / "loose")  # trained checkpoints, no run around them
  shutil.copytree(os.path.join(workdir, "checkpoints", "6"), os.path.join(loose, "6"))
  for output, says in (
      (str(other / "checkpoints"), f"is the checkpoints/ directory of the run {other}, which "
                                   "that run reads as its own"),
      (str(other / "averaged"), f"is the averaged/ directory of the run {other}"),
      (str(other / "eval"), f"is the eval/ directory of the run {other}"),
      (str(tmp_path / "link"), f"is the checkpoints/ directory of the run {other}"),
      (str(other / "checkpoints" / "12"), f"is inside the checkpoints/ directory of the run "
                                          f"{other}"),
      (str(other / "best_bleu"), "is the best_bleu/ directory of the run "),
      (os.path.join(run, "checkpoints", "..", "checkpoints"), "refusing to write the average "
                                                               "into"),
      (loose, "holds checkpoints that are not averages (step(s) [6])")):
    rc, out, err = run_main(average_script, ["--workdir", run, "--last", "2", "--output", output],
                            capsys)
    assert rc == 1 and says in err and out == "", (output, err)
  assert all(os.listdir(other / name) == [] for name in ("checkpoints", "best_bleu",
                                                         "averaged", "eval"))
  assert os.listdir(loose) == ["6"]
  assert checkpointing.checkpoint_steps(os.path.join(run, "checkpoints")) == [3, 6]
  # A new directory is fine, and so is one of averages, and the run's own averaged/ named.
  for output in [str(tmp_path / "averages")] * 2 + [os.path.join(run, "averaged")]:
    rc, out, err = run_main(average_script, ["--workdir", run, "--last", "2", "--output", output],
                            capsys)
    assert rc == 0 and json.loads(out)["averaged_steps"] == [3, 6], err


def test_an_average_of_one_checkpoint_is_warned_about(workdir, capsys, tmp_path):
  run = str(tmp_path / "run")
  shutil.copytree(workdir, run)
  source = os.path.join(run, "checkpoints")
  # The tiny config's average_last_checkpoints is 1, as most configs': a copy of the last step.
  for argv, why in (([], "--last not given, and the run's config.average_last_checkpoints is 1"),
                    (["--last", "1"], "--last 1")):
    rc, out, err = run_main(average_script, ["--workdir", run] + argv, capsys)
    assert rc == 0 and json.loads(out)["averaged_steps"] == [6], err
    warnings = [line for line in err.splitlines() if "warning:" in line]
    assert warnings == [f"average_checkpoints: warning: {why}: the \"average\" is a copy of "
                        f"step 6; pass --last N to average the last N checkpoints ({source} "
                        "holds 2)"], err
  rc, _, err = run_main(average_script, ["--workdir", run, "--last", "2"], capsys)
  assert rc == 0 and "warning:" not in err, err
  # A run that kept one checkpoint has no N to pass: what to change is what training keeps.
  shutil.rmtree(os.path.join(source, "3"))
  rc, out, err = run_main(average_script, ["--workdir", run], capsys)
  assert rc == 0 and json.loads(out)["averaged_steps"] == [6], err
  warnings = [line for line in err.splitlines() if "warning:" in line]
  assert warnings == ["average_checkpoints: warning: --last not given, and the run's "
                      "config.average_last_checkpoints is 1: the \"average\" is a copy of step 6; "
                      f"{source} holds no other: training keeps the last "
                      "config.keep_checkpoints (3 in this run) of its checkpoints, saved every "
                      "config.checkpoint_every_steps (3) steps, and those at multiples of "
                      "config.keep_every_steps (0; 0 is none): train with "
                      "--config.keep_checkpoints=N (or --config.keep_every_steps) to have "
                      "checkpoints to average"], err


def test_evaluations_of_averages_of_different_counts_keep_apart(workdir, capsys, tmp_path):
  """`--last 1` and `--last 2` both save as averaged/6: their evaluations went to one
  eval/averaged_6/ and replaced each other's files."""
  run = str(tmp_path / "run")
  shutil.copytree(workdir, run)
  hypotheses = {}
  for last in ("2", "1"):
    rc, _, err = run_main(average_script, ["--workdir", run, "--last", last], capsys)
    assert rc == 0, err
    rc, out, err = run_main(evaluate_script, ["--workdir", run, "--averaged", "--examples", "0"],
                            capsys)
    assert rc == 0, err
    hypotheses[last] = json.loads(out)["hypotheses"]
  assert hypotheses == {n: os.path.join(run, "eval", f"averaged_last{n}_6",
                                        "hypotheses.test.greedy.txt") for n in ("1", "2")}
  assert all(os.path.exists(path) for path in hypotheses.values())


def test_average_leaves_out_a_checkpoint_a_signal_saved(workdir, capsys, tmp_path):
  # The run's own saves (3 and 6, its cadence) say so; say 3 had been saved by a SIGTERM.
  assert checkpointing.load_meta(os.path.join(workdir, "checkpoints"), 6)["on_cadence"] is True
  run = str(tmp_path / "run")
  shutil.copytree(workdir, run)
  path = os.path.join(run, "checkpoints", "3", "meta", "metadata")
  with open(path) as f:
    meta = json.load(f)
  with open(path, "w") as f:
    json.dump({**meta, "on_cadence": False}, f)
  rc, out, err = run_main(average_script, ["--workdir", run, "--last", "1"], capsys)
  assert rc == 0 and json.loads(out)["averaged_steps"] == [6], err
  assert "leaving out step(s) [3]: saved off the checkpoint cadence where a signal or early " \
      "stopping stopped the run" in err
  # It took a kept place: where the evenly spaced ones are too few, it is averaged, and said.
  rc, out, err = run_main(average_script, ["--workdir", run, "--last", "2"], capsys)
  assert rc == 0 and json.loads(out)["averaged_steps"] == [3, 6], err
  assert "warning: averaging step(s) [3] too, saved off the cadence where a signal or early " \
      "stopping stopped the run: only 1 " \
      "evenly spaced checkpoint(s) are kept for --last 2" in err, err


def test_average_of_a_damaged_checkpoint_names_the_step(workdir, capsys, tmp_path,
                                                        monkeypatch):
  # Training sets a damaged step aside; averaging used to print TensorStore's traceback.
  damaged = str(tmp_path / "run")
  shutil.copytree(workdir, damaged)
  for root, _, files in os.walk(os.path.join(damaged, "checkpoints", "3", "state")):
    for name in files:
      open(os.path.join(root, name), "wb").close()
  rc, _, err = run_main(average_script, ["--workdir", damaged, "--last", "2"], capsys)
  assert rc == 1 and (
      f"\nerror: checkpoint 3 in {os.path.join(damaged, 'checkpoints')} does not load, so it "
      "cannot be averaged (") in err, err
  assert "it is damaged; average only the steps after it (--last 1)" in err and \
      "Traceback" not in err, err
  # The last step damaged: no later one to average; the error's first line is quoted.
  load = checkpointing.load_params
  def damaged_6(directory, step=None):
    if step == 6:
      raise ValueError("chunk 0 of state/params is short\nwhile reading a shard")
    return load(directory, step)
  monkeypatch.setattr(checkpointing, "load_params", damaged_6)
  rc, _, err = run_main(average_script, ["--workdir", workdir, "--last", "2"], capsys)
  assert rc == 1 and ("(ValueError: chunk 0 of state/params is short): it is damaged; there is "
                      "no later step to average, or train on until 2 good checkpoints follow "
                      "it") in err, err


def test_a_damaged_checkpoint_is_one_error_line_naming_the_steps_to_read_instead(
    workdir, capsys, tmp_path, monkeypatch):
  """Step 6's data files emptied (a copy cut short by a full disk): evaluate.py and translate.py
  printed TensorStore's 155-line traceback; now one line naming the step, and the other."""
  damaged = str(tmp_path / "run")
  shutil.copytree(workdir, damaged)
  for root, _, files in os.walk(os.path.join(damaged, "checkpoints", "6", "state")):
    for name in files if os.path.basename(root) == "d" else []:
      open(os.path.join(root, name), "wb").close()
  said = (f"error: checkpoint 6 in {os.path.join(damaged, 'checkpoints')} does not load "
          "(ValueError: ")
  way_out = "its files are damaged (cut short or emptied); read another of its steps (3: --step N"
  rc, _, err = run_main(evaluate_script, ["--workdir", damaged, "--split", "test"], capsys)
  assert rc == 1 and said in err and way_out in err and "Traceback" not in err, err
  rc, _, err = run_main(translate_script, ["--workdir", damaged, "one"], capsys)
  assert rc == 1 and said in err and "Traceback" not in err, err
  assert checkpointing.load_params(damaged, 3)[0] == 3  # the way out said
  # As an ensemble's member: the member named, without the advice for another run's model.
  member = os.path.join(damaged, "checkpoints", "6")
  rc, _, err = run_main(translate_script, ["--workdir", workdir, "--ensemble", member, "one"],
                        capsys)
  assert rc == 1 and f"error: --ensemble {member}: checkpoint 6 in" in err, err
  assert "in an ensemble, every member" not in err and "Traceback" not in err, err
  # config.json emptied (a power loss before its write reached the disk): one line naming it.
  config_json = os.path.join(damaged, "config.json")
  open(config_json, "w").close()
  rc, _, err = run_main(evaluate_script, ["--workdir", damaged, "--split", "test"], capsys)
  assert rc == 1 and f"error: {config_json} does not read as JSON" in err, err
  assert "Traceback" not in err, err
  # A step that training's keep-N rotation deleted while it was read is not called damaged.
  read = checkpointing._read_params

  def rotated(mgr, path, step):
    shutil.rmtree(os.path.join(path, str(step)))
    return read(mgr, path, step)
  monkeypatch.setattr(checkpointing, "_read_params", rotated)
  with pytest.raises(checkpointing.CheckpointError, match="checkpoint 3 in .* was deleted while "
                     "it was read"):
    checkpointing.load_params(damaged, 3)


def test_average_of_a_run_that_deletes_a_chosen_step_meanwhile_chooses_again(
    workdir, capsys, tmp_path, monkeypatch):
  """The run training in the workdir saves step 9 and its keep-N rotation deletes step 3 while
  the average reads its chosen steps [3, 6]: it chooses [6, 9] and averages those; a rotation
  at every read gives up after a few tries, with what to do."""
  moving = str(tmp_path / "run")
  shutil.copytree(workdir, moving)
  checkpoints = os.path.join(moving, "checkpoints")
  load = checkpointing.load_params

  def rotating(directory, step=None):
    if step == 3 and os.path.isdir(os.path.join(checkpoints, "3")):
      shutil.copytree(os.path.join(checkpoints, "6"), os.path.join(checkpoints, "9"))
      shutil.rmtree(os.path.join(checkpoints, "3"))
    return load(directory, step)
  monkeypatch.setattr(checkpointing, "load_params", rotating)
  rc, out, err = run_main(average_script, ["--workdir", moving, "--last", "2"], capsys)
  assert rc == 0 and json.loads(out)["averaged_steps"] == [6, 9], err
  assert "step 3 was deleted while it was read" in err and "choosing the last 2 again" in err

  def always_rotating(directory, step=None):
    steps = checkpointing.checkpoint_steps(checkpoints)
    if step == steps[0]:
      shutil.copytree(os.path.join(checkpoints, str(steps[-1])),
                      os.path.join(checkpoints, str(steps[-1] + 3)))
      shutil.rmtree(os.path.join(checkpoints, str(step)))
    return load(directory, step)
  monkeypatch.setattr(checkpointing, "load_params", always_rotating)
  rc, _, err = run_main(average_script, ["--workdir", moving, "--last", "2"], capsys)
  assert rc == 1 and "was deleted while the average read it, 4 times" in err, err
  assert "let it keep more checkpoints than --last 2" in err


# ---------------------------------------------------------------- attention plots


def test_attention_rows_sum_to_one(translator):
  maps = attention_maps.attention_maps(translator, "one hundred and two", "einhundertzwei")
  s, t = len(maps["source_pieces"]), len(maps["target_pieces"])
  assert maps["target_pieces"][-1] == "</s>" and maps["decoder_input_pieces"][0] == "<s>"
  cfg = translator.config
  assert len(maps["encoder_self"]) == cfg.num_encoder_layers
  assert len(maps["cross"]) == len(maps["decoder_self"]) == cfg.num_decoder_layers
  for kind, shape in (("encoder_self", (s, s)), ("decoder_self", (t, t)), ("cross", (t, s))):
    for w in maps[kind]:
      assert w.shape == (cfg.num_heads,) + shape
      np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-5)
  # Decoder self-attention is causal.
  assert np.all(np.triu(maps["decoder_self"][0], k=1) == 0)


def test_attention_maps_cut_a_long_target_and_plot_what_each_kind_attends(translator, tmp_path,
                                                                          monkeypatch, capsys):
  """Found by mutation testing: a target past max_len, the decoder's input pieces, each kind's
  axes, the colour scale, the grid of heads, the summary's mean over heads (read from the
  figures themselves; how they look, sizes and fonts, is left to the eye). A target past
  max_len was cut silently, even with sinusoidal positions, which read it whole: it is
  treated as --source is, with a warning."""
  long_target = " ".join(["einhundertzwei"] * 40)
  pieces = len(translator.tokenizer.encode(long_target))
  max_len = translator.config.max_len
  assert translator.config.position_encoding == "sinusoidal" and pieces > max_len
  maps = attention_maps.attention_maps(translator, "one hundred and two", long_target)
  assert len(maps["target_pieces"]) == pieces + 1 and maps["target_pieces"][-1] == "</s>"
  assert maps["cross"][0].shape[1:] == (pieces + 1, len(maps["source_pieces"]))
  assert capsys.readouterr().err == (
      f"warning: --target: {pieces} pieces, more than the {max_len - 1} (max_len {max_len} - 1 "
      "for eos) the model was built for: read whole, as sinusoidal positions extend past "
      "max_len\n")
  monkeypatch.setattr(translator, "_truncate", True)  # as with a learned position table
  maps = attention_maps.attention_maps(translator, "one hundred and two", long_target)
  monkeypatch.undo()
  assert len(maps["target_pieces"]) == max_len and maps["target_pieces"][-1] == "</s>"
  assert maps["decoder_input_pieces"] == ["<s>"] + maps["target_pieces"][:-1]
  assert maps["cross"][0].shape[1:] == (max_len, len(maps["source_pieces"]))
  assert capsys.readouterr().err == (
      f"warning: --target: {pieces} pieces, more than the model's maximum of {max_len - 1} "
      f"(max_len {max_len} - 1 for eos; its learned position table ends there): truncated to "
      f"{max_len - 1} pieces, the plot shows those\n")
  # A long source with its target given: read whole, and nothing is translated.
  attention_maps.attention_maps(translator, long_target, "sieben")
  assert capsys.readouterr().err.endswith("read whole, as sinusoidal positions extend past "
                                          "max_len\n")
  src, tgt, dec = ["a", "b", "</s>"], ["x", "y", "z", "</s>"], ["<s>", "x", "y", "z"]
  rng = np.random.default_rng(0)
  def weights(queries, keys, heads=6):
    w = rng.random((heads, queries, keys)).astype(np.float32)
    return w / w.sum(-1, keepdims=True)
  fake = {"source_pieces": src, "target_pieces": tgt, "decoder_input_pieces": dec,
          "encoder_self": [weights(3, 3)], "decoder_self": [weights(4, 4)],
          "cross": [weights(4, 3), weights(4, 3)]}
  assert [attention_maps.axes_pieces(fake, kind) for kind in attention_maps.TITLES] == [
      (src, src), (tgt, dec), (tgt, src)]
  saved = {}
  monkeypatch.setattr(attention_maps, "save_figure",
                      lambda fig, path, dpi: saved.__setitem__(os.path.basename(path), fig))
  out = tmp_path / "maps"
  out.mkdir()  # an existing directory is written into
  attention_maps.plot_maps(fake, str(out))
  assert sorted(saved) == ["cross_layer0.png", "cross_layer1.png", "decoder_self_layer0.png",
                           "encoder_self_layer0.png", "summary.png"]
  for name, kind, layer in (("encoder_self_layer0.png", "encoder_self", 0),
                            ("decoder_self_layer0.png", "decoder_self", 0),
                            ("cross_layer1.png", "cross", 1)):
    rows, cols = attention_maps.axes_pieces(fake, kind)
    axes = saved[name].axes
    assert len(axes) == 8  # 6 heads at most 4 a row: 2 rows, the last 2 cells empty
    assert axes[0].get_subplotspec().get_gridspec().get_geometry() == (2, 4)
    for h, ax in enumerate(axes):
      if h >= 6:
        assert not ax.images and not ax.axison
        continue
      (image,) = ax.images
      np.testing.assert_array_equal(image.get_array(), fake[kind][layer][h])
      assert image.get_clim() == (0.0, 1.0) and ax.get_title() == f"head {h}"
      assert [t.get_text() for t in ax.get_xticklabels()] == cols
      assert [t.get_text() for t in ax.get_yticklabels()] == rows
  (summary, _colorbar) = saved["summary.png"].axes
  np.testing.assert_allclose(summary.images[0].get_array(), fake["cross"][1].mean(axis=0))
  assert summary.get_title() == ("encoder-decoder attention\nlast layer (1), mean of 6 heads")
  assert saved["cross_layer1.png"].get_suptitle() == "encoder-decoder attention, layer 1"
  assert saved["summary.png"].get_suptitle() == ""
  attention_maps.plot_maps(fake, str(out), title="run 7, step 600")
  assert saved["cross_layer1.png"].get_suptitle() == ("encoder-decoder attention, layer 1\n"
                                                      "run 7, step 600")
  assert saved["summary.png"].get_suptitle() == "run 7, step 600"


def test_plot_attention_refuses_an_empty_target_and_names_a_long_source(workdir, tmp_path,
                                                                         capsys):
  """An empty --target (an empty shell variable) would plot eos alone as if it were a result;
  a long --source's warning names the flag, not "line 1"."""
  argv = ["--workdir", workdir, "--out_dir", str(tmp_path / "att")]
  rc, out, err = run_main(plot_script, argv + ["--source", "seven", "--target", "  "], capsys)
  assert rc == 1 and err == ("error: the target sentence is empty: pass the translation to "
                             "teacher-force, or leave --target out to plot the model's own\n")
  assert not os.path.exists(tmp_path / "att")
  # Just over the 31 pieces (max_len 32 - 1 for eos): a plot of LONG's 277 takes 30 s to draw.
  source = " ".join(LONG.split()[:12])
  rc, out, err = run_main(plot_script, argv + ["--source", source], capsys)
  pieces = re.match(r"warning: --source: (\d+) pieces, more than the 31 ", err)
  assert rc == 0 and pieces and int(pieces.group(1)) > 31, err
  assert len(json.loads(out)["source_pieces"]) == int(pieces.group(1)) + 1   # whole, with eos


def test_plot_attention_writes_pngs(workdir, tmp_path, capsys):
  out_dir = tmp_path / "att"
  rc, out, err = run_main(plot_script, ["--workdir", workdir, "--source", "one hundred and two",
                                        "--out_dir", str(out_dir)], capsys)
  assert rc == 0, err
  expected = {"encoder_self_layer0.png", "decoder_self_layer0.png", "cross_layer0.png",
              "summary.png"}
  assert set(json.loads(out)["files"]) == expected
  for name in expected:
    with open(out_dir / name, "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(out_dir / name) > 1000


# ---------------------------------------------------------------- the command line


def test_translate_command_line(workdir):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "translate.py"),
                         "--workdir", workdir], input="three\n\n" + LONG + "\n",
                        capture_output=True, text=True, env=env, timeout=120)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert len(proc.stdout.split("\n")) == 4 and proc.stdout.split("\n")[1] == ""
  assert "stdin line 3" in proc.stderr


def test_decode_benchmark_of_a_trained_run_times_its_parameters_on_the_device_and_its_eos(workdir):
  # Host arrays would be copied to an accelerator in every timed search call.
  from transformer_jax.bench import decode as bench_decode
  _, params, step = bench_decode.trained_run(workdir)
  assert step == 6 and all(isinstance(x, jax.Array) for x in jax.tree.leaves(params))
  # Timed with the run's parameters and its own EOS: outputs stop there, as they would in use.
  result = bench_decode.run(tiny_config.get_config(), bench_decode.DecodeOptions(
      beams=(1,), steps=2, rows=2, decode_len=5, workdir=workdir))
  assert result["parameters"] == f"trained parameters of {workdir} (step 6); stops at EOS"
  model = workdir_lib.load_run_config(workdir)["resolved_model"]
  assert {k: result["model"][k] for k in ("vocab_size", "eos_id", "pad_id")} == {
      k: model[k] for k in ("vocab_size", "eos_id", "pad_id")}
  f = result["figures"]["greedy"]
  assert f["calls_timed"] == 2 and 2 <= f["target_tokens_per_batch"] <= 2 * 5


class _EchoTranslator:
  """What `evaluation.evaluate` reads of a Translator, without a model: each source is its own
  translation, and every source is reported as longer than the model's max_len."""
  beam_size, alpha, max_len_margin, truncate = 1, 0.6, 50, False
  run = {"data": {"target_lang": "de"}}
  workdir = None
  stats = translator_lib.SearchStats()

  def translate(self, sources, warn, names):
    for name in names:
      warn(f"{name} is longer than max_len - 1 pieces")
    return list(sources)

  def settings(self):
    return {"search": "echo"}


def test_evaluate_says_ten_long_sources_then_counts_the_rest_and_draws_its_examples_with_seed_0(
    tmp_path, capsys):
  translator = _EchoTranslator()
  pairs = [(f"source {i}", f"reference {i}") for i in range(12)]
  result = evaluation.evaluate(translator, None, "mine", str(tmp_path / "a"), num_examples=3,
                               pairs=pairs)
  err = capsys.readouterr().err.splitlines()
  assert err == [f"warning: mine pair {i} is longer than max_len - 1 pieces"
                 for i in range(1, 11)] + [
                     "warning: ... and 2 more sources longer than max_len - 1 pieces"]
  assert result["long_sources"] == 12 and result["truncated_sources"] == 0
  # The examples page: 3 drawn with seed 0, and the 1 worst of the rest.
  hyps = [s for s, _ in pairs]
  with open(result["examples"], encoding="utf-8") as f:
    assert f.read() == evaluation.examples_markdown(
        evaluation.examples(pairs, hyps, 3, worst=1, seed=0))
  result = evaluation.evaluate(translator, None, "mine", str(tmp_path / "d"), num_examples=1,
                               pairs=pairs[:11])
  assert capsys.readouterr().err.splitlines()[10:] == [
      "warning: ... and 1 more source longer than max_len - 1 pieces"]
  # One example asked for: a page of it and the worst of the rest.
  with open(result["examples"], encoding="utf-8") as f:
    assert f.read() == evaluation.examples_markdown(
        evaluation.examples(pairs[:11], hyps[:11], 1, worst=1, seed=0))
  # Exactly ten: no count line; quiet: nothing said, still counted.
  evaluation.evaluate(translator, None, "mine", str(tmp_path / "b"), num_examples=0,
                      pairs=pairs[:10])
  assert len(capsys.readouterr().err.splitlines()) == 10
  result = evaluation.evaluate(translator, None, "mine", str(tmp_path / "c"), num_examples=0,
                               pairs=pairs, quiet=True)
  assert capsys.readouterr().err == "" and result["long_sources"] == 12


def test_line_numbers_are_cut_after_five_and_one_split_off_comma_is_not_tokenized_text():
  assert evaluation._numbers([], "line") == "0"
  assert evaluation._numbers([4], "line") == "1 (line 4)"
  assert evaluation._numbers([1, 2, 3, 4, 5], "pair") == "5 (pairs 1, 2, 3, 4, 5)"
  assert evaluation._numbers([1, 2, 3, 4, 5, 9], "pair") == "6 (pairs 1, 2, 3, 4, 5, ...)"
  # A period or comma standing alone counts in two lines or more, and in a tenth of them.
  raw = [f"Satz {i}." for i in range(8)]
  assert evaluation.tokenized_lines(raw[:7] + ["Ja , gut"]) == []
  assert evaluation.tokenized_lines(raw[:6] + ["Ja , gut", "So ."]) == [7, 8]
  assert evaluation.tokenized_lines(raw * 3 + ["Ja , gut", "So ."]) == []  # 2 of 26
  three = ["Ja , gut", "So .", "Nein , nie"]
  assert evaluation.tokenized_lines(raw * 3 + raw[:3] + three) == [28, 29, 30]  # 3 of 30
  assert evaluation.tokenized_lines(raw * 3 + raw[:6] + three) == []  # 3 of 33
  assert evaluation.tokenized_lines(raw + ["Ja , gut", "So .", "&quot;x&quot;"]) == [9, 10, 11]
