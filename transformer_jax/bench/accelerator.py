"""Correctness of the fast paths (cuDNN attention, bfloat16 compute) against float32 references.

Two groups of checks, each on fresh random inputs:

1. The attention kernel (`layers.fused_attention`, `attention_impl="cudnn"`) in bfloat16 against
   `attention.scaled_dot_product_attention` computed in float32 on the same (upcast) inputs, at
   `highest` matmul precision: the output and the gradients with respect to Q, K and V, for
   eleven masks (`attention_cases`: eight dense ones, three given as lengths, `LengthMask`).
   The XLA path in bfloat16 is measured alongside, so the cuDNN error can be read against what
   bfloat16 itself costs.
2. The whole model, dropout off: logits, loss and the parameter gradient of the bfloat16 model
   against the float32 model, on a packed batch (XLA attention, then cuDNN) and on right-padded
   unpacked rows (cuDNN, the padding given as lengths).

Errors are relative, ||out - ref|| / ||ref||. A check passes below `tolerance` (bfloat16 operands
land between 1e-3 and 1e-2) and when nothing is NaN. With `require_cudnn` (on a GPU) the compiled
attention must contain cuDNN's fused kernel (a `__cudnn$fmha` custom call), else the check
fails: a silent fallback to XLA would make the comparison vacuous.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax import batch as batch_lib
from transformer_jax import layers, losses
from transformer_jax.attention import (
  LengthMask,
  causal_mask,
  combine_masks,
  padding_mask,
  scaled_dot_product_attention,
  segment_mask,
)
from transformer_jax.bench import common
from transformer_jax.config import model_config
from transformer_jax.model import Transformer

CUDNN_KERNEL = "__cudnn$fmha"
# Logits pass through every layer and the gradient through all of them twice: bfloat16's 8-bit
# mantissa compounds, so the whole model's logits get 5x and its gradient 10x the kernel tolerance.
LOGITS_FACTOR, GRAD_FACTOR = 5, 10
# Sentences packed into each row of the packed checks, and so the shortest length they run at:
# a row of n sentences needs n - 1 cuts between positions 1..length - 1, plus its end.
PACKED_SENTENCES = 6
MIN_LENGTH = PACKED_SENTENCES + 1
HEADER = (f"{'check':<42} {'cuDNN':>5} {'output err':>11} {'grad err':>10} "
          f"{'XLA bf16 out/grad':>20}  ok")


def rel_err(out, ref) -> float:
  out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
  if not np.all(np.isfinite(out)):
    return float("nan")
  return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))


def tree_rel_err(out, ref) -> float:
  outs, refs = jax.tree.leaves(out), jax.tree.leaves(ref)
  if not all(np.all(np.isfinite(np.asarray(o, np.float32))) for o in outs):
    return float("nan")
  num = sum(float(np.sum((np.asarray(o, np.float64) - np.asarray(r, np.float64)) ** 2))
            for o, r in zip(outs, refs))
  den = sum(float(np.sum(np.asarray(r, np.float64) ** 2)) for r in refs)
  return float(np.sqrt(num / max(den, 1e-30)))


def packed_segments(rng, rows: int, length: int, max_segments: int = PACKED_SENTENCES):
  """Segment ids `[rows, length]` (`length` > `max_segments`): 1..max_segments for as many
  random-length sentences in every row, every other row then padded (0)."""
  out = np.zeros((rows, length), np.int32)
  for r in range(rows):
    cuts = np.sort(rng.choice(np.arange(1, length), size=max_segments, replace=False))
    used = cuts[-1] if r % 2 else length  # every other row ends in padding
    start = 0
    for s, end in enumerate(list(cuts[:-1]) + [used], start=1):
      out[r, start:end] = s
      start = end
  return out


def positions_of(segments):
  """Positions that restart at 0 in every segment (0 on padding)."""
  pos = np.zeros_like(segments)
  for r in range(segments.shape[0]):
    for c in range(1, segments.shape[1]):
      pos[r, c] = pos[r, c - 1] + 1 if segments[r, c] == segments[r, c - 1] else 0
  return np.where(segments > 0, pos, 0)


def line(r: dict) -> str:
  """One check's row under `HEADER`."""
  out = r.get("output_err", r.get("logits_err"))
  xla = (f"{r['xla_bf16_output_err']:.2e}/{r['xla_bf16_grad_err']:.2e}"
         if "xla_bf16_output_err" in r else f"loss {r['loss']:.5f} vs {r['reference_loss']:.5f}")
  return (f"{r['check']:<42} {str(r['cudnn_kernel']):>5} {out:>11.2e} {r['grad_err']:>10.2e} "
          f"{xla:>20}  {'PASS' if r['passed'] else 'FAIL'}")


def attention_passed(row: dict, tolerance: float, require_cudnn: bool) -> bool:
  """A kernel check's rule: output and gradient errors finite and below `tolerance`, the queries
  that may attend nowhere exact zeros, and cuDNN's kernel compiled in where it is required."""
  errors = (row["output_err"], row["grad_err"])
  return bool(all(np.isfinite(e) and e < tolerance for e in errors) and row["dead_rows_zero"]
              and (row["cudnn_kernel"] or not require_cudnn))


def model_passed(row: dict, tolerance: float, needs_kernel: bool) -> bool:
  """A whole-model check's rule: a finite loss within `tolerance` (relative) of float32's, logits
  within LOGITS_FACTOR and the gradient within GRAD_FACTOR times it, and cuDNN's kernel
  compiled in where it is required."""
  return bool(np.isfinite(row["loss"]) and row["loss_rel_diff"] < tolerance
              and row["logits_err"] < LOGITS_FACTOR * tolerance
              and row["grad_err"] < GRAD_FACTOR * tolerance
              and (row["cudnn_kernel"] or not needs_kernel))


def dead_rows_zero(out, mask) -> bool:
  """Whether the queries that may attend nowhere under `mask` (`[batch or 1, 1, q, kv]`, None:
  every query attends) come out of the attention `out` `[batch, q, heads, depth]` as exact
  zeros, as padding's must."""
  if mask is None:
    return True
  dead = np.broadcast_to(~np.asarray(jnp.any(mask, axis=(1, -1))), out.shape[:2])  # no key
  return bool(np.all(np.asarray(out, np.float32)[dead] == 0))


# ------------------------------------------------------------------------- attention kernel


def attention_cases(rng, batch: int, q_len: int, kv_len: int):
  """(name, q_len, kv_len, mask): the mask a boolean `[batch or 1, 1, q, kv]`, a LengthMask or
  None. In order: no mask, padding,
  causal + padding, packed self-attention (causal + segments), packed cross-attention (segments,
  query and key lengths differ), cross-attention with no mask and with padding (lengths differ),
  packed cross-attention with equal lengths; then padding, causal + padding and cross-attention
  padding (one row without keys) as lengths."""
  lengths = rng.integers(q_len // 4, q_len + 1, batch)
  kv_lengths = rng.integers(kv_len // 4, kv_len + 1, batch)
  kv_lengths[0] = 0
  valid = np.arange(q_len)[None] < lengths[:, None]
  # Cross-attention between packed rows: query sentence s attends to source sentence s (every
  # row holds packed_segments' 6 sentences on either side).
  seg_q = packed_segments(rng, batch, q_len)
  seg_kv = packed_segments(rng, batch, kv_len)
  valid, seg_q, seg_kv = jnp.asarray(valid), jnp.asarray(seg_q), jnp.asarray(seg_kv)
  causal = causal_mask(q_len)
  return [
      ("no mask", q_len, q_len, None),
      ("padding", q_len, q_len, padding_mask(valid, valid)),
      ("causal + padding", q_len, q_len, combine_masks(causal, padding_mask(valid, valid))),
      ("packed self (causal)", q_len, q_len, combine_masks(causal, segment_mask(seg_q, seg_q))),
      ("packed cross", q_len, kv_len, segment_mask(seg_q, seg_kv)),
      ("cross, no mask", q_len, kv_len, None),
      ("cross, padding", q_len, kv_len, padding_mask(valid, jnp.ones((batch, kv_len), bool))),
      ("packed cross, equal lengths", q_len, q_len, segment_mask(seg_q, seg_kv[:, :q_len])),
      ("padding as lengths", q_len, q_len, LengthMask(jnp.asarray(lengths, jnp.int32),
                                                      jnp.asarray(lengths, jnp.int32))),
      ("causal + padding as lengths", q_len, q_len,
       LengthMask(jnp.asarray(lengths, jnp.int32), jnp.asarray(lengths, jnp.int32), causal=True)),
      ("cross, padding as lengths", q_len, kv_len,
       LengthMask(jnp.asarray(lengths, jnp.int32), jnp.asarray(kv_lengths, jnp.int32))),
  ]


def _reference(q, k, v, mask):
  # [batch, length, heads, depth] -> head-batched, in float32 at full matmul precision.
  with jax.default_matmul_precision("highest"):
    out, _ = scaled_dot_product_attention(
        *(x.astype(jnp.float32).swapaxes(1, 2) for x in (q, k, v)), mask=mask)
  return out.swapaxes(1, 2)


def _xla(q, k, v, mask):
  out, _ = scaled_dot_product_attention(*(x.swapaxes(1, 2) for x in (q, k, v)), mask=mask)
  return out.swapaxes(1, 2)


def _value_and_grads(fn, mask, cot, qkv, dtype):
  """(output, gradients w.r.t. q, k, v, compiled HLO text) of `fn` on `qkv` cast to `dtype`."""
  def out_and_grads(q, k, v):
    out, vjp = jax.vjp(lambda q, k, v: fn(q, k, v, mask).astype(jnp.float32), q, k, v)
    return out, vjp(cot)

  args = tuple(x.astype(dtype) for x in qkv)
  compiled = jax.jit(out_and_grads).lower(*args).compile()  # one compile: output and VJP
  out, grads = compiled(*args)
  return out, grads, compiled.as_text()


def check_attention(cfg, rng, batch: int, q_len: int, kv_len: int, tolerance: float,
                    require_cudnn: bool) -> list[dict]:
  """One row per mask of `attention_cases` (printed as it comes)."""
  heads, depth = cfg.num_heads, cfg.head_dim

  def fused(q, k, v, mask):
    return layers.fused_attention(cfg, q, k, v, mask)

  results = []
  for name, tq, tk, mask in attention_cases(rng, batch, q_len, kv_len):
    keys = jax.random.split(jax.random.key(int(rng.integers(1 << 30))), 4)
    q = jax.random.normal(keys[0], (batch, tq, heads, depth), jnp.float32)
    k = jax.random.normal(keys[1], (batch, tk, heads, depth), jnp.float32)
    v = jax.random.normal(keys[2], (batch, tk, heads, depth), jnp.float32)
    cot = jax.random.normal(keys[3], (batch, tq, heads, depth), jnp.float32)
    qkv = tuple(x.astype(jnp.bfloat16) for x in (q, k, v))
    row = {"check": f"attention: {name}", "shape": [batch, tq, tk, heads, depth]}
    # The fused path takes a LengthMask as it is; the references its dense mask.
    fused_mask = mask
    if isinstance(mask, LengthMask):
      mask = mask.dense(tq, tk)
    ref_out, ref_grads, _ = _value_and_grads(_reference, mask, cot, qkv, jnp.float32)
    xla_out, xla_grads, _ = _value_and_grads(_xla, mask, cot, qkv, jnp.bfloat16)
    out, grads, hlo = _value_and_grads(fused, fused_mask, cot, qkv, jnp.bfloat16)
    row["cudnn_kernel"] = CUDNN_KERNEL in hlo
    row["output_err"] = rel_err(out, ref_out)
    row["grad_err"] = max(rel_err(g, r) for g, r in zip(grads, ref_grads))
    row["xla_bf16_output_err"] = rel_err(xla_out, ref_out)
    row["xla_bf16_grad_err"] = max(rel_err(g, r) for g, r in zip(xla_grads, ref_grads))
    row["dead_rows_zero"] = dead_rows_zero(out, mask)
    row["passed"] = attention_passed(row, tolerance, require_cudnn)
    results.append(row)
    print(line(row), flush=True)
  return results


# ------------------------------------------------------------------------------ whole model


def packed_batch(rng, rows: int, length: int, vocab: int) -> dict:
  """A packed batch of the batch schema: random tokens in random segments, source sentence s
  paired with target sentence s (packed_segments puts 6 sentences in every row)."""
  seg_in, seg_tgt = packed_segments(rng, rows, length), packed_segments(rng, rows, length)

  def tokens(seg):
    return np.where(seg > 0, common.random_tokens(rng, vocab, seg.shape), 0).astype(np.int32)

  out = {"inputs": tokens(seg_in), "targets": tokens(seg_tgt),
         "inputs_positions": positions_of(seg_in), "targets_positions": positions_of(seg_tgt),
         "inputs_segmentation": seg_in, "targets_segmentation": seg_tgt}
  return batch_lib.model_arrays(out)


def padded_batch(rng, rows: int, length: int, vocab: int) -> dict:
  """Unpacked rows of the batch schema: random tokens, each row right-padded after a random
  length (a quarter of the row to all of it)."""
  def tokens():
    lengths = rng.integers(length // 4, length + 1, rows)
    real = np.arange(length) < lengths[:, None]
    return np.where(real, common.random_tokens(rng, vocab, (rows, length)), 0).astype(np.int32)

  return batch_lib.model_arrays({"inputs": tokens(), "targets": tokens()})


def check_model(size: str, rng, rows: int, length: int, vocab: int, tolerance: float,
                require_cudnn: bool) -> list[dict]:
  """Rows for the bfloat16 model on a packed batch with XLA and with cuDNN attention, and on
  padded rows with cuDNN taking the padding as lengths (printed as they come)."""
  base = model_config(size, vocab_size=vocab, max_len=length, deterministic=True,
                      attention_dropout_rate=0.0)
  batches = [("", packed_batch(rng, rows, length, vocab),
              (("bfloat16, XLA attention", "xla"), ("bfloat16, cuDNN attention", "cudnn"))),
             (" (padded)", padded_batch(rng, rows, length, vocab),
              (("bf16, cuDNN, lengths", "cudnn"),))]
  params = jax.jit(Transformer(base).init)(jax.random.key(int(rng.integers(1 << 30))),
                                           jnp.ones((1, 8), jnp.int32), jnp.ones((1, 8), jnp.int32)
                                           )["params"]
  results = []
  for kind, batch, variants in batches:
    batch = {k: jnp.asarray(v) for k, v in batch.items()}
    weights = (batch["targets"] != base.pad_id).astype(jnp.float32)

    def run(cfg, batch=batch, weights=weights):
      model = Transformer(cfg)

      def loss_fn(p):
        logits = model.apply({"params": p}, **batch)
        sums = losses.loss_sums(logits, batch["targets"], weights, 0.1)
        return sums["loss"] / sums["tokens"], logits

      fn = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))
      compiled = fn.lower(params).compile()
      (loss, logits), grads = compiled(params)
      return float(loss), np.asarray(logits, np.float32), grads, compiled.as_text()

    with jax.default_matmul_precision("highest"):
      ref_loss, ref_logits, ref_grads, _ = run(base)
    valid = np.asarray(weights, bool)
    for label, impl in variants:
      loss, logits, grads, hlo = run(base.replace(dtype="bfloat16", attention_impl=impl))
      row = {"check": f"model {size}{kind}: {label}", "shape": [rows, length],
             "loss": loss, "reference_loss": ref_loss,
             "loss_rel_diff": abs(loss - ref_loss) / abs(ref_loss),
             "logits_err": rel_err(logits[valid], ref_logits[valid]),
             "grad_err": tree_rel_err(grads, ref_grads)}
      row["cudnn_kernel"] = CUDNN_KERNEL in hlo
      row["passed"] = model_passed(row, tolerance, impl == "cudnn" and require_cudnn)
      results.append(row)
      print(line(row), flush=True)
  return results


def run_checks(size: str = "base", *, batch: int = 8, length: int = 256, model_rows: int = 8,
               vocab: int = 8000, tolerance: float = 1e-2, seed: int = 0,
               skip_model: bool = False) -> dict:
  """Every check (the model's unless `skip_model`), printed as a table; the summary dict has
  `passed` and one row per check. cuDNN's kernel is required on GPUs; on CPU
  `jax.nn.dot_product_attention` runs XLA's version."""
  on_gpu = jax.default_backend() == "gpu"
  rng = np.random.default_rng(seed)
  cfg = model_config(size, dtype="bfloat16", attention_impl="cudnn", attention_dropout_rate=0.0)
  device = jax.devices()[0]
  print(f"{device.device_kind} ({jax.default_backend()}), jax {jax.__version__}, tolerance "
        f"{tolerance:g} (model logits: {LOGITS_FACTOR * tolerance:g}, gradients: "
        f"{GRAD_FACTOR * tolerance:g})\n"
        f"{HEADER}", flush=True)
  results = check_attention(cfg, rng, batch, length, length * 5 // 4, tolerance,
                            require_cudnn=on_gpu)
  if not skip_model:
    results += check_model(size, rng, model_rows, length, vocab, tolerance, require_cudnn=on_gpu)
  return {"what": "check_accelerator", "device_kind": device.device_kind,
          "platform": jax.default_backend(), "jax_version": jax.__version__,
          "tolerance": tolerance, "passed": all(r["passed"] for r in results),
          "results": results}
