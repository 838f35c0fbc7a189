"""Plot a trained model's attention on one sentence: every layer and head, pieces on the axes.

    python scripts/plot_attention.py --workdir runs/default --source "one hundred and two"
    python scripts/plot_attention.py --workdir runs/default --source "..." --target "..." \
        --out_dir /tmp/attention

The model is teacher-forced on the source and its own translation (the run's configured search,
or `--beam_size`), or on `--target` when given, and the attention weights every layer sows are drawn, one PNG per
kind and layer with a grid of heads: `encoder_self_layer<i>.png` (source x source),
`decoder_self_layer<i>.png` (predicted piece x decoder input: `<s>` then the target shifted
right), `cross_layer<i>.png` (predicted piece x source), and `summary.png`, the last decoder
layer's encoder-decoder attention averaged over heads. Default --out_dir: <workdir>/attention.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from transformer_jax import translate as translate_lib  # noqa: E402

TITLES = {"encoder_self": "encoder self-attention", "decoder_self": "decoder self-attention",
          "cross": "encoder-decoder attention"}


def axes_pieces(maps: dict, kind: str) -> tuple[list[str], list[str]]:
  """(query pieces, key pieces) of one attention kind."""
  if kind == "encoder_self":
    return maps["source_pieces"], maps["source_pieces"]
  if kind == "decoder_self":
    return maps["target_pieces"], maps["decoder_input_pieces"]
  return maps["target_pieces"], maps["source_pieces"]


def _heatmap(ax, weights, rows, cols, title, fontsize):
  ax.imshow(weights, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto", interpolation="nearest")
  ax.set_xticks(range(len(cols)))
  ax.set_xticklabels(cols, rotation=90, fontsize=fontsize)
  ax.set_yticks(range(len(rows)))
  ax.set_yticklabels(rows, fontsize=fontsize)
  ax.set_title(title, fontsize=fontsize + 2)


def plot_maps(maps: dict, out_dir: str, title: str = "") -> list[str]:
  """Write the PNGs of `translate.attention_maps` output into `out_dir`; returns their paths."""
  import matplotlib

  matplotlib.use("Agg")  # files only, no display
  import matplotlib.pyplot as plt

  os.makedirs(out_dir, exist_ok=True)
  written = []
  for kind, name in TITLES.items():
    rows, cols = axes_pieces(maps, kind)
    cell = 0.22  # inches per piece, so labels stay readable
    fontsize = 7 if max(len(rows), len(cols)) < 40 else 5
    for layer, weights in enumerate(maps[kind]):
      heads = weights.shape[0]
      ncols = min(4, heads)
      nrows = math.ceil(heads / ncols)
      width = max(3.0, cell * len(cols) + 1.2)
      height = max(3.0, cell * len(rows) + 1.2)
      fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows),
                               squeeze=False)
      for h in range(nrows * ncols):
        ax = axes[h // ncols][h % ncols]
        if h < heads:
          _heatmap(ax, weights[h], rows, cols, f"head {h}", fontsize)
        else:
          ax.axis("off")
      fig.suptitle(f"{name}, layer {layer}" + (f"\n{title}" if title else ""))
      fig.tight_layout()
      path = os.path.join(out_dir, f"{kind}_layer{layer}.png")
      fig.savefig(path, dpi=100)
      plt.close(fig)
      written.append(path)
  rows, cols = axes_pieces(maps, "cross")
  last = maps["cross"][-1].mean(axis=0)
  fig, ax = plt.subplots(figsize=(max(4.0, 0.3 * len(cols) + 2), max(4.0, 0.3 * len(rows) + 2)))
  _heatmap(ax, last, rows, cols,
           f"encoder-decoder attention\nlast layer ({len(maps['cross']) - 1}), mean of "
           f"{maps['cross'][-1].shape[0]} heads", 9)
  fig.colorbar(ax.images[0], ax=ax, fraction=0.046, pad=0.04)
  ax.set_xlabel("source piece")
  ax.set_ylabel("predicted target piece")
  if title:
    fig.suptitle(title, fontsize=9)
  fig.tight_layout()
  path = os.path.join(out_dir, "summary.png")
  fig.savefig(path, dpi=100)
  plt.close(fig)
  written.append(path)
  return written


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  translate_lib.add_checkpoint_flags(parser)
  parser.add_argument("--source", required=True, help="the source sentence")
  parser.add_argument("--target", default=None,
                      help="teacher-force this target (default: the model's own translation)")
  parser.add_argument("--out_dir", default=None, help="default: <workdir>/attention")
  args = parser.parse_args(argv)
  logging.getLogger("absl").setLevel(logging.ERROR)  # Orbax's read-only notices

  try:
    translator = translate_lib.translator_from_args(args)
    maps = translate_lib.attention_maps(translator, args.source, args.target)
  except (*translate_lib.USER_ERRORS, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  out_dir = args.out_dir or os.path.join(args.workdir, "attention")
  target_text = maps["target_text"]
  paths = plot_maps(maps, out_dir, title=f"{args.source!r} -> {target_text!r}")
  print(json.dumps({"out_dir": out_dir, "files": [os.path.basename(p) for p in paths],
                    "source_pieces": maps["source_pieces"],
                    "target_pieces": maps["target_pieces"], "target": target_text}), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
