"""The CPU reference setting of the throughput target (docs/benchmarks.md), as a benchmark config.

    python scripts/benchmark.py --what train --config configs/cpu_reference.py
    python scripts/benchmark.py --what train --config configs/cpu_reference.py \
        --config.model.fused_qkv=True

A pre-LN Transformer with one shared, tied vocabulary of 8,000, d_model 256, 4 heads, d_ff 1,024,
3+3 layers, dropout 0.1 (residual and attention weights), float32, and batches of 16 rows of 64
source and 64 target tokens without padding; Adam and label smoothing 0.1 (the base config's).
The performance issue quotes about 1,700 target tokens/s for the Flax WMT example's model on
a 2-core machine; measured on ours in the same minutes it did 2,631-3,210 (docs/benchmarks.md,
`python scripts/baseline_flax_wmt.py 30`), and this config 1.60x that in the median of five
interleaved rounds on 2026-12-06, on an Intel Xeon host with the scripts' huge pages for host
memory (1.42x the example given the same pages; 1.20x on 2026-11-29 on an AMD EPYC host), and
1.68x (1.26x given the same pages) on 2026-12-07 on an AMD EPYC host with AVX-512.
It also trains (`scripts/train.py --config configs/cpu_reference.py --workdir ...`) on the
built-in numbers task, but it is meant for measuring, not for results.
"""
from transformer_jax.experiment import base_config


def get_config(arg=None):
  del arg
  c = base_config("small")   # d_model 256, 4 heads, d_ff 1,024, 3+3 layers, dropout 0.1
  c.model.update(
      norm_position="pre",
      attention_dropout_rate=0.1,  # dropout on the attention weights as well
      dtype="float32",             # compute; parameters, optimizer state and loss are float32
      max_len=64,
  )
  c.data.vocab_size = 8000         # one SentencePiece vocabulary, shared and tied
  c.data.max_source_len = 64       # rows of 64 source and 64 target tokens
  c.data.max_target_len = 64
  c.data.batch_size = 16           # 16 x 64 = 1,024 target tokens a step
  c.data.batching = "pad"          # with --batches real; synthetic batches have no padding
  c.label_smoothing = 0.1
  return c
