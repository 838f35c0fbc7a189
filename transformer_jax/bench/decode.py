"""Throughput of greedy and beam search: `run(config, DecodeOptions(...)) -> dict`.

`search.search_batch` on rows of `data.max_source_len` random token ids (not the dataset's
sentences, also with a trained run's parameters), `rows` at a time (default: a training batch's
rows, `data.config.global_rows`), compiled once then timed `steps` times: sentences/s and
output tokens/s. With random parameters (no `workdir`) the output length is forced: EOS is set
to the padding id, which the search never emits, so every sentence runs to its limit of
`decode_len` tokens (default `data.max_target_len`; with learned positions at most
`model.max_len`) and the figures are of that many steps. With `workdir` holding a training run,
its latest parameters and model config are used and sentences stop at EOS as usual (tokens/s
counts what was produced; on random sources the output lengths are not those of real
translations). `ensemble_size` M > 1 searches an ensemble (`search.Ensemble`) of M models
initialised with M seeds (random parameters only: evaluate.py --ensemble decodes trained runs
together). Each batch is searched as evaluate.py searches it, in `parts` slices of its rows at
the same time (`search.in_parts`; 0: `search.concurrent_parts`, two halves on one CPU device of
2+ cores); the JSON line's `search_parts` says how many.
"""
from __future__ import annotations

import dataclasses
import statistics
import time

import jax
import numpy as np

from transformer_jax.bench import common
from transformer_jax.data.config import global_rows
from transformer_jax.experiment import transformer_config
from transformer_jax.inference.translator import model_config_from
from transformer_jax.model import Transformer
from transformer_jax.run import checkpointing
from transformer_jax.run.workdir import load_run_config, run_config_path
from transformer_jax.search import Ensemble, concurrent_parts, search_batch


@dataclasses.dataclass(frozen=True)
class DecodeOptions:
  beams: tuple[int, ...] = (1, 4)  # beam sizes; 1 is greedy search
  steps: int = 20                  # timed calls per beam size; the median is reported
  rows: int = 0                    # sentences per batch (0: a training batch's rows)
  decode_len: int = 0              # output length limit (0: data.max_target_len)
  workdir: str | None = None       # a training run whose latest parameters to use
  ensemble_size: int = 1           # models decoded together (random parameters only)
  parts: int = 0                   # slices of a batch searched at once (0: concurrent_parts)

  def __post_init__(self):
    if self.steps < 1:
      raise ValueError(f"steps={self.steps}: must be >= 1")
    if self.rows < 0 or self.decode_len < 0:
      raise ValueError(f"rows={self.rows}, decode_len={self.decode_len}: must be >= 0 (0: the "
                       "config's)")
    if self.parts < 0:
      raise ValueError(f"parts={self.parts}: must be >= 0 (0: search.concurrent_parts)")
    if self.ensemble_size < 1:
      raise ValueError(f"ensemble_size={self.ensemble_size}: must be >= 1")
    if self.ensemble_size > 1 and self.workdir:
      raise ValueError(f"ensemble_size={self.ensemble_size} decodes models of random parameters: "
                       "drop workdir, or decode trained runs together with scripts/evaluate.py "
                       "--ensemble")
    if not self.beams or min(self.beams) < 1:
      raise ValueError(f"beams={self.beams}: beam sizes must be >= 1")


def trained_run(workdir: str):
  """(model config for search, parameters on the default device, step) of a training run's
  workdir. On the device once, as `Translator` has them: host arrays would be copied to an
  accelerator in every timed call, which the random-parameter figures do not pay."""
  model_cfg = model_config_from(load_run_config(workdir), run_config_path(workdir))
  step, params = checkpointing.load_params(workdir)
  return model_cfg.replace(deterministic=True, decode=False), jax.device_put(params), step


def sizes(config, options: DecodeOptions) -> tuple[int, int]:
  """(sentences per batch, output length limit): the options', else the config's (a training
  batch's rows, `data.config.global_rows`; `data.max_target_len`)."""
  return (options.rows or global_rows(config.data),
          options.decode_len or config.data.max_target_len)


def check_length(model_cfg, decode_len: int, options: DecodeOptions) -> None:
  """A common.BenchError if a learned position table (`model_cfg.max_len` rows) cannot cover
  `decode_len` output positions: sinusoidal positions extend (`run` raises max_len), a table's
  parameters do not."""
  if model_cfg.position_encoding != "learned" or decode_len <= model_cfg.max_len:
    return
  given = (f"--decode_len {decode_len}" if options.decode_len
           else f"data.max_target_len={decode_len} (the default of --decode_len)")
  raise common.BenchError(
      f"{given} is longer than the learned position table's model.max_len={model_cfg.max_len} "
      f"rows (model.position_encoding='learned'): pass --decode_len {model_cfg.max_len} or less")


def check_point(config, options: DecodeOptions) -> None:
  """`check_length` for random parameters of `config` (a curve's point), before anything runs:
  a trained run's table (`workdir`) is checked once its config is read."""
  if not options.workdir:
    check_length(transformer_config(config, config.data.vocab_size), sizes(config, options)[1],
                 options)


def _time_search(search_cfg, params, inputs, beam: int, decode_len: int, calls: int,
                 parts: int):
  """(first call's seconds, the timed calls' seconds, output tokens of each)."""
  def search():
    return search_batch(search_cfg, params, inputs, beam_size=beam, max_len_margin=decode_len,
                        max_decode_len=decode_len, parts=parts)

  start = time.perf_counter()
  search()
  first_s = time.perf_counter() - start
  times, produced = [], []
  for _ in range(calls):
    start = time.perf_counter()
    _, lengths = search()
    times.append(time.perf_counter() - start)
    produced.append(int(lengths.sum()))
  return first_s, times, produced


def run(config, options: DecodeOptions = DecodeOptions()) -> dict:
  """Time the search on `config`'s model; prints a table and returns the figures with the
  config, shapes, model, environment and load average."""
  load_start = common.load_average()
  # The peak memory of this run alone, where it can be reset (CPU): not an earlier one's.
  fresh_peak = common.reset_peak_memory()
  d = config.data
  rows, decode_len = sizes(config, options)
  if options.workdir:
    model_cfg, params, ckpt_step = trained_run(options.workdir)
    check_length(model_cfg, decode_len, options)
    source = f"trained parameters of {options.workdir} (step {ckpt_step}); stops at EOS"
    search_cfg = model_cfg
  else:
    model_cfg = transformer_config(config, d.vocab_size).replace(deterministic=True)
    check_length(model_cfg, decode_len, options)
    init = jax.jit(Transformer(model_cfg).init)
    seeds = [config.seed + m for m in range(options.ensemble_size)]
    members = [init(jax.random.key(seed), np.ones((1, 8), np.int32),
                    np.ones((1, 8), np.int32))["params"] for seed in seeds]
    params = members[0] if len(members) == 1 else jax.device_put(Ensemble.of(members))
    # The search never emits the padding id: with EOS = padding every sentence runs to its
    # limit, so the figures are of exactly `decode_len` steps per sentence.
    search_cfg = model_cfg.replace(eos_id=model_cfg.pad_id)
    source = f"random parameters; EOS disabled, {decode_len} tokens per sentence"
    if options.ensemble_size > 1:
      source += f"; an ensemble of {len(seeds)} models (seeds {seeds[0]} to {seeds[-1]})"
  if search_cfg.max_len < decode_len:
    search_cfg = search_cfg.replace(max_len=decode_len)  # sinusoidal positions only
  inputs = common.random_tokens(np.random.default_rng(0), model_cfg.vocab_size,
                                (rows, d.max_source_len))
  # Said in the output: trained parameters or not, what is searched is no real sentence.
  sources = (f"random token ids ({common.FIRST_TOKEN}..{model_cfg.vocab_size - 1}, no padding), "
             "not sentences of the dataset")
  parts = options.parts or concurrent_parts(rows)
  if rows % parts:
    raise common.BenchError(f"--search_parts {parts} does not divide the {rows} rows of a batch "
                            "(--decode_rows): pass a divisor, or 0 for the default")
  results, table = {}, [("device", f"{jax.devices()[0].device_kind}"), ("parameters", source),
                        ("sources", sources),
                        ("searched as", f"{parts} slice(s) of {rows // parts} rows at a time")]
  for beam in options.beams:
    first_s, times, produced = _time_search(search_cfg, params, inputs, beam, decode_len,
                                            options.steps, parts)
    name = "greedy" if beam == 1 else f"beam {beam}"
    results[name] = {"beam_size": beam, **search_figures(rows, first_s, times, produced)}
    table += table_rows(name, results[name])
  table.append(("host memory", common.host_paging()))
  table.append(("load average (start)", str(load_start)))
  common.print_table(f"decode: {rows} sources x {d.max_source_len} tokens, up to {decode_len} "
                     f"output tokens, {model_cfg.dtype}", table)
  memory, memory_source = common.peak_memory(fresh_peak)
  return {"what": "decode", "parameters": source, "sources": sources,
          "shapes": {"inputs": [rows, d.max_source_len], "max_output_len": decode_len},
          "ensemble_size": options.ensemble_size, "search_parts": parts,
          "model": model_cfg.to_dict(), "config": common.config_json(config),
          **common.environment(model_cfg), "load_average_start": load_start,
          "load_average_end": common.load_average(),
          "figures": {**results, "peak_memory_bytes": memory,
                      "peak_memory_source": memory_source, "peak_memory_of_run": fresh_peak}}


def search_figures(rows: int, first_s: float, times: list[float], produced: list[int]) -> dict:
  """The figures of one beam size's calls: the median call's time for `rows` sentences, and the
  output tokens per call averaged over the calls."""
  median = statistics.median(times)
  tokens = float(np.mean(produced))
  return {"first_call_s": round(first_s, 3), "batch_time_s": round(median, 4),
          "calls_timed": len(times), "sentences_per_s": round(rows / median, 2),
          "target_tokens_per_s": round(tokens / median, 1), "target_tokens_per_batch": tokens}


def table_rows(name: str, f: dict) -> list[tuple[str, str]]:
  """The printed table's rows of one search's figures, read from them (the JSON line's)."""
  return [(f"{name}: batch time (median)", f"{f['batch_time_s'] * 1e3:.1f} ms "
           f"(first call {f['first_call_s']:.2f} s, {f['calls_timed']} calls)"),
          (f"{name}: sentences/s", f"{f['sentences_per_s']:,.1f}"),
          (f"{name}: target tokens/s", f"{f['target_tokens_per_s']:,.0f} "
           f"({f['target_tokens_per_batch']:.0f} per batch)")]
