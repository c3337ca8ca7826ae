"""XLA:GPU: its forms of the statistics where the merged sums cost more.

- Column reductions (the reduced axes short of the last): XLA:GPU writes a variadic column
  reduction's operands out (14|x| against Flax's 3), so plain sums shifted by two elements
  of each group, :func:`two_shifts` (3|x|, ``benchmarks/RESULTS.md``, item 47); with few
  kept indices (:func:`few_kept`) both sums in one reduction, long columns in chunks
  (:func:`column_chunks`), where XLA:GPU wrote ``x − a`` out or read x twice (item 85),
  and off a mesh channel groups shifted by elements of each group, not merged over its
  channels, a reduction XLA:GPU was slow to compile (item 87);
- undifferentiated rows (the last axis alone) of at most :data:`FUSED_ROW` elements: two
  passes, :func:`row_moments`, which XLA:GPU turns with the norm into one kernel (2|x|
  against Flax's 3).
"""

from __future__ import annotations

import math

import jax.numpy as jnp

from jaxnorm._engine.maths import (
  elements_per_group,
  merged_over,
  over_groups,
  shifted_parts,
  shifts,
  two_pass,
)
from jaxnorm._engine.sharding import crosses_devices, local_shape, mesh_blocks, typed_blocks


def two_shifts(raw, axes, dtype, per_outer=False, groups=None):
  """``(n, a, s₁, s₂)`` as ``maths.merged_sums``, by ``maths.shifted_parts`` with each kept
  index's first and last elements (one shared ``x − a`` XLA:GPU wrote out: 5|x| against
  3|x| at 8 × 64 × 64 × 320), sliced from ``raw`` itself (no converted copy of a
  half-precision input written out), merged over each of the channel ``groups`` and
  repeated on its channels. With ``per_outer`` (on a mesh, and over the batch), one pair
  of shifts per index of the first reduced axis, the sums over the others, merged over
  it: where GSPMD shards that axis the shifts stay on their shard, and one gather
  combines the shards (two broadcasts and 4 all-reduces for a BatchNorm over 4 GPUs
  otherwise). Over batches of up to :data:`PER_SAMPLE_BATCH` also off a mesh.

  With few kept indices (:func:`few_kept`) both sums are one reduction (as two, x was
  read twice: 4|x| forward against Flax's 3 for a GroupNorm at 8 × 16 × 16 × 64), and
  off a mesh long columns are summed in chunks (:func:`column_chunks`; RESULTS item 85)
  and channel groups shifted by two elements of each group, their channels' sums then
  summed in one small reduction, not merged (a reduction with its own combiner, which
  XLA:GPU is slow to compile: RESULTS item 87).
  """
  # (where each device reduces its own data whole, the choices follow what it holds)
  shape = raw.shape if crosses_devices(raw, axes) else local_shape(raw)
  few = few_kept(shape, axes)
  # (each channel's, merged over its group, with many kept indices, where each group's
  # took 8 kernels forward against Flax's 6 at 32 × 32 × 32 × 512, and on a mesh, a
  # 4-H100 UNet step 215 against 201: item 87)
  own = groups if few and not per_outer else None
  if few and not per_outer and axes and axes[0] > 0 and not crosses_devices(raw, axes):
    if (k := column_chunks(shape, axes)) > 1:  # (sums per chunk, merged over them)
      a, d = axes[0], raw.shape[axes[0]]
      split = raw.reshape(raw.shape[:a] + (k, d // k) + raw.shape[a + 1 :])
      split_axes = (a, a + 1, *(b + 1 for b in axes[1:]))
      moved = None if groups is None else (groups[0] + (groups[0] > a), groups[1])
      parts = _shifted(split, split_axes, dtype, True, True, moved)
      return _counted(tuple(jnp.squeeze(t, a) for t in parts), raw.shape, axes, groups)
  # (BatchNorm's sums per sample off a mesh apart: stacked, 2 kernels more forward+backward)
  stacked = few and (crosses_devices(raw, axes) or not per_outer)
  parts = _shifted(raw, axes, dtype, per_outer, stacked, own)
  parts = parts if own is not None else over_groups(parts, groups)
  return _counted(parts, raw.shape, axes, groups)


def _counted(parts, shape, axes, groups):
  """``parts`` with the count as the constant it is, not the merges' sum: XLA:GPU then
  computes ``r`` in the kernels that use it (a ResNet stage step 245 kernels against 254,
  RESULTS item 88)."""
  return jnp.full_like(parts[0], elements_per_group(shape, axes, groups)), *parts[1:]


def _shifted(raw, axes, dtype, per_outer, stacked, groups):
  """:func:`two_shifts`' sums without chunks (``stacked``: in one reduction), shifted by
  elements of each channel group (and summed over it) where ``groups`` are given."""
  inner = axes[1:] if per_outer and len(axes) > 1 else axes
  ab = tuple(s.astype(dtype) for s in shifts(raw, inner, groups))
  parts = shifted_parts(raw.astype(dtype), inner, groups, ab, stacked=stacked)
  blocks = typed_blocks(raw, axes[:1]) or mesh_blocks(raw, axes)
  return parts if inner == axes else merged_over(parts, axes[:1], blocks)


# Column reductions with few kept indices, fewer than COLUMN_PROGRAMS (at most that many
# over 4,096 elements or more), which XLA:GPU runs on few programs. Its cost model counts
# a reduction's broadcast shift as read in full, and over 257 to 16,383 elements per kept
# index (longer ones it splits itself) it did not fuse such a reduction with its
# ``x − a``: the difference was written out, 12|x| forward against Flax's 4 for a
# bfloat16 GroupNorm at 2 × 64 × 64 × 320. Those are summed in chunks of their first
# reduced axis, of at most COLUMN_CHUNK elements or enough chunks to reach that many
# kept indices (RESULTS item 85).
COLUMN_PROGRAMS, COLUMN_CHUNK, COLUMN_SPLIT = 2048, 256, 16384


def few_kept(shape: tuple[int, ...], axes: tuple[int, ...]) -> bool:
  """Whether a column reduction of ``shape`` over ``axes`` keeps few indices (its two
  shifted sums then taken in one reduction: as two, a GroupNorm's merge over its channels
  took one in and x was read twice; with many, stacking them cost two kernels)."""
  n, kept = _sizes(shape, axes)
  return kept < COLUMN_PROGRAMS + (n >= 4096)


def column_chunks(shape: tuple[int, ...], axes: tuple[int, ...]) -> int:
  """Into how many chunks :func:`two_shifts` cuts the first of ``axes`` of a reduction
  with few kept indices (each chunk summed around its own shifts, the chunks merged): 1
  where XLA:GPU reads it in one pass as it is, else the fewest that divide that axis and
  give :data:`COLUMN_PROGRAMS` kept indices or at most :data:`COLUMN_CHUNK` elements per
  chunk (each index of it where none does)."""
  (n, kept), d = _sizes(shape, axes), shape[axes[0]]
  if not COLUMN_CHUNK < n < COLUMN_SPLIT:
    return 1
  fits = (k for k in range(2, d + 1) if d % k == 0)
  return next((k for k in fits if kept * k >= COLUMN_PROGRAMS or n // k <= COLUMN_CHUNK), d)


def _sizes(shape, axes):
  """The elements summed per kept index of a reduction over ``axes``, and the kept indices."""
  n = elements_per_group(shape, axes)
  return n, math.prod(shape) // max(n, 1)


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
