"""Writing GNU .mo catalogs for the tests of the locale corpus (no gettext tools needed)."""
import os
import struct


def write_mo(path: str, messages: dict[str, str]) -> None:
  """Writes a GNU .mo catalog (little-endian, no hash table); used by tests and examples.

  `messages` should include the header entry "" -> "Content-Type: text/plain; charset=UTF-8\\n"
  for non-ASCII text, as real catalogs do.
  """
  keys = sorted(messages)
  ids = [k.encode("utf-8") for k in keys]
  strs = [messages[k].encode("utf-8") for k in keys]
  n = len(keys)
  header_size = 7 * 4
  ids_table, strs_table = header_size, header_size + 8 * n
  data_start = strs_table + 8 * n
  blob, ids_entries, strs_entries = b"", [], []
  for entries, values in ((ids_entries, ids), (strs_entries, strs)):
    for value in values:
      entries.append((len(value), data_start + len(blob)))
      blob += value + b"\0"
  out = struct.pack("<7I", 0x950412DE, 0, n, ids_table, strs_table, 0, 0)
  out += b"".join(struct.pack("<2I", *e) for e in ids_entries)
  out += b"".join(struct.pack("<2I", *e) for e in strs_entries)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "wb") as f:
    f.write(out + blob)
