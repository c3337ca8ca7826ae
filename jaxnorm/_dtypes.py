"""The dtype policy, once: which dtype statistics, outputs, sums and running averages take.

Statistics are computed in at least float32 (:func:`reduction_dtype`), counts and sums
always in a real dtype of at least float32 (:func:`count_dtype`, :func:`accumulation_dtype`);
the output follows Flax's rule (:func:`output_dtype`); complex inputs keep a complex mean
and a real variance; running statistics are at least float32 (:func:`running_stats_dtypes`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def promote(*dtypes: Any) -> np.dtype:
  """JAX's standard promotion of ``dtypes``, whatever ``jax_numpy_dtype_promotion`` says:
  the policy's promotions (float32 statistics of bfloat16 data, Flax's output rule) are
  deliberate, not the implicit ones that ``"strict"`` exists to catch, so a norm gives the
  same result in either mode.

  >>> with jax.numpy_dtype_promotion("strict"):
  ...   promote(jnp.bfloat16, jnp.float32)
  dtype('float32')
  """
  with jax.numpy_dtype_promotion("standard"):
    return jnp.dtype(jnp.result_type(*dtypes))


def standard_promotion(fn: Callable[..., Any]) -> Callable[..., Any]:
  """``fn`` run under JAX's standard promotion (see :func:`promote`): for the derivative
  rules, whose mixed-precision products (a bfloat16 tangent times float32 factors) are
  deliberate and which JAX traces wherever the caller differentiates, outside the public
  function's own call."""

  @functools.wraps(fn)
  def wrapped(*args: Any, **kwargs: Any) -> Any:
    with jax.numpy_dtype_promotion("standard"):
      return fn(*args, **kwargs)

  return wrapped


def reduction_dtype(x_dtype: Any, dtype: Any = None, force_float32: bool = True) -> np.dtype:
  """The dtype in which statistics are computed: ``dtype`` if given, else ``x_dtype``;
  promoted to at least float32 when ``force_float32`` (half precision gets float32
  statistics, float64 and complex stay); always inexact (integer inputs give float32).

  Raises:
    TypeError: for a complex input with a real ``dtype``, which would discard the
      imaginary part.

  >>> reduction_dtype(jnp.bfloat16)
  dtype('float32')
  >>> reduction_dtype(jnp.complex64)
  dtype('complex64')
  """
  dt = jnp.dtype(x_dtype if dtype is None else dtype)
  if jnp.issubdtype(jnp.dtype(x_dtype), jnp.complexfloating) and not jnp.issubdtype(
    dt, jnp.complexfloating
  ):
    raise TypeError(
      f"dtype={jnp.dtype(dt)} would discard the imaginary part of a {jnp.dtype(x_dtype)} "
      f"input; pass a complex dtype (e.g. dtype=jnp.complex64), or dtype=None to keep "
      f"the input's."
    )
  if force_float32 or not jnp.issubdtype(dt, jnp.inexact):
    dt = promote(dt, jnp.float32)
  return jnp.dtype(dt)


def real_dtype(dtype: Any) -> np.dtype:
  """The real dtype of the same precision (``complex64`` → ``float32``; reals unchanged)."""
  dtype = jnp.dtype(dtype)
  if jnp.issubdtype(dtype, jnp.complexfloating):
    return jnp.dtype(jnp.finfo(dtype).dtype)
  return dtype


def count_dtype(dtype: Any) -> np.dtype:
  """The dtype of counts, ``1/n`` and sums: real, and at least float32 whatever the
  statistics' dtype (float16 cannot hold a count above 65,504, bfloat16 rounds 257 to 256)."""
  return jnp.dtype(promote(real_dtype(dtype), jnp.float32))


def accumulation_dtype(dtype: Any) -> np.dtype:
  """At least float32 (complex and float64 unchanged): the dtype of a derivative's sums
  (reverse mode turns a broadcast into a sum, which overflows float16 past 65,504 terms)."""
  return jnp.dtype(promote(dtype, jnp.float32))


def output_dtype(x: Any, *params: Any, dtype: Any = None) -> np.dtype:
  """Flax's output dtype rule: ``dtype`` if given, else the promoted (inexact) dtype of
  ``x`` and the non-None ``params``."""
  if dtype is not None:
    return jnp.dtype(dtype)
  out = promote(*(jnp.asarray(a).dtype for a in (x, *params) if a is not None))
  if not jnp.issubdtype(out, jnp.inexact):
    out = promote(out, jnp.float32)
  return jnp.dtype(out)


def compute_dtype(
  x: Any, *operands: Any, dtype: Any = None, force_float32: bool = True
) -> np.dtype:
  """The dtype the kernel runs in: :func:`reduction_dtype` of ``x``, made complex when a
  parameter or statistic among ``operands`` is (Flax then returns complex too)."""
  stats_dtype = reduction_dtype(jnp.asarray(x).dtype, dtype, force_float32)
  for a in operands:
    if a is not None and jnp.iscomplexobj(a):
      stats_dtype = promote(stats_dtype, jnp.asarray(a).dtype)
  return jnp.dtype(stats_dtype)


def accumulated(x: Any) -> jax.Array:
  """``x`` in its :func:`accumulation_dtype` (at least float32; integers as float32): what
  the pointwise norms and the weight reparameterizations compute in."""
  x = jnp.asarray(x)
  return x.astype(accumulation_dtype(x.dtype if jnp.issubdtype(x.dtype, jnp.inexact) else "f4"))


def to_dtype(value: Any, dtype: Any) -> jax.Array:
  """``value`` in ``dtype``, or in its real dtype when ``value`` is real (real parameters
  and variances stay real next to complex data)."""
  value = jnp.asarray(value)
  return value.astype(dtype if jnp.iscomplexobj(value) else real_dtype(dtype))


def running_stats_dtypes(
  param_dtype: Any, x_dtype: Any, dtype: Any = None, force_float32_reductions: bool = True
) -> tuple[np.dtype, np.dtype]:
  """The dtypes of BatchNorm's running ``(mean, var)``: at least float32 with
  ``force_float32_reductions`` (the promotion of float32 and ``param_dtype``, so
  ``param_dtype=float64`` under ``jax_enable_x64`` keeps float64, as Flax's do after their
  first update), else ``param_dtype``; the mean is complex when the statistics are.

  >>> running_stats_dtypes(jnp.bfloat16, jnp.bfloat16)
  (dtype('float32'), dtype('float32'))
  >>> running_stats_dtypes(jnp.float32, jnp.complex64)
  (dtype('complex64'), dtype('float32'))
  """
  real = jnp.dtype(param_dtype)
  if force_float32_reductions:
    real = promote(real, jnp.float32)
  real = jax.dtypes.canonicalize_dtype(real)  # float64 is float32 without jax_enable_x64
  mean = real
  if jnp.issubdtype(reduction_dtype(x_dtype, dtype, force_float32_reductions), jnp.complexfloating):
    mean = jax.dtypes.canonicalize_dtype(promote(real, jnp.complex64))
  return jnp.dtype(mean), jnp.dtype(real)
