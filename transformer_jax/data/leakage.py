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
  on one side, so no test pair shares a normalized source or target with a training pair.
* `report`: how many held-out pairs have an exact source, a normalized source, a verbatim target
  or a normalized target in the training split.
"""
from __future__ import annotations

from typing import Sequence
import unicodedata

Pair = tuple[str, str]


def normalize(text: str) -> str:
  text = unicodedata.normalize("NFKC", text).casefold()
  text = "".join(ch if ch.isalnum() or ch.isspace() else " " for ch in text)
  return " ".join(text.split())


def group_keys(pairs: Sequence[Pair]) -> list[str]:
  """One key per pair; pairs linked by a shared normalized source or target share it."""
  parent: dict[str, str] = {}

  def find(x: str) -> str:
    parent.setdefault(x, x)
    while parent[x] != x:
      parent[x] = parent[parent[x]]  # path halving
      x = parent[x]
    return x

  nodes = [("s\t" + normalize(s), "t\t" + normalize(t)) for s, t in pairs]
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


def train_keys(train: Sequence[Pair]) -> tuple[set, set, set, set]:
  """What `overlap` looks a pair up in: the training pairs' exact and normalized sources and
  targets."""
  return ({s for s, _ in train}, {normalize(s) for s, _ in train},
          {t for _, t in train}, {normalize(t) for _, t in train})


def overlap(keys: tuple[set, set, set, set], pairs: Sequence[Pair]) -> tuple[dict, list[int]]:
  """(the counts of `pairs` whose exact source, normalized source, exact target or normalized
  target is a training pair's (`train_keys`), and the numbers from 1 of the pairs with any of
  them)."""
  sources, norm_sources, targets, norm_targets = keys
  counts = dict.fromkeys(("exact_source", "normalized_source", "verbatim_target",
                          "normalized_target"), 0)
  found = []
  for i, (s, t) in enumerate(pairs):
    hits = (s in sources, normalize(s) in norm_sources, t in targets,
            normalize(t) in norm_targets)
    for name, hit in zip(counts, hits):
      counts[name] += hit
    if hits[1] or hits[3]:  # an exact match is a normalized one too
      found.append(i + 1)
  return {"pairs": len(pairs), **counts, "any_normalized": len(found)}, found
