r"""Train a config twice on the same batches, as configured and with a faster numeric setting
(bfloat16 by default), and compare the loss curves (transformer_jax/bench/precision.py).

    python scripts/compare_precision.py --config configs/locale.py:ende --steps 200 \
        --plot runs/precision.png
    python scripts/compare_precision.py --config configs/locale.py:ende --steps 200 \
        --save_batches /tmp/ende_200.npz          # also keep the batches, for a GPU machine
    python scripts/compare_precision.py --config configs/locale.py:ende --steps 200 \
        --batches_file /tmp/ende_200.npz --variant model.dtype=bfloat16 \
        --variant model.attention_impl=cudnn --config.model.attention_dropout_rate=0.0

Both runs start from the same parameters with the same dropout masks; a float32 run's matmuls
run at `highest` precision (GPUs would use TF32 otherwise). Prints every tenth step of
both curves, the relative difference of the last tenth's mean loss (the pass rule:
below --tolerance, every loss finite), the largest single-step difference and how far apart
the parameters ended, then one JSON line; exits 1 when the comparison fails. `--batches_file`
needs neither tensorflow-datasets nor grain.
"""
import ast
import functools
import json
import sys

import _host_memory  # noqa: F401 (before jax: restarts with huge pages, see the module)
from absl import flags

from transformer_jax import cli
from transformer_jax.bench.precision import BatchesFileError, PrecisionOptions, plot, run
from transformer_jax.sweeps.spec import SweepError

DEFAULTS = PrecisionOptions()


def define(values):
  string, integer = (functools.partial(d, flag_values=values) for d in (
      flags.DEFINE_string, flags.DEFINE_integer))
  integer("steps", DEFAULTS.steps, "train steps of each curve", lower_bound=1)
  flags.DEFINE_multi_string("variant", [f"{k}={v}" for k, v in DEFAULTS.variant],
                            "FIELD=VALUE: the variant's overrides (repeatable)",
                            flag_values=values)
  flags.DEFINE_float("tolerance", DEFAULTS.tolerance, "largest relative difference of the last "
                     "tenth's mean loss that passes", flag_values=values)
  string("workdir", None, "where the dataset's tokenizer is trained and kept (default: a temp dir)")
  string("batches_file", None, "read the batches from this .npz (written by --save_batches)")
  string("save_batches", None, "also write the batches read from the dataset to this .npz")
  string("json", "", "also write the result to this file")
  string("plot", "", "also draw both curves and their difference to this PNG")


def _variant(specs: list[str]) -> tuple:
  out = []
  for spec in specs:
    name, sep, text = spec.partition("=")
    if not sep or not name or not text:
      raise SweepError(f"--variant {spec!r}: expected FIELD=VALUE, e.g. model.dtype=bfloat16")
    try:
      value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      value = text
    out.append((name, value))
  return tuple(out)


def body(v, args):
  try:
    options = PrecisionOptions(steps=v.steps, variant=_variant(v.variant), tolerance=v.tolerance,
                               workdir=v.workdir, batches_file=v.batches_file,
                               save_batches=v.save_batches)
  except ValueError as e:  # SweepError too: the --variant text
    print(f"error: {e}", file=sys.stderr)
    return 2
  try:
    result = run(v.config, options)
  except (SweepError, BatchesFileError) as e:  # a variant the config refuses; a bad batches file
    print(f"error: {e}", file=sys.stderr)
    return 2
  if v.json:
    with open(v.json, "w") as f:
      json.dump(result, f, indent=1)
  if v.plot:
    print(f"plot: {plot(result, v.plot)}", file=sys.stderr)
  print(json.dumps(result))
  return 0 if result["passed"] else 1


def main(argv=None):
  return cli.run(body, argv, doc=__doc__, define=define, config=cli.repo_config("locale.py"))


if __name__ == "__main__":
  sys.exit(main())
