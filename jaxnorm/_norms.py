"""The norms with per-sample statistics: ``normalize``, LayerNorm, RMSNorm, InstanceNorm,
GroupNorm and Add & Norm, as pure functions.

Each function chooses its axes, builds its configuration record (``_config.Config``)
once and calls the kernel (``_engine.affine_normalize``, the router), which normalizes and applies
``y = γ·x̂ + β``. Statistics are computed in at least float32; the output dtype follows
Flax: ``dtype`` if given, else the promotion of the input's and the parameters' dtypes.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from flax import nnx

from jaxnorm._axes import (
  Axes,
  canonicalize_axes,
  group_norm_axes,
  instance_norm_axes,
  statistics_axes,
)
from jaxnorm._config import Config, configure, options
from jaxnorm._dtypes import output_dtype, promote
from jaxnorm._engine import (
  Moments,
  affine_normalize,
  affine_params,
  broadcast_mask,
  check_implementation,
  group_moments,
  kernel_misfit,
  normalize_rows,
  rough_row_mean,
  use_kernels,
)


def zero_centered_init(init: Any) -> Any:
  """The initializer of a zero-centred scale (``y = (1 + γ)·x̂``): ``init(...) − 1``, so
  that the effective scale starts where ``init`` puts it (RMSNorm's
  ``zero_centered_scale``, Gemma-style)."""

  def zero_centered(key, shape, dtype=jnp.float32):
    value = init(key, shape, dtype)
    # Partitioned inits (nn.with_logical_partitioning, nnx.with_partitioning) return boxed
    # values: shift what is inside and keep the box, sharding names and all.
    if isinstance(value, nn.meta.AxisMetadata):
      return value.replace_boxed(value.unbox() - 1)
    if isinstance(value, nnx.VariableMetadata):
      return dataclasses.replace(value, raw_value=value.raw_value - 1)
    return value - 1

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
    axes = statistics_axes(axes, x.ndim)
    cfg = configure(
      x, axes, (), center=center, axis_name=axis_name, axis_index_groups=axis_index_groups
    )
    if scale:
      y, _ = affine_normalize(x, None, None, cfg, epsilon=epsilon, mask=mask)
    elif center:
      y = _subtract_mean(x.astype(cfg.dtype), mask, cfg)
    else:
      y = x.astype(cfg.dtype)
    return y.astype(cfg.out_dtype)


@functools.partial(jax.jit, static_argnums=(2,))
def _subtract_mean(x, mask, cfg):
  """Mean-only normalization ``x − mean(x)`` (compiled once per shape, as the kernel)."""
  if mask is not None:
    mask = broadcast_mask(mask, x.shape)
  return x - group_moments(x, mask, cfg).mean


def _norm(
  x: jax.Array,
  scale: Any,
  bias: Any,
  cfg: Config,
  epsilon: Any,
  mask: Any,
  zero_centered_scale: bool = False,
  about: Any = None,
) -> tuple[jax.Array, Moments]:
  """The body of every per-sample norm: the parameters checked and shaped, then the kernel."""
  gamma, beta = _affine_params(scale, bias, x.shape, cfg, zero_centered_scale, shaped=False)
  return affine_normalize(x, gamma, beta, cfg, epsilon=epsilon, mask=mask, about=about)


def _affine_params(
  scale: Any,
  bias: Any,
  shape: tuple[int, ...],
  cfg: Config,
  zero_centered_scale: bool,
  shaped: bool = True,
) -> tuple[jax.Array | None, jax.Array | None]:
  """``(γ, β)`` checked and shaped (``affine_params``), γ as ``1 + γ`` when zero-centred."""
  gamma, beta = affine_params(scale, bias, shape, cfg, shaped)
  if gamma is not None and zero_centered_scale:
    gamma = 1 + gamma
  return gamma, beta


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
  implementation: str | None = None,
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
    implementation: ``"xla"``, ``"pallas"`` (the fused row kernels: reduced axes trailing
      and equal to the feature axes, float32 statistics, one device, first derivatives;
      on CPU they run in Pallas's interpreter, for tests) or None (today: XLA; see
      ``docs/speed.md``).

  Returns:
    The normalized array, of ``x``'s shape.

  >>> y = layer_norm(jnp.array([[1., 2., 3., 4.]]), jnp.full(4, 2.), jnp.ones(4))
  >>> print(y)
  [[-1.6833  0.1056  1.8944  3.6833]]
  """
  with jax.named_scope("jaxnorm.layer_norm"):
    opts = options(dtype, force_float32_reductions, axis_name, axis_index_groups)
    return _trailing_norm(
      x, None, scale, bias, reduction_axes=reduction_axes, feature_axes=feature_axes,
      epsilon=epsilon, mask=mask, implementation=implementation, **opts,
    )[0]  # fmt: skip


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
  implementation: str | None = None,
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
    implementation: ``"xla"``, ``"pallas"`` or None (see :func:`layer_norm`).

  Returns:
    The normalized array, of ``x``'s shape.

  >>> print(rms_norm(jnp.array([[1., 2., 3., 4.]]), epsilon=1e-12))
  [[0.3651 0.7303 1.0954 1.4606]]
  """
  with jax.named_scope("jaxnorm.rms_norm"):
    opts = options(dtype, force_float32_reductions, axis_name, axis_index_groups)
    return _trailing_norm(
      x, None, scale, bias, reduction_axes=reduction_axes, feature_axes=feature_axes,
      epsilon=epsilon, mask=mask, implementation=implementation, center=False,
      epsilon_in_root=epsilon_in_root, zero_centered_scale=zero_centered_scale, **opts,
    )[0]  # fmt: skip


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
  implementation: str | None = None,
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
    axis_name, axis_index_groups, dtype, force_float32_reductions, implementation: as in
      :func:`layer_norm` (``"pallas"`` adds, normalizes and, backwards, sums both
      cotangents in one kernel each way).
    residual_dtype: the dtype of ``h`` (default: ``x``'s and ``residual``'s promoted).

  Returns:
    ``(y, h)``.

  >>> y, h = add_layer_norm(jnp.array([[1., 2.]]), jnp.array([[2., 5.]]), epsilon=1e-12)
  >>> y.tolist(), h.tolist()
  ([[-1.0, 1.0]], [[3.0, 7.0]])
  """
  opts = options(dtype, force_float32_reductions, axis_name, axis_index_groups)
  y, h = _trailing_norm(
    x, residual, scale, bias, residual_dtype=residual_dtype, reduction_axes=reduction_axes,
    feature_axes=feature_axes, epsilon=epsilon, mask=mask, implementation=implementation,
    **opts,
  )  # fmt: skip
  return y, jnp.asarray(h)


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
  implementation: str | None = None,
) -> tuple[jax.Array, jax.Array]:
  """Add & RMSNorm: ``h = x + residual`` and ``y = rms_norm(h)``, returned as ``(y, h)``
  (see :func:`add_layer_norm`; the other arguments as in :func:`rms_norm`).

  >>> y, h = add_rms_norm(jnp.array([[1., 2.]]), jnp.array([[2., 2.]]), epsilon=1e-12)
  >>> print(y, h)  # RMS of [3, 4] is sqrt(12.5)
  [[0.8485 1.1314]] [[3. 4.]]
  """
  opts = options(dtype, force_float32_reductions, axis_name, axis_index_groups)
  y, h = _trailing_norm(
    x, residual, scale, bias, residual_dtype=residual_dtype, reduction_axes=reduction_axes,
    feature_axes=feature_axes, epsilon=epsilon, mask=mask, implementation=implementation,
    center=False, epsilon_in_root=epsilon_in_root, zero_centered_scale=zero_centered_scale,
    **opts,
  )  # fmt: skip
  return y, jnp.asarray(h)


def _trailing_norm(
  x: Any,
  residual: Any,
  scale: Any,
  bias: Any,
  *,
  reduction_axes: Axes,
  feature_axes: Axes,
  epsilon: Any,
  mask: Any,
  implementation: Any,
  residual_dtype: Any = None,
  zero_centered_scale: bool = False,
  **settings: Any,
) -> tuple[jax.Array, jax.Array | None]:
  """The body of LayerNorm and RMSNorm, with (Add & Norm) or without a residual: ``(y, h)``
  (``h`` None without). ``settings`` are :func:`~jaxnorm._config.configure`'s keywords (the
  dtypes, devices, ``center``, ``epsilon_in_root``); the row kernels run where asked and
  applicable."""
  check_implementation(implementation)
  x = jnp.asarray(x)
  h_dtype = None
  if residual is not None:
    h_dtype = residual_sum_dtype(x, residual, residual_dtype)
  normalized = x if residual is None else jnp.zeros((), h_dtype)  # (configure reads dtypes)
  reduced = statistics_axes(reduction_axes, x.ndim, name="reduction_axes")
  features = canonicalize_axes(feature_axes, x.ndim, name="feature_axes")
  cfg = configure(normalized, reduced, features, scale, bias, **settings)
  if residual is not None:  # y in the dtype the norm of x would have (Flax's rule)
    cfg = cfg._replace(out_dtype=output_dtype(x, scale, bias, dtype=settings["dtype"]))
  row = math.prod(x.shape[a] for a in cfg.axes)
  if use_kernels(implementation, kernel_misfit(x, cfg, scale, bias), row):
    gamma, beta = _affine_params(scale, bias, x.shape, cfg, zero_centered_scale)
    return normalize_rows(x, gamma, beta, cfg, epsilon=epsilon, mask=mask, residual=residual,
                          residual_dtype=h_dtype)  # fmt: skip
  if residual is None:
    return _norm(x, scale, bias, cfg, epsilon, mask, zero_centered_scale)[0], None
  h = residual_sum(x, residual, h_dtype)
  about = None
  if cfg.center and mask is None and not jnp.issubdtype(h.dtype, jnp.complexfloating):
    about = rough_row_mean(x, jnp.asarray(residual), cfg.axes, promote(cfg.dtype, jnp.float32))
  return _norm(h, scale, bias, cfg, epsilon, mask, zero_centered_scale, about)[0], h


def residual_sum(x: Any, residual: Any, residual_dtype: Any = None) -> jax.Array:
  """``x + residual`` in ``residual_dtype`` (default: their promoted dtype), for Add & Norm;
  a clear error when the shapes differ."""
  x, residual = jnp.asarray(x), jnp.asarray(residual)
  dt = residual_sum_dtype(x, residual, residual_dtype)
  return x.astype(dt) + residual.astype(dt)


def residual_sum_dtype(x: Any, residual: Any, residual_dtype: Any = None) -> np.dtype:
  """The dtype of ``h = x + residual``: ``residual_dtype``, else the promoted dtype; a
  clear error when the shapes differ."""
  x, residual = jnp.asarray(x), jnp.asarray(residual)
  if x.shape != residual.shape:
    raise ValueError(
      f"Add & Norm adds x of shape {x.shape} to a residual of shape {residual.shape}; they "
      f"must have the same shape (the residual stream is the block's input, x its "
      f"sublayer's output)."
    )
  return promote(x.dtype, residual.dtype) if residual_dtype is None else jnp.dtype(residual_dtype)


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
    features, reduced = instance_norm_axes(x.ndim, feature_axes)
    opts = options(dtype, force_float32_reductions, axis_name, axis_index_groups)
    cfg = configure(x, reduced, features, scale, bias, **opts)
    return _norm(x, scale, bias, cfg, epsilon, mask)[0]


def resolve_groups(channels: int, num_groups: int | None, group_size: int | None) -> int:
  """Returns the number of groups from exactly one of ``num_groups`` and ``group_size``."""
  for name, value in (("num_groups", num_groups), ("group_size", group_size)):
    if value is not None and (
      isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer)
    ):
      raise TypeError(
        f"{name} must be an int, got {value!r} (a {type(value).__name__}); pass e.g. {name}=32."
      )
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
    f, reduced = group_norm_axes(x.ndim, feature_axis, reduction_axes)
    groups = resolve_groups(x.shape[f], num_groups, group_size)
    opts = options(dtype, force_float32_reductions, axis_name, axis_index_groups)
    cfg = configure(x, reduced, (f,), scale, bias, channel_groups=(f, groups), **opts)
    return _norm(x, scale, bias, cfg, epsilon, mask)[0]
