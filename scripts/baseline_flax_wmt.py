"""The comparison point of the CPU target: the official Flax `examples/wmt` model, condensed.

    python scripts/baseline_flax_wmt.py [steps]        # default 30; prints one JSON line

The model, its loss and the timing are in transformer_jax/bench/flax_wmt.py: the Flax example's
model in the CPU reference setting of `configs/cpu_reference.py`, float32. It reports the median
step time over `steps` steps after 3 warm-up steps, like
`scripts/benchmark.py --what train --config configs/cpu_reference.py`. Run the two alternately:
the machine's speed moves from minute to minute (docs/benchmarks.md).
"""
import json
import sys

from transformer_jax import cli
from transformer_jax.bench import flax_wmt


def body(values, args):
  if len(args) > 1 or (args and not (args[0].isdigit() and int(args[0]) >= 1)):
    print(f"error: expected at most one argument, the number of steps (>= 1); got {args}",
          file=sys.stderr)
    return 2
  print(json.dumps(flax_wmt.run(int(args[0]) if args else flax_wmt.DEFAULT_STEPS)))
  return 0


def main(argv=None):
  return cli.run(body, argv, doc=__doc__, positional=True)


if __name__ == "__main__":
  sys.exit(main())
