"""cli.py's error policy through scripts/train.py's `main`, the path every script takes: a config
a user got wrong is one `error:` line, before any work and any write."""
import os
import subprocess
import sys

import pytest

from scripts_under_test import load_script

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
])
def test_a_bad_config_is_one_error_line_before_any_work(tmp_path, capsys, override, code,
                                                        message):
  workdir = tmp_path / "run"
  assert train.main(["--config", TINY, "--workdir", str(workdir), override]) == code
  err = capsys.readouterr().err
  assert err.startswith(message) and err.count("\n") == 1, err
  assert not workdir.exists()


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
