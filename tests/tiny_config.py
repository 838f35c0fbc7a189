"""A tiny config for subprocess tests: `scripts/train.py --config tests/tiny_config.py`."""
from transformer_jax import sweeps
from transformer_jax.experiment import base_config


def get_config(arg=None):
  del arg
  c = base_config("tiny")
  c.model.update(d_model=32, num_heads=4, d_ff=64, num_encoder_layers=1, num_decoder_layers=1,
                 max_len=32)
  c.data.update(dataset="numbers", numbers_train_size=2000, numbers_eval_size=64,
                vocab_size=200, max_source_len=32, max_target_len=32, batch_size=8,
                eval_batch_size=32,
                # The corpus is 2 chunks of 1,024 pairs: the default window of 16 chunks packed 8
                # epochs of it (16,384 pairs) at every start and resume of a run, 2-3 s of a
                # 3-6 s command. Tests of windows that span epochs set their own.
                window_chunks=1)
  c.update(num_train_steps=6, warmup_steps=10, log_every_steps=1, eval_every_steps=1000,
           bleu_every_steps=1000, bleu_num_sentences=8, checkpoint_every_steps=3,
           async_checkpointing=False,
           # The CPU peak for MFU from a 256 matmul: ms instead of seconds in every test run.
           cpu_peak_matmul_size=256)
  return c


def sweep():
  """Two learning rates x two warmups (tests/test_sweeps.py runs them for a few steps each)."""
  return sweeps.product(learning_rate=[1.0, 2.0], warmup_steps=[5, 10])
