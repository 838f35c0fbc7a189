"""The fused post-LN kernel against XLA's fusion, alone: forward and backward of
LayerNorm(x + Dropout(y)), and the kernel's block shape (transformer_jax/bench/norm.py).

    python scripts/benchmark_norm.py                          # base: 24,576 x 512, bfloat16
    python scripts/benchmark_norm.py --d 1024 --variants 0x4,2x4,8x8 --json /tmp/norm.json

On CPU the kernel runs in Pallas's interpret mode: the figures there say nothing about speed.
Prints one row per variant (median microseconds, GB/s of the bytes the kernel moves, the
gradients' relative difference from XLA's) and a JSON line.
"""
import functools
import json
import sys

from absl import flags

from transformer_jax import cli
from transformer_jax.bench.norm import NormOptions, run

DEFAULTS = NormOptions()


def define(values):
  integer = functools.partial(flags.DEFINE_integer, flag_values=values)
  integer("rows", DEFAULTS.rows, "rows (tokens) of the [rows, d] operands", lower_bound=1)
  integer("d", DEFAULTS.d, "features (d_model), a power of two", lower_bound=2)
  flags.DEFINE_enum("dtype", DEFAULTS.dtype, ["bfloat16", "float32"], "operands' dtype",
                    flag_values=values)
  flags.DEFINE_string("variants", ",".join(f"{r}x{w}" for r, w in DEFAULTS.variants),
                      "the kernel's ROWSxWARPS shapes to time (ROWS 0: the default choice)",
                      flag_values=values)
  integer("iterations", DEFAULTS.iterations, "passes per compiled call", lower_bound=1)
  integer("calls", DEFAULTS.calls, "timed calls per variant and repeat", lower_bound=1)
  integer("repeats", DEFAULTS.repeats, "rounds over the variants", lower_bound=1)
  flags.DEFINE_string("json", "", "also write the result to this file", flag_values=values)
  flags.register_validator("variants", lambda text: parse_variants(text) is not None,
                           message="expected ROWSxWARPS[,ROWSxWARPS...], e.g. 0x4,8x8 (ROWS a "
                           "power of two or 0, WARPS 1 or more)", flag_values=values)


def parse_variants(text: str) -> tuple[tuple[int, int], ...] | None:
  """"0x4,8x8" -> ((0, 4), (8, 8)); None when malformed."""
  out = []
  for item in text.split(","):
    rows, _, warps = item.partition("x")
    if not (rows.isdigit() and warps.isdigit() and int(warps) > 0
            and not int(rows) & (int(rows) - 1)):
      return None
    out.append((int(rows), int(warps)))
  return tuple(out)


def body(v, args):
  opts = NormOptions(rows=v.rows, d=v.d, dtype=v.dtype, variants=parse_variants(v.variants),
                     iterations=v.iterations, calls=v.calls, repeats=v.repeats)
  result = run(opts)
  if v.json:
    with open(v.json, "w") as f:
      json.dump(result, f, indent=1)
  print(json.dumps(result))
  return 0


def main(argv=None):
  return cli.run(body, argv, doc=__doc__, define=define)


if __name__ == "__main__":
  sys.exit(main())
