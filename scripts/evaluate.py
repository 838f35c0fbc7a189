r"""Translate a whole split and score it: sacreBLEU, chrF and the paper's tokenized BLEU, as JSON.

    python scripts/evaluate.py --workdir runs/default --split test
    python scripts/evaluate.py --workdir runs/default --split test --averaged --beam_size 4
    python scripts/evaluate.py --workdir runs/default --split test --baseline copy
    python scripts/evaluate.py --workdir runs/mine --source newstest2014.en \
        --reference newstest2014.de --beam_size 4          # a test set of your own
    python scripts/evaluate.py --workdir runs/default --split validation --averaged \
        --beam_size 1,4,8 --alpha 0.6,1.0                  # several searches, a table at the end

Every pair of the split is decoded (nothing dropped or truncated for length: sinusoidal
positions extend past max_len; with a learned position table sources are cut to max_len - 1
pieces with a warning). The hypotheses go to `<out>/hypotheses.<split>.<search>.txt`, one line
per pair in the split's order, the references they were scored against to
`<out>/references.<split>.txt` (so `sacrebleu <out>/references.test.txt -i HYP_A HYP_B
--paired-bs` compares two evaluations), and the result, printed as one JSON object on
stdout, also to `<out>/eval.<split>.<search>.json`, and `--examples` pairs drawn at random
(seed 0) plus the one with the lowest sentence chrF, as a Markdown table with the references, to
`<out>/examples.<split>.<search>.md`. <out> is `<workdir>/eval/step_<N>` (or
`averaged_last<k>_<N>` with --averaged, k checkpoints averaged; `.ensemble<M>_<digest>` after
it with --ensemble; --output_dir to choose), never
the checkpoint's own directory, which training deletes when it rotates the step out; <search>
is `greedy` or e.g. `beam4.alpha0.6`, so evaluations with different searches sit side by side.
Every result is also appended as one line to `<workdir>/eval/results.jsonl`, the run's history
of evaluations. Comma-separated `--beam_size` and `--alpha` values run one evaluation per search
(every beam above 1 with every alpha, greedy once), each as the command with that one search
would, printing one JSON line each and a table of them at the end. Comma-separated `--step`
values evaluate several checkpoints of the run the same way, one after another (each with every
search; one step's parameters in memory at a time; the compiled search is reused), each into
its own `eval/step_<N>`, and the closing table gives each one's step and its paired p-value
against the best: the curve of test BLEU over training, or the checkpoint to pick on the
validation split:

    python scripts/evaluate.py --workdir runs/mine --split validation --beam_size 4 \
        --step 2000,2500,3000,3500

`--baseline copy` needs no checkpoint: it scores each source copied as its translation, the
floor that names, numbers and other unchanged tokens give for free, into
`<workdir>/baselines/eval.<split>.copy.json` (and `eval/results.jsonl`). A flag the command
would ignore (`--split` with `--source`, `--beam_size` with `--baseline`, ...) is an error.
Empty source or reference lines are counted in the result (`empty_sources`,
`empty_references`) and warned about: sacreBLEU's chrF leaves out pairs with an empty reference.
A test set of your own is compared with the run's training pairs (`train_overlap` in the
result; `--nocheck_overlap` skips reading them): the pairs whose source or reference the run
trained on, up to case and punctuation, are warned about by their line numbers. The run's own
splits are held out by that measure already (docs/data.md).

BLEU is sacreBLEU's default (cased, 13a tokenizer, exp smoothing) against the raw references;
the signatures are in the output, and `bleu_ci95` is the half-width of its 95% bootstrap
interval (1,000 resamples of the sentences, sacreBLEU's fixed seed; null above 20,000
sentences). A grid's closing table adds each search's paired bootstrap p-value against the best
one (`sacrebleu --paired-bs`).
`tokenized_bleu` is the paper's kind of BLEU, for comparing with published tables: both sides
Moses-tokenized for the run's target language, hyphenated compounds split, multi-bleu.perl's
formula (docs/decoding.md). `sentences_per_sec` and
`target_tokens_per_sec` (output tokens, EOS included) time the compiled search only: each batch
shape is compiled first on an all-padding batch whose search loop ends at once, and that time is
`compile_seconds`.
"""
import json
import logging
import os
import sys

import _host_memory  # noqa: F401 (before jax: restarts with huge pages, see the module)
from absl import flags

from transformer_jax import cli
from transformer_jax.data import get_data, raw_split
from transformer_jax.inference import evaluation
from transformer_jax.inference import translator as translator_lib
from transformer_jax.inference.flags import (
  check_evaluate_flags,
  define_check_overlap,
  define_checkpoint_flags,
  translators_from_flags,
)


def define(values):
  define_checkpoint_flags(values, grid=True)
  flags.DEFINE_enum("split", "test", list(evaluation.SPLITS), "the split to score",
                    flag_values=values)
  flags.DEFINE_string("data_dir", None, "TFDS data dir (default: the run's config.data.data_dir); "
                      "with --source, where --check_overlap reads the run's training pairs",
                      flag_values=values)
  flags.DEFINE_string("output_dir", None, "where the hypotheses go (default: <workdir>/eval/"
                      "step_<N> or averaged_last<k>_<N>, + .ensemble<M>_<digest> with --ensemble; "
                      "<workdir>/baselines for --baseline)",
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
  define_check_overlap(values, "BLEU")
  flags.DEFINE_integer("examples", 10, "pairs drawn at random (seed 0), plus the worst by "
                       "sentence chrF, written with their references to "
                       "examples.<split>.<search>.md; 0: none", lower_bound=0, flag_values=values)


def body(values, args):
  check_evaluate_flags(values)
  own = evaluation.own_test_set(values.source, values.reference, values.name)
  name, pairs, extra, origin = own or (values.split, None, None, None)

  def check_overlap(run):  # after the checkpoint flags are checked: minutes for WMT's pairs
    if own and values.check_overlap:
      extra.update(evaluation.check_training_overlap(run, values.workdir, pairs, origin,
                                                     values.data_dir))

  if values.baseline:
    run = translator_lib.workdir_config(values.workdir)
    check_overlap(run)
    if pairs is None:
      pairs = raw_split(evaluation.data_config(run, values.workdir, values.data_dir), name)
    output_dir = values.output_dir or os.path.join(values.workdir, "baselines")
    result = evaluation.copy_baseline(pairs, name, output_dir, values.examples, values.workdir,
                                      extra=extra, origin=origin,
                                      lang=evaluation.target_lang(run))
    print(f"evaluate: {name}: baseline {values.baseline}: {evaluation.bleu_text(result)}, "
          f"chrF {result['chrf']:.2f} (tokenized BLEU {result['tokenized_bleu']:.2f}) on "
          f"{result['sentences']} sentences", file=sys.stderr)
  else:
    count, translators = translators_from_flags(values)
    check_overlap(translator_lib.workdir_config(values.workdir))
    data = None
    results = []
    for n, translator in enumerate(translators):
      if n == 0 and pairs is None:
        data = get_data(evaluation.data_config(translator.run, values.workdir, values.data_dir),
                        values.workdir)
      result = evaluation.evaluate(translator, data, name, values.output_dir,
                                   num_examples=values.examples, pairs=pairs, extra=extra,
                                   origin=origin, quiet=n > 0)
      at = f"step {translator.step}, " if values.step and len(values.step) > 1 else ""
      print(f"evaluate: {name}: {at}{evaluation.search_name(translator)}: "
            f"{evaluation.bleu_text(result)}, chrF {result['chrf']:.2f} (tokenized BLEU "
            f"{result['tokenized_bleu']:.2f}) on {result['sentences']} sentences; "
            f"{translator_lib.throughput_line(translator.stats)}; hypotheses in "
            f"{result['hypotheses']}", file=sys.stderr)
      if count > 1:  # one JSON line per search, as it ends
        print(json.dumps(result), flush=True)
      results.append(result)
    if len(results) > 1:
      references = [t for _, t in (pairs if pairs is not None else data.raw_examples(name))]
      p_values = evaluation.grid_p_values(results, references)
      print(evaluation.grid_table(name, results, p_values), file=sys.stderr)
      return 0
  print(json.dumps(result), flush=True)
  return 0


def main(argv=None):
  return cli.run(body, argv, doc=__doc__, define=define, absl_level=logging.ERROR)


if __name__ == "__main__":
  sys.exit(main())
