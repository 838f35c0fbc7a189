"""The built-in numbers task: German number words, sentences, determinism, disjoint splits."""
import calendar
import collections
import hashlib
import json
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


def test_number_words_at_the_edges_of_their_ranges():
  assert [numbers.english_number(n) for n in (0, 19, 20, 999)] == [
      "zero", "nineteen", "twenty", "nine hundred ninety-nine"]
  assert [numbers.german_number(n) for n in (0, 19, 1000, 1001, 9999)] == [
      "null", "neunzehn", "eintausend", "eintausendeins", "neuntausendneunhundertneunundneunzig"]
  for bad in (-1, 1000):
    with pytest.raises(ValueError, match="outside 0..999"):
      numbers.english_number(bad)
  for bad in (-1, 10000):
    with pytest.raises(ValueError, match="outside 0..9999"):
      numbers.german_number(bad)
  # Years from 1100 to 1999 are read in hundreds, a final 1 as "eins"; others as numbers.
  assert [numbers.german_year(y) for y in (1099, 1100, 1901, 1999, 2000)] == [
      "eintausendneunundneunzig", "elfhundert", "neunzehnhunderteins",
      "neunzehnhundertneunundneunzig", "zweitausend"]
  assert [numbers.german_ordinal(d) for d in (19, 31)] == ["neunzehnten", "einunddreißigsten"]


# The English number words of 0..999, for reading the sentences back.
_WORDS = {numbers.english_number(n): n for n in range(1000)}
# Each English noun form, singular or plural, to its lexicon entry.
_NOUNS = {word: entry for entry in numbers.NOUNS for word in entry[:2]}


def _count_and_noun(words):
  """(n, noun word, adjective or None) of the counted phrase in `words`, an English clause's
  words after its verb: a number (digits or words), maybe an adjective, a noun or "euro(s)"."""
  for end in range(len(words), 0, -1):
    head = " ".join(words[:end])
    if head.isdigit() or head in _WORDS:
      rest = words[end:]
      adjective = rest[0] if rest[0] in dict(numbers.ADJECTIVES) else None
      return int(head) if head.isdigit() else _WORDS[head], rest[1 if adjective else 0], adjective
  raise AssertionError(f"no count in {words}")


def test_verbs_agree_with_their_subjects_and_counted_nouns_with_their_numbers():
  """Read every main-clause sentence of a sample back: the English and German verb forms of its
  subject's person and tense, the noun in the singular exactly for one, the German number word,
  article and adjective ending."""
  subjects = sorted(numbers.SUBJECTS, key=lambda s: -len(s[0]))
  verbs = numbers.VERBS + [numbers.PAY]
  haben = {"1s": "habe", "3s": "hat", "1p": "haben", "3p": "haben"}
  present = {"1s": 0, "3s": 1, "1p": 2, "3p": 2}  # ich kaufe, er kauft, wir/sie kaufen
  rng = random.Random(5)
  seen = {"1s": 0, "3s": 0, "1p": 0, "3p": 0, "one": 0, "many": 0, "euro": 0, "euros": 0,
          "adjective": 0}
  for _ in range(4000):
    en, de = numbers.sentence(rng)
    match = [s for s in subjects if en.startswith(numbers._capitalize(s[0]) + " ")
             and de.startswith(numbers._capitalize(s[1]) + " ")]
    if not match or " that " in en:
      continue  # a fronted adverbial or a subordinate clause: test_word_order_rules
    en_subj, de_subj, person = match[0]
    en_words = en[len(en_subj) + 1:-1].split()
    de_words = de[len(de_subj) + 1:-1].split()
    (forms, de_forms, participle), = [v for v in verbs if en_words[0] in v[0]]
    past = en_words[0] == forms[2]
    assert en_words[0] == (forms[2] if past else forms[0] if person == "3s" else forms[1]), en
    assert de_words[0] == (haben[person] if past else de_forms[present[person]]), (en, de)
    assert (de_words[-1] == participle) == past, (en, de)
    seen[person] += 1
    n, noun, adjective = _count_and_noun(en_words[1:])
    if noun in ("euro", "euros"):
      assert noun == ("euro" if n == 1 else "euros"), en
      assert " ".join(de_words[1:3]) == ("einen Euro" if n == 1 else
                                         f"{numbers.german_number(n)} Euro"), (en, de)
      seen[noun] += 1
      continue
    en_sg, en_pl, gender, de_sg, de_pl = _NOUNS[noun]
    assert noun == (en_sg if n == 1 else en_pl), en
    stem = dict(numbers.ADJECTIVES)[adjective] if adjective else None
    if n == 1:
      article = {"m": "einen", "f": "eine", "n": "ein"}[gender]
      ending = {"m": "en", "f": "e", "n": "es"}[gender]
      expected = [article] + ([stem + ending] if stem else []) + [de_sg]
      seen["one"] += 1
    else:
      expected = [numbers.german_number(n)] + ([stem + "e"] if stem else []) + [de_pl]
      seen["many"] += 1
    assert de_words[1:1 + len(expected)] == expected, (en, de)
    seen["adjective"] += adjective is not None
  assert min(seen.values()) >= 10, seen


def test_dates_and_times_are_real_and_read_the_german_way():
  """Every fronted date is a day its month has, every time a clock's, and the German reads
  "am <ordinal> <month>", "um <hour> Uhr [<minutes>]" (one o'clock: "um ein Uhr")."""
  months = {en: (i + 1, de) for i, (en, de, _) in enumerate(numbers.MONTHS)}
  rng = random.Random(7)
  seen = {"date": set(), "time": set(), "year": set(), "day": 0, "adverb": 0}
  for _ in range(6000):
    en, de = numbers.sentence(rng)
    words = en.split()
    if words[0] == "On" and words[1] in months:
      month, de_month = months[words[1]]
      day = int(words[2])
      assert 1 <= day <= calendar.monthrange(2023, month)[1], en
      assert de.startswith(f"Am {numbers.german_ordinal(day)} {de_month} "), (en, de)
      seen["date"].add((month, day))
    elif words[0] == "On":
      seen["day"] += 1
    elif words[0] == "At":
      hour, minute = (int(x) for x in words[1].split(":"))
      assert 1 <= hour <= 12 and 0 <= minute <= 59 and len(words[1].split(":")[1]) == 2, en
      said = "ein" if hour == 1 else numbers.german_number(hour)
      assert de.startswith(f"Um {said} Uhr " + (f"{numbers.german_number(minute)} "
                                                 if minute else "")), (en, de)
      seen["time"].add((hour, minute))
    elif words[0] == "In":
      seen["year"].add(int(words[1]))
      assert de.startswith(f"Im Jahr {numbers.german_year(int(words[1]))} "), (en, de)
    elif words[0] in ("Yesterday", "Today", "Now", "Often", "Every", "Last", "This"):
      seen["adverb"] += 1
  assert {h for h, _ in seen["time"]} == set(range(1, 13)) and (1, 0) in seen["time"]
  assert {d for _, d in seen["date"]} == set(range(1, 32)) and (2, 28) in seen["date"]
  assert min(seen["year"]) == 1950 and max(seen["year"]) == 2029
  assert seen["day"] and seen["adverb"], seen


def test_too_many_wanted_sentences_is_an_error_after_a_bounded_number_of_draws(monkeypatch):
  draws = []
  monkeypatch.setattr(numbers, "sentence", lambda rng: draws.append(1) or ("A b.", "A b."))
  with pytest.raises(RuntimeError, match=r"could not draw \{'train': 3, 'validation': 1, "
                                         r"'test': 1\} unique sentences in 1250 draws; ask for "
                                         r"fewer"):
    numbers.generate_pairs(3, 1, 1)
  assert len(draws) == 1250  # 50 per wanted sentence + 1,000


# What `numbers.generate_pairs` gave on 2026-11-28 for the default config's corpus
# (data.numbers_*: 50,000 / 1,000 / 1,000, seed 0), on which every figure in README and docs was
# measured, and for five small corpora at the edges named below. A change to the grammar, the
# lexicon, the draws or the split changes them: prepared datasets under data_dir (TFDS caches
# numbers_translate by its version) would then differ from fresh builds. Bump
# `NumbersTranslate.VERSION`, re-run what the README quotes, and update these digests.
CORPUS_DIGESTS = {
    (50_000, 1_000, 1_000, 0, False): "31439dfdce795983",  # the default config's
    # German sources: past draw 2,881, the first German sentence drawn a second time.
    (4_000, 100, 100, 0, True): "e7f6cfcf79403598",
    # The held-out share per mille: 45.52 rounded to 46, 45.50 to 45; its floor of 1; its cap
    # of 300.
    (1_997, 100, 100, 0, False): "af5edb4c503ccfdf",
    (1_998, 100, 100, 0, False): "83d5872cfe0df79a",
    (3_000, 1, 1, 0, False): "c9271f1350f08d30",
    (10, 100, 100, 0, False): "91b035e51362750d",
}


@pytest.mark.parametrize("args", CORPUS_DIGESTS)
def test_the_corpus_is_the_one_the_documented_figures_were_measured_on(args):
  *sizes, seed, reverse = args
  # The forward corpora with generate_pairs' defaults (seed 0, English sources).
  pairs = numbers.generate_pairs(*sizes, **({"seed": seed, "reverse": True} if reverse else {}))
  assert {split: len(p) for split, p in pairs.items()} == dict(zip(numbers.SPLITS, sizes))
  # Sentences of the grammar in the order the seed draws them: the source is the German side
  # when reversed (a German source keeps the first English sentence drawn for it).
  rng = random.Random(seed)
  drawn = {numbers.sentence(rng) for _ in range(2 * sum(sizes))}
  assert all(((t, s) if reverse else (s, t)) in drawn for split in pairs.values()
             for s, t in split)
  digest = hashlib.sha256(json.dumps(pairs, ensure_ascii=False).encode()).hexdigest()[:16]
  assert digest == CORPUS_DIGESTS[args], (
      f"generate_pairs{args} changed (digest {digest}): see the comment above CORPUS_DIGESTS")


def test_an_empty_corpus_is_empty():
  assert numbers.generate_pairs(0, 0, 0) == {"train": [], "validation": [], "test": []}


def test_split_of_sends_two_per_cent_to_each_held_out_split_by_a_fixed_hash():
  counts = collections.Counter(numbers.split_of(f"sentence {i}.") for i in range(20_000))
  assert counts == {"train": 19_203, "validation": 401, "test": 396}
  assert numbers.split_of("One cow.", 1000) == "validation"
