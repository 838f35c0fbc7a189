r"""The comparison points of the CPU targets: the official Flax `examples/wmt` model and search.

    python scripts/baseline_flax_wmt.py [steps]         # train step; default 30 steps
    python scripts/baseline_flax_wmt.py --what decode --beams 1,4 [--steps 5] \
        [--rows 16 --source_len 64 --decode_len 64]

Each prints one JSON line. `train` (transformer_jax/bench/flax_wmt.py): the example's model in
the CPU reference setting of `configs/cpu_reference.py`, float32, the median step time over
`steps` steps after 3 warm-up steps, like `scripts/benchmark.py --what train --config
configs/cpu_reference.py`. `decode` (transformer_jax/bench/flax_wmt_search.py): the example's
beam search (beam 1: an argmax loop on its model and cache), random parameters, every sentence
`decode_len` tokens, the median over `steps` calls, like `scripts/benchmark.py --what decode
--config configs/cpu_reference.py`. Run the two alternately: the machine's speed moves from
minute to minute (docs/benchmarks.md).

Unlike `scripts/benchmark.py`, it does not restart itself with huge pages for its host memory
(scripts/_host_memory.py): it runs with glibc's defaults, as the Flax example does;
`GLIBC_TUNABLES=glibc.malloc.hugetlb=1` in its environment gives it what the benchmark runs
with.
"""
import functools
import json
import sys

from absl import flags

from transformer_jax import cli
from transformer_jax.bench import flax_wmt


def define(values):
  integer = functools.partial(flags.DEFINE_integer, flag_values=values, lower_bound=1)
  flags.DEFINE_enum("what", "train", ["train", "decode"], "what to measure", flag_values=values)
  integer("steps", None, f"train steps (default {flax_wmt.DEFAULT_STEPS}) / decode calls "
          "(default 5) timed; the median is reported")
  flags.DEFINE_string("beams", "1,4", "decode: comma-separated beam sizes (1: greedy)",
                      flag_values=values)
  integer("rows", 16, "decode: sentences per batch")
  integer("source_len", 64, "decode: source tokens per sentence")
  integer("decode_len", 64, "decode: output tokens per sentence")


def body(values, args):
  if len(args) > 1 or (args and not (args[0].isdigit() and int(args[0]) >= 1)):
    print(f"error: expected at most one argument, the number of steps (>= 1); got {args}",
          file=sys.stderr)
    return 2
  steps = int(args[0]) if args else values.steps
  if values.what == "train":
    print(json.dumps(flax_wmt.run(steps or flax_wmt.DEFAULT_STEPS)))
    return 0
  beams = values.beams.split(",")
  if not all(b.isdigit() and int(b) >= 1 for b in beams):
    print(f"error: --beams={values.beams}: expected beam sizes >= 1, e.g. 1,4", file=sys.stderr)
    return 2
  from transformer_jax.bench import flax_wmt_search  # pylint: disable=import-outside-toplevel
  print(json.dumps(flax_wmt_search.run(
      tuple(int(b) for b in beams), rows=values.rows, source_len=values.source_len,
      decode_len=values.decode_len, calls=steps or 5)))
  return 0


def main(argv=None):
  return cli.run(body, argv, doc=__doc__, define=define, positional=True)


if __name__ == "__main__":
  sys.exit(main())
