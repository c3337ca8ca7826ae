"""Adaptive (conditional) norms: a norm without its own affine, then a shift and scale that
come from a conditioning input, per sample.

``modulate`` is the one piece: ``x·(1 + scale) + shift`` (DiT's form; FiLM's ``scale·x +
shift`` with ``zero_centered_scale=False``). AdaLN and modulated RMSNorm are
:func:`~jaxnorm.layer_norm`/:func:`~jaxnorm.rms_norm` without parameters followed by it,
AdaIN is InstanceNorm followed by the style's statistics, conditional BatchNorm is
BatchNorm's step followed by per-class parameters; ``gated_residual`` is AdaLN-Zero's gate.
The normalized ``x̂`` stays in the statistics' dtype (float32 for half-precision inputs)
until the modulation is applied, so ``1 + scale`` of a small bfloat16 scale is not rounded
away (TransformerEngine#789) and the output is rounded once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxnorm._axes import (
  Axes,
  broadcast_shape,
  canonicalize_axes,
  instance_norm_axes,
  statistics_axes,
)
from jaxnorm._batch import batch_config, check_step, step, training
from jaxnorm._config import configure, options
from jaxnorm._dtypes import accumulation_dtype, output_dtype, reduction_dtype
from jaxnorm._engine import affine_normalize, check_epsilon, concrete_value, inverse_std, moments


def conditioning(
  name: str, value: Any, shape: tuple[int, ...], features: tuple[int, ...], dtype: Any
) -> jax.Array:
  """A shift, scale or gate shaped to broadcast against an input of ``shape``: one value
  per (sample, feature) — ``(batch, *feature shape)``, the output of a conditioning
  projection —, one per feature, or an array of the input's rank that broadcasts to it.

  A per-sample value is never aligned by NumPy's trailing rule: ``(B, D)`` against
  ``(B, T, D)`` would pair ``B`` with ``T``."""
  value = jnp.asarray(value)
  feature_shape = tuple(shape[a] for a in features)
  if value.ndim == len(shape):
    try:
      np.broadcast_shapes(value.shape, shape)
    except ValueError:
      pass
    else:
      return value.astype(dtype)
  elif value.shape == feature_shape:
    return value.reshape(broadcast_shape(shape, features)).astype(dtype)
  elif value.shape == (shape[0], *feature_shape) and 0 not in features:
    return value.reshape(broadcast_shape(shape, (0, *features))).astype(dtype)
  raise ValueError(
    f"{name} has shape {value.shape}, which does not fit an input of shape {shape} with "
    f"features {feature_shape} along feature_axes {features}: pass one value per sample "
    f"and feature, shape {(shape[0], *feature_shape)} (a conditioning projection's "
    f"output), one per feature, shape {feature_shape}, or an array of rank {len(shape)} "
    f"that broadcasts to the input (e.g. {name}[:, None, :] for tokens)."
  )


def _features(x: jax.Array, feature_axes: Axes) -> tuple[int, ...]:
  return canonicalize_axes(feature_axes, x.ndim, name="feature_axes")


def modulate(
  x: jax.Array,
  shift: jax.Array | None = None,
  scale: jax.Array | None = None,
  *,
  feature_axes: Axes = -1,
  zero_centered_scale: bool = True,
  dtype: Any = None,
) -> jax.Array:
  """Feature-wise modulation: ``y = x·(1 + scale) + shift`` (DiT's ``modulate``), or
  ``x·scale + shift`` (FiLM, Perez et al. 2018) with ``zero_centered_scale=False``.

  ``shift`` and ``scale`` are usually per sample, shape ``(batch, *features)`` (a
  conditioning projection's output); they are broadcast over the other axes (tokens,
  pixels). One value per feature, or any array of ``x``'s rank that broadcasts to it, is
  accepted too. Computed in at least float32, rounded once.

  Args:
    x: the input, batch first (for per-sample values).
    shift: the additive term, or None.
    scale: the multiplicative term, or None.
    feature_axes: the axes ``shift`` and ``scale`` run along (default -1).
    zero_centered_scale: multiply by ``1 + scale`` (default, DiT's: a zero scale is the
      identity, so a zero-initialised projection starts as the plain norm).
    dtype: the output dtype (default: the promotion of ``x``'s, ``shift``'s and ``scale``'s).

  Returns:
    An array of ``x``'s shape.

  >>> x = jnp.ones((2, 3, 4))                           # (B, T, D)
  >>> shift, scale = jnp.zeros((2, 4)), jnp.full((2, 4), 0.5)
  >>> modulate(x, shift, scale).shape, float(modulate(x, shift, scale)[0, 0, 0])
  ((2, 3, 4), 1.5)
  """
  with jax.named_scope("jaxnorm.modulate"):
    x = jnp.asarray(x)
    out = output_dtype(x, shift, scale, dtype=dtype)
    return _modulated(x, shift, scale, _features(x, feature_axes), zero_centered_scale, out)


def _modulated(x, shift, scale, features, zero_centered, out):
  """:func:`modulate` on canonical axes, computed in at least ``x``'s dtype and float32."""
  compute = accumulation_dtype(x.dtype)
  y = x.astype(compute)
  if scale is not None:
    s = conditioning("scale", scale, x.shape, features, compute)
    y = y + y * s if zero_centered else y * s
  if shift is not None:
    y = y + conditioning("shift", shift, x.shape, features, compute)
  return y.astype(out)


def gated_residual(
  residual: jax.Array,
  update: jax.Array,
  gate: jax.Array | None,
  *,
  feature_axes: Axes = -1,
  dtype: Any = None,
) -> jax.Array:
  """AdaLN-Zero's residual gate: ``residual + gate·update`` (DiT, Peebles & Xie 2023).

  ``gate`` comes from the same zero-initialised projection as the shift and scale, so every
  block starts as the identity. Shapes as in :func:`modulate`; None adds ``update``
  ungated.

  Args:
    residual: the residual stream.
    update: the sublayer's output, of ``residual``'s shape.
    gate: per sample ``(batch, *features)``, per feature, or broadcastable; or None.
    feature_axes: the axes ``gate`` runs along (default -1).
    dtype: the output dtype (default: the promotion of the three).

  Returns:
    ``residual + gate·update``, of ``residual``'s shape.

  >>> print(gated_residual(jnp.ones((1, 2, 2)), jnp.ones((1, 2, 2)), jnp.array([[0., 2.]])))
  [[[1. 3.]
    [1. 3.]]]
  """
  residual, update = jnp.asarray(residual), jnp.asarray(update)
  if residual.shape != update.shape:
    raise ValueError(
      f"gated_residual adds an update of shape {update.shape} to a residual of shape "
      f"{residual.shape}; they must have the same shape (the update is the sublayer's "
      f"output on the residual stream)."
    )
  out = output_dtype(residual, update, gate, dtype=dtype)
  features = _features(update, feature_axes)
  if gate is None:
    return residual.astype(out) + update.astype(out)
  return residual.astype(out) + _modulated(update, None, gate, features, False, out)


def _adaptive(x: Any, shift: Any, scale: Any, feature_axes: Axes, settings: dict) -> jax.Array:
  """The norm's kernel with ``1 + scale`` and ``shift`` as its per-sample ``γ``, ``β``
  (computed in the statistics' dtype): one fused pass, as the norm with parameters (a
  separate modulation wrote ``x̂`` out and read it again on XLA:CPU,
  ``benchmarks/RESULTS.md``, item 42)."""
  x = jnp.asarray(x)
  features = _features(x, feature_axes)
  reduced = statistics_axes(settings.pop("reduction_axes"), x.ndim, name="reduction_axes")
  epsilon, mask = settings.pop("epsilon"), settings.pop("mask")
  cfg = configure(x, reduced, features, shift, scale, **settings)
  gamma = None if scale is None else 1 + conditioning("scale", scale, x.shape, features, cfg.dtype)
  beta = None if shift is None else conditioning("shift", shift, x.shape, features, cfg.dtype)
  return affine_normalize(x, gamma, beta, cfg, epsilon=epsilon, mask=mask)[0]


def adaptive_layer_norm(
  x: jax.Array,
  shift: jax.Array | None,
  scale: jax.Array | None,
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
  """Adaptive layer normalization (AdaLN, DiT): ``LayerNorm(x)·(1 + scale) + shift``, the
  LayerNorm without learned parameters, ``shift``/``scale`` from the conditioning.

  Args:
    x: the input, batch first, e.g. ``(B, T, D)``.
    shift, scale: per sample ``(B, *features)`` (see :func:`modulate`), or None.
    reduction_axes, feature_axes, epsilon, mask: as in :func:`jaxnorm.layer_norm`.
    axis_name, axis_index_groups, dtype, force_float32_reductions: as in
      :func:`jaxnorm.layer_norm` (the output dtype also promotes with ``shift``, ``scale``).

  Returns:
    An array of ``x``'s shape.

  >>> x = jnp.array([[[1., 2., 3., 4.]]])
  >>> print(adaptive_layer_norm(x, jnp.ones((1, 4)), jnp.ones((1, 4)), epsilon=1e-12))
  [[[-1.6833  0.1056  1.8944  3.6833]]]
  """
  with jax.named_scope("jaxnorm.adaptive_layer_norm"):
    settings = dict(
      reduction_axes=reduction_axes, epsilon=epsilon, mask=mask,
      **options(dtype, force_float32_reductions, axis_name, axis_index_groups),
    )  # fmt: skip
    return _adaptive(x, shift, scale, feature_axes, settings)


def adaptive_rms_norm(
  x: jax.Array,
  shift: jax.Array | None,
  scale: jax.Array | None,
  *,
  reduction_axes: Axes = -1,
  feature_axes: Axes = -1,
  epsilon: float = 1e-6,
  epsilon_in_root: bool = True,
  mask: jax.Array | None = None,
  axis_name: Any = None,
  axis_index_groups: Any = None,
  dtype: Any = None,
  force_float32_reductions: bool = True,
) -> jax.Array:
  """Modulated RMSNorm: ``RMSNorm(x)·(1 + scale) + shift`` (Liger-Kernel's, the RMS form of
  AdaLN), the RMSNorm without learned parameters.

  Args:
    x: the input, batch first.
    shift, scale: per sample ``(B, *features)`` (see :func:`modulate`), or None.
    reduction_axes, feature_axes, epsilon, epsilon_in_root, mask: as in
      :func:`jaxnorm.rms_norm`.
    axis_name, axis_index_groups, dtype, force_float32_reductions: the same.

  Returns:
    An array of ``x``'s shape.

  >>> x = jnp.array([[[1., 2., 3., 4.]]])
  >>> print(adaptive_rms_norm(x, None, jnp.ones((1, 4)), epsilon=1e-12))
  [[[0.7303 1.4606 2.1909 2.9212]]]
  """
  with jax.named_scope("jaxnorm.adaptive_rms_norm"):
    settings = dict(
      reduction_axes=reduction_axes, epsilon=epsilon, mask=mask, epsilon_in_root=epsilon_in_root,
      center=False, **options(dtype, force_float32_reductions, axis_name, axis_index_groups),
    )  # fmt: skip
    return _adaptive(x, shift, scale, feature_axes, settings)


def adaptive_instance_norm(
  content: jax.Array,
  style: jax.Array,
  *,
  feature_axes: Axes = -1,
  epsilon: float = 1e-5,
  mask: jax.Array | None = None,
  style_mask: jax.Array | None = None,
  dtype: Any = None,
) -> jax.Array:
  """Adaptive instance normalization (AdaIN, Huang & Belongie 2017):
  ``σ(style)·(content − μ(content))/σ(content) + μ(style)``.

  Statistics per (sample, channel) over the spatial axes, as :func:`jaxnorm.instance_norm`'s,
  with ``σ = sqrt(var + ε)`` for both inputs (the population variance; the paper's code
  uses PyTorch's unbiased ``var``, larger by ``n/(n − 1)``). The style may have other
  spatial sizes than the content, and a batch of one (one style for every content image).
  Gradients flow into both inputs.

  Args:
    content: the content features, batch first, e.g. ``(N, H, W, C)``.
    style: the style features, same rank and channels, batch ``N`` or 1.
    feature_axes: the channel axes (-1 for NHWC, 1 for NCHW).
    epsilon: constant >= 0 added to both variances (default 1e-5, the paper code's).
    mask: optional boolean mask of the content's valid positions (see :func:`normalize`).
    style_mask: optional boolean mask of the style's valid positions.
    dtype: the output dtype (default: the promotion of the two inputs').

  Returns:
    An array of ``content``'s shape.

  >>> content = jnp.array([[[0.], [2.]]])                 # (N=1, L=2, C=1): μ 1, σ 1
  >>> style = jnp.array([[[10.], [14.]]])                 # μ 12, σ 2
  >>> print(adaptive_instance_norm(content, style, epsilon=0.))
  [[[10.]
    [14.]]]
  """
  with jax.named_scope("jaxnorm.adaptive_instance_norm"):
    content, style = jnp.asarray(content), jnp.asarray(style)
    features, spatial = instance_norm_axes(content.ndim, feature_axes)
    channels = tuple(content.shape[a] for a in features)
    if (
      style.ndim != content.ndim
      or tuple(style.shape[a] for a in features) != channels
      or style.shape[0] not in (1, content.shape[0])
    ):
      raise ValueError(
        f"adaptive_instance_norm: the style (shape {style.shape}) must have the content's "
        f"rank ({content.ndim}) and channels {channels} along feature_axes {features}, and "
        f"a batch of {content.shape[0]} or 1; its spatial sizes may differ (content shape "
        f"{content.shape})."
      )
    eps = check_epsilon(epsilon)
    cfg = configure(content, spatial, features, style, dtype=dtype)
    cfg = cfg._replace(dtype=reduction_dtype(content.dtype, style.dtype))
    s = moments(style, spatial, mask=style_mask, dtype=cfg.dtype, keepdims=True)
    sigma = 1 / inverse_std(s.var, eps)  # the style's, as the content's per-sample γ and β
    return affine_normalize(content, sigma, s.mean, cfg, epsilon=eps, mask=mask)[0]


def modulation(
  condition: jax.Array,
  kernel: jax.Array,
  bias: jax.Array | None,
  chunks: int,
  activation: Callable[[jax.Array], jax.Array] | None = jax.nn.silu,
  dtype: Any = None,
) -> list[jax.Array]:
  """The adaptive norms' conditioning projection: ``activation(c) @ kernel + bias``, split
  into ``chunks`` equal parts along the last axis (DiT's ``shift, scale, gate`` order).

  Args:
    condition: ``c``, ``(batch, condition features)``.
    kernel: ``(condition features, chunks·F)``.
    bias: ``(chunks·F,)`` or None.
    chunks: how many outputs (2: shift and scale; 3: with the gate).
    activation: applied to ``c`` first (DiT's SiLU), or None.
    dtype: the computation dtype (default: the promotion of the three).

  Returns:
    ``chunks`` arrays of shape ``(batch, F)``.
  """
  condition, kernel = jnp.asarray(condition), jnp.asarray(kernel)
  if condition.ndim != 2 or kernel.ndim != 2 or condition.shape[1] != kernel.shape[0]:
    raise ValueError(
      f"the conditioning projection maps a condition of shape (batch, features) with a "
      f"kernel of shape (features, {chunks}·F), got a condition of shape {condition.shape} "
      f"and a kernel of shape {kernel.shape}; flatten the condition to (batch, features) "
      f"(e.g. an embedding of the class and the time step)."
    )
  compute = output_dtype(condition, kernel, bias, dtype=dtype)
  c = condition.astype(compute)
  if activation is not None:
    c = activation(c)
  h = c @ kernel.astype(compute)
  if bias is not None:
    h = h + jnp.asarray(bias).astype(compute)[None]
  return jnp.split(h, chunks, axis=-1)


def adaptive_norm(
  x: jax.Array,
  condition: jax.Array,
  kernel: jax.Array,
  bias: jax.Array | None,
  *,
  rms: bool = False,
  use_gate: bool = True,
  activation: Callable[[jax.Array], jax.Array] | None = jax.nn.silu,
  reduction_axes: Axes = -1,
  feature_axes: Axes = -1,
  epsilon: float = 1e-6,
  mask: jax.Array | None = None,
  axis_name: Any = None,
  axis_index_groups: Any = None,
  dtype: Any = None,
  force_float32_reductions: bool = True,
) -> jax.Array | tuple[jax.Array, jax.Array]:
  """AdaLN-Zero's layer, as a pure function: the conditioning projection
  (:func:`modulation`), then :func:`adaptive_layer_norm` (or :func:`adaptive_rms_norm` with
  ``rms=True``): ``(y, gate)`` with ``use_gate``, else ``y``.

  Args:
    x: the input, batch first.
    condition: ``(batch, condition features)``.
    kernel: ``(condition features, chunks·F)`` with ``F`` the number of features and
      ``chunks`` 3 with the gate, 2 without (outputs in DiT's order: shift, scale, gate).
    bias: ``(chunks·F,)`` or None.
    rms: modulate an RMSNorm instead of a LayerNorm.
    use_gate: also return the gate, ``(batch, *features)``, for :func:`gated_residual`.
    activation: applied to the condition before the projection (DiT's SiLU), or None.
    reduction_axes, feature_axes, epsilon, mask: as in :func:`adaptive_layer_norm`.
    axis_name, axis_index_groups, dtype, force_float32_reductions: the same (``dtype`` is
      also the projection's computation dtype).

  Returns:
    ``(y, gate)`` or ``y``.
  """
  x = jnp.asarray(x)
  features = _features(x, feature_axes)
  feature_shape = tuple(x.shape[a] for a in features)
  chunks = 3 if use_gate else 2
  width = int(np.prod(feature_shape))
  if jnp.ndim(kernel) != 2 or jnp.shape(kernel)[1] != chunks * width:
    raise ValueError(
      f"the conditioning kernel must have shape (condition features, {chunks}·{width}) "
      f"({chunks} outputs — shift, scale{', gate' if use_gate else ''} — of the {width} "
      f"features of an input of shape {x.shape}), got {jnp.shape(kernel)}."
    )
  parts = modulation(condition, kernel, bias, chunks, activation, dtype=dtype)
  if parts[0].shape[0] != x.shape[0]:
    raise ValueError(
      f"the condition has a batch of {parts[0].shape[0]} but the input {x.shape[0]} (shape "
      f"{x.shape}); pass one condition per sample."
    )
  shift, scale, *gate = (p.reshape(p.shape[0], *feature_shape) for p in parts)
  norm = adaptive_rms_norm if rms else adaptive_layer_norm
  y = norm(
    x, shift, scale, reduction_axes=reduction_axes, feature_axes=features, epsilon=epsilon,
    mask=mask, axis_name=axis_name, axis_index_groups=axis_index_groups, dtype=dtype,
    force_float32_reductions=force_float32_reductions,
  )  # fmt: skip
  return (y, gate[0]) if use_gate else y


def class_parameters(name: str, table: Any, labels: Any) -> jax.Array:
  """Rows of a per-class ``table`` (``(classes, *features)``) for ``labels``: integer class
  indices ``(batch,)``, or class weights ``(batch, classes)`` (a mixture of classes, e.g.
  one-hot or interpolated). A concrete index out of range is an error; a traced one gives
  NaN (never another class's parameters)."""
  table, labels = jnp.asarray(table), jnp.asarray(labels)
  classes = table.shape[0]
  if jnp.issubdtype(labels.dtype, jnp.integer) and labels.ndim == 1:
    value = concrete_value(labels)
    if value is not None and value.size and not (0 <= value.min() and value.max() < classes):
      raise ValueError(
        f"class labels must lie in [0, {classes}) for a {name} of {classes} classes, got "
        f"labels from {value.min()} to {value.max()}."
      )
    return jnp.take(table, labels, axis=0, mode="fill", fill_value=jnp.nan)
  if jnp.issubdtype(labels.dtype, jnp.inexact) and labels.ndim == 2 and labels.shape[1] == classes:
    flat = table.reshape(classes, -1)
    mixed = labels.astype(flat.dtype) @ flat
    return mixed.reshape(labels.shape[0], *table.shape[1:])
  raise ValueError(
    f"labels must be integer class indices of shape (batch,) or class weights of shape "
    f"(batch, {classes}), got {labels.dtype} of shape {labels.shape}."
  )


def conditional_batch_norm_step(
  x: jax.Array,
  labels: jax.Array,
  scale: jax.Array | None,
  bias: jax.Array | None,
  running_mean: jax.Array | None,
  running_var: jax.Array | None,
  *,
  use_running_average: bool,
  momentum: Any = 0.99,
  initializing: bool = False,
  axis: Axes = -1,
  epsilon: float = 1e-5,
  mask: jax.Array | None = None,
  axis_name: Any = None,
  axis_index_groups: Any = None,
  dtype: Any = None,
  force_float32_reductions: bool = True,
  unbiased_running_var: bool = False,
  layer: str | None = None,
) -> tuple[jax.Array, tuple[jax.Array, ...] | None]:
  """Conditional batch normalization (de Vries et al. 2017; Miyato & Koyama 2018; BigGAN):
  BatchNorm's statistics, shared by every class, then per-class ``γ[label]``, ``β[label]``.

  One call of the layer, as :func:`jaxnorm.batch_norm_step`: ``(y, (new_mean, new_var))``
  in training, ``(y, None)`` otherwise, with the same running-average rule.

  Args:
    x: the input, batch first.
    labels: class indices ``(batch,)`` or class weights ``(batch, classes)``.
    scale: ``γ``, ``(classes, *features)``, or None.
    bias: ``β``, ``(classes, *features)``, or None.
    running_mean, running_var, use_running_average, momentum, initializing: as in
      :func:`jaxnorm.batch_norm_step`.
    axis, epsilon, mask, axis_name, axis_index_groups, dtype, force_float32_reductions: the
      same.
    unbiased_running_var: store the unbiased batch variance ``n/(n − 1)·var`` in the
      running average (PyTorch's convention), as :func:`jaxnorm.batch_norm_step`'s.
    layer: the module's name, for warnings.

  Returns:
    ``(y, new running statistics or None)``.
  """
  check_step(momentum)
  x = jnp.asarray(x)
  given = running_mean if use_running_average else None
  opts = options(dtype, force_float32_reductions, axis_name, axis_index_groups)
  cfg = batch_config(x, axis, None, None, None, given, **opts)
  out = output_dtype(x, scale, bias, dtype=dtype)
  xhat, updated = step(
    training(), x, None, None, (running_mean, running_var), cfg._replace(out_dtype=cfg.dtype),
    epsilon, mask, use_running_average=use_running_average, initializing=initializing,
    momentum=momentum, unbiased=unbiased_running_var, layer=layer,
  )  # fmt: skip
  gamma, beta = (
    None if t is None else class_parameters(n, t, labels)
    for n, t in (("scale", scale), ("bias", bias))
  )
  return _modulated(xhat, beta, gamma, cfg.features, False, out), updated
