"""The scores: the paper's tokenized BLEU against the Moses scripts' own output.

`tests/golden/moses/` holds German and French sentences and what tokenizer.perl, the compound
split Perl line and multi-bleu.perl made of them (its README has the commands): bleu.py must give
the same tokens, the same split and the same BLEU without Perl.
"""
import logging
import os
import re

import pytest
import sacrebleu

from transformer_jax import bleu

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden", "moses")


def _lines(name: str) -> list[str]:
  with open(os.path.join(GOLDEN, name), encoding="utf-8") as f:
    return f.read().splitlines()


# (file prefix, target language): real-looking sentences in German and French, then two corpora
# where BLEU's details decide: matches up to trigrams but no 4-gram in common (multi-bleu.perl
# does not smooth: 0), and lines too short to have trigrams (no n-gram order is dropped: 0).
CORPORA = [("de", "de"), ("fr", "fr"), ("de.zero4", "de"), ("de.short", "de")]


@pytest.mark.parametrize("corpus,lang", CORPORA)
@pytest.mark.parametrize("side", ["ref", "hyp"])
def test_tokenizer_and_compound_split_are_the_moses_scripts(corpus, lang, side):
  tokens = bleu.moses_tokenize(_lines(f"{corpus}.{side}.txt"), lang)
  assert tokens == _lines(f"{corpus}.{side}.tok")
  assert [bleu.split_compounds(t) for t in tokens] == _lines(f"{corpus}.{side}.tok.atat")


@pytest.mark.parametrize("corpus,lang", CORPORA)
def test_tokenized_bleu_is_multi_bleu_perl(corpus, lang):
  printed = _lines(f"{corpus}.multi-bleu.txt")[0]   # "BLEU = 62.39, 88.3/71.8/... (BP=..."
  expected = float(re.match(r"BLEU = ([0-9.]+),", printed).group(1))
  hypotheses, references = _lines(f"{corpus}.hyp.txt"), _lines(f"{corpus}.ref.txt")
  score, signature = bleu.tokenized_bleu(hypotheses, references, lang)
  assert round(score, 2) == expected, (score, printed)
  assert signature.startswith(f"moses-tok:{lang}|escape:yes|compound-split:##AT##|case:mixed|"
                              "smooth:none|sacremoses:")
  if score:   # not sacreBLEU's figure: another tokenization of the same text
    assert bleu.corpus_bleu(hypotheses, references)[0] != score


def test_compounds_split_as_perl_reads_bytes():
  """Perl's `s{(\\S)-(\\S)}{...}g` on UTF-8 bytes: non-overlapping, so an ASCII part of one
  letter stays joined on its right, a two-byte one does not; hyphens beside spaces stay."""
  assert bleu.split_compounds("rich-text format") == "rich ##AT##-##AT## text format"
  assert bleu.split_compounds("a-b-c") == "a ##AT##-##AT## b-c"
  assert bleu.split_compounds("est-à-dire") == "est ##AT##-##AT## à ##AT##-##AT## dire"
  assert bleu.split_compounds("a--b x - y -z z-") == "a ##AT##-##AT## -b x - y -z z-"
  # No-break space (U+00A0) is two bytes, neither of them ASCII whitespace: a part, as in Perl.
  assert bleu.split_compounds("x\u00a0-y") == "x\u00a0 ##AT##-##AT## y"


def test_a_perfect_translation_scores_100_and_case_counts():
  refs = ["Das Rich-Text-Format ist gut.", "Die Katze schläft."]
  assert bleu.tokenized_bleu(refs, refs, "de")[0] == pytest.approx(100.0)
  assert bleu.tokenized_bleu([r.lower() for r in refs], refs, "de")[0] < 50


def test_no_warning_that_the_input_is_tokenized(caplog):
  """sacreBLEU warns after 100 lines ending in ` .` that BLEU on tokenized text is not
  sacreBLEU; tokenized text is what multi-bleu.perl scores, so the warning would mislead."""
  lines = [f"Das ist Satz x{i}." for i in range(120)]   # x1., not an ordinal like 1.
  with caplog.at_level(logging.WARNING):
    assert bleu.tokenized_bleu(lines, lines, "de")[0] == pytest.approx(100.0)
  assert not caplog.records, caplog.text


def test_bleu_interval_and_paired_bootstrap_are_sacrebleus(monkeypatch):
  """evaluate.py's `bleu_ci95` and a grid's `p vs best` (docs/decoding.md)."""
  bleu_lib = bleu
  refs = [f"the {w} sat on the mat number {i}" for i, w in enumerate(["cat", "dog"] * 40)]
  good = [r if i % 3 else r.replace("mat", "rug") for i, r in enumerate(refs)]
  bad = [r.replace("sat on", "was near") if i % 2 else r for i, r in enumerate(good)]
  half, signature = bleu_lib.bleu_interval(good, refs)
  # The same figure as sacreBLEU's own bootstrap (`sacrebleu --confidence`), seed included.
  metric = sacrebleu.metrics.BLEU()
  assert half == pytest.approx(metric.corpus_score(good, [refs], n_bootstrap=1000)._ci)
  assert 0 < half < 10 and "bs:1000" in signature and "seed:" in signature
  p = bleu_lib.paired_bootstrap([good, bad, good], refs)
  assert p[0] is None and p[1] < 0.01 and p[2] == 1.0, p  # worse by far; the same system
  assert bleu_lib.paired_bootstrap([good], refs) == [None]
  # A difference of 0 is never significant, whatever sentences it comes from: two sentences
  # with the same reference trade their translations (sacreBLEU: about 0.5), or every
  # sentence differs and both score 0 (sacreBLEU: 1/1001, its smallest p).
  dup_refs = refs + [refs[0], refs[0]]
  base = good + [refs[0], "the cat"]
  swapped = good + ["the cat", refs[0]]
  assert bleu_lib.paired_bootstrap([base, swapped], dup_refs) == [None, 1.0]
  assert bleu_lib.paired_bootstrap([["dog"] * 20, ["bird"] * 20], refs[:20]) == [None, 1.0]
  # Too many sentences to resample in memory: no interval, no p-values, said.
  monkeypatch.setattr(bleu_lib, "BOOTSTRAP_MAX_SENTENCES", 10)
  assert bleu_lib.bleu_interval(good, refs) == (None, "not computed: over 10 sentences")
  assert bleu_lib.paired_bootstrap([good, bad], refs) == [None, None]
  monkeypatch.undo()
  # Two sentences of 80 changed: a small difference, well within the resampling's spread.
  near = [r.replace("number", "no.") if i in (5, 6) else r for i, r in enumerate(good)]
  (p_near,) = bleu_lib.paired_bootstrap([good, near], refs)[1:]
  assert 0.05 < p_near < 1.0, p_near
