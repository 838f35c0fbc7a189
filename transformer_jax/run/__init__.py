"""Running an experiment: the workdir contract, checkpoints, metrics, multi-process start and
stop, the Trainer and the training loop (`transformer_jax.run.loop.train_and_evaluate`).

The core (model, steps, search, data) never imports this package; see docs/architecture.md.
Nothing is imported here, so `transformer_jax.run.checkpointing` loads without the data stack.
"""
