"""Translate a whole split and score it: sacreBLEU and chrF on detokenized text, as JSON.

    python scripts/evaluate.py --workdir runs/default --split test
    python scripts/evaluate.py --workdir runs/default --split test --averaged --beam_size 4
    python scripts/evaluate.py --workdir runs/default --split test --baseline copy
    python scripts/evaluate.py --workdir runs/mine --source newstest2014.en \
        --reference newstest2014.de --beam_size 4          # a test set of your own

Every pair of the split is decoded (nothing dropped or truncated for length: sinusoidal
positions extend past max_len; with a learned position table sources are cut to max_len - 1
pieces with a warning). The hypotheses go to `<out>/hypotheses.<split>.<search>.txt`, one line
per pair in the split's order, and the result, printed as one JSON object on stdout, also to
`<out>/eval.<split>.<search>.json`, and `--examples` pairs drawn at random (seed 0) plus the one
with the lowest sentence chrF, as a Markdown table with the references, to
`<out>/examples.<split>.<search>.md`. <out> is `<workdir>/eval/step_<N>` (or
`averaged_last<k>_<N>` with --averaged, k checkpoints averaged; --output_dir to choose), never
the checkpoint's own directory, which training deletes when it rotates the step out; <search>
is `greedy` or e.g. `beam4.alpha0.6`, so evaluations with different searches sit side by side.
Every result is also appended as one line to `<workdir>/eval/results.jsonl`, the run's history
of evaluations.

`--baseline copy` needs no checkpoint: it scores each source copied as its translation, the
floor that names, numbers and other unchanged tokens give for free, into
`<workdir>/baselines/eval.<split>.copy.json` (and `eval/results.jsonl`). A flag the command
would ignore (`--split` with `--source`, `--beam_size` with `--baseline`, ...) is an error.
Empty source or reference lines are counted in the result (`empty_sources`,
`empty_references`) and warned about: sacreBLEU's chrF leaves out pairs with an empty reference.

BLEU is sacreBLEU's default (cased, 13a tokenizer, exp smoothing) against the raw references;
the signatures are in the output. `sentences_per_sec` and `target_tokens_per_sec` (output tokens,
EOS included) time the compiled search only: each batch shape is compiled first on an
all-padding batch whose search loop ends at once, and that time is `compile_seconds`.
"""
import json
import logging
import os
import re
import sys

from absl import flags
import ml_collections

from transformer_jax import cli
from transformer_jax.data import get_data, raw_split
from transformer_jax.inference import evaluation
from transformer_jax.inference import translator as translator_lib
from transformer_jax.inference.flags import (
  define_checkpoint_flags,
  refuse_ignored,
  translator_from_flags,
)
from transformer_jax.run.workdir import RunError

SPLITS = ("validation", "test")
# The flags of define_checkpoint_flags that choose a model and its search: --baseline has none.
MODEL_FLAGS = ("step", "checkpoint", "averaged", "beam_size", "alpha", "max_len_margin",
               "batch_size")


def define(values):
  define_checkpoint_flags(values)
  flags.DEFINE_enum("split", "test", list(SPLITS), "the split to score",
                    flag_values=values)
  flags.DEFINE_string("data_dir", None, "TFDS data dir (default: the run's config.data.data_dir)",
                      flag_values=values)
  flags.DEFINE_string("output_dir", None, "where the hypotheses go (default: <workdir>/eval/"
                      "step_<N> or averaged_last<k>_<N>; <workdir>/baselines for --baseline)",
                      flag_values=values)
  flags.DEFINE_enum("baseline", None, list(evaluation.BASELINES),
                    "score a baseline instead of the model: 'copy' = the source as translation",
                    flag_values=values)
  flags.DEFINE_string("source", None, "score a test set of your own instead of a split: its "
                      "source file, one sentence per line (with --reference)",
                      flag_values=values)
  flags.DEFINE_string("reference", None, "the reference translations of --source, "
                      "line-aligned with it", flag_values=values)
  flags.DEFINE_string("name", None, "the name of the --source test set in the output files "
                      "(default: the source file's name without its extension)",
                      flag_values=values)
  flags.DEFINE_integer("examples", 10, "pairs drawn at random (seed 0), plus the worst by "
                       "sentence chrF, written with their references to "
                       "examples.<split>.<search>.md; 0: none", lower_bound=0, flag_values=values)


def _data_config(values, run: dict):
  if "split" not in run["data"]:
    # Recorded since 2026-11-23 13:31; the held-out pairs depend on it, so it is not guessed.
    raise RunError(
        f"{os.path.join(values.workdir, 'config.json')} has no data.split (the run predates "
        "its recording): add \"split\": \"grouped\" to its \"data\" section for a run made "
        "after 2026-11-23 11:55 (near-duplicates grouped), else \"split\": \"source\"")
  data_config = ml_collections.ConfigDict(run["data"])
  if values.data_dir:
    data_config.data_dir = values.data_dir
  return data_config


def _check_flags(values) -> None:
  """Refuse a flag that the others make this command ignore: ignored, it would look applied."""
  if values.source or values.reference:
    if not (values.source and values.reference):
      raise RunError("--source and --reference go together: the test set's source file and its "
                     "reference translations, line-aligned")
    refuse_ignored(values, ["split", "data_dir"], "with --source/--reference (a test set of "
                   "your own is scored instead of a split)", "drop {flags}, or drop --source "
                   "and --reference to score the split")
  else:
    refuse_ignored(values, ["name"], "without --source/--reference (it names a test set of "
                   "your own)", "drop {flags}")
  if values.baseline:
    refuse_ignored(values, MODEL_FLAGS, f"with --baseline {values.baseline}, which uses no "
                   "model", "drop {flags}, or drop --baseline to evaluate the model")


def _test_files(values) -> tuple[str, list[tuple[str, str]]] | None:
  """(name, pairs) of --source/--reference, or None when scoring a split of the run's data."""
  if not values.source:
    return None
  name = values.name or os.path.splitext(os.path.basename(values.source))[0]
  # The name goes into file names beside the splits' own files.
  if name in SPLITS:
    raise RunError(f"the test set's name {name!r} is a split's: its files would replace the "
                   "split's evaluation: pass another with --name")
  if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
    raise RunError(f"the test set's name {name!r} must be letters, digits, '_', '.' or '-': "
                   "pass another with --name")
  return name, evaluation.file_pairs(values.source, values.reference)


def body(values, args):
  _check_flags(values)
  files = _test_files(values)
  # Where a test set of one's own came from: in the result, and naming its empty lines.
  extra = origin = None
  if files:
    extra = {"source_file": os.path.abspath(values.source),
             "reference_file": os.path.abspath(values.reference)}
    origin = (f"--source {values.source}", f"--reference {values.reference}")
  if values.baseline:
    run = translator_lib.workdir_config(values.workdir)
    name, pairs = files or (values.split, raw_split(_data_config(values, run), values.split))
    output_dir = values.output_dir or os.path.join(values.workdir, "baselines")
    result = evaluation.copy_baseline(pairs, name, output_dir, values.examples, values.workdir,
                                      extra=extra, origin=origin)
    print(f"evaluate: {name}: baseline {values.baseline}: BLEU {result['bleu']:.2f}, "
          f"chrF {result['chrf']:.2f} on {result['sentences']} sentences", file=sys.stderr)
  else:
    translator = translator_from_flags(values, truncate=None)
    if files:
      (name, pairs), data = files, None
    else:
      name, pairs = values.split, None
      data = get_data(_data_config(values, translator.run), values.workdir)
    result = evaluation.evaluate(translator, data, name, values.output_dir, values.examples,
                                 pairs=pairs, extra=extra, origin=origin)
    print(f"evaluate: {name}: BLEU {result['bleu']:.2f}, chrF {result['chrf']:.2f} on "
          f"{result['sentences']} sentences; {translator_lib.throughput_line(translator.stats)}; "
          f"hypotheses in {result['hypotheses']}", file=sys.stderr)
  print(json.dumps(result), flush=True)
  return 0


def main(argv=None):
  return cli.run(body, argv, doc=__doc__, define=define, absl_level=logging.ERROR)


if __name__ == "__main__":
  sys.exit(main())
