"""Translate a whole split and score it: sacreBLEU and chrF on detokenized text.

    result = evaluate(Translator("runs/default", beam_size=4), data, "test")
    floor = copy_baseline(data, "test")      # the source copied as the translation

BLEU is sacreBLEU's default (cased, 13a tokenizer, exp smoothing) against the raw references;
the signatures are in the result. The copy baseline scores what needs no model at all: names,
numbers, file names and other tokens that a translation keeps unchanged.
"""
from __future__ import annotations

import json
import os
from typing import Sequence

from transformer_jax import bleu as bleu_lib
from transformer_jax.inference.translator import Translator, warn_stderr
from transformer_jax.run import averaging
from transformer_jax.run.workdir import RunError

BASELINES = ("copy",)


def nonempty(pairs: list[tuple[str, str]], split: str) -> list[tuple[str, str]]:
  if not pairs:
    raise RunError(f"the {split} split is empty")
  return pairs


def scores(hypotheses: Sequence[str], references: Sequence[str]) -> dict:
  """sacreBLEU and chrF of detokenized hypotheses, with their signatures."""
  bleu, bleu_signature = bleu_lib.corpus_bleu(hypotheses, references)
  chrf, chrf_signature = bleu_lib.corpus_chrf(hypotheses, references)
  return {"bleu": bleu, "chrf": chrf, "bleu_signature": bleu_signature,
          "chrf_signature": chrf_signature}


def _write(output_dir: str, name: str, hypotheses: Sequence[str], result: dict) -> dict:
  """`hypotheses.<name>.txt` (one line per pair, in the split's order) and `eval.<name>.json`."""
  os.makedirs(output_dir, exist_ok=True)
  hyp_path = os.path.join(output_dir, f"hypotheses.{name}.txt")
  with open(hyp_path, "w", encoding="utf-8") as f:
    f.writelines(h + "\n" for h in hypotheses)
  result["hypotheses"] = hyp_path
  with open(os.path.join(output_dir, f"eval.{name}.json"), "w") as f:
    json.dump(result, f, indent=2)
  return result


def evaluate(translator: Translator, data, split: str, output_dir: str | None = None) -> dict:
  """Translate every pair of `split` (nothing dropped or truncated for length), write the
  hypotheses and the result into `output_dir` (default: the checkpoint's step directory) and
  return the scores, the search settings and the search throughput."""
  pairs = nonempty(data.raw_examples(split), split)
  warnings: list[str] = []
  hypotheses = translator.translate([s for s, _ in pairs], warnings.append,
                                    names=[f"{split} pair {i + 1}" for i in range(len(pairs))])
  for w in warnings[:10]:
    warn_stderr(w)
  if len(warnings) > 10:
    warn_stderr(f"... and {len(warnings) - 10} more truncated sources")
  hypotheses = [" ".join(h.splitlines()) for h in hypotheses]  # one line per pair, always
  result = {"split": split, "sentences": len(pairs),
            **scores(hypotheses, [t for _, t in pairs]), **translator.settings(),
            "averaged_steps": averaging.averaged_steps(translator.checkpoint_dir, translator.step),
            "truncated_sources": len(warnings), **translator.stats.as_dict()}
  return _write(output_dir or translator.step_dir, split, hypotheses, result)


def copy_baseline(pairs: list[tuple[str, str]], split: str, output_dir: str) -> dict:
  """The scores of copying each source of `pairs` (the split's) as its translation: no model
  and no tokenizer involved."""
  pairs = nonempty(pairs, split)
  hypotheses = [" ".join(s.split()) for s, _ in pairs]
  result = {"split": split, "sentences": len(pairs), "baseline": "copy",
            **scores(hypotheses, [t for _, t in pairs])}
  return _write(output_dir, f"{split}.copy", hypotheses, result)
