"""Average the parameters of a run's last N checkpoints (the paper: 5 for base, 20 for big).

    python scripts/average_checkpoints.py --workdir runs/default --last 5
    python scripts/evaluate.py --workdir runs/default --averaged --beam_size 4

The mean is taken elementwise in float32 over `<workdir>/checkpoints`' last N steps and saved
into `<workdir>/averaged/<last step>/` (or `--output`), never into `<workdir>/checkpoints`,
which training resumes from. The checkpoint holds `state` = {"params": ...}, the layout
`checkpointing.load_params` reads, and `meta` = {"averaged_steps": [...], ...}; translate.py,
evaluate.py and plot_attention.py load it with `--averaged` or `--checkpoint <dir>`. Keep enough
checkpoints while training: `--config.keep_checkpoints=N` (default 3).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from transformer_jax import translate as translate_lib  # noqa: E402


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--workdir", required=True, help="the training run's directory")
  parser.add_argument("--last", type=int, default=None, help="how many of the latest "
                      "checkpoints (default: the run's config.average_last_checkpoints)")
  parser.add_argument("--output", default=None,
                      help="directory for the average (default: <workdir>/averaged)")
  args = parser.parse_args(argv)
  logging.getLogger("absl").setLevel(logging.ERROR)  # Orbax's read-only notices

  try:
    last = args.last
    if last is None:
      last = int(translate_lib.load_run_config(args.workdir).get("average_last_checkpoints", 1))
    output, step, steps = translate_lib.average_checkpoints(
        args.workdir, last, args.output,
        log=lambda m: print(f"average_checkpoints: {m}", file=sys.stderr, flush=True))
  except translate_lib.USER_ERRORS as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  print(json.dumps({"output": output, "step": step, "averaged_steps": steps}), flush=True)
  print(f"average_checkpoints: use it with --checkpoint {output}"
        + (" (or --averaged)" if args.output is None else ""), file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
