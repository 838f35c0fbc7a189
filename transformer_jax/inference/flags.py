"""The flags that choose a run's checkpoint and search, shared by translate.py, evaluate.py and
plot_attention.py."""
from __future__ import annotations

from absl import flags

from transformer_jax.inference.translator import Translator


def define_checkpoint_flags(values: flags.FlagValues) -> None:
  def define(kind, name, default, help_text):
    getattr(flags, f"DEFINE_{kind}")(name, default, help_text, flag_values=values)

  define("string", "workdir", None, "the training run's directory")
  flags.mark_flag_as_required("workdir", flag_values=values)
  define("integer", "step", None, "a step of <workdir>/checkpoints (default: the latest)")
  define("string", "checkpoint", None, "load parameters from here instead: a workdir, "
         "checkpoints or averaged directory, or a checkpoints/<step> dir")
  define("bool", "averaged", False, "use <workdir>/averaged (scripts/average_checkpoints.py)")
  define("integer", "beam_size", None, "1 = greedy (default: the run's config.beam_size)")
  define("float", "alpha", None, "length penalty (default: the run's config.length_penalty_alpha)")
  define("integer", "max_len_margin", None,
         "output limit = source length + margin (default: the run's)")
  define("integer", "batch_size", 64, "sentences per search batch")


def translator_from_flags(values: flags.FlagValues, **kwargs) -> Translator:
  """A Translator from the flags of `define_checkpoint_flags`."""
  return Translator(values.workdir, step=values.step, checkpoint=values.checkpoint,
                    averaged=values.averaged, beam_size=values.beam_size, alpha=values.alpha,
                    max_len_margin=values.max_len_margin, batch_size=values.batch_size, **kwargs)
