"""Training with a faster numeric setting against float32: two loss curves over the same batches.

`run(config, PrecisionOptions(...)) -> dict` trains the config's model `steps` steps twice, from
the same initial parameters, with the same dropout masks and the same batches: once as the config
says (the reference: float32 unless the config says otherwise), once with `variant`'s overrides
(by default bfloat16 compute). It reports both loss curves (the smoothed loss per target token of
each step), how far apart they are, and how far apart the parameters ended.

What it shows that `accelerator.check_model` (one forward and backward pass) cannot: whether the
rounding compounds over many updates. The pass rule: every loss finite, and the mean loss of the
last tenth of the steps within `tolerance` (relative) of the reference's. The curves are noisy
step to step, so single steps are reported, not judged.

Batches: the configured dataset's first `steps` training batches, or those saved earlier with
`save_batches` (an `.npz` with the tokenizer's ids), which needs neither tensorflow-datasets nor
grain: a GPU machine without the data stack can run the curve on real batches carried over.
"""
from __future__ import annotations

import contextlib
import dataclasses
import time
import zipfile

import jax
import numpy as np

from transformer_jax import batch as batch_lib
from transformer_jax import sharding
from transformer_jax.bench.accelerator import tree_rel_err
from transformer_jax.data.config import train_batch_shapes
from transformer_jax.experiment import transformer_config
from transformer_jax.files import save_figure
from transformer_jax.steps import TrainSetup
from transformer_jax.sweeps.spec import validated_configs

TOKENIZER_IDS = ("vocab_size", "pad_id", "bos_id", "eos_id")


class BatchesFileError(ValueError):
  """A batches file that is not one, or holds too few batches."""


@dataclasses.dataclass(frozen=True)
class PrecisionOptions:
  steps: int = 200                   # train steps of each curve, one batch each
  variant: tuple = (("model.dtype", "bfloat16"),)   # (field, value) overrides of the variant
  tolerance: float = 0.02            # relative difference of the last tenth's mean loss
  workdir: str | None = None         # the dataset's tokenizer (real batches)
  batches_file: str | None = None    # read the batches from this .npz instead of the dataset
  save_batches: str | None = None    # write the batches read to this .npz

  def __post_init__(self):
    if self.steps < 1:
      raise ValueError(f"steps={self.steps}: must be >= 1")
    if not self.tolerance > 0:
      raise ValueError(f"tolerance={self.tolerance}: must be > 0")
    if self.batches_file and self.save_batches:
      raise ValueError("batches_file and save_batches: read the batches or save them, not both")


def dataset_batches(config, workdir: str, count: int) -> tuple[list[dict], dict]:
  """The first `count` training batches of the configured dataset and the tokenizer's ids."""
  from transformer_jax.bench.train import real_batches  # the data stack, only when asked for
  batches, tok = real_batches(config, workdir, count)
  return batches, {k: int(getattr(tok, k)) for k in TOKENIZER_IDS}


def save(path: str, batches: list[dict], ids: dict) -> None:
  arrays = {f"{i}/{k}": v for i, b in enumerate(batches) for k, v in b.items()}
  np.savez_compressed(path, **arrays, **{f"tokenizer/{k}": v for k, v in ids.items()})


def load(path: str, count: int, config=None) -> tuple[list[dict], dict]:
  """Batches saved by `save`; a BatchesFileError naming the file if it is not such a file, holds
  fewer than `count` batches, or (with `config`) holds batches of a shape the config's
  training batches never have (`data.config.train_batch_shapes`: with "pack" and "pad", rows of
  `max_source_len` / `max_target_len` tokens; with "bucket", one shape per bucket), or packed
  rows where the config's batching gives one pair per row ("pad", "bucket")."""
  try:
    with np.load(path) as f:
      arrays = {name: f[name] for name in f.keys()}
  except (OSError, EOFError, ValueError, zipfile.BadZipFile, AttributeError) as e:
    raise BatchesFileError(f"{path}: not a batches file of compare_precision.py ({e}); write "
                           "one with --save_batches") from None
  missing = [k for k in TOKENIZER_IDS if f"tokenizer/{k}" not in arrays]
  if missing:
    raise BatchesFileError(f"{path}: not a batches file of compare_precision.py (no "
                           f"tokenizer {', '.join(missing)}); write one with --save_batches")
  ids = {k: int(arrays.pop(f"tokenizer/{k}")) for k in TOKENIZER_IDS}
  strange = [n for n in arrays if not n.split("/")[0].isdigit() or "/" not in n]
  if strange:
    raise BatchesFileError(f"{path}: not a batches file of compare_precision.py (arrays "
                           f"{strange[:3]} are not <batch>/<key>); write one with --save_batches")
  held = len({n.split("/")[0] for n in arrays})
  if held < count:
    raise BatchesFileError(f"{path} holds {held} batches; {count} steps need {count}: save "
                           f"more with --save_batches and --steps, or pass --steps <= {held}")
  batches = [{} for _ in range(count)]
  for name, array in arrays.items():
    i, key = name.split("/", 1)
    if int(i) < count:
      batches[int(i)][key] = array
  if config is not None:
    shapes = train_batch_shapes(config.data)
    for i, batch in enumerate(batches):
      packing = [k for k in batch_lib.PACKING if k in batch]
      if packing and not batch_lib.packs(config.data.batching):
        # The model would take the rows as packed: a "bucket" curve of packed batches.
        raise BatchesFileError(
            f"{path} holds packed rows (batch {i} has {', '.join(packing)}), the config's "
            f"data.batching={config.data.batching!r} gives one pair per row: save them again "
            "with this config, or pass the config they were saved with")
      have = {k: tuple(batch[k].shape) for k in shapes[0] if k in batch}
      if have not in shapes:
        want = (f"are {shapes[0]}" if len(shapes) == 1 else
                f"are one of the {config.data.batching!r} batching's {len(shapes)}: {shapes}")
        raise BatchesFileError(
            f"{path} holds batches of {have} (batch {i}), the config's {want} (data.batching, "
            "data.batch_size or data.batch_tokens, max_source_len, max_target_len, and the "
            "bucket fields): save them again with this config, or pass the config they were "
            "saved with")
  return batches, ids


def _curve(config, model_cfg, host_batches) -> tuple[list[float], object, float]:
  """Per-step smoothed loss per target token, the final parameters, seconds."""
  setup = TrainSetup(config, model_cfg)
  losses = []
  start = time.perf_counter()
  with setup.context():
    state = setup.init_state(jax.random.key(config.seed))
    for b in host_batches:
      state, metrics = setup.train_step(state, sharding.global_batch(b, setup.batch_sharding))
      losses.append(float(metrics["loss"] / metrics["tokens"]))
  return losses, jax.device_get(state.params), time.perf_counter() - start


def curve_figures(reference, variant) -> dict:
  """How far apart two loss curves (per step) are: the mean of each one's last tenth of the
  steps (at least one step) and their difference, the largest and the median single step's,
  all relative to the reference."""
  ref, var = np.array(reference, np.float64), np.array(variant, np.float64)
  tail = max(1, len(ref) // 10)
  tail_ref, tail_var = float(ref[-tail:].mean()), float(var[-tail:].mean())
  rel = np.abs(var - ref) / np.abs(ref)
  return {"steps": len(ref), "tail_steps": tail, "reference_tail_loss": tail_ref,
          "variant_tail_loss": tail_var, "tail_rel_diff": abs(tail_var - tail_ref) / abs(tail_ref),
          "max_step_rel_diff": float(rel.max()), "median_step_rel_diff": float(np.median(rel))}


def curves_pass(reference, variant, tolerance: float) -> bool:
  """The rule: every loss of both curves finite, and the last tenth's mean losses within
  `tolerance` of each other, relative to the reference's (single steps are too noisy to
  judge)."""
  finite = bool(np.isfinite(reference).all() and np.isfinite(variant).all())
  return finite and curve_figures(reference, variant)["tail_rel_diff"] < tolerance


def run(config, options: PrecisionOptions = PrecisionOptions(), log=print) -> dict:
  """Both curves and their comparison (see the module docstring)."""
  variant = dict(options.variant)
  (variant_config,) = validated_configs(config, [variant], label="variant", first=1)
  if options.batches_file:
    host_batches, ids = load(options.batches_file, options.steps, config)
  else:
    from transformer_jax.bench.common import default_workdir
    host_batches, ids = dataset_batches(config, options.workdir or default_workdir(),
                                        options.steps)
    if options.save_batches:
      save(options.save_batches, host_batches, ids)
      log(f"saved {len(host_batches)} batches to {options.save_batches}")
  curves, params, seconds = {}, {}, {}
  for name, c in (("reference", config), ("variant", variant_config)):
    model_cfg = transformer_config(c, ids["vocab_size"], ids["pad_id"], ids["bos_id"],
                                   ids["eos_id"])
    # Float32 matmuls at full precision: by default GPUs run them in TF32 (a 10-bit
    # mantissa), and a float32 reference would be one for nothing.
    highest = model_cfg.dtype == "float32"
    log(f"{name}: {model_cfg.dtype} compute{' (matmuls at highest precision)' * highest}, "
        f"{model_cfg.attention_impl} attention, {options.steps} steps")
    with jax.default_matmul_precision("highest") if highest else contextlib.nullcontext():
      curves[name], params[name], seconds[name] = _curve(c, model_cfg, host_batches)
  figures = {
      **curve_figures(curves["reference"], curves["variant"]),
      "params_rel_diff": tree_rel_err(params["variant"], params["reference"]),
      "reference_seconds": round(seconds["reference"], 2),
      "variant_seconds": round(seconds["variant"], 2),
  }
  passed = curves_pass(curves["reference"], curves["variant"], options.tolerance)
  _print(curves, figures, options, passed, log)
  return {"what": "compare_precision", "variant": variant, "tolerance": options.tolerance,
          "batches": options.batches_file or "dataset", "device_kind": jax.devices()[0].device_kind,
          "jax_version": jax.__version__, "passed": passed, "figures": figures,
          "curves": {k: [round(x, 6) for x in v] for k, v in curves.items()}}


def plot(result: dict, path: str) -> str:
  """Both loss curves and their relative difference per step (PNG), from `run`'s result."""
  save_figure(figure(result), path, dpi=100)
  return path


def figure(result: dict):
  """`plot`'s figure: the curves (left), their relative difference per step and the tolerance
  (right, log scale)."""
  from matplotlib.figure import Figure  # only when a plot is asked for
  ref, var = (np.array(result["curves"][k]) for k in ("reference", "variant"))
  steps = np.arange(1, len(ref) + 1)
  fig = Figure(figsize=(9, 3.2))
  loss_ax, diff_ax = fig.subplots(1, 2)
  variant = ", ".join(f"{k}={v}" for k, v in result["variant"].items())
  loss_ax.plot(steps, ref, label="reference")
  loss_ax.plot(steps, var, label=variant, alpha=0.8)
  loss_ax.set_xlabel("step")
  loss_ax.set_ylabel("loss per target token")
  loss_ax.legend(fontsize=7)
  diff_ax.plot(steps, np.abs(var - ref) / np.abs(ref))
  diff_ax.axhline(result["tolerance"], color="grey", ls="--", lw=0.8)
  diff_ax.set_yscale("log")
  diff_ax.set_xlabel("step")
  diff_ax.set_ylabel("relative difference")
  for ax in (loss_ax, diff_ax):
    ax.grid(alpha=0.3)
  fig.tight_layout()
  return fig


def _print(curves, figures, options, passed, log) -> None:
  ref, var = curves["reference"], curves["variant"]
  shown = sorted({0, len(ref) - 1, *range(0, len(ref), max(1, len(ref) // 10))})
  log(f"{'step':>6} {'reference':>10} {'variant':>10} {'rel diff':>9}")
  for i in shown:
    log(f"{i + 1:>6} {ref[i]:>10.4f} {var[i]:>10.4f} {abs(var[i] - ref[i]) / abs(ref[i]):>9.2e}")
  f = figures
  log(f"last {f['tail_steps']} steps' mean loss: reference {f['reference_tail_loss']:.4f}, "
      f"variant {f['variant_tail_loss']:.4f}, relative difference {f['tail_rel_diff']:.2e} "
      f"(tolerance {options.tolerance:g}); largest single step {f['max_step_rel_diff']:.2e}, "
      f"parameters apart {f['params_rel_diff']:.2e}")
  log("PASS" if passed else "FAIL")
