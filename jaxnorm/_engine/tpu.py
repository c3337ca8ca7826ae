"""XLA:TPU: Add & LayerNorm's statistics as plain sums around each row's rough mean, which
XLA:TPU fuses with the residual add as it does not the merged sums' reduction
(``benchmarks/RESULTS.md``, item 52).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from jaxnorm._engine.maths import moments_of, shifted_parts, textbook_jvp
from jaxnorm._engine.sharding import on_mesh

ROUGH_SPAN = 128  # (XLA:TPU's lanes: a slice of whole lane tiles is read without a relayout)


def rough_row_mean(x: jax.Array, residual: jax.Array, axes: tuple[int, ...], dtype: Any) -> Any:
  """The mean of each row's first :data:`ROUGH_SPAN` elements of ``x + residual``, from
  the two's slices (XLA:TPU still fuses the add with its sums, RESULTS item 52); None off
  rows of the last axis, below 4 spans (the slices read more than they save), on a mesh."""
  if axes != (x.ndim - 1,) or x.shape[-1] < 4 * ROUGH_SPAN or on_mesh(x) or on_mesh(residual):
    return None
  head = x[..., :ROUGH_SPAN].astype(dtype) + residual[..., :ROUGH_SPAN].astype(dtype)
  # (scaled inside the sum, by a power of two: exact, and no kernel of its own for ÷ m)
  return lax.stop_gradient(jnp.sum(head * (1.0 / ROUGH_SPAN), -1, keepdims=True))


@functools.partial(jax.custom_jvp, nondiff_argnums=(2, 3, 4))
def moments_about(raw: jax.Array, about: jax.Array, axes: Any, groups: Any, dtype: Any) -> Any:
  """``(mean, var)`` from the plain sums ``Σ(x − a)``, ``Σ(x − a)²`` around ``about``
  (:func:`rough_row_mean`), which XLA:TPU fuses with Add & Norm's add as it does not
  ``router.merged_moments``' reduction. A mean of ``m`` of ``n`` elements lies within
  ``σ·sqrt(n/m − 1)`` of theirs: cancellation ``n/m`` at most (32 at 4,096), any offset."""
  x, a = raw.astype(dtype), about.astype(dtype)
  return moments_of(shifted_parts(x, axes, groups, (a, a)), groups)


moments_about.defjvp(textbook_jvp(moments_about))
