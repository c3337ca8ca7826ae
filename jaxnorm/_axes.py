"""Axes handling, done once: every norm turns its axes into sorted tuples here."""

from __future__ import annotations

import operator
from collections.abc import Sequence

Axes = int | Sequence[int]


def canonicalize_axes(axes: Axes, ndim: int, *, name: str = "axes") -> tuple[int, ...]:
  """Returns ``axes`` as a sorted tuple of non-negative axes of an ``ndim``-rank array.

  Args:
    axes: an int or a sequence of ints; negative values count from the end.
    ndim: the rank of the array the axes refer to.
    name: what the axes are called in error messages (e.g. ``"reduction_axes"``).

  Returns:
    The sorted tuple of axes in ``[0, ndim)``.

  Raises:
    TypeError: if an axis is not an integer.
    ValueError: if an axis is out of range or repeated.

  >>> canonicalize_axes((-1, 1), 4)
  (1, 3)
  """
  seq = (axes,) if not isinstance(axes, Sequence) else tuple(axes)
  out = []
  for axis in seq:
    try:
      axis = operator.index(axis)
    except TypeError:
      raise TypeError(
        f"{name} must be integers or a sequence of integers, got {axes!r} "
        f"(an element of type {type(axis).__name__}); pass e.g. {name}=-1 or {name}=(1, 2)."
      ) from None
    if not -ndim <= axis < ndim:
      raise ValueError(
        f"{name}={axes!r} is out of range for an input of rank {ndim}: every axis must lie "
        f"in [{-ndim}, {ndim - 1}]. Check the layout of the input (e.g. NHWC vs NCHW) "
        f"or pass axes that exist."
      )
    out.append(axis % ndim)
  if len(set(out)) != len(out):
    raise ValueError(
      f"{name}={axes!r} names the same axis more than once for an input of rank {ndim} "
      f"(as non-negative axes: {tuple(out)}); list each axis once."
    )
  return tuple(sorted(out))


def complement(axes: tuple[int, ...], ndim: int) -> tuple[int, ...]:
  """Returns the axes of an ``ndim``-rank array that are not in ``axes``, sorted."""
  return tuple(a for a in range(ndim) if a not in axes)


def kept_shape(shape: Sequence[int], reduced: tuple[int, ...]) -> tuple[int, ...]:
  """Shape of a statistic of an array of ``shape`` reduced over ``reduced`` (no kept dims)."""
  return tuple(d for a, d in enumerate(shape) if a not in reduced)


def broadcast_shape(shape: Sequence[int], axes: tuple[int, ...]) -> tuple[int, ...]:
  """Shape that places the dims of ``shape`` at ``axes`` and 1 elsewhere (for broadcasting)."""
  return tuple(d if a in axes else 1 for a, d in enumerate(shape))
