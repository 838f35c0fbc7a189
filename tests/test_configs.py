"""Every shipped config loads, validates and yields a valid model config."""
import importlib.util
import os

import pytest

from transformer_jax import experiment, sweeps
from transformer_jax.data import tokenizer
from transformer_jax.data.config import default_data_config

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


def load(name):
  spec = importlib.util.spec_from_file_location(name, os.path.join(CONFIGS, name + ".py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.mark.parametrize("name,arg", [("default", None), ("locale", "ende"), ("locale", "enfr"),
                                      ("locale", "ende_short"), ("locale", "ende_paper"),
                                      ("locale", "ende_paper_pre"), ("locale", "enfr_paper_pre"),
                                      ("wmt14_ende", "base"), ("wmt14_ende", "big")])
def test_config_validates(name, arg):
  c = load(name).get_config(arg)
  experiment.validate(c)
  model = experiment.transformer_config(c, vocab_size=1000)
  assert model.max_len >= max(c.data.max_source_len, c.data.max_target_len)
  assert c.data.batch_size % 8 == 0   # rows split evenly over 8 devices


def test_paper_recipe_values():
  base, big = load("wmt14_ende").get_config("base"), load("wmt14_ende").get_config("big")
  assert (base.model.d_model, base.model.d_ff, base.model.num_heads) == (512, 2048, 8)
  assert (big.model.d_model, big.model.d_ff, big.model.num_heads) == (1024, 4096, 16)
  assert (base.model.dropout_rate, big.model.dropout_rate) == (0.1, 0.3)
  assert (base.num_train_steps, big.num_train_steps) == (100_000, 300_000)
  assert (base.average_last_checkpoints, big.average_last_checkpoints) == (5, 20)
  for c in (base, big):
    assert (c.adam_b1, c.adam_b2, c.adam_eps, c.warmup_steps) == (0.9, 0.98, 1e-9, 4000)
    assert (c.label_smoothing, c.beam_size, c.length_penalty_alpha, c.max_len_margin) == (
        0.1, 4, 0.6, 50)
    assert c.model.norm_position == "post"
    assert 24_000 <= c.data.batch_size * c.data.max_target_len <= 26_000


def test_unknown_config_arg_is_named():
  with pytest.raises(ValueError, match="expected one of"):
    load("wmt14_ende").get_config("huge")


def test_locale_variants_differ_only_where_documented():
  locale = load("locale")
  full, short, paper = (locale.get_config(a) for a in ("ende", "ende_short", "ende_paper"))
  assert full.num_train_steps == 1500 and short.num_train_steps == 375
  assert (full.model.norm_position, paper.model.norm_position) == ("pre", "post")
  assert (paper.model.dropout_rate, paper.learning_rate) == (0.1, 1.0)
  # The paper's recipe with pre-LN: that one field apart from it, everything else the same.
  paper_pre = locale.get_config("ende_paper_pre")
  assert paper_pre.model.norm_position == "pre"
  paper_pre.model.norm_position = "post"
  assert paper_pre.to_dict() == paper.to_dict()
  # The paper's optimizer, smoothing and search in every variant; averaging the last 5.
  for c in (full, paper):
    assert (c.adam_b1, c.adam_b2, c.adam_eps, c.label_smoothing) == (0.9, 0.98, 1e-9, 0.1)
    assert (c.beam_size, c.length_penalty_alpha, c.average_last_checkpoints) == (4, 0.6, 5)
    assert c.keep_checkpoints >= c.average_last_checkpoints
  # The sweep's points all apply to the short config.
  points = locale.sweep()
  grid = [p for p in points if p["seed"] == 0]
  assert len(grid) == 4 and {p["model.norm_position"] for p in grid} == {"post", "pre"}
  # The grid's best point and the paper's (post-LN, multiplier 1) with 3 seeds, for the spread.
  for setting in (locale.BEST_SHORT, locale.PAPER_SHORT):
    assert setting in [{k: v for k, v in p.items() if k != "seed"} for p in grid]
    assert sorted(p["seed"] for p in points if setting.items() <= p.items()) == [0, 1, 2]
  assert locale.PAPER_SHORT == {"model.norm_position": "post", "learning_rate": 1.0}
  assert len(points) == 8
  for p in points:
    sweeps.apply_overrides(short, p)
  with pytest.raises(ValueError, match="expected <pair>"):
    locale.get_config("ende_long")


def test_the_defaults_a_run_gets_for_the_fields_it_does_not_set():
  """What every config that leaves a field alone runs with. A change here changes those runs
  (and docs/training.md's account of them): make it on purpose."""
  c = experiment.base_config("small")
  assert {k: v for k, v in c.to_dict().items()
          if k not in ("model", "data", "logical_axis_rules")} == {
      "adam_b1": 0.9, "adam_b2": 0.98, "adam_eps": 1e-09, "async_checkpointing": True,
      "average_last_checkpoints": 1, "beam_size": 1, "bleu_every_steps": 1000,
      "bleu_num_sentences": 256, "checkpoint_every_steps": 500, "coordinator_address": "",
      "coordinator_bind_address": "", "cpu_peak_matmul_size": 2048, "distributed": "auto",
      "early_stopping_min_delta": 0.0, "early_stopping_patience": 0, "eval_every_steps": 500,
      "flatten_optimizer": False, "grad_accum_steps": 1, "grad_clip_norm": 0.0, "init_from": "",
      "keep_best": "", "keep_checkpoints": 3, "keep_every_steps": 0, "label_smoothing": 0.1,
      "learning_rate": 1.0, "length_penalty_alpha": 0.6, "log_every_steps": 50,
      "max_len_margin": 50, "mesh": {"data": -1, "fsdp": 1, "tensor": 1}, "num_processes": 0,
      "num_train_steps": 2000, "process_id": -1, "schedule": "rsqrt", "seed": 0,
      "warmup_steps": 4000, "weight_decay": 0.0, "weight_decay_mask": "matrices"}
  assert default_data_config().to_dict() == {
      "batch_size": 64, "batch_tokens": 0, "batching": "pack",
      "bucket_boundaries": (8, 16, 24, 32, 48, 64, 96, 128, 192, 256), "bucket_rows_multiple": 8,
      "data_dir": None, "dataset": "numbers", "eval_batch_size": 64, "eval_max_len": 0,
      "held_out_per_mille": 30, "locale_ding_path": None, "locale_dir": None,
      "locale_include_ding": False, "max_source_len": 64, "max_target_len": 64,
      "num_threads": 2, "numbers_eval_size": 1000, "numbers_seed": 0,
      "numbers_train_size": 50000, "prefetch": 4, "shuffle_seed": 0, "source_lang": "en",
      "source_path": None, "split": "grouped", "target_lang": "de", "target_path": None,
      "tsv_path": None, "vocab_byte_fallback": False, "vocab_max_chars": 10_000_000,
      "vocab_model_type": "bpe", "vocab_path": None, "vocab_size": 2000,
      "vocab_split_digits": True, "window_chunks": 16}
  # keep_best's metrics and which way is better for each.
  assert experiment.BEST_METRICS == {"bleu": True, "eval_loss": False, "eval_nll": False,
                                     "eval_perplexity": False, "eval_accuracy": True}
  # The model config of a run without a tokenizer (the benchmarks') has the tokenizer's ids.
  model = experiment.transformer_config(c, vocab_size=100)
  assert (model.pad_id, model.bos_id, model.eos_id) == (
      tokenizer.PAD_ID, tokenizer.BOS_ID, tokenizer.EOS_ID)
  # dropout_rate None leaves TransformerConfig's default; a rate given is kept.
  c.model.dropout_rate = None
  assert experiment.transformer_config(c, 100).dropout_rate == model.dropout_rate == 0.1
  c.model.dropout_rate = 0.3
  assert experiment.transformer_config(c, 100).dropout_rate == 0.3
