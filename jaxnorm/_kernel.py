"""The normalization kernel: ``y = γ·(x − μ)/sqrt(σ² + ε) + β`` with a closed-form derivative.

``affine_normalize`` is a ``jax.custom_jvp``. With ``r = 1/sqrt(σ² + ε)``, ``x̂ = (x − μ)·r``
and, per group, ``S₁ = Σẋ``, ``Sₓ = Σx·ẋ`` (sums over the valid elements, across devices),
its tangent is the textbook one,

    ẋ̂ = r·(ẋ − μ̇) + c·x̂·q,   μ̇ = S₁/n,   q = r·(Sₓ − μ·S₁)/n,   c = −r,

(``c = −1/σ`` when ε sits outside the root), and ``ẏ = γ·ẋ̂ + γ̇·x̂ + β̇``. It is written as

    ẏ = ẋ·(γr) + x·(γP) + γQ + x·(γ̇r) − γ̇rμ + β̇,   P = c·q·r,   Q = −r·μ̇ − μ·P,

so that every product with a per-group factor is taken at the small, broadcastable shape.
JAX transposes it into the closed-form gradient ``dx = γr·(g − mean(g) − x̂·mean(g·x̂))``
whose reductions are plain sums of ``dy`` and ``x·dy``. Forward-mode and higher-order
derivatives keep working because the rule is itself differentiable ``jnp``. With a mask or
across devices the rule sums ``Σ(x − μ)·ẋ`` instead of ``Sₓ − μ·S₁`` (exact); on one device
it keeps the plain sums, whose cancellation costs gradients of far off-centre data
(|μ|/σ ≈ 1e4) about 1e-4 relative error — the forward output stays exact.

How XLA:CPU compiles this decides the traffic, so three details are deliberate (each was
measured with ``benchmarks/bench_norms.py``): every reduction runs on a merged view of
``x`` (:class:`_View`) while the output runs on ``x``'s shape, so that no broadcast is
shared between a reduction and the output; the small per-group factors pass through a
select (:func:`_barrier`), so that a reduction is not fused together with the output; and
products are ordered so that no full-size product is shared by two reductions. Together:
forward+backward bytes accessed 0.59–0.84× Flax's, with no full-size temporaries.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jaxnorm._stats import (
  Moments,
  apart,
  barrier_on_cpu,
  broadcast_mask,
  concrete_value,
  freeze_groups,
  group_moments,
  group_sum,
  psum,
  real_dtype,
  shifts,
)


class _Config(NamedTuple):
  axes: tuple[int, ...]
  center: bool
  epsilon_in_root: bool
  axis_name: Any
  axis_index_groups: Any
  channel_groups: tuple[int, int] | None = None
  dtype: Any = None  # the statistics' dtype, which x is converted to inside the kernel
  out_dtype: Any = None  # the output's dtype


def check_epsilon(epsilon: Any) -> Any:
  """Returns ``epsilon`` as a float, or raises if it is not a real number ``>= 0``.

  0 is accepted (the textbook ``x / RMS(x)``, as Flax and PyTorch accept it); a constant
  group then has variance 0 and its output is what the formula gives, ``0/0 = NaN``. A
  traced ``epsilon`` (e.g. an argument of a jitted function) is returned as it is: only
  its dtype can be checked while tracing, as in Flax, which accepts it too."""
  value = concrete_value(epsilon)
  kind = jnp.result_type(epsilon) if value is None else value.dtype
  if not (jnp.issubdtype(kind, jnp.floating) or jnp.issubdtype(kind, jnp.integer)) or (
    jnp.ndim(epsilon if value is None else value)
  ):
    raise TypeError(f"epsilon must be a real number >= 0 (a scalar, e.g. 1e-5), got {epsilon!r}.")
  if value is None:
    return epsilon
  eps = float(value)
  if not eps >= 0:  # negative or NaN
    raise ValueError(
      f"epsilon must be >= 0 (a negative or NaN one makes 1/sqrt(var + epsilon) NaN), "
      f"got {epsilon!r}; use e.g. 1e-5 (BatchNorm) or 1e-6 (LayerNorm)."
    )
  return eps


def inverse_std(var: jax.Array, epsilon: Any, epsilon_in_root: bool = True) -> jax.Array:
  """``1/sqrt(var + ε)``, or ``1/(sqrt(var) + ε)`` with ``epsilon_in_root=False``."""
  if epsilon_in_root:
    return lax.rsqrt(var + epsilon)
  return 1.0 / (jnp.sqrt(var) + epsilon)


def _inverse_std_tangent(r, depsilon, epsilon_in_root):
  """``∂r/∂ε·ε̇``: ``−r³/2·ε̇`` in the root, ``−r²·ε̇`` outside it (0 where ``r`` is 0)."""
  return -0.5 * r * r * r * depsilon if epsilon_in_root else -r * r * depsilon


def _accumulation_dtype(dtype):
  """At least float32 (complex and float64 unchanged): the dtype of the derivative's sums."""
  return jnp.promote_types(dtype, jnp.float32)


class _View(NamedTuple):
  """The statistics' view of ``x``: runs of adjacent axes that are all reduced or all kept
  (and along which the parameters and the mask are all full or all 1) merged into one.

  Every reduction (statistics and derivative) runs on this view; the elementwise output runs
  on ``x``'s own shape. On XLA:CPU this matters: a broadcast of ``γ``, ``μ`` or ``r`` used
  both by a reduction and by the output is one instruction there, which the reduction
  library fusion (YNNPACK) cannot take in and so writes out at full size. On the merged view
  each reduction has broadcasts of its own (measured: RMSNorm forward+backward at
  (16, 512, 768) went from 17|x| to 10|x| bytes accessed, 0.5× the time).
  """

  groups: tuple[tuple[int, ...], ...]  # x's axes merged into each view axis
  axes: tuple[int, ...]  # reduced view axes
  channel_groups: tuple[int, int] | None

  def __call__(self, a):
    """``a`` (of ``x``'s rank, dims 1 or full) reshaped onto the view."""
    if a is None:
      return None
    shape = jnp.shape(a)
    return jnp.reshape(a, tuple(math.prod(shape[i] for i in g) for g in self.groups))


def _view(shape, axes, channel_groups, *operands):
  """The :class:`_View` of an array of ``shape`` reduced over ``axes`` (and ``channel_groups``),
  given the small ``operands`` (parameters, mask; None allowed) that broadcast onto it."""
  full = [tuple(jnp.shape(o)[i] != 1 for o in operands if o is not None) for i in range(len(shape))]
  channel = None if channel_groups is None else channel_groups[0]
  groups: list[tuple[int, ...]] = []
  for i in range(len(shape)):
    if (
      groups
      and (i in axes) == (groups[-1][-1] in axes)
      and full[i] == full[groups[-1][-1]]
      and channel not in (i, groups[-1][-1])
    ):
      groups[-1] = groups[-1] + (i,)
    else:
      groups.append((i,))
  view_axes = tuple(j for j, g in enumerate(groups) if g[0] in axes)
  cg = None
  if channel_groups is not None:
    cg = (next(j for j, g in enumerate(groups) if channel in g), channel_groups[1])
  return _View(tuple(groups), view_axes, cg)


def _primal(x, scale, bias, mask, epsilon, cfg, differentiated=False):
  """The output, the statistics and ``r``. Undifferentiated, the statistics come from
  ``Σx ∥ Σx²`` with a conditioning check and an exact fallback (``_checked_moments``:
  the fastest forward on XLA:CPU, whose reductions with a broadcast operand run slower);
  under differentiation from shifted sums (``_shifted_moments``: no ``lax.cond``, whose
  untaken branch XLA counts as 4|x| of traffic). Both are accurate for any offset."""
  v = _view(x.shape, cfg.axes, cfg.channel_groups, scale, bias)
  shift: Any = "checked"  # or the shifts, or None (see group_moments)
  rows = v.axes == (len(v.groups) - 1,) and cfg.channel_groups is None
  if not differentiated and rows and mask is None and cfg.axis_name is None:
    v = _View(tuple((i,) for i in range(x.ndim)), cfg.axes, None)
    shift = None
  elif differentiated:
    # The shifts are sliced from x itself, not from its view: XLA:CPU then reads them once
    # instead of fusing the slice into every small consumer (measured 2|x| less traffic).
    shift = shifts(x.astype(cfg.dtype), cfg.axes, cfg.channel_groups)
    shift = None if shift is None else tuple(map(v, shift))
  stats = group_moments(
    v(x),
    v.axes,
    cfg.center,
    v(mask),
    cfg.axis_name,
    cfg.axis_index_groups,
    v.channel_groups,
    shift,
    cfg.dtype,
  )
  x = x.astype(cfg.dtype)
  kept = tuple(1 if a in cfg.axes else d for a, d in enumerate(x.shape))
  stats = Moments(*(s.reshape(kept) for s in stats))
  r = inverse_std(stats.var, epsilon, cfg.epsilon_in_root)
  if mask is not None:
    r = jnp.where(stats.count > 0, r, 0)  # a group with no valid element: x̂ = 0, no NaN
  g = r if scale is None else scale * r
  y = (x - stats.mean) * g if cfg.center else x * g
  if bias is not None:
    y = y + bias
  return y.astype(cfg.out_dtype), stats, r


@functools.partial(jax.custom_jvp, nondiff_argnums=(5,))
def _affine_normalize(x, scale, bias, mask, epsilon, cfg):
  y, stats, _ = _primal(x, scale, bias, mask, epsilon, cfg)
  return y, stats


def _barrier(r, a):
  """``a`` unchanged (``r`` is finite or NaN alike). A select on the small per-group
  factors, which the reduction library fusion does not take in: it keeps XLA:CPU from
  fusing a derivative's reduction together with the elementwise output, which would write
  out the output's broadcast operands at full size (measured 14|x| → 10|x|, 0.7× the time)."""
  return jnp.where(r == r, a, 0)


@_affine_normalize.defjvp
def _affine_normalize_jvp(cfg, primals, tangents):
  x, scale, bias, mask, epsilon = primals
  dx, dscale, dbias, _, depsilon = tangents
  y, stats, r = _primal(x, scale, bias, mask, epsilon, cfg, differentiated=True)
  mean, var, count = stats
  v = _view(x.shape, cfg.axes, cfg.channel_groups, scale, bias)
  # Products with per-group or per-feature tangents run in at least float32: reverse mode
  # transposes their broadcasts into sums over x, which overflow float16 past 65,504 terms.
  acc = _accumulation_dtype(cfg.dtype)
  xv, dxv, rv = v(x).astype(acc), v(dx), v(r)
  meanv, inv_n = v(mean), 1.0 / jnp.maximum(v(count), 1)
  valid = None if mask is None else v(broadcast_mask(mask, x.shape))

  def total(z):
    if valid is not None:
      z = jnp.where(valid, z, 0)
    return psum(group_sum(z, v.axes, v.channel_groups), cfg.axis_name, cfg.axis_index_groups)

  if cfg.epsilon_in_root:
    c = -rv
  else:
    std = jnp.sqrt(v(var))
    c = jnp.where(std > 0, -1.0 / jnp.where(std > 0, std, 1.0), 0.0)
  gamma = 1.0 if scale is None else scale
  gammav = 1.0 if scale is None else v(scale)
  # With a mask or across devices the derivative sums ``(x − μ)·ẋ`` (exact). Otherwise it
  # sums ``x·ẋ`` and subtracts ``μ·Σẋ``: plain sums that XLA streams, at the price of up to
  # ~eps·|μ|/σ·sqrt(n) relative error in the gradient of far off-centre data (measured 1e-4
  # at |μ|/σ = 1e4, D = 768). A lax.cond choosing between them measured 10–30 % slower.
  centred = mask is not None or cfg.axis_name is not None
  if not cfg.center:
    dmean = jnp.zeros_like(meanv)
    cov = total(xv * dxv) * inv_n
  else:
    s1 = total(dxv)
    dmean = s1 * inv_n
    if centred:
      cov = total((xv - meanv) * dxv) * inv_n
    else:
      cov = (total(xv * dxv) - meanv * s1) * inv_n
  # (ε's tangent changes r alone: (x − μ)·ṙ is one more per-group term of p.)
  p = _barrier(rv, c * rv * rv * cov + _inverse_std_tangent(rv, depsilon, cfg.epsilon_in_root))
  # Products are ordered so that no full-size product is shared between two reductions of
  # the transposed derivative (x·(γp) and (x·r)·γ̇ transpose to Σ(ẏ·x)·γ and Σẏ·(x·r)).
  dyv = xv * (gammav * p)
  if cfg.center:
    dyv = dyv + gammav * _barrier(rv, -(rv * dmean + meanv * p))
  gterm = None
  if dscale is not None:
    dscalev = v(dscale).astype(acc)
    if jnp.size(rv * dscalev) < xv.size:  # r·γ̇ is per feature (BatchNorm, CNN layouts)
      rs = rv * dscalev  # Σẏ·x then shares the reduction of the statistics' derivative
      dyv = dyv + (xv * rs - meanv * rs if cfg.center else xv * rs)
    else:  # (its own reads of x and of the cotangent: see apart)
      xg = xv if x.dtype == acc else -apart(v(x), acc)[1]
      gterm = ((xg - meanv) * rv if cfg.center else xg * rv) * dscalev
  dy = dx * (gamma * r) + dyv.reshape(x.shape)
  if dbias is not None:
    dy = dy + dbias.astype(acc)
  dy = dy.astype(y.dtype)
  if gterm is not None:
    gterm = gterm.reshape(x.shape).astype(y.dtype)
    dy = dy + (gterm if y.dtype == acc else barrier_on_cpu(gterm))
  kept = mean.shape
  dstats = Moments(
    dmean.reshape(kept).astype(mean.dtype),
    (2.0 * cov).reshape(kept).astype(var.dtype),
    jnp.zeros_like(count),
  )
  return (y, stats), (dy, dstats)


def affine_normalize(
  x: jax.Array,
  axes: tuple[int, ...],
  scale: jax.Array | None = None,
  bias: jax.Array | None = None,
  *,
  center: bool = True,
  epsilon: float = 1e-5,
  epsilon_in_root: bool = True,
  mask: jax.Array | None = None,
  axis_name: Any = None,
  axis_index_groups: Any = None,
  channel_groups: tuple[int, int] | None = None,
  dtype: Any = None,
  out_dtype: Any = None,
) -> tuple[jax.Array, Moments]:
  """Normalizes ``x`` over ``axes`` in ``dtype`` and applies ``γ, β``.

  Args:
    x: the input. Complex inputs (or parameters) take the exact two-pass statistics and
      JAX's own derivative.
    axes: sorted non-negative axes to reduce over.
    scale: optional ``γ``, broadcastable to ``x`` (size 1 on the non-feature axes).
    bias: optional ``β``, broadcastable to ``x``.
    center: subtract the mean (False: RMS normalization, ``x / sqrt(mean(x²) + ε)``).
    epsilon: the constant (>= 0) added to the variance (or, with
      ``epsilon_in_root=False``, to the standard deviation).
    epsilon_in_root: ``1/sqrt(var + ε)`` if True, ``1/(sqrt(var) + ε)`` if False.
    mask: optional boolean mask broadcastable to ``x``; statistics use its True positions,
      every position is normalized, and groups without a valid element give ``x̂ = 0``.
    axis_name: optional mapped axis to combine statistics across (count-weighted).
    axis_index_groups: optional index groups along ``axis_name``.
    channel_groups: ``(axis, G)``: also reduce over each of ``G`` contiguous groups of
      channels along ``axis`` (GroupNorm), which must not be in ``axes``.

  Returns:
    ``(y, Moments)`` with the moments' reduced dimensions kept (size 1); with
    ``channel_groups`` each group's statistics are repeated on its channels.
  """
  cfg = _Config(
    tuple(axes),
    bool(center),
    bool(epsilon_in_root),
    axis_name,
    freeze_groups(axis_index_groups),
    None if channel_groups is None else (int(channel_groups[0]), int(channel_groups[1])),
    dtype := jnp.dtype(x.dtype if dtype is None else dtype),
    jnp.dtype(dtype if out_dtype is None else out_dtype),
  )
  if mask is not None:
    mask = broadcast_mask(mask, x.shape)
  # ε is an operand, not part of the compiled configuration: a traced ε works, and a new
  # value does not compile the kernel again.
  eps = jnp.asarray(check_epsilon(epsilon), real_dtype(cfg.dtype))
  if jnp.issubdtype(cfg.dtype, jnp.complexfloating) or any(
    jnp.iscomplexobj(a) for a in (x, scale, bias)
  ):
    return _compiled_complex_normalize(x, scale, bias, mask, eps, cfg)
  return _compiled_affine_normalize(x, scale, bias, mask, eps, cfg)


def _complex_normalize(x, scale, bias, mask, epsilon, cfg):
  """Complex inputs (Flax's semantics: complex mean, real variance ``E|x − μ|²``) take the
  exact two-pass statistics and JAX's own derivative: the closed-form rule above is
  written for real arithmetic."""
  # (complex: two passes, see group_moments)
  y, stats, _ = _primal(x, scale, bias, mask, epsilon, cfg)
  return y, stats


# Compiled once per shape and configuration: eager calls run one XLA program instead of
# dispatching every operation; under an outer jit this is simply inlined.
_compiled_affine_normalize = jax.jit(_affine_normalize, static_argnums=(5,))
_compiled_complex_normalize = jax.jit(_complex_normalize, static_argnums=(5,))


def apply_moments(
  x: jax.Array,
  mean: jax.Array,
  var: jax.Array,
  scale: jax.Array | None = None,
  bias: jax.Array | None = None,
  *,
  epsilon: float,
  epsilon_in_root: bool = True,
) -> jax.Array:
  """``γ·(x − mean)/sqrt(var + ε) + β`` with given statistics (BatchNorm inference).

  All arguments are already broadcastable to ``x``. The per-feature factor ``s = γ·r`` is
  formed at the small shape first, so the derivative w.r.t. ``γ`` sums ``dy·(x − mean)``
  with one factor ``r`` instead of materializing ``x̂`` (measured 1.2–1.6× faster
  forward+backward), and that sum runs on the merged view of ``x`` (see :class:`_View`),
  so that ``x − mean`` is not written out for it (9|x| → 7|x| bytes accessed).
  """
  r = inverse_std(var, check_epsilon(epsilon), epsilon_in_root)
  s = r if scale is None else r * scale
  shape = jnp.broadcast_shapes(jnp.shape(s), jnp.shape(mean))
  shape = (1,) * (x.ndim - len(shape)) + shape
  return _shift_scale(x, jnp.broadcast_to(mean, shape), jnp.broadcast_to(s, shape), bias)


@jax.custom_jvp
def _shift_scale(x, mean, s, bias):
  """``(x − mean)·s + bias`` (``mean`` and ``s`` of one small shape, of ``x``'s rank)."""
  y = (x - mean) * s
  return y if bias is None else y + bias


@_shift_scale.defjvp
def _shift_scale_jvp(primals, tangents):
  x, mean, s, bias = primals
  dx, dmean, ds, dbias = tangents
  y = _shift_scale(x, mean, s, bias)
  axes = tuple(i for i in range(x.ndim) if s.shape[i] == 1)
  v = _view(x.shape, axes, None, s)
  acc = _accumulation_dtype(x.dtype)  # (half precision: see _affine_normalize_jvp)
  dy = (dx - dmean.astype(acc)) * s + ((v(x) - v(mean)) * v(ds).astype(acc)).reshape(x.shape)
  if bias is not None:
    dy = dy + dbias.astype(acc)
  return y, dy.astype(y.dtype)
