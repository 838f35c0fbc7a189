"""The built-in numbers task: German number words, sentences, determinism, disjoint splits."""
import random

import pytest

from transformer_jax.data import numbers


@pytest.mark.parametrize("n, word", [
    (1, "eins"), (7, "sieben"), (11, "elf"), (16, "sechzehn"), (17, "siebzehn"),
    (20, "zwanzig"), (21, "einundzwanzig"), (27, "siebenundzwanzig"), (30, "dreißig"),
    (99, "neunundneunzig"), (100, "einhundert"), (101, "einhunderteins"),
    (121, "einhunderteinundzwanzig"), (327, "dreihundertsiebenundzwanzig"),
    (999, "neunhundertneunundneunzig"), (2005, "zweitausendfünf"),
])
def test_german_number_words(n, word):
  assert numbers.german_number(n) == word


def test_other_number_forms():
  assert numbers.german_number(1, final=False) == "ein"
  assert numbers.german_year(1987) == "neunzehnhundertsiebenundachtzig"
  assert numbers.german_year(2024) == "zweitausendvierundzwanzig"
  assert [numbers.german_ordinal(d) for d in (1, 3, 7, 8, 12, 20, 27)] == [
      "ersten", "dritten", "siebten", "achten", "zwölften", "zwanzigsten",
      "siebenundzwanzigsten"]
  assert numbers.english_number(327) == "three hundred twenty-seven"
  assert numbers.english_number(40) == "forty"


def test_word_order_rules():
  rng = random.Random(0)
  participles = {v[2] for v in numbers.VERBS} | {numbers.PAY[2]}
  finite = set(numbers._HABEN.values()) | {f for v in numbers.VERBS + [numbers.PAY] for f in v[1]}
  checked = {"fronted_past": 0, "subordinate": 0, "digits": 0}
  for _ in range(3000):
    en, de = numbers.sentence(rng)
    if en.startswith("Yesterday "):
      # Fronted adverbial + past: verb second (the auxiliary), participle last.
      words = de[:-1].split()
      assert words[0] == "Gestern" and words[1] in ("habe", "hat", "haben")
      assert words[-1] in participles
      checked["fronted_past"] += 1
    if " that " in en:
      # Subordinate clause: the finite verb is the last word, after the participle if past.
      assert ", dass " in de
      clause = de[:-1].split(", dass ")[1].split()
      assert clause[-1] in finite, de
      assert [i for i, w in enumerate(clause[:-1]) if w in participles] in (
          [], [len(clause) - 2]), de
      checked["subordinate"] += 1
    if " 27 " in en:
      assert "siebenundzwanzig" in de
      checked["digits"] += 1
  assert all(checked.values()), checked


def test_exact_translations():
  rng = random.Random(1)
  pairs = [numbers.sentence(rng) for _ in range(3)]
  assert pairs == [
      ("They sell seven hundred eighty-one flowers.",
       "Sie verkaufen siebenhunderteinundachtzig Blumen."),
      ("Yesterday we counted 91 black pictures.",
       "Gestern haben wir einundneunzig schwarze Bilder gezählt."),
      ("My brother hears that I pay 89 euros for the shoe.",
       "Mein Bruder hört, dass ich neunundachtzig Euro für den Schuh zahle."),
  ]


def test_generation_is_deterministic_and_splits_disjoint():
  a = numbers.generate_pairs(3000, 200, 200, seed=3)
  b = numbers.generate_pairs(3000, 200, 200, seed=3)
  assert a == b
  assert {k: len(v) for k, v in a.items()} == {"train": 3000, "validation": 200, "test": 200}
  sources = {split: {s for s, _ in pairs} for split, pairs in a.items()}
  assert not sources["train"] & sources["validation"]
  assert not sources["train"] & sources["test"]
  assert not sources["validation"] & sources["test"]
  for split, pairs in a.items():
    assert len(sources[split]) == len(pairs)  # Unique sources within a split too.
  # Lengths differ: the task is not a copy task.
  assert sum(len(s.split()) != len(t.split()) for s, t in a["train"]) > 1000
  assert numbers.generate_pairs(3000, 200, 200, seed=4) != a


def test_reverse_direction_has_unique_german_sources():
  pairs = numbers.generate_pairs(2000, 100, 100, seed=0, reverse=True)
  train = [s for s, _ in pairs["train"]]
  assert len(set(train)) == len(train)
  assert all(" " in s and s.endswith(".") for s in train)
  held_out = {s for s, _ in pairs["test"]} | {s for s, _ in pairs["validation"]}
  assert not held_out & set(train)
