"""Correctness of the fast paths (cuDNN attention, bfloat16 compute) against float32 references.

    python scripts/check_accelerator.py                    # base-size model; on a GPU uses cuDNN
    python scripts/check_accelerator.py --size tiny --json /tmp/check.json

The attention kernel (eleven masks, three of them given as lengths: output and gradients) and
the whole model on a packed batch and on right-padded rows (logits, loss, parameter gradient),
in bfloat16 against float32; the checks and their tolerances
are described in transformer_jax/bench/accelerator.py. On a GPU the compiled attention must
contain cuDNN's fused kernel, else the check fails; on CPU `jax.nn.dot_product_attention` runs
XLA's version. Prints one row per check and a JSON summary; exits 1 when any check fails.
"""
import functools
import json
import sys

from absl import flags

from transformer_jax import cli
from transformer_jax.bench.accelerator import MIN_LENGTH, PACKED_SENTENCES, run_checks
from transformer_jax.bench.common import FIRST_TOKEN
from transformer_jax.config import SIZES


def define(values):
  string, integer, number = (functools.partial(d, flag_values=values) for d in (
      flags.DEFINE_string, flags.DEFINE_integer, flags.DEFINE_float))
  flags.DEFINE_enum("size", "base", list(SIZES), "model size for the checks",
                    flag_values=values)
  integer("batch", 8, "rows for the attention checks", lower_bound=1)
  integer("length", 256, f"query length (keys: 5/4 of it for cross-attention; >= {MIN_LENGTH})")
  integer("model_rows", 8, "rows of the whole-model check", lower_bound=1)
  integer("vocab", 8000, "vocabulary of the whole-model check (its random tokens are ids "
          f"{FIRST_TOKEN} and up)", lower_bound=FIRST_TOKEN + 1)
  number("tolerance", 1e-2, "relative error a kernel check passes below (model logits: 5x, "
         "gradients: 10x)")
  integer("seed", 0, "seed of the random inputs")
  flags.DEFINE_bool("skip_model", False, "only the attention-kernel checks", flag_values=values)
  string("json", "", "also write the results to this file")
  flags.register_validator("tolerance", lambda t: t > 0, "must be > 0", flag_values=values)
  flags.register_validator(
      "length", lambda n: n >= MIN_LENGTH, f"must be >= {MIN_LENGTH}: the packed checks put "
      f"{PACKED_SENTENCES} sentences in every row, which need {MIN_LENGTH} positions or more",
      flag_values=values)


def body(v, args):
  summary = run_checks(v.size, batch=v.batch, length=v.length, model_rows=v.model_rows,
                       vocab=v.vocab, tolerance=v.tolerance, seed=v.seed, skip_model=v.skip_model)
  if v.json:
    with open(v.json, "w") as f:
      json.dump(summary, f, indent=1)
  print(json.dumps(summary))
  return 0 if summary["passed"] else 1


def main(argv=None):
  return cli.run(body, argv, doc=__doc__, define=define)


if __name__ == "__main__":
  sys.exit(main())
