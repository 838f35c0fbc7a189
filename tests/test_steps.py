"""The pure train and eval steps against a direct computation: what one step reports and changes."""
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import transformer_jax as tj
from transformer_jax import losses, steps

SMOOTHING = 0.1


@pytest.fixture(scope="module")
def setup():
  cfg = tj.model_config("tiny", vocab_size=30, num_encoder_layers=1, num_decoder_layers=1)
  model = tj.Transformer(cfg)
  tx = optax.sgd(0.5)
  state = steps.unbox(steps.init_train_state(model, tx, jax.random.key(0), (1, 8)))
  rng = np.random.default_rng(0)
  inputs = rng.integers(4, 30, (4, 9)).astype(np.int32)
  targets = rng.integers(4, 30, (4, 7)).astype(np.int32)
  inputs[1, 5:] = 0
  targets[2, 3:] = 0
  batch = {"inputs": jnp.asarray(inputs), "targets": jnp.asarray(targets)}
  schedule = lambda count: 0.5 / (count + 1.0)  # noqa: E731
  step = jax.jit(steps.make_train_step(model, tx, schedule, SMOOTHING))
  return model, tx, state, batch, step


@pytest.fixture(scope="module")
def reference(setup):
  model = setup[0]
  return jax.jit(jax.value_and_grad(lambda p, b, r: reference_loss(model, p, b, r)))


def reference_loss(model, params, batch, rng):
  """The step's loss by hand: smoothed cross-entropy summed over non-pad targets, averaged."""
  logits = model.apply({"params": params}, **batch, rngs={"dropout": rng})
  weights = (batch["targets"] != 0).astype(jnp.float32)
  loss, _ = losses.smoothed_cross_entropy(logits, batch["targets"], weights, SMOOTHING)
  return loss.sum() / weights.sum()


def test_one_train_step_against_a_direct_computation(setup, reference):
  model, tx, state, batch, step = setup
  new, metrics = step(state, batch)
  # The dropout key of update n is the state's key folded with n (here 0).
  rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), 0)
  loss, grads = reference(state.params, batch, rng)
  tokens = float((batch["targets"] != 0).sum())
  assert float(metrics["tokens"]) == tokens == 4 * 7 - 4
  assert float(metrics["source_tokens"]) == 4 * 9 - 4
  assert float(metrics["loss"]) / tokens == pytest.approx(float(loss), rel=1e-5)
  assert float(metrics["grad_norm"]) == pytest.approx(float(optax.global_norm(grads)), rel=1e-4)
  expected = jax.tree.map(lambda p, g: p - 0.5 * g, state.params, grads)   # SGD, rate 0.5
  for a, b in zip(jax.tree.leaves(new.params), jax.tree.leaves(expected)):
    np.testing.assert_allclose(a, b, atol=1e-5)
  assert float(metrics["param_norm"]) == pytest.approx(float(optax.global_norm(expected)),
                                                       rel=1e-5)
  assert float(metrics["update_norm"]) == pytest.approx(0.5 * float(optax.global_norm(grads)),
                                                        rel=1e-4)
  # The reported rate is the one this update used: the schedule at the count before it.
  assert float(metrics["learning_rate"]) == pytest.approx(0.5)
  assert int(new.step) == 1 and np.array_equal(new.rng, state.rng)


def test_the_step_number_changes_the_dropout_and_nothing_else(setup):
  _, _, state, batch, step = setup
  _, first = step(state, batch)
  _, again = step(state, batch)
  _, later = step(state.replace(step=jnp.array(1, jnp.int32)), batch)
  assert float(first["loss"]) == float(again["loss"])
  assert float(first["loss"]) != float(later["loss"])
  assert float(later["learning_rate"]) == pytest.approx(0.25)


def test_a_batch_of_padding_gives_zero_gradients_and_one_token_is_not_rescaled(setup, reference):
  model, _, state, batch, step = setup
  empty = {k: jnp.zeros_like(v) for k, v in batch.items()}
  new, metrics = step(state, empty)
  assert float(metrics["tokens"]) == 0.0 and float(metrics["grad_norm"]) == 0.0
  for a, b in zip(jax.tree.leaves(new.params), jax.tree.leaves(state.params)):
    np.testing.assert_array_equal(a, b)
  one = dict(batch, targets=batch["targets"].at[:, 1:].set(0).at[1:, :].set(0))
  _, metrics = step(state, one)
  rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), 0)
  assert float(metrics["tokens"]) == 1.0
  loss, grads = reference(state.params, one, rng)
  assert float(metrics["loss"]) == pytest.approx(float(loss), rel=1e-5)
  # The gradient is of the loss over 1 token, not over a floor larger than the count.
  assert float(metrics["grad_norm"]) == pytest.approx(float(optax.global_norm(grads)), rel=1e-4)


def test_eval_step_is_the_deterministic_loss_sums(setup):
  model, _, state, batch, _ = setup
  eval_model = tj.Transformer(model.config.replace(deterministic=True))
  sums = jax.jit(steps.make_eval_step(eval_model, SMOOTHING))(state.params, batch)
  logits = jax.jit(eval_model.apply)({"params": state.params}, **batch)
  expected = losses.loss_sums(logits, batch["targets"], (batch["targets"] != 0).astype(
      jnp.float32), SMOOTHING)
  for key in ("loss", "nll", "correct", "tokens"):
    assert float(sums[key]) == pytest.approx(float(expected[key]), rel=1e-6), key


def test_setup_context_enters_every_manager_and_leaves_in_reverse():
  # TrainSetup.context() is the mesh and the logical axis rules: both must be active to trace.
  log = []

  class Manager:
    def __init__(self, name):
      self.name = name

    def __enter__(self):
      log.append(("enter", self.name))

    def __exit__(self, *exc):
      log.append(("exit", self.name))

  with steps._Contexts(Manager("mesh"), Manager("rules")):
    log.append("body")
  assert log == [("enter", "mesh"), ("enter", "rules"), "body", ("exit", "rules"),
                 ("exit", "mesh")]


def test_trace_step_prints_the_step_program_and_tells_programs_apart(capsys):
  # scripts/trace_step.py: the check that a run made at one commit stands for another.
  from scripts_under_test import load_script
  script = load_script("trace_step")
  tiny = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tiny_config.py")

  def trace(*overrides, what="train"):
    rc = script.main(["--config", tiny, "--what", what, *overrides])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return out

  first = trace()
  assert "lambda" in first and "dot_general" in first
  assert "f32[8,32,200]" in first  # logits of the config's batch and vocabulary
  assert trace() == first
  assert trace("--config.num_train_steps=99") == first  # not part of the program
  assert trace("--config.model.norm_position=pre") != first  # tiny_config is post-LN
  assert trace("--config.label_smoothing=0.2") != first
  evaluation = trace(what="eval")
  assert evaluation != first and "f32[8,32,200]" in evaluation
  # The keys the loop hands the steps: packed rows' segment ids and positions for the "pack"
  # batching only; evaluation's rows (one pair each) never carry them.
  padded = trace("--config.data.batching=pad")
  assert padded != first and first.count("i32[8,32]") > padded.count("i32[8,32]")
  assert trace("--config.data.batching=pad", what="eval") == evaluation
  assert script.main([]) == 1 and "--config" in capsys.readouterr().err


def test_a_flat_optimizer_trains_as_the_tree_one_on_the_data_parallel_mesh():
  # TrainSetup on the 8 fake devices (config.mesh: all data-parallel): the flat state is whole on
  # each device as the tree one is, and three steps give the same losses and parameters.
  from transformer_jax import sharding
  from transformer_jax.experiment import transformer_config

  import tiny_config
  rng = np.random.default_rng(1)
  tokens = rng.integers(4, 200, (2, 8, 12)).astype(np.int32)
  batch = {"inputs": tokens[0], "targets": np.where(np.arange(12) < 9, tokens[1], 0)}

  def train(flat):
    c = tiny_config.get_config()
    c.flatten_optimizer = flat
    setup = steps.TrainSetup(c, transformer_config(c, 200))
    state = setup.init_state(jax.random.key(0))
    arrays = len(jax.tree.leaves(state))
    with setup.context():
      losses_ = []
      for _ in range(3):
        state, metrics = setup.train_step(state, sharding.global_batch(batch,
                                                                       setup.batch_sharding))
        losses_.append(float(metrics["loss"]))
    return losses_, state.params, arrays, jax.device_count()

  flat_losses, flat_params, flat_arrays, devices = train(True)
  losses_, params, arrays, _ = train(False)
  assert devices == 8
  np.testing.assert_allclose(flat_losses, losses_, rtol=1e-5)
  assert flat_losses[2] < flat_losses[0]
  for a, b in zip(jax.tree.leaves(flat_params), jax.tree.leaves(params)):
    np.testing.assert_allclose(a, b, atol=1e-5)
  n_params = len(jax.tree.leaves(params))
  assert arrays - flat_arrays == 2 * n_params - 2   # mu and nu: one vector each


@pytest.mark.parametrize("impl", ["xla", "cudnn"])
def test_unpacked_rows_train_alike_with_or_without_their_packing_keys(setup, impl):
  # The pad and bucket batchings write segment ids and positions for their one pair a row; the
  # loop leaves them out (batch.model_arrays(packed=False)) so the model sees unpacked rows.
  # The step must not notice: same loss, same new parameters (cuDNN's path: the padding as
  # lengths, against the dense segment mask; XLA's on CPU).
  from transformer_jax import batch as batch_lib
  from transformer_jax.run.trainer import TrainBatches
  model, tx, state, batch, _ = setup
  model = tj.Transformer(model.config.replace(attention_impl=impl))
  step = jax.jit(steps.make_train_step(model, tx, lambda count: 0.5, SMOOTHING))
  full = dict(batch)
  for side in ("inputs", "targets"):
    real = np.asarray(batch[side]) != 0
    full[f"{side}_segmentation"] = jnp.asarray(real.astype(np.int32))
    full[f"{side}_positions"] = jnp.asarray(np.where(real, np.arange(real.shape[1]), 0),
                                            jnp.int32)
  unpacked = batch_lib.model_arrays(full, packed=False)
  assert sorted(unpacked) == ["inputs", "targets"]
  assert sorted(batch_lib.model_arrays(full)) == sorted(batch_lib.KEYS)
  (new_a, m_a), (new_b, m_b) = step(state, full), step(state, unpacked)
  assert float(m_a["loss"]) == pytest.approx(float(m_b["loss"]), rel=1e-6)
  for a, b in zip(jax.tree.leaves(new_a.params), jax.tree.leaves(new_b.params)):
    np.testing.assert_allclose(a, b, atol=1e-6)
  # The training iterator of an unpacked batching hands the steps the rows alone.
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  host = {k: np.asarray(v) for k, v in full.items()}
  for packed, keys in ((False, ["inputs", "targets"]), (True, sorted(batch_lib.KEYS))):
    arrays, _ = TrainBatches(iter([host]), sharding, 0, packed=packed).next()
    assert sorted(arrays) == keys
