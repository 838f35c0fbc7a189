"""Reading text files a line at a time, the same way for corpora and for translation input.

Lines end at "\n" only (a "\r" before it is dropped), not at everything `str.splitlines()`
splits at: form feeds, U+0085 and U+2028 occur inside sentences of web-crawled corpora, and
splitting there would silently shift one of two aligned files against the other. The bytes are
decoded line by line, so a line that is not UTF-8 is an error naming the file and the line.
A leading UTF-8 byte-order mark (Notepad's and Excel's "UTF-8") is dropped: whitespace
normalisation keeps U+FEFF, so the first line would otherwise differ from the same text on
any other line.
"""
from __future__ import annotations

import codecs
import sys
from typing import BinaryIO, Iterator


class NotUTF8Error(ValueError):
  """A line of an input file that does not decode as UTF-8 (the message names file and line)."""


def read_lines(path: str) -> list[str]:
  """The lines of a UTF-8 file, or of stdin for '-', without their line endings."""
  return [line for chunk in line_chunks(path) for line in chunk]


def line_chunks(path: str, size: int | None = None) -> Iterator[list[str]]:
  """The lines of `path` (stdin for '-'), `size` at a time (None: all in one list), read as
  they are asked for: only a chunk is held, and a line that is not UTF-8 is an error when its
  chunk is read. The file is opened now, so a missing one fails here, not at the first chunk."""
  if path == "-":
    if sys.stdin is None:  # started with stdin closed (`<&-`)
      raise OSError("stdin is closed: give a file, or send the lines to stdin")
    return _chunks(sys.stdin.buffer, "stdin", size, close=False)
  return _chunks(open(path, "rb"), path, size, close=True)


def _chunks(f: BinaryIO, name: str, size: int | None, close: bool) -> Iterator[list[str]]:
  try:
    first, lines = None, []
    for number, line in enumerate(f, 1):  # binary lines end at b"\n" only
      if first is None:
        first = line
        line = line.removeprefix(codecs.BOM_UTF8)
        if not line:  # the byte-order mark alone: an empty file
          break
      try:
        text = line.removesuffix(b"\n").decode("utf-8")
      except UnicodeDecodeError as e:
        raise _not_utf8(name, number, e, first) from None
      lines.append(text[:-1] if text.endswith("\r") else text)
      if len(lines) == size:
        yield lines
        lines = []
    if lines or size is None:
      yield lines
  finally:
    if close:
      f.close()


def _not_utf8(name: str, number: int, e: UnicodeDecodeError, first: bytes) -> NotUTF8Error:
  # Excel's "Unicode Text" and Notepad's "Unicode" are UTF-16, with its byte-order mark.
  # (UTF-32's little-endian mark starts with UTF-16's.)
  wide = next((encoding for encoding, marks in (
      ("UTF-32", (codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE)),
      ("UTF-16", (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE))) if first.startswith(marks)), None)
  return NotUTF8Error(
      f"{name} line {number} is not UTF-8 ({e.reason} at byte {e.start} of the line): "
      + (f"the file is {wide} (it starts with {wide}'s byte-order mark): convert it with "
         f"`iconv -f {wide} -t UTF-8`" if wide else
         "convert it, e.g. with `iconv -f LATIN1 -t UTF-8`"))
