"""Runs made by earlier code decode as they were trained.

`tests/golden/old_runs/<name>/` holds what a training run leaves for the model: `config.json`
(as the trainer writes it: the experiment config and `resolved_model`), the parameters
(`params.npz`) and the logits they gave on fixed inputs (`logits.npy`), made by the code of
2026-11-25. The test reads them back
as the tools do (`load_run_config`, `model_config_from`) and compares. A new model field whose
default changes what an old run computes (a new scale, another norm), or a parameter renamed
or added, fails here, not in a researcher's evaluation. Regenerate only for a change meant to
alter old runs (a bug fix), and say so in the commit:

    REGENERATE_OLD_RUNS=1 python -m pytest tests/test_old_runs.py
"""
import json
import os

import flax.linen as nn
import jax
import numpy as np
import pytest

import transformer_jax as tj
from transformer_jax import experiment
from transformer_jax.inference.translator import model_config_from
from transformer_jax.run import checkpointing
from transformer_jax.run.workdir import config_json, load_run_config

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden", "old_runs")
VOCAB = 40
SIZES = dict(d_model=16, num_heads=2, d_ff=32, num_encoder_layers=2, num_decoder_layers=2,
             max_len=16)
RUNS = {
    # The paper's model: post-LN, sinusoidal positions, one shared and tied embedding, ReLU.
    "post_paper": {},
    # The other choices at once: pre-LN, a learned position table, separate tables, GELU,
    # attention biases and no FFN biases, N(0, 0.02) kernels.
    "pre_variants": dict(norm_position="pre", position_encoding="learned",
                         share_embeddings=False, tie_output_embedding=False,
                         activation="gelu", attention_bias=True,
                         use_bias=False, kernel_init="normal", scale_embeddings=False),
}
HOW = ("If a new model field changed what an old run computes, give it the old behaviour as "
       "its default or a LEGACY_VALUES entry (transformer_jax/run/workdir.py; docs/model.md, "
       "\"Adding a model option\"). If old runs are meant to change (a bug fix), regenerate "
       "with REGENERATE_OLD_RUNS=1 python -m pytest tests/test_old_runs.py and say so.")


def _inputs():
  # Two rows with padding (id 0) at the end of the second.
  src = np.array([[5, 9, 11, 3, 0, 0, 0], [7, 8, 3, 0, 0, 0, 0]], np.int32)
  src[0, 4:] = [12, 13, 3]
  tgt = np.array([[6, 10, 14, 3, 0], [9, 3, 0, 0, 0]], np.int32)
  return src, tgt


def _logits(config, params):
  model = tj.Transformer(config.replace(deterministic=True))
  src, tgt = _inputs()
  return np.asarray(model.apply({"params": params}, src, tgt), np.float32)


def _nest(flat: dict) -> dict:
  out: dict = {}
  for path, value in flat.items():
    *parents, leaf = path.split("/")
    node = out
    for name in parents:
      node = node.setdefault(name, {})
    node[leaf] = value
  return out


def _regenerate(name: str, overrides: dict) -> None:
  run = experiment.base_config()
  run.model.update(**SIZES, **overrides)
  config = experiment.transformer_config(run, VOCAB)
  model = tj.Transformer(config.replace(deterministic=True))
  src, tgt = _inputs()
  params = model.init(jax.random.key(7), src, tgt)["params"]
  params = jax.tree.map(np.asarray, nn.meta.unbox(params))
  flat = {"/".join(str(getattr(k, "key", k)) for k in path): np.asarray(leaf)
          for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}
  directory = os.path.join(GOLDEN, name)
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(config_json(run, config), f, indent=1, sort_keys=True)
    f.write("\n")
  np.savez(os.path.join(directory, "params.npz"), **flat)
  np.save(os.path.join(directory, "logits.npy"), _logits(config, _nest(flat)))


@pytest.mark.parametrize("name", sorted(RUNS))
def test_an_old_run_decodes_as_it_was_trained(name):
  directory = os.path.join(GOLDEN, name)
  if os.environ.get("REGENERATE_OLD_RUNS"):
    _regenerate(name, RUNS[name])
  config = model_config_from(load_run_config(directory), os.path.join(directory, "config.json"))
  with np.load(os.path.join(directory, "params.npz")) as f:
    params = _nest({k: f[k] for k in f.files})
  model = tj.Transformer(config.replace(deterministic=True))
  src, tgt = _inputs()
  expected = nn.meta.unbox(jax.eval_shape(lambda: model.init(jax.random.key(0), src, tgt))[
      "params"])
  differs = checkpointing.shape_difference(checkpointing.param_shapes(params),
                                           checkpointing.param_shapes(expected))
  assert differs is None, (f"{directory}: the parameters of a run made by earlier code no "
                           f"longer fit the model this code builds from its config.json: "
                           f"{differs}. {HOW}")
  got, want = _logits(config, params), np.load(os.path.join(directory, "logits.npy"))
  assert np.allclose(got, want, rtol=1e-5, atol=1e-5), (
      f"{directory}: a run made by earlier code computes other logits now (largest difference "
      f"{np.abs(got - want).max():.3g}). {HOW}")
