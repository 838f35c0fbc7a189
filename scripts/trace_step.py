r"""Print the jaxpr of a config's jitted train step: did a refactor change the program?

    python scripts/trace_step.py --config configs/locale.py:ende_paper > /tmp/now.txt
    git worktree add /tmp/before 66d541e        # the commit to compare with
    here=$PWD; (cd /tmp/before && PYTHONPATH=/tmp/before python "$here/scripts/trace_step.py" \
        --config configs/locale.py:ende_paper > /tmp/before.txt)
    cmp /tmp/now.txt /tmp/before.txt && echo "same program"

Traces `steps.TrainSetup(config, model).train_step` (or `.eval_step`: the jitted steps
training runs) on abstract batches of the config's shape (a training batch's rows:
`data.batch_size`, or `data.batch_tokens` // the longest row; lengths `data.max_source_len` /
`data.max_target_len`) with the keys the training loop hands that step (every key of the batch
schema for `data.batching="pack"`; `inputs` and `targets` alone for the unpacked batchings and
for evaluation) and the config's `data.vocab_size`: nothing is compiled, run or read from disk,
so it takes seconds. The same jaxpr means the same operations on the same values in the same
order; a run made at one commit then stands for the other (docs/results.md uses it).
`--what eval` prints the evaluation step instead.
"""
import sys

import _host_memory  # noqa: F401 (before jax: restarts with huge pages, see the module)
from absl import flags
import jax
import jax.numpy as jnp

from transformer_jax import batch as batch_lib
from transformer_jax import cli, steps
from transformer_jax.data.config import global_rows
from transformer_jax.experiment import transformer_config
from transformer_jax.run.workdir import RunError


def define(values):
  flags.DEFINE_enum("what", "train", ["train", "eval"], "which step to trace",
                    flag_values=values)


def abstract_batch(config, what: str = "train") -> dict:
  """The batch the loop hands the step, as shapes: a training batch's rows (`global_rows`, as
  run/trainer.py), every key of the schema for packed training batches."""
  d = config.data
  lengths = {"inputs": d.max_source_len, "targets": d.max_target_len}
  packed = what == "train" and batch_lib.packs(d.batching)   # as the loop (run/trainer.py)
  keys = {side: batch_lib.side_keys(side) if packed else (side,) for side in lengths}
  return {key: jax.ShapeDtypeStruct((global_rows(d), lengths[side]), jnp.int32)
          for side in lengths for key in keys[side]}


def step_jaxpr(config, what: str = "train") -> str:
  """The jaxpr of the config's train (or eval) step, as text."""
  setup = steps.TrainSetup(config, transformer_config(config, config.data.vocab_size))
  batch = abstract_batch(config, what)
  with setup.context():
    if what == "train":
      return str(setup.train_step.trace(setup.state_shapes, batch).jaxpr)
    return str(setup.eval_step.trace(setup.state_shapes.params, batch).jaxpr)


def body(values, args):
  if values.config is None:
    raise RunError("give the config to trace: --config configs/<file>.py[:arg]")
  print(step_jaxpr(values.config, values.what))
  return 0


def main(argv=None):
  return cli.run(body, argv, doc=__doc__, define=define, config=None)


if __name__ == "__main__":
  sys.exit(main())
