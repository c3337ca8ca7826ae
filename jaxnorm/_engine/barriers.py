"""XLA:CPU's fusion barriers: copies of an operand that CSE cannot merge, so that each
reduction reads its own (a full-size expression two YNNPACK reductions share is written
out, ``benchmarks/RESULTS.md``, item 56). Elsewhere the arrays pass unchanged
(``docs/development.md``'s decisions table lists the choice and its guard).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jaxnorm._engine.platform import switch


def converted_apart(raw, dtype, n=2, *salt):
  """``n`` conversions of ``raw`` to ``dtype``, each of its own output of one barrier
  (:func:`kept_apart`): each reduction reads the half-precision input, not a float32 copy
  (items 20, 21, 56). ``salt``: arrays through the same barrier, returned after the copies
  (the statistics' shifts: without, CSE merged it with the derivative's of the same x)."""
  if not jnp.issubdtype(raw.dtype, jnp.floating):
    raw = raw.astype(dtype)  # (integers and bools are not half precision)
  if raw.dtype == dtype:
    return (raw,) * n + salt
  out = kept_apart(*(raw,) * n, *salt)
  return tuple(a.astype(dtype) for a in out[:n]) + out[n:]


def kept_apart(*arrays):
  """``arrays``, on XLA:CPU as one barrier's outputs, which CSE keeps apart: a full-size
  expression two YNNPACK reductions share is written out (``benchmarks/RESULTS.md``, item
  56). As they are where shard_map types them apart (a barrier's outputs share one)."""
  if len({getattr(jax.typeof(a), "vma", None) for a in arrays}) > 1:
    return arrays
  barrier = lambda *a: lax.optimization_barrier(a)  # noqa: E731
  return switch(*arrays, like=arrays[0], cpu=barrier, default=lambda *a: a)
