"""Weight reparameterizations, pure: weight normalization and spectral normalization.

These normalize a layer's *weights*, not its activations: :func:`weight_norm` (Salimans &
Kingma 2016) divides each output feature's weights by their L2 norm and multiplies by a
learned scale; :func:`spectral_norm` (Miyato et al. 2018) divides a weight matrix by an
estimate of its largest singular value from power iteration, whose state (the vector ``u``)
is passed in and returned, never hidden. The Linen and NNX wrappers
(:class:`jaxnorm.SpectralNorm`, :class:`jaxnorm.WeightNorm` and their ``jaxnorm.nnx`` twins)
apply them to the parameters of the layer they wrap.

Numerics follow the rest of jaxnorm: sums in at least float32 (a float16 kernel's sum of
squares overflows past 256 elements of size 16), the result cast to Flax's output dtype.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from jaxnorm._axes import Axes, broadcast_shape, canonicalize_axes, complement
from jaxnorm._dtypes import accumulated, output_dtype, promote

Array = jax.Array


def unit_l2(x: Any, axes: Axes | None = None, epsilon: float = 1e-12) -> Array:
  """``x / sqrt(Σ |x|² + ε)`` over ``axes`` (all axes when None), in at least float32.

  Flax's formula (ε inside the root, so a zero vector gives zero, not NaN). The result is in
  the computation dtype; callers cast.
  """
  x = accumulated(x)
  reduced = tuple(range(x.ndim)) if axes is None else canonicalize_axes(axes, x.ndim)
  squares = jnp.real(x * jnp.conj(x)) if jnp.iscomplexobj(x) else x * x
  return x * lax.rsqrt(jnp.sum(squares, axis=reduced, keepdims=True) + epsilon)


def weight_norm(
  weight: Any,
  scale: Any = None,
  *,
  feature_axes: Axes | None = -1,
  epsilon: float = 1e-12,
  dtype: Any = None,
) -> Array:
  """Weight normalization: ``g · v / ‖v‖``, the norm taken per feature.

  Salimans & Kingma, "Weight Normalization: A Simple Reparameterization to Accelerate
  Training of Deep Neural Networks" (2016): the weight ``v`` is divided by its L2 norm over
  every axis except ``feature_axes`` (one norm per output feature) and multiplied by the
  learned per-feature ``scale`` ``g``. Gradients flow to both ``v`` and ``g`` (the
  reparameterization the paper trains in).

  Args:
    weight: the raw weight ``v``, any shape.
    scale: ``g``, of the feature axes' sizes (``weight.shape[a] for a in feature_axes``), or
      None for none.
    feature_axes: the axes that keep one norm each (default the last, a Dense or Conv kernel's
      output features); None or ``()`` takes one norm over the whole weight.
    epsilon: added to the sum of squares inside the root (Flax's default 1e-12).
    dtype: the result's dtype (default: Flax's rule, the promotion of ``weight`` and
      ``scale``).

  Returns:
    The normalized weight, ``weight``'s shape.

  Raises:
    ValueError: when ``scale``'s shape is not the feature axes' sizes.

  >>> import jax.numpy as jnp, jaxnorm
  >>> w = jnp.array([[3.0, 0.0], [4.0, 2.0]])
  >>> jaxnorm.weight_norm(w, jnp.array([1.0, 10.0]))
  Array([[ 0.6,  0. ],
         [ 0.8, 10. ]], dtype=float32)
  """
  weight = jnp.asarray(weight)
  features = () if feature_axes is None else canonicalize_axes(feature_axes, weight.ndim)
  out_dtype = output_dtype(weight, scale, dtype=dtype)
  y = unit_l2(weight, complement(features, weight.ndim), epsilon)
  if scale is not None:
    scale = jnp.asarray(scale)
    want = tuple(weight.shape[a] for a in features)
    if scale.shape != want:
      raise ValueError(
        f"weight_norm: scale must have the sizes of the feature axes {features} of the "
        f"weight (shape {weight.shape}), {want}, but got {scale.shape}; pass "
        f"feature_axes= to match the scale, or a scale of shape {want}."
      )
    y = y * scale.reshape(broadcast_shape(weight.shape, features)).astype(y.dtype)
  return y.astype(out_dtype)


def _matrix(weight: Array, name: str) -> Array:
  if weight.ndim < 2:
    raise ValueError(
      f"{name}: spectral normalization needs a matrix (a weight of 2 or more dimensions), "
      f"but got shape {weight.shape}; the modules leave scalars and vectors unchanged."
    )
  return weight.reshape(-1, weight.shape[-1])


def spectral_norm(
  weight: Any,
  u: Any,
  *,
  n_steps: int = 1,
  epsilon: float = 1e-12,
  dtype: Any = None,
) -> tuple[Array, Array, Array]:
  """Spectral normalization: ``W / σ(W)``, ``σ`` estimated by power iteration from ``u``.

  Miyato et al., "Spectral Normalization for Generative Adversarial Networks" (2018). A
  weight of more than two dimensions is seen as the matrix ``W = weight.reshape(-1, out)``
  (Flax's convention: the last axis is the output). Starting from ``u`` (shape ``(1, out)``),
  each step sets ``v = ℓ2(u Wᵀ)``, ``u = ℓ2(v W)``; then ``σ = v W uᵀ``, with ``u`` and ``v``
  held constant for differentiation (so the gradient of ``W / σ`` includes ``σ``'s own,
  ``v uᵀ``, as in the paper). A zero ``σ`` (an all-zero weight) leaves the weight unchanged.

  The power iteration runs in at least float32 at full matmul precision (a bfloat16 or TPU
  default-precision product would put its rounding into σ).

  Args:
    weight: the raw weight, 2 or more dimensions.
    u: the power-iteration state, ``(1, weight.shape[-1])``: from the previous call, or
      random normal at the start.
    n_steps: power-iteration steps, at least 1.
    epsilon: added inside the root of each ℓ2 normalization (Flax's default 1e-12).
    dtype: the normalized weight's dtype (default: Flax's rule, the promotion of ``weight``
      and ``u``).

  Returns:
    ``(normalized weight, new u, sigma)``: the weight in ``weight``'s shape; ``u`` and the
    scalar ``sigma`` in ``u``'s dtype (the state to keep for the next call).

  Raises:
    ValueError: for a weight of fewer than two dimensions, a ``u`` of the wrong shape, or
      ``n_steps`` below 1.

  >>> import jax.numpy as jnp, jaxnorm
  >>> w = jnp.array([[3.0, 0.0], [0.0, 1.0]])
  >>> w_bar, u, sigma = jaxnorm.spectral_norm(w, jnp.array([[1.0, 0.5]]), n_steps=20)
  >>> round(float(sigma), 4), w_bar.round(4)
  (3.0, Array([[1.    , 0.    ],
         [0.    , 0.3333]], dtype=float32))
  """
  weight = jnp.asarray(weight)
  u = jnp.asarray(u)
  matrix = _matrix(weight, "spectral_norm")
  if u.shape != (1, matrix.shape[1]):
    raise ValueError(
      f"spectral_norm: u must have shape (1, {matrix.shape[1]}) (one entry per output "
      f"feature, the last axis of the weight of shape {weight.shape}), but got {u.shape}; "
      f"start from jax.random.normal(key, (1, {matrix.shape[1]}))."
    )
  if not isinstance(n_steps, int) or n_steps < 1:
    raise ValueError(
      f"spectral_norm: n_steps must be an int of at least 1, got {n_steps!r}; the modules "
      f"leave the weight unchanged for n_steps=0."
    )
  if jnp.iscomplexobj(weight) or jnp.iscomplexobj(u):
    raise TypeError(
      f"spectral_norm: real weights expected, got {weight.dtype} and u {u.dtype}; the "
      f"power iteration here is for real matrices."
    )
  compute = promote(weight.dtype, u.dtype, jnp.float32)
  m = matrix.astype(compute)
  u_k, v_k = power_iteration(m, u.astype(compute), n_steps, epsilon)
  sigma = sigma_of(m, u_k, v_k)
  w_bar = divided(m, sigma).reshape(weight.shape)
  out_dtype = output_dtype(weight, u, dtype=dtype)
  return w_bar.astype(out_dtype), u_k.astype(u.dtype), sigma.astype(u.dtype)


def _matmul(a: Array, b: Array) -> Array:
  return jnp.matmul(a, b, precision=lax.Precision.HIGHEST)


def power_iteration(m: Array, u: Array, n_steps: int, epsilon: float) -> tuple[Array, Array]:
  """``n_steps >= 1`` steps of power iteration on the matrix ``m`` (``(a, b)``) from ``u``
  (``(1, b)``): ``v = ℓ2(u mᵀ)``, ``u = ℓ2(v m)``; returns ``(u, v)``, held constant for
  differentiation."""
  for _ in range(n_steps):
    v = unit_l2(_matmul(u, m.T), epsilon=epsilon)
    u = unit_l2(_matmul(v, m), epsilon=epsilon)
  return lax.stop_gradient(u), lax.stop_gradient(v)


def sigma_of(m: Array, u: Array, v: Array) -> Array:
  """The singular value estimate ``σ = v m uᵀ`` (differentiable in ``m``)."""
  return _matmul(_matmul(v, m), u.T)[0, 0]


def divided(m: Array, sigma: Array) -> Array:
  """``m / σ``; a zero ``σ`` (an all-zero weight) leaves ``m`` unchanged."""
  return m / jnp.where(sigma != 0, sigma, 1)
