"""Flax Linen modules of the modern norms: Dynamic Tanh, local response normalization, the
adaptive norms of DiT (AdaLN-Zero, modulated RMSNorm) and conditional BatchNorm.

Flax has none of these, so there is no Flax class to match; they follow Flax's
conventions (attribute names and defaults of its norms, ``params``/``batch_stats``
collections, ``dtype`` and ``param_dtype``). Each declares its variables and calls one pure
function of :mod:`jaxnorm._pointwise` or :mod:`jaxnorm._adaptive`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.nn import initializers

from jaxnorm._adaptive import adaptive_norm, conditional_batch_norm_step
from jaxnorm._axes import Axes, batch_norm_axes, canonicalize_axes, kept_shape
from jaxnorm._batch import merge_use_running_average
from jaxnorm._dtypes import running_stats_dtypes
from jaxnorm._linen_params import declare_affine
from jaxnorm._pointwise import dyt, local_response_norm

Initializer = Any
Dtype = Any


def _feature_shape(x: jax.Array, feature_axes: Axes) -> tuple[int, ...]:
  axes = canonicalize_axes(feature_axes, jnp.ndim(x), name="feature_axes")
  return tuple(jnp.shape(x)[a] for a in axes)


class DyT(nn.Module):
  """Dynamic Tanh (Zhu et al. 2025): ``y = γ·tanh(α·x) + β``, a drop-in for the LayerNorm
  of a Transformer block without statistics (:func:`jaxnorm.dyt`).

  ``α`` is one learned scalar (``params/alpha``, shape ``()``; one per feature with
  ``alpha_per_feature``); ``γ``, ``β`` are per feature (``params/scale``, ``params/bias``),
  as LayerNorm's.

  >>> import jax, jaxnorm
  >>> layer = jaxnorm.DyT()
  >>> variables = layer.init(jax.random.key(0), jnp.ones((2, 4)))
  >>> jax.tree_util.tree_map(jnp.shape, variables)
  {'params': {'alpha': (), 'bias': (4,), 'scale': (4,)}}

  Attributes:
    alpha_init_value: ``α``'s initial value (default 0.5, the paper's for most models; it
      suggests smaller values for larger models and more warm-up).
    use_bias: add the learned bias ``β``.
    use_scale: multiply by the learned scale ``γ``.
    feature_axes: the axes ``γ`` and ``β`` run along (default -1).
    dtype: the output dtype (default: inferred, as in Flax).
    param_dtype: the parameters' dtype (default float32).
    scale_init: initializer of ``γ`` (default ones).
    bias_init: initializer of ``β`` (default zeros).
    alpha_per_feature: one ``α`` per feature, of ``γ``'s shape (as some DyT ports write
      it), instead of one scalar (default False, the paper's).
  """

  alpha_init_value: float = 0.5
  use_bias: bool = True
  use_scale: bool = True
  feature_axes: Axes = -1
  dtype: Dtype | None = None
  param_dtype: Dtype = jnp.float32
  scale_init: Initializer = initializers.ones
  bias_init: Initializer = initializers.zeros
  alpha_per_feature: bool = False

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    """Applies ``γ·tanh(α·x) + β`` to ``x``."""
    shape = _feature_shape(x, self.feature_axes)
    alpha_shape = shape if self.alpha_per_feature else ()
    init = initializers.constant(self.alpha_init_value)
    alpha = self.param("alpha", init, alpha_shape, self.param_dtype)
    scale, bias = declare_affine(self, shape, self.use_bias)
    return dyt(x, alpha, scale, bias, feature_axes=self.feature_axes, dtype=self.dtype)


class LocalResponseNorm(nn.Module):
  """Local response normalization across channels (:func:`jaxnorm.local_response_norm`,
  PyTorch's ``nn.LocalResponseNorm``); no parameters.

  Attributes:
    size: the number of neighbouring channels in the window.
    alpha: the multiplicative factor (default 1e-4; divided by ``size``, as PyTorch's).
    beta: the exponent (default 0.75).
    k: the additive constant (default 1).
    channel_axis: the channel axis (default -1; PyTorch's layout is 1).
    dtype: the output dtype (default: the input's).
  """

  size: int
  alpha: float = 1e-4
  beta: float = 0.75
  k: float = 1.0
  channel_axis: int = -1
  dtype: Dtype | None = None

  def __call__(self, x: jax.Array) -> jax.Array:
    """Normalizes each channel of ``x`` by its neighbours' energy."""
    return local_response_norm(x, self.size, self.alpha, self.beta, self.k,
                               channel_axis=self.channel_axis, dtype=self.dtype)  # fmt: skip


class AdaLayerNorm(nn.Module):
  """Adaptive layer normalization with DiT's zero-initialised conditioning (AdaLN-Zero,
  Peebles & Xie 2023): ``y = LayerNorm(x)·(1 + scale(c)) + shift(c)``, and a gate.

  ``shift, scale, gate = split(activation(c) @ kernel + bias)``, the projection
  (``params/kernel``, ``params/bias``) zero-initialised, so the block starts as a plain
  LayerNorm whose residual branch is gated off. Called as ``(x, condition)``, it returns
  ``(y, gate)``; add the sublayer's output with :func:`jaxnorm.gated_residual`. With
  ``use_gate=False`` it returns ``y`` (AdaLN without the gate, two outputs).

  >>> import jax, jaxnorm
  >>> x, c = jnp.ones((2, 5, 8)), jnp.ones((2, 16))           # tokens, condition
  >>> ada = jaxnorm.AdaLayerNorm()
  >>> variables = ada.init(jax.random.key(0), x, c)
  >>> jax.tree_util.tree_map(jnp.shape, variables)
  {'params': {'bias': (24,), 'kernel': (16, 24)}}
  >>> y, gate = ada.apply(variables, x, c)
  >>> h = jaxnorm.gated_residual(x, jnp.tanh(y), gate)        # the block's residual update

  Attributes:
    epsilon: constant >= 0 added to the variance (default 1e-6, DiT's).
    use_gate: also project and return the gate (default True).
    activation: applied to the condition before the projection (default SiLU, DiT's).
    use_bias: the projection has a bias (default True).
    kernel_init: initializer of the projection (default zeros: AdaLN-Zero).
    bias_init: initializer of its bias (default zeros).
    reduction_axes: axes of the statistics (default -1).
    feature_axes: axes the modulation runs along (default -1).
    dtype: the output and projection dtype (default: inferred, as in Flax).
    param_dtype: the parameters' dtype (default float32).
    axis_name, axis_index_groups, force_float32_reductions: as in :class:`jaxnorm.LayerNorm`.
  """

  epsilon: float = 1e-6
  use_gate: bool = True
  activation: Callable[[jax.Array], jax.Array] | None = nn.silu
  use_bias: bool = True
  kernel_init: Initializer = initializers.zeros
  bias_init: Initializer = initializers.zeros
  reduction_axes: Axes = -1
  feature_axes: Axes = -1
  dtype: Dtype | None = None
  param_dtype: Dtype = jnp.float32
  axis_name: Any = None
  axis_index_groups: Any = None
  force_float32_reductions: bool = True
  _rms = False

  @nn.compact
  def __call__(
    self, x: jax.Array, condition: jax.Array, *, mask: jax.Array | None = None
  ) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Normalizes ``x`` and modulates it by ``condition`` (``(batch, features)``):
    ``(y, gate)``, or ``y`` without the gate (``mask``: see :func:`jaxnorm.normalize`)."""
    width = (3 if self.use_gate else 2) * math.prod(_feature_shape(x, self.feature_axes))
    kernel = self.param(
      "kernel", self.kernel_init, (jnp.shape(condition)[-1], width), self.param_dtype
    )
    bias = self.param("bias", self.bias_init, (width,), self.param_dtype) if self.use_bias else None
    return adaptive_norm(
      x, condition, kernel, bias, rms=self._rms, use_gate=self.use_gate,
      activation=self.activation, reduction_axes=self.reduction_axes,
      feature_axes=self.feature_axes, epsilon=self.epsilon, mask=mask,
      axis_name=self.axis_name, axis_index_groups=self.axis_index_groups, dtype=self.dtype,
      force_float32_reductions=self.force_float32_reductions,
    )  # fmt: skip


class AdaRMSNorm(AdaLayerNorm):
  """Modulated RMSNorm: :class:`AdaLayerNorm` around an RMSNorm,
  ``y = RMSNorm(x)·(1 + scale(c)) + shift(c)``, with the same zero-initialised projection,
  variables and gate."""

  _rms = True


class ConditionalBatchNorm(nn.Module):
  """Conditional batch normalization (de Vries et al. 2017; BigGAN's class-conditional
  BatchNorm): one set of batch statistics for every class, a ``γ`` and ``β`` per class.

  Variables: ``params/scale`` and ``params/bias`` of shape ``(num_classes, *features)``;
  ``batch_stats/mean`` and ``batch_stats/var`` as :class:`jaxnorm.BatchNorm`'s, updated
  the same way in training (``mutable=['batch_stats']``). Called as ``(x, labels)`` with
  integer labels ``(batch,)`` or class weights ``(batch, num_classes)``.

  >>> import jax, jaxnorm
  >>> cbn = jaxnorm.ConditionalBatchNorm(num_classes=10, use_running_average=False)
  >>> x, labels = jnp.ones((4, 3)), jnp.array([0, 3, 3, 9])
  >>> variables = cbn.init(jax.random.key(0), x, labels)
  >>> jax.tree_util.tree_map(jnp.shape, variables)
  {'batch_stats': {'mean': (3,), 'var': (3,)}, 'params': {'bias': (10, 3), 'scale': (10, 3)}}

  Attributes:
    num_classes: the number of classes.
    use_running_average, axis, momentum, epsilon, dtype, param_dtype: as in
      :class:`jaxnorm.BatchNorm`.
    use_bias, use_scale, bias_init, scale_init: the same (the initializers get the
      ``(num_classes, *features)`` shape).
    axis_name, axis_index_groups, force_float32_reductions: as in :class:`jaxnorm.BatchNorm`.
    unbiased_running_var: store the unbiased batch variance in the running average,
      PyTorch's convention (:class:`jaxnorm.BatchNorm`'s, without its counter).
  """

  num_classes: int
  use_running_average: bool | None = None
  axis: int = -1
  momentum: float = 0.99
  epsilon: float = 1e-5
  dtype: Dtype | None = None
  param_dtype: Dtype = jnp.float32
  use_bias: bool = True
  use_scale: bool = True
  bias_init: Initializer = initializers.zeros
  scale_init: Initializer = initializers.ones
  axis_name: Any = None
  axis_index_groups: Any = None
  force_float32_reductions: bool = True
  unbiased_running_var: bool = False

  @nn.compact
  def __call__(
    self,
    x: jax.Array,
    labels: jax.Array,
    use_running_average: bool | None = None,
    *,
    mask: jax.Array | None = None,
  ) -> jax.Array:
    """Normalizes ``x`` with the batch statistics (training) or the running averages, then
    applies the parameters of each sample's class."""
    use_ra = merge_use_running_average(self.use_running_average, use_running_average)
    x = jnp.asarray(x)
    features, reduced = batch_norm_axes(x.ndim, self.axis, None)
    stats_shape = kept_shape(x.shape, reduced)
    mean_dtype, var_dtype = running_stats_dtypes(
      self.param_dtype, x.dtype, self.dtype, self.force_float32_reductions
    )
    ra_mean = self.variable("batch_stats", "mean", jnp.zeros, stats_shape, mean_dtype)
    ra_var = self.variable("batch_stats", "var", jnp.ones, stats_shape, var_dtype)
    table = (self.num_classes, *(x.shape[a] for a in features))
    scale, bias = declare_affine(self, table, self.use_bias)
    y, updated = conditional_batch_norm_step(
      x, labels, scale, bias, ra_mean.value, ra_var.value, use_running_average=use_ra,
      momentum=self.momentum, initializing=self.is_initializing(), axis=self.axis,
      epsilon=self.epsilon, mask=mask, axis_name=self.axis_name,
      axis_index_groups=self.axis_index_groups, dtype=self.dtype,
      force_float32_reductions=self.force_float32_reductions,
      unbiased_running_var=self.unbiased_running_var, layer="/".join(self.path),
    )  # fmt: skip
    if updated is not None:
      ra_mean.value, ra_var.value = updated
    return y
