"""Virtual (ghost) batches: BatchNorm statistics per sub-batch of ``k`` examples.

Hoffer, Hubara & Soudry (2017), "Train longer, generalize better": normalizing each
consecutive sub-batch of ``k`` examples with its own statistics keeps the noise of a small
batch while the gradient step is a large batch's. Here the batch axis is split into
``(N/k, k)``: the sub-batch index becomes a kept axis, the ``k`` examples a reduced one, and
the ordinary kernel does the rest (masks included). Sub-batches never span devices; across
devices (``axis_name``) only the running statistics are combined.
"""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp

from jaxnorm._stats import Moments, broadcast_mask, psum


def check_virtual_batch_size(virtual_batch_size: Any, batch: int, axis: int) -> int:
  """``virtual_batch_size`` as an int that divides ``batch``, or a clear error."""
  if isinstance(virtual_batch_size, bool) or not isinstance(virtual_batch_size, int | jnp.integer):
    raise TypeError(
      f"virtual_batch_size must be a positive int (examples per sub-batch), got "
      f"{virtual_batch_size!r}."
    )
  k = int(virtual_batch_size)
  if k < 1 or batch % k:
    raise ValueError(
      f"virtual_batch_size={k} must be >= 1 and divide the batch, but axis {axis} (the "
      f"batch axis: the first reduction axis) has {batch} examples; use a batch that is a "
      f"multiple of {k} (on each device), or a virtual_batch_size among the divisors of {batch}."
    )
  return k


def split_batch(x, mask, feature_axes, reduction_axes, k):
  """``x`` (and its mask) with the batch axis ``b = reduction_axes[0]`` split into
  ``(N/k, k)``, and the axes of that view: ``(x, mask, feature_axes, reduction_axes, b)``."""
  b = reduction_axes[0]
  shape = x.shape[:b] + (x.shape[b] // k, k) + x.shape[b + 1 :]
  if mask is not None:
    mask = broadcast_mask(mask, x.shape).reshape(shape)

  def shift(a):
    return a + 1 if a >= b else a

  red = tuple(b + 1 if a == b else shift(a) for a in reduction_axes)
  return x.reshape(shape), mask, tuple(map(shift, feature_axes)), red, b


def combine(
  stats: Moments, group_axis: int, axis_name: Any, axis_index_groups: Any, unbiased: bool = False
) -> Moments:
  """The running statistics' view of the sub-batch ``stats`` (reduced dims squeezed, the
  sub-batch index at ``group_axis``): the means of the sub-batch means and variances over
  every sub-batch on every device, weighted by their valid counts (without a mask, the
  plain means). A feature with no valid element anywhere gets count 0. ``unbiased``: each
  sub-batch's variance is its unbiased one, ``n/(n − 1)·var`` (PyTorch's InstanceNorm with
  running statistics is this with sub-batches of one example)."""
  count = stats.count.astype(stats.var.dtype)
  var = stats.var * (count / jnp.maximum(count - 1, 1)) if unbiased else stats.var
  sums = [jnp.sum(count * s, group_axis) for s in (stats.mean, var)]
  total = jnp.sum(count, group_axis)
  mean_sum, var_sum, total = psum((*sums, total), axis_name, axis_index_groups)
  safe = jnp.maximum(total, 1)
  return Moments(mean_sum / safe, var_sum / safe, total.astype(stats.count.dtype))


def sub_batch_examples(shape: tuple[int, ...], reduction_axes: tuple[int, ...], k: int) -> int:
  """Values per statistic in one sub-batch: ``k`` times the other reduced sizes."""
  return k * math.prod(shape[a] for a in reduction_axes[1:])
