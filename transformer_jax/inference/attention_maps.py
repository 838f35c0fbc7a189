"""Attention maps of a trained run: the weights of every layer and head for one sentence pair.

    maps = attention_maps(Translator("runs/default"), "I buy 27 red apples.")
    maps["cross"][layer]      # float32 [heads, target pieces, source pieces]

`plot_maps` draws them (scripts/plot_attention.py).
"""
from __future__ import annotations

import math
import os

import jax
from matplotlib.figure import Figure
import numpy as np

from transformer_jax.files import save_figure
from transformer_jax.inference.translator import Translator, warn_stderr
from transformer_jax.model import Transformer
from transformer_jax.run.workdir import RunError

ATTENTION_KINDS = {"encoder_self": ("encoder", "self_attention"),
                   "decoder_self": ("decoder", "self_attention"),
                   "cross": ("decoder", "cross_attention")}


def attention_maps(translator: Translator, source: str, target: str | None = None) -> dict:
  """Attention weights of one sentence pair, teacher-forced.

  The target is `target` or the translator's own translation of `source`. Returns
  `{"target_text", "source_pieces", "target_pieces", "decoder_input_pieces", "encoder_self",
  "decoder_self", "cross"}`, each of the last three a list over layers of float32
  `[heads, queries, keys]`.
  Decoder queries are labelled with the piece they predict, decoder self-attention keys with
  the decoder's input pieces (`<s>` then the target shifted right).
  """
  if translator.members:
    raise RunError("attention maps are one model's: pass a translator without ensemble "
                   "members")
  (src,) = translator.encode([source], warn_stderr, names=["--source"],
                             translated=target is None)
  if not src:
    raise RunError("the source sentence is empty: nothing to attend to")
  if target is None:
    (out,) = translator.translate_ids([src])
  else:
    out = translator.tokenizer.encode(target)  # whitespace-normalised there
    if not out:  # e.g. an empty shell variable: a plot of eos alone would look like a result
      raise RunError("the target sentence is empty: pass the translation to teacher-force, or "
                     "leave --target out to plot the model's own")
  tgt = _with_eos(translator, out, "--target" if target is not None else
                  "the model's translation")
  model = Transformer(translator.config.replace(deterministic=True, decode=False))
  _, variables = _teacher_forced(model, translator.params, np.asarray([src], np.int32),
                                 np.asarray([tgt], np.int32))
  found: dict[str, dict[int, np.ndarray]] = {k: {} for k in ATTENTION_KINDS}
  for path, leaf in jax.tree_util.tree_flatten_with_path(variables["intermediates"])[0]:
    names = [getattr(p, "key", None) for p in path]
    for kind, (stack, module) in ATTENTION_KINDS.items():
      if names[0] == stack and module in names and "attention_weights" in names:
        layer = next(int(n[len("layer_"):]) for n in names if n and n.startswith("layer_"))
        found[kind][layer] = np.asarray(leaf[0], np.float32)  # batch of one
  pieces = translator.tokenizer.pieces
  maps = {"target_text": translator.detokenize(tgt), "source_pieces": pieces(src),
          "target_pieces": pieces(tgt),
          "decoder_input_pieces": pieces([translator.config.bos_id] + tgt[:-1])}
  for kind, layers in found.items():
    if not layers:
      raise RunError(f"no {kind} attention weights were sown: the model's attention_impl="
                     f"{translator.config.attention_impl!r} must be 'xla' to expose them")
    maps[kind] = [layers[i] for i in sorted(layers)]
  return maps


def _with_eos(translator: Translator, ids, name: str) -> list[int]:
  """The target `ids` with eos, to teacher-force, past max_len - 1 pieces treated as
  `Translator.encode` treats --source (`Translator.fit`): the cut keeps eos for the plot's last
  row."""
  return (translator.fit(ids, name, cut_note=", the plot shows those")
          + [translator.config.eos_id])


def _teacher_forced(model, params, inputs, targets):
  return jax.jit(lambda p, i, t: model.apply({"params": p}, i, t, mutable=["intermediates"]))(
      params, inputs, targets)


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
  """Write the PNGs of `attention_maps` output into `out_dir`; returns their paths.

  One PNG per kind and layer with a grid of heads: `encoder_self_layer<i>.png` (source x
  source), `decoder_self_layer<i>.png` (predicted piece x decoder input: `<s>` then the target
  shifted right), `cross_layer<i>.png` (predicted piece x source), and `summary.png`, the last
  decoder layer's encoder-decoder attention averaged over heads.
  """
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
      fig = Figure(figsize=(width * ncols, height * nrows))
      axes = fig.subplots(nrows, ncols, squeeze=False)
      for h in range(nrows * ncols):
        ax = axes[h // ncols][h % ncols]
        if h < heads:
          _heatmap(ax, weights[h], rows, cols, f"head {h}", fontsize)
        else:
          ax.axis("off")
      fig.suptitle(f"{name}, layer {layer}" + (f"\n{title}" if title else ""))
      fig.tight_layout()
      path = os.path.join(out_dir, f"{kind}_layer{layer}.png")
      save_figure(fig, path, dpi=100)
      written.append(path)
  rows, cols = axes_pieces(maps, "cross")
  last = maps["cross"][-1].mean(axis=0)
  fig = Figure(figsize=(max(4.0, 0.3 * len(cols) + 2), max(4.0, 0.3 * len(rows) + 2)))
  ax = fig.subplots()
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
  save_figure(fig, path, dpi=100)
  written.append(path)
  return written
