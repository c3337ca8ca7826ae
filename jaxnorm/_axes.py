"""Axes, once: every norm turns its arguments into sorted tuples of axes here, with the
errors that name the layout."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.array_utils import normalize_axis_tuple

Axes = int | Sequence[int]


def canonicalize_axes(axes: Axes, ndim: int, *, name: str = "axes") -> tuple[int, ...]:
  """``axes`` as a sorted tuple of non-negative axes of an ``ndim``-rank array (negative
  values count from the end), or a ``TypeError``/``ValueError`` that says what to pass.

  >>> canonicalize_axes((-1, 1), 4)
  (1, 3)
  """
  seq = tuple(axes) if isinstance(axes, Sequence) else (axes,)
  bad = [a for a in seq if not isinstance(a, int | np.integer) or isinstance(a, bool | np.bool_)]
  if bad:  # (bools are ints to Python and NumPy: axes=True would mean axis 1)
    raise TypeError(
      f"{name} must be integers or a sequence of integers, got {axes!r} "
      f"(an element of type {type(bad[0]).__name__}); pass e.g. {name}=-1 or {name}=(1, 2)."
    )
  if ndim == 0 and seq:
    raise ValueError(
      f"{name}={axes!r} names an axis of a 0-d input (a scalar), which has none: a norm "
      f"computes its statistics over axes of the input; pass an array of rank >= 1 "
      f"(e.g. x[None] for one value, or the whole array the scalar came from)."
    )
  try:
    return tuple(sorted(normalize_axis_tuple(seq, ndim)))
  except np.exceptions.AxisError:
    raise ValueError(
      f"{name}={axes!r} is out of range for an input of rank {ndim}: every axis must lie "
      f"in [{-ndim}, {ndim - 1}]. Check the layout of the input (e.g. NHWC vs NCHW) "
      f"or pass axes that exist."
    ) from None
  except ValueError:
    raise ValueError(
      f"{name}={axes!r} names the same axis more than once for an input of rank {ndim} "
      f"(as non-negative axes: {tuple(int(a) % ndim for a in seq)}); list each axis once."
    ) from None


def statistics_axes(axes: Axes, ndim: int, *, name: str = "axes") -> tuple[int, ...]:
  """:func:`canonicalize_axes` of the axes a norm's statistics run over, which must be at
  least one: over none, each element would be its own group (variance 0), and the output
  β (LayerNorm) or sign(x) (RMSNorm) whatever the input.

  >>> statistics_axes((), 3, name="reduction_axes")  # doctest: +ELLIPSIS
  Traceback (most recent call last):
  ...
  ValueError: reduction_axes=() reduces over no axis ...
  """
  out = canonicalize_axes(axes, ndim, name=name)
  if not out:
    raise ValueError(
      f"{name}={axes!r} reduces over no axis of a rank-{ndim} input: every element would "
      f"be normalized by its own statistics (variance 0), giving the bias (or sign(x) "
      f"without centering) whatever the input; pass the axes to normalize over, e.g. "
      f"{name}=-1 (PyTorch refuses an empty normalized_shape too)."
    )
  return out


def complement(axes: tuple[int, ...], ndim: int) -> tuple[int, ...]:
  """The axes of an ``ndim``-rank array that are not in ``axes``, sorted."""
  return tuple(a for a in range(ndim) if a not in axes)


def kept_shape(shape: Sequence[int], reduced: tuple[int, ...]) -> tuple[int, ...]:
  """Shape of a statistic of an array of ``shape`` reduced over ``reduced`` (no kept dims)."""
  return tuple(d for a, d in enumerate(shape) if a not in reduced)


def broadcast_shape(shape: Sequence[int], axes: tuple[int, ...]) -> tuple[int, ...]:
  """Shape that places the dims of ``shape`` at ``axes`` and 1 elsewhere (for broadcasting)."""
  return tuple(d if a in axes else 1 for a, d in enumerate(shape))


def batch_norm_axes(
  ndim: int, axis: Axes, reduction_axes: Axes | None
) -> tuple[tuple[int, ...], tuple[int, ...]]:
  """BatchNorm's ``(feature axes, reduction axes)``: ``reduction_axes`` checked against
  the feature axes, or every non-feature axis when None."""
  feat = canonicalize_axes(axis, ndim, name="axis")
  if reduction_axes is None:
    return feat, complement(feat, ndim)
  red = canonicalize_axes(reduction_axes, ndim, name="reduction_axes")
  if set(red) & set(feat):
    raise ValueError(
      f"reduction_axes {red} overlap the feature axis {feat} of a rank-{ndim} input; "
      f"statistics are per feature, so reduce over the other axes only."
    )
  return feat, red


def instance_norm_axes(ndim: int, feature_axes: Axes) -> tuple[tuple[int, ...], tuple[int, ...]]:
  """InstanceNorm's ``(feature axes, reduction axes)``: every axis but the batch axis 0
  and the channels is reduced."""
  feat = canonicalize_axes(feature_axes, ndim, name="feature_axes")
  if 0 in feat:
    raise ValueError(
      f"feature_axes={feature_axes!r} includes axis 0, the batch axis of InstanceNorm, for "
      f"an input of rank {ndim}; channels go at -1 (NHWC) or 1 (NCHW)."
    )
  reduced = tuple(a for a in range(1, ndim) if a not in feat)
  if not reduced:
    raise ValueError(
      f"InstanceNorm of a rank-{ndim} input with feature_axes={feature_axes!r} has no axis "
      f"left to compute statistics over (axis 0 is the batch): it needs spatial or time "
      f"axes, e.g. (N, H, W, C) or (N, L, C); for per-sample statistics over the features "
      f"use LayerNorm."
    )
  return feat, reduced


def channel_axis(feature_axis: Axes, ndim: int) -> int:
  """GroupNorm's one channel axis, non-negative; a sequence of several axes is refused
  (the channels of one axis are grouped)."""
  axes = canonicalize_axes(feature_axis, ndim, name="feature_axis")
  if len(axes) != 1:
    raise ValueError(
      f"GroupNorm groups the channels of one axis, but got feature_axis={feature_axis!r} "
      f"({len(axes)} axes); pass a single int, e.g. feature_axis=-1 (NHWC) or 1 (NCHW)."
    )
  return axes[0]


def group_norm_axes(
  ndim: int, feature_axis: Axes, reduction_axes: Axes | None
) -> tuple[int, tuple[int, ...]]:
  """GroupNorm's ``(channel axis, reduction axes other than it)``; ``reduction_axes`` must
  include the channel axis (default: every axis but the batch axis 0)."""
  f = channel_axis(feature_axis, ndim)
  if reduction_axes is None:
    red = tuple(range(1, ndim))
  else:
    red = canonicalize_axes(reduction_axes, ndim, name="reduction_axes")
  if f not in red:
    raise ValueError(
      f"reduction_axes {red} must include the channel axis {f} (feature_axis="
      f"{feature_axis}) of a rank-{ndim} input: GroupNorm reduces over groups of "
      f"channels; add {f} to reduction_axes or set feature_axis to the channel axis."
    )
  return f, tuple(a for a in red if a != f)
