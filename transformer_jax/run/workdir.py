"""A run's directory and what it holds: the contract between training and the tools.

    <workdir>/config.json      the experiment config the run was started with, plus
                               `resolved_model` (every TransformerConfig field, vocabulary included)
                               and `resolved_tokenizer` (its SentencePiece model's sha256)
    <workdir>/spm.model        the SentencePiece model (trained on first use, reused on resume)
    <workdir>/spm.model.json   the data config it was trained from (`_check_tokenizer`)
    <workdir>/spm.model.lock   held while it is trained (several processes, one trains it)
    <workdir>/metrics.jsonl    one JSON object per log or evaluation event
    <workdir>/tensorboard/     the same scalars for TensorBoard
    <workdir>/checkpoints/     Orbax steps: train state, data iterator positions, metadata
    <workdir>/averaged/        averaged parameters (scripts/average_checkpoints.py)
    <workdir>/best_<metric>/   the best evaluation's parameters (config.keep_best, run/best.py)
    <workdir>/eval/            scripts/evaluate.py's outputs and results.jsonl
    <workdir>/config.<step>.json  the config a resume at <step> changed to (see `check_config`);
                               `.superseded.json` once a resume at an earlier step replaced it
    <workdir>/checkpoints/<step>.damaged  a step that could not be read, set aside
    <workdir>/.lock            held by the run that trains in the workdir (see `Lock`)

Training writes it; translate, evaluate, plot and report only read it. The contract
(docs/training.md, "The workdir"): one run at a time per workdir; a resume may change only what
leaves the checkpoints and the tokenizer valid, and every change is kept; nothing a failed
command did makes a workdir unusable.
"""
from __future__ import annotations

import dataclasses
import difflib
import errno
import fcntl
import filecmp
import functools
import glob
import hashlib
import json
import os
import re
import shlex
import socket
import sys
import time

from transformer_jax.files import write_atomically

CONFIG = "config.json"
SPM_MODEL = "spm.model"
CHECKPOINTS = "checkpoints"
AVERAGED = "averaged"
EVAL = "eval"                  # scripts/evaluate.py's outputs, never touched by training
EVAL_LOG = "results.jsonl"     # in EVAL: one line per evaluation, appended
TRAIN_HINT = "train first with scripts/train.py --config configs/default.py --workdir {}"
LOCK = ".lock"
RESOLVED_DATA = "resolved_data"   # config.json: the corpus files' fingerprint
RESOLVED_TOKENIZER = "resolved_tokenizer"  # config.json: the tokenizer file's bytes
# Model fields that change what the parameters compute but not their shapes (max_len: with
# sinusoidal positions): a new run can start from the old one's parameters (init_from).
# (Not norm_position: pre-LN has a final LayerNorm that post-LN has not.)
SAME_SHAPE_MODEL_FIELDS = ("layer_norm_epsilon", "scale_embeddings", "activation", "max_len")
# Fields whose change on resume would make the checkpoint or the tokenizer unusable or silently
# wrong. Model fields are all refused but these, which change neither the parameters' shapes nor
# what they compute:
SAFE_MODEL_FIELDS = ("dropout_rate", "attention_dropout_rate", "relu_dropout_rate", "dtype",
                     "attention_impl", "padding_as_lengths", "remat", "kernel_init")
# The corpus and its tokenizer: the run's spm.model was trained on these.
TOKENIZER_FIELDS = tuple(f"data.{f}" for f in (
    "dataset", "source_lang", "target_lang", "held_out_per_mille", "numbers_train_size",
    "numbers_eval_size", "numbers_seed", "locale_dir", "locale_include_ding", "locale_ding_path",
    "tsv_path", "source_path", "target_path", "split", "vocab_size", "vocab_model_type",
    "vocab_max_chars",
    "vocab_split_digits", "vocab_byte_fallback", "vocab_path", "shuffle_seed"))
# How this process joins a run: differs between the processes of one run and between launches.
LAUNCH_FIELDS = ("distributed", "coordinator_address", "coordinator_bind_address",
                 "num_processes", "process_id")
# Fields added after runs were made whose default differs from what those runs did: a
# config.json without them is read back with these values, or with what a function of the
# run's flat record gives where that depended on another field (`recorded_values`). Any other
# field a run did not record reads back as its default (`field_defaults`): a new field must
# default to what the code did before it, or be listed here.
LEGACY_VALUES = {
    "data.split": "source",          # before 2026-11-23: split by the exact source
    "weight_decay_mask": "all",      # before 2026-11-25: AdamW decayed every parameter
    # Before 2026-11-26 (8b26bc8) cuDNN attention always got the dense mask (the same values).
    "model.padding_as_lengths": False,
    # Before 2026-11-22 (1b3d92f) the attention projections had biases where the FFN had.
    "model.attention_bias": lambda run: run.get("model.use_bias", True),
}


def train_hint(workdir: str) -> str:
  """What to do about a workdir with no checkpoint, quoted for a shell where it needs to be
  (spaces, say): wait, where a live process of this host is training it; pick one, where it
  is a directory of runs (a sweep's, or runs/); train with the run's own config where it has
  a config.json (TRAIN_HINT's configs/default.py would be refused, or train another model);
  else TRAIN_HINT."""
  holder = running_here(workdir)
  if holder:
    return (f"a run is training in it now (pid {holder.get('pid', '?')}, started "
            f"{holder.get('started', '?')}) and has not written it yet: wait for its first "
            "checkpoint (every config.checkpoint_every_steps steps)")
  if os.path.exists(os.path.join(workdir, CONFIG)):
    return (f"train first with python scripts/train.py --workdir {shlex.quote(workdir)} (it "
            f"trains with the run's own {CONFIG})")
  holds = holds_runs(workdir)
  if holds:
    return f"{holds}: give one of them as --workdir"
  return TRAIN_HINT.format(shlex.quote(workdir))


def holds_runs(directory: str) -> str | None:
  """The start of a message for a directory of runs given as one run's workdir, "`directory`
  holds runs (its first three and N more)", or None where no run lies under it (`runs_under`)."""
  runs = runs_under(directory)
  if not runs:
    return None
  more = f" and {len(runs) - 3} more" if len(runs) > 3 else ""
  return f"{directory} holds runs ({', '.join(runs[:3])}{more})"


def not_a_run(path: str) -> str | None:
  """What to pass instead of `path` as --workdir where it is missing or a sweep's directory
  (None otherwise)."""
  if not os.path.exists(path):
    return f"--workdir {path} does not exist: pass the directory of a training run"
  if os.path.exists(os.path.join(path, "sweep.json")):
    points = sorted(n for n in os.listdir(path) if os.path.exists(os.path.join(path, n, CONFIG)))
    listed = "".join(f"\n  {os.path.join(path, n)}" for n in points)
    return (f"{path} is a sweep (it holds sweep.json), not one run: pass one point's workdir as "
            "--workdir" + (f":{listed}" if points else " (no point has started yet)"))
  return None


def runs_under(directory: str) -> list[str]:
  """The runs (directories with a config.json or checkpoints) directly or two levels under
  `directory` (a sweep's points are one level down, runs/ of sweeps two), sorted."""
  found = []
  for depth in ("*", os.path.join("*", "*")):
    for marker in (CONFIG, CHECKPOINTS):
      pattern = os.path.join(glob.escape(directory), depth, marker)  # `exp[1]` is no pattern
      found += [os.path.dirname(p) for p in glob.glob(pattern)]
  return sorted(set(found))


class RunError(RuntimeError):
  """A workdir, step or checkpoint that cannot be used; the message says what to do."""


class CheckpointError(RunError):
  """A checkpoint that cannot be read or written."""


def config_json(config, model_cfg) -> dict:
  """What `config.json` holds: the experiment config, the resolved model config and the
  corpus files' fingerprint (`data.fingerprint`; empty for corpora built from no files)."""
  # Imported here: transformer_jax.data loads sentencepiece, which the benchmark's GPU runs
  # (that import this module through checkpointing) do without.
  from transformer_jax.data import fingerprint
  out = json.loads(config.to_json_best_effort())
  out["resolved_model"] = model_cfg.to_dict()
  out[RESOLVED_DATA] = fingerprint.record(config.data)
  return out


def tokenizer_record(path: str) -> dict | None:
  """What config.json keeps of the run's tokenizer file (None: no such file): its size and
  sha256, so a command can tell a replaced or retrained file (not its path: a workdir may
  move, and `vocabulary_path` finds the file)."""
  if not os.path.exists(path):
    return None
  with open(path, "rb") as f:
    digest = hashlib.file_digest(f, "sha256").hexdigest()
  return {"bytes": os.path.getsize(path), "sha256": digest}


def tokenizer_problem(run: dict, path: str, where: str) -> str | None:
  """Why the tokenizer file at `path` is not the one the run (`run`, its config) recorded in
  `where` (its config.json or config.<step>.json), or None: it is, or the run recorded none
  (runs made before 2026-12-06). The run's token ids mean that file's pieces; another file
  (even one trained again from the same corpus and settings) may give the same ids other
  pieces."""
  recorded = run.get(RESOLVED_TOKENIZER)
  if not recorded:
    return None
  found = tokenizer_record(path)
  if found and found["sha256"] == recorded["sha256"]:
    return None
  what = ("is missing" if found is None else
          f"holds other bytes than the tokenizer the run was trained with (sha256 "
          f"{found['sha256'][:12]}..., {found['bytes']:,} bytes)")
  return (f"{path} {what}: {where} records the run's tokenizer as sha256 "
          f"{recorded['sha256'][:12]}... ({recorded['bytes']:,} bytes). The run's checkpoints "
          "hold token ids of that file's pieces, and another tokenizer, even one trained again "
          "on the same corpus, reads them as other pieces without an error. Put the run's own "
          f"file back at {path} (from a copy of the workdir or a backup); to train with another "
          "tokenizer, start a new --workdir")


def write_config(workdir: str, config, model_cfg, name: str = CONFIG) -> str:
  """Write (atomically) the config a run uses, with its tokenizer file's record
  (`tokenizer_record`); returns the path. A failed write (a full disk) leaves no partial file
  and names the file it was writing."""
  path = os.path.join(workdir, name)
  out = config_json(config, model_cfg)
  out[RESOLVED_TOKENIZER] = tokenizer_record(vocabulary_path(workdir, out))
  _write_json(workdir, path, out)
  return path


def _write_json(workdir: str, path: str, content: dict) -> None:
  """`content` written to `path` atomically and durably (`files.write_atomically`); a failed
  write (a full disk) leaves no partial file and names the file it was writing."""
  try:
    write_atomically(path, json.dumps(content, indent=2))
  except OSError as e:
    raise RunError(f"writing {path} failed: {e.strerror or e}. The run's checkpoints and its "
                   f"earlier configs are kept: free space in {workdir} and run the same command "
                   "again") from None


def read_json(path: str) -> dict:
  """A run's JSON file (its config, a tokenizer's record), or a RunError naming it when it
  does not parse: emptied or cut short (a power loss before this code synced its writes, a
  copy cut short) or edited by hand. Not a traceback, and nothing written."""
  try:
    with open(path, "rb") as f:
      return json.loads(f.read())
  except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
    raise RunError(f"{path} does not read as JSON ({type(e).__name__}: {e}): the file is "
                   "damaged (emptied or cut short) or was edited; mend it or restore it from a "
                   "copy") from None


def load_run_config(workdir: str, step: int | None = None) -> dict:
  """The experiment config of a run, as a dict: the one in use now, or with `step` the one the
  checkpoint of that step was written with (`config.json`, or the last `config.<s>.json` of a
  resume at s < step)."""
  if not os.path.exists(os.path.join(workdir, CONFIG)):
    raise RunError(f"{os.path.join(workdir, CONFIG)} not found: {workdir} is not the workdir "
                   "of a training run; " + train_hint(workdir))
  path = run_config_path(workdir, step)
  run = read_json(path)
  if "resolved_model" not in run:
    raise RunError(f"{path} has no 'resolved_model': it was not written by "
                   "transformer_jax's training; pass the workdir of a training run")
  # The model the tools build: a field added since the run takes what the run did where that
  # was not the default (LEGACY_VALUES); the others take their defaults in TransformerConfig.
  values = recorded_values(run)
  for key in LEGACY_VALUES:
    if key.startswith("model.") and key[len("model."):] not in run["resolved_model"]:
      run["resolved_model"][key[len("model."):]] = values[key]
  return run


def run_config_path(workdir: str, step: int | None = None) -> str:
  """The file `load_run_config(workdir, step)` reads (for messages that name it)."""
  path = os.path.join(workdir, CONFIG)
  for resumed_at, changed in history(workdir):
    if step is None or resumed_at < step:
      path = changed
  return path


def experiment_config(workdir: str):
  """The experiment config the run in `workdir` trains with now (`config.json`, or its latest
  `config.<step>.json`), as a ConfigDict shaped like `experiment.base_config()`, so that
  `--config.<field>` overrides keep their types (`configs/resume.py`, `train.py --workdir W`).
  A field the run recorded that this codebase no longer has is an error, not dropped; one it
  did not record yet takes the value that matches what the run did (`LEGACY_VALUES`), or the
  default. The launch fields are each process's own, not process 0's: they keep the defaults
  (pass them as overrides)."""
  from transformer_jax import experiment
  run = load_run_config(workdir)
  config = experiment.base_config()
  unknown = _unknown_fields(workdir, run)
  if unknown:
    raise RunError(unknown)
  stored = flatten({k: v for k, v in run.items() if not k.startswith("resolved_")})
  stored = {k: v for k, v in recorded_values(run).items()
            if (k in stored or k in LEGACY_VALUES) and k not in LAUNCH_FIELDS}
  for key, value in stored.items():
    *parents, leaf = key.split(".")
    target = config
    for name in parents:
      target = target[name]
    target[leaf] = value  # a JSON list into a tuple field: ConfigDict makes it a tuple
  return config


def vocabulary_path(workdir: str, run: dict) -> str:
  """The run's SentencePiece model: `data.vocab_path` if the config set one, else its own."""
  return run.get("data", {}).get("vocab_path") or os.path.join(workdir, SPM_MODEL)


def init_from_file(path: str, name: str) -> str | None:
  """The file `name` (spm.model, config.json) of the run that `init_from` `path` points into
  (its workdir, its checkpoints directory or one step of it), if there is one."""
  path = os.path.abspath(path)
  for candidate in (path, os.path.dirname(path), os.path.dirname(os.path.dirname(path))):
    if os.path.exists(os.path.join(candidate, name)):
      return os.path.join(candidate, name)
  return None


def init_from_vocabulary(path: str) -> str | None:
  """The `spm.model` of the run that `init_from` points into, if there is one."""
  return init_from_file(path, SPM_MODEL)


def init_from_split_warning(config, record: dict) -> str | None:
  """Why the run `config.init_from` points into may have trained on pairs this run holds out
  (`record`: this run's `resolved_data`), so that their loss and BLEU would measure what its
  parameters remember; None where it cannot have, or has no config.json to tell (a bare
  checkpoint). A source's split is a hash bucket under the held-out share (`numbers.split_of`;
  of its near-duplicate group for "locale" and "text"): over the same sentences and groups, a
  run holding out no larger a share holds out only what that run held out too."""
  found = init_from_file(config.init_from, CONFIG)
  try:
    stored = found and load_run_config(os.path.dirname(found))
  except (RunError, OSError, ValueError):
    stored = None
  if not stored:
    return None
  theirs = _unset_empty(recorded_values(stored))
  ours = _unset_empty(flatten(json.loads(config.to_json_best_effort())))
  why = [f"{f}: {theirs.get(f)!r} there, {ours.get(f)!r} here"
         for f in ("data.dataset", "data.source_lang", "data.target_lang")
         if theirs.get(f) != ours.get(f)]
  from transformer_jax.data.config import OWN_SPLIT_DATASETS  # see config_json
  dataset = ours["data.dataset"]
  # Another dataset or direction says it all; the split's own settings are compared within one.
  if not why and dataset == "numbers":
    from transformer_jax.data import numbers  # see config_json
    shares = [numbers.held_out_share(*(c[f"data.numbers_{n}"] for n in
                                       ("train_size", "eval_size", "eval_size")))
              for c in (theirs, ours)]
    if shares[1] > shares[0]:
      why.append(f"a held-out share of {shares[1]} per mille here, {shares[0]} there "
                 "(data.numbers_train_size and numbers_eval_size)")
  elif not why and dataset not in OWN_SPLIT_DATASETS:  # locale, text (WMT: TFDS's own splits)
    if "data.split" not in same_run_fields(theirs, ours) and theirs["data.split"] != ours[
        "data.split"]:
      why.append(f"data.split: {theirs['data.split']!r} there, {ours['data.split']!r} here")
    if ours["data.held_out_per_mille"] > theirs["data.held_out_per_mille"]:
      why.append(f"data.held_out_per_mille: {theirs['data.held_out_per_mille']} there, "
                 f"{ours['data.held_out_per_mille']} here")
    if _corpus_identity(stored.get(RESOLVED_DATA, {}), stored["data"]) != _corpus_identity(
        record, None):
      why.append("its corpus files held other bytes, or it recorded none (a run from before "
                 "2026-11-25)")
  if not why:
    return None
  return (f"config.init_from={config.init_from}: that run split its data otherwise "
          f"({'; '.join(why)}), so pairs it trained on may be in this run's validation and "
          "test splits, where loss and BLEU would measure what its parameters remember; to "
          "hold out only pairs it held out, fork with its corpus, languages and split, and a "
          "held-out share no larger than its")


def _corpus_identity(recorded: dict, data: dict | None) -> list | None:
  """The content of a recorded corpus (`fingerprint.record`): each file's SHA-256 with the field
  that named it (none for the locale catalogs); None where it recorded no files."""
  from transformer_jax.data import fingerprint  # see config_json
  inputs = recorded.get("inputs")
  if not inputs:
    return None
  role = {path: field for field, path in fingerprint.recorded_roles(recorded, data).items()}
  return sorted((role.get(p, ""), e["sha256"]) for p, e in inputs.items())


# ---------------------------------------------------------------- one run per workdir


class WorkdirBusy(RunError):
  """Another run holds the workdir."""


class Lock:
  """An exclusive lock on `<workdir>/.lock` for the lifetime of a run.

  `fcntl.flock`: the kernel releases it when the process ends, however it ends, so a killed run
  never leaves a stale lock. The file says who holds it (host, pid, start time, command), for
  the message a second run gets.
  """

  def __init__(self, workdir: str):
    self.path = os.path.join(workdir, LOCK)
    self._fd: int | None = None

  def acquire(self) -> dict | None:
    """None when this process now holds the lock; else what the file says of the holder."""
    fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      try:
        holder = json.loads(os.pread(fd, 65536, 0).decode() or "{}")
      except ValueError:
        holder = {}
      os.close(fd)
      return holder
    holder = {"host": socket.gethostname(), "pid": os.getpid(),
              "pid_start": process_start(os.getpid()),
              "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "command": " ".join(sys.argv)}
    try:
      os.ftruncate(fd, 0)
      os.pwrite(fd, json.dumps(holder).encode(), 0)
    except OSError as e:
      # A full disk (no page for these bytes): the lock holds without the note, and a second
      # run is told only that the workdir is in use. Failing here would stop the resume that
      # frees space (a lower keep_checkpoints deletes old checkpoints first, run/loop.py).
      if e.errno not in (errno.ENOSPC, errno.EDQUOT):
        os.close(fd)
        raise
    self._fd = fd
    return None

  def release(self) -> None:
    if self._fd is not None:
      os.ftruncate(self._fd, 0)
      fcntl.flock(self._fd, fcntl.LOCK_UN)
      os.close(self._fd)
      self._fd = None


def running_here(workdir: str) -> dict | None:
  """The holder of `workdir`'s lock (what `.lock` says) when it is a live process of this
  host; None otherwise. Reads the file only: taking the lock to test it, even for an instant,
  could make a run starting at that moment fail as "in use". A holder killed with -9 leaves
  its JSON behind, so the pid is checked; one on another host cannot be, and is not named."""
  try:
    with open(os.path.join(workdir, LOCK)) as f:
      holder = json.loads(f.read() or "{}")
  except (OSError, ValueError):
    return None
  if not isinstance(holder, dict) or holder.get("host") != socket.gethostname():
    return None
  try:
    os.kill(int(holder["pid"]), 0)
  except (KeyError, TypeError, ValueError, ProcessLookupError):
    return None
  except PermissionError:  # alive, another user's
    pass
  # The pid may since have gone to another process (a holder killed with -9 long ago): its
  # start time tells them apart where both are known.
  recorded, now = holder.get("pid_start"), process_start(int(holder["pid"]))
  if recorded is not None and now is not None and recorded != now:
    return None
  return holder


def process_start(pid: int) -> str | None:
  """When process `pid` started, in clock ticks after boot (/proc/PID/stat's 22nd field), as
  text; None where there is no /proc (not Linux) or no such process."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      # The command name (2nd field) may hold spaces and parentheses: count after its last ")".
      return f.read().rsplit(")", 1)[1].split()[19]
  except (OSError, IndexError):
    return None


def busy_message(workdir: str, holder: dict | None) -> str:
  if not holder:
    return (f"{workdir} is in use by another run (its process 0 holds {workdir}/{LOCK}): wait "
            "for it to finish or stop it, or pass another --workdir")
  pid = holder.get("pid", "?")
  return (f"{workdir} is in use by another run: pid {pid} on {holder.get('host', '?')}, started "
          f"{holder.get('started', '?')} ({holder.get('command', '?')}). Wait for it to finish "
          f"or stop it (kill {pid} saves and exits) and run this again to resume; to train "
          "something else, pass another --workdir. Read-only tools (translate, evaluate, "
          "plot_metrics, compare_runs, sweep --report) work on a workdir in use.")


# ---------------------------------------------------------------- config changes on resume


class ConfigChangeRefused(RunError):
  """The new config would make the workdir's checkpoints or tokenizer unusable or wrong."""


def history(workdir: str) -> list[tuple[int, str]]:
  """(step, path) of every `config.<step>.json`: the config a resume at that step changed to."""
  out = []
  for name in os.listdir(workdir) if os.path.isdir(workdir) else []:
    match = re.fullmatch(r"config\.(\d+)\.json", name)
    if match:
      out.append((int(match.group(1)), os.path.join(workdir, name)))
  return sorted(out)


def flatten(tree: dict, prefix: str = "") -> dict:
  """{"model": {"d_model": 8}} -> {"model.d_model": 8}; lists and scalars are leaves."""
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      out.update(flatten(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


def field_defaults() -> dict:
  """Every experiment field's default, flat and as JSON has it: what a run made before the
  field existed did, unless LEGACY_VALUES says otherwise. Model fields take TransformerConfig's
  own defaults, not a named size's: what a size sets (the sizes, dropout_rate, max_len) every
  run has recorded from the start. A copy: the caller may change it."""
  return dict(_field_defaults())


@functools.cache
def _field_defaults() -> dict:
  # Built once per process: every config comparison and every run config read uses it.
  from transformer_jax import experiment  # see config_json
  from transformer_jax.config import TransformerConfig
  flat = flatten(json.loads(experiment.base_config().to_json_best_effort()))
  out = {k: v for k, v in flat.items() if not k.startswith("model.")}
  for field in dataclasses.fields(TransformerConfig):
    # Not the fields a run sets itself (vocab_size, ...), which base_config leaves out.
    if f"model.{field.name}" in flat and field.default is not dataclasses.MISSING:
      out[f"model.{field.name}"] = json.loads(json.dumps(field.default))
  return out


def _unknown_fields(workdir: str, run: dict) -> str | None:
  """What to say of a run whose config has fields this code does not have (None: it has none):
  another version of transformer-jax wrote it."""
  recorded = flatten({k: v for k, v in run.items() if not k.startswith("resolved_")})
  unknown = sorted(set(recorded) - set(field_defaults()))
  if not unknown:
    return None
  path = current_config_path(workdir)
  return (f"{path} has fields this code does not know: {unknown}: the run was made by another "
          "version of transformer-jax; resume it from that version's checkout"
          + _misspelt_hint(unknown, path))


def _misspelt_hint(unknown: list[str], path: str) -> str:
  """The other way a run recorded unknown fields, before `experiment.validate` refused them:
  a config file misspelt a field (`c.num_train_step = 2`), and the run trained with the default
  of the one meant."""
  known = list(field_defaults())
  close = {name: difflib.get_close_matches(name, known, n=1, cutoff=0.6) for name in unknown}
  typos = [f"{name} (did you mean {match[0]}?)" for name, match in close.items() if match]
  if not typos:
    return ""
  return (f". If its config file misspelt {', '.join(typos)}, the run trained with the default "
          f"of the field meant: delete the misspelt field(s) from {path} to resume it as it ran")


def recorded_values(stored: dict) -> dict:
  """A run's config (`config.json`'s dict) flat, with every field this code has: what the run
  recorded, else what it did (its LEGACY_VALUES entry), else the field's default. The
  resolved records (`resolved_model`, ...) are left out."""
  old = flatten({k: v for k, v in stored.items() if not k.startswith("resolved_")})
  legacy = {k: v(old) if callable(v) else v for k, v in LEGACY_VALUES.items()}
  return {**field_defaults(), **legacy, **old}


def config_changes(stored: dict, new: dict) -> list[tuple[str, object, object]]:
  """(field, stored value, new value) of every field that differs; the resolved model and how
  this process joined the run are not compared. A field the run did not record yet (added to
  the code since) counts as what the run did (`recorded_values`); one the new config leaves
  out (a mesh that names only some axes) as its default."""
  old = _unset_empty(recorded_values(stored))
  now = _unset_empty({**field_defaults(),
                      **flatten({k: v for k, v in new.items() if not k.startswith("resolved_")})})
  same = same_run_fields(old, now)
  return [(k, old.get(k), now.get(k)) for k in sorted(set(old) | set(now))
          if k not in LAUNCH_FIELDS and k not in same and old.get(k) != now.get(k)]


def same_run_fields(*configs: dict) -> tuple[str, ...]:
  """The fields flat configs `configs` may differ in and still make the same run: data.split
  where none is split here (numbers, WMT: `OWN_SPLIT_DATASETS`), and its "grouped" and
  "grouped_v2" for gettext catalogs, which split alike (no message normalizes to nothing,
  `locale.clean_message`). Its default became "grouped_v2" on 2026-12-07: the runs and sweeps
  of those datasets made before go on with the same commands."""
  from transformer_jax.data.config import (  # see config_json
      LOCALE_SAME_SPLITS,
      OWN_SPLIT_DATASETS,
  )
  datasets = {c.get("data.dataset") for c in configs}
  if datasets <= set(OWN_SPLIT_DATASETS) or (datasets == {"locale"} and {
      c.get("data.split") for c in configs} <= set(LOCALE_SAME_SPLITS)):
    return ("data.split",)
  return ()


def _unset_empty(values: dict) -> dict:
  """Flat `values` with "" as None in the fields whose default is None (the paths): every
  reader takes both for unset (`data.vocab_path or <workdir>/spm.model`), so a run started with
  `--config.data.vocab_path=` is the same run as one without it."""
  defaults = field_defaults()
  return {k: None if v == "" and k in defaults and defaults[k] is None else v
          for k, v in values.items()}


def refusal(field: str, old, new, stored: dict, *, has_checkpoint: bool,
            has_tokenizer: bool) -> str | None:
  """Why changing `field` from `old` to `new` is refused (None: allowed)."""
  if field in TOKENIZER_FIELDS and (has_tokenizer or has_checkpoint):
    return "the corpus or tokenizer the run's spm.model was trained with"
  if not has_checkpoint:
    return None
  if field.startswith("model."):
    name = field[len("model."):]
    learned = stored.get("model", {}).get("position_encoding") == "learned"
    if name not in SAFE_MODEL_FIELDS and (name != "max_len" or learned):
      return "the model's parameters or what they compute"
  if field == "seed":
    return "nothing: a resumed run's random state comes from its checkpoint"
  if field == "init_from":
    return "nothing: a run with checkpoints resumes from them, not from init_from"
  # As optim.make_optimizer decides: `> 0`, so a run started with NaN (before validate refused
  # it; plain Adam, no clipping) resumes with 0.
  if field in ("weight_decay", "grad_clip_norm") and (old > 0) != (new > 0):
    return "the optimizer state's structure (Adam <-> AdamW, clipping on <-> off)"
  if field == "flatten_optimizer":
    return "the optimizer state's structure (one flat vector <-> one array per parameter)"
  if field == "weight_decay_mask" and stored.get("weight_decay"):
    # "all" has no optax.masked wrapper, "matrices" has (a run from before the field: "all").
    return "the optimizer state's structure (AdamW on every parameter <-> on the matrices)"
  return None


def owning_run(path: str) -> tuple[str, str] | None:
  """(the run, the name of its directory) where `path` is or is inside a directory a run owns:
  its checkpoints, averaged, best_<metric> or eval directory (the run's parent holds its
  config.json), which that run reads as its own, rotates and rewrites; else None."""
  path = os.path.abspath(path)
  while os.path.dirname(path) != path:
    parent, name = os.path.split(path)
    if ((name in (CHECKPOINTS, AVERAGED, EVAL) or name.startswith("best_"))
        and os.path.exists(os.path.join(parent, CONFIG))):
      return parent, name
    path = parent
  return None


def inside_another_run(workdir: str) -> str | None:
  """Why `workdir` is no place for a new run: it is (inside) another run's directory
  (`owning_run`)."""
  found = owning_run(workdir)
  if found is None:
    return None
  parent, name = found
  return (f"--workdir {workdir} is inside the run {parent} (its {name}/), not a workdir of "
          f"its own: a run trained there would go when {parent} rotates its {name}/. To "
          f"resume that run pass --workdir {shlex.quote(parent)}; to start from its "
          f"parameters, a new --workdir outside it with --config.init_from="
          f"{shlex.quote(os.path.join(parent, CHECKPOINTS))}")


def refuse_inside_another_run(workdir: str) -> None:
  """Raise RunError where a new run's `workdir` is inside another run (`inside_another_run`);
  called before the workdir is made or locked, so the refusal leaves nothing in that run."""
  if not os.path.exists(os.path.join(workdir, CONFIG)):
    inside = inside_another_run(workdir)
    if inside:
      raise RunError(inside)


def missing_dirs(workdir: str) -> list[str]:
  """The directories `os.makedirs(workdir)` would create, innermost first."""
  out, path = [], os.path.abspath(workdir)
  while not os.path.exists(path) and os.path.dirname(path) != path:
    out.append(path)
    path = os.path.dirname(path)
  return out


def remove_if_untouched(lock: "Lock", created: list[str]) -> bool:
  """After a refused command: where this command made the workdir (`created`, from
  `missing_dirs`) and wrote nothing into it but the lock, delete the lock file (still holding
  it, so no other run can take a lock on a file about to go), release it and remove the
  directories made. True if it did; a workdir with anything else in it is left as it is."""
  if not created or os.listdir(created[0]) != [LOCK]:
    return False
  os.unlink(lock.path)
  lock.release()
  for path in created:
    try:
      os.rmdir(path)
    except OSError:  # another command's files appeared meanwhile: theirs to keep
      break
  return True


def check_config(workdir: str, config) -> tuple[dict | None, list]:
  """(stored config or None for a new run, the allowed changes); raises ConfigChangeRefused,
  naming every refused field and the way out, before anything is written."""
  path = os.path.join(workdir, CONFIG)
  if not os.path.exists(path):
    refuse_inside_another_run(workdir)
    if config.init_from and not os.path.exists(config.init_from):
      raise RunError(f"--config.init_from={config.init_from} does not exist: pass a run's "
                     "workdir, its checkpoints directory or one checkpoints/<step> directory")
    from transformer_jax.data import config as data_config  # see config_json
    stray = data_config.stray_corpus_field(config.data)
    if stray:
      raise data_config.DataError(stray)
    _check_tokenizer(workdir, config)
    return None, []
  stored = load_run_config(workdir)
  unknown = _unknown_fields(workdir, stored)
  if unknown:
    raise ConfigChangeRefused(f"{unknown}, or start a new --workdir. Nothing was changed in "
                              f"{workdir}.")
  changes = config_changes(stored, json.loads(config.to_json_best_effort()))
  has_checkpoint = any(n.isdigit() for n in _listdir(os.path.join(workdir, CHECKPOINTS)))
  has_tokenizer = os.path.exists(os.path.join(workdir, SPM_MODEL))
  refused = [(f, old, new, why) for f, old, new in changes
             if (why := refusal(f, old, new, stored, has_checkpoint=has_checkpoint,
                                has_tokenizer=has_tokenizer))]
  if refused and {f for f, *_ in refused} <= set(CORPUS_PATH_FIELDS) and _same_bytes(stored,
                                                                                   config):
    # The corpus moved (or is named relative to another directory): its files were just
    # hashed and found the same, so `_check_corpus` has nothing left to compare.
    refused = []
  elif not refused and (has_checkpoint or has_tokenizer):
    _check_corpus(workdir, stored, config)
  if not refused and has_checkpoint:
    spm = vocabulary_path(workdir, stored)
    problem = (tokenizer_problem(stored, spm, current_config_path(workdir))
               or _unrecorded_tokenizer_problem(stored, spm))
    if problem:
      raise ConfigChangeRefused(f"{problem}. Nothing was changed in {workdir}.")
  if refused:
    lines = "\n".join(f"  {f}: {old!r} -> {new!r} (changes {why})" for f, old, new, why in refused)
    recorded, values = flatten(stored), recorded_values(stored)
    for f, old, _, _ in refused:
      if f in LEGACY_VALUES and f not in recorded:
        lines += (f"\n  (the run was made before {f} existed, and did what {f}={values[f]} "
                  f"does: add --config.{f}={values[f]} to resume it)")
      elif f == "data.split" and "data.dataset" not in {g for g, *_ in refused}:
        # Its default moved ("grouped" until 2026-12-07) under the runs of text corpora.
        lines += (f"\n  (the run's held-out pairs are those of data.split={old}: add "
                  f"--config.data.split={old} to resume it)")
    learned = stored.get("model", {}).get("position_encoding") == "learned"
    shapes = [f for f, _, _, _ in refused if f.startswith("model.")
              and f[len("model."):] not in SAFE_MODEL_FIELDS + SAME_SHAPE_MODEL_FIELDS
              or f == "model.max_len" and learned]
    tokenizer = [f for f, _, _, _ in refused if f in TOKENIZER_FIELDS]
    if shapes:
      start_from = f" (its parameters cannot seed it: their shapes change with {shapes[0]})"
    elif tokenizer:
      # init_from takes the old run's spm.model along: the new tokenizer fields would be moot.
      start_from = (f" (from scratch: {tokenizer[0]} needs a new tokenizer, and "
                    "--config.init_from would bring this run's)")
    else:
      start_from = (f", adding --config.init_from={os.path.join(workdir, CHECKPOINTS)} to "
                    "begin from this run's parameters")
    w = shlex.quote(workdir)
    raise ConfigChangeRefused(
        f"{workdir} holds a run whose config differs from this command's (its --config file "
        f"and overrides) where a resume cannot change it:\n{lines}\nNothing was changed in "
        f"{workdir}. To resume it as it is: python scripts/train.py --workdir {w} (the "
        f"run's own config, {current_config_path(workdir)}); with the changes a resume allows: "
        f"--config {shlex.quote('configs/resume.py:' + workdir)} --config.<field>=... To train "
        f"with these values, start a new --workdir{start_from}.")
  return stored, changes


def record_config(workdir: str, config, model_cfg, step: int, stored: dict | None,
                  changes: list) -> str | None:
  """Write `config.json` for a new run, or `config.<step>.json` when a resume changed fields
  (the original stays as it was); returns the path written (None: nothing changed).

  A resume at `step` from an older checkpoint than the last change (newer ones were damaged
  and set aside) supersedes the changes made at or after `step`: they are renamed
  `config.<s>.superseded.json`, kept but no longer read, and the command's config is compared
  with the one in effect before them (`changes` compares it with the latest): a command equal
  to a superseded config still records it at `step`, for the steps it trains again.
  """
  if stored is None:
    return write_config(workdir, config, model_cfg)
  if not step:
    # No checkpoint yet: no token id depends on the tokenizer, which may have been trained
    # again since config.json was written (its file deleted after a refused change).
    _refresh_tokenizer_record(workdir, stored)
  later = [path for resumed_at, path in history(workdir) if resumed_at >= step]
  if not changes and not later:
    return None
  for path in later:
    os.replace(path, path[:-len(".json")] + ".superseded.json")
  if later and not config_changes(load_run_config(workdir, step),
                                  json.loads(config.to_json_best_effort())):
    return None
  return write_config(workdir, config, model_cfg, f"config.{step}.json")


def _unrecorded_tokenizer_problem(stored: dict, path: str) -> str | None:
  """For a run with checkpoints that recorded no tokenizer (made before 2026-12-06): a missing
  file, which training would replace with a new one, or one of another vocabulary size."""
  if stored.get(RESOLVED_TOKENIZER):
    return None
  if not os.path.exists(path):
    return (f"{path} is missing, and the run's checkpoints hold token ids of its pieces: a "
            "tokenizer trained again (what this command would do) may give the same ids other "
            f"pieces. Put the run's own file back at {path}; to train with a new tokenizer, "
            "start a new --workdir")
  from transformer_jax.data.tokenizer import Tokenizer  # see config_json
  pieces, vocab = Tokenizer(path).vocab_size, stored["resolved_model"]["vocab_size"]
  if pieces == vocab:
    return None
  return (f"{path} has {pieces:,} pieces, but the run was trained with a vocabulary of "
          f"{vocab:,}: it is not the run's tokenizer. Put the run's own file back at {path}; "
          "to train with another tokenizer, start a new --workdir")


def _refresh_tokenizer_record(workdir: str, stored: dict) -> None:
  """Rewrite the current config's tokenizer record (atomically) when the file no longer
  matches it."""
  record = tokenizer_record(vocabulary_path(workdir, stored))
  path = current_config_path(workdir)
  run = read_json(path)
  if record is None or run.get(RESOLVED_TOKENIZER) == record:
    return
  run[RESOLVED_TOKENIZER] = record
  _write_json(workdir, path, run)


def _check_tokenizer(workdir: str, config) -> None:
  """A workdir with a tokenizer but no config yet (a first command failed after training it):
  refuse a data config other than the one the tokenizer was trained from."""
  spm = os.path.join(workdir, SPM_MODEL)
  if config.data.vocab_path or not (os.path.exists(spm) and os.path.exists(spm + ".json")):
    return  # no tokenizer to protect (a .json left without its model is replaced with it)
  vocab = config.init_from and init_from_vocabulary(config.init_from)
  if vocab and filecmp.cmp(vocab, spm, shallow=False):
    return  # init_from's own tokenizer, copied by an earlier command: the fork's, on any corpus
  record = read_json(spm + ".json")
  # A field the tokenizer's record lacks (added since) is what that command did, as in
  # config_changes.
  recorded = _unset_empty(recorded_values(
      {"data": {k: v for k, v in record.items() if k != RESOLVED_DATA}}))
  trained = {k[len("data."):]: v for k, v in recorded.items() if k.startswith("data.")}
  new = {k[len("data."):]: v for k, v in _unset_empty(
      flatten({"data": json.loads(config.data.to_json_best_effort())})).items()}
  same = same_run_fields({f"data.{k}": v for k, v in trained.items()},
                         {f"data.{k}": v for k, v in new.items()})
  names = [f[len("data."):] for f in TOKENIZER_FIELDS if f not in same]
  differ = [n for n in names if trained.get(n) != new.get(n)]
  # spm.model.json records the files' bytes since 2026-11-25: the same corpus under other
  # paths (moved, or named from another directory) is no change, and the same paths on other
  # bytes (a corpus fixed after the command that trained the tokenizer failed, or after
  # prepare_data.py) would be read with the old vocabulary.
  stored = {RESOLVED_DATA: record.get(RESOLVED_DATA, {}), "data": record}
  if differ and {f"data.{n}" for n in differ} <= set(CORPUS_PATH_FIELDS) and _same_bytes(
      stored, config):
    return  # the corpus moved: its files were just hashed and found the same
  differ = ([f"data.{n}: {trained.get(n)!r} -> {new.get(n)!r}" for n in differ]
            or corpus_changes(stored, config.data))
  if differ:
    lines = "\n".join(f"  {line}" for line in differ)
    raise ConfigChangeRefused(
        f"{spm} was trained from another corpus or tokenizer config than this command's:\n"
        f"{lines}\nNo checkpoint uses it yet: delete {spm} and {spm}.json to train a new one, "
        "or pass the data config and files it was trained with.")


# Where the corpus files are: a change is no change of corpus when the files hold the same bytes.
CORPUS_PATH_FIELDS = ("data.tsv_path", "data.source_path", "data.target_path")


def _same_bytes(stored: dict, config) -> bool:
  """Whether the files `config` reads hold the bytes the run recorded (`resolved_data`), each
  in the role it had: the source file is still the source."""
  recorded = stored.get(RESOLVED_DATA, {})
  if not recorded.get("inputs"):
    return False
  from transformer_jax.data import fingerprint  # see config_json
  return fingerprint.matches(recorded, config.data, stored.get("data"))


def corpus_changes(stored: dict, data_config) -> list[str]:
  """How the corpus files `data_config` reads differ from those the run `stored` recorded (a
  line each; [] for the same bytes, or a run that recorded no files). The files this config
  reads now are compared: another set of files (a relative path from another working
  directory, a catalog added, the source and target swapped) is the same corpus only with the
  same contents in the same roles."""
  recorded = stored.get(RESOLVED_DATA, {})
  if not recorded.get("inputs"):  # a corpus of no files, or a run from before the record
    return []
  from transformer_jax.data import fingerprint  # see config_json
  inputs, data = recorded["inputs"], stored.get("data")
  now = fingerprint.input_files(data_config)
  if sorted(now) == sorted(inputs):
    # The same files (hashed again). Their roles are not compared here: the callers refuse a
    # change of the path fields first.
    return fingerprint.changed(inputs)
  if fingerprint.matches(recorded, data_config, data):
    return []
  return ([f"{p}: recorded, not read now" for p in sorted(inputs) if p not in now]
          + [f"{p}: read now, not recorded" for p in now if p not in inputs])


def _check_corpus(workdir: str, stored: dict, config) -> None:
  """Refuse a resume whose corpus files changed since the run recorded them: the dataset would
  be rebuilt with other splits under the old tokenizer and data position (`corpus_changes`)."""
  lines = corpus_changes(stored, config.data)
  relative = ""
  if any(p and not os.path.isabs(p) for p in (config.data.tsv_path, config.data.source_path,
                                              config.data.target_path)):
    relative = (f" This command's relative corpus paths were read from {os.getcwd()}: run it "
                "from the directory the run was started in, or give absolute paths.")
  from transformer_jax.data import fingerprint  # see config_json
  moved = ""
  if config.data.dataset == "text" and any(line.endswith(f": {fingerprint.GONE}")
                                           for line in lines):
    fields = " ".join(f"--config.data.{f}=NEW_PATH" for f in fingerprint.roles(config.data))
    moved = (" Moved? Resume naming their new place (`python scripts/train.py --config "
             f"configs/resume.py:{workdir} --workdir {workdir} {fields}`): the same bytes "
             "elsewhere are the same corpus.")
  if lines:
    raise ConfigChangeRefused(
        f"{workdir} holds a run trained on corpus files that have changed since:\n  "
        + "\n  ".join(lines) + f"\nNothing was changed in {workdir}. Its tokenizer, its "
        "validation and test splits and its place in the data were made from the old files."
        f"{moved} Restore them to resume this run, or start a new --workdir on the new files (with "
        f"--config.init_from={os.path.join(workdir, CHECKPOINTS)} to continue from this "
        "run's parameters and tokenizer, which it copies)." + relative)


def current_config_path(workdir: str) -> str:
  """The config the run trains with now: `config.json` or its latest `config.<step>.json`."""
  return run_config_path(workdir)


def _listdir(path: str) -> list[str]:
  return os.listdir(path) if os.path.isdir(path) else []
