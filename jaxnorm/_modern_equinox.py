"""Equinox modules of the modern norms and weight reparameterizations, re-exported by
:mod:`jaxnorm.equinox`: :class:`SpectralNorm` and :class:`WeightNorm` (drop-ins for
``eqx.nn``'s), :class:`DyT`, :class:`AdaLayerNorm`, :class:`AdaRMSNorm`,
:class:`ConditionalBatchNorm` and :class:`LocalResponseNorm`.

Equinox's conventions: one example per call (``jax.vmap`` over the batch), channels first,
``weight``/``bias`` names, an ``eqx.nn.State`` for what a call updates. Each calls the pure
function its Linen and NNX twins call, on the example as a batch of one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

from jaxnorm._adaptive import adaptive_norm, class_parameters
from jaxnorm._dtypes import promote
from jaxnorm._pointwise import dyt, local_response_norm
from jaxnorm._weights import divided, power_iteration, sigma_of, weight_norm


def _layer_with(layer: Any, name: str, weight: jax.Array) -> Any:
  return eqx.tree_at(lambda module: getattr(module, name), layer, weight)


class WeightNorm(eqx.nn.WeightNorm):
  """Weight normalization (Salimans & Kingma 2016) of a wrapped layer's weight: a drop-in
  for ``eqx.nn.WeightNorm`` over :func:`jaxnorm.weight_norm`.

  The same fields (``layer``, ``g``, ``weight_name``, ``axis``) and construction (``g``
  starts as the norm of each slice along ``axis``), so checkpoints load either way. Beyond
  Equinox: the norm is summed in at least float32 with Flax's ``ε = 1e-12`` inside the root,
  so an all-zero slice gives zeros and a finite gradient where Equinox's ``v/‖v‖`` gives NaN.

  >>> import jax, equinox as eqx, jaxnorm.equinox as jeqx
  >>> layer = jeqx.WeightNorm(eqx.nn.Linear(3, 2, key=jax.random.key(0)))
  >>> layer.g.shape
  (2, 1)
  """

  def __call__(self, x: jax.Array, *, key: Any = None) -> jax.Array:
    """Calls the wrapped layer with its weight ``g·v/‖v‖``."""
    v = getattr(self.layer, self.weight_name)
    axes = None if self.axis is None else (self.axis,)
    scale = self.g.reshape(() if axes is None else (v.shape[self.axis],))
    weight = weight_norm(v, scale, feature_axes=axes, dtype=v.dtype)
    return _layer_with(self.layer, self.weight_name, weight)(x)


class SpectralNorm(eqx.nn.SpectralNorm):
  """Spectral normalization (Miyato et al. 2018) of a wrapped layer's weight: a drop-in for
  ``eqx.nn.SpectralNorm`` over jaxnorm's power iteration (:func:`jaxnorm.spectral_norm`).

  The same fields and state (``uv_index`` holding ``(u, v)``, ``inference``), the same
  construction (15 power iterations from random vectors) and the same convention: the
  weight seen as ``(shape[0], -1)``, ``u = ℓ2(W v)``, ``v = ℓ2(Wᵀ u)`` for each of
  ``num_power_iterations`` in training (none at inference), ``W / (uᵀ W v)``. Beyond
  Equinox: the iteration runs in at least float32 at full matmul precision, and an all-zero
  weight is left unchanged instead of divided by 0. ``ε`` sits inside the root of each
  ℓ2 norm (Flax's form; Equinox's divides by ``max(ε, ‖·‖)``), the same above 1e-6.
  """

  def __call__(
    self, x: jax.Array, state: Any, *, key: Any = None, inference: bool | None = None
  ) -> tuple[jax.Array, Any]:
    """Calls the wrapped layer with ``W/σ(W)``; returns ``(output, state)`` with the
    power-iteration vectors updated in training."""
    u, v = state.get(self.uv_index)
    weight = getattr(self.layer, self.weight_name)
    compute = promote(weight.dtype, u.dtype, jnp.float32)
    m = weight.reshape(weight.shape[0], -1).astype(compute)
    inference = self.inference if inference is None else inference
    # jaxnorm's iteration on m from Equinox's v gives Equinox's (v, u) (the same products).
    if inference:
      right, left = v[None].astype(compute), u[None].astype(compute)
    else:
      right, left = power_iteration(m, v[None].astype(compute), self.num_power_iterations, self.eps)
      state = state.set(self.uv_index, (left[0].astype(u.dtype), right[0].astype(v.dtype)))
    w_bar = divided(m, sigma_of(m, right, left)).reshape(weight.shape).astype(weight.dtype)
    return _layer_with(self.layer, self.weight_name, w_bar)(x), state


class DyT(eqx.Module):
  """Dynamic Tanh (Zhu et al. 2025): ``y = weight·tanh(alpha·x) + bias``, elementwise
  (:func:`jaxnorm.dyt`), for one example whose trailing axes have ``shape``.

  Attributes:
    shape: the shape of ``weight`` and ``bias`` (the trailing axes of ``x``).
    alpha (jax.Array): the learned scalar ``α`` (``alpha_init_value``, default 0.5), or
      one per element of ``shape`` with ``alpha_per_feature=True``.
    weight (jax.Array | None): ones of ``shape``, or None (``use_weight=False``).
    bias (jax.Array | None): zeros of ``shape``, or None (``use_bias=False``).

  >>> import jax.numpy as jnp, jaxnorm.equinox as jeqx
  >>> jeqx.DyT(3)(jnp.array([-2.0, 0.0, 2.0])).round(4)
  Array([-0.7616,  0.    ,  0.7616], dtype=float32)
  """

  shape: tuple[int, ...] = eqx.field(static=True)
  alpha: jax.Array
  weight: jax.Array | None
  bias: jax.Array | None

  def __init__(
    self,
    shape: int | tuple[int, ...],
    alpha_init_value: float = 0.5,
    use_weight: bool = True,
    use_bias: bool = True,
    *,
    dtype: Any = None,
    alpha_per_feature: bool = False,
  ):
    """``shape``, ``alpha_init_value``, ``use_weight``, ``use_bias``; ``dtype`` of the
    parameters (default float32); ``alpha_per_feature``: ``alpha`` of ``shape``."""
    self.shape = (shape,) if isinstance(shape, int) else tuple(shape)
    dtype = jnp.float32 if dtype is None else dtype
    self.alpha = jnp.full(self.shape if alpha_per_feature else (), alpha_init_value, dtype)
    self.weight = jnp.ones(self.shape, dtype) if use_weight else None
    self.bias = jnp.zeros(self.shape, dtype) if use_bias else None

  def __call__(self, x: jax.Array, state: Any = None, *, key: Any = None) -> Any:
    """``weight·tanh(alpha·x) + bias`` in ``x``'s dtype; with a ``state``, ``(y, state)``."""
    x = jnp.asarray(x)
    if x.shape[x.ndim - len(self.shape) :] != self.shape:
      raise ValueError(
        f"DyT(shape={self.shape}) applies to inputs whose trailing axes are {self.shape}, "
        f"got {x.shape}."
      )
    axes = tuple(range(x.ndim - len(self.shape), x.ndim))
    y = dyt(x, self.alpha, self.weight, self.bias, feature_axes=axes, dtype=x.dtype)
    return y if state is None else (y, state)


class LocalResponseNorm(eqx.Module):
  """Local response normalization of one channels-first example
  (:func:`jaxnorm.local_response_norm`, PyTorch's ``nn.LocalResponseNorm``).

  Attributes:
    size, alpha, beta, k: as in :class:`jaxnorm.LocalResponseNorm` (defaults 1e-4, 0.75, 1).
  """

  size: int = eqx.field(static=True)
  alpha: float = eqx.field(static=True, default=1e-4)
  beta: float = eqx.field(static=True, default=0.75)
  k: float = eqx.field(static=True, default=1.0)

  def __call__(self, x: jax.Array, state: Any = None, *, key: Any = None) -> Any:
    """Normalizes each channel (axis 0) of ``x``; with a ``state``, ``(y, state)``."""
    y = local_response_norm(x, self.size, self.alpha, self.beta, self.k, channel_axis=0)
    return y if state is None else (y, state)


class AdaLayerNorm(eqx.Module):
  """AdaLN-Zero (DiT) for one example: ``(y, gate)`` from ``x`` (``(..., features)``, e.g.
  the tokens of one sequence) and its ``condition`` (``(condition_size,)``); see
  :class:`jaxnorm.AdaLayerNorm`.

  Attributes:
    linear (eqx.nn.Linear): the conditioning projection, ``condition_size →
      chunks·features`` (shift, scale and gate), zero-initialised.
    features: the size of the modulated (last) axis.
    eps: added to the variance (1e-6).
    use_gate: also return the gate.
    activation: applied to the condition first (SiLU).

  >>> import jax, jax.numpy as jnp, jaxnorm.equinox as jeqx
  >>> ada = jeqx.AdaLayerNorm(4, 3, key=jax.random.key(0))
  >>> y, gate = ada(jnp.array([[1.0, 2.0, 3.0, 4.0]]), jnp.ones(3))
  >>> y.round(4)
  Array([[-1.3416, -0.4472,  0.4472,  1.3416]], dtype=float32)
  >>> gate
  Array([0., 0., 0., 0.], dtype=float32)
  """

  linear: eqx.nn.Linear
  features: int = eqx.field(static=True)
  eps: float = eqx.field(static=True)
  use_gate: bool = eqx.field(static=True)
  activation: Callable[[jax.Array], jax.Array] | None = eqx.field(static=True)
  _rms = False

  def __init__(
    self,
    features: int,
    condition_size: int,
    eps: float = 1e-6,
    use_gate: bool = True,
    activation: Callable[[jax.Array], jax.Array] | None = jax.nn.silu,
    *,
    dtype: Any = None,
    key: Any,
  ):
    """``features``, ``condition_size``, ``eps``, ``use_gate``, ``activation``; ``dtype``
    of the projection; ``key`` (Equinox's Linear takes one; its weights are then zeroed)."""
    width = (3 if use_gate else 2) * features
    linear = eqx.nn.Linear(condition_size, width, key=key, dtype=dtype)
    self.linear = eqx.tree_at(
      lambda lin: (lin.weight, lin.bias),
      linear,
      (jnp.zeros_like(linear.weight), jnp.zeros((width,), linear.weight.dtype)),
    )
    self.features, self.eps, self.use_gate, self.activation = features, eps, use_gate, activation

  def __call__(
    self, x: jax.Array, condition: jax.Array, *, key: Any = None, mask: Any = None
  ) -> Any:
    """Normalizes ``x`` over its last axis and modulates it: ``(y, gate)``, or ``y``; ``y``
    in ``x``'s dtype."""
    x, condition = jnp.asarray(x), jnp.asarray(condition)
    out = adaptive_norm(
      x[None], condition[None], self.linear.weight.T, self.linear.bias, rms=self._rms,
      use_gate=self.use_gate, activation=self.activation, epsilon=self.eps,
      mask=None if mask is None else jnp.asarray(mask)[None], dtype=x.dtype,
    )  # fmt: skip
    if self.use_gate:
      return out[0][0], out[1][0]
    return out[0]


class AdaRMSNorm(AdaLayerNorm):
  """Modulated RMSNorm for one example: :class:`AdaLayerNorm` around an RMSNorm."""

  _rms = True


class ConditionalBatchNorm(eqx.Module):
  """Conditional BatchNorm in Equinox's BatchNorm convention: one example ``(channels,
  ...)`` and its class ``label`` per call inside ``jax.vmap(axis_name=...)``; the batch
  statistics of :class:`jaxnorm.equinox.BatchNorm` (shared by every class, in ``state``),
  then ``weight[label]``, ``bias[label]`` per channel.

  Attributes:
    norm (BatchNorm): the statistics, without affine parameters.
    weight (jax.Array | None): ``(num_classes, channels)``, ones.
    bias (jax.Array | None): ``(num_classes, channels)``, zeros.
  """

  norm: Any
  weight: jax.Array | None
  bias: jax.Array | None

  def __init__(
    self,
    input_size: int,
    num_classes: int,
    axis_name: Any,
    eps: float = 1e-5,
    channelwise_affine: bool = True,
    momentum: float = 0.99,
    inference: bool = False,
    dtype: Any = None,
    mode: str = "batch",
  ):
    """:class:`jaxnorm.equinox.BatchNorm`'s arguments (``mode`` defaults to ``"batch"``),
    with ``num_classes`` after ``input_size``."""
    from jaxnorm.equinox import BatchNorm  # (jaxnorm.equinox re-exports this module)

    self.norm = BatchNorm(
      input_size, axis_name, eps=eps, channelwise_affine=False, momentum=momentum,
      inference=inference, dtype=dtype, mode=mode,
    )  # fmt: skip
    table = (num_classes, input_size)
    dtype = jnp.float32 if dtype is None else dtype
    self.weight = jnp.ones(table, dtype) if channelwise_affine else None
    self.bias = jnp.zeros(table, dtype) if channelwise_affine else None

  def __call__(
    self,
    x: jax.Array,
    label: jax.Array,
    state: Any,
    *,
    key: Any = None,
    inference: bool | None = None,
    mask: Any = None,
  ) -> tuple[jax.Array, Any]:
    """Normalizes one example and applies its class's parameters: ``(output, state)``."""
    y, state = self.norm(x, state, inference=inference, mask=mask)
    label = jnp.asarray(label)[None]
    per_channel = (y.shape[0],) + (1,) * (y.ndim - 1)
    if self.weight is not None:
      y = y * class_parameters("weight", self.weight, label)[0].reshape(per_channel)
    if self.bias is not None:
      y = y + class_parameters("bias", self.bias, label)[0].reshape(per_channel)
    return y.astype(x.dtype), state
