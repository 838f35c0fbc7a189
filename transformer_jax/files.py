"""Files that processes share or that must survive a crash: an advisory lock for builds made
once by whichever process comes first, and a write that is whole or not at all, and on the disk.

Its own module, in the core (every layer may import it), with nothing but the standard library:
the tokenizer, the data builders, the metrics, evaluations and sweep files all write this way.
"""
import contextlib
import fcntl
import io
import os
import uuid


@contextlib.contextmanager
def file_lock(path: str):
  """An exclusive advisory lock on `path` (created if needed), for builds shared by processes."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "a") as handle:
    fcntl.flock(handle, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(handle, fcntl.LOCK_UN)


def write_atomically(path: str, data: str | bytes) -> None:
  """`data` (text as UTF-8) written to `path` whole or not at all, and durably: into a
  temporary file of this write's own beside it (two writers ending together each rename a whole
  file), flushed to the disk, renamed over `path`, and the rename flushed too. Without the
  flushes a power loss can leave `path` renamed but empty: file systems may commit a rename
  before the file's blocks. A failed write (a full disk) leaves `path` as it was and no
  temporary file, and its error names `path`."""
  # A unique name opened with open() (not tempfile's 0600 files): the umask decides who may read
  # it, as for any file the run writes.
  tmp = f"{path}.{os.getpid()}.{uuid.uuid4().hex}.tmp"
  try:
    _write_synced(tmp, data.encode("utf-8") if isinstance(data, str) else data, path)
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.unlink(tmp)
  _sync_directory(os.path.dirname(os.path.abspath(path)))


def save_figure(figure, path: str, **savefig_kwargs) -> None:
  """A matplotlib figure saved to `path` (its format from the name's extension) as
  `write_atomically` writes: drawn into memory first, so a sweep's report redrawn while a viewer
  reads it, or a kill while it draws, never leaves half an image."""
  buffer = io.BytesIO()
  kind = os.path.splitext(path)[1].lstrip(".") or None
  figure.savefig(buffer, format=kind, **savefig_kwargs)
  write_atomically(path, buffer.getvalue())


def _write_synced(tmp: str, data: bytes, path: str) -> None:
  """`data` into the new file `tmp`, on the disk when this returns. The error of a failed write
  names no file ("[Errno 28] No space left on device" from the open file) or the temporary
  one, which is gone: it is given `path`, the file the user knows."""
  try:
    with open(tmp, "xb") as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
  except OSError as e:  # the temporary file's own name would only puzzle: it is gone
    if e.errno is None:
      raise
    raise OSError(e.errno, e.strerror, path) from None


def _sync_directory(directory: str) -> None:
  """Flush `directory`'s entries (a rename into it) to the disk. Where the file system refuses
  (some network ones cannot sync a directory), only that flush is lost: the write is done."""
  with contextlib.suppress(OSError):
    fd = os.open(directory, os.O_RDONLY)
    try:
      os.fsync(fd)
    finally:
      os.close(fd)
