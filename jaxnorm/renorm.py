"""Batch Renormalization (Ioffe 2017): BatchNorm whose training output is corrected toward
the running statistics, so that training and inference agree even for small or non-i.i.d.
batches.

With the batch statistics ``μ_B``, ``σ_B = sqrt(var_B + ε)`` and the running ``μ``,
``σ = sqrt(var + ε)``, training computes

    r = sg(clip(σ_B/σ, 1/r_max, r_max)),   d = sg(clip((μ_B − μ)/σ, −d_max, d_max)),
    y = γ·((x − μ_B)/σ_B·r + d) + β

(``sg``: stop_gradient; the gradient is BatchNorm's, through ``μ_B`` and ``σ_B``, with
``r`` and ``d`` held constant), and inference is BatchNorm's ``γ·(x − μ)/σ + β``. The
running averages follow BatchNorm's momentum convention. ``r_max`` and ``d_max`` follow the
paper's schedule (:func:`~jaxnorm.renorm_limits`): plain BatchNorm (1 and 0) for a warm-up, then
relaxed linearly to their final values; the step count lives with the running statistics,
so a restored checkpoint resumes the schedule.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from jaxnorm._axes import Axes, canonicalize_axes
from jaxnorm._kernel import affine_normalize
from jaxnorm._stats import Moments, check_momentum, update_running_average
from jaxnorm.batch import batch_norm_step
from jaxnorm.functional import (
  _params,
  batch_norm_axes,
  check_batch_values,
  compute_dtype,
  given_stats,
  output_dtype,
)


def check_renorm_schedule(
  r_max: Any, d_max: Any, warmup_steps: int, r_max_steps: int | None, d_max_steps: int | None
) -> None:
  """Raises a clear error for limits or a schedule the paper's formulas do not allow
  (traced limits pass unchecked)."""
  for name, value, low in (("r_max", r_max, 1.0), ("d_max", d_max, 0.0)):
    if isinstance(value, int | float) and not value >= low:
      raise ValueError(
        f"{name} must be >= {low} ({name} = {low} is plain BatchNorm), got {value!r}; the "
        f"paper relaxes them to r_max = 3 and d_max = 5."
      )
  if int(warmup_steps) < 0:
    raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps!r}.")
  for name, end in (("r_max_steps", r_max_steps), ("d_max_steps", d_max_steps)):
    if end is not None and int(end) < int(warmup_steps):
      raise ValueError(
        f"{name}={end} comes before the end of the warm-up (warmup_steps={warmup_steps}); "
        f"it is the step at which the final value is reached, so give one >= "
        f"warmup_steps (or None to switch to the final value right after the warm-up)."
      )


def renorm_limits(
  step: Any,
  *,
  r_max: float = 3.0,
  d_max: float = 5.0,
  warmup_steps: int = 5000,
  r_max_steps: int | None = 40000,
  d_max_steps: int | None = 25000,
) -> tuple[jax.Array, jax.Array]:
  """``(r_max, d_max)`` in force at training step ``step`` (0 for the first update).

  For the first ``warmup_steps`` steps they are 1 and 0 (plain BatchNorm); from there
  they grow linearly to ``r_max`` at step ``r_max_steps`` and to ``d_max`` at
  ``d_max_steps`` and stay there. ``None`` switches to the final value when the warm-up
  ends; ``warmup_steps=0`` with both ``None`` gives fixed limits from the first step.
  The defaults are the paper's schedule (Ioffe 2017, section 4: warm-up 5k steps,
  ``r_max = 3`` reached at 40k, ``d_max = 5`` at 25k).

  >>> [float(r) for r in renorm_limits(jnp.array([0, 5000, 22500, 40000, 90000]))[0]]
  [1.0, 1.0, 2.0, 3.0, 3.0]
  """
  check_renorm_schedule(r_max, d_max, warmup_steps, r_max_steps, d_max_steps)
  step = jnp.asarray(step, jnp.float32)

  def ramp(start, final, end):
    if end is None or end == warmup_steps:
      return jnp.where(step >= warmup_steps, final, start)
    frac = jnp.clip((step - warmup_steps) / (end - warmup_steps), 0.0, 1.0)
    return start + (final - start) * frac

  return ramp(1.0, r_max, r_max_steps), ramp(0.0, d_max, d_max_steps)


def batch_renorm(
  x: jax.Array,
  scale: jax.Array | None = None,
  bias: jax.Array | None = None,
  *,
  mean: jax.Array,
  var: jax.Array,
  r_max: Any = 3.0,
  d_max: Any = 5.0,
  axis: Axes = -1,
  reduction_axes: Axes | None = None,
  epsilon: float = 1e-5,
  mask: jax.Array | None = None,
  axis_name: Any = None,
  axis_index_groups: Any = None,
  dtype: Any = None,
  force_float32_reductions: bool = True,
) -> tuple[jax.Array, Moments]:
  """Batch Renormalization in training: the batch's statistics, corrected toward ``mean``
  and ``var`` (the running statistics) by the clipped ``r`` and ``d``.

  Args:
    x: the input.
    scale: optional ``γ`` of the feature shape.
    bias: optional ``β`` of the feature shape.
    mean: the running mean, of the statistics' shape.
    var: the running variance, of the statistics' shape.
    r_max: the bound of ``r`` (>= 1; 1 gives BatchNorm), a number or a traced scalar
      (e.g. from :func:`renorm_limits`).
    d_max: the bound of ``|d|`` (>= 0; 0 gives BatchNorm).
    axis, reduction_axes, epsilon, mask, axis_name: as in :func:`jaxnorm.batch_norm` (the
      batch statistics are exact across devices and masks; a feature with no valid element
      gets ``r = 1``, ``d = 0``).
    axis_index_groups, dtype, force_float32_reductions: as in :func:`jaxnorm.batch_norm`.

  Returns:
    ``(y, Moments)``: the output and the batch moments (to feed
    :func:`jaxnorm.update_running_average`). Inference is :func:`jaxnorm.batch_norm` with
    the running statistics.

  >>> x = jnp.array([[0., 1.], [2., 5.]])
  >>> y, stats = batch_renorm(x, mean=jnp.zeros(2), var=jnp.ones(2), epsilon=0.0)
  >>> y.tolist()  # r = σ_B/σ clipped to [1/3, 3], d = μ_B/σ clipped to [-5, 5]
  [[0.0, 1.0], [2.0, 5.0]]
  """
  with jax.named_scope("jaxnorm.batch_renorm"):
    x = jnp.asarray(x)
    feat = canonicalize_axes(axis, x.ndim, name="axis")
    red = batch_norm_axes(x.ndim, feat, reduction_axes)
    if any(jnp.iscomplexobj(a) for a in (x, scale, bias, mean)):
      raise TypeError(
        "batch_renorm takes real inputs and parameters (r and d are ratios of real "
        "standard deviations); use batch_norm for complex data."
      )
    check_batch_values(x.shape, red, axis_name, name="batch_renorm")
    out_dtype = output_dtype(x, scale, bias, dtype=dtype)
    cdt = compute_dtype(x, dtype=dtype, force_float32=force_float32_reductions)
    running_mean, running_var = given_stats(x.shape, red, mean, var, cdt)
    xhat, stats = affine_normalize(
      x,
      red,
      epsilon=epsilon,
      mask=mask,
      axis_name=axis_name,
      axis_index_groups=axis_index_groups,
      dtype=cdt,
      out_dtype=cdt,
    )
    sigma = jnp.sqrt(running_var + epsilon)
    valid = stats.count > 0
    r = jnp.clip(jnp.sqrt(stats.var + epsilon) / sigma, 1.0 / r_max, r_max)
    d = jnp.clip((stats.mean - running_mean) / sigma, -d_max, d_max)
    r = lax.stop_gradient(jnp.where(valid, r, 1.0).astype(cdt))
    d = lax.stop_gradient(jnp.where(valid, d, 0.0).astype(cdt))
    gamma, beta = _params(scale, bias, x.shape, feat, cdt)
    if gamma is not None:
      r, d = gamma * r, gamma * d
    y = xhat * r + (d if beta is None else d + beta)
    return y.astype(out_dtype), Moments(*(jnp.squeeze(s, red) for s in stats))


def batch_renorm_step(
  x: jax.Array,
  scale: jax.Array | None,
  bias: jax.Array | None,
  running_mean: jax.Array,
  running_var: jax.Array,
  steps: jax.Array,
  *,
  use_running_average: bool,
  momentum: Any = 0.99,
  initializing: bool = False,
  r_max: float = 3.0,
  d_max: float = 5.0,
  warmup_steps: int = 5000,
  r_max_steps: int | None = 40000,
  d_max_steps: int | None = 25000,
  axis: Axes = -1,
  reduction_axes: Axes | None = None,
  epsilon: float = 1e-5,
  mask: jax.Array | None = None,
  axis_name: Any = None,
  axis_index_groups: Any = None,
  dtype: Any = None,
  force_float32_reductions: bool = True,
) -> tuple[jax.Array, tuple[jax.Array, jax.Array, jax.Array] | None]:
  """One call of a BatchRenorm layer, as a pure function: ``(y, (mean, var, steps))``.

  The rules are :func:`jaxnorm.batch_norm_step`'s (inference with the running statistics;
  ``init`` normalizes with the batch's and updates nothing); in training the output is
  :func:`batch_renorm`'s with the limits :func:`renorm_limits` gives at ``steps`` (the
  number of training updates so far), the running averages follow the momentum
  convention, and ``steps`` grows by one.

  >>> y, (mean, var, steps) = batch_renorm_step(
  ...   jnp.array([[1., 10.], [3., 30.]]), None, None, jnp.zeros(2), jnp.ones(2),
  ...   jnp.array(0), use_running_average=False, momentum=0.5)
  >>> mean.tolist(), var.tolist(), int(steps)
  ([1.0, 10.0], [1.0, 50.5], 1)
  """
  check_momentum(momentum)
  check_renorm_schedule(r_max, d_max, warmup_steps, r_max_steps, d_max_steps)
  common = dict(
    axis=axis,
    reduction_axes=reduction_axes,
    epsilon=epsilon,
    dtype=dtype,
    force_float32_reductions=force_float32_reductions,
  )
  if use_running_average or initializing:
    y, _ = batch_norm_step(
      x,
      scale,
      bias,
      running_mean,
      running_var,
      use_running_average=use_running_average,
      initializing=initializing,
      mask=mask,
      **common,
    )
    return y, None
  limits = renorm_limits(
    steps,
    r_max=r_max,
    d_max=d_max,
    warmup_steps=warmup_steps,
    r_max_steps=r_max_steps,
    d_max_steps=d_max_steps,
  )
  y, stats = batch_renorm(
    x,
    scale,
    bias,
    mean=running_mean,
    var=running_var,
    r_max=limits[0],
    d_max=limits[1],
    mask=mask,
    axis_name=axis_name,
    axis_index_groups=axis_index_groups,
    **common,
  )
  new_mean, new_var = update_running_average(running_mean, running_var, stats, momentum)
  return y, (new_mean, new_var, jnp.asarray(steps) + 1)
