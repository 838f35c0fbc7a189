"""Train/test leakage: the normalized keys, the near-duplicate groups and the grouped split."""
import json
import unicodedata

import pytest

from transformer_jax.data import builders, leakage, numbers


def _families(n: int) -> list[tuple[str, str]]:
  """n message families, each in three spellings that a model would treat as the same."""
  pairs = []
  for i in range(n):
    pairs += [(f"Save file {i}", f"Datei {i} speichern"),
              (f"save File {i}:", f"Datei {i} speichern:"),
              (f"Store file {i}", f"Datei {i} speichern")]   # another source, the same target
  return pairs


def test_normalize_ignores_case_punctuation_and_spacing():
  assert leakage.normalize("  Save File:  ") == leakage.normalize("save file") == "save file"
  assert leakage.normalize("Größe…") == leakage.normalize("GRÖSSE") == "grösse"
  assert leakage.normalize("Save files") != leakage.normalize("Save file")


def test_group_keys_link_shared_sources_and_targets_transitively():
  pairs = [("A b", "x"), ("a B!", "y"), ("c", "Y"), ("d", "z")]
  keys = leakage.group_keys(pairs)
  assert keys[0] == keys[1] == keys[2] != keys[3]
  # The key does not depend on the order of the pairs.
  assert leakage.group_keys(pairs[::-1])[::-1] == keys


def test_a_side_of_punctuation_alone_links_only_by_its_exact_text():
  """Subtitle corpora hold lines of "..." and "?" beside sentences. Split "grouped" gave every
  side that normalizes to nothing one key, so those pairs and every pair their other sides
  reached were one group, in one split; "grouped_v2" links them by their exact text (what
  `report` counts), and every group that no such side reaches keeps its key."""
  families = _families(300)
  marks = ["...", "?", "♪"]
  # Every tenth family's target once more, its source a mark: families 0, 30, 60... meet "...".
  reached = range(0, 300, 10)
  pairs = families + [(marks[i // 10 % 3], f"Datei {i} speichern") for i in reached]
  pairs += [("...", "..."), ("?", "-"), ("♪", "♪")]
  old = leakage.group_keys(pairs, empty_links_all=True)
  new = leakage.group_keys(pairs)
  assert len({old[3 * i] for i in reached} | set(old[-3:])) == 1
  assert [len({new[3 * i] for i in reached[m::3]}) for m in range(3)] == [1, 1, 1]
  assert len({new[3 * i] for i in reached[:3]} | {new[-2]}) == 3 and new[-1] == new[3 * 20]
  others = [j for j in range(len(families)) if j // 3 % 10]
  assert [new[j] for j in others] == [old[j] for j in others]
  # The splits: none of the measures `report` counts meets a training pair; "grouped" is kept
  # for the runs split by it.
  for mode, keys in (("grouped_v2", new), ("grouped", old)):
    splits = builders.split_pairs(pairs, held_out_per_mille=200, mode=mode)
    assert splits == {s: [p for p, k in zip(pairs, keys) if numbers.split_of(k, 200) == s]
                      for s in builders.SPLITS}
    report = leakage.report(splits)
    assert all(v == 0 for split in ("validation", "test") for k, v in report[split].items()
               if k != "pairs")
  # The three marks' groups fall apart from one another (here, two of them held out).
  assert len({numbers.split_of(new[-k], 200) for k in (1, 2, 3)}) > 1
  with pytest.raises(ValueError, match="split mode 'grouped3': not one of grouped_v2"):
    builders.split_pairs(pairs, held_out_per_mille=200, mode="grouped3")


def test_report_counts_each_kind_of_leak():
  splits = {"train": [("Open the file", "Datei öffnen")],
            "validation": [],
            "test": [("Open the file", "x"), ("open the FILE.", "y"), ("Close", "Datei öffnen"),
                     ("Quit", "Beenden")]}
  test = leakage.report(splits)["test"]
  assert test == {"pairs": 4, "exact_source": 1, "normalized_source": 2, "verbatim_target": 1,
                  "normalized_target": 1, "any_normalized": 3}


def test_overlap_names_the_pairs_that_meet_the_training_pairs():
  """evaluate.py's check of a test set of one's own: the counts, and the pairs (from 1) whose
  source or target meets a training pair's after normalizing, an exact match included."""
  keys = leakage.train_keys([("Open the file", "Datei öffnen"), ("Quit", "Beenden")])
  pairs = [("Close", "Schließen"), ("open the FILE.", "y"), ("Open the file", "Datei öffnen"),
           ("Exit", "beenden!"), ("Help", "Hilfe")]
  assert leakage.overlap(keys, pairs) == (
      {"pairs": 5, "exact_source": 1, "normalized_source": 2, "verbatim_target": 1,
       "normalized_target": 2, "any_normalized": 3}, [2, 3, 4])
  assert leakage.overlap(keys, []) == ({"pairs": 0, "exact_source": 0, "normalized_source": 0,
                                        "verbatim_target": 0, "normalized_target": 0,
                                        "any_normalized": 0}, [])
  # The training pairs may come one by one (evaluate.py reads them a chunk at a time), the
  # counts are plain ints (the result is JSON), and no training pairs meet nothing.
  streamed = leakage.train_keys(p for p in [("Open the file", "Datei öffnen"), ("Quit", "Beenden")])
  counts, found = leakage.overlap(streamed, pairs)
  assert json.dumps(counts) and (counts, found) == leakage.overlap(keys, pairs)
  assert leakage.overlap(leakage.train_keys([]), pairs)[1] == []
  # Blank lines and punctuation alone normalize to nothing: they meet no training pair, even one
  # that also normalizes to nothing.
  blank = leakage.train_keys([("...", "Hallo"), ("Hi", "-"), ("", "")])
  assert leakage.overlap(blank, [("", ""), ("!", "?"), ("Hi", "x")]) == (
      {"pairs": 3, "exact_source": 1, "normalized_source": 1, "verbatim_target": 0,
       "normalized_target": 0, "any_normalized": 1}, [3])


def test_normalize_keeps_letters_digits_and_spaces_and_spaces_out_the_rest():
  """`normalize` as its definition says, character by character, for every character of the
  Basic Multilingual Plane between two letters (it replaces each other character by a space
  through a table filled as characters are met)."""
  def reference(text):
    text = unicodedata.normalize("NFKC", text).casefold()
    return " ".join("".join(c if c.isalnum() or c.isspace() else " " for c in text).split())
  texts = ["a" + chr(c) + "b" for c in range(0x10000) if not 0xD800 <= c <= 0xDFFF]
  texts.append("".join(chr(c) for c in range(0x20, 0x3000, 7)))
  assert [leakage.normalize(t) for t in texts] == [reference(t) for t in texts]


def test_grouped_split_keeps_near_duplicates_on_one_side():
  pairs = _families(400)
  splits = builders.split_pairs(pairs, held_out_per_mille=100)
  assert all(splits[s] for s in builders.SPLITS)
  assert sum(len(v) for v in splits.values()) == len(pairs)
  for split in ("validation", "test"):
    assert all(v == 0 for k, v in leakage.report(splits)[split].items() if k != "pairs")
  # Hashing the exact source, as before, scatters the families (the check can fail).
  by_source = {s: [] for s in builders.SPLITS}
  for source, target in pairs:
    by_source[numbers.split_of(source, 100)].append((source, target))
  assert leakage.report(by_source)["test"]["any_normalized"] > 0
