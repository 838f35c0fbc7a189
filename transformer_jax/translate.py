"""Translating with a trained run: load a workdir, translate text in batches, average checkpoints.

    translator = Translator("runs/default")                  # latest step, the run's search
    translator = Translator("runs/default", step=500, beam_size=4, alpha=0.6)
    translator = Translator("runs/default", checkpoint="runs/default/averaged")
    translator.translate(["one hundred and two", ""])        # -> ["einhundertzwei", ""]

Everything a run needs is in its workdir: `config.json` (the model's `resolved_model` fields and
the search settings), `spm.model` and `checkpoints/<step>/`. Averaged parameters go into
`<workdir>/averaged/<step>/` with the same `{"state": {"params": ...}}` layout, so
`checkpointing.load_params` (and every tool here) loads them like any step; training never
resumes from that directory.

Batching: sentences are sorted by length and cut into batches of at most `batch_size` rows; a
batch is padded to a bucket shape, rows to a power of two and length to a multiple of 16 (capped
at `max_len`), so the jitted search compiles a bounded number of times (about
log2(batch_size) * max_len / 16 shapes at most). Results come back in the input order.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from typing import Callable, Iterable, Sequence

import jax
import numpy as np

from transformer_jax import checkpointing
from transformer_jax.config import TransformerConfig
from transformer_jax.data.lines import NotUTF8Error, read_lines
from transformer_jax.decode import decode_batch, output_ids

LENGTH_BUCKET = 16  # source lengths are padded to a multiple of this
AVERAGED_DIR = "averaged"
TRAIN_HINT = "train first with scripts/train.py --config configs/default.py --workdir {}"


class RunError(RuntimeError):
  """A workdir, step or checkpoint that cannot be used; the message says what to do."""


# What the command-line tools report as "error: ..." rather than a traceback.
USER_ERRORS = (RunError, checkpointing.CheckpointError, OSError, NotUTF8Error)


# ---------------------------------------------------------------- the run's files


def load_run_config(workdir: str) -> dict:
  """The experiment config a run wrote (`<workdir>/config.json`), as a dict."""
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    raise RunError(f"{path} not found: {workdir} is not the workdir of a training run; "
                   + TRAIN_HINT.format(workdir))
  with open(path) as f:
    run = json.load(f)
  if "resolved_model" not in run:
    raise RunError(f"{path} has no 'resolved_model': it was not written by "
                   "transformer_jax.train; retrain, or pass the workdir of a run")
  return run


def model_config_from(run: dict) -> TransformerConfig:
  """The run's `TransformerConfig` (unknown keys ignored, so older runs still load)."""
  fields = {f.name for f in dataclasses.fields(TransformerConfig)}
  return TransformerConfig(**{k: v for k, v in run["resolved_model"].items() if k in fields})


def resolve_checkpoint(workdir: str, checkpoint: str | None = None, step: int | None = None,
                       averaged: bool = False) -> tuple[str, int]:
  """(Orbax manager directory, step) that `load_params` will read, or a RunError saying why not.

  `checkpoint` may be a workdir, a checkpoints/averaged directory or one step's directory; by
  default the run's own `<workdir>/checkpoints`, or `<workdir>/averaged` with `averaged=True`.
  """
  if checkpoint and averaged:
    raise RunError("pass either --checkpoint or --averaged, not both")
  if averaged:
    checkpoint = os.path.join(workdir, AVERAGED_DIR)
    if not os.path.isdir(checkpoint):
      raise RunError(f"no averaged checkpoint in {checkpoint}: run scripts/average_checkpoints.py "
                     f"--workdir {workdir} --last N first")
  path, step_dir = checkpointing.manager_directory(checkpoint or workdir)
  if step_dir is not None:
    if step is not None and step != step_dir:
      raise RunError(f"--step {step} contradicts the step directory {path}/{step_dir}")
    return path, step_dir
  steps = checkpoint_steps(path)
  if not steps:
    where = path if checkpoint else os.path.join(os.path.abspath(workdir), "checkpoints")
    raise RunError(f"no checkpoint in {where}: " + (
        TRAIN_HINT.format(workdir) if not checkpoint else
        "pass a workdir, its checkpoints or averaged directory, or one checkpoints/<step> "
        "directory"))
  if step is None:
    return path, steps[-1]
  if step not in steps:
    raise RunError(f"step {step} is not in {path}: available steps {steps}")
  return path, step


def checkpoint_steps(directory: str) -> list[int]:
  """Finished steps of an Orbax manager directory (unfinished ones have a temporary name)."""
  if not os.path.isdir(directory):
    return []
  return sorted(int(n) for n in os.listdir(directory)
                if n.isdigit() and os.path.isdir(os.path.join(directory, n, "state")))


# ---------------------------------------------------------------- the translator


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


def warn_stderr(message: str) -> None:
  print(f"warning: {message}", file=sys.stderr, flush=True)


def _round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


class Translator:
  """A trained run's model, tokenizer, parameters and search settings, ready to translate.

  Search settings default to the run's config.json (`beam_size`, `length_penalty_alpha`,
  `max_len_margin`); pass them to override. Sources longer than `max_len - 1` pieces are cut
  with a warning when `truncate` is true (translate.py) or the model has a learned position
  table (it has no rows past max_len). Sinusoidal positions extend past max_len, so evaluation
  (`truncate=None`) never cuts a source; the output is at most max_len tokens either way (the
  decoder's buffer).
  """

  def __init__(self, workdir: str, *, step: int | None = None, checkpoint: str | None = None,
               averaged: bool = False, beam_size: int | None = None, alpha: float | None = None,
               max_len_margin: int | None = None, batch_size: int = 64,
               truncate: bool | None = True):
    from transformer_jax.data.tokenizer import Tokenizer  # sentencepiece only, no tfds/grain

    self.workdir = workdir
    self.run = load_run_config(workdir)
    self.config = model_config_from(self.run)
    spm_path = self.run.get("data", {}).get("vocab_path") or os.path.join(workdir, "spm.model")
    if not os.path.exists(spm_path):
      raise RunError(f"{spm_path} not found: the run's SentencePiece model is missing; "
                     + TRAIN_HINT.format(workdir))
    self.tokenizer = Tokenizer(spm_path)
    if self.tokenizer.vocab_size != self.config.vocab_size:
      raise RunError(f"{spm_path} has {self.tokenizer.vocab_size} pieces but the model was "
                     f"trained with vocab_size={self.config.vocab_size}: wrong spm.model")
    self.beam_size = int(beam_size if beam_size is not None else self.run.get("beam_size", 1))
    self.alpha = float(alpha if alpha is not None else self.run.get("length_penalty_alpha", 0.6))
    self.max_len_margin = int(max_len_margin if max_len_margin is not None
                              else self.run.get("max_len_margin", 50))
    if self.beam_size < 1 or self.max_len_margin < 0 or batch_size < 1:
      raise RunError(f"beam_size={self.beam_size} and batch_size={batch_size} must be >= 1, "
                     f"max_len_margin={self.max_len_margin} >= 0")
    self.batch_size = batch_size
    self.checkpoint_dir, self.step = resolve_checkpoint(workdir, checkpoint, step, averaged)
    _, params = checkpointing.load_params(self.checkpoint_dir, self.step)
    self.params = jax.device_put(params)
    # A learned position table has max_len rows: sources beyond it must be cut.
    self.truncate = bool(truncate) or self.config.position_encoding == "learned"
    self.stats = SearchStats()
    self._compiled: set = set()

  @property
  def step_dir(self) -> str:
    """The directory of the checkpoint in use (outputs about it are written there)."""
    return os.path.join(self.checkpoint_dir, str(self.step))

  @property
  def max_source_pieces(self) -> int:
    return self.config.max_len - 1  # eos is appended

  def settings(self) -> dict:
    return {"step": self.step, "checkpoint": self.step_dir, "beam_size": self.beam_size,
            "alpha": self.alpha, "max_len_margin": self.max_len_margin}

  # -- text <-> ids

  def encode(self, lines: Sequence[str], warn: Callable[[str], None] = warn_stderr,
             names: Sequence[str] | None = None) -> list[list[int]]:
    """Source ids with eos per line; [] for an empty (or blank) line. Over-long sources are cut
    to `max_len - 1` pieces (when truncating) with a warning naming the line."""
    lines = [" ".join(line.split()) for line in lines]  # SentencePiece saw single spaces only
    ids = self.tokenizer.encode_batch(lines) if lines else []
    out = []
    for i, (line, pieces) in enumerate(zip(lines, ids)):
      if not line or not pieces:
        out.append([])
        continue
      if self.truncate and len(pieces) > self.max_source_pieces:
        name = names[i] if names else f"line {i + 1}"
        warn(f"{name}: {len(pieces)} pieces, more than the model's maximum of "
             f"{self.max_source_pieces} (max_len {self.config.max_len} - 1 for eos): "
             f"truncated to {self.max_source_pieces} pieces")
        pieces = pieces[:self.max_source_pieces]
      out.append(list(pieces) + [self.tokenizer.eos_id])
    return out

  def decode(self, ids: Sequence[int]) -> str:
    return self.tokenizer.decode(ids)

  # -- search

  def bucket_shape(self, rows: int, length: int) -> tuple[int, int]:
    """(rows, length) a batch is padded to: rows a power of two up to batch_size, length a
    multiple of LENGTH_BUCKET (capped at max_len when the longest source fits in it)."""
    padded_rows = min(self.batch_size, 1 << max(0, rows - 1).bit_length())
    padded_len = _round_up(max(length, 1), LENGTH_BUCKET)
    if length <= self.config.max_len:
      padded_len = min(padded_len, self.config.max_len)
    return padded_rows, padded_len

  def _search(self, inputs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return decode_batch(self.config, self.params, inputs, beam_size=self.beam_size,
                        alpha=self.alpha, max_len_margin=self.max_len_margin)

  def translate_ids(self, sources: Sequence[Sequence[int]]) -> list[list[int]]:
    """Output ids (no eos) per source (ids with eos); [] for an empty source, not searched."""
    results: list[list[int]] = [[] for _ in sources]
    order = sorted((i for i, s in enumerate(sources) if len(s)), key=lambda i: -len(sources[i]))
    for start in range(0, len(order), self.batch_size):
      chunk = order[start:start + self.batch_size]
      rows, length = self.bucket_shape(len(chunk), max(len(sources[i]) for i in chunk))
      inputs = np.full((rows, length), self.config.pad_id, np.int32)
      for r, i in enumerate(chunk):
        inputs[r, :len(sources[i])] = sources[i]
      if (rows, length) not in self._compiled:
        # An all-padding batch of the same shape compiles the search; its loop ends at once.
        begin = time.perf_counter()
        self._search(np.zeros_like(inputs))
        self.stats.compile_seconds += time.perf_counter() - begin
        self.stats.shapes += 1
        self._compiled.add((rows, length))
      begin = time.perf_counter()
      tokens, lengths = self._search(inputs)
      self.stats.search_seconds += time.perf_counter() - begin
      self.stats.batches += 1
      self.stats.sentences += len(chunk)
      self.stats.output_tokens += int(lengths[:len(chunk)].sum())
      for i, ids in zip(chunk, output_ids(tokens[:len(chunk)], lengths[:len(chunk)],
                                          self.config.eos_id)):
        results[i] = ids
    return results

  def translate(self, lines: Sequence[str], warn: Callable[[str], None] = warn_stderr,
                names: Sequence[str] | None = None) -> list[str]:
    """One translation per line, in order; an empty line gives an empty translation."""
    outputs = self.translate_ids(self.encode(lines, warn, names))
    return [self.decode(ids) if ids else "" for ids in outputs]


def add_checkpoint_flags(parser) -> None:
  """The flags of scripts/translate.py, evaluate.py and plot_attention.py (an argparse parser)."""
  parser.add_argument("--workdir", required=True, help="the training run's directory")
  parser.add_argument("--step", type=int, default=None, help="a step of <workdir>/checkpoints "
                      "(default: the latest)")
  parser.add_argument("--checkpoint", default=None, help="load parameters from here instead: a "
                      "workdir, checkpoints or averaged directory, or a checkpoints/<step> dir")
  parser.add_argument("--averaged", action="store_true",
                      help="use <workdir>/averaged (scripts/average_checkpoints.py)")
  parser.add_argument("--beam_size", type=int, default=None,
                      help="1 = greedy (default: the run's config.beam_size)")
  parser.add_argument("--alpha", type=float, default=None,
                      help="length penalty (default: the run's config.length_penalty_alpha)")
  parser.add_argument("--max_len_margin", type=int, default=None,
                      help="output limit = source length + margin (default: the run's)")
  parser.add_argument("--batch_size", type=int, default=64, help="sentences per search batch")


def translator_from_args(args, **kwargs) -> Translator:
  """A Translator from the flags of `add_checkpoint_flags`."""
  return Translator(args.workdir, step=args.step, checkpoint=args.checkpoint,
                    averaged=args.averaged, beam_size=args.beam_size, alpha=args.alpha,
                    max_len_margin=args.max_len_margin, batch_size=args.batch_size, **kwargs)


# ---------------------------------------------------------------- attention maps


ATTENTION_KINDS = {"encoder_self": ("encoder", "self_attention"),
                   "decoder_self": ("decoder", "self_attention"),
                   "cross": ("decoder", "cross_attention")}


def attention_maps(translator: Translator, source: str, target: str | None = None) -> dict:
  """Attention weights of one sentence pair, teacher-forced.

  The target is `target` or the translator's own translation of `source`. Returns
  `{"target_text", "source_pieces", "target_pieces", "decoder_input_pieces", "encoder_self",
  "decoder_self", "cross"}`, each of the last three a list over layers of float32
  `[heads, queries, keys]`.
  Decoder queries are labelled with the piece they predict, decoder self-attention keys with
  the decoder's input pieces (`<s>` then the target shifted right).
  """
  from transformer_jax.model import Transformer

  warnings: list[str] = []
  (src,) = translator.encode([source], warnings.append)
  for w in warnings:
    warn_stderr(w)
  if not src:
    raise ValueError("the source sentence is empty: nothing to attend to")
  if target is None:
    (out,) = translator.translate_ids([src])
  else:
    out = translator.tokenizer.encode(" ".join(target.split()))
  # The decoder reads at most max_len positions; the cut keeps eos for the plot's last row.
  tgt = list(out)[:translator.config.max_len - 1] + [translator.config.eos_id]
  model = Transformer(translator.config.replace(deterministic=True, decode=False))
  _, variables = _teacher_forced(model, translator.params, np.asarray([src], np.int32),
                                 np.asarray([tgt], np.int32))
  found: dict[str, dict[int, np.ndarray]] = {k: {} for k in ATTENTION_KINDS}
  for path, leaf in jax.tree_util.tree_flatten_with_path(variables["intermediates"])[0]:
    names = [getattr(p, "key", None) for p in path]
    for kind, (stack, module) in ATTENTION_KINDS.items():
      if names[0] == stack and module in names and "attention_weights" in names:
        layer = next(int(n[len("layer_"):]) for n in names if n and n.startswith("layer_"))
        found[kind][layer] = np.asarray(leaf[0], np.float32)  # batch of one
  pieces = translator.tokenizer.pieces
  maps = {"target_text": translator.decode(tgt), "source_pieces": pieces(src),
          "target_pieces": pieces(tgt),
          "decoder_input_pieces": pieces([translator.config.bos_id] + tgt[:-1])}
  for kind, layers in found.items():
    if not layers:
      raise RunError(f"no {kind} attention weights were sown: the model's attention_impl="
                         f"{translator.config.attention_impl!r} must be 'xla' to expose them")
    maps[kind] = [layers[i] for i in sorted(layers)]
  return maps


def _teacher_forced(model, params, inputs, targets):
  return jax.jit(lambda p, i, t: model.apply({"params": p}, i, t, mutable=["intermediates"]))(
      params, inputs, targets)


# ---------------------------------------------------------------- checkpoint averaging


def average_params(trees: Iterable[tuple[str, object]]) -> object:
  """Elementwise mean of `(name, parameter tree)` pairs, in float32, cast back per leaf.

  Trees are consumed one at a time into a running float32 sum, so averaging the paper's 20
  checkpoints of transformer-big holds the sum and one checkpoint, not 20. Trees of another
  structure or shape are refused, naming both trees and the parameter.
  """
  treedef, count = None, 0
  for name, tree in trees:
    leaves, structure = jax.tree.flatten(tree)
    if treedef is None:
      treedef, first_name = structure, name
      paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(tree)]
      shapes = [np.shape(x) for x in leaves]
      dtypes = [np.asarray(x).dtype for x in leaves]
      total = [np.array(x, np.float32) for x in leaves]  # a copy, even of float32 leaves
    else:
      if structure != treedef:
        raise RunError(f"{name} and {first_name} have different parameter structures: they "
                       "are not checkpoints of one model")
      for path, shape, x in zip(paths, shapes, leaves):
        if np.shape(x) != shape:
          raise RunError(f"parameter {path} has shape {np.shape(x)} in {name} but {shape} in "
                         f"{first_name}: they are not checkpoints of one model")
      for t, x in zip(total, leaves):
        np.add(t, np.asarray(x, np.float32), out=t)
    count += 1
    del tree, leaves  # before the next one is loaded
  if treedef is None:
    raise ValueError("nothing to average")
  return jax.tree.unflatten(treedef, [(t / count).astype(d) for t, d in zip(total, dtypes)])


def average_checkpoints(workdir: str, last: int, output: str | None = None,
                        log: Callable[[str], None] = lambda m: None) -> tuple[str, int, list[int]]:
  """Average the parameters of the last `last` steps in `<workdir>/checkpoints` (the paper: 5
  for base, 20 for big) into `output` (default `<workdir>/averaged`), saved as step = the last
  averaged step. Returns (output directory, step, averaged steps)."""
  import orbax.checkpoint as ocp

  source = checkpointing.checkpoint_dir(workdir)
  steps = checkpoint_steps(source)
  if not steps:
    raise RunError(f"no checkpoint in {source}: " + TRAIN_HINT.format(workdir))
  if last < 1:
    raise RunError(f"--last {last}: must be >= 1")
  if last > len(steps):
    raise RunError(f"--last {last}, but {source} holds only {len(steps)} checkpoint(s) "
                   f"(steps {steps}): pass --last {len(steps)} or fewer, or keep more while "
                   f"training (--config.keep_checkpoints={last}, with checkpoint_every_steps "
                   "setting their spacing)")
  chosen = steps[-last:]
  output = os.path.abspath(output or os.path.join(workdir, AVERAGED_DIR))
  if output == os.path.abspath(source):
    raise RunError(f"refusing to write the average into {source}: training resumes from there")
  def trees():
    for s in chosen:
      log(f"loading step {s}")
      yield f"step {s}", checkpointing.load_params(source, s)[1]

  params = average_params(trees())
  step = chosen[-1]
  meta = {"averaged_steps": chosen, "source": source, "last": last}
  options = ocp.CheckpointManagerOptions(create=True, enable_async_checkpointing=False)
  with ocp.CheckpointManager(output, options=options) as manager:
    if step in manager.all_steps():
      log(f"replacing the earlier average saved as step {step} in {output}")
      manager.delete(step)
    manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave({"params": params}),
                                               meta=ocp.args.JsonSave(meta)), force=True)
    manager.wait_until_finished()
  return output, step, chosen


def averaged_steps(checkpoint_dir: str, step: int) -> list[int] | None:
  """The steps an averaged checkpoint was made from (None for a training checkpoint)."""
  import orbax.checkpoint as ocp

  options = ocp.CheckpointManagerOptions(read_only=True)
  try:
    with ocp.CheckpointManager(checkpoint_dir, options=options) as manager:
      meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
  except Exception:  # noqa: BLE001 - no meta item, or not ours: not an average
    return None
  return list(meta["averaged_steps"]) if meta and "averaged_steps" in meta else None


def throughput_line(stats: SearchStats) -> str:
  d = stats.as_dict()
  if not d["sentences_per_sec"]:
    return "nothing searched"
  return (f"{d['sentences_per_sec']:.1f} sentences/s, {d['target_tokens_per_sec']:.0f} target "
          f"tokens/s (search only: {d['search_seconds']:.2f} s for {stats.sentences} sentences in "
          f"{stats.batches} batches; {stats.shapes} shape(s) compiled in "
          f"{d['compile_seconds']:.1f} s, not counted)")


__all__ = ["USER_ERRORS", "RunError", "SearchStats", "Translator", "add_checkpoint_flags",
           "attention_maps", "average_checkpoints", "average_params", "averaged_steps",
           "checkpoint_steps", "load_run_config", "model_config_from", "read_lines",
           "resolve_checkpoint", "throughput_line", "translator_from_args"]
