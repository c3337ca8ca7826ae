"""Statistics, once: reduction dtype, masked and cross-device moments, running averages.

The numerics policy of the whole library lives here: statistics are reduced in at least
float32, the variance comes from sums shifted by an element of each group, from checked
plain sums with an exact fallback, or from the two-pass formula, so it stays accurate when
``|mean| >> std``; a group with no valid element has mean 0, variance 0 and count 0 instead
of NaN; and cross-device statistics are weighted by each device's valid count.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxnorm._axes import Axes, canonicalize_axes


class Moments(NamedTuple):
  """Statistics of a normalization group.

  Attributes:
    mean: the mean over the valid elements (0 when not centering, and for empty groups).
    var: the biased variance over the valid elements, or the mean square when not
      centering (0 for empty groups).
    count: the number of valid elements that went into each statistic, summed across
      devices when an ``axis_name`` is given (a float array of the statistics' shape).
  """

  mean: jax.Array
  var: jax.Array
  count: jax.Array


def reduction_dtype(x_dtype: Any, dtype: Any = None, force_float32: bool = True) -> np.dtype:
  """Returns the dtype in which statistics are computed.

  It is ``dtype`` if given, else ``x_dtype``; promoted to at least float32 when
  ``force_float32`` (so half-precision inputs get float32 statistics while float64 stays
  float64); and always a floating type (integer inputs give float32).

  >>> reduction_dtype(jnp.bfloat16)
  dtype('float32')
  """
  dt = jnp.dtype(x_dtype if dtype is None else dtype)
  if jnp.issubdtype(jnp.dtype(x_dtype), jnp.complexfloating) or jnp.issubdtype(
    dt, jnp.complexfloating
  ):
    raise TypeError(
      f"jaxnorm normalizes real inputs, got dtype {jnp.dtype(x_dtype)} (dtype={dtype}); "
      f"normalize the real and imaginary parts (or the magnitude) separately."
    )
  if force_float32 or not jnp.issubdtype(dt, jnp.inexact):
    dt = jnp.promote_types(dt, jnp.float32)
  return jnp.dtype(dt)


def psum(value: Any, axis_name: Any, axis_index_groups: Any = None) -> Any:
  """``lax.psum`` over ``axis_name``, or ``value`` unchanged when ``axis_name`` is None."""
  if axis_name is None:
    return value
  return lax.psum(value, axis_name, axis_index_groups=axis_index_groups)


def freeze_groups(axis_index_groups: Any) -> tuple[tuple[int, ...], ...] | None:
  """``axis_index_groups`` as a tuple of tuples (hashable, so it can be a static argument)."""
  if axis_index_groups is None:
    return None
  return tuple(tuple(int(i) for i in group) for group in axis_index_groups)


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


def group_sum(
  z: jax.Array, axes: tuple[int, ...], groups: tuple[int, int] | None = None, dtype: Any = None
) -> jax.Array:
  """``Σ z`` over ``axes`` with the reduced dims kept; with ``groups = (axis, G)`` also over
  each of ``G`` contiguous groups of channels along ``axis``, the group's sum repeated on
  each of its channels.

  The channel grouping is done on the small partial sums, never on ``z`` itself: reshaping
  the input to ``(..., G, C/G)`` makes XLA:CPU reduce over a strided minor axis, measured
  11× slower for GroupNorm's statistics at (32, 32, 32, 64).
  """
  s = jnp.sum(z, axes, keepdims=True, dtype=dtype)
  if groups is None:
    return s
  axis, g = groups
  split = _split_channels(s.shape, axis, g)
  return _repeat_on_channels(jnp.sum(s.reshape(split), axis + 1, keepdims=True), split, axis)


def _split_channels(shape, axis, g):
  """``shape`` with its channel ``axis`` split into ``(G, C/G)``."""
  return shape[:axis] + (g, shape[axis] // g) + shape[axis + 1 :]


def _repeat_on_channels(k, split, axis):
  """A per-group value ``k`` (``split`` shape with 1 for the channels within a group)
  repeated on each of its group's channels, channel axis merged back."""
  return jnp.broadcast_to(k, split).reshape(split[:axis] + (-1,) + split[axis + 2 :])


def shifts(x, axes, groups=None):
  """Two elements of each group of ``x`` (its first and its last along every reduced axis
  and, with ``groups = (axis, G)``, its first and last channel, repeated on the group's
  channels), as small arrays broadcastable to ``x``; None when a reduced axis is sharded
  in ``x``'s type (explicit sharding cannot slice one element out of a sharded axis)."""
  try:
    spec = tuple(jax.typeof(x).sharding.spec)
  except (AttributeError, TypeError):
    spec = ()
  if any(i < len(spec) and spec[i] is not None for i in axes):
    return None
  out = []
  for index in (0, -1):
    k = x
    for a in axes:
      k = lax.slice_in_dim(k, index % x.shape[a], index % x.shape[a] + 1, axis=a)
    if groups is not None:
      axis, g = groups
      split = _split_channels(k.shape, axis, g)
      i = index % split[axis + 1]
      k = lax.slice_in_dim(k.reshape(split), i, i + 1, axis=axis + 1)
      k = _repeat_on_channels(k, split, axis)
    out.append(k)
  return tuple(out)


def _checked_moments(x, axes, inv_n, groups=None):
  """Mean and centred variance, from one parallel pass of ``Σx`` and ``Σx²`` when that is
  exact enough, else from a second, corrected pass over ``x − mean``.

  ``E[x²] − E[x]²`` loses about ``eps·mean²/var`` of relative precision (float32: 2.5e-7
  per unit of ``mean²/var``, measured). When every group has ``mean² ≤ limit·var`` with
  ``limit = 2e-6/eps`` (about 17 in float32), its relative error stays under ~5e-6 and it is
  used as is; otherwise (offset data, constant groups) ``lax.cond`` runs the corrected
  two-pass algorithm (Chan, Golub & LeVeque 1983): with ``d = x − mean``,
  ``mean += mean(d)`` and ``var = mean(d²) − mean(d)²``, exact to rounding. Ordinary data
  thus costs what Flax's fast variance costs, and ill-conditioned data gets the accurate
  answer.
  """
  mean = group_sum(x, axes, groups) * inv_n
  fast = jnp.maximum(group_sum(x * x, axes, groups) * inv_n - mean * mean, 0)
  limit = 2e-6 / float(jnp.finfo(x.dtype).eps)
  well_conditioned = jnp.max(mean * mean - limit * fast) <= 0  # one small reduction

  def two_pass(operands):
    x, mean, _ = operands
    d = x - mean
    shift = group_sum(d, axes, groups) * inv_n
    var = group_sum(d * d, axes, groups) * inv_n - shift * shift
    return mean + shift, jnp.maximum(var, 0)

  mean, var = lax.cond(well_conditioned, lambda ops: ops[1:], two_pass, (x, mean, fast))
  return mean, var


def _shifted_moments(x, axes, inv_n, groups, shifts):
  """Mean and variance from one parallel pass of shifted sums, accurate for any offset.

  With ``a`` and ``b`` two elements of each group (its first and its last; ``shifts`` from
  :func:`shifts`), ``s₁ = Σ(x − a)`` and ``s₂ = Σ(x − b)²`` give ``mean = a + s₁/n`` and
  ``var = s₂/n − (mean − b)²``. Shifting by an element of the group removes the offset
  before anything is summed or squared: the cancellation left is at most
  ``(mean − b)²/var ≤ n`` (an element lies within ``sqrt(n)`` standard deviations of the
  mean), typically ~1, instead of ``mean²/var`` for ``E[x²] − E[x]²`` (Flax's fast
  variance), which is unbounded. Two different shifts keep the two sums separate
  expressions, each fused into its own read of ``x``. A plain ``Σx`` instead of ``s₁``
  measured ~10 % faster forward but 0.39 off at mean 1e6 (its rounding, ~eps·|Σx|, enters
  the variance); rejected. With ``shifts=None`` (a sharded reduced axis) it is the exact
  two-pass formula.
  """
  if shifts is None:  # a sharded reduced axis: the exact two-pass formula
    mean = group_sum(x, axes, groups) * inv_n
    return mean, group_sum(jnp.square(x - mean), axes, groups) * inv_n
  a, b = shifts
  d1 = group_sum(x - a, axes, groups) * inv_n
  s2 = group_sum(jnp.square(x - b), axes, groups) * inv_n
  d2 = d1 + (a - b)
  return a + d1, jnp.maximum(s2 - d2 * d2, 0)


def group_moments(
  x, axes, center, mask, axis_name, axis_index_groups, groups=None, shifts="checked"
):
  """Moments of ``x`` (already in the reduction dtype) with the reduced dims kept; with
  ``groups = (axis, G)``, also over groups of channels (see :func:`group_sum`).

  The variance is always centred-accurate: on one device without a mask it comes from
  :func:`_checked_moments` (``shifts="checked"``) or :func:`_shifted_moments` (``shifts``
  from :func:`shifts`, or None for the two-pass formula); with a mask or across devices
  from the two-pass formula (count-weighted ``psum`` of the sums, then of the squared
  deviations).
  """
  per_group = 1 if groups is None else x.shape[groups[0]] // groups[1]

  def total(z):
    return psum(group_sum(z, axes, groups), axis_name, axis_index_groups)

  if mask is None:
    n_local = math.prod(x.shape[a] for a in axes) * per_group
    count = psum(jnp.asarray(n_local, x.dtype), axis_name, axis_index_groups)
    kept = tuple(1 if a in axes else d for a, d in enumerate(x.shape))
    count = jnp.broadcast_to(count, kept)
    inv_n = 1.0 / jnp.maximum(count, 1)
    if center and axis_name is None:
      if isinstance(shifts, str):  # the undifferentiated forward: see _checked_moments
        return Moments(*_checked_moments(x, axes, inv_n, groups), count)
      return Moments(*_shifted_moments(x, axes, inv_n, groups, shifts), count)
    mean = total(x) * inv_n if center else jnp.zeros_like(inv_n)
    dev = x - mean if center else x
    return Moments(mean, total(dev * dev) * inv_n, count)

  valid = broadcast_mask(mask, x.shape)
  count = group_sum(valid, axes, groups, dtype=x.dtype)
  if center:
    sums = group_sum(jnp.where(valid, x, 0), axes, groups)
    count, sums = psum((count, sums), axis_name, axis_index_groups)
    mean = sums / jnp.maximum(count, 1)
    dev = jnp.where(valid, x - mean, 0)
  else:
    count = psum(count, axis_name, axis_index_groups)
    mean = jnp.zeros_like(count)
    dev = jnp.where(valid, x, 0)
  var = total(dev * dev) / jnp.maximum(count, 1)
  return Moments(mean, var, count)


def moments(
  x: jax.Array,
  axes: Axes,
  *,
  center: bool = True,
  mask: jax.Array | None = None,
  axis_name: Any = None,
  axis_index_groups: Any = None,
  dtype: Any = None,
  force_float32_reductions: bool = True,
  keepdims: bool = False,
) -> Moments:
  """Computes the mean and variance (or mean square) of ``x`` over ``axes``.

  The variance comes from sums shifted by an element of each group (the exact two-pass
  formula with a mask, across devices or over a sharded axis), so it keeps full precision
  when the mean is large compared with the spread, unlike ``E[x**2] - E[x]**2``.

  Args:
    x: the input array, of any rank.
    axes: the axes to reduce over (int or sequence, negative allowed).
    center: if False, ``mean`` is 0 and ``var`` is the mean square ``mean(x**2)`` (RMS²).
    mask: optional boolean array broadcastable to ``x``; only its True positions enter the
      statistics. A group with no True position gets mean 0, var 0 and count 0.
    axis_name: optional name of a mapped axis (``pmap``, ``shard_map``, ``vmap``) to combine
      the statistics across: counts and sums are summed over it, so the result equals the
      statistics of the concatenated data, also when devices hold different valid counts.
    axis_index_groups: optional groups of indices along ``axis_name`` (see ``lax.psum``).
    dtype: minimum dtype of the statistics (default: ``x``'s dtype).
    force_float32_reductions: promote the statistics to at least float32 (default True).
    keepdims: keep the reduced axes as size-1 dimensions.

  Returns:
    A :class:`Moments` ``(mean, var, count)`` in the reduction dtype.

  >>> x = jnp.array([[1., 2., 3., 4.], [2., 3., 4., 5.]])
  >>> m = moments(x, axes=1)
  >>> m.mean.tolist(), m.var.tolist(), m.count.tolist()
  ([2.5, 3.5], [1.25, 1.25], [4.0, 4.0])
  """
  x = jnp.asarray(x)
  axes = canonicalize_axes(axes, x.ndim)
  x = x.astype(reduction_dtype(x.dtype, dtype, force_float32_reductions))
  stats = group_moments(x, axes, center, mask, axis_name, axis_index_groups, shifts=shifts(x, axes))
  if keepdims:
    return stats
  return Moments(*(jnp.squeeze(s, axes) for s in stats))


def update_running_average(
  running_mean: jax.Array,
  running_var: jax.Array,
  batch: Moments,
  momentum: float,
) -> tuple[jax.Array, jax.Array]:
  """Exponential moving average of the statistics, Flax's convention.

  ``ra = momentum * ra + (1 - momentum) * batch`` for the mean and the (biased) variance;
  a statistic whose batch count is 0 (every element masked) keeps its running value.
  PyTorch's ``momentum=0.1`` corresponds to ``momentum=0.9`` here (PyTorch also stores the
  unbiased variance).

  Args:
    running_mean: the running mean, of the statistics' shape.
    running_var: the running variance, of the statistics' shape.
    batch: the batch :class:`Moments` (without kept dims), e.g. from :func:`moments`.
    momentum: the decay rate in [0, 1].

  Returns:
    ``(new_mean, new_var)`` in the running statistics' dtypes.

  >>> m = Moments(jnp.array([2.0, 5.0]), jnp.array([4.0, 1.0]), jnp.array([8.0, 0.0]))
  >>> mean, var = update_running_average(jnp.zeros(2), jnp.ones(2), m, 0.9)
  >>> print(mean, var)
  [0.2 0. ] [1.3 1. ]
  """
  if isinstance(momentum, int | float) and not 0.0 <= momentum <= 1.0:
    raise ValueError(
      f"momentum must lie in [0, 1] (the weight kept by the running average), got {momentum}; "
      f"PyTorch's momentum m corresponds to 1 - m here (its 0.1 is 0.9)."
    )
  for name, ra, b in (("mean", running_mean, batch.mean), ("var", running_var, batch.var)):
    if jnp.shape(ra) != jnp.shape(b):
      raise ValueError(
        f"running {name} has shape {jnp.shape(ra)} but the batch statistics have shape "
        f"{jnp.shape(b)}; the running statistics must be those of the same layer and axes."
      )
  has_data = batch.count > 0

  def ema(ra, b):
    new = momentum * ra + (1.0 - momentum) * b
    return jnp.where(has_data, new, ra).astype(jnp.asarray(ra).dtype)

  return ema(running_mean, batch.mean), ema(running_var, batch.var)
