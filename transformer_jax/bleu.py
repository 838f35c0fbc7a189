"""sacreBLEU on detokenized text: the reproducible standard (cased, 13a tokenizer)."""
from __future__ import annotations

import sacrebleu


def corpus_bleu(hypotheses: list[str], references: list[str]) -> tuple[float, str]:
  """(BLEU, signature) of detokenized hypotheses against raw references."""
  metric = sacrebleu.metrics.BLEU()
  score = metric.corpus_score(hypotheses, [references])
  return score.score, str(metric.get_signature())


def corpus_chrf(hypotheses: list[str], references: list[str]) -> tuple[float, str]:
  metric = sacrebleu.metrics.CHRF()
  score = metric.corpus_score(hypotheses, [references])
  return score.score, str(metric.get_signature())


def sentence_chrf(hypothesis: str, reference: str) -> float:
  """chrF of one sentence (what a table of examples shows next to each translation)."""
  return sacrebleu.metrics.CHRF().sentence_score(hypothesis, [reference]).score
