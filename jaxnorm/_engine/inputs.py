"""The checks of what a call passes in: ε, parameters and given statistics of the feature
shape, masks; each a clear error naming what was expected, what was got, and the fix.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxnorm._axes import broadcast_shape
from jaxnorm._config import Config
from jaxnorm._dtypes import to_dtype


def check_epsilon(epsilon: Any) -> Any:
  """Returns ``epsilon`` as a float, or raises if it is not a real number ``>= 0``.

  0 is accepted (the textbook ``x / RMS(x)``, as Flax and PyTorch accept it); a constant
  group then has variance 0 and its output is what the formula gives, ``0/0 = NaN``. A
  traced ``epsilon`` (e.g. an argument of a jitted function) is returned as it is: only
  its dtype can be checked while tracing, as in Flax, which accepts it too."""
  value = concrete_value(epsilon)
  kind = jnp.result_type(epsilon) if value is None else value.dtype
  if not (jnp.issubdtype(kind, jnp.floating) or jnp.issubdtype(kind, jnp.integer)) or (
    jnp.ndim(epsilon if value is None else value)
  ):
    raise TypeError(f"epsilon must be a real number >= 0 (a scalar, e.g. 1e-5), got {epsilon!r}.")
  if value is None:
    return epsilon
  eps = float(value)
  if not eps >= 0:  # negative or NaN
    raise ValueError(
      f"epsilon must be >= 0 (a negative or NaN one makes 1/sqrt(var + epsilon) NaN), "
      f"got {epsilon!r}; use e.g. 1e-5 (BatchNorm) or 1e-6 (LayerNorm)."
    )
  return eps


def operand(
  name: str,
  value: Any,
  x_shape: tuple[int, ...],
  axes: tuple[int, ...],
  dtype: Any,
  error: str,
  shaped: bool = True,
) -> jax.Array:
  """``value``, one entry per index of ``x_shape``'s ``axes``, in ``dtype`` (a real value
  stays real) and shaped to broadcast against ``x`` (left in its own shape with
  ``shaped=False``, for a compiled caller to reshape: an eager reshape is a dispatch of
  its own): a parameter or a given statistic. A value of another shape raises ``error``
  formatted with ``name``, ``got`` and ``want``."""
  want = tuple(x_shape[a] for a in axes)
  value = jnp.asarray(value)
  if value.shape != want:
    raise ValueError(error.format(name=name, got=value.shape, want=want))
  if shaped:
    value = value.reshape(broadcast_shape(x_shape, axes))
  return to_dtype(value, dtype)


def affine_params(
  scale: Any, bias: Any, x_shape: tuple[int, ...], cfg: Config, shaped: bool = True
) -> tuple[jax.Array | None, jax.Array | None]:
  """``(γ, β)`` checked against the feature shape of an ``x_shape`` input (one value per
  feature along ``cfg.features``), in ``cfg.dtype``, shaped to broadcast (with
  ``shaped=False`` in their own shape, which ``router.affine_normalize`` takes too); None
  stays None."""
  error = (
    f"{{name}} has shape {{got}}, but an input of shape {tuple(x_shape)} has features of "
    f"shape {{want}} along feature axes {cfg.features}; pass a {{name}} of shape {{want}} "
    f"(one value per feature) or change the feature axes."
  )
  gamma, beta = (
    None if v is None else operand(n, v, x_shape, cfg.features, cfg.dtype, error, shaped)
    for n, v in (("scale", scale), ("bias", bias))
  )
  return gamma, beta


def broadcast_mask(mask: Any, shape: tuple[int, ...]) -> jax.Array:
  """Returns ``mask`` as a boolean array of ``shape``, or raises a clear ``ValueError``."""
  mask = jnp.asarray(mask)
  try:
    return jnp.broadcast_to(mask.astype(bool), shape)
  except ValueError:
    raise ValueError(
      f"mask of shape {mask.shape} does not broadcast to the input's shape {shape}; "
      f"pass a boolean mask of shape {shape} or one whose dimensions are 1 or equal to "
      f"the input's, aligned from the right (e.g. mask[..., None] for a per-token mask)."
    ) from None


def concrete_value(value: Any) -> np.ndarray | None:
  """``value`` as a NumPy array when it is known at trace time (a Python or NumPy number,
  a concrete ``jax.Array``), None when it is traced."""
  try:
    return np.asarray(value)
  except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
    return None


def shaped_params(normalize):
  """``normalize`` taking ``γ, β`` also in their own feature shape (``affine_params(...,
  shaped=False)``), reshaped to broadcast inside the compiled program; parameters of
  ``x``'s rank (shaped, or per sample) pass as they are."""

  def call(x, scale, bias, mask, epsilon, cfg, *about):
    scale, bias = (
      p if p is None or p.ndim == x.ndim else p.reshape(broadcast_shape(x.shape, cfg.features))
      for p in (scale, bias)
    )
    return normalize(x, scale, bias, mask, epsilon, cfg, *about)

  return call
