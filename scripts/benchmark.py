r"""Throughput benchmarks; each prints a table and one JSON line (docs/benchmarks.md).

    python scripts/benchmark.py --what train --config configs/cpu_reference.py
    python scripts/benchmark.py --what decode --config configs/cpu_reference.py --beams 1,4
    python scripts/benchmark.py --what data --datasets numbers --batching pack --seconds 20
    python scripts/benchmark.py --what train --sweep data.batch_size=8,16,32 \
        --sweep model.fused_qkv=False,True --curve_dir runs/curve   # a throughput curve
    python scripts/benchmark.py --what kernels --config configs/cpu_reference.py

`train`: the compiled train step (step time, tokens/s, MFU, memory); `decode`: greedy and beam
search; `kernels`: the search's costliest small operations before and after their changes;
`data`: the input pipeline (transformer_jax/bench/). `--config` and `--config.*` apply to
train, decode and kernels (its sizes), `--sweep`/`--sweep_config` (a curve:
curve.csv/.md/.png) to train and decode; every other flag's help names the modes it applies to,
and giving it with another `--what` is an error. Only `data` and `--batches real` load
tensorflow-datasets and grain.
"""
import functools
import json
import sys

import _host_memory  # noqa: F401 (before jax: restarts with huge pages, see the module)
from absl import flags

from transformer_jax import cli, sweeps
from transformer_jax.bench import common, curve, data, decode, kernels, train

TRAIN, DECODE, DATA = train.TrainOptions, decode.DecodeOptions, data.DataOptions
# The modes each flag applies to; given with another --what it would be ignored, so it is refused.
MODES = {**dict.fromkeys(("datasets", "batching", "batch_size", "max_len", "seconds", "data_dir"),
                         ("data",)),
         **dict.fromkeys(("warmup", "batches", "num_batches", "matmul_n", "matmul_seconds",
                          "profile_dir"), ("train",)),
         **dict.fromkeys(("beams", "decode_rows", "decode_len"), ("decode", "kernels")),
         **dict.fromkeys(("sweep", "sweep_config", "curve_dir"), ("train", "decode")),
         **dict.fromkeys(("ensemble_size", "search_parts"), ("decode",)),
         "steps": ("train", "decode", "kernels"), "workdir": ("data", "train", "decode")}
# The config fields the other modes read instead of a data-mode flag.
CONFIG_FIELDS = {"batch_size": "data.batch_size (or data.batch_tokens)",
                 "max_len": "data.max_source_len and data.max_target_len",
                 "datasets": "data.dataset", "batching": "data.batching",
                 "data_dir": "data.data_dir"}


def define(values):
  string, integer, number, enum = (functools.partial(d, flag_values=values) for d in (
      flags.DEFINE_string, flags.DEFINE_integer, flags.DEFINE_float, flags.DEFINE_enum))
  enum("what", "data", ["data", "decode", "kernels", "train"], "what to measure")
  string("datasets", ",".join(DATA.datasets), "data: comma-separated data.dataset values")
  string("batching", ",".join(DATA.batchings), "data: comma-separated data.batching values")
  integer("batch_size", DATA.batch_size, "data: rows per batch")
  integer("max_len", DATA.max_len, "data: max source and target length")
  number("seconds", DATA.seconds, "data: timed seconds per point (> 0)")
  string("data_dir", DATA.data_dir, "data: TFDS data dir (default: TFDS's)")
  string("workdir", None, "data, train --batches real: where tokenizers are kept (default: a "
         "temp dir); decode: a run whose latest parameters to use (default: random ones)")
  integer("steps", TRAIN.steps, "train steps / decode calls / kernels calls timed one by one; "
          "the median is reported", lower_bound=1)
  integer("warmup", TRAIN.warmup, "train: untimed steps", lower_bound=1)
  enum("batches", TRAIN.batches, list(train.BATCHES),
       "train: random tokens without padding, or the dataset's batches")
  integer("num_batches", TRAIN.num_batches, "train: distinct batches cycled", lower_bound=1)
  integer("matmul_n", TRAIN.matmul_n, "train: the CPU peak's matmul size",
          lower_bound=train.MIN_MATMUL_N)
  number("matmul_seconds", TRAIN.matmul_seconds, "train: at least this long measuring the CPU "
         "peak", lower_bound=0)
  string("profile_dir", TRAIN.profile_dir, "train: after timing, trace 3 steps with "
         "jax.profiler into this directory and print device time per kernel and category")
  string("beams", ",".join(map(str, DECODE.beams)), "decode: comma-separated beam sizes; "
         "kernels: the largest above 1 (4 if none)")
  integer("decode_rows", DECODE.rows, "decode, kernels: sentences per batch "
          "(0: a training batch's rows: data.batch_size, or data.batch_tokens // the longest "
          "row)", lower_bound=0)
  integer("decode_len", DECODE.decode_len, "decode: output length limit; kernels: "
          "its stages give the cached slots (0: max_target_len)", lower_bound=0)
  integer("ensemble_size", DECODE.ensemble_size, "decode: models searched together (an "
          "ensemble of random ones; 1: one model)", lower_bound=1)
  integer("search_parts", DECODE.parts, "decode: slices of each batch searched at the same "
          "time, one thread each (0: search.concurrent_parts, 2 on one CPU device of 2+ cores)",
          lower_bound=0)
  flags.DEFINE_multi_string("sweep", [], "train, decode: FIELD=V1,V2: a curve (repeatable: the "
                            "product)", flag_values=values)
  flags.DEFINE_bool("sweep_config", False, "train, decode: a curve over the config's sweep()",
                    flag_values=values)
  string("curve_dir", "runs/bench_curve", "train, decode: where a curve's table, plot and "
         "points go")
  flags.register_validator("seconds", lambda s: s > 0, "must be > 0", flag_values=values)
  flags.register_validator("beams", lambda s: all(b.isdigit() and int(b) for b in s.split(",")),
                           "must be beam sizes >= 1, e.g. 1,4", flag_values=values)


def refused(v) -> str | None:
  """Why these flags cannot run together (None: they can): one given for another mode, or a
  combination in which one of them would do nothing."""
  configured = [f"--{n}" for n in v if n.startswith("config") and v[n].present]
  if v.what == "data" and configured:
    return f"{', '.join(configured)} apply to --what train, decode and kernels, not data"
  for name, modes in MODES.items():
    if v[name].present and v.what not in modes:
      listed = " and ".join(filter(None, (", ".join(modes[:-1]), modes[-1])))
      why = f"--{name} applies to --what {listed}, not {v.what}"
      if name in CONFIG_FIELDS:
        why += f": --what {v.what} reads --config.{CONFIG_FIELDS[name]}"
      return why
  if v.sweep and v.sweep_config:
    return "pass --sweep or --sweep_config, not both"
  if v["curve_dir"].present and not (v.sweep or v.sweep_config):
    return "--curve_dir is where a curve goes: add --sweep or --sweep_config, or drop it"
  if v.what == "train" and v.workdir and v.batches != "real":
    return ("--workdir keeps the dataset's tokenizer for --batches real; synthetic batches "
            "need none: add --batches real, or drop --workdir")
  return None


def body(v, args):
  why = refused(v)
  if why:
    print(f"error: {why}", file=sys.stderr)
    return 2
  if v.ensemble_size > 1 and v.workdir:
    print(f"error: --ensemble_size {v.ensemble_size} searches models of random parameters, "
          "not --workdir's: drop --workdir, or decode trained runs together with "
          "scripts/evaluate.py --ensemble", file=sys.stderr)
    return 2
  try:
    return _measure(v)
  # A curve the user got wrong (its fields or values); sizes the model cannot take.
  except (sweeps.SweepError, common.BenchError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1


def _measure(v):
  if v.what == "data":
    result = data.run(DATA(
        datasets=tuple(v.datasets.split(",")), batchings=tuple(v.batching.split(",")),
        batch_size=v.batch_size, max_len=v.max_len, seconds=v.seconds, data_dir=v.data_dir,
        workdir=v.workdir))
  elif v.what == "kernels":
    beams = [int(b) for b in v.beams.split(",") if int(b) > 1] or [4]
    result = kernels.run(v.config, kernels.KernelOptions(
        rows=v.decode_rows, beam=max(beams), decode_len=v.decode_len, calls=v.steps))
  elif v.sweep or v.sweep_config:
    points = (sweeps.load_sweep(v["config"].config_filename).points if v.sweep_config
              else curve.points_from_flags(v.sweep))
    fixed = [n[len("config."):] for n in v if n.startswith("config.") and v[n].present]
    result = curve.run_curve(v.config, points, v.what, _options(v), v.curve_dir,
                             log=lambda m: print(m, file=sys.stderr, flush=True), fixed=fixed)
  else:
    result = (train.run if v.what == "train" else decode.run)(v.config, _options(v))
  print(json.dumps(result), flush=True)
  return 0


def _options(v):
  if v.what == "train":
    return TRAIN(
        steps=v.steps, warmup=v.warmup, batches=v.batches, num_batches=v.num_batches,
        workdir=v.workdir, matmul_n=v.matmul_n, matmul_seconds=v.matmul_seconds,
        profile_dir=v.profile_dir, config_path=v["config"].config_filename)
  return DECODE(beams=tuple(int(b) for b in v.beams.split(",")), steps=v.steps,
                rows=v.decode_rows, decode_len=v.decode_len, workdir=v.workdir,
                ensemble_size=v.ensemble_size, parts=v.search_parts)


def main(argv=None):
  return cli.run(body, argv, doc=__doc__, define=define, config=cli.repo_config("cpu_reference.py"))


if __name__ == "__main__":
  sys.exit(main())
