"""Every shipped config loads, validates and yields a valid model config."""
import importlib.util
import json
import math
import os
import re

import pytest

from transformer_jax import data as data_lib
from transformer_jax import experiment, sweeps
from transformer_jax.data import tokenizer
from transformer_jax.data.config import DataError, default_data_config, stray_corpus_field
from transformer_jax.run import workdir as workdir_lib

import tiny_config

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
      "source_path": None, "split": "grouped_v2", "target_lang": "de", "target_path": None,
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


# ---------------------------------------------------------------- refused at start, by validate
# (cheap: no data, no training; each names the field and what to do)


def _tiny(**fields):
  c = tiny_config.get_config()
  for key, value in fields.items():
    *parents, leaf = key.split(".")
    target = c
    for parent in parents:
      target = target[parent]
    target[leaf] = value
  return c


def test_fields_a_config_file_adds_are_refused_with_the_closest_name():
  """get_config() runs before config_flags locks the config: a misspelt field set there was
  recorded in config.json and ignored (the run trained with the default), and every resume was
  then refused as a config "made by another version"."""
  c = _tiny()
  c.num_train_step = 2
  c.data.batchsize = 4
  with pytest.raises(ValueError, match=re.escape(
      "config.data.batchsize (did you mean config.data.batch_size?), config.num_train_step (did "
      "you mean config.num_train_steps?): no such fields, set in my.py; a run would ignore them")):
    experiment.validate(c, source="my.py")
  c = _tiny()
  c.model.d_modle = 8
  with pytest.raises(ValueError, match=re.escape(
      "config.model.d_modle (did you mean config.model.d_model?): no such field, set by the "
      "config;")):
    experiment.validate(c)
  c = _tiny()
  c.model.vocab_size = 8  # a field the run sets itself, from the tokenizer
  with pytest.raises(ValueError, match=r"^config.model.vocab_size \(did you mean "
                                       r"config.data.vocab_size\?\): no such field"):
    experiment.validate(c)
  # A mesh may name only some axes; an unknown one has its own message.
  c = _tiny(mesh={"data": -1})
  experiment.validate(c)
  c.mesh.model = 2
  with pytest.raises(ValueError, match=r"config.mesh=.*unknown axes \['model'\]"):
    experiment.validate(c)


@pytest.mark.parametrize("field, value, match", [
    ("learning_rate", math.inf, r"config.learning_rate=inf: must be > 0 \(and finite\)"),
    ("adam_eps", math.inf, r"config.adam_eps=inf: must be > 0"),
    ("weight_decay", math.nan, r"config.weight_decay=nan: must be >= 0 and finite"),
    ("grad_clip_norm", math.inf, r"config.grad_clip_norm=inf: must be >= 0 and finite"),
    ("length_penalty_alpha", math.nan, r"config.length_penalty_alpha=nan: must be a finite "),
    ("keep_every_steps", -1, r"config.keep_every_steps=-1: must be >= 0 \(0 turns it off\)"),
    ("model.layer_norm_epsilon", 0.0, r"^config.model.layer_norm_epsilon=0.0: must be > 0 and "
                                      r"finite"),
    ("model.layer_norm_epsilon", math.nan, r"config.model.layer_norm_epsilon=nan: must be > 0"),
    ("model.layer_norm_epsilon", -1e-6, r"config.model.layer_norm_epsilon=-1e-06: must be > 0"),
    # A constant schedule's learning_rate is reached at the end of its linear warm-up: a run
    # that ends inside it never trains at that rate (the tiny config: 10 warm-up, 6 steps).
    ("schedule", "constant", r"config.warmup_steps=10: must be < num_train_steps=6 with "
                             r"schedule='constant' \(the warm-up rises linearly to "
                             r"learning_rate, which a run that ends inside it never reaches\)"),
    ("schedule", "cosine", r"config.warmup_steps=10: must be < num_train_steps=6 with "
                           r"schedule='cosine' \(the decay runs over the steps after the "
                           r"warm-up\)"),
    # Read only with coordinator_address: alone they were ignored without a word.
    ("num_processes", 2, r"config.num_processes=2: is used only with "
                         r"config.coordinator_address"),
    ("process_id", 0, r"config.process_id=0: is used only with config.coordinator_address"),
])
def test_values_no_run_can_use_are_refused(field, value, match):
  with pytest.raises(ValueError, match=match):
    experiment.validate(_tiny(**{field: value}))


@pytest.mark.parametrize("fields", [
    # The bounds themselves: 0 turns each off; a negative alpha favours short outputs (search.py
    # handles it); the paper's schedule may end before its peak (its rate is a multiplier).
    {"weight_decay": 0.0, "grad_clip_norm": 0.0, "keep_every_steps": 0},
    {"length_penalty_alpha": -0.5, "keep_every_steps": 5, "model.layer_norm_epsilon": 1e-12},
    {"length_penalty_alpha": 0.0},
    {"schedule": "constant", "warmup_steps": 5},
    {"schedule": "rsqrt", "warmup_steps": 10},
    {"coordinator_address": "127.0.0.1:1234", "num_processes": 2, "process_id": 0},
])
def test_values_at_the_bounds_are_accepted(fields):
  experiment.validate(_tiny(**fields))


@pytest.mark.parametrize("fields, match", [
    ({"source_lang": "fr"}, r"data.dataset='numbers' is English-German, got "
                            r"data.source_lang='fr', data.target_lang='de'"),
    ({"dataset": "locale", "source_lang": "de", "target_lang": "fr"},
     r"data.dataset='locale' pairs English with one language, got"),
    ({"dataset": "locale", "target_lang": "fr", "locale_include_ding": True},
     r"data.locale_include_ding=True adds a German dictionary, but the pair is en-fr"),
    ({"dataset": "locale", "source_lang": "de", "target_lang": "en"}, None),
    ({"dataset": "locale", "locale_include_ding": True}, None),
    ({"source_lang": "de", "target_lang": "en"}, None),
])
def test_language_pairs_the_corpora_lack_are_refused_at_start(fields, match):
  """Found before only when the dataset was built, as a ValueError's traceback."""
  c = _tiny(**{f"data.{k}": v for k, v in fields.items()})
  if match is None:
    experiment.validate(c)
  else:
    with pytest.raises(DataError, match=match):
      experiment.validate(c)


def test_the_ding_dictionary_set_for_another_dataset_is_a_stray_field():
  c = _tiny(**{"data.locale_include_ding": True})
  assert stray_corpus_field(c.data) == (
      "data.locale_include_ding is set but data.dataset='numbers': add "
      "--config.data.dataset=locale to train on those catalogs, or set "
      "data.locale_include_ding=False")
  c.data.locale_dir = "/srv/locale"   # the first named, with the way out of a path
  assert stray_corpus_field(c.data).endswith("or drop data.locale_dir")
  c.data.dataset = "locale"
  assert stray_corpus_field(c.data) is None


def test_an_empty_path_is_no_path_on_resume():
  """`--config.data.vocab_path=` recorded "", and the same run resumed without it (None) was
  refused as a tokenizer change "'' -> None"; the paths' readers take both for unset."""
  c = _tiny()
  stored = json.loads(c.to_json_best_effort())
  stored["data"].update(vocab_path="", locale_dir="")
  assert workdir_lib.config_changes(stored, json.loads(c.to_json_best_effort())) == []
  c.data.vocab_path = "other.model"
  assert workdir_lib.config_changes(stored, json.loads(c.to_json_best_effort())) == [
      ("data.vocab_path", None, "other.model")]


def test_a_run_started_with_a_nan_weight_decay_resumes_with_0():
  """NaN passed validate's `< 0` checks, and the optimizer's `> 0` made it plain Adam without
  clipping: the value validate now asks for (0) is no change of the optimizer's structure."""
  for field in ("weight_decay", "grad_clip_norm"):
    assert workdir_lib.refusal(field, math.nan, 0.0, {}, has_checkpoint=True,
                               has_tokenizer=True) is None
    assert workdir_lib.refusal(field, math.nan, 0.1, {}, has_checkpoint=True,
                               has_tokenizer=True).startswith("the optimizer state's structure")


def test_a_tokenizer_the_run_did_not_train_is_compared_with_the_vocab_fields(tmp_path):
  """data.vocab_path naming an existing model: it is used as it is, whatever data.vocab_* say
  (and config.json records), so the run warns of each field it does not follow."""
  texts = [f"the {w} house number {i} is {a}" for i, (w, a) in enumerate(
      [("red", "big"), ("blue", "small"), ("green", "old"), ("white", "new")] * 10)]
  path = str(tmp_path / "other.model")
  trained = tokenizer.train_tokenizer(texts, path, vocab_size=40, model_type="unigram",
                                      max_chars=10**6, split_digits=False, byte_fallback=False,
                                      seed=0)
  # The model file alone: its trainer spec (the pieces it got, not the size asked for).
  assert data_lib.vocab_settings(path) == {"vocab_model_type": "unigram",
                                           "vocab_split_digits": False,
                                           "vocab_byte_fallback": False}
  c = default_data_config()
  c.update(vocab_size=20)
  assert data_lib.vocab_settings_not_followed(c, path, trained.vocab_size) == (
      f"{path} was trained with other settings than this config's data.vocab_* fields, which "
      "config.json records but only a tokenizer the run trains itself follows: "
      "vocab_model_type='bpe' (the tokenizer's: 'unigram'), vocab_split_digits=True (the "
      f"tokenizer's: False), vocab_size=20 (the tokenizer has {trained.vocab_size} pieces)")
  c.update(vocab_size=40, vocab_model_type="unigram", vocab_split_digits=False)
  assert data_lib.vocab_settings_not_followed(c, path, trained.vocab_size) is None
  # With the data config a run records beside the model it trains: every field, exactly.
  with open(path + ".json", "w") as f:
    json.dump({**c.to_dict(), "vocab_size": 50, "vocab_max_chars": 1000}, f)
  assert data_lib.vocab_settings_not_followed(c, path, trained.vocab_size).endswith(
      "follows: vocab_size=40 (the tokenizer's: 50), vocab_max_chars=10000000 (the tokenizer's: "
      "1000)")
  # A record that does not read (cut short, or not an object): the model file's spec alone.
  for damaged in ('{"vocab_size": 5', '["vocab_size"]'):
    with open(path + ".json", "w") as f:
      f.write(damaged)
    assert data_lib.vocab_settings(path) == {"vocab_model_type": "unigram",
                                             "vocab_split_digits": False,
                                             "vocab_byte_fallback": False}
