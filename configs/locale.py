"""The real offline corpus: this machine's gettext catalogs (human translations), EN-DE or EN-FR.

    python scripts/train.py --config configs/locale.py:ende --workdir runs/locale_ende
    python scripts/train.py --config configs/locale.py:enfr --workdir runs/locale_enfr

About 18,000 training pairs of software messages (see docs/data.md for counts and the cleaning
rules). A small pre-LN model with more dropout than the paper, since the corpus is small.
"""
from transformer_jax.experiment import base_config

PAIRS = {"ende": ("en", "de"), "enfr": ("en", "fr"), "deen": ("de", "en"), "fren": ("fr", "en")}


def get_config(arg="ende"):
  arg = arg or "ende"
  if arg not in PAIRS:
    raise ValueError(f"configs/locale.py:{arg}: expected one of {tuple(PAIRS)}")
  c = base_config("small")
  c.model.update(norm_position="pre", dropout_rate=0.3, attention_dropout_rate=0.1,
                 max_len=256)
  c.data.dataset = "locale"
  c.data.source_lang, c.data.target_lang = PAIRS[arg]
  c.data.vocab_size = 8000
  c.data.max_source_len = 64
  c.data.max_target_len = 64
  c.data.batch_size = 64           # packed rows of 64 tokens: about 3,500 target tokens a step
  c.num_train_steps = 20_000
  c.learning_rate = 2.0
  c.warmup_steps = 2000
  c.eval_every_steps = 1000
  c.bleu_every_steps = 2000
  c.checkpoint_every_steps = 1000
  c.beam_size = 4
  return c
