"""The configuration record: what one normalization computes, built once by the public
function (or the module) that was called and passed down unchanged to the statistics and
the kernel, whose static argument it is."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np

from jaxnorm._dtypes import compute_dtype, output_dtype


class Config(NamedTuple):
  """A normalization, resolved: canonical axes, the statistics, the devices, the dtypes.

  Hashable (a static argument of the compiled kernel); ε and the mask are operands, not
  part of it, so a new ε value (or a traced one) does not compile anything again.
  """

  axes: tuple[int, ...]  # the reduced axes, sorted, non-negative
  features: tuple[int, ...] = ()  # the axes the scale and bias run along
  center: bool = True  # subtract the mean (False: RMS normalization)
  epsilon_in_root: bool = True  # 1/sqrt(var + ε); False: 1/(sqrt(var) + ε)
  channel_groups: tuple[int, int] | None = None  # GroupNorm's (channel axis, groups)
  axis_name: Any = None  # the mapped axis the statistics are combined across
  axis_index_groups: tuple[tuple[int, ...], ...] | None = None
  dtype: np.dtype = np.dtype(np.float32)  # the statistics' dtype (x is converted to it)
  out_dtype: np.dtype = np.dtype(np.float32)  # the output's dtype

  def local(self) -> Config:
    """The same normalization on this device alone (a module's ``init``, which may run
    outside the mapped axis)."""
    return self._replace(axis_name=None, axis_index_groups=None)


def freeze_groups(axis_index_groups: Any) -> tuple[tuple[int, ...], ...] | None:
  """``axis_index_groups`` as a tuple of tuples (hashable, so it can be a static argument)."""
  if axis_index_groups is None:
    return None
  return tuple(tuple(int(i) for i in group) for group in axis_index_groups)


def options(
  dtype: Any, force_float32_reductions: bool, axis_name: Any = None, axis_index_groups: Any = None
) -> dict[str, Any]:
  """The keywords of :func:`configure` that every public function passes on unchanged."""
  return dict(
    dtype=dtype,
    force_float32_reductions=force_float32_reductions,
    axis_name=axis_name,
    axis_index_groups=axis_index_groups,
  )


def configure(
  x: Any,
  axes: tuple[int, ...],
  features: tuple[int, ...],
  *operands: Any,
  dtype: Any = None,
  force_float32_reductions: bool = True,
  axis_name: Any = None,
  axis_index_groups: Any = None,
  center: bool = True,
  epsilon_in_root: bool = True,
  channel_groups: tuple[int, int] | None = None,
) -> Config:
  """The :class:`Config` of normalizing ``x`` (axes already canonical) with ``operands``
  (scale, bias, given statistics; None allowed): the statistics' dtype is
  :func:`~jaxnorm._dtypes.compute_dtype`'s, the output's Flax's rule over ``x``, the
  parameters and a complex statistic (a real one is not promoted with, as in Flax)."""
  params = operands[:2]
  groups = None if channel_groups is None else (int(channel_groups[0]), int(channel_groups[1]))
  complex_stats = [s for s in operands[2:] if s is not None and jnp.iscomplexobj(s)]
  return Config(
    axes=tuple(axes),
    features=tuple(features),
    center=bool(center),
    epsilon_in_root=bool(epsilon_in_root),
    channel_groups=groups,
    axis_name=axis_name,
    axis_index_groups=freeze_groups(axis_index_groups),
    dtype=compute_dtype(x, *operands, dtype=dtype, force_float32=force_float32_reductions),
    out_dtype=output_dtype(x, *params, *complex_stats, dtype=dtype),
  )
