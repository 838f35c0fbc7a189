"""The paper's learning-rate schedule and optimizer (Adam with beta2 = 0.98, eps = 1e-9)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

SCHEDULES = ("rsqrt", "constant", "cosine")
# What AdamW's weight decay applies to: "matrices" = the parameters of two or more dimensions
# (projection kernels and embeddings), not biases nor LayerNorm scales and biases, as nanoGPT,
# BERT and most AdamW recipes do; "all" = every parameter, as the Flax WMT example does.
WEIGHT_DECAY_MASKS = ("matrices", "all")


def paper_schedule(d_model: int, warmup_steps: int, scale: float = 1.0):
  """lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), counting steps from 1.

  optax passes the number of updates done so far (0 for the first), so step = count + 1: the first
  update already gets a non-zero rate, as in tensor2tensor.
  """
  def schedule(count):
    step = jnp.asarray(count, jnp.float32) + 1.0
    return scale * d_model**-0.5 * jnp.minimum(step**-0.5, step * warmup_steps**-1.5)
  return schedule


def make_schedule(config, d_model: int):
  name = config.schedule
  if name == "rsqrt":
    return paper_schedule(d_model, config.warmup_steps, config.learning_rate)
  if name == "constant":
    if config.warmup_steps <= 0:
      return optax.constant_schedule(config.learning_rate)
    return optax.linear_schedule(0.0, config.learning_rate, config.warmup_steps)
  if name == "cosine":
    return optax.warmup_cosine_decay_schedule(0.0, config.learning_rate, config.warmup_steps,
                                              config.num_train_steps)
  raise ValueError(f"config.schedule={name!r}: expected one of {SCHEDULES}")


def decay_mask(name: str):
  """optax's `mask` for `config.weight_decay_mask`: None (every parameter) or a function of the
  parameters giving True where they decay."""
  if name not in WEIGHT_DECAY_MASKS:
    raise ValueError(f"config.weight_decay_mask={name!r}: expected one of {WEIGHT_DECAY_MASKS}")
  if name == "all":
    return None  # no optax.masked wrapper: the optimizer state of runs from before the option
  return lambda params: jax.tree.map(lambda p: jnp.ndim(p) >= 2, params)


def _adamw(config, schedule, flat: bool):
  """optax.adamw with `weight_decay_mask`; `flat`: its chain with Adam's moments as one vector
  each, the decay and the learning rate outside the flattening, where the mask still sees each
  parameter's shape."""
  mask = decay_mask(config.weight_decay_mask)
  if not flat:
    return optax.adamw(schedule, b1=config.adam_b1, b2=config.adam_b2, eps=config.adam_eps,
                       weight_decay=config.weight_decay, mask=mask)
  return optax.chain(
      optax.flatten(optax.scale_by_adam(b1=config.adam_b1, b2=config.adam_b2,
                                        eps=config.adam_eps)),
      optax.add_decayed_weights(config.weight_decay, mask),
      optax.scale_by_learning_rate(schedule))


def make_optimizer(config, d_model: int):
  """Adam (AdamW when weight_decay > 0, on the parameters `weight_decay_mask` names), optional
  global-norm clipping, Adam's state as one flat vector with `flatten_optimizer`; returns
  (tx, schedule)."""
  for field in ("weight_decay", "grad_clip_norm"):
    if config[field] < 0:
      raise ValueError(f"config.{field}={config[field]}: must be >= 0 (0 turns it off)")
  schedule = make_schedule(config, d_model)
  if config.weight_decay > 0:
    tx = _adamw(config, schedule, config.flatten_optimizer)
  else:
    tx = optax.adam(schedule, b1=config.adam_b1, b2=config.adam_b2, eps=config.adam_eps)
    if config.flatten_optimizer:
      # The whole update on one vector: gradients raveled, updated, split back. A third of the
      # state's arrays (the host's time to hand a step to the device grows with their number:
      # 10.5 -> 5.6 ms for base on an H100, docs/benchmarks.md) and fewer kernels.
      tx = optax.flatten(tx)
  if config.grad_clip_norm > 0:
    tx = optax.chain(optax.clip_by_global_norm(config.grad_clip_norm), tx)
  return tx, schedule
