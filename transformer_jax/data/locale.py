"""A real English-German / English-French corpus from the machine itself: gettext catalogs.

Every Debian/Ubuntu machine carries human translations of its software messages in
`/usr/share/locale/<lang>/LC_MESSAGES/*.mo`. We read them with the standard library
(`gettext.GNUTranslations`), pair each English msgid with its translation, and clean them by
these rules, applied in this order (documented with the counts in docs/data.md):

1. Skip the catalog header, untranslated entries (empty msgstr) and copies (msgstr == msgid).
   Contexts (`msgctxt`) are dropped; plural entries contribute their singular form.
2. Skip whole `iso_*` catalogs (country, language, currency and script names): they are a
   dictionary of names, not messages, and they are the same across every machine's software.
3. Skip multi-line strings and strings with tabs: they are `--help` blocks and tables.
4. Skip strings with placeholders: printf (`%s`, `%-5d`, `%1$s`, `%(name)s`; a "% " with a
   space is taken as a percent sign), brace (`{0}`,
   `{name}`) and shell-style (`$VAR`, `${VAR}`): the model should not learn to invent them.
5. Skip command-line option lists (a word starting with `-x` or `--xx`), markup (`<b>`,
   `&amp;`) and strings without any letter.
6. Remove keyboard accelerators (`_File`, `&Open`), collapse whitespace.
7. Keep 1 to 50 words per side and a character length ratio within 1:3 (for strings over
   10 characters): longer or lopsided pairs are usually not translations of each other.
8. Deduplicate by source: when one source has several translations, keep the most frequent one
   (ties: the alphabetically first), so every source has exactly one reference.

The Ding dictionary (`apt-get install trans-de-en`, `/usr/share/trans/de-en`) can add German-
English phrase pairs: each line `DE :: EN` is split into aligned ` | ` sub-entries, the first
`; ` alternative is taken, and `{m}`, `[ugs.]`, `(...)` annotations are removed. Only entries with
at least two words on each side are kept (single words are dictionary headwords, not phrases).
"""
from __future__ import annotations

import collections
import gettext
import glob
import logging
import os
import re
import struct
from typing import Iterable, Iterator

from transformer_jax.data.config import DataError
from transformer_jax.data.leakage import normalize
from transformer_jax.data.lines import NotUTF8Error, read_lines

DEFAULT_LOCALE_DIR = "/usr/share/locale"
DEFAULT_DING_PATH = "/usr/share/trans/de-en"

_PRINTF = re.compile(r"%(\d+\$)?[-+#0']*(\d+|\*)?(\.(\d+|\*))?(hh|h|ll|l|L|q|j|z|t)?"
                     r"[diouxXeEfgGaAcspnm%]|%\([^)]*\)[a-z]|%[A-Z]")
_BRACE = re.compile(r"\{[A-Za-z0-9_]*\}|\$\{?[A-Za-z_]")
_OPTION = re.compile(r"(^|[\s\[(,/|])--?[A-Za-z0-9]")
_MARKUP = re.compile(r"<[^>]*>|&[a-z]+;|&#\d+;")
_ACCELERATOR = re.compile(r"(?<![\w&_])[_&](?=\w)")
_LETTER = re.compile(r"[^\W\d_]")


def clean_message(text: str) -> str | None:
  """One message after rules 3-6, or None when it is dropped."""
  if "\n" in text or "\t" in text or "\r" in text:
    return None
  if _PRINTF.search(text) or _BRACE.search(text):
    return None
  if _OPTION.search(text) or _MARKUP.search(text):
    return None
  text = _ACCELERATOR.sub("", text)
  text = " ".join(text.split())
  # A letter by `_LETTER` that NFKC turns into punctuation (U+FE70..FE7E, say) is none: no
  # message normalizes to nothing, so the split modes "grouped" and "grouped_v2" agree here.
  if not text or not _LETTER.search(text) or not normalize(text):
    return None
  return text


def clean_pair(source: str, target: str, max_words: int = 50) -> tuple[str, str] | None:
  """A (source, target) pair after rules 3-7, or None when it is dropped."""
  if not source or not target or source == target:
    return None
  source, target = clean_message(source), clean_message(target)
  if source is None or target is None or source == target:
    return None
  if not 1 <= len(source.split()) <= max_words or not 1 <= len(target.split()) <= max_words:
    return None
  longer, shorter = max(len(source), len(target)), min(len(source), len(target))
  if longer > 10 and longer > 3 * shorter:
    return None
  return source, target


def catalog_paths(locale_dir: str, lang: str) -> list[str]:
  """The .mo files of `lang`, sorted so the corpus does not depend on directory order."""
  return sorted(glob.glob(os.path.join(locale_dir, lang, "LC_MESSAGES", "*.mo")))


def missing_catalogs_message(locale_dir: str, lang: str) -> str:
  return (f"No gettext catalogs found under {locale_dir}/{lang}/LC_MESSAGES/*.mo, which the "
          f"'locale' dataset reads. Install some translated software, e.g. on Debian/Ubuntu "
          f"`apt-get install locales-all manpages-{lang} coreutils` with translations kept "
          f"(remove `path-exclude=/usr/share/locale/*` from /etc/dpkg/dpkg.cfg.d/excludes, "
          f"then reinstall), point data.locale_dir at a directory with <lang>/LC_MESSAGES/*.mo, "
          f"or choose data.dataset='numbers' (built in) or 'text' (your own corpus).")


def read_catalog(path: str) -> Iterator[tuple[str, str]]:
  """(msgid, msgstr) pairs of one .mo file (rule 1); raises on undecodable files."""
  with open(path, "rb") as f:
    catalog = gettext.GNUTranslations(f)._catalog  # The stdlib keeps no public iterator.
  for key, value in catalog.items():
    if isinstance(key, tuple):  # Plural entry: (msgid, index) -> form; keep the singular.
      msgid, index = key
      if index != 0:
        continue
    else:
      msgid = key
    msgid = msgid.split("\x04", 1)[-1]  # Drop a "context\x04" prefix.
    if msgid and value:
      yield msgid, value


def read_catalogs(locale_dir: str, lang: str) -> list[tuple[str, str]]:
  """Raw (English, `lang`) pairs of all catalogs of `lang` except iso_* ones (rules 1-2)."""
  paths = catalog_paths(locale_dir, lang)
  if not paths:
    raise FileNotFoundError(missing_catalogs_message(locale_dir, lang))
  pairs = []
  for path in paths:
    if os.path.basename(path).startswith("iso_"):
      continue
    try:
      pairs.extend(read_catalog(path))
    except (UnicodeDecodeError, OSError, LookupError, struct.error) as e:
      logging.warning("Skipping %s: %s", path, e)
  return pairs


def read_ding(path: str = DEFAULT_DING_PATH) -> list[tuple[str, str]]:
  """(English, German) phrase pairs of the Ding dictionary file (`DE :: EN` lines)."""
  if not os.path.exists(path):
    raise FileNotFoundError(
        f"data.locale_include_ding=True but {path} does not exist: "
        f"`apt-get install trans-de-en`, or set data.locale_include_ding=False")
  annotation = re.compile(r"\{[^}]*\}|\[[^\]]*\]|\([^)]*\)")
  pairs = []
  for line in _ding_lines(path):
    if line.startswith("#") or " :: " not in line:
      continue
    de_side, en_side = line.split(" :: ", 1)
    de_parts, en_parts = de_side.split(" | "), en_side.split(" | ")
    if len(de_parts) != len(en_parts):
      continue
    for de, en in zip(de_parts, en_parts):
      de = " ".join(annotation.sub(" ", de.split("; ")[0]).split())
      en = " ".join(annotation.sub(" ", en.split("; ")[0]).split())
      if len(de.split()) >= 2 and len(en.split()) >= 2:
        pairs.append((en, de))
  return pairs


def _ding_lines(path: str) -> list[str]:
  """The dictionary's lines; one that is not UTF-8 is an error naming it, not a line skipped
  or decoded with U+FFFD: the file is read only when a config asks for it, and a copy in
  Latin-1 would lose or mangle every line with an umlaut."""
  try:
    return read_lines(path)
  except NotUTF8Error as e:
    raise NotUTF8Error(f"{e}, and point data.locale_ding_path at the converted copy; or set "
                       "data.locale_include_ding=False") from None


def dedupe(pairs: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
  """One pair per source: its most frequent target, ties broken alphabetically (rule 8)."""
  by_source: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
  for source, target in pairs:
    by_source[source][target] += 1
  return [(source, min(targets, key=lambda t: (-targets[t], t)))
          for source, targets in sorted(by_source.items())]


def locale_pairs(locale_dir: str, lang: str, *, reverse: bool = False, include_ding: bool = False,
                 ding_path: str = DEFAULT_DING_PATH) -> tuple[list[tuple[str, str]], dict]:
  """Clean, deduplicated (source, target) pairs and the counts after each stage.

  English is the source unless `reverse`. Deduplication is by the source side, so each
  direction has its own corpus (a German sentence may translate two English ones).
  """
  raw = read_catalogs(locale_dir, lang)
  counts = {"raw_pairs": len(raw), "unique_raw_pairs": len(set(raw))}
  if include_ding:
    if lang != "de":
      raise DataError(f"data.locale_include_ding=True needs German, not {lang!r}")
    ding = read_ding(ding_path)
    counts["ding_pairs"] = len(ding)
    raw = raw + ding
  cleaned = [p for p in (clean_pair(en, tr) for en, tr in raw) if p is not None]
  counts["clean_pairs"] = len(cleaned)
  if reverse:
    cleaned = [(tr, en) for en, tr in cleaned]
  pairs = dedupe(cleaned)
  counts["unique_sources"] = len(pairs)
  return pairs, counts
