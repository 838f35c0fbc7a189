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

`--nbest N` (N at most the beam size; with --sample below, any N) writes the N best finished
hypotheses of each line instead, best first, one a row:
`<line>\t<rank>\t<score>\t<log-prob>\t<translation>`, lines and ranks from 1; the score is
the length-penalised one beam search ranks by, the log-probability
its natural-log probability (EOS included; greedy search: both the same). A line may get fewer
than N rows (the search stops once no live hypothesis can beat the best finished one); an
empty line gets one row with an empty translation and scores 0.

    python scripts/translate.py --workdir runs/default --beam_size 8 --nbest 8 < src.txt > nbest.tsv

`--sample` draws each translation from the model instead of searching (back-translation by
sampling, Edunov et al., 2018): each token from softmax(logits / `--temperature`), among the
`--top_k` most probable when given (their top-10 variant: `--top_k 10`), and then, with
`--top_p P` below 1, among the nucleus: the fewest most probable tokens whose probability
reaches P (Holtzman et al., 2020; after the temperature and the top-k); padding is never
drawn. Line i's draw depends on `--seed`, i (its place in the input, after `--line_offset`
lines) and the line only, not on the batch or the other lines: a file split into pieces for
several commands draws as it does whole when each piece gets, with the same seed, the number
of lines before it as `--line_offset` (which also numbers `--nbest`'s lines). With `--nbest
N`, N samples a line (any N), the most probable first, the score and the log-probability both
the sample's natural-log probability under the model (at temperature 1, without the top-k
or nucleus restriction).

The input is read, translated and written `--chunk_lines` lines at a time (default 10,000; each
chunk sorted by length and batched), flushed after each, so a long job (back-translating a large
monolingual file) holds one chunk in memory, starts writing after its first chunk (also from a
pipe), leaves every finished chunk on disk if it stops (a chunk whose write fails, on a full
disk, is cut off the file again: it ends with a whole chunk's last line), and `--verbose` says
how far it got; a line that is not UTF-8 stops it at that line's chunk, with the lines before
that chunk written and the error naming the line (the first chunk is read before the model
loads). The output does not depend on the chunk size (tested; the search batches each line
independently, and sampling keys follow the line's place; docs/decoding.md says where floating
point can differ). To go on after the first K input lines (`wc -l < out`; with --nbest, the
first field of the output's last row):
`tail -n +$((K + 1)) in.txt | translate.py ... --line_offset K >> out` with --sample or
--nbest; drop --line_offset for a plain search (refused there: nothing depends on it).

`--ensemble PATH,...` decodes more checkpoints (runs of the same model config and tokenizer,
each PATH as --checkpoint takes it) together with the first, by the mean of the models'
probabilities (docs/decoding.md).

    python scripts/translate.py --workdir runs/default --sample --top_k 10 < mono.en > bt.de
    split -l 100000 -d mono.en piece.  # then, for piece.01 (lines 100,001 to 200,000):
    python scripts/translate.py --workdir runs/default --sample --top_k 10 \
        --line_offset 100000 < piece.01 > bt.01.de
"""
import itertools
import json
import logging
import os
import stat
import sys

import _host_memory  # noqa: F401 (before jax: restarts with huge pages, see the module)
from absl import flags

from transformer_jax import cli
from transformer_jax.inference import translator as translator_lib
from transformer_jax.inference.flags import (
  define_checkpoint_flags,
  flag_line_chunks,
  open_flag_output,
  refuse_ignored,
  translator_from_flags,
)
from transformer_jax.run.workdir import RunError


def define(values):
  define_checkpoint_flags(values)
  flags.DEFINE_string("input", "-", "file of sentences, one a line; '-' = stdin",
                      flag_values=values)
  flags.DEFINE_string("output", "-", "file for the translations; '-' = stdout",
                      flag_values=values)
  flags.DEFINE_integer("nbest", None, "write the N best translations of each line (N at most "
                       "the beam size; with --sample, N samples), best first, one a row of 5 "
                       "tab-separated fields: line, rank, score, log-prob, translation",
                       lower_bound=1, flag_values=values)
  flags.DEFINE_bool("sample", False, "sample each translation from the model instead of "
                    "searching (back-translation); with --nbest N, N samples a line",
                    flag_values=values)
  flags.DEFINE_float("temperature", 1.0, "--sample: divide the logits by this (> 0; 1 = the "
                     "model's own distribution)", flag_values=values)
  flags.DEFINE_integer("top_k", 0, "--sample: draw among the k most probable tokens only (0 = "
                       "all)", lower_bound=0, flag_values=values)
  flags.DEFINE_float("top_p", 1.0, "--sample: draw among the nucleus, the fewest most "
                     "probable tokens whose probability reaches this (0 < p <= 1; 1 = all; "
                     "after --temperature and --top_k)", flag_values=values)
  flags.DEFINE_integer("seed", 0, "--sample: the random seed (line i's draws depend on it, i "
                       "and the line only)", lower_bound=0, upper_bound=2**31 - 1,
                       flag_values=values)
  flags.DEFINE_integer("line_offset", 0, "this input is a piece of a larger file, after its "
                       "first K lines: --sample draws as the whole file would, --nbest numbers "
                       "lines from K + 1", lower_bound=0, upper_bound=2**31 - 1,
                       flag_values=values)
  flags.DEFINE_integer("chunk_lines", 10000, "translate and write this many lines at a time: "
                       "what is written stays written (flushed) if the command stops; the "
                       "output is the same as in one piece", lower_bound=1,
                       flag_values=values)
  flags.DEFINE_bool("verbose", False, "print the checkpoint, settings and search throughput "
                    "on stderr", flag_values=values)


def nbest_lines(nbest, line_offset: int = 0) -> str:
  """`<line>\t<rank>\t<score>\t<log-prob>\t<translation>\n` per hypothesis, lines from
  `line_offset` + 1 and ranks from 1; a translation's own tabs and line breaks become spaces, so
  that every row has 5 fields."""
  rows = []
  for line, hypotheses in enumerate(nbest, line_offset + 1):
    for rank, (text, score, log_prob) in enumerate(hypotheses, 1):
      text = " ".join(text.replace("\t", " ").splitlines())
      rows.append(f"{line}\t{rank}\t{score:.6f}\t{log_prob:.6f}\t{text}\n")
  return "".join(rows)


def _write_all(fd: int, data: bytes) -> None:
  view = memoryview(data)
  while view:
    view = view[os.write(fd, view):]


def _write_chunk(out, text: str, lines_before: int, path: str) -> None:
  """Write one chunk's output to `out`, whole or not at all where `out` is a file (`--output`,
  or stdout sent to one): a write cut short (a full disk) is undone, so that the output ends
  after the last whole chunk, as the documented way to go on (`wc -l < out`, then the input
  after that many lines) expects."""
  try:
    fd = out.fileno()  # bytes straight to the file: no buffer of the wrapper's holds a part
    regular = stat.S_ISREG(os.fstat(fd).st_mode)
  except (AttributeError, ValueError, OSError):  # no file behind it (a test's io.StringIO)
    regular = False
  if not regular:  # a pipe or a terminal: what was written is gone anyway
    buffer = getattr(out, "buffer", None)
    if buffer is None:  # a text stream only (a test's io.StringIO)
      out.write(text)
    else:  # UTF-8 as the input is read and --output written, whatever the locale
      out.flush()
      buffer.write(text.encode("utf-8"))
    out.flush()
    return
  # The end, not the position: a shell's `>> out` opens at offset 0 in append mode.
  end = os.lseek(fd, 0, os.SEEK_END)
  try:
    _write_all(fd, text.encode("utf-8"))
  except OSError as e:
    os.ftruncate(fd, end)
    os.lseek(fd, end, os.SEEK_SET)  # `> out 2>&1`: the error follows the last line, no hole
    where = "the output (stdout)" if path == "-" else f"--output {path}"
    raise RunError(f"{where}: {e.strerror or e} while writing the translations of this input's "
                   f"lines {lines_before + 1:,} on; it ends with those of the lines before them, "
                   "each whole. To go on after them, see --help (`wc -l`, then the input from "
                   "the next line)") from None


def _reads(input_path: str, output: str) -> bool:
  """Whether the input (`-`: stdin) is the regular file the output (`-`: stdout) writes: a
  terminal or /dev/null may be both, and is no file to empty."""
  try:
    read = os.stat(sys.stdin.fileno() if input_path == "-" else input_path)
    written = os.stat(sys.stdout.fileno() if output == "-" else output)
  except (AttributeError, ValueError, OSError):  # none yet, or no file behind it (io.StringIO)
    return False
  return stat.S_ISREG(read.st_mode) and os.path.samestat(read, written)


def body(values, sentences):
  # The first chunk is read before loading the model: a bad --input fails at once. The rest
  # is read a chunk at a time, as it is translated.
  size = values.chunk_lines
  if sentences:
    refuse_ignored(values, ["input"], "when sentences are given as arguments",
                   "pass either --input or the sentences, not both")
    for i, sentence in enumerate(sentences, 1):
      try:
        sentence.encode("utf-8")
      except UnicodeEncodeError as e:  # bytes the locale could not decode (surrogate escapes)
        raise RunError(f"argument {i} is not UTF-8 (at character {e.start + 1}): pass UTF-8 "
                       "text, or put the sentences in a UTF-8 file for --input") from None
    chunks = iter([sentences[i:i + size] for i in range(0, len(sentences), size)])
    name = "argument {}".format
  else:
    if values.input == "-" and sys.stdin is not None and sys.stdin.isatty():
      # Otherwise a bare command waits without a word, and looks hung.
      print("translate: reading sentences from the terminal, one a line; end with Ctrl-D "
            "(or pass them as arguments, or --input FILE)", file=sys.stderr, flush=True)
    chunks = flag_line_chunks("input", values.input, size)
    where = "stdin" if values.input == "-" else values.input
    name = lambda i: f"{where} line {i}"  # noqa: E731 - not a format string: paths hold braces
  source, chunks = chunks, itertools.chain([next(chunks, [])], chunks)
  if values.sample:
    refuse_ignored(values, ["beam_size", "alpha"], "with --sample, which searches nothing",
                   "drop {flags}, or drop --sample to search")
  else:
    refuse_ignored(values, ["temperature", "top_k", "top_p", "seed"], "without --sample",
                   "add --sample to sample translations, or drop {flags}")
    if not values.nbest:
      refuse_ignored(values, ["line_offset"], "without --sample or --nbest",
                     "drop {flags}: a search's translations do not depend on the line's place")
  translator = translator_from_flags(values)
  if values.sample:
    translator = translator.with_sampling(values.temperature, values.top_k, values.seed,
                                          values.line_offset, top_p=values.top_p)
  if values.nbest:
    translator.check_nbest(values.nbest)
  if not sentences and _reads(values.input, values.output):
    # Opening the output would empty the input, and the reader would go on into the
    # translations written after it (stdin too: `--output F < F`; stdout: `--input F >> F`).
    given = "stdin" if values.input == "-" else "--input"
    into = "stdout" if values.output == "-" else "--output"
    raise RunError(f"{given} and {into} are the same file: writing the translations would "
                   "overwrite or extend the sentences being read; write them to another file")
  if values.output == "-" and sys.stdout is None:  # started with stdout closed (`>&-`)
    raise RunError("stdout is closed: pass --output FILE for the translations")
  # Opened before translating: a bad path fails now, not after the whole search.
  out = sys.stdout if values.output == "-" else open_flag_output("output", values.output)
  if values.verbose:
    print(f"translate: {json.dumps(translator.settings())}", file=sys.stderr)
  start = 0
  try:
    for piece in chunks:
      if not piece:  # an empty input
        continue
      end = start + len(piece)
      piece_names = [name(i) for i in range(start + 1, end + 1)]
      # A chunk draws as the same lines would in one piece: its keys follow its place.
      part = (translator.with_line_offset(values.line_offset + start) if translator.sampling
              else translator)
      if values.nbest:
        text = nbest_lines(part.translate_nbest(piece, values.nbest, names=piece_names),
                           values.line_offset + start)
      else:
        # One line a translation, whatever it holds: byte-fallback pieces can decode to a line
        # break, which would shift every later line against the input (as evaluate.py does).
        text = "".join(" ".join(line.splitlines()) + "\n"
                       for line in part.translate(piece, names=piece_names))
      _write_chunk(out, text, start, values.output)
      if values.verbose and (start or len(piece) == size):  # more than one chunk, or may be
        print(f"translate: {end:,} lines written", file=sys.stderr, flush=True)
      start = end
  finally:
    if hasattr(source, "close"):  # the input file, also when a search fails mid-way
      source.close()
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
