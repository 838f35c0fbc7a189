"""Translate a whole split and score it: sacreBLEU and chrF on detokenized text, as JSON.

    python scripts/evaluate.py --workdir runs/default --split test
    python scripts/evaluate.py --workdir runs/default --split test --averaged --beam_size 4

Every pair of the split is decoded (nothing dropped or truncated for length: sinusoidal
positions extend past max_len; with a learned position table sources are cut to max_len - 1
pieces with a warning). The hypotheses go to `<checkpoint>/hypotheses.<split>.txt`, one line per
pair in the split's order, and the result, printed as one JSON object on stdout, also to
`<checkpoint>/eval.<split>.json`, where <checkpoint> is the step directory used (e.g.
runs/default/checkpoints/1000 or runs/default/averaged/1000).

BLEU is sacreBLEU's default (cased, 13a tokenizer, exp smoothing) against the raw references;
the signatures are in the output. `sentences_per_sec` and `target_tokens_per_sec` (output tokens,
EOS included) time the compiled search only: each batch shape is compiled first on an
all-padding batch whose search loop ends at once, and that time is `compile_seconds`.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from transformer_jax import translate as translate_lib  # noqa: E402


def evaluate(translator, data, split: str, output_dir: str | None = None) -> dict:
  """Decode every pair of `split`, write the hypotheses, return the scores and throughput."""
  from transformer_jax import bleu as bleu_lib

  pairs = data.raw_examples(split)
  if not pairs:
    raise translate_lib.RunError(f"the {split} split is empty")
  sources = [s for s, _ in pairs]
  references = [t for _, t in pairs]
  warnings: list[str] = []
  hypotheses = translator.translate(sources, warnings.append,
                                    names=[f"{split} pair {i + 1}" for i in range(len(pairs))])
  for w in warnings[:10]:
    translate_lib.warn_stderr(w)
  if len(warnings) > 10:
    translate_lib.warn_stderr(f"... and {len(warnings) - 10} more truncated sources")
  hypotheses = [" ".join(h.splitlines()) for h in hypotheses]  # one line per pair, always
  bleu, bleu_signature = bleu_lib.corpus_bleu(hypotheses, references)
  chrf, chrf_signature = bleu_lib.corpus_chrf(hypotheses, references)
  output_dir = output_dir or translator.step_dir
  os.makedirs(output_dir, exist_ok=True)
  hyp_path = os.path.join(output_dir, f"hypotheses.{split}.txt")
  with open(hyp_path, "w", encoding="utf-8") as f:
    f.writelines(h + "\n" for h in hypotheses)
  result = {"split": split, "sentences": len(pairs), "bleu": bleu, "chrf": chrf,
            "bleu_signature": bleu_signature, "chrf_signature": chrf_signature,
            **translator.settings(),
            "averaged_steps": translate_lib.averaged_steps(translator.checkpoint_dir,
                                                           translator.step),
            "truncated_sources": len(warnings), "hypotheses": hyp_path,
            **translator.stats.as_dict()}
  with open(os.path.join(output_dir, f"eval.{split}.json"), "w") as f:
    json.dump(result, f, indent=2)
  return result


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  translate_lib.add_checkpoint_flags(parser)
  parser.add_argument("--split", default="test", choices=("validation", "test"))
  parser.add_argument("--data_dir", default=None,
                      help="TFDS data dir (default: the run's config.data.data_dir)")
  parser.add_argument("--output_dir", default=None,
                      help="where the hypotheses go (default: the checkpoint's step directory)")
  args = parser.parse_args(argv)
  logging.getLogger("absl").setLevel(logging.ERROR)  # Orbax's read-only notices

  import ml_collections

  try:
    translator = translate_lib.translator_from_args(args, truncate=None)
    data_config = ml_collections.ConfigDict(translator.run["data"])
    if args.data_dir:
      data_config.data_dir = args.data_dir
    from transformer_jax.data import get_data  # tfds and grain: imported only when needed

    data = get_data(data_config, args.workdir)
    result = evaluate(translator, data, args.split, args.output_dir)
  except translate_lib.USER_ERRORS as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  print(f"evaluate: {args.split}: BLEU {result['bleu']:.2f}, chrF {result['chrf']:.2f} on "
        f"{result['sentences']} sentences; {translate_lib.throughput_line(translator.stats)}; "
        f"hypotheses in {result['hypotheses']}", file=sys.stderr)
  print(json.dumps(result), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
