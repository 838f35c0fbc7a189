"""The experiment configuration: every field of a run, commented, in one ConfigDict.

`configs/*.py` start from `base_config()` and override what their experiment changes. The
precedence of what a run starts from is: resume (the workdir already holds checkpoints) >
`init_from` (parameters of another run) > scratch.
"""
from __future__ import annotations

import difflib
import math

import ml_collections

from transformer_jax.config import TransformerConfig, model_config
from transformer_jax.data import config as data_config
from transformer_jax.optim import SCHEDULES, WEIGHT_DECAY_MASKS
from transformer_jax.sharding import DEFAULT_RULES, MESH_AXES, ShardingError, rules_problem

# `keep_best`'s metrics (names of metrics.jsonl) -> whether larger is better (run/best.py).
BEST_METRICS = {"bleu": True, "eval_loss": False, "eval_nll": False, "eval_perplexity": False,
                "eval_accuracy": True}

# TransformerConfig fields a run sets itself: the vocabulary comes from the tokenizer, the mode
# flags from what is being run.
_RUNTIME_FIELDS = ("vocab_size", "target_vocab_size", "deterministic", "decode", "pad_id",
                   "bos_id", "eos_id")


def model_fields(size: str) -> ml_collections.ConfigDict:
  """The model's fields for a named size, as a ConfigDict so `--config.model.x=...` works."""
  fields = model_config(size, vocab_size=1).to_dict()
  for name in _RUNTIME_FIELDS:
    fields.pop(name)
  return ml_collections.ConfigDict(fields)


def base_config(size: str = "small") -> ml_collections.ConfigDict:
  """Every field of a run with the model fields of a named size (`config.SIZES`: tiny, small,
  base, big); a config file picks the size here and overrides what its experiment changes."""
  c = ml_collections.ConfigDict()
  # The model: every TransformerConfig field, starting from the named size; override any, e.g.
  # --config.model.norm_position=pre. vocab_size comes from the tokenizer.
  c.model = model_fields(size)
  # The data pipeline: dataset, tokenizer, lengths, batching (see transformer_jax/data/config.py).
  c.data = data_config.default_data_config()

  c.seed = 0                      # parameter init and dropout (the data order: data.shuffle_seed)
  c.num_train_steps = 2000        # optimizer updates
  # Learning rate: "rsqrt" is the paper's d_model^-0.5 * min(step^-0.5, step * warmup^-1.5),
  # multiplied by learning_rate; "constant"/"cosine" use learning_rate as the peak after warmup,
  # reached linearly from 0 (optax's schedules: with warmup, the first update's rate is 0).
  c.schedule = "rsqrt"
  c.learning_rate = 1.0
  c.warmup_steps = 4000
  c.adam_b1 = 0.9                 # the paper: 0.9, 0.98, 1e-9
  c.adam_b2 = 0.98
  c.adam_eps = 1e-9
  c.weight_decay = 0.0            # > 0 switches Adam to AdamW (the paper: plain Adam)
  c.weight_decay_mask = "matrices"  # decay kernels and embeddings only; "all": every parameter
  c.grad_clip_norm = 0.0          # global-norm clipping; 0 = off (the paper does not clip)
  # Adam over one flat vector of all parameters (optax.flatten) instead of one array per
  # parameter: the same updates, a third of the state's arrays, so the host hands a step to the
  # device in half the time (H100, base: 5.6 against 10.5 ms; docs/benchmarks.md). Helps where
  # the host cannot keep ahead of the device (a step waited for, a short device step); back to
  # back, as training runs, its ravel/unravel passes cost 1% (H200, base and big); single-
  # device or data-parallel meshes only (a flat vector cannot follow an fsdp/tensor split).
  c.flatten_optimizer = False
  c.label_smoothing = 0.1         # epsilon_ls
  c.grad_accum_steps = 1          # microbatches per step (rows must divide evenly)

  # Device mesh: sizes of the data / fsdp / tensor axes; -1 fills the remaining devices.
  c.mesh = ml_collections.ConfigDict({"data": -1, "fsdp": 1, "tensor": 1})
  # Logical axis name -> mesh axes, in priority order (see transformer_jax/sharding.py).
  c.logical_axis_rules = [list(r) for r in DEFAULT_RULES]

  c.log_every_steps = 50          # console, metrics.jsonl and TensorBoard cadence
  # On CPU, MFU is against the FLOP/s of an n x n float32 matmul measured at start-up: about 3 s
  # at 2048 on 2 cores (x the fake devices, each running one). Smaller starts sooner but measures
  # a lower peak; the tests' tiny runs use 256. Accelerators read the peak from a table instead.
  c.cpu_peak_matmul_size = 2048
  c.eval_every_steps = 500        # validation loss/accuracy over the whole validation split
  c.bleu_every_steps = 1000       # sacreBLEU on the first bleu_num_sentences validation pairs
  c.bleu_num_sentences = 256
  c.beam_size = 1                 # search for BLEU during training and for the tools (paper: 4)
  c.length_penalty_alpha = 0.6    # GNMT length penalty alpha (paper: 0.6)
  c.max_len_margin = 50           # output length limit = source length + margin (paper: 50)
  c.average_last_checkpoints = 1  # paper: 5 (base), 20 (big); used by the evaluation tools
  # "bleu", "eval_loss", "eval_accuracy", ...: keep the parameters of the best evaluation so far
  # in <workdir>/best_<metric>/ (run/best.py); "" = off, as the paper (it averages the last ones)
  c.keep_best = ""
  # > 0: stop once keep_best's metric has gone this many evaluations in a row without a new best
  # (that step saved, the run then finished; run/early_stopping.py); 0 = off, as the paper.
  c.early_stopping_patience = 0
  # > 0: early stopping counts an evaluation as a new best only when it beats the count's best
  # by more than this, in the metric's units (BLEU points, nats of eval_loss); 0 = any gain
  c.early_stopping_min_delta = 0.0

  c.checkpoint_every_steps = 500  # also saved at the end and on SIGTERM/SIGINT
  c.keep_checkpoints = 3          # the last N
  c.keep_every_steps = 0          # additionally keep every K-th step for good; 0 = off
  c.async_checkpointing = True
  # Start from another run's parameters (a workdir or a checkpoints/<step> directory) when the
  # workdir holds no checkpoint yet; a workdir with checkpoints always resumes instead.
  c.init_from = ""

  # Multi-host: "auto" calls jax.distributed.initialize() when coordinator_address is set or a
  # cluster shows in the environment (SLURM, TPU_WORKER_HOSTNAMES, JAX_COORDINATOR_ADDRESS);
  # "on" always calls it (Cloud TPU VM pods, found through the metadata server); "off" never.
  c.distributed = "auto"
  c.coordinator_address = ""      # host:port of process 0, for explicit multi-process runs
  c.coordinator_bind_address = "" # e.g. 127.0.0.1:PORT in tests; empty = JAX's default
  c.num_processes = 0             # with coordinator_address
  c.process_id = -1
  return c


def field_values(config, prefix: str = ""):
  """(dotted name, value) of every field of a ConfigDict, nested ones by their path."""
  for key, value in config.items():
    if hasattr(value, "items") and not isinstance(value, dict):  # a nested ConfigDict
      yield from field_values(value, f"{prefix}{key}.")
    else:
      yield f"{prefix}{key}", value


def unset_by_none(name: str) -> bool:
  """Whether the field `name` (dotted) takes None from a command line: its default
  (`base_config`) is None, a path left unset. Config flags parse `--config.F=None` as the
  string "None" (and `--config.F=` as ""); transformer_jax/cli.py reads both as None for these
  fields only, and a sweep point's None becomes that flag for them only (sweeps/spec.py)."""
  defaults = dict(field_values(base_config()))
  return name in defaults and defaults[name] is None


def field_names(c: ml_collections.ConfigDict) -> list[str]:
  """The dotted name of every field of a ConfigDict (`field_values`)."""
  return [name for name, _ in field_values(c)]


def unknown_fields(c: ml_collections.ConfigDict) -> list[str]:
  """Fields of `c` that no run has (`base_config`'s), e.g. a config file's misspelt
  `c.num_train_step = 2`: nothing reads them, so the run would train with the default of the
  field meant. The mesh's axes have a check of their own (a mesh may name only some)."""
  known = set(field_names(base_config()))
  return sorted(n for n in field_names(c) if n not in known and not n.startswith("mesh."))


def _unknown_fields_problem(names: list[str], source: str | None) -> str:
  """One line naming each unknown field, the closest real one, and where it was set."""
  known = list(field_names(base_config()))
  listed = []
  for name in names:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    listed.append(f"config.{name}" + (f" (did you mean config.{close[0]}?)" if close else ""))
  what, it = ("no such field", "it") if len(names) == 1 else ("no such fields", "them")
  where = f"set in {source}" if source else "set by the config"
  return (f"{', '.join(listed)}: {what}, {where}; a run would ignore {it} and train with the "
          f"default of the field meant: correct the {'name' if it == 'it' else 'names'} there "
          "(--help with --config lists the fields)")


def validate(c: ml_collections.ConfigDict, source: str | None = None) -> None:
  """Raise ValueError naming the field and what is allowed. `source`: the config file, named
  where the config has fields no run has (`unknown_fields`)."""
  def bad(field, value, allowed):
    raise ValueError(f"config.{field}={value!r}: {allowed}")

  unknown = unknown_fields(c)
  if unknown:
    raise ValueError(_unknown_fields_problem(unknown, source))
  if c.schedule not in SCHEDULES:
    bad("schedule", c.schedule, f"expected one of {SCHEDULES}")
  for field in ("num_train_steps", "log_every_steps", "eval_every_steps", "bleu_every_steps",
                "checkpoint_every_steps", "keep_checkpoints", "grad_accum_steps",
                "bleu_num_sentences"):
    if c[field] < 1:
      bad(field, c[field], "must be >= 1")
  for field in ("learning_rate", "adam_eps"):
    if not (math.isfinite(c[field]) and c[field] > 0):  # inf: no update comes out finite
      bad(field, c[field], "must be > 0 (and finite)")
  if c.schedule == "rsqrt" and c.warmup_steps < 1:
    bad("warmup_steps", c.warmup_steps, "must be >= 1 with schedule='rsqrt'")
  if c.warmup_steps < 0:
    bad("warmup_steps", c.warmup_steps, "must be >= 0")
  _check_warmup_ends(c)
  for field in ("adam_b1", "adam_b2", "label_smoothing"):
    if not 0 <= c[field] < 1:
      bad(field, c[field], "must be in [0, 1)")
  if c.cpu_peak_matmul_size < 16:
    bad("cpu_peak_matmul_size", c.cpu_peak_matmul_size, "must be >= 16 (2048 measures the peak)")
  if c.beam_size < 1:
    bad("beam_size", c.beam_size, "must be >= 1")
  if c.max_len_margin < 0:
    bad("max_len_margin", c.max_len_margin, "must be >= 0")
  unknown_axes = sorted(set(c.mesh.keys()) - set(MESH_AXES))
  if unknown_axes:  # a ShardingError, as the mesh's other problems (sharding.py) are
    raise ShardingError(f"config.mesh={dict(c.mesh)!r}: unknown axes {unknown_axes}; expected "
                        f"among {MESH_AXES}")
  problem = rules_problem(c.logical_axis_rules)
  if problem:
    raise ValueError(f"config.logical_axis_rules: {problem}")
  if c.distributed not in ("auto", "on", "off"):
    bad("distributed", c.distributed, "expected 'auto', 'on' or 'off'")
  _check_launch_fields(c)
  if c.coordinator_address and c.distributed != "off":
    # An explicit coordinator needs each process's place (JAX names no config field).
    if c.num_processes < 1:
      bad("num_processes", c.num_processes, "must be >= 1 with coordinator_address (the "
          "processes in the run, the same on each)")
    if not 0 <= c.process_id < c.num_processes:
      bad("process_id", c.process_id, f"must be in [0, num_processes={c.num_processes}) with "
          "coordinator_address (this process's index, 0 on the coordinator's host)")
  for field in ("weight_decay", "grad_clip_norm"):
    if not (math.isfinite(c[field]) and c[field] >= 0):
      bad(field, c[field], "must be >= 0 and finite (0 turns it off)")
  if not math.isfinite(c.length_penalty_alpha):  # < 0 is a choice: search.py handles it
    bad("length_penalty_alpha", c.length_penalty_alpha, "must be a finite number (0: no "
        "length penalty; the paper: 0.6)")
  if c.keep_every_steps < 0:
    bad("keep_every_steps", c.keep_every_steps, "must be >= 0 (0 turns it off)")
  if c.keep_best and c.keep_best not in BEST_METRICS:
    bad("keep_best", c.keep_best, f"expected '' (off) or one of {sorted(BEST_METRICS)}")
  if c.early_stopping_patience < 0:
    bad("early_stopping_patience", c.early_stopping_patience, "must be >= 0 (0 turns it off)")
  if not (math.isfinite(c.early_stopping_min_delta) and c.early_stopping_min_delta >= 0):
    bad("early_stopping_min_delta", c.early_stopping_min_delta,
        "must be a finite number >= 0, in the metric's units (BLEU points, nats of eval_loss; "
        "0: any improvement counts)")
  if c.early_stopping_min_delta and not c.early_stopping_patience:
    bad("early_stopping_min_delta", c.early_stopping_min_delta,
        "has no effect without config.early_stopping_patience: add "
        "--config.early_stopping_patience=P, or leave early_stopping_min_delta at 0")
  if c.early_stopping_patience and not c.keep_best:
    bad("early_stopping_patience", c.early_stopping_patience,
        "needs config.keep_best, the metric it waits on a new best of (and where the best "
        f"parameters are kept): add --config.keep_best=bleu, or one of {sorted(BEST_METRICS)}")
  split = {axis: size for axis, size in c.mesh.items() if axis != "data" and size != 1}
  if c.flatten_optimizer and split:
    bad("flatten_optimizer", c.flatten_optimizer,
        f"needs a data-parallel mesh, but config.mesh splits {split}: a flat optimizer state "
        "would be whole on every device (set flatten_optimizer=False, or the other mesh axes to 1)")
  if c.weight_decay_mask not in WEIGHT_DECAY_MASKS:
    bad("weight_decay_mask", c.weight_decay_mask, f"expected one of {WEIGHT_DECAY_MASKS}")
  if not 1 <= c.average_last_checkpoints <= c.keep_checkpoints:
    # Found out only after training otherwise, with the checkpoints it needed deleted.
    bad("average_last_checkpoints", c.average_last_checkpoints,
        f"must be in [1, keep_checkpoints={c.keep_checkpoints}]: the checkpoints to average "
        "must still be there when training ends (raise config.keep_checkpoints)")
  data_config.validate(c.data)
  # The model fields, checked now rather than after the data and the tokenizer are built (the
  # vocabulary size is the tokenizer's; any positive size checks the rest).
  try:
    model = transformer_config(c, max(c.data.vocab_size, 1))
  except ValueError as e:  # TransformerConfig names its own fields: here they are config's
    raise ValueError(str(e).replace("TransformerConfig.", "config.model.")) from None
  longest = max(c.data.max_source_len, c.data.max_target_len)
  if model.max_len < longest:
    bad("model.max_len", model.max_len, f"must be >= data.max_source_len / max_target_len "
        f"({longest}): rows that long need that many positions")
  rows = data_config.global_rows(c.data)
  if rows % c.grad_accum_steps:
    bad("grad_accum_steps", c.grad_accum_steps,
        f"must divide the {rows} rows of a global batch (data.batch_size, or data.batch_tokens "
        "// the longest row)")
  if c.data.batching == "bucket" and c.data.bucket_rows_multiple % c.grad_accum_steps:
    bad("grad_accum_steps", c.grad_accum_steps,
        f"must divide data.bucket_rows_multiple={c.data.bucket_rows_multiple}, the multiple "
        "every bucket's row count is rounded to")


def _check_warmup_ends(c: ml_collections.ConfigDict) -> None:
  """The schedules whose learning_rate is a peak reached after the warm-up must reach it: a run
  that ends inside a linear warm-up never trains at the rate it names. ("rsqrt" may: its
  learning_rate is a multiplier, and short runs of the paper's schedule still rise.)"""
  if c.schedule in ("constant", "cosine") and c.warmup_steps >= c.num_train_steps:
    after = ("the decay runs over the steps after the warm-up" if c.schedule == "cosine" else
             "the warm-up rises linearly to learning_rate, which a run that ends inside it never "
             "reaches")
    raise ValueError(f"config.warmup_steps={c.warmup_steps}: must be < num_train_steps="
                     f"{c.num_train_steps} with schedule={c.schedule!r} ({after}): lower "
                     "warmup_steps or raise num_train_steps")


def _check_launch_fields(c: ml_collections.ConfigDict) -> None:
  """num_processes and process_id are read only with coordinator_address
  (`run.distributed.initialize`): without it JAX finds each process's place itself (SLURM, a
  TPU pod) or there is one process, and values set would be ignored without a word."""
  if c.coordinator_address:
    return
  for field, default in (("num_processes", 0), ("process_id", -1)):
    if c[field] != default:
      raise ValueError(
          f"config.{field}={c[field]!r}: is used only with config.coordinator_address (host:port "
          f"of process 0): add --config.coordinator_address=HOST:PORT, or leave {field} at "
          f"{default} (a cluster JAX detects, SLURM or a TPU pod, places each process itself)")


def transformer_config(c: ml_collections.ConfigDict, vocab_size: int, pad_id: int = 0,
                       bos_id: int = 2, eos_id: int = 3) -> TransformerConfig:
  """The model config of a run; `TransformerConfig` validates the model fields itself."""
  fields = dict(c.model)
  if "dropout_rate" in fields and fields["dropout_rate"] is None:
    fields.pop("dropout_rate")
  return TransformerConfig(vocab_size=vocab_size, pad_id=pad_id, bos_id=bos_id, eos_id=eos_id,
                           **fields)
