r"""Plot a trained model's attention on one sentence: every layer and head, pieces on the axes.

    python scripts/plot_attention.py --workdir runs/default --source "one hundred and two"
    python scripts/plot_attention.py --workdir runs/default --source "..." --target "..." \
        --out_dir /tmp/attention

The model is teacher-forced on the source and its own translation (the run's configured search,
or `--beam_size`), or on `--target` when given, and the attention weights every layer sows are
drawn, one PNG per kind and layer with a grid of heads: `encoder_self_layer<i>.png` (source x
source), `decoder_self_layer<i>.png` (predicted piece x decoder input: `<s>` then the target
shifted right), `cross_layer<i>.png` (predicted piece x source), and `summary.png`, the last
decoder layer's encoder-decoder attention averaged over heads. Default --out_dir:
<workdir>/attention.
"""
import json
import logging
import os
import sys

import _host_memory  # noqa: F401 (before jax: restarts with huge pages, see the module)
from absl import flags

from transformer_jax import cli
from transformer_jax.inference.attention_maps import attention_maps, plot_maps
from transformer_jax.inference.flags import define_checkpoint_flags, translator_from_flags


def define(values):
  define_checkpoint_flags(values, ensemble=False)  # one model's attention
  flags.DEFINE_string("source", None, "the source sentence", flag_values=values)
  flags.mark_flag_as_required("source", flag_values=values)
  flags.DEFINE_string("target", None, "teacher-force this target (default: the model's own "
                      "translation)", flag_values=values)
  flags.DEFINE_string("out_dir", None, "default: <workdir>/attention", flag_values=values)


def body(values, args):
  translator = translator_from_flags(values)
  maps = attention_maps(translator, values.source, values.target)
  out_dir = values.out_dir or os.path.join(values.workdir, "attention")
  target_text = maps["target_text"]
  paths = plot_maps(maps, out_dir, title=f"{values.source!r} -> {target_text!r}")
  print(json.dumps({"out_dir": out_dir, "files": [os.path.basename(p) for p in paths],
                    "source_pieces": maps["source_pieces"],
                    "target_pieces": maps["target_pieces"], "target": target_text}), flush=True)
  return 0


def main(argv=None):
  return cli.run(body, argv, doc=__doc__, define=define, absl_level=logging.ERROR)


if __name__ == "__main__":
  sys.exit(main())
