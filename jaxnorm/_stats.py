"""Statistics, once: reduction dtype, masked and cross-device moments (running averages:
:mod:`jaxnorm._running`).

The numerics policy of the whole library lives here: statistics are reduced in at least
float32 (counts and sums always are), the variance stays accurate when ``|mean| >> std``;
complex inputs get a complex mean and the real variance ``E|x − μ|²``; a group with no
valid element (a mask, or a size-0 axis) has mean 0, variance 0 and count 0 instead of
NaN; cross-device statistics are weighted by each device's valid count.

The engine (``benchmarks/RESULTS.md``, items 38-39, 47 and 52 give the figures):

- TPUs, GPUs, and any array on a mesh: one reduction of ``(1, x, 0, 0)`` whose combiner
  merges groups' sums shifted by their first elements (:func:`merged_moments`): one read
  of x, as Flax's ``Σx ∥ Σx²``, exact, partitioned by GSPMD with nothing custom in the
  program (on a mesh, in blocks whose sums are gathered in one collective: :func:`_merged`).
  XLA:GPU's column reductions take plain sums shifted by two elements, each group's
  first and last, instead (it writes a variadic column reduction's operands out), and
  XLA:TPU's Add & LayerNorm plain sums around the mean of each row's first 128 elements
  (:func:`moments_about`: the residual add then fuses with them, as with Flax's sums).
- XLA:CPU, one device: ``Σx ∥ Σx²`` checked, with an exact second pass when the check
  fails (its fastest forward), sums shifted by two elements sliced from x itself under
  differentiation, two passes over short rows and channel groups (:class:`Variance`).
- Masks: two passes over the valid elements. Mapped axes (``axis_name``): each device's
  sums, gathered in one collective (:func:`_combine_devices`).

Statistics are combined one way, :func:`_merge` of ``(n, a, Σ(x − a), Σ|x − a|²)`` around
shifts that are elements of the data: a reduction's groups, GSPMD's shards, devices and
channel groups alike.
"""

from __future__ import annotations

import enum
import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxnorm._axes import Axes, canonicalize_axes
from jaxnorm._config import Config, freeze_groups
from jaxnorm._dtypes import count_dtype, promote, real_dtype, reduction_dtype
from jaxnorm._platform import mesh_of, switch


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


def axis_size(axis_name: Any) -> int:
  """The size of the mapped axis ``axis_name`` (a Python int: axis sizes are static), or a
  ``NameError`` that names it and says how to bind it (JAX's says only "unbound axis
  name")."""
  try:
    return lax.psum(1, axis_name)
  except NameError:
    raise NameError(
      f"axis_name={axis_name!r} is not bound here: the statistics are combined across the "
      f"mapped axis of that name, which exists only inside a transform that names it: "
      f"jax.vmap(f, axis_name={axis_name!r}) (an Equinox BatchNorm: jax.vmap(bn, "
      f"axis_name={axis_name!r}, in_axes=(0, None), out_axes=(0, None))), jax.shard_map "
      f"over a mesh axis {axis_name!r}, or jax.pmap(f, axis_name={axis_name!r}). Call it "
      f"inside one, or pass axis_name=None for the statistics of this call alone."
    ) from None


def psum(value: Any, axis_name: Any, axis_index_groups: Any = None) -> Any:
  """``lax.psum`` of a pytree over ``axis_name`` (``value`` unchanged when it is None);
  with ``axis_index_groups``, each group's own sum, under ``pmap``, ``shard_map`` and
  ``vmap`` alike (``lax.psum`` refuses groups in the last two): every member puts its
  value in its group's row of a ``(G, ...)`` array of zeros, one ungrouped ``psum`` adds
  the rows and each member reads its group's. (``G`` times a grouped ``psum``'s data, for
  one code path under every transform.)"""
  if axis_name is None:
    return value
  axis_size(axis_name)  # (a clear error when it is unbound)
  if axis_index_groups is None:
    return lax.psum(value, axis_name)
  group, _, count = _group_tables(axis_name, axis_index_groups)
  rows = jnp.arange(count) == group

  def one(v: Any) -> jax.Array:
    v = jnp.asarray(v)
    spread = jnp.where(rows.reshape((-1,) + (1,) * v.ndim), v[None], jnp.zeros((), v.dtype))
    return lax.psum(spread, axis_name)[group]

  return jax.tree.map(one, value)


def _group_tables(axis_name: Any, axis_index_groups: Any) -> tuple[jax.Array, jax.Array, int]:
  """This member's group and its position in it, and the number of groups, after checking
  that the groups split the axis into groups of one size (as ``lax.psum`` asks)."""
  groups = freeze_groups(axis_index_groups) or ()
  size = lax.psum(1, axis_name)  # a Python int: axis sizes are static
  members = sorted(i for g in groups for i in g)
  if members != list(range(size)) or len({len(g) for g in groups}) != 1:
    raise ValueError(
      f"axis_index_groups must split the indices 0..{size - 1} of axis {axis_name!r} into "
      f"groups of equal size, each index in exactly one group; got {[list(g) for g in groups]}."
    )
  group, position = np.empty(size, np.int32), np.empty(size, np.int32)
  for g, indices in enumerate(groups):
    group[list(indices)] = g
    position[list(indices)] = np.arange(len(indices))
  index = lax.axis_index(axis_name)
  return jnp.asarray(group)[index], jnp.asarray(position)[index], len(groups)


def broadcast_mask(mask: Any, shape: tuple[int, ...]) -> jax.Array:
  """Returns ``mask`` as a boolean array of ``shape``, or raises a clear ``ValueError``."""
  mask = jnp.asarray(mask)
  try:
    return jnp.broadcast_to(mask.astype(bool), shape)
  except ValueError:
    raise ValueError(
      f"mask of shape {mask.shape} does not broadcast to the input's shape {shape}; "
      f"pass a boolean mask of shape {shape} or one whose dimensions are 1 or equal to "
      f"the input's, aligned from the right (e.g. mask[..., None] for a per-token mask)."
    ) from None


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


def sharded_axes(x: Any) -> tuple[int, ...]:
  """The axes of ``x`` that its type says are sharded (explicit sharding); () when the
  type does not say (a concrete array, automatic sharding, no mesh)."""
  try:
    spec = tuple(jax.typeof(x).sharding.spec)
  except (AttributeError, TypeError):
    return ()
  return tuple(i for i, s in enumerate(spec) if s is not None)


def with_sharding_of(a: jax.Array, like: jax.Array) -> jax.Array:
  """``a`` resharded to ``like``'s explicit sharding where the two types differ (a select
  takes operands of one sharding: a replicated running statistic beside a batch statistic
  sharded over the features); ``a`` itself otherwise."""
  want = jax.typeof(like).sharding
  if not any(getattr(want, "spec", ())) or jax.typeof(a).sharding == want:
    return a
  return jax.sharding.reshard(a, want)


def sharded_like(small: jax.Array, x: jax.Array) -> jax.Array:
  """``small`` (of ``x``'s rank, dims 1 or full, e.g. a per-feature scale) resharded as
  ``x`` along its full dims, when ``x``'s type shards one of them (explicit sharding):
  its products with per-row factors are then sharded as ``x`` is, where a replicated
  full-size product would be gathered in the transposed derivative."""
  spec = tuple(jax.typeof(x).sharding.spec) + (None,) * x.ndim
  want = [spec[i] if d != 1 else None for i, d in enumerate(jnp.shape(small))]
  if not any(want):
    return small
  return resharded(small, x, want)


def resharded(a: jax.Array, like: jax.Array, spec: Any) -> jax.Array:
  """``a`` resharded to ``spec`` on the mesh of ``like``'s type: a ``NamedSharding``, since
  a bare ``PartitionSpec`` needs ``jax.set_mesh``, which a user who puts arrays onto
  an explicit mesh (``jax.make_mesh``'s default) never entered."""
  mesh = jax.typeof(like).sharding.mesh
  spec = jax.sharding.PartitionSpec(*spec)
  return jax.sharding.reshard(a, jax.sharding.NamedSharding(mesh, spec))


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


def on_mesh(x: Any) -> bool:
  """Whether ``x`` may lie on a mesh that GSPMD may split (an axis of more than one device
  that is not manual, :func:`~jaxnorm._platform.mesh_of`): its reductions may then cross devices."""
  mesh = mesh_of(x)
  types = getattr(mesh, "axis_types", ()) or ()
  sizes = getattr(mesh, "axis_sizes", ()) or ()
  return any(
    n > 1 and t != jax.sharding.AxisType.Manual for n, t in zip(sizes, types, strict=False)
  )


def _moved(n, s1, delta):
  """``Σ(x − a)`` of ``n`` elements moved onto the shift ``a − δ``, and the increase of
  their ``Σ|x − a|²`` there: ``s₁ + n·δ`` and ``Re(δ̄·(2s₁ + n·δ))``."""
  moved = s1 + n * delta
  return moved, jnp.real(jnp.conj(delta) * (s1 + moved))


def _merge(left, right):
  """Two groups' ``(n, a, s₁, s₂)``, ``s₁ = Σ(x − a)``, ``s₂ = Σ|x − a|²``, as one
  group's around the left shift (the right sums :func:`_moved` by ``δ = a_r − a_l``); an
  empty side leaves the other unchanged. The one way statistics are combined: over a
  reduction, shards, devices and channel groups."""
  (n1, a1, s1, q1), (n2, a2, t1, t2) = left, right
  delta = jnp.where((n1 > 0) & (n2 > 0), a2 - a1, 0)
  moved, more = _moved(n2, t1, delta)
  return n1 + n2, jnp.where(n1 > 0, a1, a2), s1 + moved, q1 + t2 + more


def _merged(parts, axes, blocks=1):
  """``parts`` merged over ``axes`` (kept as size 1); with ``blocks`` (> 1, dividing the
  first axis), that axis cut into as many blocks first: each block's sums, stacked and
  gathered whole, then merged. On a mesh of as many devices GSPMD then gathers the
  shards' sums in one collective; it gathered the four sums of one reduction apart, which
  XLA:TPU (along a minor dimension) and XLA:CPU do not combine (RESULTS item 48)."""
  zero = (jnp.zeros((), parts[1].dtype),) * 4
  if blocks == 1 or parts[0].shape[axes[0]] % blocks:
    return tuple(jnp.expand_dims(t, axes) for t in lax.reduce(parts, zero, _merge, axes))
  a = axes[0]
  split = parts[0].shape[:a] + (blocks, parts[0].shape[a] // blocks) + parts[0].shape[a + 1 :]
  inner = (a + 1,) + tuple(b + 1 for b in axes[1:])
  stacked = jnp.stack(lax.reduce(tuple(t.reshape(split) for t in parts), zero, _merge, inner))
  spec = list(getattr(jax.typeof(stacked).sharding, "spec", ())) + [None] * stacked.ndim
  if any(spec):  # (explicit sharding: the blocks resharded whole, one all-gather)
    spec[a + 1] = None
    stacked = resharded(stacked, stacked, spec[: stacked.ndim])
  else:  # (a gather by index, which GSPMD does on the stack replicated: one collective)
    stacked = jnp.take(stacked, jnp.arange(blocks), axis=a + 1)
  merged = _merge_along(stacked, a)
  return tuple(jnp.expand_dims(t, axes) for t in merged)


def _merge_along(parts, axis):
  """``parts`` merged over the indices of ``axis`` one by one (a few: blocks, devices),
  in plain operations that JAX differentiates."""
  each = range(parts[0].shape[axis])
  return functools.reduce(
    _merge, [tuple(lax.index_in_dim(t, i, axis, keepdims=False) for t in parts) for i in each]
  )


def _mesh_size(x, axes):
  """The number of blocks to cut a reduction of ``x`` over ``axes`` into: the number of
  devices GSPMD may split ``x`` over (a multiple of the shards of any of its axes), 1 off
  a mesh and where ``x``'s type says no axis in ``axes`` is sharded (explicit sharding;
  under automatic sharding the type does not say, and blocks cost XLA:TPU up to 1.45×
  Flax's bytes per device where the reduced axis is whole on each: RESULTS item 67)."""
  if not on_mesh(x):
    return 1
  mesh = mesh_of(x)
  kinds = jax.sharding.AxisType
  sizes = [
    (n, t) for n, t in zip(mesh.axis_sizes, mesh.axis_types, strict=True) if t != kinds.Manual
  ]
  if all(t == kinds.Explicit for _, t in sizes) and not set(sharded_axes(x)) & set(axes):
    return 1
  return math.prod(n for n, _ in sizes)


def _merged_sums(raw, axes, dtype, known=False):
  """``(n, a, s₁, s₂)`` per kept index: one reduction of ``(1, x, 0, 0)`` merged by
  :func:`_merge`, each group's sums shifted by its first element (no offset is squared),
  ``x`` read once. Under GSPMD: each shard's reduction and one gather of the shards' sums.
  ``known``: ``n`` returned as the constant it is (GroupNorm's regrouping of the sums then
  moves three arrays, not four: Flax's kernel count on TPUs; elsewhere it cost one, item 60)."""
  x = raw.astype(dtype)
  parts = (jnp.ones_like(x), x, jnp.zeros_like(x), jnp.zeros_like(x))
  n, *sums = _merged(parts, axes, _mesh_size(raw, axes))
  return (jnp.full_like(n, elements_per_group(raw.shape, axes)) if known else n, *sums)


def _two_shifts(raw, axes, dtype, per_outer=False):
  """``(n, a, s₁, s₂)`` as :func:`_merged_sums`, by :func:`_shifted_parts` with each kept
  index's first and last elements (one shared ``x − a`` XLA:GPU wrote out: 5|x| against
  3|x| at 8 × 64 × 64 × 320), sliced from ``raw`` itself (no converted copy of a
  half-precision input written out). With ``per_outer`` (on a mesh), one pair of shifts
  per index of the first reduced axis, the sums over the others, merged over it: where
  GSPMD shards that axis the shifts stay on their shard, and one gather combines the
  shards (two broadcasts and 4 all-reduces for a BatchNorm over 4 GPUs otherwise)."""
  inner = axes[1:] if per_outer and len(axes) > 1 else axes
  ab = tuple(s.astype(dtype) for s in shifts(raw, inner))
  parts = _shifted_parts(raw.astype(dtype), inner, None, ab)
  return parts if inner == axes else _merged(parts, axes[:1], _mesh_size(raw, axes))


def _shifted_parts(x, axes, groups, shifts, raw=None):
  """``(n, a, s₁, s₂)`` around ``a`` from one parallel pass of sums shifted by two elements
  ``a`` and ``b`` of each group (``shifts``, from :func:`shifts`): ``s₁ = Σ(x − a)`` and
  ``Σ(x − b)²``, moved onto ``a`` on the small sums. Shifting by an element of the group
  removes the offset before anything is summed or squared: the cancellation left is at
  most ``(mean − b)²/var ≤ n`` (an element lies within ``sqrt(n)`` standard deviations
  of the mean), typically ~1, instead of ``mean²/var`` for ``E[x²] − E[x]²`` (Flax's
  fast variance), which is unbounded. With ``raw`` (x before its conversion), each sum reads
  it on its own (:func:`converted_apart`; ``benchmarks/RESULTS.md``, items 11 and 56)."""
  x, y, a, b = (x, x, *shifts) if raw is None else converted_apart(raw, x.dtype, 2, *shifts)
  s1, t2 = group_sum(x - a, axes, groups), group_sum(jnp.square(y - b), axes, groups)
  n = jnp.full_like(s1, elements_per_group(x.shape, axes, groups))
  delta = b - a
  return n, a, s1, t2 + delta * (2 * s1 - n * delta)


def _moments_of(parts, groups):
  """Mean and variance from per-channel ``(n, a, s₁, s₂)``, merged first over each of the
  channel ``groups`` (small arrays: :func:`group_sum`'s reason), repeated on its channels."""
  if groups is not None:
    axis, g = groups
    split = _split_channels(parts[0].shape, axis, g)
    merged = _merged(tuple(t.reshape(split) for t in parts), (axis + 1,))
    parts = tuple(_repeat_on_channels(t, split, axis) for t in merged)
  n, a, s1, s2 = parts
  n = jnp.maximum(n, 1)
  d = s1 / n
  return a + d, jnp.maximum(s2 / n - abs_sq(d), 0)


def _differentiated(raw, axes, groups, dtype):
  """The statistics under differentiation: the merged sums, except XLA:GPU's column
  reductions (reduced axes short of the last), whose variadic form it writes out (14|x|
  against Flax's 3): plain sums shifted by elements there (3|x|, RESULTS item 47)."""
  merged = functools.partial(_merged_sums, axes=axes, dtype=dtype, known=groups is not None)
  if raw.ndim - 1 in axes or set(sharded_axes(raw)) & set(axes):
    parts = merged(raw)  # (explicit sharding cannot slice one element of a sharded axis)
  else:
    gpu = functools.partial(_two_shifts, axes=axes, dtype=dtype, per_outer=on_mesh(raw))
    parts = switch(raw, like=raw, gpu=gpu, default=merged)
  return _moments_of(parts, groups)


def elements_per_group(shape: tuple[int, ...], axes: tuple[int, ...], groups: Any = None) -> int:
  """The number of elements in each group reduced over ``axes`` (and channel ``groups``)."""
  return math.prod(shape[a] for a in axes) * (
    1 if groups is None else shape[groups[0]] // groups[1]
  )


def _textbook_jvp(primal):
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
    dmean = group_sum(dx, axes, groups) / n
    return (mean, var), (dmean, 2.0 * (group_sum(x * dx, axes, groups) / n - mean * dmean))

  return rule


_under_differentiation = jax.custom_jvp(_differentiated, nondiff_argnums=(1, 2, 3))
_under_differentiation.defjvp(_textbook_jvp(_under_differentiation))


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2, 3))
def merged_moments(raw: jax.Array, axes: tuple[int, ...], groups: Any, dtype: Any) -> Any:
  """``(mean, var)`` of ``raw`` in ``dtype`` over ``axes`` and channel ``groups`` (kept
  dims), exact for any offset, with the textbook derivative (JAX differentiates no
  reduction with its own combiner). As :func:`_differentiated`, except XLA:GPU's
  undifferentiated rows (the last axis alone) off a mesh: two passes, which it turns with
  the norm into one kernel (2|x| against Flax's 3; differentiated, 12|x| against 7)."""
  stats = functools.partial(_differentiated, axes=axes, groups=groups, dtype=dtype)
  if axes != (raw.ndim - 1,) or on_mesh(raw):  # (over more axes it made no one kernel)
    return stats(raw)
  inv_n = 1.0 / elements_per_group(raw.shape, axes, groups)
  rows = lambda r: _two_pass(r.astype(dtype), axes, groups, jnp.asarray(inv_n, dtype))  # noqa: E731
  return switch(raw, like=raw, gpu=rows, default=stats)


merged_moments.defjvp(_textbook_jvp(_under_differentiation))

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
  :func:`merged_moments`' reduction. A mean of ``m`` of ``n`` elements lies within
  ``σ·sqrt(n/m − 1)`` of theirs: cancellation ``n/m`` at most (32 at 4,096), any offset."""
  x, a = raw.astype(dtype), about.astype(dtype)
  return _moments_of(_shifted_parts(x, axes, groups, (a, a)), groups)


moments_about.defjvp(_textbook_jvp(moments_about))


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


def _checked_moments(raw, dtype, axes, inv_n):
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


def _two_pass(x, axes, groups, inv_n, valid=None, center=True, about=None, raw=None):
  """Mean and variance ``E|x − μ|²`` of the valid elements (all when ``valid`` is None) in
  two passes, the mean as ``a + mean(x − a)`` around an element ``about`` of each group
  where one is given (rounded once at the offset: at 1e6 the plain sums' mean was up to
  3 float32 ulps off, this one half an ulp, item 39); uncentred, 0 and ``E|x|²``. With
  ``raw`` (``x`` before its conversion), each pass reads it (:func:`converted_apart`)."""

  def mean_of(z):
    return group_sum(z if valid is None else jnp.where(valid, z, 0), axes, groups) * inv_n

  first, second = (x, x) if raw is None else converted_apart(raw, x.dtype)
  if not center:
    return jnp.zeros(inv_n.shape, x.dtype), mean_of(abs_sq(x))
  mean = mean_of(first) if about is None else about + mean_of(first - about)
  return mean, mean_of(abs_sq(second - mean))


def _gather(value, axis_name, axis_index_groups):
  """``value`` of every member of ``axis_name`` (or of this member's group), stacked on a
  new leading axis, as one ungrouped ``psum`` (so also under ``vmap`` and ``shard_map``,
  which refuse grouped ones): each member writes its value into its own slot of zeros,
  ``(G, k, ...)`` with groups. A ``psum`` result is the same on every member in
  ``shard_map``'s type system (an ``all_gather``'s is not, so ``out_specs=P()`` on the
  statistics would be refused)."""
  if axis_index_groups is None:
    slots = jnp.zeros((lax.psum(1, axis_name),) + value.shape, value.dtype)
    return lax.psum(slots.at[lax.axis_index(axis_name)].set(value), axis_name)
  group, position, count = _group_tables(axis_name, axis_index_groups)
  k = len(axis_index_groups[0])
  slots = jnp.zeros((count, k) + value.shape, value.dtype)
  return lax.psum(slots.at[group, position].set(value), axis_name)[group]


# Up to this many members, one gather of every member's (n, a, s₁, s₂); beyond, two psums.
# A gather is a collective of (members × 4 × features): fine across devices, quadratic under
# vmap over a batch (each example a member: 5.8x Equinox's time at 256 examples).
_GATHER_MEMBERS = 16


def _combine_devices(parts, axis_name, axis_index_groups):
  """Each device's ``(n, a, s₁, s₂)`` (its sums around its shift ``a``) combined across
  ``axis_name`` (or this member's group), the same on every member: up to
  ``_GATHER_MEMBERS`` members gathered in one collective (:func:`_gather`) and merged by
  :func:`_merge`; beyond, moved onto one rough mean ``μ̃ = Σ(nᵢaᵢ + s₁ᵢ)/n`` in two
  ``psum`` calls. No offset is squared; devices without a valid element drop out."""
  n, a, s1, s2 = parts
  if axis_size(axis_name) > _GATHER_MEMBERS:
    total, weighted = psum((n, n * a + s1), axis_name, axis_index_groups)
    rough = weighted / jnp.maximum(total, 1)
    moved, more = _moved(n, s1, a - rough)
    return (total, rough) + psum((moved, s2 + more), axis_name, axis_index_groups)
  stacked = jnp.stack(jnp.broadcast_arrays(*(t.astype(a.dtype) for t in parts)))
  gathered = _gather(stacked, axis_name, axis_index_groups)  # (members, 4, ...)
  n, a, s1, s2 = _merge_along(jnp.moveaxis(gathered, 1, 0), 0)
  return n.real, a, s1, s2.real


class Variance(enum.Enum):
  """How the centred variance of one device's unmasked data is computed; each is accurate
  for any offset of the data (masks, devices, complex and empty inputs take the two-pass
  formula whatever is asked)."""

  CHECKED = enum.auto()  # Σx ∥ Σx², a check, an exact fallback (forward; XLA:CPU only)
  SHIFTED = enum.auto()  # sums shifted by elements of each group (under differentiation)
  TWO_PASS = enum.auto()  # the mean, then Σ|x − μ|²


def group_moments(
  x: jax.Array,
  mask: jax.Array | None,
  cfg: Config,
  variance: Variance = Variance.TWO_PASS,
  shift: tuple[jax.Array, jax.Array] | None = None,
) -> Moments:
  """Moments of ``x`` over ``cfg.axes`` (and ``cfg.channel_groups``, see
  :func:`group_sum`), in ``cfg.dtype``, with the reduced dims kept.

  On one device without a mask the centred variance comes from ``variance``
  (:class:`Variance`; with channel groups ``SHIFTED`` takes the two elements ``shift``
  from :func:`shifts`, the two-pass formula when they are None; without, by
  :func:`_unmasked`, exact also where GSPMD shards a reduced axis); with a mask, for
  complex or empty inputs from the two-pass formula (:func:`_two_pass`); across devices
  from each device's statistics combined in one collective (:func:`_combine_devices`).
  Counts, ``1/n`` and every sum are in at least float32; the variance comes back in the
  real dtype, the count in the count dtype.
  """
  axes, groups, out_dtype = cfg.axes, cfg.channel_groups, jnp.dtype(cfg.dtype)
  raw = x
  # Half precision (force_float32_reductions=False) is summed in float32 and rounded at the
  # end, as jnp.mean does: a float16 sum of more than 65,504 ones overflows.
  x = x.astype(promote(out_dtype, jnp.float32))
  count_dt = count_dtype(x.dtype)
  if jnp.iscomplexobj(x) or x.size == 0:
    variance = Variance.TWO_PASS
  valid = None if mask is None else broadcast_mask(mask, x.shape)
  if valid is None:
    per_group = 1 if groups is None else x.shape[groups[0]] // groups[1]
    kept = tuple(1 if a in axes else d for a, d in enumerate(x.shape))
    count = jnp.full(kept, math.prod(x.shape[a] for a in axes) * per_group, count_dt)
  else:
    count = group_sum(valid, axes, groups, dtype=count_dt)
  inv_n = 1.0 / jnp.maximum(count, 1)

  def result(stats, count=count):
    mean, var = stats
    return Moments(mean.astype(out_dtype), var.astype(real_dtype(out_dtype)), count)

  if cfg.axis_name is not None:
    parts = _device_parts(x, valid, count, inv_n, cfg)
    return result(_moments_of(parts, None), parts[0].astype(count_dt))
  if valid is not None or not cfg.center or jnp.iscomplexobj(x) or not x.size:
    return result(_two_pass(x, axes, groups, inv_n, valid, cfg.center))
  if groups is None and (shift is None or on_mesh(raw)):
    mean, var = _unmasked(raw, axes, variance, x.dtype)
  elif variance is Variance.SHIFTED and shift is not None:
    mean, var = _moments_of(_shifted_parts(x, axes, groups, shift, raw), None)
  else:  # (two passes on raw x: XLA:CPU's fastest for channel groups, items 21 and 39)
    about = None if shift is None else shift[0]
    mean, var = _two_pass(x, axes, groups, inv_n, about=about, raw=raw)
  return result((mean, var))


def _device_parts(x, valid, count, inv_n, cfg):
  """This device's ``(n, a, s₁, s₂)`` per group, combined across ``cfg.axis_name``: sums
  shifted by two elements of each group, one read of x as Flax's, and the device's mean
  handed over unrounded (``a + s₁/n``: the combination is exact); two passes with a mask,
  for complex data and where no element can be sliced. (XLA:CPU took two passes too until
  RESULTS item 66: no faster, and its rounded means cost 4.8e-4 of the variance.)"""
  axes, groups = cfg.axes, cfg.channel_groups
  shift = None
  if valid is None and cfg.center and not jnp.iscomplexobj(x):
    shift = shifts(x, axes, groups)
  if shift is None:
    mean, var = _two_pass(x, axes, groups, inv_n, valid, cfg.center)
    parts = (count, mean, jnp.zeros_like(mean), var * count)
  else:  # (the count as given: under shard_map, not varying)
    parts = (count,) + _shifted_parts(x, axes, groups, shift)[1:]
  real = real_dtype(x.dtype)
  n, a, s1, s2 = parts[0].astype(real), parts[1], parts[2].astype(x.dtype), parts[3].astype(real)
  return _combine_devices((n, a, s1, s2), cfg.axis_name, cfg.axis_index_groups)


def _unmasked(raw, axes, variance, dtype):
  """Mean and variance of ``raw`` over ``axes`` in ``dtype``: the merged shifted sums
  (:func:`merged_moments`) where ``raw`` lies on a mesh (XLA partitions them exactly, in
  one gather of each shard's sums) and on every platform but XLA:CPU (no conditional, one
  read of x); on XLA:CPU's single device, ``variance``'s method (its fastest forward:
  ``Σx ∥ Σx²`` checked, ``benchmarks/RESULTS.md``, item 38), with the same derivative."""
  if on_mesh(raw):
    return merged_moments(raw, axes, None, dtype)
  return switch(
    raw,
    like=raw,
    cpu=lambda raw: _by_method(raw, axes, variance, dtype),
    default=lambda raw: merged_moments(raw, axes, None, dtype),
  )


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2, 3))
def _by_method(raw, axes, variance, dtype):
  inv_n = 1.0 / max(1, math.prod(raw.shape[a] for a in axes))
  if variance is Variance.CHECKED:
    return _checked_moments(raw, dtype, axes, inv_n)
  x = raw.astype(dtype)
  shift = shifts(x, axes) if variance is Variance.SHIFTED else None
  if shift is None:  # (a sharded reduced axis, an empty input, or asked: two passes)
    return _two_pass(x, axes, None, inv_n)
  return _moments_of(_shifted_parts(x, axes, None, shift, raw), None)


@_by_method.defjvp
def _by_method_jvp(axes, variance, dtype, primals, tangents):
  (raw,), (draw,) = primals, tangents
  mean, var = _by_method(raw, axes, variance, dtype)
  x, dx = raw.astype(dtype), draw.astype(dtype)
  dmean = jnp.mean(dx, axes, keepdims=True)
  return (mean, var), (dmean, 2.0 * jnp.mean((x - mean) * (dx - dmean), axes, keepdims=True))


def moments(
  x: jax.Array,
  axes: Axes,
  *,
  center: bool = True,
  mask: jax.Array | None = None,
  axis_name: Any = None,
  axis_index_groups: Any = None,
  dtype: Any = None,
  force_float32_reductions: bool = True,
  keepdims: bool = False,
) -> Moments:
  """Computes the mean and variance (or mean square) of ``x`` over ``axes``.

  The variance comes from sums shifted by an element of each group (the exact two-pass
  formula with a mask, across devices, over a sharded axis, and for complex or empty
  inputs), so it keeps full precision when the mean is large compared with the spread,
  unlike ``E[x**2] - E[x]**2``. For complex ``x`` the mean is complex and the variance is
  the real ``E|x − μ|²``; a size-0 reduced axis gives mean 0, variance 0 and count 0.

  Args:
    x: the input array, of any rank.
    axes: the axes to reduce over (int or sequence, negative allowed).
    center: if False, ``mean`` is 0 and ``var`` is the mean square ``mean(x**2)`` (RMS²).
    mask: optional boolean array broadcastable to ``x``; only its True positions enter the
      statistics. A group with no True position gets mean 0, var 0 and count 0.
    axis_name: optional name of a mapped axis (``pmap``, ``shard_map``, ``vmap``) to combine
      the statistics across: counts and sums are summed over it, so the result equals the
      statistics of the concatenated data, also when devices hold different valid counts.
    axis_index_groups: optional groups of indices along ``axis_name`` (see ``lax.psum``).
    dtype: minimum dtype of the statistics (default: ``x``'s dtype).
    force_float32_reductions: promote the statistics to at least float32 (default True).
    keepdims: keep the reduced axes as size-1 dimensions.

  Returns:
    A :class:`Moments` ``(mean, var, count)`` in the reduction dtype.

  >>> x = jnp.array([[1., 2., 3., 4.], [2., 3., 4., 5.]])
  >>> m = moments(x, axes=1)
  >>> m.mean.tolist(), m.var.tolist(), m.count.tolist()
  ([2.5, 3.5], [1.25, 1.25], [4.0, 4.0])
  """
  x = jnp.asarray(x)
  axes = canonicalize_axes(axes, x.ndim)
  stats_dtype = reduction_dtype(x.dtype, dtype, force_float32_reductions)
  groups = freeze_groups(axis_index_groups)
  cfg = Config(axes, (), center, axis_name=axis_name, axis_index_groups=groups, dtype=stats_dtype)
  return _compiled_moments(x, mask, cfg, keepdims)


def _moments(x, mask, cfg, keepdims):
  x = x.astype(cfg.dtype)
  stats = group_moments(x, mask, cfg, Variance.SHIFTED)
  if keepdims:
    return stats
  return Moments(*(jnp.squeeze(s, cfg.axes) for s in stats))


# One compiled program per shape, as the kernel's: eagerly, each of its operations was
# compiled and dispatched on its own.
_compiled_moments = jax.jit(_moments, static_argnums=(2, 3))


def concrete_value(value: Any) -> np.ndarray | None:
  """``value`` as a NumPy array when it is known at trace time (a Python or NumPy number,
  a concrete ``jax.Array``), None when it is traced."""
  try:
    return np.asarray(value)
  except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
    return None
