"""The platform-free maths of the statistics: sums, shifts, merges, moments.

Statistics are combined one way, :func:`merge` of ``(n, a, Σ(x − a), Σ|x − a|²)`` around
shifts that are elements of the data: a reduction's groups, GSPMD's shards, devices and
channel groups alike. Every algorithm here is exact for any offset of the data:

- :func:`merged_sums`: one reduction of ``(1, x, 0, 0)`` whose combiner merges groups'
  sums shifted by their first elements, ``x`` read once (the accelerators' and meshes');
- :func:`shifted_parts`: plain sums shifted by two elements of each group;
- :func:`two_pass`: the mean, then ``Σ|x − μ|²`` (masks, complex data, channel groups).

Derivatives: :func:`textbook_jvp`, the rule ``μ̇ = mean(ẋ)``, ``σ̇² = 2·(mean(x·ẋ) − μ·μ̇)``.
The output: :func:`affine`, ``(x − μ)·r·γ + β``, the one affine map of every XLA path.
"""

from __future__ import annotations

import enum
import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jaxnorm._engine.barriers import converted_apart
from jaxnorm._engine.sharding import (
  blocks_merged_at_once,
  mesh_blocks,
  resharded,
  sharded_axes,
  typed_blocks,
)


class Moments(NamedTuple):
  """Statistics of a normalization group.

  Attributes:
    mean: the mean over the valid elements (0 when not centering, and for empty groups).
    var: the biased variance ``E|x − μ|²`` over the valid elements, or the mean square
      when not centering (0 for empty groups); real also for complex inputs.
    count: the number of valid elements that went into each statistic, summed across
      devices when an ``axis_name`` is given (an array of the statistics' shape, in at
      least float32, so counts above 65,504 or 256 stay exact).
  """

  mean: jax.Array
  var: jax.Array
  count: jax.Array  # type: ignore[assignment]  # (a field named like tuple.count, on purpose)


def abs_sq(z: jax.Array) -> jax.Array:
  """``|z|²``, real: ``z·z`` for real ``z``, ``re(z)² + im(z)²`` for complex."""
  if jnp.iscomplexobj(z):
    return lax.square(lax.real(z)) + lax.square(lax.imag(z))
  return z * z


def group_sum(
  z: jax.Array, axes: tuple[int, ...], groups: tuple[int, int] | None = None, dtype: Any = None
) -> jax.Array:
  """``Σ z`` over ``axes`` with the reduced dims kept; with ``groups = (axis, G)`` also over
  each of ``G`` contiguous groups of channels along ``axis``, the group's sum repeated on
  each of its channels.

  The channels are grouped on the small partial sums, never on ``z`` itself
  (``benchmarks/RESULTS.md``, item 7).
  """
  s = jnp.sum(z, axes, keepdims=True, dtype=dtype)
  if groups is None:
    return s
  axis, g = groups
  split = _split_channels(s.shape, axis, g)
  return _repeat_on_channels(jnp.sum(s.reshape(split), axis + 1, keepdims=True), split, axis)


def _split_channels(shape, axis, g):
  """``shape`` with its channel ``axis`` split into ``(G, C/G)``."""
  return shape[:axis] + (g, shape[axis] // g) + shape[axis + 1 :]


def _repeat_on_channels(k, split, axis):
  """A per-group value ``k`` (``split`` shape with 1 for the channels within a group)
  repeated on each of its group's channels, channel axis merged back."""
  merged = split[:axis] + (split[axis] * split[axis + 1],) + split[axis + 2 :]
  return jnp.broadcast_to(k, split).reshape(merged)  # (no -1: size-0 arrays cannot infer it)


def shifts(x, axes, groups=None):
  """Two elements of each group of ``x`` (its first and its last along every reduced axis
  and, with ``groups = (axis, G)``, its first and last channel, repeated on the group's
  channels), as small arrays broadcastable to ``x``; None when a reduced axis is sharded
  in ``x``'s type (explicit sharding cannot slice one element out of a sharded axis) or
  when ``x`` is empty (there is no element to shift by)."""
  if x.size == 0 or set(sharded_axes(x)) & set(axes):
    return None
  out = []
  for index in (0, -1):
    k = x
    for a in axes:
      k = lax.slice_in_dim(k, index % x.shape[a], index % x.shape[a] + 1, axis=a)
    if groups is not None:
      axis, g = groups
      split = _split_channels(k.shape, axis, g)
      i = index % split[axis + 1]
      k = lax.slice_in_dim(k.reshape(split), i, i + 1, axis=axis + 1)
      k = _repeat_on_channels(k, split, axis)
    out.append(k)
  return tuple(out)


def elements_per_group(shape: tuple[int, ...], axes: tuple[int, ...], groups: Any = None) -> int:
  """The number of elements in each group reduced over ``axes`` (and channel ``groups``)."""
  return math.prod(shape[a] for a in axes) * (
    1 if groups is None else shape[groups[0]] // groups[1]
  )


def moved_sums(n, s1, delta):
  """``Σ(x − a)`` of ``n`` elements moved onto the shift ``a − δ``, and the increase of
  their ``Σ|x − a|²`` there: ``s₁ + n·δ`` and ``Re(δ̄·(2s₁ + n·δ))``."""
  moved = s1 + n * delta
  return moved, jnp.real(jnp.conj(delta) * (s1 + moved))


def merge(left, right):
  """Two groups' ``(n, a, s₁, s₂)``, ``s₁ = Σ(x − a)``, ``s₂ = Σ|x − a|²``, as one
  group's around the left shift (the right sums :func:`moved_sums` by ``δ = a_r − a_l``); an
  empty side leaves the other unchanged. The one way statistics are combined: over a
  reduction, shards, devices and channel groups."""
  (n1, a1, s1, q1), (n2, a2, t1, t2) = left, right
  delta = jnp.where((n1 > 0) & (n2 > 0), a2 - a1, 0)
  moved, more = moved_sums(n2, t1, delta)
  return n1 + n2, jnp.where(n1 > 0, a1, a2), s1 + moved, q1 + t2 + more


def merged_over(parts, axes, blocks=1, at_once=False):
  """``parts`` merged over ``axes`` (kept as size 1); with ``blocks`` (> 1, dividing the
  first axis; or a tuple, the blocks of each of ``axes``), those axes cut into as many
  blocks first: each block's sums, stacked and gathered whole, then merged. On a mesh of
  as many devices GSPMD then combines the shards' sums in one collective (an all-reduce,
  as Flax's sums); it gathered the four sums of one reduction apart, which XLA:TPU (along
  a minor dimension) and XLA:CPU do not combine (RESULTS item 48). The blocks are merged
  one by one, or ``at_once`` by one reduction with :func:`merge` as its combiner
  (:func:`~jaxnorm._engine.sharding.blocks_merged_at_once` decides)."""
  zero = (jnp.zeros((), parts[1].dtype),) * 4
  shape = parts[0].shape
  cuts = dict(zip(axes, blocks if isinstance(blocks, tuple) else (blocks,), strict=False))
  if all(c == 1 for c in cuts.values()) or any(shape[a] % c for a, c in cuts.items()):
    return tuple(jnp.expand_dims(t, axes) for t in lax.reduce(parts, zero, merge, axes))
  # x's shape with each cut axis as (blocks, the rest), each block's shard its own
  split, inner, cut, typed = [], [], [], []
  typed_as = getattr(jax.typeof(parts[1]), "sharding", None)  # (x's: its mesh and layout)
  spec = list(getattr(typed_as, "spec", ())) + [None] * len(shape)
  for i, d in enumerate(shape):
    if cuts.get(i, 1) > 1:
      cut.append(i)
      split.append(cuts[i])
      typed.append(spec[i])
      spec[i] = None
    split.append(d // cuts.get(i, 1))
    typed.append(spec[i])
    if i in axes:
      inner.append(len(split) - 1)
  cut_parts = tuple(_split(t, split, typed, typed_as) for t in parts)
  stacked = jnp.stack(lax.reduce(cut_parts, zero, merge, inner))
  # (the block axes of the stacked sums: each cut axis's place among the kept ones, + 1)
  at = [1 + sum(1 for j in range(i) if j not in axes or j in cuts and cuts[j] > 1) for i in cut]
  spec = list(getattr(jax.typeof(stacked).sharding, "spec", ())) + [None] * stacked.ndim
  if any(spec):  # (explicit sharding: the blocks resharded whole, one all-gather)
    for b in at:
      spec[b] = None
    stacked = resharded(stacked, stacked, spec[: stacked.ndim])
  else:
    # A gather by index, which GSPMD partitions as one all-reduce of each device's block
    # (Flax's collectives). Promised in bounds ("wrap" on constant indices folds away):
    # jnp.take's default bounds check and NaN fill took two small kernels per norm, and
    # GSPMD then all-gathered the stack on TPUs and GPUs (a data-parallel ResNet-50 step
    # over 4 v5e chips 1,089 kernels per device, 90 all-reduces and 15 all-gathers; now
    # 1,023 and Flax's 99 all-reduces: RESULTS item 89).
    for b in at:
      stacked = jnp.take(stacked, jnp.arange(stacked.shape[b]), axis=b, mode="wrap")
  block_axes = tuple(b - 1 for b in at)
  if at_once:
    merged = lax.reduce(tuple(stacked), zero, merge, block_axes)
  else:
    merged = stacked
    for b in reversed(block_axes):
      merged = merge_along(merged, b)
  return tuple(jnp.expand_dims(t, axes) for t in merged)


def _split(t, shape, spec, like):
  """``t`` reshaped to ``shape``; under explicit sharding laid out by ``spec`` on the mesh
  of ``like`` (x's sharding: cutting several sharded axes into blocks is a reshape JAX
  asks the sharding of, and a constant beside x may carry no mesh of its own)."""
  if not any(spec):
    return t.reshape(shape)
  named = jax.sharding.NamedSharding(like.mesh, jax.sharding.PartitionSpec(*spec))
  return lax.reshape(t, shape, out_sharding=named)


def merge_along(parts, axis):
  """``parts`` merged over the indices of ``axis`` one by one (a few: blocks, devices),
  in plain operations that JAX differentiates."""
  each = range(parts[0].shape[axis])
  return functools.reduce(
    merge, [tuple(lax.index_in_dim(t, i, axis, keepdims=False) for t in parts) for i in each]
  )


def merged_sums(raw, axes, dtype, known=False):
  """``(n, a, s₁, s₂)`` per kept index: one reduction of ``(1, x, 0, 0)`` merged by
  :func:`merge`, each group's sums shifted by its first element (no offset is squared),
  ``x`` read once. Under GSPMD: each shard's reduction and one gather of the shards' sums.
  ``known``: ``n`` returned as the constant it is (GroupNorm's regrouping of the sums then
  moves three arrays, not four: Flax's kernel count on TPUs; elsewhere it cost one, item 60)."""
  x = raw.astype(dtype)
  parts = (jnp.ones_like(x), x, jnp.zeros_like(x), jnp.zeros_like(x))
  blocks = typed_blocks(raw, axes) or mesh_blocks(raw, axes)
  n, *sums = merged_over(parts, axes, blocks, blocks_merged_at_once(raw))
  return (jnp.full_like(n, elements_per_group(raw.shape, axes)) if known else n, *sums)


def shifted_parts(x, axes, groups, shifts, raw=None, stacked=False):
  """``(n, a, s₁, s₂)`` around ``a`` from one parallel pass of sums shifted by two elements
  ``a`` and ``b`` of each group (``shifts``, from :func:`shifts`): ``s₁ = Σ(x − a)`` and
  ``Σ(x − b)²``, moved onto ``a`` on the small sums. Shifting by an element of the group
  removes the offset before anything is summed or squared: the cancellation left is at
  most ``(mean − b)²/var ≤ n`` (an element lies within ``sqrt(n)`` standard deviations
  of the mean), typically ~1, instead of ``mean²/var`` for ``E[x²] − E[x]²`` (Flax's
  fast variance), which is unbounded. With ``raw`` (x before its conversion), each sum reads
  it on its own (``barriers.converted_apart``; ``benchmarks/RESULTS.md``, items 11 and 56);
  ``stacked``: both sums in one reduction of the two differences stacked."""
  x, y, a, b = (x, x, *shifts) if raw is None else converted_apart(raw, x.dtype, 2, *shifts)
  if stacked:
    outer = None if groups is None else (groups[0] + 1, groups[1])
    both = jnp.stack([x - a, jnp.square(y - b)])
    s1, t2 = group_sum(both, tuple(i + 1 for i in axes), outer)
  else:
    s1, t2 = group_sum(x - a, axes, groups), group_sum(jnp.square(y - b), axes, groups)
  n = jnp.full_like(s1, elements_per_group(x.shape, axes, groups))
  delta = b - a
  return n, a, s1, t2 + delta * (2 * s1 - n * delta)


def squeezed(t, axes):
  """``t`` (or each array of a tuple) with its kept, size-1 ``axes`` removed: statistics in
  their own shape."""
  if isinstance(t, tuple):
    return tuple(jnp.squeeze(a, axes) for a in t)
  return jnp.squeeze(t, axes)


def over_groups(parts, groups):
  """Per-channel ``(n, a, s₁, s₂)`` merged over each of the channel ``groups`` (small
  arrays: :func:`group_sum`'s reason), repeated on its channels; unchanged without."""
  if groups is None:
    return parts
  axis, g = groups
  split = _split_channels(parts[0].shape, axis, g)
  merged = merged_over(tuple(t.reshape(split) for t in parts), (axis + 1,))
  return tuple(_repeat_on_channels(t, split, axis) for t in merged)


def moments_of(parts, groups):
  """Mean and variance from per-channel ``(n, a, s₁, s₂)``, merged first over each of the
  channel ``groups`` (:func:`over_groups`)."""
  n, a, s1, s2 = over_groups(parts, groups)
  n = jnp.maximum(n, 1)
  d = s1 / n
  return a + d, jnp.maximum(s2 / n - abs_sq(d), 0)


def two_pass(x, axes, groups, inv_n, valid=None, center=True, about=None, raw=None):
  """Mean and variance ``E|x − μ|²`` of the valid elements (all when ``valid`` is None) in
  two passes, the mean as ``a + mean(x − a)`` around an element ``about`` of each group
  where one is given (rounded once at the offset: at 1e6 the plain sums' mean was up to
  3 float32 ulps off, this one half an ulp, item 39); uncentred, 0 and ``E|x|²``. With
  ``raw`` (``x`` before its conversion), each pass reads it (``barriers.converted_apart``)."""

  def mean_of(z):
    return group_sum(z if valid is None else jnp.where(valid, z, 0), axes, groups) * inv_n

  first, second = (x, x) if raw is None else converted_apart(raw, x.dtype)
  if not center:
    return jnp.zeros(inv_n.shape, x.dtype), mean_of(abs_sq(x))
  mean = mean_of(first) if about is None else about + mean_of(first - about)
  return mean, mean_of(abs_sq(second - mean))


def textbook_jvp(primal):
  """The rule ``μ̇ = mean(ẋ)``, ``σ̇² = 2·(mean(x·ẋ) − μ·μ̇)`` with ``primal`` computing the
  statistics (itself differentiable: higher orders work). Plain sums, as Flax's
  derivative, XLA:CPU's kernel's on one device and Flax's kernel count on TPUs and GPUs
  (``Σ(x − μ)·ẋ`` took one more small kernel in every forward+backward, RESULTS item 51);
  the gradient at 1e4 ± 1 is 9.5e-5 of its largest entry off (the CPU kernel's 3e-5, item 56)."""

  def rule(axes, groups, dtype, primals, tangents):
    (raw, *_), (draw, *_) = primals, tangents  # (a shift's tangent changes nothing)
    mean, var = primal(*primals, axes, groups, dtype)
    x, dx = raw.astype(dtype), draw.astype(dtype)
    n = elements_per_group(x.shape, axes, groups)
    own = groups is None  # (the sums in their own shape, as the norm's: RESULTS item 79)
    total = functools.partial(jnp.sum, axis=axes) if own else lambda z: group_sum(z, axes, groups)
    dmean = total(dx) / n
    dvar = 2.0 * (total(x * dx) / n - (squeezed(mean, axes) if own else mean) * dmean)
    tangents = tuple(jnp.expand_dims(t, axes) for t in (dmean, dvar)) if own else (dmean, dvar)
    return (mean, var), tangents

  return rule


class Variance(enum.Enum):
  """How the centred variance of one device's unmasked data is computed; each is accurate
  for any offset of the data (masks, devices, complex and empty inputs take the two-pass
  formula whatever is asked)."""

  CHECKED = enum.auto()  # Σx ∥ Σx², a check, an exact fallback (forward; XLA:CPU only)
  SHIFTED = enum.auto()  # sums shifted by elements of each group (under differentiation)
  TWO_PASS = enum.auto()  # the mean, then Σ|x − μ|²


def inverse_std(var: jax.Array, epsilon: Any, epsilon_in_root: bool = True) -> jax.Array:
  """``1/sqrt(var + ε)``, or ``1/(sqrt(var) + ε)`` with ``epsilon_in_root=False``."""
  if epsilon_in_root:
    return lax.rsqrt(var + epsilon)
  return 1.0 / (jnp.sqrt(var) + epsilon)


def affine(centred: jax.Array, r: jax.Array, scale: Any, bias: Any, per_element: bool) -> Any:
  """The one affine map, ``(x − μ)·r·γ + β`` from ``centred = x − μ`` (or x), every XLA
  path's: the closed-form kernel, Flax's program and inference (``s`` as ``r``, no
  ``γ``). ``per_element``: ``(x − μ)·r·γ``, where ``r·γ`` would be x's size (per-row
  ``r``, per-feature ``γ``); else ``(x − μ)·(r·γ)``, the small factor first. Which order
  costs less differs by backend and norm, so the callers choose (``benchmarks/RESULTS.md``,
  items 8, 31 and 41; the Pallas kernels form it in their own bodies)."""
  if scale is None:
    y = centred * r
  elif per_element:
    y = centred * r * scale
  else:
    y = centred * (r * scale)
  return y if bias is None else y + bias
