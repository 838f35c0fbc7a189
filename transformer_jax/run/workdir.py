"""A run's directory and what it holds: the contract between training and the tools.

    <workdir>/config.json      the experiment config the run was started with, plus
                               `resolved_model` (every TransformerConfig field, vocabulary included)
    <workdir>/spm.model        the SentencePiece model (trained on first use, reused on resume)
    <workdir>/metrics.jsonl    one JSON object per log or evaluation event
    <workdir>/tensorboard/     the same scalars for TensorBoard
    <workdir>/checkpoints/     Orbax steps: train state, data iterator positions, metadata
    <workdir>/averaged/        averaged parameters (scripts/average_checkpoints.py)

Training writes it; translate, evaluate, plot and report only read it.
"""
from __future__ import annotations

import json
import os

CONFIG = "config.json"
SPM_MODEL = "spm.model"
CHECKPOINTS = "checkpoints"
AVERAGED = "averaged"
TRAIN_HINT = "train first with scripts/train.py --config configs/default.py --workdir {}"


class RunError(RuntimeError):
  """A workdir, step or checkpoint that cannot be used; the message says what to do."""


class CheckpointError(RunError):
  """A checkpoint that cannot be read or written."""


def config_json(config, model_cfg) -> dict:
  """What `config.json` holds: the experiment config and the resolved model config."""
  out = json.loads(config.to_json_best_effort())
  out["resolved_model"] = model_cfg.to_dict()
  return out


def write_config(workdir: str, config, model_cfg) -> None:
  with open(os.path.join(workdir, CONFIG), "w") as f:
    json.dump(config_json(config, model_cfg), f, indent=2)


def load_run_config(workdir: str) -> dict:
  """The experiment config a run wrote (`<workdir>/config.json`), as a dict."""
  path = os.path.join(workdir, CONFIG)
  if not os.path.exists(path):
    raise RunError(f"{path} not found: {workdir} is not the workdir of a training run; "
                   + TRAIN_HINT.format(workdir))
  with open(path) as f:
    run = json.load(f)
  if "resolved_model" not in run:
    raise RunError(f"{path} has no 'resolved_model': it was not written by "
                   "transformer_jax's training; pass the workdir of a training run")
  return run


def vocabulary_path(workdir: str, run: dict) -> str:
  """The run's SentencePiece model: `data.vocab_path` if the config set one, else its own."""
  return run.get("data", {}).get("vocab_path") or os.path.join(workdir, SPM_MODEL)


def init_from_vocabulary(path: str) -> str | None:
  """The `spm.model` of the run that `init_from` points into (its workdir, its checkpoints
  directory or one step of it), if there is one."""
  path = os.path.abspath(path)
  for candidate in (path, os.path.dirname(path), os.path.dirname(os.path.dirname(path))):
    if os.path.exists(os.path.join(candidate, SPM_MODEL)):
      return os.path.join(candidate, SPM_MODEL)
  return None
