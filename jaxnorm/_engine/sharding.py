"""What a traced array's type and context say about its mesh: which axes are sharded,
whether GSPMD may split it, into how many blocks a reduction over it is cut, and the
reshardings a select or a product needs under explicit sharding.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from jaxnorm._engine.platform import mesh_of, switch


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


def on_mesh(x: Any) -> bool:
  """Whether ``x`` may lie on a mesh that GSPMD may split (an axis of more than one device
  that is not manual, :func:`~jaxnorm._engine.platform.mesh_of`): its reductions may then
  cross devices."""
  mesh = mesh_of(x)
  types = getattr(mesh, "axis_types", ()) or ()
  sizes = getattr(mesh, "axis_sizes", ()) or ()
  return any(
    n > 1 and t != jax.sharding.AxisType.Manual for n, t in zip(sizes, types, strict=False)
  )


def local_shape(x: Any) -> tuple[int, ...]:
  """The shape of each device's shard of ``x`` where its type says (explicit sharding),
  else its shape."""
  try:
    return tuple(jax.typeof(x).sharding.shard_shape(x.shape))
  except (AttributeError, TypeError, ValueError):
    return tuple(x.shape)


def crosses_devices(x: Any, axes: tuple[int, ...]) -> bool:
  """Whether a reduction of ``x`` over ``axes`` may cross devices: on a mesh GSPMD may
  split (:func:`on_mesh`), unless explicit sharding's type says none of ``axes`` is
  sharded (each device then reduces its own data whole, as off a mesh)."""
  if not on_mesh(x):
    return False
  kinds = jax.sharding.AxisType
  types = [t for t in mesh_of(x).axis_types if t != kinds.Manual]
  return not all(t == kinds.Explicit for t in types) or bool(set(sharded_axes(x)) & set(axes))


def mesh_blocks(x, axes):
  """The number of blocks to cut a reduction of ``x`` over ``axes`` into: the number of
  devices GSPMD may split ``x`` over (a multiple of the shards of any of its axes), so
  that where a reduced axis is sharded the shards' sums are gathered in one collective.
  1 off a mesh and where ``x``'s type says no axis in ``axes`` is sharded (explicit
  sharding). Under automatic sharding the type does not say; there, on TPUs, statistics
  per sample (the batch axis 0 kept) are not cut either: data parallelism leaves their
  reduced axes whole on each device, where the cut costs XLA:TPU copies of x (LayerNorm
  1.45× Flax's bytes per device, a Transformer step 401 kernels against Flax's 305;
  uncut 306), and a sharded one gathers each of the four sums apart (RESULTS item 81). On
  GPUs rows (the last axis alone) are not cut: XLA:GPU combines the four gathers, and
  uncut LayerNorm moves Flax's bytes per device within 1 % in every layout (cut, 3.04|x|
  against 3.00 with the batch sharded, 3.17 against 3.02 with the features; item 83)."""
  if not crosses_devices(x, axes):
    return 1
  mesh, manual = mesh_of(x), jax.sharding.AxisType.Manual
  sizes = zip(mesh.axis_sizes, mesh.axis_types, strict=True)
  blocks = math.prod(n for n, t in sizes if t != manual)
  if 0 in axes or set(sharded_axes(x)) & set(axes):
    return blocks
  rows = tuple(axes) == (x.ndim - 1,)
  return switch(like=x, tpu=lambda: 1, gpu=lambda: 1 if rows else blocks, default=lambda: blocks)


def typed_blocks(x: Any, axes: tuple[int, ...]) -> tuple[int, ...] | None:
  """Under explicit sharding, where ``x``'s type shards a reduced axis: the shards of each
  of ``axes`` (the blocks :func:`~jaxnorm._engine.maths.merged_over` cuts it into, each
  on one device, however many reduced axes are sharded); None elsewhere. Cut along the
  first reduced axis alone, a BatchNorm with the batch and H sharded over a 2 × 4 mesh
  gathered each of its four sums apart (5 all-gathers forward against Flax's 2
  all-reduces; with H and W sharded 8; RESULTS item 90)."""
  if not set(sharded_axes(x)) & set(axes):
    return None
  sharding: Any = jax.typeof(x).sharding
  mesh = sharding.mesh
  if not all(t == jax.sharding.AxisType.Explicit for t in mesh.axis_types):
    return None
  spec = tuple(sharding.spec) + (None,) * x.ndim

  def shards(names):
    names = (names,) if isinstance(names, str) else names or ()
    return math.prod(mesh.shape[n] for n in names)

  return tuple(shards(spec[a]) for a in axes)


def blocks_merged_at_once(x):
  """Whether the shards' sums of a reduction cut into :func:`mesh_blocks` are merged by
  one reduction with the merge as its combiner (TPUs) or one block after another (the
  plain operations of ``maths.merge_along``). XLA:TPU left the unrolled merges in small
  kernels of their own: a data-parallel ResNet-50 step over 4 v5e chips took 1,450
  kernels per device (Flax's 797), merged at once 1,089, its bytes 1.041 → 1.034× Flax's
  (one BatchNorm 2 kernels more, 19 against 17; since the gather is in bounds, 1,023
  against 1,362). Four H100s compile both to one program since then (a ResNet-50 step
  1,053 kernels; with the bounds check at once cost 1,078 against 1,040), and XLA:CPU's
  8-device ResNet-50 step takes 1,422 operations one by one against 1,475 at once: GPUs
  and XLA:CPU keep one by one (RESULTS items 84 and 89)."""
  return switch(like=x, tpu=lambda: True, default=lambda: False)
