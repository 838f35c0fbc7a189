"""The command-line style of every script in `scripts/`: absl flags, config files through
ml_collections' `config_flags`, and one error policy.

    def define(flag_values):
      flags.DEFINE_string("workdir", None, "the run's directory", flag_values=flag_values)

    def body(values, args) -> int:
      ...

    def main(argv=None):
      return cli.run(body, argv, doc=__doc__, define=define)

Each call parses into a fresh `FlagValues`, so `main` can run several times in one process
(tests call it in-process). With `config=` a `--config path[:arg]` flag is defined and
`--config.<field>=<value>` overrides any field of it, and the config is checked
(`experiment.validate`) before the body runs. Errors a user can fix (`USER_ERRORS`: a missing
workdir or checkpoint, a refused config change, a locked workdir, a bad file, a mesh that does
not split the batch or the model, a non-finite loss; and a config value `experiment.validate`
refuses) print `error: ...` and exit 1; a wrong flag (a misspelt `--config.<field>` too) prints
its problem and exits 2.
"""
from __future__ import annotations

import logging
import os
import sys
import traceback
from typing import Callable, Sequence
import warnings

from absl import flags
from ml_collections import config_flags

from transformer_jax import experiment
from transformer_jax.data.config import DataError
from transformer_jax.data.lines import NotUTF8Error
from transformer_jax.run.workdir import RunError

# What the command-line tools report as "error: ..." rather than a traceback (RunError includes
# throughput.NonFiniteLossError; sharding's ShardingError comes through experiment, which keeps
# cli's imports of the core as they were). Not ValueError itself: most are bugs, whose traceback
# finds them.
USER_ERRORS = (RunError, OSError, NotUTF8Error, DataError, experiment.ShardingError)
NO_CONFIG = object()
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def repo_config(name: str) -> str:
  """A config file of this checkout's `configs/` (the default of some scripts)."""
  return os.path.join(REPO, "configs", name)


def run(body: Callable[[flags.FlagValues, list[str]], int | None],
        argv: Sequence[str] | None = None, *, doc: str,
        define: Callable[[flags.FlagValues], None] = lambda values: None,
        config=NO_CONFIG, config_help: str = "experiment config file, path[:arg]",
        positional: bool = False, absl_level: int = logging.WARNING) -> int:
  """Parse `argv` (default: sys.argv[1:]) and call `body(flag values, positional args)`.

  `config`: NO_CONFIG (no --config flag), None (optional or required by the body), or the
  default config file. `positional`: whether the script takes arguments besides flags.
  `absl_level`: the read-only tools pass ERROR to hide Orbax's notices.
  """
  try:
    code = _run(body, argv, doc, define, config, config_help, positional, absl_level)
    # What is still buffered is written here, where a reader gone is handled below, not by
    # Python's flush at exit ("Exception ignored ... BrokenPipeError", exit 120). None: the
    # process was started with stdout closed (`>&-`).
    if sys.stdout is not None:
      sys.stdout.flush()
    return code
  except BrokenPipeError:  # the reader went away (`--help | head`): nothing left to say
    # Python flushes stdout again at exit: pointed at /dev/null, that flush cannot fail too.
    if sys.stdout is not None:  # closed (`>&-`): a pipe of --output's gone instead
      os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 1


def _where(error: BaseException) -> str:
  """Where in this checkout an OSError that names no file was raised: a write to a file already
  open says only "[Errno 28] No space left on device", which leaves the user guessing what was
  being written. Empty for errors that name their file or carry a message of their own."""
  if (not isinstance(error, OSError) or error.filename or error.errno is None
      or str(error) != f"[Errno {error.errno}] {error.strerror}"):
    return ""
  ours = [frame for frame in traceback.extract_tb(error.__traceback__)
          if not os.path.relpath(frame.filename, REPO).startswith((os.pardir, ".venv"))
          and "site-packages" not in frame.filename]
  if not ours:
    return ""
  frame = ours[-1]
  return f" (in {os.path.relpath(frame.filename, REPO)}:{frame.lineno}, {frame.name})"


def _run(body, argv, doc, define, config, config_help, positional, absl_level) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  program = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "script"
  full = [program] + argv
  values = flags.FlagValues()
  define(values)
  if config is not NO_CONFIG and REPO not in sys.path:
    # A config file of one's own, anywhere, can start from this checkout's
    # (`from configs.default import get_config`); appended, so nothing installed is shadowed.
    sys.path.append(REPO)
  if config is not NO_CONFIG:
    # sys_argv: config_flags finds the --config.* overrides there (default: sys.argv).
    config_flags.DEFINE_config_file("config", config, config_help, flag_values=values,
                                    lock_config=True, sys_argv=full)
  helps = ("-h", "--help", "--helpfull", "-?")
  if any(a in helps for a in argv):
    print(doc.strip() + "\n\nflags:\n" + values.get_help(include_special_flags=False))
    if config is not NO_CONFIG:
      print(_config_fields_help(values, [a for a in full if a not in helps], config))
    return 0
  try:
    rest = values(full)
  except (flags.Error, AttributeError, KeyError, TypeError, ValueError) as e:
    # config_flags raises AttributeError/KeyError for a misspelt --config.<field>, and a
    # config file's get_config() ValueError for a bad argument (configs/locale.py:xx).
    # The flags' list helps with a flag, not with what a config file's get_config() refused.
    if "Error whilst parsing config file" in str(e):
      hint = ""
    elif isinstance(e, flags.UnrecognizedFlagError) and config is not NO_CONFIG and (
        _is_config_field(e.flagname)):
      hint = f": a config field, given as --config.{e.flagname}=VALUE"
    elif isinstance(e, AttributeError) and config is not NO_CONFIG:
      hint = " (--help with --config lists the config's fields)"
    else:
      hint = " (--help lists the flags)"
    print(f"error: {_flag_error(e)}{hint}", file=sys.stderr)
    return 2
  except (NameError, SyntaxError, ImportError) as e:
    # A config file that fails to load: not Python at all (a run's config.json), or a bug in
    # it. (config_flags turns only ValueError and TypeError into flag errors.)
    arg = _config_arg(argv)
    print(f"error: --config {arg}: {_config_file_error(e, arg)}", file=sys.stderr)
    return 2
  if config is not NO_CONFIG and type(values.config).__name__ == "_ErrorConfig":
    # config_flags keeps a config file's load error (a missing file) until first use.
    print(f"error: --config {_config_arg(argv)}: {_load_error(values.config)}",
          file=sys.stderr)
    return 2
  if rest[1:] and not positional:
    print(f"error: unexpected arguments {rest[1:]} (--help lists the flags)", file=sys.stderr)
    return 2
  if config is not NO_CONFIG and values.config is not None:
    _unset_none_overrides(values)
    source = flag_value(argv, "config") or config  # path[:arg], given or the script's default
    try:
      experiment.validate(values.config, source=source and source.split(":", 1)[0])
    except ValueError as e:  # a bad value, not a bug: the message names the field
      print(f"error: {e}", file=sys.stderr)
      return 1
  logging.getLogger("absl").setLevel(absl_level)  # Orbax's and TFDS's notices
  try:
    return int(body(values, rest[1:]) or 0)
  except BrokenPipeError:  # an OSError, but no error of the user's: `run` ends quietly
    raise
  except USER_ERRORS as e:
    print(f"error: {e}{_where(e)}", file=sys.stderr)
    return 1
  except Exception as e:
    if not out_of_memory(e):
      raise
    # The device's allocator refused: the settings are too big for it, not a bug to trace.
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    print(f"error: out of memory ({first[:300]}): when decoding, fewer sentences per batch "
          "(--batch_size) or a narrower beam (--beam_size); when training, the same tokens per "
          "step in smaller pieces (--config.grad_accum_steps=N), recomputed activations "
          "(--config.model.remat=layer), or smaller evaluation batches "
          "(--config.data.eval_batch_size)", file=sys.stderr)
    return 1


def _unset_none_overrides(values: flags.FlagValues) -> None:
  """`--config.data.vocab_path=None` and `--config.data.vocab_path=` leave a field whose default
  is None (a path: unset) unset: config flags parse both as strings, and "None" would be a
  file or directory of that name in the current directory (a tokenizer trained into ./None)."""
  for name, value in config_flags.get_override_values(values["config"]).items():
    if value in ("", "None") and experiment.unset_by_none(name):
      *parents, leaf = name.split(".")
      target = values.config
      for parent in parents:
        target = target[parent]
      target[leaf] = None


def _is_config_field(name: str) -> bool:
  """Whether `name` is a field of every run's config (`experiment.base_config`), nested ones
  by their dotted path: an unknown flag of that name wanted `--config.` in front."""
  return name in dict(experiment.field_values(experiment.base_config()))


def _config_fields_help(values: flags.FlagValues, argv: Sequence[str],
                        default: str | None) -> str:
  """`--help`'s list of the config's fields and their values, which `--config.FIELD=VALUE`
  overrides: those of the config file --config names (else the script's `default` one) when it
  loads, else the defaults every config starts from."""
  source = "experiment.base_config(), the defaults every config starts from"
  config = experiment.base_config()
  spec = flag_value(argv[1:], "config") or default
  if spec is not None:
    try:
      values["config"].parse(spec)
      if hasattr(values["config"].value, "items"):
        config, source = values["config"].value, f"--config {spec}"
    except Exception:  # noqa: BLE001 (help still lists the defaults; a run says what is wrong)
      source += f"; --config {spec} did not load"
  lines = [f"  --config.{name}={value!r}" for name, value in experiment.field_values(config)]
  return f"config fields (--config.FIELD=VALUE; values of {source}):\n" + "\n".join(lines)


def out_of_memory(e: BaseException) -> bool:
  """Whether `e` is XLA's out-of-memory error (jax.errors.JaxRuntimeError, RESOURCE_EXHAUSTED),
  told by its name and status so that this module need not import jax."""
  return type(e).__name__ in ("JaxRuntimeError", "XlaRuntimeError") and (
      "RESOURCE_EXHAUSTED" in str(e)) and "memory" in str(e).lower()


def _config_arg(argv: Sequence[str]) -> str:
  """The value given to --config (for messages)."""
  return flag_value(argv, "config") or "?"


def flag_value(argv: Sequence[str], name: str) -> str | None:
  """The value given to --<name> in `argv` before parsing (for messages), or None."""
  for i, a in enumerate(argv):
    for dashes in ("--", "-"):
      if a.startswith(f"{dashes}{name}="):
        return a[len(f"{dashes}{name}="):]
      if a == f"{dashes}{name}" and i + 1 < len(argv):
        return argv[i + 1]
  return None


def overrides_without_config(argv: Sequence[str]) -> list[str]:
  """The `--config.<field>` overrides in `argv` when no --config is given: absl would answer
  "Unknown command line flag 'config.<field>'", since overrides exist only for a config file."""
  if flag_value(argv, "config") is not None:
    return []
  return [a for a in argv if a.startswith(("--config.", "-config."))]


def _config_file_error(e: BaseException, arg: str) -> str:
  """What went wrong in config file `arg` (path[:argument]): its type, message and line."""
  if arg.split(":", 1)[0].endswith(".json"):
    return ("not a Python config file with get_config(); a run's config.json is read back with "
            "--config configs/resume.py:<workdir>, or by scripts/train.py --workdir <workdir> "
            "alone")
  where = ""
  if isinstance(e, SyntaxError) and e.filename:
    where = f" (at {e.filename}:{e.lineno})"
  else:
    frames = [f for f in traceback.extract_tb(e.__traceback__) if "config_flags" not in
              f.filename and "absl" not in f.filename]
    if frames:
      where = f" (at {frames[-1].filename}:{frames[-1].lineno})"
  return f"{type(e).__name__}: {e}{where}"


def _load_error(error_config) -> str:
  """What config_flags' deferred load error says, in one line."""
  error = object.__getattribute__(error_config, "_error")
  text = str(error)
  if "No such file or directory" in text:
    return ("no such file (paths are relative to the current directory; the configs are in "
            f"{os.path.join(REPO, 'configs')})")
  return text.strip().splitlines()[-1].strip()


def _flag_error(e: Exception) -> str:
  """The text of a flag error; str() of a KeyError is the repr of its message."""
  text = str(e)
  if "Error whilst parsing config file" in text:
    # A config file's get_config() raised: its own message is the traceback's last line.
    last = [line for line in text.strip().splitlines() if line.strip()][-1].strip()
    return last.split(": ", 1)[1] if last.split(":", 1)[0].endswith("Error") else last
  if isinstance(e, AttributeError) and e.args and isinstance(e.args[0], KeyError):
    # ConfigDict's "no such field": a KeyError holding the name, then a suggestion on the
    # next line when one is close.
    name, _, hint = _flag_error(e.args[0]).partition("\n")
    return f"no config field {name}" + (f": {hint}" if hint else "")
  if isinstance(e, KeyError) and e.args:
    return str(e.args[0])
  return str(e)


def define_evaluations(values: flags.FlagValues) -> None:
  """--averaged and --beam_size: which scripts/evaluate.py results a table of runs takes its
  `<split>_bleu` from (scripts/compare_runs.py, scripts/sweep.py --report; `evaluations` reads
  them), and --paired, the paired test of those results against the best."""
  flags.DEFINE_bool("averaged", None, "evaluate.py scores of averaged checkpoints only "
                    "(--noaveraged: of single checkpoints only; default: either)",
                    flag_values=values)
  flags.DEFINE_integer("beam_size", None, "evaluate.py scores of this beam size only (1: "
                       "greedy; default: any)", flag_values=values)
  flags.DEFINE_bool("paired", False, "with --metric <split>_bleu: each run's paired bootstrap "
                    "p-value against the best run on the same references", flag_values=values)


def evaluations(values: flags.FlagValues):
  """The `sweeps.Evaluations` that --averaged and --beam_size ask for (a SweepError for a
  beam under 1)."""
  from transformer_jax.sweeps.report import Evaluations  # the sweeps only where used
  return Evaluations(values.averaged, values.beam_size)


def deprecated(old: str, new: str) -> None:
  """A renamed flag keeps its old spelling for one release, with this warning: one line on
  stderr, and a DeprecationWarning at the caller's line for code that records warnings."""
  message = f"{old} is deprecated and will be removed in the next release: use {new}"
  caller = sys._getframe(1)
  # Filed under this module's name: Python's default filters show a DeprecationWarning raised
  # in __main__ (a script's own line), which printed the message a second time.
  warnings.warn_explicit(message, DeprecationWarning, caller.f_code.co_filename,
                         caller.f_lineno, module=__name__)
  print(f"warning: {message}", file=sys.stderr)
