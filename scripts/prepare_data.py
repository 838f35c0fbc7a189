r"""Build a run's dataset and SentencePiece model ahead of training, and print their sizes.

    python scripts/prepare_data.py --config configs/default.py --workdir runs/default
    python scripts/prepare_data.py --config configs/locale.py:enfr --workdir runs/locale_enfr
    python scripts/prepare_data.py --workdir runs/wmt14 --config configs/wmt14_ende.py:base \
        --config.data.vocab_size=32000

Takes the config and workdir that scripts/train.py will get (default config:
configs/default.py), so training finds the tokenizer ready. Training does the same on first
use; this only moves the wait ahead of time and lets several processes start from ready files.
The printed JSON has the split sizes and, for the corpora this codebase splits itself (numbers,
locale, text), the train/test leakage figures (see docs/data.md) and how many training pairs
are longer than data.max_source_len / data.max_target_len (training drops them).

`--set FIELD=VALUE ...` (data fields) still works for one release, with the same checks; use
--config.data.FIELD=VALUE.
"""
import ast
import json
import sys

from absl import flags

from transformer_jax import cli
from transformer_jax.data import default_data_config, get_data, leakage, pipeline
from transformer_jax.run import trainer, workdir

LOCAL_CORPORA = ("numbers", "locale", "text")


def define(values):
  flags.DEFINE_string("workdir", None, "the run's directory (spm.model goes here)",
                      flag_values=values)
  flags.mark_flag_as_required("workdir", flag_values=values)
  flags.DEFINE_multi_string("set", [], "deprecated: FIELD=VALUE data overrides; use "
                            "--config.data.FIELD=VALUE", flag_values=values)


def _apply_deprecated_set(data_config, items: list[str]) -> None:
  for item in items:
    key, sep, text = item.partition("=")
    if not sep or key not in data_config:
      raise ValueError(f"--set {item!r}: expected FIELD=VALUE with FIELD among "
                       f"{', '.join(sorted(data_config))}")
    try:
      value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      value = text
    cli.deprecated(f"--set {item}", f"--config.data.{key}={text}")
    data_config[key] = value


def body(values, args):
  # The old spelling `--set a=1 b=2` leaves `b=2` as a positional argument.
  extra = [a for a in args if "=" in a] if values.set else []
  if len(extra) != len(args):
    print(f"error: unexpected arguments {[a for a in args if a not in extra]}", file=sys.stderr)
    return 2
  config = values.config
  if values.set and not values["config"].present:
    with config.unlocked():
      config.data = default_data_config()  # what `--set` changed before --config existed
  c = config.data
  _apply_deprecated_set(c, list(values.set) + extra)
  # What train.py checks before it builds anything (with --set too: its data config is the
  # one checked): a path for another dataset, a tokenizer from another corpus, a config an
  # existing run in the workdir cannot take, a workdir inside another run.
  workdir.check_config(values.workdir, config)
  # A fork's tokenizer is its init_from run's, as train.py would take it.
  trainer.adopt_init_from_tokenizer(config, values.workdir)
  data = get_data(c, values.workdir)
  splits = ("train", "validation", "test")
  result = {"dataset": c.dataset, "direction": f"{c.source_lang}->{c.target_lang}",
            "sizes": {s: len(data.sources[s]) for s in splits},
            "tokenizer": data.tokenizer.path, "vocab_size": data.tokenizer.vocab_size}
  if c.dataset in LOCAL_CORPORA:  # WMT's millions of pairs would take minutes to compare
    result["leakage"] = leakage.report({s: data.raw_examples(s) for s in splits})
    train = data.raw_examples("train")
    result["too_long_to_train_on"] = {
        "pairs": pipeline.count_too_long(train, data.tokenizer, c), "of": len(train),
        "max_source_len": c.max_source_len, "max_target_len": c.max_target_len}
  print(json.dumps(result, indent=2))
  return 0


def main(argv=None):
  return cli.run(body, argv, doc=__doc__, define=define, config=cli.repo_config("default.py"),
                 positional=True)


if __name__ == "__main__":
  sys.exit(main())
