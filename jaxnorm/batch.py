"""The BatchNorm step shared by both front ends: which statistics to normalize with, the
rules at ``init``, the update of the running averages, and the running statistics' dtypes.

A module (Linen, NNX) only declares its ``mean``/``var`` variables with
:func:`~jaxnorm.running_stats_dtypes` and calls :func:`~jaxnorm.batch_norm_step`; it writes
back what the step returns.
"""

from __future__ import annotations

from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np

from jaxnorm._axes import Axes, canonicalize_axes
from jaxnorm._stats import check_momentum, reduction_dtype, update_running_average
from jaxnorm.functional import (
  batch_norm,
  batch_norm_axes,
  batch_norm_train,
  virtual_batch_train,
)


def running_stats_dtypes(
  param_dtype: Any,
  x_dtype: Any,
  dtype: Any = None,
  force_float32_reductions: bool = True,
) -> tuple[np.dtype, np.dtype]:
  """The dtypes of BatchNorm's running ``(mean, var)``.

  With ``force_float32_reductions`` (the default) they are at least float32: the promotion
  of float32 and ``param_dtype`` (so ``param_dtype=float64`` under ``jax_enable_x64`` keeps
  float64 statistics, as Flax's do after their first update); without it, ``param_dtype``.
  The mean is complex when the statistics are (a complex input or ``dtype``), the variance
  ``E|x − μ|²`` stays real.

  >>> running_stats_dtypes(jnp.bfloat16, jnp.bfloat16)
  (dtype('float32'), dtype('float32'))
  >>> running_stats_dtypes(jnp.float32, jnp.complex64)
  (dtype('complex64'), dtype('float32'))
  """
  real = jnp.dtype(param_dtype)
  if force_float32_reductions:
    real = jnp.promote_types(real, jnp.float32)
  real = jax.dtypes.canonicalize_dtype(real)  # float64 is float32 without jax_enable_x64
  mean = real
  if jnp.issubdtype(reduction_dtype(x_dtype, dtype, force_float32_reductions), jnp.complexfloating):
    mean = jax.dtypes.canonicalize_dtype(jnp.promote_types(real, jnp.complex64))
  return jnp.dtype(mean), jnp.dtype(real)


def counts_batches(module: Any) -> bool:
  """Whether a BatchNorm module keeps PyTorch's counter of updates ``num_batches_tracked``:
  with running statistics and PyTorch's convention (``unbiased_running_var``) or its
  cumulative average (``momentum=None``, which needs the counter)."""
  return bool(getattr(module, "track_running_stats", True)) and (
    module.momentum is None or bool(getattr(module, "unbiased_running_var", False))
  )


def check_track_running_stats(name: str, track_running_stats: bool, plain: bool) -> bool:
  """``track_running_stats``, refused False (``ValueError``) for every BatchNorm-family
  class but the ``plain`` BatchNorm: Batch Renorm and frozen BatchNorm need the running
  statistics."""
  if not track_running_stats and not plain:
    raise ValueError(
      f"{name} needs running statistics: track_running_stats=False is for BatchNorm "
      f"(batch statistics in every mode)."
    )
  return bool(track_running_stats)


def batch_norm_step(
  x: jax.Array,
  scale: jax.Array | None,
  bias: jax.Array | None,
  running_mean: jax.Array | None,
  running_var: jax.Array | None,
  *,
  use_running_average: bool,
  momentum: Any = 0.99,
  initializing: bool = False,
  axis: Axes = -1,
  reduction_axes: Axes | None = None,
  epsilon: float = 1e-5,
  mask: jax.Array | None = None,
  axis_name: Any = None,
  axis_index_groups: Any = None,
  dtype: Any = None,
  force_float32_reductions: bool = True,
  virtual_batch_size: int | None = None,
  unbiased_running_var: bool = False,
  num_batches_tracked: Any = None,
) -> tuple[jax.Array, tuple[jax.Array, ...] | None]:
  """One call of a BatchNorm layer, as a pure function: ``(y, new_running_stats)``.

  - ``use_running_average``: normalize with ``running_mean``/``running_var``; no update
    (``None`` is returned for the statistics).
  - ``initializing`` (a module's ``init``): normalize with the batch statistics, without
    ``axis_name`` (init may run outside the mapped axis) and without updating the running
    statistics. A dummy batch with one value per feature is accepted there and gives what
    Flax gives, ``β``.
  - training: normalize with the batch statistics (refusing one value per feature) and
    return the updated running averages (:func:`jaxnorm.update_running_average`: Flax's
    momentum convention; a feature whose batch has no valid element or non-finite
    statistics keeps its running values).

  Args:
    x: the input.
    scale: ``γ`` of the feature shape, or None.
    bias: ``β`` of the feature shape, or None.
    running_mean: the running mean, of the statistics' shape; None for a layer without
      running statistics (PyTorch's ``track_running_stats=False``): it normalizes with
      the batch statistics in every mode and returns no update.
    running_var: the running variance, of the statistics' shape (None with the mean).
    use_running_average: normalize with the running statistics (inference).
    momentum: decay rate of the running averages, in [0, 1] (checked when concrete).
    initializing: True while a module is being initialized.
    axis: the feature axis or axes.
    reduction_axes: the axes of the statistics (default: all but ``axis``).
    epsilon: constant >= 0 added to the variance.
    mask: optional boolean mask broadcastable to ``x`` (training only).
    axis_name: optional mapped axis to combine the batch statistics across.
    axis_index_groups: optional index groups along ``axis_name``.
    dtype: output dtype and minimum statistics dtype (default: inferred as in Flax).
    force_float32_reductions: compute statistics in at least float32.
    virtual_batch_size: in training, statistics per sub-batch of this many examples
      (:func:`jaxnorm.batch_norm`); the running averages follow the sub-batches' mean
      statistics. Not used at ``init`` (whose dummy batch may be smaller) nor at inference.

    unbiased_running_var: store the unbiased batch variance in the running average
      (PyTorch's convention; with ``virtual_batch_size``, the mean of the sub-batches'
      unbiased variances).
    num_batches_tracked: the number of training updates so far (PyTorch's counter): with
      it the step also returns the counter plus one, and ``momentum=None`` is PyTorch's
      cumulative average.

  Returns:
    ``(y, (new_mean, new_var))`` in training (``(y, (new_mean, new_var,
    num_batches_tracked + 1))`` when ``num_batches_tracked`` is given), ``(y, None)``
    otherwise.

  >>> x = jnp.array([[1., 10.], [3., 30.]])
  >>> y, (mean, var) = batch_norm_step(
  ...   x, None, None, jnp.zeros(2), jnp.ones(2), use_running_average=False, momentum=0.5)
  >>> mean.tolist(), var.tolist()
  ([1.0, 10.0], [1.0, 50.5])
  """
  if momentum is not None:
    check_momentum(momentum)
  elif num_batches_tracked is None:
    raise ValueError(
      "momentum=None (PyTorch's cumulative average) needs the num_batches_tracked counter; "
      "give a momentum in [0, 1] (PyTorch's m is 1 - m here) or the counter."
    )
  x = jnp.asarray(x)
  common = dict(
    axis=axis,
    reduction_axes=reduction_axes,
    epsilon=epsilon,
    dtype=dtype,
    force_float32_reductions=force_float32_reductions,
  )
  if running_mean is None and not initializing:  # no running statistics to use or update
    y, _ = batch_norm(
      x, scale, bias, mask=mask, axis_name=axis_name, axis_index_groups=axis_index_groups,
      virtual_batch_size=virtual_batch_size, **common,
    )  # fmt: skip
    return y, None
  if use_running_average:  # (with given statistics batch_norm returns y alone)
    y_eval = batch_norm(x, scale, bias, mean=running_mean, var=running_var, **common)
    return cast(jax.Array, y_eval), None
  if initializing:
    feat = canonicalize_axes(axis, x.ndim, name="axis")
    red = batch_norm_axes(x.ndim, feat, reduction_axes)
    y, _ = batch_norm_train(
      x,
      scale,
      bias,
      feat,
      red,
      mask=mask,
      epsilon=epsilon,
      dtype=dtype,
      force_float32_reductions=force_float32_reductions,
    )
    return y, None
  if virtual_batch_size is not None and unbiased_running_var:
    # Each sub-batch's own n/(n - 1): the average of unbiased variances (as PyTorch's
    # InstanceNorm with running statistics, sub-batches of one example).
    feat = canonicalize_axes(axis, x.ndim, name="axis")
    red = batch_norm_axes(x.ndim, feat, reduction_axes)
    common = {k: v for k, v in common.items() if k not in ("axis", "reduction_axes")}
    y, stats = virtual_batch_train(
      x, scale, bias, feat, red, virtual_batch_size, mask, axis_name, axis_index_groups,
      unbiased=True, **common,
    )  # fmt: skip
    unbiased_running_var = False  # already applied per sub-batch
  else:
    y, stats = batch_norm(
      x,
      scale,
      bias,
      mask=mask,
      axis_name=axis_name,
      axis_index_groups=axis_index_groups,
      virtual_batch_size=virtual_batch_size,
      **common,
    )
  assert running_mean is not None and running_var is not None  # (None returned above)
  new = update_running_average(
    running_mean,
    running_var,
    stats,
    momentum,
    unbiased=unbiased_running_var,
    num_batches_tracked=num_batches_tracked,
  )
  if num_batches_tracked is None:
    return y, new
  return y, (*new, jnp.asarray(num_batches_tracked) + 1)
