r"""Translate text with a trained run: one output line per input line, in order.

    python scripts/translate.py --workdir runs/default "one hundred and two" "seven"
    python scripts/translate.py --workdir runs/default < sources.txt > translations.txt
    python scripts/translate.py --workdir runs/default --input sources.txt --output out.txt \
        --averaged --beam_size 4 --alpha 0.6

Parameters: the latest step of <workdir>/checkpoints, `--step N`, `--averaged` (the output of
scripts/average_checkpoints.py) or `--checkpoint PATH` (a workdir, checkpoints or averaged
directory, or one checkpoints/<step> directory). The search defaults to the run's config.json
(beam_size, length_penalty_alpha, max_len_margin; --alpha needs a beam of 2 or more). Empty
lines give empty lines; a source longer than the model's max_len - 1 pieces gets a warning on
stderr naming the line, and is read whole as evaluate.py reads it (cut to max_len - 1 pieces
only where the model has a learned position table); characters never seen in training become
SentencePiece's unknown piece. Lines end at line feeds only (a lone carriage return is warned
about).
"""
import json
import logging
import sys

from absl import flags

from transformer_jax import cli
from transformer_jax.inference import translator as translator_lib
from transformer_jax.inference.flags import (
  define_checkpoint_flags,
  open_flag_output,
  read_flag_lines,
  refuse_ignored,
  translator_from_flags,
)


def define(values):
  define_checkpoint_flags(values)
  flags.DEFINE_string("input", "-", "file of sentences, one a line; '-' = stdin",
                      flag_values=values)
  flags.DEFINE_string("output", "-", "file for the translations; '-' = stdout",
                      flag_values=values)
  flags.DEFINE_bool("verbose", False, "print the checkpoint, settings and search throughput "
                    "on stderr", flag_values=values)


def body(values, sentences):
  # Read before loading the model: a bad --input fails at once.
  if sentences:
    refuse_ignored(values, ["input"], "when sentences are given as arguments",
                   "pass either --input or the sentences, not both")
    names = [f"argument {i + 1}" for i in range(len(sentences))]
  else:
    if values.input == "-" and sys.stdin.isatty():
      # Otherwise a bare command waits without a word, and looks hung.
      print("translate: reading sentences from the terminal, one a line; end with Ctrl-D "
            "(or pass them as arguments, or --input FILE)", file=sys.stderr, flush=True)
    sentences = read_flag_lines("input", values.input)
    where = "stdin" if values.input == "-" else values.input
    names = [f"{where} line {i + 1}" for i in range(len(sentences))]
  translator = translator_from_flags(values)
  # Opened before translating: a bad path fails now, not after the whole search.
  out = sys.stdout if values.output == "-" else open_flag_output("output", values.output)
  if values.verbose:
    print(f"translate: {json.dumps(translator.settings())}", file=sys.stderr)
  try:
    out.write("".join(line + "\n" for line in translator.translate(sentences, names=names)))
    out.flush()
  finally:
    if out is not sys.stdout:
      out.close()
  if values.verbose:
    print(f"translate: {translator_lib.throughput_line(translator.stats)}", file=sys.stderr)
  return 0


def main(argv=None):
  return cli.run(body, argv, doc=__doc__, define=define, positional=True,
                 absl_level=logging.ERROR)


if __name__ == "__main__":
  sys.exit(main())
