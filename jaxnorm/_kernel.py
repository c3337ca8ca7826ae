"""The normalization kernel: ``x̂ = (x - μ) / sqrt(σ² + ε)`` with a closed-form derivative.

``standardize`` is a ``jax.custom_jvp``. Its tangent is the textbook one,

    ẋ̂ = r·(ẋ − mean(ẋ)) + c·x̂·mean(x̂·ẋ),   r = 1/sqrt(σ² + ε),  c = −r

(means over the valid elements of each group, summed across devices), which JAX transposes
into the closed-form gradient ``dx = r·(g − mean(g) − x̂·mean(g·x̂))``. Compared with
differentiating the statistics op by op, the compiled backward keeps only ``x̂`` and ``r`` and
moves less memory; forward-mode and higher-order derivatives keep working because the rule is
itself written in differentiable ``jnp``.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jaxnorm._stats import Moments, group_moments, broadcast_mask, psum


class _Config(NamedTuple):
  axes: tuple[int, ...]
  center: bool
  epsilon: float
  epsilon_in_root: bool
  axis_name: Any
  axis_index_groups: Any


def check_epsilon(epsilon: Any) -> float:
  """Returns ``epsilon`` as a float, or raises if it is not a positive number."""
  try:
    eps = float(epsilon)
  except (TypeError, jax.errors.ConcretizationTypeError):
    raise TypeError(
      f"epsilon must be a Python number (it is a compile-time constant), got {epsilon!r}."
    ) from None
  if not eps > 0:
    raise ValueError(
      f"epsilon must be > 0 (it keeps 1/sqrt(var + epsilon) finite for constant groups), "
      f"got {epsilon!r}; use e.g. 1e-5 (BatchNorm) or 1e-6 (LayerNorm)."
    )
  return eps


def inverse_std(var: jax.Array, epsilon: float, epsilon_in_root: bool = True) -> jax.Array:
  """``1/sqrt(var + ε)``, or ``1/(sqrt(var) + ε)`` with ``epsilon_in_root=False``."""
  if epsilon_in_root:
    return lax.rsqrt(var + epsilon)
  return 1.0 / (jnp.sqrt(var) + epsilon)


def _valid_mean(z, valid, count, cfg):
  """Mean of ``z`` over the valid elements of each group, across devices."""
  if valid is not None:
    z = jnp.where(valid, z, 0)
  total = psum(jnp.sum(z, cfg.axes, keepdims=True), cfg.axis_name, cfg.axis_index_groups)
  return total / jnp.maximum(count, 1)


def _forward(x, mask, cfg):
  stats = group_moments(
    x, cfg.axes, cfg.center, mask, cfg.axis_name, cfg.axis_index_groups
  )
  r = inverse_std(stats.var, cfg.epsilon, cfg.epsilon_in_root)
  if mask is not None:
    r = jnp.where(stats.count > 0, r, 0)
  dev = x - stats.mean if cfg.center else x
  return dev * r, stats, r, dev


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def _standardize(x, mask, cfg):
  xhat, stats, _, _ = _forward(x, mask, cfg)
  return xhat, stats


@_standardize.defjvp
def _standardize_jvp(cfg, primals, tangents):
  x, mask = primals
  dx = tangents[0]
  xhat, stats, r, dev = _forward(x, mask, cfg)
  valid = None if mask is None else broadcast_mask(mask, x.shape)
  count = stats.count
  dmean = _valid_mean(dx, valid, count, cfg) if cfg.center else jnp.zeros_like(stats.mean)
  q = _valid_mean(xhat * dx, valid, count, cfg)
  if cfg.epsilon_in_root:
    c = -r
  else:
    std = jnp.sqrt(stats.var)
    c = jnp.where(std > 0, -1.0 / jnp.where(std > 0, std, 1.0), 0.0)
  dxhat = r * (dx - dmean) + xhat * (c * q)
  dvar = 2.0 * _valid_mean(dev * dx, valid, count, cfg)
  return (xhat, stats), (dxhat, Moments(dmean, dvar, jnp.zeros_like(count)))


def standardize(
  x: jax.Array,
  axes: tuple[int, ...],
  *,
  center: bool = True,
  epsilon: float = 1e-5,
  epsilon_in_root: bool = True,
  mask: jax.Array | None = None,
  axis_name: Any = None,
  axis_index_groups: Any = None,
) -> tuple[jax.Array, Moments]:
  """Normalizes ``x`` (already in its reduction dtype) over canonical ``axes``.

  Args:
    x: the input, in the dtype the statistics are computed in.
    axes: sorted non-negative axes to reduce over.
    center: subtract the mean (False: RMS normalization, ``x / sqrt(mean(x²) + ε)``).
    epsilon: the positive constant added to the variance (or, with
      ``epsilon_in_root=False``, to the standard deviation).
    epsilon_in_root: ``1/sqrt(var + ε)`` if True, ``1/(sqrt(var) + ε)`` if False.
    mask: optional boolean mask broadcastable to ``x``; statistics use its True positions,
      every position is normalized, and groups without a valid element give ``x̂ = 0``.
    axis_name: optional mapped axis to combine statistics across (count-weighted).
    axis_index_groups: optional index groups along ``axis_name``.

  Returns:
    ``(x̂, Moments)`` with the moments' reduced dimensions kept (size 1).
  """
  groups = None
  if axis_index_groups is not None:
    groups = tuple(tuple(int(i) for i in g) for g in axis_index_groups)
  cfg = _Config(tuple(axes), bool(center), check_epsilon(epsilon), bool(epsilon_in_root),
                axis_name, groups)
  if mask is not None:
    mask = broadcast_mask(mask, x.shape)
  return _standardize(x, mask, cfg)


def apply_moments(
  x: jax.Array,
  mean: jax.Array,
  var: jax.Array,
  *,
  epsilon: float,
  center: bool = True,
  epsilon_in_root: bool = True,
) -> jax.Array:
  """``(x - mean) / sqrt(var + ε)`` with given statistics already broadcastable to ``x``."""
  r = inverse_std(var, check_epsilon(epsilon), epsilon_in_root)
  return (x - mean) * r if center else x * r
