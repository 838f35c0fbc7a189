"""Translating with a trained run: load a workdir, translate text in batches.

    translator = Translator("runs/default")                  # latest step, the run's search
    translator = Translator("runs/default", step=500, beam_size=4, alpha=0.6)
    translator = Translator("runs/default", checkpoint="runs/default/averaged")
    translator.translate(["one hundred and two", ""])        # -> ["einhundertzwei", ""]

Everything a run needs is in its workdir (`transformer_jax.run.workdir`): `config.json` (the
model's `resolved_model` fields and the search settings), `spm.model` and `checkpoints/<step>/`
or `averaged/<step>/` (`transformer_jax.run.averaging`). A checkpoint from elsewhere
(`checkpoint=`) must fit the workdir's model (every parameter's shape) and, where it lies in
another run's workdir, come with the same spm.model: both are checked before decoding.

Batching: sentences are sorted by length and cut into batches of at most `batch_size` rows; a
batch is padded to a bucket shape, rows to a power of two and length to a multiple of 16 (capped
at `max_len`), so the jitted search compiles a bounded number of times (at most
(log2(batch_size) + 1) row counts times max_len / 16 lengths). Results come back in the input order.
"""
from __future__ import annotations

import copy
import dataclasses
import filecmp
import math
import os
import shlex
import sys
import time
import typing
from typing import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.config import TransformerConfig
from transformer_jax.data.tokenizer import Tokenizer, normalize_spaces
from transformer_jax.model import Transformer
from transformer_jax.run import averaging, checkpointing
from transformer_jax.run.workdir import (
  AVERAGED,
  CHECKPOINTS,
  CONFIG,
  SAFE_MODEL_FIELDS,
  RunError,
  load_run_config,
  not_a_run,
  run_config_path,
  tokenizer_problem,
  train_hint,
  vocabulary_path,
)
from transformer_jax.search import (
  Ensemble,
  beam_search,
  greedy_search,
  in_parts,
  output_ids,
  sample_search,
  search_batch,
)

LENGTH_BUCKET = 16  # source lengths are padded to a multiple of this


@dataclasses.dataclass(frozen=True)
class Sampling:
  """Sampling instead of a search (`Translator.with_sampling`): each token drawn from
  softmax(logits / temperature), among the `top_k` most probable when `top_k` > 0, then among
  the nucleus of probability `top_p` when `top_p` < 1 (`search.sample_search`); the draw of
  line i (from 0) uses the key `fold_in(fold_in(key(seed), line_offset + i), j)` for its j-th
  sample, so it depends on the seed, the line's place and its source only. `line_offset`: the
  lines of a whole file before this input, so that a file split into pieces draws as it does
  whole. Made by `with_sampling`, which checks each value (its defaults: 1.0, 0, 1.0, 0, 0)."""
  temperature: float
  top_k: int
  top_p: float
  seed: int
  line_offset: int


class Hypothesis(typing.NamedTuple):
  """One finished hypothesis of a search (`Translator.nbest_ids`): its output ids without EOS,
  the beam score it was ranked by (length-penalised), its log-probability (natural log, EOS
  included) and whether it ended with EOS (false: cut at the length limit, so its
  log-probability has no EOS term)."""
  ids: list[int]
  score: float
  log_prob: float
  eos: bool


@dataclasses.dataclass
class SearchStats:
  """Sentences and output tokens (EOS included) searched, and the time the search took.

  `search_seconds` is the wall time of the compiled searches only: every new batch shape is
  first compiled on an all-padding batch of that shape (its loop ends at once), and that call
  is counted in `compile_seconds` instead. Tokenizing and detokenizing are in neither.
  """
  sentences: int = 0
  output_tokens: int = 0
  batches: int = 0
  search_seconds: float = 0.0
  compile_seconds: float = 0.0
  shapes: int = 0

  def as_dict(self) -> dict:
    t = self.search_seconds
    return {"sentences_per_sec": self.sentences / t if t > 0 else None,
            "target_tokens_per_sec": self.output_tokens / t if t > 0 else None,
            "search_seconds": t, "compile_seconds": self.compile_seconds,
            "searched_sentences": self.sentences, "output_tokens": self.output_tokens,
            "batches": self.batches, "compiled_shapes": self.shapes}


def _field_types(hint) -> tuple[type, ...]:
  """The JSON types a TransformerConfig field with annotation `hint` takes (`int | None` takes
  None too); () for a type JSON has no plain value of, which goes unchecked."""
  types = typing.get_args(hint) or (hint,)
  if not all(t in (str, bool, int, float, type(None)) for t in types):
    return ()
  return types


def _has_type(value, types: tuple[type, ...]) -> bool:
  """Whether `value` is of one of `types`; an int counts as a float, a bool as no number."""
  if isinstance(value, bool):
    return bool in types
  if isinstance(value, int) and float in types:
    return True
  return isinstance(value, tuple(t for t in types if t is not bool))


def model_config_from(run: dict, path: str = CONFIG) -> TransformerConfig:
  """The run's `TransformerConfig`, from `resolved_model` of `run`, read from `path`.

  A field this code does not know, or a value it refuses, is a RunError naming `path`: the run
  was trained by other code (another branch), and dropping the field would decode with a model
  other than the one the parameters were trained as.
  """
  fields = {f.name for f in dataclasses.fields(TransformerConfig)}
  unknown = sorted(set(run["resolved_model"]) - fields)
  how = ("the run was made by other code: check out the code that trained it to decode with "
         "it, or remove them from resolved_model if you know they are inert")
  if unknown:
    raise RunError(f"{path} has model fields this code does not know: {unknown} (in "
                   f"resolved_model); {how}")
  hints = typing.get_type_hints(TransformerConfig)  # resolved once, not per field
  for name, value in run["resolved_model"].items():
    expected = _field_types(hints[name])
    if expected and not _has_type(value, expected):
      # TransformerConfig's own checks would fail on it without naming the field
      # ("'<=' not supported between instances of 'str' and 'int'").
      wanted = " or ".join("None" if t is type(None) else t.__name__ for t in expected)
      raise RunError(f"{path} has {name}={value!r} in resolved_model, where this code expects "
                     f"{wanted}: the run was made by other code: check out the code that "
                     "trained it to decode with it")
  try:
    return TransformerConfig(**run["resolved_model"])
  except (TypeError, ValueError) as e:  # TransformerConfig's validation names the field
    raise RunError(f"{path} has a model value this code refuses (in resolved_model): {e}; "
                   "the run was made by other code: check out the code that trained it to "
                   "decode with it") from None


def warn_stderr(message: str) -> None:
  print(f"warning: {message}", file=sys.stderr, flush=True)


def workdir_config(workdir: str, choose: bool = True) -> dict:
  """`load_run_config(workdir)`, or a RunError that says what `workdir` is instead.

  load_run_config's advice ("train first") is wrong for what a user passes by mistake: a path
  that does not exist, a sweep, or a run's checkpoints directory or one step of it. `choose`:
  whether the command has --step, --averaged and --checkpoint to name (average_checkpoints.py
  has not).
  """
  if not os.path.exists(os.path.join(workdir, CONFIG)):
    problem = _not_a_workdir(workdir, choose)
    if problem:
      raise RunError(problem)
  return load_run_config(workdir)


def _not_a_workdir(path: str, choose: bool) -> str | None:
  """What to pass instead of `path` as --workdir (None: no better advice than "train first");
  with `choose`, also the flag that picks the checkpoint `path` holds."""
  problem = not_a_run(path)
  if problem:
    return problem
  path = os.path.abspath(path)
  parent, name = os.path.split(path)
  if name.isdigit() and os.path.isdir(os.path.join(path, "state")):
    # One step of a run's checkpoints/ (or averaged/, best_<metric>/).
    run = os.path.dirname(parent)
    how = (f" --step {name}" if os.path.basename(parent) == CHECKPOINTS
           else f" --checkpoint {shlex.quote(path)}")
    return (f"{path} is one checkpoint of the run {run}, not its workdir: pass --workdir "
            f"{shlex.quote(run)}{how if choose else ''}")
  steps = checkpointing.checkpoint_steps(path)
  if steps or name == CHECKPOINTS:
    how = {CHECKPOINTS: ", with --step N for a step other than the latest",
           AVERAGED: " --averaged"}.get(name, f" --checkpoint {shlex.quote(path)}")
    return (f"{path} holds the checkpoints of the run {parent} (steps {steps}), not its workdir: "
            f"pass --workdir {shlex.quote(parent)}{how if choose else ''}")
  return None


def _check_tokenizer(workdir: str, checkpoint_dir: str, spm_path: str) -> None:
  """A checkpoint inside another run's workdir must come with this run's tokenizer: with the
  same vocabulary size but other pieces it would decode, silently, into the wrong words."""
  other = os.path.dirname(checkpoint_dir)
  if other == os.path.abspath(workdir):
    return
  try:  # that run's own tokenizer: its data.vocab_path, or its spm.model
    other_spm = vocabulary_path(other, load_run_config(other))
  except RunError:  # not in a run's workdir (no config.json): no tokenizer to compare with
    return
  if not os.path.exists(other_spm) or filecmp.cmp(other_spm, spm_path, shallow=False):
    return
  raise RunError(f"{checkpoint_dir} belongs to the run {other}, trained with the tokenizer "
                 f"{other_spm}, which differs from {spm_path}, the one --workdir {workdir} "
                 f"uses: pass --workdir {shlex.quote(other)} instead to decode with that run's "
                 "checkpoints")


def check_param_shapes(params, config: TransformerConfig, where: str, workdir: str, *,
                       own: bool) -> None:
  """Parameters of another model (vocabulary size, width, depth) fail deep inside Flax with a
  long traceback; this names the first parameter that differs instead. `own`: the parameters
  are the workdir's own checkpoints, so it is the model code that changed, not the run."""
  model = Transformer(config.replace(deterministic=True))
  dummy = jnp.ones((1, min(8, config.max_len)), jnp.int32)  # within a learned position table
  expected = jax.eval_shape(lambda: model.init(jax.random.key(0), dummy, dummy))["params"]
  differs = checkpointing.shape_difference(checkpointing.param_shapes(params),
                                           checkpointing.param_shapes(nn.meta.unbox(expected)))
  if differs is None:
    return
  if own:
    raise RunError(
        f"the parameters in {where} do not fit the model this code builds from the run's "
        f"config.json: {differs}. The model code changed since the run was trained (a "
        "parameter added, renamed or reshaped): decode with the code that trained it; a new "
        "model field must default to the old behaviour, or have a LEGACY_VALUES entry "
        "(transformer_jax/run/workdir.py)")
  raise RunError(
      f"the parameters in {where} do not fit the model of {workdir}: "
      f"{differs.replace(' in the model', ' in the model its config.json describes')}; pass "
      "the workdir of the run these parameters were trained in as --workdir")


# Fields that change neither the parameters' shapes nor what they compute (those a resume may
# change) and the decoding switches: an ensemble's members may differ in them (the workdir's
# values are used for all).
DECODE_INERT = frozenset(SAFE_MODEL_FIELDS) | {"deterministic", "decode"}


def _check_member_model(config: TransformerConfig, directory: str, step: int, flag: str,
                        workdir: str) -> None:
  """A member inside another run's workdir must be the same model as `config` (the workdir's),
  not only the same shapes: a member trained with GELU (or without the embedding scale, or
  another LayerNorm epsilon) decoded as a ReLU model fits every parameter and computes
  something else."""
  run_dir = os.path.dirname(directory)
  if not os.path.exists(os.path.join(run_dir, CONFIG)):
    return  # parameters alone: their shapes are checked
  written_at = step if os.path.basename(directory) in (CHECKPOINTS, AVERAGED) else None
  other = model_config_from(load_run_config(run_dir, written_at),
                            run_config_path(run_dir, written_at))
  mine, theirs = dataclasses.asdict(config), dataclasses.asdict(other)
  differs = [f"{k}={theirs[k]!r} (--workdir's: {mine[k]!r})" for k in mine
             if k not in DECODE_INERT and mine[k] != theirs[k]]
  if differs:
    raise RunError(f"{flag}: the run {run_dir} is another model than --workdir {workdir}: "
                   f"{', '.join(differs)}; an ensemble decodes every member as --workdir's "
                   "model: ensemble runs of one model config only")


def _round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


class Translator:
  """A trained run's model, tokenizer, parameters and search settings, ready to translate.

  Search settings default to the run's config.json (`beam_size`, `length_penalty_alpha`,
  `max_len_margin`); pass them to override. `alpha` with a beam of 1 is refused (greedy
  search has no length penalty: given, it would look applied), as are a non-finite `alpha` and
  a beam wider than the vocabulary.

  Sources longer than `max_len - 1` pieces: sinusoidal positions extend past max_len, so they
  are read whole, with a warning (longer than any source in training; the output is at most
  max_len tokens, the decoder's buffer); a model with a learned position table has no rows past
  max_len, so they are cut to `max_len - 1` pieces, with a warning (also when `truncate` is
  true). translate.py and evaluate.py decode the same sentence the same way.

  `ensemble`: more checkpoints (each a path as `checkpoint` takes) decoded together with this
  one (`search.Ensemble`: the mean of the models' probabilities); each must be the workdir's
  model (`_check_member_model`, the parameter shapes) with its tokenizer, and none twice.
  """

  def __init__(self, workdir: str, *, step: int | None = None, checkpoint: str | None = None,
               averaged: bool = False, beam_size: int | None = None, alpha: float | None = None,
               max_len_margin: int | None = None, batch_size: int = 64,
               truncate: bool | None = None, ensemble: Sequence[str] = ()):
    self.workdir = workdir
    workdir_config(workdir)  # a clear error first when this is not a run's workdir
    self.checkpoint_dir, self.step = checkpointing.resolve_checkpoint(workdir, checkpoint, step,
                                                                      averaged)
    # The config this step was written with (a resume may have changed e.g. the search).
    own = self.checkpoint_dir in (checkpointing.checkpoint_dir(workdir),
                                  os.path.join(os.path.abspath(workdir), AVERAGED))
    written_at = self.step if own else None
    self.run = load_run_config(workdir, written_at)
    self.config = model_config_from(self.run, run_config_path(workdir, written_at))
    spm_path = vocabulary_path(workdir, self.run)
    problem = tokenizer_problem(self.run, spm_path, run_config_path(workdir, written_at))
    if problem:  # replaced or missing since the run recorded it
      raise RunError(problem)
    if not os.path.exists(spm_path):
      raise RunError(f"{spm_path} not found: the run's SentencePiece model is missing; "
                     + train_hint(workdir))
    _check_tokenizer(workdir, self.checkpoint_dir, spm_path)
    self.tokenizer = Tokenizer(spm_path)
    if self.tokenizer.vocab_size != self.config.vocab_size:
      raise RunError(f"{spm_path} has {self.tokenizer.vocab_size} pieces but the model was "
                     f"trained with vocab_size={self.config.vocab_size}: wrong spm.model")
    self._written_at = written_at
    self._set_search(beam_size, alpha, max_len_margin, batch_size)
    _, params = checkpointing.load_params(self.checkpoint_dir, self.step)
    # The run's own parameters (checkpoints/, averaged/, best_<metric>/) that no longer fit:
    # the code changed, not the run.
    inside = os.path.dirname(self.checkpoint_dir) == os.path.abspath(workdir)
    check_param_shapes(params, self.config, self.step_dir, workdir, own=inside)
    self.members = self._load_members(ensemble, spm_path)
    if self.members:
      params = Ensemble.of([params] + [m.pop("params") for m in self.members])
    self.params = jax.device_put(params)
    if self.checkpoint_dir == os.path.join(os.path.abspath(workdir), AVERAGED):
      self._warn_if_stale()
    self.sampling: Sampling | None = None
    self._truncate = bool(truncate)
    self.averaged_steps = averaging.averaged_steps(self.checkpoint_dir, self.step)
    self.stats = SearchStats()
    self._compiled: set = set()

  def _load_members(self, paths: Sequence[str], spm_path: str) -> list[dict]:
    """Each `--ensemble` path's checkpoint, checked: `{"checkpoint", "step", "averaged_steps",
    "params"}` (host numpy)."""
    members: list[dict] = []
    # By real path: a checkpoint reached through a link (or `..`) is the same model.
    seen = {(os.path.realpath(self.checkpoint_dir), self.step): "the translator's own checkpoint"}
    paths = list(paths)
    if not all(p.strip() for p in paths):  # else '' would name --workdir's own checkpoints
      raise RunError(f"--ensemble {','.join(paths)}: an empty path (a comma too many?): name "
                     "each member's checkpoint, comma-separated")
    for path in paths:
      flag = f"--ensemble {path}"
      try:
        directory, step = checkpointing.resolve_checkpoint(self.workdir, checkpoint=path)
        where = os.path.join(directory, str(step))
        key = (os.path.realpath(directory), step)
        if key in seen:
          raise RunError(f"{where} is already in the ensemble ({seen[key]}): a "
                         "model twice only weighs it double; name each checkpoint once")
        seen[key] = flag
        _check_tokenizer(self.workdir, directory, spm_path)
        _check_member_model(self.config, directory, step, flag, self.workdir)
        _, params = checkpointing.load_params(directory, step)
        check_param_shapes(params, self.config, where, self.workdir, own=False)
      except checkpointing.DamagedCheckpoint as e:  # its own way out: another step
        raise RunError(f"{flag}: {e}") from None
      except RunError as e:
        message = str(e)
        prefix = f"{flag}: "
        raise RunError(message if message.startswith(prefix) else (
            f"{prefix}{message} (in an ensemble, every member must be --workdir's model with "
            "its tokenizer: leave this one out, or ensemble runs of one config)")) from None
      members.append({"checkpoint": where, "step": step,
                      "averaged_steps": averaging.averaged_steps(directory, step),
                      "params": params})
    return members

  def _set_search(self, beam_size: int | None, alpha: float | None,
                  max_len_margin: int | None, batch_size: int) -> None:
    """The search settings, each defaulting to the run's config.json, checked."""
    self.beam_size = int(beam_size if beam_size is not None else self.run.get("beam_size", 1))
    self.alpha = float(alpha if alpha is not None else self.run.get("length_penalty_alpha", 0.6))
    self.max_len_margin = int(max_len_margin if max_len_margin is not None
                              else self.run.get("max_len_margin", 50))
    if self.beam_size < 1 or self.max_len_margin < 0 or batch_size < 1:
      raise RunError(f"beam_size={self.beam_size} and batch_size={batch_size} must be >= 1, "
                     f"max_len_margin={self.max_len_margin} >= 0")
    if alpha is not None and self.beam_size == 1:
      given = ("" if beam_size is not None else ", the run's config.beam_size in "
               f"{run_config_path(self.workdir, self._written_at)}")
      raise RunError(f"alpha={alpha} is ignored by greedy search (beam_size 1{given}), which "
                     "has no length penalty: pass a beam_size of 2 or more with it, or drop it")
    if not math.isfinite(self.alpha):
      raise RunError(f"alpha={self.alpha}: the length penalty must be a finite number (the "
                     "paper's is 0.6)")
    if self.beam_size > self.config.output_vocab_size:
      raise RunError(f"beam_size={self.beam_size} is wider than the vocabulary "
                     f"({self.config.output_vocab_size} pieces): at most "
                     f"{self.config.output_vocab_size}")
    self.batch_size = batch_size

  def with_search(self, beam_size: int | None, alpha: float | None) -> Translator:
    """This translator searching with another beam size and length penalty, checked as the
    constructor checks them: the same parameters and tokenizer (nothing read again), its own
    throughput figures and compiled shapes (another search compiles anew)."""
    other = copy.copy(self)
    other._set_search(beam_size, alpha, self.max_len_margin, self.batch_size)
    other.sampling = None  # a search, even from a sampling translator
    other.stats = SearchStats()
    other._compiled = set()
    return other

  def with_sampling(self, temperature: float = 1.0, top_k: int = 0, seed: int = 0,
                    line_offset: int = 0, top_p: float = 1.0) -> Translator:
    """This translator sampling instead of searching (`Sampling`), checked: a temperature
    above 0 (finite), a `top_k` from 0 (the whole vocabulary) to the vocabulary size, a
    `top_p` above 0 and at most 1, a `line_offset` from 0 to 2^31 - 1. The same parameters and
    tokenizer; its own throughput figures and compiled shapes."""
    # Used in float32: it and its inverse must be finite and nonzero there, or the logits
    # divided by it overflow or vanish (1e-30 to 1e30 is ample).
    if not (math.isfinite(temperature) and 1e-30 <= temperature <= 1e30):
      raise RunError(f"temperature={temperature}: must be a number above 0, from 1e-30 to 1e30 "
                     "(1 samples from the model's own distribution; lower is closer to greedy "
                     "search)")
    vocab = self.config.output_vocab_size
    if not 0 <= top_k <= vocab:
      raise RunError(f"top_k={top_k}: must be between 0 (the whole vocabulary) and the "
                     f"vocabulary size ({vocab})")
    if not 0.0 < top_p <= 1.0:  # also refuses NaN
      raise RunError(f"top_p={top_p}: must be above 0 and at most 1 (the probability the "
                     "nucleus of most probable tokens must reach; 1 = no nucleus)")
    if not 0 <= line_offset < 2**31:
      raise RunError(f"line_offset={line_offset}: must be between 0 and 2^31 - 1 (the number of "
                     "lines of the whole file before this input)")
    other = copy.copy(self)
    other.sampling = Sampling(temperature=float(temperature), top_k=int(top_k),
                              top_p=float(top_p), seed=int(seed), line_offset=int(line_offset))
    other.stats = SearchStats()
    other._compiled = set()
    return other

  def with_line_offset(self, line_offset: int) -> Translator:
    """This sampling translator drawing as if its input began `line_offset` lines into a file
    (`Sampling.line_offset`; translate.py's chunks). Its throughput figures and compiled shapes
    are this one's, shared: a chunk after another adds to them."""
    if not self.sampling:
      raise ValueError("with_line_offset: a search's translations do not depend on the line's "
                       "place; only a sampling translator has a line offset")
    if not 0 <= line_offset < 2**32:
      raise RunError(f"line_offset={line_offset}: the lines before this input must number "
                     "fewer than 2^32")
    other = copy.copy(self)  # shallow: stats and _compiled stay shared
    other.sampling = dataclasses.replace(self.sampling, line_offset=int(line_offset))
    return other

  def _warn_if_stale(self) -> None:
    """An average made before the run trained on: it decodes, but not what the run is now."""
    steps = checkpointing.checkpoint_steps(checkpointing.checkpoint_dir(self.workdir))
    if steps and steps[-1] > self.step:
      warn_stderr(f"{self.step_dir} averages checkpoints up to step {self.step}, but the run has "
                  f"reached step {steps[-1]}: re-run scripts/average_checkpoints.py --workdir "
                  f"{self.workdir} to average its latest checkpoints")

  @property
  def step_dir(self) -> str:
    """The directory of the checkpoint in use (read only: evaluations go to `<workdir>/eval`)."""
    return os.path.join(self.checkpoint_dir, str(self.step))

  @property
  def truncate(self) -> bool:
    """Whether sources over `max_len - 1` pieces are cut: asked for, or the model has a learned
    position table (max_len rows, none beyond)."""
    return self._truncate or self.config.position_encoding == "learned"

  @property
  def max_source_pieces(self) -> int:
    return self.config.max_len - 1  # eos is appended

  def settings(self) -> dict:
    """The checkpoint and the search, as evaluate.py records them (`alpha` is None for greedy
    search, which has no length penalty; `averaged_steps` None unless averaged; `ensemble`,
    only for an ensemble, its other members' `checkpoint`, `step` and `averaged_steps`)."""
    settings = {"step": self.step, "checkpoint": self.step_dir,
                "averaged_steps": self.averaged_steps, "beam_size": self.beam_size,
                "alpha": self.alpha if self.beam_size > 1 else None,
                "max_len_margin": self.max_len_margin, "batch_size": self.batch_size}
    if self.sampling:  # no search: its beam and alpha are not what ran
      settings.update(beam_size=None, alpha=None, sampling=dataclasses.asdict(self.sampling))
    if self.members:  # decoded together with the checkpoint above
      settings["ensemble"] = [dict(m) for m in self.members]
    return settings

  # -- text <-> ids

  def encode(self, lines: Sequence[str], warn: Callable[[str], None] = warn_stderr,
             names: Sequence[str] | None = None, translated: bool = True) -> list[list[int]]:
    """Source ids with eos per line; [] for an empty (or blank) line. A source longer than
    `max_len - 1` pieces gets a warning naming the line (`names[i]`), and is cut to that length
    when truncating (`self.truncate`). `translated`: whether the lines are to be translated
    (not scored against a target given), which the warning then says stops at max_len."""
    # Normalised here as the tokenizer will, so that a blank line is seen as empty.
    lines = [normalize_spaces(line) for line in lines]
    ids = self.tokenizer.encode_batch(lines) if lines else []
    out = []
    for i, (line, pieces) in enumerate(zip(lines, ids)):
      if not line or not pieces:
        out.append([])
        continue
      note = f", but its translation stops at {self.config.max_len} tokens" if translated else ""
      pieces = self.fit(pieces, names[i] if names else f"line {i + 1}", warn, whole_note=note)
      out.append(pieces + [self.tokenizer.eos_id])
    return out

  def fit(self, pieces: Sequence[int], name: str, warn: Callable[[str], None] = warn_stderr,
          cut_note: str = "", whole_note: str = "") -> list[int]:
    """`pieces` (a sentence's, before its eos) as the model reads them: longer than
    `max_len - 1`, a warning naming them (`name`, then `cut_note` or `whole_note`), and cut to
    that length when truncating (`self.truncate`: a learned position table ends there), read
    whole otherwise (sinusoidal positions extend past max_len)."""
    limit, pieces = self.max_source_pieces, list(pieces)
    if len(pieces) <= limit:
      return pieces
    if self.truncate:
      warn(f"{name}: {len(pieces)} pieces, more than the model's maximum of {limit} (max_len "
           f"{self.config.max_len} - 1 for eos; its learned position table ends there): "
           f"truncated to {limit} pieces{cut_note}")
      return pieces[:limit]
    warn(f"{name}: {len(pieces)} pieces, more than the {limit} (max_len {self.config.max_len} - "
         "1 for eos) the model was built for: read whole, as sinusoidal positions extend past "
         f"max_len{whole_note}")
    return pieces

  def detokenize(self, ids: Sequence[int]) -> str:
    return self.tokenizer.detokenize(ids)

  # -- search

  def bucket_shape(self, rows: int, length: int) -> tuple[int, int]:
    """(rows, length) a batch is padded to: rows a power of two up to batch_size, length a
    multiple of LENGTH_BUCKET (capped at max_len when the longest source fits in it)."""
    padded_rows = min(self.batch_size, 1 << max(0, rows - 1).bit_length())
    padded_len = _round_up(max(length, 1), LENGTH_BUCKET)
    if length <= self.config.max_len:
      padded_len = min(padded_len, self.config.max_len)
    return padded_rows, padded_len

  def _search(self, inputs: np.ndarray, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if self.sampling:
      tokens, lengths, _ = self._sample(inputs, index, 1)
      return tokens, lengths
    return search_batch(self.config, self.params, inputs, beam_size=self.beam_size,
                        alpha=self.alpha, max_len_margin=self.max_len_margin)

  def _sample(self, inputs: np.ndarray, index: np.ndarray, draws: int
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`sample_search` on `inputs`, row r being draw `index[r] % draws` of line
    `line_offset + index[r] // draws` (`Sampling`'s keys)."""
    s = self.sampling
    # uint32, what fold_in hashes: line numbers past 2^31 stay distinct (and any int32 line
    # gives the key it gave before the offset existed).
    lines = jnp.asarray((index // draws).astype(np.int64) + s.line_offset, jnp.uint32)
    draw = jnp.asarray(index % draws)
    keys = jax.vmap(jax.random.fold_in)(
        jax.vmap(jax.random.fold_in, in_axes=(None, 0))(jax.random.key(s.seed), lines), draw)
    tokens, lengths, log_probs = in_parts(
        lambda inputs, keys: sample_search(
            self.config, self.params, inputs, keys, temperature=s.temperature, top_k=s.top_k,
            top_p=s.top_p, max_len_margin=self.max_len_margin), inputs, keys)
    return tokens.astype(np.int32), lengths.astype(np.int32), log_probs.astype(np.float32)

  def _in_batches(self, sources: Sequence[Sequence[int]], search: Callable, results: list,
                  kind: str) -> None:
    """Run `search(inputs, index)` -> a tuple of numpy arrays `[rows, ...]` (tokens, lengths,
    ...) on the non-empty `sources` (ids with eos) in bucketed batches, longest first,
    `index[r]` the place in `sources` of row r (0 for filler rows), and hand each searched
    source's rows to `results[i] = (tokens[r], lengths[r], ...)`. `kind` names the program
    (`search` and `all`, n-best's, differ): each is compiled per shape apart."""
    order = sorted((i for i, s in enumerate(sources) if len(s)), key=lambda i: -len(sources[i]))
    for start in range(0, len(order), self.batch_size):
      chunk = order[start:start + self.batch_size]
      rows, length = self.bucket_shape(len(chunk), max(len(sources[i]) for i in chunk))
      inputs = np.full((rows, length), self.config.pad_id, np.int32)
      index = np.zeros((rows,), np.int32)
      for r, i in enumerate(chunk):
        inputs[r, :len(sources[i])] = sources[i]
        index[r] = i
      if (kind, rows, length) not in self._compiled:
        # An all-padding batch of the same shape compiles the search; its loop ends at once.
        begin = time.perf_counter()
        search(np.zeros_like(inputs), index)
        self.stats.compile_seconds += time.perf_counter() - begin
        self.stats.shapes += 1
        self._compiled.add((kind, rows, length))
      begin = time.perf_counter()
      outputs = search(inputs, index)
      self.stats.search_seconds += time.perf_counter() - begin
      self.stats.batches += 1
      self.stats.sentences += len(chunk)
      for r, i in enumerate(chunk):
        results[i] = tuple(x[r] for x in outputs)

  def translate_ids(self, sources: Sequence[Sequence[int]]) -> list[list[int]]:
    """Output ids (no eos) per source (ids with eos); [] for an empty source, not searched."""
    found: list = [None] * len(sources)
    self._in_batches(sources, self._search, found, "sample" if self.sampling else "search")
    results: list[list[int]] = []
    for row in found:
      if row is None:
        results.append([])
        continue
      self.stats.output_tokens += int(row[1])
      results.append(output_ids(row[0][None], row[1][None], self.config.eos_id)[0])
    return results

  def check_nbest(self, n: int) -> None:
    """A RunError unless 1 <= n <= the beam size (the search finishes at most that many);
    sampling draws any n >= 1."""
    if n < 1:
      raise RunError(f"nbest={n}: must be 1 or more")
    if self.sampling:
      return
    if n > self.beam_size:
      raise RunError(f"nbest={n}: must be between 1 and the beam size ({self.beam_size}): "
                     f"pass --beam_size {n} or more for {n} translations a line")

  def nbest_ids(self, sources: Sequence[Sequence[int]], n: int) -> list[list[Hypothesis]]:
    """The `n` best finished hypotheses per source (ids with eos), best first (`Hypothesis`;
    a sampling translator: `n` samples, `_samples`):
    the score is the length-penalised one the search ranks by, the log-probability that score
    times the penalty of the hypothesis's length (EOS included). Fewer than `n` where the
    search stopped with fewer finished (its stopping rule (a), `search.beam_search`); an empty
    source gives one empty hypothesis scored 0, not searched. `n` is at most the beam size;
    greedy search (beam 1) gives its one output with its log-probability as both numbers."""
    self.check_nbest(n)
    if self.sampling:
      return self._samples(sources, n)
    found: list = [None] * len(sources)
    self._in_batches(sources, self._search_all, found, "all")
    results = []
    for row in found:
      if row is None:
        results.append([Hypothesis([], 0.0, 0.0, False)])
        continue
      tokens, scores = row
      hypotheses = []
      for seq, score in zip(tokens[:n], scores[:n]):
        if not np.isfinite(score):  # an empty slot of the finished set
          continue
        length = int(np.sum(seq != self.config.pad_id))
        # search.length_penalty's ((5 + |Y|) / 6) ** alpha, in Python: no device round trip.
        penalty = ((5 + length) / 6) ** self.alpha if self.beam_size > 1 else 1.0
        hypotheses.append(self._hypothesis(seq, length, float(score), float(score) * penalty))
      self.stats.output_tokens += int(np.sum(tokens[0] != self.config.pad_id))
      results.append(hypotheses)
    return results

  def _hypothesis(self, seq: np.ndarray, length: int, score: float, log_prob: float
                  ) -> Hypothesis:
    """The `Hypothesis` of one output row `seq` of `length` tokens (EOS included if it ended)."""
    ids = output_ids(seq[None], np.array([length]), self.config.eos_id)[0]
    eos = length > 0 and seq[length - 1] == self.config.eos_id
    return Hypothesis(ids, score, log_prob, bool(eos))

  def _samples(self, sources: Sequence[Sequence[int]], n: int) -> list[list[Hypothesis]]:
    """`n` samples per source, the most probable first (score = log-probability); an empty
    source gives one empty hypothesis scored 0. Sample 0 of a line is what `translate_ids`
    draws for it."""
    # Each source n times in a row: row k is draw k % n of source k // n (`_sample`).
    repeated = [s for s in sources for _ in range(n)]
    found: list = [None] * len(repeated)
    self._in_batches(repeated, lambda inputs, index: self._sample(inputs, index, n), found,
                     "sample")  # the program of `_search`'s sampling: n only changes keys
    results = []
    for i, source in enumerate(sources):
      if not len(source):
        results.append([Hypothesis([], 0.0, 0.0, False)])
        continue
      hypotheses = []
      for tokens, length, log_prob in found[i * n:i * n + n]:
        self.stats.output_tokens += int(length)
        hypotheses.append(self._hypothesis(tokens, int(length), float(log_prob),
                                           float(log_prob)))
      results.append(sorted(hypotheses, key=lambda h: -h.log_prob))
    return results

  def _search_all(self, inputs: np.ndarray, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`(tokens [rows, beam, T], scores [rows, beam])` numpy: every finished hypothesis (greedy
    search: its one output, with the log-probability its loop summed)."""
    def search(inputs):
      if self.beam_size == 1:
        tokens, _, scores = greedy_search(self.config, self.params, inputs,
                                          max_len_margin=self.max_len_margin, score=True)
        return tokens[:, None], scores[:, None]
      return beam_search(self.config, self.params, inputs, beam_size=self.beam_size,
                         alpha=self.alpha, max_len_margin=self.max_len_margin, return_all=True)

    tokens, scores = in_parts(search, inputs)
    return tokens.astype(np.int32), scores.astype(np.float32)

  def translate(self, lines: Sequence[str], warn: Callable[[str], None] = warn_stderr,
                names: Sequence[str] | None = None) -> list[str]:
    """One translation per line, in order; an empty line gives an empty translation."""
    outputs = self.translate_ids(self.encode(lines, warn, names))
    return [self.detokenize(ids) if ids else "" for ids in outputs]

  def translate_nbest(self, lines: Sequence[str], n: int,
                      warn: Callable[[str], None] = warn_stderr,
                      names: Sequence[str] | None = None) -> list[list[tuple[str, float, float]]]:
    """The `n` best translations per line, best first, as `(text, beam score, log-probability)`
    (`nbest_ids`); an empty line gives `[("", 0.0, 0.0)]`."""
    outputs = self.nbest_ids(self.encode(lines, warn, names), n)
    return [[(self.detokenize(h.ids) if h.ids else "", h.score, h.log_prob) for h in hypotheses]
            for hypotheses in outputs]


def throughput_line(stats: SearchStats) -> str:
  d = stats.as_dict()
  if not d["sentences_per_sec"]:
    return "nothing searched"
  return (f"{d['sentences_per_sec']:.1f} sentences/s, {d['target_tokens_per_sec']:.0f} target "
          f"tokens/s (search only: {d['search_seconds']:.2f} s for {stats.sentences} sentences in "
          f"{stats.batches} batches; {stats.shapes} shape(s) compiled in "
          f"{d['compile_seconds']:.1f} s, not counted)")
