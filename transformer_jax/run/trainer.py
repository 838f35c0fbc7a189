"""The pieces of one run, built by `Trainer.create`: data, compiled steps on a mesh, checkpoints.

    trainer = Trainer.create(config, workdir)          # loads data, trains or loads spm.model
    state, data_state, origin = trainer.initial_state()
    batches = trainer.train_batches(data_state)
    state, metrics = trainer.train_step(state, batches.next()[0])

Creating a Trainer reads the workdir (tokenizer, checkpoints) and may train the tokenizer; it
starts no processes and writes no config: `loop.train_and_evaluate` does those in order.
"""
from __future__ import annotations

import filecmp
import os

import jax
from jax.experimental import multihost_utils
import ml_collections
import numpy as np

from transformer_jax import batch as batch_lib
from transformer_jax import bleu as bleu_lib
from transformer_jax import experiment, flops, sharding
from transformer_jax.config import TransformerConfig
from transformer_jax.data import Data, get_data, pipeline
from transformer_jax.files import write_atomically
from transformer_jax.run import checkpointing, distributed
from transformer_jax.run import metrics as metrics_lib
from transformer_jax.run.workdir import (
  CONFIG,
  SPM_MODEL,
  RunError,
  init_from_file,
  init_from_vocabulary,
  load_run_config,
)
from transformer_jax.search import output_ids, search_batch
from transformer_jax.steps import TrainSetup


def adopt_init_from_tokenizer(config, workdir: str) -> None:
  """With `init_from` (and no `data.vocab_path`), copy that run's spm.model (and its .json)
  into `workdir`, where none is yet; refuse one an earlier command trained there.

  Parameters from another run only mean something with that run's vocabulary: the fork gets a
  copy of it, so its workdir stands on its own (tools, resumes, a moved source). Called by
  `Trainer.create` and by scripts/prepare_data.py (which would otherwise train a tokenizer of
  the fork's own corpus that the fork's training then refuses)."""
  if not config.init_from or config.data.vocab_path:
    return
  vocab = init_from_vocabulary(config.init_from)
  own = os.path.join(workdir, SPM_MODEL)
  fresh = not checkpointing.checkpoint_steps(checkpointing.checkpoint_dir(workdir))
  if vocab and fresh and os.path.exists(own) and not filecmp.cmp(vocab, own, shallow=False):
    # Left by an earlier command in this workdir that failed before its first checkpoint:
    # init_from's parameters with this tokenizer would read every piece as another one.
    raise RunError(
        f"{own} is not the tokenizer of the init_from run ({vocab}): an earlier command "
        "in this workdir trained it and stopped before its first checkpoint. Delete "
        f"{own} and {own}.json to start from the init_from run with its tokenizer, or "
        "pass another --workdir")
  if vocab and not os.path.exists(own) and distributed.is_main():
    os.makedirs(workdir, exist_ok=True)
    # The record first, as `load_or_train` writes them: a model without its record (a command
    # killed between the two) would go unchecked (run.workdir's `_check_tokenizer`).
    for suffix in (".json", ""):
      if os.path.exists(vocab + suffix):
        with open(vocab + suffix, "rb") as f:
          write_atomically(own + suffix, f.read())
  distributed.sync("transformer_jax: the init_from tokenizer is copied")


# A held-out pair this many times model.max_len is warned of (`Trainer.eval_cut_warning`): the
# split's every evaluation batch is padded to it, and attention grows with its square.
LONG_EVAL_FACTOR = 4


class Trainer:
  """Data, model config, `TrainSetup` (mesh, state shardings, jitted train step), eval step and
  checkpointer of one run."""

  def __init__(self, config: ml_collections.ConfigDict, data: Data, model_cfg: TransformerConfig,
               setup: TrainSetup, checkpointer: checkpointing.Checkpointer):
    self.config, self.data, self.model_cfg = config, data, model_cfg
    self.setup, self.checkpointer = setup, checkpointer
    self.train_step, self.context = setup.train_step, setup.context
    self.eval_model, self.eval_step = setup.eval_model, setup.eval_step
    # A learned position table takes no row longer than itself: evaluation cuts such sentences.
    self.eval_max_len = model_cfg.max_len if model_cfg.position_encoding == "learned" else None

  @classmethod
  def create(cls, config: ml_collections.ConfigDict, workdir: str) -> "Trainer":
    """Everything a run needs from a validated config; `jax.distributed` must be up already."""
    adopt_init_from_tokenizer(config, workdir)
    data = get_data(config.data, workdir, process_index=jax.process_index(),
                    process_count=jax.process_count())
    tok = data.tokenizer
    model_cfg = experiment.transformer_config(config, tok.vocab_size, tok.pad_id, tok.bos_id,
                                              tok.eos_id)
    if model_cfg.max_len < max(config.data.max_source_len, config.data.max_target_len):
      raise ValueError(f"config.model.max_len={model_cfg.max_len} is shorter than "
                       f"data.max_source_len/max_target_len; raise model.max_len")
    setup = TrainSetup(config, model_cfg)
    _check_rows_split_over_devices(config, data, setup)
    checkpointer = checkpointing.Checkpointer(
        workdir, max_to_keep=config.keep_checkpoints, keep_period=config.keep_every_steps or None,
        async_save=config.async_checkpointing)
    return cls(config, data, model_cfg, setup, checkpointer)

  def eval_cut_warning(self, split: str = "validation") -> str | None:
    """What evaluation cuts to fit a learned position table, or a pair so long that padding
    every batch of the split to it may run out of memory; None if neither (said once a run)."""
    pairs = self.data.raw_examples(split)
    if not self.eval_max_len:
      # Sinusoidal positions take any length, and the split is padded to its longest pair.
      source_ids, target_ids, _ = pipeline.eval_ids(pairs, self.data.tokenizer)
      lengths = [max(len(s), len(t)) for s, t in zip(source_ids, target_ids)]
      longest = max(lengths)  # a split is never empty (the builders refuse one)
      if longest <= LONG_EVAL_FACTOR * self.model_cfg.max_len:
        return None
      i = lengths.index(longest)
      source = pairs[i][0] if len(pairs[i][0]) <= 40 else pairs[i][0][:40] + "..."
      return (f"{split} pair {i + 1} ({source!r}) is {longest:,} pieces with EOS, over "
              f"{LONG_EVAL_FACTOR} times model.max_len={self.model_cfg.max_len}: evaluation "
              "pads every batch of the split to the split's longest pair, "
              f"data.eval_batch_size={self.config.data.eval_batch_size} rows of it, which may "
              "run out of memory; if it does, lower data.eval_batch_size")
    _, _, cut = pipeline.eval_ids(pairs, self.data.tokenizer, self.eval_max_len)
    if not cut:
      return None
    return (f"{cut} {split} pairs are longer than the learned position table (model.max_len="
            f"{self.eval_max_len} pieces with EOS): evaluation loss and BLEU see their first "
            f"{self.eval_max_len - 1} pieces")

  @property
  def mesh(self):
    return self.setup.mesh

  def initial_state(self):
    """(state, saved data record or None, how it started): resume > init_from > scratch."""
    abstract = checkpointing.abstract_like(self.setup.state_shapes, self.setup.state_shardings)
    restored = self.checkpointer.restore_latest(abstract)
    if restored is not None:
      step, state, data_state, _ = restored
      return state, data_state, f"resumed from step {step}"
    state = self.setup.init_state(jax.random.key(self.config.seed))
    if not self.config.init_from:
      return state, None, "scratch"
    step, params = checkpointing.load_params(self.config.init_from)
    differs = checkpointing.shape_difference(checkpointing.param_shapes(params),
                                             checkpointing.param_shapes(state.params))
    if differs:
      fields = self._init_from_model_fields()
      raise RunError(f"config.init_from={self.config.init_from!r}: its parameters do not "
                     f"match this model's shapes: {differs}"
                     + (f" (its config.json differs in {fields})" if fields else "")
                     + "; use the same config.model and vocabulary, or leave init_from out to "
                     "train the new shapes from scratch")
    params = jax.tree.map(lambda p, s: jax.device_put(p.astype(s.dtype), s.sharding), params,
                          state.params)
    origin = f"parameters from {self.config.init_from} (step {step})"
    return state.replace(params=params), None, origin

  def _init_from_model_fields(self) -> str:
    """The model fields in which the init_from run's config.json differs from this model, as
    "model.X: A there, B here" ("" when it has no config.json that reads)."""
    found = init_from_file(self.config.init_from, CONFIG)
    if not found:
      return ""
    try:
      theirs = load_run_config(os.path.dirname(found))["resolved_model"]
    except (RunError, OSError, ValueError):
      return ""
    ours = self.model_cfg.to_dict()
    return ", ".join(f"model.{k}: {theirs[k]!r} there, {ours[k]!r} here"
                     for k in ours if k in theirs and theirs[k] != ours[k])

  def train_batches(self, saved_data_state: dict | None) -> "TrainBatches":
    """This process's training batches, continuing where the checkpoint's record says."""
    iterator = iter(self.data.train_dataset())
    state = distributed.own_data_state(saved_data_state, self.data)
    if state:
      iterator.set_state(state)
    return TrainBatches(iterator, self.setup.batch_sharding, self.data.tokenizer.pad_id,
                        packed=batch_lib.packs(self.config.data.batching))

  def put(self, batch: dict) -> dict:
    return sharding.global_batch(batch_lib.model_arrays(batch), self.setup.batch_sharding)

  def evaluate(self, params, split: str = "validation") -> dict:
    """Loss, perplexity and accuracy over every pair of `split` (dropout off)."""
    total = None
    multiple = self.setup.batch_sharding.mesh.size
    for batch in self.data.eval_batches(split, self.eval_max_len):
      arrays = _pad_rows(batch_lib.model_arrays(batch, packed=False), multiple)  # one pair a row
      rows = arrays["inputs"].shape[0] // jax.process_count()
      lo = jax.process_index() * rows
      local = {k: v[lo:lo + rows] for k, v in arrays.items()}
      with self.context():
        sums = self.eval_step(params, self.put(local))
      total = metrics_lib.accumulate(total, jax.device_get(sums))
    return metrics_lib.summarize(total, "eval")

  def bleu(self, params, num_sentences: int, split: str = "validation") -> dict:
    """sacreBLEU of the configured search on the first `num_sentences` pairs of `split`."""
    c = self.config
    # May span hosts. Put on this process's device once: a search called with numpy arrays
    # copies them in at every call (of each batch's every part).
    host_params = jax.device_put(multihost_utils.process_allgather(params, tiled=True))
    tok = self.data.tokenizer
    hyps, refs = [], []
    for batch in self.data.eval_batches(split, self.eval_max_len):
      n = min(batch["num_real"], num_sentences - len(refs))
      if n <= 0:
        break
      # The whole (fixed-shape) batch is searched so the search compiles once per split.
      tokens, lengths = search_batch(self.eval_model.config, host_params, batch["inputs"],
                                     beam_size=c.beam_size, alpha=c.length_penalty_alpha,
                                     max_len_margin=c.max_len_margin)
      hyps.extend(tok.detokenize(ids) for ids in output_ids(tokens, lengths, tok.eos_id)[:n])
      refs.extend(batch["target_text"][:n])
    score, signature = bleu_lib.corpus_bleu(hyps, refs)
    return {"bleu": score, "bleu_signature": signature, "bleu_sentences": len(refs),
            "bleu_example": hyps[0] if hyps else ""}


class TrainBatches:
  """The training iterator, yielding batches already on their devices and the per-sentence
  lengths that the FLOP count needs; `state()` is what a checkpoint saves."""

  def __init__(self, iterator, batch_sharding, pad_id: int, packed: bool):
    self._iterator, self._sharding, self._pad_id = iterator, batch_sharding, pad_id
    self._packed = packed   # False: one pair a row (pad, bucket), the packing keys left out

  def next(self):
    batch = next(self._iterator)
    return (sharding.global_batch(batch_lib.model_arrays(batch, self._packed), self._sharding),
            flops.batch_lengths(batch, self._pad_id))

  def state(self) -> dict:
    return self._iterator.get_state()


def _check_rows_split_over_devices(config, data: Data, setup: TrainSetup) -> None:
  """Every global batch must split evenly over the batch devices (else a shape error later),
  and each process must hold rows of its own (`sharding.check_rows_split_over_processes`)."""
  c, shards = config.data, sharding.batch_shards(setup.batch_sharding)
  if c.batching == "bucket":
    per_process = pipeline.Batcher(c, data.rows_per_process, jax.process_count()).rows
    rows = sorted({r * jax.process_count() for r in per_process})
    fields = "data.batch_tokens or data.bucket_rows_multiple"
  else:
    rows, fields = [data.global_rows], "data.batch_size (or data.batch_tokens)"
  bad = [r for r in rows if r % shards]
  if bad:
    raise sharding.ShardingError(
        f"a global batch of {bad[0]} rows does not split over the {shards} devices of the "
        f"batch axes (mesh {dict(setup.mesh.shape)}): change {fields} or config.mesh")
  for r in rows:
    sharding.check_rows_split_over_processes(setup.batch_sharding, r, jax.process_count())


def _pad_rows(batch: dict, multiple: int) -> dict:
  """Eval batches: add all-padding rows (segment 0, weight 0) so rows divide the devices."""
  rows = batch["inputs"].shape[0]
  extra = -rows % multiple
  if not extra:
    return batch
  return {k: np.concatenate([v, np.zeros((extra,) + v.shape[1:], v.dtype)])
          for k, v in batch.items()}
