"""cli.py's error policy through scripts/train.py's `main`, the path every script takes: a config
a user got wrong is one `error:` line, before any work and any write."""
import json
import os
import subprocess
import sys

import pytest

from transformer_jax import experiment
from transformer_jax.run import workdir as workdir_lib

from scripts_under_test import SCRIPTS, load_script
import tiny_config

TINY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tiny_config.py")

train = load_script("train")


@pytest.mark.parametrize("override, code, message", [
    # A value experiment.validate refuses: a user error (exit 1), not a traceback.
    ("--config.log_every_steps=0", 1, "error: config.log_every_steps=0: must be >= 1"),
    ("--config.data.batching=nope", 1, "error: data.batching='nope': expected one of"),
    # A misspelt field: a flag error (exit 2) in plain text, not the repr of a KeyError.
    ("--config.num_train_step=5", 2, "error: no config field 'num_train_step': Did you mean "
                                     '"num_train_steps" instead of "num_train_step"?'),
    ("--config.model.d_modle=8", 2, "error: no config field 'd_modle': "),
    # A mesh the devices do not fill (8 fake ones here): found before the workdir is made.
    ("--config.mesh.data=3", 1, "error: config.mesh={'data': 3"),
    # Found before only when the dataset was built: a ValueError's traceback.
    ("--config.data.source_lang=fr", 1, "error: data.dataset='numbers' is English-German, got "
                                        "data.source_lang='fr'"),
    # Ignored before, without a word.
    ("--config.data.locale_include_ding=True", 1, "error: data.locale_include_ding is set but "
                                                  "data.dataset='numbers': add "),
    ("--config.num_processes=2", 1, "error: config.num_processes=2: is used only with "
                                    "config.coordinator_address"),
    ("--config.schedule=constant", 1, "error: config.warmup_steps=10: must be < "
                                      "num_train_steps=6 with schedule='constant'"),
    # Accepted before: NaN fails no `< 0` check, and an epsilon of 0 is 0 / 0 on a constant row.
    ("--config.weight_decay=nan", 1, "error: config.weight_decay=nan: must be >= 0 and finite"),
    ("--config.model.layer_norm_epsilon=0", 1, "error: config.model.layer_norm_epsilon=0.0: "
                                               "must be > 0 and finite"),
])
def test_a_bad_config_is_one_error_line_before_any_work(tmp_path, capsys, override, code,
                                                        message):
  workdir = tmp_path / "run"
  assert train.main(["--config", TINY, "--workdir", str(workdir), override]) == code
  err = capsys.readouterr().err
  assert err.startswith(message) and err.count("\n") == 1, err
  assert not workdir.exists()


@pytest.mark.parametrize("argv, message", [
    # A config field without --config. in front: said so, not only "unknown flag".
    (["--num_train_steps=5"], "error: Unknown command line flag 'num_train_steps': a config "
                              "field, given as --config.num_train_steps=VALUE\n"),
    (["--model.d_model", "8"], "error: Unknown command line flag 'model.d_model': a config "
                               "field, given as --config.model.d_model=VALUE\n"),
    (["--numtrain=5"], "error: Unknown command line flag 'numtrain' (--help lists the flags)\n"),
    # A misspelt field: --help lists the fields, not only the flags.
    (["--config.model.target_vocab_size=5"], "error: no config field 'target_vocab_size' "
                                             "(--help with --config lists the config's fields)\n"),
])
def test_a_flag_error_says_where_the_field_is(tmp_path, capsys, argv, message):
  assert train.main(["--config", TINY, "--workdir", str(tmp_path / "run")] + argv) == 2
  assert capsys.readouterr().err == message


def test_help_lists_the_config_files_fields_and_their_values(capsys):
  assert train.main(["--help", "--config", TINY]) == 0
  out = capsys.readouterr().out
  assert f"config fields (--config.FIELD=VALUE; values of --config {TINY}):\n" in out, out
  # tiny_config.py's own values, nested fields by their path.
  assert "\n  --config.num_train_steps=6\n" in out and "\n  --config.model.d_model=32\n" in out
  # Without --config (or one that does not load), the defaults every config starts from.
  assert train.main(["--help"]) == 0
  out = capsys.readouterr().out
  assert "values of experiment.base_config(), the defaults every config starts from)" in out
  assert "\n  --config.model.d_model=256\n" in out, out
  assert train.main(["--help", "--config", "no_such.py"]) == 0
  assert "; --config no_such.py did not load)" in capsys.readouterr().out
  # A script with a default config lists that one's values.
  assert load_script("benchmark").main(["--help"]) == 0
  out = capsys.readouterr().out
  assert "values of --config " in out and "configs/cpu_reference.py):\n" in out, out[-3000:]
  assert "\n  --config.data.vocab_size=8000\n" in out


def test_limits_that_no_pair_fits_are_an_error_line(tmp_path, capsys):
  # Found only once the data is read (`pipeline.DataError`): still one line, not a traceback.
  workdir = tmp_path / "run"
  code = train.main(["--config", TINY, "--workdir", str(workdir),
                     f"--config.data.data_dir={tmp_path / 'tfds'}",
                     "--config.data.max_source_len=4", "--config.data.max_target_len=4"])
  assert code == 1
  err = capsys.readouterr().err
  assert ("\nerror: no training pair fits data.max_source_len=4 / data.max_target_len=4 "
          "(pieces, EOS included)") in err, err[-2000:]
  assert "Traceback" not in err
  assert not [n for n in os.listdir(workdir / "checkpoints") if n.isdigit()]  # nothing saved


def test_a_config_file_that_cannot_be_loaded_is_one_error_line(tmp_path, capsys):
  workdir = tmp_path / "run"
  json_config = tmp_path / "config.json"
  json_config.write_text('{"share_embeddings": true}')
  typo = tmp_path / "typo.py"
  typo.write_text("def get_config(arg=None):\n  del arg\n  return undefined_name\n")
  missing_import = tmp_path / "imports.py"
  missing_import.write_text("import no_such_module\n")
  repo = os.path.dirname(os.path.dirname(TINY))
  for config, message in (
      ("configs/defualt.py", "error: --config configs/defualt.py: no such file (paths are "
                             "relative to the current directory"),
      (f"{repo}/configs/locale.py:xx", "error: configs/locale.py:xx: expected <pair>"),
      (str(json_config), f"error: --config {json_config}: not a Python config file with "
                         "get_config(); a run's config.json is read back with --config "
                         "configs/resume.py:<workdir>"),
      (str(typo), f"error: --config {typo}: NameError: name 'undefined_name' is not defined "
                  f"(at {typo}:3)"),
      (str(missing_import), f"error: --config {missing_import}: ModuleNotFoundError: No module "
                            f"named 'no_such_module' (at {missing_import}:1)"),
      (f"{repo}/configs/resume.py", "error: configs/resume.py needs the run's workdir")):
    assert train.main(["--config", config, "--workdir", str(workdir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1, err
    assert "--help lists the flags" not in err, err   # no flag was wrong
  assert not workdir.exists()


def test_a_field_a_config_file_adds_is_one_error_line_naming_the_file(tmp_path, capsys):
  """`c.num_train_step = 2` in get_config() (before the config is locked): the run trained with
  the defaults, config.json recorded the typos, and every resume was refused as a config "made
  by another version"."""
  typo = tmp_path / "typo.py"
  typo.write_text(f"import sys\nsys.path.insert(0, {os.path.dirname(TINY)!r})\n"
                  "from tiny_config import get_config as tiny\n\n\n"
                  "def get_config(arg=None):\n  c = tiny()\n  c.num_train_step = 2\n"
                  "  c.data.batchsize = 4\n  return c\n")
  workdir = tmp_path / "run"
  assert train.main(["--config", f"{typo}:arg", "--workdir", str(workdir)]) == 1
  err = capsys.readouterr().err
  assert err == (f"error: config.data.batchsize (did you mean config.data.batch_size?), "
                 "config.num_train_step (did you mean config.num_train_steps?): no such fields, "
                 f"set in {typo}; a run would ignore them and train with the default of the "
                 "field meant: correct the names there (--help with --config lists the "
                 "fields)\n"), err
  assert not workdir.exists()
  # A run made so before: its resume says what the fields may be, and how to resume it.
  c = tiny_config.get_config()
  workdir.mkdir()
  path = workdir_lib.write_config(str(workdir), c, experiment.transformer_config(c, 32))
  with open(path) as f:
    stored = json.load(f)
  stored["num_train_step"] = 2
  with open(path, "w") as f:
    json.dump(stored, f)
  assert train.main(["--workdir", str(workdir)]) == 1
  err = capsys.readouterr().err
  assert err.startswith(f"error: {path} has fields this code does not know: "
                        "['num_train_step']: the run was made by another version"), err
  assert err.endswith(f". If its config file misspelt num_train_step (did you mean "
                      f"num_train_steps?), the run trained with the default of the field meant: "
                      f"delete the misspelt field(s) from {path} to resume it as it ran\n"), err


def test_a_stored_config_todays_rules_refuse_is_one_error_line_either_way(tmp_path, capsys):
  """`train.py --workdir W` alone reads the run's own config back; one that today's rules refuse
  (a constant schedule that ends inside its warm-up, accepted when the run was made) was a
  ValueError's traceback from the loop, where `--config configs/resume.py:W` said it in a line."""
  c = tiny_config.get_config()
  run = tmp_path / "run"
  run.mkdir()
  path = workdir_lib.write_config(str(run), c, experiment.transformer_config(c, vocab_size=32))
  with open(path) as f:
    stored = json.load(f)
  stored["schedule"] = "constant"   # with the tiny config's 10 warm-up steps of 6
  with open(path, "w") as f:
    json.dump(stored, f)
  refused = "config.warmup_steps=10: must be < num_train_steps=6 with schedule='constant'"
  assert train.main(["--workdir", str(run)]) == 1
  err = capsys.readouterr().err
  assert err.startswith(f"error: {refused}") and err.count("\n") == 1, err
  assert f"(in {path}, the run's own config: resume with --config configs/resume.py:" in err
  repo = os.path.dirname(os.path.dirname(TINY))
  assert train.main(["--config", f"{repo}/configs/resume.py:{run}", "--workdir", str(run)]) == 1
  err = capsys.readouterr().err
  assert err.startswith(f"error: {refused}") and err.count("\n") == 1, err
  assert sorted(os.listdir(run)) == [workdir_lib.CONFIG]   # nothing written


def test_a_config_of_ones_own_starts_from_the_checkouts_configs(tmp_path):
  """`from configs.default import get_config` in a config file outside the checkout was
  `ModuleNotFoundError: No module named 'configs'` (a subprocess: `python -m pytest` puts the
  checkout on sys.path by itself)."""
  repo = os.path.dirname(os.path.dirname(TINY))
  mine = tmp_path / "gelu.py"
  mine.write_text("from configs.default import get_config as default_config\n\n\n"
                  "def get_config():\n  c = default_config()\n  c.model.activation = 'gelu'\n"
                  "  c.num_train_steps = 0\n  return c\n")
  proc = subprocess.run([sys.executable, os.path.join(repo, "scripts", "train.py"), "--config",
                         str(mine), "--workdir", str(tmp_path / "run")], cwd=tmp_path,
                        capture_output=True, text=True, timeout=300)
  # Loaded: its own value is what validation refuses.
  assert proc.returncode == 1, proc.stderr[-2000:]
  assert proc.stderr.endswith("error: config.num_train_steps=0: must be >= 1\n"), proc.stderr


def test_an_os_error_that_names_no_file_says_where_it_was_raised(tmp_path, capsys, monkeypatch):
  # A write to a file already open fails with "[Errno 28] No space left on device" alone: the
  # error line adds the innermost frame of this checkout, so the user knows what was written.
  from transformer_jax.run import workdir as workdir_lib

  def full_disk(workdir, config):
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(workdir_lib, "check_config", full_disk)
  assert train.main(["--config", TINY, "--workdir", str(tmp_path / "run")]) == 1
  err = capsys.readouterr().err
  assert err.startswith("error: [Errno 28] No space left on device (in tests/test_cli.py:"), err
  assert err.rstrip().endswith(", full_disk)") and err.count("\n") == 1, err
  # An error that names its file needs no place.
  def missing(workdir, config):
    raise FileNotFoundError(2, "No such file or directory", "/nowhere/x")

  monkeypatch.setattr(workdir_lib, "check_config", missing)
  assert train.main(["--config", TINY, "--workdir", str(tmp_path / "run")]) == 1
  assert capsys.readouterr().err == ("error: [Errno 2] No such file or directory: "
                                     "'/nowhere/x'\n")
  # Nor one whose message says what it is (a flag's file, inference/flags.py).
  def worded(workdir, config):
    raise FileNotFoundError("--source x.en: No such file or directory")

  monkeypatch.setattr(workdir_lib, "check_config", worded)
  assert train.main(["--config", TINY, "--workdir", str(tmp_path / "run")]) == 1
  assert capsys.readouterr().err == "error: --source x.en: No such file or directory\n"


# ---------------------------------------------------------------- cli.run itself, with toy bodies
# (found by mutation testing: every script has a config, a workdir and a real body, so the
# policy's own branches had no test of their own)

from absl import flags  # noqa: E402

from transformer_jax import cli  # noqa: E402

DOC = "toy: a script of one flag"


def _define(values):
  flags.DEFINE_string("name", "none", "a name", flag_values=values)


def _toy(argv, body=lambda values, args: None, **kwargs):
  return cli.run(body, argv, doc=DOC, define=_define, **kwargs)


def test_run_exit_codes_arguments_and_help(capsys, monkeypatch):
  seen = []
  def body(values, args):
    seen.append((values.name, args))
    return {"none": None, "three": 3}.get(values.name)
  assert _toy(["--name", "three"], body) == 3 and _toy([], body) == 0
  # Arguments besides flags: refused unless the script takes them, then all of them passed.
  assert _toy(["a"], body) == 2
  assert capsys.readouterr().err == ("error: unexpected arguments ['a'] (--help lists the "
                                     "flags)\n")
  assert _toy(["a", "--name=x", "b"], body, positional=True) == 0 and seen[-1] == ("x", ["a", "b"])
  # argv defaults to sys.argv without the program; a program name may be missing or empty.
  monkeypatch.setattr(sys, "argv", ["/bin/toy.py", "--name", "argv"])
  assert _toy(None, body) == 0 and seen[-1] == ("argv", [])
  for argv in ([], [""], ["toy.py"]):
    monkeypatch.setattr(sys, "argv", argv)
    assert _toy(["--name", "n"], body) == 0 and seen[-1] == ("n", [])
  # --help: the docstring, then the script's own flags (not absl's --flagfile and the like).
  count = len(seen)
  assert _toy(["--name", "x", "--help"], body) == 0 and len(seen) == count
  out = capsys.readouterr().out
  assert out.startswith(DOC + "\n\nflags:\n") and "--name: a name" in out, out
  assert "--flagfile" not in out
  assert _toy(["--nam", "x"], body) == 2
  assert capsys.readouterr().err.startswith("error: Unknown command line flag 'nam'")


def test_a_scripts_config_is_locked_and_the_checkout_importable(monkeypatch):
  """With a config: the checkout goes on sys.path (a config of one's own can import configs/),
  once, at the end; the config is locked (the body cannot add a field by a typo). Without: the
  path is left alone."""
  path = [p for p in sys.path if p != cli.REPO]
  monkeypatch.setattr(sys, "path", list(path))
  assert _toy([]) == 0 and sys.path == path
  def body(values, args):
    with pytest.raises(AttributeError):
      values.config.num_train_stepz = 5
    return 7
  assert _toy([], body, config=TINY) == 7 and sys.path == path + [cli.REPO]
  assert _toy([], body, config=TINY) == 7 and sys.path == path + [cli.REPO]


def _raising(error):
  """A script body that raises `error`."""
  def body(values, args):
    raise error
  return body


class JaxRuntimeError(RuntimeError):
  """Named like jax's: `cli.out_of_memory` tells it by its name."""


def test_user_errors_out_of_memory_and_a_broken_pipe(capsys, monkeypatch):
  assert _toy([], _raising(cli.RunError("the run is locked"))) == 1
  assert capsys.readouterr().err == "error: the run is locked\n"
  first = "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 7.5GiB " + "x" * 400
  assert _toy([], _raising(JaxRuntimeError(first + "\nthe allocator's dump"))) == 1
  err = capsys.readouterr().err
  assert err.startswith(f"error: out of memory ({first[:300]}): when decoding, fewer "), err
  assert err.count("\n") == 1 and "--config.grad_accum_steps=N" in err
  # Not an out-of-memory error: a traceback, as for any bug.
  for error in (JaxRuntimeError("INTERNAL: a failed kernel"),
                JaxRuntimeError("RESOURCE_EXHAUSTED: too many open handles"),
                ValueError("RESOURCE_EXHAUSTED: out of memory")):
    with pytest.raises(type(error)):
      _toy([], _raising(error))
  # The reader of --help went away (`--help | head`): exit 1, stdout pointed at /dev/null
  # for Python's last flush at exit.
  class ClosedPipe:
    def write(self, text):
      raise BrokenPipeError(32, "Broken pipe")

    def fileno(self):
      return 101
  dups = []
  monkeypatch.setattr(cli.os, "open", lambda path, mode: (path, mode))
  monkeypatch.setattr(cli.os, "dup2", lambda fd, to: dups.append((fd, to)))
  monkeypatch.setattr(sys, "stdout", ClosedPipe())
  assert _toy(["--help"]) == 1 and dups == [((os.devnull, os.O_WRONLY), 101)]
  # Started with stdout closed (`>&-`: None), a pipe of its own gone (a FIFO's reader): exit 1.
  monkeypatch.setattr(sys, "stdout", None)
  assert _toy([], _raising(BrokenPipeError(32, "Broken pipe"))) == 1 and len(dups) == 1
  assert _toy([], lambda values, args: 0) == 0  # and nothing to flush at the end


def test_an_os_error_without_a_file_names_the_checkouts_innermost_frame(capsys):
  def body(values, args):
    raise OSError(28, "No space left on device")
  line = body.__code__.co_firstlineno + 1
  assert _toy([], body) == 1
  assert capsys.readouterr().err == ("error: [Errno 28] No space left on device (in "
                                     f"tests/test_cli.py:{line}, body)\n")
  # A frame of a package installed inside the checkout (a virtual environment of another
  # name) is not where the user's code was: the frame that called it is.
  where = os.path.join(cli.REPO, "env", "lib", "python3.11", "site-packages", "package.py")
  namespace = {}
  exec(compile("def write():\n  raise OSError(28, 'No space left on device')\n", where, "exec"),
       namespace)
  def through_a_package(values, args):
    namespace["write"]()
  line = through_a_package.__code__.co_firstlineno + 1
  assert _toy([], through_a_package) == 1
  assert capsys.readouterr().err.endswith(f"(in tests/test_cli.py:{line}, through_a_package)\n")
  # An OSError with a message of its own, or a file, is left as it is.
  class OwnMessage(OSError):
    def __str__(self):
      return "the disk of the checkpoint is full"
  for error, message in ((OwnMessage(28, "No space left on device"),
                          "the disk of the checkpoint is full"),
                         (OSError(2, "No such file or directory", "a.txt"),
                          "[Errno 2] No such file or directory: 'a.txt'")):
    assert _toy([], _raising(error)) == 1
    assert capsys.readouterr().err == f"error: {message}\n"


def test_the_messages_helpers():
  assert [cli.flag_value(argv, "config") for argv in (
      ["--config", "a.py"], ["-config", "b.py"], ["--x", "y", "--config=c.py"],
      ["--x", "y", "--config", "d.py"], ["--config"], ["--configs", "e.py"])] == [
      "a.py", "b.py", "c.py", "d.py", None, None]
  assert cli.overrides_without_config(["--config.a=1", "-config.b=2", "--x"]) == [
      "--config.a=1", "-config.b=2"]
  assert cli.overrides_without_config(["--config", "a.py", "--config.a=1"]) == []
  assert cli._config_file_error(NameError("x"), "runs/a/config.json:1").startswith(
      "not a Python config file with get_config()")
  assert cli._config_file_error(NameError("name 'x' is not defined"), "a.py:json") == (
      "NameError: name 'x' is not defined")

  class Deferred:
    _error = ValueError("while loading\n  a.py\n the last line ")
  assert cli._load_error(Deferred()) == "the last line"
  assert cli._flag_error(AttributeError("a message of its own")) == "a message of its own"
  assert cli._flag_error(AttributeError(KeyError("'lr'\nDid you mean 'lr2'?"))) == (
      "no config field 'lr': Did you mean 'lr2'?")
  assert cli._flag_error(KeyError("a key")) == "a key"


def _renamed():
  cli.deprecated("--old", "--new")
  return sys._getframe().f_lineno - 1


def test_a_deprecated_flag_warns_at_its_callers_line(capsys):
  with pytest.warns(DeprecationWarning, match="--old is deprecated") as caught:
    line = _renamed()
  assert (caught[0].filename, caught[0].lineno) == (__file__, line)
  assert capsys.readouterr().err == ("warning: --old is deprecated and will be removed in the "
                                     "next release: use --new\n")


def test_a_reader_gone_before_the_output_ends_quietly(tmp_path):
  """`compare_runs.py runs/ | true`, `replay_early_stopping.py ... | true`: the closed pipe was
  caught as an OSError of the user's ("error: [Errno 32] Broken pipe"), or, for output still
  buffered at exit, reported by Python's own flush."""
  c = tiny_config.get_config()
  c.update(num_train_steps=4, keep_best="bleu")
  run = tmp_path / "run"
  run.mkdir()
  workdir_lib.write_config(str(run), c, experiment.transformer_config(c, vocab_size=32))
  (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "bleu": 1.0 / s}) + "\n"
                                             for s in (2, 4)))
  # Python's own buffering of a pipe, whatever the environment of the tests asks for.
  env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
  for argv in (["replay_early_stopping.py", "--patience", "1,2,3", str(run)],  # flushed a line
               ["compare_runs.py", str(run)]):                                 # buffered to exit
    proc = subprocess.Popen([sys.executable, os.path.join(SCRIPTS, argv[0]), *argv[1:]],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    proc.stdout.close()  # long before the script, still importing, writes
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 1 and err == "", (argv, err)


def test_none_or_nothing_for_a_path_leaves_it_unset(capsys):
  """config flags parse `--config.data.vocab_path=None` as the string 'None' (a tokenizer
  trained into ./None) and `=` as "": for a field whose default is None, both are None."""
  seen = {}
  def body(values, args):
    seen.update({k: values.config.data[k] for k in ("vocab_path", "data_dir", "locale_dir",
                                                    "tsv_path")})
  assert _toy(["--config.data.vocab_path=None", "--config.data.data_dir=",
               "--config.data.locale_dir=None", "--config.data.tsv_path=None.tsv"], body,
              config=TINY) == 0, capsys.readouterr().err
  assert seen == {"vocab_path": None, "data_dir": None, "locale_dir": None,
                  "tsv_path": "None.tsv"}


def test_errors_found_after_the_start_that_settings_fix_are_one_line(capsys):
  """A batch or a model size the mesh does not split, a non-finite loss: the user's to fix
  (their messages name the fields), printed as one line, not a ValueError's or a
  FloatingPointError's traceback."""
  import types

  import flax.linen as nn
  import jax
  import jax.numpy as jnp

  from transformer_jax import sharding
  from transformer_jax.run import throughput
  from transformer_jax.run import trainer as trainer_lib

  mesh = sharding.make_mesh({"data": 4, "tensor": 2})
  heads = {"w": nn.Partitioned(jax.ShapeDtypeStruct((3, 4), jnp.float32), names=("heads", None))}
  with pytest.raises(sharding.ShardingError, match=r"model.num_heads = 3 does not split"):
    sharding.check_divisible(heads, mesh, sharding.DEFAULT_RULES)
  setup = types.SimpleNamespace(batch_sharding=sharding.batch_sharding(
      mesh, sharding.DEFAULT_RULES), mesh=mesh)
  with pytest.raises(sharding.ShardingError, match=r"a global batch of 6 rows does not split "
                                                   r"over the 4 devices"):
    trainer_lib._check_rows_split_over_devices(
        tiny_config.get_config(), types.SimpleNamespace(global_rows=6), setup)
  for error in (sharding.ShardingError("config.mesh={'data': 3}: does not divide"),
                throughput.NonFiniteLossError("non-finite training loss or parameters at step "
                                              "7: stopping without saving")):
    assert _toy([], _raising(error)) == 1
    assert capsys.readouterr().err == f"error: {error}\n"
