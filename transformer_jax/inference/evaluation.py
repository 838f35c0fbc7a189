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
import random
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


def examples(pairs: Sequence[tuple[str, str]], hypotheses: Sequence[str], num: int = 10,
             worst: int = 1, seed: int = 0) -> list[dict]:
  """`num` pairs drawn at random (`seed`), in the split's order, then the `worst` others with
  the lowest sentence chrF: what a results page shows, reproducible from the hypotheses."""
  chrf = [bleu_lib.sentence_chrf(h, t) for (_, t), h in zip(pairs, hypotheses)]
  drawn = sorted(random.Random(seed).sample(range(len(pairs)), min(num, len(pairs))))
  rest = sorted(set(range(len(pairs))) - set(drawn), key=lambda i: (chrf[i], i))
  return [{"pair": i + 1, "source": pairs[i][0], "reference": pairs[i][1],
           "hypothesis": hypotheses[i], "chrf": chrf[i], "worst": n >= len(drawn)}
          for n, i in enumerate(drawn + rest[:worst])]


def examples_markdown(rows: list[dict]) -> str:
  """A Markdown table of `examples`, with a column for comments."""
  def cell(text: str) -> str:
    return text.replace("|", "\\|") or " "  # a | inside a cell would end it
  lines = ["| pair | source | reference | ours | sentence chrF | comment |",
           "|---|---|---|---|---|---|"]
  lines += [f"| {r['pair']}{' (worst)' if r['worst'] else ''} | {cell(r['source'])} | "
            f"{cell(r['reference'])} | {cell(r['hypothesis'])} | {r['chrf']:.0f} | |"
            for r in rows]
  return "\n".join(lines) + "\n"


def _write(output_dir: str, name: str, hypotheses: Sequence[str], result: dict,
           pairs: Sequence[tuple[str, str]], num_examples: int) -> dict:
  """`hypotheses.<name>.txt` (one line per pair, in the split's order), `eval.<name>.json` and
  `examples.<name>.md` (`num_examples` drawn at random with seed 0, plus the worst)."""
  os.makedirs(output_dir, exist_ok=True)
  hyp_path = os.path.join(output_dir, f"hypotheses.{name}.txt")
  with open(hyp_path, "w", encoding="utf-8") as f:
    f.writelines(h + "\n" for h in hypotheses)
  result["hypotheses"] = hyp_path
  if num_examples > 0:
    result["examples"] = os.path.join(output_dir, f"examples.{name}.md")
    with open(result["examples"], "w", encoding="utf-8") as f:
      f.write(examples_markdown(examples(pairs, hypotheses, num_examples)))
  with open(os.path.join(output_dir, f"eval.{name}.json"), "w") as f:
    json.dump(result, f, indent=2)
  return result


def evaluate(translator: Translator, data, split: str, output_dir: str | None = None,
             num_examples: int = 10) -> dict:
  """Translate every pair of `split` (nothing dropped or truncated for length), write the
  hypotheses, examples and the result into `output_dir` (default: the checkpoint's step
  directory) and return the scores, the search settings and the search throughput."""
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
  return _write(output_dir or translator.step_dir, split, hypotheses, result, pairs,
                num_examples)


def copy_baseline(pairs: list[tuple[str, str]], split: str, output_dir: str,
                  num_examples: int = 10) -> dict:
  """The scores of copying each source of `pairs` (the split's) as its translation: no model
  and no tokenizer involved."""
  pairs = nonempty(pairs, split)
  hypotheses = [" ".join(s.split()) for s, _ in pairs]
  result = {"split": split, "sentences": len(pairs), "baseline": "copy",
            **scores(hypotheses, [t for _, t in pairs])}
  return _write(output_dir, f"{split}.copy", hypotheses, result, pairs, num_examples)
