"""Training: the schedule, the loss, accumulation, config errors, checkpoints, resume, signals."""
import errno
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import types
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import transformer_jax as tj
from transformer_jax import experiment, losses, optim, sharding, steps
from transformer_jax import flops as flops_lib
from transformer_jax.run import checkpointing, distributed, loop, metrics, throughput
from transformer_jax.run import trainer as trainer_lib
from transformer_jax.run import workdir as workdir_lib
from transformer_jax.run.trainer import Trainer

import tiny_config as tiny_config_module

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tiny_config(data_dir, **overrides):
  c = tiny_config_module.get_config()
  c.data.data_dir = str(data_dir)
  for k, v in overrides.items():
    target = c
    *parents, leaf = k.split(".")
    for p in parents:
      target = target[p]
    target[leaf] = v
  return c


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return tmp_path_factory.mktemp("tfds")


def train_losses(workdir):
  return {m["step"]: m["train_loss"] for m in metrics.read_metrics(workdir) if "train_loss" in m}


# ---------------------------------------------------------------- pure pieces


def test_paper_learning_rate_schedule():
  d_model, warmup = 512, 4000
  schedule = optim.paper_schedule(d_model, warmup)
  for count in [0, 1, 99, 3999, 4000, 10_000, 99_999]:
    step = count + 1
    expected = d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
    assert float(schedule(count)) == pytest.approx(expected, rel=1e-5)
  peak = max(float(schedule(c)) for c in range(3990, 4010))
  assert peak == pytest.approx(512**-0.5 * 4000**-0.5, rel=1e-4)   # ~7.0e-4 at step 4000


def test_label_smoothed_loss_against_hand_computation():
  logits = np.array([[[2.0, 0.5, -1.0, 0.0]]], np.float32)
  target = np.array([[1]])
  eps, V = 0.1, 4
  logp = logits[0, 0] - np.log(np.exp(logits[0, 0]).sum())
  q = np.full(V, eps / (V - 1))
  q[1] = 1 - eps
  cross = -(q * logp).sum()
  entropy = -(q * np.log(q)).sum()
  loss, nll = losses.smoothed_cross_entropy(jnp.asarray(logits), jnp.asarray(target),
                                            jnp.ones((1, 1)), eps)
  assert float(loss[0, 0]) == pytest.approx(cross - entropy, rel=1e-5)
  assert float(nll[0, 0]) == pytest.approx(-logp[1], rel=1e-5)
  # Weights zero out padding; no smoothing gives the plain NLL.
  loss0, _ = losses.smoothed_cross_entropy(jnp.asarray(logits), jnp.asarray(target),
                                           jnp.zeros((1, 1)), eps)
  assert float(loss0[0, 0]) == 0.0
  plain, _ = losses.smoothed_cross_entropy(jnp.asarray(logits), jnp.asarray(target),
                                           jnp.ones((1, 1)), 0.0)
  assert float(plain[0, 0]) == pytest.approx(-logp[1], rel=1e-5)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_loss_gradient_of_bfloat16_logits_is_accumulated_in_float32(smoothing):
  # The gradient of the loss with respect to bfloat16 logits must be computed in float32 and
  # rounded once: softmax - target cancels at a confident label, and adding the terms in
  # bfloat16 first made the gradient 10x less accurate (2e-2 against 2e-3 relative error).
  rng = np.random.default_rng(0)
  vocab = 256
  logits = rng.normal(size=(4, 64, vocab)).astype(np.float32)
  targets = rng.integers(0, vocab, (4, 64))
  np.put_along_axis(logits, targets[..., None], 9.0, axis=-1)  # confident, correct labels
  weights = jnp.ones((4, 64))

  def grad(x):
    return jax.grad(lambda z: losses.loss_sums(z, jnp.asarray(targets), weights,
                                               smoothing)["loss"])(x)

  bf16 = jnp.asarray(logits, jnp.bfloat16)
  ref = np.asarray(grad(bf16.astype(jnp.float32)), np.float64)   # same inputs, all float32
  out = grad(bf16)
  assert out.dtype == jnp.bfloat16
  err = np.linalg.norm(np.asarray(out, np.float64) - ref) / np.linalg.norm(ref)
  assert err < 5e-3, err   # one rounding to bfloat16 (8-bit mantissa) is about 2e-3
  # Float32 logits (plain autodiff): the gradient is softmax - smoothed target.
  x32 = jnp.asarray(logits)
  lse = jax.nn.logsumexp(x32, axis=-1, keepdims=True)
  q = np.full(logits.shape, smoothing / (vocab - 1), np.float32)
  np.put_along_axis(q, targets[..., None], 1 - smoothing, axis=-1)
  np.testing.assert_allclose(grad(x32), jnp.exp(x32 - lse) - q, atol=1e-6)


def test_gradient_accumulation_equals_big_batch():
  cfg = tj.model_config("tiny", vocab_size=30, dropout_rate=0.0, num_encoder_layers=1,
                        num_decoder_layers=1)
  model = tj.Transformer(cfg)
  tx = optax.sgd(1.0)
  rng = np.random.default_rng(0)
  inputs = rng.integers(4, 30, (8, 10)).astype(np.int32)
  targets = rng.integers(4, 30, (8, 7)).astype(np.int32)
  # Unequal token counts per row, so a mean of per-microbatch means would differ.
  for r in range(8):
    targets[r, 7 - r % 4:] = 0
  batch = {"inputs": jnp.asarray(inputs), "targets": jnp.asarray(targets)}
  state = steps.init_train_state(model, tx, jax.random.key(0), (1, 8))
  state = steps.unbox(state)
  one = jax.jit(steps.make_train_step(model, tx, lambda s: 1.0, 0.1, 1))
  four = jax.jit(steps.make_train_step(model, tx, lambda s: 1.0, 0.1, 4))
  s1, m1 = one(state, batch)
  s4, m4 = four(state, batch)
  for k in ("loss", "nll", "correct", "tokens"):
    assert float(m1[k]) == pytest.approx(float(m4[k]), rel=1e-5), k
  assert float(m1["grad_norm"]) == pytest.approx(float(m4["grad_norm"]), rel=1e-4)
  for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s4.params)):
    np.testing.assert_allclose(a, b, atol=2e-6)
  # And the accumulation did change something (the test could fail).
  assert float(m1["grad_norm"]) > 0


@pytest.mark.parametrize("field,value,match", [
    ("schedule", "linear", r"config.schedule='linear': expected one of"),
    ("num_train_steps", 0, r"config.num_train_steps=0: must be >= 1"),
    ("label_smoothing", 1.5, r"config.label_smoothing=1.5: must be in \[0, 1\)"),
    ("grad_accum_steps", 3, r"config.grad_accum_steps=3: must divide the 8 rows"),
    ("data.batching", "foo", r"data.batching='foo'"),
    ("bleu_num_sentences", 0, r"config.bleu_num_sentences=0: must be >= 1"),
    ("cpu_peak_matmul_size", 8, r"config.cpu_peak_matmul_size=8: must be >= 16"),
    # The tiny config warms up for 10 of its 6 steps: no steps are left for a cosine decay.
    ("schedule", "cosine", r"config.warmup_steps=10: must be < num_train_steps=6"),
    ("weight_decay", -0.1, r"config.weight_decay=-0.1: must be >= 0"),
    ("grad_clip_norm", -1.0, r"config.grad_clip_norm=-1.0: must be >= 0"),
    ("weight_decay_mask", "norms", r"config.weight_decay_mask='norms': expected one of"),
    ("coordinator_address", "127.0.0.1:1234",
     r"config.num_processes=0: must be >= 1 with coordinator_address"),
    ("keep_best", "BLEU", r"config.keep_best='BLEU': expected '' \(off\) or one of \['bleu', "),
    # The tiny config keeps 3 checkpoints: averaging 4 would find one deleted after training.
    ("average_last_checkpoints", 4, r"config.average_last_checkpoints=4: must be in \[1, "
     r"keep_checkpoints=3\]"),
    ("average_last_checkpoints", 0, r"config.average_last_checkpoints=0: must be in \[1, "),
    # Model fields are checked before any data is built, the vocabulary's size aside.
    # Named as config fields, not as TransformerConfig's.
    ("model.num_heads", 5, r"^config.model.d_model=32 is not divisible by num_heads=5"),
    ("model.max_len", 16, r"config.model.max_len=16: must be >= data.max_source_len / "
     r"max_target_len \(32\)"),
])
def test_bad_config_values_name_the_field(tmp_path, field, value, match):
  c = tiny_config(tmp_path, **{field: value})
  with pytest.raises(ValueError, match=match):
    experiment.validate(c)


COORDINATOR = {"coordinator_address": "127.0.0.1:1234"}
BEST = {"keep_best": "bleu", "early_stopping_patience": 2}


@pytest.mark.parametrize("fields, match", [
    # Each check's bound: the value at it accepted (None), the one past it refused.
    ({"learning_rate": 1e-9, "adam_eps": 1e-12}, None),
    ({"learning_rate": 0.0}, r"config.learning_rate=0.0: must be > 0"),
    ({"adam_eps": 0.0}, r"config.adam_eps=0.0: must be > 0"),
    ({"warmup_steps": 1}, None),
    ({"warmup_steps": 0}, r"config.warmup_steps=0: must be >= 1 with schedule='rsqrt'"),
    ({"schedule": "constant", "warmup_steps": 0}, None),
    ({"schedule": "constant", "warmup_steps": -1}, r"config.warmup_steps=-1: must be >= 0"),
    ({"schedule": "cosine", "num_train_steps": 10, "warmup_steps": 9}, None),
    ({"schedule": "cosine", "num_train_steps": 10, "warmup_steps": 10}, r"must be < num_train"),
    ({"adam_b1": 0.0, "label_smoothing": 0.0, "adam_b2": 0.999}, None),
    ({"adam_b2": -0.5}, r"config.adam_b2=-0.5: must be in \[0, 1\)"),
    ({"label_smoothing": 1.0}, r"config.label_smoothing=1.0: must be in \[0, 1\)"),
    ({"cpu_peak_matmul_size": 16, "beam_size": 1, "max_len_margin": 0}, None),
    ({"cpu_peak_matmul_size": 15}, r"config.cpu_peak_matmul_size=15: must be >= 16"),
    ({"beam_size": 0}, r"config.beam_size=0: must be >= 1"),
    ({"max_len_margin": -1}, r"config.max_len_margin=-1: must be >= 0"),
    ({**COORDINATOR, "num_processes": 1, "process_id": 0}, None),
    ({**COORDINATOR, "num_processes": 2, "process_id": 1}, None),
    ({**COORDINATOR, "num_processes": 2, "process_id": 2}, r"config.process_id=2: must be in "
     r"\[0, num_processes=2\)"),
    ({**COORDINATOR, "num_processes": 2, "process_id": -1}, r"config.process_id=-1: must be in"),
    ({"early_stopping_patience": -1}, r"config.early_stopping_patience=-1: must be >= 0"),
    ({**BEST, "early_stopping_min_delta": 0.5}, None),
    ({**BEST, "early_stopping_min_delta": -0.5}, r"early_stopping_min_delta=-0.5: must be a "
     r"finite number >= 0"),
    ({**BEST, "early_stopping_min_delta": float("inf")}, r"early_stopping_min_delta=inf: must be"),
    ({"flatten_optimizer": True}, None),
    ({"mesh.tensor": 2}, None),
    ({"flatten_optimizer": True, "mesh.fsdp": 2}, r"config.flatten_optimizer=True: needs a "
     r"data-parallel mesh, but config.mesh splits \{'fsdp': 2\}"),
    ({"grad_accum_steps": 2, "data.bucket_rows_multiple": 3}, None),    # packed rows
    ({"grad_accum_steps": 2, "data.batching": "bucket", "data.bucket_rows_multiple": 4}, None),
])
def test_each_config_check_has_its_bound_where_its_message_says(tmp_path, fields, match):
  c = tiny_config(tmp_path, **fields)
  if match is None:
    experiment.validate(c)
  else:
    with pytest.raises(ValueError, match=match):
      experiment.validate(c)


def test_grad_accum_checked_against_the_real_rows(tmp_path):
  # 250 tokens per batch // 32-token rows = 7 rows: 2 microbatches cannot split them.
  c = tiny_config(tmp_path, **{"data.batch_tokens": 250, "grad_accum_steps": 2})
  with pytest.raises(ValueError, match="must divide the 7 rows"):
    experiment.validate(c)
  c = tiny_config(tmp_path, **{"data.batching": "bucket", "grad_accum_steps": 2,
                               "data.bucket_rows_multiple": 3})
  with pytest.raises(ValueError, match="bucket_rows_multiple=3"):
    experiment.validate(c)


def test_bad_model_field_names_the_field(tmp_path):
  c = tiny_config(tmp_path, **{"model.num_heads": 5})
  with pytest.raises(ValueError, match="d_model=32 is not divisible by num_heads=5"):
    experiment.transformer_config(c, vocab_size=10)


@pytest.mark.parametrize("mesh, vocab, match", [
    ({"data": 4, "tensor": 2}, 201, r"the vocabulary size \(data.vocab_size is an upper bound: "
     r"the tokenizer's piece count decides\) = 201 does not split over mesh axes \('tensor',\) "
     r"\(2 devices"),
    ({"data": 1, "tensor": 8}, 200, r"model.num_heads = 4 does not split over mesh axes "
     r"\('tensor',\) \(8 devices"),
    ({"data": 4, "tensor": 2}, 200, None),
])
def test_sizes_the_mesh_does_not_divide_name_their_field(mesh, vocab, match):
  # Before: jax's IndivisibleError at the first step, naming an array shape but no field.
  c = tiny_config_module.get_config()
  c.mesh = mesh
  model_cfg = experiment.transformer_config(c, vocab)
  if match is None:
    steps.TrainSetup(c, model_cfg)
  else:
    with pytest.raises(ValueError, match=match):
      steps.TrainSetup(c, model_cfg)


def test_mesh_shapes():
  assert sharding.mesh_shape({"data": -1, "fsdp": 1, "tensor": 2}, 8) == (4, 1, 2)
  assert sharding.mesh_shape({"data": 2, "fsdp": 2, "tensor": 2}, 8) == (2, 2, 2)
  with pytest.raises(ValueError, match="does not divide"):
    sharding.mesh_shape({"data": 3, "tensor": -1}, 8)
  with pytest.raises(ValueError, match="unknown axes"):
    sharding.mesh_shape({"model": 2}, 8)
  # Sizes that are no size: each named as such, not left to a division by zero or to a
  # product of negative sizes.
  with pytest.raises(ValueError, match="at most one axis may be -1"):
    sharding.mesh_shape({"data": -1, "tensor": -1}, 8)
  for bad in ({"data": 0}, {"data": -2, "tensor": -1}, {"fsdp": -4}):
    with pytest.raises(ValueError, match="does not divide the 8 devices"):
      sharding.mesh_shape(bad, 8)


# ---------------------------------------------------------------- end to end


def test_end_to_end_and_resume_reproduces_losses(tmp_path, data_dir, monkeypatch):
  # The default window of 16 chunks (8 epochs of the tiny corpus, whose config sets 1): the
  # resumes below re-read a window that spans epochs, and must get its batches back.
  def config(**overrides):
    return tiny_config(data_dir, **{"data.window_chunks": 16, **overrides})

  full = tmp_path / "full"
  result = loop.train_and_evaluate(config(eval_every_steps=6, bleu_every_steps=6), str(full))
  assert result["step"] == 6
  records = metrics.read_metrics(str(full))
  logged = [r for r in records if "train_loss" in r]
  assert [r["step"] for r in logged] == [1, 2, 3, 4, 5, 6]
  # Step 1 compiles: logged without a throughput.
  assert logged[0]["tokens_per_sec"] is None and logged[0]["includes_compilation"]
  for key in ("train_loss", "learning_rate", "tokens_per_sec", "mfu", "grad_norm"):
    assert all(np.isfinite(r[key]) for r in logged[1:]), key
  evals = [r for r in records if "eval_loss" in r]
  assert evals and {"eval_loss", "eval_accuracy", "bleu"} <= set(evals[-1])
  # The names a sweep report checks --metric against before any point has logged.
  assert set(metrics.MAIN_METRICS) <= {k for r in records for k in r}
  with open(full / "config.json") as f:
    assert json.load(f)["resolved_model"]["vocab_size"] > 0
  assert os.path.exists(full / "spm.model")
  assert sorted(os.listdir(full / "checkpoints")) == ["3", "6"]
  assert os.listdir(full / "tensorboard")

  # Interrupted after 3 steps, then the same command again: the same losses as uninterrupted.
  part = tmp_path / "part"
  loop.train_and_evaluate(config(num_train_steps=3), str(part))
  # As if it had logged step 4 and half of step 5 before a crash: those steps run again, and
  # their old records go.
  with open(part / "metrics.jsonl", "a") as f:
    f.write(json.dumps({"step": 4, "train_loss": 999.0}) + "\n" + '{"step": 5, "train_lo')
  loop.train_and_evaluate(config(), str(part))
  steps_logged = [r["step"] for r in metrics.read_metrics(str(part)) if "train_loss" in r]
  assert steps_logged == [1, 2, 3, 4, 5, 6]
  full_losses, resumed = train_losses(str(full)), train_losses(str(part))
  for step in (4, 5, 6):
    assert resumed[step] == pytest.approx(full_losses[step], rel=1e-6), step
  # A resumed run does not start over: the next loss is not the first one's.
  assert full_losses[2] != pytest.approx(full_losses[6])
  # Logged every 3 steps on, resumed at 6: the compiling step 7 is not a record of its own but
  # in step 9's (the window an uninterrupted run logs it in), which is timed without it.
  loop.train_and_evaluate(config(num_train_steps=9, log_every_steps=3), str(part))
  after = [r for r in metrics.read_metrics(str(part)) if "train_loss" in r and r["step"] > 6]
  assert [r["step"] for r in after] == [9], after
  assert after[0]["tokens_per_sec"] > 0 and "includes_compilation" not in after[0]

  # init_from takes another run's parameters when the workdir is empty. Its vocabulary comes
  # along, copied: the fork trains no tokenizer of its own and stands on its own afterwards.
  c = config(num_train_steps=7, init_from=str(full / "checkpoints" / "6"))
  trainer = Trainer.create(c, str(tmp_path / "from"))
  assert trainer.data.tokenizer.path == str(tmp_path / "from" / "spm.model")
  assert (tmp_path / "from" / "spm.model").read_bytes() == (full / "spm.model").read_bytes()
  state, data_state, origin = trainer.initial_state()
  assert "parameters from" in origin and data_state is None and int(state.step) == 0
  _, saved = checkpointing.load_params(str(full))
  for a, b in zip(jax.tree.leaves(saved), jax.tree.leaves(state.params)):
    np.testing.assert_array_equal(a, np.asarray(b))
  # Evaluation's figures do not depend on how its pairs are batched: 56 rows a batch (more
  # rows than pieces in a row) or 3 (filled up to the 8 devices with empty rows).
  figures = {}
  for rows in (56, 3):
    trainer.data.config.eval_batch_size = rows
    figures[rows] = trainer.evaluate(state.params)
  assert figures[3] == pytest.approx(figures[56], rel=1e-5)
  assert figures[56]["eval_loss"] > 1 and 0 < figures[56]["eval_accuracy"] < 1  # rows were seen
  # BLEU on the first 4 pairs searches the batches that hold them, not the whole split; its
  # example is the first pair's output (here the first 2 pieces of each source).
  searched = []
  def search(model_config, params, inputs, **settings):
    searched.append(np.asarray(inputs))
    return np.asarray(inputs), np.full(len(inputs), 2, np.int32)
  monkeypatch.setattr(trainer_lib, "search_batch", search)
  result = trainer.bleu(state.params, 4)
  assert result["bleu_sentences"] == 4 and [len(x) for x in searched] == [3, 3]
  outputs = [trainer.data.tokenizer.detokenize(row[:2].tolist()) for b in searched for row in b]
  assert result["bleu_example"] == outputs[0] and outputs[0] not in outputs[1:4], outputs
  # Parameters of another shape: the first parameter that differs, and the model fields of the
  # init_from run's config.json that differ (it said only "do not match this model's shapes").
  c = config(num_train_steps=7, init_from=str(full), **{"model.d_ff": 48})
  with pytest.raises(workdir_lib.RunError) as e:
    Trainer.create(c, str(tmp_path / "wider")).initial_state()
  assert (f"config.init_from={str(full)!r}: its parameters do not match this model's shapes: "
          "decoder/layer_0/feed_forward/") in str(e.value), e.value
  assert "(its config.json differs in model.d_ff: 64 there, 48 here)" in str(e.value), e.value


def test_the_cadence_reads_the_stop_flag_every_step_alone_and_at_log_steps_together():
  cadence = loop.Cadence(num_train_steps=6, log_every=4, checkpoint_every=5, eval_every=3,
                         bleu_every=1000)
  assert [s for s in range(1, 7) if cadence.reads_stop(s, processes=1)] == [1, 2, 3, 4, 5, 6]
  assert [s for s in range(1, 7) if cadence.reads_stop(s, processes=2)] == [4, 6]


def test_every_save_and_evaluation_logs_the_training_before_it_and_is_left_out_of_its_timing(
    tmp_path, data_dir, monkeypatch, capsys):
  """Log every 4 steps, evaluate every 3, save every 5 (of 6): steps 3 and 5 are logged too,
  the time a save or an evaluation takes counts in no throughput, the bar shows each timed
  record, one batch is read a step, and a finished run run again deletes no checkpoint (its
  keep_checkpoints lowered: nothing trains, so no save follows a pruning)."""
  # The throughput's clock: the real one, plus 100 s for each save and evaluation (a real
  # sleep of 1 s made the bound below a matter of the machine's load).
  slept = [0.0]
  monkeypatch.setattr(throughput, "time", types.SimpleNamespace(
      perf_counter=lambda: time.perf_counter() + slept[0]))
  save = checkpointing.Checkpointer.save

  def slow_save(self, *args, **kwargs):
    slept[0] += 100.0
    return save(self, *args, **kwargs)

  monkeypatch.setattr(checkpointing.Checkpointer, "save", slow_save)
  evaluate = Trainer.evaluate

  def slow_evaluate(self, *args, **kwargs):
    slept[0] += 100.0
    return evaluate(self, *args, **kwargs)

  monkeypatch.setattr(Trainer, "evaluate", slow_evaluate)
  # The start-up line gives the peak in TFLOP/s (a stand-in for the measured one).
  monkeypatch.setattr(loop.flops, "peak_flops",
                      lambda dtype, n: (1.234e12, "measured: a stand-in"))
  shown = {}  # the bar's figures: each timed record's (the compiling first step has none)
  update = metrics.Progress.update
  monkeypatch.setattr(metrics.Progress, "update", lambda self, step, info=None: (
      shown.update({step: info}) if info else None, update(self, step, info))[1])
  read = []  # batches taken from the pipeline: one a step, none beyond the last
  next_batch = trainer_lib.TrainBatches.next
  monkeypatch.setattr(trainer_lib.TrainBatches, "next",
                      lambda self: read.append(1) or next_batch(self))
  c = tiny_config(data_dir, log_every_steps=4, eval_every_steps=3, checkpoint_every_steps=5)
  loop.train_and_evaluate(c, str(tmp_path))
  assert len(read) == 6
  records = {r["step"]: r for r in metrics.read_metrics(str(tmp_path)) if "train_loss" in r}
  assert sorted(records) == [1, 3, 4, 5, 6]
  assert sorted(shown) == [3, 4, 5, 6] and all(
      shown[s]["train_loss"] == records[s]["train_loss"] and
      shown[s]["tokens_per_sec"] == records[s]["tokens_per_sec"] for s in shown)
  # Step 6's window starts after step 5's save: about one step, not the second of the save;
  # step 4's after step 3's evaluation.
  # (Under 0.01 when the save counted; above 0.05 while a tiny step takes under 20 s.)
  assert records[6]["steps_per_sec"] > 0.05, records[6]
  assert records[4]["steps_per_sec"] > 0.05, records[4]
  out = "".join(capsys.readouterr())
  assert "warning: None" not in out
  assert "peak 1.234 TFLOP/s per device (measured: a stand-in)" in out
  assert checkpointing.checkpoint_steps(str(tmp_path / "checkpoints")) == [5, 6]
  loop.train_and_evaluate(tiny_config(data_dir, log_every_steps=4, eval_every_steps=3,
                                      checkpoint_every_steps=5, keep_checkpoints=1),
                          str(tmp_path))
  assert checkpointing.checkpoint_steps(str(tmp_path / "checkpoints")) == [5, 6]


def test_batches_that_do_not_split_over_the_devices_are_refused(tmp_path, data_dir):
  assert jax.device_count() == 8
  with pytest.raises(ValueError, match=r"6 rows does not split over the 8 devices.*batch_size"):
    Trainer.create(tiny_config(data_dir, **{"data.batch_size": 6}), str(tmp_path / "a"))
  # Buckets of a multiple of 3 rows (6 here) do not split over 8 devices.
  c = tiny_config(data_dir, **{"data.batching": "bucket", "data.bucket_rows_multiple": 3})
  with pytest.raises(ValueError, match=r"6 rows does not split.*bucket_rows_multiple"):
    Trainer.create(c, str(tmp_path / "b"))
  # Splitting over fewer devices (4 x 2 tensor) is fine for 4 rows.
  c = tiny_config(data_dir, **{"data.batch_size": 4, "mesh.data": 4, "mesh.tensor": 2})
  Trainer.create(c, str(tmp_path / "c")).checkpointer.close()


def test_evaluation_fits_sentences_to_a_learned_position_table(tmp_path, data_dir, monkeypatch):
  # The tiny task's validation split has sentences longer than 32 pieces: a learned table of 32
  # positions used to fail the first evaluation (and every resume after it) with "a sequence of
  # 40 positions is longer than the learned position table".
  c = tiny_config(data_dir, **{"model.position_encoding": "learned", "model.max_len": 32})
  trainer = Trainer.create(c, str(tmp_path / "learned"))
  assert trainer.eval_max_len == 32
  assert re.fullmatch(r"\d+ validation pairs are longer than the learned position table "
                      r"\(model.max_len=32 pieces with EOS\): evaluation loss and BLEU see "
                      r"their first 31 pieces", trainer.eval_cut_warning())
  params = trainer.setup.init_state(jax.random.key(0)).params
  assert np.isfinite(trainer.evaluate(params)["eval_loss"])
  assert trainer.bleu(params, 4)["bleu_sentences"] == 4
  trainer.checkpointer.close()
  # Sinusoidal positions take any length: nothing cut, nothing said; unless a pair is so long
  # that padding every batch to it may run out of memory (the split's one length).
  trainer = Trainer.create(tiny_config(data_dir), str(tmp_path / "sinusoidal"))
  assert trainer.eval_max_len is None and trainer.eval_cut_warning() is None
  pairs = trainer.data.raw_examples("validation")[:2]
  assert len(trainer.data.tokenizer.encode(" ".join(["I"] * 127))) == 127  # one piece each
  for words, said in ((127, False), (128, True)):  # 128 pieces with EOS: 4 x max_len, not over
    monkeypatch.setattr(trainer.data, "raw_examples",
                        lambda split, words=words: pairs + [(" ".join(["I"] * words), "x")])
    warning = trainer.eval_cut_warning()
    assert (warning is not None) == said, warning
  assert re.fullmatch(r"validation pair 3 \('(I ){20}\.\.\.'\) is 129 "
                      r"pieces with EOS, over 4 times model.max_len=32: evaluation pads every "
                      r"batch of the split to the split's longest pair, data.eval_batch_size=\d+ "
                      r"rows of it, which may run out of memory; if it does, lower "
                      r"data.eval_batch_size", warning)
  trainer.checkpointer.close()


def test_killed_in_the_final_evaluation_keeps_the_checkpoint_and_finishes_on_resume(
    tmp_path, data_dir, monkeypatch):
  workdir = str(tmp_path / "killed")
  c = tiny_config(data_dir, num_train_steps=3)

  def killed(*args, **kwargs):
    raise KeyboardInterrupt("killed during BLEU")

  monkeypatch.setattr(Trainer, "bleu", killed)
  with pytest.raises(KeyboardInterrupt):
    loop.train_and_evaluate(c, workdir)
  # The final step was saved before its evaluation started.
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["3"]
  assert not metrics.evaluated(workdir, 3)
  monkeypatch.undo()
  result = loop.train_and_evaluate(c, workdir)   # the same command again
  assert result["step"] == 3 and "bleu" in result and "eval_loss" in result
  assert metrics.evaluated(workdir, 3)
  assert [r["step"] for r in metrics.read_metrics(workdir) if "train_loss" in r] == [1, 2, 3]
  # Once done, running it again changes nothing, and reports the run's last figures.
  before = metrics.read_metrics(workdir)
  again = loop.train_and_evaluate(c, workdir)
  assert metrics.read_metrics(workdir) == before
  assert again["step"] == 3 and again["bleu"] == result["bleu"]


def test_non_finite_loss_stops_and_keeps_checkpoint(run, data_dir):
  workdir = run  # a finished 3-step run
  before = sorted(os.listdir(os.path.join(workdir, "checkpoints")))
  with pytest.raises(throughput.NonFiniteLossError, match="non-finite training loss"):
    loop.train_and_evaluate(tiny_config(data_dir, num_train_steps=6, learning_rate=1e38,
                                         schedule="constant", warmup_steps=1), workdir)
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == before
  step, _ = checkpointing.load_params(workdir)
  assert step == 3


def _state_on(mesh, seed=0):
  cfg = tj.model_config("tiny", vocab_size=50)
  model = tj.Transformer(cfg)
  tx = optax.adam(1e-3)
  rules = sharding.DEFAULT_RULES
  boxed = jax.eval_shape(lambda r: steps.init_train_state(model, tx, r, (1, 8)), jax.random.key(0))
  shardings = sharding.logical_shardings(boxed, mesh, rules)
  init = jax.jit(lambda r: steps.unbox(steps.init_train_state(model, tx, r, (1, 8))),
                 out_shardings=shardings)
  return init(jax.random.key(seed)), shardings, boxed


@pytest.mark.parametrize("src,dst", [({"fsdp": 4, "tensor": 2}, "one"),
                                     ("one", {"data": 2, "fsdp": 2, "tensor": 2})])
def test_checkpoint_restores_across_meshes(tmp_path, src, dst):
  one = sharding.make_mesh({"data": 1}, jax.devices()[:1])
  mesh_src = one if src == "one" else sharding.make_mesh(src)
  mesh_dst = one if dst == "one" else sharding.make_mesh(dst)
  state, _, boxed = _state_on(mesh_src)
  ckpt = checkpointing.Checkpointer(str(tmp_path), async_save=False)
  ckpt.save(5, state, {"next": 1}, {"step": 5}, force=True)
  ckpt.wait()
  dst_shardings = sharding.logical_shardings(boxed, mesh_dst, sharding.DEFAULT_RULES)
  target = checkpointing.abstract_like(steps.unbox(boxed), dst_shardings)
  step, restored, data_state, meta = ckpt.restore_latest(target)
  assert step == 5 and data_state == {"next": 1} and meta["step"] == 5
  for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  kernel = restored.params["encoder"]["layer_0"]["self_attention"]["query"]["kernel"]
  assert len(kernel.sharding.device_set) == mesh_dst.size
  ckpt.close()


def test_damaged_checkpoint_falls_back_with_warning(tmp_path, caplog):
  mesh = sharding.make_mesh({"data": 1}, jax.devices()[:1])
  state, shardings, boxed = _state_on(mesh)
  ckpt = checkpointing.Checkpointer(str(tmp_path), async_save=False)
  ckpt.save(1, state, {}, {}, force=True)
  ckpt.save(2, state, {}, {}, force=True)
  ckpt.wait()
  # Damage every file of step 2's state.
  for root, _, files in os.walk(os.path.join(ckpt.directory, "2", "state")):
    for name in files:
      with open(os.path.join(root, name), "wb") as f:
        f.write(b"garbage")
  target = checkpointing.abstract_like(steps.unbox(boxed), shardings)
  step, restored, _, _ = ckpt.restore_latest(target)
  assert step == 1
  assert "does not restore" in caplog.text
  # The damaged step is set aside, so the resumed run can save step 2 again.
  assert ckpt.all_steps() == [1] and os.path.isdir(os.path.join(ckpt.directory, "2.damaged"))
  ckpt.save(2, restored, {}, {}, force=True)
  ckpt.wait()
  assert ckpt.all_steps() == [1, 2]
  shutil.rmtree(os.path.join(ckpt.directory, "2"))
  ckpt.manager.reload()
  # When nothing restores, it is an error, not a silent fresh start.
  for root, _, files in os.walk(os.path.join(ckpt.directory, "1", "state")):
    for name in files:
      with open(os.path.join(root, name), "wb") as f:
        f.write(b"garbage")
  with pytest.raises(checkpointing.CheckpointError, match="none of the checkpoints") as e:
    ckpt.restore_latest(target)
  assert "They all fail alike" not in str(e.value)   # one step: nothing to compare
  ckpt.close()
  # Every step failing alike (here: an optimizer state of another shape) may be the code.
  ckpt = checkpointing.Checkpointer(str(tmp_path / "other"), async_save=False)
  ckpt.save(1, state, {}, {}, force=True)
  ckpt.save(2, state, {}, {}, force=True)
  ckpt.wait()
  sgd = jax.eval_shape(lambda: state.replace(opt_state=optax.sgd(0.1).init(state.params)))
  with pytest.raises(checkpointing.CheckpointError) as e:
    ckpt.restore_latest(checkpointing.abstract_like(sgd))
  assert "none of the checkpoints [1, 2]" in str(e.value)
  assert "They all fail alike: if the code changed since they were written" in str(e.value)
  assert sorted(os.listdir(ckpt.directory)) == ["1", "2"]
  # Each step's line is its error's first line (the message; later lines are detail).
  def fails(step, target):
    raise ValueError(f"cannot read step {step}\ndetail of {step}")
  ckpt.restore = fails
  with pytest.raises(checkpointing.CheckpointError) as e:
    ckpt.restore_latest(checkpointing.abstract_like(state))
  assert "\n  step 2: ValueError: cannot read step 2\n  step 1: ValueError: cannot read" in str(
      e.value) and "detail of" not in str(e.value)
  ckpt.close()


def test_checkpoints_of_another_model_are_not_called_damaged(tmp_path, caplog):
  """Model code that changed the parameter tree (a parameter added, renamed) made every step
  fail to restore, reported as damage with "move the directory aside": intact checkpoints,
  nearly thrown away. Now one error naming the first parameter, and nothing set aside."""
  mesh = sharding.make_mesh({"data": 1}, jax.devices()[:1])
  state, _, _ = _state_on(mesh)
  ckpt = checkpointing.Checkpointer(str(tmp_path), async_save=False)
  ckpt.save(1, state, {}, {}, force=True)
  ckpt.save(2, state, {}, {}, force=True)
  ckpt.wait()
  model = tj.Transformer(tj.model_config("tiny", vocab_size=50, attention_bias=True))
  boxed = jax.eval_shape(lambda r: steps.init_train_state(model, optax.adam(1e-3), r, (1, 8)),
                         jax.random.key(0))
  target = checkpointing.abstract_like(steps.unbox(boxed))
  with pytest.raises(checkpointing.CheckpointError) as e:
    ckpt.restore_latest(target)
  assert str(e.value).startswith(
      f"the checkpoints in {ckpt.directory} hold another model than the one this code builds "
      "from the run's config.json: decoder/layer_0/cross_attention/key/bias has shape none "
      "(missing) there but (4, 8) in the model. They are intact (nothing was moved)"), e.value
  assert "LEGACY_VALUES entry (transformer_jax/run/workdir.py" in str(e.value)
  assert sorted(os.listdir(ckpt.directory)) == ["1", "2"] and "damaged" not in caplog.text
  ckpt.close()


def test_sigterm_saves_a_loadable_checkpoint(tmp_path, data_dir):
  workdir = tmp_path / "sig"
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  cmd = [sys.executable, os.path.join(REPO, "scripts", "train.py"),
         "--config", os.path.join(REPO, "tests", "tiny_config.py"), "--workdir", str(workdir),
         f"--config.data.data_dir={data_dir}",
         "--config.num_train_steps=100000", "--config.checkpoint_every_steps=100000"]
  proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  deadline = time.time() + 240
  try:
    while time.time() < deadline and len(train_losses(str(workdir))) < 3:
      assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
      time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=120)[0].decode()
  finally:
    if proc.poll() is None:
      proc.kill()
  assert proc.returncode == 0, out[-3000:]
  assert "SIGTERM: saved step" in out, out[-3000:]
  assert os.listdir(workdir / "checkpoints"), out[-3000:]
  step, params = checkpointing.load_params(str(workdir))
  assert step >= 4 and jax.tree.leaves(params)
  # Off the checkpoint cadence: the paper's averaging leaves such a save out.
  meta = checkpointing.load_meta(str(workdir / "checkpoints"), step)
  assert meta["on_cadence"] is False and meta["step"] == step


def test_a_stop_signal_saves_its_step_and_the_run_returns_that_steps_record(
    tmp_path, data_dir, monkeypatch, capsys):
  # In one process the flag is read after every step: a signal that lands in step 2 stops the
  # run there, saved (off the cadence), and what train_and_evaluate returns is step 2's record.
  agreed = iter([None, "SIGTERM"])
  monkeypatch.setattr(distributed.StopFlag, "agreed", lambda self: next(agreed))
  workdir = str(tmp_path / "stopped")
  result = loop.train_and_evaluate(tiny_config(data_dir, num_train_steps=6), workdir)
  (logged,) = [r for r in metrics.read_metrics(workdir) if r["step"] == 2]
  assert result == {**{k: v for k, v in logged.items() if k != "time"}, "stopped_by": "SIGTERM"}
  assert "train_loss" in result and result["step"] == 2
  assert os.listdir(os.path.join(workdir, "checkpoints")) == ["2"]
  assert checkpointing.load_meta(os.path.join(workdir, "checkpoints"), 2)["on_cadence"] is False
  assert "SIGTERM: saved step 2 in" in capsys.readouterr().err


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_second_ctrl_c_stops_at_once_a_second_sigterm_does_not(sig):
  # The first signal asks for a save at the end of the step. A run that cannot get there
  # (stuck reading data or in a collective) must still stop on a second Ctrl-C; a scheduler's
  # repeated SIGTERM must not cut short the save it asked for.
  # The script installs Python's Ctrl-C handler itself, as a process started from a terminal
  # has it: one started by a background job (`nohup ... &`, as the mutation runner's workers
  # may be) inherits SIGINT ignored, and Python then installs none.
  script = f"""
import os, signal, time
from transformer_jax.run.distributed import StopFlag
signal.signal(signal.SIGINT, signal.default_int_handler)
with StopFlag() as flag:
  os.kill(os.getpid(), signal.{sig})
  print("first:", flag.signal, flush=True)
  os.kill(os.getpid(), signal.{sig})
  time.sleep(3)
  print("still running", flush=True)
print("restored:", signal.getsignal(signal.SIGTERM) == signal.SIG_DFL, flush=True)
"""
  proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                        timeout=60, cwd=REPO)
  assert f"first: {sig}" in proc.stdout, proc
  assert f"{sig}: saving and stopping after this step" in proc.stderr, proc
  if sig == "SIGTERM":
    assert proc.returncode == 0 and "still running" in proc.stdout, proc
    assert "restored: True" in proc.stdout and "Ctrl-C again" not in proc.stderr, proc
  else:  # Python's default handler: KeyboardInterrupt (uncaught, Python ends by SIGINT)
    assert "Ctrl-C again to stop at once, without saving" in proc.stderr, proc
    assert "still running" not in proc.stdout, proc
    assert proc.returncode == -signal.SIGINT and "KeyboardInterrupt" in proc.stderr, proc


def _tensorboard_events(workdir):
  """The events of a workdir's TensorBoard files, file by file in name order."""
  import glob
  import struct

  from tensorboardX.proto import event_pb2
  for path in sorted(glob.glob(os.path.join(workdir, "tensorboard", "events.*"))):
    with open(path, "rb") as f:
      data, i = f.read(), 0
    while i < len(data):  # TFRecord framing: length, its CRC, the record, its CRC
      (n,) = struct.unpack("<Q", data[i:i + 8])
      event = event_pb2.Event()
      event.ParseFromString(data[i + 12:i + 12 + n])
      i += 16 + n
      yield event


def _tensorboard_purges(workdir) -> list[int]:
  """Steps of the SessionLog START events (purge_step) in a workdir's TensorBoard files."""
  return [e.step for e in _tensorboard_events(workdir)
          if e.HasField("session_log") and e.session_log.status == 1]  # START


def test_a_logged_window_of_steps_is_their_token_weighted_mean(monkeypatch):
  # Two steps' sums (as the step returns them): the window's figures weigh each by its tokens.
  steps_ = [{"loss": 4.0, "nll": 3.0, "correct": 2.0, "tokens": 4.0, "source_tokens": 5.0,
             "learning_rate": 0.1, "grad_norm": 1.0, "param_norm": 2.0, "update_norm": 0.5},
            {"loss": 1.0, "nll": 0.5, "correct": 3.0, "tokens": 6.0, "source_tokens": 7.0,
             "learning_rate": 0.2, "grad_norm": 3.0, "param_norm": 4.0, "update_norm": 0.25}]
  total = None
  for m in steps_:
    total = metrics.accumulate(total, {k: np.float32(m[k]) for k in throughput.SUMS})
  assert total == {"loss": 5.0, "nll": 3.5, "correct": 5.0, "tokens": 10.0, "source_tokens": 12.0}
  cfg = tj.TransformerConfig(vocab_size=16, d_model=8, num_heads=2, d_ff=16,
                             num_encoder_layers=1, num_decoder_layers=1, max_len=8)
  meter = throughput.ThroughputMeter(cfg, peak_flops=1e9, checkpoint_dir="ckpt")
  clock = iter([100.0, 102.0, 102.0])  # the window opens at 100 s, closes at 102 s
  monkeypatch.setattr(throughput.time, "perf_counter", lambda: next(clock))
  meter.restart()
  for m in steps_:
    meter.add(m, [5], [4])
  record = meter.record(7)
  flops = 2 * flops_lib.train_flops(cfg, [5], [4])
  assert record == pytest.approx({
      "train_loss": 0.5, "train_nll": 0.35, "train_perplexity": np.exp(0.35),
      "train_accuracy": 0.5, "learning_rate": 0.2, "grad_norm": 3.0, "param_norm": 4.0,
      "update_norm": 0.25, "tokens_per_sec": 5.0, "source_target_tokens_per_sec": 11.0,
      "steps_per_sec": 1.0, "tflops_per_sec": flops / 2 / 1e12, "mfu": flops / 2 / 1e9})
  # A perplexity past exp(50) is logged as exp(50), not as an overflow; no tokens count as one.
  assert metrics.summarize({"loss": 0.0, "nll": 100.0, "correct": 0.0, "tokens": 0.0},
                           "eval")["eval_perplexity"] == np.exp(50.0)
  assert metrics.summarize({"loss": 3.0, "nll": 2.0, "correct": 1.0, "tokens": 1.0},
                           "eval")["eval_loss"] == 3.0
  # A sum that appears later starts from 0.
  assert metrics.accumulate({"a": 1.0}, {"a": 1.0, "b": 2.0}) == {"a": 2.0, "b": 2.0}


def test_the_meters_first_window_compiles_and_each_later_one_starts_from_nothing(monkeypatch):
  """Found by mutation testing: the compiling window's flag, a window's FLOPs counted afresh and
  for every process, and rates as true quotients (a 2.75 s window, 2 processes)."""
  step = {"loss": 4.0, "nll": 3.0, "correct": 2.0, "tokens": 4.0, "source_tokens": 5.0,
          "learning_rate": 0.1, "grad_norm": 1.0, "param_norm": 2.0, "update_norm": 0.5}
  cfg = tj.TransformerConfig(vocab_size=16, d_model=8, num_heads=2, d_ff=16,
                             num_encoder_layers=1, num_decoder_layers=1, max_len=8)
  meter = throughput.ThroughputMeter(cfg, peak_flops=1e9, checkpoint_dir="ckpt")
  monkeypatch.setattr(throughput.jax, "process_count", lambda: 2)
  clock = iter([50.0, 100.0, 102.75, 102.75])
  monkeypatch.setattr(throughput.time, "perf_counter", lambda: next(clock))
  assert meter.record(1) == {}  # nothing pending
  meter.add(step, [5], [4])     # the first step compiles: no window yet, no FLOPs counted
  first = meter.record(1)       # ... and opens the window at 50 s
  assert first["tokens_per_sec"] is None and first["includes_compilation"] is True
  assert "mfu" not in first and meter.window_flops == 0.0
  meter.restart()               # 100 s: after an evaluation, say
  for _ in range(2):
    meter.add(step, [5], [4])
  record = meter.record(3)      # 102.75 s
  flops = 2 * 2 * flops_lib.train_flops(cfg, [5], [4])  # 2 steps x 2 processes
  assert (record["tokens_per_sec"], record["source_target_tokens_per_sec"],
          record["steps_per_sec"]) == (8.0 / 2.75, 18.0 / 2.75, 2.0 / 2.75)
  assert (record["tflops_per_sec"], record["mfu"]) == (flops / 2.75 / 1e12, flops / 2.75 / 1e9)
  assert "includes_compilation" not in record
  assert meter.pending == [] and meter.window_flops == 0.0 and meter.record(4) == {}


def test_a_resumed_processs_compiling_step_counts_in_the_averages_not_the_throughput(
    monkeypatch):
  """A run resumed at step 40 compiles at step 41: its loss belongs in the record of steps
  41-50, as in a run never stopped, its time (compiling) in no throughput."""
  step = {"loss": 4.0, "nll": 3.0, "correct": 2.0, "tokens": 4.0, "source_tokens": 5.0,
          "learning_rate": 0.1, "grad_norm": 1.0, "param_norm": 2.0, "update_norm": 0.5}
  later = dict(step, loss=12.0, learning_rate=0.2)
  cfg = tj.TransformerConfig(vocab_size=16, d_model=8, num_heads=2, d_ff=16,
                             num_encoder_layers=1, num_decoder_layers=1, max_len=8)
  meter = throughput.ThroughputMeter(cfg, peak_flops=1e9, checkpoint_dir="ckpt")
  clock = iter([10.0, 12.0, 20.0])
  monkeypatch.setattr(throughput.time, "perf_counter", lambda: next(clock))
  meter.add(step, [5], [4])                    # step 41, compiling: no FLOPs counted
  meter.carry(41)                              # fetched, and the window opens at 10 s
  assert meter.pending == [] and not meter.compiling and meter.window_flops == 0.0
  meter.add(later, [5], [4])                   # step 42, timed
  record = meter.record(42)                    # 12 s
  assert record["train_loss"] == (4.0 + 12.0) / 8 and record["train_nll"] == 6.0 / 8
  assert (record["tokens_per_sec"], record["steps_per_sec"]) == (4.0 / 2, 1 / 2)
  assert record["mfu"] == flops_lib.train_flops(cfg, [5], [4]) / 2 / 1e9
  assert record["learning_rate"] == 0.2 and meter.carried is None
  assert "includes_compilation" not in record
  # Carried with nothing after it (the compiling step is itself a log step): its averages,
  # without a throughput.
  meter = throughput.ThroughputMeter(cfg, peak_flops=1e9, checkpoint_dir="ckpt")
  clock = iter([30.0, 31.0])
  meter.add(step, [5], [4])
  meter.carry(50)
  record = meter.record(50)
  assert (record["train_loss"], record["learning_rate"]) == (1.0, 0.1)
  assert record["tokens_per_sec"] is None and record["includes_compilation"] is True
  assert meter.record(51) == {}
  # A non-finite carried step stops the run there, as a logged one does.
  meter = throughput.ThroughputMeter(cfg, peak_flops=1e9, checkpoint_dir="ckpt")
  meter.add(dict(step, loss=float("nan")), [5], [4])
  with pytest.raises(throughput.NonFiniteLossError, match="at step 7"):
    meter.carry(7)


def test_last_values_are_the_numbers_a_run_logged_last(tmp_path):
  # The last value of each number logged; text, flags and missing values are no metric, in
  # metrics.jsonl's summary as in TensorBoard.
  writer = metrics.MetricsWriter(str(tmp_path))
  writer.write(1, {"train_loss": 2.0, "bleu": 10.0, "stopped_early": "patience"})
  writer.write(2, {"train_loss": 1.5, "includes_compilation": True, "tokens_per_sec": None,
                   "mfu": 0.25})
  writer.close()
  assert metrics.last_values(str(tmp_path)) == {"step": 2, "train_loss": 1.5, "bleu": 10.0,
                                                "mfu": 0.25}
  assert sorted(_tensorboard_scalars(str(tmp_path))) == [
      ("bleu", 1), ("mfu", 2), ("train_loss", 1), ("train_loss", 2)]
  # An evaluation loss alone, or a BLEU alone, does not make an evaluated step.
  writer = metrics.MetricsWriter(str(tmp_path), tensorboard=False)
  writer.write(3, {"eval_loss": 1.0})
  assert [s for s in range(5) if metrics.evaluated(str(tmp_path), s)] == []
  # A line no record can be read from is passed over, not the end of the records.
  with open(tmp_path / "metrics.jsonl", "a") as f:
    f.write("not json\n[1, 2]\n")
  writer.write(4, {"bleu": 11.0})
  assert [r["step"] for r in metrics.read_metrics(str(tmp_path))] == [1, 2, 3, 4]
  # A writer of another process writes nothing and truncates nothing.
  before = (tmp_path / "metrics.jsonl").read_bytes()
  quiet = metrics.MetricsWriter(str(tmp_path / "other"), enabled=False, resume_step=0)
  quiet.write(5, {"train_loss": 1.0})
  quiet.close()
  metrics.MetricsWriter(str(tmp_path), enabled=False, resume_step=0).close()
  assert not os.path.exists(tmp_path / "other")
  assert (tmp_path / "metrics.jsonl").read_bytes() == before


def _tensorboard_scalars(workdir: str) -> list[tuple[str, int]]:
  """(tag, step) of every scalar in a workdir's TensorBoard event files."""
  return [(v.tag, e.step) for e in _tensorboard_events(workdir) for v in e.summary.value]


@pytest.mark.parametrize("resume_step", [0, 2])
def test_metrics_writer_on_resume_drops_the_records_after_it(tmp_path, resume_step):
  workdir = str(tmp_path)
  writer = metrics.MetricsWriter(workdir)       # the session that crashed after step 3
  for step in (1, 2, 3):
    writer.write(step, {"train_loss": float(step)})
  writer.close()
  # Lines training never writes (a note by hand, other bytes): no reader takes them, and a
  # resume keeps them as they are (it crashed on the bytes, and rewrote the file without them).
  foreign = [b'{"note": "lr looked high here"}\n', b"\xff\r\xfe a disk error\n"]
  with open(os.path.join(workdir, "metrics.jsonl"), "ab") as f:
    f.write(b"".join(foreign))
    f.write(b'{"step": 4, "train_lo')            # cut mid-write
  time.sleep(1.1)                               # TensorBoard names its files by the second
  metrics.MetricsWriter(workdir, resume_step=resume_step).close()
  kept = [r["step"] for r in metrics.read_metrics(workdir)]
  assert kept == [s for s in (1, 2, 3) if s <= resume_step]
  with open(os.path.join(workdir, "metrics.jsonl"), "rb") as f:
    lines = f.readlines()   # at "\n" only, as the readers
  assert lines[len(kept):] == foreign   # the cut line is gone, the others' records kept
  assert _tensorboard_purges(workdir) == [resume_step + 1]


def test_a_failed_write_of_the_metrics_names_the_file_and_where_a_resume_starts(
    tmp_path, monkeypatch):
  """A full disk met by the metrics' write or close (tests/test_workdir.py does it on a real
  one): a StorageError, the OS's words without the errno's prefix, and the resume's step."""
  workdir = str(tmp_path)
  os.makedirs(os.path.join(workdir, "checkpoints", "7", "state"))
  writer = metrics.MetricsWriter(workdir)
  writer.write(1, {"train_loss": 1.0})

  def full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")

  monkeypatch.setattr(metrics, "open", full, raising=False)
  with pytest.raises(checkpointing.StorageError) as e:
    writer.write(2, {"train_loss": 2.0})
  assert str(e.value) == (
      f"writing the run's metrics into {workdir}/metrics.jsonl failed: No space left on device. "
      "What was written before stays readable (a line cut short is skipped, and a resume cuts "
      "metrics.jsonl and TensorBoard back to its step). The last good checkpoint is step 7, "
      "untouched: free space, or lower --config.keep_checkpoints (a resume deletes the oldest "
      "steps beyond it before it writes anything), and run the same command to resume from it.")
  monkeypatch.undo()
  # The TensorBoard events' close: the same error, naming their directory; closed only once.
  tb = writer.tb
  monkeypatch.setattr(tb, "close", mock.Mock(side_effect=OSError(errno.ENOSPC, "full")))
  tensorboard = re.escape(os.path.join(workdir, "tensorboard"))
  with pytest.raises(checkpointing.StorageError,
                     match=rf"^writing the run's metrics into {tensorboard} failed: full\. "):
    writer.close()
  writer.close()   # nothing left to close
  # Its writers marked closed: tensorboardX's exit handler would flush them again and print the
  # failure as a traceback after the run's one message. A failed flush in `write` does the same.
  assert tb.all_writers and all(w.event_writer._closed for w in tb.all_writers.values())
  again = metrics.MetricsWriter(workdir)
  tb = again.tb
  monkeypatch.setattr(tb, "flush", mock.Mock(side_effect=OSError(errno.ENOSPC, "full")))
  with pytest.raises(checkpointing.StorageError, match="tensorboard failed: full"):
    again.write(3, {"train_loss": 3.0})
  assert again.tb is None and all(w.event_writer._closed for w in tb.all_writers.values())


def test_closing_a_run_closes_everything_and_raises_what_is_not_hidden():
  """`_Run._close`: each part closed even when one before it fails; the first failure raised,
  unless another error is on its way out (quiet); a Ctrl-C raised in any case."""
  def run(*failures):
    closed = []

    def part(name, failure):
      def close():
        closed.append(name)
        if failure:
          raise failure
      return types.SimpleNamespace(close=close)

    fake = types.SimpleNamespace(trainer=types.SimpleNamespace(checkpointer=part("c", failures[0])),
                                 writer=part("w", failures[1]), progress=part("p", failures[2]))
    return fake, closed

  first, second = RuntimeError("checkpointer"), OSError("writer")
  fake, closed = run(first, second, None)
  with pytest.raises(RuntimeError, match="checkpointer"):
    loop._Run._close(fake)
  assert closed == ["c", "w", "p"]
  fake, closed = run(first, second, None)
  loop._Run._close(fake, quiet=True)
  assert closed == ["c", "w", "p"]
  fake, closed = run(None, None, None)
  loop._Run._close(fake)
  fake, closed = run(KeyboardInterrupt(), None, None)
  with pytest.raises(KeyboardInterrupt):
    loop._Run._close(fake, quiet=True)
  assert closed == ["c", "w", "p"]
  # A Ctrl-C after another close failed, while an error is on its way out: still raised.
  fake, closed = run(first, KeyboardInterrupt(), None)
  with pytest.raises(KeyboardInterrupt):
    loop._Run._close(fake, quiet=True)
  assert closed == ["c", "w", "p"]


def test_a_data_record_this_code_did_not_write_is_refused():
  assert distributed.own_data_state({}, None) is None
  with pytest.raises(checkpointing.CheckpointError, match="not one this codebase wrote"):
    distributed.own_data_state({"process_count": 2, "processes": {"0": {}}}, None)
  with pytest.raises(checkpointing.CheckpointError, match="move this one aside"):
    distributed.own_data_state({"parent": {"next_index": 3}}, None)
  # The one-record format of checkpoints written on 2026-11-22 still resumes one process.
  old = {"parent": {"next_index": 3}, "window": 2, "next": 1}
  assert distributed.own_data_state(old, None) == old


# ---------------------------------------------------------------- resuming a run again


def test_config_overrides_without_config_point_to_the_runs_own_config(tmp_path, capsys):
  # absl's answer was "Unknown command line flag 'config.num_train_steps'": overrides exist only
  # with a --config file, and `train.py --workdir W` alone resumes with none.
  from scripts_under_test import load_script
  train = load_script("train")
  run = tmp_path / "my run"
  run.mkdir()
  (run / "config.json").write_text("{}")
  assert train.main(["--workdir", str(run), "--config.num_train_steps=12"]) == 2
  err = capsys.readouterr().err
  assert err.splitlines() == [
      "error: --config.num_train_steps overrides a field of --config, and there is none: to "
      f"change fields of the run in {run}, add --config 'configs/resume.py:{run}' (the run's "
      "own config)"], err
  # No run there yet: a config file is what is missing.
  assert train.main([f"--workdir={tmp_path / 'new'}", "--config.learning_rate", "2"]) == 2
  assert "none: add the config file, e.g. --config configs/default.py" in \
      capsys.readouterr().err


def test_the_original_command_after_a_resume_that_changed_fields_says_what_it_undoes(
    run, data_dir, capsys):
  # A finished 3-step run (the `trained` fixture's, copied), extended with a change
  # (configs/resume.py:run --config.learning_rate=2.0 ...).
  loop.train_and_evaluate(tiny_config(data_dir, num_train_steps=4, learning_rate=2.0), run)
  assert [s for s, _ in workdir_lib.history(run)] == [3]
  capsys.readouterr()
  # The original command (a scheduler re-queuing it) finds the run finished: nothing runs, so
  # nothing is recorded (recorded, learning_rate=1.0 and 3 steps would become the run's own).
  loop.train_and_evaluate(tiny_config(data_dir, num_train_steps=3), run)
  out = capsys.readouterr()
  text = (out.out + out.err).replace("\r", "\n")
  assert [s for s, _ in workdir_lib.history(run)] == [3]
  assert workdir_lib.experiment_config(run).learning_rate == 2.0
  assert "config changes on resume at step 4, not recorded: the run is finished" in text, text
  assert (f"step 4: the run is finished (num_train_steps=3); nothing to do. To train on: python "
          f"scripts/train.py --config configs/resume.py:{run} --workdir {run} "
          "--config.num_train_steps=N (N > 4)") in text, text
  # Going on with the original learning rate: allowed and recorded, with a warning.
  loop.train_and_evaluate(tiny_config(data_dir, num_train_steps=5), run)
  text = "".join(capsys.readouterr()).replace("\r", "\n")
  assert [s for s, _ in workdir_lib.history(run)] == [3, 4]
  warnings = [line for line in text.splitlines() if line.startswith("warning: this command")]
  assert warnings == [
      "warning: this command sets learning_rate back to 1.0 (from 2.0): it undoes the change "
      f"made at the resume at step 3 ({run}/config.3.json). To keep the run's current config, "
      f"resume with python scripts/train.py --workdir {run} alone (and --config "
      f"configs/resume.py:{run} --config.<field>=... to change fields)"], text
  # (num_train_steps 4 -> 5 is to a value the run never had: no undoing, not named.)


def test_undoing_a_change_made_at_step_0_is_warned_of_like_any_other(tmp_path):
  """A run that failed before its first checkpoint and was started again with a change records
  it as `config.0.json`, at the step of the run's start: the change is found by its place in
  the history, not by its step (a step comparison found nothing earlier than step 0)."""
  def config(name, learning_rate):
    (tmp_path / name).write_text(json.dumps(
        {"learning_rate": learning_rate, "num_train_steps": 3, "resolved_model": {}}))
  config("config.json", 1.0)
  config("config.0.json", 2.0)
  def undone(now, new):  # each warning up to the file it names
    return [line.split(f" ({tmp_path}")[0]
            for line in loop._reverted(str(tmp_path), [("learning_rate", now, new)])]
  assert undone(2.0, 1.0) == ["this command sets learning_rate back to 1.0 (from 2.0): it undoes "
                              "the change made at the resume at step 0"]
  assert undone(2.0, 3.0) == [] and loop._reverted(str(tmp_path), []) == []
  config("config.5.json", 3.0)
  for back_to in (1.0, 2.0):
    assert undone(3.0, back_to) == [f"this command sets learning_rate back to {back_to} (from "
                                    "3.0): it undoes the change made at the resume at step 5"]
  assert undone(3.0, 4.0) == []
  config("config.6.json", 4.0)  # a resume at the very next step: each resume's own config
  assert undone(4.0, 3.0) == ["this command sets learning_rate back to 3.0 (from 4.0): it undoes "
                              "the change made at the resume at step 6"]


def test_saves_keep_the_newest_and_every_keep_period_th_step(tmp_path):
  # Orbax deletes after each save what max_to_keep and keep_period do not keep (the prune below
  # is for a resume that lowered them).
  ckpt = checkpointing.Checkpointer(str(tmp_path), max_to_keep=2, keep_period=2,
                                    async_save=False)
  for step in range(1, 8):
    ckpt.save(step, {"w": np.full(3, step, np.float32)}, force=True)
  ckpt.close()
  assert checkpointing.checkpoint_steps(ckpt.directory) == [2, 4, 6, 7]


def test_the_size_of_a_checkpoint_is_the_newest_ones(tmp_path):
  # What the free-space warning multiplies by keep_checkpoints + 1.
  ckpt = checkpointing.Checkpointer(str(tmp_path), max_to_keep=5, async_save=False)
  rng = np.random.default_rng(0)
  for step, size in ((1, 10), (2, 50_000), (3, 200)):
    ckpt.save(step, {"w": rng.standard_normal(size).astype(np.float32)}, force=True)
  sizes = {s: checkpointing.directory_bytes(os.path.join(ckpt.directory, str(s)))
           for s in (1, 2, 3)}
  assert ckpt.checkpoint_bytes() == sizes[3] and sizes[2] > sizes[3] > sizes[1]
  ckpt.close()


def test_a_checkpoint_without_params_is_named_as_not_this_codebases(tmp_path):
  ckpt = checkpointing.Checkpointer(str(tmp_path), max_to_keep=2, async_save=False)
  ckpt.save(3, {"w": np.ones(2, np.float32)}, force=True)  # a state with no `params`
  ckpt.close()
  with pytest.raises(checkpointing.CheckpointError,
                     match=r"3/state holds no `params` \(keys: \['w'\]\); it is not a "
                           "checkpoint of this codebase"):
    checkpointing.load_params(str(tmp_path))


def test_a_lower_keep_checkpoints_deletes_the_oldest_before_the_first_save(tmp_path):
  # Orbax deletes the steps beyond max_to_keep only after a save completes: on a full disk the
  # save never completes, so lowering keep_checkpoints changed nothing.
  ckpt = checkpointing.Checkpointer(str(tmp_path), max_to_keep=20, async_save=False)
  for step in range(1, 7):
    ckpt.save(step, {"w": np.full(3, step, np.float32)}, force=True)
  ckpt.close()
  ckpt = checkpointing.Checkpointer(str(tmp_path), max_to_keep=2, keep_period=2,
                                    async_save=False)
  # Step 6 damaged: the run resumes from 5, and 6 is set aside.
  for root, _, files in os.walk(os.path.join(ckpt.directory, "6", "state")):
    for name in files:
      with open(os.path.join(root, name), "wb") as f:
        f.write(b"garbage")
  target = {"w": jax.ShapeDtypeStruct((3,), np.float32)}
  assert ckpt.restore_latest(target)[0] == 5 and ckpt.restored_step == 5
  # Kept: the newest two (4, 5) and every second step (2, 4); never the step resumed from.
  assert ckpt.prune() == [1, 3]
  assert checkpointing.checkpoint_steps(ckpt.directory) == [2, 4, 5]
  ckpt.restored_step = 2          # (a resume from an older step than the newest keeps it)
  ckpt.keep_period = None
  assert ckpt.prune() == [] and ckpt.all_steps() == [2, 4, 5]
  ckpt.close()


def _mount_tmpfs(path, size: int) -> bool:
  os.makedirs(path, exist_ok=True)
  return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                        capture_output=True).returncode == 0


def _fill(path) -> None:
  """Write `path` until the filesystem holds no free page."""
  fd = os.open(path, os.O_WRONLY | os.O_CREAT)
  try:
    for chunk in (1 << 20, 4096, 1):
      try:
        while True:
          os.write(fd, b"\0" * chunk)
      except OSError as e:
        assert e.errno == errno.ENOSPC, e
  finally:
    os.close(fd)


def test_a_full_disk_run_resumes_with_a_lower_keep_checkpoints(tmp_path, data_dir):
  """The storage error's advice: lower --config.keep_checkpoints and run the command again.
  On a real full filesystem (a small tmpfs, which needs root: skipped elsewhere), filled to the
  last byte before the resume: the resume deletes the old checkpoints before it writes anything
  (metrics.jsonl cut back to the resumed step, its changed config), or those writes fail."""
  def command(workdir, *flags):
    return [sys.executable, os.path.join(REPO, "scripts", "train.py"), "--config",
            os.path.join(REPO, "tests", "tiny_config.py"), "--workdir", workdir,
            f"--config.data.data_dir={data_dir}",
            "--config.checkpoint_every_steps=1", *flags]

  # The sizes of this command's files (one process: not the 8 devices of this one's tests).
  sized = str(tmp_path / "sized")
  subprocess.run(command(sized, "--config.num_train_steps=1"), capture_output=True, check=True,
                 timeout=300)
  one = checkpointing.directory_bytes(os.path.join(sized, "checkpoints", "1"))
  others = checkpointing.directory_bytes(sized) - one
  disk = tmp_path / "disk"
  # Room for the run's files and several checkpoints: a later save cannot be written. Orbax's
  # asynchronous saves of this run take 0.7 to 4.9 MB each on a tmpfs, and up to several times
  # that while they write (measured 2026-11-29; CI once had room for 2 in 10 times the size of
  # a synchronous one): where fewer than 4 fit, the room is doubled and the run made again.
  room = others + 10 * one + 64 * 1024
  try:
    for attempt in range(3):
      if not _mount_tmpfs(disk, room):
        pytest.skip("cannot mount a tmpfs here (needs root): the full-disk test needs one")
      run = disk / "run"
      # More steps than the room holds checkpoints, whatever a save takes while it writes
      # (150 of 0.7 MB or more: over 4 times the first room).
      failed = subprocess.run(command(str(run), "--config.num_train_steps=150",
                                      "--config.async_checkpointing=true",
                                      "--config.keep_checkpoints=150"),
                              capture_output=True, text=True, timeout=300)
      good = checkpointing.checkpoint_steps(str(run / "checkpoints"))
      if failed.returncode != 0 and len(good) >= 4 or attempt == 2:
        break
      subprocess.run(["umount", str(disk)], capture_output=True)
      room *= 2
    assert failed.returncode == 1 and "No space left on device" in failed.stderr, \
        failed.stderr[-3000:]
    # Three checkpoints deleted or more: room for the one the resume saves (synchronously, at
    # its final size) and the small files.
    assert len(good) >= 4, (room, failed.stderr[-3000:])
    _fill(disk / "filler")
    last = good[-1] + 1
    resumed = subprocess.run(command(str(run), f"--config.num_train_steps={last}",
                                     "--config.async_checkpointing=false",
                                     "--config.keep_checkpoints=1"),
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    said = resumed.stdout + resumed.stderr
    assert f"resumed from step {good[-1]}" in said, said[-3000:]
    assert f"deleted checkpoint(s) {good[:-1]} from " in said, said[-3000:]
    assert checkpointing.checkpoint_steps(str(run / "checkpoints")) == [last]
    assert (run / f"config.{good[-1]}.json").exists()   # the changes, recorded after the pruning
  finally:
    subprocess.run(["umount", str(disk)], capture_output=True)


def test_the_start_up_line_names_the_model_options_that_are_not_the_defaults():
  """Two variants' logs looked the same ("model 64d, 1+1 layers, pre-LN, vocab 1000")."""
  from transformer_jax.run.loop import _options
  assert _options(tj.TransformerConfig(vocab_size=10, norm_position="pre")) == ""
  variant = tj.TransformerConfig(vocab_size=10, activation="gelu", fused_qkv=True,
                                 position_encoding="learned", deterministic=True)
  assert _options(variant) == ", position_encoding=learned, activation=gelu, fused_qkv=True"


def test_checkpointer_details_found_by_mutation_testing(tmp_path, monkeypatch):
  """Survivors of a mutation sample of run/checkpointing.py (2026-11-26, docs/mutation_runs.md)."""
  # Orbax's records below ERROR pass the filter that drops its failed-save tracebacks.
  quiet = checkpointing._QuietStorageErrors()
  record = logging.LogRecord("absl", logging.WARNING, "orbax/x.py", 1,
                             "No space left on device while writing", None, None)
  assert quiet.filter(record)
  record.levelno = logging.ERROR
  assert not quiet.filter(record)
  ckpt = checkpointing.Checkpointer(str(tmp_path / "ckpt"), async_save=False)
  # Before the first save, a checkpoint's size is its state's bytes (the free-space warning).
  shapes = {"w": jax.ShapeDtypeStruct((100, 10), jnp.float32)}
  assert ckpt.checkpoint_bytes(shapes) == 4000 and ckpt.checkpoint_bytes() == 0
  # The storage error names the operating system's cause and the error's first line.
  with pytest.raises(checkpointing.StorageError) as e:
    ckpt._storage_failure(OSError(28, "No space left on device"), 3)
  assert "failed: No space left on device ([Errno 28] No space left on device...)" in str(e.value)
  # The error's first line is quoted (the rest is TensorStore's context), and the last good
  # checkpoint is the newest of those on disk.
  for step in (2, 3):
    os.makedirs(os.path.join(ckpt.directory, str(step), "state"))
  with pytest.raises(checkpointing.StorageError) as e:
    ckpt._storage_failure(OSError(28, "No space left on device\nwhile writing params.w"), 4)
  assert "([Errno 28] No space left on device...)" in str(e.value)
  assert "while writing" not in str(e.value) and "last good checkpoint is step 3" in str(e.value)
  for step in (2, 3):
    shutil.rmtree(os.path.join(ckpt.directory, str(step)))
  # One process never waits for the others when it sets damaged steps aside.
  def no_sync(*args):
    raise AssertionError("sync_global_devices in a single process")
  monkeypatch.setattr(checkpointing.multihost_utils, "sync_global_devices", no_sync)
  ckpt._set_aside([])
  # Two processes wait for each other there (process 0 renames, the others then reload).
  synced = []
  with monkeypatch.context() as m:
    m.setattr(checkpointing.multihost_utils, "sync_global_devices", synced.append)
    m.setattr(checkpointing.jax, "process_count", lambda: 2)
    ckpt._set_aside([])
  assert synced == ["transformer_jax: damaged checkpoints set aside"]
  # After a failed save the clean-up of partial steps stops once none reappears.
  calls = []
  monkeypatch.setattr(checkpointing, "remove_partial_steps", lambda d: calls.append(d) or [])
  monkeypatch.setattr(checkpointing.time, "sleep", lambda s: None)
  ckpt.failed = True
  ckpt.close()
  assert len(calls) == 2, calls
  # A read-only manager creates nothing where there was nothing.
  with checkpointing.read_only_manager(str(tmp_path / "absent")) as manager:
    assert manager.all_steps() == []
  assert not os.path.exists(tmp_path / "absent")
  # A machine with one device (the tools' usual case) reads parameters onto it.
  checkpointing.save_params(str(tmp_path / "best"), 2, {"w": np.arange(3, dtype=np.float32)}, {})
  one = jax.local_devices()[:1]
  monkeypatch.setattr(checkpointing.jax, "local_devices", lambda *args, **kwargs: one)
  assert checkpointing.load_params(str(tmp_path / "best"))[1]["w"].tolist() == [0.0, 1.0, 2.0]


def test_storage_error_figures_of_a_first_save_and_of_an_earlier_async_save(tmp_path):
  """The last open survivors of a mutation sample of run/checkpointing.py (docs/mutation_runs.md):
  the size a failed first save reports (the state's bytes, no checkpoint on disk yet) and the
  step an error without a step path is blamed on (an asynchronous save fails at the next one)."""
  ckpt = checkpointing.Checkpointer(str(tmp_path / "ckpt"), async_save=False)
  state = {"w": np.zeros((512, 512), np.float32)}  # exactly 1 MiB

  def full(step, args=None, force=False):
    raise OSError(28, "No space left on device")

  real_save = ckpt.manager.save
  ckpt.manager.save = full
  with pytest.raises(checkpointing.StorageError) as e:
    ckpt.save(5, state)
  assert "saving checkpoint 5 into" in str(e.value)
  assert "takes about 1.0 MiB" in str(e.value)
  assert "There is no earlier checkpoint" in str(e.value)
  # Asynchronous saves: step 7 is written; an error without a step path surfacing at step 9's
  # save belongs to the save before it. A synchronous save's error is its own.
  for async_save, blamed in ((True, 7), (False, 9)):
    other = checkpointing.Checkpointer(str(tmp_path / f"ckpt_{async_save}"),
                                       async_save=async_save)
    other.manager.save = lambda step, args=None, force=False: True
    assert other.save(7, state)
    other.manager.save = full
    with pytest.raises(checkpointing.StorageError) as e:
      other.save(9, state)
    assert f"saving checkpoint {blamed} into" in str(e.value), async_save
  # A failure that surfaces when waiting for the saves is the last requested save's.
  def failed_write():
    raise OSError(28, "No space left on device")

  other.manager.wait_until_finished = failed_write
  with pytest.raises(checkpointing.StorageError, match="saving checkpoint 9 into"):
    other.wait()
  # Also when that save was step 0's (init_from's first checkpoint, say): a step like any other.
  other.manager.save = lambda step, args=None, force=False: True
  assert other.save(0, state)
  with pytest.raises(checkpointing.StorageError, match="saving checkpoint 0 into"):
    other.wait()
  ckpt.manager.save = real_save
  ckpt.close()
