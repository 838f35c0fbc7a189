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
  train = splits["train"]
  sources = {s for s, _ in train}
  targets = {t for _, t in train}
  norm_sources = {normalize(s) for s, _ in train}
  norm_targets = {normalize(t) for _, t in train}
  out = {}
  for split in ("validation", "test"):
    pairs = splits[split]
    exact = sum(s in sources for s, _ in pairs)
    near = sum(normalize(s) in norm_sources for s, _ in pairs)
    target = sum(t in targets for _, t in pairs)
    near_target = sum(normalize(t) in norm_targets for _, t in pairs)
    either = sum(normalize(s) in norm_sources or normalize(t) in norm_targets for s, t in pairs)
    out[split] = {"pairs": len(pairs), "exact_source": exact, "normalized_source": near,
                  "verbatim_target": target, "normalized_target": near_target,
                  "any_normalized": either}
  return out
