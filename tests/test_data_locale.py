"""The gettext corpus: cleaning rules, a small .mo catalog, errors, the machine's catalogs."""

import pytest

from transformer_jax.data import default_data_config, get_data, locale

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
              "..."]:
    assert locale.clean_message(bad) is None, bad
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


@pytest.mark.skipif(not locale.catalog_paths(locale.DEFAULT_LOCALE_DIR, "de"),
                    reason="no German gettext catalogs under /usr/share/locale on this machine")
def test_the_machines_catalogs():
  pairs, counts = locale.locale_pairs(locale.DEFAULT_LOCALE_DIR, "de")
  assert counts["raw_pairs"] > 5000 and len(pairs) > 2000
  sources = [s for s, _ in pairs]
  assert len(set(sources)) == len(sources)
  assert not any("\n" in s or "%s" in s or "%s" in t for s, t in pairs)
