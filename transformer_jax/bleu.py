"""BLEU and chrF of translations.

sacreBLEU on detokenized text is the reproducible standard (cased, 13a tokenizer) and the
score this codebase reports first. `tokenized_bleu` is the paper's kind of score, for comparing
with published EN-DE tables, as tensor2tensor's get_ende_bleu.sh computes it: both sides
tokenized by the Moses tokenizer, hyphenated compounds split (`rich ##AT##-##AT## text`), then
multi-bleu.perl's BLEU (docs/decoding.md).
"""
from __future__ import annotations

import importlib.metadata
import re

import sacrebleu


def corpus_bleu(hypotheses: list[str], references: list[str]) -> tuple[float, str]:
  """(BLEU, signature) of detokenized hypotheses against raw references."""
  metric = sacrebleu.metrics.BLEU()
  score = metric.corpus_score(hypotheses, [references])
  return score.score, str(metric.get_signature())


# Resamples of the sentences for the confidence interval and the paired test (sacreBLEU's
# default for --paired-bs; its seed is fixed, SACREBLEU_SEED or 12345, and in the signature).
BOOTSTRAP_SAMPLES = 1000
# sacreBLEU resamples all at once: samples x sentences x 10 float32 statistics, 40 KB a
# sentence (120 MB for newstest2014's 3,003). Above this many sentences (800 MB) the interval
# and the paired test are left out rather than risk the memory.
BOOTSTRAP_MAX_SENTENCES = 20_000


def _bootstrap(systems: list[list[str]], references: list[str], samples: int) -> tuple[str, list]:
  """sacreBLEU's bootstrap test of BLEU (`PairedTest`, `test_type="bs"`) over `systems`, the
  first the baseline: (signature, one result per system, with `.ci` and `.p_value`)."""
  from sacrebleu.significance import PairedTest  # numpy and multiprocessing: only here
  named = [(str(i), list(h)) for i, h in enumerate(systems)]
  signatures, results = PairedTest(named, {"BLEU": sacrebleu.metrics.BLEU()}, [references],
                                   test_type="bs", n_samples=samples)()
  return str(signatures["BLEU"]), results["BLEU"]


def bleu_interval(hypotheses: list[str], references: list[str],
                  samples: int = BOOTSTRAP_SAMPLES) -> tuple[float | None, str]:
  """(half-width, signature) of the 95% confidence interval of `corpus_bleu` by bootstrap
  resampling of the sentences (Koehn 2004), as `sacrebleu --confidence` computes it: how much
  the score could move on another test set of the same kind and size. (None, why) above
  `BOOTSTRAP_MAX_SENTENCES`."""
  if len(hypotheses) > BOOTSTRAP_MAX_SENTENCES:
    return None, f"not computed: over {BOOTSTRAP_MAX_SENTENCES:,} sentences"
  signature, (result,) = _bootstrap([hypotheses], references, samples)
  return float(result.ci), signature


def read_lines(path: str) -> list[str]:
  """The lines of a `hypotheses.*.txt` or `references.*.txt` file as scripts/evaluate.py wrote
  them (one per pair; split on line feeds only, as they were joined, so a sentence holding a
  carriage return stays one)."""
  with open(path, encoding="utf-8", newline="") as f:
    text = f.read()
  return text.split("\n")[:-1]


def paired_bootstrap(systems: list[list[str]], references: list[str],
                     samples: int = BOOTSTRAP_SAMPLES) -> list[float | None]:
  """Paired bootstrap resampling (Koehn 2004; `sacrebleu --paired-bs`) of every system's BLEU
  against the first's, on the same resampled sentences: one two-sided p-value per system (of
  the absolute difference), None for the first. A p below 0.05, say, says that a difference
  this large would seldom come from the choice of sentences alone; a large one, that it could.
  All None above `BOOTSTRAP_MAX_SENTENCES`."""
  if len(references) > BOOTSTRAP_MAX_SENTENCES:
    return [None] * len(systems)
  _, results = _bootstrap(systems, references, samples)
  # The p-value is the chance of a difference at least as large as the observed one; every
  # difference is at least 0, so an observed 0 has p = 1. sacreBLEU's p is (1 + the number of
  # centred resampled differences strictly above the observed one) / (samples + 1): about 0.5
  # for an observed 0, and its floor, 1/(samples + 1), "significant", where every resample
  # differs by 0 too (the same translations, or other ones that all score the same).
  baseline = results[0].score
  return [None] + [1.0 if r.score == baseline else float(r.p_value) for r in results[1:]]


def corpus_chrf(hypotheses: list[str], references: list[str]) -> tuple[float, str]:
  metric = sacrebleu.metrics.CHRF()
  score = metric.corpus_score(hypotheses, [references])
  return score.score, str(metric.get_signature())


def sentence_chrf(hypothesis: str, reference: str) -> float:
  """chrF of one sentence (what a table of examples shows next to each translation)."""
  return sacrebleu.metrics.CHRF().sentence_score(hypothesis, [reference]).score


def split_compounds(text: str) -> str:
  r"""`rich-text` -> `rich ##AT##-##AT## text`: tensor2tensor's get_ende_bleu.sh (`perl -ple
  's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g'`), after the Stanford NMT project and GNMT, so a
  compound counts as its parts.

  On UTF-8 bytes, as that Perl line reads them: `\S` is one byte that is not ASCII whitespace,
  matches do not overlap, and so a one-character part spelt with two bytes is split on both
  sides (`c'est-à-dire` -> `c'est ##AT##-##AT## à ##AT##-##AT## dire`) where an ASCII one is
  not (`a-b-c` -> `a ##AT##-##AT## b-c`). The inserted text falls between whole characters.
  """
  return re.sub(rb"(\S)-(\S)", rb"\1 ##AT##-##AT## \2", text.encode("utf-8")).decode("utf-8")


def moses_tokenize(lines: list[str], lang: str) -> list[str]:
  """The Moses tokenizer (`tokenizer.perl -l <lang>`, with its HTML escaping) by sacremoses.

  Imported here, not at the top: only evaluation needs it. It is the script of the paper's
  time: on 16,000 lines of real EN, DE and FR text sacremoses 0.2.0 gave tokenizer.perl's
  tokens as of 2018-10 on every line; the script splits a sentence-final period off
  unconditionally since 2018-11 (`usw.` -> `usw .`; docs/decoding.md). A language without
  Moses rules gets the generic ones, like the script.
  """
  from sacremoses import MosesTokenizer
  tokenizer = MosesTokenizer(lang=lang)
  return [tokenizer.tokenize(line, return_str=True, escape=True) for line in lines]


def tokenized_bleu(hypotheses: list[str], references: list[str],
                   lang: str) -> tuple[float, str]:
  """(BLEU, signature) as the paper's EN-DE table was scored: Moses-tokenized (`lang`, the
  target language), compounds split, then multi-bleu.perl: cased, no smoothing, BLEU over the
  tokens as they are (sacreBLEU's `tokenize="none"`, `smooth_method="none"` computes exactly
  multi-bleu.perl's figures). Comparable with papers that score this way, not with sacreBLEU
  (the two differ on the same translations; docs/decoding.md has both on real runs)."""
  def prepare(lines):
    return [split_compounds(line) for line in moses_tokenize(lines, lang)]

  metric = sacrebleu.metrics.BLEU(tokenize="none", smooth_method="none", force=True)
  score = metric.corpus_score(prepare(hypotheses), [prepare(references)])
  signature = (f"moses-tok:{lang}|escape:yes|compound-split:##AT##|case:mixed|smooth:none|"
               f"sacremoses:{importlib.metadata.version('sacremoses')}|"
               f"sacrebleu:{sacrebleu.__version__}")
  return score.score, signature
