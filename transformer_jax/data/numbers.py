"""The built-in translation task: English sentences with numbers, dates and times into German.

A real sequence-to-sequence problem small enough for a tiny Transformer to learn in minutes on a
CPU, yet with the phenomena that make translation more than copying:

* a genuine vocabulary (about 250 English and 300 German words);
* German number words, written as one word with the units before the tens
  (327 -> "dreihundertsiebenundzwanzig"), from English digits *or* English words;
* agreement: "1 red dog" -> "einen roten Hund", "27 red cows" -> "siebenundzwanzig rote Kühe";
* reordering: English simple past becomes the German perfect with the participle at the end,
  a fronted adverbial puts the verb second ("Gestern hat der Bauer ... gekauft"), and a
  subordinate clause puts the verb last ("..., dass der Bauer ... gekauft hat");
* lengths that differ in both directions (digits grow into long words, "bought" -> "hat gekauft").

The grammar is a function of the English sentence: every English source has exactly one German
reference, so a perfect model can reach sacreBLEU 100. `generate_pairs` is deterministic for a
seed and assigns each sentence to a split by a hash of its source, so the splits never share one.

Conventions for numbers (kept consistent everywhere): 1 -> "eins", 100 -> "einhundert",
101 -> "einhunderteins", 121 -> "einhunderteinundzwanzig", 1 in compounds is "ein"; English words
are American style without "and": 327 -> "three hundred twenty-seven".
"""
from __future__ import annotations

import hashlib
import random

# ----------------------------------------------------------------------------------------------
# Number words.

_EN_ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
            "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
            "eighteen", "nineteen"]
_EN_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]

_DE_ONES = ["null", "eins", "zwei", "drei", "vier", "fünf", "sechs", "sieben", "acht", "neun",
            "zehn", "elf", "zwölf", "dreizehn", "vierzehn", "fünfzehn", "sechzehn", "siebzehn",
            "achtzehn", "neunzehn"]
_DE_TENS = ["", "", "zwanzig", "dreißig", "vierzig", "fünfzig", "sechzig", "siebzig", "achtzig",
            "neunzig"]


def english_number(n: int) -> str:
  """0..999 as American English words: 327 -> 'three hundred twenty-seven'."""
  if not 0 <= n <= 999:
    raise ValueError(f"english_number: {n} outside 0..999")
  if n < 20:
    return _EN_ONES[n]
  if n < 100:
    tens, ones = divmod(n, 10)
    return _EN_TENS[tens] + (f"-{_EN_ONES[ones]}" if ones else "")
  hundreds, rest = divmod(n, 100)
  return f"{_EN_ONES[hundreds]} hundred" + (f" {english_number(rest)}" if rest else "")


def _german_below_100(n: int, final: bool) -> str:
  # `final`: the number ends here, so a lone 1 is "eins"; inside a compound it is "ein".
  if n == 1:
    return "eins" if final else "ein"
  if n < 20:
    return _DE_ONES[n]
  tens, ones = divmod(n, 10)
  if ones == 0:
    return _DE_TENS[tens]
  unit = "ein" if ones == 1 else _DE_ONES[ones]
  return f"{unit}und{_DE_TENS[tens]}"  # units before tens: 27 -> sieben-und-zwanzig


def german_number(n: int, final: bool = True) -> str:
  """0..9999 as one German word: 27 -> 'siebenundzwanzig', 101 -> 'einhunderteins'.

  `final=False` gives the form used before a noun or "Uhr" where 1 is "ein" (never "eins").
  """
  if not 0 <= n <= 9999:
    raise ValueError(f"german_number: {n} outside 0..9999")
  if n == 0:
    return "null"
  thousands, rest = divmod(n, 1000)
  hundreds, rest = divmod(rest, 100)
  word = ""
  if thousands:
    word += ("ein" if thousands == 1 else _DE_ONES[thousands]) + "tausend"
  if hundreds:
    word += ("ein" if hundreds == 1 else _DE_ONES[hundreds]) + "hundert"
  if rest:
    word += _german_below_100(rest, final)
  return word


def german_year(year: int) -> str:
  """Years are read in hundreds before 2000: 1987 -> 'neunzehnhundertsiebenundachtzig'."""
  if 1100 <= year <= 1999:
    century, rest = divmod(year, 100)
    return _DE_ONES[century] + "hundert" + (_german_below_100(rest, True) if rest else "")
  return german_number(year)


def german_ordinal(n: int) -> str:
  """Day of the month in the dative after "am": 3 -> 'dritten', 27 -> 'siebenundzwanzigsten'."""
  irregular = {1: "ersten", 3: "dritten", 7: "siebten", 8: "achten"}
  if n in irregular:
    return irregular[n]
  if n < 20:
    return german_number(n) + "ten"
  return german_number(n) + "sten"


# ----------------------------------------------------------------------------------------------
# Lexicon. Each English word has exactly one German translation, which keeps references unique.

# English singular, English plural, German gender (m/f/n), German singular, German plural.
NOUNS = [
    ("cow", "cows", "f", "Kuh", "Kühe"), ("dog", "dogs", "m", "Hund", "Hunde"),
    ("cat", "cats", "f", "Katze", "Katzen"), ("horse", "horses", "n", "Pferd", "Pferde"),
    ("bird", "birds", "m", "Vogel", "Vögel"), ("house", "houses", "n", "Haus", "Häuser"),
    ("car", "cars", "n", "Auto", "Autos"), ("book", "books", "n", "Buch", "Bücher"),
    ("apple", "apples", "m", "Apfel", "Äpfel"), ("egg", "eggs", "n", "Ei", "Eier"),
    ("chair", "chairs", "m", "Stuhl", "Stühle"), ("table", "tables", "m", "Tisch", "Tische"),
    ("bottle", "bottles", "f", "Flasche", "Flaschen"), ("cup", "cups", "f", "Tasse", "Tassen"),
    ("letter", "letters", "m", "Brief", "Briefe"), ("ticket", "tickets", "f", "Karte", "Karten"),
    ("flower", "flowers", "f", "Blume", "Blumen"), ("tree", "trees", "m", "Baum", "Bäume"),
    ("ship", "ships", "n", "Schiff", "Schiffe"), ("train", "trains", "m", "Zug", "Züge"),
    ("bicycle", "bicycles", "n", "Fahrrad", "Fahrräder"), ("key", "keys", "m", "Schlüssel",
                                                            "Schlüssel"),
    ("box", "boxes", "f", "Kiste", "Kisten"), ("bag", "bags", "f", "Tasche", "Taschen"),
    ("shoe", "shoes", "m", "Schuh", "Schuhe"), ("shirt", "shirts", "n", "Hemd", "Hemden"),
    ("hat", "hats", "m", "Hut", "Hüte"), ("picture", "pictures", "n", "Bild", "Bilder"),
    ("lamp", "lamps", "f", "Lampe", "Lampen"), ("window", "windows", "n", "Fenster", "Fenster"),
    ("door", "doors", "f", "Tür", "Türen"), ("stone", "stones", "m", "Stein", "Steine"),
    ("glass", "glasses", "n", "Glas", "Gläser"), ("plate", "plates", "m", "Teller", "Teller"),
    ("spoon", "spoons", "m", "Löffel", "Löffel"), ("knife", "knives", "n", "Messer", "Messer"),
    ("coat", "coats", "m", "Mantel", "Mäntel"), ("ball", "balls", "m", "Ball", "Bälle"),
    ("clock", "clocks", "f", "Uhr", "Uhren"), ("pencil", "pencils", "m", "Bleistift",
                                                 "Bleistifte"),
    ("newspaper", "newspapers", "f", "Zeitung", "Zeitungen"), ("boat", "boats", "n", "Boot",
                                                               "Boote"),
    ("goat", "goats", "f", "Ziege", "Ziegen"), ("pig", "pigs", "n", "Schwein", "Schweine"),
    ("chicken", "chickens", "n", "Huhn", "Hühner"), ("duck", "ducks", "f", "Ente", "Enten"),
    ("computer", "computers", "m", "Computer", "Computer"), ("phone", "phones", "n", "Telefon",
                                                             "Telefone"),
]

# English adjective, German stem (declined: plural -e, singular by gender after ein/der).
ADJECTIVES = [
    ("red", "rot"), ("blue", "blau"), ("green", "grün"), ("black", "schwarz"),
    ("white", "weiß"), ("yellow", "gelb"), ("small", "klein"), ("big", "groß"), ("old", "alt"),
    ("new", "neu"), ("cheap", "billig"), ("beautiful", "schön"), ("heavy", "schwer"),
    ("light", "leicht"), ("clean", "sauber"), ("broken", "kaputt"),
]

# English subject, German subject, person (1s = ich, 3s, 1p = wir, 3p).
SUBJECTS = [
    ("I", "ich", "1s"), ("he", "er", "3s"), ("she", "sie", "3s"), ("we", "wir", "1p"),
    ("they", "sie", "3p"), ("the farmer", "der Bauer", "3s"), ("the teacher", "die Lehrerin", "3s"),
    ("my brother", "mein Bruder", "3s"), ("my sister", "meine Schwester", "3s"),
    ("our neighbour", "unser Nachbar", "3s"), ("the child", "das Kind", "3s"),
    ("the children", "die Kinder", "3p"), ("the doctor", "der Arzt", "3s"),
    ("the old man", "der alte Mann", "3s"), ("the young woman", "die junge Frau", "3s"),
    ("the students", "die Studenten", "3p"), ("my parents", "meine Eltern", "3p"),
    ("the baker", "der Bäcker", "3s"), ("the girl", "das Mädchen", "3s"),
    ("the boy", "der Junge", "3s"), ("his friend", "sein Freund", "3s"),
    ("her mother", "ihre Mutter", "3s"), ("the company", "die Firma", "3s"),
    ("the shop", "der Laden", "3s"), ("the workers", "die Arbeiter", "3p"),
]

# English (3s present, other present, past); German (1s, 3s, plural present), participle.
# Every perfect is formed with "haben", so the auxiliary only depends on the person.
VERBS = [
    (("buys", "buy", "bought"), ("kaufe", "kauft", "kaufen"), "gekauft"),
    (("sells", "sell", "sold"), ("verkaufe", "verkauft", "verkaufen"), "verkauft"),
    (("sees", "see", "saw"), ("sehe", "sieht", "sehen"), "gesehen"),
    (("has", "have", "had"), ("habe", "hat", "haben"), "gehabt"),
    (("needs", "need", "needed"), ("brauche", "braucht", "brauchen"), "gebraucht"),
    (("finds", "find", "found"), ("finde", "findet", "finden"), "gefunden"),
    (("counts", "count", "counted"), ("zähle", "zählt", "zählen"), "gezählt"),
    (("orders", "order", "ordered"), ("bestelle", "bestellt", "bestellen"), "bestellt"),
    (("paints", "paint", "painted"), ("male", "malt", "malen"), "gemalt"),
    (("carries", "carry", "carried"), ("trage", "trägt", "tragen"), "getragen"),
    (("brings", "bring", "brought"), ("bringe", "bringt", "bringen"), "gebracht"),
    (("wants", "want", "wanted"), ("will", "will", "wollen"), "gewollt"),
    (("loses", "lose", "lost"), ("verliere", "verliert", "verlieren"), "verloren"),
    (("cleans", "clean", "cleaned"), ("putze", "putzt", "putzen"), "geputzt"),
]
PAY = (("pays", "pay", "paid"), ("zahle", "zahlt", "zahlen"), "gezahlt")
_HABEN = {"1s": "habe", "3s": "hat", "1p": "haben", "3p": "haben"}

# Verbs of saying and thinking that introduce "that"-clauses (present tense only).
REPORTING = [
    (("says", "say"), ("sage", "sagt", "sagen")),
    (("thinks", "think"), ("denke", "denkt", "denken")),
    (("knows", "know"), ("weiß", "weiß", "wissen")), (("hears", "hear"), ("höre", "hört", "hören")),
    (("believes", "believe"), ("glaube", "glaubt", "glauben")),
]

DAYS = [("Monday", "Montag"), ("Tuesday", "Dienstag"), ("Wednesday", "Mittwoch"),
        ("Thursday", "Donnerstag"), ("Friday", "Freitag"), ("Saturday", "Samstag"),
        ("Sunday", "Sonntag")]
MONTHS = [("January", "Januar", 31), ("February", "Februar", 28), ("March", "März", 31),
          ("April", "April", 30), ("May", "Mai", 31), ("June", "Juni", 30),
          ("July", "Juli", 31), ("August", "August", 31), ("September", "September", 30),
          ("October", "Oktober", 31), ("November", "November", 30),
          ("December", "Dezember", 31)]
# Adverbials by tense: (English, German). Past-only and present-only keep the tenses plausible.
ADVERBS_PAST = [("yesterday", "gestern"), ("last week", "letzte Woche"),
                ("last year", "letztes Jahr"), ("this morning", "heute Morgen")]
ADVERBS_PRESENT = [("today", "heute"), ("every day", "jeden Tag"), ("now", "jetzt"),
                   ("often", "oft"), ("this evening", "heute Abend")]


# ----------------------------------------------------------------------------------------------
# Phrases.

def _person_index(person: str) -> int:
  return {"1s": 0, "3s": 1, "1p": 2, "3p": 2}[person]


def _english_verb(forms: tuple[str, ...], person: str, past: bool) -> str:
  if past:
    return forms[2]
  return forms[0] if person == "3s" else forms[1]


def _quantity(rng: random.Random) -> tuple[str, str]:
  """A counted noun phrase in the accusative: ('27 red cows', 'siebenundzwanzig rote Kühe')."""
  en_sg, en_pl, gender, de_sg, de_pl = rng.choice(NOUNS)
  # Small numbers are more frequent, as in real text; 1 exercises the singular agreement.
  n = rng.choice([1, rng.randint(2, 20), rng.randint(2, 99), rng.randint(2, 999)])
  as_words = rng.random() < 0.5
  adjective = rng.choice(ADJECTIVES) if rng.random() < 0.35 else None
  en_num = english_number(n) if as_words else str(n)
  en_noun = en_sg if n == 1 else en_pl
  en = f"{en_num} {adjective[0]} {en_noun}" if adjective else f"{en_num} {en_noun}"
  if n == 1:
    # Indefinite article in the accusative; the adjective takes the mixed declension.
    article = {"m": "einen", "f": "eine", "n": "ein"}[gender]
    ending = {"m": "en", "f": "e", "n": "es"}[gender]
    de = f"{article} {adjective[1]}{ending} {de_sg}" if adjective else f"{article} {de_sg}"
  else:
    number = german_number(n)
    de = f"{number} {adjective[1]}e {de_pl}" if adjective else f"{number} {de_pl}"
  return en, de


def _price(rng: random.Random) -> tuple[str, str]:
  """'27 euros for the dog' -> 'siebenundzwanzig Euro für den Hund' (accusative article)."""
  en_sg, _, gender, de_sg, _ = rng.choice(NOUNS)
  n = rng.choice([1, rng.randint(2, 99), rng.randint(2, 999)])
  en_num = english_number(n) if rng.random() < 0.5 else str(n)
  en_unit = "euro" if n == 1 else "euros"
  de_amount = "einen Euro" if n == 1 else f"{german_number(n)} Euro"
  article = {"m": "den", "f": "die", "n": "das"}[gender]
  return f"{en_num} {en_unit} for the {en_sg}", f"{de_amount} für {article} {de_sg}"


def _fronted_adverbial(rng: random.Random, past: bool) -> tuple[str, str]:
  """A time expression that can open the sentence; German then inverts subject and verb."""
  kind = rng.randrange(5)
  if kind == 0:
    return rng.choice(ADVERBS_PAST if past else ADVERBS_PRESENT)
  if kind == 1:
    en_day, de_day = rng.choice(DAYS)
    return f"on {en_day}", f"am {de_day}"
  if kind == 2:
    en_month, de_month, days = rng.choice(MONTHS)
    day = rng.randint(1, days)
    return f"on {en_month} {day}", f"am {german_ordinal(day)} {de_month}"
  if kind == 3:
    year = rng.randint(1950, 2029) if past else rng.randint(2024, 2029)
    return f"in {year}", f"im Jahr {german_year(year)}"
  hour, minute = rng.randint(1, 12), rng.choice([0, 5, 10, 15, 20, 30, 40, 45, rng.randint(0, 59)])
  de_time = f"um {german_number(hour, final=False)} Uhr"
  if minute:
    de_time += f" {german_number(minute)}"
  return f"at {hour}:{minute:02d}", de_time


def _capitalize(text: str) -> str:
  return text[0].upper() + text[1:]


def sentence(rng: random.Random) -> tuple[str, str]:
  """One (English, German) pair drawn from the grammar."""
  en_subj, de_subj, person = rng.choice(SUBJECTS)
  past = rng.random() < 0.5
  if rng.random() < 0.15:
    # Prices go with "pay" only: "pays 27 euros for the dog" -> "zahlt ... für den Hund".
    en_forms, de_forms, participle = PAY
    en_obj, de_obj = _price(rng)
  else:
    en_forms, de_forms, participle = rng.choice(VERBS)
    en_obj, de_obj = _quantity(rng)
  en_verb = _english_verb(en_forms, person, past)
  de_finite = _HABEN[person] if past else de_forms[_person_index(person)]
  de_rest = f" {participle}" if past else ""
  en_clause = f"{en_subj} {en_verb} {en_obj}"

  kind = rng.randrange(3)
  if kind == 0:  # Main clause: subject, verb second, participle last.
    en = en_clause
    de = f"{de_subj} {de_finite} {de_obj}{de_rest}"
  elif kind == 1:  # Fronted adverbial: the verb stays second, so the subject follows it.
    en_adv, de_adv = _fronted_adverbial(rng, past)
    en = f"{en_adv} {en_clause}"
    de = f"{de_adv} {de_finite} {de_subj} {de_obj}{de_rest}"
  else:  # Subordinate clause: the finite verb goes to the very end.
    en_rsubj, de_rsubj, rperson = rng.choice(SUBJECTS)
    en_rforms, de_rforms = rng.choice(REPORTING)
    en_rverb = en_rforms[0] if rperson == "3s" else en_rforms[1]
    de_rverb = de_rforms[_person_index(rperson)]
    en = f"{en_rsubj} {en_rverb} that {en_clause}"
    de = f"{de_rsubj} {de_rverb}, dass {de_subj} {de_obj}{de_rest} {de_finite}"
  # "I" is capitalised anyway; German sentence case keeps nouns capitalised as in the lexicon.
  return _capitalize(en) + ".", _capitalize(de) + "."


# ----------------------------------------------------------------------------------------------
# Splits.

SPLITS = ("train", "validation", "test")


def held_out_share(num_train: int, num_validation: int, num_test: int) -> int:
  """The per-mille of sources `generate_pairs` hashes into validation and into test each, tuned
  so that the held-out splits fill at about the rate of train."""
  return max(1, min(300, round(1000 * max(num_validation, num_test)
                               / max(1, num_train + num_validation + num_test))))


def split_of(source: str, held_out_per_mille: int = 20) -> str:
  """Split assignment by a hash of the source sentence: a source is always in the same split.

  The first `held_out_per_mille` buckets of 1,000 go to validation, the next as many to test.
  """
  bucket = int.from_bytes(hashlib.sha256(source.encode("utf-8")).digest()[:8], "big") % 1000
  if bucket < held_out_per_mille:
    return "validation"
  if bucket < 2 * held_out_per_mille:
    return "test"
  return "train"


def generate_pairs(num_train: int, num_validation: int, num_test: int, seed: int = 0,
                   reverse: bool = False) -> dict[str, list[tuple[str, str]]]:
  """Unique (source, target) pairs per split, deterministic for the seed.

  Sentences are drawn until every split is full; a source that was seen before, or whose
  split is already full, is skipped, so the splits are disjoint by source. The source is
  English, or German when `reverse`: German to English is not a function ("1 cow" and "one
  cow" are both "eine Kuh"), so that direction keeps the first English sentence drawn for
  each German one and cannot be learned to BLEU 100.
  """
  wanted = {"train": num_train, "validation": num_validation, "test": num_test}
  out: dict[str, list[tuple[str, str]]] = {split: [] for split in SPLITS}
  seen: dict[str, str] = {}
  seen_reverse: set[str] = set()
  rng = random.Random(seed)
  held_out = held_out_share(num_train, num_validation, num_test)
  draws, max_draws = 0, 50 * sum(wanted.values()) + 1000
  while any(len(out[s]) < wanted[s] for s in SPLITS):
    draws += 1
    if draws > max_draws:
      raise RuntimeError(f"numbers: could not draw {wanted} unique sentences "
                         f"in {max_draws} draws; ask for fewer")
    en, de = sentence(rng)
    if en in seen:
      if seen[en] != de:  # Guards the grammar's promise of one reference per source.
        raise AssertionError(f"two references for {en!r}: {seen[en]!r}, {de!r}")
      continue
    seen[en] = de
    source, target = (de, en) if reverse else (en, de)
    if reverse:
      if de in seen_reverse:
        continue
      seen_reverse.add(de)
    split = split_of(source, held_out)
    if len(out[split]) < wanted[split]:
      out[split].append((source, target))
  return out


