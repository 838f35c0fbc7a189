"""The train state, the pure train/eval steps, and `TrainSetup`, which jits the train step on a
mesh. No I/O, no data loading: feed batches.

A batch is a dict of `[rows, length]` int32 arrays keyed as `transformer_jax.batch` says, which
are the model's keyword arguments.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from transformer_jax import sharding
from transformer_jax.config import TransformerConfig
from transformer_jax.losses import loss_sums
from transformer_jax.model import Transformer, token_validity
from transformer_jax.optim import make_optimizer


@flax.struct.dataclass
class TrainState:
  step: jax.Array        # number of updates done
  params: Any
  opt_state: Any
  rng: jax.Array         # raw uint32 key data, so the state is a plain checkpointable tree


def init_train_state(model: Transformer, tx: optax.GradientTransformation, rng, batch_shape):
  """A fresh state with boxed (logically named) parameters; unbox after taking its shardings."""
  init_rng, train_rng = jax.random.split(rng)
  dummy = jnp.ones(batch_shape, jnp.int32)
  params = model.init(init_rng, dummy, dummy)["params"]
  return TrainState(step=jnp.array(0, jnp.int32), params=params, opt_state=tx.init(params),
                    rng=jax.random.key_data(train_rng))


def target_weights(batch, pad_id: int):
  return token_validity(batch["targets"], batch.get("targets_segmentation"), pad_id).astype(
      jnp.float32)


def _microbatches(batch, num: int):
  # Row r goes to microbatch r % num: each device keeps an equal share of every microbatch
  # when the batch axis is sharded (a contiguous split would put a microbatch on few devices).
  return jax.tree.map(lambda x: x.reshape(x.shape[0] // num, num, *x.shape[1:]).swapaxes(0, 1),
                      batch)


def make_train_step(model: Transformer, tx: optax.GradientTransformation, schedule: Callable,
                    label_smoothing: float, grad_accum_steps: int = 1):
  """`train_step(state, batch) -> (state, metrics)`; metrics are sums plus norms and the rate.

  The loss is the smoothed cross-entropy averaged over all non-pad target tokens of the whole
  batch: each microbatch's gradient is of (its loss sum / the batch's token count), so the
  accumulated gradient equals the gradient of one big batch exactly, whatever the microbatches'
  token counts.
  """
  pad_id = model.config.pad_id

  def micro_grads(params, micro, denominator, rng):
    def loss_fn(p):
      logits = model.apply({"params": p}, **micro, rngs={"dropout": rng})
      sums = loss_sums(logits, micro["targets"], target_weights(micro, pad_id), label_smoothing)
      return sums["loss"] / denominator, sums
    return jax.grad(loss_fn, has_aux=True)(params)

  def train_step(state: TrainState, batch):
    rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
    denominator = jnp.maximum(target_weights(batch, pad_id).sum(), 1.0)
    if grad_accum_steps == 1:
      grads, sums = micro_grads(state.params, batch, denominator, rng)
    else:
      def body(carry, xs):
        micro, i = xs
        g, s = micro_grads(state.params, micro, denominator, jax.random.fold_in(rng, i))
        # One gradient buffer: add in place instead of stacking per-microbatch gradients.
        return jax.tree.map(jnp.add, carry, (g, s)), None
      zeros = jax.tree.map(jnp.zeros_like, state.params)
      zero_sums = {k: jnp.zeros((), jnp.float32) for k in ("loss", "nll", "correct", "tokens")}
      (grads, sums), _ = jax.lax.scan(
          body, (zeros, zero_sums),
          (_microbatches(batch, grad_accum_steps), jnp.arange(grad_accum_steps)))
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = dict(sums)
    metrics["source_tokens"] = token_validity(
        batch["inputs"], batch.get("inputs_segmentation"), pad_id).sum().astype(jnp.float32)
    metrics["grad_norm"] = optax.global_norm(grads)
    metrics["param_norm"] = optax.global_norm(params)
    metrics["update_norm"] = optax.global_norm(updates)
    metrics["learning_rate"] = schedule(state.step)
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
    return new_state, metrics

  return train_step


def make_eval_step(model: Transformer, label_smoothing: float):
  """`eval_step(params, batch) -> sums` with dropout off (`model` built with deterministic=True)."""
  pad_id = model.config.pad_id

  def eval_step(params, batch):
    logits = model.apply({"params": params}, **batch)
    # Rows that only fill the last batch have segment id 0 everywhere: weight 0.
    return loss_sums(logits, batch["targets"], target_weights(batch, pad_id), label_smoothing)

  return eval_step


def unbox(tree):
  return nn.meta.unbox(tree)


class TrainSetup:
  """The mesh, model, optimizer, state shardings, initialiser and jitted train and eval steps
  of a config.

  What `run.trainer.Trainer` runs, `scripts/benchmark.py --what train` times and
  `scripts/trace_step.py` prints, built in one place so they cannot drift apart. Trace and call
  the steps inside `context()`.
  """

  def __init__(self, config, model_cfg: TransformerConfig):
    self.mesh = sharding.make_mesh(dict(config.mesh))
    self.rules = sharding.rules_from_config(config.logical_axis_rules)
    self.model = Transformer(model_cfg)
    self.tx, self.schedule = make_optimizer(config, model_cfg.d_model)
    # The out_shardings place every parameter where the logical rules say.
    init = functools.partial(init_train_state, self.model, self.tx, batch_shape=(1, 8))
    boxed = jax.eval_shape(init, jax.random.key(config.seed))
    self.state_shapes = unbox(boxed)
    sharding.check_divisible(boxed, self.mesh, self.rules)
    self.state_shardings = sharding.logical_shardings(boxed, self.mesh, self.rules)
    self.init_state = jax.jit(lambda rng: unbox(init(rng)), out_shardings=self.state_shardings)
    self.batch_sharding = sharding.batch_sharding(self.mesh, self.rules)
    self.train_step = jax.jit(
        make_train_step(self.model, self.tx, self.schedule, config.label_smoothing,
                        config.grad_accum_steps),
        in_shardings=(self.state_shardings, self.batch_sharding),
        out_shardings=(self.state_shardings, sharding.replicated(self.mesh)), donate_argnums=0)
    # Evaluation: the same model with dropout off, on the training state's parameters.
    self.eval_model = Transformer(model_cfg.replace(deterministic=True))
    self.eval_step = jax.jit(make_eval_step(self.eval_model, config.label_smoothing),
                             in_shardings=(self.state_shardings.params, self.batch_sharding),
                             out_shardings=sharding.replicated(self.mesh))

  def context(self):
    """Mesh and logical rules for tracing: `nn.with_logical_constraint` needs both."""
    return _Contexts(jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules))


class _Contexts:
  def __init__(self, *managers):
    self.managers = managers

  def __enter__(self):
    for m in self.managers:
      m.__enter__()

  def __exit__(self, *exc):
    for m in reversed(self.managers):
      m.__exit__(*exc)
