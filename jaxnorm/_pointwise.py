"""Norms without statistics over a group: Dynamic Tanh, L2 normalization (PyTorch's
``F.normalize``) and local response normalization (PyTorch's ``LocalResponseNorm``).

Each computes in at least float32 (the accumulation dtype) and casts once at the end to
Flax's output dtype (``dtype``, else the promotion of the input's and the parameters'), the
policy of the rest of jaxnorm; XLA fuses the casts into the one elementwise kernel.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxnorm._axes import Axes, canonicalize_axes
from jaxnorm._dtypes import accumulated, output_dtype
from jaxnorm._engine import check_epsilon, operand


def _per_feature(name: str, value: Any, shape: tuple[int, ...], features: tuple[int, ...],
                 dtype: Any) -> jax.Array:  # fmt: skip
  """``value`` of the feature shape, shaped to broadcast against an input of ``shape``
  (the kernel's :func:`~jaxnorm._engine.inputs.operand`, with this module's message)."""
  error = (
    f"{{name}} has shape {{got}}, but an input of shape {shape} has features of shape "
    f"{{want}} along feature_axes {features}; pass a {{name}} of shape {{want}} (one value "
    f"per feature) or change feature_axes."
  )
  return operand(name, value, shape, features, dtype, error)


def dyt(
  x: jax.Array,
  alpha: Any,
  scale: jax.Array | None = None,
  bias: jax.Array | None = None,
  *,
  feature_axes: Axes = -1,
  dtype: Any = None,
) -> jax.Array:
  """Dynamic Tanh (Zhu et al. 2025, "Transformers without Normalization"):
  ``y = γ·tanh(α·x) + β``.

  An elementwise stand-in for LayerNorm/RMSNorm in Transformers: no statistics, so no
  reduction and no cross-device collective; ``α`` (a learned scalar) sets how much of the
  input stays in tanh's linear range.

  Args:
    x: the input.
    alpha: ``α``: a scalar (shape ``()`` or ``(1,)``, PyTorch's) or one value per feature.
    scale: optional ``γ`` of the feature shape.
    bias: optional ``β`` of the feature shape.
    feature_axes: the axes ``γ``, ``β`` (and a per-feature ``α``) run along (default -1).
    dtype: the output dtype (default: the promotion of the input's and the parameters').

  Returns:
    An array of ``x``'s shape.

  >>> print(dyt(jnp.array([[-2., 0., 2.]]), 0.5, jnp.full(3, 2.), jnp.ones(3)))
  [[-0.5232  1.      2.5232]]
  """
  with jax.named_scope("jaxnorm.dyt"):
    x = jnp.asarray(x)
    features = canonicalize_axes(feature_axes, x.ndim, name="feature_axes")
    out = output_dtype(x, alpha, scale, bias, dtype=dtype)
    xc = accumulated(x)
    a = jnp.asarray(alpha)
    if a.size == 1 and a.ndim <= 1:
      a = a.reshape(()).astype(xc.dtype)
    else:
      a = _per_feature("alpha (a scalar or one value per feature)", a, x.shape, features, xc.dtype)
    y = jnp.tanh(a * xc)
    if scale is not None:
      y = y * _per_feature("scale", scale, x.shape, features, xc.dtype)
    if bias is not None:
      y = y + _per_feature("bias", bias, x.shape, features, xc.dtype)
    return y.astype(out)


def l2_normalize(
  x: jax.Array, axes: Axes = -1, *, epsilon: float = 1e-12, dtype: Any = None
) -> jax.Array:
  """L2 normalization, PyTorch's ``F.normalize(x, p=2, dim=axes, eps=epsilon)``:
  ``x / max(‖x‖₂, ε)``.

  ``ε`` bounds the divisor from below (it is not added): a vector of norm below ``ε`` is
  divided by ``ε``, so a zero vector gives zero, with a finite gradient ``1/ε``, as in
  PyTorch. Used for nGPT's hyperspherical hidden states, cosine-similarity and contrastive
  heads. The norm is summed in at least float32; complex inputs use ``|x|²``.

  Args:
    x: the input.
    axes: the axis or axes the norm is taken over (default -1; PyTorch's default ``dim`` is 1).
    epsilon: the smallest divisor, >= 0 (PyTorch's default 1e-12). With 0 a zero vector
      gives what the formula gives, ``0/0 = NaN``.
    dtype: the output dtype (default: the input's; float32 for integers).

  Returns:
    An array of ``x``'s shape.

  >>> print(l2_normalize(jnp.array([[3., 4.], [0., 0.]])))
  [[0.6 0.8]
   [0.  0. ]]
  """
  with jax.named_scope("jaxnorm.l2_normalize"):
    x = jnp.asarray(x)
    eps = check_epsilon(epsilon)
    reduced = canonicalize_axes(axes, x.ndim)
    out = output_dtype(x, dtype=dtype)
    xc = accumulated(x)
    sq = jnp.real(xc * jnp.conj(xc)) if jnp.iscomplexobj(xc) else xc * xc
    ss = jnp.sum(sq, axis=reduced, keepdims=True)
    eps = jnp.asarray(eps, ss.dtype)
    # max(sqrt(ss), ε) without sqrt's infinite derivative at 0 reaching the gradient.
    above = ss > eps * eps
    norm = jnp.where(above, jnp.sqrt(jnp.where(above, ss, 1)), eps)
    return (xc / norm.astype(xc.dtype)).astype(out)


def local_response_norm(
  x: jax.Array,
  size: int,
  alpha: float = 1e-4,
  beta: float = 0.75,
  k: float = 1.0,
  *,
  channel_axis: int = -1,
  dtype: Any = None,
) -> jax.Array:
  """Local response normalization (Krizhevsky et al. 2012), PyTorch's
  ``F.local_response_norm``: ``b_c = a_c / (k + α/n · Σ_{c'} a_{c'}²)^β``.

  The sum runs over a window of ``n = size`` channels around ``c``, from ``c − n//2`` to
  ``c + (n − 1)//2``, zero-padded at the ends; ``α`` is divided by ``n`` (PyTorch's
  convention; TensorFlow's ``depth_radius`` form sums without dividing).

  Args:
    x: the input, with a channel axis.
    size: ``n``, the number of channels in the window, >= 1.
    alpha: the multiplicative factor (default 1e-4).
    beta: the exponent (default 0.75).
    k: the additive constant (default 1).
    channel_axis: the channel axis (default -1, channels-last; PyTorch's layout is 1).
    dtype: the output dtype (default: the input's; float32 for integers).

  Returns:
    An array of ``x``'s shape.

  >>> x = jnp.array([[1., 2., 3.]])
  >>> print(local_response_norm(x, size=2, alpha=1., beta=1., k=1.))  # a_c/(1 + Σ/2)
  [[0.6667 0.5714 0.4   ]]
  """
  with jax.named_scope("jaxnorm.local_response_norm"):
    x = jnp.asarray(x)
    if isinstance(size, bool) or not isinstance(size, int | np.integer) or size < 1:
      raise ValueError(
        f"local_response_norm: size must be a positive int (the number of neighbouring "
        f"channels summed), got {size!r}; PyTorch's AlexNet uses size=5."
      )
    (c,) = canonicalize_axes(channel_axis, x.ndim, name="channel_axis")
    out = output_dtype(x, dtype=dtype)
    xc = accumulated(x)
    # The window as a sum of shifted slices of the zero-padded squares: n small adds that
    # XLA fuses into one kernel, differentiable to any order (reduce_window is not).
    before, after = size // 2, (size - 1) // 2
    pads = [(0, 0)] * x.ndim
    pads[c] = (before, after)
    padded = jnp.pad(xc * xc, pads)
    n = x.shape[c]
    sums = sum(lax.slice_in_dim(padded, i, i + n, axis=c) for i in range(size))
    div = (k + (alpha / size) * sums) ** beta
    return (xc / div).astype(out)
