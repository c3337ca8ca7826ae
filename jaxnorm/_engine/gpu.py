"""XLA:GPU: its forms of the statistics where the merged sums cost more.

- Column reductions (the reduced axes short of the last): XLA:GPU writes a variadic column
  reduction's operands out (14|x| against Flax's 3), so plain sums shifted by two elements
  of each group, :func:`two_shifts` (3|x|, ``benchmarks/RESULTS.md``, item 47);
- undifferentiated rows (the last axis alone) of at most :data:`FUSED_ROW` elements: two
  passes, :func:`row_moments`, which XLA:GPU turns with the norm into one kernel (2|x|
  against Flax's 3).
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxnorm._engine.maths import elements_per_group, merged_over, shifted_parts, shifts, two_pass
from jaxnorm._engine.sharding import mesh_blocks


def two_shifts(raw, axes, dtype, per_outer=False):
  """``(n, a, s₁, s₂)`` as ``maths.merged_sums``, by ``maths.shifted_parts`` with each kept
  index's first and last elements (one shared ``x − a`` XLA:GPU wrote out: 5|x| against
  3|x| at 8 × 64 × 64 × 320), sliced from ``raw`` itself (no converted copy of a
  half-precision input written out). With ``per_outer`` (on a mesh, and over the batch),
  one pair of shifts per index of the first reduced axis, the sums over the others,
  merged over it: where GSPMD shards that axis the shifts stay on their shard, and one
  gather combines the shards (two broadcasts and 4 all-reduces for a BatchNorm over 4
  GPUs otherwise). Over batches of up to :data:`PER_SAMPLE_BATCH` also off a mesh."""
  inner = axes[1:] if per_outer and len(axes) > 1 else axes
  ab = tuple(s.astype(dtype) for s in shifts(raw, inner))
  parts = shifted_parts(raw.astype(dtype), inner, None, ab)
  return parts if inner == axes else merged_over(parts, axes[:1], mesh_blocks(raw, axes))


# The longest row :func:`row_moments` takes. XLA:GPU's one-kernel row fusion holds a row
# per program: an H200 timed it at 0.64-0.84x Flax's three kernels up to 8,192 elements,
# but 1.44x (bfloat16) and 1.07x (float32) at 16,384; from 32,768 it is no longer one
# kernel (7 kernels and 4.04|x| forward against Flax's 5 and 3.04). Longer rows take the
# merged sums, Flax's kernels (RESULTS item 72).
FUSED_ROW = 8192

# The largest batch whose column statistics shift each sample off a mesh. Smaller batches
# need it: XLA:GPU writes one global pair's ``x − a`` out on small maps (11|x| against
# Flax's 3 forward at 64 × 7 × 7 × 2048 bfloat16), and a step jitted with ``in_shardings``
# on host arrays traces no mesh yet GSPMD splits the batch (3 all-reduces and a permute
# against Flax's 1). Larger ones lose by it: on an H200, BatchNorm training forward
# (bfloat16) per sample / one pair, against Flax's time: 0.53 / 0.89 at 8 × 14 × 14 × 512,
# 1.46 / 2.25 at 64 × 7 × 7 × 2048, but 1.58 / 1.05 at 128 × 7 × 7 × 2048, 1.81 / 1.08 at
# 256 and 1.24 / 1.02 at 256 × 14 × 14 × 1024 (RESULTS items 70, 73).
PER_SAMPLE_BATCH = 64


def row_moments(raw, axes, groups, dtype):
  """``(mean, var)`` of ``raw``'s rows in ``dtype`` in two passes (one kernel with the
  norm on XLA:GPU)."""
  inv_n = 1.0 / elements_per_group(raw.shape, axes, groups)
  return two_pass(raw.astype(dtype), axes, groups, jnp.asarray(inv_n, dtype))
