"""What a run's corpus was, file by file, so a resume can tell when the files changed under it.

    inputs = fingerprint(config.data)        # {path: {"bytes", "mtime_ns", "sha256"}}
    changed(inputs)                          # [] or ["corpus.tsv: its content changed", ...]

The local builders ("text", "locale") name their TFDS build after the input files' sizes and
modification times, so a corpus edited in place is rebuilt on the next start, with other
splits, under the tokenizer and the data position of the old one. The workdir records this
fingerprint (`config.json`'s `resolved_data`) and a resume compares it (`run.workdir`). The
content's SHA-256 decides: a file only touched or copied (a new time, the same bytes) is the
same corpus, and is hashed again only when its size or time moved.
"""
from __future__ import annotations

import hashlib
import os

from transformer_jax.data import locale


def input_files(c) -> list[str]:
  """The files the corpus of data config `c` is built from ("numbers" and the TFDS WMT
  datasets: none; the WMT data is TFDS's own, versioned)."""
  if c.dataset == "text":
    paths = [c.tsv_path] if c.tsv_path else [c.source_path, c.target_path]
  elif c.dataset == "locale":
    lang = c.target_lang if c.source_lang == "en" else c.source_lang
    paths = locale.catalog_paths(c.locale_dir or locale.DEFAULT_LOCALE_DIR, lang)
    ding = c.locale_ding_path or locale.DEFAULT_DING_PATH
    if c.locale_include_ding and os.path.exists(ding):
      paths.append(ding)
  else:
    return []
  return sorted(os.path.abspath(p) for p in paths if p)


def _sha256(path: str) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      h.update(block)
  return h.hexdigest()


def _entry(path: str) -> dict:
  stat = os.stat(path)
  return {"bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": _sha256(path)}


def fingerprint(c) -> dict:
  """{absolute path: size, modification time and SHA-256} of `input_files(c)` that exist."""
  return {p: _entry(p) for p in input_files(c) if os.path.exists(p)}


def changed(recorded: dict) -> list[str]:
  """What differs between the files now and `recorded` (a `fingerprint`): one line per file."""
  out = []
  for path, was in sorted(recorded.items()):
    if not os.path.exists(path):
      out.append(f"{path}: no longer exists")
      continue
    stat = os.stat(path)
    if stat.st_size == was["bytes"] and stat.st_mtime_ns == was["mtime_ns"]:
      continue  # untouched: not read again
    if _sha256(path) != was["sha256"]:
      out.append(f"{path}: its content changed ({was['bytes']:,} -> {stat.st_size:,} bytes)")
  return out
