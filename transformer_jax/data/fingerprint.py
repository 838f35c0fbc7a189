"""What a run's corpus was, file by file, so a resume can tell when the files changed under it.

    inputs = fingerprint(config.data)        # {path: {"bytes", "mtime_ns", "sha256", ...}}
    changed(inputs)                          # [] or ["corpus.tsv: its content changed", ...]

The local builders ("text", "locale") name their TFDS build after the input files' sizes and
modification times, so a corpus edited in place is rebuilt on the next start, with other
splits, under the tokenizer and the data position of the old one. The workdir records this
fingerprint (`config.json`'s `resolved_data`) and a resume compares it (`run.workdir`). The
content's SHA-256 decides: a file only touched or copied (a new time, the same bytes) is the
same corpus, and one rewritten with its old size and time put back is not. Hashing takes about
a second a gigabyte, so a file is read again only when it may have changed: each entry also
records the file's inode, device and status change time (`ctime`), which the kernel sets at
every write(), truncate or rename and no user can set back (`touch -r` sets the modification
time, and so moves `ctime`); a file whose inode, device, size and both times are the recorded
ones has not been written since. Within a process a file is hashed once for as long as they
stay the same. A file written in the last `SETTLED_NS` (2 s), or on a file system not known to
keep its ctime (`CTIME_KEPT`: sshfs and other FUSE mounts may report ctime = mtime), is hashed
at every look, and its entry records no inode or ctime. (Stores through a shared mmap after
the first to a page move no time: not guarded against.)

    record(config.data)                      # {"inputs": fingerprint, "roles": {field: path}}
    matches(recorded_record, config.data)    # the same bytes, each file in the same role

A text corpus's two files are told apart by the field naming each (`roles`): the same two files
with `source_path` and `target_path` swapped hold the same bytes but train the other direction.
"""
from __future__ import annotations

import functools
import hashlib
import os
import time

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


# {(path, device, inode, size, mtime, ctime): SHA-256} of the files this process has hashed.
_HASHED: dict[tuple, str] = {}
# A file written this recently might be written again within one tick of the file system's
# clock, its times unmoved (git's "racy" index entries): it is hashed every time it is looked at.
SETTLED_NS = 2 * 10**9


def _untouched_key(stat: os.stat_result) -> tuple:
  """What any write to the file, or its replacement by another, changes."""
  return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


def _memo_key(path: str, stat: os.stat_result) -> tuple:
  """The file's key in `_HASHED`."""
  return (path,) + _untouched_key(stat)


# File systems whose kernel driver keeps ctime apart from mtime (a write or `touch -r` moves
# it). FUSE mounts such as sshfs may report ctime = mtime, and others are not known: their files
# are hashed at every look.
CTIME_KEPT = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "tmpfs", "overlay",
                        "nfs", "nfs4", "lustre", "gpfs", "f2fs"})
MOUNTINFO = "/proc/self/mountinfo"


@functools.cache
def _fs_type(device: int) -> str | None:
  """The type of the file system mounted from `device` (`/proc/self/mountinfo`), or None."""
  wanted = f"{os.major(device)}:{os.minor(device)}"
  try:
    with open(MOUNTINFO) as f:
      for line in f:
        # "ID PARENT MAJOR:MINOR ROOT MOUNT OPTIONS [OPTIONAL...] - TYPE SOURCE OPTIONS"
        if line.split()[2:3] == [wanted] and " - " in line:
          return line.partition(" - ")[2].split()[0]
  except OSError:
    pass
  return None


def _stat(path: str) -> os.stat_result:
  """The file's status from an open file: NFS answers a bare stat() from its attribute cache
  (up to a minute old), an open checks with the server (close-to-open)."""
  with open(path, "rb") as f:
    return os.fstat(f.fileno())


def _settled(stat: os.stat_result) -> bool:
  """Whether the file's inode and times can stand for its content: written at least
  `SETTLED_NS` ago, on a file system that keeps its ctime (this host's clock and a file
  server's assumed within a second of each other)."""
  return (time.time_ns() - max(stat.st_ctime_ns, stat.st_mtime_ns) >= SETTLED_NS
          and _fs_type(stat.st_dev) in CTIME_KEPT)


def _content_sha256(path: str, stat: os.stat_result) -> str:
  if not _settled(stat):
    return _sha256(path)
  key = _memo_key(path, stat)
  if key not in _HASHED:
    _HASHED[key] = _sha256(path)
  return _HASHED[key]


def _entry(path: str) -> dict:
  stat = _stat(path)
  entry = {"bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}
  if _settled(stat):  # else no later look may skip reading it (`_untouched`)
    entry.update(ctime_ns=stat.st_ctime_ns, inode=stat.st_ino, device=stat.st_dev)
  return {**entry, "sha256": _content_sha256(path, stat)}


def _untouched(was: dict, stat: os.stat_result) -> bool:
  """Whether the file `stat` describes is the one recorded as `was`, not written since (never
  for an entry without inode and ctime: recorded before 2026-12-07, or of a file written just
  before)."""
  recorded = tuple(was.get(k) for k in ("device", "inode", "bytes", "mtime_ns", "ctime_ns"))
  return None not in recorded and recorded == _untouched_key(stat)


def fingerprint(c) -> dict:
  """{absolute path: size, modification time and SHA-256} of `input_files(c)` that exist."""
  return {p: _entry(p) for p in input_files(c) if os.path.exists(p)}


# How `changed` says a file is gone (`run.workdir` tells a moved corpus by it).
GONE = "no longer exists"


def changed(recorded: dict) -> list[str]:
  """What differs between the files now and `recorded` (a `fingerprint`): one line per file."""
  out = []
  for path, was in sorted(recorded.items()):
    if not os.path.exists(path):
      out.append(f"{path}: {GONE}")
      continue
    # Size and modification time alone would not do: a file rewritten with its old time put
    # back (`touch -r`) would pass, and the build, named by size and time, would stay the old
    # one here but not on a rebuild (another data_dir). Its ctime has moved, though.
    stat = _stat(path)
    if _untouched(was, stat):
      _HASHED[_memo_key(path, stat)] = was["sha256"]  # for a record made next
      continue
    if _content_sha256(path, stat) != was["sha256"]:
      out.append(f"{path}: its content changed ({was['bytes']:,} -> {stat.st_size:,} bytes)")
  return out


def roles(c) -> dict:
  """{data field: absolute path} of a "text" corpus's files ({} for other corpora: the locale
  catalogs are read by their names)."""
  if c.dataset != "text":
    return {}
  fields = ["tsv_path"] if c.tsv_path else ["source_path", "target_path"]
  return {f: os.path.abspath(c[f]) for f in fields if c[f]}


def record(c) -> dict:
  """What a run records of its corpus (config.json's `resolved_data`, and beside the tokenizer
  in spm.model.json): each file's `fingerprint` and which field named it."""
  return {"inputs": fingerprint(c), "roles": roles(c)}


def recorded_roles(recorded: dict, data: dict | None = None) -> dict:
  """{field: recorded path} of a `record`; for one made before roles were recorded
  (2026-11-25), found from the run's data config `data` (its paths as given, relative to the
  directory it ran in): the recorded path that ends with each. Fields it cannot place are
  left out."""
  if "roles" in recorded:
    return dict(recorded["roles"])
  out = {}
  for field in ("tsv_path", "source_path", "target_path"):
    given = (data or {}).get(field)
    if not given:
      continue
    given = os.path.normpath(given)
    tail = given
    while tail.startswith(".." + os.sep):  # "../a/src.txt": the recorded path ends a/src.txt
      tail = tail[3:]
    found = [p for p in recorded.get("inputs", {})
             if p == given or p.endswith(os.sep + tail.lstrip(os.sep))]
    if len(found) == 1:
      out[field] = found[0]
  return out


def matches(recorded: dict, c, data: dict | None = None) -> bool:
  """Whether the files data config `c` names hold the bytes `recorded` (a `record`) has, each
  text file in the role it had (`recorded_roles`; `data`: the recorded data config, for records
  without roles). Paths may differ: a corpus moved, or named from another directory."""
  inputs = recorded.get("inputs") or {}
  now = fingerprint(c)
  if len(now) != len(input_files(c)) or sorted(e["sha256"] for e in now.values()) != sorted(
      e["sha256"] for e in inputs.values()):
    return False
  current, then = roles(c), recorded_roles(recorded, data)
  if "roles" not in recorded and len({e["sha256"] for e in inputs.values()}) > 1 and any(
      (data or {}).get(f) and f not in then for f in ("source_path", "target_path")):
    return False  # two different files whose roles the record cannot tell: not the same corpus
  for field, path in then.items():
    if path not in inputs or current.get(field) not in now:
      return False
    if now[current[field]]["sha256"] != inputs[path]["sha256"]:
      return False
  return True
