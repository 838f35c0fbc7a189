"""The flags that choose a run's checkpoint and search, shared by translate.py, evaluate.py and
plot_attention.py; the files their other flags name, read and written with errors naming the
flag; and the refusal of flags that another flag makes them ignore (evaluate.py's in
`check_evaluate_flags`)."""
from __future__ import annotations

import os
from typing import Iterator, Sequence, TextIO

from absl import flags

from transformer_jax.data.lines import line_chunks
from transformer_jax.inference.translator import Translator, warn_stderr
from transformer_jax.run import checkpointing
from transformer_jax.run.workdir import RunError

# The flags of define_checkpoint_flags that choose a model and its search: --baseline has none.
MODEL_FLAGS = ("step", "checkpoint", "averaged", "ensemble", "beam_size", "alpha",
               "max_len_margin", "batch_size")


def _flag_os_error(flag: str, path: str, e: OSError) -> OSError:
  # The errno's own text names the path but not which flag held it.
  return OSError(f"--{flag} {path}: {e.strerror or e}")


def read_flag_lines(flag: str, path: str) -> list[str]:
  """`read_lines(path)`; a file that cannot be read is `--<flag> PATH: <why>`. Lines end at
  line feeds only: a carriage return left inside a line (old Mac line ends) gets a warning,
  since the lines it separates are read, and translated, as one."""
  return [line for chunk in flag_line_chunks(flag, path) for line in chunk]


def flag_line_chunks(flag: str, path: str, size: int | None = None) -> Iterator[list[str]]:
  """`read_flag_lines`, `size` lines at a time, read as they are asked for (`line_chunks`): a
  file that cannot be opened fails now; the carriage-return warning comes with the first chunk
  that has one (counting that chunk's, when more may follow)."""
  try:
    chunks = line_chunks(path, size)
  except OSError as e:
    raise _flag_os_error(flag, path, e) from None
  return _warned(flag, path, chunks, size)


def _warned(flag: str, path: str, chunks: Iterator[list[str]],
            size: int | None) -> Iterator[list[str]]:
  start, warned = 0, False
  try:
    while True:
      try:
        lines = next(chunks)
      except StopIteration:
        return
      except OSError as e:  # a read error after the open (an input on a failing disk)
        raise _flag_os_error(flag, path, e) from None
      with_cr = [i for i, line in enumerate(lines, start + 1) if "\r" in line]
      if with_cr and not warned:
        warned = True
        part = f" of lines {start + 1:,}-{start + len(lines):,}" if start or \
            len(lines) == size else ""
        warn_stderr(f"--{flag} {'stdin' if path == '-' else path}: {len(with_cr):,} line(s)"
                    f"{part} hold a carriage return not followed by a line feed (first: line "
                    f"{with_cr[0]}): lines end at line feeds only, so what it separates is read "
                    "as one line; if it ends lines (old Mac line ends), convert them, e.g. with "
                    "`tr '\\r' '\\n'`")
      start += len(lines)
      yield lines
  finally:
    chunks.close()  # the file, also when the reader stops early (an error downstream)


def open_flag_output(flag: str, path: str) -> TextIO:
  """`path` opened for writing (UTF-8); one that cannot be is `--<flag> PATH: <why>`."""
  try:
    return open(path, "w", encoding="utf-8")
  except OSError as e:
    raise _flag_os_error(flag, path, e) from None


def given(values: flags.FlagValues, names: Sequence[str]) -> list[str]:
  """Those of the flags `names` given on the command line (a default is not given)."""
  return [name for name in names if values[name].present]


def refuse_ignored(values: flags.FlagValues, names: Sequence[str], because: str,
                   what_to_do: str) -> None:
  """A RunError when a flag of `names` was given although `because` makes it ignored: a flag
  silently ignored looks applied. `{flags}` in `what_to_do` stands for the flags given.

  A boolean given as False (`--noaveraged`) passes: it asks for what the command does without
  the flag anyway. Any other flag given is refused, also at its default value: a typed value
  the command ignores still looks applied."""
  ignored = [name for name in given(values, names)
             if not (isinstance(values[name], flags.BooleanFlag) and not values[name].value)]
  if ignored:
    listed = " ".join(f"--{name}" for name in ignored)
    raise RunError(f"{listed} {'is' if len(ignored) == 1 else 'are'} ignored {because}: "
                   + what_to_do.format(flags=listed))


def define_checkpoint_flags(values: flags.FlagValues, grid: bool = False,
                            search: bool = True, ensemble: bool = True) -> None:
  """The flags that choose a checkpoint and the search; with `grid` (evaluate.py),
  `--beam_size` and `--alpha` take comma-separated lists, searched one combination after
  another (`search_grid`); without `search` (score.py, which searches nothing), only the
  checkpoint's and `--batch_size`; with `ensemble`, `--ensemble` (more checkpoints decoded
  with the first, `Translator`)."""
  def define(kind, name, default, help_text):
    getattr(flags, f"DEFINE_{kind}")(name, default, help_text, flag_values=values)

  define("string", "workdir", None, "the training run's directory")
  flags.mark_flag_as_required("workdir", flag_values=values)
  if grid:
    define("list", "step", None, "a step of <workdir>/checkpoints (default: the latest); "
           "several, comma-separated (2000,2500,3000), are each evaluated, one at a time")
  else:
    define("integer", "step", None, "a step of <workdir>/checkpoints (default: the latest)")
  define("string", "checkpoint", None, "load parameters from here instead: a workdir, "
         "checkpoints or averaged directory, or a checkpoints/<step> dir")
  define("bool", "averaged", False, "use <workdir>/averaged (scripts/average_checkpoints.py)")
  if ensemble:
    define("list", "ensemble", None, "more checkpoints, comma-separated, each as --checkpoint "
           "takes (a workdir: its latest step; <run>/averaged: its average), decoded together "
           "with the one above by the mean of the models' probabilities; runs of the same "
           "model config and tokenizer")
  if search and grid:
    define("list", "beam_size", None, "1 = greedy (default: the run's config.beam_size); several, "
           "comma-separated (1,4,8), are each evaluated")
    define("list", "alpha", None, "length penalty (default: the run's "
           "config.length_penalty_alpha); several, comma-separated (0.6,1.0), are each "
           "evaluated with every beam_size above 1")
  elif search:
    define("integer", "beam_size", None, "1 = greedy (default: the run's config.beam_size)")
    define("float", "alpha", None, "length penalty (default: the run's "
           "config.length_penalty_alpha)")
  if search:
    define("integer", "max_len_margin", None,
           "output limit = source length + margin (default: the run's)")
  define("integer", "batch_size", 64, "sentences per search batch" if search
         else "sentence pairs per batch")


def _numbers(values: flags.FlagValues, name: str, kind: type) -> list:
  """The comma-separated values of list flag `name` as `kind`, in order, each once; [None]
  when it was not given (the run's own setting)."""
  if values[name].value is None:
    return [None]
  out = []
  for text in values[name].value:
    try:
      number = kind(text)
    except ValueError:
      hint = " (a comma too many?)" if not text.strip() else ""
      raise RunError(f"--{name} {','.join(values[name].value)}: {text!r} is not "
                     f"{'an integer' if kind is int else 'a number'}{hint}") from None
    if number not in out:
      out.append(number)
  if not out:
    raise RunError(f"--{name} is empty: give one value or several, comma-separated")
  return out


def search_grid(values: flags.FlagValues) -> list[tuple[int | None, float | None]]:
  """(beam_size, alpha) for each search that evaluate.py's `--beam_size` and `--alpha` lists
  ask for, in the order given: every beam above 1 with every alpha, greedy search (beam 1)
  once and without an alpha, which it has no use for. None is the run's own setting. Only
  greedy beams with an alpha given keep it, so that the Translator refuses it as ignored."""
  beams, alphas = _numbers(values, "beam_size", int), _numbers(values, "alpha", float)
  if all(b == 1 for b in beams):
    return [(1, a) for a in alphas]
  return [(b, None) if b == 1 else (b, a) for b in beams for a in (alphas if b != 1 else [None])]


def translator_from_flags(values: flags.FlagValues,
                          search: tuple[int | None, float | None] | None = None,
                          step: int | None = None, **kwargs) -> Translator:
  """A Translator from the flags of `define_checkpoint_flags`; `search`: (beam_size, alpha)
  and `step` instead of the flags' (one of evaluate.py's lists, `search_grid`, `--step`)."""
  searches = "beam_size" in values  # not defined with search=False: the run's own settings
  beam_size, alpha = search or ((values.beam_size, values.alpha) if searches else (None, None))
  ensemble = values.ensemble if "ensemble" in values else None
  if ensemble is not None and not ensemble:
    raise RunError("--ensemble is empty: name the other members' checkpoints, comma-separated")
  step = step if step is not None else values.step
  return Translator(values.workdir, step=step, checkpoint=values.checkpoint,
                    averaged=values.averaged, beam_size=beam_size, alpha=alpha,
                    max_len_margin=values.max_len_margin if searches else None,
                    batch_size=values.batch_size, ensemble=ensemble or (), **kwargs)


def translators_from_flags(values: flags.FlagValues,
                           **kwargs) -> tuple[int, Iterator[Translator]]:
  """evaluate.py's: how many, and a Translator for each step of `--step` (in order) with each
  search of `search_grid` (one step's searches share its parameters). Every step and search is
  checked before any is searched (the first step's Translator is built now, the other steps'
  checkpoints looked up); the parameters are loaded one step at a time, as the iterator gets
  there, so a long list of steps holds one step's in memory."""
  steps = _numbers(values, "step", int)
  first, *rest = search_grid(values)
  translator = translator_from_flags(values, first, step=steps[0], **kwargs)
  searches = [translator] + [translator.with_search(b, a) for b, a in rest]
  members = {m["checkpoint"] for m in translator.members}
  for step in steps[1:]:  # a missing step, or one also a member, is an error before any search
    directory, found = checkpointing.resolve_checkpoint(values.workdir, values.checkpoint, step,
                                                        values.averaged)
    where = os.path.join(directory, str(found))
    if where in members:
      raise RunError(f"--step {step}: {where} is also in --ensemble: a model twice only weighs "
                     "it double; leave that step out of --step, or that member out of "
                     "--ensemble")

  def each() -> Iterator[Translator]:
    while searches:  # handed over, not kept: the next step's parameters replace these
      yield searches.pop(0)
    for step in steps[1:]:
      this = translator_from_flags(values, first, step=step, **kwargs)
      yield this
      yield from (this.with_search(b, a) for b, a in rest)
  count = len(steps) * len(searches)
  return count, each()


def check_pair_flags(values: flags.FlagValues, target_flag: str, files: str) -> None:
  """evaluate.py's and score.py's pairs of their own: `--source` and `--<target_flag>` (the
  `files`, as the error calls them) go together and replace `--split`; `--data_dir` stays as
  where `--check_overlap` reads the run's training pairs, and is refused with
  `--nocheck_overlap`; `--name` (it names them) and `--check_overlap` are refused without
  them."""
  target = values[target_flag].value
  if values.source or target:
    if not (values.source and target):
      raise RunError(f"--source and --{target_flag} go together: {files}, line-aligned")
    refuse_ignored(values, ["split"], f"with --source/--{target_flag} (a test set of your own "
                   "is scored instead of a split)", "drop {flags}, or drop --source and "
                   f"--{target_flag} to score the split")
    if not values.check_overlap:
      refuse_ignored(values, ["data_dir"], f"with --source/--{target_flag} and "
                     "--nocheck_overlap (it says where the run's training pairs are read for "
                     "the comparison, which --nocheck_overlap skips)", "drop {flags}, or drop "
                     "--nocheck_overlap to compare the pairs with the training pairs there")
  else:
    refuse_ignored(values, ["name", "check_overlap"], f"without --source/--{target_flag} "
                   "(--name names a test set of your own, --check_overlap compares it with the "
                   "run's training pairs: a split of the run's own is held out from them)",
                   "drop {flags}")


def define_check_overlap(values: flags.FlagValues, measure: str) -> None:
  """`--check_overlap`: compare a test set of one's own with the run's training pairs."""
  flags.DEFINE_boolean("check_overlap", True, "with --source: compare the pairs with the "
                       "run's training pairs (reads them all) and warn of those the run "
                       f"trained on, up to case and punctuation, whose {measure} measures what "
                       "the model remembers (train_overlap in the result)", flag_values=values)


def check_evaluate_flags(values: flags.FlagValues) -> None:
  """Refuse a flag of scripts/evaluate.py that the others make it ignore: ignored, it would
  look applied."""
  check_pair_flags(values, "reference", "the test set's source file and its reference "
                   "translations")
  if values.baseline:
    refuse_ignored(values, MODEL_FLAGS, f"with --baseline {values.baseline}, which uses no "
                   "model", "drop {flags}, or drop --baseline to evaluate the model")
  elif values.output_dir and len(_numbers(values, "step", int)) > 1:
    raise RunError(f"--output_dir with several --step values ({','.join(values.step)}): each "
                   "step's files would replace the one before's; leave --output_dir out (each "
                   "step's go to <workdir>/eval/step_<N>), or evaluate one step a command")
