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


def batch_renorm(x, running_mean, running_var, r_max, d_max, gamma=None, beta=None, axis=-1,
                 eps=1e-5, mask=None):  # fmt: skip
  """Training-mode Batch Renormalization (Ioffe 2017, Algorithm 1) with stats per feature:
  ``(y, batch mean, batch var, r, d)``,

    r = clip(σ_B/σ, 1/r_max, r_max),  d = clip((μ_B − μ)/σ, −d_max, d_max),
    y = γ·((x − μ_B)/σ_B·r + d) + β,   σ_B = sqrt(var_B + ε),  σ = sqrt(var + ε).
  """
  x = _f64(x)
  axis = axis % x.ndim
  axes = tuple(a for a in range(x.ndim) if a != axis)
  mean, var, _ = stats(x, axes, mask=mask)
  mu = _f64(running_mean).reshape(mean.shape)
  sigma = np.sqrt(_f64(running_var).reshape(mean.shape) + eps)
  sigma_b = np.sqrt(var + eps)
  r = np.clip(sigma_b / sigma, 1.0 / r_max, r_max)
  d = np.clip((mean - mu) / sigma, -d_max, d_max)
  y = _affine((x - mean) / sigma_b * r + d, gamma, beta, (axis,))
  return y, mean.squeeze(axes), var.squeeze(axes), r.squeeze(axes), d.squeeze(axes)


def batch_renorm_grads(x, dy, r, d, gamma, axis=-1, eps=1e-5):
  """Gradients of ``Σ dy·y`` for Batch Renorm with ``r``, ``d`` held constant: BatchNorm's
  backward with the scale ``γ·r`` — ``dx = γr/σ_B·(g − mean(g) − x̂·mean(g·x̂))``,
  ``g = dy`` — and ``dγ = Σ dy·(x̂·r + d)``, ``dβ = Σ dy``."""
  x, dy = _f64(x), _f64(dy)
  axis = axis % x.ndim
  axes = tuple(a for a in range(x.ndim) if a != axis)
  shape = [x.shape[a] if a == axis else 1 for a in range(x.ndim)]
  mean, var, _ = stats(x, axes)
  sigma_b = np.sqrt(var + eps)
  xhat = (x - mean) / sigma_b
  r, d, gamma = (_f64(a).reshape(shape) for a in (r, d, gamma))
  dx = gamma * r / sigma_b * (dy - dy.mean(axes, keepdims=True)
                              - xhat * (dy * xhat).mean(axes, keepdims=True))  # fmt: skip
  return dx, (dy * (xhat * r + d)).sum(axes), dy.sum(axes)


def renorm_limits(step, r_max, d_max, warmup, r_max_steps, d_max_steps):
  """The paper's schedule: 1 and 0 for the first ``warmup`` steps, then linear to
  ``r_max`` at ``r_max_steps`` and ``d_max`` at ``d_max_steps`` (None: at once)."""

  def ramp(start, final, end):
    if step < warmup:
      return start
    if end is None or end == warmup:
      return final
    return start + (final - start) * min(1.0, (step - warmup) / (end - warmup))

  return ramp(1.0, r_max, r_max_steps), ramp(0.0, d_max, d_max_steps)


def ghost_batch_norm(x, k, gamma=None, beta=None, axis=-1, eps=1e-5, mask=None):
  """BatchNorm on each consecutive sub-batch of ``k`` examples (axis 0), concatenated:
  ``(y, mean, var)`` where mean and var are the count-weighted means of the sub-batch
  statistics (the plain means without a mask); a feature with no valid element in a
  sub-batch gets ``x̂ = 0`` there."""
  x = _f64(x)
  feat = (axis % x.ndim,)
  red = tuple(a for a in range(x.ndim) if a not in feat)
  m = None if mask is None else np.broadcast_to(mask, x.shape)
  ys, means, variances, counts = [], [], [], []
  for i in range(0, x.shape[0], k):
    sub_mask = None if m is None else m[i : i + k]
    mean, var, n = stats(x[i : i + k], red, True, sub_mask)
    ys.append(_affine(normalize(x[i : i + k], red, eps=eps, mask=sub_mask), gamma, beta, feat))
    means.append(mean.squeeze(red))
    variances.append(var.squeeze(red))
    counts.append(n.squeeze(red))
  c = np.array(counts)
  total = np.maximum(c.sum(0), 1)
  return np.concatenate(ys), (c * means).sum(0) / total, (c * variances).sum(0) / total


def weight_norm(w, g=None, feature_axes=(-1,), eps=1e-12):
  """Weight normalization: v / sqrt(Σ v² + ε) over the non-feature axes, times g."""
  w = _f64(w)
  features = tuple(a % w.ndim for a in feature_axes)
  reduced = tuple(a for a in range(w.ndim) if a not in features)
  y = w / np.sqrt(np.sum(w * w, axis=reduced, keepdims=True) + eps)
  return y if g is None else _affine(y, g, None, features)


def spectral_norm(w, u, n_steps=1, eps=1e-12):
  """Spectral normalization by power iteration from u (1, out) on W = w.reshape(-1, out):
  v = ℓ2(u Wᵀ), u = ℓ2(v W) n_steps times, σ = v W uᵀ; returns (w / σ, u, σ, v)."""
  w = _f64(w)
  m = w.reshape(-1, w.shape[-1])
  u = _f64(u)
  l2 = lambda a: a / np.sqrt(np.sum(a * a) + eps)  # noqa: E731
  for _ in range(n_steps):
    v = l2(u @ m.T)
    u = l2(v @ m)
  sigma = float((v @ m @ u.T)[0, 0])
  return (m / sigma).reshape(w.shape), u, sigma, v


# --- modern norms (issue 35) ---------------------------------------------------------------


def dyt(x, alpha, gamma=None, beta=None, feature_axes=-1):
  """Dynamic Tanh: γ·tanh(α·x) + β (α a scalar or one per feature)."""
  x = _f64(x)
  feat = tuple(a % x.ndim for a in np.atleast_1d(feature_axes))
  alpha = _f64(alpha)
  shape = [x.shape[a] if a in feat else 1 for a in range(x.ndim)]
  alpha = alpha.reshape(shape) if alpha.size > 1 else alpha.reshape(())
  return _affine(np.tanh(alpha * x), gamma, beta, feat)


def l2_normalize(x, axis=-1, eps=1e-12):
  """PyTorch's F.normalize: x / max(‖x‖₂, ε)."""
  x = _f64(x)
  norm = np.sqrt((np.abs(x) ** 2).sum(axis, keepdims=True))
  return x / np.maximum(norm, eps)


def local_response_norm(x, size, alpha=1e-4, beta=0.75, k=1.0, channel_axis=-1):
  """b_c = a_c / (k + α/n·Σ a_{c'}²)^β, c' from c − n//2 to c + (n − 1)//2 (zero outside)."""
  x = np.moveaxis(_f64(x), channel_axis, -1)
  channels = x.shape[-1]
  out = np.empty_like(x)
  for c in range(channels):
    lo, hi = max(0, c - size // 2), min(channels, c + (size - 1) // 2 + 1)
    total = (x[..., lo:hi] ** 2).sum(-1)
    out[..., c] = x[..., c] / (k + alpha / size * total) ** beta
  return np.moveaxis(out, -1, channel_axis)


def per_sample(value, ndim, feature_axes=(-1,)):
  """A (batch, *features) value laid out to broadcast against a rank-``ndim`` input."""
  value = _f64(value)
  feat = [a % ndim for a in np.atleast_1d(feature_axes)]
  shape = [1] * ndim
  shape[0] = value.shape[0]
  for i, a in enumerate(feat):
    shape[a] = value.shape[1 + i]
  return value.reshape(shape)


def modulate(x, shift=None, scale=None, zero_centered=True):
  """x·(1 + scale) + shift (or x·scale + shift), shift/scale already broadcastable."""
  y = _f64(x)
  if scale is not None:
    y = y * ((1.0 + _f64(scale)) if zero_centered else _f64(scale))
  if shift is not None:
    y = y + _f64(shift)
  return y


def adaptive_instance_norm(content, style, channel_axis=-1, eps=1e-5):
  """AdaIN: σ(style)·(content − μ(content))/σ(content) + μ(style), per sample and channel."""
  content, style = _f64(content), _f64(style)
  c = channel_axis % content.ndim
  spatial = tuple(a for a in range(1, content.ndim) if a != c)
  mx, vx, _ = stats(content, spatial)
  my, vy, _ = stats(style, spatial)
  return np.sqrt(vy + eps) * (content - mx) / np.sqrt(vx + eps) + my


def conditional_batch_norm(x, labels, gamma, beta, axis=-1, eps=1e-5):
  """Training-mode conditional BatchNorm: shared batch statistics, γ[label], β[label]."""
  y, mean, var = batch_norm(x, axis=axis, eps=eps)
  g = per_sample(_f64(gamma)[labels], y.ndim, axis)
  b = per_sample(_f64(beta)[labels], y.ndim, axis)
  return y * g + b, mean, var
