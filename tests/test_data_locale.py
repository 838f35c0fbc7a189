"""The gettext corpus: cleaning rules, a small .mo catalog, errors, the machine's catalogs."""
import re

import pytest

from transformer_jax.data import builders, default_data_config, get_data, locale
from transformer_jax.data.lines import NotUTF8Error

from gettext_catalogs import write_mo


def test_cleaning_rules():
  keep = {
      "Open the file": "Open the file",
      "_Save As…": "Save As…",
      "&Quit": "Quit",
      "  too   many spaces ": "too many spaces",
      "100% sure": "100% sure",  # A percent sign that is not a placeholder.
  }
  for raw, clean in keep.items():
    assert locale.clean_message(raw) == clean, raw
  for bad in ["Cannot open %s", "%d files", "copied %1$s to %2$s", "Hello %(name)s",
              "Hello {name}", "Set ${HOME}", "Usage: ls [OPTION]... --all", "  -a, --all",
              "first line\nsecond line", "a\tb", "<b>bold</b>", "Tom &amp; Jerry", "123",
              "...", "\ufe70", "\uff9e!"]:   # (letters to `_LETTER`, marks after NFKC)
    assert locale.clean_message(bad) is None, bad
  assert locale.clean_message("\ufe70 a") == "\ufe70 a"
  assert locale.clean_pair("File", "Datei") == ("File", "Datei")
  assert locale.clean_pair("OK", "OK") is None  # Untranslated copy.
  assert locale.clean_pair("A long English sentence here", "Ja") is None  # Ratio.
  assert locale.clean_pair(" ".join(["word"] * 51), "Wort") is None
  assert locale.dedupe([("a", "x"), ("a", "y"), ("a", "y"), ("b", "z"), ("c", "q"),
                        ("c", "p")]) == [("a", "y"), ("b", "z"), ("c", "p")]


def make_catalogs(root):
  header = "Content-Type: text/plain; charset=UTF-8\n"
  messages = {"": header, "Open the file": "Datei öffnen", "Save changes?":
              "Änderungen speichern?", "Cannot open %s": "Kann %s nicht öffnen",
              "menu\x04_Quit": "_Beenden", "Untranslated": ""}
  messages.update({f"Message number {i}": f"Meldung Nummer {i}" for i in range(300)})
  write_mo(str(root / "de" / "LC_MESSAGES" / "app.mo"), messages)
  write_mo(str(root / "de" / "LC_MESSAGES" / "iso_3166.mo"),
                  {"": header, "Germany": "Deutschland"})
  with open(root / "de" / "LC_MESSAGES" / "broken.mo", "wb") as f:
    f.write(b"not a catalog")


def test_small_catalog(tmp_path):
  make_catalogs(tmp_path / "locale")
  raw = locale.read_catalogs(str(tmp_path / "locale"), "de")
  assert ("Open the file", "Datei öffnen") in raw and ("Quit", "_Beenden") not in raw
  assert ("_Quit", "_Beenden") in raw  # Context dropped; accelerators removed later.
  assert all(en != "Germany" for en, _ in raw)  # iso_* catalogs skipped.
  pairs, counts = locale.locale_pairs(str(tmp_path / "locale"), "de")
  assert ("Quit", "Beenden") in pairs and ("Save changes?", "Änderungen speichern?") in pairs
  assert all("%" not in en for en, _ in pairs)
  assert counts["unique_sources"] == len(pairs) == 303
  reverse, _ = locale.locale_pairs(str(tmp_path / "locale"), "de", reverse=True)
  assert ("Datei öffnen", "Open the file") in reverse


def test_dataset_from_a_small_catalog_both_directions(tmp_path):
  make_catalogs(tmp_path / "locale")
  seen = {}
  for source_lang, target_lang in (("en", "de"), ("de", "en")):
    c = default_data_config()
    c.dataset, c.locale_dir, c.data_dir = "locale", str(tmp_path / "locale"), str(tmp_path)
    c.source_lang, c.target_lang = source_lang, target_lang
    c.held_out_per_mille, c.vocab_size, c.max_source_len = 100, 200, 16
    c.max_target_len = 16
    data = get_data(c, str(tmp_path / f"work-{source_lang}"))
    splits = {s: data.raw_examples(s) for s in ("train", "validation", "test")}
    assert sum(map(len, splits.values())) == 303
    assert splits["validation"] and splits["test"]
    sources = [{s for s, _ in v} for v in splits.values()]
    assert not (sources[0] & sources[1] or sources[0] & sources[2] or sources[1] & sources[2])
    seen[source_lang] = splits
    assert next(iter(data.train_dataset()))["inputs"].shape == (64, 16)
  assert ("Open the file", "Datei öffnen") in sum(seen["en"].values(), [])
  assert ("Datei öffnen", "Open the file") in sum(seen["de"].values(), [])
  # The two groupings split catalogs alike: one build serves both, "source" is another.
  c.split = "grouped_v2"
  name = builders.make_builder(c, c.data_dir).builder_config.name
  c.split = "grouped"
  assert builders.make_builder(c, c.data_dir).builder_config.name == name
  c.split = "source"
  assert builders.make_builder(c, c.data_dir).builder_config.name != name


def test_missing_catalogs_say_what_to_do(tmp_path):
  c = default_data_config()
  c.dataset, c.locale_dir, c.data_dir = "locale", str(tmp_path / "nothing"), str(tmp_path)
  with pytest.raises(FileNotFoundError, match="No gettext catalogs.*apt-get install"):
    get_data(c, str(tmp_path / "work"))
  c.locale_dir = None
  c.source_lang, c.target_lang = "de", "fr"
  with pytest.raises(ValueError, match="English with one language"):
    get_data(c, str(tmp_path / "work"))


def test_ding_phrases(tmp_path):
  path = tmp_path / "de-en"
  path.write_text("# comment\n"
                  "Guten Morgen! {interj} | Guten Tag! :: Good morning! | Good day!\n"
                  "Haus {n}; Gebäude {n} :: house; building\n"
                  "das rote Haus [ugs.] :: the red house (colloquial)\n", encoding="utf-8")
  assert locale.read_ding(str(path)) == [("Good morning!", "Guten Morgen!"),
                                         ("Good day!", "Guten Tag!"),
                                         ("the red house", "das rote Haus")]
  with pytest.raises(FileNotFoundError, match="apt-get install trans-de-en"):
    locale.read_ding(str(tmp_path / "missing"))


def test_a_ding_line_that_is_not_utf8_is_an_error_naming_it(tmp_path):
  """It was decoded with U+FFFD in place of the bytes ("Gro\ufffde Stadt"), into the corpus."""
  path = tmp_path / "de-en"
  path.write_bytes("kleines Haus :: small house\n".encode()
                   + "gro\xdfe Stadt :: big city\n".encode("latin-1"))
  with pytest.raises(NotUTF8Error, match=(
      rf"^{re.escape(str(path))} line 2 is not UTF-8 \(.*\): convert it, e.g. with "
      r"`iconv -f LATIN1 -t UTF-8`, and point data.locale_ding_path at the converted copy; or set "
      r"data.locale_include_ding=False$")):
    locale.read_ding(str(path))


@pytest.mark.skipif(not locale.catalog_paths(locale.DEFAULT_LOCALE_DIR, "de"),
                    reason="no German gettext catalogs under /usr/share/locale on this machine")
def test_the_machines_catalogs():
  pairs, counts = locale.locale_pairs(locale.DEFAULT_LOCALE_DIR, "de")
  assert counts["raw_pairs"] > 5000 and len(pairs) > 2000
  sources = [s for s, _ in pairs]
  assert len(set(sources)) == len(sources)
  assert not any("\n" in s or "%s" in s or "%s" in t for s, t in pairs)


def test_cleaning_bounds_the_dictionary_and_catalog_entries(tmp_path):
  # Rule 5's word counts (1 to 50, each side) and rule 6's length ratio (3x, past 10 chars).
  words = lambda n: " ".join(["word"] * n)  # noqa: E731
  assert locale.clean_pair(words(50), words(49) + " wort") is not None
  assert locale.clean_pair(words(51), words(50)) is None
  assert locale.clean_pair(words(50), words(51)) is None
  assert locale.clean_pair("Open", "") is None and locale.clean_pair("", "Öffnen") is None
  assert locale.clean_pair("abcdefghijkl", "abcd") == ("abcdefghijkl", "abcd")    # 12 = 3 x 4
  assert locale.clean_pair("abcdefghijklm", "abcd") is None                       # 13 > 3 x 4
  assert locale.clean_pair("abcdefghij", "abc") == ("abcdefghij", "abc")          # 10 chars
  assert locale.clean_pair("abcdefghijk", "abc") is None                          # 11 > 3 x 3
  # The dictionary: its first sense of each side, annotations gone, two words or more each;
  # comments and lines without " :: " skipped, not the end of the file.
  (tmp_path / "ding.txt").write_text(
      "# comment\n"
      "no separator here\n"
      "eins | zwei :: one\n"
      "zwei Wege :: two ways :: double\n"
      "rotes Haus {n}; Haus :: red house; house\n"
      "ein Haus :: house\n"
      "Haus :: a house\n"
      "guten Tag | gute Nacht :: good day | good night\n", encoding="utf-8")
  assert locale.read_ding(str(tmp_path / "ding.txt")) == [
      ("two ways :: double", "zwei Wege"), ("red house", "rotes Haus"), ("good day", "guten Tag"),
      ("good night", "gute Nacht")]
  assert locale.dedupe([("a", "x"), ("a", "y"), ("a", "y"), ("a", "x"), ("a", "x")]) == [
      ("a", "x")]
  # A catalog's plural forms give their singular; a context prefix goes; empty sides are no pair.
  header = "Content-Type: text/plain; charset=UTF-8\n"
  write_mo(str(tmp_path / "c.mo"), {"": header, "file\x00files": "Datei\x00Dateien",
                                    "menu\x04a\x04b": "x", "empty": ""})
  assert sorted(locale.read_catalog(str(tmp_path / "c.mo"))) == [("a\x04b", "x"),
                                                                 ("file", "Datei")]
  # The dictionary is for German only, added to the catalogs' pairs.
  make_catalogs(tmp_path / "locale")
  write_mo(str(tmp_path / "locale" / "fr" / "LC_MESSAGES" / "a.mo"), {"": header, "Open": "Ouvrir"})
  with pytest.raises(ValueError, match="needs German, not 'fr'"):
    locale.locale_pairs(str(tmp_path / "locale"), "fr", include_ding=True,
                        ding_path=str(tmp_path / "ding.txt"))
  plain, _ = locale.locale_pairs(str(tmp_path / "locale"), "de")
  both, counts = locale.locale_pairs(str(tmp_path / "locale"), "de", include_ding=True,
                                     ding_path=str(tmp_path / "ding.txt"))
  assert counts["ding_pairs"] == 4 and set(both) >= set(plain) | {
      ("red house", "rotes Haus"), ("good day", "guten Tag"), ("good night", "gute Nacht")}
  # iso_* catalogs are passed over, and the catalogs after them still read.
  write_mo(str(tmp_path / "locale" / "fr" / "LC_MESSAGES" / "iso_639.mo"), {"": header,
                                                                         "French": "français"})
  write_mo(str(tmp_path / "locale" / "fr" / "LC_MESSAGES" / "z.mo"),
           {"": header, "Close": "Fermer"})
  assert locale.read_catalogs(str(tmp_path / "locale"), "fr") == [("Open", "Ouvrir"),
                                                                   ("Close", "Fermer")]
