"""Pure normalization functions: ``normalize`` and one function per norm.

Each function chooses its axes, calls the kernel (``jaxnorm._kernel.affine_normalize``), which
normalizes and applies the optional affine map ``y = γ·x̂ + β``. Statistics are computed in at least
float32 (see :func:`jaxnorm.reduction_dtype`); the output dtype follows Flax: ``dtype`` if
given, else the promotion of the input's and the parameters' dtypes.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxnorm._axes import Axes, broadcast_shape, canonicalize_axes, complement, kept_shape
from jaxnorm._kernel import affine_normalize, apply_moments
from jaxnorm._stats import (
  Moments,
  broadcast_mask,
  freeze_groups,
  group_moments,
  real_dtype,
  reduction_dtype,
)
from jaxnorm._virtual import check_virtual_batch_size, combine, split_batch, sub_batch_examples


def output_dtype(x: Any, *params: Any, dtype: Any = None) -> jnp.dtype:
  """Flax's output dtype rule: ``dtype`` if given, else the promoted (inexact) dtype of
  ``x`` and the non-None ``params``."""
  if dtype is not None:
    return jnp.dtype(dtype)
  out = jnp.result_type(*(jnp.asarray(a).dtype for a in (x, *params) if a is not None))
  if not jnp.issubdtype(out, jnp.inexact):
    out = jnp.promote_types(out, jnp.float32)
  return jnp.dtype(out)


def _param(value, name, x_shape, feature_axes):
  """Checks a scale or bias against the feature shape and reshapes it to broadcast."""
  if value is None:
    return None
  value = jnp.asarray(value)
  want = tuple(x_shape[a] for a in feature_axes)
  if value.shape != want:
    raise ValueError(
      f"{name} has shape {value.shape}, but an input of shape {tuple(x_shape)} has features "
      f"of shape {want} along feature axes {feature_axes}; pass a {name} of shape {want} "
      f"(one value per feature) or change the feature axes."
    )
  return value.reshape(broadcast_shape(x_shape, feature_axes))


def compute_dtype(
  x: Any, *operands: Any, dtype: Any = None, force_float32: bool = True
) -> np.dtype:
  """The dtype the kernel runs in: :func:`jaxnorm.reduction_dtype` of ``x``, made complex
  when a parameter or statistic among ``operands`` is (Flax then returns complex too)."""
  cdt = reduction_dtype(jnp.asarray(x).dtype, dtype, force_float32)
  for a in operands:
    if a is not None and jnp.iscomplexobj(a):
      cdt = jnp.promote_types(cdt, jnp.asarray(a).dtype)
  return jnp.dtype(cdt)


def cast(value: Any, dtype: Any) -> jax.Array:
  """``value`` in ``dtype``, or in its real dtype when ``value`` is real (real parameters
  and variances stay real next to complex data)."""
  value = jnp.asarray(value)
  return value.astype(dtype if jnp.iscomplexobj(value) else real_dtype(dtype))


def _params(scale, bias, x_shape, feature_axes, dtype):
  """Checked ``(γ, β)`` in ``dtype`` (real ones in its real dtype), shaped to broadcast
  against ``x`` (None stays None)."""
  return tuple(
    None if p is None else cast(_param(p, name, x_shape, feature_axes), dtype)
    for name, p in (("scale", scale), ("bias", bias))
  )


def affine(
  xhat: jax.Array,
  scale: jax.Array | None,
  bias: jax.Array | None,
  feature_axes: tuple[int, ...],
  *,
  zero_centered_scale: bool = False,
) -> jax.Array:
  """The learned map ``γ·x̂ + β`` (``(1 + γ)·x̂ + β`` when ``zero_centered_scale``).

  Args:
    xhat: the normalized input.
    scale: ``γ`` of shape ``[xhat.shape[a] for a in feature_axes]``, or None for no scale.
    bias: ``β`` of the same shape, or None for no bias.
    feature_axes: sorted axes of ``xhat`` that the parameters run along.
    zero_centered_scale: multiply by ``1 + γ`` instead of ``γ`` (Gemma-style).

  Returns:
    The affinely transformed array (dtype from promotion with the parameters).

  >>> affine(jnp.ones((2, 3)), jnp.array([1., 2., 3.]), None, (1,)).tolist()
  [[1.0, 2.0, 3.0], [1.0, 2.0, 3.0]]
  """
  scale = _param(scale, "scale", xhat.shape, feature_axes)
  bias = _param(bias, "bias", xhat.shape, feature_axes)
  y = xhat
  if scale is not None:
    y = y * (1 + scale if zero_centered_scale else scale)
  if bias is not None:
    y = y + bias
  return y


def zero_centered_init(init: Any) -> Any:
  """The initializer of a zero-centred scale (``y = (1 + γ)·x̂``): ``init(...) − 1``, so
  that the effective scale starts where ``init`` puts it (RMSNorm's
  ``zero_centered_scale``, Gemma-style)."""

  def zero_centered(key, shape, dtype=jnp.float32):
    return init(key, shape, dtype) - 1

  return zero_centered


def normalize(
  x: jax.Array,
  axes: Axes,
  center: bool = True,
  scale: bool = True,
  *,
  epsilon: float = 1e-5,
  mask: jax.Array | None = None,
  axis_name: Any = None,
  axis_index_groups: Any = None,
) -> jax.Array:
  """Normalizes ``x`` over ``axes``: the maths of every norm, without learned parameters.

  ``x̂ = (x − μ) / sqrt(σ² + ε)`` with ``μ, σ²`` the mean and (centred, accurate) variance
  over ``axes``. ``center=False`` gives RMS normalization ``x / sqrt(mean(x²) + ε)``;
  ``scale=False`` only subtracts the mean; both False return ``x`` unchanged.

  Args:
    x: the input, of any rank.
    axes: the axes to compute the statistics over (int or sequence; negative allowed).
    center: subtract the mean.
    scale: divide by the standard deviation (or the RMS when not centering).
    epsilon: a constant >= 0 added to the variance; with 0, a constant group gives
      what the formula gives, 0/0 = NaN.
    mask: optional boolean array broadcastable to ``x``: only True positions enter the
      statistics; every position is normalized with them (as in Flax). A group with no
      True position has no statistics; its output is 0 rather than NaN.
    axis_name: optional mapped axis (``pmap``/``shard_map``/``vmap``) over which the
      statistics are combined, weighted by each member's valid count.
    axis_index_groups: optional groups of indices along ``axis_name`` (see ``lax.psum``).

  Returns:
    An array of ``x``'s shape and dtype (float32 for integer inputs).

  Raises:
    ValueError: for out-of-range or repeated axes, a negative or NaN epsilon, or a mask
      that does not broadcast to ``x``.

  >>> x = jnp.array([[1., 2., 3., 4.]])
  >>> print(normalize(x, axes=-1, epsilon=1e-12))
  [[-1.3416 -0.4472  0.4472  1.3416]]
  >>> print(normalize(x, axes=-1, center=False, epsilon=1e-12))  # x / sqrt(7.5)
  [[0.3651 0.7303 1.0954 1.4606]]
  """
  with jax.named_scope("jaxnorm.normalize"):
    x = jnp.asarray(x)
    axes = canonicalize_axes(axes, x.ndim)
    out_dtype = output_dtype(x)
    xs = x.astype(reduction_dtype(x.dtype))
    if scale:
      y, _ = affine_normalize(
        xs,
        axes,
        center=center,
        epsilon=epsilon,
        mask=mask,
        axis_name=axis_name,
        axis_index_groups=axis_index_groups,
      )
    elif center:
      y = _subtract_mean(xs, axes, mask, axis_name, freeze_groups(axis_index_groups))
    else:
      y = xs
    return y.astype(out_dtype)


@functools.partial(jax.jit, static_argnums=(1, 3, 4))
def _subtract_mean(x, axes, mask, axis_name, axis_index_groups):
  """Mean-only normalization ``x − mean(x)`` (compiled once per shape, as the kernel)."""
  if mask is not None:
    mask = broadcast_mask(mask, x.shape)
  stats = group_moments(x, axes, True, mask, axis_name, axis_index_groups)
  return x - stats.mean


def _shared(mask, axis_name, axis_index_groups, dtype, force_float32_reductions):
  """The keyword options every per-norm function passes on to :func:`_norm` unchanged."""
  return dict(
    mask=mask,
    axis_name=axis_name,
    axis_index_groups=axis_index_groups,
    dtype=dtype,
    force_float32_reductions=force_float32_reductions,
  )


def _norm(
  x,
  reduction_axes,
  feature_axes,
  scale,
  bias,
  *,
  center=True,
  epsilon,
  epsilon_in_root=True,
  zero_centered_scale=False,
  mask=None,
  axis_name=None,
  axis_index_groups=None,
  dtype=None,
  force_float32_reductions=True,
  channel_groups=None,
):
  """Shared body of the per-norm functions: checks and reshapes the parameters, runs the
  kernel in the reduction dtype, casts to Flax's output dtype. ``channel_groups`` is
  GroupNorm's ``(channel axis, number of groups)``."""
  out_dtype = output_dtype(x, scale, bias, dtype=dtype)
  cdt = compute_dtype(x, scale, bias, dtype=dtype, force_float32=force_float32_reductions)
  gamma, beta = _params(scale, bias, x.shape, feature_axes, cdt)
  if gamma is not None and zero_centered_scale:
    gamma = 1 + gamma
  y, stats = affine_normalize(
    x,
    reduction_axes,
    gamma,
    beta,
    center=center,
    epsilon=epsilon,
    epsilon_in_root=epsilon_in_root,
    mask=mask,
    axis_name=axis_name,
    axis_index_groups=axis_index_groups,
    channel_groups=channel_groups,
    dtype=cdt,
    out_dtype=out_dtype,
  )
  return y, stats


def layer_norm(
  x: jax.Array,
  scale: jax.Array | None = None,
  bias: jax.Array | None = None,
  *,
  reduction_axes: Axes = -1,
  feature_axes: Axes = -1,
  epsilon: float = 1e-6,
  mask: jax.Array | None = None,
  axis_name: Any = None,
  axis_index_groups: Any = None,
  dtype: Any = None,
  force_float32_reductions: bool = True,
) -> jax.Array:
  """Layer normalization (Ba et al. 2016): statistics per sample over ``reduction_axes``.

  ``y = γ·(x − μ)/sqrt(σ² + ε) + β``. For a Transformer ``(B, T, D)`` the defaults reduce
  over ``D`` per token; for a CNN ``(N, H, W, C)`` pass ``reduction_axes=(1, 2, 3)``.

  Args:
    x: the input.
    scale: optional ``γ`` of the feature shape ``[x.shape[a] for a in feature_axes]``.
    bias: optional ``β`` of the feature shape.
    reduction_axes: axes of the statistics.
    feature_axes: axes the scale and bias run along.
    epsilon: constant >= 0 added to the variance (Flax's default 1e-6).
    mask: optional boolean mask broadcastable to ``x`` (see :func:`normalize`).
    axis_name: optional mapped axis to combine statistics across.
    axis_index_groups: optional index groups along ``axis_name``.
    dtype: output dtype and minimum statistics dtype (default: inferred as in Flax).
    force_float32_reductions: compute statistics in at least float32.

  Returns:
    The normalized array, of ``x``'s shape.

  >>> y = layer_norm(jnp.array([[1., 2., 3., 4.]]), jnp.full(4, 2.), jnp.ones(4))
  >>> print(y)
  [[-1.6833  0.1056  1.8944  3.6833]]
  """
  with jax.named_scope("jaxnorm.layer_norm"):
    x = jnp.asarray(x)
    red = canonicalize_axes(reduction_axes, x.ndim, name="reduction_axes")
    feat = canonicalize_axes(feature_axes, x.ndim, name="feature_axes")
    y, _ = _norm(
      x,
      red,
      feat,
      scale,
      bias,
      epsilon=epsilon,
      **_shared(mask, axis_name, axis_index_groups, dtype, force_float32_reductions),
    )
    return y


def rms_norm(
  x: jax.Array,
  scale: jax.Array | None = None,
  bias: jax.Array | None = None,
  *,
  reduction_axes: Axes = -1,
  feature_axes: Axes = -1,
  epsilon: float = 1e-6,
  epsilon_in_root: bool = True,
  zero_centered_scale: bool = False,
  mask: jax.Array | None = None,
  axis_name: Any = None,
  axis_index_groups: Any = None,
  dtype: Any = None,
  force_float32_reductions: bool = True,
) -> jax.Array:
  """RMS normalization (Zhang & Sennrich 2019): ``y = γ·x / sqrt(mean(x²) + ε) (+ β)``.

  Args:
    x: the input.
    scale: optional ``γ`` of the feature shape.
    bias: optional ``β`` of the feature shape (most RMSNorms have none).
    reduction_axes: axes of the mean square (default: the last).
    feature_axes: axes the scale and bias run along.
    epsilon: constant >= 0 (Flax's default 1e-6); with 0 this is the textbook
      ``x / RMS(x)``, and an all-zero group gives what that formula gives, ``0/0 = NaN``.
    epsilon_in_root: if False, ``x / (sqrt(mean(x²)) + ε)``, as some references write it.
    zero_centered_scale: multiply by ``1 + γ`` (Gemma-style; γ starts at 0).
    mask: optional boolean mask broadcastable to ``x`` (see :func:`normalize`).
    axis_name: optional mapped axis to combine statistics across.
    axis_index_groups: optional index groups along ``axis_name``.
    dtype: output dtype and minimum statistics dtype (default: inferred as in Flax).
    force_float32_reductions: compute statistics in at least float32.

  Returns:
    The normalized array, of ``x``'s shape.

  >>> print(rms_norm(jnp.array([[1., 2., 3., 4.]]), epsilon=1e-12))
  [[0.3651 0.7303 1.0954 1.4606]]
  """
  with jax.named_scope("jaxnorm.rms_norm"):
    x = jnp.asarray(x)
    red = canonicalize_axes(reduction_axes, x.ndim, name="reduction_axes")
    feat = canonicalize_axes(feature_axes, x.ndim, name="feature_axes")
    y, _ = _norm(
      x,
      red,
      feat,
      scale,
      bias,
      center=False,
      epsilon=epsilon,
      epsilon_in_root=epsilon_in_root,
      zero_centered_scale=zero_centered_scale,
      **_shared(mask, axis_name, axis_index_groups, dtype, force_float32_reductions),
    )
    return y


def add_layer_norm(
  x: jax.Array,
  residual: jax.Array,
  scale: jax.Array | None = None,
  bias: jax.Array | None = None,
  *,
  residual_dtype: Any = None,
  reduction_axes: Axes = -1,
  feature_axes: Axes = -1,
  epsilon: float = 1e-6,
  mask: jax.Array | None = None,
  axis_name: Any = None,
  axis_index_groups: Any = None,
  dtype: Any = None,
  force_float32_reductions: bool = True,
) -> tuple[jax.Array, jax.Array]:
  """Add & Norm: ``h = x + residual`` and ``y = layer_norm(h)``, returned as ``(y, h)``.

  The residual stream of a Pre-LN Transformer block (as ``fused_add_rms_norm`` in vLLM or
  flash-attn's ``prenorm=True``): ``h`` is the new residual stream, ``y`` the input of the
  next sublayer. ``h`` is kept in ``residual_dtype`` (e.g. float32 while ``x`` is bfloat16);
  ``y`` has the dtype :func:`layer_norm` of ``x`` would have (``dtype``, else ``x``'s
  promoted with the parameters). Both cotangents flow back into ``x`` and ``residual``
  through the norm's closed-form derivative.

  Args:
    x: the sublayer's output.
    residual: the residual stream, of ``x``'s shape.
    scale, bias, reduction_axes, feature_axes, epsilon, mask: as in :func:`layer_norm`.
    axis_name, axis_index_groups, dtype, force_float32_reductions: as in :func:`layer_norm`.
    residual_dtype: the dtype of ``h`` (default: ``x``'s and ``residual``'s promoted).

  Returns:
    ``(y, h)``.

  >>> y, h = add_layer_norm(jnp.array([[1., 2.]]), jnp.array([[2., 5.]]), epsilon=1e-12)
  >>> y.tolist(), h.tolist()
  ([[-1.0, 1.0]], [[3.0, 7.0]])
  """
  return _add_norm(
    layer_norm,
    x,
    residual,
    scale,
    bias,
    residual_dtype,
    reduction_axes=reduction_axes,
    feature_axes=feature_axes,
    epsilon=epsilon,
    **_shared(mask, axis_name, axis_index_groups, dtype, force_float32_reductions),
  )


def add_rms_norm(
  x: jax.Array,
  residual: jax.Array,
  scale: jax.Array | None = None,
  bias: jax.Array | None = None,
  *,
  residual_dtype: Any = None,
  reduction_axes: Axes = -1,
  feature_axes: Axes = -1,
  epsilon: float = 1e-6,
  epsilon_in_root: bool = True,
  zero_centered_scale: bool = False,
  mask: jax.Array | None = None,
  axis_name: Any = None,
  axis_index_groups: Any = None,
  dtype: Any = None,
  force_float32_reductions: bool = True,
) -> tuple[jax.Array, jax.Array]:
  """Add & RMSNorm: ``h = x + residual`` and ``y = rms_norm(h)``, returned as ``(y, h)``
  (see :func:`add_layer_norm`; the other arguments as in :func:`rms_norm`).

  >>> y, h = add_rms_norm(jnp.array([[1., 2.]]), jnp.array([[2., 2.]]), epsilon=1e-12)
  >>> print(y, h)  # RMS of [3, 4] is sqrt(12.5)
  [[0.8485 1.1314]] [[3. 4.]]
  """
  return _add_norm(
    rms_norm,
    x,
    residual,
    scale,
    bias,
    residual_dtype,
    reduction_axes=reduction_axes,
    feature_axes=feature_axes,
    epsilon=epsilon,
    epsilon_in_root=epsilon_in_root,
    zero_centered_scale=zero_centered_scale,
    **_shared(mask, axis_name, axis_index_groups, dtype, force_float32_reductions),
  )


def _add_norm(norm, x, residual, scale, bias, residual_dtype, **kw):
  """The body of both Add & Norm functions: ``h`` in ``residual_dtype``, ``y = norm(h)`` in
  the dtype ``norm`` of ``x`` would have."""
  h = residual_sum(x, residual, residual_dtype)
  y = norm(h, scale, bias, **kw)
  return y.astype(output_dtype(x, scale, bias, dtype=kw["dtype"])), h


def residual_sum(x: Any, residual: Any, residual_dtype: Any = None) -> jax.Array:
  """``x + residual`` in ``residual_dtype`` (default: their promoted dtype), for Add & Norm;
  a clear error when the shapes differ."""
  x, residual = jnp.asarray(x), jnp.asarray(residual)
  if x.shape != residual.shape:
    raise ValueError(
      f"Add & Norm adds x of shape {x.shape} to a residual of shape {residual.shape}; they "
      f"must have the same shape (the residual stream is the block's input, x its "
      f"sublayer's output)."
    )
  dt = jnp.result_type(x, residual) if residual_dtype is None else jnp.dtype(residual_dtype)
  return x.astype(dt) + residual.astype(dt)


def instance_norm(
  x: jax.Array,
  scale: jax.Array | None = None,
  bias: jax.Array | None = None,
  *,
  feature_axes: Axes = -1,
  epsilon: float = 1e-6,
  mask: jax.Array | None = None,
  axis_name: Any = None,
  axis_index_groups: Any = None,
  dtype: Any = None,
  force_float32_reductions: bool = True,
) -> jax.Array:
  """Instance normalization (Ulyanov et al. 2016): statistics per (sample, channel).

  Reduces over every axis except the leading (batch) axis and ``feature_axes``: ``H, W``
  for NHWC with the default ``feature_axes=-1``, and for NCHW data with ``feature_axes=1``.

  Args:
    x: the input, batch first.
    scale: optional ``γ`` of the feature shape.
    bias: optional ``β`` of the feature shape.
    feature_axes: the channel axes (must not include axis 0, the batch).
    epsilon: constant >= 0 (Flax's default 1e-6).
    mask: optional boolean mask broadcastable to ``x`` (see :func:`normalize`).
    axis_name: optional mapped axis to combine statistics across.
    axis_index_groups: optional index groups along ``axis_name``.
    dtype: output dtype and minimum statistics dtype (default: inferred as in Flax).
    force_float32_reductions: compute statistics in at least float32.

  Returns:
    The normalized array, of ``x``'s shape.

  >>> x = jnp.arange(8.).reshape(1, 2, 2, 2)            # N, H, W, C
  >>> print(instance_norm(x, epsilon=1e-12)[0, :, :, 0])
  [[-1.3416 -0.4472]
   [ 0.4472  1.3416]]
  """
  with jax.named_scope("jaxnorm.instance_norm"):
    x = jnp.asarray(x)
    feat = canonicalize_axes(feature_axes, x.ndim, name="feature_axes")
    if 0 in feat:
      raise ValueError(
        f"feature_axes={feature_axes!r} includes axis 0, the batch axis of InstanceNorm, for "
        f"an input of shape {x.shape}; channels go at -1 (NHWC) or 1 (NCHW)."
      )
    red = tuple(a for a in range(1, x.ndim) if a not in feat)
    y, _ = _norm(
      x,
      red,
      feat,
      scale,
      bias,
      epsilon=epsilon,
      **_shared(mask, axis_name, axis_index_groups, dtype, force_float32_reductions),
    )
    return y


def channel_axis(feature_axis: Any, ndim: int) -> int:
  """GroupNorm's one channel axis, non-negative; a sequence of several axes is refused
  (the channels of one axis are grouped)."""
  axes = canonicalize_axes(feature_axis, ndim, name="feature_axis")
  if len(axes) != 1:
    raise ValueError(
      f"GroupNorm groups the channels of one axis, but got feature_axis={feature_axis!r} "
      f"({len(axes)} axes); pass a single int, e.g. feature_axis=-1 (NHWC) or 1 (NCHW)."
    )
  return axes[0]


def resolve_groups(channels: int, num_groups: int | None, group_size: int | None) -> int:
  """Returns the number of groups from exactly one of ``num_groups`` and ``group_size``."""
  if (num_groups is None) == (group_size is None):
    raise ValueError(
      f"GroupNorm needs exactly one of num_groups and group_size, got num_groups={num_groups}"
      f" and group_size={group_size}; to give group_size pass num_groups=None as well "
      f"(num_groups defaults to 32)."
    )
  if group_size is not None:
    if group_size <= 0 or channels % group_size:
      raise ValueError(
        f"group_size={group_size} does not divide the {channels} channels; choose a "
        f"divisor of {channels} (e.g. {_divisors(channels)})."
      )
    return channels // group_size or 1  # no channels: one empty group
  assert num_groups is not None  # (exactly one of the two is given, checked above)
  if num_groups <= 0 or channels % num_groups:
    raise ValueError(
      f"num_groups={num_groups} does not divide the {channels} channels; choose a "
      f"divisor of {channels} (e.g. {_divisors(channels)})."
    )
  return num_groups


def _divisors(n: int) -> list[int]:
  return [d for d in range(1, n + 1) if n % d == 0][:12]


def group_norm(
  x: jax.Array,
  scale: jax.Array | None = None,
  bias: jax.Array | None = None,
  *,
  num_groups: int | None = 32,
  group_size: int | None = None,
  feature_axis: int = -1,
  reduction_axes: Axes | None = None,
  epsilon: float = 1e-6,
  mask: jax.Array | None = None,
  axis_name: Any = None,
  axis_index_groups: Any = None,
  dtype: Any = None,
  force_float32_reductions: bool = True,
) -> jax.Array:
  """Group normalization (Wu & He 2018): statistics per (sample, group of channels).

  The channels along ``feature_axis`` are split into ``num_groups`` contiguous groups (or
  groups of ``group_size``); statistics run over each group and the other
  ``reduction_axes``. ``num_groups=1`` is LayerNorm over ``(H, W, C)``; one channel per
  group is InstanceNorm. ``feature_axis=1`` handles channels-first (NCHW) data.

  Args:
    x: the input, batch first.
    scale: optional ``γ`` of shape ``(C,)``.
    bias: optional ``β`` of shape ``(C,)``.
    num_groups: the number of groups (default 32, Flax's); None if ``group_size`` is given.
    group_size: channels per group, instead of ``num_groups``.
    feature_axis: the channel axis (default -1, channels-last).
    reduction_axes: axes of the statistics; must include ``feature_axis`` (default: all
      axes but the leading batch axis).
    epsilon: constant >= 0 (Flax's default 1e-6).
    mask: optional boolean mask broadcastable to ``x`` (see :func:`normalize`).
    axis_name: optional mapped axis to combine statistics across.
    axis_index_groups: optional index groups along ``axis_name``.
    dtype: output dtype and minimum statistics dtype (default: inferred as in Flax).
    force_float32_reductions: compute statistics in at least float32.

  Returns:
    The normalized array, of ``x``'s shape.

  >>> x = jnp.array([[1., 2., 3., 10., 20., 30.]])
  >>> print(group_norm(x, num_groups=2, epsilon=1e-12))
  [[-1.2247  0.      1.2247 -1.2247  0.      1.2247]]
  """
  with jax.named_scope("jaxnorm.group_norm"):
    x = jnp.asarray(x)
    f = channel_axis(feature_axis, x.ndim)
    if reduction_axes is None:
      red = tuple(range(1, x.ndim))
    else:
      red = canonicalize_axes(reduction_axes, x.ndim, name="reduction_axes")
    if f not in red:
      raise ValueError(
        f"reduction_axes {red} must include the channel axis {f} (feature_axis="
        f"{feature_axis}) of an input of shape {x.shape}: GroupNorm reduces over groups "
        f"of channels; add {f} to reduction_axes or set feature_axis to the channel axis."
      )
    groups = resolve_groups(x.shape[f], num_groups, group_size)
    y, _ = _norm(
      x,
      tuple(a for a in red if a != f),
      (f,),
      scale,
      bias,
      epsilon=epsilon,
      channel_groups=(f, groups),
      **_shared(mask, axis_name, axis_index_groups, dtype, force_float32_reductions),
    )
    return y


def batch_norm_axes(
  ndim: int, feature_axes: tuple[int, ...], reduction_axes: Axes | None
) -> tuple[int, ...]:
  """BatchNorm's reduction axes: ``reduction_axes`` checked against the feature axes, or
  every non-feature axis when None."""
  if reduction_axes is None:
    return complement(feature_axes, ndim)
  red = canonicalize_axes(reduction_axes, ndim, name="reduction_axes")
  if set(red) & set(feature_axes):
    raise ValueError(
      f"reduction_axes {red} overlap the feature axis {feature_axes} of a rank-{ndim} "
      f"input; statistics are per feature, so reduce over the other axes only."
    )
  return red


def batch_norm(
  x: jax.Array,
  scale: jax.Array | None = None,
  bias: jax.Array | None = None,
  *,
  mean: jax.Array | None = None,
  var: jax.Array | None = None,
  axis: Axes = -1,
  reduction_axes: Axes | None = None,
  epsilon: float = 1e-5,
  mask: jax.Array | None = None,
  axis_name: Any = None,
  axis_index_groups: Any = None,
  dtype: Any = None,
  force_float32_reductions: bool = True,
  virtual_batch_size: int | None = None,
) -> jax.Array | tuple[jax.Array, Moments]:
  """Batch normalization (Ioffe & Szegedy 2015): statistics per feature over the batch.

  Training (``mean`` and ``var`` not given): normalizes with the batch statistics over
  ``reduction_axes`` (default: every axis but ``axis``) and returns ``(y, moments)``, the
  batch :class:`Moments` to feed :func:`update_running_average`. Inference (``mean`` and
  ``var`` given, e.g. running averages): normalizes with them and returns ``y`` only.

  Args:
    x: the input, e.g. ``(N, H, W, C)`` or ``(B, T, D)``.
    scale: optional ``γ`` of the feature shape ``[x.shape[a] for a in axis]``.
    bias: optional ``β`` of the feature shape.
    mean: statistics to use instead of the batch's, of the statistics' shape (the shape of
      ``x`` without ``reduction_axes``).
    var: the variance to go with ``mean``.
    axis: the feature axis or axes (default -1).
    reduction_axes: axes of the statistics (default: all axes not in ``axis``). For a
      sequence ``(B, T, D)``, ``reduction_axes=0`` keeps statistics per time step and feature.
    epsilon: constant >= 0 added to the variance (default 1e-5).
    mask: optional boolean mask broadcastable to ``x`` (see :func:`normalize`).
    axis_name: optional mapped axis to combine statistics across (count-weighted).
    axis_index_groups: optional index groups along ``axis_name``.
    dtype: output dtype and minimum statistics dtype (default: inferred as in Flax).
    force_float32_reductions: compute statistics in at least float32.
    virtual_batch_size: in training, normalize each consecutive sub-batch of this many
      examples along the batch axis (the first of ``reduction_axes``) with its own
      statistics ("ghost" batches, Hoffer et al. 2017); sub-batches stay on their device.
      The returned moments are then the means of the sub-batch means and variances over
      every sub-batch (and device), weighted by their valid counts: what the running
      averages follow. Ignored at inference.

  Returns:
    ``(y, Moments)`` when training, ``y`` with given statistics.

  Raises:
    ValueError: in training with a single value per statistic (the variance would be 0
      and the output just ``β``), with only one of ``mean`` and ``var``, with statistics
      or parameters of the wrong shape, or with a ``virtual_batch_size`` that does not
      divide the batch.

  >>> x = jnp.array([[1., 10.], [3., 30.]])
  >>> y, stats = batch_norm(x, epsilon=1e-12)
  >>> y.tolist(), stats.mean.tolist(), stats.var.tolist()
  ([[-1.0, -1.0], [1.0, 1.0]], [2.0, 20.0], [1.0, 100.0])
  """
  with jax.named_scope("jaxnorm.batch_norm"):
    x = jnp.asarray(x)
    feat = canonicalize_axes(axis, x.ndim, name="axis")
    red = batch_norm_axes(x.ndim, feat, reduction_axes)
    common = dict(epsilon=epsilon, dtype=dtype, force_float32_reductions=force_float32_reductions)
    if (mean is None) != (var is None):
      raise ValueError(
        "batch_norm got only one of mean and var; pass both (inference with given "
        "statistics) or neither (training with the batch's statistics)."
      )
    if mean is not None:
      return batch_norm_eval(x, scale, bias, mean, var, feat, red, **common)
    if virtual_batch_size is not None:
      return virtual_batch_train(
        x, scale, bias, feat, red, virtual_batch_size, mask, axis_name, axis_index_groups, **common
      )
    check_batch_values(x.shape, red, axis_name)
    return batch_norm_train(
      x,
      scale,
      bias,
      feat,
      red,
      mask=mask,
      axis_name=axis_name,
      axis_index_groups=axis_index_groups,
      **common,
    )


def virtual_batch_train(
  x, scale, bias, feat, red, k, mask, axis_name, axis_index_groups, unbiased=False, **kw
):
  """Training BatchNorm on sub-batches of ``k`` examples (see :mod:`jaxnorm._virtual`);
  ``unbiased``: the returned variance averages the sub-batches' unbiased variances."""
  k = check_virtual_batch_size(k, x.shape[red[0]], red[0])
  if sub_batch_examples(x.shape, red, k) == 1:
    raise ValueError(
      f"virtual_batch_size={k} leaves one value per statistic in each sub-batch of an "
      f"input of shape {x.shape} reduced over axes {red} (the variance would be 0); use "
      f"virtual_batch_size >= 2."
    )
  xs, ms, feat_s, red_s, b = split_batch(x, mask, feat, red, k)
  y, stats = batch_norm_train(xs, scale, bias, feat_s, red_s, mask=ms, **kw)
  group_axis = sum(1 for a in range(b) if a not in red_s)  # among the kept axes
  return y.reshape(x.shape), combine(stats, group_axis, axis_name, axis_index_groups, unbiased)


def batch_norm_eval(
  x: jax.Array,
  scale: jax.Array | None,
  bias: jax.Array | None,
  mean: Any,
  var: Any,
  feat: tuple[int, ...],
  red: tuple[int, ...],
  *,
  epsilon: float,
  dtype: Any,
  force_float32_reductions: bool,
) -> jax.Array:
  """BatchNorm with given statistics (axes already canonical): checks their shapes, then
  ``γ·(x − mean)/sqrt(var + ε) + β``."""
  cdt = compute_dtype(x, scale, bias, mean, dtype=dtype, force_float32=force_float32_reductions)
  given_mean, given_var = given_stats(x.shape, red, mean, var, cdt)
  gamma, beta = _params(scale, bias, x.shape, feat, cdt)
  y = apply_moments(x.astype(cdt), given_mean, given_var, gamma, beta, epsilon=epsilon)
  complex_mean = mean if jnp.iscomplexobj(mean) else None  # a real mean is not promoted with
  return y.astype(output_dtype(x, scale, bias, complex_mean, dtype=dtype))  # (Flax's rule)


def check_batch_values(
  x_shape: tuple[int, ...], red: tuple[int, ...], axis_name: Any, name: str = "batch_norm"
) -> None:
  """Raises if training statistics would have one value each (on one device)."""
  if math.prod(x_shape[a] for a in red) == 1 and axis_name is None:
    raise ValueError(
      f"{name} in training needs more than one value per statistic, but an input of "
      f"shape {x_shape} reduced over axes {red} has 1 (the variance would be 0 and the "
      f"output would be just the bias). Use a batch larger than 1, normalize with running "
      f"statistics (use_running_average=True), or use LayerNorm/GroupNorm."
    )


def given_stats(
  x_shape: tuple[int, ...], red: tuple[int, ...], mean: Any, var: Any, dtype: Any
) -> list[jax.Array]:
  """``mean`` and ``var`` checked against the statistics' shape of an ``x_shape`` input
  reduced over ``red``, cast to ``dtype`` and reshaped to broadcast against ``x``."""
  stats_shape = kept_shape(x_shape, red)
  bshape = tuple(1 if a in red else d for a, d in enumerate(x_shape))
  stats = []
  for name, s in (("mean", mean), ("var", var)):
    s = jnp.asarray(s)
    if s.shape != stats_shape:
      raise ValueError(
        f"{name} has shape {s.shape}, but the statistics of an input of shape {x_shape} "
        f"reduced over {red} have shape {stats_shape}; pass running statistics of that "
        f"shape (were they made with another axis or input layout?)."
      )
    stats.append(cast(s, dtype).reshape(bshape))
  return stats


def batch_norm_train(
  x: jax.Array,
  scale: jax.Array | None,
  bias: jax.Array | None,
  feat: tuple[int, ...],
  red: tuple[int, ...],
  **kw: Any,
) -> tuple[jax.Array, Moments]:
  """BatchNorm with the batch's statistics (axes already canonical; no batch-size check):
  ``(y, Moments)`` with the moments squeezed to the statistics' shape."""
  y, stats = _norm(x, red, feat, scale, bias, **kw)
  return y, Moments(*(jnp.squeeze(s, red) for s in stats))
