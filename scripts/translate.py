"""Translate text with a trained run: one output line per input line, in order.

    python scripts/translate.py --workdir runs/default "one hundred and two" "seven"
    python scripts/translate.py --workdir runs/default < sources.txt > translations.txt
    python scripts/translate.py --workdir runs/default --input sources.txt --output out.txt \
        --averaged --beam_size 4 --alpha 0.6

Parameters: the latest step of <workdir>/checkpoints, `--step N`, `--averaged` (the output of
scripts/average_checkpoints.py) or `--checkpoint PATH` (a workdir, checkpoints or averaged
directory, or one checkpoints/<step> directory). The search defaults to the run's config.json
(beam_size, length_penalty_alpha, max_len_margin). Empty lines give empty lines; a source longer
than the model's max_len - 1 pieces is truncated with a warning on stderr naming the line;
characters never seen in training become SentencePiece's unknown piece.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from transformer_jax import translate as translate_lib  # noqa: E402


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("sentences", nargs="*", help="sentences to translate (default: --input)")
  translate_lib.add_checkpoint_flags(parser)
  parser.add_argument("--input", default="-", help="file of sentences, one a line; '-' = stdin")
  parser.add_argument("--output", default="-", help="file for the translations; '-' = stdout")
  parser.add_argument("--verbose", action="store_true",
                      help="print the checkpoint, settings and search throughput on stderr")
  args = parser.parse_args(argv)
  logging.getLogger("absl").setLevel(logging.ERROR)  # Orbax's read-only notices

  try:
    translator = translate_lib.translator_from_args(args)
    if args.sentences:
      lines = list(args.sentences)
      names = [f"argument {i + 1}" for i in range(len(lines))]
    else:
      lines = translate_lib.read_lines(args.input)
      where = "stdin" if args.input == "-" else args.input
      names = [f"{where} line {i + 1}" for i in range(len(lines))]
    # Opened before translating: a bad path fails now, not after the whole search.
    out = sys.stdout if args.output == "-" else open(args.output, "w", encoding="utf-8")
  except translate_lib.USER_ERRORS as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  if args.verbose:
    print(f"translate: {translator.settings()}", file=sys.stderr)
  try:
    outputs = translator.translate(lines, names=names)
    out.write("".join(line + "\n" for line in outputs))
    out.flush()
  finally:
    if out is not sys.stdout:
      out.close()
  if args.verbose:
    print(f"translate: {translate_lib.throughput_line(translator.stats)}", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
