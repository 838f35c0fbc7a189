"""The fused post-LN kernel alone (`fused_norm.residual_norm`) against XLA's fusion of the same
computation: forward and backward of LayerNorm(x + Dropout(y)) on `[rows, d]`, the dropout
mask drawn inside the timed program in both (`scripts/benchmark_norm.py`).

Each variant runs `iterations` forward+backward passes inside one compiled `lax.fori_loop`
(x moves by its gradient each time, so nothing is hoisted); a figure is the median over
`calls` calls divided by `iterations`. The variants are timed in turn, `repeats` times, and
first checked against XLA's outputs. Bytes are what the kernel path must move at least: x, y,
the int8 mask, the output and the stored sum forward; the gradient, the sum and the mask in,
both input gradients out, backward (18 bytes an element in bfloat16), so GB/s can be read
against the memory's rate (about 3 TB/s on an H100 counting reads and writes).
"""
from __future__ import annotations

import dataclasses
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax import fused_norm
from transformer_jax.attention import keep_mask


@dataclasses.dataclass(frozen=True)
class NormOptions:
  rows: int = 96 * 256
  d: int = 512
  rate: float = 0.1
  dtype: str = "bfloat16"
  variants: tuple[tuple[int, int], ...] = ((0, 4), (1, 4), (4, 4), (8, 8), (32, 8))
  iterations: int = 20
  calls: int = 10
  repeats: int = 3
  interpret: bool | None = None


def _program(fn, opts: NormOptions):
  """A jitted function running `iterations` forward+backward passes; returns the carry."""
  dtype = jnp.dtype(opts.dtype)

  def one(x, y, scale, bias, cot, rng):
    keep, keep_prob = keep_mask(rng, opts.rate, x.shape)

    def loss(x, y, scale, bias):
      out = fn(x, y, keep, scale, bias, keep_prob=keep_prob, dtype=dtype)
      return jnp.sum(out.astype(jnp.float32) * cot)
    return jax.grad(loss, (0, 1, 2, 3))(x, y, scale, bias)

  def run(x, y, scale, bias, cot, rng):
    def body(i, carry):
      x, acc = carry
      dx, dy, dscale, dbias = one(x, y, scale, bias, cot, jax.random.fold_in(rng, i))
      x = (x.astype(jnp.float32) + 1e-3 * dx.astype(jnp.float32)).astype(x.dtype)
      acc = acc + dy[0].astype(jnp.float32) + dscale + dbias
      return x, acc
    return jax.lax.fori_loop(0, opts.iterations, body, (x, jnp.zeros(x.shape[-1])))

  return jax.jit(run), jax.jit(one)


def run(opts: NormOptions = NormOptions()) -> dict:
  dtype = jnp.dtype(opts.dtype)
  k = jax.random.split(jax.random.key(0), 6)
  x = jax.random.normal(k[0], (opts.rows, opts.d), jnp.float32).astype(dtype)
  y = jax.random.normal(k[1], (opts.rows, opts.d), jnp.float32).astype(dtype)
  scale = 1.0 + 0.1 * jax.random.normal(k[2], (opts.d,))
  bias = 0.1 * jax.random.normal(k[3], (opts.d,))
  cot = jax.random.normal(k[4], (opts.rows, opts.d), jnp.float32)
  args = (x, y, scale, bias, cot, k[5])
  variants = {"xla": fused_norm.reference}
  for rows_per_block, warps in opts.variants:
    br = rows_per_block or fused_norm.block_rows(opts.rows, opts.d)
    name = f"kernel {br} rows, {warps} warps"
    variants[name] = lambda *a, _br=br, _w=warps, **kw: fused_norm.residual_norm(
        *a, rows_per_block=_br, num_warps=_w, interpret=opts.interpret, **kw)
  programs = {name: _program(fn, opts) for name, fn in variants.items()}
  ref = [np.asarray(g, np.float32) for g in programs["xla"][1](*args)]
  errors = {}
  for name, (loop, one) in programs.items():
    got = [np.asarray(g, np.float32) for g in one(*args)]
    errors[name] = max(float(np.linalg.norm(g - r) / np.linalg.norm(r)) for g, r in zip(got, ref))
    jax.block_until_ready(loop(*args))  # compile and warm up
  times = {name: [] for name in programs}
  for _ in range(opts.repeats):
    for name, (loop, _) in programs.items():
      for _ in range(opts.calls):
        start = time.perf_counter()
        jax.block_until_ready(loop(*args))
        times[name].append((time.perf_counter() - start) / opts.iterations)
  element_bytes = dtype.itemsize
  moved = opts.rows * opts.d * (5 * element_bytes + 2 + 4 * element_bytes)  # + 2: the mask twice
  figures = {}
  for name, ts in times.items():
    t = statistics.median(ts)
    figures[name] = {"us": t * 1e6, "gb_per_s": moved / t / 1e9, "grad_rel_err": errors[name]}
  device = jax.devices()[0]
  print(f"LayerNorm(x + Dropout(y)) forward+backward, [{opts.rows}, {opts.d}] {opts.dtype}, "
        f"dropout {opts.rate}; {device.device_kind}, jax {jax.__version__}; median of "
        f"{opts.repeats * opts.calls} calls of {opts.iterations} passes")
  for name, f in figures.items():
    print(f"  {name:<26} {f['us']:9.1f} us  {f['gb_per_s']:7.0f} GB/s (kernel's bytes)  "
          f"grad err {f['grad_rel_err']:.1e}")
  return {"what": "norm", "rows": opts.rows, "d": opts.d, "dtype": opts.dtype,
          "rate": opts.rate, "device_kind": device.device_kind, "jax_version": jax.__version__,
          "bytes_moved": moved, "figures": figures}
