"""Flax NNX modules of the modern norms: :class:`DyT`, :class:`LocalResponseNorm`,
:class:`AdaLayerNorm`, :class:`AdaRMSNorm`, :class:`ConditionalBatchNorm`.

The attributes mean what they mean on the Linen classes of the same names
(:mod:`jaxnorm._modern_linen`); as in ``flax.nnx``, the sizes come first (``num_features``,
and the condition's or the classes' count), the rest keyword-only, and parameters are
created at construction from ``rngs``. Each calls the same pure function as its Linen twin.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.nn import initializers

from jaxnorm._adaptive import adaptive_norm, conditional_batch_norm_step
from jaxnorm._axes import Axes, batch_norm_axes
from jaxnorm._batch import first_use_running_average
from jaxnorm._dtypes import running_stats_dtypes
from jaxnorm._pointwise import dyt, local_response_norm

Initializer = Any
Dtype = Any


def _read(variable: Any) -> Any:
  return None if variable is None else variable[...]


def _param(use: bool, init: Initializer, key: Any, shape: tuple[int, ...], dtype: Any) -> Any:
  """An ``nnx.Param`` (or None where unused, declared as data for ``nnx.state``)."""
  none: Any = None
  return nnx.Param(init(key, shape, dtype)) if use else nnx.data(none)


class DyT(nnx.Module):
  """Dynamic Tanh (:class:`jaxnorm.DyT`): ``y = γ·tanh(α·x) + β``.

  Args:
    num_features: the size of the feature axis (``scale`` and ``bias`` have this shape).
    alpha_init_value, use_bias, use_scale, feature_axes, dtype: as in :class:`jaxnorm.DyT`.
    param_dtype, scale_init, bias_init, alpha_per_feature: the same.
    rngs: the random keys of the initializers.

  State: ``alpha`` (shape ``()``, or ``(num_features,)`` with ``alpha_per_feature``),
  ``scale``, ``bias`` (``nnx.Param``; None when unused).

  >>> from flax import nnx
  >>> from jaxnorm import nnx as jnnx
  >>> layer = jnnx.DyT(4, rngs=nnx.Rngs(0))
  >>> print(layer(jnp.array([[-2., 0., 1., 2.]])))
  [[-0.7616  0.      0.4621  0.7616]]
  """

  def __init__(
    self,
    num_features: int,
    *,
    alpha_init_value: float = 0.5,
    use_bias: bool = True,
    use_scale: bool = True,
    feature_axes: Axes = -1,
    dtype: Dtype | None = None,
    param_dtype: Dtype = jnp.float32,
    scale_init: Initializer = initializers.ones,
    bias_init: Initializer = initializers.zeros,
    alpha_per_feature: bool = False,
    rngs: nnx.Rngs,
  ):
    self.num_features = num_features
    alpha_shape = (num_features,) if alpha_per_feature else ()
    self.alpha = nnx.Param(jnp.full(alpha_shape, alpha_init_value, param_dtype))
    self.scale = _param(use_scale, scale_init, rngs.params(), (num_features,), param_dtype)
    self.bias = _param(use_bias, bias_init, rngs.params(), (num_features,), param_dtype)
    self.feature_axes = feature_axes
    self.dtype = dtype
    self.param_dtype = param_dtype

  def __call__(self, x: jax.Array) -> jax.Array:
    """Applies ``γ·tanh(α·x) + β`` to ``x``."""
    return dyt(x, self.alpha[...], _read(self.scale), _read(self.bias),
               feature_axes=self.feature_axes, dtype=self.dtype)  # fmt: skip


class LocalResponseNorm(nnx.Module):
  """Local response normalization (:class:`jaxnorm.LocalResponseNorm`); no state.

  Args:
    size, alpha, beta, k, channel_axis, dtype: as in :class:`jaxnorm.LocalResponseNorm`.
    rngs: accepted and unused (there is no parameter).
  """

  def __init__(
    self,
    size: int,
    *,
    alpha: float = 1e-4,
    beta: float = 0.75,
    k: float = 1.0,
    channel_axis: int = -1,
    dtype: Dtype | None = None,
    rngs: nnx.Rngs | None = None,
  ):
    del rngs  # (accepted for a uniform constructor; nothing is random)
    self.size, self.alpha, self.beta, self.k = size, alpha, beta, k
    self.channel_axis = channel_axis
    self.dtype = dtype

  def __call__(self, x: jax.Array) -> jax.Array:
    """Normalizes each channel of ``x`` by its neighbours' energy."""
    return local_response_norm(x, self.size, self.alpha, self.beta, self.k,
                               channel_axis=self.channel_axis, dtype=self.dtype)  # fmt: skip


class AdaLayerNorm(nnx.Module):
  """AdaLN-Zero (:class:`jaxnorm.AdaLayerNorm`): ``(y, gate)`` from ``(x, condition)``.

  Args:
    num_features: the number of features modulated (the size of ``feature_axes``).
    condition_features: the condition's size, ``condition.shape[-1]``.
    epsilon, use_gate, activation, use_bias, kernel_init, bias_init: as in
      :class:`jaxnorm.AdaLayerNorm`.
    reduction_axes, feature_axes, dtype, param_dtype, axis_name, axis_index_groups: the same.
    rngs: the random keys of the initializers.

  State: ``kernel`` ``(condition_features, chunks·num_features)`` and ``bias``, zeros by
  default (``nnx.Param``), with 3 chunks (shift, scale, gate) or 2 without the gate.

  >>> from flax import nnx
  >>> from jaxnorm import nnx as jnnx
  >>> ada = jnnx.AdaLayerNorm(8, 16, rngs=nnx.Rngs(0))
  >>> y, gate = ada(jnp.ones((2, 5, 8)), jnp.ones((2, 16)))
  >>> ada.kernel.shape, gate.shape
  ((16, 24), (2, 8))
  """

  _rms = False

  def __init__(
    self,
    num_features: int,
    condition_features: int,
    *,
    epsilon: float = 1e-6,
    use_gate: bool = True,
    activation: Callable[[jax.Array], jax.Array] | None = jax.nn.silu,
    use_bias: bool = True,
    kernel_init: Initializer = initializers.zeros,
    bias_init: Initializer = initializers.zeros,
    reduction_axes: Axes = -1,
    feature_axes: Axes = -1,
    dtype: Dtype | None = None,
    param_dtype: Dtype = jnp.float32,
    axis_name: Any = None,
    axis_index_groups: Any = None,
    rngs: nnx.Rngs,
  ):
    width = (3 if use_gate else 2) * num_features
    self.num_features, self.condition_features = num_features, condition_features
    self.kernel = nnx.Param(kernel_init(rngs.params(), (condition_features, width), param_dtype))
    self.bias = _param(use_bias, bias_init, rngs.params(), (width,), param_dtype)
    self.epsilon, self.use_gate, self.activation = epsilon, use_gate, activation
    self.reduction_axes, self.feature_axes = reduction_axes, feature_axes
    self.dtype, self.param_dtype = dtype, param_dtype
    self.axis_name, self.axis_index_groups = axis_name, axis_index_groups

  def __call__(
    self, x: jax.Array, condition: jax.Array, *, mask: jax.Array | None = None
  ) -> jax.Array | tuple[jax.Array, jax.Array]:
    """Normalizes ``x`` and modulates it by ``condition``: ``(y, gate)``, or ``y``."""
    return adaptive_norm(
      x, condition, self.kernel[...], _read(self.bias), rms=self._rms, use_gate=self.use_gate,
      activation=self.activation, reduction_axes=self.reduction_axes,
      feature_axes=self.feature_axes, epsilon=self.epsilon, mask=mask,
      axis_name=self.axis_name, axis_index_groups=self.axis_index_groups, dtype=self.dtype,
    )  # fmt: skip


class AdaRMSNorm(AdaLayerNorm):
  """Modulated RMSNorm (:class:`jaxnorm.AdaRMSNorm`): :class:`AdaLayerNorm` around an
  RMSNorm, the same arguments and state."""

  _rms = True


class ConditionalBatchNorm(nnx.Module):
  """Conditional BatchNorm (:class:`jaxnorm.ConditionalBatchNorm`): shared running
  statistics, a ``γ`` and ``β`` per class.

  Args:
    num_features: the size of the feature axis.
    num_classes: the number of classes (``scale``/``bias`` are ``(num_classes,
      num_features)``).
    use_running_average: the mode (default False; ``.eval()``, ``.train()`` and
      ``nnx.view`` set it, the call argument overrides it).
    axis, momentum, epsilon, dtype, param_dtype, use_bias, use_scale: as in
      :class:`jaxnorm.nnx.BatchNorm`.
    bias_init, scale_init, axis_name, axis_index_groups, unbiased_running_var: the same.
    rngs: the random keys of the initializers.

  State: ``mean``, ``var`` (``nnx.BatchStat``, float32), ``scale``, ``bias`` (``nnx.Param``).
  """

  def __init__(
    self,
    num_features: int,
    num_classes: int,
    *,
    use_running_average: bool = False,
    axis: int = -1,
    momentum: float = 0.99,
    epsilon: float = 1e-5,
    dtype: Dtype | None = None,
    param_dtype: Dtype = jnp.float32,
    use_bias: bool = True,
    use_scale: bool = True,
    bias_init: Initializer = initializers.zeros,
    scale_init: Initializer = initializers.ones,
    axis_name: Any = None,
    axis_index_groups: Any = None,
    unbiased_running_var: bool = False,
    rngs: nnx.Rngs,
  ):
    mean_dtype, var_dtype = running_stats_dtypes(param_dtype, jnp.float32, dtype)
    self.mean = nnx.BatchStat(jnp.zeros((num_features,), mean_dtype))
    self.var = nnx.BatchStat(jnp.ones((num_features,), var_dtype))
    table = (num_classes, num_features)
    self.scale = _param(use_scale, scale_init, rngs.params(), table, param_dtype)
    self.bias = _param(use_bias, bias_init, rngs.params(), table, param_dtype)
    self.num_features, self.num_classes = num_features, num_classes
    self.use_running_average = use_running_average
    self.axis, self.momentum, self.epsilon = axis, momentum, epsilon
    self.dtype, self.param_dtype = dtype, param_dtype
    self.axis_name, self.axis_index_groups = axis_name, axis_index_groups
    self.unbiased_running_var = unbiased_running_var

  def __call__(
    self,
    x: jax.Array,
    labels: jax.Array,
    use_running_average: bool | None = None,
    *,
    mask: jax.Array | None = None,
  ) -> jax.Array:
    """Normalizes ``x`` (training: batch statistics, updating the running averages), then
    applies each sample's class parameters."""
    use_ra = first_use_running_average(use_running_average, self.use_running_average)
    features, _ = batch_norm_axes(jnp.ndim(x), self.axis, None)
    if tuple(jnp.shape(x)[a] for a in features) != (self.num_features,):
      raise ValueError(
        f"ConditionalBatchNorm({self.num_features}, {self.num_classes}) got an input of "
        f"shape {jnp.shape(x)} whose axis {self.axis} has "
        f"{[jnp.shape(x)[a] for a in features]} features; construct it with the size of "
        f"that axis."
      )
    y, updated = conditional_batch_norm_step(
      x, labels, _read(self.scale), _read(self.bias), self.mean[...], self.var[...],
      use_running_average=use_ra, momentum=self.momentum, axis=self.axis,
      epsilon=self.epsilon, mask=mask, axis_name=self.axis_name,
      axis_index_groups=self.axis_index_groups, dtype=self.dtype,
      unbiased_running_var=self.unbiased_running_var,
      layer=f"ConditionalBatchNorm({self.num_features}, {self.num_classes})",
    )  # fmt: skip
    if updated is not None:  # no gradient flows into the running averages (as flax.nnx)
      self.mean[...], self.var[...] = jax.lax.stop_gradient(updated)
    return y

  def set_view(self, use_running_average: bool | None = None, **kwargs: Any) -> dict:
    """``nnx.view``'s hook: sets the mode; returns the keywords it does not take (Flax
    0.12.4 reads them; later versions pass only what a hook names)."""
    if use_running_average is not None:
      self.use_running_average = use_running_average
    return kwargs
