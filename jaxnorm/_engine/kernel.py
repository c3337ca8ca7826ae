"""The normalization kernel: ``y = γ·(x − μ)/sqrt(σ² + ε) + β`` with a closed-form derivative.

``affine_normalize`` is a ``jax.custom_jvp``. With ``r = 1/sqrt(σ² + ε)``, ``x̂ = (x − μ)·r``
and, per group, ``S₁ = Σẋ``, ``Sₓ = Σx·ẋ`` (sums over the valid elements, across devices),
its tangent is the textbook one,

    ẋ̂ = r·(ẋ − μ̇) + c·x̂·q,   μ̇ = S₁/n,   q = r·(Sₓ − μ·S₁)/n,   c = −r,

(``c = −1/σ`` when ε sits outside the root), and ``ẏ = γ·ẋ̂ + γ̇·x̂ + β̇``. It is written as

    ẏ = ẋ·(γr) + (x − μ)·(γP) + γQ + (x − μ)·(γ̇r) + β̇,   P = c·q·r,   Q = −r·μ̇,

so that every product with a per-group factor is taken at the small, broadcastable shape
and no two terms cancel (each is rounded on its own in half precision on XLA:CPU).
JAX transposes it into the closed-form gradient ``dx = γr·(g − mean(g) − x̂·mean(g·x̂))``
whose reductions are plain sums of ``dy`` and ``x·dy``. Forward-mode and higher-order
derivatives keep working because the rule is itself differentiable ``jnp``. With a mask or
across devices the rule sums ``Σ(x − μ)·ẋ`` instead of ``Sₓ − μ·S₁`` (exact); on one device
it keeps the plain sums, whose cancellation costs gradients of far off-centre data
(|μ|/σ ≈ 1e4) about 3e-5 relative error — the forward output stays exact.

How XLA:CPU compiles this decides the traffic, so four details are deliberate: every
reduction runs on a merged view of ``x`` (:class:`View`), the small per-group factors
pass through a select (:func:`_fusion_barrier`), products are ordered so that no full-size
product is shared by two reductions (``benchmarks/RESULTS.md``, items 12–14), and each
reduction takes its own x, γ and half-precision cotangent from a barrier (item 56).

The router sends it every call with a mask, an ``axis_name``, ε outside the root or
complex data, on every platform, and every call on XLA:CPU's single device
(:mod:`jaxnorm._engine.router`); it asks the router for its statistics
(:func:`~jaxnorm._engine.router.kernel_moments`). Also here: the one inference path with
given statistics, :func:`apply_statistics`.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero

from jaxnorm._config import Config
from jaxnorm._dtypes import accumulation_dtype, promote, standard_promotion
from jaxnorm._engine import router
from jaxnorm._engine.barriers import converted_apart, kept_apart
from jaxnorm._engine.collectives import psum
from jaxnorm._engine.inputs import broadcast_mask, check_epsilon, shaped_params
from jaxnorm._engine.maths import Moments, affine, group_sum, inverse_std
from jaxnorm._engine.platform import switch
from jaxnorm._engine.sharding import sharded_axes, sharded_like


def _inverse_std_tangent(r, depsilon, epsilon_in_root):
  """``∂r/∂ε·ε̇``: ``−r³/2·ε̇`` in the root, ``−r²·ε̇`` outside it (0 where ``r`` is 0)."""
  return -0.5 * r * r * r * depsilon if epsilon_in_root else -r * r * depsilon


class View(NamedTuple):
  """The statistics' view of ``x``: runs of adjacent axes that are all reduced or all kept
  (and along which the parameters and the mask are all full or all 1) merged into one.

  Every reduction (statistics and derivative) runs on this view; the elementwise output runs
  on ``x``'s own shape, so that no broadcast is shared between a reduction and the output
  (``benchmarks/RESULTS.md``, item 12).
  """

  groups: tuple[tuple[int, ...], ...]  # x's axes merged into each view axis
  axes: tuple[int, ...]  # reduced view axes
  channel_groups: tuple[int, int] | None

  def config(self, cfg: Config) -> Config:
    """``cfg`` for the view: its reduced axes and channel groups."""
    return cfg._replace(axes=self.axes, channel_groups=self.channel_groups)

  def __call__(self, a):
    """``a`` (of ``x``'s rank, dims 1 or full) reshaped onto the view."""
    if a is None:
      return None
    shape = jnp.shape(a)
    return jnp.reshape(a, tuple(math.prod(shape[i] for i in g) for g in self.groups))


def view(shape, axes, channel_groups, *operands, sharded=()):
  """The :class:`View` of an array of ``shape`` reduced over ``axes`` (and ``channel_groups``),
  given the small ``operands`` (parameters, mask; None allowed) that broadcast onto it.
  Axes in ``sharded`` (explicitly sharded ones, :func:`~jaxnorm._engine.sharding.sharded_axes`) stay
  apart: a reshape cannot merge a sharded axis with another."""
  full = [tuple(jnp.shape(o)[i] != 1 for o in operands if o is not None) for i in range(len(shape))]
  channel = None if channel_groups is None else channel_groups[0]
  groups: list[tuple[int, ...]] = []
  for i in range(len(shape)):
    if (
      groups
      and (i in axes) == (groups[-1][-1] in axes)
      and full[i] == full[groups[-1][-1]]
      and channel not in (i, groups[-1][-1])
      and not {i, groups[-1][-1]} & set(sharded)
    ):
      groups[-1] = groups[-1] + (i,)
    else:
      groups.append((i,))
  view_axes = tuple(j for j, g in enumerate(groups) if g[0] in axes)
  cg = None
  if channel_groups is not None:
    cg = (next(j for j, g in enumerate(groups) if channel in g), channel_groups[1])
  return View(tuple(groups), view_axes, cg)


def _primal(x, scale, bias, mask, epsilon, cfg, differentiated=False):
  """The output, the statistics (the router's choice for this kernel,
  :func:`~jaxnorm._engine.router.kernel_moments`) and ``r``."""
  stats, fused_rows = router.kernel_moments(x, scale, bias, mask, cfg, differentiated)
  x = x.astype(cfg.dtype)
  kept = tuple(1 if a in cfg.axes else d for a, d in enumerate(x.shape))
  stats = Moments(*(s.reshape(kept) for s in stats))
  var = _overflowed_to_nan(stats.var, fused_rows, x)
  r = inverse_std(var, epsilon, cfg.epsilon_in_root)
  if mask is not None:
    r = jnp.where(stats.count > 0, r, 0)  # a group with no valid element: x̂ = 0, no NaN
  # Per-row r, per-feature γ: on XLA:CPU (x − μ)·r·γ takes 0.89-0.99x the time of
  # (x − μ)·(γ·r), but RMSNorm's x·r·γ up to 1.19x that of x·(γ·r) (item 31); γ·r per
  # group or feature is small (item 8).
  per_element = (
    cfg.center and scale is not None and jnp.broadcast_shapes(scale.shape, r.shape) == x.shape
  )
  y = affine(x - stats.mean if cfg.center else x, r, scale, bias, per_element)
  return y.astype(cfg.out_dtype), stats, r


def _overflowed_to_nan(var, fused_rows, x):
  """``var``, NaN where it overflowed to inf (float32 sums of squares past ~3e38), where
  ``r = 1/sqrt(inf) = 0`` would make the output a confident 0. Guarded before the root,
  so that the select stays with ``r`` (after it, XLA:CPU recomputed the guard at every
  element of a derivative: BatchNorm's gradient 12-33 % slower). Not in XLA:CPU's
  undifferentiated row norms (``fused_rows``), whose whole norm is one YNNPACK fusion
  that takes no select: a guard there cost up to 42 % (float32) and 1.9-3.8x (bfloat16)
  of the forward (``benchmarks/RESULTS.md``, item 30)."""

  def guard(var):
    return jnp.where(var < jnp.inf, var, jnp.nan)

  if not fused_rows:
    return guard(var)
  return switch(var, like=x, cpu=lambda var: var, default=guard)


@functools.partial(jax.custom_jvp, nondiff_argnums=(5,))
def normalize(x, scale, bias, mask, epsilon, cfg):
  y, stats, _ = _primal(x, scale, bias, mask, epsilon, cfg)
  return y, stats


def _fusion_barrier(r, a):
  """``a`` unchanged (``r`` is finite or NaN alike): a select on the small per-group
  factors that keeps XLA:CPU from fusing a derivative's reduction with the elementwise
  output (``benchmarks/RESULTS.md``, item 13)."""
  return jnp.where(r == r, a, 0)


@functools.partial(normalize.defjvp, symbolic_zeros=True)
@standard_promotion
def _affine_normalize_jvp(cfg, primals, tangents):
  x, scale, bias, mask, epsilon = primals
  moved, (dx, dscale, dbias, _, depsilon) = _given(tangents)
  y, stats, r = _primal(x, scale, bias, mask, epsilon, cfg, differentiated=True)
  mean, var, count = stats
  full_mask = None if mask is None else broadcast_mask(mask, x.shape)
  if full_mask is not None:
    # Masked-out padding is often garbage: a NaN or inf there, times a zero cotangent, would
    # reach every valid gradient through the group sums. Finite padding keeps its terms.
    x = jnp.where(full_mask | jnp.isfinite(x), x, 0)
  v = view(x.shape, cfg.axes, cfg.channel_groups, scale, bias, sharded=sharded_axes(x))
  # Products with per-group or per-feature tangents run in at least float32: reverse mode
  # transposes their broadcasts into sums over x, which overflow float16 past 65,504 terms.
  acc = accumulation_dtype(cfg.dtype)
  # Each reduction of the derivative its own x, γ and (half precision) cotangent (items 22,
  # 23 and 56: a full-size expression two YNNPACK reductions share is written out).
  (xv, xa, xg), dxv, rv = converted_apart(v(x), acc, 3), v(dx), v(r)
  meanv, inv_n = v(mean), 1.0 / jnp.maximum(v(count), 1)
  valid = None if full_mask is None else v(full_mask)

  def total(z):
    z = z if valid is None else jnp.where(valid, z, 0)
    return psum(group_sum(z, v.axes, v.channel_groups), cfg.axis_name, cfg.axis_index_groups)

  std = None if cfg.epsilon_in_root else jnp.sqrt(v(var))
  c = -rv if std is None else jnp.where(std > 0, -1.0 / jnp.where(std > 0, std, 1.0), 0.0)
  gamma = 1.0 if scale is None else scale
  # With a mask or across devices the derivative sums ``(x − μ)·ẋ`` (exact); otherwise
  # ``x·ẋ − μ·Σẋ``, plain sums XLA streams (~eps·|μ|/σ·sqrt(n) relative error: item 6).
  centred = mask is not None or cfg.axis_name is not None
  if not cfg.center:
    dmean = jnp.zeros_like(meanv)
    cov = total(xv * dxv) * inv_n
  else:
    s1 = total(dxv)
    dmean = s1 * inv_n
    cov = (total((xv - meanv) * dxv) if centred else total(xv * dxv) - meanv * s1) * inv_n
  # (ε's tangent changes r alone: (x − μ)·ṙ is one more per-group term of p.)
  eps_term = _inverse_std_tangent(rv, depsilon, cfg.epsilon_in_root)
  p = _fusion_barrier(rv, c * rv * rv * cov + eps_term)
  # No full-size product is shared by two reductions of the transposed derivative (Σẏ·(x − μ)·γ,
  # Σẏ·(x − μ)·r); γ·p, γ·rμ̇ have no sharded operand: replicated, their transposes gathered x.
  gs: Any = (1.0, 1.0) if scale is None else kept_apart(v(scale), v(scale))
  ga, gb = (sharded_like(g, xv) for g in gs)
  factor, shift = ga * p, gb * _fusion_barrier(rv, -rv * dmean)
  gterm, rs_moves, (ma, mg) = None, False, kept_apart(meanv, meanv)  # (μ's broadcast, twice)
  if dscale is not None:
    dscalev = v(dscale).astype(acc)
    if jnp.size(rv * dscalev) < xv.size:  # r·γ̇ is per feature (BatchNorm, CNN layouts)
      rs = rv * dscalev  # Σẏ·x then shares the reduction of the statistics' derivative
      factor, rs_moves = factor + rs, moved[1]  # (the factor then moves with γ̇)
    else:
      gterm = ((xg - mg) * rv if cfg.center else xg * rv) * dscalev
  xc = xa - ma if cfg.center else xa
  viewed = [xc * factor] + ([shift] if cfg.center else []) + ([] if gterm is None else [gterm])
  split = y.dtype != acc and not sharded_axes(x)
  viewed = viewed if split else [sum(viewed[1:], viewed[0])]
  parts = [dx * (gamma * r)] + [jnp.broadcast_to(t, xv.shape).reshape(x.shape) for t in viewed]
  parts += [] if dbias is None else [dbias]
  linear = [moved[0], moved[0] or moved[4] or rs_moves] + [moved[0]] * cfg.center
  linear += [moved[1]] * (gterm is not None) + [moved[2]]
  dy = _summed_apart(parts, linear, x.shape, y.dtype, acc, split)
  dmean, dvar = dmean.reshape(mean.shape).astype(mean.dtype), (2.0 * cov).reshape(mean.shape)
  return (y, stats), (dy, Moments(dmean, dvar.astype(var.dtype), jnp.zeros_like(count)))


def _given(tangents):
  """Which tangents move, and the tangents, zeros for symbolic zeros (a mask's float0 as is)."""
  ts: list[Any] = list(tangents)
  moved = [not isinstance(t, SymbolicZero) for t in ts]
  zeros = [t if m or t.aval.dtype == jax.dtypes.float0 else jnp.zeros(t.aval.shape, t.aval.dtype)
           for t, m in zip(ts, moved, strict=True)]  # fmt: skip
  return moved, zeros


def _summed_apart(parts, linear, shape, dtype, acc, split):
  """``Σ parts`` (tangents broadcastable to ``shape``) in ``dtype``; with ``split`` (half
  precision) those ``linear`` marks (zeros broke JAX 0.12's transpose) at full size, each
  rounded behind one barrier: each reduction of the transposed derivative then reads its
  own cotangent (one float32 cast two reductions read is written out: items 22-23, 56)."""
  if split:
    moving = [t for t, m in zip(parts, linear, strict=False) if m]
    cast = (jnp.broadcast_to(t.astype(acc), shape).astype(dtype) for t in moving)
    parts = list(kept_apart(*cast)) if moving else [jnp.zeros(shape, dtype)]
  return sum(t.astype(acc) for t in parts).astype(dtype)


def complex_normalize(x, scale, bias, mask, epsilon, cfg):
  """Complex inputs (Flax's semantics: complex mean, real variance ``E|x − μ|²``) take the
  exact two-pass statistics and JAX's own derivative: the closed-form rule above is
  written for real arithmetic."""
  # (complex: two passes, see group_moments)
  y, stats, _ = _primal(x, scale, bias, mask, epsilon, cfg)
  return y, stats


compiled_complex_normalize = jax.jit(shaped_params(complex_normalize), static_argnums=(5,))


def apply_statistics(
  x: jax.Array,
  scale: jax.Array | None,
  bias: jax.Array | None,
  mean: jax.Array,
  var: jax.Array,
  cfg: Config,
  *,
  epsilon: Any,
) -> jax.Array:
  """``γ·(x − mean)/sqrt(var + ε) + β`` with given statistics (BatchNorm inference, the
  only inference path), in ``cfg.dtype``, returned in ``cfg.out_dtype``.

  ``mean``, ``var`` and the parameters are broadcastable to ``x``. The per-feature factor
  ``s = γ·r`` is formed at the small shape first and the ``γ``-derivative sums on the
  merged view of ``x`` (``benchmarks/RESULTS.md``, items 8 and 15).
  """
  r = inverse_std(var, check_epsilon(epsilon), cfg.epsilon_in_root)
  s = r if scale is None else r * scale
  shape = jnp.broadcast_shapes(jnp.shape(s), jnp.shape(mean))
  shape = (1,) * (x.ndim - len(shape)) + shape
  x = x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(cfg.dtype)
  mean, s = jnp.broadcast_to(mean, shape), jnp.broadcast_to(s, shape)
  return _shift_scale(x, mean, s, bias, cfg.dtype, cfg.out_dtype)


@functools.partial(jax.custom_jvp, nondiff_argnums=(4, 5))
def _shift_scale(x, mean, s, bias, dtype, out_dtype):
  """``(x − mean)·s + bias`` in ``dtype``, returned in ``out_dtype`` (``mean``, ``s``: one
  small shape, x's rank)."""
  return affine(x.astype(dtype) - mean, s, None, bias, False).astype(out_dtype)


@functools.partial(_shift_scale.defjvp, symbolic_zeros=True)
@standard_promotion
def _shift_scale_jvp(dtype, out_dtype, primals, tangents):
  x, mean, s, bias = primals
  moved, (dx, dmean, ds, dbias) = _given(tangents)
  y = _shift_scale(x, mean, s, bias, dtype, out_dtype)
  axes = tuple(i for i in range(x.ndim) if s.shape[i] == 1)
  v = view(x.shape, axes, None, s, sharded=sharded_axes(x))
  acc = accumulation_dtype(dtype)  # (half precision: see _affine_normalize_jvp)
  # (its own x, unrounded where exact: XLA:CPU reads it in half precision there, item 55)
  xa = converted_apart(x if promote(x.dtype, dtype) == dtype else x.astype(dtype), acc, 1)[0]
  dxs = ((v(xa) - v(mean)) * v(ds).astype(acc)).reshape(x.shape)
  parts = [dx.astype(dtype) * s, -dmean.astype(acc) * s, dxs] + ([] if bias is None else [dbias])
  split = y.dtype != acc and not sharded_axes(x)
  return y, _summed_apart(parts, moved, x.shape, y.dtype, acc, split)
