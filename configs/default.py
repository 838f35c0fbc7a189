"""The built-in task (English number sentences -> German) with a small model, on 2 CPU cores.

    python scripts/train.py --config configs/default.py --workdir runs/default

Trains a pre-LN Transformer (d_model 128, 3+3 layers) on 50,000 generated sentence pairs for
1,000 steps of 64 packed rows of 32 tokens; see README.md for the time and BLEU it reaches.
"""
from transformer_jax import sweeps
from transformer_jax.experiment import base_config


def get_config(arg=None):
  del arg
  c = base_config("small")         # 3+3 layers, 4 heads; narrowed below
  c.model.update(d_model=128, d_ff=512, dropout_rate=0.1, max_len=64, norm_position="pre")
  c.data.dataset = "numbers"
  c.data.vocab_size = 1000
  c.data.max_source_len = 32       # the longest sentence has 21 pieces
  c.data.max_target_len = 32
  c.data.batch_size = 64           # packed rows of 32 tokens: about 1,800 target tokens a step
  c.num_train_steps = 1000
  c.schedule = "rsqrt"
  c.learning_rate = 2.0             # the paper's schedule, doubled: small models tolerate more
  c.warmup_steps = 400
  c.log_every_steps = 50
  c.eval_every_steps = 250
  c.bleu_every_steps = 500
  c.bleu_num_sentences = 256
  c.checkpoint_every_steps = 500
  return c


def sweep():
  """The learning-rate multiplier against the warmup, 2 x 2 points:

      python scripts/sweep.py --config configs/default.py --workdir runs/default_lr_warmup
      python scripts/sweep.py --workdir runs/default_lr_warmup --report --metric bleu
  """
  return sweeps.product(learning_rate=[1.0, 2.0], warmup_steps=[200, 400])
