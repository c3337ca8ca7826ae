"""A float64 NumPy reference for every norm, written from the formulas.

Independent of ``jaxnorm``: plain NumPy, explicit axes, explicit loops where they make the
definition plainer (GroupNorm). Each function returns float64 arrays, or complex128 ones for
complex inputs (Flax's semantics: complex mean, real variance E|x − μ|²).

  x̂ = (x − μ) / sqrt(σ² + ε),   y = γ·x̂ + β          (σ² = E|x − μ|², biased)
  RMS: x̂ = x / sqrt(mean(|x|²) + ε)  (or x / (sqrt(mean(|x|²)) + ε))
"""

from __future__ import annotations

import numpy as np


def _f64(a):
  if a is None:
    return None
  return np.asarray(a, dtype=np.complex128 if np.iscomplexobj(a) else np.float64)


def _affine(xhat, gamma, beta, feature_axes):
  """y = γ·x̂ + β with γ, β laid along ``feature_axes`` of x̂."""
  shape = [xhat.shape[a] if a in feature_axes else 1 for a in range(xhat.ndim)]
  y = xhat
  if gamma is not None:
    y = y * _f64(gamma).reshape(shape)
  if beta is not None:
    y = y + _f64(beta).reshape(shape)
  return y


def stats(x, axes, center=True, mask=None):
  """Mean and biased variance (or mean square) over ``axes``, with kept dims.

  With a mask, only its True positions count; a group with none has mean 0 and var 0.
  """
  x = _f64(x)
  axes = tuple(a % x.ndim for a in np.atleast_1d(axes))
  w = np.ones_like(x) if mask is None else np.broadcast_to(mask, x.shape).astype(np.float64)
  n = w.sum(axes, keepdims=True)
  safe_n = np.where(n > 0, n, 1.0)
  x = np.where(w > 0, x, 0)  # masked-out values (even NaN) never enter
  mean = (w * x).sum(axes, keepdims=True) / safe_n if center else np.zeros_like(n)
  var = (w * np.abs(x - mean) ** 2).sum(axes, keepdims=True) / safe_n
  return mean, var, n


def normalize(x, axes, center=True, scale=True, eps=1e-5, mask=None):
  """``jaxnorm.normalize`` from the formula; groups with no valid element give 0."""
  x = _f64(x)
  mean, var, n = stats(x, axes, center, mask)
  if not scale:
    return x - mean
  out = (x - mean) / np.sqrt(var + eps)
  return np.where(n > 0, out, 0.0)


def batch_norm(x, gamma=None, beta=None, axis=-1, eps=1e-5, mask=None):
  """Training-mode BatchNorm: returns (y, batch mean, batch var) with stats per feature."""
  x = _f64(x)
  feat = tuple(a % x.ndim for a in np.atleast_1d(axis))
  red = tuple(a for a in range(x.ndim) if a not in feat)
  mean, var, _ = stats(x, red, True, mask)
  y = _affine((x - mean) / np.sqrt(var + eps), gamma, beta, feat)
  return y, mean.squeeze(red), var.squeeze(red)


def batch_norm_eval(x, mean, var, gamma=None, beta=None, axis=-1, eps=1e-5):
  """Inference-mode BatchNorm with given per-feature statistics."""
  x = _f64(x)
  feat = tuple(a % x.ndim for a in np.atleast_1d(axis))
  shape = [x.shape[a] if a in feat else 1 for a in range(x.ndim)]
  xhat = (x - _f64(mean).reshape(shape)) / np.sqrt(_f64(var).reshape(shape) + eps)
  return _affine(xhat, gamma, beta, feat)


def running_average(running, batch, momentum):
  """Flax's convention: ra = momentum·ra + (1 − momentum)·batch."""
  return momentum * _f64(running) + (1.0 - momentum) * _f64(batch)


def layer_norm(x, gamma=None, beta=None, reduction_axes=-1, feature_axes=-1, eps=1e-6, mask=None):
  """LayerNorm: statistics per sample over ``reduction_axes``."""
  x = _f64(x)
  feat = tuple(a % x.ndim for a in np.atleast_1d(feature_axes))
  mean, var, _ = stats(x, reduction_axes, True, mask)
  return _affine((x - mean) / np.sqrt(var + eps), gamma, beta, feat)


def rms_norm(
  x, gamma=None, beta=None, axes=-1, eps=1e-6, eps_in_root=True, zero_centered=False, mask=None
):
  """RMSNorm: x / sqrt(mean(x²) + ε), or x / (sqrt(mean(x²)) + ε)."""
  x = _f64(x)
  _, ms, _ = stats(x, axes, False, mask)
  xhat = x / np.sqrt(ms + eps) if eps_in_root else x / (np.sqrt(ms) + eps)
  if gamma is not None and zero_centered:
    gamma = 1.0 + _f64(gamma)
  feat = tuple(a % x.ndim for a in np.atleast_1d(axes))
  return _affine(xhat, gamma, beta, feat)


def instance_norm(x, gamma=None, beta=None, channel_axis=-1, eps=1e-6):
  """InstanceNorm: statistics per (sample, channel) over the spatial axes."""
  x = _f64(x)
  c = channel_axis % x.ndim
  spatial = tuple(a for a in range(1, x.ndim) if a != c)
  mean, var, _ = stats(x, spatial)
  return _affine((x - mean) / np.sqrt(var + eps), gamma, beta, (c,))


def group_norm(x, num_groups, gamma=None, beta=None, channel_axis=-1, eps=1e-6):
  """GroupNorm, one sample and one group at a time: statistics over the group's channels
  and every non-batch axis."""
  x = _f64(x)
  c = channel_axis % x.ndim
  channels = x.shape[c]
  size = channels // num_groups
  xc = np.moveaxis(x, c, -1)  # (N, ..., C)
  out = np.empty_like(xc)
  for i in range(xc.shape[0]):
    for g in range(num_groups):
      block = xc[i, ..., g * size : (g + 1) * size]
      mu = block.mean()
      var = (np.abs(block - mu) ** 2).mean()
      out[i, ..., g * size : (g + 1) * size] = (block - mu) / np.sqrt(var + eps)
  return _affine(np.moveaxis(out, -1, c), gamma, beta, (c,))
