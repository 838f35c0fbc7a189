"""The paper's recipe on WMT 2014 English-German (TFDS `wmt14_translate/de-en`; downloads once).

    python scripts/train.py --config configs/wmt14_ende.py:base --workdir runs/wmt14_base
    python scripts/train.py --config configs/wmt14_ende.py:big --workdir runs/wmt14_big
    python scripts/average_checkpoints.py --workdir runs/wmt14_base    # the last 5 (big: 20)
    python scripts/evaluate.py --workdir runs/wmt14_base --split test --averaged

Transformer base (65M in the paper; 63.0M here with a 37,000-piece vocabulary, see docs/model.md)
or big; Adam(0.9, 0.98, 1e-9); lr = d_model^-0.5 * min(step^-0.5, step * 4000^-1.5); label
smoothing 0.1; 96 packed rows of 256 tokens a step: 24,576 slots a side, which packing fills
to about 99% on the side that closes a row and less on the other (0.99 target and about 0.82
source on the locale EN-DE data, docs/data.md), so fewer real tokens than the paper's
"approximately 25,000 source and 25,000 target"; the `source_tokens` and `tokens` metrics
count them;
100k (base) / 300k (big) steps; beam 4, alpha 0.6, output limit source length + 50; the paper
evaluates the average of the last 5 (base) / 20 (big) checkpoints (`average_last_checkpoints`,
used by `scripts/average_checkpoints.py`). On fewer devices than the paper's 8 GPUs, keep
the tokens per step with `--config.grad_accum_steps` rather than shrinking the batch.
The paper's 27.3 (base) and 28.4 (big) on newstest2014 are tokenized BLEU with compounds split:
compare them with evaluate.py's `tokenized_bleu`, not its sacreBLEU (docs/decoding.md).
"""
from transformer_jax.experiment import base_config

SIZES = {
    # size: (dropout, steps, checkpoint every (about 10 minutes on 8 P100), average last N).
    # Base: 1,250 steps (0.4 s/step: 8.3 min) divides 100k, so the last 5 are evenly spaced;
    # 1,500 (10 min) would leave 1,000 steps between the last two.
    "base": (0.1, 100_000, 1250, 5),
    "big": (0.3, 300_000, 600, 20),
}


def get_config(arg="base"):
  arg = arg or "base"
  if arg not in SIZES:
    raise ValueError(f"configs/wmt14_ende.py:{arg}: expected one of {tuple(SIZES)}")
  dropout, steps, every, average = SIZES[arg]
  c = base_config(arg)
  c.model.update(norm_position="post", dropout_rate=dropout, attention_dropout_rate=0.0,
                 relu_dropout_rate=0.0, max_len=256)
  c.data.dataset = "wmt14"
  c.data.source_lang, c.data.target_lang = "en", "de"
  c.data.vocab_size = 37000
  c.data.vocab_model_type = "bpe"
  c.data.max_source_len = 256
  c.data.max_target_len = 256
  c.data.batch_size = 96           # 96 packed rows x 256 = 24,576 token slots per side
  c.data.eval_batch_size = 64
  c.num_train_steps = steps
  c.schedule = "rsqrt"
  c.learning_rate = 1.0
  c.warmup_steps = 4000
  c.label_smoothing = 0.1
  c.log_every_steps = 100
  c.eval_every_steps = 5000
  c.bleu_every_steps = 10_000
  c.bleu_num_sentences = 512
  c.checkpoint_every_steps = every
  c.keep_checkpoints = average
  c.average_last_checkpoints = average
  c.beam_size = 4
  c.length_penalty_alpha = 0.6
  c.max_len_margin = 50
  return c
