"""XLA:CPU, one device: its forward statistics.

``Σx ∥ Σx²`` checked, with an exact second pass when the check fails (its fastest
forward, ``benchmarks/RESULTS.md``, items 4 and 38), or the shifted sums or two passes
the kernel asks for (:class:`~jaxnorm._engine.maths.Variance`), each with the textbook
derivative. The rest of XLA:CPU's form is the closed-form kernel
(:mod:`jaxnorm._engine.kernel`) with its fusion barriers (:mod:`jaxnorm._engine.barriers`).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from jaxnorm._engine.barriers import converted_apart, kept_apart
from jaxnorm._engine.maths import Variance, group_sum, moments_of, shifted_parts, shifts, two_pass


def checked_moments(raw, dtype, axes, inv_n):
  """Mean and centred variance, from one parallel pass of ``Σx`` and ``Σx²`` when that is
  exact enough, else from a second, corrected pass over ``x − mean``.

  ``E[x²] − E[x]²`` loses about ``eps·mean²/var`` of relative precision. When every group
  has ``mean² ≤ limit·var`` with ``limit = 2e-6/eps`` (about 17 in float32), its relative
  error stays under ~5e-6 and it is used as is; otherwise ``lax.cond`` runs the corrected
  two-pass algorithm (Chan, Golub & LeVeque 1983): with ``d = x − mean``, ``mean +=
  mean(d)`` and ``var = mean(d²) − mean(d)²``. ``raw`` is ``x`` before its conversion to
  ``dtype``, the fallback's operand (``benchmarks/RESULTS.md``, item 4).
  """
  x, other = converted_apart(raw, dtype)
  mean = group_sum(x, axes) * inv_n
  fast = jnp.maximum(group_sum(other * other, axes) * inv_n - mean * mean, 0)
  limit = 2e-6 / float(jnp.finfo(dtype).eps)
  # One small reduction (``initial`` covers inputs with no group at all).
  well_conditioned = jnp.max(mean * mean - limit * fast, initial=-jnp.inf) <= 0

  def two_pass(operands):
    raw, mean, _ = operands
    (x, other), (m, m2) = converted_apart(raw, dtype), kept_apart(mean, mean)
    d, other_d = x - m, other - m2  # (a mean broadcast for both passes is written out)
    shift = group_sum(d, axes) * inv_n
    var = jnp.maximum(group_sum(other_d * other_d, axes) * inv_n - shift * shift, 0)
    return mean + shift, var

  return lax.cond(well_conditioned, lambda ops: ops[1:], two_pass, (raw, mean, fast))


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2, 3))
def by_method(raw, axes, variance, dtype):
  inv_n = 1.0 / max(1, math.prod(raw.shape[a] for a in axes))
  if variance is Variance.CHECKED:
    return checked_moments(raw, dtype, axes, inv_n)
  x = raw.astype(dtype)
  shift = shifts(x, axes) if variance is Variance.SHIFTED else None
  if shift is None:  # (a sharded reduced axis, an empty input, or asked: two passes)
    return two_pass(x, axes, None, inv_n)
  return moments_of(shifted_parts(x, axes, None, shift, raw), None)


@by_method.defjvp
def by_method_jvp(axes, variance, dtype, primals, tangents):
  (raw,), (draw,) = primals, tangents
  mean, var = by_method(raw, axes, variance, dtype)
  x, dx = raw.astype(dtype), draw.astype(dtype)
  dmean = jnp.mean(dx, axes, keepdims=True)
  return (mean, var), (dmean, 2.0 * jnp.mean((x - mean) * (dx - dmean), axes, keepdims=True))
