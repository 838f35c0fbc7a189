r"""Score given translations with a trained run: log P(target | source) per pair, and perplexity.

    python scripts/score.py --workdir runs/default --split test       # the test split's references
    python scripts/score.py --workdir runs/default --source test.en \
        --target runs/default/eval/step_1000/hypotheses.test.beam4.alpha0.6.txt   # hypotheses
    python scripts/score.py --workdir runs/default --split validation --averaged

For reranking n-best lists, quality estimation, comparing checkpoints by held-out perplexity,
or checking what the model thinks of a reference its search missed. Each target is
teacher-forced with dropout off; `log_prob` is the natural-log probability of its SentencePiece
pieces and EOS, the log-softmax over the whole vocabulary (as beam search scores a hypothesis:
with alpha 0 a beam's score is this number). Sources are read as translate.py reads them.

Writes `<out>/scores.<name>.jsonl`, one JSON object per pair in order (`pair`, `log_prob`,
`target_tokens`, `nll_per_token`; a pair that cannot be scored has `log_prob` null and a
`skipped` reason: an empty source, or with a learned position table a target over max_len
tokens), and `<out>/score.<name>.json`, the result, also printed as one JSON object on stdout:
pairs scored, target tokens, summed `log_prob`, `nll_per_token` and `perplexity` (per target
token of this run's tokenizer: comparable between runs with the same spm.model only), the
checkpoint, and the time (`compile_seconds` apart). <out> is evaluate.py's
(`<workdir>/eval/step_<N>`, `averaged_last<k>_<N>`, ..., `.ensemble<M>_<digest>` after it with
`--ensemble`; `--output_dir` to choose); <name> is
the split, or the `--target` file's name without its extension (`--name` to choose).

Pairs of one's own are compared with the run's training pairs first, as evaluate.py compares a
test set (`train_overlap` in the result, `--nocheck_overlap` to skip reading them): a pair whose
source or target the run trained on, up to case and punctuation, is named by its line, as its
perplexity is no held-out one.
"""
import json
import logging
import os
import sys

import _host_memory  # noqa: F401 (before jax: restarts with huge pages, see the module)
from absl import flags

from transformer_jax import cli
from transformer_jax.data import raw_split
from transformer_jax.inference import evaluation, scoring
from transformer_jax.inference.flags import (
  check_pair_flags,
  define_check_overlap,
  define_checkpoint_flags,
  translator_from_flags,
)


def define(values):
  define_checkpoint_flags(values, search=False)
  flags.DEFINE_enum("split", "test", list(evaluation.SPLITS), "the split whose references to "
                    "score", flag_values=values)
  flags.DEFINE_string("data_dir", None, "TFDS data dir (default: the run's config.data.data_dir); "
                      "with --source, where --check_overlap reads the run's training pairs",
                      flag_values=values)
  flags.DEFINE_string("source", None, "score pairs of your own instead of a split: the source "
                      "file, one sentence per line (with --target)", flag_values=values)
  flags.DEFINE_string("target", None, "the targets to score (references or hypotheses), "
                      "line-aligned with --source", flag_values=values)
  flags.DEFINE_string("name", None, "the name of the --source/--target pairs in the output "
                      "files (default: the target file's name without its extension)",
                      flag_values=values)
  flags.DEFINE_string("output_dir", None, "where the files go (default: <workdir>/eval/step_<N> "
                      "or averaged_last<k>_<N>, + .ensemble<M>_<digest> with --ensemble)",
                      flag_values=values)
  define_check_overlap(values, "perplexity")


def body(values, args):
  check_pair_flags(values, "target", "the source file and the translations to score")
  name, named_by = values.name, "--name"
  if values.target and not name:
    name = os.path.splitext(os.path.basename(values.target))[0]
    named_by = "from --target's file name"
  own = evaluation.own_test_set(values.source, values.target, name, target_flag="target",
                                named_by=named_by)
  name, pairs, extra, origin = own or (values.split, None, {}, None)
  translator = translator_from_flags(values)
  if own and values.check_overlap:  # after the checkpoint flags: minutes for WMT's pairs
    extra.update(evaluation.check_training_overlap(
        translator.run, values.workdir, pairs, origin, values.data_dir, measure="perplexity",
        target="target"))
  if pairs is None:
    pairs = raw_split(evaluation.data_config(translator.run, values.workdir, values.data_dir),
                      name)
  result = scoring.score(translator, pairs, name, values.output_dir, extra)
  if result["scored"]:
    figures = (f"perplexity {result['perplexity']:.3f} per target token (nll "
               f"{result['nll_per_token']:.4f}) over {result['scored']:,} of "
               f"{result['sentences']:,} pairs; {result['pairs_per_sec']:.1f} pairs/s "
               f"({result['compiled_shapes']} shape(s) compiled in "
               f"{result['compile_seconds']:.1f} s, not counted)")
  else:
    figures = f"none of the {result['sentences']:,} pairs could be scored"
  print(f"score: {name}: {figures}; per pair in {result['scores']}", file=sys.stderr)
  print(json.dumps(result), flush=True)
  return 0


def main(argv=None):
  return cli.run(body, argv, doc=__doc__, define=define, absl_level=logging.ERROR)


if __name__ == "__main__":
  sys.exit(main())
