"""Builds a dataset and its SentencePiece model ahead of training, and prints their sizes.

    python scripts/prepare_data.py --workdir runs/numbers                      # built-in task
    python scripts/prepare_data.py --workdir runs/locale --set dataset=locale target_lang=fr
    python scripts/prepare_data.py --workdir runs/wmt14 --set dataset=wmt14 vocab_size=32000

`--set` overrides fields of `default_data_config()` (values parsed as Python literals where
they parse). Training does the same on first use; this only moves the wait ahead of time and
lets several processes start from ready files.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def parse_overrides(items):
  out = {}
  for item in items:
    key, _, value = item.partition("=")
    try:
      out[key] = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      out[key] = value
  return out


def main(argv=None):
  from transformer_jax.data import default_data_config, get_data

  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--workdir", required=True, help="the run's directory (spm.model goes here)")
  parser.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE",
                      help="data config overrides, e.g. dataset=locale target_lang=fr")
  args = parser.parse_args(argv)
  c = default_data_config()
  for key, value in parse_overrides(args.set).items():
    if key not in c:
      parser.error(f"unknown data field {key!r}; fields: {', '.join(sorted(c))}")
    c[key] = value
  data = get_data(c, args.workdir)
  print(json.dumps({
      "dataset": c.dataset, "direction": f"{c.source_lang}->{c.target_lang}",
      "sizes": {s: len(data.sources[s]) for s in ("train", "validation", "test")},
      "tokenizer": data.tokenizer.path, "vocab_size": data.tokenizer.vocab_size,
  }, indent=2))


if __name__ == "__main__":
  main()
