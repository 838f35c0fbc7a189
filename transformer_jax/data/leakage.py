"""Train/test leakage of a corpus split, and the grouping that keeps near-duplicates together.

Software messages repeat themselves with small changes ("Save file" / "Save File" / "Save
file:"), and different messages share a translation ("Cancel" / "Abort" -> "Abbrechen"). A split
by a hash of the exact source puts such pairs on both sides, so a test sentence is often a
training sentence in other clothes. Here:

* `normalize`: the comparison key: Unicode NFKC, case-folded, punctuation and symbols replaced
  by spaces, whitespace collapsed ("Save File:" and "save file" are the same key). A combining
  mark left by case-folding counts as punctuation ("İptal" -> "i ptal", not "iptal"): such
  case variants are not grouped (none in the gettext catalogs used here, docs/data.md).
* `group_keys`: pairs that share a normalized source or a normalized target are connected; each
  connected group gets one key (its smallest member). Splitting by that key keeps every group
  on one side, so no test pair shares a normalized source or target with a training pair. A
  side that normalizes to nothing ("...", "?", "♪") connects by its exact text: in the first
  version (split "grouped", 2026-11-23 to 2026-12-07) all such sides shared one key, and with
  them every pair their other sides reached, one group of any size in one split.
* `report`: how many held-out pairs have an exact source, a normalized source, a verbatim target
  or a normalized target in the training split.
"""
from __future__ import annotations

from array import array
from typing import Iterable, Sequence
import unicodedata

import numpy as np

Pair = tuple[str, str]


class _Spaced(dict):
  """`normalize`'s table for str.translate: a letter, digit or whitespace (str.isalnum,
  str.isspace) is kept, any other character becomes a space. Filled as characters are met
  (all of Unicode would be a large table); a C loop over the text instead of a Python one."""

  def __missing__(self, code: int) -> str:
    ch = chr(code)
    self[code] = ch if ch.isalnum() or ch.isspace() else " "
    return self[code]


_SPACED = _Spaced()


def normalize(text: str) -> str:
  text = unicodedata.normalize("NFKC", text).casefold()
  return " ".join(text.translate(_SPACED).split())


def group_keys(pairs: Sequence[Pair], empty_links_all: bool = False) -> list[str]:
  """One key per pair; pairs linked by a shared normalized source or target share it. A side
  that normalizes to nothing (punctuation or symbols alone) links by its exact text, the
  measure `report` counts it by; `empty_links_all`: as split "grouped" did, every such side
  of the source (or of the target) is one node, which can gather most of a subtitle corpus
  (lines of "..." or "♪" beside real sentences) into one group, kept whole in one split."""
  parent: dict[str, str] = {}

  def find(x: str) -> str:
    parent.setdefault(x, x)
    while parent[x] != x:
      parent[x] = parent[parent[x]]  # path halving
      x = parent[x]
    return x

  def node(side: str, text: str) -> str:
    key = normalize(text)
    # Exact texts are keyed apart ("S", "T"): "?" must not meet a normalized "" or a word.
    return f"{side}\t{key}" if key or empty_links_all else f"{side.upper()}\t{text}"

  nodes = [(node("s", s), node("t", t)) for s, t in pairs]
  for a, b in nodes:
    ra, rb = find(a), find(b)
    if ra != rb:  # the smaller key is the root, so a group's key does not depend on order
      parent[max(ra, rb)] = min(ra, rb)
  return [find(a) for a, _ in nodes]


def report(splits: dict[str, Sequence[Pair]]) -> dict:
  """Leakage of validation and test into train: counts of held-out pairs whose exact source,
  normalized source, exact target or normalized target occurs in the training split."""
  keys = train_keys(splits["train"])
  return {split: overlap(keys, splits[split])[0] for split in ("validation", "test")}


def train_keys(train: Iterable[Pair]) -> tuple[np.ndarray, ...]:
  """What `overlap` looks a pair up in: the training pairs' exact and normalized sources and
  targets, each as the sorted 64-bit hashes of the strings (Python's `hash`, fixed within a
  process: keys and lookups are made in one). Strings would hold gigabytes for WMT's 4.5M
  pairs, the hashes 36 MB a key, and `train` can be read a chunk at a time. Two different
  strings share a hash with probability 2^-64: a 3,000-pair test set's 12,000 lookups against
  4.5M training pairs' keys find a pair wrongly about once in 3 x 10^8 checks."""
  columns = tuple(array("q") for _ in range(4))
  for s, t in train:
    for column, text in zip(columns, (s, normalize(s), t, normalize(t))):
      column.append(hash(text))
  return tuple(np.unique(np.frombuffer(c, np.int64)) for c in columns)


def _has(keys: np.ndarray, text: str) -> bool:
  if not text:  # a blank line, or punctuation alone, normalized: no sentence the run saw
    return False
  h = hash(text)
  i = int(np.searchsorted(keys, h))
  return bool(i < len(keys) and keys[i] == h)


def overlap(keys: tuple[np.ndarray, ...], pairs: Sequence[Pair]) -> tuple[dict, list[int]]:
  """(the counts of `pairs` whose exact source, normalized source, exact target or normalized
  target is a training pair's (`train_keys`), and the numbers from 1 of the pairs with any of
  them). An empty side, or one that normalizes to nothing ("...", "-"), meets nothing."""
  sources, norm_sources, targets, norm_targets = keys
  counts = dict.fromkeys(("exact_source", "normalized_source", "verbatim_target",
                          "normalized_target"), 0)
  found = []
  for i, (s, t) in enumerate(pairs):
    hits = (_has(sources, s), _has(norm_sources, normalize(s)), _has(targets, t),
            _has(norm_targets, normalize(t)))
    for name, hit in zip(counts, hits):
      counts[name] += hit
    if hits[1] or hits[3]:  # an exact match is a normalized one too
      found.append(i + 1)
  return {"pairs": len(pairs), **counts, "any_normalized": len(found)}, found
