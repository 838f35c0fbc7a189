"""Throughput benchmarks, one function per `--what` mode.

    python scripts/benchmark.py --what data                      # numbers + locale, all modes
    python scripts/benchmark.py --what data --datasets numbers --batching pack --seconds 20

`data`: tokens/s the training input pipeline delivers (real, non-padding tokens per side), after
a warm-up that leaves out building the dataset and training the tokenizer, plus the fill rate
(real tokens / row capacity) and the dataset sizes. Numbers are per process; with the default
config one process reads on 2 threads.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def bench_data(args) -> list[dict]:
    from transformer_jax.data import default_data_config, get_data  # Imports tfds and grain.

    results = []
    for dataset in args.datasets.split(","):
        for batching in args.batching.split(","):
            c = default_data_config()
            c.dataset, c.batching = dataset, batching
            c.data_dir = args.data_dir
            c.batch_size = args.batch_size
            c.max_source_len = c.max_target_len = args.max_len
            workdir = os.path.join(args.workdir, dataset)
            start = time.perf_counter()
            data = get_data(c, workdir)
            setup_s = time.perf_counter() - start
            it = iter(data.train_dataset())
            next(it)  # Warm-up: threads started, first window read.
            batches = source_tokens = target_tokens = capacity = 0
            start = time.perf_counter()
            while time.perf_counter() - start < args.seconds:
                batch = next(it)
                batches += 1
                source_tokens += int((batch["inputs_segmentation"] > 0).sum())
                target_tokens += int((batch["targets_segmentation"] > 0).sum())
                capacity += batch["targets"].size
            elapsed = time.perf_counter() - start
            if hasattr(it, "close"):
                it.close()  # Stops grain's prefetch thread before the interpreter exits.
            results.append({
                "dataset": dataset, "batching": batching,
                "sizes": {s: len(data.sources[s]) for s in ("train", "validation", "test")},
                "vocab_size": data.tokenizer.vocab_size, "setup_s": round(setup_s, 2),
                "batches_per_s": round(batches / elapsed, 1),
                "source_tokens_per_s": round(source_tokens / elapsed),
                "target_tokens_per_s": round(target_tokens / elapsed),
                "target_fill": round(target_tokens / max(1, capacity), 3),
                "batch_shape": list(batch["targets"].shape),
            })
            print(json.dumps(results[-1]), flush=True)
    return results


MODES = {"data": bench_data}  # `train` is added by the training code.


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--what", choices=sorted(MODES), default="data")
    parser.add_argument("--datasets", default="numbers,locale",
                        help="comma-separated data.dataset values (data mode)")
    parser.add_argument("--batching", default="pack,bucket,pad",
                        help="comma-separated data.batching values (data mode)")
    parser.add_argument("--batch_size", type=int, default=64, help="rows per batch")
    parser.add_argument("--max_len", type=int, default=64, help="max source and target length")
    parser.add_argument("--seconds", type=float, default=10.0, help="timed seconds per point")
    parser.add_argument("--data_dir", default=None, help="TFDS data dir (default: TFDS's)")
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(),
                                                          "transformer_jax_bench"),
                        help="where the tokenizers are trained and kept")
    args = parser.parse_args(argv)
    return MODES[args.what](args)


if __name__ == "__main__":
    main()
