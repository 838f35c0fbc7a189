"""LayerNorm(x + Dropout(y)), the post-LN residual step, as two Pallas kernels with a custom VJP.

Why: on an H100 the base model's LayerNorm, residual adds and applied dropout masks took 4.8 ms
of a 38 ms step (docs/benchmarks.md, "What each kernel does"): about 19 passes over each
`[tokens, d_model]` tensor per LayerNorm, forward and backward, as XLA fuses them. One row fits
a kernel's registers, so the whole step needs one pass forward (read x, y and the keep mask;
write the output and the sum) and one backward (read the gradient, the sum and the mask; write
both input gradients and per-block sums for the scale's and bias's gradients).

`model.norm_impl="pallas"` selects it (post-LN only). The kernels are compiled through Triton on
a GPU and run in Pallas's interpret mode elsewhere, which is how the tests check them on CPU
(slow: for tests, not for training on a CPU). NVIDIA Transformer Engine, the library that has
such kernels, could not be used: docs/benchmarks.md says why.

The dropout mask is an input (`attention.keep_mask`'s, computed by XLA), so the fused path draws
exactly the masks of the unfused one: the same model, seed and batch give the same loss either
way, to float rounding. The arithmetic is Flax's `nn.LayerNorm` (statistics in float32,
variance as E[s^2] - E[s]^2 clipped at 0, `(s - mean) * (rsqrt(var + eps) * scale) + bias`)
and `attention.dropout` (kept values scaled by 1 / keep in float32, rounded to y's dtype once).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

# A block holds about this many elements of each [rows, d] operand: 16 rows of base's 512,
# 8 of big's 1,024, so a program's float32 intermediates stay in registers.
_BLOCK_ELEMENTS = 8192


def reference(x, y, keep, scale, bias, *, keep_prob: float = 1.0, eps: float = 1e-6,
              dtype=jnp.float32):
  """The unfused computation (what `layers.Residual` does without the kernel), for tests."""
  if keep is not None:
    scaled = (y.astype(jnp.float32) * (1.0 / keep_prob)).astype(y.dtype)
    y = jnp.where(keep, scaled, jnp.zeros((), y.dtype))
  s = x + y
  sf = s.astype(jnp.float32)
  mean = sf.mean(-1, keepdims=True)
  var = jnp.maximum(0.0, (sf * sf).mean(-1, keepdims=True) - mean * mean)
  out = (sf - mean) * (jax.lax.rsqrt(var + eps) * scale) + bias
  return out.astype(dtype)


def block_rows(rows: int, d: int) -> int:
  """Rows per program: a power of two dividing `rows`, about `_BLOCK_ELEMENTS` elements."""
  target = max(1, _BLOCK_ELEMENTS // d)
  br = 1
  while br * 2 <= target and rows % (br * 2) == 0:
    br *= 2
  return br


def residual_norm(x, y, keep, scale, bias, *, keep_prob: float = 1.0, eps: float = 1e-6,
                  dtype=jnp.float32, interpret: bool | None = None):
  """LayerNorm(x + Dropout(y)) over the last axis, fused.

  x, y: [..., d] (the residual stream and the sublayer's output); keep: boolean [..., d] or None
  (no dropout); scale, bias: [d]; keep_prob: the probability `keep` was drawn with (kept values
  are scaled by its inverse); dtype: the output's. `interpret` defaults to compiling on a GPU
  and interpreting elsewhere.
  """
  d = x.shape[-1]
  if x.shape != y.shape or (keep is not None and keep.shape != x.shape):
    raise ValueError(f"residual_norm: x {x.shape}, y {y.shape} and keep "
                     f"{None if keep is None else keep.shape} must have one shape")
  if scale.shape != (d,) or bias.shape != (d,):
    raise ValueError(f"residual_norm: scale {scale.shape} and bias {bias.shape} must be ({d},)")
  if interpret is None:
    interpret = jax.default_backend() != "gpu"
  if not interpret and d & (d - 1):
    raise ValueError(f"residual_norm: d_model={d} is not a power of two, which Triton's blocks "
                     "need: use model.norm_impl='xla' for this size")
  lead = x.shape[:-1]
  rows = x.size // d
  keep2 = None if keep is None else keep.reshape(rows, d).astype(jnp.int8)
  static = _Static(float(keep_prob), float(eps), jnp.dtype(dtype), bool(interpret),
                   block_rows(rows, d))
  out = _fused(x.reshape(rows, d), y.reshape(rows, d), keep2, scale, bias, static)
  return out.reshape(*lead, d)


class _Static(tuple):
  """(keep_prob, eps, dtype, interpret, block_rows): the hashable non-array arguments."""

  def __new__(cls, *values):
    return super().__new__(cls, values)

  keep_prob = property(lambda self: self[0])
  eps = property(lambda self: self[1])
  dtype = property(lambda self: self[2])
  interpret = property(lambda self: self[3])
  rows = property(lambda self: self[4])


def _dropped(y, keep_ref, keep_prob):
  """Dropout applied to a block of y, as `attention.dropout` does it."""
  if keep_ref is None:
    return y
  scaled = (y.astype(jnp.float32) * (1.0 / keep_prob)).astype(y.dtype)
  return jnp.where(keep_ref[...] != 0, scaled, jnp.zeros((), y.dtype))


def _stats(sf, eps):
  """Flax's LayerNorm statistics of a float32 block: mean, 1 / sqrt(var + eps), per row."""
  mean = jnp.mean(sf, axis=1)
  var = jnp.maximum(jnp.mean(sf * sf, axis=1) - mean * mean, 0.0)
  return mean[:, None], jax.lax.rsqrt(var + eps)[:, None]


def _forward_kernel(*refs, has_keep: bool, keep_prob: float, eps: float):
  if has_keep:
    x_ref, y_ref, keep_ref, scale_ref, bias_ref, out_ref, s_ref = refs
  else:
    x_ref, y_ref, scale_ref, bias_ref, out_ref, s_ref = refs
    keep_ref = None
  s = x_ref[...] + _dropped(y_ref[...], keep_ref, keep_prob)
  s_ref[...] = s
  sf = s.astype(jnp.float32)
  mean, rstd = _stats(sf, eps)
  out = (sf - mean) * (rstd * scale_ref[...][None, :]) + bias_ref[...][None, :]
  out_ref[...] = out.astype(out_ref.dtype)


def _backward_kernel(*refs, has_keep: bool, keep_prob: float, eps: float):
  if has_keep:
    g_ref, s_ref, keep_ref, scale_ref, dx_ref, dy_ref, dscale_ref, dbias_ref = refs
  else:
    g_ref, s_ref, scale_ref, dx_ref, dy_ref, dscale_ref, dbias_ref = refs
    keep_ref = None
  g = g_ref[...].astype(jnp.float32)
  # The statistics again, from the stored sum: cheaper than storing them (the block is read
  # anyway), and always those of the rounded sum, also where XLA keeps a float32 sum in the
  # forward pass (its excess precision, as in interpret mode on CPU).
  sf = s_ref[...].astype(jnp.float32)
  mean, rstd = _stats(sf, eps)
  xhat = (sf - mean) * rstd
  gs = g * scale_ref[...][None, :]
  c1 = jnp.mean(gs * xhat, axis=1)[:, None]
  c2 = jnp.mean(gs, axis=1)[:, None]
  ds = (rstd * (gs - xhat * c1 - c2)).astype(dx_ref.dtype)
  dx_ref[...] = ds
  dy_ref[...] = _dropped(ds.astype(dy_ref.dtype), keep_ref, keep_prob)
  dscale_ref[...] = jnp.sum(g * xhat, axis=0)[None, :]
  dbias_ref[...] = jnp.sum(g, axis=0)[None, :]


def _triton():
  # Triton, not Mosaic GPU (Pallas's other GPU backend, whose copies take at most 256 elements
  # along an axis): a row-wise kernel needs nothing Triton lacks.
  return pltriton.CompilerParams(num_warps=4, num_stages=1)


def _row_spec(br, d):
  return pl.BlockSpec((br, d), lambda i: (i, 0))


def _param_spec(d):
  return pl.BlockSpec((d,), lambda i: (0,))


def _forward(x, y, keep, scale, bias, static: _Static):
  rows, d = x.shape
  br = static.rows
  has_keep = keep is not None
  s_dtype = jnp.result_type(x, y)
  kernel = functools.partial(_forward_kernel, has_keep=has_keep, keep_prob=static.keep_prob,
                             eps=static.eps)
  operands = (x, y) + ((keep,) if has_keep else ()) + (scale, bias)
  in_specs = [_row_spec(br, d)] * (3 if has_keep else 2) + [_param_spec(d)] * 2
  out, s = pl.pallas_call(
      kernel, grid=(rows // br,), in_specs=in_specs,
      out_specs=[_row_spec(br, d), _row_spec(br, d)],
      out_shape=[jax.ShapeDtypeStruct((rows, d), static.dtype),
                 jax.ShapeDtypeStruct((rows, d), s_dtype)],
      compiler_params=_triton(), interpret=static.interpret, name="residual_norm_forward")(*operands)
  return out, s


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _fused(x, y, keep, scale, bias, static):
  return _forward(x, y, keep, scale, bias, static)[0]


def _fused_fwd(x, y, keep, scale, bias, static):
  out, s = _forward(x, y, keep, scale, bias, static)
  # The dtypes travel as zero-size arrays: residuals must be JAX types.
  return out, (s, keep, scale, jnp.zeros((0,), x.dtype), jnp.zeros((0,), y.dtype),
               jnp.zeros((0,), bias.dtype))


def _fused_bwd(static, residuals, g):
  s, keep, scale, x_like, y_like, bias_like = residuals
  rows, d = s.shape
  br = static.rows
  has_keep = keep is not None
  blocks = rows // br
  kernel = functools.partial(_backward_kernel, has_keep=has_keep, keep_prob=static.keep_prob,
                             eps=static.eps)
  operands = (g, s) + ((keep,) if has_keep else ()) + (scale,)
  in_specs = [_row_spec(br, d)] * (3 if has_keep else 2) + [_param_spec(d)]
  part_spec = pl.BlockSpec((1, d), lambda i: (i, 0))
  dx, dy, dscale, dbias = pl.pallas_call(
      kernel, grid=(blocks,), in_specs=in_specs,
      out_specs=[_row_spec(br, d), _row_spec(br, d), part_spec, part_spec],
      out_shape=[jax.ShapeDtypeStruct((rows, d), x_like.dtype),
                 jax.ShapeDtypeStruct((rows, d), y_like.dtype),
                 jax.ShapeDtypeStruct((blocks, d), jnp.float32),
                 jax.ShapeDtypeStruct((blocks, d), jnp.float32)],
      compiler_params=_triton(), interpret=static.interpret, name="residual_norm_backward")(*operands)
  return (dx, dy, None, dscale.sum(0).astype(scale.dtype), dbias.sum(0).astype(bias_like.dtype))


_fused.defvjp(_fused_fwd, _fused_bwd)
