r"""Throughput benchmarks; each mode prints a table and then one JSON line of its figures.

    python scripts/benchmark.py --what train --config configs/cpu_reference.py
    python scripts/benchmark.py --what train --config configs/cpu_reference.py \
        --config.model.dtype=bfloat16
    python scripts/benchmark.py --what decode --config configs/cpu_reference.py --beams 1,4
    python scripts/benchmark.py --what decode --config configs/default.py --workdir runs/default
    python scripts/benchmark.py --what data                      # numbers + locale, all modes
    python scripts/benchmark.py --what data --datasets numbers --batching pack --seconds 20

`train`: the compiled train step on batches of the config's shape (step time, tokens/s, TFLOP/s,
MFU, peak memory). `decode`: greedy and beam search on random sources, with random parameters or
a training run's (--workdir). `data`: tokens/s of the input pipeline. What each measures and how:
transformer_jax/bench/{train,decode,data}.py. `--config` and `--config.*` apply to train and
decode. Only `data` and `--batches real` load the data stack (tensorflow-datasets, grain).
"""
import functools
import json
import sys

from absl import flags

from transformer_jax import cli
from transformer_jax.bench import data, decode, train

TRAIN, DECODE, DATA = train.TrainOptions, decode.DecodeOptions, data.DataOptions


def define(values):
  string, integer, number, enum = (functools.partial(d, flag_values=values) for d in (
      flags.DEFINE_string, flags.DEFINE_integer, flags.DEFINE_float, flags.DEFINE_enum))
  enum("what", "data", ["data", "decode", "train"], "what to measure")
  string("datasets", ",".join(DATA.datasets), "data: comma-separated data.dataset values")
  string("batching", ",".join(DATA.batchings), "data: comma-separated data.batching values")
  integer("batch_size", DATA.batch_size, "data: rows per batch")
  integer("max_len", DATA.max_len, "data: max source and target length")
  number("seconds", DATA.seconds, "data: timed seconds per point (> 0)")
  string("data_dir", DATA.data_dir, "data: TFDS data dir (default: TFDS's)")
  string("workdir", None, "data and train --batches real: where datasets' tokenizers are "
         "trained and kept (default: a temp dir); decode: a training run whose latest "
         "parameters to use (default: random parameters)")
  integer("steps", TRAIN.steps, "train steps / decode calls timed one by one; the median is "
          "reported", lower_bound=1)
  integer("warmup", TRAIN.warmup, "train: untimed steps", lower_bound=1)
  enum("batches", TRAIN.batches, list(train.BATCHES),
       "train: random tokens without padding, or the dataset's batches")
  integer("num_batches", TRAIN.num_batches, "train: distinct batches cycled", lower_bound=1)
  integer("matmul_n", TRAIN.matmul_n, "CPU peak: matmul size")
  number("matmul_seconds", TRAIN.matmul_seconds, "CPU peak: at least this long measuring it")
  string("profile_dir", TRAIN.profile_dir, "train: after timing, trace 3 steps with "
         "jax.profiler into this directory and print device time per kernel and category")
  string("beams", ",".join(map(str, DECODE.beams)), "decode: comma-separated beam sizes")
  integer("decode_rows", DECODE.rows, "decode: sentences per batch (0: data.batch_size)")
  integer("decode_len", DECODE.decode_len, "decode: output length limit (0: "
          "data.max_target_len)")
  flags.register_validator("seconds", lambda s: s > 0, "must be > 0", flag_values=values)
  flags.register_validator("beams", lambda s: all(b.isdigit() and int(b) for b in s.split(",")),
                           "must be beam sizes >= 1, e.g. 1,4", flag_values=values)


def body(v, args):
  configured = [f"--{n}" for n in v if n.startswith("config") and v[n].present]
  if v.what == "data" and configured:
    print(f"error: {', '.join(configured)}: --config and --config.* apply to --what train and "
          "decode; data mode takes --datasets, --batching, --batch_size and --max_len",
          file=sys.stderr)
    return 2
  if v.what == "data":
    result = data.run(DATA(
        datasets=tuple(v.datasets.split(",")), batchings=tuple(v.batching.split(",")),
        batch_size=v.batch_size, max_len=v.max_len, seconds=v.seconds, data_dir=v.data_dir,
        workdir=v.workdir))
  elif v.what == "train":
    result = train.run(v.config, TRAIN(
        steps=v.steps, warmup=v.warmup, batches=v.batches, num_batches=v.num_batches,
        workdir=v.workdir, matmul_n=v.matmul_n, matmul_seconds=v.matmul_seconds,
        profile_dir=v.profile_dir))
  else:
    result = decode.run(v.config, DECODE(
        beams=tuple(int(b) for b in v.beams.split(",")), steps=v.steps, rows=v.decode_rows,
        decode_len=v.decode_len, workdir=v.workdir))
  print(json.dumps(result), flush=True)
  return 0


def main(argv=None):
  return cli.run(body, argv, doc=__doc__, define=define, config=cli.repo_config("cpu_reference.py"))


if __name__ == "__main__":
  sys.exit(main())
